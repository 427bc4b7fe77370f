//! The two hooks of the resumable world: a [`CompletionSchedule`] chooses each batch of
//! completions (so a run can be recorded and replayed exactly, same batches and same fuel), and
//! a backend may hold calls (approval), which suspends the script once nothing else is left.

use std::sync::Arc;
use std::time::Duration;

use corral_sandbox::{
    Backend, CompletionSchedule, DeliverReady, ExecError, HeldCall, Invocation, InvocationContext,
    InvokeCapabilityError, ScheduleError, SessionLimits, ToolResult,
};
use corral_tests::{recording_catalog, session};
use serde_json::{Value, json};

/// Answers `{"seen": input}`; `test.slow` first sleeps `ms` unless the backend is instant.
/// `test.strict` is held (it stands for a capability that needs approval).
struct DelayBackend {
    delays: bool,
}

#[async_trait::async_trait]
impl Backend for DelayBackend {
    async fn invoke(
        &self,
        _context: &InvocationContext,
        invocation: Invocation,
    ) -> Result<ToolResult, InvokeCapabilityError> {
        let argument = invocation.argument().clone();
        match invocation.capability_id.as_str() {
            "test.strict" => Err(InvokeCapabilityError::Held {
                capability_id: invocation.capability_id,
                reason: "waiting for approval".into(),
            }),
            "test.slow" => {
                let ms = argument.get("ms").and_then(Value::as_u64).unwrap_or(0);
                if self.delays {
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                }
                Ok(ToolResult::new(json!({ "seen": argument })))
            }
            _ => Ok(ToolResult::new(json!({ "seen": argument }))),
        }
    }
}

/// One wait of a script: the batch delivered and the fuel used when it was chosen.
#[derive(Debug, Clone, PartialEq)]
struct Wait {
    batch: Vec<u32>,
    fuel: u64,
}

/// Delivers everything ready (like [`DeliverReady`]) and records each batch.
#[derive(Default)]
struct Recording {
    waits: Vec<Wait>,
}

impl CompletionSchedule for Recording {
    fn next_batch(
        &mut self,
        wait_index: u32,
        ready: &[u32],
        fuel_consumed: u64,
    ) -> Result<Vec<u32>, ScheduleError> {
        if !ready.is_empty() {
            assert_eq!(wait_index as usize, self.waits.len());
            self.waits.push(Wait {
                batch: ready.to_vec(),
                fuel: fuel_consumed,
            });
        }
        Ok(ready.to_vec())
    }
}

/// Delivers the recorded batches exactly, each once all of its calls are ready.
struct Replay {
    recorded: Vec<Wait>,
    seen: Vec<Wait>,
}

impl CompletionSchedule for Replay {
    fn next_batch(
        &mut self,
        wait_index: u32,
        ready: &[u32],
        fuel_consumed: u64,
    ) -> Result<Vec<u32>, ScheduleError> {
        let Some(wait) = self.recorded.get(wait_index as usize) else {
            return Err(ScheduleError(format!(
                "the script waited {} times when it was recorded, and now waits again",
                self.recorded.len()
            )));
        };
        if !wait.batch.iter().all(|id| ready.contains(id)) {
            return Ok(Vec::new());
        }
        self.seen.push(Wait {
            batch: wait.batch.clone(),
            fuel: fuel_consumed,
        });
        Ok(wait.batch.clone())
    }
}

const REPLAYED_SCRIPT: &str = "
    const order = [];
    const all = await Promise.all([30, 5, 15].map(ms =>
        tools.test.slow({ms}).then(r => { order.push(r.seen.ms); return r.seen.ms; })));
    const chained = await tools.test.slow({ms: 10})
        .then(r => tools.test.slow({ms: r.seen.ms + 1}))
        .then(r => r.seen.ms);
    const raced = await Promise.race([tools.test.slow({ms: 60}), tools.test.slow({ms: 2})]);
    let sum = 0;
    for (let i = 0; i < 1000; i++) sum += i * Math.random();
    return {all, order, chained, raced: raced.seen.ms, sum, now: Date.now()};
";

#[tokio::test]
async fn replaying_the_recorded_batches_gives_the_same_value_and_the_same_fuel() {
    let mut recorded_session = session(
        recording_catalog(),
        Arc::new(DelayBackend { delays: true }),
        SessionLimits::default(),
    )
    .await;
    let mut recording = Recording::default();
    let recorded = recorded_session
        .run_scheduled(REPLAYED_SCRIPT, &mut recording)
        .await;
    let value = recorded.outcome.clone().expect("the recorded run succeeds");
    let value = value.expect("a value");
    assert_eq!(value["all"], json!([30, 5, 15]));
    assert_eq!(value["order"], json!([5, 15, 30]));
    assert_eq!(value["chained"], json!(11));
    assert_eq!(value["raced"], json!(2));
    assert!(
        recording.waits.len() >= 4,
        "the script waited only {} times: {:?}",
        recording.waits.len(),
        recording.waits
    );

    // A new session (same session id, so the same tool call ids), an instant backend: every
    // call is ready at once, and only the schedule decides what the guest sees when.
    let mut replayed_session = session(
        recording_catalog(),
        Arc::new(DelayBackend { delays: false }),
        SessionLimits::default(),
    )
    .await;
    let mut replay = Replay {
        recorded: recording.waits.clone(),
        seen: Vec::new(),
    };
    let replayed = replayed_session
        .run_scheduled(REPLAYED_SCRIPT, &mut replay)
        .await;
    assert_eq!(
        replayed.outcome.clone().expect("the replay succeeds"),
        Some(value)
    );
    assert_eq!(replay.seen, recording.waits, "batches or fuel differ");
    assert_eq!(replayed.stats.fuel, recorded.stats.fuel);
    assert_eq!(replayed.stats.calls, recorded.stats.calls);

    // Delivering everything at once instead takes another path (the order differs).
    let mut eager_session = session(
        recording_catalog(),
        Arc::new(DelayBackend { delays: false }),
        SessionLimits::default(),
    )
    .await;
    let eager = eager_session.run(REPLAYED_SCRIPT).await;
    let eager = eager
        .outcome
        .expect("the eager run succeeds")
        .expect("a value");
    assert_eq!(eager["order"], json!([30, 5, 15]));
}

#[tokio::test]
async fn deliver_ready_is_what_run_does() {
    let script = "const r = await Promise.all([1, 2, 3].map(ms => tools.test.slow({ms})));
                  return r.map(x => x.seen.ms)";
    let mut plain = session(
        recording_catalog(),
        Arc::new(DelayBackend { delays: false }),
        SessionLimits::default(),
    )
    .await;
    let mut scheduled = session(
        recording_catalog(),
        Arc::new(DelayBackend { delays: false }),
        SessionLimits::default(),
    )
    .await;
    let a = plain.run(script).await;
    let b = scheduled.run_scheduled(script, &mut DeliverReady).await;
    assert_eq!(a.outcome.clone().ok().flatten(), Some(json!([1, 2, 3])));
    assert_eq!(a.outcome.ok(), b.outcome.ok());
    assert_eq!(a.stats.fuel, b.stats.fuel);
    assert_eq!(a.stats.calls, b.stats.calls);
    // The session stays usable.
    assert_eq!(
        scheduled.run("return 7").await.outcome.ok().flatten(),
        Some(json!(7))
    );
}

/// A call whose backend answers without waiting settles before the script's call expression
/// returns under [`DeliverReady`] (answered from `start-call`), and only in a batch under a
/// schedule that keeps the default `answers_at_start` (as a recording one must).
#[tokio::test]
async fn calls_ready_at_start_are_answered_there_only_when_the_schedule_says_so() {
    let script = r#"const order = [];
        const p = tools.test.record({}).then(() => order.push("call"));
        await null;
        order.push("tick");
        await p;
        let error;
        try { await tools.test.slow({}); } catch (e) { error = e; }
        return {order, error: [error.name, error.capability, error.stack.includes("script.js:7")]}"#;
    let new_session = || {
        session(
            recording_catalog(),
            Arc::new(DelayBackend { delays: false }),
            SessionLimits::default(),
        )
    };
    let at_start = new_session().await.run(script).await;
    let scheduled = new_session()
        .await
        .run_scheduled(script, &mut DeliverReady)
        .await;
    let mut recording = Recording::default();
    let batched = new_session()
        .await
        .run_scheduled(script, &mut recording)
        .await;
    let error = json!(["ValidationError", "test.slow", true]);
    assert_eq!(
        at_start.outcome.clone().ok().flatten(),
        Some(json!({"order": ["call", "tick"], "error": error}))
    );
    assert_eq!(scheduled.outcome.ok(), at_start.outcome.ok());
    assert_eq!(scheduled.stats.fuel, at_start.stats.fuel);
    assert_eq!(
        batched.outcome.ok().flatten(),
        Some(json!({"order": ["tick", "call"], "error": error}))
    );
    // Both calls went through batches of their own.
    let batches: Vec<_> = recording.waits.iter().map(|w| w.batch.clone()).collect();
    assert_eq!(batches, vec![vec![0], vec![1]]);
    assert_eq!(at_start.stats.calls, 2);
    assert_eq!(batched.stats.calls, 2);
}

fn held(call_id: u32) -> HeldCall {
    HeldCall {
        call_id,
        tool_call_id: format!("test:0:{call_id}"),
        capability_id: "test.strict".into(),
        reason: "waiting for approval".into(),
    }
}

#[tokio::test]
async fn a_held_call_suspends_the_script_and_discards_the_session() {
    let mut session = session(
        recording_catalog(),
        Arc::new(DelayBackend { delays: true }),
        SessionLimits::default(),
    )
    .await;
    let report = session
        .run("log('info', 'before'); const r = await tools.test.strict({n: 1}); log('info', 'after'); return r")
        .await;
    match &report.outcome {
        Err(ExecError::Suspended {
            held: calls,
            calls_started,
        }) => {
            assert_eq!(calls, &vec![held(0)]);
            assert_eq!(*calls_started, 1);
        }
        other => panic!("expected a suspension, got {other:?}"),
    }
    let json = report.to_json();
    assert_eq!(json["error"]["kind"], "suspended");
    assert_eq!(json["error"]["held"][0]["tool_call_id"], "test:0:0");
    assert_eq!(report.logs.len(), 1, "{:?}", report.logs);
    assert!(report.stats.fuel > 0);
    assert!(session.is_discarded());
    assert!(matches!(
        session.run("return 1").await.outcome,
        Err(ExecError::SessionDiscarded(_))
    ));
}

#[tokio::test]
async fn running_calls_finish_and_are_delivered_before_the_suspension() {
    let mut session = session(
        recording_catalog(),
        Arc::new(DelayBackend { delays: true }),
        SessionLimits::default(),
    )
    .await;
    // Two gated calls and one ordinary call; the ordinary one finishes later and starts a
    // third gated call in response.
    let report = session
        .run(
            "const results = await Promise.all([
                 tools.test.strict({n: 1}),
                 tools.test.strict({n: 2}),
                 tools.test.slow({ms: 20}).then(r => { log('info', 'slow done'); return tools.test.strict({n: r.seen.ms}); }),
             ]);
             return results",
        )
        .await;
    match &report.outcome {
        Err(ExecError::Suspended {
            held: calls,
            calls_started,
        }) => {
            assert_eq!(calls, &vec![held(0), held(1), held(3)]);
            assert_eq!(*calls_started, 4);
        }
        other => panic!("expected a suspension, got {other:?}"),
    }
    assert_eq!(report.logs.len(), 1, "the ordinary call was not delivered");
    assert_eq!(report.stats.calls, 4);

    // Promise.all of two gated calls and one ungated call: two held calls.
    let mut session = corral_tests::session(
        recording_catalog(),
        Arc::new(DelayBackend { delays: true }),
        SessionLimits::default(),
    )
    .await;
    let report = session
        .run("return await Promise.all([tools.test.strict({n: 1}), tools.test.slow({ms: 5}), tools.test.strict({n: 2})])")
        .await;
    match &report.outcome {
        Err(ExecError::Suspended { held: calls, .. }) => {
            assert_eq!(calls, &vec![held(0), held(2)]);
        }
        other => panic!("expected a suspension, got {other:?}"),
    }
}

#[tokio::test]
async fn a_script_that_does_not_wait_on_a_held_call_finishes() {
    let mut session = session(
        recording_catalog(),
        Arc::new(DelayBackend { delays: true }),
        SessionLimits::default(),
    )
    .await;
    let report = session
        .run("tools.test.strict({n: 1}); return (await tools.test.slow({ms: 1})).seen.ms")
        .await;
    assert_eq!(report.outcome.ok().flatten(), Some(json!(1)));
    assert!(!session.is_discarded());
}

/// Chooses the given ids at every wait.
struct Fixed(Vec<u32>);

impl CompletionSchedule for Fixed {
    fn next_batch(
        &mut self,
        _wait_index: u32,
        _ready: &[u32],
        _fuel_consumed: u64,
    ) -> Result<Vec<u32>, ScheduleError> {
        Ok(self.0.clone())
    }
}

#[tokio::test]
async fn an_impossible_batch_is_a_schedule_error() {
    let script = "return (await tools.test.slow({ms: 1})).seen.ms";
    for (schedule, needle) in [
        (Fixed(vec![7]), "not ready"),
        (Fixed(vec![0, 0]), "twice"),
        (Fixed(Vec::new()), "nothing else can become ready"),
    ] {
        // An instant backend: call 0 is ready at the first wait, and nothing else runs.
        let mut session = session(
            recording_catalog(),
            Arc::new(DelayBackend { delays: false }),
            SessionLimits::default(),
        )
        .await;
        let mut schedule = schedule;
        let report = session.run_scheduled(script, &mut schedule).await;
        match &report.outcome {
            Err(error @ ExecError::Schedule(ScheduleError(message))) => {
                assert!(message.contains(needle), "{message}");
                assert_eq!(error.kind(), "replay_drift");
            }
            other => panic!("expected a schedule error, got {other:?}"),
        }
        assert_eq!(report.stats.calls, 1);
        assert!(session.is_discarded());
    }
}

/// Refuses at the second wait.
struct RefuseSecond;

impl CompletionSchedule for RefuseSecond {
    fn next_batch(
        &mut self,
        wait_index: u32,
        ready: &[u32],
        _fuel_consumed: u64,
    ) -> Result<Vec<u32>, ScheduleError> {
        if wait_index == 1 {
            return Err(ScheduleError("the recording ends here".into()));
        }
        Ok(ready.to_vec())
    }
}

#[tokio::test]
async fn a_schedule_that_refuses_ends_the_script() {
    let mut session = session(
        recording_catalog(),
        Arc::new(DelayBackend { delays: false }),
        SessionLimits::default(),
    )
    .await;
    let report = session
        .run_scheduled(
            "await tools.test.record({}); await tools.test.record({}); return 1",
            &mut RefuseSecond,
        )
        .await;
    match report.outcome {
        Err(ExecError::Schedule(ScheduleError(message))) => {
            assert_eq!(message, "the recording ends here");
        }
        other => panic!("expected a schedule error, got {other:?}"),
    }
    assert_eq!(report.stats.calls, 2);
}
