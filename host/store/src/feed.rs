//! The change feed: notices of appended events and of claimable work, sent after commit.
//!
//! A transaction collects [`Notice`]s as the engine writes (every appended event batch, every
//! action created or made pending again); the backend publishes them once the transaction has
//! committed, never before and never for a rolled-back one. The embedded store publishes them to
//! an in-process broadcast; PostgreSQL also sends them with `pg_notify`, in a transaction of their
//! own right behind the `COMMIT` (so that commits are not serialized), and other replicas' stores
//! (listening on their own connection) publish them too. Those are sent before the `COMMIT`'s
//! answer is known: another replica can get a notice for a commit that failed at its end (one
//! read after its cursor that finds nothing), but a `COMMIT` is never sent without its notices.

use tokio::sync::broadcast;

/// A notice for an event appended to a session; see [`crate::Store::subscribe_events`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct EventNotice {
    /// The session the event was appended to.
    pub session_id: String,
    /// The event's cursor.
    pub cursor: u64,
    /// Whether the batch this event was appended with cancelled the session's turn (a running
    /// segment stops on it without reading the session back).
    pub cancelled: bool,
}

/// A notice that an action became claimable; see [`crate::Store::subscribe_work`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct WorkNotice {
    /// The action created, or made pending again.
    pub action_id: String,
}

/// What a transaction will announce once it commits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Notice {
    /// Events `first..=last` were appended to `session_id`.
    Events {
        session_id: String,
        first: u64,
        last: u64,
        cancelled: bool,
    },
    /// `action_id` is pending.
    Work { action_id: String },
}

/// Buffered notices per receiver before it lags (a lagged receiver re-reads from its cursor).
const EVENT_CAPACITY: usize = 16_384;
const WORK_CAPACITY: usize = 4_096;

/// The two broadcasts of one store handle.
#[derive(Debug)]
pub(crate) struct Feed {
    events: broadcast::Sender<EventNotice>,
    work: broadcast::Sender<WorkNotice>,
    /// Transactions begun through this handle.
    transactions: std::sync::atomic::AtomicU64,
}

impl Default for Feed {
    fn default() -> Self {
        Self {
            events: broadcast::channel(EVENT_CAPACITY).0,
            work: broadcast::channel(WORK_CAPACITY).0,
            transactions: std::sync::atomic::AtomicU64::new(0),
        }
    }
}

impl Feed {
    pub(crate) fn count_transaction(&self) {
        self.transactions
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    pub(crate) fn transactions(&self) -> u64 {
        self.transactions.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub(crate) fn subscribe_events(&self) -> broadcast::Receiver<EventNotice> {
        self.events.subscribe()
    }

    pub(crate) fn subscribe_work(&self) -> broadcast::Receiver<WorkNotice> {
        self.work.subscribe()
    }

    /// Sends every notice to the current subscribers (none is not an error).
    pub(crate) fn publish(&self, notices: &[Notice]) {
        for notice in notices {
            match notice {
                Notice::Events {
                    session_id,
                    first,
                    last,
                    cancelled,
                } => {
                    if self.events.receiver_count() == 0 {
                        continue;
                    }
                    for cursor in *first..=*last {
                        let _ = self.events.send(EventNotice {
                            session_id: session_id.clone(),
                            cursor,
                            cancelled: *cancelled,
                        });
                    }
                }
                Notice::Work { action_id } => {
                    let _ = self.work.send(WorkNotice {
                        action_id: action_id.clone(),
                    });
                }
            }
        }
    }

    pub(crate) fn event_notice(&self, notice: EventNotice) {
        let _ = self.events.send(notice);
    }

    pub(crate) fn work_notice(&self, notice: WorkNotice) {
        let _ = self.work.send(notice);
    }
}
