//! The provider-neutral request, conversation and stream types.

use serde::{Deserialize, Serialize};

/// One model call: the host-composed instructions, the conversation so far and the tools offered.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ModelRequest {
    /// Host-composed instructions (the system prompt). Empty means none.
    pub system: String,
    /// The conversation, oldest first.
    pub messages: Vec<Message>,
    /// The tools the model may call.
    pub tools: Vec<ToolSpec>,
    /// The most output tokens the model may write in this call.
    pub max_output_tokens: u32,
    /// The number of model calls this conversation made before this one. Scripted models answer
    /// `reply[call_index]`; real providers ignore it.
    pub call_index: u64,
}

/// One item of a conversation.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "role", rename_all = "snake_case")]
pub enum Message {
    /// What the person wrote.
    User {
        /// The text.
        content: String,
    },
    /// What the model answered: text and/or tool calls.
    Assistant {
        /// The text (may be empty when the model only called tools).
        text: String,
        /// The tool calls, in the order the model made them.
        tool_calls: Vec<ToolCall>,
    },
    /// The result of one tool call, answering the [`ToolCall`] whose `id` is `tool_call_id`.
    Tool {
        /// The id of the call this answers.
        tool_call_id: String,
        /// The result as text (usually JSON).
        content: String,
        /// Whether the call failed; `content` then describes the failure.
        is_error: bool,
    },
}

/// A tool offered to the model.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ToolSpec {
    /// The name the model calls it by.
    pub name: String,
    /// What it does, for the model.
    pub description: String,
    /// The JSON Schema of its arguments (an object schema).
    pub input_schema: serde_json::Value,
}

/// A complete tool call made by the model.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ToolCall {
    /// The provider's id for the call (scripted models: `call_{call_index}_{i}`).
    pub id: String,
    /// The tool's name.
    pub name: String,
    /// The arguments, parsed from the JSON the model wrote.
    pub arguments: serde_json::Value,
}

/// Tokens counted by the provider for one call (estimated by the scripted model).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Usage {
    /// Tokens read: instructions, conversation and tools (cached tokens included).
    pub input_tokens: u64,
    /// Tokens written.
    pub output_tokens: u64,
}

/// Why the model stopped.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// It finished its answer.
    EndTurn,
    /// It wants its tool calls run.
    ToolUse,
    /// It hit `max_output_tokens`.
    MaxTokens,
    /// Another reason, as the provider named it (e.g. `content_filter`, `stop_sequence`).
    Other(String),
}

/// What a stream yields, in order: text deltas as they arrive, then complete tool calls, usage,
/// and exactly one `Done` last.
#[derive(Debug, Clone, PartialEq)]
pub enum ModelEvent {
    /// A piece of the answer's text.
    TextDelta(String),
    /// A complete tool call (arguments already parsed).
    ToolCall(ToolCall),
    /// The call's token counts.
    Usage(Usage),
    /// The end of a complete answer.
    Done(StopReason),
}

/// The complete answer of one model call (what the chat runtime journals).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ModelResponse {
    /// The whole text, the concatenation of every delta.
    pub text: String,
    /// The tool calls, in order.
    pub tool_calls: Vec<ToolCall>,
    /// The token counts (zero when the provider sent none).
    pub usage: Usage,
    /// Why the model stopped.
    pub stop_reason: StopReason,
}
