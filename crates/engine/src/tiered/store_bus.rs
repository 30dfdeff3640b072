//! Rows read in any element type ([`Store::read_rows`]'s work), and the store's side of a bus
//! that carries bf16 ([`grinnder_tensor::Transfers::converts_bf16`]): rows read and blocks put
//! as bf16 bits, so that a bf16 block crosses as it is kept.

use std::io;

use grinnder_tensor::scalar::{from_bf16, to_bf16};
use grinnder_tensor::Scalar;
use rayon::prelude::*;

use crate::tiered::block::{BlockId, CacheMode};

use super::{Data, Store, TierDtype, PAR_BYTES};

impl<T: Scalar> Store<T> {
    /// [`Store::read_rows`] as bf16 ([`to_bf16`]'s bits: a bf16 block's own), for a bus that
    /// carries them.
    pub fn read_rows_bf16(&mut self, id: BlockId, idx: Option<&[u32]>, out: &mut [u16]) -> io::Result<()> {
        self.read_rows_as(id, idx, out, &|x| to_bf16(x as f32), &|h| h)
    }

    /// [`Store::put_slice`] of bf16 elements ([`to_bf16`]'s bits), kept as they are in a bf16
    /// store (a block a device rounded before it crossed the bus).
    pub fn put_bf16(&mut self, id: BlockId, rows: usize, cols: usize, data: &[u16]) -> io::Result<()> {
        assert_eq!(data.len(), rows * cols, "block {id:?}: data is rows × cols");
        self.put_made(
            id,
            rows,
            cols,
            |at, c| c.iter_mut().zip(&data[at..]).for_each(|(x, &h)| *x = T::of(from_bf16(h) as f64)),
            |at, c| c.copy_from_slice(&data[at..at + c.len()]),
        )
    }

    /// The type blocks are kept as.
    pub fn dtype(&self) -> TierDtype {
        self.cfg.dtype
    }

    /// [`Store::read_rows`] into elements of type `O`, made from a block's values by `of_f64`
    /// (f32 and f64 ones, exact through f64: the identity for `O = T`) or `of_bf16` (the bits
    /// of a bf16 block).
    pub(super) fn read_rows_as<O: Copy + Send + Sync>(
        &mut self,
        id: BlockId,
        idx: Option<&[u32]>,
        out: &mut [O],
        of_f64: &(impl Fn(f64) -> O + Sync),
        of_bf16: &(impl Fn(u16) -> O + Sync),
    ) -> io::Result<()> {
        if let Some(idx) = idx {
            if self.cfg.mode == CacheMode::PartitionLru && self.on_disk_only(id)? {
                return self.read_rows_from_file_as(id, idx, out, of_f64, of_bf16);
            }
        }
        let from_storage = self.load(id)?;
        let e = &self.entries[&id];
        let d = e.cols;
        let n = idx.map_or(e.rows, |i| i.len());
        if from_storage {
            self.stats.storage_needed_bytes += (n * d * self.elem_bytes()) as u64;
        }
        assert_eq!(out.len(), n * d, "block {id:?}: output holds the rows read");
        let row = |k: usize| idx.map_or(k, |i| i[k] as usize);
        // rows in parallel, a few thousand per task
        let per = (PAR_BYTES / (d * std::mem::size_of::<O>()).max(1)).max(1);
        match e.data.as_ref().expect("loaded") {
            Data::Full(v) => out.par_chunks_mut(d.max(1) * per).enumerate().for_each(|(c, o)| {
                for (k, o) in o.chunks_exact_mut(d.max(1)).enumerate() {
                    let r = row(c * per + k);
                    o.iter_mut().zip(&v[r * d..(r + 1) * d]).for_each(|(o, x)| *o = of_f64(x.f64()));
                }
            }),
            Data::Bf16(v) => out.par_chunks_mut(d.max(1) * per).enumerate().for_each(|(c, o)| {
                for (k, o) in o.chunks_exact_mut(d.max(1)).enumerate() {
                    let r = row(c * per + k);
                    o.iter_mut().zip(&v[r * d..(r + 1) * d]).for_each(|(o, &h)| *o = of_bf16(h));
                }
            }),
        }
        self.stats.host_read_bytes += (n * d * self.elem_bytes()) as u64;
        Ok(())
    }
}
