//! Cost of a durable step: append one event and rewrite the live checkpoint in one transaction,
//! under the session's lease (the write the chat runtime makes at every step of a turn).
//!
//! Measures, for the embedded store (both `synchronous` settings) and PostgreSQL on loopback
//! (started like the tests start it, or `DATABASE_URL`): p50/p99 latency of one step, events per
//! second for one session stepping sequentially, and for 16 sessions stepping concurrently.
//! Beside PostgreSQL it runs a peer: `pgbench` (C, libpq) sending the same transaction's SQL
//! from 16 clients to the same database, so the store's own cost reads as a ratio that holds
//! whatever the machine's speed that day. Prints a Markdown table and one JSON line.
//!
//! ```text
//! cargo run --release -p corral-store --example durable_step_bench -- [--steps N] [--seconds S]
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use corral_store::testing::PgServer;
use corral_store::{
    CheckpointWrite, CommitOutcome, Fence, NewAgent, NewCheckpoint, NewEvent, NewSession,
    PostgresOptions, PostgresStore, SessionCommit, SessionStatus, SqliteOptions, SqliteStore,
    Store, Synchronous,
};
use serde_json::{Value, json};

const SESSIONS: usize = 16;
const LEASE: Duration = Duration::from_secs(600);

struct Settings {
    steps: usize,
    seconds: f64,
    /// `embedded` or `postgres`: measure that store only.
    only: Option<String>,
}

fn settings() -> anyhow::Result<Settings> {
    let mut settings = Settings {
        steps: 5000,
        seconds: 5.0,
        only: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let value = args
            .next()
            .with_context(|| format!("{arg} needs a value"))?;
        match arg.as_str() {
            "--steps" => settings.steps = value.parse()?,
            "--seconds" => settings.seconds = value.parse()?,
            "--only" if value == "embedded" || value == "postgres" => settings.only = Some(value),
            other => bail!(
                "unknown argument {other} {value}; expected --steps N, --seconds S or \
                 --only embedded|postgres"
            ),
        }
    }
    Ok(settings)
}

/// A checkpoint of about 1 KiB, the size of a small suspended turn.
fn checkpoint(step: u64) -> Value {
    json!({
        "step": step,
        "plan": {"calls": [{"invocationId": format!("call-{step}"), "status": "pending"}]},
        "state": "x".repeat(900),
    })
}

async fn prepare(store: &dyn Store, session_id: &str) -> anyhow::Result<Fence> {
    store
        .put_agent(NewAgent::new(
            "bench",
            json!({"id": "bench"}),
            "sha256:bench",
            "1",
        ))
        .await?;
    store
        .create_session(NewSession::new(
            session_id,
            "bench",
            "user",
            "bench",
            json!({}),
        ))
        .await?;
    let mut commit = SessionCommit::new(session_id);
    commit.patch.status = Some(SessionStatus::Running);
    commit.patch.active_turn_id = Some(Some("t1".to_owned()));
    store.commit(commit).await?;
    Ok(store
        .acquire_session(session_id, "bench-replica", LEASE)
        .await?
        .fence())
}

async fn step(store: &dyn Store, fence: &Fence, step: u64) -> anyhow::Result<()> {
    let mut commit = SessionCommit::new(fence.session_id.clone());
    commit.fence = Some(fence.clone());
    commit.events.push(
        NewEvent::new("turn.step", json!({"step": step, "text": "a model delta"})).in_turn("t1"),
    );
    commit.checkpoint = Some(CheckpointWrite::Put(NewCheckpoint::new(
        "t1",
        step,
        checkpoint(step),
    )));
    match store.commit(commit).await? {
        CommitOutcome::Applied(_) => Ok(()),
        other => bail!("unexpected outcome {other:?}"),
    }
}

struct Figures {
    backend: String,
    p50_us: f64,
    p99_us: f64,
    one_session_events_per_s: f64,
    sixteen_sessions_events_per_s: f64,
}

async fn measure(
    name: &str,
    store: Arc<dyn Store>,
    settings: &Settings,
) -> anyhow::Result<Figures> {
    let fence = prepare(&*store, "latency").await?;
    for warm in 0..200 {
        step(&*store, &fence, warm).await?;
    }
    let mut latencies = Vec::with_capacity(settings.steps);
    let started = Instant::now();
    for n in 0..settings.steps {
        let begun = Instant::now();
        step(&*store, &fence, 1000 + n as u64).await?;
        latencies.push(begun.elapsed());
    }
    let sequential = started.elapsed();
    latencies.sort_unstable();
    let percentile = |p: f64| {
        let index = ((latencies.len() as f64 - 1.0) * p).round() as usize;
        latencies[index].as_secs_f64() * 1e6
    };

    let mut fences = Vec::new();
    for session in 0..SESSIONS {
        fences.push(prepare(&*store, &format!("concurrent-{session}")).await?);
    }
    let deadline = Instant::now() + Duration::from_secs_f64(settings.seconds);
    let begun = Instant::now();
    let workers: Vec<_> = fences
        .into_iter()
        .map(|fence| {
            let store = Arc::clone(&store);
            tokio::spawn(async move {
                let mut steps = 0u64;
                while Instant::now() < deadline {
                    step(&*store, &fence, steps).await?;
                    steps += 1;
                }
                anyhow::Ok(steps)
            })
        })
        .collect();
    let mut total = 0;
    for worker in workers {
        total += worker.await??;
    }
    let concurrent = begun.elapsed();
    Ok(Figures {
        backend: name.to_owned(),
        p50_us: percentile(0.50),
        p99_us: percentile(0.99),
        one_session_events_per_s: settings.steps as f64 / sequential.as_secs_f64(),
        sixteen_sessions_events_per_s: total as f64 / concurrent.as_secs_f64(),
    })
}

/// What `pgbench` reached with the store's SQL.
struct Peer {
    program: String,
    events_per_s: f64,
}

/// One durable step as the store sends it, for `pgbench`: `BEGIN` and the locking read (every
/// column, and the server clock), then the event, the checkpoint supersede and upsert, the session
/// row, `COMMIT` and the change notification, pipelined in one flight. Only the checks the store
/// makes on the row it read (the fence, the status) are left out.
fn pgbench_script() -> String {
    let session = "'pgbench-' || :client_id";
    let event = json!({"step": 0, "text": "a model delta"});
    let data = checkpoint(0);
    format!(
        "BEGIN;\n\
         SELECT id, tenant_id, owner_user_id, agent_id, manifest, manifest_hash, \
         implementation_version, creation, status, active_turn_id, state, version, last_cursor, \
         last_item_seq, owner_replica, lease_expires_at, generation, created_at, updated_at, \
         closed_at, (extract(epoch from clock_timestamp()) * 1000)::bigint AS now, \
         last_cursor + 1 AS next FROM corral_sessions WHERE id = {session} FOR UPDATE \\gset\n\
         \\startpipeline\n\
         INSERT INTO corral_events (session_id, cursor, turn_id, event_type, payload, created_at) \
         VALUES ({session}, :next, 't1', 'turn.step', '{event}', :now);\n\
         UPDATE corral_checkpoints SET superseded_at = :now WHERE session_id = {session} \
         AND superseded_at IS NULL AND NOT (turn_id = 't1' AND segment = :next);\n\
         INSERT INTO corral_checkpoints (session_id, turn_id, segment, data, created_at, \
         updated_at, superseded_at) VALUES ({session}, 't1', :next, '{data}', :now, :now, NULL) \
         ON CONFLICT (session_id, turn_id, segment) DO UPDATE SET data = excluded.data, \
         updated_at = excluded.updated_at, superseded_at = NULL;\n\
         UPDATE corral_sessions SET status = :status, active_turn_id = :active_turn_id, \
         state = :state, version = version + 1, last_cursor = :next, \
         last_item_seq = :last_item_seq, owner_replica = :owner_replica, \
         lease_expires_at = :lease_expires_at, generation = :generation, updated_at = :now, \
         closed_at = NULL WHERE id = {session};\n\
         COMMIT;\n\
         SELECT set_config('synchronous_commit', 'off', true), pg_notify('corral_events', \
         '{{\"o\":\"pgbench\",\"e\":[[\"pgbench-' || :client_id || '\",' || :next || ',' \
         || :next || ']]}}');\n\
         \\endpipeline\n"
    )
}

/// Runs [`pgbench_script`] from [`SESSIONS`] clients on `database` for `seconds`, while `store`
/// (whose change listener hears the peer's notifications) stays open. `None` when the server's
/// binaries come without `pgbench`.
async fn pgbench_peer(
    server: &PgServer,
    database: &str,
    store: &dyn Store,
    seconds: f64,
) -> anyhow::Result<Option<Peer>> {
    let Some(pgbench) = server.client_program("pgbench") else {
        eprintln!("durable_step_bench: no pgbench beside the PostgreSQL binaries; no peer");
        return Ok(None);
    };
    for client in 0..SESSIONS {
        prepare(store, &format!("pgbench-{client}")).await?;
    }
    let folder = tempfile::tempdir()?;
    let script = folder.path().join("step.sql");
    std::fs::write(&script, pgbench_script())?;
    let config = server.config(database);
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(host)) => host.clone(),
        Some(tokio_postgres::config::Host::Unix(path)) => path.display().to_string(),
        None => "localhost".to_owned(),
    };
    let port = config
        .get_ports()
        .first()
        .copied()
        .unwrap_or(5432)
        .to_string();
    let user = config.get_user().unwrap_or("postgres").to_owned();
    let password = config
        .get_password()
        .map(|password| String::from_utf8_lossy(password).into_owned());
    let clients = SESSIONS.to_string();
    let duration = (seconds.ceil() as u64).max(1).to_string();
    let database = database.to_owned();
    let (version, run) = tokio::task::spawn_blocking(move || {
        let version = std::process::Command::new(&pgbench)
            .arg("--version")
            .output();
        let mut command = std::process::Command::new(&pgbench);
        if let Some(password) = &password {
            command.env("PGPASSWORD", password);
        }
        let run = command
            .args([
                "-h", &host, "-p", &port, "-U", &user, "-n", "-M", "prepared",
            ])
            .args(["-c", &clients, "-j", "2", "-T", &duration, "-f"])
            .arg(&script)
            .arg(&database)
            .output();
        (version, run)
    })
    .await?;
    let run = run.context("running pgbench")?;
    let out = String::from_utf8_lossy(&run.stdout);
    if !run.status.success() {
        bail!(
            "pgbench failed: {}{out}",
            String::from_utf8_lossy(&run.stderr)
        );
    }
    let tps = out
        .lines()
        .find_map(|line| line.strip_prefix("tps = "))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|tps| tps.parse::<f64>().ok())
        .with_context(|| format!("no tps line in pgbench's output: {out}"))?;
    let program = version
        .ok()
        .map(|version| String::from_utf8_lossy(&version.stdout).trim().to_owned())
        .unwrap_or_else(|| "pgbench".to_owned());
    Ok(Some(Peer {
        program,
        events_per_s: tps,
    }))
}

/// A store on a fresh database; with `flush_wal` false, commits return before the WAL reaches
/// the disk (`synchronous_commit=off`), which is not durable and only serves to tell the store's
/// own cost from the disk's.
async fn postgres(
    server: &PgServer,
    database: &str,
    flush_wal: bool,
) -> anyhow::Result<Arc<dyn Store>> {
    let mut config = server
        .create_database(database)
        .await
        .map_err(|error| anyhow::anyhow!("creating the benchmark database: {error}"))?;
    if !flush_wal {
        config.options("-c synchronous_commit=off");
    }
    let store = PostgresStore::connect(PostgresOptions::new(config).pool_size(SESSIONS)).await?;
    Ok(Arc::new(store))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let settings = settings()?;
    let folder = tempfile::tempdir()?;
    let mut figures = Vec::new();
    let mut peer = None;
    let wanted = |store: &str| settings.only.as_deref().is_none_or(|only| only == store);
    for (name, synchronous) in [
        (
            "embedded (synchronous=NORMAL, default)",
            Synchronous::Normal,
        ),
        ("embedded (synchronous=FULL)", Synchronous::Full),
    ] {
        if !wanted("embedded") {
            break;
        }
        let path = folder.path().join(format!("{synchronous:?}.db"));
        let store =
            SqliteStore::open_with(path, SqliteOptions::default().synchronous(synchronous))?;
        figures.push(measure(name, Arc::new(store), &settings).await?);
    }
    if wanted("postgres") {
        let server = PgServer::start()?;
        let database = format!("corral_bench_{}", std::process::id());
        let store = postgres(&server, &database, true).await?;
        figures.push(measure("PostgreSQL 15, loopback", Arc::clone(&store), &settings).await?);
        peer = pgbench_peer(&server, &database, &*store, settings.seconds).await?;
        drop(store);
        let database = format!("corral_bench_{}_async", std::process::id());
        let store = postgres(&server, &database, false).await?;
        figures.push(
            measure(
                "PostgreSQL, synchronous_commit=off (diagnostic, not durable)",
                store,
                &settings,
            )
            .await?,
        );
        drop(server);
    }

    println!(
        "Durable step = one event appended + the live checkpoint (~1 KiB) rewritten, in one fenced \
         transaction. {} sequential steps for latency; {SESSIONS} sessions for {:.0} s for \
         concurrency.\n",
        settings.steps, settings.seconds
    );
    println!("| store | p50 | p99 | events/s, 1 session | events/s, {SESSIONS} sessions |");
    println!("|---|---|---|---|---|");
    for f in &figures {
        println!(
            "| {} | {:.0} us | {:.0} us | {:.0} | {:.0} |",
            f.backend,
            f.p50_us,
            f.p99_us,
            f.one_session_events_per_s,
            f.sixteen_sessions_events_per_s
        );
    }
    if let Some(peer) = &peer {
        println!(
            "| {} with the same SQL (peer) | – | – | – | {:.0} |",
            peer.program, peer.events_per_s
        );
    }
    let json: Vec<Value> = figures
        .iter()
        .map(|f| {
            json!({
                "backend": f.backend,
                "p50_us": f.p50_us.round(),
                "p99_us": f.p99_us.round(),
                "events_per_s_1_session": f.one_session_events_per_s.round(),
                "events_per_s_16_sessions": f.sixteen_sessions_events_per_s.round(),
            })
        })
        .collect();
    println!(
        "\n{}",
        json!({
            "benchmark": "durable_step",
            "steps": settings.steps,
            "results": json,
            "peer": peer.as_ref().map(|peer| json!({
                "program": peer.program,
                "events_per_s_16_sessions": peer.events_per_s.round(),
            })),
        })
    );
    Ok(())
}
