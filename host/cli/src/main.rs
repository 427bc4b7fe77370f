//! `corral`: the command-line front of corral.
//!
//! - `corral exec SCRIPT.js`: run one script in the sandbox and print a JSON report.
//! - `corral chat --model ...`: a terminal chat over the chat runtime, on the embedded store.
//! - `corral catalog typescript|prompt|check FILE.json`: inspect a capability catalog.
//! - `corral serve --config FILE` (or `--demo`): the durable runtime server over HTTP.
//! - `corral manifest hash FILE`: an agent manifest's content hash.

#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod catalog_cmd;
mod chat;
mod exec;
mod logging;
mod mcp_args;
mod serve;
mod webhook;

#[derive(Debug, Parser)]
#[command(
    name = "corral",
    version,
    about = "Hosted chat agents that act by writing code"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a script in the sandbox and print {"ok", "value"|"error", "logs", "stats"} as JSON.
    Exec(exec::ExecArgs),
    /// Chat with an agent in the terminal: scripts are shown and approved before they run.
    Chat(chat::ChatArgs),
    /// Serve the durable runtime over HTTP (sessions, commands, events, executors).
    Serve(serve::ServeArgs),
    /// Agent manifests: `corral manifest hash FILE` prints the manifest's content hash.
    Manifest {
        #[command(subcommand)]
        action: ManifestCommand,
    },
    /// Render or check a capability catalog.
    Catalog {
        #[command(subcommand)]
        action: CatalogCommand,
    },
}

#[derive(Debug, Subcommand)]
enum CatalogCommand {
    /// Print the TypeScript declarations the model sees.
    Typescript(CatalogFile),
    /// Print the `run_js` prompt text (and its approximate size in tokens on stderr).
    Prompt {
        #[command(flatten)]
        catalog: CatalogFile,
        /// Above this many estimated tokens of declarations, print the discovery form (a line
        /// per tool) that `corral chat` and `corral serve` would send.
        #[arg(long, default_value_t = corral_catalog::DEFAULT_DISCOVERY_TOKENS)]
        discovery_tokens: u32,
    },
    /// Validate a catalog; exit 1 with the errors if it is invalid.
    Check(CatalogFile),
}

#[derive(Debug, Subcommand)]
enum ManifestCommand {
    /// Print `sha256:` + hex of the manifest's canonical JSON (what `PUT /v1/agents` reports).
    Hash {
        /// The manifest (JSON).
        file: PathBuf,
    },
}

#[derive(Debug, clap::Args)]
struct CatalogFile {
    /// A corral catalog ({"capabilities": [...]}) or an MCP tools/list result ({"tools": [...]}).
    file: PathBuf,
    /// Id prefix for the tools of an MCP tools/list result.
    #[arg(long)]
    namespace: Option<String>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Exec(args) => exec::run(args),
        Command::Chat(args) => chat::run(args),
        Command::Serve(args) => serve::run(args),
        Command::Manifest {
            action: ManifestCommand::Hash { file },
        } => serve::manifest_hash_command(&file),
        Command::Catalog { action } => {
            let (action, file) = match action {
                CatalogCommand::Typescript(f) => (catalog_cmd::CatalogAction::Typescript, f),
                CatalogCommand::Prompt {
                    catalog,
                    discovery_tokens,
                } => (
                    catalog_cmd::CatalogAction::Prompt(discovery_tokens),
                    catalog,
                ),
                CatalogCommand::Check(f) => (catalog_cmd::CatalogAction::Check, f),
            };
            catalog_cmd::run(action, &file.file, file.namespace.as_deref())
        }
    }
}
