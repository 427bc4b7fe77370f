//! The seam between the server and the turn engine: the server decides *when* a turn segment
//! runs (commands, scheduling, leases, recovery); a [`TurnRunner`] executes one segment and says
//! how it ended. The production runner is the chat runtime (`corral-chat`); tests may plug in
//! their own.
//!
//! A segment re-executes its turn from the turn's start against the effects journal: completed
//! effects (model calls, capability calls, approvals) are taken from the journal, never run
//! twice. So the same job may be run again after a crash, an approval or an action result.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use corral_store::{Fence, Session, Store};
use serde::{Deserialize, Serialize};
use serde_json::Value;
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
    /// Cancelled when the turn is cancelled or the server shuts down.
    pub cancel: CancellationToken,
}

/// The data of a turn's live checkpoint (the store's checkpoint `data`). The server writes it on
/// `message` (segment 0: the message, nothing decided) and on `approve` (next segment: one more
/// decision); the runner writes it when it suspends (the pending interactions).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TurnCheckpoint {
    /// Format version, 1.
    pub version: u32,
    /// The turn.
    pub turn_id: String,
    /// The user message that started the turn.
    pub message: String,
    /// Interactions the turn is paused on (empty unless paused).
    #[serde(default)]
    pub pending: Vec<Interaction>,
    /// Decisions taken so far in this turn, by interaction id.
    #[serde(default)]
    pub decisions: BTreeMap<String, Decision>,
    /// Fingerprint of the catalog, manifest and implementation version the turn was suspended
    /// under; a resume under another fingerprint is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fingerprint: Option<String>,
}

impl TurnCheckpoint {
    /// The checkpoint of a new turn.
    pub fn new_turn(turn_id: impl Into<String>, message: impl Into<String>) -> Self {
        TurnCheckpoint {
            version: 1,
            turn_id: turn_id.into(),
            message: message.into(),
            pending: Vec::new(),
            decisions: BTreeMap::new(),
            fingerprint: None,
        }
    }
}

/// How a segment ended.
#[derive(Debug, Clone, PartialEq)]
pub enum TurnOutcome {
    /// The turn finished: `output` is `{"text": ...}` plus usage and steps; `items` are the
    /// conversation items the turn adds (appended by the server with the completion).
    Completed {
        /// What `turn.completed` carries.
        output: Value,
        /// Conversation items to append.
        items: Vec<Value>,
    },
    /// The turn needs a person: the checkpoint (already written by the runner under the
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
    /// The runner observed [`TurnJob::cancel`].
    Cancelled,
}

/// Executes turn segments.
#[async_trait]
pub trait TurnRunner: Send + Sync + std::fmt::Debug + 'static {
    /// Runs one segment to its end. Never panics on bad input; errors are outcomes.
    async fn run(&self, job: TurnJob) -> TurnOutcome;
}
