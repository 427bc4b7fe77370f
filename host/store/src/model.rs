//! The records the store keeps and the requests that change them.

use std::collections::BTreeMap;
use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use serde_json::Value;

/// A point in time, in milliseconds since the Unix epoch.
///
/// Both backends store time as integer milliseconds so that the two behave identically. The
/// embedded store reads the process clock; PostgreSQL reads the database server's clock, so
/// replicas on different machines agree on when a lease expires.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct Timestamp(i64);

impl Timestamp {
    /// The time `millis` milliseconds after the Unix epoch.
    pub const fn from_unix_millis(millis: i64) -> Self {
        Self(millis)
    }

    /// Milliseconds since the Unix epoch.
    pub const fn as_unix_millis(self) -> i64 {
        self.0
    }

    /// The current time of this process's clock.
    pub fn now() -> Self {
        let millis = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, saturating_millis);
        Self(millis)
    }

    /// This time plus `duration`, saturating at the end of representable time.
    pub fn saturating_add(self, duration: Duration) -> Self {
        Self(self.0.saturating_add(saturating_millis(duration)))
    }

    /// This time minus `duration`, saturating at the start of representable time.
    pub fn saturating_sub(self, duration: Duration) -> Self {
        Self(self.0.saturating_sub(saturating_millis(duration)))
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}ms", self.0)
    }
}

pub(crate) fn saturating_millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// Declares a status enum stored as lowercase text, with its parser and display.
macro_rules! text_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident => $text:literal, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
        #[non_exhaustive]
        pub enum $name {
            $( $(#[$vmeta])* #[serde(rename = $text)] $variant, )+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The text stored in the database and shown in events.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $( $name::$variant => $text, )+
                }
            }

            /// Parses the stored text; `None` for text this version does not know.
            pub fn parse(text: &str) -> Option<Self> {
                match text {
                    $( $text => Some($name::$variant), )+
                    _ => None,
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

text_enum! {
    /// Where a session is in its life.
    pub enum SessionStatus {
        /// Created, no turn yet.
        Idle => "idle",
        /// Has work to do; any replica may claim it.
        Runnable => "runnable",
        /// A replica is running its turn (claimable again once that replica's lease expires).
        Running => "running",
        /// Waiting for external work (actions) to finish.
        Waiting => "waiting",
        /// Suspended at a permission checkpoint, waiting for a person.
        Paused => "paused",
        /// The last turn completed.
        Completed => "completed",
        /// The last turn failed.
        Failed => "failed",
        /// The last turn was cancelled.
        Cancelled => "cancelled",
        /// An effect's outcome is unknown; an operator or the application must reconcile.
        Uncertain => "uncertain",
        /// Closed for good; retention may delete it once its tenant's expiry has passed.
        Closed => "closed",
    }
}

text_enum! {
    /// What an effect does outside the store.
    pub enum EffectKind {
        /// A call to a language model.
        ModelCall => "model_call",
        /// A call to a capability (a tool), in-process or by an external executor.
        CapabilityCall => "capability_call",
        /// A person's (or an auto-confirm policy's) decision on a permission request.
        Approval => "approval",
        /// A step of a script's execution: its start marker, its result, and each batch of
        /// completions delivered to it (what exact replay delivers again).
        Script => "script",
    }
}

text_enum! {
    /// The journal status of an effect.
    pub enum EffectStatus {
        /// Recorded, not started (external work waiting for an executor).
        Pending => "pending",
        /// Started and not yet finished: after a crash this becomes [`EffectStatus::Uncertain`].
        Invoking => "invoking",
        /// Finished with a recorded result; never executed again.
        Completed => "completed",
        /// May or may not have happened; surfaced, never silently retried.
        Uncertain => "uncertain",
        /// Abandoned before it started.
        Cancelled => "cancelled",
    }
}

text_enum! {
    /// The status of external work handed to an executor.
    pub enum ActionStatus {
        /// Waiting for an executor to claim it.
        Pending => "pending",
        /// Claimed by an executor that holds an unexpired lease.
        Claimed => "claimed",
        /// The executor reported a result.
        Completed => "completed",
        /// The claim expired or the turn was cancelled while claimed: the work may have happened.
        Uncertain => "uncertain",
        /// Cancelled before any executor claimed it.
        Cancelled => "cancelled",
    }
}

/// An agent definition: its manifest, the manifest's content hash and the implementation version.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[non_exhaustive]
pub struct AgentDefinition {
    /// The agent's id.
    pub agent_id: String,
    /// The manifest as registered.
    pub manifest: Value,
    /// Content hash of the manifest, computed by the caller.
    pub manifest_hash: String,
    /// Version of the implementation serving this agent.
    pub implementation_version: String,
    /// When the agent was first registered.
    pub created_at: Timestamp,
    /// When the definition last changed.
    pub updated_at: Timestamp,
    /// The tenant that owns the agent; `None`: the operator's.
    pub owner_tenant: Option<String>,
    /// The tenants an operator's agent is shared with (`"*"`: every tenant).
    pub shared_with: Vec<String>,
}

impl AgentDefinition {
    /// Whether `tenant` may see and use the agent: its owner, or a tenant an operator's agent
    /// is shared with.
    pub fn visible_to(&self, tenant: &str) -> bool {
        match &self.owner_tenant {
            Some(owner) => owner == tenant,
            None => self.shared_with.iter().any(|t| t == "*" || t == tenant),
        }
    }
}

/// An agent definition to register or replace.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct NewAgent {
    /// The agent's id.
    pub agent_id: String,
    /// The manifest.
    pub manifest: Value,
    /// Content hash of the manifest.
    pub manifest_hash: String,
    /// Version of the implementation serving this agent.
    pub implementation_version: String,
    /// The tenant that owns the agent; `None`: the operator's.
    pub owner_tenant: Option<String>,
    /// The tenants an operator's agent is shared with (`"*"`: every tenant).
    pub shared_with: Vec<String>,
}

impl NewAgent {
    /// An agent definition.
    pub fn new(
        agent_id: impl Into<String>,
        manifest: Value,
        manifest_hash: impl Into<String>,
        implementation_version: impl Into<String>,
    ) -> Self {
        Self {
            agent_id: agent_id.into(),
            manifest,
            manifest_hash: manifest_hash.into(),
            implementation_version: implementation_version.into(),
            owner_tenant: None,
            shared_with: Vec::new(),
        }
    }

    /// The same definition, owned by `tenant` (`None`: the operator's) and, for an operator's
    /// agent, shared with `shared_with`.
    pub fn with_access(mut self, owner_tenant: Option<String>, shared_with: Vec<String>) -> Self {
        self.owner_tenant = owner_tenant;
        self.shared_with = shared_with;
        self
    }
}

/// The replica that currently owns a session.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct SessionOwner {
    /// The owning replica.
    pub replica_id: String,
    /// When the ownership lease ends unless renewed.
    pub lease_expires_at: Timestamp,
}

/// A chat session and everything the runtime keeps on its row.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[non_exhaustive]
pub struct Session {
    /// The session id, chosen by the application.
    pub id: String,
    /// The tenant the session belongs to (retention is per tenant).
    pub tenant_id: String,
    /// The user of that tenant who owns the session.
    pub owner_user_id: String,
    /// The agent the session talks to.
    pub agent_id: String,
    /// The agent's manifest as it was when the session was created.
    pub manifest: Value,
    /// Hash of that manifest.
    pub manifest_hash: String,
    /// Implementation version at creation.
    pub implementation_version: String,
    /// The creation parameters, compared on a repeated create.
    pub creation: Value,
    /// Lifecycle status.
    pub status: SessionStatus,
    /// The turn in progress, if any.
    pub active_turn_id: Option<String>,
    /// Runtime state owned by the chat runtime (opaque to the store).
    pub state: Value,
    /// Incremented by every transaction that changes the session's data; compare it with
    /// [`SessionCommit::expect_version`] for optimistic concurrency.
    pub version: u64,
    /// Cursor of the newest event (0 before the first event).
    pub last_cursor: u64,
    /// Sequence number of the newest conversation item (0 before the first item).
    pub last_item_seq: u64,
    /// The owning replica, if a lease was ever granted and not released.
    pub owner: Option<SessionOwner>,
    /// Fencing generation: incremented each time a replica takes ownership.
    pub generation: u64,
    /// Creation time.
    pub created_at: Timestamp,
    /// Time of the last change.
    pub updated_at: Timestamp,
    /// When the session was closed ([`SessionStatus::Closed`]).
    pub closed_at: Option<Timestamp>,
}

/// A session to create.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct NewSession {
    /// The session id.
    pub id: String,
    /// The tenant.
    pub tenant_id: String,
    /// The owning user of that tenant.
    pub owner_user_id: String,
    /// The agent; it must be registered.
    pub agent_id: String,
    /// Creation parameters: a repeated create with equal parameters returns the existing
    /// session, different ones are a conflict. Strip fields that must not count (request ids).
    pub creation: Value,
    /// Initial runtime state.
    pub state: Value,
}

impl NewSession {
    /// A session of `tenant_id`/`owner_user_id` talking to `agent_id`, with empty runtime state.
    pub fn new(
        id: impl Into<String>,
        tenant_id: impl Into<String>,
        owner_user_id: impl Into<String>,
        agent_id: impl Into<String>,
        creation: Value,
    ) -> Self {
        Self {
            id: id.into(),
            tenant_id: tenant_id.into(),
            owner_user_id: owner_user_id.into(),
            agent_id: agent_id.into(),
            creation,
            state: Value::Null,
        }
    }
}

/// The result of [`crate::Store::create_session`].
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct CreatedSession {
    /// The session as stored.
    pub session: Session,
    /// `false` when an identical create had already made it.
    pub created: bool,
}

/// Which sessions [`crate::Store::list_sessions`] returns.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SessionFilter {
    /// Only this tenant's sessions.
    pub tenant_id: Option<String>,
    /// Only sessions of this agent.
    pub agent_id: Option<String>,
    /// Only sessions in one of these statuses (all statuses when empty).
    pub statuses: Vec<SessionStatus>,
    /// Only sessions of this owner.
    pub owner_user_id: Option<String>,
}

/// How many sessions of one tenant and agent are in one status ([`crate::Store::count_sessions`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SessionCount {
    /// The tenant.
    pub tenant_id: String,
    /// The agent.
    pub agent_id: String,
    /// The status.
    pub status: SessionStatus,
    /// How many sessions.
    pub sessions: u64,
}

/// Changes to a session row made by a [`SessionCommit`].
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct SessionPatch {
    /// New status. Entering [`SessionStatus::Closed`] records `closed_at`; leaving it clears it.
    pub status: Option<SessionStatus>,
    /// New active turn (`Some(None)` clears it).
    pub active_turn_id: Option<Option<String>>,
    /// New runtime state.
    pub state: Option<Value>,
}

/// A ownership lease on a session, granted to one replica.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Lease {
    /// The leased session.
    pub session_id: String,
    /// The replica holding the lease.
    pub replica_id: String,
    /// The fencing generation of this lease.
    pub generation: u64,
    /// When the lease ends unless renewed.
    pub expires_at: Timestamp,
}

impl Lease {
    /// The fencing token to present with writes made under this lease.
    pub fn fence(&self) -> Fence {
        Fence {
            session_id: self.session_id.clone(),
            replica_id: self.replica_id.clone(),
            generation: self.generation,
        }
    }
}

/// A fencing token: writes carrying it succeed only while its lease is current and unexpired.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
#[non_exhaustive]
pub struct Fence {
    /// The leased session.
    pub session_id: String,
    /// The replica that was granted the lease.
    pub replica_id: String,
    /// The generation the lease was granted at.
    pub generation: u64,
}

/// One event of a session's stream.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[non_exhaustive]
pub struct Event {
    /// The session.
    pub session_id: String,
    /// Position in the session's stream: 1, 2, 3, ... with no gaps.
    pub cursor: u64,
    /// The turn the event belongs to.
    pub turn_id: Option<String>,
    /// Event type, such as `turn.completed`.
    pub event_type: String,
    /// Event data.
    pub payload: Value,
    /// When the event was appended.
    pub created_at: Timestamp,
}

/// An event to append.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct NewEvent {
    /// Event type.
    pub event_type: String,
    /// The turn it belongs to.
    pub turn_id: Option<String>,
    /// Event data.
    pub payload: Value,
}

impl NewEvent {
    /// An event of `event_type` carrying `payload`, outside any turn.
    pub fn new(event_type: impl Into<String>, payload: Value) -> Self {
        Self {
            event_type: event_type.into(),
            turn_id: None,
            payload,
        }
    }

    /// The same event, attributed to `turn_id`.
    pub fn in_turn(mut self, turn_id: impl Into<String>) -> Self {
        self.turn_id = Some(turn_id.into());
        self
    }
}

/// One item of the conversation history (a message, a tool call, a tool result...).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[non_exhaustive]
pub struct Item {
    /// The session.
    pub session_id: String,
    /// Position in the conversation: 1, 2, 3, ...
    pub seq: u64,
    /// The turn that produced it.
    pub turn_id: Option<String>,
    /// The item as the chat runtime serialized it.
    pub body: Value,
    /// When it was appended.
    pub created_at: Timestamp,
}

/// A conversation item to append.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct NewItem {
    /// The turn that produced it.
    pub turn_id: Option<String>,
    /// The item.
    pub body: Value,
}

impl NewItem {
    /// An item outside any turn.
    pub fn new(body: Value) -> Self {
        Self {
            turn_id: None,
            body,
        }
    }

    /// The same item, attributed to `turn_id`.
    pub fn in_turn(mut self, turn_id: impl Into<String>) -> Self {
        self.turn_id = Some(turn_id.into());
        self
    }
}

/// A page of conversation items.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[non_exhaustive]
pub struct ItemPage {
    /// Items in order.
    pub items: Vec<Item>,
    /// Pass this as `after` to get the next page; `None` on the last page.
    pub next_after: Option<u64>,
}

/// A durable checkpoint: the state a suspended or running turn resumes from.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[non_exhaustive]
pub struct Checkpoint {
    /// The session.
    pub session_id: String,
    /// The turn.
    pub turn_id: String,
    /// Segment of the turn: each resumption starts a new segment.
    pub segment: u64,
    /// The suspended run's state.
    pub data: Value,
    /// When this (turn, segment) was first written.
    pub created_at: Timestamp,
    /// When it was last written.
    pub updated_at: Timestamp,
}

/// A checkpoint to make live.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct NewCheckpoint {
    /// The turn.
    pub turn_id: String,
    /// The segment; writing the live (turn, segment) again replaces its data.
    pub segment: u64,
    /// The suspended run's state.
    pub data: Value,
}

impl NewCheckpoint {
    /// A checkpoint of `turn_id` at `segment`.
    pub fn new(turn_id: impl Into<String>, segment: u64, data: Value) -> Self {
        Self {
            turn_id: turn_id.into(),
            segment,
            data,
        }
    }
}

/// What a commit does to the session's live checkpoint.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum CheckpointWrite {
    /// Make this checkpoint the live one; the previous live checkpoint becomes superseded.
    Put(NewCheckpoint),
    /// Supersede the live checkpoint, leaving none.
    Clear,
}

/// A journaled effect: a model call or a capability call with a stable id.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[non_exhaustive]
pub struct Effect {
    /// Stable effect id, chosen by the runtime.
    pub effect_id: String,
    /// The session.
    pub session_id: String,
    /// The turn.
    pub turn_id: String,
    /// What the effect does.
    pub kind: EffectKind,
    /// Journal status.
    pub status: EffectStatus,
    /// The request: a repeated begin must present the same request.
    pub request: Value,
    /// The recorded result, once completed.
    pub result: Option<Value>,
    /// Why it failed or became uncertain.
    pub error: Option<String>,
    /// When it was journaled.
    pub created_at: Timestamp,
    /// When its status last changed.
    pub updated_at: Timestamp,
}

impl Effect {
    /// Whether this entry is the one `new` asks for in `session_id` (same session, turn, kind
    /// and request): beginning it again is a replay, anything else under its id is a conflict.
    pub fn journals(&self, session_id: &str, new: &NewEffect) -> bool {
        self.session_id == session_id
            && self.turn_id == new.turn_id
            && self.kind == new.kind
            && self.request == new.request
    }
}

/// What a run of one turn needs of the journal ([`crate::Store::turn_effects`]).
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct TurnEffects {
    /// The turn's effects, in journal order.
    pub effects: Vec<Effect>,
    /// How many model calls the session's other turns journaled.
    pub model_calls_elsewhere: u64,
}

/// An effect to journal.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct NewEffect {
    /// Stable effect id.
    pub effect_id: String,
    /// The turn.
    pub turn_id: String,
    /// What the effect does.
    pub kind: EffectKind,
    /// Initial status: [`EffectStatus::Invoking`] for work the caller starts now,
    /// [`EffectStatus::Pending`] for work an executor will claim.
    pub status: EffectStatus,
    /// The request.
    pub request: Value,
    /// The result, for an effect journaled as already [`EffectStatus::Completed`] (a decision
    /// or a record that has no separate execution, such as an approval).
    pub result: Option<Value>,
}

impl NewEffect {
    /// An effect in its initial `status`.
    pub fn new(
        effect_id: impl Into<String>,
        turn_id: impl Into<String>,
        kind: EffectKind,
        status: EffectStatus,
        request: Value,
    ) -> Self {
        Self {
            effect_id: effect_id.into(),
            turn_id: turn_id.into(),
            kind,
            status,
            request,
            result: None,
        }
    }

    /// An effect journaled as completed with `result` in one step.
    pub fn completed(
        effect_id: impl Into<String>,
        turn_id: impl Into<String>,
        kind: EffectKind,
        request: Value,
        result: Value,
    ) -> Self {
        Self {
            result: Some(result),
            ..Self::new(effect_id, turn_id, kind, EffectStatus::Completed, request)
        }
    }

    /// The journal entry this becomes in `session_id` at `now`.
    pub fn into_effect(self, session_id: &str, now: Timestamp) -> Effect {
        Effect {
            effect_id: self.effect_id,
            session_id: session_id.to_owned(),
            turn_id: self.turn_id,
            kind: self.kind,
            status: self.status,
            request: self.request,
            result: self.result,
            error: None,
            created_at: now,
            updated_at: now,
        }
    }
}

/// A guarded status change of an effect, part of a [`SessionCommit`].
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct EffectTransition {
    /// The effect; it must belong to the committing session.
    pub effect_id: String,
    /// The statuses it may be in; any other is a conflict.
    pub from: Vec<EffectStatus>,
    /// The new status.
    pub to: EffectStatus,
    /// The result to record (kept as it was when `None`).
    pub result: Option<Value>,
    /// The error to record (kept as it was when `None`).
    pub error: Option<String>,
}

impl EffectTransition {
    /// Moves `effect_id` from one of `from` to `to`.
    pub fn new(effect_id: impl Into<String>, from: &[EffectStatus], to: EffectStatus) -> Self {
        Self {
            effect_id: effect_id.into(),
            from: from.to_vec(),
            to,
            result: None,
            error: None,
        }
    }

    /// Records `result` with the transition.
    pub fn with_result(mut self, result: Value) -> Self {
        self.result = Some(result);
        self
    }

    /// Records `error` with the transition.
    pub fn with_error(mut self, error: impl Into<String>) -> Self {
        self.error = Some(error.into());
        self
    }
}

/// Begins an effect idempotently: see [`crate::Store::begin_effect`].
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct BeginEffect {
    /// The session.
    pub session_id: String,
    /// When set, the write succeeds only under this lease.
    pub fence: Option<Fence>,
    /// The effect.
    pub effect: NewEffect,
    /// External work to create with it (its id is the effect id).
    pub action: Option<NewAction>,
    /// Events appended when the effect is new.
    pub events: Vec<NewEvent>,
}

impl BeginEffect {
    /// Begins `effect` in `session_id`, with no lease, action or event.
    pub fn new(session_id: impl Into<String>, effect: NewEffect) -> Self {
        Self {
            session_id: session_id.into(),
            fence: None,
            effect,
            action: None,
            events: Vec::new(),
        }
    }
}

/// The result of [`crate::Store::begin_effect`].
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum BeginEffectOutcome {
    /// The effect is new and journaled; the caller should perform it (or wait for its action).
    Started {
        /// The journaled effect.
        effect: Effect,
        /// The events appended with it.
        events: Vec<Event>,
    },
    /// The same effect was journaled before; the caller must not perform it again.
    Existing(Effect),
}

/// External work for an executor, created with its effect.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[non_exhaustive]
pub struct Action {
    /// The action id (equal to its effect's id).
    pub action_id: String,
    /// The session.
    pub session_id: String,
    /// The turn.
    pub turn_id: String,
    /// The agent whose executors may claim it.
    pub agent_id: String,
    /// The manifest hash an executor must present.
    pub manifest_hash: String,
    /// The implementation version an executor must present.
    pub implementation_version: String,
    /// The capability to run.
    pub capability_id: String,
    /// What the executor needs (input, context...).
    pub request: Value,
    /// Status.
    pub status: ActionStatus,
    /// Fencing generation: incremented by each claim.
    pub generation: u64,
    /// Id of the current or last claim.
    pub claim_id: Option<String>,
    /// When the current claim ends unless heartbeated.
    pub lease_expires_at: Option<Timestamp>,
    /// The reported result.
    pub result: Option<Value>,
    /// Creation time.
    pub created_at: Timestamp,
    /// Time of the last change.
    pub updated_at: Timestamp,
}

/// External work to create with an effect.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct NewAction {
    /// The agent whose executors may claim it.
    pub agent_id: String,
    /// The manifest hash an executor must present.
    pub manifest_hash: String,
    /// The implementation version an executor must present.
    pub implementation_version: String,
    /// The capability to run.
    pub capability_id: String,
    /// What the executor needs.
    pub request: Value,
}

impl NewAction {
    /// Work on `capability_id` for executors scoped to this agent definition.
    pub fn new(
        agent_id: impl Into<String>,
        manifest_hash: impl Into<String>,
        implementation_version: impl Into<String>,
        capability_id: impl Into<String>,
        request: Value,
    ) -> Self {
        Self {
            agent_id: agent_id.into(),
            manifest_hash: manifest_hash.into(),
            implementation_version: implementation_version.into(),
            capability_id: capability_id.into(),
            request,
        }
    }
}

/// The condition an [`ActionTransition`] requires.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ActionGuard {
    /// The action is in one of these statuses (a conflict otherwise).
    Status(Vec<ActionStatus>),
    /// The action is claimed under exactly this claim, and the claim has not expired
    /// (a stale generation otherwise).
    Claim {
        /// The claim id the executor received.
        claim_id: String,
        /// The generation the executor received.
        generation: u64,
    },
}

/// A guarded status change of an action, part of a [`SessionCommit`].
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct ActionTransition {
    /// The action; it must belong to the committing session.
    pub action_id: String,
    /// What must hold for the change to apply.
    pub guard: ActionGuard,
    /// The new status.
    pub to: ActionStatus,
    /// The result to record (kept as it was when `None`).
    pub result: Option<Value>,
    /// Clears the claim (id and lease), so that the next claim gets the next generation.
    pub clear_claim: bool,
}

impl ActionTransition {
    /// Moves `action_id` to `to` if `guard` holds.
    pub fn new(action_id: impl Into<String>, guard: ActionGuard, to: ActionStatus) -> Self {
        Self {
            action_id: action_id.into(),
            guard,
            to,
            result: None,
            clear_claim: false,
        }
    }

    /// Records `result` with the transition.
    pub fn with_result(mut self, result: Value) -> Self {
        self.result = Some(result);
        self
    }
}

/// Which actions [`crate::Store::list_actions`] returns.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ActionFilter {
    /// Only this session's actions.
    pub session_id: Option<String>,
    /// Only actions in one of these statuses (all when empty).
    pub statuses: Vec<ActionStatus>,
    /// Only actions an executor with this scope may claim.
    pub scope: Option<ExecutorScope>,
}

/// The agent definition an executor token is scoped to.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct ExecutorScope {
    /// The agent.
    pub agent_id: String,
    /// The manifest hash.
    pub manifest_hash: String,
    /// The implementation version.
    pub implementation_version: String,
    /// The one tenant whose sessions' actions the executor may see; `None`: every tenant's.
    pub tenant: Option<String>,
}

impl ExecutorScope {
    /// Whether an executor with this scope may claim and complete `action`, an action of a
    /// session of `tenant`.
    pub fn covers(&self, action: &Action, tenant: &str) -> bool {
        action.agent_id == self.agent_id
            && action.manifest_hash == self.manifest_hash
            && action.implementation_version == self.implementation_version
            && self.covers_tenant(tenant)
    }

    /// Whether the scope covers sessions of `tenant`.
    pub fn covers_tenant(&self, tenant: &str) -> bool {
        self.tenant.as_deref().is_none_or(|own| own == tenant)
    }

    /// The same scope, limited to the sessions of `tenant`.
    pub fn for_tenant(mut self, tenant: Option<String>) -> Self {
        self.tenant = tenant;
        self
    }

    /// A scope.
    pub fn new(
        agent_id: impl Into<String>,
        manifest_hash: impl Into<String>,
        implementation_version: impl Into<String>,
    ) -> Self {
        Self {
            agent_id: agent_id.into(),
            manifest_hash: manifest_hash.into(),
            implementation_version: implementation_version.into(),
            tenant: None,
        }
    }
}

/// An executor's claim on a pending action.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct ClaimAction {
    /// The action.
    pub action_id: String,
    /// A fresh id for this claim, chosen by the caller.
    pub claim_id: String,
    /// How long the claim lasts without a heartbeat.
    pub lease: Duration,
    /// The manifest hash the executor runs; must equal the action's.
    pub manifest_hash: String,
    /// The implementation version the executor runs; must equal the action's.
    pub implementation_version: String,
}

impl ClaimAction {
    /// Claims `action_id` under `claim_id` for `lease`, presenting the executor's definition.
    pub fn new(
        action_id: impl Into<String>,
        claim_id: impl Into<String>,
        lease: Duration,
        manifest_hash: impl Into<String>,
        implementation_version: impl Into<String>,
    ) -> Self {
        Self {
            action_id: action_id.into(),
            claim_id: claim_id.into(),
            lease,
            manifest_hash: manifest_hash.into(),
            implementation_version: implementation_version.into(),
        }
    }
}

/// The result of a successful [`crate::Store::claim_action`].
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct ClaimedAction {
    /// The action, now claimed (its generation is the fencing token).
    pub action: Action,
    /// The `action.claimed` event appended with the claim.
    pub event: Event,
}

/// An executor's heartbeat on its claim.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct HeartbeatAction {
    /// The action.
    pub action_id: String,
    /// The claim id the executor received.
    pub claim_id: String,
    /// The generation the executor received.
    pub generation: u64,
    /// The new lease, counted from now.
    pub lease: Duration,
}

impl HeartbeatAction {
    /// Extends the claim (`claim_id`, `generation`) on `action_id` to `lease` from now.
    pub fn new(
        action_id: impl Into<String>,
        claim_id: impl Into<String>,
        generation: u64,
        lease: Duration,
    ) -> Self {
        Self {
            action_id: action_id.into(),
            claim_id: claim_id.into(),
            generation,
            lease,
        }
    }
}

/// An idempotent command: its key, its body, and the response to give on a replay.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct NewCommand {
    /// The idempotency key, unique per session.
    pub idempotency_key: String,
    /// The command; a replay must carry an equal one. Strip fields that must not count.
    pub command: Value,
    /// The response to return now and on every replay.
    pub response: Value,
}

impl NewCommand {
    /// A command under `idempotency_key`.
    pub fn new(idempotency_key: impl Into<String>, command: Value, response: Value) -> Self {
        Self {
            idempotency_key: idempotency_key.into(),
            command,
            response,
        }
    }
}

/// A recorded command.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[non_exhaustive]
pub struct CommandRecord {
    /// The session.
    pub session_id: String,
    /// The idempotency key.
    pub idempotency_key: String,
    /// The command.
    pub command: Value,
    /// The first response.
    pub response: Value,
    /// The session's last event cursor once the command committed.
    pub cursor: u64,
    /// When it was recorded.
    pub created_at: Timestamp,
}

/// One atomic change to a session: everything in it commits together or not at all.
///
/// The order of application is: guards (fence, expected version, command replay), effect
/// transitions, action transitions, the session patch, items, events, checkpoint, command record.
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct SessionCommit {
    /// The session.
    pub session_id: String,
    /// When set, the commit succeeds only under this lease.
    pub fence: Option<Fence>,
    /// When set, the commit succeeds only if the session's version is still this one.
    pub expect_version: Option<u64>,
    /// When set, the commit succeeds only if the session's active turn is still this one
    /// (`Some(None)`: no active turn); otherwise [`crate::StoreError::Conflict`]. A turn runner
    /// sets it on every write so that a cancelled or superseded turn cannot write.
    pub expect_turn: Option<Option<String>>,
    /// When not empty, the commit succeeds only if the session's status is one of these;
    /// otherwise [`crate::StoreError::Conflict`].
    pub expect_status: Vec<SessionStatus>,
    /// The command this commit answers: a replay returns its first response instead of applying.
    pub command: Option<NewCommand>,
    /// Changes to the session row.
    pub patch: SessionPatch,
    /// Conversation items to append.
    pub items: Vec<NewItem>,
    /// Events to append.
    pub events: Vec<NewEvent>,
    /// The new live checkpoint, or its removal.
    pub checkpoint: Option<CheckpointWrite>,
    /// Effects to journal, in order, before the transitions apply. Each must be new (an id
    /// journaled before is a [`crate::StoreError::Conflict`]) and start completed with a result
    /// or invoking (work the caller starts once this commit returns); work for an executor
    /// (pending, with its action) goes through [`crate::Store::begin_effect`].
    pub new_effects: Vec<NewEffect>,
    /// Guarded effect status changes.
    pub effects: Vec<EffectTransition>,
    /// Guarded action status changes.
    pub actions: Vec<ActionTransition>,
}

impl SessionCommit {
    /// An empty commit to `session_id`.
    pub fn new(session_id: impl Into<String>) -> Self {
        Self {
            session_id: session_id.into(),
            ..Self::default()
        }
    }
}

/// What a [`SessionCommit`] did.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum CommitOutcome {
    /// The commit applied.
    Applied(Box<CommitReceipt>),
    /// The command had been recorded before with an equal body: nothing was applied and
    /// this is its first response.
    Replayed(CommandRecord),
}

/// What an applied [`SessionCommit`] wrote.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct CommitReceipt {
    /// The session after the commit.
    pub session: Session,
    /// The appended events with their cursors.
    pub events: Vec<Event>,
    /// The appended items with their sequence numbers.
    pub items: Vec<Item>,
    /// The recorded command.
    pub command: Option<CommandRecord>,
}

/// How long retention keeps what.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RetentionPolicy {
    /// How long closed sessions of tenants without an override are kept (`None`: forever).
    pub closed_session_ttl: Option<Duration>,
    /// How long a settled session (idle, completed, failed or cancelled: nothing paused,
    /// waiting, running or uncertain) of a tenant without an override stays open after its
    /// last change before retention closes it (`None`: it stays open). A closed session then
    /// expires after `closed_session_ttl`; a message reopens it before that.
    pub settled_session_ttl: Option<Duration>,
    /// Per-tenant overrides of `settled_session_ttl`.
    pub tenant_settled_session_ttl: BTreeMap<String, Duration>,
    /// Per-tenant overrides of `closed_session_ttl`.
    pub tenant_closed_session_ttl: BTreeMap<String, Duration>,
    /// How long the events and items of closed sessions of tenants without an override are
    /// kept (`None`: as long as the session). The session row stays, so its cursors continue
    /// without a gap if it is reopened; reads after a pruned cursor start at the oldest kept.
    pub closed_history_ttl: Option<Duration>,
    /// Per-tenant overrides of `closed_history_ttl`.
    pub tenant_closed_history_ttl: BTreeMap<String, Duration>,
    /// How long a superseded checkpoint is kept after it was superseded.
    pub superseded_checkpoint_ttl: Duration,
    /// How long idempotency records are kept at least, even after their session is deleted.
    pub idempotency_window: Duration,
}

/// The default idempotency window: 24 hours.
pub const DEFAULT_IDEMPOTENCY_WINDOW: Duration = Duration::from_secs(24 * 60 * 60);

impl Default for RetentionPolicy {
    /// Keeps sessions forever, prunes superseded checkpoints at once and keeps idempotency
    /// records for [`DEFAULT_IDEMPOTENCY_WINDOW`].
    fn default() -> Self {
        Self {
            closed_session_ttl: None,
            settled_session_ttl: None,
            tenant_settled_session_ttl: BTreeMap::new(),
            tenant_closed_session_ttl: BTreeMap::new(),
            closed_history_ttl: None,
            tenant_closed_history_ttl: BTreeMap::new(),
            superseded_checkpoint_ttl: Duration::ZERO,
            idempotency_window: DEFAULT_IDEMPOTENCY_WINDOW,
        }
    }
}

/// What [`crate::Store::apply_retention`] removed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct RetentionReport {
    /// Closed sessions deleted with their items, events, checkpoints, effects and actions.
    pub sessions_deleted: u64,
    /// Settled sessions closed for having been left alone longer than their tenant's
    /// `settled_session_ttl`.
    pub sessions_closed: u64,
    /// Superseded checkpoints pruned.
    pub checkpoints_pruned: u64,
    /// Idempotency records older than the window pruned.
    pub commands_pruned: u64,
    /// Events of closed sessions older than their tenant's history expiry deleted.
    pub events_pruned: u64,
    /// Conversation items of closed sessions older than their tenant's history expiry deleted.
    pub items_pruned: u64,
}

/// Which implementation a store is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StoreBackend {
    /// The embedded SQLite file.
    Sqlite,
    /// PostgreSQL.
    Postgres,
}

impl fmt::Display for StoreBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            StoreBackend::Sqlite => "sqlite",
            StoreBackend::Postgres => "postgres",
        })
    }
}

/// The largest page [`crate::Store::list_events`] and [`crate::Store::page_items`] return.
pub const MAX_PAGE: usize = 1000;

/// The longest page of [`crate::Store::page_items`] the embedded store reads on the caller's
/// task when its connection is free, as it does a step (a few rows: tens of microseconds); a
/// longer page goes to the blocking pool, so a worker never stalls on a thousand items. A turn
/// that reads the few items appended since its previous one asks for a page this short first.
pub const SHORT_PAGE: usize = 32;

#[cfg(test)]
mod tests {
    use super::*;

    /// Statuses are stored as text: every value must read back as itself, and no two may share
    /// a text.
    #[test]
    fn stored_status_texts_read_back() {
        fn check<T: Copy + PartialEq + fmt::Debug>(
            all: &[T],
            text: fn(T) -> &'static str,
            parse: fn(&str) -> Option<T>,
        ) {
            let mut seen = std::collections::HashSet::new();
            for value in all {
                assert_eq!(parse(text(*value)), Some(*value));
                assert!(seen.insert(text(*value)), "{value:?} shares its text");
            }
            assert_eq!(parse("no-such-status"), None);
        }
        check(
            SessionStatus::ALL,
            SessionStatus::as_str,
            SessionStatus::parse,
        );
        check(EffectKind::ALL, EffectKind::as_str, EffectKind::parse);
        check(EffectStatus::ALL, EffectStatus::as_str, EffectStatus::parse);
        check(ActionStatus::ALL, ActionStatus::as_str, ActionStatus::parse);
    }

    #[test]
    fn timestamps_saturate_instead_of_overflowing() {
        let end = Timestamp::from_unix_millis(i64::MAX);
        assert_eq!(end.saturating_add(Duration::from_secs(1)), end);
        assert_eq!(
            Timestamp::from_unix_millis(i64::MIN).saturating_sub(Duration::MAX),
            Timestamp::from_unix_millis(i64::MIN)
        );
        assert_eq!(
            Timestamp::from_unix_millis(1_000).saturating_add(Duration::from_millis(250)),
            Timestamp::from_unix_millis(1_250)
        );
    }
}

/// How an operator settles an uncertain effect ([`crate::CommandKind::Resolve`]).
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Resolution {
    /// Perform it again: the effect (and its action, for a new claim) become pending.
    Retry,
    /// It happened with this outcome: the effect (and its action) become completed.
    Complete(Value),
}
