//! corral's side of every workload, through the same public API a host uses.

use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use corral_catalog::Catalog;
use corral_sandbox::{
    Backend, Invocation, InvocationContext, InvokeCapabilityError, Sandbox, SandboxConfig,
    SessionLimits, SessionOptions, ToolResult,
};
use serde_json::{Value, json};

use crate::stats::{Measurement, summarize};

/// Iteration counts; `quick` keeps the harness exercised by the test suite without timing.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    pub quick: bool,
}

impl Plan {
    pub fn pick(self, full: usize, quick: usize) -> usize {
        if self.quick { quick } else { full }
    }
}

/// `bench.noop` answers at once; `bench.wait` after 10 ms.
pub fn bench_catalog() -> Catalog {
    let text = r#"{"capabilities": [
        {"id": "bench.noop", "input_schema": {"type": "object"}},
        {"id": "bench.wait", "input_schema": {"type": "object"}}
    ]}"#;
    match Catalog::from_json_str(text) {
        Ok(catalog) => catalog,
        Err(error) => panic!("the bench catalog is invalid: {error}"),
    }
}

/// The host side of the bench capabilities.
#[derive(Debug)]
pub struct BenchBackend;

#[async_trait::async_trait]
impl Backend for BenchBackend {
    async fn invoke(
        &self,
        _context: &InvocationContext,
        invocation: Invocation,
    ) -> Result<ToolResult, InvokeCapabilityError> {
        if invocation.capability_id == "bench.wait" {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(ToolResult::new(Value::Null))
    }
}

/// Options for a session bound to the bench catalog. The catalog is parsed (and its input
/// validators compiled) once per process and shared by every session, as a host shares its
/// catalog (the chat runtime does): a session's cost is binding it, not building it.
pub fn options(limits: SessionLimits) -> SessionOptions {
    static CATALOG: LazyLock<Arc<Catalog>> = LazyLock::new(|| Arc::new(bench_catalog()));
    SessionOptions {
        limits,
        ..SessionOptions::new(Arc::clone(&CATALOG), Arc::new(BenchBackend))
    }
}

/// A sandbox on the embedded guest, or on the guest component `$CORRAL_BENCH_GUEST` names (to
/// compare a guest build, such as one through `wasm-opt`, with the embedded one).
pub fn sandbox(fuel: bool, epochs: bool) -> anyhow::Result<Sandbox> {
    sandbox_with(SandboxConfig {
        fuel,
        epochs,
        ..SandboxConfig::default()
    })
}

/// [`sandbox`] with another configuration (200 sessions at most).
fn sandbox_with(config: SandboxConfig) -> anyhow::Result<Sandbox> {
    let config = SandboxConfig {
        max_sessions: 200,
        ..config
    };
    Ok(match std::env::var_os("CORRAL_BENCH_GUEST") {
        Some(path) => {
            let guest = std::fs::read(&path)
                .with_context(|| format!("reading CORRAL_BENCH_GUEST={}", path.display()))?;
            Sandbox::with_guest(config, &guest)?
        }
        None => Sandbox::new(config)?,
    })
}

fn limits_for_cpu() -> SessionLimits {
    SessionLimits {
        fuel: u64::MAX / 4,
        timeout_ms: 600_000,
        ..SessionLimits::default()
    }
}

async fn run_ok(
    session: &mut corral_sandbox::ExecutorSession,
    script: &str,
) -> anyhow::Result<corral_sandbox::ScriptReport> {
    let report = session.run(script).await;
    if let Err(error) = &report.outcome {
        bail!("{script}: {error}");
    }
    Ok(report)
}

/// New session + `return 1+1` + dispose, and the same split into its two halves.
pub async fn new_session(plan: Plan, sandbox: &Sandbox) -> anyhow::Result<Vec<Measurement>> {
    let iterations = plan.pick(2_000, 50);
    let warmup = plan.pick(200, 5);
    let mut total = Vec::with_capacity(iterations);
    let mut create = Vec::with_capacity(iterations);
    let mut eval = Vec::with_capacity(iterations);
    for i in 0..warmup + iterations {
        let t0 = Instant::now();
        let mut session = sandbox.session(options(SessionLimits::default())).await?;
        let t1 = Instant::now();
        let report = session.run("return 1+1").await;
        let t2 = Instant::now();
        session.close();
        let t3 = Instant::now();
        if report.outcome.ok().flatten() != Some(json!(2)) {
            bail!("return 1+1 did not return 2");
        }
        if i >= warmup {
            total.push(micros(t3 - t0));
            create.push(micros(t1 - t0));
            eval.push(micros(t2 - t1));
        }
    }
    Ok(vec![
        summarize(
            "corral",
            "new_session",
            "us",
            total,
            "Sandbox::session + run(\"return 1+1\") + close",
        ),
        summarize(
            "corral",
            "new_session.create",
            "us",
            create,
            "Sandbox::session alone (instantiate + bind)",
        ),
        summarize(
            "corral",
            "new_session.eval",
            "us",
            eval,
            "run(\"return 1+1\") alone in the fresh session",
        ),
    ])
}

/// `corral exec` of a one-line script, as a whole process.
pub fn process_start(plan: Plan) -> anyhow::Result<Measurement> {
    let exe = std::env::current_exe()?;
    let corral = exe.with_file_name("corral");
    if !corral.is_file() {
        return Ok(Measurement::missing(
            "corral",
            "process_start",
            "ms",
            &format!("{} not built", corral.display()),
        ));
    }
    let dir = std::env::temp_dir().join(format!("corral-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let script = dir.join("one.js");
    std::fs::write(&script, "return 1+1")?;
    let runs = plan.pick(30, 3);
    let mut samples = Vec::new();
    for i in 0..runs + 2 {
        let t0 = Instant::now();
        let output = std::process::Command::new(&corral)
            .arg("exec")
            .arg(&script)
            .output()?;
        let elapsed = t0.elapsed();
        if !output.status.success() {
            bail!(
                "corral exec failed: {}",
                String::from_utf8_lossy(&output.stdout)
            );
        }
        // The first two runs warm the compiled-code cache and the page cache.
        if i >= 2 {
            samples.push(elapsed.as_secs_f64() * 1e3);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(summarize(
        "corral",
        "process_start",
        "ms",
        samples,
        "corral exec one.js (return 1+1), compiled guest cached on disk",
    ))
}

pub const FIB27: &str =
    "function fib(n) { return n < 2 ? n : fib(n - 1) + fib(n - 2) } return fib(27)";

/// `fib(27)` in a fresh session, under each combination of fuel and epochs.
pub async fn fib27(plan: Plan) -> anyhow::Result<Vec<Measurement>> {
    let mut out = Vec::new();
    for (peer, fuel, epochs) in [
        ("corral", true, true),
        ("corral-fuel-only", true, false),
        ("corral-epochs-only", false, true),
        ("corral-no-limits", false, false),
    ] {
        let sandbox = sandbox(fuel, epochs)?;
        let runs = plan.pick(7, 1);
        let mut samples = Vec::new();
        for i in 0..runs + 1 {
            let mut session = sandbox.session(options(limits_for_cpu())).await?;
            let t0 = Instant::now();
            let report = run_ok(&mut session, FIB27).await?;
            let elapsed = t0.elapsed();
            if report.outcome.ok().flatten() != Some(json!(196_418)) {
                bail!("fib(27) is wrong");
            }
            if i >= 1 {
                samples.push(elapsed.as_secs_f64() * 1e3);
            }
        }
        let note = match (fuel, epochs) {
            (true, true) => "fuel, deadline checked at fuel yields (the default)",
            (true, false) => "fuel only",
            (false, true) => "epochs only (the deadline without fuel)",
            (false, false) => "neither fuel nor epochs",
        };
        out.push(summarize(peer, "fib27", "ms", samples, note));
    }
    Ok(out)
}

/// Sequential awaited calls to a host function that answers at once.
pub async fn call_roundtrip(plan: Plan, sandbox: &Sandbox) -> anyhow::Result<Measurement> {
    let calls = plan.pick(10_000, 500);
    let script =
        format!("for (let i = 0; i < {calls}; i++) await tools.bench.noop({{}}); return {calls}");
    let limits = SessionLimits {
        max_total_calls: calls as u32,
        ..limits_for_cpu()
    };
    let mut samples = Vec::new();
    for i in 0..plan.pick(6, 2) {
        let mut session = sandbox.session(options(limits.clone())).await?;
        let t0 = Instant::now();
        run_ok(&mut session, &script).await?;
        let per_call = micros(t0.elapsed()) / calls as f64;
        if i >= 1 {
            samples.push(per_call);
        }
    }
    Ok(summarize(
        "corral",
        "call_roundtrip",
        "us",
        samples,
        &format!("{calls} awaited calls, per call; input validated against its schema"),
    ))
}

/// `Promise.all` of 100 calls that each wait 10 ms on the host.
pub async fn concurrent_calls(plan: Plan, sandbox: &Sandbox) -> anyhow::Result<Measurement> {
    let limits = SessionLimits {
        max_concurrent_calls: 100,
        ..SessionLimits::default()
    };
    let script =
        "await Promise.all(Array.from({length: 100}, () => tools.bench.wait({}))); return 1";
    let mut samples = Vec::new();
    for i in 0..plan.pick(6, 2) {
        let mut session = sandbox.session(options(limits.clone())).await?;
        let t0 = Instant::now();
        run_ok(&mut session, script).await?;
        if i >= 1 {
            samples.push(t0.elapsed().as_secs_f64() * 1e3);
        }
    }
    Ok(summarize(
        "corral",
        "concurrent_calls",
        "ms",
        samples,
        "100 calls of 10 ms each, max_concurrent_calls 100",
    ))
}

/// How far past a 100 ms deadline `while(true){}` runs.
pub async fn deadline_overshoot(plan: Plan, sandbox: &Sandbox) -> anyhow::Result<Measurement> {
    let limits = SessionLimits {
        timeout_ms: 100,
        fuel: u64::MAX / 4,
        ..SessionLimits::default()
    };
    let mut samples = Vec::new();
    for i in 0..plan.pick(8, 2) {
        let mut session = sandbox.session(options(limits.clone())).await?;
        let t0 = Instant::now();
        let report = session.run("while (true) {}").await;
        let elapsed = t0.elapsed().as_secs_f64() * 1e3;
        if report.outcome.as_ref().err().map(|e| e.kind()) != Some("deadline_exceeded") {
            bail!(
                "the loop was not stopped by the deadline: {:?}",
                report.outcome
            );
        }
        if i >= 1 {
            samples.push(elapsed - 100.0);
        }
    }
    Ok(summarize(
        "corral",
        "deadline_overshoot",
        "ms",
        samples,
        "the clock is read at each fuel yield; overshoot past 100 ms",
    ))
}

/// Memory added per live session with 100 alive (in a fresh child process), three ways, from
/// `/proc/self/smaps_rollup`: RSS (`rss_per_session`), PSS (`pss_per_session`) and private
/// memory (`private_per_session`: Private_Clean + Private_Dirty). RSS counts a page of the
/// guest's snapshot image in every session that maps it, though the kernel keeps it once; PSS
/// divides each page among its mappings, so within one process it counts each page once; the
/// private part is the pages only one mapping holds (the pages a session wrote). The child also
/// times its 100 sessions, each started in a pool slot no session used before
/// (`new_session.cold_slot`): new session + `return 1+1`, the session kept alive.
pub fn rss_per_session() -> anyhow::Result<Vec<Measurement>> {
    let exe = std::env::current_exe()?;
    let output = std::process::Command::new(exe)
        .args(["--child", "rss"])
        .output()?;
    if !output.status.success() {
        bail!(
            "the rss child failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let value: Value = serde_json::from_slice(&output.stdout).context("rss child output")?;
    let figure = |key: &str| value[key].as_f64().with_context(|| key.to_owned());
    let starts: Vec<f64> =
        serde_json::from_value(value["start_us"].clone()).context("rss child start_us")?;
    let pss_note = format!(
        "100 live sessions, each ran return 1+1; smaps_rollup Pss delta / 100 (Pss_Anon {:.1}, \
         Pss_File {:.1}, Pss_Shmem {:.1} KiB; page tables {:.1} KiB more)",
        figure("pss_anon_kib_per_session")?,
        figure("pss_file_kib_per_session")?,
        figure("pss_shmem_kib_per_session")?,
        figure("page_tables_kib_per_session")?,
    );
    Ok(vec![
        summarize(
            "corral",
            "rss_per_session",
            "KiB",
            vec![figure("kib_per_session")?],
            "100 live sessions, each ran return 1+1; smaps_rollup Rss delta / 100",
        ),
        summarize(
            "corral",
            "pss_per_session",
            "KiB",
            vec![figure("pss_kib_per_session")?],
            &pss_note,
        ),
        summarize(
            "corral",
            "private_per_session",
            "KiB",
            vec![figure("private_kib_per_session")?],
            "100 live sessions, each ran return 1+1; smaps_rollup (Private_Clean + \
             Private_Dirty) delta / 100",
        ),
        summarize(
            "corral",
            "new_session.cold_slot",
            "µs",
            starts,
            "new session + return 1+1 in a pool slot never used before, kept alive",
        ),
    ])
}

/// The child half of [`rss_per_session`]: prints `{"kib_per_session": ...,
/// "pss_kib_per_session": ..., "private_kib_per_session": ..., "start_us": [...], ...}`.
pub async fn rss_child() -> anyhow::Result<()> {
    let sandbox = sandbox_with(SandboxConfig::default())?;
    // One session first, so the engine, code and first-touch costs are not counted.
    let mut warm = sandbox.session(options(SessionLimits::default())).await?;
    run_ok(&mut warm, "return 1+1").await?;
    let before = Memory::now()?;
    let mut alive = Vec::new();
    let mut start_us = Vec::new();
    for _ in 0..100 {
        let started = Instant::now();
        let mut session = sandbox.session(options(SessionLimits::default())).await?;
        run_ok(&mut session, "return 1+1").await?;
        start_us.push(started.elapsed().as_secs_f64() * 1e6);
        alive.push(session);
    }
    let after = Memory::now()?;
    let per_session = |fields: &[&str]| {
        let sum = |memory: &Memory| fields.iter().map(|f| memory.kib(f)).sum::<u64>();
        sum(&after).saturating_sub(sum(&before)) as f64 / alive.len() as f64
    };
    println!(
        "{}",
        json!({
            "kib_per_session": per_session(&["Rss"]),
            "pss_kib_per_session": per_session(&["Pss"]),
            "pss_anon_kib_per_session": per_session(&["Pss_Anon"]),
            "pss_file_kib_per_session": per_session(&["Pss_File"]),
            "pss_shmem_kib_per_session": per_session(&["Pss_Shmem"]),
            "private_kib_per_session": per_session(&["Private_Clean", "Private_Dirty"]),
            "page_tables_kib_per_session":
                after.page_tables_kib.saturating_sub(before.page_tables_kib) as f64 / alive.len() as f64,
            "before_kib": before.kib("Rss"),
            "after_kib": after.kib("Rss"),
            "start_us": start_us,
        })
    );
    Ok(())
}

/// This process's `/proc/self/smaps_rollup` (its memory summed over all its mappings), and the
/// memory its page tables take (`VmPTE` in `/proc/self/status`).
struct Memory {
    rollup: String,
    page_tables_kib: u64,
}

impl Memory {
    fn now() -> anyhow::Result<Self> {
        let status = std::fs::read_to_string("/proc/self/status")?;
        Ok(Memory {
            rollup: std::fs::read_to_string("/proc/self/smaps_rollup")?,
            page_tables_kib: field_kib(&status, "VmPTE"),
        })
    }

    /// A field of the rollup in KiB.
    fn kib(&self, field: &str) -> u64 {
        field_kib(&self.rollup, field)
    }
}

/// A `Name:  1234 kB` line's value; 0 if the kernel does not report it.
fn field_kib(text: &str, field: &str) -> u64 {
    text.lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|value| value.trim().strip_suffix("kB")?.trim().parse().ok())
        .unwrap_or(0)
}

/// Reference scripts for the fuel table; their fuel is also asserted by `tests/quick.rs`.
pub const FUEL_SCRIPTS: &[(&str, &str)] = &[
    (
        "json_100kb",
        "const doc = {rows: Array.from({length: 1000}, (_, i) => ({id: i, name: 'row number ' + i, tags: ['alpha', 'beta', 'gamma'], score: i * 1.5}))};
         const text = JSON.stringify(doc); const back = JSON.parse(text);
         return [text.length, back.rows.length]",
    ),
    (
        "regex_1mb",
        "const words = []; for (let i = 0; i < 50000; i++) words.push(i % 7 === 0 ? 'user' + i + '@example.com' : 'word' + i);
         const text = words.join(' ').slice(0, 1 << 20);
         return (text.match(/\\b[a-z0-9]+@example\\.com\\b/g) || []).length",
    ),
    (
        "sort_100k",
        "let x = 7; const a = Array.from({length: 100000}, () => (x = (x * 48271) % 2147483647));
         a.sort((p, q) => p - q); return a[0] <= a[99999]",
    ),
    (
        "string_building",
        "let s = ''; for (let i = 0; i < 100000; i++) s += String.fromCharCode(97 + (i % 26)); return s.length",
    ),
    ("fib25", "function fib(n) { return n < 2 ? n : fib(n - 1) + fib(n - 2) } return fib(25)"),
    (
        "calls_1000",
        "for (let i = 0; i < 1000; i++) await tools.bench.noop({i}); return 1000",
    ),
    (
        "errors_1000",
        "function f3(i) { throw new TypeError('bad input ' + i); }
         function f2(i) { return f3(i); } function f1(i) { return f2(i); }
         let n = 0; for (let i = 0; i < 1000; i++) { try { f1(i); } catch (e) { n += e.stack.length; } }
         return n",
    ),
];

/// Fuel and time of each reference script (time: median of runs, fresh session each).
pub async fn fuel_table(plan: Plan, sandbox: &Sandbox) -> anyhow::Result<Vec<Value>> {
    let mut rows = Vec::new();
    for (name, script) in FUEL_SCRIPTS {
        let mut fuel = None;
        let mut times = Vec::new();
        for _ in 0..plan.pick(5, 1) {
            let mut session = sandbox.session(options(limits_for_cpu())).await?;
            let t0 = Instant::now();
            let report = run_ok(&mut session, script).await?;
            times.push(micros(t0.elapsed()));
            match fuel {
                None => fuel = Some(report.stats.fuel),
                Some(f) if f != report.stats.fuel => bail!(
                    "{name}: fuel varied between runs ({f} then {})",
                    report.stats.fuel
                ),
                Some(_) => {}
            }
        }
        times.sort_by(f64::total_cmp);
        let ms = times[times.len() / 2] / 1e3;
        let fuel = fuel.unwrap_or(0);
        rows.push(json!({
            "script": name,
            "fuel": fuel,
            "ms": ms,
            "fuel_per_ms": if ms > 0.0 { fuel as f64 / ms } else { 0.0 },
        }));
    }
    Ok(rows)
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// One corral workload by name (for profiling).
pub async fn only(plan: Plan, workload: &str) -> anyhow::Result<Vec<Measurement>> {
    let sandbox = sandbox(true, true)?;
    Ok(match workload {
        "new_session" => new_session(plan, &sandbox).await?,
        "session_create" => session_create(&sandbox).await?,
        "fib27" => fib27(plan).await?,
        "call_roundtrip" => vec![call_roundtrip(plan, &sandbox).await?],
        "concurrent_calls" => vec![concurrent_calls(plan, &sandbox).await?],
        "deadline_overshoot" => vec![deadline_overshoot(plan, &sandbox).await?],
        "process_start" => vec![process_start(plan)?],
        "rss_per_session" => rss_per_session()?,
        other => bail!("unknown workload {other}"),
    })
}

/// Creating a session (no script) with 0, 2 and 20 bound capabilities, with the minor page
/// faults each costs: how the price of a session grows with its catalog.
pub async fn session_create(sandbox: &Sandbox) -> anyhow::Result<Vec<Measurement>> {
    let mut out = Vec::new();
    for n in [0usize, 2, 20] {
        let capabilities: Vec<String> = (0..n)
            .map(|i| {
                format!(
                    r#"{{"id": "ns{}.tool{i}", "input_schema": {{"type": "object"}}}}"#,
                    i % 3
                )
            })
            .collect();
        let catalog = Arc::new(Catalog::from_json_str(&format!(
            r#"{{"capabilities": [{}]}}"#,
            capabilities.join(",")
        ))?);
        let (warmup, iterations) = (100, 1_000);
        let mut samples = Vec::new();
        let mut faults = 0;
        for i in 0..warmup + iterations {
            let options = SessionOptions::new(catalog.clone(), Arc::new(BenchBackend));
            let faults_before = minor_faults();
            let t0 = Instant::now();
            let session = sandbox.session(options).await?;
            let elapsed = micros(t0.elapsed());
            drop(session);
            if i >= warmup {
                samples.push(elapsed);
                faults += minor_faults() - faults_before;
            }
        }
        let note = format!(
            "{n} capabilities bound; {:.1} minor page faults per session",
            faults as f64 / iterations as f64
        );
        out.push(summarize(
            "corral",
            &format!("session_create.{n}"),
            "us",
            samples,
            &note,
        ));
    }
    Ok(out)
}

/// Minor page faults of this process so far (`/proc/self/stat`, field 10).
fn minor_faults() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    after
        .split_whitespace()
        .nth(7)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}
