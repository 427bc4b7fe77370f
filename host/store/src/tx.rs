//! Row-level operations inside one open transaction ([`Tx`]), written once over the few
//! primitives a backend supplies: run a statement, hand over a write whose outcome nobody reads,
//! run queries (together, in one round trip, on PostgreSQL) and the transaction's clock. A
//! backend overrides an operation only where its SQL truly differs: PostgreSQL's row lock,
//! `SKIP LOCKED` claim and server clock.

use std::collections::BTreeMap;
use std::future::Future;

use crate::engine::{BATCH, counter, status_list};
use crate::error::{Entity, StoreError};
use crate::feed::Notice;
use crate::model::{
    Action, ActionFilter, AgentDefinition, Checkpoint, CommandRecord, Effect, EffectKind,
    EffectStatus, Event, Item, NewAgent, NewCheckpoint, Session, SessionCount, SessionFilter,
    SessionStatus, Timestamp, TurnEffects,
};
use crate::sql::{self, Param, Row, Sql, args};

/// One query: its statement, parameters and row decoder.
pub(crate) struct Query<'a, T> {
    pub(crate) operation: &'static str,
    pub(crate) sql: Sql,
    pub(crate) params: Vec<Param<'a>>,
    pub(crate) decode: fn(&dyn Row) -> Result<T, StoreError>,
}

/// A row of a [`Reads`] batch.
pub(crate) enum Fetched {
    /// The session, with the server's clock read under its lock (PostgreSQL).
    Session(Box<Session>, Option<Timestamp>),
    Command(CommandRecord),
    Effect(Effect),
    Action(Action),
    Checkpoint(Checkpoint),
    /// One of the effects [`Reads::effects_in`] asked for.
    InStatus(Effect),
    /// One of the session's actions ([`Reads::session_actions`]).
    SessionAction(Action),
    /// One of [`Reads::turn`]'s effects.
    TurnEffect(Effect),
    /// How many model calls the session's other turns journaled ([`Reads::turn`]).
    ModelCallsElsewhere(i64),
}

/// Reads a transaction makes together, about one session, after locking it if asked: they do
/// not depend on each other, so PostgreSQL sends them in one flight behind the lock (and the
/// server runs them in order, each after the lock is granted).
#[derive(Debug, Default)]
pub(crate) struct Reads<'a> {
    pub(crate) session_id: &'a str,
    /// Lock the session's row first, and return the session.
    pub(crate) lock: bool,
    /// The command recorded under this idempotency key.
    pub(crate) command: Option<&'a str>,
    /// Effects by id.
    pub(crate) effects: Vec<&'a str>,
    /// Actions by id.
    pub(crate) actions: Vec<&'a str>,
    /// The session's live checkpoint.
    pub(crate) checkpoint: bool,
    /// Effects by their status.
    pub(crate) effects_in: Option<EffectsIn<'a>>,
    /// All of the session's actions.
    pub(crate) session_actions: bool,
    /// This turn's journal ([`TurnEffects`]).
    pub(crate) turn: Option<&'a str>,
}

/// Which effects [`Reads::effects_in`] reads by their status, each through an index that a
/// turn's writes do not rewrite at every step.
#[derive(Clone, Copy, Debug)]
pub(crate) enum EffectsIn<'a> {
    /// A turn's effects left `invoking`: this turn's, or with `None` the session's active
    /// turn's (read in the same flight as the session). Only a turn's run has effects in flight.
    Invoking(Option<&'a str>),
    /// The session's `uncertain` effects, of any turn.
    Uncertain,
}

impl<'a> EffectsIn<'a> {
    fn query(self, session_id: &'a str) -> (Sql, Vec<Param<'a>>) {
        match self {
            EffectsIn::Invoking(turn) => (sql::TURN_EFFECTS_INVOKING, args![session_id, turn]),
            EffectsIn::Uncertain => (sql::SESSION_EFFECTS_UNCERTAIN, args![session_id]),
        }
    }
}

impl<'a> Reads<'a> {
    /// Locks `session_id` and reads nothing else.
    pub(crate) fn locking(session_id: &'a str) -> Self {
        Self {
            session_id,
            lock: true,
            ..Self::default()
        }
    }

    /// The queries after the lock.
    pub(crate) fn queries(&self) -> Vec<Query<'a, Fetched>> {
        let mut queries = Vec::new();
        if let Some(key) = self.command {
            queries.push(Query {
                operation: "read a command",
                sql: sql::COMMAND,
                params: args![self.session_id, key],
                decode: |row| sql::decode_command(row).map(Fetched::Command),
            });
        }
        for id in &self.effects {
            queries.push(Query {
                operation: "read an effect",
                sql: sql::EFFECT,
                params: args![*id],
                decode: |row| sql::decode_effect(row).map(Fetched::Effect),
            });
        }
        for id in &self.actions {
            queries.push(Query {
                operation: "read an action",
                sql: sql::ACTION,
                params: args![*id],
                decode: |row| sql::decode_action(row).map(Fetched::Action),
            });
        }
        if self.checkpoint {
            queries.push(Query {
                operation: "read the live checkpoint",
                sql: sql::LIVE_CHECKPOINT,
                params: args![self.session_id],
                decode: |row| sql::decode_checkpoint(row).map(Fetched::Checkpoint),
            });
        }
        if let Some(which) = self.effects_in {
            let (sql, params) = which.query(self.session_id);
            queries.push(Query {
                operation: "list effects",
                sql,
                params,
                decode: |row| sql::decode_effect(row).map(Fetched::InStatus),
            });
        }
        if self.session_actions {
            queries.push(Query {
                operation: "list actions",
                sql: sql::LIST_ACTIONS,
                params: args![
                    Some(self.session_id),
                    None::<&str>,
                    None::<&str>,
                    None::<&str>
                ],
                decode: |row| sql::decode_action(row).map(Fetched::SessionAction),
            });
        }
        if let Some(turn) = self.turn {
            queries.extend(turn_queries(
                self.session_id,
                turn,
                |row| sql::decode_effect(row).map(Fetched::TurnEffect),
                |row| row.int(0).map(Fetched::ModelCallsElsewhere),
            ));
        }
        queries
    }
}

/// A turn's journal ([`TurnEffects`]): its effects, and the count of the session's model
/// calls in its other turns, each row decoded as the caller's `T`.
fn turn_queries<'a, T>(
    session_id: &'a str,
    turn_id: &'a str,
    effect: fn(&dyn Row) -> Result<T, StoreError>,
    count: fn(&dyn Row) -> Result<T, StoreError>,
) -> [Query<'a, T>; 2] {
    [
        Query {
            operation: "list a turn's effects",
            sql: sql::TURN_EFFECTS,
            params: args![session_id, turn_id],
            decode: effect,
        },
        Query {
            operation: "count the other turns' model calls",
            sql: sql::EFFECTS_OF_KIND_ELSEWHERE,
            params: args![session_id, turn_id, EffectKind::ModelCall.as_str()],
            decode: count,
        },
    ]
}

/// What [`Tx::read`] found.
#[derive(Debug, Default)]
pub(crate) struct Found {
    pub(crate) session: Option<Session>,
    /// The server's clock read under the lock (PostgreSQL).
    pub(crate) clock: Option<Timestamp>,
    pub(crate) command: Option<CommandRecord>,
    /// Every effect id asked for: `None` if it does not exist.
    pub(crate) effects: BTreeMap<String, Option<Effect>>,
    /// Every action id asked for: `None` if it does not exist.
    pub(crate) actions: BTreeMap<String, Option<Action>>,
    pub(crate) checkpoint: Option<Checkpoint>,
    /// The effects [`Reads::effects_in`] asked for.
    pub(crate) in_status: Vec<Effect>,
    /// The session's actions, when [`Reads::session_actions`] asked for them.
    pub(crate) session_actions: Vec<Action>,
    /// [`Reads::turn`]'s journal, when asked for.
    pub(crate) turn: Option<TurnEffects>,
}

impl Found {
    pub(crate) fn new(reads: &Reads<'_>, rows: Vec<Vec<Fetched>>) -> Self {
        let mut found = Found::default();
        for id in &reads.effects {
            found.effects.insert((*id).to_owned(), None);
        }
        for id in &reads.actions {
            found.actions.insert((*id).to_owned(), None);
        }
        for row in rows.into_iter().flatten() {
            match row {
                Fetched::Session(session, clock) => {
                    found.session = Some(*session);
                    found.clock = clock;
                }
                Fetched::Command(command) => found.command = Some(command),
                Fetched::Effect(effect) => {
                    found.effects.insert(effect.effect_id.clone(), Some(effect));
                }
                Fetched::Action(action) => {
                    found.actions.insert(action.action_id.clone(), Some(action));
                }
                Fetched::Checkpoint(checkpoint) => found.checkpoint = Some(checkpoint),
                Fetched::InStatus(effect) => found.in_status.push(effect),
                Fetched::SessionAction(action) => found.session_actions.push(action),
                Fetched::TurnEffect(effect) => {
                    found.turn.get_or_insert_default().effects.push(effect);
                }
                Fetched::ModelCallsElsewhere(count) => {
                    found.turn.get_or_insert_default().model_calls_elsewhere =
                        u64::try_from(count).unwrap_or(0);
                }
            }
        }
        found
    }
}

/// A row of a [`Tx::listing`]: the reads that list a session's events or a turn's effects.
pub(crate) enum Listed {
    /// The session's last event cursor: the session exists.
    Cursor(i64),
    Event(Event),
    Effect(Effect),
    Count(i64),
    Item(Item),
}

/// The parameters of [`sql::UPDATE_SESSION`]: every mutable field of `s`.
pub(crate) fn session_update(s: &Session) -> Result<Vec<Param<'_>>, StoreError> {
    let (owner, lease) = owner_columns(s);
    Ok(args![
        &s.id,
        s.status.as_str(),
        &s.active_turn_id,
        s.state.to_string(),
        counter(s.version)?,
        counter(s.last_cursor)?,
        counter(s.last_item_seq)?,
        owner,
        lease,
        counter(s.generation)?,
        s.updated_at.as_unix_millis(),
        s.closed_at.map(Timestamp::as_unix_millis),
    ])
}

/// The session's owner as two nullable columns.
fn owner_columns(session: &Session) -> (Option<&str>, Option<i64>) {
    match &session.owner {
        Some(owner) => (
            Some(owner.replica_id.as_str()),
            Some(owner.lease_expires_at.as_unix_millis()),
        ),
        None => (None, None),
    }
}

/// Row-level operations inside one open transaction: the primitives first (each backend's),
/// then the operations written over them.
pub(crate) trait Tx: Send {
    /// What this transaction announces once it commits (see [`crate::feed`]).
    fn notices(&mut self) -> &mut Vec<Notice>;

    /// The transaction's clock reading (process clock for SQLite, server clock for PostgreSQL),
    /// read once per transaction after the first row lock.
    fn now(&mut self) -> impl Future<Output = Result<Timestamp, StoreError>> + Send;

    /// Runs a statement now: the number of rows it changed.
    fn execute(
        &mut self,
        operation: &'static str,
        sql: Sql,
        params: Vec<Param<'_>>,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// A write whose outcome the transaction does not read: PostgreSQL sends it with the next
    /// round trip, whose failure it then becomes.
    fn write(
        &mut self,
        operation: &'static str,
        sql: Sql,
        params: Vec<Param<'_>>,
    ) -> Result<(), StoreError>;

    /// Runs `queries` in order (in one round trip on PostgreSQL): the rows of each, decoded.
    fn query<T: Send>(
        &mut self,
        queries: Vec<Query<'_, T>>,
    ) -> impl Future<Output = Result<Vec<Vec<T>>, StoreError>> + Send;

    /// The rows of one query.
    fn rows<T: Send>(
        &mut self,
        operation: &'static str,
        sql: Sql,
        params: Vec<Param<'_>>,
        decode: fn(&dyn Row) -> Result<T, StoreError>,
    ) -> impl Future<Output = Result<Vec<T>, StoreError>> + Send {
        async move {
            let query = Query {
                operation,
                sql,
                params,
                decode,
            };
            Ok(self.query(vec![query]).await?.pop().unwrap_or_default())
        }
    }

    /// The first row of one query.
    fn row<T: Send>(
        &mut self,
        operation: &'static str,
        sql: Sql,
        params: Vec<Param<'_>>,
        decode: fn(&dyn Row) -> Result<T, StoreError>,
    ) -> impl Future<Output = Result<Option<T>, StoreError>> + Send {
        async move {
            let rows = self.rows(operation, sql, params, decode).await?;
            Ok(rows.into_iter().next())
        }
    }

    /// Makes `reads` (see [`Reads`]).
    fn read(
        &mut self,
        reads: &Reads<'_>,
    ) -> impl Future<Output = Result<Found, StoreError>> + Send {
        async move {
            let mut queries = Vec::new();
            if reads.lock {
                // The whole database is locked by the embedded store's write transaction: no
                // row lock needed.
                queries.push(Query {
                    operation: "read a session",
                    sql: sql::SESSION,
                    params: args![reads.session_id],
                    decode: |row| Ok(Fetched::Session(Box::new(sql::decode_session(row)?), None)),
                });
            }
            queries.extend(reads.queries());
            let rows = self.query(queries).await?;
            Ok(Found::new(reads, rows))
        }
    }

    /// Checks that the database answers.
    fn ping(&mut self) -> impl Future<Output = Result<(), StoreError>> + Send {
        async move {
            self.rows("ping", sql::PING, args![], |row| row.int(0))
                .await?;
            Ok(())
        }
    }

    /// Reads a session; with `lock`, holds its row lock until the end of the transaction.
    fn session(
        &mut self,
        id: &str,
        lock: bool,
    ) -> impl Future<Output = Result<Option<Session>, StoreError>> + Send {
        async move {
            if lock {
                return Ok(self.read(&Reads::locking(id)).await?.session);
            }
            self.row(
                "read a session",
                sql::SESSION,
                args![id],
                sql::decode_session,
            )
            .await
        }
    }

    /// Inserts a session unless one with its id exists; `false` if it existed.
    fn insert_session(
        &mut self,
        s: &Session,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        async move {
            let (owner, lease) = owner_columns(s);
            let params = args![
                &s.id,
                &s.tenant_id,
                &s.owner_user_id,
                &s.agent_id,
                s.manifest.to_string(),
                &s.manifest_hash,
                &s.implementation_version,
                s.creation.to_string(),
                s.status.as_str(),
                &s.active_turn_id,
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
            ];
            let inserted = self
                .execute("insert a session", sql::INSERT_SESSION, params)
                .await?;
            Ok(inserted == 1)
        }
    }

    /// Writes every mutable field of a locked session.
    fn update_session(
        &mut self,
        s: &Session,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        async move { self.write("update a session", sql::UPDATE_SESSION, session_update(s)?) }
    }

    fn list_sessions(
        &mut self,
        filter: &SessionFilter,
    ) -> impl Future<Output = Result<Vec<Session>, StoreError>> + Send {
        async move {
            let params = args![&filter.tenant_id, &filter.agent_id];
            let sessions = self
                .rows(
                    "list sessions",
                    sql::LIST_SESSIONS,
                    params,
                    sql::decode_session,
                )
                .await?;
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
    }

    /// How many sessions matching `filter` (its statuses ignored) are in each status.
    fn status_counts(
        &mut self,
        filter: &SessionFilter,
    ) -> impl Future<Output = Result<Vec<(String, i64)>, StoreError>> + Send {
        let params = args![&filter.tenant_id, &filter.agent_id, &filter.owner_user_id];
        self.rows(
            "count sessions",
            sql::STATUS_COUNTS,
            params,
            sql::decode_status_count,
        )
    }

    /// Locks the oldest claimable session, skipping rows other transactions hold, with whether
    /// another session is claimable too; the transaction's clock is read by then.
    fn next_claimable_session(
        &mut self,
    ) -> impl Future<Output = Result<Option<(Session, bool)>, StoreError>> + Send {
        async move {
            let now = self.now().await?;
            self.row(
                "find a runnable session",
                sql::CLAIMABLE,
                args![now.as_unix_millis()],
                |row| Ok((sql::decode_session(row)?, sql::others_claimable(row, 20)?)),
            )
            .await
        }
    }

    fn upsert_agent(
        &mut self,
        agent: &NewAgent,
        now: Timestamp,
    ) -> impl Future<Output = Result<AgentDefinition, StoreError>> + Send {
        async move {
            let shared_with =
                serde_json::to_string(&agent.shared_with).unwrap_or_else(|_| "[]".to_owned());
            let params = args![
                &agent.agent_id,
                agent.manifest.to_string(),
                &agent.manifest_hash,
                &agent.implementation_version,
                now.as_unix_millis(),
                &agent.owner_tenant,
                shared_with,
            ];
            self.row("put an agent", sql::UPSERT_AGENT, params, sql::decode_agent)
                .await?
                .ok_or_else(|| {
                    StoreError::corrupt(
                        Entity::Agent,
                        &agent.agent_id,
                        "the upsert returned no row",
                    )
                })
        }
    }

    fn agent(
        &mut self,
        id: &str,
    ) -> impl Future<Output = Result<Option<AgentDefinition>, StoreError>> + Send {
        self.row("read an agent", sql::AGENT, args![id], sql::decode_agent)
    }

    fn list_agents(
        &mut self,
    ) -> impl Future<Output = Result<Vec<AgentDefinition>, StoreError>> + Send {
        self.rows("list agents", sql::LIST_AGENTS, args![], sql::decode_agent)
    }

    fn insert_event(&mut self, e: &Event) -> impl Future<Output = Result<(), StoreError>> + Send {
        async move {
            let params = args![
                &e.session_id,
                counter(e.cursor)?,
                &e.turn_id,
                &e.event_type,
                e.payload.to_string(),
                e.created_at.as_unix_millis(),
            ];
            self.write("append an event", sql::INSERT_EVENT, params)
        }
    }

    /// Runs `queries` after a read of the session's last event cursor, in one round trip: the
    /// cursor and the rows of `queries`; `None` when the session does not exist.
    fn listing(
        &mut self,
        session_id: &str,
        queries: Vec<Query<'_, Listed>>,
    ) -> impl Future<Output = Result<Option<(i64, Vec<Listed>)>, StoreError>> + Send {
        async move {
            let cursor = Query {
                operation: "read a session's cursor",
                sql: sql::SESSION_CURSOR,
                params: args![session_id],
                decode: |row| row.int(0).map(Listed::Cursor),
            };
            let mut found = self
                .query(std::iter::once(cursor).chain(queries).collect())
                .await?
                .into_iter();
            let Some(Listed::Cursor(last)) = found.next().unwrap_or_default().pop() else {
                return Ok(None);
            };
            Ok(Some((last, found.flatten().collect())))
        }
    }

    /// The session's last event cursor and the events after `after` (at most `limit`), in one
    /// round trip; `None` when the session does not exist.
    fn cursor_and_events_after(
        &mut self,
        session_id: &str,
        after: i64,
        limit: i64,
    ) -> impl Future<Output = Result<Option<(i64, Vec<Event>)>, StoreError>> + Send {
        async move {
            let events = Query {
                operation: "list events",
                sql: sql::EVENTS_AFTER,
                params: args![session_id, after, limit],
                decode: |row| sql::decode_event(row).map(Listed::Event),
            };
            let Some((last, rows)) = self.listing(session_id, vec![events]).await? else {
                return Ok(None);
            };
            let events = rows
                .into_iter()
                .filter_map(|row| match row {
                    Listed::Event(event) => Some(event),
                    _ => None,
                })
                .collect();
            Ok(Some((last, events)))
        }
    }

    fn events_after(
        &mut self,
        session_id: &str,
        after: i64,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<Event>, StoreError>> + Send {
        let params = args![session_id, after, limit];
        self.rows("list events", sql::EVENTS_AFTER, params, sql::decode_event)
    }

    fn insert_item(&mut self, i: &Item) -> impl Future<Output = Result<(), StoreError>> + Send {
        async move {
            let params = args![
                &i.session_id,
                counter(i.seq)?,
                &i.turn_id,
                i.body.to_string(),
                i.created_at.as_unix_millis(),
            ];
            self.write("append an item", sql::INSERT_ITEM, params)
        }
    }

    fn items_after(
        &mut self,
        session_id: &str,
        after: i64,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<Item>, StoreError>> + Send {
        let params = args![session_id, after, limit];
        self.rows("page items", sql::ITEMS_AFTER, params, sql::decode_item)
    }

    fn live_checkpoint(
        &mut self,
        session_id: &str,
    ) -> impl Future<Output = Result<Option<Checkpoint>, StoreError>> + Send {
        self.row(
            "read the live checkpoint",
            sql::LIVE_CHECKPOINT,
            args![session_id],
            sql::decode_checkpoint,
        )
    }

    /// Marks the session's live checkpoint superseded unless it is `keep` (turn, segment).
    fn supersede_checkpoints(
        &mut self,
        session_id: &str,
        keep: Option<(&str, i64)>,
        now: Timestamp,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let now = now.as_unix_millis();
        let result = match keep {
            Some((turn_id, segment)) => self.write(
                "supersede checkpoints",
                sql::SUPERSEDE_OTHER_CHECKPOINTS,
                args![session_id, now, turn_id, segment],
            ),
            None => self.write(
                "supersede checkpoints",
                sql::SUPERSEDE_CHECKPOINTS,
                args![session_id, now],
            ),
        };
        std::future::ready(result)
    }

    /// Marks the effects `turn_id` left `invoking` uncertain, for `reason` (the turn is over:
    /// no event announces them, as nobody waits on the turn).
    fn uncertain_left_in_flight(
        &mut self,
        session_id: &str,
        turn_id: &str,
        reason: &str,
        now: Timestamp,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        std::future::ready(self.write(
            "mark what a turn left in flight uncertain",
            sql::UNCERTAIN_LEFT_IN_FLIGHT,
            args![session_id, turn_id, reason, now.as_unix_millis()],
        ))
    }

    /// Writes (turn, segment) as the live checkpoint, replacing the data of an equal key.
    fn upsert_checkpoint(
        &mut self,
        session_id: &str,
        checkpoint: &NewCheckpoint,
        segment: i64,
        now: Timestamp,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let params = args![
            session_id,
            &checkpoint.turn_id,
            segment,
            checkpoint.data.to_string(),
            now.as_unix_millis(),
        ];
        std::future::ready(self.write("write a checkpoint", sql::UPSERT_CHECKPOINT, params))
    }

    fn effect(
        &mut self,
        id: &str,
    ) -> impl Future<Output = Result<Option<Effect>, StoreError>> + Send {
        self.row("read an effect", sql::EFFECT, args![id], sql::decode_effect)
    }

    fn insert_effect(&mut self, e: &Effect) -> impl Future<Output = Result<(), StoreError>> + Send {
        let params = args![
            &e.effect_id,
            &e.session_id,
            &e.turn_id,
            e.kind.as_str(),
            e.status.as_str(),
            e.request.to_string(),
            e.result.as_ref().map(ToString::to_string),
            &e.error,
            e.created_at.as_unix_millis(),
            e.updated_at.as_unix_millis(),
        ];
        std::future::ready(self.write("journal an effect", sql::INSERT_EFFECT, params))
    }

    fn update_effect(&mut self, e: &Effect) -> impl Future<Output = Result<(), StoreError>> + Send {
        let params = args![
            &e.effect_id,
            e.status.as_str(),
            e.result.as_ref().map(ToString::to_string),
            &e.error,
            e.updated_at.as_unix_millis(),
        ];
        std::future::ready(self.write("update an effect", sql::UPDATE_EFFECT, params))
    }

    fn session_effects(
        &mut self,
        session_id: &str,
        status: Option<EffectStatus>,
    ) -> impl Future<Output = Result<Vec<Effect>, StoreError>> + Send {
        let (sql, params) = match status {
            Some(EffectStatus::Uncertain) => EffectsIn::Uncertain.query(session_id),
            Some(status) => (sql::SESSION_EFFECTS_IN, args![session_id, status.as_str()]),
            None => (sql::SESSION_EFFECTS, args![session_id]),
        };
        self.rows("list effects", sql, params, sql::decode_effect)
    }

    /// The effects `which` selects (see [`EffectsIn`]).
    fn effects_in(
        &mut self,
        session_id: &str,
        which: EffectsIn<'_>,
    ) -> impl Future<Output = Result<Vec<Effect>, StoreError>> + Send {
        async move {
            let (sql, params) = which.query(session_id);
            self.rows("list effects", sql, params, sql::decode_effect)
                .await
        }
    }

    /// The effects of `turn_id` and how many model calls the session's other turns journaled,
    /// with the session's first `items` items when asked, in one round trip; `None` when the
    /// session does not exist.
    fn turn_effects(
        &mut self,
        session_id: &str,
        turn_id: &str,
        items: Option<i64>,
    ) -> impl Future<Output = Result<Option<(TurnEffects, Vec<Item>)>, StoreError>> + Send {
        async move {
            let mut queries: Vec<_> = turn_queries(
                session_id,
                turn_id,
                |row| sql::decode_effect(row).map(Listed::Effect),
                |row| row.int(0).map(Listed::Count),
            )
            .into();
            if let Some(limit) = items {
                queries.push(Query {
                    operation: "page items",
                    sql: sql::ITEMS_AFTER,
                    params: args![session_id, 0_i64, limit],
                    decode: |row| sql::decode_item(row).map(Listed::Item),
                });
            }
            let Some((_, rows)) = self.listing(session_id, queries).await? else {
                return Ok(None);
            };
            let mut turn = TurnEffects::default();
            let mut items = Vec::new();
            for row in rows {
                match row {
                    Listed::Effect(effect) => turn.effects.push(effect),
                    Listed::Count(count) => {
                        turn.model_calls_elsewhere = u64::try_from(count).unwrap_or(0);
                    }
                    Listed::Item(item) => items.push(item),
                    Listed::Cursor(_) | Listed::Event(_) => {}
                }
            }
            Ok(Some((turn, items)))
        }
    }

    fn action(
        &mut self,
        id: &str,
    ) -> impl Future<Output = Result<Option<Action>, StoreError>> + Send {
        self.row("read an action", sql::ACTION, args![id], sql::decode_action)
    }

    fn insert_action(&mut self, a: &Action) -> impl Future<Output = Result<(), StoreError>> + Send {
        async move {
            let params = args![
                &a.action_id,
                &a.session_id,
                &a.turn_id,
                &a.agent_id,
                &a.manifest_hash,
                &a.implementation_version,
                &a.capability_id,
                a.request.to_string(),
                a.status.as_str(),
                counter(a.generation)?,
                &a.claim_id,
                a.lease_expires_at.map(Timestamp::as_unix_millis),
                a.result.as_ref().map(ToString::to_string),
                a.created_at.as_unix_millis(),
                a.updated_at.as_unix_millis(),
            ];
            self.write("create an action", sql::INSERT_ACTION, params)
        }
    }

    fn update_action(&mut self, a: &Action) -> impl Future<Output = Result<(), StoreError>> + Send {
        async move {
            let params = args![
                &a.action_id,
                a.status.as_str(),
                counter(a.generation)?,
                &a.claim_id,
                a.lease_expires_at.map(Timestamp::as_unix_millis),
                a.result.as_ref().map(ToString::to_string),
                a.updated_at.as_unix_millis(),
            ];
            self.write("update an action", sql::UPDATE_ACTION, params)
        }
    }

    fn list_actions(
        &mut self,
        filter: &ActionFilter,
    ) -> impl Future<Output = Result<Vec<Action>, StoreError>> + Send {
        async move {
            let scope = filter.scope.as_ref();
            let params = args![
                &filter.session_id,
                scope.map(|s| s.agent_id.as_str()),
                scope.map(|s| s.manifest_hash.as_str()),
                scope.map(|s| s.implementation_version.as_str()),
            ];
            let actions = self
                .rows(
                    "list actions",
                    sql::LIST_ACTIONS,
                    params,
                    sql::decode_action,
                )
                .await?;
            Ok(actions
                .into_iter()
                .filter(|a| filter.statuses.is_empty() || filter.statuses.contains(&a.status))
                .collect())
        }
    }

    /// Up to `limit` sessions matching `filter` with an id greater than `after`, by id.
    fn sessions_page(
        &mut self,
        filter: &SessionFilter,
        after: &str,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<Session>, StoreError>> + Send {
        async move {
            let statuses = status_list(&filter.statuses, SessionStatus::as_str);
            let params = args![
                after,
                &filter.tenant_id,
                &filter.agent_id,
                statuses,
                limit,
                &filter.owner_user_id,
            ];
            self.rows(
                "page sessions",
                sql::SESSIONS_PAGE,
                params,
                sql::decode_session,
            )
            .await
        }
    }

    /// Sessions in the comma-separated `statuses`, counted by tenant, agent and status.
    fn session_counts(
        &mut self,
        statuses: &str,
    ) -> impl Future<Output = Result<Vec<SessionCount>, StoreError>> + Send {
        self.rows(
            "count sessions",
            sql::SESSION_COUNTS,
            args![statuses],
            sql::decode_session_count,
        )
    }

    /// Claimed actions whose lease ended at or before `now` (read without locks).
    fn expired_claims(
        &mut self,
        now: Timestamp,
    ) -> impl Future<Output = Result<Vec<Action>, StoreError>> + Send {
        self.rows(
            "find expired claims",
            sql::EXPIRED_CLAIMS,
            args![now.as_unix_millis(), BATCH],
            sql::decode_action,
        )
    }

    fn command(
        &mut self,
        session_id: &str,
        key: &str,
    ) -> impl Future<Output = Result<Option<CommandRecord>, StoreError>> + Send {
        async move {
            let params = args![session_id, key];
            self.row("read a command", sql::COMMAND, params, sql::decode_command)
                .await
        }
    }

    fn insert_command(
        &mut self,
        c: &CommandRecord,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        async move {
            let params = args![
                &c.session_id,
                &c.idempotency_key,
                c.command.to_string(),
                c.response.to_string(),
                counter(c.cursor)?,
                c.created_at.as_unix_millis(),
            ];
            self.write("record a command", sql::INSERT_COMMAND, params)
        }
    }

    /// Ids and tenants of sessions closed at or before `cutoff`, of one tenant or all.
    fn closed_sessions(
        &mut self,
        tenant_id: Option<&str>,
        cutoff: Timestamp,
    ) -> impl Future<Output = Result<Vec<(String, String)>, StoreError>> + Send {
        let params = args![tenant_id, cutoff.as_unix_millis(), BATCH];
        self.rows(
            "find expired sessions",
            sql::CLOSED_SESSIONS,
            params,
            sql::decode_pair,
        )
    }

    /// Ids and tenants of settled sessions (idle, completed, failed, cancelled) last changed at
    /// or before `cutoff`, of one tenant or all (at most [`BATCH`]).
    fn settled_sessions(
        &mut self,
        tenant_id: Option<&str>,
        cutoff: Timestamp,
    ) -> impl Future<Output = Result<Vec<(String, String)>, StoreError>> + Send {
        let params = args![tenant_id, cutoff.as_unix_millis(), BATCH];
        self.rows(
            "find settled sessions",
            sql::SETTLED_SESSIONS,
            params,
            sql::decode_pair,
        )
    }

    /// Deletes the session's events and items created at or before `cutoff`: (events, items).
    fn prune_history(
        &mut self,
        session_id: &str,
        cutoff: Timestamp,
    ) -> impl Future<Output = Result<(u64, u64), StoreError>> + Send {
        async move {
            let cutoff = cutoff.as_unix_millis();
            let events = self
                .execute("prune events", sql::PRUNE_EVENTS, args![session_id, cutoff])
                .await?;
            let items = self
                .execute("prune items", sql::PRUNE_ITEMS, args![session_id, cutoff])
                .await?;
            Ok((events, items))
        }
    }

    /// Deletes a locked session with everything that cascades from it.
    fn delete_session(&mut self, id: &str) -> impl Future<Output = Result<(), StoreError>> + Send {
        std::future::ready(self.write("delete a session", sql::DELETE_SESSION, args![id]))
    }

    fn prune_checkpoints(
        &mut self,
        cutoff: Timestamp,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send {
        self.execute(
            "prune checkpoints",
            sql::PRUNE_CHECKPOINTS,
            args![cutoff.as_unix_millis()],
        )
    }

    fn prune_commands(
        &mut self,
        cutoff: Timestamp,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send {
        self.execute(
            "prune idempotency records",
            sql::PRUNE_COMMANDS,
            args![cutoff.as_unix_millis()],
        )
    }
}
