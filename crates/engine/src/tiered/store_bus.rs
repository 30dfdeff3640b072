//! The store's side of a bus that carries bf16 ([`grinnder_tensor::Transfers::converts_bf16`]):
//! rows read and blocks put as bf16 bits, so that a bf16 block crosses as it is kept.

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
        let data = match self.cfg.dtype {
            TierDtype::F32 => Data::Full(
                data.par_iter().with_min_len(1 << 16).map(|&h| T::of(from_bf16(h) as f64)).collect(),
            ),
            TierDtype::Bf16 => Data::Bf16(crate::tiered::par_to_vec(data)),
        };
        self.put_data(id, rows, cols, data)
    }

    /// The type blocks are kept as.
    pub fn dtype(&self) -> TierDtype {
        self.cfg.dtype
    }
}
