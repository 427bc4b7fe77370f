//! The turn checkpoint: what a turn needs to run again from its start, in another process if
//! need be. One type, written by the store's transitions (`message` writes segment 0, a decision
//! the next segment, a suspension the pending interactions) and read by the turn engine; it is
//! stored as the live checkpoint's `data`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The data of a turn's live checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TurnCheckpoint {
    /// Format version, 1.
    pub version: u32,
    /// The turn.
    pub turn_id: String,
    /// The user message that started the turn.
    pub message: String,
    /// Interactions the turn is paused on (empty unless paused).
    #[serde(default)]
    pub pending: Vec<Interaction>,
    /// Decisions taken so far in this turn, by interaction id.
    #[serde(default)]
    pub decisions: BTreeMap<String, Decision>,
    /// Fingerprint of the catalog, manifest and implementation version the turn was suspended
    /// under; a resume under another fingerprint is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fingerprint: Option<String>,
    /// The W3C `traceparent` of the command that started the turn, when it was traced: every
    /// segment of the turn, in whatever process, joins or links to that trace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_context: Option<String>,
}

impl TurnCheckpoint {
    /// The checkpoint of a new turn: the message, nothing decided.
    pub fn new_turn(turn_id: impl Into<String>, message: impl Into<String>) -> Self {
        TurnCheckpoint {
            version: 1,
            turn_id: turn_id.into(),
            message: message.into(),
            pending: Vec::new(),
            decisions: BTreeMap::new(),
            fingerprint: None,
            trace_context: None,
        }
    }
}

/// A call the turn is paused on, waiting for a person.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Interaction {
    /// Stable id: the position of the gated call in the turn.
    pub interaction_id: String,
    /// `approval` (decided by `approve`) or `input` (answered by `respond`).
    pub kind: String,
    /// `run_js` or the direct tool's name.
    pub tool_name: String,
    /// The gated capability (calls policy and direct tools).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capability_id: Option<String>,
    /// What is to be approved.
    pub arguments: Value,
    /// SHA-256 (hex) of the arguments' canonical JSON.
    pub arguments_sha256: String,
}

/// A person's decision on an interaction.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Decision {
    /// Approved or rejected.
    pub approved: bool,
    /// Why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// A value given with `respond` (unused by approvals).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<Value>,
}
