//! A model that answers from a list of replies, for tests and demos.

use std::path::Path;

use futures::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::call::final_events;
use crate::{
    Model, ModelError, ModelEvent, ModelRequest, ModelStream, StopReason, ToolCall, Usage,
};

/// What the scripted model answers past the end of its replies.
pub const NO_MORE_REPLIES: &str = "(the scripted model has no more replies)";

/// One scripted answer: `{"text": "..."}` and/or `{"toolCalls": [{"name", "arguments"}]}`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ScriptedReply {
    /// The text of the answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// The tool calls of the answer, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ScriptedToolCall>,
}

/// One scripted tool call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ScriptedToolCall {
    /// The tool's name, e.g. `run_js`.
    pub name: String,
    /// Its arguments, e.g. `{"code": "return 1"}` (`{}` when absent).
    #[serde(default = "empty_object")]
    pub arguments: Value,
}

fn empty_object() -> Value {
    Value::Object(serde_json::Map::new())
}

/// Answers `replies[request.call_index]`, so a conversation replayed or resumed in another
/// process gets the same answer for the same call. Past the end it answers
/// [`NO_MORE_REPLIES`]. Text streams as word-sized deltas, then the tool calls (ids
/// `call_{call_index}_{i}`), usage estimated at one token per four characters, and
/// `Done(ToolUse)` when there are tool calls, else `Done(EndTurn)`.
#[derive(Debug, Clone, PartialEq)]
pub struct ScriptedModel {
    replies: Vec<ScriptedReply>,
}

impl ScriptedModel {
    /// A model answering `replies` in order.
    pub fn new(replies: Vec<ScriptedReply>) -> Self {
        ScriptedModel { replies }
    }

    /// Parses a JSON list of replies. Unknown fields and replies with neither text nor tool
    /// calls are errors.
    pub fn from_json_str(json: &str) -> Result<Self, ModelError> {
        let replies: Vec<ScriptedReply> =
            serde_json::from_str(json).map_err(|error| ModelError::Config {
                message: format!("invalid scripted replies: {error}"),
            })?;
        if let Some(index) = replies
            .iter()
            .position(|reply| reply.text.is_none() && reply.tool_calls.is_empty())
        {
            return Err(ModelError::Config {
                message: format!(
                    "invalid scripted replies: reply {index} has neither text nor toolCalls"
                ),
            });
        }
        Ok(Self::new(replies))
    }

    /// Reads [`from_json_str`](Self::from_json_str) from a file.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, ModelError> {
        let path = path.as_ref();
        let json = std::fs::read_to_string(path).map_err(|error| ModelError::Config {
            message: format!(
                "cannot read scripted replies from {}: {error}",
                path.display()
            ),
        })?;
        Self::from_json_str(&json).map_err(|error| match error {
            ModelError::Config { message } => ModelError::Config {
                message: format!("{}: {message}", path.display()),
            },
            other => other,
        })
    }

    /// The replies.
    pub fn replies(&self) -> &[ScriptedReply] {
        &self.replies
    }

    /// The events answering `request`.
    fn events(&self, request: &ModelRequest) -> Vec<ModelEvent> {
        let reply = usize::try_from(request.call_index)
            .ok()
            .and_then(|index| self.replies.get(index));
        let (text, calls) = match reply {
            Some(reply) => (
                reply.text.clone().unwrap_or_default(),
                reply.tool_calls.as_slice(),
            ),
            None => (NO_MORE_REPLIES.to_owned(), &[][..]),
        };
        let tool_calls: Vec<ToolCall> = calls
            .iter()
            .enumerate()
            .map(|(i, call)| ToolCall {
                id: format!("call_{}_{i}", request.call_index),
                name: call.name.clone(),
                arguments: call.arguments.clone(),
            })
            .collect();
        let input_chars = request.system.chars().count()
            + serde_json::to_string(&request.messages).map_or(0, |json| json.chars().count())
            + serde_json::to_string(&request.tools).map_or(0, |json| json.chars().count());
        let output_chars = text.chars().count()
            + tool_calls
                .iter()
                .map(|call| call.name.chars().count() + call.arguments.to_string().chars().count())
                .sum::<usize>();
        let usage = Usage {
            input_tokens: estimate_tokens(input_chars),
            output_tokens: estimate_tokens(output_chars),
        };
        let stop_reason = if tool_calls.is_empty() {
            StopReason::EndTurn
        } else {
            StopReason::ToolUse
        };
        word_pieces(&text)
            .into_iter()
            .map(|piece| ModelEvent::TextDelta(piece.to_owned()))
            .chain(final_events(tool_calls, usage, stop_reason))
            .collect()
    }
}

/// One token per four characters, rounded up: the usual rough figure for English and code.
fn estimate_tokens(chars: usize) -> u64 {
    u64::try_from(chars.div_ceil(4)).unwrap_or(u64::MAX)
}

/// Splits `text` into pieces that each end after a run of whitespace (as a provider streams
/// words); the pieces concatenate back to `text`.
fn word_pieces(text: &str) -> Vec<&str> {
    let mut pieces = Vec::new();
    let mut start = 0;
    let mut in_space = false;
    for (at, c) in text.char_indices() {
        if c.is_whitespace() {
            in_space = true;
        } else if in_space {
            pieces.push(&text[start..at]);
            start = at;
            in_space = false;
        }
    }
    if start < text.len() {
        pieces.push(&text[start..]);
    }
    pieces
}

#[async_trait::async_trait]
impl Model for ScriptedModel {
    fn describe(&self) -> String {
        "scripted".to_owned()
    }

    async fn stream(&self, request: ModelRequest) -> Result<ModelStream, ModelError> {
        Ok(futures::stream::iter(self.events(&request).into_iter().map(Ok)).boxed())
    }
}

#[cfg(test)]
mod tests {
    use super::word_pieces;

    #[test]
    fn word_pieces_concatenate_back() {
        for text in ["", "one", "one two  three", "  lead", "trail  ", "é à\nü"] {
            assert_eq!(word_pieces(text).concat(), text);
        }
        assert_eq!(word_pieces("one two  three"), ["one ", "two  ", "three"]);
    }
}
