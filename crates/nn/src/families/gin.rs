//! GINConv (Xu et al., "How Powerful are Graph Neural Networks?"; PyG's definition):
//! `y_v = MLP((1 + ε) x_v + Σ_{u ∈ N(v)} x_u)`, the sum over the in-neighbours without
//! normalisation ([`Aggregation::Sum`]), the MLP two linear maps with a ReLU between
//! (`Linear(in, hid) → ReLU → Linear(hid, out)`; PyG's `GIN` model takes `hid = out`), ε fixed
//! or trained (`train_eps`). Shapes: `x` `[n, in]`, `W₁` `[hid, in]`, `b₁` `[1, hid]`, `W₂`
//! `[out, hid]`, `b₂` `[1, out]`, `ε` `[1, 1]`, `y` `[n, out]`. Parameter names follow PyG's
//! (`nn.0.*`, `nn.2.*`, `eps`).
//!
//! The neighbour sum of a fixed input may be given precomputed (`pre`); the root term still
//! reads the node's own row. Backward, with `ds` the gradient at the MLP's input:
//! `dε = Σ ds ⊙ x_own`, `dx = Aᵀ ds` plus `(1 + ε) ds` on the own rows.

use grinnder_tensor::{Backend, Binary, Mat, Scalar, Unary};

use crate::aggregation::Aggregation;
use crate::conv::{Cache, Conv, Family, LayerSpec, Side};
use crate::graph::Graph;
use crate::linear::Linear;
use crate::memory::{Held, Shape};
use crate::param::Param;
use crate::work::{Passes, Work};

pub struct GinConv<B: Backend> {
    /// `nn.0`: the MLP's first map.
    pub lin1: Linear<B>,
    /// `nn.2`: the MLP's second map (after the ReLU, PyG's module 1).
    pub lin2: Linear<B>,
    /// ε as a `1 × 1` parameter (trained only when `train_eps`).
    pub eps: Param<B>,
    pub train_eps: bool,
}

/// What backward needs besides the layer input.
pub struct GinCache<B: Backend> {
    /// The MLP's input `(1 + ε) x_own + A x`.
    s: B::Mat,
    /// The ReLU's output inside the MLP.
    a: B::Mat,
    /// `1 + ε` as forward used it.
    scale: f64,
}

impl<B: Backend> GinConv<B> {
    /// `hid` is the MLP's hidden width; `eps` ε's initial (or fixed) value.
    #[allow(clippy::too_many_arguments)]
    pub fn init(
        b: &B,
        name: &str,
        in_dim: usize,
        hid: usize,
        out_dim: usize,
        eps: f64,
        train_eps: bool,
        seed: u64,
    ) -> Self {
        GinConv {
            lin1: Linear::init(b, &format!("{name}.nn.0"), in_dim, hid, true, seed),
            lin2: Linear::init(b, &format!("{name}.nn.2"), hid, out_dim, true, seed.wrapping_add(1 << 32)),
            eps: Param::new(b, format!("{name}.eps"), &Mat::from_vec(1, 1, vec![B::T::of(eps)])).shaped(&[1]),
            train_eps,
        }
    }

    /// `A x`, the neighbour sum of an input (what a fixed input can have done once).
    pub fn aggregate(b: &B, g: &Graph<B>, x: &B::Mat) -> B::Mat {
        crate::aggregate::aggregate(b, g, g.adjacency(Aggregation::Sum), x)
    }

    /// `1 + ε` (read from the device: one value).
    fn scale(&self, b: &B) -> f64 {
        1.0 + b.download(&self.eps.value).data[0].f64()
    }

    /// Everything PyG's `state_dict` holds: the parameters and ε also when it is fixed (a
    /// buffer there).
    pub fn state_mut(&mut self) -> Vec<&mut Param<B>> {
        let mut v = self.lin1.params_mut();
        v.extend(self.lin2.params_mut());
        v.push(&mut self.eps);
        v
    }

    /// A GIN layer as `spec` describes it (see [`crate::families::Kind::conv`]): PyG's GIN model's
    /// `MLP([in, out, out])`.
    pub fn of(b: &B, spec: &LayerSpec) -> Self {
        let LayerSpec { in_dim, out_dim, gin_eps, train_eps, seed, .. } = *spec;
        GinConv::init(b, &spec.name(), in_dim, out_dim, out_dim, gin_eps, train_eps, seed)
    }
}

impl<B: Backend> Conv<B> for GinConv<B> {
    /// Forward; `pre` is `A x` when the caller has it. `x` holds the input rows (`g.cols`, own
    /// rows first; with `pre`, the own rows may be all).
    fn forward(&self, b: &B, g: &Graph<B>, x: &B::Mat, side: Side<'_, B>) -> (B::Mat, Cache) {
        let pre = side.pre;
        let scale = self.scale(b);
        let own = g.own_rows(b, x);
        let own = own.as_ref().unwrap_or(x);
        let mut s = b.output(g.rows, b.dims(x).1);
        b.copy(own, &mut s);
        b.unary(Unary::Scale(scale), &mut s);
        match pre {
            Some(t) => b.binary(Binary::Add, t, &mut s),
            None => {
                let a = g.adjacency(Aggregation::Sum);
                a.spmm(b, false, x, 1.0, &mut s);
            }
        }
        let mut a = self.lin1.forward(b, &s);
        b.unary(Unary::Relu, &mut a);
        let y = self.lin2.forward(b, &a);
        (y, Cache::new(GinCache::<B> { s, a, scale }))
    }

    /// Backward: accumulates parameter gradients, returns `dx` (`g.cols` rows) when asked.
    fn backward(
        &mut self,
        b: &B,
        g: &Graph<B>,
        x: &B::Mat,
        _: Side<'_, B>,
        cache: Cache,
        dy: &B::Mat,
        need_dx: bool,
        _: Option<&mut B::Mat>,
    ) -> Option<B::Mat> {
        let cache: GinCache<B> = cache.take();
        let GinCache { s, a, scale } = cache;
        let mut da = self.lin2.backward(b, &a, dy, true).expect("asked for");
        b.binary(Binary::ReluGrad, &a, &mut da);
        drop(a);
        let ds = self.lin1.backward(b, &s, &da, need_dx || self.train_eps);
        drop((s, da));
        let ds = ds?;
        if self.train_eps {
            // dε = Σ ds ⊙ x_own: column sums of the product, then their sum
            let own = g.own_rows(b, x);
            let mut t = b.output(g.rows, b.dims(&ds).1);
            b.copy(own.as_ref().unwrap_or(x), &mut t);
            b.binary(Binary::Mul, &ds, &mut t);
            let mut cols = b.zeros(1, b.dims(&t).1);
            b.col_sums(&t, 0.0, &mut cols);
            let ones = b.upload(&Mat::from_vec(b.dims(&t).1, 1, vec![B::T::of(1.0); b.dims(&t).1]));
            b.gemm(1.0, &cols, false, &ones, false, 1.0, &mut self.eps.grad);
        }
        if !need_dx {
            return None;
        }
        let adj = g.adjacency(Aggregation::Sum);
        let mut dx = b.output(g.cols, b.dims(&ds).1);
        adj.spmm(b, true, &ds, 0.0, &mut dx);
        let mut root = ds;
        b.unary(Unary::Scale(scale), &mut root);
        g.add_own_rows(b, &root, &mut dx);
        Some(dx)
    }

    fn params_mut(&mut self) -> Vec<&mut Param<B>> {
        let mut v = self.lin1.params_mut();
        v.extend(self.lin2.params_mut());
        if self.train_eps {
            v.push(&mut self.eps);
        }
        v
    }

    fn state_mut(&mut self) -> Vec<&mut Param<B>> {
        GinConv::state_mut(self)
    }

    fn aggregate_input(&self, b: &B, g: &Graph<B>, x: &B::Mat) -> Option<B::Mat> {
        Some(GinConv::aggregate(b, g, x))
    }

    /// `(1 + ε) x_own` beside the neighbour sum.
    fn reads_input_beside_pre(&self) -> bool {
        true
    }

    fn held(&self, s: Shape, i: u64, o: u64, pre: bool, need_dx: bool, _: bool) -> Held {
        held(s, i, o, self.train_eps, pre, need_dx)
    }

    fn work(&self, s: Shape, i: u64, o: u64, pre: bool, need_dx: bool) -> Passes {
        work(s, i, o, self.train_eps, pre, need_dx)
    }

    /// The neighbour sum added to the scaled own rows.
    fn accumulating_product(&self, s: Shape, i: u64, _: u64, _: usize, pre: bool) -> u64 {
        if pre {
            0
        } else {
            s.rows * i
        }
    }
}

/// GIN as a family: `gin`, PyG's `GINConv` over a two-layer MLP, summing neighbours.
pub struct Gin;

impl Family for Gin {
    /// The MLP's two maps with their biases, and `eps` (a parameter or a buffer).
    fn values(&self, s: &LayerSpec) -> u128 {
        let (i, o) = (s.in_dim as u128, s.out_dim as u128);
        i * o + o * o + 2 * o + 1
    }

    fn name(&self) -> &'static str {
        "gin"
    }

    fn pyg_layer(&self) -> &'static str {
        "GINConv"
    }

    fn aggregation(&self) -> Aggregation {
        Aggregation::Sum
    }

    fn first_map(&self, l: usize) -> String {
        format!("convs.{l}.nn.0.weight")
    }

    fn output_map(&self, l: usize) -> String {
        format!("convs.{l}.nn.2.weight")
    }
}

/// Elements held on a partition of shape `s` (see [`crate::memory`]), the MLP's hidden width
/// being `o`: forward copies the own rows, keeps the MLP's input `s` and hidden `a` (`rows ×
/// in`, `rows × o`) beside the output; backward makes `da`, then `ds` (when `dx` or a trained
/// ε needs it; ε's gradient then copies the own rows again beside a product), then `dx`.
pub fn held(s: Shape, i: u64, o: u64, train_eps: bool, pre: bool, need_dx: bool) -> Held {
    let (rows_in, hid) = (s.rows * i, s.rows * o);
    // with `pre` the caller may pass the own rows alone: nothing to copy
    let own = if pre { 0 } else { s.own_copy(i) };
    let kept = rows_in + hid;
    let ds = if need_dx || train_eps { rows_in } else { 0 };
    let eps = if train_eps { ds + own + rows_in } else { 0 };
    let dx = if need_dx { s.cols * i + ds } else { 0 };
    Held {
        forward: own + kept + s.rows * o,
        kept,
        backward: (kept + hid).max(rows_in + hid + ds).max(eps).max(dx),
    }
}

/// Work on a partition of shape `s` (see [`crate::work`]), the MLP's hidden width `o`: the
/// neighbour sum (unless `pre`), the MLP's two products and their weight gradients, `ds`
/// where `dx` or a trained ε needs it, and `Aᵀ ds`.
pub fn work(s: Shape, i: u64, o: u64, train_eps: bool, pre: bool, need_dx: bool) -> Passes {
    let sum = if pre { Work::default() } else { Work::spmm(s.nnz, i, false) };
    let mlp = Work::gemm(s.rows, i, o).and(Work::gemm(s.rows, o, o));
    let ds = if need_dx || train_eps { Work::gemm(s.rows, o, i) } else { Work::default() };
    let dx = if need_dx { Work::spmm(s.nnz, i, true) } else { Work::default() };
    Passes {
        forward: sum.and(mlp).and(Work::elementwise(4 * s.rows * (i + o))),
        backward: Work::gemm(o, s.rows, i)
            .and(Work::gemm(o, s.rows, o))
            .and(Work::gemm(s.rows, o, o))
            .and(ds)
            .and(dx)
            .and(Work::elementwise(6 * s.rows * (i + o))),
    }
}
