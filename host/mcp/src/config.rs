//! How an MCP server is declared: the `"mcpServers"` entries of a manifest, and secrets by
//! reference.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// One MCP server, as a manifest's `"mcpServers"` entry declares it:
///
/// ```json
/// {"name": "fs", "command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "/srv"],
///  "env": {"TOKEN": {"secretRef": "FS_TOKEN"}}, "cwd": "/srv", "callTimeoutMs": 30000}
/// {"name": "docs", "url": "http://127.0.0.1:8080/mcp", "headers": {"Authorization": {"secretRef": "DOCS_AUTH"}},
///  "allowedTools": ["search"], "needsApproval": {"search": false}}
/// ```
///
/// Exactly one of `command` (stdio) and `url` (streamable HTTP) is given. Unknown fields are an
/// error. Its tools become capabilities `NAME.tool`, bound at `tools.NAME.tool`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "RawServerConfig", into = "RawServerConfig")]
pub struct McpServerConfig {
    /// The namespace of the server's tools: one JS identifier-like part (no dots, no
    /// whitespace), unique among the servers of one agent.
    pub name: String,
    /// How to reach the server.
    pub transport: McpTransport,
    /// Per-call timeout; when it passes the request is cancelled (`notifications/cancelled`) and
    /// the call fails. `None` uses [`crate::McpHubOptions::call_timeout`].
    pub call_timeout_ms: Option<u64>,
    /// How long `initialize` may take before the server is reported as not answering. `None`
    /// uses [`crate::McpHubOptions::initialize_timeout`].
    pub initialize_timeout_ms: Option<u64>,
    /// Only these tools become capabilities (and only these are ever called); `None` allows all.
    pub allowed_tools: Option<Vec<String>>,
    /// Per-tool override of whether a call needs the user's approval (the default comes from
    /// the tool's annotations: `destructiveHint` unless `readOnlyHint`).
    pub needs_approval: BTreeMap<String, bool>,
}

/// The two transports of the MCP specification corral speaks.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum McpTransport {
    /// A child process speaking JSON-RPC on its stdin and stdout; its stderr goes to the log.
    Stdio {
        /// The program (looked up on `PATH`).
        command: String,
        /// Its arguments.
        args: Vec<String>,
        /// Environment variables added to the host's (values may be secret references).
        env: BTreeMap<String, ConfigValue>,
        /// Its working directory; the host's when absent.
        cwd: Option<PathBuf>,
    },
    /// A streamable HTTP endpoint (`http://` or `https://` URL of the MCP endpoint).
    StreamableHttp {
        /// The endpoint.
        url: String,
        /// Headers sent with every request (values may be secret references).
        headers: BTreeMap<String, ConfigValue>,
    },
}

/// A configuration value: literal text, or `{"secretRef": "NAME"}`, resolved by the host's
/// [`SecretResolver`] when the server starts and never shown anywhere.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ConfigValue {
    /// Literal text from the manifest (not a secret).
    Literal(String),
    /// A secret the host's configuration holds.
    Secret(SecretRef),
}

// By hand so a literal that happens to be sensitive is not printed either.
impl fmt::Debug for ConfigValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigValue::Literal(_) => f.write_str("Literal(..)"),
            ConfigValue::Secret(reference) => reference.fmt(f),
        }
    }
}

/// `{"secretRef": "NAME"}`: the name of a secret in the host's configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SecretRef {
    /// The secret's name, as the [`SecretResolver`] knows it.
    pub secret_ref: String,
}

/// Where the host keeps the secrets MCP servers are given (environment values, headers).
///
/// Resolved values go to the server's process environment or HTTP headers only; corral adds
/// them to the redaction of every result and log line of that server and never puts them into a
/// catalog, a realm, an event, a log record or an error.
pub trait SecretResolver: Send + Sync + 'static {
    /// The value of the secret `name`, or `None` when the host has no such secret.
    fn resolve(&self, name: &str) -> Option<String>;
}

/// Resolves `{"secretRef": "NAME"}` from the host's environment variable `<prefix>NAME`.
///
/// corral's binaries use the prefix [`EnvSecretResolver::DEFAULT_PREFIX`], so
/// `{"secretRef": "GITHUB_TOKEN"}` reads `CORRAL_SECRET_GITHUB_TOKEN`. A manifest can therefore
/// only reach variables the operator deliberately exported under that prefix.
#[derive(Debug, Clone)]
pub struct EnvSecretResolver {
    prefix: String,
}

impl EnvSecretResolver {
    /// The prefix corral's binaries use.
    pub const DEFAULT_PREFIX: &'static str = "CORRAL_SECRET_";

    /// A resolver reading `<prefix>NAME`.
    pub fn new(prefix: impl Into<String>) -> Self {
        EnvSecretResolver {
            prefix: prefix.into(),
        }
    }
}

impl Default for EnvSecretResolver {
    fn default() -> Self {
        EnvSecretResolver::new(Self::DEFAULT_PREFIX)
    }
}

impl SecretResolver for EnvSecretResolver {
    fn resolve(&self, name: &str) -> Option<String> {
        std::env::var(format!("{}{name}", self.prefix)).ok()
    }
}

/// Secrets given as a fixed map (tests, or hosts with their own secret store loaded at start).
#[derive(Clone, Default)]
pub struct StaticSecrets(pub BTreeMap<String, String>);

impl fmt::Debug for StaticSecrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StaticSecrets")
            .field("names", &self.0.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl SecretResolver for StaticSecrets {
    fn resolve(&self, name: &str) -> Option<String> {
        self.0.get(name).cloned()
    }
}

/// Why an `"mcpServers"` entry was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum McpConfigError {
    /// The name cannot be a namespace.
    #[error("MCP server name {name:?} {reason}")]
    InvalidName {
        /// The name given.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// Both or neither of `command` and `url`.
    #[error(
        "MCP server {name}: give exactly one of \"command\" (stdio) or \"url\" (streamable HTTP)"
    )]
    Transport {
        /// The server.
        name: String,
    },
    /// A field of one transport given with the other.
    #[error("MCP server {name}: \"{field}\" is only for {only_for} servers")]
    MisplacedField {
        /// The server.
        name: String,
        /// The field.
        field: &'static str,
        /// Which transport it belongs to.
        only_for: &'static str,
    },
    /// The URL is not an `http://` or `https://` URL.
    #[error("MCP server {name}: url must start with http:// or https://")]
    InvalidUrl {
        /// The server.
        name: String,
    },
    /// Two servers of one list share a name.
    #[error("MCP server name {name} is used twice")]
    DuplicateName {
        /// The name.
        name: String,
    },
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawServerConfig {
    name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    command: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    args: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    env: Option<BTreeMap<String, ConfigValue>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cwd: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    headers: Option<BTreeMap<String, ConfigValue>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    call_timeout_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    initialize_timeout_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    allowed_tools: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    needs_approval: BTreeMap<String, bool>,
}

impl TryFrom<RawServerConfig> for McpServerConfig {
    type Error = McpConfigError;

    fn try_from(raw: RawServerConfig) -> Result<Self, Self::Error> {
        check_name(&raw.name)?;
        let name = raw.name;
        let misplaced = |field, only_for| McpConfigError::MisplacedField {
            name: name.clone(),
            field,
            only_for,
        };
        let transport = match (raw.command, raw.url) {
            (Some(command), None) => {
                if raw.headers.is_some() {
                    return Err(misplaced("headers", "streamable HTTP (\"url\")"));
                }
                McpTransport::Stdio {
                    command,
                    args: raw.args.unwrap_or_default(),
                    env: raw.env.unwrap_or_default(),
                    cwd: raw.cwd,
                }
            }
            (None, Some(url)) => {
                for (field, given) in [
                    ("args", raw.args.is_some()),
                    ("env", raw.env.is_some()),
                    ("cwd", raw.cwd.is_some()),
                ] {
                    if given {
                        return Err(misplaced(field, "stdio (\"command\")"));
                    }
                }
                if !(url.starts_with("http://") || url.starts_with("https://")) {
                    return Err(McpConfigError::InvalidUrl { name });
                }
                McpTransport::StreamableHttp {
                    url,
                    headers: raw.headers.unwrap_or_default(),
                }
            }
            _ => return Err(McpConfigError::Transport { name }),
        };
        Ok(McpServerConfig {
            name,
            transport,
            call_timeout_ms: raw.call_timeout_ms,
            initialize_timeout_ms: raw.initialize_timeout_ms,
            allowed_tools: raw.allowed_tools,
            needs_approval: raw.needs_approval,
        })
    }
}

impl From<McpServerConfig> for RawServerConfig {
    fn from(config: McpServerConfig) -> Self {
        let mut raw = RawServerConfig {
            name: config.name,
            command: None,
            args: None,
            env: None,
            cwd: None,
            url: None,
            headers: None,
            call_timeout_ms: config.call_timeout_ms,
            initialize_timeout_ms: config.initialize_timeout_ms,
            allowed_tools: config.allowed_tools,
            needs_approval: config.needs_approval,
        };
        match config.transport {
            McpTransport::Stdio {
                command,
                args,
                env,
                cwd,
            } => {
                raw.command = Some(command);
                raw.args = Some(args);
                raw.env = Some(env);
                raw.cwd = cwd;
            }
            McpTransport::StreamableHttp { url, headers } => {
                raw.url = Some(url);
                raw.headers = Some(headers);
            }
        }
        raw
    }
}

impl McpServerConfig {
    /// A stdio server: `command args...` with no extra environment.
    pub fn stdio(name: impl Into<String>, command: impl Into<String>, args: Vec<String>) -> Self {
        McpServerConfig::with_transport(
            name,
            McpTransport::Stdio {
                command: command.into(),
                args,
                env: BTreeMap::new(),
                cwd: None,
            },
        )
    }

    /// A streamable HTTP server at `url` with no extra headers.
    pub fn http(name: impl Into<String>, url: impl Into<String>) -> Self {
        McpServerConfig::with_transport(
            name,
            McpTransport::StreamableHttp {
                url: url.into(),
                headers: BTreeMap::new(),
            },
        )
    }

    fn with_transport(name: impl Into<String>, transport: McpTransport) -> Self {
        McpServerConfig {
            name: name.into(),
            transport,
            call_timeout_ms: None,
            initialize_timeout_ms: None,
            allowed_tools: None,
            needs_approval: BTreeMap::new(),
        }
    }

    /// Checks what deserialization checks, for configs built in code.
    pub fn validate(&self) -> Result<(), McpConfigError> {
        McpServerConfig::try_from(RawServerConfig::from(self.clone())).map(|_| ())
    }

    /// Whether the tool may be listed and called.
    pub fn allows_tool(&self, tool: &str) -> bool {
        self.allowed_tools
            .as_ref()
            .is_none_or(|allowed| allowed.iter().any(|name| name == tool))
    }

    /// A digest of the whole declaration (secret references by name, never their values): two
    /// agents declaring the same server share one process in a [`crate::McpHub`].
    pub fn digest(&self) -> String {
        let text = serde_json::to_string(self).unwrap_or_default();
        hex(&Sha256::digest(text.as_bytes()))
    }

    /// The names of the secrets this server refers to.
    pub fn secret_refs(&self) -> Vec<&str> {
        let values = match &self.transport {
            McpTransport::Stdio { env, .. } => env.values(),
            McpTransport::StreamableHttp { headers, .. } => headers.values(),
        };
        values
            .filter_map(|value| match value {
                ConfigValue::Secret(reference) => Some(reference.secret_ref.as_str()),
                ConfigValue::Literal(_) => None,
            })
            .collect()
    }
}

/// Checks a list of servers (each entry, and that names are unique).
pub fn validate_servers(servers: &[McpServerConfig]) -> Result<(), McpConfigError> {
    let mut seen = std::collections::BTreeSet::new();
    for server in servers {
        server.validate()?;
        if !seen.insert(server.name.as_str()) {
            return Err(McpConfigError::DuplicateName {
                name: server.name.clone(),
            });
        }
    }
    Ok(())
}

fn check_name(name: &str) -> Result<(), McpConfigError> {
    let reason = if name.is_empty() {
        Some("is empty")
    } else if name.contains('.') {
        Some("contains a dot (it is one namespace part: tools.NAME.tool)")
    } else if name.chars().any(|c| c.is_whitespace() || c.is_control()) {
        Some("contains whitespace or control characters")
    } else if name == "__proto__" {
        Some("cannot be bound in JavaScript")
    } else {
        None
    };
    match reason {
        Some(reason) => Err(McpConfigError::InvalidName {
            name: name.to_owned(),
            reason,
        }),
        None => Ok(()),
    }
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifest_entries_parse_and_refuse_unknown_fields() -> Result<(), serde_json::Error> {
        let stdio: McpServerConfig = serde_json::from_str(
            r#"{"name": "fs", "command": "npx", "args": ["-y", "x"], "env": {"A": "1", "T": {"secretRef": "TOK"}}, "cwd": "/tmp", "callTimeoutMs": 5, "needsApproval": {"write": true}}"#,
        )?;
        assert_eq!(stdio.secret_refs(), vec!["TOK"]);
        assert_eq!(stdio.call_timeout_ms, Some(5));
        let http: McpServerConfig = serde_json::from_str(
            r#"{"name": "docs", "url": "http://127.0.0.1:1/mcp", "headers": {"Authorization": {"secretRef": "AUTH"}}, "allowedTools": ["a"]}"#,
        )?;
        assert!(http.allows_tool("a") && !http.allows_tool("b"));
        let round_trip: McpServerConfig = serde_json::from_value(serde_json::to_value(&http)?)?;
        assert_eq!(round_trip, http);
        for bad in [
            r#"{"name": "fs", "command": "x", "bogus": 1}"#,
            r#"{"name": "fs", "command": "x", "url": "http://a"}"#,
            r#"{"name": "fs"}"#,
            r#"{"name": "a.b", "command": "x"}"#,
            r#"{"name": "fs", "url": "http://a", "env": {}}"#,
            r#"{"name": "fs", "command": "x", "env": {"A": {"secretRef": "B", "extra": 1}}}"#,
        ] {
            assert!(
                serde_json::from_str::<McpServerConfig>(bad).is_err(),
                "{bad}"
            );
        }
        Ok(())
    }

    #[test]
    fn the_debug_form_never_shows_values() {
        let value = ConfigValue::Literal("hunter2".into());
        assert!(!format!("{value:?}").contains("hunter2"));
    }
}
