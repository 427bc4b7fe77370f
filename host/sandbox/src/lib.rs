//! corral's JavaScript sandbox: model-written scripts run in QuickJS inside a WebAssembly
//! component under wasmtime, reach the world only through capability calls, and are stopped by
//! limits the script cannot see or catch.
//!
//! ```no_run
//! use std::sync::Arc;
//! use corral_catalog::Catalog;
//! use corral_sandbox::{
//!     Backend, Invocation, InvocationContext, InvokeCapabilityError, Sandbox, SandboxConfig,
//!     SessionOptions, ToolResult,
//! };
//!
//! struct Echo;
//!
//! #[async_trait::async_trait]
//! impl Backend for Echo {
//!     async fn invoke(
//!         &self,
//!         _context: &InvocationContext,
//!         call: Invocation,
//!     ) -> Result<ToolResult, InvokeCapabilityError> {
//!         Ok(ToolResult::new(call.argument().clone()))
//!     }
//! }
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let sandbox = Sandbox::new(SandboxConfig::default())?;
//! let catalog = Catalog::from_json_str(
//!     r#"{"capabilities": [{"id": "examples.echo", "input_schema": {"type": "object"}}]}"#,
//! )?;
//! let mut session = sandbox
//!     .session(SessionOptions::new(Arc::new(catalog), Arc::new(Echo)))
//!     .await?;
//! let report = session
//!     .run("const [a, b] = await Promise.all([tools.examples.echo({n: 1}), tools.examples.echo({n: 2})]);\n\
//!           return a.n + b.n;")
//!     .await;
//! assert_eq!(report.outcome?, Some(serde_json::json!(3)));
//! println!("fuel {} in {} us", report.stats.fuel, report.stats.wall_us);
//! # Ok(()) }
//! ```
//!
//! # Core concepts
//!
//! - [`Sandbox`]: one per process. Holds the wasmtime engine (fuel, epochs, the pooling
//!   allocator with copy-on-write memory images), the guest compiled once and cached on disk,
//!   and an `InstancePre` from which sessions are instantiated. The guest it embeds was
//!   pre-initialized at build time, so a session starts with QuickJS already running.
//! - [`ExecutorSession`]: one guest instance, created by [`Sandbox::session`] from
//!   [`SessionOptions`] (the authorized capabilities, a [`Backend`], limits, grants, the user).
//!   [`ExecutorSession::run`] runs scripts one after another; `globalThis` persists between them.
//!   After any limit or trap the session refuses further scripts.
//! - [`Backend`]: the host's implementation of capability calls. The sandbox validates every
//!   call's input against the capability's JSON Schema first, runs calls concurrently up to
//!   [`SessionLimits::max_concurrent_calls`], and redacts results before the script sees them.
//! - [`SessionLimits`] and [`Limit`]: fuel, deadline, memory, stack, call counts, result and
//!   log sizes, all enforced outside the realm; each produces [`ExecError::LimitExceeded`]
//!   naming the limit and how many calls had started.
//! - [`Grants`]: the ambient authority the guest gets. None by default.
//! - The resumable world: the guest returns `waiting` when a script only waits on calls, and
//!   the session hands it the next *batch* of completions. A [`CompletionSchedule`] given to
//!   [`ExecutorSession::run_scheduled`] chooses each batch ([`DeliverReady`], the default,
//!   delivers everything ready, and answers a call ready as it starts from `start-call`
//!   itself), so a host can record a script's batches and replay it exactly (same calls, same
//!   value, same fuel; a schedule answers at start only if
//!   [`CompletionSchedule::answers_at_start`] says so). A backend may hold a call
//!   ([`InvokeCapabilityError::Held`], for approval): when only held calls are left, the script
//!   ends with [`ExecError::Suspended`] listing them.
//! - [`ScriptReport`]: the value or error, the logs and the [`RunStats`] (fuel, wall time, peak
//!   memory, calls) of every run, on every path.

#![deny(missing_docs)]
#![deny(unsafe_code)]

mod backend;
mod bindings;
mod calls;
mod engine;
pub mod examples;
mod grants;
mod json;
mod limits;
mod preflight;
mod schedule;
mod session;

pub use backend::{
    AttachmentRef, Backend, Invocation, InvocationContext, InvokeCapabilityError, ToolResult,
};
pub use engine::{
    CompiledFrom, FUEL_YIELD_INTERVAL, GUEST_MAX_MEMORY_BYTES, LoadGuestError, MAX_STACK_BYTES,
    Sandbox, SandboxConfig,
};
pub use grants::{ClockGrant, EntropyGrant, Grants};
pub use limits::{Limit, MAX_TIMEOUT_MS, SessionLimits};
pub use preflight::{MAX_REPORTED_PATHS, PreflightError, UnknownPath, preflight};
pub use schedule::{CompletionSchedule, DeliverReady, HeldCall, ScheduleError};
pub use session::{
    CreateSessionError, ExecError, ExecutorSession, LOG_RECORD_OVERHEAD_BYTES, LogRecord,
    MAX_ERROR_MESSAGE_BYTES, MAX_ERROR_NAME_BYTES, MAX_ERROR_STACK_BYTES, RunStats, ScriptError,
    ScriptReport, ScriptUser, SessionOptions,
};
