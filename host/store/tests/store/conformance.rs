//! The conformance suite: the same test bodies run against the embedded store and PostgreSQL.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, ensure};
use corral_store::{
    ActionFilter, ActionGuard, ActionStatus, ActionTransition, BeginEffect, BeginEffectOutcome,
    CheckpointWrite, ClaimAction, CommandKind, CommitOutcome, Decision, EffectKind, EffectStatus,
    EffectTransition, Entity, Event, ExecutorScope, Fence, HeartbeatAction, Interaction, MAX_PAGE,
    NewAction, NewAgent, NewCheckpoint, NewCommand, NewEffect, NewEvent, NewItem, NewSession,
    Resolution, RetentionPolicy, Segment, SegmentEnd, SegmentOutcome, SegmentStart, SessionCommand,
    SessionCommit, SessionFilter, SessionStatus, StaleReason, Store, StoreError, TurnCheckpoint,
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
    agents_keep_their_owner_and_sharing,
    sessions_are_counted_filtered_by_owner_and_erased_whole,
    sessions_are_created_idempotently,
    events_get_gap_free_cursors_and_page_from_any_cursor,
    items_page_in_order,
    a_checkpoint_commits_with_its_events_or_not_at_all,
    one_checkpoint_is_live_per_session,
    commands_replay_their_first_response_and_reject_another_body,
    effects_begin_once_and_move_only_under_their_guards,
    a_commit_journals_new_effects_with_its_events_or_not_at_all,
    a_turn_reads_only_its_own_effects_and_counts_the_other_model_calls,
    a_takeover_marks_what_the_previous_holder_left_in_flight_uncertain,
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
    a_cancel_fences_the_turn_in_one_transaction,
    a_cancel_is_announced_as_such,
    a_cancel_racing_a_turn_completion_has_one_winner,
    action_results_complete_action_effect_and_session_together,
    uncertain_effects_are_resolved_by_retry_or_outcome,
    start_up_recovery_marks_every_in_flight_effect_uncertain,
    commits_are_guarded_on_turn_and_status,
    sessions_page_by_key,
    sessions_are_counted_by_tenant_agent_and_status,
    a_message_starts_a_turn_only_on_a_settled_session,
    a_replayed_command_answers_its_first_response,
    approve_and_respond_decide_the_interaction_a_turn_is_paused_on,
    start_segment_runs_each_runnable_session_on_one_replica,
    start_segment_settles_a_session_with_nothing_to_run,
    a_claim_says_whether_another_session_is_claimable,
    start_segment_hands_the_run_its_turns_journal,
    a_completed_segment_ends_the_turn_and_releases_the_lease,
    a_segment_finishes_with_what_its_journal_held_or_not_at_all,
    a_cancelled_turns_held_model_call_is_left_uncertain,
    a_turn_that_ends_leaves_none_of_its_effects_invoking,
    a_failed_segment_fails_the_turn,
    a_waiting_turn_runs_again_when_a_result_lands_during_its_segment,
    a_cancelled_or_stopped_segment_applies_no_outcome,
    a_segment_finishes_under_its_fence_until_taken_over,
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

async fn agents_keep_their_owner_and_sharing(f: &Fixture) -> anyhow::Result<()> {
    let store = &*f.store;
    let shared = store
        .put_agent(
            NewAgent::new("ops", json!({}), "h1", "1")
                .with_access(None, vec!["acme".to_owned(), "beta".to_owned()]),
        )
        .await?;
    ensure!(shared.owner_tenant.is_none() && shared.shared_with == ["acme", "beta"]);
    ensure!(shared.visible_to("acme") && !shared.visible_to("gamma"));
    let owned = store
        .put_agent(
            NewAgent::new("mine", json!({}), "h2", "1")
                .with_access(Some("gamma".to_owned()), vec![]),
        )
        .await?;
    ensure!(owned.visible_to("gamma") && !owned.visible_to("acme"));
    // Replacing rewrites the access as given; reading returns what was written.
    store
        .put_agent(
            NewAgent::new("ops", json!({}), "h3", "1").with_access(None, vec!["*".to_owned()]),
        )
        .await?;
    let read = store.get_agent("ops").await?;
    ensure!(
        read.shared_with == ["*"] && read.visible_to("anyone"),
        "{read:?}"
    );
    ensure!(store.get_agent("mine").await?.owner_tenant.as_deref() == Some("gamma"));
    Ok(())
}

async fn sessions_are_counted_filtered_by_owner_and_erased_whole(
    f: &Fixture,
) -> anyhow::Result<()> {
    let store = &*f.store;
    for id in ["s1", "s2", "s3"] {
        session(store, id).await?;
    }
    set_turn(store, "s2", SessionStatus::Running, Some("t1")).await?;
    let mut filter = SessionFilter::default();
    filter.tenant_id = Some("acme".to_owned());
    let counts = store.session_counts(&filter).await?;
    ensure!(
        counts == [("idle".to_owned(), 2), ("running".to_owned(), 1)],
        "{counts:?}"
    );
    filter.owner_user_id = Some("nobody".to_owned());
    ensure!(store.session_counts(&filter).await?.is_empty());
    ensure!(store.page_sessions(&filter, None, 10).await?.is_empty());
    filter.owner_user_id = Some("alice".to_owned());
    ensure!(store.page_sessions(&filter, None, 10).await?.len() == 3);
    // A running session is erased only when asked to cancel; everything of it goes.
    expect_err!(
        store.erase_session("s2", false).await,
        StoreError::Conflict { .. }
    );
    store.erase_session("s1", false).await?;
    store.erase_session("s2", true).await?;
    expect_err!(store.get_session("s1").await, StoreError::NotFound { .. });
    expect_err!(store.get_session("s2").await, StoreError::NotFound { .. });
    ensure!(
        store
            .list_events("s2", 0, 10)
            .await
            .map_or(true, |events| events.is_empty())
    );
    expect_err!(
        store.erase_session("s1", false).await,
        StoreError::NotFound { .. }
    );
    ensure!(store.get_session("s3").await.is_ok());
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
    // A turn's first read: its journal and the first page, one transaction.
    store
        .begin_effect(BeginEffect::new(
            "s1",
            model_call("t1:s0:model", "t1", json!({})),
        ))
        .await?;
    let before = store.transactions();
    let (page, turn) = store.open_turn("s1", "t2", 2).await?;
    ensure!(store.transactions() == before + 1);
    ensure!(page.items.iter().map(|i| i.seq).eq([1, 2]) && page.next_after == Some(2));
    ensure!(
        turn.effects.is_empty() && turn.model_calls_elsewhere == 1,
        "{turn:?}"
    );
    let (_, turn) = store.open_turn("s1", "t1", 2).await?;
    ensure!(
        turn.effects.len() == 1 && turn.model_calls_elsewhere == 0,
        "{turn:?}"
    );
    expect_err!(
        store.open_turn("s1", "t1", 0).await,
        StoreError::InvalidInput { .. }
    );
    expect_err!(
        store.open_turn("ghost", "t1", 10).await,
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

async fn a_turn_reads_only_its_own_effects_and_counts_the_other_model_calls(
    f: &Fixture,
) -> anyhow::Result<()> {
    let store = &*f.store;
    session(store, "s1").await?;
    session(store, "s2").await?;
    let script = |id: &str, turn: &str| {
        NewEffect::new(
            id,
            turn,
            EffectKind::Script,
            EffectStatus::Invoking,
            json!({}),
        )
    };
    for (session_id, effect) in [
        ("s1", model_call("t1:s0:model", "t1", json!({}))),
        ("s1", script("t1:s0:t0", "t1")),
        ("s1", model_call("t1:s1:model", "t1", json!({}))),
        ("s1", model_call("t2:s0:model", "t2", json!({}))),
        ("s1", script("t2:s0:t0", "t2")),
        // Another session's turn of the same id is not this session's.
        ("s2", model_call("s2:t2:s0:model", "t2", json!({}))),
    ] {
        store
            .begin_effect(BeginEffect::new(session_id, effect))
            .await?;
    }
    let second = store.turn_effects("s1", "t2").await?;
    let ids: Vec<&str> = second
        .effects
        .iter()
        .map(|e| e.effect_id.as_str())
        .collect();
    ensure!(ids == ["t2:s0:model", "t2:s0:t0"], "turn t2 read {ids:?}");
    ensure!(second.model_calls_elsewhere == 2, "{second:?}");
    let first = store.turn_effects("s1", "t1").await?;
    ensure!(first.effects.len() == 3 && first.model_calls_elsewhere == 1);
    let fresh = store.turn_effects("s1", "t3").await?;
    ensure!(fresh.effects.is_empty() && fresh.model_calls_elsewhere == 3);
    let other = store.turn_effects("s2", "t2").await?;
    ensure!(other.effects.len() == 1 && other.model_calls_elsewhere == 0);
    expect_err!(
        store.turn_effects("nope", "t1").await,
        StoreError::NotFound {
            entity: Entity::Session,
            ..
        }
    );
    Ok(())
}

async fn a_commit_journals_new_effects_with_its_events_or_not_at_all(
    f: &Fixture,
) -> anyhow::Result<()> {
    let store = &*f.store;
    session(store, "s1").await?;
    let record = NewEffect::completed(
        "t1:started",
        "t1",
        EffectKind::Script,
        json!({"name": "run_js"}),
        json!({}),
    );
    let mut commit = SessionCommit::new("s1");
    commit.new_effects = vec![record.clone(), model_call("t1:model", "t1", json!(1))];
    commit.events.push(event("tool.started", json!({})));
    applied(store.commit(commit).await?)?;
    let started = store.get_effect("t1:started").await?;
    ensure!(started.status == EffectStatus::Completed && started.result == Some(json!({})));
    ensure!(store.get_effect("t1:model").await?.status == EffectStatus::Invoking);
    ensure!(store.get_session("s1").await?.last_cursor == 1);

    // An id journaled before is refused, and nothing of that commit applies.
    let mut again = SessionCommit::new("s1");
    again.new_effects = vec![model_call("t1:other", "t1", json!(2)), record];
    again.events.push(event("tool.started", json!({})));
    expect_err!(
        store.commit(again).await,
        StoreError::Conflict {
            entity: Entity::Effect,
            ..
        }
    );
    expect_err!(
        store.get_effect("t1:other").await,
        StoreError::NotFound {
            entity: Entity::Effect,
            ..
        }
    );
    ensure!(store.get_session("s1").await?.last_cursor == 1, "no event");

    // Work for an executor starts pending, with its action: only through begin_effect.
    let mut pending = SessionCommit::new("s1");
    pending.new_effects = vec![NewEffect::new(
        "t1:action",
        "t1",
        EffectKind::CapabilityCall,
        EffectStatus::Pending,
        json!({}),
    )];
    expect_err!(store.commit(pending).await, StoreError::InvalidInput { .. });
    Ok(())
}

async fn a_takeover_marks_what_the_previous_holder_left_in_flight_uncertain(
    f: &Fixture,
) -> anyhow::Result<()> {
    let store = &*f.store;
    session(store, "s1").await?;
    set_turn_with_checkpoint(store, "s1", SessionStatus::Running, "t1").await?;
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

    // The previous holder's lease is live: nobody takes over.
    let old = store.acquire_session("s1", "replica-a", SHORT).await?;
    let found = f.peer.start_segment("replica-b", LONG).await?;
    ensure!(found == SegmentStart::Idle, "held by replica-a: {found:?}");
    tokio::time::sleep(PAST_SHORT).await;
    match f.peer.start_segment("replica-b", LONG).await? {
        SegmentStart::Settled {
            session_id,
            effects_uncertain,
            others_claimable,
        } => ensure!(
            session_id == "s1" && effects_uncertain == 1 && !others_claimable,
            "settled {session_id} with {effects_uncertain} uncertain ({others_claimable})"
        ),
        other => anyhow::bail!("expected the session settled as uncertain, got {other:?}"),
    }
    let e1 = store.get_effect("e1").await?;
    ensure!(e1.status == EffectStatus::Uncertain && e1.error.is_some());
    ensure!(
        store.get_effect("e2").await?.status == EffectStatus::Completed,
        "completed stays"
    );
    ensure!(
        store.get_effect("e3").await?.status == EffectStatus::Pending,
        "pending stays"
    );
    let s = store.get_session("s1").await?;
    ensure!(s.status == SessionStatus::Uncertain && s.active_turn_id.as_deref() == Some("t1"));
    ensure!(s.owner.is_none(), "the lease is released: {:?}", s.owner);
    ensure!(
        s.generation == old.generation + 1,
        "taken over at the next generation"
    );
    ensure!(
        store
            .live_checkpoint("s1")
            .await?
            .is_some_and(|c| c.turn_id == "t1"),
        "the turn's checkpoint is kept for after the resolution"
    );
    // Only the active turn's effect is surfaced as an event.
    let events = store.list_events("s1", before, 10).await?;
    ensure!(events.len() == 1 && events[0].event_type == "effect.uncertain");
    ensure!(
        events[0].payload["effectId"] == json!("e1")
            && events[0].payload["kind"] == json!("model_call")
    );
    let found = f.peer.start_segment("replica-b", LONG).await?;
    ensure!(
        found == SegmentStart::Idle,
        "an uncertain session does not run: {found:?}"
    );
    // The previous holder can no longer write.
    let mut late = SessionCommit::new("s1");
    late.fence = Some(old.fence());
    late.events.push(event("late", json!({})));
    expect_err!(
        store.commit(late).await,
        StoreError::StaleGeneration {
            reason: StaleReason::Superseded,
            ..
        }
    );

    // Nothing in flight: the session runs its turn on. (Only the active turn has effects in
    // flight: a turn that ends marks what it left uncertain, see
    // `a_turn_that_ends_leaves_none_of_its_effects_invoking`.)
    session(store, "s2").await?;
    set_turn_with_checkpoint(store, "s2", SessionStatus::Running, "t2").await?;
    store.acquire_session("s2", "replica-a", SHORT).await?;
    tokio::time::sleep(PAST_SHORT).await;
    let segment = start(&*f.peer, "replica-b").await?;
    ensure!(segment.session.id == "s2" && segment.turn_id == "t2" && segment.segment == 0);
    ensure!(segment.effects_uncertain == 0, "{segment:?}");
    ensure!(segment.checkpoint == TurnCheckpoint::new_turn("t2", "hi"));
    ensure!(segment.lease.replica_id == "replica-b" && segment.lease.generation == 2);
    ensure!(segment.session.status == SessionStatus::Running);
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
                        cursor,
                        cancelled: false,
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

/// The checkpoint data of a new turn, as `message` writes it.
fn new_turn(turn: &str, message: &str) -> anyhow::Result<Value> {
    Ok(serde_json::to_value(TurnCheckpoint::new_turn(
        turn, message,
    ))?)
}

/// Moves a session into `status` with `turn` active and a live checkpoint to run it from.
async fn set_turn_with_checkpoint(
    store: &dyn Store,
    session_id: &str,
    status: SessionStatus,
    turn: &str,
) -> anyhow::Result<()> {
    let mut commit = SessionCommit::new(session_id);
    commit.patch.status = Some(status);
    commit.patch.active_turn_id = Some(Some(turn.to_owned()));
    commit.checkpoint = Some(CheckpointWrite::Put(NewCheckpoint::new(
        turn,
        0,
        new_turn(turn, "hi")?,
    )));
    applied(store.commit(commit).await?)?;
    Ok(())
}

fn message(session_id: &str, key: &str, turn: &str, content: &str) -> SessionCommand {
    SessionCommand::new(
        session_id,
        key,
        json!({"type": "message", "content": content}),
        CommandKind::Message {
            turn_id: turn.to_owned(),
            content: content.to_owned(),
        },
    )
}

fn cancel(session_id: &str, key: &str, reason: Option<&str>) -> SessionCommand {
    SessionCommand::new(
        session_id,
        key,
        json!({"type": "cancel", "reason": reason}),
        CommandKind::Cancel {
            reason: reason.map(str::to_owned),
        },
    )
}

fn approve(key: &str, interaction: &str, approved: bool, reason: Option<&str>) -> SessionCommand {
    SessionCommand::new(
        "s1",
        key,
        json!({"type": "approve", "interactionId": interaction, "approved": approved}),
        CommandKind::Approve {
            interaction_id: interaction.to_owned(),
            approved,
            reason: reason.map(str::to_owned),
        },
    )
}

fn respond(key: &str, interaction: &str, value: Value) -> SessionCommand {
    SessionCommand::new(
        "s1",
        key,
        json!({"type": "respond", "interactionId": interaction, "value": value}),
        CommandKind::Respond {
            interaction_id: interaction.to_owned(),
            value,
        },
    )
}

/// An executor's result for `action` of session `s1`.
fn action_result(
    key: &str,
    action: &str,
    claim_id: &str,
    generation: u64,
    outcome: &Value,
) -> SessionCommand {
    SessionCommand::new(
        "s1",
        key,
        json!({
            "type": "action_result", "actionId": action, "claimId": claim_id,
            "generation": generation, "outcome": outcome,
        }),
        CommandKind::ActionResult {
            action_id: action.to_owned(),
            claim_id: claim_id.to_owned(),
            generation,
            outcome: outcome.clone(),
            scope: None,
        },
    )
}

/// An operator's resolution of `effect` of session `s1`.
fn resolve(key: &str, effect: &str, resolution: Resolution) -> SessionCommand {
    let decision = match &resolution {
        Resolution::Retry => json!({"retry": true}),
        Resolution::Complete(outcome) => json!({"outcome": outcome}),
        other => json!(format!("{other:?}")),
    };
    SessionCommand::new(
        "s1",
        key,
        json!({"type": "resolve", "effectId": effect, "decision": decision}),
        CommandKind::Resolve {
            effect_id: effect.to_owned(),
            resolution,
        },
    )
}

/// The segment `replica` starts, failing unless there is one to run.
/// Journals `effect` of session `s1` under `fence`, as a running segment does.
async fn begin_under(store: &dyn Store, fence: &Fence, effect: NewEffect) -> anyhow::Result<()> {
    let mut begin = BeginEffect::new("s1", effect);
    begin.fence = Some(fence.clone());
    store.begin_effect(begin).await?;
    Ok(())
}

async fn start(store: &dyn Store, replica: &str) -> anyhow::Result<Segment> {
    match store.start_segment(replica, LONG).await? {
        SegmentStart::Run(segment) => Ok(*segment),
        other => anyhow::bail!("expected a segment to run, got {other:?}"),
    }
}

/// The session's last event.
async fn last_event(store: &dyn Store, session_id: &str) -> anyhow::Result<Event> {
    let cursor = store.get_session(session_id).await?.last_cursor;
    store
        .list_events(session_id, cursor.saturating_sub(1), 1)
        .await?
        .pop()
        .context("the session has events")
}

fn interaction(id: &str, kind: &str) -> Interaction {
    Interaction {
        interaction_id: id.to_owned(),
        kind: kind.to_owned(),
        tool_name: "run_js".to_owned(),
        capability_id: Some("ops.deploy".to_owned()),
        arguments: json!({"env": "prod"}),
        arguments_sha256: "0".repeat(64),
    }
}

/// What the turn engine does when a segment must wait for a person: writes the next segment's
/// checkpoint with the pending interactions under the segment's fence, then ends it paused.
async fn pause(
    store: &dyn Store,
    segment: &Segment,
    pending: Vec<Interaction>,
) -> anyhow::Result<TurnCheckpoint> {
    let mut paused = segment.checkpoint.clone();
    paused.pending = pending;
    let next = segment.segment + 1;
    let mut write = SessionCommit::new(&segment.session.id);
    write.fence = Some(segment.lease.fence());
    write.checkpoint = Some(CheckpointWrite::Put(NewCheckpoint::new(
        &segment.turn_id,
        next,
        serde_json::to_value(&paused)?,
    )));
    applied(store.commit(write).await?)?;
    let (end, uncertain) = store
        .finish_segment(
            &segment.lease.fence(),
            &segment.turn_id,
            None,
            SegmentOutcome::Paused {
                checkpoint: paused.clone(),
            },
            None,
        )
        .await?;
    ensure!(
        end == SegmentEnd::Applied && uncertain == 0,
        "{end:?}, {uncertain}"
    );
    Ok(paused)
}

fn completed(items: Vec<Value>) -> SegmentOutcome {
    SegmentOutcome::Completed {
        output: json!({"text": "done"}),
        items,
    }
}

async fn a_cancel_fences_the_turn_in_one_transaction(f: &Fixture) -> anyhow::Result<()> {
    let store = &*f.store;
    session(store, "s1").await?;
    let mut begin = SessionCommit::new("s1");
    begin.patch.status = Some(SessionStatus::Running);
    begin.patch.active_turn_id = Some(Some("t1".into()));
    begin.patch.state = Some(json!({"plan": "t1"}));
    begin.checkpoint = Some(CheckpointWrite::Put(NewCheckpoint::new(
        "t1",
        0,
        new_turn("t1", "hi")?,
    )));
    applied(store.commit(begin).await?)?;
    store.begin_effect(action_effect("a1", "t1")).await?;
    store.begin_effect(action_effect("a2", "t1")).await?;
    store.begin_effect(invoking_effect("m1", "t1")).await?;
    store.claim_action(claim("a2", "c2", LONG)).await?;
    let before = store.get_session("s1").await?;

    let mut command = cancel("s1", "k1", Some("user"));
    command.decided_by = Some("ops".into());
    command.request_id = Some("req-1".into());
    let receipt = f.peer.run_command(command.clone()).await?;
    ensure!(
        !receipt.replayed && receipt.effects_uncertain == 2,
        "{receipt:?}"
    );
    ensure!(
        receipt.response
            == json!({
                "status": "accepted", "turnId": "t1", "cursor": before.last_cursor + 1,
                "requestId": "req-1",
            }),
        "{receipt:?}"
    );
    let events = store.list_events("s1", before.last_cursor, 10).await?;
    ensure!(events.len() == 1 && events[0].event_type == "turn.cancelled");
    ensure!(events[0].payload == json!({"reason": "user", "decidedBy": "ops"}));
    ensure!(events[0].turn_id.as_deref() == Some("t1"));
    let s = store.get_session("s1").await?;
    ensure!(s.status == SessionStatus::Cancelled && s.active_turn_id.is_none());
    ensure!(
        s.state
            == json!({"plan": "t1", "server": {"waits": null, "error": null},
                "lastDecision": {"command": "cancel", "decidedBy": "ops"}}),
        "state {}",
        s.state
    );
    ensure!(store.live_checkpoint("s1").await?.is_none());
    ensure!(store.get_action("a1").await?.status == ActionStatus::Cancelled);
    ensure!(store.get_effect("a1").await?.status == EffectStatus::Cancelled);
    ensure!(store.get_action("a2").await?.status == ActionStatus::Uncertain);
    ensure!(store.get_effect("a2").await?.status == EffectStatus::Uncertain);
    let model = store.get_effect("m1").await?;
    ensure!(model.status == EffectStatus::Uncertain && model.error.is_some());
    ensure!(
        store.get_command("s1", "k1").await?.map(|r| r.response) == Some(receipt.response.clone())
    );
    // A replay answers with the first response and writes nothing; a claim or heartbeat on the
    // turn fails.
    let replay = store.run_command(command).await?;
    ensure!(replay.replayed && replay.response == receipt.response);
    ensure!(store.get_session("s1").await?.last_cursor == s.last_cursor);
    expect_err!(
        store
            .heartbeat_action(HeartbeatAction::new("a2", "c2", 1, LONG))
            .await,
        StoreError::StaleGeneration { .. }
    );
    Ok(())
}

async fn a_cancel_is_announced_as_such(f: &Fixture) -> anyhow::Result<()> {
    use corral_store::EventNotice;
    let store = &*f.store;
    session(store, "s1").await?;
    let mut mine = store.subscribe_events();
    let mut theirs = f.peer.subscribe_events();
    store.run_command(message("s1", "k1", "t1", "hi")).await?;
    for receiver in [&mut mine, &mut theirs] {
        let notice = next_notice(receiver).await?;
        let expected = EventNotice {
            session_id: "s1".into(),
            cursor: 1,
            cancelled: false,
        };
        ensure!(notice == expected, "got {notice:?}");
    }
    f.peer.run_command(cancel("s1", "k2", None)).await?;
    for receiver in [&mut mine, &mut theirs] {
        let notice = next_notice(receiver).await?;
        let expected = EventNotice {
            session_id: "s1".into(),
            cursor: 2,
            cancelled: true,
        };
        ensure!(notice == expected, "got {notice:?}");
    }
    Ok(())
}

async fn a_cancel_racing_a_turn_completion_has_one_winner(f: &Fixture) -> anyhow::Result<()> {
    let store = &*f.store;
    session(store, "s1").await?;
    for round in 0..10 {
        let turn = format!("t{round}");
        store
            .run_command(message("s1", &format!("m{round}"), &turn, "hi"))
            .await?;
        let segment = start(store, "r1").await?;
        ensure!(segment.turn_id == turn);
        let before = store.get_session("s1").await?;
        let barrier = Barrier::new(2);
        let (finished, cancelled) = tokio::join!(
            async {
                barrier.wait().await;
                f.store
                    .finish_segment(
                        &segment.lease.fence(),
                        &turn,
                        None,
                        completed(vec![json!({"round": round})]),
                        None,
                    )
                    .await
            },
            async {
                barrier.wait().await;
                f.peer
                    .run_command(cancel("s1", &format!("c{round}"), None))
                    .await
            }
        );
        let (end, _) = finished?;
        cancelled?;
        let s = store.get_session("s1").await?;
        ensure!(s.active_turn_id.is_none() && s.owner.is_none());
        let finals: Vec<String> = store
            .list_events("s1", before.last_cursor, 10)
            .await?
            .into_iter()
            .filter(|e| e.turn_id.as_deref() == Some(turn.as_str()))
            .filter(|e| ["turn.completed", "turn.cancelled"].contains(&e.event_type.as_str()))
            .map(|e| e.event_type)
            .collect();
        match end {
            SegmentEnd::Applied => {
                ensure!(finals == ["turn.completed"], "round {round}: {finals:?}");
                ensure!(s.last_item_seq == before.last_item_seq + 1);
            }
            SegmentEnd::Unchanged => {
                ensure!(finals == ["turn.cancelled"], "round {round}: {finals:?}");
                ensure!(s.status == SessionStatus::Cancelled);
                ensure!(s.last_item_seq == before.last_item_seq, "nothing appended");
            }
            other => anyhow::bail!("round {round}: unexpected {other:?}"),
        }
    }
    Ok(())
}

async fn action_results_complete_action_effect_and_session_together(
    f: &Fixture,
) -> anyhow::Result<()> {
    let store = &*f.store;
    session(store, "s1").await?;
    set_turn(store, "s1", SessionStatus::Waiting, Some("t1")).await?;
    store.begin_effect(action_effect("a1", "t1")).await?;
    store.begin_effect(action_effect("a3", "t1")).await?;
    store.claim_action(claim("a3", "c3", SHORT)).await?;
    let claimed = store.claim_action(claim("a1", "c1", LONG)).await?;
    // The same claim again is the same grant.
    let again = f.peer.claim_action(claim("a1", "c1", LONG)).await?;
    ensure!(again.action.generation == 1 && again.event == claimed.event);
    expect_err!(
        store.claim_action(claim("a1", "c9", LONG)).await,
        StoreError::Conflict { .. }
    );

    let outcome = json!({"value": 42});
    expect_err!(
        store
            .run_command(action_result("r0", "a1", "c1", 2, &outcome))
            .await,
        StoreError::StaleGeneration {
            entity: Entity::Action,
            presented: 2,
            current: 1,
            ..
        }
    );
    expect_err!(
        store
            .run_command(action_result("r0", "a1", "c9", 1, &outcome))
            .await,
        StoreError::StaleGeneration {
            entity: Entity::Action,
            ..
        }
    );
    let mut outside = action_result("r0", "a1", "c1", 1, &outcome);
    if let CommandKind::ActionResult { scope, .. } = &mut outside.kind {
        *scope = Some(ExecutorScope::new("helper", "sha256:other", "1.0.0"));
    }
    expect_err!(
        store.run_command(outside).await,
        StoreError::Forbidden { .. }
    );
    expect_err!(
        store
            .run_command(action_result("r0", "nope", "c1", 1, &outcome))
            .await,
        StoreError::NotFound {
            entity: Entity::Action,
            ..
        }
    );
    ensure!(
        store.get_action("a1").await?.status == ActionStatus::Claimed,
        "nothing applied"
    );

    let before = store.get_session("s1").await?.last_cursor;
    let done = action_result("r1", "a1", "c1", 1, &outcome);
    let receipt = store.run_command(done.clone()).await?;
    ensure!(!receipt.replayed, "{receipt:?}");
    ensure!(
        receipt.response
            == json!({"status": "accepted", "turnId": "t1", "cursor": before + 1, "requestId": null}),
        "{receipt:?}"
    );
    ensure!(store.get_session("s1").await?.status == SessionStatus::Runnable);
    let events = store.list_events("s1", before, 10).await?;
    ensure!(events.len() == 1 && events[0].event_type == "action.completed");
    ensure!(
        events[0].payload
            == json!({"actionId": "a1", "capabilityId": "ops.deploy", "result": outcome}),
        "{:?}",
        events[0].payload
    );
    ensure!(events[0].turn_id.as_deref() == Some("t1"));
    let action = store.get_action("a1").await?;
    ensure!(action.status == ActionStatus::Completed);
    ensure!(
        action.result == Some(json!({"claimId": "c1", "generation": 1, "outcome": outcome})),
        "{:?}",
        action.result
    );
    let effect = store.get_effect("a1").await?;
    ensure!(effect.status == EffectStatus::Completed && effect.result == Some(outcome.clone()));

    // Again under the same key, or another key: the first receipt.
    let replay = f.peer.run_command(done).await?;
    ensure!(replay.replayed && replay.response == receipt.response);
    let replay = store
        .run_command(action_result("r2", "a1", "c1", 1, &outcome))
        .await?;
    ensure!(replay.replayed && replay.response == receipt.response);
    ensure!(
        store.get_command("s1", "r2").await?.map(|r| r.response) == Some(receipt.response.clone())
    );
    ensure!(
        store.get_session("s1").await?.last_cursor == before + 1,
        "nothing appended"
    );
    let different = json!({"error": "boom"});
    expect_err!(
        store
            .run_command(action_result("r3", "a1", "c1", 1, &different))
            .await,
        StoreError::Conflict {
            entity: Entity::Action,
            ..
        }
    );
    expect_err!(
        store
            .run_command(action_result("r1", "a1", "c1", 1, &different))
            .await,
        StoreError::Conflict { entity: Entity::Command, id, .. } if id == "r1"
    );

    // The claim must be unexpired.
    tokio::time::sleep(PAST_SHORT).await;
    expect_err!(
        store
            .run_command(action_result("r4", "a3", "c3", 1, &outcome))
            .await,
        StoreError::StaleGeneration {
            reason: StaleReason::Expired,
            ..
        }
    );
    // And its turn the active one.
    store.begin_effect(action_effect("a2", "t1")).await?;
    store.claim_action(claim("a2", "c2", LONG)).await?;
    set_turn(store, "s1", SessionStatus::Running, Some("t2")).await?;
    expect_err!(
        store
            .run_command(action_result("r5", "a2", "c2", 1, &outcome))
            .await,
        StoreError::Conflict {
            entity: Entity::Action,
            ..
        }
    );
    ensure!(store.get_action("a2").await?.status == ActionStatus::Claimed);
    Ok(())
}

async fn uncertain_effects_are_resolved_by_retry_or_outcome(f: &Fixture) -> anyhow::Result<()> {
    let store = &*f.store;
    session(store, "s1").await?;
    // An earlier turn's uncertain effect.
    set_turn(store, "s1", SessionStatus::Waiting, Some("t0")).await?;
    store.begin_effect(invoking_effect("m0", "t0")).await?;
    ensure!(store.recover_in_flight_effects("restart", true).await? == 1);
    set_turn(store, "s1", SessionStatus::Waiting, Some("t1")).await?;
    store.begin_effect(action_effect("a1", "t1")).await?;
    store.begin_effect(invoking_effect("m1", "t1")).await?;
    store.claim_action(claim("a1", "c1", SHORT)).await?;
    tokio::time::sleep(PAST_SHORT).await;
    ensure!(store.expire_action_claims().await?.len() == 1);
    ensure!(store.recover_in_flight_effects("restart", true).await? == 1);
    ensure!(store.get_effect("m0").await?.status == EffectStatus::Uncertain);
    ensure!(store.get_session("s1").await?.status == SessionStatus::Uncertain);

    expect_err!(
        store
            .run_command(resolve("k0", "nope", Resolution::Retry))
            .await,
        StoreError::NotFound {
            entity: Entity::Effect,
            ..
        }
    );
    // Only the active turn's effects are resolved.
    expect_err!(
        store
            .run_command(resolve("k0", "m0", Resolution::Retry))
            .await,
        StoreError::Conflict {
            entity: Entity::Effect,
            ..
        }
    );
    let mut work = f.peer.subscribe_work();
    let before = store.get_session("s1").await?.last_cursor;
    let mut retry = resolve("k1", "a1", Resolution::Retry);
    retry.decided_by = Some("ops".into());
    let receipt = store.run_command(retry).await?;
    ensure!(!receipt.replayed && receipt.response["cursor"] == json!(before + 1));
    let event = last_event(store, "s1").await?;
    ensure!(event.event_type == "effect.resolved" && event.turn_id.as_deref() == Some("t1"));
    ensure!(
        event.payload == json!({"effectId": "a1", "decidedBy": "ops", "retry": true}),
        "{:?}",
        event.payload
    );
    ensure!(
        store.get_session("s1").await?.status == SessionStatus::Uncertain,
        "m1 is still uncertain"
    );
    ensure!(next_notice(&mut work).await?.action_id == "a1");
    let action = store.get_action("a1").await?;
    ensure!(action.status == ActionStatus::Pending && action.claim_id.is_none());
    ensure!(store.get_effect("a1").await?.status == EffectStatus::Pending);
    expect_err!(
        store
            .run_command(resolve("k2", "a1", Resolution::Retry))
            .await,
        StoreError::Conflict {
            entity: Entity::Effect,
            ..
        }
    );
    store
        .run_command(resolve(
            "k3",
            "m1",
            Resolution::Complete(json!({"text": "hi"})),
        ))
        .await?;
    ensure!(store.get_session("s1").await?.status == SessionStatus::Runnable);
    let model = store.get_effect("m1").await?;
    ensure!(model.status == EffectStatus::Completed && model.result == Some(json!({"text": "hi"})));
    let reclaimed = store.claim_action(claim("a1", "c2", LONG)).await?;
    ensure!(
        reclaimed.action.generation == 2,
        "generations keep increasing"
    );
    // Once the turn is cancelled, its uncertain effects are no longer resolved.
    store.run_command(cancel("s1", "k4", None)).await?;
    ensure!(store.get_effect("a1").await?.status == EffectStatus::Uncertain);
    expect_err!(
        store
            .run_command(resolve("k5", "a1", Resolution::Retry))
            .await,
        StoreError::Conflict {
            entity: Entity::Effect,
            ..
        }
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
    // s1's holder is gone (its lease expired); s2 is leased by a live replica: skipped unless
    // leased_too.
    store.acquire_session("s1", "replica-a", SHORT).await?;
    store.acquire_session("s2", "replica-b", LONG).await?;
    tokio::time::sleep(PAST_SHORT).await;
    ensure!(f.peer.recover_in_flight_effects("restarted", false).await? == 1);
    let m1 = store.get_effect("m1").await?;
    ensure!(m1.status == EffectStatus::Uncertain && m1.error.as_deref() == Some("restarted"));
    ensure!(store.get_effect("m2").await?.status == EffectStatus::Invoking);
    let s1 = store.get_session("s1").await?;
    ensure!(s1.status == SessionStatus::Uncertain);
    ensure!(s1.owner.is_none(), "the dead holder's lease is released");
    ensure!(last_event(store, "s1").await?.event_type == "effect.uncertain");
    let s2 = store.get_session("s2").await?;
    ensure!(
        s2.owner.is_some_and(|o| o.replica_id == "replica-b"),
        "s2 untouched"
    );
    // Another replica name takes nothing under replica-b's live lease; replica-b restarted
    // under its stable name takes its own lease over at once.
    ensure!(
        f.peer
            .recover_replica_leases("restarted", "replica-c")
            .await?
            == 0
    );
    ensure!(store.get_effect("m2").await?.status == EffectStatus::Invoking);
    ensure!(
        f.peer
            .recover_replica_leases("restarted", "replica-b")
            .await?
            == 1
    );
    ensure!(store.get_effect("m2").await?.status == EffectStatus::Uncertain);
    let s2 = store.get_session("s2").await?;
    ensure!(s2.status == SessionStatus::Uncertain && s2.owner.is_none());
    ensure!(store.recover_in_flight_effects("again", true).await? == 0);
    Ok(())
}

async fn a_message_starts_a_turn_only_on_a_settled_session(f: &Fixture) -> anyhow::Result<()> {
    let store = &*f.store;
    session(store, "s1").await?;
    let mut first = message("s1", "k1", "t1", "hi");
    first.request_id = Some("req-1".into());
    let receipt = f.peer.run_command(first).await?;
    ensure!(!receipt.replayed && receipt.effects_uncertain == 0);
    ensure!(
        receipt.response
            == json!({"status": "accepted", "turnId": "t1", "cursor": 1, "requestId": "req-1"}),
        "{receipt:?}"
    );
    let s = store.get_session("s1").await?;
    ensure!(s.status == SessionStatus::Runnable && s.active_turn_id.as_deref() == Some("t1"));
    ensure!(s.last_cursor == 1);
    let live = store.live_checkpoint("s1").await?.context("segment 0")?;
    ensure!(live.turn_id == "t1" && live.segment == 0 && live.data == new_turn("t1", "hi")?);
    let events = store.list_events("s1", 0, 10).await?;
    ensure!(events.len() == 1 && events[0].event_type == "command.message");
    ensure!(events[0].payload == json!({"content": "hi"}));
    ensure!(events[0].turn_id.as_deref() == Some("t1"));
    let record = store.get_command("s1", "k1").await?.context("recorded")?;
    ensure!(record.response == receipt.response && record.cursor == 1);

    for status in [
        SessionStatus::Runnable,
        SessionStatus::Running,
        SessionStatus::Waiting,
        SessionStatus::Paused,
        SessionStatus::Uncertain,
    ] {
        set_turn(store, "s1", status, Some("t1")).await?;
        expect_err!(
            store.run_command(message("s1", "k2", "t2", "again")).await,
            StoreError::Conflict {
                entity: Entity::Session,
                ..
            }
        );
    }
    ensure!(
        store.get_command("s1", "k2").await?.is_none(),
        "a refused command is not recorded"
    );
    ensure!(
        store
            .live_checkpoint("s1")
            .await?
            .is_some_and(|c| c.turn_id == "t1")
    );

    for (n, status) in [
        SessionStatus::Completed,
        SessionStatus::Failed,
        SessionStatus::Cancelled,
        SessionStatus::Idle,
    ]
    .into_iter()
    .enumerate()
    {
        set_turn(store, "s1", status, None).await?;
        let turn = format!("t{}", n + 2);
        store
            .run_command(message("s1", &format!("k{}", n + 3), &turn, "next"))
            .await?;
        let s = store.get_session("s1").await?;
        ensure!(s.status == SessionStatus::Runnable && s.active_turn_id.as_ref() == Some(&turn));
        let live = store.live_checkpoint("s1").await?.context("segment 0")?;
        ensure!(
            live.turn_id == turn && live.segment == 0,
            "after {status}: {live:?}"
        );
    }
    expect_err!(
        store.run_command(message("ghost", "k1", "t1", "hi")).await,
        StoreError::NotFound {
            entity: Entity::Session,
            ..
        }
    );
    expect_err!(
        store.run_command(message("s1", "", "t9", "hi")).await,
        StoreError::InvalidInput { .. }
    );
    Ok(())
}

async fn a_replayed_command_answers_its_first_response(f: &Fixture) -> anyhow::Result<()> {
    let store = &*f.store;
    session(store, "s1").await?;
    session(store, "s2").await?;
    let mut first = message("s1", "k1", "t1", "hi");
    first.request_id = Some("req-1".into());
    let receipt = store.run_command(first.clone()).await?;
    let after = store.get_session("s1").await?;
    // The session is no longer settled, but a replay is answered before the rules: the first
    // response, request id included, and nothing written.
    let mut again = first.clone();
    again.request_id = Some("req-2".into());
    let replay = f.peer.run_command(again).await?;
    ensure!(
        replay.replayed && replay.response == receipt.response,
        "{replay:?}"
    );
    ensure!(replay.response["requestId"] == json!("req-1"));
    let now = store.get_session("s1").await?;
    ensure!(now.version == after.version && now.last_cursor == after.last_cursor);

    let other = cancel("s1", "k1", None);
    expect_err!(
        store.run_command(other).await,
        StoreError::Conflict { entity: Entity::Command, id, .. } if id == "k1"
    );
    let mut changed = first.clone();
    changed.body = json!({"type": "message", "content": "changed"});
    expect_err!(
        store.run_command(changed).await,
        StoreError::Conflict { entity: Entity::Command, id, .. } if id == "k1"
    );
    let now = store.get_session("s1").await?;
    ensure!(now.status == SessionStatus::Runnable && now.last_cursor == after.last_cursor);

    // Keys are scoped to their session.
    let elsewhere = store.run_command(message("s2", "k1", "t9", "hi")).await?;
    ensure!(!elsewhere.replayed && elsewhere.response["turnId"] == json!("t9"));
    Ok(())
}

async fn approve_and_respond_decide_the_interaction_a_turn_is_paused_on(
    f: &Fixture,
) -> anyhow::Result<()> {
    let store = &*f.store;
    session(store, "s1").await?;
    store.run_command(message("s1", "k1", "t1", "hi")).await?;
    expect_err!(
        store.run_command(approve("k2", "i1", true, None)).await,
        StoreError::Conflict {
            entity: Entity::Session,
            ..
        }
    );
    let segment = start(store, "r1").await?;
    let paused = pause(store, &segment, vec![interaction("i1", "approval")]).await?;
    let s = store.get_session("s1").await?;
    ensure!(s.status == SessionStatus::Paused && s.active_turn_id.as_deref() == Some("t1"));
    ensure!(s.owner.is_none(), "the lease is released");
    let pending = serde_json::to_value(&paused.pending)?;
    ensure!(s.state["server"]["waits"] == pending, "state {}", s.state);
    let event = last_event(store, "s1").await?;
    ensure!(event.event_type == "turn.paused" && event.turn_id.as_deref() == Some("t1"));
    ensure!(event.payload == json!({"interactions": pending}));
    // The checkpoint is the one the turn engine wrote.
    let live = store.live_checkpoint("s1").await?.context("live")?;
    ensure!(live.segment == 1 && live.data == serde_json::to_value(&paused)?);
    ensure!(live.created_at == live.updated_at, "not written again");
    let idle = store.start_segment("r1", LONG).await?;
    ensure!(
        idle == SegmentStart::Idle,
        "a paused session does not run: {idle:?}"
    );

    expect_err!(
        store.run_command(approve("k2", "nope", true, None)).await,
        StoreError::Conflict {
            entity: Entity::Session,
            ..
        }
    );
    expect_err!(
        store.run_command(respond("k2", "i1", json!("yes"))).await,
        StoreError::Conflict {
            entity: Entity::Session,
            ..
        }
    );
    let mut decision = approve("k3", "i1", true, Some("fine"));
    decision.decided_by = Some("alice".into());
    store.run_command(decision).await?;
    let s = store.get_session("s1").await?;
    ensure!(s.status == SessionStatus::Runnable && s.state["server"]["waits"].is_null());
    let live = store.live_checkpoint("s1").await?.context("live")?;
    ensure!(live.turn_id == "t1" && live.segment == 2, "{live:?}");
    let next: TurnCheckpoint = serde_json::from_value(live.data)?;
    let mut expected = TurnCheckpoint::new_turn("t1", "hi");
    expected.decisions.insert(
        "i1".to_owned(),
        Decision {
            approved: true,
            reason: Some("fine".into()),
            value: None,
        },
    );
    ensure!(next == expected, "{next:?}");
    let event = last_event(store, "s1").await?;
    ensure!(event.event_type == "command.approve" && event.turn_id.as_deref() == Some("t1"));
    ensure!(
        event.payload
            == json!({"interactionId": "i1", "approved": true, "reason": "fine", "decidedBy": "alice"}),
        "{:?}",
        event.payload
    );
    expect_err!(
        store.run_command(approve("k4", "i1", false, None)).await,
        StoreError::Conflict {
            entity: Entity::Session,
            ..
        }
    );

    // The next segment runs from the decision, and pauses on an input.
    let segment = start(store, "r1").await?;
    ensure!(segment.segment == 2 && segment.checkpoint == expected);
    pause(store, &segment, vec![interaction("i2", "input")]).await?;
    expect_err!(
        store.run_command(approve("k5", "i2", true, None)).await,
        StoreError::Conflict {
            entity: Entity::Session,
            ..
        }
    );
    store
        .run_command(respond("k6", "i2", json!({"answer": 42})))
        .await?;
    ensure!(store.get_session("s1").await?.status == SessionStatus::Runnable);
    let live = store.live_checkpoint("s1").await?.context("live")?;
    ensure!(live.segment == 4, "{live:?}");
    let next: TurnCheckpoint = serde_json::from_value(live.data)?;
    expected.decisions.insert(
        "i2".to_owned(),
        Decision {
            approved: true,
            reason: None,
            value: Some(json!({"answer": 42})),
        },
    );
    ensure!(next == expected, "{next:?}");
    let event = last_event(store, "s1").await?;
    ensure!(event.event_type == "command.respond");
    ensure!(event.payload["interactionId"] == json!("i2"));
    ensure!(event.payload["value"] == json!({"answer": 42}));
    Ok(())
}

async fn start_segment_runs_each_runnable_session_on_one_replica(
    f: &Fixture,
) -> anyhow::Result<()> {
    let store = &*f.store;
    session(store, "s1").await?;
    let idle = store.start_segment("r1", LONG).await?;
    ensure!(idle == SegmentStart::Idle, "idle is not runnable: {idle:?}");
    store.run_command(message("s1", "k1", "t1", "hi")).await?;
    let segment = start(store, "r1").await?;
    ensure!(segment.session.id == "s1" && segment.turn_id == "t1" && segment.segment == 0);
    ensure!(segment.checkpoint == TurnCheckpoint::new_turn("t1", "hi"));
    ensure!(segment.effects_uncertain == 0);
    ensure!(segment.lease.replica_id == "r1" && segment.lease.generation == 1);
    let s = store.get_session("s1").await?;
    ensure!(s.status == SessionStatus::Running && s.generation == 1);
    ensure!(s.owner.as_ref().is_some_and(|o| o.replica_id == "r1"));
    ensure!(segment.session == s, "{:?} != {s:?}", segment.session);
    let idle = f.peer.start_segment("r2", LONG).await?;
    ensure!(idle == SegmentStart::Idle, "held by r1: {idle:?}");
    store.renew_lease(&segment.lease.fence(), LONG).await?;

    // Racing replicas: every runnable session goes to exactly one of them.
    let ids: Vec<String> = (0..8).map(|n| format!("r-{n}")).collect();
    for id in &ids {
        session(store, id).await?;
        store.run_command(message(id, "k1", "t1", "hi")).await?;
    }
    let barrier = Barrier::new(2);
    let drain = |store: Arc<dyn Store>, replica: &'static str| {
        let barrier = &barrier;
        async move {
            barrier.wait().await;
            let mut won = Vec::new();
            loop {
                match store.start_segment(replica, LONG).await? {
                    SegmentStart::Run(segment) => {
                        ensure!(segment.lease.replica_id == replica);
                        won.push(segment.session.id);
                    }
                    SegmentStart::Idle => break,
                    other => anyhow::bail!("unexpected {other:?}"),
                }
            }
            anyhow::Ok(won)
        }
    };
    let (one, two) = tokio::join!(
        drain(Arc::clone(&f.store), "ra"),
        drain(Arc::clone(&f.peer), "rb")
    );
    let mut won = one?;
    won.extend(two?);
    let distinct: HashSet<&String> = won.iter().collect();
    ensure!(distinct.len() == won.len(), "a session won twice: {won:?}");
    won.sort();
    ensure!(won == ids, "won {won:?}");
    Ok(())
}

/// The claim reads the turn's journal in its own transaction, so the run starts without a read
/// of its own: the turn's effects as the lease found them, and the other turns' model calls.
async fn start_segment_hands_the_run_its_turns_journal(f: &Fixture) -> anyhow::Result<()> {
    let store = &*f.store;
    session(store, "s1").await?;
    let earlier = model_call("t0:s0:model", "t0", json!({}));
    store.begin_effect(BeginEffect::new("s1", earlier)).await?;
    store.run_command(message("s1", "k1", "t1", "hi")).await?;
    let first = start(store, "r1").await?;
    ensure!(
        first.journal.effects.is_empty() && first.journal.model_calls_elsewhere == 1,
        "a fresh turn's journal: {:?}",
        first.journal
    );
    // The segment journals a model call and its result, then stops without an outcome (a
    // shutdown): the next claim finds them.
    let fence = first.lease.fence();
    begin_under(store, &fence, model_call("t1:s0:model", "t1", json!({}))).await?;
    let mut commit = SessionCommit::new("s1");
    commit.fence = Some(fence.clone());
    commit.effects.push(
        EffectTransition::new(
            "t1:s0:model",
            &[EffectStatus::Invoking],
            EffectStatus::Completed,
        )
        .with_result(json!({"ok": "hi"})),
    );
    applied(store.commit(commit).await?)?;
    store
        .finish_segment(&fence, "t1", None, SegmentOutcome::Cancelled, None)
        .await?;
    let second = start(&*f.peer, "r2").await?;
    let journal: Vec<(&str, EffectStatus)> = second
        .journal
        .effects
        .iter()
        .map(|e| (e.effect_id.as_str(), e.status))
        .collect();
    ensure!(
        journal == [("t1:s0:model", EffectStatus::Completed)],
        "the second segment's journal: {journal:?}"
    );
    ensure!(second.journal.effects[0].result == Some(json!({"ok": "hi"})));
    ensure!(second.journal.model_calls_elsewhere == 1);
    Ok(())
}

/// A start says whether another session was claimable beside the one it claimed; a session
/// another start holds under a live lease is not.
async fn a_claim_says_whether_another_session_is_claimable(f: &Fixture) -> anyhow::Result<()> {
    let store = &*f.store;
    for id in ["s1", "s2"] {
        session(store, id).await?;
        store.run_command(message(id, "k1", "t1", "hi")).await?;
    }
    let first = start(store, "r1").await?;
    ensure!(
        first.others_claimable,
        "{} left one to claim",
        first.session.id
    );
    let second = start(&*f.peer, "r2").await?;
    ensure!(
        !second.others_claimable && second.session.id != first.session.id,
        "{} with {} running: {}",
        second.session.id,
        first.session.id,
        second.others_claimable
    );
    let found = store.start_segment("r1", LONG).await?;
    ensure!(found == SegmentStart::Idle, "both are running: {found:?}");
    Ok(())
}

async fn start_segment_settles_a_session_with_nothing_to_run(f: &Fixture) -> anyhow::Result<()> {
    let store = &*f.store;
    // Runnable, but no checkpoint.
    session(store, "s1").await?;
    set_turn(store, "s1", SessionStatus::Runnable, Some("t1")).await?;
    // Running, but its checkpoint is not one.
    session(store, "s2").await?;
    let mut unreadable = SessionCommit::new("s2");
    unreadable.patch.status = Some(SessionStatus::Running);
    unreadable.patch.active_turn_id = Some(Some("t2".into()));
    unreadable.checkpoint = Some(CheckpointWrite::Put(NewCheckpoint::new(
        "t2",
        0,
        json!({"not": "a turn checkpoint"}),
    )));
    applied(store.commit(unreadable).await?)?;
    // Runnable, with the checkpoint of another turn.
    session(store, "s3").await?;
    let mut other_turn = SessionCommit::new("s3");
    other_turn.patch.status = Some(SessionStatus::Runnable);
    other_turn.patch.active_turn_id = Some(Some("t3".into()));
    other_turn.checkpoint = Some(CheckpointWrite::Put(NewCheckpoint::new(
        "t-old",
        0,
        new_turn("t-old", "hi")?,
    )));
    applied(store.commit(other_turn).await?)?;

    // Each start says whether another session is left to claim: the first two do, the third
    // does not, and a start after it finds nothing.
    let mut settled = Vec::new();
    loop {
        match f.peer.start_segment("r1", LONG).await? {
            SegmentStart::Settled {
                session_id,
                effects_uncertain,
                others_claimable,
            } => {
                ensure!(effects_uncertain == 0);
                settled.push(session_id);
                ensure!(
                    others_claimable == (settled.len() < 3),
                    "after {settled:?}: others claimable {others_claimable}"
                );
            }
            SegmentStart::Idle => break,
            other => anyhow::bail!("nothing should run: {other:?}"),
        }
        ensure!(settled.len() <= 3, "settled again: {settled:?}");
    }
    settled.sort();
    ensure!(settled == ["s1", "s2", "s3"], "settled {settled:?}");
    for (id, turn, code) in [
        ("s1", "t1", "no_checkpoint"),
        ("s2", "t2", "bad_checkpoint"),
        ("s3", "t3", "no_checkpoint"),
    ] {
        let s = store.get_session(id).await?;
        ensure!(
            s.status == SessionStatus::Failed && s.active_turn_id.is_none(),
            "{id}: {s:?}"
        );
        ensure!(s.owner.is_none(), "{id}: the lease is released");
        ensure!(
            s.state["server"]["error"]["code"] == json!(code),
            "{id}: {}",
            s.state
        );
        let event = last_event(store, id).await?;
        ensure!(event.event_type == "turn.failed" && event.turn_id.as_deref() == Some(turn));
        ensure!(
            event.payload["error"]["code"] == json!(code),
            "{id}: {:?}",
            event.payload
        );
        ensure!(
            store.live_checkpoint(id).await?.is_none(),
            "{id}: checkpoint cleared"
        );
    }
    Ok(())
}

/// A model call's start waits in the journal for its next commit: when the turn is cancelled
/// during the call, the segment's end writes it, and leaves it uncertain as the cancel left what
/// was in flight then (never `invoking` on a turn that is over).
async fn a_cancelled_turns_held_model_call_is_left_uncertain(f: &Fixture) -> anyhow::Result<()> {
    let store = &*f.store;
    session(store, "s1").await?;
    store.run_command(message("s1", "k1", "t1", "hi")).await?;
    let segment = start(store, "r1").await?;
    let fence = segment.lease.fence();
    store.run_command(cancel("s1", "k2", Some("user"))).await?;
    let mut held = SessionCommit::new("s1");
    held.fence = Some(fence.clone());
    held.new_effects
        .push(model_call("t1:s0:model", "t1", json!({})));
    let (end, uncertain) = store
        .finish_segment(&fence, "t1", Some(held), completed(vec![]), None)
        .await?;
    ensure!(
        end == SegmentEnd::Unchanged && uncertain == 1,
        "{end:?}, {uncertain} uncertain"
    );
    let effect = store.get_effect("t1:s0:model").await?;
    ensure!(
        effect.status == EffectStatus::Uncertain && effect.error.is_some(),
        "{effect:?}"
    );
    let s = store.get_session("s1").await?;
    ensure!(
        s.status == SessionStatus::Cancelled && s.owner.is_none(),
        "{s:?}"
    );
    Ok(())
}

/// A turn that completes or fails leaves none of its effects `invoking`: what it still had in
/// flight (a call a script started and did not await, cancelled with the script) becomes
/// uncertain, without an event, as nobody waits on the turn any more. Only the active turn
/// has effects in flight, which is where a start, a cancel and a recovery look for them.
async fn a_turn_that_ends_leaves_none_of_its_effects_invoking(f: &Fixture) -> anyhow::Result<()> {
    let store = &*f.store;
    for (session_id, outcome) in [
        ("s1", completed(vec![])),
        (
            "s2",
            SegmentOutcome::Failed {
                code: "model_error".into(),
                message: "the model failed".into(),
            },
        ),
    ] {
        session(store, session_id).await?;
        store
            .run_command(message(session_id, "k1", "t1", "hi"))
            .await?;
        let segment = start(store, "r1").await?;
        let fence = segment.lease.fence();
        let (model, call) = (format!("{session_id}:model"), format!("{session_id}:call"));
        let mut begin = BeginEffect::new(session_id, model_call(&model, "t1", json!({})));
        begin.fence = Some(fence.clone());
        store.begin_effect(begin).await?;
        let mut held = SessionCommit::new(session_id);
        held.fence = Some(fence.clone());
        held.effects.push(
            EffectTransition::new(&model, &[EffectStatus::Invoking], EffectStatus::Completed)
                .with_result(json!({"text": "hi"})),
        );
        held.new_effects.push(NewEffect::new(
            &call,
            "t1",
            EffectKind::CapabilityCall,
            EffectStatus::Invoking,
            json!({}),
        ));
        let before = store.get_session(session_id).await?.last_cursor;
        let (end, uncertain) = store
            .finish_segment(&fence, "t1", Some(held), outcome, None)
            .await?;
        ensure!(
            end == SegmentEnd::Applied,
            "{session_id}: {end:?}, {uncertain}"
        );
        let call = store.get_effect(&call).await?;
        ensure!(
            call.status == EffectStatus::Uncertain
                && call.error.as_deref()
                    == Some("the turn ended before the effect's outcome was recorded"),
            "{session_id}: {call:?}"
        );
        let model = store.get_effect(&model).await?;
        ensure!(model.status == EffectStatus::Completed, "{model:?}");
        let s = store.get_session(session_id).await?;
        ensure!(
            matches!(s.status, SessionStatus::Completed | SessionStatus::Failed)
                && s.active_turn_id.is_none(),
            "{s:?}"
        );
        let events = store.list_events(session_id, before, 10).await?;
        let types: Vec<&str> = events.iter().map(|e| e.event_type.as_str()).collect();
        ensure!(
            types == ["turn.completed"] || types == ["turn.failed"],
            "{session_id}: no event announces the effect: {types:?}"
        );
    }
    Ok(())
}

/// The run's last journal writes and its outcome are one transaction: applied in order (the
/// held events before the outcome's), or, when the held writes are refused as their own commit
/// would have been, nothing at all and the lease still held.
async fn a_segment_finishes_with_what_its_journal_held_or_not_at_all(
    f: &Fixture,
) -> anyhow::Result<()> {
    let store = &*f.store;
    session(store, "s1").await?;
    store.run_command(message("s1", "k1", "t1", "hi")).await?;
    let segment = start(store, "r1").await?;
    let fence = segment.lease.fence();
    begin_under(store, &fence, model_call("t1:s0:model", "t1", json!({}))).await?;
    let before = store.get_session("s1").await?;
    let held = |from: EffectStatus| {
        let mut held = SessionCommit::new("s1");
        held.fence = Some(fence.clone());
        held.effects.push(
            EffectTransition::new("t1:s0:model", &[from], EffectStatus::Completed)
                .with_result(json!({"ok": "hello"})),
        );
        held.events
            .push(event("text.delta", json!({"text": "hello"})).in_turn("t1"));
        held
    };

    // Refused: the transition's guard does not hold. Nothing is written, the lease is kept.
    expect_err!(
        store
            .finish_segment(
                &fence,
                "t1",
                Some(held(EffectStatus::Pending)),
                completed(vec![]),
                None
            )
            .await,
        StoreError::Conflict {
            entity: Entity::Effect,
            ..
        }
    );
    let s = store.get_session("s1").await?;
    ensure!(s.status == SessionStatus::Running && s.last_cursor == before.last_cursor);
    ensure!(s.owner.as_ref().is_some_and(|o| o.replica_id == "r1"));
    // Another session's writes are not this lease's, and a command is never answered here.
    let mut elsewhere = held(EffectStatus::Invoking);
    elsewhere.session_id = "s2".into();
    let mut answering = held(EffectStatus::Invoking);
    answering.command = Some(NewCommand::new("k9", json!({}), json!({})));
    for refused in [elsewhere, answering] {
        expect_err!(
            store
                .finish_segment(&fence, "t1", Some(refused), completed(vec![]), None)
                .await,
            StoreError::InvalidInput { .. }
        );
    }

    let (end, _) = store
        .finish_segment(
            &fence,
            "t1",
            Some(held(EffectStatus::Invoking)),
            completed(vec![]),
            None,
        )
        .await?;
    ensure!(end == SegmentEnd::Applied, "{end:?}");
    let effect = store.get_effect("t1:s0:model").await?;
    ensure!(effect.status == EffectStatus::Completed);
    ensure!(effect.result == Some(json!({"ok": "hello"})));
    let events = store.list_events("s1", before.last_cursor, 10).await?;
    let types: Vec<&str> = events.iter().map(|e| e.event_type.as_str()).collect();
    ensure!(types == ["text.delta", "turn.completed"], "{types:?}");
    let s = store.get_session("s1").await?;
    ensure!(s.status == SessionStatus::Completed && s.owner.is_none());
    Ok(())
}

async fn a_completed_segment_ends_the_turn_and_releases_the_lease(
    f: &Fixture,
) -> anyhow::Result<()> {
    let store = &*f.store;
    session(store, "s1").await?;
    store.run_command(message("s1", "k1", "t1", "hi")).await?;
    let segment = start(store, "r1").await?;
    let before = store.get_session("s1").await?;
    let items = vec![
        json!({"role": "user", "content": "hi"}),
        json!({"role": "assistant", "content": "hello"}),
    ];
    let fence = segment.lease.fence();
    let outcome = SegmentOutcome::Completed {
        output: json!({"text": "hello"}),
        items: items.clone(),
    };
    let (end, uncertain) = store
        .finish_segment(&fence, "t1", None, outcome.clone(), None)
        .await?;
    ensure!(end == SegmentEnd::Applied && uncertain == 0, "{end:?}");
    let s = store.get_session("s1").await?;
    ensure!(s.status == SessionStatus::Completed && s.active_turn_id.is_none());
    ensure!(s.owner.is_none() && s.last_item_seq == 2);
    let page = store.page_items("s1", 0, 10).await?;
    let bodies: Vec<Value> = page.items.iter().map(|i| i.body.clone()).collect();
    ensure!(bodies == items, "items {bodies:?}");
    ensure!(
        page.items
            .iter()
            .all(|i| i.turn_id.as_deref() == Some("t1"))
    );
    let events = store.list_events("s1", before.last_cursor, 10).await?;
    ensure!(events.len() == 1 && events[0].event_type == "turn.completed");
    ensure!(events[0].payload == json!({"output": {"text": "hello"}}));
    ensure!(events[0].turn_id.as_deref() == Some("t1"));
    ensure!(
        store.live_checkpoint("s1").await?.is_none(),
        "checkpoint cleared"
    );
    // The lease is gone: it can neither be renewed nor finish again.
    expect_err!(
        store.renew_lease(&fence, LONG).await,
        StoreError::StaleGeneration {
            reason: StaleReason::NotHeld,
            ..
        }
    );
    expect_err!(
        store
            .finish_segment(&fence, "t1", None, outcome, None)
            .await,
        StoreError::StaleGeneration {
            reason: StaleReason::NotHeld,
            ..
        }
    );
    ensure!(store.get_session("s1").await?.last_item_seq == 2);
    // Another replica runs the next turn at once.
    store.run_command(message("s1", "k2", "t2", "more")).await?;
    let next = start(&*f.peer, "r2").await?;
    ensure!(next.turn_id == "t2" && next.lease.replica_id == "r2" && next.lease.generation == 2);
    Ok(())
}

async fn a_failed_segment_fails_the_turn(f: &Fixture) -> anyhow::Result<()> {
    let store = &*f.store;
    session(store, "s1").await?;
    store.run_command(message("s1", "k1", "t1", "hi")).await?;
    let segment = start(store, "r1").await?;
    let outcome = SegmentOutcome::Failed {
        code: "model_error".into(),
        message: "the model is unavailable".into(),
    };
    let (end, _) = store
        .finish_segment(&segment.lease.fence(), "t1", None, outcome, None)
        .await?;
    ensure!(end == SegmentEnd::Applied);
    let s = store.get_session("s1").await?;
    ensure!(s.status == SessionStatus::Failed && s.active_turn_id.is_none() && s.owner.is_none());
    let error = json!({"code": "model_error", "message": "the model is unavailable"});
    ensure!(s.state["server"]["error"] == error, "state {}", s.state);
    let event = last_event(store, "s1").await?;
    ensure!(event.event_type == "turn.failed" && event.payload == json!({"error": error}));
    ensure!(store.live_checkpoint("s1").await?.is_none());
    ensure!(s.last_item_seq == 0, "the conversation stays as it was");
    Ok(())
}

async fn a_waiting_turn_runs_again_when_a_result_lands_during_its_segment(
    f: &Fixture,
) -> anyhow::Result<()> {
    let store = &*f.store;
    session(store, "s1").await?;
    store.run_command(message("s1", "k1", "t1", "hi")).await?;
    let segment = start(store, "r1").await?;
    store.begin_effect(action_effect("a1", "t1")).await?;
    let waiting = SegmentOutcome::Waiting {
        effect_ids: vec!["a1".into()],
    };
    let (end, _) = store
        .finish_segment(&segment.lease.fence(), "t1", None, waiting, None)
        .await?;
    ensure!(end == SegmentEnd::Applied, "{end:?}");
    let s = store.get_session("s1").await?;
    ensure!(s.status == SessionStatus::Waiting && s.owner.is_none());
    ensure!(
        s.state["server"]["waits"] == json!({"effectIds": ["a1"]}),
        "{}",
        s.state
    );
    let event = last_event(store, "s1").await?;
    ensure!(event.event_type == "turn.waiting" && event.payload == json!({"effectIds": ["a1"]}));
    let idle = store.start_segment("r1", LONG).await?;
    ensure!(
        idle == SegmentStart::Idle,
        "a waiting session does not run: {idle:?}"
    );
    // The result makes it runnable.
    store.claim_action(claim("a1", "c1", LONG)).await?;
    store
        .run_command(action_result("r1", "a1", "c1", 1, &json!({"value": 1})))
        .await?;
    let s = store.get_session("s1").await?;
    ensure!(s.status == SessionStatus::Runnable && s.state["server"]["waits"].is_null());

    // A result landing while the next segment runs: that segment's wait runs the turn again.
    let segment = start(store, "r1").await?;
    store.begin_effect(action_effect("a2", "t1")).await?;
    store.claim_action(claim("a2", "c2", LONG)).await?;
    store
        .run_command(action_result("r2", "a2", "c2", 1, &json!({"value": 2})))
        .await?;
    let idle = f.peer.start_segment("r2", LONG).await?;
    ensure!(idle == SegmentStart::Idle, "still held by r1: {idle:?}");
    let before = store.get_session("s1").await?.last_cursor;
    let waiting = SegmentOutcome::Waiting {
        effect_ids: vec!["a2".into()],
    };
    let (end, _) = store
        .finish_segment(&segment.lease.fence(), "t1", None, waiting, None)
        .await?;
    ensure!(end == SegmentEnd::RunAgain, "{end:?}");
    let s = store.get_session("s1").await?;
    ensure!(s.status == SessionStatus::Runnable && s.owner.is_none());
    ensure!(s.last_cursor == before, "no turn.waiting");
    let again = start(&*f.peer, "r2").await?;
    ensure!(again.turn_id == "t1" && again.lease.generation == segment.lease.generation + 1);
    Ok(())
}

async fn a_cancelled_or_stopped_segment_applies_no_outcome(f: &Fixture) -> anyhow::Result<()> {
    let store = &*f.store;
    session(store, "s1").await?;
    store.run_command(message("s1", "k1", "t1", "hi")).await?;
    let segment = start(store, "r1").await?;
    store.begin_effect(invoking_effect("m1", "t1")).await?;
    let cancelled = store.run_command(cancel("s1", "k2", None)).await?;
    ensure!(cancelled.effects_uncertain == 1);
    let before = store.get_session("s1").await?;
    let (end, uncertain) = store
        .finish_segment(
            &segment.lease.fence(),
            "t1",
            None,
            completed(vec![json!("late")]),
            None,
        )
        .await?;
    ensure!(end == SegmentEnd::Unchanged && uncertain == 0, "{end:?}");
    let s = store.get_session("s1").await?;
    ensure!(s.status == SessionStatus::Cancelled && s.active_turn_id.is_none());
    ensure!(s.owner.is_none(), "the lease is released");
    ensure!(
        s.last_item_seq == 0 && s.last_cursor == before.last_cursor,
        "nothing applied"
    );

    // A shutdown with nothing in flight: the session stays running, for the next start.
    store.run_command(message("s1", "k3", "t2", "hi")).await?;
    let segment = start(store, "r1").await?;
    let (end, uncertain) = store
        .finish_segment(
            &segment.lease.fence(),
            "t2",
            None,
            SegmentOutcome::Cancelled,
            Some("shutting down"),
        )
        .await?;
    ensure!(end == SegmentEnd::Unchanged && uncertain == 0, "{end:?}");
    let s = store.get_session("s1").await?;
    ensure!(s.status == SessionStatus::Running && s.owner.is_none());
    let segment = start(&*f.peer, "r2").await?;
    ensure!(segment.turn_id == "t2" && segment.effects_uncertain == 0);
    // A shutdown with a call in flight: it becomes uncertain under the lease.
    store.begin_effect(invoking_effect("m2", "t2")).await?;
    let (end, uncertain) = f
        .peer
        .finish_segment(
            &segment.lease.fence(),
            "t2",
            None,
            SegmentOutcome::Cancelled,
            Some("shutting down"),
        )
        .await?;
    ensure!(
        end == SegmentEnd::Unchanged && uncertain == 1,
        "{end:?}, {uncertain}"
    );
    let m2 = store.get_effect("m2").await?;
    ensure!(m2.status == EffectStatus::Uncertain && m2.error.as_deref() == Some("shutting down"));
    let s = store.get_session("s1").await?;
    ensure!(s.status == SessionStatus::Uncertain && s.owner.is_none());
    ensure!(last_event(store, "s1").await?.event_type == "effect.uncertain");
    Ok(())
}

async fn a_segment_finishes_under_its_fence_until_taken_over(f: &Fixture) -> anyhow::Result<()> {
    let store = &*f.store;
    session(store, "s1").await?;
    store.run_command(message("s1", "k1", "t1", "hi")).await?;
    let SegmentStart::Run(segment) = store.start_segment("r1", SHORT).await? else {
        anyhow::bail!("nothing to run");
    };
    tokio::time::sleep(PAST_SHORT).await;
    // Expired, but nobody took over: it still finishes.
    let (end, _) = store
        .finish_segment(&segment.lease.fence(), "t1", None, completed(vec![]), None)
        .await?;
    ensure!(end == SegmentEnd::Applied);
    ensure!(store.get_session("s1").await?.status == SessionStatus::Completed);

    store.run_command(message("s1", "k2", "t2", "hi")).await?;
    let SegmentStart::Run(old) = store.start_segment("r1", SHORT).await? else {
        anyhow::bail!("nothing to run");
    };
    tokio::time::sleep(PAST_SHORT).await;
    let new = start(&*f.peer, "r2").await?;
    ensure!(new.lease.generation == old.lease.generation + 1);
    expect_err!(
        store
            .finish_segment(&old.lease.fence(), "t2", None, completed(vec![]), None)
            .await,
        StoreError::StaleGeneration {
            reason: StaleReason::Superseded,
            ..
        }
    );
    let s = store.get_session("s1").await?;
    ensure!(s.status == SessionStatus::Running);
    ensure!(s.owner.is_some_and(|o| o.replica_id == "r2"), "r2 keeps it");
    let (end, _) = f
        .peer
        .finish_segment(&new.lease.fence(), "t2", None, completed(vec![]), None)
        .await?;
    ensure!(end == SegmentEnd::Applied);
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

async fn sessions_page_by_key(f: &Fixture) -> anyhow::Result<()> {
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
    expect_err!(
        store
            .page_sessions(&SessionFilter::default(), None, 0)
            .await,
        StoreError::InvalidInput { .. }
    );
    Ok(())
}

async fn sessions_are_counted_by_tenant_agent_and_status(f: &Fixture) -> anyhow::Result<()> {
    let store = &*f.store;
    for (id, tenant) in [
        ("a1", "acme"),
        ("a2", "acme"),
        ("a3", "acme"),
        ("g1", "globex"),
    ] {
        session_of(store, id, tenant).await?;
    }
    set_turn(store, "a1", SessionStatus::Paused, Some("t1")).await?;
    set_turn(store, "a2", SessionStatus::Paused, Some("t1")).await?;
    set_turn(store, "g1", SessionStatus::Uncertain, Some("t1")).await?;
    let wanted = [
        SessionStatus::Paused,
        SessionStatus::Waiting,
        SessionStatus::Uncertain,
    ];
    let counts: Vec<(String, String, SessionStatus, u64)> = store
        .count_sessions(&wanted)
        .await?
        .into_iter()
        .map(|c| (c.tenant_id, c.agent_id, c.status, c.sessions))
        .collect();
    let expected = vec![
        (
            "acme".to_owned(),
            "helper".to_owned(),
            SessionStatus::Paused,
            2,
        ),
        (
            "globex".to_owned(),
            "helper".to_owned(),
            SessionStatus::Uncertain,
            1,
        ),
    ];
    ensure!(counts == expected, "counts {counts:?}");
    ensure!(
        store.count_sessions(&[]).await?.is_empty(),
        "no statuses, no counts"
    );
    let idle = store.count_sessions(&[SessionStatus::Idle]).await?;
    ensure!(
        idle.len() == 1 && idle[0].sessions == 1 && idle[0].tenant_id == "acme",
        "idle {idle:?}"
    );
    Ok(())
}

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
