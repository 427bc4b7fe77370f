//! Reading a conversation's items, and keeping the items of recently run sessions in memory so
//! that a turn reads only what was added since the session's previous turn in this process.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use corral_store::{Item, ItemPage, Store, Timestamp};

use crate::journal::JournalError;
use crate::types::ConversationItem;

/// A conversation item read, with what tells it from any other item stored at its place.
#[derive(Debug)]
pub(crate) struct Read {
    pub(crate) seq: u64,
    turn_id: Option<String>,
    created_at: Timestamp,
    pub(crate) item: ConversationItem,
}

impl Read {
    /// Whether `self` is `other` as stored: retention prunes a closed session's items from its
    /// oldest on (and the session may be reopened), and a session erased and created again
    /// under the same id has other items at the same places (of other turns, at other times).
    fn is(&self, other: &Read) -> bool {
        self.seq == other.seq
            && self.turn_id == other.turn_id
            && self.created_at == other.created_at
            && self.item == other.item
    }

    fn decode(item: Item) -> Result<Self, JournalError> {
        let parsed: ConversationItem = serde_json::from_value(item.body)
            .map_err(|e| JournalError::Corrupt(format!("item {}: {e}", item.seq)))?;
        Ok(Read {
            seq: item.seq,
            turn_id: item.turn_id,
            created_at: item.created_at,
            item: parsed,
        })
    }
}

/// Reads the session's items after `after`, in order: a short page first (a turn usually
/// finds the few items appended since its previous one, which the embedded store reads on the
/// caller's task), then long pages.
pub(crate) async fn read_items(
    store: &dyn Store,
    session_id: &str,
    after: u64,
) -> Result<Vec<Read>, JournalError> {
    let first = store
        .page_items(session_id, after, corral_store::SHORT_PAGE)
        .await?;
    read_pages(store, session_id, first).await
}

/// The items of `page`, read already, and of the long pages after it, in order.
pub(crate) async fn read_pages(
    store: &dyn Store,
    session_id: &str,
    mut page: ItemPage,
) -> Result<Vec<Read>, JournalError> {
    let mut items = Vec::new();
    loop {
        for item in page.items {
            items.push(Read::decode(item)?);
        }
        match page.next_after {
            Some(next) => {
                page = store
                    .page_items(session_id, next, corral_store::MAX_PAGE)
                    .await?;
            }
            None => return Ok(items),
        }
    }
}

/// The item the session stores at `seq`, if any.
async fn stored_at(
    store: &dyn Store,
    session_id: &str,
    seq: u64,
) -> Result<Option<Read>, JournalError> {
    let page = store
        .page_items(session_id, seq.saturating_sub(1), 1)
        .await?;
    page.items
        .into_iter()
        .next()
        .filter(|item| item.seq == seq)
        .map(Read::decode)
        .transpose()
}

/// The conversation items of the sessions this process ran last, from each one's last
/// compaction on (a turn's model sees nothing older, see
/// [`conversation_from_items`](crate::conversation_from_items)).
///
/// Without it every turn reads and decodes its session's whole conversation, which grows with
/// every turn: in `corral serve`'s benchmark, sessions of a few hundred turns spent a fifth of
/// the server's CPU there. With it a turn reads the items added since the session's previous
/// turn (by this process or another replica: items are only ever appended), and checks that the
/// oldest item it keeps is still stored, since retention may have pruned a closed session's
/// history before the session was reopened, or the session may have been erased and created
/// again under the same id; if not, it reads the conversation again.
///
/// At most `capacity` sessions are kept; the one used longest ago makes room.
#[derive(Debug)]
pub struct HistoryCache {
    capacity: usize,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    sessions: HashMap<String, Cached>,
    /// Counts uses, to find the session used longest ago.
    clock: u64,
}

#[derive(Debug)]
struct Cached {
    /// The items from the last compaction on.
    items: Vec<Read>,
    /// The last sequence number read (items after it are new).
    last_seq: u64,
    used: u64,
}

impl HistoryCache {
    /// How many sessions `corral serve` keeps by default.
    pub const DEFAULT_CAPACITY: usize = 1024;

    /// A cache of at most `capacity` sessions (0 keeps none).
    pub fn new(capacity: usize) -> Self {
        HistoryCache {
            capacity,
            state: Mutex::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How many sessions are kept now.
    pub fn len(&self) -> usize {
        self.lock().sessions.len()
    }

    /// Whether no session is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The conversation items of `session_id` that a turn needs, from its last compaction on.
    pub async fn history(
        &self,
        store: &dyn Store,
        session_id: &str,
    ) -> Result<Vec<ConversationItem>, JournalError> {
        let known = self
            .lock()
            .sessions
            .get(session_id)
            .map(|cached| (cached.last_seq, cached.items.first().map(|read| read.seq)));
        let after = known.map_or(0, |(last, _)| last);
        let oldest = known.and_then(|(_, oldest)| oldest);
        let (new, stored) = futures::try_join!(read_items(store, session_id, after), async {
            match oldest {
                Some(seq) => stored_at(store, session_id, seq).await,
                None => Ok(None),
            }
        })?;
        match self.merge(session_id, known.map(|(last, _)| last), stored, after, new) {
            Merged::Items(items) => Ok(items),
            // Pruned or replaced since it was read: what is kept is dropped, and read again.
            Merged::Replaced => Box::pin(self.history(store, session_id)).await,
            Merged::Moved => {
                // Read or dropped meanwhile by another run of the session (a lease holder runs
                // one turn at a time, so this is rare): what was read here may not join what is
                // kept.
                let items = read_items(store, session_id, 0).await?;
                Ok(from_last_compaction(items))
            }
        }
    }

    /// Adds the items read after `after` to what is kept of the session, if that is still what
    /// it was when they were read (`last`) and its oldest item is still the one `stored` at its
    /// place.
    fn merge(
        &self,
        session_id: &str,
        last: Option<u64>,
        stored: Option<Read>,
        after: u64,
        new: Vec<Read>,
    ) -> Merged {
        let mut state = self.lock();
        let Some(current) = state.sessions.get(session_id) else {
            if last.is_some() {
                return Merged::Moved;
            }
            if self.capacity == 0 {
                return Merged::Items(from_last_compaction(new));
            }
            if state.sessions.len() >= self.capacity
                && let Some(oldest) = state
                    .sessions
                    .iter()
                    .min_by_key(|(_, cached)| cached.used)
                    .map(|(id, _)| id.clone())
            {
                state.sessions.remove(&oldest);
            }
            return Self::keep(&mut state, session_id, after, new);
        };
        if Some(current.last_seq) != last {
            return Merged::Moved;
        }
        let oldest = current.items.first();
        if oldest.is_some_and(|oldest| !stored.as_ref().is_some_and(|stored| stored.is(oldest))) {
            state.sessions.remove(session_id);
            return Merged::Replaced;
        }
        Self::keep(&mut state, session_id, after, new)
    }

    /// Adds `new` to what is kept of the session; returns its items.
    fn keep(state: &mut State, session_id: &str, after: u64, new: Vec<Read>) -> Merged {
        state.clock += 1;
        let used = state.clock;
        let entry = state
            .sessions
            .entry(session_id.to_owned())
            .or_insert_with(|| Cached {
                items: Vec::new(),
                last_seq: after,
                used,
            });
        entry.used = used;
        entry.items.extend(new);
        if let Some(read) = entry.items.last() {
            entry.last_seq = entry.last_seq.max(read.seq);
        }
        if let Some(at) = last_compaction(&entry.items) {
            entry.items.drain(..at);
        }
        Merged::Items(entry.items.iter().map(|read| read.item.clone()).collect())
    }
}

/// What became of the items read for a session.
enum Merged {
    /// Kept (or not, without room): the session's items.
    Items(Vec<ConversationItem>),
    /// What was kept is no longer stored and was dropped.
    Replaced,
    /// Another read of the session changed what is kept meanwhile.
    Moved,
}

fn last_compaction(items: &[Read]) -> Option<usize> {
    items
        .iter()
        .rposition(|read| matches!(read.item, ConversationItem::Compaction { .. }))
}

fn from_last_compaction(mut items: Vec<Read>) -> Vec<ConversationItem> {
    if let Some(at) = last_compaction(&items) {
        items.drain(..at);
    }
    items.into_iter().map(|read| read.item).collect()
}
