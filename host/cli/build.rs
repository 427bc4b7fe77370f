//! Links `corral` with packed relative relocations (DT_RELR: glibc 2.36 and binutils 2.38 or
//! later, which Debian 12 has). The binary is position-independent, so the dynamic loader
//! patches about 65,000 pointers at every start; in the old `.rela.dyn` format that table is
//! 1.5 MB for the loader to walk, as RELR 18 KB. Measured on the 2-core VM, 50 `corral exec`
//! runs in a loop went from 12.7 to 10.0 ms each. (Linking without PIE would remove the patching
//! altogether, but would give up address randomization of the host's code, which a sandbox's
//! host should keep.)

fn main() {
    // Without this, cargo reruns the script, and rebuilds the binary, whenever any file of the
    // package changes (a test included).
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo:rustc-link-arg-bin=corral=-Wl,-z,pack-relative-relocs");
}
