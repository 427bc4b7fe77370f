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

use std::io::{Read as _, Write as _};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use corral_catalog::Catalog;
use corral_mcp::{McpBinding, McpHub, McpServerConfig};
use corral_sandbox::examples::{ExampleBackend, example_catalog};
use corral_sandbox::{
    Backend, ClockGrant, CreateSessionError, EntropyGrant, GUEST_MAX_MEMORY_BYTES, Grants,
    InvocationContext, MAX_TIMEOUT_MS, RunStats, Sandbox, SandboxConfig, ScriptUser, SessionLimits,
    SessionOptions,
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
    // MCP servers' stderr and notices go to our stderr; stdout stays the one JSON report.
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
    let options = SessionOptions {
        context: InvocationContext {
            session_id: "exec".into(),
            ..InvocationContext::default()
        },
        user: prepared.user,
        limits: prepared.limits,
        grants: prepared.grants,
        redactor: Arc::new(bound.redactor),
        ..SessionOptions::new(Arc::new(bound.catalog), bound.backend)
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
    let report = session.run(&source).await;
    session.close();
    // The process ends right after the report: the kernel reclaims the compiled code and the
    // pool at exit, which is cheaper than unmapping them piece by piece first.
    std::mem::forget(sandbox);
    Ok((report.to_json(), report.outcome.is_ok()))
}

fn failure(kind: &str, message: &str) -> Value {
    json!({
        "ok": false,
        "error": {"kind": kind, "message": message},
        "logs": [],
        "stats": RunStats::default().to_json(),
    })
}
