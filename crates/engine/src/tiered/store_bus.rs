//! Rows read in any element type ([`Store::read_rows`]'s work), and the store's side of a bus
//! that carries bf16 ([`grinnder_tensor::Transfers::converts_bf16`]): rows read and blocks put
//! as bf16 bits, so that a bf16 block crosses as it is kept.

use super::*;

impl<T: Scalar> Store<T> {
    /// [`Store::read_rows`] as bf16 ([`to_bf16`]'s bits: a bf16 block's own), for a bus that
    /// carries them.
    pub fn read_rows_bf16(&mut self, id: BlockId, idx: Option<&[u32]>, out: &mut [u16]) -> io::Result<()> {
        let of_f64 = |x: f64| to_bf16(x as f32);
        self.read_rows_as(
            id,
            idx,
            out,
            &|row: &[T], o: &mut [u16]| o.iter_mut().zip(row).for_each(|(h, x)| *h = of_f64(x.f64())),
            &|row: &[u16], o: &mut [u16]| o.copy_from_slice(row),
            (&of_f64, &|h| h),
        )
    }

    /// [`Store::put_slice`] of bf16 elements ([`to_bf16`]'s bits), kept as they are in a bf16
    /// store (a block a device rounded before it crossed the bus).
    pub fn put_bf16(&mut self, id: BlockId, rows: usize, cols: usize, data: &[u16]) -> io::Result<()> {
        assert_eq!(data.len(), rows * cols, "block {id:?}: data is rows × cols");
        self.poll(false)?;
        self.retire_ram(id);
        let data = self.make_data(
            data.len(),
            |at, c| c.iter_mut().zip(&data[at..]).for_each(|(x, &h)| *x = T::of(from_bf16(h) as f64)),
            |at, c| c.copy_from_slice(&data[at..at + c.len()]),
        );
        self.put_data(id, rows, cols, data)
    }

    /// The type blocks are kept as.
    pub fn dtype(&self) -> TierDtype {
        self.cfg.dtype
    }

    /// [`Store::read_rows`] into elements of type `O`: a row of an f32 block by `full`, of a
    /// bf16 block by `half`, of a file read in part by `partial` (from f32 or f64 values, and
    /// from bf16 bits).
    pub(super) fn read_rows_as<O: Copy + Send + Sync>(
        &mut self,
        id: BlockId,
        idx: Option<&[u32]>,
        out: &mut [O],
        full: &(impl Fn(&[T], &mut [O]) + Sync),
        half: &(impl Fn(&[u16], &mut [O]) + Sync),
        partial: (&(impl Fn(f64) -> O + Sync), &(impl Fn(u16) -> O + Sync)),
    ) -> io::Result<()> {
        if let Some(idx) = idx {
            if self.cfg.mode == CacheMode::PartitionLru && self.on_disk_only(id)? {
                return self.read_rows_from_file_as(id, idx, out, partial.0, partial.1);
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
                    full(&v[r * d..(r + 1) * d], o);
                }
            }),
            Data::Bf16(v) => out.par_chunks_mut(d.max(1) * per).enumerate().for_each(|(c, o)| {
                for (k, o) in o.chunks_exact_mut(d.max(1)).enumerate() {
                    let r = row(c * per + k);
                    half(&v[r * d..(r + 1) * d], o);
                }
            }),
        }
        self.stats.host_read_bytes += (n * d * self.elem_bytes()) as u64;
        Ok(())
    }
}
