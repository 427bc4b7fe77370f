//! The trait, draining a stream into a response, and retries.

use std::time::Duration;

use futures::StreamExt;

use crate::{ModelError, ModelEvent, ModelRequest, ModelResponse, StopReason, Usage};

/// The stream of one model call.
pub type ModelStream = futures::stream::BoxStream<'static, Result<ModelEvent, ModelError>>;

/// A streaming language model.
#[async_trait::async_trait]
pub trait Model: Send + Sync + std::fmt::Debug {
    /// Provider and model name for logs and journals, e.g. `"openai:gpt-4o"`, `"scripted"`.
    fn describe(&self) -> String;
    /// Starts one call. Errors before the first event (HTTP status, connection) come back here;
    /// later ones inside the stream. Dropping the stream cancels the HTTP request.
    async fn stream(&self, request: ModelRequest) -> Result<ModelStream, ModelError>;
}

/// Drains a stream into a [`ModelResponse`], calling `on_delta` for each text delta as it
/// arrives. Errors if the stream fails or ends without `Done` ([`ModelError::Truncated`]);
/// anything after `Done` is not read.
pub async fn collect(
    mut stream: ModelStream,
    mut on_delta: impl FnMut(&str) + Send,
) -> Result<ModelResponse, ModelError> {
    let mut text = String::new();
    let mut tool_calls = Vec::new();
    let mut usage = Usage::default();
    while let Some(event) = stream.next().await {
        match event? {
            ModelEvent::TextDelta(delta) => {
                on_delta(&delta);
                text.push_str(&delta);
            }
            ModelEvent::ToolCall(call) => tool_calls.push(call),
            ModelEvent::Usage(counted) => usage = counted,
            ModelEvent::Done(stop_reason) => {
                return Ok(ModelResponse {
                    text,
                    tool_calls,
                    usage,
                    stop_reason,
                });
            }
        }
    }
    Err(ModelError::Truncated {
        message: "the stream ended without a final event".to_owned(),
    })
}

/// How [`call_with_retry`] retries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included (at least 1 is always made).
    pub max_attempts: u32,
    /// The wait before the second attempt; it doubles for each further one.
    pub base_delay: Duration,
    /// The longest wait. A `retry-after` longer than this is not waited for: the call fails
    /// with [`ModelError::RateLimited`] at once.
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    /// 3 attempts, waits of 500 ms then 1 s, `retry-after` honoured up to 30 s.
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 3,
            base_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(30),
        }
    }
}

impl RetryPolicy {
    /// The wait before attempt `attempt + 1` after `error`, or `None` to give up.
    fn delay_after(&self, attempt: u32, error: &ModelError) -> Option<Duration> {
        if attempt >= self.max_attempts || !error.is_retryable() {
            return None;
        }
        if let ModelError::RateLimited {
            retry_after: Some(wait),
            ..
        } = error
        {
            return (*wait <= self.max_delay).then_some(*wait);
        }
        let factor = 2u32.saturating_pow(attempt.saturating_sub(1));
        Some(self.base_delay.saturating_mul(factor).min(self.max_delay))
    }
}

/// Calls `model` and collects its answer, retrying on retryable errors.
///
/// The rule: after a failed attempt the call is tried again when **all** of these hold:
/// - the error [is retryable](ModelError::is_retryable): HTTP 429, 5xx, a transport error, or a
///   stream that was cut off or ended early;
/// - **no text delta of the failed attempt reached `on_delta`** (what the caller has shown can't
///   be taken back, so a stream cut after some text fails with [`ModelError::Truncated`]; tool
///   calls are never passed on before `Done`, so a stream cut before any text is retried);
/// - fewer than `policy.max_attempts` attempts were made;
/// - for a 429 with `retry-after`, the asked wait is at most `policy.max_delay` (it is waited
///   exactly); otherwise the wait is `base_delay * 2^(attempt-1)`, capped at `max_delay`.
///
/// Nothing is half-applied: the caller gets one complete [`ModelResponse`] (from one attempt)
/// or the last error.
pub async fn call_with_retry(
    model: &dyn Model,
    request: &ModelRequest,
    policy: &RetryPolicy,
    mut on_delta: impl FnMut(&str) + Send,
) -> Result<ModelResponse, ModelError> {
    let mut attempt = 0u32;
    loop {
        attempt += 1;
        let mut delivered = false;
        let outcome = match model.stream(request.clone()).await {
            Ok(stream) => {
                collect(stream, |delta: &str| {
                    delivered |= !delta.is_empty();
                    on_delta(delta);
                })
                .await
            }
            Err(error) => Err(error),
        };
        let error = match outcome {
            Ok(response) => return Ok(response),
            Err(error) => error,
        };
        if delivered {
            return Err(error);
        }
        match policy.delay_after(attempt, &error) {
            Some(wait) => tokio::time::sleep(wait).await,
            None => return Err(error),
        }
    }
}

/// Builds the last events of a stream: the tool calls, usage and `Done`.
pub(crate) fn final_events(
    tool_calls: Vec<crate::ToolCall>,
    usage: Usage,
    stop_reason: StopReason,
) -> impl Iterator<Item = ModelEvent> {
    tool_calls
        .into_iter()
        .map(ModelEvent::ToolCall)
        .chain([ModelEvent::Usage(usage), ModelEvent::Done(stop_reason)])
}
