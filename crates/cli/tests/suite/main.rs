//! The CLI's integration tests in one test binary (one link instead of six: on the 2-core VM
//! each test binary cost about 15 s of build). One module per file; `cargo test -p
//! grinnder-cli --test suite faults::` runs one of them. Apart, in binaries of their own:
//! `scale` (it compares peak memory under a control group, which tests running beside it
//! would move) and `mpi` (real ranks under `mpirun`).

mod common;

mod cli;
mod crash;
mod directed;
mod faults;
mod first_contact;
mod predict;
