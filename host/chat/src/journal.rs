//! The conversation store a run needs, and its implementation over any `corral_store::Store`
//! (the embedded SQLite store and PostgreSQL alike).
//!
//! The journal is what makes a turn re-executable: every model call, capability call, approval,
//! script batch and tool result has a stable id derived from its position in the turn, and a
//! completed entry is returned instead of being performed again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use async_trait::async_trait;
use corral_store::{
    BeginEffect, BeginEffectOutcome, CheckpointWrite, Effect, EffectKind, EffectStatus,
    EffectTransition, Fence, ItemPage, NewAction, NewCheckpoint, NewEffect, NewEvent,
    SessionCommit, Store, StoreError, Timestamp, TurnEffects,
};
use serde_json::Value;

use crate::history::{HistoryCache, read_items, read_pages};
use crate::types::{ConversationItem, SuspensionContext};

/// A store failure, or a journal entry that does not match what the run asks for.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JournalError {
    /// The journaled request under this id differs from the one made now: the turn is not
    /// replaying the same way (a changed script, catalog or conversation).
    #[error("effect {effect_id} was journaled with a different request")]
    Drift {
        /// The effect.
        effect_id: String,
    },
    /// The lease this run writes under is gone (another replica took the session over).
    #[error("the session's lease was lost: {0}")]
    Fenced(String),
    /// The store failed.
    #[error(transparent)]
    Store(StoreError),
    /// Stored data could not be read.
    #[error("stored data is unreadable: {0}")]
    Corrupt(String),
    /// An earlier commit of this run failed with this error: nothing more is written.
    #[error("an earlier journal commit failed: {0}")]
    Failed(String),
}

impl From<StoreError> for JournalError {
    fn from(error: StoreError) -> Self {
        match error {
            StoreError::StaleGeneration { .. } => JournalError::Fenced(error.to_string()),
            other => JournalError::Store(other),
        }
    }
}

/// The state of a journal entry when a run reaches it.
#[derive(Debug, Clone, PartialEq)]
pub enum Journaled {
    /// Not journaled before: it is now (as asked), and the caller performs it.
    New,
    /// Completed before with this result: use it, do not perform it again.
    Completed(Value),
    /// Journaled, not started: external work not done yet, or an operator asked for a retry.
    Pending,
    /// Was in flight when a process died, or its outcome is otherwise unknown.
    Uncertain,
}

/// External work to create with a capability effect (kind `action`).
#[derive(Debug, Clone, PartialEq)]
pub struct ActionRequest {
    /// The capability an executor runs.
    pub capability_id: String,
    /// What the executor gets (input, tool call id...).
    pub request: Value,
}

/// The narrow store a run needs, scoped to one conversation.
#[async_trait]
pub trait ConversationStore: Send + Sync + std::fmt::Debug {
    /// The conversation items of earlier turns, in order; what comes before the last compaction
    /// may be left out (the model never sees it).
    async fn history(&self) -> Result<Vec<ConversationItem>, JournalError>;

    /// How many model calls the conversation made in turns other than `turn_id` (scripted
    /// models answer by this count).
    async fn model_calls_before(&self, turn_id: &str) -> Result<u64, JournalError>;

    /// Journals an effect that the caller performs now (`invoking`), or one that external work
    /// will complete (`pending`, with `action`), unless it exists: then reports its state.
    async fn begin(
        &self,
        turn_id: &str,
        effect_id: &str,
        kind: EffectKind,
        request: Value,
        action: Option<ActionRequest>,
    ) -> Result<Journaled, JournalError>;

    /// Journals an entry that is complete at once (a decision, a batch, a tool result), unless
    /// it exists: then returns the journaled result.
    async fn record(
        &self,
        turn_id: &str,
        effect_id: &str,
        kind: EffectKind,
        request: Value,
        result: Value,
    ) -> Result<Journaled, JournalError>;

    /// The state of `effect_id`, without journaling anything; `None` when it was never journaled.
    async fn lookup(&self, effect_id: &str) -> Result<Option<Journaled>, JournalError>;

    /// Marks a begun effect completed with `result`.
    async fn complete(&self, effect_id: &str, result: Value) -> Result<(), JournalError>;

    /// Moves a pending effect (an operator's retry) back to invoking before performing it.
    async fn restart(&self, effect_id: &str) -> Result<(), JournalError>;

    /// Completed journal entries whose id starts with `prefix`, in journal order.
    async fn completed_with_prefix(
        &self,
        prefix: &str,
    ) -> Result<Vec<(String, Value)>, JournalError>;

    /// Makes the permission checkpoint durable. Called before the permission event is emitted.
    async fn save_checkpoint(&self, checkpoint: &SuspensionContext) -> Result<(), JournalError>;

    /// Makes durable whatever the journal still holds back (see [`StoreJournal`]).
    async fn flush(&self) -> Result<(), JournalError> {
        Ok(())
    }

    /// Called once when a run ends, before it returns: what the journal still holds is durable
    /// before the run's outcome is. [`StoreJournal`] flushes, unless its caller takes what it
    /// holds to commit with the outcome ([`StoreJournal::leaving_its_end_to_the_caller`]).
    async fn end(&self) -> Result<(), JournalError> {
        self.flush().await
    }

    /// Makes the events the journal holds visible soon, without waiting for them: called
    /// before a script starts, so the stream shows what led to it while it runs.
    /// [`StoreJournal`] commits them with the script's first durable write or at the end of
    /// its result window ([`RESULT_WINDOW`]), whichever comes first.
    async fn publish(&self) -> Result<(), JournalError> {
        Ok(())
    }
}

/// [`ConversationStore`] over a `corral_store::Store` session, optionally under a lease.
///
/// It journals one turn. It reads that turn's entries once, on first use (with the count of the
/// session's model calls in other turns), and answers every later question about them
/// (`lookup`, `record` of an entry already journaled, `completed_with_prefix`) from that copy,
/// kept up to date with its own writes: the run holds the session's lease, so nothing else adds
/// to the journal meanwhile. Effect ids begin with their turn's id, so no entry of the turn can
/// be among those it does not read, and a long session's run does not read its whole past.
///
/// Writes go to the store in as few commits as the journal's promise allows. Entries that are
/// complete at once (`record`) and events (`append_events`, from the runtime's sink) are held
/// back and committed with the next write that must be durable before the run goes on: a
/// capability call about to be made (`begin`), a retry (`restart`), a checkpoint, or
/// [`ConversationStore::flush`]. Both are reproduced the same way if the process dies before
/// they are committed, and an event is never durable before the entry that caused it.
///
/// A model call's start is held the same way: asking a model reaches nothing outside, so it
/// need not be durable before the call is made. A process that dies before the journal's next
/// commit leaves nothing of the call, and the next run asks the model again; once that commit is
/// made (the call's first streamed text, say, or the events held before it, which are not left
/// waiting on the model), the call is journaled `invoking` and a process that dies during it
/// leaves it `uncertain`, as a capability call. Making it durable first cost a commit per model
/// call (figures in `docs/storage.md`).
///
/// A result (`complete`, of a model call or a capability) is held too, but for at most its
/// window ([`RESULT_WINDOW`], 2 ms): it goes with the journal's next commit if one comes first
/// (a script's next call, the run's next model call or its end, all usually within
/// microseconds), else alone. The run does not wait for it. A result that dies with the process
/// leaves its effect `invoking`, which the next run finds `uncertain`, as if the process had died
/// during the call; nothing the run does in the window reaches anyone before that commit (it is
/// the run's own work, or writes and events held behind the result). Waiting for each result's
/// own commit instead cost a commit per call (figures in `docs/storage.md`).
///
/// Writes made while a commit is in flight (concurrent calls of a script) go together in the
/// next one. After a failed commit every later write fails with the same error.
#[derive(Debug)]
pub struct StoreJournal {
    turn_id: String,
    segment: u64,
    known: tokio::sync::OnceCell<Mutex<Known>>,
    /// The store, the session and the fence, with the writes held for them.
    committer: Arc<Committer>,
    /// How long a result may wait for the journal's next commit.
    result_window: std::time::Duration,
    /// The conversations this process ran lately, when shared with the journal.
    history_cache: Option<Arc<HistoryCache>>,
    /// Whether the run's end leaves what is held to the caller ([`StoreJournal::take_held`]).
    caller_ends: bool,
    /// The conversation's first page, read with the turn's journal, until `history` takes it.
    first_items: Mutex<Option<ItemPage>>,
}

/// How long a model call's or a capability's result waits for the journal's next commit before
/// it is committed alone.
pub const RESULT_WINDOW: std::time::Duration = std::time::Duration::from_millis(2);

/// The writes a journal holds and the one commit of them at a time; shared with the tasks that
/// commit a result at the end of its window.
#[derive(Debug)]
struct Committer {
    store: Arc<dyn Store>,
    session_id: String,
    fence: Option<Fence>,
    held: Mutex<Held>,
    /// Taken by the task committing the held writes.
    committing: tokio::sync::Mutex<()>,
}

/// The turn's journal entries, in journal order.
#[derive(Debug, Default)]
struct Known {
    order: Vec<String>,
    effects: HashMap<String, Effect>,
    /// The session's model calls in other turns.
    model_calls_elsewhere: u64,
}

impl From<TurnEffects> for Known {
    fn from(turn: TurnEffects) -> Self {
        let mut known = Known {
            model_calls_elsewhere: turn.model_calls_elsewhere,
            ..Known::default()
        };
        for effect in turn.effects {
            known.add(effect);
        }
        known
    }
}

impl Known {
    fn add(&mut self, effect: Effect) {
        if self.effects.contains_key(&effect.effect_id) {
            return;
        }
        self.order.push(effect.effect_id.clone());
        self.effects.insert(effect.effect_id.clone(), effect);
    }
}

/// Writes not committed yet.
#[derive(Debug, Default)]
struct Held {
    new_effects: Vec<NewEffect>,
    transitions: Vec<EffectTransition>,
    checkpoint: Option<CheckpointWrite>,
    events: Vec<NewEvent>,
    /// Writes added so far, and how many of them are committed.
    added: u64,
    committed: u64,
    /// Whether a task will commit what is held at the end of a result's window.
    timer_armed: bool,
    failure: Option<String>,
}

impl Held {
    /// Arms the result window's timer: whether the caller must start it (it was not armed).
    fn arm(&mut self) -> bool {
        !std::mem::replace(&mut self.timer_armed, true)
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Committer {
    /// What is held, as one commit under the journal's fence.
    fn take(&self, held: &mut Held) -> SessionCommit {
        let mut commit = SessionCommit::new(self.session_id.clone());
        commit.new_effects = std::mem::take(&mut held.new_effects);
        commit.effects = std::mem::take(&mut held.transitions);
        commit.checkpoint = held.checkpoint.take();
        commit.events = std::mem::take(&mut held.events);
        commit.fence = self.fence.clone();
        commit
    }

    fn hold(&self, add: impl FnOnce(&mut Held)) -> Result<u64, JournalError> {
        let mut held = lock(&self.held);
        if let Some(failure) = &held.failure {
            return Err(JournalError::Failed(failure.clone()));
        }
        add(&mut held);
        held.added += 1;
        Ok(held.added)
    }

    /// Returns once the first `ticket` writes are committed: by this task, or by the one
    /// that was committing when it asked (group commit).
    async fn commit_through(&self, ticket: u64) -> Result<(), JournalError> {
        let _committing = self.committing.lock().await;
        let (commit, upto) = {
            let mut held = lock(&self.held);
            if let Some(failure) = &held.failure {
                return Err(JournalError::Failed(failure.clone()));
            }
            if held.committed >= ticket {
                return Ok(());
            }
            (self.take(&mut held), held.added)
        };
        match self.store.commit(commit).await {
            Ok(_) => {
                lock(&self.held).committed = upto;
                Ok(())
            }
            Err(error) => {
                let error = JournalError::from(error);
                lock(&self.held).failure = Some(error.to_string());
                Err(error)
            }
        }
    }
}

impl StoreJournal {
    /// The journal of `turn_id` in the conversation of `session_id`, written under `fence` when
    /// set. `segment` is the live checkpoint's segment (a suspension rewrites it).
    pub fn new(
        store: Arc<dyn Store>,
        session_id: impl Into<String>,
        turn_id: impl Into<String>,
        fence: Option<Fence>,
        segment: u64,
    ) -> Self {
        StoreJournal {
            committer: Arc::new(Committer {
                store,
                session_id: session_id.into(),
                fence,
                held: Mutex::default(),
                committing: tokio::sync::Mutex::new(()),
            }),
            turn_id: turn_id.into(),
            segment,
            known: tokio::sync::OnceCell::new(),
            result_window: RESULT_WINDOW,
            history_cache: None,
            caller_ends: false,
            first_items: Mutex::default(),
        }
    }

    fn existing(effect: &Effect) -> Journaled {
        match effect.status {
            EffectStatus::Completed => {
                Journaled::Completed(effect.result.clone().unwrap_or(Value::Null))
            }
            EffectStatus::Pending => Journaled::Pending,
            // Invoking at this point means the process that began it is gone (this run holds
            // the lease): its outcome is unknown.
            _ => Journaled::Uncertain,
        }
    }

    /// The turn's journal, read on first use: without a history cache, with the first page of
    /// the conversation in one read ([`Store::open_turn`]), the page kept for
    /// [`ConversationStore::history`].
    async fn known(&self) -> Result<&Mutex<Known>, JournalError> {
        self.known
            .get_or_try_init(|| async {
                let (store, session_id) = (&self.committer.store, &self.committer.session_id);
                let turn = if self.history_cache.is_some() {
                    store.turn_effects(session_id, &self.turn_id).await?
                } else {
                    let (page, turn) = store
                        .open_turn(session_id, &self.turn_id, corral_store::SHORT_PAGE)
                        .await?;
                    *lock(&self.first_items) = Some(page);
                    turn
                };
                Ok::<_, JournalError>(Mutex::new(Known::from(turn)))
            })
            .await
    }

    /// Journals `new` unless its id is journaled: then its state, or drift when it was
    /// journaled with another request. `Ok(None)`: it is new, and held for the next commit.
    async fn add_effect(&self, new: NewEffect) -> Result<Option<Journaled>, JournalError> {
        let mut known = lock(self.known().await?);
        if let Some(existing) = known.effects.get(&new.effect_id) {
            if !existing.journals(&self.committer.session_id, &new) {
                return Err(JournalError::Drift {
                    effect_id: new.effect_id,
                });
            }
            return Ok(Some(Self::existing(existing)));
        }
        known.add(
            new.clone()
                .into_effect(&self.committer.session_id, Timestamp::now()),
        );
        self.hold(|held| held.new_effects.push(new))?;
        Ok(None)
    }

    /// How long a result may wait for the journal's next commit ([`RESULT_WINDOW`] unless
    /// set): a longer window saves more commits and leaves a result in memory longer.
    pub fn with_result_window(mut self, window: std::time::Duration) -> Self {
        self.result_window = window;
        self
    }

    /// Starts from `turn`, the turn's journal as the caller read it under the same lease (with
    /// the lease's claim, say), instead of reading it on first use.
    pub fn with_turn_effects(self, turn: TurnEffects) -> Self {
        // Set once, on a journal not used yet: it cannot be set already.
        let _ = self.known.set(Mutex::new(Known::from(turn)));
        self
    }

    /// Leaves what the journal holds at the run's end to the caller, who takes it
    /// ([`StoreJournal::take_held`]) and commits it with the run's outcome in one transaction
    /// (`corral serve`'s `finish_segment`), instead of a commit of its own before the outcome's.
    pub fn leaving_its_end_to_the_caller(mut self) -> Self {
        self.caller_ends = true;
        self
    }

    /// Takes what the journal holds, as one commit under its fence (`None`: nothing is held),
    /// after any commit in flight; from then on the caller answers for it, as the journal's
    /// next commit would have. Fails with the journal's failure if a commit failed.
    pub async fn take_held(&self) -> Result<Option<SessionCommit>, JournalError> {
        let committer = &self.committer;
        let _committing = committer.committing.lock().await;
        let mut held = lock(&committer.held);
        if let Some(failure) = &held.failure {
            return Err(JournalError::Failed(failure.clone()));
        }
        if held.committed >= held.added {
            return Ok(None);
        }
        held.committed = held.added;
        let commit = committer.take(&mut held);
        let empty = commit.new_effects.is_empty()
            && commit.effects.is_empty()
            && commit.checkpoint.is_none()
            && commit.events.is_empty();
        Ok((!empty).then_some(commit))
    }

    /// Reads the conversation through `cache`: only what was added since this process last
    /// read the session, and from its last compaction on.
    pub fn with_history_cache(mut self, cache: Arc<HistoryCache>) -> Self {
        self.history_cache = Some(cache);
        self
    }

    /// Adds a write to the held ones.
    fn hold(&self, add: impl FnOnce(&mut Held)) -> Result<u64, JournalError> {
        self.committer.hold(add)
    }

    /// Adds a write and returns once it is committed, with whatever else is held.
    async fn hold_durable(&self, add: impl FnOnce(&mut Held)) -> Result<(), JournalError> {
        let ticket = self.hold(add)?;
        // Lets the script's other calls, started with this one, add theirs to the same commit.
        tokio::task::yield_now().await;
        self.commit_through(ticket).await
    }

    /// Adds a result and returns at once: it is committed with the journal's next commit, or
    /// at the end of its window if none comes first. A failure of that commit fails the
    /// journal's next write, like any failed commit.
    fn hold_result(&self, add: impl FnOnce(&mut Held)) -> Result<(), JournalError> {
        let mut start = false;
        self.hold(|held| {
            add(held);
            start = held.arm();
        })?;
        if start {
            self.commit_at_window_end();
        }
        Ok(())
    }

    /// Commits all that is held at the end of the result window (the caller armed the timer,
    /// [`Held::arm`]).
    fn commit_at_window_end(&self) {
        // Weak: a journal dropped without its run's end (the run's task aborted) loses what it
        // holds, as a process that dies does, and the store is not kept open past it.
        let committer = Arc::downgrade(&self.committer);
        let window = self.result_window;
        tokio::spawn(async move {
            tokio::time::sleep(window).await;
            let Some(committer) = committer.upgrade() else {
                return;
            };
            let upto = {
                let mut held = lock(&committer.held);
                held.timer_armed = false;
                held.added
            };
            // A failure is kept in `held.failure` and reported by the journal's next write.
            let _ = committer.commit_through(upto).await;
        });
    }

    async fn commit_through(&self, ticket: u64) -> Result<(), JournalError> {
        self.committer.commit_through(ticket).await
    }

    /// Holds the runtime's events back for the journal's next commit (see [`StoreJournal`]);
    /// with `now`, commits them (and everything held before them) before returning.
    pub async fn append_events(
        &self,
        events: Vec<NewEvent>,
        now: bool,
    ) -> Result<(), JournalError> {
        if events.is_empty() && !now {
            return Ok(());
        }
        let ticket = self.hold(|held| held.events.extend(events))?;
        if now {
            self.commit_through(ticket).await?;
        }
        Ok(())
    }

    async fn begin_effect(
        &self,
        effect_id: &str,
        new: NewEffect,
        action: Option<NewAction>,
        events: Vec<NewEvent>,
    ) -> Result<Journaled, JournalError> {
        // Work for an executor goes through the store's own step; what is held goes first.
        self.flush().await?;
        let mut begin = BeginEffect::new(self.committer.session_id.clone(), new);
        begin.fence = self.committer.fence.clone();
        begin.action = action;
        begin.events = events;
        let known = self.known().await?;
        match self.committer.store.begin_effect(begin).await {
            Ok(BeginEffectOutcome::Started { effect, .. }) => {
                lock(known).add(effect);
                Ok(Journaled::New)
            }
            Ok(BeginEffectOutcome::Existing(effect)) => Ok(Self::existing(&effect)),
            Ok(_) => Err(JournalError::Corrupt(format!(
                "effect {effect_id}: the store answered in a way this version does not know"
            ))),
            Err(StoreError::Conflict { .. }) => Err(JournalError::Drift {
                effect_id: effect_id.to_string(),
            }),
            Err(error) => Err(error.into()),
        }
    }

    /// Records a status change of a known effect, for later reads.
    async fn note(&self, effect_id: &str, status: EffectStatus, result: Option<Value>) {
        if let Ok(known) = self.known().await
            && let Some(effect) = lock(known).effects.get_mut(effect_id)
        {
            effect.status = status;
            if result.is_some() {
                effect.result = result;
            }
        }
    }
}

#[async_trait]
impl ConversationStore for StoreJournal {
    async fn history(&self) -> Result<Vec<ConversationItem>, JournalError> {
        let store = &*self.committer.store;
        let session_id = &self.committer.session_id;
        if let Some(cache) = &self.history_cache {
            return cache.history(store, session_id).await;
        }
        // The first page comes with the turn's journal, unless the journal was given.
        self.known().await?;
        let first = lock(&self.first_items).take();
        let items = match first {
            Some(page) => read_pages(store, session_id, page).await?,
            None => read_items(store, session_id, 0).await?,
        };
        Ok(items.into_iter().map(|read| read.item).collect())
    }

    async fn model_calls_before(&self, turn_id: &str) -> Result<u64, JournalError> {
        if turn_id != self.turn_id {
            // Not the turn this journal reads: ask the store.
            let turn = self
                .committer
                .store
                .turn_effects(&self.committer.session_id, turn_id)
                .await?;
            return Ok(turn.model_calls_elsewhere);
        }
        Ok(lock(self.known().await?).model_calls_elsewhere)
    }

    async fn begin(
        &self,
        turn_id: &str,
        effect_id: &str,
        kind: EffectKind,
        request: Value,
        action: Option<ActionRequest>,
    ) -> Result<Journaled, JournalError> {
        let Some(action) = action else {
            let new = NewEffect::new(effect_id, turn_id, kind, EffectStatus::Invoking, request);
            if let Some(existing) = self.add_effect(new).await? {
                return Ok(existing);
            }
            if kind == EffectKind::ModelCall {
                // Asking a model reaches nothing outside: its start goes with the journal's
                // next commit (see `StoreJournal`). Events held before it are not left waiting
                // on the model: they are committed within the result window.
                self.publish().await?;
                return Ok(Journaled::New);
            }
            // Durable before the caller performs it.
            self.hold_durable(|_| {}).await?;
            return Ok(Journaled::New);
        };
        let session = self
            .committer
            .store
            .get_session(&self.committer.session_id)
            .await?;
        let event = NewEvent::new(
            "action.pending",
            serde_json::json!({
                "actionId": effect_id,
                "kind": "action",
                "toolName": action.capability_id,
                "input": action.request.get("input").cloned().unwrap_or(Value::Null),
            }),
        )
        .in_turn(turn_id);
        let new_action = NewAction::new(
            session.agent_id,
            session.manifest_hash,
            session.implementation_version,
            action.capability_id,
            action.request,
        );
        let new = NewEffect::new(effect_id, turn_id, kind, EffectStatus::Pending, request);
        self.begin_effect(effect_id, new, Some(new_action), vec![event])
            .await
    }

    async fn record(
        &self,
        turn_id: &str,
        effect_id: &str,
        kind: EffectKind,
        request: Value,
        result: Value,
    ) -> Result<Journaled, JournalError> {
        let new = NewEffect::completed(effect_id, turn_id, kind, request, result);
        Ok(self.add_effect(new).await?.unwrap_or(Journaled::New))
    }

    async fn lookup(&self, effect_id: &str) -> Result<Option<Journaled>, JournalError> {
        let known = lock(self.known().await?);
        Ok(known.effects.get(effect_id).map(Self::existing))
    }

    async fn complete(&self, effect_id: &str, result: Value) -> Result<(), JournalError> {
        self.note(effect_id, EffectStatus::Completed, Some(result.clone()))
            .await;
        let transition = EffectTransition::new(
            effect_id,
            &[EffectStatus::Invoking],
            EffectStatus::Completed,
        )
        .with_result(result);
        self.hold_result(|held| held.transitions.push(transition))
    }

    async fn restart(&self, effect_id: &str) -> Result<(), JournalError> {
        self.note(effect_id, EffectStatus::Invoking, None).await;
        self.hold_durable(|held| {
            held.transitions.push(EffectTransition::new(
                effect_id,
                &[EffectStatus::Pending],
                EffectStatus::Invoking,
            ));
        })
        .await
    }

    async fn completed_with_prefix(
        &self,
        prefix: &str,
    ) -> Result<Vec<(String, Value)>, JournalError> {
        let known = lock(self.known().await?);
        Ok(known
            .order
            .iter()
            .filter(|id| id.starts_with(prefix))
            .filter_map(|id| known.effects.get(id))
            .filter(|e| e.status == EffectStatus::Completed)
            .map(|e| (e.effect_id.clone(), e.result.clone().unwrap_or(Value::Null)))
            .collect())
    }

    async fn save_checkpoint(&self, checkpoint: &SuspensionContext) -> Result<(), JournalError> {
        let data =
            serde_json::to_value(checkpoint).map_err(|e| JournalError::Corrupt(e.to_string()))?;
        let put = NewCheckpoint::new(checkpoint.turn_id.clone(), self.segment, data);
        self.hold_durable(|held| held.checkpoint = Some(CheckpointWrite::Put(put)))
            .await
    }

    async fn flush(&self) -> Result<(), JournalError> {
        // Everything added so far, a commit in flight included: it is waited for.
        let ticket = lock(&self.committer.held).added;
        self.commit_through(ticket).await
    }

    async fn end(&self) -> Result<(), JournalError> {
        if !self.caller_ends {
            return self.flush().await;
        }
        match &lock(&self.committer.held).failure {
            Some(failure) => Err(JournalError::Failed(failure.clone())),
            None => Ok(()),
        }
    }

    /// Events held go with the script's first durable write (its first call), else at the end
    /// of the result window: a commit of their own before every script cost a commit per turn
    /// (`bench/REPORT.md`, "A turn's store transactions, two fewer").
    async fn publish(&self) -> Result<(), JournalError> {
        let start = {
            let mut held = lock(&self.committer.held);
            if let Some(failure) = &held.failure {
                return Err(JournalError::Failed(failure.clone()));
            }
            if held.events.is_empty() {
                return Ok(());
            }
            held.arm()
        };
        if start {
            self.commit_at_window_end();
        }
        Ok(())
    }
}
