//! The run loop: model steps, tool calls one at a time, gates, suspension, replay.

use std::collections::BTreeMap;
use std::sync::Arc;

use corral_catalog::{Catalog, render_prompt_within};
use corral_models::{
    Message, ModelRequest, ModelResponse, RetryPolicy, ToolCall, ToolSpec, Usage, call_with_retry,
};
use corral_sandbox::{ExecError, ExecutorSession, Invocation, InvocationContext};
use corral_store::EffectKind;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::compaction::{estimate_tokens, split_point, summary_request};
use crate::emit::Emitter;
use crate::executor::ExecutorRequest;
use crate::fit::{MIN_RESULT_TOKENS, fit_to_budget};
use crate::journal::{ConversationStore, JournalError, Journaled};
use crate::replay::{CallJournal, CallOutcome, ReplaySchedule, ScriptBackend};
use crate::sink::RunEventKind;
use crate::types::{
    ConversationItem, Decision, Input, Interaction, RunError, RunResult, SuspensionContext,
    conversation_from_items, summary_message,
};
use crate::util::{sha256_canonical, sha256_json, stable_u64};

/// The name of the one model tool in JS mode.
pub const RUN_JS: &str = "run_js";

/// The `run_js` tool: its description is the rendered prompt; its one argument is
/// `{"code": SCRIPT}`.
pub fn run_js_tool(description: String) -> ToolSpec {
    ToolSpec {
        name: RUN_JS.to_string(),
        description,
        input_schema: json!({
            "type": "object",
            "properties": {"code": {"type": "string", "description": "The JavaScript program: the body of an async function."}},
            "required": ["code"],
            "additionalProperties": false,
        }),
    }
}

/// The model tool name of a capability in direct mode: its id with `.` as `__` (providers
/// accept `[A-Za-z0-9_-]` only).
pub fn direct_tool_name(capability_id: &str) -> String {
    capability_id.replace('.', "__")
}

/// Checks that `suspension` can resume a run of `input`'s turn: same turn, a permission
/// suspension (something pending), and the same fingerprint.
pub fn check_suspension(suspension: &SuspensionContext, input: &Input) -> Result<(), RunError> {
    if suspension.turn_id != input.turn_id {
        return Err(RunError::IncompatibleCheckpoint(format!(
            "the checkpoint belongs to turn {}, not {}",
            suspension.turn_id, input.turn_id
        )));
    }
    if suspension.pending.is_empty() {
        return Err(RunError::IncompatibleCheckpoint(
            "the checkpoint is not a permission suspension (nothing is pending)".into(),
        ));
    }
    if suspension.fingerprint.as_deref() != Some(input.fingerprint.as_str()) {
        return Err(RunError::IncompatibleCheckpoint(
            "the catalog, manifest or implementation version changed since the turn was suspended"
                .into(),
        ));
    }
    Ok(())
}

/// Runs (or re-runs, from the journal) one turn until it completes, suspends, waits, fails or
/// is cancelled through `ctx`. The executor, if one was allocated, is closed on every exit.
///
/// The run is one `invoke_agent {agent}` span (docs/tracing.md): a child of the command that
/// started the turn ([`Input::trace_context`]) on its first run, a new trace linked to it when
/// the turn is resumed (after an approval, an executor's result or a restart).
pub async fn run(ctx: &CancellationToken, input: Input) -> Result<RunResult, RunError> {
    use tracing::Instrument as _;
    let span = agent_span(&input).await;
    let result = run_turn(ctx, input).instrument(span.clone()).await;
    let outcome = match &result {
        Ok(RunResult::Completed { usage, .. }) => {
            span.record("gen_ai.usage.input_tokens", usage.input_tokens);
            span.record("gen_ai.usage.output_tokens", usage.output_tokens);
            "completed"
        }
        Ok(RunResult::Suspended { suspension }) => {
            tracing::info!(target: corral_telemetry::TARGET, parent: &span, interactions = suspension.pending.len(), "turn.suspended");
            "suspended"
        }
        Ok(RunResult::Waiting { effect_ids }) => {
            tracing::info!(target: corral_telemetry::TARGET, parent: &span, effect_ids = ?effect_ids, "turn.waiting");
            "waiting"
        }
        Ok(RunResult::Uncertain { effect_ids }) => {
            tracing::info!(target: corral_telemetry::TARGET, parent: &span, effect_ids = ?effect_ids, "effect.uncertain");
            "uncertain"
        }
        Ok(RunResult::StepBudgetExhausted { .. }) => "step_budget_exhausted",
        Ok(RunResult::Cancelled) => "cancelled",
        Ok(RunResult::Failed { code, .. }) => {
            span.record("error.type", code.as_str());
            span.record("otel.status_code", "ERROR");
            "failed"
        }
        Err(error) => {
            span.record("otel.status_code", "ERROR");
            span.record("error.type", error.to_string().as_str());
            "error"
        }
    };
    span.record("corral.outcome", outcome);
    result
}

/// The `invoke_agent` span of one run of `input`'s turn, with its attribution; see [`run`].
async fn agent_span(input: &Input) -> tracing::Span {
    let agent = input
        .context
        .attributes
        .get("agentId")
        .and_then(Value::as_str)
        .unwrap_or("corral");
    let session = if input.context.session_id.is_empty() {
        input.turn_id.as_str()
    } else {
        input.context.session_id.as_str()
    };
    let name = format!("invoke_agent {agent}");
    let span = tracing::info_span!(
        target: corral_telemetry::TARGET,
        parent: None,
        "invoke_agent",
        otel.name = name.as_str(),
        otel.kind = "internal",
        otel.status_code = tracing::field::Empty,
        gen_ai.operation.name = "invoke_agent",
        gen_ai.agent.name = agent,
        gen_ai.conversation.id = session,
        corral.session = session,
        corral.tenant = input.context.tenant_id.as_deref().unwrap_or_default(),
        corral.owner = input.context.user_id.as_deref().unwrap_or_default(),
        corral.turn_id = input.turn_id.as_str(),
        corral.resumed = tracing::field::Empty,
        corral.outcome = tracing::field::Empty,
        gen_ai.usage.input_tokens = tracing::field::Empty,
        gen_ai.usage.output_tokens = tracing::field::Empty,
        error.type = tracing::field::Empty,
    );
    if !corral_telemetry::enabled() || span.is_disabled() {
        return span;
    }
    // A run that finds its first model call journaled (or decisions taken) continues the turn.
    let resumed = input.resume.is_some()
        || !input.decisions.is_empty()
        || matches!(
            input
                .store
                .lookup(&format!("{}:s0:model", input.turn_id))
                .await,
            Ok(Some(_))
        );
    span.record("corral.resumed", resumed);
    if let Some(origin) = input.trace_context.as_deref() {
        if resumed {
            // Some trace stores (Phoenix) keep no links: the origin is an attribute as well.
            corral_telemetry::add_link(&span, origin);
            corral_telemetry::set_attribute(&span, "corral.trace.origin", origin.to_owned());
            tracing::info!(target: corral_telemetry::TARGET, parent: &span, "turn.resumed");
        } else {
            corral_telemetry::set_remote_parent(&span, origin, None);
        }
    }
    span
}

async fn run_turn(ctx: &CancellationToken, input: Input) -> Result<RunResult, RunError> {
    if input.max_steps == 0 {
        return Err(RunError::Usage("the step budget must be positive".into()));
    }
    if input.limits.max_output >= input.limits.context_window {
        return Err(RunError::Usage(
            "max_output must be smaller than the context window".into(),
        ));
    }
    let tools = if input.direct_tools {
        let mut tools: Vec<ToolSpec> = Vec::new();
        for capability in input.capabilities.capabilities() {
            let name = direct_tool_name(&capability.id);
            if tools.iter().any(|t| t.name == name) {
                return Err(RunError::Usage(format!(
                    "two capabilities map to the direct tool name {name}"
                )));
            }
            tools.push(ToolSpec {
                name,
                description: capability.description.clone().unwrap_or_default(),
                input_schema: capability.input_schema.clone(),
            });
        }
        // Rendering is still checked, so a schema the model could not be shown fails here too.
        corral_catalog::render_typescript(&input.capabilities)?;
        tools
    } else {
        if input.executor_factory.is_none() {
            return Err(RunError::Usage("JS mode needs an executor factory".into()));
        }
        vec![run_js_tool(
            render_prompt_within(&input.capabilities, input.limits.discovery_tokens)?.text,
        )]
    };
    let script_catalog = if input.direct_tools {
        Arc::clone(&input.capabilities)
    } else {
        Arc::new(
            crate::intrinsics::script_catalog(&input.capabilities).map_err(|error| {
                RunError::Usage(format!(
                    "the catalog collides with the runtime's own `tools.$…` functions: {error}"
                ))
            })?,
        )
    };
    let mut decisions = input.decisions.clone();
    if let Some(resume) = &input.resume {
        check_suspension(&resume.suspension, &input)?;
        for (id, decision) in &resume.suspension.decisions {
            decisions
                .entry(id.clone())
                .or_insert_with(|| decision.clone());
        }
        for pending in &resume.suspension.pending {
            decisions
                .entry(pending.interaction_id.clone())
                .or_insert_with(|| Decision {
                    approved: resume.approved,
                    reason: resume.reason.clone(),
                    value: None,
                });
        }
    }

    let store = Arc::clone(&input.store);
    let (history, prior_model_calls) =
        futures::try_join!(store.history(), store.model_calls_before(&input.turn_id))?;
    let emitter = Arc::new(Emitter::new(Arc::clone(&input.sink), input.turn_id.clone()));
    let journal = Arc::new(CallJournal {
        store: Arc::clone(&store),
        inner: Arc::clone(&input.backend),
        catalog: Arc::clone(&input.capabilities),
        actions: input.action_capabilities.clone(),
        turn_id: input.turn_id.clone(),
        policy: input.approval,
        auto_confirm: input.auto_confirm,
        decisions: decisions.clone(),
        emitter: Arc::clone(&emitter),
        tool_id: Default::default(),
        held: Default::default(),
        unflushed: Default::default(),
        span: std::sync::Mutex::new(tracing::Span::none()),
        redactor: Arc::clone(&input.redactor),
        costs: Default::default(),
    });
    let mut messages = conversation_from_items(&history);
    let user = Message::User {
        content: input.message.clone(),
    };
    messages.push(user.clone());
    let mut turn = Turn {
        ctx,
        system: compose_system(&input),
        input: &input,
        store,
        emitter,
        journal: Arc::clone(&journal),
        script_backend: Arc::new(ScriptBackend {
            journal,
            step: Default::default(),
        }),
        decisions,
        executor: None,
        script_catalog,
        tools,
        messages,
        items: vec![ConversationItem::Message { message: user }],
        model_calls: prior_model_calls,
        usage: Usage::default(),
    };
    let result = turn.run().await;
    // Closing the executor on every exit: completion, suspension, waiting, failure, cancel.
    turn.executor = None;
    // What the journal still holds back is durable before the run's outcome is.
    if let Err(error) = turn.store.end().await
        && result.is_ok()
    {
        return Err(RunError::Store(error));
    }
    if let Some(failure) = turn.emitter.failure() {
        return Ok(RunResult::Failed {
            code: "sink_error".into(),
            message: failure,
        });
    }
    result
}

fn compose_system(input: &Input) -> String {
    input.instructions.clone()
}

/// A tool call's end: a result for the model, or the end of the run.
enum ToolEnd {
    Result { content: String, is_error: bool },
    Stop(RunResult),
}

struct Turn<'a> {
    ctx: &'a CancellationToken,
    input: &'a Input,
    system: String,
    store: Arc<dyn ConversationStore>,
    emitter: Arc<Emitter>,
    journal: Arc<CallJournal>,
    script_backend: Arc<ScriptBackend>,
    decisions: BTreeMap<String, Decision>,
    executor: Option<ExecutorSession>,
    /// What scripts are bound to: the authorized capabilities and the runtime's `tools.$…`.
    script_catalog: Arc<Catalog>,
    tools: Vec<ToolSpec>,
    messages: Vec<Message>,
    items: Vec<ConversationItem>,
    /// Model calls of the conversation so far (earlier turns and this one).
    model_calls: u64,
    usage: Usage,
}

fn failed(code: &str, message: impl Into<String>) -> RunResult {
    RunResult::Failed {
        code: code.to_string(),
        message: message.into(),
    }
}

fn journal_stop(error: JournalError) -> Result<RunResult, RunError> {
    match error {
        JournalError::Drift { effect_id } => Ok(failed(
            "effect_drift",
            format!(
                "effect {effect_id} was journaled with a different request: the turn no longer replays the same way"
            ),
        )),
        other => Err(RunError::Store(other)),
    }
}

impl Turn<'_> {
    async fn run(&mut self) -> Result<RunResult, RunError> {
        let turn_id = self.input.turn_id.clone();
        for step in 0..self.input.max_steps {
            self.script_backend
                .step
                .store(step, std::sync::atomic::Ordering::Relaxed);
            if let Some(stop) = self.compact_if_needed(step).await? {
                return Ok(stop);
            }
            let request = self.request();
            let response = match self
                .model_effect(step, &format!("{turn_id}:s{step}:model"), request, true)
                .await?
            {
                Ok(response) => response,
                Err(stop) => return Ok(stop),
            };
            self.usage.input_tokens += response.usage.input_tokens;
            self.usage.output_tokens += response.usage.output_tokens;
            let assistant = Message::Assistant {
                text: response.text.clone(),
                tool_calls: response.tool_calls.clone(),
            };
            self.push(assistant);
            if response.tool_calls.is_empty() {
                return Ok(RunResult::Completed {
                    text: response.text,
                    usage: self.usage,
                    steps: step + 1,
                    items: self
                        .items
                        .iter()
                        .filter_map(|item| serde_json::to_value(item).ok())
                        .collect(),
                });
            }
            for (k, call) in response.tool_calls.iter().enumerate() {
                let tool_id = format!("{turn_id}:s{step}:t{k}");
                match self.tool_call(step, &tool_id, call).await? {
                    ToolEnd::Result { content, is_error } => self.push(Message::Tool {
                        tool_call_id: call.id.clone(),
                        content,
                        is_error,
                    }),
                    ToolEnd::Stop(result) => return Ok(result),
                }
            }
        }
        Ok(RunResult::StepBudgetExhausted {
            steps: self.input.max_steps,
        })
    }

    fn push(&mut self, message: Message) {
        self.items.push(ConversationItem::Message {
            message: message.clone(),
        });
        self.messages.push(message);
    }

    fn request(&self) -> ModelRequest {
        ModelRequest {
            system: self.system.clone(),
            messages: self.messages.clone(),
            tools: self.tools.clone(),
            max_output_tokens: self.input.limits.max_output,
            call_index: self.model_calls,
        }
    }

    /// Summarizes older messages when the next request would not fit the model's limits.
    async fn compact_if_needed(&mut self, step: u32) -> Result<Option<RunResult>, RunError> {
        let budget = (self.input.limits.context_window - self.input.limits.max_output) as usize;
        let before = estimate_tokens(&self.request());
        if before <= budget {
            return Ok(None);
        }
        let Some(split) = split_point(&self.messages, budget / 2) else {
            return Ok(None);
        };
        let summary = summary_request(
            &self.messages[..split],
            self.input.limits.max_output.min(1024),
            self.model_calls,
        );
        let effect_id = format!("{}:s{step}:compact", self.input.turn_id);
        let was_new = self.store.lookup(&effect_id).await?.is_none();
        let response = match self.model_effect(step, &effect_id, summary, false).await? {
            Ok(response) => response,
            Err(stop) => return Ok(Some(stop)),
        };
        let kept = self.messages[split..].to_vec();
        self.items = vec![ConversationItem::Compaction {
            summary: response.text.clone(),
            kept: kept.clone(),
        }];
        let mut messages = vec![summary_message(&response.text)];
        messages.extend(kept);
        self.messages = messages;
        if was_new {
            let after = estimate_tokens(&self.request());
            self.emitter
                .emit(
                    step,
                    RunEventKind::Compaction {
                        summarized_messages: split,
                        kept_messages: self.messages.len() - 1,
                        tokens_before: before,
                        tokens_after: after,
                    },
                )
                .await;
        }
        Ok(None)
    }

    /// One model call through the journal, in a `chat {model}` span. `Ok(Err(stop))` ends the
    /// run.
    async fn model_effect(
        &mut self,
        step: u32,
        effect_id: &str,
        request: ModelRequest,
        stream_text: bool,
    ) -> Result<Result<ModelResponse, RunResult>, RunError> {
        use tracing::Instrument as _;
        let described = self.input.model.describe();
        let (provider, model) = described
            .split_once(':')
            .unwrap_or((described.as_str(), described.as_str()));
        let name = format!("chat {model}");
        let span = tracing::info_span!(
            target: corral_telemetry::TARGET,
            "chat",
            otel.name = name.as_str(),
            otel.kind = "client",
            otel.status_code = tracing::field::Empty,
            gen_ai.operation.name = "chat",
            gen_ai.provider.name = provider,
            gen_ai.request.model = model,
            gen_ai.request.max_tokens = request.max_output_tokens,
            corral.effect_id = effect_id,
            corral.step = step,
            corral.replayed = tracing::field::Empty,
            corral.time_to_first_chunk_ms = tracing::field::Empty,
            corral.chunks = tracing::field::Empty,
            gen_ai.usage.input_tokens = tracing::field::Empty,
            gen_ai.usage.output_tokens = tracing::field::Empty,
            gen_ai.response.finish_reasons = tracing::field::Empty,
            gen_ai.input.messages = tracing::field::Empty,
            gen_ai.output.messages = tracing::field::Empty,
            error.type = tracing::field::Empty,
        );
        if corral_telemetry::capture_content() && !span.is_disabled() {
            let mut messages = serde_json::to_value(&request.messages).unwrap_or(Value::Null);
            self.input.redactor.redact_json(&mut messages);
            span.record("gen_ai.input.messages", messages.to_string());
        }
        let result = self
            .model_call(step, effect_id, request, stream_text)
            .instrument(span.clone())
            .await;
        match &result {
            Ok(Ok(response)) => {
                span.record("gen_ai.usage.input_tokens", response.usage.input_tokens);
                span.record("gen_ai.usage.output_tokens", response.usage.output_tokens);
                let reason = match &response.stop_reason {
                    corral_models::StopReason::Other(reason) => reason.clone(),
                    known => serde_json::to_value(known)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_owned))
                        .unwrap_or_default(),
                };
                span.record("gen_ai.response.finish_reasons", reason.as_str());
                if corral_telemetry::capture_content() && !span.is_disabled() {
                    let mut output =
                        json!({"text": response.text, "toolCalls": response.tool_calls});
                    self.input.redactor.redact_json(&mut output);
                    span.record("gen_ai.output.messages", output.to_string());
                }
            }
            Ok(Err(RunResult::Failed { code, .. })) => {
                span.record("error.type", code.as_str());
                span.record("otel.status_code", "ERROR");
            }
            _ => {}
        }
        result
    }

    async fn model_call(
        &mut self,
        step: u32,
        effect_id: &str,
        request: ModelRequest,
        stream_text: bool,
    ) -> Result<Result<ModelResponse, RunResult>, RunError> {
        // The digest of the request as a `Value` would give it (journals written before hold
        // it), without building one of the whole conversation.
        let request_sha256 =
            sha256_canonical(&request).unwrap_or_else(|_| sha256_json(&Value::Null));
        let journal_request = json!({
            "model": self.input.model.describe(),
            "callIndex": request.call_index,
            "sha256": request_sha256,
        });
        self.model_calls += 1;
        let journaled = match self
            .store
            .begin(
                &self.input.turn_id,
                effect_id,
                EffectKind::ModelCall,
                journal_request,
                None,
            )
            .await
        {
            Ok(journaled) => journaled,
            Err(error) => return journal_stop(error).map(Err),
        };
        let span = tracing::Span::current();
        span.record(
            "corral.replayed",
            matches!(journaled, Journaled::Completed(_)),
        );
        match journaled {
            Journaled::Completed(outcome) => return Ok(model_outcome(outcome)),
            Journaled::Uncertain => {
                tracing::info!(target: corral_telemetry::TARGET, effect_id, "effect.uncertain");
                return Ok(Err(RunResult::Uncertain {
                    effect_ids: vec![effect_id.to_string()],
                }));
            }
            Journaled::Pending => {
                tracing::info!(target: corral_telemetry::TARGET, effect_id, "effect.retried");
                self.store.restart(effect_id).await?
            }
            Journaled::New => {}
        }
        let started = std::time::Instant::now();
        let mut chunks = 0u64;
        let (deltas, mut receiver) = tokio::sync::mpsc::unbounded_channel::<String>();
        let model = Arc::clone(&self.input.model);
        let policy = RetryPolicy::default();
        let call = call_with_retry(model.as_ref(), &request, &policy, move |delta: &str| {
            if stream_text {
                let _ = deltas.send(delta.to_string());
            }
        });
        let mut call = std::pin::pin!(call);
        let result = loop {
            tokio::select! {
                biased;
                () = self.ctx.cancelled() => return Ok(Err(RunResult::Cancelled)),
                Some(text) = receiver.recv() => {
                    if chunks == 0 {
                        span.record("corral.time_to_first_chunk_ms", elapsed_ms(started));
                    }
                    chunks += 1;
                    self.emitter.emit(step, RunEventKind::TextDelta { text }).await;
                }
                result = &mut call => break result,
            }
        };
        span.record("corral.chunks", chunks);
        while let Ok(text) = receiver.try_recv() {
            self.emitter
                .emit(step, RunEventKind::TextDelta { text })
                .await;
        }
        let outcome = match &result {
            Ok(response) => json!({"ok": response}),
            Err(error) => json!({"error": {"code": error.code(), "message": error.to_string()}}),
        };
        self.store.complete(effect_id, outcome.clone()).await?;
        Ok(model_outcome(outcome))
    }

    /// One tool call of the model in an `execute_tool {tool}` span: `run_js` (the script's
    /// costs on the span, each capability call a child span) or a direct capability.
    async fn tool_call(
        &mut self,
        step: u32,
        tool_id: &str,
        call: &ToolCall,
    ) -> Result<ToolEnd, RunError> {
        use tracing::Instrument as _;
        let name = format!("execute_tool {}", call.name);
        let span = tracing::info_span!(
            target: corral_telemetry::TARGET,
            "execute_tool",
            otel.name = name.as_str(),
            otel.kind = "internal",
            otel.status_code = tracing::field::Empty,
            gen_ai.operation.name = "execute_tool",
            gen_ai.tool.name = call.name.as_str(),
            gen_ai.tool.call.id = call.id.as_str(),
            corral.effect_id = tool_id,
            corral.step = step,
            corral.replayed = tracing::field::Empty,
            corral.fuel = tracing::field::Empty,
            corral.wall_us = tracing::field::Empty,
            corral.peak_memory_bytes = tracing::field::Empty,
            corral.calls = tracing::field::Empty,
            corral.peak_concurrent_calls = tracing::field::Empty,
            corral.limit = tracing::field::Empty,
            corral.is_error = tracing::field::Empty,
            gen_ai.tool.call.arguments = tracing::field::Empty,
            gen_ai.tool.call.result = tracing::field::Empty,
            error.type = tracing::field::Empty,
        );
        if corral_telemetry::capture_content() && !span.is_disabled() {
            let mut arguments = call.arguments.clone();
            self.input.redactor.redact_json(&mut arguments);
            span.record("gen_ai.tool.call.arguments", arguments.to_string());
        }
        self.journal.set_span(span.clone());
        let end = self
            .tool_call_traced(step, tool_id, call)
            .instrument(span.clone())
            .await;
        self.journal.set_span(tracing::Span::none());
        if let Ok(ToolEnd::Result { content, is_error }) = &end {
            span.record("corral.is_error", *is_error);
            if *is_error {
                span.record("otel.status_code", "ERROR");
            }
            if corral_telemetry::capture_content() && !span.is_disabled() {
                span.record(
                    "gen_ai.tool.call.result",
                    &*self.input.redactor.redact_text(content),
                );
            }
        }
        end
    }

    async fn tool_call_traced(
        &mut self,
        step: u32,
        tool_id: &str,
        call: &ToolCall,
    ) -> Result<ToolEnd, RunError> {
        let turn_id = self.input.turn_id.clone();
        let result_id = format!("{tool_id}:result");
        let span = tracing::Span::current();
        if let Some(Journaled::Completed(done)) = self.store.lookup(&result_id).await? {
            // Taken from the journal: what the script cost when it ran, not run again.
            span.record("corral.replayed", true);
            for (field, key) in [("corral.fuel", "fuel"), ("corral.wall_us", "wallUs")] {
                if let Some(value) = done[key].as_u64() {
                    span.record(field, value);
                }
            }
            // What the model was shown: the cut form when the whole did not fit.
            let shown = done.get("shown").unwrap_or(&done["content"]);
            return Ok(ToolEnd::Result {
                content: shown.as_str().unwrap_or_default().to_string(),
                is_error: done["isError"].as_bool().unwrap_or(false),
            });
        }
        let started = match self
            .store
            .record(
                &turn_id,
                &format!("{tool_id}:started"),
                EffectKind::Script,
                json!({"name": call.name, "argumentsSha256": sha256_json(&call.arguments)}),
                json!({}),
            )
            .await
        {
            Ok(started) => started,
            Err(error) => return journal_stop(error).map(ToolEnd::Stop),
        };
        if started == Journaled::New {
            self.emitter
                .tool_started(step, &call.id, &call.name, &call.arguments)
                .await;
        }
        let started_at = std::time::Instant::now();
        let end = if self.input.direct_tools {
            self.direct_call(step, tool_id, call).await?
        } else if call.name == RUN_JS {
            self.run_js(step, tool_id, call).await?
        } else {
            Ok((
                format!("unknown tool {}: the only tool is {RUN_JS}", call.name),
                true,
                (0, 0),
            ))
        };
        let (content, is_error, (fuel, calls)) = match end {
            Ok(done) => done,
            Err(stop) => return Ok(ToolEnd::Stop(stop)),
        };
        let wall_us = u64::try_from(started_at.elapsed().as_micros()).unwrap_or(u64::MAX);
        let call_costs = self.journal.take_costs();
        span.record("corral.replayed", false);
        span.record("corral.fuel", fuel);
        span.record("corral.wall_us", wall_us);
        span.record("corral.calls", calls);
        let budget = self.input.limits.result_tokens as usize;
        let in_script = !self.input.direct_tools && call.name == RUN_JS;
        let fitted = fit_content(&content, budget, in_script.then(|| result_id_of(tool_id)));
        let mut record = json!({"tool": call.name, "content": content, "isError": is_error, "fuel": fuel, "wallUs": wall_us, "calls": calls});
        if let Some((shown, whole_bytes, _)) = &fitted {
            // The whole stays in the journal (for `tools.$result`); the model gets `shown`.
            record["shown"] = Value::String(shown.clone());
            record["wholeBytes"] = Value::from(*whole_bytes);
        }
        let recorded = match self
            .store
            .record(
                &turn_id,
                &result_id,
                EffectKind::Script,
                json!({"name": call.name, "argumentsSha256": sha256_json(&call.arguments)}),
                record,
            )
            .await
        {
            Ok(recorded) => recorded,
            Err(error) => return journal_stop(error).map(ToolEnd::Stop),
        };
        let (content, whole_bytes, result) = match fitted {
            Some((shown, whole_bytes, value)) => (shown, Some(whole_bytes), value),
            None => {
                let value =
                    serde_json::from_str(&content).unwrap_or(Value::String(content.clone()));
                (content, None, value)
            }
        };
        if recorded == Journaled::New {
            self.emitter
                .emit(
                    step,
                    RunEventKind::ToolFinished {
                        tool_call_id: call.id.clone(),
                        name: call.name.clone(),
                        result,
                        is_error,
                        fuel,
                        wall_us,
                        calls,
                        whole_bytes,
                        call_costs,
                    },
                )
                .await;
        }
        Ok(ToolEnd::Result { content, is_error })
    }

    /// Persists the checkpoint, then announces the permission requests (each once per turn).
    async fn suspend(
        &mut self,
        step: u32,
        pending: Vec<Interaction>,
    ) -> Result<RunResult, RunError> {
        let suspension = SuspensionContext {
            version: 1,
            turn_id: self.input.turn_id.clone(),
            message: self.input.message.clone(),
            pending: pending.clone(),
            decisions: self.decisions.clone(),
            fingerprint: Some(self.input.fingerprint.clone()),
            trace_context: self.input.trace_context.clone(),
        };
        self.store.save_checkpoint(&suspension).await?;
        for interaction in &pending {
            let announced = self
                .store
                .record(
                    &self.input.turn_id,
                    &format!("{}:requested", interaction.interaction_id),
                    EffectKind::Approval,
                    json!({"argumentsSha256": interaction.arguments_sha256}),
                    json!({}),
                )
                .await;
            match announced {
                Ok(Journaled::New) => {
                    self.emitter
                        .permission_requested(step, interaction.clone())
                        .await;
                }
                Ok(_) => {}
                Err(error) => return journal_stop(error),
            }
        }
        self.emitter
            .emit(
                step,
                RunEventKind::Suspended {
                    interactions: pending,
                },
            )
            .await;
        Ok(RunResult::Suspended { suspension })
    }

    /// `Ok(Ok((content, is_error, (fuel, calls))))` is a tool result for the model.
    #[allow(clippy::type_complexity)]
    async fn run_js(
        &mut self,
        step: u32,
        tool_id: &str,
        call: &ToolCall,
    ) -> Result<Result<(String, bool, (u64, u32)), RunResult>, RunError> {
        let Some(code) = call.arguments.get("code").and_then(Value::as_str) else {
            return Ok(Ok((
                "run_js takes one argument: {\"code\": \"<JavaScript>\"}".into(),
                true,
                (0, 0),
            )));
        };
        if self.input.approval == crate::ApprovalPolicy::Script {
            let interaction = Interaction {
                interaction_id: tool_id.to_string(),
                kind: "approval".into(),
                tool_name: RUN_JS.into(),
                capability_id: None,
                arguments: call.arguments.clone(),
                arguments_sha256: sha256_json(&call.arguments),
            };
            match self.journal.gate(interaction, step).await {
                Ok(None) => {}
                Ok(Some(CallOutcome::Held(_))) => {
                    let pending = self.journal.take_held().interactions;
                    return self.suspend(step, pending).await.map(Err);
                }
                Ok(Some(CallOutcome::Done(rejected))) => {
                    let reason = rejected.err().map(|e| e.to_string()).unwrap_or_default();
                    return Ok(Ok((
                        format!("The user did not approve running this script ({reason})."),
                        true,
                        (0, 0),
                    )));
                }
                Err(error) => return journal_stop(error).map(Err),
            }
        }
        if self.executor.is_none() {
            let factory = self
                .input
                .executor_factory
                .as_ref()
                .ok_or_else(|| RunError::Usage("JS mode needs an executor factory".into()))?;
            let context = self.invocation_context();
            let request = ExecutorRequest {
                catalog: Arc::clone(&self.script_catalog),
                backend: Arc::clone(&self.script_backend) as Arc<dyn corral_sandbox::Backend>,
                context,
                user: self.input.user.clone(),
                random_seed: stable_u64(&self.input.turn_id),
            };
            match factory.create(request).await {
                Ok(session) => self.executor = Some(session),
                Err(error) => {
                    return Ok(Err(failed(
                        "executor_error",
                        format!("the sandbox could not start a session: {error}"),
                    )));
                }
            }
        }
        self.journal.set_tool(tool_id);
        let records = self
            .store
            .completed_with_prefix(&format!("{tool_id}:b"))
            .await?;
        let mut schedule =
            match ReplaySchedule::from_journal(Arc::clone(&self.journal), tool_id, records) {
                Ok(schedule) => schedule,
                Err(message) => return Ok(Err(failed("effect_drift", message))),
            };
        // The stream shows what led to the script before it runs (it may run long).
        if let Err(error) = self.store.publish().await {
            return journal_stop(error).map(Err);
        }
        let Some(executor) = self.executor.as_mut() else {
            return Ok(Err(failed("executor_error", "no executor")));
        };
        let report = tokio::select! {
            biased;
            () = self.ctx.cancelled() => {
                self.executor = None;
                return Ok(Err(RunResult::Cancelled));
            }
            report = executor.run_scheduled(code, &mut schedule) => report,
        };
        if let Err(error) = self.journal.flush_batches().await {
            return journal_stop(error).map(Err);
        }
        if executor.is_discarded() {
            self.executor = None;
        }
        let span = tracing::Span::current();
        span.record("corral.peak_memory_bytes", report.stats.peak_memory_bytes);
        span.record(
            "corral.peak_concurrent_calls",
            report.stats.peak_concurrent_calls,
        );
        if let Err(ExecError::LimitExceeded { limit, .. }) = &report.outcome {
            span.record("corral.limit", limit.kind());
            span.record("error.type", limit.kind());
        }
        let held = self.journal.take_held();
        match &report.outcome {
            Err(ExecError::Schedule(error)) => {
                return Ok(Err(failed("effect_drift", error.to_string())));
            }
            Err(ExecError::Suspended { .. }) => return self.held_stop(step, held).await.map(Err),
            _ if held.drift.is_some() || held.failure.is_some() => {
                return self.held_stop(step, held).await.map(Err);
            }
            _ => {}
        }
        let content = report.to_json().to_string();
        Ok(Ok((
            content,
            report.outcome.is_err(),
            (report.stats.fuel, report.stats.calls),
        )))
    }

    /// A capability called directly as a model tool: validated, gated when it needs approval,
    /// journaled, redacted.
    #[allow(clippy::type_complexity)]
    async fn direct_call(
        &mut self,
        step: u32,
        tool_id: &str,
        call: &ToolCall,
    ) -> Result<Result<(String, bool, (u64, u32)), RunResult>, RunError> {
        let catalog = Arc::clone(&self.input.capabilities);
        let Some((index, capability)) = catalog
            .capabilities()
            .iter()
            .enumerate()
            .find(|(_, c)| direct_tool_name(&c.id) == call.name)
        else {
            return Ok(Ok((format!("unknown tool {}", call.name), true, (0, 0))));
        };
        let argument = match &call.arguments {
            Value::Null => json!({}),
            other => other.clone(),
        };
        if !argument.is_object() {
            return Ok(Ok((
                format!("{} takes one object argument", call.name),
                true,
                (0, 0),
            )));
        }
        if let Err(error) = catalog.validate_input(index, &argument) {
            let message = self
                .input
                .redactor
                .redact_text(&error.to_string())
                .into_owned();
            return Ok(Ok((message, true, (0, 0))));
        }
        if capability.needs_approval {
            let interaction = Interaction {
                interaction_id: tool_id.to_string(),
                kind: "approval".into(),
                tool_name: call.name.clone(),
                capability_id: Some(capability.id.clone()),
                arguments_sha256: sha256_json(&argument),
                arguments: argument.clone(),
            };
            match self.journal.gate(interaction, step).await {
                Ok(None) => {}
                Ok(Some(CallOutcome::Held(_))) => {
                    let pending = self.journal.take_held().interactions;
                    return self.suspend(step, pending).await.map(Err);
                }
                Ok(Some(CallOutcome::Done(rejected))) => {
                    let reason = rejected.err().map(|e| e.to_string()).unwrap_or_default();
                    return Ok(Ok((
                        format!("The user did not approve this call ({reason})."),
                        true,
                        (0, 0),
                    )));
                }
                Err(error) => return journal_stop(error).map(Err),
            }
        }
        self.journal.set_tool(tool_id);
        let context = self.invocation_context();
        let invocation = Invocation {
            capability_id: capability.id.clone(),
            tool_call_id: tool_id.to_string(),
            input: Value::Array(vec![argument]),
        };
        match self
            .journal
            .call(&format!("{tool_id}:call"), &context, invocation)
            .await
        {
            Ok(CallOutcome::Done(Ok(result))) => {
                let mut output = result.output;
                self.input.redactor.redact_json(&mut output);
                let content = match output {
                    Value::String(text) if capability.text_output => text,
                    other => other.to_string(),
                };
                Ok(Ok((content, false, (0, 1))))
            }
            Ok(CallOutcome::Done(Err(error))) => {
                let message = self
                    .input
                    .redactor
                    .redact_text(&error.to_string())
                    .into_owned();
                Ok(Ok((message, true, (0, 1))))
            }
            Ok(CallOutcome::Held(_)) => {
                let held = self.journal.take_held();
                self.held_stop(step, held).await.map(Err)
            }
            Err(error) => journal_stop(error).map(Err),
        }
    }

    /// The end of a run whose call was held: suspended, uncertain, waiting or failed.
    async fn held_stop(
        &mut self,
        step: u32,
        held: crate::replay::HeldState,
    ) -> Result<RunResult, RunError> {
        if let Some(drift) = held.drift {
            return Ok(failed("effect_drift", drift));
        }
        if let Some(failure) = held.failure {
            return Ok(failed("store_error", failure));
        }
        if !held.interactions.is_empty() {
            return self.suspend(step, held.interactions).await;
        }
        if !held.uncertain.is_empty() {
            return Ok(RunResult::Uncertain {
                effect_ids: held.uncertain,
            });
        }
        if !held.waiting.is_empty() {
            self.emitter
                .emit(
                    step,
                    RunEventKind::Waiting {
                        effect_ids: held.waiting.clone(),
                    },
                )
                .await;
            return Ok(RunResult::Waiting {
                effect_ids: held.waiting,
            });
        }
        Ok(failed(
            "executor_error",
            "the call was held with nothing to wait on",
        ))
    }

    fn invocation_context(&self) -> InvocationContext {
        let mut context = self.input.context.clone();
        if context.session_id.is_empty() {
            context.session_id = self.input.turn_id.clone();
        }
        if context.user_id.is_none() {
            context.user_id = self.input.user.as_ref().map(|u| u.id.clone());
        }
        context.run_id = Some(self.input.turn_id.clone());
        context
    }
}

/// The tool result the model is shown when `content` is over `budget_tokens`: `(shown,
/// bytes of the whole, shown as JSON for events)`, `None` when it fits as it is. JSON keeps its
/// shape ([`fit_to_budget`]); a script's report says how to read the whole value (`tools.$result`
/// with `result_id`); text is cut in the middle.
fn fit_content(
    content: &str,
    budget_tokens: usize,
    result_id: Option<String>,
) -> Option<(String, usize, Value)> {
    if crate::fit::tokens_of_bytes(content.len()) <= budget_tokens.max(MIN_RESULT_TOKENS) {
        return None;
    }
    let whole_bytes = content.len();
    let parsed: Option<Value> = serde_json::from_str(content).ok();
    match (parsed, result_id) {
        (Some(Value::Object(report)), Some(id)) => {
            let note = format!(
                "This result was cut to fit your context ({whole_bytes} bytes in all). The script's value is kept whole: a later run_js in this turn gets it with `await tools.$result({{id: \"{id}\"}})`; filter it there and return only what you need."
            );
            let room = budget_tokens.saturating_sub(crate::fit::tokens_of_bytes(note.len() + 12));
            let mut value = fit_to_budget(&Value::Object(report), room).value;
            if let Value::Object(map) = &mut value {
                map.insert("cut".into(), Value::String(note));
            }
            Some((value.to_string(), whole_bytes, value))
        }
        (Some(parsed), _) => {
            let value = fit_to_budget(&parsed, budget_tokens).value;
            Some((value.to_string(), whole_bytes, value))
        }
        (None, _) => {
            let value = fit_to_budget(&Value::String(content.to_string()), budget_tokens).value;
            let shown = value.as_str().unwrap_or_default().to_string();
            Some((shown, whole_bytes, value))
        }
    }
}

fn elapsed_ms(since: std::time::Instant) -> u64 {
    u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX)
}

fn result_id_of(tool_id: &str) -> String {
    crate::intrinsics::result_id(tool_id)
}

/// The journaled outcome of a model call: the response, or the failure that ends the run.
fn model_outcome(outcome: Value) -> Result<ModelResponse, RunResult> {
    if let Some(ok) = outcome.get("ok")
        && let Ok(response) = serde_json::from_value::<ModelResponse>(ok.clone())
    {
        return Ok(response);
    }
    let message = outcome["error"]["message"]
        .as_str()
        .unwrap_or("the model call failed")
        .to_string();
    Err(failed("model_error", message))
}
