//! `grinnder bench`: microbenchmarks, one JSON object each on stdout. Every figure is the median
//! of `--reps` timed runs after one warm-up (on a GPU, bracketed by device synchronisations).

use grinnder_tensor::ops::*;
use std::time::Instant;

use anyhow::Context;
use grinnder_cuda::{Cuda, PageLock, SpmmKernel};
use grinnder_graph::norm;
use grinnder_graph::rng::{hash_key, unit_f64, Stream};
use grinnder_tensor::{Mat, Rows, SparseMatrix, Unary};
use rayon::prelude::*;
use serde::Serialize;
use serde_json::json;

use crate::args::{BenchArgs, BenchWhat};
use crate::plan::Device;

/// One timed method: median seconds and the rate of its payload bytes.
#[derive(Serialize)]
struct Timing {
    s: f64,
    gb_per_s: f64,
}

/// `f` once to warm up, then `reps` times: the run in the middle by `key`.
fn median_run<T>(reps: usize, key: impl Fn(&T) -> f64, mut f: impl FnMut() -> T) -> T {
    f();
    let mut runs: Vec<T> = (0..reps.max(1)).map(|_| f()).collect();
    runs.sort_by(|a, b| key(a).total_cmp(&key(b)));
    runs.swap_remove(runs.len() / 2)
}

fn median_of(reps: usize, bytes: u64, mut f: impl FnMut()) -> Timing {
    let s = median_run(
        reps,
        |&s| s,
        || {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        },
    );
    Timing { s, gb_per_s: bytes as f64 / s / 1e9 }
}

pub fn run(a: BenchArgs) -> anyhow::Result<()> {
    if let BenchWhat::Sample { input, fanout, batch_size, loader_threads, max_batches } = &a.what {
        let out = sample(a.reps, input, fanout, *batch_size, *loader_threads, *max_batches)?;
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    if let BenchWhat::Rates { storage_dir, out } = &a.what {
        return rates(a.device.as_deref().unwrap_or("cpu"), storage_dir.as_deref(), out.as_deref());
    }
    let n = match Device::parse(a.device.as_deref().unwrap_or("cuda"))? {
        Device::Cuda(n) => n,
        Device::Cpu => anyhow::bail!("grinnder bench measures a GPU: use --device cuda[:N]"),
    };
    let mut g = Cuda::new(n).with_context(|| format!("cannot use CUDA device {n}"))?;
    let out = match a.what {
        BenchWhat::Gather { rows, width, table_rows } => gather(&mut g, a.reps, rows, width, table_rows)?,
        BenchWhat::Transfer { bytes } => transfer(&g, a.reps, bytes)?,
        BenchWhat::Spmm { input, widths } => spmm(&mut g, a.reps, &input, &widths)?,
        BenchWhat::Gemm { m, k, n, vary } => gemm(&g, a.reps, m, k, n, vary)?,
        BenchWhat::Launches { ops } => launches(&g, a.reps, ops)?,
        BenchWhat::Sample { .. } | BenchWhat::Rates { .. } => unreachable!("run above"),
    };
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(())
}

/// `grinnder bench rates`: the cost model's rates on `device`, written to `out` (default: where
/// `info` and `train` look for them) and printed.
fn rates(
    device: &str,
    storage_dir: Option<&std::path::Path>,
    out: Option<&std::path::Path>,
) -> anyhow::Result<()> {
    let device = Device::parse(device)?;
    let (rates, kind) = match device {
        Device::Cpu => {
            let b = grinnder_tensor::Cpu::<f32>::new();
            (grinnder_engine::tiered::measure_rates(&b, "cpu", false, storage_dir, 1)?, "cpu")
        }
        Device::Cuda(n) => {
            let g = Cuda::new(n).with_context(|| format!("cannot use CUDA device {n}"))?;
            // larger problems: a GPU finishes the CPU's in microseconds
            (
                grinnder_engine::tiered::measure_rates(&g, &format!("cuda:{n}"), false, storage_dir, 16)?,
                "cuda",
            )
        }
    };
    let path = match out {
        Some(p) => p.to_path_buf(),
        None => crate::rates::default_rates_file(kind)
            .context("no cache directory (neither XDG_CACHE_HOME nor HOME is set): give --out")?,
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let text = serde_json::to_string_pretty(&rates)?;
    grinnder_graph::io::files::write_whole(&path, text.as_bytes())
        .with_context(|| format!("cannot write {}", path.display()))?;
    println!("{text}");
    tracing::info!("rates written to {} (info and train read them from there)", path.display());
    Ok(())
}

/// Random rows of a pinned host table into GPU memory, four ways (see `BenchWhat::Gather`).
fn gather(
    g: &mut Cuda,
    reps: usize,
    rows: usize,
    width: usize,
    table_rows: usize,
) -> anyhow::Result<serde_json::Value> {
    anyhow::ensure!(rows > 0 && width > 0 && table_rows > 0, "rows, width and table rows must be positive");
    let mut table = g.host_table(table_rows, width)?;
    table.as_mut_slice().par_iter_mut().enumerate().for_each(|(i, v)| *v = (i % 1009) as f32 * 0.5);
    let mut s = Stream::new(&[7, 1]);
    let idx: Vec<u32> = (0..rows).map(|_| s.below(table_rows as u64) as u32).collect();
    let bytes = (rows * width * 4) as u64;
    let mut out = g.output(rows, width);
    let mut staging = g.host_table(rows, width)?;
    let cpu_gather = |dst: &mut [f32], src: &[f32]| {
        dst.par_chunks_mut(width).zip(idx.par_iter()).for_each(|(o, &r)| {
            o.copy_from_slice(&src[r as usize * width..(r as usize + 1) * width]);
        });
    };
    let pinned = median_of(reps, bytes, || {
        cpu_gather(staging.as_mut_slice(), table.as_slice());
        g.upload_table(&staging, &mut out);
        g.synchronize();
    });
    let pageable = median_of(reps, bytes, || {
        let mut m = Mat::<f32>::zeros(rows, width);
        cpu_gather(&mut m.data, table.as_slice());
        out = g.upload_owned(m);
        g.synchronize();
    });
    let copy = median_of(reps, bytes, || {
        g.upload_table(&staging, &mut out);
        g.synchronize();
    });
    let zero_copy = median_of(reps, bytes, || {
        g.gather_host(&table, Rows::Index(&idx), &mut out, 0);
        g.synchronize();
    });
    // each row read from its own start instead of its 128-byte line's (the same where rows are
    // whole lines)
    g.set_gather_aligned(false);
    let zero_copy_unaligned = median_of(reps, bytes, || {
        g.gather_host(&table, Rows::Index(&idx), &mut out, 0);
        g.synchronize();
    });
    g.set_gather_aligned(true);
    let dev_idx = g.upload_index(&idx);
    let resident = |g: &Cuda, out: &mut grinnder_cuda::DMat| {
        median_of(reps, bytes, || {
            g.gather_host_indexed(&table, &dev_idx, out, 0);
            g.synchronize();
        })
    };
    let zero_copy_resident_index = resident(g, &mut out);
    g.set_gather_rows_per_warp(2);
    let zero_copy_resident_index_2_rows_per_warp = resident(g, &mut out);
    g.set_gather_rows_per_warp(1);
    // exactness: the zero-copy rows are the CPU-gathered ones
    cpu_gather(staging.as_mut_slice(), table.as_slice());
    anyhow::ensure!(
        g.download(&out).data == staging.as_slice(),
        "zero-copy gather differs from the CPU gather"
    );
    let on_gpu = {
        let mut whole = g.output(table_rows, width);
        g.upload_table(&table, &mut whole);
        median_of(reps, bytes, || {
            g.gather_rows(&whole, Rows::Index(&idx), &mut out, 0);
            g.synchronize();
        })
    };
    Ok(json!({
        "bench": "gather", "rows": rows, "width": width, "table_rows": table_rows, "bytes": bytes,
        "cpu_gather_pinned_copy": pinned,
        "cpu_gather_pageable_copy": pageable,
        "zero_copy": zero_copy,
        "zero_copy_unaligned_reads": zero_copy_unaligned,
        "zero_copy_resident_index": zero_copy_resident_index,
        "zero_copy_resident_index_2_rows_per_warp": zero_copy_resident_index_2_rows_per_warp,
        "pcie_copy_contiguous": copy,
        "gather_from_gpu_memory": on_gpu,
        "zero_copy_over_cpu_gather": pinned.s / zero_copy.s,
        "threads": rayon::current_num_threads(),
    }))
}

/// `C (m × n) = op(A)·op(B)` with inner dimension `k`, for each transposition of the operands,
/// in FP32 and TF32: milliseconds and TFLOP/s (the result checked against the CPU's on its
/// first two rows).
fn gemm(
    g: &Cuda,
    reps: usize,
    m: usize,
    k: usize,
    n: usize,
    vary: bool,
) -> anyhow::Result<serde_json::Value> {
    anyhow::ensure!(m > 0 && k > 0 && n > 0, "--m, --k and --n must be positive");
    // operands drawn in parallel (a hash per element): a few GB take seconds, not minutes
    let host = |rows: usize, cols: usize, seed: u64| {
        let data = (0..rows * cols)
            .into_par_iter()
            .map(|i| unit_f64(hash_key(&[seed, i as u64])) as f32 - 0.5)
            .collect();
        Mat::from_vec(rows, cols, data)
    };
    let flops = 2.0 * (m * n * k) as f64;
    let mut rows = Vec::new();
    for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
        let a = host(if ta { k } else { m }, if ta { m } else { k }, 1);
        let b = host(if tb { n } else { k }, if tb { k } else { n }, 2);
        let (da, db) = (g.upload(&a), g.upload(&b));
        let mut c = g.output(m, n);
        // the first rows of C on the CPU, in f64
        let at = |i: usize, j: usize| if ta { a.data[j * m + i] } else { a.data[i * k + j] };
        let bt = |i: usize, j: usize| if tb { b.data[j * k + i] } else { b.data[i * n + j] };
        let check = m.min(2);
        let want: Vec<f64> = (0..check * n)
            .into_par_iter()
            .map(|e| (0..k).map(|l| f64::from(at(e / n, l)) * f64::from(bt(l, e % n))).sum())
            .collect();
        // with `vary`, call i computes the first m - i rows of C (A's first rows, or the
        // columns of Aᵀ: a copy of A cut to shape, made before the timing)
        let cut = |i: usize| {
            let r = m - i.min(m - 1);
            let sub = if ta {
                Mat::from_vec(k, r, (0..k).flat_map(|l| a.data[l * m..l * m + r].to_vec()).collect())
            } else {
                Mat::from_vec(r, k, a.data[..r * k].to_vec())
            };
            (g.upload(&sub), g.output(r, n))
        };
        for tf32 in [false, true] {
            g.set_tf32(tf32)?;
            let mut shapes: Vec<_> = if vary { (1..=reps.max(1) + 1).map(cut).collect() } else { Vec::new() };
            let t = median_of(reps, 0, || {
                match shapes.pop() {
                    Some((sa, mut sc)) => g.gemm(1.0, &sa, ta, &db, tb, 0.0, &mut sc),
                    None => g.gemm(1.0, &da, ta, &db, tb, 0.0, &mut c),
                }
                g.synchronize();
            });
            g.gemm(1.0, &da, ta, &db, tb, 0.0, &mut c);
            let got = g.download(&c);
            let err = want.iter().zip(&got.data).map(|(w, &g)| (f64::from(g) - w).abs()).fold(0.0, f64::max);
            rows.push(json!({
                "ta": ta, "tb": tb, "tf32": tf32, "ms": t.s * 1e3, "tflop_s": flops / t.s / 1e12,
                "max_abs_err_first_rows": err,
            }));
        }
    }
    g.set_tf32(false)?;
    Ok(json!({ "bench": "gemm", "m": m, "k": k, "n": n, "vary": vary, "runs": rows }))
}

/// Host and device time per round of small operations (see `BenchWhat::Launches`), with one
/// stream and with the second stream made: microseconds per round to queue them, and until the
/// device has finished them.
fn launches(g: &Cuda, reps: usize, ops: usize) -> anyhow::Result<serde_json::Value> {
    anyhow::ensure!(ops > 0, "--ops must be at least 1");
    let x = g.upload(&Mat::from_vec(256, 64, vec![0.5f32; 256 * 64]));
    let measure = || {
        let (queued, done) = median_run(
            reps,
            |r: &(f64, f64)| r.1,
            || {
                g.synchronize();
                let t = Instant::now();
                for _ in 0..ops {
                    let mut y = g.output(256, 64);
                    g.copy(&x, &mut y);
                    g.unary(Unary::Relu, &mut y);
                }
                let queued = t.elapsed().as_secs_f64();
                g.synchronize();
                (queued, t.elapsed().as_secs_f64())
            },
        );
        json!({ "queue_us_per_round": queued / ops as f64 * 1e6, "done_us_per_round": done / ops as f64 * 1e6 })
    };
    let one = measure();
    // the second stream, as the zero-copy gathers and host-block uploads make it
    let t = g.host_table(1, 64)?;
    drop(g.gather_host_async(&t, &[0]));
    g.synchronize();
    let two = measure();
    Ok(json!({
        "bench": "launches", "ops": ops, "cudarc_event_tracking": g.event_tracking(),
        "one_stream": one, "second_stream_made": two,
    }))
}

/// Copies of `bytes` each way, from pageable and from pinned host memory; page-locking `bytes`
/// each way [`PageLock`] knows.
fn transfer(g: &Cuda, reps: usize, bytes: u64) -> anyhow::Result<serde_json::Value> {
    let n = (bytes / 4).max(1) as usize;
    let (rows, cols) = (n / 256 + 1, 256);
    let bytes = (rows * cols * 4) as u64;
    let mut pinned = g.host_table(rows, cols)?;
    let mut dev = g.output(rows, cols);
    let pageable = Mat::<f32>::zeros(rows, cols);
    let h2d_pinned = median_of(reps, bytes, || {
        g.upload_table(&pinned, &mut dev);
        g.synchronize();
    });
    let d2h_pinned = median_of(reps, bytes, || {
        g.download_table(&dev, 0, &mut pinned);
        g.synchronize();
    });
    // device threads adding rows into the page-locked table over the bus (a gradient's halo
    // rows into their owners' host blocks): rows in a scattered order, each read and written
    let order: Vec<u32> = (0..rows as u32).map(|i| (i as u64 * 2654435761 % rows as u64) as u32).collect();
    let distinct = {
        let mut o = order.clone();
        o.sort_unstable();
        o.dedup();
        o.len() == rows
    };
    let scatter_rows = if distinct { Rows::Index(&order) } else { Rows::Range(0, rows) };
    let add_pinned = median_of(reps, bytes, || {
        g.scatter_add_table(&dev, 0, scatter_rows, &mut pinned);
        g.synchronize();
    });
    let h2d_pageable = median_of(reps, bytes, || {
        dev = g.upload(&pageable);
        g.synchronize();
    });
    let d2h_pageable = median_of(reps, bytes, || drop(g.download(&dev)));
    drop(pinned);
    // making page-locked memory (host blocks): each way, a new table each time, then a
    // download into it (what the first blocks do), and the table freed
    let mut page_lock = serde_json::Map::new();
    for (name, how) in [("alloc", PageLock::Alloc), ("register", PageLock::Register)] {
        let (mut make, mut fill, mut free) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..reps {
            let t = Instant::now();
            let mut h = g.host_table_by(rows, cols, how)?;
            make.push(t.elapsed().as_secs_f64());
            let t = Instant::now();
            g.download_table(&dev, 0, &mut h);
            g.synchronize();
            fill.push(t.elapsed().as_secs_f64());
            let t = Instant::now();
            drop(h);
            free.push(t.elapsed().as_secs_f64());
        }
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            let s = v[v.len() / 2];
            Timing { s, gb_per_s: bytes as f64 / s / 1e9 }
        };
        page_lock.insert(
            name.into(),
            json!({ "make": median(&mut make), "download_into": median(&mut fill), "free": median(&mut free) }),
        );
    }
    Ok(json!({
        "bench": "transfer", "bytes": bytes,
        "h2d_pinned": h2d_pinned, "d2h_pinned": d2h_pinned, "scatter_add_pinned": add_pinned,
        "h2d_pageable": h2d_pageable, "d2h_pageable": d2h_pageable,
        "page_lock": page_lock, "page_lock_chosen": format!("{:?}", PageLock::chosen()),
    }))
}

/// `Â·X` and `Âᵀ·X` per width and implementation.
fn spmm(
    g: &mut Cuda,
    reps: usize,
    input: &crate::args::Input,
    widths: &[usize],
) -> anyhow::Result<serde_json::Value> {
    let (ds, _) = crate::load::load(input)?;
    let looped = ds.graph.with_self_loops();
    let vals = norm::gcn_norm(&looped);
    let n = looped.num_nodes();
    let sm = SparseMatrix::new(n, n, looped.row_ptr().to_vec(), looped.col_idx().to_vec());
    let v = g.upload(&Mat::from_vec(vals.len(), 1, vals.iter().map(|&x| x as f32).collect()));
    let s = g.sparse(&sm);
    let mut results = Vec::new();
    for &d in widths {
        let x = g.upload(&Mat::from_vec(n, d, (0..n * d).map(|i| (i % 97) as f32 * 0.01).collect()));
        let mut out = g.output(n, d);
        for transpose in [false, true] {
            let mut row = json!({"width": d, "transposed": transpose});
            for (name, k) in [
                ("grinnder", SpmmKernel::Ours),
                ("grinnder_general", SpmmKernel::Warp),
                ("cusparse", SpmmKernel::CuSparse),
                ("auto", SpmmKernel::Auto),
            ] {
                if k == SpmmKernel::CuSparse && !g.has_cusparse() {
                    continue;
                }
                g.set_spmm(k);
                let gathered = (sm.nnz() * d * 4) as u64;
                let t = median_of(reps, gathered, || {
                    g.spmm(&s, &v, transpose, &x, 0.0, &mut out);
                    g.synchronize();
                });
                row[name] = json!({"ms": t.s * 1e3, "gathered_tb_per_s": t.gb_per_s / 1e3});
            }
            results.push(row);
        }
    }
    Ok(json!({
        "bench": "spmm", "graph": ds.name, "nodes": n, "entries": sm.nnz(), "results": results,
        "cusparse": g.has_cusparse(),
    }))
}

/// An epoch's mini-batches sampled as the trainer's sampling threads do (batch k on thread k
/// mod n, seeds from the same shuffle), then again with each batch's input rows gathered into
/// a buffer of the thread's; the median pass of `reps` after one warm-up.
fn sample(
    reps: usize,
    input: &crate::args::Input,
    fanout: &[i64],
    batch_size: usize,
    loader_threads: Option<usize>,
    max_batches: Option<usize>,
) -> anyhow::Result<serde_json::Value> {
    use grinnder_engine::minibatch::{batches, default_loader_threads, sampling_graph};
    use grinnder_engine::FeatureNorm;
    use grinnder_engine::HostFeatures;
    use grinnder_graph::sample::{NeighborSampler, Scratch};
    use grinnder_nn::Aggregation;
    anyhow::ensure!(
        !fanout.is_empty() && fanout.iter().all(|&f| f == -1 || f > 0),
        "--fanout takes positive counts or -1"
    );
    anyhow::ensure!(batch_size > 0, "--batch-size must be at least 1");
    let path = input.path()?;
    let (ds, _) = crate::load::load(input)?;
    // the trainer's samplers read this copy
    let huge = sampling_graph(&ds.graph);
    let graph = huge.as_ref().unwrap_or(&ds.graph);
    let threads = loader_threads.unwrap_or_else(default_loader_threads).max(1);
    let mut all = batches(&ds.splits.train, batch_size, 0, 0);
    all.truncate(max_batches.unwrap_or(usize::MAX));
    anyhow::ensure!(!all.is_empty(), "the dataset has no training nodes");
    let sampler = NeighborSampler::new(fanout.to_vec(), 0);
    let features = HostFeatures::new(&ds, FeatureNorm::None);
    let dim = ds.features.dim;
    // one pass: (wall seconds, thread seconds, input rows, edges)
    let pass = |work: LoaderWork| -> (f64, f64, u64, u64) {
        let t = Instant::now();
        let per_thread: Vec<(f64, u64, u64)> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..threads)
                .map(|w| {
                    let (all, sampler, features, ds) = (&all, &sampler, &features, &ds);
                    s.spawn(move || {
                        let (mut secs, mut rows, mut edges) = (0.0, 0u64, 0u64);
                        let mut scratch = Scratch::default();
                        let mut buf: Vec<f32> = Vec::new();
                        for (k, seeds) in all.iter().enumerate().skip(w).step_by(threads) {
                            let t = Instant::now();
                            let batch = sampler.sample_with(graph, seeds, k as u64, &mut scratch);
                            let ids = batch.input_nodes();
                            match work {
                                LoaderWork::Sample => {}
                                LoaderWork::Blocks => batch.blocks.iter().for_each(|blk| {
                                    std::hint::black_box(Aggregation::Mean.sampled(&ds.graph, blk));
                                }),
                                LoaderWork::Gather => {
                                    buf.resize(ids.len() * dim, 0.0);
                                    features.write_rows(Some(ids), &mut buf);
                                }
                            }
                            secs += t.elapsed().as_secs_f64();
                            rows += ids.len() as u64;
                            edges += batch.blocks.iter().map(|b| b.nnz() as u64).sum::<u64>();
                        }
                        (secs, rows, edges)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().expect("a sampling thread")).collect()
        });
        let wall = t.elapsed().as_secs_f64();
        let sum = per_thread.iter().fold((0.0, 0, 0), |a, p| (a.0 + p.0, a.1 + p.1, a.2 + p.2));
        (wall, sum.0, sum.1, sum.2)
    };
    let n = all.len() as f64;
    let seeds: usize = all.iter().map(Vec::len).sum();
    let report = |work: LoaderWork| {
        let (wall, thread_s, rows, edges) = median_run(reps, |r: &(f64, f64, u64, u64)| r.0, || pass(work));
        let mut v = json!({
            "s": wall,
            "batches_per_s": n / wall,
            "seeds_per_s": seeds as f64 / wall,
            "thread_ms_per_batch": thread_s / n * 1e3,
            "input_rows_per_batch": rows as f64 / n,
            "edges_per_batch": edges as f64 / n,
        });
        if work == LoaderWork::Gather {
            let bytes = rows * (dim * 4) as u64;
            v["gathered_gb"] = json!(bytes as f64 / 1e9);
        }
        v
    };
    let sampling = report(LoaderWork::Sample);
    let with_blocks = report(LoaderWork::Blocks);
    let with_gather = report(LoaderWork::Gather);
    Ok(json!({
        "dataset": path.display().to_string(),
        "fanout": fanout,
        "batch_size": batch_size,
        "batches": all.len(),
        "loader_threads": threads,
        "rayon_threads": rayon::current_num_threads(),
        "sample": sampling,
        "sample_and_blocks": with_blocks,
        "sample_and_gather": with_gather,
    }))
}

/// What a pass of `bench sample` does after sampling each batch.
#[derive(Clone, Copy, PartialEq)]
enum LoaderWork {
    Sample,
    /// The blocks' sparse structures with SAGE's normalisation, as the trainer's sampling
    /// threads build them before uploading.
    Blocks,
    /// The CPU gather of the input rows (`--feature-access copy`).
    Gather,
}
