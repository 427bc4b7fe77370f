//! The row-level SQL of both backends, written once.
//!
//! Every statement is a [`Sql`] constant written in PostgreSQL's form (`$1`, `$2`...); [`sql!`]
//! derives SQLite's form at compile time by turning each `$N` into `?N`, the one difference
//! between the two dialects for these statements. Both forms use only what both databases
//! accept (`CAST($1 AS TEXT)` where PostgreSQL must learn a parameter's type, `ON CONFLICT`,
//! `RETURNING`). Two statements filter on a list of statuses, which the dialects spell
//! differently; they are the only ones written twice, side by side. What truly differs stays in
//! the backend files: the row lock and `SKIP LOCKED` claim and the server clock of PostgreSQL.
//!
//! Rows are decoded here too, by column position, from either driver through [`Row`].

use std::borrow::Cow;

use serde_json::Value;

use crate::error::{Entity, StoreError};
use crate::model::{
    Action, ActionStatus, AgentDefinition, Checkpoint, CommandRecord, Effect, EffectKind,
    EffectStatus, Event, Item, Session, SessionCount, SessionOwner, SessionStatus, Timestamp,
};

/// One statement in both dialects.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Sql {
    /// With `$N` placeholders.
    pub(crate) postgres: &'static str,
    /// With `?N` placeholders.
    pub(crate) sqlite: &'static str,
}

impl Sql {
    /// A statement only PostgreSQL runs (its row locks and clock).
    pub(crate) const fn postgres_only(postgres: &'static str) -> Self {
        Self {
            postgres,
            sqlite: "",
        }
    }
}

/// SQLite's form of `text`: each `$N` placeholder becomes `?N` (same length). Fails to compile
/// on a `$` that is not a placeholder or on a `?`, which SQLite would read as one.
pub(crate) const fn sqlite_form<const N: usize>(text: &str) -> [u8; N] {
    let bytes = text.as_bytes();
    let mut out = [0u8; N];
    let mut index = 0;
    while index < N {
        out[index] = match bytes[index] {
            b'$' if index + 1 < N && bytes[index + 1].is_ascii_digit() => b'?',
            b'$' | b'?' => panic!("a `$` or `?` that is not a `$N` placeholder"),
            byte => byte,
        };
        index += 1;
    }
    out
}

/// `sql!("...", columns!(), "...")`: a [`Sql`] from PostgreSQL's text, SQLite's derived.
macro_rules! sql {
    ($($part:expr),+ $(,)?) => {{
        const POSTGRES: &str = concat!($($part),+);
        const SQLITE: [u8; POSTGRES.len()] = $crate::sql::sqlite_form(POSTGRES);
        $crate::sql::Sql {
            postgres: POSTGRES,
            sqlite: match ::core::str::from_utf8(&SQLITE) {
                Ok(text) => text,
                Err(_) => panic!("a statement is not UTF-8"),
            },
        }
    }};
}

/// A statement parameter: both databases store integers and text (JSON as compact text).
#[derive(Clone, Debug)]
pub(crate) enum Param<'a> {
    Int(Option<i64>),
    Text(Option<Cow<'a, str>>),
}

impl Param<'_> {
    /// The parameter, owning its text (for a write sent later).
    pub(crate) fn into_owned(self) -> Param<'static> {
        match self {
            Param::Int(value) => Param::Int(value),
            Param::Text(text) => Param::Text(text.map(|text| Cow::Owned(text.into_owned()))),
        }
    }
}

impl From<i64> for Param<'_> {
    fn from(value: i64) -> Self {
        Param::Int(Some(value))
    }
}
impl From<Option<i64>> for Param<'_> {
    fn from(value: Option<i64>) -> Self {
        Param::Int(value)
    }
}
impl<'a> From<&'a str> for Param<'a> {
    fn from(text: &'a str) -> Self {
        Param::Text(Some(Cow::Borrowed(text)))
    }
}
impl<'a> From<&'a String> for Param<'a> {
    fn from(text: &'a String) -> Self {
        Param::Text(Some(Cow::Borrowed(text)))
    }
}
impl From<String> for Param<'_> {
    fn from(text: String) -> Self {
        Param::Text(Some(Cow::Owned(text)))
    }
}
impl<'a> From<Option<&'a str>> for Param<'a> {
    fn from(text: Option<&'a str>) -> Self {
        Param::Text(text.map(Cow::Borrowed))
    }
}
impl<'a> From<&'a Option<String>> for Param<'a> {
    fn from(text: &'a Option<String>) -> Self {
        Param::Text(text.as_deref().map(Cow::Borrowed))
    }
}
impl From<Option<String>> for Param<'_> {
    fn from(text: Option<String>) -> Self {
        Param::Text(text.map(Cow::Owned))
    }
}

/// `args![a, b]`: the parameters `$1, $2`.
macro_rules! args {
    ($($param:expr),* $(,)?) => {
        vec![$($crate::sql::Param::from($param)),*]
    };
}
pub(crate) use args;

/// Column lists, in the order the decoders below read them.
macro_rules! session_columns {
    () => {
        "id, tenant_id, owner_user_id, agent_id, manifest, manifest_hash, implementation_version, \
         creation, status, active_turn_id, state, version, last_cursor, last_item_seq, \
         owner_replica, lease_expires_at, generation, created_at, updated_at, closed_at"
    };
}
macro_rules! agent_columns {
    () => {
        "agent_id, manifest, manifest_hash, implementation_version, created_at, updated_at, \
         owner_tenant, shared_with"
    };
}
macro_rules! event_columns {
    () => {
        "session_id, cursor, turn_id, event_type, payload, created_at"
    };
}
macro_rules! item_columns {
    () => {
        "session_id, seq, turn_id, body, created_at"
    };
}
macro_rules! checkpoint_columns {
    () => {
        "session_id, turn_id, segment, data, created_at, updated_at"
    };
}
macro_rules! effect_columns {
    () => {
        "effect_id, session_id, turn_id, kind, status, request, result, error, created_at, \
         updated_at"
    };
}
macro_rules! action_columns {
    () => {
        "action_id, session_id, turn_id, agent_id, manifest_hash, implementation_version, \
         capability_id, request, status, generation, claim_id, lease_expires_at, result, \
         created_at, updated_at"
    };
}
macro_rules! command_columns {
    () => {
        "session_id, idempotency_key, command, response, cursor, created_at"
    };
}
/// From where a replica claims a session: runnable or running, and unowned or past its lease
/// (at `$1`, or by the server's clock on PostgreSQL), the oldest first.
macro_rules! claimable {
    ($($now:tt)+) => {
        concat!(
            " FROM corral_sessions WHERE status IN ('runnable', 'running') \
             AND (owner_replica IS NULL OR lease_expires_at <= ",
            $($now)+,
            ") ORDER BY updated_at, id LIMIT 1"
        )
    };
}
/// A column of the claim: how many sessions are claimable, counting the one claimed and at
/// most 2, so that 2 says another one is left. The scheduler looks for another session only
/// then, where it used to find out with a transaction of its own, which found nothing after
/// nearly every claim. Not correlated with the claimed row, so that it is computed once per
/// claim rather than once per candidate.
macro_rules! claimable_count {
    ($($now:tt)+) => {
        concat!(
            "CAST((SELECT count(*) FROM (SELECT 1 FROM corral_sessions \
             WHERE status IN ('runnable', 'running') \
             AND (owner_replica IS NULL OR lease_expires_at <= ",
            $($now)+,
            ") LIMIT 2) AS claimable) AS BIGINT)"
        )
    };
}
pub(crate) use {claimable, claimable_count, session_columns};

pub(crate) const PING: Sql = sql!("SELECT CAST(1 AS BIGINT)");

pub(crate) const SESSION: Sql = sql!(
    "SELECT ",
    session_columns!(),
    " FROM corral_sessions WHERE id = $1"
);
pub(crate) const INSERT_SESSION: Sql = sql!(
    "INSERT INTO corral_sessions (",
    session_columns!(),
    ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, \
     $19, $20) ON CONFLICT (id) DO NOTHING"
);
pub(crate) const UPDATE_SESSION: Sql = sql!(
    "UPDATE corral_sessions SET status = $2, active_turn_id = $3, state = $4, version = $5, \
     last_cursor = $6, last_item_seq = $7, owner_replica = $8, lease_expires_at = $9, \
     generation = $10, updated_at = $11, closed_at = $12 WHERE id = $1"
);
/// [`UPDATE_SESSION`] in two, for SQLite, which rewrites the entry of every index on a column
/// an `UPDATE` sets, changed or not: the status (`corral_sessions_claimable`) is set only when
/// it changed, the rest with the same parameters (`$2` unused).
pub(crate) const UPDATE_SESSION_STATUS: Sql =
    sql!("UPDATE corral_sessions SET status = $2 WHERE id = $1 AND status <> $2");
pub(crate) const UPDATE_SESSION_BUT_STATUS: Sql = sql!(
    "UPDATE corral_sessions SET active_turn_id = $3, state = $4, version = $5, \
     last_cursor = $6, last_item_seq = $7, owner_replica = $8, lease_expires_at = $9, \
     generation = $10, updated_at = $11, closed_at = $12 WHERE id = $1"
);
pub(crate) const LIST_SESSIONS: Sql = sql!(
    "SELECT ",
    session_columns!(),
    " FROM corral_sessions WHERE (CAST($1 AS TEXT) IS NULL OR tenant_id = $1) \
     AND (CAST($2 AS TEXT) IS NULL OR agent_id = $2) ORDER BY id"
);
pub(crate) const STATUS_COUNTS: Sql = sql!(
    "SELECT status, COUNT(*) FROM corral_sessions \
     WHERE (CAST($1 AS TEXT) IS NULL OR tenant_id = $1) \
     AND (CAST($2 AS TEXT) IS NULL OR agent_id = $2) \
     AND (CAST($3 AS TEXT) IS NULL OR owner_user_id = $3) GROUP BY status ORDER BY status"
);
/// Without a lock: the embedded store's write transaction already excludes every other.
pub(crate) const CLAIMABLE: Sql = sql!(
    "SELECT ",
    session_columns!(),
    ", ",
    claimable_count!("$1"),
    claimable!("$1")
);
/// The session's last event cursor (a page of events checks its `after` against it).
pub(crate) const SESSION_CURSOR: Sql =
    sql!("SELECT last_cursor FROM corral_sessions WHERE id = $1");
/// A page of sessions by id; `$4` is a comma-separated list of statuses (empty: any).
pub(crate) const SESSIONS_PAGE: Sql = Sql {
    postgres: concat!(
        "SELECT ",
        session_columns!(),
        " FROM corral_sessions WHERE id > $1 AND (CAST($2 AS TEXT) IS NULL OR tenant_id = $2) \
         AND (CAST($3 AS TEXT) IS NULL OR agent_id = $3) \
         AND ($4 = '' OR status = ANY(string_to_array($4, ','))) \
         AND (CAST($6 AS TEXT) IS NULL OR owner_user_id = $6) ORDER BY id LIMIT $5"
    ),
    sqlite: concat!(
        "SELECT ",
        session_columns!(),
        " FROM corral_sessions WHERE id > ?1 AND (CAST(?2 AS TEXT) IS NULL OR tenant_id = ?2) \
         AND (CAST(?3 AS TEXT) IS NULL OR agent_id = ?3) \
         AND (?4 = '' OR instr(',' || ?4 || ',', ',' || status || ',') > 0) \
         AND (CAST(?6 AS TEXT) IS NULL OR owner_user_id = ?6) ORDER BY id LIMIT ?5"
    ),
};
/// Sessions in the comma-separated statuses `$1`, by tenant, agent and status.
pub(crate) const SESSION_COUNTS: Sql = Sql {
    postgres: "SELECT tenant_id, agent_id, status, count(*) FROM corral_sessions \
               WHERE status = ANY(string_to_array($1, ',')) \
               GROUP BY tenant_id, agent_id, status ORDER BY tenant_id, agent_id, status",
    sqlite: "SELECT tenant_id, agent_id, status, count(*) FROM corral_sessions \
             WHERE instr(',' || ?1 || ',', ',' || status || ',') > 0 \
             GROUP BY tenant_id, agent_id, status ORDER BY tenant_id, agent_id, status",
};
pub(crate) const CLOSED_SESSIONS: Sql = sql!(
    "SELECT id, tenant_id FROM corral_sessions WHERE status = 'closed' AND closed_at <= $2 \
     AND (CAST($1 AS TEXT) IS NULL OR tenant_id = $1) ORDER BY id LIMIT $3"
);
pub(crate) const SETTLED_SESSIONS: Sql = sql!(
    "SELECT id, tenant_id FROM corral_sessions \
     WHERE status IN ('idle', 'completed', 'failed', 'cancelled') AND updated_at <= $2 \
     AND (CAST($1 AS TEXT) IS NULL OR tenant_id = $1) ORDER BY id LIMIT $3"
);
pub(crate) const DELETE_SESSION: Sql = sql!("DELETE FROM corral_sessions WHERE id = $1");

pub(crate) const UPSERT_AGENT: Sql = sql!(
    "INSERT INTO corral_agents (",
    agent_columns!(),
    ") VALUES ($1, $2, $3, $4, $5, $5, $6, $7) \
     ON CONFLICT (agent_id) DO UPDATE SET owner_tenant = excluded.owner_tenant, \
     shared_with = excluded.shared_with, manifest = excluded.manifest, \
     manifest_hash = excluded.manifest_hash, \
     implementation_version = excluded.implementation_version, \
     updated_at = excluded.updated_at RETURNING ",
    agent_columns!()
);
pub(crate) const AGENT: Sql = sql!(
    "SELECT ",
    agent_columns!(),
    " FROM corral_agents WHERE agent_id = $1"
);
pub(crate) const LIST_AGENTS: Sql = sql!(
    "SELECT ",
    agent_columns!(),
    " FROM corral_agents ORDER BY agent_id"
);

pub(crate) const INSERT_EVENT: Sql = sql!(
    "INSERT INTO corral_events (",
    event_columns!(),
    ") VALUES ($1, $2, $3, $4, $5, $6)"
);
pub(crate) const EVENTS_AFTER: Sql = sql!(
    "SELECT ",
    event_columns!(),
    " FROM corral_events WHERE session_id = $1 AND cursor > $2 ORDER BY cursor LIMIT $3"
);
pub(crate) const PRUNE_EVENTS: Sql =
    sql!("DELETE FROM corral_events WHERE session_id = $1 AND created_at <= $2");

pub(crate) const INSERT_ITEM: Sql = sql!(
    "INSERT INTO corral_items (",
    item_columns!(),
    ") VALUES ($1, $2, $3, $4, $5)"
);
pub(crate) const ITEMS_AFTER: Sql = sql!(
    "SELECT ",
    item_columns!(),
    " FROM corral_items WHERE session_id = $1 AND seq > $2 ORDER BY seq LIMIT $3"
);
pub(crate) const PRUNE_ITEMS: Sql =
    sql!("DELETE FROM corral_items WHERE session_id = $1 AND created_at <= $2");

pub(crate) const LIVE_CHECKPOINT: Sql = sql!(
    "SELECT ",
    checkpoint_columns!(),
    " FROM corral_checkpoints WHERE session_id = $1 AND superseded_at IS NULL"
);
pub(crate) const SUPERSEDE_CHECKPOINTS: Sql = sql!(
    "UPDATE corral_checkpoints SET superseded_at = $2 WHERE session_id = $1 \
     AND superseded_at IS NULL"
);
pub(crate) const SUPERSEDE_OTHER_CHECKPOINTS: Sql = sql!(
    "UPDATE corral_checkpoints SET superseded_at = $2 WHERE session_id = $1 \
     AND superseded_at IS NULL AND NOT (turn_id = $3 AND segment = $4)"
);
pub(crate) const UPSERT_CHECKPOINT: Sql = sql!(
    "INSERT INTO corral_checkpoints (session_id, turn_id, segment, data, created_at, \
     updated_at, superseded_at) VALUES ($1, $2, $3, $4, $5, $5, NULL) \
     ON CONFLICT (session_id, turn_id, segment) DO UPDATE SET data = excluded.data, \
     updated_at = excluded.updated_at, superseded_at = NULL"
);
pub(crate) const PRUNE_CHECKPOINTS: Sql =
    sql!("DELETE FROM corral_checkpoints WHERE superseded_at IS NOT NULL AND superseded_at <= $1");

pub(crate) const EFFECT: Sql = sql!(
    "SELECT ",
    effect_columns!(),
    " FROM corral_effects WHERE effect_id = $1"
);
pub(crate) const INSERT_EFFECT: Sql = sql!(
    "INSERT INTO corral_effects (",
    effect_columns!(),
    ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)"
);
pub(crate) const UPDATE_EFFECT: Sql = sql!(
    "UPDATE corral_effects SET status = $2, result = $3, error = $4, updated_at = $5 \
     WHERE effect_id = $1"
);
pub(crate) const TURN_EFFECTS: Sql = sql!(
    "SELECT ",
    effect_columns!(),
    " FROM corral_effects WHERE session_id = $1 AND turn_id = $2 ORDER BY created_at, effect_id"
);
pub(crate) const EFFECTS_OF_KIND_ELSEWHERE: Sql = sql!(
    "SELECT count(*) FROM corral_effects WHERE session_id = $1 AND turn_id <> $2 AND kind = $3"
);
pub(crate) const SESSION_EFFECTS: Sql = sql!(
    "SELECT ",
    effect_columns!(),
    " FROM corral_effects WHERE session_id = $1 ORDER BY created_at, effect_id"
);
/// The session's effects in one status, by the session's part of `corral_effects_turn`: a
/// listing, which reads all the session's effects. The reads of a step use the two below.
pub(crate) const SESSION_EFFECTS_IN: Sql = sql!(
    "SELECT ",
    effect_columns!(),
    " FROM corral_effects WHERE session_id = $1 AND status = $2 ORDER BY created_at, effect_id"
);
/// The effects of turn `$2` left `invoking`, or with `$2` null those of the session's active
/// turn: only a turn's run has effects in flight, so the turn's part of `corral_effects_turn`
/// finds them, and no index on the status is rewritten each time an effect begins or ends.
pub(crate) const TURN_EFFECTS_INVOKING: Sql = sql!(
    "SELECT ",
    effect_columns!(),
    " FROM corral_effects WHERE session_id = $1 AND turn_id = COALESCE(CAST($2 AS TEXT), \
     (SELECT active_turn_id FROM corral_sessions WHERE id = $1)) AND status = 'invoking' \
     ORDER BY created_at, effect_id"
);
/// A turn that ends leaves none of its effects `invoking`: those it still had in flight (a call
/// a script started and did not await, cancelled with it) become `uncertain`.
pub(crate) const UNCERTAIN_LEFT_IN_FLIGHT: Sql = sql!(
    "UPDATE corral_effects SET status = 'uncertain', error = $3, updated_at = $4 \
     WHERE session_id = $1 AND turn_id = $2 AND status = 'invoking'"
);
/// The session's `uncertain` effects, of any turn, from the partial index that holds only them
/// (an effect becomes uncertain only when a run stops with it in flight).
pub(crate) const SESSION_EFFECTS_UNCERTAIN: Sql = sql!(
    "SELECT ",
    effect_columns!(),
    " FROM corral_effects WHERE session_id = $1 AND status = 'uncertain' \
     ORDER BY created_at, effect_id"
);

pub(crate) const ACTION: Sql = sql!(
    "SELECT ",
    action_columns!(),
    " FROM corral_actions WHERE action_id = $1"
);
pub(crate) const INSERT_ACTION: Sql = sql!(
    "INSERT INTO corral_actions (",
    action_columns!(),
    ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)"
);
pub(crate) const UPDATE_ACTION: Sql = sql!(
    "UPDATE corral_actions SET status = $2, generation = $3, claim_id = $4, \
     lease_expires_at = $5, result = $6, updated_at = $7 WHERE action_id = $1"
);
pub(crate) const LIST_ACTIONS: Sql = sql!(
    "SELECT ",
    action_columns!(),
    " FROM corral_actions WHERE (CAST($1 AS TEXT) IS NULL OR session_id = $1) \
     AND (CAST($2 AS TEXT) IS NULL OR agent_id = $2) \
     AND (CAST($3 AS TEXT) IS NULL OR manifest_hash = $3) \
     AND (CAST($4 AS TEXT) IS NULL OR implementation_version = $4) \
     ORDER BY created_at, action_id"
);
pub(crate) const EXPIRED_CLAIMS: Sql = sql!(
    "SELECT ",
    action_columns!(),
    " FROM corral_actions WHERE status = 'claimed' AND lease_expires_at <= $1 \
     ORDER BY session_id, action_id LIMIT $2"
);

pub(crate) const COMMAND: Sql = sql!(
    "SELECT ",
    command_columns!(),
    " FROM corral_commands WHERE session_id = $1 AND idempotency_key = $2"
);
pub(crate) const INSERT_COMMAND: Sql = sql!(
    "INSERT INTO corral_commands (",
    command_columns!(),
    ") VALUES ($1, $2, $3, $4, $5, $6)"
);
pub(crate) const PRUNE_COMMANDS: Sql = sql!("DELETE FROM corral_commands WHERE created_at <= $1");

/// Read access to one result row, whichever driver produced it.
pub(crate) trait Row {
    fn text(&self, index: usize) -> Result<String, StoreError>;
    fn opt_text(&self, index: usize) -> Result<Option<String>, StoreError>;
    fn int(&self, index: usize) -> Result<i64, StoreError>;
    fn opt_int(&self, index: usize) -> Result<Option<i64>, StoreError>;
}

struct Decoder<'r> {
    row: &'r dyn Row,
    entity: Entity,
    id: String,
}

impl<'r> Decoder<'r> {
    fn new(row: &'r dyn Row, entity: Entity, id_index: usize) -> Result<Self, StoreError> {
        Ok(Self {
            row,
            entity,
            id: row.text(id_index)?,
        })
    }

    fn corrupt(&self, detail: String) -> StoreError {
        StoreError::corrupt(self.entity, &self.id, detail)
    }

    fn json(&self, index: usize, field: &str) -> Result<Value, StoreError> {
        let text = self.row.text(index)?;
        serde_json::from_str(&text).map_err(|error| self.corrupt(format!("{field}: {error}")))
    }

    fn opt_json(&self, index: usize, field: &str) -> Result<Option<Value>, StoreError> {
        match self.row.opt_text(index)? {
            Some(text) => serde_json::from_str(&text)
                .map(Some)
                .map_err(|error| self.corrupt(format!("{field}: {error}"))),
            None => Ok(None),
        }
    }

    fn count(&self, index: usize, field: &str) -> Result<u64, StoreError> {
        let value = self.row.int(index)?;
        u64::try_from(value).map_err(|_| self.corrupt(format!("{field} is negative: {value}")))
    }

    fn time(&self, index: usize) -> Result<Timestamp, StoreError> {
        Ok(Timestamp::from_unix_millis(self.row.int(index)?))
    }

    fn opt_time(&self, index: usize) -> Result<Option<Timestamp>, StoreError> {
        Ok(self.row.opt_int(index)?.map(Timestamp::from_unix_millis))
    }

    fn parsed<T>(
        &self,
        index: usize,
        field: &str,
        parse: fn(&str) -> Option<T>,
    ) -> Result<T, StoreError> {
        let text = self.row.text(index)?;
        parse(&text).ok_or_else(|| self.corrupt(format!("unknown {field} {text:?}")))
    }
}

/// Whether a claim's [`claimable_count`] column, at `index`, says another session is left.
pub(crate) fn others_claimable(row: &dyn Row, index: usize) -> Result<bool, StoreError> {
    Ok(row.int(index)? > 1)
}

pub(crate) fn decode_session(row: &dyn Row) -> Result<Session, StoreError> {
    let d = Decoder::new(row, Entity::Session, 0)?;
    let owner = match (row.opt_text(14)?, d.opt_time(15)?) {
        (Some(replica_id), Some(lease_expires_at)) => Some(SessionOwner {
            replica_id,
            lease_expires_at,
        }),
        _ => None,
    };
    Ok(Session {
        id: d.id.clone(),
        tenant_id: row.text(1)?,
        owner_user_id: row.text(2)?,
        agent_id: row.text(3)?,
        manifest: d.json(4, "manifest")?,
        manifest_hash: row.text(5)?,
        implementation_version: row.text(6)?,
        creation: d.json(7, "creation")?,
        status: d.parsed(8, "status", SessionStatus::parse)?,
        active_turn_id: row.opt_text(9)?,
        state: d.json(10, "state")?,
        version: d.count(11, "version")?,
        last_cursor: d.count(12, "last cursor")?,
        last_item_seq: d.count(13, "last item sequence")?,
        owner,
        generation: d.count(16, "generation")?,
        created_at: d.time(17)?,
        updated_at: d.time(18)?,
        closed_at: d.opt_time(19)?,
    })
}

pub(crate) fn decode_agent(row: &dyn Row) -> Result<AgentDefinition, StoreError> {
    let d = Decoder::new(row, Entity::Agent, 0)?;
    Ok(AgentDefinition {
        agent_id: d.id.clone(),
        manifest: d.json(1, "manifest")?,
        manifest_hash: row.text(2)?,
        implementation_version: row.text(3)?,
        created_at: d.time(4)?,
        updated_at: d.time(5)?,
        owner_tenant: row.opt_text(6)?,
        shared_with: serde_json::from_value(d.json(7, "shared_with")?)
            .map_err(|error| d.corrupt(format!("shared_with: {error}")))?,
    })
}

pub(crate) fn decode_event(row: &dyn Row) -> Result<Event, StoreError> {
    let d = Decoder::new(row, Entity::Event, 0)?;
    Ok(Event {
        session_id: d.id.clone(),
        cursor: d.count(1, "cursor")?,
        turn_id: row.opt_text(2)?,
        event_type: row.text(3)?,
        payload: d.json(4, "payload")?,
        created_at: d.time(5)?,
    })
}

pub(crate) fn decode_item(row: &dyn Row) -> Result<Item, StoreError> {
    let d = Decoder::new(row, Entity::Item, 0)?;
    Ok(Item {
        session_id: d.id.clone(),
        seq: d.count(1, "sequence")?,
        turn_id: row.opt_text(2)?,
        body: d.json(3, "body")?,
        created_at: d.time(4)?,
    })
}

pub(crate) fn decode_checkpoint(row: &dyn Row) -> Result<Checkpoint, StoreError> {
    let d = Decoder::new(row, Entity::Checkpoint, 0)?;
    Ok(Checkpoint {
        session_id: d.id.clone(),
        turn_id: row.text(1)?,
        segment: d.count(2, "segment")?,
        data: d.json(3, "data")?,
        created_at: d.time(4)?,
        updated_at: d.time(5)?,
    })
}

pub(crate) fn decode_effect(row: &dyn Row) -> Result<Effect, StoreError> {
    let d = Decoder::new(row, Entity::Effect, 0)?;
    Ok(Effect {
        effect_id: d.id.clone(),
        session_id: row.text(1)?,
        turn_id: row.text(2)?,
        kind: d.parsed(3, "kind", EffectKind::parse)?,
        status: d.parsed(4, "status", EffectStatus::parse)?,
        request: d.json(5, "request")?,
        result: d.opt_json(6, "result")?,
        error: row.opt_text(7)?,
        created_at: d.time(8)?,
        updated_at: d.time(9)?,
    })
}

pub(crate) fn decode_action(row: &dyn Row) -> Result<Action, StoreError> {
    let d = Decoder::new(row, Entity::Action, 0)?;
    Ok(Action {
        action_id: d.id.clone(),
        session_id: row.text(1)?,
        turn_id: row.text(2)?,
        agent_id: row.text(3)?,
        manifest_hash: row.text(4)?,
        implementation_version: row.text(5)?,
        capability_id: row.text(6)?,
        request: d.json(7, "request")?,
        status: d.parsed(8, "status", ActionStatus::parse)?,
        generation: d.count(9, "generation")?,
        claim_id: row.opt_text(10)?,
        lease_expires_at: d.opt_time(11)?,
        result: d.opt_json(12, "result")?,
        created_at: d.time(13)?,
        updated_at: d.time(14)?,
    })
}

pub(crate) fn decode_command(row: &dyn Row) -> Result<CommandRecord, StoreError> {
    let d = Decoder::new(row, Entity::Command, 1)?;
    Ok(CommandRecord {
        session_id: row.text(0)?,
        idempotency_key: d.id.clone(),
        command: d.json(2, "command")?,
        response: d.json(3, "response")?,
        cursor: d.count(4, "cursor")?,
        created_at: d.time(5)?,
    })
}

/// One row of `tenant_id, agent_id, status, count`.
pub(crate) fn decode_session_count(row: &dyn Row) -> Result<SessionCount, StoreError> {
    let status = row.text(2)?;
    Ok(SessionCount {
        tenant_id: row.text(0)?,
        agent_id: row.text(1)?,
        status: SessionStatus::parse(&status).ok_or_else(|| StoreError::Corrupt {
            entity: Entity::Session,
            id: String::new(),
            detail: format!("unknown session status {status:?}"),
        })?,
        sessions: u64::try_from(row.int(3)?).unwrap_or(0),
    })
}

/// `(text, text)` rows: session ids with their tenants.
pub(crate) fn decode_pair(row: &dyn Row) -> Result<(String, String), StoreError> {
    Ok((row.text(0)?, row.text(1)?))
}

/// `(text, integer)` rows: statuses with counts.
pub(crate) fn decode_status_count(row: &dyn Row) -> Result<(String, i64), StoreError> {
    Ok((row.text(0)?, row.int(1)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlite_placeholders_are_numbered_like_postgres_ones() {
        assert_eq!(
            SUPERSEDE_OTHER_CHECKPOINTS.sqlite,
            "UPDATE corral_checkpoints SET superseded_at = ?2 WHERE session_id = ?1 \
             AND superseded_at IS NULL AND NOT (turn_id = ?3 AND segment = ?4)"
        );
        assert_eq!(INSERT_SESSION.sqlite.len(), INSERT_SESSION.postgres.len());
        assert!(!INSERT_SESSION.sqlite.contains('$'));
    }

    /// SQLite's plan for `sql` on the embedded schema, one step a line.
    fn plan(sql: Sql) -> String {
        let db = rusqlite::Connection::open_in_memory().expect("in-memory database");
        for migration in crate::migrations::SQLITE {
            db.execute_batch(migration.sql).expect(migration.name);
        }
        let mut statement = db
            .prepare(&format!("EXPLAIN QUERY PLAN {}", sql.sqlite))
            .expect(sql.sqlite);
        let unbound = std::iter::repeat_n(rusqlite::types::Null, statement.parameter_count());
        let steps = statement
            .query_map(rusqlite::params_from_iter(unbound), |row| {
                row.get::<_, String>(3)
            })
            .expect("plan")
            .collect::<Result<Vec<_>, _>>()
            .expect("plan");
        steps.join("\n")
    }

    /// The reads a turn makes at every step find their rows by every key they are given, so
    /// that their cost does not grow with the session's past (a session of a thousand turns
    /// has thousands of effects, events and items).
    #[test]
    fn a_steps_reads_search_by_all_their_keys() {
        for (sql, expected) in [
            (
                SESSION,
                "USING INDEX sqlite_autoindex_corral_sessions_1 (id=?)",
            ),
            (
                TURN_EFFECTS_INVOKING,
                "USING INDEX corral_effects_turn (session_id=? AND turn_id=?)",
            ),
            (
                SESSION_EFFECTS_UNCERTAIN,
                "USING INDEX corral_effects_uncertain (session_id=?)",
            ),
            (
                TURN_EFFECTS,
                "USING INDEX corral_effects_turn (session_id=? AND turn_id=?)",
            ),
            (
                LIVE_CHECKPOINT,
                "USING INDEX corral_checkpoints_live (session_id=?)",
            ),
            (ITEMS_AFTER, "USING PRIMARY KEY (session_id=? AND seq>?)"),
            (
                EVENTS_AFTER,
                "USING PRIMARY KEY (session_id=? AND cursor>?)",
            ),
        ] {
            let plan = plan(sql);
            assert!(plan.contains(expected), "{}\n{plan}", sql.sqlite);
            assert!(!plan.contains("SCAN"), "{}\n{plan}", sql.sqlite);
        }
    }
}
