//! Partial reads of the store: some rows of a block that is on disk only, read from the
//! chunks of its file that hold them, without loading the block.

use std::io;
use std::time::Instant;

use grinnder_tensor::Scalar;
use rayon::prelude::*;

use crate::tiered::block::BlockId;
use crate::tiered::files::{Dtype, SUM_CHUNK};

use super::{Store, PAR_BYTES};

impl<T: Scalar> Store<T> {
    /// Whether block `id` is in its file only: not in RAM, not read ahead, not being read
    /// (after taking finished I/O, whose deferred write error it reports).
    pub(super) fn on_disk_only(&mut self, id: BlockId) -> io::Result<bool> {
        self.poll(false)?;
        let e = &self.entries[&id];
        Ok(e.data.is_none() && e.on_disk && !self.ready.contains_key(&id) && !self.reading.contains(&id))
    }

    /// Rows `idx` of block `id`, which is on disk only, read from the chunks of its file that
    /// hold them.
    /// The elements are of type `O`, made from the file's values by `of_f64` (f32 and f64
    /// files) or `of_bf16` (the bits of a bf16 file).
    pub(super) fn read_rows_from_file_as<O: Copy + Send + Sync>(
        &mut self,
        id: BlockId,
        idx: &[u32],
        out: &mut [O],
        of_f64: &(impl Fn(f64) -> O + Sync),
        of_bf16: &(impl Fn(u16) -> O + Sync),
    ) -> io::Result<()> {
        self.wait_writes(id)?;
        let t = self.tick();
        let e = self.entries.get_mut(&id).expect("present");
        e.last_use = t;
        let (rows, d) = (e.rows, e.cols);
        assert_eq!(out.len(), idx.len() * d, "block {id:?}: output holds the rows read");
        let dtype = self.file_dtype();
        let rb = d * dtype.size();
        let payload = rows * rb;
        // the chunks that hold the rows, as runs of consecutive chunks; where each starts in
        // the buffer read
        let chunks = payload.div_ceil(SUM_CHUNK);
        let mut wanted = vec![false; chunks];
        for &r in idx {
            let (from, to) = (r as usize * rb, (r as usize + 1) * rb);
            if to > from {
                wanted[from / SUM_CHUNK..=(to - 1) / SUM_CHUNK].iter_mut().for_each(|w| *w = true);
            }
        }
        let mut runs: Vec<std::ops::Range<usize>> = Vec::new();
        let mut at = vec![usize::MAX; chunks];
        let mut off = 0;
        for c in (0..chunks).filter(|&c| wanted[c]) {
            match runs.last_mut() {
                Some(r) if r.end == c => r.end += 1,
                _ => runs.push(c..c + 1),
            }
            at[c] = off;
            off += SUM_CHUNK;
        }
        let files = self.files.as_ref().expect("on disk: a storage tier");
        let start = Instant::now();
        let (buf, bytes) = files.read_chunks(&id.file_name(), payload, &self.entries[&id].sums, &runs)?;
        self.stats.read_s += start.elapsed().as_secs_f64();
        self.stats.storage_read_bytes += bytes as u64;
        self.stats.storage_needed_bytes += (idx.len() * rb) as u64;
        self.stats.row_reads += 1;
        let data = buf.as_slice();
        // a row's chunks are consecutive in the file and wanted together: in one run
        let bytes_of = |r: usize| {
            let from = r * rb;
            &data[at[from / SUM_CHUNK] + from % SUM_CHUNK..][..rb]
        };
        let per = (PAR_BYTES / (d * std::mem::size_of::<O>()).max(1)).max(1);
        out.par_chunks_mut(d.max(1) * per).enumerate().for_each(|(c, o)| {
            for (k, o) in o.chunks_exact_mut(d.max(1)).enumerate() {
                let src = bytes_of(idx[c * per + k] as usize);
                decode_into(dtype, src, o, of_f64, of_bf16);
            }
        });
        Ok(())
    }
}

/// Elements of `dtype` in little-endian `src` into `out`, by `of_f64` or (bf16) `of_bf16`.
fn decode_into<O>(
    dtype: Dtype,
    src: &[u8],
    out: &mut [O],
    of_f64: &impl Fn(f64) -> O,
    of_bf16: &impl Fn(u16) -> O,
) {
    match dtype {
        Dtype::Bf16 => {
            for (x, c) in out.iter_mut().zip(src.chunks_exact(2)) {
                *x = of_bf16(u16::from_le_bytes([c[0], c[1]]));
            }
        }
        Dtype::F32 => {
            for (x, c) in out.iter_mut().zip(src.chunks_exact(4)) {
                *x = of_f64(f32::from_le_bytes(c.try_into().unwrap()) as f64);
            }
        }
        Dtype::F64 => {
            for (x, c) in out.iter_mut().zip(src.chunks_exact(8)) {
                *x = of_f64(f64::from_le_bytes(c.try_into().unwrap()));
            }
        }
    }
}
