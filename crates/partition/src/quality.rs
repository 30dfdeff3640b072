//! Quality figures of a partitioning: balance, edge cut, halo volume and replication factor.

use grinnder_graph::Csr;
use rayon::prelude::*;

use crate::partitioner::Partitioning;

/// How good a partitioning is for the layer-wise executor.
#[derive(Clone, Debug, PartialEq)]
pub struct Quality {
    /// Largest partition over the mean size (1.0 is perfect).
    pub balance: f64,
    /// Directed edges whose endpoints lie in different partitions.
    pub edge_cut: u64,
    /// Σ_p |halo(p)|: outside nodes with an edge into p, summed — the rows gathered per layer
    /// beyond the partitions' own.
    pub halo_volume: u64,
    /// (nodes + halo volume) / nodes: how many copies of a row are read per layer.
    pub replication_factor: f64,
}

/// Computes the figures of `p` on `graph` (original ids).
pub fn quality(graph: &Csr, p: &Partitioning) -> Quality {
    let n = graph.num_nodes();
    let sizes = p.sizes();
    let mean = n as f64 / p.parts as f64;
    let balance = sizes.iter().copied().max().unwrap_or(0) as f64 / mean.max(f64::MIN_POSITIVE);
    let edge_cut = (0..n)
        .into_par_iter()
        .map(|v| graph.row(v).iter().filter(|&&u| p.part[u as usize] != p.part[v]).count() as u64)
        .sum();
    // halo(q) = distinct outside in-neighbours of q's rows: count per (q, u) pair once
    let halo_volume = (0..p.parts)
        .into_par_iter()
        .map(|q| {
            let mut seen: Vec<u32> = (p.ptr[q]..p.ptr[q + 1])
                .flat_map(|id| graph.row(p.inv_perm[id as usize] as usize).iter().copied())
                .filter(|&u| p.part[u as usize] as usize != q)
                .collect();
            seen.sort_unstable();
            seen.dedup();
            seen.len() as u64
        })
        .sum();
    Quality {
        balance,
        edge_cut,
        halo_volume,
        replication_factor: (n as u64 + halo_volume) as f64 / n.max(1) as f64,
    }
}
