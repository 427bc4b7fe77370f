//! PostgreSQL: several replicas share one database; leases with fencing keep them apart.

use std::error::Error as _;
use std::str::FromStr;
use std::sync::{Arc, Weak};
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, PoolError, RecyclingMethod, Runtime};
use futures::FutureExt as _;
use futures::future::BoxFuture;
use tokio::sync::watch;
use tokio_postgres::types::ToSql;
use tokio_postgres::{AsyncMessage, NoTls, Statement};

use crate::backend::Backend;
use crate::error::{BoxError, Entity, OpenStoreError, StoreError};
use crate::feed::{EventNotice, Feed, Notice, WorkNotice};
use crate::migrations;
use crate::model::{Session, StoreBackend, Timestamp};
use crate::sql::{self, Param, Row, Sql, args, claimable, claimable_count, session_columns};
use crate::tx::{Fetched, Found, Query, Reads, Tx};

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

/// A parameter as the driver takes it.
fn pg_param<'p>(param: &'p Param<'_>) -> &'p (dyn ToSql + Sync) {
    match param {
        Param::Int(value) => value,
        Param::Text(text) => text,
    }
}

/// A statement whose result the engine does not need: sent with the next flight.
struct Deferred {
    operation: &'static str,
    sql: &'static str,
    params: Vec<Param<'static>>,
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

/// Locks a session and reads the server's clock once the lock is granted.
const LOCK_SESSION: &str = concat!(
    "SELECT ",
    session_columns!(),
    ", ",
    clock!(),
    " FROM corral_sessions WHERE id = $1 FOR UPDATE"
);

/// Claims the oldest claimable session by the server's clock, skipping those other replicas
/// hold, and reads that clock and whether another session is claimable (one that another
/// replica is claiming at that moment counts).
const CLAIM_SESSION: &str = concat!(
    "SELECT ",
    session_columns!(),
    ", ",
    clock!(),
    ", ",
    claimable_count!(clock!()),
    claimable!(clock!()),
    " FOR UPDATE SKIP LOCKED"
);

/// One open transaction on PostgreSQL.
///
/// Round trips dominate on loopback, so statements whose result the engine ignores (`BEGIN`,
/// writes) are deferred and sent with the next read or with the `COMMIT`, and the reads a step
/// makes together ([`Reads`]) are sent together. Each flight is one pipeline with one `Sync`
/// ([`tokio_postgres::Client::pipeline`], added to the vendored driver): the server runs its
/// statements in order and answers them in one flush, where the driver's own `execute` and
/// `query` would end each statement with a `Sync` and make the server flush once per statement.
/// A durable step (lock the session and read what the step guards, append events, replace the
/// checkpoint, update the session) is two flights: `BEGIN` + lock + reads, then the writes +
/// `COMMIT` + the announcement. The first error makes the server skip the rest of its flight;
/// the transaction is then rolled back when the connection goes back to the pool ([`Lent`]).
pub(crate) struct PgTx<'c> {
    client: &'c deadpool_postgres::ClientWrapper,
    pending: Vec<Deferred>,
    /// Whether a flight was sent, so there is a transaction to commit.
    sent: bool,
    now: Option<Timestamp>,
    notices: Vec<Notice>,
}

/// A statement of a flight: what it does (for errors), its text and its parameters.
type Flight<'p> = (&'static str, &'static str, Vec<&'p (dyn ToSql + Sync)>);

impl<'c> PgTx<'c> {
    fn new(client: &'c deadpool_postgres::ClientWrapper) -> Self {
        Self {
            client,
            pending: vec![Deferred {
                operation: "begin a transaction",
                sql: "BEGIN",
                params: Vec::new(),
            }],
            sent: false,
            now: None,
            notices: Vec::new(),
        }
    }

    /// Sends the deferred statements, then `statements`, in one pipeline; returns what
    /// `statements` returned, or the first error with the index (among all the statements sent)
    /// of the one that failed.
    async fn flight(
        &mut self,
        statements: Vec<Flight<'_>>,
    ) -> Result<Vec<tokio_postgres::Pipelined>, (usize, StoreError)> {
        let pending = std::mem::take(&mut self.pending);
        let deferred = pending.len();
        let all: Vec<Flight<'_>> = pending
            .iter()
            .map(|d| (d.operation, d.sql, d.params.iter().map(pg_param).collect()))
            .chain(statements)
            .collect();
        let mut prepared = Vec::with_capacity(all.len());
        for (index, (operation, sql, _)) in all.iter().enumerate() {
            let statement = self
                .client
                .prepare_cached(sql)
                .await
                .map_err(|error| (index, pg_error(operation, error)))?;
            prepared.push(statement);
        }
        let items: Vec<(&Statement, &[&(dyn ToSql + Sync)])> = prepared
            .iter()
            .zip(&all)
            .map(|(statement, (_, _, params))| (statement, params.as_slice()))
            .collect();
        self.sent = true;
        let mut results = self.client.pipeline(&items).await.map_err(|failed| {
            // An index past the last statement: the flight's closing answer.
            let operation = all
                .get(failed.index)
                .or(all.last())
                .map_or("send a flight", |(operation, ..)| *operation);
            (failed.index, pg_error(operation, failed.error))
        })?;
        Ok(results.split_off(deferred))
    }

    /// Sends the remaining writes, `COMMIT` and the [`ANNOUNCE`] statement for the transaction's
    /// notices in one flight; returns the notices for the local subscribers.
    ///
    /// The announcement travels in the `COMMIT`'s flight, so a process killed after sending its
    /// `COMMIT` cannot commit without announcing. It runs after the `COMMIT`, in a transaction of
    /// its own, and only if the `COMMIT` succeeded. Its own failure does not undo the commit, so
    /// it is not the transaction's: a notice is a hint to read after a cursor.
    async fn commit(mut self, origin: &str) -> Result<Vec<Notice>, StoreError> {
        if !self.sent && self.pending.len() == 1 {
            // Only the `BEGIN` is pending: there is no transaction to commit.
            return Ok(Vec::new());
        }
        let notices = std::mem::take(&mut self.notices);
        let (channels, payloads): (Vec<&str>, Vec<String>) =
            notify_payloads(origin, &notices).into_iter().unzip();
        let mut statements: Vec<Flight<'_>> = vec![("commit", "COMMIT", Vec::new())];
        if !channels.is_empty() {
            statements.push(("announce a change", ANNOUNCE, vec![&channels, &payloads]));
        }
        let commit = self.pending.len();
        match self.flight(statements).await {
            Ok(_) => Ok(notices),
            // Committed; only the announcement failed (its queue is full, say).
            Err((index, _)) if index > commit => Ok(notices),
            Err((_, error)) => Err(error),
        }
    }
}

impl Tx for PgTx<'_> {
    fn notices(&mut self) -> &mut Vec<Notice> {
        &mut self.notices
    }

    async fn now(&mut self) -> Result<Timestamp, StoreError> {
        if let Some(now) = self.now {
            return Ok(now);
        }
        let clock = Query {
            operation: "read the clock",
            sql: Sql::postgres_only(concat!("SELECT ", clock!())),
            params: args![],
            decode: |row| Ok(Timestamp::from_unix_millis(row.int(0)?)),
        };
        let now = self.query(vec![clock]).await?.into_iter().flatten().next();
        let now = now.ok_or_else(|| {
            StoreError::corrupt(Entity::Session, "", "the clock query returned no row")
        })?;
        self.now = Some(now);
        Ok(now)
    }

    async fn execute(
        &mut self,
        operation: &'static str,
        sql: Sql,
        params: Vec<Param<'_>>,
    ) -> Result<u64, StoreError> {
        let params = params.iter().map(pg_param).collect();
        let results = self
            .flight(vec![(operation, sql.postgres, params)])
            .await
            .map_err(|(_, error)| error)?;
        Ok(results.first().map_or(0, |result| result.affected))
    }

    fn write(
        &mut self,
        operation: &'static str,
        sql: Sql,
        params: Vec<Param<'_>>,
    ) -> Result<(), StoreError> {
        self.pending.push(Deferred {
            operation,
            sql: sql.postgres,
            params: params.into_iter().map(Param::into_owned).collect(),
        });
        Ok(())
    }

    async fn query<T: Send>(
        &mut self,
        queries: Vec<Query<'_, T>>,
    ) -> Result<Vec<Vec<T>>, StoreError> {
        let statements = queries
            .iter()
            .map(|query| {
                let params = query.params.iter().map(pg_param).collect();
                (query.operation, query.sql.postgres, params)
            })
            .collect();
        let results = self.flight(statements).await.map_err(|(_, error)| error)?;
        queries
            .iter()
            .zip(results)
            .map(|(query, result)| result.rows.iter().map(|row| (query.decode)(row)).collect())
            .collect()
    }

    async fn read(&mut self, reads: &Reads<'_>) -> Result<Found, StoreError> {
        // The clock is read after the lock is granted, so a lease check made under the lock
        // never uses a time from before a wait on it.
        let mut queries = Vec::new();
        if reads.lock {
            queries.push(Query {
                operation: "lock a session",
                sql: Sql::postgres_only(LOCK_SESSION),
                params: args![reads.session_id],
                decode: |row| {
                    let clock = Timestamp::from_unix_millis(row.int(20)?);
                    let session = Box::new(sql::decode_session(row)?);
                    Ok(Fetched::Session(session, Some(clock)))
                },
            });
        }
        queries.extend(reads.queries());
        let found = Found::new(reads, self.query(queries).await?);
        if self.now.is_none() {
            self.now = found.clock;
        }
        Ok(found)
    }

    async fn next_claimable_session(&mut self) -> Result<Option<(Session, bool)>, StoreError> {
        let claim = Query {
            operation: "find a runnable session",
            sql: Sql::postgres_only(CLAIM_SESSION),
            params: args![],
            decode: |row| {
                let clock = Timestamp::from_unix_millis(row.int(20)?);
                Ok((
                    sql::decode_session(row)?,
                    clock,
                    sql::others_claimable(row, 21)?,
                ))
            },
        };
        let claimed = self.query(vec![claim]).await?.into_iter().flatten().next();
        Ok(claimed.map(|(session, clock, others)| {
            self.now.get_or_insert(clock);
            (session, others)
        }))
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
