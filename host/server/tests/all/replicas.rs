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

/// One PostgreSQL server for the tests of this binary (each uses its own database): two
/// servers started at once by tests running in parallel can race for one port. It stops when
/// the test process exits (`PgServer`'s watchdog).
fn postgres() -> &'static PgServer {
    static SERVER: std::sync::OnceLock<Result<PgServer, String>> = std::sync::OnceLock::new();
    match SERVER.get_or_init(|| PgServer::start().map_err(|e| e.to_string())) {
        Ok(server) => server,
        Err(error) => panic!("PostgreSQL is needed for this test: {error}"),
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
    let pg = postgres();
    let config = pg.create_database("replicas").await.expect("database");
    let watch = Arc::new(Watch::default());
    let (a, stop_a) = replica(config.clone(), Arc::clone(&watch)).await;
    let (b, stop_b) = replica(config, Arc::clone(&watch)).await;
    let client = reqwest::Client::new();
    let manifest = json!({"id": "helper", "model": {"provider": "scripted"}});
    let body = register(&client, &a, &manifest).await;
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

/// Whether the replica watched by `watch` is running a segment of `session` now.
fn runs(watch: &Watch, session: &str) -> bool {
    watch
        .running
        .lock()
        .map(|r| r.contains(session))
        .unwrap_or(false)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cancel_taken_by_one_replica_stops_the_turn_running_on_the_other() {
    let pg = postgres();
    let config = pg
        .create_database("replica_cancel")
        .await
        .expect("database");
    let (watch_a, watch_b) = (Arc::new(Watch::default()), Arc::new(Watch::default()));
    let (a, stop_a) = replica(config.clone(), Arc::clone(&watch_a)).await;
    let (b, stop_b) = replica(config, Arc::clone(&watch_b)).await;
    let client = reqwest::Client::new();
    let manifest = json!({"id": "helper", "model": {"provider": "scripted"}});
    register(&client, &a, &manifest).await;
    let (status, body) = call(
        &client,
        reqwest::Method::PUT,
        format!("{a}/v1/sessions/long"),
        Some(json!({"agentId": "helper", "ownerUserId": "u"})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    // A turn that would run for 30 s unless it is cancelled.
    let (status, body) = call(
        &client,
        reqwest::Method::POST,
        format!("{a}/v1/sessions/long/commands"),
        Some(json!({"type": "message", "idempotencyKey": "m", "content": "sleep:30000 tool"})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let deadline = Instant::now() + Duration::from_secs(20);
    let (runner, other) = loop {
        if runs(&watch_a, "default/long") {
            break (Arc::clone(&watch_a), b.clone());
        }
        if runs(&watch_b, "default/long") {
            break (Arc::clone(&watch_b), a.clone());
        }
        assert!(Instant::now() < deadline, "no replica took the turn");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    // The cancel goes to the replica that is not running the turn.
    let (status, body) = call(
        &client,
        reqwest::Method::POST,
        format!("{other}/v1/sessions/long/commands"),
        Some(json!({"type": "cancel", "idempotencyKey": "c", "reason": "changed my mind"})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let cancelled = Instant::now();
    while runs(&runner, "default/long") {
        assert!(
            cancelled.elapsed() < Duration::from_secs(10),
            "the running replica never noticed the cancel"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (_, view) = call(
        &client,
        reqwest::Method::GET,
        format!("{other}/v1/sessions/long"),
        None,
    )
    .await;
    assert_eq!(view["status"], "cancelled", "{view}");
    // The aborted turn wrote nothing after the cancel: its `tool` step never started.
    let (_, page) = call(
        &client,
        reqwest::Method::GET,
        format!("{a}/v1/sessions/long/items?limit=1000"),
        None,
    )
    .await;
    let types: Vec<&str> = page["items"]
        .as_array()
        .map(|i| i.iter().filter_map(|e| e["type"].as_str()).collect())
        .unwrap_or_default();
    assert!(!types.contains(&"tool.started"), "{types:?}");
    assert_eq!(types.last(), Some(&"turn.cancelled"), "{types:?}");
    let _ = stop_a.send(());
    let _ = stop_b.send(());
}

/// Registers `manifest` as agent `helper` through `base`; the response body.
async fn register(client: &reqwest::Client, base: &str, manifest: &Value) -> Value {
    let (status, body) = call(
        client,
        reqwest::Method::PUT,
        format!("{base}/v1/agents/helper"),
        Some(json!({"manifest": manifest, "implementationVersion": "1"})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    body
}

/// Polls `/ready` until it answers `want`; the last body.
async fn ready_becomes(client: &reqwest::Client, base: &str, want: u16) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, body) =
            call(client, reqwest::Method::GET, format!("{base}/ready"), None).await;
        if status == want {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "/ready never answered {want}: {status} {body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ready_is_503_while_postgres_is_down_and_200_once_it_is_back() {
    // A server of its own: stopping the shared one would disturb the other tests.
    let pg = PgServer::start_local().expect("PostgreSQL is needed for this test");
    let config = pg.create_database("ready").await.expect("database");
    let (base, stop) = replica(config, Arc::new(Watch::default())).await;
    let client = reqwest::Client::new();
    let body = ready_becomes(&client, &base, 200).await;
    assert_eq!(
        body,
        json!({"status": "ready", "checks": {"store": true, "scheduler": true, "accepting": true}})
    );
    tokio::task::block_in_place(|| pg.crash()).expect("stop PostgreSQL");
    let body = ready_becomes(&client, &base, 503).await;
    assert_eq!(
        body,
        json!({"status": "not_ready", "checks": {"store": false, "scheduler": true, "accepting": true}})
    );
    // A request that needs the store fails typed, without details.
    let (status, body) = call(
        &client,
        reqwest::Method::GET,
        format!("{base}/v1/sessions"),
        None,
    )
    .await;
    assert_eq!(
        (status, &body["code"]),
        (500, &json!("internal_error")),
        "{body}"
    );
    assert_eq!(body["message"], "the server failed to handle the request");
    tokio::task::block_in_place(|| pg.restart()).expect("start PostgreSQL again");
    ready_becomes(&client, &base, 200).await;
    let (status, body) = call(
        &client,
        reqwest::Method::GET,
        format!("{base}/v1/sessions"),
        None,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let _ = stop.send(());
}
