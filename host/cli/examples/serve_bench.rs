//! Figures of `corral serve` over loopback, on the embedded store and on PostgreSQL, as
//! `bench/REPORT.md` shows them (figures, not timed tests).
//!
//! - command acknowledgement: `POST /commands` (a `message`) round trip, p50/p99, one session;
//! - commands/s with 16 and 256 sessions at once, each a client that sends a message and waits
//!   for its turn to complete on the session's SSE stream before the next one;
//! - approve -> first resumed event: from sending `approve` to the SSE delivery of the first
//!   event the resumed turn appends (not the `command.approve` record itself), p50/p99;
//! - 1,000 concurrent SSE streams: the server's resident memory per stream (VmRSS of the
//!   `corral serve` process before and after they connect), and from sending a message to its
//!   `command.message` event reaching every stream, p99 (an upper bound of append -> delivery,
//!   since it includes the command's own round trip).
//!
//! The server is the real `corral serve` binary beside this example (built by
//! `cargo build --release --workspace --all-targets`), with the chat runtime on the scripted
//! model. PostgreSQL is a throwaway server started by `corral_store::testing::PgServer` (or
//! `DATABASE_URL`); without one its rows are skipped with a note. Prints one JSON line.
//!
//! `serve_bench --quick` uses small counts (the suite's smoke run).

use std::sync::Arc;
use std::time::{Duration, Instant};

use eventsource_stream::Eventsource as _;
use futures::StreamExt as _;
use serde_json::{Value, json};

// The binary's tests' helpers: reading the address a child `corral serve` prints.
#[path = "../tests/common/mod.rs"]
mod common;
mod support;

use support::Server;

const TOKEN: &str = "bench-operator-token-0001";

/// How much work each figure does.
#[derive(Debug, Clone, Copy)]
struct Counts {
    acks: usize,
    seconds: f64,
    concurrency: [usize; 2],
    approvals: usize,
    stream_sessions: usize,
    streams_per_session: usize,
    deliveries: usize,
}

const FULL: Counts = Counts {
    acks: 300,
    seconds: 5.0,
    concurrency: [16, 256],
    approvals: 60,
    stream_sessions: 100,
    streams_per_session: 10,
    deliveries: 5,
};

const QUICK: Counts = Counts {
    acks: 20,
    seconds: 0.5,
    concurrency: [4, 16],
    approvals: 4,
    stream_sessions: 5,
    streams_per_session: 4,
    deliveries: 2,
};

impl Server {
    /// A server whose per-client limits (connections, streams per token, commands per tenant)
    /// are far above what the benchmark sends from its one token: it measures the server's
    /// capacity, not the limits that protect it.
    fn start_on(store: &str) -> anyhow::Result<Server> {
        let config = format!(
            "listen = \"127.0.0.1:0\"\nstore = \"{store}\"\nleaseMs = 30000\n\
             [[tokens]]\ntoken = \"{TOKEN}\"\nrole = \"application\"\n\
             [limits]\nmaxConnections = 4000\nsseStreamsPerToken = 4000\n\
             commandsPerSecond = 1000000\ncommandBurst = 1000000\n"
        );
        let client = reqwest::Client::builder()
            .pool_max_idle_per_host(512)
            .build()?;
        Server::start(&config, TOKEN, client, &[])
    }

    /// The CPU time the server's process used so far, all threads, in seconds (`/proc`'s
    /// `utime + stime`, in the kernel's fixed 100 ticks per second).
    fn cpu_seconds(&self) -> f64 {
        let stat =
            std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).unwrap_or_default();
        // The fields after the command's name (which may hold spaces) in parentheses.
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .map_or("", |(_, rest)| rest)
            .split_whitespace()
            .collect();
        let ticks = |index: usize| {
            fields
                .get(index)
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or(0)
        };
        // utime and stime are the stat's fields 14 and 15: 11 and 12 after the name.
        (ticks(11) + ticks(12)) as f64 / 100.0
    }

    /// The store transactions the server ran so far (`/metrics`; the scrape's own included);
    /// `None` from a build that does not count them.
    async fn store_transactions(&self) -> Option<u64> {
        let response = self
            .client
            .get(format!("{}/metrics", self.base))
            .bearer_auth(&self.token)
            .send()
            .await;
        let text = match response {
            Ok(response) => response.text().await.unwrap_or_default(),
            Err(error) => panic!("/metrics: {error}"),
        };
        text.lines()
            .find_map(|l| l.strip_prefix("corral_store_transactions_total "))
            .and_then(|n| n.parse().ok())
    }

    async fn agent(&self, manifest: Value) {
        let id = manifest["id"].as_str().unwrap_or_default().to_owned();
        self.call(
            reqwest::Method::PUT,
            &format!("/v1/agents/{id}"),
            Some(json!({"manifest": manifest, "implementationVersion": "1"})),
        )
        .await;
    }

    async fn session(&self, id: &str, agent: &str) {
        self.call(
            reqwest::Method::PUT,
            &format!("/v1/sessions/{id}"),
            Some(json!({"agentId": agent, "ownerUserId": "bench"})),
        )
        .await;
    }

    async fn command(&self, session: &str, command: Value) -> Value {
        self.call(
            reqwest::Method::POST,
            &format!("/v1/sessions/{session}/commands"),
            Some(command),
        )
        .await
    }

    /// The session's event stream after `cursor`: (cursor, type, data) as they arrive.
    async fn stream(
        &self,
        session: &str,
        cursor: u64,
    ) -> impl futures::Stream<Item = (u64, String, Value)> + Unpin + use<> {
        let response = self
            .client
            .get(format!(
                "{}/v1/sessions/{session}/events?cursor={cursor}",
                self.base
            ))
            .bearer_auth(TOKEN)
            .send()
            .await
            .expect("open the event stream");
        assert_eq!(response.status().as_u16(), 200);
        Box::pin(
            response
                .bytes_stream()
                .eventsource()
                .filter_map(|event| async move {
                    let event = event.ok()?;
                    let data: Value = serde_json::from_str(&event.data).ok()?;
                    Some((event.id.parse().ok()?, event.event, data))
                }),
        )
    }

    fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .unwrap_or_default();
        status
            .lines()
            .find_map(|line| line.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    }
}

fn talk_agent() -> Value {
    json!({"id": "talk", "model": {"provider": "scripted"}, "mode": "js"})
}

fn approval_agent() -> Value {
    json!({
        "id": "approve",
        "model": {"provider": "scripted", "replies": [
            {"toolCalls": [{"name": "run_js", "arguments": {"code": "return await tools.examples.echo({ n: 1 });"}}]},
            {"text": "done"}
        ]},
        "mode": "js",
        "approval": "script",
        "capabilities": [{"kind": "builtin", "id": "examples.echo"}]
    })
}

/// Waits on `events` for an event of type `kind`; its cursor and data.
async fn wait_for(
    events: &mut (impl futures::Stream<Item = (u64, String, Value)> + Unpin),
    kind: &str,
) -> (u64, Value) {
    loop {
        match tokio::time::timeout(Duration::from_secs(30), events.next()).await {
            Ok(Some((cursor, event_type, data))) if event_type == kind => {
                return (cursor, data);
            }
            Ok(Some(_)) => {}
            other => panic!("the stream ended or stalled waiting for {kind}: {other:?}"),
        }
    }
}

fn percentile(samples: &mut [f64], p: f64) -> f64 {
    if samples.is_empty() {
        return 0.0;
    }
    samples.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * samples.len() as f64).ceil() as usize;
    samples[rank.clamp(1, samples.len()) - 1]
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}

/// One message turn on `session` (its stream at `events`): the acknowledgement time.
async fn one_turn(
    server: &Server,
    session: &str,
    key: &str,
    events: &mut (impl futures::Stream<Item = (u64, String, Value)> + Unpin),
) -> Duration {
    let started = Instant::now();
    server
        .command(
            session,
            json!({"type": "message", "idempotencyKey": key, "content": "hello"}),
        )
        .await;
    let ack = started.elapsed();
    wait_for(events, "turn.completed").await;
    ack
}

async fn acknowledgements(server: &Server, counts: Counts) -> Value {
    server.session("ack", "talk").await;
    let mut events = server.stream("ack", 0).await;
    let mut samples = Vec::new();
    for i in 0..counts.acks {
        samples.push(ms(
            one_turn(server, "ack", &format!("k{i}"), &mut events).await
        ));
    }
    json!({"samples": samples.len(), "p50_ms": percentile(&mut samples, 50.0), "p99_ms": percentile(&mut samples, 99.0)})
}

async fn throughput(server: &Arc<Server>, sessions: usize, seconds: f64) -> Value {
    for i in 0..sessions {
        server
            .session(&format!("load-{sessions}-{i}"), "talk")
            .await;
    }
    let transactions = server.store_transactions().await;
    let cpu = server.cpu_seconds();
    let until = Instant::now() + Duration::from_secs_f64(seconds);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..sessions {
        let server = Arc::clone(server);
        tasks.push(tokio::spawn(async move {
            let session = format!("load-{sessions}-{i}");
            let mut events = server.stream(&session, 0).await;
            let mut acks = Vec::new();
            let mut n = 0;
            while Instant::now() < until {
                acks.push(ms(one_turn(
                    &server,
                    &session,
                    &format!("k{n}"),
                    &mut events,
                )
                .await));
                n += 1;
            }
            acks
        }));
    }
    let mut acks = Vec::new();
    for task in tasks {
        acks.extend(task.await.unwrap_or_default());
    }
    let elapsed = started.elapsed().as_secs_f64();
    let cpu = server.cpu_seconds() - cpu;
    // Less the second scrape's own count; background work (lease renewals, the sweeper) is in.
    let transactions = server
        .store_transactions()
        .await
        .zip(transactions)
        .map(|(after, before)| (after - before - 1) as f64 / acks.len().max(1) as f64);
    json!({
        "sessions": sessions,
        "commands": acks.len(),
        "commands_per_s": acks.len() as f64 / elapsed,
        "store_transactions_per_turn": transactions,
        "server_cpu_ms_per_turn": cpu * 1000.0 / acks.len().max(1) as f64,
        "ack_p50_ms": percentile(&mut acks, 50.0),
        "ack_p99_ms": percentile(&mut acks, 99.0),
    })
}

async fn approvals(server: &Server, counts: Counts) -> Value {
    let mut samples = Vec::new();
    for i in 0..counts.approvals {
        let session = format!("approve-{i}");
        server.session(&session, "approve").await;
        let mut events = server.stream(&session, 0).await;
        server
            .command(
                &session,
                json!({"type": "message", "idempotencyKey": "m", "content": "go"}),
            )
            .await;
        wait_for(&mut events, "turn.paused").await;
        let view = server
            .call(
                reqwest::Method::GET,
                &format!("/v1/sessions/{session}"),
                None,
            )
            .await;
        let interaction = view["waits"][0]["interactionId"].clone();
        let started = Instant::now();
        server
            .command(
                &session,
                json!({"type": "approve", "idempotencyKey": "a", "interactionId": interaction, "approved": true}),
            )
            .await;
        loop {
            match tokio::time::timeout(Duration::from_secs(30), events.next()).await {
                Ok(Some((_, kind, _))) if kind.starts_with("command.") => {}
                Ok(Some(_)) => break,
                other => panic!("no event after the approval: {other:?}"),
            }
        }
        samples.push(ms(started.elapsed()));
        wait_for(&mut events, "turn.completed").await;
    }
    json!({"samples": samples.len(), "p50_ms": percentile(&mut samples, 50.0), "p99_ms": percentile(&mut samples, 99.0)})
}

async fn streams(server: &Arc<Server>, counts: Counts) -> Value {
    let total = counts.stream_sessions * counts.streams_per_session;
    for i in 0..counts.stream_sessions {
        server.session(&format!("fan-{i}"), "talk").await;
    }
    // Settle, then read the server's memory before any stream exists.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = server.rss_kib();
    let (ready_tx, mut ready_rx) = tokio::sync::mpsc::channel::<()>(total);
    let (arrived_tx, mut arrived_rx) =
        tokio::sync::mpsc::unbounded_channel::<(usize, u64, Instant)>();
    let mut tasks = Vec::new();
    for i in 0..counts.stream_sessions {
        for _ in 0..counts.streams_per_session {
            let server = Arc::clone(server);
            let (ready, arrived) = (ready_tx.clone(), arrived_tx.clone());
            tasks.push(tokio::spawn(async move {
                let mut events = server.stream(&format!("fan-{i}"), 0).await;
                let _ = ready.send(()).await;
                while let Some((cursor, kind, _)) = events.next().await {
                    if kind == "command.message"
                        && arrived.send((i, cursor, Instant::now())).is_err()
                    {
                        return;
                    }
                }
            }));
        }
    }
    for _ in 0..total {
        ready_rx.recv().await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = server.rss_kib();
    let mut latencies = Vec::new();
    let mut cursor = 0;
    for round in 0..counts.deliveries {
        let mut sent = Vec::new();
        for i in 0..counts.stream_sessions {
            let started = Instant::now();
            let accepted = server
                .command(
                    &format!("fan-{i}"),
                    json!({"type": "message", "idempotencyKey": format!("r{round}"), "content": "hi"}),
                )
                .await;
            cursor = accepted["cursor"].as_u64().unwrap_or(0);
            sent.push(started);
        }
        let mut pending = total;
        while pending > 0 {
            let Ok(Some((session, seen, at))) =
                tokio::time::timeout(Duration::from_secs(30), arrived_rx.recv()).await
            else {
                panic!("{pending} streams never got their event");
            };
            if seen == cursor {
                latencies.push(ms(at.duration_since(sent[session])));
                pending -= 1;
            }
        }
        // Let the turns finish before the next round (a message needs an idle session).
        for i in 0..counts.stream_sessions {
            loop {
                let view = server
                    .call(reqwest::Method::GET, &format!("/v1/sessions/fan-{i}"), None)
                    .await;
                if view["status"] == "completed" {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
    for task in tasks {
        task.abort();
    }
    json!({
        "streams": total,
        "rss_before_kib": before,
        "rss_after_kib": after,
        "kib_per_stream": after.saturating_sub(before) as f64 / total as f64,
        "deliveries": latencies.len(),
        "delivery_p50_ms": percentile(&mut latencies, 50.0),
        "delivery_p99_ms": percentile(&mut latencies, 99.0),
    })
}

async fn measure(store_name: &str, store: &str, counts: Counts) -> anyhow::Result<Value> {
    let server = Arc::new(Server::start_on(store)?);
    server.agent(talk_agent()).await;
    server.agent(approval_agent()).await;
    let ack = acknowledgements(&server, counts).await;
    let mut load = Vec::new();
    for sessions in counts.concurrency {
        load.push(throughput(&server, sessions, counts.seconds).await);
    }
    let approve = approvals(&server, counts).await;
    let fan = streams(&server, counts).await;
    Ok(
        json!({"store": store_name, "ack": ack, "load": load, "approve_to_first_event": approve, "sse": fan}),
    )
}

/// A `postgres://` URL for `database` on the throwaway server.
fn postgres_url(config: &corral_store::PostgresConfig) -> String {
    use corral_store::PostgresHost;
    let host = match config.get_hosts().first() {
        Some(PostgresHost::Tcp(name)) => name.clone(),
        Some(PostgresHost::Unix(path)) => path.display().to_string(),
        None => "localhost".to_owned(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let user = config.get_user().unwrap_or("postgres");
    let database = config.get_dbname().unwrap_or("postgres");
    format!("postgres://{user}@/{database}?host={host}&port={port}")
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let counts = if std::env::args().any(|a| a == "--quick") {
        QUICK
    } else {
        FULL
    };
    let mut results = vec![measure("embedded", "sqlite:{folder}/corral.db", counts).await?];
    let mut notes = Vec::new();
    match corral_store::testing::PgServer::start() {
        Ok(pg) => {
            let database = format!("corral_serve_bench_{}", std::process::id());
            match pg.create_database(&database).await {
                Ok(config) => {
                    results.push(measure("PostgreSQL", &postgres_url(&config), counts).await?);
                    let _ = pg.drop_database(&database).await;
                }
                Err(error) => notes.push(format!("PostgreSQL skipped: {error}")),
            }
        }
        Err(error) => notes.push(format!("PostgreSQL skipped: {error}")),
    }
    println!("{}", json!({"results": results, "notes": notes}));
    Ok(())
}
