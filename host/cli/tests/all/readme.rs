//! The README's quick start, run as written: its commands are read from README.md and run in
//! bash against a real `corral serve --demo`, killed with SIGKILL and started again in the
//! middle. Only the demo's folder and the port are substituted (the test cannot use the
//! developer's `target/corral-demo` or port 8787).

#![cfg(unix)]

use std::path::Path;
use std::process::Command;

use crate::common::{self, Server, repo_root as root};

/// The quick start's commands: the `$ ` lines of the console block that sets `H` and `B`.
fn quick_start() -> Vec<String> {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    let blocks: Vec<&str> = readme.split("```console\n").skip(1).collect();
    let block = blocks
        .iter()
        .find(|b| b.starts_with("$ H="))
        .expect("a console block that starts by setting H and B");
    let block = &block[..block.find("```").expect("the block ends")];
    block
        .lines()
        .filter_map(|line| line.strip_prefix("$ "))
        .map(str::to_owned)
        .collect()
}

fn demo(folder: &Path, stderr: &Path) -> Server {
    let mut command = common::corral();
    command
        .args(["serve", "--demo", "--listen", "127.0.0.1:0", "--demo-dir"])
        .arg(folder)
        .current_dir(root());
    Server::spawn(command, stderr)
}

/// Runs `lines` in one bash, after substituting the demo's folder and address; returns stdout.
fn run(lines: &[String], folder: &Path, base: &str) -> String {
    let script: Vec<String> = lines
        .iter()
        .map(|line| {
            line.replace("target/corral-demo", &folder.display().to_string())
                .replace("http://127.0.0.1:8787", base)
        })
        .collect();
    let output = Command::new("bash")
        .arg("-c")
        .arg(script.join("\n"))
        .current_dir(root())
        .output()
        .expect("bash runs");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{script:?} failed: {stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// Waits (with the README's own `H` and `B`) until session s1 is `status`.
fn wait_for(status: &str) -> String {
    format!(
        "for _ in $(seq 600); do curl -s $B/v1/sessions/s1 -H \"$H\" | grep -q '\"status\":\"{status}\"' && break; sleep 0.05; done"
    )
}

#[test]
fn the_readme_quick_start_runs_as_written_across_a_kill_9() {
    let commands = quick_start();
    let find = |needle: &str| {
        commands
            .iter()
            .position(|c| c.contains(needle))
            .unwrap_or_else(|| panic!("no quick-start command with {needle:?}: {commands:?}"))
    };
    let (setup, create, message) = (0, find("-X PUT"), find("\"type\":\"message\""));
    let (view, pick, approve) = (
        find("# paused"),
        find("jq -r"),
        find("\"type\":\"approve\""),
    );
    let stream = find("/events?cursor=5");
    assert!(setup < create && create < message && message < view && view < pick);
    assert!(pick < approve && approve < stream);
    assert!(commands[setup].starts_with("H="), "{}", commands[setup]);

    let dir = tempfile::tempdir().expect("tempdir");
    let folder = dir.path().join("corral-demo");
    let stderr = dir.path().join("serve.stderr");
    let mut first = demo(&folder, &stderr);
    let out = run(&commands[..=message], &folder, &first.base);
    assert!(out.contains("\"status\":\"idle\""), "{out}");
    assert!(out.contains("\"status\":\"accepted\""), "{out}");
    run(
        &[commands[setup].clone(), wait_for("paused")],
        &folder,
        &first.base,
    );
    // kill -9, and start again on the same folder: same token, same session.
    first.kill9();
    let second = demo(&folder, &stderr);
    let mut rest = vec![commands[setup].clone(), wait_for("paused")];
    rest.extend(commands[view..approve + 1].iter().cloned());
    rest.push(wait_for("completed"));
    // The stream stays open for live events after the history: read it for a bounded time.
    let stream_command = commands[stream]
        .split("  #")
        .next()
        .unwrap_or_default()
        .trim();
    rest.push(format!("timeout 5 {stream_command} || true"));
    let out = run(&rest, &folder, &second.base);
    assert!(out.contains("\"status\":\"paused\""), "{out}");
    assert!(out.contains("event: command.approve"), "{out}");
    assert!(out.contains("\"decidedBy\":\"demo\""), "{out}");
    assert!(out.contains("event: turn.completed"), "{out}");
    assert!(
        out.contains("Both sleeps ran at once; the echo said hello."),
        "{out}"
    );
}
