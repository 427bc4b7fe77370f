//! A small built-in catalog and backend, bound by `corral exec` when no catalog is given and
//! used by the tests and benchmarks: enough to try concurrency, text output and errors without
//! writing a backend.
//!
//! | capability | input | result |
//! |---|---|---|
//! | `examples.echo` | any object | the input |
//! | `examples.sleep` | `{ms}` (0..=60000) | `{slept_ms}` after waiting on the host timer, without blocking other calls |
//! | `examples.text` | `{text}` | `text`, as a string even if it looks like JSON (a `text_output` capability) |
//! | `examples.fail` | `{message}` | always fails with `message` |

use std::time::Duration;

use corral_catalog::Catalog;
use serde_json::{Value, json};

use crate::backend::{Backend, Invocation, InvocationContext, InvokeCapabilityError, ToolResult};

/// The catalog of the built-in example capabilities. Its schemas are checked and compiled
/// when a script first calls each capability (`Catalog::built_in_from_json_str`), so a script
/// that calls none does not pay for the meta-schema; a test runs the full check.
pub fn example_catalog() -> Catalog {
    match Catalog::built_in_from_json_str(&example_catalog_json().to_string()) {
        Ok(catalog) => catalog,
        // The catalog below is a constant; a test checks it loads with every check.
        Err(error) => panic!("the built-in example catalog is invalid: {error}"),
    }
}

/// The example catalog in corral's catalog format.
pub fn example_catalog_json() -> Value {
    json!({"capabilities": [
        {
            "id": "examples.echo",
            "description": "Returns its input unchanged.",
            "input_schema": {"type": "object"},
            "examples": [{"hello": "world"}]
        },
        {
            "id": "examples.sleep",
            "description": "Waits `ms` milliseconds on the host, then returns {slept_ms}. Other calls keep running meanwhile.",
            "input_schema": {
                "type": "object",
                "properties": {"ms": {"type": "integer", "minimum": 0, "maximum": 60000}},
                "required": ["ms"],
                "additionalProperties": false
            },
            "output_schema": {
                "type": "object",
                "properties": {"slept_ms": {"type": "integer"}},
                "required": ["slept_ms"]
            },
            "examples": [{"ms": 100}]
        },
        {
            "id": "examples.text",
            "description": "Returns `text` as a plain string.",
            "input_schema": {
                "type": "object",
                "properties": {"text": {"type": "string"}},
                "required": ["text"],
                "additionalProperties": false
            },
            "text_output": true
        },
        {
            "id": "examples.fail",
            "description": "Always fails with the given message.",
            "input_schema": {
                "type": "object",
                "properties": {"message": {"type": "string"}},
                "required": ["message"],
                "additionalProperties": false
            }
        }
    ]})
}

/// Runs the example capabilities.
#[derive(Debug, Clone, Copy, Default)]
pub struct ExampleBackend;

#[async_trait::async_trait]
impl Backend for ExampleBackend {
    async fn invoke(
        &self,
        _context: &InvocationContext,
        invocation: Invocation,
    ) -> Result<ToolResult, InvokeCapabilityError> {
        let input = invocation.argument().clone();
        match invocation.capability_id.as_str() {
            "examples.echo" => Ok(ToolResult::new(input)),
            "examples.sleep" => {
                let ms = input.get("ms").and_then(Value::as_u64).unwrap_or(0);
                tokio::time::sleep(Duration::from_millis(ms)).await;
                Ok(ToolResult::new(json!({ "slept_ms": ms })))
            }
            "examples.text" => Ok(ToolResult::new(
                input.get("text").cloned().unwrap_or(Value::Null),
            )),
            "examples.fail" => Err(InvokeCapabilityError::Failed {
                capability_id: invocation.capability_id,
                message: input
                    .get("message")
                    .and_then(Value::as_str)
                    .unwrap_or("failed")
                    .to_string(),
            }),
            _ => Err(InvokeCapabilityError::UnknownCapability {
                capability_id: invocation.capability_id,
            }),
        }
    }
}
