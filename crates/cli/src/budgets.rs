//! What the flags leave open, chosen from the machine ([`grinnder_engine::budgets::choose`]):
//! the trainer (the whole graph in memory, or partitions), the GPU budget and the host memory
//! a run may use, and where blocks spill when they do not fit. Used by `train`, `info` and the
//! Python `Trainer`; every flag given is kept.

use grinnder_engine::budgets::{self, Given, Room, Workload};
use grinnder_engine::machine::HostMemory;
use grinnder_engine::tiered::HostAuto;
use grinnder_engine::{ModelFile, TieredConfig};
use grinnder_graph::Dataset;

use crate::plan::{TieredPlan, TrainPlan};

/// The workload `plan` trains on `ds`.
pub fn workload(plan: &TrainPlan, ds: &Dataset) -> Workload {
    let m = &plan.config.model;
    let mut widths = vec![ds.features.dim as u64];
    widths.extend((1..m.layers).map(|_| m.hidden_width() as u64));
    widths.push(ds.num_classes as u64);
    // attention keeps per-edge values, one per head
    let edge_values = if m.kind.family().weighs_entries() { m.heads_of_hidden() as u64 } else { 0 };
    Workload {
        nodes: ds.num_nodes() as u64,
        edges: ds.graph.num_edges() as u64,
        widths,
        edge_values,
        factored: factored(m.kind, ds),
        elem: 4,
        inference: false,
        initial: if m.kind.family().has_initial() { m.hidden_width() as u64 } else { 0 },
    }
}

/// The workload of running `model` over `ds` (`predict`).
pub fn inference_workload(model: &ModelFile, ds: &Dataset) -> Workload {
    let a = &model.arch;
    let heads = if a.kind.family().has_heads() { a.heads.max(1) } else { 1 };
    let hidden = (a.hidden * heads) as u64;
    let mut widths = vec![a.in_features as u64];
    widths.extend((1..a.layers).map(|_| hidden));
    widths.push(a.classes as u64);
    Workload {
        nodes: ds.num_nodes() as u64,
        edges: ds.graph.num_edges() as u64,
        widths,
        edge_values: if a.kind.family().weighs_entries() { heads as u64 } else { 0 },
        factored: factored(a.kind, ds),
        elem: 4,
        inference: true,
        initial: if a.kind.family().has_initial() { hidden } else { 0 },
    }
}

/// Whether the executor keeps the partition graphs' values as factors per node
/// ([`grinnder_engine::tiered::factors_values`]).
fn factored(kind: grinnder_nn::Kind, ds: &Dataset) -> bool {
    grinnder_engine::tiered::factors_values(kind.family().weighs_entries(), ds.edge_weight.is_some())
}

/// Settles a prediction's budgets on this machine as [`settle`] does a training run's:
/// `tiered` is the tiered executor's settings where a flag of it was given (`parts_given`:
/// `--parts` among them), `gpu_mem` the GPU budget given; `fresh` makes the settings of a
/// partitioned run where none were given. Returns why, a line per choice.
pub fn settle_predict(
    tiered: &mut Option<TieredConfig>,
    parts_given: bool,
    gpu_mem: &mut Option<u64>,
    w: &Workload,
    gpu_free: Option<u64>,
    fresh: impl FnOnce(usize) -> TieredConfig,
) -> anyhow::Result<Vec<String>> {
    let t = tiered.as_ref();
    let given = Given {
        parts: t.filter(|_| parts_given).map(|t| t.parts),
        gpu_mem: *gpu_mem,
        host_mem: t.and_then(|t| t.host_mem),
        tiered: t.is_some(),
    };
    let (b, reasons) = match choose_here(w, given, gpu_free)? {
        Chosen::Budgets(b, reasons) => (b, reasons),
        Chosen::NoFigures(why) => return Ok(vec![why]),
    };
    let Some(parts) = b.parts else { return Ok(reasons) };
    let t = tiered.get_or_insert_with(|| fresh(parts));
    t.parts = parts;
    t.auto_parts = given.auto_parts();
    if t.cache_bytes.is_none() {
        t.host_auto = host_auto(&b, t.storage_dir.as_ref());
    }
    *gpu_mem = gpu_mem.or(b.gpu_mem);
    Ok(reasons)
}

/// Settles `plan` for `ds` on this machine (`gpu_free`: the device's free bytes, `None` on the
/// CPU): full-graph training in one process only (mini-batches and ranks keep their own
/// rules). Returns why, a line per choice.
pub fn settle(plan: &mut TrainPlan, ds: &Dataset, gpu_free: Option<u64>) -> anyhow::Result<Vec<String>> {
    if plan.minibatch.is_some() {
        return Ok(Vec::new());
    }
    let t = plan.tiered.as_ref();
    let given = Given {
        parts: t.filter(|t| t.parts_given).map(|t| t.parts),
        gpu_mem: plan.gpu_mem,
        host_mem: t.and_then(|t| t.host_mem),
        tiered: t.is_some(),
    };
    let (b, reasons) = match choose_here(&workload(plan, ds), given, gpu_free)? {
        Chosen::Budgets(b, reasons) => (b, reasons),
        Chosen::NoFigures(why) => return Ok(vec![why]),
    };
    let Some(parts) = b.parts else { return Ok(reasons) };
    let t = plan.tiered.get_or_insert_with(|| TieredPlan::with_parts(parts));
    t.parts = parts;
    t.auto_parts = given.auto_parts();
    if t.block_cache.is_none() {
        t.host_auto = host_auto(&b, t.storage_dir.as_ref());
    }
    plan.gpu_mem = plan.gpu_mem.or(b.gpu_mem);
    Ok(reasons)
}

enum Chosen {
    Budgets(budgets::Budgets, Vec<String>),
    /// The system gave no memory figures: budgets as given, and why.
    NoFigures(String),
}

/// [`budgets::choose`] on this machine's usable memory, the machine's line first among the
/// reasons.
fn choose_here(w: &Workload, given: Given, gpu_free: Option<u64>) -> anyhow::Result<Chosen> {
    let host = HostMemory::read();
    let Some(usable) = host.usable() else {
        return Ok(Chosen::NoFigures("no memory figures from the system: budgets as given".into()));
    };
    let b = budgets::choose(w, Room { host: usable, gpu_free }, given).map_err(anyhow::Error::msg)?;
    let mut reasons = vec![format!("machine: {}", host.describe())];
    reasons.extend(b.reasons.iter().cloned());
    Ok(Chosen::Budgets(b, reasons))
}

/// Where no host budget was given: every block in RAM while they fit in the chosen share of
/// the host, beyond it that share as a budget with block files in `storage_dir` (else the
/// system's temporary directory).
fn host_auto(b: &budgets::Budgets, storage_dir: Option<&std::path::PathBuf>) -> Option<HostAuto> {
    b.host_mem_auto.map(|bytes| HostAuto {
        bytes,
        storage_dir: Some(storage_dir.cloned().unwrap_or_else(std::env::temp_dir)),
        on_budget: Some(crate::return_freed_memory_at_once),
    })
}
