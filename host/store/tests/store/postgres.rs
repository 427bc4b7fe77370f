//! Tests of the PostgreSQL store alone: migrations shared by replicas, the `corral_` prefix,
//! connection loss, and start-up failures.

use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use corral_store::testing::PgServer;
use corral_store::{
    CheckpointWrite, NewCheckpoint, NewEvent, OpenStoreError, PostgresOptions, PostgresStore,
    SessionCommit, SessionStatus, Store, StoreError,
};
use libtest_mimic::Trial;
use serde_json::json;

use crate::support::{Database, Harness, Proxy, TestFuture, applied, harness_trial, session};

pub fn trials(harness: &Arc<Harness>) -> Vec<Trial> {
    let trial = |name: &str, test: fn(Arc<Harness>) -> TestFuture| {
        harness_trial(harness, &format!("postgres::{name}"), test)
    };
    vec![
        trial("the_server_is_available", |h| {
            Box::pin(the_server_is_available(h))
        }),
        trial("replicas_starting_together_migrate_once", |h| {
            Box::pin(replicas_starting_together_migrate_once(h))
        }),
        trial("every_object_is_prefixed", |h| {
            Box::pin(every_object_is_prefixed(h))
        }),
        trial("a_newer_schema_is_refused", |h| {
            Box::pin(a_newer_schema_is_refused(h))
        }),
        trial("a_failing_migration_leaves_nothing_behind", |h| {
            Box::pin(a_failing_migration_leaves_nothing_behind(h))
        }),
        trial("connection_loss_is_retryable_and_recovers", |h| {
            Box::pin(connection_loss_is_retryable_and_recovers(h))
        }),
        trial("a_durable_step_is_answered_in_two_flushes", |h| {
            Box::pin(a_durable_step_is_answered_in_two_flushes(h))
        }),
        trial("a_failed_statement_in_a_flight_leaves_nothing", |h| {
            Box::pin(a_failed_statement_in_a_flight_leaves_nothing(h))
        }),
        trial("tls_against_a_plain_server_fails_clearly", |h| {
            Box::pin(tls_against_a_plain_server_fails_clearly(h))
        }),
        trial("lock_waits_are_bounded_by_the_lock_timeout", |h| {
            Box::pin(lock_waits_are_bounded_by_the_lock_timeout(h))
        }),
        trial(
            "a_server_crash_loses_nothing_committed_and_shows_nothing_torn",
            |_| Box::pin(a_server_crash_loses_nothing_committed_and_shows_nothing_torn()),
        ),
        trial("an_unreachable_database_is_unavailable", |_| {
            Box::pin(an_unreachable_database_is_unavailable())
        }),
        trial("malformed_settings_are_rejected", |_| {
            Box::pin(malformed_settings_are_rejected())
        }),
    ]
}

/// Fails, saying what is missing, when no server can be had: PostgreSQL tests never skip.
async fn the_server_is_available(harness: Arc<Harness>) -> anyhow::Result<()> {
    let server: &PgServer = harness.postgres()?;
    let (client, connection) = server.admin_config().connect(tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    let version: String = client.query_one("SHOW server_version", &[]).await?.get(0);
    ensure!(!version.is_empty());
    Ok(())
}

async fn replicas_starting_together_migrate_once(harness: Arc<Harness>) -> anyhow::Result<()> {
    let database = harness.database().await?;
    let starts: Vec<_> = (0..4)
        .map(|_| {
            let config = database.config.clone();
            tokio::spawn(async move { PostgresStore::connect(PostgresOptions::new(config)).await })
        })
        .collect();
    let mut stores = Vec::new();
    for start in starts {
        stores.push(start.await?.context("a replica failed to start")?);
    }
    let client = database.client().await?;
    let rows = client
        .query(
            "SELECT version FROM corral_schema_migrations ORDER BY version",
            &[],
        )
        .await?;
    let versions: Vec<i64> = rows.iter().map(|row| row.get(0)).collect();
    ensure!(versions == [1, 2, 3, 4], "applied {versions:?}");
    session(&stores[3], "s1").await?;
    ensure!(
        stores[0].get_session("s1").await?.id == "s1",
        "replicas share the database"
    );
    for store in &stores {
        store.close();
    }
    drop(client);
    database.drop_database().await
}

async fn every_object_is_prefixed(harness: Arc<Harness>) -> anyhow::Result<()> {
    let database = harness.database().await?;
    let store = database.connect().await?;
    let client = database.client().await?;
    let rows = client
        .query(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = 'public'",
            &[],
        )
        .await?;
    let names: Vec<String> = rows.iter().map(|row| row.get(0)).collect();
    ensure!(names.len() > 8, "objects: {names:?}");
    let unprefixed: Vec<&String> = names
        .iter()
        .filter(|name| !name.starts_with("corral_"))
        .collect();
    ensure!(
        unprefixed.is_empty(),
        "objects without the corral_ prefix: {unprefixed:?}"
    );
    store.close();
    drop(client);
    database.drop_database().await
}

async fn a_newer_schema_is_refused(harness: Arc<Harness>) -> anyhow::Result<()> {
    let database = harness.database().await?;
    database.connect().await?.close();
    let client = database.client().await?;
    client
        .execute(
            "INSERT INTO corral_schema_migrations (version, name, applied_at) \
             VALUES (99, 'future', 0)",
            &[],
        )
        .await?;
    let outcome = PostgresStore::connect(PostgresOptions::new(database.config.clone())).await;
    drop(client);
    database.drop_database().await?;
    match outcome {
        Err(OpenStoreError::SchemaTooNew {
            found: 99,
            supported: 4,
        }) => Ok(()),
        Err(other) => bail!("expected SchemaTooNew, got {other:?}"),
        Ok(_) => bail!("started against a newer schema"),
    }
}

async fn a_failing_migration_leaves_nothing_behind(harness: Arc<Harness>) -> anyhow::Result<()> {
    let database = harness.database().await?;
    let client = database.client().await?;
    client
        .batch_execute("CREATE VIEW corral_agents AS SELECT 1 AS agent_id")
        .await?;
    let outcome = PostgresStore::connect(PostgresOptions::new(database.config.clone())).await;
    let left: i64 = client
        .query_one(
            "SELECT COUNT(*) FROM pg_class \
             WHERE relname IN ('corral_sessions', 'corral_schema_migrations')",
            &[],
        )
        .await?
        .get(0);
    drop(client);
    database.drop_database().await?;
    match outcome {
        Err(OpenStoreError::Migration { version: 1, .. }) => {}
        Err(other) => bail!("expected a failed migration, got {other:?}"),
        Ok(_) => bail!("the migration should have failed"),
    }
    ensure!(left == 0, "the failed migration was rolled back entirely");
    Ok(())
}

/// A proxy in front of `database`, and a configuration that connects through it in plain text.
async fn through_proxy(
    database: &Database,
) -> anyhow::Result<(Proxy, corral_store::PostgresConfig)> {
    let host = database
        .config
        .get_hosts()
        .first()
        .and_then(|host| match host {
            tokio_postgres::config::Host::Tcp(name) => Some(name.clone()),
            _ => None,
        })
        .context("the test database must be reachable over TCP")?;
    let port = database.config.get_ports().first().copied().unwrap_or(5432);
    let upstream = tokio::net::lookup_host((host.as_str(), port))
        .await?
        .next()
        .context("resolving the database host")?;
    let proxy = Proxy::start(upstream).await?;
    // A fresh configuration: `host` and `port` append to the existing lists.
    let mut config = corral_store::PostgresConfig::new();
    config
        .host("127.0.0.1")
        .port(proxy.address.port())
        .ssl_mode(tokio_postgres::config::SslMode::Disable)
        .connect_timeout(Duration::from_secs(2));
    if let Some(user) = database.config.get_user() {
        config.user(user);
    }
    if let Some(password) = database.config.get_password() {
        config.password(password);
    }
    if let Some(name) = database.config.get_dbname() {
        config.dbname(name);
    }
    Ok((proxy, config))
}

async fn connection_loss_is_retryable_and_recovers(harness: Arc<Harness>) -> anyhow::Result<()> {
    let database = harness.database().await?;
    let (mut proxy, config) = through_proxy(&database).await?;
    let store = PostgresStore::connect(PostgresOptions::new(config).pool_size(2)).await?;
    session(&store, "s1").await?;

    proxy.cut().await;
    // Every pooled connection is dead and new ones are refused: each call fails as retryable.
    for attempt in 0..3 {
        match store.get_session("s1").await {
            Err(error @ StoreError::Unavailable { .. }) => {
                ensure!(error.is_retryable(), "attempt {attempt}: not retryable");
            }
            other => bail!("attempt {attempt}: expected Unavailable, got {other:?}"),
        }
    }
    match store.ping().await {
        Err(StoreError::Unavailable { .. }) => {}
        other => bail!("ping: expected Unavailable, got {other:?}"),
    }

    proxy.restore().await?;
    let mut recovered = false;
    for _ in 0..50 {
        if store.get_session("s1").await.is_ok() {
            recovered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    ensure!(
        recovered,
        "the store did not recover once the database was back"
    );
    store.ping().await?;
    store.close();
    database.drop_database().await
}

/// A durable step (lock the session and read, then append an event, replace the checkpoint,
/// update the session, `COMMIT` and announce) is two flights, and the server answers each with
/// one flush: the statements of a flight are pipelined with one `Sync` (the vendored driver's
/// `Client::pipeline`), not one `Sync` each, which made the server answer and flush eight times
/// per step. Counted at a proxy, as `ReadyForQuery` messages on the pool's one connection (the
/// change listener's connection answers its own probes of the server's clock).
async fn a_durable_step_is_answered_in_two_flushes(harness: Arc<Harness>) -> anyhow::Result<()> {
    let database = harness.database().await?;
    let (proxy, config) = through_proxy(&database).await?;
    let store = PostgresStore::connect(PostgresOptions::new(config).pool_size(1)).await?;
    session(&store, "s1").await?;
    let mut running = SessionCommit::new("s1");
    running.patch.status = Some(SessionStatus::Running);
    running.patch.active_turn_id = Some(Some("t1".to_owned()));
    applied(store.commit(running).await?)?;
    let fence = store
        .acquire_session("s1", "replica-a", Duration::from_secs(60))
        .await?
        .fence();
    let step = |segment: u64| {
        let mut commit = SessionCommit::new("s1");
        commit.fence = Some(fence.clone());
        commit
            .events
            .push(NewEvent::new("turn.step", json!({"segment": segment})).in_turn("t1"));
        commit.checkpoint = Some(CheckpointWrite::Put(NewCheckpoint::new(
            "t1",
            segment,
            json!({"segment": segment}),
        )));
        commit
    };
    // The first step prepares the statements on the pooled connection.
    applied(store.commit(step(1)).await?)?;
    let before = proxy.answers();
    for segment in 2..12 {
        applied(store.commit(step(segment)).await?)?;
    }
    let after = proxy.answers();
    let answers = after
        .iter()
        .enumerate()
        .map(|(connection, count)| count - before.get(connection).copied().unwrap_or(0))
        .max()
        .unwrap_or(0);
    ensure!(
        answers == 20,
        "10 durable steps made the server answer {answers} times, expected 2 per step"
    );
    let events = store.list_events("s1", 0, 100).await?;
    ensure!(
        events.len() == 11,
        "{} events stored, expected 11",
        events.len()
    );
    store.close();
    database.drop_database().await
}

/// A flight whose statement fails makes the server skip the rest of it, `COMMIT` included: the
/// commit fails, nothing of it is stored, and the connection serves the next transaction.
async fn a_failed_statement_in_a_flight_leaves_nothing(
    harness: Arc<Harness>,
) -> anyhow::Result<()> {
    let database = harness.database().await?;
    let store =
        PostgresStore::connect(PostgresOptions::new(database.config.clone()).pool_size(1)).await?;
    let created = session(&store, "s1").await?;
    let mut commit = SessionCommit::new("s1");
    commit.events.push(NewEvent::new("note", json!({"n": 1})));
    // PostgreSQL's text cannot hold a NUL character: the second insert fails.
    commit
        .events
        .push(NewEvent::new("no\u{0}te", json!({"n": 2})));
    commit.events.push(NewEvent::new("note", json!({"n": 3})));
    match store.commit(commit).await {
        Err(StoreError::Backend { .. }) => {}
        other => bail!("expected the database's refusal, got {other:?}"),
    }
    let after = store.get_session("s1").await?;
    ensure!(
        after.version == created.version && after.last_cursor == created.last_cursor,
        "the failed commit moved the session: {after:?}"
    );
    ensure!(
        store.list_events("s1", 0, 100).await?.is_empty(),
        "the failed commit stored events"
    );
    let mut commit = SessionCommit::new("s1");
    commit.events.push(NewEvent::new("note", json!({"n": 4})));
    applied(store.commit(commit).await?)?;
    let events = store.list_events("s1", 0, 100).await?;
    ensure!(
        events.len() == 1,
        "{} events after the retry, expected 1",
        events.len()
    );
    store.close();
    database.drop_database().await
}

async fn an_unreachable_database_is_unavailable() -> anyhow::Result<()> {
    // A port nobody listens on: bound, then released.
    let address: SocketAddr = {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        listener.local_addr()?
    };
    let options = PostgresOptions::from_url(&format!(
        "postgres://postgres@127.0.0.1:{}/postgres?connect_timeout=2",
        address.port()
    ))?;
    match PostgresStore::connect(options).await {
        Err(OpenStoreError::Unavailable { .. }) => Ok(()),
        Err(other) => bail!("expected Unavailable, got {other:?}"),
        Ok(_) => bail!("connected to nothing"),
    }
}

async fn malformed_settings_are_rejected() -> anyhow::Result<()> {
    match PostgresOptions::from_url("postgres://user@host:notaport/db") {
        Err(OpenStoreError::InvalidSettings { .. }) => {}
        other => bail!("expected InvalidSettings, got {other:?}"),
    }
    let options = PostgresOptions::from_url("postgres://postgres@127.0.0.1/postgres")?.pool_size(0);
    match PostgresStore::connect(options).await {
        Err(OpenStoreError::InvalidSettings { .. }) => Ok(()),
        Err(other) => bail!("expected InvalidSettings, got {other:?}"),
        Ok(_) => bail!("a pool without connections was accepted"),
    }
}

async fn tls_against_a_plain_server_fails_clearly(harness: Arc<Harness>) -> anyhow::Result<()> {
    let database = harness.database().await?;
    // The plain configuration (sslmode unset: prefer) connects without TLS.
    database.connect().await?.close();
    let mut config = database.config.clone();
    config.ssl_mode(tokio_postgres::config::SslMode::Require);
    let outcome = PostgresStore::connect(PostgresOptions::new(config)).await;
    let result = match outcome {
        Ok(_) => bail!("sslmode=require connected to a server without TLS"),
        Err(error) => {
            let text = format!("{error}: {:?}", std::error::Error::source(&error));
            ensure!(
                text.to_lowercase().contains("tls") || text.to_lowercase().contains("ssl"),
                "the error does not say TLS: {text}"
            );
            Ok(())
        }
    };
    database.drop_database().await?;
    result
}

async fn lock_waits_are_bounded_by_the_lock_timeout(harness: Arc<Harness>) -> anyhow::Result<()> {
    let database = harness.database().await?;
    let options = PostgresOptions::new(database.config.clone())
        .timeouts(Duration::from_secs(30), Duration::from_millis(200));
    let store = PostgresStore::connect(options).await?;
    session(&store, "s1").await?;
    let mut blocker = database.client().await?;
    let tx = blocker.transaction().await?;
    tx.execute(
        "SELECT 1 FROM corral_sessions WHERE id = 's1' FOR UPDATE",
        &[],
    )
    .await?;
    let started = std::time::Instant::now();
    let outcome = store
        .append_event(
            "s1",
            None,
            corral_store::NewEvent::new("x", serde_json::json!({})),
        )
        .await;
    ensure!(outcome.is_err(), "the write did not wait for the lock");
    ensure!(
        started.elapsed() < Duration::from_secs(5),
        "the lock wait took {:?}",
        started.elapsed()
    );
    tx.rollback().await?;
    store
        .append_event(
            "s1",
            None,
            corral_store::NewEvent::new("x", serde_json::json!({})),
        )
        .await?;
    store.close();
    database.drop_database().await?;
    Ok(())
}

/// Writers append an event with a checkpoint naming it while the server is killed
/// (`pg_ctl stop -m immediate`) and a raw client is in the middle of a transaction; after crash
/// recovery every acknowledged write is there, cursors have no gap, the live checkpoint names an
/// existing event, and the unfinished transaction left nothing.
async fn a_server_crash_loses_nothing_committed_and_shows_nothing_torn() -> anyhow::Result<()> {
    use corral_store::{CheckpointWrite, CommitOutcome, NewCheckpoint, NewEvent, SessionCommit};
    use serde_json::json;
    // A server of its own: the shared one keeps serving the other tests.
    let server = Arc::new(tokio::task::spawn_blocking(PgServer::start_local).await??);
    let config = server
        .create_database("corral_crash")
        .await
        .map_err(|error| anyhow::anyhow!("{error}"))?;
    let store = PostgresStore::connect(PostgresOptions::new(config.clone())).await?;
    session(&store, "s1").await?;

    let acknowledged = Arc::new(std::sync::Mutex::new(Vec::<u64>::new()));
    let mut writers = Vec::new();
    for writer in 0..4 {
        let store = store.clone();
        let acknowledged = Arc::clone(&acknowledged);
        writers.push(tokio::spawn(async move {
            for step in 0.. {
                let mut commit = SessionCommit::new("s1");
                commit.events.push(NewEvent::new(
                    "step",
                    json!({"writer": writer, "step": step}),
                ));
                commit.checkpoint = Some(CheckpointWrite::Put(NewCheckpoint::new(
                    format!("w{writer}"),
                    0,
                    json!({"writer": writer, "step": step}),
                )));
                match store.commit(commit).await {
                    Ok(CommitOutcome::Applied(receipt)) => acknowledged
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .push(receipt.events[0].cursor),
                    _ => return,
                }
            }
        }));
    }
    // A client in the middle of a transaction when the server dies.
    let (client, connection) = config.connect(tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    client.batch_execute("BEGIN").await?;
    client
        .batch_execute(
            "UPDATE corral_sessions SET last_cursor = last_cursor + 1000 WHERE id = 's1'; \
             INSERT INTO corral_events (session_id, cursor, turn_id, event_type, payload, \
             created_at) VALUES ('s1', 1000000, NULL, 'torn', '{}', 0)",
        )
        .await
        .ok();
    // Crash once the writers have had acknowledgements (on loaded cores the first ones can
    // take far longer than usual), while they are still writing.
    let waiting = std::time::Instant::now();
    while acknowledged.lock().map_or(0, |a| a.len()) < 3
        && waiting.elapsed() < Duration::from_secs(60)
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let crashing = Arc::clone(&server);
    tokio::task::spawn_blocking(move || crashing.crash_and_restart()).await??;
    for writer in writers {
        writer.await?;
    }
    drop(client);
    store.close();

    let store = PostgresStore::connect(PostgresOptions::new(config)).await?;
    let s1 = store.get_session("s1").await?;
    let mut cursors = Vec::new();
    let mut after = 0;
    loop {
        let page = store.list_events("s1", after, 500).await?;
        if page.is_empty() {
            break;
        }
        ensure!(
            page.iter().all(|event| event.event_type == "step"),
            "a torn event is visible"
        );
        cursors.extend(page.iter().map(|event| event.cursor));
        after = page.last().map_or(after, |event| event.cursor);
    }
    ensure!(
        cursors == (1..=s1.last_cursor).collect::<Vec<_>>(),
        "cursors have a gap or do not end at the session's last cursor {}",
        s1.last_cursor
    );
    let acknowledged = acknowledged
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    ensure!(
        !acknowledged.is_empty(),
        "no write was acknowledged before the crash"
    );
    for cursor in &acknowledged {
        ensure!(
            cursors.contains(cursor),
            "acknowledged cursor {cursor} was lost"
        );
    }
    if let Some(checkpoint) = store.live_checkpoint("s1").await? {
        let named = store.list_events("s1", 0, 500).await?;
        let exists =
            cursors.len() > 500 || named.iter().any(|event| event.payload == checkpoint.data);
        ensure!(exists, "the live checkpoint names no committed event");
    }
    store.close();
    Ok(())
}
