//! MCP servers as corral capabilities: their tools are listed, namespaced, rendered, validated
//! and invoked through the same path as every other capability, over stdio or streamable HTTP,
//! with the official Rust SDK (`rmcp`).
//!
//! ```no_run
//! use std::sync::Arc;
//! use corral_mcp::{EnvSecretResolver, McpBackend, McpHub, McpHubOptions, McpServerConfig};
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let servers: Vec<McpServerConfig> = serde_json::from_str(
//!     r#"[{"name": "fs", "command": "npx",
//!          "args": ["-y", "@modelcontextprotocol/server-filesystem", "/srv/docs"]}]"#,
//! )?;
//! // One hub per process (or per agent): servers start on first use and are reused.
//! let hub = McpHub::new(Arc::new(EnvSecretResolver::default()), McpHubOptions::default());
//! let listed = hub.catalog(&servers).await; // tools/list, every page, at session start
//! for error in &listed.errors {
//!     eprintln!("left out: {error}"); // the other tools still work
//! }
//! let catalog = listed.to_catalog()?; // fs.list_directory, ... at tools.fs.list_directory
//! let backend = McpBackend::new(&listed); // .with_fallback(host_backend) for other capabilities
//! // ... SessionOptions::new(Arc::new(catalog), Arc::new(backend)) ...
//! hub.shutdown().await;
//! # Ok(()) }
//! ```
//!
//! Core concepts:
//! - [`McpServerConfig`]: one `"mcpServers"` entry of a manifest, stdio
//!   (`{"name", "command", "args", "env", "cwd"}`) or streamable HTTP
//!   (`{"name", "url", "headers"}`), with `callTimeoutMs`, `initializeTimeoutMs`,
//!   `allowedTools` and `needsApproval`. Environment and header values may be
//!   `{"secretRef": "NAME"}`, resolved by the host's [`SecretResolver`]
//!   ([`EnvSecretResolver`]: the variable `CORRAL_SECRET_NAME`) and never shown.
//! - [`McpHub`]: the live servers. Stdio servers start lazily, are shared by every session that
//!   declares the same server, are restarted with backoff when they die, have `initialize`
//!   timed out, have their stderr logged (`tracing` target `corral_mcp::stderr`, field
//!   `server`), and are stopped by [`McpHub::shutdown`].
//! - [`McpCatalog`]: what [`McpHub::catalog`] lists: capabilities `NAME.tool`, the problems
//!   ([`McpListError`]: servers that did not start, tools left out), and a fingerprint that
//!   changes with the tool lists.
//! - [`McpBackend`]: the [`corral_sandbox::Backend`] that turns calls into `tools/call` and
//!   results into values (the rule is on [`McpBackend`]), cancels on timeout or drop, and hands
//!   other capabilities to a fallback backend.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod backend;
mod bind;
mod config;
mod error;
mod hub;
mod listing;

pub use backend::{MAX_ERROR_TEXT_CHARS, McpBackend};
pub use bind::{BindMcpError, McpBinding};
pub use config::{
    ConfigValue, EnvSecretResolver, McpConfigError, McpServerConfig, McpTransport, SecretRef,
    SecretResolver, StaticSecrets, validate_servers,
};
pub use error::{McpListError, StartMcpServerError};
pub use hub::{McpHub, McpHubOptions};
pub use listing::McpCatalog;
