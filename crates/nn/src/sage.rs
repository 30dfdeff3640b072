//! SAGEConv with mean aggregation and root weight (Hamilton et al.; PyG's defaults):
//! `y = mean_{u ∈ N(v)} x_u · W_lᵀ + b + x_v · W_rᵀ`, the mean taken with whole-graph in-degrees
//! (`Graph::mean_vals`, `Ā`). Shapes: `x` `[n, in]`, `W_l`, `W_r` `[out, in]`, `b` `[1, out]`,
//! `y` `[n, out]`. The neighbour term is evaluated on the narrower side, like GCN's, and may
//! take `Ā x` precomputed for a fixed input.

use grinnder_tensor::Backend;

use crate::graph::Graph;
use crate::linear::Linear;
use crate::param::Param;

pub struct SageConv<B: Backend> {
    /// Applied to the neighbour mean (with the bias).
    pub lin_l: Linear<B>,
    /// Applied to the node itself (no bias).
    pub lin_r: Linear<B>,
}

pub struct SageCache<B: Backend> {
    agg: Option<B::Mat>,
}

impl<B: Backend> SageConv<B> {
    pub fn init(b: &B, name: &str, in_dim: usize, out_dim: usize, seed: u64) -> Self {
        SageConv {
            lin_l: Linear::init(b, &format!("{name}.lin_l"), in_dim, out_dim, true, seed),
            lin_r: Linear::init(b, &format!("{name}.lin_r"), in_dim, out_dim, false, seed),
        }
    }

    /// `Ā x`.
    pub fn aggregate(b: &B, g: &Graph<B>, x: &B::Mat) -> B::Mat {
        let (n, d) = b.dims(x);
        let mut m = b.zeros(n, d);
        b.spmm(&g.plain, &g.mean_vals, false, x, 0.0, &mut m);
        m
    }

    pub fn forward(&self, b: &B, g: &Graph<B>, x: &B::Mat, pre: Option<&B::Mat>) -> (B::Mat, SageCache<B>) {
        let n = b.dims(x).0;
        let out_dim = self.lin_l.out_dim(b);
        let (mut y, agg) = if let Some(m) = pre {
            (self.lin_l.forward(b, m), None)
        } else if self.lin_l.in_dim(b) <= out_dim {
            let m = Self::aggregate(b, g, x);
            (self.lin_l.forward(b, &m), Some(m))
        } else {
            let mut h = b.zeros(n, out_dim);
            b.gemm(1.0, x, false, &self.lin_l.weight.value, true, 0.0, &mut h);
            let mut y = b.zeros(n, out_dim);
            b.spmm(&g.plain, &g.mean_vals, false, &h, 0.0, &mut y);
            if let Some(bias) = &self.lin_l.bias {
                b.add_row(&bias.value, &mut y);
            }
            (y, None)
        };
        self.lin_r.forward_into(b, x, 1.0, &mut y);
        (y, SageCache { agg })
    }

    #[allow(clippy::too_many_arguments)]
    pub fn backward(
        &mut self,
        b: &B,
        g: &Graph<B>,
        x: &B::Mat,
        pre: Option<&B::Mat>,
        cache: SageCache<B>,
        dy: &B::Mat,
        need_dx: bool,
    ) -> Option<B::Mat> {
        let mut dx = self.lin_r.backward(b, x, dy, need_dx);
        if let Some(m) = pre.or(cache.agg.as_ref()) {
            if let (Some(dm), Some(dx)) = (self.lin_l.backward(b, m, dy, need_dx), dx.as_mut()) {
                b.spmm(&g.plain, &g.mean_vals, true, &dm, 1.0, dx);
            }
            return dx;
        }
        let (n, out_dim) = b.dims(dy);
        let mut dh = b.zeros(n, out_dim);
        b.spmm(&g.plain, &g.mean_vals, true, dy, 0.0, &mut dh);
        b.gemm(1.0, &dh, true, x, false, 1.0, &mut self.lin_l.weight.grad);
        if let Some(bias) = &mut self.lin_l.bias {
            b.col_sums(dy, 1.0, &mut bias.grad);
        }
        if let Some(dx) = dx.as_mut() {
            b.gemm(1.0, &dh, false, &self.lin_l.weight.value, false, 1.0, dx);
        }
        dx
    }

    pub fn params_mut(&mut self) -> Vec<&mut Param<B>> {
        let mut v = self.lin_l.params_mut();
        v.extend(self.lin_r.params_mut());
        v
    }
}
