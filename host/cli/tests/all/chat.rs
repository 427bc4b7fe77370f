//! `corral chat` as a person runs it: the real binary on a terminal-like pipe, the embedded
//! store in a temporary folder, a scripted model, and a webhook backend on a real socket that
//! counts the calls. Interrupted at the approval prompt (end of input, or Ctrl-C), a later
//! `corral chat --session ID` over the same store asks the same question, and the approved
//! script runs exactly once.

use std::io::Write as _;
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::common;

/// The script the scripted model writes, and the model's last words.
const SCRIPT: &str =
    "const order = await tools.shop.orders.cancel({id: 'A-7'}); return order.status;";
const ANSWER: &str = "Order A-7 is cancelled.";

/// A webhook backend that answers `shop.orders.cancel` and counts the calls it received.
fn webhook(calls: Arc<AtomicU32>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}/", listener.local_addr().expect("addr"));
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let Some(request) = common::read_json_request(&mut stream) else {
                continue;
            };
            if request["capability_id"] == "shop.orders.cancel" {
                calls.fetch_add(1, Ordering::SeqCst);
            }
            common::reply_json(
                &mut stream,
                &json!({"ok": true, "output": {"id": request["input"][0]["id"], "status": "cancelled"}}),
            );
        }
    });
    url
}

/// A running `corral chat` whose stderr is collected as it arrives (prompts end without a
/// newline, so it is read in chunks, not lines).
struct Chat {
    child: Child,
    stderr: Arc<Mutex<String>>,
    stdout: Arc<Mutex<String>>,
    /// The threads reading stderr and stdout: they end at the pipes' end.
    readers: Vec<std::thread::JoinHandle<()>>,
}

/// Collects what `from` gives, as it arrives, on a thread of its own (returned: joining it
/// waits until the pipe is closed and read to its end).
fn collect(
    mut from: impl std::io::Read + Send + 'static,
) -> (Arc<Mutex<String>>, std::thread::JoinHandle<()>) {
    let text = Arc::new(Mutex::new(String::new()));
    let sink = Arc::clone(&text);
    let reader = std::thread::spawn(move || {
        let mut chunk = [0u8; 1024];
        loop {
            match from.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if let Ok(mut text) = sink.lock() {
                        text.push_str(&String::from_utf8_lossy(&chunk[..n]));
                    }
                }
            }
        }
    });
    (text, reader)
}

impl Chat {
    /// `corral chat` on `dir`'s scripted replies and store, with `args` after those.
    fn spawn<S: AsRef<std::ffi::OsStr>>(dir: &Path, args: &[S]) -> Chat {
        let child = Command::new(env!("CARGO_BIN_EXE_corral"))
            .arg("chat")
            .arg("--model")
            .arg(format!("scripted:{}", dir.join("replies.json").display()))
            .arg("--store")
            .arg(dir.join("chat.db"))
            .args(args)
            .current_dir(dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("corral chat starts");
        Chat::watch(child)
    }

    /// Session `s1` over `dir`'s catalog, its webhook at `backend_url`.
    fn start(dir: &Path, backend_url: &str) -> Chat {
        let catalog = dir.join("catalog.json");
        let args = [
            "--catalog".as_ref(),
            catalog.as_os_str(),
            "--backend-url".as_ref(),
            backend_url.as_ref(),
            "--session".as_ref(),
            "s1".as_ref(),
        ];
        Chat::spawn(dir, &args)
    }

    /// Collects the stderr and stdout of a started `corral chat`.
    fn watch(mut child: Child) -> Chat {
        let (stderr, stderr_reader) = collect(child.stderr.take().expect("stderr"));
        let (stdout, stdout_reader) = collect(child.stdout.take().expect("stdout"));
        Chat {
            child,
            stderr,
            stdout,
            readers: vec![stderr_reader, stdout_reader],
        }
    }

    fn type_line(&mut self, line: &str) {
        let stdin = self.child.stdin.as_mut().expect("stdin open");
        stdin
            .write_all(format!("{line}\n").as_bytes())
            .expect("type a line");
        stdin.flush().expect("flush");
    }

    fn stderr(&self) -> String {
        self.stderr.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Waits until stderr contains `text` `times` times.
    fn wait_for(&self, text: &str, times: usize) {
        let started = Instant::now();
        while self.stderr().matches(text).count() < times {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "corral chat never printed {text:?} ({times}x); stderr so far:\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Closes stdin and waits; returns the exit code, stdout and stderr.
    fn finish(mut self) -> (Option<i32>, String, String) {
        drop(self.child.stdin.take());
        let status = self.child.wait().expect("corral chat exits");
        // The pipes are closed with the process: the readers end once they have read it all.
        for reader in self.readers.drain(..) {
            reader.join().expect("a pipe reader");
        }
        let stdout = self.stdout.lock().map(|s| s.clone()).unwrap_or_default();
        (status.code(), stdout, self.stderr())
    }
}

fn setup() -> (tempfile::TempDir, String, Arc<AtomicU32>) {
    let dir = tempfile::tempdir().expect("temp dir");
    let replies = json!([
        {"toolCalls": [{"name": "run_js", "arguments": {"code": SCRIPT}}]},
        {"text": ANSWER}
    ]);
    std::fs::write(dir.path().join("replies.json"), replies.to_string()).expect("replies");
    let catalog = json!({"capabilities": [{
        "id": "shop.orders.cancel",
        "description": "Cancels an order.",
        "input_schema": {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]}
    }]});
    std::fs::write(dir.path().join("catalog.json"), catalog.to_string()).expect("catalog");
    let calls = Arc::new(AtomicU32::new(0));
    let url = webhook(Arc::clone(&calls));
    (dir, url, calls)
}

const PROMPT: &str = "approve? [y/N]";
const SHOWN: &str = "tools.shop.orders.cancel({id: 'A-7'})";

/// Answers the pending approval in a second process and checks it ran once.
fn approve_later(dir: &Path, url: &str, calls: &AtomicU32) {
    let mut later = Chat::start(dir, url);
    // The same question, before any new message is asked for.
    later.wait_for(PROMPT, 1);
    assert!(
        later.stderr().contains(SHOWN),
        "not the same script:\n{}",
        later.stderr()
    );
    later.type_line("y");
    later.wait_for("you> ", 1);
    let (code, stdout, stderr) = later.finish();
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stdout.contains(ANSWER),
        "stdout: {stdout}\nstderr: {stderr}"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1, "{stderr}");

    // Nothing is pending any more: a third start asks for a message, not an approval.
    let third = Chat::start(dir, url);
    third.wait_for("you> ", 1);
    let (code, _, stderr) = third.finish();
    assert_eq!(code, Some(0), "{stderr}");
    assert!(!stderr.contains(PROMPT), "asked again:\n{stderr}");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[test]
fn end_of_input_at_the_prompt_leaves_the_approval_for_the_next_chat() {
    let (dir, url, calls) = setup();
    let mut first = Chat::start(dir.path(), &url);
    first.wait_for("you> ", 1);
    first.type_line("cancel order A-7");
    first.wait_for(PROMPT, 1);
    assert!(first.stderr().contains(SHOWN), "{}", first.stderr());
    let (code, _, stderr) = first.finish();
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.contains("left pending"), "{stderr}");
    assert_eq!(calls.load(Ordering::SeqCst), 0, "ran before approval");
    approve_later(dir.path(), &url, &calls);
}

#[test]
fn ctrl_c_at_the_prompt_ends_the_chat_and_keeps_the_approval() {
    let (dir, url, calls) = setup();
    let mut first = Chat::start(dir.path(), &url);
    first.wait_for("you> ", 1);
    first.type_line("cancel order A-7");
    first.wait_for(PROMPT, 1);
    let status = Command::new("kill")
        .args(["-INT", &first.child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success());
    let status = first.child.wait().expect("exits");
    assert_eq!(status.code(), Some(130), "{}", first.stderr());
    first.wait_for("interrupted; continue with: corral chat --session s1", 1);
    assert_eq!(calls.load(Ordering::SeqCst), 0, "ran before approval");
    approve_later(dir.path(), &url, &calls);
}

/// Results that fit, under `corral chat`: the first script's 20,000 rows reach the model cut
/// to `--result-tokens`, and the second script reads them whole with `tools.$result`.
#[test]
fn a_cut_result_is_read_whole_by_the_next_script() {
    let dir = tempfile::tempdir().expect("temp dir");
    let rows = "return Array.from({length: 20000}, (_, i) => ({id: i, name: `row ${i}`}));";
    let pick = "const rows = await tools.$result({id: 's0t0'}); \
                return {count: rows.length, picked: rows.filter(r => r.id % 5000 === 0).map(r => r.id)};";
    let replies = json!([
        {"toolCalls": [{"name": "run_js", "arguments": {"code": rows}}]},
        {"toolCalls": [{"name": "run_js", "arguments": {"code": pick}}]},
        {"text": "There are 20000 rows."}
    ]);
    std::fs::write(dir.path().join("replies.json"), replies.to_string()).expect("replies");
    let mut chat = Chat::spawn(dir.path(), &["--auto-confirm", "--result-tokens", "300"]);
    chat.wait_for("you> ", 1);
    chat.type_line("how many rows?");
    chat.wait_for("you> ", 2);
    let (code, stdout, stderr) = chat.finish();
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stdout.contains("There are 20000 rows."),
        "{stdout}\n{stderr}"
    );
    assert!(stderr.contains("(cut to fit from "), "{stderr}");
    assert!(
        stderr.contains(r#"{"count":20000,"picked":[0,5000,10000,15000]}"#),
        "{stderr}"
    );
}

/// Discovery and pre-flight, under `corral chat`: with `--discovery-tokens 0` the model finds
/// `shop.orders.cancel` with `tools.$search` and calls it; its next script names a tool that
/// does not exist after a real call, and pre-flight stops it before that call reaches the
/// webhook, showing the model the path and the nearest name.
#[test]
fn a_tool_found_by_search_is_called_and_a_mistyped_one_never_runs() {
    let (dir, url, calls) = setup();
    let find = "const [hit] = await tools.$search({query: 'cancel order'}); \
                const done = await tools[hit.id]({id: 'A-7'}); return hit.id + ' ' + done.status;";
    let typo = "await tools.shop.orders.cancel({id: 'B-1'});\nreturn tools.shop.order.cancel({id: 'B-2'});";
    let replies = json!([
        {"toolCalls": [{"name": "run_js", "arguments": {"code": find}}]},
        {"toolCalls": [{"name": "run_js", "arguments": {"code": typo}}]},
        {"text": ANSWER}
    ]);
    std::fs::write(dir.path().join("replies.json"), replies.to_string()).expect("replies");
    let catalog = dir.path().join("catalog.json");
    let args = [
        "--catalog".as_ref(),
        catalog.as_os_str(),
        "--backend-url".as_ref(),
        url.as_ref(),
        "--auto-confirm".as_ref(),
        "--discovery-tokens".as_ref(),
        "0".as_ref(),
    ];
    let mut chat = Chat::spawn(dir.path(), &args);
    chat.wait_for("you> ", 1);
    chat.type_line("cancel order A-7");
    chat.wait_for("you> ", 2);
    let (code, stdout, stderr) = chat.finish();
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains(ANSWER), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("shop.orders.cancel cancelled"),
        "the found tool was not called:\n{stderr}"
    );
    assert!(
        stderr.contains("preflight_error") && stderr.contains("did you mean `shop.orders.cancel`?"),
        "{stderr}"
    );
    // A-7 through discovery; B-1 never ran, its script stopped before it started.
    assert_eq!(calls.load(Ordering::SeqCst), 1, "{stderr}");
}
