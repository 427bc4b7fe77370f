//! Backends a host composes: a webhook that POSTs each call as JSON to an operator's HTTP
//! service, and a router that sends each capability to its own backend.
//!
//! # The webhook format
//!
//! Request (`Content-Type: application/json`):
//! `{"capability_id": "...", "tool_call_id": "...", "input": [{...}], "context": {...}}`
//! where `input` is the positional argument array (one object) and `context` the attribution.
//! Response: HTTP 200 with `{"ok": true, "output": <any JSON>}` or
//! `{"ok": false, "error": "<message>"}`. Any other status, a body over
//! [`MAX_RESPONSE_BYTES`], or a body of another shape fails the call with a `CapabilityError`.

use corral_sandbox::{Backend, Invocation, InvocationContext, InvokeCapabilityError, ToolResult};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Largest response body accepted from the webhook.
pub const MAX_RESPONSE_BYTES: usize = 8 << 20;

/// A webhook URL that cannot be used.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct InvalidWebhookUrl(pub String);

/// Calls capabilities by POSTing them to one URL.
#[derive(Debug, Clone)]
pub struct WebhookBackend {
    client: reqwest::Client,
    url: reqwest::Url,
}

#[derive(Serialize)]
struct WebhookRequest<'a> {
    capability_id: &'a str,
    tool_call_id: &'a str,
    input: &'a Value,
    context: &'a InvocationContext,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WebhookResponse {
    ok: bool,
    #[serde(default)]
    output: Value,
    #[serde(default)]
    error: Option<String>,
}

impl WebhookBackend {
    /// A backend posting to `url` (plain `http://`).
    pub fn new(url: &str) -> Result<Self, InvalidWebhookUrl> {
        let url = reqwest::Url::parse(url).map_err(|e| InvalidWebhookUrl(e.to_string()))?;
        if url.scheme() != "http" {
            return Err(InvalidWebhookUrl(format!(
                "the webhook URL must be an http:// URL (got {})",
                url.scheme()
            )));
        }
        Ok(WebhookBackend {
            client: reqwest::Client::new(),
            url,
        })
    }
}

#[async_trait::async_trait]
impl Backend for WebhookBackend {
    async fn invoke(
        &self,
        context: &InvocationContext,
        invocation: Invocation,
    ) -> Result<ToolResult, InvokeCapabilityError> {
        let failed = |message: String| InvokeCapabilityError::Failed {
            capability_id: invocation.capability_id.clone(),
            message,
        };
        let request = WebhookRequest {
            capability_id: &invocation.capability_id,
            tool_call_id: &invocation.tool_call_id,
            input: &invocation.input,
            context,
        };
        let mut response = self
            .client
            .post(self.url.clone())
            .json(&request)
            .send()
            .await
            .map_err(|e| failed(format!("the backend could not be reached: {e}")))?;
        let status = response.status();
        let mut body = Vec::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| failed(format!("reading the backend's response failed: {e}")))?
        {
            if body.len() + chunk.len() > MAX_RESPONSE_BYTES {
                return Err(failed(format!(
                    "the backend's response is over {MAX_RESPONSE_BYTES} bytes"
                )));
            }
            body.extend_from_slice(&chunk);
        }
        if !status.is_success() {
            return Err(failed(format!("the backend answered HTTP {status}")));
        }
        let reply: WebhookResponse = serde_json::from_slice(&body).map_err(|e| {
            failed(format!(
                "the backend's response is not {{\"ok\", \"output\"|\"error\"}} JSON: {e}"
            ))
        })?;
        if reply.ok {
            Ok(ToolResult::new(reply.output))
        } else {
            Err(failed(reply.error.unwrap_or_else(|| {
                "the backend reported an error".to_string()
            })))
        }
    }
}

/// Sends each capability's calls to the backend registered for it; calls of any other
/// capability fail as unknown (deny by default).
#[derive(Default, Clone)]
pub struct RoutingBackend {
    routes: std::collections::HashMap<String, std::sync::Arc<dyn Backend>>,
}

impl std::fmt::Debug for RoutingBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut ids: Vec<&String> = self.routes.keys().collect();
        ids.sort();
        f.debug_struct("RoutingBackend")
            .field("routes", &ids)
            .finish()
    }
}

impl RoutingBackend {
    /// Routes `capability_id` to `backend`.
    pub fn route(
        &mut self,
        capability_id: impl Into<String>,
        backend: std::sync::Arc<dyn Backend>,
    ) {
        self.routes.insert(capability_id.into(), backend);
    }
}

#[async_trait::async_trait]
impl Backend for RoutingBackend {
    async fn invoke(
        &self,
        context: &InvocationContext,
        invocation: Invocation,
    ) -> Result<ToolResult, InvokeCapabilityError> {
        match self.routes.get(&invocation.capability_id) {
            Some(backend) => backend.invoke(context, invocation).await,
            None => Err(InvokeCapabilityError::UnknownCapability {
                capability_id: invocation.capability_id,
            }),
        }
    }
}
