//! Binding MCP tools beside a host's other capabilities: the one path `corral exec`,
//! `corral chat` and `corral serve` take at the start of a session.

use std::sync::Arc;

use corral_catalog::{Catalog, Redactor};
use corral_sandbox::Backend;

use crate::backend::McpBackend;
use crate::config::McpServerConfig;
use crate::error::McpListError;
use crate::hub::McpHub;

/// A session's capabilities with the MCP tools merged in.
#[non_exhaustive]
pub struct McpBinding {
    /// The host's capabilities followed by the MCP tools that could be listed.
    pub catalog: Catalog,
    /// Calls of MCP tools go to their servers, every other call to the host's backend.
    pub backend: Arc<dyn Backend>,
    /// Redacts the values of every secret the servers refer to.
    pub redactor: Redactor,
    /// Changes whenever a server's tool list changes (see [`crate::McpCatalog::fingerprint`]);
    /// part of a checkpoint's fingerprint, so a checkpoint taken before is refused.
    pub fingerprint: String,
    /// Servers and tools that were left out (the rest work).
    pub errors: Vec<McpListError>,
}

impl std::fmt::Debug for McpBinding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ids: Vec<&str> = self
            .catalog
            .capabilities()
            .iter()
            .map(|c| c.id.as_str())
            .collect();
        f.debug_struct("McpBinding")
            .field("capabilities", &ids)
            .field("fingerprint", &self.fingerprint)
            .field("errors", &self.errors)
            .finish_non_exhaustive()
    }
}

/// Why MCP tools could not be bound at all.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BindMcpError {
    /// A server refers to a secret the host does not have.
    #[error(transparent)]
    Secret(#[from] crate::error::StartMcpServerError),
    /// The secrets cannot be turned into a redactor.
    #[error("MCP secrets: {0}")]
    Redactor(String),
    /// An MCP tool's id collides with another capability.
    #[error("the MCP tools do not fit the catalog: {0}")]
    Catalog(#[from] corral_catalog::LoadCatalogError),
}

impl McpHub {
    /// Lists the tools of `servers` (starting those not running) and binds them after the
    /// capabilities of `catalog`, whose calls keep going to `backend` (with no backend, only MCP
    /// tools can be called). Without servers, that is the catalog (as it is, not checked again)
    /// and backend unchanged, an empty redactor and an empty fingerprint.
    pub async fn bind(
        &self,
        servers: &[McpServerConfig],
        catalog: Option<Catalog>,
        backend: Option<Arc<dyn Backend>>,
    ) -> Result<McpBinding, BindMcpError> {
        if servers.is_empty()
            && let Some(backend) = backend
        {
            return Ok(McpBinding {
                catalog: match catalog {
                    Some(catalog) => catalog,
                    None => Catalog::new(Vec::new())?,
                },
                backend,
                redactor: Redactor::default(),
                fingerprint: String::new(),
                errors: Vec::new(),
            });
        }
        let secrets = self.secret_values(servers)?;
        let redactor = Redactor::new(secrets, Vec::new())
            .map_err(|e| BindMcpError::Redactor(e.to_string()))?;
        let listed = self.catalog(servers).await;
        let mut all = catalog
            .map(|catalog| catalog.capabilities().to_vec())
            .unwrap_or_default();
        all.extend(listed.capabilities.iter().cloned());
        let catalog = Catalog::new(all)?;
        let mut mcp = McpBackend::new(&listed);
        if let Some(backend) = backend {
            mcp = mcp.with_fallback(backend);
        }
        Ok(McpBinding {
            catalog,
            backend: Arc::new(mcp),
            redactor,
            fingerprint: listed.fingerprint,
            errors: listed.errors,
        })
    }
}
