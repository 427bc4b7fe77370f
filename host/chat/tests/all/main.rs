//! The chat runtime end to end: a scripted model, the real sandbox, the embedded store (and
//! PostgreSQL), and a backend that counts what it runs.

mod history;
mod journal;
mod model_context;
mod results_fit;
mod support;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use corral_chat::{ApprovalPolicy, Resume, RunError, RunEventKind, RunResult, run};
use corral_models::Message;
use serde_json::json;
use support::*;
use tokio_util::sync::CancellationToken;

fn dir() -> tempfile::TempDir {
    match tempfile::tempdir() {
        Ok(dir) => dir,
        Err(error) => panic!("{error}"),
    }
}

async fn run_ok(input: corral_chat::Input) -> RunResult {
    match run(&CancellationToken::new(), input).await {
        Ok(result) => result,
        Err(error) => panic!("the run failed: {error}"),
    }
}

fn last_tool_message(requests: &[corral_models::ModelRequest]) -> (String, bool) {
    let last = requests.last().expect("a request");
    for message in last.messages.iter().rev() {
        if let Message::Tool {
            content, is_error, ..
        } = message
        {
            return (content.clone(), *is_error);
        }
    }
    panic!("no tool message in the last request")
}

fn count_events(events: &[corral_chat::RunEvent], name: &str) -> usize {
    events.iter().filter(|e| e.kind.type_name() == name).count()
}

const TWO_SLEEPS: &str = "const [a, b] = await Promise.all([tools.t.sleep({ms: 150}), tools.t.sleep({ms: 150})]);\nreturn a.slept + b.slept;";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_runs_two_calls_concurrently_in_one_script() {
    let dir = dir();
    let store = open_store(dir.path()).await;
    let parts = Parts::new(json!([js(TWO_SLEEPS), {"text": "slept 300 in all"}]));
    let mut input = parts.input(&store, "turn-1", "sleep twice");
    input.auto_confirm = true;
    let RunResult::Completed {
        text, steps, items, ..
    } = run_ok(input).await
    else {
        panic!("not completed")
    };
    assert_eq!(text, "slept 300 in all");
    assert_eq!(steps, 2);
    assert_eq!(
        parts.backend.peak_in_flight.load(Ordering::SeqCst),
        2,
        "both calls were in flight at once"
    );
    let (content, is_error) = last_tool_message(&parts.model.requests());
    assert!(!is_error, "{content}");
    assert!(content.contains("\"value\":300"), "{content}");
    // user, assistant(run_js), tool result, assistant(final)
    assert_eq!(items.len(), 4);
    let events = parts.sink.events();
    let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
    assert!(
        seqs.windows(2).all(|w| w[1] == w[0] + 1),
        "events are numbered in order"
    );
    assert_eq!(count_events(&events, "tool.started"), 1);
    assert_eq!(count_events(&events, "tool.finished"), 1);
    // Auto-confirmed approvals are journaled and announced like a person's.
    assert_eq!(count_events(&events, "permission.requested"), 1);
    assert!(events.iter().any(|e| matches!(
        &e.kind,
        RunEventKind::PermissionResolved {
            approved: true,
            auto: true,
            ..
        }
    )));
    assert!(
        count_events(&events, "text.delta") > 0,
        "text streamed as deltas"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_suspended_turn_resumes_in_a_new_runtime_without_running_anything_twice() {
    let dir = dir();
    let code = "return await tools.t.echo({n: 1});";
    let replies = json!([js(code), {"text": "echoed"}]);
    let suspension = {
        let store = open_store(dir.path()).await;
        let parts = Parts::new(replies.clone());
        let RunResult::Suspended { suspension } =
            run_ok(parts.input(&store, "turn-1", "echo")).await
        else {
            panic!("not suspended")
        };
        assert_eq!(suspension.pending.len(), 1);
        let pending = &suspension.pending[0];
        assert_eq!(pending.tool_name, "run_js");
        assert_eq!(pending.arguments, json!({"code": code}));
        assert_eq!(
            pending.arguments_sha256,
            corral_chat::sha256_json(&json!({"code": code}))
        );
        // The gate runs before the executor exists.
        assert_eq!(parts.factory.created.load(Ordering::SeqCst), 0);
        assert_eq!(parts.backend.total(), 0);
        // The checkpoint is durable, and it was written before the permission event.
        let live = store
            .live_checkpoint("s1")
            .await
            .expect("store")
            .expect("a live checkpoint");
        assert_eq!(live.data, serde_json::to_value(&suspension).expect("json"));
        let events = parts.sink.events();
        assert_eq!(count_events(&events, "permission.requested"), 1);
        suspension
    };
    // A new runtime instance: another store handle, model, backend and sink.
    let store = open_store(dir.path()).await;
    let parts = Parts::new(replies);
    let mut input = parts.input(&store, "turn-1", "echo");
    input.resume = Some(Resume {
        suspension: suspension.clone(),
        approved: true,
        reason: None,
    });
    let RunResult::Completed { text, .. } = run_ok(input).await else {
        panic!("not completed")
    };
    assert_eq!(text, "echoed");
    assert_eq!(parts.backend.count("t.echo"), 1);
    assert_eq!(
        parts.model.requests().len(),
        1,
        "the first model call came from the journal"
    );
    let events = parts.sink.events();
    assert_eq!(
        count_events(&events, "tool.started"),
        0,
        "the tool start was announced before the suspension"
    );
    assert_eq!(count_events(&events, "permission.requested"), 0);
    assert_eq!(count_events(&events, "permission.resolved"), 1);
    assert_eq!(count_events(&events, "tool.finished"), 1);

    // Resuming the same checkpoint again runs nothing again.
    let again = Parts::new(json!([]));
    let mut input = again.input(&store, "turn-1", "echo");
    input.resume = Some(Resume {
        suspension,
        approved: true,
        reason: None,
    });
    let RunResult::Completed { text, .. } = run_ok(input).await else {
        panic!("not completed")
    };
    assert_eq!(text, "echoed");
    assert_eq!(again.backend.total(), 0);
    assert_eq!(again.model.requests().len(), 0);
    assert!(again.sink.events().is_empty(), "nothing is announced twice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejection_reaches_the_model_with_its_reason() {
    let dir = dir();
    let store = open_store(dir.path()).await;
    let parts = Parts::new(json!([js("return await tools.t.echo({});"), {"text": "ok, I won't"}]));
    let RunResult::Suspended { suspension } = run_ok(parts.input(&store, "turn-1", "go")).await
    else {
        panic!("not suspended")
    };
    let mut input = parts.input(&store, "turn-1", "go");
    input.resume = Some(Resume {
        suspension,
        approved: false,
        reason: Some("not on a Friday".into()),
    });
    let RunResult::Completed { text, .. } = run_ok(input).await else {
        panic!("not completed")
    };
    assert_eq!(text, "ok, I won't");
    let (content, is_error) = last_tool_message(&parts.model.requests());
    assert!(is_error);
    assert!(content.contains("not on a Friday"), "{content}");
    assert_eq!(parts.backend.total(), 0);
    assert_eq!(
        parts.factory.created.load(Ordering::SeqCst),
        0,
        "no executor for a rejected script"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_from_another_catalog_is_refused_before_the_model_is_called() {
    let dir = dir();
    let store = open_store(dir.path()).await;
    let parts = Parts::new(json!([js("return 1;"), {"text": "done"}]));
    let RunResult::Suspended { suspension } = run_ok(parts.input(&store, "turn-1", "go")).await
    else {
        panic!("not suspended")
    };
    let later = Parts::new(json!([js("return 1;"), {"text": "done"}]));
    let mut input = later.input(&store, "turn-1", "go");
    input.fingerprint = "fp-2".into();
    input.resume = Some(Resume {
        suspension,
        approved: true,
        reason: None,
    });
    let error = run(&CancellationToken::new(), input)
        .await
        .expect_err("refused");
    assert!(
        matches!(error, RunError::IncompatibleCheckpoint(_)),
        "{error}"
    );
    assert!(later.model.requests().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zero_step_budget_is_a_usage_error_and_a_small_one_runs_out() {
    let dir = dir();
    let store = open_store(dir.path()).await;
    let parts = Parts::new(json!([js("return 1;"), js("return 2;"), js("return 3;")]));
    let mut input = parts.input(&store, "turn-1", "loop");
    input.max_steps = 0;
    assert!(matches!(
        run(&CancellationToken::new(), input).await,
        Err(RunError::Usage(_))
    ));
    assert!(parts.model.requests().is_empty());
    let mut input = parts.input(&store, "turn-1", "loop");
    input.max_steps = 2;
    input.auto_confirm = true;
    assert_eq!(
        run_ok(input).await,
        RunResult::StepBudgetExhausted { steps: 2 }
    );
    assert_eq!(parts.model.requests().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancellation_stops_a_script_waiting_on_a_call() {
    let dir = dir();
    let store = open_store(dir.path()).await;
    let parts = Parts::new(json!([js("return await tools.t.block({});")]));
    let mut input = parts.input(&store, "turn-1", "block");
    input.auto_confirm = true;
    let token = CancellationToken::new();
    let task = tokio::spawn({
        let token = token.clone();
        async move { run(&token, input).await }
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    while parts.backend.total() == 0 {
        assert!(Instant::now() < deadline, "the script never called");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    token.cancel();
    let result = tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("stopped")
        .expect("joined");
    assert_eq!(result.expect("run"), RunResult::Cancelled);
}

const GATED: &str = "const [a, b, c] = await Promise.all([tools.t.gated({n: 1}), tools.t.gated({n: 2}), tools.t.echo({n: 3})]);\nreturn [a.echo.n, b.echo.n, c.echo.n];";

/// The calls policy end to end: two gated calls and one ungated in one Promise.all, resumed
/// after a restart; each call runs exactly once and the replay is exact.
async fn calls_policy_scenario(open: impl AsyncFn() -> Arc<dyn corral_store::Store>) {
    let replies = json!([js(GATED), {"text": "all three"}]);
    let suspension = {
        let store = open().await;
        let parts = Parts::new(replies.clone());
        let mut input = parts.input(&store, "turn-1", "three calls");
        input.approval = ApprovalPolicy::Calls;
        let RunResult::Suspended { suspension } = run_ok(input).await else {
            panic!("not suspended")
        };
        assert_eq!(
            suspension.pending.len(),
            2,
            "one interaction per gated call"
        );
        let mut arguments: Vec<_> = suspension
            .pending
            .iter()
            .map(|p| p.arguments["n"].clone())
            .collect();
        arguments.sort_by_key(|v| v.as_i64());
        assert_eq!(arguments, vec![json!(1), json!(2)]);
        assert!(
            suspension
                .pending
                .iter()
                .all(|p| p.capability_id.as_deref() == Some("t.gated"))
        );
        assert_eq!(parts.backend.count("t.echo"), 1, "the ungated call ran");
        assert_eq!(parts.backend.count("t.gated"), 0, "the gated calls wait");
        suspension
    };
    let store = open().await;
    let parts = Parts::new(replies);
    let mut input = parts.input(&store, "turn-1", "three calls");
    input.approval = ApprovalPolicy::Calls;
    input.resume = Some(Resume {
        suspension,
        approved: true,
        reason: None,
    });
    let RunResult::Completed { text, .. } = run_ok(input).await else {
        panic!("not completed")
    };
    assert_eq!(text, "all three");
    assert_eq!(parts.backend.count("t.gated"), 2);
    assert_eq!(
        parts.backend.count("t.echo"),
        0,
        "the ungated call came from the journal"
    );
    let (content, is_error) = last_tool_message(&parts.model.requests());
    assert!(!is_error, "{content}");
    assert!(content.contains("\"value\":[1,2,3]"), "{content}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_policy_pauses_at_gated_calls_and_replays_exactly_after_a_restart() {
    let dir = dir();
    let path = dir.path().to_path_buf();
    calls_policy_scenario(async || open_store(&path).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gated_call_rejected_rejects_its_promise_and_the_script_can_catch_it() {
    let dir = dir();
    let store = open_store(dir.path()).await;
    let code = "try { await tools.t.gated({n: 1}); return 'sent'; } catch (e) { return e.name + ': ' + e.message; }";
    let parts = Parts::new(json!([js(code), {"text": "fine"}]));
    let mut input = parts.input(&store, "turn-1", "go");
    input.approval = ApprovalPolicy::Calls;
    let RunResult::Suspended { suspension } = run_ok(input).await else {
        panic!("not suspended")
    };
    let mut input = parts.input(&store, "turn-1", "go");
    input.approval = ApprovalPolicy::Calls;
    input.resume = Some(Resume {
        suspension,
        approved: false,
        reason: Some("no".into()),
    });
    let RunResult::Completed { .. } = run_ok(input).await else {
        panic!("not completed")
    };
    let (content, _) = last_tool_message(&parts.model.requests());
    assert!(content.contains("PermissionDenied"), "{content}");
    assert_eq!(parts.backend.count("t.gated"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_that_differs_from_the_journal_fails_as_drift() {
    let dir = dir();
    let store = open_store(dir.path()).await;
    let parts = Parts::new(json!([js("return 1;"), {"text": "done"}]));
    let RunResult::Suspended { suspension } = run_ok(parts.input(&store, "turn-1", "go")).await
    else {
        panic!("not suspended")
    };
    // Same fingerprint, but the host changed what the model is told: the journaled model
    // call's request no longer matches.
    let mut input = parts.input(&store, "turn-1", "go");
    input.instructions = "Other instructions.".into();
    input.resume = Some(Resume {
        suspension,
        approved: true,
        reason: None,
    });
    let RunResult::Failed { code, .. } = run_ok(input).await else {
        panic!("not failed")
    };
    assert_eq!(code, "effect_drift");
    assert_eq!(parts.backend.total(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_mode_never_allocates_an_executor() {
    let dir = dir();
    let store = open_store(dir.path()).await;
    let parts = Parts::new(json!([
        {"toolCalls": [{"name": "t__echo", "arguments": {"x": 1}}]},
        {"toolCalls": [{"name": "t__gated", "arguments": {"x": 2}}]},
        {"text": "done"}
    ]));
    let mut input = parts.input(&store, "turn-1", "direct");
    input.direct_tools = true;
    let RunResult::Suspended { suspension } = run_ok(input).await else {
        panic!("the gated capability is approved first")
    };
    assert_eq!(
        suspension.pending[0].capability_id.as_deref(),
        Some("t.gated")
    );
    let mut input = parts.input(&store, "turn-1", "direct");
    input.direct_tools = true;
    input.resume = Some(Resume {
        suspension,
        approved: true,
        reason: None,
    });
    let RunResult::Completed { text, .. } = run_ok(input).await else {
        panic!("not completed")
    };
    assert_eq!(text, "done");
    assert_eq!(parts.factory.created.load(Ordering::SeqCst), 0);
    assert_eq!(parts.backend.count("t.echo"), 1);
    assert_eq!(parts.backend.count("t.gated"), 1);
    let tools = &parts.model.requests()[0].tools;
    assert!(tools.iter().all(|t| t.name != "run_js"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_summarizes_old_messages_without_separating_calls_from_results() {
    let dir = dir();
    let store = open_store(dir.path()).await;
    let big = "x".repeat(3000);
    let parts = Parts::new(json!([
        {"toolCalls": [{"name": "t__echo", "arguments": {"pad": big}}]},
        {"text": "the summary"},
        {"text": "final answer"}
    ]));
    let mut input = parts.input(&store, "turn-1", "pad");
    input.direct_tools = true;
    input.limits = corral_chat::ModelLimits {
        context_window: 1200,
        max_output: 200,
        ..Default::default()
    };
    let RunResult::Completed { text, items, .. } = run_ok(input).await else {
        panic!("not completed")
    };
    assert_eq!(text, "final answer");
    let requests = parts.model.requests();
    assert_eq!(requests.len(), 3, "step, compaction, step");
    assert!(requests[1].tools.is_empty(), "the compaction request");
    let after = &requests[2].messages;
    assert!(matches!(&after[0], Message::User { content } if content.contains("the summary")));
    for (i, message) in after.iter().enumerate() {
        if let Message::Tool { tool_call_id, .. } = message {
            let has_call = after[..i].iter().any(|m| matches!(m, Message::Assistant { tool_calls, .. } if tool_calls.iter().any(|c| &c.id == tool_call_id)));
            assert!(has_call, "a tool result kept without its call");
        }
    }
    assert_eq!(count_events(&parts.sink.events(), "compaction"), 1);
    assert!(matches!(items[0]["type"].as_str(), Some("compaction")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_policy_on_postgres() {
    let server = match corral_store::testing::PgServer::start() {
        Ok(server) => server,
        Err(error) => panic!("PostgreSQL is needed for this test: {error}"),
    };
    let config = server
        .create_database("corral_chat_calls")
        .await
        .expect("database");
    let store: Arc<dyn corral_store::Store> = Arc::new(
        corral_store::PostgresStore::connect(corral_store::PostgresOptions::new(config))
            .await
            .expect("connect"),
    );
    prepare(&store).await;
    calls_policy_scenario(async || Arc::clone(&store)).await;
    drop(store);
    let _ = server.drop_database("corral_chat_calls").await;
}

/// Not a test: the child process `an_effect_in_flight_at_a_crash_becomes_uncertain` starts
/// (with `--ignored`) and kills in the middle of a call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the child process of an_effect_in_flight_at_a_crash_becomes_uncertain"]
async fn crash_child_process() {
    let folder = std::env::var("CORRAL_CHAT_CRASH_DIR")
        .expect("run by an_effect_in_flight_at_a_crash_becomes_uncertain, which sets it");
    let store = open_store(std::path::Path::new(&folder)).await;
    let parts = Parts::new(json!([js("return await tools.t.block({});")]));
    let mut input = parts.input(&store, "turn-1", "block");
    input.auto_confirm = true;
    let task = tokio::spawn(async move { run(&CancellationToken::new(), input).await });
    while parts.backend.total() == 0 {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    println!("CALL-IN-FLIGHT");
    let _ = task.await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_effect_in_flight_at_a_crash_becomes_uncertain() {
    use std::io::BufRead as _;
    let dir = dir();
    let exe = std::env::current_exe().expect("test binary");
    let mut child = std::process::Command::new(exe)
        .args(["crash_child_process", "--exact", "--ignored", "--nocapture"])
        .env("CORRAL_CHAT_CRASH_DIR", dir.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("child");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = std::io::BufReader::new(stdout).lines();
    let saw = lines.any(|line| line.map(|l| l.contains("CALL-IN-FLIGHT")).unwrap_or(false));
    assert!(saw, "the child never reached the call");
    child.kill().expect("SIGKILL");
    let _ = child.wait();

    let store = open_store(dir.path()).await;
    let parts = Parts::new(json!([js("return await tools.t.block({});")]));
    let mut input = parts.input(&store, "turn-1", "block");
    input.auto_confirm = true;
    let result = run_ok(input).await;
    assert_eq!(
        result,
        RunResult::Uncertain {
            effect_ids: vec!["turn-1:s0:t0:c0".into()]
        }
    );
    assert_eq!(
        parts.backend.total(),
        0,
        "an uncertain call is never retried by itself"
    );
}
