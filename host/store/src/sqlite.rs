//! The embedded store: one SQLite file in WAL mode, owned by one process at a time.

use std::ffi::OsString;
use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Seek, SeekFrom, Write};
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, mpsc};
use std::time::Duration;

use futures::future::BoxFuture;
use rusqlite::config::DbConfig;
use rusqlite::types::{ToSqlOutput, ValueRef};
use rusqlite::{Connection, ErrorCode, ToSql, TransactionBehavior, params, params_from_iter};

use crate::backend::Backend;
use crate::error::{OpenStoreError, StoreError};
use crate::feed::{Feed, Notice};
use crate::migrations::{self, Migration};
use crate::model::{Session, StoreBackend, Timestamp};
use crate::sql::{self, Param, Row, Sql};
use crate::tx::{Query, Tx, session_update};

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
/// needs cleaning up. Every operation runs over one connection: on the caller's task when the
/// connection is free, else on the blocking thread pool.
#[derive(Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

struct Inner {
    connection: Mutex<Connection>,
    /// Whether a transaction may run on the calling task when the connection is free (not with
    /// [`Synchronous::Full`], whose commit waits for the disk).
    inline: bool,
    feed: Feed,
    path: PathBuf,
    // Dropping it stops the checkpointer thread.
    _checkpointer: mpsc::Sender<()>,
    // Held for the store's lifetime: dropping the file releases the ownership lock.
    _lock: File,
}

/// How long a transaction waits for SQLite's write lock, which only another program opening
/// the file can hold.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// The operations that may run on the calling task: one session's step, a lookup by key or a
/// short page of items, tens of microseconds. Listings, counts, retention, erasure, recovery
/// and the claim of a runnable session (which scans every runnable and running session) may
/// touch thousands of rows: they always run on the blocking pool.
const INLINE_OPERATIONS: &[&str] = &[
    "ping",
    "get_agent",
    "put_agent",
    "create_session",
    "get_session",
    "get_command",
    "get_effect",
    "get_action",
    "commit",
    "append_event",
    "begin_effect",
    "turn_effects",
    // With a page of at most `SHORT_PAGE` items, as `page_items`.
    "open_turn",
    // A page of at most `SHORT_PAGE` items; a longer one is `page_items (long)`.
    "page_items",
    "run_command",
    "finish_segment",
    "acquire_session",
    "renew_lease",
    "release_lease",
    "claim_action",
    "heartbeat_action",
];

/// How often the background connection copies the WAL into the database file.
const CHECKPOINT_INTERVAL: Duration = Duration::from_millis(200);

/// Prepared statements kept per connection: more than `sql.rs` holds.
const STATEMENT_CACHE: usize = 128;

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
        // Only tools reading the file while corral runs can hold SQLite's own locks.
        connection
            .busy_timeout(BUSY_TIMEOUT)
            .map_err(sqlite("configure"))?;
        connection
            .pragma_update(None, "wal_autocheckpoint", AUTOCHECKPOINT_PAGES)
            .map_err(sqlite("configure"))?;
        // Every statement of sql.rs stays prepared: rusqlite keeps 16 by default, fewer than
        // the store uses, so the least recent were parsed again and again.
        connection.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
        // A plan that does not depend on the values bound: without it, a statement with a bound
        // `LIMIT` (the pages of events and items) is planned again at every run, since SQLite
        // marks a bound integer it might fold as one whose new value expires the plan.
        connection
            .set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)
            .map_err(sqlite("configure"))?;
        // Off while migrating: a table rebuilt the documented way is dropped before its copy
        // takes its name, which with foreign keys on would delete the rows that refer to it.
        connection
            .pragma_update(None, "foreign_keys", "OFF")
            .map_err(sqlite("configure"))?;
        migrate(&mut connection, &path)?;
        connection
            .pragma_update(None, "foreign_keys", "ON")
            .map_err(sqlite("configure"))?;
        let checkpointer = spawn_checkpointer(&path)?;
        Ok(Self {
            inner: Arc::new(Inner {
                connection: Mutex::new(connection),
                inline: options.synchronous == Synchronous::Normal,
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
    let mut applied = 0;
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
        applied += 1;
    }
    // What the migrations did must leave every foreign key satisfied (they ran without them).
    // Checked only when some ran: the check reads every row that has a foreign key.
    let violations: i64 = if applied == 0 {
        0
    } else {
        tx.query_row("SELECT count(*) FROM pragma_foreign_key_check", [], |row| {
            row.get(0)
        })
        .map_err(sqlite("check the foreign keys of"))?
    };
    if violations > 0 {
        return Err(OpenStoreError::Backend {
            action: "migrate",
            source: format!(
                "{violations} rows of {} break a foreign key after the migrations",
                path.display()
            )
            .into(),
        });
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

impl ToSql for Param<'_> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(match self {
            Param::Int(Some(value)) => ToSqlOutput::from(*value),
            Param::Text(Some(text)) => ToSqlOutput::Borrowed(ValueRef::Text(text.as_bytes())),
            Param::Int(None) | Param::Text(None) => ToSqlOutput::Borrowed(ValueRef::Null),
        })
    }
}

impl SqliteTx<'_> {
    fn run(
        &self,
        operation: &'static str,
        sql: Sql,
        params: &[Param<'_>],
    ) -> Result<usize, StoreError> {
        let failed = |error| sqlite_error(operation, error);
        let mut statement = self.connection.prepare_cached(sql.sqlite).map_err(failed)?;
        statement.execute(params_from_iter(params)).map_err(failed)
    }
}

impl Tx for SqliteTx<'_> {
    fn notices(&mut self) -> &mut Vec<Notice> {
        &mut self.notices
    }

    async fn now(&mut self) -> Result<Timestamp, StoreError> {
        Ok(*self.now.get_or_insert_with(Timestamp::now))
    }

    async fn execute(
        &mut self,
        operation: &'static str,
        sql: Sql,
        params: Vec<Param<'_>>,
    ) -> Result<u64, StoreError> {
        Ok(self.run(operation, sql, &params)? as u64)
    }

    fn write(
        &mut self,
        operation: &'static str,
        sql: Sql,
        params: Vec<Param<'_>>,
    ) -> Result<(), StoreError> {
        self.run(operation, sql, &params).map(drop)
    }

    /// In two statements ([`sql::UPDATE_SESSION_STATUS`]): most commits leave the status as it
    /// was, and then write no page of `corral_sessions_claimable`.
    async fn update_session(&mut self, s: &Session) -> Result<(), StoreError> {
        let params = session_update(s)?;
        self.run("update a session", sql::UPDATE_SESSION_STATUS, &params[..2])?;
        self.run("update a session", sql::UPDATE_SESSION_BUT_STATUS, &params)
            .map(drop)
    }

    async fn query<T: Send>(
        &mut self,
        queries: Vec<Query<'_, T>>,
    ) -> Result<Vec<Vec<T>>, StoreError> {
        let mut results = Vec::with_capacity(queries.len());
        for query in queries {
            let failed = |error| sqlite_error(query.operation, error);
            let mut statement = self
                .connection
                .prepare_cached(query.sql.sqlite)
                .map_err(failed)?;
            let mut rows = statement
                .query(params_from_iter(&query.params))
                .map_err(failed)?;
            let mut decoded = Vec::new();
            while let Some(row) = rows.next().map_err(failed)? {
                decoded.push((query.decode)(row)?);
            }
            results.push(decoded);
        }
        Ok(results)
    }
}

impl Backend for SqliteStore {
    type Tx<'c> = SqliteTx<'c>;

    const KIND: StoreBackend = StoreBackend::Sqlite;

    fn feed(&self) -> &Feed {
        &self.inner.feed
    }

    /// Runs `work` over the store's one connection (the engine's futures never wait on anything
    /// but SQLite, so they are driven to completion in place): on the calling task when the
    /// connection is free and SQLite's write lock can be had at once (`Inner::run_inline`), else
    /// on the blocking thread pool, which waits for the connection and the lock.
    ///
    /// Measured 2026-12-06 (`docs/storage.md`): moving the calling worker's other tasks away for
    /// it (`block_in_place`) halved a lone durable step but cost `corral serve` about 12% of its
    /// turns/s with 16 sessions, so a transaction runs inline only when nothing waits for the
    /// connection, and never with [`Synchronous::Full`] (a commit that waits for the disk).
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
        let work = match self.inner.run_inline(operation, write, work) {
            Ok(ran) => {
                // Ran without awaiting: let the worker's other tasks (those this commit woke
                // first) run before the caller goes on, as the pool's round trip did, so that a
                // loop of store calls never holds its worker.
                tokio::task::yield_now().await;
                return ran;
            }
            Err(work) => work,
        };
        let inner = Arc::clone(&self.inner);
        let task = tokio::task::spawn_blocking(move || {
            let mut connection = inner
                .connection
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            begin(&mut connection, write, false).map_err(|error| sqlite_error(operation, error))?;
            finish(&inner.feed, &mut connection, operation, work)
        });
        task.await.map_err(|error| StoreError::Backend {
            operation,
            source: Box::new(error),
        })?
    }
}

impl Inner {
    /// Runs `work` on the calling thread if it is one of [`INLINE_OPERATIONS`], the connection
    /// is free and SQLite's write lock can be had at once; else hands `work` back for the
    /// blocking pool (where waiting, and long work, belongs).
    ///
    /// A transaction takes tens of microseconds, which a task may spend on its worker; handing
    /// it to the blocking pool instead cost two thread wake-ups each (figures in
    /// `bench/REPORT.md`, "A result's window and inline steps").
    fn run_inline<R, F>(
        &self,
        operation: &'static str,
        write: bool,
        work: F,
    ) -> Result<Result<R, StoreError>, F>
    where
        F: for<'a, 'c> FnOnce(&'a mut SqliteTx<'c>) -> BoxFuture<'a, Result<R, StoreError>>,
    {
        if !self.inline || !INLINE_OPERATIONS.contains(&operation) {
            return Err(work);
        }
        let Ok(mut connection) = self.connection.try_lock() else {
            return Err(work);
        };
        match begin(&mut connection, write, true) {
            Ok(()) => {}
            Err(error) if is_busy(&error) => return Err(work),
            Err(error) => return Ok(Err(sqlite_error(operation, error))),
        }
        let ran = panic::catch_unwind(AssertUnwindSafe(|| {
            finish(&self.feed, &mut connection, operation, work)
        }));
        // After a panic the transaction is still open: the next one rolls it back.
        Ok(ran.unwrap_or_else(|_| {
            Err(StoreError::Backend {
                operation,
                source: "the transaction panicked".into(),
            })
        }))
    }
}

/// Begins a transaction; when `write`, takes SQLite's write lock, waiting for it up to
/// [`BUSY_TIMEOUT`] unless `at_once`.
fn begin(connection: &mut Connection, write: bool, at_once: bool) -> rusqlite::Result<()> {
    if !connection.is_autocommit() {
        // A panic unwound out of a transaction and left it open: undo it.
        connection.execute_batch("ROLLBACK")?;
    }
    if !write {
        return control(connection, "BEGIN DEFERRED");
    }
    if !at_once {
        return control(connection, "BEGIN IMMEDIATE");
    }
    connection.busy_timeout(Duration::ZERO)?;
    let begun = control(connection, "BEGIN IMMEDIATE");
    connection.busy_timeout(BUSY_TIMEOUT)?;
    begun
}

/// Runs a transaction's `BEGIN` or `COMMIT` from the connection's statement cache:
/// `execute_batch` parsed it again at every transaction.
fn control(connection: &Connection, statement: &str) -> rusqlite::Result<()> {
    connection.prepare_cached(statement)?.execute([])?;
    Ok(())
}

fn is_busy(error: &rusqlite::Error) -> bool {
    matches!(
        error.sqlite_error_code(),
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked)
    )
}

/// Runs `work` in the transaction just begun, commits it and publishes its notices; rolls it
/// back if `work` fails.
fn finish<R, F>(
    feed: &Feed,
    connection: &mut Connection,
    operation: &'static str,
    work: F,
) -> Result<R, StoreError>
where
    F: for<'a, 'c> FnOnce(&'a mut SqliteTx<'c>) -> BoxFuture<'a, Result<R, StoreError>>,
{
    let mut tx = SqliteTx {
        connection,
        now: None,
        notices: Vec::new(),
    };
    let output = futures::executor::block_on(work(&mut tx));
    let notices = std::mem::take(&mut tx.notices);
    let output = match output {
        Ok(output) => output,
        Err(error) => {
            // Some errors end the transaction by themselves; the first error is the one to
            // report either way.
            if !connection.is_autocommit() {
                let _ = connection.execute_batch("ROLLBACK");
            }
            return Err(error);
        }
    };
    if let Err(error) = control(connection, "COMMIT") {
        if !connection.is_autocommit() {
            let _ = connection.execute_batch("ROLLBACK");
        }
        return Err(sqlite_error(operation, error));
    }
    feed.publish(&notices);
    Ok(output)
}
