//! The session state machine: every command and every turn-segment transition of `corral
//! serve`, each one transaction with its rules written here once.
//!
//! - [`run_command`]: `message`, `approve`, `respond`, `cancel`, `action_result` and `resolve`.
//!   The idempotency record, the guarded transition, the checkpoint and the events commit
//!   together; a replayed key answers the first response byte for byte.
//! - [`start_segment`]: the scheduler's claim of a runnable session under a lease, the recovery
//!   of what a previous holder left in flight, and the mark `running`, returning the checkpoint.
//! - [`finish_segment`]: a segment's outcome, its events and the release of the lease.
//!
//! The session's `state` holds, under the key `"server"`, what its view shows beside the
//! columns: `{"waits": ..., "error": ...}` (see [`server_state`]).

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::{Value, json};

use crate::checkpoint::{Decision, TurnCheckpoint};
use crate::engine::{self, Tx, settled, turn_active};
use crate::error::{Entity, StoreError};
use crate::model::{
    Action, ActionGuard, ActionStatus, ActionTransition, CheckpointWrite, CommandRecord,
    CommitOutcome, EffectStatus, EffectTransition, ExecutorScope, Fence, Lease, NewCheckpoint,
    NewCommand, NewEvent, NewItem, Resolution, Session, SessionCommit, SessionStatus, Timestamp,
    TurnEffects,
};
use crate::tx::{EffectsIn, Found, Reads};

/// One command on a session, as an application or an executor sent it.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct SessionCommand {
    /// The session's store key.
    pub session_id: String,
    /// Same key and same `body`: the first response again; same key, other body: a conflict.
    pub idempotency_key: String,
    /// The command as compared on a replay (without its request id).
    pub body: Value,
    /// Echoed in the response of the first submission.
    pub request_id: Option<String>,
    /// Who decided (the configured name of the caller's token), recorded in the events of the
    /// commands that decide: `approve`, `respond`, `cancel`, `resolve`.
    pub decided_by: Option<String>,
    /// The W3C `traceparent` of the request that sent the command, if it was traced; a
    /// `message` keeps it in its turn's checkpoint (see [`TurnCheckpoint::trace_context`]).
    pub trace_context: Option<String>,
    /// What to do.
    pub kind: CommandKind,
}

impl SessionCommand {
    /// Command `kind` on `session_id` under `idempotency_key`, compared on replay as `body`.
    pub fn new(
        session_id: impl Into<String>,
        idempotency_key: impl Into<String>,
        body: Value,
        kind: CommandKind,
    ) -> Self {
        Self {
            session_id: session_id.into(),
            idempotency_key: idempotency_key.into(),
            body,
            request_id: None,
            decided_by: None,
            trace_context: None,
            kind,
        }
    }
}

/// The commands, with their arguments.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum CommandKind {
    /// Starts turn `turn_id` with a user message (the session must be settled: idle,
    /// completed, failed or cancelled).
    Message {
        /// The new turn's id (chosen by the caller, unique).
        turn_id: String,
        /// The user's message.
        content: String,
    },
    /// Decides an `approval` interaction the turn is paused on.
    Approve {
        /// The interaction.
        interaction_id: String,
        /// The decision.
        approved: bool,
        /// Why.
        reason: Option<String>,
    },
    /// Answers an `input` interaction the turn is paused on.
    Respond {
        /// The interaction.
        interaction_id: String,
        /// The answer.
        value: Value,
    },
    /// Cancels the active turn.
    Cancel {
        /// Why.
        reason: Option<String>,
    },
    /// An executor's outcome for an action it claimed.
    ActionResult {
        /// The action.
        action_id: String,
        /// The claim.
        claim_id: String,
        /// The claim's generation.
        generation: u64,
        /// `{"value": ...}` or `{"error": "..."}`.
        outcome: Value,
        /// The executor token's scope; an action outside it is [`StoreError::Forbidden`].
        scope: Option<ExecutorScope>,
    },
    /// An operator settles an uncertain effect.
    Resolve {
        /// The effect.
        effect_id: String,
        /// Retry it, or complete it with an outcome.
        resolution: Resolution,
    },
}

impl CommandKind {
    /// The command's wire name.
    pub fn name(&self) -> &'static str {
        match self {
            CommandKind::Message { .. } => "message",
            CommandKind::Approve { .. } => "approve",
            CommandKind::Respond { .. } => "respond",
            CommandKind::Cancel { .. } => "cancel",
            CommandKind::ActionResult { .. } => "action_result",
            CommandKind::Resolve { .. } => "resolve",
        }
    }
}

/// What a command did.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct CommandReceipt {
    /// The response of the command's first submission:
    /// `{"status": "accepted", "turnId", "cursor", "requestId"}`.
    pub response: Value,
    /// Whether this was a replay (nothing was written).
    pub replayed: bool,
    /// Effects the command made uncertain (a cancel while work was in flight).
    pub effects_uncertain: usize,
}

/// A turn segment the scheduler may run: the lease it runs under and its checkpoint.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Segment {
    /// The lease; every write of the segment carries its fence.
    pub lease: Lease,
    /// The session as marked running.
    pub session: Session,
    /// The active turn.
    pub turn_id: String,
    /// The live checkpoint's segment number.
    pub segment: u64,
    /// The live checkpoint.
    pub checkpoint: TurnCheckpoint,
    /// The turn's journal, read under the new lease ([`crate::Store::turn_effects`]).
    pub journal: TurnEffects,
    /// Effects a previous holder left in flight, now uncertain.
    pub effects_uncertain: usize,
    /// Whether another session was claimable when this one was claimed: if not, a scheduler
    /// has nothing more to claim until something wakes it.
    pub others_claimable: bool,
}

/// What [`crate::Store::start_segment`] found.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum SegmentStart {
    /// Nothing is runnable.
    Idle,
    /// A session was claimed but has nothing to run (its turn failed for want of a readable
    /// checkpoint, or a previous holder's in-flight effects made it uncertain); its lease is
    /// released. Look again if `others_claimable`.
    Settled {
        /// The session.
        session_id: String,
        /// Effects a previous holder left in flight, now uncertain.
        effects_uncertain: usize,
        /// Whether another session was claimable when this one was claimed.
        others_claimable: bool,
    },
    /// A segment to run.
    Run(Box<Segment>),
}

/// How a segment ended.
#[derive(Clone, Debug, PartialEq)]
pub enum SegmentOutcome {
    /// The turn finished: `output` is what `turn.completed` carries; `items` are the
    /// conversation items the turn adds.
    Completed {
        /// What `turn.completed` carries.
        output: Value,
        /// Conversation items to append.
        items: Vec<Value>,
    },
    /// The turn needs a person: the checkpoint (already written by the turn engine under the
    /// fence, before any permission event) lists the pending interactions.
    Paused {
        /// The checkpoint, with `pending` set.
        checkpoint: TurnCheckpoint,
    },
    /// The turn waits for external executors to finish these effects (actions).
    Waiting {
        /// The effects (action ids) waited on.
        effect_ids: Vec<String>,
    },
    /// An effect's outcome is unknown; an operator must `resolve` it.
    Uncertain {
        /// The uncertain effects.
        effect_ids: Vec<String>,
    },
    /// The turn failed; the conversation stays as it was before the turn.
    Failed {
        /// A stable code such as `step_budget_exhausted`, `effect_drift`, `model_error`.
        code: String,
        /// A message safe to show.
        message: String,
    },
    /// The segment stopped without an outcome: the turn was cancelled (the cancel wrote
    /// everything) or the server is shutting down (the session stays runnable).
    Cancelled,
}

/// What [`crate::Store::finish_segment`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SegmentEnd {
    /// The outcome was applied.
    Applied,
    /// Nothing to apply: the turn was cancelled or superseded meanwhile, or the outcome was
    /// [`SegmentOutcome::Cancelled`].
    Unchanged,
    /// The turn waits, but a result arrived while the segment ran: it is runnable again.
    RunAgain,
}

/// `state` with the server's part (`{"waits", "error"}`) replaced.
pub fn server_state(state: &Value, waits: Value, error: Value) -> Value {
    let mut object = state.as_object().cloned().unwrap_or_default();
    object.insert("server".to_owned(), json!({"waits": waits, "error": error}));
    Value::Object(object)
}

fn turn_inactive(entity: Entity, id: &str) -> StoreError {
    StoreError::conflict(
        entity,
        id,
        "its turn is no longer active (cancelled or superseded)",
    )
}

/// The idempotency record that remembers an action's first result, whatever its key.
pub(crate) fn action_result_key(action_id: &str) -> String {
    format!("corral:action-result:{action_id}")
}

pub(crate) async fn run_command<T: Tx>(
    tx: &mut T,
    command: SessionCommand,
) -> Result<CommandReceipt, StoreError> {
    if command.idempotency_key.is_empty() {
        return Err(StoreError::invalid("idempotencyKey", "must not be empty"));
    }
    // The lock comes before the idempotency check, so that two concurrent submissions of one
    // command are serialized and the second one sees the first one's record. What the command
    // reads is read with them, in one flight (the server runs each read after the lock).
    let mut reads = Reads {
        command: Some(command.idempotency_key.as_str()),
        ..Reads::locking(&command.session_id)
    };
    match &command.kind {
        CommandKind::Message { .. } => {}
        CommandKind::Approve { .. } | CommandKind::Respond { .. } => reads.checkpoint = true,
        CommandKind::Cancel { .. } => {
            reads.effects_in = Some(EffectsIn::Invoking(None));
            reads.session_actions = true;
        }
        CommandKind::ActionResult { action_id, .. } => {
            reads.actions = vec![action_id.as_str()];
            reads.effects = vec![action_id.as_str()];
        }
        CommandKind::Resolve { effect_id, .. } => {
            reads.actions = vec![effect_id.as_str()];
            reads.effects = vec![effect_id.as_str()];
            reads.effects_in = Some(EffectsIn::Uncertain);
        }
    }
    let mut found = tx.read(&reads).await?;
    let session = found
        .session
        .take()
        .ok_or_else(|| StoreError::not_found(Entity::Session, &command.session_id))?;
    if let Some(record) = found.command.take() {
        return replay(&command, record);
    }
    let SessionCommand {
        session_id,
        idempotency_key,
        body,
        request_id,
        decided_by,
        trace_context,
        kind,
    } = command;
    let mut turn_id = session.active_turn_id.clone();
    let last_decision = last_decision(&kind, decided_by.as_deref());
    let plan = match kind {
        CommandKind::Message {
            turn_id: new_turn,
            content,
        } => {
            turn_id = Some(new_turn.clone());
            message(&session, &new_turn, &content, trace_context)?
        }
        CommandKind::Approve {
            interaction_id,
            approved,
            reason,
        } => {
            let data = json!({
                "interactionId": interaction_id, "approved": approved, "reason": reason,
                "decidedBy": decided_by,
            });
            let decision = Decision {
                approved,
                reason,
                value: None,
            };
            let event = NewEvent::new("command.approve", data);
            decide(
                &mut found,
                &session,
                &interaction_id,
                "approval",
                decision,
                event,
            )?
        }
        CommandKind::Respond {
            interaction_id,
            value,
        } => {
            let data =
                json!({"interactionId": interaction_id, "value": value, "decidedBy": decided_by});
            let decision = Decision {
                approved: true,
                reason: None,
                value: Some(value),
            };
            let event = NewEvent::new("command.respond", data);
            decide(
                &mut found,
                &session,
                &interaction_id,
                "input",
                decision,
                event,
            )?
        }
        CommandKind::Cancel { reason } => cancel(&mut found, &session, reason, decided_by)?,
        CommandKind::ActionResult {
            action_id,
            claim_id,
            generation,
            outcome,
            scope,
        } => {
            let action = found
                .actions
                .get(&action_id)
                .cloned()
                .flatten()
                .filter(|action| action.session_id == session.id)
                .ok_or_else(|| StoreError::not_found(Entity::Action, &action_id))?;
            if scope
                .as_ref()
                .is_some_and(|scope| !scope.covers(&action, &session.tenant_id))
            {
                return Err(StoreError::Forbidden {
                    reason: "the action is outside the executor token's scope".to_owned(),
                });
            }
            turn_id = Some(action.turn_id.clone());
            match action_result(tx, &session, action, claim_id, generation, outcome).await? {
                Plan::Commit(commit) => Plan::Commit(commit),
                Plan::Replayed(first) => {
                    // The same result under another key: that key answers with the first
                    // receipt too.
                    let now = tx.now().await?;
                    tx.insert_command(&CommandRecord {
                        session_id: session_id.clone(),
                        idempotency_key,
                        command: body,
                        response: first.response.clone(),
                        cursor: first.cursor,
                        created_at: now,
                    })
                    .await?;
                    return Ok(CommandReceipt {
                        response: first.response,
                        replayed: true,
                        effects_uncertain: 0,
                    });
                }
            }
        }
        CommandKind::Resolve {
            effect_id,
            resolution,
        } => resolve(&found, &session, &effect_id, resolution, decided_by)?,
    };
    let Plan::Commit(mut commit) = plan else {
        return Err(StoreError::corrupt(
            Entity::Command,
            &idempotency_key,
            "a replay was planned outside an action result",
        ));
    };
    if let Some(decision) = last_decision {
        let state = commit.patch.state.take().unwrap_or(session.state.clone());
        let mut object = state.as_object().cloned().unwrap_or_default();
        object.insert("lastDecision".to_owned(), decision);
        commit.patch.state = Some(Value::Object(object));
    }
    let response = json!({
        "status": "accepted",
        "turnId": turn_id,
        "cursor": session.last_cursor + commit.events.len() as u64,
        "requestId": request_id,
    });
    let effects_uncertain = commit
        .effects
        .iter()
        .filter(|t| t.to == EffectStatus::Uncertain)
        .count();
    let first_result = match &commit.actions.first() {
        Some(t) if t.to == ActionStatus::Completed && commit.effects.len() == 1 => {
            matches!(t.guard, ActionGuard::Claim { .. }).then(|| t.action_id.clone())
        }
        _ => None,
    };
    commit.command = Some(NewCommand::new(idempotency_key, body, response));
    let outcome = engine::commit_on(tx, Some(session), found, *commit, false, true).await?;
    let CommitOutcome::Applied(receipt) = outcome else {
        return Err(StoreError::corrupt(
            Entity::Command,
            &session_id,
            "a checked command was reported as a replay",
        ));
    };
    let record = receipt.command.ok_or_else(|| {
        StoreError::corrupt(Entity::Command, &session_id, "the command was not recorded")
    })?;
    if let Some(action_id) = first_result {
        let mut first = record.clone();
        first.idempotency_key = action_result_key(&action_id);
        tx.insert_command(&first).await?;
    }
    Ok(CommandReceipt {
        response: record.response,
        replayed: false,
        effects_uncertain,
    })
}

/// What the session view shows of the last decision taken on the session (approve, respond,
/// cancel, resolve) and which token took it, kept in the session's state.
fn last_decision(kind: &CommandKind, decided_by: Option<&str>) -> Option<Value> {
    let by = decided_by?;
    Some(match kind {
        CommandKind::Approve {
            interaction_id,
            approved,
            ..
        } => json!({"command": "approve", "interactionId": interaction_id,
            "approved": approved, "decidedBy": by}),
        CommandKind::Respond { interaction_id, .. } => {
            json!({"command": "respond", "interactionId": interaction_id, "decidedBy": by})
        }
        CommandKind::Cancel { .. } => json!({"command": "cancel", "decidedBy": by}),
        CommandKind::Resolve { effect_id, .. } => {
            json!({"command": "resolve", "effectId": effect_id, "decidedBy": by})
        }
        CommandKind::Message { .. } | CommandKind::ActionResult { .. } => return None,
    })
}

fn replay(command: &SessionCommand, record: CommandRecord) -> Result<CommandReceipt, StoreError> {
    if record.command != command.body {
        return Err(StoreError::conflict(
            Entity::Command,
            &command.idempotency_key,
            "the idempotency key is already bound to a different command",
        ));
    }
    Ok(CommandReceipt {
        response: record.response,
        replayed: true,
        effects_uncertain: 0,
    })
}

enum Plan {
    Commit(Box<SessionCommit>),
    /// The command repeats one already applied under another key: its first record.
    Replayed(CommandRecord),
}

fn message(
    session: &Session,
    turn_id: &str,
    content: &str,
    trace_context: Option<String>,
) -> Result<Plan, StoreError> {
    if !settled(session.status) {
        return Err(StoreError::conflict(
            Entity::Session,
            &session.id,
            format!(
                "the session is {} with unresolved work; a message needs it idle, completed, \
                 failed or cancelled",
                session.status
            ),
        ));
    }
    let mut checkpoint = TurnCheckpoint::new_turn(turn_id, content);
    checkpoint.trace_context = trace_context;
    let checkpoint = encode(&checkpoint, &session.id)?;
    let mut commit = SessionCommit::new(&session.id);
    commit.patch.status = Some(SessionStatus::Runnable);
    commit.patch.active_turn_id = Some(Some(turn_id.to_owned()));
    commit.patch.state = Some(server_state(&session.state, Value::Null, Value::Null));
    commit.checkpoint = Some(CheckpointWrite::Put(NewCheckpoint::new(
        turn_id, 0, checkpoint,
    )));
    commit
        .events
        .push(NewEvent::new("command.message", json!({"content": content})).in_turn(turn_id));
    Ok(Plan::Commit(Box::new(commit)))
}

fn encode(checkpoint: &TurnCheckpoint, session_id: &str) -> Result<Value, StoreError> {
    serde_json::to_value(checkpoint)
        .map_err(|e| StoreError::corrupt(Entity::Checkpoint, session_id, e.to_string()))
}

fn decide(
    found: &mut Found,
    session: &Session,
    interaction_id: &str,
    kind: &str,
    decision: Decision,
    event: NewEvent,
) -> Result<Plan, StoreError> {
    let not_awaiting = || {
        StoreError::conflict(
            Entity::Session,
            &session.id,
            format!("the session is not paused on {kind} interaction {interaction_id:?}"),
        )
    };
    let Some(turn_id) = session.active_turn_id.clone() else {
        return Err(not_awaiting());
    };
    if session.status != SessionStatus::Paused {
        return Err(not_awaiting());
    }
    let live = found
        .checkpoint
        .take()
        .filter(|c| c.turn_id == turn_id)
        .ok_or_else(not_awaiting)?;
    let mut checkpoint: TurnCheckpoint = serde_json::from_value(live.data)
        .map_err(|e| StoreError::corrupt(Entity::Checkpoint, &session.id, e.to_string()))?;
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
    let mut commit = SessionCommit::new(&session.id);
    commit.patch.status = Some(SessionStatus::Runnable);
    commit.patch.state = Some(server_state(&session.state, Value::Null, Value::Null));
    commit.checkpoint = Some(CheckpointWrite::Put(NewCheckpoint::new(
        &turn_id,
        live.segment + 1,
        encode(&checkpoint, &session.id)?,
    )));
    commit.events.push(event.in_turn(turn_id));
    Ok(Plan::Commit(Box::new(commit)))
}

fn cancel(
    found: &mut Found,
    session: &Session,
    reason: Option<String>,
    decided_by: Option<String>,
) -> Result<Plan, StoreError> {
    let mut commit = SessionCommit::new(&session.id);
    if let Some(turn) = &session.active_turn_id {
        let mut touched = BTreeSet::new();
        for action in std::mem::take(&mut found.session_actions) {
            let open = matches!(action.status, ActionStatus::Pending | ActionStatus::Claimed);
            if !open || action.turn_id != *turn {
                continue;
            }
            let (to, effect_to, error) = if action.status == ActionStatus::Claimed {
                // Claimed work may already have had its effect: kept for reconciliation.
                (
                    ActionStatus::Uncertain,
                    EffectStatus::Uncertain,
                    "the turn was cancelled while an executor held the action",
                )
            } else {
                (
                    ActionStatus::Cancelled,
                    EffectStatus::Cancelled,
                    "the turn was cancelled",
                )
            };
            commit.actions.push(ActionTransition::new(
                &action.action_id,
                ActionGuard::Status(vec![action.status]),
                to,
            ));
            commit.effects.push(
                EffectTransition::new(
                    &action.action_id,
                    &[EffectStatus::Pending, EffectStatus::Invoking],
                    effect_to,
                )
                .with_error(error),
            );
            touched.insert(action.action_id.clone());
            // Read already: the commit guards it without reading it again.
            found.actions.insert(action.action_id.clone(), Some(action));
        }
        // The active turn's effects in flight (`EffectsIn::Invoking(None)`).
        for effect in std::mem::take(&mut found.in_status) {
            if !touched.contains(&effect.effect_id) {
                commit.effects.push(
                    EffectTransition::new(
                        &effect.effect_id,
                        &[EffectStatus::Invoking],
                        EffectStatus::Uncertain,
                    )
                    .with_error(CANCELLED_IN_FLIGHT),
                );
            }
        }
    }
    let mut event = NewEvent::new(
        "turn.cancelled",
        json!({"reason": reason, "decidedBy": decided_by}),
    );
    event.turn_id = session.active_turn_id.clone();
    commit.events.push(event);
    commit.patch.status = Some(SessionStatus::Cancelled);
    commit.patch.active_turn_id = Some(None);
    commit.patch.state = Some(server_state(&session.state, Value::Null, Value::Null));
    commit.checkpoint = Some(CheckpointWrite::Clear);
    Ok(Plan::Commit(Box::new(commit)))
}

async fn action_result<T: Tx>(
    tx: &mut T,
    session: &Session,
    action: Action,
    claim_id: String,
    generation: u64,
    outcome: Value,
) -> Result<Plan, StoreError> {
    if action.status == ActionStatus::Completed {
        let prior = action.result.clone().unwrap_or(Value::Null);
        let same = prior.get("claimId").and_then(Value::as_str) == Some(claim_id.as_str())
            && prior.get("generation").and_then(Value::as_u64) == Some(generation)
            && prior.get("outcome") == Some(&outcome);
        let first = tx
            .command(&session.id, &action_result_key(&action.action_id))
            .await?;
        return match (same, first) {
            (true, Some(first)) => Ok(Plan::Replayed(first)),
            _ => Err(StoreError::conflict(
                Entity::Action,
                &action.action_id,
                "the action already has a different result",
            )),
        };
    }
    if !turn_active(session, &action.turn_id) {
        return Err(turn_inactive(Entity::Action, &action.action_id));
    }
    let now = tx.now().await?;
    engine::check_claim(&action, &claim_id, generation, now)?;
    let mut commit = SessionCommit::new(&session.id);
    commit.actions.push(
        ActionTransition::new(
            &action.action_id,
            ActionGuard::Claim {
                claim_id: claim_id.clone(),
                generation,
            },
            ActionStatus::Completed,
        )
        .with_result(json!({"claimId": claim_id, "generation": generation, "outcome": outcome})),
    );
    commit.effects.push(
        EffectTransition::new(
            &action.action_id,
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
        // segment's own end sees it and the turn runs again.
        commit.patch.status = Some(SessionStatus::Runnable);
        commit.patch.state = Some(server_state(&session.state, Value::Null, Value::Null));
    }
    commit.events.push(
        NewEvent::new(
            "action.completed",
            json!({
                "actionId": action.action_id, "capabilityId": action.capability_id,
                "result": outcome,
            }),
        )
        .in_turn(action.turn_id.clone()),
    );
    Ok(Plan::Commit(Box::new(commit)))
}

fn resolve(
    found: &Found,
    session: &Session,
    effect_id: &str,
    resolution: Resolution,
    decided_by: Option<String>,
) -> Result<Plan, StoreError> {
    let effect = found
        .effects
        .get(effect_id)
        .cloned()
        .flatten()
        .filter(|effect| effect.session_id == session.id)
        .ok_or_else(|| StoreError::not_found(Entity::Effect, effect_id))?;
    if effect.status != EffectStatus::Uncertain {
        return Err(StoreError::conflict(
            Entity::Effect,
            effect_id,
            format!("the effect is {}, not uncertain", effect.status),
        ));
    }
    if !turn_active(session, &effect.turn_id) {
        return Err(turn_inactive(Entity::Effect, effect_id));
    }
    let action = found
        .actions
        .get(effect_id)
        .cloned()
        .flatten()
        .filter(|action| action.session_id == session.id);
    let mut commit = SessionCommit::new(&session.id);
    let mut data = json!({"effectId": effect_id, "decidedBy": decided_by});
    match resolution {
        Resolution::Retry => {
            data["retry"] = json!(true);
            commit.effects.push(EffectTransition::new(
                effect_id,
                &[EffectStatus::Uncertain],
                EffectStatus::Pending,
            ));
            if let Some(action) = &action {
                // The claim is cleared; the next claim gets the next generation.
                let mut transition = ActionTransition::new(
                    &action.action_id,
                    ActionGuard::Status(vec![ActionStatus::Uncertain]),
                    ActionStatus::Pending,
                );
                transition.clear_claim = true;
                commit.actions.push(transition);
            }
        }
        Resolution::Complete(outcome) => {
            data["retry"] = json!(false);
            data["outcome"] = outcome.clone();
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
                    .with_result(json!({"outcome": outcome, "resolvedBy": decided_by})),
                );
            }
        }
    }
    // The session goes on once nothing of its active turn is uncertain any more.
    let others_uncertain = found
        .in_status
        .iter()
        .any(|other| other.effect_id != effect_id && other.turn_id == effect.turn_id);
    if session.status == SessionStatus::Uncertain && !others_uncertain {
        commit.patch.status = Some(SessionStatus::Runnable);
        commit.patch.state = Some(server_state(&session.state, Value::Null, Value::Null));
    }
    commit
        .events
        .push(NewEvent::new("effect.resolved", data).in_turn(effect.turn_id));
    Ok(Plan::Commit(Box::new(commit)))
}

/// Why the effects of a segment that stopped mid-way are uncertain.
pub(crate) const TAKEN_OVER: &str =
    "the replica running the turn stopped before the effect's outcome was recorded";

pub(crate) async fn start_segment<T: Tx>(
    tx: &mut T,
    replica_id: &str,
    lease: Duration,
) -> Result<SegmentStart, StoreError> {
    engine::require_replica(replica_id, lease)?;
    let Some((mut session, others_claimable)) = tx.next_claimable_session().await? else {
        return Ok(SegmentStart::Idle);
    };
    let now = tx.now().await?;
    engine::take_ownership(&mut session, replica_id, lease, now);
    let granted = engine::grant(&session)?;
    // The checkpoint to run from and the turn's journal (the run's first read), in one
    // flight. The journal holds what the previous holder left in flight (only the active turn
    // has effects in flight): were any, the session becomes uncertain and nothing runs.
    let reads = Reads {
        session_id: &session.id,
        checkpoint: true,
        turn: session.active_turn_id.as_deref(),
        ..Reads::default()
    };
    let mut found = tx.read(&reads).await?;
    let journal = found.turn.take().unwrap_or_default();
    let in_flight = journal
        .effects
        .iter()
        .filter(|effect| effect.status == EffectStatus::Invoking)
        .cloned()
        .collect();
    // Whatever was in flight when the previous holder stopped may or may not have happened.
    let effects_uncertain =
        engine::mark_uncertain(tx, &mut session, in_flight, TAKEN_OVER, now).await?;
    let mut changed = effects_uncertain > 0;
    let mut run = None;
    if matches!(
        session.status,
        SessionStatus::Runnable | SessionStatus::Running
    ) {
        let failure = match (&session.active_turn_id, found.checkpoint) {
            (Some(turn), Some(live)) if &live.turn_id == turn => {
                match serde_json::from_value::<TurnCheckpoint>(live.data) {
                    Ok(checkpoint) => {
                        run = Some((turn.clone(), live.segment, checkpoint));
                        None
                    }
                    Err(error) => Some((
                        "bad_checkpoint",
                        format!("the turn's checkpoint cannot be read: {error}"),
                    )),
                }
            }
            // Runnable without a turn to run: fail it rather than claim it forever.
            _ => Some((
                "no_checkpoint",
                "the turn has no checkpoint to run from".to_owned(),
            )),
        };
        if let Some((code, message)) = failure {
            fail_turn(tx, &mut session, code, &message, now).await?;
            changed = true;
        }
    }
    let Some((turn_id, segment, checkpoint)) = run else {
        // Nothing to run: the lease is given up in the same transaction.
        session.owner = None;
        write_session(tx, &mut session, changed, now).await?;
        return Ok(SegmentStart::Settled {
            session_id: session.id,
            effects_uncertain,
            others_claimable,
        });
    };
    if session.status != SessionStatus::Running {
        session.status = SessionStatus::Running;
        changed = true;
    }
    write_session(tx, &mut session, changed, now).await?;
    Ok(SegmentStart::Run(Box::new(Segment {
        lease: granted,
        session,
        turn_id,
        segment,
        checkpoint,
        journal,
        effects_uncertain,
        others_claimable,
    })))
}

/// Writes the session row: a data change bumps the version, a change of owner alone does not
/// (a commit prepared before a takeover still fails on the fence rather than the version).
async fn write_session<T: Tx>(
    tx: &mut T,
    session: &mut Session,
    data_changed: bool,
    now: Timestamp,
) -> Result<(), StoreError> {
    if data_changed {
        engine::save_session(tx, session, now).await
    } else {
        tx.update_session(session).await
    }
}

async fn fail_turn<T: Tx>(
    tx: &mut T,
    session: &mut Session,
    code: &str,
    message: &str,
    now: Timestamp,
) -> Result<(), StoreError> {
    let error = json!({"code": code, "message": message});
    let mut event = NewEvent::new("turn.failed", json!({"error": error}));
    event.turn_id = session.active_turn_id.clone();
    session.status = SessionStatus::Failed;
    session.state = server_state(&session.state, Value::Null, error);
    end_turn(tx, session, now).await?;
    let events = engine::append_events(session, vec![event], now);
    engine::insert_events(tx, &events).await
}

/// Why an effect a turn still had in flight when it completed or failed is uncertain.
const ENDED_IN_FLIGHT: &str = "the turn ended before the effect's outcome was recorded";

/// Ends the session's active turn: its checkpoint is superseded, and what it left in flight
/// becomes uncertain, so that only the active turn ever has effects in flight (what a start,
/// a cancel or a recovery marks uncertain is read by the turn).
async fn end_turn<T: Tx>(
    tx: &mut T,
    session: &mut Session,
    now: Timestamp,
) -> Result<(), StoreError> {
    if let Some(turn_id) = session.active_turn_id.take() {
        tx.uncertain_left_in_flight(&session.id, &turn_id, ENDED_IN_FLIGHT, now)
            .await?;
    }
    tx.supersede_checkpoints(&session.id, None, now).await
}

/// Why an effect in flight when its turn was cancelled is uncertain.
const CANCELLED_IN_FLIGHT: &str = "the turn was cancelled before the effect's outcome was recorded";

pub(crate) async fn finish_segment<T: Tx>(
    tx: &mut T,
    fence: Fence,
    turn_id: String,
    held: Option<SessionCommit>,
    outcome: SegmentOutcome,
    in_flight_reason: Option<String>,
) -> Result<(SegmentEnd, usize), StoreError> {
    if let Some(held) = &held {
        if held.session_id != fence.session_id {
            return Err(StoreError::invalid(
                "held",
                format!(
                    "the held writes are for session {:?}, the lease for {:?}",
                    held.session_id, fence.session_id
                ),
            ));
        }
        // A command's idempotency is checked by `run_command`, never here.
        if held.command.is_some() {
            return Err(StoreError::invalid(
                "held",
                "a segment's held writes answer no command",
            ));
        }
    }
    // The lock, the rows the held writes guard and what is in flight, in one flight; what is
    // in flight is read again after held writes, which may have completed some of it.
    let reads = Reads {
        effects: held.as_ref().map_or_else(Vec::new, |held| {
            held.new_effects
                .iter()
                .map(|new| new.effect_id.as_str())
                .chain(held.effects.iter().map(|t| t.effect_id.as_str()))
                .collect()
        }),
        effects_in: in_flight_reason
            .as_ref()
            .filter(|_| held.is_none())
            .map(|_| EffectsIn::Invoking(Some(&turn_id))),
        ..Reads::locking(&fence.session_id)
    };
    let mut found = tx.read(&reads).await?;
    let mut session = found
        .session
        .take()
        .ok_or_else(|| StoreError::not_found(Entity::Session, &fence.session_id))?;
    let now = tx.now().await?;
    // An expired lease may still be used to finish as long as nobody took over.
    let far_past = Timestamp::from_unix_millis(i64::MIN);
    engine::check_fence(&session, &fence, far_past)?;
    let mut in_flight = std::mem::take(&mut found.in_status);
    let mut changed = false;
    if let Some(held) = held {
        // The journal's last commit, as it would have been on its own (its fence included),
        // before the outcome it led to.
        session = match engine::commit_on(tx, Some(session), found, held, false, false).await? {
            CommitOutcome::Applied(receipt) => receipt.session,
            // Only a command is replayed, and held writes carry none.
            other => {
                return Err(StoreError::corrupt(
                    Entity::Session,
                    &fence.session_id,
                    format!("held writes answered {other:?}"),
                ));
            }
        };
        changed = true;
    }
    // What is left in flight becomes uncertain. Aborted by a shutdown: all the segment had in
    // flight may or may not happen; said now, under the lease, rather than when the next start
    // claims the session. The turn cancelled while its run went on: what the held writes left
    // of it in flight (a model call's start, which the journal does not commit before the
    // call), as the cancel made what was in flight then.
    let reason = match &in_flight_reason {
        Some(reason) => Some(reason.as_str()),
        None => (changed && !turn_active(&session, &turn_id)).then_some(CANCELLED_IN_FLIGHT),
    };
    let mut uncertain = 0;
    if let Some(reason) = reason {
        if changed {
            // Read again: the held writes may have completed some of it, or begun more.
            in_flight = tx
                .effects_in(&fence.session_id, EffectsIn::Invoking(Some(&turn_id)))
                .await?;
        }
        uncertain = engine::mark_uncertain(tx, &mut session, in_flight, reason, now).await?;
    }
    let end = if turn_active(&session, &turn_id) {
        apply_outcome(tx, &mut session, &turn_id, outcome, now).await?
    } else {
        SegmentEnd::Unchanged
    };
    session.owner = None;
    changed |= end == SegmentEnd::Applied || uncertain > 0;
    write_session(tx, &mut session, changed, now).await?;
    Ok((end, uncertain))
}

async fn apply_outcome<T: Tx>(
    tx: &mut T,
    session: &mut Session,
    turn_id: &str,
    outcome: SegmentOutcome,
    now: Timestamp,
) -> Result<SegmentEnd, StoreError> {
    let mut events = Vec::new();
    match outcome {
        SegmentOutcome::Completed { output, items } => {
            for body in items {
                session.last_item_seq += 1;
                let item = NewItem::new(body).in_turn(turn_id);
                tx.insert_item(&crate::model::Item {
                    session_id: session.id.clone(),
                    seq: session.last_item_seq,
                    turn_id: item.turn_id,
                    body: item.body,
                    created_at: now,
                })
                .await?;
            }
            session.status = SessionStatus::Completed;
            session.state = server_state(&session.state, Value::Null, Value::Null);
            end_turn(tx, session, now).await?;
            events.push(NewEvent::new("turn.completed", json!({"output": output})));
        }
        SegmentOutcome::Paused { checkpoint } => {
            // The turn engine wrote the checkpoint before its permission events; it is not
            // written again.
            let interactions = serde_json::to_value(&checkpoint.pending)
                .map_err(|e| StoreError::corrupt(Entity::Checkpoint, &session.id, e.to_string()))?;
            session.status = SessionStatus::Paused;
            session.state = server_state(&session.state, interactions.clone(), Value::Null);
            events.push(NewEvent::new(
                "turn.paused",
                json!({"interactions": interactions}),
            ));
        }
        SegmentOutcome::Waiting { effect_ids } => {
            let waits = json!({"effectIds": effect_ids});
            match session.status {
                // A result arrived while the segment ran: run again.
                SessionStatus::Runnable => return Ok(SegmentEnd::RunAgain),
                SessionStatus::Uncertain => {
                    session.state = server_state(&session.state, waits, Value::Null);
                }
                _ => {
                    session.status = SessionStatus::Waiting;
                    session.state = server_state(&session.state, waits.clone(), Value::Null);
                    events.push(NewEvent::new("turn.waiting", waits));
                }
            }
        }
        SegmentOutcome::Uncertain { effect_ids } => {
            session.status = SessionStatus::Uncertain;
            session.state = server_state(
                &session.state,
                json!({"effectIds": effect_ids}),
                Value::Null,
            );
        }
        SegmentOutcome::Failed { code, message } => {
            let error = json!({"code": code, "message": message});
            session.status = SessionStatus::Failed;
            session.state = server_state(&session.state, Value::Null, error.clone());
            end_turn(tx, session, now).await?;
            events.push(NewEvent::new("turn.failed", json!({"error": error})));
        }
        // A cancel command already wrote everything; a shutdown leaves the session running,
        // to be taken over at the next start.
        SegmentOutcome::Cancelled => return Ok(SegmentEnd::Unchanged),
    }
    let events = events
        .into_iter()
        .map(|event| event.in_turn(turn_id))
        .collect();
    let events = engine::append_events(session, events, now);
    engine::insert_events(tx, &events).await?;
    Ok(SegmentEnd::Applied)
}
