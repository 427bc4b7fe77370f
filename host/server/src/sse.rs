//! Server-sent events: a session's event stream (history first, then live) and the executors'
//! `work_available` stream.
//!
//! One fan-out task turns the store's change feed into per-session wake-ups (a `watch` per
//! watched session, so a burst of appends is one wake-up and nothing lags). Each stream has its
//! own producer task that reads the store from its cursor when woken and hands events to the
//! connection through a bounded channel; a client that does not take them in time is dropped.
//! The turn's writes never wait on a stream.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::response::sse::{Event as SseEvent, KeepAlive, KeepAliveStream, Sse};
use futures::Stream;
use tokio::sync::{broadcast, mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;

use crate::runtime::Runtime;

/// Events buffered per stream.
const BUFFER: usize = 256;
/// Events read from the store at once.
const PAGE: usize = 500;

/// Per-session wake-ups and the executors' work signal.
#[derive(Debug)]
pub struct Hub {
    sessions: Mutex<HashMap<String, watch::Sender<u64>>>,
    work: watch::Sender<u64>,
}

impl Default for Hub {
    fn default() -> Self {
        Hub {
            sessions: Mutex::new(HashMap::new()),
            work: watch::channel(0).0,
        }
    }
}

impl Hub {
    /// A wake-up receiver for `session_id`.
    pub fn watch(&self, session_id: &str) -> watch::Receiver<u64> {
        let mut sessions = self
            .sessions
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        sessions.retain(|_, tx| tx.receiver_count() > 0);
        sessions
            .entry(session_id.to_owned())
            .or_insert_with(|| watch::channel(0).0)
            .subscribe()
    }

    fn wake(&self, session_id: &str) {
        if let Ok(sessions) = self.sessions.lock()
            && let Some(tx) = sessions.get(session_id)
        {
            tx.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    fn wake_all(&self) {
        if let Ok(sessions) = self.sessions.lock() {
            for tx in sessions.values() {
                tx.send_modify(|n| *n = n.wrapping_add(1));
            }
        }
    }

    /// A receiver of the work signal.
    pub fn work(&self) -> watch::Receiver<u64> {
        self.work.subscribe()
    }
}

/// The fan-out task: from the change feed to the hub, until shutdown.
pub(crate) async fn fan_out(runtime: Arc<Runtime>, hub: Arc<Hub>) {
    let mut events = runtime.store.subscribe_events();
    let mut work = runtime.store.subscribe_work();
    loop {
        tokio::select! {
            () = runtime.shutdown.cancelled() => return,
            notice = events.recv() => match notice {
                Ok(notice) => hub.wake(&notice.session_id),
                Err(broadcast::error::RecvError::Lagged(_)) => hub.wake_all(),
                Err(broadcast::error::RecvError::Closed) => return,
            },
            notice = work.recv() => match notice {
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {
                    hub.work.send_modify(|n| *n = n.wrapping_add(1));
                }
                Err(broadcast::error::RecvError::Closed) => return,
            },
        }
    }
}

type SseStream =
    Sse<KeepAliveStream<Box<dyn Stream<Item = Result<SseEvent, Infallible>> + Send + Unpin>>>;

fn sse(runtime: &Runtime, rx: mpsc::Receiver<SseEvent>) -> SseStream {
    let stream: Box<dyn Stream<Item = Result<SseEvent, Infallible>> + Send + Unpin> =
        Box::new(futures::StreamExt::map(ReceiverStream::new(rx), Ok));
    Sse::new(stream).keep_alive(
        KeepAlive::new()
            .interval(runtime.config().sse_keep_alive)
            .text("keep-alive"),
    )
}

/// Counts a stream while its producer lives.
struct StreamGuard(Arc<crate::metrics::Metrics>);

impl Drop for StreamGuard {
    fn drop(&mut self) {
        self.0.sse_stream(-1);
    }
}

/// A session's events after `cursor`: history, then live. The cursor was checked.
pub(crate) fn session_stream(
    runtime: &Arc<Runtime>,
    hub: &Hub,
    session_id: String,
    cursor: u64,
) -> SseStream {
    let (tx, rx) = mpsc::channel(BUFFER);
    // Subscribe before reading history, so that nothing appended meanwhile is missed.
    let mut wake = hub.watch(&session_id);
    let task = Arc::clone(runtime);
    runtime.metrics.sse_stream(1);
    runtime.tasks.spawn(async move {
        let _guard = StreamGuard(Arc::clone(&task.metrics));
        let timeout = task.config().sse_send_timeout;
        let mut last = cursor;
        loop {
            loop {
                let page = match task.events_after(&session_id, last, PAGE).await {
                    Ok(page) => page,
                    Err(_) => return,
                };
                let done = page.len() < PAGE;
                for event in page {
                    let cursor = event.cursor;
                    let Ok(data) = serde_json::to_string(&event) else {
                        return;
                    };
                    let frame = SseEvent::default()
                        .id(cursor.to_string())
                        .event(event.event_type.clone())
                        .data(data);
                    if !send(&task, &tx, frame, timeout).await {
                        return;
                    }
                    last = cursor;
                }
                if done {
                    break;
                }
            }
            tokio::select! {
                () = task.shutdown.cancelled() => return,
                () = tx.closed() => return,
                changed = wake.changed() => if changed.is_err() { return },
            }
        }
    });
    sse(runtime, rx)
}

/// Hands one frame to the connection; `false` when the stream must end (closed or too slow).
async fn send(
    runtime: &Runtime,
    tx: &mpsc::Sender<SseEvent>,
    frame: SseEvent,
    timeout: Duration,
) -> bool {
    match tx.try_send(frame) {
        Ok(()) => true,
        Err(mpsc::error::TrySendError::Closed(_)) => false,
        Err(mpsc::error::TrySendError::Full(frame)) => {
            tokio::select! {
                () = runtime.shutdown.cancelled() => false,
                sent = tokio::time::timeout(timeout, tx.send(frame)) => match sent {
                    Ok(Ok(())) => true,
                    Ok(Err(_)) => false,
                    Err(_) => {
                        tracing::info!("dropping an SSE client that does not keep up");
                        runtime.metrics.sse_dropped();
                        false
                    }
                },
            }
        }
    }
}

/// The executors' stream: `work_available` at once and whenever an action becomes claimable.
pub(crate) fn work_stream(runtime: &Arc<Runtime>, hub: &Hub) -> SseStream {
    let (tx, rx) = mpsc::channel(4);
    let mut wake = hub.work();
    let task = Arc::clone(runtime);
    runtime.metrics.sse_stream(1);
    runtime.tasks.spawn(async move {
        let _guard = StreamGuard(Arc::clone(&task.metrics));
        loop {
            let frame = SseEvent::default()
                .event("work_available")
                .data(r#"{"type":"work_available"}"#);
            // Signals coalesce: a full buffer already tells the executor to look.
            match tx.try_send(frame) {
                Ok(()) | Err(mpsc::error::TrySendError::Full(_)) => {}
                Err(mpsc::error::TrySendError::Closed(_)) => return,
            }
            tokio::select! {
                () = task.shutdown.cancelled() => return,
                () = tx.closed() => return,
                changed = wake.changed() => if changed.is_err() { return },
            }
        }
    });
    sse(runtime, rx)
}
