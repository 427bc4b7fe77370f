//! `corral exec` with MCP servers, as a user runs it: `--mcp`, `--mcp-config` with secrets by
//! reference, and MCP tools beside a `--catalog`. The servers come from npm through
//! `host/mcp/tests/install-servers.sh`; these tests fail (they do not skip) without them.

use std::process::Output;

use serde_json::json;

use crate::common::{self, filesystem_server, node_modules, report, testkit_script};

fn corral(args: &[&str], env: &[(&str, &str)], script: &str) -> Output {
    let mut command = common::corral();
    command
        .arg("exec")
        .arg("-")
        .args(args)
        .envs(env.iter().copied());
    common::run(command, Some(script.as_bytes()))
}

#[test]
fn mcp_tools_are_the_whole_catalog_and_a_script_reads_files_through_them() {
    let folder = tempfile::tempdir().expect("tempdir");
    std::fs::write(folder.path().join("hello.txt"), "hello from MCP").expect("write");
    let root = folder
        .path()
        .canonicalize()
        .expect("canonical")
        .display()
        .to_string();
    let server = format!("fs=node '{}' '{root}'", filesystem_server().display());
    let script = format!(
        "const listing = await tools.fs.list_directory({{path: {root:?}}});\n\
         const text = await tools.fs.read_text_file({{path: {root:?} + '/hello.txt'}});\n\
         return {{listing, text, examples: typeof tools.examples}};"
    );
    let output = corral(&["--mcp", &server], &[], &script);
    let report = report(&output);
    assert_eq!(report["ok"], true, "{report}");
    assert_eq!(report["value"]["text"]["content"], "hello from MCP");
    assert!(
        report["value"]["listing"]["content"]
            .as_str()
            .unwrap_or("")
            .contains("hello.txt")
    );
    assert_eq!(
        report["value"]["examples"], "undefined",
        "only the MCP tools are bound"
    );
}

#[test]
fn secrets_by_reference_reach_the_server_and_never_the_script_or_output() {
    let folder = tempfile::tempdir().expect("tempdir");
    let config = folder.path().join("mcp.json");
    let declaration = json!([{
        "name": "kit",
        "command": "node",
        "args": [testkit_script()],
        "env": {
            "CORRAL_MCP_NODE_MODULES": node_modules().display().to_string(),
            "API_TOKEN": {"secretRef": "KIT_TOKEN"}
        }
    }]);
    std::fs::write(&config, declaration.to_string()).expect("write");
    let referenced = "tok-referenced-8812";
    let unreferenced = "tok-unreferenced-5531";
    // The script tries every way it has to reach the secrets.
    let script = "const token = await tools.kit.env({name: 'API_TOKEN'});\n\
        const other = await tools.kit.env({name: 'CORRAL_SECRET_OTHER'});\n\
        const direct = await tools.kit.env({name: 'CORRAL_SECRET_KIT_TOKEN'});\n\
        let failure = null;\n\
        try { await tools.kit.fail({message: token}); } catch (e) { failure = e.message; }\n\
        const seen = JSON.stringify(Object.getOwnPropertyNames(globalThis));\n\
        console.log('token', token);\n\
        return {token, other, direct, failure, hasProcess: typeof process, seen: seen.length > 0};";
    let output = corral(
        &["--mcp-config", config.to_str().expect("utf-8")],
        &[
            ("CORRAL_SECRET_KIT_TOKEN", referenced),
            ("CORRAL_SECRET_OTHER", unreferenced),
            ("RUST_LOG", "corral_mcp=info"),
        ],
        script,
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    for secret in [referenced, unreferenced] {
        assert!(!stdout.contains(secret), "stdout leaks {secret}: {stdout}");
        assert!(!stderr.contains(secret), "stderr leaks {secret}: {stderr}");
    }
    let report = report(&output);
    assert_eq!(report["ok"], true, "{report}");
    let value = &report["value"];
    assert_eq!(
        value["token"], "[REDACTED]",
        "the server got the secret: {report}"
    );
    assert_eq!(value["failure"], "kit.fail failed: [REDACTED]");
    assert_eq!(
        value["other"], "(unset)",
        "unreferenced secrets are withheld from servers"
    );
    assert_eq!(value["direct"], "(unset)");
    assert_eq!(value["hasProcess"], "undefined");
}

#[test]
fn a_missing_secret_or_a_bad_declaration_is_a_usage_error() {
    let folder = tempfile::tempdir().expect("tempdir");
    let config = folder.path().join("mcp.json");
    std::fs::write(
        &config,
        json!([{"name": "kit", "command": "node", "env": {"A": {"secretRef": "ABSENT"}}}])
            .to_string(),
    )
    .expect("write");
    let output = corral(
        &["--mcp-config", config.to_str().expect("utf-8")],
        &[],
        "return 1;",
    );
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("no secret \"ABSENT\""));
    for bad in ["nameless", "a.b=node x", "x=\"unclosed"] {
        let output = corral(&["--mcp", bad], &[], "return 1;");
        assert_eq!(output.status.code(), Some(2), "{bad}");
    }
}

#[test]
fn mcp_tools_are_added_to_a_catalog_and_its_calls_still_go_to_its_backend() {
    let folder = tempfile::tempdir().expect("tempdir");
    let catalog = folder.path().join("tools.json");
    std::fs::write(
        &catalog,
        json!({"capabilities": [{"id": "shop.ping", "input_schema": {"type": "object"}}]})
            .to_string(),
    )
    .expect("write");
    let server = format!("kit=node '{}'", testkit_script());
    // Nothing listens on this port: a call to shop.ping would fail; we only check binding here
    // and that MCP calls route to the server.
    let output = corral(
        &[
            "--mcp",
            &server,
            "--catalog",
            catalog.to_str().expect("utf-8"),
            "--backend-url",
            "http://127.0.0.1:9/calls",
        ],
        &[(
            "CORRAL_MCP_NODE_MODULES",
            node_modules().to_str().expect("utf-8"),
        )],
        "const e = await tools.kit.echo({text: 'x'});\n\
         let shop; try { await tools.shop.ping({}); } catch (err) { shop = err.name; }\n\
         return {e, shop, both: typeof tools.shop.ping + typeof tools.kit.echo};",
    );
    let report = report(&output);
    assert_eq!(report["ok"], true, "{report}");
    assert_eq!(
        report["value"],
        json!({"e": "x", "shop": "CapabilityError", "both": "functionfunction"})
    );
}
