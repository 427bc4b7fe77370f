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
//! - `tools.$search({query, limit?})` and `tools.$describe({path})`: discovery for large
//!   catalogs ([`corral_catalog::Catalog::search`], [`corral_catalog::Catalog::describe`]).
//!   They answer from the turn's catalog and call no backend, but go through the journal like
//!   any capability call ([`is_discovery`]): a replayed script reads the answers its first run
//!   got, whatever the catalog's rendering has become since.
//!
//! The `$` prefix keeps them apart from catalog capabilities: a catalog that binds a name the
//! runtime needs is refused when the run starts.

use std::sync::OnceLock;

use corral_catalog::{Capability, Catalog, LoadCatalogError};
use corral_sandbox::{Invocation, InvokeCapabilityError, ToolResult};
use serde_json::{Value, json};

use crate::journal::{ConversationStore, Journaled};

/// `tools.$result({id})`.
pub(crate) const RESULT: &str = "$result";
/// `tools.$search({query, limit?})`.
pub(crate) const SEARCH: &str = "$search";
/// `tools.$describe({path})`.
pub(crate) const DESCRIBE: &str = "$describe";

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
    let mut search = Capability::new(
        SEARCH,
        json!({
            "type": "object",
            "properties": {
                "query": {"type": "string", "minLength": 1, "maxLength": 1000,
                    "description": "Words of what the capability does or is named."},
                "limit": {"type": "integer", "minimum": 1,
                    "maximum": corral_catalog::MAX_SEARCH_RESULTS,
                    "description": "How many results at most (default 5)."},
            },
            "required": ["query"],
            "additionalProperties": false,
        }),
    );
    search.description = Some(
        "The capabilities that best match the query, with their TypeScript declarations.".into(),
    );
    let mut describe = Capability::new(
        DESCRIBE,
        json!({
            "type": "object",
            "properties": {"path": {"type": "string", "minLength": 1, "maxLength": 1000,
                "description": "A capability's id or path, such as \"github.issues.list\"."}},
            "required": ["path"],
            "additionalProperties": false,
        }),
    );
    describe.description =
        Some("One capability's TypeScript declaration, description and examples.".into());
    vec![result, search, describe]
}

/// What scripts are bound to: `catalog` and the runtime's functions (compiled once per
/// process, and shared by every run's catalog).
pub(crate) fn script_catalog(catalog: &Catalog) -> Result<Catalog, LoadCatalogError> {
    static RUNTIME: OnceLock<Catalog> = OnceLock::new();
    let runtime = match RUNTIME.get() {
        Some(runtime) => runtime,
        None => {
            let compiled = Catalog::new(capabilities())?;
            RUNTIME.get_or_init(|| compiled)
        }
    };
    catalog.with_catalog(runtime)
}

/// Whether `capability_id` is a runtime function answered from the journal without an entry of
/// its own ([`answer`]): `$result`.
pub(crate) fn is_read_from_journal(capability_id: &str) -> bool {
    capability_id == RESULT
}

/// Whether `capability_id` is a discovery function: answered by [`discover`], through the
/// journal.
pub(crate) fn is_discovery(capability_id: &str) -> bool {
    matches!(capability_id, SEARCH | DESCRIBE)
}

/// Answers `tools.$search` or `tools.$describe` from `catalog`.
pub(crate) fn discover(
    catalog: &Catalog,
    invocation: &Invocation,
) -> Result<ToolResult, InvokeCapabilityError> {
    let failed = |message: String| InvokeCapabilityError::Failed {
        capability_id: invocation.capability_id.clone(),
        message,
    };
    let text = |name: &str| {
        invocation
            .argument()
            .get(name)
            .and_then(Value::as_str)
            .unwrap_or_default()
    };
    match invocation.capability_id.as_str() {
        SEARCH => {
            let limit = invocation
                .argument()
                .get("limit")
                .and_then(Value::as_u64)
                .map_or(corral_catalog::DEFAULT_SEARCH_RESULTS, |n| {
                    usize::try_from(n).unwrap_or(usize::MAX)
                });
            let hits = catalog
                .search(text("query"), limit)
                .map_err(|error| failed(error.to_string()))?;
            Ok(ToolResult::new(Value::Array(hits)))
        }
        DESCRIBE => catalog
            .describe(text("path"))
            .map(ToolResult::new)
            .map_err(|error| failed(error.to_string())),
        other => Err(InvokeCapabilityError::UnknownCapability {
            capability_id: other.to_string(),
        }),
    }
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
