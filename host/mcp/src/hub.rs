//! The MCP hub: one live connection per declared server, started lazily, shared by every session
//! that declares the same server, restarted with backoff when it dies, stopped at shutdown.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use corral_catalog::Redactor;
use rmcp::service::{NotificationContext, Peer, RoleClient, RunningService, ServiceExt as _};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{ClientHandler, service::MaybeSendFuture};
use tokio::io::AsyncBufReadExt as _;

use crate::config::{ConfigValue, McpServerConfig, McpTransport, SecretResolver};
use crate::error::StartMcpServerError;

/// Stderr lines kept per server, for error messages about a failed start.
const STDERR_TAIL_LINES: usize = 20;
/// Longest stderr line logged; the rest is cut.
const MAX_STDERR_LINE_CHARS: usize = 2000;

/// Settings of an [`McpHub`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct McpHubOptions {
    /// How long a server may take to answer `initialize` (default 10 s); a server's
    /// `initializeTimeoutMs` overrides it.
    pub initialize_timeout: Duration,
    /// Default per-call timeout (default 60 s); a server's `callTimeoutMs` overrides it.
    pub call_timeout: Duration,
    /// How long listing all pages of `tools/list` may take (default 30 s).
    pub list_timeout: Duration,
    /// The longest wait before restarting a server that keeps dying (default 30 s). The first
    /// restart after a healthy period is immediate, then 200 ms, 400 ms, ... up to this.
    pub max_restart_backoff: Duration,
    /// How long [`McpHub::shutdown`] waits for each server to exit before killing it
    /// (default 5 s).
    pub shutdown_timeout: Duration,
    /// Host environment variables whose names start with one of these are not passed on to
    /// stdio servers (default: [`crate::EnvSecretResolver::DEFAULT_PREFIX`]), so a server only
    /// gets the secrets its declaration names.
    pub withheld_env_prefixes: Vec<String>,
}

impl Default for McpHubOptions {
    fn default() -> Self {
        McpHubOptions {
            initialize_timeout: Duration::from_secs(10),
            call_timeout: Duration::from_secs(60),
            list_timeout: Duration::from_secs(30),
            max_restart_backoff: Duration::from_secs(30),
            shutdown_timeout: Duration::from_secs(5),
            withheld_env_prefixes: vec![crate::EnvSecretResolver::DEFAULT_PREFIX.to_owned()],
        }
    }
}

/// Live MCP servers for one process (or one agent): cheap to clone, shared by sessions.
///
/// Servers are keyed by their whole declaration ([`McpServerConfig::digest`]), so sessions of
/// agents declaring the same server reuse one process, and a changed declaration starts a new
/// one. Nothing starts until a catalog is listed or a call is made.
#[derive(Clone)]
pub struct McpHub {
    pub(crate) inner: Arc<HubInner>,
}

impl std::fmt::Debug for McpHub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let servers = self.inner.servers.lock().map(|s| s.len()).unwrap_or(0);
        f.debug_struct("McpHub")
            .field("servers", &servers)
            .field("options", &self.inner.options)
            .finish_non_exhaustive()
    }
}

pub(crate) struct HubInner {
    pub(crate) options: McpHubOptions,
    secrets: Arc<dyn SecretResolver>,
    servers: Mutex<HashMap<String, Arc<ServerSlot>>>,
    /// Bumped on every `notifications/tools/list_changed` of any server.
    generation: Arc<AtomicU64>,
    closed: AtomicBool,
}

impl McpHub {
    /// A hub resolving secret references through `secrets`.
    pub fn new(secrets: Arc<dyn SecretResolver>, options: McpHubOptions) -> McpHub {
        McpHub {
            inner: Arc::new(HubInner {
                options,
                secrets,
                servers: Mutex::new(HashMap::new()),
                generation: Arc::new(AtomicU64::new(0)),
                closed: AtomicBool::new(false),
            }),
        }
    }

    /// The hub's settings.
    pub fn options(&self) -> &McpHubOptions {
        &self.inner.options
    }

    /// A counter bumped whenever any server sends `notifications/tools/list_changed`: a host
    /// that caches an [`crate::McpCatalog`] lists again when it moved.
    pub fn generation(&self) -> u64 {
        self.inner.generation.load(Ordering::SeqCst)
    }

    /// A redactor for every secret the given servers refer to (resolved now), to add to a
    /// session's redaction. [`crate::McpBackend`] redacts its own results and errors with it
    /// already; this is for the host's other outputs.
    pub fn secret_values(
        &self,
        servers: &[McpServerConfig],
    ) -> Result<Vec<String>, StartMcpServerError> {
        let mut values = Vec::new();
        for server in servers {
            for name in server.secret_refs() {
                let value = self.inner.secrets.resolve(name).ok_or_else(|| {
                    StartMcpServerError::MissingSecret {
                        server: server.name.clone(),
                        secret_ref: name.to_owned(),
                    }
                })?;
                if !value.is_empty() {
                    values.push(value);
                }
            }
        }
        Ok(values)
    }

    /// Stops every server: closes its stdin (stdio) or session, waits up to
    /// [`McpHubOptions::shutdown_timeout`], then terminates it. Later calls fail.
    pub async fn shutdown(&self) {
        self.inner.closed.store(true, Ordering::SeqCst);
        let slots: Vec<Arc<ServerSlot>> = match self.inner.servers.lock() {
            Ok(mut servers) => servers.drain().map(|(_, slot)| slot).collect(),
            Err(_) => Vec::new(),
        };
        let timeout = self.inner.options.shutdown_timeout;
        futures::future::join_all(slots.iter().map(|slot| slot.stop(timeout))).await;
    }

    /// The slot of this server, created (not started) on first use.
    pub(crate) fn slot(&self, config: &McpServerConfig) -> Arc<ServerSlot> {
        let digest = config.digest();
        let mut servers = match self.inner.servers.lock() {
            Ok(servers) => servers,
            Err(poisoned) => poisoned.into_inner(),
        };
        Arc::clone(servers.entry(digest).or_insert_with(|| {
            Arc::new(ServerSlot {
                config: config.clone(),
                state: tokio::sync::Mutex::new(SlotState::default()),
                list_changes: Arc::new(AtomicU64::new(0)),
                hub_generation: Arc::clone(&self.inner.generation),
                redactor: RwLock::new(Arc::new(Redactor::default())),
                stderr_tail: Arc::new(Mutex::new(VecDeque::new())),
                last_tools: Mutex::new(None),
                secrets: Arc::clone(&self.inner.secrets),
                options: self.inner.options.clone(),
            })
        }))
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.inner.closed.load(Ordering::SeqCst)
    }
}

/// One declared server and its connection, if it is up.
pub(crate) struct ServerSlot {
    pub(crate) config: McpServerConfig,
    state: tokio::sync::Mutex<SlotState>,
    /// `notifications/tools/list_changed` received from this server (across restarts).
    pub(crate) list_changes: Arc<AtomicU64>,
    hub_generation: Arc<AtomicU64>,
    /// Redacts the secrets this server was given, from its results, errors and stderr.
    redactor: RwLock<Arc<Redactor>>,
    stderr_tail: Arc<Mutex<VecDeque<String>>>,
    /// The tools of the last `tools/list` that succeeded: a server that is down keeps its
    /// names, so a script's call fails with the server's error instead of finding nothing.
    last_tools: Mutex<Option<Vec<serde_json::Value>>>,
    secrets: Arc<dyn SecretResolver>,
    options: McpHubOptions,
}

#[derive(Default)]
struct SlotState {
    connection: Option<Arc<Connection>>,
    /// Deaths and failed starts since the server was last healthy.
    failures: u32,
    last_failure: Option<Instant>,
}

/// A running, initialized MCP client session with one server.
pub(crate) struct Connection {
    pub(crate) peer: Peer<RoleClient>,
    service: tokio::sync::Mutex<Option<RunningService<RoleClient, Notifications>>>,
    dead: AtomicBool,
}

impl Connection {
    pub(crate) fn is_dead(&self) -> bool {
        self.dead.load(Ordering::SeqCst) || self.peer.is_transport_closed()
    }
}

impl ServerSlot {
    pub(crate) fn name(&self) -> &str {
        &self.config.name
    }

    pub(crate) fn redactor(&self) -> Arc<Redactor> {
        match self.redactor.read() {
            Ok(redactor) => Arc::clone(&redactor),
            Err(poisoned) => Arc::clone(&poisoned.into_inner()),
        }
    }

    pub(crate) fn call_timeout(&self) -> Duration {
        self.config
            .call_timeout_ms
            .map(Duration::from_millis)
            .unwrap_or(self.options.call_timeout)
    }

    fn initialize_timeout(&self) -> Duration {
        self.config
            .initialize_timeout_ms
            .map(Duration::from_millis)
            .unwrap_or(self.options.initialize_timeout)
    }

    /// The live connection, starting (or restarting, after the backoff) the server if needed.
    pub(crate) async fn connection(&self) -> Result<Arc<Connection>, StartMcpServerError> {
        let mut state = self.state.lock().await;
        if let Some(connection) = &state.connection {
            if !connection.is_dead() {
                return Ok(Arc::clone(connection));
            }
            tracing::warn!(server = %self.name(), "MCP server connection lost; restarting it");
            state.connection = None;
            state.failures += 1;
            state.last_failure = Some(Instant::now());
        }
        if state.failures > 1
            && let Some(last) = state.last_failure
        {
            let backoff = Duration::from_millis(200)
                .saturating_mul(1 << (state.failures - 2).min(16))
                .min(self.options.max_restart_backoff);
            let ready_at = last + backoff;
            tokio::time::sleep_until(ready_at.into()).await;
        }
        match self.start().await {
            Ok(connection) => {
                let connection = Arc::new(connection);
                state.connection = Some(Arc::clone(&connection));
                Ok(connection)
            }
            Err(error) => {
                state.failures += 1;
                state.last_failure = Some(Instant::now());
                Err(error)
            }
        }
    }

    /// The server answered a request: the next death restarts it at once.
    pub(crate) async fn mark_healthy(&self) {
        self.state.lock().await.failures = 0;
    }

    /// The connection broke during a request: the next call restarts the server.
    pub(crate) async fn connection_lost(&self, connection: &Arc<Connection>) {
        connection.dead.store(true, Ordering::SeqCst);
        let mut state = self.state.lock().await;
        if state
            .connection
            .as_ref()
            .is_some_and(|current| Arc::ptr_eq(current, connection))
        {
            state.connection = None;
            state.failures += 1;
            state.last_failure = Some(Instant::now());
        }
        drop(state);
        // Dropping the service ends its task and the child (if still alive) in the background.
        drop(connection.service.lock().await.take());
    }

    /// Remembers a successful listing.
    pub(crate) fn keep_tools(&self, tools: &[serde_json::Value]) {
        if let Ok(mut last) = self.last_tools.lock() {
            *last = Some(tools.to_vec());
        }
    }

    /// The tools of the last successful listing, if any.
    pub(crate) fn last_tools(&self) -> Option<Vec<serde_json::Value>> {
        self.last_tools.lock().ok().and_then(|last| last.clone())
    }

    /// The last lines the server wrote to stderr (redacted), for error messages.
    pub(crate) fn stderr_tail(&self) -> String {
        match self.stderr_tail.lock() {
            Ok(tail) => tail.iter().cloned().collect::<Vec<_>>().join("\n"),
            Err(_) => String::new(),
        }
    }

    fn resolve(&self, value: &ConfigValue) -> Result<String, StartMcpServerError> {
        match value {
            ConfigValue::Literal(text) => Ok(text.clone()),
            ConfigValue::Secret(reference) => self
                .secrets
                .resolve(&reference.secret_ref)
                .ok_or_else(|| StartMcpServerError::MissingSecret {
                    server: self.name().to_owned(),
                    secret_ref: reference.secret_ref.clone(),
                }),
        }
    }

    /// Resolves secrets, installs the redactor for them, and returns the resolved values.
    fn resolve_all(
        &self,
        values: &std::collections::BTreeMap<String, ConfigValue>,
    ) -> Result<Vec<(String, String)>, StartMcpServerError> {
        let mut resolved = Vec::new();
        let mut secrets = Vec::new();
        for (key, value) in values {
            let text = self.resolve(value)?;
            if matches!(value, ConfigValue::Secret(_)) && !text.is_empty() {
                secrets.push(text.clone());
            }
            resolved.push((key.clone(), text));
        }
        let redactor =
            Redactor::new(secrets, Vec::new()).map_err(|error| StartMcpServerError::Spawn {
                server: self.name().to_owned(),
                message: format!("building the redaction of its secrets failed: {error}"),
            })?;
        if let Ok(mut slot) = self.redactor.write() {
            *slot = Arc::new(redactor);
        }
        Ok(resolved)
    }

    async fn start(&self) -> Result<Connection, StartMcpServerError> {
        let name = self.name().to_owned();
        let handler = Notifications {
            server: name.clone(),
            list_changes: Arc::clone(&self.list_changes),
            hub_generation: Arc::clone(&self.hub_generation),
        };
        let timeout = self.initialize_timeout();
        let started = match &self.config.transport {
            McpTransport::Stdio {
                command,
                args,
                env,
                cwd,
            } => {
                let env = self.resolve_all(env)?;
                let mut process = tokio::process::Command::new(command);
                for (key, _) in std::env::vars_os() {
                    let withheld = key.to_str().is_some_and(|key| {
                        self.options
                            .withheld_env_prefixes
                            .iter()
                            .any(|prefix| key.starts_with(prefix.as_str()))
                    });
                    if withheld {
                        process.env_remove(&key);
                    }
                }
                process.args(args).envs(env).kill_on_drop(true);
                if let Some(cwd) = cwd {
                    process.current_dir(cwd);
                }
                let mut wrapped = process_wrap::tokio::CommandWrap::from(process);
                // A group of its own, so `npx` and the node process it starts end together.
                wrapped.wrap(process_wrap::tokio::ProcessGroup::leader());
                let (transport, stderr) = TokioChildProcess::builder(wrapped)
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .map_err(|error| StartMcpServerError::Spawn {
                        server: name.clone(),
                        message: format!("cannot start {command:?}: {error}"),
                    })?;
                if let Some(stderr) = stderr {
                    self.capture_stderr(stderr);
                }
                tokio::time::timeout(timeout, handler.serve(transport)).await
            }
            McpTransport::StreamableHttp { url, headers } => {
                let headers = self.resolve_all(headers)?;
                let mut custom = HashMap::new();
                for (key, value) in headers {
                    let header = http::HeaderName::try_from(key.as_str()).map_err(|_| {
                        StartMcpServerError::Spawn {
                            server: name.clone(),
                            message: format!("header name {key:?} is not a valid HTTP header"),
                        }
                    })?;
                    let value = http::HeaderValue::try_from(value).map_err(|_| {
                        // Never the value: it may be a secret.
                        StartMcpServerError::Spawn {
                            server: name.clone(),
                            message: format!("the value of header {key:?} is not valid in HTTP"),
                        }
                    })?;
                    custom.insert(header, value);
                }
                let config = StreamableHttpClientTransportConfig::with_uri(url.as_str())
                    .custom_headers(custom);
                let transport = StreamableHttpClientTransport::from_config(config);
                tokio::time::timeout(timeout, handler.serve(transport)).await
            }
        };
        let service = match started {
            Ok(Ok(service)) => service,
            Ok(Err(error)) => {
                let message = self.redactor().redact_text(&error.to_string()).into_owned();
                return Err(StartMcpServerError::Initialize {
                    server: name,
                    message,
                    stderr: self.stderr_tail(),
                });
            }
            Err(_) => {
                return Err(StartMcpServerError::InitializeTimeout {
                    server: name,
                    timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
                    stderr: self.stderr_tail(),
                });
            }
        };
        tracing::info!(server = %name, "MCP server initialized");
        Ok(Connection {
            peer: service.peer().clone(),
            service: tokio::sync::Mutex::new(Some(service)),
            dead: AtomicBool::new(false),
        })
    }

    fn capture_stderr(&self, stderr: tokio::process::ChildStderr) {
        let name = self.name().to_owned();
        let tail = Arc::clone(&self.stderr_tail);
        let redactor = self.redactor();
        tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let mut line = redactor.redact_text(&line).into_owned();
                if let Some((cut, _)) = line.char_indices().nth(MAX_STDERR_LINE_CHARS) {
                    line.truncate(cut);
                    line.push_str("...");
                }
                tracing::info!(target: "corral_mcp::stderr", server = %name, "{line}");
                if let Ok(mut tail) = tail.lock() {
                    if tail.len() == STDERR_TAIL_LINES {
                        tail.pop_front();
                    }
                    tail.push_back(line);
                }
            }
        });
    }

    async fn stop(&self, timeout: Duration) {
        let connection = self.state.lock().await.connection.take();
        let Some(connection) = connection else {
            return;
        };
        connection.dead.store(true, Ordering::SeqCst);
        let service = connection.service.lock().await.take();
        if let Some(mut service) = service {
            // close() runs the transport's graceful shutdown: for a child, close its stdin, wait,
            // SIGTERM, then kill.
            if service.close_with_timeout(timeout).await.is_err() {
                tracing::warn!(server = %self.name(), "MCP server did not stop in time");
            }
        }
    }
}

/// What corral does with a server's notifications.
pub(crate) struct Notifications {
    server: String,
    list_changes: Arc<AtomicU64>,
    hub_generation: Arc<AtomicU64>,
}

impl ClientHandler for Notifications {
    fn on_tool_list_changed(
        &self,
        _context: NotificationContext<RoleClient>,
    ) -> impl Future<Output = ()> + MaybeSendFuture + '_ {
        self.list_changes.fetch_add(1, Ordering::SeqCst);
        self.hub_generation.fetch_add(1, Ordering::SeqCst);
        tracing::info!(server = %self.server, "MCP server's tool list changed");
        std::future::ready(())
    }
}
