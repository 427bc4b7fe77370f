//! corral-server's integration tests, in one binary: one module per area, over real sockets.
//! Run one module with `cargo test --release --locked --workspace --test all streams::`.

mod api;
mod common;
mod limits;
mod operability;
mod replicas;
mod streams;
