//! Proofs that corral's local changes to upstream code are in effect: the QuickJS patches of
//! `guest/patches/` (listed in `guest/patches/series`) and the vendored register allocator of
//! `host/vendor/`. Each test fails when the change it names is not in the guest or the build;
//! `docs/quickjs-patches.md` lists every change with its test, gain and decision.
//!
//! A patch that only makes the guest cheaper changes no result, so its proof is a fuel figure:
//! fuel counts wasm instructions and is deterministic, so the figure the patch is responsible
//! for is asserted within a few percent (as in `fuel.rs`), and the comment beside it says what
//! the same operation costs without the patch. Per-operation figures are measured as the
//! difference between a loop of `2n` and a loop of `n` in fresh sessions, which cancels what a
//! session and its script cost once. A patch that changes behaviour is proven by the behaviour.
//! When a figure moves for a reason unrelated to its patch (a change to the guest's C flags, to
//! QuickJS, to the prelude), re-measure it (the failure prints it) and say why in the commit.

use std::sync::Arc;
use std::time::Duration;

use corral_sandbox::{
    Backend, Invocation, InvocationContext, InvokeCapabilityError, SessionLimits, ToolResult,
};
use corral_tests::{example_session, recording_catalog, session};
use serde_json::{Value, json};

/// How far a fuel figure may drift from its recorded value.
const TOLERANCE: f64 = 0.03;

async fn report_of(script: &str) -> Value {
    let mut session = example_session(SessionLimits::default()).await;
    session.run(script).await.to_json()
}

async fn fuel_of(script: &str) -> u64 {
    let mut session = example_session(SessionLimits::default()).await;
    let report = session.run(script).await;
    assert!(report.outcome.is_ok(), "{script}: {:?}", report.outcome);
    report.stats.fuel
}

/// The fuel one more `op` costs inside a loop after `setup`, loop turn included.
async fn fuel_per_op(setup: &str, op: &str, n: u64) -> f64 {
    let script =
        |count: u64| format!("{setup}\nfor (let i = 0; i < {count}; i++) {{ {op} }}\nreturn 0");
    let once = fuel_of(&script(n)).await;
    let twice = fuel_of(&script(2 * n)).await;
    (twice as f64 - once as f64) / n as f64
}

fn assert_near(what: &str, measured: f64, recorded: f64, without: &str) {
    eprintln!("{what}: {measured:.0} fuel, recorded {recorded:.0}");
    let drift = (measured - recorded) / recorded;
    assert!(
        drift.abs() <= TOLERANCE,
        "{what}: {measured:.0} fuel, recorded {recorded:.0} ({:+.1}%); without the patch: {without}",
        drift * 100.0
    );
}

// ---- backtrace-without-printf ----------------------------------------------------------------

/// `build_backtrace` writes each frame with `dbuf_putstr` and a small integer formatter instead
/// of `dbuf_printf`, which goes through wasi-libc's `vsnprintf`. The text is the same; the
/// fuel of an `Error` is what differs.
#[tokio::test]
async fn stack_frames_are_formatted_without_printf() {
    let report = report_of(
        "\nfunction inner() { return new Error('x').stack; }\n\
         function outer() { return inner(); }\n\
         return outer();",
    )
    .await;
    assert_eq!(
        report["value"],
        json!(
            "    at inner (script.js:2:31)\n    at outer (script.js:3:33)\n    at <anonymous> (script.js:4:14)\n    at <eval> (script.js:5:4)\n"
        ),
        "{report}"
    );

    // An `Error` made three calls deep (four frames with the script's own): 3 x 4 formatted
    // pieces, each once a `vsnprintf` call (" at %s", " (%s", ":%d:%d").
    let setup = "function f3(make) { return make ? new Error('x') : 1; }\n\
                 function f2(make) { return f3(make); }\n\
                 function f1(make) { return f2(make); }";
    let with_error = fuel_per_op(setup, "f1(true);", 500).await;
    let without_error = fuel_per_op(setup, "f1(false);", 500).await;
    assert_near(
        "an Error four frames deep",
        with_error - without_error,
        15_737.0,
        "twelve vsnprintf calls more: a thrown Error three calls deep costs 43,717 fuel \
         through printf against 20,081 without (corral-bench's errors_1000, docs/quickjs-patches.md)",
    );
}

// ---- json-holder-only-for-replacers ----------------------------------------------------------

/// `JSON.stringify` makes its holder object `{"": value}` only for a replacer function, the
/// only code that can see it (as `this`).
#[tokio::test]
async fn json_stringify_makes_its_holder_only_for_a_replacer() {
    // A replacer still sees the holder.
    let report = report_of(
        "const seen = []; JSON.stringify(7, function (k, v) { \
           if (k === '') seen.push(Object.keys(this), this[''], Object.getPrototypeOf(this) === Object.prototype); \
           return v; }); \
         return seen",
    )
    .await;
    assert_eq!(report["value"], json!([[""], 7, true]), "{report}");

    // Without one, no object is made: JSON.stringify(0) is the stringification alone.
    let stringify = fuel_per_op("", "JSON.stringify(0);", 1_000).await;
    assert_near(
        "JSON.stringify(0)",
        stringify,
        2_640.0,
        "an object made, given a property and freed per call: about 1,600 fuel more \
         (a script's own `{\"\": i}` costs 1,629 over the loop)",
    );
}

// ---- lazy-call-sites -------------------------------------------------------------------------

/// Fails every call a moment after it starts, so a call's rejection comes after the script has
/// run on (a call answered at its start would be rejected before the call expression returns).
struct FailsLater;

#[async_trait::async_trait]
impl Backend for FailsLater {
    async fn invoke(
        &self,
        _context: &InvocationContext,
        invocation: Invocation,
    ) -> Result<ToolResult, InvokeCapabilityError> {
        tokio::time::sleep(Duration::from_millis(5)).await;
        Err(InvokeCapabilityError::Failed {
            capability_id: invocation.capability_id,
            message: "later".into(),
        })
    }
}

/// A call keeps its site as frames when it starts and formats them only when it is rejected
/// (`JS_CorralCaptureSite`, `JS_CorralSiteError`). A frame's function name is read when the
/// stack is formatted, so a function renamed between the call and its rejection shows its new
/// name: a stack formatted when the call started would show the old one.
/// (`isolation::a_rejected_calls_stack_is_the_call_site_as_it_was` pins the rest: the frame
/// limit in force at the call, the script's frames only.)
#[tokio::test]
async fn a_call_site_is_formatted_only_when_the_call_fails() {
    let mut session = session(
        recording_catalog(),
        Arc::new(FailsLater),
        SessionLimits::default(),
    )
    .await;
    let report = session
        .run(
            "\nasync function caller() {\n  return await tools.test.record({});\n}\n\
             const pending = caller();\n\
             Object.defineProperty(caller, 'name', {value: 'renamed'});\n\
             try { await pending; return null; } catch (e) { return [e.message, e.stack]; }",
        )
        .await
        .to_json();
    let stack = report["value"][1].as_str().unwrap_or_default().to_string();
    assert!(
        stack.starts_with("    at renamed (script.js:3:"),
        "the call's site was formatted before the call failed: {report}"
    );
    assert!(!stack.contains("caller"), "{report}");
}

// ---- source-locations ------------------------------------------------------------------------

/// Syntax errors point at the offending token (QuickJS reported a column that only one lexer
/// error kept up to date, so 1), a token's column is its own (not that of the first of a run of
/// adjacent tokens), and errors in a `return` statement's expression or a declaration's
/// initializer point at their own line (QuickJS emitted no location there, so they pointed at
/// the previous statement that had one).
#[tokio::test]
async fn errors_point_at_the_offending_token_and_line() {
    let cases = [
        // A syntax error after other tokens on a later line.
        ("const a = 1;\nreturn a +;", "SyntaxError", 2, 11),
        // A call's position: the token after `(`, not the first of `a.b(`.
        ("const a = {};\na.b(1);", "TypeError", 2, 5),
        // A `return` statement's expression.
        ("const a = {};\nreturn a.b.c;", "TypeError", 2, 8),
        // A declaration's initializer.
        (
            "const a = {};\nconst v = a.b.c;\nreturn v;",
            "TypeError",
            2,
            11,
        ),
    ];
    for (script, name, line, column) in cases {
        let report = report_of(script).await;
        let error = &report["error"];
        assert_eq!(
            (&error["name"], &error["line"], &error["column"]),
            (&json!(name), &json!(line), &json!(column)),
            "{script:?}: {report}"
        );
    }
}

// ---- namespace-get-fast-path -----------------------------------------------------------------

/// A namespace proxy of `tools` the prelude marked answers a name its target already holds
/// without calling its `get` trap. Reading `tools.examples.echo` then costs about what the same
/// read of plain frozen objects does; through the two traps it cost about 2,900 fuel more each
/// (tenth part of docs/performance-history.md).
#[tokio::test]
async fn tools_namespaces_answer_known_names_without_their_trap() {
    let through_tools = fuel_per_op("tools.examples.echo;", "tools.examples.echo;", 1_000).await;
    let plain = fuel_per_op(
        "const t = Object.freeze({examples: Object.freeze({echo: 1})});",
        "t.examples.echo;",
        1_000,
    )
    .await;
    eprintln!("tools.examples.echo: {through_tools:.0} fuel, a plain frozen read {plain:.0}");
    assert!(
        through_tools - plain < 1_000.0,
        "reading tools.examples.echo cost {through_tools:.0} fuel, a plain frozen read {plain:.0}: \
         the namespaces' get traps ran"
    );
}

// ---- native-tool-functions -------------------------------------------------------------------

/// A tool's function is a C function whose frames stack traces leave out
/// (`JS_CorralHideFrames`), and it starts a call itself for an object literal's kind of object
/// (`JS_CorralIsPlainObject`) instead of handing it to the prelude's check. A getter the
/// argument's serialization runs therefore sees the script's frames only: without the first, a
/// `(native)` frame of the tool's function; without the second, the prelude's frames too.
#[tokio::test]
async fn a_tools_function_leaves_no_frame_in_stacks() {
    let report = report_of(
        "\nlet seen;\n\
         await tools.examples.echo({ get a() { seen = new Error('x').stack; return 1; } });\n\
         return seen;",
    )
    .await;
    assert_eq!(
        report["value"],
        json!(
            "    at get a (script.js:3:50)\n    at <anonymous> (script.js:3:27)\n    at <eval> (script.js:5:4)\n"
        ),
        "{report}"
    );
}

// ---- empty-object-arguments ------------------------------------------------------------------

/// A call whose argument is an empty object (`JS_CorralIsEmptyJSONObject`: never had an own
/// property, no `toJSON` on `Object.prototype`) sends `[{}]` without `JSON.stringify`, as a call
/// without argument does: the two cost about the same, where `JSON.stringify({})` alone costs
/// more than their difference could be.
#[tokio::test]
async fn an_empty_object_argument_skips_json_stringify() {
    let no_argument = fuel_per_op("", "await tools.examples.echo();", 500).await;
    let empty = fuel_per_op("", "await tools.examples.echo({});", 500).await;
    let stringify = fuel_per_op("", "JSON.stringify({});", 1_000).await;
    let lap = fuel_per_op("", "", 1_000).await;
    eprintln!(
        "a call with {{}}: {empty:.0} fuel, without argument {no_argument:.0}, \
         JSON.stringify({{}}) {stringify:.0}, a loop turn {lap:.0}"
    );
    assert!(
        empty - no_argument < (stringify - lap) / 2.0,
        "a call with {{}} cost {empty:.0} fuel, without argument {no_argument:.0}; \
         JSON.stringify({{}}) alone costs {:.0}: the empty object was stringified",
        stringify - lap
    );
}

// ---- vendored crates (host/vendor) ------------------------------------------------------------

/// A file's text, by its path from the workspace's root.
fn workspace_file(path: &str) -> String {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    match std::fs::read_to_string(root.join(path)) {
        Ok(text) => text,
        Err(error) => panic!("reading {path}: {error}"),
    }
}

/// Checks that the workspace builds `name` from its vendored copy `host/vendor/{name}-{version}`:
/// Cargo.lock holds exactly one `name`, that version from a path (a path dependency has no
/// `source`), every package in `dependents` depends on it, no patch is unused, and the root
/// manifest patches crates.io's `name` with the folder. When an upgrade moves Cargo to another
/// version, the `[patch.crates-io]` entry stops applying and Cargo only warns; this fails
/// instead.
fn assert_vendored(name: &str, version: &str, dependents: &[&str]) {
    let lock = workspace_file("Cargo.lock");
    let packages: Vec<&str> = lock.split("[[package]]").skip(1).collect();
    let named = |name: &str| -> Vec<&str> {
        packages
            .iter()
            .copied()
            .filter(|p| p.lines().any(|l| l == format!("name = \"{name}\"")))
            .collect()
    };
    let vendored = named(name);
    assert_eq!(
        vendored.len(),
        1,
        "Cargo.lock holds {} {name} packages: {vendored:?}",
        vendored.len()
    );
    assert!(
        vendored[0].contains(&format!("version = \"{version}\""))
            && !vendored[0].contains("source ="),
        "Cargo.lock's {name} is not the vendored host/vendor/{name}-{version}: {}",
        vendored[0]
    );
    for dependent in dependents {
        let packages = named(dependent);
        assert!(
            !packages.is_empty()
                && packages
                    .iter()
                    .all(|p| p.lines().any(|l| l.trim() == format!("\"{name}\","))),
            "{dependent} does not depend on the (single) {name}: {packages:?}"
        );
    }
    assert!(
        !lock.contains("[[patch.unused]]"),
        "Cargo.lock lists an unused patch: a vendored crate no longer applies"
    );
    let patch = format!("{name} = {{ path = \"host/vendor/{name}-{version}\" }}");
    assert!(
        workspace_file("Cargo.toml").contains(&patch),
        "the workspace no longer patches {name} with host/vendor/{name}-{version}"
    );
}

/// The workspace builds Cranelift with the vendored regalloc2, whose one change
/// (`MAX_SPLITS_PER_SPILLSET` 2 -> 255) keeps QuickJS's interpreter values in registers.
#[test]
fn the_vendored_register_allocator_is_the_one_built() {
    assert_vendored("regalloc2", "0.15.2", &["cranelift-codegen"]);
    let source = workspace_file("host/vendor/regalloc2-0.15.2/src/ion/data_structures.rs");
    assert!(
        source.contains("pub(crate) const MAX_SPLITS_PER_SPILLSET: u8 = 255;"),
        "the vendored regalloc2 lost its one change (MAX_SPLITS_PER_SPILLSET = 255)"
    );
}

/// The store and the pool build with the vendored tokio-postgres, whose one addition
/// (`Client::pipeline`: statements pipelined with one `Sync`) the PostgreSQL store sends every
/// flight with. The store would not compile without the method; this checks that the method
/// is the vendored one, and the store's own test `a_durable_step_is_answered_in_two_flushes`
/// checks what it does.
#[test]
fn the_vendored_postgres_driver_is_the_one_built() {
    assert_vendored(
        "tokio-postgres",
        "0.7.18",
        &["corral-store", "deadpool-postgres", "tokio-postgres-rustls"],
    );
}
