//! The wire contract as the OpenAPI document states it: casing, nullability, shapes, query
//! parameters, methods, the bearer scheme, and action outcomes. (Every response of every test is
//! also checked against the document: `common/contract.rs`.)

use corral_server::wire::Command;
use serde_json::{Value, json};

use crate::common::contract::{assert_valid, component, document};
use crate::common::*;

/// Bodies of `POST /v1/sessions/{id}/commands`: the schema accepts exactly what the server's
/// parser accepts.
#[test]
fn the_command_schema_accepts_what_the_server_accepts() {
    let commands = component("Command");
    let schema_accepts = |body: &Value| {
        let validator = jsonschema::draft202012::options()
            .build(&{
                let mut root = commands.clone();
                root["components"] = document()["components"].clone();
                root
            })
            .expect("compiles");
        validator.is_valid(body)
    };
    let cases = [
        // The README's quick start bodies.
        json!({"type": "message", "idempotencyKey": "m1", "content": "Run two sleeps at once"}),
        json!({"type": "approve", "idempotencyKey": "a1", "interactionId": "t:s0:t0", "approved": true}),
        json!({"type": "resolve", "idempotencyKey": "v1", "effectId": "e", "retry": true}),
        json!({"type": "resolve", "idempotencyKey": "v1", "effectId": "e", "outcome": {"value": 1}}),
        json!({"type": "respond", "idempotencyKey": "r1", "interactionId": "i", "value": "any"}),
        json!({"type": "respond", "idempotencyKey": "r1", "interactionId": "i", "value": null}),
        json!({"type": "cancel", "idempotencyKey": "c1"}),
        json!({"type": "cancel", "idempotencyKey": "c1", "reason": null, "requestId": "q"}),
        json!({"type": "action_result", "idempotencyKey": "x", "actionId": "a", "claimId": "c",
            "generation": 1, "outcome": {"value": {"done": true}}}),
        json!({"type": "action_result", "idempotencyKey": "x", "actionId": "a", "claimId": "c",
            "generation": 1, "outcome": {"value": null}}),
        json!({"type": "action_result", "idempotencyKey": "x", "actionId": "a", "claimId": "c",
            "generation": 1, "outcome": {"error": "out of stock"}}),
        // Refused: snake_case fields, unknown fields, wrong types, other outcome shapes.
        json!({"type": "message", "idempotency_key": "m1", "content": "x"}),
        json!({"type": "approve", "idempotencyKey": "a1", "interaction_id": "i", "approved": true}),
        json!({"type": "message", "idempotencyKey": "m1", "content": "x", "extra": 1}),
        json!({"type": "message", "idempotencyKey": "m1"}),
        json!({"type": "message", "idempotencyKey": "m1", "content": 5}),
        json!({"type": "shout", "idempotencyKey": "m1", "content": "x"}),
        json!({"type": "action_result", "idempotencyKey": "x", "actionId": "a", "claimId": "c",
            "generation": -1, "outcome": {"value": 1}}),
        json!({"type": "action_result", "idempotencyKey": "x", "actionId": "a", "claimId": "c",
            "generation": 1, "outcome": {"ok": true}}),
        json!({"type": "action_result", "idempotencyKey": "x", "actionId": "a", "claimId": "c",
            "generation": 1, "outcome": {"result": 5}}),
        json!({"type": "action_result", "idempotencyKey": "x", "actionId": "a", "claimId": "c",
            "generation": 1, "outcome": {"value": 1, "error": "both"}}),
        json!({"type": "action_result", "idempotencyKey": "x", "actionId": "a", "claimId": "c",
            "generation": 1, "outcome": {"error": {"message": "not a string"}}}),
        json!({"type": "action_result", "idempotencyKey": "x", "actionId": "a", "claimId": "c",
            "generation": 1, "outcome": {}}),
        json!({"type": "resolve", "idempotencyKey": "v1", "effectId": "e", "outcome": {"ok": 1}}),
    ];
    for body in cases {
        let parsed = serde_json::from_value::<Command>(body.clone());
        assert_eq!(
            schema_accepts(&body),
            parsed.is_ok(),
            "the schema and the parser disagree on {body}: {parsed:?}"
        );
    }
}

#[test]
fn session_views_have_their_documented_shapes() {
    let view = component("SessionView");
    let base = json!({"id": "s1", "tenantId": "default", "agentId": "demo", "ownerUserId": "ada",
        "manifestHash": "sha256:49d8", "implementationVersion": "1", "status": "idle",
        "activeTurnId": null, "waits": null, "error": null, "actions": [],
        "uncertainEffects": []});
    assert_valid(&view, &base, "idle view");
    let mut paused = base.clone();
    paused["status"] = json!("paused");
    paused["waits"] = json!([{"interactionId": "t:s0:t0", "kind": "approval",
        "toolName": "run_js", "arguments": {"code": "1"}, "argumentsSha256": "9ce4"}]);
    assert_valid(&view, &paused, "paused view");
    let mut waiting = base.clone();
    waiting["waits"] = json!({"effectIds": ["t:0"]});
    assert_valid(&view, &waiting, "waiting view");
    let mut failed = base.clone();
    failed["error"] = json!({"code": "model_error", "message": "boom"});
    assert_valid(&view, &failed, "failed view");
    let validator = {
        let mut root = view.clone();
        root["components"] = document()["components"].clone();
        jsonschema::draft202012::options()
            .build(&root)
            .expect("compiles")
    };
    for (field, wrong) in [
        ("waits", json!("x")),
        ("waits", json!({"other": 1})),
        ("error", json!("boom")),
        ("status", json!("sleeping")),
    ] {
        let mut bad = base.clone();
        bad[field] = wrong.clone();
        assert!(!validator.is_valid(&bad), "{field} = {wrong} was accepted");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bearer_scheme_in_any_case_is_accepted() {
    let h = Harness::start().await;
    for scheme in ["Bearer", "bearer", "BEARER", "bEaReR"] {
        let response = h
            .client
            .get(format!("{}/v1/agents", h.base))
            .header("authorization", format!("{scheme} {OPERATOR}"))
            .send()
            .await
            .expect("send");
        assert_eq!(response.status().as_u16(), 200, "scheme {scheme}");
    }
    for header in [format!("Basic {OPERATOR}"), format!("Bearer{OPERATOR}")] {
        let response = h
            .client
            .get(format!("{}/v1/agents", h.base))
            .header("authorization", header.clone())
            .send()
            .await
            .expect("send");
        assert_eq!(response.status().as_u16(), 401, "{header}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn unknown_query_parameters_are_refused() {
    let h = Harness::start().await;
    h.register_agent().await;
    h.session("s1", OPERATOR).await;
    for path in [
        "/v1/sessions?state=running",
        "/v1/sessions?status=asleep",
        "/v1/sessions?limit=0",
        "/v1/sessions/s1?cursor=1",
        "/v1/sessions/s1/items?limit=0",
        "/v1/sessions/s1/items?limit=1001",
        "/v1/sessions/s1/items?cursor=-1",
        "/v1/sessions/s1/items?from=1",
        "/v1/sessions/s1/items?tenantId=a%2Fb",
        "/v1/agents?x=1",
        "/v1/agents/helper?x=1",
        "/health?verbose=1",
        "/v1/openapi.json?format=yaml",
    ] {
        let (status, body) = h.call("GET", path, Some(OPERATOR), None).await;
        assert_error(status, &body, 400, "invalid_request");
    }
    for path in [
        "/v1/sessions?agentId=helper",
        "/v1/sessions?tenantId=default&agentId=helper",
        "/v1/sessions?status=running,idle&limit=5&ownerUserId=u1",
        "/v1/sessions/s1?tenantId=default",
        "/v1/sessions/s1/items?cursor=0&limit=1000&tenantId=default",
    ] {
        let (status, body) = h.call("GET", path, Some(OPERATOR), None).await;
        assert_eq!(status, 200, "{path}: {body}");
    }
    let listed = h
        .ok("GET", "/v1/sessions?agentId=other", OPERATOR, None)
        .await;
    assert_eq!(listed, json!({"sessions": [], "next": null, "counts": {}}));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_known_path_with_another_method_is_405_with_allow() {
    let h = Harness::start().await;
    for (method, path, allowed) in [
        ("PATCH", "/v1/sessions/s1", &["DELETE", "GET", "PUT"][..]),
        ("POST", "/health", &["GET"][..]),
        ("PATCH", "/v1/agents/helper", &["GET", "PUT"][..]),
        ("GET", "/v1/sessions/s1/commands", &["POST"][..]),
        ("PUT", "/v1/actions", &["GET"][..]),
    ] {
        let response = h
            .client
            .request(
                reqwest::Method::from_bytes(method.as_bytes()).expect("method"),
                format!("{}{path}", h.base),
            )
            .bearer_auth(OPERATOR)
            .send()
            .await
            .expect("send");
        assert_eq!(response.status().as_u16(), 405, "{method} {path}");
        let allow = response
            .headers()
            .get("allow")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        for method in allowed {
            assert!(allow.contains(method), "{path}: Allow {allow:?}");
        }
        let body: Value = response.json().await.expect("json");
        assert_error(405, &body, 405, "method_not_allowed");
    }
    let (status, body) = h.call("GET", "/v1/nothing", Some(OPERATOR), None).await;
    assert_error(status, &body, 404, "not_found");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_agent_is_read_by_its_id() {
    let h = Harness::start().await;
    let hash = h.register_agent().await;
    let agent = h.ok("GET", "/v1/agents/helper", ACME, None).await;
    assert_eq!(
        agent,
        json!({"agentId": "helper", "manifest": manifest(), "manifestHash": hash,
            "implementationVersion": "1", "tenantId": null, "sharedWith": null})
    );
    let (status, body) = h.call("GET", "/v1/agents/nope", Some(OPERATOR), None).await;
    assert_error(status, &body, 404, "not_found");
    let (status, body) = h
        .call("GET", "/v1/agents/helper", Some(EXECUTOR), None)
        .await;
    assert_error(status, &body, 403, "forbidden");
}

#[tokio::test(flavor = "multi_thread")]
async fn outcomes_are_exactly_a_value_or_an_error_message() {
    let h = Harness::start().await;
    h.register_agent().await;
    h.session("s1", OPERATOR).await;
    let result = |outcome: Value| {
        json!({"type": "action_result", "idempotencyKey": "r", "actionId": "nope",
            "claimId": "c", "generation": 1, "outcome": outcome})
    };
    let resolve = |outcome: Value| json!({"type": "resolve", "idempotencyKey": "v", "effectId": "nope", "outcome": outcome});
    for outcome in [
        json!({"ok": true}),
        json!({"result": 5}),
        json!({"value": 1, "error": "both"}),
        json!({"error": {"message": "an object"}}),
        json!({}),
        json!("done"),
    ] {
        let (status, body) = h.command("s1", EXECUTOR, result(outcome.clone())).await;
        assert_error(status, &body, 400, "invalid_request");
        let (status, body) = h.command("s1", OPERATOR, resolve(outcome.clone())).await;
        assert_error(status, &body, 400, "invalid_request");
    }
    // Well-formed outcomes pass the parser and reach the runtime (which knows no such action).
    for outcome in [
        json!({"value": {"done": true}}),
        json!({"value": null}),
        json!({"error": "out of stock"}),
    ] {
        let (status, body) = h.command("s1", EXECUTOR, result(outcome.clone())).await;
        assert_error(status, &body, 404, "not_found");
        let (status, body) = h.command("s1", OPERATOR, resolve(outcome.clone())).await;
        assert_error(status, &body, 404, "not_found");
    }
}
