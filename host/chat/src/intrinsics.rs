//! The runtime's own functions under `tools.$…`: answered by the chat runtime itself, never by
//! a backend, and bound beside the catalog's capabilities so a script calls them like any
//! capability (one object argument, a promise).
//!
//! - `tools.$result({id})`: the whole value of an earlier tool result of this turn whose shown
//!   form was cut to fit the model's budget ([`crate::fit`]). The value goes from the journal to
//!   the script, never through the model's context. It reads the journal only, and a journaled
//!   result never changes, so a replayed script reads the same value: it needs no journal
//!   entry of its own.
//!
//! The `$` prefix keeps them apart from catalog capabilities: a catalog that binds a name the
//! runtime needs is refused when the run starts.

use corral_catalog::{Capability, Catalog, LoadCatalogError};
use corral_sandbox::{Invocation, InvokeCapabilityError, ToolResult};
use serde_json::{Value, json};

use crate::journal::{ConversationStore, Journaled};

/// `tools.$result({id})`.
pub(crate) const RESULT: &str = "$result";

/// The runtime's functions as capabilities to bind.
fn capabilities() -> Vec<Capability> {
    let mut result = Capability::new(
        RESULT,
        json!({
            "type": "object",
            "properties": {"id": {
                "type": "string",
                "description": "The result id a cut result names, such as \"s0t0\".",
                "pattern": "^s[0-9]+t[0-9]+$",
            }},
            "required": ["id"],
            "additionalProperties": false,
        }),
    );
    result.description =
        Some("The whole value of an earlier tool result of this turn that was cut to fit.".into());
    vec![result]
}

/// What scripts are bound to: `catalog` and the runtime's functions.
pub(crate) fn script_catalog(catalog: &Catalog) -> Result<Catalog, LoadCatalogError> {
    catalog.with_capabilities(capabilities())
}

/// Whether `capability_id` is one of the runtime's functions.
pub(crate) fn is_intrinsic(capability_id: &str) -> bool {
    matches!(capability_id, RESULT)
}

/// The id a model-facing result goes by: `s{step}t{k}` for the tool call `{turn}:s{step}:t{k}`.
pub(crate) fn result_id(tool_id: &str) -> String {
    let mut parts = tool_id.rsplit(':');
    let tool = parts.next().unwrap_or_default();
    let step = parts.next().unwrap_or_default();
    format!("{step}{tool}")
}

/// The journal id of the result `id` (`s{step}t{k}`) in `turn_id`, if `id` is one.
fn result_effect_id(turn_id: &str, id: &str) -> Option<String> {
    let (step, tool) = id.strip_prefix('s')?.split_once('t')?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    (digits(step) && digits(tool)).then(|| format!("{turn_id}:s{step}:t{tool}:result"))
}

/// Answers a call of one of the runtime's functions.
pub(crate) async fn answer(
    store: &dyn ConversationStore,
    turn_id: &str,
    invocation: &Invocation,
) -> Result<ToolResult, InvokeCapabilityError> {
    let failed = |message: String| InvokeCapabilityError::Failed {
        capability_id: invocation.capability_id.clone(),
        message,
    };
    match invocation.capability_id.as_str() {
        RESULT => {
            let id = invocation
                .argument()
                .get("id")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let effect_id = result_effect_id(turn_id, id)
                .ok_or_else(|| failed(format!("{id:?} is not a result id (such as \"s0t0\")")))?;
            let record = match store.lookup(&effect_id).await {
                Ok(Some(Journaled::Completed(record))) => record,
                Ok(_) => {
                    return Err(failed(format!(
                        "no result {id} in this turn: ids are those cut results name"
                    )));
                }
                Err(error) => return Err(failed(format!("the journal failed: {error}"))),
            };
            Ok(ToolResult::new(whole_value(&record)))
        }
        other => Err(InvokeCapabilityError::UnknownCapability {
            capability_id: other.to_string(),
        }),
    }
}

/// The value a result record holds whole: a script's returned value (or its error report), a
/// direct tool's output.
fn whole_value(record: &Value) -> Value {
    let content = record["content"].as_str().unwrap_or_default();
    let parsed: Value =
        serde_json::from_str(content).unwrap_or_else(|_| Value::String(content.to_string()));
    if record["tool"] == crate::run::RUN_JS && parsed["ok"] == true {
        return parsed.get("value").cloned().unwrap_or(Value::Null);
    }
    parsed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn result_ids_name_a_tool_call_of_the_turn() {
        assert_eq!(result_id("turn-1:s2:t0"), "s2t0");
        assert_eq!(
            result_effect_id("turn-1", "s2t0").as_deref(),
            Some("turn-1:s2:t0:result")
        );
        for bad in ["", "s2", "t0", "s2t", "sxt0", "s2t0:x", "s-1t0"] {
            assert_eq!(result_effect_id("turn-1", bad), None, "{bad}");
        }
    }
}
