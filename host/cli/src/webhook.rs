//! A backend that POSTs each call as JSON to an operator's HTTP service.
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
    pub fn new(url: &str) -> anyhow::Result<Self> {
        let url = reqwest::Url::parse(url)?;
        if url.scheme() != "http" {
            anyhow::bail!(
                "--backend-url must be an http:// URL (got {})",
                url.scheme()
            );
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
