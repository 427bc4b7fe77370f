//! The seam between the server and the turn engine: the server decides *when* a turn segment
//! runs (commands, scheduling, leases, recovery); a [`TurnRunner`] executes one segment and says
//! how it ended. The production runner is the chat runtime (`corral-chat`); tests may plug in
//! their own.
//!
//! A segment re-executes its turn from the turn's start against the effects journal: completed
//! effects (model calls, capability calls, approvals) are taken from the journal, never run
//! twice. So the same job may be run again after a crash, an approval or an action result.

use std::sync::Arc;

use async_trait::async_trait;
use corral_store::{Fence, Session, SessionCommit, Store, TurnEffects};
use tokio_util::sync::CancellationToken;

/// A paused call waiting for a person, and a person's decision on one: the chat runtime's own
/// types, so a checkpoint it writes is read here without conversion.
pub use corral_chat::{Decision, Interaction};

/// One segment of a turn to execute.
#[derive(Debug, Clone)]
pub struct TurnJob {
    /// The store; every write the runner makes carries [`TurnJob::fence`].
    pub store: Arc<dyn Store>,
    /// The session row as claimed (manifest, owner, state). Its `id` is the store key
    /// `TENANT/ID` (see [`crate::tenancy`]), which the engine passes back to the store as is.
    pub session: Session,
    /// The lease the segment runs under.
    pub fence: Fence,
    /// The turn (the session's active turn).
    pub turn_id: String,
    /// The live checkpoint's segment number.
    pub segment: u64,
    /// The live checkpoint's data.
    pub checkpoint: TurnCheckpoint,
    /// The turn's journal, read when the lease was taken.
    pub journal: TurnEffects,
    /// Cancelled when the turn is cancelled or the server shuts down.
    pub cancel: CancellationToken,
}

/// The data of a turn's live checkpoint: the store's one checkpoint type. The store writes it
/// on `message` (segment 0) and on `approve`/`respond` (the next segment, one more decision);
/// the turn engine writes it when it suspends (the pending interactions).
pub use corral_store::TurnCheckpoint;

/// How a segment ended: the store applies it in [`corral_store::Store::finish_segment`].
pub use corral_store::SegmentOutcome as TurnOutcome;

/// How a segment's run ended: its outcome, and what the run's journal still held, which
/// [`corral_store::Store::finish_segment`] commits before the outcome in one transaction.
#[derive(Debug)]
pub struct Finished {
    /// The outcome.
    pub outcome: TurnOutcome,
    /// The journal's last writes, under the segment's fence (`None`: all are committed).
    pub held: Option<SessionCommit>,
}

impl From<TurnOutcome> for Finished {
    fn from(outcome: TurnOutcome) -> Self {
        Finished {
            outcome,
            held: None,
        }
    }
}

/// Executes turn segments.
#[async_trait]
pub trait TurnRunner: Send + Sync + std::fmt::Debug + 'static {
    /// Runs one segment to its end, every write committed. Never panics on bad input; errors
    /// are outcomes.
    async fn run(&self, job: TurnJob) -> TurnOutcome;

    /// Runs one segment to its end, leaving its last writes to be committed with its outcome
    /// (the scheduler's call); by default [`TurnRunner::run`], which leaves nothing.
    async fn run_segment(&self, job: TurnJob) -> Finished {
        self.run(job).await.into()
    }

    /// Checks at registration what would otherwise fail every turn of `manifest` (its model's
    /// provider has a key, its capabilities bind; with `start_mcp`, its MCP servers start and
    /// list their tools). The message names the manifest's field. Runners that need nothing
    /// beyond the manifest's own checks accept everything.
    async fn check(
        &self,
        manifest: &crate::manifest::Manifest,
        start_mcp: bool,
    ) -> Result<(), String> {
        let _ = (manifest, start_mcp);
        Ok(())
    }
}
