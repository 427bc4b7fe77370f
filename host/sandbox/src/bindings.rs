//! The one `bindgen!` over `wit/`: Rust types and traits for the `corral:sandbox` world.

wasmtime::component::bindgen!({
    world: "sandbox",
    path: "../../wit",
    imports: {
        // The only import that waits: it suspends the guest until calls complete.
        "corral:sandbox/host.wait-completions": async | trappable,
        // Limits (total calls, log size) trap from the other imports.
        default: trappable,
    },
    exports: { default: async },
});
