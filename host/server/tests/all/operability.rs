//! What an operator reads from a running server, over real sockets: `/metrics` labelled by
//! tenant and agent, with gauges of the sessions waiting on someone, counted in the store.

use crate::common::{ACME, BETA, Harness, OPERATOR};
use serde_json::json;

/// A segment whose last journal writes the store refuses ends as a run whose last commit failed:
/// the turn fails with `store_error`, its completion is never shown, the lease is released, and
/// the refused finish is counted.
#[tokio::test(flavor = "multi_thread")]
async fn refused_last_journal_writes_fail_the_turn_and_release_the_session() {
    let h = Harness::start().await;
    h.register_agent().await;
    h.session("a1", OPERATOR).await;
    h.message("a1", "k1", "refused").await;
    let view = h.wait_status("a1", "failed").await;
    assert_eq!(view["error"]["code"], "store_error", "{view}");
    let types = h.event_types("a1").await;
    assert!(types.contains(&"turn.failed".to_owned()), "{types:?}");
    assert!(!types.contains(&"turn.completed".to_owned()), "{types:?}");
    let text = h.metrics().await;
    let line = "corral_store_errors_total{operation=\"finish_segment\"} 1\n";
    assert!(text.contains(line), "missing {line:?} in\n{text}");
    // Released: the session takes its next turn at once.
    h.message("a1", "k2", "hello").await;
    h.wait_status("a1", "completed").await;
}

/// The store's own count of its transactions: what a turn costs the store, read from outside.
#[tokio::test(flavor = "multi_thread")]
async fn metrics_count_the_stores_transactions() {
    let h = Harness::start().await;
    h.register_agent().await;
    h.session("a1", ACME).await;
    let transactions = |text: &str| -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix("corral_store_transactions_total "))
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no transaction count in\n{text}"))
    };
    let text = h.metrics().await;
    assert!(
        text.contains("# TYPE corral_store_transactions_total counter\n"),
        "{text}"
    );
    let before = transactions(&text);
    h.say("a1", ACME, "k1", "hello").await;
    h.wait_status_as("a1", ACME, "completed").await;
    let after = transactions(&h.metrics().await);
    // At least the command, the segment's start and its finish, and this scrape's count.
    assert!(after >= before + 4, "{before} -> {after}");
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_are_labelled_by_tenant_and_agent_and_gauge_waiting_sessions() {
    let h = Harness::start().await;
    h.register_agent().await;
    for id in ["a1", "a2"] {
        h.session(id, ACME).await;
    }
    h.session("b1", BETA).await;
    h.say("a1", ACME, "k1", "pause").await;
    h.say("a2", ACME, "k1", "pause").await;
    h.say("b1", BETA, "k1", "action").await;
    h.wait_status_as("a1", ACME, "paused").await;
    h.wait_status_as("a2", ACME, "paused").await;
    h.wait_status_as("b1", BETA, "waiting").await;
    let text = h.metrics().await;
    for line in [
        "# TYPE corral_sessions gauge",
        "corral_sessions{tenant=\"acme\",agent=\"helper\",status=\"paused\"} 2\n",
        "corral_sessions{tenant=\"beta\",agent=\"helper\",status=\"waiting\"} 1\n",
        "corral_commands_total{tenant=\"acme\",type=\"message\"} 2\n",
        "corral_commands_total{tenant=\"beta\",type=\"message\"} 1\n",
        "corral_turns_total{tenant=\"acme\",agent=\"helper\",outcome=\"paused\"} 2\n",
        "corral_turns_total{tenant=\"beta\",agent=\"helper\",outcome=\"waiting\"} 1\n",
    ] {
        assert!(text.contains(line), "missing {line:?} in\n{text}");
    }
    // Only what is there: no uncertain session, so no such series.
    assert!(
        !text
            .lines()
            .any(|l| l.starts_with("corral_sessions{") && l.contains("uncertain")),
        "{text}"
    );
    // The gauges follow the store: one approval later, one paused session is left.
    let view = h.ok("GET", "/v1/sessions/a1", ACME, None).await;
    let interaction = view["waits"][0]["interactionId"]
        .as_str()
        .unwrap_or_else(|| panic!("a pending approval: {view}"))
        .to_owned();
    let (status, body) = h
        .command(
            "a1",
            ACME,
            json!({"type": "approve", "idempotencyKey": "ap1", "interactionId": interaction,
                "approved": true}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    h.wait_status_as("a1", ACME, "completed").await;
    let text = h.metrics().await;
    for line in [
        "corral_sessions{tenant=\"acme\",agent=\"helper\",status=\"paused\"} 1\n",
        "corral_commands_total{tenant=\"acme\",type=\"approve\"} 1\n",
        "corral_turns_total{tenant=\"acme\",agent=\"helper\",outcome=\"completed\"} 1\n",
    ] {
        assert!(text.contains(line), "missing {line:?} in\n{text}");
    }
}
