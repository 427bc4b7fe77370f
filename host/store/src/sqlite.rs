//! The embedded store: one SQLite file in WAL mode, owned by one process at a time.

use std::ffi::OsString;
use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, mpsc};
use std::time::Duration;

use futures::future::BoxFuture;
use rusqlite::{Connection, ErrorCode, ToSql, TransactionBehavior, params};

use crate::backend::Backend;
use crate::engine::{
    self, Row, Tx, action_columns, agent_columns, checkpoint_columns, command_columns, counter,
    effect_columns, event_columns, item_columns, owner_columns, session_columns,
};
use crate::error::{OpenStoreError, StoreError};
use crate::feed::{Feed, Notice};
use crate::migrations::{self, Migration};
use crate::model::{
    Action, ActionFilter, AgentDefinition, Checkpoint, CommandRecord, Effect, EffectStatus, Event,
    Item, NewAgent, NewCheckpoint, Session, SessionCount, SessionFilter, SessionStatus,
    StoreBackend, Timestamp,
};

/// When SQLite waits for the disk before acknowledging a commit.
///
/// In WAL mode both settings keep the database consistent whatever happens, and both keep every
/// acknowledged commit when the *process* dies (killed, crashed, out of memory): the commit is in
/// the WAL file, in the operating system's cache. They differ only when the *machine* loses power
/// or the kernel crashes: with [`Synchronous::Normal`] the last commits before the outage may be
/// rolled back, with [`Synchronous::Full`] they survive, at the cost of one `fsync` per commit
/// (0.2 to 4 ms on the virtual disks measured here, against about 60 microseconds for a whole
/// durable step with [`Synchronous::Normal`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Synchronous {
    /// Sync the WAL at checkpoints only (the default: `corral serve` promises that a killed
    /// process loses no acknowledged command or event, which this keeps).
    #[default]
    Normal,
    /// Sync the WAL at every commit.
    Full,
}

impl Synchronous {
    fn pragma(self) -> &'static str {
        match self {
            Synchronous::Normal => "NORMAL",
            Synchronous::Full => "FULL",
        }
    }
}

/// Settings of the embedded store.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SqliteOptions {
    /// When a commit is acknowledged; see [`Synchronous`].
    pub synchronous: Synchronous,
}

impl SqliteOptions {
    /// These options with `synchronous`.
    pub fn synchronous(mut self, synchronous: Synchronous) -> Self {
        self.synchronous = synchronous;
        self
    }
}

/// The embedded store: a single SQLite file, no server to run.
///
/// One process owns the file at a time: opening takes an exclusive `flock` on `<file>.lock`,
/// which the kernel releases when the owner exits in any way, so a dead owner's lock never
/// needs cleaning up. Every operation runs on the blocking thread pool over one connection.
#[derive(Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

struct Inner {
    connection: Mutex<Connection>,
    feed: Feed,
    path: PathBuf,
    // Dropping it stops the checkpointer thread.
    _checkpointer: mpsc::Sender<()>,
    // Held for the store's lifetime: dropping the file releases the ownership lock.
    _lock: File,
}

/// How often the background connection copies the WAL into the database file.
const CHECKPOINT_INTERVAL: Duration = Duration::from_millis(200);

/// WAL pages after which a commit checkpoints by itself: only reached if the background
/// checkpointer falls far behind.
const AUTOCHECKPOINT_PAGES: i64 = 20_000;

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.inner.path)
            .finish_non_exhaustive()
    }
}

impl SqliteStore {
    /// Opens (creating it if needed) the store file at `path` with default options.
    ///
    /// Blocks on file I/O and on migrations; call it at start-up or from a blocking task.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, OpenStoreError> {
        Self::open_with(path, SqliteOptions::default())
    }

    /// Opens the store file at `path`: takes the ownership lock, enables WAL and applies the
    /// migrations this build has that the file lacks.
    pub fn open_with(
        path: impl AsRef<Path>,
        options: SqliteOptions,
    ) -> Result<Self, OpenStoreError> {
        let path = path.as_ref().to_path_buf();
        if let Some(parent) = path
            .parent()
            .filter(|parent| !parent.as_os_str().is_empty())
        {
            std::fs::create_dir_all(parent).map_err(|source| OpenStoreError::Io {
                action: "create the folder of",
                path: path.clone(),
                source,
            })?;
        }
        let lock = take_ownership(&path)?;
        let sqlite = |action| {
            let path = path.clone();
            move |source| OpenStoreError::Sqlite {
                action,
                path,
                source,
            }
        };
        let mut connection = Connection::open(&path).map_err(sqlite("open"))?;
        let journal: String = connection
            .query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))
            .map_err(sqlite("enable WAL on"))?;
        if !journal.eq_ignore_ascii_case("wal") {
            return Err(OpenStoreError::Backend {
                action: "enable WAL",
                source: format!(
                    "SQLite kept journal mode {journal:?} for {}",
                    path.display()
                )
                .into(),
            });
        }
        connection
            .pragma_update(None, "synchronous", options.synchronous.pragma())
            .map_err(sqlite("configure"))?;
        connection
            .pragma_update(None, "foreign_keys", "ON")
            .map_err(sqlite("configure"))?;
        // Only tools reading the file while corral runs can hold SQLite's own locks.
        connection
            .busy_timeout(Duration::from_secs(5))
            .map_err(sqlite("configure"))?;
        connection
            .pragma_update(None, "wal_autocheckpoint", AUTOCHECKPOINT_PAGES)
            .map_err(sqlite("configure"))?;
        migrate(&mut connection, &path)?;
        let checkpointer = spawn_checkpointer(&path)?;
        Ok(Self {
            inner: Arc::new(Inner {
                connection: Mutex::new(connection),
                feed: Feed::default(),
                path,
                _checkpointer: checkpointer,
                _lock: lock,
            }),
        })
    }

    /// The store file.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }
}

/// Takes the exclusive ownership lock next to the store file and records our pid in it.
fn take_ownership(path: &Path) -> Result<File, OpenStoreError> {
    let mut lock_path = OsString::from(path.as_os_str());
    lock_path.push(".lock");
    let lock_path = PathBuf::from(lock_path);
    let io = |action| {
        let lock_path = lock_path.clone();
        move |source| OpenStoreError::Io {
            action,
            path: lock_path,
            source,
        }
    };
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&lock_path)
        .map_err(io("open the lock file"))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => {
            let holder_pid = std::fs::read_to_string(&lock_path)
                .ok()
                .and_then(|text| text.trim().parse().ok());
            return Err(OpenStoreError::AlreadyInUse {
                path: path.to_path_buf(),
                holder_pid,
            });
        }
        Err(TryLockError::Error(source)) => return Err(io("lock")(source)),
    }
    // A lock file left by a dead owner still holds its pid: replace it.
    file.set_len(0).map_err(io("write the lock file"))?;
    file.seek(SeekFrom::Start(0))
        .map_err(io("write the lock file"))?;
    writeln!(file, "{}", std::process::id()).map_err(io("write the lock file"))?;
    Ok(file)
}

/// Checkpoints the WAL from a second connection on its own thread, so that the fsyncs of a
/// checkpoint are not paid inside a commit (they were the p99 of a durable step). The thread
/// stops when the returned sender is dropped.
fn spawn_checkpointer(path: &Path) -> Result<mpsc::Sender<()>, OpenStoreError> {
    let connection = Connection::open(path).map_err(|source| OpenStoreError::Sqlite {
        action: "open the checkpointer of",
        path: path.to_path_buf(),
        source,
    })?;
    let (stop, stopped) = mpsc::channel::<()>();
    std::thread::Builder::new()
        .name("corral-sqlite-checkpointer".to_owned())
        .spawn(move || {
            while let Err(mpsc::RecvTimeoutError::Timeout) =
                stopped.recv_timeout(CHECKPOINT_INTERVAL)
            {
                // A failed passive checkpoint is retried at the next tick; commits fall back to
                // checkpointing themselves past AUTOCHECKPOINT_PAGES.
                let _ = connection.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()));
            }
        })
        .map_err(|source| OpenStoreError::Io {
            action: "start the checkpointer thread of",
            path: path.to_path_buf(),
            source,
        })?;
    Ok(stop)
}

fn migrate(connection: &mut Connection, path: &Path) -> Result<(), OpenStoreError> {
    let sqlite = |action| {
        move |source| OpenStoreError::Sqlite {
            action,
            path: path.to_path_buf(),
            source,
        }
    };
    let tx = connection
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(sqlite("migrate"))?;
    tx.execute_batch(
        "CREATE TABLE IF NOT EXISTS corral_schema_migrations (
             version    INTEGER NOT NULL PRIMARY KEY,
             name       TEXT    NOT NULL,
             applied_at INTEGER NOT NULL
         )",
    )
    .map_err(sqlite("migrate"))?;
    let found: Option<i64> = tx
        .query_row(
            "SELECT MAX(version) FROM corral_schema_migrations",
            [],
            |row| row.get(0),
        )
        .map_err(sqlite("migrate"))?;
    let found = found.unwrap_or(0);
    let supported = migrations::latest(migrations::SQLITE);
    if found > i64::from(supported) {
        return Err(OpenStoreError::SchemaTooNew {
            found: u32::try_from(found).unwrap_or(u32::MAX),
            supported,
        });
    }
    let pending = migrations::SQLITE
        .iter()
        .filter(|migration| i64::from(migration.version) > found);
    for Migration { version, name, sql } in pending {
        let failed = |source: rusqlite::Error| OpenStoreError::Migration {
            version: *version,
            name,
            source: Box::new(source),
        };
        tx.execute_batch(sql).map_err(failed)?;
        tx.execute(
            "INSERT INTO corral_schema_migrations (version, name, applied_at) VALUES (?1, ?2, ?3)",
            params![version, name, Timestamp::now().as_unix_millis()],
        )
        .map_err(failed)?;
    }
    tx.commit().map_err(sqlite("migrate"))
}

/// Errors SQLite reports when it cannot get at the file (retryable), versus everything else.
fn sqlite_error(operation: &'static str, error: rusqlite::Error) -> StoreError {
    let unavailable = matches!(
        error.sqlite_error_code(),
        Some(
            ErrorCode::DatabaseBusy
                | ErrorCode::DatabaseLocked
                | ErrorCode::SystemIoFailure
                | ErrorCode::DiskFull
                | ErrorCode::CannotOpen
        )
    );
    if unavailable {
        StoreError::Unavailable {
            operation,
            source: Box::new(error),
        }
    } else {
        StoreError::Backend {
            operation,
            source: Box::new(error),
        }
    }
}

impl Row for rusqlite::Row<'_> {
    fn text(&self, index: usize) -> Result<String, StoreError> {
        self.get(index)
            .map_err(|error| sqlite_error("read a row", error))
    }

    fn opt_text(&self, index: usize) -> Result<Option<String>, StoreError> {
        self.get(index)
            .map_err(|error| sqlite_error("read a row", error))
    }

    fn int(&self, index: usize) -> Result<i64, StoreError> {
        self.get(index)
            .map_err(|error| sqlite_error("read a row", error))
    }

    fn opt_int(&self, index: usize) -> Result<Option<i64>, StoreError> {
        self.get(index)
            .map_err(|error| sqlite_error("read a row", error))
    }
}

/// One open transaction on the embedded store.
pub(crate) struct SqliteTx<'c> {
    connection: &'c mut Connection,
    now: Option<Timestamp>,
    notices: Vec<Notice>,
}

impl SqliteTx<'_> {
    fn execute(
        &self,
        operation: &'static str,
        sql: &str,
        params: &[&dyn ToSql],
    ) -> Result<usize, StoreError> {
        let mut statement = self
            .connection
            .prepare_cached(sql)
            .map_err(|error| sqlite_error(operation, error))?;
        statement
            .execute(params)
            .map_err(|error| sqlite_error(operation, error))
    }

    fn query_all<T>(
        &self,
        operation: &'static str,
        sql: &str,
        params: &[&dyn ToSql],
        decode: impl Fn(&rusqlite::Row<'_>) -> Result<T, StoreError>,
    ) -> Result<Vec<T>, StoreError> {
        let mut statement = self
            .connection
            .prepare_cached(sql)
            .map_err(|error| sqlite_error(operation, error))?;
        let mut rows = statement
            .query(params)
            .map_err(|error| sqlite_error(operation, error))?;
        let mut decoded = Vec::new();
        while let Some(row) = rows
            .next()
            .map_err(|error| sqlite_error(operation, error))?
        {
            decoded.push(decode(row)?);
        }
        Ok(decoded)
    }

    fn query_opt<T>(
        &self,
        operation: &'static str,
        sql: &str,
        params: &[&dyn ToSql],
        decode: impl Fn(&rusqlite::Row<'_>) -> Result<T, StoreError>,
    ) -> Result<Option<T>, StoreError> {
        Ok(self
            .query_all(operation, sql, params, decode)?
            .into_iter()
            .next())
    }
}

impl Tx for SqliteTx<'_> {
    fn notices(&mut self) -> &mut Vec<Notice> {
        &mut self.notices
    }

    async fn ping(&mut self) -> Result<(), StoreError> {
        self.query_all("ping", "SELECT 1", params![], |row| row.int(0))?;
        Ok(())
    }

    async fn now(&mut self) -> Result<Timestamp, StoreError> {
        Ok(*self.now.get_or_insert_with(Timestamp::now))
    }

    async fn session(&mut self, id: &str, _lock: bool) -> Result<Option<Session>, StoreError> {
        // The whole database is locked by the write transaction: no row lock needed.
        self.query_opt(
            "read a session",
            concat!(
                "SELECT ",
                session_columns!(),
                " FROM corral_sessions WHERE id = ?1"
            ),
            params![id],
            |row| engine::decode_session(row),
        )
    }

    async fn insert_session(&mut self, s: &Session) -> Result<bool, StoreError> {
        let (owner, lease) = owner_columns(s);
        let inserted = self.execute(
            "insert a session",
            concat!(
                "INSERT INTO corral_sessions (",
                session_columns!(),
                ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, \
                 ?15, ?16, ?17, ?18, ?19, ?20) ON CONFLICT (id) DO NOTHING"
            ),
            params![
                s.id,
                s.tenant_id,
                s.owner_user_id,
                s.agent_id,
                s.manifest.to_string(),
                s.manifest_hash,
                s.implementation_version,
                s.creation.to_string(),
                s.status.as_str(),
                s.active_turn_id,
                s.state.to_string(),
                counter(s.version)?,
                counter(s.last_cursor)?,
                counter(s.last_item_seq)?,
                owner,
                lease,
                counter(s.generation)?,
                s.created_at.as_unix_millis(),
                s.updated_at.as_unix_millis(),
                s.closed_at.map(Timestamp::as_unix_millis),
            ],
        )?;
        Ok(inserted == 1)
    }

    async fn update_session(&mut self, s: &Session) -> Result<(), StoreError> {
        let (owner, lease) = owner_columns(s);
        self.execute(
            "update a session",
            "UPDATE corral_sessions SET status = ?2, active_turn_id = ?3, state = ?4, \
             version = ?5, last_cursor = ?6, last_item_seq = ?7, owner_replica = ?8, \
             lease_expires_at = ?9, generation = ?10, updated_at = ?11, closed_at = ?12 \
             WHERE id = ?1",
            params![
                s.id,
                s.status.as_str(),
                s.active_turn_id,
                s.state.to_string(),
                counter(s.version)?,
                counter(s.last_cursor)?,
                counter(s.last_item_seq)?,
                owner,
                lease,
                counter(s.generation)?,
                s.updated_at.as_unix_millis(),
                s.closed_at.map(Timestamp::as_unix_millis),
            ],
        )?;
        Ok(())
    }

    async fn list_sessions(&mut self, filter: &SessionFilter) -> Result<Vec<Session>, StoreError> {
        let sessions = self.query_all(
            "list sessions",
            concat!(
                "SELECT ",
                session_columns!(),
                " FROM corral_sessions WHERE (?1 IS NULL OR tenant_id = ?1) \
                 AND (?2 IS NULL OR agent_id = ?2) ORDER BY id"
            ),
            params![filter.tenant_id, filter.agent_id],
            |row| engine::decode_session(row),
        )?;
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
            "SELECT status, COUNT(*) FROM corral_sessions WHERE (?1 IS NULL OR tenant_id = ?1) \
             AND (?2 IS NULL OR agent_id = ?2) AND (?3 IS NULL OR owner_user_id = ?3) \
             GROUP BY status ORDER BY status",
            params![filter.tenant_id, filter.agent_id, filter.owner_user_id],
            |row| Ok((row.text(0)?, row.int(1)?)),
        )
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
                 AND (owner_replica IS NULL OR lease_expires_at <= ?1) \
                 ORDER BY updated_at, id LIMIT 1"
            ),
            params![now.as_unix_millis()],
            |row| engine::decode_session(row),
        )
    }

    async fn upsert_agent(
        &mut self,
        agent: &NewAgent,
        now: Timestamp,
    ) -> Result<AgentDefinition, StoreError> {
        let stored = self.query_opt(
            "put an agent",
            concat!(
                "INSERT INTO corral_agents (",
                agent_columns!(),
                ") VALUES (?1, ?2, ?3, ?4, ?5, ?5, ?6, ?7) \
                 ON CONFLICT (agent_id) DO UPDATE SET owner_tenant = excluded.owner_tenant, \
                 shared_with = excluded.shared_with, \
                 manifest = excluded.manifest, manifest_hash = excluded.manifest_hash, \
                 implementation_version = excluded.implementation_version, \
                 updated_at = excluded.updated_at RETURNING ",
                agent_columns!()
            ),
            params![
                agent.agent_id,
                agent.manifest.to_string(),
                agent.manifest_hash,
                agent.implementation_version,
                now.as_unix_millis(),
                agent.owner_tenant,
                serde_json::to_string(&agent.shared_with).unwrap_or_else(|_| "[]".to_owned()),
            ],
            |row| engine::decode_agent(row),
        )?;
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
                " FROM corral_agents WHERE agent_id = ?1"
            ),
            params![id],
            |row| engine::decode_agent(row),
        )
    }

    async fn list_agents(&mut self) -> Result<Vec<AgentDefinition>, StoreError> {
        self.query_all(
            "list agents",
            concat!(
                "SELECT ",
                agent_columns!(),
                " FROM corral_agents ORDER BY agent_id"
            ),
            params![],
            |row| engine::decode_agent(row),
        )
    }

    async fn insert_event(&mut self, e: &Event) -> Result<(), StoreError> {
        self.execute(
            "append an event",
            concat!(
                "INSERT INTO corral_events (",
                event_columns!(),
                ") VALUES (?1, ?2, ?3, ?4, ?5, ?6)"
            ),
            params![
                e.session_id,
                counter(e.cursor)?,
                e.turn_id,
                e.event_type,
                e.payload.to_string(),
                e.created_at.as_unix_millis(),
            ],
        )?;
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
                " FROM corral_events WHERE session_id = ?1 AND cursor > ?2 \
                 ORDER BY cursor LIMIT ?3"
            ),
            params![session_id, after, limit],
            |row| engine::decode_event(row),
        )
    }

    async fn insert_item(&mut self, i: &Item) -> Result<(), StoreError> {
        self.execute(
            "append an item",
            concat!(
                "INSERT INTO corral_items (",
                item_columns!(),
                ") VALUES (?1, ?2, ?3, ?4, ?5)"
            ),
            params![
                i.session_id,
                counter(i.seq)?,
                i.turn_id,
                i.body.to_string(),
                i.created_at.as_unix_millis(),
            ],
        )?;
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
                " FROM corral_items WHERE session_id = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3"
            ),
            params![session_id, after, limit],
            |row| engine::decode_item(row),
        )
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
                " FROM corral_checkpoints WHERE session_id = ?1 AND superseded_at IS NULL"
            ),
            params![session_id],
            |row| engine::decode_checkpoint(row),
        )
    }

    async fn supersede_checkpoints(
        &mut self,
        session_id: &str,
        keep: Option<(&str, i64)>,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        match keep {
            Some((turn_id, segment)) => self.execute(
                "supersede checkpoints",
                "UPDATE corral_checkpoints SET superseded_at = ?2 WHERE session_id = ?1 \
                 AND superseded_at IS NULL AND NOT (turn_id = ?3 AND segment = ?4)",
                params![session_id, now.as_unix_millis(), turn_id, segment],
            ),
            None => self.execute(
                "supersede checkpoints",
                "UPDATE corral_checkpoints SET superseded_at = ?2 WHERE session_id = ?1 \
                 AND superseded_at IS NULL",
                params![session_id, now.as_unix_millis()],
            ),
        }?;
        Ok(())
    }

    async fn upsert_checkpoint(
        &mut self,
        session_id: &str,
        checkpoint: &NewCheckpoint,
        segment: i64,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        self.execute(
            "write a checkpoint",
            "INSERT INTO corral_checkpoints (session_id, turn_id, segment, data, created_at, \
             updated_at, superseded_at) VALUES (?1, ?2, ?3, ?4, ?5, ?5, NULL) \
             ON CONFLICT (session_id, turn_id, segment) DO UPDATE SET data = excluded.data, \
             updated_at = excluded.updated_at, superseded_at = NULL",
            params![
                session_id,
                checkpoint.turn_id,
                segment,
                checkpoint.data.to_string(),
                now.as_unix_millis(),
            ],
        )?;
        Ok(())
    }

    async fn effect(&mut self, id: &str) -> Result<Option<Effect>, StoreError> {
        self.query_opt(
            "read an effect",
            concat!(
                "SELECT ",
                effect_columns!(),
                " FROM corral_effects WHERE effect_id = ?1"
            ),
            params![id],
            |row| engine::decode_effect(row),
        )
    }

    async fn insert_effect(&mut self, e: &Effect) -> Result<(), StoreError> {
        self.execute(
            "journal an effect",
            concat!(
                "INSERT INTO corral_effects (",
                effect_columns!(),
                ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)"
            ),
            params![
                e.effect_id,
                e.session_id,
                e.turn_id,
                e.kind.as_str(),
                e.status.as_str(),
                e.request.to_string(),
                e.result.as_ref().map(ToString::to_string),
                e.error,
                e.created_at.as_unix_millis(),
                e.updated_at.as_unix_millis(),
            ],
        )?;
        Ok(())
    }

    async fn update_effect(&mut self, e: &Effect) -> Result<(), StoreError> {
        self.execute(
            "update an effect",
            "UPDATE corral_effects SET status = ?2, result = ?3, error = ?4, updated_at = ?5 \
             WHERE effect_id = ?1",
            params![
                e.effect_id,
                e.status.as_str(),
                e.result.as_ref().map(ToString::to_string),
                e.error,
                e.updated_at.as_unix_millis(),
            ],
        )?;
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
                " FROM corral_effects WHERE session_id = ?1 AND (?2 IS NULL OR status = ?2) \
                 ORDER BY created_at, effect_id"
            ),
            params![session_id, status.map(EffectStatus::as_str)],
            |row| engine::decode_effect(row),
        )
    }

    async fn action(&mut self, id: &str) -> Result<Option<Action>, StoreError> {
        self.query_opt(
            "read an action",
            concat!(
                "SELECT ",
                action_columns!(),
                " FROM corral_actions WHERE action_id = ?1"
            ),
            params![id],
            |row| engine::decode_action(row),
        )
    }

    async fn insert_action(&mut self, a: &Action) -> Result<(), StoreError> {
        self.execute(
            "create an action",
            concat!(
                "INSERT INTO corral_actions (",
                action_columns!(),
                ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)"
            ),
            params![
                a.action_id,
                a.session_id,
                a.turn_id,
                a.agent_id,
                a.manifest_hash,
                a.implementation_version,
                a.capability_id,
                a.request.to_string(),
                a.status.as_str(),
                counter(a.generation)?,
                a.claim_id,
                a.lease_expires_at.map(Timestamp::as_unix_millis),
                a.result.as_ref().map(ToString::to_string),
                a.created_at.as_unix_millis(),
                a.updated_at.as_unix_millis(),
            ],
        )?;
        Ok(())
    }

    async fn update_action(&mut self, a: &Action) -> Result<(), StoreError> {
        self.execute(
            "update an action",
            "UPDATE corral_actions SET status = ?2, generation = ?3, claim_id = ?4, \
             lease_expires_at = ?5, result = ?6, updated_at = ?7 WHERE action_id = ?1",
            params![
                a.action_id,
                a.status.as_str(),
                counter(a.generation)?,
                a.claim_id,
                a.lease_expires_at.map(Timestamp::as_unix_millis),
                a.result.as_ref().map(ToString::to_string),
                a.updated_at.as_unix_millis(),
            ],
        )?;
        Ok(())
    }

    async fn list_actions(&mut self, filter: &ActionFilter) -> Result<Vec<Action>, StoreError> {
        let scope = filter.scope.as_ref();
        let actions = self.query_all(
            "list actions",
            concat!(
                "SELECT ",
                action_columns!(),
                " FROM corral_actions WHERE (?1 IS NULL OR session_id = ?1) \
                 AND (?2 IS NULL OR agent_id = ?2) AND (?3 IS NULL OR manifest_hash = ?3) \
                 AND (?4 IS NULL OR implementation_version = ?4) \
                 ORDER BY created_at, action_id"
            ),
            params![
                filter.session_id,
                scope.map(|s| s.agent_id.as_str()),
                scope.map(|s| s.manifest_hash.as_str()),
                scope.map(|s| s.implementation_version.as_str()),
            ],
            |row| engine::decode_action(row),
        )?;
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
                " FROM corral_sessions WHERE id > ?1 AND (?2 IS NULL OR tenant_id = ?2) \
                 AND (?3 IS NULL OR agent_id = ?3) \
                 AND (?4 = '' OR instr(',' || ?4 || ',', ',' || status || ',') > 0) \
                 AND (?6 IS NULL OR owner_user_id = ?6) ORDER BY id LIMIT ?5"
            ),
            params![
                after,
                filter.tenant_id,
                filter.agent_id,
                statuses,
                limit,
                filter.owner_user_id
            ],
            |row| engine::decode_session(row),
        )
    }

    async fn session_counts(&mut self, statuses: &str) -> Result<Vec<SessionCount>, StoreError> {
        self.query_all(
            "count sessions",
            "SELECT tenant_id, agent_id, status, count(*) FROM corral_sessions \
             WHERE instr(',' || ?1 || ',', ',' || status || ',') > 0 \
             GROUP BY tenant_id, agent_id, status ORDER BY tenant_id, agent_id, status",
            params![statuses],
            |row| engine::decode_session_count(row),
        )
    }

    async fn expired_claims(&mut self, now: Timestamp) -> Result<Vec<Action>, StoreError> {
        self.query_all(
            "find expired claims",
            concat!(
                "SELECT ",
                action_columns!(),
                " FROM corral_actions WHERE status = 'claimed' AND lease_expires_at <= ?1 \
                 ORDER BY session_id, action_id LIMIT ?2"
            ),
            params![now.as_unix_millis(), engine::BATCH],
            |row| engine::decode_action(row),
        )
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
                " FROM corral_commands WHERE session_id = ?1 AND idempotency_key = ?2"
            ),
            params![session_id, key],
            |row| engine::decode_command(row),
        )
    }

    async fn insert_command(&mut self, c: &CommandRecord) -> Result<(), StoreError> {
        self.execute(
            "record a command",
            concat!(
                "INSERT INTO corral_commands (",
                command_columns!(),
                ") VALUES (?1, ?2, ?3, ?4, ?5, ?6)"
            ),
            params![
                c.session_id,
                c.idempotency_key,
                c.command.to_string(),
                c.response.to_string(),
                counter(c.cursor)?,
                c.created_at.as_unix_millis(),
            ],
        )?;
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
             AND closed_at <= ?2 AND (?1 IS NULL OR tenant_id = ?1) ORDER BY id LIMIT ?3",
            params![tenant_id, cutoff.as_unix_millis(), engine::BATCH],
            |row| Ok((row.text(0)?, row.text(1)?)),
        )
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
             AND updated_at <= ?2 AND (?1 IS NULL OR tenant_id = ?1) ORDER BY id LIMIT ?3",
            params![tenant_id, cutoff.as_unix_millis(), engine::BATCH],
            |row| Ok((row.text(0)?, row.text(1)?)),
        )
    }

    async fn prune_history(
        &mut self,
        session_id: &str,
        cutoff: Timestamp,
    ) -> Result<(u64, u64), StoreError> {
        let events = self.execute(
            "prune events",
            "DELETE FROM corral_events WHERE session_id = ?1 AND created_at <= ?2",
            params![session_id, cutoff.as_unix_millis()],
        )?;
        let items = self.execute(
            "prune items",
            "DELETE FROM corral_items WHERE session_id = ?1 AND created_at <= ?2",
            params![session_id, cutoff.as_unix_millis()],
        )?;
        Ok((events as u64, items as u64))
    }

    async fn delete_session(&mut self, id: &str) -> Result<(), StoreError> {
        self.execute(
            "delete a session",
            "DELETE FROM corral_sessions WHERE id = ?1",
            params![id],
        )?;
        Ok(())
    }

    async fn prune_checkpoints(&mut self, cutoff: Timestamp) -> Result<u64, StoreError> {
        let pruned = self.execute(
            "prune checkpoints",
            "DELETE FROM corral_checkpoints WHERE superseded_at IS NOT NULL \
             AND superseded_at <= ?1",
            params![cutoff.as_unix_millis()],
        )?;
        Ok(pruned as u64)
    }

    async fn prune_commands(&mut self, cutoff: Timestamp) -> Result<u64, StoreError> {
        let pruned = self.execute(
            "prune idempotency records",
            "DELETE FROM corral_commands WHERE created_at <= ?1",
            params![cutoff.as_unix_millis()],
        )?;
        Ok(pruned as u64)
    }
}

impl Backend for SqliteStore {
    type Tx<'c> = SqliteTx<'c>;

    const KIND: StoreBackend = StoreBackend::Sqlite;

    fn feed(&self) -> &Feed {
        &self.inner.feed
    }

    /// Runs `work` on the blocking thread pool over the store's one connection (the engine's
    /// futures never wait on anything but SQLite, so they are driven to completion in place).
    async fn transact<R, F>(
        &self,
        operation: &'static str,
        write: bool,
        work: F,
    ) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: for<'a, 'c> FnOnce(&'a mut SqliteTx<'c>) -> BoxFuture<'a, Result<R, StoreError>>
            + Send
            + 'static,
    {
        let inner = Arc::clone(&self.inner);
        let task = tokio::task::spawn_blocking(move || {
            let mut connection = inner
                .connection
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let failed = |error| sqlite_error(operation, error);
            if !connection.is_autocommit() {
                // A panic unwound out of a transaction and left it open: undo it.
                connection.execute_batch("ROLLBACK").map_err(failed)?;
            }
            connection
                .execute_batch(if write {
                    "BEGIN IMMEDIATE"
                } else {
                    "BEGIN DEFERRED"
                })
                .map_err(failed)?;
            let mut tx = SqliteTx {
                connection: &mut connection,
                now: None,
                notices: Vec::new(),
            };
            let output = futures::executor::block_on(work(&mut tx));
            let notices = std::mem::take(&mut tx.notices);
            let output = match output {
                Ok(output) => output,
                Err(error) => {
                    // Some errors end the transaction by themselves; the first error is the one
                    // to report either way.
                    if !connection.is_autocommit() {
                        let _ = connection.execute_batch("ROLLBACK");
                    }
                    return Err(error);
                }
            };
            if let Err(error) = connection.execute_batch("COMMIT") {
                if !connection.is_autocommit() {
                    let _ = connection.execute_batch("ROLLBACK");
                }
                return Err(failed(error));
            }
            inner.feed.publish(&notices);
            Ok(output)
        });
        task.await.map_err(|error| StoreError::Backend {
            operation,
            source: Box::new(error),
        })?
    }
}
