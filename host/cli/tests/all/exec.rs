//! `corral exec` as a user runs it: the real binary, real files, stdin, exit statuses, and a
//! webhook backend served over a real socket.

use std::io::Write as _;
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::sync::Mutex;

use crate::common::{self, report};

fn corral(args: &[&str], stdin: Option<&[u8]>) -> Output {
    let mut command = common::corral();
    command.args(args);
    common::run(command, stdin)
}

fn script_file(text: &str) -> tempfile::NamedTempFile {
    let mut file = tempfile::Builder::new()
        .suffix(".js")
        .tempfile()
        .expect("temp file");
    file.write_all(text.as_bytes()).expect("write script");
    file
}

fn path(file: &tempfile::NamedTempFile) -> &str {
    file.path().to_str().expect("utf-8 path")
}

#[test]
fn a_script_runs_and_reports_value_logs_and_stats() {
    let script = script_file(
        "console.log('hi');\nconst [a, b] = await Promise.all([tools.examples.echo({n: 1}), tools.examples.sleep({ms: 10})]);\nreturn {a, b, user};",
    );
    let output = corral(
        &[
            "exec",
            path(&script),
            "--user",
            r#"{"id": "u1", "displayName": "Ada"}"#,
        ],
        None,
    );
    assert_eq!(output.status.code(), Some(0));
    let report = report(&output);
    assert_eq!(report["ok"], true);
    assert_eq!(
        report["value"],
        json!({"a": {"n": 1}, "b": {"slept_ms": 10}, "user": {"id": "u1", "email": null, "displayName": "Ada"}})
    );
    assert_eq!(report["logs"][0]["message"], "hi");
    assert_eq!(report["logs"][0]["level"], "info");
    let stats = &report["stats"];
    assert_eq!(stats["calls"], 2);
    for key in ["fuel", "wall_us", "peak_memory_bytes"] {
        assert!(
            stats[key].as_u64().is_some_and(|n| n > 0),
            "{key} missing: {stats}"
        );
    }
}

#[test]
fn undefined_results_have_no_value_key() {
    let output = corral(&["exec", "-"], Some(b"const x = 1;"));
    assert_eq!(output.status.code(), Some(0));
    let report = report(&output);
    assert_eq!(report["ok"], true);
    assert!(report.get("value").is_none(), "{report}");
}

#[test]
fn script_errors_exit_1_with_their_location() {
    let output = corral(&["exec", "-"], Some(b"const a = 1;\nreturn a +;\n"));
    assert_eq!(output.status.code(), Some(1));
    let report = report(&output);
    assert_eq!(report["ok"], false);
    assert_eq!(
        (
            report["error"]["kind"].clone(),
            report["error"]["name"].clone()
        ),
        (json!("script_error"), json!("SyntaxError"))
    );
    assert_eq!(
        (
            report["error"]["line"].clone(),
            report["error"]["column"].clone()
        ),
        (json!(2), json!(11))
    );
}

#[test]
fn limit_flags_apply() {
    let cases: [(&[&str], &str, &str); 4] = [
        (&["--fuel", "1000000"], "while (true) {}", "fuel_exhausted"),
        (
            &["--timeout-ms", "100", "--fuel", "1000000000000"],
            "for (;;) {}",
            "deadline_exceeded",
        ),
        (
            &["--memory-mb", "16"],
            "const a = []; while (true) a.push('m'.repeat(1 << 16) + a.length);",
            "memory_limit",
        ),
        (
            &["--max-total-calls", "2"],
            "for (let i = 0; i < 5; i++) await tools.examples.echo({});",
            "too_many_calls",
        ),
    ];
    for (flags, script, kind) in cases {
        let mut args = vec!["exec", "-"];
        args.extend_from_slice(flags);
        let output = corral(&args, Some(script.as_bytes()));
        assert_eq!(output.status.code(), Some(1), "{flags:?}");
        assert_eq!(report(&output)["error"]["kind"], kind, "{flags:?}");
    }
}

#[test]
fn non_utf8_scripts_are_invalid_input() {
    let output = corral(&["exec", "-"], Some(&[0x72, 0x65, 0xff, 0xfe]));
    assert_eq!(output.status.code(), Some(1));
    assert_eq!(report(&output)["error"]["kind"], "invalid_input");
}

#[test]
fn usage_errors_exit_2() {
    let catalog = script_file(
        r#"{"capabilities": [{"id": "a.b", "input_schema": {"type": "object"}, "bogus": 1}]}"#,
    );
    let valid_catalog =
        script_file(r#"{"capabilities": [{"id": "a.b", "input_schema": {"type": "object"}}]}"#);
    let script = script_file("return 1");
    let cases: Vec<Vec<&str>> = vec![
        vec!["exec", path(&script), "--no-such-flag"],
        vec!["exec", "/nonexistent/script.js"],
        vec!["exec", path(&script), "--user", "{not json"],
        vec![
            "exec",
            path(&script),
            "--user",
            r#"{"id": "u", "role": "admin"}"#,
        ],
        vec![
            "exec",
            path(&script),
            "--catalog",
            path(&catalog),
            "--backend-url",
            "http://127.0.0.1:9",
        ],
        vec!["exec", path(&script), "--catalog", path(&valid_catalog)],
        vec![
            "exec",
            path(&script),
            "--catalog",
            path(&valid_catalog),
            "--backend-url",
            "ftp://x",
        ],
        vec!["exec", path(&script), "--max-concurrent-calls", "0"],
        vec!["exec"],
    ];
    for args in cases {
        let output = corral(&args, None);
        assert_eq!(
            output.status.code(),
            Some(2),
            "{args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(
            output.stdout.is_empty(),
            "{args:?} printed a report on a usage error"
        );
        assert!(!output.stderr.is_empty(), "{args:?} gave no message");
    }
}

/// What the webhook server saw.
#[derive(Default)]
struct Seen {
    requests: Mutex<Vec<Value>>,
    in_flight: AtomicU32,
    max_in_flight: AtomicU32,
}

/// A minimal HTTP/1.1 server: one request per connection, JSON in and out.
async fn serve(listener: tokio::net::TcpListener, seen: Arc<Seen>) {
    loop {
        let Ok((mut stream, _)) = listener.accept().await else {
            return;
        };
        let seen = seen.clone();
        tokio::spawn(async move {
            let mut buffer = Vec::new();
            let mut chunk = [0u8; 4096];
            let (head_end, length) = loop {
                let n = stream.read(&mut chunk).await.unwrap_or(0);
                if n == 0 {
                    return;
                }
                buffer.extend_from_slice(&chunk[..n]);
                if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                    let head = String::from_utf8_lossy(&buffer[..end]).to_lowercase();
                    let length = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .and_then(|v| v.trim().parse::<usize>().ok())
                        .unwrap_or(0);
                    break (end + 4, length);
                }
            };
            while buffer.len() < head_end + length {
                let n = stream.read(&mut chunk).await.unwrap_or(0);
                if n == 0 {
                    return;
                }
                buffer.extend_from_slice(&chunk[..n]);
            }
            let request: Value =
                serde_json::from_slice(&buffer[head_end..head_end + length]).unwrap_or(Value::Null);
            let now = seen.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            seen.max_in_flight.fetch_max(now, Ordering::SeqCst);
            seen.requests.lock().await.push(request.clone());
            let input = &request["input"][0];
            if let Some(ms) = input["ms"].as_u64() {
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
            seen.in_flight.fetch_sub(1, Ordering::SeqCst);
            let (status, body) = match request["capability_id"].as_str() {
                Some("shop.orders.get") => (
                    "200 OK",
                    json!({"ok": true, "output": {"id": input["id"], "total": 42}}),
                ),
                Some("shop.orders.cancel") => (
                    "200 OK",
                    json!({"ok": false, "error": "order already shipped"}),
                ),
                _ => ("500 Internal Server Error", json!({"ok": false})),
            };
            let body = body.to_string();
            let response = format!(
                "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(response.as_bytes()).await;
        });
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_backends_receive_each_call_as_json() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}/", listener.local_addr().expect("addr"));
    let seen = Arc::new(Seen::default());
    tokio::spawn(serve(listener, seen.clone()));

    let catalog = script_file(
        r#"{"capabilities": [
            {"id": "shop.orders.get", "input_schema": {"type": "object", "properties": {"id": {"type": "string"}, "ms": {"type": "integer"}}, "required": ["id"]}},
            {"id": "shop.orders.cancel", "input_schema": {"type": "object"}},
            {"id": "shop.broken", "input_schema": {"type": "object"}}
        ]}"#,
    );
    let script = script_file(
        "const orders = await Promise.all(['a', 'b', 'c', 'd', 'e', 'f'].map(id => tools.shop.orders.get({id, ms: 50})));
         const errors = [];
         for (const call of [() => tools.shop.orders.cancel({id: 'a'}), () => tools.shop.broken({}), () => tools.shop.orders.get({})]) {
           try { await call(); } catch (e) { errors.push([e.name, e.message]); }
         }
         return {orders: orders.map(o => o.id + ':' + o.total), errors};",
    );
    let args = [
        "exec".to_string(),
        path(&script).to_string(),
        "--catalog".into(),
        path(&catalog).to_string(),
        "--backend-url".into(),
        url,
        "--max-concurrent-calls".into(),
        "2".into(),
    ];
    let output = tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        corral(&args, None)
    })
    .await
    .expect("join");
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stdout)
    );
    let report = report(&output);
    assert_eq!(
        report["value"]["orders"],
        json!(["a:42", "b:42", "c:42", "d:42", "e:42", "f:42"])
    );
    let errors = &report["value"]["errors"];
    assert_eq!(
        errors[0],
        json!([
            "CapabilityError",
            "shop.orders.cancel failed: order already shipped"
        ])
    );
    assert_eq!(errors[1][0], "CapabilityError");
    assert!(
        errors[1][1]
            .as_str()
            .is_some_and(|m| m.contains("HTTP 500")),
        "{errors}"
    );
    assert_eq!(errors[2][0], "ValidationError");

    let requests = seen.requests.lock().await;
    // The invalid call never reached the webhook.
    assert_eq!(requests.len(), 8);
    let first = &requests[0];
    assert_eq!(first["capability_id"], "shop.orders.get");
    assert!(first["input"].is_array() && first["input"].as_array().map(Vec::len) == Some(1));
    assert!(
        first["tool_call_id"]
            .as_str()
            .is_some_and(|id| id.starts_with("exec:0:"))
    );
    assert_eq!(first["context"]["session_id"], "exec");
    assert_eq!(
        seen.max_in_flight.load(Ordering::SeqCst),
        2,
        "--max-concurrent-calls 2 was not honoured"
    );
}

/// Pre-flight: a script whose second call names a tool that does not exist is not run at all,
/// so its first call (a webhook with a side effect) never happens; the report names the path,
/// its line and the nearest tool, and charges no fuel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_of_an_unknown_tool_stops_the_script_before_any_call() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}/", listener.local_addr().expect("addr"));
    let seen = Arc::new(Seen::default());
    tokio::spawn(serve(listener, seen.clone()));
    let catalog = script_file(
        r#"{"capabilities": [
            {"id": "shop.orders.get", "input_schema": {"type": "object"}},
            {"id": "shop.orders.cancel", "input_schema": {"type": "object"}}
        ]}"#,
    );
    let run = |script: &'static str| {
        let script = script_file(script);
        let args = [
            "exec".to_string(),
            path(&script).to_string(),
            "--catalog".into(),
            path(&catalog).to_string(),
            "--backend-url".into(),
            url.clone(),
        ];
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        corral(&args, None)
    };
    let output = tokio::task::block_in_place(|| {
        run(
            "await tools.shop.orders.cancel({id: 'a'});\nconst order = await tools.shop.order.get({id: 'a'});\nreturn order;",
        )
    });
    assert_eq!(output.status.code(), Some(1));
    let stopped = report(&output);
    let error = &stopped["error"];
    assert_eq!(error["kind"], "preflight_error", "{stopped}");
    assert_eq!(error["line"], 2);
    assert_eq!(error["column"], 21);
    assert_eq!(
        error["unknown"],
        json!([{"path": "tools.shop.order.get", "line": 2, "column": 21,
            "suggestions": ["shop.orders.get"]}])
    );
    assert!(
        error["message"]
            .as_str()
            .is_some_and(|m| m.contains("did you mean `shop.orders.get`?")),
        "{error}"
    );
    assert_eq!(stopped["stats"]["fuel"], 0);
    assert_eq!(stopped["stats"]["calls"], 0);
    assert!(
        seen.requests.lock().await.is_empty(),
        "the cancel before the bad call was sent"
    );

    // A path built at run time is not visible before the run: it fails where it is reached,
    // after the calls before it, as it always has.
    let output = tokio::task::block_in_place(|| {
        run(
            "await tools.shop.orders.get({id: 'b'});\nconst name = 'order';\nreturn await tools.shop[name].get({});",
        )
    });
    let later = report(&output);
    assert_eq!(later["error"]["kind"], "script_error", "{later}");
    assert_eq!(seen.requests.lock().await.len(), 1);
}

/// Every way a run can fail: each prints exactly one line of valid UTF-8 JSON on stdout (the
/// report, with a typed kind that is never `internal_error`), exits 1, and shows no wasm
/// internals on either stream.
#[test]
fn every_error_path_prints_exactly_one_line_of_json() {
    let deep = "return JSON.parse('['.repeat(200) + ']'.repeat(200))";
    let cases: Vec<(&[&str], Vec<u8>, &str)> = vec![
        (&[], b"throw new Error('boom')".to_vec(), "script_error"),
        (&[], b"throw 'a\\ud800b'".to_vec(), "script_error"),
        (
            &[],
            b"throw new Error('x'.repeat(3 << 20))".to_vec(),
            "script_error",
        ),
        (&[], b"return a +;".to_vec(), "script_error"),
        (&[], b"})(); (function(){ return 1".to_vec(), "script_error"),
        (&[], b"return 1\0".to_vec(), "script_error"),
        (&[], deep.as_bytes().to_vec(), "script_error"),
        (
            &[],
            b"throw Object.assign(new Error(), {name: 'CapabilityError'})".to_vec(),
            "script_error",
        ),
        (
            &[],
            b"await tools.examples.fail({message: 'no'})".to_vec(),
            "capability_error",
        ),
        (
            &[],
            b"await tools.examples.sleep({ms: 'x'})".to_vec(),
            "invalid_input",
        ),
        (&[], vec![0x72, 0x65, 0xff], "invalid_input"),
        (
            &[],
            format!("return '{}'", "x".repeat(300 << 10)).into_bytes(),
            "invalid_input",
        ),
        (&["--fuel", "1"], b"return 1".to_vec(), "fuel_exhausted"),
        (
            &["--fuel", "100000"],
            b"for (;;) {}".to_vec(),
            "fuel_exhausted",
        ),
        (
            &["--timeout-ms", "1", "--fuel", "1000000000000"],
            b"for (;;) {}".to_vec(),
            "deadline_exceeded",
        ),
        (
            &["--memory-mb", "8"],
            b"const a = []; for (;;) a.push('m'.repeat(1 << 16) + a.length)".to_vec(),
            "memory_limit",
        ),
        (
            &[],
            b"function f() { return f() + 1 } return f()".to_vec(),
            "stack_overflow",
        ),
        (
            &["--max-total-calls", "0"],
            b"await tools.examples.echo({})".to_vec(),
            "too_many_calls",
        ),
        (&[], b"return 'x'.repeat(30e6)".to_vec(), "result_too_large"),
        (&[], b"for (;;) console.log()".to_vec(), "logs_too_large"),
        (
            &[],
            b"console.log('\\udc00'); for (;;) log('info', 'x'.repeat(1000))".to_vec(),
            "logs_too_large",
        ),
        (&[], b"await new Promise(() => {})".to_vec(), "script_error"),
    ];
    for (flags, script, kind) in cases {
        let mut args = vec!["exec", "-"];
        args.extend_from_slice(flags);
        let output = corral(&args, Some(&script));
        let shown = String::from_utf8_lossy(&script[..script.len().min(60)]).into_owned();
        assert_eq!(output.status.code(), Some(1), "{flags:?} {shown}");
        let stdout = std::str::from_utf8(&output.stdout)
            .unwrap_or_else(|e| panic!("{flags:?} {shown}: stdout is not UTF-8: {e}"));
        assert!(
            stdout.ends_with('\n') && stdout.matches('\n').count() == 1,
            "{flags:?} {shown}: not exactly one line: {:?}",
            &stdout[..stdout.len().min(200)]
        );
        let report: Value = serde_json::from_str(stdout)
            .unwrap_or_else(|e| panic!("{flags:?} {shown}: not JSON ({e})"));
        assert_eq!(report["ok"], false, "{flags:?} {shown}");
        assert_eq!(report["error"]["kind"], kind, "{flags:?} {shown}: {report}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        for stream in [stdout, &stderr] {
            assert!(
                !stream.contains("wasm backtrace") && !stream.contains(".wasm!"),
                "{flags:?} {shown}: internal symbols shown: {stream}"
            );
        }
    }
}

#[test]
fn out_of_range_flags_are_usage_errors_naming_the_range() {
    let cases: [(&[&str], &str); 8] = [
        (&["--fuel", "0"], "--fuel must be between 1 and"),
        (
            &["--timeout-ms", "0"],
            "--timeout-ms must be between 1 and 86400000",
        ),
        (
            &["--timeout-ms", "18446744073709551615"],
            "--timeout-ms must be between 1 and",
        ),
        (&["--memory-mb", "0"], "--memory-mb must be between"),
        (
            &["--memory-mb", "4"],
            "--memory-mb must be between 5 (the guest's initial memory) and 1024, not 4",
        ),
        (&["--memory-mb", "5000"], "and 1024"),
        (&["--memory-mb", "18446744073709551615"], "and 1024"),
        (&["--user", r#"["a", "b", "c"]"#], "invalid --user JSON"),
    ];
    for (flags, message) in cases {
        let mut args = vec!["exec", "-"];
        args.extend_from_slice(flags);
        let output = corral(&args, Some(b"return 1"));
        assert_eq!(output.status.code(), Some(2), "{flags:?}");
        assert!(output.stdout.is_empty(), "{flags:?} printed a report");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(message), "{flags:?}: {stderr}");
        assert_eq!(stderr.matches('\n').count(), 1, "{flags:?}: {stderr}");
    }
    // The edges of the ranges run.
    for flags in [
        &["--fuel", "18446744073709551615"][..],
        &["--timeout-ms", "86400000"],
        &["--memory-mb", "5"],
        &["--memory-mb", "1024"],
    ] {
        let mut args = vec!["exec", "-"];
        args.extend_from_slice(flags);
        let output = corral(&args, Some(b"return 1"));
        assert_eq!(
            output.status.code(),
            Some(0),
            "{flags:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

#[test]
fn a_closed_stdout_is_a_failure_not_a_panic() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_corral"))
        .args(["exec", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("corral starts");
    // Like `| head -c 0`: the reader is gone before the report is written.
    drop(child.stdout.take());
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(b"return 'x'.repeat(100000)")
        .expect("write stdin");
    let output = child.wait_with_output().expect("corral finishes");
    assert_eq!(
        output.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("writing the report failed"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}
