//! The `grinnder` command's settings and commands, as a library: the binary (`main.rs`) and
//! the Python package (`crates/python`) share its settings — flags, TOML keys and Python
//! keywords are one set of names ([`args::TrainSettings`]) validated once ([`plan`]) — and its
//! ways of running a trainer.

pub mod args;
pub mod bench;
pub mod budgets;
pub mod bundled;
pub mod bytes;
pub mod commands;
pub mod info;
pub mod load;
pub mod outputs;
pub mod plan;
pub mod plot;
pub mod predict;
pub mod rates;
pub mod train;

/// Under a host budget, freed memory goes back to the kernel at once (mimalloc's purge delay
/// 0) instead of 10 ms later: what the allocator keeps of freed memory counts in the resident
/// set, and with the delay peak RSS overshot `--host-mem` by up to 11 % (arxiv-like at scale
/// 0.5, hidden 128, 4 partitions, 2026-12-01). The price is page faults when epochs allocate
/// again, paid only where a budget was asked for.
///
/// Transparent huge pages are turned off for the same reason: mimalloc asks for them on its
/// arenas, and a 2 MiB page stays resident whole while any 64 KiB of it is in use, so purged
/// memory did not leave the resident set (48 MiB of the overshoot in the run above).
///
/// Without the `alloc` feature (the Python extension, inside an interpreter with its own
/// allocator) it does nothing.
pub fn return_freed_memory_at_once() {
    #[cfg(feature = "alloc")]
    set_up_allocator();
}

#[cfg(feature = "alloc")]
fn set_up_allocator() {
    /// `mi_option_purge_delay` (the same position in mimalloc v2 and v3's option enum).
    const PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;
    // SAFETY: setting an option has no memory-safety requirement; mimalloc reads it at each purge.
    unsafe { libmimalloc_sys::mi_option_set(PURGE_DELAY, 0) };
    // SAFETY: prctl with integer arguments only; it affects page faults from now on.
    if unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) } != 0 {
        tracing::debug!("cannot turn transparent huge pages off: {}", std::io::Error::last_os_error());
    }
}
