//! The long-lived tasks: the turn scheduler (claims runnable sessions and runs their segments
//! under a renewed lease) and the lease sweeper (expired executor claims become uncertain).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use corral_store::{
    CheckpointWrite, Lease, NewCheckpoint, NewEvent, NewItem, SessionCommit, SessionStatus,
    StoreError,
};
use serde_json::{Value, json};

use crate::runner::{TurnCheckpoint, TurnJob, TurnOutcome};
use crate::runtime::{Runtime, server_state};

/// How often the scheduler looks for runnable sessions without being woken (other replicas'
/// commands, leases that expired).
const POLL: Duration = Duration::from_millis(500);
/// How often the sweeper runs at most.
const SWEEP_MAX: Duration = Duration::from_secs(5);
/// Segments run at once by one replica.
const MAX_RUNNING: usize = 256;
/// Tries to apply an outcome against concurrent changes.
const ATTEMPTS: usize = 16;

/// The scheduler task: claims runnable sessions until shutdown.
pub(crate) async fn scheduler(runtime: Arc<Runtime>) {
    runtime.scheduler_up.store(true, Ordering::SeqCst);
    loop {
        claim_all(&runtime).await;
        tokio::select! {
            () = runtime.shutdown.cancelled() => break,
            () = runtime.wake.notified() => {}
            () = tokio::time::sleep(POLL) => {}
        }
    }
    runtime.scheduler_up.store(false, Ordering::SeqCst);
}

async fn claim_all(runtime: &Arc<Runtime>) {
    while !runtime.shutdown.is_cancelled() {
        let busy = runtime.running.lock().map_or(0, |r| r.len());
        if busy >= MAX_RUNNING {
            return;
        }
        let lease = runtime.config().lease;
        match runtime
            .timed(
                runtime
                    .store
                    .claim_runnable_session(&runtime.replica_id, lease),
            )
            .await
        {
            Ok(Some(lease)) => {
                let token = runtime.shutdown.child_token();
                if let Ok(mut running) = runtime.running.lock() {
                    running.insert(lease.session_id.clone(), token.clone());
                }
                let task = Arc::clone(runtime);
                runtime.tasks.spawn(async move {
                    let session_id = lease.session_id.clone();
                    run_segment(&task, lease, token).await;
                    if let Ok(mut running) = task.running.lock() {
                        running.remove(&session_id);
                    }
                    task.wake.notify_one();
                });
            }
            Ok(None) => return,
            Err(error) => {
                tracing::warn!(%error, "claiming a runnable session failed");
                return;
            }
        }
    }
}

/// Runs one segment of the leased session's turn and applies its outcome.
async fn run_segment(
    runtime: &Arc<Runtime>,
    lease: Lease,
    cancel: tokio_util::sync::CancellationToken,
) {
    let fence = lease.fence();
    let store = Arc::clone(&runtime.store);
    // Whatever was in flight when the previous holder stopped may or may not have happened.
    let stopped = "the replica running the turn stopped before the effect's outcome was recorded";
    if let Err(error) = in_flight_uncertain(runtime, &fence, stopped).await {
        tracing::warn!(%error, session = %fence.session_id, "recovery of in-flight effects failed");
        let _ = store.release_lease(&fence).await;
        return;
    }
    // Keep the lease while the segment runs; losing it stops the segment. A cancel command
    // taken by another replica (on PostgreSQL) reaches this one through the change feed: the
    // session's new events are checked, and a cancelled session stops the segment.
    let renewer = {
        let store = Arc::clone(&store);
        let fence = fence.clone();
        let cancel = cancel.clone();
        let lease = runtime.config().lease;
        let mut feed = store.subscribe_events();
        tokio::spawn(async move {
            let period = (lease / 3).max(Duration::from_millis(10));
            let mut renew_at = tokio::time::Instant::now() + period;
            loop {
                tokio::select! {
                    () = cancel.cancelled() => return,
                    () = tokio::time::sleep_until(renew_at) => {
                        renew_at = tokio::time::Instant::now() + period;
                        if let Err(error) = store.renew_lease(&fence, lease).await {
                            tracing::warn!(%error, session = %fence.session_id, "lost the session lease");
                            cancel.cancel();
                            return;
                        }
                    }
                    notice = feed.recv() => {
                        let ours = match &notice {
                            Ok(notice) => notice.session_id == fence.session_id,
                            // Lagged: some notice may have been ours.
                            Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => true,
                            Err(tokio::sync::broadcast::error::RecvError::Closed) => {
                                feed = store.subscribe_events();
                                false
                            }
                        };
                        if ours
                            && let Ok(session) = store.get_session(&fence.session_id).await
                            && session.status == corral_store::SessionStatus::Cancelled
                        {
                            cancel.cancel();
                            return;
                        }
                    }
                }
            }
        })
    };
    let outcome = prepare_and_run(runtime, &fence, &cancel).await;
    if let Some((turn_id, segment, outcome)) = outcome {
        runtime.metrics.turn(outcome_name(&outcome, &cancel));
        if let Err(error) = apply_outcome(runtime, &fence, &turn_id, segment, outcome).await {
            tracing::warn!(%error, session = %fence.session_id, "applying a turn outcome failed");
        }
    }
    if runtime.shutdown.is_cancelled() {
        // Aborted by the shutdown: what the segment had in flight may or may not happen. Say so
        // now, under the lease, rather than when the next start claims the session.
        let shut_down = "the server shut down before the effect's outcome was recorded";
        if let Err(error) = in_flight_uncertain(runtime, &fence, shut_down).await {
            tracing::warn!(%error, session = %fence.session_id, "marking in-flight effects at shutdown failed");
        }
    }
    renewer.abort();
    let _ = store.release_lease(&fence).await;
}

/// Marks the session's in-flight effects uncertain for `reason`, and counts them.
async fn in_flight_uncertain(
    runtime: &Runtime,
    fence: &corral_store::Fence,
    reason: &str,
) -> Result<(), corral_store::StoreError> {
    let changed = runtime
        .store
        .mark_in_flight_effects_uncertain(fence, reason)
        .await?;
    runtime.metrics.effects("uncertain", changed.len());
    Ok(())
}

fn outcome_name(
    outcome: &TurnOutcome,
    cancel: &tokio_util::sync::CancellationToken,
) -> &'static str {
    match outcome {
        TurnOutcome::Completed { .. } => "completed",
        TurnOutcome::Paused { .. } => "paused",
        TurnOutcome::Waiting { .. } => "waiting",
        TurnOutcome::Uncertain { .. } => "uncertain",
        TurnOutcome::Failed { .. } => "failed",
        TurnOutcome::Cancelled if cancel.is_cancelled() => "cancelled",
        TurnOutcome::Cancelled => "aborted",
    }
}

/// Marks the session running and runs the segment; `None` when there is nothing to run.
async fn prepare_and_run(
    runtime: &Arc<Runtime>,
    fence: &corral_store::Fence,
    cancel: &tokio_util::sync::CancellationToken,
) -> Option<(String, u64, TurnOutcome)> {
    let store = &runtime.store;
    for _ in 0..ATTEMPTS {
        let session = store.get_session(&fence.session_id).await.ok()?;
        if !matches!(
            session.status,
            SessionStatus::Runnable | SessionStatus::Running
        ) {
            return None;
        }
        let live = store.live_checkpoint(&session.id).await.ok()?;
        let (turn_id, live) = match (&session.active_turn_id, live) {
            (Some(turn), Some(live)) if &live.turn_id == turn => (turn.clone(), live),
            _ => {
                // Runnable without a turn to run: fail it rather than claim it forever.
                let mut commit = SessionCommit::new(&session.id);
                commit.fence = Some(fence.clone());
                commit.expect_version = Some(session.version);
                commit.patch.status = Some(SessionStatus::Failed);
                commit.patch.active_turn_id = Some(None);
                let error = json!({"code": "no_checkpoint", "message": "the turn has no checkpoint to run from"});
                commit.patch.state = Some(server_state(&session.state, Value::Null, error.clone()));
                let mut event = NewEvent::new("turn.failed", json!({"error": error}));
                if let Some(turn) = &session.active_turn_id {
                    event = event.in_turn(turn);
                }
                commit.events.push(event);
                let _ = store.commit(commit).await;
                return None;
            }
        };
        let checkpoint: TurnCheckpoint = match serde_json::from_value(live.data) {
            Ok(checkpoint) => checkpoint,
            Err(error) => {
                tracing::error!(%error, session = %session.id, "unreadable checkpoint");
                return Some((
                    turn_id,
                    live.segment,
                    TurnOutcome::Failed {
                        code: "bad_checkpoint".to_owned(),
                        message: "the turn's checkpoint cannot be read".to_owned(),
                    },
                ));
            }
        };
        if session.status != SessionStatus::Running {
            let mut commit = SessionCommit::new(&session.id);
            commit.fence = Some(fence.clone());
            commit.expect_version = Some(session.version);
            commit.patch.status = Some(SessionStatus::Running);
            match store.commit(commit).await {
                Ok(_) => {}
                Err(StoreError::Conflict { .. }) => continue,
                Err(_) => return None,
            }
        }
        let mut session = session;
        session.status = SessionStatus::Running;
        let job = TurnJob {
            store: Arc::clone(store),
            session,
            fence: fence.clone(),
            turn_id: turn_id.clone(),
            segment: live.segment,
            checkpoint,
            cancel: cancel.clone(),
        };
        let runner = Arc::clone(&runtime.runner);
        let outcome = match tokio::spawn(async move { runner.run(job).await }).await {
            Ok(outcome) => outcome,
            Err(error) => {
                tracing::error!(%error, session = %fence.session_id, "the turn engine panicked");
                TurnOutcome::Failed {
                    code: "internal_error".to_owned(),
                    message: "the turn engine failed".to_owned(),
                }
            }
        };
        return Some((turn_id, live.segment, outcome));
    }
    None
}

/// Applies a segment's outcome in one commit guarded by the fence, the session version and
/// the active turn (a cancelled or superseded turn changes nothing).
async fn apply_outcome(
    runtime: &Arc<Runtime>,
    fence: &corral_store::Fence,
    turn_id: &str,
    segment: u64,
    outcome: TurnOutcome,
) -> Result<(), StoreError> {
    let store = &runtime.store;
    for _ in 0..ATTEMPTS {
        let session = store.get_session(&fence.session_id).await?;
        if session.status == SessionStatus::Cancelled
            || session.active_turn_id.as_deref() != Some(turn_id)
        {
            return Ok(());
        }
        let mut commit = SessionCommit::new(&session.id);
        commit.fence = Some(fence.clone());
        commit.expect_version = Some(session.version);
        let state = |waits: Value, error: Value| server_state(&session.state, waits, error);
        match &outcome {
            TurnOutcome::Completed { output, items } => {
                commit.items = items
                    .iter()
                    .map(|item| NewItem::new(item.clone()).in_turn(turn_id))
                    .collect();
                commit.patch.status = Some(SessionStatus::Completed);
                commit.patch.active_turn_id = Some(None);
                commit.patch.state = Some(state(Value::Null, Value::Null));
                commit.checkpoint = Some(CheckpointWrite::Clear);
                commit.events.push(
                    NewEvent::new("turn.completed", json!({"output": output})).in_turn(turn_id),
                );
            }
            TurnOutcome::Paused { checkpoint } => {
                let interactions = serde_json::to_value(&checkpoint.pending).unwrap_or(Value::Null);
                let data = serde_json::to_value(checkpoint).unwrap_or(Value::Null);
                commit.patch.status = Some(SessionStatus::Paused);
                commit.patch.state = Some(state(interactions.clone(), Value::Null));
                commit.checkpoint = Some(CheckpointWrite::Put(NewCheckpoint::new(
                    turn_id, segment, data,
                )));
                commit.events.push(
                    NewEvent::new("turn.paused", json!({"interactions": interactions}))
                        .in_turn(turn_id),
                );
            }
            TurnOutcome::Waiting { effect_ids } => {
                let waits = json!({"effectIds": effect_ids});
                match session.status {
                    // A result arrived while the segment ran: run again.
                    SessionStatus::Runnable => {
                        runtime.wake.notify_one();
                        return Ok(());
                    }
                    SessionStatus::Uncertain => {
                        commit.patch.state = Some(state(waits, Value::Null));
                    }
                    _ => {
                        commit.patch.status = Some(SessionStatus::Waiting);
                        commit.patch.state = Some(state(waits.clone(), Value::Null));
                        commit
                            .events
                            .push(NewEvent::new("turn.waiting", waits).in_turn(turn_id));
                    }
                }
            }
            TurnOutcome::Uncertain { effect_ids } => {
                commit.patch.status = Some(SessionStatus::Uncertain);
                commit.patch.state = Some(state(json!({"effectIds": effect_ids}), Value::Null));
            }
            TurnOutcome::Failed { code, message } => {
                let error = json!({"code": code, "message": message});
                commit.patch.status = Some(SessionStatus::Failed);
                commit.patch.active_turn_id = Some(None);
                commit.patch.state = Some(state(Value::Null, error.clone()));
                commit.checkpoint = Some(CheckpointWrite::Clear);
                commit
                    .events
                    .push(NewEvent::new("turn.failed", json!({"error": error})).in_turn(turn_id));
            }
            // A cancel command already wrote everything; a shutdown leaves the session running,
            // to be recovered at the next start.
            TurnOutcome::Cancelled => return Ok(()),
        }
        match runtime.timed(store.commit(commit)).await {
            Ok(_) => return Ok(()),
            Err(StoreError::Conflict { .. }) => continue,
            Err(error) => return Err(error),
        }
    }
    Ok(())
}

/// The lease sweeper: every `min(lease, 5 s)`, expired executor claims become uncertain.
pub(crate) async fn sweeper(runtime: Arc<Runtime>) {
    let period = runtime.config().lease.min(SWEEP_MAX);
    loop {
        match runtime.store.expire_action_claims().await {
            Ok(expired) => {
                runtime.metrics.lease_expiries(expired.len());
                runtime.metrics.effects("uncertain", expired.len());
            }
            Err(error) => tracing::warn!(%error, "expiring executor claims failed"),
        }
        tokio::select! {
            () = runtime.shutdown.cancelled() => return,
            () = tokio::time::sleep(period) => {}
        }
    }
}
