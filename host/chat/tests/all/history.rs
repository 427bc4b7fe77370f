//! The conversation a turn reads, through the process's history cache: only what was added
//! since, from the last compaction on, and again in full once retention pruned it.

use std::sync::Arc;
use std::time::Duration;

use corral_chat::{ConversationItem, ConversationStore, HistoryCache, StoreJournal};
use corral_models::Message;
use corral_store::{NewItem, RetentionPolicy, SessionCommit, SessionStatus, Store};
use serde_json::json;

use crate::dir;
use crate::support::*;

fn said(text: &str) -> ConversationItem {
    ConversationItem::Message {
        message: Message::User {
            content: text.to_owned(),
        },
    }
}

fn compaction(summary: &str) -> ConversationItem {
    ConversationItem::Compaction {
        summary: summary.to_owned(),
        kept: Vec::new(),
    }
}

async fn add(store: &Arc<dyn Store>, items: &[ConversationItem]) {
    add_in_turn(store, None, items).await;
}

async fn add_in_turn(store: &Arc<dyn Store>, turn: Option<&str>, items: &[ConversationItem]) {
    let mut commit = SessionCommit::new("s1");
    for item in items {
        let mut new = NewItem::new(must(serde_json::to_value(item)));
        new.turn_id = turn.map(str::to_owned);
        commit.items.push(new);
    }
    must(store.commit(commit).await);
}

async fn set_status(store: &Arc<dyn Store>, status: SessionStatus) {
    let mut commit = SessionCommit::new("s1");
    commit.patch.status = Some(status);
    must(store.commit(commit).await);
}

/// What a turn of `s1` reads, through `cache` when given.
async fn history(
    store: &Arc<dyn Store>,
    cache: Option<&Arc<HistoryCache>>,
) -> Vec<ConversationItem> {
    let mut journal = StoreJournal::new(Arc::clone(store), "s1", "t-read", None, 0);
    if let Some(cache) = cache {
        journal = journal.with_history_cache(Arc::clone(cache));
    }
    must(journal.history().await)
}

fn must<T, E: std::fmt::Display>(result: Result<T, E>) -> T {
    match result {
        Ok(value) => value,
        Err(error) => panic!("{error}"),
    }
}

/// The store's file, opened beside the store to change what it holds behind its back.
fn database(dir: &std::path::Path) -> rusqlite::Connection {
    let db = must(rusqlite::Connection::open(dir.join("chat.db")));
    must(db.busy_timeout(Duration::from_secs(5)));
    db
}

/// Creates session `id` of tenant `acme`.
async fn create(store: &Arc<dyn Store>, id: &str, owner: &str) {
    let new = corral_store::NewSession::new(id, "acme", owner, "a", json!({}));
    must(store.create_session(new).await);
}

/// Rewrites a stored item behind the store's back, so that a read shows whether it read it.
fn rewrite_item(dir: &std::path::Path, seq: u64, item: &ConversationItem) {
    let db = database(dir);
    let body = must(serde_json::to_string(item));
    let changed = must(db.execute(
        "UPDATE corral_items SET body = ?1 WHERE session_id = 's1' AND seq = ?2",
        rusqlite::params![body, seq],
    ));
    assert_eq!(changed, 1);
}

/// A store whose session `s1` holds two items, read once through a new cache.
async fn two_items_read() -> (tempfile::TempDir, Arc<dyn Store>, Arc<HistoryCache>) {
    let dir = dir();
    let store = open_store(dir.path()).await;
    let cache = Arc::new(HistoryCache::new(8));
    add(&store, &[said("one"), said("two")]).await;
    assert_eq!(
        history(&store, Some(&cache)).await,
        [said("one"), said("two")]
    );
    (dir, store, cache)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cached_conversation_reads_only_what_was_added_since() {
    let (dir, store, cache) = two_items_read().await;
    rewrite_item(dir.path(), 2, &said("rewritten"));
    add(&store, &[said("three")]).await;
    // The cache read item 3 alone (and item 1, the oldest it keeps, to check it is still
    // there): item 2 is what it was when first read.
    assert_eq!(
        history(&store, Some(&cache)).await,
        [said("one"), said("two"), said("three")]
    );
    // A journal without the cache reads the whole conversation.
    assert_eq!(
        history(&store, None).await,
        [said("one"), said("rewritten"), said("three")]
    );
    assert_eq!(cache.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_comes_before_the_last_compaction_is_neither_kept_nor_returned() {
    let dir = dir();
    let store = open_store(dir.path()).await;
    let cache = Arc::new(HistoryCache::new(8));
    add(&store, &[said("one"), compaction("first"), said("two")]).await;
    assert_eq!(
        history(&store, Some(&cache)).await,
        [compaction("first"), said("two")]
    );
    add(&store, &[said("three"), compaction("second"), said("four")]).await;
    assert_eq!(
        history(&store, Some(&cache)).await,
        [compaction("second"), said("four")]
    );
    // The compaction it keeps is checked, not the items before it: those may go.
    rewrite_item(dir.path(), 2, &said("rewritten"));
    assert_eq!(
        history(&store, Some(&cache)).await,
        [compaction("second"), said("four")]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_history_pruned_by_retention_is_read_again() {
    let (dir, store, cache) = two_items_read().await;
    // Closed; an item comes later (a closed session's history may still grow, as its last
    // turn ends); retention prunes what is older than a minute; the session is reopened.
    set_status(&store, SessionStatus::Closed).await;
    add(&store, &[said("three")]).await;
    // The session was closed, and its first two items written, two minutes ago.
    let db = database(dir.path());
    let aged = must(db.execute(
        "UPDATE corral_items SET created_at = created_at - 120000 WHERE session_id = 's1' \
         AND seq <= 2",
        [],
    ));
    assert_eq!(aged, 2);
    must(db.execute(
        "UPDATE corral_sessions SET closed_at = closed_at - 120000 WHERE id = 's1'",
        [],
    ));
    let mut policy = RetentionPolicy::default();
    policy.closed_history_ttl = Some(Duration::from_secs(60));
    let report = must(store.apply_retention(&policy).await);
    assert_eq!(report.items_pruned, 2, "{report:?}");
    set_status(&store, SessionStatus::Idle).await;
    add(&store, &[said("four")]).await;
    assert_eq!(
        history(&store, Some(&cache)).await,
        [said("three"), said("four")],
        "what retention pruned is not served from memory"
    );
    assert_eq!(history(&store, None).await, [said("three"), said("four")]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cache_keeps_at_most_its_capacity_of_sessions() {
    let dir = dir();
    let store = open_store(dir.path()).await;
    create(&store, "s2", "alice").await;
    add(&store, &[said("one")]).await;
    let cache = Arc::new(HistoryCache::new(1));
    assert_eq!(history(&store, Some(&cache)).await, [said("one")]);
    let other = StoreJournal::new(Arc::clone(&store), "s2", "t-read", None, 0)
        .with_history_cache(Arc::clone(&cache));
    assert!(must(other.history().await).is_empty());
    assert_eq!(cache.len(), 1, "s1 made room for s2");
    // s1 is read in full again, and right.
    rewrite_item(dir.path(), 1, &said("rewritten"));
    assert_eq!(history(&store, Some(&cache)).await, [said("rewritten")]);
    let none = Arc::new(HistoryCache::new(0));
    assert_eq!(history(&store, Some(&none)).await, [said("rewritten")]);
    assert!(none.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_erased_and_created_again_under_its_id_gets_none_of_the_old_conversation() {
    let (_dir, store, cache) = two_items_read().await;
    must(store.erase_session("s1", true).await);
    create(&store, "s1", "mallory").await;
    // The new session's first item lands where the old one's was, with the same content, in
    // a turn of its own.
    add_in_turn(&store, Some("t-new"), &[said("one")]).await;
    assert_eq!(
        history(&store, Some(&cache)).await,
        [said("one")],
        "the erased conversation is not served from memory"
    );
}

/// Without a cache, a turn's first read takes its journal and the conversation's first page in
/// one transaction ([`Store::open_turn`]); a longer conversation's later pages follow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_journal_without_a_cache_reads_its_turn_and_the_conversation_at_once() {
    let dir = dir();
    let store = open_store(dir.path()).await;
    let short: Vec<ConversationItem> = (0..3).map(|n| said(&n.to_string())).collect();
    add(&store, &short).await;
    let long: Vec<ConversationItem> = (0..corral_store::SHORT_PAGE + 5)
        .map(|n| said(&format!("long {n}")))
        .collect();
    for (items, transactions) in [(short.clone(), 1), ([short, long.clone()].concat(), 2)] {
        if transactions == 2 {
            add(&store, &long).await;
        }
        let before = store.transactions();
        let journal = StoreJournal::new(Arc::clone(&store), "s1", "t-read", None, 0);
        let (read, calls) = must(futures::try_join!(
            journal.history(),
            journal.model_calls_before("t-read")
        ));
        assert_eq!(read, items);
        assert_eq!(calls, 0);
        assert_eq!(
            store.transactions() - before,
            transactions,
            "{} items",
            items.len()
        );
    }
}
