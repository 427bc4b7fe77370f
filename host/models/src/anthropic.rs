//! The Anthropic Messages streaming adapter.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use serde_json::{Value, json};

use crate::call::final_events;
use crate::http::{self, SseDecoder};
use crate::{
    ApiKey, Message, Model, ModelError, ModelEvent, ModelRequest, ModelStream, ProviderConfig,
    StopReason, ToolCall, Usage,
};

/// The API version header sent with every request.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";

/// A model behind the Messages API: `POST {base_url}/v1/messages` with `stream: true`,
/// authenticated with `x-api-key` and `anthropic-version: 2023-06-01`.
///
/// Mapping: the system prompt is the top-level `system`; an assistant message becomes `text`
/// and `tool_use` blocks; tool results become `tool_result` blocks (with `is_error`) in a
/// **user** message, and consecutive messages of one role are merged into one (the API wants
/// every result of one assistant turn in the next user message, before any text).
#[derive(Debug, Clone)]
pub struct AnthropicModel {
    client: reqwest::Client,
    endpoint: String,
    model: String,
    api_key: ApiKey,
    idle_timeout: Duration,
}

impl AnthropicModel {
    /// An adapter for `config` (its provider is not checked).
    pub fn new(config: &ProviderConfig) -> Result<Self, ModelError> {
        Ok(AnthropicModel {
            client: http::client()?,
            endpoint: format!("{}/v1/messages", config.effective_base_url()),
            model: config.model.clone(),
            api_key: config.api_key.clone(),
            idle_timeout: http::DEFAULT_IDLE_TIMEOUT,
        })
    }

    /// How long the stream may be silent before it counts as cut off (default 120 s; the API
    /// sends `ping` events meanwhile).
    pub fn with_idle_timeout(mut self, idle_timeout: Duration) -> Self {
        self.idle_timeout = idle_timeout;
        self
    }

    /// The JSON body sent for `request`.
    pub fn request_body(&self, request: &ModelRequest) -> Value {
        let mut messages: Vec<(&'static str, Vec<Value>)> = Vec::new();
        for message in &request.messages {
            let (role, blocks) = match message {
                Message::User { content } => {
                    ("user", vec![json!({"type": "text", "text": content})])
                }
                Message::Assistant { text, tool_calls } => {
                    let mut blocks = Vec::with_capacity(tool_calls.len() + 1);
                    // The API rejects empty text blocks.
                    if !text.is_empty() {
                        blocks.push(json!({"type": "text", "text": text}));
                    }
                    blocks.extend(tool_calls.iter().map(|call| {
                        json!({"type": "tool_use", "id": call.id, "name": call.name, "input": call.arguments})
                    }));
                    ("assistant", blocks)
                }
                Message::Tool {
                    tool_call_id,
                    content,
                    is_error,
                } => (
                    "user",
                    vec![json!({
                        "type": "tool_result",
                        "tool_use_id": tool_call_id,
                        "content": content,
                        "is_error": is_error,
                    })],
                ),
            };
            if blocks.is_empty() {
                continue;
            }
            match messages.last_mut() {
                Some((last_role, last_blocks)) if *last_role == role => last_blocks.extend(blocks),
                _ => messages.push((role, blocks)),
            }
        }
        let messages: Vec<Value> = messages
            .into_iter()
            .map(|(role, content)| json!({"role": role, "content": content}))
            .collect();
        let mut body = json!({
            "model": self.model,
            "max_tokens": request.max_output_tokens,
            "stream": true,
            "messages": messages,
        });
        if !request.system.is_empty() {
            body["system"] = Value::String(request.system.clone());
        }
        if !request.tools.is_empty() {
            body["tools"] = request
                .tools
                .iter()
                .map(|tool| json!({"name": tool.name, "description": tool.description, "input_schema": tool.input_schema}))
                .collect();
        }
        body
    }
}

#[async_trait::async_trait]
impl Model for AnthropicModel {
    fn describe(&self) -> String {
        format!("anthropic:{}", self.model)
    }

    async fn stream(&self, request: ModelRequest) -> Result<ModelStream, ModelError> {
        let builder = self
            .client
            .post(&self.endpoint)
            .header("x-api-key", self.api_key.expose_secret())
            .header("anthropic-version", ANTHROPIC_VERSION)
            .header(reqwest::header::ACCEPT, "text/event-stream")
            .json(&self.request_body(&request));
        let response = http::send(builder, &self.api_key).await?;
        Ok(http::sse_stream(
            response,
            EventDecoder::default(),
            self.api_key.clone(),
            self.idle_timeout,
        ))
    }
}

struct ToolBlock {
    id: String,
    name: String,
    start_input: Value,
    json: String,
}

/// Events in, model events out. Text goes out at once; `tool_use` blocks are put together by
/// block index and their JSON parsed at `message_stop`.
#[derive(Default)]
struct EventDecoder {
    tool_blocks: BTreeMap<u64, ToolBlock>,
    stop_reason: Option<String>,
    usage: Usage,
    started: bool,
}

fn count(value: &Value, field: &str) -> u64 {
    value.get(field).and_then(Value::as_u64).unwrap_or(0)
}

fn text_field<'a>(value: &'a Value, field: &str) -> &'a str {
    value.get(field).and_then(Value::as_str).unwrap_or("")
}

impl EventDecoder {
    fn finish(&mut self, out: &mut VecDeque<ModelEvent>) -> Result<(), ModelError> {
        let mut tool_calls = Vec::with_capacity(self.tool_blocks.len());
        for block in std::mem::take(&mut self.tool_blocks).into_values() {
            let arguments = if block.json.trim().is_empty() {
                block.start_input
            } else {
                serde_json::from_str(&block.json).map_err(|error| ModelError::Malformed {
                    message: format!(
                        "the input of tool call {} ({}) is not valid JSON: {error}",
                        block.name,
                        http::shorten(block.json.clone())
                    ),
                })?
            };
            tool_calls.push(ToolCall {
                id: block.id,
                name: block.name,
                arguments,
            });
        }
        let stop_reason = match self.stop_reason.take().as_deref() {
            Some("end_turn") => StopReason::EndTurn,
            Some("tool_use") => StopReason::ToolUse,
            Some("max_tokens") => StopReason::MaxTokens,
            Some(other) => StopReason::Other(other.to_owned()),
            None if tool_calls.is_empty() => StopReason::EndTurn,
            None => StopReason::ToolUse,
        };
        out.extend(final_events(tool_calls, self.usage, stop_reason));
        Ok(())
    }
}

/// The error a mid-stream `error` event stands for, by its documented `error.type`.
fn stream_error(data: &Value) -> ModelError {
    let error = data.get("error").unwrap_or(&Value::Null);
    let kind = text_field(error, "type");
    let message = http::shorten(format!("{kind}: {}", text_field(error, "message")));
    let status = match kind {
        "rate_limit_error" => {
            return ModelError::RateLimited {
                retry_after: None,
                message,
            };
        }
        "overloaded_error" => {
            return ModelError::Server {
                status: 529,
                message,
            };
        }
        "api_error" => {
            return ModelError::Server {
                status: 500,
                message,
            };
        }
        "authentication_error" => 401,
        "permission_error" => 403,
        "not_found_error" => 404,
        "request_too_large" => 413,
        _ => 400,
    };
    ModelError::Rejected { status, message }
}

impl SseDecoder for EventDecoder {
    fn on_event(
        &mut self,
        _event: &str,
        data: &str,
        out: &mut VecDeque<ModelEvent>,
    ) -> Result<bool, ModelError> {
        let data: Value = http::parse_json(data, "a Messages stream event")?;
        let kind = text_field(&data, "type");
        if !self.started && !matches!(kind, "message_start" | "ping" | "error") {
            return Err(ModelError::Malformed {
                message: format!("the stream began with {kind:?}, not message_start"),
            });
        }
        match kind {
            "message_start" => {
                self.started = true;
                let usage = data.pointer("/message/usage").unwrap_or(&Value::Null);
                self.usage = Usage {
                    input_tokens: count(usage, "input_tokens")
                        + count(usage, "cache_creation_input_tokens")
                        + count(usage, "cache_read_input_tokens"),
                    output_tokens: count(usage, "output_tokens"),
                };
            }
            "content_block_start" => {
                let index = count(&data, "index");
                let block = data.get("content_block").unwrap_or(&Value::Null);
                match text_field(block, "type") {
                    "text" => {
                        let text = text_field(block, "text");
                        if !text.is_empty() {
                            out.push_back(ModelEvent::TextDelta(text.to_owned()));
                        }
                    }
                    "tool_use" => {
                        let name = text_field(block, "name");
                        if name.is_empty() {
                            return Err(ModelError::Malformed {
                                message: format!("tool_use block {index} has no name"),
                            });
                        }
                        self.tool_blocks.insert(
                            index,
                            ToolBlock {
                                id: text_field(block, "id").to_owned(),
                                name: name.to_owned(),
                                start_input: block
                                    .get("input")
                                    .cloned()
                                    .unwrap_or_else(|| json!({})),
                                json: String::new(),
                            },
                        );
                    }
                    // Thinking and server-tool blocks are not part of the answer.
                    _ => {}
                }
            }
            "content_block_delta" => {
                let index = count(&data, "index");
                let delta = data.get("delta").unwrap_or(&Value::Null);
                match text_field(delta, "type") {
                    "text_delta" => {
                        let text = text_field(delta, "text");
                        if !text.is_empty() {
                            out.push_back(ModelEvent::TextDelta(text.to_owned()));
                        }
                    }
                    "input_json_delta" => {
                        let block = self.tool_blocks.get_mut(&index).ok_or_else(|| ModelError::Malformed {
                            message: format!("input_json_delta for block {index}, which is not a tool_use block"),
                        })?;
                        block.json.push_str(text_field(delta, "partial_json"));
                    }
                    _ => {}
                }
            }
            "message_delta" => {
                if let Some(reason) = data.pointer("/delta/stop_reason").and_then(Value::as_str) {
                    self.stop_reason = Some(reason.to_owned());
                }
                if let Some(usage) = data.get("usage") {
                    // Counts here are cumulative for the message.
                    self.usage.output_tokens =
                        self.usage.output_tokens.max(count(usage, "output_tokens"));
                    self.usage.input_tokens =
                        self.usage.input_tokens.max(count(usage, "input_tokens"));
                }
            }
            "message_stop" => {
                self.finish(out)?;
                return Ok(true);
            }
            "error" => return Err(stream_error(&data)),
            // `ping`, `content_block_stop`, and event types added later: nothing to do.
            _ => {}
        }
        Ok(false)
    }

    fn on_end(&mut self, _out: &mut VecDeque<ModelEvent>) -> Result<(), ModelError> {
        Err(ModelError::Truncated {
            message: "the stream ended before message_stop".to_owned(),
        })
    }
}
