//! GATv2Conv (Brody, Alon & Yahav, "How Attentive are Graph Attention Networks?"), as PyG's
//! `GATv2Conv` with its defaults (self loops, negative slope 0.2, biases, weights not shared):
//! per head `h`, `x_l = x W_lᵀ + b_l` and `x_r = x W_rᵀ + b_r` (`[n, H·F]`), the score of
//! `j → i` (`i`'s in-neighbours and `i` itself) `e_ij = att_h · LeakyReLU(x_l[j] + x_r[i])`,
//! `α = softmax_j(e_ij)` (attention dropout on `α` in training), and
//! `y_i = ‖_h Σ_j α_ij x_l[j] + b` (a hidden layer concatenates its heads; the output layer has
//! one, averaged as PyG's `concat=False` does).
//!
//! Unlike GAT's, the score cannot be split into a source and a destination term (the
//! non-linearity sits between them and `att`): it is computed per entry
//! ([`grinnder_tensor::GraphOps::pair_softmax`]). Shapes: `x` `[cols, in]`, `W_l`, `W_r`
//! `[H·F, in]`, `att` `[1, H, F]`, `y` `[rows, H·F]` (or `[rows, F]` averaged).

use grinnder_tensor::{Backend, PairGrads};

use super::gat::{drop_attention, head_mean};
use crate::aggregation::Aggregation;
use crate::conv::{Cache, Conv, Family, LayerSpec, Side};
use crate::graph::Graph;
use crate::linear::Linear;
use crate::memory::{Held, Shape};
use crate::param::Param;
use crate::work::{Passes, Work};

/// PyG's default negative slope of the score's LeakyReLU.
pub const NEGATIVE_SLOPE: f64 = 0.2;

pub struct Gatv2Conv<B: Backend> {
    /// Applied to every input row: the messages and the source side of the score.
    pub lin_l: Linear<B>,
    /// Applied to the output rows: the target side of the score.
    pub lin_r: Linear<B>,
    pub att: Param<B>,
    pub bias: Param<B>,
    pub heads: usize,
    pub concat: bool,
    /// `[H·F, F]` with `1/H` on each head's diagonal: averaging heads is a product with it.
    mean: Option<B::Mat>,
}

/// What backward needs besides the layer input.
pub struct Gatv2Cache<B: Backend> {
    xl: B::Mat,
    xr: B::Mat,
    /// attention coefficients before dropout
    alpha: B::Mat,
}

impl<B: Backend> Gatv2Conv<B> {
    /// `out_dim` is the width per head. PyG's names: `{name}.lin_l.weight`, `.lin_l.bias`,
    /// `.lin_r.weight`, `.lin_r.bias`, `.att` `[1, H, F]`, `.bias`.
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
        Gatv2Conv {
            lin_l: Linear::init(b, &format!("{name}.lin_l"), in_dim, width, true, seed),
            lin_r: Linear::init(b, &format!("{name}.lin_r"), in_dim, width, true, seed.wrapping_add(1 << 32)),
            att: Param::glorot(b, format!("{name}.att"), heads, out_dim, seed).shaped(&[1, heads, out_dim]),
            bias: Param::zeros(b, format!("{name}.bias"), 1, bias_width).shaped(&[bias_width]),
            heads,
            concat,
            mean,
        }
    }

    /// A GATv2 layer as `spec` describes it (see [`crate::families::Kind::conv`]): a hidden
    /// layer concatenates `spec.heads` heads of `spec.hidden`, the output layer has one head
    /// of `out_dim`.
    pub fn of(b: &B, spec: &LayerSpec) -> Self {
        if spec.last() {
            Gatv2Conv::init(b, &spec.name(), spec.in_dim, spec.out_dim, 1, false, spec.seed)
        } else {
            Gatv2Conv::init(b, &spec.name(), spec.in_dim, spec.hidden, spec.heads, true, spec.seed)
        }
    }
}

impl<B: Backend> Conv<B> for Gatv2Conv<B> {
    /// Forward; `attn` is the attention dropout (key, probability) in training.
    fn forward(&self, b: &B, g: &Graph<B>, x: &B::Mat, side: Side<'_, B>) -> (B::Mat, Cache) {
        let attn = side.drop;
        let a = g.adjacency(Aggregation::GcnNorm);
        let xl = self.lin_l.forward(b, x);
        let own = g.own_rows(b, x);
        let xr = self.lin_r.forward(b, own.as_ref().unwrap_or(x));
        drop(own);
        let mut alpha = b.output(a.nnz, self.heads);
        b.pair_softmax(&a.s, &xl, &xr, &self.att.value, NEGATIVE_SLOPE, &mut alpha);
        let dropped = drop_attention(b, g, &alpha, attn);
        let mut agg = b.output(g.rows, b.dims(&xl).1);
        b.spmm(&a.s, dropped.as_ref().unwrap_or(&alpha), false, &xl, 0.0, &mut agg);
        let mut y = match &self.mean {
            None => agg,
            Some(m) => {
                let mut y = b.output(g.rows, b.dims(m).1);
                b.gemm(1.0, &agg, false, m, false, 0.0, &mut y);
                y
            }
        };
        b.add_row(&self.bias.value, &mut y);
        (y, Cache::new(Gatv2Cache::<B> { xl, xr, alpha }))
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
        let Gatv2Cache { xl, xr, alpha } = cache.take::<Gatv2Cache<B>>();
        let a = g.adjacency(Aggregation::GcnNorm);
        let width = b.dims(&xl).1;
        b.col_sums(dy, 1.0, &mut self.bias.grad);
        let dagg_owned = self.mean.as_ref().map(|m| {
            let mut d = b.output(g.rows, width);
            b.gemm(1.0, dy, false, m, true, 0.0, &mut d);
            d
        });
        let dagg = dagg_owned.as_ref().unwrap_or(dy);
        // the messages' gradient, then the coefficients' (through the same dropout mask)
        let dropped = drop_attention(b, g, &alpha, attn);
        let mut dxl = b.output(g.cols, width);
        b.spmm(&a.s, dropped.as_ref().unwrap_or(&alpha), true, dagg, 0.0, &mut dxl);
        drop(dropped);
        let mut dalpha = b.output(a.nnz, self.heads);
        b.sddmm(&a.s, dagg, &xl, &mut dalpha);
        drop(dagg_owned);
        if let Some((key, p)) = attn.filter(|&(_, p)| p > 0.0) {
            b.edge_dropout(&a.s, key, p, &mut dalpha);
        }
        let mut dxr = b.zeros(g.rows, width);
        let grads = PairGrads { dxl: &mut dxl, dxr: &mut dxr, datt: &mut self.att.grad };
        b.pair_softmax_backward(&a.s, &xl, &xr, &self.att.value, NEGATIVE_SLOPE, &alpha, &dalpha, grads);
        drop((xl, xr, alpha, dalpha));
        let own = g.own_rows(b, x);
        let dx_r = self.lin_r.backward(b, own.as_ref().unwrap_or(x), &dxr, need_dx);
        drop((own, dxr));
        let mut dx = self.lin_l.backward(b, x, &dxl, need_dx)?;
        g.add_own_rows(b, &dx_r.expect("asked for with dx"), &mut dx);
        Some(dx)
    }

    fn params_mut(&mut self) -> Vec<&mut Param<B>> {
        let mut v = self.lin_l.params_mut();
        v.extend(self.lin_r.params_mut());
        v.extend([&mut self.att, &mut self.bias]);
        v
    }

    fn held(&self, s: Shape, i: u64, o: u64, _: bool, need_dx: bool, attn_dropout: bool) -> Held {
        held(s, i, self.heads as u64, o, self.concat, attn_dropout, need_dx)
    }

    fn work(&self, s: Shape, i: u64, o: u64, _: bool, need_dx: bool) -> Passes {
        work(s, i, self.heads as u64, o, self.concat, need_dx)
    }
}

/// GATv2 as a family: `gatv2`, PyG's `GATv2Conv`, attention over `A + I` with heads.
pub struct Gatv2;

impl Family for Gatv2 {
    /// `lin_l` and `lin_r` with their biases, `att` and `bias`, over the output's width.
    fn values(&self, s: &LayerSpec) -> u128 {
        let (i, o) = (s.in_dim as u128, s.out_dim as u128);
        2 * i * o + 4 * o
    }

    fn name(&self) -> &'static str {
        "gatv2"
    }

    fn pyg_layer(&self) -> &'static str {
        "GATv2Conv"
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
        format!("convs.{l}.lin_l.weight")
    }

    /// The bias, whose width is the output's whether heads are concatenated or averaged.
    fn output_map(&self, l: usize) -> String {
        format!("convs.{l}.bias")
    }

    /// SAGE's `lin_l.weight` and `lin_r.weight` too: the attention vector tells it apart.
    fn markers(&self) -> Vec<String> {
        vec![self.first_map(0), "convs.0.lin_r.weight".into(), "convs.0.att".into()]
    }

    fn heads_tensor(&self, l: usize) -> Option<String> {
        Some(format!("convs.{l}.att"))
    }
}

/// Elements held on a partition of shape `s` (see [`crate::memory`]) by a layer of `heads`
/// heads whose output is `o` wide (`heads · F` concatenated, else `F`). Forward makes `x_l`
/// (`cols × H·F`), the own rows' copy and `x_r` (`rows × H·F`), then keeps both with the
/// coefficients (`nnz × H`) beside the dropped coefficients, the weighted sum and the heads'
/// mean. Backward makes `dx_l` over the columns and the coefficients' gradient, then inside the
/// score's backward the score's gradient (`nnz × H`), `dx_r` and, on a GPU, a row-wise share of
/// `datt` (`rows × H·F` each); then the own rows' copy with `x_r`'s input gradient, and the
/// input gradient over the columns.
pub fn held(s: Shape, i: u64, heads: u64, o: u64, concat: bool, attn_dropout: bool, need_dx: bool) -> Held {
    let width = if concat { o } else { o * heads };
    let (edges, own) = (s.nnz * heads, s.own_copy(i));
    let (xl, xr) = (s.cols * width, s.rows * width);
    let kept = xl + xr + edges;
    let dropped = if attn_dropout { edges } else { 0 };
    let mean = if concat { 0 } else { s.rows * o };
    let dagg = if concat { 0 } else { xr };
    // dx_l beside dagg and the dropped coefficients, then the coefficients' gradient
    let coefficients = kept + dagg + xl + dropped.max(edges);
    // the score's backward: dx_l, dalpha, dx_r, its gradient and the GPU's share of datt
    let score = kept + xl + 2 * edges + 2 * xr;
    // x_r's backward beside dx_l and dx_r, then lin_l's beside dx_l
    let root = xl + xr + own + if need_dx { s.rows * i } else { 0 };
    let dx = if need_dx { xl + s.rows * i + s.cols * i } else { 0 };
    Held {
        forward: (xl + own + xr).max(kept + dropped + xr + mean),
        kept,
        backward: coefficients.max(score).max(root).max(dx),
    }
}

/// Work on a partition of shape `s` (see [`crate::work`]), `heads` heads of output `o`: both
/// transforms, the per-entry scores (a product `H·F` wide per entry, with its LeakyReLU) and
/// their softmax, the weighted sum; backward the transposed sum, the coefficients' gradient (a
/// sampled product), the score's backward (twice its forward per entry), the weight
/// gradients and the input gradients.
pub fn work(s: Shape, i: u64, heads: u64, o: u64, concat: bool, need_dx: bool) -> Passes {
    let width = if concat { o } else { o * heads };
    let per_entry = s.nnz * width;
    let dx = if need_dx {
        Work::gemm(s.cols, width, i).and(Work::gemm(s.rows, width, i))
    } else {
        Work::default()
    };
    Passes {
        forward: Work::gemm(s.cols, i, width)
            .and(Work::gemm(s.rows, i, width))
            .and(Work::spmm(s.nnz, width, false))
            .and(Work::elementwise(4 * per_entry + 8 * s.nnz * heads)),
        backward: Work::spmm(s.nnz, width, true)
            .and(Work::spmm(s.nnz, width, false))
            .and(Work::gemm(width, s.cols, i))
            .and(Work::gemm(width, s.rows, i))
            .and(dx)
            .and(Work::elementwise(12 * per_entry + 8 * s.nnz * heads)),
    }
}
