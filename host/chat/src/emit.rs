//! Numbering and sending a run's events.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::Value;

use crate::sink::{EventSink, RunEvent, RunEventKind};
use crate::types::Interaction;

/// Sends events with the run id, step and sequence number. A sink failure is remembered and
/// fails the run at its next check (events are part of the durable record).
pub(crate) struct Emitter {
    sink: Arc<dyn EventSink>,
    run_id: String,
    seq: AtomicU64,
    failed: std::sync::Mutex<Option<String>>,
}

impl Emitter {
    pub(crate) fn new(sink: Arc<dyn EventSink>, run_id: String) -> Self {
        Emitter {
            sink,
            run_id,
            seq: AtomicU64::new(0),
            failed: std::sync::Mutex::new(None),
        }
    }

    pub(crate) async fn emit(&self, step: u32, kind: RunEventKind) {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let event = RunEvent {
            run_id: self.run_id.clone(),
            step,
            seq,
            kind,
        };
        if let Err(error) = self.sink.emit(event).await
            && let Ok(mut failed) = self.failed.lock()
        {
            failed.get_or_insert(error.to_string());
        }
    }

    pub(crate) fn failure(&self) -> Option<String> {
        self.failed.lock().ok().and_then(|f| f.clone())
    }

    pub(crate) async fn permission_requested(&self, step: u32, interaction: Interaction) {
        self.emit(step, RunEventKind::PermissionRequested { interaction })
            .await;
    }

    pub(crate) async fn permission_resolved(
        &self,
        step: u32,
        interaction_id: &str,
        approved: bool,
        reason: Option<String>,
        auto: bool,
    ) {
        self.emit(
            step,
            RunEventKind::PermissionResolved {
                interaction_id: interaction_id.to_string(),
                approved,
                reason,
                auto,
            },
        )
        .await;
    }

    pub(crate) async fn tool_started(&self, step: u32, id: &str, name: &str, arguments: &Value) {
        self.emit(
            step,
            RunEventKind::ToolStarted {
                tool_call_id: id.to_string(),
                name: name.to_string(),
                arguments: arguments.clone(),
            },
        )
        .await;
    }
}
