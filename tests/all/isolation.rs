//! What persists, what does not, and what reaches the realm only when granted.

use corral_sandbox::{ClockGrant, EntropyGrant, Grants, ScriptUser, SessionLimits, SessionOptions};
use corral_tests::{example_options, example_session, sandbox};
use serde_json::{Value, json};

pub(crate) async fn run_with(grants: Grants, user: Option<ScriptUser>, script: &str) -> Value {
    let options = SessionOptions {
        grants,
        user,
        ..example_options()
    };
    let mut session = sandbox().session(options).await.expect("session");
    let report = session.run(script).await;
    match report.outcome {
        Ok(Some(value)) => value,
        other => panic!("{script}: {other:?}"),
    }
}

#[tokio::test]
async fn global_this_persists_within_a_session_only() {
    let mut first = example_session(SessionLimits::default()).await;
    first
        .run("globalThis.counter = 1; globalThis.cache = {a: [1]}")
        .await;
    let report = first
        .run("counter += 1; cache.a.push(2); return [counter, cache]")
        .await;
    assert_eq!(
        report.outcome.ok().flatten(),
        Some(json!([2, {"a": [1, 2]}]))
    );

    let mut second = example_session(SessionLimits::default()).await;
    let report = second
        .run("return [typeof globalThis.counter, typeof globalThis.cache]")
        .await;
    assert_eq!(
        report.outcome.ok().flatten(),
        Some(json!(["undefined", "undefined"]))
    );
}

#[tokio::test]
async fn the_clock_is_frozen_unless_granted() {
    let frozen = run_with(Grants::default(), None, "return [Date.now(), Date.now()]").await;
    assert_eq!(frozen, json!([0, 0]));

    let chosen = Grants {
        clock: ClockGrant::Frozen {
            unix_ms: 1_700_000_000_000,
        },
        ..Grants::default()
    };
    let at = run_with(chosen, None, "return new Date().toISOString()").await;
    assert_eq!(at, json!("2023-11-14T22:13:20.000Z"));

    let real = Grants {
        clock: ClockGrant::Real,
        ..Grants::default()
    };
    let now = run_with(real, None, "return Date.now()").await;
    let host_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as f64;
    let guest_ms = now.as_f64().expect("a number");
    assert!(
        (guest_ms - host_ms).abs() < 60_000.0,
        "guest {guest_ms} host {host_ms}"
    );
}

#[tokio::test]
async fn randomness_is_seeded_unless_granted() {
    let script = "return [Math.random(), Math.random(), Math.random()]";
    let seeded = |seed| Grants {
        entropy: EntropyGrant::Seeded { seed },
        ..Grants::default()
    };
    let a = run_with(seeded(7), None, script).await;
    let b = run_with(seeded(7), None, script).await;
    let c = run_with(seeded(8), None, script).await;
    assert_eq!(a, b, "the same seed must give the same sequence");
    assert_ne!(a, c, "different seeds must differ");

    let host = Grants {
        entropy: EntropyGrant::Host,
        ..Grants::default()
    };
    let x = run_with(host.clone(), None, script).await;
    let y = run_with(host, None, script).await;
    assert_ne!(x, y, "granted entropy must differ between sessions");
}

#[tokio::test]
async fn the_user_is_frozen_and_carries_only_display_fields() {
    let user = ScriptUser {
        id: "u-7".into(),
        email: Some("grace@example.com".into()),
        display_name: None,
    };
    let value = run_with(
        Grants::default(),
        Some(user),
        "const attempts = [];
         for (const f of [() => { user.id = 'x' }, () => { delete user.email }, () => { Object.setPrototypeOf(user, {admin: true}) }]) {
           try { f(); attempts.push('allowed') } catch (e) { attempts.push(e.name) }
         }
         return [user, Object.keys(user), Object.isFrozen(user), attempts]",
    )
    .await;
    assert_eq!(
        value,
        json!([
            {"id": "u-7", "email": "grace@example.com", "displayName": null},
            ["id", "email", "displayName"],
            true,
            ["TypeError", "TypeError", "TypeError"]
        ])
    );
}

#[tokio::test]
async fn error_columns_on_the_first_line_ignore_the_wrapper() {
    let mut session = example_session(SessionLimits::default()).await;
    let report = session.run("let x = 1; x.y.z = 2;").await;
    let error = report.to_json()["error"].clone();
    assert_eq!(error["name"], "TypeError");
    assert_eq!(
        (error["line"].clone(), error["column"].clone()),
        (json!(1), json!(12))
    );
    let report = session.run("return ;)").await;
    let error = report.to_json()["error"].clone();
    assert_eq!(
        (error["line"].clone(), error["column"].clone()),
        (json!(1), json!(9))
    );
}

#[tokio::test]
async fn stacks_show_only_the_users_frames() {
    let mut session = example_session(SessionLimits::default()).await;
    let report = session
        .run("async function fetchIt() {\n  return await tools.examples.sleep({ms: 'soon'});\n}\nawait fetchIt();")
        .await;
    let error = report.to_json()["error"].clone();
    let stack = error["stack"].as_str().expect("a stack").to_string();
    assert!(stack.contains("at fetchIt (script.js:2:"), "{stack}");
    assert!(
        !stack.contains("prelude.js"),
        "corral's own frames leaked into the stack: {stack}"
    );
    assert!(
        !stack.contains("<eval>"),
        "the wrapper's frame leaked into the stack: {stack}"
    );
    assert_eq!(error["line"], 2);
}

/// A call's site is kept as frames when the call starts and formatted only if it fails: the
/// rejection's stack is the call's, made with the frame limit in force when the call started,
/// and a later change of the limit, or of the frames' functions running on, does not reach it.
#[tokio::test]
async fn a_rejected_calls_stack_is_the_call_site_as_it_was() {
    let mut session = example_session(SessionLimits::default()).await;
    let script = "async function inner() {\n  return tools.examples.sleep({ms: 'soon'});\n}\n\
                  async function outer() {\n  const pending = inner();\n  return pending;\n}\n\
                  const limit = Error.stackTraceLimit;\n\
                  Error.stackTraceLimit = 3;\n\
                  const capped = outer();\n\
                  Error.stackTraceLimit = limit;\n\
                  const full = outer();\n\
                  Error.stackTraceLimit = 0;\n\
                  const none = tools.examples.sleep({ms: 'soon'});\n\
                  Error.stackTraceLimit = 50;\n\
                  const stacks = [];\n\
                  for (const call of [capped, full, none]) {\n\
                    try { await call; stacks.push(null); } catch (e) { stacks.push([e.name, e.stack, Object.keys(e).join()]); }\n\
                  }\n\
                  return stacks;";
    let report = session.run(script).await;
    let value = report.to_json()["value"].clone();
    let stack = |i: usize| {
        assert_eq!(value[i][0], "ValidationError", "{value}");
        value[i][1].as_str().expect("a stack").to_string()
    };
    let (capped, full, none) = (stack(0), stack(1), stack(2));
    for text in [&capped, &full] {
        assert!(text.contains("at inner (script.js:2:"), "{text}");
        // The tool's function is corral's (a native whose frames stack traces leave out): the
        // script sees its own frames only, and the limit counts only those.
        assert!(
            !text.contains("prelude.js") && !text.contains("(native)"),
            "{text}"
        );
    }
    assert_eq!(capped.lines().count(), 3, "{capped}");
    assert!(full.contains("at outer (script.js:5:"), "{full}");
    assert!(full.contains("(script.js:12:"), "{full}");
    assert!(full.lines().count() > capped.lines().count(), "{full}");
    assert_eq!(none, "", "a site taken with no frames allowed has none");
    // The keys a script sees, in the order they had when the Error was made at the call.
    assert_eq!(value[0][2], "message,name,capability,toolCallId", "{value}");
}

/// A slot of the pooling allocator is reused by the next session; since slots keep the pages a
/// session wrote resident and copy the snapshot back over them (see `engine.rs`), nothing a
/// session did may show in the next one. Fuel is the sharpest witness: it counts every guest
/// instruction, so a heap left even slightly different (a free list, an atom, a shape) would
/// change what the same script costs.
#[tokio::test]
async fn a_reused_slot_starts_from_the_snapshot() {
    let sandbox = corral_tests::sandbox_with(corral_sandbox::SandboxConfig {
        max_sessions: 1,
        ..corral_sandbox::SandboxConfig::default()
    });
    let probe = "return [typeof globalThis.kept, typeof Array.prototype.kept, \
                 Object.keys(globalThis).length, JSON.stringify({a: [1, 'two']})]";
    let mut fuel = Vec::new();
    let mut first = None;
    for round in 0..20 {
        let mut session = sandbox
            .session(example_options())
            .await
            .expect("a session in the only slot");
        let report = session.run(probe).await;
        let seen = report.outcome.ok().flatten().expect("the probe's value");
        assert_eq!(seen[0], json!("undefined"), "round {round}");
        assert_eq!(seen[1], json!("undefined"), "round {round}");
        assert_eq!(seen[3], json!("{\"a\":[1,\"two\"]}"), "round {round}");
        first.get_or_insert_with(|| seen.clone());
        assert_eq!(Some(&seen), first.as_ref(), "round {round}");
        fuel.push(report.stats.fuel);
        // Dirty the slot: globals, an intrinsic's prototype, a few MiB of heap (more than the
        // slot keeps resident) and a deep stack.
        let report = session
            .run(
                "globalThis.kept = 'x'.repeat(1 << 20) + Math.random(); \
                 Array.prototype.kept = 1; \
                 const junk = []; for (let i = 0; i < 20000; i++) junk.push({i, s: 'v' + i}); \
                 const deep = (n) => n === 0 ? 0 : 1 + deep(n - 1); return deep(500)",
            )
            .await;
        assert_eq!(
            report.outcome.ok().flatten(),
            Some(json!(500)),
            "round {round}"
        );
    }
    assert!(
        fuel.windows(2).all(|pair| pair[0] == pair[1]),
        "the probe's fuel differed between reuses of the slot: {fuel:?}"
    );
}
