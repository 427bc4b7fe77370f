//! Tests of the embedded store alone: process ownership of the file, crash safety under
//! SIGKILL, migrations and what the file looks like on disk.

use std::io::{BufRead as _, BufReader, Write as _};
use std::path::Path;
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, bail, ensure};
use corral_store::{
    CheckpointWrite, EffectStatus, Entity, MAX_PAGE, NewCheckpoint, NewEvent, NewItem,
    OpenStoreError, SessionCommit, SqliteStore, Store, StoreError,
};
use libtest_mimic::Trial;
use serde_json::json;

use crate::support::{applied, run, session};

const CHILD_MODE: &str = "CORRAL_STORE_TEST_CHILD";
const CHILD_PATH: &str = "CORRAL_STORE_TEST_PATH";

pub fn trials() -> Vec<Trial> {
    let trial = |name: &str, test: fn() -> anyhow::Result<()>| {
        Trial::test(format!("embedded::{name}"), move || {
            test().map_err(|error| format!("{error:?}").into())
        })
    };
    vec![
        trial(
            "a_second_process_is_refused_until_the_owner_dies",
            a_second_process_is_refused_until_the_owner_dies,
        ),
        trial(
            "a_second_open_in_the_same_process_is_refused",
            a_second_open_in_the_same_process_is_refused,
        ),
        trial(
            "sigkilled_writers_never_leave_torn_checkpoints_or_cursor_gaps",
            sigkilled_writers_never_leave_torn_checkpoints_or_cursor_gaps,
        ),
        trial(
            "the_file_is_in_wal_mode_with_prefixed_objects",
            the_file_is_in_wal_mode_with_prefixed_objects,
        ),
        trial("a_newer_schema_is_refused", a_newer_schema_is_refused),
        trial(
            "a_migration_that_breaks_a_foreign_key_is_refused",
            a_migration_that_breaks_a_foreign_key_is_refused,
        ),
        trial(
            "a_version_3_file_keeps_its_effects_and_their_actions",
            a_version_3_file_keeps_its_effects_and_their_actions,
        ),
        trial(
            "a_failing_migration_leaves_nothing_behind",
            a_failing_migration_leaves_nothing_behind,
        ),
        trial(
            "unreadable_rows_are_reported_as_corrupt",
            unreadable_rows_are_reported_as_corrupt,
        ),
        trial(
            "an_unusable_path_is_an_io_error",
            an_unusable_path_is_an_io_error,
        ),
        trial(
            "a_write_waits_for_a_lock_another_program_holds",
            a_write_waits_for_a_lock_another_program_holds,
        ),
        trial(
            "a_short_page_of_items_is_read_on_the_callers_task",
            a_short_page_of_items_is_read_on_the_callers_task,
        ),
    ]
}

/// When this binary runs as a child of these tests, does the child's work and returns its exit
/// code; `None` in a normal test run.
pub fn child_main() -> Option<ExitCode> {
    let mode = std::env::var(CHILD_MODE).ok()?;
    let outcome = match std::env::var(CHILD_PATH) {
        Ok(path) => match mode.as_str() {
            "hold" => hold(Path::new(&path)),
            "write" => write_until_killed(Path::new(&path)),
            other => Err(anyhow::anyhow!("unknown child mode {other}")),
        },
        Err(_) => Err(anyhow::anyhow!("{CHILD_PATH} is not set")),
    };
    Some(match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("child failed: {error:?}");
            ExitCode::FAILURE
        }
    })
}

fn spawn_child(
    mode: &str,
    path: &Path,
) -> anyhow::Result<(Child, BufReader<std::process::ChildStdout>)> {
    let mut child = Command::new(std::env::current_exe()?)
        .env(CHILD_MODE, mode)
        .env(CHILD_PATH, path)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()?;
    let stdout = child.stdout.take().context("child stdout")?;
    Ok((child, BufReader::new(stdout)))
}

/// Child: opens the store, says so, and waits to be killed.
fn hold(path: &Path) -> anyhow::Result<()> {
    let _store = SqliteStore::open(path)?;
    println!("ready");
    std::io::stdout().flush()?;
    std::thread::sleep(Duration::from_secs(120));
    Ok(())
}

/// The checkpoint of step `n`: a blob whose length and content derive from `n`, large enough
/// to span several database pages, so that a torn write would show.
fn checkpoint_data(step: u64) -> serde_json::Value {
    let length = (step as usize * 7919) % 60_000 + 1000;
    let blob: String = std::iter::repeat_n(char::from(b'a' + (step % 26) as u8), length).collect();
    json!({"step": step, "length": length, "blob": blob})
}

fn events_per_step(step: u64) -> u64 {
    1 + step % 3
}

/// Child: appends steps (events + item + checkpoint, one transaction each) and acknowledges
/// each committed step on stdout, until it is killed.
fn write_until_killed(path: &Path) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let store = SqliteStore::open(path)?;
        session(&store, "s1").await?;
        let mut step = match store.live_checkpoint("s1").await? {
            Some(checkpoint) => checkpoint.data["step"].as_u64().context("step")? + 1,
            None => 1,
        };
        let mut stdout = std::io::stdout();
        writeln!(stdout, "ready")?;
        stdout.flush()?;
        loop {
            let mut commit = SessionCommit::new("s1");
            for part in 0..events_per_step(step) {
                commit
                    .events
                    .push(NewEvent::new("step", json!({"step": step, "part": part})));
            }
            commit.items.push(NewItem::new(json!({"step": step})));
            commit.checkpoint = Some(CheckpointWrite::Put(NewCheckpoint::new(
                "t1",
                step,
                checkpoint_data(step),
            )));
            applied(store.commit(commit).await?)?;
            writeln!(stdout, "ack {step}")?;
            stdout.flush()?;
            step += 1;
        }
    })
}

/// A small deterministic generator, seeded from the clock and printed for reproduction.
struct Random(u64);

impl Random {
    fn next(&mut self, bound: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % bound
    }
}

fn a_second_process_is_refused_until_the_owner_dies() -> anyhow::Result<()> {
    let folder = tempfile::tempdir()?;
    let path = folder.path().join("corral.db");
    let (mut child, mut stdout) = spawn_child("hold", &path)?;
    let mut line = String::new();
    stdout.read_line(&mut line)?;
    ensure!(line.trim() == "ready", "child said {line:?}");
    match SqliteStore::open(&path) {
        Err(OpenStoreError::AlreadyInUse {
            path: reported,
            holder_pid,
        }) => {
            ensure!(reported == path, "names the file");
            ensure!(
                holder_pid == Some(child.id()),
                "names the holder: {holder_pid:?}"
            );
            let message = OpenStoreError::AlreadyInUse {
                path: reported,
                holder_pid,
            }
            .to_string();
            ensure!(
                message.contains(&path.display().to_string())
                    && message.contains(&child.id().to_string())
            );
        }
        Err(other) => bail!("expected AlreadyInUse, got {other:?}"),
        Ok(_) => bail!("a second process opened a file another process owns"),
    }
    child.kill()?;
    child.wait()?;
    // The dead owner's lock file is still there; the kernel released its lock.
    ensure!(path.with_extension("db.lock").exists());
    let store = SqliteStore::open(&path).context("reopening after the owner died")?;
    ensure!(store.path() == path);
    Ok(())
}

fn a_second_open_in_the_same_process_is_refused() -> anyhow::Result<()> {
    let folder = tempfile::tempdir()?;
    let path = folder.path().join("corral.db");
    let first = SqliteStore::open(&path)?;
    match SqliteStore::open(&path) {
        Err(OpenStoreError::AlreadyInUse { holder_pid, .. }) => {
            ensure!(holder_pid == Some(std::process::id()));
        }
        other => bail!("expected AlreadyInUse, got {other:?}"),
    }
    drop(first);
    SqliteStore::open(&path).context("reopening after the first handle was dropped")?;
    Ok(())
}

fn sigkilled_writers_never_leave_torn_checkpoints_or_cursor_gaps() -> anyhow::Result<()> {
    const ROUNDS: usize = 25;
    let folder = tempfile::tempdir()?;
    let path = folder.path().join("corral.db");
    let seed = SystemTime::now().duration_since(UNIX_EPOCH)?.as_nanos() as u64 | 1;
    let mut random = Random(seed);
    let mut acknowledged = 0;
    for round in 0..ROUNDS {
        let context = || format!("round {round} (seed {seed})");
        let (mut child, mut stdout) = spawn_child("write", &path)?;
        let mut line = String::new();
        stdout.read_line(&mut line)?;
        ensure!(line.trim() == "ready", "{}: child said {line:?}", context());
        // Kill after a random number of acknowledged steps plus a random delay, so that the
        // kill lands anywhere inside a transaction.
        let target = random.next(30);
        for _ in 0..target {
            line.clear();
            if stdout.read_line(&mut line)? == 0 {
                bail!("{}: the writer exited early", context());
            }
            acknowledged = acknowledged.max(parse_ack(&line)?);
        }
        std::thread::sleep(Duration::from_micros(random.next(3000)));
        child.kill()?;
        child.wait()?;
        for line in stdout.lines() {
            acknowledged = acknowledged.max(parse_ack(&line?)?);
        }
        let reopened = run(verify_after_crash(&path, acknowledged))
            .map_err(|failure| anyhow::anyhow!("{}: {failure:?}", context()));
        reopened?;
    }
    ensure!(acknowledged > 0, "the writers never acknowledged a step");
    Ok(())
}

fn parse_ack(line: &str) -> anyhow::Result<u64> {
    line.trim()
        .strip_prefix("ack ")
        .and_then(|step| step.parse().ok())
        .with_context(|| format!("unexpected writer output {line:?}"))
}

async fn verify_after_crash(path: &Path, acknowledged: u64) -> anyhow::Result<()> {
    let store = Arc::new(SqliteStore::open(path)?);
    let session = store.get_session("s1").await?;
    let mut events = Vec::new();
    let mut after = 0;
    loop {
        let page = store.list_events("s1", after, MAX_PAGE).await?;
        let Some(last) = page.last() else { break };
        after = last.cursor;
        events.extend(page);
    }
    ensure!(
        events.iter().map(|e| e.cursor).eq(1..=session.last_cursor),
        "event cursors have a gap or a duplicate"
    );
    // Steps are whole: every step has all its events, in order.
    let mut expected_step = 1;
    let mut index = 0;
    while index < events.len() {
        let parts = events_per_step(expected_step);
        for part in 0..parts {
            let event = events
                .get(index)
                .with_context(|| format!("step {expected_step} is missing events"))?;
            ensure!(
                event.payload == json!({"step": expected_step, "part": part}),
                "event {} is {:?}, expected step {expected_step} part {part}",
                event.cursor,
                event.payload
            );
            index += 1;
        }
        expected_step += 1;
    }
    let last_step = expected_step - 1;
    let checkpoint = match store.live_checkpoint("s1").await? {
        Some(checkpoint) => checkpoint,
        None if last_step == 0 => return Ok(()),
        None => bail!("events of step {last_step} committed without their checkpoint"),
    };
    ensure!(
        checkpoint.segment == last_step && checkpoint.data == checkpoint_data(last_step),
        "the live checkpoint (segment {}) does not match the last committed step {last_step}",
        checkpoint.segment
    );
    let items = store
        .page_items("s1", last_step.saturating_sub(1), 10)
        .await?;
    ensure!(
        items.items.last().map(|item| item.body.clone()) == Some(json!({"step": last_step})),
        "items and checkpoint disagree"
    );
    ensure!(
        last_step >= acknowledged,
        "step {acknowledged} was acknowledged but only {last_step} survived"
    );
    Ok(())
}

fn raw(path: &Path) -> anyhow::Result<rusqlite::Connection> {
    Ok(rusqlite::Connection::open(path)?)
}

fn the_file_is_in_wal_mode_with_prefixed_objects() -> anyhow::Result<()> {
    let folder = tempfile::tempdir()?;
    let path = folder.path().join("corral.db");
    let store = SqliteStore::open(&path)?;
    drop(store);
    let connection = raw(&path)?;
    let mode: String = connection.query_row("PRAGMA journal_mode", [], |row| row.get(0))?;
    ensure!(mode == "wal", "journal mode {mode}");
    let names: Vec<String> = connection
        .prepare("SELECT name FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'")?
        .query_map([], |row| row.get(0))?
        .collect::<Result<_, _>>()?;
    ensure!(names.len() > 8, "objects: {names:?}");
    let unprefixed: Vec<&String> = names
        .iter()
        .filter(|name| !name.starts_with("corral_"))
        .collect();
    ensure!(
        unprefixed.is_empty(),
        "objects without the corral_ prefix: {unprefixed:?}"
    );
    let versions: Vec<i64> = connection
        .prepare("SELECT version FROM corral_schema_migrations ORDER BY version")?
        .query_map([], |row| row.get(0))?
        .collect::<Result<_, _>>()?;
    ensure!(versions == [1, 2, 3, 4], "applied migrations {versions:?}");
    drop(connection);
    SqliteStore::open(&path).context("reopening applies nothing twice")?;
    Ok(())
}

/// Version 4 rebuilds `corral_effects` (without a rowid), which `corral_actions` refers to:
/// a file written by version 3 keeps every effect and action, and the foreign keys still hold.
/// What an ended turn left invoking becomes uncertain; the active turn's in flight stays so.
fn a_version_3_file_keeps_its_effects_and_their_actions() -> anyhow::Result<()> {
    let folder = tempfile::tempdir()?;
    let path = folder.path().join("corral.db");
    version_3_file(&path, "")?;

    run(async {
        let store = SqliteStore::open(&path)?;
        let effect = store.get_effect("t1:e1").await?;
        ensure!(effect.request == json!({"n": 1}), "{effect:?}");
        let model = store.get_effect("t1:e0").await?;
        ensure!(model.result == Some(json!({"text": "hi"})), "{model:?}");
        let action = store.get_action("t1:e1").await?;
        ensure!(action.capability_id == "crm.update", "{action:?}");
        let active = store.get_effect("t1:e2").await?;
        ensure!(active.status == EffectStatus::Invoking, "{active:?}");
        let ended = store.get_effect("t0:e9").await?;
        ensure!(
            ended.status == EffectStatus::Uncertain && ended.error.is_some(),
            "{ended:?}"
        );
        Ok(())
    })
    .map_err(|failure| anyhow::anyhow!("{failure:?}"))?;
    let connection = raw(&path)?;
    let table: String = connection.query_row(
        "SELECT sql FROM sqlite_master WHERE name = 'corral_effects'",
        [],
        |row| row.get(0),
    )?;
    ensure!(table.ends_with("WITHOUT ROWID"), "{table}");
    // The action still refers to its effect: deleting the effect deletes it.
    connection.execute_batch("PRAGMA foreign_keys = ON")?;
    connection.execute("DELETE FROM corral_effects WHERE effect_id = 't1:e1'", [])?;
    let actions: i64 =
        connection.query_row("SELECT count(*) FROM corral_actions", [], |row| row.get(0))?;
    ensure!(actions == 0, "{actions} actions outlived their effect");
    Ok(())
}

/// A file as version 3 left it: a session, its effects (one pending with its action, one
/// completed, one invoking in the active turn, one invoking in a turn that is over), then `more`.
fn version_3_file(path: &Path, more: &str) -> anyhow::Result<()> {
    let connection = raw(path)?;
    connection.execute_batch(concat!(
        include_str!("../../migrations/sqlite/0001_initial.sql"),
        include_str!("../../migrations/sqlite/0002_agent_access.sql"),
        include_str!("../../migrations/sqlite/0003_effects_by_turn.sql"),
        "CREATE TABLE corral_schema_migrations (version INTEGER NOT NULL PRIMARY KEY, \
         name TEXT NOT NULL, applied_at INTEGER NOT NULL);
         INSERT INTO corral_schema_migrations VALUES (1, '0001_initial.sql', 0), \
         (2, '0002_agent_access.sql', 0), (3, '0003_effects_by_turn.sql', 0);
         INSERT INTO corral_sessions (id, tenant_id, owner_user_id, agent_id, manifest, \
         manifest_hash, implementation_version, creation, status, active_turn_id, state, \
         version, last_cursor, last_item_seq, generation, created_at, updated_at) VALUES \
         ('s1', 'acme', 'u1', 'a1', '{}', 'sha256:m', '1', '{}', 'waiting', 't1', '{}', \
         3, 0, 0, 0, 1, 2);
         INSERT INTO corral_effects (effect_id, session_id, turn_id, kind, status, request, \
         result, error, created_at, updated_at) VALUES \
         ('t1:e1', 's1', 't1', 'capability_call', 'pending', '{\"n\":1}', NULL, NULL, 1, 1), \
         ('t1:e0', 's1', 't1', 'model_call', 'completed', '{}', '{\"text\":\"hi\"}', NULL, 1, 2), \
         ('t1:e2', 's1', 't1', 'capability_call', 'invoking', '{}', NULL, NULL, 1, 1), \
         ('t0:e9', 's1', 't0', 'capability_call', 'invoking', '{}', NULL, NULL, 1, 1);
         INSERT INTO corral_actions (action_id, session_id, turn_id, agent_id, manifest_hash, \
         implementation_version, capability_id, request, status, generation, created_at, \
         updated_at) VALUES ('t1:e1', 's1', 't1', 'a1', 'sha256:m', '1', 'crm.update', \
         '{\"n\":1}', 'pending', 0, 1, 1);"
    ))?;
    connection.execute_batch(more)?;
    Ok(())
}

/// A migration that would leave a row breaking a foreign key (here one the file had already:
/// an action whose effect is gone) is refused, and the file stays as it was.
fn a_migration_that_breaks_a_foreign_key_is_refused() -> anyhow::Result<()> {
    let folder = tempfile::tempdir()?;
    let path = folder.path().join("corral.db");
    version_3_file(
        &path,
        "PRAGMA foreign_keys = OFF; DELETE FROM corral_effects WHERE effect_id = 't1:e1'",
    )?;
    match SqliteStore::open(&path) {
        Err(OpenStoreError::Backend {
            action: "migrate",
            source,
        }) if source.to_string().contains("break a foreign key") => {}
        other => bail!("expected the migration refused, got {other:?}"),
    }
    let version: i64 = raw(&path)?.query_row(
        "SELECT max(version) FROM corral_schema_migrations",
        [],
        |row| row.get(0),
    )?;
    ensure!(version == 3, "the file was left at version {version}");
    Ok(())
}

fn a_newer_schema_is_refused() -> anyhow::Result<()> {
    let folder = tempfile::tempdir()?;
    let path = folder.path().join("corral.db");
    drop(SqliteStore::open(&path)?);
    raw(&path)?.execute(
        "INSERT INTO corral_schema_migrations (version, name, applied_at) VALUES (99, 'future', 0)",
        [],
    )?;
    match SqliteStore::open(&path) {
        Err(OpenStoreError::SchemaTooNew {
            found: 99,
            supported: 4,
        }) => Ok(()),
        other => bail!("expected SchemaTooNew, got {other:?}"),
    }
}

fn a_failing_migration_leaves_nothing_behind() -> anyhow::Result<()> {
    let folder = tempfile::tempdir()?;
    let path = folder.path().join("corral.db");
    raw(&path)?.execute_batch("CREATE VIEW corral_agents AS SELECT 1 AS agent_id")?;
    match SqliteStore::open(&path) {
        Err(OpenStoreError::Migration { version: 1, .. }) => {}
        other => bail!("expected a failed migration, got {other:?}"),
    }
    let connection = raw(&path)?;
    let tables: i64 = connection.query_row(
        "SELECT COUNT(*) FROM sqlite_master \
         WHERE name IN ('corral_sessions', 'corral_schema_migrations')",
        [],
        |row| row.get(0),
    )?;
    ensure!(tables == 0, "the failed migration was rolled back entirely");
    Ok(())
}

fn unreadable_rows_are_reported_as_corrupt() -> anyhow::Result<()> {
    let folder = tempfile::tempdir()?;
    let path = folder.path().join("corral.db");
    run(async {
        let store = SqliteStore::open(&path)?;
        session(&store, "s1").await?;
        Ok(())
    })
    .map_err(|failure| anyhow::anyhow!("{failure:?}"))?;
    raw(&path)?.execute(
        "UPDATE corral_sessions SET state = '{not json' WHERE id = 's1'",
        [],
    )?;
    run(async {
        let store = SqliteStore::open(&path)?;
        match store.get_session("s1").await {
            Err(StoreError::Corrupt {
                entity: Entity::Session,
                id,
                ..
            }) if id == "s1" => Ok(()),
            other => bail!("expected Corrupt, got {other:?}"),
        }
    })
    .map_err(|failure| anyhow::anyhow!("{failure:?}"))
}

/// A transaction runs on its caller's task when the connection is free and SQLite's write lock
/// can be had at once; when another program holds that lock (a backup, `sqlite3` on the file),
/// the write waits for it on the blocking pool, as before, instead of failing.
fn a_write_waits_for_a_lock_another_program_holds() -> anyhow::Result<()> {
    let folder = tempfile::tempdir()?;
    let path = folder.path().join("corral.db");
    run(async {
        let store = SqliteStore::open(&path)?;
        session(&store, "s1").await?;
        let other = raw(&path)?;
        other.execute_batch("BEGIN IMMEDIATE")?;
        let mut commit = SessionCommit::new("s1");
        commit.events = vec![NewEvent::new("waited", json!({}))];
        let mut waiting = store.commit(commit);
        // Its first poll tries the step on this task, finds the lock held and hands the step
        // to the blocking pool: it waits there instead of failing.
        let first = futures::poll!(waiting.as_mut());
        ensure!(first.is_pending(), "the write did not wait: {first:?}");
        other.execute_batch("COMMIT")?;
        let receipt = applied(waiting.await?)?;
        ensure!(
            receipt.events.len() == 1 && receipt.events[0].event_type == "waited",
            "{:?}",
            receipt.events
        );
        // The store's own writes run inline again once the lock is free.
        let mut commit = SessionCommit::new("s1");
        commit.events = vec![NewEvent::new("inline", json!({}))];
        applied(store.commit(commit).await?)?;
        Ok(())
    })
    .map_err(|failure| anyhow::anyhow!("{failure:?}"))
}

/// A page of at most `SHORT_PAGE` items (what a turn reads of its conversation: the items since
/// its previous turn) is read on the caller's task when the connection is free, as a step is; a
/// longer page goes to the blocking pool. Shown with the pool's one thread held: the short page
/// is read regardless, the long one only once the thread is let go.
fn a_short_page_of_items_is_read_on_the_callers_task() -> anyhow::Result<()> {
    let folder = tempfile::tempdir()?;
    let path = folder.path().join("corral.db");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(1)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let store = SqliteStore::open(&path)?;
        session(&store, "s1").await?;
        let mut commit = SessionCommit::new("s1");
        for n in 0..40 {
            commit.items.push(NewItem::new(json!({"n": n})));
        }
        applied(store.commit(commit).await?)?;

        let (held, release) = std::sync::mpsc::channel::<()>();
        let holder = tokio::task::spawn_blocking(move || release.recv());
        let short = tokio::time::timeout(
            Duration::from_secs(30),
            store.page_items("s1", 0, corral_store::SHORT_PAGE),
        )
        .await
        .context("a short page waited for the blocking pool")??;
        ensure!(short.items.len() == corral_store::SHORT_PAGE, "{short:?}");

        let long = store.page_items("s1", 0, corral_store::SHORT_PAGE + 1);
        let mut long = std::pin::pin!(long);
        ensure!(
            tokio::time::timeout(Duration::from_millis(50), long.as_mut())
                .await
                .is_err(),
            "a long page was read without the blocking pool"
        );
        held.send(())?;
        holder.await??;
        let long = long.await?;
        ensure!(long.items.len() == corral_store::SHORT_PAGE + 1, "{long:?}");
        anyhow::Ok(())
    })
}

fn an_unusable_path_is_an_io_error() -> anyhow::Result<()> {
    let folder = tempfile::tempdir()?;
    let file = folder.path().join("a-file");
    std::fs::write(&file, "not a folder")?;
    match SqliteStore::open(file.join("corral.db")) {
        Err(OpenStoreError::Io { .. }) => Ok(()),
        other => bail!("expected an I/O error, got {other:?}"),
    }
}
