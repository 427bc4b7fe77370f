//! Embeds the guest component. `CORRAL_GUEST_WASM` names a freshly built guest (the test
//! command sets it); otherwise the prebuilt `guest/dist/corral-guest.wasm` shipped in the
//! repository is used.

use std::path::PathBuf;

fn main() {
    println!("cargo::rerun-if-env-changed=CORRAL_GUEST_WASM");
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let guest = match std::env::var_os("CORRAL_GUEST_WASM") {
        Some(path) => PathBuf::from(path),
        None => manifest.join("../../guest/dist/corral-guest.wasm"),
    };
    println!("cargo::rerun-if-changed={}", guest.display());
    let bytes = match std::fs::read(&guest) {
        Ok(bytes) => bytes,
        Err(error) => {
            println!(
                "cargo::error=cannot read the guest component {}: {error}. Build it with scripts/build-guest (or point CORRAL_GUEST_WASM at one).",
                guest.display()
            );
            return;
        }
    };
    // The compiled-code cache is keyed by this digest; computing it here keeps hashing a
    // multi-megabyte component off every process start.
    let mut hasher = std::hash::DefaultHasher::new();
    std::hash::Hasher::write(&mut hasher, &bytes);
    let digest = format!(
        "{:016x}{:08x}",
        std::hash::Hasher::finish(&hasher),
        bytes.len()
    );
    println!("cargo::rustc-env=CORRAL_GUEST_DIGEST={digest}");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").unwrap_or_default());
    if let Err(error) = std::fs::write(out.join("corral-guest.wasm"), &bytes) {
        println!("cargo::error=cannot copy the guest component: {error}");
    }
}
