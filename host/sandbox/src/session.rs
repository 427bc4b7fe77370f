//! [`ExecutorSession`]: one guest instance that runs a sequence of scripts, and the host
//! functions it calls.

use std::sync::Arc;
use std::time::{Duration, Instant};

use corral_catalog::{Catalog, Redactor};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use wasmtime::{Store, UpdateDeadline};

use crate::backend::{Backend, InvocationContext};
use crate::bindings::corral::sandbox::types::{
    Binding, CallError, CallValue, LogLevel, RunState, ScriptError as GuestScriptError,
    SessionConfig, User,
};
use crate::calls::{CallEnvironment, CallTable};
use crate::engine::Sandbox;
use crate::grants::Grants;
use crate::limits::{
    DEADLINE_DETAIL, Limit, LimitTrap, MemoryLimiter, SessionLimits, until_deadline,
};
use crate::schedule::{CompletionSchedule, DeliverReady, HeldCall, ScheduleError};

/// Everything a session is created with.
pub struct SessionOptions {
    /// The capabilities to bind: the authorized subset of the catalog, for binding and display.
    /// The backend still authorizes every call.
    pub catalog: Arc<Catalog>,
    /// Runs the calls.
    pub backend: Arc<dyn Backend>,
    /// Applied to every backend result and error before the script sees it.
    pub redactor: Arc<Redactor>,
    /// Attribution handed to the backend with every call.
    pub context: InvocationContext,
    /// The end user shown to scripts as the frozen global `user` (display only), or `None` for
    /// `user === null`.
    pub user: Option<ScriptUser>,
    /// Per-script limits.
    pub limits: SessionLimits,
    /// What ambient authority reaches the guest (by default: none).
    pub grants: Grants,
}

impl std::fmt::Debug for SessionOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionOptions")
            .field("capabilities", &self.catalog.capabilities().len())
            .field("context", &self.context)
            .field("user", &self.user)
            .field("limits", &self.limits)
            .field("grants", &self.grants)
            .finish_non_exhaustive()
    }
}

impl SessionOptions {
    /// Options with default limits, no grants, no user and no redaction.
    pub fn new(catalog: Arc<Catalog>, backend: Arc<dyn Backend>) -> Self {
        SessionOptions {
            catalog,
            backend,
            redactor: Arc::new(Redactor::default()),
            context: InvocationContext::default(),
            user: None,
            limits: SessionLimits::default(),
            grants: Grants::default(),
        }
    }
}

/// The user as scripts see it. Only these three fields ever enter the realm. It deserializes
/// from a JSON object only (serde would otherwise also take `["id", "email", "name"]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ScriptUser {
    /// Stable user id.
    pub id: String,
    /// Email address, if known.
    #[serde(default)]
    pub email: Option<String>,
    /// Name to show, if known.
    #[serde(default)]
    pub display_name: Option<String>,
}

/// The fields of [`ScriptUser`], deserialized from a map alone.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ScriptUserFields {
    id: String,
    #[serde(default)]
    email: Option<String>,
    #[serde(default)]
    display_name: Option<String>,
}

impl<'de> Deserialize<'de> for ScriptUser {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ObjectOnly;
        impl<'de> serde::de::Visitor<'de> for ObjectOnly {
            type Value = ScriptUserFields;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an object {\"id\", \"email\"?, \"displayName\"?}")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<Self::Value, A::Error> {
                ScriptUserFields::deserialize(serde::de::value::MapAccessDeserializer::new(map))
            }
        }
        let fields = deserializer.deserialize_map(ObjectOnly)?;
        Ok(ScriptUser {
            id: fields.id,
            email: fields.email,
            display_name: fields.display_name,
        })
    }
}

/// A log record from `console.*` or `log(level, message, fields)`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LogRecord {
    /// The script that wrote it (`<session>:<n>`).
    pub script_id: String,
    /// `debug`, `info`, `warn` or `error`.
    pub level: String,
    /// The formatted message.
    pub message: String,
    /// Structured fields given to `log(...)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fields: Option<Value>,
}

/// What one script cost.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunStats {
    /// Fuel consumed by guest work (0 when the sandbox does not meter fuel).
    pub fuel: u64,
    /// Wall-clock time of the run, in microseconds.
    pub wall_us: u64,
    /// High-water mark of the session's linear memory, in bytes.
    pub peak_memory_bytes: u64,
    /// Capability calls the script started (including ones rejected by validation).
    pub calls: u32,
    /// Most calls in flight at once.
    pub peak_concurrent_calls: u32,
}

/// The outcome of [`ExecutorSession::run`], with its logs and costs on every path.
#[derive(Debug, Clone)]
pub struct ScriptReport {
    /// The script's return value (`None` for `undefined`), or why it failed.
    pub outcome: Result<Option<Value>, ExecError>,
    /// Log records in the order they were written.
    pub logs: Vec<LogRecord>,
    /// Costs.
    pub stats: RunStats,
}

impl ScriptReport {
    /// The report as `corral exec` prints it: on success
    /// `{"ok": true, "value"?: ..., "logs": [...], "stats": {...}}` (no `value` for `undefined`);
    /// on failure `{"ok": false, "error": {"kind", "message", ...details}, "logs", "stats"}`,
    /// where details are `name`, `stack`, `line`, `column` for script errors and `limit`,
    /// `calls_started` for limits.
    pub fn to_json(&self) -> Value {
        let mut out = serde_json::Map::new();
        out.insert("ok".into(), Value::Bool(self.outcome.is_ok()));
        match &self.outcome {
            Ok(Some(value)) => {
                out.insert("value".into(), value.clone());
            }
            Ok(None) => {}
            Err(error) => {
                out.insert("error".into(), error.to_json());
            }
        }
        out.insert(
            "logs".into(),
            serde_json::to_value(&self.logs).unwrap_or(Value::Null),
        );
        out.insert("stats".into(), self.stats.to_json());
        Value::Object(out)
    }
}

impl RunStats {
    /// `{"fuel", "wall_us", "peak_memory_bytes", "calls"}`.
    pub fn to_json(&self) -> Value {
        serde_json::json!({
            "fuel": self.fuel,
            "wall_us": self.wall_us,
            "peak_memory_bytes": self.peak_memory_bytes,
            "calls": self.calls,
        })
    }
}

/// A JavaScript error that ended a script.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScriptError {
    /// The error's `name` (`TypeError`, `SyntaxError`, `ValidationError`, ...).
    pub name: String,
    /// The error's `message`.
    pub message: String,
    /// Stack trace; line numbers refer to the script.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stack: Option<String>,
    /// 1-based line in the script, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line: Option<u32>,
    /// 1-based column in the script, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub column: Option<u32>,
    /// The `tool_call_id` of the call whose rejection this error is, when the host delivered a
    /// rejection with exactly this `name` and `message` to the script in this run. Set by the
    /// host from its own records, never from anything the script says: only then is the error
    /// a `capability_error` or an `invalid_input` (see [`ExecError::kind`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_rejection: Option<String>,
}

/// The most bytes of a script error's `name` a report carries; longer ones are truncated
/// visibly (see [`truncate_visibly`]).
pub const MAX_ERROR_NAME_BYTES: usize = 256;
/// The most bytes of a script error's `message` a report carries.
pub const MAX_ERROR_MESSAGE_BYTES: usize = 16 << 10;
/// The most bytes of a script error's `stack` a report carries.
pub const MAX_ERROR_STACK_BYTES: usize = 16 << 10;
/// What every log record costs against [`SessionLimits::max_log_bytes`] besides its message
/// and fields (about the size of an empty record in a report), so that empty records are not
/// free.
pub const LOG_RECORD_OVERHEAD_BYTES: u64 = 64;

/// Cuts `text` to at most `max` bytes (on a character boundary), saying so at its end.
fn truncate_visibly(mut text: String, max: usize) -> String {
    if text.len() <= max {
        return text;
    }
    let total = text.len();
    let note = format!("... [truncated: {total} bytes in all]");
    let mut cut = max.saturating_sub(note.len());
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    text.truncate(cut);
    text.push_str(&note);
    text
}

/// Why a script produced no value.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ExecError {
    /// The script threw or its promise rejected (the guest's doing, not a limit).
    #[error("{}: {}", .0.name, .0.message)]
    Script(ScriptError),
    /// A limit stopped the script. The session is discarded.
    #[error("{detail} (limit {}; {calls_started} calls had started)", .limit.kind())]
    LimitExceeded {
        /// Which limit.
        limit: Limit,
        /// How many capability calls the script had started when it was stopped (calls with side
        /// effects may have happened).
        calls_started: u32,
        /// What exactly was exceeded.
        detail: String,
    },
    /// The [`CompletionSchedule`] refused to go on, or chose a batch that cannot be delivered
    /// (a call that is not ready, or nothing while nothing else can become ready): on replay,
    /// the script took another path than the one recorded. The session is discarded.
    #[error("the completion schedule stopped the script: {0}")]
    Schedule(ScheduleError),
    /// The script has nothing left to wait on but calls the host holds
    /// ([`crate::InvokeCapabilityError::Held`]); it cannot finish in this run. Calls that were
    /// running finished and were delivered first. The session is discarded: a host resumes the
    /// work by replaying the script in a new session once the held calls have outcomes.
    #[error("the script is suspended on {} held call(s) ({calls_started} calls had started)", .held.len())]
    Suspended {
        /// The held calls, in the order they were held.
        held: Vec<HeldCall>,
        /// How many capability calls the script had started.
        calls_started: u32,
    },
    /// The script was not run: it is too large or not valid text.
    #[error("invalid script: {0}")]
    InvalidScript(String),
    /// The script was not run: it calls paths of `tools` that bind nothing
    /// ([`crate::PreflightError`]). No fuel was charged and nothing was called; the session
    /// stays usable.
    #[error("{0}")]
    Preflight(crate::PreflightError),
    /// An earlier script of this session hit a limit or trapped; sessions are never reused
    /// after that.
    #[error("the session was discarded after an earlier failure: {0}")]
    SessionDiscarded(String),
    /// The guest trapped for a reason other than a limit (a bug in the guest).
    #[error("the guest trapped: {0}")]
    GuestTrap(String),
    /// The host failed (a bug in corral).
    #[error("the host failed: {0}")]
    Host(String),
}

impl ExecError {
    /// The stable, machine-readable kind used by `corral exec` and the API: for script errors
    /// `capability_error` or `invalid_input` when the error is a call rejection the host
    /// delivered ([`ScriptError::call_rejection`]: a backend failure or a validation failure),
    /// else `script_error` (whatever the error's name says); the limit's kind for limits,
    /// `invalid_input` for rejected scripts, `preflight_error` for calls of unknown `tools` paths,
    /// `replay_drift` for a schedule that stopped the
    /// script, `suspended` for held calls, `internal_error` otherwise.
    pub fn kind(&self) -> &'static str {
        match self {
            ExecError::Script(error) => match (&error.call_rejection, error.name.as_str()) {
                (Some(_), "ValidationError") => "invalid_input",
                (Some(_), "CapabilityError") => "capability_error",
                _ => "script_error",
            },
            ExecError::LimitExceeded { limit, .. } => limit.kind(),
            ExecError::InvalidScript(_) => "invalid_input",
            ExecError::Preflight(_) => "preflight_error",
            ExecError::Schedule(_) => "replay_drift",
            ExecError::Suspended { .. } => "suspended",
            ExecError::SessionDiscarded(_) => "session_discarded",
            ExecError::GuestTrap(_) | ExecError::Host(_) => "internal_error",
        }
    }

    /// `{"kind", "message", ...}` with the details of script errors, limits (`limit`,
    /// `calls_started`) and suspensions (`held`, `calls_started`).
    pub fn to_json(&self) -> Value {
        let mut error = serde_json::Map::new();
        error.insert("kind".into(), Value::from(self.kind()));
        match self {
            ExecError::Script(script) => {
                error.insert("message".into(), Value::from(script.message.clone()));
                error.insert("name".into(), Value::from(script.name.clone()));
                if let Some(stack) = &script.stack {
                    error.insert("stack".into(), Value::from(stack.clone()));
                }
                if let Some(line) = script.line {
                    error.insert("line".into(), Value::from(line));
                }
                if let Some(column) = script.column {
                    error.insert("column".into(), Value::from(column));
                }
                if let Some(tool_call_id) = &script.call_rejection {
                    error.insert("tool_call_id".into(), Value::from(tool_call_id.clone()));
                }
            }
            ExecError::LimitExceeded {
                limit,
                calls_started,
                detail,
            } => {
                error.insert("message".into(), Value::from(detail.clone()));
                error.insert(
                    "limit".into(),
                    serde_json::to_value(limit).unwrap_or(Value::Null),
                );
                error.insert("calls_started".into(), Value::from(*calls_started));
            }
            ExecError::Suspended {
                held,
                calls_started,
            } => {
                error.insert("message".into(), Value::from(self.to_string()));
                error.insert(
                    "held".into(),
                    serde_json::to_value(held).unwrap_or(Value::Null),
                );
                error.insert("calls_started".into(), Value::from(*calls_started));
            }
            ExecError::Preflight(preflight) => {
                error.insert("message".into(), Value::from(self.to_string()));
                if let Some(first) = preflight.unknown.first() {
                    error.insert("line".into(), Value::from(first.line));
                    error.insert("column".into(), Value::from(first.column));
                }
                error.insert(
                    "unknown".into(),
                    serde_json::to_value(&preflight.unknown).unwrap_or(Value::Null),
                );
            }
            other => {
                error.insert("message".into(), Value::from(other.to_string()));
            }
        }
        Value::Object(error)
    }
}

/// Why a session could not be created.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CreateSessionError {
    /// The options ask for more than the sandbox allows.
    #[error("invalid session options: {0}")]
    InvalidOptions(String),
    /// [`SessionLimits::memory_bytes`] is below the size the guest's memory starts with.
    #[error(
        "memory_bytes {memory_bytes} is below the {needed_bytes} bytes the guest's memory starts with"
    )]
    MemoryBelowGuestStart {
        /// The cap asked for.
        memory_bytes: u64,
        /// The guest's initial memory.
        needed_bytes: u64,
    },
    /// Every session slot is in use ([`crate::SandboxConfig::max_sessions`]).
    #[error("no session slot is free: {}", .0.root_cause())]
    Capacity(#[source] wasmtime::Error),
    /// The guest refused the bindings (for example, two capabilities share a JS path).
    #[error("binding the capabilities failed: {0}")]
    Bind(String),
    /// Instantiating or initializing the guest failed.
    #[error("starting the guest failed: {}", .0.root_cause())]
    Guest(#[source] wasmtime::Error),
}

/// The store data of one session.
pub(crate) struct SessionData {
    grants: Grants,
    memory: MemoryLimiter,
    calls: CallTable,
    env: CallEnvironment,
    limits: SessionLimits,
    /// When the current script must be finished.
    deadline: Instant,
    script_id: String,
    logs: Vec<LogRecord>,
    log_bytes: u64,
}

/// A guest instance that runs scripts one after another; `globalThis` carries over between
/// them. Create it with [`Sandbox::session`]; drop it or call [`ExecutorSession::close`] when
/// done (any calls still running are cancelled).
pub struct ExecutorSession {
    store: Store<SessionData>,
    guest: crate::bindings::Sandbox,
    sandbox: Sandbox,
    scripts_run: u32,
    /// Set once a limit or trap ended a script; later runs are refused.
    discarded: Option<String>,
    /// This session's place in the count of a sandbox without a pool (after `store`, so it is
    /// given back once the guest's memory is gone).
    _count: Option<crate::engine::SessionCount>,
}

impl std::fmt::Debug for ExecutorSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecutorSession")
            .field("id", &self.store.data().env.context.session_id)
            .field("scripts_run", &self.scripts_run)
            .field("discarded", &self.discarded)
            .finish_non_exhaustive()
    }
}

impl Sandbox {
    /// Creates a session: a fresh guest instance with the capabilities bound.
    pub async fn session(
        &self,
        options: SessionOptions,
    ) -> Result<ExecutorSession, CreateSessionError> {
        let config = &self.inner.config;
        let limits = options.limits;
        limits
            .check(config.max_memory_bytes)
            .map_err(CreateSessionError::InvalidOptions)?;
        let count = match &self.inner.unpooled_sessions {
            None => None,
            Some(alive) => Some(
                crate::engine::SessionCount::take(alive, config.max_sessions).ok_or_else(|| {
                    CreateSessionError::Capacity(wasmtime::Error::msg(format!(
                        "all {} sessions of this sandbox are in use",
                        config.max_sessions
                    )))
                })?,
            ),
        };
        let bindings: Vec<Binding> = options
            .catalog
            .capabilities()
            .iter()
            .map(|c| Binding {
                id: c.id.clone(),
                js_path: (c.js_path.iter().map(String::as_str).ne(c.id.split('.')))
                    .then(|| c.js_path.clone()),
            })
            .collect();
        let session_config = SessionConfig {
            bindings,
            user: options.user.map(|u| User {
                id: u.id,
                email: u.email,
                display_name: u.display_name,
            }),
            random_seed: options.grants.random_seed(),
            clock: options.grants.guest_clock(),
            max_result_bytes: limits.max_result_bytes,
        };
        let data = SessionData {
            grants: options.grants,
            memory: MemoryLimiter {
                limit_bytes: limits.memory_bytes,
                peak_bytes: 0,
                refused_bytes: None,
            },
            calls: CallTable::new(limits.max_concurrent_calls),
            env: CallEnvironment {
                catalog: options.catalog,
                backend: options.backend,
                redactor: options.redactor,
                context: Arc::new(options.context),
            },
            deadline: Instant::now() + Duration::from_millis(limits.timeout_ms),
            script_id: String::new(),
            logs: Vec::new(),
            log_bytes: 0,
            limits,
        };
        let mut store = Store::new(&self.inner.engine, data);
        store.limiter(|data| &mut data.memory);
        if config.fuel {
            // Instantiating and binding are the host's work, not the script's: they are not
            // charged to the script's budget (each run sets its own), so any `fuel` >= 1 starts.
            store
                .set_fuel(u64::MAX)
                .map_err(CreateSessionError::Guest)?;
        }
        if config.deadline_by_fuel() {
            // Every interval the guest yields and the host checks the clock
            // (`limits::until_deadline`); cannot fail when fuel is enabled.
            store
                .fuel_async_yield_interval(Some(crate::engine::FUEL_YIELD_INTERVAL))
                .map_err(CreateSessionError::Guest)?;
        }
        if config.deadline_by_epochs() {
            store.epoch_deadline_callback(|context| {
                if Instant::now() >= context.data().deadline {
                    Err(LimitTrap::deadline())
                } else {
                    Ok(UpdateDeadline::Yield(1))
                }
            });
            store.set_epoch_deadline(1);
        }
        let guest = self.inner.pre.instantiate_async(&mut store).await;
        // A cap below the guest's initial memory refuses instantiation itself: that is the
        // caller's option, not a guest failure.
        if let (Err(_), Some(needed_bytes)) = (&guest, store.data().memory.refused_bytes) {
            return Err(CreateSessionError::MemoryBelowGuestStart {
                memory_bytes: limits_memory(&store),
                needed_bytes,
            });
        }
        let guest = guest.map_err(|e| {
            if e.is::<wasmtime::PoolConcurrencyLimitError>() {
                CreateSessionError::Capacity(e)
            } else {
                CreateSessionError::Guest(e)
            }
        })?;
        guest
            .corral_sandbox_session()
            .call_init(&mut store, &session_config)
            .await
            .map_err(CreateSessionError::Guest)?
            .map_err(CreateSessionError::Bind)?;
        Ok(ExecutorSession {
            store,
            guest,
            sandbox: self.clone(),
            scripts_run: 0,
            discarded: None,
            _count: count,
        })
    }
}

impl ExecutorSession {
    /// The session id given in [`SessionOptions::context`].
    pub fn id(&self) -> &str {
        &self.store.data().env.context.session_id
    }

    /// Whether an earlier script ended the session (limit or trap).
    pub fn is_discarded(&self) -> bool {
        self.discarded.is_some()
    }

    /// Runs one script, the body of an async function. Never panics and never leaves the
    /// session half-run: every path returns a report with logs and costs. Delivers every
    /// completion as soon as it is ready ([`DeliverReady`]).
    pub async fn run(&mut self, source: &str) -> ScriptReport {
        self.run_scheduled(source, &mut DeliverReady).await
    }

    /// Runs one script like [`ExecutorSession::run`], with `schedule` choosing which ready
    /// completions reach the guest in each batch (to record a run's batches, or replay them).
    pub async fn run_scheduled(
        &mut self,
        source: &str,
        schedule: &mut dyn CompletionSchedule,
    ) -> ScriptReport {
        let started = Instant::now();
        let script_id = format!("{}:{}", self.id(), self.scripts_run);
        self.scripts_run += 1;
        if let Some(reason) = &self.discarded {
            return ScriptReport {
                outcome: Err(ExecError::SessionDiscarded(reason.clone())),
                logs: Vec::new(),
                stats: RunStats::default(),
            };
        }
        let config = &self.sandbox.inner.config;
        let limits = self.store.data().limits.clone();
        if source.len() as u64 > limits.max_script_bytes {
            return ScriptReport {
                outcome: Err(ExecError::InvalidScript(format!(
                    "the script is {} bytes, over the {} byte limit",
                    source.len(),
                    limits.max_script_bytes
                ))),
                logs: Vec::new(),
                stats: RunStats::default(),
            };
        }

        if let Err(error) = crate::preflight::preflight(source, &self.store.data().env.catalog) {
            return ScriptReport {
                outcome: Err(ExecError::Preflight(error)),
                logs: Vec::new(),
                stats: RunStats {
                    wall_us: u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX),
                    ..RunStats::default()
                },
            };
        }

        let deadline = started + Duration::from_millis(limits.timeout_ms);
        {
            let data = self.store.data_mut();
            data.calls.reset();
            data.calls.answers_at_start = schedule.answers_at_start();
            data.logs.clear();
            data.log_bytes = 0;
            data.script_id = script_id;
            data.deadline = deadline;
        }
        let fuel_before = if config.fuel {
            // Setting fuel cannot fail when fuel is enabled.
            let _ = self.store.set_fuel(limits.fuel);
            Some(limits.fuel)
        } else {
            None
        };
        let _deadline = self.sandbox.inner.ticker.as_ref().map(|ticker| {
            self.store.set_epoch_deadline(1);
            ticker.register(deadline)
        });

        // If this future is dropped mid-run (the caller was cancelled), the guest stops at an
        // arbitrary point; the session must not run anything after that.
        self.discarded = Some("an earlier run was cancelled before it finished".into());
        let result = self.drive(source, schedule, fuel_before).await;
        self.discarded = None;

        let fuel = fuel_consumed(&self.store, fuel_before);
        let data = self.store.data_mut();
        let calls_started = data.calls.started;
        let call_rejection = |name: &str, message: &str| data.calls.rejection_id(name, message);
        let stats = RunStats {
            fuel,
            wall_us: u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX),
            peak_memory_bytes: data.memory.peak_bytes,
            calls: calls_started,
            peak_concurrent_calls: data.calls.peak_in_flight,
        };
        let outcome = match result {
            Ok(Finished::ResultTooLarge) => Err(ExecError::LimitExceeded {
                limit: Limit::ResultSize,
                calls_started,
                detail: format!(
                    "the result's JSON text is over the {} byte limit (serializing stopped there)",
                    limits.max_result_bytes
                ),
            }),
            Ok(Finished::Done(Ok(None))) => Ok(None),
            Ok(Finished::Done(Ok(Some(json)))) => {
                if json.len() as u64 > limits.max_result_bytes {
                    Err(ExecError::LimitExceeded {
                        limit: Limit::ResultSize,
                        calls_started,
                        detail: format!(
                            "the result is {} bytes of JSON, over the {} byte limit",
                            json.len(),
                            limits.max_result_bytes
                        ),
                    })
                } else {
                    crate::json::parse_guest_json(&json).map(Some).map_err(|e| {
                        ExecError::GuestTrap(format!("the guest returned invalid JSON: {e}"))
                    })
                }
            }
            Ok(Finished::Done(Err(error))) => Err(ExecError::Script(ScriptError {
                call_rejection: call_rejection(&error.name, &error.message),
                name: truncate_visibly(error.name, MAX_ERROR_NAME_BYTES),
                message: truncate_visibly(error.message, MAX_ERROR_MESSAGE_BYTES),
                stack: error
                    .stack
                    .map(|stack| truncate_visibly(stack, MAX_ERROR_STACK_BYTES)),
                line: error.line,
                column: error.column,
            })),
            Err(Stopped::Trap(trap)) => Err(classify_trap(&trap, calls_started)),
            Err(Stopped::Schedule(error)) => Err(ExecError::Schedule(error)),
            Err(Stopped::Suspended(held)) => Err(ExecError::Suspended {
                held,
                calls_started,
            }),
        };
        let data = self.store.data_mut();
        data.calls.reset();
        let logs = std::mem::take(&mut data.logs);
        if let Err(error) = &outcome
            && !matches!(error, ExecError::Script(_))
        {
            self.discarded = Some(error.to_string());
        }
        ScriptReport {
            outcome,
            logs,
            stats,
        }
    }

    /// Ends the session, cancelling calls still running. Dropping it does the same.
    pub fn close(self) {}

    /// The host's side of the resumable world: `run`, then while the guest is `waiting`, the
    /// next batch of completions (chosen by `schedule` among the ready ones, waiting for calls
    /// to finish under the deadline) goes to `resume`.
    async fn drive(
        &mut self,
        source: &str,
        schedule: &mut dyn CompletionSchedule,
        fuel_before: Option<u64>,
    ) -> Result<Finished, Stopped> {
        let session = self.guest.corral_sandbox_session();
        let deadline = self.store.data().deadline;
        let mut state = until_deadline(deadline, session.call_run(&mut self.store, source))
            .await
            .map_err(Stopped::Trap)?;
        let mut wait_index = 0u32;
        loop {
            match state {
                RunState::Done(result) => return Ok(Finished::Done(result)),
                RunState::ResultTooLarge => return Ok(Finished::ResultTooLarge),
                RunState::Waiting => {}
            }
            let batch = loop {
                let fuel = fuel_consumed(&self.store, fuel_before);
                let data = self.store.data_mut();
                data.calls.collect_finished(&data.env);
                check_call_bytes(&data.calls, &data.limits).map_err(Stopped::Trap)?;
                if data.calls.is_idle() {
                    return Err(Stopped::Trap(wasmtime::Error::msg(
                        "the guest waited for completions with no call pending",
                    )));
                }
                let ready = data.calls.ready_ids();
                let ids = schedule
                    .next_batch(wait_index, &ready, fuel)
                    .map_err(Stopped::Schedule)?;
                if !ids.is_empty() {
                    break data
                        .calls
                        .take_batch(&ids)
                        .map_err(|e| Stopped::Schedule(ScheduleError(e)))?;
                }
                if !data.calls.has_running() {
                    let held = data.calls.take_held();
                    if held.is_empty() {
                        return Err(Stopped::Schedule(ScheduleError(format!(
                            "the schedule delivered nothing at wait {wait_index} while nothing else can become ready (ready: {ready:?})"
                        ))));
                    }
                    return Err(Stopped::Suspended(held));
                }
                let deadline = tokio::time::Instant::from_std(data.deadline);
                if tokio::time::timeout_at(deadline, data.calls.wait_finished(&data.env))
                    .await
                    .is_err()
                {
                    return Err(Stopped::Trap(LimitTrap::error(
                        Limit::Deadline,
                        "the script's deadline passed while it waited on capability calls",
                    )));
                }
            };
            wait_index += 1;
            state = until_deadline(deadline, session.call_resume(&mut self.store, &batch))
                .await
                .map_err(Stopped::Trap)?;
        }
    }
}

/// How a script the guest finished ended.
enum Finished {
    /// Its value's JSON text (none for `undefined`) or its error.
    Done(Result<Option<String>, GuestScriptError>),
    /// Its value's JSON text is over `max_result_bytes`; the guest stopped serializing it.
    ResultTooLarge,
}

/// Why [`ExecutorSession::drive`] stopped before the script finished.
enum Stopped {
    /// The guest trapped, a host function hit a limit, or the deadline passed while waiting.
    Trap(wasmtime::Error),
    /// The schedule refused to go on.
    Schedule(ScheduleError),
    /// Only held calls were left to wait on.
    Suspended(Vec<HeldCall>),
}

fn limits_memory(store: &Store<SessionData>) -> u64 {
    store.data().limits.memory_bytes
}

/// Traps once the host holds more for the script's calls than `max_call_bytes`.
fn check_call_bytes(calls: &CallTable, limits: &SessionLimits) -> wasmtime::Result<()> {
    if calls.held_bytes > limits.max_call_bytes {
        return Err(LimitTrap::error(
            Limit::CallMemory,
            format!(
                "the host held {} bytes of call inputs and undelivered results, over the {} byte limit",
                calls.held_bytes, limits.max_call_bytes
            ),
        ));
    }
    Ok(())
}

/// Fuel the current script has used so far (0 without fuel metering).
fn fuel_consumed(store: &Store<SessionData>, fuel_before: Option<u64>) -> u64 {
    fuel_before.map_or(0, |before| {
        before.saturating_sub(store.get_fuel().unwrap_or(0))
    })
}

/// Turns a trap into the limit that caused it, if any.
fn classify_trap(error: &wasmtime::Error, calls_started: u32) -> ExecError {
    let limit = |limit: Limit, detail: String| ExecError::LimitExceeded {
        limit,
        calls_started,
        detail,
    };
    if let Some(trap) = error.chain().find_map(|e| e.downcast_ref::<LimitTrap>()) {
        return limit(trap.limit, trap.detail.clone());
    }
    match error.downcast_ref::<wasmtime::Trap>() {
        Some(wasmtime::Trap::OutOfFuel) => limit(Limit::Fuel, "the script used up its fuel".into()),
        Some(wasmtime::Trap::StackOverflow) => limit(
            Limit::Stack,
            "the script exhausted the stack (too deep recursion)".into(),
        ),
        Some(wasmtime::Trap::Interrupt) => limit(Limit::Deadline, DEADLINE_DETAIL.into()),
        // Only the trap's own description: the guest's internal frames are no business of a
        // report (the engine does not capture them; see `engine_config`).
        Some(trap) => ExecError::GuestTrap(trap.to_string()),
        None => ExecError::Host(error.to_string()),
    }
}

fn level_name(level: LogLevel) -> &'static str {
    match level {
        LogLevel::Debug => "debug",
        LogLevel::Info => "info",
        LogLevel::Warn => "warn",
        LogLevel::Error => "error",
    }
}

impl crate::bindings::corral::sandbox::types::Host for SessionData {}

impl crate::bindings::corral::sandbox::host::Host for SessionData {
    fn start_call(
        &mut self,
        call_id: u32,
        binding: u32,
        args_json: String,
    ) -> wasmtime::Result<Option<Result<CallValue, CallError>>> {
        if self.calls.started >= self.limits.max_total_calls {
            return Err(LimitTrap::error(
                Limit::TotalCalls,
                format!(
                    "the script tried to start call {} of at most {}",
                    self.calls.started + 1,
                    self.limits.max_total_calls
                ),
            ));
        }
        self.calls.started += 1;
        let tool_call_id = format!("{}:{call_id}", self.script_id);
        self.calls.start(
            &self.env,
            call_id,
            binding as usize,
            &args_json,
            tool_call_id,
        );
        check_call_bytes(&self.calls, &self.limits)?;
        Ok(self.calls.take_at_start(call_id))
    }

    fn now_ms(&mut self) -> wasmtime::Result<u64> {
        Ok(self.grants.now_ms())
    }

    fn log(
        &mut self,
        level: LogLevel,
        message: String,
        fields_json: Option<String>,
    ) -> wasmtime::Result<()> {
        let size = LOG_RECORD_OVERHEAD_BYTES
            + message.len() as u64
            + fields_json.as_ref().map_or(0, |f| f.len() as u64);
        self.log_bytes = self.log_bytes.saturating_add(size);
        if self.log_bytes > self.limits.max_log_bytes {
            return Err(LimitTrap::error(
                Limit::LogSize,
                format!(
                    "logs reached {} bytes, over the {} byte limit",
                    self.log_bytes, self.limits.max_log_bytes
                ),
            ));
        }
        // The guest sends objects only; anything else is dropped rather than shown as fields.
        let fields = fields_json
            .and_then(|f| crate::json::parse_guest_json(&f).ok())
            .filter(Value::is_object);
        self.logs.push(LogRecord {
            script_id: self.script_id.clone(),
            level: level_name(level).to_string(),
            message,
            fields,
        });
        Ok(())
    }
}
