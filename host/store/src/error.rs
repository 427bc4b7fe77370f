//! Typed errors of the store.

use std::fmt;
use std::path::PathBuf;

/// A boxed error from a database driver.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// The kind of record an error is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Entity {
    /// An agent definition.
    Agent,
    /// A session.
    Session,
    /// A session's event stream.
    Event,
    /// A conversation item.
    Item,
    /// A checkpoint.
    Checkpoint,
    /// An effect.
    Effect,
    /// An action.
    Action,
    /// An idempotent command.
    Command,
}

impl fmt::Display for Entity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Entity::Agent => "agent",
            Entity::Session => "session",
            Entity::Event => "event",
            Entity::Item => "item",
            Entity::Checkpoint => "checkpoint",
            Entity::Effect => "effect",
            Entity::Action => "action",
            Entity::Command => "command",
        })
    }
}

/// Why a fencing token was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StaleReason {
    /// Another holder took over since (a newer generation or another claim).
    Superseded,
    /// The lease expired.
    Expired,
    /// Nobody holds it (released, or never claimed).
    NotHeld,
}

impl fmt::Display for StaleReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            StaleReason::Superseded => "taken over by a newer holder",
            StaleReason::Expired => "lease expired",
            StaleReason::NotHeld => "not held",
        })
    }
}

/// An operation on an open store failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The caller may not do this (an executor's action outside its token's scope).
    #[error("forbidden: {reason}")]
    Forbidden {
        /// Why.
        reason: String,
    },
    /// The record does not exist.
    #[error("{entity} {id:?} not found")]
    NotFound {
        /// What was looked up.
        entity: Entity,
        /// Its id.
        id: String,
    },
    /// The record exists in a state that forbids the change (a different session under the same
    /// id, another command under the same idempotency key, an unexpected status or version).
    #[error("conflict on {entity} {id:?}: {reason}")]
    Conflict {
        /// The record in conflict.
        entity: Entity,
        /// Its id.
        id: String,
        /// What did not match.
        reason: String,
    },
    /// A fencing check failed: the caller's lease or claim is no longer current, so its write
    /// was rejected. The caller must stop working on this session or action.
    #[error(
        "stale generation on {entity} {id:?}: presented {presented}, current {current} ({reason})"
    )]
    StaleGeneration {
        /// A session (ownership lease) or an action (executor claim).
        entity: Entity,
        /// Its id.
        id: String,
        /// The generation the caller presented.
        presented: u64,
        /// The generation stored now.
        current: u64,
        /// Why the token was refused.
        reason: StaleReason,
    },
    /// An event cursor beyond the newest event of the session (never issued by this store).
    #[error("cursor {cursor} is beyond the last event {last} of session {session_id:?}")]
    InvalidCursor {
        /// The session.
        session_id: String,
        /// The cursor presented.
        cursor: u64,
        /// The newest cursor.
        last: u64,
    },
    /// A request argument is out of range.
    #[error("invalid {what}: {reason}")]
    InvalidInput {
        /// Which argument.
        what: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The database cannot be reached (connection lost, server shutting down, pool exhausted) or
    /// aborted the transaction to resolve contention. Nothing was committed; retry later.
    #[error("storage unavailable during {operation}; retry later")]
    Unavailable {
        /// The store operation.
        operation: &'static str,
        /// The driver's error.
        #[source]
        source: BoxError,
    },
    /// A stored record cannot be read back (malformed JSON or an unknown status): the database was
    /// changed outside this crate or by a newer version.
    #[error("stored {entity} {id:?} is unreadable: {detail}")]
    Corrupt {
        /// The record.
        entity: Entity,
        /// Its id.
        id: String,
        /// What could not be decoded.
        detail: String,
    },
    /// The database rejected an operation for another reason (a bug or a misconfiguration).
    #[error("storage failed during {operation}")]
    Backend {
        /// The store operation.
        operation: &'static str,
        /// The driver's error.
        #[source]
        source: BoxError,
    },
}

impl StoreError {
    /// Whether retrying the same operation later may succeed without any other change.
    pub fn is_retryable(&self) -> bool {
        matches!(self, StoreError::Unavailable { .. })
    }

    pub(crate) fn not_found(entity: Entity, id: impl Into<String>) -> Self {
        StoreError::NotFound {
            entity,
            id: id.into(),
        }
    }

    pub(crate) fn conflict(
        entity: Entity,
        id: impl Into<String>,
        reason: impl Into<String>,
    ) -> Self {
        StoreError::Conflict {
            entity,
            id: id.into(),
            reason: reason.into(),
        }
    }

    pub(crate) fn corrupt(
        entity: Entity,
        id: impl Into<String>,
        detail: impl Into<String>,
    ) -> Self {
        StoreError::Corrupt {
            entity,
            id: id.into(),
            detail: detail.into(),
        }
    }

    pub(crate) fn invalid(what: &'static str, reason: impl Into<String>) -> Self {
        StoreError::InvalidInput {
            what,
            reason: reason.into(),
        }
    }
}

/// Opening a store failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenStoreError {
    /// Another process owns the embedded store file.
    #[error(
        "store file {} is already in use by {}",
        path.display(),
        holder_pid.map_or_else(|| "another process".to_owned(), |pid| format!("process {pid}"))
    )]
    AlreadyInUse {
        /// The store file.
        path: PathBuf,
        /// The owning process, when it recorded its id.
        holder_pid: Option<u32>,
    },
    /// A file operation on the store's files failed.
    #[error("cannot {action} {}", path.display())]
    Io {
        /// What was being done.
        action: &'static str,
        /// The file or folder.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// SQLite refused to open or configure the file.
    #[error("cannot {action} SQLite store {}", path.display())]
    Sqlite {
        /// What was being done.
        action: &'static str,
        /// The store file.
        path: PathBuf,
        /// SQLite's error.
        #[source]
        source: rusqlite::Error,
    },
    /// The PostgreSQL connection settings are malformed.
    #[error("invalid PostgreSQL settings: {reason}")]
    InvalidSettings {
        /// What is wrong.
        reason: String,
    },
    /// The database could not be reached; retry later.
    #[error("database unavailable while trying to {action}")]
    Unavailable {
        /// What was being done.
        action: &'static str,
        /// The driver's error.
        #[source]
        source: BoxError,
    },
    /// The database holds a newer schema than this build knows; refusing to run against it.
    #[error(
        "database schema version {found} is newer than the {supported} this build supports; \
         upgrade corral"
    )]
    SchemaTooNew {
        /// The newest version applied to the database.
        found: u32,
        /// The newest version this build knows.
        supported: u32,
    },
    /// A migration failed; the transaction applying it was rolled back.
    #[error("migration {version} ({name}) failed")]
    Migration {
        /// Its version.
        version: u32,
        /// Its file name.
        name: &'static str,
        /// The database's error.
        #[source]
        source: BoxError,
    },
    /// The database failed during start-up for another reason.
    #[error("database failed while trying to {action}")]
    Backend {
        /// What was being done.
        action: &'static str,
        /// The driver's error.
        #[source]
        source: BoxError,
    },
}
