//! The partitioned graph: per partition a bipartite one-hop CSR whose rows are the partition's
//! own nodes and whose columns are its own nodes followed by its halo (outside in-neighbours),
//! grouped by owning partition; the edge values are those of the full graph (whole-graph
//! normalisation, docs/design.md), so a partition computes exactly what the full graph would.
//!
//! Ids: "new" ids are after renumbering (partition p owns `ptr[p]..ptr[p + 1]`); "local"
//! columns are `0..own` for own nodes (new id − ptr[p]) and `own..own + halo` for halo nodes in
//! ascending new id, which groups them by owner.

use grinnder_graph::Csr;
use rayon::prelude::*;

use crate::partitioner::Partitioning;

/// One partition's one-hop bipartite CSR.
#[derive(Clone, Debug, PartialEq)]
pub struct PartitionGraph {
    pub part: usize,
    /// First new id of the partition; its rows are `first..first + own`.
    pub first: u64,
    pub own: usize,
    /// New ids of the halo columns, ascending (grouped by owning partition).
    pub halo: Vec<u32>,
    pub row_ptr: Vec<u64>,
    /// Local column of every entry; each row ascending.
    pub col_idx: Vec<u32>,
    /// One array per value set given at build time, aligned with `col_idx`.
    pub values: Vec<Vec<f64>>,
    /// For every source partition that supplies halo rows: (source, its local rows to fetch),
    /// in the order of the halo columns.
    pub fetch: Vec<(usize, Vec<u32>)>,
}

impl PartitionGraph {
    pub fn columns(&self) -> usize {
        self.own + self.halo.len()
    }
}

/// Every partition's bipartite CSR.
#[derive(Clone, Debug, PartialEq)]
pub struct PartitionedGraph {
    pub partitions: Vec<PartitionGraph>,
}

impl PartitionedGraph {
    /// Builds every partition of `graph` (original ids; rows are targets) under `p`, carrying
    /// `values` (each aligned with `graph.col_idx()`), in parallel over partitions.
    pub fn build(graph: &Csr, p: &Partitioning, values: &[&[f64]]) -> PartitionedGraph {
        for v in values {
            assert_eq!(v.len(), graph.num_edges(), "a value set needs one value per edge");
        }
        let partitions = (0..p.parts).into_par_iter().map(|q| build_one(graph, p, values, q)).collect();
        PartitionedGraph { partitions }
    }

    /// Total halo rows gathered per layer (Σ_p |halo(p)|).
    pub fn halo_volume(&self) -> u64 {
        self.partitions.iter().map(|g| g.halo.len() as u64).sum()
    }
}

fn build_one(graph: &Csr, p: &Partitioning, values: &[&[f64]], q: usize) -> PartitionGraph {
    let (first, end) = (p.ptr[q], p.ptr[q + 1]);
    let own = (end - first) as usize;
    let ptr = graph.row_ptr();
    // halo: distinct outside new ids, ascending
    let mut halo: Vec<u32> = (first..end)
        .flat_map(|id| graph.row(p.inv_perm[id as usize] as usize).iter().map(|&u| p.perm[u as usize]))
        .filter(|&w| !(first..end).contains(&(w as u64)))
        .collect();
    halo.sort_unstable();
    halo.dedup();
    let local = |w: u32| -> u32 {
        if (first..end).contains(&(w as u64)) {
            (w as u64 - first) as u32
        } else {
            own as u32 + halo.binary_search(&w).expect("every outside in-neighbour is in the halo") as u32
        }
    };
    let mut row_ptr = Vec::with_capacity(own + 1);
    row_ptr.push(0u64);
    let mut col_idx = Vec::new();
    let mut vals: Vec<Vec<f64>> = vec![Vec::new(); values.len()];
    let mut entries: Vec<(u32, usize)> = Vec::new();
    for id in first..end {
        let v = p.inv_perm[id as usize] as usize;
        entries.clear();
        let base = ptr[v] as usize;
        entries.extend(graph.row(v).iter().enumerate().map(|(k, &u)| (local(p.perm[u as usize]), base + k)));
        entries.sort_unstable();
        for &(c, e) in &entries {
            col_idx.push(c);
            for (out, src) in vals.iter_mut().zip(values) {
                out.push(src[e]);
            }
        }
        row_ptr.push(col_idx.len() as u64);
    }
    // fetch lists: halo ids are ascending, so each source partition's rows are one run
    let mut fetch: Vec<(usize, Vec<u32>)> = Vec::new();
    for &w in &halo {
        let src = p.ptr.partition_point(|&b| b <= w as u64) - 1;
        let row = (w as u64 - p.ptr[src]) as u32;
        match fetch.last_mut() {
            Some((s, rows)) if *s == src => rows.push(row),
            _ => fetch.push((src, vec![row])),
        }
    }
    PartitionGraph { part: q, first, own, halo, row_ptr, col_idx, values: vals, fetch }
}

/// Rows of a row-major `old`-ordered matrix in new order: new row i = old row `inv_perm[i]`.
pub fn renumber_rows<T: Copy + Send + Sync>(rows: &[T], dim: usize, inv_perm: &[u32]) -> Vec<T> {
    inv_perm
        .par_iter()
        .flat_map_iter(|&v| rows[v as usize * dim..(v as usize + 1) * dim].iter().copied())
        .collect()
}

/// Node ids (e.g. a split) in new ids, ascending.
pub fn renumber_ids(ids: &[u32], perm: &[u32]) -> Vec<u32> {
    let mut out: Vec<u32> = ids.iter().map(|&v| perm[v as usize]).collect();
    out.sort_unstable();
    out
}
