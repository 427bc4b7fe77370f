//! `corral serve` with its real turn engine, the chat runtime, end to end as the README's quick
//! start promises: an agent whose script calls two webhook tools concurrently and an MCP tool
//! (`@modelcontextprotocol/server-filesystem` over stdio, on a temporary folder), pauses for
//! approval, survives a SIGKILL of the server and a restart on the same store, resumes without
//! running any completed call twice, and streams every event over SSE with no gap.

#![cfg(unix)]

use std::net::TcpListener;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use serde_json::{Value, json};

use crate::common::{self, Server, filesystem_server};

const TOKEN: &str = "e2e-operator-token-00001";

/// The webhook tools' side: how often each capability was called, and the most calls in flight
/// at once. Every call takes 300 ms, so two concurrent calls overlap.
#[derive(Default)]
struct Shop {
    calls: Mutex<Vec<String>>,
    in_flight: AtomicU32,
    peak: AtomicU32,
}

impl Shop {
    fn count(&self, capability: &str) -> usize {
        self.calls
            .lock()
            .map(|c| c.iter().filter(|id| *id == capability).count())
            .unwrap_or(0)
    }
}

fn webhook(shop: Arc<Shop>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}/", listener.local_addr().expect("addr"));
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let shop = Arc::clone(&shop);
            std::thread::spawn(move || {
                let Some(request) = common::read_json_request(&mut stream) else {
                    return;
                };
                let capability = request["capability_id"].as_str().unwrap_or("").to_owned();
                let now = shop.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                shop.peak.fetch_max(now, Ordering::SeqCst);
                if let Ok(mut calls) = shop.calls.lock() {
                    calls.push(capability.clone());
                }
                std::thread::sleep(Duration::from_millis(300));
                shop.in_flight.fetch_sub(1, Ordering::SeqCst);
                common::reply_json(
                    &mut stream,
                    &json!({"ok": true, "output": {"from": capability}}),
                );
            });
        }
    });
    url
}

fn manifest(shop_url: &str, folder: &Path) -> Value {
    let root = folder.display().to_string();
    let code = format!(
        "const [a, b] = await Promise.all([tools.shop.reserve({{sku: 'a'}}), tools.shop.charge({{sku: 'b'}})]);\n\
         const note = await tools.fs.read_text_file({{path: {:?}}});\n\
         return {{a, b, note}};",
        format!("{root}/note.txt")
    );
    json!({
        "id": "e2e",
        "instructions": "Shop.",
        "model": {"provider": "scripted", "replies": [
            {"toolCalls": [{"name": "run_js", "arguments": {"code": code}}]},
            {"text": "Reserved, charged, and read the note."}
        ]},
        "capabilities": [
            {"kind": "webhook", "id": "shop.reserve", "webhookUrl": shop_url,
             "input_schema": {"type": "object", "properties": {"sku": {"type": "string"}}, "required": ["sku"]}},
            {"kind": "webhook", "id": "shop.charge", "webhookUrl": shop_url,
             "input_schema": {"type": "object", "properties": {"sku": {"type": "string"}}, "required": ["sku"]}}
        ],
        "mcpServers": [{"name": "fs", "command": "node",
                        "args": [filesystem_server().display().to_string(), root]}]
    })
}

async fn call(
    base: &str,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    common::call(TOKEN, base, method, path, body).await
}

async fn ok(base: &str, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
    let (status, body) = call(base, method, path, body).await;
    assert_eq!(status, 200, "{path}: {body}");
    body
}

/// Registers `manifest` as agent `manifest.id`, version 1.
async fn register(base: &str, manifest: &Value) {
    let id = manifest["id"].as_str().expect("a manifest id");
    ok(
        base,
        reqwest::Method::PUT,
        &format!("/v1/agents/{id}"),
        Some(json!({"manifest": manifest, "implementationVersion": "1"})),
    )
    .await;
}

/// Opens `session` on `agent` for `owner` and sends it `content` as its first message.
async fn open_and_send(base: &str, session: &str, agent: &str, owner: &str, content: &str) {
    ok(
        base,
        reqwest::Method::PUT,
        &format!("/v1/sessions/{session}"),
        Some(json!({"agentId": agent, "ownerUserId": owner})),
    )
    .await;
    ok(
        base,
        reqwest::Method::POST,
        &format!("/v1/sessions/{session}/commands"),
        Some(json!({"type": "message", "idempotencyKey": "m1", "content": content})),
    )
    .await;
}

async fn wait_status(base: &str, session: &str, status: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let view = ok(
            base,
            reqwest::Method::GET,
            &format!("/v1/sessions/{session}"),
            None,
        )
        .await;
        if view["status"] == status {
            return view;
        }
        assert!(
            !matches!(view["status"].as_str(), Some("failed" | "uncertain"))
                || status == view["status"],
            "the session ended {}: {view}",
            view["status"]
        );
        assert!(Instant::now() < deadline, "never {status}: {view}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Every event from `after` on, over SSE, until `turn.completed`.
async fn stream_until_completed(base: &str, session: &str, after: u64) -> Vec<Value> {
    let response = reqwest::Client::new()
        .get(format!(
            "{base}/v1/sessions/{session}/events?cursor={after}"
        ))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("SSE");
    assert_eq!(response.status().as_u16(), 200);
    let mut stream = eventsource_stream::Eventsource::eventsource(response.bytes_stream());
    let mut events = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while let Ok(Some(message)) = tokio::time::timeout_at(deadline, stream.next()).await {
        let message = message.expect("an SSE message");
        let event: Value = serde_json::from_str(&message.data).expect("event JSON");
        assert_eq!(message.id, event["cursor"].to_string(), "id is the cursor");
        assert_eq!(message.event, event["type"].as_str().unwrap_or(""));
        let done = event["type"] == "turn.completed";
        events.push(event);
        if done {
            return events;
        }
    }
    panic!("no turn.completed; saw {events:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_turn_survives_sigkill_and_resumes_without_running_a_call_twice() {
    let dir = tempfile::tempdir().expect("tempdir");
    let files = dir.path().join("files");
    std::fs::create_dir(&files).expect("files dir");
    std::fs::write(files.join("note.txt"), "ship on monday\n").expect("note");
    let files = files.canonicalize().expect("canonical");
    let shop = Arc::new(Shop::default());
    let shop_url = webhook(Arc::clone(&shop));
    let config = dir.path().join("serve.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:0\"\nstore = \"sqlite:{}\"\n[[tokens]]\ntoken = \"{TOKEN}\"\nrole = \"application\"\n",
            dir.path().join("corral.db").display()
        ),
    )
    .expect("config");
    let stderr = dir.path().join("serve.stderr");
    let get = reqwest::Method::GET;
    let put = reqwest::Method::PUT;
    let post = reqwest::Method::POST;

    let mut server = Server::start(&config, &stderr);
    let base = server.base.clone();
    register(&base, &manifest(&shop_url, &files)).await;
    ok(
        &base,
        put.clone(),
        "/v1/sessions/s1",
        Some(json!({"agentId": "e2e", "ownerUserId": "ada"})),
    )
    .await;
    ok(
        &base,
        post.clone(),
        "/v1/sessions/s1/commands",
        Some(json!({"type": "message", "idempotencyKey": "m1", "content": "Buy it"})),
    )
    .await;
    let paused = wait_status(&base, "s1", "paused").await;
    let interaction = paused["waits"][0]["interactionId"]
        .as_str()
        .expect("an interaction")
        .to_owned();
    assert!(
        paused["waits"][0]["arguments"]["code"]
            .as_str()
            .is_some_and(|code| code.contains("tools.fs.read_text_file")),
        "{paused}"
    );
    assert_eq!(shop.count("shop.reserve"), 0, "ran before approval");

    // SIGKILL while paused, then a new server process on the same store.
    server.kill9();
    let server = Server::start(&config, &stderr);
    let base = server.base.clone();
    let before = ok(
        &base,
        get.clone(),
        "/v1/sessions/s1/items?cursor=0&limit=1000",
        None,
    )
    .await;
    let last_cursor = before["items"]
        .as_array()
        .and_then(|items| items.last())
        .and_then(|e| e["cursor"].as_u64())
        .expect("history survived");
    let streamed = tokio::spawn({
        let base = base.clone();
        async move { stream_until_completed(&base, "s1", last_cursor).await }
    });
    ok(
        &base,
        post.clone(),
        "/v1/sessions/s1/commands",
        Some(json!({"type": "approve", "idempotencyKey": "a1", "interactionId": interaction, "approved": true})),
    )
    .await;
    let events = streamed.await.expect("SSE task");
    wait_status(&base, "s1", "completed").await;

    // Each webhook call ran once, the two at the same time; the MCP tool's answer arrived.
    assert_eq!(shop.count("shop.reserve"), 1);
    assert_eq!(shop.count("shop.charge"), 1);
    assert_eq!(
        shop.peak.load(Ordering::SeqCst),
        2,
        "the two calls overlapped"
    );
    let finished = events
        .iter()
        .find(|e| e["type"] == "tool.finished" && e["data"]["name"] == "run_js")
        .unwrap_or_else(|| panic!("no run_js result in {events:?}"));
    let value = &finished["data"]["result"]["value"];
    // server-filesystem declares an outputSchema, so the script gets its structured {content}.
    assert_eq!(value["note"]["content"], "ship on monday\n", "{finished}");
    assert_eq!(value["a"]["from"], "shop.reserve");
    let completed = events.last().expect("events");
    assert_eq!(
        completed["data"]["output"]["text"],
        "Reserved, charged, and read the note."
    );

    // The whole history has no gap and no duplicate, and SSE showed exactly its tail.
    let all = ok(
        &base,
        get,
        "/v1/sessions/s1/items?cursor=0&limit=1000",
        None,
    )
    .await;
    let cursors: Vec<u64> = all["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter_map(|e| e["cursor"].as_u64())
        .collect();
    assert_eq!(cursors, (1..=cursors.len() as u64).collect::<Vec<_>>());
    let tail: Vec<u64> = events.iter().filter_map(|e| e["cursor"].as_u64()).collect();
    assert_eq!(tail, cursors[last_cursor as usize..].to_vec());
    drop(server);
}

/// The secret the attribution test's server signs webhook calls with.
const WEBHOOK_SECRET: &str = "webhook-signing-secret-01";

/// A webhook that records the whole request of every call (its `context` is the attribution),
/// with `"signature"`: whether its `Corral-Signature` verifies under [`WEBHOOK_SECRET`]
/// (`valid`, `invalid` or `absent`).
fn recording_webhook(seen: Arc<Mutex<Vec<Value>>>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}/", listener.local_addr().expect("addr"));
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let seen = Arc::clone(&seen);
            std::thread::spawn(move || {
                let Some((head, body)) = common::read_request(&mut stream) else {
                    return;
                };
                let Ok(mut request) = serde_json::from_slice::<Value>(&body) else {
                    return;
                };
                let signature = head
                    .lines()
                    .find_map(|l| l.strip_prefix("corral-signature:"))
                    .map(str::trim);
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs());
                request["signature"] = json!(match signature {
                    None => "absent",
                    Some(header) => match corral_chat::backends::verify_signature(
                        WEBHOOK_SECRET.as_bytes(),
                        header,
                        &body,
                        now,
                        300,
                    ) {
                        Ok(()) => "valid",
                        Err(_) => "invalid",
                    },
                });
                if let Ok(mut seen) = seen.lock() {
                    seen.push(request);
                }
                common::reply_json(&mut stream, &json!({"ok": true, "output": {"done": true}}));
            });
        }
    });
    url
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_webhook_call_carries_the_sessions_tenant_id_owner_turn_and_effect() {
    const ACME: &str = "acme-tenant-token-000001";
    const GLOBEX: &str = "globex-tenant-token-00001";
    let dir = tempfile::tempdir().expect("tempdir");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let url = recording_webhook(Arc::clone(&seen));
    let config = dir.path().join("serve.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:0\"\nstore = \"sqlite:{}\"\nwebhookSecret = \"{WEBHOOK_SECRET}\"\n\
             [[tokens]]\ntoken = \"{TOKEN}\"\nrole = \"application\"\n\
             [[tokens]]\ntoken = \"{ACME}\"\nrole = \"application\"\ntenant = \"acme\"\n\
             [[tokens]]\ntoken = \"{GLOBEX}\"\nrole = \"application\"\ntenant = \"globex\"\n",
            dir.path().join("corral.db").display()
        ),
    )
    .expect("config");
    let server = Server::start(&config, &dir.path().join("serve.stderr"));
    let base = server.base.clone();
    // The script tries to pass attribution of its own in its argument: it must change nothing.
    let code = "return await tools.shop.note({text: 'hi', tenant_id: 'evil', session_id: 'x'});";
    let manifest = json!({
        "id": "attr",
        "instructions": "Note.",
        "autoConfirm": true,
        "model": {"provider": "scripted", "replies": [
            {"toolCalls": [{"name": "run_js", "arguments": {"code": code}}]},
            {"text": "Noted."}
        ]},
        "capabilities": [{"kind": "webhook", "id": "shop.note", "webhookUrl": url,
                          "input_schema": {"type": "object"}}]
    });
    ok(
        &base,
        reqwest::Method::PUT,
        "/v1/agents/attr",
        Some(json!({"manifest": manifest, "implementationVersion": "1",
            "sharedWith": ["acme", "globex"]})),
    )
    .await;
    let mut turns = Vec::new();
    for (token, tenant, owner) in [(ACME, "acme", "ada"), (GLOBEX, "globex", "grace")] {
        let (status, body) = common::call(
            token,
            &base,
            reqwest::Method::PUT,
            "/v1/sessions/dup",
            Some(json!({"agentId": "attr", "ownerUserId": owner})),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        let (status, accepted) = common::call(
            token,
            &base,
            reqwest::Method::POST,
            "/v1/sessions/dup/commands",
            Some(json!({"type": "message", "idempotencyKey": "m1", "content": "note it"})),
        )
        .await;
        assert_eq!(status, 200, "{accepted}");
        let turn = accepted["turnId"].as_str().expect("a turn").to_owned();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let (_, view) =
                common::call(token, &base, reqwest::Method::GET, "/v1/sessions/dup", None).await;
            if view["status"] == "completed" {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{tenant}: never completed: {view}"
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        turns.push((tenant, owner, turn));
    }
    let seen = seen.lock().expect("calls").clone();
    assert_eq!(seen.len(), 2, "{seen:?}");
    for (tenant, owner, turn) in turns {
        let call = seen
            .iter()
            .find(|c| c["context"]["tenant_id"] == tenant)
            .unwrap_or_else(|| panic!("no call attributed to {tenant}: {seen:?}"));
        let context = &call["context"];
        assert_eq!(context["session_id"], "dup", "{call}");
        assert_eq!(context["user_id"], owner, "{call}");
        assert_eq!(context["run_id"], turn.as_str(), "{call}");
        assert_eq!(context["attributes"]["agentId"], "attr", "{call}");
        let effect = context["attributes"]["effectId"]
            .as_str()
            .expect("effect id");
        assert_eq!(call["tool_call_id"], effect, "{call}");
        assert!(
            effect.starts_with(turn.as_str()),
            "{effect} is of turn {turn}"
        );
        // The script's argument reached the backend as data only.
        assert_eq!(call["input"][0]["tenant_id"], "evil");
        // Signed with the server's secret, over the exact body sent.
        assert_eq!(call["signature"], "valid", "{call}");
    }
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_closes_and_expires_settled_sessions_and_never_a_paused_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("serve.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:0\"\nstore = \"sqlite:{}\"\n\
             [[tokens]]\ntoken = \"{TOKEN}\"\nrole = \"application\"\n\
             [retention]\nintervalMs = 100\nsettledSessionTtlMs = 1500\nclosedSessionTtlMs = 0\n",
            dir.path().join("corral.db").display()
        ),
    )
    .expect("config");
    let server = Server::start(&config, &dir.path().join("serve.stderr"));
    let base = server.base.clone();
    for (agent, auto_confirm) in [("quick", true), ("careful", false)] {
        let manifest = json!({
            "id": agent,
            "instructions": "Add.",
            "autoConfirm": auto_confirm,
            "model": {"provider": "scripted", "replies": [
                {"toolCalls": [{"name": "run_js", "arguments": {"code": "return 1 + 1;"}}]},
                {"text": "Two."}
            ]}
        });
        register(&base, &manifest).await;
    }
    for (session, agent) in [("done", "quick"), ("held", "careful")] {
        open_and_send(&base, session, agent, "ada", "1+1?").await;
    }
    wait_status(&base, "held", "paused").await;
    // The completed session is left alone for longer than its 1.5 s: closed, then deleted.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (status, body) = call(&base, reqwest::Method::GET, "/v1/sessions/done", None).await;
        if status == 404 {
            break;
        }
        assert_eq!(status, 200, "{body}");
        assert!(Instant::now() < deadline, "never expired: {body}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let held = ok(&base, reqwest::Method::GET, "/v1/sessions/held", None).await;
    assert_eq!(held["status"], "paused", "{held}");
    let client = reqwest::Client::new();
    let metrics = client
        .get(format!("{base}/metrics"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics text");
    let counter = |name: &str| {
        metrics
            .lines()
            .find_map(|line| line.strip_prefix(name)?.trim().parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no {name} in {metrics}"))
    };
    assert!(counter("corral_retention_pruned_total{kind=\"sessions\"}") >= 1);
    assert!(counter("corral_retention_passes_total") >= 1);
    drop(server);
}

/// A webhook that answers each call after `delay`, counting the calls it received.
fn slow_webhook(delay: Duration, calls: Arc<Mutex<usize>>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}/", listener.local_addr().expect("addr"));
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let calls = Arc::clone(&calls);
            std::thread::spawn(move || {
                if common::read_json_request(&mut stream).is_none() {
                    return;
                }
                if let Ok(mut calls) = calls.lock() {
                    *calls += 1;
                }
                std::thread::sleep(delay);
                common::reply_json(&mut stream, &json!({"ok": true, "output": {"done": true}}));
            });
        }
    });
    url
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deploy_during_a_call_shorter_than_the_grace_period_leaves_nothing_uncertain() {
    let dir = tempfile::tempdir().expect("tempdir");
    let calls = Arc::new(Mutex::new(0));
    let url = slow_webhook(Duration::from_millis(1500), Arc::clone(&calls));
    let config = dir.path().join("serve.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:0\"\nstore = \"sqlite:{}\"\nshutdownGraceMs = 20000\n\
             [[tokens]]\ntoken = \"{TOKEN}\"\nrole = \"application\"\n",
            dir.path().join("corral.db").display()
        ),
    )
    .expect("config");
    let stderr = dir.path().join("serve.stderr");
    let server = Server::start(&config, &stderr);
    let code = "return await tools.shop.slow({});";
    let manifest = json!({
        "id": "deploy", "instructions": "Go.", "autoConfirm": true,
        "model": {"provider": "scripted", "replies": [
            {"toolCalls": [{"name": "run_js", "arguments": {"code": code}}]},
            {"text": "Done."}
        ]},
        "capabilities": [{"kind": "webhook", "id": "shop.slow", "webhookUrl": url,
                          "input_schema": {"type": "object"}}]
    });
    let base = server.base.clone();
    register(&base, &manifest).await;
    open_and_send(&base, "d1", "deploy", "u", "go").await;
    // The call is in flight at the webhook: deploy (SIGTERM, then start again).
    let deadline = Instant::now() + Duration::from_secs(60);
    while *calls.lock().expect("calls") == 0 {
        assert!(Instant::now() < deadline, "the webhook was never called");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut server = server;
    let status = Command::new("kill")
        .args(["-TERM", &server.child.id().to_string()])
        .status()
        .expect("kill -TERM");
    assert!(status.success());
    let exit = server.child.wait().expect("corral serve exits");
    assert!(exit.success(), "a SIGTERM'd server exits cleanly: {exit:?}");
    drop(server);
    let server = Server::start(&config, &stderr);
    let view = wait_status(&server.base, "d1", "completed").await;
    assert_eq!(view["uncertainEffects"], json!([]), "{view}");
    let (_, page) = call(
        &server.base,
        reqwest::Method::GET,
        "/v1/sessions/d1/items?cursor=0&limit=1000",
        None,
    )
    .await;
    let types: Vec<&str> = page["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter_map(|e| e["type"].as_str())
        .collect();
    assert!(!types.contains(&"effect.uncertain"), "{types:?}");
    // The call ran once: its result was journaled before the first process stopped.
    assert_eq!(*calls.lock().expect("calls"), 1);
    drop(server);
}

/// A turn segment reuses what an earlier one built for the same agent definition: the MCP
/// server's tools are listed once for several turns of several sessions, and again only after
/// the server announces that its tool list changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn segments_reuse_the_agents_binding_until_its_tool_list_changes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("serve.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:0\"\nstore = \"sqlite:{}\"\n\
             [[tokens]]\ntoken = \"{TOKEN}\"\nrole = \"application\"\n",
            dir.path().join("corral.db").display()
        ),
    )
    .expect("config");
    let server = Server::start(&config, &dir.path().join("serve.stderr"));
    let base = server.base.clone();
    let stats = json!({"toolCalls": [{"name": "run_js", "arguments": {"code": "return (await tools.kit.stats({})).lists;"}}]});
    let manifest = json!({
        "id": "kit",
        "instructions": "Count.",
        "autoConfirm": true,
        "model": {"provider": "scripted", "replies": [
            stats, {"text": "one"},
            stats, {"text": "two"},
            {"toolCalls": [{"name": "run_js", "arguments": {"code": "return await tools.kit.add_tool({name: 'later'});"}}]},
            {"text": "added"},
            stats, {"text": "three"}
        ]},
        "mcpServers": [common::testkit_server(&["normal"])]
    });
    register(&base, &manifest).await;
    // The scripted model answers by its call's index in the session, so each session replays
    // the replies from the first: turns of two sessions, then the change.
    let mut lists = Vec::new();
    for (session, turns) in [("k1", 2), ("k2", 1)] {
        ok(
            &base,
            reqwest::Method::PUT,
            &format!("/v1/sessions/{session}"),
            Some(json!({"agentId": "kit", "ownerUserId": "ada"})),
        )
        .await;
        for turn in 0..turns {
            let sent = ok(
                &base,
                reqwest::Method::POST,
                &format!("/v1/sessions/{session}/commands"),
                Some(json!({"type": "message", "idempotencyKey": format!("m{turn}"), "content": "Count"})),
            )
            .await;
            let after = sent["cursor"].as_u64().expect("cursor");
            let events = stream_until_completed(&base, session, after).await;
            let finished = events
                .iter()
                .find(|e| e["type"] == "tool.finished")
                .expect("the script finished");
            lists.push(finished["data"]["result"]["value"].clone());
        }
    }
    assert_eq!(
        lists,
        vec![json!(1), json!(1), json!(1)],
        "listed once for three segments of two sessions"
    );
    // k1's third turn adds a tool (the server announces it), its fourth counts again.
    for (turn, key) in [(2, "m2"), (3, "m3")] {
        let sent = ok(
            &base,
            reqwest::Method::POST,
            "/v1/sessions/k1/commands",
            Some(json!({"type": "message", "idempotencyKey": key, "content": "Count"})),
        )
        .await;
        let after = sent["cursor"].as_u64().expect("cursor");
        let events = stream_until_completed(&base, "k1", after).await;
        if turn == 3 {
            let finished = events
                .iter()
                .find(|e| e["type"] == "tool.finished")
                .expect("the script finished");
            assert_eq!(
                finished["data"]["result"]["value"],
                json!(2),
                "listed again after tools/list_changed: {finished}"
            );
        }
    }
}

/// What the model sees under `corral serve`: an agent whose manifest sets `discoveryTokens: 0`
/// gets the discovery form of `run_js`, its script finds the webhook tool with `$search` and
/// calls it, a later script that names a tool that does not exist is stopped by pre-flight
/// before its first call reaches the webhook, and (`resultTokens: 300`) a large result reaches
/// the model cut while the next script reads it whole with `tools.$result`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_finds_its_tool_by_search_and_a_mistyped_call_never_runs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let url = recording_webhook(Arc::clone(&seen));
    let config = dir.path().join("serve.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:0\"\nstore = \"sqlite:{}\"\nwebhookSecret = \"{WEBHOOK_SECRET}\"\n\
             [[tokens]]\ntoken = \"{TOKEN}\"\nrole = \"application\"\n",
            dir.path().join("corral.db").display()
        ),
    )
    .expect("config");
    let server = Server::start(&config, &dir.path().join("serve.stderr"));
    let base = server.base.clone();
    let find = "const [hit] = await tools.$search({query: 'write a note', limit: 1});\n\
                return {id: hit.id, done: await tools[hit.id]({text: 'found'})};";
    let typo = "await tools.shop.note({text: 'first'});\nreturn await tools.shop.notes.list({});";
    let rows = "return Array.from({length: 5000}, (_, i) => ({id: i, name: `row ${i}`}));";
    let pick = "const rows = await tools.$result({id: 's2t0'});\n\
                return {count: rows.length, last: rows[rows.length - 1].id};";
    let manifest = json!({
        "id": "finder",
        "autoConfirm": true,
        "discoveryTokens": 0,
        "resultTokens": 300,
        "model": {"provider": "scripted", "replies": [
            {"toolCalls": [{"name": "run_js", "arguments": {"code": find}}]},
            {"toolCalls": [{"name": "run_js", "arguments": {"code": typo}}]},
            {"toolCalls": [{"name": "run_js", "arguments": {"code": rows}}]},
            {"toolCalls": [{"name": "run_js", "arguments": {"code": pick}}]},
            {"text": "Done."}
        ]},
        "capabilities": [
            {"kind": "webhook", "id": "shop.note", "description": "Write a note.",
             "webhookUrl": url, "input_schema": {"type": "object"}},
            {"kind": "webhook", "id": "shop.orders.get", "description": "Get an order.",
             "webhookUrl": url, "input_schema": {"type": "object"}}
        ]
    });
    register(&base, &manifest).await;
    open_and_send(&base, "f1", "finder", "ada", "note it").await;
    wait_status(&base, "f1", "completed").await;
    let items = ok(
        &base,
        reqwest::Method::GET,
        "/v1/sessions/f1/items?cursor=0&limit=1000",
        None,
    )
    .await;
    let results: Vec<Value> = items["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter(|e| e["type"] == "tool.finished" && e["data"]["name"] == "run_js")
        .map(|e| e["data"]["result"].clone())
        .collect();
    assert_eq!(results.len(), 4, "{items}");
    assert_eq!(
        results[0]["value"],
        json!({"id": "shop.note", "done": {"done": true}}),
        "{}",
        results[0]
    );
    assert_eq!(
        results[1]["error"]["kind"], "preflight_error",
        "{}",
        results[1]
    );
    assert_eq!(
        results[1]["error"]["unknown"][0]["path"],
        "tools.shop.notes.list"
    );
    // Results that fit: the 5,000 rows reached the model cut to the manifest's budget (the
    // event carries the cut form and the whole size), and the next script read them whole.
    let cut = &items["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter(|e| e["type"] == "tool.finished" && e["data"]["name"] == "run_js")
        .nth(2)
        .expect("the rows' result")["data"];
    assert!(cut["wholeBytes"].as_u64() > Some(100_000), "{cut}");
    assert!(cut["result"].to_string().len() <= 300 * 4 + 200, "{cut}");
    assert_eq!(
        results[3]["value"],
        json!({"count": 5000, "last": 4999}),
        "{}",
        results[3]
    );
    // One webhook call: the found note. The second script's first call never ran.
    let seen = seen.lock().expect("calls").clone();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0]["input"][0]["text"], "found");
    drop(server);
}
