//! What an operator reads from a running server, over real sockets: `/metrics` labelled by
//! tenant and agent, with gauges of the sessions waiting on someone, counted in the store.

mod common;

use std::time::Duration;

use common::{ACME, BETA, Harness, OPERATOR};
use serde_json::json;

async fn metrics(h: &Harness) -> String {
    let (status, text) = h.request("GET", "/metrics", Some(OPERATOR), None).await;
    assert_eq!(status, 200, "{text}");
    text
}

async fn wait_tenant_status(h: &Harness, id: &str, token: &str, status: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let view = h
            .ok("GET", &format!("/v1/sessions/{id}"), token, None)
            .await;
        if view["status"] == status {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{id} never {status}: {view}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn say(h: &Harness, id: &str, token: &str, key: &str, content: &str) -> serde_json::Value {
    let (status, body) = h
        .command(
            id,
            token,
            json!({"type": "message", "idempotencyKey": key, "content": content}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    body
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_are_labelled_by_tenant_and_agent_and_gauge_waiting_sessions() {
    let h = Harness::start().await;
    h.register_agent().await;
    for id in ["a1", "a2"] {
        h.session(id, ACME).await;
    }
    h.session("b1", BETA).await;
    say(&h, "a1", ACME, "k1", "pause").await;
    say(&h, "a2", ACME, "k1", "pause").await;
    say(&h, "b1", BETA, "k1", "action").await;
    wait_tenant_status(&h, "a1", ACME, "paused").await;
    wait_tenant_status(&h, "a2", ACME, "paused").await;
    wait_tenant_status(&h, "b1", BETA, "waiting").await;
    let text = metrics(&h).await;
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
    wait_tenant_status(&h, "a1", ACME, "completed").await;
    let text = metrics(&h).await;
    for line in [
        "corral_sessions{tenant=\"acme\",agent=\"helper\",status=\"paused\"} 1\n",
        "corral_commands_total{tenant=\"acme\",type=\"approve\"} 1\n",
        "corral_turns_total{tenant=\"acme\",agent=\"helper\",outcome=\"completed\"} 1\n",
    ] {
        assert!(text.contains(line), "missing {line:?} in\n{text}");
    }
}
