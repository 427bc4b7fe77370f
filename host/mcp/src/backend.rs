//! [`McpBackend`]: capability calls as MCP `tools/call` requests, and their results as values.

use std::collections::HashMap;
use std::sync::Arc;

use corral_sandbox::{
    AttachmentRef, Backend, Invocation, InvocationContext, InvokeCapabilityError, ToolResult,
};
use rmcp::model::CallToolRequestParams;
use serde_json::Value;

use crate::listing::{McpCatalog, Route};

/// Longest error text taken from a server's `isError` result.
pub const MAX_ERROR_TEXT_CHARS: usize = 4000;

/// Routes `NAME.tool` calls to `tools/call` on the server `NAME`, and every other capability to
/// an optional fallback backend (the host's own capabilities).
///
/// Only tools of the [`McpCatalog`] it was made from are called (so `allowedTools` holds at the
/// call too). Each call has the server's timeout; when it passes, or when the call's future is
/// dropped (the script's deadline, a script that returned with calls in flight), the request is
/// cancelled with `notifications/cancelled`. Results and errors are redacted of the server's
/// secrets before they leave.
///
/// How a `CallToolResult` becomes the script's value:
/// - `isError: true` fails the call (`CapabilityError`) with the result's text;
/// - a tool with an `outputSchema` yields its `structuredContent`; without one present, its text
///   parsed as JSON, or the text itself when it is not JSON;
/// - a tool without an `outputSchema` (a `text_output` capability) yields its text blocks joined
///   with newlines as a string (its `structuredContent`, if it sends one anyway, as JSON text);
/// - images and audio become attachments (`data:` URIs), embedded resources and resource links
///   attachments referring to their `uri`; they never enter the script.
#[derive(Clone)]
pub struct McpBackend {
    routes: Arc<HashMap<String, Route>>,
    fallback: Option<Arc<dyn Backend>>,
}

impl std::fmt::Debug for McpBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpBackend")
            .field("capabilities", &self.routes.len())
            .field("fallback", &self.fallback.is_some())
            .finish()
    }
}

impl McpBackend {
    /// A backend for the tools of `catalog` (listed by an [`crate::McpHub`]; the calls go to
    /// that hub's servers).
    pub fn new(catalog: &McpCatalog) -> McpBackend {
        McpBackend {
            routes: Arc::clone(&catalog.routes),
            fallback: None,
        }
    }

    /// Sends capabilities that are not MCP tools of the catalog to `fallback`.
    pub fn with_fallback(mut self, fallback: Arc<dyn Backend>) -> McpBackend {
        self.fallback = Some(fallback);
        self
    }

    /// Whether this backend routes the capability to an MCP server.
    pub fn handles(&self, capability_id: &str) -> bool {
        self.routes.contains_key(capability_id)
    }
}

#[async_trait::async_trait]
impl Backend for McpBackend {
    async fn invoke(
        &self,
        context: &InvocationContext,
        invocation: Invocation,
    ) -> Result<ToolResult, InvokeCapabilityError> {
        let Some(route) = self.routes.get(&invocation.capability_id) else {
            return match &self.fallback {
                Some(fallback) => fallback.invoke(context, invocation).await,
                None => Err(InvokeCapabilityError::UnknownCapability {
                    capability_id: invocation.capability_id,
                }),
            };
        };
        call(route, &invocation).await
    }
}

async fn call(route: &Route, invocation: &Invocation) -> Result<ToolResult, InvokeCapabilityError> {
    let slot = &route.slot;
    let redactor = slot.redactor();
    let failed = |message: String| InvokeCapabilityError::Failed {
        capability_id: invocation.capability_id.clone(),
        message: redactor.redact_text(&message).into_owned(),
    };
    let arguments = match invocation.argument() {
        Value::Object(map) => map.clone(),
        Value::Null => serde_json::Map::new(),
        _ => return Err(failed("the argument must be an object".into())),
    };
    let connection = slot.connection().await.map_err(|e| failed(e.to_string()))?;
    let timeout = slot.call_timeout();
    let mut params = CallToolRequestParams::new(route.tool.clone()).with_arguments(arguments);
    // The call's span as the W3C trace context in `_meta` (the MCP specification's
    // `traceparent`/`tracestate` keys), so the server's spans join the turn's trace.
    let trace = corral_telemetry::trace_headers();
    if !trace.is_empty() {
        let mut meta = rmcp::model::RequestMetaObject::new();
        for (name, value) in trace {
            if name == corral_telemetry::TRACEPARENT {
                meta.set_traceparent(value);
            } else {
                meta.set_tracestate(value);
            }
        }
        params.meta = Some(meta);
    }
    // Dropping `call_tool` (timeout, or this future dropped) sends notifications/cancelled.
    let outcome = tokio::time::timeout(timeout, connection.peer.call_tool(params)).await;
    let result = match outcome {
        Err(_) => {
            return Err(failed(format!(
                "MCP server {} did not answer within {} ms; the request was cancelled",
                slot.name(),
                timeout.as_millis()
            )));
        }
        Ok(Err(rmcp::ServiceError::McpError(error))) => {
            slot.mark_healthy().await;
            return Err(failed(format!(
                "MCP server {} refused the call: {}",
                slot.name(),
                error.message
            )));
        }
        Ok(Err(error)) => {
            slot.connection_lost(&connection).await;
            let stderr = slot.stderr_tail();
            let stderr = stderr.lines().last().unwrap_or_default().to_owned();
            return Err(failed(format!(
                "MCP server {} stopped during the call ({error}); whether the call took effect \
                 is unknown; the server is restarted for the next call{}",
                slot.name(),
                if stderr.is_empty() {
                    String::new()
                } else {
                    format!(" (its last stderr line: {stderr})")
                }
            )));
        }
        Ok(Ok(result)) => result,
    };
    slot.mark_healthy().await;
    let result = serde_json::to_value(result).map_err(|e| failed(e.to_string()))?;
    let mut mapped = map_result(&result, route.text_output).map_err(failed)?;
    redactor.redact_json(&mut mapped.output);
    Ok(mapped)
}

/// A `CallToolResult` (as JSON) as corral's result; `Err` with the text for `isError`.
pub(crate) fn map_result(result: &Value, text_output: bool) -> Result<ToolResult, String> {
    let content = result
        .get("content")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut texts = Vec::new();
    let mut attachments = Vec::new();
    for block in &content {
        let kind = block.get("type").and_then(Value::as_str).unwrap_or("");
        let text_of = |key: &str| block.get(key).and_then(Value::as_str).map(str::to_owned);
        match kind {
            "text" => texts.extend(text_of("text")),
            "image" | "audio" => {
                let media_type =
                    text_of("mimeType").unwrap_or_else(|| "application/octet-stream".into());
                let data = text_of("data").unwrap_or_default();
                attachments.push(AttachmentRef {
                    reference: format!("data:{media_type};base64,{data}"),
                    media_type,
                    name: None,
                });
            }
            "resource" => {
                let resource = block.get("resource").cloned().unwrap_or(Value::Null);
                let field =
                    |key: &str| resource.get(key).and_then(Value::as_str).map(str::to_owned);
                attachments.push(AttachmentRef {
                    reference: field("uri").unwrap_or_default(),
                    media_type: field("mimeType").unwrap_or_else(|| {
                        if resource.get("text").is_some() {
                            "text/plain".into()
                        } else {
                            "application/octet-stream".into()
                        }
                    }),
                    name: None,
                });
            }
            "resource_link" => attachments.push(AttachmentRef {
                reference: text_of("uri").unwrap_or_default(),
                media_type: text_of("mimeType")
                    .unwrap_or_else(|| "application/octet-stream".into()),
                name: text_of("name"),
            }),
            _ => {}
        }
    }
    let text = texts.join("\n");
    if result.get("isError").and_then(Value::as_bool) == Some(true) {
        let mut message = if text.is_empty() {
            "the tool reported an error".to_owned()
        } else {
            text
        };
        if let Some((cut, _)) = message.char_indices().nth(MAX_ERROR_TEXT_CHARS) {
            message.truncate(cut);
            message.push_str("...");
        }
        return Err(message);
    }
    let structured = result.get("structuredContent").cloned();
    let output = if text_output {
        match structured {
            Some(value) if texts.is_empty() => Value::String(value.to_string()),
            _ => Value::String(text),
        }
    } else {
        match structured {
            Some(value) => value,
            None => serde_json::from_str(&text).unwrap_or(Value::String(text)),
        }
    };
    Ok(ToolResult {
        output,
        attachments,
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn results_map_as_documented() {
        let text = json!({"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "{\"b\":1}"}]});
        assert_eq!(
            map_result(&text, true).map(|r| r.output),
            Ok(json!("a\n{\"b\":1}"))
        );
        let json_text = json!({"content": [{"type": "text", "text": "{\"b\":1}"}]});
        assert_eq!(
            map_result(&json_text, false).map(|r| r.output),
            Ok(json!({"b": 1}))
        );
        let structured =
            json!({"content": [{"type": "text", "text": "x"}], "structuredContent": {"t": 2}});
        assert_eq!(
            map_result(&structured, false).map(|r| r.output),
            Ok(json!({"t": 2}))
        );
        let error = json!({"content": [{"type": "text", "text": "no such file"}], "isError": true});
        assert_eq!(map_result(&error, true).err(), Some("no such file".into()));
        let image =
            json!({"content": [{"type": "image", "data": "AAAA", "mimeType": "image/png"}]});
        let mapped = map_result(&image, true).map_err(|e| e.to_string());
        assert_eq!(
            mapped.map(|r| (r.output, r.attachments[0].reference.clone())),
            Ok((json!(""), "data:image/png;base64,AAAA".to_owned()))
        );
    }
}
