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

use std::collections::HashMap;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::{self, Server, free_port};

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

/// The webhook: `n: 1` answers at once; the first `n: 2` tells the test and never answers (the
/// test kills the server with that call in flight once the journal has `n: 1`); a retried `n: 2`
/// answers at once.
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
                    let _ = in_flight.send(());
                    // Never answered: held until the killed server's end closes the connection.
                    let _ = std::io::Read::read(&mut stream, &mut [0u8; 1]);
                    return;
                }
                common::reply_json(&mut stream, &json!({"ok": true, "output": {"n": n}}));
            });
        }
    });
    url
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

impl Server {
    /// A `corral serve` with the variables `env` besides the test's tracing defaults.
    fn traced(config: &Path, stderr: &Path, env: &[(&str, &str)]) -> Server {
        let mut command = common::serve(config);
        command
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            .env_remove("OTEL_SDK_DISABLED")
            .env_remove("OTEL_TRACES_EXPORTER")
            .env_remove("OTEL_SERVICE_NAME")
            .env_remove("CORRAL_TRACE_CONTENT")
            .env("OTEL_BSP_SCHEDULE_DELAY", "100")
            .envs(env.iter().copied());
        Server::spawn(command, stderr)
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

    let mut server = Server::traced(&config, &stderr, &[]);
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

    // The second call is in flight; once the first one's completion is journaled, SIGKILL, and
    // a new process. corral's API records no call's completion before its script ends, so the
    // test reads it from the trace: the first call's span ends (and is exported) only after the
    // journal has its outcome.
    second_call
        .recv_timeout(Duration::from_secs(30))
        .expect("the script's second call reached the webhook");
    first_call_journaled(&phoenix, &seen).await;
    server.child.kill().expect("SIGKILL");
    let _ = server.child.wait();
    let mut server = Server::traced(&config, &stderr, &[]);
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

/// Waits until Phoenix has the span of the `n: 1` call, ended with `corral.outcome = ok`: the
/// runtime ends it after it journaled the call's outcome.
async fn first_call_journaled(phoenix: &Phoenix, seen: &Mutex<Vec<Seen>>) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let effect = seen
            .lock()
            .ok()
            .and_then(|seen| seen.iter().find(|s| s.n == 1).map(|s| s.effect_id.clone()));
        if let Some(effect) = &effect {
            let spans = phoenix.spans().await;
            if spans.iter().any(|s| {
                s["name"] == "execute_tool t.hit"
                    && attr(s, "corral.effect_id") == effect.as_str()
                    && attr(s, "corral.outcome") == "ok"
            }) {
                return;
            }
        }
        assert!(
            Instant::now() < deadline,
            "the first call ({effect:?}) was never recorded as completed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
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
    // Named by its route's template, not the path it was called with.
    assert_eq!(
        command["name"], "POST /v1/sessions/{id}/commands",
        "{command}"
    );
    assert_eq!(
        attr(command, "http.route"),
        "/v1/sessions/{id}/commands",
        "{command}"
    );
    assert_eq!(attr(command, "url.path"), "/v1/sessions/s1/commands");
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

/// An operator's token (an application token of no tenant), for `/metrics`.
const OPERATOR: &str = "trace-operator-metrics-0001";

fn metrics_config(dir: &Path, endpoint: &str) -> PathBuf {
    let path = dir.join("serve.toml");
    std::fs::write(
        &path,
        format!(
            r#"listen = "127.0.0.1:0"
store = "sqlite:{}"
[[tokens]]
token = "{OPERATOR}"
role = "application"
[tracing]
endpoint = "{endpoint}"
"#,
            dir.join("corral.db").display()
        ),
    )
    .expect("config");
    path
}

/// `corral_trace_spans_dropped_total` from `/metrics`.
async fn spans_dropped(client: &reqwest::Client, base: &str) -> u64 {
    let text = client
        .get(format!("{base}/metrics"))
        .bearer_auth(OPERATOR)
        .send()
        .await
        .expect("GET /metrics")
        .text()
        .await
        .expect("metrics text");
    text.lines()
        .find_map(|l| l.strip_prefix("corral_trace_spans_dropped_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no dropped-span counter in /metrics: {text}"))
}

/// `n` `GET /health` requests, `lanes` at a time, each answered 200.
async fn health_requests(client: &reqwest::Client, base: &str, n: usize, lanes: usize) {
    let mut tasks = Vec::new();
    for lane in 0..lanes {
        let (client, base) = (client.clone(), base.to_owned());
        tasks.push(tokio::spawn(async move {
            for _ in (lane..n).step_by(lanes) {
                let response = client
                    .get(format!("{base}/health"))
                    .timeout(Duration::from_secs(10))
                    .send()
                    .await
                    .expect("GET /health");
                assert_eq!(response.status().as_u16(), 200);
            }
        }));
    }
    for task in tasks {
        task.await.expect("requests");
    }
}

/// A collector that is down: the spans of a real server's requests fail to export and are
/// counted in `/metrics`, and the requests are answered all the same.
#[test]
fn spans_an_unreachable_collector_refuses_are_counted() {
    let dir = tempfile::tempdir().expect("tempdir");
    // A port nobody listens on: connections are refused.
    let closed = free_port();
    let config = metrics_config(dir.path(), &format!("http://127.0.0.1:{closed}"));
    let server = Server::traced(
        &config,
        &dir.path().join("serve.stderr"),
        &[("OTEL_BSP_SCHEDULE_DELAY", "50")],
    );
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let client = reqwest::Client::new();
        assert_eq!(spans_dropped(&client, &server.base).await, 0);
        health_requests(&client, &server.base, 20, 1).await;
        // The 20 request spans (and the first /metrics one) are dropped once their export fails.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let dropped = spans_dropped(&client, &server.base).await;
            if dropped >= 21 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "only {dropped} spans were counted as dropped"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
}

/// A collector that accepts connections and never answers holds the exporter: the queue fills
/// up to its bound, every span past it is dropped and counted, and no request waits for it.
#[test]
fn spans_past_a_full_export_queue_are_dropped_and_counted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let hole = TcpListener::bind("127.0.0.1:0").expect("bind");
    let endpoint = format!("http://{}", hole.local_addr().expect("addr"));
    std::thread::spawn(move || {
        // Accepted and kept open, never read or answered.
        let mut held = Vec::new();
        for stream in hole.incoming() {
            held.push(stream);
        }
    });
    let config = metrics_config(dir.path(), &endpoint);
    let server = Server::traced(
        &config,
        &dir.path().join("serve.stderr"),
        &[
            ("OTEL_BSP_SCHEDULE_DELAY", "50"),
            // The first export waits for an answer longer than the test lasts.
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "600000"),
        ],
    );
    // corral_telemetry::MAX_QUEUED_SPANS, and 300 more.
    let queue = 2048;
    let requests = queue + 300;
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let client = reqwest::Client::new();
        let started = Instant::now();
        health_requests(&client, &server.base, requests, 4).await;
        let took = started.elapsed();
        // Every span ended before this request's: none left the queue, so all past its bound
        // were dropped (the /metrics request's own span is counted after its answer).
        let dropped = spans_dropped(&client, &server.base).await;
        assert!(
            dropped >= (requests - queue) as u64 && dropped <= requests as u64,
            "{dropped} spans counted as dropped of {requests}, with a queue of {queue}"
        );
        assert!(
            took < Duration::from_secs(120),
            "the requests waited on the collector: {took:?}"
        );
    });
}

/// Answers `{"ok": true, "output": {"n": n}}` and records each call; the calls `n: 1` and
/// `n: 2` are answered only once both arrived (so they are in flight at once).
fn answering_webhook(seen: Arc<Mutex<Vec<Seen>>>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}/", listener.local_addr().expect("addr"));
    let pair = Arc::new((Mutex::new(0usize), std::sync::Condvar::new()));
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let seen = Arc::clone(&seen);
            let pair = Arc::clone(&pair);
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
                if n == 1 || n == 2 {
                    let (arrived, both) = &*pair;
                    if let Ok(mut count) = arrived.lock() {
                        *count += 1;
                        both.notify_all();
                        // Not a clock for the test: a bound so a broken run fails, not hangs
                        // (the test checks the calls were concurrent).
                        let _ = both.wait_timeout_while(count, Duration::from_secs(30), |c| *c < 2);
                    }
                }
                common::reply_json(&mut stream, &json!({"ok": true, "output": {"n": n}}));
            });
        }
    });
    url
}

/// The MCP test server (`host/mcp/tests/servers/testkit.mjs`) as a declaration named `kit`
/// whose `API_TOKEN` is the secret `KIT_TOKEN`.
fn testkit_server() -> Value {
    let mut server = common::testkit_server(&[]);
    server["env"]["API_TOKEN"] = json!({"secretRef": "KIT_TOKEN"});
    server
}

/// The secret an MCP server is given; redaction must keep it out of every span.
const KIT_SECRET: &str = "kit-secret-value-5521";

/// Runs `corral exec` on `script` with `args`, exporting to `endpoint`, with `env` besides;
/// its report, exit status and how long it took.
fn exec(
    dir: &Path,
    script: &str,
    args: &[&str],
    endpoint: &str,
    env: &[(&str, &str)],
) -> (Value, std::process::ExitStatus, Duration) {
    let path = dir.join("script.js");
    std::fs::write(&path, script).expect("script");
    let started = Instant::now();
    let output = Command::new(env!("CARGO_BIN_EXE_corral"))
        .arg("exec")
        .args(args)
        .arg(&path)
        .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        .env_remove("OTEL_SDK_DISABLED")
        .env_remove("OTEL_TRACES_EXPORTER")
        .env_remove("CORRAL_TRACE_CONTENT")
        .env_remove("TRACEPARENT")
        .env_remove("TRACESTATE")
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
        .env("OTEL_SERVICE_NAME", "corral-exec-test")
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .expect("corral exec runs");
    let took = started.elapsed();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let report = serde_json::from_str(stdout.trim()).unwrap_or_else(|_| {
        panic!(
            "no report: {stdout}\nstderr: {}",
            String::from_utf8_lossy(&output.stderr)
        )
    });
    (report, output.status, took)
}

/// The spans of `trace`, once at least `count` are in Phoenix.
async fn trace_spans(phoenix: &Phoenix, trace: &str, count: usize) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let spans: Vec<Value> = phoenix
            .spans()
            .await
            .into_iter()
            .filter(|s| s["traceId"] == trace)
            .collect();
        if spans.len() >= count {
            return spans;
        }
        assert!(
            Instant::now() < deadline,
            "Phoenix never got {count} spans of trace {trace}: {spans:#?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn text_attr(span: &Value, key: &str) -> String {
    attr(span, key).as_str().unwrap_or_default().to_owned()
}

/// `corral exec` is traced like a turn's script: an `execute_tool run_js` span (a child of the
/// caller's `TRACEPARENT`) with its costs and the limit it hit, one child per capability call
/// even when the calls run concurrently, the webhook's `traceparent` naming its call's span;
/// content only with capture on, redacted, the MCP server's secret never.
#[test]
fn exec_spans_reach_the_collector() {
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(exec_scenario(dir.path()));
}

async fn exec_scenario(dir: &Path) {
    const RUN_TRACE: &str = "5bf92f3577b34da6a3ce929d0e0e4701";
    const LIMIT_TRACE: &str = "5bf92f3577b34da6a3ce929d0e0e4702";
    const CAPTURE_TRACE: &str = "5bf92f3577b34da6a3ce929d0e0e4703";
    const CALLER_SPAN: &str = "10f067aa0ba902b8";
    let parent = |trace: &str| format!("00-{trace}-{CALLER_SPAN}-01");
    let mut phoenix = Phoenix::start(dir);
    phoenix.ready(dir).await;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let hook = answering_webhook(Arc::clone(&seen));
    let catalog = dir.join("catalog.json");
    std::fs::write(
        &catalog,
        json!({"capabilities": [{"id": "t.hit", "input_schema": {"type": "object",
            "properties": {"n": {"type": "integer"}}, "required": ["n"]}}]})
        .to_string(),
    )
    .expect("catalog");
    let catalog = catalog.display().to_string();
    let webhook_args = [
        "--catalog",
        catalog.as_str(),
        "--backend-url",
        hook.as_str(),
    ];

    // Two concurrent webhook calls, capture off.
    let (report, status, _) = exec(
        dir,
        SCRIPT,
        &webhook_args,
        &phoenix.base,
        &[("TRACEPARENT", &parent(RUN_TRACE))],
    );
    assert!(status.success(), "{report}");
    assert_eq!(report["value"], 3, "{report}");
    // A limit.
    let (report, status, _) = exec(
        dir,
        "let i = 0; while (true) { i++; }",
        &["--fuel", "2000000"],
        &phoenix.base,
        &[("TRACEPARENT", &parent(LIMIT_TRACE))],
    );
    assert_eq!(status.code(), Some(1), "{report}");
    assert_eq!(report["error"]["kind"], "fuel_exhausted", "{report}");
    // Capture on, with an MCP server holding a secret.
    let mcp = dir.join("mcp.json");
    std::fs::write(&mcp, json!([testkit_server()]).to_string()).expect("mcp config");
    let mcp = mcp.display().to_string();
    let mut capture_args = webhook_args.to_vec();
    capture_args.extend(["--mcp-config", mcp.as_str()]);
    let capture_script = format!(
        "const token = await tools.kit.env({{name: 'API_TOKEN'}});\n\
         const echoed = await tools.kit.echo({{text: 'say {KIT_SECRET}'}});\n\
         const hit = await tools.t.hit({{n: 5}});\n\
         return {{token, echoed, hit}};"
    );
    let (report, status, _) = exec(
        dir,
        &capture_script,
        &capture_args,
        &phoenix.base,
        &[
            ("TRACEPARENT", &parent(CAPTURE_TRACE)),
            ("CORRAL_TRACE_CONTENT", "true"),
            ("CORRAL_SECRET_KIT_TOKEN", KIT_SECRET),
        ],
    );
    assert!(status.success(), "{report}");
    assert_eq!(report["value"]["hit"]["n"], 5, "{report}");

    let seen = seen.lock().map(|s| s.clone()).unwrap_or_default();

    // The script and its two concurrent calls.
    let spans = trace_spans(&phoenix, RUN_TRACE, 3).await;
    let dump = serde_json::to_string_pretty(&spans).unwrap_or_default();
    let scripts = named(&spans, "execute_tool run_js");
    assert_eq!(scripts.len(), 1, "{dump}");
    let script = scripts[0];
    assert_eq!(
        script["parentSpanId"], CALLER_SPAN,
        "the caller's TRACEPARENT: {script}"
    );
    assert_eq!(attr(script, "gen_ai.operation.name"), "execute_tool");
    assert_eq!(attr(script, "gen_ai.tool.name"), "run_js");
    assert!(
        int(script, "corral.fuel").is_some_and(|f| f > 0),
        "{script}"
    );
    assert!(
        int(script, "corral.wall_us").is_some_and(|w| w > 0),
        "{script}"
    );
    assert!(
        int(script, "corral.peak_memory_bytes").is_some_and(|m| m > 0),
        "{script}"
    );
    assert_eq!(int(script, "corral.calls"), Some(2), "{script}");
    assert_eq!(
        int(script, "corral.peak_concurrent_calls"),
        Some(2),
        "{script}"
    );
    assert_eq!(flag(script, "corral.replayed"), Some(false), "{script}");
    assert_eq!(flag(script, "corral.is_error"), Some(false), "{script}");
    assert!(attr(script, "corral.limit").is_null(), "{script}");
    let calls = named(&spans, "execute_tool t.hit");
    assert_eq!(calls.len(), 2, "{dump}");
    for call in &calls {
        assert_eq!(call["parentSpanId"], script["spanId"], "{call}");
        assert_eq!(attr(call, "gen_ai.tool.name"), "t.hit");
        assert_eq!(attr(call, "corral.validation"), "passed");
        assert_eq!(attr(call, "corral.outcome"), "ok", "{call}");
        assert!(int(call, "corral.wall_us").is_some(), "{call}");
        // The webhook got this call's span as its trace context.
        let id = text_attr(call, "gen_ai.tool.call.id");
        let hit = seen
            .iter()
            .find(|s| s.effect_id == id)
            .unwrap_or_else(|| panic!("the webhook never saw call {id}: {seen:?}"));
        let expected = format!(
            "00-{RUN_TRACE}-{}-01",
            call["spanId"].as_str().unwrap_or_default()
        );
        assert_eq!(
            hit.traceparent.as_deref(),
            Some(expected.as_str()),
            "{hit:?}"
        );
    }
    for secret in [
        "gen_ai.tool.call.arguments",
        "gen_ai.tool.call.result",
        "Promise.all",
    ] {
        assert!(
            !dump.contains(secret),
            "{secret} is in a span with capture off: {dump}"
        );
    }

    // The limit the script hit.
    let spans = trace_spans(&phoenix, LIMIT_TRACE, 1).await;
    let limited = named(&spans, "execute_tool run_js");
    assert_eq!(limited.len(), 1, "{spans:#?}");
    assert_eq!(attr(limited[0], "corral.limit"), "fuel_exhausted");
    assert_eq!(attr(limited[0], "error.type"), "fuel_exhausted");
    assert_eq!(flag(limited[0], "corral.is_error"), Some(true));
    assert!(
        int(limited[0], "corral.fuel").is_some_and(|f| f > 1_000_000),
        "{}",
        limited[0]
    );

    // Content, redacted: the secret never, in the script, an input or an output.
    let spans = trace_spans(&phoenix, CAPTURE_TRACE, 4).await;
    let dump = serde_json::to_string_pretty(&spans).unwrap_or_default();
    assert!(
        !dump.contains(KIT_SECRET),
        "the secret is in a span: {dump}"
    );
    let one = |name: &str| -> &Value {
        spans
            .iter()
            .find(|s| s["name"] == name)
            .unwrap_or_else(|| panic!("no span {name}: {dump}"))
    };
    let script = one("execute_tool run_js");
    let code = text_attr(script, "gen_ai.tool.call.arguments");
    assert!(
        code.contains("tools.kit.echo") && code.contains("say [REDACTED]"),
        "{script}"
    );
    assert!(
        text_attr(script, "gen_ai.tool.call.result").contains("\"ok\":true"),
        "{script}"
    );
    let env = one("execute_tool kit.env");
    assert_eq!(env["parentSpanId"], script["spanId"]);
    assert!(
        text_attr(env, "gen_ai.tool.call.arguments").contains("API_TOKEN"),
        "{env}"
    );
    assert!(
        text_attr(env, "gen_ai.tool.call.result").contains("[REDACTED]"),
        "the server's answer is the secret, redacted: {env}"
    );
    let echo = one("execute_tool kit.echo");
    assert!(
        text_attr(echo, "gen_ai.tool.call.arguments").contains("say [REDACTED]"),
        "{echo}"
    );
    assert!(
        text_attr(echo, "gen_ai.tool.call.result").contains("say [REDACTED]"),
        "{echo}"
    );
    let hit = one("execute_tool t.hit");
    assert!(
        text_attr(hit, "gen_ai.tool.call.arguments").contains("\"n\":5"),
        "{hit}"
    );
    assert_eq!(
        text_attr(hit, "gen_ai.tool.call.result"),
        r#"{"n":5}"#,
        "{hit}"
    );
}

/// A collector that never answers costs `corral exec` its flush bound at most: the report is
/// printed, and the process ends well before the export's own timeout.
#[test]
fn exec_waits_for_a_silent_collector_only_within_its_bound() {
    let dir = tempfile::tempdir().expect("tempdir");
    let hole = TcpListener::bind("127.0.0.1:0").expect("bind");
    let endpoint = format!("http://{}", hole.local_addr().expect("addr"));
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in hole.incoming() {
            held.push(stream);
        }
    });
    let (report, status, took) = exec(
        dir.path(),
        "return await tools.examples.echo({ n: 1 });",
        &[],
        &endpoint,
        &[("OTEL_EXPORTER_OTLP_TIMEOUT", "600000")],
    );
    assert!(status.success(), "{report}");
    assert_eq!(report["value"]["n"], 1, "{report}");
    // The flush bound is 5 s; the export alone would wait 600.
    assert!(took < Duration::from_secs(30), "corral exec took {took:?}");
}

/// Content capture on in `corral serve`'s configuration: a turn's prompt, completion, script
/// and tool inputs and outputs are in its spans, redacted as events are (an MCP server's
/// secret never appears), and no token (the API's, the webhook signing secret) ever does.
#[test]
fn captured_content_is_redacted_and_tokens_never_recorded() {
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(capture_scenario(dir.path()));
}

async fn capture_scenario(dir: &Path) {
    const TRACE: &str = "6bf92f3577b34da6a3ce929d0e0e4799";
    const SIGNING: &str = "webhook-signing-secret-0042";
    let mut phoenix = Phoenix::start(dir);
    phoenix.ready(dir).await;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let hook = answering_webhook(Arc::clone(&seen));
    let config = dir.join("serve.toml");
    std::fs::write(
        &config,
        format!(
            r#"listen = "127.0.0.1:0"
store = "sqlite:{}"
webhookSecret = "{SIGNING}"
[[tokens]]
token = "{TOKEN}"
role = "application"
[tracing]
endpoint = "{}"
captureContent = true
"#,
            dir.join("corral.db").display(),
            phoenix.base
        ),
    )
    .expect("config");
    let server = Server::traced(
        &config,
        &dir.join("serve.stderr"),
        &[("CORRAL_SECRET_KIT_TOKEN", KIT_SECRET)],
    );
    let code = format!(
        "const token = await tools.kit.env({{name: 'API_TOKEN'}});\n\
         const echoed = await tools.kit.echo({{text: 'say {KIT_SECRET}'}});\n\
         const hit = await tools.t.hit({{n: 7}});\n\
         return {{token, echoed, hit}};"
    );
    let manifest = json!({
        "id": "capture",
        "model": {"provider": "scripted", "replies": [
            {"toolCalls": [{"name": "run_js", "arguments": {"code": code}}]},
            {"text": format!("the answer mentions {KIT_SECRET}")}
        ]},
        "mode": "js",
        "autoConfirm": true,
        "capabilities": [
            {"kind": "webhook", "id": "t.hit", "webhookUrl": hook,
             "input_schema": {"type": "object", "properties": {"n": {"type": "integer"}}}}
        ],
        "mcpServers": [testkit_server()]
    });
    let base = server.base.clone();
    call(
        &base,
        reqwest::Method::PUT,
        "/v1/agents/capture",
        Some(json!({"manifest": manifest, "implementationVersion": "1"})),
        None,
    )
    .await;
    call(
        &base,
        reqwest::Method::PUT,
        "/v1/sessions/c1",
        Some(json!({"agentId": "capture", "ownerUserId": "ada"})),
        None,
    )
    .await;
    call(
        &base,
        reqwest::Method::POST,
        "/v1/sessions/c1/commands",
        Some(json!({"type": "message", "idempotencyKey": "m1",
                    "content": format!("please use {KIT_SECRET}")})),
        Some(&format!("00-{TRACE}-{CLIENT_SPAN}-01")),
    )
    .await;
    wait_status(&base, "c1", "completed").await;
    let seen = seen.lock().map(|s| s.clone()).unwrap_or_default();
    assert_eq!(seen.len(), 1, "{seen:?}");

    // The command, the run, two model calls, the script and its three calls.
    let deadline = Instant::now() + Duration::from_secs(30);
    let spans = loop {
        let spans = trace_spans(&phoenix, TRACE, 1).await;
        let done = spans.iter().any(|s| {
            s["name"] == "invoke_agent capture" && attr(s, "corral.outcome") == "completed"
        });
        if done && spans.len() >= 8 {
            break spans;
        }
        assert!(
            Instant::now() < deadline,
            "Phoenix never got the turn: {spans:#?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let dump = serde_json::to_string_pretty(&spans).unwrap_or_default();
    for secret in [KIT_SECRET, TOKEN, SIGNING] {
        assert!(!dump.contains(secret), "{secret} is in a span: {dump}");
    }
    let one = |name: &str| -> &Value {
        spans
            .iter()
            .find(|s| s["name"] == name)
            .unwrap_or_else(|| panic!("no span {name}: {dump}"))
    };
    let chats = named(&spans, "chat scripted");
    assert_eq!(chats.len(), 2, "{dump}");
    assert!(
        chats
            .iter()
            .all(|c| text_attr(c, "gen_ai.input.messages").contains("please use [REDACTED]")),
        "the prompt, redacted: {chats:#?}"
    );
    assert!(
        chats
            .iter()
            .any(|c| text_attr(c, "gen_ai.output.messages")
                .contains("the answer mentions [REDACTED]")),
        "the completion, redacted: {chats:#?}"
    );
    let script = one("execute_tool run_js");
    assert!(
        text_attr(script, "gen_ai.tool.call.arguments").contains("say [REDACTED]"),
        "the script, redacted: {script}"
    );
    assert!(
        !text_attr(script, "gen_ai.tool.call.result").is_empty(),
        "{script}"
    );
    let env = one("execute_tool kit.env");
    assert_eq!(env["parentSpanId"], script["spanId"]);
    assert!(
        text_attr(env, "gen_ai.tool.call.result").contains("[REDACTED]"),
        "the server's answer is the secret, redacted: {env}"
    );
    let echo = one("execute_tool kit.echo");
    assert!(
        text_attr(echo, "gen_ai.tool.call.arguments").contains("say [REDACTED]"),
        "{echo}"
    );
    assert!(
        text_attr(echo, "gen_ai.tool.call.result").contains("say [REDACTED]"),
        "{echo}"
    );
    let hit = one("execute_tool t.hit");
    assert!(
        text_attr(hit, "gen_ai.tool.call.arguments").contains("\"n\":7"),
        "{hit}"
    );
    assert!(
        text_attr(hit, "gen_ai.tool.call.result").contains("\"n\":7"),
        "{hit}"
    );
}
