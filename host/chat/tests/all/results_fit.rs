//! Results that fit: a large script value reaches the model cut to its budget, the journal
//! keeps it whole, a later script of the turn reads it with `tools.$result`, and a replay shows
//! the model exactly the same.

use corral_chat::{RunEventKind, RunResult, json_len};
use corral_models::Message;
use serde_json::{Value, json};

use crate::support::*;
use crate::{dir, run_ok};

const ROWS: &str =
    "return Array.from({length: 20000}, (_, i) => ({id: i, name: `row ${i}`, tags: ['a', 'b']}));";
const PICK: &str = "const rows = await tools.$result({id: 's0t0'});\n\
    return {count: rows.length, picked: rows.filter(r => r.id % 5000 === 0).map(r => r.id)};";

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_result_is_cut_for_the_model_and_read_whole_by_a_later_script() {
    let dir = dir();
    let store = open_store(dir.path()).await;
    let replies = json!([js(ROWS), js(PICK), {"text": "done"}]);
    let parts = Parts::new(replies.clone());
    let mut input = parts.input(&store, "turn-1", "list the rows");
    input.auto_confirm = true;
    input.limits.result_tokens = 2_000;
    let RunResult::Completed { items, .. } = run_ok(input).await else {
        panic!("not completed")
    };
    let shown = tool_messages(&items);
    assert_eq!(shown.len(), 2);
    // The first result: cut to the budget, its shape kept, saying how to get the rest.
    assert!(
        shown[0].len() <= 2_000 * 4,
        "{} bytes shown",
        shown[0].len()
    );
    let first: Value = serde_json::from_str(&shown[0]).expect("the cut report is JSON");
    assert_eq!(first["ok"], true);
    let rows = first["value"].as_array().expect("still an array");
    assert_eq!(
        rows[0],
        json!({"id": 0, "name": "row 0", "tags": ["a", "b"]})
    );
    assert_eq!(rows[rows.len() - 1]["id"], 19_999);
    assert!(
        rows.iter()
            .any(|r| r.as_str().is_some_and(|m| m.contains("of 20000 items cut"))),
        "{shown:?}"
    );
    assert!(
        first["cut"]
            .as_str()
            .is_some_and(|note| note.contains("tools.$result({id: \"s0t0\"})")),
        "{first}"
    );
    // The second script read the whole value without it entering the context.
    let second: Value = serde_json::from_str(&shown[1]).expect("JSON");
    assert_eq!(
        second["value"],
        json!({"count": 20000, "picked": [0, 5000, 10000, 15000]}),
        "{second}"
    );
    assert_eq!(parts.backend.total(), 0, "no backend answered $result");
    // Events carry the cut form and the size of the whole.
    let finished: Vec<(Value, Option<usize>)> = parts
        .sink
        .events()
        .into_iter()
        .filter_map(|e| match e.kind {
            RunEventKind::ToolFinished {
                result,
                whole_bytes,
                ..
            } => Some((result, whole_bytes)),
            _ => None,
        })
        .collect();
    let whole = finished[0].1.expect("the whole size of a cut result");
    assert!(whole > 500_000, "{whole}");
    assert_eq!(json_len(&finished[0].0), shown[0].len());
    assert_eq!(finished[1].1, None, "a result that fits is not marked");

    // A replay of the turn from the journal shows the model exactly the same.
    let again = Parts::new(json!([]));
    let mut input = again.input(&store, "turn-1", "list the rows");
    input.auto_confirm = true;
    input.limits.result_tokens = 2_000;
    let RunResult::Completed {
        items: replayed, ..
    } = run_ok(input).await
    else {
        panic!("the replay did not complete")
    };
    assert_eq!(tool_messages(&replayed), shown);
    assert_eq!(again.model.requests().len(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_result_id_rejects_in_the_script() {
    let dir = dir();
    let store = open_store(dir.path()).await;
    let code =
        "try { await tools.$result({id: 's9t9'}); return 'read'; } catch (e) { return e.message; }";
    let parts = Parts::new(json!([js(code), {"text": "done"}]));
    let mut input = parts.input(&store, "turn-1", "read");
    input.auto_confirm = true;
    let RunResult::Completed { items, .. } = run_ok(input).await else {
        panic!("not completed")
    };
    let shown = tool_messages(&items);
    assert!(
        shown[0].contains("no result s9t9 in this turn"),
        "{shown:?}"
    );
}
