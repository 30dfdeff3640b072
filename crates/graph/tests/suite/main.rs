//! The graph crate's integration tests in one test binary (one link instead of six: on the
//! 2-core VM each test binary cost about 15 s of build). One module per file; `cargo test -p
//! grinnder-graph --test suite roundtrip::` runs one of them. `fuzz` keeps a binary of its own
//! (`.ci/slow` runs it longer).

#[path = "../common/mod.rs"]
mod common;

mod directed;
mod errors;
mod faults;
mod ogb_npz;
mod roundtrip;
mod sample;
