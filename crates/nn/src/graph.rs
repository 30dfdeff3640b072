//! The graph as layers see it: sparse structures on the backend with the whole-graph
//! normalisations (DESIGN.md §3) as value sets.

use grinnder_graph::{norm, Csr};
use grinnder_tensor::{Backend, Mat, Scalar, SparseMatrix};

/// Adjacency for message passing (rows = targets), with and without self loops.
pub struct Graph<B: Backend> {
    pub num_nodes: usize,
    /// `A + I`, for GCN and GAT.
    pub looped: B::Sparse,
    /// GCN's `D̂^{-1/2} (A + I) D̂^{-1/2}` on `looped`.
    pub gcn_vals: B::Mat,
    /// `A`, for SAGE.
    pub plain: B::Sparse,
    /// Mean aggregation's `1 / in-degree(v)` on `plain`.
    pub mean_vals: B::Mat,
}

fn sparse(csr: &Csr) -> SparseMatrix {
    let n = csr.num_nodes();
    SparseMatrix::new(n, n, csr.row_ptr().to_vec(), csr.col_idx().to_vec())
}

impl<B: Backend> Graph<B> {
    /// Builds from a CSR without self loops.
    pub fn new(b: &B, csr: &Csr) -> Self {
        let looped_csr = csr.with_self_loops();
        let gcn: Vec<B::T> = norm::gcn_norm(&looped_csr).into_iter().map(B::T::of).collect();
        let mean: Vec<B::T> = norm::mean_norm(csr).into_iter().map(B::T::of).collect();
        let (ne, nl) = (mean.len(), gcn.len());
        Graph {
            num_nodes: csr.num_nodes(),
            looped: b.sparse(&sparse(&looped_csr)),
            gcn_vals: b.upload(&Mat::from_vec(nl, 1, gcn)),
            plain: b.sparse(&sparse(csr)),
            mean_vals: b.upload(&Mat::from_vec(ne, 1, mean)),
        }
    }
}
