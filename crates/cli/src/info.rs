//! `grinnder info`: a dataset's figures and the memory full-graph training needs; with the
//! tiered executor's settings, its plan (the blocks each tier holds), what an epoch moves
//! between the tiers and computes, and with measured rates its predicted time (the cost model,
//! `grinnder_engine::tiered::Executor::predict_epoch`).

use std::path::PathBuf;

use grinnder_engine::tiered::{BlockGroup, BlockKind, Executor, FirstBlocks, Plan, Prediction, Rates};
use grinnder_engine::{Mode, TieredConfig};
use grinnder_graph::{stats, Dataset};
use grinnder_tensor::{Backend, Cpu};
use serde::Serialize;

use crate::args::{parse_bytes, InfoArgs, TrainSettings};
use crate::load::load;
use crate::plan::{Device, TrainPlan};
use crate::rates::{default_rates, read_rates};

#[derive(Serialize)]
struct Info {
    name: String,
    nodes: usize,
    directed_edges: usize,
    /// The edges as given (`--directed`), not made symmetric.
    directed: bool,
    /// The graph has edge weights.
    edge_weight: bool,
    features: usize,
    classes: u32,
    train: usize,
    valid: usize,
    test: usize,
    degree_min: u32,
    degree_median: u32,
    degree_mean: f64,
    degree_p90: u32,
    degree_p99: u32,
    degree_max: u32,
    isolated_nodes: usize,
    structure_bytes: u64,
    feature_bytes: u64,
    /// How the features are stored (`f32`, `f16`, `bf16`).
    feature_dtype: &'static str,
    hidden: usize,
    layers: usize,
    layer_bytes: u64,
    full_graph_bytes: u64,
    fits_gpu: Option<bool>,
    fits_host: Option<bool>,
    load_seconds: f64,
    /// The tiered executor's plan and predicted epoch, where its settings were given.
    #[serde(skip_serializing_if = "Option::is_none")]
    tiered: Option<TieredInfo>,
    /// What `train` with these settings would choose where the flags leave it open
    /// ([`crate::budgets::settle`]), and why.
    run_plan: RunPlan,
}

/// The choices of [`crate::budgets::settle`].
#[derive(Serialize)]
struct RunPlan {
    /// Partitions of the tiered executor; `None`: the whole graph in memory.
    parts: Option<usize>,
    gpu_mem: Option<u64>,
    /// The host memory the run may use before it keeps blocks under a budget.
    host_mem_auto: Option<u64>,
    reasons: Vec<String>,
}

/// What `train` would choose for `plan` (the flags as given) on this machine, and the plan so
/// settled. Made before anything of the run is set up: the device's free memory is measured
/// before this process takes any of it (an `info --tier-dtype bf16` that set up its partition
/// graphs first saw 24 of an H100's 79 GiB free, its own graphs holding the rest, and refused a
/// graph that fits, 2026-12-05).
fn run_plan(
    plan: &TrainPlan,
    ds: &Dataset,
    host_mem: Option<u64>,
    gpu_mem: Option<u64>,
) -> anyhow::Result<(RunPlan, TrainPlan)> {
    let mut p = plan.clone();
    p.gpu_mem = p.gpu_mem.or(gpu_mem);
    match (host_mem, p.tiered.as_mut()) {
        // a host budget alone makes a tiered run
        (Some(h), None) => {
            let mut t = crate::plan::TieredPlan::with_parts(4);
            t.host_mem = Some(h);
            p.tiered = Some(t);
        }
        // beside another of its settings (--storage-dir) it is that run's budget, as train
        // takes it (info planned without it, and named 4 partitions where train took 64)
        (Some(h), Some(t)) if t.host_mem.is_none() => t.host_mem = Some(h),
        _ => {}
    }
    let free = match p.device {
        Device::Cuda(n) => Some(crate::train::open_gpu(n, None, false, "plan")?.mem_info().0 as u64),
        Device::Cpu => None,
    };
    let reasons = crate::budgets::settle(&mut p, ds, free)?;
    let t = p.tiered.as_ref();
    let r = RunPlan {
        parts: t.map(|t| t.parts),
        gpu_mem: p.gpu_mem,
        host_mem_auto: t.and_then(|t| t.host_auto.as_ref()).map(|h| h.bytes),
        reasons,
    };
    Ok((r, p))
}

/// What `info` shows of the tiered executor.
#[derive(Serialize)]
struct TieredInfo {
    parts: usize,
    /// Layer 0 runs inside layer 1 (its transform, or over its columns unsplit).
    fused: bool,
    plan: Plan,
    blocks: Vec<BlockGroup>,
    prediction: Option<Prediction>,
    /// The epoch predicted with `--input-dropout 0`, where input dropout keeps layer 0 from
    /// running on its aggregation computed once: what that flag saves.
    #[serde(skip_serializing_if = "Option::is_none")]
    without_input_dropout: Option<Prediction>,
    /// The setup phases this command ran, as a run would (seconds; the partitioning's from its
    /// cache where it was there), and the first blocks' predicted time: the rest of a run's
    /// setup.
    setup: Vec<(String, f64)>,
    first_blocks: Option<FirstBlocks>,
    /// Where the rates came from.
    rates: Option<PathBuf>,
}

pub fn run(mut a: InfoArgs) -> anyhow::Result<()> {
    let s = &mut a.settings;
    let budget = |v: &Option<String>, flag: &str| {
        v.as_deref().map(parse_bytes).transpose().map_err(|e| anyhow::anyhow!("--{flag}: {e}"))
    };
    let (gpu_mem, host_mem) = (budget(&s.gpu_mem, "gpu-mem")?, budget(&s.host_mem, "host-mem")?);
    // without --parts the budgets are what the whole graph is checked against, not a run's
    if s.parts.is_none() {
        (s.gpu_mem, s.host_mem) = (None, None);
    }
    let mut plan = crate::plan::plan_of(s, &TrainSettings::default())?;
    if plan.tiered.as_ref().is_some_and(|t| t.host_mem.is_some()) {
        // as train runs under a host budget: the compute measured for the prediction pays the
        // same page faults
        crate::return_freed_memory_at_once();
    }
    let rates = match &a.rates {
        Some(p) => Some((read_rates(p)?, p.clone())),
        None => default_rates(&plan)?,
    };
    let (ds, secs) = load(&a.input)?;
    plan.settle_feature_norm(&ds);
    let (hidden, layers) = (plan.config.model.hidden, plan.config.model.layers);
    let d = stats::degree_summary(&ds);
    let full = stats::full_graph_bytes(&ds, hidden, layers);
    // the budgets first, then the executor's plan under them (the partitions and budgets the
    // run would take), where the flags ask for the tiered executor
    let (run_plan, settled) = run_plan(&plan, &ds, host_mem, gpu_mem)?;
    let tiered = match (&plan.tiered, settled.tiered.is_some(), settled.device) {
        (None, _, _) | (_, false, _) => None,
        (Some(_), true, Device::Cpu) => Some(tiered_info(&Cpu::<f32>::new(), &ds, &settled, rates)?),
        (Some(_), true, Device::Cuda(n)) => {
            let g = crate::train::open_gpu(n, settled.gpu_mem, settled.tf32, "plan")?;
            Some(tiered_info(&g, &ds, &settled, rates)?)
        }
    };
    let i = Info {
        name: ds.name.clone(),
        nodes: ds.num_nodes(),
        directed_edges: ds.graph.num_edges(),
        directed: ds.directed,
        edge_weight: ds.edge_weight.is_some(),
        features: ds.features.dim,
        classes: ds.num_classes,
        train: ds.splits.train.len(),
        valid: ds.splits.valid.len(),
        test: ds.splits.test.len(),
        degree_min: d.min,
        degree_median: d.median,
        degree_mean: d.mean,
        degree_p90: d.p90,
        degree_p99: d.p99,
        degree_max: d.max,
        isolated_nodes: d.isolated,
        structure_bytes: stats::structure_bytes(&ds),
        feature_bytes: ds.features.data.bytes(),
        feature_dtype: ds.features.dtype().name(),
        hidden,
        layers,
        layer_bytes: stats::layer_bytes(ds.num_nodes(), hidden),
        full_graph_bytes: full,
        fits_gpu: gpu_mem.map(|b| full <= b),
        fits_host: host_mem.map(|b| full <= b),
        load_seconds: secs,
        tiered,
        run_plan,
    };
    if a.json {
        println!("{}", serde_json::to_string(&i)?);
        return Ok(());
    }
    println!("dataset        {}", i.name);
    println!("nodes          {}", i.nodes);
    let how = if i.directed { "as given, --directed" } else { "made symmetric" };
    let weights = if i.edge_weight { ", weighted" } else { "" };
    println!("edges          {} directed ({how}, no self loops or duplicates{weights})", i.directed_edges);
    println!("features       {} per node, stored as {}", i.features, i.feature_dtype);
    println!("classes        {}", i.classes);
    println!("split          train {} / valid {} / test {}", i.train, i.valid, i.test);
    println!(
        "degree         min {} / median {} / mean {:.2} / p90 {} / p99 {} / max {}; {} isolated",
        d.min, d.median, d.mean, d.p90, d.p99, d.max, d.isolated
    );
    println!("structure      {}   features {}", gib(i.structure_bytes), gib(i.feature_bytes));
    println!(
        "per layer      {} per {}-wide fp32 activation (the same again for its gradient)",
        gib(i.layer_bytes),
        hidden
    );
    println!("full graph     {} for {} layers kept resident", gib(full), layers);
    for (what, budget, fits) in [("GPU", gpu_mem, i.fits_gpu), ("host", host_mem, i.fits_host)] {
        if let (Some(b), Some(f)) = (budget, fits) {
            let verdict = if f { "fits" } else { "does not fit: needs tiered (offloaded) execution" };
            println!("{what:<14} budget {}: {verdict}", gib(b));
        }
    }
    let r = &i.run_plan;
    let chosen = match r.parts {
        None => "the whole graph in memory".to_string(),
        Some(p) => format!("{p} partitions"),
    };
    println!("train would    {chosen}; why:");
    for reason in &r.reasons {
        println!("               - {reason}");
    }
    if let Some(t) = &i.tiered {
        print_tiered(t);
    }
    println!("loaded in      {:.3} s", secs);
    Ok(())
}

/// The executor's plan on `b` (partitioning, partition graphs, the GPU tier; no first blocks)
/// and its predicted epoch.
fn tiered_info<B: Backend>(
    b: &B,
    ds: &Dataset,
    plan: &TrainPlan,
    rates: Option<(Rates, PathBuf)>,
) -> anyhow::Result<TieredInfo> {
    let tc: TieredConfig = match crate::train::mode_of::<B>(plan, None, None, None) {
        Mode::Tiered(tc) => tc,
        _ => anyhow::bail!("the plan is the tiered executor's: give --parts, without mini-batch settings"),
    };
    let mut ex = Executor::plan_only(b, ds, &plan.config.model, &tc)?;
    if let Some((r, p)) = &rates {
        if r.tf32 != plan.tf32 {
            tracing::warn!(
                "the rates in {} were measured with TF32 {}, the plan computes with it {}",
                p.display(),
                if r.tf32 { "on" } else { "off" },
                if plan.tf32 { "on" } else { "off" }
            );
        }
    }
    let setup = grinnder_graph::progress::phase_times();
    let first_blocks = ex.predict_first_blocks(ds, plan.config.feature_norm, rates.as_ref().map(|r| &r.0));
    let rates_of = rates.as_ref().map(|r| &r.0);
    let mut info = TieredInfo {
        parts: tc.parts,
        fused: ex.fused(),
        plan: ex.plan.clone(),
        blocks: ex.block_groups(),
        prediction: ex.predict_epoch(rates_of),
        without_input_dropout: None,
        setup,
        first_blocks,
        rates: None,
    };
    // what --input-dropout 0 would save: the same plan without it (partitioned from the
    // cache), set up once this one is gone (its partition graphs may fill a GPU)
    drop(ex);
    if info.plan.block_bytes_without_input_dropout.is_some() {
        let model = grinnder_nn::ModelConfig { input_dropout: 0.0, ..plan.config.model.clone() };
        info.without_input_dropout = Executor::plan_only(b, ds, &model, &tc)?.predict_epoch(rates_of);
    }
    info.rates = rates.map(|r| r.1);
    Ok(info)
}

/// A block group's name, for people.
fn block_name(g: &BlockGroup) -> String {
    match g.kind {
        BlockKind::Act if g.layer == 0 => "features".to_string(),
        BlockKind::Act => format!("layer {}'s input", g.layer),
        BlockKind::Grad => format!("layer {}'s input gradient", g.layer),
        BlockKind::Pre => "layer 0's aggregated features".to_string(),
        BlockKind::Xw => format!("layer {}'s transformed input", g.layer),
        BlockKind::GradXw => format!("layer {}'s transformed gradient", g.layer),
        BlockKind::Initial => "the initial representation x0".to_string(),
        BlockKind::GradInitial => "x0's gradient".to_string(),
    }
}

fn print_tiered(t: &TieredInfo) {
    let p = &t.plan;
    let fused = if t.fused { "; layer 0 runs inside layer 1 (no blocks of layer 1's input)" } else { "" };
    println!("plan           {} partitions{fused}", t.parts);
    match p.cache_bytes {
        Some(c) => println!(
            "host plan      {} resident, a {} working set, a {} margin; {} host cache ({})",
            gib(p.resident_bytes),
            gib(p.working_bytes),
            gib(p.margin_bytes),
            gib(c),
            p.mode
        ),
        None => {
            println!("host plan      {} resident; no host budget: every block in RAM", gib(p.resident_bytes))
        }
    }
    if let Some(d) = &p.device {
        println!(
            "GPU tier       {} blocks ({}) of {} for blocks, beside {} resident, a {} working set, a {} margin",
            d.blocks,
            gib(d.placed_bytes),
            gib(d.cache_bytes),
            gib(d.resident_bytes),
            gib(d.working_bytes),
            gib(d.margin_bytes)
        );
    }
    // (both as the tier stores them, as train's plan line gives them; the groups below are
    // at full precision, as the GPU tier holds them)
    match p.host_block_bytes {
        Some(h) => println!(
            "blocks         {} in all; at most {} on the host at once, as the tier stores them (blocks go once spent)",
            gib(p.block_bytes),
            gib(h)
        ),
        None => println!("blocks         {} in all, as the tier stores them", gib(p.block_bytes)),
    }
    if let Some(without) = p.block_bytes_without_input_dropout {
        println!(
            "               {} in all with --input-dropout 0 (input dropout keeps layer 0 from running on its aggregation computed once)",
            gib(without)
        );
    }
    for g in &t.blocks {
        let rest = g.blocks - g.on_device;
        let host = if p.cache_bytes.is_some() { "in the host cache and storage" } else { "in host memory" };
        println!(
            "  {:<30} {:>3} blocks, {:>10}: {} on the GPU, {rest} {host}",
            block_name(g),
            g.blocks,
            gib(g.bytes),
            g.on_device
        );
    }
    print_setup(t);
    let Some(pr) = &t.prediction else { return };
    let tr = &pr.traffic;
    println!(
        "per epoch      to the device {}, back {}; host cache copies {}; storage read {}, written {}",
        gib(tr.upload_bytes),
        gib(tr.download_bytes),
        gib(tr.host_copy_bytes),
        gib(tr.storage_read_bytes),
        gib(tr.storage_write_bytes)
    );
    println!(
        "               {:.2} TFLOP in dense products (weights), {:.2} T edge-feature products in sparse ones (aggregation), {} element-wise",
        pr.gemm_flops as f64 / 1e12,
        pr.sparse_entry_columns as f64 / 1e12,
        gib(pr.elementwise_bytes)
    );
    match (&pr.seconds, &t.rates) {
        (Some(s), Some(r)) => println!(
            "predicted      {:.3} s per epoch: compute {:.3} s, bus {:.3} s, host copies {:.3} s, storage {:.3} s (rates: {})",
            s.epoch_s,
            s.compute_s,
            s.transfer_s,
            s.host_copy_s,
            s.storage_s,
            r.display()
        ),
        _ => println!("predicted      no rates: `grinnder bench rates [--device cuda] [--storage-dir DIR]` measures them"),
    }
    if let Some(w) = &t.without_input_dropout {
        let tr = &w.traffic;
        let secs = w.seconds.as_ref().zip(pr.seconds.as_ref());
        println!(
            "               with --input-dropout 0 (layer 0 on its aggregation computed once): to the device {}, back {}; storage read {}, written {}{}",
            gib(tr.upload_bytes),
            gib(tr.download_bytes),
            gib(tr.storage_read_bytes),
            gib(tr.storage_write_bytes),
            secs.map_or(String::new(), |(w, s)| format!("; {:.3} s per epoch against {:.3} s", w.epoch_s, s.epoch_s))
        );
    }
    let ev = &pr.evaluation_traffic;
    let bytes = format!("to the device {}, back {}", gib(ev.upload_bytes), gib(ev.download_bytes));
    match pr.evaluation_s {
        Some(s) => println!(
            "evaluation     {s:.3} s after each evaluated epoch (--eval-every; a forward pass without dropout): {bytes}"
        ),
        None => println!("evaluation     after each evaluated epoch (--eval-every): {bytes}"),
    }
}

/// The setup phases `info` ran and the first blocks' prediction: a run's setup.
fn print_setup(t: &TieredInfo) {
    let ran: Vec<String> = t.setup.iter().map(|(name, s)| format!("{name} {s:.1} s")).collect();
    println!("setup ran      {}", ran.join(", "));
    let Some(f) = &t.first_blocks else { return };
    let kept = format!(
        "kept: {} on the GPU, {} page-locked, {} in the store",
        gib(f.device_bytes),
        gib(f.pinned_bytes),
        gib(f.stored_bytes)
    );
    let rate = f.read_bytes_per_s / 1e9;
    match &f.seconds {
        Some(s) => {
            let ran: f64 = t.setup.iter().map(|(_, s)| s).sum();
            println!(
                "first blocks   predicted {:.1} s: reading {} at {rate:.2} GB/s {:.1} s; uploading {} {:.1} s, aggregating {:.1} s, keeping {:.1} s ({kept})",
                s.total_s,
                gib(f.read_bytes),
                s.read_s,
                gib(f.upload_bytes),
                s.upload_s,
                s.aggregate_s,
                s.keep_s
            );
            println!(
                "setup          predicted {:.1} s: the phases above and the first blocks",
                ran + s.total_s
            );
        }
        None => println!(
            "first blocks   read {} (at {rate:.2} GB/s here now), upload {}; {kept}; no rates for their time",
            gib(f.read_bytes),
            gib(f.upload_bytes)
        ),
    }
}

/// A byte count in the largest binary unit that keeps it at or above 1.
pub(crate) fn gib(b: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut x = b as f64;
    let mut u = 0;
    while x >= 1024.0 && u + 1 < units.len() {
        x /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{x:.2} {}", units[u])
    }
}
