//! Logs, the same way for every command (`corral serve`, `corral chat`, `corral exec`):
//!
//! - `CORRAL_LOG` sets what is logged (an `EnvFilter`: `info`, `warn,corral_server=debug`...),
//!   falling back to `RUST_LOG`, then to the command's default.
//! - `CORRAL_LOG_FORMAT=json` writes one JSON object per line (with the span fields, such as
//!   a request's `request_id`); `text`, the default, one readable line. `corral serve` also
//!   takes `logFormat` from its configuration file; the variable wins.
//! - Colour codes only when stderr is a terminal and `NO_COLOR` is not set.
//! - Traces (docs/tracing.md): exported over OTLP when `OTEL_EXPORTER_OTLP_ENDPOINT` (or
//!   `corral serve`'s `[tracing] endpoint`) is set, whatever the log filter says; the returned
//!   [`Tracing`] flushes them, within a bound, when it is dropped.

use std::io::IsTerminal as _;

use corral_server::logging::LogFormat;
use corral_telemetry::{Telemetry, TracingConfig};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::Layer as _;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

/// The log-level variable.
pub const LEVEL_VAR: &str = "CORRAL_LOG";
/// The log-format variable.
pub const FORMAT_VAR: &str = "CORRAL_LOG_FORMAT";

/// How long the last spans may take to reach the collector when the command ends.
const TRACE_FLUSH_BOUND: std::time::Duration = std::time::Duration::from_secs(5);

/// The process's tracing, if it is on: dropping it flushes the spans still queued (waiting at
/// most [`TRACE_FLUSH_BOUND`]).
#[derive(Debug, Default)]
pub struct Tracing(Option<Telemetry>);

impl Drop for Tracing {
    fn drop(&mut self) {
        if let Some(telemetry) = self.0.take() {
            telemetry.shutdown(TRACE_FLUSH_BOUND);
        }
    }
}

/// Installs the process's subscriber: logs on stderr, and traces when `tracing` (or the
/// `OTEL_*` variables) turn them on. `default` is the filter without `CORRAL_LOG` and
/// `RUST_LOG`; `configured` the format of a configuration file, if any. Problems with the
/// variables are reported on stderr and the defaults used.
pub fn init(default: &str, configured: Option<LogFormat>, tracing: &TracingConfig) -> Tracing {
    let filter = match filter_text() {
        Some((var, text)) => EnvFilter::try_new(&text).unwrap_or_else(|error| {
            eprintln!("corral: ignoring {var}={text:?}: {error}");
            EnvFilter::new(default)
        }),
        None => EnvFilter::new(default),
    };
    let format = match std::env::var(FORMAT_VAR) {
        Ok(text) if !text.trim().is_empty() => match LogFormat::parse(&text) {
            Ok(format) => format,
            Err(problem) => {
                eprintln!("corral: ignoring {FORMAT_VAR}: it {problem}");
                configured.unwrap_or(LogFormat::Text)
            }
        },
        _ => configured.unwrap_or(LogFormat::Text),
    };
    let ansi = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let logs = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    let logs = match format {
        LogFormat::Json => logs
            .json()
            .with_current_span(true)
            .with_filter(filter)
            .boxed(),
        _ => logs.with_filter(filter).boxed(),
    };
    let (traces, telemetry) = match corral_telemetry::start(tracing, "corral") {
        Ok(Some((layer, telemetry))) => (Some(layer), Some(telemetry)),
        Ok(None) => (None, None),
        Err(error) => {
            eprintln!("corral: tracing is off: {error}");
            (None, None)
        }
    };
    let _ = tracing_subscriber::registry()
        .with(logs)
        .with(traces)
        .try_init();
    Tracing(telemetry)
}

/// `CORRAL_LOG`, else `RUST_LOG`, when set and not empty: the variable and its text.
fn filter_text() -> Option<(&'static str, String)> {
    [LEVEL_VAR, "RUST_LOG"].into_iter().find_map(|var| {
        std::env::var(var)
            .ok()
            .filter(|text| !text.trim().is_empty())
            .map(|text| (var, text))
    })
}
