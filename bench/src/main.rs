//! `corral-bench`: corral's sandbox measured side by side with the sandboxes a user would pick
//! instead (run in the same invocation), plus fuel per workload and the durable store step.
//!
//! ```text
//! corral-bench [--quick] [--out DIR] [--no-peers] [--no-store]
//! corral-bench --rerender bench/results.json     (REPORT.md again from saved figures)
//! ```
//!
//! Writes `DIR/results.json` (every figure, machine-readable) and `DIR/REPORT.md` (tables,
//! ratios and targets). Without `--out`, a full run writes `bench/results.json` and
//! `bench/REPORT.md`; a `--quick` run (a handful of iterations, used by the test suite so the
//! harness cannot rot) writes into a temporary folder and its figures mean nothing.

#![forbid(unsafe_code)]

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
            "--rerender" => {
                args.rerender = Some(PathBuf::from(
                    it.next().context("--rerender needs a results.json")?,
                ))
            }
            other => bail!(
                "unknown argument {other}\nusage: corral-bench [--quick] [--out DIR] [--no-peers] [--no-store] [--only WORKLOAD]"
            ),
        }
    }
    Ok(args)
}

fn repo_root() -> PathBuf {
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
    results.push(workloads::process_start(plan)?);
    results.push(workloads::rss_per_session()?);

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
    let store = if args.store {
        eprintln!("corral-bench: durable store step");
        run_store_bench(plan)?
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

fn run_peers(plan: Plan) -> anyhow::Result<Value> {
    let dir = repo_root().join("bench/peers");
    let mut command = Command::new("node");
    command.arg(dir.join("run.mjs")).current_dir(&dir);
    if plan.quick {
        command.arg("--quick");
    }
    let output = command
        .output()
        .context("running node bench/peers/run.mjs (is Node.js installed?)")?;
    if !output.status.success() {
        bail!(
            "the peers' harness failed (run bench/peers/install.sh first): {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    serde_json::from_slice(&output.stdout).context("the peers' harness printed no JSON")
}

fn run_store_bench(plan: Plan) -> anyhow::Result<Value> {
    let exe = std::env::current_exe()?;
    let Some(release) = exe.parent() else {
        bail!("no folder for {}", exe.display());
    };
    let bench = release.join("examples/durable_step_bench");
    if !bench.is_file() {
        return Ok(
            json!({"note": format!("{} not built (cargo build --release -p corral-store --example durable_step_bench)", bench.display())}),
        );
    }
    let mut command = Command::new(&bench);
    if plan.quick {
        command.args(["--steps", "50", "--seconds", "0.3"]);
    }
    let output = command.output()?;
    if !output.status.success() {
        bail!(
            "the durable step benchmark failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let text = String::from_utf8_lossy(&output.stdout);
    let last = text
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .context("no JSON line from the store benchmark")?;
    Ok(serde_json::from_str(last)?)
}
