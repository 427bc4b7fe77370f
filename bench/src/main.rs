//! `corral-bench`: corral's sandbox measured side by side with the sandboxes a user would pick
//! instead (run in the same invocation), plus fuel per workload, the durable store step and the
//! chat runtime's cost per turn.
//!
//! ```text
//! corral-bench [--quick] [--out DIR] [--no-peers] [--no-store]
//!              [--before BIN [--before-label TEXT]]
//! corral-bench --rerender bench/results.json     (REPORT.md again from saved figures)
//! corral-bench --only WORKLOAD|model-context|fuel  (one workload's figures as JSON)
//! ```
//!
//! `--before BIN` names a `corral-bench` built from an earlier commit: it measures the sandbox's
//! own workloads again in the same invocation (`BIN --only WORKLOAD` for each), and the report
//! sets them beside this build's figures, so a speed change is shown before and after on one
//! machine in one run. `--before-label` names that build in the report (a commit, say).
//!
//! Writes `DIR/results.json` (every figure, machine-readable) and `DIR/REPORT.md` (tables,
//! ratios and targets). Without `--out`, a full run writes `bench/results.json` and
//! `bench/REPORT.md`; a `--quick` run (a handful of iterations, used by the test suite so the
//! harness cannot rot) writes into a temporary folder and its figures mean nothing.

#![forbid(unsafe_code)]

mod model;
mod report;
mod stats;
mod workloads;

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, bail};
use serde_json::{Value, json};

use crate::stats::Measurement;
use crate::workloads::Plan;

struct Args {
    quick: bool,
    out: Option<PathBuf>,
    peers: bool,
    store: bool,
    child: Option<String>,
    only: Option<String>,
    rerender: Option<PathBuf>,
    before: Option<PathBuf>,
    before_label: Option<String>,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut args = Args {
        quick: false,
        out: None,
        peers: true,
        store: true,
        child: None,
        only: None,
        rerender: None,
        before: None,
        before_label: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--quick" => args.quick = true,
            "--no-peers" => args.peers = false,
            "--no-store" => args.store = false,
            "--out" => args.out = Some(PathBuf::from(it.next().context("--out needs a folder")?)),
            "--child" => args.child = Some(it.next().context("--child needs a name")?),
            "--only" => args.only = Some(it.next().context("--only needs a workload")?),
            "--before" => {
                args.before = Some(PathBuf::from(
                    it.next().context("--before needs a corral-bench binary")?,
                ))
            }
            "--before-label" => {
                args.before_label = Some(it.next().context("--before-label needs a text")?)
            }
            "--rerender" => {
                args.rerender = Some(PathBuf::from(
                    it.next().context("--rerender needs a results.json")?,
                ))
            }
            other => bail!(
                "unknown argument {other}\nusage: corral-bench [--quick] [--out DIR] [--no-peers] [--no-store] [--only WORKLOAD] [--before BIN [--before-label TEXT]]"
            ),
        }
    }
    Ok(args)
}

pub(crate) fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn main() -> anyhow::Result<()> {
    let args = parse_args()?;
    if let Some(results) = &args.rerender {
        // Renders REPORT.md again from a results.json (after a change to the report's layout).
        let document: Value = serde_json::from_slice(&std::fs::read(results)?)?;
        let markdown = report::markdown(&document)?;
        let out = results.with_file_name("REPORT.md");
        std::fs::write(&out, &markdown)?;
        eprintln!("corral-bench: wrote {}", out.display());
        return Ok(());
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    if args.child.as_deref() == Some("rss") {
        return runtime.block_on(workloads::rss_child());
    }
    if let Some(only) = &args.only {
        // Profiling aid: one corral workload, printed as JSON, nothing written.
        let plan = Plan { quick: args.quick };
        if only == "fuel" {
            let rows = runtime.block_on(async {
                let sandbox = workloads::sandbox(true, true)?;
                workloads::fuel_table(plan, &sandbox).await
            })?;
            println!("{}", serde_json::to_string_pretty(&rows)?);
            return Ok(());
        }
        if only == "model-context" {
            let figures = runtime.block_on(async {
                let sandbox = workloads::sandbox(true, true)?;
                model::model_context(plan, &sandbox).await
            })?;
            println!("{}", serde_json::to_string_pretty(&figures)?);
            return Ok(());
        }
        let results = runtime.block_on(workloads::only(plan, only))?;
        println!("{}", serde_json::to_string_pretty(&results)?);
        return Ok(());
    }
    let plan = Plan { quick: args.quick };
    let out = match (&args.out, args.quick) {
        (Some(out), _) => out.clone(),
        (None, false) => repo_root().join("bench"),
        (None, true) => {
            std::env::temp_dir().join(format!("corral-bench-quick-{}", std::process::id()))
        }
    };
    std::fs::create_dir_all(&out)?;

    eprintln!(
        "corral-bench: corral workloads{}",
        if plan.quick { " (quick)" } else { "" }
    );
    let (mut results, fuel) = runtime.block_on(corral_workloads(plan))?;
    eprintln!("corral-bench: what the model sees (tokens, enumeration fuel, pre-flight)");
    let model_context = runtime.block_on(async {
        let sandbox = workloads::sandbox(true, true)?;
        model::model_context(plan, &sandbox).await
    })?;
    results.push(workloads::process_start(plan)?);
    results.extend(workloads::rss_per_session()?);
    let before = match &args.before {
        Some(bin) => {
            eprintln!("corral-bench: the same workloads on {}", bin.display());
            let label = args
                .before_label
                .clone()
                .unwrap_or_else(|| bin.display().to_string());
            json!({"label": label, "results": run_before(bin, plan)?})
        }
        None => Value::Null,
    };

    let peers = if args.peers {
        eprintln!("corral-bench: peers (node bench/peers/run.mjs)");
        run_peers(plan)?
    } else {
        json!({"results": [], "peers": {}, "note": "peers skipped (--no-peers)"})
    };
    if let Some(list) = peers["results"].as_array() {
        for value in list {
            results.push(serde_json::from_value(value.clone()).context("a peer result")?);
        }
    }
    let (store, chat_turn, serve, tracing) = if args.store {
        eprintln!("corral-bench: durable store step");
        let quick = ["--steps", "50", "--seconds", "0.3"];
        let store = run_example("durable_step_bench", "corral-store", plan.quick, &quick)?;
        eprintln!("corral-bench: chat runtime per turn");
        let turn = run_example("turn_bench", "corral-chat", plan.quick, &["--turns", "8"])?;
        eprintln!("corral-bench: corral serve over loopback");
        let serve = run_example("serve_bench", "corral-cli", plan.quick, &["--quick"])?;
        eprintln!("corral-bench: a turn with tracing off and on");
        let tracing = run_example("trace_bench", "corral-cli", plan.quick, &["--quick"])?;
        (store, turn, serve, tracing)
    } else {
        (Value::Null, Value::Null, Value::Null, Value::Null)
    };
    let js_host = if args.peers {
        eprintln!("corral-bench: the JavaScript host (node js/bench.mjs)");
        run_js_host(plan)?
    } else {
        Value::Null
    };
    let mcp = if args.peers {
        eprintln!("corral-bench: MCP tool calls, corral and the TypeScript SDK");
        run_mcp_bench(plan)?
    } else {
        Value::Null
    };

    let document = json!({
        "date": report::today(),
        "mode": if plan.quick { "quick" } else { "full" },
        "machine": report::machine(),
        "versions": {
            "corral": env!("CARGO_PKG_VERSION"),
            "wasmtime": "48.0.8",
            "javy": "8.1.0 (QuickJS-ng 0.15.1)",
            "peers": peers["peers"],
            "node": peers["node"],
        },
        "results": results,
        "fuel": fuel,
        "durable_step": store,
        "chat_turn": chat_turn,
        "serve": serve,
        "tracing": tracing,
        "model_context": model_context,
        "mcp_call": mcp,
        "js_host": js_host,
        "before": before,
    });
    std::fs::write(
        out.join("results.json"),
        serde_json::to_string_pretty(&document)?,
    )?;
    let markdown = report::markdown(&document)?;
    std::fs::write(out.join("REPORT.md"), &markdown)?;
    println!("{markdown}");
    eprintln!("corral-bench: wrote {}", out.display());
    Ok(())
}

async fn corral_workloads(plan: Plan) -> anyhow::Result<(Vec<Measurement>, Vec<Value>)> {
    let sandbox = workloads::sandbox(true, true)?;
    let mut results = workloads::new_session(plan, &sandbox).await?;
    if !plan.quick {
        results.extend(workloads::session_create(&sandbox).await?);
    }
    results.extend(workloads::fib27(plan).await?);
    results.push(workloads::call_roundtrip(plan, &sandbox).await?);
    results.push(workloads::concurrent_calls(plan, &sandbox).await?);
    results.push(workloads::deadline_overshoot(plan, &sandbox).await?);
    let fuel = workloads::fuel_table(plan, &sandbox).await?;
    Ok((results, fuel))
}

/// Runs `bin --only W [--quick]` for each of [`report::BEFORE_WORKLOADS`]: an earlier build's
/// figures for the same workloads, on the same machine in the same invocation.
fn run_before(bin: &Path, plan: Plan) -> anyhow::Result<Vec<Measurement>> {
    let mut out = Vec::new();
    for workload in report::BEFORE_WORKLOADS {
        let mut command = Command::new(bin);
        command.args(["--only", workload]);
        if plan.quick {
            command.arg("--quick");
        }
        let output = command
            .output()
            .with_context(|| format!("running {}", bin.display()))?;
        if !output.status.success() {
            bail!(
                "{} --only {workload} failed:\n{}",
                bin.display(),
                String::from_utf8_lossy(&output.stderr)
            );
        }
        let measured: Vec<Measurement> = serde_json::from_slice(&output.stdout)
            .with_context(|| format!("{} --only {workload} printed no results", bin.display()))?;
        out.extend(measured);
    }
    Ok(out)
}

fn run_peers(plan: Plan) -> anyhow::Result<Value> {
    node_json(
        &repo_root().join("bench/peers"),
        "run.mjs",
        plan.quick,
        "bench/peers/install.sh",
    )
}

/// The JS host (`js/`, the guest on jco in Node) beside quickjs-emscripten, measured by
/// `js/bench.mjs` in this run.
fn run_js_host(plan: Plan) -> anyhow::Result<Value> {
    let dir = repo_root().join("js");
    if !dir.join("gen").exists() {
        return Ok(json!({"note": "the JS host is not built (bash js/setup.sh)"}));
    }
    node_json(&dir, "bench.mjs", plan.quick, "js/setup.sh")
}

/// Runs `node SCRIPT [--quick]` in `dir` and parses the JSON document it prints; a failure
/// names `setup`, the script that installs what it needs.
fn node_json(dir: &Path, script: &str, quick: bool, setup: &str) -> anyhow::Result<Value> {
    let mut command = Command::new("node");
    command.arg(script).current_dir(dir);
    if quick {
        command.arg("--quick");
    }
    let output = command
        .output()
        .with_context(|| format!("running node {script} (is Node.js installed?)"))?;
    if !output.status.success() {
        bail!(
            "node {script} failed (run {setup} first): {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    serde_json::from_slice(&output.stdout).with_context(|| format!("node {script} printed no JSON"))
}

/// Per-call time of a no-op MCP tool (server-everything's `echo`) over stdio and streamable
/// HTTP, through corral's `McpBackend` (`corral-mcp`'s example `call_overhead`) and straight from
/// the TypeScript SDK in Node (`bench/peers/mcp/direct.mjs`), in this run.
fn run_mcp_bench(plan: Plan) -> anyhow::Result<Value> {
    let calls = if plan.quick { "50" } else { "2000" };
    let modules = repo_root().join("target/node-tools/mcp/node_modules");
    if !modules.join("@modelcontextprotocol/sdk").exists() {
        return Ok(
            json!({"note": "the MCP servers are not installed (bash host/mcp/tests/install-servers.sh)"}),
        );
    }
    let corral = run_example("call_overhead", "corral-mcp", true, &[calls])?;
    let mut rows = match corral {
        Value::Array(rows) => rows,
        Value::Object(ref map) if map.contains_key("note") => return Ok(corral),
        other => vec![other],
    };
    let output = Command::new("node")
        .arg(repo_root().join("bench/peers/mcp/direct.mjs"))
        .arg(calls)
        .env("CORRAL_MCP_NODE_MODULES", &modules)
        .output()
        .context("running node bench/peers/mcp/direct.mjs")?;
    if !output.status.success() {
        bail!(
            "bench/peers/mcp/direct.mjs failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        if line.starts_with('{') {
            rows.push(serde_json::from_str(line)?);
        }
    }
    Ok(json!({ "results": rows }))
}

/// Runs the release example `name` of `package` (built by `cargo build --release
/// --all-targets`), with `quick_args` in a quick run, and returns the last JSON line it printed.
fn run_example(
    name: &str,
    package: &str,
    quick: bool,
    quick_args: &[&str],
) -> anyhow::Result<Value> {
    let exe = std::env::current_exe()?;
    let Some(release) = exe.parent() else {
        bail!("no folder for {}", exe.display());
    };
    let bench = release.join("examples").join(name);
    if !bench.is_file() {
        return Ok(
            json!({"note": format!("{} not built (cargo build --release -p {package} --example {name})", bench.display())}),
        );
    }
    let mut command = Command::new(&bench);
    if quick {
        command.args(quick_args);
    }
    let output = command.output()?;
    if !output.status.success() {
        bail!(
            "the benchmark {name} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let text = String::from_utf8_lossy(&output.stdout);
    let mut lines = text
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(serde_json::from_str::<Value>)
        .collect::<Result<Vec<_>, _>>()?;
    match lines.len() {
        0 => bail!("no JSON line from the benchmark {name}"),
        1 => Ok(lines.remove(0)),
        _ => Ok(Value::Array(lines)),
    }
}
