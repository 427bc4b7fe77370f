//! Every limit a session enforces, in one place, and the machinery that enforces them outside
//! the guest: fuel (deterministic guest work), the wall-clock deadline (the clock read at fuel
//! yields, or epoch interruption without fuel, plus a timer on host waits), the linear-memory cap (a [`wasmtime::ResourceLimiter`]), the stack
//! (the engine's wasm stack limit), and the counters for calls, result and log sizes.

use std::collections::BTreeMap;
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// Limits applied to each script a session runs. Every limit, when hit, stops the script with
/// [`crate::ExecError::LimitExceeded`] naming it, and the session is discarded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SessionLimits {
    /// Fuel per script: a deterministic measure of guest work (roughly one unit per wasm
    /// instruction). Time spent waiting on capability calls costs no fuel.
    pub fuel: u64,
    /// Wall-clock budget per script in milliseconds, covering guest work and waiting on calls
    /// alike.
    pub timeout_ms: u64,
    /// Cap on the guest's linear memory, in bytes (the whole QuickJS heap, stack and data).
    pub memory_bytes: u64,
    /// Calls allowed in flight at once; further calls wait in a queue until one completes.
    pub max_concurrent_calls: u32,
    /// Calls a script may start in all.
    pub max_total_calls: u32,
    /// Size of the JSON text of a script's result.
    pub max_result_bytes: u64,
    /// Total size of a script's log messages and fields.
    pub max_log_bytes: u64,
    /// Size of a script's source text.
    pub max_script_bytes: u64,
    /// Bytes of call inputs and results the host holds for a script at once: inputs of calls
    /// queued or running, and results not yet handed to the script. Calls a script starts
    /// without awaiting them are otherwise held on the host, outside the guest's memory cap.
    pub max_call_bytes: u64,
}

impl Default for SessionLimits {
    fn default() -> Self {
        SessionLimits {
            fuel: 2_000_000_000,
            timeout_ms: 30_000,
            memory_bytes: 64 << 20,
            max_concurrent_calls: 8,
            max_total_calls: 1_000,
            max_result_bytes: 1 << 20,
            max_log_bytes: 256 << 10,
            max_script_bytes: 256 << 10,
            max_call_bytes: 32 << 20,
        }
    }
}

/// The longest [`SessionLimits::timeout_ms`] a session accepts: one day.
pub const MAX_TIMEOUT_MS: u64 = 24 * 60 * 60 * 1000;

impl SessionLimits {
    /// Checks that every limit is in its range, given the sandbox's
    /// [`crate::SandboxConfig::max_memory_bytes`]: fuel and the timeout at least 1 (a zero
    /// budget would make the outcome depend on when the engine first looks), the timeout at
    /// most [`MAX_TIMEOUT_MS`], memory at most `max_memory_bytes`, at least one concurrent
    /// call. (Whether the memory cap fits the guest's initial memory is known when the guest is
    /// instantiated: see [`crate::CreateSessionError::MemoryBelowGuestStart`].)
    pub fn check(&self, max_memory_bytes: u64) -> Result<(), String> {
        if self.fuel == 0 {
            return Err("fuel must be at least 1".into());
        }
        if !(1..=MAX_TIMEOUT_MS).contains(&self.timeout_ms) {
            return Err(format!(
                "timeout_ms must be between 1 and {MAX_TIMEOUT_MS}, not {}",
                self.timeout_ms
            ));
        }
        if self.memory_bytes > max_memory_bytes {
            return Err(format!(
                "memory_bytes {} is above the sandbox's max_memory_bytes {max_memory_bytes}",
                self.memory_bytes
            ));
        }
        if self.max_concurrent_calls == 0 {
            return Err("max_concurrent_calls must be at least 1".into());
        }
        Ok(())
    }
}

/// Which limit stopped a script.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Limit {
    /// [`SessionLimits::fuel`] ran out.
    Fuel,
    /// [`SessionLimits::timeout_ms`] passed.
    Deadline,
    /// [`SessionLimits::memory_bytes`] would have been exceeded.
    Memory,
    /// The engine's stack limit ([`crate::SandboxConfig::max_stack_bytes`]) was exhausted,
    /// typically by unbounded recursion.
    Stack,
    /// [`SessionLimits::max_total_calls`] calls were already started.
    TotalCalls,
    /// The result's JSON text exceeded [`SessionLimits::max_result_bytes`].
    ResultSize,
    /// Logs exceeded [`SessionLimits::max_log_bytes`].
    LogSize,
    /// Call inputs and undelivered results exceeded [`SessionLimits::max_call_bytes`].
    CallMemory,
}

impl Limit {
    /// The stable, machine-readable kind of error this limit produces (as printed by
    /// `corral exec`).
    pub fn kind(self) -> &'static str {
        match self {
            Limit::Fuel => "fuel_exhausted",
            Limit::Deadline => "deadline_exceeded",
            Limit::Memory => "memory_limit",
            Limit::Stack => "stack_overflow",
            Limit::TotalCalls => "too_many_calls",
            Limit::ResultSize => "result_too_large",
            Limit::LogSize => "logs_too_large",
            Limit::CallMemory => "call_memory_limit",
        }
    }
}

/// A limit a host function or the resource limiter hit; raised as a trap so the guest cannot
/// catch it, and recognised again when the trap reaches [`crate::ExecutorSession::run`].
#[derive(Debug, Clone, thiserror::Error)]
#[error("{limit:?} limit exceeded: {detail}")]
pub(crate) struct LimitTrap {
    pub(crate) limit: Limit,
    pub(crate) detail: String,
}

/// How a script stopped at its deadline is reported, however the deadline was enforced (fuel
/// yields, epochs, or an epoch trap).
pub(crate) const DEADLINE_DETAIL: &str = "the script ran past its deadline";

impl LimitTrap {
    pub(crate) fn error(limit: Limit, detail: impl Into<String>) -> wasmtime::Error {
        wasmtime::Error::new(LimitTrap {
            limit,
            detail: detail.into(),
        })
    }

    /// The error that stops a script at its deadline.
    pub(crate) fn deadline() -> wasmtime::Error {
        Self::error(Limit::Deadline, DEADLINE_DETAIL)
    }
}

/// Caps linear memory growth and records the high-water mark.
///
/// Refusing growth with an error (not `Ok(false)`) traps the guest, so the limit is enforced
/// outside the realm: QuickJS never sees a failed allocation it could turn into a catchable
/// exception.
#[derive(Debug)]
pub(crate) struct MemoryLimiter {
    pub(crate) limit_bytes: u64,
    pub(crate) peak_bytes: u64,
    /// The size of the first growth refused while nothing has grown yet: the guest's initial
    /// memory, when the cap is below it.
    pub(crate) refused_bytes: Option<u64>,
}

impl wasmtime::ResourceLimiter for MemoryLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let desired = desired as u64;
        if desired > self.limit_bytes {
            if self.peak_bytes == 0 && current == 0 {
                self.refused_bytes.get_or_insert(desired);
            }
            return Err(LimitTrap::error(
                Limit::Memory,
                format!(
                    "linear memory would grow from {current} to {desired} bytes, over the {} byte cap",
                    self.limit_bytes
                ),
            ));
        }
        self.peak_bytes = self.peak_bytes.max(desired);
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        // QuickJS never grows its function table; a guest that tries is misbehaving.
        Ok(desired <= 100_000)
    }
}

/// Runs guest code until it finishes or `deadline` passes, whichever comes first.
///
/// With the deadline enforced by fuel, the guest yields every
/// [`crate::engine::FUEL_YIELD_INTERVAL`] units of fuel: each yield comes back here as
/// `Pending`, the clock is read, and past the deadline the guest's future is dropped, which
/// unwinds its fiber (the session is discarded after a limit, so the interrupted instance is
/// never entered again). Host functions never wait, so the guest is pending only at yields (or
/// epoch yields, which this also serves).
///
/// A yield that finds time left resumes the guest here at once, without going back to the
/// async executor, until [`COOPERATIVE_SLICE`] has passed since this poll began; only then is
/// `Pending` handed up (the yield has already woken the task, so the executor polls it again
/// after the other tasks that are ready). An epoch yield, [`DeadlineTicker::YIELD_PERIOD`]
/// after the last, always ends the slice, so a sandbox without fuel still gives its thread back
/// at every tick. A fuel yield comes every few microseconds: handing each one to the executor
/// cost about 5% of a CPU-bound script's time (`fib(30)`), for a cooperation that a slice gives
/// as well. The clock is still read at every yield, so the deadline is exactly as precise as
/// before.
pub(crate) async fn until_deadline<T>(
    deadline: Instant,
    guest: impl Future<Output = wasmtime::Result<T>>,
) -> wasmtime::Result<T> {
    let mut guest = std::pin::pin!(guest);
    std::future::poll_fn(|cx| {
        let slice_end = Instant::now() + COOPERATIVE_SLICE;
        loop {
            match guest.as_mut().poll(cx) {
                std::task::Poll::Pending => {
                    let now = Instant::now();
                    if now >= deadline {
                        return std::task::Poll::Ready(Err(LimitTrap::deadline()));
                    }
                    if now >= slice_end {
                        return std::task::Poll::Pending;
                    }
                }
                ready => return ready,
            }
        }
    })
    .await
}

/// How long a CPU-bound script runs between returns to the async executor (see
/// [`until_deadline`]): the longest another task on the same worker thread waits for it.
pub(crate) const COOPERATIVE_SLICE: Duration = Duration::from_millis(1);

/// Wakes running scripts when their deadline passes.
///
/// Epoch interruption is how wasmtime stops guest code cheaply: compiled code checks the
/// engine's epoch at loop heads and function entries. Rather than ticking the epoch on a fixed
/// period (which would bound precision by the period), one thread sleeps until the earliest
/// registered deadline and bumps the epoch then; each store's epoch callback compares the clock
/// with its own deadline, so stores whose deadline is later simply continue. While scripts are
/// running it also ticks every [`DeadlineTicker::YIELD_PERIOD`] so long computations yield to
/// the async executor instead of holding a worker thread.
#[derive(Debug)]
pub(crate) struct DeadlineTicker {
    shared: Arc<TickerShared>,
}

#[derive(Debug, Default)]
struct TickerShared {
    state: Mutex<TickerState>,
    wake: Condvar,
}

#[derive(Debug, Default)]
struct TickerState {
    /// Registered deadlines -> how many scripts share that instant.
    deadlines: BTreeMap<Instant, usize>,
    stopped: bool,
}

/// Unregisters a deadline when dropped (on every exit path of a run).
#[derive(Debug)]
pub(crate) struct DeadlineGuard {
    shared: Weak<TickerShared>,
    at: Instant,
}

impl DeadlineTicker {
    /// Period of the cooperative yield tick while any script runs.
    pub(crate) const YIELD_PERIOD: Duration = Duration::from_millis(10);

    pub(crate) fn start(engine: wasmtime::Engine) -> std::io::Result<DeadlineTicker> {
        let shared = Arc::new(TickerShared::default());
        let thread_shared = Arc::downgrade(&shared);
        std::thread::Builder::new()
            .name("corral-epoch".into())
            .spawn(move || tick_loop(&thread_shared, &engine))?;
        Ok(DeadlineTicker { shared })
    }

    pub(crate) fn register(&self, at: Instant) -> DeadlineGuard {
        let mut state = lock(&self.shared.state);
        // The thread only needs waking when it sleeps past this deadline: nothing was
        // registered (it sleeps long) or this one comes first.
        let wake = state
            .deadlines
            .keys()
            .next()
            .is_none_or(|first| at < *first);
        *state.deadlines.entry(at).or_insert(0) += 1;
        drop(state);
        if wake {
            self.shared.wake.notify_one();
        }
        DeadlineGuard {
            shared: Arc::downgrade(&self.shared),
            at,
        }
    }
}

impl Drop for DeadlineTicker {
    fn drop(&mut self) {
        lock(&self.shared.state).stopped = true;
        self.shared.wake.notify_one();
    }
}

impl Drop for DeadlineGuard {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.upgrade() {
            let mut state = lock(&shared.state);
            if let Some(count) = state.deadlines.get_mut(&self.at) {
                *count -= 1;
                if *count == 0 {
                    state.deadlines.remove(&self.at);
                }
            }
        }
    }
}

fn lock(mutex: &Mutex<TickerState>) -> std::sync::MutexGuard<'_, TickerState> {
    // The state is a plain map; a panic elsewhere cannot leave it inconsistent.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn tick_loop(shared: &Weak<TickerShared>, engine: &wasmtime::Engine) {
    loop {
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let mut state = lock(&shared.state);
        if state.stopped {
            return;
        }
        let now = Instant::now();
        // Deadlines that passed are bumped once and dropped from the wait set; their guards
        // remove nothing then.
        let expired: Vec<Instant> = state.deadlines.range(..=now).map(|(at, _)| *at).collect();
        if !expired.is_empty() {
            for at in expired {
                state.deadlines.remove(&at);
            }
            engine.increment_epoch();
        }
        let wait = match state.deadlines.keys().next() {
            Some(next) => next
                .saturating_duration_since(now)
                .min(DeadlineTicker::YIELD_PERIOD),
            None => Duration::from_secs(3600),
        };
        let running = !state.deadlines.is_empty();
        let (state, timeout) = shared
            .wake
            .wait_timeout(state, wait)
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let yield_due = running && timeout.timed_out() && wait == DeadlineTicker::YIELD_PERIOD;
        drop(state);
        if yield_due {
            engine.increment_epoch();
        }
    }
}
