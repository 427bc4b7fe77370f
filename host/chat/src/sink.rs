//! The events a run emits while it works. Completion is the returned [`crate::RunResult`].

use std::sync::Mutex;

use async_trait::async_trait;
use serde::Serialize;
use serde_json::Value;

use crate::types::Interaction;

/// What one capability call cost, in `tool.finished`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CallCost {
    /// The call's effect id (its `tool_call_id` at the backend).
    pub effect_id: String,
    /// The capability.
    pub capability_id: String,
    /// Wall time of the backend call in microseconds, as measured when it was performed (0 when
    /// the journal has no measure, or it did not complete).
    pub wall_us: u64,
    /// Taken from the journal in this run (performed in an earlier one), not performed again.
    pub replayed: bool,
}

/// One event of a run.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RunEvent {
    /// The run (turn) it belongs to.
    pub run_id: String,
    /// The model step (0-based) it happened in.
    pub step: u32,
    /// Position among this run's events (0, 1, 2...). A replayed segment does not emit again
    /// what an earlier segment emitted, so events are never duplicated.
    pub seq: u64,
    /// What happened.
    #[serde(flatten)]
    pub kind: RunEventKind,
}

/// What happened.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", content = "data")]
#[non_exhaustive]
pub enum RunEventKind {
    /// Text from the model, as it streams.
    #[serde(rename = "text.delta")]
    TextDelta {
        /// The new text.
        text: String,
    },
    /// A model tool call begins.
    #[serde(rename = "tool.started", rename_all = "camelCase")]
    ToolStarted {
        /// The model's tool call id.
        tool_call_id: String,
        /// `run_js` or the capability tool.
        name: String,
        /// The arguments.
        arguments: Value,
    },
    /// A model tool call ended; `result` is what the model sees (redacted).
    #[serde(rename = "tool.finished", rename_all = "camelCase")]
    ToolFinished {
        /// The model's tool call id.
        tool_call_id: String,
        /// The tool.
        name: String,
        /// What the model sees.
        result: Value,
        /// Whether the tool failed.
        is_error: bool,
        /// Fuel the script used (0 for direct tools).
        fuel: u64,
        /// Wall time in microseconds.
        wall_us: u64,
        /// Capability calls made.
        calls: u32,
        /// Bytes of the whole result when `result` is the form cut to fit the model's budget
        /// (the journal keeps the whole); absent when nothing was cut.
        #[serde(skip_serializing_if = "Option::is_none")]
        whole_bytes: Option<usize>,
        /// Each capability call of the script (or the direct tool's one call), in the order
        /// they were started: what each cost.
        #[serde(skip_serializing_if = "Vec::is_empty")]
        call_costs: Vec<CallCost>,
    },
    /// A gate needs a decision.
    #[serde(rename = "permission.requested")]
    PermissionRequested {
        /// The interaction.
        interaction: Interaction,
    },
    /// A gate was decided (by a person, or by auto-confirm).
    #[serde(rename = "permission.resolved", rename_all = "camelCase")]
    PermissionResolved {
        /// The interaction.
        interaction_id: String,
        /// The decision.
        approved: bool,
        /// Why.
        #[serde(skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
        /// Decided by the auto-confirm policy.
        auto: bool,
    },
    /// Older messages were summarized.
    #[serde(rename = "compaction", rename_all = "camelCase")]
    Compaction {
        /// Messages replaced by the summary.
        summarized_messages: usize,
        /// Messages kept verbatim.
        kept_messages: usize,
        /// Estimated tokens before and after.
        tokens_before: usize,
        /// Estimated tokens after.
        tokens_after: usize,
    },
    /// The run suspended for a person.
    #[serde(rename = "run.suspended")]
    Suspended {
        /// What it waits on.
        interactions: Vec<Interaction>,
    },
    /// The run waits on external executors.
    #[serde(rename = "run.waiting", rename_all = "camelCase")]
    Waiting {
        /// The effects waited on.
        effect_ids: Vec<String>,
    },
}

impl RunEventKind {
    /// The event's type name, such as `tool.started`.
    pub fn type_name(&self) -> &'static str {
        match self {
            RunEventKind::TextDelta { .. } => "text.delta",
            RunEventKind::ToolStarted { .. } => "tool.started",
            RunEventKind::ToolFinished { .. } => "tool.finished",
            RunEventKind::PermissionRequested { .. } => "permission.requested",
            RunEventKind::PermissionResolved { .. } => "permission.resolved",
            RunEventKind::Compaction { .. } => "compaction",
            RunEventKind::Suspended { .. } => "run.suspended",
            RunEventKind::Waiting { .. } => "run.waiting",
        }
    }

    /// The event's data as JSON.
    pub fn data(&self) -> Value {
        serde_json::to_value(self)
            .ok()
            .and_then(|mut v| v.get_mut("data").map(Value::take))
            .unwrap_or(Value::Null)
    }
}

/// Why a sink refused an event (the run fails: events are part of the durable record).
#[derive(Debug, thiserror::Error)]
#[error("the event sink failed: {0}")]
pub struct SinkError(pub String);

/// Receives a run's events, in order.
#[async_trait]
pub trait EventSink: Send + Sync {
    /// Takes one event.
    async fn emit(&self, event: RunEvent) -> Result<(), SinkError>;
}

/// Keeps every event in memory (tests, `corral chat`'s transcript).
#[derive(Debug, Default)]
pub struct VecSink {
    events: Mutex<Vec<RunEvent>>,
}

impl VecSink {
    /// The events so far.
    pub fn events(&self) -> Vec<RunEvent> {
        self.events.lock().map(|e| e.clone()).unwrap_or_default()
    }
}

#[async_trait]
impl EventSink for VecSink {
    async fn emit(&self, event: RunEvent) -> Result<(), SinkError> {
        if let Ok(mut events) = self.events.lock() {
            events.push(event);
        }
        Ok(())
    }
}

/// Discards events.
#[derive(Debug, Default, Clone, Copy)]
pub struct NullSink;

#[async_trait]
impl EventSink for NullSink {
    async fn emit(&self, _event: RunEvent) -> Result<(), SinkError> {
        Ok(())
    }
}
