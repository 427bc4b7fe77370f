//! Shared pieces of the chat runtime's tests: one sandbox per binary, a recording backend, a
//! recording model over the scripted model, and an Input builder over a real store.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use corral_catalog::{Catalog, Redactor};
use corral_chat::{
    ApprovalPolicy, ExecutorFactory, ExecutorRequest, Input, ModelLimits, SandboxExecutorFactory,
    StoreJournal, VecSink,
};
use corral_models::{Model, ModelError, ModelRequest, ModelStream, ScriptedModel};
use corral_sandbox::{
    Backend, CreateSessionError, ExecutorSession, Invocation, InvocationContext,
    InvokeCapabilityError, Sandbox, SandboxConfig, SessionLimits, ToolResult,
};
use corral_store::{NewAgent, NewSession, SqliteStore, Store};
use serde_json::{Value, json};

pub fn sandbox() -> &'static Sandbox {
    static SANDBOX: OnceLock<Sandbox> = OnceLock::new();
    SANDBOX.get_or_init(|| match Sandbox::new(SandboxConfig::default()) {
        Ok(sandbox) => sandbox,
        Err(error) => panic!("loading the sandbox failed: {error}"),
    })
}

/// The test catalog: `t.echo`, `t.sleep {ms}`, `t.gated` (needs approval), `t.block` (never
/// answers), `t.ext` (an external action in the tests that declare it).
pub fn catalog() -> Arc<Catalog> {
    let catalog = json!({"capabilities": [
        {"id": "t.echo", "description": "Returns its input.", "input_schema": {"type": "object"}},
        {"id": "t.sleep", "input_schema": {"type": "object", "properties": {"ms": {"type": "integer", "minimum": 0}}, "required": ["ms"], "additionalProperties": false}},
        {"id": "t.gated", "description": "Sends something: needs approval.", "input_schema": {"type": "object"}, "needs_approval": true},
        {"id": "t.block", "input_schema": {"type": "object"}},
        {"id": "t.ext", "input_schema": {"type": "object"}}
    ]});
    match Catalog::from_json_str(&catalog.to_string()) {
        Ok(catalog) => Arc::new(catalog),
        Err(error) => panic!("{error}"),
    }
}

/// Counts and records every invocation; `t.sleep` waits, `t.block` never answers.
#[derive(Debug, Default)]
pub struct RecordingBackend {
    pub calls: Mutex<Vec<(String, Value)>>,
    pub in_flight: AtomicU32,
    pub peak_in_flight: AtomicU32,
}

impl RecordingBackend {
    pub fn count(&self, capability: &str) -> usize {
        self.calls
            .lock()
            .map(|c| c.iter().filter(|(id, _)| id == capability).count())
            .unwrap_or(0)
    }
    pub fn total(&self) -> usize {
        self.calls.lock().map(|c| c.len()).unwrap_or(0)
    }
}

#[async_trait]
impl Backend for RecordingBackend {
    async fn invoke(
        &self,
        _context: &InvocationContext,
        invocation: Invocation,
    ) -> Result<ToolResult, InvokeCapabilityError> {
        let argument = invocation.argument().clone();
        if let Ok(mut calls) = self.calls.lock() {
            calls.push((invocation.capability_id.clone(), argument.clone()));
        }
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak_in_flight.fetch_max(now, Ordering::SeqCst);
        let result = match invocation.capability_id.as_str() {
            "t.sleep" => {
                let ms = argument["ms"].as_u64().unwrap_or(0);
                tokio::time::sleep(Duration::from_millis(ms)).await;
                Ok(ToolResult::new(json!({"slept": ms})))
            }
            "t.block" => {
                std::future::pending::<()>().await;
                Ok(ToolResult::new(Value::Null))
            }
            _ => Ok(ToolResult::new(json!({"echo": argument}))),
        };
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        result
    }
}

/// The scripted model, recording every request it is asked.
#[derive(Debug)]
pub struct RecordingModel {
    inner: ScriptedModel,
    pub requests: Mutex<Vec<ModelRequest>>,
}

impl RecordingModel {
    pub fn new(replies: Value) -> Arc<Self> {
        let inner = match ScriptedModel::from_json_str(&replies.to_string()) {
            Ok(model) => model,
            Err(error) => panic!("{error}"),
        };
        Arc::new(RecordingModel {
            inner,
            requests: Mutex::new(Vec::new()),
        })
    }
    pub fn requests(&self) -> Vec<ModelRequest> {
        self.requests.lock().map(|r| r.clone()).unwrap_or_default()
    }
}

#[async_trait]
impl Model for RecordingModel {
    fn describe(&self) -> String {
        "scripted".into()
    }
    async fn stream(&self, request: ModelRequest) -> Result<ModelStream, ModelError> {
        if let Ok(mut requests) = self.requests.lock() {
            requests.push(request.clone());
        }
        self.inner.stream(request).await
    }
}

/// Counts executor allocations.
#[derive(Debug)]
pub struct CountingFactory {
    pub inner: SandboxExecutorFactory,
    pub created: AtomicU32,
}

impl CountingFactory {
    pub fn new() -> Arc<Self> {
        Arc::new(CountingFactory {
            inner: SandboxExecutorFactory::new(sandbox().clone(), SessionLimits::default()),
            created: AtomicU32::new(0),
        })
    }
}

#[async_trait]
impl ExecutorFactory for CountingFactory {
    async fn create(
        &self,
        request: ExecutorRequest,
    ) -> Result<ExecutorSession, CreateSessionError> {
        self.created.fetch_add(1, Ordering::SeqCst);
        self.inner.create(request).await
    }
}

/// Opens (or reopens) the embedded store in `folder`, with agent `a` and session `s1`.
pub async fn open_store(folder: &std::path::Path) -> Arc<dyn Store> {
    let store: Arc<dyn Store> = match SqliteStore::open(folder.join("chat.db")) {
        Ok(store) => Arc::new(store),
        Err(error) => panic!("{error}"),
    };
    prepare(&store).await;
    store
}

pub async fn prepare(store: &Arc<dyn Store>) {
    if let Err(error) = store
        .put_agent(NewAgent::new("a", json!({"id": "a"}), "sha256:test", "1"))
        .await
    {
        panic!("{error}");
    }
    if let Err(error) = store
        .create_session(NewSession::new("s1", "acme", "alice", "a", json!({})))
        .await
    {
        panic!("{error}");
    }
}

/// An Input for turn `turn` with the test catalog, auto-confirm off, script approval.
pub struct Parts {
    pub model: Arc<RecordingModel>,
    pub backend: Arc<RecordingBackend>,
    pub factory: Arc<CountingFactory>,
    pub sink: Arc<VecSink>,
}

impl Parts {
    pub fn new(replies: Value) -> Self {
        Parts {
            model: RecordingModel::new(replies),
            backend: Arc::new(RecordingBackend::default()),
            factory: CountingFactory::new(),
            sink: Arc::new(VecSink::default()),
        }
    }

    pub fn input(&self, store: &Arc<dyn Store>, turn: &str, message: &str) -> Input {
        Input {
            model: self.model.clone(),
            limits: ModelLimits::default(),
            store: Arc::new(StoreJournal::new(Arc::clone(store), "s1", turn, None, 0)),
            turn_id: turn.to_string(),
            message: message.to_string(),
            max_steps: 8,
            sink: self.sink.clone(),
            backend: self.backend.clone(),
            redactor: Arc::new(Redactor::default()),
            capabilities: catalog(),
            action_capabilities: vec!["t.ext".into()],
            executor_factory: Some(self.factory.clone()),
            instructions: "You are a test agent.".into(),
            direct_tools: false,
            auto_confirm: false,
            approval: ApprovalPolicy::Script,
            user: None,
            context: Default::default(),
            fingerprint: "fp-1".into(),
            decisions: BTreeMap::new(),
            resume: None,
            trace_context: None,
        }
    }
}

/// A scripted reply that runs `code` through run_js.
pub fn js(code: &str) -> Value {
    json!({"toolCalls": [{"name": "run_js", "arguments": {"code": code}}]})
}
