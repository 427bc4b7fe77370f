//! The store's tests, in one binary with its own `main` (libtest-mimic):
//! - `conformance::{sqlite,postgres}::*`: one suite, the same test bodies, run against both
//!   backends;
//! - `embedded::*`: ownership of the store file across processes, SIGKILL crash safety,
//!   migrations of the embedded store;
//! - `postgres::*`: migrations shared by replicas, connection loss, start-up failures.
//!
//! PostgreSQL is started once, on first use, from the binaries on `PATH` (or the server named by
//! `DATABASE_URL`) and stopped when the last test is done. If none can be had, every PostgreSQL
//! test fails saying why: they never skip. The binary is also the child process of the crash
//! and ownership tests (see `embedded::child_main`).

mod conformance;
mod embedded;
mod postgres;
mod support;

use std::process::ExitCode;
use std::sync::Arc;

use libtest_mimic::Arguments;

fn main() -> ExitCode {
    if let Some(code) = embedded::child_main() {
        return code;
    }
    let arguments = Arguments::from_args();
    let harness = Arc::new(support::Harness::default());
    let mut trials = conformance::trials(&harness);
    trials.extend(embedded::trials());
    trials.extend(postgres::trials(&harness));
    let conclusion = libtest_mimic::run(&arguments, trials);
    // The trials held the other references: this stops the PostgreSQL server before exiting.
    drop(harness);
    conclusion.exit_code()
}
