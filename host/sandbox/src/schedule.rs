//! Which ready completions reach the guest in each `resume` batch, and the calls a host holds
//! back: the two hooks exact replay and in-script approval are built on.
//!
//! The guest is deterministic given its inputs, so a script's source, its session's grants and
//! the sequence of batches determine everything it does (its calls, its value and its fuel). A
//! [`CompletionSchedule`] that records the batches of a run can therefore replay the run exactly
//! with a schedule that delivers the same batches in the same order.

use serde::{Deserialize, Serialize};

/// Chooses which ready completions are delivered to the guest in each `resume` batch. The chat
/// runtime records the batches of a script and, on replay, delivers the same batches in the same
/// order.
pub trait CompletionSchedule: Send {
    /// The guest is waiting (this is its `wait_index`-th wait of the script, from 0). `ready`
    /// lists the call ids whose completions are ready, in the order they finished;
    /// `fuel_consumed` is the fuel the script has used so far (0 without fuel metering). Return
    /// the call ids to deliver now, in delivery order (a subset of `ready`; may be empty = wait
    /// for more to finish).
    ///
    /// It may be asked several times for one wait, each time one more call has finished, until
    /// it returns a non-empty batch. Returning an id that is not in `ready` (or one id twice)
    /// ends the script with [`crate::ExecError::Schedule`], as does an empty batch when nothing
    /// else can ever become ready (no call is running or queued and none is held).
    fn next_batch(
        &mut self,
        wait_index: u32,
        ready: &[u32],
        fuel_consumed: u64,
    ) -> Result<Vec<u32>, ScheduleError>;

    /// Whether a call whose outcome is ready the moment the script starts it (its backend
    /// answered without waiting, or its input failed validation) is answered right there, from
    /// `start-call`, rather than in a batch: the script keeps running without a `waiting`, a
    /// `resume` and a crossing back, and sees an already settled promise. Asked once per
    /// script. The default is `false`, so every outcome goes through
    /// [`CompletionSchedule::next_batch`]: a schedule that records batches to replay a run
    /// exactly sees them all. ([`DeliverReady`] says `true`.)
    fn answers_at_start(&self) -> bool {
        false
    }
}

/// Delivers everything that is ready, in finishing order, and answers at start the calls that
/// are ready as they start (the default; what [`crate::ExecutorSession::run`] uses).
#[derive(Debug, Clone, Copy, Default)]
pub struct DeliverReady;

impl CompletionSchedule for DeliverReady {
    fn next_batch(
        &mut self,
        _wait_index: u32,
        ready: &[u32],
        _fuel_consumed: u64,
    ) -> Result<Vec<u32>, ScheduleError> {
        Ok(ready.to_vec())
    }

    fn answers_at_start(&self) -> bool {
        true
    }
}

/// Why a schedule refused to go on (e.g. a replay found a different script path): ends the
/// script with [`crate::ExecError::Schedule`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ScheduleError(pub String);

/// A call that does not complete in this run: its backend answered
/// [`crate::InvokeCapabilityError::Held`] (it waits for a person's approval or an external
/// executor). Reported by [`crate::ExecError::Suspended`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldCall {
    /// The guest's id of the call (unique within the script's session).
    pub call_id: u32,
    /// The id the backend was given (`<session>:<script>:<call>`).
    pub tool_call_id: String,
    /// The capability called.
    pub capability_id: String,
    /// Why the host holds it, as the backend said.
    pub reason: String,
}
