//! The one `bindgen!` over `wit/`: Rust types and traits for the `corral:sandbox` world.

wasmtime::component::bindgen!({
    world: "sandbox",
    path: "../../wit",
    // Imports are plain synchronous functions (the guest never waits inside one: it returns
    // `waiting` instead); limits (total calls, log size) trap from them.
    imports: { default: trappable },
    // Exports are async because fuel and epochs make long guest work yield to the runtime.
    exports: { default: async },
});
