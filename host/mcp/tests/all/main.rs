//! corral-mcp against real MCP servers: `@modelcontextprotocol/server-everything` (stdio and
//! streamable HTTP), `@modelcontextprotocol/server-filesystem` on a temporary folder, and the
//! small TypeScript-SDK server `tests/servers/testkit.mjs`, all installed from npm by
//! `host/mcp/tests/install-servers.sh`. Nothing here skips when they are missing: it fails and
//! says how to install them.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow, bail, ensure};
use corral_catalog::{Catalog, render_typescript};
use corral_mcp::{
    McpBackend, McpCatalog, McpHub, McpHubOptions, McpListError, McpServerConfig, McpTransport,
    StartMcpServerError, StaticSecrets,
};
use corral_sandbox::{
    Backend, ExecError, InvocationContext, Sandbox, SandboxConfig, ScriptReport, SessionLimits,
    SessionOptions,
};
use serde_json::{Value, json};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `target/node-tools/mcp/node_modules`, or a failure that says how to fill it.
fn node_modules() -> PathBuf {
    let path = repo_root().join("target/node-tools/mcp/node_modules");
    assert!(
        path.join("@modelcontextprotocol/server-everything/dist/index.js")
            .exists()
            && path
                .join("@modelcontextprotocol/server-filesystem/dist/index.js")
                .exists()
            && path.join("@modelcontextprotocol/sdk/package.json").exists(),
        "the MCP test servers are not installed in {}: run `bash host/mcp/tests/install-servers.sh` \
         (scripts/test does). These tests do not skip without them.",
        path.display()
    );
    path
}

fn package_bin(package: &str) -> String {
    node_modules()
        .join("@modelcontextprotocol")
        .join(package)
        .join("dist/index.js")
        .display()
        .to_string()
}

fn testkit(name: &str, mode: &str) -> McpServerConfig {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/servers/testkit.mjs");
    let mut config = McpServerConfig::stdio(
        name,
        "node",
        vec![script.display().to_string(), mode.to_owned()],
    );
    if let McpTransport::Stdio { env, .. } = &mut config.transport {
        env.insert(
            "CORRAL_MCP_NODE_MODULES".into(),
            corral_mcp::ConfigValue::Literal(node_modules().display().to_string()),
        );
    }
    config
}

fn everything_stdio() -> McpServerConfig {
    McpServerConfig::stdio(
        "everything",
        "node",
        vec![package_bin("server-everything"), "stdio".into()],
    )
}

fn hub() -> McpHub {
    hub_with(StaticSecrets::default())
}

fn hub_with(secrets: StaticSecrets) -> McpHub {
    McpHub::new(Arc::new(secrets), McpHubOptions::default())
}

async fn listed(hub: &McpHub, servers: &[McpServerConfig]) -> Result<(McpCatalog, Catalog)> {
    let listed = hub.catalog(servers).await;
    let catalog = listed.to_catalog()?;
    Ok((listed, catalog))
}

fn sandbox() -> Result<Sandbox> {
    Ok(Sandbox::new(SandboxConfig {
        max_sessions: 4,
        ..SandboxConfig::default()
    })?)
}

async fn run_with(
    sandbox: &Sandbox,
    catalog: Catalog,
    backend: Arc<dyn Backend>,
    limits: SessionLimits,
    script: &str,
) -> Result<ScriptReport> {
    let options = SessionOptions {
        context: InvocationContext {
            session_id: "t".into(),
            ..InvocationContext::default()
        },
        limits,
        ..SessionOptions::new(Arc::new(catalog), backend)
    };
    let mut session = sandbox.session(options).await?;
    let report = session.run(script).await;
    session.close();
    Ok(report)
}

async fn run(listed: &McpCatalog, catalog: &Catalog, script: &str) -> Result<ScriptReport> {
    run_with(
        &sandbox()?,
        catalog.clone(),
        Arc::new(McpBackend::new(listed)),
        SessionLimits::default(),
        script,
    )
    .await
}

fn value(report: ScriptReport) -> Result<Value> {
    match report.outcome {
        Ok(value) => Ok(value.unwrap_or(Value::Null)),
        Err(error) => Err(anyhow!("the script failed: {error:?}")),
    }
}

fn script_error(report: ScriptReport) -> Result<String> {
    match report.outcome {
        Ok(value) => bail!("the script succeeded with {value:?}"),
        Err(error) => Ok(format!("{error:?}")),
    }
}

/// What the testkit process has seen (`tools.kit.stats`), called directly.
async fn stats(listed: &McpCatalog) -> Result<Value> {
    let backend = McpBackend::new(listed);
    let result = backend
        .invoke(
            &InvocationContext::default(),
            corral_sandbox::Invocation {
                capability_id: "kit.stats".into(),
                tool_call_id: "t:stats".into(),
                input: json!([{}]),
            },
        )
        .await?;
    Ok(result.output)
}

#[tokio::test]
async fn tools_list_is_read_in_pages_and_namespaced_with_bad_tools_left_out() -> Result<()> {
    let hub = hub();
    let mut kit = testkit("kit", "normal");
    kit.needs_approval.insert("echo".into(), true);
    let (listed, catalog) = listed(&hub, &[kit]).await?;
    let ids: Vec<&str> = catalog
        .capabilities()
        .iter()
        .map(|c| c.id.as_str())
        .collect();
    // 13 tools in 5 pages of 3; `cyclic` cannot be rendered and is left out.
    assert_eq!(
        ids,
        [
            "kit.echo",
            "kit.noop",
            "kit.barrier",
            "kit.slow",
            "kit.stats",
            "kit.strict",
            "kit.fail",
            "kit.crash",
            "kit.env",
            "kit.add_tool",
            "kit.delete_all",
            "kit.peek"
        ]
    );
    assert_eq!(listed.errors.len(), 1, "{:?}", listed.errors);
    assert!(
        matches!(&listed.errors[0], McpListError::UnrenderableTool { server, tool, .. } if server == "kit" && tool == "cyclic"),
        "{}",
        listed.errors[0]
    );
    let (_, echo) = catalog.get("kit.echo").context("echo")?;
    assert_eq!(echo.js_path, ["kit", "echo"]);
    assert!(
        echo.text_output && echo.needs_approval,
        "the override applies"
    );
    let (_, delete_all) = catalog.get("kit.delete_all").context("delete_all")?;
    assert!(delete_all.needs_approval, "destructiveHint needs approval");
    assert!(
        delete_all
            .description
            .as_deref()
            .unwrap_or("")
            .contains("Destructive")
    );
    let (_, peek) = catalog.get("kit.peek").context("peek")?;
    assert!(
        !peek.needs_approval,
        "readOnlyHint wins over destructiveHint"
    );
    assert!(
        peek.description
            .as_deref()
            .unwrap_or("")
            .contains("Read-only")
    );
    let (_, stats) = catalog.get("kit.stats").context("stats")?;
    assert!(!stats.text_output && stats.output_schema.is_some());
    let typescript = render_typescript(&catalog)?;
    assert!(
        typescript.contains("Requires the user's approval."),
        "{typescript}"
    );

    // allowedTools: only those are listed (and routed).
    let mut only_echo = testkit("kit", "normal");
    only_echo.allowed_tools = Some(vec!["echo".into()]);
    let (listed_echo, _) = self::listed(&hub, &[only_echo]).await?;
    assert_eq!(listed_echo.capabilities.len(), 1);
    let report = run(
        &listed,
        &catalog,
        "return await tools.kit.echo({text: 'hi'});",
    )
    .await?;
    assert_eq!(value(report)?, json!("hi"));
    hub.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn rendered_typescript_of_real_servers_compiles_under_tsc_strict() -> Result<()> {
    let tsc = repo_root().join("target/node-tools/node_modules/.bin/tsc");
    assert!(
        tsc.exists(),
        "TypeScript compiler not found at {}: run host/catalog/tests/install-typescript.sh",
        tsc.display()
    );
    let folder = tempfile::tempdir()?;
    let hub = hub();
    let servers = [
        everything_stdio(),
        McpServerConfig::stdio(
            "fs",
            "node",
            vec![
                package_bin("server-filesystem"),
                folder.path().display().to_string(),
            ],
        ),
        testkit("kit", "normal"),
    ];
    let (listed, catalog) = listed(&hub, &servers).await?;
    let fatal: Vec<_> = listed
        .errors
        .iter()
        .filter(|e| !matches!(e, McpListError::UnrenderableTool { tool, .. } if tool == "cyclic"))
        .collect();
    assert!(fatal.is_empty(), "{fatal:?}");
    assert!(
        catalog.get("everything.get-sum").is_some() && catalog.get("fs.read_text_file").is_some()
    );
    let mut source = render_typescript(&catalog)?;
    source.push_str("export {};\n");
    let file = folder.path().join("mcp.ts");
    std::fs::write(&file, &source)?;
    let output = Command::new(&tsc)
        .args([
            "--strict", "--noEmit", "--target", "es2022", "--lib", "es2022", "--pretty", "false",
        ])
        .arg(&file)
        .output()?;
    ensure!(
        output.status.success(),
        "tsc rejected the rendering:\n{}\n{source}",
        String::from_utf8_lossy(&output.stdout)
    );
    hub.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn a_schema_invalid_call_never_reaches_the_server() -> Result<()> {
    let hub = hub();
    let (listed, catalog) = listed(&hub, &[testkit("kit", "normal")]).await?;
    let report = run(
        &listed,
        &catalog,
        "return await tools.kit.strict({n: 'seven'});",
    )
    .await?;
    let error = script_error(report)?;
    assert!(
        error.contains("ValidationError") && error.contains("/n"),
        "{error}"
    );
    let seen = stats(&listed).await?;
    assert_eq!(seen["calls"].get("strict"), None, "{seen}");
    hub.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn promise_all_puts_several_calls_in_flight_on_one_server_at_once() -> Result<()> {
    let hub = hub();
    let (listed, catalog) = listed(&hub, &[testkit("kit", "normal")]).await?;
    // Each barrier call returns only once 4 are in flight together (or fails after 10 s).
    let report = run(
        &listed,
        &catalog,
        "return await Promise.all([1, 2, 3, 4].map(() => tools.kit.barrier({n: 4})));",
    )
    .await?;
    let results = value(report)?;
    assert_eq!(results.as_array().map(Vec::len), Some(4), "{results}");
    hub.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn is_error_rejects_with_the_servers_text_and_structured_content_is_the_value() -> Result<()>
{
    let hub = hub();
    let (listed, catalog) = listed(&hub, &[testkit("kit", "normal"), everything_stdio()]).await?;
    let report = run(
        &listed,
        &catalog,
        "try { await tools.kit.fail({message: 'no such order'}); } \
         catch (e) { return {name: e.name, message: e.message}; }",
    )
    .await?;
    let caught = value(report)?;
    assert_eq!(caught["name"], "CapabilityError");
    assert!(
        caught["message"]
            .as_str()
            .unwrap_or("")
            .contains("no such order"),
        "{caught}"
    );

    let report = run(
        &listed,
        &catalog,
        "const w = await tools.everything['get-structured-content']({location: 'Chicago'}); \
         return {type: typeof w, temperature: typeof w.temperature};",
    )
    .await?;
    assert_eq!(
        value(report)?,
        json!({"type": "object", "temperature": "number"})
    );
    // A tool without outputSchema gives its text.
    let report = run(
        &listed,
        &catalog,
        "return await tools.everything.echo({message: 'x'});",
    )
    .await?;
    assert!(value(report)?.as_str().unwrap_or("").contains('x'));
    hub.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn a_server_that_crashes_mid_call_fails_that_call_clearly_and_is_restarted() -> Result<()> {
    let hub = hub();
    let (listed, catalog) = listed(&hub, &[testkit("kit", "normal")]).await?;
    let before = stats(&listed).await?["pid"].clone();
    let report = run(&listed, &catalog, "return await tools.kit.crash({});").await?;
    let error = script_error(report)?;
    assert!(
        error.contains("stopped during the call") && error.contains("restarted"),
        "{error}"
    );
    let after = stats(&listed).await?["pid"].clone();
    assert_ne!(before, after, "a new process answers the next call");
    let report = run(
        &listed,
        &catalog,
        "return await tools.kit.echo({text: 'back'});",
    )
    .await?;
    assert_eq!(value(report)?, json!("back"));
    hub.shutdown().await;
    Ok(())
}

/// What a script sees when it calls `tools.NAME.tool`: `[name, message]` of the error, or the
/// value.
async fn call_outcome(listed: &McpCatalog, catalog: &Catalog, call: &str) -> Result<Value> {
    let argument = if call.ends_with("crash") {
        "{}"
    } else {
        "{text: 'x'}"
    };
    let script = format!(
        "if (typeof {call} !== 'function') return 'not a function';\n\
         try {{ return await {call}({argument}); }} catch (e) {{ return [e.name, e.message]; }}"
    );
    value(run(listed, catalog, &script).await?)
}

#[tokio::test]
async fn a_server_that_is_down_fails_its_calls_with_a_capability_error_naming_it() -> Result<()> {
    let hub = hub();
    // Never started, with allowedTools: those names are bound, and their calls fail clearly.
    let mut ghost = McpServerConfig::stdio("ghost", "/nonexistent/corral-mcp-server", Vec::new());
    ghost.allowed_tools = Some(vec!["lookup".into()]);
    let unnamed = McpServerConfig::stdio("unnamed", "/nonexistent/corral-mcp-server", Vec::new());
    let (listed, catalog) = listed(&hub, &[ghost, unnamed]).await?;
    assert_eq!(listed.errors.len(), 2, "{:?}", listed.errors);
    let lookup = listed
        .capabilities
        .iter()
        .find(|c| c.id == "ghost.lookup")
        .context("ghost.lookup is bound")?;
    assert!(
        lookup.needs_approval,
        "nothing is known of it: it needs approval"
    );
    // Without allowedTools nothing is known of the server's tools: none are bound.
    assert!(
        !listed
            .capabilities
            .iter()
            .any(|c| c.id.starts_with("unnamed."))
    );
    let outcome = call_outcome(&listed, &catalog, "tools.ghost.lookup").await?;
    assert_eq!(outcome[0], "CapabilityError", "{outcome}");
    assert!(
        outcome[1]
            .as_str()
            .unwrap_or_default()
            .contains("MCP server ghost"),
        "{outcome}"
    );

    // Listed once, then dead and unable to start again: its tools stay, their calls fail.
    let folder = tempfile::tempdir()?;
    let down = folder.path().join("down");
    let mut kit = testkit("kit", "normal");
    if let McpTransport::Stdio { command, args, .. } = &mut kit.transport {
        let line = format!("[ -e '{}' ] && exit 3; exec node \"$@\"", down.display());
        let mut wrapped = vec!["-c".to_owned(), line, "sh".to_owned()];
        wrapped.append(args);
        *args = wrapped;
        *command = "sh".into();
    }
    let (listed, catalog) = self::listed(&hub, std::slice::from_ref(&kit)).await?;
    assert!(
        !listed
            .errors
            .iter()
            .any(|e| matches!(e, McpListError::Start(_) | McpListError::ListTools { .. })),
        "listed: {:?}",
        listed.errors
    );
    assert_eq!(
        call_outcome(&listed, &catalog, "tools.kit.echo").await?,
        json!("x")
    );
    std::fs::write(&down, "")?;
    let crashed = call_outcome(&listed, &catalog, "tools.kit.crash").await?;
    assert_eq!(crashed[0], "CapabilityError", "{crashed}");
    let (relisted, catalog) = self::listed(&hub, &[kit]).await?;
    assert!(
        relisted
            .errors
            .iter()
            .any(|e| e.to_string().contains("MCP server kit")),
        "{:?}",
        relisted.errors
    );
    assert_eq!(
        relisted.fingerprint, listed.fingerprint,
        "the last listing is kept, so a paused turn still resumes"
    );
    let outcome = call_outcome(&relisted, &catalog, "tools.kit.echo").await?;
    assert_eq!(outcome[0], "CapabilityError", "{outcome}");
    assert!(
        outcome[1]
            .as_str()
            .unwrap_or_default()
            .contains("MCP server kit"),
        "{outcome}"
    );
    hub.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn a_server_that_never_answers_initialize_is_reported_within_the_timeout() -> Result<()> {
    let hub = hub();
    let mut silent = testkit("silent", "never-init");
    silent.initialize_timeout_ms = Some(700);
    let started = Instant::now();
    let listed = hub.catalog(&[silent, testkit("kit", "normal")]).await;
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "{:?}",
        started.elapsed()
    );
    assert!(
        listed.errors.iter().any(|e| matches!(
            e,
            McpListError::Start(StartMcpServerError::InitializeTimeout { server, timeout_ms: 700, .. })
                if server == "silent"
        )),
        "{:?}",
        listed.errors
    );
    // The other server's tools are still there.
    assert!(listed.capabilities.iter().any(|c| c.id == "kit.echo"));
    let message = listed
        .errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        message.contains("did not answer initialize within 700 ms"),
        "{message}"
    );
    hub.shutdown().await;
    Ok(())
}

/// Waits until the testkit has counted `want` cancellations.
async fn wait_for_cancelled(listed: &McpCatalog, want: u64) -> Result<()> {
    for _ in 0..100 {
        if stats(listed).await?["cancelled"].as_u64() >= Some(want) {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!(
        "the server saw fewer than {want} cancellations: {}",
        stats(listed).await?
    )
}

#[tokio::test]
async fn call_timeouts_and_script_deadlines_cancel_the_request() -> Result<()> {
    let hub = hub();
    let mut kit = testkit("kit", "normal");
    kit.call_timeout_ms = Some(300);
    let (listed, catalog) = listed(&hub, &[kit]).await?;
    let sandbox = sandbox()?;
    let backend: Arc<dyn Backend> = Arc::new(McpBackend::new(&listed));

    // The call's own timeout.
    let report = run_with(
        &sandbox,
        catalog.clone(),
        Arc::clone(&backend),
        SessionLimits::default(),
        "return await tools.kit.slow({ms: 20000});",
    )
    .await?;
    let error = script_error(report)?;
    assert!(error.contains("did not answer within 300 ms"), "{error}");
    wait_for_cancelled(&listed, 1).await?;

    // The script's deadline.
    let limits = SessionLimits {
        timeout_ms: 150,
        ..SessionLimits::default()
    };
    let report = run_with(
        &sandbox,
        catalog.clone(),
        Arc::clone(&backend),
        limits,
        "return await tools.kit.slow({ms: 250});",
    )
    .await?;
    assert!(
        matches!(report.outcome, Err(ExecError::LimitExceeded { .. })),
        "{:?}",
        report.outcome
    );
    wait_for_cancelled(&listed, 2).await?;

    // A script that returns with a call in flight: the sandbox aborts the call, and rmcp's
    // request guard sends notifications/cancelled. The short call is awaited so that the long
    // one has surely been sent before the script returns.
    let report = run_with(
        &sandbox,
        catalog.clone(),
        Arc::clone(&backend),
        SessionLimits::default(),
        "tools.kit.slow({ms: 20000}); await tools.kit.slow({ms: 200}); return 'left'",
    )
    .await?;
    assert_eq!(value(report)?, json!("left"));
    wait_for_cancelled(&listed, 3).await?;
    drop((sandbox, backend));
    hub.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn secrets_reach_the_server_but_never_the_catalog_the_script_or_errors() -> Result<()> {
    let secret = "s3cr3t-value-0451";
    let hub = hub_with(StaticSecrets(
        [("KIT_TOKEN".to_owned(), secret.to_owned())].into(),
    ));
    let mut kit = testkit("kit", "normal");
    if let McpTransport::Stdio { env, .. } = &mut kit.transport {
        env.insert(
            "API_TOKEN".into(),
            serde_json::from_value(json!({"secretRef": "KIT_TOKEN"}))?,
        );
    }
    let (listed, catalog) = self::listed(&hub, std::slice::from_ref(&kit)).await?;
    assert!(!serde_json::to_string(&listed.capabilities)?.contains(secret));
    assert!(!format!("{kit:?} {}", serde_json::to_string(&kit)?).contains(secret));
    let report = run(
        &listed,
        &catalog,
        "const t = await tools.kit.env({name: 'API_TOKEN'}); \
         try { await tools.kit.fail({message: 'token is ' + t}); } catch (e) { return [t, e.message]; }",
    )
    .await?;
    let text = serde_json::to_string(&value(report)?)?;
    assert!(!text.contains(secret), "{text}");
    assert!(
        text.contains("[REDACTED]"),
        "the server had the secret: {text}"
    );

    // A reference the host cannot resolve is an error naming the reference only.
    let mut missing = kit.clone();
    missing.name = "missing".into();
    if let McpTransport::Stdio { env, .. } = &mut missing.transport {
        env.insert(
            "X".into(),
            serde_json::from_value(json!({"secretRef": "NOPE"}))?,
        );
    }
    let listed = hub.catalog(&[missing]).await;
    assert!(
        listed
            .errors
            .iter()
            .any(|e| e.to_string().contains("no secret \"NOPE\"")),
        "{:?}",
        listed.errors
    );
    hub.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn list_changed_changes_the_fingerprint_and_servers_are_reused_then_stopped() -> Result<()> {
    let hub = hub();
    let kit = testkit("kit", "normal");
    let (first, catalog) = listed(&hub, std::slice::from_ref(&kit)).await?;
    let pid = stats(&first).await?["pid"].as_u64().context("pid")?;
    let generation = hub.generation();
    let report = run(
        &first,
        &catalog,
        "return await tools.kit.add_tool({name: 'late'});",
    )
    .await?;
    assert_eq!(value(report)?, json!("added"));
    for _ in 0..100 {
        if hub.generation() > generation {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        hub.generation() > generation,
        "notifications/tools/list_changed was seen"
    );
    let second = hub.catalog(std::slice::from_ref(&kit)).await;
    assert!(second.capabilities.iter().any(|c| c.id == "kit.late"));
    assert_ne!(first.fingerprint, second.fingerprint);
    // The same process served both listings (a later session reuses the server).
    assert_eq!(stats(&second).await?["pid"].as_u64(), Some(pid));
    hub.shutdown().await;
    let proc = PathBuf::from(format!("/proc/{pid}"));
    for _ in 0..100 {
        if !proc.exists()
            || std::fs::read_to_string(proc.join("stat")).is_ok_and(|s| s.contains(") Z "))
        {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!("the server process {pid} is still running after shutdown")
}

#[tokio::test]
async fn a_script_lists_and_reads_files_through_server_filesystem() -> Result<()> {
    let folder = tempfile::tempdir()?;
    std::fs::write(folder.path().join("notes.txt"), "buy milk\n")?;
    std::fs::write(folder.path().join("todo.md"), "# todo\n")?;
    let root = folder.path().canonicalize()?.display().to_string();
    let hub = hub();
    let fs = McpServerConfig::stdio(
        "fs",
        "node",
        vec![package_bin("server-filesystem"), root.clone()],
    );
    let (listed, catalog) = listed(&hub, &[fs]).await?;
    let script = format!(
        "const listing = await tools.fs.list_directory({{path: {root:?}}});\n\
         const text = await tools.fs.read_text_file({{path: {root:?} + '/notes.txt'}});\n\
         return {{listing, text}};"
    );
    let result = value(run(&listed, &catalog, &script).await?)?;
    // server-filesystem declares outputSchema {content: string}: the value is structuredContent.
    let listing = result["listing"]["content"].as_str().unwrap_or("");
    assert!(
        listing.contains("notes.txt") && listing.contains("todo.md"),
        "{result}"
    );
    assert_eq!(result["text"], json!({"content": "buy milk\n"}));
    hub.shutdown().await;
    Ok(())
}

/// server-everything in `streamableHttp` mode on a free port, reached on 127.0.0.1.
struct HttpServer {
    child: tokio::process::Child,
    url: String,
}

async fn everything_http() -> Result<HttpServer> {
    use tokio::io::AsyncBufReadExt as _;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let mut child = tokio::process::Command::new("node")
        .arg(package_bin("server-everything"))
        .arg("streamableHttp")
        .env("PORT", port.to_string())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let stderr = child.stderr.take().context("stderr")?;
    let mut lines = tokio::io::BufReader::new(stderr).lines();
    let listening = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(line) = lines.next_line().await? {
            if line.contains("listening") {
                return Ok::<_, anyhow::Error>(());
            }
        }
        bail!("server-everything exited before listening")
    })
    .await;
    listening.map_err(|_| anyhow!("server-everything did not listen within 20 s"))??;
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok(HttpServer {
        child,
        url: format!("http://127.0.0.1:{port}/mcp"),
    })
}

#[tokio::test]
async fn streamable_http_lists_and_calls_concurrently() -> Result<()> {
    let mut server = everything_http().await?;
    let hub = hub();
    let (listed, catalog) = listed(&hub, &[McpServerConfig::http("docs", &server.url)]).await?;
    assert!(listed.errors.is_empty(), "{:?}", listed.errors);
    assert!(catalog.get("docs.get-sum").is_some());
    let report = run(
        &listed,
        &catalog,
        "const sums = await Promise.all([1, 2, 3].map((a) => tools.docs['get-sum']({a, b: 10}))); \
         const w = await tools.docs['get-structured-content']({location: 'New York'}); \
         return {sums, humidity: typeof w.humidity};",
    )
    .await?;
    let result = value(report)?;
    let sums = serde_json::to_string(&result["sums"])?;
    assert!(
        sums.contains("11") && sums.contains("12") && sums.contains("13"),
        "{result}"
    );
    assert_eq!(result["humidity"], "number");
    hub.shutdown().await;
    server.child.kill().await?;
    Ok(())
}
