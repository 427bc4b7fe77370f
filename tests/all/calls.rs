//! The path of a call: validation before the backend, attribution from the host, redaction
//! before anything reaches the script, and backend failures as rejected promises.

use std::sync::Arc;

use corral_catalog::Redactor;
use corral_sandbox::{
    Backend, ExecError, Invocation, InvocationContext, InvokeCapabilityError, SessionLimits,
    SessionOptions, ToolResult,
};
use corral_tests::{RecordingBackend, recording_catalog, sandbox, session};
use serde_json::json;

#[tokio::test]
async fn invalid_input_never_reaches_the_backend() {
    let backend = Arc::new(RecordingBackend::default());
    let mut session = session(
        recording_catalog(),
        backend.clone(),
        SessionLimits::default(),
    )
    .await;
    let report = session
        .run(
            "const errors = [];
             for (const input of [{}, {n: 'one'}, {n: 1, extra: true}]) {
               try { await tools.test.strict(input); } catch (e) { errors.push([e.name, e.message]); }
             }
             return errors",
        )
        .await;
    assert_eq!(
        backend.calls(),
        0,
        "the backend was called with invalid input"
    );
    let errors = report
        .outcome
        .ok()
        .flatten()
        .expect("the script caught the rejections");
    let errors = errors.as_array().expect("a list");
    assert_eq!(errors.len(), 3);
    for error in errors {
        assert_eq!(error[0], "ValidationError");
    }
    assert!(
        errors[1][1].as_str().is_some_and(|m| m.contains("/n")),
        "{errors:?}"
    );
    // Rejected calls still count as started calls.
    assert_eq!(report.stats.calls, 3);
}

#[tokio::test]
async fn the_backend_gets_the_hosts_attribution_and_a_positional_array() {
    let backend = Arc::new(RecordingBackend::default());
    let context = InvocationContext {
        session_id: "s-42".into(),
        tenant_id: Some("tenant-a".into()),
        user_id: Some("u-1".into()),
        run_id: Some("run-9".into()),
        ..InvocationContext::default()
    };
    let options = SessionOptions {
        context: context.clone(),
        ..SessionOptions::new(Arc::new(recording_catalog()), backend.clone())
    };
    let mut session = sandbox().session(options).await.expect("session");
    session.run("return 0").await;
    let report = session
        .run("await tools.test.record({tenant_id: 'tenant-b', session_id: 'evil'}); await tools['test.record']({n: 2})")
        .await;
    assert!(report.outcome.is_ok(), "{:?}", report.outcome);
    let seen = backend.invocations.lock().expect("lock").clone();
    assert_eq!(seen.len(), 2);
    for (got, _) in &seen {
        assert_eq!(got, &context, "script input changed the attribution");
    }
    assert_eq!(seen[0].1.capability_id, "test.record");
    assert_eq!(
        seen[0].1.input,
        json!([{"tenant_id": "tenant-b", "session_id": "evil"}])
    );
    assert_eq!(seen[0].1.tool_call_id, "s-42:1:0");
    assert_eq!(seen[1].1.tool_call_id, "s-42:1:1");
}

/// A backend that leaks a secret in every way it can.
struct Leaky;

#[async_trait::async_trait]
impl Backend for Leaky {
    async fn invoke(
        &self,
        _context: &InvocationContext,
        invocation: Invocation,
    ) -> Result<ToolResult, InvokeCapabilityError> {
        if invocation.argument().get("fail").is_some() {
            return Err(InvokeCapabilityError::Failed {
                capability_id: invocation.capability_id,
                message: "token sk-live-123456 was rejected".into(),
            });
        }
        Ok(ToolResult::new(json!({
            "token": "sk-live-123456",
            "nested": [{"note": "the key is sk-live-123456, keep it"}],
            "sk-live-123456": "as a key",
            "other": "AKIAABCDEFGHIJKLMNOP",
        })))
    }
}

#[tokio::test]
async fn secrets_from_a_backend_never_reach_the_script() {
    let redactor = Redactor::new(
        vec!["sk-live-123456".into()],
        vec![r"AKIA[0-9A-Z]{16}".into()],
    )
    .expect("redactor");
    let options = SessionOptions {
        redactor: Arc::new(redactor),
        ..SessionOptions::new(Arc::new(recording_catalog()), Arc::new(Leaky))
    };
    let mut session = sandbox().session(options).await.expect("session");
    let report = session
        .run(
            "const r = await tools.test.record({});
             console.log(JSON.stringify(r));
             log('info', 'fields', r);
             let message = '';
             try { await tools.test.record({fail: true}); } catch (e) { message = e.message; }
             globalThis.seen = r;
             return {r, message, keys: Object.keys(r)}",
        )
        .await;
    let text = report.to_json().to_string();
    assert!(!text.contains("sk-live-123456"), "secret leaked: {text}");
    assert!(
        !text.contains("AKIAABCDEFGHIJKLMNOP"),
        "pattern leaked: {text}"
    );
    assert!(text.contains("[REDACTED]"), "{text}");
    let thrown = session
        .run("throw new Error(JSON.stringify(globalThis.seen))")
        .await;
    let text = thrown.to_json().to_string();
    assert!(
        !text.contains("sk-live-123456"),
        "secret leaked through an error: {text}"
    );
}

/// A backend that panics.
struct Panicky;

#[async_trait::async_trait]
impl Backend for Panicky {
    async fn invoke(
        &self,
        _context: &InvocationContext,
        _invocation: Invocation,
    ) -> Result<ToolResult, InvokeCapabilityError> {
        panic!("backend bug")
    }
}

#[tokio::test]
async fn a_panicking_backend_fails_the_call_not_the_session() {
    let mut session = session(
        recording_catalog(),
        Arc::new(Panicky),
        SessionLimits::default(),
    )
    .await;
    let report = session
        .run("try { await tools.test.record({}) } catch (e) { return [e.name, e.message] }")
        .await;
    assert_eq!(
        report.outcome.ok().flatten(),
        Some(json!([
            "CapabilityError",
            "test.record failed: the backend panicked"
        ]))
    );
    assert!(!session.is_discarded());
}

/// A backend that returns a non-string for a text capability.
struct TextAsObject;

#[async_trait::async_trait]
impl Backend for TextAsObject {
    async fn invoke(
        &self,
        _context: &InvocationContext,
        _invocation: Invocation,
    ) -> Result<ToolResult, InvokeCapabilityError> {
        Ok(ToolResult::new(json!({"a": 1})))
    }
}

#[tokio::test]
async fn text_capabilities_always_yield_strings() {
    let catalog = corral_catalog::Catalog::from_json_str(
        r#"{"capabilities": [{"id": "files.read", "input_schema": {"type": "object"}, "text_output": true}]}"#,
    )
    .expect("catalog");
    let mut session = session(catalog, Arc::new(TextAsObject), SessionLimits::default()).await;
    let report = session
        .run("const t = await tools.files.read({}); return [typeof t, t]")
        .await;
    assert_eq!(
        report.outcome.ok().flatten(),
        Some(json!(["string", "{\"a\":1}"]))
    );
}

#[tokio::test]
async fn an_uncaught_backend_failure_is_a_capability_error() {
    let mut session = session(
        recording_catalog(),
        Arc::new(Leaky),
        SessionLimits::default(),
    )
    .await;
    let report = session.run("await tools.test.record({fail: 1})").await;
    match report.outcome {
        Err(error @ ExecError::Script(_)) => assert_eq!(error.kind(), "capability_error"),
        other => panic!("expected a capability error, got {other:?}"),
    }
}

/// The built-in example catalog defers its schema checks to first use (so `corral exec` of a
/// script that calls nothing skips the meta-schema); here it gets every check, and its
/// validators still refuse what they should.
#[tokio::test]
async fn the_example_catalog_passes_every_check_and_validates_on_first_call() {
    let text = corral_sandbox::examples::example_catalog_json().to_string();
    let checked = corral_catalog::Catalog::from_json_str(&text).expect("the full check");
    let lazy = corral_sandbox::examples::example_catalog();
    assert_eq!(checked.len(), lazy.len());
    for (index, capability) in checked.capabilities().iter().enumerate() {
        for example in &capability.examples {
            assert!(
                lazy.validate_input(index, example).is_ok(),
                "{}",
                capability.id
            );
        }
    }
    let mut session = corral_tests::example_session(SessionLimits::default()).await;
    let report = session
        .run("try { await tools.examples.sleep({ms: -1}); } catch (e) { return e.name }")
        .await;
    assert_eq!(
        report.outcome.ok().flatten(),
        Some(json!("ValidationError"))
    );
}
