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
//!
//! # Signatures
//!
//! A backend given a secret ([`WebhookBackend::signed`]) signs every request as the major
//! webhook senders do: the header `Corral-Signature: t=<unix seconds>,v1=<hex>` where `<hex>` is
//! HMAC-SHA256, keyed with the secret, of `<t>.<body>` (the exact bytes sent). A receiver
//! recomputes it over the raw body, compares in constant time, and refuses a timestamp outside
//! its replay window ([`verify_signature`] does all three; five minutes is usual).
//!
//! # Trace context
//!
//! With tracing on (docs/tracing.md), every request carries the W3C `traceparent` (and
//! `tracestate`) of the call's `execute_tool` span, so a receiver's spans join the turn's trace.

use corral_sandbox::{Backend, Invocation, InvocationContext, InvokeCapabilityError, ToolResult};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Largest response body accepted from the webhook.
pub const MAX_RESPONSE_BYTES: usize = 8 << 20;

/// A webhook URL that cannot be used.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct InvalidWebhookUrl(pub String);

/// The header carrying a request's signature.
pub const SIGNATURE_HEADER: &str = "Corral-Signature";

/// Calls capabilities by POSTing them to one URL.
#[derive(Clone)]
pub struct WebhookBackend {
    client: reqwest::Client,
    url: reqwest::Url,
    secret: Option<Vec<u8>>,
}

impl std::fmt::Debug for WebhookBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookBackend")
            .field("url", &self.url.as_str())
            .field("signed", &self.secret.is_some())
            .finish()
    }
}

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

fn mac(secret: &[u8], timestamp: u64, body: &[u8]) -> HmacSha256 {
    use hmac::Mac;
    // HMAC takes a key of any length.
    let mut mac = HmacSha256::new_from_slice(secret).expect("HMAC accepts any key length");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    mac
}

/// The `Corral-Signature` value of `body` sent at `timestamp` (unix seconds) under `secret`.
pub fn signature(secret: &[u8], timestamp: u64, body: &[u8]) -> String {
    use hmac::Mac;
    let digest = mac(secret, timestamp, body).finalize().into_bytes();
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("t={timestamp},v1={hex}")
}

/// Why a webhook request's signature was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SignatureError {
    /// The header is not `t=<seconds>,v1=<hex>`.
    #[error("the signature header is malformed")]
    Malformed,
    /// The timestamp is outside the replay window.
    #[error("the signature's timestamp is outside the replay window")]
    Stale,
    /// No `v1` signature matches the body.
    #[error("the signature does not match the body")]
    Mismatch,
}

/// Checks a `Corral-Signature` header against the raw `body` received at `now` (unix seconds):
/// its timestamp within `window_secs` of `now`, and one of its `v1` values (several may be sent
/// while a secret is rotated) equal, in constant time, to the HMAC of `<t>.<body>`.
pub fn verify_signature(
    secret: &[u8],
    header: &str,
    body: &[u8],
    now: u64,
    window_secs: u64,
) -> Result<(), SignatureError> {
    use hmac::Mac;
    let mut timestamp = None;
    let mut candidates = Vec::new();
    for part in header.split(',') {
        match part.trim().split_once('=') {
            Some(("t", value)) => timestamp = value.parse::<u64>().ok(),
            Some(("v1", value)) => candidates.push(value),
            _ => {}
        }
    }
    let timestamp = timestamp.ok_or(SignatureError::Malformed)?;
    if candidates.is_empty() {
        return Err(SignatureError::Malformed);
    }
    if now.abs_diff(timestamp) > window_secs {
        return Err(SignatureError::Stale);
    }
    for candidate in candidates {
        let Some(bytes) = decode_hex(candidate) else {
            continue;
        };
        if mac(secret, timestamp, body).verify_slice(&bytes).is_ok() {
            return Ok(());
        }
    }
    Err(SignatureError::Mismatch)
}

fn decode_hex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
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
            secret: None,
        })
    }

    /// The same backend, signing every request with `secret` (see the module's docs).
    pub fn signed(mut self, secret: impl Into<Vec<u8>>) -> Self {
        self.secret = Some(secret.into());
        self
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
        let body = serde_json::to_vec(&request)
            .map_err(|e| failed(format!("the request could not be encoded: {e}")))?;
        let mut post = self
            .client
            .post(self.url.clone())
            .header(reqwest::header::CONTENT_TYPE, "application/json");
        if let Some(secret) = &self.secret {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            post = post.header(SIGNATURE_HEADER, signature(secret, now, &body));
        }
        // The call's span (`execute_tool {capability}`) as the W3C trace context: the
        // receiver's own spans join the turn's trace.
        for (name, value) in corral_telemetry::trace_headers() {
            post = post.header(name, value);
        }
        let mut response = post
            .body(body)
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

#[cfg(test)]
mod signature_tests {
    use super::*;

    #[test]
    fn a_signature_verifies_only_its_body_secret_and_window() {
        let header = signature(b"s3cret", 1_000, b"{\"a\":1}");
        assert!(header.starts_with("t=1000,v1="));
        assert_eq!(
            verify_signature(b"s3cret", &header, b"{\"a\":1}", 1_100, 300),
            Ok(())
        );
        assert_eq!(
            verify_signature(b"s3cret", &header, b"{\"a\":2}", 1_100, 300),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            verify_signature(b"other", &header, b"{\"a\":1}", 1_100, 300),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            verify_signature(b"s3cret", &header, b"{\"a\":1}", 1_301, 300),
            Err(SignatureError::Stale)
        );
        for bad in ["", "t=1000", "v1=00", "t=x,v1=00"] {
            assert_eq!(
                verify_signature(b"s3cret", bad, b"", 1_000, 300),
                Err(SignatureError::Malformed),
                "{bad}"
            );
        }
        // A rotation sends two signatures; either matching is enough.
        let rotated = format!("{header},v1={}", "ab".repeat(32));
        assert_eq!(
            verify_signature(b"s3cret", &rotated, b"{\"a\":1}", 1_000, 300),
            Ok(())
        );
    }
}
