//! PostgreSQL: several replicas share one database; leases with fencing keep them apart.

use std::error::Error as _;
use std::future::Future;
use std::pin::Pin;
use std::str::FromStr;
use std::task::Poll;
use std::time::Duration;

use async_trait::async_trait;
use deadpool_postgres::{Manager, ManagerConfig, Pool, PoolError, RecyclingMethod, Runtime};
use futures::FutureExt as _;
use tokio_postgres::types::ToSql;
use tokio_postgres::{NoTls, Statement};

use crate::engine::{
    self, Row, Tx, action_columns, agent_columns, checkpoint_columns, command_columns, counter,
    effect_columns, event_columns, item_columns, owner_columns, session_columns,
};
use crate::error::{BoxError, Entity, OpenStoreError, StoreError};
use crate::migrations;
use crate::model::{
    Action, ActionFilter, AgentDefinition, BeginEffect, BeginEffectOutcome, Checkpoint,
    ClaimAction, ClaimedAction, CommandRecord, CommitOutcome, CreatedSession, Effect, EffectStatus,
    Event, Fence, HeartbeatAction, Item, ItemPage, Lease, NewAgent, NewCheckpoint, NewEvent,
    NewSession, RetentionPolicy, RetentionReport, Session, SessionCommit, SessionFilter,
    StoreBackend, Timestamp,
};
use crate::store::Store;

/// The connection settings of `tokio-postgres` (host, port, user, database, timeouts...).
pub use tokio_postgres::Config as PostgresConfig;

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
        }
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
        let manager = Manager::from_config(options.config, NoTls, manager_config);
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
        Ok(Self { pool })
    }

    /// Closes the pool: later operations fail as [`StoreError::Unavailable`].
    pub fn close(&self) {
        self.pool.close();
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
struct PgTx<'c> {
    client: &'c deadpool_postgres::ClientWrapper,
    pending: Vec<Deferred>,
    now: Option<Timestamp>,
}

impl<'c> PgTx<'c> {
    fn new(client: &'c deadpool_postgres::ClientWrapper) -> Self {
        Self {
            client,
            pending: vec![Deferred::Begin],
            now: None,
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

    /// Sends the remaining writes and `COMMIT` in one flight.
    async fn commit(mut self) -> Result<(), StoreError> {
        if matches!(self.pending.as_slice(), [Deferred::Begin]) {
            // Nothing was sent: there is no transaction to commit.
            return Ok(());
        }
        let client = self.client;
        self.pipeline(async move {
            client
                .batch_execute("COMMIT")
                .await
                .map_err(|error| pg_error("commit", error))
        })
        .await
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
            .collect())
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
                    ") VALUES ($1, $2, $3, $4, $5, $5) ON CONFLICT (agent_id) DO UPDATE SET \
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

    async fn expired_claims(&mut self, now: Timestamp) -> Result<Vec<Action>, StoreError> {
        self.query_all(
            "find expired claims",
            concat!(
                "SELECT ",
                action_columns!(),
                " FROM corral_actions WHERE status = 'claimed' AND lease_expires_at <= $1 \
                 ORDER BY session_id, action_id"
            ),
            &[&now.as_unix_millis()],
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
             AND closed_at <= $2 AND ($1::text IS NULL OR tenant_id = $1) ORDER BY id",
            &[&tenant_id, &cutoff.as_unix_millis()],
            |row| Ok((row.text(0)?, row.text(1)?)),
        )
        .await
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

/// Runs one engine transaction on a pooled connection: `pg_tx!(self, "op", |tx| future)`.
macro_rules! pg_tx {
    ($store:expr, $operation:literal, |$tx:ident| $body:expr) => {{
        let operation: &'static str = $operation;
        let object = $store
            .pool
            .get()
            .await
            .map_err(|error| pool_error(operation, error))?;
        let mut lent = Lent {
            object,
            finished: false,
        };
        let output = {
            let mut open = PgTx::new(&lent.object);
            let output = {
                let $tx = &mut open;
                $body.await?
            };
            open.commit().await?;
            output
        };
        lent.finished = true;
        Ok(output)
    }};
}

#[async_trait]
impl Store for PostgresStore {
    fn backend(&self) -> StoreBackend {
        StoreBackend::Postgres
    }

    async fn ping(&self) -> Result<(), StoreError> {
        pg_tx!(self, "ping", |tx| engine::ping(tx))
    }

    async fn put_agent(&self, agent: NewAgent) -> Result<AgentDefinition, StoreError> {
        pg_tx!(self, "put_agent", |tx| engine::put_agent(tx, agent))
    }

    async fn get_agent(&self, agent_id: &str) -> Result<AgentDefinition, StoreError> {
        pg_tx!(self, "get_agent", |tx| engine::get_agent(tx, agent_id))
    }

    async fn list_agents(&self) -> Result<Vec<AgentDefinition>, StoreError> {
        pg_tx!(self, "list_agents", |tx| engine::list_agents(tx))
    }

    async fn create_session(&self, session: NewSession) -> Result<CreatedSession, StoreError> {
        pg_tx!(self, "create_session", |tx| engine::create_session(
            tx, session
        ))
    }

    async fn get_session(&self, session_id: &str) -> Result<Session, StoreError> {
        pg_tx!(self, "get_session", |tx| engine::get_session(
            tx, session_id
        ))
    }

    async fn list_sessions(&self, filter: &SessionFilter) -> Result<Vec<Session>, StoreError> {
        pg_tx!(self, "list_sessions", |tx| engine::list_sessions(
            tx, filter
        ))
    }

    async fn commit(&self, commit: SessionCommit) -> Result<CommitOutcome, StoreError> {
        pg_tx!(self, "commit", |tx| engine::commit(tx, commit))
    }

    async fn append_event(
        &self,
        session_id: &str,
        fence: Option<&Fence>,
        event: NewEvent,
    ) -> Result<Event, StoreError> {
        pg_tx!(self, "append_event", |tx| engine::append_event(
            tx,
            session_id,
            fence.cloned(),
            event
        ))
    }

    async fn list_events(
        &self,
        session_id: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<Event>, StoreError> {
        pg_tx!(self, "list_events", |tx| engine::list_events(
            tx, session_id, after, limit
        ))
    }

    async fn page_items(
        &self,
        session_id: &str,
        after: u64,
        limit: usize,
    ) -> Result<ItemPage, StoreError> {
        pg_tx!(self, "page_items", |tx| engine::page_items(
            tx, session_id, after, limit
        ))
    }

    async fn live_checkpoint(&self, session_id: &str) -> Result<Option<Checkpoint>, StoreError> {
        pg_tx!(self, "live_checkpoint", |tx| engine::live_checkpoint(
            tx, session_id
        ))
    }

    async fn get_command(
        &self,
        session_id: &str,
        idempotency_key: &str,
    ) -> Result<Option<CommandRecord>, StoreError> {
        pg_tx!(self, "get_command", |tx| engine::get_command(
            tx,
            session_id,
            idempotency_key
        ))
    }

    async fn begin_effect(&self, begin: BeginEffect) -> Result<BeginEffectOutcome, StoreError> {
        pg_tx!(self, "begin_effect", |tx| engine::begin_effect(tx, begin))
    }

    async fn get_effect(&self, effect_id: &str) -> Result<Effect, StoreError> {
        pg_tx!(self, "get_effect", |tx| engine::get_effect(tx, effect_id))
    }

    async fn list_effects(
        &self,
        session_id: &str,
        status: Option<EffectStatus>,
    ) -> Result<Vec<Effect>, StoreError> {
        pg_tx!(self, "list_effects", |tx| engine::list_effects(
            tx, session_id, status
        ))
    }

    async fn mark_in_flight_effects_uncertain(
        &self,
        fence: &Fence,
        reason: &str,
    ) -> Result<Vec<Effect>, StoreError> {
        pg_tx!(self, "mark_in_flight_effects_uncertain", |tx| {
            engine::mark_in_flight_effects_uncertain(tx, fence.clone(), reason)
        })
    }

    async fn get_action(&self, action_id: &str) -> Result<Action, StoreError> {
        pg_tx!(self, "get_action", |tx| engine::get_action(tx, action_id))
    }

    async fn list_actions(&self, filter: &ActionFilter) -> Result<Vec<Action>, StoreError> {
        pg_tx!(self, "list_actions", |tx| engine::list_actions(tx, filter))
    }

    async fn claim_action(&self, claim: ClaimAction) -> Result<ClaimedAction, StoreError> {
        pg_tx!(self, "claim_action", |tx| engine::claim_action(tx, claim))
    }

    async fn heartbeat_action(&self, heartbeat: HeartbeatAction) -> Result<Action, StoreError> {
        pg_tx!(self, "heartbeat_action", |tx| engine::heartbeat_action(
            tx, heartbeat
        ))
    }

    async fn expire_action_claims(&self) -> Result<Vec<Action>, StoreError> {
        pg_tx!(self, "expire_action_claims", |tx| {
            engine::expire_action_claims(tx)
        })
    }

    async fn claim_runnable_session(
        &self,
        replica_id: &str,
        lease: Duration,
    ) -> Result<Option<Lease>, StoreError> {
        pg_tx!(self, "claim_runnable_session", |tx| {
            engine::claim_runnable_session(tx, replica_id, lease)
        })
    }

    async fn acquire_session(
        &self,
        session_id: &str,
        replica_id: &str,
        lease: Duration,
    ) -> Result<Lease, StoreError> {
        pg_tx!(self, "acquire_session", |tx| engine::acquire_session(
            tx, session_id, replica_id, lease
        ))
    }

    async fn renew_lease(&self, fence: &Fence, lease: Duration) -> Result<Lease, StoreError> {
        pg_tx!(self, "renew_lease", |tx| engine::renew_lease(
            tx,
            fence.clone(),
            lease
        ))
    }

    async fn release_lease(&self, fence: &Fence) -> Result<(), StoreError> {
        pg_tx!(self, "release_lease", |tx| engine::release_lease(
            tx,
            fence.clone()
        ))
    }

    async fn apply_retention(
        &self,
        policy: &RetentionPolicy,
    ) -> Result<RetentionReport, StoreError> {
        pg_tx!(self, "apply_retention", |tx| engine::apply_retention(
            tx, policy
        ))
    }
}
