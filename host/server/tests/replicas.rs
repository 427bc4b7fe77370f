//! Two servers (replicas) on one PostgreSQL database never run the same turn at once, and
//! together finish every turn.

#![cfg(unix)]

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use corral_server::manifest::manifest_hash;
use corral_server::script::ScriptRunner;
use corral_server::{Config, Server, StoreLocation, TokenConfig, TurnJob, TurnOutcome, TurnRunner};
use corral_store::testing::PgServer;
use corral_store::{PostgresOptions, PostgresStore, Store};
use serde_json::{Value, json};

const TOKEN: &str = "replica-operator-token-01";

#[derive(Debug, Default)]
struct Watch {
    running: Mutex<HashSet<String>>,
    overlaps: AtomicUsize,
    segments: AtomicUsize,
}

#[derive(Debug)]
struct Exclusive {
    inner: ScriptRunner,
    watch: Arc<Watch>,
}

#[async_trait]
impl TurnRunner for Exclusive {
    async fn run(&self, job: TurnJob) -> TurnOutcome {
        let session = job.session.id.clone();
        let fresh = self
            .watch
            .running
            .lock()
            .map(|mut r| r.insert(session.clone()))
            .unwrap_or(false);
        if !fresh {
            self.watch.overlaps.fetch_add(1, Ordering::SeqCst);
        }
        self.watch.segments.fetch_add(1, Ordering::SeqCst);
        let outcome = self.inner.run(job).await;
        if fresh && let Ok(mut running) = self.watch.running.lock() {
            running.remove(&session);
        }
        outcome
    }
}

async fn replica(
    config: corral_store::PostgresConfig,
    watch: Arc<Watch>,
) -> (String, tokio::sync::oneshot::Sender<()>) {
    let store: Arc<dyn Store> = Arc::new(
        PostgresStore::connect(PostgresOptions::new(config))
            .await
            .expect("connect"),
    );
    let config = Config::new(
        "127.0.0.1:0".parse().expect("addr"),
        StoreLocation::Postgres("postgres://test".to_owned()),
        Duration::from_secs(5),
        vec![TokenConfig::application(TOKEN, None)],
    )
    .expect("config");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let server = Server::new(
        config,
        store,
        Arc::new(Exclusive {
            inner: ScriptRunner::default(),
            watch,
        }),
    );
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(server.run(listener, async move {
        let _ = stopped.await;
    }));
    (base, stop)
}

async fn call(
    client: &reqwest::Client,
    method: reqwest::Method,
    url: String,
    body: Option<Value>,
) -> (u16, Value) {
    let mut request = client.request(method, url).bearer_auth(TOKEN);
    if let Some(body) = body {
        request = request.body(body.to_string());
    }
    let response = request.send().await.expect("send");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_replicas_never_run_the_same_turn_and_finish_every_turn() {
    let pg = match PgServer::start() {
        Ok(pg) => pg,
        Err(error) => panic!("PostgreSQL is needed for this test: {error}"),
    };
    let config = pg.create_database("replicas").await.expect("database");
    let watch = Arc::new(Watch::default());
    let (a, stop_a) = replica(config.clone(), Arc::clone(&watch)).await;
    let (b, stop_b) = replica(config, Arc::clone(&watch)).await;
    let client = reqwest::Client::new();
    let manifest = json!({"id": "helper", "model": {"provider": "scripted"}});
    let (status, body) = call(
        &client,
        reqwest::Method::PUT,
        format!("{a}/v1/agents/helper"),
        Some(json!({"manifest": manifest, "implementationVersion": "1"})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["manifestHash"], manifest_hash(&manifest));
    const SESSIONS: usize = 12;
    const TURNS: usize = 3;
    for turn in 0..TURNS {
        for index in 0..SESSIONS {
            let base = if (index + turn) % 2 == 0 { &a } else { &b };
            if turn == 0 {
                let (status, body) = call(
                    &client,
                    reqwest::Method::PUT,
                    format!("{base}/v1/sessions/s{index}"),
                    Some(json!({"agentId": "helper", "ownerUserId": "u"})),
                )
                .await;
                assert_eq!(status, 200, "{body}");
            }
            let (status, body) = call(&client, reqwest::Method::POST, format!("{base}/v1/sessions/s{index}/commands"),
                Some(json!({"type": "message", "idempotencyKey": format!("t{turn}"), "content": "tool slow tool"}))).await;
            assert_eq!(status, 200, "{body}");
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let (_, list) = call(
                &client,
                reqwest::Method::GET,
                format!("{b}/v1/sessions"),
                None,
            )
            .await;
            let done = list["sessions"]
                .as_array()
                .map(|s| s.iter().filter(|s| s["status"] == "completed").count())
                .unwrap_or(0);
            if done == SESSIONS {
                break;
            }
            assert!(Instant::now() < deadline, "not every turn finished: {list}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    assert_eq!(
        watch.overlaps.load(Ordering::SeqCst),
        0,
        "two replicas ran one session at once"
    );
    assert_eq!(watch.segments.load(Ordering::SeqCst), SESSIONS * TURNS);
    // Each completed turn's tool calls ran exactly once.
    let (_, page) = call(
        &client,
        reqwest::Method::GET,
        format!("{a}/v1/sessions/s0/items?limit=1000"),
        None,
    )
    .await;
    let started = page["items"]
        .as_array()
        .map(|i| i.iter().filter(|e| e["type"] == "tool.started").count());
    assert_eq!(started, Some(2 * TURNS));
    let _ = stop_a.send(());
    let _ = stop_b.send(());
}
