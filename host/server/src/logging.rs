//! What an operator reads: the log format, and the request id that ties a client's report to
//! the server's log lines.
//!
//! Every request gets an `X-Request-Id`: the client's, when it is 1 to [`MAX_REQUEST_ID`]
//! visible ASCII characters (a load balancer's or a gateway's id, kept so that its logs and
//! corral's join), otherwise a new UUID. It is echoed on every response the router answers
//! (errors, 404 and 429 included) and recorded as `request_id` on the request's span, so every
//! log line written while handling the request carries it.

use axum::extract::Request;
use axum::http::{HeaderName, HeaderValue};
use axum::middleware::Next;
use axum::response::Response;

/// The request id header.
pub static REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// The longest request id accepted from a client.
pub const MAX_REQUEST_ID: usize = 128;

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LogFormat {
    /// One human-readable line per event (colours only on a terminal).
    Text,
    /// One JSON object per line, with the span fields (`request_id`...): for log collectors.
    Json,
}

impl LogFormat {
    /// `text` or `json` (the `logFormat` setting and `CORRAL_LOG_FORMAT`).
    pub fn parse(text: &str) -> Result<LogFormat, String> {
        match text.trim().to_ascii_lowercase().as_str() {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            other => Err(format!("must be text or json, not {other:?}")),
        }
    }
}

/// A request's id, in the request's extensions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestId(pub String);

/// The client's request id, if it is acceptable: 1 to [`MAX_REQUEST_ID`] visible ASCII
/// characters (no spaces or controls, so it cannot forge or split a log line).
pub fn accepted_request_id(value: &HeaderValue) -> Option<&str> {
    let bytes = value.as_bytes();
    let visible = bytes.iter().all(|b| (0x21..=0x7e).contains(b));
    (!bytes.is_empty() && bytes.len() <= MAX_REQUEST_ID && visible)
        .then(|| value.to_str().ok())
        .flatten()
}

/// The outermost middleware: picks the request id, stores it for the span, echoes it.
pub(crate) async fn request_id(mut request: Request, next: Next) -> Response {
    let id = request
        .headers()
        .get(&REQUEST_ID)
        .and_then(accepted_request_id)
        .map_or_else(|| uuid::Uuid::new_v4().to_string(), str::to_owned);
    let value = HeaderValue::from_str(&id).unwrap_or_else(|_| HeaderValue::from_static("-"));
    request
        .headers_mut()
        .insert(REQUEST_ID.clone(), value.clone());
    request.extensions_mut().insert(RequestId(id));
    let mut response = next.run(request).await;
    response.headers_mut().insert(REQUEST_ID.clone(), value);
    response
}

/// The request's span: method, route path and request id. With tracing on it is also the
/// command's HTTP server span (docs/tracing.md), named `METHOD /route/{template}` after the
/// route that matched (axum's [`MatchedPath`](axum::extract::MatchedPath), also `http.route`;
/// the method alone when none did), a child of the caller's W3C `traceparent` when one is sent;
/// its status code is recorded by [`on_response`].
pub(crate) fn request_span(request: &Request) -> tracing::Span {
    let id = request
        .extensions()
        .get::<RequestId>()
        .map_or("-", |id| id.0.as_str());
    let route = request
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map(axum::extract::MatchedPath::as_str);
    let name = match route {
        Some(route) => format!("{} {route}", request.method()),
        None => request.method().to_string(),
    };
    let span = tracing::info_span!(
        "request",
        method = %request.method(),
        path = %request.uri().path(),
        request_id = %id,
        otel.name = name.as_str(),
        otel.kind = "server",
        otel.status_code = tracing::field::Empty,
        http.request.method = %request.method(),
        http.route = route,
        url.path = %request.uri().path(),
        http.response.status_code = tracing::field::Empty,
    );
    let header = |name: &str| {
        request
            .headers()
            .get(name)
            .and_then(|value| value.to_str().ok())
    };
    if let Some(parent) = header(corral_telemetry::TRACEPARENT) {
        corral_telemetry::set_remote_parent(&span, parent, header(corral_telemetry::TRACESTATE));
    }
    span
}

/// One `info` line per response with its status and latency (tower-http's), and the status on
/// the request's span; a 5xx marks the span as failed.
fn on_response<B>(
    response: &axum::http::Response<B>,
    latency: std::time::Duration,
    span: &tracing::Span,
) {
    use tower_http::trace::OnResponse as _;
    tower_http::trace::DefaultOnResponse::new()
        .level(tracing::Level::INFO)
        .on_response(response, latency, span);
    span.record("http.response.status_code", response.status().as_u16());
    if response.status().is_server_error() {
        span.record("otel.status_code", "ERROR");
    }
}

/// The trace layer's type: [`request_span`], no line per request or chunk, one per response.
pub(crate) type TraceLayer = tower_http::trace::TraceLayer<
    tower_http::classify::SharedClassifier<tower_http::classify::ServerErrorsAsFailures>,
    fn(&Request) -> tracing::Span,
    (),
    fn(&Response, std::time::Duration, &tracing::Span),
    (),
    (),
    tower_http::trace::DefaultOnFailure,
>;

/// The trace layer: a span per request ([`request_span`]), one `info` line per response with
/// its status and latency, and an `error` line for a 5xx.
pub(crate) fn trace_layer() -> TraceLayer {
    tower_http::trace::TraceLayer::new_for_http()
        .make_span_with(request_span as fn(&Request) -> tracing::Span)
        .on_request(())
        .on_response(on_response as fn(&Response, std::time::Duration, &tracing::Span))
        .on_body_chunk(())
        .on_eos(())
        .on_failure(tower_http::trace::DefaultOnFailure::new().level(tracing::Level::ERROR))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_bounded_visible_ids_are_accepted() {
        let ok = |text: &str| {
            accepted_request_id(&HeaderValue::from_str(text).expect("value")).map(str::to_owned)
        };
        assert_eq!(ok("abc-123_Z:/.").as_deref(), Some("abc-123_Z:/."));
        assert_eq!(
            ok(&"a".repeat(MAX_REQUEST_ID)).map(|id| id.len()),
            Some(MAX_REQUEST_ID)
        );
        assert_eq!(ok(&"a".repeat(MAX_REQUEST_ID + 1)), None);
        assert_eq!(ok(""), None);
        assert_eq!(ok("has space"), None);
        assert_eq!(ok("tab\there"), None);
        let latin1 = HeaderValue::from_bytes(b"caf\xe9").expect("value");
        assert_eq!(accepted_request_id(&latin1), None);
    }

    #[test]
    fn formats_parse() {
        assert_eq!(LogFormat::parse("JSON"), Ok(LogFormat::Json));
        assert_eq!(LogFormat::parse("text"), Ok(LogFormat::Text));
        assert!(LogFormat::parse("xml").is_err());
    }
}
