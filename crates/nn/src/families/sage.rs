//! SAGEConv with mean aggregation and root weight (Hamilton et al.; PyG's defaults):
//! `y = mean_{u ∈ N(v)} x_u · W_lᵀ + b + x_v · W_rᵀ`, the mean taken with whole-graph in-degrees
//! (`Aggregation::Mean`, `Ā`). Shapes: `x` `[n, in]`, `W_l`, `W_r` `[out, in]`, `b` `[1, out]`,
//! `y` `[n, out]`. The neighbour term is evaluated on the narrower side, like GCN's, and may
//! take `Ā x` precomputed for a fixed input.

use grinnder_tensor::Backend;

use crate::aggregate;
use crate::aggregation::Aggregation;
use crate::conv::{Cache, Conv, Family, LayerSpec, Side, SplitMaps};
use crate::graph::Graph;
use crate::linear::Linear;
use crate::memory::{Held, Shape};
use crate::param::Param;
use crate::work::{Passes, Work};

pub struct SageConv<B: Backend> {
    /// Applied to the neighbour mean (with the bias).
    pub lin_l: Linear<B>,
    /// Applied to the node itself (no bias).
    pub lin_r: Linear<B>,
}

/// What backward needs besides the layer input.
pub type SageCache<B> = aggregate::AggCache<B>;

impl<B: Backend> SageConv<B> {
    pub fn init(b: &B, name: &str, in_dim: usize, out_dim: usize, seed: u64) -> Self {
        SageConv {
            lin_l: Linear::init(b, &format!("{name}.lin_l"), in_dim, out_dim, true, seed),
            lin_r: Linear::init(b, &format!("{name}.lin_r"), in_dim, out_dim, false, seed),
        }
    }

    /// `Ā x`.
    pub fn aggregate(b: &B, g: &Graph<B>, x: &B::Mat) -> B::Mat {
        aggregate::aggregate(b, g, g.adjacency(Aggregation::Mean), x)
    }

    /// A SAGE layer as `spec` describes it (see [`crate::families::Kind::conv`]).
    pub fn of(b: &B, spec: &LayerSpec) -> Self {
        SageConv::init(b, &spec.name(), spec.in_dim, spec.out_dim, spec.seed)
    }
}

impl<B: Backend> Conv<B> for SageConv<B> {
    fn forward(&self, b: &B, g: &Graph<B>, x: &B::Mat, side: Side<'_, B>) -> (B::Mat, Cache) {
        let pre = side.pre;
        let (mut y, agg) = aggregate::forward(b, &self.lin_l, g, g.adjacency(Aggregation::Mean), x, pre);
        let own = g.own_rows(b, x);
        self.lin_r.forward_into(b, own.as_ref().unwrap_or(x), 1.0, &mut y);
        (y, Cache::new(SageCache::<B> { agg }))
    }

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
        let cache: SageCache<B> = cache.take();
        let agg = pre.or(cache.agg.as_ref());
        let own = g.own_rows(b, x);
        let dx_own = self.lin_r.backward(b, own.as_ref().unwrap_or(x), dy, need_dx);
        drop(own);
        // the root term's gradient lands on the own rows of the input
        let mut dx = dx_own.map(|d| {
            if g.cols == g.rows {
                return d;
            }
            let mut dx = b.zeros(g.cols, b.dims(&d).1);
            g.add_own_rows(b, &d, &mut dx);
            dx
        });
        aggregate::backward(
            b,
            &mut self.lin_l,
            g,
            g.adjacency(Aggregation::Mean),
            x,
            agg,
            dy,
            need_dx,
            &mut dx,
        );
        dx
    }

    fn params_mut(&mut self) -> Vec<&mut Param<B>> {
        let mut v = self.lin_l.params_mut();
        v.extend(self.lin_r.params_mut());
        v
    }

    fn aggregate_input(&self, b: &B, g: &Graph<B>, x: &B::Mat) -> Option<B::Mat> {
        Some(SageConv::aggregate(b, g, x))
    }

    /// The root term reads the own input rows.
    fn reads_input_beside_pre(&self) -> bool {
        true
    }

    fn split_maps(&self) -> Option<SplitMaps<&Linear<B>>> {
        Some(SplitMaps { aggregated: &self.lin_l, root: Some(&self.lin_r) })
    }

    fn split_maps_mut(&mut self) -> Option<SplitMaps<&mut Linear<B>>> {
        Some(SplitMaps { aggregated: &mut self.lin_l, root: Some(&mut self.lin_r) })
    }

    fn cache_from_output(&self) -> Option<Cache> {
        Some(Cache::new(SageCache::<B>::without_aggregation()))
    }

    fn held(&self, s: Shape, i: u64, o: u64, pre: bool, need_dx: bool, _: bool) -> Held {
        held(s, i, o, pre, need_dx)
    }

    fn work(&self, s: Shape, i: u64, o: u64, pre: bool, need_dx: bool) -> Passes {
        work(s, i, o, pre, need_dx)
    }

    /// The neighbour gradient added to the root term's, on the aggregated side.
    fn accumulating_product(&self, s: Shape, i: u64, o: u64, l: usize, pre: bool) -> u64 {
        if l > 0 && (pre || i <= o) {
            s.cols * i
        } else {
            0
        }
    }
}

/// SAGE as a family: `sage` (or `graphsage`), PyG's `SAGEConv` with mean aggregation.
pub struct Sage;

impl Family for Sage {
    /// `lin_l` with its bias, `lin_r` without.
    fn values(&self, s: &LayerSpec) -> u128 {
        let (i, o) = (s.in_dim as u128, s.out_dim as u128);
        2 * i * o + o
    }

    fn name(&self) -> &'static str {
        "sage"
    }

    fn aliases(&self) -> &'static [&'static str] {
        &["graphsage"]
    }

    fn pyg_layer(&self) -> &'static str {
        "SAGEConv"
    }

    fn aggregation(&self) -> Aggregation {
        Aggregation::Mean
    }

    fn first_map(&self, l: usize) -> String {
        format!("convs.{l}.lin_l.weight")
    }
}

/// Elements held on a partition of shape `s` (see [`crate::memory`]): GCN's (the neighbour
/// term is evaluated the same way) plus the own input rows copied out of the columns for the
/// root term, and the root term's input gradient before it joins `dx`.
pub fn held(s: Shape, i: u64, o: u64, pre: bool, need_dx: bool) -> Held {
    let neighbour = super::gcn::held(s, i, o, pre, need_dx);
    let own = s.own_copy(i);
    let root_dx = if need_dx { s.rows * i } else { 0 };
    Held {
        forward: neighbour.forward + own,
        kept: neighbour.kept,
        backward: neighbour.backward.max(neighbour.kept + own + root_dx),
    }
}

/// Work on a partition of shape `s` (see [`crate::work`]): GCN's (the neighbour term) and the
/// root term's product over the own rows, its weight gradient and, with `need_dx`, its input
/// gradient.
pub fn work(s: Shape, i: u64, o: u64, pre: bool, need_dx: bool) -> Passes {
    let neighbour = super::gcn::work(s, i, o, pre, need_dx);
    let dx = if need_dx { Work::gemm(s.rows, o, i) } else { Work::default() };
    Passes {
        forward: neighbour.forward.and(Work::gemm(s.rows, i, o)),
        backward: neighbour.backward.and(Work::gemm(o, s.rows, i)).and(dx),
    }
}
