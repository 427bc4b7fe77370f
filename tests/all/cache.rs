//! The compiled guest is cached on disk, trusted only in a private folder, recompiled when the
//! cache is damaged, and stale entries of the same engine are removed.

use std::os::unix::fs::PermissionsExt;

use corral_sandbox::{CompiledFrom, Sandbox, SandboxConfig};

fn load(dir: &std::path::Path) -> CompiledFrom {
    let config = SandboxConfig {
        cache_dir: Some(dir.to_path_buf()),
        max_sessions: 2,
        ..SandboxConfig::default()
    };
    Sandbox::new(config).expect("sandbox").compiled_from()
}

fn entries(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut list: Vec<_> = std::fs::read_dir(dir)
        .expect("read cache dir")
        .flatten()
        .map(|e| e.path())
        .collect();
    list.sort();
    list
}

#[test]
fn compiled_code_is_cached_checked_and_pruned() {
    let root = tempfile::tempdir().expect("temp dir");
    let dir = root.path().join("cache");

    assert_eq!(load(&dir), CompiledFrom::CompiledAndCached);
    let mode = std::fs::metadata(&dir)
        .expect("cache dir")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o700, "the cache folder must be private");
    let cached = entries(&dir);
    assert_eq!(cached.len(), 1);
    assert_eq!(load(&dir), CompiledFrom::Cache);

    // A damaged entry is not trusted: the guest is compiled again and the entry rewritten.
    std::fs::write(&cached[0], b"not compiled code").expect("damage the entry");
    let name = cached[0]
        .file_name()
        .expect("name")
        .to_string_lossy()
        .into_owned();
    let engine_suffix = name
        .rsplit_once('-')
        .map(|(_, s)| s.to_string())
        .expect("suffix");
    let stale = dir.join(format!("guest-00000000000000000000000000-{engine_suffix}"));
    std::fs::write(&stale, b"an older guest").expect("stale entry");
    assert_eq!(load(&dir), CompiledFrom::CompiledAndCached);
    assert!(!stale.exists(), "a stale entry of this engine was kept");
    assert_eq!(entries(&dir), cached);
    assert_eq!(load(&dir), CompiledFrom::Cache);

    // A folder others can write to is never used.
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    assert_eq!(load(&dir), CompiledFrom::Compiled);
}
