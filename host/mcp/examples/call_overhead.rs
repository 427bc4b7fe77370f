//! Per-call overhead of an MCP tool call through corral's `McpBackend`, over stdio and over
//! streamable HTTP, against server-everything's `echo` (a no-op): N sequential calls each way,
//! printed as one JSON line per transport. `bench/peers/mcp/direct.mjs` measures the same server
//! called straight from the TypeScript SDK.
//!
//! ```sh
//! bash host/mcp/tests/install-servers.sh
//! cargo run --release -p corral-mcp --example call_overhead -- [CALLS]
//! ```
#![forbid(unsafe_code)]

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use corral_mcp::{McpBackend, McpHub, McpHubOptions, McpServerConfig, StaticSecrets};
use corral_sandbox::{Backend, Invocation, InvocationContext};
use serde_json::json;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let calls: usize = std::env::args()
        .nth(1)
        .map(|n| n.parse())
        .transpose()?
        .unwrap_or(2000);
    let everything = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../target/node-tools/mcp/node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    anyhow::ensure!(
        everything.exists(),
        "run host/mcp/tests/install-servers.sh first ({} is missing)",
        everything.display()
    );
    let everything = everything.display().to_string();

    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let mut http_server = tokio::process::Command::new("node")
        .args([everything.as_str(), "streamableHttp"])
        .env("PORT", port.to_string())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    // Wait (up to 30 s) until the server accepts connections.
    let mut tries = 0;
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        tries += 1;
        anyhow::ensure!(tries < 300, "server-everything did not listen on {port}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let hub = McpHub::new(Arc::new(StaticSecrets::default()), McpHubOptions::default());
    let servers = [
        (
            "stdio",
            McpServerConfig::stdio("bench", "node", vec![everything.clone(), "stdio".into()]),
        ),
        (
            "http",
            McpServerConfig::http("bench", format!("http://127.0.0.1:{port}/mcp")),
        ),
    ];
    for (transport, server) in servers {
        let listed = hub.catalog(std::slice::from_ref(&server)).await;
        anyhow::ensure!(listed.errors.is_empty(), "{:?}", listed.errors);
        let backend = McpBackend::new(&listed);
        let context = InvocationContext::default();
        let mut samples = Vec::with_capacity(calls);
        for index in 0..calls + 100 {
            let invocation = Invocation {
                capability_id: "bench.echo".into(),
                tool_call_id: format!("bench:{index}"),
                input: json!([{"message": "x"}]),
            };
            let started = Instant::now();
            backend.invoke(&context, invocation).await?;
            if index >= 100 {
                samples.push(started.elapsed());
            }
        }
        samples.sort();
        let micros = |d: Duration| d.as_secs_f64() * 1e6;
        let mean = samples.iter().map(|d| micros(*d)).sum::<f64>() / samples.len() as f64;
        println!(
            "{}",
            json!({
                "client": "corral McpBackend",
                "transport": transport,
                "calls": calls,
                "p50_us": micros(samples[samples.len() / 2]),
                "p99_us": micros(samples[samples.len() * 99 / 100]),
                "mean_us": mean,
            })
        );
    }
    hub.shutdown().await;
    http_server.kill().await?;
    Ok(())
}
