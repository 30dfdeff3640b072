//! The engine's integration tests that share one test binary (one link instead of seven: on
//! the 2-core VM each test binary cost about 15 s of build, most of CI's `cargo test`). One
//! module per file; `cargo test -p grinnder-engine --test suite tiered::` runs one of them.
//! Apart, in binaries of their own: `device_held` and `memory` (they measure the process's
//! memory, which other tests running beside them would move), `dist` (it runs itself under
//! `mpirun` by its test name) and `fuzz` (`.ci/slow` runs it longer).

#[path = "../common/mod.rs"]
mod common;

mod cost;
mod criterion;
mod directed;
mod feature_rows;
mod minibatch;
mod predict;
mod tiered;
mod trainer;
