//! GCNConv (Kipf & Welling): `y = Â x Wᵀ + b` with `Â = D̂^{-1/2} (A + I) D̂^{-1/2}` computed on
//! the whole graph (`Aggregation::GcnNorm`). Shapes: `x` `[n, in]`, `W` `[out, in]`, `b` `[1, out]`,
//! `y` `[n, out]`.
//!
//! The product is evaluated on the narrower side: `(Â x) Wᵀ` when `in ≤ out`, else `Â (x Wᵀ)`;
//! for a fixed input the caller may pass `Â x` precomputed once, and backward then needs no
//! sparse product at all. Every order computes the same function and gradients.

use grinnder_tensor::Backend;

use crate::aggregate;
use crate::aggregation::Aggregation;
use crate::conv::{Cache, Conv, Family, LayerSpec, Side, SplitMaps};
use crate::graph::Graph;
use crate::linear::Linear;
use crate::memory::{Held, Shape};
use crate::param::Param;
use crate::work::{Passes, Work};

pub struct GcnConv<B: Backend> {
    pub lin: Linear<B>,
}

/// What backward needs besides the layer input.
pub type GcnCache<B> = aggregate::AggCache<B>;

impl<B: Backend> GcnConv<B> {
    /// PyG's names: `{name}.lin.weight` `[out, in]`, `{name}.bias` `[out]` (the bias is the
    /// conv's, after aggregation).
    pub fn init(b: &B, name: &str, in_dim: usize, out_dim: usize, seed: u64) -> Self {
        // drawn under the names the layer had first, so a seed gives the weights it always gave
        let mut lin = Linear::init(b, name, in_dim, out_dim, true, seed);
        lin.weight.name = format!("{name}.lin.weight");
        if let Some(bias) = &mut lin.bias {
            bias.name = format!("{name}.bias");
        }
        GcnConv { lin }
    }

    /// `Â x`, the aggregation of an input (what a fixed input can have done once).
    pub fn aggregate(b: &B, g: &Graph<B>, x: &B::Mat) -> B::Mat {
        aggregate::aggregate(b, g, g.adjacency(Aggregation::GcnNorm), x)
    }

    /// A GCN layer as `spec` describes it (see [`crate::families::Kind::conv`]).
    pub fn of(b: &B, spec: &LayerSpec) -> Self {
        GcnConv::init(b, &spec.name(), spec.in_dim, spec.out_dim, spec.seed)
    }
}

impl<B: Backend> Conv<B> for GcnConv<B> {
    /// Forward; `pre` is `Â x` when the caller has it.
    /// Given `pre`, reads nothing of `g` but its rows: a graph without adjacencies
    /// ([`Graph::columns_only`]) will do.
    fn forward(&self, b: &B, g: &Graph<B>, x: &B::Mat, side: Side<'_, B>) -> (B::Mat, Cache) {
        let pre = side.pre;
        if let Some(t) = pre {
            return (self.lin.forward(b, t), Cache::new(GcnCache::<B> { agg: None }));
        }
        let (y, agg) = aggregate::forward(b, &self.lin, g, g.adjacency(Aggregation::GcnNorm), x, pre);
        (y, Cache::new(GcnCache::<B> { agg }))
    }

    /// Backward: accumulates parameter gradients, returns `dx` when asked. `pre` must be what
    /// forward was given.
    fn backward(
        &mut self,
        b: &B,
        g: &Graph<B>,
        x: &B::Mat,
        side: Side<'_, B>,
        cache: Cache,
        dy: &B::Mat,
        need_dx: bool,
        _: Option<&mut B::Mat>,
    ) -> Option<B::Mat> {
        let pre = side.pre;
        let cache: GcnCache<B> = cache.take();
        if let (Some(t), false) = (pre, need_dx) {
            // (no adjacency read: see `forward`)
            self.lin.backward(b, t, dy, false);
            return None;
        }
        let agg = pre.or(cache.agg.as_ref());
        let mut dx = None;
        aggregate::backward(
            b,
            &mut self.lin,
            g,
            g.adjacency(Aggregation::GcnNorm),
            x,
            agg,
            dy,
            need_dx,
            &mut dx,
        );
        dx
    }

    fn params_mut(&mut self) -> Vec<&mut Param<B>> {
        self.lin.params_mut()
    }

    fn aggregate_input(&self, b: &B, g: &Graph<B>, x: &B::Mat) -> Option<B::Mat> {
        Some(GcnConv::aggregate(b, g, x))
    }

    fn split_maps(&self) -> Option<SplitMaps<&Linear<B>>> {
        Some(SplitMaps { aggregated: &self.lin, root: None })
    }

    fn split_maps_mut(&mut self) -> Option<SplitMaps<&mut Linear<B>>> {
        Some(SplitMaps { aggregated: &mut self.lin, root: None })
    }

    fn cache_from_output(&self) -> Option<Cache> {
        Some(Cache::new(GcnCache::<B>::without_aggregation()))
    }

    fn held(&self, s: Shape, i: u64, o: u64, pre: bool, need_dx: bool, _: bool) -> Held {
        held(s, i, o, pre, need_dx)
    }

    fn work(&self, s: Shape, i: u64, o: u64, pre: bool, need_dx: bool) -> Passes {
        work(s, i, o, pre, need_dx)
    }
}

/// GCN as a family: `gcn`, PyG's `GCNConv`, on `Â`, with edge weights.
pub struct Gcn;

impl Family for Gcn {
    /// `lin.weight` and `bias`.
    fn values(&self, s: &LayerSpec) -> u128 {
        let (i, o) = (s.in_dim as u128, s.out_dim as u128);
        i * o + o
    }

    fn name(&self) -> &'static str {
        "gcn"
    }

    fn pyg_layer(&self) -> &'static str {
        "GCNConv"
    }

    fn aggregation(&self) -> Aggregation {
        Aggregation::GcnNorm
    }

    fn takes_edge_weight(&self) -> bool {
        true
    }

    fn first_map(&self, l: usize) -> String {
        format!("convs.{l}.lin.weight")
    }
}

/// Elements held on a partition of shape `s` (see [`crate::memory`]): aggregating first keeps
/// `Â x` (`rows × in`) and its backward makes `dt` beside `dx`; transforming first makes
/// `x Wᵀ` (`cols × out`) in forward and its gradient in backward; the precomputed `Â x` is
/// the caller's.
pub fn held(s: Shape, i: u64, o: u64, pre: bool, need_dx: bool) -> Held {
    let out = s.rows * o;
    let dx = if need_dx { s.cols * i } else { 0 };
    if pre {
        return Held { forward: out, kept: 0, backward: dx + if need_dx { s.rows * i } else { 0 } };
    }
    if i <= o {
        let t = s.rows * i;
        return Held { forward: t + out, kept: t, backward: t + dx + if need_dx { t } else { 0 } };
    }
    let h = s.cols * o;
    Held { forward: h + out, kept: 0, backward: h + dx }
}

/// Work on a partition of shape `s` (see [`crate::work`]), on the narrower side as
/// [`held`]: aggregating first (`Â x`, then the product; backward `dt = dy W`, `dx = Âᵀ dt`)
/// or transforming first (`x Wᵀ` over the columns, then `Â`; backward `Âᵀ dy` first); with
/// `pre` only the product and its weight gradient.
pub fn work(s: Shape, i: u64, o: u64, pre: bool, need_dx: bool) -> Passes {
    let out = Work::elementwise(2 * s.rows * o); // the bias
    if pre || i <= o {
        let aggregate = if pre { Work::default() } else { Work::spmm(s.nnz, i, false) };
        let dx = if need_dx && !pre {
            Work::gemm(s.rows, o, i).and(Work::spmm(s.nnz, i, true))
        } else {
            Work::default()
        };
        return Passes {
            forward: aggregate.and(Work::gemm(s.rows, i, o)).and(out.clone()),
            backward: Work::gemm(o, s.rows, i).and(dx).and(out),
        };
    }
    let dx = if need_dx { Work::gemm(s.cols, o, i) } else { Work::default() };
    Passes {
        forward: Work::gemm(s.cols, i, o).and(Work::spmm(s.nnz, o, false)).and(out.clone()),
        backward: Work::spmm(s.nnz, o, true).and(Work::gemm(o, s.cols, i)).and(dx).and(out),
    }
}
