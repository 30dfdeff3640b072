//! Rows added into a block on every core ([`Store::add_rows`]'s work): a block's own rows in
//! order, distinct rows (a halo list) straight to their places, and rows that repeat grouped by
//! destination first. Grouping costs a pass and two allocations of the whole block's row count
//! whatever the rows added; an epoch adds each partition's halo into every neighbour's block
//! (about a thousand additions at 32 partitions), so distinct rows skip it.

use grinnder_tensor::Scalar;
use rayon::prelude::*;

use super::PAR_BYTES;

/// `add(v's row r, src's row j)` for each `j`, `r = idx[j]` (`j` itself when `idx` is `None`),
/// `v` being `rows × d`; rows that repeat are added in `src`'s order.
pub(super) fn add_into<E: Send + Sync, T: Scalar>(
    v: &mut [E],
    (rows, d): (usize, usize),
    idx: Option<&[u32]>,
    src: &[T],
    add: &(dyn Fn(&mut [E], &[T]) + Sync),
) {
    if d == 0 {
        return;
    }
    let k = idx.map_or(src.len() / d, |i| i.len());
    assert_eq!(src.len(), k * d, "rows added: {} values for {k} rows of {d}", src.len());
    assert!(k <= rows || idx.is_some(), "{k} rows added into the first rows of a block of {rows}");
    let per = (PAR_BYTES / (d * std::mem::size_of::<T>())).max(1);
    let Some(idx) = idx else {
        // the first rows, in order
        v.par_chunks_mut(d * per).zip(src.par_chunks(d * per)).for_each(|(o, s)| {
            o.chunks_exact_mut(d).zip(s.chunks_exact(d)).for_each(|(o, s)| add(o, s));
        });
        return;
    };
    if distinct(idx, rows) {
        let base = RowsPtr(v.as_mut_ptr());
        src.par_chunks(d * per).enumerate().for_each(|(c, s)| {
            for (j, s) in s.chunks_exact(d).enumerate() {
                let r = idx[c * per + j] as usize;
                // SAFETY: `r < rows` (checked by `distinct`), so the row lies inside `v`; the
                // rows of `idx` are distinct, so no two tasks write one row, and `v` is borrowed
                // mutably for the whole call.
                let row = unsafe { std::slice::from_raw_parts_mut(base.at(r * d), d) };
                add(row, s);
            }
        });
        return;
    }
    // rows that repeat: grouped by destination row (repeats add up in order), so that disjoint
    // destination rows go to parallel tasks
    let (ptr, order) = grinnder_tensor::sparse::group_by_row(idx, rows);
    v.par_chunks_mut(d * per).enumerate().for_each(|(c, chunk)| {
        for (j, row) in chunk.chunks_exact_mut(d).enumerate() {
            let r = c * per + j;
            for &i in &order[ptr[r]..ptr[r + 1]] {
                add(row, &src[i as usize * d..(i as usize + 1) * d]);
            }
        }
    });
}

/// Whether the rows of `idx` are distinct (each below `rows`, else a panic naming it).
fn distinct(idx: &[u32], rows: usize) -> bool {
    let mut seen = vec![0u64; rows.div_ceil(64)];
    for &i in idx {
        assert!((i as usize) < rows, "row {i} out of range");
        let (w, b) = (i as usize / 64, 1u64 << (i % 64));
        if seen[w] & b != 0 {
            return false;
        }
        seen[w] |= b;
    }
    true
}

/// A block's elements, written by several tasks at distinct rows.
struct RowsPtr<E>(*mut E);

// SAFETY: the tasks sharing it write disjoint rows (see `add_into`).
unsafe impl<E: Send> Sync for RowsPtr<E> {}

impl<E> RowsPtr<E> {
    /// The address of element `at` (a method, so that closures capture the whole wrapper).
    fn at(&self, at: usize) -> *mut E {
        // SAFETY: the caller stays inside the block (see `add_into`).
        unsafe { self.0.add(at) }
    }
}
