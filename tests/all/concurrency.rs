//! Calls really run concurrently, up to the bound and never beyond it.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use corral_sandbox::SessionLimits;
use corral_tests::{RecordingBackend, recording_catalog, session};
use serde_json::json;

#[tokio::test]
async fn promise_all_of_n_calls_has_n_in_flight_at_once() {
    // Each call waits until eight are in flight together, so this only finishes if the host
    // runs them concurrently.
    let backend = Arc::new(RecordingBackend {
        barrier: Some(8),
        ..RecordingBackend::default()
    });
    let limits = SessionLimits {
        max_concurrent_calls: 8,
        ..SessionLimits::default()
    };
    let mut session = session(recording_catalog(), backend.clone(), limits).await;
    let report = session
        .run("const r = await Promise.all([0,1,2,3,4,5,6,7].map(i => tools.test.record({i}))); return r.map(x => x.seen.i)")
        .await;
    assert_eq!(
        report.outcome.ok().flatten(),
        Some(json!([0, 1, 2, 3, 4, 5, 6, 7]))
    );
    assert_eq!(backend.max_in_flight.load(Ordering::SeqCst), 8);
    assert_eq!(report.stats.peak_concurrent_calls, 8);
    assert_eq!(report.stats.calls, 8);
}

#[tokio::test]
async fn in_flight_calls_never_exceed_the_bound() {
    let backend = Arc::new(RecordingBackend::default());
    let limits = SessionLimits {
        max_concurrent_calls: 3,
        ..SessionLimits::default()
    };
    let mut session = session(recording_catalog(), backend.clone(), limits).await;
    let report = session
        .run("const r = await Promise.all(Array.from({length: 12}, (_, i) => tools.test.slow({ms: 15, i}))); return r.length")
        .await;
    // Every call completes: calls beyond the bound wait in a queue, they are not refused.
    assert_eq!(report.outcome.ok().flatten(), Some(json!(12)));
    assert_eq!(backend.calls(), 12);
    assert_eq!(backend.max_in_flight.load(Ordering::SeqCst), 3);
    assert_eq!(report.stats.peak_concurrent_calls, 3);
}

#[tokio::test]
async fn awaited_one_by_one_calls_never_overlap() {
    let backend = Arc::new(RecordingBackend::default());
    let mut session = session(
        recording_catalog(),
        backend.clone(),
        SessionLimits::default(),
    )
    .await;
    let report = session
        .run("for (let i = 0; i < 5; i++) await tools.test.slow({ms: 2}); return 'ok'")
        .await;
    assert!(report.outcome.is_ok());
    assert_eq!(backend.max_in_flight.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn completions_are_delivered_in_finishing_order() {
    let backend = Arc::new(RecordingBackend::default());
    let mut session = session(recording_catalog(), backend, SessionLimits::default()).await;
    let report = session
        .run(
            "const order = [];
             await Promise.all([60, 1, 30].map(ms => tools.test.slow({ms}).then(() => order.push(ms))));
             return order",
        )
        .await;
    assert_eq!(report.outcome.ok().flatten(), Some(json!([1, 30, 60])));
}

#[tokio::test]
async fn a_bound_of_one_serializes_promise_all() {
    let backend = Arc::new(RecordingBackend::default());
    let limits = SessionLimits {
        max_concurrent_calls: 1,
        ..SessionLimits::default()
    };
    let mut session = session(recording_catalog(), backend.clone(), limits).await;
    let report = session
        .run("return (await Promise.all([1,2,3,4].map(i => tools.test.slow({ms: 3, i})))).length")
        .await;
    assert_eq!(report.outcome.ok().flatten(), Some(json!(4)));
    assert_eq!(backend.max_in_flight.load(Ordering::SeqCst), 1);
}
