//! The server's logic behind the handlers: sessions, commands and their status rules, views.
//! The turn scheduler and the lease sweeper are in [`crate::scheduler`].
//!
//! Every command is one store commit guarded by the session version it was decided on (a
//! concurrent change makes the commit fail and the command is decided again), carrying its
//! idempotency record, so a replay returns the first response byte for byte.
//!
//! The session's `state` holds, under the key `"server"`, what the session view shows beside
//! the store's columns: `{"waits": ..., "error": ...}`. Other keys belong to the turn engine.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use corral_store::{
    ActionFilter, ActionGuard, ActionStatus, ActionTransition, CheckpointWrite, CommitOutcome,
    EffectStatus, EffectTransition, Entity, Event, NewAgent, NewCheckpoint, NewCommand, NewEvent,
    NewSession, Session, SessionCommit, SessionFilter, SessionStatus, Store, StoreError,
};
use serde_json::{Value, json};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::auth::Caller;
use crate::config::Config;
use crate::error::ApiError;
use crate::manifest::{Manifest, manifest_hash};
use crate::metrics::Metrics;
use crate::runner::{Decision, TurnCheckpoint, TurnRunner};
use crate::wire::{
    Accepted, ActionView, AgentPut, AgentView, Command, EventView, Outcome, PutSession,
    SessionSummary, SessionView, Status, UncertainEffect, rfc3339,
};

pub use crate::tenancy::DEFAULT_TENANT;
use crate::tenancy::{addressed_tenant, public_id, session_key};

/// How many times a command is decided again after a concurrent change.
const ATTEMPTS: usize = 16;

/// The shared state of a running server.
#[derive(Debug)]
pub struct Runtime {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) runner: Arc<dyn TurnRunner>,
    config: Config,
    pub(crate) replica_id: String,
    pub(crate) metrics: Arc<Metrics>,
    /// Turn segments running in this process, by session.
    pub(crate) running: Mutex<HashMap<String, CancellationToken>>,
    /// Wakes the scheduler.
    pub(crate) wake: Notify,
    /// Cancelled when the server shuts down.
    pub(crate) shutdown: CancellationToken,
    pub(crate) closing: AtomicBool,
    pub(crate) scheduler_up: AtomicBool,
    /// Turn segments and streams, awaited at shutdown.
    pub(crate) tasks: TaskTracker,
}

/// What a command decided: a commit to make, or an answer without one.
enum Plan {
    Commit(Box<SessionCommit>),
    /// Record the command with this response and change nothing else.
    Record(Value),
}

impl Runtime {
    pub(crate) fn new(
        config: Config,
        store: Arc<dyn Store>,
        runner: Arc<dyn TurnRunner>,
        metrics: Arc<Metrics>,
    ) -> Runtime {
        Runtime {
            store,
            runner,
            config,
            replica_id: format!("replica-{}", uuid::Uuid::new_v4()),
            metrics,
            running: Mutex::new(HashMap::new()),
            wake: Notify::new(),
            shutdown: CancellationToken::new(),
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
        agent_id: &str,
        manifest: &Manifest,
        raw_manifest: Value,
        implementation_version: &str,
    ) -> Result<AgentPut, ApiError> {
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
        let hash = manifest_hash(&raw_manifest);
        let agent = self
            .store
            .put_agent(NewAgent::new(
                agent_id,
                raw_manifest,
                &hash,
                implementation_version,
            ))
            .await
            .map_err(|e| ApiError::from_store("put agent", e))?;
        Ok(AgentPut {
            agent_id: agent.agent_id,
            manifest_hash: agent.manifest_hash,
            implementation_version: agent.implementation_version,
        })
    }

    /// Every agent.
    pub async fn list_agents(&self) -> Result<Vec<AgentView>, ApiError> {
        let agents = self
            .store
            .list_agents()
            .await
            .map_err(|e| ApiError::from_store("list agents", e))?;
        Ok(agents
            .into_iter()
            .map(|a| AgentView {
                agent_id: a.agent_id,
                manifest: a.manifest,
                manifest_hash: a.manifest_hash,
                implementation_version: a.implementation_version,
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

    /// Sessions the tenant may see.
    pub async fn list_sessions(
        &self,
        tenant: Option<&str>,
        asked: Option<&str>,
        agent_id: Option<String>,
    ) -> Result<Vec<SessionSummary>, ApiError> {
        let mut filter = SessionFilter::default();
        // An operator sees every tenant's sessions unless it asks for one.
        filter.tenant_id = match (tenant, asked) {
            (None, None) => None,
            (tenant, asked) => Some(addressed_tenant(tenant, asked)?),
        };
        filter.agent_id = agent_id;
        let sessions = self
            .store
            .list_sessions(&filter)
            .await
            .map_err(|e| ApiError::from_store("list sessions", e))?;
        Ok(sessions
            .into_iter()
            .map(|s| SessionSummary {
                id: public_id(&s.id).to_owned(),
                tenant_id: s.tenant_id,
                agent_id: s.agent_id,
                owner_user_id: s.owner_user_id,
                status: Status::of(s.status),
                active_turn_id: s.active_turn_id,
            })
            .collect())
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
            Ok(_) => self.metrics.command(command.kind()),
            Err(_) => self.metrics.command_rejected(),
        }
        result
    }

    async fn command_inner(
        &self,
        caller: &Caller,
        asked: Option<&str>,
        path_id: &str,
        command: &Command,
        mut raw: Value,
    ) -> Result<Value, ApiError> {
        // Authorization first: executors may only report action results, within their scope.
        // The session's store key comes from the action for an executor (it is in no tenant),
        // from the addressed tenant for an application.
        let session_id = match command {
            Command::ActionResult { action_id, .. } => {
                let scope = caller.executor()?;
                let action = self
                    .store
                    .get_action(action_id)
                    .await
                    .map_err(|e| ApiError::from_store("get action", e))?;
                if action.agent_id != scope.agent_id
                    || action.manifest_hash != scope.manifest_hash
                    || action.implementation_version != scope.implementation_version
                {
                    return Err(ApiError::Forbidden(
                        "the action is outside the executor token's scope".to_owned(),
                    ));
                }
                if public_id(&action.session_id) != path_id {
                    return Err(ApiError::NotFound(
                        "action not found in this session".to_owned(),
                    ));
                }
                action.session_id
            }
            _ => {
                let tenant = caller.application()?;
                self.visible_session(tenant, asked, path_id).await?.id
            }
        };
        let session_id = session_id.as_str();
        if command.idempotency_key().is_empty() {
            return Err(ApiError::InvalidRequest(
                "idempotencyKey must not be empty".to_owned(),
            ));
        }
        if let Some(object) = raw.as_object_mut() {
            object.remove("requestId");
        }
        let semantic = raw;
        let key = command.idempotency_key();
        for attempt in 0..ATTEMPTS {
            if let Some(record) = self
                .store
                .get_command(session_id, key)
                .await
                .map_err(|e| ApiError::from_store("get command", e))?
            {
                return replay(record.command == semantic, record.response);
            }
            let session = self
                .timed(self.store.get_session(session_id))
                .await
                .map_err(|e| ApiError::from_store("get session", e))?;
            let plan = self.plan(&session, command).await?;
            let (mut commit, recorded) = match plan {
                Plan::Record(response) => (SessionCommit::new(session_id), Some(response)),
                Plan::Commit(commit) => (*commit, None),
            };
            let accepted = serde_json::to_value(Accepted {
                status: "accepted".to_owned(),
                turn_id: match command {
                    Command::Message { .. } => commit.patch.active_turn_id.clone().flatten(),
                    _ => session.active_turn_id.clone(),
                },
                cursor: session.last_cursor + commit.events.len() as u64,
                request_id: command.request_id().map(str::to_owned),
            })
            .map_err(|e| ApiError::internal("encode response", e))?;
            let response = recorded.unwrap_or(accepted);
            commit.expect_version = Some(session.version);
            commit.command = Some(NewCommand::new(key, semantic.clone(), response));
            let effects_uncertain = commit
                .effects
                .iter()
                .filter(|t| t.to == EffectStatus::Uncertain)
                .count();
            match self.timed(self.store.commit(commit)).await {
                Ok(CommitOutcome::Applied(receipt)) => {
                    self.metrics.effects("uncertain", effects_uncertain);
                    self.after_command(command, session_id);
                    let record = receipt
                        .command
                        .ok_or_else(|| ApiError::internal("commit command", "no record"))?;
                    return Ok(record.response);
                }
                Ok(CommitOutcome::Replayed(record)) => return Ok(record.response),
                Ok(_) => return Err(ApiError::internal("commit command", "unknown outcome")),
                Err(StoreError::Conflict {
                    entity: Entity::Command,
                    ..
                }) => return replay(false, Value::Null),
                Err(StoreError::Conflict { .. }) if attempt + 1 < ATTEMPTS => continue,
                Err(error) => return Err(ApiError::from_store("commit command", error)),
            }
        }
        Err(ApiError::Conflict(
            "the session kept changing; try the command again".to_owned(),
        ))
    }

    fn after_command(&self, command: &Command, session_id: &str) {
        match command {
            Command::Cancel { .. } => {
                if let Some(token) = self.running_token(session_id) {
                    token.cancel();
                }
            }
            _ => self.wake.notify_one(),
        }
    }

    pub(crate) fn running_token(&self, session_id: &str) -> Option<CancellationToken> {
        self.running
            .lock()
            .ok()
            .and_then(|running| running.get(session_id).cloned())
    }

    async fn plan(&self, session: &Session, command: &Command) -> Result<Plan, ApiError> {
        match command {
            Command::Message { content, .. } => plan_message(session, content),
            Command::Approve {
                interaction_id,
                approved,
                reason,
                ..
            } => {
                let decision = Decision {
                    approved: *approved,
                    reason: reason.clone(),
                    value: None,
                };
                let data = json!({"interactionId": interaction_id, "approved": approved, "reason": reason});
                self.plan_decision(
                    session,
                    interaction_id,
                    "approval",
                    "command.approve",
                    decision,
                    data,
                )
                .await
            }
            Command::Respond {
                interaction_id,
                value,
                ..
            } => {
                let decision = Decision {
                    approved: true,
                    reason: None,
                    value: Some(value.clone()),
                };
                let data = json!({"interactionId": interaction_id, "value": value});
                self.plan_decision(
                    session,
                    interaction_id,
                    "input",
                    "command.respond",
                    decision,
                    data,
                )
                .await
            }
            Command::Cancel { reason, .. } => self.plan_cancel(session, reason.as_deref()).await,
            Command::ActionResult {
                action_id,
                claim_id,
                generation,
                outcome,
                request_id,
                ..
            } => {
                self.plan_action_result(
                    session,
                    action_id,
                    claim_id,
                    *generation,
                    &outcome.to_value(),
                    request_id,
                )
                .await
            }
            Command::Resolve {
                effect_id,
                retry,
                outcome,
                ..
            } => {
                let outcome = outcome.as_ref().map(Outcome::to_value);
                self.plan_resolve(session, effect_id, *retry, outcome.as_ref())
                    .await
            }
        }
    }

    async fn plan_decision(
        &self,
        session: &Session,
        interaction_id: &str,
        kind: &str,
        event_type: &str,
        decision: Decision,
        data: Value,
    ) -> Result<Plan, ApiError> {
        let not_awaiting = || {
            ApiError::Conflict(format!(
                "the session is not paused on {kind} interaction {interaction_id:?}"
            ))
        };
        let Some(turn_id) = session.active_turn_id.clone() else {
            return Err(not_awaiting());
        };
        if session.status != SessionStatus::Paused {
            return Err(not_awaiting());
        }
        let live = self
            .store
            .live_checkpoint(&session.id)
            .await
            .map_err(|e| ApiError::from_store("read checkpoint", e))?
            .filter(|c| c.turn_id == turn_id)
            .ok_or_else(not_awaiting)?;
        let mut checkpoint: TurnCheckpoint = serde_json::from_value(live.data)
            .map_err(|e| ApiError::internal("decode checkpoint", e))?;
        if !checkpoint
            .pending
            .iter()
            .any(|i| i.interaction_id == interaction_id && i.kind == kind)
        {
            return Err(not_awaiting());
        }
        checkpoint.pending.clear();
        checkpoint
            .decisions
            .insert(interaction_id.to_owned(), decision);
        let data_cp = serde_json::to_value(&checkpoint)
            .map_err(|e| ApiError::internal("encode checkpoint", e))?;
        let mut commit = SessionCommit::new(&session.id);
        commit.patch.status = Some(SessionStatus::Runnable);
        commit.patch.state = Some(server_state(&session.state, Value::Null, Value::Null));
        commit.checkpoint = Some(CheckpointWrite::Put(NewCheckpoint::new(
            &turn_id,
            live.segment + 1,
            data_cp,
        )));
        commit
            .events
            .push(NewEvent::new(event_type, data).in_turn(&turn_id));
        Ok(Plan::Commit(Box::new(commit)))
    }

    async fn plan_cancel(&self, session: &Session, reason: Option<&str>) -> Result<Plan, ApiError> {
        let mut commit = SessionCommit::new(&session.id);
        if let Some(turn_id) = &session.active_turn_id {
            let mut touched = BTreeSet::new();
            let mut filter = ActionFilter::default();
            filter.session_id = Some(session.id.clone());
            filter.statuses = vec![ActionStatus::Pending, ActionStatus::Claimed];
            let actions = self
                .store
                .list_actions(&filter)
                .await
                .map_err(|e| ApiError::from_store("list actions", e))?;
            for action in actions.iter().filter(|a| &a.turn_id == turn_id) {
                let (to, effect_to) = if action.status == ActionStatus::Claimed {
                    // Claimed work may already have happened: keep it for reconciliation.
                    (ActionStatus::Uncertain, EffectStatus::Uncertain)
                } else {
                    (ActionStatus::Cancelled, EffectStatus::Cancelled)
                };
                commit.actions.push(ActionTransition::new(
                    &action.action_id,
                    ActionGuard::Status(vec![action.status]),
                    to,
                ));
                let mut transition = EffectTransition::new(
                    &action.action_id,
                    &[EffectStatus::Pending, EffectStatus::Invoking],
                    effect_to,
                );
                if effect_to == EffectStatus::Uncertain {
                    transition = transition
                        .with_error("the turn was cancelled while an executor held the action");
                }
                commit.effects.push(transition);
                touched.insert(action.action_id.clone());
            }
            let invoking = self
                .store
                .list_effects(&session.id, Some(EffectStatus::Invoking))
                .await
                .map_err(|e| ApiError::from_store("list effects", e))?;
            for effect in invoking
                .iter()
                .filter(|e| &e.turn_id == turn_id && !touched.contains(&e.effect_id))
            {
                commit.effects.push(
                    EffectTransition::new(
                        &effect.effect_id,
                        &[EffectStatus::Invoking],
                        EffectStatus::Uncertain,
                    )
                    .with_error("the turn was cancelled before the effect's outcome was recorded"),
                );
            }
        }
        let mut event = NewEvent::new("turn.cancelled", json!({"reason": reason}));
        if let Some(turn_id) = &session.active_turn_id {
            event = event.in_turn(turn_id);
        }
        commit.events.push(event);
        commit.patch.status = Some(SessionStatus::Cancelled);
        commit.patch.active_turn_id = Some(None);
        commit.patch.state = Some(server_state(&session.state, Value::Null, Value::Null));
        commit.checkpoint = Some(CheckpointWrite::Clear);
        Ok(Plan::Commit(Box::new(commit)))
    }

    async fn plan_action_result(
        &self,
        session: &Session,
        action_id: &str,
        claim_id: &str,
        generation: u64,
        outcome: &Value,
        request_id: &Option<String>,
    ) -> Result<Plan, ApiError> {
        let action = self
            .store
            .get_action(action_id)
            .await
            .map_err(|e| ApiError::from_store("get action", e))?;
        if action.status == ActionStatus::Completed {
            let prior = action.result.clone().unwrap_or(Value::Null);
            let same = prior.get("claimId").and_then(Value::as_str) == Some(claim_id)
                && prior.get("generation").and_then(Value::as_u64) == Some(generation)
                && prior.get("outcome") == Some(outcome);
            let receipt = prior.get("receipt").cloned();
            return match (same, receipt) {
                // The same result again gets the first receipt (recorded under this key too).
                (true, Some(receipt)) => Ok(Plan::Record(receipt)),
                _ => Err(ApiError::Conflict(
                    "the action already has a different result".to_owned(),
                )),
            };
        }
        if session.status == SessionStatus::Cancelled
            || session.active_turn_id.as_deref() != Some(action.turn_id.as_str())
        {
            return Err(ApiError::Conflict(
                "the action's turn is no longer active (cancelled or superseded)".to_owned(),
            ));
        }
        if action.status != ActionStatus::Claimed
            || action.claim_id.as_deref() != Some(claim_id)
            || action.generation != generation
        {
            return Err(ApiError::Conflict(
                "the claim is stale, expired or superseded".to_owned(),
            ));
        }
        let cursor = session.last_cursor + 1;
        let receipt = serde_json::to_value(Accepted {
            status: "accepted".to_owned(),
            turn_id: Some(action.turn_id.clone()),
            cursor,
            request_id: request_id.clone(),
        })
        .map_err(|e| ApiError::internal("encode receipt", e))?;
        let mut commit = SessionCommit::new(&session.id);
        commit.actions.push(
            ActionTransition::new(
                action_id,
                ActionGuard::Claim {
                    claim_id: claim_id.to_owned(),
                    generation,
                },
                ActionStatus::Completed,
            )
            .with_result(json!({
                "claimId": claim_id, "generation": generation, "outcome": outcome, "receipt": receipt,
            })),
        );
        commit.effects.push(
            EffectTransition::new(
                action_id,
                &[EffectStatus::Pending, EffectStatus::Invoking],
                EffectStatus::Completed,
            )
            .with_result(outcome.clone()),
        );
        if matches!(
            session.status,
            SessionStatus::Waiting | SessionStatus::Running | SessionStatus::Runnable
        ) {
            // A result landing while the segment still runs leaves the runnable marker: the
            // segment's own end keeps it and the turn runs again.
            commit.patch.status = Some(SessionStatus::Runnable);
            commit.patch.state = Some(server_state(&session.state, Value::Null, Value::Null));
        }
        commit.events.push(
            NewEvent::new(
                "action.completed",
                json!({"actionId": action_id, "capabilityId": action.capability_id, "result": outcome}),
            )
            .in_turn(&action.turn_id),
        );
        Ok(Plan::Commit(Box::new(commit)))
    }

    async fn plan_resolve(
        &self,
        session: &Session,
        effect_id: &str,
        retry: Option<bool>,
        outcome: Option<&Value>,
    ) -> Result<Plan, ApiError> {
        let retry = match (retry, outcome) {
            (Some(true), None) => true,
            (None, Some(_)) => false,
            _ => {
                return Err(ApiError::InvalidRequest(
                    "resolve takes either \"retry\": true or an \"outcome\"".to_owned(),
                ));
            }
        };
        let effect = match self.store.get_effect(effect_id).await {
            Ok(effect) if effect.session_id == session.id => effect,
            Ok(_) | Err(StoreError::NotFound { .. }) => {
                return Err(ApiError::NotFound(
                    "effect not found in this session".to_owned(),
                ));
            }
            Err(e) => return Err(ApiError::from_store("get effect", e)),
        };
        if effect.status != EffectStatus::Uncertain {
            return Err(ApiError::Conflict(format!(
                "the effect is {}, not uncertain",
                effect.status
            )));
        }
        if session.status == SessionStatus::Cancelled
            || session.active_turn_id.as_deref() != Some(effect.turn_id.as_str())
        {
            return Err(ApiError::Conflict(
                "the effect's turn is no longer active".to_owned(),
            ));
        }
        let action = match self.store.get_action(effect_id).await {
            Ok(action) => Some(action),
            Err(StoreError::NotFound { .. }) => None,
            Err(e) => return Err(ApiError::from_store("get action", e)),
        };
        let mut commit = SessionCommit::new(&session.id);
        if retry {
            commit.effects.push(EffectTransition::new(
                effect_id,
                &[EffectStatus::Uncertain],
                EffectStatus::Pending,
            ));
            if let Some(action) = &action {
                commit.actions.push(ActionTransition::new(
                    &action.action_id,
                    ActionGuard::Status(vec![ActionStatus::Uncertain]),
                    ActionStatus::Pending,
                ));
            }
        } else {
            let outcome = outcome.cloned().unwrap_or(Value::Null);
            commit.effects.push(
                EffectTransition::new(
                    effect_id,
                    &[EffectStatus::Uncertain],
                    EffectStatus::Completed,
                )
                .with_result(outcome.clone()),
            );
            if let Some(action) = &action {
                commit.actions.push(
                    ActionTransition::new(
                        &action.action_id,
                        ActionGuard::Status(vec![ActionStatus::Uncertain]),
                        ActionStatus::Completed,
                    )
                    .with_result(json!({"outcome": outcome, "resolvedBy": "operator"})),
                );
            }
        }
        let others = self
            .store
            .list_effects(&session.id, Some(EffectStatus::Uncertain))
            .await
            .map_err(|e| ApiError::from_store("list effects", e))?
            .into_iter()
            .filter(|e| e.effect_id != effect_id && e.turn_id == effect.turn_id)
            .count();
        if others == 0 && session.status == SessionStatus::Uncertain {
            commit.patch.status = Some(SessionStatus::Runnable);
            commit.patch.state = Some(server_state(&session.state, Value::Null, Value::Null));
        }
        let mut data = json!({"effectId": effect_id, "retry": retry});
        if let Some(outcome) = outcome {
            data["outcome"] = outcome.clone();
        }
        commit
            .events
            .push(NewEvent::new("effect.resolved", data).in_turn(&effect.turn_id));
        Ok(Plan::Commit(Box::new(commit)))
    }
}

fn replay(same: bool, response: Value) -> Result<Value, ApiError> {
    if same {
        Ok(response)
    } else {
        Err(ApiError::Conflict(
            "the idempotency key is already bound to a different command".to_owned(),
        ))
    }
}

fn plan_message(session: &Session, content: &str) -> Result<Plan, ApiError> {
    if !matches!(
        session.status,
        SessionStatus::Idle
            | SessionStatus::Completed
            | SessionStatus::Failed
            | SessionStatus::Cancelled
    ) {
        return Err(ApiError::Conflict(format!(
            "the session is {} with unresolved work; a message needs it idle, completed, failed or cancelled",
            Status::of(session.status).as_str()
        )));
    }
    let turn_id = uuid::Uuid::new_v4().to_string();
    let checkpoint = serde_json::to_value(TurnCheckpoint::new_turn(&turn_id, content))
        .map_err(|e| ApiError::internal("encode checkpoint", e))?;
    let mut commit = SessionCommit::new(&session.id);
    commit.patch.status = Some(SessionStatus::Runnable);
    commit.patch.active_turn_id = Some(Some(turn_id.clone()));
    commit.patch.state = Some(server_state(&session.state, Value::Null, Value::Null));
    commit.checkpoint = Some(CheckpointWrite::Put(NewCheckpoint::new(
        &turn_id, 0, checkpoint,
    )));
    commit
        .events
        .push(NewEvent::new("command.message", json!({"content": content})).in_turn(&turn_id));
    Ok(Plan::Commit(Box::new(commit)))
}

impl Status {
    /// The text on the wire.
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
}

/// `state` with the server's part replaced.
pub(crate) fn server_state(state: &Value, waits: Value, error: Value) -> Value {
    let mut object = state.as_object().cloned().unwrap_or_default();
    object.insert("server".to_owned(), json!({"waits": waits, "error": error}));
    Value::Object(object)
}

/// The wire view of an action.
pub fn action_view(a: corral_store::Action) -> ActionView {
    ActionView {
        action_id: a.action_id,
        session_id: public_id(&a.session_id).to_owned(),
        turn_id: a.turn_id,
        agent_id: a.agent_id,
        manifest_hash: a.manifest_hash,
        implementation_version: a.implementation_version,
        capability_id: a.capability_id,
        request: a.request,
        status: a.status.as_str().to_owned(),
        generation: a.generation,
        claim_id: a.claim_id,
        lease_expires_at: a.lease_expires_at.map(rfc3339),
    }
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
