//! Sparse × dense products on the CPU, parallel over output rows (no atomics: the transpose
//! runs on the precomputed transposed structure).

use rayon::prelude::*;

use crate::mat::Mat;
use crate::scalar::Scalar;
use crate::sparse::SparseMatrix;

/// `out = op(A) · x + beta · out`, values `vals[:, 0]` in CSR order.
pub fn spmm<T: Scalar>(
    s: &SparseMatrix,
    vals: &Mat<T>,
    transpose: bool,
    x: &Mat<T>,
    beta: f64,
    out: &mut Mat<T>,
) {
    assert_eq!(vals.rows, s.nnz(), "one value per stored entry");
    let (rows, inner) = if transpose { (s.cols, s.rows) } else { (s.rows, s.cols) };
    assert_eq!(x.rows, inner, "spmm: x has {} rows, the matrix {inner} columns", x.rows);
    assert_eq!((out.rows, out.cols), (rows, x.cols), "spmm: output shape");
    let (ptr, idx) = if transpose { (&s.t_row_ptr, &s.t_col_idx) } else { (&s.row_ptr, &s.col_idx) };
    let d = x.cols;
    let vc = vals.cols;
    let beta = T::of(beta);
    out.data.par_chunks_mut(d.max(1)).enumerate().with_min_len(64).for_each(|(r, o)| {
        if beta == T::zero() {
            o.fill(T::zero());
        } else if beta != T::one() {
            o.iter_mut().for_each(|v| *v *= beta);
        }
        let range = ptr[r] as usize..ptr[r + 1] as usize;
        for (k, &col) in range.clone().zip(&idx[range]) {
            let e = if transpose { s.t_perm[k] as usize } else { k };
            let w = vals.data[e * vc];
            let xr = &x.data[col as usize * d..][..d];
            for (o, &xv) in o.iter_mut().zip(xr) {
                *o += w * xv;
            }
        }
    });
}
