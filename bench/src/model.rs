//! What the model sees (issue 36): tokens of `run_js`'s description with and without discovery
//! on catalogs built from real `tools/list` results, the fuel of enumerating `tools` over 100,
//! 1,000 and 10,000 capabilities, and the time pre-flight takes on a typical script.

use std::sync::Arc;
use std::time::Instant;

use corral_catalog::{Catalog, DEFAULT_DISCOVERY_TOKENS, render_prompt, render_prompt_within};
use corral_sandbox::{Sandbox, SessionLimits, SessionOptions};
use serde_json::{Value, json};

use crate::workloads::{BenchBackend, Plan};

/// The corpus servers (host/catalog/corpus), each under its own namespace, `copies` times.
fn corpus(copies: usize, only: Option<&str>) -> anyhow::Result<Catalog> {
    let dir = crate::repo_root().join("host/catalog/corpus");
    let mut servers: Vec<String> = std::fs::read_dir(&dir)?
        .filter_map(|entry| entry.ok()?.path().file_stem()?.to_str().map(str::to_owned))
        .filter(|stem| dir.join(format!("{stem}.json")).exists())
        .filter(|stem| only.is_none_or(|only| only == stem))
        .collect();
    servers.sort();
    let mut capabilities = Vec::new();
    for copy in 0..copies {
        for server in &servers {
            let namespace = match copy {
                0 => server.clone(),
                k => format!("{server}-{k}"),
            };
            let text = std::fs::read_to_string(dir.join(format!("{server}.json")))?;
            capabilities.extend(
                Catalog::from_mcp_tools_json(&text, &namespace)?
                    .capabilities()
                    .iter()
                    .cloned(),
            );
        }
    }
    Ok(Catalog::new(capabilities)?)
}

/// `n` capabilities `ns{i % 10}.group{(i / 10) % 10}.tool{i}`, as `tests/all/fuel.rs` has them.
fn nested(n: usize) -> anyhow::Result<Catalog> {
    let capabilities: Vec<Value> = (0..n)
        .map(|i| {
            json!({"id": format!("ns{}.group{}.tool{i}", i % 10, (i / 10) % 10),
                "input_schema": {"type": "object"}})
        })
        .collect();
    Ok(Catalog::from_json_str(
        &json!({ "capabilities": capabilities }).to_string(),
    )?)
}

const ENUMERATIONS: [(&str, &str); 3] = [
    ("Object.keys(tools)", "return Object.keys(tools).length"),
    (
        "for...in over three levels",
        "let n = 0; for (const a in tools) { const x = tools[a]; if (typeof x === 'object') \
         for (const b in x) { const y = x[b]; if (typeof y === 'object') for (const c in y) n++; } } \
         return n",
    ),
    (
        "JSON.stringify(tools)",
        "return JSON.stringify(tools).length",
    ),
];

/// A script as a model writes one: concurrent calls, a loop, a conditional call, a log.
const TYPICAL: &str =
    "const orders = await Promise.all(['a', 'b', 'c'].map(id => tools.ns1.group1.tool11({id})));
const totals = orders.map(o => o.total ?? 0);
let sum = 0;
for (const t of totals) sum += t;
if (sum > 100) {
  await tools.ns2.group2.tool22({note: `large: ${sum}`});
}
const summary = { count: orders.length, sum, first: orders[0] };
console.log('done', summary);
return await tools.ns3.group3.tool33({summary});";

pub async fn model_context(plan: Plan, sandbox: &Sandbox) -> anyhow::Result<Value> {
    let mut tokens = Vec::new();
    for (name, catalog) in [
        ("github (1 server)", corpus(1, Some("github"))?),
        ("the corpus (14 servers)", corpus(1, None)?),
        ("the corpus three times (42 servers)", corpus(3, None)?),
    ] {
        let full = render_prompt(&catalog)?;
        let sent = render_prompt_within(&catalog, DEFAULT_DISCOVERY_TOKENS)?;
        tokens.push(json!({"catalog": name, "tools": catalog.len(),
            "full": full.approx_tokens, "sent": sent.approx_tokens, "discovery": sent.discovery}));
    }

    let sizes: &[usize] = if plan.quick {
        &[100]
    } else {
        &[100, 1_000, 10_000]
    };
    let mut enumeration = Vec::new();
    for size in sizes {
        let catalog = Arc::new(nested(*size)?);
        let mut row = json!({"capabilities": size});
        for (name, script) in ENUMERATIONS {
            let options = SessionOptions {
                limits: SessionLimits::default(),
                ..SessionOptions::new(Arc::clone(&catalog), Arc::new(BenchBackend))
            };
            let mut session = sandbox.session(options).await?;
            let report = session.run(script).await;
            row[name] = match report.outcome {
                Ok(_) => json!(report.stats.fuel),
                Err(error) => json!(error.kind()),
            };
        }
        enumeration.push(row);
    }

    let catalog = nested(1_000)?;
    corral_sandbox::preflight(TYPICAL, &catalog)
        .map_err(|error| anyhow::anyhow!("the typical script failed pre-flight: {error}"))?;
    let mut micros = Vec::new();
    let iterations = if plan.quick { 20 } else { 2_000 };
    for _ in 0..iterations {
        let started = Instant::now();
        let _ = corral_sandbox::preflight(TYPICAL, &catalog);
        micros.push(started.elapsed().as_secs_f64() * 1e6);
    }
    micros.sort_by(f64::total_cmp);
    let at = |q: f64| micros[((micros.len() - 1) as f64 * q) as usize];
    Ok(json!({
        "discovery_tokens": DEFAULT_DISCOVERY_TOKENS,
        "tokens": tokens,
        "default_fuel": SessionLimits::default().fuel,
        "enumeration": enumeration,
        "preflight": {"script_bytes": TYPICAL.len(), "capabilities": 1_000,
            "p50_us": at(0.5), "p99_us": at(0.99)},
    }))
}
