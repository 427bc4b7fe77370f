//! corral's traces in OpenTelemetry: one trace per turn, from the HTTP command through the model
//! and the script to every tool call, exported over OTLP. Off unless an endpoint is configured.
//!
//! ```no_run
//! use tracing_subscriber::layer::SubscriberExt as _;
//! use tracing_subscriber::util::SubscriberInitExt as _;
//! let config = corral_telemetry::TracingConfig::default();
//! let started = corral_telemetry::start(&config, "corral").expect("tracing starts");
//! let (layer, telemetry) = started.map(|(l, t)| (Some(l), Some(t))).unwrap_or((None, None));
//! tracing_subscriber::registry().with(layer).init();
//! // ... spans with `target: corral_telemetry::TARGET` are exported ...
//! if let Some(telemetry) = telemetry {
//!     telemetry.shutdown(std::time::Duration::from_secs(5));
//! }
//! ```
//!
//! # Core concepts
//!
//! - **Spans** are `tracing` spans with the target [`TARGET`]; only those (and their events)
//!   reach OpenTelemetry, whatever the log filter says. Their names follow the GenAI semantic
//!   conventions through the `otel.name` field: `invoke_agent {agent}`, `chat {model}`,
//!   `execute_tool {tool}`.
//! - **Configuration** ([`TracingConfig`]): the standard `OTEL_EXPORTER_OTLP_ENDPOINT` (or
//!   `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`), `OTEL_EXPORTER_OTLP_HEADERS`,
//!   `OTEL_EXPORTER_OTLP_TIMEOUT` and `OTEL_SERVICE_NAME` variables win over the configuration
//!   file's values; `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none` turn tracing off.
//!   Only OTLP over HTTP/protobuf is spoken.
//! - **Export never blocks a turn**: spans go to a bounded queue that a thread of its own
//!   exports in batches; when the queue is full or the collector fails, spans are dropped and
//!   counted ([`spans_dropped`], `corral_trace_spans_dropped_total` in `/metrics`).
//! - **Propagation**: [`set_remote_parent`] reads a caller's W3C `traceparent`/`tracestate`,
//!   [`trace_headers`] writes the current span's for a webhook, an MCP request's `_meta` or an
//!   executor's action, and [`add_link`] links a resumed turn to the trace that started it.
//! - **Content** (tool inputs and outputs, scripts, prompts, completions) is recorded only when
//!   the operator turns [`capture_content`] on, and then redacted by the caller as events are.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use opentelemetry::propagation::TextMapPropagator as _;
use opentelemetry::trace::{TraceContextExt as _, TracerProvider as _};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor, SdkTracerProvider};
use serde::Deserialize;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

/// The `tracing` target of every span and span event that is exported.
pub const TARGET: &str = "corral::trace";

/// The target of `corral serve`'s request span, exported as the HTTP server span.
const HTTP_SERVER_TARGET: &str = "corral_server::logging";

/// The W3C trace context header of a span.
pub const TRACEPARENT: &str = "traceparent";
/// The W3C vendor-specific trace state header.
pub const TRACESTATE: &str = "tracestate";

/// Most spans waiting for export; more are dropped (and counted).
pub const MAX_QUEUED_SPANS: usize = 2048;

/// The `[tracing]` table of `corral serve`'s configuration file (the variables win).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TracingConfig {
    /// The OTLP/HTTP base URL (`http://collector:4318`; `/v1/traces` is added), like
    /// `OTEL_EXPORTER_OTLP_ENDPOINT`. Tracing is off when neither is set.
    #[serde(default)]
    pub endpoint: Option<String>,
    /// The service name (`service.name`), like `OTEL_SERVICE_NAME`; `corral` by default.
    #[serde(default)]
    pub service_name: Option<String>,
    /// Records tool inputs and outputs, script source, prompts and completions in spans,
    /// redacted as events are (`CORRAL_TRACE_CONTENT=true` also turns it on). Off by default.
    #[serde(default)]
    pub capture_content: bool,
}

/// Why tracing could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartTracingError {
    /// The OTLP exporter refused its configuration (an endpoint that is not a URL...).
    #[error("the OTLP exporter could not be configured: {0}")]
    Exporter(String),
}

static CAPTURE_CONTENT: AtomicBool = AtomicBool::new(false);
static ENABLED: AtomicBool = AtomicBool::new(false);
static SPANS_DROPPED: AtomicU64 = AtomicU64::new(0);
static SPANS_QUEUED: AtomicU64 = AtomicU64::new(0);
static EXPORT_FAILING: AtomicBool = AtomicBool::new(false);

/// Whether spans may carry content (inputs, outputs, source, prompts, completions).
pub fn capture_content() -> bool {
    CAPTURE_CONTENT.load(Ordering::Relaxed)
}

/// Whether spans are exported at all.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Spans dropped since start: the queue was full or the collector failed or was unreachable.
pub fn spans_dropped() -> u64 {
    SPANS_DROPPED.load(Ordering::Relaxed)
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

fn env_true(name: &str) -> bool {
    env(name).is_some_and(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "true" | "1"))
}

/// The exported layer for a subscriber of type `S`.
pub type TraceLayer<S> = Box<dyn tracing_subscriber::Layer<S> + Send + Sync + 'static>;

/// Started tracing: flush it with [`Telemetry::shutdown`] before the process exits.
#[derive(Debug)]
pub struct Telemetry {
    provider: SdkTracerProvider,
}

impl Telemetry {
    /// Exports what is queued and stops, waiting at most `bound`.
    pub fn shutdown(self, bound: Duration) {
        if let Err(error) = self.provider.shutdown_with_timeout(bound) {
            eprintln!("corral: flushing traces at shutdown: {error}");
        }
    }
}

/// Starts tracing as `config` and the `OTEL_*` variables say: `None` when it is off, otherwise
/// the layer to add to the process's subscriber and the handle that flushes at shutdown.
/// `default_service` is the service name when neither the variable nor `config` gives one.
pub fn start<S>(
    config: &TracingConfig,
    default_service: &str,
) -> Result<Option<(TraceLayer<S>, Telemetry)>, StartTracingError>
where
    S: tracing::Subscriber
        + for<'span> tracing_subscriber::registry::LookupSpan<'span>
        + Send
        + Sync,
{
    use opentelemetry_otlp::WithExportConfig as _;
    use tracing_subscriber::Layer as _;

    let from_env = env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_some()
        || env("OTEL_EXPORTER_OTLP_ENDPOINT").is_some();
    let disabled = env_true("OTEL_SDK_DISABLED")
        || env("OTEL_TRACES_EXPORTER").is_some_and(|v| v.trim().eq_ignore_ascii_case("none"));
    let configured = config.endpoint.as_deref().filter(|e| !e.trim().is_empty());
    if disabled || (!from_env && configured.is_none()) {
        return Ok(None);
    }
    let mut builder = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary);
    if !from_env && let Some(endpoint) = configured {
        builder = builder.with_endpoint(traces_url(endpoint));
    }
    if env("OTEL_EXPORTER_OTLP_TIMEOUT").is_none()
        && env("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT").is_none()
    {
        builder = builder.with_timeout(Duration::from_secs(5));
    }
    let exporter = builder
        .build()
        .map_err(|e| StartTracingError::Exporter(e.to_string()))?;
    // `OTEL_BSP_SCHEDULE_DELAY` (milliseconds) is read by the builder; 500 ms otherwise.
    let mut batch = BatchConfigBuilder::default().with_max_queue_size(MAX_QUEUED_SPANS);
    if env("OTEL_BSP_SCHEDULE_DELAY").is_none() {
        batch = batch.with_scheduled_delay(Duration::from_millis(500));
    }
    let processor = BatchSpanProcessor::builder(CountingExporter { inner: exporter })
        .with_batch_config(batch.build())
        .build();
    let mut resource = opentelemetry_sdk::Resource::builder();
    if env("OTEL_SERVICE_NAME").is_none() {
        resource = resource.with_service_name(
            config
                .service_name
                .clone()
                .unwrap_or_else(|| default_service.to_owned()),
        );
    }
    let provider = SdkTracerProvider::builder()
        .with_span_processor(CountingProcessor { inner: processor })
        .with_resource(resource.build())
        .build();
    let tracer = provider.tracer("corral");
    CAPTURE_CONTENT.store(
        config.capture_content || env_true("CORRAL_TRACE_CONTENT"),
        Ordering::Relaxed,
    );
    ENABLED.store(true, Ordering::Relaxed);
    // corral's spans, and `corral serve`'s request span (which is also its log span, so it
    // keeps its module's target for log filters).
    let only_ours = tracing_subscriber::filter::Targets::new()
        .with_target(TARGET, tracing::Level::TRACE)
        .with_target(HTTP_SERVER_TARGET, tracing::Level::INFO)
        .with_default(tracing::level_filters::LevelFilter::OFF);
    let layer = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_location(false)
        .with_threads(false)
        .with_target(false)
        .with_level(false)
        .with_tracked_inactivity(false)
        .with_filter(only_ours)
        .boxed();
    Ok(Some((layer, Telemetry { provider })))
}

/// `endpoint` as the traces URL: a base URL gets `/v1/traces`, as the OTLP specification says
/// of `OTEL_EXPORTER_OTLP_ENDPOINT`.
fn traces_url(endpoint: &str) -> String {
    let trimmed = endpoint.trim().trim_end_matches('/');
    if trimmed.ends_with("/v1/traces") {
        trimmed.to_owned()
    } else {
        format!("{trimmed}/v1/traces")
    }
}

/// Counts spans the queue refuses: the batch processor's queue holds [`MAX_QUEUED_SPANS`], so
/// counting here and refusing one early means it never drops one uncounted.
#[derive(Debug)]
struct CountingProcessor {
    inner: BatchSpanProcessor,
}

impl opentelemetry_sdk::trace::SpanProcessor for CountingProcessor {
    fn on_start(&self, span: &mut opentelemetry_sdk::trace::Span, cx: &opentelemetry::Context) {
        self.inner.on_start(span, cx);
    }

    fn on_end(&self, span: opentelemetry_sdk::trace::SpanData) {
        if SPANS_QUEUED.load(Ordering::Relaxed) >= MAX_QUEUED_SPANS as u64 {
            SPANS_DROPPED.fetch_add(1, Ordering::Relaxed);
            return;
        }
        SPANS_QUEUED.fetch_add(1, Ordering::Relaxed);
        self.inner.on_end(span);
    }

    fn force_flush(&self) -> opentelemetry_sdk::error::OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> opentelemetry_sdk::error::OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &opentelemetry_sdk::Resource) {
        self.inner.set_resource(resource);
    }
}

/// Counts the spans of every batch the collector did not take.
#[derive(Debug)]
struct CountingExporter {
    inner: opentelemetry_otlp::SpanExporter,
}

impl opentelemetry_sdk::trace::SpanExporter for CountingExporter {
    async fn export(
        &self,
        batch: Vec<opentelemetry_sdk::trace::SpanData>,
    ) -> opentelemetry_sdk::error::OTelSdkResult {
        let spans = batch.len() as u64;
        let result = self.inner.export(batch).await;
        SPANS_QUEUED.fetch_sub(
            spans.min(SPANS_QUEUED.load(Ordering::Relaxed)),
            Ordering::Relaxed,
        );
        match &result {
            Ok(()) => EXPORT_FAILING.store(false, Ordering::Relaxed),
            Err(error) => {
                SPANS_DROPPED.fetch_add(spans, Ordering::Relaxed);
                // One line when export starts failing, not one per batch.
                if !EXPORT_FAILING.swap(true, Ordering::Relaxed) {
                    tracing::warn!(%error, spans, "exporting traces failed; spans are dropped until the collector answers");
                }
            }
        }
        result
    }

    fn shutdown_with_timeout(
        &mut self,
        timeout: Duration,
    ) -> opentelemetry_sdk::error::OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&mut self) -> opentelemetry_sdk::error::OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &opentelemetry_sdk::Resource) {
        self.inner.set_resource(resource);
    }
}

/// The W3C trace context of `span` (`traceparent`, and `tracestate` when not empty), or
/// nothing when it is not recorded (tracing off, or the span filtered out).
pub fn trace_headers_of(span: &tracing::Span) -> Vec<(&'static str, String)> {
    if !enabled() {
        return Vec::new();
    }
    let context = span.context();
    if !context.span().span_context().is_valid() {
        return Vec::new();
    }
    let mut carrier: HashMap<String, String> = HashMap::new();
    TraceContextPropagator::new().inject_context(&context, &mut carrier);
    let mut headers = Vec::new();
    if let Some(parent) = carrier.remove(TRACEPARENT) {
        headers.push((TRACEPARENT, parent));
    }
    if let Some(state) = carrier.remove(TRACESTATE).filter(|s| !s.is_empty()) {
        headers.push((TRACESTATE, state));
    }
    headers
}

/// The W3C trace context of the current span (see [`trace_headers_of`]).
pub fn trace_headers() -> Vec<(&'static str, String)> {
    trace_headers_of(&tracing::Span::current())
}

/// The current span's `traceparent`, if it is recorded.
pub fn current_traceparent() -> Option<String> {
    trace_headers()
        .into_iter()
        .find(|(name, _)| *name == TRACEPARENT)
        .map(|(_, value)| value)
}

fn remote_context(traceparent: &str, tracestate: Option<&str>) -> Option<opentelemetry::Context> {
    let mut carrier = HashMap::from([(TRACEPARENT.to_owned(), traceparent.to_owned())]);
    if let Some(state) = tracestate {
        carrier.insert(TRACESTATE.to_owned(), state.to_owned());
    }
    let context = TraceContextPropagator::new().extract(&carrier);
    context.span().span_context().is_valid().then_some(context)
}

/// Makes `span` a child of a caller's W3C trace context; an invalid `traceparent` is ignored
/// (the span stays where it was).
pub fn set_remote_parent(span: &tracing::Span, traceparent: &str, tracestate: Option<&str>) {
    if !enabled() {
        return;
    }
    if let Some(context) = remote_context(traceparent, tracestate) {
        let _ = span.set_parent(context);
    }
}

/// Links `span` to the span a W3C `traceparent` names (the trace a resumed turn started in).
pub fn add_link(span: &tracing::Span, traceparent: &str) {
    if !enabled() {
        return;
    }
    if let Some(context) = remote_context(traceparent, None) {
        span.add_link(context.span().span_context().clone());
    }
}

/// Sets an attribute on `span` after its creation (for values known only at its end).
pub fn set_attribute(
    span: &tracing::Span,
    key: &'static str,
    value: impl Into<opentelemetry::Value>,
) {
    if enabled() {
        span.set_attribute(key, value);
    }
}

/// Marks `span` as failed with `description`.
pub fn set_error(span: &tracing::Span, description: impl Into<String>) {
    if enabled() {
        span.set_status(opentelemetry::trace::Status::error(description.into()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_urls_get_the_traces_path() {
        assert_eq!(traces_url("http://c:4318"), "http://c:4318/v1/traces");
        assert_eq!(traces_url("http://c:4318/"), "http://c:4318/v1/traces");
        assert_eq!(
            traces_url("http://c:4318/v1/traces"),
            "http://c:4318/v1/traces"
        );
    }

    #[test]
    fn invalid_trace_contexts_are_ignored() {
        assert!(remote_context("not a traceparent", None).is_none());
        assert!(
            remote_context(
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
                Some("k=v")
            )
            .is_some()
        );
    }

    #[test]
    fn off_by_default() {
        let started = start::<tracing_subscriber::Registry>(&TracingConfig::default(), "corral");
        if env("OTEL_EXPORTER_OTLP_ENDPOINT").is_none()
            && env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_none()
        {
            assert!(matches!(started, Ok(None)));
        }
    }
}
