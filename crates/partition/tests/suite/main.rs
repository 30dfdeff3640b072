//! The partitioners' integration tests in one test binary (one link instead of three: on the
//! 2-core VM each test binary cost about 15 s of build). One module per file; `cargo test -p
//! grinnder-partition --test suite multilevel::` runs one of them.

mod cache;
mod multilevel;
mod properties;
