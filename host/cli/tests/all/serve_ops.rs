//! Operability of real `corral` processes: tokens reloaded on SIGHUP (and kept when the new
//! file is bad), JSON logs with the request id, no colour codes off a terminal, and one
//! log-level variable (`CORRAL_LOG`, falling back to `RUST_LOG`) for `serve` and `exec`.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::{self, node_modules, testkit_script};

const OLD: &str = "operator-token-old-000001";
const NEW: &str = "operator-token-new-000001";

/// A bound only a broken process reaches.
const PATIENCE: Duration = Duration::from_secs(60);

fn write_config(path: &Path, store: &Path, token: &str) {
    std::fs::write(
        path,
        format!(
            "listen = \"127.0.0.1:0\"\nstore = \"sqlite:{}\"\n[[tokens]]\ntoken = \"{token}\"\n\
             role = \"application\"\n",
            store.display()
        ),
    )
    .expect("config");
}

/// A `corral serve` child, its address, and its stderr lines as they come.
struct Serve {
    child: Child,
    address: String,
    stderr: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Serve {
    fn start(config: &Path, env: &[(&str, &str)]) -> Serve {
        let mut child = Command::new(env!("CARGO_BIN_EXE_corral"))
            .arg("serve")
            .arg("--config")
            .arg(config)
            .env_remove("CORRAL_LOG")
            .env_remove("RUST_LOG")
            .env_remove("CORRAL_LOG_FORMAT")
            .envs(env.iter().copied())
            .env("CORRAL_TURN_ENGINE", "script")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("corral serve starts");
        let stderr = child.stderr.take().expect("stderr");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        let address = common::listening_address(&mut child).expect("listens");
        let address = address.trim_start_matches("http://").to_owned();
        Serve {
            child,
            address,
            stderr: rx,
            seen: Vec::new(),
        }
    }

    /// Waits for a stderr line that satisfies `wanted`; returns it.
    fn wait_line(&mut self, what: &str, wanted: impl Fn(&str) -> bool) -> String {
        if let Some(line) = self.seen.iter().find(|l| wanted(l)) {
            return line.clone();
        }
        let deadline = Instant::now() + PATIENCE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.stderr.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if wanted(&line) {
                        return line;
                    }
                }
                Err(_) => panic!("no stderr line {what}; saw:\n{}", self.seen.join("\n")),
            }
        }
    }

    fn hangup(&self) {
        let status = Command::new("kill")
            .args(["-HUP", &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
    }

    /// `GET path` on a fresh connection: status, response head, body.
    fn get(&self, path: &str, headers: &[(&str, &str)]) -> (u16, String, String) {
        let mut stream = TcpStream::connect(&self.address).expect("connect");
        let mut request = format!("GET {path} HTTP/1.1\r\nHost: corral\r\nConnection: close\r\n");
        for (name, value) in headers {
            request.push_str(&format!("{name}: {value}\r\n"));
        }
        request.push_str("\r\n");
        stream.write_all(request.as_bytes()).expect("send");
        let mut answer = String::new();
        stream.read_to_string(&mut answer).expect("answer");
        let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
        let status = head
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        (status, head.to_ascii_lowercase(), body.to_owned())
    }

    fn agents(&self, token: &str) -> u16 {
        let bearer = format!("Bearer {token}");
        self.get("/v1/agents", &[("Authorization", &bearer)]).0
    }
}

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines()
        .find_map(|line| line.strip_prefix(&format!("{name}: ")))
}

#[test]
fn sighup_reloads_tokens_and_keeps_them_when_the_file_is_bad() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("serve.toml");
    let store = dir.path().join("corral.db");
    write_config(&config, &store, OLD);
    let mut serve = Serve::start(
        &config,
        &[("CORRAL_LOG", "info"), ("CORRAL_LOG_FORMAT", "json")],
    );
    assert_eq!(serve.agents(OLD), 200);
    assert_eq!(serve.agents(NEW), 401);

    // The new file: NEW replaces OLD.
    write_config(&config, &store, NEW);
    serve.hangup();
    serve.wait_line("saying the tokens were reloaded", |l| {
        l.contains("tokens reloaded")
    });
    assert_eq!(serve.agents(NEW), 200);
    assert_eq!(serve.agents(OLD), 401);

    // A file that does not validate changes nothing, and the log says why.
    std::fs::write(
        &config,
        "store = \"sqlite:x\"\n[[tokens]]\ntoken = \"short\"\nrole = \"application\"\n",
    )
    .expect("bad config");
    serve.hangup();
    let line = serve.wait_line("saying the file was refused", |l| {
        l.contains("keeping the current tokens")
    });
    assert!(line.contains("tokens[0].token"), "{line}");
    assert_eq!(serve.agents(NEW), 200);
    assert_eq!(serve.agents(OLD), 401);

    // Every line is one JSON object, without colour codes.
    for line in &serve.seen {
        let value: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert!(value["level"].is_string(), "{line}");
        assert!(!line.contains('\u{1b}'), "{line}");
    }
}

#[test]
fn request_ids_are_echoed_and_logged_in_json() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("serve.toml");
    write_config(&config, &dir.path().join("corral.db"), OLD);
    // The format from the configuration file this time.
    let text = std::fs::read_to_string(&config).expect("read");
    std::fs::write(&config, format!("logFormat = \"json\"\n{text}")).expect("write");
    let mut serve = Serve::start(&config, &[("CORRAL_LOG", "info")]);

    // A client's id is kept, echoed, and on the request's log line.
    let (status, head, _) = serve.get("/health", &[("X-Request-Id", "ops-test-42")]);
    assert_eq!(status, 200);
    assert_eq!(header(&head, "x-request-id"), Some("ops-test-42"));
    let line = serve.wait_line("with the request id", |l| l.contains("ops-test-42"));
    let value: Value = serde_json::from_str(&line).expect("json");
    assert_eq!(value["span"]["request_id"], "ops-test-42", "{line}");
    assert_eq!(value["span"]["path"], "/health", "{line}");

    // Errors carry one too; a missing or unacceptable id is replaced by a generated one.
    let too_long = "x".repeat(129);
    for sent in [None, Some("has space"), Some(too_long.as_str())] {
        let headers: Vec<(&str, &str)> = sent.iter().map(|id| ("X-Request-Id", *id)).collect();
        let (status, head, body) = serve.get("/v1/nowhere", &headers);
        assert_eq!(status, 404, "{body}");
        let id = header(&head, "x-request-id").expect("an id").to_owned();
        assert_eq!(id.len(), 36, "a UUID: {id}");
        assert_ne!(Some(id.as_str()), sent);
        serve.wait_line("with the generated id", |l| l.contains(&id));
    }
    // Operators' routes too.
    let bearer = format!("Bearer {OLD}");
    let (status, head, _) = serve.get(
        "/v1/agents",
        &[("Authorization", &bearer), ("X-Request-Id", "agents-1")],
    );
    assert_eq!(status, 200);
    assert_eq!(header(&head, "x-request-id"), Some("agents-1"));
}

#[test]
fn text_logs_have_no_colour_off_a_terminal_and_rust_log_is_the_fallback() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("serve.toml");
    write_config(&config, &dir.path().join("corral.db"), OLD);
    let mut serve = Serve::start(&config, &[("RUST_LOG", "info")]);
    serve.get("/health", &[("X-Request-Id", "plain-1")]);
    let line = serve.wait_line("with the request id", |l| l.contains("plain-1"));
    assert!(line.contains("request_id=plain-1"), "{line}");
    assert!(
        serde_json::from_str::<Value>(&line).is_err(),
        "text, not JSON: {line}"
    );
    for line in &serve.seen {
        assert!(!line.contains('\u{1b}'), "a colour code: {line:?}");
    }
    // CORRAL_LOG wins over RUST_LOG: at `error`, a served request writes nothing.
    let mut quiet = Serve::start(
        &config_copy(&dir, &config),
        &[("RUST_LOG", "info"), ("CORRAL_LOG", "error")],
    );
    quiet.get("/health", &[("X-Request-Id", "quiet-1")]);
    quiet.hangup(); // an info line of its own, also filtered out
    assert_eq!(quiet.agents(OLD), 200);
    let _ = quiet.child.kill();
    let _ = quiet.child.wait();
    // Every line the process wrote (the reader ends at the pipe's end).
    let rest: Vec<String> = quiet.stderr.iter().collect();
    assert!(
        !rest
            .iter()
            .any(|l| l.contains("quiet-1") || l.contains("reloaded")),
        "{rest:?}"
    );
}

/// A second configuration with its own store (two servers may not share an embedded store).
fn config_copy(dir: &tempfile::TempDir, config: &Path) -> PathBuf {
    let copy = dir.path().join("second.toml");
    let text = std::fs::read_to_string(config).expect("read");
    let store = dir.path().join("second.db");
    std::fs::write(
        &copy,
        text.replace(
            &dir.path().join("corral.db").display().to_string(),
            &store.display().to_string(),
        ),
    )
    .expect("write");
    copy
}

/// `corral exec` with the test MCP server and `env`: its stderr.
fn exec_stderr(env: &[(&str, &str)]) -> String {
    let server = format!("kit=node {}", testkit_script());
    let modules = node_modules();
    let mut child = Command::new(env!("CARGO_BIN_EXE_corral"))
        .args(["exec", "-", "--mcp", &server])
        .env_remove("CORRAL_LOG")
        .env_remove("RUST_LOG")
        .env_remove("CORRAL_LOG_FORMAT")
        .env("CORRAL_MCP_NODE_MODULES", &modules)
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("corral exec");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(b"return 1;")
        .expect("script");
    let output = child.wait_with_output().expect("exec ends");
    assert!(output.status.success(), "{output:?}");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn exec_reads_the_same_log_variables() {
    // Default: MCP servers' warnings only.
    let quiet = exec_stderr(&[]);
    assert!(!quiet.contains("MCP server initialized"), "{quiet}");
    // CORRAL_LOG and CORRAL_LOG_FORMAT, as for serve.
    let json = exec_stderr(&[
        ("CORRAL_LOG", "corral_mcp=info"),
        ("CORRAL_LOG_FORMAT", "json"),
    ]);
    let line = json
        .lines()
        .find(|l| l.contains("MCP server initialized"))
        .unwrap_or_else(|| panic!("{json}"));
    let value: Value = serde_json::from_str(line).expect("json");
    assert_eq!(value["fields"]["server"], "kit", "{line}");
    // RUST_LOG as the fallback, in text without colour codes.
    let text = exec_stderr(&[("RUST_LOG", "corral_mcp=info")]);
    assert!(text.contains("MCP server initialized"), "{text}");
    assert!(!text.contains('\u{1b}'), "{text:?}");
}
