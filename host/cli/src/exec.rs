//! `corral exec`: run one script in the sandbox and print a JSON report on stdout.
//!
//! Exit status: 0 when the script returned, 1 when it failed or hit a limit, 2 for a usage
//! error (unknown flag, unreadable file, invalid `--user` JSON, invalid catalog).

use std::io::Read as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use corral_catalog::Catalog;
use corral_sandbox::examples::{ExampleBackend, example_catalog};
use corral_sandbox::{
    Backend, ClockGrant, EntropyGrant, Grants, InvocationContext, RunStats, Sandbox, SandboxConfig,
    ScriptUser, SessionLimits, SessionOptions,
};
use serde_json::{Value, json};

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

pub fn run(args: ExecArgs) -> ExitCode {
    let prepared = match prepare(args) {
        Ok(prepared) => prepared,
        Err(Usage(message)) => {
            eprintln!("corral exec: {message}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("corral exec: starting the async runtime failed: {error}");
            return ExitCode::from(1);
        }
    };
    let (report, ok) = runtime.block_on(execute(prepared));
    println!("{report}");
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

struct Prepared {
    source: Result<String, String>,
    catalog: Catalog,
    backend: Arc<dyn Backend>,
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

    let (catalog, backend): (Catalog, Arc<dyn Backend>) = match (&args.catalog, &args.backend_url) {
        (None, None) => (example_catalog(), Arc::new(ExampleBackend)),
        (Some(path), Some(url)) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| Usage(format!("cannot read {}: {e}", path.display())))?;
            let catalog = Catalog::from_any_json_str(&text, args.namespace.as_deref())
                .map_err(|e| Usage(format!("invalid catalog {}: {e}", path.display())))?;
            let backend = WebhookBackend::new(url).map_err(|e| Usage(format!("{e}")))?;
            (catalog, Arc::new(backend))
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
        limits.fuel = fuel;
    }
    if let Some(ms) = args.timeout_ms {
        limits.timeout_ms = ms;
    }
    if let Some(mb) = args.memory_mb {
        limits.memory_bytes = mb.saturating_mul(1 << 20);
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
        user,
        limits,
        grants,
    })
}

/// Runs the script; returns the JSON report and whether the script succeeded.
async fn execute(prepared: Prepared) -> (Value, bool) {
    let source = match prepared.source {
        Ok(source) => source,
        Err(message) => return (failure("invalid_input", &message), false),
    };
    let config = SandboxConfig {
        // One session lives in this process; a small pool starts faster.
        max_sessions: 2,
        max_memory_bytes: prepared
            .limits
            .memory_bytes
            .max(SandboxConfig::default().max_memory_bytes),
        ..SandboxConfig::default()
    };
    let sandbox = match Sandbox::new(config) {
        Ok(sandbox) => sandbox,
        Err(error) => {
            return (failure("internal_error", &error.to_string()), false);
        }
    };
    let options = SessionOptions {
        context: InvocationContext {
            session_id: "exec".into(),
            ..InvocationContext::default()
        },
        user: prepared.user,
        limits: prepared.limits,
        grants: prepared.grants,
        ..SessionOptions::new(Arc::new(prepared.catalog), prepared.backend)
    };
    let mut session = match sandbox.session(options).await {
        Ok(session) => session,
        Err(error) => {
            return (failure("internal_error", &error.to_string()), false);
        }
    };
    let report = session.run(&source).await;
    session.close();
    (report.to_json(), report.outcome.is_ok())
}

fn failure(kind: &str, message: &str) -> Value {
    json!({
        "ok": false,
        "error": {"kind": kind, "message": message},
        "logs": [],
        "stats": RunStats::default().to_json(),
    })
}
