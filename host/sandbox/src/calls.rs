//! The host's table of a script's capability calls: started calls are validated, queued behind
//! the concurrency bound, run as tokio tasks, redacted, and handed back as completions (or held,
//! when the backend holds them).

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use corral_catalog::{Catalog, Redactor};
use std::future::Future as _;

use futures::FutureExt as _;
use serde_json::Value;
use tokio::task::JoinSet;

use crate::backend::{Backend, Invocation, InvocationContext, InvokeCapabilityError, ToolResult};
use crate::bindings::corral::sandbox::types::{CallError, CallValue, Completion};
use crate::schedule::HeldCall;

/// Everything a call needs besides its own input; shared by all calls of a session.
pub(crate) struct CallEnvironment {
    pub(crate) catalog: Arc<Catalog>,
    pub(crate) backend: Arc<dyn Backend>,
    pub(crate) redactor: Arc<Redactor>,
    pub(crate) context: Arc<InvocationContext>,
}

struct QueuedCall {
    call_id: u32,
    binding: usize,
    /// What its input counts against [`CallTable::held_bytes`] until it finishes.
    input_bytes: u64,
    invocation: Invocation,
}

struct FinishedCall {
    call_id: u32,
    binding: usize,
    input_bytes: u64,
    tool_call_id: String,
    result: Result<ToolResult, InvokeCapabilityError>,
}

/// Runs one call on its backend. A backend that panics fails its call instead of leaving the
/// script waiting.
async fn run_call(
    backend: Arc<dyn Backend>,
    context: Arc<InvocationContext>,
    call: QueuedCall,
) -> FinishedCall {
    let tool_call_id = call.invocation.tool_call_id.clone();
    let capability_id = call.invocation.capability_id.clone();
    let result = AssertUnwindSafe(backend.invoke(&context, call.invocation))
        .catch_unwind()
        .await
        .unwrap_or_else(|_| {
            Err(InvokeCapabilityError::Failed {
                capability_id,
                message: "the backend panicked".into(),
            })
        });
    FinishedCall {
        call_id: call.call_id,
        binding: call.binding,
        input_bytes: call.input_bytes,
        tool_call_id,
        result,
    }
}

/// Calls of the script that is running now.
pub(crate) struct CallTable {
    running: JoinSet<FinishedCall>,
    queued: VecDeque<QueuedCall>,
    /// Completions ready to hand to the guest (validation failures, finished calls), in the
    /// order they finished.
    ready: Vec<Completion>,
    /// Calls the backend holds: they never complete in this run.
    held: Vec<HeldCall>,
    /// Rejections handed to the guest in this run: (name, message, tool call id). What makes a
    /// script's error a call's failure is that it is one of these, not what it calls itself.
    delivered_rejections: Vec<(String, String, String)>,
    /// Calls started by the current script.
    pub(crate) started: u32,
    /// Most calls that were in flight at once during the current script.
    pub(crate) peak_in_flight: u32,
    /// Bytes the host holds for the script's calls: inputs of queued and running calls, and
    /// ready completions (see [`crate::SessionLimits::max_call_bytes`]).
    pub(crate) held_bytes: u64,
    /// Whether a call whose outcome is ready when it starts is answered from `start-call`
    /// (see [`crate::CompletionSchedule::answers_at_start`]); set for each script.
    pub(crate) answers_at_start: bool,
    max_concurrent: usize,
}

impl CallTable {
    pub(crate) fn new(max_concurrent: u32) -> Self {
        CallTable {
            running: JoinSet::new(),
            queued: VecDeque::new(),
            ready: Vec::new(),
            held: Vec::new(),
            delivered_rejections: Vec::new(),
            started: 0,
            peak_in_flight: 0,
            held_bytes: 0,
            answers_at_start: false,
            max_concurrent: max_concurrent.max(1) as usize,
        }
    }

    /// Forgets the previous script's calls; any still running are cancelled. Calls a script
    /// started but did not await do not outlive it.
    pub(crate) fn reset(&mut self) {
        self.running.abort_all();
        self.running = JoinSet::new();
        self.queued.clear();
        self.ready.clear();
        self.held.clear();
        self.delivered_rejections.clear();
        self.started = 0;
        self.peak_in_flight = 0;
        self.held_bytes = 0;
        self.answers_at_start = false;
    }

    /// The call ids whose completions are ready, in the order they finished.
    pub(crate) fn ready_ids(&self) -> Vec<u32> {
        self.ready.iter().map(|c| c.call_id).collect()
    }

    /// Takes the completions of `ids`, in that order. Fails (taking nothing) when an id is not
    /// ready or appears twice.
    pub(crate) fn take_batch(&mut self, ids: &[u32]) -> Result<Vec<Completion>, String> {
        for (i, id) in ids.iter().enumerate() {
            if ids[..i].contains(id) {
                return Err(format!("the batch names call {id} twice"));
            }
            if !self.ready.iter().any(|c| c.call_id == *id) {
                return Err(format!(
                    "the batch names call {id}, which is not ready (ready: {:?})",
                    self.ready_ids()
                ));
            }
        }
        let mut batch = Vec::with_capacity(ids.len());
        for id in ids {
            if let Some(position) = self.ready.iter().position(|c| c.call_id == *id) {
                let completion = self.ready.remove(position);
                self.held_bytes = self
                    .held_bytes
                    .saturating_sub(completion_bytes(&completion));
                if let Err(error) = &completion.outcome {
                    self.delivered_rejections.push((
                        error.name.clone(),
                        error.message.clone(),
                        error.tool_call_id.clone(),
                    ));
                }
                batch.push(completion);
            }
        }
        Ok(batch)
    }

    /// The outcome of the call that just started, taken as a batch of its own, when the script
    /// answers calls at start and it is ready already (its backend answered without waiting,
    /// or its input was rejected).
    pub(crate) fn take_at_start(&mut self, call_id: u32) -> Option<Result<CallValue, CallError>> {
        // Checked first so that a call still running costs no `take_batch` error text.
        if !self.answers_at_start || !self.ready.iter().any(|c| c.call_id == call_id) {
            return None;
        }
        let mut batch = self.take_batch(&[call_id]).ok()?;
        batch.pop().map(|completion| completion.outcome)
    }

    /// The tool call id of a rejection with this name and message delivered in this run.
    pub(crate) fn rejection_id(&self, name: &str, message: &str) -> Option<String> {
        self.delivered_rejections
            .iter()
            .find(|(n, m, _)| n == name && m == message)
            .map(|(_, _, id)| id.clone())
    }

    /// Whether a call is running or queued, so that more completions can still become ready.
    pub(crate) fn has_running(&self) -> bool {
        !self.running.is_empty() || !self.queued.is_empty()
    }

    /// Whether nothing at all is owed to the guest (nothing running, queued, ready or held).
    pub(crate) fn is_idle(&self) -> bool {
        !self.has_running() && self.ready.is_empty() && self.held.is_empty()
    }

    /// The calls the backend holds, taken out of the table.
    pub(crate) fn take_held(&mut self) -> Vec<HeldCall> {
        std::mem::take(&mut self.held)
    }

    /// Collects the calls that have finished, without waiting.
    pub(crate) fn collect_finished(&mut self, env: &CallEnvironment) {
        while let Some(finished) = self.running.try_join_next() {
            self.finish(env, finished);
        }
    }

    /// Waits until one running call finishes, then collects any others that finished too.
    /// Returns at once when no call is running.
    pub(crate) async fn wait_finished(&mut self, env: &CallEnvironment) {
        if let Some(finished) = self.running.join_next().await {
            self.finish(env, finished);
        }
        self.collect_finished(env);
    }

    /// Registers a call the guest started. Input that fails the capability's schema completes
    /// at once as a `ValidationError`; the backend never sees it.
    pub(crate) fn start(
        &mut self,
        env: &CallEnvironment,
        call_id: u32,
        binding: usize,
        args_json: &str,
        tool_call_id: String,
    ) {
        let Some(capability) = env.catalog.capabilities().get(binding) else {
            self.push_ready(rejection(
                call_id,
                "CapabilityError",
                format!("no capability is bound at index {binding}"),
                tool_call_id,
            ));
            return;
        };
        let input: Value = match crate::json::parse_guest_json(args_json) {
            Ok(Value::Array(items)) if items.len() == 1 => Value::Array(items),
            parsed => {
                let why = if crate::json::deeper_than(args_json, crate::json::MAX_JSON_DEPTH) {
                    format!(
                        "its argument nests more than {} arrays and objects deep",
                        crate::json::MAX_JSON_DEPTH - 1
                    )
                } else if parsed.is_err() {
                    "its argument is not valid JSON".to_string()
                } else {
                    "it takes one object argument".to_string()
                };
                self.push_ready(rejection(
                    call_id,
                    "ValidationError",
                    format!("{}: {why}", capability.id),
                    tool_call_id,
                ));
                return;
            }
        };
        if let Err(error) = env.catalog.validate_input(binding, &input[0]) {
            // A built-in catalog's schema that fails its check on first use is the host's
            // fault, not the input's: the call fails as a capability error.
            let name = match error {
                corral_catalog::ValidateInputError::UnusableSchema { .. } => "CapabilityError",
                _ => "ValidationError",
            };
            self.push_ready(rejection(
                call_id,
                name,
                env.redactor.redact_text(&error.to_string()).into_owned(),
                tool_call_id,
            ));
            return;
        }
        let input_bytes = args_json.len() as u64;
        self.held_bytes = self.held_bytes.saturating_add(input_bytes);
        self.queued.push_back(QueuedCall {
            call_id,
            binding,
            input_bytes,
            invocation: Invocation {
                capability_id: capability.id.clone(),
                tool_call_id,
                input,
            },
        });
        self.pump(env);
    }

    /// Starts queued calls while fewer than the bound are in flight.
    ///
    /// Each call is polled once right here: a backend that answers without waiting (a cache,
    /// an in-process computation) completes without a task, a thread hop or a wake-up. Only
    /// calls that actually wait become tasks.
    fn pump(&mut self, env: &CallEnvironment) {
        while self.running.len() < self.max_concurrent {
            let Some(call) = self.queued.pop_front() else {
                break;
            };
            self.peak_in_flight = self.peak_in_flight.max(self.running.len() as u32 + 1);
            let mut call = Box::pin(run_call(
                Arc::clone(&env.backend),
                Arc::clone(&env.context),
                call,
            ));
            let mut context = std::task::Context::from_waker(std::task::Waker::noop());
            match call.as_mut().poll(&mut context) {
                std::task::Poll::Ready(finished) => self.settle(env, finished),
                std::task::Poll::Pending => {
                    self.running.spawn(call);
                }
            }
        }
    }

    fn finish(
        &mut self,
        env: &CallEnvironment,
        finished: Result<FinishedCall, tokio::task::JoinError>,
    ) {
        // Tasks catch their own panics, so the only join error is cancellation by `reset`,
        // after which nobody waits for the call.
        let Ok(call) = finished else {
            return;
        };
        self.settle(env, call);
        self.pump(env);
    }

    /// Files a finished call: held by the backend, or ready for the guest.
    fn settle(&mut self, env: &CallEnvironment, call: FinishedCall) {
        self.held_bytes = self.held_bytes.saturating_sub(call.input_bytes);
        if let Err(InvokeCapabilityError::Held {
            capability_id,
            reason,
        }) = &call.result
        {
            self.held.push(HeldCall {
                call_id: call.call_id,
                tool_call_id: call.tool_call_id.clone(),
                capability_id: capability_id.clone(),
                reason: reason.clone(),
            });
            return;
        }
        let completion = completion(env, call);
        self.push_ready(completion);
    }

    fn push_ready(&mut self, completion: Completion) {
        self.held_bytes = self
            .held_bytes
            .saturating_add(completion_bytes(&completion));
        self.ready.push(completion);
    }
}

/// What a completion counts against [`CallTable::held_bytes`] until it is delivered.
fn completion_bytes(completion: &Completion) -> u64 {
    let bytes = match &completion.outcome {
        Ok(CallValue::Json(text) | CallValue::Text(text)) => text.len(),
        Err(error) => error.name.len() + error.message.len() + error.tool_call_id.len(),
    };
    bytes as u64
}

fn rejection(call_id: u32, name: &str, message: String, tool_call_id: String) -> Completion {
    Completion {
        call_id,
        outcome: Err(CallError {
            name: name.to_string(),
            message,
            tool_call_id,
        }),
    }
}

/// Redacts a finished call and shapes it for the guest: text capabilities yield strings,
/// others JSON.
fn completion(env: &CallEnvironment, call: FinishedCall) -> Completion {
    let text_output = env
        .catalog
        .capabilities()
        .get(call.binding)
        .is_some_and(|c| c.text_output);
    let outcome = match call.result {
        Ok(result) => {
            let mut output = result.output;
            env.redactor.redact_json(&mut output);
            Ok(match (text_output, output) {
                (true, Value::String(text)) => CallValue::Text(text),
                (true, other) => CallValue::Text(other.to_string()),
                (false, other) => CallValue::Json(other.to_string()),
            })
        }
        Err(error) => Err(CallError {
            // A refusal by the host's authorization (or a person's rejection of a gated call)
            // is its own kind of error, so scripts can tell it from a failed capability.
            name: match &error {
                InvokeCapabilityError::PermissionDenied { .. } => "PermissionDenied".into(),
                _ => "CapabilityError".into(),
            },
            message: env.redactor.redact_text(&error.to_string()).into_owned(),
            tool_call_id: call.tool_call_id.clone(),
        }),
    };
    Completion {
        call_id: call.call_id,
        outcome,
    }
}
