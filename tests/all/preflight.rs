//! Pre-flight on the corpus of real MCP catalogs (`host/catalog/corpus`): every tool called by
//! its path passes, a slip in any part of a path fails before the script runs with the tool it
//! meant first among the suggestions, and the session is still usable after.

use std::sync::Arc;

use corral_catalog::Catalog;
use corral_sandbox::{ExecError, SessionLimits};
use corral_tests::{RecordingBackend, session};

/// The corpus, each server under its own namespace, as one catalog.
fn corpus() -> Catalog {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../host/catalog/corpus");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("the corpus folder")
        .filter_map(|entry| Some(entry.ok()?.path()))
        .filter(|path| path.extension().is_some_and(|ext| ext == "json"))
        .collect();
    files.sort();
    let mut capabilities = Vec::new();
    for path in files {
        let server = path
            .file_stem()
            .and_then(|stem| stem.to_str())
            .expect("a file name");
        let text = std::fs::read_to_string(&path).expect("a corpus file");
        let catalog = Catalog::from_mcp_tools_json(&text, server).expect("a corpus catalog");
        capabilities.extend(catalog.capabilities().iter().cloned());
    }
    Catalog::new(capabilities).expect("the corpus as one catalog")
}

/// The path a script writes: `tools.github.create_issue`, `tools["google-maps"].maps_geocode`.
fn written(path: &[String]) -> String {
    let mut text = String::from("tools");
    for part in path {
        if part
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$')
            && !part.starts_with(|c: char| c.is_ascii_digit())
        {
            text.push('.');
            text.push_str(part);
        } else {
            text.push_str(&format!("[{}]", serde_json::Value::from(part.as_str())));
        }
    }
    text
}

#[test]
fn every_corpus_tool_passes_and_every_slip_names_it() {
    let catalog = corpus();
    assert!(catalog.len() >= 100, "{} tools", catalog.len());
    for capability in catalog.capabilities() {
        let call = written(&capability.js_path);
        let by_path = format!("return await {call}({{}});");
        assert_eq!(
            corral_sandbox::preflight(&by_path, &catalog),
            Ok(()),
            "{by_path}"
        );
        let by_id = format!(
            "return await tools[{}]({{}});",
            serde_json::Value::from(capability.id.as_str())
        );
        assert_eq!(
            corral_sandbox::preflight(&by_id, &catalog),
            Ok(()),
            "{by_id}"
        );

        // A slip: the tool's last name with its last letter doubled.
        let mut slipped = capability.js_path.clone();
        if let Some(last) = slipped.last_mut() {
            let doubled = last.chars().last().expect("a name");
            last.push(doubled);
        }
        let script = format!(
            "await tools.memory.read_graph({{}});\nreturn await {}({{}});",
            written(&slipped)
        );
        let error = corral_sandbox::preflight(&script, &catalog).expect_err(&script);
        let unknown = &error.unknown[0];
        assert_eq!(unknown.line, 2, "{script}");
        assert_eq!(
            unknown.suggestions.first(),
            Some(&capability.id),
            "{script}: {:?}",
            unknown.suggestions
        );
    }
}

#[tokio::test]
async fn a_session_runs_on_after_a_script_pre_flight_stopped() {
    let backend = Arc::new(RecordingBackend::default());
    let mut session = session(corpus(), backend.clone(), SessionLimits::default()).await;
    let stopped = session
        .run("await tools.memory.read_graph({});\nreturn await tools.github.create_isue({});")
        .await;
    let Err(ExecError::Preflight(error)) = &stopped.outcome else {
        panic!("not stopped by pre-flight: {:?}", stopped.outcome)
    };
    assert_eq!(error.unknown[0].suggestions, ["github.create_issue"]);
    assert_eq!(stopped.stats.fuel, 0);
    assert_eq!(backend.calls(), 0, "a call ran");
    let ran = session
        .run("return (await tools.memory.read_graph({})) !== undefined;")
        .await;
    assert!(ran.outcome.is_ok(), "{:?}", ran.outcome);
    assert_eq!(backend.calls(), 1);
}
