//! Integration tests of corral-catalog, one module per topic.

mod corpus;
mod loading;
mod redaction;
mod rendering;
mod validation;

use std::path::{Path, PathBuf};

/// The repository root (`host/catalog/../..`).
pub(crate) fn repo_root() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    root.canonicalize().unwrap_or(root)
}

/// The crate's own folder.
pub(crate) fn crate_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}
