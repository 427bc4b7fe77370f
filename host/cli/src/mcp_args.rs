//! `--mcp NAME=COMMAND ARG...` and `--mcp-url NAME=URL`: MCP servers declared on the command
//! line, in the same shape as a manifest's `"mcpServers"` entries.

use std::path::PathBuf;
use std::sync::Arc;

use corral_mcp::{EnvSecretResolver, McpHub, McpHubOptions, McpServerConfig, validate_servers};

/// The MCP servers of a run (boxed: they would make every `corral` subcommand as large).
#[derive(Debug, clap::Args)]
pub struct McpFlags {
    /// An MCP server over stdio, `NAME=COMMAND ARG...` (one argument, split into words like a
    /// shell does); its tools are bound at `tools.NAME.<tool>`. Repeatable.
    #[arg(long, value_name = "NAME=COMMAND ARG...")]
    pub mcp: Vec<String>,
    /// An MCP server over streamable HTTP, `NAME=URL`. Repeatable.
    #[arg(long, value_name = "NAME=URL")]
    pub mcp_url: Vec<String>,
    /// A JSON array of MCP server declarations, as in an agent manifest's "mcpServers"
    /// (env and header values may be {"secretRef": "NAME"}, read from $CORRAL_SECRET_NAME).
    /// Repeatable.
    #[arg(long, value_name = "FILE.json")]
    pub mcp_config: Vec<PathBuf>,
    /// Per-call timeout of MCP tools, in milliseconds (default 60000), unless a declaration
    /// sets its own `callTimeoutMs`.
    #[arg(long)]
    pub mcp_call_timeout_ms: Option<u64>,
}

impl McpFlags {
    /// The declared servers, checked.
    pub fn servers(&self) -> Result<Vec<McpServerConfig>, String> {
        parse_servers(&self.mcp, &self.mcp_url, &self.mcp_config)
    }

    /// The process's hub (secrets from `CORRAL_SECRET_*`), with the flags' call timeout.
    pub fn hub(&self) -> McpHub {
        let mut options = McpHubOptions::default();
        if let Some(ms) = self.mcp_call_timeout_ms {
            options.call_timeout = std::time::Duration::from_millis(ms);
        }
        McpHub::new(Arc::new(EnvSecretResolver::default()), options)
    }

    /// Installs the logs (crate::logging: `CORRAL_LOG`, `CORRAL_LOG_FORMAT`); by default only
    /// MCP servers' warnings (`CORRAL_LOG=corral_mcp=info` shows every stderr line of the
    /// servers). Traces go out when the `OTEL_*` variables say so.
    #[must_use = "dropping it flushes the traces"]
    pub fn init_logging(&self) -> crate::logging::Tracing {
        crate::logging::init("corral_mcp=warn", None, &Default::default())
    }
}

/// The servers named by `--mcp` (one argument each, split into words like a POSIX shell does:
/// quotes and backslashes work, nothing is expanded) and `--mcp-url`, then those of
/// `--mcp-config` files (JSON arrays of `"mcpServers"` entries).
pub fn parse_servers(
    stdio: &[String],
    http: &[String],
    configs: &[PathBuf],
) -> Result<Vec<McpServerConfig>, String> {
    let mut servers = Vec::new();
    for spec in stdio {
        let (name, command) = split_name(spec, "--mcp", "NAME=COMMAND ARG...")?;
        let mut words = shell_words::split(command)
            .map_err(|e| format!("--mcp {spec:?}: cannot split the command into words: {e}"))?
            .into_iter();
        let program = words
            .next()
            .ok_or_else(|| format!("--mcp {spec:?}: the command is empty"))?;
        servers.push(McpServerConfig::stdio(name, program, words.collect()));
    }
    for spec in http {
        let (name, url) = split_name(spec, "--mcp-url", "NAME=URL")?;
        servers.push(McpServerConfig::http(name, url));
    }
    for path in configs {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let listed: Vec<McpServerConfig> = serde_json::from_str(&text).map_err(|e| {
            format!(
                "invalid --mcp-config {} (want a JSON array of \"mcpServers\" entries): {e}",
                path.display()
            )
        })?;
        servers.extend(listed);
    }
    validate_servers(&servers).map_err(|e| e.to_string())?;
    Ok(servers)
}

fn split_name<'a>(spec: &'a str, flag: &str, shape: &str) -> Result<(&'a str, &'a str), String> {
    match spec.split_once('=') {
        Some((name, rest)) if !name.trim().is_empty() && !rest.trim().is_empty() => {
            Ok((name.trim(), rest.trim()))
        }
        _ => Err(format!("{flag} {spec:?}: want {shape}")),
    }
}

#[cfg(test)]
mod tests {
    use corral_mcp::McpTransport;

    use super::*;

    #[test]
    fn commands_are_split_like_a_shell_splits_words() -> Result<(), String> {
        let servers = parse_servers(
            &[r#"fs=npx -y "@scope/server x" 'a b' c\ d"#.to_owned()],
            &["docs=http://127.0.0.1:9/mcp".to_owned()],
            &[],
        )?;
        match &servers[0].transport {
            McpTransport::Stdio { command, args, .. } => {
                assert_eq!(command, "npx");
                assert_eq!(args, &["-y", "@scope/server x", "a b", "c d"]);
            }
            other => return Err(format!("{other:?}")),
        }
        assert_eq!(servers[1].name, "docs");
        for bad in ["fs", "=x", "fs=", "a.b=x", "fs=\"unclosed"] {
            assert!(parse_servers(&[bad.to_owned()], &[], &[]).is_err(), "{bad}");
        }
        assert!(parse_servers(&["a=x".into(), "a=y".into()], &[], &[]).is_err());
        assert!(parse_servers(&[], &["d=ftp://x".into()], &[]).is_err());
        Ok(())
    }
}
