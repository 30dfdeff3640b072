//! Buffers of blocks replaced or removed, kept for the next block of their length: a block
//! made in fresh memory pays a page fault per 4 KiB page on first touch (on the 2-core VM a
//! fresh 512 MB buffer filled at 0.6 GB/s against 12 GB/s for one reused; on the GPU machine
//! the write-back of bf16 blocks at papers-like scale 0.5 stayed at 14.9 s of a 19.4 s epoch
//! with spares, against 17.9 of 22.0 s without on another card: not its main cost, BENCHMARKS
//! P7 and docs/benchmarks-log.md's P8). Spares never take the store past the
//! most its blocks have held at once (so they stay inside any plan that fitted those blocks),
//! count against the budget, and are the first to go when room is needed.

use grinnder_tensor::Scalar;
use rayon::prelude::*;

use crate::tiered::block::BlockId;

use super::{Data, Store, TierDtype};

/// Buffers below this size are not kept (their faults are few).
const SPARE_MIN_BYTES: u64 = 1 << 20;

impl<T: Scalar> Store<T> {
    /// Takes block `id`'s RAM copy out, as a spare.
    pub(super) fn retire_ram(&mut self, id: BlockId) {
        let Some(d) = self.entries.get_mut(&id).and_then(|e| e.data.take()) else { return };
        let bytes = d.bytes();
        self.resident -= bytes;
        if bytes >= SPARE_MIN_BYTES {
            self.spare_bytes += bytes;
            self.spare.push(d);
            self.trim_spares();
        }
    }

    /// Drops the oldest spares while the store's blocks and spares hold more than its blocks
    /// ever held at once.
    pub(super) fn trim_spares(&mut self) {
        self.peak_live = self.peak_live.max(self.resident);
        while self.resident + self.spare_bytes > self.peak_live && !self.spare.is_empty() {
            let d = self.spare.remove(0);
            self.spare_bytes -= d.bytes();
        }
    }

    /// Drops every spare.
    pub(super) fn drop_spares(&mut self) {
        self.spare.clear();
        self.spare_bytes = 0;
    }

    /// A spare of `len` elements in the store's type, if one is kept.
    fn take_spare(&mut self, len: usize) -> Option<Data<T>> {
        let i = self.spare.iter().rposition(|d| match (d, self.cfg.dtype) {
            (Data::Full(v), TierDtype::F32) => v.len() == len,
            (Data::Bf16(v), TierDtype::Bf16) => v.len() == len,
            _ => false,
        })?;
        let d = self.spare.remove(i); // oldest first stays the order `trim_spares` drops by
        self.spare_bytes -= d.bytes();
        Some(d)
    }

    /// `len` elements in the store's type, into a spare where one is kept, written chunk by
    /// chunk on every core by `full` (f32 blocks) or `half` (bf16): each is given a chunk's
    /// first element's index and writes the whole chunk.
    pub(super) fn make_data(
        &mut self,
        len: usize,
        full: impl Fn(usize, &mut [T]) + Sync,
        half: impl Fn(usize, &mut [u16]) + Sync,
    ) -> Data<T> {
        let mut d = self.take_spare(len).unwrap_or_else(|| match self.cfg.dtype {
            TierDtype::F32 => Data::Full(vec![T::zero(); len]),
            TierDtype::Bf16 => Data::Bf16(vec![0; len]),
        });
        const CHUNK: usize = 1 << 16;
        match &mut d {
            Data::Full(v) => v.par_chunks_mut(CHUNK).enumerate().for_each(|(i, c)| full(i * CHUNK, c)),
            Data::Bf16(v) => v.par_chunks_mut(CHUNK).enumerate().for_each(|(i, c)| half(i * CHUNK, c)),
        }
        d
    }
}
