//! The OpenAI Chat Completions streaming adapter (also for OpenAI-compatible servers).

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Value, json};

use crate::call::final_events;
use crate::http::{self, SseDecoder};
use crate::{
    ApiKey, Message, Model, ModelError, ModelEvent, ModelRequest, ModelStream, ProviderConfig,
    StopReason, ToolCall, Usage,
};

/// A model behind the Chat Completions API: `POST {base_url}/chat/completions` with
/// `stream: true` and `stream_options.include_usage`, authenticated with `Authorization: Bearer`.
///
/// Mapping: the system prompt is the first `system` message; an assistant message carries its
/// `tool_calls` (`arguments` as a JSON string); a tool result is a `tool` message, its content
/// prefixed with `Error: ` when the call failed (the API has no error flag). The output limit is
/// sent as `max_completion_tokens`.
#[derive(Debug, Clone)]
pub struct OpenAiModel {
    client: reqwest::Client,
    endpoint: String,
    model: String,
    api_key: ApiKey,
    idle_timeout: Duration,
}

impl OpenAiModel {
    /// An adapter for `config` (its provider is not checked).
    pub fn new(config: &ProviderConfig) -> Result<Self, ModelError> {
        Ok(OpenAiModel {
            client: http::client()?,
            endpoint: format!("{}/chat/completions", config.effective_base_url()),
            model: config.model.clone(),
            api_key: config.api_key.clone(),
            idle_timeout: http::DEFAULT_IDLE_TIMEOUT,
        })
    }

    /// How long the stream may be silent before it counts as cut off (default 120 s).
    pub fn with_idle_timeout(mut self, idle_timeout: Duration) -> Self {
        self.idle_timeout = idle_timeout;
        self
    }

    /// The JSON body sent for `request`.
    pub fn request_body(&self, request: &ModelRequest) -> Value {
        let mut messages = Vec::with_capacity(request.messages.len() + 1);
        if !request.system.is_empty() {
            messages.push(json!({"role": "system", "content": request.system}));
        }
        for message in &request.messages {
            messages.push(match message {
                Message::User { content } => json!({"role": "user", "content": content}),
                Message::Assistant { text, tool_calls } => {
                    let mut item = json!({
                        "role": "assistant",
                        "content": if text.is_empty() { Value::Null } else { Value::String(text.clone()) },
                    });
                    if !tool_calls.is_empty() {
                        item["tool_calls"] = tool_calls
                            .iter()
                            .map(|call| {
                                json!({
                                    "id": call.id,
                                    "type": "function",
                                    "function": {"name": call.name, "arguments": call.arguments.to_string()},
                                })
                            })
                            .collect();
                    }
                    item
                }
                Message::Tool { tool_call_id, content, is_error } => json!({
                    "role": "tool",
                    "tool_call_id": tool_call_id,
                    "content": if *is_error { format!("Error: {content}") } else { content.clone() },
                }),
            });
        }
        let mut body = json!({
            "model": self.model,
            "stream": true,
            "stream_options": {"include_usage": true},
            "max_completion_tokens": request.max_output_tokens,
            "messages": messages,
        });
        if !request.tools.is_empty() {
            body["tools"] = request
                .tools
                .iter()
                .map(|tool| {
                    json!({
                        "type": "function",
                        "function": {"name": tool.name, "description": tool.description, "parameters": tool.input_schema},
                    })
                })
                .collect();
        }
        body
    }
}

#[async_trait::async_trait]
impl Model for OpenAiModel {
    fn describe(&self) -> String {
        format!("openai:{}", self.model)
    }

    async fn stream(&self, request: ModelRequest) -> Result<ModelStream, ModelError> {
        let builder = self
            .client
            .post(&self.endpoint)
            .bearer_auth(self.api_key.expose_secret())
            .header(reqwest::header::ACCEPT, "text/event-stream")
            .json(&self.request_body(&request));
        let response = http::send(builder, &self.api_key).await?;
        Ok(http::sse_stream(
            response,
            ChunkDecoder::default(),
            self.api_key.clone(),
            self.idle_timeout,
        ))
    }
}

#[derive(Deserialize)]
struct Chunk {
    #[serde(default)]
    choices: Vec<Choice>,
    #[serde(default)]
    usage: Option<ChunkUsage>,
    #[serde(default)]
    error: Option<Value>,
}

#[derive(Deserialize)]
struct Choice {
    #[serde(default)]
    index: u64,
    #[serde(default)]
    delta: Option<Delta>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct Delta {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    tool_calls: Vec<ToolCallDelta>,
}

#[derive(Deserialize)]
struct ToolCallDelta {
    index: u64,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    function: Option<FunctionDelta>,
}

#[derive(Deserialize)]
struct FunctionDelta {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    arguments: Option<String>,
}

#[derive(Deserialize)]
struct ChunkUsage {
    #[serde(default)]
    prompt_tokens: u64,
    #[serde(default)]
    completion_tokens: u64,
}

#[derive(Default)]
struct PartialCall {
    id: String,
    name: String,
    arguments: String,
}

/// Chunks in, events out. Text goes out at once; tool calls are put together by `index` and
/// their arguments parsed when the stream is complete.
#[derive(Default)]
struct ChunkDecoder {
    calls: BTreeMap<u64, PartialCall>,
    finish_reason: Option<String>,
    usage: Usage,
}

impl ChunkDecoder {
    fn finish(&mut self, out: &mut VecDeque<ModelEvent>) -> Result<(), ModelError> {
        let Some(reason) = self.finish_reason.take() else {
            return Err(ModelError::Truncated {
                message: "the stream ended without a finish_reason".to_owned(),
            });
        };
        let mut tool_calls = Vec::with_capacity(self.calls.len());
        for (index, call) in std::mem::take(&mut self.calls) {
            if call.name.is_empty() {
                return Err(ModelError::Malformed {
                    message: format!("tool call {index} has no name"),
                });
            }
            let arguments = if call.arguments.trim().is_empty() {
                json!({})
            } else {
                serde_json::from_str(&call.arguments).map_err(|error| ModelError::Malformed {
                    message: format!(
                        "the arguments of tool call {} ({}) are not valid JSON: {error}",
                        call.name,
                        http::shorten(call.arguments.clone())
                    ),
                })?
            };
            let id = if call.id.is_empty() {
                format!("call_{index}")
            } else {
                call.id
            };
            tool_calls.push(ToolCall {
                id,
                name: call.name,
                arguments,
            });
        }
        let stop_reason = match reason.as_str() {
            // Some compatible servers say "stop" after tool calls.
            _ if !tool_calls.is_empty() => StopReason::ToolUse,
            "stop" => StopReason::EndTurn,
            "tool_calls" | "function_call" => StopReason::ToolUse,
            "length" => StopReason::MaxTokens,
            other => StopReason::Other(other.to_owned()),
        };
        out.extend(final_events(tool_calls, self.usage, stop_reason));
        Ok(())
    }
}

impl SseDecoder for ChunkDecoder {
    fn on_event(
        &mut self,
        _event: &str,
        data: &str,
        out: &mut VecDeque<ModelEvent>,
    ) -> Result<bool, ModelError> {
        if data.trim() == "[DONE]" {
            self.finish(out)?;
            return Ok(true);
        }
        let chunk: Chunk = http::parse_json(data, "a chat.completion.chunk")?;
        if let Some(error) = chunk.error {
            let message = error
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("unknown error");
            return Err(ModelError::Server {
                status: 500,
                message: format!("error in stream: {message}"),
            });
        }
        if let Some(usage) = chunk.usage {
            self.usage = Usage {
                input_tokens: usage.prompt_tokens,
                output_tokens: usage.completion_tokens,
            };
        }
        // Only the first choice is used: corral never asks for n > 1.
        for choice in chunk.choices.into_iter().filter(|choice| choice.index == 0) {
            if let Some(delta) = choice.delta {
                if let Some(text) = delta.content.filter(|text| !text.is_empty()) {
                    out.push_back(ModelEvent::TextDelta(text));
                }
                for call in delta.tool_calls {
                    let partial = self.calls.entry(call.index).or_default();
                    if let Some(id) = call.id.filter(|id| !id.is_empty()) {
                        partial.id = id;
                    }
                    if let Some(function) = call.function {
                        if let Some(name) = function.name.filter(|name| !name.is_empty()) {
                            partial.name = name;
                        }
                        if let Some(arguments) = function.arguments {
                            partial.arguments.push_str(&arguments);
                        }
                    }
                }
            }
            if let Some(reason) = choice.finish_reason {
                self.finish_reason = Some(reason);
            }
        }
        Ok(false)
    }

    fn on_end(&mut self, out: &mut VecDeque<ModelEvent>) -> Result<(), ModelError> {
        // Without `[DONE]` the answer is accepted only if it had a finish_reason (some
        // compatible servers close the stream without the sentinel).
        self.finish(out)
    }
}
