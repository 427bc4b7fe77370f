//! Helpers shared by corral's integration tests: one [`Sandbox`] per test binary, backends that
//! record what they see, and a JSON matcher for expected reports.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use corral_catalog::Catalog;
use corral_sandbox::examples::{ExampleBackend, example_catalog};
use corral_sandbox::{
    Backend, ExecutorSession, Invocation, InvocationContext, InvokeCapabilityError, Sandbox,
    SandboxConfig, SessionLimits, SessionOptions, ToolResult,
};
use serde_json::Value;

/// The sandbox shared by every test of a binary (the engine and compiled guest are built once).
pub fn sandbox() -> &'static Sandbox {
    static SANDBOX: OnceLock<Sandbox> = OnceLock::new();
    SANDBOX.get_or_init(|| {
        let config = SandboxConfig {
            max_sessions: 200,
            ..SandboxConfig::default()
        };
        match Sandbox::new(config) {
            Ok(sandbox) => sandbox,
            Err(error) => panic!("loading the sandbox failed: {error}"),
        }
    })
}

/// A sandbox of its own (for tests that need other engine settings than [`sandbox`]).
pub fn sandbox_with(config: SandboxConfig) -> Sandbox {
    match Sandbox::new(config) {
        Ok(sandbox) => sandbox,
        Err(error) => panic!("loading the sandbox failed: {error}"),
    }
}

/// Options for a session on the example catalog and backend, with default limits.
pub fn example_options() -> SessionOptions {
    SessionOptions::new(Arc::new(example_catalog()), Arc::new(ExampleBackend))
}

/// A session on the example catalog and backend with the given limits.
pub async fn example_session(limits: SessionLimits) -> ExecutorSession {
    session(example_catalog(), Arc::new(ExampleBackend), limits).await
}

/// A session on any catalog and backend.
pub async fn session(
    catalog: Catalog,
    backend: Arc<dyn Backend>,
    limits: SessionLimits,
) -> ExecutorSession {
    let options = SessionOptions {
        context: InvocationContext {
            session_id: "test".into(),
            ..InvocationContext::default()
        },
        limits,
        ..SessionOptions::new(Arc::new(catalog), backend)
    };
    match sandbox().session(options).await {
        Ok(session) => session,
        Err(error) => panic!("creating a session failed: {error}"),
    }
}

/// A catalog of `n`-free test capabilities: `test.record` (any object) and `test.slow`
/// (`{ms}`), both served by [`RecordingBackend`].
pub fn recording_catalog() -> Catalog {
    let text = r#"{"capabilities": [
        {"id": "test.record", "input_schema": {"type": "object"}},
        {"id": "test.slow", "input_schema": {"type": "object", "properties": {"ms": {"type": "integer"}}, "required": ["ms"]}},
        {"id": "test.strict", "input_schema": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"], "additionalProperties": false}}
    ]}"#;
    match Catalog::from_json_str(text) {
        Ok(catalog) => catalog,
        Err(error) => panic!("the recording catalog is invalid: {error}"),
    }
}

/// A backend that records every invocation and how many were in flight at once. `test.slow`
/// waits `ms` milliseconds; every call returns `{"seen": <input>}`. When `barrier` is set, each
/// call waits until that many calls are in flight at the same time (or 10 s pass), which only
/// succeeds if the calls really run concurrently.
#[derive(Debug, Default)]
pub struct RecordingBackend {
    pub invocations: Mutex<Vec<(InvocationContext, Invocation)>>,
    pub in_flight: AtomicU32,
    pub max_in_flight: AtomicU32,
    pub barrier: Option<u32>,
    /// A value returned as-is by `test.record` instead of echoing, when set.
    pub reply: Option<Value>,
}

impl RecordingBackend {
    /// Calls recorded so far.
    pub fn calls(&self) -> usize {
        self.invocations.lock().map(|v| v.len()).unwrap_or(0)
    }
}

#[async_trait::async_trait]
impl Backend for RecordingBackend {
    async fn invoke(
        &self,
        context: &InvocationContext,
        invocation: Invocation,
    ) -> Result<ToolResult, InvokeCapabilityError> {
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_in_flight.fetch_max(now, Ordering::SeqCst);
        if let Ok(mut log) = self.invocations.lock() {
            log.push((context.clone(), invocation.clone()));
        }
        if let Some(n) = self.barrier {
            let waited = tokio::time::timeout(Duration::from_secs(10), async {
                while self.max_in_flight.load(Ordering::SeqCst) < n {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            })
            .await;
            if waited.is_err() {
                self.in_flight.fetch_sub(1, Ordering::SeqCst);
                return Err(InvokeCapabilityError::Failed {
                    capability_id: invocation.capability_id,
                    message: format!(
                        "only {} calls were ever in flight at once",
                        self.max_in_flight.load(Ordering::SeqCst)
                    ),
                });
            }
        }
        let argument = invocation.argument().clone();
        if invocation.capability_id == "test.slow" {
            let ms = argument.get("ms").and_then(Value::as_u64).unwrap_or(0);
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        let output = match &self.reply {
            Some(reply) => reply.clone(),
            None => serde_json::json!({ "seen": argument }),
        };
        Ok(ToolResult::new(output))
    }
}

/// Whether `actual` contains everything in `expected`: objects match key by key (extra keys in
/// `actual` are fine), arrays element by element with equal length, scalars by equality.
/// Two special objects: `{"$absent": true}` requires the key to be missing, and
/// `{"$contains": "text"}` requires a string containing `text`.
pub fn json_contains(actual: Option<&Value>, expected: &Value) -> Result<(), String> {
    if let Some(object) = expected.as_object() {
        if object.get("$absent") == Some(&Value::Bool(true)) {
            return match actual {
                None => Ok(()),
                Some(value) => Err(format!("expected no value, found {value}")),
            };
        }
        if let Some(needle) = object.get("$contains").and_then(Value::as_str) {
            return match actual.and_then(Value::as_str) {
                Some(text) if text.contains(needle) => Ok(()),
                other => Err(format!(
                    "expected a string containing {needle:?}, found {other:?}"
                )),
            };
        }
    }
    let Some(actual) = actual else {
        return Err(format!("expected {expected}, found nothing"));
    };
    match (expected, actual) {
        (Value::Object(want), Value::Object(have)) => {
            for (key, want) in want {
                json_contains(have.get(key), want).map_err(|e| format!("{key}: {e}"))?;
            }
            Ok(())
        }
        (Value::Array(want), Value::Array(have)) => {
            if want.len() != have.len() {
                return Err(format!(
                    "expected {} elements, found {}: {actual}",
                    want.len(),
                    have.len()
                ));
            }
            for (i, (want, have)) in want.iter().zip(have).enumerate() {
                json_contains(Some(have), want).map_err(|e| format!("[{i}]: {e}"))?;
            }
            Ok(())
        }
        (want, have) if want == have => Ok(()),
        (want, have) => Err(format!("expected {want}, found {have}")),
    }
}
