//! `corral serve`'s wire contract, checked from outside against a real server process: the
//! OpenAPI document it serves validates as OpenAPI 3.1 (openapi-spec-validator), and a
//! property-based API tester driven only by that document (schemathesis, every check on) finds no
//! 5xx, no undocumented status, no response outside its schema, no schema-invalid request
//! accepted and no schema-valid request refused. Both tools come from PyPI through
//! `host/server/tests/install-api-tools.sh` (scripts/test runs it); this test does not skip
//! without them.

#![cfg(unix)]

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{Server, repo_root};

const OPERATOR: &str = "contract-operator-token-0001";

/// A tool of the API tools' environment: `$CORRAL_API_TOOLS/bin/NAME`, by default
/// `target/python-tools/bin/NAME`.
fn tool(name: &str) -> PathBuf {
    let tools = match std::env::var_os("CORRAL_API_TOOLS") {
        Some(path) => PathBuf::from(path),
        None => repo_root().join("target/python-tools"),
    };
    let path = tools.join("bin").join(name);
    assert!(
        path.exists(),
        "{name} not found at {}: run host/server/tests/install-api-tools.sh (or set \
         CORRAL_API_TOOLS to a Python environment that has schemathesis and \
         openapi-spec-validator). This test does not skip without it.",
        path.display()
    );
    path
}

fn serve(dir: &Path) -> Server {
    let config = dir.join("serve.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:0\"\nstore = \"sqlite:{}\"\n[[tokens]]\ntoken = \"{OPERATOR}\"\n\
             role = \"application\"\n",
            dir.join("corral.db").display()
        ),
    )
    .expect("config");
    Server::start(&config, &dir.join("serve.stderr"))
}

/// `GET path` over a fresh connection; the body.
fn get(address: &str, path: &str) -> String {
    let mut stream = TcpStream::connect(address).expect("connect");
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nhost: {address}\r\nconnection: close\r\n\r\n"
    )
    .expect("send");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("read");
    let (head, body) = response.split_once("\r\n\r\n").expect("a response");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    body.to_owned()
}

/// Runs `command` to its end within `limit`; its exit status and output.
fn run(mut command: Command, limit: Duration) -> (bool, String) {
    let output_path = tempfile::NamedTempFile::new().expect("temp file");
    let output = output_path.reopen().expect("reopen");
    let mut child = command
        .stdin(Stdio::null())
        .stdout(output.try_clone().expect("clone"))
        .stderr(output)
        .spawn()
        .expect("the tool starts");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break Some(status);
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let text = std::fs::read_to_string(output_path.path()).unwrap_or_default();
    match status {
        Some(status) => (status.success(), text),
        None => (false, format!("timed out after {limit:?}\n{text}")),
    }
}

#[test]
fn the_served_document_is_openapi_3_1_and_the_server_keeps_it() {
    let (validator, schemathesis) = (tool("openapi-spec-validator"), tool("schemathesis"));
    let dir = tempfile::tempdir().expect("tempdir");
    let server = serve(dir.path());
    let address = server.base.trim_start_matches("http://").to_owned();

    // 1. The document is valid OpenAPI 3.1.
    let document = get(&address, "/v1/openapi.json");
    let file = dir.path().join("openapi.json");
    std::fs::write(&file, &document).expect("write");
    let mut command = Command::new(validator);
    command.arg("--schema").arg("3.1").arg(&file);
    let (ok, output) = run(command, Duration::from_secs(120));
    assert!(ok, "the document is not valid OpenAPI 3.1:\n{output}");

    // 2. The property-based tester, driven only by the document, finds nothing. Bounded: a few
    // cases per operation and a time budget.
    let mut command = Command::new(schemathesis);
    command
        .arg("--config-file")
        .arg(repo_root().join("host/cli/tests/serve_contract.toml"))
        .arg("run")
        .arg(format!("{}/v1/openapi.json", server.base))
        .args(["--checks", "all"])
        .args(["--max-examples", "25"])
        .args(["--max-time", "60"])
        .args(["--phases", "examples,coverage,fuzzing"])
        .arg("--header")
        .arg(format!("Authorization: Bearer {OPERATOR}"))
        .args(["--report", "junit"])
        .arg("--report-dir")
        .arg(dir.path().join("report"))
        .arg("--no-color")
        .env("SCHEMATHESIS_HOOKS", "")
        .current_dir(dir.path());
    let (ok, output) = run(command, Duration::from_secs(300));
    assert!(ok, "schemathesis found problems:\n{output}");
}
