//! The agent manifest (unknown fields rejected), its validation and its content hash.
//!
//! The hash is `sha256:` + the hex SHA-256 of the manifest's canonical JSON: object keys sorted
//! by code point, no whitespace, strings as UTF-8 without ASCII escaping (only `"`, `\` and
//! control characters are escaped, as JSON requires), numbers as `serde_json` writes them.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

/// The built-in capabilities (corral's example tools) a `"kind": "builtin"` capability may name.
pub const BUILTIN_CAPABILITIES: &[&str] = &[
    "examples.echo",
    "examples.sleep",
    "examples.text",
    "examples.fail",
];

/// An agent manifest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Manifest {
    /// The agent id; equal to the path of `PUT /v1/agents/{agentId}`.
    pub id: String,
    /// The system instructions.
    #[serde(default)]
    pub instructions: String,
    /// The model.
    pub model: ModelSpec,
    /// `js` (the model writes scripts) or `direct` (capabilities are model tools).
    #[serde(default)]
    pub mode: Mode,
    /// What a person approves: each `script`, or each gated capability call (`calls`).
    #[serde(default)]
    pub approval: Approval,
    /// Approve without asking.
    #[serde(default)]
    pub auto_confirm: bool,
    /// Capabilities: the catalog format of `corral exec --catalog` plus `kind`.
    #[serde(default)]
    #[schema(value_type = Vec<Object>)]
    pub capabilities: Vec<Value>,
    /// Model calls allowed per turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_steps: Option<u32>,
    /// Script limits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<Limits>,
    /// The most estimated tokens one tool result may take in the model's context (64 to
    /// 1,000,000; default 6,000): a larger one is cut to fit, keeping its shape.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result_tokens: Option<u32>,
    /// The most estimated tokens `run_js`'s description may spend on declarations (0 to
    /// 1,000,000; default 8,000): above it the catalog is listed a line per capability and the
    /// model looks declarations up with `tools.$search` and `tools.$describe`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub discovery_tokens: Option<u32>,
    /// MCP servers whose tools become capabilities `NAME.tool` (stdio `{"name", "command",
    /// "args", "env", "cwd"}` or streamable HTTP `{"name", "url", "headers"}`; secrets as
    /// `{"secretRef": "NAME"}`, read from the server's `CORRAL_SECRET_NAME`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schema(value_type = Vec<Object>)]
    pub mcp_servers: Vec<corral_mcp::McpServerConfig>,
}

/// The model an agent talks to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "provider", rename_all = "lowercase", deny_unknown_fields)]
pub enum ModelSpec {
    /// Replies fixed in advance: reply i answers the session's i-th model call.
    Scripted {
        /// The replies.
        #[serde(default)]
        replies: Vec<ScriptedReply>,
    },
    /// OpenAI's chat API (the key comes from the server's configuration).
    Openai {
        /// The model name.
        model: String,
        /// Another endpoint.
        #[serde(default, rename = "baseUrl", skip_serializing_if = "Option::is_none")]
        base_url: Option<String>,
    },
    /// Anthropic's messages API (the key comes from the server's configuration).
    Anthropic {
        /// The model name.
        model: String,
        /// Another endpoint.
        #[serde(default, rename = "baseUrl", skip_serializing_if = "Option::is_none")]
        base_url: Option<String>,
    },
}

/// One scripted model reply.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ScriptedReply {
    /// Text of the reply.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// Tool calls of the reply.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
}

/// A scripted tool call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ToolCall {
    /// The tool.
    pub name: String,
    /// Its arguments.
    #[schema(value_type = Object)]
    pub arguments: Value,
}

/// How the model acts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// The model writes JavaScript run in the sandbox.
    #[default]
    Js,
    /// Capabilities are the model's tools.
    Direct,
}

/// What needs a person's approval.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Approval {
    /// Each script.
    #[default]
    Script,
    /// Each call of a capability that needs approval.
    Calls,
}

/// Script limits (those of `corral exec`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Limits {
    /// Fuel budget.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fuel: Option<u64>,
    /// Wall-clock budget, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// Linear-memory cap, in MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mb: Option<u64>,
    /// Calls in flight at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrent_calls: Option<u32>,
    /// Calls in all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_total_calls: Option<u32>,
}

impl Limits {
    /// The limits' ranges, those `corral exec` and the sandbox enforce: fuel, the timeout, the
    /// memory cap and concurrent calls at least 1; the timeout at most a day; memory at most
    /// the guest's declared maximum.
    pub fn check(&self) -> Result<(), ManifestError> {
        let max_memory_mb = corral_sandbox::GUEST_MAX_MEMORY_BYTES >> 20;
        let ranges = [
            ("fuel", self.fuel, 1, u64::MAX),
            (
                "timeoutMs",
                self.timeout_ms,
                1,
                corral_sandbox::MAX_TIMEOUT_MS,
            ),
            ("memoryMb", self.memory_mb, 1, max_memory_mb),
            (
                "maxConcurrentCalls",
                self.max_concurrent_calls.map(u64::from),
                1,
                u64::from(u32::MAX),
            ),
        ];
        for (name, value, low, high) in ranges {
            if let Some(value) = value
                && !(low..=high).contains(&value)
            {
                return Err(ManifestError(format!(
                    "manifest.limits.{name} must be between {low} and {high}, not {value}"
                )));
            }
        }
        Ok(())
    }
}

/// Where a capability runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CapabilityKind {
    /// One of corral's example tools, by id.
    Builtin,
    /// POSTed to `webhookUrl` in the webhook format of `corral exec`.
    Webhook,
    /// Run by external executors.
    Action,
}

/// A manifest that parsed but is not usable.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ManifestError(pub String);

impl Manifest {
    /// Parses a manifest from JSON (unknown fields rejected, errors naming the field) and checks
    /// its capabilities.
    pub fn from_value(value: &Value) -> Result<Manifest, ManifestError> {
        let manifest: Manifest = serde_path_to_error::deserialize(value).map_err(|error| {
            ManifestError(format!("manifest.{}: {}", error.path(), error.inner()))
        })?;
        manifest.check()?;
        Ok(manifest)
    }

    /// Checks what serde cannot: ids, capability kinds and definitions.
    pub fn check(&self) -> Result<(), ManifestError> {
        if self.id.trim().is_empty() {
            return Err(ManifestError("manifest.id must not be empty".to_owned()));
        }
        if self.max_steps == Some(0) {
            return Err(ManifestError(
                "manifest.maxSteps must be positive".to_owned(),
            ));
        }
        if let Some(limits) = &self.limits {
            limits.check()?;
        }
        let budgets = [
            ("resultTokens", self.result_tokens, 64),
            ("discoveryTokens", self.discovery_tokens, 0),
        ];
        for (name, value, low) in budgets {
            if let Some(value) = value
                && !(low..=1_000_000).contains(&value)
            {
                return Err(ManifestError(format!(
                    "manifest.{name} must be between {low} and 1000000, not {value}"
                )));
            }
        }
        let mut catalog = Vec::new();
        let mut ids = std::collections::HashMap::new();
        for (index, capability) in self.capabilities.iter().enumerate() {
            let at = format!("manifest.capabilities[{index}]");
            let Some(object) = capability.as_object() else {
                return Err(ManifestError(format!("{at} must be an object")));
            };
            if let Some(id) = object.get("id").and_then(Value::as_str)
                && let Some(first) = ids.insert(id.to_owned(), index)
            {
                return Err(ManifestError(format!(
                    "{at}.id {id:?} repeats manifest.capabilities[{first}].id; capability ids must be unique"
                )));
            }
            let mut definition = object.clone();
            let kind: CapabilityKind = match definition.remove("kind") {
                None => return Err(ManifestError(format!("{at}.kind is required"))),
                Some(kind) => serde_json::from_value(kind).map_err(|_| {
                    ManifestError(format!("{at}.kind must be builtin, webhook or action"))
                })?,
            };
            let webhook = definition.remove("webhookUrl");
            match (kind, definition.remove("webhookSecretRef")) {
                (_, None) => {}
                (CapabilityKind::Webhook, Some(Value::String(name)))
                    if !name.is_empty()
                        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') => {}
                (CapabilityKind::Webhook, Some(_)) => {
                    return Err(ManifestError(format!(
                        "{at}.webhookSecretRef must name a secret (letters, digits, _) read from CORRAL_SECRET_NAME"
                    )));
                }
                (_, Some(_)) => {
                    return Err(ManifestError(format!(
                        "{at}.webhookSecretRef is only for webhook capabilities"
                    )));
                }
            }
            match (kind, &webhook) {
                (CapabilityKind::Webhook, Some(Value::String(url)))
                    if url.starts_with("http://") || url.starts_with("https://") => {}
                (CapabilityKind::Webhook, _) => {
                    return Err(ManifestError(format!(
                        "{at}.webhookUrl must be an http(s) URL for a webhook capability"
                    )));
                }
                (_, Some(_)) => {
                    return Err(ManifestError(format!(
                        "{at}.webhookUrl is only for webhook capabilities"
                    )));
                }
                (_, None) => {}
            }
            let id = definition.get("id").and_then(Value::as_str).unwrap_or("");
            if kind == CapabilityKind::Builtin {
                if !BUILTIN_CAPABILITIES.contains(&id) {
                    return Err(ManifestError(format!(
                        "{at}.id {id:?} is not a builtin capability (one of {})",
                        BUILTIN_CAPABILITIES.join(", ")
                    )));
                }
                // A builtin brings its own definition; the manifest may name it alone.
                if !definition.contains_key("input_schema") {
                    continue;
                }
            }
            catalog.push(Value::Object(definition));
        }
        let catalog = serde_json::json!({ "capabilities": catalog }).to_string();
        corral_catalog::Catalog::from_json_str(&catalog)
            .map_err(|error| ManifestError(format!("manifest.capabilities: {error}")))?;
        corral_mcp::validate_servers(&self.mcp_servers)
            .map_err(|error| ManifestError(format!("manifest.mcpServers: {error}")))?;
        Ok(())
    }
}

/// `sha256:` + hex SHA-256 of the canonical JSON of `manifest`.
pub fn manifest_hash(manifest: &Value) -> String {
    format!("sha256:{}", corral_chat::sha256_json(manifest))
}

/// Canonical JSON: object keys sorted, no whitespace, strings unescaped UTF-8.
pub use corral_chat::canonical_json;

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn canonical_json_sorts_keys_and_keeps_utf8() {
        let value = json!({"b": [1, {"z": "é", "a": null}], "a": "x\"y"});
        assert_eq!(
            canonical_json(&value),
            r#"{"a":"x\"y","b":[1,{"a":null,"z":"é"}]}"#
        );
        assert_eq!(
            manifest_hash(&json!({"b": 1, "a": 2})),
            manifest_hash(&json!({"a": 2, "b": 1}))
        );
        assert!(manifest_hash(&json!({})).starts_with("sha256:"));
        assert_eq!(manifest_hash(&json!({})).len(), 7 + 64);
    }

    #[test]
    fn manifests_reject_unknown_fields_naming_them() {
        let good =
            json!({"id": "a", "model": {"provider": "scripted", "replies": [{"text": "hi"}]}});
        Manifest::from_value(&good).expect("valid");
        let mut bad = good.clone();
        bad["colour"] = json!("red");
        let error = Manifest::from_value(&bad)
            .expect_err("unknown field")
            .to_string();
        assert!(error.contains("colour"), "{error}");
        let bad = json!({"id": "a", "model": {"provider": "scripted", "replies": [{"txt": "hi"}]}});
        let error = Manifest::from_value(&bad)
            .expect_err("unknown field")
            .to_string();
        assert!(error.contains("txt"), "{error}");
        let bad = json!({"id": "a", "model": {"provider": "scripted", "temperature": 1}});
        assert!(Manifest::from_value(&bad).is_err());
        let bad = json!({"id": "a", "model": {"provider": "openai"}});
        assert!(Manifest::from_value(&bad).is_err());
    }

    #[test]
    fn model_budgets_are_checked_against_their_ranges() {
        let with = |name: &str, value: u64| {
            let mut manifest = json!({"id": "a", "model": {"provider": "scripted"}});
            manifest[name] = json!(value);
            Manifest::from_value(&manifest).map(|m| (m.result_tokens, m.discovery_tokens))
        };
        assert_eq!(with("resultTokens", 64).expect("valid"), (Some(64), None));
        assert_eq!(with("discoveryTokens", 0).expect("valid"), (None, Some(0)));
        let error = with("resultTokens", 63).expect_err("below").to_string();
        assert_eq!(
            error,
            "manifest.resultTokens must be between 64 and 1000000, not 63"
        );
        assert!(with("discoveryTokens", 1_000_001).is_err());
    }

    #[test]
    fn capabilities_are_checked() {
        let with = |capability: Value| {
            Manifest::from_value(&json!({
                "id": "a", "model": {"provider": "scripted"}, "capabilities": [capability]
            }))
        };
        with(json!({"kind": "builtin", "id": "examples.echo"})).expect("builtin");
        with(json!({"kind": "action", "id": "crm.update",
            "input_schema": {"type": "object"}}))
        .expect("action");
        with(
            json!({"kind": "webhook", "id": "w.x", "webhookUrl": "http://127.0.0.1:1/x",
            "input_schema": {"type": "object"}}),
        )
        .expect("webhook");
        assert!(with(json!({"kind": "webhook", "id": "w.x", "input_schema": {}})).is_err());
        assert!(with(json!({"kind": "builtin", "id": "rm.rf"})).is_err());
        assert!(with(json!({"id": "x", "input_schema": {}})).is_err());
        assert!(with(json!({"kind": "action", "id": "x"})).is_err());
    }
}
