//! What the model sees of a large catalog and of a mistyped call: the discovery form of
//! `run_js`'s description, a turn that finds a tool with `tools.$search` and calls it (its
//! lookups journaled, so a replay is exact), and pre-flight stopping a script before its first
//! call when a later one names a tool that does not exist.

use corral_chat::RunResult;
use corral_models::Message;
use serde_json::{Value, json};

use crate::support::*;
use crate::{dir, run_ok};

fn tool_messages(items: &[Value]) -> Vec<String> {
    items
        .iter()
        .filter_map(|item| serde_json::from_value::<Message>(item["message"].clone()).ok())
        .filter_map(|message| match message {
            Message::Tool { content, .. } => Some(content),
            _ => None,
        })
        .collect()
}

const FIND_AND_CALL: &str = "const [hit] = await tools.$search({query: 'sleep', limit: 1});\n\
    const about = await tools.$describe({path: hit.path});\n\
    const slept = await tools[hit.id]({ms: 1});\n\
    return {id: hit.id, knowsMs: about.declaration.includes('ms: number'), slept};";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_finds_a_tool_through_discovery_and_calls_it() {
    let dir = dir();
    let store = open_store(dir.path()).await;
    let replies = json!([js(FIND_AND_CALL), {"text": "done"}]);
    let parts = Parts::new(replies);
    let mut input = parts.input(&store, "turn-1", "sleep a little");
    input.auto_confirm = true;
    // Any declarations at all are over this budget: the description is the discovery form.
    input.limits.discovery_tokens = 0;
    let RunResult::Completed { items, .. } = run_ok(input).await else {
        panic!("not completed")
    };
    let requests = parts.model.requests();
    let description = &requests[0].tools[0].description;
    assert!(
        description.contains("  tools.t.sleep({ms})\n") && description.contains("tools.$search"),
        "{description}"
    );
    assert!(
        !description.contains("declare const tools"),
        "declarations in the discovery form: {description}"
    );
    let shown = tool_messages(&items);
    let report: Value = serde_json::from_str(&shown[0]).expect("a JSON report");
    assert_eq!(
        report["value"],
        json!({"id": "t.sleep", "knowsMs": true, "slept": {"slept": 1}}),
        "{report}"
    );
    // The lookups were answered by the runtime: the backend saw the one real call.
    assert_eq!(parts.backend.total(), 1);
    assert_eq!(parts.backend.count("t.sleep"), 1);

    // A replay from the journal gives the script the same answers and calls nothing again.
    let again = Parts::new(json!([]));
    let mut input = again.input(&store, "turn-1", "sleep a little");
    input.auto_confirm = true;
    input.limits.discovery_tokens = 0;
    let RunResult::Completed {
        items: replayed, ..
    } = run_ok(input).await
    else {
        panic!("the replay did not complete")
    };
    assert_eq!(tool_messages(&replayed), shown);
    assert_eq!(again.backend.total(), 0);
    assert_eq!(again.model.requests().len(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_catalog_keeps_its_declarations() {
    let dir = dir();
    let store = open_store(dir.path()).await;
    let parts = Parts::new(json!([{"text": "hello"}]));
    let input = parts.input(&store, "turn-1", "hi");
    run_ok(input).await;
    let description = &parts.model.requests()[0].tools[0].description;
    assert!(description.contains("declare const tools"), "{description}");
    assert!(!description.contains("tools.$search"), "{description}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mistyped_tool_stops_the_script_before_its_first_call() {
    let dir = dir();
    let store = open_store(dir.path()).await;
    let code = "await tools.t.echo({sent: true});\nreturn await tools.t.ecko({});";
    let parts = Parts::new(json!([js(code), {"text": "done"}]));
    let mut input = parts.input(&store, "turn-1", "echo");
    input.auto_confirm = true;
    let RunResult::Completed { items, .. } = run_ok(input).await else {
        panic!("not completed")
    };
    assert_eq!(parts.backend.total(), 0, "the echo before the bad call ran");
    let shown = tool_messages(&items);
    let report: Value = serde_json::from_str(&shown[0]).expect("a JSON report");
    assert_eq!(report["ok"], false);
    assert_eq!(report["error"]["kind"], "preflight_error", "{report}");
    assert_eq!(report["error"]["unknown"][0]["path"], "tools.t.ecko");
    assert_eq!(report["error"]["unknown"][0]["line"], 2);
    assert!(
        report["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("did you mean `t.echo`?")),
        "{report}"
    );
}
