//! The long-lived tasks: the turn scheduler (claims runnable sessions and runs their segments
//! under a renewed lease) and the lease sweeper (expired executor claims become uncertain).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use corral_store::{Segment, SegmentEnd, SegmentStart};

use crate::runner::{Finished, TurnJob, TurnOutcome};
use crate::runtime::Runtime;

/// How often the scheduler looks for runnable sessions without being woken (other replicas'
/// commands, leases that expired).
const POLL: Duration = Duration::from_millis(500);
/// How often the sweeper runs at most.
const SWEEP_MAX: Duration = Duration::from_secs(5);
/// Segments run at once by one replica.
const MAX_RUNNING: usize = 256;

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

/// Claims runnable sessions until none is left (each claim says whether another one was
/// claimable then) or [`MAX_RUNNING`] segments run. What makes a session claimable afterwards
/// wakes the scheduler: a command, a segment's end that leaves its session runnable, a slot
/// freed at [`MAX_RUNNING`], or the poll (other replicas, expired leases).
async fn claim_all(runtime: &Arc<Runtime>) {
    while !runtime.shutdown.is_cancelled() {
        let busy = runtime.running.lock().map_or(0, |r| r.len());
        if busy >= MAX_RUNNING {
            return;
        }
        let lease = runtime.config().lease;
        let start = runtime
            .timed(runtime.store.start_segment(&runtime.replica_id, lease))
            .await;
        let segment = match start {
            Ok(SegmentStart::Run(segment)) => segment,
            Ok(SegmentStart::Settled {
                effects_uncertain,
                others_claimable,
                ..
            }) => {
                runtime.metrics.effects("uncertain", effects_uncertain);
                if others_claimable {
                    continue;
                }
                return;
            }
            Ok(_) => return,
            Err(error) => {
                // Not "nothing to run": counted, logged, and tried again at the next wake-up.
                runtime.metrics.store_error("start_segment");
                tracing::warn!(%error, "starting a turn segment failed");
                return;
            }
        };
        runtime
            .metrics
            .effects("uncertain", segment.effects_uncertain);
        // A segment outlives the shutdown signal by its grace period (see `Server::run`).
        let token = runtime.abort.child_token();
        let session_id = segment.session.id.clone();
        let others_claimable = segment.others_claimable;
        if let Ok(mut running) = runtime.running.lock() {
            running.insert(session_id.clone(), token.clone());
        }
        let task = Arc::clone(runtime);
        runtime.tasks.spawn(async move {
            run_segment(&task, *segment, token).await;
            let freed_at_capacity = task.running.lock().is_ok_and(|mut running| {
                let full = running.len() >= MAX_RUNNING;
                running.remove(&session_id);
                full
            });
            // The scheduler stopped claiming for want of a slot: there is one now.
            if freed_at_capacity {
                task.wake.notify_one();
            }
        });
        if !others_claimable {
            return;
        }
    }
}

/// Runs one segment of the leased session's turn and applies its outcome.
async fn run_segment(
    runtime: &Arc<Runtime>,
    segment: Segment,
    cancel: tokio_util::sync::CancellationToken,
) {
    let fence = segment.lease.fence();
    // Which replica ran which lease of a session, for operators (and the replica suite, which
    // proves from these lines that two replicas never ran one session at once).
    tracing::debug!(target: "corral_server::segments", session = %fence.session_id,
        generation = fence.generation, replica = %fence.replica_id, "segment started");
    let store = Arc::clone(&runtime.store);
    // Keep the lease while the segment runs; losing it stops the segment. A cancel command
    // taken by another replica (on PostgreSQL) reaches this one through the change feed: a
    // `turn.cancelled` notice of this session stops the segment.
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
                        let cancelled = match &notice {
                            Ok(notice) => notice.session_id == fence.session_id && notice.cancelled,
                            // Lagged: some notice may have been a cancel; the store says.
                            Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => store
                                .get_session(&fence.session_id)
                                .await
                                .is_ok_and(|s| s.status == corral_store::SessionStatus::Cancelled),
                            Err(tokio::sync::broadcast::error::RecvError::Closed) => {
                                feed = store.subscribe_events();
                                false
                            }
                        };
                        if cancelled {
                            cancel.cancel();
                            return;
                        }
                    }
                }
            }
        })
    };
    let turn_id = segment.turn_id.clone();
    let (tenant, agent) = (
        segment.session.tenant_id.clone(),
        segment.session.agent_id.clone(),
    );
    let job = TurnJob {
        store: Arc::clone(&store),
        session: segment.session,
        fence: fence.clone(),
        turn_id: segment.turn_id,
        segment: segment.segment,
        checkpoint: segment.checkpoint,
        journal: segment.journal,
        cancel: cancel.clone(),
    };
    let runner = Arc::clone(&runtime.runner);
    let Finished { outcome, held } =
        match tokio::spawn(async move { runner.run_segment(job).await }).await {
            Ok(finished) => finished,
            Err(error) => {
                tracing::error!(%error, session = %fence.session_id, "the turn engine panicked");
                Finished::from(TurnOutcome::Failed {
                    code: "internal_error".to_owned(),
                    message: "the turn engine failed".to_owned(),
                })
            }
        };
    runtime
        .metrics
        .turn(&tenant, &agent, outcome_name(&outcome, &cancel));
    // Aborted when the shutdown's grace period ended: what the segment had in flight may or
    // may not happen. Said now, under the lease, rather than when the next start claims it.
    let shut_down = runtime
        .abort
        .is_cancelled()
        .then_some("the server shut down before the effect's outcome was recorded");
    renewer.abort();
    // Logged before the finish commits, so this line precedes any later holder's start line.
    tracing::debug!(target: "corral_server::segments", session = %fence.session_id,
        generation = fence.generation, replica = %fence.replica_id, "segment finishing");
    let finished = match held {
        None => {
            runtime
                .timed(store.finish_segment(&fence, &turn_id, None, outcome, shut_down))
                .await
        }
        Some(held) => {
            let finished = runtime
                .timed(store.finish_segment(
                    &fence,
                    &turn_id,
                    Some(held),
                    outcome.clone(),
                    shut_down,
                ))
                .await;
            match finished {
                // The run's last writes were refused, as the journal's own commit would have
                // been (the lease lost, a guard): the run ends as one whose last commit failed.
                // Counted as a failed finish; the turn was counted by the outcome its run
                // reported.
                Err(error) => {
                    runtime.metrics.store_error("finish_segment");
                    tracing::warn!(%error, session = %fence.session_id,
                        "the segment's last journal writes failed");
                    let failed = TurnOutcome::Failed {
                        code: "store_error".to_owned(),
                        message: error.to_string(),
                    };
                    runtime
                        .timed(store.finish_segment(&fence, &turn_id, None, failed, shut_down))
                        .await
                }
                ok => ok,
            }
        }
    };
    match finished {
        Ok((end, uncertain)) => {
            tracing::debug!(target: "corral_server::segments", session = %fence.session_id,
                generation = fence.generation, replica = %fence.replica_id, "segment finished");
            runtime.metrics.effects("uncertain", uncertain);
            if end == SegmentEnd::RunAgain {
                runtime.wake.notify_one();
            }
        }
        Err(error) => {
            // The lease runs out and another start takes the session over.
            runtime.metrics.store_error("finish_segment");
            tracing::warn!(%error, session = %fence.session_id, "finishing a turn segment failed");
        }
    }
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

/// The lease sweeper: every `min(lease, 5 s)`, expired executor claims become uncertain.
pub(crate) async fn sweeper(runtime: Arc<Runtime>) {
    let period = runtime.config().lease.min(SWEEP_MAX);
    loop {
        match runtime.store.expire_action_claims().await {
            Ok(expired) => {
                runtime.metrics.lease_expiries(expired.len());
                runtime.metrics.effects("uncertain", expired.len());
            }
            Err(error) => {
                runtime.metrics.store_error("expire_action_claims");
                tracing::warn!(%error, "expiring executor claims failed");
            }
        }
        tokio::select! {
            () = runtime.shutdown.cancelled() => return,
            () = tokio::time::sleep(period) => {}
        }
    }
}

/// The retention task: every `[retention] intervalMs`, one pass of the configured policy (each
/// pass bounded in rows; a full batch runs again at once), counted in `/metrics`.
pub(crate) async fn retention(runtime: Arc<Runtime>) {
    let retention = runtime.config().retention.clone();
    loop {
        tokio::select! {
            () = runtime.shutdown.cancelled() => return,
            () = tokio::time::sleep(retention.interval) => {}
        }
        retention_pass(&runtime, &retention.policy).await;
    }
}

/// Runs retention passes until one removes less than a full batch of sessions.
pub(crate) async fn retention_pass(runtime: &Runtime, policy: &corral_store::RetentionPolicy) {
    loop {
        match runtime.store.apply_retention(policy).await {
            Ok(report) => {
                runtime.metrics.retention(&report);
                let full = report.sessions_deleted >= RETENTION_BATCH
                    || report.sessions_closed >= RETENTION_BATCH;
                if !full || runtime.shutdown.is_cancelled() {
                    return;
                }
            }
            Err(error) => {
                runtime.metrics.store_error("apply_retention");
                tracing::warn!(%error, "a retention pass failed");
                return;
            }
        }
    }
}

/// Sessions one retention pass handles at most per step (the store's batch).
const RETENTION_BATCH: u64 = 500;
