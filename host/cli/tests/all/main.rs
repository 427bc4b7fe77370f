//! corral-cli's fast integration tests, in one binary: the real `corral` binary run as a user
//! runs it, one module per command or area. The slow tier (crash loops, replicas, the browser,
//! the tracing collector, the API fuzzer) is `tests/slow`. Run one module with
//! `cargo test --release --locked --workspace --test all serve_chat::`.

#[path = "../common/mod.rs"]
mod common;

mod catalog;
mod chat;
mod exec;
mod mcp;
mod readme;
mod serve_chat;
mod serve_ops;
