//! The [`Sandbox`]: one wasmtime engine, the guest compiled once (and cached on disk), and an
//! `InstancePre` from which every session is instantiated.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use serde::{Deserialize, Serialize};
use wasmtime::component::{Component, HasSelf, Linker};
use wasmtime::{Config, Engine, InstanceAllocationStrategy, OptLevel, PoolingAllocationConfig};

use crate::bindings::SandboxPre;
use crate::limits::DeadlineTicker;
use crate::session::SessionData;

/// The guest component built from `guest/` (see `host/sandbox/build.rs`).
const EMBEDDED_GUEST: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/corral-guest.wasm"));
/// Digest of [`EMBEDDED_GUEST`], computed at build time.
const EMBEDDED_GUEST_DIGEST: &str = env!("CORRAL_GUEST_DIGEST");

/// Core wasm instances and memories one session's component needs (the guest and the small shim
/// modules `wit-component` generates), with headroom.
const CORE_INSTANCES_PER_SESSION: u32 = 12;
const MEMORIES_PER_SESSION: u32 = 2;
const TABLES_PER_SESSION: u32 = 4;
/// Of a finished session's linear memory, how many written bytes its slot keeps resident
/// (reset to the snapshot) for the next session. `return 1+1` writes about 100 KiB.
const MEMORY_KEEP_RESIDENT_BYTES: usize = 1 << 20;
/// The same for its tables (the guest's function table is about 16 KiB).
const TABLE_KEEP_RESIDENT_BYTES: usize = 64 << 10;

/// How the sandbox's engine is built. Changing any of these changes the compiled code, so they
/// are per [`Sandbox`], not per session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SandboxConfig {
    /// Meter guest work with fuel (deterministic; enables [`crate::SessionLimits::fuel`]).
    pub fuel: bool,
    /// Stop guest code at its wall-clock deadline while it computes (waiting on calls is always
    /// bounded by the deadline). With `fuel` on, the guest yields to the host every
    /// [`FUEL_YIELD_INTERVAL`] units of fuel and the host checks the clock then, which costs
    /// guest code nothing beyond fuel metering; without fuel, compiled code checks wasmtime's
    /// epoch at every loop head and function entry instead (about 20% slower guest code).
    pub epochs: bool,
    /// Sessions that may be alive at once (slots in the pooling allocator, or a count when
    /// `pool` is off); a session beyond it is refused with
    /// [`crate::CreateSessionError::Capacity`].
    pub max_sessions: u32,
    /// Reserve the `max_sessions` slots up front (wasmtime's pooling allocator): a session then
    /// starts in a slot whose page tables are set up, and a finished session's slot is reset to
    /// the guest's snapshot in place for the next one. For processes that create many
    /// sessions (the default). Off, each session maps its memory, tables and stack when it starts
    /// and unmaps them when it ends: each session costs more, but the sandbox starts about
    /// 0.4 ms sooner, which is what a process that runs one script wants (`corral exec`).
    /// Nothing else differs: every session starts from the same snapshot, under the same limits,
    /// and costs the same fuel.
    pub pool: bool,
    /// Largest linear memory any session may be given, in bytes; per-session caps are
    /// [`crate::SessionLimits::memory_bytes`], up to this. At most [`GUEST_MAX_MEMORY_BYTES`]
    /// (1 GiB, the default).
    pub max_memory_bytes: u64,
    /// The wasm stack available to a script. QuickJS recurses on the native stack for every
    /// JavaScript call, so this bounds JavaScript recursion depth (the 2 MiB default allows
    /// about 3,000 nested calls); exhausting it stops the script with the `stack` limit. At most
    /// [`MAX_STACK_BYTES`]: beyond that, recursion could exhaust the guest's own (shadow) stack
    /// in linear memory first, which would end the script as a guest trap instead.
    pub max_stack_bytes: usize,
    /// Where compiled guest code is cached. `None` compiles in memory on every start (about two
    /// seconds). Defaults to `$CORRAL_CACHE_DIR`, else `$XDG_CACHE_HOME/corral`, else
    /// `$HOME/.cache/corral`.
    pub cache_dir: Option<PathBuf>,
}

impl Default for SandboxConfig {
    fn default() -> Self {
        SandboxConfig {
            fuel: true,
            epochs: true,
            max_sessions: 1_000,
            pool: true,
            max_memory_bytes: 1 << 30,
            max_stack_bytes: 2 << 20,
            cache_dir: default_cache_dir(),
        }
    }
}

/// Fuel between two yields of guest code to the host when the deadline is enforced with fuel
/// ([`SandboxConfig::epochs`] and [`SandboxConfig::fuel`] both on): about 13 µs of guest work
/// on a 2020s server core, so a script stops well within 0.1 ms of its deadline, while the
/// yields cost about 1% of its time.
pub const FUEL_YIELD_INTERVAL: u64 = 100_000;

impl SandboxConfig {
    /// Whether the deadline is enforced by epoch interruption (only without fuel: with fuel,
    /// yields every [`FUEL_YIELD_INTERVAL`] let the host check the clock for free).
    pub(crate) fn deadline_by_epochs(&self) -> bool {
        self.epochs && !self.fuel
    }

    /// Whether the deadline is enforced at fuel yields.
    pub(crate) fn deadline_by_fuel(&self) -> bool {
        self.epochs && self.fuel
    }
}

fn default_cache_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("CORRAL_CACHE_DIR") {
        return Some(PathBuf::from(dir));
    }
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME") {
        return Some(PathBuf::from(dir).join("corral"));
    }
    std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache/corral"))
}

/// The maximum the guest's linear memory declares (`guest/.cargo/config.toml`), and so the
/// largest [`SandboxConfig::max_memory_bytes`]: the resource limiter must trap at a session's cap
/// before the guest's own maximum makes growth fail quietly (which QuickJS would turn into a
/// catchable exception).
pub const GUEST_MAX_MEMORY_BYTES: u64 = 1 << 30;

/// Largest [`SandboxConfig::max_stack_bytes`]: the guest reserves 4 MiB of linear memory for its
/// shadow stack, and deep recursion was measured to exhaust it before 12 MiB of wasm stack, but
/// never before 8 MiB.
pub const MAX_STACK_BYTES: usize = 8 << 20;

/// Why a [`Sandbox`] could not be created.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoadGuestError {
    /// The configuration asks for something the sandbox cannot honour.
    #[error("invalid sandbox configuration: {0}")]
    InvalidConfig(String),
    /// The engine configuration was rejected (for example, a pool too large for this host).
    #[error("configuring the wasmtime engine failed: {0}")]
    Engine(#[source] wasmtime::Error),
    /// The guest is not a valid component, or does not implement the `sandbox` world.
    #[error("the guest component is invalid: {0}")]
    InvalidGuest(#[source] wasmtime::Error),
    /// The epoch thread could not be started.
    #[error("starting the deadline thread failed: {0}")]
    Thread(#[source] std::io::Error),
}

/// A loaded guest, ready to create [`crate::ExecutorSession`]s cheaply. Create one per process
/// and share it (it is `Clone` and cheap to clone).
#[derive(Clone)]
pub struct Sandbox {
    pub(crate) inner: Arc<SandboxInner>,
}

pub(crate) struct SandboxInner {
    pub(crate) engine: Engine,
    pub(crate) pre: SandboxPre<SessionData>,
    pub(crate) config: SandboxConfig,
    /// Bumps the epoch at deadlines, when the deadline is enforced with epochs.
    pub(crate) ticker: Option<DeadlineTicker>,
    /// Where the compiled guest came from, for diagnostics.
    pub(crate) compiled_from: CompiledFrom,
    /// Sessions alive now, counted only without the pool (the pool counts its own slots).
    pub(crate) unpooled_sessions: Option<Arc<AtomicU32>>,
}

/// A session's place among [`SandboxConfig::max_sessions`] when the sandbox has no pool: taken
/// before the guest is instantiated, given back when the session is dropped.
pub(crate) struct SessionCount(Arc<AtomicU32>);

impl SessionCount {
    /// Counts one more session, unless `max` are alive.
    pub(crate) fn take(alive: &Arc<AtomicU32>, max: u32) -> Option<SessionCount> {
        alive
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()
            .map(|_| SessionCount(alive.clone()))
    }
}

impl Drop for SessionCount {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// How the compiled guest was obtained when the sandbox started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CompiledFrom {
    /// Loaded from the on-disk cache (fast start).
    Cache,
    /// Compiled now, and written to the cache.
    CompiledAndCached,
    /// Compiled now; no cache was configured or it could not be written.
    Compiled,
}

impl std::fmt::Debug for Sandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sandbox")
            .field("config", &self.inner.config)
            .field("compiled_from", &self.inner.compiled_from)
            .finish_non_exhaustive()
    }
}

impl Sandbox {
    /// Loads the guest embedded in this crate.
    pub fn new(config: SandboxConfig) -> Result<Sandbox, LoadGuestError> {
        Self::load(config, EMBEDDED_GUEST, EMBEDDED_GUEST_DIGEST)
    }

    /// Loads another build of the guest component (it must implement the same world).
    pub fn with_guest(config: SandboxConfig, guest: &[u8]) -> Result<Sandbox, LoadGuestError> {
        let mut hasher = std::hash::DefaultHasher::new();
        std::hash::Hasher::write(&mut hasher, guest);
        let digest = format!(
            "{:016x}{:08x}",
            std::hash::Hasher::finish(&hasher),
            guest.len()
        );
        Self::load(config, guest, &digest)
    }

    /// Compiles the embedded guest as [`Sandbox::new`] would with `config`, with the register
    /// allocator's checker on: each function's allocation is verified symbolically against its
    /// code, and a wrong one fails the compilation. A test of the patched allocator
    /// (host/vendor/README.md), not an API; nothing is cached.
    #[doc(hidden)]
    #[allow(unsafe_code)]
    pub fn check_register_allocation(config: &SandboxConfig) -> Result<(), LoadGuestError> {
        let mut settings = engine_config(config);
        // SAFETY: the checker only verifies; it changes no setting the compiled code relies on.
        unsafe {
            settings.cranelift_flag_enable("regalloc_checker");
        }
        let engine = Engine::new(&settings).map_err(LoadGuestError::Engine)?;
        Component::new(&engine, EMBEDDED_GUEST).map_err(LoadGuestError::InvalidGuest)?;
        Ok(())
    }

    fn load(config: SandboxConfig, guest: &[u8], digest: &str) -> Result<Sandbox, LoadGuestError> {
        if config.max_stack_bytes > MAX_STACK_BYTES || config.max_stack_bytes < 64 << 10 {
            return Err(LoadGuestError::InvalidConfig(format!(
                "max_stack_bytes must be between 64 KiB and {MAX_STACK_BYTES} bytes, not {}",
                config.max_stack_bytes
            )));
        }
        if config.max_memory_bytes > GUEST_MAX_MEMORY_BYTES {
            return Err(LoadGuestError::InvalidConfig(format!(
                "max_memory_bytes must be at most {GUEST_MAX_MEMORY_BYTES} (the maximum the guest's memory declares), not {}",
                config.max_memory_bytes
            )));
        }
        if config.max_sessions == 0 {
            return Err(LoadGuestError::InvalidConfig(
                "max_sessions must be at least 1".into(),
            ));
        }
        let engine = Engine::new(&engine_config(&config)).map_err(LoadGuestError::Engine)?;
        let (component, compiled_from) = compile_cached(&engine, &config, guest, digest)?;
        let mut linker = Linker::<SessionData>::new(&engine);
        crate::bindings::Sandbox::add_to_linker::<_, HasSelf<SessionData>>(&mut linker, |data| {
            data
        })
        .map_err(LoadGuestError::InvalidGuest)?;
        let pre = linker
            .instantiate_pre(&component)
            .and_then(SandboxPre::new)
            .map_err(LoadGuestError::InvalidGuest)?;
        let ticker = if config.deadline_by_epochs() {
            Some(DeadlineTicker::start(engine.clone()).map_err(LoadGuestError::Thread)?)
        } else {
            None
        };
        let unpooled_sessions = (!config.pool).then(|| Arc::new(AtomicU32::new(0)));
        Ok(Sandbox {
            inner: Arc::new(SandboxInner {
                engine,
                pre,
                config,
                ticker,
                compiled_from,
                unpooled_sessions,
            }),
        })
    }

    /// The configuration the sandbox was built with.
    pub fn config(&self) -> &SandboxConfig {
        &self.inner.config
    }

    /// Whether the compiled guest came from the on-disk cache.
    pub fn compiled_from(&self) -> CompiledFrom {
        self.inner.compiled_from
    }
}

fn engine_config(config: &SandboxConfig) -> Config {
    let mut engine = Config::new();
    engine
        .consume_fuel(config.fuel)
        .epoch_interruption(config.deadline_by_epochs())
        .max_wasm_stack(config.max_stack_bytes)
        // Host functions and the fiber's own frames need room beyond the wasm stack limit.
        .async_stack_size(config.max_stack_bytes + (1 << 20))
        .cranelift_opt_level(OptLevel::Speed)
        .memory_init_cow(true)
        // No wasm backtrace on traps: reports never show the guest's internal frames, and
        // symbolizing them made every stopped script (deadline, fuel, memory, stack) pay about
        // 40 µs after its limit was reached.
        .wasm_backtrace_max_frames(None);
    if !config.pool {
        engine.allocation_strategy(InstanceAllocationStrategy::OnDemand);
        return engine;
    }
    let mut pool = PoolingAllocationConfig::default();
    pool.total_component_instances(config.max_sessions)
        .total_core_instances(
            config
                .max_sessions
                .saturating_mul(CORE_INSTANCES_PER_SESSION),
        )
        .total_memories(config.max_sessions.saturating_mul(MEMORIES_PER_SESSION))
        .total_tables(config.max_sessions.saturating_mul(TABLES_PER_SESSION))
        .total_stacks(config.max_sessions)
        .max_core_instances_per_component(CORE_INSTANCES_PER_SESSION)
        .max_memories_per_component(MEMORIES_PER_SESSION)
        .max_tables_per_component(TABLES_PER_SESSION)
        .max_memory_size(usize::try_from(config.max_memory_bytes).unwrap_or(usize::MAX));
    // A finished session's slot is reset to the guest's snapshot by copying back only the pages
    // it wrote (found with Linux's PAGEMAP_SCAN ioctl, 6.7 and later), up to these sizes,
    // instead of unmapping them: the next session in the slot then starts with those pages
    // resident and takes no page faults for them. Past these sizes, pages are unmapped as
    // before. The memory stays resident while the slot is unused (at most these sizes per slot
    // a session has used). Without the ioctl, keeping memory resident would mean resetting the
    // first bytes of every slot whether written or not, which costs more than it saves.
    if PoolingAllocationConfig::is_pagemap_scan_available() {
        pool.pagemap_scan(wasmtime::Enabled::Yes)
            .linear_memory_keep_resident(MEMORY_KEEP_RESIDENT_BYTES)
            .table_keep_resident(TABLE_KEEP_RESIDENT_BYTES);
    }
    engine.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    engine
}

/// What changes the compiled code beyond wasmtime's own compatibility hash, which knows nothing
/// of the patched register allocator (host/vendor/README.md): code cached before the patch is
/// compiled again rather than loaded.
const CODEGEN: &str = "regalloc2 0.15.2, splits unbounded";

/// Compiles the guest, or loads code compiled earlier by an engine with the same settings.
fn compile_cached(
    engine: &Engine,
    config: &SandboxConfig,
    guest: &[u8],
    digest: &str,
) -> Result<(Component, CompiledFrom), LoadGuestError> {
    let Some(dir) = &config.cache_dir else {
        let component = Component::new(engine, guest).map_err(LoadGuestError::InvalidGuest)?;
        return Ok((component, CompiledFrom::Compiled));
    };
    let mut hasher = std::hash::DefaultHasher::new();
    std::hash::Hash::hash(&engine.precompile_compatibility_hash(), &mut hasher);
    std::hash::Hash::hash(CODEGEN, &mut hasher);
    let engine_digest = std::hash::Hasher::finish(&hasher);
    let path = dir.join(format!("guest-{digest}-{engine_digest:016x}.cwasm"));
    if private_dir(dir).is_ok()
        && let Some(component) = load_cached(engine, &path)
    {
        return Ok((component, CompiledFrom::Cache));
    }
    let component = Component::new(engine, guest).map_err(LoadGuestError::InvalidGuest)?;
    let cached = component
        .serialize()
        .ok()
        .is_some_and(|bytes| store_cached(dir, &path, &bytes).is_ok());
    if cached {
        remove_stale_entries(dir, &path, &format!("-{engine_digest:016x}.cwasm"));
    }
    let from = if cached {
        CompiledFrom::CompiledAndCached
    } else {
        CompiledFrom::Compiled
    };
    Ok((component, from))
}

#[allow(unsafe_code)]
fn load_cached(engine: &Engine, path: &Path) -> Option<Component> {
    if !path.is_file() {
        return None;
    }
    // SAFETY: `deserialize_file` trusts the file to be code compiled by wasmtime. The file is
    // only ever written by `store_cached` below, into a folder created with owner-only
    // permissions, under a name that includes the engine's compatibility hash; wasmtime also
    // checks the header and its version. A folder writable by someone else would let them run
    // native code in this process, as would write access to the `corral` binary itself.
    unsafe { Component::deserialize_file(engine, path) }.ok()
}

fn store_cached(dir: &Path, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    if !dir.is_dir() {
        create_private_dir(dir)?;
    }
    private_dir(dir)?;
    // Write then rename, so a concurrent reader never maps a half-written file.
    let tmp = dir.join(format!(".tmp-{}-{}", std::process::id(), path_name(path)));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}

/// Deletes code this engine configuration compiled for other builds of the guest: each guest
/// rebuild would otherwise leave about 5 MB behind. Entries of other engine configurations
/// (other fuel or epoch settings, other wasmtime versions) are left to the processes using them.
fn remove_stale_entries(dir: &Path, keep: &Path, engine_suffix: &str) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = path_name(&path);
        if path != keep && name.starts_with("guest-") && name.ends_with(engine_suffix) {
            let _ = std::fs::remove_file(&path);
        }
    }
}

fn path_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

#[cfg(unix)]
fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

/// Compiled code is native code: only a folder nobody else can write to is trusted.
#[cfg(unix)]
fn private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(dir)?.permissions().mode();
    if mode & 0o022 != 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!(
                "{} is writable by others; compiled code is not cached there",
                dir.display()
            ),
        ));
    }
    Ok(())
}

#[cfg(not(unix))]
fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)
}

#[cfg(not(unix))]
fn private_dir(_dir: &Path) -> std::io::Result<()> {
    Ok(())
}
