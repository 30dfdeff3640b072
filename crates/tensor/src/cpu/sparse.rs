//! Sparse × dense products on the CPU, parallel over output rows (no atomics: the transpose
//! runs on the precomputed transposed structure).

use rayon::prelude::*;

use crate::backend::MaskKey;
use crate::dropout::keep;
use crate::mat::Mat;
use crate::scalar::Scalar;
use crate::sparse::SparseMatrix;

/// How many entries ahead `spmm` prefetches the row it will gather. A gathered row costs a
/// cache miss, and one row's multiply-adds fill the reorder buffer, so without prefetching the
/// misses of consecutive entries hardly overlap.
const PREFETCH: usize = 16;

/// Hints the cache to load `row` (every 64-byte line of it).
#[inline(always)]
fn prefetch_row<T>(row: &[T]) {
    #[cfg(target_arch = "x86_64")]
    {
        let bytes = std::mem::size_of_val(row);
        let p = row.as_ptr() as *const i8;
        let mut off = 0;
        while off < bytes {
            // SAFETY: prefetching has no architectural effect; the address lies inside `row`.
            unsafe { std::arch::x86_64::_mm_prefetch(p.add(off), std::arch::x86_64::_MM_HINT_T0) };
            off += 64;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = row;
}

/// `o` times `beta` (0 clears it, whatever it holds).
fn scale_by_beta<T: Scalar>(o: &mut [T], beta: T) {
    if beta == T::zero() {
        o.fill(T::zero());
    } else if beta != T::one() {
        o.iter_mut().for_each(|v| *v *= beta);
    }
}

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
    assert!(
        !transpose || s.has_entry_order(),
        "a structure kept without its transpose's entry order multiplies only factored values"
    );
    let (rows, inner) = if transpose { (s.cols, s.rows) } else { (s.rows, s.cols) };
    assert_eq!(x.rows, inner, "spmm: x has {} rows, the matrix {inner} columns", x.rows);
    assert_eq!((out.rows, out.cols), (rows, x.cols), "spmm: output shape");
    let (ptr, idx) = if transpose { (&s.t_row_ptr, &s.t_col_idx) } else { (&s.row_ptr, &s.col_idx) };
    let d = x.cols;
    let vc = vals.cols;
    let beta = T::of(beta);
    out.data.par_chunks_mut(d.max(1)).enumerate().with_min_len(64).for_each(|(r, o)| {
        scale_by_beta(o, beta);
        let range = ptr[r] as usize..ptr[r + 1] as usize;
        for (k, &col) in range.clone().zip(&idx[range]) {
            // the row gathered PREFETCH entries ahead: its cache misses overlap this row's work
            if let Some(&ahead) = idx.get(k + PREFETCH) {
                prefetch_row(&x.data[ahead as usize * d..][..d]);
                if transpose {
                    let e = s.t_perm[k + PREFETCH] as usize;
                    prefetch_row(&vals.data[e * vc..(e + 1) * vc]);
                }
            }
            let e = if transpose { s.t_perm[k] as usize } else { k };
            let xr = &x.data[col as usize * d..][..d];
            if vc == 1 {
                let w = vals.data[e];
                for (o, &xv) in o.iter_mut().zip(xr) {
                    *o += w * xv;
                }
            } else {
                let f = d / vc;
                for (h, (ob, xb)) in o.chunks_mut(f).zip(xr.chunks(f)).enumerate() {
                    let w = vals.data[e * vc + h];
                    for (o, &xv) in ob.iter_mut().zip(xb) {
                        *o += w * xv;
                    }
                }
            }
        }
    });
}

/// `out = op(A) · x + beta · out` with entry `(r, c)` of `A` = `rows[r] · cols[c]` (a factor
/// absent: 1), each factor a column vector. Each entry's value is the product of its two
/// factors, summed in the order [`spmm`] sums values per entry (so the two differ only by the
/// rounding of that product).
pub fn spmm_factored<T: Scalar>(
    s: &SparseMatrix,
    rows: Option<&Mat<T>>,
    cols: Option<&Mat<T>>,
    transpose: bool,
    x: &Mat<T>,
    beta: f64,
    out: &mut Mat<T>,
) {
    let (n, inner) = if transpose { (s.cols, s.rows) } else { (s.rows, s.cols) };
    assert_eq!(x.rows, inner, "spmm: x has {} rows, the matrix {inner} columns", x.rows);
    assert_eq!((out.rows, out.cols), (n, x.cols), "spmm: output shape");
    assert!(rows.is_none_or(|f| (f.rows, f.cols) == (s.rows, 1)), "one row factor per row");
    assert!(cols.is_none_or(|f| (f.rows, f.cols) == (s.cols, 1)), "one column factor per column");
    assert!(!transpose || s.has_transpose(), "a transposed product needs the structure's transpose");
    let (ptr, idx) = if transpose { (&s.t_row_ptr, &s.t_col_idx) } else { (&s.row_ptr, &s.col_idx) };
    let (outer, inner) = if transpose { (cols, rows) } else { (rows, cols) };
    let d = x.cols;
    let beta = T::of(beta);
    out.data.par_chunks_mut(d.max(1)).enumerate().with_min_len(64).for_each(|(r, o)| {
        scale_by_beta(o, beta);
        let w_out = outer.map(|f| f.data[r]);
        let range = ptr[r] as usize..ptr[r + 1] as usize;
        for (k, &col) in range.clone().zip(&idx[range]) {
            if let Some(&ahead) = idx.get(k + PREFETCH) {
                prefetch_row(&x.data[ahead as usize * d..][..d]);
            }
            let w = match (w_out, inner) {
                (Some(a), Some(f)) => a * f.data[col as usize],
                (Some(a), None) => a,
                (None, Some(f)) => f.data[col as usize],
                (None, None) => T::one(),
            };
            for (o, &xv) in o.iter_mut().zip(&x.data[col as usize * d..][..d]) {
                *o += w * xv;
            }
        }
    });
}

/// `out[e, h] = a[r, block h] · b[c, block h]` for every stored entry `e = (r, c)`.
pub fn sddmm<T: Scalar>(s: &SparseMatrix, a: &Mat<T>, b: &Mat<T>, out: &mut Mat<T>) {
    let k = out.cols;
    assert_eq!(out.rows, s.nnz(), "sddmm: one output row per stored entry");
    assert_eq!((a.cols, b.cols), (a.cols, a.cols), "sddmm: operands of different widths");
    assert_eq!((a.rows, b.rows), (s.rows, s.cols), "sddmm: operand rows");
    let f = a.cols / k;
    rows_of_entries(s, out, |r, entries, out| {
        let ar = a.row(r);
        for (e, o) in entries.zip(out.chunks_mut(k)) {
            let br = b.row(s.col_idx[e] as usize);
            for (h, o) in o.iter_mut().enumerate() {
                *o = ar[h * f..(h + 1) * f].iter().zip(&br[h * f..(h + 1) * f]).map(|(&x, &y)| x * y).sum();
            }
        }
    });
}

/// Runs `f(row, entry range, that range's output rows)` for every row in parallel, over a
/// per-entry output matrix (`nnz × k`).
fn rows_of_entries<T: Scalar>(
    s: &SparseMatrix,
    out: &mut Mat<T>,
    f: impl Fn(usize, std::ops::Range<usize>, &mut [T]) + Sync,
) {
    let k = out.cols;
    let mut pieces = Vec::with_capacity(s.rows);
    let mut rest = out.data.as_mut_slice();
    for r in 0..s.rows {
        let range = s.row_range(r);
        let (p, tail) = rest.split_at_mut(range.len() * k);
        pieces.push((r, range, p));
        rest = tail;
    }
    pieces.into_par_iter().with_min_len(64).for_each(|(r, range, p)| f(r, range, p));
}

/// `out[v, h] = Σ_f z[v, h·F + f] · att[h, f]`.
pub fn head_dots<T: Scalar>(z: &Mat<T>, att: &Mat<T>, out: &mut Mat<T>) {
    let (k, f) = (att.rows, att.cols);
    assert_eq!((z.cols, out.cols, out.rows), (k * f, k, z.rows), "head_dots shapes");
    out.data.par_chunks_mut(k).zip(z.data.par_chunks(k * f)).for_each(|(o, zr)| {
        for (h, o) in o.iter_mut().enumerate() {
            *o = zr[h * f..(h + 1) * f].iter().zip(att.row(h)).map(|(&x, &a)| x * a).sum();
        }
    });
}

/// Backward of [`head_dots`]: accumulates `dz` and `datt`.
pub fn head_dots_backward<T: Scalar>(
    z: &Mat<T>,
    att: &Mat<T>,
    ds: &Mat<T>,
    dz: &mut Mat<T>,
    datt: &mut Mat<T>,
) {
    let (k, f) = (att.rows, att.cols);
    dz.data.par_chunks_mut(k * f).zip(ds.data.par_chunks(k)).for_each(|(dzr, dsr)| {
        for h in 0..k {
            for (d, &a) in dzr[h * f..(h + 1) * f].iter_mut().zip(att.row(h)) {
                *d += dsr[h] * a;
            }
        }
    });
    // partial sums over fixed blocks of rows, added in block order: the same bits every run
    // (a fold/reduce would add in an order that depends on work stealing)
    const ROWS: usize = 1024;
    let partial: Vec<Vec<T>> = z
        .data
        .par_chunks(ROWS * k * f)
        .zip(ds.data.par_chunks(ROWS * k))
        .map(|(zb, dsb)| {
            let mut acc = vec![T::zero(); k * f];
            for (zr, dsr) in zb.chunks(k * f).zip(dsb.chunks(k)) {
                for h in 0..k {
                    for j in 0..f {
                        acc[h * f + j] += dsr[h] * zr[h * f + j];
                    }
                }
            }
            acc
        })
        .collect();
    let mut acc = vec![T::zero(); k * f];
    for p in partial {
        acc.iter_mut().zip(&p).for_each(|(x, &y)| *x += y);
    }
    datt.data.iter_mut().zip(acc).for_each(|(d, a)| *d += a);
}

#[inline]
fn leaky<T: Scalar>(x: T, slope: T) -> T {
    if x > T::zero() {
        x
    } else {
        x * slope
    }
}

/// Head `h` of a row's `n` scores (`out[i·k + h]`, their largest `m`) made their softmax.
fn softmax_head<T: Scalar>(out: &mut [T], k: usize, h: usize, n: usize, m: T) {
    let mut sum = T::zero();
    for i in 0..n {
        let x = (out[i * k + h] - m).exp();
        out[i * k + h] = x;
        sum += x;
    }
    for i in 0..n {
        out[i * k + h] /= sum;
    }
}

/// Softmax over each row's entries of `LeakyReLU(src[c, h] + dst[r, h])`.
pub fn edge_softmax<T: Scalar>(s: &SparseMatrix, src: &Mat<T>, dst: &Mat<T>, slope: f64, alpha: &mut Mat<T>) {
    let k = alpha.cols;
    assert_eq!((alpha.rows, src.cols, dst.cols), (s.nnz(), k, k), "edge_softmax shapes");
    let slope = T::of(slope);
    rows_of_entries(s, alpha, |r, entries, out| {
        let dr = dst.row(r);
        for h in 0..k {
            let mut m = T::neg_infinity();
            for (i, e) in entries.clone().enumerate() {
                let x = leaky(src.data[s.col_idx[e] as usize * k + h] + dr[h], slope);
                out[i * k + h] = x;
                m = m.max(x);
            }
            softmax_head(out, k, h, entries.len(), m);
        }
    });
}

#[allow(clippy::too_many_arguments)]
pub fn edge_softmax_backward<T: Scalar>(
    s: &SparseMatrix,
    src: &Mat<T>,
    dst: &Mat<T>,
    slope: f64,
    alpha: &Mat<T>,
    dalpha: &Mat<T>,
    dpre: &mut Mat<T>,
) {
    let k = alpha.cols;
    let slope = T::of(slope);
    rows_of_entries(s, dpre, |r, entries, out| {
        let dr = dst.row(r);
        let base = entries.start;
        for h in 0..k {
            let dot: T = entries.clone().map(|e| alpha.data[e * k + h] * dalpha.data[e * k + h]).sum();
            for e in entries.clone() {
                let pre = src.data[s.col_idx[e] as usize * k + h] + dr[h];
                let g = alpha.data[e * k + h] * (dalpha.data[e * k + h] - dot);
                out[(e - base) * k + h] = if pre > T::zero() { g } else { g * slope };
            }
        }
    });
}

/// GATv2's attention: for entry `e = (r, c)` and head `h` the score `Σ_f att[h, f] ·
/// LeakyReLU(xl[c, h·F + f] + xr[r, h·F + f])`, softmax over each row's entries.
pub fn pair_softmax<T: Scalar>(
    s: &SparseMatrix,
    xl: &Mat<T>,
    xr: &Mat<T>,
    att: &Mat<T>,
    slope: f64,
    alpha: &mut Mat<T>,
) {
    let (k, f) = (att.rows, att.cols);
    assert_eq!((alpha.rows, alpha.cols), (s.nnz(), k), "pair_softmax: one row per entry, a column per head");
    assert_eq!((xl.rows, xr.rows, xl.cols, xr.cols), (s.cols, s.rows, k * f, k * f), "pair_softmax shapes");
    let slope = T::of(slope);
    rows_of_entries(s, alpha, |r, entries, out| {
        let xrr = xr.row(r);
        for h in 0..k {
            let (a, xr_h) = (att.row(h), &xrr[h * f..(h + 1) * f]);
            let mut m = T::neg_infinity();
            for (i, e) in entries.clone().enumerate() {
                let xl_h = &xl.row(s.col_idx[e] as usize)[h * f..(h + 1) * f];
                let x: T = xl_h.iter().zip(xr_h).zip(a).map(|((&l, &r), &w)| leaky(l + r, slope) * w).sum();
                out[i * k + h] = x;
                m = m.max(x);
            }
            softmax_head(out, k, h, entries.len(), m);
        }
    });
}

/// Backward of [`pair_softmax`] for `dalpha`: the score's gradient `dσ[e, h] = α (dα − Σ_row
/// α dα)`, then accumulates `dxr[r] += dσ · att ⊙ leaky'(pre)` over each row's entries,
/// `dxl[c]` the same over each column's (the transposed structure: no two threads add to one
/// row) and `datt[h, f] += Σ_e dσ[e, h] · leaky(pre[e, h·F + f])`, summed in fixed blocks of
/// rows in block order (the same bits every run).
#[allow(clippy::too_many_arguments)]
pub fn pair_softmax_backward<T: Scalar>(
    s: &SparseMatrix,
    xl: &Mat<T>,
    xr: &Mat<T>,
    att: &Mat<T>,
    slope: f64,
    alpha: &Mat<T>,
    dalpha: &Mat<T>,
    dxl: &mut Mat<T>,
    dxr: &mut Mat<T>,
    datt: &mut Mat<T>,
) {
    let (k, f) = (att.rows, att.cols);
    let w = k * f;
    assert_eq!(
        (dxl.rows, dxr.rows, dxl.cols, dxr.cols),
        (s.cols, s.rows, w, w),
        "pair_softmax_backward shapes"
    );
    assert!(s.has_entry_order(), "pair_softmax_backward reads the transposed structure's entry order");
    let slope_t = T::of(slope);
    let mut ds = Mat::zeros(s.nnz(), k);
    rows_of_entries(s, &mut ds, |_, entries, out| {
        let base = entries.start;
        for h in 0..k {
            let dot: T = entries.clone().map(|e| alpha.data[e * k + h] * dalpha.data[e * k + h]).sum();
            for e in entries.clone() {
                out[(e - base) * k + h] = alpha.data[e * k + h] * (dalpha.data[e * k + h] - dot);
            }
        }
    });
    // the pre-activation of entry e (row r, column c), head h, feature j, and its gradient
    let pre =
        |r: usize, c: usize, h: usize, j: usize| xl.data[c * w + h * f + j] + xr.data[r * w + h * f + j];
    let grad = |e: usize, pre: T, h: usize, j: usize| {
        let g = ds.data[e * k + h] * att.data[h * f + j];
        if pre > T::zero() {
            g
        } else {
            g * slope_t
        }
    };
    const ROWS: usize = 256;
    let partial: Vec<Vec<T>> = dxr
        .data
        .par_chunks_mut(ROWS * w)
        .enumerate()
        .map(|(b, block)| {
            let mut acc = vec![T::zero(); w];
            for (i, dr) in block.chunks_mut(w).enumerate() {
                let r = b * ROWS + i;
                for e in s.row_range(r) {
                    let c = s.col_idx[e] as usize;
                    for h in 0..k {
                        for j in 0..f {
                            let pre = pre(r, c, h, j);
                            dr[h * f + j] += grad(e, pre, h, j);
                            acc[h * f + j] += ds.data[e * k + h] * leaky(pre, slope_t);
                        }
                    }
                }
            }
            acc
        })
        .collect();
    for p in partial {
        datt.data.iter_mut().zip(&p).for_each(|(d, &a)| *d += a);
    }
    dxl.data.par_chunks_mut(w).enumerate().for_each(|(c, dc)| {
        for t in s.t_row_ptr[c] as usize..s.t_row_ptr[c + 1] as usize {
            let (e, r) = (s.t_perm[t] as usize, s.t_col_idx[t] as usize);
            for h in 0..k {
                for j in 0..f {
                    dc[h * f + j] += grad(e, pre(r, c, h, j), h, j);
                }
            }
        }
    });
}

pub fn edge_dropout<T: Scalar>(s: &SparseMatrix, key: MaskKey, p: f64, vals: &mut Mat<T>) {
    assert!((0.0..1.0).contains(&p), "dropout probability {p} outside [0, 1)");
    if p == 0.0 {
        return;
    }
    let k = vals.cols as u64;
    let scale = T::of(1.0 / (1.0 - p));
    rows_of_entries(s, vals, |r, entries, out| {
        let r = s.row_ids.as_ref().map_or(r as u64, |ids| ids[r] as u64);
        for (e, o) in entries.zip(out.chunks_mut(k as usize)) {
            let c = s.col_idx[e];
            let c = s.col_ids.as_ref().map_or(c as u64, |ids| ids[c as usize] as u64);
            for (h, v) in o.iter_mut().enumerate() {
                *v = if keep(key, r, c * k + h as u64, p) { *v * scale } else { T::zero() };
            }
        }
    });
}
