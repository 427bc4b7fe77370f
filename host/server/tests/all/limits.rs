//! Hostile clients over real sockets: slow headers, idle connections, the connection cap, the
//! event streams a token may hold, and a tenant's command rate (host/server/src/limits.rs).
//!
//! Every test asserts outcomes (closed, refused, 429), never how long something took; the
//! overall bounds only keep a broken server from hanging the suite.

use std::time::Duration;

use crate::common::{ACME, BETA, EXECUTOR, Harness, OPERATOR, Options, assert_error};
use corral_server::limits::{CommandRate, Limits};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

/// A bound on waits that only a broken server reaches.
const PATIENCE: Duration = Duration::from_secs(60);

fn address(h: &Harness) -> String {
    h.base.trim_start_matches("http://").to_owned()
}

/// Reads until the server closes the connection (EOF or reset); what it sent.
async fn read_until_closed(stream: &mut TcpStream) -> Vec<u8> {
    let mut seen = Vec::new();
    let mut buffer = [0u8; 4096];
    loop {
        match stream.read(&mut buffer).await {
            Ok(0) | Err(_) => return seen,
            Ok(n) => seen.extend_from_slice(&buffer[..n]),
        }
    }
}

fn limits(change: impl FnOnce(&mut Limits)) -> Limits {
    let mut limits = Limits::default();
    change(&mut limits);
    limits
}

#[tokio::test(flavor = "multi_thread")]
async fn a_slow_header_flood_is_cut_off_while_normal_requests_are_served() {
    let h = Harness::start_with(Options {
        limits: limits(|l| l.header_read_timeout = Duration::from_millis(1500)),
        ..Options::default()
    })
    .await;
    let address = address(&h);
    let (closed_tx, mut closed_rx) = tokio::sync::mpsc::channel::<Vec<u8>>(256);
    const FLOOD: usize = 200;
    let mut opened = 0;
    for n in 0..FLOOD {
        let mut stream = TcpStream::connect(&address).await.expect("connect");
        stream
            .write_all(b"GET /health HTTP/1.1\r\nHost: corral\r\n")
            .await
            .expect("request line");
        opened += 1;
        let closed = closed_tx.clone();
        tokio::spawn(async move {
            // One more header every 300 ms, never the blank line that ends the head.
            let (mut reader, mut writer) = stream.into_split();
            let trickle = async move {
                for i in 0u64.. {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    let header = format!("X-Slow-{n}-{i}: a\r\n");
                    if writer.write_all(header.as_bytes()).await.is_err() {
                        return;
                    }
                }
            };
            let mut seen = Vec::new();
            let watch = async {
                let mut buffer = [0u8; 1024];
                loop {
                    match reader.read(&mut buffer).await {
                        Ok(0) | Err(_) => return,
                        Ok(k) => seen.extend_from_slice(&buffer[..k]),
                    }
                }
            };
            tokio::select! {
                () = watch => {}
                () = trickle => {}
            }
            let _ = closed.send(seen).await;
        });
    }
    drop(closed_tx);
    assert_eq!(opened, FLOOD);
    // While the flood holds its connections, a normal request is served.
    let (status, body) = h.call("GET", "/health", None, None).await;
    assert_eq!(status, 200, "{body}");
    let mut closed = 0;
    tokio::time::timeout(PATIENCE, async {
        while let Some(seen) = closed_rx.recv().await {
            // Cut off, not answered: the head never completed.
            assert!(seen.is_empty(), "{}", String::from_utf8_lossy(&seen));
            closed += 1;
        }
    })
    .await
    .expect("every slow-header connection is closed");
    assert_eq!(closed, FLOOD);
    let text = h.metrics().await;
    let timed_out = text
        .lines()
        .find_map(|l| l.strip_prefix("corral_connections_timed_out_total{reason=\"header_read\"} "))
        .and_then(|n| n.parse::<usize>().ok())
        .expect("metric");
    assert!(timed_out >= FLOOD, "{text}");
    let (status, _) = h.call("GET", "/health", None, None).await;
    assert_eq!(status, 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn idle_connections_are_closed_but_open_streams_are_not() {
    let h = Harness::start_with(Options {
        keep_alive: Duration::from_millis(200),
        limits: limits(|l| l.idle_timeout = Duration::from_millis(1000)),
        ..Options::default()
    })
    .await;
    h.register_agent().await;
    h.session("s1", OPERATOR).await;
    let address = address(&h);
    // A stream held longer than the idle timeout: a request in flight is never idle.
    let mut stream = TcpStream::connect(&address).await.expect("connect");
    stream
        .write_all(
            format!(
                "GET /v1/sessions/s1/events HTTP/1.1\r\nHost: corral\r\n\
                 Authorization: Bearer {OPERATOR}\r\n\r\n"
            )
            .as_bytes(),
        )
        .await
        .expect("stream request");
    let mut buffer = [0u8; 4096];
    let n = stream.read(&mut buffer).await.expect("stream head");
    assert!(String::from_utf8_lossy(&buffer[..n]).starts_with("HTTP/1.1 200"));
    // A connection that never sends anything.
    let mut silent = TcpStream::connect(&address).await.expect("connect");
    // A kept-alive connection after its one request.
    let mut kept = TcpStream::connect(&address).await.expect("connect");
    kept.write_all(b"GET /health HTTP/1.1\r\nHost: corral\r\n\r\n")
        .await
        .expect("request");
    let n = kept.read(&mut buffer).await.expect("response");
    let answer = String::from_utf8_lossy(&buffer[..n]).to_string();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(!answer.to_ascii_lowercase().contains("connection: close"));
    tokio::time::timeout(PATIENCE, async {
        assert!(read_until_closed(&mut silent).await.is_empty());
        assert!(read_until_closed(&mut kept).await.is_empty());
    })
    .await
    .expect("idle connections are closed");
    // The stream outlived both, and still gets its keep-alive comments.
    let mut more = Vec::new();
    tokio::time::timeout(PATIENCE, async {
        while !String::from_utf8_lossy(&more).contains("keep-alive") {
            let n = stream.read(&mut buffer).await.expect("stream alive");
            assert!(n > 0, "the stream was closed");
            more.extend_from_slice(&buffer[..n]);
        }
    })
    .await
    .expect("keep-alive comment");
    let text = h.metrics().await;
    assert!(
        text.contains("corral_connections_timed_out_total{reason=\"idle\"} "),
        "{text}"
    );
    assert!(
        !text.contains("corral_connections_timed_out_total{reason=\"idle\"} 0\n"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn connections_over_the_cap_get_503_and_are_closed() {
    const CAP: usize = 5;
    let h = Harness::start_with(Options {
        limits: limits(|l| l.max_connections = CAP),
        ..Options::default()
    })
    .await;
    let address = address(&h);
    let mut held = Vec::new();
    for _ in 0..CAP {
        let mut stream = TcpStream::connect(&address).await.expect("connect");
        // A completed request proves the server has taken the connection (and its slot).
        stream
            .write_all(b"GET /health HTTP/1.1\r\nHost: corral\r\n\r\n")
            .await
            .expect("request");
        let mut buffer = [0u8; 1024];
        let n = stream.read(&mut buffer).await.expect("answer");
        assert!(String::from_utf8_lossy(&buffer[..n]).starts_with("HTTP/1.1 200"));
        held.push(stream);
    }
    let mut extra = TcpStream::connect(&address).await.expect("connect");
    let answer = tokio::time::timeout(PATIENCE, read_until_closed(&mut extra))
        .await
        .expect("answered and closed");
    let answer = String::from_utf8_lossy(&answer).to_string();
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    let lower = answer.to_ascii_lowercase();
    assert!(lower.contains("retry-after: 1"), "{answer}");
    assert!(lower.contains("x-request-id: "), "{answer}");
    let body: Value = serde_json::from_str(answer.split("\r\n\r\n").nth(1).unwrap_or(""))
        .expect("a JSON error body");
    assert_error(503, &body, 503, "overloaded");
    // A slot freed is a slot for the next client.
    drop(held.pop());
    let served = tokio::time::timeout(PATIENCE, async {
        loop {
            let mut stream = TcpStream::connect(&address).await.expect("connect");
            let _ = stream
                .write_all(b"GET /health HTTP/1.1\r\nHost: corral\r\nConnection: close\r\n\r\n")
                .await;
            let answer = read_until_closed(&mut stream).await;
            if answer.starts_with(b"HTTP/1.1 200") {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(served.is_ok(), "a freed slot was never reused");
    drop(held);
}

/// Opens a stream and returns its response (kept open while held), or the refusal.
async fn open_stream(
    h: &Harness,
    path: &str,
    token: &str,
) -> Result<reqwest::Response, (u16, Value)> {
    let response = reqwest::Client::new()
        .get(format!("{}{path}", h.base))
        .bearer_auth(token)
        .send()
        .await
        .expect("send");
    let status = response.status().as_u16();
    if status == 200 {
        return Ok(response);
    }
    let text = response.text().await.expect("body");
    Err((
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    ))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_token_holds_at_most_its_event_streams() {
    let h = Harness::start_with(Options {
        keep_alive: Duration::from_millis(100),
        limits: limits(|l| l.sse_streams_per_token = 2),
        ..Options::default()
    })
    .await;
    h.register_agent().await;
    for id in ["a1", "a2", "a3"] {
        h.session(id, ACME).await;
    }
    h.session("b1", BETA).await;
    let first = open_stream(&h, "/v1/sessions/a1/events", ACME)
        .await
        .expect("first");
    let second = open_stream(&h, "/v1/sessions/a2/events", ACME)
        .await
        .expect("second");
    let (status, body) = open_stream(&h, "/v1/sessions/a3/events", ACME)
        .await
        .expect_err("over the cap");
    assert_error(status, &body, 429, "too_many_requests");
    assert!(
        body["message"]
            .as_str()
            .unwrap_or("")
            .contains("sseStreamsPerToken")
    );
    // Documented: the same refusal through the contract-checking client.
    let (status, _) = h
        .request("GET", "/v1/sessions/a3/events", Some(ACME), None)
        .await;
    assert_eq!(status, 429);
    // Another token is not affected.
    let beta = open_stream(&h, "/v1/sessions/b1/events", BETA)
        .await
        .expect("beta");
    // Executors' work streams count the same way.
    let w1 = open_stream(&h, "/v1/executors/connect", EXECUTOR)
        .await
        .expect("w1");
    let w2 = open_stream(&h, "/v1/executors/connect", EXECUTOR)
        .await
        .expect("w2");
    let (status, body) = open_stream(&h, "/v1/executors/connect", EXECUTOR)
        .await
        .expect_err("over the cap");
    assert_error(status, &body, 429, "too_many_requests");
    // A closed stream frees its slot (noticed when the server next writes to it).
    drop(first);
    let reopened = tokio::time::timeout(PATIENCE, async {
        loop {
            match open_stream(&h, "/v1/sessions/a3/events", ACME).await {
                Ok(stream) => return stream,
                Err((429, _)) => tokio::time::sleep(Duration::from_millis(50)).await,
                Err(other) => panic!("{other:?}"),
            }
        }
    })
    .await
    .expect("the slot is freed");
    let text = h.metrics().await;
    assert!(
        text.contains("corral_rate_limited_total{limit=\"sse_streams\",tenant=\"\"} "),
        "{text}"
    );
    drop((second, reopened, beta, w1, w2));
}

/// Sends a command with a raw client: status, `Retry-After`, body.
async fn command(h: &Harness, path: &str, token: &str, body: &Value) -> (u16, Option<u64>, Value) {
    let response = reqwest::Client::new()
        .post(format!("{}{path}", h.base))
        .bearer_auth(token)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .expect("send");
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    let text = response.text().await.expect("body");
    (
        status,
        retry_after,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tenant_flooding_commands_gets_429_while_another_tenant_carries_on() {
    const BURST: u32 = 3;
    let h = Harness::start_with(Options {
        // One command per 100 s after the burst: nothing refills during the test.
        limits: limits(|l| {
            l.commands = CommandRate::new(0.01, BURST);
            l.tenant_commands
                .insert("beta".to_owned(), CommandRate::new(0.01, 100));
        }),
        ..Options::default()
    })
    .await;
    h.register_agent().await;
    h.session("a1", ACME).await;
    h.session("b1", BETA).await;
    h.session("d1", OPERATOR).await;
    let mut outcomes = Vec::new();
    for i in 0..10 {
        let body = json!({"type": "message", "idempotencyKey": format!("k{i}"), "content": "hi"});
        outcomes.push(command(&h, "/v1/sessions/a1/commands", ACME, &body).await);
    }
    for (i, (status, retry_after, body)) in outcomes.iter().enumerate() {
        if i < BURST as usize {
            assert_ne!(*status, 429, "command {i} is within the burst: {body}");
        } else {
            assert_error(*status, body, 429, "too_many_requests");
            // The bucket refills one command per 100 s: the wait is said in whole seconds.
            let wait = retry_after.expect("Retry-After");
            assert!((1..=100).contains(&wait), "{wait}");
            assert!(wait > 50, "{wait}");
        }
    }
    // The contract-checking client sees the documented 429 too.
    let (status, _) = h
        .command(
            "a1",
            ACME,
            json!({"type": "cancel", "idempotencyKey": "c1"}),
        )
        .await;
    assert_eq!(status, 429);
    // An operator addressing acme draws from acme's bucket...
    let (status, _, body) = command(
        &h,
        "/v1/sessions/a1/commands?tenantId=acme",
        OPERATOR,
        &json!({"type": "cancel", "idempotencyKey": "c2"}),
    )
    .await;
    assert_error(status, &body, 429, "too_many_requests");
    // ...and from the default tenant's own bucket otherwise.
    h.message("d1", "m1", "hi").await;
    // Another tenant (with a larger burst of its own) is not affected: its turn runs.
    for i in 0..10 {
        let (status, _, body) = command(
            &h,
            "/v1/sessions/b1/commands",
            BETA,
            &json!({"type": "cancel", "idempotencyKey": format!("bc{i}")}),
        )
        .await;
        assert_ne!(status, 429, "{body}");
    }
    let (status, _, body) = command(
        &h,
        "/v1/sessions/b1/commands",
        BETA,
        &json!({"type": "message", "idempotencyKey": "bm", "content": "hi"}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let view = h.ok("GET", "/v1/sessions/b1", BETA, None).await;
    assert_eq!(view["id"], "b1");
    tokio::time::timeout(PATIENCE, async {
        loop {
            let view = h.ok("GET", "/v1/sessions/b1", BETA, None).await;
            if view["status"] == "completed" || view["status"] == "idle" {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("beta's turn completes");
    // Executors report work the server asked for: never throttled.
    for i in 0..(BURST + 3) {
        let (status, _, body) = command(
            &h,
            "/v1/sessions/a1/commands",
            EXECUTOR,
            &json!({"type": "action_result", "idempotencyKey": format!("x{i}"),
                "actionId": "no-such-action", "claimId": "c", "generation": 1,
                "outcome": {"value": 1}}),
        )
        .await;
        assert_ne!(status, 429, "{body}");
    }
    let text = h.metrics().await;
    assert!(
        text.contains("corral_rate_limited_total{limit=\"commands\",tenant=\"acme\"} 9\n"),
        "{text}"
    );
    assert!(
        !text.contains("corral_rate_limited_total{limit=\"commands\",tenant=\"beta\"}"),
        "{text}"
    );
}
