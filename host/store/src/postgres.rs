//! PostgreSQL: several replicas share one database; leases with fencing keep them apart.

use std::error::Error as _;
use std::future::Future;
use std::pin::Pin;
use std::str::FromStr;
use std::sync::{Arc, Weak};
use std::task::Poll;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, PoolError, RecyclingMethod, Runtime};
use futures::FutureExt as _;
use futures::future::BoxFuture;
use tokio::sync::watch;
use tokio_postgres::types::ToSql;
use tokio_postgres::{AsyncMessage, NoTls, Statement};

use crate::backend::Backend;
use crate::engine::{
    self, Row, Tx, action_columns, agent_columns, checkpoint_columns, command_columns, counter,
    effect_columns, event_columns, item_columns, owner_columns, session_columns,
};
use crate::error::{BoxError, Entity, OpenStoreError, StoreError};
use crate::feed::{EventNotice, Feed, Notice, WorkNotice};
use crate::migrations;
use crate::model::{
    Action, ActionFilter, AgentDefinition, Checkpoint, CommandRecord, Effect, EffectStatus, Event,
    Item, NewAgent, NewCheckpoint, Session, SessionCount, SessionFilter, SessionStatus,
    StoreBackend, Timestamp,
};

/// The connection settings of `tokio-postgres` (host, port, user, database, timeouts...).
pub use tokio_postgres::Config as PostgresConfig;
pub use tokio_postgres::config::Host as PostgresHost;

/// Serializes migrations of replicas starting at the same time (`pg_advisory_xact_lock` key).
const MIGRATION_LOCK: i64 = 0x636f_7272_616c_0001;

/// The database server's clock, in Unix milliseconds: every replica reads the same clock, so
/// lease expiry does not depend on the replicas' clocks agreeing.
macro_rules! clock {
    () => {
        "(extract(epoch from clock_timestamp()) * 1000)::bigint"
    };
}

/// Settings of the PostgreSQL store.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct PostgresOptions {
    /// Where and how to connect.
    pub config: PostgresConfig,
    /// Connections in the pool (default 16).
    pub pool_size: usize,
    /// How long an operation waits for a free connection before failing as
    /// [`StoreError::Unavailable`] (default 30 s).
    pub wait_timeout: Duration,
    /// The server cancels a statement running longer (`statement_timeout`, default 30 s).
    pub statement_timeout: Duration,
    /// The server cancels a statement waiting longer for a lock (`lock_timeout`, default 10 s).
    pub lock_timeout: Duration,
    /// The TLS settings used when the configuration's `sslmode` is `require`; `None` for the
    /// webpki (Mozilla) roots.
    pub tls: Option<Arc<rustls::ClientConfig>>,
}

impl PostgresOptions {
    /// Options for `config`, with a 10 s connect timeout unless it sets one.
    pub fn new(mut config: PostgresConfig) -> Self {
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(Duration::from_secs(10));
        }
        Self {
            config,
            pool_size: 16,
            wait_timeout: Duration::from_secs(30),
            statement_timeout: Duration::from_secs(30),
            lock_timeout: Duration::from_secs(10),
            tls: None,
        }
    }

    /// These options with the server-side statement and lock timeouts.
    pub fn timeouts(mut self, statement: Duration, lock: Duration) -> Self {
        self.statement_timeout = statement;
        self.lock_timeout = lock;
        self
    }

    /// These options with this TLS configuration for `sslmode=require`.
    pub fn tls(mut self, tls: Arc<rustls::ClientConfig>) -> Self {
        self.tls = Some(tls);
        self
    }

    /// The configuration every connection uses: the timeouts as session settings.
    fn session_config(&self) -> PostgresConfig {
        let mut config = self.config.clone();
        let timeouts = format!(
            "-c statement_timeout={} -c lock_timeout={}",
            self.statement_timeout.as_millis(),
            self.lock_timeout.as_millis()
        );
        let options = match self.config.get_options() {
            Some(existing) if !existing.is_empty() => format!("{existing} {timeouts}"),
            _ => timeouts,
        };
        config.options(&options);
        config
    }

    /// The TLS connector `sslmode` asks for: rustls for `require`, none otherwise (`prefer`,
    /// the default, then connects in plain text).
    fn connector(&self) -> Result<Tls, OpenStoreError> {
        if self.config.get_ssl_mode() != tokio_postgres::config::SslMode::Require {
            return Ok(Tls::Plain);
        }
        let config = match &self.tls {
            Some(config) => (**config).clone(),
            None => {
                let provider = Arc::new(rustls::crypto::ring::default_provider());
                rustls::ClientConfig::builder_with_provider(provider)
                    .with_safe_default_protocol_versions()
                    .map_err(|error| OpenStoreError::InvalidSettings {
                        reason: format!("TLS: {error}"),
                    })?
                    .with_root_certificates(rustls::RootCertStore {
                        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
                    })
                    .with_no_client_auth()
            }
        };
        Ok(Tls::Rustls(tokio_postgres_rustls::MakeRustlsConnect::new(
            config,
        )))
    }

    /// Options from a connection URL (`postgres://user@host:port/database`) or a key-value string.
    pub fn from_url(url: &str) -> Result<Self, OpenStoreError> {
        let config =
            PostgresConfig::from_str(url).map_err(|error| OpenStoreError::InvalidSettings {
                reason: error.to_string(),
            })?;
        Ok(Self::new(config))
    }

    /// These options with `pool_size` connections.
    pub fn pool_size(mut self, pool_size: usize) -> Self {
        self.pool_size = pool_size;
        self
    }
}

/// The PostgreSQL store, for several `corral serve` replicas sharing one database.
///
/// All objects it creates are prefixed `corral_`. Session rows are locked (`FOR UPDATE`) by every
/// transaction that writes to the session, runnable sessions are claimed with
/// `FOR UPDATE SKIP LOCKED`, and lease times come from the database server's clock.
#[derive(Clone)]
pub struct PostgresStore {
    pool: Pool,
    shared: Arc<Shared>,
}

/// What the handles of one store share with its listener task.
struct Shared {
    feed: Feed,
    /// Tags this store's notifications, so that its listener skips its own (they were published
    /// locally at commit).
    origin: String,
    /// Dropped (or set) to stop the listener.
    stop: watch::Sender<bool>,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("pool", &self.pool.status())
            .finish_non_exhaustive()
    }
}

impl PostgresStore {
    /// Connects a pool and applies the pending migrations: in one transaction, under an
    /// advisory lock, so that replicas starting together apply each migration exactly once.
    /// A database migrated by a newer build is refused with [`OpenStoreError::SchemaTooNew`].
    pub async fn connect(options: PostgresOptions) -> Result<Self, OpenStoreError> {
        if options.pool_size == 0 {
            return Err(OpenStoreError::InvalidSettings {
                reason: "the pool needs at least one connection".to_owned(),
            });
        }
        let connect_timeout = options.config.get_connect_timeout().copied();
        let manager_config = ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        };
        let tls = options.connector()?;
        let config = options.session_config();
        let manager = match &tls {
            Tls::Plain => Manager::from_config(config.clone(), NoTls, manager_config),
            Tls::Rustls(tls) => Manager::from_config(config.clone(), tls.clone(), manager_config),
        };
        let pool = Pool::builder(manager)
            .max_size(options.pool_size)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(options.wait_timeout))
            .create_timeout(connect_timeout)
            .build()
            .map_err(|error| OpenStoreError::InvalidSettings {
                reason: error.to_string(),
            })?;
        let mut client = pool.get().await.map_err(|error| {
            let error = pool_error("connect", error);
            match error {
                StoreError::Unavailable { source, .. } => OpenStoreError::Unavailable {
                    action: "connect",
                    source,
                },
                other => OpenStoreError::Backend {
                    action: "connect",
                    source: Box::new(other),
                },
            }
        })?;
        migrate(&mut client).await?;
        drop(client);
        let (stop, stopped) = watch::channel(false);
        let shared = Arc::new(Shared {
            feed: Feed::default(),
            origin: crate::replica_id(),
            stop,
        });
        // The first LISTEN completes before `connect` returns: a commit made by anyone after it
        // is announced to this store's subscribers.
        let listener = listen(&config, &tls).await.map_err(|error| match error {
            StoreError::Unavailable { source, .. } => OpenStoreError::Unavailable {
                action: "listen for changes",
                source,
            },
            other => OpenStoreError::Backend {
                action: "listen for changes",
                source: Box::new(other),
            },
        })?;
        tokio::spawn(run_listener(
            config,
            tls,
            pool.clone(),
            Arc::downgrade(&shared),
            stopped,
            listener,
        ));
        Ok(Self { pool, shared })
    }

    /// Closes the pool and stops the change listener: later operations fail as
    /// [`StoreError::Unavailable`].
    pub fn close(&self) {
        self.pool.close();
        let _ = self.shared.stop.send(true);
    }
}

async fn migrate(client: &mut deadpool_postgres::Object) -> Result<(), OpenStoreError> {
    let failed = |action: &'static str| {
        move |error: tokio_postgres::Error| match pg_error(action, error) {
            StoreError::Unavailable { source, .. } => {
                OpenStoreError::Unavailable { action, source }
            }
            StoreError::Backend { source, .. } => OpenStoreError::Backend { action, source },
            other => OpenStoreError::Backend {
                action,
                source: Box::new(other),
            },
        }
    };
    let tx = client.transaction().await.map_err(failed("migrate"))?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await
        .map_err(failed("lock the migrations"))?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS corral_schema_migrations (
             version    BIGINT NOT NULL PRIMARY KEY,
             name       TEXT   NOT NULL,
             applied_at BIGINT NOT NULL
         )",
    )
    .await
    .map_err(failed("create the migrations table"))?;
    let found: Option<i64> = tx
        .query_one("SELECT MAX(version) FROM corral_schema_migrations", &[])
        .await
        .map_err(failed("read the schema version"))?
        .try_get(0)
        .map_err(failed("read the schema version"))?;
    let found = found.unwrap_or(0);
    let supported = migrations::latest(migrations::POSTGRES);
    if found > i64::from(supported) {
        return Err(OpenStoreError::SchemaTooNew {
            found: u32::try_from(found).unwrap_or(u32::MAX),
            supported,
        });
    }
    let pending = migrations::POSTGRES
        .iter()
        .filter(|migration| i64::from(migration.version) > found);
    for migration in pending {
        let failed = |error: tokio_postgres::Error| OpenStoreError::Migration {
            version: migration.version,
            name: migration.name,
            source: Box::new(error),
        };
        tx.batch_execute(migration.sql).await.map_err(failed)?;
        tx.execute(
            concat!(
                "INSERT INTO corral_schema_migrations (version, name, applied_at) VALUES ($1, $2, ",
                clock!(),
                ")"
            ),
            &[&i64::from(migration.version), &migration.name],
        )
        .await
        .map_err(failed)?;
    }
    tx.commit().await.map_err(failed("commit the migrations"))
}

/// The `NOTIFY` channels of the change feed.
const EVENTS_CHANNEL: &str = "corral_events";
const WORK_CHANNEL: &str = "corral_work";

/// Payloads stay well under PostgreSQL's 8000-byte limit.
const MAX_PAYLOAD: usize = 7_000;

/// How often an idle listener checks its connection (and notes the server's time, from which
/// it catches up after a reconnection).
const LISTEN_PROBE: Duration = Duration::from_secs(5);

/// The `pg_notify` calls announcing `notices`: (channel, JSON payload), at most
/// [`MAX_PAYLOAD`] bytes each. Events: `{"o": origin, "e": [[session, first, last], ...]}`;
/// work: `{"o": origin, "w": [action, ...]}`.
fn notify_payloads(origin: &str, notices: &[Notice]) -> Vec<(&'static str, String)> {
    let mut payloads = Vec::new();
    let mut events: Vec<serde_json::Value> = Vec::new();
    let mut work: Vec<serde_json::Value> = Vec::new();
    let mut events_size = 0;
    let mut work_size = 0;
    let flush = |payloads: &mut Vec<(&'static str, String)>,
                 channel: &'static str,
                 key: &str,
                 entries: &mut Vec<serde_json::Value>| {
        if !entries.is_empty() {
            let payload = serde_json::json!({"o": origin, key: std::mem::take(entries)});
            payloads.push((channel, payload.to_string()));
        }
    };
    for notice in notices {
        match notice {
            Notice::Events {
                session_id,
                first,
                last,
                cancelled,
            } => {
                let entry = if *cancelled {
                    serde_json::json!([session_id, first, last, 1])
                } else {
                    serde_json::json!([session_id, first, last])
                };
                let size = entry.to_string().len() + 1;
                if events_size + size > MAX_PAYLOAD - origin.len() - 16 {
                    flush(&mut payloads, EVENTS_CHANNEL, "e", &mut events);
                    events_size = 0;
                }
                events_size += size;
                events.push(entry);
            }
            Notice::Work { action_id } => {
                let size = action_id.len() + 3;
                if work_size + size > MAX_PAYLOAD - origin.len() - 16 {
                    flush(&mut payloads, WORK_CHANNEL, "w", &mut work);
                    work_size = 0;
                }
                work_size += size;
                work.push(serde_json::Value::from(action_id.as_str()));
            }
        }
    }
    flush(&mut payloads, EVENTS_CHANNEL, "e", &mut events);
    flush(&mut payloads, WORK_CHANNEL, "w", &mut work);
    payloads
}

/// Announces a transaction's notices to the other replicas: one statement whose implicit
/// transaction calls `pg_notify` for each payload, sent right behind the data's `COMMIT` in the
/// same flight (see [`PgTx::commit`]).
///
/// Not inside the data's transaction: PostgreSQL serializes the commits of every transaction that
/// notified, WAL flush included (`PreCommit_Notify` holds a database-wide lock until the commit
/// ends), which halved the throughput of 16 sessions stepping at once. The notifying transaction
/// writes no data and does not wait for its own commit record to reach the disk
/// (`synchronous_commit` off for it alone, with `set_config(..., true)`), so it holds the lock
/// for microseconds.
const ANNOUNCE: &str = "SELECT set_config('synchronous_commit', 'off', true), \
    pg_notify(channel, payload) FROM unnest($1::text[], $2::text[]) AS n (channel, payload)";

/// Publishes a notification of another store (ours were published at commit).
fn forward(shared: &Shared, channel: &str, payload: &str) {
    let Ok(value) = serde_json::from_str::<serde_json::Value>(payload) else {
        return;
    };
    if value.get("o").and_then(serde_json::Value::as_str) == Some(shared.origin.as_str()) {
        return;
    }
    let mut notices = Vec::new();
    if channel == EVENTS_CHANNEL {
        for entry in value
            .get("e")
            .and_then(|e| e.as_array())
            .into_iter()
            .flatten()
        {
            let (Some(session_id), Some(first), Some(last)) = (
                entry.get(0).and_then(serde_json::Value::as_str),
                entry.get(1).and_then(serde_json::Value::as_u64),
                entry.get(2).and_then(serde_json::Value::as_u64),
            ) else {
                continue;
            };
            notices.push(Notice::Events {
                session_id: session_id.to_owned(),
                first,
                last,
                cancelled: entry.get(3).is_some(),
            });
        }
    } else if channel == WORK_CHANNEL {
        for action_id in value
            .get("w")
            .and_then(|w| w.as_array())
            .into_iter()
            .flatten()
        {
            if let Some(action_id) = action_id.as_str() {
                notices.push(Notice::Work {
                    action_id: action_id.to_owned(),
                });
            }
        }
    }
    shared.feed.publish(&notices);
}

/// A connection that has run `LISTEN` on the feed's channels, and the task driving it.
struct Listener {
    client: tokio_postgres::Client,
    /// Notifications as they arrive; closed when the connection ends.
    notifications: tokio::sync::mpsc::UnboundedReceiver<tokio_postgres::Notification>,
}

/// How connections are secured.
#[derive(Clone)]
enum Tls {
    Plain,
    Rustls(tokio_postgres_rustls::MakeRustlsConnect),
}

/// Opens a dedicated connection and listens on the feed's channels.
async fn listen(config: &PostgresConfig, tls: &Tls) -> Result<Listener, StoreError> {
    let (sender, notifications) = tokio::sync::mpsc::unbounded_channel();
    let client = match tls {
        Tls::Plain => {
            let (client, connection) = config
                .connect(NoTls)
                .await
                .map_err(|error| pg_error("connect the change listener", error))?;
            tokio::spawn(forward_notifications(connection, sender));
            client
        }
        Tls::Rustls(tls) => {
            let (client, connection) = config
                .connect(tls.clone())
                .await
                .map_err(|error| pg_error("connect the change listener", error))?;
            tokio::spawn(forward_notifications(connection, sender));
            client
        }
    };
    client
        .batch_execute(&format!("LISTEN {EVENTS_CHANNEL}; LISTEN {WORK_CHANNEL}"))
        .await
        .map_err(|error| pg_error("listen for changes", error))?;
    Ok(Listener {
        client,
        notifications,
    })
}

/// Drives a listening connection, passing its notifications on until it ends.
async fn forward_notifications<S, T>(
    mut connection: tokio_postgres::Connection<S, T>,
    sender: tokio::sync::mpsc::UnboundedSender<tokio_postgres::Notification>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let mut messages = futures::stream::poll_fn(move |context| connection.poll_message(context));
    while let Some(Ok(message)) = futures::StreamExt::next(&mut messages).await {
        if let AsyncMessage::Notification(notification) = message
            && sender.send(notification).is_err()
        {
            return;
        }
    }
}

/// The server's clock, in Unix milliseconds.
async fn server_clock(client: &tokio_postgres::Client) -> Result<i64, tokio_postgres::Error> {
    client
        .query_one(concat!("SELECT ", clock!()), &[])
        .await?
        .try_get(0)
}

/// Forwards other stores' notifications until the store is closed or dropped; reconnects with
/// a backoff when the connection is lost, then announces every session and action written
/// since the last moment the old connection was known to work (their notifications may have
/// been missed).
async fn run_listener(
    config: PostgresConfig,
    tls: Tls,
    pool: Pool,
    shared: Weak<Shared>,
    mut stopped: watch::Receiver<bool>,
    first: Listener,
) {
    let mut listener = Some(first);
    let mut alive_since: Option<i64> = None;
    let mut backoff = Duration::from_millis(50);
    loop {
        if *stopped.borrow() {
            return;
        }
        let mut current = match listener.take() {
            Some(current) => current,
            None => match listen(&config, &tls).await {
                Ok(current) => {
                    backoff = Duration::from_millis(50);
                    if let (Some(since), Some(shared)) = (alive_since, shared.upgrade()) {
                        catch_up(&pool, &shared, since).await;
                    }
                    current
                }
                Err(_) => {
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {}
                        _ = stopped.changed() => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                    continue;
                }
            },
        };
        if let Ok(now) = server_clock(&current.client).await {
            alive_since = Some(now);
        }
        loop {
            tokio::select! {
                notification = current.notifications.recv() => {
                    let Some(notification) = notification else { break };
                    let Some(shared) = shared.upgrade() else { return };
                    forward(&shared, notification.channel(), notification.payload());
                }
                _ = tokio::time::sleep(LISTEN_PROBE) => {
                    match server_clock(&current.client).await {
                        Ok(now) => alive_since = Some(now),
                        Err(_) => break,
                    }
                }
                changed = stopped.changed() => {
                    if changed.is_err() || *stopped.borrow() {
                        return;
                    }
                }
            }
        }
    }
}

/// Announces what was written at or after `since` (server milliseconds, less a second of slack).
async fn catch_up(pool: &Pool, shared: &Shared, since: i64) {
    let Ok(client) = pool.get().await else {
        return;
    };
    let since = since - 1_000;
    if let Ok(rows) = client
        .query(
            "SELECT id, last_cursor, status = 'cancelled' FROM corral_sessions \
             WHERE updated_at >= $1 AND last_cursor > 0",
            &[&since],
        )
        .await
    {
        for row in rows {
            if let (Ok(session_id), Ok(cursor)) =
                (row.try_get::<_, String>(0), row.try_get::<_, i64>(1))
            {
                shared.feed.event_notice(EventNotice {
                    session_id,
                    cursor: u64::try_from(cursor).unwrap_or(0),
                    cancelled: row.try_get::<_, bool>(2).unwrap_or(false),
                });
            }
        }
    }
    if let Ok(rows) = client
        .query(
            "SELECT action_id FROM corral_actions WHERE status = 'pending' AND updated_at >= $1",
            &[&since],
        )
        .await
    {
        for row in rows {
            if let Ok(action_id) = row.try_get::<_, String>(0) {
                shared.feed.work_notice(WorkNotice { action_id });
            }
        }
    }
}

/// Whether a driver error means "the database is out of reach or asked us to retry".
fn is_transient(error: &tokio_postgres::Error) -> bool {
    if let Some(code) = error.code() {
        let code = code.code();
        // Connection exceptions, operator intervention (shutdown, crash recovery), too many
        // connections, serialization failures and deadlocks.
        return code.starts_with("08")
            || code.starts_with("57P")
            || code == "53300"
            || code == "40001"
            || code == "40P01";
    }
    let mut source = error.source();
    while let Some(cause) = source {
        if cause.is::<std::io::Error>() {
            return true;
        }
        source = cause.source();
    }
    error.is_closed()
}

fn pg_error(operation: &'static str, error: tokio_postgres::Error) -> StoreError {
    let source: BoxError = Box::new(error);
    let transient = source
        .downcast_ref::<tokio_postgres::Error>()
        .is_some_and(is_transient);
    if transient {
        StoreError::Unavailable { operation, source }
    } else {
        StoreError::Backend { operation, source }
    }
}

fn pool_error(operation: &'static str, error: PoolError) -> StoreError {
    match error {
        PoolError::Backend(error) => pg_error(operation, error),
        PoolError::Timeout(_) | PoolError::Closed => StoreError::Unavailable {
            operation,
            source: Box::new(error),
        },
        other => StoreError::Backend {
            operation,
            source: Box::new(other),
        },
    }
}

impl Row for tokio_postgres::Row {
    fn text(&self, index: usize) -> Result<String, StoreError> {
        self.try_get(index)
            .map_err(|error| pg_error("read a row", error))
    }

    fn opt_text(&self, index: usize) -> Result<Option<String>, StoreError> {
        self.try_get(index)
            .map_err(|error| pg_error("read a row", error))
    }

    fn int(&self, index: usize) -> Result<i64, StoreError> {
        self.try_get(index)
            .map_err(|error| pg_error("read a row", error))
    }

    fn opt_int(&self, index: usize) -> Result<Option<i64>, StoreError> {
        self.try_get(index)
            .map_err(|error| pg_error("read a row", error))
    }
}

type Params<'p> = &'p [&'p (dyn ToSql + Sync)];

/// A statement parameter owned by a deferred write.
type OwnedParam = Box<dyn ToSql + Sync + Send>;

/// Owned parameters for [`PgTx::defer`].
macro_rules! owned {
    ($($param:expr),* $(,)?) => {
        vec![$(Box::new($param) as OwnedParam),*]
    };
}

/// A write in flight, as [`in_order`] polls it.
type Write<'a> = Pin<Box<dyn Future<Output = Result<(), StoreError>> + Send + 'a>>;

/// A write whose result the engine does not need: sent with the next round trip.
enum Deferred {
    Begin,
    Statement {
        operation: &'static str,
        sql: &'static str,
        params: Vec<OwnedParam>,
    },
}

/// A pooled connection lent to one transaction. Dropped before the transaction finished (an
/// error, or a caller that stopped waiting), it queues a `ROLLBACK` ahead of anything the next
/// borrower sends, so the connection goes back to the pool idle.
struct Lent {
    object: deadpool_postgres::Object,
    finished: bool,
}

impl Drop for Lent {
    fn drop(&mut self) {
        if !self.finished {
            // The first poll puts the request on the connection's queue; the answer is not needed.
            let _ = self.object.batch_execute("ROLLBACK").now_or_never();
        }
    }
}

/// One open transaction on PostgreSQL.
///
/// Round trips dominate on loopback, so writes whose result the engine ignores are deferred and
/// pipelined with the next read or with the `COMMIT`: a durable step (lock the session, append an
/// event, replace the checkpoint, update the session) costs two round trips, `BEGIN` + lock and
/// writes + `COMMIT`. The server executes pipelined statements in the order they were sent, which
/// is the order the engine issued them.
pub(crate) struct PgTx<'c> {
    client: &'c deadpool_postgres::ClientWrapper,
    pending: Vec<Deferred>,
    now: Option<Timestamp>,
    notices: Vec<Notice>,
}

impl<'c> PgTx<'c> {
    fn new(client: &'c deadpool_postgres::ClientWrapper) -> Self {
        Self {
            client,
            pending: vec![Deferred::Begin],
            now: None,
            notices: Vec::new(),
        }
    }

    fn defer(&mut self, operation: &'static str, sql: &'static str, params: Vec<OwnedParam>) {
        self.pending.push(Deferred::Statement {
            operation,
            sql,
            params,
        });
    }

    async fn prepare(&self, operation: &'static str, sql: &str) -> Result<Statement, StoreError> {
        self.client
            .prepare_cached(sql)
            .await
            .map_err(|error| pg_error(operation, error))
    }

    /// Sends the deferred writes, then `last`, in one flight, and returns what `last` returns.
    async fn pipeline<T>(
        &mut self,
        last: impl Future<Output = Result<T, StoreError>> + Send,
    ) -> Result<T, StoreError> {
        let pending = std::mem::take(&mut self.pending);
        if pending.is_empty() {
            return last.await;
        }
        let client = self.client;
        let mut prepared = Vec::with_capacity(pending.len());
        for deferred in &pending {
            prepared.push(match deferred {
                Deferred::Begin => None,
                Deferred::Statement {
                    operation,
                    sql,
                    params,
                } => Some((
                    *operation,
                    self.prepare(operation, sql).await?,
                    params
                        .iter()
                        .map(|param| &**param as &(dyn ToSql + Sync))
                        .collect::<Vec<_>>(),
                )),
            });
        }
        let writes: Vec<Write<'_>> = prepared
            .iter()
            .map(|prepared| -> Write<'_> {
                match prepared {
                    None => Box::pin(async move {
                        client
                            .batch_execute("BEGIN")
                            .await
                            .map_err(|error| pg_error("begin a transaction", error))
                    }),
                    Some((operation, statement, params)) => Box::pin(async move {
                        client
                            .execute(statement, params)
                            .await
                            .map(drop)
                            .map_err(|error| pg_error(operation, error))
                    }),
                }
            })
            .collect();
        in_order(writes, last).await
    }

    /// Sends the remaining writes, `COMMIT` and the [`ANNOUNCE`] statement for the transaction's
    /// notices in one flight; returns the notices for the local subscribers.
    ///
    /// The announcement is sent before the `COMMIT`'s answer is known, so that a process killed
    /// after sending its `COMMIT` cannot commit without announcing; its answer is not awaited.
    /// If the `COMMIT` turns out to have rolled back (a write of the same flight failed), the
    /// other replicas get notices for events that do not exist, which costs their subscribers a
    /// read that finds nothing: notices are hints to read after a cursor, and a missed one would
    /// stall a stream where a spurious one only costs a query.
    async fn commit(mut self, origin: &str) -> Result<Vec<Notice>, StoreError> {
        if matches!(self.pending.as_slice(), [Deferred::Begin]) {
            // Nothing was sent: there is no transaction to commit.
            return Ok(Vec::new());
        }
        let notices = std::mem::take(&mut self.notices);
        let (channels, payloads): (Vec<&str>, Vec<String>) =
            notify_payloads(origin, &notices).into_iter().unzip();
        let announce = if channels.is_empty() {
            None
        } else {
            // Prepared once per connection.
            Some(self.prepare("announce a change", ANNOUNCE).await?)
        };
        let client = self.client;
        self.pipeline(async move {
            let mut commit = std::pin::pin!(client.batch_execute("COMMIT"));
            // The first poll queues the `COMMIT`; the announcement's first poll queues it behind.
            let first = futures::poll!(commit.as_mut());
            if let Some(statement) = &announce {
                let _ = client
                    .execute(statement, &[&channels, &payloads])
                    .now_or_never();
            }
            match first {
                Poll::Ready(result) => result,
                Poll::Pending => commit.await,
            }
            .map_err(|error| pg_error("commit", error))
        })
        .await?;
        Ok(notices)
    }

    async fn execute(
        &mut self,
        operation: &'static str,
        sql: &str,
        params: Params<'_>,
    ) -> Result<u64, StoreError> {
        let statement = self.prepare(operation, sql).await?;
        let client = self.client;
        self.pipeline(async move {
            client
                .execute(&statement, params)
                .await
                .map_err(|error| pg_error(operation, error))
        })
        .await
    }

    async fn query_all<T>(
        &mut self,
        operation: &'static str,
        sql: &str,
        params: Params<'_>,
        decode: impl Fn(&tokio_postgres::Row) -> Result<T, StoreError>,
    ) -> Result<Vec<T>, StoreError> {
        let statement = self.prepare(operation, sql).await?;
        let client = self.client;
        let rows = self
            .pipeline(async move {
                client
                    .query(&statement, params)
                    .await
                    .map_err(|error| pg_error(operation, error))
            })
            .await?;
        rows.iter().map(decode).collect()
    }

    async fn query_opt<T>(
        &mut self,
        operation: &'static str,
        sql: &str,
        params: Params<'_>,
        decode: impl Fn(&tokio_postgres::Row) -> Result<T, StoreError>,
    ) -> Result<Option<T>, StoreError> {
        Ok(self
            .query_all(operation, sql, params, decode)
            .await?
            .into_iter()
            .next())
    }
}

/// Polls `writes` and then `last` in order on every wake-up, so that each request is queued on
/// the connection in that order; fails with the first error, in that order.
async fn in_order<T>(
    mut writes: Vec<Write<'_>>,
    last: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    let mut last = std::pin::pin!(last);
    let mut done = vec![false; writes.len()];
    let mut output = None;
    std::future::poll_fn(|context| {
        for (write, done) in writes.iter_mut().zip(done.iter_mut()) {
            if *done {
                continue;
            }
            match write.as_mut().poll(context) {
                Poll::Ready(Ok(())) => *done = true,
                Poll::Ready(Err(error)) => return Poll::Ready(Err(error)),
                Poll::Pending => {}
            }
        }
        if output.is_none() {
            match last.as_mut().poll(context) {
                Poll::Ready(Ok(value)) => output = Some(value),
                Poll::Ready(Err(error)) => return Poll::Ready(Err(error)),
                Poll::Pending => {}
            }
        }
        if done.iter().all(|done| *done)
            && let Some(value) = output.take()
        {
            return Poll::Ready(Ok(value));
        }
        Poll::Pending
    })
    .await
}

impl Tx for PgTx<'_> {
    fn notices(&mut self) -> &mut Vec<Notice> {
        &mut self.notices
    }

    async fn ping(&mut self) -> Result<(), StoreError> {
        self.query_all("ping", "SELECT 1::bigint", &[], |row| row.int(0))
            .await?;
        Ok(())
    }

    async fn now(&mut self) -> Result<Timestamp, StoreError> {
        if let Some(now) = self.now {
            return Ok(now);
        }
        let millis = self
            .query_opt("read the clock", concat!("SELECT ", clock!()), &[], |row| {
                row.int(0)
            })
            .await?
            .ok_or_else(|| {
                StoreError::corrupt(Entity::Session, "", "the clock query returned no row")
            })?;
        let now = Timestamp::from_unix_millis(millis);
        self.now = Some(now);
        Ok(now)
    }

    async fn session(&mut self, id: &str, lock: bool) -> Result<Option<Session>, StoreError> {
        if !lock {
            return self
                .query_opt(
                    "read a session",
                    concat!(
                        "SELECT ",
                        session_columns!(),
                        " FROM corral_sessions WHERE id = $1"
                    ),
                    &[&id],
                    engine::decode_session,
                )
                .await;
        }
        // The clock is read after the lock is granted, so a lease check made under the lock
        // never uses a time from before a wait on it.
        let locked = self
            .query_opt(
                "lock a session",
                concat!(
                    "SELECT ",
                    session_columns!(),
                    ", ",
                    clock!(),
                    " FROM corral_sessions WHERE id = $1 FOR UPDATE"
                ),
                &[&id],
                |row| Ok((engine::decode_session(row)?, row.int(20)?)),
            )
            .await?;
        Ok(locked.map(|(session, millis)| {
            if self.now.is_none() {
                self.now = Some(Timestamp::from_unix_millis(millis));
            }
            session
        }))
    }

    async fn insert_session(&mut self, s: &Session) -> Result<bool, StoreError> {
        let (owner, lease) = owner_columns(s);
        let inserted = self
            .execute(
                "insert a session",
                concat!(
                    "INSERT INTO corral_sessions (",
                    session_columns!(),
                    ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, \
                     $15, $16, $17, $18, $19, $20) ON CONFLICT (id) DO NOTHING"
                ),
                &[
                    &s.id,
                    &s.tenant_id,
                    &s.owner_user_id,
                    &s.agent_id,
                    &s.manifest.to_string(),
                    &s.manifest_hash,
                    &s.implementation_version,
                    &s.creation.to_string(),
                    &s.status.as_str(),
                    &s.active_turn_id,
                    &s.state.to_string(),
                    &counter(s.version)?,
                    &counter(s.last_cursor)?,
                    &counter(s.last_item_seq)?,
                    &owner,
                    &lease,
                    &counter(s.generation)?,
                    &s.created_at.as_unix_millis(),
                    &s.updated_at.as_unix_millis(),
                    &s.closed_at.map(Timestamp::as_unix_millis),
                ],
            )
            .await?;
        Ok(inserted == 1)
    }

    async fn update_session(&mut self, s: &Session) -> Result<(), StoreError> {
        let (owner, lease) = owner_columns(s);
        self.defer(
            "update a session",
            "UPDATE corral_sessions SET status = $2, active_turn_id = $3, state = $4, \
             version = $5, last_cursor = $6, last_item_seq = $7, owner_replica = $8, \
             lease_expires_at = $9, generation = $10, updated_at = $11, closed_at = $12 \
             WHERE id = $1",
            owned![
                s.id.clone(),
                s.status.as_str(),
                s.active_turn_id.clone(),
                s.state.to_string(),
                counter(s.version)?,
                counter(s.last_cursor)?,
                counter(s.last_item_seq)?,
                owner.map(str::to_owned),
                lease,
                counter(s.generation)?,
                s.updated_at.as_unix_millis(),
                s.closed_at.map(Timestamp::as_unix_millis),
            ],
        );
        Ok(())
    }

    async fn list_sessions(&mut self, filter: &SessionFilter) -> Result<Vec<Session>, StoreError> {
        let sessions = self
            .query_all(
                "list sessions",
                concat!(
                    "SELECT ",
                    session_columns!(),
                    " FROM corral_sessions WHERE ($1::text IS NULL OR tenant_id = $1) \
                     AND ($2::text IS NULL OR agent_id = $2) ORDER BY id"
                ),
                &[&filter.tenant_id, &filter.agent_id],
                engine::decode_session,
            )
            .await?;
        Ok(sessions
            .into_iter()
            .filter(|s| filter.statuses.is_empty() || filter.statuses.contains(&s.status))
            .filter(|s| {
                filter
                    .owner_user_id
                    .as_ref()
                    .is_none_or(|o| *o == s.owner_user_id)
            })
            .collect())
    }

    async fn status_counts(
        &mut self,
        filter: &SessionFilter,
    ) -> Result<Vec<(String, i64)>, StoreError> {
        self.query_all(
            "count sessions",
            "SELECT status, COUNT(*) FROM corral_sessions WHERE ($1::text IS NULL OR tenant_id = $1) \
             AND ($2::text IS NULL OR agent_id = $2) AND ($3::text IS NULL OR owner_user_id = $3) \
             GROUP BY status ORDER BY status",
            &[&filter.tenant_id, &filter.agent_id, &filter.owner_user_id],
            |row| Ok((row.text(0)?, row.int(1)?)),
        )
        .await
    }

    async fn next_claimable_session(
        &mut self,
        now: Timestamp,
    ) -> Result<Option<Session>, StoreError> {
        self.query_opt(
            "find a runnable session",
            concat!(
                "SELECT ",
                session_columns!(),
                " FROM corral_sessions WHERE status IN ('runnable', 'running') \
                 AND (owner_replica IS NULL OR lease_expires_at <= $1) \
                 ORDER BY updated_at, id LIMIT 1 FOR UPDATE SKIP LOCKED"
            ),
            &[&now.as_unix_millis()],
            engine::decode_session,
        )
        .await
    }

    async fn upsert_agent(
        &mut self,
        agent: &NewAgent,
        now: Timestamp,
    ) -> Result<AgentDefinition, StoreError> {
        let stored = self
            .query_opt(
                "put an agent",
                concat!(
                    "INSERT INTO corral_agents (",
                    agent_columns!(),
                    ") VALUES ($1, $2, $3, $4, $5, $5, $6, $7) \
                 ON CONFLICT (agent_id) DO UPDATE SET owner_tenant = excluded.owner_tenant, \
                 shared_with = excluded.shared_with, \
                     manifest = excluded.manifest, manifest_hash = excluded.manifest_hash, \
                 implementation_version = excluded.implementation_version, \
                 updated_at = excluded.updated_at RETURNING ",
                    agent_columns!()
                ),
                &[
                    &agent.agent_id,
                    &agent.manifest.to_string(),
                    &agent.manifest_hash,
                    &agent.implementation_version,
                    &now.as_unix_millis(),
                    &agent.owner_tenant,
                    &serde_json::to_string(&agent.shared_with).unwrap_or_else(|_| "[]".to_owned()),
                ],
                engine::decode_agent,
            )
            .await?;
        stored.ok_or_else(|| {
            StoreError::corrupt(
                crate::Entity::Agent,
                &agent.agent_id,
                "the upsert returned no row",
            )
        })
    }

    async fn agent(&mut self, id: &str) -> Result<Option<AgentDefinition>, StoreError> {
        self.query_opt(
            "read an agent",
            concat!(
                "SELECT ",
                agent_columns!(),
                " FROM corral_agents WHERE agent_id = $1"
            ),
            &[&id],
            engine::decode_agent,
        )
        .await
    }

    async fn list_agents(&mut self) -> Result<Vec<AgentDefinition>, StoreError> {
        self.query_all(
            "list agents",
            concat!(
                "SELECT ",
                agent_columns!(),
                " FROM corral_agents ORDER BY agent_id"
            ),
            &[],
            engine::decode_agent,
        )
        .await
    }

    async fn insert_event(&mut self, e: &Event) -> Result<(), StoreError> {
        self.defer(
            "append an event",
            concat!(
                "INSERT INTO corral_events (",
                event_columns!(),
                ") VALUES ($1, $2, $3, $4, $5, $6)"
            ),
            owned![
                e.session_id.clone(),
                counter(e.cursor)?,
                e.turn_id.clone(),
                e.event_type.clone(),
                e.payload.to_string(),
                e.created_at.as_unix_millis()
            ],
        );
        Ok(())
    }

    async fn events_after(
        &mut self,
        session_id: &str,
        after: i64,
        limit: i64,
    ) -> Result<Vec<Event>, StoreError> {
        self.query_all(
            "list events",
            concat!(
                "SELECT ",
                event_columns!(),
                " FROM corral_events WHERE session_id = $1 AND cursor > $2 \
                 ORDER BY cursor LIMIT $3"
            ),
            &[&session_id, &after, &limit],
            engine::decode_event,
        )
        .await
    }

    async fn insert_item(&mut self, i: &Item) -> Result<(), StoreError> {
        self.defer(
            "append an item",
            concat!(
                "INSERT INTO corral_items (",
                item_columns!(),
                ") VALUES ($1, $2, $3, $4, $5)"
            ),
            owned![
                i.session_id.clone(),
                counter(i.seq)?,
                i.turn_id.clone(),
                i.body.to_string(),
                i.created_at.as_unix_millis()
            ],
        );
        Ok(())
    }

    async fn items_after(
        &mut self,
        session_id: &str,
        after: i64,
        limit: i64,
    ) -> Result<Vec<Item>, StoreError> {
        self.query_all(
            "page items",
            concat!(
                "SELECT ",
                item_columns!(),
                " FROM corral_items WHERE session_id = $1 AND seq > $2 ORDER BY seq LIMIT $3"
            ),
            &[&session_id, &after, &limit],
            engine::decode_item,
        )
        .await
    }

    async fn live_checkpoint(
        &mut self,
        session_id: &str,
    ) -> Result<Option<Checkpoint>, StoreError> {
        self.query_opt(
            "read the live checkpoint",
            concat!(
                "SELECT ",
                checkpoint_columns!(),
                " FROM corral_checkpoints WHERE session_id = $1 AND superseded_at IS NULL"
            ),
            &[&session_id],
            engine::decode_checkpoint,
        )
        .await
    }

    async fn supersede_checkpoints(
        &mut self,
        session_id: &str,
        keep: Option<(&str, i64)>,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        match keep {
            Some((turn_id, segment)) => self.defer(
                "supersede checkpoints",
                "UPDATE corral_checkpoints SET superseded_at = $2 WHERE session_id = $1 \
                 AND superseded_at IS NULL AND NOT (turn_id = $3 AND segment = $4)",
                owned![
                    session_id.to_owned(),
                    now.as_unix_millis(),
                    turn_id.to_owned(),
                    segment
                ],
            ),
            None => self.defer(
                "supersede checkpoints",
                "UPDATE corral_checkpoints SET superseded_at = $2 WHERE session_id = $1 \
                 AND superseded_at IS NULL",
                owned![session_id.to_owned(), now.as_unix_millis()],
            ),
        };
        Ok(())
    }

    async fn upsert_checkpoint(
        &mut self,
        session_id: &str,
        checkpoint: &NewCheckpoint,
        segment: i64,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        self.defer(
            "write a checkpoint",
            "INSERT INTO corral_checkpoints (session_id, turn_id, segment, data, created_at, \
             updated_at, superseded_at) VALUES ($1, $2, $3, $4, $5, $5, NULL) \
             ON CONFLICT (session_id, turn_id, segment) DO UPDATE SET data = excluded.data, \
             updated_at = excluded.updated_at, superseded_at = NULL",
            owned![
                session_id.to_owned(),
                checkpoint.turn_id.clone(),
                segment,
                checkpoint.data.to_string(),
                now.as_unix_millis()
            ],
        );
        Ok(())
    }

    async fn effect(&mut self, id: &str) -> Result<Option<Effect>, StoreError> {
        self.query_opt(
            "read an effect",
            concat!(
                "SELECT ",
                effect_columns!(),
                " FROM corral_effects WHERE effect_id = $1"
            ),
            &[&id],
            engine::decode_effect,
        )
        .await
    }

    async fn insert_effect(&mut self, e: &Effect) -> Result<(), StoreError> {
        self.defer(
            "journal an effect",
            concat!(
                "INSERT INTO corral_effects (",
                effect_columns!(),
                ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)"
            ),
            owned![
                e.effect_id.clone(),
                e.session_id.clone(),
                e.turn_id.clone(),
                e.kind.as_str(),
                e.status.as_str(),
                e.request.to_string(),
                e.result.as_ref().map(ToString::to_string),
                e.error.clone(),
                e.created_at.as_unix_millis(),
                e.updated_at.as_unix_millis()
            ],
        );
        Ok(())
    }

    async fn update_effect(&mut self, e: &Effect) -> Result<(), StoreError> {
        self.defer(
            "update an effect",
            "UPDATE corral_effects SET status = $2, result = $3, error = $4, updated_at = $5 \
             WHERE effect_id = $1",
            owned![
                e.effect_id.clone(),
                e.status.as_str(),
                e.result.as_ref().map(ToString::to_string),
                e.error.clone(),
                e.updated_at.as_unix_millis()
            ],
        );
        Ok(())
    }

    async fn session_effects(
        &mut self,
        session_id: &str,
        status: Option<EffectStatus>,
    ) -> Result<Vec<Effect>, StoreError> {
        self.query_all(
            "list effects",
            concat!(
                "SELECT ",
                effect_columns!(),
                " FROM corral_effects WHERE session_id = $1 AND ($2::text IS NULL OR status = $2) \
                 ORDER BY created_at, effect_id"
            ),
            &[&session_id, &status.map(EffectStatus::as_str)],
            engine::decode_effect,
        )
        .await
    }

    async fn action(&mut self, id: &str) -> Result<Option<Action>, StoreError> {
        self.query_opt(
            "read an action",
            concat!(
                "SELECT ",
                action_columns!(),
                " FROM corral_actions WHERE action_id = $1"
            ),
            &[&id],
            engine::decode_action,
        )
        .await
    }

    async fn insert_action(&mut self, a: &Action) -> Result<(), StoreError> {
        self.defer(
            "create an action",
            concat!(
                "INSERT INTO corral_actions (",
                action_columns!(),
                ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)"
            ),
            owned![
                a.action_id.clone(),
                a.session_id.clone(),
                a.turn_id.clone(),
                a.agent_id.clone(),
                a.manifest_hash.clone(),
                a.implementation_version.clone(),
                a.capability_id.clone(),
                a.request.to_string(),
                a.status.as_str(),
                counter(a.generation)?,
                a.claim_id.clone(),
                a.lease_expires_at.map(Timestamp::as_unix_millis),
                a.result.as_ref().map(ToString::to_string),
                a.created_at.as_unix_millis(),
                a.updated_at.as_unix_millis()
            ],
        );
        Ok(())
    }

    async fn update_action(&mut self, a: &Action) -> Result<(), StoreError> {
        self.defer(
            "update an action",
            "UPDATE corral_actions SET status = $2, generation = $3, claim_id = $4, \
             lease_expires_at = $5, result = $6, updated_at = $7 WHERE action_id = $1",
            owned![
                a.action_id.clone(),
                a.status.as_str(),
                counter(a.generation)?,
                a.claim_id.clone(),
                a.lease_expires_at.map(Timestamp::as_unix_millis),
                a.result.as_ref().map(ToString::to_string),
                a.updated_at.as_unix_millis()
            ],
        );
        Ok(())
    }

    async fn list_actions(&mut self, filter: &ActionFilter) -> Result<Vec<Action>, StoreError> {
        let scope = filter.scope.as_ref();
        let actions = self
            .query_all(
                "list actions",
                concat!(
                    "SELECT ",
                    action_columns!(),
                    " FROM corral_actions WHERE ($1::text IS NULL OR session_id = $1) \
                     AND ($2::text IS NULL OR agent_id = $2) \
                 AND ($3::text IS NULL OR manifest_hash = $3) \
                 AND ($4::text IS NULL OR implementation_version = $4) \
                 ORDER BY created_at, action_id"
                ),
                &[
                    &filter.session_id,
                    &scope.map(|s| s.agent_id.as_str()),
                    &scope.map(|s| s.manifest_hash.as_str()),
                    &scope.map(|s| s.implementation_version.as_str()),
                ],
                engine::decode_action,
            )
            .await?;
        Ok(actions
            .into_iter()
            .filter(|a| filter.statuses.is_empty() || filter.statuses.contains(&a.status))
            .collect())
    }

    async fn sessions_page(
        &mut self,
        filter: &SessionFilter,
        after: &str,
        limit: i64,
    ) -> Result<Vec<Session>, StoreError> {
        let statuses = engine::status_list(&filter.statuses, SessionStatus::as_str);
        self.query_all(
            "page sessions",
            concat!(
                "SELECT ",
                session_columns!(),
                " FROM corral_sessions WHERE id > $1 AND ($2::text IS NULL OR tenant_id = $2) \
                 AND ($3::text IS NULL OR agent_id = $3) \
                 AND ($4 = '' OR status = ANY(string_to_array($4, ','))) \
                 AND ($6::text IS NULL OR owner_user_id = $6) ORDER BY id LIMIT $5"
            ),
            &[
                &after,
                &filter.tenant_id,
                &filter.agent_id,
                &statuses,
                &limit,
                &filter.owner_user_id,
            ],
            engine::decode_session,
        )
        .await
    }

    async fn session_counts(&mut self, statuses: &str) -> Result<Vec<SessionCount>, StoreError> {
        self.query_all(
            "count sessions",
            "SELECT tenant_id, agent_id, status, count(*) FROM corral_sessions \
             WHERE status = ANY(string_to_array($1, ',')) \
             GROUP BY tenant_id, agent_id, status ORDER BY tenant_id, agent_id, status",
            &[&statuses],
            engine::decode_session_count,
        )
        .await
    }

    async fn expired_claims(&mut self, now: Timestamp) -> Result<Vec<Action>, StoreError> {
        self.query_all(
            "find expired claims",
            concat!(
                "SELECT ",
                action_columns!(),
                " FROM corral_actions WHERE status = 'claimed' AND lease_expires_at <= $1 \
                 ORDER BY session_id, action_id LIMIT $2"
            ),
            &[&now.as_unix_millis(), &engine::BATCH],
            engine::decode_action,
        )
        .await
    }

    async fn command(
        &mut self,
        session_id: &str,
        key: &str,
    ) -> Result<Option<CommandRecord>, StoreError> {
        self.query_opt(
            "read a command",
            concat!(
                "SELECT ",
                command_columns!(),
                " FROM corral_commands WHERE session_id = $1 AND idempotency_key = $2"
            ),
            &[&session_id, &key],
            engine::decode_command,
        )
        .await
    }

    async fn insert_command(&mut self, c: &CommandRecord) -> Result<(), StoreError> {
        self.defer(
            "record a command",
            concat!(
                "INSERT INTO corral_commands (",
                command_columns!(),
                ") VALUES ($1, $2, $3, $4, $5, $6)"
            ),
            owned![
                c.session_id.clone(),
                c.idempotency_key.clone(),
                c.command.to_string(),
                c.response.to_string(),
                counter(c.cursor)?,
                c.created_at.as_unix_millis()
            ],
        );
        Ok(())
    }

    async fn closed_sessions(
        &mut self,
        tenant_id: Option<&str>,
        cutoff: Timestamp,
    ) -> Result<Vec<(String, String)>, StoreError> {
        self.query_all(
            "find expired sessions",
            "SELECT id, tenant_id FROM corral_sessions WHERE status = 'closed' \
             AND closed_at <= $2 AND ($1::text IS NULL OR tenant_id = $1) ORDER BY id LIMIT $3",
            &[&tenant_id, &cutoff.as_unix_millis(), &engine::BATCH],
            |row| Ok((row.text(0)?, row.text(1)?)),
        )
        .await
    }

    async fn settled_sessions(
        &mut self,
        tenant_id: Option<&str>,
        cutoff: Timestamp,
    ) -> Result<Vec<(String, String)>, StoreError> {
        self.query_all(
            "find settled sessions",
            "SELECT id, tenant_id FROM corral_sessions \
             WHERE status IN ('idle', 'completed', 'failed', 'cancelled') \
             AND updated_at <= $2 AND ($1::text IS NULL OR tenant_id = $1) ORDER BY id LIMIT $3",
            &[&tenant_id, &cutoff.as_unix_millis(), &engine::BATCH],
            |row| Ok((row.text(0)?, row.text(1)?)),
        )
        .await
    }

    async fn prune_history(
        &mut self,
        session_id: &str,
        cutoff: Timestamp,
    ) -> Result<(u64, u64), StoreError> {
        let events = self
            .execute(
                "prune events",
                "DELETE FROM corral_events WHERE session_id = $1 AND created_at <= $2",
                &[&session_id, &cutoff.as_unix_millis()],
            )
            .await?;
        let items = self
            .execute(
                "prune items",
                "DELETE FROM corral_items WHERE session_id = $1 AND created_at <= $2",
                &[&session_id, &cutoff.as_unix_millis()],
            )
            .await?;
        Ok((events, items))
    }

    async fn delete_session(&mut self, id: &str) -> Result<(), StoreError> {
        self.defer(
            "delete a session",
            "DELETE FROM corral_sessions WHERE id = $1",
            owned![id.to_owned()],
        );
        Ok(())
    }

    async fn prune_checkpoints(&mut self, cutoff: Timestamp) -> Result<u64, StoreError> {
        let pruned = self
            .execute(
                "prune checkpoints",
                "DELETE FROM corral_checkpoints WHERE superseded_at IS NOT NULL \
                 AND superseded_at <= $1",
                &[&cutoff.as_unix_millis()],
            )
            .await?;
        Ok(pruned)
    }

    async fn prune_commands(&mut self, cutoff: Timestamp) -> Result<u64, StoreError> {
        let pruned = self
            .execute(
                "prune idempotency records",
                "DELETE FROM corral_commands WHERE created_at <= $1",
                &[&cutoff.as_unix_millis()],
            )
            .await?;
        Ok(pruned)
    }
}

impl Backend for PostgresStore {
    type Tx<'c> = PgTx<'c>;

    const KIND: StoreBackend = StoreBackend::Postgres;

    fn feed(&self) -> &Feed {
        &self.shared.feed
    }

    async fn transact<R, F>(
        &self,
        operation: &'static str,
        _write: bool,
        work: F,
    ) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: for<'a, 'c> FnOnce(&'a mut PgTx<'c>) -> BoxFuture<'a, Result<R, StoreError>>
            + Send
            + 'static,
    {
        let object = self
            .pool
            .get()
            .await
            .map_err(|error| pool_error(operation, error))?;
        let mut lent = Lent {
            object,
            finished: false,
        };
        let (output, notices) = {
            let mut open = PgTx::new(&lent.object);
            let output = work(&mut open).await?;
            let notices = open.commit(&self.shared.origin).await?;
            (output, notices)
        };
        lent.finished = true;
        self.shared.feed.publish(&notices);
        Ok(output)
    }
}
