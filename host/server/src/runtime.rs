//! The server's logic behind the handlers: sessions, commands and their status rules, views.
//! The turn scheduler and the lease sweeper are in [`crate::scheduler`].
//!
//! A command is authenticated and parsed here, then run as one store transaction
//! ([`corral_store::Store::run_command`]): the session state machine's rules live in the store,
//! written once, and its idempotency record makes a replay return the first response byte for
//! byte.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

pub(crate) use corral_store::server_state;
use corral_store::{
    ActionFilter, ActionStatus, CommandKind, EffectStatus, Entity, Event, NewAgent, NewSession,
    Resolution, Session, SessionCommand, SessionFilter, Store, StoreError,
};
use serde_json::{Value, json};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::auth::Caller;
use crate::config::Config;
use crate::error::ApiError;
use crate::manifest::manifest_hash;
use crate::metrics::Metrics;
use crate::runner::TurnRunner;
use crate::wire::{
    ActionView, AgentPut, AgentView, Command, EventView, PutAgent, PutSession, SessionList,
    SessionSummary, SessionView, SessionsQuery, Status, UncertainEffect, rfc3339,
};

pub use crate::tenancy::DEFAULT_TENANT;
use crate::tenancy::{addressed_tenant, public_id, session_key, tenant_of};

/// The shared state of a running server.
#[derive(Debug)]
pub struct Runtime {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) runner: Arc<dyn TurnRunner>,
    config: Config,
    /// The credentials in force (replaced on SIGHUP; `config.tokens` is the start's).
    pub(crate) tokens: crate::tokens::TokenTable,
    pub(crate) replica_id: String,
    pub(crate) metrics: Arc<Metrics>,
    /// Turn segments running in this process, by session.
    pub(crate) running: Mutex<HashMap<String, CancellationToken>>,
    /// Wakes the scheduler.
    pub(crate) wake: Notify,
    /// Cancelled when the server shuts down: no new connection, command or segment.
    pub(crate) shutdown: CancellationToken,
    /// Cancelled when the shutdown's grace period ends: the running segments stop.
    pub(crate) abort: CancellationToken,
    pub(crate) closing: AtomicBool,
    pub(crate) scheduler_up: AtomicBool,
    /// Turn segments and streams, awaited at shutdown.
    pub(crate) tasks: TaskTracker,
}

impl Runtime {
    pub(crate) fn new(
        config: Config,
        store: Arc<dyn Store>,
        runner: Arc<dyn TurnRunner>,
        metrics: Arc<Metrics>,
    ) -> Runtime {
        let replica_id = config
            .replica_name
            .clone()
            .unwrap_or_else(|| format!("replica-{}", uuid::Uuid::new_v4()));
        Runtime {
            store,
            runner,
            tokens: crate::tokens::TokenTable::new(config.tokens.clone()),
            config,
            replica_id,
            metrics,
            running: Mutex::new(HashMap::new()),
            wake: Notify::new(),
            shutdown: CancellationToken::new(),
            abort: CancellationToken::new(),
            closing: AtomicBool::new(false),
            scheduler_up: AtomicBool::new(false),
            tasks: TaskTracker::new(),
        }
    }

    /// Awaits a store call, recording its latency for `/metrics`.
    pub(crate) async fn timed<T>(&self, call: impl std::future::Future<Output = T>) -> T {
        let start = std::time::Instant::now();
        let result = call.await;
        self.metrics.store_call(start.elapsed());
        result
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// This process's replica id (unique per start).
    pub fn replica_id(&self) -> &str {
        &self.replica_id
    }

    /// Whether the server is shutting down.
    pub fn is_closing(&self) -> bool {
        self.closing.load(Ordering::SeqCst)
    }

    /// `/ready`'s checks.
    pub async fn readiness(&self) -> Vec<(&'static str, bool)> {
        let store = self.store.ping().await.is_ok();
        vec![
            ("store", store),
            ("scheduler", self.scheduler_up.load(Ordering::SeqCst)),
            ("accepting", !self.is_closing()),
        ]
    }

    // ---- agents ----

    /// Registers an agent.
    pub async fn put_agent(
        &self,
        caller: &Caller,
        agent_id: &str,
        body: &PutAgent,
        raw_manifest: Value,
    ) -> Result<AgentPut, ApiError> {
        let manifest = &body.manifest;
        let implementation_version = body.implementation_version.as_str();
        let owner = self.agent_owner(caller, agent_id, body).await?;
        if manifest.id != agent_id {
            return Err(ApiError::InvalidRequest(format!(
                "manifest.id {:?} must equal the agent id {agent_id:?} of the path",
                manifest.id
            )));
        }
        if implementation_version.trim().is_empty() {
            return Err(ApiError::InvalidRequest(
                "implementationVersion must not be empty".to_owned(),
            ));
        }
        manifest
            .check()
            .map_err(|error| ApiError::InvalidRequest(error.to_string()))?;
        self.runner
            .check(manifest, body.check_mcp_servers)
            .await
            .map_err(ApiError::InvalidRequest)?;
        let hash = manifest_hash(&raw_manifest);
        let shared_with = if owner.is_some() {
            Vec::new()
        } else {
            body.shared_with.clone()
        };
        let agent = self
            .store
            .put_agent(
                NewAgent::new(agent_id, raw_manifest, &hash, implementation_version)
                    .with_access(owner, shared_with),
            )
            .await
            .map_err(|e| ApiError::from_store("put agent", e))?;
        Ok(AgentPut {
            agent_id: agent.agent_id,
            manifest_hash: agent.manifest_hash,
            implementation_version: agent.implementation_version,
        })
    }

    /// Who will own agent `agent_id` as `caller` registers it: the caller's tenant for a tenant
    /// token (granted `canRegisterAgents`, never over another tenant's or the operator's agent),
    /// the body's `tenantId` for an operator.
    async fn agent_owner(
        &self,
        caller: &Caller,
        agent_id: &str,
        body: &PutAgent,
    ) -> Result<Option<String>, ApiError> {
        for tenant in body.tenant_id.iter().chain(body.shared_with.iter()) {
            if tenant != "*"
                && let Some(problem) = crate::tenancy::tenant_problem(tenant)
            {
                return Err(ApiError::InvalidRequest(format!(
                    "tenant {tenant:?} {problem}"
                )));
            }
        }
        if body.tenant_id.as_deref() == Some("*") {
            return Err(ApiError::InvalidRequest(
                "tenantId names one tenant; \"*\" is only for sharedWith".to_owned(),
            ));
        }
        if body.tenant_id.is_some() && !body.shared_with.is_empty() {
            return Err(ApiError::InvalidRequest(
                "a tenant's agent is not shared: give tenantId or sharedWith, not both".to_owned(),
            ));
        }
        let Some(own) = caller.application()? else {
            return Ok(body.tenant_id.clone());
        };
        if !caller.may(|g| g.register_agents) {
            return Err(ApiError::Forbidden(
                "registering agents is an operator's act: this tenant token is not granted canRegisterAgents"
                    .to_owned(),
            ));
        }
        if body.tenant_id.as_deref().is_some_and(|asked| asked != own) {
            return Err(ApiError::Forbidden(
                "a tenant token registers agents for its own tenant only".to_owned(),
            ));
        }
        if !body.shared_with.is_empty() {
            return Err(ApiError::Forbidden(
                "only an operator shares agents with tenants".to_owned(),
            ));
        }
        match self.store.get_agent(agent_id).await {
            Ok(existing) if existing.owner_tenant.as_deref() != Some(own) => Err(
                ApiError::Conflict(format!("agent id {agent_id:?} is taken; choose another")),
            ),
            Ok(_) | Err(StoreError::NotFound { .. }) => Ok(Some(own.to_owned())),
            Err(error) => Err(ApiError::from_store("get agent", error)),
        }
    }

    /// The agents `tenant` may see (every agent for an operator, `tenant: None`).
    pub async fn list_agents(&self, tenant: Option<&str>) -> Result<Vec<AgentView>, ApiError> {
        let agents = self
            .store
            .list_agents()
            .await
            .map_err(|e| ApiError::from_store("list agents", e))?;
        Ok(agents
            .into_iter()
            .filter(|a| tenant.is_none_or(|tenant| a.visible_to(tenant)))
            .map(|a| AgentView {
                agent_id: a.agent_id,
                manifest: a.manifest,
                manifest_hash: a.manifest_hash,
                implementation_version: a.implementation_version,
                tenant_id: a.owner_tenant,
                shared_with: tenant.is_none().then_some(a.shared_with),
            })
            .collect())
    }

    // ---- sessions ----

    /// Session `id` of the tenant the caller addresses (its own; for an operator `asked`, else
    /// the default tenant), or 404. The returned session's `id` is its store key.
    pub async fn visible_session(
        &self,
        tenant: Option<&str>,
        asked: Option<&str>,
        id: &str,
    ) -> Result<Session, ApiError> {
        let tenant = addressed_tenant(tenant, asked)?;
        let session = self
            .store
            .get_session(&session_key(&tenant, id))
            .await
            .map_err(|e| ApiError::from_store("get session", e))?;
        if session.tenant_id != tenant {
            return Err(ApiError::NotFound("session not found".to_owned()));
        }
        Ok(session)
    }

    /// Creates a session idempotently.
    pub async fn put_session(
        &self,
        tenant: Option<&str>,
        asked: Option<&str>,
        session_id: &str,
        body: PutSession,
    ) -> Result<SessionView, ApiError> {
        let asked = match (asked, body.tenant_id.as_deref()) {
            (Some(query), Some(field)) if query != field => {
                return Err(ApiError::InvalidRequest(
                    "the tenantId query parameter and field disagree".to_owned(),
                ));
            }
            (query, field) => field.or(query),
        };
        let tenant_id = addressed_tenant(tenant, asked)?;
        for (name, value) in [
            ("agentId", &body.agent_id),
            ("ownerUserId", &body.owner_user_id),
        ] {
            if value.trim().is_empty() {
                return Err(ApiError::InvalidRequest(format!(
                    "{name} must not be empty"
                )));
            }
        }
        if session_id.is_empty() || session_id.chars().count() > 200 {
            return Err(ApiError::InvalidRequest(
                "the session id must have 1 to 200 characters".to_owned(),
            ));
        }
        let creation = json!({
            "agentId": body.agent_id,
            "ownerUserId": body.owner_user_id,
            "info": body.info,
            "tenantId": tenant_id,
        });
        let mut new = NewSession::new(
            session_key(&tenant_id, session_id),
            &tenant_id,
            &body.owner_user_id,
            &body.agent_id,
            creation,
        );
        new.state = server_state(&Value::Null, Value::Null, Value::Null);
        // A tenant token uses only the agents it may see; nobody opens a session of one
        // tenant on an agent another tenant owns. An unusable agent is "not found", as an
        // unknown one is, so its existence does not leak.
        match self.store.get_agent(&body.agent_id).await {
            Ok(agent) => {
                let usable = match (&agent.owner_tenant, tenant) {
                    (Some(owner), _) => *owner == tenant_id,
                    (None, Some(_)) => agent.visible_to(&tenant_id),
                    (None, None) => true,
                };
                if !usable {
                    return Err(ApiError::NotFound(format!(
                        "agent {:?} not found",
                        body.agent_id
                    )));
                }
            }
            Err(StoreError::NotFound { .. }) => {}
            Err(error) => return Err(ApiError::from_store("get agent", error)),
        }
        let created = self.store.create_session(new).await.map_err(|e| match e {
            StoreError::NotFound { .. } => {
                ApiError::NotFound(format!("agent {:?} not found", body.agent_id))
            }
            StoreError::Conflict { .. } => ApiError::Conflict(
                "a session with this id exists with different creation parameters".to_owned(),
            ),
            other => ApiError::from_store("create session", other),
        })?;
        self.view(created.session).await
    }

    /// A page of the sessions the tenant may see that match `query`, with counts by status.
    pub async fn list_sessions(
        &self,
        tenant: Option<&str>,
        query: SessionsQuery,
    ) -> Result<SessionList, ApiError> {
        let mut filter = SessionFilter::default();
        // An operator sees every tenant's sessions unless it asks for one.
        filter.tenant_id = match (tenant, query.tenant_id.as_deref()) {
            (None, None) => None,
            (tenant, asked) => Some(addressed_tenant(tenant, asked)?),
        };
        filter.agent_id = query.agent_id;
        filter.owner_user_id = query.owner_user_id;
        let limit = query.limit.unwrap_or(100);
        if !(1..=1000).contains(&limit) {
            return Err(ApiError::InvalidRequest(
                "limit must be between 1 and 1000".to_owned(),
            ));
        }
        let counts = self
            .store
            .session_counts(&filter)
            .await
            .map_err(|e| ApiError::from_store("count sessions", e))?;
        let mut by_status = std::collections::BTreeMap::new();
        for (status, n) in counts {
            let name = match corral_store::SessionStatus::parse(&status) {
                Some(status) => Status::of(status).as_str(),
                None => continue,
            };
            *by_status.entry(name.to_owned()).or_insert(0) += n;
        }
        for name in query.status.iter().flat_map(|s| s.split(',')) {
            let statuses = Status::parse(name).ok_or_else(|| {
                ApiError::InvalidRequest(format!("status {name:?} is not a session status"))
            })?;
            filter.statuses.extend(statuses);
        }
        let page = self
            .store
            .page_sessions(&filter, query.after.as_deref(), limit)
            .await
            .map_err(|e| ApiError::from_store("list sessions", e))?;
        // A full page has a next one only if a session follows it (asked for separately: the
        // store's pages are at most the API's largest `limit`).
        let next = match page.last() {
            Some(last) if page.len() == limit => {
                let after = self
                    .store
                    .page_sessions(&filter, Some(last.id.as_str()), 1)
                    .await
                    .map_err(|e| ApiError::from_store("list sessions", e))?;
                (!after.is_empty()).then(|| last.id.clone())
            }
            _ => None,
        };
        Ok(SessionList {
            sessions: page
                .into_iter()
                .map(|s| SessionSummary {
                    id: public_id(&s.id).to_owned(),
                    tenant_id: s.tenant_id,
                    agent_id: s.agent_id,
                    owner_user_id: s.owner_user_id,
                    status: Status::of(s.status),
                    active_turn_id: s.active_turn_id,
                })
                .collect(),
            next,
            counts: by_status,
        })
    }

    /// Erases a session and everything stored for it (refused while a turn is in progress
    /// unless `cancel`), and logs the erasure with who asked.
    pub async fn erase_session(
        &self,
        caller: &Caller,
        asked: Option<&str>,
        id: &str,
        cancel: bool,
    ) -> Result<(), ApiError> {
        let session = self
            .visible_session(caller.application()?, asked, id)
            .await?;
        let erased = self
            .store
            .erase_session(&session.id, cancel)
            .await
            .map_err(|e| match e {
                StoreError::Conflict { .. } => ApiError::Conflict(
                    "a turn is in progress: cancel it first, or pass cancel=true".to_owned(),
                ),
                StoreError::NotFound { .. } => ApiError::NotFound("session not found".to_owned()),
                other => ApiError::from_store("erase session", other),
            })?;
        tracing::info!(
            target: "corral::operator",
            tenant = %erased.tenant_id,
            session = %public_id(&erased.id),
            status = %erased.status.as_str(),
            erased_by = %caller.name().unwrap_or_default(),
            "session erased with everything stored for it"
        );
        Ok(())
    }

    /// The session's full view.
    pub async fn view(&self, session: Session) -> Result<SessionView, ApiError> {
        let mut filter = ActionFilter::default();
        filter.session_id = Some(session.id.clone());
        filter.statuses = vec![
            ActionStatus::Pending,
            ActionStatus::Claimed,
            ActionStatus::Uncertain,
        ];
        let actions = self
            .store
            .list_actions(&filter)
            .await
            .map_err(|e| ApiError::from_store("list actions", e))?;
        let uncertain = self
            .store
            .list_effects(&session.id, Some(EffectStatus::Uncertain))
            .await
            .map_err(|e| ApiError::from_store("list effects", e))?;
        let server = session.state.get("server");
        let field = |name: &str| {
            server
                .and_then(|s| s.get(name))
                .cloned()
                .unwrap_or(Value::Null)
        };
        Ok(SessionView {
            waits: field("waits"),
            error: field("error"),
            id: public_id(&session.id).to_owned(),
            tenant_id: session.tenant_id,
            agent_id: session.agent_id,
            owner_user_id: session.owner_user_id,
            manifest_hash: session.manifest_hash,
            implementation_version: session.implementation_version,
            status: Status::of(session.status),
            active_turn_id: session.active_turn_id,
            actions: actions.into_iter().map(action_view).collect(),
            last_decision: session
                .state
                .get("lastDecision")
                .cloned()
                .unwrap_or(Value::Null),
            uncertain_effects: uncertain
                .into_iter()
                .map(|e| UncertainEffect {
                    effect_id: e.effect_id,
                    turn_id: e.turn_id,
                    kind: e.kind.as_str().to_owned(),
                    error: e.error,
                })
                .collect(),
        })
    }

    /// Up to `limit` events after `cursor`.
    pub async fn events_after(
        &self,
        session_id: &str,
        cursor: u64,
        limit: usize,
    ) -> Result<Vec<EventView>, ApiError> {
        let events = self
            .store
            .list_events(session_id, cursor, limit)
            .await
            .map_err(|e| ApiError::from_store("list events", e))?;
        Ok(events.into_iter().map(event_view).collect())
    }

    // ---- commands ----

    /// Runs one command; the answer is the command's first response.
    pub async fn command(
        &self,
        caller: &Caller,
        asked: Option<&str>,
        session_id: &str,
        command: Command,
        raw: Value,
    ) -> Result<Value, ApiError> {
        let result = self
            .command_inner(caller, asked, session_id, &command, raw)
            .await;
        match &result {
            // Counted where the session's tenant is known (`command_inner`).
            Ok(_) => {}
            Err(_) => self.metrics.command_rejected(),
        }
        result
    }

    /// Authenticates, turns the wire command into the store's, and runs it as one store
    /// transaction: the state machine's rules live in the store.
    async fn command_inner(
        &self,
        caller: &Caller,
        asked: Option<&str>,
        path_id: &str,
        command: &Command,
        mut raw: Value,
    ) -> Result<Value, ApiError> {
        // Executors may only report action results; applications anything else. The session's
        // store key comes from the action for an executor (it is in no tenant), from the
        // addressed tenant for an application.
        let (session_id, decided_by) = match command {
            Command::ActionResult { action_id, .. } => {
                caller.executor()?;
                let action = self
                    .store
                    .get_action(action_id)
                    .await
                    .map_err(|e| ApiError::from_store("get action", e))?;
                if public_id(&action.session_id) != path_id {
                    return Err(ApiError::NotFound(
                        "action not found in this session".to_owned(),
                    ));
                }
                (action.session_id, None)
            }
            _ => {
                let tenant = caller.application()?;
                if matches!(command, Command::Resolve { .. }) && !caller.may(|g| g.resolve) {
                    return Err(ApiError::Forbidden(
                        "resolve is an operator's act: this tenant token is not granted canResolve"
                            .to_owned(),
                    ));
                }
                let decided_by = caller.name().unwrap_or_default().to_owned();
                let key = match addressed_tenant(tenant, asked) {
                    Ok(tenant) => session_key(&tenant, path_id),
                    Err(error) => return Err(error),
                };
                (key, Some(decided_by))
            }
        };
        if let Some(object) = raw.as_object_mut() {
            object.remove("requestId");
        }
        let kind = match command {
            Command::Message { content, .. } => CommandKind::Message {
                turn_id: uuid::Uuid::new_v4().to_string(),
                content: content.clone(),
            },
            Command::Approve {
                interaction_id,
                approved,
                reason,
                ..
            } => CommandKind::Approve {
                interaction_id: interaction_id.clone(),
                approved: *approved,
                reason: reason.clone(),
            },
            Command::Respond {
                interaction_id,
                value,
                ..
            } => CommandKind::Respond {
                interaction_id: interaction_id.clone(),
                value: value.clone(),
            },
            Command::Cancel { reason, .. } => CommandKind::Cancel {
                reason: reason.clone(),
            },
            Command::ActionResult {
                action_id,
                claim_id,
                generation,
                outcome,
                ..
            } => CommandKind::ActionResult {
                action_id: action_id.clone(),
                claim_id: claim_id.clone(),
                generation: *generation,
                outcome: outcome.to_value(),
                scope: Some(caller.executor()?.clone()),
            },
            Command::Resolve {
                effect_id,
                retry,
                outcome,
                ..
            } => CommandKind::Resolve {
                effect_id: effect_id.clone(),
                resolution: match (retry, outcome) {
                    (Some(true), None) => Resolution::Retry,
                    (None, Some(outcome)) => Resolution::Complete(outcome.to_value()),
                    _ => {
                        return Err(ApiError::InvalidRequest(
                            "resolve takes either \"retry\": true or an \"outcome\"".to_owned(),
                        ));
                    }
                },
            },
        };
        let mut store_command =
            SessionCommand::new(session_id, command.idempotency_key(), raw, kind);
        store_command.request_id = command.request_id().map(str::to_owned);
        store_command.decided_by = decided_by;
        // The request's span (the command's HTTP server span): a new turn's segments join its
        // trace.
        store_command.trace_context = corral_telemetry::current_traceparent();
        let session_id = store_command.session_id.clone();
        let receipt = self
            .timed(self.store.run_command(store_command))
            .await
            .map_err(|error| match error {
                StoreError::NotFound {
                    entity: Entity::Session,
                    ..
                } => ApiError::NotFound("session not found".to_owned()),
                StoreError::NotFound { entity, .. } => {
                    ApiError::NotFound(format!("{entity} not found in this session"))
                }
                StoreError::Forbidden { reason } => ApiError::Forbidden(reason),
                other => ApiError::from_store("run command", other),
            })?;
        let tenant = session_id.split_once('/').map_or("", |(tenant, _)| tenant);
        self.metrics.command(tenant, command.kind());
        if !receipt.replayed {
            self.metrics.effects("uncertain", receipt.effects_uncertain);
            match command {
                Command::Cancel { .. } => {
                    if let Some(token) = self.running_token(&session_id) {
                        token.cancel();
                    }
                }
                _ => self.wake.notify_one(),
            }
        }
        Ok(receipt.response)
    }

    pub(crate) fn running_token(&self, session_id: &str) -> Option<CancellationToken> {
        self.running
            .lock()
            .ok()
            .and_then(|running| running.get(session_id).cloned())
    }
}

/// The wire view of an action.
pub fn action_view(a: corral_store::Action) -> ActionView {
    ActionView {
        action_id: a.action_id,
        tenant_id: tenant_of(&a.session_id).to_owned(),
        session_id: public_id(&a.session_id).to_owned(),
        turn_id: a.turn_id,
        agent_id: a.agent_id,
        manifest_hash: a.manifest_hash,
        implementation_version: a.implementation_version,
        capability_id: a.capability_id,
        traceparent: trace_field(&a.request, corral_telemetry::TRACEPARENT),
        tracestate: trace_field(&a.request, corral_telemetry::TRACESTATE),
        request: a.request,
        status: a.status.as_str().to_owned(),
        generation: a.generation,
        claim_id: a.claim_id,
        lease_expires_at: a.lease_expires_at.map(rfc3339),
    }
}

/// A W3C trace context field the chat runtime put in an action's request.
fn trace_field(request: &Value, name: &str) -> Option<String> {
    request.get(name).and_then(Value::as_str).map(str::to_owned)
}

/// The wire view of an event.
pub fn event_view(e: Event) -> EventView {
    EventView {
        cursor: e.cursor,
        session_id: public_id(&e.session_id).to_owned(),
        turn_id: e.turn_id,
        event_type: e.event_type,
        data: e.payload,
        time: rfc3339(e.created_at),
    }
}
