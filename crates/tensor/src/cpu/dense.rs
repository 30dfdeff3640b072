//! Dense kernels on the CPU: gemm (the `gemm` crate), element-wise maps, bias, LayerNorm,
//! dropout, softmax cross-entropy. Row-parallel with rayon.

use rayon::prelude::*;

use crate::backend::{Binary, MaskKey, Rows, StepRule, Unary};
use crate::dropout::{keep4, threshold};
use crate::mat::Mat;
use crate::scalar::Scalar;

/// Inner dimension from which a small-output gemm is split along it (see [`gemm`]).
const SPLIT_K_MIN: usize = 1 << 13;
/// At most this many partial products of a split gemm (memory: `parts × m × n` elements).
const SPLIT_K_PARTS_MAX: usize = 32;

/// `c = alpha · op(a) · op(b) + beta · c`.
///
/// The result's bits are a function of the operands alone: the same on any thread count.
pub fn gemm<T: Scalar>(alpha: f64, a: &Mat<T>, ta: bool, b: &Mat<T>, tb: bool, beta: f64, c: &mut Mat<T>) {
    // op(a) is m×k, op(b) is k×n; row-major strides: element (i, j) of a at i·cols + j
    let (m, k) = if ta { (a.cols, a.rows) } else { (a.rows, a.cols) };
    let (k2, n) = if tb { (b.cols, b.rows) } else { (b.rows, b.cols) };
    assert_eq!(k, k2, "gemm: inner dimensions {k} and {k2} differ");
    assert_eq!((c.rows, c.cols), (m, n), "gemm: output is {}×{}, expected {m}×{n}", c.rows, c.cols);
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        let beta = T::of(beta);
        c.data.iter_mut().for_each(|x| *x *= beta);
        return;
    }
    // strides of op(a): (row stride, col stride)
    let (a_rs, a_cs) = if ta { (1, a.cols as isize) } else { (a.cols as isize, 1) };
    let (b_rs, b_cs) = if tb { (1, b.cols as isize) } else { (b.cols as isize, 1) };
    let threads = rayon::current_num_threads();
    // A small output with a long inner dimension (weight gradients: out × in over all nodes)
    // leaves the gemm crate little to split; split the inner dimension instead, one partial
    // product per task, summed in a fixed order. The split follows the shape alone, never the
    // thread count, so every thread count gives the same bits.
    if k >= SPLIT_K_MIN && m * n <= 1 << 18 {
        let parts = (k / SPLIT_K_MIN).clamp(2, SPLIT_K_PARTS_MAX);
        let bounds: Vec<usize> = (0..=parts).map(|p| k * p / parts).collect();
        let partials: Vec<Vec<T>> = bounds
            .windows(2)
            .collect::<Vec<_>>()
            .into_par_iter()
            .map(|w| {
                let mut part = vec![T::zero(); m * n];
                // SAFETY: rows/columns k0..k1 of op(a) and op(b) lie inside a and b (k1 <= k);
                // `part` is m×n, row-major, owned by this task.
                unsafe {
                    raw_gemm(
                        (m, n, w[1] - w[0]),
                        part.as_mut_ptr(),
                        false,
                        (a.data.as_ptr().offset(w[0] as isize * a_cs), a_rs, a_cs),
                        (b.data.as_ptr().offset(w[0] as isize * b_rs), b_rs, b_cs),
                        T::zero(),
                        T::one(),
                        gemm::Parallelism::None,
                    )
                };
                part
            })
            .collect();
        let (alpha, beta) = (T::of(alpha), T::of(beta));
        c.data.par_iter_mut().enumerate().for_each(|(i, c)| {
            let sum = partials.iter().fold(T::zero(), |s, p| s + p[i]);
            *c = if beta == T::zero() { alpha * sum } else { alpha * sum + beta * *c };
        });
        return;
    }
    let par = if m * n * k > 1 << 15 && threads > 1 {
        gemm::Parallelism::Rayon(threads)
    } else {
        gemm::Parallelism::None
    };
    // SAFETY: the pointers cover a (m×k), b (k×n) and c (m×n) under the given strides, as the
    // shape assertions above guarantee; c does not alias a or b (distinct borrows).
    unsafe {
        raw_gemm(
            (m, n, k),
            c.data.as_mut_ptr(),
            beta != 0.0,
            (a.data.as_ptr(), a_rs, a_cs),
            (b.data.as_ptr(), b_rs, b_cs),
            T::of(beta),
            T::of(alpha),
            par,
        )
    }
}

/// `dst (m×n, row-major) = dst_scale · dst + prod_scale · op(a) · op(b)`, operands given as
/// (pointer, row stride, column stride).
///
/// # Safety
/// The pointers and strides must describe valid m×k, k×n and m×n arrays; `dst` must not alias
/// the operands.
#[allow(clippy::too_many_arguments)]
unsafe fn raw_gemm<T: Scalar>(
    (m, n, k): (usize, usize, usize),
    dst: *mut T,
    read_dst: bool,
    (a, a_rs, a_cs): (*const T, isize, isize),
    (b, b_rs, b_cs): (*const T, isize, isize),
    dst_scale: T,
    prod_scale: T,
    par: gemm::Parallelism,
) {
    // SAFETY: forwarded from the caller's contract.
    unsafe {
        gemm::gemm(
            m, n, k, dst, 1, n as isize, read_dst, a, a_cs, a_rs, b, b_cs, b_rs, dst_scale, prod_scale,
            false, false, false, par,
        )
    }
}

pub fn unary<T: Scalar>(op: Unary, x: &mut Mat<T>) {
    match op {
        Unary::Relu => x.data.par_iter_mut().for_each(|v| *v = v.max(T::zero())),
        Unary::Scale(s) => {
            let s = T::of(s);
            x.data.par_iter_mut().for_each(|v| *v *= s)
        }
    }
}

pub fn binary<T: Scalar>(op: Binary, a: &Mat<T>, b: &mut Mat<T>) {
    assert_eq!((a.rows, a.cols), (b.rows, b.cols), "element-wise op on different shapes");
    match op {
        Binary::Add => b.data.par_iter_mut().zip(&a.data).for_each(|(b, &a)| *b += a),
        Binary::ReluGrad => b.data.par_iter_mut().zip(&a.data).for_each(|(b, &a)| {
            if a <= T::zero() {
                *b = T::zero()
            }
        }),
        Binary::Mul => b.data.par_iter_mut().zip(&a.data).for_each(|(b, &a)| *b *= a),
    }
}

pub fn add_row<T: Scalar>(row: &Mat<T>, x: &mut Mat<T>) {
    assert_eq!((row.rows, row.cols), (1, x.cols), "bias shape");
    x.data
        .par_chunks_mut(x.cols.max(1))
        .for_each(|r| r.iter_mut().zip(&row.data).for_each(|(v, &b)| *v += b));
}

pub fn col_sums<T: Scalar>(x: &Mat<T>, beta: f64, out: &mut Mat<T>) {
    assert_eq!((out.rows, out.cols), (1, x.cols), "column-sum shape");
    let d = x.cols;
    // partial sums over fixed blocks of rows, added in block order: the same bits every run
    // and on any thread count (a fold/reduce adds in an order that follows work stealing)
    let partials: Vec<Vec<T>> = x
        .data
        .par_chunks(d.max(1) * 256)
        .map(|rows| {
            let mut acc = vec![T::zero(); d];
            for r in rows.chunks(d) {
                acc.iter_mut().zip(r).for_each(|(a, &v)| *a += v);
            }
            acc
        })
        .collect();
    let mut sums = vec![T::zero(); d];
    for p in partials {
        sums.iter_mut().zip(&p).for_each(|(s, &v)| *s += v);
    }
    let beta = T::of(beta);
    out.data.iter_mut().zip(sums).for_each(|(o, s)| *o = s + beta * *o);
}

pub fn dropout<T: Scalar>(key: MaskKey, p: f64, ids: Option<&[u32]>, x: &mut Mat<T>) {
    assert!((0.0..1.0).contains(&p), "dropout probability {p} outside [0, 1)");
    if p == 0.0 {
        return;
    }
    if let Some(ids) = ids {
        assert_eq!(ids.len(), x.rows, "one node id per row");
    }
    let scale = T::of(1.0 / (1.0 - p));
    let d = x.cols;
    let t = threshold(p);
    x.data.par_chunks_mut(d.max(1)).enumerate().for_each(|(r, row)| {
        for (q, quad) in row.chunks_mut(4).enumerate() {
            let node = ids.map_or(r as u64, |ids| ids[r] as u64);
            let k = keep4(key, node, q as u64, t);
            for (v, keep) in quad.iter_mut().zip(k) {
                *v = if keep { *v * scale } else { T::zero() };
            }
        }
    });
}

pub fn layer_norm<T: Scalar>(
    x: &Mat<T>,
    gamma: &Mat<T>,
    beta: &Mat<T>,
    eps: f64,
    y: &mut Mat<T>,
    stats: &mut Mat<T>,
) {
    let d = x.cols;
    assert_eq!((stats.rows, stats.cols), (x.rows, 2), "LayerNorm stats are rows × 2");
    y.data.par_chunks_mut(d).zip(stats.data.par_chunks_mut(2)).zip(x.data.par_chunks(d)).for_each(
        |((y, st), x)| {
            let n = T::of(d as f64);
            let mean = x.iter().copied().sum::<T>() / n;
            let var = x.iter().map(|&v| (v - mean) * (v - mean)).sum::<T>() / n;
            let rstd = T::one() / (var + T::of(eps)).sqrt();
            st[0] = mean;
            st[1] = rstd;
            for j in 0..d {
                y[j] = (x[j] - mean) * rstd * gamma.data[j] + beta.data[j];
            }
        },
    );
}

#[allow(clippy::too_many_arguments)]
pub fn layer_norm_backward<T: Scalar>(
    x: &Mat<T>,
    gamma: &Mat<T>,
    stats: &Mat<T>,
    dy: &Mat<T>,
    dx: &mut Mat<T>,
    dgamma: &mut Mat<T>,
    dbeta: &mut Mat<T>,
) {
    let d = x.cols;
    let n = T::of(d as f64);
    // dx = rstd · (g - mean(g) - x̂ · mean(g · x̂)), g = dy · gamma
    dx.data.par_chunks_mut(d).enumerate().for_each(|(r, dx)| {
        let (mean, rstd) = (stats.data[2 * r], stats.data[2 * r + 1]);
        let xr = x.row(r);
        let dyr = dy.row(r);
        let mut sg = T::zero();
        let mut sgx = T::zero();
        for j in 0..d {
            let g = dyr[j] * gamma.data[j];
            sg += g;
            sgx += g * (xr[j] - mean) * rstd;
        }
        for j in 0..d {
            let xhat = (xr[j] - mean) * rstd;
            dx[j] = rstd * (dyr[j] * gamma.data[j] - sg / n - xhat * sgx / n);
        }
    });
    for r in 0..x.rows {
        let (mean, rstd) = (stats.data[2 * r], stats.data[2 * r + 1]);
        for j in 0..d {
            let g = dy.data[r * d + j];
            dgamma.data[j] += g * (x.data[r * d + j] - mean) * rstd;
            dbeta.data[j] += g;
        }
    }
}

pub fn cross_entropy<T: Scalar>(
    logits: &Mat<T>,
    labels: &[i32],
    rows: &[u32],
    scale: f64,
    grad: &mut Mat<T>,
) -> (f64, usize) {
    let c = logits.cols;
    let scale = T::of(scale);
    let per_row: Vec<(f64, bool, Vec<T>)> = rows
        .par_iter()
        .map(|&r| {
            let z = logits.row(r as usize);
            let y = labels[r as usize];
            assert!(y >= 0 && (y as usize) < c, "row {r} has label {y}, outside 0..{c}");
            let m = z.iter().copied().fold(T::neg_infinity(), T::max);
            let sum: T = z.iter().map(|&v| (v - m).exp()).sum();
            let lse = m + sum.ln();
            let loss = (lse - z[y as usize]).f64();
            let argmax = (0..c).fold(0, |best, j| if z[j] > z[best] { j } else { best });
            let g = (0..c)
                .map(|j| {
                    let p = (z[j] - lse).exp();
                    scale * if j == y as usize { p - T::one() } else { p }
                })
                .collect();
            (loss, argmax == y as usize, g)
        })
        .collect();
    let mut total = 0.0;
    let mut correct = 0;
    for (&r, (loss, ok, g)) in rows.iter().zip(per_row) {
        total += loss;
        correct += ok as usize;
        grad.row_mut(r as usize).copy_from_slice(&g);
    }
    (total, correct)
}

pub fn count_correct<T: Scalar>(logits: &Mat<T>, labels: &[i32], rows: &[u32]) -> usize {
    rows.par_iter()
        .filter(|&&r| {
            let z = logits.row(r as usize);
            let argmax = (0..z.len()).fold(0, |best, j| if z[j] > z[best] { j } else { best });
            argmax as i32 == labels[r as usize]
        })
        .count()
}

pub fn step<T: Scalar>(rule: StepRule, p: &mut Mat<T>, g: &Mat<T>, s1: &mut Mat<T>, s2: &mut Mat<T>) {
    assert_eq!(p.data.len(), g.data.len(), "parameter and gradient shapes differ");
    match rule {
        StepRule::Adam { lr, beta1, beta2, eps, weight_decay, decoupled, t } => {
            let bc1 = 1.0 - beta1.powi(t as i32);
            let bc2 = 1.0 - beta2.powi(t as i32);
            let step_size = lr / bc1;
            p.data
                .par_iter_mut()
                .zip(&g.data)
                .zip(s1.data.par_iter_mut().zip(s2.data.par_iter_mut()))
                .for_each(|((p, &g), (m, v))| {
                    let mut pv = p.f64();
                    let mut gv = g.f64();
                    if decoupled {
                        pv *= 1.0 - lr * weight_decay;
                    } else {
                        gv += weight_decay * pv;
                    }
                    let mv = beta1 * m.f64() + (1.0 - beta1) * gv;
                    let vv = beta2 * v.f64() + (1.0 - beta2) * gv * gv;
                    *m = T::of(mv);
                    *v = T::of(vv);
                    pv -= step_size * mv / ((vv / bc2).sqrt() + eps);
                    *p = T::of(pv);
                });
        }
        StepRule::Sgd { lr, momentum, weight_decay, first } => {
            p.data.par_iter_mut().zip(&g.data).zip(s1.data.par_iter_mut()).for_each(|((p, &g), buf)| {
                let gv = g.f64() + weight_decay * p.f64();
                let b = if first || momentum == 0.0 { gv } else { momentum * buf.f64() + gv };
                *buf = T::of(b);
                *p = T::of(p.f64() - lr * b);
            });
        }
    }
}

pub fn gather_rows<T: Scalar>(x: &Mat<T>, rows: Rows<'_>, out: &mut Mat<T>, at: usize) {
    let (d, n) = (x.cols, rows.len());
    assert!(out.cols == d && at + n <= out.rows && rows.end() <= x.rows, "gather: shapes");
    let dst = &mut out.data[at * d..(at + n) * d];
    match rows {
        Rows::Range(s, n) => dst.copy_from_slice(&x.data[s * d..(s + n) * d]),
        Rows::Index(idx) => dst
            .par_chunks_mut(d.max(1))
            .zip(idx.par_iter())
            .for_each(|(o, &i)| o.copy_from_slice(x.row(i as usize))),
    }
}

/// Indexed rows are grouped by destination first (a counting sort of the indices), so each
/// destination row is summed by one task, in input order: deterministic and free of atomics.
pub fn scatter_add_rows<T: Scalar>(src: &Mat<T>, from: usize, rows: Rows<'_>, out: &mut Mat<T>) {
    let (d, n) = (out.cols, rows.len());
    assert!(src.cols == d && from + n <= src.rows, "scatter-add: input shape");
    assert!(rows.end() <= out.rows, "scatter-add: row {} out of range", rows.end() - 1);
    let src_rows = &src.data[from * d..(from + n) * d];
    let idx = match rows {
        Rows::Range(s, n) => {
            let dst = &mut out.data[s * d..(s + n) * d];
            dst.par_iter_mut().zip(src_rows.par_iter()).for_each(|(o, &v)| *o += v);
            return;
        }
        Rows::Index(idx) => idx,
    };
    let row = |k: usize| &src_rows[k * d..(k + 1) * d];
    let (ptr, order) = crate::sparse::group_by_row(idx, out.rows);
    out.data.par_chunks_mut(d.max(1)).enumerate().for_each(|(r, o)| {
        for &k in &order[ptr[r]..ptr[r + 1]] {
            o.iter_mut().zip(row(k as usize)).for_each(|(o, &v)| *o += v);
        }
    });
}
