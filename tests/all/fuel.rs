//! Fuel is deterministic: the same script costs the same fuel in every fresh session, waiting
//! costs nothing, and reference scripts stay within a few percent of their recorded budgets (so
//! a regression in guest cost fails here).

use std::sync::Arc;

use corral_sandbox::{
    Backend, CompletionSchedule, Invocation, InvocationContext, InvokeCapabilityError,
    ScheduleError, SessionLimits, ToolResult,
};
use corral_tests::{example_session, recording_catalog, session};

async fn fuel_of(script: &str) -> u64 {
    let mut session = example_session(SessionLimits::default()).await;
    let report = session.run(script).await;
    assert!(report.outcome.is_ok(), "{script}: {:?}", report.outcome);
    report.stats.fuel
}

/// Reference scripts and the fuel they cost when recorded, with the guest built from this
/// repository. Update the figures (and say why in the commit) when the guest changes on
/// purpose; `corral exec` prints the fuel of any script.
pub const REFERENCE_SCRIPTS: &[(&str, &str, u64)] = &[
    // 79,632 until QuickJS's blocks came from size classes instead of dlmalloc (guest/patches/,
    // size-class-allocator; likewise below).
    ("return_1_plus_1", "return 1 + 1", 65_878),
    (
        "fib_20",
        "function fib(n) { return n < 2 ? n : fib(n - 1) + fib(n - 2) } return fib(20)",
        // 17,224,875 until QuickJS's C was compiled at -O2 instead of -O3 (guest/Cargo.toml;
        // likewise below): fewer wasm instructions per bytecode in its interpreter loop.
        16_566_370,
    ),
    (
        "json_roundtrip_10k",
        "const doc = {items: Array.from({length: 200}, (_, i) => ({id: i, name: 'item ' + i, tags: ['a', 'b']}))};
         return JSON.parse(JSON.stringify(doc)).items.length",
        // 9,412,835 before the size classes; 8,237,444 before JSON.stringify's fast paths
        // (guest/patches/, json-stringify-fast-paths).
        6_109_904,
    ),
    (
        "sort_10k_numbers",
        "let x = 1; const a = Array.from({length: 10000}, () => (x = (x * 48271) % 2147483647));
         a.sort((p, q) => p - q); return a[0] <= a[9999]",
        106_528_939, // 110,820,028 at -O3

    ),
    (
        "string_building",
        "let s = ''; for (let i = 0; i < 5000; i++) s += i.toString(36); return s.length",
        25_945_413, // 27,663,576 before the size classes
    ),
    (
        "ten_tool_calls",
        "let n = 0; for (let i = 0; i < 10; i++) n += (await tools.examples.echo({i})).i; return n",
        // 1,031,871 until QuickJS stopped formatting each call's site with printf and making
        // JSON.stringify's holder object without a replacer; 918,631 until a call's site was
        // kept as frames and formatted only when the call fails (guest/patches/, issue 12);
        // 825,278 until QuickJS's blocks came from size classes; 698,047 until JSON.stringify
        // kept object keys as atoms and its cycle check in a C array; 659,049 until the
        // namespaces of `tools` answered known names without their `get` trap, `tools` became
        // a data property and the binding's argument check stopped calling a function; 557,434
        // until the guest stopped building each call's argument array with `format!`; 549,804
        // until a call's promise was made and settled without resolving functions; 512,512 until
        // a tool's function became native (no JavaScript frame, no `arguments` object); 458,595
        // until calls answered at once were answered from `start-call` (no `resume` per call).
        439_328,
    ),
];

/// How far a measurement may drift from its recorded figure.
const TOLERANCE: f64 = 0.03;

#[tokio::test]
async fn the_same_script_costs_the_same_fuel_every_time() {
    for (name, script, _) in REFERENCE_SCRIPTS {
        let runs = [
            fuel_of(script).await,
            fuel_of(script).await,
            fuel_of(script).await,
        ];
        assert!(runs[0] > 0, "{name} consumed no fuel");
        assert!(
            runs.iter().all(|f| *f == runs[0]),
            "{name} varied: {runs:?}"
        );
    }
}

#[tokio::test]
async fn reference_scripts_stay_within_their_budgets() {
    let mut report = String::new();
    let mut failures = Vec::new();
    for (name, script, recorded) in REFERENCE_SCRIPTS {
        let fuel = fuel_of(script).await;
        report.push_str(&format!("{name}: {fuel}\n"));
        let drift = (fuel as f64 - *recorded as f64).abs() / (*recorded).max(1) as f64;
        if drift > TOLERANCE {
            failures.push(format!(
                "{name}: {fuel} fuel, recorded {recorded} ({:+.1}%)",
                drift * 100.0
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "fuel drifted:\n{}\nall measurements:\n{report}",
        failures.join("\n")
    );
}

/// Answers every call with `{}` after a fixed delay.
struct Delayed(std::time::Duration);

#[async_trait::async_trait]
impl Backend for Delayed {
    async fn invoke(
        &self,
        _context: &InvocationContext,
        _invocation: Invocation,
    ) -> Result<ToolResult, InvokeCapabilityError> {
        tokio::time::sleep(self.0).await;
        Ok(ToolResult::new(serde_json::json!({})))
    }
}

/// Delivers each wait's completions only once all of its calls are ready: the first wait gets
/// one, the second two. How completions are grouped into batches is guest work (each batch
/// resumes the guest once), so holding the grouping fixed leaves time as the only difference.
struct WholeBatches;

impl CompletionSchedule for WholeBatches {
    fn next_batch(
        &mut self,
        wait_index: u32,
        ready: &[u32],
        _fuel_consumed: u64,
    ) -> Result<Vec<u32>, ScheduleError> {
        let expected = if wait_index == 0 { 1 } else { 2 };
        Ok(if ready.len() >= expected {
            ready.to_vec()
        } else {
            Vec::new()
        })
    }
}

#[tokio::test]
async fn waiting_on_calls_costs_no_fuel() {
    // The same script, results and batches; only the time the backend takes differs.
    let script = "await tools.test.record({}); await Promise.all([tools.test.record({}), tools.test.record({})]); return 1";
    let mut fuel = Vec::new();
    for ms in [1, 300] {
        let backend = Arc::new(Delayed(std::time::Duration::from_millis(ms)));
        let mut session = session(recording_catalog(), backend, SessionLimits::default()).await;
        let report = session.run_scheduled(script, &mut WholeBatches).await;
        assert!(report.outcome.is_ok(), "{:?}", report.outcome);
        fuel.push(report.stats.fuel);
    }
    assert_eq!(fuel[0], fuel[1], "fuel must measure guest work only");
}

#[tokio::test]
async fn fuel_grows_with_work() {
    let small = fuel_of("let s = 0; for (let i = 0; i < 1000; i++) s += i; return s").await;
    let large = fuel_of("let s = 0; for (let i = 0; i < 100000; i++) s += i; return s").await;
    assert!(large > small * 50, "small {small}, large {large}");
}

/// A catalog of `n` capabilities `bulk.c0` .. `bulk.c{n-1}`, all in one namespace (the worst
/// case for a namespace built whole), answered by `RecordingBackend`.
fn bulk_catalog(n: usize) -> corral_catalog::Catalog {
    let capabilities: Vec<serde_json::Value> = (0..n)
        .map(
            |i| serde_json::json!({"id": format!("bulk.c{i}"), "input_schema": {"type": "object"}}),
        )
        .collect();
    let text = serde_json::json!({ "capabilities": capabilities }).to_string();
    match corral_catalog::Catalog::from_json_str(&text) {
        Ok(catalog) => catalog,
        Err(error) => panic!("the bulk catalog is invalid: {error}"),
    }
}

async fn bulk_fuel(n: usize, script: &str) -> u64 {
    let backend = Arc::new(corral_tests::RecordingBackend::default());
    let mut session = session(bulk_catalog(n), backend, SessionLimits::default()).await;
    let report = session.run(script).await;
    assert!(
        report.outcome.is_ok(),
        "{n}: {script}: {:?}",
        report.outcome
    );
    report.stats.fuel
}

#[tokio::test]
async fn binding_cost_does_not_grow_with_the_catalog() {
    // One capability touched (by JS path and by canonical id) and called, among 10 or 10,000.
    // When reading `tools` bound everything, this was 782,163 against 434,545,524 fuel (about
    // 43,000 per capability); now both are about 450,000.
    let script = "const a = await tools.bulk.c3({n: 1}); const b = await tools['bulk.c3']({n: 2}); return a.seen.n + b.seen.n";
    let small = bulk_fuel(10, script).await;
    let large = bulk_fuel(10_000, script).await;
    eprintln!("binding cost: 10 capabilities {small} fuel, 10,000 capabilities {large} fuel");
    let drift = (large as f64 - small as f64).abs() / small as f64;
    assert!(
        drift < 0.05,
        "touching 1 of 10,000 capabilities cost {large} fuel, 1 of 10 cost {small} ({:+.1}%)",
        drift * 100.0
    );
}

/// A catalog of `n` capabilities spread over namespaces as real ones are:
/// `ns{i % 10}.group{(i / 10) % 10}.tool{i}`.
fn nested_catalog(n: usize) -> corral_catalog::Catalog {
    let capabilities: Vec<serde_json::Value> = (0..n)
        .map(|i| {
            serde_json::json!({
                "id": format!("ns{}.group{}.tool{i}", i % 10, (i / 10) % 10),
                "input_schema": {"type": "object"},
            })
        })
        .collect();
    let text = serde_json::json!({ "capabilities": capabilities }).to_string();
    match corral_catalog::Catalog::from_json_str(&text) {
        Ok(catalog) => catalog,
        Err(error) => panic!("the nested catalog is invalid: {error}"),
    }
}

async fn nested_fuel(n: usize, script: &str) -> u64 {
    let backend = Arc::new(corral_tests::RecordingBackend::default());
    let mut session = session(nested_catalog(n), backend, SessionLimits::default()).await;
    let report = session.run(script).await;
    assert!(
        report.outcome.is_ok(),
        "{n}: {script}: {:?}",
        report.outcome
    );
    report.stats.fuel
}

/// Enumerating `tools` (which holds every capability under its id as well as its path) costs
/// the functions it makes, linearly: over 10,000 capabilities each way finishes within a
/// third of the default fuel, and ten times the catalog costs at most about ten times the
/// fuel. Before the namespaces let the engine enumerate their completed targets itself, every
/// proxy `ownKeys` answer was checked against the target in quadratic time: `Object.keys` over
/// 10,000 capabilities cost 2,297,112,975 fuel, more than the default.
#[tokio::test]
async fn enumerating_a_large_catalog_stays_linear_and_cheap() {
    let scripts = [
        ("Object.keys", "return Object.keys(tools).length"),
        (
            "for...in",
            "let n = 0; for (const a in tools) { const x = tools[a]; if (typeof x === 'object') \
             for (const b in x) { const y = x[b]; if (typeof y === 'object') for (const c in y) n++; } } \
             return n",
        ),
        ("JSON.stringify", "return JSON.stringify(tools).length"),
    ];
    let budget = SessionLimits::default().fuel;
    for (name, script) in scripts {
        let mut fuel = Vec::new();
        for n in [100, 1_000, 10_000] {
            fuel.push(nested_fuel(n, script).await);
        }
        eprintln!(
            "{name}: 100 capabilities {} fuel, 1,000 {}, 10,000 {}",
            fuel[0], fuel[1], fuel[2]
        );
        assert!(
            fuel[2] < budget / 3,
            "{name} over 10,000 capabilities cost {} fuel, over a third of the default {budget}",
            fuel[2]
        );
        let growth = fuel[2] as f64 / fuel[1] as f64;
        assert!(
            growth < 11.0,
            "{name}: 10,000 capabilities cost {growth:.1} times 1,000's fuel"
        );
    }
}
