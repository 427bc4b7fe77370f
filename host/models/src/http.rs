//! What both HTTP adapters share: sending, turning HTTP errors into [`ModelError`], and driving
//! a server-sent-event body through a provider-specific decoder.

use std::collections::VecDeque;
use std::time::Duration;

use eventsource_stream::{EventStreamError, Eventsource};
use futures::StreamExt;
use futures::stream::BoxStream;

use crate::{ApiKey, ModelError, ModelEvent, ModelStream};

/// How long a stream may go without a byte before it counts as cut off. Providers send `ping`
/// events or tokens far more often than this.
pub(crate) const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(120);

/// The longest provider error message kept, in characters.
const MAX_ERROR_MESSAGE_CHARS: usize = 1000;

/// The HTTP client every adapter uses.
pub(crate) fn client() -> Result<reqwest::Client, ModelError> {
    reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(30))
        .build()
        .map_err(|error| ModelError::Config {
            message: format!("cannot build the HTTP client: {}", describe_error(&error)),
        })
}

/// An error with its causes, which is where reqwest says what really went wrong.
pub(crate) fn describe_error(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Sends the request; a non-success status becomes the matching [`ModelError`].
pub(crate) async fn send(
    request: reqwest::RequestBuilder,
    key: &ApiKey,
) -> Result<reqwest::Response, ModelError> {
    let response = request.send().await.map_err(|error| {
        ModelError::Transport {
            message: describe_error(&error),
        }
        .redacted(key)
    })?;
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    let retry_after = retry_after(response.headers());
    let body = response.text().await.unwrap_or_default();
    let message = error_message(&body, status);
    let code = status.as_u16();
    let error = if code == 429 {
        ModelError::RateLimited {
            retry_after,
            message,
        }
    } else if status.is_server_error() || code == 529 {
        ModelError::Server {
            status: code,
            message,
        }
    } else {
        ModelError::Rejected {
            status: code,
            message,
        }
    };
    Err(error.redacted(key))
}

/// `retry-after-ms` (OpenAI) or `retry-after` in seconds; an HTTP date is not understood.
fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let number = |name: &str| -> Option<f64> {
        let value: f64 = headers.get(name)?.to_str().ok()?.trim().parse().ok()?;
        (value.is_finite() && value >= 0.0).then_some(value)
    };
    number("retry-after-ms")
        .map(|ms| Duration::from_secs_f64(ms / 1000.0))
        .or_else(|| number("retry-after").map(Duration::from_secs_f64))
}

/// The provider's own message from an error body (`{"error": {"type", "message"}}` in both
/// APIs), else the body itself, shortened.
pub(crate) fn error_message(body: &str, status: reqwest::StatusCode) -> String {
    let parsed: Option<serde_json::Value> = serde_json::from_str(body).ok();
    let error = parsed.as_ref().and_then(|value| value.get("error"));
    let message = error
        .and_then(|error| error.get("message"))
        .and_then(|m| m.as_str());
    let kind = error
        .and_then(|error| error.get("type"))
        .and_then(|t| t.as_str());
    let text = match (kind, message) {
        (Some(kind), Some(message)) => format!("{kind}: {message}"),
        (None, Some(message)) => message.to_owned(),
        _ if body.trim().is_empty() => status.to_string(),
        _ => body.trim().to_owned(),
    };
    shorten(text)
}

pub(crate) fn shorten(text: String) -> String {
    match text.char_indices().nth(MAX_ERROR_MESSAGE_CHARS) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text,
    }
}

/// A provider's stream format: turns each server-sent event into model events.
pub(crate) trait SseDecoder: Send + 'static {
    /// Handles one event (`event` is `message` when the server named none). Pushes what it
    /// yields onto `out`; returns `true` once the answer is complete (the rest is not read).
    fn on_event(
        &mut self,
        event: &str,
        data: &str,
        out: &mut VecDeque<ModelEvent>,
    ) -> Result<bool, ModelError>;
    /// The body ended before `on_event` returned `true`.
    fn on_end(&mut self, out: &mut VecDeque<ModelEvent>) -> Result<(), ModelError>;
}

struct SseState<D> {
    events: BoxStream<'static, Result<eventsource_stream::Event, EventStreamError<reqwest::Error>>>,
    decoder: D,
    queue: VecDeque<ModelEvent>,
    finished: bool,
    key: ApiKey,
    idle_timeout: Duration,
}

/// The model stream of a successful streaming response.
pub(crate) fn sse_stream<D: SseDecoder>(
    response: reqwest::Response,
    decoder: D,
    key: ApiKey,
    idle_timeout: Duration,
) -> ModelStream {
    let state = SseState {
        events: response.bytes_stream().eventsource().boxed(),
        decoder,
        queue: VecDeque::new(),
        finished: false,
        key,
        idle_timeout,
    };
    futures::stream::unfold(state, |mut state| async move {
        loop {
            if let Some(event) = state.queue.pop_front() {
                return Some((Ok(event), state));
            }
            if state.finished {
                return None;
            }
            let next = tokio::time::timeout(state.idle_timeout, state.events.next()).await;
            let outcome = match next {
                Err(_elapsed) => Err(ModelError::Truncated {
                    message: format!("no data for {}s", state.idle_timeout.as_secs()),
                }),
                Ok(Some(Ok(event))) => state
                    .decoder
                    .on_event(&event.event, &event.data, &mut state.queue)
                    .map(|complete| state.finished = complete),
                Ok(Some(Err(error))) => Err(stream_error(error)),
                Ok(None) => {
                    state.finished = true;
                    state.decoder.on_end(&mut state.queue)
                }
            };
            if let Err(error) = outcome {
                state.finished = true;
                state.queue.clear();
                let error = error.redacted(&state.key);
                return Some((Err(error), state));
            }
        }
    })
    .boxed()
}

fn stream_error(error: EventStreamError<reqwest::Error>) -> ModelError {
    match error {
        EventStreamError::Transport(error) => ModelError::Truncated {
            message: format!(
                "the connection failed mid-stream: {}",
                describe_error(&error)
            ),
        },
        EventStreamError::Utf8(error) => ModelError::Malformed {
            message: format!("the stream is not UTF-8: {error}"),
        },
        EventStreamError::Parser(error) => ModelError::Malformed {
            message: format!("bad event framing: {error}"),
        },
    }
}

/// Parses one event's JSON payload.
pub(crate) fn parse_json<T: serde::de::DeserializeOwned>(
    data: &str,
    what: &str,
) -> Result<T, ModelError> {
    serde_json::from_str(data).map_err(|error| ModelError::Malformed {
        message: format!(
            "{what} is not valid JSON ({error}): {}",
            shorten(data.to_owned())
        ),
    })
}
