//! corral's chat runtime: a model talks, writes JavaScript against the capability catalog,
//! pauses for a person's approval, and picks up exactly where it stopped — in another process
//! if need be — without running any completed tool call twice.
//!
//! ```no_run
//! use std::sync::Arc;
//! use corral_chat::{Input, ModelLimits, ApprovalPolicy, RunResult, StoreJournal, VecSink, SandboxExecutorFactory};
//! # async fn example(input: Input) -> Result<(), Box<dyn std::error::Error>> {
//! let cancel = tokio_util::sync::CancellationToken::new();
//! match corral_chat::run(&cancel, input).await? {
//!     RunResult::Completed { text, .. } => println!("{text}"),
//!     RunResult::Suspended { suspension } => println!("approve {:?}", suspension.pending),
//!     other => println!("{other:?}"),
//! }
//! # Ok(()) }
//! ```
//!
//! # Core concepts
//!
//! - [`run`] executes one **turn** from its start against the **effects journal** of its
//!   [`ConversationStore`]. Every model call (`{turn}:s{step}:model`), capability call
//!   (`{turn}:s{step}:t{k}:c{call}` in a script, `...:t{k}:call` for a direct tool), approval,
//!   script batch (`...:t{k}:b{wait}`) and tool result (`...:t{k}:result`) has an id derived
//!   from its position, so re-running the turn — after an approval, an executor's result or a
//!   crash — takes completed effects from the journal and never performs them again. A request
//!   that differs from the journaled one fails the turn as `effect_drift`.
//! - **JS mode** exposes one `run_js` tool (`{"code": SCRIPT}`) described by the rendered
//!   catalog; **direct mode** exposes each capability as a tool and never allocates an
//!   executor. The executor is allocated lazily on the first approved script, serves every
//!   script of one uninterrupted run (`globalThis` persists) and is closed on every exit.
//! - **Approval** ([`ApprovalPolicy`]): `script` gates every `run_js` before the executor
//!   exists; `calls` lets scripts run and pauses the turn at each call to a capability that
//!   needs approval. A pause writes a durable [`SuspensionContext`] before the permission event.
//!   Resuming re-runs the turn: the script is **replayed exactly** — the same completion
//!   batches in the same order, checked against the fuel journaled at each batch.
//! - **Events** go to an [`EventSink`] as they happen; replays emit nothing twice.
//! - **Compaction** summarizes older messages (never separating a tool call from its result)
//!   when a request would exceed [`ModelLimits`], as a journaled model call.
//! - **Results that fit**: a tool result over [`ModelLimits::result_tokens`] reaches the model
//!   cut to fit, keeping its shape ([`fit_to_budget`]); the journal keeps it whole, and a later
//!   script of the turn reads it with `tools.$result({id})` without it entering the context.
//! - [`javascript_tool`] (S1.5) gives task loops the same executor machinery without approval.

#![deny(missing_docs)]
#![forbid(unsafe_code)]
// A run ends early by returning its final `RunResult` through `Err` inside the loop; it is not
// an error value and is built once per run, so boxing it would only add noise.
#![allow(clippy::result_large_err)]

pub mod backends;
mod compaction;
mod emit;
mod executor;
mod fit;
mod history;
mod intrinsics;
mod journal;
mod js_tool;
mod replay;
mod run;
mod sink;
mod types;
mod util;

pub use compaction::{estimate_tokens, split_point};
pub use executor::{ExecutorFactory, ExecutorRequest, SandboxExecutorFactory};
pub use fit::{
    DEFAULT_RESULT_TOKENS, Fitted, MIN_OBJECT_KEYS, MIN_RESULT_TOKENS, fit_to_budget, json_len,
    tokens_of_bytes,
};
pub use history::HistoryCache;
pub use journal::{
    ActionRequest, ConversationStore, JournalError, Journaled, RESULT_WINDOW, StoreJournal,
};
pub use js_tool::{CloseJavaScriptTool, JavaScriptTool, UseJavaScriptToolError, javascript_tool};
pub use run::{RUN_JS, check_suspension, direct_tool_name, run, run_js_tool};
pub use sink::{CallCost, EventSink, NullSink, RunEvent, RunEventKind, SinkError, VecSink};
pub use types::{
    ApprovalPolicy, ConversationItem, Decision, Input, Interaction, ModelLimits, Resume, RunError,
    RunResult, SuspensionContext, conversation_from_items,
};
pub use util::{canonical_json, sha256_canonical, sha256_hex, sha256_json};
