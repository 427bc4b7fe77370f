//! The chat runtime's own cost per turn, with the model and the tools taking no time (the
//! scripted model, an instant backend), on the embedded store and on PostgreSQL.
//!
//! - `turn`: a whole turn (model call, one `run_js` of two concurrent calls, model answer),
//!   auto-confirmed, on a fresh session each time; beside it the same script alone in a fresh
//!   sandbox session, so `turn - script` is what the runtime adds (journal, events, prompt).
//! - `replay_100`: a script of 100 awaited calls and then a gated call, under the `calls`
//!   approval policy. `run` is the turn up to its suspension (100 calls against the instant
//!   backend, each journaled); `resume` is the approved resume, which replays the 100 calls from
//!   the journal (each batch re-delivered, fuel checked) and then runs the gated call.
//!
//! Prints one JSON line. `--turns N` (default 200) sets the number of iterations. PostgreSQL is
//! a throwaway server (`corral_store::testing::PgServer`); without one, or with
//! `--embedded-only` (for a profiler), its rows are skipped with a note.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use corral_catalog::{Catalog, Redactor};
use corral_chat::{
    ActionRequest, ApprovalPolicy, ConversationItem, ConversationStore, Input, JournalError,
    Journaled, ModelLimits, Resume, RunResult, SandboxExecutorFactory, StoreJournal,
    SuspensionContext, VecSink,
};
use corral_models::ScriptedModel;
use corral_sandbox::{
    Backend, Invocation, InvocationContext, InvokeCapabilityError, Sandbox, SandboxConfig,
    SessionLimits, SessionOptions, ToolResult,
};
use corral_store::EffectKind;
use corral_store::{NewAgent, NewSession, PostgresOptions, PostgresStore, SqliteStore, Store};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

const TWO_CALLS: &str = "const [a, b] = await Promise.all([tools.t.echo({n: 1}), tools.t.echo({n: 2})]); return [a, b];";
const HUNDRED_THEN_GATED: &str = "let n = 0; for (let i = 0; i < 100; i++) n += (await tools.t.echo({n: i})).n; await tools.t.gated({n}); return n;";

/// Answers at once with its input.
struct Instant0;

#[async_trait]
impl Backend for Instant0 {
    async fn invoke(
        &self,
        _context: &InvocationContext,
        invocation: Invocation,
    ) -> Result<ToolResult, InvokeCapabilityError> {
        Ok(ToolResult::new(invocation.argument().clone()))
    }
}

/// The journal a turn writes through, timed: how long the turn waits on it, so the runtime
/// overhead splits into the journal's part and the runtime's own.
#[derive(Debug)]
struct Timed {
    inner: StoreJournal,
    nanos: AtomicU64,
}

impl Timed {
    async fn time<T>(&self, work: impl std::future::Future<Output = T>) -> T {
        let started = Instant::now();
        let output = work.await;
        let nanos = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        if std::env::var_os("TB_DEBUG").is_some() {
            eprintln!("{} {}", std::any::type_name::<T>(), nanos / 1000);
        }
        self.nanos.fetch_add(nanos, Ordering::Relaxed);
        output
    }
}

#[async_trait]
impl ConversationStore for Timed {
    async fn history(&self) -> Result<Vec<ConversationItem>, JournalError> {
        self.time(self.inner.history()).await
    }
    async fn model_calls_before(&self, turn_id: &str) -> Result<u64, JournalError> {
        self.time(self.inner.model_calls_before(turn_id)).await
    }
    async fn begin(
        &self,
        turn_id: &str,
        effect_id: &str,
        kind: EffectKind,
        request: Value,
        action: Option<ActionRequest>,
    ) -> Result<Journaled, JournalError> {
        self.time(self.inner.begin(turn_id, effect_id, kind, request, action))
            .await
    }
    async fn record(
        &self,
        turn_id: &str,
        effect_id: &str,
        kind: EffectKind,
        request: Value,
        result: Value,
    ) -> Result<Journaled, JournalError> {
        self.time(self.inner.record(turn_id, effect_id, kind, request, result))
            .await
    }
    async fn lookup(&self, effect_id: &str) -> Result<Option<Journaled>, JournalError> {
        self.time(self.inner.lookup(effect_id)).await
    }
    async fn complete(&self, effect_id: &str, result: Value) -> Result<(), JournalError> {
        self.time(self.inner.complete(effect_id, result)).await
    }
    async fn restart(&self, effect_id: &str) -> Result<(), JournalError> {
        self.time(self.inner.restart(effect_id)).await
    }
    async fn completed_with_prefix(
        &self,
        prefix: &str,
    ) -> Result<Vec<(String, Value)>, JournalError> {
        self.time(self.inner.completed_with_prefix(prefix)).await
    }
    async fn save_checkpoint(&self, checkpoint: &SuspensionContext) -> Result<(), JournalError> {
        self.time(self.inner.save_checkpoint(checkpoint)).await
    }
    async fn flush(&self) -> Result<(), JournalError> {
        self.time(self.inner.flush()).await
    }
    async fn publish(&self) -> Result<(), JournalError> {
        self.time(self.inner.publish()).await
    }
}

fn catalog() -> anyhow::Result<Arc<Catalog>> {
    let catalog = json!({"capabilities": [
        {"id": "t.echo", "input_schema": {"type": "object"}},
        {"id": "t.gated", "input_schema": {"type": "object"}, "needs_approval": true}
    ]});
    Ok(Arc::new(Catalog::from_json_str(&catalog.to_string())?))
}

struct Bench {
    sandbox: Sandbox,
    catalog: Arc<Catalog>,
    backend: Arc<dyn Backend>,
}

impl Bench {
    fn input(&self, store: &Arc<dyn Store>, session: &str, code: &str) -> anyhow::Result<Input> {
        let replies = json!([
            {"toolCalls": [{"name": "run_js", "arguments": {"code": code}}]},
            {"text": "done"}
        ]);
        Ok(Input {
            model: Arc::new(ScriptedModel::from_json_str(&replies.to_string())?),
            limits: ModelLimits::default(),
            store: Arc::new(StoreJournal::new(
                Arc::clone(store),
                session,
                format!("{session}:t1"),
                None,
                0,
            )),
            turn_id: format!("{session}:t1"),
            message: "go".into(),
            max_steps: 8,
            sink: Arc::new(VecSink::default()),
            backend: Arc::clone(&self.backend),
            redactor: Arc::new(Redactor::default()),
            capabilities: Arc::clone(&self.catalog),
            action_capabilities: Vec::new(),
            executor_factory: Some(Arc::new(SandboxExecutorFactory::new(
                self.sandbox.clone(),
                SessionLimits::default(),
            ))),
            instructions: "bench".into(),
            direct_tools: false,
            auto_confirm: true,
            approval: ApprovalPolicy::Script,
            user: None,
            context: Default::default(),
            fingerprint: "bench".into(),
            decisions: BTreeMap::new(),
            resume: None,
            trace_context: None,
        })
    }

    /// `HUNDRED_THEN_GATED` under the `calls` policy, asking for approval.
    fn calls_input(&self, store: &Arc<dyn Store>, session: &str) -> anyhow::Result<Input> {
        let mut input = self.input(store, session, HUNDRED_THEN_GATED)?;
        input.auto_confirm = false;
        input.approval = ApprovalPolicy::Calls;
        Ok(input)
    }

    async fn session(&self, store: &Arc<dyn Store>, id: &str) -> anyhow::Result<()> {
        store
            .create_session(NewSession::new(id, "bench", "bench", "bench", json!({})))
            .await?;
        Ok(())
    }

    /// One whole auto-confirmed turn of `TWO_CALLS` on a fresh session: how long it took, how
    /// many store transactions it made and how long it waited on its journal.
    async fn turn(
        &self,
        store: &Arc<dyn Store>,
        id: &str,
    ) -> anyhow::Result<(Duration, u64, Duration)> {
        self.session(store, id).await?;
        let mut input = self.input(store, id, TWO_CALLS)?;
        let timed = Arc::new(Timed {
            inner: StoreJournal::new(Arc::clone(store), id, format!("{id}:t1"), None, 0),
            nanos: AtomicU64::new(0),
        });
        input.store = Arc::clone(&timed) as Arc<dyn ConversationStore>;
        let transactions = store.transactions();
        let started = Instant::now();
        let result = corral_chat::run(&CancellationToken::new(), input).await?;
        let took = started.elapsed();
        let transactions = store.transactions() - transactions;
        anyhow::ensure!(
            matches!(result, RunResult::Completed { .. }),
            "the turn did not complete: {result:?}"
        );
        let waited = Duration::from_nanos(timed.nanos.load(Ordering::Relaxed));
        Ok((took, transactions, waited))
    }

    /// The turn up to its suspension, then the approved resume that replays the 100 calls.
    async fn replay(
        &self,
        store: &Arc<dyn Store>,
        id: &str,
    ) -> anyhow::Result<(Duration, Duration)> {
        self.session(store, id).await?;
        let input = self.calls_input(store, id)?;
        let started = Instant::now();
        let result = corral_chat::run(&CancellationToken::new(), input).await?;
        let run = started.elapsed();
        let RunResult::Suspended { suspension } = result else {
            anyhow::bail!("the turn did not suspend at the gated call: {result:?}");
        };
        let mut input = self.calls_input(store, id)?;
        input.resume = Some(Resume {
            suspension,
            approved: true,
            reason: None,
        });
        let started = Instant::now();
        let result = corral_chat::run(&CancellationToken::new(), input).await?;
        let resume = started.elapsed();
        anyhow::ensure!(
            matches!(result, RunResult::Completed { .. }),
            "the resumed turn did not complete: {result:?}"
        );
        Ok((run, resume))
    }

    /// The same script alone: a fresh sandbox session, the run, the close.
    async fn script_alone(&self) -> anyhow::Result<Duration> {
        let started = Instant::now();
        let mut session = self
            .sandbox
            .session(SessionOptions::new(
                Arc::clone(&self.catalog),
                Arc::clone(&self.backend),
            ))
            .await?;
        let report = session.run(TWO_CALLS).await;
        session.close();
        anyhow::ensure!(report.outcome.is_ok(), "{:?}", report.outcome);
        Ok(started.elapsed())
    }
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let index = ((sorted.len() - 1) as f64 * p).round() as usize;
    (sorted[index].as_secs_f64() * 1e6 * 10.0).round() / 10.0
}

fn summary(mut samples: Vec<Duration>) -> Value {
    samples.sort();
    json!({"p50_us": percentile(&samples, 0.5), "p99_us": percentile(&samples, 0.99), "n": samples.len()})
}

async fn measure(
    bench: &Bench,
    store: Arc<dyn Store>,
    name: &str,
    turns: usize,
) -> anyhow::Result<Value> {
    store
        .put_agent(NewAgent::new(
            "bench",
            json!({"id": "bench"}),
            "sha256:bench",
            "1",
        ))
        .await?;
    // Warm-up: the first turns compile the guest's code paths and fill caches.
    for i in 0..5 {
        bench.turn(&store, &format!("warm{i}")).await?;
        bench.replay(&store, &format!("warm-replay{i}")).await?;
    }
    let mut turns_taken = Vec::new();
    let mut store_waits = Vec::new();
    let mut operations = 0;
    let mut scripts = Vec::new();
    for i in 0..turns {
        let (took, ops, waited) = bench.turn(&store, &format!("turn{i}")).await?;
        turns_taken.push(took);
        store_waits.push(waited);
        operations = ops;
        scripts.push(bench.script_alone().await?);
    }
    let mut runs = Vec::new();
    let mut resumes = Vec::new();
    for i in 0..turns.div_ceil(4) {
        let (run, resume) = bench.replay(&store, &format!("replay{i}")).await?;
        runs.push(run);
        resumes.push(resume);
    }
    let turn = summary(turns_taken);
    let store_wait = summary(store_waits);
    let script = summary(scripts);
    let run = summary(runs);
    let resume = summary(resumes);
    let overhead =
        turn["p50_us"].as_f64().unwrap_or(0.0) - script["p50_us"].as_f64().unwrap_or(0.0);
    let ratio =
        resume["p50_us"].as_f64().unwrap_or(0.0) / run["p50_us"].as_f64().unwrap_or(1.0).max(1.0);
    Ok(json!({
        "store": name,
        "turn": turn,
        "script_alone": script,
        "runtime_overhead_p50_us": (overhead * 10.0).round() / 10.0,
        "store_transactions_per_turn": operations,
        "journal_wait_per_turn": store_wait,
        "replay_100": {"run": run, "resume": resume, "resume_over_run": (ratio * 100.0).round() / 100.0},
    }))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let mut turns = 200;
    let mut embedded_only = false;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--turns" => turns = args.next().unwrap_or_default().parse()?,
            "--embedded-only" => embedded_only = true,
            other => anyhow::bail!("unknown argument {other} (want --turns N, --embedded-only)"),
        }
    }
    let bench = Bench {
        sandbox: Sandbox::new(SandboxConfig::default())?,
        catalog: catalog()?,
        backend: Arc::new(Instant0),
    };
    let folder = tempfile::tempdir()?;
    let mut results = Vec::new();
    let embedded: Arc<dyn Store> = Arc::new(SqliteStore::open(folder.path().join("bench.db"))?);
    results.push(measure(&bench, embedded, "embedded", turns).await?);
    let mut notes = Vec::new();
    let server = if embedded_only {
        Err(anyhow::anyhow!("not asked (--embedded-only)"))
    } else {
        corral_store::testing::PgServer::start().map_err(anyhow::Error::from)
    };
    match server {
        Ok(server) => {
            let database = format!("corral_turn_bench_{}", std::process::id());
            let config = server
                .create_database(&database)
                .await
                .map_err(|e| anyhow::anyhow!("creating the benchmark database: {e}"))?;
            let store: Arc<dyn Store> =
                Arc::new(PostgresStore::connect(PostgresOptions::new(config)).await?);
            results.push(measure(&bench, store, "PostgreSQL", turns).await?);
            let _ = server.drop_database(&database).await;
        }
        Err(error) => notes.push(format!("PostgreSQL skipped: {error}")),
    }
    println!("{}", json!({"results": results, "notes": notes}));
    Ok(())
}
