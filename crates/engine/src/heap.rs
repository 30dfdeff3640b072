//! What the process holds on its heap, counted by construction: a global allocator wrapper
//! that adds every allocation's size and subtracts every free's.
//!
//! The memory plan budgets with these counts rather than with a sampled resident set size:
//! RSS also holds what the allocator keeps of freed memory, which depends on thread timing, so
//! a plan made from it moved between identical runs by tens of MiB. Installed by the binary
//! (`#[global_allocator] static A: Counting<MiMalloc>`); where it is not installed (a library
//! user's allocator), [`live_bytes`] is `None` and callers fall back to RSS.
//!
//! Invariant: `live_bytes` is the sum of the sizes of the allocations not yet freed, exactly
//! (relaxed atomics: each update is exact, a reader sees some recent total).

use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

static LIVE: AtomicU64 = AtomicU64::new(0);
static PEAK: AtomicU64 = AtomicU64::new(0);
static INSTALLED: AtomicBool = AtomicBool::new(false);

/// A global allocator that counts the bytes of `A` in use.
pub struct Counting<A>(pub A);

/// Counts a successful allocation of `bytes` at `p` (nothing for a failed one).
fn allocated(p: *mut u8, bytes: usize) -> *mut u8 {
    if !p.is_null() {
        if !INSTALLED.load(Relaxed) {
            INSTALLED.store(true, Relaxed);
        }
        grew(bytes as u64);
    }
    p
}

fn grew(bytes: u64) {
    let now = LIVE.fetch_add(bytes, Relaxed) + bytes;
    if now > PEAK.load(Relaxed) {
        PEAK.fetch_max(now, Relaxed);
    }
}

// SAFETY: every method forwards to `A` with the caller's arguments unchanged; the counters are
// side effects that allocate nothing.
unsafe impl<A: GlobalAlloc> GlobalAlloc for Counting<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded from the caller's contract.
        allocated(unsafe { self.0.alloc(layout) }, layout.size())
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded from the caller's contract.
        allocated(unsafe { self.0.alloc_zeroed(layout) }, layout.size())
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded from the caller's contract.
        unsafe { self.0.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size() as u64, Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded from the caller's contract.
        let p = unsafe { self.0.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            if new_size >= layout.size() {
                grew((new_size - layout.size()) as u64);
            } else {
                LIVE.fetch_sub((layout.size() - new_size) as u64, Relaxed);
            }
        }
        p
    }
}

/// Heap bytes in use now, when the counting allocator is installed.
pub fn live_bytes() -> Option<u64> {
    INSTALLED.load(Relaxed).then(|| LIVE.load(Relaxed))
}

/// The most heap bytes in use at once since the start (or the last [`reset_peak`]).
pub fn peak_bytes() -> Option<u64> {
    INSTALLED.load(Relaxed).then(|| PEAK.load(Relaxed))
}

/// Starts a new peak from what is in use now.
pub fn reset_peak() {
    PEAK.store(LIVE.load(Relaxed), Relaxed);
}
