//! How a layer family aggregates its neighbours, and the adjacency values that takes — on the
//! whole graph, on a server's share of it and on a sampled mini-batch block. Executors ask the
//! model for its [`Aggregation`] and build what it says; they never ask which layer it is.
//!
//! Values follow the rule of exact execution (docs/design.md): normalisations come from the
//! whole graph (its degrees), so a partition, a share or a block computes exactly what the whole
//! graph would for every node whose neighbourhood it holds; where a sample holds fewer
//! neighbours, sums are rescaled by degree over sample size (unbiased), and means average what
//! was sampled.

use grinnder_graph::sample::Block;
use grinnder_graph::{norm, Csr};
use grinnder_tensor::SparseMatrix;

/// The neighbourhood aggregation of a layer family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Aggregation {
    /// `D̂^{-1/2} (A + I) D̂^{-1/2}`: a self loop per node, GCN's symmetric normalisation
    /// (GCN; GAT's attention runs on the same structure).
    GcnNorm,
    /// `1 / in-degree(v)` over the neighbours, no self loop (SAGE's mean).
    Mean,
    /// The plain sum over the neighbours, no self loop (GIN).
    Sum,
}

impl Aggregation {
    /// Whether the structure holds a self loop per node.
    pub fn self_loops(self) -> bool {
        self == Aggregation::GcnNorm
    }

    /// The whole graph's adjacency (`csr` without self loops, rows its targets: directed or
    /// symmetric alike): the structure and one value per entry, aligned with its column
    /// indices. `weight`: the edge weights aligned with `csr`'s entries, which only GCN's
    /// normalisation takes (PyG's `gcn_norm`; SAGE's, GIN's and GAT's layers have none, and
    /// the trainer refuses weights with them before an adjacency is made).
    pub fn adjacency(self, csr: &Csr, weight: Option<&[f32]>) -> (Csr, Vec<f64>) {
        assert!(
            weight.is_none() || self == Aggregation::GcnNorm,
            "{self:?} takes no edge weights (the trainer refuses them)"
        );
        match (self, weight) {
            (Aggregation::GcnNorm, Some(w)) => norm::gcn_norm_weighted(csr, w),
            (Aggregation::GcnNorm, None) => {
                let looped = csr.with_self_loops();
                let v = norm::gcn_norm(&looped);
                (looped, v)
            }
            (Aggregation::Mean, _) => (csr.clone(), norm::mean_norm(csr)),
            (Aggregation::Sum, _) => (csr.clone(), vec![1.0; csr.num_edges()]),
        }
    }

    /// A share of a graph (`csr`, without self loops) whose nodes have `whole_degree`
    /// neighbours in the whole graph: the whole graph's normalisation, and a node missing
    /// neighbours in the share has its neighbour sum scaled by (degree there / degree here),
    /// as a sampled block's; means average the neighbours present. A node with every neighbour
    /// present computes exactly what it would on the whole graph.
    pub fn share_adjacency(self, csr: &Csr, whole_degree: &[u32]) -> (Csr, Vec<f64>) {
        assert_eq!(whole_degree.len(), csr.num_nodes(), "one degree per node");
        match self {
            Aggregation::GcnNorm => {
                let looped = csr.with_self_loops();
                let looped_degree: Vec<u32> = whole_degree.iter().map(|d| d + 1).collect();
                let mut v = norm::gcn_norm_with(&looped, &looped_degree);
                rescale_partial_rows(&looped, whole_degree, true, &mut v);
                (looped, v)
            }
            Aggregation::Mean => (csr.clone(), norm::mean_norm(csr)),
            Aggregation::Sum => {
                let mut v = vec![1.0; csr.num_edges()];
                rescale_partial_rows(csr, whole_degree, false, &mut v);
                (csr.clone(), v)
            }
        }
    }

    /// A sampled block's structure and values (host side: a sampling thread builds it),
    /// without its transpose (the backend builds that where the block goes). `g` is the whole
    /// graph, for degrees; GCN's rows get their self loop first (column `r` is row `r`'s node).
    pub fn sampled(self, g: &Csr, blk: &Block) -> (SparseMatrix, Vec<f64>) {
        let deg = |v: u32| (g.row_ptr()[v as usize + 1] - g.row_ptr()[v as usize]) as f64;
        let sampled = |r: usize| (blk.row_ptr[r + 1] - blk.row_ptr[r]) as f64;
        let row_ids = blk.row_ids().to_vec();
        let neighbours = |r: usize| &blk.col_idx[blk.row_ptr[r] as usize..blk.row_ptr[r + 1] as usize];
        let (ptr, idx, vals) = match self {
            Aggregation::Mean => {
                let vals: Vec<f64> = (0..blk.rows)
                    .flat_map(|r| std::iter::repeat_n(1.0 / sampled(r), sampled(r) as usize))
                    .collect();
                (blk.row_ptr.clone(), blk.col_idx.clone(), vals)
            }
            Aggregation::Sum => {
                let scale = |r: usize| if sampled(r) > 0.0 { deg(blk.col_ids[r]) / sampled(r) } else { 0.0 };
                let vals: Vec<f64> =
                    (0..blk.rows).flat_map(|r| std::iter::repeat_n(scale(r), sampled(r) as usize)).collect();
                (blk.row_ptr.clone(), blk.col_idx.clone(), vals)
            }
            Aggregation::GcnNorm => {
                let mut ptr = vec![0u64];
                let (mut idx, mut vals) = (Vec::new(), Vec::new());
                for r in 0..blk.rows {
                    let v = blk.col_ids[r];
                    let dv = deg(v) + 1.0;
                    let scale = if sampled(r) > 0.0 { deg(v) / sampled(r) } else { 0.0 };
                    idx.push(r as u32);
                    vals.push(1.0 / dv);
                    for &c in neighbours(r) {
                        let du = deg(blk.col_ids[c as usize]) + 1.0;
                        idx.push(c);
                        vals.push(scale / (dv * du).sqrt());
                    }
                    ptr.push(idx.len() as u64);
                }
                (ptr, idx, vals)
            }
        };
        let s = SparseMatrix::csr_only(blk.rows, blk.cols, ptr, idx).with_ids(row_ids, blk.col_ids.clone());
        (s, vals)
    }
}

/// Scales each row's neighbour entries (the self loop excepted, when `looped`) by
/// (whole degree / degree here), where a row holds fewer neighbours than the whole graph.
fn rescale_partial_rows(csr: &Csr, whole_degree: &[u32], looped: bool, v: &mut [f64]) {
    let ptr = csr.row_ptr();
    for (r, &whole) in whole_degree.iter().enumerate() {
        let here = csr.row(r).len() - usize::from(looped);
        if here as u32 == whole {
            continue;
        }
        let scale = if here == 0 { 0.0 } else { whole as f64 / here as f64 };
        for (e, &c) in (ptr[r] as usize..).zip(csr.row(r)) {
            if !looped || c as usize != r {
                v[e] *= scale;
            }
        }
    }
}
