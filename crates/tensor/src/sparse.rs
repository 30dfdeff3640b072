//! `SparseMatrix`: the structure of a sparse matrix in CSR form together with its transpose,
//! so that both `A·X` and `Aᵀ·X` run as row-parallel gathers without atomics. Values are
//! separate (per stored entry, in CSR order, or factored into one per row and one per column),
//! so one structure serves several value sets (normalisations, attention coefficients).
//!
//! Invariant: where kept, `t_perm[k]` is the CSR position of the k-th entry of the transpose,
//! so `Aᵀ[t_row][t_col_idx[k]] = vals[t_perm[k]]`; a structure for factored values keeps none
//! ([`SparseMatrix::without_entry_order`]), and its transpose is the same either way.

/// CSR structure of an `rows × cols` matrix and of its transpose.
#[derive(Clone, Debug, PartialEq)]
pub struct SparseMatrix {
    pub rows: usize,
    pub cols: usize,
    pub row_ptr: Vec<u64>,
    pub col_idx: Vec<u32>,
    pub t_row_ptr: Vec<u64>,
    pub t_col_idx: Vec<u32>,
    pub t_perm: Vec<u64>,
    /// Node ids that key edge dropout masks in place of the row and column indices (a
    /// partition's rows and columns are a subset of the graph's; see [`SparseMatrix::with_ids`]).
    pub row_ids: Option<Vec<u32>>,
    pub col_ids: Option<Vec<u32>>,
}

impl SparseMatrix {
    /// Builds the transpose of a CSR structure (each row's columns ascending).
    pub fn new(rows: usize, cols: usize, row_ptr: Vec<u64>, col_idx: Vec<u32>) -> SparseMatrix {
        SparseMatrix::csr_only(rows, cols, row_ptr, col_idx).with_transpose()
    }

    /// The CSR structure alone: its transpose is left to whoever needs it
    /// ([`SparseMatrix::with_transpose`], or a backend that builds it where the structure goes:
    /// a GPU transposes a mini-batch's blocks in a fraction of the time a CPU thread takes).
    pub fn csr_only(rows: usize, cols: usize, row_ptr: Vec<u64>, col_idx: Vec<u32>) -> SparseMatrix {
        assert_eq!(row_ptr.len(), rows + 1, "row_ptr has rows + 1 entries");
        assert_eq!(row_ptr[rows] as usize, col_idx.len(), "row_ptr ends at the entry count");
        // (a device builds the transpose from these without checking them)
        if let Some(&c) = col_idx.iter().find(|&&c| c as usize >= cols) {
            panic!("column {c} out of range");
        }
        SparseMatrix {
            rows,
            cols,
            row_ptr,
            col_idx,
            t_row_ptr: Vec::new(),
            t_col_idx: Vec::new(),
            t_perm: Vec::new(),
            row_ids: None,
            col_ids: None,
        }
    }

    /// Whether the transpose is stored (see [`SparseMatrix::csr_only`]).
    pub fn has_transpose(&self) -> bool {
        self.t_row_ptr.len() == self.cols + 1
    }

    /// The structure with its transpose (built here where it is missing).
    pub fn with_transpose(mut self) -> SparseMatrix {
        if !self.has_transpose() {
            (self.t_row_ptr, self.t_col_idx, self.t_perm) = self.transpose_parts();
        }
        self
    }

    /// The transpose's offsets, indices and entry permutation, built from the CSR structure (by
    /// a counting sort over columns; rows are visited in order, so every transposed row comes
    /// out ascending).
    pub fn transpose_parts(&self) -> (Vec<u64>, Vec<u32>, Vec<u64>) {
        self.transpose_with(true)
    }

    /// [`SparseMatrix::transpose_parts`], the entry permutation only `with_order` (empty
    /// otherwise: 8 bytes an entry never allocated).
    fn transpose_with(&self, with_order: bool) -> (Vec<u64>, Vec<u32>, Vec<u64>) {
        let (rows, cols, row_ptr, col_idx) = (self.rows, self.cols, &self.row_ptr, &self.col_idx);
        let nnz = col_idx.len();
        let mut t_row_ptr = vec![0u64; cols + 1];
        for &c in col_idx {
            t_row_ptr[c as usize + 1] += 1;
        }
        for c in 0..cols {
            t_row_ptr[c + 1] += t_row_ptr[c];
        }
        let mut cursor = t_row_ptr.clone();
        let mut t_col_idx = vec![0u32; nnz];
        let mut t_perm = vec![0u64; if with_order { nnz } else { 0 }];
        for r in 0..rows {
            for e in row_ptr[r]..row_ptr[r + 1] {
                let c = col_idx[e as usize] as usize;
                let at = cursor[c] as usize;
                t_col_idx[at] = r as u32;
                if with_order {
                    t_perm[at] = e;
                }
                cursor[c] += 1;
            }
        }
        (t_row_ptr, t_col_idx, t_perm)
    }

    /// Keys edge dropout by the node ids of rows and columns, so an edge gets the same mask in
    /// every sub-matrix that holds it.
    pub fn with_ids(mut self, row_ids: Vec<u32>, col_ids: Vec<u32>) -> SparseMatrix {
        assert_eq!(row_ids.len(), self.rows, "one id per row");
        assert_eq!(col_ids.len(), self.cols, "one id per column");
        self.row_ids = Some(row_ids);
        self.col_ids = Some(col_ids);
        self
    }

    /// The structure without its transpose's entry order (`t_perm`: 8 bytes an entry here, 4
    /// on a device): for values that factor into one per row and one per column
    /// ([`crate::GraphOps::spmm_factored`]), which the transpose reads without it. A product
    /// with values per entry refuses it transposed.
    pub fn without_entry_order(mut self) -> SparseMatrix {
        if !self.has_transpose() {
            (self.t_row_ptr, self.t_col_idx, _) = self.transpose_with(false);
        }
        self.t_perm = Vec::new();
        self
    }

    /// Whether the transpose's entry order is kept (see [`SparseMatrix::without_entry_order`]).
    pub fn has_entry_order(&self) -> bool {
        self.t_perm.len() == self.nnz()
    }

    pub fn nnz(&self) -> usize {
        self.col_idx.len()
    }

    /// Entries of row `r` as a CSR position range.
    pub fn row_range(&self, r: usize) -> std::ops::Range<usize> {
        self.row_ptr[r] as usize..self.row_ptr[r + 1] as usize
    }
}

/// Positions of `idx` grouped by value (a counting sort, stable): the `k` with `idx[k] == r`
/// are `order[ptr[r]..ptr[r + 1]]`, in increasing order. Scatter-adds use it so that each
/// destination row is summed by one task, in input order (deterministic, no atomics).
pub fn group_by_row(idx: &[u32], rows: usize) -> (Vec<usize>, Vec<u32>) {
    let mut ptr = vec![0usize; rows + 1];
    for &i in idx {
        assert!((i as usize) < rows, "row {i} out of range");
        ptr[i as usize + 1] += 1;
    }
    for r in 0..rows {
        ptr[r + 1] += ptr[r];
    }
    let mut order = vec![0u32; idx.len()];
    let mut cursor = ptr.clone();
    for (k, &i) in idx.iter().enumerate() {
        order[cursor[i as usize]] = k as u32;
        cursor[i as usize] += 1;
    }
    (ptr, order)
}
