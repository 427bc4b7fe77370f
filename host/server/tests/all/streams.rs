//! Event streams (SSE), shutdown and recovery, over real sockets.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::*;
use corral_store::{BeginEffect, EffectKind, EffectStatus, NewEffect, SqliteStore, Store};
use eventsource_stream::Eventsource;
use futures::StreamExt;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Reads a session's stream after `cursor` until `turn.completed`; returns the cursors seen.
async fn stream_until_completed(
    base: String,
    client: reqwest::Client,
    session: &str,
    cursor: Option<u64>,
    last_event_id: Option<u64>,
) -> Vec<u64> {
    let (cursors, completed) = stream_once(&base, &client, session, cursor, last_event_id).await;
    assert!(
        completed,
        "the stream of {session} ended before turn.completed: {cursors:?}"
    );
    cursors
}

/// Follows a session's stream as a real client does: when the server drops the stream (a
/// reader slower than the send timeout, on loaded cores), it reconnects with `Last-Event-ID`
/// set to the last cursor it read, until `turn.completed`; returns every cursor read.
async fn follow_until_completed(base: String, client: reqwest::Client, session: &str) -> Vec<u64> {
    let mut cursors: Vec<u64> = Vec::new();
    for _ in 0..100 {
        let (more, completed) =
            stream_once(&base, &client, session, None, cursors.last().copied()).await;
        cursors.extend(more);
        if completed {
            return cursors;
        }
    }
    panic!("{session} never completed after 100 reconnections: {cursors:?}");
}

/// One connection to a session's stream: the cursors read, and whether `turn.completed` came.
async fn stream_once(
    base: &str,
    client: &reqwest::Client,
    session: &str,
    cursor: Option<u64>,
    last_event_id: Option<u64>,
) -> (Vec<u64>, bool) {
    let mut url = format!("{base}/v1/sessions/{session}/events");
    if let Some(cursor) = cursor {
        url.push_str(&format!("?cursor={cursor}"));
    }
    let mut request = client.get(url).bearer_auth(OPERATOR);
    if let Some(id) = last_event_id {
        request = request.header("Last-Event-ID", id.to_string());
    }
    let response = request.send().await.expect("connect");
    assert_eq!(response.status().as_u16(), 200);
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    assert!(
        content_type.starts_with("text/event-stream"),
        "{content_type}"
    );
    let mut events = response.bytes_stream().eventsource();
    let mut cursors = Vec::new();
    // A hang guard, sized for the 30,000 events of the slow-client test on two loaded cores:
    // its reader, which keeps up but is slowed by the suite running beside it, once took more
    // than 30 s to reach the end after the turn had completed.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    while let Ok(Some(event)) = tokio::time::timeout_at(deadline, events.next()).await {
        let event = event.expect("a well-formed event");
        let data: Value = serde_json::from_str(&event.data).expect("json data");
        let cursor: u64 = event.id.parse().expect("numeric id");
        assert_eq!(data["cursor"], cursor);
        assert_eq!(data["type"], event.event.as_str());
        assert_eq!(data["sessionId"], session);
        cursors.push(cursor);
        if event.event == "turn.completed" {
            return (cursors, true);
        }
    }
    (cursors, false)
}

#[tokio::test(flavor = "multi_thread")]
async fn streams_resume_from_any_cursor_without_gap_or_duplicate_while_events_are_appended() {
    let h = Harness::start().await;
    h.register_agent().await;
    h.session("s1", OPERATOR).await;
    h.message("s1", "k1", "events:400").await;
    let mut streams = Vec::new();
    // Join while the turn appends, at whatever cursor the history has reached, less one at
    // least: a stream that joins after the turn's end (its 400 appends can take 20 ms) still
    // has `turn.completed` ahead of it.
    for i in 0..8u64 {
        let page = h
            .ok(
                "GET",
                "/v1/sessions/s1/items?cursor=0&limit=1000",
                OPERATOR,
                None,
            )
            .await;
        let newest = page["cursor"].as_u64().unwrap_or(0);
        let start = newest.saturating_sub(i * 3 + 1);
        let (cursor, header) = if i % 2 == 0 {
            (Some(start), None)
        } else {
            (None, Some(start))
        };
        let (base, client) = (h.base.clone(), h.client.clone());
        streams.push(tokio::spawn(async move {
            (
                start,
                stream_until_completed(base, client, "s1", cursor, header).await,
            )
        }));
        tokio::time::sleep(Duration::from_millis(15)).await;
    }
    h.wait_status("s1", "completed").await;
    let last = h
        .events("s1")
        .await
        .last()
        .and_then(|e| e["cursor"].as_u64())
        .expect("events");
    assert_eq!(last, 402);
    for stream in streams {
        let (start, cursors) = stream.await.expect("stream task");
        assert_eq!(
            cursors,
            (start + 1..=last).collect::<Vec<u64>>(),
            "stream from {start}"
        );
    }
    let stream = |cursor, header| {
        stream_until_completed(h.base.clone(), h.client.clone(), "s1", cursor, header)
    };
    assert_eq!(stream(None, None).await, (1..=last).collect::<Vec<_>>());
    assert_eq!(
        stream(None, Some(200)).await,
        (201..=last).collect::<Vec<_>>()
    );
    // A query cursor wins over Last-Event-ID.
    assert_eq!(
        stream(Some(300), Some(5)).await,
        (301..=last).collect::<Vec<_>>()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn idle_streams_get_keep_alive_comments_and_live_events() {
    let h = Harness::start_with(Options {
        keep_alive: Duration::from_millis(100),
        ..Options::default()
    })
    .await;
    h.register_agent().await;
    h.session("s1", OPERATOR).await;
    let response = h
        .client
        .get(format!("{}/v1/sessions/s1/events", h.base))
        .bearer_auth(OPERATOR)
        .send()
        .await
        .expect("connect");
    let mut body = response.bytes_stream();
    let mut text = String::new();
    let until = Instant::now() + Duration::from_millis(450);
    while Instant::now() < until {
        if let Ok(Some(Ok(chunk))) =
            tokio::time::timeout(Duration::from_millis(50), body.next()).await
        {
            text.push_str(&String::from_utf8_lossy(&chunk));
        }
    }
    assert!(text.matches(": keep-alive").count() >= 2, "{text:?}");
    h.message("s1", "k1", "hello").await;
    let until = Instant::now() + Duration::from_secs(10);
    while !text.contains("event: turn.completed") && Instant::now() < until {
        if let Ok(Some(Ok(chunk))) =
            tokio::time::timeout(Duration::from_millis(100), body.next()).await
        {
            text.push_str(&String::from_utf8_lossy(&chunk));
        }
    }
    assert!(
        text.contains("id: 1\nevent: command.message\ndata: {"),
        "{text:?}"
    );
    assert!(text.contains("event: turn.completed"), "{text:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn executors_hear_of_work_on_their_stream() {
    let h = Harness::start().await;
    h.register_agent().await;
    h.session("s1", OPERATOR).await;
    let response = h
        .client
        .get(format!("{}/v1/executors/connect", h.base))
        .bearer_auth(EXECUTOR)
        .send()
        .await
        .expect("connect");
    assert_eq!(response.status().as_u16(), 200);
    let mut events = response.bytes_stream().eventsource();
    let first = events.next().await.expect("first").expect("event");
    assert_eq!(first.event, "work_available");
    assert_eq!(first.data, r#"{"type":"work_available"}"#);
    h.message("s1", "k1", "action").await;
    let next = tokio::time::timeout(Duration::from_secs(10), events.next())
        .await
        .expect("a signal for the new action")
        .expect("event")
        .expect("well-formed");
    assert_eq!(next.event, "work_available");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_client_that_does_not_read_never_blocks_the_turn() {
    let h = Harness::start_with(Options {
        send_timeout: Duration::from_millis(100),
        ..Options::default()
    })
    .await;
    h.register_agent().await;
    h.session("s1", OPERATOR).await;
    let address = h.base.trim_start_matches("http://").to_owned();
    // A small receive buffer, so the kernel cannot absorb the stream for the client.
    let slow = tokio::net::TcpSocket::new_v4().expect("socket");
    slow.set_recv_buffer_size(4096).expect("SO_RCVBUF");
    let mut socket = slow
        .connect(address.parse().expect("address"))
        .await
        .expect("connect");
    socket
        .write_all(format!("GET /v1/sessions/s1/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {OPERATOR}\r\n\r\n").as_bytes())
        .await
        .expect("request");
    let mut head = [0u8; 12];
    socket.read_exact(&mut head).await.expect("status line");
    assert_eq!(&head, b"HTTP/1.1 200");
    // A reader that reads as fast as it can, beside it (resuming from its last cursor if a
    // loaded machine makes it miss the send timeout too).
    let good = tokio::spawn(follow_until_completed(
        h.base.clone(),
        h.client.clone(),
        "s1",
    ));
    // Never read again, while the turn appends more events (about 6 MB of frames) than the
    // server's socket buffer (at most 4 MiB here) and its own buffers hold.
    h.message("s1", "k1", "events:30000").await;
    h.wait_status("s1", "completed").await;
    // The reader that kept up got every event, in order.
    let cursors = good.await.expect("reader");
    let last = *cursors.last().expect("events");
    assert!(last > 30_000);
    assert_eq!(cursors, (1..=last).collect::<Vec<_>>());
    // The slow client was dropped: its stream's producer and buffer are gone, and the metrics
    // say so (no stream is left open: the good reader's last one ended with the turn).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, text) = h.request("GET", "/metrics", Some(OPERATOR), None).await;
        let dropped = text
            .lines()
            .find_map(|line| line.strip_prefix("corral_sse_dropped_total "))
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0);
        if dropped >= 1 && text.contains("corral_sse_streams 0\n") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the slow client was not dropped:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(socket);
    // Nothing is lost for it: resuming from the start replays the whole history.
    let again = follow_until_completed(h.base.clone(), h.client.clone(), "s1").await;
    assert_eq!(again, cursors);
}

#[tokio::test(flavor = "multi_thread")]
async fn shutdown_aborts_turns_releases_the_store_and_a_restart_resumes_them() {
    // A grace period shorter than the turn's 1.5 s of calls: the shutdown stops it.
    let h = Harness::start_with(Options {
        shutdown_grace: Some(Duration::from_millis(100)),
        ..Options::default()
    })
    .await;
    h.register_agent().await;
    h.session("s1", OPERATOR).await;
    h.message("s1", "k1", "tool sleep:1500 tool").await;
    h.wait_status("s1", "running").await;
    let path = h.store_path.clone();
    let started = Instant::now();
    let dir = h.shutdown().await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "shutdown took {:?}",
        started.elapsed()
    );
    // The store was closed: another owner may open it, and sees the turn still to run. (Closed
    // once the last holder lets go: a blocking store call of the aborted turn, or a child process
    // another test of this binary spawns at that moment (it holds the lock's descriptor until
    // its exec), may hold it a little longer than `run`.)
    let deadline = Instant::now() + Duration::from_secs(10);
    let store: Arc<dyn Store> = loop {
        match SqliteStore::open(&path) {
            Ok(store) => break Arc::new(store),
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(error) => panic!("the store was not released: {error}"),
        }
    };
    // Stored under its tenant-qualified key (see corral_server::tenancy).
    let session = store.get_session("default/s1").await.expect("session");
    assert_eq!(session.status.as_str(), "running");
    let turn = session.active_turn_id.clone().expect("turn");
    // An effect left in flight by the stopped process.
    store
        .begin_effect(BeginEffect::new(
            "default/s1",
            NewEffect::new(
                format!("{turn}:manual"),
                &turn,
                EffectKind::CapabilityCall,
                EffectStatus::Invoking,
                json!({}),
            ),
        ))
        .await
        .expect("effect");
    let h = Harness::start_on(store, path, dir, Options::default()).await;
    // At start, in-flight effects become uncertain (with an event), and the turn waits for it.
    let view = h.wait_status("s1", "uncertain").await;
    assert_eq!(
        view["uncertainEffects"][0]["effectId"],
        format!("{turn}:manual")
    );
    let uncertain = h
        .events("s1")
        .await
        .into_iter()
        .find(|e| e["type"] == "effect.uncertain")
        .expect("event");
    assert_eq!(uncertain["data"]["effectId"], format!("{turn}:manual"));
    let (status, body) = h
        .command("s1", OPERATOR, json!({"type": "resolve", "idempotencyKey": "r", "effectId": format!("{turn}:manual"), "outcome": {"value": 1}}))
        .await;
    assert_eq!(status, 200, "{body}");
    // Runnable again: the turn resumes and completes; its first tool call ran only once.
    h.wait_status("s1", "completed").await;
    let started: Vec<Value> = h
        .events("s1")
        .await
        .into_iter()
        .filter(|e| e["type"] == "tool.started")
        .collect();
    assert_eq!(started.len(), 2, "{started:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn ready_reports_not_ready_once_shutdown_begins() {
    let h = Harness::start().await;
    let (status, _) = h.call("GET", "/ready", None, None).await;
    assert_eq!(status, 200);
    let base = h.base.clone();
    h.shutdown().await;
    // Stopped: nothing answers any more.
    assert!(reqwest::get(format!("{base}/ready")).await.is_err());
}
