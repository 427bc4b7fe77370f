//! The store's transactions, written once over row-level operations ([`Tx`], whose SQL is
//! written once too, in [`crate::sql`]). Keeping the rules here is what makes the embedded store
//! and PostgreSQL behave identically.
//!
//! Locking rule (deadlocks are impossible if every transaction follows it): a transaction that
//! writes anything belonging to a session first locks that session's row; a transaction that
//! locks several sessions locks them in ascending id order. Effects, actions, events, items,
//! checkpoints and commands are only written under their session's lock.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::json;

use crate::error::{Entity, StaleReason, StoreError};
use crate::feed::Notice;
use crate::model::{
    Action, ActionFilter, ActionGuard, ActionStatus, AgentDefinition, BeginEffect,
    BeginEffectOutcome, Checkpoint, CheckpointWrite, ClaimAction, ClaimedAction, CommandRecord,
    CommitOutcome, CommitReceipt, CreatedSession, Effect, EffectStatus, Event, Fence,
    HeartbeatAction, Item, ItemPage, Lease, MAX_PAGE, NewAgent, NewEffect, NewEvent, NewSession,
    RetentionPolicy, RetentionReport, Session, SessionCommit, SessionCount, SessionFilter,
    SessionOwner, SessionStatus, Timestamp, TurnEffects,
};
pub(crate) use crate::tx::Tx;
use crate::tx::{EffectsIn, Found, Reads};

/// Rows one expiry or retention pass handles at most: call again while it reports a full batch.
pub(crate) const BATCH: i64 = 500;

/// Converts a caller's counter to the database's signed 64-bit integer.
pub(crate) fn db_int(what: &'static str, value: u64) -> Result<i64, StoreError> {
    i64::try_from(value)
        .map_err(|_| StoreError::invalid(what, format!("{value} exceeds {}", i64::MAX)))
}

fn require_id(what: &'static str, value: &str) -> Result<(), StoreError> {
    if value.is_empty() {
        return Err(StoreError::invalid(what, "must not be empty"));
    }
    Ok(())
}

fn require_lease(lease: Duration) -> Result<(), StoreError> {
    if lease.as_millis() == 0 {
        return Err(StoreError::invalid(
            "lease",
            "must be at least one millisecond",
        ));
    }
    Ok(())
}

fn require_page(limit: usize) -> Result<i64, StoreError> {
    if limit == 0 || limit > MAX_PAGE {
        return Err(StoreError::invalid(
            "limit",
            format!("{limit} is outside 1..={MAX_PAGE}"),
        ));
    }
    db_int("limit", limit as u64)
}

pub(crate) async fn locked_session<T: Tx>(tx: &mut T, id: &str) -> Result<Session, StoreError> {
    tx.session(id, true)
        .await?
        .ok_or_else(|| StoreError::not_found(Entity::Session, id))
}

pub(crate) async fn existing_session<T: Tx>(tx: &mut T, id: &str) -> Result<Session, StoreError> {
    tx.session(id, false)
        .await?
        .ok_or_else(|| StoreError::not_found(Entity::Session, id))
}

/// Accepts `fence` only if it is the session's current, unexpired lease.
pub(crate) fn check_fence(
    session: &Session,
    fence: &Fence,
    now: Timestamp,
) -> Result<(), StoreError> {
    if fence.session_id != session.id {
        return Err(StoreError::invalid(
            "fence",
            format!(
                "the lease is on session {:?}, not {:?}",
                fence.session_id, session.id
            ),
        ));
    }
    let stale = |reason| StoreError::StaleGeneration {
        entity: Entity::Session,
        id: session.id.clone(),
        presented: fence.generation,
        current: session.generation,
        reason,
    };
    match &session.owner {
        _ if session.generation != fence.generation => Err(stale(StaleReason::Superseded)),
        None => Err(stale(StaleReason::NotHeld)),
        Some(owner) if owner.replica_id != fence.replica_id => Err(stale(StaleReason::Superseded)),
        Some(owner) if owner.lease_expires_at <= now => Err(stale(StaleReason::Expired)),
        Some(_) => Ok(()),
    }
}

/// The rule every write about a turn's effect or action obeys: its turn must be the session's
/// active, uncancelled turn.
pub(crate) fn turn_active(session: &Session, turn_id: &str) -> bool {
    session.status != SessionStatus::Cancelled && session.active_turn_id.as_deref() == Some(turn_id)
}

/// Whether the session has no unresolved work: idle, completed, failed, cancelled or closed.
pub(crate) fn settled(status: SessionStatus) -> bool {
    matches!(
        status,
        SessionStatus::Idle
            | SessionStatus::Completed
            | SessionStatus::Failed
            | SessionStatus::Cancelled
            | SessionStatus::Closed
    )
}

/// Accepts a write guarded on the active turn only if that turn is still active.
fn check_turn(session: &Session, expect: Option<&Option<String>>) -> Result<(), StoreError> {
    match expect {
        Some(expected) if *expected != session.active_turn_id => Err(StoreError::conflict(
            Entity::Session,
            &session.id,
            format!(
                "the write expects active turn {:?}, the session's is {:?}",
                expected, session.active_turn_id
            ),
        )),
        _ => Ok(()),
    }
}

/// Accepts an executor's claim only if it is the action's current, unexpired claim.
pub(crate) fn check_claim(
    action: &Action,
    claim_id: &str,
    generation: u64,
    now: Timestamp,
) -> Result<(), StoreError> {
    let stale = |reason| StoreError::StaleGeneration {
        entity: Entity::Action,
        id: action.action_id.clone(),
        presented: generation,
        current: action.generation,
        reason,
    };
    if action.generation != generation || action.claim_id.as_deref() != Some(claim_id) {
        return Err(stale(StaleReason::Superseded));
    }
    if action.status != ActionStatus::Claimed {
        return Err(stale(StaleReason::NotHeld));
    }
    if action.lease_expires_at.is_none_or(|expiry| expiry <= now) {
        return Err(stale(StaleReason::Expired));
    }
    Ok(())
}

pub(crate) fn append_events(
    session: &mut Session,
    events: Vec<NewEvent>,
    now: Timestamp,
) -> Vec<Event> {
    events
        .into_iter()
        .map(|event| {
            session.last_cursor += 1;
            Event {
                session_id: session.id.clone(),
                cursor: session.last_cursor,
                turn_id: event.turn_id,
                event_type: event.event_type,
                payload: event.payload,
                created_at: now,
            }
        })
        .collect()
}

pub(crate) async fn insert_events<T: Tx>(tx: &mut T, events: &[Event]) -> Result<(), StoreError> {
    for event in events {
        tx.insert_event(event).await?;
    }
    if let (Some(first), Some(last)) = (events.first(), events.last()) {
        tx.notices().push(Notice::Events {
            session_id: first.session_id.clone(),
            first: first.cursor,
            last: last.cursor,
            cancelled: events.iter().any(|e| e.event_type == "turn.cancelled"),
        });
    }
    Ok(())
}

/// Announces, after commit, that `action_id` can be claimed.
fn announce_work<T: Tx>(tx: &mut T, action_id: &str) {
    tx.notices().push(Notice::Work {
        action_id: action_id.to_owned(),
    });
}

/// Bumps the version and writes the session row: every data change ends here.
pub(crate) async fn save_session<T: Tx>(
    tx: &mut T,
    session: &mut Session,
    now: Timestamp,
) -> Result<(), StoreError> {
    session.version += 1;
    session.updated_at = now;
    tx.update_session(session).await
}

pub(crate) async fn ping<T: Tx>(tx: &mut T) -> Result<(), StoreError> {
    tx.ping().await
}

pub(crate) async fn put_agent<T: Tx>(
    tx: &mut T,
    agent: NewAgent,
) -> Result<AgentDefinition, StoreError> {
    require_id("agent id", &agent.agent_id)?;
    let now = tx.now().await?;
    tx.upsert_agent(&agent, now).await
}

pub(crate) async fn get_agent<T: Tx>(tx: &mut T, id: &str) -> Result<AgentDefinition, StoreError> {
    tx.agent(id)
        .await?
        .ok_or_else(|| StoreError::not_found(Entity::Agent, id))
}

pub(crate) async fn list_agents<T: Tx>(tx: &mut T) -> Result<Vec<AgentDefinition>, StoreError> {
    tx.list_agents().await
}

fn same_creation(session: &Session, new: &NewSession) -> bool {
    session.tenant_id == new.tenant_id
        && session.owner_user_id == new.owner_user_id
        && session.agent_id == new.agent_id
        && session.creation == new.creation
}

pub(crate) async fn create_session<T: Tx>(
    tx: &mut T,
    new: NewSession,
) -> Result<CreatedSession, StoreError> {
    require_id("session id", &new.id)?;
    require_id("tenant id", &new.tenant_id)?;
    require_id("owner user id", &new.owner_user_id)?;
    let existing = |session: Session| {
        if same_creation(&session, &new) {
            Ok(CreatedSession {
                session,
                created: false,
            })
        } else {
            Err(StoreError::conflict(
                Entity::Session,
                &new.id,
                "a session with this id exists with different creation parameters",
            ))
        }
    };
    if let Some(session) = tx.session(&new.id, true).await? {
        return existing(session);
    }
    let agent = tx
        .agent(&new.agent_id)
        .await?
        .ok_or_else(|| StoreError::not_found(Entity::Agent, &new.agent_id))?;
    let now = tx.now().await?;
    let session = Session {
        id: new.id.clone(),
        tenant_id: new.tenant_id.clone(),
        owner_user_id: new.owner_user_id.clone(),
        agent_id: agent.agent_id,
        manifest: agent.manifest,
        manifest_hash: agent.manifest_hash,
        implementation_version: agent.implementation_version,
        creation: new.creation.clone(),
        status: SessionStatus::Idle,
        active_turn_id: None,
        state: new.state.clone(),
        version: 1,
        last_cursor: 0,
        last_item_seq: 0,
        owner: None,
        generation: 0,
        created_at: now,
        updated_at: now,
        closed_at: None,
    };
    if tx.insert_session(&session).await? {
        return Ok(CreatedSession {
            session,
            created: true,
        });
    }
    // A concurrent create committed first: answer as if it had been there all along.
    existing(locked_session(tx, &new.id).await?)
}

pub(crate) async fn get_session<T: Tx>(tx: &mut T, id: &str) -> Result<Session, StoreError> {
    existing_session(tx, id).await
}

pub(crate) async fn session_counts<T: Tx>(
    tx: &mut T,
    filter: &SessionFilter,
) -> Result<Vec<(String, i64)>, StoreError> {
    tx.status_counts(filter).await
}

/// Erases session `id` and everything stored for it (events, items, checkpoints, effects,
/// actions, commands). A session whose turn is in progress is a conflict unless `cancel`:
/// then it is erased all the same (its runner's next fenced write fails, and it stops).
pub(crate) async fn erase_session<T: Tx>(
    tx: &mut T,
    id: &str,
    cancel: bool,
) -> Result<Session, StoreError> {
    let session = locked_session(tx, id).await?;
    if !cancel && !settled(session.status) {
        return Err(StoreError::conflict(
            Entity::Session,
            id,
            "a turn is in progress: cancel it first, or erase with cancel",
        ));
    }
    tx.delete_session(id).await?;
    Ok(session)
}

pub(crate) async fn list_sessions<T: Tx>(
    tx: &mut T,
    filter: &SessionFilter,
) -> Result<Vec<Session>, StoreError> {
    tx.list_sessions(filter).await
}

pub(crate) async fn commit<T: Tx>(
    tx: &mut T,
    commit: SessionCommit,
) -> Result<CommitOutcome, StoreError> {
    // The lock, the idempotency record and the rows the transitions guard, in one flight.
    let reads = Reads {
        command: commit.command.as_ref().map(|c| c.idempotency_key.as_str()),
        effects: commit
            .new_effects
            .iter()
            .map(|new| new.effect_id.as_str())
            .chain(commit.effects.iter().map(|t| t.effect_id.as_str()))
            .collect(),
        actions: commit
            .actions
            .iter()
            .map(|t| t.action_id.as_str())
            .collect(),
        ..Reads::locking(&commit.session_id)
    };
    let mut found = tx.read(&reads).await?;
    commit_on(tx, found.session.take(), found, commit, true, true).await
}

/// [`commit`] on the session as the caller locked it (`None`: it does not exist), with what the
/// caller already read under the lock in `found`; with `check_replay` false the caller has
/// already looked up the command's idempotency key, else `found.command` is its record. With
/// `save` false the session row is left for the caller to write (the receipt's session is as
/// the commit changed it, version unchanged).
pub(crate) async fn commit_on<T: Tx>(
    tx: &mut T,
    session: Option<Session>,
    mut found: Found,
    commit: SessionCommit,
    check_replay: bool,
    save: bool,
) -> Result<CommitOutcome, StoreError> {
    let SessionCommit {
        session_id,
        fence,
        expect_version,
        expect_turn,
        expect_status,
        command,
        patch,
        items,
        events,
        checkpoint,
        new_effects,
        effects,
        actions,
    } = commit;
    for new in &new_effects {
        check_new_effect(new, false)?;
    }
    if let Some(command) = &command {
        require_id("idempotency key", &command.idempotency_key)?;
    }
    let checkpoint_segment = match &checkpoint {
        Some(CheckpointWrite::Put(put)) => {
            require_id("checkpoint turn id", &put.turn_id)?;
            Some(db_int("checkpoint segment", put.segment)?)
        }
        _ => None,
    };
    if let Some(command) = &command
        && check_replay
        && let Some(record) = found.command.take()
    {
        if record.command == command.command {
            return Ok(CommitOutcome::Replayed(record));
        }
        return Err(StoreError::conflict(
            Entity::Command,
            &command.idempotency_key,
            "the idempotency key is already bound to a different command",
        ));
    }
    let mut session = session.ok_or_else(|| StoreError::not_found(Entity::Session, &session_id))?;
    let now = tx.now().await?;
    if let Some(fence) = &fence {
        check_fence(&session, fence, now)?;
    }
    if let Some(expected) = expect_version
        && expected != session.version
    {
        return Err(StoreError::conflict(
            Entity::Session,
            &session_id,
            format!("expected version {expected}, found {}", session.version),
        ));
    }
    check_turn(&session, expect_turn.as_ref())?;
    if !expect_status.is_empty() && !expect_status.contains(&session.status) {
        return Err(StoreError::conflict(
            Entity::Session,
            &session_id,
            format!(
                "the session is {}, the commit expects {}",
                session.status,
                list(&expect_status)
            ),
        ));
    }

    // The guarded rows not read yet, in one flight.
    let missing = Reads {
        session_id: &session_id,
        effects: new_effects
            .iter()
            .map(|new| new.effect_id.as_str())
            .chain(effects.iter().map(|t| t.effect_id.as_str()))
            .filter(|id| !found.effects.contains_key(*id))
            .collect(),
        actions: actions
            .iter()
            .map(|t| t.action_id.as_str())
            .filter(|id| !found.actions.contains_key(*id))
            .collect(),
        ..Reads::default()
    };
    if !missing.effects.is_empty() || !missing.actions.is_empty() {
        let more = tx.read(&missing).await?;
        found.effects.extend(more.effects);
        found.actions.extend(more.actions);
    }

    for new in new_effects {
        if found
            .effects
            .get(&new.effect_id)
            .is_some_and(Option::is_some)
        {
            return Err(StoreError::conflict(
                Entity::Effect,
                &new.effect_id,
                "the effect id is journaled already",
            ));
        }
        let effect = new.into_effect(&session_id, now);
        tx.insert_effect(&effect).await?;
        found.effects.insert(effect.effect_id.clone(), Some(effect));
    }

    for transition in effects {
        let mut effect = found
            .effects
            .get(&transition.effect_id)
            .cloned()
            .flatten()
            .filter(|effect| effect.session_id == session_id)
            .ok_or_else(|| StoreError::not_found(Entity::Effect, &transition.effect_id))?;
        if !transition.from.contains(&effect.status) {
            return Err(StoreError::conflict(
                Entity::Effect,
                &transition.effect_id,
                format!(
                    "status is {}, the transition to {} expects {}",
                    effect.status,
                    transition.to,
                    list(&transition.from)
                ),
            ));
        }
        effect.status = transition.to;
        if transition.result.is_some() {
            effect.result = transition.result;
        }
        if transition.error.is_some() {
            effect.error = transition.error;
        }
        effect.updated_at = now;
        tx.update_effect(&effect).await?;
        // A later transition of the same effect sees this one.
        found.effects.insert(effect.effect_id.clone(), Some(effect));
    }

    for transition in actions {
        let mut action = found
            .actions
            .get(&transition.action_id)
            .cloned()
            .flatten()
            .filter(|action| action.session_id == session_id)
            .ok_or_else(|| StoreError::not_found(Entity::Action, &transition.action_id))?;
        match &transition.guard {
            ActionGuard::Status(allowed) => {
                if !allowed.contains(&action.status) {
                    return Err(StoreError::conflict(
                        Entity::Action,
                        &transition.action_id,
                        format!(
                            "status is {}, the transition to {} expects {}",
                            action.status,
                            transition.to,
                            list(allowed)
                        ),
                    ));
                }
            }
            ActionGuard::Claim {
                claim_id,
                generation,
            } => check_claim(&action, claim_id, *generation, now)?,
        }
        action.status = transition.to;
        if transition.result.is_some() {
            action.result = transition.result;
        }
        if transition.clear_claim {
            action.claim_id = None;
            action.lease_expires_at = None;
        }
        action.updated_at = now;
        tx.update_action(&action).await?;
        if action.status == ActionStatus::Pending {
            announce_work(tx, &action.action_id);
        }
        found.actions.insert(action.action_id.clone(), Some(action));
    }

    if let Some(status) = patch.status {
        if status == SessionStatus::Closed {
            if session.status != SessionStatus::Closed {
                session.closed_at = Some(now);
            }
        } else {
            session.closed_at = None;
        }
        session.status = status;
    }
    if let Some(turn) = patch.active_turn_id {
        session.active_turn_id = turn;
    }
    if let Some(state) = patch.state {
        session.state = state;
    }

    let mut appended_items = Vec::with_capacity(items.len());
    for item in items {
        session.last_item_seq += 1;
        let item = Item {
            session_id: session_id.clone(),
            seq: session.last_item_seq,
            turn_id: item.turn_id,
            body: item.body,
            created_at: now,
        };
        tx.insert_item(&item).await?;
        appended_items.push(item);
    }

    let appended_events = append_events(&mut session, events, now);
    insert_events(tx, &appended_events).await?;

    match (&checkpoint, checkpoint_segment) {
        (Some(CheckpointWrite::Put(put)), Some(segment)) => {
            tx.supersede_checkpoints(&session_id, Some((&put.turn_id, segment)), now)
                .await?;
            tx.upsert_checkpoint(&session_id, put, segment, now).await?;
        }
        (Some(CheckpointWrite::Clear), _) => {
            tx.supersede_checkpoints(&session_id, None, now).await?;
        }
        _ => {}
    }

    let record = match command {
        Some(command) => {
            let record = CommandRecord {
                session_id: session_id.clone(),
                idempotency_key: command.idempotency_key,
                command: command.command,
                response: command.response,
                cursor: session.last_cursor,
                created_at: now,
            };
            tx.insert_command(&record).await?;
            Some(record)
        }
        None => None,
    };

    if save {
        save_session(tx, &mut session, now).await?;
    }
    Ok(CommitOutcome::Applied(Box::new(CommitReceipt {
        session,
        events: appended_events,
        items: appended_items,
        command: record,
    })))
}

fn list<T: std::fmt::Display>(values: &[T]) -> String {
    if values.is_empty() {
        return "nothing".to_owned();
    }
    values
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(" or ")
}

pub(crate) async fn append_event<T: Tx>(
    tx: &mut T,
    session_id: &str,
    fence: Option<Fence>,
    event: NewEvent,
) -> Result<Event, StoreError> {
    let mut request = SessionCommit::new(session_id);
    request.fence = fence;
    request.events.push(event);
    match commit(tx, request).await? {
        CommitOutcome::Applied(mut receipt) => receipt.events.pop().ok_or_else(|| {
            StoreError::corrupt(
                Entity::Event,
                session_id,
                "the appended event was not returned",
            )
        }),
        CommitOutcome::Replayed(_) => Err(StoreError::corrupt(
            Entity::Event,
            session_id,
            "a commit without a command was reported as a replay",
        )),
    }
}

pub(crate) async fn list_events<T: Tx>(
    tx: &mut T,
    session_id: &str,
    after: u64,
    limit: usize,
) -> Result<Vec<Event>, StoreError> {
    let limit = require_page(limit)?;
    // A cursor beyond what the database holds is beyond the session's last one too.
    let (last, events) = tx
        .cursor_and_events_after(session_id, i64::try_from(after).unwrap_or(i64::MAX), limit)
        .await?
        .ok_or_else(|| StoreError::not_found(Entity::Session, session_id))?;
    let last = u64::try_from(last).unwrap_or(0);
    if after > last {
        return Err(StoreError::InvalidCursor {
            session_id: session_id.to_owned(),
            cursor: after,
            last,
        });
    }
    Ok(events)
}

pub(crate) async fn page_items<T: Tx>(
    tx: &mut T,
    session_id: &str,
    after: u64,
    limit: usize,
) -> Result<ItemPage, StoreError> {
    let limit = require_page(limit)?;
    existing_session(tx, session_id).await?;
    // One row more than asked tells whether another page follows.
    let items = tx
        .items_after(session_id, db_int("item sequence", after)?, limit + 1)
        .await?;
    Ok(item_page(items, limit))
}

pub(crate) async fn open_turn<T: Tx>(
    tx: &mut T,
    session_id: &str,
    turn_id: &str,
    limit: usize,
) -> Result<(ItemPage, TurnEffects), StoreError> {
    let limit = require_page(limit)?;
    // One row more than asked tells whether another page follows.
    let (turn, items) = tx
        .turn_effects(session_id, turn_id, Some(limit + 1))
        .await?
        .ok_or_else(|| StoreError::not_found(Entity::Session, session_id))?;
    Ok((item_page(items, limit), turn))
}

/// A page of at most `limit` of `items`, which holds one more when another page follows.
fn item_page(mut items: Vec<Item>, limit: i64) -> ItemPage {
    let more = items.len() as i64 > limit;
    items.truncate(limit as usize);
    let next_after = if more {
        items.last().map(|item| item.seq)
    } else {
        None
    };
    ItemPage { items, next_after }
}

pub(crate) async fn live_checkpoint<T: Tx>(
    tx: &mut T,
    session_id: &str,
) -> Result<Option<Checkpoint>, StoreError> {
    existing_session(tx, session_id).await?;
    tx.live_checkpoint(session_id).await
}

pub(crate) async fn get_command<T: Tx>(
    tx: &mut T,
    session_id: &str,
    key: &str,
) -> Result<Option<CommandRecord>, StoreError> {
    tx.command(session_id, key).await
}

pub(crate) async fn begin_effect<T: Tx>(
    tx: &mut T,
    begin: BeginEffect,
) -> Result<BeginEffectOutcome, StoreError> {
    let BeginEffect {
        session_id,
        fence,
        effect: new,
        action,
        events,
    } = begin;
    check_new_effect(&new, true)?;
    // The lock and the effect's journal entry, in one flight.
    let reads = Reads {
        effects: vec![new.effect_id.as_str()],
        ..Reads::locking(&session_id)
    };
    let mut found = tx.read(&reads).await?;
    let mut session = found
        .session
        .take()
        .ok_or_else(|| StoreError::not_found(Entity::Session, &session_id))?;
    let now = tx.now().await?;
    if let Some(fence) = &fence {
        check_fence(&session, fence, now)?;
    }
    if let Some(existing) = found.effects.remove(&new.effect_id).flatten() {
        if !existing.journals(&session_id, &new) {
            return Err(StoreError::conflict(
                Entity::Effect,
                &new.effect_id,
                "the effect id is journaled with a different session, turn, kind or request",
            ));
        }
        return Ok(BeginEffectOutcome::Existing(existing));
    }
    let effect = new.into_effect(&session_id, now);
    tx.insert_effect(&effect).await?;
    if let Some(action) = action {
        require_id("action agent id", &action.agent_id)?;
        announce_work(tx, &effect.effect_id);
        tx.insert_action(&Action {
            action_id: effect.effect_id.clone(),
            session_id: session_id.clone(),
            turn_id: effect.turn_id.clone(),
            agent_id: action.agent_id,
            manifest_hash: action.manifest_hash,
            implementation_version: action.implementation_version,
            capability_id: action.capability_id,
            request: action.request,
            status: ActionStatus::Pending,
            generation: 0,
            claim_id: None,
            lease_expires_at: None,
            result: None,
            created_at: now,
            updated_at: now,
        })
        .await?;
    }
    let events = append_events(&mut session, events, now);
    insert_events(tx, &events).await?;
    save_session(tx, &mut session, now).await?;
    Ok(BeginEffectOutcome::Started { effect, events })
}

/// Refuses a new effect without ids, or in a status no effect starts in (`pending` only with
/// an action to claim it, through `begin_effect`).
fn check_new_effect(new: &NewEffect, pending_allowed: bool) -> Result<(), StoreError> {
    require_id("effect id", &new.effect_id)?;
    require_id("effect turn id", &new.turn_id)?;
    let starts_completed = new.status == EffectStatus::Completed && new.result.is_some();
    let starts = starts_completed
        || new.status == EffectStatus::Invoking
        || (pending_allowed && new.status == EffectStatus::Pending);
    if !starts {
        return Err(StoreError::invalid(
            "effect status",
            format!(
                "a new effect starts {} (or completed with a result), not {}",
                if pending_allowed {
                    "pending or invoking"
                } else {
                    "invoking"
                },
                new.status
            ),
        ));
    }
    Ok(())
}

pub(crate) async fn get_effect<T: Tx>(tx: &mut T, id: &str) -> Result<Effect, StoreError> {
    tx.effect(id)
        .await?
        .ok_or_else(|| StoreError::not_found(Entity::Effect, id))
}

pub(crate) async fn list_effects<T: Tx>(
    tx: &mut T,
    session_id: &str,
    status: Option<EffectStatus>,
) -> Result<Vec<Effect>, StoreError> {
    existing_session(tx, session_id).await?;
    tx.session_effects(session_id, status).await
}

pub(crate) async fn turn_effects<T: Tx>(
    tx: &mut T,
    session_id: &str,
    turn_id: &str,
) -> Result<TurnEffects, StoreError> {
    tx.turn_effects(session_id, turn_id, None)
        .await?
        .map(|(turn, _)| turn)
        .ok_or_else(|| StoreError::not_found(Entity::Session, session_id))
}

/// Every effect in `changed` (the session's [`EffectStatus::Invoking`] ones) becomes uncertain
/// with `reason`; for those of its active, uncancelled turn the session becomes uncertain and
/// an `effect.uncertain` event is appended (the caller saves the session). Returns how many
/// effects changed.
pub(crate) async fn mark_uncertain<T: Tx>(
    tx: &mut T,
    session: &mut Session,
    mut changed: Vec<Effect>,
    reason: &str,
    now: Timestamp,
) -> Result<usize, StoreError> {
    let mut events = Vec::new();
    for effect in &mut changed {
        effect.status = EffectStatus::Uncertain;
        effect.error = Some(reason.to_owned());
        effect.updated_at = now;
        tx.update_effect(effect).await?;
        if turn_active(session, &effect.turn_id) {
            events.push(
                NewEvent::new(
                    "effect.uncertain",
                    json!({
                        "effectId": effect.effect_id,
                        "kind": effect.kind.as_str(),
                        "message": reason,
                    }),
                )
                .in_turn(effect.turn_id.clone()),
            );
        }
    }
    if !events.is_empty() {
        session.status = SessionStatus::Uncertain;
    }
    let events = append_events(session, events, now);
    insert_events(tx, &events).await?;
    Ok(changed.len())
}

pub(crate) async fn get_action<T: Tx>(tx: &mut T, id: &str) -> Result<Action, StoreError> {
    tx.action(id)
        .await?
        .ok_or_else(|| StoreError::not_found(Entity::Action, id))
}

pub(crate) async fn list_actions<T: Tx>(
    tx: &mut T,
    filter: &ActionFilter,
) -> Result<Vec<Action>, StoreError> {
    tx.list_actions(filter).await
}

/// Locks the action's session, then reads the action again under that lock (in one flight).
async fn locked_action<T: Tx>(tx: &mut T, id: &str) -> Result<(Session, Action), StoreError> {
    let unlocked = get_action(tx, id).await?;
    let reads = Reads {
        actions: vec![id],
        ..Reads::locking(&unlocked.session_id)
    };
    let mut found = tx.read(&reads).await?;
    let session = found
        .session
        .ok_or_else(|| StoreError::not_found(Entity::Session, &unlocked.session_id))?;
    let action = found
        .actions
        .remove(id)
        .flatten()
        .ok_or_else(|| StoreError::not_found(Entity::Action, id))?;
    Ok((session, action))
}

pub(crate) async fn claim_action<T: Tx>(
    tx: &mut T,
    claim: ClaimAction,
) -> Result<ClaimedAction, StoreError> {
    require_id("claim id", &claim.claim_id)?;
    require_lease(claim.lease)?;
    let (mut session, mut action) = locked_action(tx, &claim.action_id).await?;
    let now = tx.now().await?;
    if action.manifest_hash != claim.manifest_hash
        || action.implementation_version != claim.implementation_version
    {
        return Err(StoreError::conflict(
            Entity::Action,
            &action.action_id,
            format!(
                "definition mismatch: the action needs manifest {} at version {}",
                action.manifest_hash, action.implementation_version
            ),
        ));
    }
    if action.status == ActionStatus::Claimed
        && action.claim_id.as_deref() == Some(claim.claim_id.as_str())
        && action.lease_expires_at.is_some_and(|expiry| expiry > now)
    {
        // The same claim again (a retried request): the claim as it was granted.
        let record = tx
            .command(
                &session.id,
                &action_claim_key(&action.action_id, action.generation),
            )
            .await?;
        let cursor = record.map_or(0, |record| record.cursor);
        let after = db_int("cursor", cursor.saturating_sub(1))?;
        if let Some(event) = tx.events_after(&session.id, after, 1).await?.pop()
            && event.cursor == cursor
        {
            return Ok(ClaimedAction { action, event });
        }
    }
    if action.status != ActionStatus::Pending {
        return Err(StoreError::conflict(
            Entity::Action,
            &action.action_id,
            format!("the action is {}, not pending", action.status),
        ));
    }
    if !turn_active(&session, &action.turn_id) {
        return Err(StoreError::conflict(
            Entity::Action,
            &action.action_id,
            "the action's turn is no longer active",
        ));
    }
    action.status = ActionStatus::Claimed;
    action.generation += 1;
    action.claim_id = Some(claim.claim_id);
    action.lease_expires_at = Some(now.saturating_add(claim.lease));
    action.updated_at = now;
    tx.update_action(&action).await?;
    let mut events = append_events(
        &mut session,
        vec![
            NewEvent::new(
                "action.claimed",
                json!({"actionId": action.action_id, "generation": action.generation}),
            )
            .in_turn(action.turn_id.clone()),
        ],
        now,
    );
    insert_events(tx, &events).await?;
    if let Some(event) = events.last() {
        tx.insert_command(&CommandRecord {
            session_id: session.id.clone(),
            idempotency_key: action_claim_key(&action.action_id, action.generation),
            command: json!({"claimId": action.claim_id}),
            response: json!({}),
            cursor: event.cursor,
            created_at: now,
        })
        .await?;
    }
    save_session(tx, &mut session, now).await?;
    let event = events.pop().ok_or_else(|| {
        StoreError::corrupt(
            Entity::Event,
            &session.id,
            "the claim event was not appended",
        )
    })?;
    Ok(ClaimedAction { action, event })
}

pub(crate) async fn heartbeat_action<T: Tx>(
    tx: &mut T,
    heartbeat: HeartbeatAction,
) -> Result<Action, StoreError> {
    require_lease(heartbeat.lease)?;
    let (session, mut action) = locked_action(tx, &heartbeat.action_id).await?;
    let now = tx.now().await?;
    check_claim(&action, &heartbeat.claim_id, heartbeat.generation, now)?;
    if !turn_active(&session, &action.turn_id) {
        return Err(StoreError::StaleGeneration {
            entity: Entity::Action,
            id: action.action_id.clone(),
            presented: heartbeat.generation,
            current: action.generation,
            reason: StaleReason::NotHeld,
        });
    }
    action.lease_expires_at = Some(now.saturating_add(heartbeat.lease));
    action.updated_at = now;
    tx.update_action(&action).await?;
    Ok(action)
}

pub(crate) async fn expire_action_claims<T: Tx>(tx: &mut T) -> Result<Vec<Action>, StoreError> {
    let now = tx.now().await?;
    let mut by_session: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for action in tx.expired_claims(now).await? {
        by_session
            .entry(action.session_id)
            .or_default()
            .push(action.action_id);
    }
    let mut expired = Vec::new();
    // BTreeMap iteration locks sessions in ascending id order.
    for (session_id, action_ids) in by_session {
        let Some(mut session) = tx.session(&session_id, true).await? else {
            continue;
        };
        let mut events = Vec::new();
        for action_id in action_ids {
            let Some(mut action) = tx.action(&action_id).await? else {
                continue;
            };
            // Re-checked under the lock: a heartbeat or a result may have landed meanwhile.
            let still_expired = action.status == ActionStatus::Claimed
                && action.lease_expires_at.is_some_and(|expiry| expiry <= now);
            if !still_expired {
                continue;
            }
            action.status = ActionStatus::Uncertain;
            action.updated_at = now;
            tx.update_action(&action).await?;
            if let Some(mut effect) = tx.effect(&action.action_id).await?
                && matches!(
                    effect.status,
                    EffectStatus::Pending | EffectStatus::Invoking
                )
            {
                effect.status = EffectStatus::Uncertain;
                effect.error = Some("the executor's claim expired".to_owned());
                effect.updated_at = now;
                tx.update_effect(&effect).await?;
            }
            if turn_active(&session, &action.turn_id) {
                session.status = SessionStatus::Uncertain;
                events.push(
                    NewEvent::new("action.uncertain", json!({"actionId": action.action_id}))
                        .in_turn(action.turn_id.clone()),
                );
            }
            expired.push(action);
        }
        let events = append_events(&mut session, events, now);
        insert_events(tx, &events).await?;
        save_session(tx, &mut session, now).await?;
    }
    Ok(expired)
}

pub(crate) fn grant(session: &Session) -> Result<Lease, StoreError> {
    let owner = session.owner.as_ref().ok_or_else(|| {
        StoreError::corrupt(Entity::Session, &session.id, "a granted lease has no owner")
    })?;
    Ok(Lease {
        session_id: session.id.clone(),
        replica_id: owner.replica_id.clone(),
        generation: session.generation,
        expires_at: owner.lease_expires_at,
    })
}

/// Makes `replica_id` the session's owner under a new lease with the next fencing generation
/// (in memory: the caller writes the session).
pub(crate) fn take_ownership(
    session: &mut Session,
    replica_id: &str,
    lease: Duration,
    now: Timestamp,
) {
    session.generation += 1;
    session.owner = Some(SessionOwner {
        replica_id: replica_id.to_owned(),
        lease_expires_at: now.saturating_add(lease),
    });
}

pub(crate) fn require_replica(replica_id: &str, lease: Duration) -> Result<(), StoreError> {
    require_id("replica id", replica_id)?;
    require_lease(lease)
}

pub(crate) async fn claim_runnable_session<T: Tx>(
    tx: &mut T,
    replica_id: &str,
    lease: Duration,
) -> Result<Option<Lease>, StoreError> {
    require_id("replica id", replica_id)?;
    require_lease(lease)?;
    let Some((mut session, _)) = tx.next_claimable_session().await? else {
        return Ok(None);
    };
    let now = tx.now().await?;
    take_ownership(&mut session, replica_id, lease, now);
    // Ownership is not session data: the version stays, so a commit prepared before the
    // takeover still fails on the fence rather than on the version.
    tx.update_session(&session).await?;
    grant(&session).map(Some)
}

pub(crate) async fn acquire_session<T: Tx>(
    tx: &mut T,
    session_id: &str,
    replica_id: &str,
    lease: Duration,
) -> Result<Lease, StoreError> {
    require_id("replica id", replica_id)?;
    require_lease(lease)?;
    let mut session = locked_session(tx, session_id).await?;
    let now = tx.now().await?;
    match &session.owner {
        Some(owner) if owner.lease_expires_at > now && owner.replica_id != replica_id => {
            return Err(StoreError::conflict(
                Entity::Session,
                session_id,
                format!(
                    "replica {:?} holds the session until {}",
                    owner.replica_id, owner.lease_expires_at
                ),
            ));
        }
        Some(owner) if owner.lease_expires_at > now => {}
        _ => session.generation += 1,
    }
    session.owner = Some(SessionOwner {
        replica_id: replica_id.to_owned(),
        lease_expires_at: now.saturating_add(lease),
    });
    tx.update_session(&session).await?;
    grant(&session)
}

pub(crate) async fn renew_lease<T: Tx>(
    tx: &mut T,
    fence: Fence,
    lease: Duration,
) -> Result<Lease, StoreError> {
    require_lease(lease)?;
    let mut session = locked_session(tx, &fence.session_id).await?;
    let now = tx.now().await?;
    check_fence(&session, &fence, now)?;
    session.owner = Some(SessionOwner {
        replica_id: fence.replica_id,
        lease_expires_at: now.saturating_add(lease),
    });
    tx.update_session(&session).await?;
    grant(&session)
}

pub(crate) async fn release_lease<T: Tx>(tx: &mut T, fence: Fence) -> Result<(), StoreError> {
    let mut session = locked_session(tx, &fence.session_id).await?;
    // An expired lease may still be released by its holder as long as nobody took over.
    let far_past = Timestamp::from_unix_millis(i64::MIN);
    check_fence(&session, &fence, far_past)?;
    session.owner = None;
    tx.update_session(&session).await
}

/// Which sessions [`due`] lists.
#[derive(Clone, Copy)]
enum Listing {
    /// Settled, not closed (candidates to close).
    Settled,
    /// Closed (candidates to delete or prune).
    Closed,
}

/// The sessions of `listing` whose time-to-live has run out, each with its cutoff, in id order:
/// a tenant's override wins over the default `ttl` (`None`: no default, only the overrides).
async fn due<T: Tx>(
    tx: &mut T,
    listing: Listing,
    overrides: &BTreeMap<String, Duration>,
    ttl: Option<Duration>,
    now: Timestamp,
) -> Result<Vec<(String, Timestamp)>, StoreError> {
    let mut due = Vec::new();
    let tenants = overrides
        .iter()
        .map(|(tenant, ttl)| (Some(tenant.as_str()), *ttl))
        .chain(ttl.map(|ttl| (None, ttl)));
    for (tenant, ttl) in tenants {
        let cutoff = now.saturating_sub(ttl);
        let found = match listing {
            Listing::Settled => tx.settled_sessions(tenant, cutoff).await?,
            Listing::Closed => tx.closed_sessions(tenant, cutoff).await?,
        };
        for (id, of) in found {
            // The default applies only to tenants without an override.
            if tenant.is_some() || !overrides.contains_key(&of) {
                due.push((id, cutoff));
            }
        }
    }
    due.sort();
    Ok(due)
}

pub(crate) async fn apply_retention<T: Tx>(
    tx: &mut T,
    policy: &RetentionPolicy,
) -> Result<RetentionReport, StoreError> {
    let now = tx.now().await?;
    let mut report = RetentionReport::default();
    let idle = due(
        tx,
        Listing::Settled,
        &policy.tenant_settled_session_ttl,
        policy.settled_session_ttl,
        now,
    )
    .await?;
    for (id, cutoff) in idle {
        // Re-checked under the lock: a command may have moved it meanwhile.
        let Some(mut session) = tx.session(&id, true).await? else {
            continue;
        };
        let left_alone = settled(session.status)
            && session.status != SessionStatus::Closed
            && session.updated_at <= cutoff;
        if left_alone {
            session.status = SessionStatus::Closed;
            session.closed_at = Some(now);
            save_session(tx, &mut session, now).await?;
            report.sessions_closed += 1;
        }
    }
    let doomed = due(
        tx,
        Listing::Closed,
        &policy.tenant_closed_session_ttl,
        policy.closed_session_ttl,
        now,
    )
    .await?;
    for (id, cutoff) in doomed {
        // Re-checked under the lock: the session may have been reopened meanwhile.
        let Some(session) = tx.session(&id, true).await? else {
            continue;
        };
        let expired = session.status == SessionStatus::Closed
            && session.closed_at.is_some_and(|closed| closed <= cutoff);
        if expired {
            tx.delete_session(&id).await?;
            report.sessions_deleted += 1;
        }
    }
    let history = due(
        tx,
        Listing::Closed,
        &policy.tenant_closed_history_ttl,
        policy.closed_history_ttl,
        now,
    )
    .await?;
    for (id, cutoff) in history {
        let Some(session) = tx.session(&id, true).await? else {
            continue;
        };
        if session.status == SessionStatus::Closed {
            let (events, items) = tx.prune_history(&id, cutoff).await?;
            report.events_pruned += events;
            report.items_pruned += items;
        }
    }
    report.checkpoints_pruned = tx
        .prune_checkpoints(now.saturating_sub(policy.superseded_checkpoint_ttl))
        .await?;
    report.commands_pruned = tx
        .prune_commands(now.saturating_sub(policy.idempotency_window))
        .await?;
    Ok(report)
}

/// A counter of a row we wrote ourselves, as the database's integer.
pub(crate) fn counter(value: u64) -> Result<i64, StoreError> {
    db_int("counter", value)
}

/// The idempotency record that remembers the event of a claim.
fn action_claim_key(action_id: &str, generation: u64) -> String {
    format!("corral:action-claim:{action_id}:{generation}")
}

/// Whose leases a start-up recovery takes over, besides expired ones.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Takeover<'a> {
    /// None: sessions under an unexpired lease are skipped.
    Expired,
    /// Every lease (the embedded store's single owner).
    Every,
    /// Those held by this replica name (a replica's previous incarnation).
    HeldBy(&'a str),
}

pub(crate) async fn recover_in_flight_effects<T: Tx>(
    tx: &mut T,
    reason: &str,
    takeover: Takeover<'_>,
) -> Result<usize, StoreError> {
    let now = tx.now().await?;
    let mut sessions = Vec::new();
    // Bounded: only sessions that are running something can have effects in flight.
    for status in [
        SessionStatus::Running,
        SessionStatus::Runnable,
        SessionStatus::Waiting,
        SessionStatus::Paused,
        SessionStatus::Cancelled,
        SessionStatus::Uncertain,
        SessionStatus::Failed,
        SessionStatus::Completed,
    ] {
        let filter = SessionFilter {
            statuses: vec![status],
            ..SessionFilter::default()
        };
        for session in tx.list_sessions(&filter).await? {
            sessions.push(session.id);
        }
    }
    sessions.sort();
    let mut changed = 0;
    for session_id in sessions {
        let reads = Reads {
            effects_in: Some(EffectsIn::Invoking(None)),
            ..Reads::locking(&session_id)
        };
        let found = tx.read(&reads).await?;
        let Some(mut session) = found.session else {
            continue;
        };
        let skip = match (&session.owner, takeover) {
            (Some(owner), Takeover::Expired) => owner.lease_expires_at > now,
            (Some(owner), Takeover::HeldBy(replica)) => {
                owner.lease_expires_at > now && owner.replica_id != replica
            }
            (Some(_), Takeover::Every) | (None, _) => false,
        };
        if skip {
            continue;
        }
        let effects = mark_uncertain(tx, &mut session, found.in_status, reason, now).await?;
        changed += effects;
        // The dead holder's lease is taken over at once: the session can be claimed now.
        let had_owner = session.owner.take().is_some();
        if effects > 0 {
            save_session(tx, &mut session, now).await?;
        } else if had_owner {
            tx.update_session(&session).await?;
        }
    }
    Ok(changed)
}

/// Statuses as one comma-separated parameter (empty: any).
pub(crate) fn status_list<S: Copy>(statuses: &[S], name: fn(S) -> &'static str) -> String {
    statuses
        .iter()
        .map(|status| name(*status))
        .collect::<Vec<_>>()
        .join(",")
}

pub(crate) async fn count_sessions<T: Tx>(
    tx: &mut T,
    statuses: &[SessionStatus],
) -> Result<Vec<SessionCount>, StoreError> {
    if statuses.is_empty() {
        return Ok(Vec::new());
    }
    tx.session_counts(&status_list(statuses, SessionStatus::as_str))
        .await
}

pub(crate) async fn page_sessions<T: Tx>(
    tx: &mut T,
    filter: &SessionFilter,
    after: Option<&str>,
    limit: usize,
) -> Result<Vec<Session>, StoreError> {
    let limit = require_page(limit)?;
    tx.sessions_page(filter, after.unwrap_or(""), limit).await
}
