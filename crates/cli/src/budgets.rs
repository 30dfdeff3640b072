//! What the flags leave open, chosen from the machine ([`grinnder_engine::budgets::choose`]):
//! the trainer (the whole graph in memory, or partitions), the GPU budget and the host memory
//! a run may use, and where blocks spill when they do not fit. Used by `train`, `info` and the
//! Python `Trainer`; every flag given is kept.

use grinnder_engine::budgets::{self, Given, Room, Workload};
use grinnder_engine::machine::HostMemory;
use grinnder_engine::tiered::HostAuto;
use grinnder_graph::Dataset;

use crate::plan::{TieredPlan, TrainPlan};

/// The workload `plan` trains on `ds`.
pub fn workload(plan: &TrainPlan, ds: &Dataset) -> Workload {
    let m = &plan.config.model;
    let mut widths = vec![ds.features.dim as u64];
    widths.extend((1..m.layers).map(|_| m.hidden_width() as u64));
    widths.push(ds.num_classes as u64);
    let edge_values =
        if m.heads_of_hidden() > 1 || m.kind == grinnder_nn::Kind::Gat { m.heads.max(1) as u64 } else { 0 };
    Workload {
        nodes: ds.num_nodes() as u64,
        edges: ds.graph.num_edges() as u64,
        widths,
        edge_values,
        elem: 4,
    }
}

/// Settles `plan` for `ds` on this machine (`gpu_free`: the device's free bytes, `None` on the
/// CPU): full-graph training in one process only (mini-batches and ranks keep their own
/// rules). Returns why, a line per choice.
pub fn settle(plan: &mut TrainPlan, ds: &Dataset, gpu_free: Option<u64>) -> anyhow::Result<Vec<String>> {
    if plan.minibatch.is_some() {
        return Ok(Vec::new());
    }
    let host = HostMemory::read();
    let Some(usable) = host.usable() else {
        return Ok(vec!["no memory figures from the system: budgets as given".into()]);
    };
    let t = plan.tiered.as_ref();
    let given = Given {
        parts: t.filter(|t| t.parts_given).map(|t| t.parts),
        gpu_mem: plan.gpu_mem,
        host_mem: t.and_then(|t| t.host_mem),
        tiered: t.is_some(),
    };
    let b = budgets::choose(&workload(plan, ds), Room { host: usable, gpu_free }, given)
        .map_err(anyhow::Error::msg)?;
    let mut reasons = vec![format!("machine: {}", host.describe())];
    reasons.extend(b.reasons);
    let Some(parts) = b.parts else { return Ok(reasons) };
    let t = plan.tiered.get_or_insert_with(|| TieredPlan::with_parts(parts));
    t.parts = parts;
    t.auto_parts = given.parts.is_none() && given.host_mem.is_none() && given.gpu_mem.is_none();
    if t.block_cache.is_none() {
        t.host_auto = b.host_mem_auto.map(|bytes| HostAuto {
            bytes,
            storage_dir: Some(t.storage_dir.clone().unwrap_or_else(std::env::temp_dir)),
        });
    }
    plan.gpu_mem = plan.gpu_mem.or(b.gpu_mem);
    Ok(reasons)
}
