//! Every fast CPU kernel against a plain reference on random inputs.

use grinnder_tensor::ops::*;
use grinnder_tensor::{Cpu, MaskKey, Mat, Rows, SparseMatrix, Unary};

fn rand_mat(rows: usize, cols: usize, seed: u64) -> Mat<f64> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let data = (0..rows * cols)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
        })
        .collect();
    Mat::from_vec(rows, cols, data)
}

fn naive_gemm(a: &Mat<f64>, ta: bool, b: &Mat<f64>, tb: bool) -> Mat<f64> {
    let at = |i: usize, j: usize| if ta { a.data[j * a.cols + i] } else { a.data[i * a.cols + j] };
    let bt = |i: usize, j: usize| if tb { b.data[j * b.cols + i] } else { b.data[i * b.cols + j] };
    let (m, k) = if ta { (a.cols, a.rows) } else { (a.rows, a.cols) };
    let n = if tb { b.rows } else { b.cols };
    let mut c = Mat::zeros(m, n);
    for i in 0..m {
        for j in 0..n {
            c.data[i * n + j] = (0..k).map(|p| at(i, p) * bt(p, j)).sum();
        }
    }
    c
}

#[test]
fn gemm_matches_reference_for_every_transpose() {
    let cpu = Cpu::<f64>::new();
    for (m, k, n) in [(1, 1, 1), (7, 5, 3), (64, 33, 17), (130, 70, 40)] {
        for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
            let a = if ta { rand_mat(k, m, 1) } else { rand_mat(m, k, 1) };
            let b = if tb { rand_mat(n, k, 2) } else { rand_mat(k, n, 2) };
            let c0 = rand_mat(m, n, 3);
            let mut c = c0.clone();
            cpu.gemm(2.0, &a, ta, &b, tb, 0.5, &mut c);
            let mut want = naive_gemm(&a, ta, &b, tb);
            want.data.iter_mut().zip(&c0.data).for_each(|(w, c)| *w = 2.0 * *w + 0.5 * c);
            assert!(c.max_rel_err(&want, 1.0) < 1e-13, "{m}×{k}×{n} ta={ta} tb={tb}");
            let cf = Cpu::<f32>::new();
            let mut c32 = c0.cast::<f32>();
            cf.gemm(2.0, &a.cast(), ta, &b.cast(), tb, 0.5, &mut c32);
            // f32 inputs carry ~6e-8 relative rounding; sums of k terms of size ~1 give ~1e-6 absolute
            assert!(c32.cast::<f64>().max_rel_err(&want, 1.0) < 1e-5);
        }
    }
}

#[test]
fn gemm_with_a_long_inner_dimension_splits_it_exactly() {
    // weight-gradient shapes: small output, inner dimension over all nodes (the K-split path,
    // taken with more than one thread)
    let pool = rayon::ThreadPoolBuilder::new().num_threads(3).build().unwrap();
    pool.install(gemm_long_inner);
}

fn gemm_long_inner() {
    let cpu = Cpu::<f64>::new();
    for (m, n, k, ta, tb) in
        [(3, 4, 20_000, true, false), (40, 9, 9_000, true, false), (5, 7, 10_000, false, true)]
    {
        let a = if ta { rand_mat(k, m, 11) } else { rand_mat(m, k, 11) };
        let b = if tb { rand_mat(n, k, 12) } else { rand_mat(k, n, 12) };
        let c0 = rand_mat(m, n, 13);
        for beta in [0.0, 1.0] {
            let mut c = c0.clone();
            cpu.gemm(0.5, &a, ta, &b, tb, beta, &mut c);
            let mut want = naive_gemm(&a, ta, &b, tb);
            want.data.iter_mut().zip(&c0.data).for_each(|(w, c)| *w = 0.5 * *w + beta * c);
            assert!(c.max_rel_err(&want, 1.0) < 1e-12, "{m}×{k}×{n} beta={beta}");
        }
    }
}

#[test]
fn spmm_and_its_transpose_match_dense_products() {
    let cpu = Cpu::<f64>::new();
    // a 5 × 4 sparse matrix
    let row_ptr = vec![0, 2, 2, 5, 6, 7];
    let col_idx = vec![0, 3, 1, 2, 3, 0, 2];
    let s = SparseMatrix::new(5, 4, row_ptr.clone(), col_idx.clone());
    let vals = rand_mat(7, 1, 9);
    let mut dense = Mat::zeros(5, 4);
    for r in 0..5 {
        for e in row_ptr[r]..row_ptr[r + 1] {
            dense.data[r * 4 + col_idx[e as usize] as usize] = vals.data[e as usize];
        }
    }
    let x = rand_mat(4, 3, 4);
    let mut out = rand_mat(5, 3, 5);
    // the transpose as stored: column 0 holds rows 0 and 3 (entries 0 and 5), and so on
    assert_eq!(s.t_row_ptr, vec![0, 2, 3, 5, 7]);
    assert_eq!(s.t_col_idx, vec![0, 3, 2, 2, 4, 0, 2]);
    assert_eq!(s.t_perm, vec![0, 5, 2, 3, 6, 1, 4]);
    // a structure sent without its transpose gets it from the backend
    let csr = SparseMatrix::csr_only(5, 4, row_ptr.clone(), col_idx.clone());
    assert!(!csr.has_transpose() && s.has_transpose());
    for sp in [cpu.sparse(&s), cpu.sparse(&csr)] {
        assert_eq!(*sp, s);
        cpu.spmm(&sp, &vals, false, &x, 0.0, &mut out);
        assert!(out.max_rel_err(&naive_gemm(&dense, false, &x, false), 1e-12) < 1e-12);
        let g = rand_mat(5, 3, 6);
        let mut outt = Mat::zeros(4, 3);
        cpu.spmm(&sp, &vals, true, &g, 0.0, &mut outt);
        assert!(outt.max_rel_err(&naive_gemm(&dense, true, &g, false), 1e-12) < 1e-12);
    }
}

#[test]
fn factored_values_multiply_as_the_values_they_factor() {
    let cpu = Cpu::<f64>::new();
    let (row_ptr, col_idx) = (vec![0, 2, 2, 5, 6, 7], vec![0, 3, 1, 2, 3, 0, 2]);
    let full = SparseMatrix::new(5, 4, row_ptr.clone(), col_idx.clone());
    let s = full.clone().without_entry_order();
    assert!(full.has_entry_order() && !s.has_entry_order() && s.has_transpose());
    // a structure transposed without its order is the one whose order was dropped
    assert_eq!(SparseMatrix::csr_only(5, 4, row_ptr, col_idx).without_entry_order(), s);
    let (rf, cf) = (rand_mat(5, 1, 11), rand_mat(4, 1, 12));
    let (x, g) = (rand_mat(4, 3, 13), rand_mat(5, 3, 14));
    for (rows, cols) in [(Some(&rf), Some(&cf)), (Some(&rf), None), (None, Some(&cf)), (None, None)] {
        // the values the factors stand for, entry by entry
        let vals: Vec<f64> = (0..5)
            .flat_map(|r| full.row_range(r).map(move |e| (r, e)))
            .map(|(r, e)| {
                let c = full.col_idx[e] as usize;
                rows.map_or(1.0, |f| f.data[r]) * cols.map_or(1.0, |f| f.data[c])
            })
            .collect();
        let vals = Mat::from_vec(7, 1, vals);
        for (transpose, x, n) in [(false, &x, 5), (true, &g, 4)] {
            for beta in [0.0, 0.5] {
                let (mut want, mut got) = (rand_mat(n, 3, 15), rand_mat(n, 3, 15));
                cpu.spmm(&cpu.sparse(&full), &vals, transpose, x, beta, &mut want);
                cpu.spmm_factored(&cpu.sparse(&s), rows, cols, transpose, x, beta, &mut got);
                assert!(got.max_rel_err(&want, 1e-12) < 1e-12, "transpose {transpose}, beta {beta}");
            }
        }
    }
}

#[test]
#[should_panic(expected = "multiplies only factored values")]
fn a_structure_without_entry_order_refuses_values_per_entry_transposed() {
    let cpu = Cpu::<f64>::new();
    let s = SparseMatrix::new(2, 2, vec![0, 1, 2], vec![1, 0]).without_entry_order();
    let (vals, x) = (rand_mat(2, 1, 1), rand_mat(2, 3, 2));
    cpu.spmm(&cpu.sparse(&s), &vals, true, &x, 0.0, &mut Mat::zeros(2, 3));
}

#[test]
fn dropout_masks_are_keyed_and_consistent() {
    let cpu = Cpu::<f64>::new();
    let key = MaskKey { seed: 1, epoch: 2, site: 3 };
    let mut whole = Mat::from_vec(100, 8, vec![1.0; 800]);
    cpu.dropout(key, 0.5, None, &mut whole);
    // the same rows computed as a separate block, in any order, get the same mask
    let ids: Vec<u32> = (40..50).rev().collect();
    let mut part = Mat::from_vec(10, 8, vec![1.0; 80]);
    cpu.dropout(key, 0.5, Some(&ids), &mut part);
    for (i, &id) in ids.iter().enumerate() {
        assert_eq!(&whole.data[id as usize * 8..(id as usize + 1) * 8], &part.data[i * 8..(i + 1) * 8]);
    }
    let kept = whole.data.iter().filter(|&&v| v != 0.0).count();
    assert!((300..500).contains(&kept), "kept {kept} of 800 at p = 0.5");
    assert!(whole.data.iter().all(|&v| v == 0.0 || v == 2.0));
    let mut other = Mat::from_vec(100, 8, vec![1.0; 800]);
    cpu.dropout(MaskKey { epoch: 3, ..key }, 0.5, None, &mut other);
    assert_ne!(whole, other);
}

#[test]
fn layer_norm_backward_matches_finite_differences() {
    let cpu = Cpu::<f64>::new();
    let (x, gamma, beta, dy) = (rand_mat(4, 6, 1), rand_mat(1, 6, 2), rand_mat(1, 6, 3), rand_mat(4, 6, 4));
    let loss = |x: &Mat<f64>, gamma: &Mat<f64>| {
        let (mut y, mut st) = (Mat::zeros(4, 6), Mat::zeros(4, 2));
        cpu.layer_norm(x, gamma, &beta, 1e-5, &mut y, &mut st);
        y.data.iter().zip(&dy.data).map(|(a, b)| a * b).sum::<f64>()
    };
    let (mut y, mut st) = (Mat::zeros(4, 6), Mat::zeros(4, 2));
    cpu.layer_norm(&x, &gamma, &beta, 1e-5, &mut y, &mut st);
    let (mut dx, mut dg, mut db) = (Mat::zeros(4, 6), Mat::zeros(1, 6), Mat::zeros(1, 6));
    cpu.layer_norm_backward(&x, &gamma, &st, &dy, &mut dx, &mut dg, &mut db);
    let h = 1e-6;
    for i in 0..x.data.len() {
        let (mut p, mut m) = (x.clone(), x.clone());
        p.data[i] += h;
        m.data[i] -= h;
        let fd = (loss(&p, &gamma) - loss(&m, &gamma)) / (2.0 * h);
        assert!((fd - dx.data[i]).abs() <= 1e-6 * fd.abs().max(1e-3), "dx[{i}]: {fd} vs {}", dx.data[i]);
    }
    for j in 0..6 {
        let (mut p, mut m) = (gamma.clone(), gamma.clone());
        p.data[j] += h;
        m.data[j] -= h;
        let fd = (loss(&x, &p) - loss(&x, &m)) / (2.0 * h);
        assert!((fd - dg.data[j]).abs() <= 1e-6 * fd.abs().max(1e-3), "dgamma[{j}]");
        let sum: f64 = (0..4).map(|r| dy.data[r * 6 + j]).sum();
        assert!((db.data[j] - sum).abs() < 1e-12);
    }
}

#[test]
fn cross_entropy_matches_definition() {
    let cpu = Cpu::<f64>::new();
    let logits = rand_mat(5, 3, 7);
    let labels = [0, 2, 1, 1, 0];
    let rows = [1u32, 3, 4];
    let mut grad = Mat::zeros(5, 3);
    let (loss, correct) = cpu.cross_entropy(&logits, &labels, &rows, 1.0 / 3.0, &mut grad);
    let mut want = 0.0;
    let mut want_correct = 0;
    for &r in &rows {
        let z = logits.row(r as usize);
        let lse = z.iter().map(|v| v.exp()).sum::<f64>().ln();
        want += lse - z[labels[r as usize] as usize];
        let am = (0..3).max_by(|&a, &b| z[a].total_cmp(&z[b])).unwrap();
        want_correct += (am as i32 == labels[r as usize]) as usize;
        let gs: f64 = grad.row(r as usize).iter().sum();
        assert!(gs.abs() < 1e-12, "softmax gradient rows sum to zero");
    }
    assert!((loss - want).abs() < 1e-12);
    assert_eq!(correct, want_correct);
    assert!(grad.row(0).iter().all(|&g| g == 0.0), "rows outside the set are untouched");
    let mut x = rand_mat(2, 2, 1);
    let before = x.clone();
    cpu.unary(Unary::Relu, &mut x);
    assert!(x.data.iter().zip(&before.data).all(|(a, b)| *a == b.max(0.0)));
}

#[test]
fn row_ranges_land_at_offsets() {
    let cpu = Cpu::<f64>::new();
    let x = rand_mat(6, 3, 3);
    // out rows 0..2 stay, 2..5 = x rows 1..4, 5..7 = x rows 5, 0
    let mut out = Mat::from_vec(7, 3, vec![-1.0; 21]);
    cpu.gather_rows(&x, Rows::Range(1, 3), &mut out, 2);
    cpu.gather_rows(&x, Rows::Index(&[5, 0]), &mut out, 5);
    assert!(out.data[..6].iter().all(|&v| v == -1.0), "rows before the offset untouched");
    for (i, r) in [1usize, 2, 3, 5, 0].into_iter().enumerate() {
        assert_eq!(out.row(2 + i), x.row(r));
    }
    // src rows 2..4 added into out rows 3..5, src rows 4..6 into out rows 0, 0
    let mut acc = Mat::zeros(6, 3);
    cpu.scatter_add_rows(&x, 2, Rows::Range(3, 2), &mut acc);
    cpu.scatter_add_rows(&x, 4, Rows::Index(&[0, 0]), &mut acc);
    assert_eq!(acc.row(3), x.row(2));
    assert_eq!(acc.row(4), x.row(3));
    let want: Vec<f64> = (0..3).map(|j| x.row(4)[j] + x.row(5)[j]).collect();
    assert_eq!(acc.row(0), &want[..]);
    assert!([1, 2, 5].iter().all(|&r| acc.row(r).iter().all(|&v| v == 0.0)));
}

#[test]
fn gather_and_scatter_add_are_adjoint() {
    let cpu = Cpu::<f64>::new();
    let x = rand_mat(6, 3, 1);
    let idx = [4u32, 0, 4, 5, 2];
    let mut g = Mat::zeros(5, 3);
    cpu.gather_rows(&x, Rows::Index(&idx), &mut g, 0);
    for (i, &r) in idx.iter().enumerate() {
        assert_eq!(g.row(i), x.row(r as usize));
    }
    // <gather(x), y> = <x, scatter_add(y)>
    let y = rand_mat(5, 3, 2);
    let mut s = Mat::zeros(6, 3);
    cpu.scatter_add_rows(&y, 0, Rows::Index(&idx), &mut s);
    let lhs: f64 = g.data.iter().zip(&y.data).map(|(a, b)| a * b).sum();
    let rhs: f64 = x.data.iter().zip(&s.data).map(|(a, b)| a * b).sum();
    assert!((lhs - rhs).abs() < 1e-12);
    assert!(s.row(1).iter().all(|&v| v == 0.0), "rows never indexed stay untouched");
    let want: Vec<f64> = (0..3).map(|j| y.data[j] + y.data[2 * 3 + j]).collect();
    assert!(s.row(4).iter().zip(&want).all(|(a, b)| (a - b).abs() < 1e-15), "repeated rows add up");
}

/// Runs `f` on a rayon pool of `threads` threads.
fn on_threads<R: Send>(threads: usize, f: impl FnOnce() -> R + Send) -> R {
    rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap().install(f)
}

#[test]
fn reductions_give_the_same_bits_on_any_thread_count() {
    // gemm shapes of a training step: the gemm crate's own parallel path (node rows × hidden),
    // the split inner dimension (weight gradients over every node, k ≥ 8192), and column sums
    // (bias gradients) over many row blocks; f32 as training runs
    let cpu = Cpu::<f32>::new();
    let x = rand_mat(30_000, 64, 21).cast::<f32>();
    let w = rand_mat(64, 40, 22).cast::<f32>();
    let g = rand_mat(30_000, 40, 23).cast::<f32>();
    let run = || {
        let mut y = Mat::zeros(30_000, 40);
        cpu.gemm(1.0, &x, false, &w, false, 0.0, &mut y);
        let mut dw = Mat::zeros(64, 40);
        cpu.gemm(1.0, &x, true, &g, false, 0.0, &mut dw);
        let mut db = Mat::zeros(1, 40);
        cpu.col_sums(&g, 0.0, &mut db);
        (y, dw, db)
    };
    let one = on_threads(1, run);
    for threads in [2, 3] {
        for rep in 0..3 {
            let got = on_threads(threads, run);
            assert!(got.0 == one.0, "gemm output differs at {threads} threads (repeat {rep})");
            assert!(got.1 == one.1, "weight-gradient gemm differs at {threads} threads (repeat {rep})");
            assert!(got.2 == one.2, "column sums differ at {threads} threads (repeat {rep})");
        }
    }
}

/// f32 values whose bf16 rounding is easy to get wrong: ties (to even, both ways), the largest
/// finite value (rounds to infinity), infinities, NaNs with and without the quiet bit and with
/// payloads, subnormals, zeros of both signs, and a sweep of bit patterns.
fn bf16_cases() -> Vec<f32> {
    let mut bits: Vec<u32> = vec![
        0x3f80_8000, // 1 + 2^-8: a tie, rounds down to even
        0x3f81_8000, // a tie that rounds up to even
        0x3f80_8001,
        0x7f7f_ffff, // the largest finite f32
        0x7f80_0000,
        0xff80_0000,
        0x7f80_0001, // a signalling NaN: made quiet
        0x7fc0_0000,
        0xffc1_2345,
        0x0000_0001, // the smallest subnormal
        0x0000_8000,
        0x807f_ffff,
        0x0000_0000,
        0x8000_0000,
    ];
    let mut s = 0x9E37_79B9u32;
    bits.extend((0..4096).map(|_| {
        s ^= s << 13;
        s ^= s >> 17;
        s ^= s << 5;
        s
    }));
    bits.into_iter().map(f32::from_bits).collect()
}

#[test]
fn bf16_rounds_to_nearest_even_as_the_half_crate_does_and_the_default_transfers_use_it() {
    use grinnder_tensor::scalar::{from_bf16, to_bf16};
    let xs = bf16_cases();
    for &x in &xs {
        let h = to_bf16(x);
        if x.is_nan() {
            assert!(from_bf16(h).is_nan(), "{:#x}: NaN stays NaN", x.to_bits());
            assert_eq!(h & 0x40, 0x40, "{:#x}: made quiet", x.to_bits());
        } else {
            assert_eq!(h, half::bf16::from_f32(x).to_bits(), "{:#x}", x.to_bits());
        }
    }
    // the host's transfers: downloads rounded by to_bf16, uploads the values the bits hold
    let c = Cpu::<f32>::new();
    let m = c.upload(&Mat::from_vec(xs.len(), 1, xs.clone()));
    let mut down = Vec::new();
    c.download_bf16_with(&m, &mut |h| down = h.to_vec());
    assert_eq!(down, xs.iter().map(|&x| to_bf16(x)).collect::<Vec<_>>());
    let up = c.upload_bf16_with(down.len(), 1, &mut |h| h.copy_from_slice(&down));
    let got: Vec<u32> = c.download(&up).data.iter().map(|x| x.to_bits()).collect();
    assert_eq!(got, down.iter().map(|&h| from_bf16(h).to_bits()).collect::<Vec<_>>());
    assert!(!c.converts_bf16(), "the host converts on no bus");
}
