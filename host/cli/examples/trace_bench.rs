//! What tracing costs a turn, as `bench/REPORT.md` shows it (figures, not timed tests).
//!
//! Two real `corral serve` processes on the embedded store, the chat runtime on the scripted
//! model: one with tracing off, one exporting every span over OTLP/HTTP to a local receiver (a
//! sink in this process that accepts each export and answers `200`, so the collector's own
//! cost is not measured, only corral's). A turn is a fresh session's `message` command up to
//! its `turn.completed` event on the session's SSE stream: two model calls and a `run_js` of two
//! concurrent capability calls (auto-approved), so one HTTP server span, `invoke_agent`, two
//! `chat`, `execute_tool run_js` and two `execute_tool` calls per turn. Turns alternate between
//! the two servers, so the machine's noise falls on both. Prints one JSON line: p50/p99 of each,
//! each server's CPU time per turn (a turn's latency is mostly waiting, not work), the ratios
//! on ÷ off, what the receiver got and the spans the server dropped.
//!
//! `trace_bench --quick` runs a handful of turns (the suite's smoke run).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use eventsource_stream::Eventsource as _;
use futures::StreamExt as _;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

// The binary's tests' helpers: reading the address a child `corral serve` prints.
#[path = "../tests/common/mod.rs"]
mod common;
mod support;

use support::Server;

/// An operator's token (an application token of no tenant: `/metrics` too).
const TOKEN: &str = "bench-trace-token-0001";

impl Server {
    /// A server exporting its spans to `endpoint`, or with tracing off.
    fn start_tracing(endpoint: Option<&str>) -> anyhow::Result<Server> {
        let tracing = endpoint
            .map(|e| format!("[tracing]\nendpoint = \"{e}\"\n"))
            .unwrap_or_default();
        let config = format!(
            "listen = \"127.0.0.1:0\"\nstore = \"sqlite:{{folder}}/corral.db\"\n\
             [[tokens]]\ntoken = \"{TOKEN}\"\nrole = \"application\"\n\
             [limits]\ncommandsPerSecond = 1000000\ncommandBurst = 1000000\n{tracing}"
        );
        let clear = [
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "OTEL_SDK_DISABLED",
            "OTEL_TRACES_EXPORTER",
            "OTEL_BSP_SCHEDULE_DELAY",
            "CORRAL_TRACE_CONTENT",
        ];
        Server::start(&config, TOKEN, reqwest::Client::new(), &clear)
    }

    /// CPU time the server process has used (user and system, all its threads, the exporter's
    /// included), in milliseconds; 0 where `/proc` is not there.
    fn cpu_ms(&self) -> f64 {
        let stat =
            std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).unwrap_or_default();
        // The fields after the command's `(name)`: utime and stime are the 12th and 13th.
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .map(|(_, rest)| rest.split_whitespace().collect())
            .unwrap_or_default();
        let ticks = |i: usize| {
            fields
                .get(i)
                .and_then(|f| f.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        // USER_HZ is 100 on Linux.
        (ticks(11) + ticks(12)) * 10.0
    }

    /// `corral_trace_spans_dropped_total`.
    async fn spans_dropped(&self) -> u64 {
        let text = self
            .client
            .get(format!("{}/metrics", self.base))
            .bearer_auth(TOKEN)
            .send()
            .await
            .expect("GET /metrics")
            .text()
            .await
            .unwrap_or_default();
        text.lines()
            .find_map(|l| l.strip_prefix("corral_trace_spans_dropped_total "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }

    /// One turn on a fresh session: from sending the message to `turn.completed` on its
    /// stream.
    async fn turn(&self, session: &str) -> Duration {
        self.call(
            reqwest::Method::PUT,
            &format!("/v1/sessions/{session}"),
            Some(json!({"agentId": "traced", "ownerUserId": "bench"})),
        )
        .await;
        let response = self
            .client
            .get(format!(
                "{}/v1/sessions/{session}/events?cursor=0",
                self.base
            ))
            .bearer_auth(TOKEN)
            .send()
            .await
            .expect("open the event stream");
        let mut events = Box::pin(response.bytes_stream().eventsource());
        let started = Instant::now();
        self.call(
            reqwest::Method::POST,
            &format!("/v1/sessions/{session}/commands"),
            Some(json!({"type": "message", "idempotencyKey": "m", "content": "go"})),
        )
        .await;
        loop {
            match tokio::time::timeout(Duration::from_secs(30), events.next()).await {
                Ok(Some(Ok(event))) if event.event == "turn.completed" => break,
                Ok(Some(Ok(event))) if event.event == "turn.failed" => {
                    panic!("the turn failed: {}", event.data)
                }
                Ok(Some(Ok(_))) => {}
                other => panic!("the stream ended or stalled: {other:?}"),
            }
        }
        started.elapsed()
    }
}

fn agent() -> Value {
    json!({
        "id": "traced",
        "model": {"provider": "scripted", "replies": [
            {"toolCalls": [{"name": "run_js", "arguments": {"code":
                "const [a, b] = await Promise.all([tools.examples.echo({ n: 1 }), tools.examples.echo({ n: 2 })]);\nreturn a.n + b.n;"}}]},
            {"text": "the sum is 3"}
        ]},
        "mode": "js",
        "autoConfirm": true,
        "capabilities": [{"kind": "builtin", "id": "examples.echo"}]
    })
}

/// What the receiver got.
#[derive(Default)]
struct Received {
    exports: AtomicU64,
    bytes: AtomicU64,
}

/// An OTLP/HTTP receiver that takes every export and answers `200` with an empty
/// `ExportTraceServiceResponse`; its base URL.
async fn sink(received: Arc<Received>) -> anyhow::Result<String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let received = Arc::clone(&received);
            tokio::spawn(async move {
                let mut buffer = Vec::new();
                let mut chunk = [0u8; 16384];
                loop {
                    // One request: its head, then content-length bytes of body.
                    let (end, length) = loop {
                        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                            let head = String::from_utf8_lossy(&buffer[..end]).to_lowercase();
                            let length = head
                                .lines()
                                .find_map(|l| l.strip_prefix("content-length:"))
                                .and_then(|v| v.trim().parse::<usize>().ok())
                                .unwrap_or(0);
                            break (end + 4, length);
                        }
                        match stream.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buffer.extend_from_slice(&chunk[..n]),
                        }
                    };
                    while buffer.len() < end + length {
                        match stream.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buffer.extend_from_slice(&chunk[..n]),
                        }
                    }
                    buffer.drain(..end + length);
                    received.exports.fetch_add(1, Ordering::Relaxed);
                    received.bytes.fetch_add(length as u64, Ordering::Relaxed);
                    let reply = b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n";
                    if stream.write_all(reply).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    Ok(base)
}

fn percentile(samples: &mut [f64], p: f64) -> f64 {
    if samples.is_empty() {
        return 0.0;
    }
    samples.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * samples.len() as f64).ceil() as usize;
    samples[rank.clamp(1, samples.len()) - 1]
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let quick = std::env::args().any(|a| a == "--quick");
    let (warmup, turns) = if quick { (2, 10) } else { (20, 300) };
    let received = Arc::new(Received::default());
    let endpoint = sink(Arc::clone(&received)).await?;
    let off = Server::start_tracing(None)?;
    let on = Server::start_tracing(Some(&endpoint))?;
    for server in [&off, &on] {
        server
            .call(
                reqwest::Method::PUT,
                "/v1/agents/traced",
                Some(json!({"manifest": agent(), "implementationVersion": "1"})),
            )
            .await;
    }
    let (mut off_ms, mut on_ms) = (Vec::new(), Vec::new());
    let mut cpu = [0.0f64; 2];
    for i in 0..warmup + turns {
        if i == warmup {
            cpu = [off.cpu_ms(), on.cpu_ms()];
        }
        // Alternating which goes first, so neither always runs right after the other.
        let order = if i % 2 == 0 { [0, 1] } else { [1, 0] };
        for which in order {
            let (server, samples) = if which == 0 {
                (&off, &mut off_ms)
            } else {
                (&on, &mut on_ms)
            };
            let took = server.turn(&format!("t{i}")).await;
            if i >= warmup {
                samples.push(took.as_secs_f64() * 1e3);
            }
        }
    }
    let cpu = [off.cpu_ms() - cpu[0], on.cpu_ms() - cpu[1]];
    // Wait (bounded) for the last batch to reach the receiver before reading what it got.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut last = u64::MAX;
    while Instant::now() < deadline {
        let now = received.exports.load(Ordering::Relaxed);
        if now == last && now > 0 {
            break;
        }
        last = now;
        tokio::time::sleep(Duration::from_millis(600)).await;
    }
    let dropped = on.spans_dropped().await;
    let (off_p50, off_p99) = (percentile(&mut off_ms, 50.0), percentile(&mut off_ms, 99.0));
    let (on_p50, on_p99) = (percentile(&mut on_ms, 50.0), percentile(&mut on_ms, 99.0));
    println!(
        "{}",
        json!({
            "turns": turns,
            "off": {"p50_ms": off_p50, "p99_ms": off_p99},
            "on": {"p50_ms": on_p50, "p99_ms": on_p99},
            "ratio_p50": on_p50 / off_p50,
            "ratio_p99": on_p99 / off_p99,
            "cpu_ms_per_turn": {"off": cpu[0] / turns as f64, "on": cpu[1] / turns as f64},
            "ratio_cpu": if cpu[0] > 0.0 { cpu[1] / cpu[0] } else { 0.0 },
            "exports": received.exports.load(Ordering::Relaxed),
            "export_bytes": received.bytes.load(Ordering::Relaxed),
            "spans_dropped": dropped,
        })
    );
    Ok(())
}
