//! What a layer's pass computes on one partition, for the cost model that predicts an epoch's
//! time before it runs: dense products in floating-point operations, sparse products by their
//! width (their speed depends on it), and the elements element-wise kernels read and write.
//! Each conv states its own figures in its file (`work`), as it does its memory ([`crate::memory`]);
//! `Model::layer_work` and `Model::split_work` (in `model/work.rs`) compose them with what a
//! hidden layer adds.

/// A sparse product: `entries` adjacency entries times `width` columns, through the structure
/// or its transpose (the backward's `Âᵀ`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sparse {
    pub entries: u64,
    pub width: u64,
    pub transposed: bool,
}

/// The arithmetic of a pass (see the module).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Work {
    /// Floating-point operations of dense products: `2·m·k·n` each.
    pub gemm_flops: u64,
    pub sparse: Vec<Sparse>,
    /// Elements read and written by element-wise kernels (bias, activation, dropout, norms,
    /// copies, per-edge attention).
    pub elementwise: u64,
}

impl Work {
    /// A dense product `m × k` by `k × n`.
    pub fn gemm(m: u64, k: u64, n: u64) -> Work {
        Work { gemm_flops: 2 * m * k * n, ..Work::default() }
    }

    /// A sparse product over `entries` entries of `width` columns.
    pub fn spmm(entries: u64, width: u64, transposed: bool) -> Work {
        Work { sparse: vec![Sparse { entries, width, transposed }], ..Work::default() }
    }

    /// Element-wise kernels over `elements` elements read and written.
    pub fn elementwise(elements: u64) -> Work {
        Work { elementwise: elements, ..Work::default() }
    }

    /// Both passes' work.
    pub fn and(mut self, other: Work) -> Work {
        self.gemm_flops += other.gemm_flops;
        self.sparse.extend(other.sparse);
        self.elementwise += other.elementwise;
        self
    }

    /// The work `times` times over.
    pub fn times(mut self, times: u64) -> Work {
        self.gemm_flops *= times;
        self.elementwise *= times;
        for s in &mut self.sparse {
            s.entries *= times;
        }
        self
    }
}

/// A sum of works.
impl std::iter::Sum for Work {
    fn sum<I: Iterator<Item = Work>>(iter: I) -> Work {
        iter.fold(Work::default(), Work::and)
    }
}

/// A layer's forward and backward work (backward without the forward it may recompute).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Passes {
    pub forward: Work,
    pub backward: Work,
}
