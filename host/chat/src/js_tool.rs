//! `JavaScriptTool` (SPEC S1.5): the executor and invoker machinery of `run_js` for
//! application-owned task loops. No approval flow (the host pre-authorizes the catalog and
//! enforces policy in its backend), no agent-control bindings, lazy allocation, and a close
//! handle the caller must use on completion, parking, cancellation and failure.

use std::sync::Arc;

use corral_catalog::{Catalog, RenderSchemaError, render_prompt};
use corral_models::ToolSpec;
use corral_sandbox::{
    Backend, CreateSessionError, ExecutorSession, InvocationContext, ScriptReport, ScriptUser,
};
use tokio::sync::Mutex;

use crate::executor::{ExecutorFactory, ExecutorRequest};
use crate::run::run_js_tool;

struct State {
    catalog: Arc<Catalog>,
    backend: Arc<dyn Backend>,
    factory: Arc<dyn ExecutorFactory>,
    context: InvocationContext,
    user: Option<ScriptUser>,
    executor: Option<ExecutorSession>,
    closed: bool,
}

/// The `run_js` tool for a task loop: call it with scripts; `globalThis` persists between
/// calls until it is closed (or a limit discards the executor).
#[derive(Clone)]
pub struct JavaScriptTool {
    spec: ToolSpec,
    state: Arc<Mutex<State>>,
}

impl std::fmt::Debug for JavaScriptTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JavaScriptTool")
            .field("name", &self.spec.name)
            .finish_non_exhaustive()
    }
}

/// Closes a [`JavaScriptTool`]'s executor. Dropping it without calling
/// [`CloseJavaScriptTool::close`] also closes the executor, but only when the tool itself is
/// dropped too: call `close`.
#[must_use = "the executor stays allocated until close() is called"]
#[derive(Debug)]
pub struct CloseJavaScriptTool {
    tool: JavaScriptTool,
}

impl CloseJavaScriptTool {
    /// Closes the executor; later calls fail with [`UseJavaScriptToolError::Closed`].
    pub async fn close(self) {
        let mut state = self.tool.state.lock().await;
        state.executor = None;
        state.closed = true;
    }
}

/// Why a call of the tool did not run a script.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UseJavaScriptToolError {
    /// The tool was closed.
    #[error("the JavaScript tool was closed")]
    Closed,
    /// The executor could not be created.
    #[error(transparent)]
    Create(#[from] CreateSessionError),
}

/// Builds the tool for `catalog` (rendered into its description), calling through `backend`
/// and allocating its executor from `factory` on first use. Fails if the catalog cannot be
/// rendered.
pub fn javascript_tool(
    catalog: Arc<Catalog>,
    backend: Arc<dyn Backend>,
    factory: Arc<dyn ExecutorFactory>,
    context: InvocationContext,
    user: Option<ScriptUser>,
) -> Result<(JavaScriptTool, CloseJavaScriptTool), RenderSchemaError> {
    let spec = run_js_tool(render_prompt(&catalog)?.text);
    let tool = JavaScriptTool {
        spec,
        state: Arc::new(Mutex::new(State {
            catalog,
            backend,
            factory,
            context,
            user,
            executor: None,
            closed: false,
        })),
    };
    let close = CloseJavaScriptTool { tool: tool.clone() };
    Ok((tool, close))
}

impl JavaScriptTool {
    /// The model tool declaration.
    pub fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    /// Runs one script, allocating the executor on the first call.
    pub async fn call(&self, code: &str) -> Result<ScriptReport, UseJavaScriptToolError> {
        let mut state = self.state.lock().await;
        if state.closed {
            return Err(UseJavaScriptToolError::Closed);
        }
        if state.executor.is_none() {
            let request = ExecutorRequest {
                catalog: Arc::clone(&state.catalog),
                backend: Arc::clone(&state.backend),
                context: state.context.clone(),
                user: state.user.clone(),
                random_seed: 0,
            };
            let executor = state.factory.create(request).await?;
            state.executor = Some(executor);
        }
        let Some(executor) = state.executor.as_mut() else {
            return Err(UseJavaScriptToolError::Closed);
        };
        let report = executor.run(code).await;
        if executor.is_discarded() {
            state.executor = None;
        }
        Ok(report)
    }

    /// Whether an executor is allocated now.
    pub async fn is_allocated(&self) -> bool {
        self.state.lock().await.executor.is_some()
    }
}
