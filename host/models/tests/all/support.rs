//! A tiny HTTP/1.1 server on 127.0.0.1:0 that replays recorded fixtures, one reply per
//! connection, and keeps what each request sent.

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A fixture file under tests/fixtures.
pub fn fixture(path: &str) -> Result<Vec<u8>> {
    let full: PathBuf = [env!("CARGO_MANIFEST_DIR"), "tests", "fixtures", path]
        .iter()
        .collect();
    std::fs::read(&full).with_context(|| format!("reading {}", full.display()))
}

/// The server-sent events of a fixture, each with its blank-line terminator.
pub fn sse_events(bytes: &[u8]) -> Vec<Vec<u8>> {
    let text = String::from_utf8_lossy(bytes);
    text.split_inclusive("\n\n")
        .map(|event| event.as_bytes().to_vec())
        .collect()
}

/// What the server answers one request with.
#[derive(Clone, Debug)]
pub enum Reply {
    /// 200 with `text/event-stream`, the events as chunks. With `drop_after = Some(n)` the
    /// connection is closed after `n` events without ending the chunked body (a dropped
    /// connection); otherwise the body ends cleanly after every event.
    Sse {
        events: Vec<Vec<u8>>,
        drop_after: Option<usize>,
    },
    /// Any status with headers and a body.
    Status {
        status: u16,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
    },
}

impl Reply {
    /// A recorded SSE fixture, replayed whole.
    pub fn sse(path: &str) -> Result<Reply> {
        Ok(Reply::Sse {
            events: sse_events(&fixture(path)?),
            drop_after: None,
        })
    }

    /// A recorded SSE fixture whose connection drops after `n` events.
    pub fn sse_dropped_after(path: &str, n: usize) -> Result<Reply> {
        Ok(Reply::Sse {
            events: sse_events(&fixture(path)?),
            drop_after: Some(n),
        })
    }

    /// A recorded error reply: `path` is the body, `path.headers` the recorded status line and
    /// headers (only status, content-type and retry-after* are replayed).
    pub fn recorded_status(path: &str) -> Result<Reply> {
        let body = fixture(path)?;
        let head = String::from_utf8(fixture(&format!("{path}.headers"))?)?;
        let mut lines = head.lines();
        let status_line = lines.next().context("empty headers file")?;
        let status: u16 = status_line
            .split_whitespace()
            .nth(1)
            .context("no status")?
            .parse()?;
        let headers = lines
            .filter_map(|line| line.split_once(':'))
            .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_owned()))
            .filter(|(name, _)| name == "content-type" || name.starts_with("retry-after"))
            .collect();
        Ok(Reply::Status {
            status,
            headers,
            body,
        })
    }

    /// The same reply with its `retry-after*` headers replaced by `retry-after-ms: ms`.
    pub fn with_retry_after_ms(self, ms: u64) -> Reply {
        match self {
            Reply::Status {
                status,
                mut headers,
                body,
            } => {
                headers.retain(|(name, _)| !name.starts_with("retry-after"));
                headers.push(("retry-after-ms".to_owned(), ms.to_string()));
                Reply::Status {
                    status,
                    headers,
                    body,
                }
            }
            other => other,
        }
    }

    /// A JSON error reply.
    pub fn json(status: u16, body: &str) -> Reply {
        Reply::Status {
            status,
            headers: vec![("content-type".to_owned(), "application/json".to_owned())],
            body: body.as_bytes().to_vec(),
        }
    }
}

/// One request as the server saw it.
#[derive(Clone, Debug)]
pub struct Captured {
    /// e.g. `POST /v1/chat/completions`.
    pub request_line: String,
    /// Lower-cased names.
    pub headers: Vec<(String, String)>,
    /// The body, parsed.
    pub body: serde_json::Value,
}

impl Captured {
    /// A header's value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// The running server.
pub struct FixtureServer {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    captured: Arc<Mutex<Vec<Captured>>>,
}

impl FixtureServer {
    /// Serves `replies` in order, one per connection; past the end it answers 500.
    pub async fn start(replies: Vec<Reply>) -> Result<FixtureServer> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let captured = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&captured);
        tokio::spawn(async move {
            let mut replies = replies.into_iter();
            while let Ok((socket, _)) = listener.accept().await {
                let reply = replies.next().unwrap_or_else(|| {
                    Reply::json(500, r#"{"error":{"message":"no more fixture replies"}}"#)
                });
                let log = Arc::clone(&log);
                tokio::spawn(async move {
                    // A failed connection shows up in the test as the client's error.
                    let _ = serve(socket, reply, log).await;
                });
            }
        });
        Ok(FixtureServer { url, captured })
    }

    /// The requests served so far.
    pub fn requests(&self) -> Vec<Captured> {
        self.captured
            .lock()
            .map(|list| list.clone())
            .unwrap_or_default()
    }
}

async fn serve(mut socket: TcpStream, reply: Reply, log: Arc<Mutex<Vec<Captured>>>) -> Result<()> {
    let mut buffer = Vec::new();
    let header_end = loop {
        let mut chunk = [0u8; 4096];
        let n = socket.read(&mut chunk).await?;
        if n == 0 {
            bail!("connection closed before the request ended");
        }
        buffer.extend_from_slice(&chunk[..n]);
        if let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
    };
    let head = String::from_utf8_lossy(&buffer[..header_end]).to_string();
    let mut lines = head.split("\r\n");
    let request_line = lines.next().unwrap_or_default().to_owned();
    let headers: Vec<(String, String)> = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_owned()))
        .collect();
    let length: usize = headers
        .iter()
        .find(|(name, _)| name == "content-length")
        .and_then(|(_, value)| value.parse().ok())
        .unwrap_or(0);
    while buffer.len() < header_end + length {
        let mut chunk = [0u8; 4096];
        let n = socket.read(&mut chunk).await?;
        if n == 0 {
            bail!("connection closed mid-body");
        }
        buffer.extend_from_slice(&chunk[..n]);
    }
    let body = serde_json::from_slice(&buffer[header_end..header_end + length])
        .unwrap_or(serde_json::Value::Null);
    if let Ok(mut list) = log.lock() {
        list.push(Captured {
            request_line,
            headers,
            body,
        });
    }

    match reply {
        Reply::Status {
            status,
            headers,
            body,
        } => {
            let mut head = format!(
                "HTTP/1.1 {status} Status\r\ncontent-length: {}\r\nconnection: close\r\n",
                body.len()
            );
            for (name, value) in headers {
                head.push_str(&format!("{name}: {value}\r\n"));
            }
            head.push_str("\r\n");
            socket.write_all(head.as_bytes()).await?;
            socket.write_all(&body).await?;
        }
        Reply::Sse { events, drop_after } => {
            socket
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\ncache-control: no-cache\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n")
                .await?;
            for (i, event) in events.iter().enumerate() {
                if drop_after == Some(i) {
                    socket.flush().await?;
                    return Ok(()); // closed without the final chunk
                }
                socket
                    .write_all(format!("{:x}\r\n", event.len()).as_bytes())
                    .await?;
                socket.write_all(event).await?;
                socket.write_all(b"\r\n").await?;
                socket.flush().await?;
            }
            socket.write_all(b"0\r\n\r\n").await?;
        }
    }
    socket.flush().await?;
    socket.shutdown().await?;
    Ok(())
}
