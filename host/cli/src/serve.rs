//! `corral serve`: the durable runtime server, and `corral manifest hash FILE`.
//!
//! This file is the one place that opens the store, picks the turn engine, starts the server
//! and stops it on SIGINT/SIGTERM (graceful shutdown lives in `corral_server::Server::run`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context as _, bail};
use corral_mcp::{EnvSecretResolver, McpHub, McpHubOptions};
use corral_server::manifest::{Manifest, manifest_hash};
use corral_server::script::ScriptRunner;
use corral_server::{Config, Server, StoreLocation, TokenConfig, TurnRunner};
use corral_store::{NewAgent, PostgresOptions, PostgresStore, SqliteStore, Store};

/// `corral serve` options.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// The TOML configuration (listen, store, leaseMs, [[tokens]]).
    #[arg(long, required_unless_present = "demo", conflicts_with = "demo")]
    config: Option<PathBuf>,
    /// Demo mode: an embedded store and an operator token kept in --demo-dir across restarts
    /// (so a `kill -9` and restart resumes the demo's sessions), with the demo agent of
    /// examples/demo-agent.json registered.
    #[arg(long)]
    demo: bool,
    /// With --demo: where the demo keeps its store and its token (`token`).
    #[arg(long, default_value = "target/corral-demo", requires = "demo")]
    demo_dir: PathBuf,
    /// With --demo: start over, with an empty store and a new token.
    #[arg(long, requires = "demo")]
    fresh: bool,
    /// With --demo: where to listen.
    #[arg(long, default_value = "127.0.0.1:8787", requires = "demo")]
    listen: SocketAddr,
    /// With --demo: the agent manifest to register.
    #[arg(long, default_value = "examples/demo-agent.json", requires = "demo")]
    agent: PathBuf,
}

/// `corral manifest hash FILE`.
pub fn manifest_hash_command(file: &Path) -> ExitCode {
    let result = std::fs::read_to_string(file)
        .with_context(|| format!("cannot read {}", file.display()))
        .and_then(|text| {
            serde_json::from_str::<serde_json::Value>(&text)
                .with_context(|| format!("{} is not JSON", file.display()))
        });
    match result {
        Ok(manifest) => {
            println!("{}", manifest_hash(&manifest));
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("corral manifest hash: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// Runs `corral serve` until SIGINT or SIGTERM (SIGHUP reloads the tokens).
pub fn run(args: ServeArgs) -> ExitCode {
    let loaded = match load(&args) {
        Ok(loaded) => loaded,
        Err(error) => {
            eprintln!("corral serve: {error:#}");
            return ExitCode::FAILURE;
        }
    };
    let _tracing = crate::logging::init("warn", loaded.config.log_format, &loaded.config.tracing);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("corral serve: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(serve(args, loaded)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("corral serve: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// The configuration to start with: the file's, or the demo's.
struct Loaded {
    config: Config,
    /// The demo's token and folder.
    demo: Option<(String, PathBuf)>,
}

fn load(args: &ServeArgs) -> anyhow::Result<Loaded> {
    if args.demo {
        let folder = args.demo_dir.clone();
        let token = demo_token(&folder, args.fresh)?;
        let config = Config::new(
            args.listen,
            StoreLocation::Sqlite(folder.join("corral.db")),
            Config::DEFAULT_LEASE,
            vec![TokenConfig::application(&token, None).named("demo")],
        )?;
        return Ok(Loaded {
            config,
            demo: Some((token, folder)),
        });
    }
    let path = args
        .config
        .as_deref()
        .context("--config FILE is required")?;
    Ok(Loaded {
        config: Config::from_file(path)?,
        demo: None,
    })
}

/// Reloads the tokens from `path` on every SIGHUP, until the process ends. A file that does not
/// validate is logged and changes nothing.
fn reload_on_hangup(path: Option<PathBuf>, reloader: corral_server::tokens::TokenReloader) {
    #[cfg(unix)]
    tokio::spawn(async move {
        use tokio::signal::unix::{SignalKind, signal};
        let Ok(mut hangups) = signal(SignalKind::hangup()) else {
            tracing::warn!("cannot listen for SIGHUP; tokens will not be reloaded");
            return;
        };
        while hangups.recv().await.is_some() {
            let Some(path) = &path else {
                tracing::warn!("SIGHUP: the demo has no configuration file to reload");
                continue;
            };
            match Config::from_file(path) {
                Ok(config) => {
                    let reloaded = reloader.reload(&config);
                    tracing::info!(
                        tokens = reloaded.tokens,
                        path = %path.display(),
                        "SIGHUP: tokens reloaded"
                    );
                    if !reloaded.needs_restart.is_empty() {
                        tracing::warn!(
                            settings = ?reloaded.needs_restart,
                            "SIGHUP: only tokens are reloaded; these changed settings take effect at the next start"
                        );
                    }
                }
                Err(error) => tracing::error!(
                    %error,
                    path = %path.display(),
                    "SIGHUP: the configuration is invalid; keeping the current tokens"
                ),
            }
        }
    });
    #[cfg(not(unix))]
    let _ = (path, reloader);
}

/// The turn engine: the chat runtime, with scripts in one sandbox for the process.
/// `CORRAL_TURN_ENGINE=script` selects the server's small scripted engine instead (its effects
/// logged to `$CORRAL_SCRIPT_EFFECT_LOG`), which the server's own crash loop uses to test the
/// server's invariants apart from the chat runtime.
/// Agents' MCP servers live in `hub` (stopped after the server's graceful shutdown).
fn runner(config: &Config, hub: &McpHub) -> anyhow::Result<Arc<dyn TurnRunner>> {
    if std::env::var("CORRAL_TURN_ENGINE").as_deref() == Ok("script") {
        let log = std::env::var_os("CORRAL_SCRIPT_EFFECT_LOG").map(PathBuf::from);
        return Ok(Arc::new(ScriptRunner::new(log)));
    }
    let sandbox = corral_sandbox::Sandbox::new(corral_sandbox::SandboxConfig::default())
        .context("loading the sandbox")?;
    Ok(Arc::new(
        corral_server::ChatTurnRunner::with_mcp(sandbox, hub.clone())
            .with_webhook_secret(config.webhook_secret.clone()),
    ))
}

async fn open_store(location: &StoreLocation) -> anyhow::Result<Arc<dyn Store>> {
    Ok(match location {
        StoreLocation::Sqlite(path) => {
            if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
                std::fs::create_dir_all(parent)
                    .with_context(|| format!("cannot create {}", parent.display()))?;
            }
            Arc::new(SqliteStore::open(path)?)
        }
        StoreLocation::Postgres(url) => {
            Arc::new(PostgresStore::connect(PostgresOptions::from_url(url)?).await?)
        }
        other => bail!("unsupported store {other:?}"),
    })
}

async fn serve(args: ServeArgs, loaded: Loaded) -> anyhow::Result<()> {
    let Loaded { config, demo } = loaded;
    let store = open_store(&config.store).await?;
    if let Some((token, _)) = &demo {
        let text = std::fs::read_to_string(&args.agent)
            .with_context(|| format!("cannot read {}", args.agent.display()))?;
        let value: serde_json::Value = serde_json::from_str(&text)?;
        let manifest = Manifest::from_value(&value)?;
        store
            .put_agent(NewAgent::new(
                &manifest.id,
                value.clone(),
                manifest_hash(&value),
                "1",
            ))
            .await?;
        if let Some((_, folder)) = &demo {
            println!(
                "demo store: {} (kept across restarts; --fresh starts over)",
                folder.display()
            );
        }
        println!("demo agent: {} ({})", manifest.id, manifest_hash(&value));
        println!("token: {token}");
    }
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.listen))?;
    let address = listener.local_addr()?;
    // MCP secrets ({"secretRef": "NAME"} in a manifest) come from $CORRAL_SECRET_NAME.
    let hub = McpHub::new(
        Arc::new(EnvSecretResolver::default()),
        McpHubOptions::default(),
    );
    let runner = runner(&config, &hub)?;
    let server = Server::new(config, Arc::clone(&store), runner);
    reload_on_hangup(args.config.clone(), server.token_reloader());
    println!("listening on http://{address}");
    println!("console: http://{address}/console (sign in with a token)");
    let served = server.run(listener, shutdown_signal()).await;
    hub.shutdown().await;
    drop(store);
    served.context("the server failed")
}

/// The demo's token, kept in `folder/token` so that a restart (after `kill -9` too) serves
/// the same sessions to the same token; with `fresh`, the folder is emptied first.
fn demo_token(folder: &Path, fresh: bool) -> anyhow::Result<String> {
    if fresh && folder.exists() {
        std::fs::remove_dir_all(folder)
            .with_context(|| format!("cannot empty {}", folder.display()))?;
    }
    std::fs::create_dir_all(folder)
        .with_context(|| format!("cannot create {}", folder.display()))?;
    let path = folder.join("token");
    match std::fs::read_to_string(&path) {
        Ok(token) if token.trim().chars().count() >= corral_server::config::MIN_TOKEN_CHARS => {
            Ok(token.trim().to_owned())
        }
        _ => {
            let token = format!("demo-{}", uuid_like());
            std::fs::write(&path, format!("{token}\n"))
                .with_context(|| format!("cannot write {}", path.display()))?;
            Ok(token)
        }
    }
}

/// A random-enough id for the demo token, without another dependency.
fn uuid_like() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut out = String::new();
    for _ in 0..2 {
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        out.push_str(&format!("{:016x}", hasher.finish()));
    }
    out
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(term) => term,
                Err(_) => {
                    let _ = tokio::signal::ctrl_c().await;
                    return;
                }
            };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
