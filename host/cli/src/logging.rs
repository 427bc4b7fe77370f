//! Logs, the same way for every command (`corral serve`, `corral chat`, `corral exec`):
//!
//! - `CORRAL_LOG` sets what is logged (an `EnvFilter`: `info`, `warn,corral_server=debug`...),
//!   falling back to `RUST_LOG`, then to the command's default.
//! - `CORRAL_LOG_FORMAT=json` writes one JSON object per line (with the span fields, such as
//!   a request's `request_id`); `text`, the default, one readable line. `corral serve` also
//!   takes `logFormat` from its configuration file; the variable wins.
//! - Colour codes only when stderr is a terminal and `NO_COLOR` is not set.

use std::io::IsTerminal as _;

use corral_server::logging::LogFormat;
use tracing_subscriber::EnvFilter;

/// The log-level variable.
pub const LEVEL_VAR: &str = "CORRAL_LOG";
/// The log-format variable.
pub const FORMAT_VAR: &str = "CORRAL_LOG_FORMAT";

/// Installs the process's subscriber on stderr. `default` is the filter without `CORRAL_LOG`
/// and `RUST_LOG`; `configured` the format of a configuration file, if any. Problems with the
/// variables are reported on stderr and the defaults used.
pub fn init(default: &str, configured: Option<LogFormat>) {
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
    let builder = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(filter)
        .with_ansi(ansi);
    let _ = match format {
        LogFormat::Json => builder.json().with_current_span(true).try_init(),
        _ => builder.try_init(),
    };
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
