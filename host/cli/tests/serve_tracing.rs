//! Tracing end to end (docs/tracing.md): `corral serve` exports its spans over OTLP to Arize
//! Phoenix, the trace store an operator would run (installed from PyPI by
//! `host/cli/tests/install-trace-tools.sh`, which scripts/test runs), and the test reads them
//! back from Phoenix's REST API.
//!
//! One turn of the chat runtime with the scripted model: a message sent with the caller's W3C
//! `traceparent`, a model call, a script approved by a person whose two concurrent webhook calls
//! are interrupted by a SIGKILL of the server while the second is in flight; after the restart
//! an operator retries the uncertain call and the turn completes. The test checks the span tree
//! (names, parents, attributes), that the resumed run is a new trace that names the one the
//! command started, that the call taken from the journal is marked replayed and the retried one
//! is not, that the webhook's `traceparent` is its call's span, and that with content capture
//! off no span carries a script, a prompt, a completion or a tool's input or output.

#![cfg(unix)]

mod common;

use std::collections::HashMap;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

const TOKEN: &str = "trace-operator-token-0001";
/// The trace the test's own client is in when it sends the message.
const CLIENT_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";

/// What the webhook saw: each call's effect id, input `n` and `traceparent` header.
#[derive(Debug, Clone)]
struct Seen {
    effect_id: String,
    n: u64,
    traceparent: Option<String>,
}

/// The webhook: `n: 1` answers at once; the first `n: 2` tells the test (once `n: 1` has been
/// answered a while ago, so the journal has it) and never answers, so the server is killed with
/// that call in flight; a retried `n: 2` answers at once.
fn webhook(seen: Arc<Mutex<Vec<Seen>>>, in_flight: mpsc::Sender<()>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}/", listener.local_addr().expect("addr"));
    let first_two = Arc::new(Mutex::new(true));
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let seen = Arc::clone(&seen);
            let in_flight = in_flight.clone();
            let first_two = Arc::clone(&first_two);
            std::thread::spawn(move || {
                let Some((head, body)) = common::read_request(&mut stream) else {
                    return;
                };
                let Ok(request) = serde_json::from_slice::<Value>(&body) else {
                    return;
                };
                let traceparent = head
                    .lines()
                    .find_map(|l| l.strip_prefix("traceparent:"))
                    .map(|v| v.trim().to_owned());
                let n = request["input"][0]["n"].as_u64().unwrap_or(0);
                if let Ok(mut seen) = seen.lock() {
                    seen.push(Seen {
                        effect_id: request["tool_call_id"].as_str().unwrap_or("").to_owned(),
                        n,
                        traceparent,
                    });
                }
                let hold = n == 2
                    && first_two
                        .lock()
                        .map(|mut f| std::mem::take(&mut *f))
                        .unwrap_or(false);
                if hold {
                    // The journal completes `n: 1` as soon as it is answered; give it time.
                    std::thread::sleep(Duration::from_millis(700));
                    let _ = in_flight.send(());
                    std::thread::sleep(Duration::from_secs(120));
                    return;
                }
                common::reply_json(&mut stream, &json!({"ok": true, "output": {"n": n}}));
            });
        }
    });
    url
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// Phoenix on free ports in a working folder of its own, stopped when dropped.
struct Phoenix {
    child: Child,
    base: String,
}

impl Drop for Phoenix {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Phoenix {
    fn start(dir: &Path) -> Phoenix {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let program = root.join("target/trace-tools/bin/phoenix");
        assert!(
            program.exists(),
            "Arize Phoenix is not installed: run `bash host/cli/tests/install-trace-tools.sh` \
             (scripts/test does) to install it from PyPI into target/trace-tools"
        );
        let port = free_port();
        let log = std::fs::File::create(dir.join("phoenix.log")).expect("phoenix log");
        let child = Command::new(program)
            .arg("serve")
            .env("PHOENIX_HOST", "127.0.0.1")
            .env("PHOENIX_PORT", port.to_string())
            .env("PHOENIX_GRPC_PORT", free_port().to_string())
            .env("PHOENIX_WORKING_DIR", dir)
            .env("PHOENIX_TELEMETRY_ENABLED", "false")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("phoenix starts");
        Phoenix {
            child,
            base: format!("http://127.0.0.1:{port}"),
        }
    }

    async fn ready(&mut self, dir: &Path) {
        let deadline = Instant::now() + Duration::from_secs(120);
        while Instant::now() < deadline {
            if let Ok(response) = reqwest::get(format!("{}/healthz", self.base)).await
                && response.status().is_success()
            {
                return;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "Phoenix exited ({status}); see {}",
                    dir.join("phoenix.log").display()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        panic!("Phoenix was not ready within 120 s");
    }

    /// Every span of the default project, as `{name, traceId, spanId, parentSpanId, kind,
    /// attributes: {key: value}, events: [name]}`.
    async fn spans(&self) -> Vec<Value> {
        let url = format!("{}/v1/projects/default/spans/otlpv1?limit=1000", self.base);
        let Ok(response) = reqwest::get(url).await else {
            return Vec::new();
        };
        let Ok(body) = response.json::<Value>().await else {
            return Vec::new();
        };
        body["data"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .map(|span| {
                let mut attributes = serde_json::Map::new();
                for kv in span["attributes"].as_array().cloned().unwrap_or_default() {
                    // `{"string_value": ..., "int_value": null, ...}`: the one that is set;
                    // 64-bit integers come as strings (proto3 JSON).
                    let value = kv["value"]
                        .as_object()
                        .and_then(|v| v.iter().find(|(_, v)| !v.is_null()))
                        .map(|(kind, value)| match (kind.as_str(), value.as_str()) {
                            ("int_value", Some(text)) => {
                                text.parse::<i64>().map_or(value.clone(), Value::from)
                            }
                            _ => value.clone(),
                        })
                        .unwrap_or(Value::Null);
                    attributes.insert(kv["key"].as_str().unwrap_or("").to_owned(), value);
                }
                let events: Vec<Value> = span["events"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
                    .iter()
                    .map(|e| e["name"].clone())
                    .collect();
                json!({
                    "name": span["name"],
                    "traceId": span["trace_id"],
                    "spanId": span["span_id"],
                    "parentSpanId": span["parent_span_id"],
                    "kind": span["kind"],
                    "attributes": attributes,
                    "events": events,
                })
            })
            .collect()
    }
}

struct Server {
    child: Child,
    base: String,
}

impl Server {
    fn start(config: &Path, stderr: &Path) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_corral"))
            .arg("serve")
            .arg("--config")
            .arg(config)
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            .env_remove("OTEL_SDK_DISABLED")
            .env_remove("OTEL_TRACES_EXPORTER")
            .env_remove("OTEL_SERVICE_NAME")
            .env_remove("CORRAL_TRACE_CONTENT")
            .env("OTEL_BSP_SCHEDULE_DELAY", "100")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(stderr)
                    .map(Stdio::from)
                    .unwrap_or_else(|_| Stdio::null()),
            )
            .spawn()
            .expect("spawn corral serve");
        let base = common::listening_address(&mut child).unwrap_or_else(|| {
            panic!(
                "corral serve exited before listening; see {}",
                stderr.display()
            )
        });
        Server { child, base }
    }
}

async fn call(
    base: &str,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
    traceparent: Option<&str>,
) -> Value {
    let mut request = reqwest::Client::new()
        .request(method, format!("{base}{path}"))
        .bearer_auth(TOKEN)
        .timeout(Duration::from_secs(10));
    if let Some(parent) = traceparent {
        request = request.header("traceparent", parent);
    }
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.expect("request");
    let status = response.status();
    let text = response.text().await.expect("body");
    assert!(status.is_success(), "{path}: {status} {text}");
    serde_json::from_str(&text).unwrap_or(Value::Null)
}

async fn wait_status(base: &str, session: &str, status: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let view = call(
            base,
            reqwest::Method::GET,
            &format!("/v1/sessions/{session}"),
            None,
            None,
        )
        .await;
        if view["status"] == status {
            return view;
        }
        assert!(
            Instant::now() < deadline,
            "session {session} never became {status}: {view}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn write_config(dir: &Path, phoenix: &str) -> PathBuf {
    let path = dir.join("serve.toml");
    std::fs::write(
        &path,
        format!(
            r#"listen = "127.0.0.1:0"
store = "sqlite:{}"
leaseMs = 500
[[tokens]]
token = "{TOKEN}"
role = "application"
[tracing]
endpoint = "{phoenix}"
serviceName = "corral-tracing-test"
"#,
            dir.join("corral.db").display()
        ),
    )
    .expect("config");
    path
}

const SCRIPT: &str = "const [a, b] = await Promise.all([tools.t.hit({ n: 1 }), tools.t.hit({ n: 2 })]);\nreturn a.n + b.n;";

fn manifest(webhook: &str) -> Value {
    json!({
        "id": "tracer",
        "model": {"provider": "scripted", "replies": [
            {"toolCalls": [{"name": "run_js", "arguments": {"code": SCRIPT}}]},
            {"text": "the sum is 3"}
        ]},
        "mode": "js",
        "approval": "script",
        "capabilities": [
            {"kind": "webhook", "id": "t.hit", "webhookUrl": webhook,
             "input_schema": {"type": "object", "properties": {"n": {"type": "integer"}}}}
        ]
    })
}

fn attr<'a>(span: &'a Value, key: &str) -> &'a Value {
    &span["attributes"][key]
}

/// An integer attribute (Phoenix may answer it as a JSON number or as text).
fn int(span: &Value, key: &str) -> Option<i64> {
    let value = attr(span, key);
    value
        .as_i64()
        .or_else(|| value.as_str().and_then(|t| t.parse().ok()))
}

/// A boolean attribute (a JSON boolean, or text).
fn flag(span: &Value, key: &str) -> Option<bool> {
    let value = attr(span, key);
    value
        .as_bool()
        .or_else(|| value.as_str().and_then(|t| t.parse().ok()))
}

fn named<'a>(spans: &'a [Value], name: &str) -> Vec<&'a Value> {
    spans.iter().filter(|s| s["name"] == name).collect()
}

#[test]
fn a_turn_is_one_trace_through_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(scenario(dir.path()));
}

async fn scenario(dir: &Path) {
    let mut phoenix = Phoenix::start(dir);
    phoenix.ready(dir).await;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (in_flight, second_call) = mpsc::channel();
    let hook = webhook(Arc::clone(&seen), in_flight);
    let config = write_config(dir, &phoenix.base);
    let stderr = dir.join("serve.stderr");
    let (get, put, post) = (
        reqwest::Method::GET,
        reqwest::Method::PUT,
        reqwest::Method::POST,
    );

    let mut server = Server::start(&config, &stderr);
    let base = server.base.clone();
    call(
        &base,
        put.clone(),
        "/v1/agents/tracer",
        Some(json!({"manifest": manifest(&hook), "implementationVersion": "1"})),
        None,
    )
    .await;
    call(
        &base,
        put.clone(),
        "/v1/sessions/s1",
        Some(json!({"agentId": "tracer", "ownerUserId": "ada"})),
        None,
    )
    .await;
    let client_parent = format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01");
    call(
        &base,
        post.clone(),
        "/v1/sessions/s1/commands",
        Some(json!({"type": "message", "idempotencyKey": "m1", "content": "add them"})),
        Some(&client_parent),
    )
    .await;
    let paused = wait_status(&base, "s1", "paused").await;
    let interaction = paused["waits"][0]["interactionId"].clone();
    call(
        &base,
        post.clone(),
        "/v1/sessions/s1/commands",
        Some(json!({"type": "approve", "idempotencyKey": "a1", "interactionId": interaction, "approved": true})),
        None,
    )
    .await;

    // The second call is in flight (the first answered): SIGKILL, and a new process.
    second_call
        .recv_timeout(Duration::from_secs(30))
        .expect("the script's second call reached the webhook");
    server.child.kill().expect("SIGKILL");
    let _ = server.child.wait();
    let mut server = Server::start(&config, &stderr);
    let base = server.base.clone();
    let uncertain = wait_status(&base, "s1", "uncertain").await;
    let effects = uncertain["uncertainEffects"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        effects.len(),
        1,
        "only the call in flight is uncertain: {uncertain}"
    );
    call(
        &base,
        post.clone(),
        "/v1/sessions/s1/commands",
        Some(json!({"type": "resolve", "idempotencyKey": "r1", "effectId": effects[0]["effectId"], "retry": true})),
        None,
    )
    .await;
    let done = wait_status(&base, "s1", "completed").await;
    let _ = call(&base, get, "/v1/sessions/s1", None, None).await;
    // A clean stop flushes what is queued.
    let _ = Command::new("kill")
        .arg("-TERM")
        .arg(server.child.id().to_string())
        .status();
    let _ = server.child.wait();

    let seen = seen.lock().map(|s| s.clone()).unwrap_or_default();
    let ones: Vec<&Seen> = seen.iter().filter(|s| s.n == 1).collect();
    let twos: Vec<&Seen> = seen.iter().filter(|s| s.n == 2).collect();
    assert_eq!(ones.len(), 1, "the first call ran once: {seen:?} ({done})");
    assert_eq!(twos.len(), 2, "the second call was retried once: {seen:?}");

    // Read the spans back until the last segment's are there.
    let deadline = Instant::now() + Duration::from_secs(30);
    let spans = loop {
        let spans = phoenix.spans().await;
        let finished = spans.iter().any(|s| {
            s["name"] == "invoke_agent tracer" && attr(s, "corral.outcome") == "completed"
        });
        if finished && !named(&spans, "execute_tool t.hit").is_empty() {
            break spans;
        }
        assert!(
            Instant::now() < deadline,
            "Phoenix never got the turn's spans: {spans:#?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    check(&spans, &ones, &twos);
}

fn check(spans: &[Value], ones: &[&Seen], twos: &[&Seen]) {
    let by_id: HashMap<&str, &Value> = spans
        .iter()
        .filter_map(|s| Some((s["spanId"].as_str()?, s)))
        .collect();
    let parent_of = |span: &Value| -> Option<&Value> {
        span["parentSpanId"]
            .as_str()
            .and_then(|id| by_id.get(id).copied())
    };
    let dump = || serde_json::to_string_pretty(spans).unwrap_or_default();

    // The command: the HTTP server span, a child of the client's span.
    let command = spans
        .iter()
        .find(|s| s["traceId"] == CLIENT_TRACE && s["parentSpanId"] == CLIENT_SPAN)
        .unwrap_or_else(|| panic!("no server span under the client's traceparent: {}", dump()));
    assert_eq!(command["name"], "POST", "{command}");
    assert_eq!(attr(command, "http.request.method"), "POST", "{command}");
    assert_eq!(
        int(command, "http.response.status_code"),
        Some(200),
        "{command}"
    );

    // The first run of the turn: in the command's trace, under its span.
    let agents = named(spans, "invoke_agent tracer");
    let first = agents
        .iter()
        .find(|s| s["parentSpanId"] == command["spanId"])
        .unwrap_or_else(|| panic!("no invoke_agent under the command: {}", dump()));
    assert_eq!(first["traceId"], CLIENT_TRACE);
    assert_eq!(attr(first, "gen_ai.operation.name"), "invoke_agent");
    assert_eq!(attr(first, "gen_ai.agent.name"), "tracer");
    assert_eq!(attr(first, "corral.session"), "s1");
    assert_eq!(attr(first, "corral.owner"), "ada");
    assert!(attr(first, "corral.tenant").is_string(), "{first}");
    assert_eq!(attr(first, "corral.outcome"), "suspended", "{first}");
    assert!(
        first["events"]
            .as_array()
            .is_some_and(|e| e.contains(&json!("turn.suspended"))),
        "{first}"
    );
    let first_chat = spans
        .iter()
        .find(|s| s["name"] == "chat scripted" && s["parentSpanId"] == first["spanId"])
        .unwrap_or_else(|| panic!("no chat span in the first run: {}", dump()));
    assert_eq!(attr(first_chat, "gen_ai.provider.name"), "scripted");
    assert_eq!(attr(first_chat, "gen_ai.operation.name"), "chat");
    assert_eq!(flag(first_chat, "corral.replayed"), Some(false));
    assert_eq!(
        attr(first_chat, "gen_ai.response.finish_reasons"),
        "tool_use"
    );

    // The run after the restart: a new trace that names the command's span as its origin.
    let origin = format!(
        "00-{CLIENT_TRACE}-{}-01",
        command["spanId"].as_str().unwrap_or_default()
    );
    let last = agents
        .iter()
        .find(|s| attr(s, "corral.outcome") == "completed")
        .unwrap_or_else(|| panic!("no completed run: {}", dump()));
    assert_ne!(last["traceId"], CLIENT_TRACE, "{last}");
    assert_eq!(flag(last, "corral.resumed"), Some(true), "{last}");
    assert_eq!(attr(last, "corral.trace.origin"), origin.as_str(), "{last}");
    let in_last = |name: &str| -> Vec<&Value> {
        spans
            .iter()
            .filter(|s| s["name"] == name && s["traceId"] == last["traceId"])
            .collect()
    };
    let chats = in_last("chat scripted");
    assert_eq!(chats.len(), 2, "{}", dump());
    assert!(
        chats
            .iter()
            .any(|c| flag(c, "corral.replayed") == Some(true)),
        "the first model call is taken from the journal: {chats:#?}"
    );
    assert!(
        chats
            .iter()
            .any(|c| flag(c, "corral.replayed") == Some(false)
                && attr(c, "gen_ai.response.finish_reasons") == "end_turn"),
        "the second model call is new: {chats:#?}"
    );
    for chat in &chats {
        assert_eq!(chat["parentSpanId"], last["spanId"], "{chat}");
    }
    let scripts = in_last("execute_tool run_js");
    assert_eq!(scripts.len(), 1, "{}", dump());
    let script = scripts[0];
    assert_eq!(script["parentSpanId"], last["spanId"]);
    assert_eq!(attr(script, "gen_ai.tool.name"), "run_js");
    assert!(
        int(script, "corral.fuel").is_some_and(|f| f > 0),
        "{script}"
    );
    assert!(int(script, "corral.wall_us").is_some(), "{script}");
    assert!(
        int(script, "corral.peak_memory_bytes").is_some_and(|m| m > 0),
        "{script}"
    );
    assert_eq!(int(script, "corral.calls"), Some(2), "{script}");
    assert_eq!(flag(script, "corral.replayed"), Some(false), "{script}");

    // Each capability call is a child of the script's span, concurrent or not.
    let calls = in_last("execute_tool t.hit");
    assert_eq!(calls.len(), 2, "{}", dump());
    for call in &calls {
        assert_eq!(call["parentSpanId"], script["spanId"], "{call}");
        assert_eq!(attr(call, "gen_ai.operation.name"), "execute_tool");
        assert_eq!(attr(call, "corral.validation"), "passed");
        assert_eq!(attr(call, "corral.outcome"), "ok", "{call}");
    }
    let of = |effect: &str| {
        calls
            .iter()
            .find(|c| attr(c, "corral.effect_id") == effect)
            .unwrap_or_else(|| panic!("no span for effect {effect}: {calls:#?}"))
    };
    let replayed = of(&ones[0].effect_id);
    assert_eq!(
        flag(replayed, "corral.replayed"),
        Some(true),
        "taken from the journal: {replayed}"
    );
    let retried = of(&twos[1].effect_id);
    assert_eq!(
        flag(retried, "corral.replayed"),
        Some(false),
        "performed again: {retried}"
    );
    assert!(
        retried["events"]
            .as_array()
            .is_some_and(|e| e.contains(&json!("effect.retried"))),
        "{retried}"
    );
    // The webhook joined the trace: its traceparent is the retried call's span.
    let expected = format!(
        "00-{}-{}-01",
        retried["traceId"].as_str().unwrap_or_default(),
        retried["spanId"].as_str().unwrap_or_default()
    );
    assert_eq!(twos[1].traceparent.as_deref(), Some(expected.as_str()));
    assert!(
        ones[0]
            .traceparent
            .as_deref()
            .is_some_and(|t| t.starts_with("00-") && t.len() == 55),
        "{:?}",
        ones[0]
    );
    // The first call was performed once, by the killed process (whose unfinished spans, the
    // run and the script, were never exported): that span says executed.
    let performed = spans
        .iter()
        .find(|s| {
            s["name"] == "execute_tool t.hit"
                && attr(s, "corral.effect_id") == ones[0].effect_id.as_str()
                && s["traceId"] != last["traceId"]
        })
        .unwrap_or_else(|| panic!("no span of the first call's execution: {}", dump()));
    assert_eq!(
        flag(performed, "corral.replayed"),
        Some(false),
        "{performed}"
    );
    assert_eq!(
        ones[0].traceparent.as_deref(),
        Some(
            format!(
                "00-{}-{}-01",
                performed["traceId"].as_str().unwrap_or_default(),
                performed["spanId"].as_str().unwrap_or_default()
            )
            .as_str()
        )
    );
    // The completed run's tree has no orphans.
    for span in spans.iter().filter(|s| s["traceId"] == last["traceId"]) {
        if span["spanId"] != last["spanId"] {
            assert!(parent_of(span).is_some(), "orphan span: {span}");
        }
    }
    // Content capture is off: no script, prompt, completion, input or output in any span.
    let text = dump();
    for secret in [
        "gen_ai.input.messages",
        "gen_ai.output.messages",
        "gen_ai.tool.call.arguments",
        "gen_ai.tool.call.result",
        "Promise.all",
        "add them",
        "the sum is 3",
    ] {
        assert!(!text.contains(secret), "{secret} is in a span: {text}");
    }
}
