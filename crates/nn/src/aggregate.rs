//! `y = A · x · Wᵀ + b` for a fixed sparse `A` (a structure and its value set) — the part GCN
//! and SAGE share — evaluated on the narrower side: `(A x) Wᵀ` when `in ≤ out` (the
//! aggregation `A x` is kept for backward, or given precomputed for a fixed input), else
//! `A (x Wᵀ)`. Every order computes the same function and gradients.

use grinnder_tensor::Backend;

use crate::graph::{Adjacency, Graph};
use crate::linear::Linear;

/// What backward of a GCN or SAGE layer needs besides the layer input.
pub struct AggCache<B: Backend> {
    /// `A x` when the layer aggregated first.
    pub(crate) agg: Option<B::Mat>,
}

impl<B: Backend> AggCache<B> {
    /// The cache of a forward that kept no aggregation (it was given `pre`, or transformed
    /// first): backward then needs only the layer input.
    pub(crate) fn without_aggregation() -> Self {
        AggCache { agg: None }
    }
}

/// `A x` (`g.rows` rows).
pub fn aggregate<B: Backend>(b: &B, g: &Graph<B>, a: &Adjacency<B>, x: &B::Mat) -> B::Mat {
    let mut t = b.output(g.rows, b.dims(x).1);
    a.spmm(b, false, x, 0.0, &mut t);
    t
}

/// Forward; `pre` is `A x` when the caller has it. Returns `y` and the aggregation to keep for
/// backward (when this call computed one).
pub fn forward<B: Backend>(
    b: &B,
    lin: &Linear<B>,
    g: &Graph<B>,
    a: &Adjacency<B>,
    x: &B::Mat,
    pre: Option<&B::Mat>,
) -> (B::Mat, Option<B::Mat>) {
    if let Some(t) = pre {
        return (lin.forward(b, t), None);
    }
    let out_dim = lin.out_dim(b);
    if lin.in_dim(b) <= out_dim {
        let t = aggregate(b, g, a, x);
        return (lin.forward(b, &t), Some(t));
    }
    let mut h = b.output(b.dims(x).0, out_dim);
    b.gemm(1.0, x, false, &lin.weight.value, true, 0.0, &mut h);
    let mut y = b.output(g.rows, out_dim);
    a.spmm(b, false, &h, 0.0, &mut y);
    if let Some(bias) = &lin.bias {
        b.add_row(&bias.value, &mut y);
    }
    (y, None)
}

/// Backward: accumulates `lin`'s gradients; when `need_dx`, adds `dx` (`g.cols` rows) into
/// `dx_acc` (allocated when `None`). `agg` is `A x` when forward used it (precomputed or kept), `None` when it
/// transformed first.
#[allow(clippy::too_many_arguments)]
pub fn backward<B: Backend>(
    b: &B,
    lin: &mut Linear<B>,
    g: &Graph<B>,
    a: &Adjacency<B>,
    x: &B::Mat,
    agg: Option<&B::Mat>,
    dy: &B::Mat,
    need_dx: bool,
    dx_acc: &mut Option<B::Mat>,
) {
    let n = g.cols;
    let in_dim = lin.in_dim(b);
    let beta = if dx_acc.is_some() { 1.0 } else { 0.0 };
    if need_dx && dx_acc.is_none() {
        *dx_acc = Some(b.output(n, in_dim));
    }
    let dx = dx_acc.as_mut().filter(|_| need_dx);
    if let Some(t) = agg {
        if let (Some(dt), Some(dx)) = (lin.backward(b, t, dy, need_dx), dx) {
            a.spmm(b, true, &dt, beta, dx);
        }
    } else {
        // transform first: y = A h + b, h = x Wᵀ
        let out_dim = b.dims(dy).1;
        let mut dh = b.output(n, out_dim);
        a.spmm(b, true, dy, 0.0, &mut dh);
        b.gemm(1.0, &dh, true, x, false, 1.0, &mut lin.weight.grad);
        if let Some(bias) = &mut lin.bias {
            b.col_sums(dy, 1.0, &mut bias.grad);
        }
        if let Some(dx) = dx {
            b.gemm(1.0, &dh, false, &lin.weight.value, false, beta, dx);
        }
    }
}
