//! `grinnder predict`: a model file run on a dataset — the training graph or another with the
//! same features — in memory, layer by layer and partition by partition under budgets, or over
//! MPI ranks; per-node outputs stream into `.npy` files in the dataset's node order, each made
//! whole under a temporary name before the model runs (its space reserved) and renamed into
//! place when complete.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use grinnder_engine::{
    Mode, ModelFile, Output, Prediction, Request, RowSink, Rows, TieredConfig, TrainError, Trainer,
};
use grinnder_graph::buf::as_bytes;
use grinnder_graph::io::npy::{DType, Npy};
use grinnder_graph::io::npy_rows::{NpyRows, MAPPED_BYTES_MAX};
use grinnder_graph::Dataset;
use grinnder_tensor::{Backend, Cpu};
use rayon::prelude::*;

use crate::args::{CacheModeArg, OutDtypeArg, OutputArg, PredictArgs, TierDtypeArg};
use crate::bytes::byte_size;
use crate::plan::Device;
use crate::train::Launch;

/// One output file: what goes in it, and the file under construction.
struct Out {
    output: Output,
    name: String,
    file: NpyRows,
    width: u64,
    elem: u64,
}

pub fn run(a: PredictArgs) -> anyhow::Result<()> {
    let launch = crate::train::launch(a.ranks_per_server)?;
    let lead = launch.as_ref().is_none_or(|l| l.groups.global.rank() == 0);
    if !lead {
        grinnder_graph::progress::set_quiet(true);
    }
    let mut device = Device::parse(&a.device)?;
    if let (Device::Cuda(n), Some(l)) = (device, &launch) {
        device = Device::Cuda((n + l.local_rank) % grinnder_cuda::device_count().max(1));
    }
    anyhow::ensure!(
        device != Device::Cpu || (a.gpu_mem.is_none() && !a.tf32.unwrap_or(false)),
        "--gpu-mem and --tf32 need --device cuda"
    );
    let model = ModelFile::load(&a.model_file)?;
    let arch = model.arch.clone();
    // a graph read in the other direction than the model's is refused before it loads
    arch.check_directed(a.input.directed, &a.model_file)?;
    let mut tiered = tiered_config(&a, launch.as_ref().map_or(1, |l| l.groups.global.size()))?;
    anyhow::ensure!(a.repeat >= 1, "--repeat must be at least 1");
    let layers = arch.layers;
    if let Some(&l) = a.embed.iter().find(|&&l| l + 1 >= layers) {
        anyhow::bail!(
            "--embed {l}: this model's hidden layers are 0 to {} (its last layer's output is --output logits)",
            layers as i64 - 2
        );
    }
    if tiered.as_ref().is_some_and(|t| t.host_mem.is_some()) {
        crate::return_freed_memory_at_once();
    }
    tracing::info!(
        "model {}: {}{}",
        a.model_file.display(),
        arch.describe(),
        model.note.as_ref().map_or(String::new(), |n| format!(" ({n})"))
    );
    // the GPU and the output folder are settled before the dataset loads
    let mut gpu = match device {
        Device::Cuda(n) => Some(crate::train::open_gpu(
            n,
            byte_size(a.gpu_mem.clone())?,
            a.tf32.unwrap_or(false),
            "predict",
        )?),
        Device::Cpu => None,
    };
    crate::outputs::check_dir_writable(&a.out, "--out")?;
    if let Some(p) = &a.metrics_out {
        crate::outputs::check_writable(p, "--metrics-out")?;
    }
    let path = a.input.path()?;
    let mut ds = crate::load::open(&path, &a.input, tiered.as_ref().and_then(|t| t.host_mem))?;
    arch.check_dataset(&ds, &a.model_file)?;
    arch.check_graph(&ds, &a.model_file)?;
    if ds.num_classes == 0 {
        // a graph without labels: predict into the model's classes
        ds.num_classes = arch.classes as u32;
    }
    if launch.is_none() {
        settle_budgets(&a, &mut tiered, &model, &ds, gpu.as_mut())?;
    }
    let nodes = requested_nodes(&a.nodes, &ds)?;
    let rows = nodes.as_ref().map_or(ds.num_nodes(), Vec::len) as u64;
    tracing::info!(
        "{}: {} nodes, {} edges; predicting {rows} nodes",
        ds.name,
        ds.num_nodes(),
        ds.graph.num_edges()
    );
    let mut outs = outputs(&a, &arch, rows, launch.as_ref())?;
    let ids_file = match &nodes {
        Some(_) if lead => Some(NpyRows::create(&a.out.join("nodes.npy"), DType::I64, rows, 0)?),
        _ => None,
    };
    let groups = launch.as_ref().map(|l| &l.groups);
    let (done, device_peak) = match &gpu {
        Some(gpu) => run_on(gpu, &ds, &model, tiered, groups, &nodes, &mut outs, a.repeat)?,
        None => run_on(&Cpu::<f32>::new(), &ds, &model, tiered, groups, &nodes, &mut outs, a.repeat)?,
    };
    if !lead {
        return Ok(());
    }
    if let (Some(f), Some(ids)) = (ids_file, &nodes) {
        let at: Vec<u64> = (0..rows).collect();
        let bytes: Vec<u8> = ids.iter().flat_map(|&v| (v as i64).to_le_bytes()).collect();
        let mut f = f;
        f.write_rows(&at, &bytes)?;
        f.finish()?;
    }
    let mut metrics = match &a.metrics_out {
        Some(p) => Some(std::fs::File::create(p).with_context(|| format!("cannot create {}", p.display()))?),
        None => None,
    };
    for (o, passes) in outs.into_iter().zip(&done) {
        let target = o.file.path().to_path_buf();
        report(&o, &target, passes.last().expect("a pass"), rows);
        o.file.finish()?;
        for (i, p) in passes.iter().enumerate() {
            if let Some(f) = metrics.as_mut() {
                let mut v = serde_json::to_value(p)?;
                v["file"] = target.display().to_string().into();
                v["output"] = o.name.clone().into();
                v["pass"] = i.into();
                writeln!(f, "{v}")?;
            }
        }
    }
    print_totals(done, device_peak);
    Ok(())
}

/// The last pass of each output: times, peak memory and storage traffic, as one line.
fn print_totals(done: Vec<Vec<Prediction>>, device_peak: Option<u64>) {
    let done: Vec<Prediction> = done.into_iter().filter_map(|mut p| p.pop()).collect();
    let (compute, write): (f64, f64) =
        done.iter().fold((0.0, 0.0), |s, p| (s.0 + p.compute_s, s.1 + p.write_s));
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    let (read, written) = done
        .iter()
        .filter_map(|p| p.tier.as_ref())
        .fold((0, 0), |s, t| (s.0 + t.tier.storage_read_bytes, s.1 + t.tier.storage_write_bytes));
    println!(
        "predicted in {:.3} s (forward {compute:.3} s, writing {write:.3} s); peak host memory {:.2} GiB{}; storage read {:.1} MiB, written {:.1} MiB",
        compute + write,
        gib(grinnder_engine::process::peak_rss_bytes()),
        device_peak.map_or(String::new(), |b| format!(", peak GPU memory {:.2} GiB", gib(b))),
        read as f64 / 1048576.0,
        written as f64 / 1048576.0
    );
}

fn report(o: &Out, path: &Path, p: &Prediction, rows: u64) {
    let bytes = rows * o.width.max(1) * o.elem;
    let shape = if o.width == 0 { format!("{rows}") } else { format!("{rows} × {}", o.width) };
    let accuracy = p.accuracy().map_or(String::new(), |acc| {
        format!("; accuracy {:.2} % on the {} labelled nodes", acc * 100.0, p.correct.unwrap_or_default().1)
    });
    println!("{}: {shape} → {} ({:.1} MiB){accuracy}", o.name, path.display(), bytes as f64 / 1048576.0);
}

/// The tiered executor's settings, where any is given (or under mpirun).
fn tiered_config(a: &PredictArgs, ranks: usize) -> anyhow::Result<Option<TieredConfig>> {
    let any = a.parts.is_some()
        || a.partitioner.is_some()
        || a.host_mem.is_some()
        || a.block_cache.is_some()
        || a.storage_dir.is_some()
        || a.cache_mode.is_some()
        || a.tier_dtype.is_some();
    if !any && ranks == 1 {
        return Ok(None);
    }
    let parts = a.parts.unwrap_or(if ranks > 1 { ranks } else { 4 });
    anyhow::ensure!(
        parts >= ranks,
        "--parts {parts} is fewer than the {ranks} ranks: every rank computes at least one"
    );
    if let Some(d) = &a.storage_dir {
        anyhow::ensure!(d.is_dir(), "--storage-dir {} is not an existing directory", d.display());
    }
    tiered_settings(a, parts).map(Some)
}

/// The tiered executor's settings over `parts` partitions, the flags given kept.
fn tiered_settings(a: &PredictArgs, parts: usize) -> anyhow::Result<TieredConfig> {
    let mut tc = TieredConfig::in_ram(parts, a.partitioner.unwrap_or_default().method(0));
    tc.partition_cache = a.cache_dir.clone().or_else(crate::args::default_cache_dir);
    tc.host_mem = byte_size(a.host_mem.clone())?;
    tc.cache_bytes = byte_size(a.block_cache.clone())?;
    tc.storage_dir = a.storage_dir.clone();
    tc.gpu_mem = byte_size(a.gpu_mem.clone())?;
    tc.cache_mode = match a.cache_mode.unwrap_or(CacheModeArg::Auto) {
        CacheModeArg::Auto => grinnder_engine::CacheMode::Auto,
        CacheModeArg::LruLayer => grinnder_engine::CacheMode::LruLayer,
        CacheModeArg::PartitionLru => grinnder_engine::CacheMode::PartitionLru,
    };
    tc.tier_dtype = match a.tier_dtype.unwrap_or(TierDtypeArg::F32) {
        TierDtypeArg::F32 => grinnder_engine::TierDtype::F32,
        TierDtypeArg::Bf16 => grinnder_engine::TierDtype::Bf16,
    };
    Ok(tc)
}

/// What the flags leave open, chosen from the machine as `train` chooses it
/// ([`crate::budgets::settle_predict`]), each choice logged; the GPU's budget set where one was
/// chosen. One process only: ranks keep their partition per rank.
fn settle_budgets(
    a: &PredictArgs,
    tiered: &mut Option<TieredConfig>,
    model: &ModelFile,
    ds: &Dataset,
    gpu: Option<&mut grinnder_cuda::Cuda>,
) -> anyhow::Result<()> {
    let mut gpu_mem = byte_size(a.gpu_mem.clone())?;
    let given = gpu_mem;
    let free = gpu.as_ref().map(|g| g.mem_info().0 as u64);
    let w = crate::budgets::inference_workload(model, ds);
    let fresh = |parts| tiered_settings(a, parts).expect("the flags were read once already");
    for r in crate::budgets::settle_predict(tiered, a.parts.is_some(), &mut gpu_mem, &w, free, fresh)? {
        tracing::info!("plan: {r}");
    }
    if let Some(t) = tiered.as_mut() {
        t.gpu_mem = gpu_mem;
    }
    if let (Some(g), true) = (gpu, gpu_mem != given) {
        g.set_memory_budget(gpu_mem)?;
    }
    Ok(())
}

/// `--nodes`: every node (`None`), a split, or the ids (or a boolean mask) of an `.npy` file.
fn requested_nodes(which: &str, ds: &Dataset) -> anyhow::Result<Option<Vec<u32>>> {
    let split = |name: &str, ids: &[u32]| -> anyhow::Result<Option<Vec<u32>>> {
        anyhow::ensure!(!ids.is_empty(), "--nodes {name}: the dataset's {name} split is empty");
        Ok(Some(ids.to_vec()))
    };
    match which {
        "all" => Ok(None),
        "train" => split("train", &ds.splits.train),
        "valid" => split("valid", &ds.splits.valid),
        "test" => split("test", &ds.splits.test),
        file => {
            let path = PathBuf::from(file);
            anyhow::ensure!(
                path.is_file(),
                "--nodes {file}: neither all, train, valid, test nor an existing .npy file of node ids"
            );
            let npy = Npy::open(&path)?;
            anyhow::ensure!(
                npy.shape.len() == 1,
                "--nodes {file}: a 1-D array of node ids, not shape {:?}",
                npy.shape
            );
            let n = ds.num_nodes() as i64;
            if npy.dtype == DType::Bool {
                // a mask, as PyG keeps splits (`data.test_mask`): the nodes where it is true
                anyhow::ensure!(
                    npy.len() as i64 == n,
                    "--nodes {file}: a boolean mask of {} entries; the graph has {n} nodes (one entry per node)",
                    npy.len()
                );
                let ids: Vec<u32> = npy
                    .to_i64()?
                    .iter()
                    .enumerate()
                    .filter(|(_, &b)| b != 0)
                    .map(|(i, _)| i as u32)
                    .collect();
                anyhow::ensure!(!ids.is_empty(), "--nodes {file}: the mask selects no node");
                return Ok(Some(ids));
            }
            let ids = npy.to_i64()?;
            if let Some((i, v)) = ids.iter().enumerate().find(|(_, &v)| !(0..n).contains(&v)) {
                anyhow::bail!("--nodes {file}: entry {i} is {v}, not a node id (0 to {})", n - 1);
            }
            anyhow::ensure!(!ids.is_empty(), "--nodes {file} holds no node id");
            Ok(Some(ids.into_iter().map(|v| v as u32).collect()))
        }
    }
}

/// The files to write, made (rank 0) or joined (the other ranks) before the model runs.
fn outputs(
    a: &PredictArgs,
    arch: &grinnder_engine::Arch,
    rows: u64,
    launch: Option<&Launch>,
) -> anyhow::Result<Vec<Out>> {
    let (dtype, elem) = match a.out_dtype {
        OutDtypeArg::F32 => (DType::F32, 4),
        OutDtypeArg::Bf16 => (DType::U16, 2),
    };
    let (main, name) = match a.output {
        OutputArg::Logits => (Output::Logits, "logits"),
        OutputArg::Probs => (Output::Probs, "probs"),
        OutputArg::Class => (Output::Class, "class"),
    };
    let hidden = arch.model_config().hidden_width() as u64;
    let mut want =
        vec![(main, name.to_string(), if main == Output::Class { 0 } else { arch.classes as u64 })];
    want.extend(a.embed.iter().map(|&l| (Output::Embedding(l), format!("embedding-{l}"), hidden)));
    let lead = launch.is_none_or(|l| l.groups.global.rank() == 0);
    let made: anyhow::Result<Vec<NpyRows>> = if lead {
        want.iter()
            .map(|(o, name, w)| {
                let (t, _) = if *o == Output::Class { (DType::I64, 8) } else { (dtype, elem) };
                NpyRows::create(&a.out.join(format!("{name}.npy")), t, rows, *w).map_err(anyhow::Error::from)
            })
            .collect()
    } else {
        Ok(Vec::new())
    };
    let mut files = match launch.filter(|l| l.groups.global.size() > 1) {
        None => made?,
        Some(l) => {
            // every rank writes its rows into rank 0's temporaries
            let mine: Result<Vec<String>, String> = match &made {
                Ok(f) => Ok(f.iter().map(|f| f.temp_path().display().to_string()).collect()),
                Err(e) => Err(format!("{e:#}")),
            };
            let all = l.groups.global.all_gather(&serde_json::to_vec(&mine)?);
            let theirs: Result<Vec<String>, String> = serde_json::from_slice(&all[0])?;
            let temps = theirs.map_err(|e| anyhow::anyhow!("rank 0: {e}"))?;
            if lead {
                made?
            } else {
                want.iter()
                    .zip(temps)
                    .map(|((o, name, w), tmp)| {
                        let t = if *o == Output::Class { DType::I64 } else { dtype };
                        NpyRows::join(Path::new(&tmp), &a.out.join(format!("{name}.npy")), t, rows, *w)
                            .map_err(anyhow::Error::from)
                    })
                    .collect::<anyhow::Result<Vec<_>>>()?
            }
        }
    };
    if a.host_mem.is_none() {
        files.iter_mut().for_each(keep_output_mapped);
    }
    Ok(want
        .into_iter()
        .zip(files)
        .map(|((output, name, width), file)| {
            let elem = if output == Output::Class { 8 } else { elem };
            Out { output, name, file, width, elem }
        })
        .collect())
}

/// Where no host budget binds a prediction: its output file keeps up to a sixteenth of the
/// memory the machine leaves the process mapped in (at least [`MAPPED_BYTES_MAX`]), so that a
/// narrow output's pages fault in once, not once per partition (every partition's rows touch
/// nearly every page of a class or narrow logits file). `predict` and the Python package's
/// `Trainer.predict(out=…)` both.
pub fn keep_output_mapped(file: &mut NpyRows) {
    let room = grinnder_engine::machine::HostMemory::read().usable().map_or(0, |u| u / 16);
    file.keep_mapped((room as usize).max(MAPPED_BYTES_MAX));
}

/// Rows into an [`NpyRows`] file, as f32 or bf16 values or int64 classes.
pub struct NpySink<'a> {
    pub out: &'a mut NpyRows,
    pub bf16: bool,
}

impl RowSink for NpySink<'_> {
    fn write(&mut self, at: &[u64], rows: Rows<'_>) -> Result<(), TrainError> {
        let halves: Vec<u16>;
        let bytes: &[u8] = match rows {
            Rows::Classes(c) => as_bytes(c),
            Rows::Values { data, .. } if self.bf16 => {
                halves = data.par_iter().map(|&x| grinnder_engine::tiered::store::to_bf16(x)).collect();
                as_bytes(&halves)
            }
            // little-endian f32 as the file stores it
            Rows::Values { data, .. } => as_bytes(data),
        };
        self.out.write_rows(at, bytes).map_err(|e| TrainError::Storage(e.to_string()))
    }

    fn flush(&mut self) -> Result<(), TrainError> {
        self.out.flush().map_err(|e| TrainError::Storage(e.to_string()))
    }
}

fn run_on<B: Backend>(
    b: &B,
    ds: &Dataset,
    model: &ModelFile,
    tiered: Option<TieredConfig>,
    groups: Option<&grinnder_dist::Groups>,
    nodes: &Option<Vec<u32>>,
    outs: &mut [Out],
    repeat: usize,
) -> anyhow::Result<(Vec<Vec<Prediction>>, Option<u64>)> {
    let mode = match (tiered, groups) {
        (None, _) => Mode::FullGraph,
        (Some(tiered), Some(groups)) => {
            Mode::Ranks { tiered, groups, device: None, expansion: grinnder_engine::Expansion::Plain }
        }
        (Some(t), None) => Mode::Tiered(t),
    };
    let mut t = Trainer::for_model(b, ds, model, mode)?;
    let mut done = Vec::new();
    for o in outs.iter_mut() {
        let bf16 = o.elem == 2;
        let mut passes = Vec::new();
        for _ in 0..repeat {
            let req = Request { output: o.output, nodes: nodes.clone() };
            passes.push(t.predict(&req, &mut NpySink { out: &mut o.file, bf16 })?);
        }
        done.push(passes);
    }
    Ok((done, b.device_memory().map(|m| m.peak)))
}
