//! Every Backend operation, one test each, the same body stamped for the CPU and the CUDA
//! backend (`test_device!`, as candle stamps its device tests): `gemm::cpu`, `gemm::cuda`, …
//! Each body runs the operation on the backend under test in f32 and on the CPU backend in f64
//! (the reference: the CPU kernels are checked against PyG's definitions in `grinnder-nn`'s
//! fixture tests) and compares, so a failure names its operation and device. The CUDA tests
//! print that they were skipped and pass on a machine without a GPU (CI); the CPU ones always
//! run. What only the CUDA backend has (its SpMM kernels one by one, labels read from mapped
//! memory, losses read after their stream was held) is tested in `cuda.rs`.

mod common;

use common::{gpu, random, random_sparse};
use grinnder_tensor::ops::*;
use grinnder_tensor::{Backend, Binary, Cpu, MaskKey, Mat, Rows, SparseMatrix, StepRule, Unary};

/// Stamps each named body (a `fn(&B)` generic over the backend) into a module of that name
/// with one test per device.
macro_rules! test_device {
    ($($op:ident),* $(,)?) => {$(
        mod $op {
            #[test]
            fn cpu() {
                super::$op(&grinnder_tensor::Cpu::<f32>::new());
            }
            #[test]
            fn cuda() {
                if let Some(g) = super::gpu() {
                    super::$op(&g);
                }
            }
        }
    )*};
}

test_device!(
    transfers,
    downloads_ahead,
    host_blocks,
    host_block_writes,
    gemm,
    gemm_split_k,
    spmm,
    spmm_factored,
    sddmm,
    head_dots,
    head_dots_backward,
    edge_softmax,
    edge_softmax_backward,
    edge_dropout,
    dropout,
    gather_rows,
    scatter_add_rows,
    unary,
    binary,
    add_row,
    col_sums,
    layer_norm,
    layer_norm_backward,
    cross_entropy,
    count_correct,
    step,
);

/// The f64 reference.
const R: Cpu<f64> = Cpu::<f64>::new();

/// f32 against the f64 reference: `max |a − b| / max |b|` at most this, for operations whose
/// every output sums a few hundred terms or fewer (f32 rounding is 6e-8 per operation).
const TOL: f64 = 1e-5;

fn wide(m: &Mat<f32>) -> Mat<f64> {
    m.cast()
}

/// `max |a − b| / max |b|` (the largest deviation relative to the tensor's scale); a NaN
/// anywhere is an infinite error.
fn rel(a: &Mat<f32>, b: &Mat<f64>) -> f64 {
    assert_eq!((a.rows, a.cols), (b.rows, b.cols), "shapes differ");
    let scale = b.data.iter().fold(0f64, |m, &x| m.max(x.abs())).max(1e-30);
    let diff = |x: f32, y: f64| if x.is_nan() || y.is_nan() { f64::INFINITY } else { (x as f64 - y).abs() };
    a.data.iter().zip(&b.data).fold(0f64, |m, (&x, &y)| m.max(diff(x, y))) / scale
}

fn check_within<B: Backend<T = f32>>(b: &B, what: &str, got: &B::Mat, want: &Mat<f64>, tol: f64) {
    let e = rel(&b.download(got), want);
    assert!(e <= tol, "{what}: relative error {e:.3e} (at most {tol:.0e})");
}

fn check<B: Backend<T = f32>>(b: &B, what: &str, got: &B::Mat, want: &Mat<f64>) {
    check_within(b, what, got, want, TOL)
}

/// Uploads, downloads, copies and zeros give back exactly what went in.
fn transfers<B: Backend<T = f32>>(b: &B) {
    let x = random(70, 33, 1);
    assert_eq!(b.download(&b.upload(&x)), x, "upload then download");
    assert_eq!(b.download_owned(b.upload_owned(x.clone())), x, "owned upload then download");
    let filled = b.upload_with(70, 33, &mut |d| d.copy_from_slice(&x.data));
    let mut read = Vec::new();
    b.download_with(&filled, &mut |d| read.extend_from_slice(d));
    assert_eq!(read, x.data, "upload_with then download_with");
    let mut y = b.zeros(70, 33);
    assert_eq!(b.download(&y), Mat::zeros(70, 33), "zeros");
    b.copy(&filled, &mut y);
    assert_eq!(b.download(&y), x, "copy");
    assert_eq!(b.dims(&y), (70, 33), "dims");
    assert_eq!(b.download(&b.upload_ahead(&x)), x, "upload made ahead");
    b.synchronize();
}

/// Downloads started ahead: each sees the work queued before it, and several can be in
/// flight at once, read in any order.
fn downloads_ahead<B: Backend<T = f32>>(b: &B) {
    let x = random(500, 19, 4);
    let mut twice = x.clone();
    twice.data.iter_mut().for_each(|v| *v *= 2.0);
    let mut m = b.upload(&x);
    b.unary(Unary::Scale(2.0), &mut m);
    let first = b.download_ahead(m);
    let second = b.download_ahead(b.upload(&x));
    let mut read = Vec::new();
    b.downloaded(second, &mut |d| read.extend_from_slice(d));
    assert_eq!(read, x.data, "the second download");
    read.clear();
    b.downloaded(first, &mut |d| read.extend_from_slice(d));
    assert_eq!(read, twice.data, "the first download, after the work queued before it");
    // an empty matrix, and one never read
    b.downloaded(b.download_ahead(b.zeros(0, 5)), &mut |d| assert!(d.is_empty()));
    drop(b.download_ahead(b.upload(&x)));
}

/// A host block: written in place, its first rows uploaded, rows gathered from it.
fn host_blocks<B: Backend<T = f32>>(b: &B) {
    let x = random(300, 37, 2);
    let Ok(mut h) = b.host_block(x.clone()) else { panic!("a host block of 44 KB") };
    assert_eq!(b.host_block_dims(&h), (300, 37));
    b.host_block_mut(&mut h)[..37].fill(0.5);
    let mut want = x.clone();
    want.data[..37].fill(0.5);
    let first = b.arrived(b.upload_host_rows(&h, 120));
    assert_eq!(b.download(&first).data, want.data[..120 * 37], "upload_host_rows");
    assert_eq!(b.download(&b.arrived(b.upload_host_block(&h))), want, "upload_host_block");
    let idx: Vec<u32> = vec![5, 0, 299, 5, 17];
    let mut out = b.zeros(9, 37);
    b.gather_host_block(&h, Rows::Index(&idx), &mut out, 1);
    b.gather_host_block(&h, Rows::Range(290, 3), &mut out, 6);
    let got = b.download(&out);
    for (i, &r) in idx.iter().enumerate() {
        assert_eq!(got.row(1 + i), want.row(r as usize), "gather_host_block, indexed row {i}");
    }
    for i in 0..3 {
        assert_eq!(got.row(6 + i), want.row(290 + i), "gather_host_block, ranged row {i}");
    }
}

/// A host block written by the backend: rows of a matrix downloaded into it, rows added into
/// it (ranged and indexed, widths with and without 16-byte rows), zeroed; each write seen by
/// the next upload (on a GPU: a copy on another stream, which must wait for it) and by the host.
fn host_block_writes<B: Backend<T = f32>>(b: &B) {
    for d in [37, 40] {
        let x = random(50, d, 7);
        let m = b.upload(&x);
        let Some(mut h) = b.new_host_block(20, d) else { panic!("a host block") };
        b.download_into_host_block(&m, 30, &mut h);
        let mut want = Mat::from_vec(20, d, x.data[30 * d..].to_vec());
        let seen = b.download(&b.arrived(b.upload_host_block(&h)));
        assert_eq!(seen, want, "download_into_host_block, width {d}");
        // rows 0..5 of m added to rows 10..15, then rows 5..9 of m to rows 19, 0, 7, 3
        b.scatter_add_host_block(&m, 0, Rows::Range(10, 5), &mut h);
        let idx = [19u32, 0, 7, 3];
        b.scatter_add_host_block(&m, 5, Rows::Index(&idx), &mut h);
        for i in 0..5 {
            for j in 0..d {
                want.data[(10 + i) * d + j] += x.data[i * d + j];
            }
        }
        for (k, &r) in idx.iter().enumerate() {
            for j in 0..d {
                want.data[r as usize * d + j] += x.data[(5 + k) * d + j];
            }
        }
        let seen = b.download(&b.arrived(b.upload_host_block(&h)));
        assert_eq!(seen, want, "scatter_add_host_block, width {d}");
        assert_eq!(b.host_block_mut(&mut h), &want.data[..], "the host reads the adds, width {d}");
        b.zero_host_block(&mut h);
        let seen = b.download(&b.arrived(b.upload_host_rows(&h, 20)));
        assert!(seen.data.iter().all(|&v| v == 0.0), "zero_host_block, width {d}");
        b.scatter_add_host_block(&m, 49, Rows::Index(&[4]), &mut h);
        let host = b.host_block_mut(&mut h);
        assert_eq!(&host[4 * d..5 * d], &x.data[49 * d..], "an add after zeros, width {d}");
        assert!(host[..4 * d].iter().chain(&host[5 * d..]).all(|&v| v == 0.0));
    }
}

/// In all four transpose combinations, accumulating.
fn gemm<B: Backend<T = f32>>(b: &B) {
    for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
        let a = if ta { random(53, 37, 3) } else { random(37, 53, 1) };
        let m = if tb { random(29, 53, 4) } else { random(53, 29, 2) };
        let c0 = random(37, 29, 5);
        let (mut want, mut got) = (wide(&c0), b.upload(&c0));
        R.gemm(0.7, &wide(&a), ta, &wide(&m), tb, 1.0, &mut want);
        b.gemm(0.7, &b.upload(&a), ta, &b.upload(&m), tb, 1.0, &mut got);
        check(b, &format!("gemm ta={ta} tb={tb}"), &got, &want);
    }
}

/// Long inner dimensions (a weight gradient over all rows) take the split-K path on the GPU,
/// with a remainder chunk. Each output sums 100,003 products: f32's error grows with the
/// number of terms, hence 1e-4.
fn gemm_split_k<B: Backend<T = f32>>(b: &B) {
    for (ta, tb) in [(true, false), (false, true)] {
        let k = 100_003;
        let a = if ta { random(k, 37, 40) } else { random(37, k, 41) };
        let m = if tb { random(29, k, 42) } else { random(k, 29, 43) };
        let c0 = random(37, 29, 44);
        let (mut want, mut got) = (wide(&c0), b.upload(&c0));
        R.gemm(1.0, &wide(&a), ta, &wide(&m), tb, 1.0, &mut want);
        b.gemm(1.0, &b.upload(&a), ta, &b.upload(&m), tb, 1.0, &mut got);
        check_within(b, &format!("split-K gemm ta={ta} tb={tb}"), &got, &want, 1e-4);
    }
}

/// Forward and transposed, one and several value columns, at widths that take each of the
/// GPU's kernels (half-warp ≤ 64, 16-byte vectors, general).
fn spmm<B: Backend<T = f32>>(b: &B) {
    let s = random_sparse(300, 200, 9, 6);
    let (rs, bs) = (R.sparse(&s), b.sparse(&s));
    for (k, d) in [(1, 20), (1, 47), (1, 64), (4, 64), (1, 70), (1, 96), (4, 96), (4, 100), (1, 300)] {
        let vals = random(s.nnz(), k, 7);
        for transpose in [false, true] {
            let (rows, inner) = if transpose { (200, 300) } else { (300, 200) };
            let (x, o0) = (random(inner, d, 8), random(rows, d, 9));
            let (mut want, mut got) = (wide(&o0), b.upload(&o0));
            R.spmm(&rs, &wide(&vals), transpose, &wide(&x), 0.5, &mut want);
            b.spmm(&bs, &b.upload(&vals), transpose, &b.upload(&x), 0.5, &mut got);
            check(b, &format!("spmm k={k} d={d} transpose={transpose}"), &got, &want);
        }
    }
}

/// Factored values (one per row, one per column; either absent), forward and transposed, on
/// a structure kept without its entry order, at widths that take each of the GPU's kernels.
fn spmm_factored<B: Backend<T = f32>>(b: &B) {
    let s = random_sparse(300, 200, 9, 6).without_entry_order();
    let (rs, bs) = (R.sparse(&s), b.sparse(&s));
    let (rf, cf) = (random(300, 1, 10), random(200, 1, 11));
    let (brf, bcf, wrf, wcf) = (b.upload(&rf), b.upload(&cf), wide(&rf), wide(&cf));
    for (rows_f, cols_f) in [(true, true), (true, false), (false, true)] {
        for d in [20, 64, 96, 300] {
            for transpose in [false, true] {
                let (n, inner) = if transpose { (200, 300) } else { (300, 200) };
                let (x, o0) = (random(inner, d, 8), random(n, d, 9));
                let (mut want, mut got) = (wide(&o0), b.upload(&o0));
                let (wr, wc) = (rows_f.then_some(&wrf), cols_f.then_some(&wcf));
                R.spmm_factored(&rs, wr, wc, transpose, &wide(&x), 0.5, &mut want);
                let (br, bc) = (rows_f.then_some(&brf), cols_f.then_some(&bcf));
                b.spmm_factored(&bs, br, bc, transpose, &b.upload(&x), 0.5, &mut got);
                let what = format!("spmm_factored rows {rows_f} cols {cols_f} d={d} transpose={transpose}");
                check(b, &what, &got, &want);
            }
        }
    }
}

/// Attention's shapes: 4 heads of 16.
const HEADS: usize = 4;
const F: usize = 16;

fn sddmm<B: Backend<T = f32>>(b: &B) {
    let s = random_sparse(300, 200, 9, 6);
    let (za, zb) = (random(300, HEADS * F, 10), random(200, HEADS * F, 11));
    let (mut want, mut got) = (Mat::zeros(s.nnz(), HEADS), b.zeros(s.nnz(), HEADS));
    R.sddmm(&R.sparse(&s), &wide(&za), &wide(&zb), &mut want);
    b.sddmm(&b.sparse(&s), &b.upload(&za), &b.upload(&zb), &mut got);
    check(b, "sddmm", &got, &want);
}

fn head_dots<B: Backend<T = f32>>(b: &B) {
    let (z, att) = (random(200, HEADS * F, 11), random(HEADS, F, 12));
    let (mut want, mut got) = (Mat::zeros(200, HEADS), b.zeros(200, HEADS));
    R.head_dots(&wide(&z), &wide(&att), &mut want);
    b.head_dots(&b.upload(&z), &b.upload(&att), &mut got);
    check(b, "head_dots", &got, &want);
}

fn head_dots_backward<B: Backend<T = f32>>(b: &B) {
    let (z, att, ds) = (random(200, HEADS * F, 11), random(HEADS, F, 12), random(200, HEADS, 13));
    let (dz0, datt0) = (random(200, HEADS * F, 14), random(HEADS, F, 15));
    let (mut dz_w, mut datt_w) = (wide(&dz0), wide(&datt0));
    let (mut dz_g, mut datt_g) = (b.upload(&dz0), b.upload(&datt0));
    R.head_dots_backward(&wide(&z), &wide(&att), &wide(&ds), &mut dz_w, &mut datt_w);
    b.head_dots_backward(&b.upload(&z), &b.upload(&att), &b.upload(&ds), &mut dz_g, &mut datt_g);
    check(b, "head_dots_backward dz", &dz_g, &dz_w);
    check(b, "head_dots_backward datt", &datt_g, &datt_w);
}

/// Scores from a source and a destination term; the softmax over each row's entries.
fn softmax_inputs() -> (SparseMatrix, Mat<f32>, Mat<f32>) {
    (random_sparse(300, 200, 9, 6), random(200, HEADS, 16), random(300, HEADS, 17))
}

fn edge_softmax<B: Backend<T = f32>>(b: &B) {
    let (s, src, dst) = softmax_inputs();
    let (mut want, mut got) = (Mat::zeros(s.nnz(), HEADS), b.zeros(s.nnz(), HEADS));
    R.edge_softmax(&R.sparse(&s), &wide(&src), &wide(&dst), 0.2, &mut want);
    b.edge_softmax(&b.sparse(&s), &b.upload(&src), &b.upload(&dst), 0.2, &mut got);
    check(b, "edge_softmax", &got, &want);
}

fn edge_softmax_backward<B: Backend<T = f32>>(b: &B) {
    let (s, src, dst) = softmax_inputs();
    let (rs, bs) = (R.sparse(&s), b.sparse(&s));
    let dalpha = random(s.nnz(), HEADS, 18);
    // the forward's coefficients, each side its own
    let (mut alpha_w, mut alpha_g) = (Mat::zeros(s.nnz(), HEADS), b.zeros(s.nnz(), HEADS));
    R.edge_softmax(&rs, &wide(&src), &wide(&dst), 0.2, &mut alpha_w);
    b.edge_softmax(&bs, &b.upload(&src), &b.upload(&dst), 0.2, &mut alpha_g);
    let (mut want, mut got) = (Mat::zeros(s.nnz(), HEADS), b.zeros(s.nnz(), HEADS));
    R.edge_softmax_backward(&rs, &wide(&src), &wide(&dst), 0.2, &alpha_w, &wide(&dalpha), &mut want);
    let (bsrc, bdst) = (b.upload(&src), b.upload(&dst));
    b.edge_softmax_backward(&bs, &bsrc, &bdst, 0.2, &alpha_g, &b.upload(&dalpha), &mut got);
    check(b, "edge_softmax_backward", &got, &want);
}

/// A dropout mask is the same decision wherever it is computed: an element is zeroed on both
/// sides or on neither, and the kept ones are scaled alike.
fn same_mask(what: &str, got: &Mat<f32>, want: &Mat<f64>) {
    for (i, (&g, &w)) in got.data.iter().zip(&want.data).enumerate() {
        assert_eq!(g == 0.0, w == 0.0, "{what}: element {i} kept on one side only");
    }
    let e = rel(got, want);
    assert!(e <= TOL, "{what}: relative error {e:.3e}");
}

fn dropout<B: Backend<T = f32>>(b: &B) {
    let key = MaskKey { seed: 3, epoch: 5, site: 7 };
    let x = random(300, 37, 19);
    let ids: Vec<u32> = (0..300u32).map(|i| i * 7919 % 1000).collect();
    for ids in [None, Some(&ids[..])] {
        let (mut want, mut got) = (wide(&x), b.upload(&x));
        R.dropout(key, 0.3, ids, &mut want);
        b.dropout(key, 0.3, ids, &mut got);
        same_mask(&format!("dropout, ids {}", ids.is_some()), &b.download(&got), &want);
    }
}

fn edge_dropout<B: Backend<T = f32>>(b: &B) {
    let key = MaskKey { seed: 3, epoch: 5, site: 7 };
    let s = random_sparse(300, 200, 9, 6);
    let with_ids =
        s.clone().with_ids((0..300).map(|i| i * 3 + 1).collect(), (0..200).map(|i| i * 5 + 2).collect());
    for sp in [&s, &with_ids] {
        let vals = random(sp.nnz(), 4, 20);
        let (mut want, mut got) = (wide(&vals), b.upload(&vals));
        R.edge_dropout(&R.sparse(sp), key, 0.25, &mut want);
        b.edge_dropout(&b.sparse(sp), key, 0.25, &mut got);
        same_mask(&format!("edge_dropout, ids {}", sp.row_ids.is_some()), &b.download(&got), &want);
    }
}

/// Indexed and ranged rows at offsets, at widths with and without 16-byte loads.
fn gather_rows<B: Backend<T = f32>>(b: &B) {
    let idx: Vec<u32> = vec![5, 0, 299, 5, 17];
    for (w, seed) in [(37, 30), (64, 31)] {
        let (x, o0) = (random(300, w, seed), random(9, w, seed + 1));
        let (mut want, mut got) = (wide(&o0), b.upload(&o0));
        for (rows, at) in [(Rows::Index(&idx), 1), (Rows::Range(290, 3), 6)] {
            R.gather_rows(&wide(&x), rows, &mut want, at);
            b.gather_rows(&b.upload(&x), rows, &mut got, at);
        }
        check_within(b, &format!("gather_rows width {w}"), &got, &want, 0.0);
    }
}

/// Indexed rows that repeat (5 twice) and ranged rows.
fn scatter_add_rows<B: Backend<T = f32>>(b: &B) {
    let idx: Vec<u32> = vec![5, 0, 299, 5, 17];
    for (w, seed) in [(37, 30), (64, 31)] {
        let (x, src) = (random(300, w, seed), random(9, w, seed + 2));
        let (mut want, mut got) = (wide(&x), b.upload(&x));
        for (from, rows) in [(1, Rows::Index(&idx)), (6, Rows::Range(290, 3))] {
            R.scatter_add_rows(&wide(&src), from, rows, &mut want);
            b.scatter_add_rows(&b.upload(&src), from, rows, &mut got);
        }
        check(b, &format!("scatter_add_rows width {w}"), &got, &want);
    }
}

fn unary<B: Backend<T = f32>>(b: &B) {
    let x = random(300, 37, 19);
    for op in [Unary::Relu, Unary::Scale(-1.5)] {
        let (mut want, mut got) = (wide(&x), b.upload(&x));
        R.unary(op, &mut want);
        b.unary(op, &mut got);
        check(b, &format!("{op:?}"), &got, &want);
    }
}

fn binary<B: Backend<T = f32>>(b: &B) {
    let (x, y) = (random(300, 37, 19), random(300, 37, 22));
    for op in [Binary::Add, Binary::ReluGrad, Binary::Mul] {
        let (mut want, mut got) = (wide(&y), b.upload(&y));
        R.binary(op, &wide(&x), &mut want);
        b.binary(op, &b.upload(&x), &mut got);
        check(b, &format!("{op:?}"), &got, &want);
    }
}

fn add_row<B: Backend<T = f32>>(b: &B) {
    let (x, bias) = (random(300, 37, 19), random(1, 37, 23));
    let (mut want, mut got) = (wide(&x), b.upload(&x));
    R.add_row(&wide(&bias), &mut want);
    b.add_row(&b.upload(&bias), &mut got);
    check(b, "add_row", &got, &want);
}

/// Over 10,000 rows (the GPU sums in parts of 4,096), accumulating. Each output sums 10,000
/// terms: hence 1e-4.
fn col_sums<B: Backend<T = f32>>(b: &B) {
    let (big, o0) = (random(10_000, 37, 24), random(1, 37, 23));
    let (mut want, mut got) = (wide(&o0), b.upload(&o0));
    R.col_sums(&wide(&big), 1.0, &mut want);
    b.col_sums(&b.upload(&big), 1.0, &mut got);
    check_within(b, "col_sums", &got, &want, 1e-4);
}

/// LayerNorm's input (10,000 rows of 37), γ and β; its forward on the reference and on `b`:
/// `(y, statistics)` of each.
#[allow(clippy::type_complexity)]
fn layer_norm_forward<B: Backend<T = f32>>(b: &B) -> ([Mat<f32>; 3], (Mat<f64>, Mat<f64>), (B::Mat, B::Mat)) {
    let (x, gamma, beta) = (random(10_000, 37, 24), random(1, 37, 25), random(1, 37, 26));
    let (mut yw, mut sw) = (Mat::zeros(10_000, 37), Mat::zeros(10_000, 2));
    let (mut yg, mut sg) = (b.zeros(10_000, 37), b.zeros(10_000, 2));
    R.layer_norm(&wide(&x), &wide(&gamma), &wide(&beta), 1e-5, &mut yw, &mut sw);
    b.layer_norm(&b.upload(&x), &b.upload(&gamma), &b.upload(&beta), 1e-5, &mut yg, &mut sg);
    ([x, gamma, beta], (yw, sw), (yg, sg))
}

fn layer_norm<B: Backend<T = f32>>(b: &B) {
    let (_, (yw, sw), (yg, sg)) = layer_norm_forward(b);
    check(b, "layer_norm y", &yg, &yw);
    check(b, "layer_norm statistics", &sg, &sw);
}

/// `dgamma` and `dbeta` sum over 10,000 rows: hence 1e-4 for them.
fn layer_norm_backward<B: Backend<T = f32>>(b: &B) {
    let ([x, gamma, _], (_, sw), (_, sg)) = layer_norm_forward(b);
    let dy = random(10_000, 37, 27);
    let (mut dxw, mut dgw, mut dbw) = (Mat::zeros(10_000, 37), Mat::zeros(1, 37), Mat::zeros(1, 37));
    let (mut dxg, mut dgg, mut dbg) = (b.zeros(10_000, 37), b.zeros(1, 37), b.zeros(1, 37));
    R.layer_norm_backward(&wide(&x), &wide(&gamma), &sw, &wide(&dy), &mut dxw, &mut dgw, &mut dbw);
    let (bx, bgamma, bdy) = (b.upload(&x), b.upload(&gamma), b.upload(&dy));
    b.layer_norm_backward(&bx, &bgamma, &sg, &bdy, &mut dxg, &mut dgg, &mut dbg);
    check(b, "layer_norm_backward dx", &dxg, &dxw);
    check_within(b, "layer_norm_backward dgamma", &dgg, &dgw, 1e-4);
    check_within(b, "layer_norm_backward dbeta", &dbg, &dbw, 1e-4);
}

/// Logits for 300 rows of 7 classes; the loss over every third row.
fn classes() -> (Mat<f32>, Vec<i32>, Vec<u32>) {
    let labels = (0..300).map(|i| i * 13 % 7).collect();
    (random(300, 7, 28), labels, (0..300).step_by(3).collect())
}

fn cross_entropy<B: Backend<T = f32>>(b: &B) {
    let (logits, labels, rows) = classes();
    let g0 = random(300, 7, 29);
    let (mut gw, mut gg) = (wide(&g0), b.upload(&g0));
    let (lw, cw) = R.cross_entropy(&wide(&logits), &labels, &rows, 0.01, &mut gw);
    let (lg, cg) = b.cross_entropy(&b.upload(&logits), &labels, &rows, 0.01, &mut gg);
    assert!((lw - lg).abs() <= TOL * lw.abs(), "cross_entropy loss {lg} against {lw}");
    assert_eq!(cw, cg, "cross_entropy correct count");
    // the rows not in the loss keep their values
    check(b, "cross_entropy gradient", &gg, &gw);
    let later = b.cross_entropy_later(&b.upload(&logits), &labels, &rows, 0.01, &mut gg);
    let (lg, cg) = b.loss_value(later);
    assert!((lw - lg).abs() <= TOL * lw.abs(), "cross_entropy_later loss {lg} against {lw}");
    assert_eq!(cw, cg, "cross_entropy_later correct count");
}

fn count_correct<B: Backend<T = f32>>(b: &B) {
    let (logits, labels, rows) = classes();
    let want = R.count_correct(&wide(&logits), &labels, &rows);
    assert!(want > 0 && want < rows.len(), "a count that tells right from wrong: {want}");
    assert_eq!(b.count_correct(&b.upload(&logits), &labels, &rows), want, "count_correct");
}

/// Adam with L2 decay, AdamW, SGD with momentum: parameters and both state matrices.
fn step<B: Backend<T = f32>>(b: &B) {
    let adam = |weight_decay, decoupled, t| StepRule::Adam {
        lr: 0.01,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay,
        decoupled,
        t,
    };
    let rules = [
        adam(5e-4, false, 3),
        adam(0.01, true, 1),
        StepRule::Sgd { lr: 0.1, momentum: 0.9, weight_decay: 5e-4, first: false },
    ];
    for rule in rules {
        let (p, gr, m) = (random(20, 30, 29), random(20, 30, 30), random(20, 30, 31));
        let v = Mat::from_vec(20, 30, random(20, 30, 32).data.iter().map(|x| x.abs()).collect());
        let (mut pw, mut mw, mut vw) = (wide(&p), wide(&m), wide(&v));
        let (mut pg, mut mg, mut vg) = (b.upload(&p), b.upload(&m), b.upload(&v));
        R.step(rule, &mut pw, &wide(&gr), &mut mw, &mut vw);
        b.step(rule, &mut pg, &b.upload(&gr), &mut mg, &mut vg);
        check(b, &format!("{rule:?} parameters"), &pg, &pw);
        check(b, &format!("{rule:?} first state"), &mg, &mw);
        check(b, &format!("{rule:?} second state"), &vg, &vw);
    }
}
