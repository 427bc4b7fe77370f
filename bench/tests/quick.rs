//! The benchmark harness in quick mode, so it cannot silently rot: every workload runs on corral
//! and on every peer the machine has, the report and the results file are written, and the fuel
//! of the reference scripts stays within a few percent of the recorded budgets. No timing is
//! asserted; figures from a quick run mean nothing.

use std::process::Command;

use serde_json::Value;

/// Fuel recorded for `FUEL_SCRIPTS` (bench/src/workloads.rs). Fuel is deterministic, so a
/// change beyond the tolerance is a change in what the guest does: update the figure on purpose
/// and say why in the commit.
const RECORDED_FUEL: &[(&str, u64)] = &[
    // json_100kb 65,660,787, regex_1mb 646,488,883, string_building 368,613,079 and calls_1000
    // 45,165,017 until QuickJS's blocks came from size classes instead of dlmalloc;
    // json_100kb 58,822,868 and calls_1000 36,783,018 until JSON.stringify kept object keys as
    // atoms and its cycle check in a C array (guest/patches/, json-stringify-fast-paths).
    // regex_1mb 622,231,011, sort_100k 1,433,049,616 and fib25 189,411,788 until QuickJS's C
    // was compiled at -O2 instead of -O3 (guest/Cargo.toml): fewer wasm instructions per
    // bytecode in its interpreter loop. json_100kb and string_building moved by less than 1%.
    ("json_100kb", 45_507_276),
    ("regex_1mb", 615_573_937),
    ("sort_100k", 1_375_661_593),
    ("string_building", 312_705_780),
    ("fib25", 182_348_202),
    // 65,809,611 until the guest's QuickJS stopped formatting call sites with printf and
    // stopped making JSON.stringify's holder object without a replacer; 53,402,026 until a
    // call's site was kept as frames and formatted only when the call fails;
    // 32,948,370 until the namespaces of `tools` answered known names without their `get` trap
    // (guest/patches/, namespace-get-fast-path), `tools` became a data property and the
    // binding's argument check stopped calling a function; 27,713,640 until the guest stopped
    // building each call's argument array with `format!`; 26,794,220 until a call's promise was
    // made and settled without resolving functions (guest/patches/,
    // call-promises-without-resolving-functions); 23,146,417 until a tool's function became
    // native (guest/patches/, native-tool-functions); 17,262,140 until calls answered at once
    // were answered from `start-call` and an empty object argument skipped `JSON.stringify`
    // (guest/patches/, empty-object-arguments); 14,486,202 until QuickJS's C was compiled at
    // -O2 instead of -O3.
    ("calls_1000", 14_763_260),
    // 43,716,794 with QuickJS's stack frames formatted through printf (guest/patches/,
    // backtrace-without-printf; measured 2026-12-06 on a guest built without it).
    ("errors_1000", 20_080_746),
];
const TOLERANCE: f64 = 0.03;

#[test]
fn quick_run_covers_every_workload_and_keeps_fuel_budgets() {
    let out = tempfile::tempdir().expect("temp dir");
    // `--before` is given this same binary: what is checked is that an earlier build's figures
    // are gathered and set beside this one's, not what they are.
    let bench = env!("CARGO_BIN_EXE_corral-bench");
    let output = Command::new(bench)
        .args([
            "--quick",
            "--before",
            bench,
            "--before-label",
            "this build",
            "--out",
        ])
        .arg(out.path())
        .output()
        .expect("corral-bench runs");
    assert!(
        output.status.success(),
        "corral-bench --quick failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let results: Value = serde_json::from_slice(
        &std::fs::read(out.path().join("results.json")).expect("results.json written"),
    )
    .expect("results.json is JSON");
    let report = std::fs::read_to_string(out.path().join("REPORT.md")).expect("REPORT.md written");
    assert!(report.contains("## Targets"), "{report}");
    // The chat runtime's turn and replay figures, on both stores, and MCP calls beside the SDK.
    assert!(report.contains("## Chat runtime per turn"), "{report}");
    let turn_stores: Vec<&str> = results["chat_turn"]["results"]
        .as_array()
        .map(|rows| rows.iter().filter_map(|r| r["store"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(
        turn_stores,
        ["embedded", "PostgreSQL"],
        "{}",
        results["chat_turn"]
    );
    // corral serve over loopback, on both stores.
    assert!(
        report.contains("## `corral serve` over loopback"),
        "{report}"
    );
    let serve_stores: Vec<&str> = results["serve"]["results"]
        .as_array()
        .map(|rows| rows.iter().filter_map(|r| r["store"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(
        serve_stores,
        ["embedded", "PostgreSQL"],
        "{}",
        results["serve"]
    );
    for row in results["serve"]["results"].as_array().into_iter().flatten() {
        assert!(row["ack"]["samples"].as_u64() > Some(0), "{row}");
        assert!(row["sse"]["deliveries"].as_u64() > Some(0), "{row}");
        assert!(
            row["approve_to_first_event"]["samples"].as_u64() > Some(0),
            "{row}"
        );
    }
    // A turn with tracing off and on: both measured, and the spans reached the receiver.
    assert!(report.contains("## Tracing on a turn"), "{report}");
    let tracing = &results["tracing"];
    assert!(tracing["off"]["p50_ms"].as_f64() > Some(0.0), "{tracing}");
    assert!(tracing["on"]["p50_ms"].as_f64() > Some(0.0), "{tracing}");
    assert!(tracing["exports"].as_u64() > Some(0), "{tracing}");
    assert_eq!(tracing["spans_dropped"], 0, "{tracing}");
    // What the model sees: discovery shrinks the largest catalog's description, enumeration
    // finishes inside the default fuel, pre-flight was timed.
    assert!(report.contains("## What the model sees"), "{report}");
    let model = &results["model_context"];
    let largest = &model["tokens"][2];
    assert_eq!(largest["discovery"], true, "{model}");
    assert!(
        largest["sent"].as_u64() < largest["full"].as_u64(),
        "{model}"
    );
    assert!(
        model["enumeration"][0]["Object.keys(tools)"].as_u64() > Some(0),
        "{model}"
    );
    assert!(model["preflight"]["p50_us"].as_f64() > Some(0.0), "{model}");
    assert!(report.contains("## MCP tool call, per call"), "{report}");
    assert!(report.contains("## The JavaScript host"), "{report}");
    assert_eq!(
        results["mcp_call"]["results"].as_array().map(Vec::len),
        Some(4),
        "corral and the SDK over stdio and HTTP: {}",
        results["mcp_call"]
    );

    let measured = |peer: &str, workload: &str| -> bool {
        results["results"].as_array().is_some_and(|list| {
            list.iter().any(|r| {
                r["peer"] == peer && r["workload"] == workload && r["n"].as_u64().unwrap_or(0) > 0
            })
        })
    };
    for workload in [
        "new_session",
        "process_start",
        "fib27",
        "call_roundtrip",
        "concurrent_calls",
        "rss_per_session",
        "pss_per_session",
        "private_per_session",
        "deadline_overshoot",
    ] {
        assert!(
            measured("corral", workload),
            "corral did not measure {workload}"
        );
        for peer in ["quickjs-emscripten-shared", "node-vm"] {
            if workload != "process_start" || peer != "node-bare" {
                assert!(
                    measured(peer, workload),
                    "{peer} did not measure {workload}"
                );
            }
        }
    }
    for peer in ["corral-fuel-only", "corral-epochs-only", "corral-no-limits"] {
        assert!(measured(peer, "fib27"), "{peer} did not run fib27");
    }
    assert!(
        results["durable_step"]["results"]
            .as_array()
            .is_some_and(|r| r.len() >= 3),
        "the durable step benchmark did not run: {}",
        results["durable_step"]
    );
    // pgbench comes with the PostgreSQL server the harness starts.
    assert!(
        results["durable_step"]["peer"]["events_per_s_16_sessions"]
            .as_f64()
            .is_some_and(|events| events > 0.0),
        "pgbench did not run the store's SQL: {}",
        results["durable_step"]
    );

    // Before and after: every workload measured again by the `--before` binary, and a row for
    // each in the report (fib27 three times: the default, fuel only and no metering).
    assert_eq!(
        results["before"]["label"], "this build",
        "{}",
        results["before"]
    );
    let before = results["before"]["results"]
        .as_array()
        .expect("before results");
    for workload in [
        "new_session",
        "call_roundtrip",
        "rss_per_session",
        "fib27",
        "deadline_overshoot",
        "process_start",
    ] {
        assert!(
            before.iter().any(|r| r["peer"] == "corral"
                && r["workload"] == workload
                && r["n"].as_u64() > Some(0)),
            "--before did not measure {workload}: {before:?}"
        );
    }
    let section = report
        .split("## Before and after")
        .nth(1)
        .expect("a before-and-after section")
        .split("\n## ")
        .next()
        .unwrap_or_default();
    assert!(section.contains("`this build`"), "{section}");
    let rows = section
        .lines()
        .filter(|l| l.starts_with("| ") && l.contains("**×"))
        .count();
    assert_eq!(
        rows, 8,
        "one row per workload, three for fib(27):\n{section}"
    );

    let fuel = results["fuel"].as_array().expect("a fuel table");
    let mut drift = Vec::new();
    for (script, recorded) in RECORDED_FUEL {
        let row = fuel
            .iter()
            .find(|r| r["script"] == *script)
            .expect("script in the table");
        let got = row["fuel"].as_u64().expect("fuel");
        let off = (got as f64 - *recorded as f64).abs() / (*recorded).max(1) as f64;
        if off > TOLERANCE {
            drift.push(format!("{script}: {got} (recorded {recorded})"));
        }
    }
    assert!(drift.is_empty(), "fuel drifted:\n{}", drift.join("\n"));
}
