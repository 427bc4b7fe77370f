//! Links the guest's own preview1 stand-ins in place of its `wasi_snapshot_preview1` imports.
//!
//! Rust's standard library and wasi-libc import a few WASI preview1 functions (clock, random,
//! environment, stdio, exit). Wrapping them with the WASI adapter would make the component import
//! WASI 0.2 interfaces that every host then has to deny. Instead the guest implements them itself
//! (`guest/src/preview1.rs`) over the world's own config and functions, and exports each as
//! `corral-preview1-stand-in#<name>`. This pass rewrites the core module so that every call to
//! the import calls that export's function, drops the imports and those exports, and renumbers
//! the functions; the component then imports `corral:sandbox/host` and nothing else. (Symbol
//! names cannot do this at link time: rustc mangles the standard library's import symbols.)

use std::collections::{BTreeMap, HashSet};

use anyhow::{Context as _, Result, bail};
use wasm_encoder::reencode::{self, Reencode};
use wasmparser::{ExternalKind, Imports, Parser, Payload, TypeRef};

/// The module whose imports the guest stands in for.
const PREVIEW1: &str = "wasi_snapshot_preview1";
/// Prefix of the guest's exports that implement them.
const STAND_IN_PREFIX: &str = "corral-preview1-stand-in#";

/// Returns `core` with its preview1 imports linked to the guest's stand-ins.
pub fn link_preview1_stand_ins(core: &[u8]) -> Result<Vec<u8>> {
    // Function imports in index order (module, name), and the stand-in exports.
    let mut imports: Vec<(String, String)> = Vec::new();
    let mut stand_ins: BTreeMap<String, u32> = BTreeMap::new();
    for payload in Parser::new(0).parse_all(core) {
        match payload? {
            Payload::ImportSection(section) => {
                for group in section {
                    for import in group?.into_iter() {
                        let (_, import) = import?;
                        if let TypeRef::Func(_) | TypeRef::FuncExact(_) = import.ty {
                            imports.push((import.module.to_string(), import.name.to_string()));
                        }
                    }
                }
            }
            Payload::ExportSection(section) => {
                for export in section {
                    let export = export?;
                    if let (ExternalKind::Func, Some(name)) =
                        (export.kind, export.name.strip_prefix(STAND_IN_PREFIX))
                    {
                        stand_ins.insert(name.to_string(), export.index);
                    }
                }
            }
            _ => {}
        }
    }
    let removed: Vec<u32> = (0..imports.len() as u32)
        .filter(|i| imports[*i as usize].0 == PREVIEW1)
        .collect();
    let missing: Vec<&str> = removed
        .iter()
        .map(|i| imports[*i as usize].1.as_str())
        .filter(|name| !stand_ins.contains_key(*name))
        .collect();
    if !missing.is_empty() {
        bail!(
            "the guest imports {PREVIEW1} functions it has no stand-in for: {} (add them to guest/src/preview1.rs)",
            missing.join(", ")
        );
    }
    let mut linker = StandInLinker {
        removed: removed.iter().copied().collect(),
        removed_sorted: removed,
        targets: BTreeMap::new(),
    };
    for index in linker.removed_sorted.clone() {
        let target = stand_ins[&imports[index as usize].1];
        if linker.removed.contains(&target) {
            bail!(
                "the stand-in for {} is itself an import",
                imports[index as usize].1
            );
        }
        linker.targets.insert(index, linker.shift(target));
    }
    let mut module = wasm_encoder::Module::new();
    linker
        .parse_core_module(&mut module, Parser::new(0), core)
        .map_err(|e| anyhow::anyhow!("rewriting the core module: {e:?}"))?;
    let linked = module.finish();
    wasmparser::Validator::new_with_features(wasmparser::WasmFeatures::all())
        .validate_all(&linked)
        .context("the linked core module is invalid (does a stand-in have the wrong signature?)")?;
    Ok(linked)
}

struct StandInLinker {
    removed: HashSet<u32>,
    removed_sorted: Vec<u32>,
    /// Removed import index -> new index of its stand-in.
    targets: BTreeMap<u32, u32>,
}

impl StandInLinker {
    /// The new index of a function that stays.
    fn shift(&self, index: u32) -> u32 {
        index - self.removed_sorted.partition_point(|r| *r < index) as u32
    }
}

impl Reencode for StandInLinker {
    type Error = std::convert::Infallible;

    fn function_index(&mut self, func: u32) -> Result<u32, reencode::Error<Self::Error>> {
        Ok(match self.targets.get(&func) {
            Some(target) => *target,
            None => self.shift(func),
        })
    }

    fn parse_imports(
        &mut self,
        section: &mut wasm_encoder::ImportSection,
        imports: Imports<'_>,
    ) -> Result<(), reencode::Error<Self::Error>> {
        for import in imports.into_iter() {
            let (_, import) = import?;
            if import.module == PREVIEW1 {
                continue;
            }
            section.import(import.module, import.name, self.entity_type(import.ty)?);
        }
        Ok(())
    }

    fn parse_export(
        &mut self,
        exports: &mut wasm_encoder::ExportSection,
        export: wasmparser::Export<'_>,
    ) -> Result<(), reencode::Error<Self::Error>> {
        if export.name.starts_with(STAND_IN_PREFIX) {
            return Ok(());
        }
        reencode::utils::parse_export(self, exports, export)
    }

    fn parse_custom_name_subsection(
        &mut self,
        names: &mut wasm_encoder::NameSection,
        section: wasmparser::Name<'_>,
    ) -> Result<(), reencode::Error<Self::Error>> {
        // Function names of removed imports would collide with their stand-ins' names.
        if let wasmparser::Name::Function(map) = section {
            let mut functions = wasm_encoder::NameMap::new();
            for naming in map {
                let naming = naming?;
                if !self.removed.contains(&naming.index) {
                    functions.append(self.shift(naming.index), naming.name);
                }
            }
            names.functions(&functions);
            return Ok(());
        }
        reencode::utils::parse_custom_name_subsection(self, names, section)
    }
}
