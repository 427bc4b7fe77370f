//! Executor allocation for `run_js`: a factory the host supplies, called lazily.

use std::sync::Arc;

use async_trait::async_trait;
use corral_catalog::{Catalog, Redactor};
use corral_sandbox::{
    Backend, CreateSessionError, ExecutorSession, Grants, InvocationContext, Sandbox, ScriptUser,
    SessionLimits, SessionOptions,
};

/// What an executor is created for.
#[derive(Clone)]
pub struct ExecutorRequest {
    /// The capabilities to bind (the authorized subset).
    pub catalog: Arc<Catalog>,
    /// The backend every call goes through (the run's journaling wrapper).
    pub backend: Arc<dyn Backend>,
    /// Attribution for calls; its `session_id` prefixes tool call ids.
    pub context: InvocationContext,
    /// The user shown to scripts.
    pub user: Option<ScriptUser>,
    /// Seed for `Math.random`, derived from the turn so a replay sees the same numbers.
    pub random_seed: u64,
}

impl std::fmt::Debug for ExecutorRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecutorRequest")
            .field("capabilities", &self.catalog.len())
            .field("context", &self.context)
            .field("user", &self.user)
            .finish_non_exhaustive()
    }
}

/// Creates executor sessions. Called at most once per uninterrupted run, on the first approved
/// `run_js`; never in direct mode.
#[async_trait]
pub trait ExecutorFactory: Send + Sync {
    /// A new executor session.
    async fn create(&self, request: ExecutorRequest)
    -> Result<ExecutorSession, CreateSessionError>;
}

/// The standard factory: sessions of a [`Sandbox`] with fixed limits, redaction and grants.
#[derive(Debug, Clone)]
pub struct SandboxExecutorFactory {
    sandbox: Sandbox,
    limits: SessionLimits,
    redactor: Arc<Redactor>,
    grants: Grants,
}

impl SandboxExecutorFactory {
    /// Sessions of `sandbox` with `limits`, no redaction and default grants (frozen clock).
    pub fn new(sandbox: Sandbox, limits: SessionLimits) -> Self {
        SandboxExecutorFactory {
            sandbox,
            limits,
            redactor: Arc::new(Redactor::default()),
            grants: Grants::default(),
        }
    }

    /// Applies `redactor` to every call result and error.
    pub fn with_redactor(mut self, redactor: Arc<Redactor>) -> Self {
        self.redactor = redactor;
        self
    }
}

#[async_trait]
impl ExecutorFactory for SandboxExecutorFactory {
    async fn create(
        &self,
        request: ExecutorRequest,
    ) -> Result<ExecutorSession, CreateSessionError> {
        let mut options = SessionOptions::new(request.catalog, request.backend);
        options.redactor = Arc::clone(&self.redactor);
        options.context = request.context;
        options.user = request.user;
        options.limits = self.limits.clone();
        let mut grants = self.grants.clone();
        // Replays must see the same numbers as the original run: the seed comes from the turn
        // unless the host granted real entropy.
        if matches!(grants.entropy, corral_sandbox::EntropyGrant::Seeded { .. }) {
            grants.entropy = corral_sandbox::EntropyGrant::Seeded {
                seed: request.random_seed,
            };
        }
        options.grants = grants;
        self.sandbox.session(options).await
    }
}
