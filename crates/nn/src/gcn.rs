//! GCNConv (Kipf & Welling): `y = Â x Wᵀ + b` with `Â = D̂^{-1/2} (A + I) D̂^{-1/2}` computed on
//! the whole graph (`Graph::gcn_vals`). Shapes: `x` `[n, in]`, `W` `[out, in]`, `b` `[1, out]`,
//! `y` `[n, out]`.
//!
//! The product is evaluated on the narrower side: `(Â x) Wᵀ` when `in ≤ out`, else `Â (x Wᵀ)`;
//! for a fixed input the caller may pass `Â x` precomputed once, and backward then needs no
//! sparse product at all. Every order computes the same function and gradients.

use grinnder_tensor::Backend;

use crate::graph::Graph;
use crate::linear::Linear;
use crate::param::Param;

pub struct GcnConv<B: Backend> {
    pub lin: Linear<B>,
}

/// What backward needs besides the layer input.
pub struct GcnCache<B: Backend> {
    /// `Â x` when the layer aggregated first.
    agg: Option<B::Mat>,
}

impl<B: Backend> GcnConv<B> {
    pub fn init(b: &B, name: &str, in_dim: usize, out_dim: usize, seed: u64) -> Self {
        GcnConv { lin: Linear::init(b, name, in_dim, out_dim, true, seed) }
    }

    /// `Â x`, the aggregation of an input (what a fixed input can have done once).
    pub fn aggregate(b: &B, g: &Graph<B>, x: &B::Mat) -> B::Mat {
        let (n, d) = b.dims(x);
        let mut t = b.zeros(n, d);
        b.spmm(&g.looped, &g.gcn_vals, false, x, 0.0, &mut t);
        t
    }

    /// Forward; `pre` is `Â x` when the caller has it.
    pub fn forward(&self, b: &B, g: &Graph<B>, x: &B::Mat, pre: Option<&B::Mat>) -> (B::Mat, GcnCache<B>) {
        let (n, _) = b.dims(x);
        let out_dim = self.lin.out_dim(b);
        if let Some(t) = pre {
            return (self.lin.forward(b, t), GcnCache { agg: None });
        }
        if self.lin.in_dim(b) <= out_dim {
            let t = Self::aggregate(b, g, x);
            (self.lin.forward(b, &t), GcnCache { agg: Some(t) })
        } else {
            let mut h = b.zeros(n, out_dim);
            b.gemm(1.0, x, false, &self.lin.weight.value, true, 0.0, &mut h);
            let mut y = b.zeros(n, out_dim);
            b.spmm(&g.looped, &g.gcn_vals, false, &h, 0.0, &mut y);
            if let Some(bias) = &self.lin.bias {
                b.add_row(&bias.value, &mut y);
            }
            (y, GcnCache { agg: None })
        }
    }

    /// Backward: accumulates parameter gradients, returns `dx` when asked. `pre` must be what
    /// forward was given.
    pub fn backward(
        &mut self,
        b: &B,
        g: &Graph<B>,
        x: &B::Mat,
        pre: Option<&B::Mat>,
        cache: GcnCache<B>,
        dy: &B::Mat,
        need_dx: bool,
    ) -> Option<B::Mat> {
        if let Some(t) = pre.or(cache.agg.as_ref()) {
            let dt = self.lin.backward(b, t, dy, need_dx)?;
            let mut dx = b.zeros(b.dims(&dt).0, b.dims(&dt).1);
            b.spmm(&g.looped, &g.gcn_vals, true, &dt, 0.0, &mut dx);
            return Some(dx);
        }
        // transform first: y = Â h + b, h = x Wᵀ
        let (n, out_dim) = b.dims(dy);
        let mut dh = b.zeros(n, out_dim);
        b.spmm(&g.looped, &g.gcn_vals, true, dy, 0.0, &mut dh);
        b.gemm(1.0, &dh, true, x, false, 1.0, &mut self.lin.weight.grad);
        if let Some(bias) = &mut self.lin.bias {
            b.col_sums(dy, 1.0, &mut bias.grad);
        }
        need_dx.then(|| {
            let mut dx = b.zeros(n, self.lin.in_dim(b));
            b.gemm(1.0, &dh, false, &self.lin.weight.value, false, 0.0, &mut dx);
            dx
        })
    }

    pub fn params_mut(&mut self) -> Vec<&mut Param<B>> {
        self.lin.params_mut()
    }
}
