//! The test binaries' side of `common`: the `corral` command of this build, a `corral serve`
//! child, the MCP test servers and free ports. (Only in tests: `CARGO_BIN_EXE_corral` exists
//! only for them; the examples include `common` for its HTTP pieces.)

use std::io::Write as _;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use super::{listening_address, read_json_request, reply_json};

/// The repository's root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A `corral` command of this build.
pub fn corral() -> Command {
    Command::new(env!("CARGO_BIN_EXE_corral"))
}

/// Runs `command` with piped stdio, writes `stdin` (if any) and closes it; its output.
pub fn run(mut command: Command, stdin: Option<&[u8]>) -> Output {
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("corral starts");
    if let Some(input) = stdin {
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(input)
            .expect("write stdin");
    }
    drop(child.stdin.take());
    child.wait_with_output().expect("corral finishes")
}

/// A report `corral exec` printed: its stdout as one JSON object.
pub fn report(output: &Output) -> Value {
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not one JSON object ({e}): {}\nstderr: {}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
    })
}

/// `corral serve --config CONFIG`, to be started with [`Server::spawn`].
pub fn serve(config: &Path) -> Command {
    let mut command = corral();
    command.arg("serve").arg("--config").arg(config);
    command
}

/// A `corral serve` child and the address it listens on; killed (SIGKILL) and reaped when
/// dropped.
pub struct Server {
    pub child: Child,
    pub base: String,
}

impl Server {
    /// `corral serve --config CONFIG`, its stderr appended to the file `stderr`.
    pub fn start(config: &Path, stderr: &Path) -> Server {
        Server::spawn(serve(config), stderr)
    }

    /// Starts `command` (a `corral serve` with its arguments and environment), its stderr
    /// appended to the file `stderr`, and waits until it listens.
    pub fn spawn(mut command: Command, stderr: &Path) -> Server {
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(stderr)
                    .map(Stdio::from)
                    .expect("stderr file"),
            )
            .spawn()
            .expect("corral serve starts");
        let base = listening_address(&mut child).unwrap_or_else(|| {
            panic!(
                "corral serve exited before listening ({}): {}",
                stderr.display(),
                std::fs::read_to_string(stderr).unwrap_or_default()
            )
        });
        Server { child, base }
    }

    /// SIGKILL, and waits for the process to end.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// A port no socket was bound to a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// The npm packages of the MCP test servers (`host/mcp/tests/install-servers.sh`); the tests
/// fail rather than skip without them.
pub fn node_modules() -> PathBuf {
    let path = repo_root().join("target/node-tools/mcp/node_modules");
    assert!(
        path.join("@modelcontextprotocol/sdk").exists(),
        "the MCP test servers are not installed in {}: run `bash host/mcp/tests/install-servers.sh` \
         (scripts/test does). These tests do not skip without them.",
        path.display()
    );
    path
}

/// The filesystem MCP server's script.
pub fn filesystem_server() -> PathBuf {
    let path = node_modules().join("@modelcontextprotocol/server-filesystem/dist/index.js");
    assert!(path.exists(), "{} is missing", path.display());
    path
}

/// The MCP test server of corral-mcp's tests (`host/mcp/tests/servers/testkit.mjs`).
pub fn testkit_script() -> String {
    repo_root()
        .join("host/mcp/tests/servers/testkit.mjs")
        .display()
        .to_string()
}

/// The test MCP server as an agent's `mcpServers` entry named `kit`, run with `args`.
pub fn testkit_server(args: &[&str]) -> Value {
    let mut argv = vec![testkit_script()];
    argv.extend(args.iter().map(|a| a.to_string()));
    json!({"name": "kit", "command": "node", "args": argv,
           "env": {"CORRAL_MCP_NODE_MODULES": node_modules().display().to_string()}})
}

/// Checks what a [`logging_webhook`] logged: no effect was performed twice, and each performed
/// call names one of `effect_ids` (the chat runtime gives backends the journal's effect id as
/// the call id, so the count is per effect, not per attempt). A log never written holds nothing.
pub fn assert_each_logged_effect_once(log: &Path, effect_ids: &std::collections::HashSet<String>) {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut counts: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for line in text.lines() {
        *counts.entry(line).or_default() += 1;
    }
    let twice: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        twice.is_empty(),
        "effects performed more than once: {twice:?}"
    );
    let strangers: Vec<_> = counts
        .keys()
        .filter(|id| !effect_ids.contains(**id))
        .collect();
    assert!(
        strangers.is_empty(),
        "performed calls that are no journal effect: {strangers:?}"
    );
}

/// The crash loops' webhook: appends (and syncs) each call's `tool_call_id` to `log` before it
/// performs it (waits `ms`, 20 by default), then answers `{"n": n}`; its URL.
pub fn logging_webhook(log: PathBuf) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}/", listener.local_addr().expect("addr"));
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let log = log.clone();
            std::thread::spawn(move || {
                let Some(request) = read_json_request(&mut stream) else {
                    return;
                };
                if let Ok(mut file) = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&log)
                {
                    // One write per line (see `corral_server::script`): concurrent calls
                    // must not interleave their ids and newlines.
                    let line = format!("{}\n", request["tool_call_id"].as_str().unwrap_or("?"));
                    let _ = file.write_all(line.as_bytes());
                    let _ = file.sync_data();
                }
                let input = &request["input"][0];
                std::thread::sleep(Duration::from_millis(input["ms"].as_u64().unwrap_or(20)));
                reply_json(
                    &mut stream,
                    &json!({"ok": true, "output": {"n": input["n"]}}),
                );
            });
        }
    });
    url
}

/// A small xorshift generator: reproducible from its seed (the crash loops print it first).
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// `method path` on `base` with `token` and a JSON `body`: the status and the body as JSON (or
/// as a string when it is not JSON).
pub async fn call(
    token: &str,
    base: &str,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut request = reqwest::Client::new()
        .request(method, format!("{base}{path}"))
        .bearer_auth(token)
        .timeout(Duration::from_secs(10));
    if let Some(body) = body {
        request = request
            .header("content-type", "application/json")
            .body(body.to_string());
    }
    let response = request.send().await.expect("request");
    let status = response.status().as_u16();
    let text = response.text().await.expect("body");
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}
