//! GATConv (Veličković et al.; PyG's definition, self loops added): for heads h = 1..H,
//! `z = x Wᵀ` split into heads `z_h` (`[n, F]` each),
//! `e_{uv,h} = LeakyReLU_{0.2}(a_src,h · z_{u,h} + a_dst,h · z_{v,h})` for every edge `u → v` of
//! `A + I`, `α_{uv,h} = softmax_u(e_{uv,h})` over `v`'s in-neighbours (its own self loop
//! included), attention dropout on `α`, `y_{v,h} = Σ_u α_{uv,h} z_{u,h}`; heads concatenated
//! (`[n, H·F]`) or averaged (`[n, F]`), then `+ b`.
//! Shapes: `x` `[n, in]`, `W` `[H·F, in]`, `a_src`, `a_dst` `[H, F]`, `b` `[1, H·F]` or `[1, F]`.
//! Exact under partitioning: a destination's whole in-neighbourhood is in its partition.

use grinnder_tensor::{Backend, MaskKey, Mat};

use crate::aggregation::Aggregation;
use crate::conv::{Cache, Conv, Family, LayerSpec, Side};
use crate::graph::Graph;
use crate::linear::Linear;
use crate::memory::{Held, Shape};
use crate::param::Param;
use crate::work::{Passes, Work};

pub const NEGATIVE_SLOPE: f64 = 0.2;

pub struct GatConv<B: Backend> {
    pub lin: Linear<B>,
    pub att_src: Param<B>,
    pub att_dst: Param<B>,
    pub bias: Param<B>,
    pub heads: usize,
    pub concat: bool,
    /// `[H·F, F]` with `1/H` on each head's diagonal: averaging heads is a product with it.
    mean: Option<B::Mat>,
}

pub struct GatCache<B: Backend> {
    z: B::Mat,
    s_src: B::Mat,
    s_dst: B::Mat,
    /// attention coefficients before dropout
    alpha: B::Mat,
}

impl<B: Backend> GatConv<B> {
    /// `out_dim` is the width per head.
    pub fn init(
        b: &B,
        name: &str,
        in_dim: usize,
        out_dim: usize,
        heads: usize,
        concat: bool,
        seed: u64,
    ) -> Self {
        let width = heads * out_dim;
        let bias_width = if concat { width } else { out_dim };
        let mean = (!concat).then(|| head_mean(b, heads, out_dim));
        GatConv {
            lin: Linear::init(b, &format!("{name}.lin"), in_dim, width, false, seed),
            att_src: Param::glorot(b, format!("{name}.att_src"), heads, out_dim, seed)
                .shaped(&[1, heads, out_dim]),
            att_dst: Param::glorot(b, format!("{name}.att_dst"), heads, out_dim, seed)
                .shaped(&[1, heads, out_dim]),
            bias: Param::zeros(b, format!("{name}.bias"), 1, bias_width).shaped(&[bias_width]),
            heads,
            concat,
            mean,
        }
    }

    /// A GAT layer as `spec` describes it (see [`crate::families::Kind::conv`]): a hidden layer
    /// concatenates `spec.heads` heads of `spec.hidden`, the output layer has one head of
    /// `out_dim`.
    pub fn of(b: &B, spec: &LayerSpec) -> Self {
        if spec.last() {
            GatConv::init(b, &spec.name(), spec.in_dim, spec.out_dim, 1, false, spec.seed)
        } else {
            GatConv::init(b, &spec.name(), spec.in_dim, spec.hidden, spec.heads, true, spec.seed)
        }
    }
}

/// `[H·F, F]` with `1/H` on each head's diagonal: averaging `H` heads of `F` is a product with
/// it (the output layer of an attention family).
pub(crate) fn head_mean<B: Backend>(b: &B, heads: usize, out_dim: usize) -> B::Mat {
    let mut m = Mat::<B::T>::zeros(heads * out_dim, out_dim);
    let w = <B::T as grinnder_tensor::Scalar>::of(1.0 / heads as f64);
    for h in 0..heads {
        for f in 0..out_dim {
            m.data[(h * out_dim + f) * out_dim + f] = w;
        }
    }
    b.upload(&m)
}

/// The attention coefficients `alpha` (`nnz × H` over `A + I`) after attention dropout
/// (`None`: no dropout).
pub(crate) fn drop_attention<B: Backend>(
    b: &B,
    g: &Graph<B>,
    alpha: &B::Mat,
    dropout: Option<(MaskKey, f64)>,
) -> Option<B::Mat> {
    let (key, p) = dropout.filter(|&(_, p)| p > 0.0)?;
    let (r, c) = b.dims(alpha);
    let mut a = b.output(r, c);
    b.copy(alpha, &mut a);
    b.edge_dropout(&g.adjacency(Aggregation::GcnNorm).s, key, p, &mut a);
    Some(a)
}

impl<B: Backend> Conv<B> for GatConv<B> {
    /// Forward; `attn` is the attention dropout (key, probability) in training.
    fn forward(&self, b: &B, g: &Graph<B>, x: &B::Mat, side: Side<'_, B>) -> (B::Mat, Cache) {
        let attn = side.drop;
        let n = g.rows;
        let a = g.adjacency(Aggregation::GcnNorm);
        let z = self.lin.forward(b, x);
        let ni = b.dims(&z).0;
        // destination scores are only read for the output rows, which come first
        let (mut s_src, mut s_dst) = (b.output(ni, self.heads), b.output(ni, self.heads));
        b.head_dots(&z, &self.att_src.value, &mut s_src);
        b.head_dots(&z, &self.att_dst.value, &mut s_dst);
        let mut alpha = b.output(a.nnz, self.heads);
        b.edge_softmax(&a.s, &s_src, &s_dst, NEGATIVE_SLOPE, &mut alpha);
        let dropped = drop_attention(b, g, &alpha, attn);
        let mut agg = b.output(n, b.dims(&z).1);
        b.spmm(&a.s, dropped.as_ref().unwrap_or(&alpha), false, &z, 0.0, &mut agg);
        let mut y = match &self.mean {
            None => agg,
            Some(m) => {
                let mut y = b.output(n, b.dims(m).1);
                b.gemm(1.0, &agg, false, m, false, 0.0, &mut y);
                y
            }
        };
        b.add_row(&self.bias.value, &mut y);
        (y, Cache::new(GatCache::<B> { z, s_src, s_dst, alpha }))
    }

    /// Backward: accumulates parameter gradients, returns `dx` when asked. `attn` must be
    /// what forward was given.
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
        let attn = side.drop;
        let cache: GatCache<B> = cache.take();
        let GatCache { z, s_src, s_dst, alpha } = cache;
        let a = g.adjacency(Aggregation::GcnNorm);
        let (ni, width) = b.dims(&z);
        let n = g.rows;
        b.col_sums(dy, 1.0, &mut self.bias.grad);
        let dagg_owned = self.mean.as_ref().map(|m| {
            let mut d = b.output(n, width);
            b.gemm(1.0, dy, false, m, true, 0.0, &mut d);
            d
        });
        let dagg = dagg_owned.as_ref().unwrap_or(dy);
        let dropped = drop_attention(b, g, &alpha, attn);
        let mut dz = b.output(ni, width);
        b.spmm(&a.s, dropped.as_ref().unwrap_or(&alpha), true, dagg, 0.0, &mut dz);
        drop(dropped);
        let nnz = b.dims(&alpha).0;
        let mut dalpha = b.output(nnz, self.heads);
        b.sddmm(&a.s, dagg, &z, &mut dalpha);
        if let Some((key, p)) = attn.filter(|&(_, p)| p > 0.0) {
            b.edge_dropout(&a.s, key, p, &mut dalpha);
        }
        let mut dpre = b.output(nnz, self.heads);
        b.edge_softmax_backward(&a.s, &s_src, &s_dst, NEGATIVE_SLOPE, &alpha, &dalpha, &mut dpre);
        drop((alpha, dalpha));
        let ones = |rows: usize| {
            let one = <B::T as grinnder_tensor::Scalar>::of(1.0);
            b.upload(&Mat::from_vec(rows, self.heads, vec![one; rows * self.heads]))
        };
        // source scores collect over each input's out-edges, destination scores over each
        // output's in-edges (then padded to the input rows; the halo has none)
        let mut ds_src = b.output(ni, self.heads);
        b.spmm(&a.s, &dpre, true, &ones(n), 0.0, &mut ds_src);
        let mut ds_dst = b.output(n, self.heads);
        b.spmm(&a.s, &dpre, false, &ones(ni), 0.0, &mut ds_dst);
        if ni != n {
            let mut padded = b.zeros(ni, self.heads);
            g.add_own_rows(b, &ds_dst, &mut padded);
            ds_dst = padded;
        }
        b.head_dots_backward(&z, &self.att_src.value, &ds_src, &mut dz, &mut self.att_src.grad);
        b.head_dots_backward(&z, &self.att_dst.value, &ds_dst, &mut dz, &mut self.att_dst.grad);
        self.lin.backward(b, x, &dz, need_dx)
    }

    fn params_mut(&mut self) -> Vec<&mut Param<B>> {
        let mut v = self.lin.params_mut();
        v.extend([&mut self.att_src, &mut self.att_dst, &mut self.bias]);
        v
    }

    fn held(&self, s: Shape, i: u64, o: u64, _: bool, need_dx: bool, attn_dropout: bool) -> Held {
        held(s, i, self.heads as u64, o, self.concat, attn_dropout, need_dx)
    }

    fn work(&self, s: Shape, i: u64, o: u64, _: bool, need_dx: bool) -> Passes {
        work(s, i, self.heads as u64, o, self.concat, need_dx)
    }
}

/// GAT as a family: `gat`, PyG's `GATConv`, attention over `A + I` with heads.
pub struct Gat;

impl Family for Gat {
    /// `lin.weight`, `att_src`, `att_dst` and `bias`, each over the output's width (heads
    /// concatenated in a hidden layer; one head in the output layer).
    fn values(&self, s: &LayerSpec) -> u128 {
        let (i, o) = (s.in_dim as u128, s.out_dim as u128);
        i * o + 3 * o
    }

    fn name(&self) -> &'static str {
        "gat"
    }

    fn pyg_layer(&self) -> &'static str {
        "GATConv"
    }

    fn aggregation(&self) -> Aggregation {
        Aggregation::GcnNorm
    }

    fn weighs_entries(&self) -> bool {
        true
    }

    fn has_heads(&self) -> bool {
        true
    }

    /// Attention depends on the parameters: nothing to precompute.
    fn precomputes_input(&self) -> bool {
        false
    }

    fn first_map(&self, l: usize) -> String {
        format!("convs.{l}.lin.weight")
    }

    /// The bias, whose width is the output's whether heads are concatenated or averaged.
    fn output_map(&self, l: usize) -> String {
        format!("convs.{l}.bias")
    }

    fn markers(&self) -> Vec<String> {
        vec![self.first_map(0), "convs.0.att_src".into()]
    }

    fn heads_tensor(&self, l: usize) -> Option<String> {
        Some(format!("convs.{l}.att_src"))
    }
}

/// Elements held on a partition of shape `s` (see [`crate::memory`]) by a layer of `heads`
/// heads whose output is `o` wide (`heads · F` concatenated, else `F`): forward keeps `z`
/// (`cols × heads·F`), both scores (`cols × heads`) and the coefficients (`nnz × heads`),
/// with the dropped coefficients and the heads' sum beside them; backward makes `dz` over the
/// columns, then the coefficients' and the scores' gradients (two `nnz × heads` at once),
/// then the score sums and `dx`.
pub fn held(s: Shape, i: u64, heads: u64, o: u64, concat: bool, attn_dropout: bool, need_dx: bool) -> Held {
    let width = if concat { o } else { o * heads };
    let edges = s.nnz * heads;
    let kept = s.cols * width + 2 * s.cols * heads + edges;
    let dropped = if attn_dropout { edges } else { 0 };
    let agg = s.rows * width;
    let mean = if concat { 0 } else { s.rows * o };
    let dagg = if concat { 0 } else { agg };
    let dz = s.cols * width;
    let dx = if need_dx { s.cols * i } else { 0 };
    // once the coefficients go, their place is the scores' gradient's; beside it the two score
    // sums (the destination's padded to the columns), their ones and dx
    let late = 3 * s.cols * heads + 2 * s.rows * heads + dx;
    Held {
        forward: kept + dropped + agg + mean,
        kept,
        backward: kept + dagg + dz + dropped.max(2 * edges).max(late),
    }
}

/// Work on a partition of shape `s` (see [`crate::work`]), `heads` heads of output `o`: the
/// transform over the columns, both scores, the per-edge logits, softmax and dropout
/// (element-wise over `nnz × heads`), the weighted sum (a sparse product `heads · F` wide);
/// backward the same in reverse, twice the per-edge work, and the input gradient's product.
pub fn work(s: Shape, i: u64, heads: u64, o: u64, concat: bool, need_dx: bool) -> Passes {
    let width = if concat { o } else { o * heads };
    let edges = s.nnz * heads;
    let dx = if need_dx { Work::gemm(s.cols, width, i) } else { Work::default() };
    Passes {
        forward: Work::gemm(s.cols, i, width)
            .and(Work::spmm(s.nnz, width, false))
            .and(Work::elementwise(8 * edges + 4 * s.cols * width)),
        backward: Work::spmm(s.nnz, width, true)
            .and(Work::gemm(width, s.cols, i))
            .and(dx)
            .and(Work::elementwise(16 * edges + 8 * s.cols * width)),
    }
}
