//! Streaming language models for corral: one trait, adapters for the OpenAI Chat Completions
//! and Anthropic Messages streaming APIs, and a scripted model for tests and demos.
//!
//! ```
//! use corral_models::{Message, Model, ModelRequest, RetryPolicy, ScriptedModel, StopReason, call_with_retry};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), corral_models::ModelError> {
//! // A real provider: corral_models::model_from_spec("openai:gpt-4o")? (key from OPENAI_API_KEY).
//! let model = ScriptedModel::from_json_str(
//!     r#"[{"text": "Let me look.", "toolCalls": [{"name": "run_js", "arguments": {"code": "return 1"}}]},
//!         {"text": "It is 1."}]"#,
//! )?;
//! let request = ModelRequest {
//!     system: "You are helpful.".into(),
//!     messages: vec![Message::User { content: "What is one?".into() }],
//!     tools: vec![],
//!     max_output_tokens: 1024,
//!     call_index: 0,
//! };
//! let mut shown = String::new();
//! let response = call_with_retry(&model, &request, &RetryPolicy::default(), |delta| shown.push_str(delta)).await?;
//! assert_eq!(shown, "Let me look.");
//! assert_eq!(response.tool_calls[0].id, "call_0_0");
//! assert_eq!(response.stop_reason, StopReason::ToolUse);
//! # Ok(())
//! # }
//! ```
//!
//! # Core concepts
//!
//! - [`Model`]: `stream(ModelRequest) -> ModelStream`. A stream yields [`ModelEvent`]s in a
//!   fixed order: text deltas as they arrive, then complete tool calls (arguments parsed), then
//!   [`Usage`], then exactly one [`ModelEvent::Done`]. A stream that ends without `Done` was cut
//!   off. Dropping the stream cancels the HTTP request.
//! - [`ModelRequest`] / [`Message`]: a provider-neutral conversation (user text, assistant text
//!   with tool calls, tool results) that each adapter maps to its wire format.
//! - [`collect`] drains a stream into one [`ModelResponse`], the unit the chat runtime journals;
//!   [`call_with_retry`] adds bounded retries under a documented rule (never after text reached
//!   the caller) so the caller only ever sees a complete response or an error.
//! - [`ModelError`]: typed failures (`rate_limited`, `server_error`, `rejected`, `truncated`,
//!   `malformed`, `transport`, `config`) with [`ModelError::is_retryable`] and
//!   [`ModelError::code`].
//! - [`OpenAiModel`], [`AnthropicModel`]: the HTTP adapters; [`ProviderConfig`] builds them from
//!   environment variables or a JSON file; [`model_from_spec`] from `openai:MODEL`,
//!   `anthropic:MODEL` or `scripted:FILE.json`.
//! - [`ApiKey`]: the key prints as `[redacted]` and is scrubbed from every error message,
//!   including provider error bodies that echo it.
//! - [`ScriptedModel`]: answers `replies[call_index]` from a JSON list of
//!   `{"text"}` / `{"toolCalls": [{"name", "arguments"}]}` replies, deterministically, so runs
//!   replay exactly.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod anthropic;
mod call;
mod config;
mod error;
mod http;
mod openai;
mod scripted;
mod types;

pub use anthropic::{ANTHROPIC_VERSION, AnthropicModel};
pub use call::{Model, ModelStream, RetryPolicy, call_with_retry, collect};
pub use config::{
    ANTHROPIC_DEFAULT_BASE_URL, ApiKey, OPENAI_DEFAULT_BASE_URL, Provider, ProviderConfig,
    model_from_spec,
};
pub use error::ModelError;
pub use openai::OpenAiModel;
pub use scripted::{NO_MORE_REPLIES, ScriptedModel, ScriptedReply, ScriptedToolCall};
pub use types::{
    Message, ModelEvent, ModelRequest, ModelResponse, StopReason, ToolCall, ToolSpec, Usage,
};
