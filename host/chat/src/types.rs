//! What a run is given and what it returns.

use std::collections::BTreeMap;
use std::sync::Arc;

use corral_catalog::{Catalog, Redactor};
use corral_models::{Message, Model, Usage};
use corral_sandbox::{Backend, InvocationContext, ScriptUser};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::executor::ExecutorFactory;
use crate::journal::ConversationStore;
use crate::sink::EventSink;

/// The model's size limits, in tokens. Compaction keeps each request within
/// `context_window - max_output`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ModelLimits {
    /// The model's context window.
    pub context_window: u32,
    /// The most tokens one answer may have.
    pub max_output: u32,
    /// The most tokens one tool result may take in the model's context (estimated as
    /// compaction does): a larger result is cut to fit, keeping its shape, and stays whole in
    /// the journal for later scripts (`tools.$result`). See [`crate::fit_to_budget`].
    #[serde(default = "default_result_tokens")]
    pub result_tokens: u32,
    /// The most tokens `run_js`'s description may spend on declarations: a catalog whose
    /// declarations would take more is listed a line per capability instead, and the model
    /// looks declarations up with `tools.$search` and `tools.$describe`. See
    /// [`corral_catalog::render_prompt_within`].
    #[serde(default = "default_discovery_tokens")]
    pub discovery_tokens: u32,
}

fn default_result_tokens() -> u32 {
    crate::fit::DEFAULT_RESULT_TOKENS
}

fn default_discovery_tokens() -> u32 {
    corral_catalog::DEFAULT_DISCOVERY_TOKENS
}

impl Default for ModelLimits {
    fn default() -> Self {
        ModelLimits {
            context_window: 128_000,
            max_output: 4_096,
            result_tokens: crate::fit::DEFAULT_RESULT_TOKENS,
            discovery_tokens: corral_catalog::DEFAULT_DISCOVERY_TOKENS,
        }
    }
}

/// Who decides before a tool runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalPolicy {
    /// Every `run_js` (and, in direct mode, each capability that needs approval) is approved
    /// before anything runs: before the executor exists.
    #[default]
    Script,
    /// Scripts run ungated; each call to a capability that needs approval pauses the turn with
    /// that call's arguments, and continues the script by exact replay once decided.
    Calls,
}

/// A resumption of a suspended turn.
#[derive(Debug, Clone, PartialEq)]
pub struct Resume {
    /// The permission checkpoint the turn was suspended at.
    pub suspension: SuspensionContext,
    /// The decision for every pending interaction that has none yet.
    pub approved: bool,
    /// Why, shown to the model on a rejection.
    pub reason: Option<String>,
}

/// Everything one run of a turn needs. A run re-executes its turn from the start against the
/// effects journal in [`Input::store`]: what completed before is taken from there.
#[derive(Clone)]
pub struct Input {
    /// The streaming model.
    pub model: Arc<dyn Model>,
    /// The model's limits.
    pub limits: ModelLimits,
    /// The conversation's store: history, journal, checkpoints.
    pub store: Arc<dyn ConversationStore>,
    /// The turn (stable across its segments: effect ids derive from it).
    pub turn_id: String,
    /// The user message that starts the turn.
    pub message: String,
    /// A positive step budget (model calls per turn).
    pub max_steps: u32,
    /// Receives the run's events.
    pub sink: Arc<dyn EventSink>,
    /// Runs capability calls (authorizes every one).
    pub backend: Arc<dyn Backend>,
    /// Applied to direct tools' results before the model or an event sees them (scripts'
    /// results are redacted by their executor).
    pub redactor: Arc<Redactor>,
    /// The authorized capability subset.
    pub capabilities: Arc<Catalog>,
    /// Capabilities run by external executors (kind `action`), by id.
    pub action_capabilities: Vec<String>,
    /// Creates the executor for `run_js` (JS mode); never called in direct mode.
    pub executor_factory: Option<Arc<dyn ExecutorFactory>>,
    /// Host-composed instructions (the system prompt, before the `run_js` prompt).
    pub instructions: String,
    /// Each capability as its own model tool instead of `run_js`.
    pub direct_tools: bool,
    /// Approve every gate without asking (journaled like a person's approval).
    pub auto_confirm: bool,
    /// Where the gates are.
    pub approval: ApprovalPolicy,
    /// The user shown to scripts (display only).
    pub user: Option<ScriptUser>,
    /// The attribution every backend invocation of the turn carries, bound by the host and
    /// never by a script: the session (its id as the host's users know it), its tenant, its
    /// owner and any attributes. The runtime sets `run_id` to the turn, and each call's effect
    /// id is its `tool_call_id` (and the `effectId` attribute). An empty `session_id` means the
    /// turn id; a missing `user_id`, the id of [`Input::user`].
    pub context: InvocationContext,
    /// Fingerprint of the catalog, manifest and implementation version; a suspension taken under
    /// another fingerprint is refused.
    pub fingerprint: String,
    /// Decisions already taken in this turn (from the live checkpoint), by interaction id.
    pub decisions: BTreeMap<String, Decision>,
    /// Set when resuming a permission suspension.
    pub resume: Option<Resume>,
    /// The W3C `traceparent` of the command that started the turn (the checkpoint's
    /// `traceContext`): the turn's first run joins that trace, a resumed run links to it. Kept
    /// in the checkpoint a suspension writes.
    pub trace_context: Option<String>,
}

impl std::fmt::Debug for Input {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Input")
            .field("model", &self.model.describe())
            .field("turn_id", &self.turn_id)
            .field("max_steps", &self.max_steps)
            .field("capabilities", &self.capabilities.len())
            .field("direct_tools", &self.direct_tools)
            .field("auto_confirm", &self.auto_confirm)
            .field("approval", &self.approval)
            .field("resume", &self.resume.is_some())
            .finish_non_exhaustive()
    }
}

/// A durable permission checkpoint: what a suspended turn needs to be resumed, in another
/// process if need be. It is the store's turn checkpoint, one type for the chat runtime and the
/// server.
pub type SuspensionContext = corral_store::TurnCheckpoint;

pub use corral_store::{Decision, Interaction};

/// How a run ended.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum RunResult {
    /// The model answered without asking for more tools.
    Completed {
        /// The final answer.
        text: String,
        /// Tokens used by every model call of the turn.
        usage: Usage,
        /// Model calls made.
        steps: u32,
        /// The conversation items the turn adds (to append to the history).
        items: Vec<Value>,
    },
    /// Waiting for a person: the checkpoint is already durable.
    Suspended {
        /// Resume from this.
        suspension: SuspensionContext,
    },
    /// Waiting for external executors to finish these effects.
    Waiting {
        /// The effect (action) ids.
        effect_ids: Vec<String>,
    },
    /// These effects may or may not have happened; the turn stops until the host decides.
    Uncertain {
        /// The uncertain effect ids.
        effect_ids: Vec<String>,
    },
    /// The step budget ran out before the model finished.
    StepBudgetExhausted {
        /// Steps made.
        steps: u32,
    },
    /// Cancelled through the run's token.
    Cancelled,
    /// The turn failed; the conversation is unchanged.
    Failed {
        /// `model_error`, `effect_drift`, `store_error`, `executor_error`.
        code: String,
        /// A message safe to show.
        message: String,
    },
}

/// One conversation item as stored: a message, or a compaction that replaces what came before.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ConversationItem {
    /// A message.
    Message {
        /// The message.
        message: Message,
    },
    /// Everything before this item is replaced by `summary` followed by `kept`.
    Compaction {
        /// The model-written summary of the replaced messages.
        summary: String,
        /// Recent messages kept verbatim.
        kept: Vec<Message>,
    },
}

/// Turns stored items into the conversation a model sees: from the last compaction on.
pub fn conversation_from_items(items: &[ConversationItem]) -> Vec<Message> {
    let start = items
        .iter()
        .rposition(|item| matches!(item, ConversationItem::Compaction { .. }));
    let mut messages = Vec::new();
    let rest = match start {
        Some(at) => {
            if let ConversationItem::Compaction { summary, kept } = &items[at] {
                messages.push(summary_message(summary));
                messages.extend(kept.iter().cloned());
            }
            &items[at + 1..]
        }
        None => items,
    };
    for item in rest {
        if let ConversationItem::Message { message } = item {
            messages.push(message.clone());
        }
    }
    messages
}

pub(crate) fn summary_message(summary: &str) -> Message {
    Message::User {
        content: format!("[Summary of the earlier conversation]\n{summary}"),
    }
}

/// Why a run could not start or went wrong in the host (not the model's or the script's doing).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// The input is unusable (a zero step budget, a missing executor factory in JS mode...).
    #[error("invalid run input: {0}")]
    Usage(String),
    /// The catalog cannot be rendered for the model; nothing was called.
    #[error("the catalog cannot be rendered: {0}")]
    Render(#[from] corral_catalog::RenderSchemaError),
    /// The checkpoint does not fit this agent any more (catalog, manifest or version changed),
    /// or is not a permission suspension of this turn.
    #[error("incompatible checkpoint: {0}")]
    IncompatibleCheckpoint(String),
    /// The store failed.
    #[error("the store failed: {0}")]
    Store(#[from] crate::journal::JournalError),
}
