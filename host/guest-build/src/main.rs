//! `corral-guest-build`: turns the guest's core module into corral's sandbox component.
//!
//! ```text
//! corral-guest-build build --core target/wasm32-wasip1/release/corral_guest.wasm --out guest.wasm
//! corral-guest-build check --component guest.wasm --wit wit
//! ```
//!
//! `build` pre-initializes the module with Wizer (the QuickJS runtime and the prelude are created
//! once, here, and land in the snapshot's data segments, so a session starts with a warm engine),
//! then wraps the snapshot into a component with `wit-component` and the WASI preview1 adapter.
//! `check` verifies that a component implements exactly the `corral:sandbox` world of `wit/`
//! (used by CI on the prebuilt artifact shipped for embedders).

#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use wasmtime::{Engine, Instance, Linker, Module, Store};
use wasmtime_wasi::p1::WasiP1Ctx;
use wasmtime_wasi::{Deterministic, HostMonotonicClock, HostWallClock, WasiCtxBuilder};
use wasmtime_wizer::{InstanceState, SnapshotVal, ValType, Wizer};
use wit_parser::{Resolve, WorldItem, WorldKey};

const INIT_FUNC: &str = "wizer-initialize";

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("build") => {
            let core = flag(&args, "--core")?;
            let out = flag(&args, "--out")?;
            build(&core, &out)
        }
        Some("check") => {
            let component = flag(&args, "--component")?;
            let wit = flag(&args, "--wit")?;
            check(&component, &wit)
        }
        _ => bail!(
            "usage: corral-guest-build build --core CORE.wasm --out COMPONENT.wasm\n       corral-guest-build check --component COMPONENT.wasm --wit WIT_DIR"
        ),
    }
}

fn flag(args: &[String], name: &str) -> Result<PathBuf> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(PathBuf::from)
        .with_context(|| format!("missing {name} PATH"))
}

fn build(core_path: &Path, out_path: &Path) -> Result<()> {
    let core = std::fs::read(core_path)
        .with_context(|| format!("reading the guest core module {}", core_path.display()))?;
    let snapshot = futures::executor::block_on(preinitialize(&core))?;
    let component = wit_component::ComponentEncoder::default()
        .module(&snapshot)
        .context("reading the component metadata of the snapshot")?
        .validate(true)
        .adapter(
            "wasi_snapshot_preview1",
            wasi_preview1_component_adapter_provider::WASI_SNAPSHOT_PREVIEW1_REACTOR_ADAPTER,
        )
        .context("adding the WASI preview1 adapter")?
        .encode()
        .context("encoding the component")?;
    if let Some(parent) = out_path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(out_path, &component)
        .with_context(|| format!("writing {}", out_path.display()))?;
    eprintln!(
        "corral-guest-build: {} ({} bytes core, {} bytes pre-initialized, {} bytes component)",
        out_path.display(),
        core.len(),
        snapshot.len(),
        component.len()
    );
    Ok(())
}

/// Runs the module's `wizer-initialize` and snapshots the result.
async fn preinitialize(core: &[u8]) -> Result<Vec<u8>> {
    let mut wizer = Wizer::new();
    wizer.init_func(INIT_FUNC);
    let (cx, instrumented) = wizer.instrument(core)?;

    let engine = Engine::default();
    let module = Module::new(&engine, &instrumented)
        .map_err(anyhow::Error::from)
        .context("compiling the instrumented guest")?;
    let mut linker: Linker<WasiP1Ctx> = Linker::new(&engine);
    wasmtime_wasi::p1::add_to_linker_sync(&mut linker, |ctx| ctx)?;
    // The corral:sandbox host imports must not run during initialization; if they did, the
    // snapshot would depend on a host, so they trap.
    linker.define_unknown_imports_as_traps(&module)?;
    // Nothing is granted while initializing either, except stderr for a panic message. Time and
    // randomness are fixed so that the snapshot, and so the component, is reproducible.
    let wasi = WasiCtxBuilder::new()
        .inherit_stderr()
        .wall_clock(FixedClock)
        .monotonic_clock(FixedClock)
        .secure_random(Deterministic::new(vec![0x5a; 32]))
        .insecure_random(Deterministic::new(vec![0xa5; 32]))
        .insecure_random_seed(0)
        .build_p1();
    let mut store = Store::new(&engine, wasi);
    let instance = linker.instantiate(&mut store, &module)?;
    if let Some(init) = instance.get_func(&mut store, "_initialize") {
        init.typed::<(), ()>(&store)?
            .call(&mut store, ())
            .map_err(anyhow::Error::from)
            .context("running the reactor's _initialize")?;
    }
    instance
        .get_typed_func::<(), ()>(&mut store, INIT_FUNC)?
        .call(&mut store, ())
        .map_err(anyhow::Error::from)
        .context("running wizer-initialize")?;
    let mut state = Snapshotted { store, instance };
    Ok(wizer.snapshot(&cx, &mut state).await?)
}

/// A clock stopped at the Unix epoch.
struct FixedClock;

impl HostWallClock for FixedClock {
    fn resolution(&self) -> Duration {
        Duration::from_millis(1)
    }
    fn now(&self) -> Duration {
        Duration::ZERO
    }
}

impl HostMonotonicClock for FixedClock {
    fn resolution(&self) -> u64 {
        1_000_000
    }
    fn now(&self) -> u64 {
        0
    }
}

struct Snapshotted {
    store: Store<WasiP1Ctx>,
    instance: Instance,
}

impl InstanceState for Snapshotted {
    async fn global_get(&mut self, name: &str, _type_hint: ValType) -> SnapshotVal {
        let Some(global) = self.instance.get_global(&mut self.store, name) else {
            panic!("wizer asked for global {name}, which the instrumented module exports");
        };
        match global.get(&mut self.store) {
            wasmtime::Val::I32(x) => SnapshotVal::I32(x),
            wasmtime::Val::I64(x) => SnapshotVal::I64(x),
            wasmtime::Val::F32(x) => SnapshotVal::F32(x),
            wasmtime::Val::F64(x) => SnapshotVal::F64(x),
            wasmtime::Val::V128(x) => SnapshotVal::V128(x.as_u128()),
            other => panic!("global {name} holds {other:?}, which cannot be snapshotted"),
        }
    }

    async fn memory_contents(&mut self, name: &str, contents: impl FnOnce(&[u8]) + Send) {
        let Some(memory) = self.instance.get_memory(&mut self.store, name) else {
            panic!("wizer asked for memory {name}, which the instrumented module exports");
        };
        contents(memory.data(&self.store))
    }
}

/// Checks that `component` imports and exports exactly the `corral:sandbox` interfaces of the
/// `sandbox` world in `wit_dir` (WASI imports added by the adapter are listed, not compared).
fn check(component_path: &Path, wit_dir: &Path) -> Result<()> {
    let bytes = std::fs::read(component_path)
        .with_context(|| format!("reading {}", component_path.display()))?;
    let decoded = wit_component::decode(&bytes).context("decoding the component's WIT")?;
    let (component_resolve, component_world) = match decoded {
        wit_component::DecodedWasm::Component(resolve, world) => (resolve, world),
        wit_component::DecodedWasm::WitPackage(..) => {
            bail!("expected a component, found a WIT package")
        }
    };
    let mut wit_resolve = Resolve::default();
    let (package, _) = wit_resolve.push_dir(wit_dir)?;
    let wit_world = wit_resolve.select_world(&[package], Some("sandbox"))?;

    let expected = world_interfaces(&wit_resolve, wit_world);
    let actual = world_interfaces(&component_resolve, component_world);
    let (ours, wasi): (Vec<_>, Vec<_>) = actual
        .iter()
        .cloned()
        .partition(|(_, name)| name.starts_with("corral:"));
    if ours != expected {
        bail!(
            "{} does not match the sandbox world in {}:\n  expected {expected:?}\n  found    {ours:?}",
            component_path.display(),
            wit_dir.display()
        );
    }
    // Interfaces must also agree function by function, not only by name.
    for (direction, name) in &expected {
        let want = interface_signature(&wit_resolve, name)?;
        let got = interface_signature(&component_resolve, name)?;
        if want != got {
            bail!("{direction} {name} differs from wit/:\n  wit/:      {want}\n  component: {got}");
        }
    }
    println!(
        "ok: {} implements corral:sandbox/sandbox",
        component_path.display()
    );
    for (direction, name) in wasi {
        println!("  also {direction}s {name} (WASI, through the preview1 adapter)");
    }
    Ok(())
}

fn world_interfaces(resolve: &Resolve, world: wit_parser::WorldId) -> Vec<(&'static str, String)> {
    let world = &resolve.worlds[world];
    let name = |key: &WorldKey, item: &WorldItem| -> Option<String> {
        match item {
            WorldItem::Interface { id, .. } => resolve.id_of(*id),
            WorldItem::Function(_) | WorldItem::Type { .. } => Some(resolve.name_world_key(key)),
        }
    };
    let mut out: Vec<(&'static str, String)> = Vec::new();
    for (key, item) in &world.imports {
        if let WorldItem::Type { .. } = item {
            continue;
        }
        if let Some(n) = name(key, item) {
            out.push(("import", n));
        }
    }
    for (key, item) in &world.exports {
        if let Some(n) = name(key, item) {
            out.push(("export", n));
        }
    }
    out.sort();
    out
}

/// A textual rendering of an interface's functions and types, comparable across resolves.
fn interface_signature(resolve: &Resolve, name: &str) -> Result<String> {
    let (_, interface) = resolve
        .interfaces
        .iter()
        .find(|(id, _)| resolve.id_of(*id).as_deref() == Some(name))
        .with_context(|| format!("interface {name} not found"))?;
    let mut parts = Vec::new();
    for (fname, function) in &interface.functions {
        let params: Vec<String> = function
            .params
            .iter()
            .map(|p| format!("{}: {}", p.name, type_name(resolve, &p.ty)))
            .collect();
        let result = function
            .result
            .as_ref()
            .map(|t| type_name(resolve, t))
            .unwrap_or_default();
        parts.push(format!("{fname}({}) -> {result}", params.join(", ")));
    }
    parts.sort();
    Ok(parts.join("; "))
}

fn type_name(resolve: &Resolve, ty: &wit_parser::Type) -> String {
    use wit_parser::TypeDefKind;
    let wit_parser::Type::Id(id) = ty else {
        return format!("{ty:?}").to_lowercase();
    };
    let def = &resolve.types[*id];
    if let Some(name) = &def.name {
        return name.clone();
    }
    let opt = |t: &Option<wit_parser::Type>| {
        t.as_ref()
            .map_or("_".to_string(), |t| type_name(resolve, t))
    };
    match &def.kind {
        TypeDefKind::Option(t) => format!("option<{}>", type_name(resolve, t)),
        TypeDefKind::List(t) => format!("list<{}>", type_name(resolve, t)),
        TypeDefKind::Result(r) => format!("result<{}, {}>", opt(&r.ok), opt(&r.err)),
        TypeDefKind::Tuple(t) => {
            let items: Vec<String> = t.types.iter().map(|t| type_name(resolve, t)).collect();
            format!("tuple<{}>", items.join(", "))
        }
        TypeDefKind::Type(t) => type_name(resolve, t),
        other => other.as_str().to_string(),
    }
}
