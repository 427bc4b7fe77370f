//! `corral exec`: run one script in the sandbox and print a JSON report on stdout.
//!
//! Exit status: 0 when the script returned, 1 when it failed or hit a limit, 2 for a usage
//! error (unknown flag, unreadable file, invalid `--user` JSON, invalid catalog, invalid MCP
//! server declaration, a missing MCP secret, a limit flag outside its range).
//!
//! Every run that gets as far as the sandbox (exit 0 or 1) prints exactly one line on stdout:
//! the report, as compact UTF-8 JSON. Usage errors print one line on stderr and nothing on
//! stdout. A stdout that is closed early (`| head -c 16`) ends the command with status 1 and a
//! note on stderr, never a panic.
//!
//! MCP servers (`--mcp`, `--mcp-url`, `--mcp-config`) are started before the script runs; their
//! tools are the catalog (or are added to `--catalog`'s), and they are stopped before exit.
//! Servers or tools that cannot be used are reported on stderr and left out.
//!
//! Traces (docs/tracing.md): with `OTEL_EXPORTER_OTLP_ENDPOINT` (or `..._TRACES_ENDPOINT`) set,
//! the run is an `execute_tool run_js` span (a child of the caller's `TRACEPARENT` variable, if
//! any) with one `execute_tool {capability}` child per capability call, whatever task the
//! sandbox runs the call on; webhook and MCP calls carry their span's trace context. The spans
//! are flushed, within a bound, before the process exits.

use std::io::{Read as _, Write as _};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use corral_catalog::{Catalog, Redactor};
use corral_mcp::{McpBinding, McpHub, McpServerConfig};
use corral_sandbox::examples::{ExampleBackend, example_catalog};
use corral_sandbox::{
    Backend, ClockGrant, CreateSessionError, EntropyGrant, ExecError, GUEST_MAX_MEMORY_BYTES,
    Grants, Invocation, InvocationContext, InvokeCapabilityError, MAX_TIMEOUT_MS, RunStats,
    Sandbox, SandboxConfig, ScriptReport, ScriptUser, SessionLimits, SessionOptions, ToolResult,
};
use serde_json::{Value, json};

use crate::mcp_args::McpFlags;
use crate::webhook::WebhookBackend;

/// Arguments of `corral exec`.
#[derive(Debug, clap::Args)]
pub struct ExecArgs {
    /// The script (the body of an async function), or `-` to read it from stdin.
    script: PathBuf,
    /// Capability definitions to bind (corral catalog or MCP tools/list JSON). Without it, the
    /// built-in examples (examples.echo, examples.sleep, examples.text, examples.fail) are bound.
    #[arg(long)]
    catalog: Option<PathBuf>,
    /// Id prefix for an MCP tools/list catalog.
    #[arg(long, requires = "catalog")]
    namespace: Option<String>,
    /// Where calls of `--catalog` capabilities are POSTed as JSON.
    #[arg(long)]
    backend_url: Option<String>,
    #[command(flatten)]
    mcp: Box<McpFlags>,
    /// Fuel budget of the script.
    #[arg(long)]
    fuel: Option<u64>,
    /// Wall-clock budget of the script, in milliseconds.
    #[arg(long)]
    timeout_ms: Option<u64>,
    /// Linear-memory cap, in MiB.
    #[arg(long)]
    memory_mb: Option<u64>,
    /// Calls allowed in flight at once (more wait in a queue).
    #[arg(long)]
    max_concurrent_calls: Option<u32>,
    /// Calls the script may start in all.
    #[arg(long)]
    max_total_calls: Option<u32>,
    /// The user shown to the script: {"id", "email"?, "displayName"?}.
    #[arg(long)]
    user: Option<String>,
    /// Grant the host's real clock (by default `Date.now()` is frozen at 0).
    #[arg(long)]
    real_clock: bool,
    /// Grant fresh randomness (by default `Math.random()` is seeded with 0).
    #[arg(long)]
    host_entropy: bool,
}

/// A usage error: reported on stderr with exit status 2.
struct Usage(String);

/// One line on stderr; a closed stderr is not worth a panic.
fn note(message: &str) {
    let _ = writeln!(std::io::stderr(), "corral exec: {message}");
}

/// The largest `--memory-mb`: the most any session's memory may be.
const MAX_MEMORY_MB: u64 = GUEST_MAX_MEMORY_BYTES >> 20;

pub fn run(args: ExecArgs) -> ExitCode {
    // MCP servers' stderr and notices go to our stderr; stdout stays the one JSON report. The
    // traces, if on, are flushed (within a bound) when `_tracing` is dropped, after the report.
    let _tracing = args.mcp.init_logging();
    let prepared = match prepare(args) {
        Ok(prepared) => prepared,
        Err(Usage(message)) => {
            note(&message);
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            let report = failure(
                "internal_error",
                &format!("starting the async runtime failed: {error}"),
            );
            return print_report(&report, false);
        }
    };
    let (report, ok) = match runtime.block_on(execute(prepared)) {
        Ok(outcome) => outcome,
        Err(Usage(message)) => {
            note(&message);
            return ExitCode::from(2);
        }
    };
    print_report(&report, ok)
}

/// Prints the report as one line and picks the exit status.
fn print_report(report: &Value, ok: bool) -> ExitCode {
    let mut stdout = std::io::stdout().lock();
    if let Err(error) = writeln!(stdout, "{report}").and_then(|()| stdout.flush()) {
        note(&format!("writing the report failed: {error}"));
        return ExitCode::from(1);
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

struct Prepared {
    source: Result<String, String>,
    /// The capabilities besides MCP tools (`None`: only MCP tools).
    catalog: Option<Catalog>,
    backend: Option<Arc<dyn Backend>>,
    mcp_servers: Vec<McpServerConfig>,
    hub: McpHub,
    user: Option<ScriptUser>,
    limits: SessionLimits,
    grants: Grants,
}

fn prepare(args: ExecArgs) -> Result<Prepared, Usage> {
    let bytes = if args.script.as_os_str() == "-" {
        let mut bytes = Vec::new();
        std::io::stdin()
            .read_to_end(&mut bytes)
            .map_err(|e| Usage(format!("cannot read the script from stdin: {e}")))?;
        bytes
    } else {
        std::fs::read(&args.script)
            .map_err(|e| Usage(format!("cannot read {}: {e}", args.script.display())))?
    };
    // Text that is not UTF-8 is the script's problem (invalid_input), not a usage error.
    let source = String::from_utf8(bytes).map_err(|e| format!("the script is not UTF-8: {e}"));

    let mcp_servers = args.mcp.servers().map_err(Usage)?;
    let (catalog, backend): (Option<Catalog>, Option<Arc<dyn Backend>>) =
        match (&args.catalog, &args.backend_url) {
            // With MCP servers and no --catalog, their tools are the whole catalog.
            (None, None) if !mcp_servers.is_empty() => (None, None),
            (None, None) => (Some(example_catalog()), Some(Arc::new(ExampleBackend))),
            (Some(path), Some(url)) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| Usage(format!("cannot read {}: {e}", path.display())))?;
                let catalog = Catalog::from_any_json_str(&text, args.namespace.as_deref())
                    .map_err(|e| Usage(format!("invalid catalog {}: {e}", path.display())))?;
                let backend = WebhookBackend::new(url).map_err(|e| Usage(format!("{e}")))?;
                (Some(catalog), Some(Arc::new(backend)))
            }
            (Some(_), None) => {
                return Err(Usage(
                    "--catalog needs --backend-url: the URL its calls are POSTed to".into(),
                ));
            }
            (None, Some(_)) => {
                return Err(Usage(
                    "--backend-url needs --catalog: the capabilities it implements".into(),
                ));
            }
        };

    let user = args
        .user
        .as_deref()
        .map(serde_json::from_str::<ScriptUser>)
        .transpose()
        .map_err(|e| {
            Usage(format!(
                "invalid --user JSON (want {{\"id\", \"email\"?, \"displayName\"?}}): {e}"
            ))
        })?;

    let mut limits = SessionLimits::default();
    if let Some(fuel) = args.fuel {
        if fuel == 0 {
            return Err(Usage(format!(
                "--fuel must be between 1 and {}, not 0",
                u64::MAX
            )));
        }
        limits.fuel = fuel;
    }
    if let Some(ms) = args.timeout_ms {
        if !(1..=MAX_TIMEOUT_MS).contains(&ms) {
            return Err(Usage(format!(
                "--timeout-ms must be between 1 and {MAX_TIMEOUT_MS} (one day), not {ms}"
            )));
        }
        limits.timeout_ms = ms;
    }
    if let Some(mb) = args.memory_mb {
        // The lower end is the guest's initial memory, known once it is instantiated (see
        // run_script); this is the range the flag can mean at all.
        if !(1..=MAX_MEMORY_MB).contains(&mb) {
            return Err(Usage(format!(
                "--memory-mb must be between the guest's initial memory (about 5) and {MAX_MEMORY_MB}, not {mb}"
            )));
        }
        limits.memory_bytes = mb << 20;
    }
    if let Some(n) = args.max_concurrent_calls {
        if n == 0 {
            return Err(Usage("--max-concurrent-calls must be at least 1".into()));
        }
        limits.max_concurrent_calls = n;
    }
    if let Some(n) = args.max_total_calls {
        limits.max_total_calls = n;
    }
    let grants = Grants {
        clock: if args.real_clock {
            ClockGrant::Real
        } else {
            ClockGrant::default()
        },
        entropy: if args.host_entropy {
            EntropyGrant::Host
        } else {
            EntropyGrant::default()
        },
    };
    Ok(Prepared {
        source,
        catalog,
        backend,
        mcp_servers,
        hub: args.mcp.hub(),
        user,
        limits,
        grants,
    })
}

/// The MCP tools (listed now) bound after the other capabilities, whose calls the MCP backend
/// hands on.
async fn bind(prepared: &mut Prepared) -> Result<McpBinding, Usage> {
    let others = prepared.catalog.take();
    let fallback = prepared.backend.take();
    if prepared.mcp_servers.is_empty() && (others.is_none() || fallback.is_none()) {
        return Err(Usage("nothing to bind".into()));
    }
    let bound = prepared
        .hub
        .bind(&prepared.mcp_servers, others, fallback)
        .await
        .map_err(|e| Usage(e.to_string()))?;
    for error in &bound.errors {
        note(&format!("MCP: {error}"));
    }
    Ok(bound)
}

/// Runs the script; returns the JSON report and whether the script succeeded.
async fn execute(mut prepared: Prepared) -> Result<(Value, bool), Usage> {
    let hub = prepared.hub.clone();
    let outcome = match bind(&mut prepared).await {
        Ok(bound) => run_script(prepared, bound).await,
        Err(usage) => Err(usage),
    };
    hub.shutdown().await;
    outcome
}

async fn run_script(prepared: Prepared, bound: McpBinding) -> Result<(Value, bool), Usage> {
    let source = match prepared.source {
        Ok(source) => source,
        Err(message) => return Ok((failure("invalid_input", &message), false)),
    };
    let config = SandboxConfig {
        // One session lives in this process: reserving slots for more would only delay it.
        max_sessions: 1,
        pool: false,
        max_memory_bytes: prepared
            .limits
            .memory_bytes
            .max(SandboxConfig::default().max_memory_bytes),
        ..SandboxConfig::default()
    };
    let sandbox = match Sandbox::new(config) {
        Ok(sandbox) => sandbox,
        Err(error) => {
            return Ok((failure("internal_error", &error.to_string()), false));
        }
    };
    let asked_mb = prepared.limits.memory_bytes >> 20;
    let redactor = Arc::new(bound.redactor);
    let span = script_span(&source, &redactor);
    // The calls' parent, shared with the backend and let go of once the script is over, so the
    // script's span ends (and is exported) whatever keeps the backend alive.
    let parent = Arc::new(std::sync::Mutex::new(span.clone()));
    let backend: Arc<dyn Backend> = if corral_telemetry::enabled() {
        Arc::new(TracedBackend {
            inner: bound.backend,
            parent: Arc::clone(&parent),
            redactor: Arc::clone(&redactor),
        })
    } else {
        bound.backend
    };
    let options = SessionOptions {
        context: InvocationContext {
            session_id: "exec".into(),
            ..InvocationContext::default()
        },
        user: prepared.user,
        limits: prepared.limits,
        grants: prepared.grants,
        redactor: Arc::clone(&redactor),
        ..SessionOptions::new(Arc::new(bound.catalog), backend)
    };
    let mut session = match sandbox.session(options).await {
        Ok(session) => session,
        Err(CreateSessionError::MemoryBelowGuestStart { needed_bytes, .. }) => {
            let min_mb = needed_bytes.div_ceil(1 << 20);
            return Err(Usage(format!(
                "--memory-mb must be between {min_mb} (the guest's initial memory) and {MAX_MEMORY_MB}, not {asked_mb}"
            )));
        }
        Err(CreateSessionError::InvalidOptions(message)) => return Err(Usage(message)),
        Err(error) => {
            return Ok((failure("internal_error", &error.to_string()), false));
        }
    };
    let report = {
        use tracing::Instrument as _;
        session.run(&source).instrument(span.clone()).await
    };
    session.close();
    *parent
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = tracing::Span::none();
    record_report(&span, &report, &redactor);
    drop(span);
    // The process ends right after the report: the kernel reclaims the compiled code and the
    // pool at exit, which is cheaper than unmapping them piece by piece first.
    std::mem::forget(sandbox);
    Ok((report.to_json(), report.outcome.is_ok()))
}

/// The script's span, `execute_tool run_js` as in the chat runtime (docs/tracing.md): a root,
/// or a child of the caller's W3C trace context in the `TRACEPARENT` (and `TRACESTATE`)
/// environment variables. Its source is recorded, redacted, only with content capture on.
fn script_span(source: &str, redactor: &Redactor) -> tracing::Span {
    let span = tracing::info_span!(
        target: corral_telemetry::TARGET,
        "execute_tool",
        otel.name = "execute_tool run_js",
        otel.kind = "internal",
        otel.status_code = tracing::field::Empty,
        gen_ai.operation.name = "execute_tool",
        gen_ai.tool.name = "run_js",
        corral.replayed = false,
        corral.fuel = tracing::field::Empty,
        corral.wall_us = tracing::field::Empty,
        corral.peak_memory_bytes = tracing::field::Empty,
        corral.calls = tracing::field::Empty,
        corral.peak_concurrent_calls = tracing::field::Empty,
        corral.limit = tracing::field::Empty,
        corral.is_error = tracing::field::Empty,
        gen_ai.tool.call.arguments = tracing::field::Empty,
        gen_ai.tool.call.result = tracing::field::Empty,
        error.type = tracing::field::Empty,
    );
    if span.is_disabled() {
        return span;
    }
    let variable = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    if let Some(parent) = variable("TRACEPARENT") {
        corral_telemetry::set_remote_parent(&span, &parent, variable("TRACESTATE").as_deref());
    }
    if corral_telemetry::capture_content() {
        let mut arguments = json!({ "code": source });
        redactor.redact_json(&mut arguments);
        span.record("gen_ai.tool.call.arguments", arguments.to_string());
    }
    span
}

/// The script's costs, the limit it hit and (with content capture on) its report on its span.
fn record_report(span: &tracing::Span, report: &ScriptReport, redactor: &Redactor) {
    if span.is_disabled() {
        return;
    }
    let stats = &report.stats;
    span.record("corral.fuel", stats.fuel);
    span.record("corral.wall_us", stats.wall_us);
    span.record("corral.peak_memory_bytes", stats.peak_memory_bytes);
    span.record("corral.calls", stats.calls);
    span.record("corral.peak_concurrent_calls", stats.peak_concurrent_calls);
    span.record("corral.is_error", report.outcome.is_err());
    let json = report.to_json();
    if let Err(error) = &report.outcome {
        span.record("otel.status_code", "ERROR");
        if let ExecError::LimitExceeded { limit, .. } = error {
            span.record("corral.limit", limit.kind());
        }
        if let Some(kind) = json["error"]["kind"].as_str() {
            span.record("error.type", kind);
        }
    }
    if corral_telemetry::capture_content() {
        let mut shown = json;
        redactor.redact_json(&mut shown);
        span.record("gen_ai.tool.call.result", shown.to_string());
    }
}

/// The backend of a traced run: each call is an `execute_tool {capability}` span, a child of
/// the script's span whichever task the sandbox runs it on, current while the inner backend
/// runs it (so a webhook or an MCP request carries its trace context).
struct TracedBackend {
    inner: Arc<dyn Backend>,
    parent: Arc<std::sync::Mutex<tracing::Span>>,
    redactor: Arc<Redactor>,
}

#[async_trait::async_trait]
impl Backend for TracedBackend {
    async fn invoke(
        &self,
        context: &InvocationContext,
        invocation: Invocation,
    ) -> Result<ToolResult, InvokeCapabilityError> {
        use tracing::Instrument as _;
        let parent = self
            .parent
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        let capability = invocation.capability_id.clone();
        let name = format!("execute_tool {capability}");
        let span = tracing::info_span!(
            target: corral_telemetry::TARGET,
            parent: &parent,
            "execute_tool",
            otel.name = name.as_str(),
            otel.kind = "internal",
            otel.status_code = tracing::field::Empty,
            gen_ai.operation.name = "execute_tool",
            gen_ai.tool.name = capability.as_str(),
            gen_ai.tool.call.id = invocation.tool_call_id.as_str(),
            // The sandbox calls the backend only once the input passed the catalog's schema.
            corral.validation = "passed",
            corral.replayed = false,
            corral.wall_us = tracing::field::Empty,
            corral.outcome = tracing::field::Empty,
            gen_ai.tool.call.arguments = tracing::field::Empty,
            gen_ai.tool.call.result = tracing::field::Empty,
            error.type = tracing::field::Empty,
        );
        let capture = corral_telemetry::capture_content() && !span.is_disabled();
        if capture {
            let mut input = invocation.input.clone();
            self.redactor.redact_json(&mut input);
            span.record("gen_ai.tool.call.arguments", input.to_string());
        }
        let started = std::time::Instant::now();
        let result = self
            .inner
            .invoke(context, invocation)
            .instrument(span.clone())
            .await;
        span.record(
            "corral.wall_us",
            u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX),
        );
        match &result {
            Ok(done) => {
                span.record("corral.outcome", "ok");
                if capture {
                    let mut output = done.output.clone();
                    self.redactor.redact_json(&mut output);
                    span.record("gen_ai.tool.call.result", output.to_string());
                }
            }
            Err(error) => {
                span.record("corral.outcome", "error");
                span.record("otel.status_code", "ERROR");
                let kind = match error {
                    InvokeCapabilityError::PermissionDenied { .. } => "permission_denied",
                    InvokeCapabilityError::UnknownCapability { .. } => "unknown_capability",
                    _ => "failed",
                };
                span.record("error.type", kind);
                if capture {
                    span.record(
                        "gen_ai.tool.call.result",
                        &*self.redactor.redact_text(&error.to_string()),
                    );
                }
            }
        }
        result
    }
}

fn failure(kind: &str, message: &str) -> Value {
    json!({
        "ok": false,
        "error": {"kind": kind, "message": message},
        "logs": [],
        "stats": RunStats::default().to_json(),
    })
}
