//! Exact replay of scripts: the backend wrapper that journals every capability call a script
//! makes, and the completion schedule that records (and on replay re-delivers) the batches of
//! completions the guest received.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use corral_catalog::Catalog;
use corral_sandbox::{
    Backend, CompletionSchedule, Invocation, InvocationContext, InvokeCapabilityError,
    ScheduleError, ToolResult,
};
use corral_store::EffectKind;
use serde_json::{Value, json};

use crate::emit::Emitter;
use crate::journal::{ActionRequest, ConversationStore, JournalError, Journaled};
use crate::types::{ApprovalPolicy, Decision, Interaction};
use crate::util::sha256_json;

/// What the journal says about one capability call.
pub(crate) enum CallOutcome {
    /// The call's result (journaled now or before).
    Done(Result<ToolResult, InvokeCapabilityError>),
    /// The call does not complete in this run.
    Held(HoldReason),
}

/// Why a call is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HoldReason {
    Approval,
    Action,
    Uncertain,
    Drift,
    Store,
}

impl HoldReason {
    fn as_str(self) -> &'static str {
        match self {
            HoldReason::Approval => "waiting for approval",
            HoldReason::Action => "waiting for an external executor",
            HoldReason::Uncertain => "its outcome is uncertain",
            HoldReason::Drift => "the replay differs from the journal",
            HoldReason::Store => "the journal could not be written",
        }
    }
}

/// What held calls left behind, read by the run loop once the script ends.
#[derive(Debug, Default)]
pub(crate) struct HeldState {
    pub(crate) interactions: Vec<Interaction>,
    pub(crate) waiting: Vec<String>,
    pub(crate) uncertain: Vec<String>,
    pub(crate) drift: Option<String>,
    pub(crate) failure: Option<String>,
}

/// The journaling layer between the sandbox (or a direct tool) and the host's backend.
pub(crate) struct CallJournal {
    pub(crate) store: Arc<dyn ConversationStore>,
    pub(crate) inner: Arc<dyn Backend>,
    pub(crate) catalog: Arc<Catalog>,
    pub(crate) actions: Vec<String>,
    pub(crate) turn_id: String,
    pub(crate) policy: ApprovalPolicy,
    pub(crate) auto_confirm: bool,
    pub(crate) decisions: BTreeMap<String, Decision>,
    pub(crate) emitter: Arc<Emitter>,
    /// The model tool call a script belongs to (`{turn}:s{step}:t{k}`); set before each script.
    pub(crate) tool_id: Mutex<String>,
    pub(crate) held: Mutex<HeldState>,
    /// Batch records not yet written: flushed before any new effect begins and when the script
    /// ends, so nothing outside can observe a batch the journal does not have.
    pub(crate) unflushed: Mutex<Vec<(String, Value)>>,
    /// The span of the model tool call being run (`execute_tool run_js`): every capability
    /// call's span is its child, whichever task the sandbox runs the call on.
    pub(crate) span: Mutex<tracing::Span>,
    /// Redacts what content capture records (as events are redacted).
    pub(crate) redactor: Arc<corral_catalog::Redactor>,
    /// What each capability call of the current tool call cost (`tool.finished`).
    pub(crate) costs: Mutex<Vec<crate::sink::CallCost>>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl CallJournal {
    pub(crate) fn set_tool(&self, tool_id: &str) {
        lock(&self.costs).clear();
        *lock(&self.tool_id) = tool_id.to_string();
        *lock(&self.held) = HeldState::default();
        lock(&self.unflushed).clear();
    }

    pub(crate) fn set_span(&self, span: tracing::Span) {
        *lock(&self.span) = span;
    }

    fn span(&self) -> tracing::Span {
        lock(&self.span).clone()
    }

    /// The costs of the calls since [`CallJournal::set_tool`], in the order they started.
    pub(crate) fn take_costs(&self) -> Vec<crate::sink::CallCost> {
        std::mem::take(&mut *lock(&self.costs))
    }

    fn cost(&self, effect_id: &str, capability_id: &str, wall_us: u64, replayed: bool) {
        lock(&self.costs).push(crate::sink::CallCost {
            effect_id: effect_id.to_owned(),
            capability_id: capability_id.to_owned(),
            wall_us,
            replayed,
        });
    }

    pub(crate) fn take_held(&self) -> HeldState {
        std::mem::take(&mut *lock(&self.held))
    }

    pub(crate) async fn flush_batches(&self) -> Result<(), JournalError> {
        let batches = std::mem::take(&mut *lock(&self.unflushed));
        for (effect_id, record) in batches {
            self.store
                .record(
                    &self.turn_id,
                    &effect_id,
                    EffectKind::Script,
                    json!({"batch": effect_id}),
                    record,
                )
                .await?;
        }
        Ok(())
    }

    fn hold(&self, reason: HoldReason, capability_id: &str) -> InvokeCapabilityError {
        InvokeCapabilityError::Held {
            capability_id: capability_id.to_string(),
            reason: reason.as_str().to_string(),
        }
    }

    fn note_error(&self, error: JournalError) -> HoldReason {
        let mut held = lock(&self.held);
        match error {
            JournalError::Drift { effect_id } => {
                held.drift = Some(format!(
                    "effect {effect_id} was journaled with a different request"
                ));
                HoldReason::Drift
            }
            other => {
                held.failure = Some(other.to_string());
                HoldReason::Store
            }
        }
    }

    /// The approval gate of one capability call, journaled. `None` means go on.
    pub(crate) async fn gate(
        &self,
        interaction: Interaction,
        step: u32,
    ) -> Result<Option<CallOutcome>, JournalError> {
        let id = interaction.interaction_id.clone();
        let decision = match self.decisions.get(&id) {
            Some(decision) => decision.clone(),
            None if self.auto_confirm => Decision {
                approved: true,
                reason: None,
                value: None,
            },
            None => {
                tracing::info!(
                    target: corral_telemetry::TARGET,
                    parent: &self.span(),
                    interaction_id = %id,
                    "approval.requested"
                );
                lock(&self.held).interactions.push(interaction);
                return Ok(Some(CallOutcome::Held(HoldReason::Approval)));
            }
        };
        let recorded = self
            .store
            .record(
                &self.turn_id,
                &format!("{id}:approval"),
                EffectKind::Approval,
                json!({"interactionId": id, "argumentsSha256": interaction.arguments_sha256}),
                json!({"approved": decision.approved, "reason": decision.reason, "auto": self.auto_confirm && !self.decisions.contains_key(&id)}),
            )
            .await?;
        tracing::info!(
            target: corral_telemetry::TARGET,
            parent: &self.span(),
            interaction_id = %id,
            approved = decision.approved,
            replayed = recorded != Journaled::New,
            "approval.resolved"
        );
        if recorded == Journaled::New {
            let auto = !self.decisions.contains_key(&id);
            if auto {
                self.emitter
                    .permission_requested(step, interaction.clone())
                    .await;
            }
            self.emitter
                .permission_resolved(step, &id, decision.approved, decision.reason.clone(), auto)
                .await;
        }
        if decision.approved {
            Ok(None)
        } else {
            let capability_id = interaction
                .capability_id
                .unwrap_or_else(|| interaction.tool_name.clone());
            Ok(Some(CallOutcome::Done(Err(
                InvokeCapabilityError::PermissionDenied {
                    capability_id,
                    reason: decision
                        .reason
                        .unwrap_or_else(|| "the user rejected this call".to_string()),
                },
            ))))
        }
    }

    /// One capability call through the journal: taken from it when completed, performed and
    /// journaled when new, held when it waits on an executor or its outcome is unknown.
    pub(crate) async fn call(
        &self,
        effect_id: &str,
        context: &InvocationContext,
        invocation: Invocation,
    ) -> Result<CallOutcome, JournalError> {
        use tracing::Instrument as _;
        let capability = invocation.capability_id.as_str();
        let name = format!("execute_tool {capability}");
        let span = tracing::info_span!(
            target: corral_telemetry::TARGET,
            parent: &self.span(),
            "execute_tool",
            otel.name = name.as_str(),
            otel.kind = "internal",
            otel.status_code = tracing::field::Empty,
            gen_ai.operation.name = "execute_tool",
            gen_ai.tool.name = capability,
            gen_ai.tool.call.id = effect_id,
            corral.effect_id = effect_id,
            // A call reaches the journal only once its input passed the catalog's schema.
            corral.validation = "passed",
            corral.action = self.actions.iter().any(|a| a == capability),
            corral.replayed = tracing::field::Empty,
            corral.outcome = tracing::field::Empty,
            corral.queue_us = tracing::field::Empty,
            gen_ai.tool.call.arguments = tracing::field::Empty,
            gen_ai.tool.call.result = tracing::field::Empty,
            error.type = tracing::field::Empty,
        );
        let result = self
            .call_traced(effect_id, context, invocation)
            .instrument(span.clone())
            .await;
        let outcome = match &result {
            Ok(CallOutcome::Done(Ok(_))) => "ok",
            Ok(CallOutcome::Done(Err(error))) => {
                span.record("otel.status_code", "ERROR");
                span.record("error.type", error_kind(error));
                "error"
            }
            Ok(CallOutcome::Held(HoldReason::Action)) => "waiting",
            Ok(CallOutcome::Held(HoldReason::Uncertain)) => "uncertain",
            Ok(CallOutcome::Held(_)) => "held",
            Err(_) => {
                span.record("otel.status_code", "ERROR");
                "journal_error"
            }
        };
        span.record("corral.outcome", outcome);
        result
    }

    async fn call_traced(
        &self,
        effect_id: &str,
        context: &InvocationContext,
        mut invocation: Invocation,
    ) -> Result<CallOutcome, JournalError> {
        let span = tracing::Span::current();
        let capture = corral_telemetry::capture_content() && !span.is_disabled();
        if capture {
            let mut input = invocation.input.clone();
            self.redactor.redact_json(&mut input);
            span.record("gen_ai.tool.call.arguments", input.to_string());
        }
        let queued = std::time::Instant::now();
        self.flush_batches().await?;
        // Backends and executors see the journal's effect id as the call id: it is the same
        // across restarts and replays, so a call an operator retries arrives with the id of its
        // first attempt and the backend can deduplicate it.
        invocation.tool_call_id = effect_id.to_string();
        let request = json!({"capability": invocation.capability_id, "input": invocation.input});
        let action = self
            .actions
            .iter()
            .any(|a| a == &invocation.capability_id)
            .then(|| {
                let mut request =
                    json!({"input": invocation.input, "toolCallId": invocation.tool_call_id});
                // The executor joins the turn's trace: the call span's W3C trace context goes
                // with the action (the action view's `traceparent` and `tracestate`).
                for (name, value) in corral_telemetry::trace_headers() {
                    request[name] = Value::String(value);
                }
                ActionRequest {
                    capability_id: invocation.capability_id.clone(),
                    request,
                }
            });
        let is_action = action.is_some();
        let journaled = self
            .store
            .begin(
                &self.turn_id,
                effect_id,
                EffectKind::CapabilityCall,
                request,
                action,
            )
            .await?;
        // Replayed: taken from the journal, never executed again (an operator's retry of an
        // uncertain call is executed again, and says so).
        span.record(
            "corral.replayed",
            matches!(journaled, Journaled::Completed(_)),
        );
        match journaled {
            Journaled::Completed(outcome) => {
                let wall_us = outcome["wallUs"].as_u64().unwrap_or(0);
                self.cost(effect_id, &invocation.capability_id, wall_us, true);
                if capture {
                    let mut shown = outcome.clone();
                    self.redactor.redact_json(&mut shown);
                    span.record("gen_ai.tool.call.result", shown.to_string());
                }
                Ok(CallOutcome::Done(outcome_from_json(
                    &invocation.capability_id,
                    &outcome,
                )))
            }
            Journaled::Uncertain => {
                tracing::info!(target: corral_telemetry::TARGET, effect_id, "effect.uncertain");
                lock(&self.held).uncertain.push(effect_id.to_string());
                Ok(CallOutcome::Held(HoldReason::Uncertain))
            }
            Journaled::New | Journaled::Pending if is_action => {
                lock(&self.held).waiting.push(effect_id.to_string());
                Ok(CallOutcome::Held(HoldReason::Action))
            }
            Journaled::New | Journaled::Pending => {
                if journaled == Journaled::Pending {
                    // An operator asked for a retry of an uncertain call.
                    tracing::info!(target: corral_telemetry::TARGET, effect_id, "effect.retried");
                    self.store.restart(effect_id).await?;
                }
                let mut context = context.clone();
                context
                    .attributes
                    .insert("effectId".to_owned(), Value::String(effect_id.to_owned()));
                span.record(
                    "corral.queue_us",
                    u64::try_from(queued.elapsed().as_micros()).unwrap_or(u64::MAX),
                );
                let capability_id = invocation.capability_id.clone();
                let started = std::time::Instant::now();
                let result = if crate::intrinsics::is_discovery(&capability_id) {
                    crate::intrinsics::discover(&self.catalog, &invocation)
                } else {
                    self.inner.invoke(&context, invocation).await
                };
                let wall_us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
                self.cost(effect_id, &capability_id, wall_us, false);
                if capture && let Ok(done) = &result {
                    let mut shown = done.output.clone();
                    self.redactor.redact_json(&mut shown);
                    span.record("gen_ai.tool.call.result", shown.to_string());
                }
                let mut outcome = outcome_to_json(&result);
                // Kept beside the outcome, so a replay reports what the call cost when it ran.
                outcome["wallUs"] = Value::from(wall_us);
                self.store.complete(effect_id, outcome).await?;
                Ok(CallOutcome::Done(result))
            }
        }
    }
}

/// The `error.type` of a failed call.
fn error_kind(error: &InvokeCapabilityError) -> &'static str {
    match error {
        InvokeCapabilityError::PermissionDenied { .. } => "permission_denied",
        InvokeCapabilityError::UnknownCapability { .. } => "unknown_capability",
        _ => "failed",
    }
}

/// The journal form of a call's outcome.
pub(crate) fn outcome_to_json(result: &Result<ToolResult, InvokeCapabilityError>) -> Value {
    match result {
        Ok(result) => json!({"ok": result.output, "attachments": result.attachments}),
        Err(InvokeCapabilityError::PermissionDenied {
            capability_id,
            reason,
        }) => {
            json!({"error": {"kind": "permission_denied", "capability": capability_id, "message": reason}})
        }
        Err(InvokeCapabilityError::UnknownCapability { capability_id }) => {
            json!({"error": {"kind": "unknown_capability", "capability": capability_id}})
        }
        Err(InvokeCapabilityError::Failed {
            capability_id,
            message,
        }) => json!({"error": {"kind": "failed", "capability": capability_id, "message": message}}),
        Err(other) => json!({"error": {"kind": "failed", "message": other.to_string()}}),
    }
}

/// A journaled outcome as the call's result. Besides the journal's own form
/// ([`outcome_to_json`]), this reads the wire form executors and operators send in
/// `action_result` and `resolve`: `{"value": ...}`, or `{"error": "message"}` /
/// `{"error": {"message": ...}}`.
pub(crate) fn outcome_from_json(
    capability_id: &str,
    outcome: &Value,
) -> Result<ToolResult, InvokeCapabilityError> {
    if let Some(ok) = outcome.get("ok").or_else(|| outcome.get("value")) {
        let attachments = outcome
            .get("attachments")
            .cloned()
            .and_then(|a| serde_json::from_value(a).ok())
            .unwrap_or_default();
        return Ok(ToolResult {
            output: ok.clone(),
            attachments,
        });
    }
    let error = outcome.get("error").cloned().unwrap_or(Value::Null);
    if let Some(message) = error.as_str() {
        return Err(InvokeCapabilityError::Failed {
            capability_id: capability_id.to_string(),
            message: message.to_string(),
        });
    }
    let text = |key: &str| {
        error
            .get(key)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let capability_id = match text("capability") {
        id if id.is_empty() => capability_id.to_string(),
        id => id,
    };
    Err(match text("kind").as_str() {
        "permission_denied" => InvokeCapabilityError::PermissionDenied {
            capability_id,
            reason: text("message"),
        },
        "unknown_capability" => InvokeCapabilityError::UnknownCapability { capability_id },
        _ => InvokeCapabilityError::Failed {
            capability_id,
            message: text("message"),
        },
    })
}

/// The backend a script's executor session calls: every call goes through the journal, and
/// through the calls-policy gate.
pub(crate) struct ScriptBackend {
    pub(crate) journal: Arc<CallJournal>,
    pub(crate) step: std::sync::atomic::AtomicU32,
}

#[async_trait]
impl Backend for ScriptBackend {
    async fn invoke(
        &self,
        context: &InvocationContext,
        invocation: Invocation,
    ) -> Result<ToolResult, InvokeCapabilityError> {
        let journal = &self.journal;
        if crate::intrinsics::is_read_from_journal(&invocation.capability_id) {
            return crate::intrinsics::answer(
                journal.store.as_ref(),
                &journal.turn_id,
                &invocation,
            )
            .await;
        }
        let capability_id = invocation.capability_id.clone();
        // The guest's call id is the tool call id's last part; the script's place in the turn
        // comes from the journal, so ids are the same when the script is replayed.
        let call = invocation
            .tool_call_id
            .rsplit(':')
            .next()
            .unwrap_or_default()
            .to_string();
        let tool_id = lock(&journal.tool_id).clone();
        let effect_id = format!("{tool_id}:c{call}");
        let needs_approval = journal
            .catalog
            .get(&capability_id)
            .is_some_and(|(_, c)| c.needs_approval);
        if journal.policy == ApprovalPolicy::Calls && needs_approval {
            if let Err(error) = journal.flush_batches().await {
                let reason = journal.note_error(error);
                return Err(journal.hold(reason, &capability_id));
            }
            let arguments = invocation.argument().clone();
            let interaction = Interaction {
                interaction_id: effect_id.clone(),
                kind: "approval".into(),
                tool_name: "run_js".into(),
                capability_id: Some(capability_id.clone()),
                arguments_sha256: sha256_json(&arguments),
                arguments,
            };
            let step = self.step.load(std::sync::atomic::Ordering::Relaxed);
            match journal.gate(interaction, step).await {
                Ok(None) => {}
                Ok(Some(CallOutcome::Done(result))) => return result,
                Ok(Some(CallOutcome::Held(reason))) => {
                    return Err(journal.hold(reason, &capability_id));
                }
                Err(error) => {
                    let reason = journal.note_error(error);
                    return Err(journal.hold(reason, &capability_id));
                }
            }
        }
        match journal.call(&effect_id, context, invocation).await {
            Ok(CallOutcome::Done(result)) => result,
            Ok(CallOutcome::Held(reason)) => Err(journal.hold(reason, &capability_id)),
            Err(error) => {
                let reason = journal.note_error(error);
                Err(journal.hold(reason, &capability_id))
            }
        }
    }
}

/// Records each batch of completions delivered to a script, and on replay delivers the
/// journaled batches again, exactly and in order, checking that the script reached each of them
/// with the same fuel.
pub(crate) struct ReplaySchedule {
    pub(crate) journal: Arc<CallJournal>,
    pub(crate) tool_id: String,
    /// Journaled batches: (call ids, fuel consumed when the guest waited).
    pub(crate) recorded: Vec<(Vec<u32>, u64)>,
    /// Batches delivered by this run that the journal already had.
    pub(crate) replayed: u32,
}

impl ReplaySchedule {
    /// Parses the journaled batch records of `tool_id`.
    pub(crate) fn from_journal(
        journal: Arc<CallJournal>,
        tool_id: &str,
        records: Vec<(String, Value)>,
    ) -> Result<Self, String> {
        let prefix = format!("{tool_id}:b");
        let mut indexed = Vec::new();
        for (id, record) in records {
            let Some(index) = id
                .strip_prefix(&prefix)
                .and_then(|i| i.parse::<usize>().ok())
            else {
                continue;
            };
            let calls: Vec<u32> = serde_json::from_value(record["calls"].clone())
                .map_err(|e| format!("batch record {id}: {e}"))?;
            let fuel = record["fuel"].as_u64().unwrap_or(0);
            indexed.push((index, calls, fuel));
        }
        indexed.sort_by_key(|(index, _, _)| *index);
        let mut recorded = Vec::new();
        for (expected, (index, calls, fuel)) in indexed.into_iter().enumerate() {
            if expected != index {
                return Err(format!(
                    "batch {expected} of {tool_id} is missing from the journal"
                ));
            }
            recorded.push((calls, fuel));
        }
        Ok(ReplaySchedule {
            journal,
            tool_id: tool_id.to_string(),
            recorded,
            replayed: 0,
        })
    }
}

impl CompletionSchedule for ReplaySchedule {
    fn next_batch(
        &mut self,
        wait_index: u32,
        ready: &[u32],
        fuel_consumed: u64,
    ) -> Result<Vec<u32>, ScheduleError> {
        if let Some((calls, fuel)) = self.recorded.get(wait_index as usize) {
            if *fuel != fuel_consumed {
                return Err(ScheduleError(format!(
                    "replay drift in {}: the script reached wait {wait_index} with {fuel_consumed} fuel, the journal says {fuel}",
                    self.tool_id
                )));
            }
            if calls.iter().all(|call| ready.contains(call)) {
                self.replayed = self.replayed.max(wait_index + 1);
                return Ok(calls.clone());
            }
            return Ok(Vec::new());
        }
        if ready.is_empty() {
            return Ok(Vec::new());
        }
        let batch = ready.to_vec();
        lock(&self.journal.unflushed).push((
            format!("{}:b{wait_index}", self.tool_id),
            json!({"calls": batch, "fuel": fuel_consumed}),
        ));
        Ok(batch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_round_trip_through_the_journal() {
        let ok: Result<ToolResult, InvokeCapabilityError> = Ok(ToolResult::new(json!({"n": 1})));
        let back = outcome_from_json("c", &outcome_to_json(&ok)).map(|r| r.output);
        assert_eq!(back.ok(), Some(json!({"n": 1})));
        let failed = Err(InvokeCapabilityError::Failed {
            capability_id: "c".into(),
            message: "boom".into(),
        });
        let back = outcome_from_json("c", &outcome_to_json(&failed));
        assert!(
            matches!(back, Err(InvokeCapabilityError::Failed { message, .. }) if message == "boom")
        );
    }

    #[test]
    fn executor_and_operator_outcomes_use_the_wire_form() {
        let value = outcome_from_json("demo.action", &json!({"value": {"done": true}}));
        assert_eq!(value.map(|r| r.output).ok(), Some(json!({"done": true})));
        let null = outcome_from_json("demo.action", &json!({"value": null}));
        assert_eq!(null.map(|r| r.output).ok(), Some(Value::Null));
        for error in [
            json!({"error": "out of stock"}),
            json!({"error": {"message": "out of stock"}}),
        ] {
            let failed = outcome_from_json("demo.action", &error);
            assert!(
                matches!(&failed, Err(InvokeCapabilityError::Failed { capability_id, message })
                    if capability_id == "demo.action" && message == "out of stock"),
                "{error}: {failed:?}"
            );
        }
    }
}
