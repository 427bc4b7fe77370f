//! `tools/list` into capabilities: namespacing, the catalog's MCP import, annotations, and the
//! catalog fingerprint.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use corral_catalog::{Capability, Catalog, check_renderable};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::config::{McpServerConfig, hex};
use crate::error::{McpListError, StartMcpServerError};
use crate::hub::{McpHub, ServerSlot};

/// The tools of a list of servers, as capabilities, with what was left out and why.
#[non_exhaustive]
pub struct McpCatalog {
    /// `NAME.tool` for every usable tool, bound at `tools.NAME.tool`, in server order and then
    /// the server's order.
    pub capabilities: Vec<Capability>,
    /// Servers that could not be listed and tools that were left out.
    pub errors: Vec<McpListError>,
    /// SHA-256 (hex) of the capabilities listed: it changes whenever a server's tool list
    /// changes (announced by `notifications/tools/list_changed`, see [`McpHub::generation`]).
    pub fingerprint: String,
    pub(crate) routes: Arc<HashMap<String, Route>>,
}

impl std::fmt::Debug for McpCatalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpCatalog")
            .field(
                "capabilities",
                &self.capabilities.iter().map(|c| &c.id).collect::<Vec<_>>(),
            )
            .field("errors", &self.errors)
            .field("fingerprint", &self.fingerprint)
            .finish()
    }
}

/// Where a capability's calls go.
#[derive(Clone)]
pub(crate) struct Route {
    pub(crate) slot: Arc<ServerSlot>,
    pub(crate) tool: String,
    pub(crate) text_output: bool,
}

impl McpCatalog {
    /// The capabilities as a checked [`Catalog`] of their own.
    pub fn to_catalog(&self) -> Result<Catalog, corral_catalog::LoadCatalogError> {
        Catalog::new(self.capabilities.clone())
    }
}

impl McpHub {
    /// Lists every page of `tools/list` of each server (starting those not running, all at
    /// once) and turns the tools into capabilities. A server that cannot be started or listed,
    /// and a tool whose definition is invalid or cannot be rendered, is reported in
    /// [`McpCatalog::errors`]; the rest still work. A server that cannot be listed keeps the
    /// tools of its last successful listing in this process or, never listed, the names of its
    /// `allowedTools` (with any object as input): their calls try the server again and fail with
    /// a `CapabilityError` naming it, so a script never finds `tools.NAME` undefined because the
    /// server is down. Only a server never listed and without `allowedTools` has no tools.
    pub async fn catalog(&self, servers: &[McpServerConfig]) -> McpCatalog {
        let listed =
            futures::future::join_all(servers.iter().map(|server| self.list_server(server))).await;
        let mut capabilities = Vec::new();
        let mut errors = Vec::new();
        let mut routes = HashMap::new();
        for (slot, result) in listed {
            let tools = match result {
                Ok(tools) => {
                    slot.keep_tools(&tools);
                    tools
                }
                Err(error) => {
                    errors.push(error);
                    slot.last_tools()
                        .unwrap_or_else(|| placeholder_tools(&slot.config))
                }
            };
            let mut seen = BTreeSet::new();
            for tool in tools {
                let Some(name) = tool.get("name").and_then(Value::as_str) else {
                    continue;
                };
                let name = name.to_owned();
                if !slot.config.allows_tool(&name) {
                    continue;
                }
                if !seen.insert(name.clone()) {
                    errors.push(McpListError::DuplicateTool {
                        server: slot.config.name.clone(),
                        tool: name,
                    });
                    continue;
                }
                match tool_capability(&slot.config, &name, tool) {
                    Ok(capability) => {
                        routes.insert(
                            capability.id.clone(),
                            Route {
                                slot: Arc::clone(&slot),
                                tool: name,
                                text_output: capability.text_output,
                            },
                        );
                        capabilities.push(capability);
                    }
                    Err(error) => errors.push(error),
                }
            }
        }
        let fingerprint = fingerprint(&capabilities);
        McpCatalog {
            capabilities,
            errors,
            fingerprint,
            routes: Arc::new(routes),
        }
    }

    async fn list_server(
        &self,
        config: &McpServerConfig,
    ) -> (Arc<ServerSlot>, Result<Vec<Value>, McpListError>) {
        let slot = self.slot(config);
        if self.is_closed() {
            let error = StartMcpServerError::Shutdown {
                server: config.name.clone(),
            };
            return (slot, Err(error.into()));
        }
        let result = async {
            let connection = slot.connection().await?;
            let listed = tokio::time::timeout(
                self.options().list_timeout,
                connection.peer.list_all_tools(),
            )
            .await;
            let failed = |message: String| McpListError::ListTools {
                server: config.name.clone(),
                message: slot.redactor().redact_text(&message).into_owned(),
            };
            match listed {
                Err(_) => Err(failed(format!(
                    "no answer within {} ms",
                    self.options().list_timeout.as_millis()
                ))),
                Ok(Err(rmcp::ServiceError::McpError(error))) => Err(failed(error.message.into())),
                Ok(Err(error)) => {
                    slot.connection_lost(&connection).await;
                    Err(failed(error.to_string()))
                }
                Ok(Ok(tools)) => {
                    slot.mark_healthy().await;
                    tools
                        .into_iter()
                        .map(|tool| serde_json::to_value(tool).map_err(|e| failed(e.to_string())))
                        .collect()
                }
            }
        }
        .await;
        (slot, result)
    }
}

/// The tools a server never listed is known to have: its `allowedTools`, each taking any object
/// and, with nothing known of it, needing approval unless the declaration says otherwise.
/// The description is the same whatever the error, so the catalog's fingerprint is too.
fn placeholder_tools(config: &McpServerConfig) -> Vec<Value> {
    let Some(allowed) = &config.allowed_tools else {
        return Vec::new();
    };
    allowed
        .iter()
        .map(|name| {
            json!({
                "name": name,
                "description": format!(
                    "MCP server {} could not be listed; a call tries it again.",
                    config.name
                ),
                "inputSchema": {"type": "object"},
                "annotations": {"destructiveHint": true},
            })
        })
        .collect()
}

/// One tool as a capability, through the catalog's own MCP import (so its checks apply), then
/// corral's reading of the MCP-only parts:
/// - `text_output` is true exactly when the tool declares no `outputSchema` (its result is the
///   text of its content); a tool with one returns its `structuredContent`;
/// - `needs_approval` is the server's `needsApproval` override for the tool, else true when the
///   tool's annotations say `destructiveHint: true` and not `readOnlyHint: true`;
/// - both hints (and `title`, when there is no description) are added to the description.
fn tool_capability(
    config: &McpServerConfig,
    name: &str,
    mut tool: Value,
) -> Result<Capability, McpListError> {
    let annotations = tool.get("annotations").cloned().unwrap_or(Value::Null);
    let hint = |key: &str| annotations.get(key).and_then(Value::as_bool);
    let read_only = hint("readOnlyHint") == Some(true);
    let destructive = hint("destructiveHint") == Some(true) && !read_only;
    let title = tool
        .get("title")
        .or_else(|| annotations.get("title"))
        .and_then(Value::as_str)
        .map(str::to_owned);
    // The import reads only what it knows; the rest of the tool is the SDK's business.
    if let Some(object) = tool.as_object_mut() {
        object.retain(|key, _| {
            matches!(
                key.as_str(),
                "name" | "description" | "inputSchema" | "outputSchema"
            )
        });
    }
    let document = json!({ "tools": [tool] }).to_string();
    let invalid = |source| McpListError::InvalidTool {
        server: config.name.clone(),
        tool: name.to_owned(),
        source: Box::new(source),
    };
    let single = Catalog::from_mcp_tools_json(&document, &config.name).map_err(invalid)?;
    if let Some(source) = check_renderable(&single).into_iter().next() {
        return Err(McpListError::UnrenderableTool {
            server: config.name.clone(),
            tool: name.to_owned(),
            source: Box::new(source),
        });
    }
    let Some(mut capability) = single.capabilities().first().cloned() else {
        return Err(McpListError::ListTools {
            server: config.name.clone(),
            message: format!("tool {name:?} produced no capability"),
        });
    };
    capability.text_output = capability.output_schema.is_none();
    capability.needs_approval = config
        .needs_approval
        .get(name)
        .copied()
        .unwrap_or(destructive);
    let mut description = capability.description.take().or(title).unwrap_or_default();
    let notes = match (read_only, destructive) {
        (true, _) => Some("Read-only: it does not change anything."),
        (false, true) => Some("Destructive: it may change or delete data."),
        (false, false) => None,
    };
    if let Some(note) = notes {
        if !description.is_empty() {
            description.push_str("\n\n");
        }
        description.push_str(note);
    }
    capability.description = (!description.is_empty()).then_some(description);
    // Check the final form too (text_output with an output schema is refused, for instance).
    Catalog::new(vec![capability.clone()]).map_err(invalid)?;
    Ok(capability)
}

fn fingerprint(capabilities: &[Capability]) -> String {
    let text = serde_json::to_string(capabilities).unwrap_or_default();
    hex(&Sha256::digest(text.as_bytes()))
}
