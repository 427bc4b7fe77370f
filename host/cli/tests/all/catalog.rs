//! `corral catalog typescript|prompt|check` as a user runs them.

use std::io::Write as _;
use std::process::{Command, Output};

fn corral(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_corral"))
        .args(args)
        .output()
        .expect("corral runs")
}

fn file(text: &str) -> tempfile::NamedTempFile {
    let mut file = tempfile::Builder::new()
        .suffix(".json")
        .tempfile()
        .expect("temp file");
    file.write_all(text.as_bytes()).expect("write");
    file
}

const CATALOG: &str = r#"{"capabilities": [{
    "id": "github.issues.list",
    "description": "List the issues of a repository.",
    "input_schema": {"type": "object", "properties": {"repo": {"type": "string"}}, "required": ["repo"]}
}]}"#;

#[test]
fn typescript_prompt_and_check_succeed_on_a_valid_catalog() {
    let catalog = file(CATALOG);
    let path = catalog.path().to_str().expect("path");
    let output = corral(&["catalog", "typescript", path]);
    assert_eq!(output.status.code(), Some(0));
    let typescript = String::from_utf8_lossy(&output.stdout);
    assert!(typescript.contains("declare const tools"), "{typescript}");
    assert!(typescript.contains("repo: string;"), "{typescript}");

    let output = corral(&["catalog", "prompt", path]);
    assert_eq!(output.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&output.stdout).contains("run_js"));
    assert!(String::from_utf8_lossy(&output.stderr).contains("tokens"));

    let output = corral(&["catalog", "check", path]);
    assert_eq!(output.status.code(), Some(0));
    assert_eq!(
        String::from_utf8_lossy(&output.stdout).trim(),
        "ok: 1 capabilities"
    );
}

#[test]
fn mcp_tools_lists_take_a_namespace() {
    let tools = file(r#"{"tools": [{"name": "read_file", "inputSchema": {"type": "object"}}]}"#);
    let path = tools.path().to_str().expect("path");
    let output = corral(&["catalog", "typescript", path, "--namespace", "fs"]);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(String::from_utf8_lossy(&output.stdout).contains("read_file"));
}

#[test]
fn invalid_catalogs_exit_1_naming_capability_and_pointer() {
    let broken = file(
        r##"{"capabilities": [{"id": "a.b", "input_schema": {"type": "object", "properties": {"x": {"$ref": "https://example.com/remote.json"}}}}]}"##,
    );
    let output = corral(&["catalog", "check", broken.path().to_str().expect("path")]);
    assert_eq!(output.status.code(), Some(1));
    let errors = String::from_utf8_lossy(&output.stderr);
    assert!(errors.contains("a.b"), "{errors}");
    assert!(errors.contains("/properties/x"), "{errors}");
}

#[test]
fn unreadable_files_and_bad_arguments_exit_2() {
    assert_eq!(
        corral(&["catalog", "check", "/nonexistent.json"])
            .status
            .code(),
        Some(2)
    );
    assert_eq!(
        corral(&["catalog", "render", "x.json"]).status.code(),
        Some(2)
    );
}
