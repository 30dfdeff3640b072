//! Which page-locked buffer a transfer reuses ([`crate::host::PinnedPool`]'s policy, apart
//! from CUDA so that it is tested without a device).
//!
//! Buffers come in power-of-two classes, each a queue in the order they were given back (so
//! oldest work first). A take looks at its class's oldest buffer alone: finished, it is reused;
//! not finished, a new one is made while the class holds fewer than [`most`]; past that, the
//! host waits for the oldest. The pool is bounded (per class 32 buffers of up to 1 MiB, 32 MiB
//! of larger ones, at least two; one more per thread that made one at the same time) and a
//! take costs one event query. The price of looking at the oldest alone: where one class serves
//! two streams, a take may wait for the slower stream's copy while a newer buffer has finished.
//!
//! Why bounded: the pool used to grow by one buffer whenever no buffer had finished and to look
//! at every buffer it held on each take. The tiered executor queues a partition's gathers far
//! ahead of the device, each with a row list uploaded through the pool, so at 128 partitions the
//! pool grew through an epoch and the next epoch's takes queried thousands of events: on one
//! H100 (papers-like at scale 0.1, GCN 3 × 256, `--parts 128 --gpu-mem 10GiB --tier-dtype
//! bf16`, 74d26e4) the host spent 16.2 s of a 34 s two-epoch run inside the zero-copy gathers'
//! calls, epoch 1 took 21.1 s against epoch 0's 13.2 s, and the same run with every operation
//! synchronised (`GRINNDER_CUDA_PROFILE=1`, so that every buffer had finished when taken) took
//! 7.4 s and 5.8 s.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;

/// The smallest buffer made (a page-locked allocation has a cost of its own; small row lists
/// share a class).
pub(crate) const SMALLEST: usize = 64 << 10;

/// Bytes a class keeps at most before the host waits (see [`most`]).
const CLASS_BYTES: usize = 32 << 20;

/// Buffers a class of `bytes` keeps at most: 32 of the small ones (a few partitions' row lists
/// in flight), fewer of the large ones (a download of a partition's block), at least 2.
pub(crate) fn most(bytes: usize) -> usize {
    (CLASS_BYTES / bytes).clamp(2, 32)
}

/// The class of a buffer for `n` bytes.
pub(crate) fn class(n: usize) -> usize {
    n.max(1).next_power_of_two().max(SMALLEST)
}

/// A buffer whose last use may still be running.
pub(crate) trait InFlight {
    /// Whether its last use has finished (one query).
    fn finished(&self) -> bool;
    /// Waits for its last use.
    fn wait(&mut self);
    /// Its size in bytes.
    fn bytes(&self) -> usize;
}

/// A take's answer: a buffer whose last use has finished, or the size of one to make.
pub(crate) enum Taken<B> {
    Reused(B),
    Make(usize),
}

/// The buffers not in use, by class, oldest given back first.
pub(crate) struct Reuse<B> {
    classes: Mutex<BTreeMap<usize, VecDeque<B>>>,
}

impl<B> Default for Reuse<B> {
    fn default() -> Self {
        Reuse { classes: Mutex::new(BTreeMap::new()) }
    }
}

impl<B: InFlight> Reuse<B> {
    /// A buffer of at least `n` bytes whose last use has finished (waiting for it where the
    /// class is full), or the size of a new one to make.
    pub(crate) fn take(&self, n: usize) -> Taken<B> {
        let c = class(n);
        let mut classes = self.classes.lock().unwrap_or_else(|p| p.into_inner());
        let q = classes.entry(c).or_default();
        let oldest_done = q.front().map(InFlight::finished);
        match oldest_done {
            Some(true) => Taken::Reused(q.pop_front().expect("a buffer")),
            Some(false) if q.len() >= most(c) => {
                let mut b = q.pop_front().expect("a buffer");
                // (other threads take and give meanwhile)
                drop(classes);
                b.wait();
                Taken::Reused(b)
            }
            _ => Taken::Make(c),
        }
    }

    /// `b` back, its last use queued.
    pub(crate) fn give(&self, b: B) {
        // the largest class it serves (buffers are made at their class's size)
        let c = 1usize << (usize::BITS - 1 - b.bytes().max(1).leading_zeros());
        // (a class may hold more than `most` where several threads made buffers at once: at most
        // one more per thread, kept; dropping one here would wait for its copy under the lock)
        self.classes.lock().unwrap_or_else(|p| p.into_inner()).entry(c).or_default().push_back(b);
    }

    /// Buffers held, for tests.
    #[cfg(test)]
    fn held(&self) -> usize {
        self.classes.lock().unwrap().values().map(VecDeque::len).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::rc::Rc;

    /// A buffer whose use finishes when the test says; it counts the queries and waits.
    struct Fake {
        bytes: usize,
        done: Rc<Cell<bool>>,
        queries: Rc<Cell<usize>>,
        waits: Rc<Cell<usize>>,
    }

    impl InFlight for Fake {
        fn finished(&self) -> bool {
            self.queries.set(self.queries.get() + 1);
            self.done.get()
        }
        fn wait(&mut self) {
            self.waits.set(self.waits.get() + 1);
            self.done.set(true);
        }
        fn bytes(&self) -> usize {
            self.bytes
        }
    }

    struct Counters {
        queries: Rc<Cell<usize>>,
        waits: Rc<Cell<usize>>,
    }

    impl Counters {
        fn new() -> Self {
            Counters { queries: Rc::default(), waits: Rc::default() }
        }
        /// Takes `n` bytes, making a buffer where told to; returns it and whether it was made.
        fn take(&self, pool: &Reuse<Fake>, n: usize) -> (Fake, bool) {
            match pool.take(n) {
                Taken::Reused(b) => (b, false),
                Taken::Make(bytes) => {
                    assert!(bytes >= n && bytes.is_power_of_two());
                    let f = Fake {
                        bytes,
                        done: Rc::default(),
                        queries: self.queries.clone(),
                        waits: self.waits.clone(),
                    };
                    (f, true)
                }
            }
        }
    }

    #[test]
    fn a_finished_buffer_is_reused_and_one_in_flight_is_not() {
        let (pool, c) = (Reuse::default(), Counters::new());
        let (b, made) = c.take(&pool, 1000);
        assert!(made && b.bytes == SMALLEST);
        let done = b.done.clone();
        pool.give(b);
        // in flight: a new one
        let (b2, made) = c.take(&pool, 1000);
        assert!(made);
        pool.give(b2);
        done.set(true);
        let (b, made) = c.take(&pool, 5000);
        assert!(!made && b.bytes == SMALLEST, "the finished oldest, reused");
        // another class is never handed out for a size it does not hold
        let (big, made) = c.take(&pool, SMALLEST + 1);
        assert!(made && big.bytes == 2 * SMALLEST);
        assert_eq!(c.waits.get(), 0);
    }

    #[test]
    fn the_pool_is_bounded_and_a_take_queries_once_when_the_host_runs_ahead() {
        // the host queues far ahead of the device: no buffer finishes
        let (pool, c) = (Reuse::default(), Counters::new());
        let cap = most(SMALLEST);
        let mut made = 0;
        for i in 0..10_000 {
            let before = c.queries.get();
            let (b, new) = c.take(&pool, 4096);
            made += new as usize;
            assert!(c.queries.get() - before <= 1, "take {i} queried {} events", c.queries.get() - before);
            b.done.set(false); // its new use
            pool.give(b);
            assert!(pool.held() <= cap);
        }
        assert_eq!(made, cap, "made up to the class's bound, then waited for the oldest");
        assert_eq!(c.waits.get(), 10_000 - cap);
    }

    #[test]
    fn large_classes_hold_few_buffers() {
        assert_eq!(most(SMALLEST), 32);
        assert_eq!(most(4 << 20), 8);
        assert_eq!(most(1 << 30), 2);
        assert_eq!(class(0), SMALLEST);
        assert_eq!(class((4 << 20) + 1), 8 << 20);
        // a buffer given back larger than its class serves the class below it at most
        let (pool, c) = (Reuse::default(), Counters::new());
        let f = Fake {
            bytes: 3 * SMALLEST,
            done: Rc::new(Cell::new(true)),
            queries: c.queries.clone(),
            waits: c.waits.clone(),
        };
        pool.give(f);
        let (b, made) = c.take(&pool, 2 * SMALLEST);
        assert!(!made && b.bytes == 3 * SMALLEST);
    }
}
