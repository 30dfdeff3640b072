//! The graph as layers see it: sparse structures on the backend with the whole-graph
//! normalisations (DESIGN.md §3) as value sets.
//!
//! A graph is bipartite in general: `rows` output nodes (targets) and `cols ≥ rows` input
//! nodes, the targets first (input row `r < rows` is output row `r`'s own input), then the
//! halo. The whole graph is the square case. Node ids key dropout masks, so that a node gets
//! the same mask in every partition that computes it.

use grinnder_graph::{norm, Csr};
use grinnder_tensor::{Backend, Mat, Rows, Scalar, SparseMatrix};

/// A sparse structure and one value set on it.
pub struct Adjacency<B: Backend> {
    pub s: B::Sparse,
    pub vals: B::Mat,
    pub nnz: usize,
}

impl<B: Backend> Adjacency<B> {
    pub fn new(b: &B, s: &SparseMatrix, vals: &[f64]) -> Self {
        let v = Self::values(s, vals);
        Adjacency { s: b.sparse(s), vals: b.upload(&v), nnz: s.nnz() }
    }

    /// [`Adjacency::new`] made ahead of its use, off the training thread
    /// ([`Backend::sparse_ahead`]).
    pub fn ahead(b: &B, s: &SparseMatrix, vals: &[f64]) -> Self {
        let v = Self::values(s, vals);
        Adjacency { s: b.sparse_ahead(s), vals: b.upload_ahead(&v), nnz: s.nnz() }
    }

    fn values(s: &SparseMatrix, vals: &[f64]) -> Mat<B::T> {
        assert_eq!(vals.len(), s.nnz(), "one value per entry");
        Mat::from_vec(vals.len(), 1, vals.iter().map(|&x| B::T::of(x)).collect())
    }
}

/// Adjacency for message passing (rows = targets), with and without self loops.
pub struct Graph<B: Backend> {
    /// Output rows.
    pub rows: usize,
    /// Input rows: the `rows` targets first, then halo sources.
    pub cols: usize,
    /// `A + I` with GCN's `D̂^{-1/2} (A + I) D̂^{-1/2}` (GCN and GAT).
    pub looped: Option<Adjacency<B>>,
    /// `A` with mean aggregation's `1 / in-degree(v)` (SAGE).
    pub plain: Option<Adjacency<B>>,
    /// Node id of every input row (the first `rows` are the outputs'); `None`: the index.
    pub ids: Option<Vec<u32>>,
}

fn sparse(csr: &Csr) -> SparseMatrix {
    let n = csr.num_nodes();
    SparseMatrix::new(n, n, csr.row_ptr().to_vec(), csr.col_idx().to_vec())
}

impl<B: Backend> Graph<B> {
    /// The whole graph, from a CSR without self loops, with both adjacencies.
    pub fn new(b: &B, csr: &Csr) -> Self {
        let looped_csr = csr.with_self_loops();
        let n = csr.num_nodes();
        Graph {
            rows: n,
            cols: n,
            looped: Some(Adjacency::new(b, &sparse(&looped_csr), &norm::gcn_norm(&looped_csr))),
            plain: Some(Adjacency::new(b, &sparse(csr), &norm::mean_norm(csr))),
            ids: None,
        }
    }

    /// `A + I` (panics when the graph was built without it: GCN and GAT need it).
    pub fn looped(&self) -> &Adjacency<B> {
        self.looped.as_ref().expect("this graph was built without self loops, which GCN and GAT need")
    }

    /// `A` (panics when the graph was built without it: SAGE needs it).
    pub fn plain(&self) -> &Adjacency<B> {
        self.plain.as_ref().expect("this graph was built without the plain adjacency, which SAGE needs")
    }

    /// Node ids of the output rows (`None`: the row index).
    pub fn row_ids(&self) -> Option<&[u32]> {
        self.ids.as_ref().map(|ids| &ids[..self.rows])
    }

    /// Node ids of the input rows (`None`: the row index).
    pub fn col_ids(&self) -> Option<&[u32]> {
        self.ids.as_deref()
    }

    /// The output rows' own inputs, `x`'s first `rows` rows, as a copy; `None` when `x` has
    /// no other rows (use `x` itself).
    pub fn own_rows(&self, b: &B, x: &B::Mat) -> Option<B::Mat> {
        let (n, d) = b.dims(x);
        if n == self.rows {
            return None;
        }
        let mut out = b.output(self.rows, d);
        b.gather_rows(x, Rows::Range(0, self.rows), &mut out, 0);
        Some(out)
    }

    /// Adds `d` (`rows × k`) into the first `rows` rows of `dx` (`cols × k`).
    pub fn add_own_rows(&self, b: &B, d: &B::Mat, dx: &mut B::Mat) {
        if b.dims(dx).0 == self.rows {
            b.binary(grinnder_tensor::Binary::Add, d, dx);
        } else {
            b.scatter_add_rows(d, 0, Rows::Range(0, self.rows), dx);
        }
    }
}
