//! The production [`TurnRunner`]: the chat runtime (`corral-chat`) driven by an agent's
//! manifest, journaling through the store under the session's lease.
//!
//! - The model comes from the manifest (`scripted` replies, or `openai`/`anthropic` with the key
//!   from the server's environment, never from the manifest).
//! - Capabilities: `builtin` ones run corral's example tools in-process, `webhook` ones are
//!   POSTed to their `webhookUrl`, `action` ones become actions that external executors claim
//!   (the turn waits until their result arrives).
//! - `mcpServers` are started lazily in one [`McpHub`] for the process (shared by every session
//!   of agents that declare the same server, stopped by [`ChatTurnRunner::shutdown`]); their
//!   tools are bound after the manifest's capabilities, their secrets (`{"secretRef": "NAME"}`,
//!   from `CORRAL_SECRET_NAME`) are redacted, and their tool lists are part of the checkpoint
//!   fingerprint, so a turn paused before a tool list changed is refused on resume.
//! - Every event the runtime emits is appended to the session's event stream under the fence.
//! - What a turn segment needs of its agent (the parsed manifest, the model, the catalog with the
//!   MCP tools bound, the backends, the redactor) is built once per agent definition (manifest
//!   hash and implementation version) and kept while the MCP hub's tool lists are unchanged, so a
//!   segment does not parse, compile and list again what the previous one built. A binding with
//!   a server that could not be started or listed is not kept: the next segment lists again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use corral_catalog::{Catalog, Redactor};
use corral_chat::backends::{RoutingBackend, WebhookBackend};
use corral_chat::{
    ApprovalPolicy, EventSink, HistoryCache, Input, ModelLimits, RunError, RunEvent, RunResult,
    SandboxExecutorFactory, SinkError, StoreJournal,
};
use corral_mcp::{EnvSecretResolver, McpHub, McpHubOptions, McpListError};
use corral_models::{Model, Provider, ProviderConfig, ScriptedModel};
use corral_sandbox::examples::{ExampleBackend, example_catalog};
use corral_sandbox::{Backend, InvocationContext, Sandbox, ScriptUser, SessionLimits};
use corral_store::NewEvent;
use serde_json::{Value, json};

use crate::manifest::{Approval, BUILTIN_CAPABILITIES, Manifest, Mode, ModelSpec};
use crate::runner::{Finished, TurnJob, TurnOutcome, TurnRunner};
use crate::tenancy::public_id;

/// Runs turns with the chat runtime in one shared [`Sandbox`], with one [`McpHub`] for the
/// agents' MCP servers.
#[derive(Debug, Clone)]
pub struct ChatTurnRunner {
    sandbox: Sandbox,
    mcp: McpHub,
    webhook_secret: Option<Arc<str>>,
    prepared: Arc<PreparedAgents>,
    /// The conversations of the sessions this process ran lately.
    history: Arc<HistoryCache>,
}

/// What a segment needs of its agent, built from its manifest.
struct Prepared {
    manifest: Manifest,
    model: Arc<dyn Model>,
    catalog: Arc<Catalog>,
    backend: Arc<dyn Backend>,
    actions: Vec<String>,
    redactor: Arc<Redactor>,
    /// The MCP tool lists' fingerprint (empty without servers).
    mcp_fingerprint: String,
}

/// Agents prepared by this process, by `manifest hash@implementation version`, each with the
/// MCP hub's generation it was listed at.
#[derive(Default)]
struct PreparedAgents(Mutex<HashMap<String, (u64, Arc<Prepared>)>>);

/// How many agent definitions are kept at most (all are dropped when more come).
const PREPARED_AGENTS: usize = 256;

impl std::fmt::Debug for PreparedAgents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kept = self.0.lock().map(|map| map.len()).unwrap_or(0);
        f.debug_struct("PreparedAgents")
            .field("kept", &kept)
            .finish()
    }
}

impl PreparedAgents {
    fn get(&self, key: &str, generation: u64) -> Option<Arc<Prepared>> {
        let map = self.0.lock().ok()?;
        map.get(key)
            .filter(|(at, _)| *at == generation)
            .map(|(_, prepared)| Arc::clone(prepared))
    }

    fn keep(&self, key: String, generation: u64, prepared: Arc<Prepared>) {
        if let Ok(mut map) = self.0.lock() {
            if map.len() >= PREPARED_AGENTS && !map.contains_key(&key) {
                map.clear();
            }
            map.insert(key, (generation, prepared));
        }
    }
}

impl ChatTurnRunner {
    /// A runner whose scripts run in `sandbox`; MCP secrets come from `CORRAL_SECRET_*`.
    pub fn new(sandbox: Sandbox) -> Self {
        let hub = McpHub::new(
            Arc::new(EnvSecretResolver::default()),
            McpHubOptions::default(),
        );
        ChatTurnRunner::with_mcp(sandbox, hub)
    }

    /// A runner whose agents' MCP servers live in `hub`.
    pub fn with_mcp(sandbox: Sandbox, hub: McpHub) -> Self {
        ChatTurnRunner {
            sandbox,
            mcp: hub,
            webhook_secret: None,
            prepared: Arc::default(),
            history: Arc::new(HistoryCache::new(HistoryCache::DEFAULT_CAPACITY)),
        }
    }

    /// The same runner, signing webhook calls with `secret` (the server's `webhookSecret`)
    /// unless a capability names its own.
    pub fn with_webhook_secret(mut self, secret: Option<String>) -> Self {
        self.webhook_secret = secret.map(Arc::from);
        self
    }

    /// What `job`'s segment needs of its agent: kept from an earlier segment of the same agent
    /// definition while the MCP tool lists are unchanged, else built (and kept when every MCP
    /// server could be listed). A manifest that cannot be used is the segment's failure.
    async fn prepare(&self, job: &TurnJob) -> Result<Arc<Prepared>, TurnOutcome> {
        let key = format!(
            "{}@{}",
            job.session.manifest_hash, job.session.implementation_version
        );
        let generation = self.mcp.generation();
        if let Some(prepared) = self.prepared.get(&key, generation) {
            return Ok(prepared);
        }
        let manifest = Manifest::from_value(&job.session.manifest)
            .map_err(|error| failed("invalid_manifest", error.to_string()))?;
        let (catalog, backend, actions) =
            manifest_capabilities(&manifest, self.webhook_secret.as_deref())
                .map_err(|error| failed("invalid_manifest", error))?;
        let model = model_for(&manifest.model).map_err(|error| failed("model_error", error))?;
        let bound = self
            .mcp
            .bind(
                &manifest.mcp_servers,
                Some(catalog),
                Some(Arc::new(backend)),
            )
            .await
            .map_err(|error| failed("mcp_error", error.to_string()))?;
        for error in &bound.errors {
            tracing::warn!(session = %job.session.id, "MCP: {error}");
        }
        // A server that could not be started or listed is listed again by the next segment; a
        // tool left out for its definition is left out the same way every time.
        let complete = !bound.errors.iter().any(|error| {
            matches!(
                error,
                McpListError::Start(_) | McpListError::ListTools { .. }
            )
        });
        let prepared = Arc::new(Prepared {
            manifest,
            model,
            catalog: Arc::new(bound.catalog),
            backend: bound.backend,
            actions,
            redactor: Arc::new(bound.redactor),
            mcp_fingerprint: bound.fingerprint,
        });
        if complete {
            self.prepared.keep(key, generation, Arc::clone(&prepared));
        }
        Ok(prepared)
    }

    /// Runs a segment; with `caller_ends`, what the journal still holds at the end is returned
    /// for the caller to commit with the outcome, instead of committed before it.
    async fn execute(&self, job: TurnJob, caller_ends: bool) -> Finished {
        let prepared = match self.prepare(&job).await {
            Ok(prepared) => prepared,
            Err(outcome) => return outcome.into(),
        };
        let manifest = &prepared.manifest;
        let mut fingerprint = format!(
            "{}@{}",
            job.session.manifest_hash, job.session.implementation_version
        );
        if !prepared.mcp_fingerprint.is_empty() {
            fingerprint.push_str("+mcp:");
            fingerprint.push_str(&prepared.mcp_fingerprint);
        }
        let redactor = Arc::clone(&prepared.redactor);
        let checkpoint = &job.checkpoint;
        // A checkpoint taken at a suspension carries the fingerprint it was taken under; an
        // approval keeps it. Resuming under another agent definition is refused.
        let suspended_elsewhere = checkpoint
            .fingerprint
            .as_deref()
            .is_some_and(|taken| taken != fingerprint);
        if suspended_elsewhere
            || (!checkpoint.pending.is_empty() && checkpoint.fingerprint.is_none())
        {
            return failed(
                "incompatible_checkpoint",
                "the agent's catalog, manifest or version changed since the turn paused",
            )
            .into();
        }
        let mut journal = StoreJournal::new(
            Arc::clone(&job.store),
            job.session.id.clone(),
            job.turn_id.clone(),
            Some(job.fence.clone()),
            job.segment,
        )
        .with_turn_effects(job.journal.clone())
        .with_history_cache(Arc::clone(&self.history));
        if caller_ends {
            journal = journal.leaving_its_end_to_the_caller();
        }
        let journal = Arc::new(journal);
        let sink = Arc::new(StoreSink {
            journal: Arc::clone(&journal),
            deltas: tokio::sync::Mutex::new((0, None)),
        });
        let factory = SandboxExecutorFactory::new(self.sandbox.clone(), limits_for(manifest))
            .with_redactor(Arc::clone(&redactor));
        let input = Input {
            model: Arc::clone(&prepared.model),
            limits: model_limits(manifest),
            store: Arc::clone(&journal) as Arc<dyn corral_chat::ConversationStore>,
            turn_id: job.turn_id.clone(),
            message: checkpoint.message.clone(),
            max_steps: manifest.max_steps.unwrap_or(16),
            sink: Arc::clone(&sink) as Arc<dyn EventSink>,
            backend: Arc::clone(&prepared.backend),
            redactor,
            capabilities: Arc::clone(&prepared.catalog),
            action_capabilities: prepared.actions.clone(),
            executor_factory: Some(Arc::new(factory)),
            instructions: manifest.instructions.clone(),
            direct_tools: manifest.mode == Mode::Direct,
            auto_confirm: manifest.auto_confirm,
            approval: match manifest.approval {
                Approval::Script => ApprovalPolicy::Script,
                Approval::Calls => ApprovalPolicy::Calls,
            },
            user: Some(script_user(&job.session)),
            context: InvocationContext {
                session_id: public_id(&job.session.id).to_owned(),
                tenant_id: Some(job.session.tenant_id.clone()),
                user_id: Some(job.session.owner_user_id.clone()),
                run_id: Some(job.turn_id.clone()),
                attributes: serde_json::Map::from_iter([(
                    "agentId".to_owned(),
                    Value::String(job.session.agent_id.clone()),
                )]),
            },
            fingerprint,
            decisions: checkpoint.decisions.clone(),
            resume: None,
            trace_context: checkpoint.trace_context.clone(),
        };
        // The run commits what its journal holds (events included) before it returns, unless
        // the caller ends it: then it is taken here, to be committed with the outcome.
        let result = corral_chat::run(&job.cancel, input).await;
        let held = match journal.take_held().await {
            Ok(held) => held,
            // A run whose last commit failed fails so (its own error first).
            Err(error) if result.is_ok() => {
                return failed("store_error", error.to_string()).into();
            }
            Err(_) => None,
        };
        let outcome = match result {
            Ok(RunResult::Completed {
                text,
                usage,
                steps,
                items,
            }) => TurnOutcome::Completed {
                output: json!({"text": text, "steps": steps, "usage": usage}),
                items,
            },
            Ok(RunResult::Suspended { suspension }) => TurnOutcome::Paused {
                checkpoint: suspension,
            },
            Ok(RunResult::Waiting { effect_ids }) => TurnOutcome::Waiting { effect_ids },
            Ok(RunResult::Uncertain { effect_ids }) => TurnOutcome::Uncertain { effect_ids },
            Ok(RunResult::StepBudgetExhausted { steps }) => failed(
                "step_budget_exhausted",
                format!("the model was still calling tools after {steps} steps"),
            ),
            Ok(RunResult::Cancelled) => TurnOutcome::Cancelled,
            Ok(RunResult::Failed { code, message }) => failed(&code, message),
            Ok(other) => failed("internal_error", format!("{other:?}")),
            Err(RunError::Render(error)) => failed("render_error", error.to_string()),
            Err(RunError::IncompatibleCheckpoint(message)) => {
                failed("incompatible_checkpoint", message)
            }
            Err(RunError::Usage(message)) => failed("invalid_manifest", message),
            Err(error) => failed("store_error", error.to_string()),
        };
        Finished { outcome, held }
    }

    /// Stops the MCP servers (at the server's shutdown).
    pub async fn shutdown(&self) {
        self.mcp.shutdown().await;
    }
}

/// Appends the runtime's events to the session's stream, through the run's journal: an event
/// goes in the journal's next commit, with the entry that caused it (see [`StoreJournal`]), so a
/// turn's events cost no commits of their own. Text deltas are committed by themselves only
/// when no other commit took them within [`DELTA_WINDOW`] or [`DELTA_BATCH`] of them, so a
/// streamed answer costs a few commits instead of one per token. Nothing is reordered and
/// nothing waits past the segment's end: what is still held then commits with the segment's
/// outcome (`finish_segment`), or before the run returns when the runner is called alone.
struct StoreSink {
    journal: Arc<StoreJournal>,
    /// Text deltas since the sink last asked for a commit, and when the first of them came.
    deltas: tokio::sync::Mutex<(usize, Option<std::time::Instant>)>,
}

/// How long a text delta may wait for others to be committed with it.
const DELTA_WINDOW: std::time::Duration = std::time::Duration::from_millis(20);
/// How many text deltas are committed at most in one commit.
const DELTA_BATCH: usize = 64;

#[async_trait]
impl EventSink for StoreSink {
    async fn emit(&self, event: RunEvent) -> Result<(), SinkError> {
        let delta = matches!(event.kind, corral_chat::RunEventKind::TextDelta { .. });
        let mut data = event.kind.data();
        if let Value::Object(map) = &mut data {
            map.insert("step".into(), json!(event.step));
        }
        let new = NewEvent::new(event.kind.type_name(), data).in_turn(event.run_id);
        let mut deltas = self.deltas.lock().await;
        let due = delta && {
            deltas.0 += 1;
            let since = *deltas.1.get_or_insert_with(std::time::Instant::now);
            deltas.0 >= DELTA_BATCH || since.elapsed() >= DELTA_WINDOW
        };
        if due {
            *deltas = (0, None);
        }
        // The lock is held across the append, so events are held in the order they came.
        self.journal
            .append_events(vec![new], due)
            .await
            .map_err(|e| SinkError(e.to_string()))
    }
}

fn failed(code: &str, message: impl Into<String>) -> TurnOutcome {
    TurnOutcome::Failed {
        code: code.to_string(),
        message: message.into(),
    }
}

/// The catalog, backend and action capabilities an agent's manifest declares.
///
/// Webhook requests are signed (see [`corral_chat::backends`]) with the capability's own
/// secret (`"webhookSecretRef": "NAME"`, read from `CORRAL_SECRET_NAME`) or else the server's
/// `webhook_secret`; a reference to a secret the environment does not hold is an error.
pub fn manifest_capabilities(
    manifest: &Manifest,
    webhook_secret: Option<&str>,
) -> Result<(Catalog, RoutingBackend, Vec<String>), String> {
    let examples = example_catalog();
    let mut definitions = Vec::new();
    let mut backend = RoutingBackend::default();
    let mut actions = Vec::new();
    let builtin: Arc<dyn Backend> = Arc::new(ExampleBackend);
    for capability in &manifest.capabilities {
        let Some(object) = capability.as_object() else {
            return Err("a capability is not an object".into());
        };
        let mut definition = object.clone();
        let kind = definition
            .remove("kind")
            .and_then(|k| k.as_str().map(str::to_string))
            .unwrap_or_default();
        let webhook = definition.remove("webhookUrl");
        let secret_ref = definition.remove("webhookSecretRef");
        let id = definition
            .get("id")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        match kind.as_str() {
            "builtin" => {
                if !BUILTIN_CAPABILITIES.contains(&id.as_str()) {
                    return Err(format!("{id} is not a builtin capability"));
                }
                if !definition.contains_key("input_schema")
                    && let Some((_, example)) = examples.get(&id)
                {
                    let mut full = serde_json::to_value(example)
                        .map_err(|e| e.to_string())?
                        .as_object()
                        .cloned()
                        .unwrap_or_default();
                    if let Some(needs) = definition.get("needs_approval") {
                        full.insert("needs_approval".into(), needs.clone());
                    }
                    definition = full;
                }
                backend.route(id.clone(), Arc::clone(&builtin));
            }
            "webhook" => {
                let url = webhook
                    .and_then(|u| u.as_str().map(str::to_string))
                    .unwrap_or_default();
                let mut webhook = WebhookBackend::new(&url).map_err(|e| format!("{id}: {e}"))?;
                let secret = match secret_ref.as_ref().and_then(Value::as_str) {
                    Some(name) => {
                        Some(std::env::var(format!("CORRAL_SECRET_{name}")).map_err(|_| {
                            format!(
                                "{id}: webhookSecretRef {name:?}: CORRAL_SECRET_{name} is not set"
                            )
                        })?)
                    }
                    None => webhook_secret.map(str::to_owned),
                };
                if let Some(secret) = secret {
                    webhook = webhook.signed(secret);
                }
                backend.route(id.clone(), Arc::new(webhook));
            }
            "action" => actions.push(id.clone()),
            other => return Err(format!("{id}: unknown capability kind {other:?}")),
        }
        definitions.push(Value::Object(definition));
    }
    let catalog = Catalog::from_json_str(&json!({ "capabilities": definitions }).to_string())
        .map_err(|e| e.to_string())?;
    Ok((catalog, backend, actions))
}

fn model_for(spec: &ModelSpec) -> Result<Arc<dyn Model>, String> {
    match spec {
        ModelSpec::Scripted { replies } => {
            let text = serde_json::to_string(replies).map_err(|e| e.to_string())?;
            ScriptedModel::from_json_str(&text)
                .map(|m| Arc::new(m) as Arc<dyn Model>)
                .map_err(|e| e.to_string())
        }
        ModelSpec::Openai { model, base_url } | ModelSpec::Anthropic { model, base_url } => {
            let provider = if matches!(spec, ModelSpec::Openai { .. }) {
                Provider::OpenAi
            } else {
                Provider::Anthropic
            };
            let mut config =
                ProviderConfig::from_env(provider, model.clone()).map_err(|e| e.to_string())?;
            if let Some(url) = base_url {
                config.base_url = Some(url.clone());
            }
            config.build().map_err(|e| e.to_string())
        }
    }
}

/// The model-facing budgets the manifest sets, the defaults for the rest.
fn model_limits(manifest: &Manifest) -> ModelLimits {
    let defaults = ModelLimits::default();
    ModelLimits {
        result_tokens: manifest.result_tokens.unwrap_or(defaults.result_tokens),
        discovery_tokens: manifest
            .discovery_tokens
            .unwrap_or(defaults.discovery_tokens),
        ..defaults
    }
}

fn limits_for(manifest: &Manifest) -> SessionLimits {
    let mut limits = SessionLimits::default();
    if let Some(given) = &manifest.limits {
        if let Some(fuel) = given.fuel {
            limits.fuel = fuel;
        }
        if let Some(timeout) = given.timeout_ms {
            limits.timeout_ms = timeout;
        }
        if let Some(mb) = given.memory_mb {
            limits.memory_bytes = mb.saturating_mul(1 << 20);
        }
        if let Some(n) = given.max_concurrent_calls {
            limits.max_concurrent_calls = n;
        }
        if let Some(n) = given.max_total_calls {
            limits.max_total_calls = n;
        }
    }
    limits
}

/// The script's `user`: the session's owner with the display fields of its creation `info`.
fn script_user(session: &corral_store::Session) -> ScriptUser {
    let info = &session.creation["info"];
    ScriptUser {
        id: session.owner_user_id.clone(),
        email: info["email"].as_str().map(str::to_string),
        display_name: info["displayName"].as_str().map(str::to_string),
    }
}

#[async_trait]
impl TurnRunner for ChatTurnRunner {
    async fn check(&self, manifest: &Manifest, start_mcp: bool) -> Result<(), String> {
        model_for(&manifest.model).map_err(|error| format!("manifest.model: {error}"))?;
        let (catalog, backend, _) = manifest_capabilities(manifest, self.webhook_secret.as_deref())
            .map_err(|error| format!("manifest.capabilities: {error}"))?;
        if start_mcp && !manifest.mcp_servers.is_empty() {
            let bound = self
                .mcp
                .bind(
                    &manifest.mcp_servers,
                    Some(catalog),
                    Some(Arc::new(backend)),
                )
                .await
                .map_err(|error| format!("manifest.mcpServers: {error}"))?;
            if let Some(error) = bound.errors.first() {
                return Err(format!("manifest.mcpServers: {error}"));
            }
        }
        Ok(())
    }

    async fn run(&self, job: TurnJob) -> TurnOutcome {
        self.execute(job, false).await.outcome
    }

    async fn run_segment(&self, job: TurnJob) -> Finished {
        self.execute(job, true).await
    }
}
