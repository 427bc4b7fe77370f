//! The crash loop: a child `corral serve` on the embedded store is killed with SIGKILL at random
//! points while sessions run turns that call tools, pause for approvals and wait on executors;
//! it is restarted each time and the invariants are checked against the store:
//! - no acknowledged command is lost (each is recorded with the response the client got);
//! - no event a client saw is lost or changed, and cursors have no gap or duplicate;
//! - no completed effect runs twice (each performed effect is logged before it is performed);
//! - every in-flight effect ends `completed` or `uncertain` (none stays `invoking`).
//!
//! It runs twice: with the server's small scripted engine (`CORRAL_TURN_ENGINE=script`, whose
//! messages are scripts of steps), and with the real turn engine, the chat runtime, whose
//! scripted model answers with JavaScript that calls two webhook tools at once, waits on an
//! executor's action and pauses for approval; there the webhook logs each call's id, which is
//! the journal's effect id.
//!
//! `CORRAL_SOAK_ITERATIONS` sets the number of kills of each loop (50 by default;
//! `scripts/soak N`). The harness only speaks the wire contract and reads the store.

#![cfg(unix)]

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use corral_server::manifest::manifest_hash;
use corral_server::tenancy::{DEFAULT_TENANT, session_key};
use corral_store::{EffectStatus, SqliteStore, Store};
use serde_json::{Value, json};

use crate::common::{self, Rng, Server, logging_webhook as webhook};

const OPERATOR: &str = "crash-operator-token-0001";
const EXECUTOR: &str = "crash-executor-token-0001";
const SESSIONS: usize = 4;
const SCRIPTS: &[&str] = &[
    "tool tool action tool",
    "tool pause tool",
    "tool events:15 tool",
    "action action tool",
    "slow tool",
    "tool",
];

/// The turn engine under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Engine {
    Script,
    Chat,
}

/// What the chat runtime's scripted model answers, in turn: a script, then a closing text.
const CHAT_SCRIPTS: &[&str] = &[
    "const [a, b] = await Promise.all([tools.crash.hit({ n: 1 }), tools.crash.hit({ n: 2, ms: 150 })]);\nreturn a.n + b.n;",
    "const done = await tools.demo.action({ job: 1 });\nconst h = await tools.crash.hit({ n: 3 });\nreturn { done, h };",
    "return await tools.crash.hit({ n: 4, ms: 400 });",
];

fn manifest(engine: Engine, webhook: &str) -> Value {
    let action = json!({"kind": "action", "id": "demo.action", "input_schema": {"type": "object"}});
    match engine {
        Engine::Script => json!({
            "id": "crash",
            "model": {"provider": "scripted", "replies": [{"text": "ok"}]},
            "capabilities": [{"kind": "builtin", "id": "examples.echo"}, action]
        }),
        Engine::Chat => {
            // Enough replies for every turn of the loop (past the end the model answers text).
            let replies: Vec<Value> = (0..300)
                .flat_map(|i| {
                    let code = CHAT_SCRIPTS[i % CHAT_SCRIPTS.len()];
                    [
                        json!({"toolCalls": [{"name": "run_js", "arguments": {"code": code}}]}),
                        json!({"text": "ok"}),
                    ]
                })
                .collect();
            json!({
                "id": "crash",
                "model": {"provider": "scripted", "replies": replies},
                "mode": "js",
                "approval": "script",
                "capabilities": [
                    {"kind": "webhook", "id": "crash.hit", "webhookUrl": webhook,
                     "input_schema": {"type": "object", "properties": {"n": {"type": "integer"}, "ms": {"type": "integer"}}}},
                    action
                ]
            })
        }
    }
}

fn spawn(engine: Engine, config: &Path, log: &Path, stderr: &Path) -> Server {
    let mut command = common::serve(config);
    if engine == Engine::Script {
        command
            .env("CORRAL_SCRIPT_EFFECT_LOG", log)
            .env("CORRAL_TURN_ENGINE", "script");
    }
    Server::spawn(command, stderr)
}

#[derive(Default)]
struct Ledger {
    /// (session, idempotency key) -> the response body the client got.
    acked: BTreeMap<(String, String), Value>,
    /// (session, cursor) -> (type, data) of every event a client saw.
    seen: BTreeMap<(String, u64), (String, Value)>,
    /// The newest cursor seen per session.
    cursors: HashMap<String, u64>,
    keys: u64,
}

struct Driver {
    client: reqwest::Client,
    base: String,
    engine: Engine,
}

impl Driver {
    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        token: &str,
        body: Option<Value>,
    ) -> Option<(u16, String)> {
        let mut request = self
            .client
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(token)
            .timeout(Duration::from_secs(5));
        if let Some(body) = body {
            request = request
                .header("content-type", "application/json")
                .body(body.to_string());
        }
        let response = request.send().await.ok()?;
        let status = response.status().as_u16();
        Some((status, response.text().await.ok()?))
    }

    async fn json(
        &self,
        method: reqwest::Method,
        path: &str,
        token: &str,
        body: Option<Value>,
    ) -> Option<Value> {
        match self.call(method, path, token, body).await? {
            (200, text) => serde_json::from_str(&text).ok(),
            _ => None,
        }
    }

    async fn command(&self, ledger: &mut Ledger, session: &str, token: &str, mut command: Value) {
        ledger.keys += 1;
        let key = format!("key-{}", ledger.keys);
        command["idempotencyKey"] = json!(key);
        let path = format!("/v1/sessions/{session}/commands");
        if let Some((200, text)) = self
            .call(reqwest::Method::POST, &path, token, Some(command))
            .await
            && let Ok(body) = serde_json::from_str(&text)
        {
            ledger.acked.insert((session.to_owned(), key), body);
        }
    }

    async fn ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Some((200, _)) = self
                .call(reqwest::Method::GET, "/ready", OPERATOR, None)
                .await
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("corral serve never became ready");
    }

    /// One round over the sessions: move each one on as a client and an executor would.
    async fn round(&self, ledger: &mut Ledger, rng: &mut Rng) {
        use reqwest::Method;
        for index in 0..SESSIONS {
            let session = format!("crash-{index}");
            let Some(view) = self
                .json(
                    Method::GET,
                    &format!("/v1/sessions/{session}"),
                    OPERATOR,
                    None,
                )
                .await
            else {
                continue;
            };
            let status = view["status"].as_str().unwrap_or("");
            match status {
                "idle" | "completed" | "failed" | "cancelled" => {
                    let script = match self.engine {
                        Engine::Script => SCRIPTS[rng.below(SCRIPTS.len() as u64) as usize],
                        Engine::Chat => "go on",
                    };
                    self.command(
                        ledger,
                        &session,
                        OPERATOR,
                        json!({"type": "message", "content": script}),
                    )
                    .await;
                }
                "paused" => {
                    for wait in view["waits"].as_array().cloned().unwrap_or_default() {
                        let id = wait["interactionId"].clone();
                        let command = if wait["kind"] == "input" {
                            json!({"type": "respond", "interactionId": id, "value": "yes"})
                        } else {
                            json!({"type": "approve", "interactionId": id, "approved": rng.below(4) != 0})
                        };
                        self.command(ledger, &session, OPERATOR, command).await;
                    }
                }
                "waiting" => {
                    let actions = self.json(Method::GET, "/v1/actions", EXECUTOR, None).await;
                    for action in actions
                        .and_then(|a| a["actions"].as_array().cloned())
                        .unwrap_or_default()
                    {
                        if action["sessionId"] != session.as_str() {
                            continue;
                        }
                        let id = action["actionId"].as_str().unwrap_or("").to_owned();
                        let claim = self
                            .json(Method::POST, &format!("/v1/actions/{id}/claim"), EXECUTOR,
                                Some(json!({"manifestHash": action["manifestHash"], "implementationVersion": "1"})))
                            .await;
                        if let Some(claim) = claim {
                            self.command(ledger, &session, EXECUTOR, json!({"type": "action_result",
                                "actionId": id, "claimId": claim["claimId"], "generation": claim["generation"],
                                "outcome": {"value": {"done": id}}})).await;
                        }
                    }
                }
                "uncertain" => {
                    let turn = view["activeTurnId"].clone();
                    for effect in view["uncertainEffects"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default()
                    {
                        if effect["turnId"] == turn {
                            self.command(ledger, &session, OPERATOR, json!({"type": "resolve",
                                "effectId": effect["effectId"], "outcome": {"value": "settled by hand"}})).await;
                        }
                    }
                }
                _ => {
                    if rng.below(12) == 0 {
                        self.command(
                            ledger,
                            &session,
                            OPERATOR,
                            json!({"type": "cancel", "reason": "soak"}),
                        )
                        .await;
                    }
                }
            }
            // Read what is new, as a client would.
            let after = ledger.cursors.get(&session).copied().unwrap_or(0);
            let page = self
                .json(
                    Method::GET,
                    &format!("/v1/sessions/{session}/items?cursor={after}&limit=1000"),
                    OPERATOR,
                    None,
                )
                .await;
            if let Some(page) = page {
                for event in page["items"].as_array().cloned().unwrap_or_default() {
                    let cursor = event["cursor"].as_u64().unwrap_or(0);
                    ledger.seen.insert(
                        (session.clone(), cursor),
                        (
                            event["type"].as_str().unwrap_or("").to_owned(),
                            event["data"].clone(),
                        ),
                    );
                    ledger.cursors.insert(session.clone(), cursor);
                }
            }
        }
    }
}

/// Checks the invariants against the store file (the server is down).
async fn check(store_path: &Path, effect_log: &Path, ledger: &Ledger, final_check: bool) {
    let store: Arc<dyn Store> =
        Arc::new(SqliteStore::open(store_path).expect("open the store after the kill"));
    // Sessions are stored under tenant-qualified keys (corral_server::tenancy).
    let stored = |session: &str| session_key(DEFAULT_TENANT, session);
    for ((session, key), response) in &ledger.acked {
        let record = store
            .get_command(&stored(session), key)
            .await
            .expect("read command")
            .unwrap_or_else(|| panic!("acknowledged command {session}/{key} was lost"));
        assert_eq!(
            &record.response, response,
            "the record of {session}/{key} differs from its acknowledgement"
        );
    }
    let mut effect_ids = HashSet::new();
    for index in 0..SESSIONS {
        let session = format!("crash-{index}");
        for effect in store
            .list_effects(&stored(&session), None)
            .await
            .expect("effects")
        {
            effect_ids.insert(effect.effect_id);
        }
        let mut events = Vec::new();
        let mut after = 0;
        loop {
            let page = store
                .list_events(&stored(&session), after, 1000)
                .await
                .unwrap_or_default();
            if page.is_empty() {
                break;
            }
            after = page.last().map_or(after, |e| e.cursor);
            events.extend(page);
        }
        for (position, event) in events.iter().enumerate() {
            assert_eq!(
                event.cursor,
                position as u64 + 1,
                "cursor gap or duplicate in {session}"
            );
        }
        for ((seen_session, cursor), (kind, data)) in ledger
            .seen
            .range((session.clone(), 0)..=(session.clone(), u64::MAX))
        {
            let _ = seen_session;
            let event = events
                .get(*cursor as usize - 1)
                .unwrap_or_else(|| panic!("event {session}#{cursor} a client saw was lost"));
            assert_eq!(
                (&event.event_type, &event.payload),
                (kind, data),
                "event {session}#{cursor} changed"
            );
        }
        if final_check {
            let invoking = store
                .list_effects(&stored(&session), Some(EffectStatus::Invoking))
                .await
                .expect("effects");
            assert!(
                invoking.is_empty(),
                "effects still invoking in {session}: {invoking:?}"
            );
        }
    }
    common::assert_each_logged_effect_once(effect_log, &effect_ids);
}

fn write_config(dir: &Path, manifest: &Value) -> PathBuf {
    let hash = manifest_hash(manifest);
    let config = format!(
        r#"listen = "127.0.0.1:0"
store = "sqlite:{}"
leaseMs = 300
[[tokens]]
token = "{OPERATOR}"
role = "application"
[[tokens]]
token = "{EXECUTOR}"
role = "executor"
agent = "crash"
manifestHash = "{hash}"
implementationVersion = "1"
"#,
        dir.join("corral.db").display()
    );
    let path = dir.join("serve.toml");
    std::fs::write(&path, config).expect("write config");
    path
}

#[test]
fn sigkill_at_random_points_loses_nothing() {
    crash_loop(Engine::Script);
}

#[test]
fn sigkill_with_the_chat_runtime_loses_nothing() {
    crash_loop(Engine::Chat);
}

fn crash_loop(engine: Engine) {
    let iterations: usize = std::env::var("CORRAL_SOAK_ITERATIONS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(50);
    let seed = std::env::var("CORRAL_SOAK_SEED")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64 | 1)
        });
    eprintln!("crash loop ({engine:?}): {iterations} iterations, CORRAL_SOAK_SEED={seed}");
    let dir = tempfile::tempdir().expect("tempdir");
    let effect_log = dir.path().join("effects.log");
    let manifest = manifest(engine, &webhook(effect_log.clone()));
    let config = write_config(dir.path(), &manifest);
    let store_path = dir.path().join("corral.db");
    let stderr = dir.path().join("serve.stderr");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut rng = Rng(seed);
    let mut ledger = Ledger::default();
    let started = Instant::now();
    runtime.block_on(async {
        for iteration in 0..=iterations {
            let mut server = spawn(engine, &config, &effect_log, &stderr);
            let driver = Driver {
                client: reqwest::Client::new(),
                base: server.base.clone(),
                engine,
            };
            driver.ready().await;
            if iteration == 0 {
                driver
                    .json(
                        reqwest::Method::PUT,
                        "/v1/agents/crash",
                        OPERATOR,
                        Some(json!({"manifest": manifest, "implementationVersion": "1"})),
                    )
                    .await
                    .expect("register the agent");
                for index in 0..SESSIONS {
                    driver
                        .json(
                            reqwest::Method::PUT,
                            &format!("/v1/sessions/crash-{index}"),
                            OPERATOR,
                            Some(json!({"agentId": "crash", "ownerUserId": "soak"})),
                        )
                        .await
                        .expect("create a session");
                }
            }
            if iteration == iterations {
                // The last start: let recovery and the remaining work settle, then stop cleanly.
                let until = Instant::now() + Duration::from_secs(3);
                while Instant::now() < until {
                    driver.round(&mut ledger, &mut rng).await;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                let _ = Command::new("kill")
                    .arg("-TERM")
                    .arg(server.child.id().to_string())
                    .status();
                let _ = server.child.wait();
                check(&store_path, &effect_log, &ledger, true).await;
                break;
            }
            // Drive for a random time, then kill without warning.
            let until = Instant::now() + Duration::from_millis(30 + rng.below(400));
            while Instant::now() < until {
                driver.round(&mut ledger, &mut rng).await;
            }
            server.child.kill().expect("SIGKILL");
            let _ = server.child.wait();
            check(&store_path, &effect_log, &ledger, false).await;
        }
    });
    let performed = std::fs::read_to_string(&effect_log)
        .map(|t| t.lines().count())
        .unwrap_or(0);
    eprintln!(
        "crash loop ({engine:?}): {iterations} kills in {:?}, {} commands acknowledged, {} events seen, {performed} effects performed",
        started.elapsed(),
        ledger.acked.len(),
        ledger.seen.len()
    );
    assert!(
        ledger.acked.len() > iterations,
        "the loop did too little work to mean anything"
    );
    assert!(performed > 0, "no effect was performed");
}
