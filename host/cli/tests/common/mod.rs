//! Pieces shared by the tests of both binaries (`all` and `slow`) and the examples: a minimal
//! blocking HTTP/1.1 exchange for the webhook backends they serve (one JSON request per
//! connection, one JSON reply), and the address a `corral serve` child listens on; for the tests,
//! `process` (the `corral` command, a `corral serve` child, the MCP test servers).

#![allow(dead_code)]

#[cfg(test)]
mod process;
#[cfg(test)]
pub use process::*;

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::TcpStream;
use std::process::Child;

use serde_json::Value;

/// Reads one request and returns its JSON body (`None` if the peer went away or it is not
/// JSON).
pub fn read_json_request(stream: &mut TcpStream) -> Option<Value> {
    let (_, body) = read_request(stream)?;
    serde_json::from_slice(&body).ok()
}

/// Reads one HTTP request: its head (lowercased) and its body's bytes.
pub fn read_request(stream: &mut TcpStream) -> Option<(String, Vec<u8>)> {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = stream.read(&mut chunk).ok()?;
        if n == 0 {
            return None;
        }
        buffer.extend_from_slice(&chunk[..n]);
        let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") else {
            continue;
        };
        let head = String::from_utf8_lossy(&buffer[..end]).to_lowercase();
        let length = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse::<usize>().ok())
            .unwrap_or(0);
        if buffer.len() >= end + 4 + length {
            return Some((head, buffer[end + 4..end + 4 + length].to_vec()));
        }
    }
}

/// Answers `200 OK` with `body` as JSON and closes.
pub fn reply_json(stream: &mut TcpStream, body: &Value) {
    let body = body.to_string();
    let response = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(response.as_bytes());
}

/// The address a child `corral serve` prints (`listening on ADDRESS`), read from its piped
/// stdout, which is then drained on a thread so the child never blocks on it; `None` when the
/// child ended its output first.
pub fn listening_address(child: &mut Child) -> Option<String> {
    let mut lines = BufReader::new(child.stdout.take()?).lines();
    let address = loop {
        let line = lines.next()?.ok()?;
        if let Some(address) = line.strip_prefix("listening on ") {
            break address.trim().to_owned();
        }
    };
    std::thread::spawn(move || for _ in lines {});
    Some(address)
}
