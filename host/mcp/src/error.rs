//! What can go wrong with an MCP server, named for the server (and tool) at fault. No message
//! carries a secret's value: secrets are named by reference, and server text is redacted.

use corral_catalog::{LoadCatalogError, RenderSchemaError};

/// Why a server could not be started and initialized.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum StartMcpServerError {
    /// The declaration refers to a secret the host does not have.
    #[error("MCP server {server}: the host has no secret {secret_ref:?}")]
    MissingSecret {
        /// The server.
        server: String,
        /// The secret's name (never its value).
        secret_ref: String,
    },
    /// The process could not be started or the transport set up.
    #[error("MCP server {server}: {message}")]
    Spawn {
        /// The server.
        server: String,
        /// What failed.
        message: String,
    },
    /// The server did not answer `initialize` in time; it was stopped.
    #[error(
        "MCP server {server} did not answer initialize within {timeout_ms} ms{}",
        tail(stderr)
    )]
    InitializeTimeout {
        /// The server.
        server: String,
        /// The timeout.
        timeout_ms: u64,
        /// The last lines of its stderr (redacted), if any.
        stderr: String,
    },
    /// `initialize` failed (the process exited, the endpoint refused, a protocol error).
    #[error("MCP server {server} failed to initialize: {message}{}", tail(stderr))]
    Initialize {
        /// The server.
        server: String,
        /// The SDK's error.
        message: String,
        /// The last lines of its stderr (redacted), if any.
        stderr: String,
    },
    /// The hub was shut down.
    #[error("MCP server {server}: the MCP hub is shut down")]
    Shutdown {
        /// The server.
        server: String,
    },
}

fn tail(stderr: &str) -> String {
    if stderr.is_empty() {
        String::new()
    } else {
        format!("; its stderr ended with:\n{stderr}")
    }
}

/// A problem listing a server's tools. The server's other tools (and other servers) still work:
/// a tool with a problem is left out of the catalog.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum McpListError {
    /// The server could not be started.
    #[error(transparent)]
    Start(#[from] StartMcpServerError),
    /// `tools/list` failed or timed out.
    #[error("MCP server {server}: tools/list failed: {message}")]
    ListTools {
        /// The server.
        server: String,
        /// What failed.
        message: String,
    },
    /// The tool's definition is not a valid capability (an invalid schema, a bad name).
    #[error("MCP server {server}: tool {tool:?} was left out: {source}")]
    InvalidTool {
        /// The server.
        server: String,
        /// The tool's name.
        tool: String,
        /// The catalog's error.
        #[source]
        source: Box<LoadCatalogError>,
    },
    /// The tool's schema cannot be rendered to TypeScript faithfully.
    #[error("MCP server {server}: tool {tool:?} was left out: {source}")]
    UnrenderableTool {
        /// The server.
        server: String,
        /// The tool's name.
        tool: String,
        /// The renderer's error.
        #[source]
        source: Box<RenderSchemaError>,
    },
    /// The server listed two tools with one name; the second was left out.
    #[error("MCP server {server}: tool {tool:?} is listed twice; the second was left out")]
    DuplicateTool {
        /// The server.
        server: String,
        /// The tool's name.
        tool: String,
    },
}

impl McpListError {
    /// The server the problem is about.
    pub fn server(&self) -> &str {
        match self {
            McpListError::Start(
                StartMcpServerError::MissingSecret { server, .. }
                | StartMcpServerError::Spawn { server, .. }
                | StartMcpServerError::InitializeTimeout { server, .. }
                | StartMcpServerError::Initialize { server, .. }
                | StartMcpServerError::Shutdown { server },
            )
            | McpListError::ListTools { server, .. }
            | McpListError::InvalidTool { server, .. }
            | McpListError::UnrenderableTool { server, .. }
            | McpListError::DuplicateTool { server, .. } => server,
        }
    }
}
