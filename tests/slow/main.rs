//! corral-tests' slow tier, in one binary (harness = false, run through libtest-mimic): the
//! script corpus (`corpus::scripts::NAME` and `corpus::abuse::NAME`, one trial per `.js` file of
//! `tests/corpus/`) and the seeded fuzzing targets (`fuzz::TARGET`). `scripts/test` runs it with
//! the fast tier (`tests/all`); run only it with
//! `cargo test --release --locked --workspace --test slow`, one half with `-- corpus::` or
//! `-- fuzz::`, and one fuzz target for longer with `scripts/fuzz TARGET SECONDS`.

mod corpus;
mod fuzz;

use libtest_mimic::Arguments;

fn main() {
    let args = Arguments::from_args();
    let mut trials = corpus::trials();
    trials.extend(fuzz::trials());
    libtest_mimic::run(&args, trials).exit();
}
