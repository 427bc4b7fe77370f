//! `corral chat`: a terminal chat over the chat runtime, on the embedded store.
//!
//! Each line typed is a turn. Text streams as the model writes it; each script (and, under
//! `--approval calls`, each gated call) is shown and needs a `y` before it runs. The store keeps
//! the conversation and any pending approval: interrupted at the prompt, a later
//! `corral chat --session ID` over the same store asks the same question again.

use std::io::{BufRead as _, Write as _};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use async_trait::async_trait;
use corral_catalog::{Catalog, Redactor};
use corral_chat::{
    ApprovalPolicy, Decision, EventSink, Input, ModelLimits, Resume, RunEvent, RunEventKind,
    RunResult, SandboxExecutorFactory, SinkError, StoreJournal, SuspensionContext,
};
use corral_mcp::McpHub;
use corral_models::Model;
use corral_sandbox::examples::{ExampleBackend, example_catalog};
use corral_sandbox::{Backend, Sandbox, SandboxConfig, SessionLimits};
use corral_store::{
    CheckpointWrite, NewAgent, NewItem, NewSession, SessionCommit, SessionPatch, SessionStatus,
    SqliteStore, Store,
};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::mcp_args::McpFlags;
use crate::webhook::WebhookBackend;

/// Which approval policy.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum ApprovalArg {
    /// Approve each script before it runs.
    Script,
    /// Scripts run; each call to a capability that needs approval asks first.
    Calls,
}

/// Arguments of `corral chat`.
#[derive(Debug, clap::Args)]
pub struct ChatArgs {
    /// `scripted:FILE.json` (a JSON list of replies), `openai:MODEL` or `anthropic:MODEL` (the
    /// key from CORRAL_OPENAI_API_KEY / CORRAL_ANTHROPIC_API_KEY).
    #[arg(long)]
    model: String,
    /// Capability definitions (corral catalog or MCP tools/list JSON); without it the built-in
    /// examples are bound.
    #[arg(long)]
    catalog: Option<PathBuf>,
    /// Id prefix for an MCP tools/list catalog.
    #[arg(long, requires = "catalog")]
    namespace: Option<String>,
    /// Where calls of `--catalog` capabilities are POSTed (the webhook format of `corral exec`).
    #[arg(long)]
    backend_url: Option<String>,
    /// MCP servers whose tools are bound (as in `corral exec`); with them and no `--catalog`,
    /// their tools are the whole catalog.
    #[command(flatten)]
    mcp: Box<McpFlags>,
    /// Each capability as its own model tool instead of `run_js`.
    #[arg(long)]
    direct_tools: bool,
    /// Approve everything without asking.
    #[arg(long)]
    auto_confirm: bool,
    /// Where approval is asked.
    #[arg(long, value_enum, default_value = "script")]
    approval: ApprovalArg,
    /// The embedded store file.
    #[arg(long, default_value = "corral-chat.db")]
    store: PathBuf,
    /// The conversation to continue (a new one when absent).
    #[arg(long)]
    session: Option<String>,
    /// Model calls allowed per turn.
    #[arg(long, default_value_t = 16)]
    max_steps: u32,
    /// The most tokens one tool result may take in the model's context; a larger one is cut
    /// to fit, keeping its shape (docs/chat.md, "Results that fit").
    #[arg(long, default_value_t = corral_chat::DEFAULT_RESULT_TOKENS)]
    result_tokens: u32,
    /// The most tokens `run_js`'s description may spend on declarations; a larger catalog is
    /// listed a line per tool, looked up with `tools.$search`/`$describe` (docs/model-context.md).
    #[arg(long, default_value_t = corral_catalog::DEFAULT_DISCOVERY_TOKENS)]
    discovery_tokens: u32,
    /// Instructions for the model.
    #[arg(
        long,
        default_value = "You are a helpful assistant. Use the run_js tool to act."
    )]
    instructions: String,
}

struct Chat {
    store: Arc<dyn Store>,
    session_id: String,
    model: Arc<dyn Model>,
    catalog: Arc<Catalog>,
    backend: Arc<dyn Backend>,
    factory: Arc<SandboxExecutorFactory>,
    redactor: Arc<Redactor>,
    hub: McpHub,
    args: ChatArgs,
    fingerprint: String,
    /// The running turn's cancellation: Ctrl-C cancels it; with no turn running (at a
    /// prompt), Ctrl-C ends the chat.
    running: Arc<std::sync::Mutex<Option<CancellationToken>>>,
    /// Flushes the traces when the chat ends.
    _tracing: crate::logging::Tracing,
}

/// Where a turn left the chat.
enum Flow {
    /// Ready for the next message.
    Next,
    /// Input ended at an approval prompt: the approval stays pending in the store.
    LeftPending,
}

/// Prints text as it streams, tool activity on stderr.
struct TerminalSink;

#[async_trait]
impl EventSink for TerminalSink {
    async fn emit(&self, event: RunEvent) -> Result<(), SinkError> {
        match &event.kind {
            RunEventKind::TextDelta { text } => {
                print!("{text}");
                let _ = std::io::stdout().flush();
            }
            RunEventKind::ToolFinished {
                name,
                result,
                is_error,
                fuel,
                wall_us,
                whole_bytes,
                ..
            } => {
                let mut shown = result.to_string();
                if let Some(whole) = whole_bytes {
                    shown = format!("(cut to fit from {whole} bytes) {shown}");
                }
                if shown.len() > 400 {
                    shown.truncate(shown.floor_char_boundary(400));
                    shown.push('…');
                }
                let label = if *is_error { "failed" } else { "returned" };
                eprintln!("\n[{name} {label} after {wall_us} µs, {fuel} fuel] {shown}");
            }
            RunEventKind::Compaction {
                summarized_messages,
                ..
            } => eprintln!("\n[compacted {summarized_messages} older messages]"),
            _ => {}
        }
        Ok(())
    }
}

fn usage(message: impl std::fmt::Display) -> ExitCode {
    eprintln!("corral chat: {message}");
    ExitCode::from(2)
}

pub fn run(args: ChatArgs) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => return usage(format!("starting the async runtime failed: {error}")),
    };
    let chat = match runtime.block_on(Chat::open(args)) {
        Ok(chat) => chat,
        Err(message) => return usage(message),
    };
    eprintln!(
        "corral chat: session {} in {} (type a message; an empty line or end of input quits)",
        chat.session_id,
        chat.args.store.display()
    );
    runtime.spawn(interrupts(
        Arc::clone(&chat.running),
        chat.hub.clone(),
        format!(
            "corral chat --session {} --store {}",
            chat.session_id,
            chat.args.store.display()
        ),
    ));
    let code = match chat.converse(&runtime) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("corral chat: {message}");
            ExitCode::from(1)
        }
    };
    // MCP servers are stopped, not left to notice that their stdin closed.
    runtime.block_on(chat.hub.shutdown());
    code
}

/// Ctrl-C during a turn cancels the turn (the model stream and the script stop); at a prompt it
/// ends the chat. A pending approval was committed before its prompt, so it is asked again by
/// `continue_with`.
async fn interrupts(
    running: Arc<std::sync::Mutex<Option<CancellationToken>>>,
    hub: McpHub,
    continue_with: String,
) {
    while tokio::signal::ctrl_c().await.is_ok() {
        let turn = running.lock().ok().and_then(|mut r| r.take());
        match turn {
            Some(turn) => turn.cancel(),
            None => {
                eprintln!("\n[interrupted; continue with: {continue_with}]");
                hub.shutdown().await;
                std::process::exit(130);
            }
        }
    }
}

fn unique_suffix() -> String {
    let millis = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros());
    format!("{millis:x}")
}

fn load_model(spec: &str) -> Result<Arc<dyn Model>, String> {
    corral_models::model_from_spec(spec).map_err(|e| format!("--model {spec}: {e}"))
}

impl Chat {
    async fn open(args: ChatArgs) -> Result<Chat, String> {
        let model = load_model(&args.model)?;
        let servers = args.mcp.servers()?;
        let (catalog, backend): (Option<Catalog>, Option<Arc<dyn Backend>>) = match &args.catalog {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| format!("reading {}: {e}", path.display()))?;
                let catalog = Catalog::from_any_json_str(&text, args.namespace.as_deref())
                    .map_err(|e| format!("{}: {e}", path.display()))?;
                let url = args
                    .backend_url
                    .as_deref()
                    .ok_or("--catalog needs --backend-url (where the calls go)")?;
                let backend =
                    WebhookBackend::new(url).map_err(|e| format!("--backend-url: {e}"))?;
                (Some(catalog), Some(Arc::new(backend)))
            }
            // With MCP servers and no --catalog, their tools are the whole catalog.
            None if !servers.is_empty() => (None, None),
            None => (Some(example_catalog()), Some(Arc::new(ExampleBackend))),
        };
        let _tracing = args.mcp.init_logging();
        let hub = args.mcp.hub();
        let bound = hub
            .bind(&servers, catalog, backend)
            .await
            .map_err(|e| e.to_string())?;
        for error in &bound.errors {
            eprintln!("corral chat: MCP: {error}");
        }
        let catalog = Arc::new(bound.catalog);
        let backend = bound.backend;
        let redactor = Arc::new(bound.redactor);
        let sandbox = Sandbox::new(SandboxConfig::default())
            .map_err(|e| format!("loading the sandbox failed: {e}"))?;
        let factory = Arc::new(
            SandboxExecutorFactory::new(sandbox, SessionLimits::default())
                .with_redactor(Arc::clone(&redactor)),
        );
        let store: Arc<dyn Store> = Arc::new(
            SqliteStore::open(&args.store)
                .map_err(|e| format!("opening {}: {e}", args.store.display()))?,
        );
        let fingerprint = corral_chat::sha256_json(&json!({
            "capabilities": catalog.capabilities(),
            "direct": args.direct_tools,
            "approval": format!("{:?}", args.approval),
            "mcp": bound.fingerprint,
            "version": env!("CARGO_PKG_VERSION"),
        }));
        store
            .put_agent(NewAgent::new(
                "corral-chat",
                json!({"id": "corral-chat"}),
                format!("sha256:{fingerprint}"),
                env!("CARGO_PKG_VERSION"),
            ))
            .await
            .map_err(|e| e.to_string())?;
        let session_id = args
            .session
            .clone()
            .unwrap_or_else(|| format!("chat-{}", unique_suffix()));
        store
            .create_session(NewSession::new(
                session_id.clone(),
                "local",
                "local",
                "corral-chat",
                json!({}),
            ))
            .await
            .map_err(|e| format!("session {session_id}: {e}"))?;
        Ok(Chat {
            store,
            session_id,
            model,
            catalog,
            backend,
            factory,
            redactor,
            hub,
            args,
            fingerprint,
            running: Arc::default(),
            _tracing,
        })
    }

    /// A pending approval from an earlier, interrupted chat first, then one turn per line.
    fn converse(&self, runtime: &tokio::runtime::Runtime) -> Result<(), String> {
        if let Some(suspension) = runtime.block_on(self.pending())?
            && let Flow::LeftPending = self.decide_and_resume(runtime, suspension)?
        {
            return Ok(());
        }
        let stdin = std::io::stdin();
        loop {
            eprint!("\nyou> ");
            let mut line = String::new();
            match stdin.lock().read_line(&mut line) {
                Ok(0) | Err(_) => return Ok(()),
                Ok(_) => {}
            }
            let message = line.trim();
            if message.is_empty() {
                return Ok(());
            }
            let turn_id = format!("{}:{}", self.session_id, unique_suffix());
            let result = runtime.block_on(self.turn(&turn_id, message, None, Default::default()));
            if let Flow::LeftPending = self.settle(runtime, result, &turn_id, message)? {
                return Ok(());
            }
        }
    }

    /// The pending approval of a paused session, if any.
    async fn pending(&self) -> Result<Option<SuspensionContext>, String> {
        let session = self
            .store
            .get_session(&self.session_id)
            .await
            .map_err(|e| e.to_string())?;
        if session.status != SessionStatus::Paused {
            return Ok(None);
        }
        let Some(checkpoint) = self
            .store
            .live_checkpoint(&self.session_id)
            .await
            .map_err(|e| e.to_string())?
        else {
            return Ok(None);
        };
        serde_json::from_value(checkpoint.data)
            .map(Some)
            .map_err(|e| format!("the pending checkpoint is unreadable: {e}"))
    }

    async fn turn(
        &self,
        turn_id: &str,
        message: &str,
        resume: Option<Resume>,
        decisions: std::collections::BTreeMap<String, Decision>,
    ) -> Result<RunResult, String> {
        let input = Input {
            model: Arc::clone(&self.model),
            limits: ModelLimits {
                result_tokens: self.args.result_tokens,
                discovery_tokens: self.args.discovery_tokens,
                ..ModelLimits::default()
            },
            store: Arc::new(StoreJournal::new(
                Arc::clone(&self.store),
                self.session_id.clone(),
                turn_id,
                None,
                0,
            )),
            turn_id: turn_id.to_string(),
            message: message.to_string(),
            max_steps: self.args.max_steps,
            sink: Arc::new(TerminalSink),
            backend: Arc::clone(&self.backend),
            redactor: Arc::clone(&self.redactor),
            capabilities: Arc::clone(&self.catalog),
            action_capabilities: Vec::new(),
            executor_factory: Some(self.factory.clone()),
            instructions: self.args.instructions.clone(),
            direct_tools: self.args.direct_tools,
            auto_confirm: self.args.auto_confirm,
            approval: match self.args.approval {
                ApprovalArg::Script => ApprovalPolicy::Script,
                ApprovalArg::Calls => ApprovalPolicy::Calls,
            },
            user: None,
            context: Default::default(),
            fingerprint: self.fingerprint.clone(),
            decisions,
            resume,
            trace_context: None,
        };
        let cancel = CancellationToken::new();
        if let Ok(mut running) = self.running.lock() {
            *running = Some(cancel.clone());
        }
        let result = corral_chat::run(&cancel, input).await;
        if let Ok(mut running) = self.running.lock() {
            *running = None;
        }
        result.map_err(|e| e.to_string())
    }

    /// Records how a turn ended; asks for approval when it suspended, then resumes.
    fn settle(
        &self,
        runtime: &tokio::runtime::Runtime,
        result: Result<RunResult, String>,
        turn_id: &str,
        message: &str,
    ) -> Result<Flow, String> {
        let result = result?;
        let mut commit = SessionCommit::new(self.session_id.clone());
        let mut patch = SessionPatch::default();
        match result {
            RunResult::Completed { items, .. } => {
                println!();
                commit.items = items
                    .into_iter()
                    .map(|item| NewItem::new(item).in_turn(turn_id))
                    .collect();
                commit.checkpoint = Some(CheckpointWrite::Clear);
                patch.status = Some(SessionStatus::Completed);
                patch.active_turn_id = Some(None);
            }
            RunResult::Suspended { suspension } => {
                patch.status = Some(SessionStatus::Paused);
                patch.active_turn_id = Some(Some(turn_id.to_string()));
                commit.patch = patch;
                runtime
                    .block_on(self.store.commit(commit))
                    .map_err(|e| e.to_string())?;
                return self.decide_and_resume(runtime, suspension);
            }
            RunResult::Cancelled => {
                eprintln!("\n[cancelled]");
                commit.checkpoint = Some(CheckpointWrite::Clear);
                patch.status = Some(SessionStatus::Cancelled);
                patch.active_turn_id = Some(None);
            }
            other => {
                eprintln!("\n[the turn ended: {other:?}] (message: {message})");
                commit.checkpoint = Some(CheckpointWrite::Clear);
                patch.status = Some(SessionStatus::Failed);
                patch.active_turn_id = Some(None);
            }
        }
        commit.patch = patch;
        runtime
            .block_on(self.store.commit(commit))
            .map_err(|e| e.to_string())?;
        Ok(Flow::Next)
    }

    fn decide_and_resume(
        &self,
        runtime: &tokio::runtime::Runtime,
        suspension: SuspensionContext,
    ) -> Result<Flow, String> {
        let mut decisions = suspension.decisions.clone();
        for interaction in &suspension.pending {
            if decisions.contains_key(&interaction.interaction_id) {
                continue;
            }
            eprintln!();
            match interaction.arguments.get("code").and_then(Value::as_str) {
                Some(code) if interaction.capability_id.is_none() => {
                    eprintln!("The model wants to run this script:\n---\n{code}\n---");
                }
                _ => eprintln!(
                    "The model wants to call {} with {}",
                    interaction
                        .capability_id
                        .as_deref()
                        .unwrap_or(&interaction.tool_name),
                    interaction.arguments
                ),
            }
            eprint!("approve? [y/N] ");
            let mut answer = String::new();
            match std::io::stdin().lock().read_line(&mut answer) {
                // Interrupted at the prompt: the checkpoint stays; `--session` asks again.
                Ok(0) | Err(_) => {
                    eprintln!(
                        "\n[left pending: run corral chat --session {} --store {} to answer]",
                        self.session_id,
                        self.args.store.display()
                    );
                    return Ok(Flow::LeftPending);
                }
                Ok(_) => {}
            }
            let approved = matches!(answer.trim(), "y" | "Y" | "yes");
            decisions.insert(
                interaction.interaction_id.clone(),
                Decision {
                    approved,
                    reason: (!approved).then(|| "the user said no".to_string()),
                    value: None,
                },
            );
        }
        let turn_id = suspension.turn_id.clone();
        let message = suspension.message.clone();
        let resume = Resume {
            suspension,
            approved: false,
            reason: None,
        };
        let result = runtime.block_on(self.turn(&turn_id, &message, Some(resume), decisions));
        self.settle(runtime, result, &turn_id, &message)
    }
}
