//! The storage trait every backend implements.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;

use crate::error::StoreError;
use crate::feed::{EventNotice, WorkNotice};
use crate::machine::{CommandReceipt, SegmentEnd, SegmentOutcome, SegmentStart, SessionCommand};
use crate::model::{
    Action, ActionFilter, AgentDefinition, BeginEffect, BeginEffectOutcome, Checkpoint,
    ClaimAction, ClaimedAction, CommandRecord, CommitOutcome, CreatedSession, Effect, EffectStatus,
    Event, Fence, HeartbeatAction, ItemPage, Lease, NewAgent, NewEvent, NewSession,
    RetentionPolicy, RetentionReport, Session, SessionCommit, SessionCount, SessionFilter,
    SessionStatus, StoreBackend, TurnEffects,
};

/// Everything durable in corral, behind one interface.
///
/// Every method is one transaction: it commits entirely or not at all. Methods that write to a
/// session take the session's row lock first, so writes to one session are serialized and its
/// event cursor stays gap-free whatever the concurrency. Writes carrying a [`Fence`] succeed only
/// while that lease is current and unexpired, checked in the same transaction as the write.
///
/// Use it as `Arc<dyn Store>`; [`crate::SqliteStore`] and [`crate::PostgresStore`] behave
/// identically (one conformance suite runs against both).
#[async_trait]
pub trait Store: Send + Sync + fmt::Debug {
    /// Which implementation this is.
    fn backend(&self) -> StoreBackend;

    /// How many transactions (reads and writes, each one round of the store's own) this
    /// handle has begun: what benchmarks count per turn.
    fn transactions(&self) -> u64;

    /// A notice for every event appended to any session, sent after its transaction commits.
    ///
    /// A subscriber (an SSE stream) keeps the cursor of the last event it delivered and, when a
    /// notice for its session arrives with a greater cursor, reads the events after its cursor
    /// with [`Store::list_events`]; it never polls. Notices may arrive more than once, and a
    /// receiver that falls more than the channel's capacity behind gets
    /// [`tokio::sync::broadcast::error::RecvError::Lagged`]: it must then re-read its session
    /// from its last cursor (events are never lost, only notices). Subscribe before reading the
    /// history, so that nothing appended in between goes unnoticed.
    ///
    /// On PostgreSQL the notices of other replicas' stores on the same database arrive too
    /// (`LISTEN`/`NOTIFY`); after the listening connection was lost and re-established, a notice
    /// of each session's newest cursor is sent for every session written meanwhile.
    fn subscribe_events(&self) -> tokio::sync::broadcast::Receiver<EventNotice>;

    /// Fires after a commit that created an action or made one claimable again (pending).
    /// Like [`Store::subscribe_events`], across replicas on PostgreSQL; a lagged receiver should
    /// list the pending actions.
    fn subscribe_work(&self) -> tokio::sync::broadcast::Receiver<WorkNotice>;

    /// Checks that the database answers (for readiness probes).
    async fn ping(&self) -> Result<(), StoreError>;

    /// Registers an agent definition or replaces the one with the same id.
    async fn put_agent(&self, agent: NewAgent) -> Result<AgentDefinition, StoreError>;

    /// The agent definition `agent_id`; [`StoreError::NotFound`] if unknown.
    async fn get_agent(&self, agent_id: &str) -> Result<AgentDefinition, StoreError>;

    /// All agent definitions, by id.
    async fn list_agents(&self) -> Result<Vec<AgentDefinition>, StoreError>;

    /// Creates a session from its registered agent, idempotently: an existing session with equal
    /// tenant, user, agent and creation parameters is returned as is; one with different ones is a
    /// [`StoreError::Conflict`]. An unknown agent is [`StoreError::NotFound`].
    async fn create_session(&self, session: NewSession) -> Result<CreatedSession, StoreError>;

    /// The session `session_id`; [`StoreError::NotFound`] if unknown.
    async fn get_session(&self, session_id: &str) -> Result<Session, StoreError>;

    /// Sessions matching `filter`, by id.
    async fn list_sessions(&self, filter: &SessionFilter) -> Result<Vec<Session>, StoreError>;

    /// Applies one atomic change to a session: guarded effect and action transitions, the session
    /// patch, items, events, the live checkpoint and the command record commit together.
    ///
    /// Guards, checked in this order before anything is written:
    /// - a command whose idempotency key is already recorded for this session returns
    ///   [`CommitOutcome::Replayed`] with its first response if the bodies are equal (even after
    ///   the session itself was deleted by retention), and [`StoreError::Conflict`] otherwise;
    /// - [`StoreError::NotFound`] if the session does not exist;
    /// - [`StoreError::StaleGeneration`] if `fence` is set and is not the current, unexpired lease;
    /// - [`StoreError::Conflict`] if `expect_version` is set and differs from the session's
    ///   version;
    /// - each effect and action transition's own guard.
    ///
    /// On success the session's version increases by one.
    async fn commit(&self, commit: SessionCommit) -> Result<CommitOutcome, StoreError>;

    /// Appends one event (a commit holding only that event).
    async fn append_event(
        &self,
        session_id: &str,
        fence: Option<&Fence>,
        event: NewEvent,
    ) -> Result<Event, StoreError>;

    /// Up to `limit` events with a cursor greater than `after` (0 for the start), in order.
    /// A cursor beyond the newest event is [`StoreError::InvalidCursor`]; `limit` must be
    /// 1..=[`crate::MAX_PAGE`].
    async fn list_events(
        &self,
        session_id: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<Event>, StoreError>;

    /// Up to `limit` conversation items with a sequence number greater than `after`, in order;
    /// `limit` must be 1..=[`crate::MAX_PAGE`]. A page of at most [`crate::SHORT_PAGE`] items is
    /// cheap enough for the embedded store to read on the caller's task.
    async fn page_items(
        &self,
        session_id: &str,
        after: u64,
        limit: usize,
    ) -> Result<ItemPage, StoreError>;

    /// The session's live checkpoint, if it has one.
    async fn live_checkpoint(&self, session_id: &str) -> Result<Option<Checkpoint>, StoreError>;

    /// The command recorded under `idempotency_key` for `session_id`, if any.
    async fn get_command(
        &self,
        session_id: &str,
        idempotency_key: &str,
    ) -> Result<Option<CommandRecord>, StoreError>;

    /// Journals an effect under its stable id, with its action and events, unless it exists:
    /// then it returns [`BeginEffectOutcome::Existing`] without writing anything, so a completed
    /// effect is never performed twice. An existing effect with a different kind, turn or request
    /// is a [`StoreError::Conflict`].
    async fn begin_effect(&self, begin: BeginEffect) -> Result<BeginEffectOutcome, StoreError>;

    /// The effect `effect_id`; [`StoreError::NotFound`] if unknown.
    async fn get_effect(&self, effect_id: &str) -> Result<Effect, StoreError>;

    /// The session's effects, optionally only those in `status`, in journal order.
    async fn list_effects(
        &self,
        session_id: &str,
        status: Option<EffectStatus>,
    ) -> Result<Vec<Effect>, StoreError>;

    /// What a run of `turn_id` needs of the journal, in one read: the turn's effects in journal
    /// order, and how many model calls the session's other turns journaled. It reads the turn's
    /// entries only (effect ids are the turn's), so a long session's run does not read its whole
    /// past. [`StoreError::NotFound`] if the session is unknown.
    async fn turn_effects(
        &self,
        session_id: &str,
        turn_id: &str,
    ) -> Result<TurnEffects, StoreError>;

    /// What a run of `turn_id` reads first, in one transaction: [`Store::turn_effects`] and the
    /// first page of the conversation's items ([`Store::page_items`] after 0, at most `limit`).
    /// A run that reads both apart makes one transaction more per turn.
    async fn open_turn(
        &self,
        session_id: &str,
        turn_id: &str,
        limit: usize,
    ) -> Result<(ItemPage, TurnEffects), StoreError>;

    /// The action `action_id`; [`StoreError::NotFound`] if unknown.
    async fn get_action(&self, action_id: &str) -> Result<Action, StoreError>;

    /// Actions matching `filter`, oldest first.
    async fn list_actions(&self, filter: &ActionFilter) -> Result<Vec<Action>, StoreError>;

    /// An executor claims a pending action: its generation increases, the claim gets a lease, and
    /// an `action.claimed` event (`{"actionId", "generation"}`) is appended. A definition other
    /// than the action's, an action not pending, or a session no longer on the action's turn
    /// (or cancelled) is a [`StoreError::Conflict`].
    async fn claim_action(&self, claim: ClaimAction) -> Result<ClaimedAction, StoreError>;

    /// Extends a claim's lease. A claim that is not the current one, or that has expired, is
    /// [`StoreError::StaleGeneration`].
    async fn heartbeat_action(&self, heartbeat: HeartbeatAction) -> Result<Action, StoreError>;

    /// Every claimed action whose lease expired becomes [`crate::ActionStatus::Uncertain`], with
    /// its effect. For those of their session's active turn (unless cancelled) the session becomes
    /// uncertain and an `action.uncertain` event (`{"actionId"}`) is appended. Returns the
    /// actions changed.
    async fn expire_action_claims(&self) -> Result<Vec<Action>, StoreError>;

    /// Claims the oldest runnable session (status runnable or running) that no replica holds an
    /// unexpired lease on, with `FOR UPDATE SKIP LOCKED` semantics: two replicas never win the
    /// same session. The new lease has the next fencing generation. `None` when there is none.
    ///
    /// A session taken over while `running` may have effects in flight: call
    /// [`Store::mark_in_flight_effects_uncertain`] before resuming it.
    async fn claim_runnable_session(
        &self,
        replica_id: &str,
        lease: Duration,
    ) -> Result<Option<Lease>, StoreError>;

    /// Takes ownership of one session whatever its status, if no other replica holds an
    /// unexpired lease on it ([`StoreError::Conflict`] otherwise). If `replica_id` already holds
    /// it, the lease is extended at the same generation.
    async fn acquire_session(
        &self,
        session_id: &str,
        replica_id: &str,
        lease: Duration,
    ) -> Result<Lease, StoreError>;

    /// Extends a current, unexpired lease ([`StoreError::StaleGeneration`] otherwise).
    async fn renew_lease(&self, fence: &Fence, lease: Duration) -> Result<Lease, StoreError>;

    /// Gives up a lease so that another replica may claim the session at once. Releasing a lease
    /// that was taken over is [`StoreError::StaleGeneration`].
    async fn release_lease(&self, fence: &Fence) -> Result<(), StoreError>;

    /// Deletes expired closed sessions (per tenant), prunes superseded checkpoints and
    /// idempotency records older than the window. A deleted session takes its items, events,
    /// checkpoints, effects and actions with it; its idempotency records stay for the window.
    async fn apply_retention(
        &self,
        policy: &RetentionPolicy,
    ) -> Result<RetentionReport, StoreError>;

    /// Start-up recovery, in one transaction: every effect still [`EffectStatus::Invoking`]
    /// becomes uncertain with `reason`; for those of a session's active turn (unless cancelled)
    /// the session becomes uncertain and an `effect.uncertain` event is appended, and the
    /// session's lease is released so that it can be claimed at once. Sessions some replica
    /// holds an unexpired lease on are skipped unless `leased_too` (the embedded store's single
    /// owner passes `true` at start: every lease in its file belongs to a dead process).
    /// Returns how many effects became uncertain.
    async fn recover_in_flight_effects(
        &self,
        reason: &str,
        leased_too: bool,
    ) -> Result<usize, StoreError>;

    /// [`Store::recover_in_flight_effects`] for a replica that restarts under a stable name:
    /// besides expired leases, it takes over at once the leases `replica_id` (its previous
    /// incarnation) still holds, since that process is gone.
    async fn recover_replica_leases(
        &self,
        reason: &str,
        replica_id: &str,
    ) -> Result<usize, StoreError>;

    /// Runs one command of the session state machine in one transaction: the idempotency
    /// check, the command's rules, its transitions, checkpoint and events, and its record.
    ///
    /// - `message` needs a settled session (idle, completed, failed, cancelled): it starts the
    ///   turn, writes its checkpoint (segment 0) and makes the session runnable;
    /// - `approve` / `respond` need the session paused on that interaction (of kind `approval` /
    ///   `input`): the decision goes into the next segment's checkpoint, the session runnable;
    /// - `cancel`: the active turn's pending actions become cancelled, claimed ones uncertain
    ///   (with their effects), its other effects in flight uncertain; the session cancelled;
    /// - `action_result`: the claim must be the action's current, unexpired one and its turn
    ///   the active one; the action and its effect complete, the session becomes runnable
    ///   (unless uncertain). The same result under another key answers the first receipt;
    /// - `resolve`: the effect must be uncertain and of the active turn; retry makes it (and
    ///   its action, claim cleared) pending, an outcome completes both; the session goes on
    ///   once nothing of its turn is uncertain.
    ///
    /// A replayed key with the same body answers the first response (nothing written); with
    /// another body it is a [`StoreError::Conflict`] on [`crate::Entity::Command`]. A rule
    /// that does not hold is a [`StoreError::Conflict`] (or [`StoreError::StaleGeneration`]
    /// for a claim), an unknown record [`StoreError::NotFound`].
    async fn run_command(&self, command: SessionCommand) -> Result<CommandReceipt, StoreError>;

    /// The scheduler's step, one transaction: claims the oldest runnable session no replica
    /// holds (`FOR UPDATE SKIP LOCKED`: two replicas never win the same one) under a new lease
    /// with the next fencing generation, marks what a previous holder left in flight
    /// uncertain, reads the turn's checkpoint and marks the session running. A session with
    /// nothing to run (uncertain now, or no readable checkpoint: its turn fails) is released in
    /// the same transaction.
    async fn start_segment(
        &self,
        replica_id: &str,
        lease: Duration,
    ) -> Result<SegmentStart, StoreError>;

    /// Ends a segment in one transaction under its fence (an expired lease still works while
    /// nobody took over): `held`, what the run's journal still held (a commit of the session,
    /// guarded as [`Store::commit`] guards it: under its own fence the lease must be live; it
    /// answers no command), is applied first, and its failure fails the whole; with `in_flight_reason`, its effects
    /// still in flight become uncertain (a shutdown); the outcome is applied if `turn_id` is
    /// still the active, uncancelled turn (completion appends the items and clears the
    /// checkpoint; a pause keeps the checkpoint the turn engine wrote), and if the turn was
    /// cancelled meanwhile, what the held writes leave in flight becomes uncertain, as the
    /// cancel made what was in flight then; the lease is released.
    /// Returns what happened and how many effects became uncertain.
    async fn finish_segment(
        &self,
        fence: &Fence,
        turn_id: &str,
        held: Option<SessionCommit>,
        outcome: SegmentOutcome,
        in_flight_reason: Option<&str>,
    ) -> Result<(SegmentEnd, usize), StoreError>;

    /// Sessions in `statuses`, counted by tenant, agent and status (one grouped query, for
    /// `/metrics`' gauges); groups with no session are absent.
    async fn count_sessions(
        &self,
        statuses: &[SessionStatus],
    ) -> Result<Vec<SessionCount>, StoreError>;

    /// Up to `limit` sessions matching `filter` whose id is greater than `after` (`None` for
    /// the start), by id: keyset paging, each page one index range scan. Pass the last id of a
    /// page as the next `after`; a page shorter than `limit` is the last one.
    async fn page_sessions(
        &self,
        filter: &SessionFilter,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Session>, StoreError>;

    /// How many sessions matching `filter` (its statuses ignored) are in each status, by
    /// status name.
    async fn session_counts(
        &self,
        filter: &SessionFilter,
    ) -> Result<Vec<(String, u64)>, StoreError>;

    /// Erases session `id` and everything stored for it, in one transaction; returns the row as
    /// it was. A session that is not settled (a turn running, paused, waiting or uncertain) is a
    /// [`StoreError::Conflict`] unless `cancel`.
    async fn erase_session(&self, id: &str, cancel: bool) -> Result<Session, StoreError>;
}
