//! The journal's commits: how few a turn takes, what a crash before one loses (an entry and the
//! events it caused, together), and what a failed one leaves behind.

use std::sync::Arc;
use std::time::Duration;

use corral_chat::{ConversationStore, JournalError, Journaled, RunResult, StoreJournal};
use corral_store::{EffectKind, EffectStatus, NewEvent, Store};
use serde_json::json;

use crate::support::*;
use crate::{dir, run_ok};

const TWO_ECHOES: &str = "const [a, b] = await Promise.all([tools.t.echo({n: 1}), tools.t.echo({n: 2})]); return [a, b];";

/// A whole turn (model call, a script of two concurrent calls, model answer) took 16 store
/// transactions when every journal entry was its own commit and every lookup its own read, 8
/// while a model call's result was a commit of its own, 6 while each model call's start was:
/// now two reads, the two calls' begins (with the first model call), and the run's end (with
/// the calls' results and the second model call). One more, at the end of a result window, if
/// the machine is slow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_of_two_calls_takes_at_most_five_store_transactions() {
    let dir = dir();
    let store = open_store(dir.path()).await;
    let parts = Parts::new(json!([js(TWO_ECHOES), {"text": "done"}]));
    let mut input = parts.input(&store, "turn-1", "echo twice");
    input.auto_confirm = true;
    let before = store.transactions();
    let RunResult::Completed { text, .. } = run_ok(input).await else {
        panic!("not completed")
    };
    let transactions = store.transactions() - before;
    assert_eq!(text, "done");
    assert!(
        transactions <= 5,
        "the turn took {transactions} store transactions"
    );
    // Everything the turn journaled is durable once it returns.
    let effects = list_effects(&store).await;
    assert!(
        effects.iter().all(|e| e.status == EffectStatus::Completed),
        "{effects:?}"
    );
    assert_eq!(
        effects
            .iter()
            .filter(|e| e.kind == EffectKind::CapabilityCall)
            .count(),
        2
    );
}

/// An entry complete at once and the event it caused wait for the next commit: a process that
/// dies first loses both (the next run journals and emits them again, once), never one alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_entry_and_its_event_are_committed_together_or_not_at_all() {
    let dir = dir();
    let store = open_store(dir.path()).await;
    let dead = StoreJournal::new(Arc::clone(&store), "s1", "t1", None, 0);
    let recorded = record(&dead, "t1:s0:t0:started").await;
    assert_eq!(recorded, Journaled::New);
    append(&dead, "tool.started").await;
    assert_eq!(
        dead.lookup("t1:s0:t0:started").await.ok().flatten(),
        Some(Journaled::Completed(json!({}))),
        "the journal answers from what it holds"
    );
    drop(dead);
    assert!(
        list_effects(&store).await.is_empty(),
        "nothing was committed"
    );
    assert!(events(&store).await.is_empty());

    let journal = StoreJournal::new(Arc::clone(&store), "s1", "t1", None, 0);
    assert_eq!(record(&journal, "t1:s0:t0:started").await, Journaled::New);
    append(&journal, "tool.started").await;
    let began = journal
        .begin(
            "t1",
            "t1:s0:t0:b0:c0",
            EffectKind::CapabilityCall,
            json!({"capability": "t.echo"}),
            None,
        )
        .await;
    assert!(matches!(began, Ok(Journaled::New)), "{began:?}");
    // The call is about to be performed: it, the entry before it and the event are durable.
    let effects = list_effects(&store).await;
    let mut ids: Vec<(&str, EffectStatus)> = effects
        .iter()
        .map(|e| (e.effect_id.as_str(), e.status))
        .collect();
    ids.sort_by_key(|(id, _)| *id);
    assert_eq!(
        ids,
        [
            ("t1:s0:t0:b0:c0", EffectStatus::Invoking),
            ("t1:s0:t0:started", EffectStatus::Completed)
        ]
    );
    let types: Vec<String> = events(&store)
        .await
        .into_iter()
        .map(|e| e.event_type)
        .collect();
    assert_eq!(types, ["tool.started"]);
    // A replay of the same entry is answered from the journal, a different one is drift.
    assert_eq!(
        record(&journal, "t1:s0:t0:started").await,
        Journaled::Completed(json!({}))
    );
    let drift = journal
        .record(
            "t1",
            "t1:s0:t0:started",
            EffectKind::Script,
            json!({"name": "something else"}),
            json!({}),
        )
        .await;
    assert!(
        matches!(drift, Err(JournalError::Drift { .. })),
        "{drift:?}"
    );
}

/// Writes under a lease another replica took over fail, and so does every write after them:
/// a run never goes on with a journal that lost a commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_failed_commit_every_write_fails() {
    let dir = dir();
    let store = open_store(dir.path()).await;
    let lease = Duration::from_secs(60);
    let first = must(store.acquire_session("s1", "replica-1", lease).await);
    must(store.release_lease(&first.fence()).await);
    must(store.acquire_session("s1", "replica-2", lease).await);
    let journal = StoreJournal::new(Arc::clone(&store), "s1", "t1", Some(first.fence()), 0);
    assert_eq!(record(&journal, "t1:s0:t0:started").await, Journaled::New);
    let began = journal
        .begin(
            "t1",
            "t1:s0:t0:b0:c0",
            EffectKind::CapabilityCall,
            json!({"n": 1}),
            None,
        )
        .await;
    assert!(matches!(began, Err(JournalError::Fenced(_))), "{began:?}");
    let after = journal
        .record(
            "t1",
            "t1:s0:t1:started",
            EffectKind::Script,
            json!({}),
            json!({}),
        )
        .await;
    assert!(matches!(after, Err(JournalError::Failed(_))), "{after:?}");
    let flushed = journal.flush().await;
    assert!(
        matches!(flushed, Err(JournalError::Failed(_))),
        "{flushed:?}"
    );
    assert!(list_effects(&store).await.is_empty(), "nothing was written");
}

/// A result waits for the journal's next commit (here its window is long): a process that
/// dies first leaves the call `invoking`, which the next run finds uncertain, as if it had died
/// during the call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_waits_for_the_journals_next_commit() {
    let dir = dir();
    let store = open_store(dir.path()).await;
    let long = Duration::from_secs(3600);
    let dead = StoreJournal::new(Arc::clone(&store), "s1", "t1", None, 0).with_result_window(long);
    let call = "t1:s0:t0:b0:c0";
    assert_eq!(
        begin(&dead, call, EffectKind::CapabilityCall).await,
        Journaled::New
    );
    must(dead.complete(call, json!({"n": 1})).await);
    assert_eq!(
        statuses(&store).await,
        [(call.to_owned(), EffectStatus::Invoking)]
    );
    drop(dead);
    let next = StoreJournal::new(Arc::clone(&store), "s1", "t1", None, 0);
    assert_eq!(
        begin(&next, call, EffectKind::CapabilityCall).await,
        Journaled::Uncertain
    );

    let journal =
        StoreJournal::new(Arc::clone(&store), "s1", "t2", None, 0).with_result_window(long);
    assert_eq!(
        begin(&journal, "t2:s0:t0:b0:c0", EffectKind::CapabilityCall).await,
        Journaled::New
    );
    must(journal.complete("t2:s0:t0:b0:c0", json!({"n": 1})).await);
    assert_eq!(
        begin(&journal, "t2:s0:t0:b1:c0", EffectKind::CapabilityCall).await,
        Journaled::New
    );
    // The next call's begin committed the result with it.
    assert_eq!(
        statuses(&store).await[1..],
        [
            ("t2:s0:t0:b0:c0".to_owned(), EffectStatus::Completed),
            ("t2:s0:t0:b1:c0".to_owned(), EffectStatus::Invoking)
        ]
    );
}

/// A model call's start is not a commit of its own: asking a model reaches nothing outside. A
/// process that dies before the journal's next commit leaves nothing of the call, and the next
/// run asks the model again; once that commit is made (here a capability call's begin), the
/// model call is journaled, and one in flight when its process dies is uncertain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_calls_start_goes_with_the_journals_next_commit() {
    let dir = dir();
    let store = open_store(dir.path()).await;
    let long = Duration::from_secs(3600);
    let model = "t1:s0:model";
    let dead = StoreJournal::new(Arc::clone(&store), "s1", "t1", None, 0).with_result_window(long);
    // The turn's journal is read on first use: read it before counting.
    assert_eq!(must(dead.lookup(model).await), None);
    let before = store.transactions();
    assert_eq!(
        begin(&dead, model, EffectKind::ModelCall).await,
        Journaled::New
    );
    must(dead.complete(model, json!({"ok": {"text": "hi"}})).await);
    assert_eq!(store.transactions(), before, "the model call committed");
    assert!(statuses(&store).await.is_empty());
    drop(dead);

    let next = StoreJournal::new(Arc::clone(&store), "s1", "t1", None, 0).with_result_window(long);
    assert_eq!(
        begin(&next, model, EffectKind::ModelCall).await,
        Journaled::New,
        "the model is asked again"
    );
    let call = "t1:s0:t0:b0:c0";
    assert_eq!(
        begin(&next, call, EffectKind::CapabilityCall).await,
        Journaled::New
    );
    assert_eq!(
        statuses(&store).await,
        [
            (model.to_owned(), EffectStatus::Invoking),
            (call.to_owned(), EffectStatus::Invoking)
        ]
    );
    drop(next);
    let last = StoreJournal::new(Arc::clone(&store), "s1", "t1", None, 0);
    assert_eq!(
        begin(&last, model, EffectKind::ModelCall).await,
        Journaled::Uncertain
    );
}

/// Events held when a model call starts are not left waiting on the model: they are committed
/// at the end of the result window, with the call's start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_events_before_a_model_call_are_committed_within_the_window() {
    let dir = dir();
    let store = open_store(dir.path()).await;
    let mut committed = store.subscribe_events();
    let journal = StoreJournal::new(Arc::clone(&store), "s1", "t1", None, 0);
    append(&journal, "tool.finished").await;
    let model = "t1:s1:model";
    assert_eq!(
        begin(&journal, model, EffectKind::ModelCall).await,
        Journaled::New
    );
    // Nothing else is written through the journal: the window's end commits the event, whose
    // notice is the sign (the timeout only guards against a hang).
    let notice = tokio::time::timeout(Duration::from_secs(60), committed.recv()).await;
    assert_eq!(must(must(notice)).session_id, "s1");
    assert_eq!(event_types(&store).await, ["tool.finished"]);
    assert_eq!(
        statuses(&store).await,
        [(model.to_owned(), EffectStatus::Invoking)]
    );
    drop(journal);
}

/// With no other commit coming, a result is committed alone at the end of its window (with the
/// event held behind it), and the run never waits for it: `complete` returns while the file's
/// write lock is held elsewhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_is_committed_alone_at_the_end_of_its_window() {
    let dir = dir();
    let store = open_store(dir.path()).await;
    let mut committed = store.subscribe_events();
    let journal = StoreJournal::new(Arc::clone(&store), "s1", "t1", None, 0);
    let call = "t1:s0:t0:b0:c0";
    assert_eq!(
        begin(&journal, call, EffectKind::CapabilityCall).await,
        Journaled::New
    );
    let other = must(rusqlite::Connection::open(dir.path().join("chat.db")));
    must(other.execute_batch("BEGIN IMMEDIATE"));
    must(journal.complete(call, json!({"n": 1})).await);
    append(&journal, "tool.ended").await;
    let status: String = must(other.query_row(
        "SELECT status FROM corral_effects WHERE effect_id = ?1",
        [call],
        |row| row.get(0),
    ));
    assert_eq!(status, "invoking");
    must(other.execute_batch("ROLLBACK"));
    // Nothing else is written through the journal: the window's end commits the result and
    // the event, whose notice is the sign (the timeout only guards against a hang).
    let notice = tokio::time::timeout(Duration::from_secs(60), committed.recv()).await;
    let notice = must(must(notice));
    assert_eq!(notice.session_id, "s1");
    assert_eq!(
        statuses(&store).await,
        [(call.to_owned(), EffectStatus::Completed)]
    );
    assert_eq!(event_types(&store).await, ["tool.ended"]);
    drop(journal);
}

/// The events that led to a script wait for its first call's begin (the call must be durable
/// before it is made anyway) instead of taking a commit of their own before the script starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_events_before_a_script_go_with_its_first_call() {
    let dir = dir();
    let store = open_store(dir.path()).await;
    let long = Duration::from_secs(3600);
    let journal =
        StoreJournal::new(Arc::clone(&store), "s1", "t1", None, 0).with_result_window(long);
    // The turn's journal is read on first use: read it before counting.
    assert_eq!(must(journal.lookup("t1:s0:model").await), None);
    append(&journal, "tool.started").await;
    let before = store.transactions();
    must(journal.publish().await);
    assert_eq!(store.transactions(), before, "publish committed alone");
    assert!(events(&store).await.is_empty());
    let call = "t1:s0:t0:b0:c0";
    let before = store.transactions();
    assert_eq!(
        begin(&journal, call, EffectKind::CapabilityCall).await,
        Journaled::New
    );
    assert_eq!(
        store.transactions() - before,
        1,
        "the call's begin and the events"
    );
    assert_eq!(event_types(&store).await, ["tool.started"]);
    assert_eq!(
        statuses(&store).await,
        [(call.to_owned(), EffectStatus::Invoking)]
    );
}

/// A script that makes no call still shows what led to it while it runs: the events are
/// committed at the end of the result window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_events_before_a_script_without_calls_are_committed_within_the_window() {
    let dir = dir();
    let store = open_store(dir.path()).await;
    let mut committed = store.subscribe_events();
    let journal = StoreJournal::new(Arc::clone(&store), "s1", "t1", None, 0);
    append(&journal, "tool.started").await;
    must(journal.publish().await);
    // Nothing else is written through the journal: the window's end commits the event, whose
    // notice is the sign (the timeout only guards against a hang).
    let notice = tokio::time::timeout(Duration::from_secs(60), committed.recv()).await;
    assert_eq!(must(must(notice)).session_id, "s1");
    assert_eq!(event_types(&store).await, ["tool.started"]);
    drop(journal);
}

/// Given the turn's journal as the lease's claim read it, a run reads nothing more to start:
/// its replay and its count of model calls come from that copy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_journal_given_its_turn_reads_nothing_on_first_use() {
    let dir = dir();
    let store = open_store(dir.path()).await;
    let first = StoreJournal::new(Arc::clone(&store), "s1", "t1", None, 0);
    let model = "t1:s0:model";
    assert_eq!(
        begin(&first, model, EffectKind::ModelCall).await,
        Journaled::New
    );
    must(first.complete(model, json!({"ok": {"text": "hi"}})).await);
    must(first.flush().await);
    drop(first);
    let turn = must(store.turn_effects("s1", "t1").await);
    let before = store.transactions();
    let next = StoreJournal::new(Arc::clone(&store), "s1", "t1", None, 0).with_turn_effects(turn);
    assert_eq!(
        begin(&next, model, EffectKind::ModelCall).await,
        Journaled::Completed(json!({"ok": {"text": "hi"}}))
    );
    assert_eq!(must(next.model_calls_before("t1").await), 0);
    assert_eq!(store.transactions(), before, "the journal read the store");
}

/// A journal whose caller ends the run commits nothing at the end: it hands what it holds over
/// as one commit under its fence, for the caller to commit with the run's outcome (`corral
/// serve`'s `finish_segment`), and nothing is committed twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_journal_ended_by_its_caller_hands_over_what_it_holds() {
    let dir = dir();
    let store = open_store(dir.path()).await;
    let long = Duration::from_secs(3600);
    let journal = StoreJournal::new(Arc::clone(&store), "s1", "t1", None, 0)
        .with_result_window(long)
        .leaving_its_end_to_the_caller();
    let call = "t1:s0:t0:b0:c0";
    assert_eq!(
        begin(&journal, call, EffectKind::CapabilityCall).await,
        Journaled::New
    );
    must(journal.complete(call, json!({"n": 1})).await);
    append(&journal, "tool.ended").await;
    let before = store.transactions();
    must(journal.end().await);
    assert_eq!(store.transactions(), before, "the end committed");
    let Some(held) = must(journal.take_held().await) else {
        panic!("nothing was held")
    };
    assert_eq!(held.session_id, "s1");
    assert_eq!(held.effects.len(), 1);
    assert_eq!(held.events.len(), 1);
    assert_eq!(must(journal.take_held().await), None);
    // Nothing was committed meanwhile; the caller's commit is the one.
    assert_eq!(
        statuses(&store).await,
        [(call.to_owned(), EffectStatus::Invoking)]
    );
    must(store.commit(held).await);
    assert_eq!(
        statuses(&store).await,
        [(call.to_owned(), EffectStatus::Completed)]
    );
    // Without it, the end is a flush.
    let plain = StoreJournal::new(Arc::clone(&store), "s1", "t2", None, 0).with_result_window(long);
    append(&plain, "turn.note").await;
    must(plain.end().await);
    assert_eq!(must(plain.take_held().await), None);
    assert_eq!(events(&store).await.len(), 2);
}

/// A result's commit that fails in the background fails the journal's next write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_background_commit_fails_the_next_write() {
    let dir = dir();
    let store = open_store(dir.path()).await;
    let lease = Duration::from_secs(60);
    let first = must(store.acquire_session("s1", "replica-1", lease).await);
    let journal = StoreJournal::new(Arc::clone(&store), "s1", "t1", Some(first.fence()), 0);
    let call = "t1:s0:t0:b0:c0";
    assert_eq!(
        begin(&journal, call, EffectKind::CapabilityCall).await,
        Journaled::New
    );
    // Another replica takes the session over while the call runs.
    must(store.release_lease(&first.fence()).await);
    must(store.acquire_session("s1", "replica-2", lease).await);
    must(journal.complete(call, json!({"n": 1})).await);
    let flushed = journal.flush().await;
    assert!(
        matches!(
            flushed,
            Err(JournalError::Fenced(_) | JournalError::Failed(_))
        ),
        "{flushed:?}"
    );
    assert_eq!(
        statuses(&store).await,
        [(call.to_owned(), EffectStatus::Invoking)]
    );
}

async fn begin(journal: &StoreJournal, effect_id: &str, kind: EffectKind) -> Journaled {
    must(
        journal
            .begin("t1", effect_id, kind, json!({"effect": effect_id}), None)
            .await,
    )
}

async fn statuses(store: &Arc<dyn Store>) -> Vec<(String, EffectStatus)> {
    let mut statuses: Vec<_> = list_effects(store)
        .await
        .into_iter()
        .map(|e| (e.effect_id, e.status))
        .collect();
    statuses.sort_by(|a, b| a.0.cmp(&b.0));
    statuses
}

async fn record(journal: &StoreJournal, effect_id: &str) -> Journaled {
    match journal
        .record(
            "t1",
            effect_id,
            EffectKind::Script,
            json!({"name": "run_js"}),
            json!({}),
        )
        .await
    {
        Ok(journaled) => journaled,
        Err(error) => panic!("{error}"),
    }
}

async fn append(journal: &StoreJournal, kind: &str) {
    if let Err(error) = journal
        .append_events(vec![NewEvent::new(kind, json!({})).in_turn("t1")], false)
        .await
    {
        panic!("{error}");
    }
}

fn must<T, E: std::fmt::Display>(result: Result<T, E>) -> T {
    match result {
        Ok(value) => value,
        Err(error) => panic!("{error}"),
    }
}

async fn list_effects(store: &Arc<dyn Store>) -> Vec<corral_store::Effect> {
    must(store.list_effects("s1", None).await)
}

async fn events(store: &Arc<dyn Store>) -> Vec<corral_store::Event> {
    must(store.list_events("s1", 0, 100).await)
}

async fn event_types(store: &Arc<dyn Store>) -> Vec<String> {
    events(store)
        .await
        .into_iter()
        .map(|e| e.event_type)
        .collect()
}
