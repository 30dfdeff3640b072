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
use std::sync::Arc;

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

    /// The whole graph's structure ([`Aggregation::adjacency`]'s) with its values as
    /// [`Factors`] of its nodes, where they factor so: without edge weights, every aggregation
    /// (GCN's `d̂^{-1/2}` on both sides, SAGE's `1/deg` on the rows, GIN's ones). `None` with
    /// weights.
    pub fn factored(self, csr: &Csr, weight: Option<&[f32]>) -> Option<(Csr, Factors)> {
        if weight.is_some() {
            return None;
        }
        let inverse = |degrees: Vec<u32>, f: fn(f64) -> f64| -> Arc<[f64]> {
            degrees.into_iter().map(|d| if d == 0 { 0.0 } else { f(d as f64) }).collect()
        };
        Some(match self {
            Aggregation::GcnNorm => {
                let looped = csr.with_self_loops();
                let inv_sqrt = inverse(looped.degrees(), |d| 1.0 / d.sqrt());
                (looped, Factors { rows: Some(inv_sqrt.clone()), cols: Some(inv_sqrt) })
            }
            Aggregation::Mean => {
                (csr.clone(), Factors { rows: Some(inverse(csr.degrees(), |d| 1.0 / d)), cols: None })
            }
            Aggregation::Sum => (csr.clone(), Factors { rows: None, cols: None }),
        })
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

/// An adjacency's values as one factor per node (whole-graph ids): the entry of row `v` and
/// column `u` is `rows[v] · cols[u]`, a factor absent is 1 ([`Aggregation::factored`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Factors {
    pub rows: Option<Arc<[f64]>>,
    pub cols: Option<Arc<[f64]>>,
}

impl Factors {
    /// The factors of a sub-matrix whose rows are the nodes `rows` and columns the nodes `cols`.
    pub fn of(&self, rows: &[u32], cols: &[u32]) -> (Option<Vec<f64>>, Option<Vec<f64>>) {
        let pick = |f: &Arc<[f64]>, ids: &[u32]| ids.iter().map(|&v| f[v as usize]).collect();
        (self.rows.as_ref().map(|f| pick(f, rows)), self.cols.as_ref().map(|f| pick(f, cols)))
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

#[cfg(test)]
mod tests {
    use super::*;
    use grinnder_graph::BuildOptions;

    /// The factors give every entry the value the aggregation gives it, on a directed graph
    /// (rows and columns weigh differently) with a node that has no neighbours.
    #[test]
    fn factored_values_are_the_adjacencys_values() {
        let (src, dst) = ([0u32, 1, 2, 2, 3, 0], [1u32, 2, 0, 1, 1, 3]);
        let opts = BuildOptions { symmetrise: false, ..Default::default() };
        let csr = Csr::from_edges(5, &src, &dst, opts).unwrap();
        for a in [Aggregation::GcnNorm, Aggregation::Mean, Aggregation::Sum] {
            let (want_s, want) = a.adjacency(&csr, None);
            let (s, f) = a.factored(&csr, None).expect("no weights: factored");
            assert_eq!(s, want_s, "{a:?}: the same structure");
            let mut e = 0;
            for r in 0..s.num_nodes() {
                for &c in s.row(r) {
                    let got = f.rows.as_ref().map_or(1.0, |v| v[r])
                        * f.cols.as_ref().map_or(1.0, |v| v[c as usize]);
                    assert!(
                        (got - want[e]).abs() <= 1e-15 * want[e].abs(),
                        "{a:?} ({r}, {c}): {got} vs {}",
                        want[e]
                    );
                    e += 1;
                }
            }
            assert_eq!(e, want.len());
            assert!(
                f.rows.iter().chain(&f.cols).flat_map(|v| v.iter()).all(|x| x.is_finite()),
                "{a:?}: finite"
            );
        }
        assert!(Aggregation::GcnNorm.factored(&csr, Some(&[1.0; 6])).is_none(), "weights do not factor");
    }
}
