//! The graph as layers see it: sparse structures on the backend with the whole-graph
//! normalisations (docs/design.md, exact execution) as value sets.
//!
//! A graph is bipartite in general: `rows` output nodes (targets) and `cols ≥ rows` input
//! nodes, the targets first (input row `r < rows` is output row `r`'s own input), then the
//! halo. The whole graph is the square case. Node ids key dropout masks, so that a node gets
//! the same mask in every partition that computes it.

use grinnder_graph::Csr;
use grinnder_tensor::{Backend, Mat, Rows, Scalar, SparseMatrix};

use crate::aggregation::Aggregation;

/// A sparse structure and one value set on it.
pub struct Adjacency<B: Backend> {
    pub s: B::Sparse,
    pub vals: Values<B>,
    pub nnz: usize,
}

/// An adjacency's values: one per entry, or factors of its rows and columns.
pub enum Values<B: Backend> {
    Entries(B::Mat),
    /// Entry `(r, c)` is `rows[r] · cols[c]` (a factor absent: 1): a normalisation kept per
    /// node, 4 bytes a node where values per entry take 4 bytes an entry and their transposed
    /// order 4 more (on papers-like at full size, about 25 GiB of a GPU's partition graphs).
    Factored {
        rows: Option<B::Mat>,
        cols: Option<B::Mat>,
    },
}

impl<B: Backend> Adjacency<B> {
    pub fn new(b: &B, s: &SparseMatrix, vals: &[f64]) -> Self {
        let v = Self::values(s, vals);
        Adjacency { s: b.sparse(s), vals: Values::Entries(b.upload(&v)), nnz: s.nnz() }
    }

    /// [`Adjacency::new`] made ahead of its use, off the training thread
    /// ([`grinnder_tensor::HandOffs::sparse_ahead`]).
    pub fn ahead(b: &B, s: &SparseMatrix, vals: &[f64]) -> Self {
        let v = Self::values(s, vals);
        Adjacency { s: b.sparse_ahead(s), vals: Values::Entries(b.upload_ahead(&v)), nnz: s.nnz() }
    }

    /// The structure `s` (its transpose's entry order dropped: factored values need none)
    /// with the values `rows[r] · cols[c]`.
    pub fn factored(b: &B, s: SparseMatrix, rows: Option<&[f64]>, cols: Option<&[f64]>) -> Self {
        let s = s.without_entry_order();
        let up = |f: &[f64]| b.upload(&Mat::from_vec(f.len(), 1, f.iter().map(|&x| B::T::of(x)).collect()));
        assert!(rows.is_none_or(|f| f.len() == s.rows), "one row factor per row");
        assert!(cols.is_none_or(|f| f.len() == s.cols), "one column factor per column");
        let vals = Values::Factored { rows: rows.map(up), cols: cols.map(up) };
        Adjacency { s: b.sparse(&s), vals, nnz: s.nnz() }
    }

    fn values(s: &SparseMatrix, vals: &[f64]) -> Mat<B::T> {
        assert_eq!(vals.len(), s.nnz(), "one value per entry");
        Mat::from_vec(vals.len(), 1, vals.iter().map(|&x| B::T::of(x)).collect())
    }

    /// `out = op(A) x + beta · out` with `A` this adjacency (`transpose`: its transpose).
    pub fn spmm(&self, b: &B, transpose: bool, x: &B::Mat, beta: f64, out: &mut B::Mat) {
        match &self.vals {
            Values::Entries(v) => b.spmm(&self.s, v, transpose, x, beta, out),
            Values::Factored { rows, cols } => {
                b.spmm_factored(&self.s, rows.as_ref(), cols.as_ref(), transpose, x, beta, out)
            }
        }
    }
}

/// Adjacency for message passing (rows = targets): one structure and value set per
/// [`Aggregation`] a layer on it may ask for (an executor builds only its model's).
pub struct Graph<B: Backend> {
    /// Output rows.
    pub rows: usize,
    /// Input rows: the `rows` targets first, then halo sources.
    pub cols: usize,
    /// The adjacencies, by aggregation.
    pub adjacencies: Vec<(Aggregation, Adjacency<B>)>,
    /// Node id of every input row (the first `rows` are the outputs'); `None`: the index.
    pub ids: Option<Vec<u32>>,
}

fn sparse(csr: &Csr) -> SparseMatrix {
    let n = csr.num_nodes();
    SparseMatrix::new(n, n, csr.row_ptr().to_vec(), csr.col_idx().to_vec())
}

impl<B: Backend> Graph<B> {
    /// The whole graph, from a CSR without self loops, with every aggregation's adjacency
    /// (tests and small graphs; executors use [`Graph::with`]).
    pub fn new(b: &B, csr: &Csr) -> Self {
        Self::with(b, csr, None, &[Aggregation::GcnNorm, Aggregation::Mean, Aggregation::Sum])
    }

    /// The whole graph with the adjacencies of the given aggregations; `weight`: its edge
    /// weights, aligned with `csr`'s entries (GCN's normalisation alone takes them,
    /// [`Aggregation::adjacency`]).
    pub fn with(b: &B, csr: &Csr, weight: Option<&[f32]>, aggregations: &[Aggregation]) -> Self {
        let n = csr.num_nodes();
        let adjacencies = aggregations
            .iter()
            .map(|&a| {
                let (s, v) = a.adjacency(csr, weight);
                (a, Adjacency::new(b, &sparse(&s), &v))
            })
            .collect();
        Graph { rows: n, cols: n, adjacencies, ids: None }
    }

    /// A bipartite graph with one adjacency (a partition's, a block's).
    pub fn single(
        rows: usize,
        cols: usize,
        aggregation: Aggregation,
        adj: Adjacency<B>,
        ids: Option<Vec<u32>>,
    ) -> Self {
        Graph { rows, cols, adjacencies: vec![(aggregation, adj)], ids }
    }

    /// This graph's input rows as output rows, with their node ids and no adjacency: for a
    /// layer that reads no neighbours (GCN on its precomputed aggregation) run on every input
    /// row, its dropout keyed by each row's node as the row's owner keys it.
    pub fn columns_only(&self) -> Self {
        Graph { rows: self.cols, cols: self.cols, adjacencies: Vec::new(), ids: self.ids.clone() }
    }

    /// The adjacency of `aggregation` (panics when the graph was built without it).
    pub fn adjacency(&self, aggregation: Aggregation) -> &Adjacency<B> {
        self.adjacencies.iter().find(|(a, _)| *a == aggregation).map(|(_, adj)| adj).unwrap_or_else(|| {
            panic!("this graph was built without the {aggregation:?} adjacency its layer needs")
        })
    }

    /// Entries of the largest adjacency (0 for a graph with none).
    pub fn nnz(&self) -> usize {
        self.adjacencies.iter().map(|(_, a)| a.nnz).max().unwrap_or(0)
    }

    /// Node ids of the output rows (`None`: the row index).
    pub fn row_ids(&self) -> Option<&[u32]> {
        self.ids.as_ref().map(|ids| &ids[..self.rows])
    }

    /// Node ids of the input rows (`None`: the row index).
    pub fn col_ids(&self) -> Option<&[u32]> {
        self.ids.as_deref()
    }

    /// Node ids of a matrix of `n` rows over this graph: its output rows where `n` is their
    /// count, else its input rows (the dropout keys of either side).
    pub fn ids_of_rows(&self, n: usize) -> Option<&[u32]> {
        if n == self.rows {
            self.row_ids()
        } else {
            self.col_ids()
        }
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
