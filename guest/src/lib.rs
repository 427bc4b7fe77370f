//! corral's guest: QuickJS (through javy) as a WebAssembly component that runs model-written
//! JavaScript and reaches the outside only through the `corral:sandbox/host` interface.
//!
//! The component implements the `sandbox` world in `wit/sandbox.wit`:
//!
//! - `wizer-initialize` (a core export used while building, see `host/guest-build`) creates the
//!   QuickJS runtime and evaluates the prelude, so the snapshot taken afterwards starts every
//!   session with a warm engine;
//! - `session.init` binds the capabilities under `tools` and the frozen `user` (both built
//!   lazily in the realm: a namespace or function the first time a script reaches it);
//! - `session.run` evaluates one script as the body of an async function and drives its promise
//!   until it settles (`done`) or only waits on calls (`waiting`); `session.resume` delivers a
//!   batch of completions and drives it further. Between the two the guest holds no host stack:
//!   the waiting script is just the promise kept in [`SessionState::script`].
//!
//! All conversions between JavaScript values and WIT values live in [`boundary`].

mod alloc;
mod boundary;
mod preview1;

use std::cell::{OnceCell, RefCell};

use javy::quickjs::{Function, Persistent, Value};
use javy::{Config, Runtime};

wit_bindgen::generate!({
    world: "sandbox",
    path: "../wit",
});

use corral::sandbox::host;
use corral::sandbox::types::{Binding, Clock};
use exports::corral::sandbox::session::{Completion, Guest, RunState, SessionConfig};

/// The QuickJS garbage-collection threshold. javy defaults to `usize::MAX` (never collect);
/// 2 MiB keeps small scripts free of collections while memory bombs are collected long before
/// the host's memory cap.
const GC_THRESHOLD_BYTES: usize = 2 << 20;

/// QuickJS's own allocation limit. The host's linear-memory cap is the authoritative limit
/// because it is enforced outside the realm (a script cannot catch it); QuickJS's limit is set
/// explicitly to the whole 32-bit address space so that it never fires first with a catchable
/// `InternalError`.
const QUICKJS_MEMORY_LIMIT_BYTES: usize = u32::MAX as usize;

/// Name of the script in stack traces; the host relies on it to find the user's frames.
const SCRIPT_FILE_NAME: &str = "script.js";

// The QuickJS runtime, created once (at build time under Wizer). Wasm is single-threaded, so
// thread locals are the whole program state. The runtime is only ever borrowed shared: native
// functions called from JavaScript touch `SessionState` alone, never the runtime, so
// re-entering the guest from a script cannot alias a mutable borrow.
thread_local! {
    static RUNTIME: OnceCell<Runtime> = const { OnceCell::new() };
    static SESSION: RefCell<SessionState> = RefCell::new(SessionState::default());
}

/// Per-session state that native functions read and write.
#[derive(Default)]
struct SessionState {
    /// The prelude's warm-up function, used only while pre-initializing. Kept alive for good:
    /// dropping the last reference to a prelude closure would free part of its graph, writing to
    /// (and so copying) pages of the snapshot in every session.
    warm_up: Option<Persistent<Function<'static>>>,
    /// The helper behind capped error texts (`boundary::TEXT_HEAD_SOURCE`), made before any
    /// script ran.
    text_head: Option<Persistent<Function<'static>>>,
    initialized: bool,
    /// The bound capabilities: their ids and the namespaces under `tools`.
    tools: boundary::ToolsTree,
    /// The user given to `init`, turned into the frozen `user` on first read.
    user: Option<crate::corral::sandbox::types::User>,
    /// The promise of the script that is waiting on calls, between `run`/`resume` returning
    /// `waiting` and the `resume` that settles it.
    script: Option<Persistent<Value<'static>>>,
    /// Calls started and not completed yet.
    pending: Vec<PendingCall>,
    next_call_id: u32,
    /// State of the `Math.random` generator (xorshift64*), seeded by the host.
    random_state: u64,
    /// The frozen time in milliseconds since the Unix epoch, unless `host_clock`.
    frozen_ms: u64,
    /// Whether the host granted its clock (`host.now-ms`).
    host_clock: bool,
    /// `session-config.max-result-bytes`: where serializing a script's value stops.
    max_result_bytes: u64,
    /// The stream behind WASI `random_get` (see [`preview1`]): a splitmix64 state derived from
    /// the seed, the current 64-bit word and how many of its bytes were used.
    entropy_seed: u64,
    entropy_state: u64,
    entropy_used: u32,
}

struct PendingCall {
    call_id: u32,
    binding: u32,
    /// The call's promise, which only the guest settles (see `boundary::deliver`).
    promise: Persistent<Value<'static>>,
    /// The call site's frames, kept when the call started, so a rejection's stack shows it.
    site: Persistent<Value<'static>>,
}

/// Creates the runtime and evaluates the prelude. Runs at build time under Wizer; also runs
/// lazily on first use when a host loads a guest that was not pre-initialized.
fn create_runtime() -> Runtime {
    let mut config = Config::default();
    config
        .gc_threshold(GC_THRESHOLD_BYTES)
        .memory_limit(QUICKJS_MEMORY_LIMIT_BYTES);
    let runtime = match Runtime::new(config) {
        Ok(runtime) => runtime,
        Err(error) => panic!("creating the QuickJS runtime failed: {error}"),
    };
    let warm = runtime.context().with(|ctx| -> Result<_, String> {
        boundary::install_random(&ctx).map_err(|e| e.to_string())?;
        let prelude: Function = ctx
            .eval_with_options(
                include_str!("prelude.js"),
                boundary::eval_options("prelude.js"),
            )
            .map_err(|e| boundary::describe_exception(&ctx, e))?;
        let call = boundary::call_native(&ctx).map_err(|e| e.to_string())?;
        let bind = boundary::bind_native(&ctx).map_err(|e| e.to_string())?;
        let log = boundary::log_native(&ctx).map_err(|e| e.to_string())?;
        let session = boundary::session_native(&ctx).map_err(|e| e.to_string())?;
        let tools = boundary::tools_natives(&ctx).map_err(|e| e.to_string())?;
        let shown_json = boundary::shown_json_native(&ctx).map_err(|e| e.to_string())?;
        let warm: Function = prelude
            .call((call, bind, log, session, tools, shown_json))
            .map_err(|e| boundary::describe_exception(&ctx, e))?;
        let text_head: Function = ctx
            .eval(boundary::TEXT_HEAD_SOURCE)
            .map_err(|e| boundary::describe_exception(&ctx, e))?;
        Ok((
            Persistent::save(&ctx, warm),
            Persistent::save(&ctx, text_head),
        ))
    });
    match warm {
        Ok((warm, text_head)) => with_session(|session| {
            session.warm_up = Some(warm);
            session.text_head = Some(text_head);
        }),
        Err(error) => panic!("evaluating the prelude failed: {error}"),
    }
    warm_up(&runtime);
    runtime
}

/// Runs, once, what QuickJS would otherwise initialize lazily in every session: the global
/// constructors it creates on first access, and the parser's, compiler's and job queue's first
/// allocations for a script shaped like a user's. Under Wizer this lands in the snapshot.
fn warm_up(runtime: &Runtime) {
    let warmed = runtime.context().with(|ctx| -> javy::quickjs::Result<()> {
        ctx.eval::<(), _>(
            // `user` is skipped: reading it would build (and cache) it before any session
            // exists.
            "for (const key of Reflect.ownKeys(globalThis)) { if (key !== 'user') void globalThis[key]; }",
        )?;
        // The binding code, on sample bindings and a user, without defining anything; the
        // sample tree is gone again before any session starts.
        if let Some(warm) = with_session(|session| session.warm_up.clone()) {
            let sample = ["warm.up.one", "warm.two"].map(|id| Binding {
                id: id.to_string(),
                js_path: None,
            });
            let tools = boundary::resolve_bindings(Vec::from(sample)).map_err(|_| javy::quickjs::Error::Unknown)?;
            with_session(|session| session.tools = tools);
            let user = crate::corral::sandbox::types::User {
                id: "warm-up".into(),
                email: None,
                display_name: Some("Warm Up".into()),
            };
            let user = boundary::user_to_js(&ctx, Some(&user))?;
            let warmed = warm.restore(&ctx)?.call::<_, ()>((user,));
            with_session(|session| session.tools = boundary::ToolsTree::default());
            warmed?;
        }
        // The script's promise settles when the jobs run below; its value is not needed.
        let _promise: Value = boundary::eval_script(
            &ctx,
            "const o = {a: [1, 'two']}; return JSON.parse(JSON.stringify(o));",
        )?;
        Ok(())
    });
    if let Err(error) = warmed.and_then(|()| {
        runtime
            .resolve_pending_jobs()
            .map_err(|_| javy::quickjs::Error::Unknown)
    }) {
        panic!("warming up the runtime failed: {error}");
    }
}

fn with_runtime<R>(f: impl FnOnce(&Runtime) -> R) -> R {
    RUNTIME.with(|cell| f(cell.get_or_init(create_runtime)))
}

fn with_session<R>(f: impl FnOnce(&mut SessionState) -> R) -> R {
    SESSION.with(|cell| f(&mut cell.borrow_mut()))
}

/// The time scripts see, in milliseconds since the Unix epoch: frozen (0 before `init`, so the
/// snapshot never depends on a clock) unless the host granted its own.
pub(crate) fn now_ms() -> u64 {
    match with_session(|session| (!session.host_clock).then_some(session.frozen_ms)) {
        Some(frozen) => frozen,
        None => host::now_ms(),
    }
}

/// Wizer's entry point: build the runtime now so it is part of the snapshot, then set the
/// blocks freed while building it aside (sessions writing into them would each copy the
/// snapshot pages they are scattered over).
#[unsafe(export_name = "wizer-initialize")]
pub extern "C" fn wizer_initialize() {
    with_runtime(|_| ());
    alloc::forget_free_blocks();
}

struct Component;

impl Guest for Component {
    fn init(config: SessionConfig) -> Result<(), String> {
        let tools = boundary::resolve_bindings(config.bindings)?;
        with_session(|session| {
            if session.initialized {
                return Err("session.init was already called for this instance".to_string());
            }
            session.initialized = true;
            // xorshift64* must not start at zero.
            session.random_state = config.random_seed | 1;
            // A stream of its own, so the library's use of randomness never shifts the
            // sequence `Math.random` returns.
            session.entropy_seed = config.random_seed ^ 0x6a09_e667_f3bc_c908;
            session.entropy_used = 0;
            match config.clock {
                Clock::Frozen(ms) => session.frozen_ms = ms,
                Clock::Host => session.host_clock = true,
            }
            session.tools = tools;
            session.user = config.user;
            session.max_result_bytes = config.max_result_bytes;
            Ok(())
        })
    }

    fn run(source: String) -> RunState {
        let refused = with_session(|session| {
            if !session.initialized {
                Some("session.run was called before session.init")
            } else if session.script.is_some() {
                Some("session.run was called while the previous script is still waiting")
            } else {
                None
            }
        });
        if let Some(message) = refused {
            return RunState::Done(Err(boundary::plain_error("Error", message)));
        }
        let promise = with_runtime(|runtime| {
            runtime.context().with(|ctx| {
                boundary::eval_script(&ctx, &source)
                    .map(|value| Persistent::save(&ctx, value))
                    .map_err(|e| boundary::script_error(&ctx, e))
            })
        });
        match promise {
            Ok(promise) => drive(promise),
            Err(error) => RunState::Done(Err(error)),
        }
    }

    fn resume(completions: Vec<Completion>) -> RunState {
        let Some(promise) = with_session(|session| session.script.take()) else {
            return RunState::Done(Err(boundary::plain_error(
                "Error",
                "session.resume was called with no script waiting",
            )));
        };
        with_runtime(|runtime| {
            runtime
                .context()
                .with(|ctx| boundary::deliver(&ctx, completions))
        });
        drive(promise)
    }
}

/// Runs jobs until the script's promise settles (`done`) or nothing is left to do but wait on
/// calls (`waiting`, keeping the promise for `resume`).
fn drive(promise: Persistent<Value<'static>>) -> RunState {
    let jobs = with_runtime(|runtime| runtime.resolve_pending_jobs());
    if let Err(error) = jobs {
        return RunState::Done(Err(boundary::plain_error(
            "InternalError",
            &error.to_string(),
        )));
    }
    let max_result_bytes = with_session(|session| session.max_result_bytes);
    let settled = with_runtime(|runtime| {
        runtime
            .context()
            .with(|ctx| boundary::settled_result(&ctx, promise.clone(), max_result_bytes))
    });
    if let Some(state) = settled {
        return state;
    }
    with_session(|session| {
        if session.pending.is_empty() {
            RunState::Done(Err(boundary::plain_error(
                "Error",
                "the script is waiting on a promise that can never settle: no capability call is pending",
            )))
        } else {
            session.script = Some(promise);
            RunState::Waiting
        }
    })
}

export!(Component);
