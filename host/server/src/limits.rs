//! Hostile and careless clients: what one client may hold of the server, and the accept loop
//! that enforces it (the `[limits]` table of the configuration, docs/configuration.md).
//!
//! - **Header-read timeout** (`headerReadTimeoutMs`, 10 s): from the first byte of a request
//!   to the end of its headers. A client that sends a request line and then one header every
//!   few seconds (slowloris) is disconnected when it runs out, however often it sends.
//! - **Idle timeout** (`idleTimeoutMs`, 75 s): a connection with no request in flight and no
//!   byte received for this long is closed. Longer than the usual load balancer's idle timeout
//!   (60 s), so the balancer, not corral, closes a kept-alive connection first and never sends a
//!   request on a connection corral is closing.
//! - **Connection cap** (`maxConnections`, 1000): one more connection is accepted, answered
//!   `503 overloaded` with `Retry-After`, and closed: a load balancer retries elsewhere at once,
//!   where a connection left in the kernel's queue would wait unseen.
//! - **SSE streams per token** (`sseStreamsPerToken`, 32): one more stream is `429
//!   too_many_requests`; a stream counts until its connection closes.
//! - **Command rate per tenant** (`commandsPerSecond`, 20, and `commandBurst`, 40, with
//!   per-tenant overrides under `[limits.tenants.NAME]`): a token bucket per tenant over `POST
//!   /v1/sessions/{id}/commands`; over it, `429 too_many_requests` with `Retry-After`. Executors'
//!   `action_result` commands are not limited: they report work the server asked for, and
//!   throttling them would only stretch the turns waiting on them.
//!
//! The timeouts are enforced by one watchdog per connection over what the connection's bytes
//! and requests do ([`Activity`]), because hyper's own header timeout also closes kept-alive
//! connections after the same short time, which makes a load balancer's reused connections
//! fail.

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{MatchedPath, Request, State};
use axum::http::header::AUTHORIZATION;
use axum::http::{HeaderValue, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, DefaultKeyedRateLimiter, Quota, RateLimiter};
use http_body_util::BodyExt as _;
use hyper_util::rt::TokioIo;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt as _;

use crate::auth::Caller;
use crate::config::ConfigError;
use crate::error::{ApiError, ErrorBody, ErrorCode};
use crate::metrics::Metrics;
use crate::runtime::Runtime;
use crate::tenancy::{addressed_tenant, tenant_problem};

/// The route whose commands are rate-limited per tenant.
pub const COMMAND_ROUTE: &str = "/v1/sessions/{id}/commands";
/// The routes whose streams count against `sseStreamsPerToken`.
pub const STREAM_ROUTES: &[&str] = &["/v1/sessions/{id}/events", "/v1/executors/connect"];

/// The `[limits]` table: what one client may hold of the server.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Limits {
    /// From a request's first byte to the end of its headers (`headerReadTimeoutMs`).
    pub header_read_timeout: Duration,
    /// A connection with nothing in flight and nothing received is closed after this long
    /// (`idleTimeoutMs`).
    pub idle_timeout: Duration,
    /// Open connections at most (`maxConnections`); one more is answered 503 and closed.
    pub max_connections: usize,
    /// Open SSE streams per token at most (`sseStreamsPerToken`); one more is 429.
    pub sse_streams_per_token: usize,
    /// The command rate of a tenant without an override (`commandsPerSecond`, `commandBurst`).
    pub commands: CommandRate,
    /// Per-tenant command rates (`[limits.tenants.NAME]`).
    pub tenant_commands: BTreeMap<String, CommandRate>,
}

/// A token bucket: `burst` commands at once, refilled at `per_second`.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct CommandRate {
    /// Sustained commands per second (may be below 1: 0.1 is one every ten seconds).
    pub per_second: f64,
    /// Commands accepted at once from a full bucket.
    pub burst: u32,
}

impl CommandRate {
    /// A rate of `per_second` with bursts of `burst` (both positive; checked by the config).
    pub fn new(per_second: f64, burst: u32) -> CommandRate {
        CommandRate { per_second, burst }
    }

    fn quota(self) -> Quota {
        let burst = NonZeroU32::new(self.burst).unwrap_or(NonZeroU32::MIN);
        let period = Duration::from_secs_f64(1.0 / self.per_second).max(Duration::from_nanos(1));
        Quota::with_period(period)
            .unwrap_or_else(|| Quota::per_second(NonZeroU32::MIN))
            .allow_burst(burst)
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            header_read_timeout: Limits::DEFAULT_HEADER_READ_TIMEOUT,
            idle_timeout: Limits::DEFAULT_IDLE_TIMEOUT,
            max_connections: Limits::DEFAULT_MAX_CONNECTIONS,
            sse_streams_per_token: Limits::DEFAULT_SSE_STREAMS_PER_TOKEN,
            commands: CommandRate::new(
                Limits::DEFAULT_COMMANDS_PER_SECOND,
                Limits::DEFAULT_COMMAND_BURST,
            ),
            tenant_commands: BTreeMap::new(),
        }
    }
}

impl Limits {
    /// Default header-read timeout (10 s).
    pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
    /// Default idle timeout (75 s: longer than a load balancer's usual 60 s).
    pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(75);
    /// Default connection cap (1000: below the usual 1024 open files of a process).
    pub const DEFAULT_MAX_CONNECTIONS: usize = 1000;
    /// Default SSE streams per token (32).
    pub const DEFAULT_SSE_STREAMS_PER_TOKEN: usize = 32;
    /// Default sustained commands per second per tenant (20).
    pub const DEFAULT_COMMANDS_PER_SECOND: f64 = 20.0;
    /// Default command burst per tenant (40).
    pub const DEFAULT_COMMAND_BURST: u32 = 40;
}

/// `[limits]` as written in the file.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct RawLimits {
    header_read_timeout_ms: Option<u64>,
    idle_timeout_ms: Option<u64>,
    max_connections: Option<usize>,
    sse_streams_per_token: Option<usize>,
    commands_per_second: Option<f64>,
    command_burst: Option<u32>,
    #[serde(default)]
    tenants: BTreeMap<String, RawTenantLimits>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawTenantLimits {
    commands_per_second: Option<f64>,
    command_burst: Option<u32>,
}

fn problem(field: impl Into<String>, problem: impl Into<String>) -> ConfigError {
    ConfigError::Field {
        field: field.into(),
        problem: problem.into(),
    }
}

fn positive_ms(name: &str, value: Option<u64>, default: Duration) -> Result<Duration, ConfigError> {
    match value {
        None => Ok(default),
        Some(0) => Err(problem(format!("limits.{name}"), "must be positive")),
        Some(ms) => Ok(Duration::from_millis(ms)),
    }
}

fn rate(
    name: &str,
    per_second: Option<f64>,
    burst: Option<u32>,
    base: CommandRate,
) -> Result<CommandRate, ConfigError> {
    let per_second = per_second.unwrap_or(base.per_second);
    if !(per_second.is_finite() && per_second > 0.0 && per_second <= 1e9) {
        return Err(problem(
            format!("{name}.commandsPerSecond"),
            "must be a positive number (at most 1e9)",
        ));
    }
    let burst = burst.unwrap_or(base.burst);
    if burst == 0 {
        return Err(problem(format!("{name}.commandBurst"), "must be positive"));
    }
    Ok(CommandRate::new(per_second, burst))
}

impl RawLimits {
    pub(crate) fn validate(self) -> Result<Limits, ConfigError> {
        let defaults = Limits::default();
        let count = |name: &str, value: Option<usize>, default: usize| match value {
            Some(0) => Err(problem(format!("limits.{name}"), "must be positive")),
            Some(n) => Ok(n),
            None => Ok(default),
        };
        let commands = rate(
            "limits",
            self.commands_per_second,
            self.command_burst,
            defaults.commands,
        )?;
        let mut tenant_commands = BTreeMap::new();
        for (tenant, raw) in self.tenants {
            let name = format!("limits.tenants.{tenant}");
            if let Some(why) = tenant_problem(&tenant) {
                return Err(problem(name, why));
            }
            let rate = rate(&name, raw.commands_per_second, raw.command_burst, commands)?;
            tenant_commands.insert(tenant, rate);
        }
        Ok(Limits {
            header_read_timeout: positive_ms(
                "headerReadTimeoutMs",
                self.header_read_timeout_ms,
                defaults.header_read_timeout,
            )?,
            idle_timeout: positive_ms(
                "idleTimeoutMs",
                self.idle_timeout_ms,
                defaults.idle_timeout,
            )?,
            max_connections: count(
                "maxConnections",
                self.max_connections,
                defaults.max_connections,
            )?,
            sse_streams_per_token: count(
                "sseStreamsPerToken",
                self.sse_streams_per_token,
                defaults.sse_streams_per_token,
            )?,
            commands,
            tenant_commands,
        })
    }
}

// ---- per-request limits: the command rate and the streams per token ----

/// The request-level limits' state: a token bucket per tenant and open streams per token.
#[derive(Debug)]
pub(crate) struct ClientLimits {
    runtime: Arc<Runtime>,
    commands: DefaultKeyedRateLimiter<String>,
    tenant_commands: HashMap<String, DefaultDirectRateLimiter>,
    streams: Mutex<HashMap<[u8; 32], usize>>,
    clock: DefaultClock,
}

impl ClientLimits {
    pub(crate) fn new(runtime: Arc<Runtime>) -> Arc<ClientLimits> {
        let limits = runtime.config().limits.clone();
        Arc::new(ClientLimits {
            commands: RateLimiter::keyed(limits.commands.quota()),
            tenant_commands: limits
                .tenant_commands
                .iter()
                .map(|(tenant, rate)| (tenant.clone(), RateLimiter::direct(rate.quota())))
                .collect(),
            streams: Mutex::new(HashMap::new()),
            clock: DefaultClock::default(),
            runtime,
        })
    }

    /// Takes one command from `tenant`'s bucket, or says how long until one is available.
    fn take_command(&self, tenant: &str) -> Result<(), Duration> {
        let now = self.clock.now();
        let checked = match self.tenant_commands.get(tenant) {
            Some(limiter) => limiter.check(),
            None => {
                // Operators may address any tenant name: forget the buckets that are full again.
                if self.commands.len() > 10_000 {
                    self.commands.retain_recent();
                }
                self.commands.check_key(&tenant.to_owned())
            }
        };
        checked.map_err(|not_until| not_until.wait_time_from(now))
    }

    /// Counts one more stream of `token`, or `None` at the cap.
    fn open_stream(self: &Arc<Self>, token: &str) -> Option<StreamSlot> {
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let cap = self.runtime.config().limits.sse_streams_per_token;
        let mut streams = self.streams.lock().unwrap_or_else(PoisonError::into_inner);
        let open = streams.entry(key).or_insert(0);
        if *open >= cap {
            return None;
        }
        *open += 1;
        Some(StreamSlot {
            limits: Arc::clone(self),
            key,
        })
    }
}

/// One open stream of a token; dropped with the response body (the connection closed or the
/// stream ended), it frees its slot.
struct StreamSlot {
    limits: Arc<ClientLimits>,
    key: [u8; 32],
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let mut streams = self
            .limits
            .streams
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(open) = streams.get_mut(&self.key) {
            *open = open.saturating_sub(1);
            if *open == 0 {
                streams.remove(&self.key);
            }
        }
    }
}

/// The bearer token of a request, as presented.
fn bearer(request: &Request) -> Option<String> {
    let value = request.headers().get(AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim().to_owned())
}

/// The caller, if the request authenticates; otherwise the handler answers 401 itself.
async fn caller(request: Request, runtime: &Arc<Runtime>) -> (Request, Option<Caller>) {
    use axum::extract::FromRequestParts as _;
    let (mut parts, body) = request.into_parts();
    let caller = Caller::from_request_parts(&mut parts, runtime).await.ok();
    (Request::from_parts(parts, body), caller)
}

/// The tenant a command request is counted against, if it is limited at all: a tenant token's
/// own tenant, the tenant an operator addresses (`?tenantId=`, else the default tenant). Executor
/// tokens and requests the handler will refuse anyway are not counted.
fn command_tenant(request: &Request, caller: &Caller) -> Option<String> {
    let Caller::Application { tenant, .. } = caller else {
        return None;
    };
    let asked = query_tenant(request.uri());
    addressed_tenant(tenant.as_deref(), asked.as_deref()).ok()
}

/// The `tenantId` query parameter, decoded (malformed queries are the handler's 400).
fn query_tenant(uri: &axum::http::Uri) -> Option<String> {
    let axum::extract::Query(mut params) =
        axum::extract::Query::<HashMap<String, String>>::try_from_uri(uri).ok()?;
    params.remove("tenantId")
}

/// The middleware of the limited routes (a route layer: it sees the matched route).
pub(crate) async fn limit_requests(
    State(limits): State<Arc<ClientLimits>>,
    request: Request,
    next: Next,
) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(|path| path.as_str().to_owned());
    let Some(route) = route else {
        return next.run(request).await;
    };
    if request.method() == Method::POST && route == COMMAND_ROUTE {
        let (request, caller) = caller(request, &limits.runtime).await;
        let tenant = caller.as_ref().and_then(|c| command_tenant(&request, c));
        if let Some(tenant) = tenant
            && let Err(wait) = limits.take_command(&tenant)
        {
            limits.runtime.metrics.rate_limited("commands", &tenant);
            return ApiError::TooManyRequests {
                message: format!(
                    "tenant {tenant:?} is over its command rate ({} per second, bursts of {}); \
                     retry after the Retry-After header's seconds",
                    rate_of(&limits, &tenant).per_second,
                    rate_of(&limits, &tenant).burst,
                ),
                retry_after: Some(wait),
            }
            .into_response();
        }
        return next.run(request).await;
    }
    if request.method() == Method::GET && STREAM_ROUTES.contains(&route.as_str()) {
        let (request, caller) = caller(request, &limits.runtime).await;
        let token = caller.and_then(|_| bearer(&request));
        let Some(token) = token else {
            return next.run(request).await;
        };
        let Some(slot) = limits.open_stream(&token) else {
            limits.runtime.metrics.rate_limited("sse_streams", "");
            let cap = limits.runtime.config().limits.sse_streams_per_token;
            return ApiError::TooManyRequests {
                message: format!(
                    "this token already has {cap} open event streams (sseStreamsPerToken); \
                     close one first"
                ),
                retry_after: None,
            }
            .into_response();
        };
        let response = next.run(request).await;
        // The slot lives as long as the body: until the stream ends or its connection closes.
        return response.map(|body| {
            Body::new(body.map_frame(move |frame| {
                let _slot = &slot;
                frame
            }))
        });
    }
    next.run(request).await
}

fn rate_of(limits: &ClientLimits, tenant: &str) -> CommandRate {
    let config = &limits.runtime.config().limits;
    config
        .tenant_commands
        .get(tenant)
        .copied()
        .unwrap_or(config.commands)
}

// ---- the accept loop: connection cap, header-read and idle timeouts ----

/// What a connection is doing, as its watchdog needs it.
#[derive(Debug)]
struct Activity {
    state: Mutex<ActivityState>,
    changed: Notify,
}

#[derive(Debug)]
struct ActivityState {
    /// Requests whose response has not been sent in full.
    in_flight: usize,
    /// When the connection last had nothing in flight.
    idle_since: Instant,
    /// The first byte of the next request's head, while it is being read.
    head_started: Option<Instant>,
}

/// Why a connection was closed by its watchdog.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expiry {
    HeaderRead,
    Idle,
}

impl Expiry {
    fn as_str(self) -> &'static str {
        match self {
            Expiry::HeaderRead => "header_read",
            Expiry::Idle => "idle",
        }
    }
}

impl Activity {
    fn new() -> Arc<Activity> {
        Arc::new(Activity {
            state: Mutex::new(ActivityState {
                in_flight: 0,
                idle_since: Instant::now(),
                head_started: None,
            }),
            changed: Notify::new(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ActivityState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Bytes arrived: with nothing in flight they begin a request head.
    fn received(&self) {
        let mut state = self.lock();
        if state.in_flight == 0 && state.head_started.is_none() {
            state.head_started = Some(Instant::now());
            drop(state);
            self.changed.notify_one();
        }
    }

    /// A request's head was read in full: its response is in flight until the guard drops.
    fn begin(self: &Arc<Self>) -> InFlight {
        let mut state = self.lock();
        state.in_flight += 1;
        state.head_started = None;
        drop(state);
        self.changed.notify_one();
        InFlight(Arc::clone(self))
    }

    /// Resolves when the connection has been idle, or reading one head, for too long.
    async fn expired(&self, limits: &Limits) -> Expiry {
        loop {
            let notified = self.changed.notified();
            let deadline = {
                let state = self.lock();
                if state.in_flight > 0 {
                    None
                } else if let Some(started) = state.head_started {
                    Some((started + limits.header_read_timeout, Expiry::HeaderRead))
                } else {
                    Some((state.idle_since + limits.idle_timeout, Expiry::Idle))
                }
            };
            match deadline {
                None => notified.await,
                Some((at, why)) if at <= Instant::now() => return why,
                Some((at, _)) => {
                    tokio::select! {
                        () = notified => {}
                        () = tokio::time::sleep_until(at) => {}
                    }
                }
            }
        }
    }
}

/// A request in flight; dropped when its response body is done (or abandoned).
struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut state = self.0.lock();
        state.in_flight = state.in_flight.saturating_sub(1);
        if state.in_flight == 0 {
            state.idle_since = Instant::now();
            state.head_started = None;
        }
        drop(state);
        self.0.changed.notify_one();
    }
}

/// A TCP stream that tells its [`Activity`] when bytes arrive.
struct Watched {
    stream: TcpStream,
    activity: Arc<Activity>,
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.stream).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.received();
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

/// Refused connections whose answer is still being delivered, at most.
const LINGERING: usize = 64;

/// Serves `app` on `listener` under `limits` until `signal` resolves; then stops accepting,
/// lets each connection finish its requests (idle ones close at once), and returns when every
/// connection is closed.
pub(crate) async fn serve(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    metrics: Arc<Metrics>,
    signal: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let lingering = Arc::new(Semaphore::new(LINGERING));
    let closing = CancellationToken::new();
    let connections = TaskTracker::new();
    let limits = Arc::new(limits);
    tokio::pin!(signal);
    loop {
        let (stream, peer) = tokio::select! {
            () = &mut signal => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors, or a connection reset before it was accepted:
                    // wait a little rather than spin.
                    tracing::warn!(%error, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        match Arc::clone(&permits).try_acquire_owned() {
            Ok(permit) => {
                metrics.connection(1);
                let task = connection(
                    stream,
                    peer,
                    app.clone(),
                    Arc::clone(&limits),
                    closing.clone(),
                    Arc::clone(&metrics),
                );
                connections.spawn(async move {
                    task.await;
                    drop(permit);
                });
            }
            Err(_) => {
                metrics.connection_refused();
                refuse(stream, &lingering);
            }
        }
    }
    drop(listener);
    closing.cancel();
    connections.close();
    connections.wait().await;
    Ok(())
}

/// Serves one connection until it closes, its watchdog expires or, after shutdown began, its
/// last request is answered.
async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    app: Router,
    limits: Arc<Limits>,
    closing: CancellationToken,
    metrics: Arc<Metrics>,
) {
    let activity = Activity::new();
    let io = TokioIo::new(Watched {
        stream,
        activity: Arc::clone(&activity),
    });
    let service = {
        let activity = Arc::clone(&activity);
        hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
            let in_flight = activity.begin();
            let app = app.clone();
            async move {
                let response = match app.oneshot(request.map(Body::new)).await {
                    Ok(response) => response,
                    Err(never) => match never {},
                };
                Ok::<_, Infallible>(response.map(|body| {
                    Body::new(body.map_frame(move |frame| {
                        let _in_flight = &in_flight;
                        frame
                    }))
                }))
            }
        })
    };
    let mut builder = hyper::server::conn::http1::Builder::new();
    // The watchdog below times headers out; hyper's own timeout would also cut idle
    // kept-alive connections at the same short time.
    builder.header_read_timeout(None);
    let connection = builder.serve_connection(io, service).with_upgrades();
    tokio::pin!(connection);
    let mut shutting_down = false;
    loop {
        tokio::select! {
            served = connection.as_mut() => {
                if let Err(error) = served {
                    tracing::debug!(%peer, %error, "connection ended with an error");
                }
                break;
            }
            () = closing.cancelled(), if !shutting_down => {
                shutting_down = true;
                connection.as_mut().graceful_shutdown();
            }
            why = activity.expired(&limits) => {
                tracing::debug!(%peer, reason = why.as_str(), "closing a connection that timed out");
                metrics.connection_timed_out(why.as_str());
                break;
            }
        }
    }
    metrics.connection(-1);
}

/// Answers a connection over the cap with 503 and closes it. The answer is written at once
/// (it fits a socket buffer); the close waits briefly for the client's request so that the
/// client reads the answer instead of a reset, for at most [`LINGERING`] connections at a time.
fn refuse(stream: TcpStream, lingering: &Arc<Semaphore>) {
    let body = serde_json::to_string(&ErrorBody {
        status: "rejected".to_owned(),
        code: ErrorCode::Overloaded,
        message: "the server has too many open connections (maxConnections); retry shortly"
            .to_owned(),
    })
    .unwrap_or_default();
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nretry-after: 1\r\nx-request-id: {}\r\nconnection: close\r\n\r\n{body}",
        body.len(),
        uuid::Uuid::new_v4(),
    );
    let _ = stream.try_write(answer.as_bytes());
    let Ok(permit) = Arc::clone(lingering).try_acquire_owned() else {
        return;
    };
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let mut stream = stream;
        let _ = stream.shutdown().await;
        let mut sink = [0u8; 1024];
        let _ = tokio::time::timeout(Duration::from_secs(1), async {
            while matches!(stream.read(&mut sink).await, Ok(n) if n > 0) {}
        })
        .await;
        drop(permit);
    });
}

/// `Retry-After` in whole seconds, at least 1.
pub(crate) fn retry_after_header(wait: Duration) -> HeaderValue {
    let seconds = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    HeaderValue::from(seconds.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_rounds_up_to_whole_seconds() {
        assert_eq!(retry_after_header(Duration::ZERO), "1");
        assert_eq!(retry_after_header(Duration::from_millis(1)), "1");
        assert_eq!(retry_after_header(Duration::from_millis(1001)), "2");
        assert_eq!(retry_after_header(Duration::from_secs(60)), "60");
    }

    #[test]
    fn the_operator_tenant_comes_from_the_query() {
        let tenant = |uri: &str| query_tenant(&uri.parse().expect("uri"));
        assert_eq!(tenant("/c?tenantId=acme"), Some("acme".to_owned()));
        assert_eq!(tenant("/c?x=1&tenantId=b%2Ec"), Some("b.c".to_owned()));
        assert_eq!(tenant("/c"), None);
    }

    #[test]
    fn a_bucket_refuses_past_its_burst_and_names_the_wait() {
        let rate = CommandRate::new(0.01, 2);
        let limiter = RateLimiter::direct(rate.quota());
        assert!(limiter.check().is_ok());
        assert!(limiter.check().is_ok());
        let refused = limiter.check().expect_err("over the burst");
        let wait = refused.wait_time_from(DefaultClock::default().now());
        assert!(wait > Duration::from_secs(90), "{wait:?}");
    }
}
