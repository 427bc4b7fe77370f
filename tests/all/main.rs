//! corral's cross-crate integration tests: the sandbox through its public API, with real
//! backends (tokio tasks, timers) and the real guest under wasmtime. One module per topic.

mod cache;
mod calls;
mod codegen;
mod concurrency;
mod fuel;
mod isolation;
mod json;
mod limits;
mod patches;
mod preflight;
mod schedule;
