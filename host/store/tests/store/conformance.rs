//! The conformance suite: the same test bodies run against the embedded store and PostgreSQL.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, ensure};
use corral_store::{
    ActionFilter, ActionGuard, ActionStatus, ActionTransition, BeginEffect, BeginEffectOutcome,
    CancelTurn, CheckpointWrite, ClaimAction, CommitOutcome, CompleteAction, EffectKind,
    EffectStatus, EffectTransition, Entity, ExecutorScope, HeartbeatAction, MAX_PAGE, NewAction,
    NewAgent, NewCheckpoint, NewCommand, NewEffect, NewEvent, NewItem, NewSession, Resolution,
    ResolveEffect, RetentionPolicy, SessionCommit, SessionFilter, SessionStatus, StaleReason,
    Store, StoreError,
};
use libtest_mimic::Trial;
use serde_json::{Value, json};
use tokio::sync::Barrier;

use crate::support::{
    Fixture, Harness, TestFuture, applied, postgres_trial, session, session_of, sqlite_trial,
};

/// Evaluates to the error of `$result`, failing the test unless it matches the pattern.
macro_rules! expect_err {
    ($result:expr, $($pattern:tt)+) => {{
        match $result {
            Err(error) if matches!(&error, $($pattern)+) => error,
            other => anyhow::bail!(
                "expected {} but got {:?}",
                stringify!($($pattern)+),
                other
            ),
        }
    }};
}

const LONG: Duration = Duration::from_secs(60);
const SHORT: Duration = Duration::from_millis(250);
/// Comfortably longer than `SHORT`, on any machine.
const PAST_SHORT: Duration = Duration::from_millis(700);

macro_rules! conformance {
    ($($name:ident),+ $(,)?) => {
        /// One trial per test and backend, named `conformance::<backend>::<test>`.
        pub fn trials(harness: &Arc<Harness>) -> Vec<Trial> {
            let mut trials = Vec::new();
            $(
                trials.push(sqlite_trial(
                    format!("conformance::sqlite::{}", stringify!($name)),
                    |fixture| -> TestFuture { Box::pin(async move { $name(&fixture).await }) },
                ));
                trials.push(postgres_trial(
                    harness,
                    format!("conformance::postgres::{}", stringify!($name)),
                    |fixture| -> TestFuture { Box::pin(async move { $name(&fixture).await }) },
                ));
            )+
            trials
        }
    };
}

conformance!(
    agents_are_registered_replaced_and_listed,
    sessions_are_created_idempotently,
    events_get_gap_free_cursors_and_page_from_any_cursor,
    items_page_in_order,
    a_checkpoint_commits_with_its_events_or_not_at_all,
    one_checkpoint_is_live_per_session,
    commands_replay_their_first_response_and_reject_another_body,
    effects_begin_once_and_move_only_under_their_guards,
    recovery_marks_in_flight_effects_uncertain,
    actions_are_claimed_heartbeated_and_completed_under_their_generation,
    expired_action_claims_become_uncertain,
    runnable_sessions_are_leased_to_one_replica_at_a_time,
    an_expired_or_superseded_lease_holder_cannot_write,
    sixteen_concurrent_appenders_get_gap_free_cursors,
    racing_replicas_never_both_win_a_session,
    concurrent_replays_of_a_command_apply_it_once,
    retention_expires_closed_sessions_per_tenant,
    retention_keeps_idempotency_records_for_the_window,
    retention_prunes_superseded_checkpoints,
    out_of_range_arguments_are_rejected,
    the_change_feed_announces_committed_events_and_work,
    cancel_turn_fences_the_turn_in_one_transaction,
    a_cancel_racing_a_turn_completion_has_one_winner,
    action_results_complete_action_effect_and_session_together,
    uncertain_effects_are_resolved_by_retry_or_outcome,
    start_up_recovery_marks_every_in_flight_effect_uncertain,
    commits_are_guarded_on_turn_and_status,
    sessions_actions_and_effects_page_by_key,
    claim_next_spreads_executors_over_the_work,
    retention_prunes_the_history_of_closed_sessions_per_tenant,
);

fn event(kind: &str, payload: Value) -> NewEvent {
    NewEvent::new(kind, payload)
}

/// Moves a session into `status` with `turn` active.
async fn set_turn(
    store: &dyn Store,
    session_id: &str,
    status: SessionStatus,
    turn: Option<&str>,
) -> anyhow::Result<()> {
    let mut commit = SessionCommit::new(session_id);
    commit.patch.status = Some(status);
    commit.patch.active_turn_id = Some(turn.map(str::to_owned));
    applied(store.commit(commit).await?)?;
    Ok(())
}

async fn agents_are_registered_replaced_and_listed(f: &Fixture) -> anyhow::Result<()> {
    let store = &*f.store;
    store.ping().await?;
    let first = store
        .put_agent(NewAgent::new("helper", json!({"v": 1}), "sha256:1", "1.0"))
        .await?;
    store
        .put_agent(NewAgent::new(
            "archivist",
            json!({"v": 1}),
            "sha256:a",
            "2.0",
        ))
        .await?;
    let replaced = store
        .put_agent(NewAgent::new("helper", json!({"v": 2}), "sha256:2", "1.1"))
        .await?;
    ensure!(
        replaced.created_at == first.created_at,
        "creation time kept"
    );
    ensure!(replaced.updated_at >= first.updated_at);
    let read = store.get_agent("helper").await?;
    ensure!(read.manifest == json!({"v": 2}) && read.manifest_hash == "sha256:2");
    ensure!(read.implementation_version == "1.1");
    let ids: Vec<String> = store
        .list_agents()
        .await?
        .into_iter()
        .map(|agent| agent.agent_id)
        .collect();
    ensure!(ids == ["archivist", "helper"], "listed by id: {ids:?}");
    expect_err!(
        store.get_agent("nobody").await,
        StoreError::NotFound { entity: Entity::Agent, id } if id == "nobody"
    );
    expect_err!(
        store
            .put_agent(NewAgent::new("", json!({}), "h", "v"))
            .await,
        StoreError::InvalidInput { .. }
    );
    Ok(())
}

async fn sessions_are_created_idempotently(f: &Fixture) -> anyhow::Result<()> {
    let store = &*f.store;
    let created = session(store, "s1").await?;
    ensure!(created.status == SessionStatus::Idle && created.version == 1);
    ensure!(created.manifest_hash == "sha256:helper-1" && created.last_cursor == 0);
    ensure!(created.owner.is_none() && created.generation == 0);

    let creation = json!({"agentId": "helper", "ownerUserId": "alice"});
    let again = store
        .create_session(NewSession::new(
            "s1",
            "acme",
            "alice",
            "helper",
            creation.clone(),
        ))
        .await?;
    ensure!(
        !again.created && again.session == created,
        "identical create returns the session"
    );

    let different = NewSession::new("s1", "acme", "alice", "helper", json!({"info": "other"}));
    expect_err!(
        store.create_session(different).await,
        StoreError::Conflict {
            entity: Entity::Session,
            ..
        }
    );
    let other_tenant = NewSession::new("s1", "globex", "alice", "helper", creation.clone());
    expect_err!(
        store.create_session(other_tenant).await,
        StoreError::Conflict {
            entity: Entity::Session,
            ..
        }
    );
    let unknown_agent = NewSession::new("s2", "acme", "alice", "ghost", creation.clone());
    expect_err!(
        store.create_session(unknown_agent).await,
        StoreError::NotFound {
            entity: Entity::Agent,
            ..
        }
    );
    expect_err!(
        store.get_session("s2").await,
        StoreError::NotFound {
            entity: Entity::Session,
            ..
        }
    );

    // A session keeps the manifest it was created with when its agent changes.
    store
        .put_agent(NewAgent::new(
            "helper",
            json!({"id": "helper", "v": 2}),
            "sha256:helper-2",
            "1.1",
        ))
        .await?;
    ensure!(store.get_session("s1").await?.manifest_hash == "sha256:helper-1");

    session_of(store, "s3", "globex").await?;
    set_turn(store, "s3", SessionStatus::Runnable, Some("t1")).await?;
    let mut filter = SessionFilter::default();
    filter.tenant_id = Some("globex".to_owned());
    let ids: Vec<String> = store
        .list_sessions(&filter)
        .await?
        .into_iter()
        .map(|s| s.id)
        .collect();
    ensure!(ids == ["s3"], "tenant filter: {ids:?}");
    let mut filter = SessionFilter::default();
    filter.statuses = vec![SessionStatus::Idle];
    let ids: Vec<String> = store
        .list_sessions(&filter)
        .await?
        .into_iter()
        .map(|s| s.id)
        .collect();
    ensure!(ids == ["s1"], "status filter: {ids:?}");
    let mut filter = SessionFilter::default();
    filter.agent_id = Some("helper".to_owned());
    ensure!(store.list_sessions(&filter).await?.len() == 2);
    Ok(())
}

async fn events_get_gap_free_cursors_and_page_from_any_cursor(f: &Fixture) -> anyhow::Result<()> {
    let store = &*f.store;
    session(store, "s1").await?;
    let mut commit = SessionCommit::new("s1");
    commit.events = vec![
        event("a", json!({"n": 1})),
        event("b", json!({"n": 2})).in_turn("t1"),
    ];
    let receipt = applied(store.commit(commit).await?)?;
    let cursors: Vec<u64> = receipt.events.iter().map(|e| e.cursor).collect();
    ensure!(cursors == [1, 2], "first commit cursors {cursors:?}");
    for n in 3..=5 {
        let appended = store
            .append_event("s1", None, event("c", json!({"n": n})))
            .await?;
        ensure!(
            appended.cursor == n,
            "cursor {} for event {n}",
            appended.cursor
        );
    }
    let all = store.list_events("s1", 0, 100).await?;
    let seen: Vec<(u64, Value)> = all
        .iter()
        .map(|e| (e.cursor, e.payload["n"].clone()))
        .collect();
    ensure!(
        seen == (1..=5).map(|n| (n, json!(n))).collect::<Vec<_>>(),
        "events in order: {seen:?}"
    );
    ensure!(all[1].turn_id.as_deref() == Some("t1") && all[1].event_type == "b");
    let tail: Vec<u64> = store
        .list_events("s1", 3, 100)
        .await?
        .iter()
        .map(|e| e.cursor)
        .collect();
    ensure!(tail == [4, 5], "resume after 3: {tail:?}");
    let head: Vec<u64> = store
        .list_events("s1", 0, 2)
        .await?
        .iter()
        .map(|e| e.cursor)
        .collect();
    ensure!(head == [1, 2], "limit 2: {head:?}");
    ensure!(store.list_events("s1", 5, 10).await?.is_empty());
    ensure!(store.get_session("s1").await?.last_cursor == 5);
    expect_err!(
        store.list_events("s1", 6, 10).await,
        StoreError::InvalidCursor {
            cursor: 6,
            last: 5,
            ..
        }
    );
    expect_err!(
        store.list_events("s1", 0, 0).await,
        StoreError::InvalidInput { what: "limit", .. }
    );
    expect_err!(
        store.list_events("s1", 0, MAX_PAGE + 1).await,
        StoreError::InvalidInput { what: "limit", .. }
    );
    ensure!(store.list_events("s1", 0, MAX_PAGE).await?.len() == 5);
    expect_err!(
        store.list_events("ghost", 0, 10).await,
        StoreError::NotFound {
            entity: Entity::Session,
            ..
        }
    );
    expect_err!(
        store
            .append_event("ghost", None, event("x", json!(null)))
            .await,
        StoreError::NotFound {
            entity: Entity::Session,
            ..
        }
    );
    Ok(())
}

async fn items_page_in_order(f: &Fixture) -> anyhow::Result<()> {
    let store = &*f.store;
    session(store, "s1").await?;
    let mut commit = SessionCommit::new("s1");
    commit.items = (1..=5)
        .map(|n| NewItem::new(json!({"role": "user", "n": n})).in_turn("t1"))
        .collect();
    let receipt = applied(store.commit(commit).await?)?;
    ensure!(receipt.items.iter().map(|i| i.seq).eq(1..=5));
    let page = store.page_items("s1", 0, 2).await?;
    ensure!(page.items.iter().map(|i| i.seq).eq([1, 2]) && page.next_after == Some(2));
    let page = store.page_items("s1", 2, 2).await?;
    ensure!(page.items.iter().map(|i| i.seq).eq([3, 4]) && page.next_after == Some(4));
    let page = store.page_items("s1", 4, 2).await?;
    ensure!(page.items.iter().map(|i| i.seq).eq([5]) && page.next_after.is_none());
    ensure!(page.items[0].body == json!({"role": "user", "n": 5}));
    ensure!(page.items[0].turn_id.as_deref() == Some("t1"));
    ensure!(store.get_session("s1").await?.last_item_seq == 5);
    expect_err!(
        store.page_items("s1", 0, 0).await,
        StoreError::InvalidInput { .. }
    );
    expect_err!(
        store.page_items("ghost", 0, 10).await,
        StoreError::NotFound {
            entity: Entity::Session,
            ..
        }
    );
    Ok(())
}

async fn a_checkpoint_commits_with_its_events_or_not_at_all(f: &Fixture) -> anyhow::Result<()> {
    let store = &*f.store;
    let created = session(store, "s1").await?;
    let mut commit = SessionCommit::new("s1");
    commit.expect_version = Some(created.version);
    commit.patch.status = Some(SessionStatus::Paused);
    commit
        .events
        .push(event("permission.requested", json!({"tool": "run_js"})));
    commit.checkpoint = Some(CheckpointWrite::Put(NewCheckpoint::new(
        "t1",
        0,
        json!({"step": 1}),
    )));
    let receipt = applied(store.commit(commit).await?)?;
    ensure!(receipt.session.version == created.version + 1);
    ensure!(receipt.session.status == SessionStatus::Paused);
    let live = store
        .live_checkpoint("s1")
        .await?
        .context("a live checkpoint")?;
    ensure!(live.turn_id == "t1" && live.segment == 0 && live.data == json!({"step": 1}));

    // A commit prepared against an older version writes nothing at all.
    let mut stale = SessionCommit::new("s1");
    stale.expect_version = Some(created.version);
    stale.patch.status = Some(SessionStatus::Runnable);
    stale.events.push(event("permission.resolved", json!({})));
    stale.items.push(NewItem::new(json!({"approved": true})));
    stale.checkpoint = Some(CheckpointWrite::Put(NewCheckpoint::new(
        "t1",
        1,
        json!({"step": 2}),
    )));
    expect_err!(
        store.commit(stale).await,
        StoreError::Conflict {
            entity: Entity::Session,
            ..
        }
    );
    // So does one failing on its last guard, after other writes were already issued.
    let mut failing = SessionCommit::new("s1");
    failing.events.push(event("effect.completed", json!({})));
    failing.checkpoint = Some(CheckpointWrite::Put(NewCheckpoint::new(
        "t1",
        1,
        json!({"step": 2}),
    )));
    failing.effects.push(EffectTransition::new(
        "missing",
        &[EffectStatus::Invoking],
        EffectStatus::Completed,
    ));
    expect_err!(
        store.commit(failing).await,
        StoreError::NotFound {
            entity: Entity::Effect,
            ..
        }
    );
    let after = store.get_session("s1").await?;
    ensure!(after.version == receipt.session.version && after.status == SessionStatus::Paused);
    ensure!(after.last_cursor == 1 && after.last_item_seq == 0);
    ensure!(store.list_events("s1", 0, 10).await?.len() == 1);
    ensure!(store.page_items("s1", 0, 10).await?.items.is_empty());
    let live = store
        .live_checkpoint("s1")
        .await?
        .context("a live checkpoint")?;
    ensure!(
        live.segment == 0 && live.data == json!({"step": 1}),
        "checkpoint unchanged: {live:?}"
    );
    Ok(())
}

async fn one_checkpoint_is_live_per_session(f: &Fixture) -> anyhow::Result<()> {
    let store = &*f.store;
    session(store, "s1").await?;
    session(store, "s2").await?;
    ensure!(store.live_checkpoint("s1").await?.is_none());
    let put = |session: &str, turn: &str, segment: u64, data: Value| {
        let mut commit = SessionCommit::new(session);
        commit.checkpoint = Some(CheckpointWrite::Put(NewCheckpoint::new(
            turn, segment, data,
        )));
        commit
    };
    applied(store.commit(put("s1", "t1", 0, json!("a"))).await?)?;
    applied(store.commit(put("s2", "t9", 0, json!("other"))).await?)?;
    applied(store.commit(put("s1", "t1", 1, json!("b"))).await?)?;
    let live = store.live_checkpoint("s1").await?.context("live")?;
    ensure!(live.segment == 1 && live.data == json!("b"));
    // Writing the live (turn, segment) again replaces its data in place.
    applied(store.commit(put("s1", "t1", 1, json!("b2"))).await?)?;
    let rewritten = store.live_checkpoint("s1").await?.context("live")?;
    ensure!(rewritten.data == json!("b2") && rewritten.created_at == live.created_at);
    let mut clear = SessionCommit::new("s1");
    clear.checkpoint = Some(CheckpointWrite::Clear);
    applied(store.commit(clear).await?)?;
    ensure!(store.live_checkpoint("s1").await?.is_none(), "cleared");
    applied(store.commit(put("s1", "t2", 0, json!("c"))).await?)?;
    let live = store.live_checkpoint("s1").await?.context("live")?;
    ensure!(live.turn_id == "t2" && live.data == json!("c"));
    let other = store
        .live_checkpoint("s2")
        .await?
        .context("other session's checkpoint")?;
    ensure!(
        other.data == json!("other"),
        "sessions do not share checkpoints"
    );
    expect_err!(
        store.live_checkpoint("ghost").await,
        StoreError::NotFound {
            entity: Entity::Session,
            ..
        }
    );
    Ok(())
}

async fn commands_replay_their_first_response_and_reject_another_body(
    f: &Fixture,
) -> anyhow::Result<()> {
    let store = &*f.store;
    session(store, "s1").await?;
    session(store, "s2").await?;
    let message = json!({"type": "message", "content": "hello"});
    let mut commit = SessionCommit::new("s1");
    commit.command = Some(NewCommand::new(
        "k1",
        message.clone(),
        json!({"status": "accepted"}),
    ));
    commit.patch.status = Some(SessionStatus::Runnable);
    commit
        .events
        .push(event("command.message", message.clone()));
    let first = applied(store.commit(commit).await?)?;
    let record = first.command.context("the command record")?;
    ensure!(record.cursor == 1 && record.response == json!({"status": "accepted"}));

    let mut replay = SessionCommit::new("s1");
    replay.command = Some(NewCommand::new(
        "k1",
        message.clone(),
        json!({"status": "second"}),
    ));
    replay
        .events
        .push(event("command.message", message.clone()));
    match store.commit(replay).await? {
        CommitOutcome::Replayed(replayed) => {
            ensure!(
                replayed.response == json!({"status": "accepted"}),
                "first response"
            );
            ensure!(replayed.cursor == 1 && replayed.command == message);
        }
        other => anyhow::bail!("expected a replay, got {other:?}"),
    }
    let after = store.get_session("s1").await?;
    ensure!(
        after.last_cursor == 1 && after.version == first.session.version,
        "nothing applied"
    );

    let mut different = SessionCommit::new("s1");
    different.command = Some(NewCommand::new("k1", json!({"type": "cancel"}), json!({})));
    different.events.push(event("turn.cancelled", json!({})));
    expect_err!(
        store.commit(different).await,
        StoreError::Conflict { entity: Entity::Command, id, .. } if id == "k1"
    );
    ensure!(store.get_session("s1").await?.last_cursor == 1);

    // Keys are scoped to their session.
    let mut elsewhere = SessionCommit::new("s2");
    elsewhere.command = Some(NewCommand::new(
        "k1",
        json!({"type": "cancel"}),
        json!({"n": 2}),
    ));
    applied(store.commit(elsewhere).await?)?;
    let stored = store.get_command("s1", "k1").await?.context("recorded")?;
    ensure!(stored.command == message && stored.response == json!({"status": "accepted"}));
    ensure!(store.get_command("s1", "k2").await?.is_none());
    Ok(())
}

fn model_call(id: &str, turn: &str, request: Value) -> NewEffect {
    NewEffect::new(
        id,
        turn,
        EffectKind::ModelCall,
        EffectStatus::Invoking,
        request,
    )
}

async fn effects_begin_once_and_move_only_under_their_guards(f: &Fixture) -> anyhow::Result<()> {
    let store = &*f.store;
    session(store, "s1").await?;
    session(store, "s2").await?;
    let mut begin = BeginEffect::new("s1", model_call("e1", "t1", json!({"prompt": "hi"})));
    begin
        .events
        .push(event("effect.started", json!({"effectId": "e1"})));
    let started = match store.begin_effect(begin.clone()).await? {
        BeginEffectOutcome::Started { effect, events } => {
            ensure!(events.len() == 1 && events[0].cursor == 1);
            effect
        }
        other => anyhow::bail!("expected a new effect, got {other:?}"),
    };
    ensure!(started.status == EffectStatus::Invoking && started.kind == EffectKind::ModelCall);
    match store.begin_effect(begin.clone()).await? {
        BeginEffectOutcome::Existing(existing) => ensure!(existing == started),
        other => anyhow::bail!("expected the existing effect, got {other:?}"),
    }
    ensure!(
        store.get_session("s1").await?.last_cursor == 1,
        "no event for a repeated begin"
    );
    expect_err!(
        store
            .begin_effect(BeginEffect::new(
                "s1",
                model_call("e1", "t1", json!({"prompt": "changed"}))
            ))
            .await,
        StoreError::Conflict {
            entity: Entity::Effect,
            ..
        }
    );
    expect_err!(
        store
            .begin_effect(BeginEffect::new(
                "s2",
                model_call("e1", "t1", json!({"prompt": "hi"}))
            ))
            .await,
        StoreError::Conflict {
            entity: Entity::Effect,
            ..
        }
    );
    let done = NewEffect::new(
        "e9",
        "t1",
        EffectKind::ModelCall,
        EffectStatus::Completed,
        json!({}),
    );
    expect_err!(
        store.begin_effect(BeginEffect::new("s1", done)).await,
        StoreError::InvalidInput { .. }
    );

    let mut complete = SessionCommit::new("s1");
    complete.effects.push(
        EffectTransition::new("e1", &[EffectStatus::Invoking], EffectStatus::Completed)
            .with_result(json!({"text": "hello"})),
    );
    applied(store.commit(complete.clone()).await?)?;
    let completed = store.get_effect("e1").await?;
    ensure!(completed.status == EffectStatus::Completed);
    ensure!(completed.result == Some(json!({"text": "hello"})));
    // Completing twice is refused: the guard sees it is no longer invoking.
    expect_err!(
        store.commit(complete).await,
        StoreError::Conflict {
            entity: Entity::Effect,
            ..
        }
    );
    // After a restart, beginning it again returns the recorded result instead of a new call.
    match store.begin_effect(begin).await? {
        BeginEffectOutcome::Existing(existing) => {
            ensure!(existing.status == EffectStatus::Completed);
            ensure!(existing.result == Some(json!({"text": "hello"})));
        }
        other => anyhow::bail!("a completed effect must not start again: {other:?}"),
    }
    let mut foreign = SessionCommit::new("s2");
    foreign.effects.push(EffectTransition::new(
        "e1",
        &[EffectStatus::Completed],
        EffectStatus::Uncertain,
    ));
    expect_err!(
        store.commit(foreign).await,
        StoreError::NotFound {
            entity: Entity::Effect,
            ..
        }
    );
    expect_err!(
        store.get_effect("nope").await,
        StoreError::NotFound {
            entity: Entity::Effect,
            ..
        }
    );
    let listed = store
        .list_effects("s1", Some(EffectStatus::Completed))
        .await?;
    ensure!(listed.len() == 1 && listed[0].effect_id == "e1");
    ensure!(
        store
            .list_effects("s1", Some(EffectStatus::Invoking))
            .await?
            .is_empty()
    );
    Ok(())
}

async fn recovery_marks_in_flight_effects_uncertain(f: &Fixture) -> anyhow::Result<()> {
    let store = &*f.store;
    session(store, "s1").await?;
    set_turn(store, "s1", SessionStatus::Running, Some("t1")).await?;
    store
        .begin_effect(BeginEffect::new("s1", model_call("e-old", "t0", json!(0))))
        .await?;
    store
        .begin_effect(BeginEffect::new("s1", model_call("e1", "t1", json!(1))))
        .await?;
    store
        .begin_effect(BeginEffect::new("s1", model_call("e2", "t1", json!(2))))
        .await?;
    let pending = NewEffect::new(
        "e3",
        "t1",
        EffectKind::CapabilityCall,
        EffectStatus::Pending,
        json!(3),
    );
    store.begin_effect(BeginEffect::new("s1", pending)).await?;
    let mut complete = SessionCommit::new("s1");
    complete.effects.push(EffectTransition::new(
        "e2",
        &[EffectStatus::Invoking],
        EffectStatus::Completed,
    ));
    applied(store.commit(complete).await?)?;
    let before = store.get_session("s1").await?.last_cursor;

    let lease = f.peer.acquire_session("s1", "replica-b", LONG).await?;
    let changed = f
        .peer
        .mark_in_flight_effects_uncertain(&lease.fence(), "replica crashed")
        .await?;
    let ids: HashSet<String> = changed.iter().map(|e| e.effect_id.clone()).collect();
    ensure!(
        ids == HashSet::from(["e1".to_owned(), "e-old".to_owned()]),
        "changed {ids:?}"
    );
    let e1 = store.get_effect("e1").await?;
    ensure!(e1.status == EffectStatus::Uncertain && e1.error.as_deref() == Some("replica crashed"));
    ensure!(
        store.get_effect("e2").await?.status == EffectStatus::Completed,
        "completed stays"
    );
    ensure!(
        store.get_effect("e3").await?.status == EffectStatus::Pending,
        "pending stays"
    );
    let session = store.get_session("s1").await?;
    ensure!(session.status == SessionStatus::Uncertain);
    // Only the active turn's effect is surfaced as an event.
    let events = store.list_events("s1", before, 10).await?;
    ensure!(events.len() == 1 && events[0].event_type == "effect.uncertain");
    ensure!(
        events[0].payload["effectId"] == json!("e1")
            && events[0].payload["kind"] == json!("model_call")
    );
    ensure!(
        f.peer
            .mark_in_flight_effects_uncertain(&lease.fence(), "again")
            .await?
            .is_empty(),
        "nothing left in flight"
    );
    f.peer.release_lease(&lease.fence()).await?;
    expect_err!(
        store
            .mark_in_flight_effects_uncertain(&lease.fence(), "late")
            .await,
        StoreError::StaleGeneration {
            reason: StaleReason::NotHeld,
            ..
        }
    );
    Ok(())
}

fn action_effect(id: &str, turn: &str) -> BeginEffect {
    let mut begin = BeginEffect::new(
        "s1",
        NewEffect::new(
            id,
            turn,
            EffectKind::CapabilityCall,
            EffectStatus::Pending,
            json!({"tool": "deploy"}),
        ),
    );
    begin.action = Some(NewAction::new(
        "helper",
        "sha256:helper-1",
        "1.0.0",
        "ops.deploy",
        json!({"input": {"env": "prod"}}),
    ));
    begin
        .events
        .push(event("action.pending", json!({"actionId": id})).in_turn(turn));
    begin
}

fn claim(id: &str, claim_id: &str, lease: Duration) -> ClaimAction {
    ClaimAction::new(id, claim_id, lease, "sha256:helper-1", "1.0.0")
}

async fn actions_are_claimed_heartbeated_and_completed_under_their_generation(
    f: &Fixture,
) -> anyhow::Result<()> {
    let store = &*f.store;
    session(store, "s1").await?;
    set_turn(store, "s1", SessionStatus::Waiting, Some("t1")).await?;
    store.begin_effect(action_effect("a1", "t1")).await?;
    let action = store.get_action("a1").await?;
    ensure!(action.status == ActionStatus::Pending && action.generation == 0);
    ensure!(action.capability_id == "ops.deploy" && action.turn_id == "t1");

    let mut scoped = ActionFilter::default();
    scoped.scope = Some(ExecutorScope::new("helper", "sha256:helper-1", "1.0.0"));
    scoped.statuses = vec![ActionStatus::Pending];
    ensure!(store.list_actions(&scoped).await?.len() == 1);
    let mut other_scope = ActionFilter::default();
    other_scope.scope = Some(ExecutorScope::new("helper", "sha256:other", "1.0.0"));
    ensure!(
        store.list_actions(&other_scope).await?.is_empty(),
        "scope filters"
    );

    expect_err!(
        store
            .claim_action(ClaimAction::new("a1", "c0", LONG, "sha256:other", "1.0.0"))
            .await,
        StoreError::Conflict {
            entity: Entity::Action,
            ..
        }
    );
    let claimed = f.peer.claim_action(claim("a1", "c1", LONG)).await?;
    ensure!(claimed.action.status == ActionStatus::Claimed && claimed.action.generation == 1);
    ensure!(claimed.event.event_type == "action.claimed");
    ensure!(claimed.event.payload == json!({"actionId": "a1", "generation": 1}));
    expect_err!(
        store.claim_action(claim("a1", "c2", LONG)).await,
        StoreError::Conflict {
            entity: Entity::Action,
            ..
        }
    );

    let beat = store
        .heartbeat_action(HeartbeatAction::new("a1", "c1", 1, LONG))
        .await?;
    ensure!(beat.lease_expires_at >= claimed.action.lease_expires_at);
    expect_err!(
        store
            .heartbeat_action(HeartbeatAction::new("a1", "c2", 1, LONG))
            .await,
        StoreError::StaleGeneration {
            entity: Entity::Action,
            reason: StaleReason::Superseded,
            ..
        }
    );
    expect_err!(
        store
            .heartbeat_action(HeartbeatAction::new("a1", "c1", 2, LONG))
            .await,
        StoreError::StaleGeneration {
            entity: Entity::Action,
            presented: 2,
            current: 1,
            ..
        }
    );

    let completion = |generation| {
        let mut commit = SessionCommit::new("s1");
        commit.actions.push(
            ActionTransition::new(
                "a1",
                ActionGuard::Claim {
                    claim_id: "c1".to_owned(),
                    generation,
                },
                ActionStatus::Completed,
            )
            .with_result(json!({"ok": true})),
        );
        commit.effects.push(
            EffectTransition::new("a1", &[EffectStatus::Pending], EffectStatus::Completed)
                .with_result(json!({"ok": true})),
        );
        commit.patch.status = Some(SessionStatus::Runnable);
        commit
            .events
            .push(event("action.completed", json!({"actionId": "a1"})));
        commit
    };
    expect_err!(
        store.commit(completion(0)).await,
        StoreError::StaleGeneration {
            entity: Entity::Action,
            ..
        }
    );
    ensure!(
        store.get_effect("a1").await?.status == EffectStatus::Pending,
        "nothing applied"
    );
    applied(store.commit(completion(1)).await?)?;
    let done = store.get_action("a1").await?;
    ensure!(done.status == ActionStatus::Completed && done.result == Some(json!({"ok": true})));
    ensure!(store.get_effect("a1").await?.status == EffectStatus::Completed);
    ensure!(store.get_session("s1").await?.status == SessionStatus::Runnable);
    expect_err!(
        store
            .heartbeat_action(HeartbeatAction::new("a1", "c1", 1, LONG))
            .await,
        StoreError::StaleGeneration {
            reason: StaleReason::NotHeld,
            ..
        }
    );

    // Work of a turn that is no longer active cannot be claimed.
    store.begin_effect(action_effect("a2", "t1")).await?;
    set_turn(store, "s1", SessionStatus::Running, Some("t2")).await?;
    expect_err!(
        store.claim_action(claim("a2", "c3", LONG)).await,
        StoreError::Conflict {
            entity: Entity::Action,
            ..
        }
    );
    let mut guarded = SessionCommit::new("s1");
    guarded.actions.push(ActionTransition::new(
        "a2",
        ActionGuard::Status(vec![ActionStatus::Claimed]),
        ActionStatus::Uncertain,
    ));
    expect_err!(
        store.commit(guarded).await,
        StoreError::Conflict {
            entity: Entity::Action,
            ..
        }
    );
    expect_err!(
        store.get_action("nope").await,
        StoreError::NotFound {
            entity: Entity::Action,
            ..
        }
    );
    expect_err!(
        store.claim_action(claim("nope", "c", LONG)).await,
        StoreError::NotFound {
            entity: Entity::Action,
            ..
        }
    );
    Ok(())
}

async fn expired_action_claims_become_uncertain(f: &Fixture) -> anyhow::Result<()> {
    let store = &*f.store;
    session(store, "s1").await?;
    set_turn(store, "s1", SessionStatus::Waiting, Some("t1")).await?;
    store.begin_effect(action_effect("a1", "t1")).await?;
    store.begin_effect(action_effect("a2", "t1")).await?;
    store.claim_action(claim("a1", "c1", SHORT)).await?;
    store.claim_action(claim("a2", "c2", LONG)).await?;
    ensure!(
        store.expire_action_claims().await?.is_empty(),
        "nothing expired yet"
    );
    tokio::time::sleep(PAST_SHORT).await;
    expect_err!(
        store
            .heartbeat_action(HeartbeatAction::new("a1", "c1", 1, LONG))
            .await,
        StoreError::StaleGeneration {
            reason: StaleReason::Expired,
            ..
        }
    );
    let mut late = SessionCommit::new("s1");
    late.actions.push(ActionTransition::new(
        "a1",
        ActionGuard::Claim {
            claim_id: "c1".to_owned(),
            generation: 1,
        },
        ActionStatus::Completed,
    ));
    expect_err!(
        store.commit(late).await,
        StoreError::StaleGeneration {
            reason: StaleReason::Expired,
            ..
        }
    );
    let before = store.get_session("s1").await?.last_cursor;
    let expired = f.peer.expire_action_claims().await?;
    ensure!(
        expired.len() == 1 && expired[0].action_id == "a1",
        "expired {expired:?}"
    );
    ensure!(store.get_action("a1").await?.status == ActionStatus::Uncertain);
    ensure!(
        store.get_action("a2").await?.status == ActionStatus::Claimed,
        "live claim kept"
    );
    let effect = store.get_effect("a1").await?;
    ensure!(effect.status == EffectStatus::Uncertain && effect.error.is_some());
    ensure!(store.get_session("s1").await?.status == SessionStatus::Uncertain);
    let events = store.list_events("s1", before, 10).await?;
    ensure!(events.len() == 1 && events[0].event_type == "action.uncertain");
    ensure!(events[0].payload == json!({"actionId": "a1"}));
    ensure!(
        store.expire_action_claims().await?.is_empty(),
        "expiry happens once"
    );
    Ok(())
}

async fn runnable_sessions_are_leased_to_one_replica_at_a_time(f: &Fixture) -> anyhow::Result<()> {
    let (a, b) = (&*f.store, &*f.peer);
    session(a, "idle").await?;
    session(a, "s1").await?;
    ensure!(
        a.claim_runnable_session("r1", LONG).await?.is_none(),
        "idle is not runnable"
    );
    set_turn(a, "s1", SessionStatus::Runnable, Some("t1")).await?;
    let lease = a
        .claim_runnable_session("r1", LONG)
        .await?
        .context("r1 claims s1")?;
    ensure!(lease.session_id == "s1" && lease.generation == 1 && lease.replica_id == "r1");
    ensure!(
        b.claim_runnable_session("r2", LONG).await?.is_none(),
        "held by r1"
    );
    let owned = a.get_session("s1").await?;
    let owner = owned.owner.context("owner recorded")?;
    ensure!(owner.replica_id == "r1" && owned.generation == 1);
    expect_err!(
        b.acquire_session("s1", "r2", LONG).await,
        StoreError::Conflict {
            entity: Entity::Session,
            ..
        }
    );
    let again = a.acquire_session("s1", "r1", LONG).await?;
    ensure!(
        again.generation == 1,
        "the holder re-acquires at the same generation"
    );
    let renewed = a.renew_lease(&lease.fence(), LONG).await?;
    ensure!(renewed.generation == 1 && renewed.expires_at >= lease.expires_at);
    a.release_lease(&lease.fence()).await?;
    ensure!(a.get_session("s1").await?.owner.is_none());
    let taken = b
        .claim_runnable_session("r2", LONG)
        .await?
        .context("released, so claimable")?;
    ensure!(taken.generation == 2 && taken.replica_id == "r2");
    expect_err!(
        a.acquire_session("ghost", "r1", LONG).await,
        StoreError::NotFound {
            entity: Entity::Session,
            ..
        }
    );
    Ok(())
}

async fn an_expired_or_superseded_lease_holder_cannot_write(f: &Fixture) -> anyhow::Result<()> {
    let (a, b) = (&*f.store, &*f.peer);
    session(a, "s1").await?;
    set_turn(a, "s1", SessionStatus::Running, Some("t1")).await?;
    let lease = a
        .claim_runnable_session("r1", SHORT)
        .await?
        .context("r1 claims")?;
    let fence = lease.fence();
    tokio::time::sleep(PAST_SHORT).await;
    let step = |fence: corral_store::Fence| {
        let mut commit = SessionCommit::new("s1");
        commit.fence = Some(fence);
        commit.events.push(event("turn.step", json!({})));
        commit.checkpoint = Some(CheckpointWrite::Put(NewCheckpoint::new("t1", 0, json!({}))));
        commit
    };
    expect_err!(
        a.commit(step(fence.clone())).await,
        StoreError::StaleGeneration {
            entity: Entity::Session,
            reason: StaleReason::Expired,
            ..
        }
    );
    expect_err!(
        a.renew_lease(&fence, LONG).await,
        StoreError::StaleGeneration {
            reason: StaleReason::Expired,
            ..
        }
    );
    let before = a.get_session("s1").await?;

    // The expired session is claimable again; the new holder's generation fences the old one.
    let takeover = b
        .claim_runnable_session("r2", LONG)
        .await?
        .context("r2 takes over")?;
    ensure!(takeover.generation == lease.generation + 1);
    expect_err!(
        a.commit(step(fence.clone())).await,
        StoreError::StaleGeneration {
            presented: 1,
            current: 2,
            reason: StaleReason::Superseded,
            ..
        }
    );
    expect_err!(
        a.append_event("s1", Some(&fence), event("late", json!({})))
            .await,
        StoreError::StaleGeneration { .. }
    );
    expect_err!(
        a.begin_effect({
            let mut begin = BeginEffect::new("s1", model_call("e1", "t1", json!({})));
            begin.fence = Some(fence.clone());
            begin
        })
        .await,
        StoreError::StaleGeneration { .. }
    );
    expect_err!(
        a.release_lease(&fence).await,
        StoreError::StaleGeneration { .. }
    );
    expect_err!(
        a.acquire_session("s1", "r1", LONG).await,
        StoreError::Conflict { .. }
    );
    let unchanged = a.get_session("s1").await?;
    ensure!(unchanged.last_cursor == before.last_cursor && unchanged.version == before.version);
    ensure!(
        a.live_checkpoint("s1").await?.is_none(),
        "no write of the stale holder landed"
    );
    ensure!(
        a.get_effect("e1").await.is_err(),
        "no effect of the stale holder landed"
    );

    let receipt = applied(b.commit(step(takeover.fence())).await?)?;
    ensure!(receipt.events[0].cursor == before.last_cursor + 1);
    Ok(())
}

async fn sixteen_concurrent_appenders_get_gap_free_cursors(f: &Fixture) -> anyhow::Result<()> {
    const TASKS: u64 = 16;
    const EACH: u64 = 25;
    session(&*f.store, "s1").await?;
    let barrier = Arc::new(Barrier::new(TASKS as usize));
    let mut tasks = Vec::new();
    for task in 0..TASKS {
        // Half the writers go through the second replica's pool.
        let store = if task % 2 == 0 {
            Arc::clone(&f.store)
        } else {
            Arc::clone(&f.peer)
        };
        let barrier = Arc::clone(&barrier);
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let mut cursors = Vec::new();
            for n in 0..EACH {
                let payload = json!({"task": task, "n": n});
                let cursor = if n % 2 == 0 {
                    store
                        .append_event("s1", None, event("tick", payload))
                        .await?
                        .cursor
                } else {
                    let mut commit = SessionCommit::new("s1");
                    commit.events.push(event("tick", payload));
                    applied(store.commit(commit).await?)?.events[0].cursor
                };
                cursors.push(cursor);
            }
            anyhow::Ok(cursors)
        }));
    }
    let mut returned = Vec::new();
    for task in tasks {
        returned.extend(task.await??);
    }
    returned.sort_unstable();
    ensure!(
        returned == (1..=TASKS * EACH).collect::<Vec<_>>(),
        "cursors handed out"
    );

    let mut events = Vec::new();
    let mut after = 0;
    loop {
        let page = f.store.list_events("s1", after, MAX_PAGE).await?;
        let Some(last) = page.last() else { break };
        after = last.cursor;
        events.extend(page);
    }
    let cursors: Vec<u64> = events.iter().map(|e| e.cursor).collect();
    ensure!(
        cursors == (1..=TASKS * EACH).collect::<Vec<_>>(),
        "stored cursors are 1..=N"
    );
    let mut last_n: BTreeMap<u64, i64> = BTreeMap::new();
    let mut seen = HashSet::new();
    for e in &events {
        let task = e.payload["task"].as_u64().context("task")?;
        let n = e.payload["n"].as_i64().context("n")?;
        ensure!(seen.insert((task, n)), "event ({task}, {n}) stored twice");
        let previous = last_n.insert(task, n).unwrap_or(-1);
        ensure!(n == previous + 1, "task {task}'s events out of order");
    }
    ensure!(seen.len() as u64 == TASKS * EACH);
    ensure!(f.store.get_session("s1").await?.last_cursor == TASKS * EACH);
    Ok(())
}

async fn racing_replicas_never_both_win_a_session(f: &Fixture) -> anyhow::Result<()> {
    for round in 0..30 {
        let id = format!("s{round:02}");
        session(&*f.store, &id).await?;
        set_turn(&*f.store, &id, SessionStatus::Runnable, Some("t1")).await?;
        let barrier = Arc::new(Barrier::new(2));
        let racers: Vec<_> = [("r1", Arc::clone(&f.store)), ("r2", Arc::clone(&f.peer))]
            .into_iter()
            .map(|(replica, store)| {
                let barrier = Arc::clone(&barrier);
                tokio::spawn(async move {
                    barrier.wait().await;
                    store.claim_runnable_session(replica, LONG).await
                })
            })
            .collect();
        let mut winners = Vec::new();
        for racer in racers {
            if let Some(lease) = racer.await?? {
                winners.push(lease);
            }
        }
        ensure!(
            winners.len() == 1,
            "round {round}: {} replicas won",
            winners.len()
        );
        ensure!(
            winners[0].session_id == id,
            "round {round}: won {}",
            winners[0].session_id
        );

        // Both asking for the same session by id: one lease, one conflict.
        let other = format!("x{round:02}");
        session(&*f.store, &other).await?;
        let barrier = Arc::new(Barrier::new(2));
        let racers: Vec<_> = [("r1", Arc::clone(&f.store)), ("r2", Arc::clone(&f.peer))]
            .into_iter()
            .map(|(replica, store)| {
                let barrier = Arc::clone(&barrier);
                let other = other.clone();
                tokio::spawn(async move {
                    barrier.wait().await;
                    store.acquire_session(&other, replica, LONG).await
                })
            })
            .collect();
        let mut granted = 0;
        for racer in racers {
            match racer.await? {
                Ok(_) => granted += 1,
                Err(StoreError::Conflict { .. }) => {}
                Err(error) => return Err(error.into()),
            }
        }
        ensure!(
            granted == 1,
            "round {round}: {granted} replicas acquired {other}"
        );
    }
    Ok(())
}

async fn concurrent_replays_of_a_command_apply_it_once(f: &Fixture) -> anyhow::Result<()> {
    session(&*f.store, "s1").await?;
    let barrier = Arc::new(Barrier::new(8));
    let mut tasks = Vec::new();
    for task in 0..8 {
        let store = if task % 2 == 0 {
            Arc::clone(&f.store)
        } else {
            Arc::clone(&f.peer)
        };
        let barrier = Arc::clone(&barrier);
        tasks.push(tokio::spawn(async move {
            let mut commit = SessionCommit::new("s1");
            let command = json!({"type": "message", "content": "hi"});
            commit.command = Some(NewCommand::new("k", command.clone(), json!({"by": task})));
            commit.events.push(event("command.message", command));
            barrier.wait().await;
            store.commit(commit).await
        }));
    }
    let mut first = None;
    let mut replays = Vec::new();
    for task in tasks {
        match task.await?? {
            CommitOutcome::Applied(receipt) => {
                ensure!(first.is_none(), "applied twice");
                first = receipt.command;
            }
            CommitOutcome::Replayed(record) => replays.push(record),
            other => anyhow::bail!("unexpected {other:?}"),
        }
    }
    let first = first.context("applied once")?;
    ensure!(replays.len() == 7);
    ensure!(
        replays
            .iter()
            .all(|r| r.response == first.response && r.cursor == first.cursor)
    );
    ensure!(
        f.store.get_session("s1").await?.last_cursor == 1,
        "one event"
    );

    let barrier = Arc::new(Barrier::new(8));
    let mut tasks = Vec::new();
    for task in 0..8 {
        let store = if task % 2 == 0 {
            Arc::clone(&f.store)
        } else {
            Arc::clone(&f.peer)
        };
        let barrier = Arc::clone(&barrier);
        tasks.push(tokio::spawn(async move {
            let mut commit = SessionCommit::new("s1");
            commit.command = Some(NewCommand::new("other", json!({"n": task}), json!({})));
            barrier.wait().await;
            store.commit(commit).await
        }));
    }
    let (mut applied_count, mut conflicts) = (0, 0);
    for task in tasks {
        match task.await? {
            Ok(CommitOutcome::Applied(_)) => applied_count += 1,
            Err(StoreError::Conflict {
                entity: Entity::Command,
                ..
            }) => conflicts += 1,
            other => anyhow::bail!("unexpected {other:?}"),
        }
    }
    ensure!(
        applied_count == 1 && conflicts == 7,
        "{applied_count} applied, {conflicts} conflicts"
    );
    Ok(())
}

async fn close(store: &dyn Store, id: &str) -> anyhow::Result<()> {
    let mut commit = SessionCommit::new(id);
    commit.patch.status = Some(SessionStatus::Closed);
    let receipt = applied(store.commit(commit).await?)?;
    ensure!(
        receipt.session.closed_at.is_some(),
        "closing records the time"
    );
    Ok(())
}

async fn retention_expires_closed_sessions_per_tenant(f: &Fixture) -> anyhow::Result<()> {
    let store = &*f.store;
    session_of(store, "acme-closed", "acme").await?;
    session_of(store, "acme-open", "acme").await?;
    session_of(store, "acme-reopened", "acme").await?;
    session_of(store, "globex-closed", "globex").await?;
    session_of(store, "initech-closed", "initech").await?;
    // The doomed session has a bit of everything that must go with it.
    set_turn(store, "acme-closed", SessionStatus::Waiting, Some("t1")).await?;
    let mut begin = action_effect("a1", "t1");
    begin.session_id = "acme-closed".to_owned();
    store.begin_effect(begin).await?;
    let mut commit = SessionCommit::new("acme-closed");
    commit.items.push(NewItem::new(json!("hi")));
    commit.checkpoint = Some(CheckpointWrite::Put(NewCheckpoint::new("t1", 0, json!({}))));
    applied(store.commit(commit).await?)?;
    for id in [
        "acme-closed",
        "acme-reopened",
        "globex-closed",
        "initech-closed",
    ] {
        close(store, id).await?;
    }
    set_turn(store, "acme-reopened", SessionStatus::Idle, None).await?;
    ensure!(
        store
            .get_session("acme-reopened")
            .await?
            .closed_at
            .is_none()
    );

    let mut policy = RetentionPolicy::default();
    policy.closed_session_ttl = Some(Duration::ZERO);
    policy
        .tenant_closed_session_ttl
        .insert("globex".to_owned(), Duration::from_secs(3600));
    let report = f.peer.apply_retention(&policy).await?;
    ensure!(report.sessions_deleted == 2, "deleted {report:?}");
    for gone in ["acme-closed", "initech-closed"] {
        expect_err!(store.get_session(gone).await, StoreError::NotFound { .. });
    }
    for kept in ["acme-open", "acme-reopened", "globex-closed"] {
        store
            .get_session(kept)
            .await
            .with_context(|| format!("{kept} kept"))?;
    }
    expect_err!(store.get_effect("a1").await, StoreError::NotFound { .. });
    expect_err!(store.get_action("a1").await, StoreError::NotFound { .. });
    expect_err!(
        store.list_events("acme-closed", 0, 10).await,
        StoreError::NotFound { .. }
    );

    // Without a default, only tenants with their own expiry lose sessions.
    close(store, "acme-open").await?;
    let mut policy = RetentionPolicy::default();
    policy
        .tenant_closed_session_ttl
        .insert("globex".to_owned(), Duration::ZERO);
    let report = store.apply_retention(&policy).await?;
    ensure!(report.sessions_deleted == 1, "{report:?}");
    expect_err!(
        store.get_session("globex-closed").await,
        StoreError::NotFound { .. }
    );
    store.get_session("acme-open").await?;
    // The id of a deleted session is free again.
    session_of(store, "acme-closed", "acme").await?;
    Ok(())
}

async fn retention_keeps_idempotency_records_for_the_window(f: &Fixture) -> anyhow::Result<()> {
    let store = &*f.store;
    session(store, "s1").await?;
    let command = json!({"type": "message", "content": "hello"});
    let make = || {
        let mut commit = SessionCommit::new("s1");
        commit.command = Some(NewCommand::new(
            "k1",
            command.clone(),
            json!({"status": "accepted"}),
        ));
        commit.events.push(event("command.message", json!({})));
        commit
    };
    applied(store.commit(make()).await?)?;
    close(store, "s1").await?;
    let mut policy = RetentionPolicy::default();
    policy.closed_session_ttl = Some(Duration::ZERO);
    let report = store.apply_retention(&policy).await?;
    ensure!(
        report.sessions_deleted == 1 && report.commands_pruned == 0,
        "{report:?}"
    );
    // A client retrying within the window still gets its first response.
    match store.commit(make()).await? {
        CommitOutcome::Replayed(record) => {
            ensure!(record.response == json!({"status": "accepted"}))
        }
        other => anyhow::bail!("expected a replay after the session expired, got {other:?}"),
    }
    ensure!(store.get_command("s1", "k1").await?.is_some());
    policy.idempotency_window = Duration::ZERO;
    let report = store.apply_retention(&policy).await?;
    ensure!(report.commands_pruned == 1, "{report:?}");
    ensure!(store.get_command("s1", "k1").await?.is_none());
    expect_err!(
        store.commit(make()).await,
        StoreError::NotFound {
            entity: Entity::Session,
            ..
        }
    );
    Ok(())
}

async fn retention_prunes_superseded_checkpoints(f: &Fixture) -> anyhow::Result<()> {
    let store = &*f.store;
    session(store, "s1").await?;
    for segment in 0..3 {
        let mut commit = SessionCommit::new("s1");
        commit.checkpoint = Some(CheckpointWrite::Put(NewCheckpoint::new(
            "t1",
            segment,
            json!(segment),
        )));
        applied(store.commit(commit).await?)?;
    }
    let mut policy = RetentionPolicy::default();
    policy.superseded_checkpoint_ttl = Duration::from_secs(3600);
    ensure!(
        store.apply_retention(&policy).await?.checkpoints_pruned == 0,
        "too recent"
    );
    policy.superseded_checkpoint_ttl = Duration::ZERO;
    let report = store.apply_retention(&policy).await?;
    ensure!(report.checkpoints_pruned == 2, "{report:?}");
    let live = store
        .live_checkpoint("s1")
        .await?
        .context("live checkpoint kept")?;
    ensure!(live.segment == 2);
    ensure!(store.apply_retention(&policy).await?.checkpoints_pruned == 0);
    Ok(())
}

async fn out_of_range_arguments_are_rejected(f: &Fixture) -> anyhow::Result<()> {
    let store = &*f.store;
    session(store, "s1").await?;
    session(store, "s2").await?;
    expect_err!(
        store.claim_runnable_session("r1", Duration::ZERO).await,
        StoreError::InvalidInput { what: "lease", .. }
    );
    expect_err!(
        store.claim_runnable_session("", LONG).await,
        StoreError::InvalidInput {
            what: "replica id",
            ..
        }
    );
    expect_err!(
        store
            .acquire_session("s1", "r1", Duration::from_micros(10))
            .await,
        StoreError::InvalidInput { what: "lease", .. }
    );
    let lease = store.acquire_session("s1", "r1", LONG).await?;
    let mut wrong_session = SessionCommit::new("s2");
    wrong_session.fence = Some(lease.fence());
    expect_err!(
        store.commit(wrong_session).await,
        StoreError::InvalidInput { what: "fence", .. }
    );
    let mut huge = SessionCommit::new("s1");
    huge.checkpoint = Some(CheckpointWrite::Put(NewCheckpoint::new(
        "t1",
        u64::MAX,
        json!({}),
    )));
    expect_err!(
        store.commit(huge).await,
        StoreError::InvalidInput {
            what: "checkpoint segment",
            ..
        }
    );
    expect_err!(
        store.list_events("s1", u64::MAX, 10).await,
        StoreError::InvalidCursor { .. }
    );
    expect_err!(
        store
            .create_session(NewSession::new("", "acme", "alice", "helper", json!({})))
            .await,
        StoreError::InvalidInput {
            what: "session id",
            ..
        }
    );
    expect_err!(
        store
            .heartbeat_action(HeartbeatAction::new("a1", "c1", 1, Duration::ZERO))
            .await,
        StoreError::InvalidInput { what: "lease", .. }
    );
    Ok(())
}

/// The next notice of `receiver`, failing after a few seconds.
async fn next_notice<T: Clone>(
    receiver: &mut tokio::sync::broadcast::Receiver<T>,
) -> anyhow::Result<T> {
    Ok(
        tokio::time::timeout(Duration::from_secs(5), receiver.recv())
            .await
            .context("no notice within 5 s")??,
    )
}

/// Fails if `receiver` gets a notice within a short while.
async fn no_notice<T: Clone + std::fmt::Debug>(
    receiver: &mut tokio::sync::broadcast::Receiver<T>,
) -> anyhow::Result<()> {
    match tokio::time::timeout(Duration::from_millis(300), receiver.recv()).await {
        Err(_) => Ok(()),
        Ok(notice) => anyhow::bail!("unexpected notice {notice:?}"),
    }
}

async fn the_change_feed_announces_committed_events_and_work(f: &Fixture) -> anyhow::Result<()> {
    use corral_store::{EventNotice, WorkNotice};
    let store = &*f.store;
    session(store, "s1").await?;
    let mut mine = store.subscribe_events();
    // On PostgreSQL the peer is a second store on the same database, as another replica's.
    let mut theirs = f.peer.subscribe_events();
    let mut work = f.peer.subscribe_work();

    let mut commit = SessionCommit::new("s1");
    commit.events.push(event("a", json!({})));
    commit.events.push(event("b", json!({})));
    applied(store.commit(commit).await?)?;
    for receiver in [&mut mine, &mut theirs] {
        for cursor in [1, 2] {
            let notice = next_notice(receiver).await?;
            ensure!(
                notice
                    == EventNotice {
                        session_id: "s1".into(),
                        cursor
                    },
                "got {notice:?}"
            );
        }
    }
    // A rolled-back write announces nothing; a store does not hear its own notices twice.
    let mut stale = SessionCommit::new("s1");
    stale.expect_version = Some(1);
    stale.events.push(event("c", json!({})));
    expect_err!(store.commit(stale).await, StoreError::Conflict { .. });
    no_notice(&mut mine).await?;
    no_notice(&mut theirs).await?;

    set_turn(store, "s1", SessionStatus::Waiting, Some("t1")).await?;
    store.begin_effect(action_effect("a1", "t1")).await?;
    let notice = next_notice(&mut work).await?;
    ensure!(
        notice
            == WorkNotice {
                action_id: "a1".into()
            },
        "got {notice:?}"
    );
    // The peer's writes reach the first store too.
    f.peer
        .append_event("s1", None, event("d", json!({})))
        .await?;
    ensure!(next_notice(&mut mine).await?.cursor == 3);
    Ok(())
}

fn invoking_effect(id: &str, turn: &str) -> BeginEffect {
    BeginEffect::new(
        "s1",
        NewEffect::new(
            id,
            turn,
            EffectKind::ModelCall,
            EffectStatus::Invoking,
            json!({"model": "m"}),
        ),
    )
}

async fn cancel_turn_fences_the_turn_in_one_transaction(f: &Fixture) -> anyhow::Result<()> {
    let store = &*f.store;
    session(store, "s1").await?;
    let mut start = SessionCommit::new("s1");
    start.patch.status = Some(SessionStatus::Running);
    start.patch.active_turn_id = Some(Some("t1".into()));
    start.patch.state = Some(json!({"plan": "t1"}));
    start.checkpoint = Some(CheckpointWrite::Put(NewCheckpoint::new("t1", 0, json!({}))));
    applied(store.commit(start).await?)?;
    store.begin_effect(action_effect("a1", "t1")).await?;
    store.begin_effect(action_effect("a2", "t1")).await?;
    store.begin_effect(invoking_effect("m1", "t1")).await?;
    store.claim_action(claim("a2", "c2", LONG)).await?;

    let mut wrong = CancelTurn::new("s1");
    wrong.expect_turn = Some(Some("t0".into()));
    expect_err!(store.cancel_turn(wrong).await, StoreError::Conflict { .. });

    let mut cancel = CancelTurn::new("s1");
    cancel.expect_turn = Some(Some("t1".into()));
    cancel.reason = Some("user".into());
    cancel.restore_state = Some(json!({"plan": null}));
    cancel.command = Some(NewCommand::new(
        "k1",
        json!({"type": "cancel"}),
        json!({"ok": 1}),
    ));
    let receipt = applied(f.peer.cancel_turn(cancel.clone()).await?)?;
    ensure!(receipt.events.len() == 1 && receipt.events[0].event_type == "turn.cancelled");
    ensure!(receipt.events[0].payload == json!({"reason": "user"}));
    ensure!(receipt.events[0].turn_id.as_deref() == Some("t1"));
    let s = store.get_session("s1").await?;
    ensure!(s.status == SessionStatus::Cancelled && s.active_turn_id.is_none());
    ensure!(s.state == json!({"plan": null}));
    ensure!(store.live_checkpoint("s1").await?.is_none());
    ensure!(store.get_action("a1").await?.status == ActionStatus::Cancelled);
    ensure!(store.get_effect("a1").await?.status == EffectStatus::Cancelled);
    ensure!(store.get_action("a2").await?.status == ActionStatus::Uncertain);
    ensure!(store.get_effect("a2").await?.status == EffectStatus::Uncertain);
    let model = store.get_effect("m1").await?;
    ensure!(model.status == EffectStatus::Uncertain && model.error.is_some());
    // A replay answers with the first response; a claim or heartbeat on the turn fails.
    ensure!(matches!(
        store.cancel_turn(cancel).await?,
        CommitOutcome::Replayed(_)
    ));
    expect_err!(
        store
            .heartbeat_action(HeartbeatAction::new("a2", "c2", 1, LONG))
            .await,
        StoreError::StaleGeneration { .. }
    );
    Ok(())
}

async fn a_cancel_racing_a_turn_completion_has_one_winner(f: &Fixture) -> anyhow::Result<()> {
    let store = &*f.store;
    session(store, "s1").await?;
    for round in 0..10 {
        let turn = format!("t{round}");
        set_turn(store, "s1", SessionStatus::Running, Some(&turn)).await?;
        let mut complete = SessionCommit::new("s1");
        complete.expect_turn = Some(Some(turn.clone()));
        complete.patch.status = Some(SessionStatus::Completed);
        complete.patch.active_turn_id = Some(None);
        complete
            .events
            .push(event("turn.completed", json!({})).in_turn(turn.clone()));
        let mut cancel = CancelTurn::new("s1");
        cancel.expect_turn = Some(Some(turn.clone()));
        let barrier = Barrier::new(2);
        let (completed, cancelled) = tokio::join!(
            async {
                barrier.wait().await;
                f.store.commit(complete).await
            },
            async {
                barrier.wait().await;
                f.peer.cancel_turn(cancel).await
            }
        );
        let s = store.get_session("s1").await?;
        ensure!(s.active_turn_id.is_none());
        match (completed, cancelled) {
            (Ok(_), Err(StoreError::Conflict { .. })) => {
                ensure!(s.status == SessionStatus::Completed)
            }
            (Err(StoreError::Conflict { .. }), Ok(_)) => {
                ensure!(s.status == SessionStatus::Cancelled)
            }
            other => anyhow::bail!("round {round}: not exactly one winner: {other:?}"),
        }
        let last = store.list_events("s1", s.last_cursor - 1, 1).await?;
        ensure!(
            ["turn.completed", "turn.cancelled"].contains(&last[0].event_type.as_str()),
            "one final event"
        );
    }
    Ok(())
}

fn result_command(key: &str, outcome: &Value) -> NewCommand {
    NewCommand::new(
        key,
        json!({"type": "action_result", "outcome": outcome}),
        json!({"status": "accepted"}),
    )
}

async fn action_results_complete_action_effect_and_session_together(
    f: &Fixture,
) -> anyhow::Result<()> {
    let store = &*f.store;
    session(store, "s1").await?;
    set_turn(store, "s1", SessionStatus::Waiting, Some("t1")).await?;
    store.begin_effect(action_effect("a1", "t1")).await?;
    let claimed = store.claim_action(claim("a1", "c1", LONG)).await?;
    // The same claim again is the same grant.
    let again = f.peer.claim_action(claim("a1", "c1", LONG)).await?;
    ensure!(again.action.generation == 1 && again.event == claimed.event);
    expect_err!(
        store.claim_action(claim("a1", "c9", LONG)).await,
        StoreError::Conflict { .. }
    );

    let outcome = json!({"ok": true, "value": 42});
    let stale = CompleteAction::new(
        "s1",
        "a1",
        "c1",
        2,
        outcome.clone(),
        result_command("r0", &outcome),
    );
    expect_err!(
        store.complete_action(stale).await,
        StoreError::StaleGeneration { .. }
    );
    let done = CompleteAction::new(
        "s1",
        "a1",
        "c1",
        1,
        outcome.clone(),
        result_command("r1", &outcome),
    );
    let receipt = applied(store.complete_action(done.clone()).await?)?;
    ensure!(receipt.session.status == SessionStatus::Runnable);
    ensure!(receipt.events[0].event_type == "action.completed");
    ensure!(receipt.events[0].payload == json!({"actionId": "a1", "result": 42}));
    let action = store.get_action("a1").await?;
    ensure!(action.status == ActionStatus::Completed && action.result == Some(outcome.clone()));
    let effect = store.get_effect("a1").await?;
    ensure!(effect.status == EffectStatus::Completed && effect.result == Some(outcome.clone()));
    let first = receipt.command.context("the command is recorded")?;

    // Again under the same key, or another key: the first receipt.
    let CommitOutcome::Replayed(replay) = f.peer.complete_action(done).await? else {
        anyhow::bail!("not a replay");
    };
    ensure!(replay.cursor == first.cursor && replay.response == first.response);
    let other_key = CompleteAction::new(
        "s1",
        "a1",
        "c1",
        1,
        outcome.clone(),
        result_command("r2", &outcome),
    );
    let CommitOutcome::Replayed(replay) = store.complete_action(other_key).await? else {
        anyhow::bail!("not a replay");
    };
    ensure!(replay.cursor == first.cursor);
    ensure!(store.get_command("s1", "r2").await?.is_some());
    let different = json!({"ok": false});
    let conflicting = CompleteAction::new(
        "s1",
        "a1",
        "c1",
        1,
        different.clone(),
        result_command("r3", &different),
    );
    expect_err!(
        store.complete_action(conflicting).await,
        StoreError::Conflict { .. }
    );
    Ok(())
}

async fn uncertain_effects_are_resolved_by_retry_or_outcome(f: &Fixture) -> anyhow::Result<()> {
    let store = &*f.store;
    session(store, "s1").await?;
    set_turn(store, "s1", SessionStatus::Waiting, Some("t1")).await?;
    store.begin_effect(action_effect("a1", "t1")).await?;
    store.begin_effect(invoking_effect("m1", "t1")).await?;
    store.claim_action(claim("a1", "c1", SHORT)).await?;
    tokio::time::sleep(PAST_SHORT).await;
    ensure!(store.expire_action_claims().await?.len() == 1);
    ensure!(
        store
            .recover_in_flight_effects("restart", true)
            .await?
            .len()
            == 1
    );
    ensure!(store.get_session("s1").await?.status == SessionStatus::Uncertain);

    expect_err!(
        store
            .resolve_effect(ResolveEffect::new("s1", "nope", Resolution::Retry))
            .await,
        StoreError::NotFound { .. }
    );
    let mut work = f.peer.subscribe_work();
    let receipt = applied(
        store
            .resolve_effect(ResolveEffect::new("s1", "a1", Resolution::Retry))
            .await?,
    )?;
    ensure!(receipt.events[0].event_type == "effect.resolved");
    ensure!(
        receipt.session.status == SessionStatus::Uncertain,
        "m1 is still uncertain"
    );
    ensure!(next_notice(&mut work).await?.action_id == "a1");
    let action = store.get_action("a1").await?;
    ensure!(action.status == ActionStatus::Pending && action.claim_id.is_none());
    ensure!(store.get_effect("a1").await?.status == EffectStatus::Pending);
    expect_err!(
        store
            .resolve_effect(ResolveEffect::new("s1", "a1", Resolution::Retry))
            .await,
        StoreError::Conflict { .. }
    );
    let receipt = applied(
        store
            .resolve_effect(ResolveEffect::new(
                "s1",
                "m1",
                Resolution::Complete(json!({"text": "hi"})),
            ))
            .await?,
    )?;
    ensure!(receipt.session.status == SessionStatus::Runnable);
    let model = store.get_effect("m1").await?;
    ensure!(model.status == EffectStatus::Completed && model.result == Some(json!({"text": "hi"})));
    let reclaimed = store.claim_action(claim("a1", "c2", LONG)).await?;
    ensure!(
        reclaimed.action.generation == 2,
        "generations keep increasing"
    );
    Ok(())
}

async fn start_up_recovery_marks_every_in_flight_effect_uncertain(
    f: &Fixture,
) -> anyhow::Result<()> {
    let store = &*f.store;
    session(store, "s1").await?;
    session(store, "s2").await?;
    set_turn(store, "s1", SessionStatus::Running, Some("t1")).await?;
    store.begin_effect(invoking_effect("m1", "t1")).await?;
    let mut other = invoking_effect("m2", "t2");
    other.session_id = "s2".into();
    set_turn(store, "s2", SessionStatus::Running, Some("t2")).await?;
    store.begin_effect(other).await?;
    // s2 is leased by a live replica: skipped unless leased_too.
    store.acquire_session("s2", "replica-b", LONG).await?;
    let changed = f.peer.recover_in_flight_effects("restarted", false).await?;
    ensure!(changed.len() == 1 && changed[0].effect_id == "m1");
    let s1 = store.get_session("s1").await?;
    ensure!(s1.status == SessionStatus::Uncertain);
    let last = store.list_events("s1", s1.last_cursor - 1, 1).await?;
    ensure!(last[0].event_type == "effect.uncertain");
    let changed = store.recover_in_flight_effects("restarted", true).await?;
    ensure!(changed.len() == 1 && changed[0].effect_id == "m2");
    ensure!(
        store
            .recover_in_flight_effects("again", true)
            .await?
            .is_empty()
    );
    Ok(())
}

async fn commits_are_guarded_on_turn_and_status(f: &Fixture) -> anyhow::Result<()> {
    let store = &*f.store;
    session(store, "s1").await?;
    set_turn(store, "s1", SessionStatus::Running, Some("t1")).await?;
    let mut stale = SessionCommit::new("s1");
    stale.expect_turn = Some(None);
    stale.events.push(event("x", json!({})));
    expect_err!(store.commit(stale).await, StoreError::Conflict { .. });
    let mut status = SessionCommit::new("s1");
    status.expect_status = vec![SessionStatus::Idle];
    expect_err!(store.commit(status).await, StoreError::Conflict { .. });
    let mut ok = SessionCommit::new("s1");
    ok.expect_turn = Some(Some("t1".into()));
    ok.expect_status = vec![SessionStatus::Running];
    applied(store.commit(ok).await?)?;
    let a = corral_store::replica_id();
    ensure!(
        a != corral_store::replica_id() && !a.is_empty(),
        "replica ids are unique"
    );
    Ok(())
}

async fn sessions_actions_and_effects_page_by_key(f: &Fixture) -> anyhow::Result<()> {
    let store = &*f.store;
    for id in ["s1", "s2", "s3", "s4", "s5"] {
        session(store, id).await?;
    }
    set_turn(store, "s3", SessionStatus::Waiting, Some("t1")).await?;
    let mut all = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = store
            .page_sessions(&SessionFilter::default(), after.as_deref(), 2)
            .await?;
        all.extend(page.iter().map(|s| s.id.clone()));
        if page.len() < 2 {
            break;
        }
        after = page.last().map(|s| s.id.clone());
    }
    ensure!(all == ["s1", "s2", "s3", "s4", "s5"], "pages {all:?}");
    let mut waiting = SessionFilter::default();
    waiting.statuses = vec![SessionStatus::Waiting, SessionStatus::Running];
    let page = store.page_sessions(&waiting, None, 10).await?;
    ensure!(page.len() == 1 && page[0].id == "s3");

    set_turn(store, "s1", SessionStatus::Waiting, Some("t1")).await?;
    for id in ["a1", "a2", "a3"] {
        store.begin_effect(action_effect(id, "t1")).await?;
    }
    store.begin_effect(invoking_effect("m1", "t1")).await?;
    let mut pending = ActionFilter::default();
    pending.statuses = vec![ActionStatus::Pending];
    let first = store.page_actions(&pending, None, 2).await?;
    let rest = store
        .page_actions(&pending, Some(&first[1].action_id), 2)
        .await?;
    ensure!(first.len() == 2 && rest.len() == 1 && rest[0].action_id == "a3");
    let effects = store.page_effects("s1", None, Some("a2"), 10).await?;
    let ids: Vec<&str> = effects.iter().map(|e| e.effect_id.as_str()).collect();
    ensure!(ids == ["a3", "m1"], "effects {ids:?}");
    let invoking = store
        .page_effects("s1", Some(EffectStatus::Invoking), None, 10)
        .await?;
    ensure!(invoking.len() == 1);
    expect_err!(
        store
            .page_sessions(&SessionFilter::default(), None, 0)
            .await,
        StoreError::InvalidInput { .. }
    );
    Ok(())
}

async fn claim_next_spreads_executors_over_the_work(f: &Fixture) -> anyhow::Result<()> {
    let store = &*f.store;
    session(store, "s1").await?;
    let scope = ExecutorScope::new("helper", "sha256:helper-1", "1.0.0");
    // The race that matters is timing-bound: a claim that commits between the other search's
    // snapshot and its lock. Each round starts the peer's claim a little later, sweeping its
    // search across the first claim's transaction.
    for round in 0..CLAIM_RACES {
        let turn = format!("t{round}");
        set_turn(store, "s1", SessionStatus::Waiting, Some(&turn)).await?;
        ensure!(
            store
                .claim_next_action(&scope, "c-none", LONG)
                .await?
                .is_none()
        );
        let pair = [format!("a{round}-1"), format!("a{round}-2")];
        for id in &pair {
            store.begin_effect(action_effect(id, &turn)).await?;
        }
        let claims = [format!("c{round}-1"), format!("c{round}-2")];
        let offset = CLAIM_RACE_STEP * u32::try_from(round)?;
        let (one, two) = tokio::join!(f.store.claim_next_action(&scope, &claims[0], LONG), async {
            // A thread's sleep: tokio's timer counts whole milliseconds.
            tokio::task::spawn_blocking(move || std::thread::sleep(offset)).await?;
            anyhow::Ok(f.peer.claim_next_action(&scope, &claims[1], LONG).await?)
        });
        let mut got: Vec<String> = [one?, two?]
            .into_iter()
            .flatten()
            .map(|claimed| claimed.action.action_id)
            .collect();
        // Both executors may have raced for one session: whoever skipped it tries again.
        while got.len() < 2 {
            let claim = format!("c{round}-{}", got.len() + 3);
            let Some(claimed) = store.claim_next_action(&scope, &claim, LONG).await? else {
                break;
            };
            got.push(claimed.action.action_id);
        }
        got.sort();
        ensure!(got == pair, "round {round}: claimed {got:?}");
    }
    ensure!(
        store
            .claim_next_action(&scope, "c-none", LONG)
            .await?
            .is_none()
    );
    let other = ExecutorScope::new("helper", "sha256:other", "1.0.0");
    ensure!(
        store
            .claim_next_action(&other, "c-other", LONG)
            .await?
            .is_none()
    );
    Ok(())
}

/// Rounds of [`claim_next_spreads_executors_over_the_work`], and how much later each one starts
/// the peer's claim than the round before: 0 to 4 ms, the span of a claim's transaction here.
/// Without candidates read again under the lock, 13 runs in 20 met the race (one in twenty with
/// a single round).
const CLAIM_RACES: usize = 80;
const CLAIM_RACE_STEP: Duration = Duration::from_micros(50);

async fn retention_prunes_the_history_of_closed_sessions_per_tenant(
    f: &Fixture,
) -> anyhow::Result<()> {
    let store = &*f.store;
    session_of(store, "acme-closed", "acme").await?;
    session_of(store, "acme-open", "acme").await?;
    session_of(store, "globex-closed", "globex").await?;
    for id in ["acme-closed", "acme-open", "globex-closed"] {
        let mut commit = SessionCommit::new(id);
        commit.items.push(NewItem::new(json!("hi")));
        commit.events.push(event("e", json!({})));
        applied(store.commit(commit).await?)?;
    }
    close(store, "acme-closed").await?;
    close(store, "globex-closed").await?;
    let mut policy = RetentionPolicy::default();
    policy.closed_history_ttl = Some(Duration::ZERO);
    policy
        .tenant_closed_history_ttl
        .insert("globex".to_owned(), Duration::from_secs(3600));
    let report = f.peer.apply_retention(&policy).await?;
    ensure!(report.sessions_deleted == 0, "{report:?}");
    ensure!(report.items_pruned == 1, "{report:?}");
    ensure!(report.events_pruned >= 1, "{report:?}");
    let kept = store.get_session("acme-closed").await?;
    ensure!(store.list_events("acme-closed", 0, 10).await?.is_empty());
    ensure!(
        store
            .page_items("acme-closed", 0, 10)
            .await?
            .items
            .is_empty()
    );
    ensure!(!store.list_events("acme-open", 0, 10).await?.is_empty());
    ensure!(!store.list_events("globex-closed", 0, 10).await?.is_empty());
    // The cursor continues after the pruned history.
    let next = store
        .append_event("acme-closed", None, event("later", json!({})))
        .await?;
    ensure!(next.cursor == kept.last_cursor + 1);
    Ok(())
}
