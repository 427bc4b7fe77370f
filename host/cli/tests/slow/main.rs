//! corral-cli's slow integration tests, in one binary: SIGKILL crash loops, replicas killed at
//! random on PostgreSQL, the operator console in headless Chromium, traces in Arize Phoenix and
//! the schemathesis run against the served OpenAPI document. `scripts/test` runs them with the
//! fast tier (`tests/all`); run only them with
//! `cargo test --release --locked --workspace --test slow`.

#[path = "../common/mod.rs"]
mod common;

mod console;
mod serve_contract;
mod serve_crash;
mod serve_replicas;
mod serve_tracing;
