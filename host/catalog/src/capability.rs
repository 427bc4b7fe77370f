//! Capability definitions and the two file formats they are read from.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One capability (tool) as the model and the host see it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Capability {
    /// Canonical id, such as `github.issues.list`; unique within a catalog.
    pub id: String,
    /// Where the guest binds the function under `tools`, such as `["github", "issues", "list"]`.
    /// Defaults to the id split on `.`.
    pub js_path: Vec<String>,
    /// What the capability does, shown to the model as a doc comment.
    pub description: Option<String>,
    /// JSON Schema of the single object argument.
    pub input_schema: Value,
    /// JSON Schema of the result, if the capability declares one.
    pub output_schema: Option<Value>,
    /// Example inputs (objects), validated against the input schema when the catalog is built.
    pub examples: Vec<Value>,
    /// The result reaches the script as a string, even when it looks like JSON.
    pub text_output: bool,
    /// A call to this capability needs the user's approval.
    pub needs_approval: bool,
}

impl Capability {
    /// A capability with the given id and input schema, the JS path derived from the id, and
    /// everything else empty.
    pub fn new(id: impl Into<String>, input_schema: Value) -> Capability {
        let id = id.into();
        let js_path = default_js_path(&id);
        Capability {
            id,
            js_path,
            description: None,
            input_schema,
            output_schema: None,
            examples: Vec::new(),
            text_output: false,
            needs_approval: false,
        }
    }
}

pub(crate) fn default_js_path(id: &str) -> Vec<String> {
    id.split('.').map(str::to_owned).collect()
}

/// The corral catalog file: `{"capabilities": [...]}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CatalogFile {
    pub(crate) capabilities: Vec<CapabilityDefinition>,
}

/// One entry of the corral catalog file, as tools outside corral write it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CapabilityDefinition {
    id: String,
    #[serde(default)]
    js_path: Option<Vec<String>>,
    #[serde(default)]
    description: Option<String>,
    input_schema: Value,
    #[serde(default)]
    output_schema: Option<Value>,
    #[serde(default)]
    examples: Vec<Value>,
    #[serde(default)]
    text_output: bool,
    #[serde(default)]
    needs_approval: bool,
}

impl From<CapabilityDefinition> for Capability {
    fn from(definition: CapabilityDefinition) -> Capability {
        let js_path = definition
            .js_path
            .unwrap_or_else(|| default_js_path(&definition.id));
        Capability {
            id: definition.id,
            js_path,
            description: definition.description,
            input_schema: definition.input_schema,
            output_schema: definition.output_schema,
            examples: definition.examples,
            text_output: definition.text_output,
            needs_approval: definition.needs_approval,
        }
    }
}

/// The result of an MCP `tools/list` request.
///
/// Unknown fields are tolerated here, unlike in corral's own format: the MCP specification adds
/// fields to `Tool` in each revision (`title`, `annotations`, `icons`, `execution`, ...) and asks
/// clients to ignore what they do not know, so a strict reader would reject real servers.
#[derive(Debug, Deserialize)]
pub(crate) struct McpToolsList {
    pub(crate) tools: Vec<McpTool>,
}

/// One MCP tool; only the fields corral uses.
#[derive(Debug, Deserialize)]
pub(crate) struct McpTool {
    pub(crate) name: String,
    #[serde(default)]
    pub(crate) description: Option<String>,
    #[serde(rename = "inputSchema")]
    pub(crate) input_schema: Value,
    #[serde(rename = "outputSchema", default)]
    pub(crate) output_schema: Option<Value>,
}

impl McpTool {
    /// The capability for this tool, its id prefixed with `namespace` (when not empty). The tool
    /// name stays one JS part even if it contains dots, so `tools.<namespace>.<name>` always
    /// reaches it.
    pub(crate) fn into_capability(self, namespace: &str) -> Capability {
        let (id, js_path) = if namespace.is_empty() {
            (self.name.clone(), vec![self.name])
        } else {
            let mut js_path = default_js_path(namespace);
            let id = format!("{namespace}.{}", self.name);
            js_path.push(self.name);
            (id, js_path)
        };
        Capability {
            id,
            js_path,
            description: self.description,
            input_schema: self.input_schema,
            output_schema: self.output_schema,
            examples: Vec::new(),
            text_output: false,
            needs_approval: false,
        }
    }
}
