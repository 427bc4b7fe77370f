//! The JSON bodies and query parameters of the wire contract: the handlers and the OpenAPI
//! description use these same types. Requests reject unknown fields and unknown query
//! parameters; every constraint a handler enforces is in the schema (`docs/api.md`).

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

use crate::manifest::Manifest;

/// The longest session id, in characters.
pub const MAX_SESSION_ID: usize = 200;

/// `PUT /v1/agents/{agentId}`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PutAgent {
    /// The manifest; its `id` must equal the path.
    pub manifest: Manifest,
    /// The version of the implementation serving the agent (not blank).
    #[schema(
        pattern = "[^\\t\\n\\u000B\\f\\r \\u0085\\u00A0\\u1680\\u2000-\\u200A\\u2028\\u2029\\u202F\\u205F\\u3000]",
        example = "1"
    )]
    pub implementation_version: String,
    /// Start the manifest's MCP servers and list their tools before registering, refusing the
    /// manifest (400, naming the server) if one cannot (default `false`: they start with the
    /// first turn that needs them).
    #[serde(default)]
    pub check_mcp_servers: bool,
    /// The tenant that owns the agent (only its tokens see and use it). A tenant token may
    /// register agents only for its own tenant (and only when granted `canRegisterAgents`);
    /// absent from an operator: the operator's own agent.
    #[serde(default)]
    #[schema(pattern = "^[A-Za-z0-9._-]{1,100}$")]
    pub tenant_id: Option<String>,
    /// For an operator's agent: the tenants whose tokens may see and use it (`"*"`: every
    /// tenant). Operator tokens see and use every agent.
    #[serde(default)]
    pub shared_with: Vec<String>,
}

/// The answer to `PUT /v1/agents/{agentId}`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentPut {
    /// The agent.
    pub agent_id: String,
    /// `sha256:` + hex of the manifest's canonical JSON.
    pub manifest_hash: String,
    /// The implementation version.
    pub implementation_version: String,
}

/// One registered agent.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentView {
    /// The agent.
    pub agent_id: String,
    /// The manifest as registered.
    #[schema(value_type = Object)]
    pub manifest: Value,
    /// Its hash.
    pub manifest_hash: String,
    /// The implementation version.
    pub implementation_version: String,
    /// The tenant that owns it, or `null` for an operator's agent.
    pub tenant_id: Option<String>,
    /// The tenants an operator's agent is shared with (`"*"`: every tenant); `null` when a
    /// tenant token asks (it does not learn other tenants' names).
    pub shared_with: Option<Vec<String>>,
}

/// `GET /v1/agents`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct AgentList {
    /// Every agent, by id.
    pub agents: Vec<AgentView>,
}

/// Who the session's user is (shown to scripts as `user`; display only).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UserInfo {
    /// The user's email.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub email: Option<String>,
    /// The user's display name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub display_name: Option<String>,
}

/// `PUT /v1/sessions/{id}`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PutSession {
    /// The agent (not blank).
    #[schema(
        pattern = "[^\\t\\n\\u000B\\f\\r \\u0085\\u00A0\\u1680\\u2000-\\u200A\\u2028\\u2029\\u202F\\u205F\\u3000]",
        example = "demo"
    )]
    pub agent_id: String,
    /// The owning user (not blank).
    #[schema(
        pattern = "[^\\t\\n\\u000B\\f\\r \\u0085\\u00A0\\u1680\\u2000-\\u200A\\u2028\\u2029\\u202F\\u205F\\u3000]",
        example = "ada"
    )]
    pub owner_user_id: String,
    /// The user's details.
    #[serde(default)]
    pub info: Option<UserInfo>,
    /// The tenant (operator tokens only; a tenant token may only name its own). When the
    /// `tenantId` query parameter is given too, both must be equal.
    #[serde(default)]
    #[schema(pattern = "^[A-Za-z0-9._-]{1,100}$")]
    pub tenant_id: Option<String>,
    /// Ignored when comparing a repeated create.
    #[serde(default)]
    pub request_id: Option<String>,
}

/// A session's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Created, no turn yet.
    Idle,
    /// A turn segment is due.
    Runnable,
    /// A turn segment runs.
    Running,
    /// Waiting for a person (`approve`, `respond`).
    Paused,
    /// Waiting for executors.
    Waiting,
    /// An effect's outcome is unknown: `resolve` it.
    Uncertain,
    /// The last turn completed.
    Completed,
    /// The last turn failed.
    Failed,
    /// The last turn was cancelled.
    Cancelled,
}

impl Status {
    /// Every wire status.
    pub const ALL: [Status; 9] = [
        Status::Idle,
        Status::Runnable,
        Status::Running,
        Status::Paused,
        Status::Waiting,
        Status::Uncertain,
        Status::Completed,
        Status::Failed,
        Status::Cancelled,
    ];

    /// Its wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Idle => "idle",
            Status::Runnable => "runnable",
            Status::Running => "running",
            Status::Paused => "paused",
            Status::Waiting => "waiting",
            Status::Uncertain => "uncertain",
            Status::Completed => "completed",
            Status::Failed => "failed",
            Status::Cancelled => "cancelled",
        }
    }

    /// The stored statuses a wire status name stands for (`completed` is also `closed`), or
    /// `None` for an unknown name.
    pub fn parse(name: &str) -> Option<Vec<corral_store::SessionStatus>> {
        use corral_store::SessionStatus as S;
        let wire = Status::ALL.into_iter().find(|s| s.as_str() == name)?;
        Some(
            S::ALL
                .iter()
                .copied()
                .filter(|stored| Status::of(*stored) == wire)
                .collect(),
        )
    }

    /// The wire status of a stored one (a closed session reads as completed).
    pub fn of(status: corral_store::SessionStatus) -> Status {
        use corral_store::SessionStatus as S;
        match status {
            S::Idle => Status::Idle,
            S::Runnable => Status::Runnable,
            S::Running => Status::Running,
            S::Paused => Status::Paused,
            S::Waiting => Status::Waiting,
            S::Uncertain => Status::Uncertain,
            S::Failed => Status::Failed,
            S::Cancelled => Status::Cancelled,
            _ => Status::Completed,
        }
    }
}

/// A session in a list.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionSummary {
    /// The session (unique within its tenant).
    pub id: String,
    /// Its tenant.
    pub tenant_id: String,
    /// Its agent.
    pub agent_id: String,
    /// Its user.
    pub owner_user_id: String,
    /// Its status.
    pub status: Status,
    /// The turn in progress.
    pub active_turn_id: Option<String>,
}

/// `GET /v1/sessions`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SessionList {
    /// A page of the sessions the token may see that match the filters, in a stable order.
    pub sessions: Vec<SessionSummary>,
    /// Pass as `after` for the next page; `null` on the last page.
    pub next: Option<String>,
    /// How many sessions match the filters other than `status`, by status (statuses with
    /// none are left out).
    pub counts: std::collections::BTreeMap<String, u64>,
}

/// A session's full view.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionView {
    /// The session (unique within its tenant).
    pub id: String,
    /// Its tenant.
    pub tenant_id: String,
    /// Its agent.
    pub agent_id: String,
    /// Its user.
    pub owner_user_id: String,
    /// The manifest hash at creation.
    pub manifest_hash: String,
    /// The implementation version at creation.
    pub implementation_version: String,
    /// Its status.
    pub status: Status,
    /// The turn in progress.
    pub active_turn_id: Option<String>,
    /// What the turn waits on: the pending interactions when paused, `{"effectIds"}` when
    /// waiting or uncertain, `null` otherwise.
    #[schema(value_type = Option<Waits>)]
    pub waits: Value,
    /// The last failure, `{"code", "message"}`, or `null`.
    #[schema(value_type = Option<TurnError>)]
    pub error: Value,
    /// Actions of the session not completed or cancelled.
    pub actions: Vec<ActionView>,
    /// Effects whose outcome is unknown.
    pub uncertain_effects: Vec<UncertainEffect>,
    /// The last decision taken on the session (`approve`, `respond`, `cancel`, `resolve`) and
    /// the name of the token that took it, or `null`.
    #[schema(value_type = Option<LastDecision>)]
    pub last_decision: Value,
}

/// The last decision taken on a session, and by which token (its configured name).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LastDecision {
    /// `approve`, `respond`, `cancel` or `resolve`.
    pub command: String,
    /// The token's configured name (never its secret).
    pub decided_by: String,
    /// The interaction decided (`approve`, `respond`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interaction_id: Option<String>,
    /// Whether it was approved (`approve`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approved: Option<bool>,
    /// The effect settled (`resolve`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effect_id: Option<String>,
}

/// What a session's turn waits on (the schema of the value the runtime writes).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum Waits {
    /// Paused: the interactions a person must decide (`approve`, `respond`).
    Interactions(Vec<PendingInteraction>),
    /// Waiting or uncertain: the effects the turn waits on.
    Effects(WaitingEffects),
}

/// An interaction a paused turn waits on (the chat runtime's `Interaction`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PendingInteraction {
    /// Its id: pass it to `approve` or `respond`.
    pub interaction_id: String,
    /// `approval` or `input`.
    pub kind: String,
    /// `run_js` or the direct tool's name.
    pub tool_name: String,
    /// The gated capability (calls policy and direct tools).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capability_id: Option<String>,
    /// What is to be approved.
    pub arguments: Value,
    /// SHA-256 (hex) of the arguments' canonical JSON.
    pub arguments_sha256: String,
}

/// The effects a waiting or uncertain turn waits on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WaitingEffects {
    /// Their ids (an action's id is its effect's).
    pub effect_ids: Vec<String>,
}

/// Why a turn failed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TurnError {
    /// Such as `model_error`, `effect_cancelled`.
    pub code: String,
    /// What happened.
    pub message: String,
}

/// An effect whose outcome is unknown.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct UncertainEffect {
    /// The effect.
    pub effect_id: String,
    /// Its turn.
    pub turn_id: String,
    /// `model_call`, `capability_call`...
    pub kind: String,
    /// Why it is uncertain.
    pub error: Option<String>,
}

/// External work for an executor.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ActionView {
    /// The action (equal to its effect id).
    pub action_id: String,
    /// The session's tenant (session ids are unique only within a tenant).
    pub tenant_id: String,
    /// The session (within its tenant).
    pub session_id: String,
    /// The turn.
    pub turn_id: String,
    /// The agent.
    pub agent_id: String,
    /// The manifest hash an executor must present.
    pub manifest_hash: String,
    /// The implementation version an executor must present.
    pub implementation_version: String,
    /// The capability to run.
    pub capability_id: String,
    /// What the executor needs (input, context).
    #[schema(value_type = Object)]
    pub request: Value,
    /// The W3C trace context of the call's span when tracing is on (docs/tracing.md): an
    /// executor that starts its spans under it joins the turn's trace.
    pub traceparent: Option<String>,
    /// The W3C `tracestate` going with [`ActionView::traceparent`], when there is one.
    pub tracestate: Option<String>,
    /// `pending`, `claimed`, `completed`, `uncertain`, `cancelled`.
    pub status: String,
    /// Incremented by each claim (the fencing token).
    pub generation: u64,
    /// The current or last claim.
    pub claim_id: Option<String>,
    /// When the claim ends unless heartbeated (RFC 3339).
    pub lease_expires_at: Option<String>,
}

/// `POST /v1/sessions/{id}/commands`: one command, chosen by `type`. Every field is camelCase;
/// unknown fields are refused.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Command {
    /// Starts a turn (the session must be idle, completed, failed or cancelled).
    #[serde(rename_all = "camelCase")]
    Message {
        /// Same key + same command returns the first response.
        #[schema(min_length = 1)]
        idempotency_key: String,
        /// Echoed in the response; ignored when comparing commands.
        #[serde(default)]
        request_id: Option<String>,
        /// The user's message.
        content: String,
    },
    /// Decides an approval the turn is paused on.
    #[serde(rename_all = "camelCase")]
    Approve {
        /// Same key + same command returns the first response.
        #[schema(min_length = 1)]
        idempotency_key: String,
        /// Echoed in the response.
        #[serde(default)]
        request_id: Option<String>,
        /// The interaction (from the session's `waits`).
        interaction_id: String,
        /// The decision.
        approved: bool,
        /// Why (shown to the model on a rejection).
        #[serde(default)]
        reason: Option<String>,
    },
    /// Answers an input request the turn is paused on.
    #[serde(rename_all = "camelCase")]
    Respond {
        /// Same key + same command returns the first response.
        #[schema(min_length = 1)]
        idempotency_key: String,
        /// Echoed in the response.
        #[serde(default)]
        request_id: Option<String>,
        /// The interaction (from the session's `waits`).
        interaction_id: String,
        /// The answer: any JSON value.
        #[schema(value_type = Value)]
        value: Value,
    },
    /// Cancels the active turn.
    #[serde(rename_all = "camelCase")]
    Cancel {
        /// Same key + same command returns the first response.
        #[schema(min_length = 1)]
        idempotency_key: String,
        /// Echoed in the response.
        #[serde(default)]
        request_id: Option<String>,
        /// Why.
        #[serde(default)]
        reason: Option<String>,
    },
    /// An executor reports an action's outcome (executor tokens only).
    #[serde(rename_all = "camelCase")]
    ActionResult {
        /// Same key + same command returns the first response.
        #[schema(min_length = 1)]
        idempotency_key: String,
        /// Echoed in the response.
        #[serde(default)]
        request_id: Option<String>,
        /// The action.
        action_id: String,
        /// The claim.
        claim_id: String,
        /// The claim's generation.
        #[serde(deserialize_with = "whole_number")]
        generation: u64,
        /// The outcome: `{"value": ...}` or `{"error": "..."}`.
        outcome: Outcome,
    },
    /// An operator settles an uncertain effect: `"retry": true`, or its `outcome` (exactly
    /// one of the two).
    #[serde(rename_all = "camelCase")]
    Resolve {
        /// Same key + same command returns the first response.
        #[schema(min_length = 1)]
        idempotency_key: String,
        /// Echoed in the response.
        #[serde(default)]
        request_id: Option<String>,
        /// The uncertain effect.
        effect_id: String,
        /// Perform it again (only `true` is meaningful).
        #[serde(default)]
        retry: Option<bool>,
        /// Or: what it returned, `{"value": ...}` or `{"error": "..."}`.
        #[serde(default)]
        outcome: Option<Outcome>,
    },
}

/// What an effect returned, as an executor (`action_result`) or an operator (`resolve`)
/// reports it: exactly `{"value": ANY}` or `{"error": "MESSAGE"}`. The script sees the value,
/// or a failed call with the message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase", deny_unknown_fields)]
pub enum Outcome {
    /// The effect succeeded with this value (any JSON value, `null` included).
    Value(Value),
    /// The effect failed with this message.
    Error(String),
}

impl Outcome {
    /// The outcome as JSON, as the journal records it and the chat runtime reads it.
    pub fn to_value(&self) -> Value {
        match self {
            Outcome::Value(value) => serde_json::json!({"value": value}),
            Outcome::Error(message) => serde_json::json!({"error": message}),
        }
    }
}

impl Command {
    /// The idempotency key.
    pub fn idempotency_key(&self) -> &str {
        match self {
            Command::Message {
                idempotency_key, ..
            }
            | Command::Approve {
                idempotency_key, ..
            }
            | Command::Respond {
                idempotency_key, ..
            }
            | Command::Cancel {
                idempotency_key, ..
            }
            | Command::ActionResult {
                idempotency_key, ..
            }
            | Command::Resolve {
                idempotency_key, ..
            } => idempotency_key,
        }
    }

    /// The request id.
    pub fn request_id(&self) -> Option<&str> {
        match self {
            Command::Message { request_id, .. }
            | Command::Approve { request_id, .. }
            | Command::Respond { request_id, .. }
            | Command::Cancel { request_id, .. }
            | Command::ActionResult { request_id, .. }
            | Command::Resolve { request_id, .. } => request_id.as_deref(),
        }
    }

    /// The type, as on the wire.
    pub fn kind(&self) -> &'static str {
        match self {
            Command::Message { .. } => "message",
            Command::Approve { .. } => "approve",
            Command::Respond { .. } => "respond",
            Command::Cancel { .. } => "cancel",
            Command::ActionResult { .. } => "action_result",
            Command::Resolve { .. } => "resolve",
        }
    }
}

/// A command was accepted.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Accepted {
    /// Always `accepted`.
    pub status: String,
    /// The turn the command belongs to.
    pub turn_id: Option<String>,
    /// The session's cursor once the command committed.
    pub cursor: u64,
    /// The request id of the first submission.
    pub request_id: Option<String>,
}

/// One event of a session's stream.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EventView {
    /// Position in the session's stream: 1, 2, 3... with no gap.
    pub cursor: u64,
    /// The session.
    pub session_id: String,
    /// The turn.
    pub turn_id: Option<String>,
    /// Such as `turn.completed`.
    #[serde(rename = "type")]
    pub event_type: String,
    /// The event's data.
    #[schema(value_type = Object)]
    pub data: Value,
    /// When it was appended (RFC 3339).
    pub time: String,
}

/// `GET /v1/sessions/{id}/items`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ItemsPage {
    /// Events after the cursor, in order.
    pub items: Vec<EventView>,
    /// Pass as `cursor` to get the next page.
    pub cursor: u64,
}

/// `GET /v1/actions`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ActionList {
    /// Pending actions in the token's scope.
    pub actions: Vec<ActionView>,
}

/// `POST /v1/actions/{id}/claim`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClaimRequest {
    /// The manifest hash the executor runs.
    pub manifest_hash: String,
    /// The implementation version the executor runs.
    pub implementation_version: String,
}

/// A claim granted.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClaimResponse {
    /// The claimed action.
    pub action: ActionView,
    /// Present it with heartbeats and the result.
    pub claim_id: String,
    /// The fencing generation.
    pub generation: u64,
    /// When the claim ends unless heartbeated (RFC 3339).
    pub lease_expires_at: String,
}

/// `POST /v1/actions/{id}/heartbeat`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HeartbeatRequest {
    /// The claim.
    pub claim_id: String,
    /// Its generation.
    #[serde(deserialize_with = "whole_number")]
    pub generation: u64,
}

/// A heartbeat accepted.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct HeartbeatResponse {
    /// The new end of the claim (RFC 3339).
    pub lease_expires_at: String,
}

/// `GET /health`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Health {
    /// Always `ok`.
    pub status: String,
}

/// `GET /ready`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Ready {
    /// `ready` or `not_ready`.
    pub status: String,
    /// Each check: `store`, `scheduler`, `accepting`.
    pub checks: std::collections::BTreeMap<String, bool>,
}

/// The query of a route that takes no parameter: any parameter is refused.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct NoQuery {}

/// The query of a session route: an operator's choice of tenant ([`crate::tenancy`]).
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct TenantQuery {
    /// An operator token's tenant (default: `default`); a tenant token may only name its own.
    #[param(
        nullable = false,
        pattern = "^[A-Za-z0-9._-]{1,100}$",
        example = "acme"
    )]
    pub tenant_id: Option<String>,
}

/// The query of `GET /v1/sessions`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct SessionsQuery {
    /// Only this tenant's sessions (an operator sees every tenant's without it; a tenant token
    /// may only name its own).
    #[param(
        nullable = false,
        pattern = "^[A-Za-z0-9._-]{1,100}$",
        example = "acme"
    )]
    pub tenant_id: Option<String>,
    /// Only this agent's sessions.
    #[param(nullable = false)]
    pub agent_id: Option<String>,
    /// Only sessions in these statuses, comma-separated (`paused,waiting,uncertain`).
    #[param(
        nullable = false,
        pattern = "^(idle|runnable|running|paused|waiting|uncertain|completed|failed|cancelled)(,(idle|runnable|running|paused|waiting|uncertain|completed|failed|cancelled))*$",
        example = "paused,uncertain"
    )]
    pub status: Option<String>,
    /// Only this user's sessions.
    #[param(nullable = false)]
    pub owner_user_id: Option<String>,
    /// Sessions per page, 1 to 1000 (default 100).
    #[param(nullable = false, minimum = 1, maximum = 1000)]
    pub limit: Option<usize>,
    /// The previous page's `next`: this page starts after it.
    #[param(nullable = false)]
    pub after: Option<String>,
}

/// The query of `DELETE /v1/sessions/{id}`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct EraseQuery {
    /// An operator token's tenant (default: `default`); a tenant token may only name its own.
    #[param(
        nullable = false,
        pattern = "^[A-Za-z0-9._-]{1,100}$",
        example = "acme"
    )]
    pub tenant_id: Option<String>,
    /// Erase even while a turn is in progress (it stops at its next write).
    #[param(nullable = false)]
    pub cancel: Option<bool>,
}

/// The query of `GET /v1/sessions/{id}/items`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ItemsQuery {
    /// An operator token's tenant (default: `default`); a tenant token may only name its own.
    #[param(
        nullable = false,
        pattern = "^[A-Za-z0-9._-]{1,100}$",
        example = "acme"
    )]
    pub tenant_id: Option<String>,
    /// Events after this cursor (0, the default: from the start).
    #[param(nullable = false, minimum = 0)]
    pub cursor: Option<u64>,
    /// How many events at most: 1 to 1000, 100 by default.
    #[param(nullable = false, minimum = 1, maximum = 1000)]
    pub limit: Option<u32>,
}

/// The query of `GET /v1/sessions/{id}/events`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct EventsQuery {
    /// An operator token's tenant (default: `default`); a tenant token may only name its own.
    #[param(
        nullable = false,
        pattern = "^[A-Za-z0-9._-]{1,100}$",
        example = "acme"
    )]
    pub tenant_id: Option<String>,
    /// Resume after this cursor (else `Last-Event-ID`, else 0); at most the session's newest.
    #[param(nullable = false, minimum = 0)]
    pub cursor: Option<u64>,
}

/// A non-negative integer as JSON Schema counts one: `85` and `85.0` alike (the schema says
/// `integer`, which `85.0` is), so a schema-valid request is never refused for its spelling.
fn whole_number<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
    let number = serde_json::Number::deserialize(deserializer)?;
    if let Some(whole) = number.as_u64() {
        return Ok(whole);
    }
    match number.as_f64() {
        Some(float)
            if float >= 0.0 && float.fract() == 0.0 && float < 18_446_744_073_709_551_616.0 =>
        {
            Ok(float as u64)
        }
        _ => Err(serde::de::Error::custom(format!(
            "invalid value {number}: expected a non-negative integer"
        ))),
    }
}

/// RFC 3339 (UTC, milliseconds) of a store timestamp.
pub fn rfc3339(time: corral_store::Timestamp) -> String {
    let millis = time.as_unix_millis();
    let secs = millis.div_euclid(1000);
    let ms = millis.rem_euclid(1000);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (hour, minute, second) = (rem / 3600, rem % 3600 / 60, rem % 60);
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{hour:02}:{minute:02}:{second:02}.{ms:03}Z")
}

#[cfg(test)]
mod tests {
    use super::*;
    use corral_store::Timestamp;

    #[test]
    fn rfc3339_formats_utc() {
        assert_eq!(
            rfc3339(Timestamp::from_unix_millis(0)),
            "1970-01-01T00:00:00.000Z"
        );
        assert_eq!(
            rfc3339(Timestamp::from_unix_millis(1_709_210_096_789)),
            "2024-02-29T12:34:56.789Z"
        );
    }

    #[test]
    fn commands_reject_unknown_fields() {
        let ok: Command = serde_json::from_str(
            r#"{"type":"message","idempotencyKey":"k","content":"hi","requestId":"r"}"#,
        )
        .expect("valid");
        assert_eq!(ok.kind(), "message");
        let error = serde_json::from_str::<Command>(
            r#"{"type":"message","idempotencyKey":"k","content":"hi","extra":1}"#,
        )
        .expect_err("unknown field");
        assert!(error.to_string().contains("extra"), "{error}");
    }
}
