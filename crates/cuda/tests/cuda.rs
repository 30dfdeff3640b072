//! The CUDA backend against the CPU backend: what only the CUDA backend has (each SpMM kernel,
//! transposes on the device, zero-copy gathers, stream hand-offs, the memory budget), and whole
//! models' losses and parameter gradients; every Backend operation alone is in `ops.rs`. These tests need a GPU: on a machine without one
//! (CI) each prints that it was skipped and passes; they run on the GPU machine (see
//! docs/gpu.md, "GPU tests").

mod common;

use common::{gpu, random, random_sparse};
use grinnder_cuda::{Cuda, SpmmKernel};
use grinnder_graph::generate::{generate, preset, GenConfig};
use grinnder_graph::rng::Stream;
use grinnder_nn::{Graph, Kind, Model, ModelConfig, Norm};
use grinnder_tensor::ops::*;
use grinnder_tensor::{Backend, Cpu, Mat, Rows, SparseMatrix, Unary};

/// `max |a − b| / max |b|` (the tensor's largest deviation relative to its scale).
fn rel(a: &Mat<f32>, b: &Mat<f32>) -> f64 {
    assert_eq!((a.rows, a.cols), (b.rows, b.cols));
    let scale = b.data.iter().fold(0f64, |m, &x| m.max((x as f64).abs())).max(1e-30);
    // a NaN anywhere is an infinite error (f64::max would skip it)
    let diff =
        |x: f32, y: f32| if x.is_nan() || y.is_nan() { f64::INFINITY } else { (x as f64 - y as f64).abs() };
    a.data.iter().zip(&b.data).fold(0f64, |m, (&x, &y)| m.max(diff(x, y))) / scale
}

const TOL: f64 = 1e-5;

/// The models the gradient tests run: 3 layers, hidden 32, every optional piece on.
fn model_cfg(kind: Kind) -> ModelConfig {
    ModelConfig {
        kind,
        layers: 3,
        hidden: 32,
        dropout: 0.3,
        input_dropout: 0.1,
        norm: Norm::Layer,
        residual: true,
        heads: 2,
        attn_dropout: 0.2,
        gin_eps: 0.1,
        train_eps: true,
        alpha: grinnder_nn::model::DEFAULT_ALPHA,
        theta: grinnder_nn::model::DEFAULT_THETA,
        seed: 5,
    }
}

#[test]
fn labels_read_by_node_id_from_mapped_memory_give_the_cpu_loss() {
    let Some(g) = gpu() else { return };
    let c = Cpu::<f32>::new();
    let logits = random(300, 7, 28);
    let labels: Vec<i32> = (0..300).map(|i| i * 13 % 7).collect();
    // labels read by node id from mapped host memory (zero-copy): row i of the
    // logits belongs to node ids[i] of a 1000-node table
    let ids: Vec<u32> = (0..300u32).map(|i| (i * 617 + 5) % 1000).collect();
    let mut table = vec![-1i32; 1000];
    for (i, &v) in ids.iter().enumerate() {
        table[v as usize] = labels[i];
    }
    let all: Vec<u32> = (0..300).collect();
    let (mut gw, mut gg) = (Mat::zeros(300, 7), g.upload(&random(300, 7, 29)));
    let (lw, cw) = c.cross_entropy(&logits, &labels, &all, 0.01, &mut gw);
    let mapped = g.host_labels(&table, 7).unwrap();
    let (lg, cg) = g.loss_value(g.cross_entropy_mapped(&g.upload(&logits), &mapped, &ids, 0.01, &mut gg));
    assert!((lw - lg).abs() <= 1e-5 * lw.abs(), "mapped labels: loss {lg} vs {lw}");
    assert_eq!(cw, cg, "mapped labels: correct count");
    let e = rel(&g.download(&gg), &gw);
    assert!(e <= TOL, "cross_entropy gradient, mapped labels: relative error {e:.3e}");
}

#[test]
fn losses_read_later_each_give_their_own_logits_loss() {
    let Some(g) = gpu() else { return };
    let c = Cpu::<f32>::new();
    let labels: Vec<i32> = (0..300).map(|i| i * 13 % 7).collect();
    let rows: Vec<u32> = (0..300).step_by(3).collect();
    let mut gg = g.zeros(300, 7);
    // losses read later (as the mini-batch trainer does): eight queued while the main stream
    // is held (none is computed before the reading starts), each on logits that the work queued
    // after it overwrites; each read waits for its kernel and gives its own logits' loss
    let mut wanted = Vec::new();
    for k in 0..8u64 {
        // a different logits matrix and number of rows each time (1 to 92 of the 100)
        let (lk, some) = (random(300, 7, 40 + k), &rows[..1 + 13 * k as usize]);
        wanted.push((
            g.upload(&lk),
            some,
            c.cross_entropy(&lk, &labels, some, 0.01, &mut Mat::zeros(300, 7)),
        ));
    }
    let mut on_device = g.zeros(300, 7);
    let hold = g.hold_main_stream();
    let mut queued = Vec::new();
    for (lk, some, want) in &wanted {
        g.copy(lk, &mut on_device);
        queued.push((g.cross_entropy_later(&on_device, &labels, some, 0.01, &mut gg), *want));
        g.unary(Unary::Scale(0.0), &mut on_device);
    }
    let release = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(200));
        drop(hold);
    });
    for (k, (later, (lw, cw))) in queued.into_iter().enumerate() {
        let (lg, cg) = g.loss_value(later);
        assert!((lw - lg).abs() <= 1e-5 * lw.abs(), "loss {k} read later: {lg} vs {lw}");
        assert_eq!(cw, cg, "loss {k} read later: correct count");
    }
    release.join().unwrap();
}

/// A download started ahead waits for the main stream's work queued before it, even when that
/// work has not run yet (the stream held), and the main stream's later work does not change
/// what it reads.
#[test]
fn a_download_ahead_reads_what_the_work_queued_before_it_wrote() {
    let Some(g) = gpu() else { return };
    let x = common::random(3000, 47, 9);
    let mut m = g.upload(&x);
    let hold = g.hold_main_stream();
    g.unary(Unary::Scale(3.0), &mut m);
    let mut again = g.upload(&x);
    g.copy(&m, &mut again);
    let leaving = g.download_ahead(m);
    // queued after the download: must not reach what it reads
    g.unary(Unary::Scale(0.0), &mut again);
    let release = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(200));
        drop(hold);
    });
    let mut read = Vec::new();
    g.downloaded(leaving, &mut |d| read.extend_from_slice(d));
    release.join().unwrap();
    let want: Vec<f32> = x.data.iter().map(|v| v * 3.0).collect();
    assert_eq!(read, want);
}

/// SpMM forward and transposed, one and several value columns, with each implementation
/// forced in turn (`ops.rs` tests the one `Auto` picks).
#[test]
fn each_spmm_kernel_matches_the_cpu() {
    let Some(mut g) = gpu() else { return };
    let c = &Cpu::<f32>::new();
    let s = random_sparse(300, 200, 9, 6);
    let cs = c.sparse(&s);
    assert!(g.has_cusparse(), "libcusparse is on the GPU machine: its SpMM must be tested");
    for kernel in [SpmmKernel::Auto, SpmmKernel::Ours, SpmmKernel::Warp, SpmmKernel::CuSparse] {
        g.set_spmm(kernel);
        let gs = g.sparse(&s);
        // widths that take each kernel: half-warp (≤ 64), 16-byte vectors, general
        for (k, d) in [(1, 20), (1, 47), (1, 64), (4, 64), (1, 70), (1, 96), (4, 96), (4, 100), (1, 300)] {
            let vals = random(s.nnz(), k, 7);
            for transpose in [false, true] {
                let (rows, inner) = if transpose { (200, 300) } else { (300, 200) };
                let x = random(inner, d, 8);
                let o0 = random(rows, d, 9);
                let (mut want, mut got) = (o0.clone(), g.upload(&o0));
                c.spmm(&cs, &vals, transpose, &x, 0.5, &mut want);
                g.spmm(&gs, &g.upload(&vals), transpose, &g.upload(&x), 0.5, &mut got);
                let e = rel(&g.download(&got), &want);
                assert!(
                    e <= TOL,
                    "spmm {kernel:?} k={k} d={d} transpose={transpose}: relative error {e:.3e}"
                );
            }
        }
    }
    g.set_spmm(SpmmKernel::Auto);
    assert!(!g.spmm_choices().is_empty(), "Auto timed the shapes it met");
}

/// Factored values (one per row and one per column, the transpose's entry order not on the
/// device) multiply as the CPU's, through each of grinnder's kernels and cuSPARSE (given the
/// values written out per entry).
#[test]
fn factored_spmm_matches_the_cpu_in_each_kernel() {
    let Some(mut g) = gpu() else { return };
    let c = &Cpu::<f32>::new();
    let s = random_sparse(300, 200, 9, 6).without_entry_order();
    let (cs, (rf, cf)) = (c.sparse(&s), (random(300, 1, 10), random(200, 1, 11)));
    for kernel in [SpmmKernel::Auto, SpmmKernel::Ours, SpmmKernel::Warp, SpmmKernel::CuSparse] {
        g.set_spmm(kernel);
        let gs = g.sparse(&s);
        let (grf, gcf) = (g.upload(&rf), g.upload(&cf));
        for (rows_f, cols_f) in [(true, true), (true, false), (false, true), (false, false)] {
            let (r, gr) = if rows_f { (Some(&rf), Some(&grf)) } else { (None, None) };
            let (cl, gc) = if cols_f { (Some(&cf), Some(&gcf)) } else { (None, None) };
            for d in [20, 64, 96, 100, 300] {
                for (transpose, beta) in [(false, 0.0), (true, 0.0), (false, 0.5), (true, 0.5)] {
                    let (n, inner) = if transpose { (200, 300) } else { (300, 200) };
                    let x = random(inner, d, 8);
                    let o0 = random(n, d, 9);
                    let (mut want, mut got) = (o0.clone(), g.upload(&o0));
                    c.spmm_factored(&cs, r, cl, transpose, &x, beta, &mut want);
                    g.spmm_factored(&gs, gr, gc, transpose, &g.upload(&x), beta, &mut got);
                    let e = rel(&g.download(&got), &want);
                    assert!(
                        e <= TOL,
                        "factored {kernel:?} rows {rows_f} cols {cols_f} d={d} transpose={transpose} beta={beta}: relative error {e:.3e}"
                    );
                }
            }
        }
    }
    g.set_spmm(SpmmKernel::Auto);
}

/// Structures sent without their transpose (a mini-batch's blocks) are transposed on the
/// device exactly as the CPU transposes them — entries of each transposed row in the same
/// order, so transposed products sum in the same order — including columns with thousands of
/// entries and empty rows and columns.
#[test]
fn structures_made_ahead_are_transposed_on_the_device_exactly() {
    let Some(g) = gpu() else { return };
    let c = Cpu::<f32>::new();
    let mut rng = Stream::new(&[9, 79]);
    let (rows, cols) = (20_000usize, 50_000usize);
    let mut row_ptr = vec![0u64];
    let mut col_idx = Vec::new();
    for r in 0..rows {
        // every third row empty; column 7 in most rows (a hub); the rest spread
        if r % 3 != 0 {
            let mut cs: Vec<u32> = (0..6).map(|_| rng.below(cols as u64) as u32).collect();
            if r % 5 != 0 {
                cs.push(7);
            }
            cs.sort_unstable();
            cs.dedup();
            col_idx.extend(cs);
        }
        row_ptr.push(col_idx.len() as u64);
    }
    let ids: Vec<u32> = (0..cols as u32).map(|i| i * 3 + 1).collect();
    let csr =
        SparseMatrix::csr_only(rows, cols, row_ptr, col_idx).with_ids(ids[..rows].to_vec(), ids.clone());
    let full = csr.clone().with_transpose();
    let on_gpu = g.sparse_ahead(&csr);
    g.synchronize();
    let (ptr, idx, perm) = g.transpose_to_host(&on_gpu);
    assert_eq!(ptr, full.t_row_ptr, "transposed offsets");
    assert_eq!(idx, full.t_col_idx, "transposed indices");
    assert_eq!(perm, full.t_perm, "entry permutation");
    // and the products through it, both directions, against the CPU's
    let vals = random(csr.nnz(), 1, 11);
    let (dv, dvals) = (c.sparse(&full), g.upload(&vals));
    for (transpose, n_in, n_out) in [(false, cols, rows), (true, rows, cols)] {
        let x = random(n_in, 16, 12);
        let mut want = Mat::zeros(n_out, 16);
        c.spmm(&dv, &vals, transpose, &x, 0.0, &mut want);
        let mut got = g.zeros(n_out, 16);
        g.spmm(&on_gpu, &dvals, transpose, &g.upload(&x), 0.0, &mut got);
        let e = rel(&g.download(&got), &want);
        assert!(e <= TOL, "spmm (transposed: {transpose}) through the device's transpose: {e:.3e}");
    }
}

#[test]
fn zero_copy_gathers_read_host_rows_exactly() {
    let Some(mut g) = gpu() else { return };
    let c = Cpu::<f32>::new();
    // rows read from their 128-byte line's start (the default) or their own
    for (per_warp, aligned) in [(1, true), (1, false), (2, true)] {
        g.set_gather_rows_per_warp(per_warp);
        g.set_gather_aligned(aligned);
        for (rows, d) in [(1000, 256), (777, 37), (64, 100), (300, 1000), (500, 4)] {
            let what = format!("width {d}, {per_warp} rows per warp, aligned reads {aligned}");
            let src = random(rows, d, 50 + d as u64);
            let mut t = g.host_table(rows, d).unwrap();
            t.as_mut_slice().copy_from_slice(&src.data);
            // an odd count: the two-row kernel's last warp has one row
            let idx: Vec<u32> = (0..rows as u32 * 2 + 1).map(|i| (i * 7919 + 13) % rows as u32).collect();
            let mut want = random(idx.len() + 5, d, 51);
            let (mut got, mut got_ix, mut got_dev) = (g.upload(&want), g.upload(&want), g.upload(&want));
            c.gather_rows(&src, Rows::Index(&idx), &mut want, 3);
            g.gather_host(&t, Rows::Index(&idx), &mut got, 3);
            assert_eq!(g.download(&got).data, want.data, "zero-copy gather, {what}");
            g.gather_host_indexed(&t, &g.upload_index(&idx), &mut got_ix, 3);
            assert_eq!(g.download(&got_ix).data, want.data, "zero-copy gather, device indices, {what}");
            g.gather_rows(&g.upload(&src), Rows::Index(&idx), &mut got_dev, 3);
            assert_eq!(g.download(&got_dev).data, want.data, "device gather, {what}");
            // on the second stream (a grid smaller than the rows: they stride), then read by
            // a kernel on the main one at once
            let idx: Vec<u32> = idx.iter().cycle().take(idx.len() * 2 + 1).copied().collect();
            let (secs, bytes) = g.side_time();
            let side = g.gather_host_async(&t, &idx);
            assert_eq!(side.dims(), (idx.len(), d), "an arriving gather's shape, {what}");
            let (secs_after, bytes_after) = g.side_time();
            assert_eq!(
                bytes_after - bytes,
                (idx.len() * d * 4) as u64,
                "bytes timed on the second stream, {what}"
            );
            assert!(secs_after > secs, "the gather took time on the second stream, {what}");
            let mut got_side = g.upload(&random(idx.len() + 5, d, 52));
            let side = g.arrived(side);
            g.gather_rows(&side, Rows::Range(0, idx.len()), &mut got_side, 3);
            drop(side);
            let mut want = random(idx.len() + 5, d, 52);
            c.gather_rows(&src, Rows::Index(&idx), &mut want, 3);
            assert_eq!(
                g.download(&got_side).data,
                want.data,
                "zero-copy gather on the second stream, {what}"
            );
            let mut whole = g.output(rows, d);
            g.upload_table(&t, &mut whole);
            assert_eq!(g.download(&whole).data, src.data, "pinned upload, {what}");
        }
    }
}

/// The streams are ordered by hand (cudarc's event tracking is off): a host block written
/// right after its upload was queued still uploads the rows it had, and structures uploaded
/// ahead by another thread reach the main stream's work whole.
#[test]
fn work_crossing_streams_sees_the_data_it_was_given() {
    let Some(g) = gpu() else { return };
    assert!(!g.event_tracking() || std::env::var_os("GRINNDER_CUDA_EVENT_TRACKING").is_some());
    // 256 MiB: a copy of milliseconds; the host overwrites it from the end, where the copy
    // arrives last
    let (rows, cols) = (1 << 18, 256);
    let pattern = |i: usize| (i % 1009) as f32;
    let mut t = g.host_table(rows, cols).unwrap();
    t.as_mut_slice().iter_mut().enumerate().for_each(|(i, x)| *x = pattern(i));
    let up = g.upload_host_rows(&t, rows);
    g.host_block_mut(&mut t).iter_mut().rev().for_each(|x| *x = -1.0);
    let got = g.download(&g.arrived(up));
    let bad = got.data.iter().enumerate().filter(|&(i, &x)| x != pattern(i)).count();
    assert_eq!(bad, 0, "elements overwritten before their upload");
    // a sparse structure and values from another thread, used at once on the main stream
    let s = random_sparse(3000, 2000, 20, 61);
    let x = random(2000, 64, 62);
    let vals = random(s.nnz(), 1, 63);
    let (ds, dv) = std::thread::scope(|sc| sc.spawn(|| (g.sparse_ahead(&s), g.upload_ahead(&vals))).join())
        .expect("the uploading thread");
    let c = Cpu::<f32>::new();
    let mut want = Mat::zeros(3000, 64);
    c.spmm(&c.sparse(&s), &vals, false, &x, 0.0, &mut want);
    let mut out = g.output(3000, 64);
    g.spmm(&ds, &dv, false, &g.upload(&x), 0.0, &mut out);
    assert!(rel(&g.download(&out), &want) < 1e-5, "SpMM over structures uploaded ahead");
}

/// Uploads made ahead pass through page-locked buffers that are reused once their copies are
/// done: many at once from several threads, of many sizes, each arrives whole — while the
/// stream is held, every copy is still in flight, so a buffer handed out again before its copy
/// read it would send another upload's numbers (more are queued than a size class keeps, so
/// takes wait for the oldest, `reuse.rs`); after, the buffers are reused.
#[test]
fn uploads_made_ahead_arrive_whole_through_reused_buffers() {
    let Some(g) = gpu() else { return };
    let upload_from_threads = |round: u64| {
        std::thread::scope(|sc| {
            let threads: Vec<_> = (0..4u64)
                .map(|t| {
                    let g = &g;
                    sc.spawn(move || {
                        (0..80u64)
                            .map(|i| {
                                let n = 1 + ((i * 7919 + t * 131 + round) % 40_000) as usize;
                                let m = random(n, 1, 10_000 * round + 1000 * t + i);
                                let d = g.upload_ahead(&m);
                                (m, d)
                            })
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            threads.into_iter().map(|h| h.join().expect("an uploading thread")).collect::<Vec<_>>()
        })
    };
    // 320 uploads in three size classes: past a class's bound the takes wait for its oldest
    // copy, which the hold keeps from running until the thread below lets it go
    let hold = g.hold_ahead_stream();
    let release = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(300));
        drop(hold);
    });
    let held = upload_from_threads(1);
    release.join().unwrap();
    let after = upload_from_threads(2);
    for (round, sent) in [("held", held), ("after", after)] {
        for (t, uploads) in sent.iter().enumerate() {
            for (i, (m, d)) in uploads.iter().enumerate() {
                assert_eq!(g.download(d).data, m.data, "{round}: thread {t}, upload {i}");
            }
        }
    }
}

#[test]
fn the_memory_budget_is_measured_and_enforced() {
    let Some(mut g) = gpu() else { return };
    g.reset_memory_peak();
    let before = g.device_memory().expect("the CUDA backend reports its memory");
    let m = g.zeros(1 << 20, 64); // 256 MiB
    let after = g.device_memory().unwrap();
    assert!(after.used >= before.used + (256 << 20), "{before:?} → {after:?}");
    assert!(after.peak >= after.used);
    drop(m);
    g.synchronize();
    g.set_memory_budget(Some(before.used + (64 << 20))).unwrap();
    let small = g.zeros(1 << 20, 8); // 32 MiB: within the budget
    drop(small);
    g.synchronize();
    let over = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| g.zeros(1 << 20, 32)));
    let msg = over.err().and_then(|e| e.downcast::<String>().ok()).expect("128 MiB more must be refused");
    assert!(msg.contains("GPU memory budget exceeded"), "{msg}");
}

#[test]
fn an_allocation_the_device_refuses_names_the_fix() {
    let Some(g) = gpu() else { return };
    // 4 TiB: more than any device holds, with no budget to refuse it first
    let over = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| g.zeros(1 << 30, 1 << 10)));
    let payload = over.err().expect("4 TiB must be refused");
    let msg =
        payload.downcast_ref::<&str>().map(|s| s.to_string()).or(payload.downcast_ref::<String>().cloned());
    let msg = msg.expect("a message");
    assert!(msg.starts_with("GPU out of memory") && msg.contains("--parts"), "{msg}");
    // the device goes on working
    let m = g.zeros(4, 4);
    assert_eq!(g.download(&m).data, vec![0.0; 16]);
}

#[test]
fn the_tiered_executor_on_the_gpu_gives_the_cpu_gradients() {
    use grinnder_engine::tiered::{Executor, TieredConfig};
    use grinnder_engine::FeatureNorm;
    use grinnder_partition::Method;
    let Some(g) = gpu() else { return };
    let c = Cpu::<f32>::new();
    let ds =
        generate(&GenConfig::new(preset("arxiv-like").unwrap(), 0.01, 3)).unwrap().into_dataset().unwrap();
    // two GCN layers with hidden wider than the classes: layer 0 runs inside layer 1's transform;
    // with every layer, layer 0's aggregation (host blocks: page-locked, uploaded ahead)
    for (kind, layers, hidden) in [
        (Kind::Gcn, 3, 32),
        (Kind::Sage, 3, 32),
        (Kind::Gat, 3, 32),
        (Kind::Gin, 3, 32),
        (Kind::Gatv2, 3, 32),
        (Kind::Gcnii, 3, 32),
        (Kind::Gcn, 2, 64),
    ] {
        let cfg = ModelConfig {
            input_dropout: 0.0,
            norm: Norm::None,
            residual: false,
            layers,
            hidden,
            ..model_cfg(kind)
        };
        let grads = |p: &mut Vec<&mut grinnder_nn::Param<Cuda>>| -> Vec<Mat<f32>> {
            p.iter().map(|p| g.download(&p.grad)).collect()
        };
        let tc0 = TieredConfig::in_ram(4, Method::Metis { seed: 0 });
        let mut ex_c = Executor::new(&c, &ds, &cfg, FeatureNorm::Row, &tc0).unwrap();
        let mut want = Vec::new();
        for epoch in [2, 3] {
            ex_c.model.zero_grad(&c);
            let (loss, _) = ex_c.forward_backward(epoch).unwrap();
            want.push((
                loss,
                ex_c.model.params_mut().into_iter().map(|p| p.grad.clone()).collect::<Vec<_>>(),
            ));
        }
        // everything in host memory, part of the blocks on the GPU, all of them there, and a
        // budget whose first epoch moves more blocks over
        let used = g.device_memory().unwrap().used;
        let budgets = [
            (Some(0), None),
            (Some(200_000), None),
            (Some(u64::MAX), None),
            (None, Some(used + (400 << 20))),
        ];
        for (device, gpu_mem) in budgets {
            let tc = TieredConfig { device_cache_bytes: device, gpu_mem, ..tc0.clone() };
            let mut ex = Executor::new(&g, &ds, &cfg, FeatureNorm::Row, &tc).unwrap();
            let placed = ex.plan.device.as_ref().unwrap().blocks;
            for (epoch, (loss_c, want)) in [2, 3].into_iter().zip(&want) {
                ex.model.zero_grad(&g);
                let (loss, _) = ex.forward_backward(epoch).unwrap();
                let what = format!("{kind:?} {layers} layers {device:?} {gpu_mem:?} epoch {epoch}");
                assert!((loss - loss_c).abs() <= 1e-5 * loss_c, "{what}: loss {loss} vs {loss_c}");
                let got = grads(&mut ex.model.params_mut());
                for (a, b) in got.iter().zip(want) {
                    let e = rel(a, b);
                    assert!(e <= 1e-4, "{what}: relative error {e:.3e}");
                }
            }
            if gpu_mem.is_some() {
                let after = ex.plan.device.as_ref().unwrap().blocks;
                // on a graph this small the pool's rounding may leave no room to place more
                assert!(after >= placed, "{kind:?}: blocks left the GPU tier ({placed} → {after})");
            }
        }
    }
}

#[test]
fn minibatches_give_the_cpu_gradients() {
    use grinnder_engine::minibatch::batch_forward_backward;
    use grinnder_engine::FeatureNorm;
    use grinnder_engine::{FeatureSource, HostFeatures};
    use grinnder_graph::sample::NeighborSampler;
    let Some(g) = gpu() else { return };
    let c = Cpu::<f32>::new();
    let ds =
        generate(&GenConfig::new(preset("arxiv-like").unwrap(), 0.01, 3)).unwrap().into_dataset().unwrap();
    let host = HostFeatures::new(&ds, FeatureNorm::Row);
    let seeds: Vec<u32> = ds.splits.train.iter().copied().take(64).collect();
    for kind in Kind::ALL {
        let cfg = ModelConfig { layers: 2, residual: false, ..model_cfg(kind) };
        let batch = NeighborSampler::new(vec![5, 3], 2).sample(&ds.graph, &seeds, 1);
        let run = |b: &dyn Fn() -> (f64, Vec<Mat<f32>>)| b();
        let want = run(&|| {
            let mut m = Model::init(&c, cfg.clone(), ds.features.dim, ds.num_classes as usize);
            m.zero_grad(&c);
            let x = host.gather(&c, batch.input_nodes());
            let (loss, _) = batch_forward_backward(&c, &mut m, &ds, &batch, x, 3);
            (loss, m.params_mut().into_iter().map(|p| p.grad.clone()).collect())
        });
        let mut m = Model::init(&g, cfg.clone(), ds.features.dim, ds.num_classes as usize);
        m.zero_grad(&g);
        let x = host.gather(&g, batch.input_nodes());
        let (loss, _) = batch_forward_backward(&g, &mut m, &ds, &batch, x, 3);
        assert!((loss - want.0).abs() <= 1e-5 * want.0, "{kind:?}: loss {loss} vs {}", want.0);
        for (p, w) in m.params_mut().into_iter().zip(&want.1) {
            let e = rel(&g.download(&p.grad), w);
            assert!(e <= 1e-4, "{kind:?} {}: relative error {e:.3e}", p.name);
        }
    }
}

/// Each epoch's training loss of the mini-batch trainer on `b`, its rows from `rows` (the
/// default source where `None`).
fn epoch_losses<B: Backend>(
    b: &B,
    ds: &grinnder_graph::Dataset,
    cfg: &grinnder_engine::TrainConfig,
    mb: &grinnder_engine::minibatch::MiniBatchConfig,
    rows: Option<&dyn grinnder_engine::FeatureSource<B>>,
) -> Vec<f64> {
    let mut seen = Vec::new();
    let mode = grinnder_engine::Mode::MiniBatch { config: mb.clone(), features: rows };
    let mut t = grinnder_engine::Trainer::new(b, ds, cfg.clone(), mode).unwrap();
    t.fit(&mut |m| seen.push(m.loss)).unwrap();
    seen
}

/// The CLI's `--feature-access zero-copy` source, rebuilt here (the CLI is a binary): rows
/// gathered by GPU threads from mapped host memory on the second stream, labels read by the
/// loss kernel by node id.
struct ZeroCopy {
    table: grinnder_cuda::HostTable,
    labels: grinnder_cuda::HostLabels,
}

impl grinnder_engine::FeatureSource<Cuda> for ZeroCopy {
    fn gather(&self, g: &Cuda, ids: &[u32]) -> grinnder_cuda::DMat {
        g.arrived(g.gather_host_async(&self.table, ids))
    }
    fn start(&self, g: &Cuda, ids: &[u32]) -> Option<grinnder_cuda::Arriving> {
        Some(g.gather_host_async(&self.table, ids))
    }
    fn loss(
        &self,
        g: &Cuda,
        logits: &grinnder_cuda::DMat,
        ids: &[u32],
        scale: f64,
        grad: &mut grinnder_cuda::DMat,
    ) -> Option<grinnder_cuda::CudaLoss> {
        Some(g.cross_entropy_mapped(logits, &self.labels, ids, scale, grad))
    }
    fn describe(&self) -> String {
        "zero-copy (test)".into()
    }
}

#[test]
fn the_minibatch_trainer_gives_the_cpu_losses() {
    // the whole trainer: sampling threads putting blocks on the device ahead, rows staged and
    // uploaded or gathered by the GPU, and steps queued without waiting for the device (each
    // batch's loss read after the next is queued): every epoch's loss as on the CPU
    use grinnder_engine::{FeatureNorm, TrainConfig};
    use grinnder_engine::{FeatureSource, MiniBatchConfig, Sampler};
    use grinnder_nn::OptimConfig;
    let Some(g) = gpu() else { return };
    let ds =
        generate(&GenConfig::new(preset("arxiv-like").unwrap(), 0.01, 3)).unwrap().into_dataset().unwrap();
    for kind in [Kind::Sage, Kind::Gcn] {
        let cfg = TrainConfig {
            lr_schedule: Default::default(),
            patience: None,
            model: ModelConfig { layers: 2, ..model_cfg(kind) },
            optim: OptimConfig::Adam { lr: 0.01, weight_decay: 0.0 },
            epochs: 3,
            eval_every: 0,
            feature_norm: FeatureNorm::Row,
            feature_shift: None,
        };
        let mb = MiniBatchConfig {
            fanouts: vec![5, 3],
            sampler: Sampler::Neighbor,
            batch_size: 100,
            eval_parts: 1,
            max_batches: None,
            loader_threads: Some(3),
        };
        let want = epoch_losses(&Cpu::<f32>::new(), &ds, &cfg, &mb, None);
        // the staged copy path, then zero-copy: every batch's rows gathered by the GPU on the
        // second stream (their ids through reused page-locked buffers), the loss reading its
        // node ids and labels from mapped memory
        let host = grinnder_engine::HostFeatures::new(&ds, FeatureNorm::Row);
        let mut table = g.host_table(ds.num_nodes(), host.dim()).unwrap();
        host.write_rows(None, table.as_mut_slice());
        let zc = ZeroCopy { table, labels: g.host_labels(&ds.labels, ds.num_classes).unwrap() };
        for (how, rows) in [("copy", None), ("zero-copy", Some(&zc as &dyn FeatureSource<Cuda>))] {
            let got = epoch_losses(&g, &ds, &cfg, &mb, rows);
            assert_eq!(got.len(), 3);
            for (e, (l, w)) in got.iter().zip(&want).enumerate() {
                assert!((l - w).abs() <= 1e-4 * w, "{kind:?} {how} epoch {e}: loss {l} vs {w}");
            }
        }
    }
}

#[test]
fn features_reach_the_gpu_chunk_by_chunk_exactly() {
    use grinnder_engine::features::{features, features_in_chunks};
    use grinnder_engine::FeatureNorm;
    let Some(g) = gpu() else { return };
    let c = Cpu::<f32>::new();
    let ds =
        generate(&GenConfig::new(preset("arxiv-like").unwrap(), 0.01, 5)).unwrap().into_dataset().unwrap();
    let row = ds.features.dim * 4;
    for norm in [FeatureNorm::None, FeatureNorm::Row] {
        let want = features(&c, &ds, norm);
        // chunks of 7 rows (the last one short), of one row, and all at once
        for chunk in [Some(7 * row + 3), Some(row), Some(usize::MAX / 2), None] {
            let got = g.download(&features_in_chunks(&g, &ds, norm, chunk));
            assert_eq!(got.data, want.data, "{norm:?}, chunks of {chunk:?} bytes");
        }
    }
}

#[test]
fn models_give_the_cpu_gradients() {
    let Some(g) = gpu() else { return };
    let c = Cpu::<f32>::new();
    let ds =
        generate(&GenConfig::new(preset("arxiv-like").unwrap(), 0.01, 3)).unwrap().into_dataset().unwrap();
    let x = Mat::from_vec(ds.num_nodes(), ds.features.dim, ds.features.data.to_f32_vec());
    let n = ds.splits.train.len() as f64;
    for kind in Kind::ALL {
        let cfg = model_cfg(kind);
        let run = |b: &dyn Fn() -> (f64, Vec<(String, Mat<f32>)>)| b();
        let cpu = run(&|| {
            let gr = Graph::new(&c, &ds.graph);
            let mut m = Model::init(&c, cfg.clone(), ds.features.dim, ds.num_classes as usize);
            m.prepare(&c, &gr, &x);
            let (logits, tape) = m.forward(&c, &gr, &x, true, 2);
            let mut dl = c.zeros(logits.rows, logits.cols);
            let (loss, _) = c.cross_entropy(&logits, &ds.labels, &ds.splits.train, 1.0 / n, &mut dl);
            m.backward(&c, &gr, &x, tape, dl);
            (loss, m.params_mut().into_iter().map(|p| (p.name.clone(), c.download(&p.grad))).collect())
        });
        let gpu_run = {
            let gr = Graph::new(&g, &ds.graph);
            let xg = g.upload(&x);
            let mut m = Model::init(&g, cfg.clone(), ds.features.dim, ds.num_classes as usize);
            m.prepare(&g, &gr, &xg);
            let (logits, tape) = m.forward(&g, &gr, &xg, true, 2);
            let mut dl = g.zeros(logits.rows, logits.cols);
            let (loss, _) = g.cross_entropy(&logits, &ds.labels, &ds.splits.train, 1.0 / n, &mut dl);
            m.backward(&g, &gr, &xg, tape, dl);
            (
                loss,
                m.params_mut().into_iter().map(|p| (p.name.clone(), g.download(&p.grad))).collect::<Vec<_>>(),
            )
        };
        assert!((cpu.0 - gpu_run.0).abs() <= 1e-5 * cpu.0, "{kind:?}: loss {} vs {}", gpu_run.0, cpu.0);
        for ((name, a), (_, b)) in gpu_run.1.iter().zip(&cpu.1) {
            let e = rel(a, b);
            assert!(e <= 1e-4, "{kind:?} {name}: relative error {e:.3e}");
        }
    }
}

/// NCCL between two GPUs (ranks as threads, one GPU each): the matrix all-to-all delivers each
/// rank's rows and the all-reduce gives the sum on both; the partition-parallel executor over
/// NCCL gives the CPU's one-process gradients, the same bits on both ranks, with its blocks in
/// host memory and on the GPUs. Skipped with fewer than two GPUs.
#[test]
fn nccl_partition_parallel_on_two_gpus_gives_the_cpu_gradients() {
    use grinnder_dist::{Comm, ThreadComm};
    use grinnder_engine::tiered::{DeviceComms, DistConfig, Executor, TieredConfig};
    use grinnder_engine::FeatureNorm;
    use grinnder_partition::Method;
    use grinnder_tensor::MatComm;
    if grinnder_cuda::device_count() < 2 || !grinnder_cuda::nccl_present() {
        eprintln!("skipped: needs two GPUs and NCCL ({} GPU(s))", grinnder_cuda::device_count());
        return;
    }
    let c = Cpu::<f32>::new();
    let ds =
        generate(&GenConfig::new(preset("arxiv-like").unwrap(), 0.01, 3)).unwrap().into_dataset().unwrap();
    // the collectives themselves
    let sums = ThreadComm::run(2, |comm| {
        let g = Cuda::new(comm.rank()).unwrap();
        let nccl = grinnder_cuda::Nccl::new(&g, comm).unwrap();
        let me = comm.rank();
        let send = (0..2).map(|r| g.upload(&random(3 + r + me, 5, (10 * me + r) as u64))).collect();
        let got = nccl.all_to_all(&g, send, &[3 + me, 4 + me], 5);
        for (r, m) in got.iter().enumerate() {
            let want = random(3 + me + r, 5, (10 * r + me) as u64);
            assert_eq!(g.download(m).data, want.data, "rank {me}: rows from rank {r}");
        }
        let mut m = g.upload(&random(7, 9, 100 + me as u64));
        nccl.all_reduce_sum(&g, &mut [&mut m]);
        // both were timed on the device's clock, read once
        assert!(nccl.keeps_time());
        let secs = nccl.take_seconds();
        assert!(secs > 0.0 && secs < 10.0, "rank {me}: NCCL's time {secs} s");
        assert_eq!(nccl.take_seconds(), 0.0, "rank {me}: taken already");
        g.download(&m)
    });
    let want: Vec<f32> =
        random(7, 9, 100).data.iter().zip(&random(7, 9, 101).data).map(|(a, b)| a + b).collect();
    for s in &sums {
        assert_eq!(s.data, want, "all-reduce of two ranks");
    }
    for kind in Kind::ALL {
        let cfg = ModelConfig { input_dropout: 0.0, norm: Norm::None, residual: false, ..model_cfg(kind) };
        let tc0 = TieredConfig::in_ram(4, Method::Metis { seed: 0 });
        let mut ex_c = Executor::new(&c, &ds, &cfg, FeatureNorm::Row, &tc0).unwrap();
        ex_c.model.zero_grad(&c);
        let (loss_c, _) = ex_c.forward_backward(2).unwrap();
        let want: Vec<Mat<f32>> = ex_c.model.params_mut().into_iter().map(|p| p.grad.clone()).collect();
        for device in [Some(0), Some(u64::MAX)] {
            let tc = TieredConfig { device_cache_bytes: device, ..tc0.clone() };
            let got = ThreadComm::run(2, |comm| {
                let g = Cuda::new(comm.rank()).unwrap();
                let nccl = grinnder_cuda::Nccl::new(&g, comm).unwrap();
                let dist = DistConfig {
                    comm,
                    ranks_per_server: 2,
                    reduce: None,
                    device: Some(DeviceComms { comm: &nccl, reduce: &nccl }),
                    groups: None,
                };
                let mut ex = Executor::new_dist(&g, &ds, &cfg, FeatureNorm::Row, &tc, Some(dist)).unwrap();
                ex.model.zero_grad(&g);
                let (loss, _) = ex.forward_backward(2).unwrap();
                let mut loss = [loss];
                ex.reduce(&mut loss);
                ex.reduce_gradients();
                let comm_stats = ex.take_stats().comm.unwrap();
                let grads: Vec<Mat<f32>> =
                    ex.model.params_mut().iter().map(|p| g.download(&p.grad)).collect();
                assert!(comm_stats.comm_s > 0.0, "rank {}: NCCL's time counted", comm.rank());
                (loss[0], grads, comm_stats.halo_intra_bytes)
            });
            for (r, (loss, grads, halo)) in got.iter().enumerate() {
                let what = format!("{kind:?} device blocks {device:?}, rank {r} of 2 over NCCL");
                assert!((loss - loss_c).abs() <= 1e-5 * loss_c, "{what}: loss {loss} vs {loss_c}");
                assert!(*halo > 0, "{what}: halo rows travelled");
                for (i, (a, b)) in grads.iter().zip(&want).enumerate() {
                    let e = rel(a, b);
                    assert!(e <= 1e-4, "{what}: parameter {i} relative error {e:.3e}");
                    assert!(a.data == got[0].1[i].data, "{what}: parameter {i} differs from rank 0's");
                }
            }
        }
    }
}

/// Blocks of a bf16 store cross the bus as bf16, rounded and widened on the device: the bits
/// of the host's `to_bf16` and `from_bf16` over more elements than one device temporary holds
/// (ties, the largest finite value, NaNs, subnormals, random patterns); a tiered epoch over
/// bf16 blocks in host memory gives the CPU's losses and gradients over the same blocks, and
/// moves the bytes the cost model predicts: two an element of a stored block.
#[test]
fn bf16_blocks_cross_the_bus_as_the_host_rounds_them() {
    use grinnder_engine::tiered::{Executor, TierDtype, TieredConfig};
    use grinnder_engine::FeatureNorm;
    use grinnder_partition::Method;
    use grinnder_tensor::scalar::{from_bf16, to_bf16};
    let Some(g) = gpu() else { return };
    assert!(g.converts_bf16());
    let special =
        [0x3f80_8000u32, 0x3f81_8000, 0x7f7f_ffff, 0x7f80_0000, 0xff80_0000, 0x7f80_0001, 0xffc1_2345];
    let special = special.into_iter().chain([0x0000_0001, 0x807f_ffff, 0x8000_0000]);
    let n = (1 << 24) + 12_345;
    let mut s = 0x9E37_79B9u32;
    let xs: Vec<f32> = special
        .chain(std::iter::repeat_with(|| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            s
        }))
        .take(n)
        .map(f32::from_bits)
        .collect();
    let m = g.upload(&Mat::from_vec(n, 1, xs.clone()));
    let mut down = Vec::new();
    g.download_bf16_with(&m, &mut |h| down = h.to_vec());
    let want: Vec<u16> = xs.iter().map(|&x| to_bf16(x)).collect();
    let wrong = down.iter().zip(&want).position(|(a, b)| a != b);
    assert!(
        wrong.is_none(),
        "element {wrong:?}: {:#x} rounded to {:#x}",
        xs[wrong.unwrap()].to_bits(),
        down[wrong.unwrap()]
    );
    let up = g.upload_bf16_with(n, 1, &mut |h| h.copy_from_slice(&want));
    let got = g.download(&up).data;
    assert!(got.iter().zip(&want).all(|(x, &h)| x.to_bits() == from_bf16(h).to_bits()), "widened exactly");

    let c = Cpu::<f32>::new();
    let ds =
        generate(&GenConfig::new(preset("arxiv-like").unwrap(), 0.01, 3)).unwrap().into_dataset().unwrap();
    // with no host budget the blocks are page-locked bf16 tables the device writes and reads;
    // with a cache size the store keeps them (the CPU's store either way)
    let runs = [(Kind::Gcn, 3, None), (Kind::Sage, 2, None), (Kind::Gat, 2, None)];
    let stored =
        [(Kind::Gcn, 3, Some(1u64 << 40)), (Kind::Sage, 2, Some(1 << 40)), (Kind::Gat, 2, Some(1 << 40))];
    for (kind, layers, cache_bytes) in runs.into_iter().chain(stored) {
        let cfg =
            ModelConfig { input_dropout: 0.0, norm: Norm::None, residual: false, layers, ..model_cfg(kind) };
        let tc = TieredConfig {
            tier_dtype: TierDtype::Bf16,
            device_cache_bytes: Some(0),
            cache_bytes,
            ..TieredConfig::in_ram(4, Method::Metis { seed: 0 })
        };
        let kind = (kind, if cache_bytes.is_none() { "page-locked" } else { "stored" });
        let mut ex_c = Executor::new(&c, &ds, &cfg, FeatureNorm::Row, &tc).unwrap();
        let mut ex = Executor::new(&g, &ds, &cfg, FeatureNorm::Row, &tc).unwrap();
        let predicted = ex.predict_epoch(None).expect("one process").traffic;
        let predicted_c = ex_c.predict_epoch(None).expect("one process").traffic;
        assert!(predicted.download_bytes < predicted_c.download_bytes, "{kind:?}: bf16 on the bus");
        assert_eq!(
            predicted.pinned_upload_bytes > 0,
            cache_bytes.is_none(),
            "{kind:?}: where the blocks live"
        );
        for epoch in [0, 1] {
            ex_c.model.zero_grad(&c);
            ex.model.zero_grad(&g);
            let (loss_c, _) = ex_c.forward_backward(epoch).unwrap();
            let (loss, _) = ex.forward_backward(epoch).unwrap();
            let stats = ex.take_stats();
            // a tie that f32 arithmetic on the two backends breaks differently moves a block
            // element by one bf16 step (2^-8 of it): the bounds allow a few such, not a wrong row
            assert!(
                (loss - loss_c).abs() <= 1e-4 * loss_c,
                "{kind:?} epoch {epoch}: loss {loss} vs {loss_c}"
            );
            let want: Vec<Mat<f32>> = ex_c.model.params_mut().into_iter().map(|p| p.grad.clone()).collect();
            for (p, w) in ex.model.params_mut().into_iter().zip(&want) {
                let e = rel(&g.download(&p.grad), w);
                assert!(e <= 1e-3, "{kind:?} epoch {epoch}: relative gradient error {e:.3e}");
            }
            if epoch == 1 {
                assert_eq!(predicted.upload_bytes, stats.upload_bytes, "{kind:?}: bytes to the GPU");
                assert_eq!(predicted.download_bytes, stats.download_bytes, "{kind:?}: bytes from the GPU");
            }
        }
    }
}

#[test]
fn bf16_host_tables_hold_the_hosts_bits() {
    use grinnder_tensor::scalar::{from_bf16, to_bf16};
    let Some(g) = gpu() else { return };
    let c = Cpu::<f32>::new();
    // 256 wide: 16-byte pieces of a row; 7 wide: element by element
    for d in [256usize, 7] {
        let rows = 3_000;
        let x = random(rows, d, 71);
        let want: Vec<u16> = x.data.iter().map(|&v| to_bf16(v)).collect();
        let widen = |h: &[u16]| Mat::from_vec(rows, d, h.iter().map(|&b| from_bf16(b)).collect());
        // a download into the table rounds as the host does; from a row offset too
        let big = g.upload(&random(rows + 5, d, 72));
        let mut t = g.new_host_block_bf16(rows, d).expect("page-locked memory");
        assert!(t.is_bf16());
        g.download_into_host_block(&big, 5, &mut t);
        let shifted: Vec<u16> = random(rows + 5, d, 72).data[5 * d..].iter().map(|&v| to_bf16(v)).collect();
        assert!(t.as_u16() == &shifted[..], "d {d}: downloaded from row 5");
        let dx = g.upload(&x);
        g.download_into_host_block(&dx, 0, &mut t);
        assert!(t.as_u16() == &want[..], "d {d}: downloaded rows rounded to the host's bits");
        let t2 = g.host_block_bf16(x.clone()).unwrap_or_else(|_| panic!("page-locked memory"));
        assert!(t2.as_u16() == &want[..], "d {d}: rounded on the host");
        // gathers and uploads widen exactly
        let idx: Vec<u32> = (0..rows as u32).rev().step_by(3).collect();
        let mut out = g.zeros(idx.len() + 2, d);
        g.gather_host_block(&t, Rows::Index(&idx), &mut out, 2);
        let got = g.download(&out);
        let whole = widen(&want);
        let mut expect = Mat::zeros(idx.len() + 2, d);
        c.gather_rows(&whole, Rows::Index(&idx), &mut expect, 2);
        assert!(
            got.data.iter().zip(&expect.data).all(|(a, b)| a.to_bits() == b.to_bits()),
            "d {d}: gathered"
        );
        let up = g.download(&g.arrived(g.upload_host_block(&t)));
        assert!(up.data.iter().zip(&whole.data).all(|(a, b)| a.to_bits() == b.to_bits()), "d {d}: uploaded");
        // adds: the f32 sum of the held value and the added one, rounded once
        let add = random(idx.len(), d, 73);
        g.scatter_add_host_block(&g.upload(&add), 0, Rows::Index(&idx), &mut t);
        let mut host = want.clone();
        for (i, &r) in idx.iter().enumerate() {
            for j in 0..d {
                let h = &mut host[r as usize * d + j];
                *h = to_bf16(from_bf16(*h) + add.data[i * d + j]);
            }
        }
        assert!(t.as_u16() == &host[..], "d {d}: rows added as the host adds them");
        g.scatter_add_host_block(&g.upload(&x), 0, Rows::Range(0, rows), &mut t);
        for (h, &v) in host.iter_mut().zip(&x.data) {
            *h = to_bf16(from_bf16(*h) + v);
        }
        assert!(t.as_u16() == &host[..], "d {d}: a range added");
        g.zero_host_block(&mut t);
        assert!(t.as_u16().iter().all(|&h| h == 0), "d {d}: zeroed");
    }
}
