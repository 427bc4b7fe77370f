//! Sessions map only the snapshot pages they read (`SandboxConfig::fault_around` off, the
//! default): every pool slot's snapshot mapping is registered with userfaultfd, which turns
//! Linux's fault-around off there. A binary of its own, with one test: it reads the whole
//! process's mappings, which no other test may be adding to meanwhile.

use corral_sandbox::{Sandbox, SandboxConfig};
use corral_tests::{example_options, sandbox_with};

/// One `/proc/self/smaps` entry that is a snapshot image mapped copy-on-write.
#[derive(Debug)]
struct ImageMapping {
    start: u64,
    rss_kib: u64,
    /// `VmFlags` has `uw`: registered with userfaultfd for write-protect tracking.
    registered: bool,
}

fn image_mappings() -> Vec<ImageMapping> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").expect("reading /proc/self/smaps");
    let mut mappings = Vec::new();
    let mut current: Option<ImageMapping> = None;
    for line in smaps.lines() {
        let mut fields = line.split_ascii_whitespace();
        let first = fields.next().unwrap_or("");
        if let Some((start, _)) = first.split_once('-')
            && let Ok(start) = u64::from_str_radix(start, 16)
        {
            mappings.extend(current.take());
            let path = line.find('/').map(|i| line[i..].trim_end()).unwrap_or("");
            let path = path.strip_suffix(" (deleted)").unwrap_or(path);
            let image = path.ends_with(".cwasm") || path == "/memfd:wasm-memory-image";
            if fields.next() == Some("rw-p") && image {
                current = Some(ImageMapping {
                    start,
                    rss_kib: 0,
                    registered: false,
                });
            }
        } else if let Some(mapping) = &mut current {
            match first {
                "Rss:" => mapping.rss_kib = fields.next().and_then(|v| v.parse().ok()).unwrap_or(0),
                "VmFlags:" => mapping.registered = fields.any(|flag| flag == "uw"),
                _ => {}
            }
        }
    }
    mappings.extend(current);
    mappings
}

/// Linux's version as (major, minor).
fn kernel_version() -> (u32, u32) {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut parts = release
        .trim()
        .split(['.', '-'])
        .map(|p| p.parse().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
}

/// Starts `n` sessions at once, each running `return 1+1`, and keeps them alive.
async fn start_sessions(sandbox: &Sandbox, n: usize) -> Vec<corral_sandbox::ExecutorSession> {
    let starts = (0..n).map(|_| async {
        let mut session = sandbox
            .session(example_options())
            .await
            .expect("creating a session");
        assert_eq!(
            session.run("return 1+1").await.outcome.ok().flatten(),
            Some(2.into())
        );
        session
    });
    futures::future::join_all(starts).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_map_only_the_snapshot_pages_they_read() {
    let config = SandboxConfig {
        max_sessions: 16,
        ..SandboxConfig::default()
    };
    let sandbox = sandbox_with(config.clone());
    if !sandbox.maps_read_pages_only() {
        // Userfaultfd with asynchronous write-protect tracking came in Linux 6.7; on a kernel
        // that has it, refusing it would be a regression this test must catch.
        assert!(
            kernel_version() < (6, 7),
            "Linux {:?} has userfaultfd's WP_ASYNC, but the sandbox does not use it",
            kernel_version()
        );
        eprintln!(
            "skipped: Linux {:?} predates userfaultfd's WP_ASYNC",
            kernel_version()
        );
        return;
    }
    let before: Vec<u64> = image_mappings().iter().map(|m| m.start).collect();

    // Six sessions started together, so that slots are used for the first time while other
    // instantiations are under way; then four more, one at a time.
    let mut alive = start_sessions(&sandbox, 6).await;
    for _ in 0..4 {
        alive.extend(start_sessions(&sandbox, 1).await);
    }
    let ours: Vec<ImageMapping> = image_mappings()
        .into_iter()
        .filter(|m| !before.contains(&m.start))
        .collect();
    assert_eq!(
        ours.len(),
        10,
        "one snapshot mapping per live session: {ours:?}"
    );
    assert!(
        ours.iter().all(|m| m.registered),
        "every slot's snapshot mapping is registered: {ours:?}"
    );

    // The same with fault-around left on: the mappings are not registered, and each session
    // maps more of the snapshot (the neighbours of every page it reads).
    let around = sandbox_with(SandboxConfig {
        fault_around: true,
        ..config
    });
    assert!(!around.maps_read_pages_only());
    let known: Vec<u64> = image_mappings().iter().map(|m| m.start).collect();
    let _also_alive = start_sessions(&around, 4).await;
    let theirs: Vec<ImageMapping> = image_mappings()
        .into_iter()
        .filter(|m| !known.contains(&m.start))
        .collect();
    assert_eq!(theirs.len(), 4, "{theirs:?}");
    assert!(theirs.iter().all(|m| !m.registered), "{theirs:?}");
    let mean = |mappings: &[ImageMapping]| {
        mappings.iter().map(|m| m.rss_kib).sum::<u64>() / mappings.len() as u64
    };
    assert!(
        2 * mean(&ours) < mean(&theirs),
        "registered mappings hold {} KiB of the snapshot each, unregistered ones {} KiB",
        mean(&ours),
        mean(&theirs)
    );
    drop(alive);
}
