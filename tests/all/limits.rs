//! Every limit stops the script with its own typed error, says whether calls had started,
//! discards the session, and leaves the host able to run the next session.

use std::sync::Arc;

use corral_sandbox::{ExecError, Limit, SandboxConfig, SessionLimits};
use corral_tests::{
    RecordingBackend, example_options, example_session, recording_catalog, sandbox_with, session,
};

/// Runs `script` under `limits` and returns the limit error; then checks the session refuses
/// further scripts and a new session works.
async fn hit(limits: SessionLimits, script: &str) -> (Limit, u32) {
    let mut session = example_session(limits).await;
    let report = session.run(script).await;
    let (limit, calls_started) = match report.outcome {
        Err(ExecError::LimitExceeded {
            limit,
            calls_started,
            ..
        }) => (limit, calls_started),
        other => panic!("expected a limit, got {other:?}"),
    };
    assert!(
        session.is_discarded(),
        "a session must not be reused after a limit"
    );
    let again = session.run("return 1").await;
    assert!(
        matches!(again.outcome, Err(ExecError::SessionDiscarded(_))),
        "a discarded session ran another script: {:?}",
        again.outcome
    );
    let mut next = example_session(SessionLimits::default()).await;
    let ok = next.run("return [1, 2, 3].length").await;
    assert_eq!(ok.outcome.ok().flatten(), Some(serde_json::json!(3)));
    (limit, calls_started)
}

#[tokio::test]
async fn infinite_loop_is_stopped_by_fuel() {
    let limits = SessionLimits {
        fuel: 10_000_000,
        timeout_ms: 60_000,
        ..SessionLimits::default()
    };
    assert_eq!(hit(limits, "while (true) {}").await, (Limit::Fuel, 0));
}

#[tokio::test]
async fn infinite_loop_is_stopped_by_the_deadline() {
    // Fuel would last for minutes; only the wall clock can stop this one.
    let limits = SessionLimits {
        fuel: u64::MAX / 2,
        timeout_ms: 150,
        ..SessionLimits::default()
    };
    let started = std::time::Instant::now();
    assert_eq!(hit(limits, "for (;;) {}").await, (Limit::Deadline, 0));
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
}

#[tokio::test]
async fn the_deadline_covers_waiting_on_a_call() {
    let limits = SessionLimits {
        timeout_ms: 100,
        ..SessionLimits::default()
    };
    let (limit, calls) = hit(limits, "await tools.examples.sleep({ms: 10000}); return 1").await;
    assert_eq!((limit, calls), (Limit::Deadline, 1));
}

#[tokio::test]
async fn a_memory_bomb_is_stopped_at_the_cap() {
    let limits = SessionLimits {
        memory_bytes: 24 << 20,
        ..SessionLimits::default()
    };
    let mut session = example_session(limits).await;
    let report = session
        .run("const hoard = []; while (true) hoard.push('x'.repeat(65536) + hoard.length);")
        .await;
    assert!(matches!(
        report.outcome,
        Err(ExecError::LimitExceeded {
            limit: Limit::Memory,
            ..
        })
    ));
    assert!(report.stats.peak_memory_bytes <= 24 << 20);
    assert!(
        report.stats.peak_memory_bytes > 16 << 20,
        "the bomb never got near the cap"
    );
}

#[tokio::test]
async fn a_bigger_memory_cap_lets_the_same_script_finish() {
    let script = "const a = []; for (let i = 0; i < 200; i++) a.push('x'.repeat(65536) + i); return a.length";
    let small = SessionLimits {
        memory_bytes: 8 << 20,
        ..SessionLimits::default()
    };
    assert_eq!(hit(small, script).await.0, Limit::Memory);
    let big = SessionLimits {
        memory_bytes: 64 << 20,
        ..SessionLimits::default()
    };
    let report = example_session(big).await.run(script).await;
    assert_eq!(report.outcome.ok().flatten(), Some(serde_json::json!(200)));
}

/// QuickJS's small blocks come from free lists per size (guest/patches/...-size-class-allocator):
/// the memory a script's small objects of one size held must serve other sizes and large blocks
/// once they are gone, or a script that works through its data in phases runs out of memory
/// that it no longer uses. This script peaks at about 21 MiB; without the allocator's sweep it
/// needs about 36 MiB, over this cap.
#[tokio::test]
async fn memory_freed_by_small_objects_serves_other_sizes() {
    let limits = SessionLimits {
        memory_bytes: 30 << 20,
        ..SessionLimits::default()
    };
    let script = "function fill(n, make) { const a = []; for (let i = 0; i < n; i++) a.push(make(i)); return a.length }
        fill(150000, i => ({i}));
        fill(150000, i => [i, i + 1, i + 2]);
        const big = []; for (let i = 0; i < 12; i++) big.push(new Uint8Array(1 << 20));
        return big.length";
    let report = example_session(limits).await.run(script).await;
    assert_eq!(
        report.outcome.expect("the phases fit in the cap"),
        Some(serde_json::json!(12))
    );
    assert!(
        report.stats.peak_memory_bytes < 26 << 20,
        "peak {}",
        report.stats.peak_memory_bytes
    );
}

#[tokio::test]
async fn unbounded_recursion_is_a_stack_overflow() {
    let script = "function down(n) { return down(n + 1) + 1 } return down(0)";
    assert_eq!(
        hit(SessionLimits::default(), script).await,
        (Limit::Stack, 0)
    );
}

#[tokio::test]
async fn the_stack_limit_bounds_recursion_depth() {
    // 1,500 frames fit in the default stack but not in a 256 KiB one.
    let script = "function depth(n) { return n === 0 ? 0 : 1 + depth(n - 1) } return depth(1500)";
    let report = example_session(SessionLimits::default())
        .await
        .run(script)
        .await;
    assert_eq!(report.outcome.ok().flatten(), Some(serde_json::json!(1500)));

    let small = sandbox_with(SandboxConfig {
        max_stack_bytes: 256 << 10,
        max_sessions: 4,
        ..SandboxConfig::default()
    });
    let mut session = small.session(example_options()).await.expect("a session");
    let report = session.run(script).await;
    assert!(
        matches!(
            report.outcome,
            Err(ExecError::LimitExceeded {
                limit: Limit::Stack,
                ..
            })
        ),
        "{:?}",
        report.outcome
    );
}

#[tokio::test]
async fn total_calls_are_capped() {
    let limits = SessionLimits {
        max_total_calls: 4,
        ..SessionLimits::default()
    };
    let script = "for (let i = 0; i < 100; i++) await tools.examples.echo({i}); return 'done'";
    assert_eq!(hit(limits, script).await, (Limit::TotalCalls, 4));
}

#[tokio::test]
async fn total_calls_are_counted_per_script() {
    let limits = SessionLimits {
        max_total_calls: 3,
        ..SessionLimits::default()
    };
    let mut session = example_session(limits).await;
    for _ in 0..3 {
        let report = session
            .run("for (let i = 0; i < 3; i++) await tools.examples.echo({i}); return 1")
            .await;
        assert!(report.outcome.is_ok(), "{:?}", report.outcome);
        assert_eq!(report.stats.calls, 3);
    }
}

#[tokio::test]
async fn the_backend_never_sees_more_calls_than_the_cap() {
    let backend = Arc::new(RecordingBackend::default());
    let limits = SessionLimits {
        max_total_calls: 5,
        ..SessionLimits::default()
    };
    let mut session = session(recording_catalog(), backend.clone(), limits).await;
    let report = session
        .run("await Promise.all(Array.from({length: 40}, (_, i) => tools.test.record({i})))")
        .await;
    assert!(matches!(
        report.outcome,
        Err(ExecError::LimitExceeded {
            limit: Limit::TotalCalls,
            ..
        })
    ));
    assert!(
        backend.calls() <= 5,
        "the backend saw {} calls",
        backend.calls()
    );
}

#[tokio::test]
async fn oversized_results_are_refused() {
    let limits = SessionLimits {
        max_result_bytes: 10_000,
        ..SessionLimits::default()
    };
    assert_eq!(
        hit(limits, "return {data: 'y'.repeat(20000)}").await,
        (Limit::ResultSize, 0)
    );
}

#[tokio::test]
async fn oversized_logs_are_refused() {
    let limits = SessionLimits {
        max_log_bytes: 4_096,
        ..SessionLimits::default()
    };
    let script = "await tools.examples.echo({}); for (let i = 0; i < 1000; i++) console.log('z'.repeat(100))";
    assert_eq!(hit(limits, script).await, (Limit::LogSize, 1));
}

#[tokio::test]
async fn scripts_over_the_size_limit_are_not_run() {
    let limits = SessionLimits {
        max_script_bytes: 64,
        ..SessionLimits::default()
    };
    let mut session = example_session(limits).await;
    let report = session.run(&format!("return '{}'", "a".repeat(100))).await;
    assert_eq!(
        report.outcome.err().map(|e| e.kind()),
        Some("invalid_input")
    );
    // Refusing a script is not a failure of the session.
    assert!(!session.is_discarded());
    assert_eq!(
        session.run("return 2").await.outcome.ok().flatten(),
        Some(serde_json::json!(2))
    );
}

#[tokio::test]
async fn a_script_error_does_not_discard_the_session() {
    let mut session = example_session(SessionLimits::default()).await;
    let report = session
        .run("globalThis.kept = 7; throw new Error('boom')")
        .await;
    assert_eq!(report.outcome.err().map(|e| e.kind()), Some("script_error"));
    assert!(!session.is_discarded());
    let report = session.run("return kept").await;
    assert_eq!(report.outcome.ok().flatten(), Some(serde_json::json!(7)));
}

#[tokio::test]
async fn memory_above_the_sandbox_maximum_is_refused() {
    let options = corral_sandbox::SessionOptions {
        limits: SessionLimits {
            memory_bytes: u64::MAX,
            ..SessionLimits::default()
        },
        ..example_options()
    };
    let error = corral_tests::sandbox().session(options).await.err();
    assert!(matches!(
        error,
        Some(corral_sandbox::CreateSessionError::InvalidOptions(_))
    ));
}

#[test]
fn stacks_deeper_than_the_guest_can_back_are_refused() {
    let config = SandboxConfig {
        max_stack_bytes: corral_sandbox::MAX_STACK_BYTES + 1,
        ..SandboxConfig::default()
    };
    assert!(matches!(
        corral_sandbox::Sandbox::new(config),
        Err(corral_sandbox::LoadGuestError::InvalidConfig(_))
    ));
}

#[test]
fn memory_caps_above_the_guests_declared_maximum_are_refused() {
    // Above the maximum the guest's memory declares, growth would fail quietly (a catchable
    // out-of-memory error in QuickJS) instead of trapping at the limiter.
    let config = SandboxConfig {
        max_memory_bytes: corral_sandbox::GUEST_MAX_MEMORY_BYTES + (64 << 10),
        ..SandboxConfig::default()
    };
    assert!(matches!(
        corral_sandbox::Sandbox::new(config),
        Err(corral_sandbox::LoadGuestError::InvalidConfig(_))
    ));
}

#[tokio::test]
async fn the_largest_stack_still_ends_in_a_stack_overflow() {
    // At the maximum, runaway recursion must still be the typed stack limit, not a trap from
    // the guest's shadow stack running out first.
    let sandbox = sandbox_with(SandboxConfig {
        max_stack_bytes: corral_sandbox::MAX_STACK_BYTES,
        max_sessions: 2,
        ..SandboxConfig::default()
    });
    let mut session = sandbox.session(example_options()).await.expect("session");
    let report = session
        .run("function f() { return f() + 1 } return f()")
        .await;
    assert!(
        matches!(
            report.outcome,
            Err(ExecError::LimitExceeded {
                limit: Limit::Stack,
                ..
            })
        ),
        "{:?}",
        report.outcome
    );
}

#[tokio::test]
async fn sessions_beyond_the_pool_are_refused_until_one_closes() {
    // With the pool, wasmtime refuses a third slot; without it, the sandbox's own count does.
    for pool in [true, false] {
        let sandbox = sandbox_with(SandboxConfig {
            max_sessions: 2,
            pool,
            ..SandboxConfig::default()
        });
        let first = sandbox
            .session(example_options())
            .await
            .expect("first session");
        let _second = sandbox
            .session(example_options())
            .await
            .expect("second session");
        let third = sandbox.session(example_options()).await;
        assert!(
            matches!(third, Err(corral_sandbox::CreateSessionError::Capacity(_))),
            "pool {pool}: {third:?}"
        );
        first.close();
        let mut again = sandbox
            .session(example_options())
            .await
            .expect("a slot was freed");
        assert_eq!(
            again.run("return 5").await.outcome.ok().flatten(),
            Some(serde_json::json!(5)),
            "pool {pool}"
        );
    }
}

#[tokio::test]
async fn a_sandbox_without_a_pool_keeps_every_limit_and_costs_the_same_fuel() {
    let unpooled = sandbox_with(SandboxConfig {
        max_sessions: 4,
        pool: false,
        ..SandboxConfig::default()
    });
    let run = |limits: SessionLimits, script: &'static str| {
        let unpooled = unpooled.clone();
        async move {
            let options = corral_sandbox::SessionOptions {
                limits,
                ..example_options()
            };
            let mut session = unpooled.session(options).await.expect("a session");
            session.run(script).await
        }
    };
    let limit_of = |report: corral_sandbox::ScriptReport| match report.outcome {
        Err(ExecError::LimitExceeded { limit, .. }) => limit,
        other => panic!("expected a limit, got {other:?}"),
    };

    let reference = "globalThis.seen = (globalThis.seen ?? 0) + 1; \
        function fib(n) { return n < 2 ? n : fib(n - 1) + fib(n - 2) } return [fib(18), seen]";
    let pooled = example_session(SessionLimits::default())
        .await
        .run(reference)
        .await;
    for _ in 0..2 {
        // Each session starts from the snapshot (`seen` is 1 again) and costs the same fuel.
        let report = run(SessionLimits::default(), reference).await;
        assert_eq!(
            report.outcome.ok().flatten(),
            Some(serde_json::json!([2584, 1]))
        );
        assert_eq!(report.stats.fuel, pooled.stats.fuel);
    }

    let memory = SessionLimits {
        memory_bytes: 24 << 20,
        ..SessionLimits::default()
    };
    let bomb = run(
        memory,
        "const hoard = []; while (true) hoard.push('x'.repeat(65536) + hoard.length);",
    )
    .await;
    assert!(bomb.stats.peak_memory_bytes <= 24 << 20);
    assert_eq!(limit_of(bomb), Limit::Memory);

    let recursion = "function down(n) { return down(n + 1) + 1 } return down(0)";
    assert_eq!(
        limit_of(run(SessionLimits::default(), recursion).await),
        Limit::Stack
    );
    let fuel = SessionLimits {
        fuel: 10_000_000,
        ..SessionLimits::default()
    };
    assert_eq!(limit_of(run(fuel, "while (true) {}").await), Limit::Fuel);
    let deadline = SessionLimits {
        fuel: u64::MAX / 2,
        timeout_ms: 100,
        ..SessionLimits::default()
    };
    assert_eq!(
        limit_of(run(deadline, "for (;;) {}").await),
        Limit::Deadline
    );
}

/// A CPU-bound script hands its thread back to the executor between slices of its run: on a
/// runtime with one thread, a timer that a task sets just after the script starts fires before
/// the script's deadline stops it. A host that resumed the guest at every fuel yield until the
/// deadline (rather than for one slice) would starve the timer for the whole two seconds.
#[tokio::test(flavor = "current_thread")]
async fn a_busy_script_lets_other_tasks_on_its_thread_run() {
    let limits = SessionLimits {
        fuel: u64::MAX / 2,
        timeout_ms: 2_000,
        ..SessionLimits::default()
    };
    let mut session = example_session(limits).await;
    let timer = tokio::spawn(async {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        std::time::Instant::now()
    });
    let report = session.run("for (;;) {}").await;
    let script_stopped = std::time::Instant::now();
    assert!(
        matches!(
            report.outcome,
            Err(ExecError::LimitExceeded {
                limit: Limit::Deadline,
                ..
            })
        ),
        "{:?}",
        report.outcome
    );
    let timer_fired = timer.await.expect("the timer task panicked");
    assert!(
        timer_fired < script_stopped,
        "the timer fired only after the script was stopped"
    );
}

#[tokio::test]
async fn a_cancelled_run_discards_the_session() {
    let mut session = example_session(SessionLimits::default()).await;
    let cancelled = tokio::time::timeout(
        std::time::Duration::from_millis(50),
        session.run("await tools.examples.sleep({ms: 5000}); return 1"),
    )
    .await;
    assert!(cancelled.is_err(), "the run should still have been waiting");
    let report = session.run("return 2").await;
    assert!(
        matches!(report.outcome, Err(ExecError::SessionDiscarded(_))),
        "{:?}",
        report.outcome
    );
}

/// The fuel and error of `script`, which must throw.
async fn thrown(script: &str) -> (u64, corral_sandbox::ScriptError) {
    let mut session = example_session(SessionLimits::default()).await;
    let report = session.run(script).await;
    match report.outcome {
        Err(ExecError::Script(error)) => (report.stats.fuel, error),
        other => panic!("{script}: expected a script error, got {other:?}"),
    }
}

#[tokio::test]
async fn a_huge_thrown_message_is_cut_in_the_guest() {
    // The same 8 MiB string is built either way; only what is thrown differs. Turning the
    // whole string into text in the guest (and copying it to the host) cost fuel in proportion
    // to its length; cut in the guest, it costs about what a small message does.
    let n = 8 << 20;
    let (small_fuel, _) = thrown(&format!(
        "const s = 'x'.repeat({n}); throw new Error(s.slice(0, 16))"
    ))
    .await;
    for what in [
        "new Error(s)",
        "s",
        "Object.assign(new Error('m'), {name: s})",
    ] {
        let (fuel, error) = thrown(&format!("const s = 'x'.repeat({n}); throw {what}")).await;
        let text = if what.contains("name") {
            &error.name
        } else {
            &error.message
        };
        assert!(
            text.ends_with(&format!("... [truncated: {n} UTF-16 code units in all]")),
            "{what}: {}",
            &text[text.len().saturating_sub(80)..]
        );
        assert!(
            fuel < small_fuel + 1_000_000,
            "throw {what} of {n} characters cost {fuel} fuel, a 16-character one {small_fuel}"
        );
    }
}
