//! Cost of a durable step: append one event and rewrite the live checkpoint in one transaction,
//! under the session's lease (the write the chat runtime makes at every step of a turn).
//!
//! Measures, for the embedded store (both `synchronous` settings) and PostgreSQL on loopback
//! (started like the tests start it, or `DATABASE_URL`): p50/p99 latency of one step, events per
//! second for one session stepping sequentially, and for 16 sessions stepping concurrently.
//! Prints a Markdown table and one JSON line.
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
}

fn settings() -> anyhow::Result<Settings> {
    let mut settings = Settings {
        steps: 5000,
        seconds: 5.0,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let value = args
            .next()
            .with_context(|| format!("{arg} needs a value"))?;
        match arg.as_str() {
            "--steps" => settings.steps = value.parse()?,
            "--seconds" => settings.seconds = value.parse()?,
            other => bail!("unknown argument {other}; expected --steps N or --seconds S"),
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

/// A store on a fresh database; with `flush_wal` false, commits return before the WAL reaches
/// the disk (`synchronous_commit=off`), which is not durable and only serves to tell the store's
/// own cost from the disk's.
async fn postgres(server: &PgServer, flush_wal: bool) -> anyhow::Result<Arc<dyn Store>> {
    let database = format!("corral_bench_{}_{flush_wal}", std::process::id());
    let mut config = server
        .create_database(&database)
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
    for (name, synchronous) in [
        (
            "embedded (synchronous=NORMAL, default)",
            Synchronous::Normal,
        ),
        ("embedded (synchronous=FULL)", Synchronous::Full),
    ] {
        let path = folder.path().join(format!("{synchronous:?}.db"));
        let store =
            SqliteStore::open_with(path, SqliteOptions::default().synchronous(synchronous))?;
        figures.push(measure(name, Arc::new(store), &settings).await?);
    }
    let server = PgServer::start()?;
    let store = postgres(&server, true).await?;
    figures.push(measure("PostgreSQL 15, loopback", store, &settings).await?);
    let store = postgres(&server, false).await?;
    figures.push(
        measure(
            "PostgreSQL, synchronous_commit=off (diagnostic, not durable)",
            store,
            &settings,
        )
        .await?,
    );
    drop(server);

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
        json!({"benchmark": "durable_step", "steps": settings.steps, "results": json})
    );
    Ok(())
}
