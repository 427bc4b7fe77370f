//! `corral serve --config FILE`: the server's TOML configuration, validated before start.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use corral_store::ExecutorScope;
use serde::Deserialize;
use subtle::ConstantTimeEq;

use crate::tenancy::tenant_problem;

/// The shortest token accepted.
pub const MIN_TOKEN_CHARS: usize = 16;

/// The server's configuration.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Config {
    /// Where to listen.
    pub listen: SocketAddr,
    /// The store.
    pub store: StoreLocation,
    /// Lease of session ownership and of executor claims.
    pub lease: Duration,
    /// Credentials.
    pub tokens: Vec<TokenConfig>,
    /// Settings for model providers, passed to the turn engine as they are.
    pub models: toml::Table,
    /// How often an idle SSE stream gets a keep-alive comment (`sseKeepAliveMs`, 15 s).
    pub sse_keep_alive: Duration,
    /// How long an SSE client may leave its buffer full before it is dropped
    /// (`sseSendTimeoutMs`, 5 s).
    pub sse_send_timeout: Duration,
    /// What the background retention pass removes (`[retention]`).
    pub retention: Retention,
    /// The secret webhook calls are signed with (`webhookSecret`, at least 16 characters;
    /// `None`: unsigned unless a capability names its own `webhookSecretRef`).
    pub webhook_secret: Option<String>,
    /// How long a SIGTERM lets running turn segments finish before aborting them
    /// (`shutdownGraceMs`, 10 s; 0 aborts at once).
    pub shutdown_grace: Duration,
    /// This replica's stable name (`replicaName`): a restarted replica takes over the leases
    /// its previous incarnation held at once. Unique per replica; `None`: a new id per start.
    pub replica_name: Option<String>,
    /// What one client may hold of the server (`[limits]`, see [`crate::limits`]).
    pub limits: crate::limits::Limits,
    /// The log format (`logFormat`, `text` by default; `CORRAL_LOG_FORMAT` overrides it).
    pub log_format: Option<crate::logging::LogFormat>,
    /// OpenTelemetry tracing (`[tracing]`: `endpoint`, `serviceName`, `captureContent`; the
    /// `OTEL_*` variables win). Off by default; see docs/tracing.md.
    pub tracing: corral_telemetry::TracingConfig,
}

/// The `[retention]` table: when sessions close and expire, what history and records are
/// pruned, and how often the background pass runs. Paused, waiting, running and uncertain
/// sessions are never touched.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Retention {
    /// How often the pass runs (`intervalMs`, 60 s); each pass handles bounded batches.
    pub interval: Duration,
    /// The store's policy built from the table.
    pub policy: corral_store::RetentionPolicy,
}

impl Default for Retention {
    /// Sessions are kept forever, superseded checkpoints for an hour, idempotency records for
    /// a day; a pass every minute.
    fn default() -> Self {
        let mut policy = corral_store::RetentionPolicy::default();
        policy.superseded_checkpoint_ttl = Retention::DEFAULT_CHECKPOINT_TTL;
        Retention {
            interval: Retention::DEFAULT_INTERVAL,
            policy,
        }
    }
}

impl Retention {
    /// The default pass interval (60 s).
    pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(60);
    /// How long a superseded checkpoint is kept by default (1 h).
    pub const DEFAULT_CHECKPOINT_TTL: Duration = Duration::from_secs(3600);
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawRetention {
    interval_ms: Option<u64>,
    settled_session_ttl_ms: Option<u64>,
    closed_session_ttl_ms: Option<u64>,
    closed_history_ttl_ms: Option<u64>,
    superseded_checkpoint_ttl_ms: Option<u64>,
    idempotency_window_ms: Option<u64>,
    #[serde(default)]
    tenants: std::collections::BTreeMap<String, RawTenantRetention>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawTenantRetention {
    settled_session_ttl_ms: Option<u64>,
    closed_session_ttl_ms: Option<u64>,
    closed_history_ttl_ms: Option<u64>,
}

impl RawRetention {
    fn validate(self) -> Result<Retention, ConfigError> {
        let ms = Duration::from_millis;
        let mut retention = Retention::default();
        if let Some(interval) = self.interval_ms {
            if interval == 0 {
                return Err(field("retention.intervalMs", "must be positive"));
            }
            retention.interval = ms(interval);
        }
        let policy = &mut retention.policy;
        policy.settled_session_ttl = self.settled_session_ttl_ms.map(ms);
        policy.closed_session_ttl = self.closed_session_ttl_ms.map(ms);
        policy.closed_history_ttl = self.closed_history_ttl_ms.map(ms);
        if let Some(ttl) = self.superseded_checkpoint_ttl_ms {
            policy.superseded_checkpoint_ttl = ms(ttl);
        }
        if let Some(window) = self.idempotency_window_ms {
            policy.idempotency_window = ms(window);
        }
        for (tenant, overrides) in self.tenants {
            if let Some(problem) = crate::tenancy::tenant_problem(&tenant) {
                return Err(field(format!("retention.tenants.{tenant}"), problem));
            }
            if let Some(ttl) = overrides.settled_session_ttl_ms {
                policy
                    .tenant_settled_session_ttl
                    .insert(tenant.clone(), ms(ttl));
            }
            if let Some(ttl) = overrides.closed_session_ttl_ms {
                policy
                    .tenant_closed_session_ttl
                    .insert(tenant.clone(), ms(ttl));
            }
            if let Some(ttl) = overrides.closed_history_ttl_ms {
                policy.tenant_closed_history_ttl.insert(tenant, ms(ttl));
            }
        }
        Ok(retention)
    }
}

/// Where the store lives.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreLocation {
    /// `sqlite:PATH`: the embedded store.
    Sqlite(PathBuf),
    /// A `postgres://` URL.
    Postgres(String),
}

/// One credential.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct TokenConfig {
    /// The secret.
    pub token: String,
    /// What it may do.
    pub role: Role,
    /// The name recorded as `decidedBy` when it decides (approve, respond, cancel, resolve);
    /// never the secret. Defaults to `operator`, `tenant:NAME` or `executor:AGENT`.
    pub name: String,
    /// What a tenant token may do beyond its tenant's sessions (operators may do everything).
    pub grants: Grants,
}

/// Operator acts a tenant token may be granted (`canRegisterAgents`, `canResolve`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Grants {
    /// Register and replace agents owned by its tenant.
    pub register_agents: bool,
    /// Settle its sessions' `uncertain` effects (`resolve`).
    pub resolve: bool,
}

impl Grants {
    /// Every act (what an operator token has).
    pub const ALL: Grants = Grants {
        register_agents: true,
        resolve: true,
    };
}

/// What a token may do.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Role {
    /// An application token; with a tenant it sees only that tenant's sessions, without one it
    /// is an operator token.
    Application {
        /// The tenant, if scoped.
        tenant: Option<String>,
    },
    /// An executor token, scoped to one agent definition.
    Executor(ExecutorScope),
}

/// A configuration that cannot be used, naming the field.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The TOML is malformed or has unknown or mistyped fields.
    #[error("invalid configuration: {0}")]
    Parse(String),
    /// A field has a value the server refuses.
    #[error("invalid configuration: `{field}` {problem}")]
    Field {
        /// The field, such as `tokens[1].token`.
        field: String,
        /// What is wrong with it.
        problem: String,
    },
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawConfig {
    listen: Option<String>,
    store: Option<String>,
    lease_ms: Option<u64>,
    #[serde(default)]
    tokens: Vec<RawToken>,
    #[serde(default)]
    models: toml::Table,
    sse_keep_alive_ms: Option<u64>,
    sse_send_timeout_ms: Option<u64>,
    #[serde(default)]
    retention: RawRetention,
    webhook_secret: Option<String>,
    shutdown_grace_ms: Option<u64>,
    replica_name: Option<String>,
    #[serde(default)]
    limits: crate::limits::RawLimits,
    log_format: Option<String>,
    #[serde(default)]
    tracing: corral_telemetry::TracingConfig,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawToken {
    token: String,
    role: String,
    name: Option<String>,
    #[serde(default)]
    can_register_agents: bool,
    #[serde(default)]
    can_resolve: bool,
    tenant: Option<String>,
    agent: Option<String>,
    manifest_hash: Option<String>,
    implementation_version: Option<String>,
}

fn field(field: impl Into<String>, problem: impl Into<String>) -> ConfigError {
    ConfigError::Field {
        field: field.into(),
        problem: problem.into(),
    }
}

impl Config {
    /// The default lease (30 s).
    pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
    /// The default SSE keep-alive period (15 s).
    pub const DEFAULT_KEEP_ALIVE: Duration = Duration::from_secs(15);
    /// The default shutdown grace period (10 s).
    pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
    /// The default SSE send timeout (5 s).
    pub const DEFAULT_SEND_TIMEOUT: Duration = Duration::from_secs(5);

    /// Reads and validates a TOML file.
    pub fn from_file(path: impl Into<PathBuf>) -> Result<Config, ConfigError> {
        let path = path.into();
        let text = std::fs::read_to_string(&path).map_err(|source| ConfigError::Read {
            path: path.clone(),
            source,
        })?;
        Config::from_toml(&text)
    }

    /// Parses and validates TOML text.
    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        let raw: RawConfig =
            toml::from_str(text).map_err(|error| ConfigError::Parse(error.to_string()))?;
        let listen = raw
            .listen
            .as_deref()
            .unwrap_or("127.0.0.1:8787")
            .parse::<SocketAddr>()
            .map_err(|error| field("listen", format!("is not an address (host:port): {error}")))?;
        let store = match raw.store.as_deref() {
            None => {
                return Err(field(
                    "store",
                    "is required (sqlite:PATH or postgres://...)",
                ));
            }
            Some(text) => StoreLocation::parse(text)?,
        };
        let lease = match raw.lease_ms {
            None => Config::DEFAULT_LEASE,
            Some(0) => return Err(field("leaseMs", "must be positive")),
            Some(ms) => Duration::from_millis(ms),
        };
        let mut tokens = Vec::with_capacity(raw.tokens.len());
        for (index, token) in raw.tokens.into_iter().enumerate() {
            tokens.push(token.validate(index)?);
        }
        let positive = |name: &str, value: Option<u64>, default: Duration| match value {
            None => Ok(default),
            Some(0) => Err(field(name, "must be positive")),
            Some(ms) => Ok(Duration::from_millis(ms)),
        };
        let config = Config {
            listen,
            store,
            lease,
            tokens,
            models: raw.models,
            sse_keep_alive: positive(
                "sseKeepAliveMs",
                raw.sse_keep_alive_ms,
                Config::DEFAULT_KEEP_ALIVE,
            )?,
            sse_send_timeout: positive(
                "sseSendTimeoutMs",
                raw.sse_send_timeout_ms,
                Config::DEFAULT_SEND_TIMEOUT,
            )?,
            retention: raw.retention.validate()?,
            replica_name: match raw.replica_name {
                Some(name) if crate::tenancy::tenant_problem(&name).is_some() => {
                    return Err(field(
                        "replicaName",
                        "must be 1 to 100 ASCII letters, digits, '-', '_' or '.'",
                    ));
                }
                name => name,
            },
            shutdown_grace: raw
                .shutdown_grace_ms
                .map_or(Config::DEFAULT_SHUTDOWN_GRACE, Duration::from_millis),
            webhook_secret: match raw.webhook_secret {
                Some(secret) if secret.chars().count() < MIN_TOKEN_CHARS => {
                    return Err(field(
                        "webhookSecret",
                        format!("must be at least {MIN_TOKEN_CHARS} characters"),
                    ));
                }
                secret => secret,
            },
            limits: raw.limits.validate()?,
            log_format: match raw.log_format.as_deref() {
                None => None,
                Some(text) => Some(
                    crate::logging::LogFormat::parse(text)
                        .map_err(|problem| field("logFormat", problem))?,
                ),
            },
            tracing: match raw.tracing {
                corral_telemetry::TracingConfig {
                    endpoint: Some(endpoint),
                    ..
                } if !endpoint.starts_with("http://") => {
                    return Err(field(
                        "tracing.endpoint",
                        "must be an http:// URL (OTLP over HTTP; TLS is left to a local collector)",
                    ));
                }
                tracing => tracing,
            },
        };
        config.validate()?;
        Ok(config)
    }

    /// A configuration built in code (tests, `--demo`), validated like a file.
    pub fn new(
        listen: SocketAddr,
        store: StoreLocation,
        lease: Duration,
        tokens: Vec<TokenConfig>,
    ) -> Result<Config, ConfigError> {
        let config = Config {
            listen,
            store,
            lease,
            tokens,
            models: toml::Table::new(),
            sse_keep_alive: Config::DEFAULT_KEEP_ALIVE,
            sse_send_timeout: Config::DEFAULT_SEND_TIMEOUT,
            retention: Retention::default(),
            webhook_secret: None,
            shutdown_grace: Config::DEFAULT_SHUTDOWN_GRACE,
            replica_name: None,
            limits: crate::limits::Limits::default(),
            log_format: None,
            tracing: corral_telemetry::TracingConfig::default(),
        };
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if self.lease.is_zero() {
            return Err(field("leaseMs", "must be positive"));
        }
        if self.tokens.is_empty() {
            return Err(field("tokens", "must list at least one token"));
        }
        let mut seen = HashSet::new();
        for (index, token) in self.tokens.iter().enumerate() {
            if token.token.chars().count() < MIN_TOKEN_CHARS {
                return Err(field(
                    format!("tokens[{index}].token"),
                    format!("must be at least {MIN_TOKEN_CHARS} characters"),
                ));
            }
            if !seen.insert(token.token.as_str()) {
                return Err(field(
                    format!("tokens[{index}].token"),
                    "repeats another token; every token must be unique",
                ));
            }
            if let Some(problem) = name_problem(&token.name) {
                return Err(field(format!("tokens[{index}].name"), problem));
            }
        }
        Ok(())
    }

    /// The token `presented` is, comparing it with every token in constant time.
    pub fn authenticate(&self, presented: &str) -> Option<&TokenConfig> {
        let mut found = None;
        for token in &self.tokens {
            if bool::from(token.token.as_bytes().ct_eq(presented.as_bytes())) {
                found = Some(token);
            }
        }
        found
    }
}

impl StoreLocation {
    /// Parses `sqlite:PATH` or a `postgres://` / `postgresql://` URL.
    pub fn parse(text: &str) -> Result<StoreLocation, ConfigError> {
        if let Some(path) = text.strip_prefix("sqlite:") {
            if path.is_empty() {
                return Err(field("store", "sqlite: needs a file path"));
            }
            Ok(StoreLocation::Sqlite(PathBuf::from(path)))
        } else if text.starts_with("postgres://") || text.starts_with("postgresql://") {
            Ok(StoreLocation::Postgres(text.to_owned()))
        } else {
            Err(field("store", "must be sqlite:PATH or a postgres:// URL"))
        }
    }
}

/// Why `name` cannot name a token: 1 to 100 printable characters.
fn name_problem(name: &str) -> Option<&'static str> {
    if name.trim().is_empty() || name.chars().count() > 100 {
        return Some("must have 1 to 100 characters, not all blank");
    }
    if name.chars().any(char::is_control) {
        return Some("must not contain control characters");
    }
    None
}

impl TokenConfig {
    /// An application token (operator token when `tenant` is `None`), named after its role.
    pub fn application(token: impl Into<String>, tenant: Option<String>) -> Self {
        let role = Role::Application { tenant };
        TokenConfig {
            token: token.into(),
            name: role.default_name(),
            role,
            grants: Grants::default(),
        }
    }

    /// An executor token scoped to one agent definition (and, if the scope names one, to one
    /// tenant's sessions), named after its agent.
    pub fn executor(token: impl Into<String>, scope: ExecutorScope) -> Self {
        let role = Role::Executor(scope);
        TokenConfig {
            token: token.into(),
            name: role.default_name(),
            role,
            grants: Grants::default(),
        }
    }

    /// The same token under another name.
    pub fn named(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// The same token with `grants` (meaningful for tenant tokens).
    pub fn granted(mut self, grants: Grants) -> Self {
        self.grants = grants;
        self
    }
}

impl Role {
    /// `operator`, `tenant:NAME` or `executor:AGENT`.
    fn default_name(&self) -> String {
        match self {
            Role::Application { tenant: None } => "operator".to_owned(),
            Role::Application {
                tenant: Some(tenant),
            } => format!("tenant:{tenant}"),
            Role::Executor(scope) => format!("executor:{}", scope.agent_id),
        }
    }
}

impl RawToken {
    fn validate(self, index: usize) -> Result<TokenConfig, ConfigError> {
        let name = |key: &str| format!("tokens[{index}].{key}");
        let non_empty = |key: &str, value: Option<String>| match value {
            Some(value) if !value.trim().is_empty() => Ok(value),
            Some(_) => Err(field(name(key), "must not be empty")),
            None => Err(field(name(key), "is required for an executor token")),
        };
        let role = match self.role.as_str() {
            "application" => {
                for (key, value) in [
                    ("agent", &self.agent),
                    ("manifestHash", &self.manifest_hash),
                    ("implementationVersion", &self.implementation_version),
                ] {
                    if value.is_some() {
                        return Err(field(name(key), "is only for executor tokens"));
                    }
                }
                if let Some(problem) = self.tenant.as_deref().and_then(tenant_problem) {
                    return Err(field(name("tenant"), problem));
                }
                if self.tenant.is_none() {
                    for (key, granted) in [
                        ("canRegisterAgents", self.can_register_agents),
                        ("canResolve", self.can_resolve),
                    ] {
                        if granted {
                            return Err(field(
                                name(key),
                                "is only for tenant tokens (an operator token may do everything)",
                            ));
                        }
                    }
                }
                Role::Application {
                    tenant: self.tenant,
                }
            }
            "executor" => {
                if let Some(problem) = self.tenant.as_deref().and_then(tenant_problem) {
                    return Err(field(name("tenant"), problem));
                }
                for (key, granted) in [
                    ("canRegisterAgents", self.can_register_agents),
                    ("canResolve", self.can_resolve),
                ] {
                    if granted {
                        return Err(field(name(key), "is only for tenant application tokens"));
                    }
                }
                Role::Executor(
                    ExecutorScope::new(
                        non_empty("agent", self.agent)?,
                        non_empty("manifestHash", self.manifest_hash)?,
                        non_empty("implementationVersion", self.implementation_version)?,
                    )
                    .for_tenant(self.tenant),
                )
            }
            other => {
                return Err(field(
                    name("role"),
                    format!("must be application or executor, not {other:?}"),
                ));
            }
        };
        Ok(TokenConfig {
            token: self.token,
            name: self.name.unwrap_or_else(|| role.default_name()),
            role,
            grants: Grants {
                register_agents: self.can_register_agents,
                resolve: self.can_resolve,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
listen = "127.0.0.1:0"
store = "sqlite:/tmp/x.db"
leaseMs = 1000
[[tokens]]
token = "application-token-0001"
role = "application"
[[tokens]]
token = "executor-token-000001"
role = "executor"
agent = "helper"
manifestHash = "sha256:00"
implementationVersion = "1"
"#;

    #[test]
    fn a_good_file_parses() {
        let config = Config::from_toml(GOOD).expect("valid");
        assert_eq!(config.lease, Duration::from_millis(1000));
        assert_eq!(config.tokens.len(), 2);
        assert!(config.authenticate("application-token-0001").is_some());
        assert!(config.authenticate("application-token-0002").is_none());
        assert!(config.authenticate("").is_none());
    }

    fn error_of(text: &str) -> String {
        Config::from_toml(text)
            .expect_err("must be refused")
            .to_string()
    }

    #[test]
    fn every_refusal_names_its_field() {
        assert!(
            error_of(&GOOD.replace("application-token-0001", "short")).contains("tokens[0].token")
        );
        assert!(
            error_of(&GOOD.replace("executor-token-000001", "application-token-0001"))
                .contains("tokens[1].token")
        );
        assert!(
            error_of(&GOOD.replace("role = \"application\"", "role = \"admin\""))
                .contains("tokens[0].role")
        );
        assert!(error_of(&GOOD.replace("agent = \"helper\"\n", "")).contains("tokens[1].agent"));
        assert!(error_of(&GOOD.replace("leaseMs = 1000", "leaseMs = 0")).contains("leaseMs"));
        assert!(error_of(&GOOD.replace("sqlite:/tmp/x.db", "mysql://x")).contains("store"));
        assert!(error_of(&GOOD.replace("127.0.0.1:0", "nowhere")).contains("listen"));
        assert!(error_of(&format!("{GOOD}\nbogus = 1\n")).contains("bogus"));
        assert!(error_of("store = \"sqlite:x\"").contains("tokens"));
        for tenant in ["", "acme/eu", "ac me"] {
            let scoped = GOOD.replace(
                "role = \"application\"",
                &format!("role = \"application\"\ntenant = \"{tenant}\""),
            );
            assert!(error_of(&scoped).contains("tokens[0].tenant"), "{tenant:?}");
        }
        let scoped = GOOD.replace(
            "role = \"application\"",
            "role = \"application\"\ntenant = \"acme-eu.1\"",
        );
        assert!(Config::from_toml(&scoped).is_ok());
    }

    #[test]
    fn tracing_is_off_unless_configured() {
        let config = Config::from_toml(GOOD).expect("valid");
        assert_eq!(config.tracing, corral_telemetry::TracingConfig::default());
        let traced = format!(
            "{GOOD}[tracing]\nendpoint = \"http://127.0.0.1:4318\"\nserviceName = \"edge\"\ncaptureContent = true\n"
        );
        let config = Config::from_toml(&traced).expect("valid");
        assert_eq!(
            config.tracing.endpoint.as_deref(),
            Some("http://127.0.0.1:4318")
        );
        assert_eq!(config.tracing.service_name.as_deref(), Some("edge"));
        assert!(config.tracing.capture_content);
        assert!(error_of(&traced.replace("http://127", "grpc://127")).contains("tracing.endpoint"));
        assert!(error_of(&format!("{GOOD}[tracing]\nsampling = 1\n")).contains("sampling"));
    }
}
