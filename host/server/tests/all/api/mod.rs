//! Black-box tests of `corral serve`'s wire contract, over real sockets.

mod contract;
mod lifecycle;
mod tenancy;

use std::time::Duration;

use crate::common::*;
use corral_server::manifest::manifest_hash;
use corral_server::routes::routes;
use serde_json::{Value, json};

fn concrete(path: &str) -> String {
    path.replace("{agentId}", "helper").replace("{id}", "s1")
}

#[tokio::test(flavor = "multi_thread")]
async fn health_and_ready_need_no_token() {
    let h = Harness::start().await;
    let (status, body) = h.call("GET", "/health", None, None).await;
    assert_eq!((status, body), (200, json!({"status": "ok"})));
    let (status, body) = h.call("GET", "/ready", None, None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "ready");
    assert_eq!(body["checks"]["store"], true);
    assert_eq!(body["checks"]["scheduler"], true);
}

#[tokio::test(flavor = "multi_thread")]
async fn every_route_checks_the_token_and_its_scope() {
    let h = Harness::start().await;
    h.register_agent().await;
    h.session("s1", OPERATOR).await;
    let public = ["/health", "/ready", "/v1/openapi.json"];
    let executor_routes = [
        "/v1/executors/connect",
        "/v1/actions",
        "/v1/actions/{id}/claim",
        "/v1/actions/{id}/heartbeat",
    ];
    for (method, path) in routes() {
        let (method, path) = (method.as_str(), path.as_str());
        if public.contains(&path) {
            continue;
        }
        let url = concrete(path);
        let body = (method != "GET").then(|| json!({}));
        for token in [None, Some("not-a-valid-token-at-all")] {
            let (status, answer) = h.call(method, &url, token, body.clone()).await;
            assert_error(status, &answer, 401, "unauthorized");
        }
        let (status, answer) = h.call(method, &url, Some("Basic abc"), body.clone()).await;
        assert_error(status, &answer, 401, "unauthorized");
        if executor_routes.contains(&path) {
            for token in [OPERATOR, ACME] {
                let (status, answer) = h.call(method, &url, Some(token), body.clone()).await;
                assert_error(status, &answer, 403, "forbidden");
            }
        } else if path != "/v1/sessions/{id}/commands" {
            let (status, answer) = h.call(method, &url, Some(EXECUTOR), body.clone()).await;
            assert_error(status, &answer, 403, "forbidden");
        }
    }
    // Executors may only report action results.
    let (status, answer) = h
        .command(
            "s1",
            EXECUTOR,
            json!({"type": "message", "idempotencyKey": "k", "content": "x"}),
        )
        .await;
    assert_error(status, &answer, 403, "forbidden");
    // Metrics and agent registration need an operator token.
    let (status, answer) = h.call("GET", "/metrics", Some(ACME), None).await;
    assert_error(status, &answer, 403, "forbidden");
    let (status, answer) = h
        .call(
            "PUT",
            "/v1/agents/helper",
            Some(ACME),
            Some(json!({"manifest": manifest(), "implementationVersion": "1"})),
        )
        .await;
    assert_error(status, &answer, 403, "forbidden");
    // Unknown routes and methods.
    let (status, answer) = h.call("GET", "/v1/nothing", Some(OPERATOR), None).await;
    assert_error(status, &answer, 404, "not_found");
    let (status, answer) = h
        .call("PATCH", "/v1/sessions/s1", Some(OPERATOR), None)
        .await;
    assert_error(status, &answer, 405, "method_not_allowed");
}

#[tokio::test(flavor = "multi_thread")]
async fn agents_are_registered_with_their_hash_and_validated() {
    let h = Harness::start().await;
    let hash = h.register_agent().await;
    assert_eq!(hash, manifest_hash(&manifest()));
    let list = h.ok("GET", "/v1/agents", OPERATOR, None).await;
    assert_eq!(
        list,
        json!({"agents": [{"agentId": "helper", "manifest": manifest(), "manifestHash": hash, "implementationVersion": "1",
            "tenantId": null, "sharedWith": ["*"]}]})
    );
    let put = |manifest: Value| json!({"manifest": manifest, "implementationVersion": "1"});
    // The manifest's id must equal the path.
    let (status, body) = h
        .call(
            "PUT",
            "/v1/agents/other",
            Some(OPERATOR),
            Some(put(manifest())),
        )
        .await;
    assert_error(status, &body, 400, "invalid_request");
    // Unknown fields are named.
    let mut bad = manifest();
    bad["temperature"] = json!(1);
    let (status, body) = h
        .call("PUT", "/v1/agents/helper", Some(OPERATOR), Some(put(bad)))
        .await;
    assert_error(status, &body, 400, "invalid_request");
    assert!(
        body["message"]
            .as_str()
            .unwrap_or("")
            .contains("temperature"),
        "{body}"
    );
    let (status, body) = h
        .call(
            "PUT",
            "/v1/agents/helper",
            Some(OPERATOR),
            Some(json!({"manifest": manifest(), "implementationVersion": "1", "extra": true})),
        )
        .await;
    assert_error(status, &body, 400, "invalid_request");
    assert!(
        body["message"].as_str().unwrap_or("").contains("extra"),
        "{body}"
    );
    // Schema violations.
    let mut bad = manifest();
    bad["mode"] = json!("telepathy");
    let (status, body) = h
        .call("PUT", "/v1/agents/helper", Some(OPERATOR), Some(put(bad)))
        .await;
    assert_error(status, &body, 400, "invalid_request");
    let mut bad = manifest();
    bad["capabilities"] = json!([{"kind": "webhook", "id": "w.x", "input_schema": {}}]);
    let (status, body) = h
        .call("PUT", "/v1/agents/helper", Some(OPERATOR), Some(put(bad)))
        .await;
    assert_error(status, &body, 400, "invalid_request");
    // Limits outside their ranges and repeated capability ids are refused at registration,
    // naming the field, instead of failing every turn.
    for (field, value, named) in [
        (
            "limits",
            json!({"timeoutMs": 0}),
            "manifest.limits.timeoutMs",
        ),
        (
            "limits",
            json!({"timeoutMs": 86_400_001u64}),
            "manifest.limits.timeoutMs",
        ),
        ("limits", json!({"fuel": 0}), "manifest.limits.fuel"),
        ("limits", json!({"memoryMb": 0}), "manifest.limits.memoryMb"),
        (
            "limits",
            json!({"memoryMb": 4096}),
            "manifest.limits.memoryMb",
        ),
        (
            "limits",
            json!({"maxConcurrentCalls": 0}),
            "manifest.limits.maxConcurrentCalls",
        ),
        (
            "capabilities",
            json!([{"kind": "builtin", "id": "examples.echo"}, {"kind": "builtin", "id": "examples.echo"}]),
            "manifest.capabilities[1].id",
        ),
    ] {
        let mut bad = manifest();
        bad[field] = value;
        let (status, body) = h
            .call("PUT", "/v1/agents/helper", Some(OPERATOR), Some(put(bad)))
            .await;
        assert_error(status, &body, 400, "invalid_request");
        assert!(
            body["message"].as_str().unwrap_or("").contains(named),
            "{named}: {body}"
        );
    }
    let mut good = manifest();
    good["limits"] = json!({"timeoutMs": 1, "fuel": 1, "memoryMb": 1024, "maxConcurrentCalls": 1});
    let (status, body) = h
        .call("PUT", "/v1/agents/helper", Some(OPERATOR), Some(put(good)))
        .await;
    assert_eq!(status, 200, "{body}");
    // MCP server declarations are checked too, each error naming the field.
    for (servers, named) in [
        (
            json!([{"name": "fs", "command": "npx", "url": "http://127.0.0.1:1/mcp"}]),
            "mcpServers",
        ),
        (json!([{"name": "a.b", "command": "npx"}]), "mcpServers"),
        (
            json!([{"name": "fs", "command": "npx", "colour": "red"}]),
            "colour",
        ),
        (
            json!([{"name": "fs", "command": "npx"}, {"name": "fs", "command": "node"}]),
            "mcpServers",
        ),
        (
            json!([{"name": "fs", "command": "npx", "env": {"T": {"secret": "X"}}}]),
            "mcpServers",
        ),
    ] {
        let mut bad = manifest();
        bad["mcpServers"] = servers.clone();
        let (status, body) = h
            .call("PUT", "/v1/agents/helper", Some(OPERATOR), Some(put(bad)))
            .await;
        assert_error(status, &body, 400, "invalid_request");
        assert!(
            body["message"].as_str().unwrap_or("").contains(named),
            "{servers}: {body}"
        );
    }
    let mut good = manifest();
    good["mcpServers"] = json!([{"name": "fs", "command": "npx", "args": ["-y", "x"],
        "env": {"TOKEN": {"secretRef": "FS_TOKEN"}}, "needsApproval": {"write": true}}]);
    let (status, body) = h
        .call("PUT", "/v1/agents/helper", Some(OPERATOR), Some(put(good)))
        .await;
    assert_eq!(status, 200, "{body}");
    let (status, _) = h
        .call(
            "PUT",
            "/v1/agents/helper",
            Some(OPERATOR),
            Some(put(manifest())),
        )
        .await;
    assert_eq!(status, 200);
    // Bad JSON.
    let (status, text) = h
        .request("PUT", "/v1/agents/helper", Some(OPERATOR), None)
        .await;
    let body: Value = serde_json::from_str(&text).expect("json");
    assert_error(status, &body, 400, "invalid_request");
    let response = h
        .client
        .put(format!("{}/v1/agents/helper", h.base))
        .bearer_auth(OPERATOR)
        .body("{\"manifest\": ")
        .send()
        .await
        .expect("send");
    assert_eq!(response.status().as_u16(), 400);
    let body: Value = response.json().await.expect("json");
    assert_error(400, &body, 400, "invalid_request");
}

// Over raw sockets: the server answers an oversized body as soon as it knows and closes the
// connection, so an HTTP client still writing the rest fails with EPIPE (reqwest reports that
// as a send error, not the answer). Each request here sends only bytes the server reads before
// it answers, so the answer is always there to read.
#[tokio::test(flavor = "multi_thread")]
async fn bodies_over_one_mebibyte_are_refused_with_or_without_a_length() {
    let h = Harness::start().await;
    let length = 1024 * 1024 + 10;
    // The request line and headers, with the body's framing header last.
    let head = |framing: String| {
        format!(
            "PUT /v1/agents/helper HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {OPERATOR}\r\n\
             content-type: application/json\r\n{framing}\r\n\r\n"
        )
        .into_bytes()
    };
    // With a length: refused from the header alone, before any of the body is read.
    let request = head(format!("content-length: {length}"));
    let (status, body) = raw_exchange(&h.base, request).await;
    assert_error(status, &body, 413, "payload_too_large");
    // Chunked: no length, the limit applies while reading; the last chunk crosses it.
    let mut request = head("transfer-encoding: chunked".to_owned());
    let big = format!("{{\"pad\": \"{}\"}}", "x".repeat(length));
    for chunk in big.as_bytes().chunks(64 * 1024) {
        request.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
        request.extend_from_slice(chunk);
        request.extend_from_slice(b"\r\n");
    }
    let (status, body) = raw_exchange(&h.base, request).await;
    assert_error(status, &body, 413, "payload_too_large");
}

/// Writes `request` to the server at `base` and reads one response: its status and JSON body.
async fn raw_exchange(base: &str, request: Vec<u8>) -> (u16, Value) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let address = base.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(address)
        .await
        .expect("connect");
    stream.write_all(&request).await.expect("write the request");
    let read = async {
        let mut reply = Vec::new();
        let mut buf = [0u8; 8192];
        loop {
            let n = stream.read(&mut buf).await.expect("read the response");
            reply.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&reply).to_string();
            if let Some((head, body)) = text.split_once("\r\n\r\n") {
                let length = head
                    .lines()
                    .find_map(|l| {
                        let (k, v) = l.split_once(':')?;
                        k.eq_ignore_ascii_case("content-length")
                            .then(|| v.trim().parse::<usize>().ok())?
                    })
                    .expect("a content-length");
                if body.len() >= length {
                    let status = head
                        .split_whitespace()
                        .nth(1)
                        .and_then(|s| s.parse().ok())
                        .expect("a status");
                    return (status, serde_json::from_str(&body[..length]).expect("json"));
                }
            }
            assert!(
                n > 0,
                "the connection closed before a whole response: {text}"
            );
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(20), read)
        .await
        .expect("a response within 20 s")
}

#[tokio::test(flavor = "multi_thread")]
async fn sessions_are_idempotent_on_their_creation_parameters() {
    let h = Harness::start().await;
    let hash = h.register_agent().await;
    let create = json!({"agentId": "helper", "ownerUserId": "u1", "requestId": "r1"});
    let first = h
        .ok("PUT", "/v1/sessions/s1", OPERATOR, Some(create.clone()))
        .await;
    assert_eq!(
        first,
        json!({"id": "s1", "tenantId": "default", "agentId": "helper", "ownerUserId": "u1", "manifestHash": hash,
            "implementationVersion": "1", "status": "idle", "activeTurnId": null, "waits": null,
            "error": null, "actions": [], "uncertainEffects": [], "lastDecision": null})
    );
    let again = h
        .ok(
            "PUT",
            "/v1/sessions/s1",
            OPERATOR,
            Some(json!({"agentId": "helper", "ownerUserId": "u1", "requestId": "r2"})),
        )
        .await;
    assert_eq!(again, first);
    let (status, body) = h
        .call(
            "PUT",
            "/v1/sessions/s1",
            Some(OPERATOR),
            Some(json!({"agentId": "helper", "ownerUserId": "u2"})),
        )
        .await;
    assert_error(status, &body, 409, "conflict");
    let (status, body) = h
        .call(
            "PUT",
            "/v1/sessions/s2",
            Some(OPERATOR),
            Some(json!({"agentId": "nobody", "ownerUserId": "u1"})),
        )
        .await;
    assert_error(status, &body, 404, "not_found");
    let (status, body) = h
        .call(
            "PUT",
            "/v1/sessions/s2",
            Some(OPERATOR),
            Some(json!({"agentId": "helper"})),
        )
        .await;
    assert_error(status, &body, 400, "invalid_request");
    assert!(
        body["message"]
            .as_str()
            .unwrap_or("")
            .contains("ownerUserId"),
        "{body}"
    );
    let (status, body) = h
        .call("GET", "/v1/sessions/nope", Some(OPERATOR), None)
        .await;
    assert_error(status, &body, 404, "not_found");
    let list = h
        .ok("GET", "/v1/sessions?agentId=helper", OPERATOR, None)
        .await;
    assert_eq!(
        list,
        json!({"sessions": [{"id": "s1", "tenantId": "default", "agentId": "helper", "ownerUserId": "u1", "status": "idle", "activeTurnId": null}],
            "next": null, "counts": {"idle": 1}})
    );
    let list = h
        .ok("GET", "/v1/sessions?agentId=other", OPERATOR, None)
        .await;
    assert_eq!(list, json!({"sessions": [], "next": null, "counts": {}}));
}

#[tokio::test(flavor = "multi_thread")]
async fn tenants_see_only_their_sessions() {
    let h = Harness::start().await;
    h.register_agent().await;
    h.session("a1", ACME).await;
    h.session("b1", BETA).await;
    let (status, body) = h.call("GET", "/v1/sessions/a1", Some(BETA), None).await;
    assert_error(status, &body, 404, "not_found");
    for path in ["/v1/sessions/a1/items", "/v1/sessions/a1/events"] {
        let (status, body) = h.call("GET", path, Some(BETA), None).await;
        assert_error(status, &body, 404, "not_found");
    }
    let (status, body) = h
        .command(
            "a1",
            BETA,
            json!({"type": "message", "idempotencyKey": "k", "content": "x"}),
        )
        .await;
    assert_error(status, &body, 404, "not_found");
    let (status, body) = h
        .call(
            "PUT",
            "/v1/sessions/a2",
            Some(ACME),
            Some(json!({"agentId": "helper", "ownerUserId": "u1", "tenantId": "beta"})),
        )
        .await;
    assert_error(status, &body, 403, "forbidden");
    let ids = |v: Value| -> Vec<String> {
        v["sessions"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|s| s["id"].as_str().unwrap_or("").to_owned())
                    .collect()
            })
            .unwrap_or_default()
    };
    assert_eq!(
        ids(h.ok("GET", "/v1/sessions", ACME, None).await),
        vec!["a1"]
    );
    assert_eq!(
        ids(h.ok("GET", "/v1/sessions", BETA, None).await),
        vec!["b1"]
    );
    assert_eq!(
        ids(h.ok("GET", "/v1/sessions", OPERATOR, None).await),
        vec!["a1", "b1"]
    );
    // The tenant's own session works for it.
    let (status, _) = h
        .command(
            "a1",
            ACME,
            json!({"type": "message", "idempotencyKey": "k", "content": "hello"}),
        )
        .await;
    assert_eq!(status, 200);
    h.wait_status("a1?tenantId=acme", "completed").await;
    // An operator may create a session in a tenant.
    let created = h
        .ok(
            "PUT",
            "/v1/sessions/a3",
            OPERATOR,
            Some(json!({"agentId": "helper", "ownerUserId": "u9", "tenantId": "acme"})),
        )
        .await;
    assert_eq!(created["id"], "a3");
    assert_eq!(created["tenantId"], "acme");
    h.ok("GET", "/v1/sessions/a3", ACME, None).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_session_id_is_unique_only_within_its_tenant() {
    let h = Harness::start().await;
    h.register_agent().await;
    // Three tenants each have their own `s1`: no 409, and no hint that the others exist.
    let acme = h.session("s1", ACME).await;
    let beta = h.session("s1", BETA).await;
    let default = h.session("s1", OPERATOR).await;
    for (view, tenant) in [(&acme, "acme"), (&beta, "beta"), (&default, "default")] {
        assert_eq!(view["id"], "s1");
        assert_eq!(view["tenantId"], tenant);
    }
    // A message to acme's s1 runs there only.
    let (status, _) = h
        .command(
            "s1",
            ACME,
            json!({"type": "message", "idempotencyKey": "k", "content": "hello"}),
        )
        .await;
    assert_eq!(status, 200);
    let done = h.wait_status("s1?tenantId=acme", "completed").await;
    assert_eq!(done["tenantId"], "acme");
    for (token, path) in [
        (BETA, "/v1/sessions/s1"),
        (OPERATOR, "/v1/sessions/s1"),
        (OPERATOR, "/v1/sessions/s1?tenantId=beta"),
    ] {
        assert_eq!(
            h.ok("GET", path, token, None).await["status"],
            "idle",
            "{path}"
        );
    }
    // The same idempotency key in another tenant's s1 is another command.
    let (status, accepted) = h
        .command(
            "s1",
            BETA,
            json!({"type": "message", "idempotencyKey": "k", "content": "other"}),
        )
        .await;
    assert_eq!((status, &accepted["cursor"]), (200, &json!(1)));
    h.wait_status("s1?tenantId=beta", "completed").await;
    // Events carry the id within the tenant, and each stream is its own tenant's.
    let page = h
        .ok("GET", "/v1/sessions/s1/items?limit=1000", ACME, None)
        .await;
    let events = page["items"].as_array().expect("items");
    assert!(events.iter().all(|e| e["sessionId"] == "s1"));
    assert_eq!(events[0]["data"]["content"], "hello");
    let page = h
        .ok(
            "GET",
            "/v1/sessions/s1/items?limit=1000&tenantId=beta",
            OPERATOR,
            None,
        )
        .await;
    assert_eq!(page["items"][0]["data"]["content"], "other");
    // The operator's list shows all three with their tenants; a tenant filter narrows it.
    let list = h.ok("GET", "/v1/sessions", OPERATOR, None).await;
    let pairs: Vec<(String, String)> = list["sessions"]
        .as_array()
        .expect("sessions")
        .iter()
        .map(|s| {
            (
                s["tenantId"].as_str().unwrap_or("").to_owned(),
                s["id"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect();
    let want = |t: &str| (t.to_owned(), "s1".to_owned());
    assert_eq!(pairs, [want("acme"), want("beta"), want("default")]);
    let list = h
        .ok("GET", "/v1/sessions?tenantId=beta", OPERATOR, None)
        .await;
    assert_eq!(list["sessions"].as_array().map(Vec::len), Some(1));
    assert_eq!(list["sessions"][0]["tenantId"], "beta");
}

#[tokio::test(flavor = "multi_thread")]
async fn only_an_operator_chooses_the_tenant_of_a_session_route() {
    let h = Harness::start().await;
    h.register_agent().await;
    h.session("s1", BETA).await;
    // A tenant token naming another tenant is refused on every session route; naming its own
    // is allowed.
    for (method, path) in [
        ("GET", "/v1/sessions/s1?tenantId=beta"),
        ("GET", "/v1/sessions/s1/items?tenantId=beta"),
        ("GET", "/v1/sessions/s1/events?tenantId=beta"),
        ("GET", "/v1/sessions?tenantId=beta"),
    ] {
        let (status, body) = h.call(method, path, Some(ACME), None).await;
        assert_error(status, &body, 403, "forbidden");
        let own = path.replace("beta", "acme");
        let (status, _) = h.call(method, &own, Some(ACME), None).await;
        assert!(status == 200 || status == 404, "{own}: {status}");
    }
    let (status, body) = h
        .call(
            "POST",
            "/v1/sessions/s1/commands?tenantId=beta",
            Some(ACME),
            Some(json!({"type": "message", "idempotencyKey": "k", "content": "x"})),
        )
        .await;
    assert_error(status, &body, 403, "forbidden");
    // An operator's tenant must be a valid tenant name.
    for bad in ["a%2Fb", "", "%C3%A9"] {
        let (status, body) = h
            .call(
                "GET",
                &format!("/v1/sessions/s1?tenantId={bad}"),
                Some(OPERATOR),
                None,
            )
            .await;
        assert_error(status, &body, 400, "invalid_request");
    }
    let (status, body) = h
        .call(
            "PUT",
            "/v1/sessions/s2",
            Some(OPERATOR),
            Some(json!({"agentId": "helper", "ownerUserId": "u1", "tenantId": "a/b"})),
        )
        .await;
    assert_error(status, &body, 400, "invalid_request");
    let (status, body) = h
        .call(
            "PUT",
            "/v1/sessions/s2?tenantId=acme",
            Some(OPERATOR),
            Some(json!({"agentId": "helper", "ownerUserId": "u1", "tenantId": "beta"})),
        )
        .await;
    assert_error(status, &body, 400, "invalid_request");
    // A session id may contain a slash (percent-encoded) without reaching another tenant.
    let created = h
        .ok(
            "PUT",
            "/v1/sessions/beta%2Fs1",
            ACME,
            Some(json!({"agentId": "helper", "ownerUserId": "u1"})),
        )
        .await;
    assert_eq!(
        (&created["id"], &created["tenantId"]),
        (&json!("beta/s1"), &json!("acme"))
    );
    let (status, body) = h.call("GET", "/v1/sessions/s1", Some(ACME), None).await;
    assert_error(status, &body, 404, "not_found");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_message_runs_a_turn_to_completion() {
    let h = Harness::start().await;
    h.register_agent().await;
    h.session("s1", OPERATOR).await;
    let accepted = h.message("s1", "k1", "tool hello").await;
    assert_eq!(accepted["status"], "accepted");
    assert_eq!(accepted["cursor"], 1);
    assert_eq!(accepted["requestId"], Value::Null);
    let turn = accepted["turnId"].as_str().expect("turn").to_owned();
    let view = h.wait_status("s1", "completed").await;
    assert_eq!(view["activeTurnId"], Value::Null);
    let events = h.events("s1").await;
    let types: Vec<&str> = events
        .iter()
        .map(|e| e["type"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(
        types,
        [
            "command.message",
            "tool.started",
            "tool.finished",
            "turn.completed"
        ]
    );
    for (index, event) in events.iter().enumerate() {
        assert_eq!(event["cursor"], index as u64 + 1);
        assert_eq!(event["sessionId"], "s1");
        assert_eq!(event["turnId"], turn.as_str());
        assert!(event["time"].as_str().unwrap_or("").ends_with('Z'));
        assert_eq!(event.as_object().map(|o| o.len()), Some(6), "{event}");
    }
    assert_eq!(events[0]["data"], json!({"content": "tool hello"}));
    assert_eq!(events[3]["data"]["output"]["text"], "done: tool hello");
    // A second turn after completion.
    h.message("s1", "k2", "again").await;
    h.wait_status("s1", "completed").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn messages_need_a_settled_session() {
    let h = Harness::start().await;
    h.register_agent().await;
    h.session("s1", OPERATOR).await;
    h.message("s1", "k1", "sleep:800").await;
    let (status, body) = h
        .command(
            "s1",
            OPERATOR,
            json!({"type": "message", "idempotencyKey": "k2", "content": "x"}),
        )
        .await;
    assert_error(status, &body, 409, "conflict");
    h.wait_status("s1", "completed").await;
    h.message("s1", "k3", "pause").await;
    h.wait_status("s1", "paused").await;
    let (status, body) = h
        .command(
            "s1",
            OPERATOR,
            json!({"type": "message", "idempotencyKey": "k4", "content": "x"}),
        )
        .await;
    assert_error(status, &body, 409, "conflict");
}

#[tokio::test(flavor = "multi_thread")]
async fn commands_are_idempotent_byte_for_byte() {
    let h = Harness::start().await;
    h.register_agent().await;
    h.session("s1", OPERATOR).await;
    let command =
        json!({"type": "message", "idempotencyKey": "k1", "content": "hi", "requestId": "r1"});
    let (status, first) = h
        .request(
            "POST",
            "/v1/sessions/s1/commands",
            Some(OPERATOR),
            Some(&command),
        )
        .await;
    assert_eq!(status, 200, "{first}");
    h.wait_status("s1", "completed").await;
    // Same key, same command (another requestId): the first response, byte for byte.
    let mut again = command.clone();
    again["requestId"] = json!("r2");
    let (status, second) = h
        .request(
            "POST",
            "/v1/sessions/s1/commands",
            Some(OPERATOR),
            Some(&again),
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(first, second);
    let first: Value = serde_json::from_str(&first).expect("json");
    assert_eq!(first["requestId"], "r1");
    // Same key, another command.
    let (status, body) = h
        .command(
            "s1",
            OPERATOR,
            json!({"type": "message", "idempotencyKey": "k1", "content": "other"}),
        )
        .await;
    assert_error(status, &body, 409, "conflict");
    let (status, body) = h
        .command(
            "s1",
            OPERATOR,
            json!({"type": "cancel", "idempotencyKey": "k1"}),
        )
        .await;
    assert_error(status, &body, 409, "conflict");
    // Bad commands.
    for bad in [
        json!({"type": "message", "idempotencyKey": "k9", "content": "x", "colour": 1}),
        json!({"type": "shout", "idempotencyKey": "k9"}),
        json!({"type": "message", "content": "x"}),
        json!({"type": "message", "idempotencyKey": "k9", "content": 5}),
        json!({"type": "message", "idempotencyKey": "", "content": "x"}),
        json!({"type": "resolve", "idempotencyKey": "k9", "effectId": "e"}),
    ] {
        let (status, body) = h.command("s1", OPERATOR, bad.clone()).await;
        assert_error(status, &body, 400, "invalid_request");
        if bad.get("colour").is_some() {
            assert!(
                body["message"].as_str().unwrap_or("").contains("colour"),
                "{body}"
            );
        }
    }
    let (status, body) = h
        .command(
            "nope",
            OPERATOR,
            json!({"type": "message", "idempotencyKey": "k", "content": "x"}),
        )
        .await;
    assert_error(status, &body, 404, "not_found");
}

#[tokio::test(flavor = "multi_thread")]
async fn approvals_and_responses_resume_a_paused_turn() {
    let h = Harness::start().await;
    h.register_agent().await;
    h.session("s1", OPERATOR).await;
    let turn = h.message("s1", "k1", "pause input tool").await["turnId"]
        .as_str()
        .expect("turn")
        .to_owned();
    let view = h.wait_status("s1", "paused").await;
    let interaction = format!("{turn}:0");
    assert_eq!(view["waits"][0]["interactionId"], interaction.as_str());
    assert_eq!(view["waits"][0]["kind"], "approval");
    let paused = h
        .events("s1")
        .await
        .into_iter()
        .find(|e| e["type"] == "turn.paused")
        .expect("paused");
    assert_eq!(
        paused["data"]["interactions"][0]["interactionId"],
        interaction.as_str()
    );
    // Only the interaction paused on, with the right kind.
    for bad in [
        json!({"type": "approve", "idempotencyKey": "a0", "interactionId": "nope", "approved": true}),
        json!({"type": "respond", "idempotencyKey": "a1", "interactionId": interaction, "value": 1}),
    ] {
        let (status, body) = h.command("s1", OPERATOR, bad).await;
        assert_error(status, &body, 409, "conflict");
    }
    let (status, body) = h
        .command("s1", OPERATOR, json!({"type": "approve", "idempotencyKey": "a2", "interactionId": interaction, "approved": true, "reason": "fine"}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["turnId"], turn.as_str());
    let view = h.wait_status("s1", "paused").await;
    let input = format!("{turn}:1");
    assert_eq!(view["waits"][0]["interactionId"], input.as_str());
    assert_eq!(view["waits"][0]["kind"], "input");
    let (status, body) = h
        .command("s1", OPERATOR, json!({"type": "approve", "idempotencyKey": "a3", "interactionId": input, "approved": true}))
        .await;
    assert_error(status, &body, 409, "conflict");
    let (status, _) = h
        .command("s1", OPERATOR, json!({"type": "respond", "idempotencyKey": "a4", "interactionId": input, "value": {"answer": 42}}))
        .await;
    assert_eq!(status, 200);
    h.wait_status("s1", "completed").await;
    let types = h.event_types("s1").await;
    assert_eq!(
        types,
        [
            "command.message",
            "turn.paused",
            "command.approve",
            "turn.paused",
            "command.respond",
            "tool.started",
            "tool.finished",
            "turn.completed"
        ]
    );
    // Not paused any more.
    let (status, body) = h
        .command("s1", OPERATOR, json!({"type": "approve", "idempotencyKey": "a5", "interactionId": interaction, "approved": true}))
        .await;
    assert_error(status, &body, 409, "conflict");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failed_turn_keeps_the_conversation_and_reports_its_error() {
    let h = Harness::start().await;
    h.register_agent().await;
    h.session("s1", OPERATOR).await;
    h.message("s1", "k1", "tool fail").await;
    let view = h.wait_status("s1", "failed").await;
    assert_eq!(
        view["error"],
        json!({"code": "scripted_failure", "message": "the script asked to fail"})
    );
    assert_eq!(view["activeTurnId"], Value::Null);
    let failed = h
        .events("s1")
        .await
        .into_iter()
        .find(|e| e["type"] == "turn.failed")
        .expect("failed");
    assert_eq!(
        failed["data"],
        json!({"error": {"code": "scripted_failure", "message": "the script asked to fail"}})
    );
    // A panicking engine fails the turn too, without details.
    h.message("s1", "k2", "panic").await;
    let view = h.wait_status("s1", "failed").await;
    assert_eq!(view["error"]["code"], "internal_error");
    h.message("s1", "k3", "fine").await;
    let view = h.wait_status("s1", "completed").await;
    assert_eq!(view["error"], Value::Null);
}

#[tokio::test(flavor = "multi_thread")]
async fn internal_errors_never_leak_details() {
    let h = Harness::start().await;
    h.register_agent().await;
    h.session("s1", OPERATOR).await;
    let turn = h.message("s1", "k1", "corrupt").await["turnId"]
        .as_str()
        .expect("turn")
        .to_owned();
    h.wait_status("s1", "paused").await;
    let (status, text) = h
        .request("POST", "/v1/sessions/s1/commands", Some(OPERATOR),
            Some(&json!({"type": "approve", "idempotencyKey": "a", "interactionId": format!("{turn}:0"), "approved": true})))
        .await;
    let body: Value = serde_json::from_str(&text).expect("json");
    assert_error(status, &body, 500, "internal_error");
    assert!(
        !text.contains("do-not-leak-this") && !text.contains("decode"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn cancel_aborts_the_turn_and_restores_the_state_before_it() {
    let h = Harness::start().await;
    h.register_agent().await;
    h.session("s1", OPERATOR).await;
    h.message("s1", "k1", "first").await;
    h.wait_status("s1", "completed").await;
    let turn = h.message("s1", "k2", "sleep:3000 tool").await["turnId"]
        .as_str()
        .expect("t")
        .to_owned();
    h.wait_status("s1", "running").await;
    let (status, body) = h
        .command(
            "s1",
            OPERATOR,
            json!({"type": "cancel", "idempotencyKey": "c1", "reason": "changed my mind"}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["turnId"], turn.as_str());
    let view = h.wait_status("s1", "cancelled").await;
    assert_eq!(view["activeTurnId"], Value::Null);
    // A paused plan is not resumed by a new turn: cancel while paused, then message.
    h.message("s1", "k3", "pause").await;
    h.wait_status("s1", "paused").await;
    h.command(
        "s1",
        OPERATOR,
        json!({"type": "cancel", "idempotencyKey": "c2"}),
    )
    .await;
    h.wait_status("s1", "cancelled").await;
    h.message("s1", "k4", "plain").await;
    let view = h.wait_status("s1", "completed").await;
    assert_eq!(view["waits"], Value::Null);
    // The conversation holds the completed turns only.
    let types = h.event_types("s1").await;
    assert_eq!(types.iter().filter(|t| *t == "turn.completed").count(), 2);
    // The later turns, run to their end, are the barrier: had the cancelled segment appended
    // anything after its cancellation (its fence is gone), it would be in the history by now.
    let events = h.events("s1").await;
    let last = events
        .iter()
        .rev()
        .find(|e| e["turnId"] == turn.as_str())
        .expect("the cancelled turn's events");
    assert_eq!(
        last["type"], "turn.cancelled",
        "nothing after the cancellation"
    );
    assert_eq!(
        last["data"],
        json!({"reason": "changed my mind", "decidedBy": "operator"})
    );
    assert!(
        !events
            .iter()
            .any(|e| e["type"] == "tool.started" && e["turnId"] == turn.as_str())
    );
}

async fn executor_claim(h: &Harness, action: &str, hash: &str) -> Value {
    h.ok(
        "POST",
        &format!("/v1/actions/{action}/claim"),
        EXECUTOR,
        Some(json!({"manifestHash": hash, "implementationVersion": "1"})),
    )
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn executors_claim_heartbeat_and_report_actions() {
    let h = Harness::start().await;
    let hash = h.register_agent().await;
    h.session("s1", OPERATOR).await;
    let turn = h.message("s1", "k1", "action tool").await["turnId"]
        .as_str()
        .expect("t")
        .to_owned();
    let view = h.wait_status("s1", "waiting").await;
    let action = format!("{turn}:0");
    assert_eq!(view["waits"], json!({"effectIds": [action]}));
    assert_eq!(view["actions"][0]["actionId"], action.as_str());
    let listed = h.ok("GET", "/v1/actions", EXECUTOR, None).await;
    assert_eq!(listed["actions"][0]["actionId"], action.as_str());
    assert_eq!(listed["actions"][0]["status"], "pending");
    let other = h.ok("GET", "/v1/actions", OTHER_EXECUTOR, None).await;
    assert_eq!(other, json!({"actions": []}));
    // Out of scope.
    let (status, body) = h
        .call(
            "POST",
            &format!("/v1/actions/{action}/claim"),
            Some(OTHER_EXECUTOR),
            Some(json!({"manifestHash": "sha256:00", "implementationVersion": "1"})),
        )
        .await;
    assert_error(status, &body, 403, "forbidden");
    let (status, body) = h
        .call(
            "POST",
            "/v1/actions/nope/claim",
            Some(EXECUTOR),
            Some(json!({"manifestHash": hash, "implementationVersion": "1"})),
        )
        .await;
    assert_error(status, &body, 404, "not_found");
    // Definition mismatch.
    let (status, body) = h
        .call(
            "POST",
            &format!("/v1/actions/{action}/claim"),
            Some(EXECUTOR),
            Some(json!({"manifestHash": hash, "implementationVersion": "2"})),
        )
        .await;
    assert_error(status, &body, 409, "conflict");
    let (status, body) = h
        .call(
            "POST",
            &format!("/v1/actions/{action}/claim"),
            Some(EXECUTOR),
            Some(json!({"manifestHash": hash, "implementationVersion": "1", "x": 1})),
        )
        .await;
    assert_error(status, &body, 400, "invalid_request");
    let claim = executor_claim(&h, &action, &hash).await;
    assert_eq!(claim["generation"], 1);
    assert_eq!(claim["action"]["status"], "claimed");
    let claim_id = claim["claimId"].as_str().expect("claim").to_owned();
    // Unavailable once claimed.
    let (status, body) = h
        .call(
            "POST",
            &format!("/v1/actions/{action}/claim"),
            Some(EXECUTOR),
            Some(json!({"manifestHash": hash, "implementationVersion": "1"})),
        )
        .await;
    assert_error(status, &body, 409, "conflict");
    let beat = h
        .ok(
            "POST",
            &format!("/v1/actions/{action}/heartbeat"),
            EXECUTOR,
            Some(json!({"claimId": claim_id, "generation": 1})),
        )
        .await;
    assert!(beat["leaseExpiresAt"].as_str().unwrap_or("").ends_with('Z'));
    for (claim_id, generation) in [(claim_id.as_str(), 2), ("other-claim", 1)] {
        let (status, body) = h
            .call(
                "POST",
                &format!("/v1/actions/{action}/heartbeat"),
                Some(EXECUTOR),
                Some(json!({"claimId": claim_id, "generation": generation})),
            )
            .await;
        assert_error(status, &body, 409, "conflict");
    }
    let result = |key: &str, generation: u64, value: Value| {
        json!({"type": "action_result", "idempotencyKey": key, "actionId": action,
            "claimId": claim_id, "generation": generation, "outcome": {"value": value}})
    };
    // Stale generation.
    let (status, body) = h.command("s1", EXECUTOR, result("r0", 2, json!(1))).await;
    assert_error(status, &body, 409, "conflict");
    // Application tokens cannot report results; executors only in their scope.
    let (status, body) = h.command("s1", OPERATOR, result("r0", 1, json!(1))).await;
    assert_error(status, &body, 403, "forbidden");
    let (status, body) = h
        .command("s1", OTHER_EXECUTOR, result("r0", 1, json!(1)))
        .await;
    assert_error(status, &body, 403, "forbidden");
    let (status, first) = h
        .request(
            "POST",
            "/v1/sessions/s1/commands",
            Some(EXECUTOR),
            Some(&result("r1", 1, json!(42))),
        )
        .await;
    assert_eq!(status, 200, "{first}");
    // The same result again (another key) gets the first receipt; a different one 409.
    let (status, again) = h
        .request(
            "POST",
            "/v1/sessions/s1/commands",
            Some(EXECUTOR),
            Some(&result("r2", 1, json!(42))),
        )
        .await;
    assert_eq!((status, again), (200, first.clone()));
    let (status, body) = h.command("s1", EXECUTOR, result("r3", 1, json!(43))).await;
    assert_error(status, &body, 409, "conflict");
    let view = h.wait_status("s1", "completed").await;
    assert_eq!(view["actions"], json!([]));
    let types = h.event_types("s1").await;
    assert_eq!(
        types,
        [
            "command.message",
            "action.pending",
            "turn.waiting",
            "action.claimed",
            "action.completed",
            "tool.started",
            "tool.finished",
            "turn.completed"
        ]
    );
    let completed = h
        .events("s1")
        .await
        .into_iter()
        .find(|e| e["type"] == "action.completed")
        .expect("e");
    assert_eq!(completed["data"]["result"], json!({"value": 42}));
    // Heartbeat once the turn is over.
    let (status, body) = h
        .call(
            "POST",
            &format!("/v1/actions/{action}/heartbeat"),
            Some(EXECUTOR),
            Some(json!({"claimId": claim_id, "generation": 1})),
        )
        .await;
    assert_error(status, &body, 409, "conflict");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_expired_claim_becomes_uncertain_and_an_operator_resolves_it() {
    let h = Harness::start_with(Options {
        lease: Duration::from_millis(400),
        ..Options::default()
    })
    .await;
    let hash = h.register_agent().await;
    h.session("s1", OPERATOR).await;
    let turn = h.message("s1", "k1", "action action").await["turnId"]
        .as_str()
        .expect("t")
        .to_owned();
    h.wait_status("s1", "waiting").await;
    let action = format!("{turn}:0");
    let claim = executor_claim(&h, &action, &hash).await;
    let claim_id = claim["claimId"].as_str().expect("c").to_owned();
    let view = h.wait_status("s1", "uncertain").await;
    assert_eq!(view["uncertainEffects"][0]["effectId"], action.as_str());
    assert_eq!(view["actions"][0]["status"], "uncertain");
    assert!(
        h.event_types("s1")
            .await
            .contains(&"action.uncertain".to_owned())
    );
    // Heartbeat and result after expiry.
    let (status, body) = h
        .call(
            "POST",
            &format!("/v1/actions/{action}/heartbeat"),
            Some(EXECUTOR),
            Some(json!({"claimId": claim_id, "generation": 1})),
        )
        .await;
    assert_error(status, &body, 409, "conflict");
    let (status, body) = h
        .command(
            "s1",
            EXECUTOR,
            json!({"type": "action_result", "idempotencyKey": "r1", "actionId": action,
            "claimId": claim_id, "generation": 1, "outcome": {"value": 1}}),
        )
        .await;
    assert_error(status, &body, 409, "conflict");
    // Resolve: executor tokens may not; unknown effects 404; then settle it.
    let resolve = json!({"type": "resolve", "idempotencyKey": "v1", "effectId": action, "outcome": {"value": "by hand"}});
    let (status, body) = h.command("s1", EXECUTOR, resolve.clone()).await;
    assert_error(status, &body, 403, "forbidden");
    let (status, body) = h
        .command(
            "s1",
            OPERATOR,
            json!({"type": "resolve", "idempotencyKey": "v0", "effectId": "nope", "retry": true}),
        )
        .await;
    assert_error(status, &body, 404, "not_found");
    let (status, body) = h.command("s1", OPERATOR, resolve).await;
    assert_eq!(status, 200, "{body}");
    // The second action: claim, let it expire, retry it, and finish.
    let second = format!("{turn}:1");
    h.wait_status("s1", "waiting").await;
    executor_claim(&h, &second, &hash).await;
    h.wait_status("s1", "uncertain").await;
    let (status, body) = h
        .command(
            "s1",
            OPERATOR,
            json!({"type": "resolve", "idempotencyKey": "v2", "effectId": second, "retry": true}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    h.wait_status("s1", "waiting").await;
    let claim = executor_claim(&h, &second, &hash).await;
    assert_eq!(claim["generation"], 2);
    let (status, body) = h
        .command(
            "s1",
            EXECUTOR,
            json!({"type": "action_result", "idempotencyKey": "r2", "actionId": second,
            "claimId": claim["claimId"], "generation": 2, "outcome": {"value": 2}}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    h.wait_status("s1", "completed").await;
    // Resolving a settled effect is a conflict.
    let (status, body) = h
        .command(
            "s1",
            OPERATOR,
            json!({"type": "resolve", "idempotencyKey": "v3", "effectId": second, "retry": true}),
        )
        .await;
    assert_error(status, &body, 409, "conflict");
}

#[tokio::test(flavor = "multi_thread")]
async fn cancel_settles_the_turns_actions() {
    let h = Harness::start().await;
    let hash = h.register_agent().await;
    h.session("s1", OPERATOR).await;
    let turn = h.message("s1", "k1", "action").await["turnId"]
        .as_str()
        .expect("t")
        .to_owned();
    h.wait_status("s1", "waiting").await;
    h.command(
        "s1",
        OPERATOR,
        json!({"type": "cancel", "idempotencyKey": "c1"}),
    )
    .await;
    h.wait_status("s1", "cancelled").await;
    let (status, body) = h
        .call(
            "POST",
            &format!("/v1/actions/{turn}:0/claim"),
            Some(EXECUTOR),
            Some(json!({"manifestHash": hash, "implementationVersion": "1"})),
        )
        .await;
    assert_error(status, &body, 409, "conflict");
    let listed = h.ok("GET", "/v1/actions", EXECUTOR, None).await;
    assert_eq!(listed, json!({"actions": []}));
    // A claimed action becomes uncertain on cancel.
    let turn = h.message("s1", "k2", "action").await["turnId"]
        .as_str()
        .expect("t")
        .to_owned();
    h.wait_status("s1", "waiting").await;
    let action = format!("{turn}:0");
    let claim = executor_claim(&h, &action, &hash).await;
    h.command(
        "s1",
        OPERATOR,
        json!({"type": "cancel", "idempotencyKey": "c2"}),
    )
    .await;
    let view = h.wait_status("s1", "cancelled").await;
    assert_eq!(view["actions"][0]["status"], "uncertain");
    assert_eq!(view["uncertainEffects"][0]["effectId"], action.as_str());
    let (status, body) = h
        .command(
            "s1",
            EXECUTOR,
            json!({"type": "action_result", "idempotencyKey": "r", "actionId": action,
            "claimId": claim["claimId"], "generation": 1, "outcome": {"value": 1}}),
        )
        .await;
    assert_error(status, &body, 409, "conflict");
}

#[tokio::test(flavor = "multi_thread")]
async fn items_page_the_event_history() {
    let h = Harness::start().await;
    h.register_agent().await;
    h.session("s1", OPERATOR).await;
    h.message("s1", "k1", "events:25").await;
    h.wait_status("s1", "completed").await;
    let mut cursor = 0;
    let mut seen = Vec::new();
    loop {
        let page = h
            .ok(
                "GET",
                &format!("/v1/sessions/s1/items?cursor={cursor}&limit=7"),
                OPERATOR,
                None,
            )
            .await;
        let items = page["items"].as_array().cloned().unwrap_or_default();
        if items.is_empty() {
            assert_eq!(page["cursor"], cursor);
            break;
        }
        assert!(items.len() <= 7);
        seen.extend(items.iter().map(|e| e["cursor"].as_u64().unwrap_or(0)));
        cursor = page["cursor"].as_u64().expect("cursor");
    }
    assert_eq!(seen, (1..=27).collect::<Vec<u64>>());
    for bad in [
        "cursor=abc",
        "cursor=-1",
        "cursor=999",
        "limit=0",
        "limit=1001",
        "limit=x",
    ] {
        let (status, body) = h
            .call(
                "GET",
                &format!("/v1/sessions/s1/items?{bad}"),
                Some(OPERATOR),
                None,
            )
            .await;
        assert_error(status, &body, 400, "invalid_request");
    }
    for bad in ["cursor=abc", "cursor=999"] {
        let (status, body) = h
            .call(
                "GET",
                &format!("/v1/sessions/s1/events?{bad}"),
                Some(OPERATOR),
                None,
            )
            .await;
        assert_error(status, &body, 400, "invalid_request");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_openapi_description_covers_every_route_and_error_code() {
    let h = Harness::start().await;
    let doc = h.ok("GET", "/v1/openapi.json", OPERATOR, None).await;
    assert!(
        doc["openapi"].as_str().unwrap_or("").starts_with("3.1"),
        "{}",
        doc["openapi"]
    );
    let mut statuses = std::collections::BTreeSet::new();
    let routes = routes();
    assert!(routes.len() >= 17, "{routes:?}");
    for (method, path) in &routes {
        let operation = &doc["paths"][path][method.to_lowercase()];
        assert!(operation.is_object(), "{method} {path} is not described");
        assert!(
            operation["summary"].is_string(),
            "{method} {path}: no summary"
        );
        if let Some(responses) = operation["responses"].as_object() {
            statuses.extend(responses.keys().cloned());
            // Every route takes typed query parameters, so every route can answer 400.
            assert!(
                responses.contains_key("400"),
                "{method} {path}: 400 undocumented"
            );
        }
    }
    let codes = &doc["components"]["schemas"]["ErrorCode"];
    let text = codes.to_string();
    for (code, status) in corral_server::error::ErrorCode::ALL {
        assert!(
            text.contains(code.as_str()),
            "{} not described: {text}",
            code.as_str()
        );
        // 405 belongs to no operation: it answers the methods a path does not have.
        if *status != 405 {
            assert!(
                statuses.contains(&status.to_string()),
                "status {status} not described"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_count_commands_turns_and_streams() {
    let h = Harness::start().await;
    h.register_agent().await;
    h.session("s1", OPERATOR).await;
    h.message("s1", "k1", "tool").await;
    h.wait_status("s1", "completed").await;
    let text = h.metrics().await;
    for line in [
        "corral_commands_total{tenant=\"default\",type=\"message\"} 1",
        "corral_turns_total{tenant=\"default\",agent=\"helper\",outcome=\"completed\"} 1",
        "corral_uncertain_total 0",
        "corral_lease_expiries_total 0",
        "corral_sse_streams 0",
        "# TYPE corral_store_latency_seconds histogram",
        "corral_effects_total{status=\"uncertain\"} 0",
    ] {
        assert!(text.contains(line), "missing {line:?} in\n{text}");
    }
}
