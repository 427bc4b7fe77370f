//! Durable storage for corral: one [`Store`] trait, an embedded SQLite default and PostgreSQL.
//!
//! ```
//! use std::sync::Arc;
//! use corral_store::{
//!     CheckpointWrite, CommitOutcome, NewAgent, NewCheckpoint, NewEvent, NewSession,
//!     SessionCommit, SqliteStore, Store,
//! };
//! use serde_json::json;
//!
//! # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let folder = tempfile::tempdir()?;
//! let store: Arc<dyn Store> = Arc::new(SqliteStore::open(folder.path().join("corral.db"))?);
//! store.put_agent(NewAgent::new("helper", json!({"id": "helper"}), "sha256:ab", "1.0")).await?;
//! store.create_session(NewSession::new("s1", "acme", "alice", "helper", json!({}))).await?;
//!
//! // A permission checkpoint commits in the same transaction as the event announcing it.
//! let mut commit = SessionCommit::new("s1");
//! commit.events.push(NewEvent::new("permission.requested", json!({"tool": "run_js"})));
//! let checkpoint = NewCheckpoint::new("t1", 0, json!({"plan": []}));
//! commit.checkpoint = Some(CheckpointWrite::Put(checkpoint));
//! let CommitOutcome::Applied(receipt) = store.commit(commit).await? else { unreachable!() };
//! assert_eq!(receipt.events[0].cursor, 1);
//! # Ok(()) }
//! ```
//!
//! # Core concepts
//!
//! - **One transaction per call.** Every [`Store`] method commits entirely or not at all. The
//!   general write is [`Store::commit`]: a [`SessionCommit`] bundles a session's status change,
//!   conversation items, events, its new live [`Checkpoint`], guarded effect and action
//!   transitions and the idempotent command that caused them, so a checkpoint always commits
//!   with the state it guards.
//! - **Events** have a per-session cursor 1, 2, 3... with no gap and no duplicate, however many
//!   writers append at once: the counter lives on the session row, which every write locks.
//! - **Commands** are idempotent by (session, idempotency key): a replay gets the first response
//!   ([`CommitOutcome::Replayed`]), another command under the same key is a conflict.
//! - **Effects** (model and capability calls) are journaled under stable ids with statuses
//!   pending, invoking, completed, uncertain; [`Store::begin_effect`] never starts one twice and
//!   recovery turns the in-flight ones uncertain. **Actions** are effects run by external
//!   executors, claimed with a generation and a lease.
//! - **Replicas** own sessions through a [`Lease`] whose [`Fence`] (a generation) must accompany
//!   their writes: once the lease expires or another replica takes over, those writes fail with
//!   [`StoreError::StaleGeneration`]. Runnable sessions are claimed with `FOR UPDATE SKIP LOCKED`.
//! - **Retention** ([`Store::apply_retention`]) deletes closed sessions per tenant, prunes
//!   superseded checkpoints and keeps idempotency records for at least a window (24 h default).
//! - **Backends**: [`SqliteStore`] (a single file in WAL mode, owned by one process through an
//!   OS file lock) and [`PostgresStore`] (`tokio-postgres` with a `deadpool-postgres` pool). Both
//!   apply numbered migration files at start and refuse a database migrated by a newer build.
//!   They share one implementation of the transactions above and one conformance suite.
//! - **SQL, written once.** Every row-level statement is one constant (`sql.rs`) in
//!   PostgreSQL's form, SQLite's placeholders derived from it at compile time, and the row
//!   operations and decoders over them are shared (`tx.rs`). A backend keeps only what truly
//!   differs: connections and transactions, PostgreSQL's row lock, `SKIP LOCKED` claim and
//!   server clock, the change feed's transport and the migrations' DDL. On PostgreSQL a step's
//!   independent reads travel with its session lock in one round trip, and its writes with the
//!   `COMMIT`.
//!
//! Crates doing the work: `rusqlite` (bundled SQLite), `tokio-postgres` and `deadpool-postgres`,
//! `serde_json` for stored JSON (kept as compact text with its key order, identically in both
//! backends).

#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod backend;
mod checkpoint;
mod engine;
mod error;
mod feed;
mod machine;
mod migrations;
mod model;
mod postgres;
mod sql;
mod sqlite;
mod store;
#[cfg(unix)]
#[doc(hidden)]
pub mod testing;
mod tx;

pub use checkpoint::{Decision, Interaction, TurnCheckpoint};
pub use error::{BoxError, Entity, OpenStoreError, StaleReason, StoreError};
pub use feed::{EventNotice, WorkNotice};
pub use machine::{
    CommandKind, CommandReceipt, Segment, SegmentEnd, SegmentOutcome, SegmentStart, SessionCommand,
    server_state,
};
pub use model::{
    Action, ActionFilter, ActionGuard, ActionStatus, ActionTransition, AgentDefinition,
    BeginEffect, BeginEffectOutcome, Checkpoint, CheckpointWrite, ClaimAction, ClaimedAction,
    CommandRecord, CommitOutcome, CommitReceipt, CreatedSession, DEFAULT_IDEMPOTENCY_WINDOW,
    Effect, EffectKind, EffectStatus, EffectTransition, Event, ExecutorScope, Fence,
    HeartbeatAction, Item, ItemPage, Lease, MAX_PAGE, NewAction, NewAgent, NewCheckpoint,
    NewCommand, NewEffect, NewEvent, NewItem, NewSession, Resolution, RetentionPolicy,
    RetentionReport, SHORT_PAGE, Session, SessionCommit, SessionCount, SessionFilter, SessionOwner,
    SessionPatch, SessionStatus, StoreBackend, Timestamp, TurnEffects,
};
pub use postgres::{PostgresConfig, PostgresHost, PostgresOptions, PostgresStore};
pub use sqlite::{SqliteOptions, SqliteStore, Synchronous};
pub use store::Store;

/// A replica id unique to this process start: `<hostname>-<pid>-<random hex>`.
///
/// A replica must use a fresh id at every start (never a configured constant), so that a
/// restarted process never mistakes the lease of its previous life for its own: leases held
/// under the old id simply expire. Call it once at start-up and keep the value.
pub fn replica_id() -> String {
    use std::hash::{BuildHasher as _, Hasher as _};
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|name| name.trim().to_owned())
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "host".to_owned());
    // `RandomState` is seeded from the operating system's random source.
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_nanos());
    hasher.write_u128(nanos);
    hasher.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    format!("{host}-{}-{:016x}", std::process::id(), hasher.finish())
}
