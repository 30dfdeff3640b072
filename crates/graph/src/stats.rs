//! Summary figures of a dataset for `grinnder info`: sizes, degree distribution, split sizes,
//! and the memory a full-graph layer needs.

use crate::Dataset;

/// Degree distribution summary.
#[derive(Clone, Debug, PartialEq)]
pub struct DegreeSummary {
    pub min: u32,
    pub max: u32,
    pub mean: f64,
    pub median: u32,
    pub p90: u32,
    pub p99: u32,
    pub isolated: usize,
}

/// Summarises in-degrees.
pub fn degree_summary(ds: &Dataset) -> DegreeSummary {
    let mut d = ds.graph.degrees();
    let n = d.len();
    let mean = if n == 0 { 0.0 } else { ds.graph.num_edges() as f64 / n as f64 };
    let isolated = d.iter().filter(|&&x| x == 0).count();
    rayon::slice::ParallelSliceMut::par_sort_unstable(d.as_mut_slice());
    let q = |p: f64| if n == 0 { 0 } else { d[((n - 1) as f64 * p).round() as usize] };
    DegreeSummary { min: q(0.0), max: q(1.0), mean, median: q(0.5), p90: q(0.9), p99: q(0.99), isolated }
}

/// Bytes of one fp32 `N × hidden` activation matrix.
pub fn layer_bytes(num_nodes: usize, hidden: usize) -> u64 {
    num_nodes as u64 * hidden as u64 * 4
}

/// Bytes of the graph structure (CSR) as stored.
pub fn structure_bytes(ds: &Dataset) -> u64 {
    (ds.graph.row_ptr().len() * 8 + ds.graph.col_idx().len() * 4) as u64
}

/// Bytes a plain full-graph trainer keeps resident for `layers` layers of width `hidden`:
/// structure, input features, and per layer one activation and one gradient matrix.
pub fn full_graph_bytes(ds: &Dataset, hidden: usize, layers: usize) -> u64 {
    let n = ds.num_nodes();
    structure_bytes(ds) + (ds.features.data.len() * 4) as u64 + 2 * layers as u64 * layer_bytes(n, hidden)
}
