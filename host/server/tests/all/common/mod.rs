//! A server on a real socket for the black-box tests.

#![allow(dead_code)]

pub mod contract;

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use corral_server::config::Grants;
use corral_server::manifest::manifest_hash;
use corral_server::script::ScriptRunner;
use corral_server::{
    Config, Finished, Server, StoreLocation, TokenConfig, TurnJob, TurnOutcome, TurnRunner,
};
use corral_store::{
    CheckpointWrite, EffectStatus, EffectTransition, ExecutorScope, NewCheckpoint, SessionCommit,
    SessionStatus, SqliteStore, Store,
};
use serde_json::{Value, json};

pub const OPERATOR: &str = "operator-token-0000000001";
pub const ACME: &str = "acme-tenant-token-000001";
pub const BETA: &str = "beta-tenant-token-000001";
pub const EXECUTOR: &str = "executor-token-helper-0001";
pub const OTHER_EXECUTOR: &str = "executor-token-other-00001";
/// A tenant token granted `canRegisterAgents` and `canResolve`, named `gamma-admin`.
pub const GAMMA: &str = "gamma-tenant-token-00001";
/// An executor token for `helper` limited to tenant `acme`'s sessions.
pub const ACME_EXECUTOR: &str = "executor-token-acme-000001";

pub fn manifest() -> Value {
    json!({
        "id": "helper",
        "instructions": "Help.",
        "model": {"provider": "scripted", "replies": [{"text": "hi"}]},
        "capabilities": [
            {"kind": "builtin", "id": "examples.echo"},
            {"kind": "action", "id": "demo.action", "input_schema": {"type": "object"}}
        ]
    })
}

/// The scripted runner, plus `corrupt`: leaves the session paused on an unreadable checkpoint;
/// and `refused`: completes, leaving last journal writes the store refuses (a transition of an
/// effect that does not exist).
#[derive(Debug)]
struct TestRunner(ScriptRunner);

#[async_trait]
impl TurnRunner for TestRunner {
    async fn run(&self, job: TurnJob) -> TurnOutcome {
        if job.checkpoint.message == "corrupt" {
            let mut commit = SessionCommit::new(&job.session.id);
            commit.fence = Some(job.fence.clone());
            commit.patch.status = Some(SessionStatus::Paused);
            commit.checkpoint = Some(CheckpointWrite::Put(NewCheckpoint::new(
                &job.turn_id,
                job.segment,
                json!({"secret": "do-not-leak-this"}),
            )));
            let _ = job.store.commit(commit).await;
            return TurnOutcome::Cancelled;
        }
        self.0.run(job).await
    }

    async fn run_segment(&self, job: TurnJob) -> Finished {
        if job.checkpoint.message == "refused" {
            let mut held = SessionCommit::new(&job.session.id);
            held.fence = Some(job.fence.clone());
            held.effects.push(EffectTransition::new(
                "no-such-effect",
                &[EffectStatus::Invoking],
                EffectStatus::Completed,
            ));
            return Finished {
                outcome: TurnOutcome::Completed {
                    output: json!({"text": "never shown"}),
                    items: Vec::new(),
                },
                held: Some(held),
            };
        }
        self.run(job).await.into()
    }
}

#[derive(Debug)]
pub struct Harness {
    pub base: String,
    pub client: reqwest::Client,
    pub store_path: std::path::PathBuf,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
    pub dir: Option<tempfile::TempDir>,
}

#[derive(Debug)]
pub struct Options {
    pub lease: Duration,
    pub send_timeout: Duration,
    pub keep_alive: Duration,
    /// The `[limits]` table (limits.rs in this binary).
    pub limits: corral_server::limits::Limits,
    /// `shutdownGraceMs`, when not the default.
    pub shutdown_grace: Option<Duration>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            lease: Duration::from_secs(30),
            send_timeout: Duration::from_secs(5),
            keep_alive: Duration::from_secs(15),
            limits: corral_server::limits::Limits::default(),
            shutdown_grace: None,
        }
    }
}

impl Harness {
    pub async fn start() -> Harness {
        Harness::start_with(Options::default()).await
    }

    pub async fn start_with(options: Options) -> Harness {
        let dir = tempfile::tempdir().expect("tempdir");
        let store_path = dir.path().join("corral.db");
        let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&store_path).expect("store"));
        Harness::start_on(store, store_path, Some(dir), options).await
    }

    pub async fn start_on(
        store: Arc<dyn Store>,
        store_path: std::path::PathBuf,
        dir: Option<tempfile::TempDir>,
        options: Options,
    ) -> Harness {
        let hash = manifest_hash(&manifest());
        let mut config = Config::new(
            "127.0.0.1:0".parse().expect("addr"),
            StoreLocation::Sqlite(store_path.clone()),
            options.lease,
            vec![
                TokenConfig::application(OPERATOR, None),
                TokenConfig::application(ACME, Some("acme".to_owned())),
                TokenConfig::application(BETA, Some("beta".to_owned())),
                TokenConfig::executor(EXECUTOR, ExecutorScope::new("helper", &hash, "1")),
                TokenConfig::executor(
                    OTHER_EXECUTOR,
                    ExecutorScope::new("other", "sha256:00", "1"),
                ),
                TokenConfig::application(GAMMA, Some("gamma".to_owned()))
                    .named("gamma-admin")
                    .granted(Grants::ALL),
                TokenConfig::executor(
                    ACME_EXECUTOR,
                    ExecutorScope::new("helper", &hash, "1").for_tenant(Some("acme".to_owned())),
                ),
            ],
        )
        .expect("config");
        config.sse_send_timeout = options.send_timeout;
        config.sse_keep_alive = options.keep_alive;
        config.limits = options.limits;
        if let Some(grace) = options.shutdown_grace {
            config.shutdown_grace = grace;
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let base = format!("http://{}", listener.local_addr().expect("addr"));
        // A kept-alive connection the server is closing for idleness can be picked
        // from the pool in the same instant; like any HTTP/1.1 client that does not
        // retry, the harness lets connections go well before the server would.
        let client = reqwest::Client::builder()
            .pool_idle_timeout(config.limits.idle_timeout / 2)
            .build()
            .expect("client");
        let server = Server::new(config, store, Arc::new(TestRunner(ScriptRunner::default())));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(server.run(listener, async move {
            let _ = stopped.await;
        }));
        Harness {
            base,
            client,
            store_path,
            stop: Some(stop),
            task: Some(task),
            dir,
        }
    }

    /// Stops the server and waits for it to finish; returns the temp dir for a restart.
    pub async fn shutdown(mut self) -> Option<tempfile::TempDir> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.expect("join").expect("served");
        }
        self.dir.take()
    }

    pub async fn request(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<&Value>,
    ) -> (u16, String) {
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
        let mut request = self
            .client
            .request(method.clone(), format!("{}{path}", self.base));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request
                .header("content-type", "application/json")
                .body(body.to_string());
        }
        let response = request.send().await.expect("send");
        let status = response.status().as_u16();
        let header = |name| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let (allow, content_type) = (header("allow"), header("content-type"));
        let text = response.text().await.expect("body");
        contract::check_response(
            method.as_str(),
            path,
            status,
            allow.as_deref(),
            content_type.as_deref(),
            &text,
        );
        (status, text)
    }

    pub async fn call(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> (u16, Value) {
        let (status, text) = self.request(method, path, token, body.as_ref()).await;
        let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        (status, value)
    }

    pub async fn ok(&self, method: &str, path: &str, token: &str, body: Option<Value>) -> Value {
        let (status, value) = self.call(method, path, Some(token), body).await;
        assert_eq!(status, 200, "{method} {path}: {value}");
        value
    }

    pub async fn register_agent(&self) -> String {
        let put = self
            .ok(
                "PUT",
                "/v1/agents/helper",
                OPERATOR,
                Some(json!({"manifest": manifest(), "implementationVersion": "1",
                    "sharedWith": ["*"]})),
            )
            .await;
        put["manifestHash"].as_str().expect("hash").to_owned()
    }

    pub async fn session(&self, id: &str, token: &str) -> Value {
        self.ok(
            "PUT",
            &format!("/v1/sessions/{id}"),
            token,
            Some(json!({"agentId": "helper", "ownerUserId": "u1",
                "info": {"email": "ada@example.com", "displayName": "Ada"}})),
        )
        .await
    }

    pub async fn command(&self, id: &str, token: &str, command: Value) -> (u16, Value) {
        self.call(
            "POST",
            &format!("/v1/sessions/{id}/commands"),
            Some(token),
            Some(command),
        )
        .await
    }

    pub async fn message(&self, id: &str, key: &str, content: &str) -> Value {
        self.say(id, OPERATOR, key, content).await
    }

    /// Sends a message to session `id` with `token`, asserting that it is accepted.
    pub async fn say(&self, id: &str, token: &str, key: &str, content: &str) -> Value {
        let (status, body) = self
            .command(
                id,
                token,
                json!({"type": "message", "idempotencyKey": key, "content": content}),
            )
            .await;
        assert_eq!(status, 200, "{body}");
        body
    }

    /// `/metrics`, read with the operator's token.
    pub async fn metrics(&self) -> String {
        let (status, text) = self.request("GET", "/metrics", Some(OPERATOR), None).await;
        assert_eq!(status, 200, "{text}");
        text
    }

    pub async fn view(&self, id: &str) -> Value {
        self.ok("GET", &format!("/v1/sessions/{id}"), OPERATOR, None)
            .await
    }

    pub async fn wait_status(&self, id: &str, status: &str) -> Value {
        self.wait_status_as(id, OPERATOR, status).await
    }

    /// The view of session `id`, read with `token`, once its status is `status`.
    pub async fn wait_status_as(&self, id: &str, token: &str, status: &str) -> Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let view = self
                .ok("GET", &format!("/v1/sessions/{id}"), token, None)
                .await;
            if view["status"] == status {
                return view;
            }
            assert!(
                Instant::now() < deadline,
                "session {id} never became {status}: {view}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub async fn events(&self, id: &str) -> Vec<Value> {
        let page = self
            .ok(
                "GET",
                &format!("/v1/sessions/{id}/items?limit=1000"),
                OPERATOR,
                None,
            )
            .await;
        page["items"].as_array().cloned().unwrap_or_default()
    }

    pub async fn event_types(&self, id: &str) -> Vec<String> {
        self.events(id)
            .await
            .iter()
            .map(|e| e["type"].as_str().unwrap_or("").to_owned())
            .collect()
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

pub fn assert_error(status: u16, body: &Value, expected_status: u16, code: &str) {
    assert_eq!(status, expected_status, "{body}");
    assert_eq!(body["status"], "rejected", "{body}");
    assert_eq!(body["code"], code, "{body}");
    assert!(body["message"].is_string(), "{body}");
    assert_eq!(body.as_object().map(|o| o.len()), Some(3), "{body}");
}
