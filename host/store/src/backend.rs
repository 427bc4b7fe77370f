//! The one implementation of [`Store`]: every method is an [`engine`] transaction run by a
//! [`Backend`], which supplies only transactions (its SQL, behind [`Tx`]) and connections.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use async_trait::async_trait;
use futures::future::BoxFuture;
use tokio::sync::broadcast;

use crate::engine::{self, Tx};
use crate::error::StoreError;
use crate::feed::{EventNotice, Feed, WorkNotice};
use crate::machine::{
    self, CommandReceipt, SegmentEnd, SegmentOutcome, SegmentStart, SessionCommand,
};
use crate::model::{
    Action, ActionFilter, AgentDefinition, BeginEffect, BeginEffectOutcome, Checkpoint,
    ClaimAction, ClaimedAction, CommandRecord, CommitOutcome, CreatedSession, Effect, EffectStatus,
    Event, Fence, HeartbeatAction, ItemPage, Lease, NewAgent, NewEvent, NewSession,
    RetentionPolicy, RetentionReport, Session, SessionCommit, SessionCount, SessionFilter,
    SessionStatus, StoreBackend, TurnEffects,
};
use crate::store::Store;

/// What a database must supply: transactions and the change feed's broadcast.
pub(crate) trait Backend: Send + Sync + fmt::Debug + 'static {
    /// One open transaction.
    type Tx<'c>: Tx;

    /// Which implementation this is.
    const KIND: StoreBackend;

    /// The broadcast the backend publishes committed notices to.
    fn feed(&self) -> &Feed;

    /// Runs `work` in one transaction (`write` says whether it may write), commits it, and
    /// publishes its notices; rolls it back if `work` fails.
    fn transact<R, F>(
        &self,
        operation: &'static str,
        write: bool,
        work: F,
    ) -> impl Future<Output = Result<R, StoreError>> + Send
    where
        R: Send + 'static,
        F: for<'a, 'c> FnOnce(&'a mut Self::Tx<'c>) -> BoxFuture<'a, Result<R, StoreError>>
            + Send
            + 'static;
}

/// `run!(self, "op", write, |tx| engine_call)`: the engine call runs in one transaction; the
/// captured arguments must be owned.
macro_rules! run {
    ($store:expr, $operation:expr, $write:expr, |$tx:ident| $body:expr) => {{
        $store.feed().count_transaction();
        $store
            .transact($operation, $write, move |$tx| {
                Box::pin(async move { $body.await })
            })
            .await
    }};
}

/// The name of an operation that reads a page of `limit` items: `long` past
/// [`crate::SHORT_PAGE`], so that the embedded store runs only a short page on the calling task
/// (`sqlite::INLINE_OPERATIONS`).
fn paged(limit: usize, short: &'static str, long: &'static str) -> &'static str {
    if limit <= crate::SHORT_PAGE {
        short
    } else {
        long
    }
}

#[async_trait]
impl<B: Backend> Store for B {
    fn backend(&self) -> StoreBackend {
        B::KIND
    }

    fn transactions(&self) -> u64 {
        self.feed().transactions()
    }

    fn subscribe_events(&self) -> broadcast::Receiver<EventNotice> {
        self.feed().subscribe_events()
    }

    fn subscribe_work(&self) -> broadcast::Receiver<WorkNotice> {
        self.feed().subscribe_work()
    }

    async fn ping(&self) -> Result<(), StoreError> {
        run!(self, "ping", false, |tx| engine::ping(tx))
    }

    async fn put_agent(&self, agent: NewAgent) -> Result<AgentDefinition, StoreError> {
        run!(self, "put_agent", true, |tx| engine::put_agent(tx, agent))
    }

    async fn get_agent(&self, agent_id: &str) -> Result<AgentDefinition, StoreError> {
        let agent_id = agent_id.to_owned();
        run!(self, "get_agent", false, |tx| engine::get_agent(
            tx, &agent_id
        ))
    }

    async fn list_agents(&self) -> Result<Vec<AgentDefinition>, StoreError> {
        run!(self, "list_agents", false, |tx| engine::list_agents(tx))
    }

    async fn create_session(&self, session: NewSession) -> Result<CreatedSession, StoreError> {
        run!(self, "create_session", true, |tx| engine::create_session(
            tx, session
        ))
    }

    async fn get_session(&self, session_id: &str) -> Result<Session, StoreError> {
        let session_id = session_id.to_owned();
        run!(self, "get_session", false, |tx| engine::get_session(
            tx,
            &session_id
        ))
    }

    async fn list_sessions(&self, filter: &SessionFilter) -> Result<Vec<Session>, StoreError> {
        let filter = filter.clone();
        run!(self, "list_sessions", false, |tx| engine::list_sessions(
            tx, &filter
        ))
    }

    async fn commit(&self, commit: SessionCommit) -> Result<CommitOutcome, StoreError> {
        run!(self, "commit", true, |tx| engine::commit(tx, commit))
    }

    async fn append_event(
        &self,
        session_id: &str,
        fence: Option<&Fence>,
        event: NewEvent,
    ) -> Result<Event, StoreError> {
        let session_id = session_id.to_owned();
        let fence = fence.cloned();
        run!(self, "append_event", true, |tx| engine::append_event(
            tx,
            &session_id,
            fence,
            event
        ))
    }

    async fn list_events(
        &self,
        session_id: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<Event>, StoreError> {
        let session_id = session_id.to_owned();
        run!(self, "list_events", false, |tx| engine::list_events(
            tx,
            &session_id,
            after,
            limit
        ))
    }

    async fn page_items(
        &self,
        session_id: &str,
        after: u64,
        limit: usize,
    ) -> Result<ItemPage, StoreError> {
        let session_id = session_id.to_owned();
        let operation = paged(limit, "page_items", "page_items (long)");
        run!(self, operation, false, |tx| engine::page_items(
            tx,
            &session_id,
            after,
            limit
        ))
    }

    async fn live_checkpoint(&self, session_id: &str) -> Result<Option<Checkpoint>, StoreError> {
        let session_id = session_id.to_owned();
        run!(
            self,
            "live_checkpoint",
            false,
            |tx| engine::live_checkpoint(tx, &session_id)
        )
    }

    async fn get_command(
        &self,
        session_id: &str,
        idempotency_key: &str,
    ) -> Result<Option<CommandRecord>, StoreError> {
        let session_id = session_id.to_owned();
        let key = idempotency_key.to_owned();
        run!(self, "get_command", false, |tx| engine::get_command(
            tx,
            &session_id,
            &key
        ))
    }

    async fn begin_effect(&self, begin: BeginEffect) -> Result<BeginEffectOutcome, StoreError> {
        run!(self, "begin_effect", true, |tx| engine::begin_effect(
            tx, begin
        ))
    }

    async fn get_effect(&self, effect_id: &str) -> Result<Effect, StoreError> {
        let effect_id = effect_id.to_owned();
        run!(self, "get_effect", false, |tx| engine::get_effect(
            tx, &effect_id
        ))
    }

    async fn list_effects(
        &self,
        session_id: &str,
        status: Option<EffectStatus>,
    ) -> Result<Vec<Effect>, StoreError> {
        let session_id = session_id.to_owned();
        run!(self, "list_effects", false, |tx| engine::list_effects(
            tx,
            &session_id,
            status
        ))
    }

    async fn turn_effects(
        &self,
        session_id: &str,
        turn_id: &str,
    ) -> Result<TurnEffects, StoreError> {
        let (session_id, turn_id) = (session_id.to_owned(), turn_id.to_owned());
        run!(self, "turn_effects", false, |tx| engine::turn_effects(
            tx,
            &session_id,
            &turn_id
        ))
    }

    async fn open_turn(
        &self,
        session_id: &str,
        turn_id: &str,
        limit: usize,
    ) -> Result<(ItemPage, TurnEffects), StoreError> {
        let (session_id, turn_id) = (session_id.to_owned(), turn_id.to_owned());
        let operation = paged(limit, "open_turn", "open_turn (long)");
        run!(self, operation, false, |tx| engine::open_turn(
            tx,
            &session_id,
            &turn_id,
            limit
        ))
    }

    async fn get_action(&self, action_id: &str) -> Result<Action, StoreError> {
        let action_id = action_id.to_owned();
        run!(self, "get_action", false, |tx| engine::get_action(
            tx, &action_id
        ))
    }

    async fn list_actions(&self, filter: &ActionFilter) -> Result<Vec<Action>, StoreError> {
        let filter = filter.clone();
        run!(self, "list_actions", false, |tx| engine::list_actions(
            tx, &filter
        ))
    }

    async fn claim_action(&self, claim: ClaimAction) -> Result<ClaimedAction, StoreError> {
        run!(self, "claim_action", true, |tx| engine::claim_action(
            tx, claim
        ))
    }

    async fn heartbeat_action(&self, heartbeat: HeartbeatAction) -> Result<Action, StoreError> {
        run!(self, "heartbeat_action", true, |tx| {
            engine::heartbeat_action(tx, heartbeat)
        })
    }

    async fn expire_action_claims(&self) -> Result<Vec<Action>, StoreError> {
        run!(self, "expire_action_claims", true, |tx| {
            engine::expire_action_claims(tx)
        })
    }

    async fn claim_runnable_session(
        &self,
        replica_id: &str,
        lease: Duration,
    ) -> Result<Option<Lease>, StoreError> {
        let replica_id = replica_id.to_owned();
        run!(self, "claim_runnable_session", true, |tx| {
            engine::claim_runnable_session(tx, &replica_id, lease)
        })
    }

    async fn acquire_session(
        &self,
        session_id: &str,
        replica_id: &str,
        lease: Duration,
    ) -> Result<Lease, StoreError> {
        let session_id = session_id.to_owned();
        let replica_id = replica_id.to_owned();
        run!(self, "acquire_session", true, |tx| {
            engine::acquire_session(tx, &session_id, &replica_id, lease)
        })
    }

    async fn renew_lease(&self, fence: &Fence, lease: Duration) -> Result<Lease, StoreError> {
        let fence = fence.clone();
        run!(self, "renew_lease", true, |tx| engine::renew_lease(
            tx, fence, lease
        ))
    }

    async fn release_lease(&self, fence: &Fence) -> Result<(), StoreError> {
        let fence = fence.clone();
        run!(self, "release_lease", true, |tx| engine::release_lease(
            tx, fence
        ))
    }

    async fn apply_retention(
        &self,
        policy: &RetentionPolicy,
    ) -> Result<RetentionReport, StoreError> {
        let policy = policy.clone();
        run!(self, "apply_retention", true, |tx| engine::apply_retention(
            tx, &policy
        ))
    }

    async fn recover_in_flight_effects(
        &self,
        reason: &str,
        leased_too: bool,
    ) -> Result<usize, StoreError> {
        let reason = reason.to_owned();
        let takeover = if leased_too {
            engine::Takeover::Every
        } else {
            engine::Takeover::Expired
        };
        run!(self, "recover_in_flight_effects", true, |tx| {
            engine::recover_in_flight_effects(tx, &reason, takeover)
        })
    }

    async fn recover_replica_leases(
        &self,
        reason: &str,
        replica_id: &str,
    ) -> Result<usize, StoreError> {
        let (reason, replica_id) = (reason.to_owned(), replica_id.to_owned());
        run!(self, "recover_replica_leases", true, |tx| {
            engine::recover_in_flight_effects(tx, &reason, engine::Takeover::HeldBy(&replica_id))
        })
    }

    async fn run_command(&self, command: SessionCommand) -> Result<CommandReceipt, StoreError> {
        run!(self, "run_command", true, |tx| machine::run_command(
            tx, command
        ))
    }

    async fn start_segment(
        &self,
        replica_id: &str,
        lease: Duration,
    ) -> Result<SegmentStart, StoreError> {
        let replica_id = replica_id.to_owned();
        run!(self, "start_segment", true, |tx| machine::start_segment(
            tx,
            &replica_id,
            lease
        ))
    }

    async fn finish_segment(
        &self,
        fence: &Fence,
        turn_id: &str,
        held: Option<SessionCommit>,
        outcome: SegmentOutcome,
        in_flight_reason: Option<&str>,
    ) -> Result<(SegmentEnd, usize), StoreError> {
        let fence = fence.clone();
        let turn_id = turn_id.to_owned();
        let reason = in_flight_reason.map(str::to_owned);
        run!(self, "finish_segment", true, |tx| machine::finish_segment(
            tx, fence, turn_id, held, outcome, reason
        ))
    }

    async fn count_sessions(
        &self,
        statuses: &[SessionStatus],
    ) -> Result<Vec<SessionCount>, StoreError> {
        let statuses = statuses.to_vec();
        run!(self, "count_sessions", false, |tx| engine::count_sessions(
            tx, &statuses
        ))
    }

    async fn page_sessions(
        &self,
        filter: &SessionFilter,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Session>, StoreError> {
        let filter = filter.clone();
        let after = after.map(str::to_owned);
        run!(self, "page_sessions", false, |tx| engine::page_sessions(
            tx,
            &filter,
            after.as_deref(),
            limit
        ))
    }

    async fn session_counts(
        &self,
        filter: &SessionFilter,
    ) -> Result<Vec<(String, u64)>, StoreError> {
        let filter = filter.clone();
        let counts = run!(self, "session_counts", false, |tx| engine::session_counts(
            tx, &filter
        ))?;
        Ok(counts
            .into_iter()
            .map(|(status, n)| (status, u64::try_from(n).unwrap_or(0)))
            .collect())
    }

    async fn erase_session(&self, id: &str, cancel: bool) -> Result<Session, StoreError> {
        let id = id.to_owned();
        run!(self, "erase_session", true, |tx| engine::erase_session(
            tx, &id, cancel
        ))
    }
}
