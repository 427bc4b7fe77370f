//! The script corpus: every file in `tests/corpus/scripts/` and `tests/corpus/abuse/` is one
//! trial, named `corpus::FOLDER::NAME` (`--test slow corpus::` runs them all). A file starts
//! with header comments that say what to run it with and what to expect, then the script itself:
//!
//! ```js
//! // expect: {"ok": true, "value": 3}
//! // limits: {"fuel": 1000000}          (optional, SessionLimits fields)
//! // user: {"id": "u1"}                 (optional, the frozen `user`)
//! return 1 + 2;
//! ```
//!
//! The script runs in a fresh session on the example catalog (`examples.echo`, `.sleep`,
//! `.text`, `.fail`) and its report, as `corral exec` prints it, must contain `expect` (see
//! `corral_tests::json_contains`). When the session cannot be created (limits out of range),
//! the report is `{"ok": false, "session_error": "<message>"}` instead. After every trial a new
//! session must still work, so a limit that damaged the host would fail the next check.
//!
//! Two folders: `scripts/` (how scripts behave) and `abuse/` (hostile scripts: wrapper and
//! realm escapes, tampering with prototypes and intrinsics, bombs, floods, blow-ups, invalid
//! unicode, limits at and past their range). Each must keep its count up.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use corral_sandbox::examples::{ExampleBackend, example_catalog};
use corral_sandbox::{InvocationContext, ScriptUser, SessionLimits, SessionOptions};
use corral_tests::{json_contains, sandbox};
use libtest_mimic::{Failed, Trial};
use serde_json::Value;

/// One trial per script of both folders.
pub fn trials() -> Vec<Trial> {
    let mut trials = Vec::new();
    for (folder, at_least) in [("scripts", 40), ("abuse", 100)] {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("corpus")
            .join(folder);
        let mut files: Vec<PathBuf> = match std::fs::read_dir(&dir) {
            Ok(entries) => entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "js"))
                .collect(),
            Err(error) => panic!("cannot read {}: {error}", dir.display()),
        };
        files.sort();
        assert!(
            files.len() >= at_least,
            "the corpus lost scripts: only {} found in {folder}/",
            files.len()
        );
        trials.extend(files.into_iter().map(|path| {
            let name = path
                .file_stem()
                .map(|s| format!("corpus::{folder}::{}", s.to_string_lossy()))
                .unwrap_or_default();
            Trial::test(name, move || run_trial(&path))
        }));
    }
    trials
}

struct Header {
    expect: Value,
    limits: SessionLimits,
    user: Option<ScriptUser>,
}

fn parse_header(source: &str) -> Result<Header, Failed> {
    let mut expect = None;
    let mut limits = SessionLimits::default();
    let mut user = None;
    for line in source.lines() {
        let Some(rest) = line.strip_prefix("// ") else {
            break;
        };
        let Some((key, value)) = rest.split_once(": ") else {
            continue;
        };
        let parse = |what: &str| -> Result<Value, Failed> {
            serde_json::from_str(value).map_err(|e| format!("bad `{what}` header: {e}").into())
        };
        match key {
            "expect" => expect = Some(parse("expect")?),
            "limits" => {
                // Merge the given fields over the defaults.
                let mut merged = serde_json::to_value(&limits).map_err(|e| e.to_string())?;
                if let (Some(base), Value::Object(given)) =
                    (merged.as_object_mut(), parse("limits")?)
                {
                    base.extend(given);
                }
                limits = serde_json::from_value(merged).map_err(|e| format!("bad limits: {e}"))?;
            }
            "user" => {
                user = Some(
                    serde_json::from_value(parse("user")?).map_err(|e| format!("bad user: {e}"))?,
                )
            }
            _ => {}
        }
    }
    let expect = expect.ok_or("the script has no `// expect: {...}` header")?;
    Ok(Header {
        expect,
        limits,
        user,
    })
}

fn run_trial(path: &Path) -> Result<(), Failed> {
    let source = std::fs::read_to_string(path).map_err(|e| format!("cannot read: {e}"))?;
    let header = parse_header(&source)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    runtime.block_on(async {
        let options = SessionOptions {
            context: InvocationContext {
                session_id: "corpus".into(),
                ..InvocationContext::default()
            },
            limits: header.limits,
            user: header.user,
            ..SessionOptions::new(Arc::new(example_catalog()), Arc::new(ExampleBackend))
        };
        let report = match sandbox().session(options).await {
            Ok(mut session) => session.run(&source).await.to_json(),
            Err(error) => serde_json::json!({"ok": false, "session_error": error.to_string()}),
        };
        json_contains(Some(&report), &header.expect)
            .map_err(|e| format!("{e}\nfull report: {report}"))?;

        // Whatever the script did, the host must still run the next session.
        let mut next = sandbox()
            .session(SessionOptions::new(
                Arc::new(example_catalog()),
                Arc::new(ExampleBackend),
            ))
            .await
            .map_err(|e| format!("the next session could not be created: {e}"))?;
        let after = next.run("return 41 + 1").await;
        match after.outcome {
            Ok(Some(value)) if value == 42 => Ok(()),
            other => Err(format!("the next session is broken: {other:?}").into()),
        }
    })
}
