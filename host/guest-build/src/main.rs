//! `corral-guest-build`: turns the guest's core module into corral's sandbox component.
//!
//! ```text
//! corral-guest-build build --core target/guest-cargo/wasm32-wasip1/release/corral_guest.wasm --out guest.wasm
//! corral-guest-build check --component guest.wasm --wit wit
//! ```
//!
//! `build` links the guest's own WASI preview1 stand-ins in place of its preview1 imports (see
//! [`link`]), pre-initializes the module with Wizer (the QuickJS runtime and the prelude are
//! created once, here, and land in the snapshot's data segments, so a session starts with a warm
//! engine), then wraps the snapshot into a component with `wit-component`; no WASI adapter is
//! involved. `check` verifies that a component implements exactly the `corral:sandbox` world of
//! `wit/`, imports nothing else, and declares a maximum on its memory (used by `scripts/test` on
//! the fresh and the prebuilt guest).

#![forbid(unsafe_code)]

mod link;

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail};
use wasmtime::{Engine, Instance, Linker, Module, Store};
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
    let linked = link::link_preview1_stand_ins(&core)?;
    let snapshot = futures::executor::block_on(preinitialize(&linked))?;
    let component = wit_component::ComponentEncoder::default()
        .module(&snapshot)
        .context("reading the component metadata of the snapshot")?
        .validate(true)
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
    let mut linker: Linker<()> = Linker::new(&engine);
    // The module imports corral:sandbox/host alone (its WASI calls are linked to the guest's
    // stand-ins), and those imports must not run during initialization: if they did, the
    // snapshot would depend on a host, so they trap. Time and randomness come from the
    // stand-ins' defaults before `session.init` (a frozen clock at 0, a fixed seed), so the
    // snapshot, and so the component, is reproducible.
    linker.define_unknown_imports_as_traps(&module)?;
    let mut store = Store::new(&engine, ());
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

struct Snapshotted {
    store: Store<()>,
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

/// The most linear memory the guest may declare (its own maximum is set by a linker argument in
/// `guest/.cargo/config.toml`); hosts rely on a declared maximum to cap the guest.
const MAX_DECLARED_MEMORY_BYTES: u64 = 1 << 30;

/// Checks that `component` imports and exports exactly the `corral:sandbox` interfaces of the
/// `sandbox` world in `wit_dir`, nothing else (no WASI), and that every memory it defines
/// declares a maximum of at most [`MAX_DECLARED_MEMORY_BYTES`].
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
    if actual != expected {
        let extra: Vec<_> = actual.iter().filter(|i| !expected.contains(i)).collect();
        bail!(
            "{} does not match the sandbox world in {}:\n  expected {expected:?}\n  found    {actual:?}\n  not in the world: {extra:?}",
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
    let memories = check_memories(&bytes)?;
    println!(
        "ok: {} implements corral:sandbox/sandbox, imports nothing else, memory maximum {memories}",
        component_path.display()
    );
    Ok(())
}

/// Fails unless every memory defined in the component's core modules has a maximum of at most
/// [`MAX_DECLARED_MEMORY_BYTES`]; returns the maxima, for the report.
fn check_memories(component: &[u8]) -> Result<String> {
    let mut maxima = Vec::new();
    for payload in wasmparser::Parser::new(0).parse_all(component) {
        if let wasmparser::Payload::MemorySection(section) = payload? {
            for memory in section {
                let memory = memory?;
                let page = 1u64 << memory.page_size_log2.unwrap_or(16);
                let Some(maximum) = memory.maximum else {
                    bail!("a memory of the component declares no maximum, so hosts cannot cap it");
                };
                let bytes = maximum.saturating_mul(page);
                if bytes > MAX_DECLARED_MEMORY_BYTES {
                    bail!(
                        "a memory of the component declares a maximum of {bytes} bytes, over {MAX_DECLARED_MEMORY_BYTES}"
                    );
                }
                maxima.push(format!("{} MiB", bytes >> 20));
            }
        }
    }
    if maxima.is_empty() {
        bail!("the component defines no memory");
    }
    Ok(maxima.join(", "))
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
