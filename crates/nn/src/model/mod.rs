//! Models: a stack of convolutions with, between them, optional LayerNorm, ReLU, dropout and a
//! residual connection (when widths match):
//!
//! `h₀ = dropout_in(x)`; for hidden layer l: `h_{l+1} = dropout(relu(norm(conv_l(h_l)))) [+ h_l]`;
//! logits `= conv_{L-1}(h_{L-1})`. Dropout masks are keyed by (seed, epoch, layer, node,
//! column), so any executor that computes a node's row gets the same mask.
//!
//! When the input has no dropout it is fixed across epochs, and the first layer's aggregation
//! `Â x` is computed once ([`Model::prepare`]) and reused: that layer then runs no sparse
//! product, forward or backward.

use grinnder_tensor::{Backend, Binary, MaskKey, Unary};
use serde::{Deserialize, Serialize};

use crate::aggregation::Aggregation;
use crate::conv::{Cache, Conv, Initial, LayerSpec, Side, SplitMaps};
use crate::families::Kind;
use crate::graph::{Adjacency, Graph};
use crate::layer_norm::LayerNorm;
use crate::linear::Linear;
use crate::param::Param;

mod held;
#[cfg(test)]
mod tests;
mod work;
pub use work::SplitWork;

/// Normalisation between layers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Norm {
    None,
    Layer,
}

/// A model's shape and regularisation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelConfig {
    pub kind: Kind,
    pub layers: usize,
    pub hidden: usize,
    /// Dropout after every hidden layer's activation.
    pub dropout: f64,
    /// Dropout on the input features (0 keeps the input fixed, enabling the precomputed
    /// first aggregation).
    pub input_dropout: f64,
    pub norm: Norm,
    pub residual: bool,
    /// GAT: attention heads of hidden layers (the output layer has one).
    pub heads: usize,
    /// GAT: dropout on the attention coefficients.
    pub attn_dropout: f64,
    /// GIN: ε, the weight of a node's own row is `1 + ε` (initial value when trained).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub gin_eps: f64,
    /// GIN: train ε (PyG's `train_eps`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub train_eps: bool,
    /// GCNII: α, the weight of the initial representation in every layer (PyG's `alpha`).
    #[serde(default = "default_alpha")]
    pub alpha: f64,
    /// GCNII: θ, layer `l`'s identity mapping weighs `β = ln(θ / l + 1)` (PyG's `theta`).
    #[serde(default = "default_theta")]
    pub theta: f64,
    pub seed: u64,
}

/// GCNII's α and θ where a configuration does not say (PyG's example on Cora).
pub const DEFAULT_ALPHA: f64 = 0.1;
pub const DEFAULT_THETA: f64 = 0.5;

/// Whether GCNII's `α` is one it takes: in [0, 1] (it weighs `x₀` against the aggregation).
pub fn valid_alpha(alpha: f64) -> bool {
    (0.0..=1.0).contains(&alpha)
}

/// Whether GCNII's `θ` is one it takes: finite and at least 0 (`β = ln(θ / l + 1)` is then
/// finite and at least 0).
pub fn valid_theta(theta: f64) -> bool {
    theta.is_finite() && theta >= 0.0
}

fn default_alpha() -> f64 {
    DEFAULT_ALPHA
}

fn default_theta() -> f64 {
    DEFAULT_THETA
}

fn is_zero(x: &f64) -> bool {
    *x == 0.0
}

impl ModelConfig {
    /// Width of a hidden layer's output (a GAT hidden layer concatenates its heads).
    pub fn hidden_width(&self) -> usize {
        self.hidden * self.heads_of_hidden()
    }

    /// The values a model of this shape on `in_dim` features and `classes` holds (what its
    /// model file holds: each family's [`crate::conv::Family::values`], and a norm's two
    /// vectors); `None` where it overflows. Asked before [`Model::init`] allocates, so that a
    /// size no machine holds is refused instead of aborting.
    pub fn parameter_bound(&self, in_dim: usize, classes: usize) -> Option<u64> {
        let family = self.kind.family();
        let convs: u128 = (0..self.layers).map(|l| family.values(&self.layer_spec(l, in_dim, classes))).sum();
        let norms = match self.norm {
            Norm::Layer => 2 * self.hidden_width() as u128 * self.layers.saturating_sub(1) as u128,
            Norm::None => 0,
        };
        u64::try_from(convs + norms).ok()
    }

    /// What layer `l` of this model on `in_dim` features and `classes` is made from.
    pub fn layer_spec(&self, l: usize, in_dim: usize, classes: usize) -> LayerSpec {
        let width = |l: usize| match l {
            0 => in_dim,
            l if l == self.layers => classes,
            _ => self.hidden_width(),
        };
        LayerSpec {
            l,
            layers: self.layers,
            in_dim: width(l),
            out_dim: width(l + 1),
            hidden: self.hidden,
            heads: self.heads_of_hidden(),
            gin_eps: self.gin_eps,
            train_eps: self.train_eps,
            alpha: self.alpha,
            theta: self.theta,
            seed: self.seed.wrapping_add(l as u64),
        }
    }

    /// Attention heads of a hidden layer (1 without attention).
    pub fn heads_of_hidden(&self) -> usize {
        if self.kind.family().has_heads() {
            self.heads.max(1)
        } else {
            1
        }
    }
}

/// What one layer's backward needs from its forward (see [`Model::layer_forward`]).
pub struct LayerTape<B: Backend> {
    epoch: u64,
    /// The conv's input when input dropout made a copy of the layer input.
    dropped_input: Option<B::Mat>,
    cache: Cache,
    /// pre-norm conv output and LayerNorm statistics (hidden layers with a norm)
    norm_in: Option<(B::Mat, B::Mat)>,
    /// post-dropout activation (hidden layers): the ReLU gradient mask
    act: Option<B::Mat>,
    residual: bool,
    /// a hidden layer (norm, ReLU, dropout, residual follow the conv)
    hidden: bool,
}

/// Everything backward needs from one whole-model forward pass.
pub struct Tape<B: Backend> {
    /// `h_1 .. h_{L-1}`
    hidden: Vec<B::Mat>,
    layers: Vec<LayerTape<B>>,
    /// The initial representation, where the model has one ([`Initial`]).
    x0: Option<B::Mat>,
}

/// A GNN with its parameters on backend `B`.
pub struct Model<B: Backend> {
    pub config: ModelConfig,
    convs: Vec<Box<dyn Conv<B>>>,
    norms: Vec<LayerNorm<B>>,
    /// `Â x` for a fixed input, once [`Model::prepare`] ran.
    pre: Option<B::Mat>,
    /// Width of every layer's input, then the output width.
    dims: Vec<usize>,
}

/// Dropout site numbers: hidden layer l uses site l; the input uses this one.
const INPUT_SITE: u64 = 1 << 20;
/// Attention dropout of layer l uses site `ATTN_SITE + l`.
const ATTN_SITE: u64 = 1 << 21;

impl<B: Backend> Model<B> {
    /// Initialises a model for `in_dim` input features and `classes` outputs.
    pub fn init(b: &B, config: ModelConfig, in_dim: usize, classes: usize) -> Self {
        assert!(config.layers >= 1, "a model has at least one layer");
        let dims: Vec<usize> = std::iter::once(in_dim)
            .chain(std::iter::repeat_n(config.hidden_width(), config.layers - 1))
            .chain([classes])
            .collect();
        let convs = (0..config.layers)
            .map(|l| config.kind.conv(b, &config.layer_spec(l, in_dim, classes)))
            .collect::<Option<Vec<_>>>()
            .unwrap_or_else(|| panic!("{} layers are their caller's: Model::from_layers", config.kind));
        let norms = match config.norm {
            Norm::Layer => (0..config.layers - 1)
                .map(|l| LayerNorm::init(b, &format!("norms.{l}"), config.hidden_width()))
                .collect(),
            Norm::None => Vec::new(),
        };
        Model { config, convs, norms, pre: None, dims }
    }

    /// A model of the caller's layers ([`Kind::Layerwise`]), stacked bare
    /// ([`crate::conv::Family::whole_layers`]: norm, activation and dropout are the layers'
    /// own), on `aggregation`'s adjacency: layer `l` maps `dims[l]` columns to `dims[l + 1]`;
    /// `seed` keys what the model draws.
    pub fn from_layers(
        convs: Vec<Box<dyn Conv<B>>>,
        dims: Vec<usize>,
        aggregation: Aggregation,
        seed: u64,
    ) -> Self {
        assert!(!convs.is_empty() && dims.len() == convs.len() + 1, "one width more than layers");
        let config = ModelConfig {
            kind: Kind::Layerwise(aggregation),
            layers: convs.len(),
            hidden: dims[1],
            dropout: 0.0,
            input_dropout: 0.0,
            norm: Norm::None,
            residual: false,
            heads: 1,
            attn_dropout: 0.0,
            gin_eps: 0.0,
            train_eps: false,
            alpha: DEFAULT_ALPHA,
            theta: DEFAULT_THETA,
            seed,
        };
        Model { config, convs, norms: Vec::new(), pre: None, dims }
    }

    /// The first layer's aggregation of a fixed input (no input dropout), for GCN and SAGE;
    /// `None` when there is nothing to precompute. The rows are `g`'s output rows.
    pub fn aggregate_input(&self, b: &B, g: &Graph<B>, x: &B::Mat) -> Option<B::Mat> {
        if self.config.input_dropout != 0.0 {
            return None;
        }
        self.convs[0].aggregate_input(b, g, x)
    }

    /// `out = A x + beta · out` with the first layer's input aggregation `A` on `g` — where `g`
    /// holds some of the columns and `x` their rows, the aggregation a piece at a time (sum
    /// the pieces with `beta` 1). Only where [`Model::precomputes_input`].
    pub fn aggregate_input_into(&self, b: &B, g: &Graph<B>, x: &B::Mat, beta: f64, out: &mut B::Mat) {
        debug_assert!(self.precomputes_input());
        let a = g.adjacency(self.aggregation());
        a.spmm(b, false, x, beta, out);
    }

    /// Whether the first layer's aggregation of the input can be computed once: the input is
    /// fixed (no input dropout) and the layer aggregates it before anything trainable (not
    /// attention, whose weights depend on the parameters).
    pub fn precomputes_input(&self) -> bool {
        self.config.input_dropout == 0.0 && self.config.kind.family().precomputes_input()
    }

    /// The neighbourhood aggregation of the model's layers (what graph they run on).
    pub fn aggregation(&self) -> Aggregation {
        self.config.kind.family().aggregation()
    }

    /// [`crate::conv::Family::weighs_entries`] of the model's family.
    pub fn weighs_entries(&self) -> bool {
        self.config.kind.family().weighs_entries()
    }

    /// Values per adjacency entry that a layer's working set holds: one per attention head
    /// (GAT's scores and coefficients), else one (the entry's value).
    pub fn edge_width(&self) -> usize {
        self.config.heads_of_hidden()
    }

    /// Whether split layer `l`'s aggregation phase also reads the own input rows (SAGE's root
    /// term, `x_own W_rᵀ`).
    pub fn split_reads_own_input(&self, l: usize) -> bool {
        self.convs[l].split_maps().is_some_and(|m| m.root.is_some())
    }

    /// Precomputes the first layer's aggregation of a fixed input for [`Model::forward`].
    pub fn prepare(&mut self, b: &B, g: &Graph<B>, x: &B::Mat) {
        self.pre = self.aggregate_input(b, g, x);
    }

    /// Number of layers.
    pub fn layers(&self) -> usize {
        self.convs.len()
    }

    /// Width of layer `l`'s input (`l = layers()`: the output width).
    pub fn dim(&self, l: usize) -> usize {
        self.dims[l]
    }

    /// The dropout layer `l` applies inside itself in training ([`Side::drop`]): attention
    /// dropout, or the hidden dropout for a family that drops its own input
    /// ([`crate::conv::Family::drops_its_input`]).
    pub(crate) fn own_drop(&self, train: bool, epoch: u64, l: usize) -> Option<(MaskKey, f64)> {
        let key = MaskKey { seed: self.config.seed, epoch, site: ATTN_SITE + l as u64 };
        let rate = if self.config.kind.family().drops_its_input() {
            self.config.dropout
        } else {
            self.config.attn_dropout
        };
        (train && rate > 0.0).then_some((key, rate))
    }

    /// Whether the model has an initial representation its layers read (GCNII's `x₀`): a
    /// caller running it layer by layer keeps `x₀` itself and goes through
    /// [`Model::layer_forward_initial`] and [`Model::layer_backward_initial`]
    /// ([`Model::layer_forward`] and [`Model::layer_backward`] carry none).
    pub fn has_initial(&self) -> bool {
        self.convs.iter().any(|c| c.initial() != Initial::None)
    }

    /// What layer `l` reads beside its input.
    fn side<'a>(
        &self,
        l: usize,
        pre: Option<&'a B::Mat>,
        x0: Option<&'a B::Mat>,
        drop: Option<(MaskKey, f64)>,
    ) -> Side<'a, B> {
        let x0 = x0.filter(|_| self.convs[l].initial() == Initial::Reads);
        Side { pre, x0, drop }
    }

    pub fn params_mut(&mut self) -> Vec<&mut Param<B>> {
        let mut v: Vec<&mut Param<B>> = self.convs.iter_mut().flat_map(|c| c.params_mut()).collect();
        v.extend(self.norms.iter_mut().flat_map(|n| n.params_mut()));
        v
    }

    /// Everything a model file holds, in PyG's names and shapes (`Param::name`,
    /// `Param::shape`): the parameters, and values PyG keeps as buffers (a fixed GIN ε).
    pub fn state_mut(&mut self) -> Vec<&mut Param<B>> {
        let mut v: Vec<&mut Param<B>> = self.convs.iter_mut().flat_map(|c| c.state_mut()).collect();
        v.extend(self.norms.iter_mut().flat_map(|n| n.params_mut()));
        v
    }

    pub fn zero_grad(&mut self, b: &B) {
        for p in self.params_mut() {
            p.zero_grad(b);
        }
    }

    /// Forward pass of the whole model on a square graph; `train` applies dropout with masks
    /// keyed by `epoch`. Returns the logits and the tape for [`Model::backward`].
    pub fn forward(&self, b: &B, g: &Graph<B>, x: &B::Mat, train: bool, epoch: u64) -> (B::Mat, Tape<B>) {
        let mut tape = Tape { hidden: Vec::new(), layers: Vec::new(), x0: None };
        for l in 0..self.layers() {
            let input = if l == 0 { x } else { &tape.hidden[l - 1] };
            let pre = if l == 0 { self.pre.as_ref() } else { None };
            // a hidden output without residual is its own ReLU mask: kept once, in `hidden`
            let (y, t) = self.layer_forward_impl(b, g, l, input, pre, tape.x0.as_ref(), train, epoch, false);
            if tape.x0.is_none() {
                tape.x0 = self.convs[l].initial_of(b, g, &t.cache);
            }
            tape.layers.push(t);
            if l + 1 == self.layers() {
                return (y, tape);
            }
            tape.hidden.push(y);
        }
        unreachable!("a model has at least one layer")
    }

    /// The output of layer `upto - 1` without dropout, on a square graph: a hidden layer's rows
    /// after its norm, ReLU and residual (an embedding), or the logits for `upto = layers()`.
    pub fn forward_to(&self, b: &B, g: &Graph<B>, x: &B::Mat, upto: usize) -> B::Mat {
        assert!((1..=self.layers()).contains(&upto), "layer {upto} of {}", self.layers());
        let (mut h, mut x0): (Option<B::Mat>, Option<B::Mat>) = (None, None);
        for l in 0..upto {
            let input = h.as_ref().unwrap_or(x);
            let pre = if l == 0 { self.pre.as_ref() } else { None };
            let (y, t) = self.layer_forward_impl(b, g, l, input, pre, x0.as_ref(), false, 0, false);
            if x0.is_none() {
                x0 = self.convs[l].initial_of(b, g, &t.cache);
            }
            h = Some(y);
        }
        h.expect("at least one layer ran")
    }

    /// Backward from the logits' gradient: accumulates every parameter's gradient.
    pub fn backward(&mut self, b: &B, g: &Graph<B>, x: &B::Mat, tape: Tape<B>, dlogits: B::Mat) {
        let Tape { mut hidden, mut layers, x0 } = tape;
        let mut grad = dlogits;
        let pre = self.pre.take();
        let mut output: Option<B::Mat> = None;
        // the initial representation's gradient, summed over the layers that read it
        let mut dx0 = x0.as_ref().map(|x0| {
            let (n, d) = b.dims(x0);
            b.zeros(n, d)
        });
        for l in (0..self.layers()).rev() {
            let t = layers.pop().expect("one tape per layer");
            let input_owned = if l == 0 { None } else { hidden.pop() };
            let input = input_owned.as_ref().unwrap_or(x);
            let pre_l = if l == 0 { pre.as_ref() } else { None };
            let initial = (x0.as_ref(), dx0.as_mut());
            let dx =
                self.layer_backward_impl(b, g, l, input, pre_l, initial, t, &grad, l > 0, output.as_ref());
            // this layer's input is the layer below's output
            output = input_owned;
            match dx {
                Some(dx) => grad = dx,
                None => break,
            }
        }
        self.pre = pre;
    }

    /// One layer as a unit: the conv, then for a hidden layer norm, ReLU, dropout and the
    /// residual. `x` holds the layer's input rows (`g.cols`, own rows first); `pre` is the
    /// layer-0 aggregation of a fixed input ([`Model::aggregate_input`]), in which case `x`
    /// may hold just the own rows. Returns the `g.rows` output rows and the tape.
    #[allow(clippy::too_many_arguments)]
    pub fn layer_forward(
        &self,
        b: &B,
        g: &Graph<B>,
        l: usize,
        x: &B::Mat,
        pre: Option<&B::Mat>,
        train: bool,
        epoch: u64,
    ) -> (B::Mat, LayerTape<B>) {
        debug_assert!(
            !self.has_initial(),
            "a model with an initial representation runs whole (Model::has_initial)"
        );
        self.layer_forward_impl(b, g, l, x, pre, None, train, epoch, true)
    }

    /// [`Model::layer_forward`] for a model with an initial representation
    /// ([`Model::has_initial`]; any other model too, with `x0` `None`): `x0` holds its
    /// `g.rows` own rows for a layer that reads it. Returns, besides the output and the tape,
    /// `x0`'s own rows where layer `l` makes it (for the partitioned executor's block).
    #[allow(clippy::too_many_arguments)]
    pub fn layer_forward_initial(
        &self,
        b: &B,
        g: &Graph<B>,
        l: usize,
        x: &B::Mat,
        pre: Option<&B::Mat>,
        x0: Option<&B::Mat>,
        train: bool,
        epoch: u64,
    ) -> (B::Mat, LayerTape<B>, Option<B::Mat>) {
        let (y, tape) = self.layer_forward_impl(b, g, l, x, pre, x0, train, epoch, true);
        let made = match self.convs[l].initial() {
            Initial::Makes => self.convs[l].initial_of(b, g, &tape.cache),
            _ => None,
        };
        (y, tape, made)
    }

    /// `keep_act = false`: a hidden output without residual is not copied into the tape; the
    /// caller then hands it to [`Model::layer_backward`] as `output`.
    #[allow(clippy::too_many_arguments)]
    fn layer_forward_impl(
        &self,
        b: &B,
        g: &Graph<B>,
        l: usize,
        x: &B::Mat,
        pre: Option<&B::Mat>,
        x0: Option<&B::Mat>,
        train: bool,
        epoch: u64,
        keep_act: bool,
    ) -> (B::Mat, LayerTape<B>) {
        let key = |site| MaskKey { seed: self.config.seed, epoch, site };
        let dropped_input = (l == 0 && train && self.config.input_dropout > 0.0).then(|| {
            let (n, d) = b.dims(x);
            let mut x0 = b.output(n, d);
            b.copy(x, &mut x0);
            b.dropout(key(INPUT_SITE), self.config.input_dropout, g.ids_of_rows(n), &mut x0);
            x0
        });
        let input = dropped_input.as_ref().unwrap_or(x);
        let pre = pre.filter(|_| dropped_input.is_none());
        let side = self.side(l, pre, x0, self.own_drop(train, epoch, l));
        let (z, cache) = self.convs[l].forward(b, g, input, side);
        let mut tape = LayerTape {
            epoch,
            dropped_input: None,
            cache,
            norm_in: None,
            act: None,
            residual: false,
            hidden: false,
        };
        if !self.finishes(l) {
            tape.dropped_input = dropped_input;
            return (z, tape);
        }
        let out = self.finish_hidden(b, g, l, z, Some(input), train, epoch, keep_act, &mut tape);
        tape.dropped_input = dropped_input;
        (out, tape)
    }

    /// Whether the model finishes layer `l` after its conv (norm, ReLU, dropout, residual): a
    /// hidden layer, unless its layers are whole ([`crate::conv::Family::whole_layers`]).
    fn finishes(&self, l: usize) -> bool {
        l + 1 < self.layers() && !self.config.kind.family().whole_layers()
    }

    /// A hidden layer after its conv: norm, ReLU, dropout, residual (with `input`'s own rows).
    #[allow(clippy::too_many_arguments)]
    fn finish_hidden(
        &self,
        b: &B,
        g: &Graph<B>,
        l: usize,
        mut z: B::Mat,
        input: Option<&B::Mat>,
        train: bool,
        epoch: u64,
        keep_act: bool,
        tape: &mut LayerTape<B>,
    ) -> B::Mat {
        let key = |site| MaskKey { seed: self.config.seed, epoch, site };
        tape.norm_in = self.norms.get(l).map(|ln| {
            let (y, stats) = ln.forward(b, &z);
            (std::mem::replace(&mut z, y), stats)
        });
        b.unary(Unary::Relu, &mut z);
        if train && self.config.dropout > 0.0 {
            b.dropout(key(l as u64), self.config.dropout, g.row_ids(), &mut z);
        }
        let input = input.filter(|x| self.config.residual && b.dims(&z).1 == b.dims(x).1);
        tape.residual = input.is_some();
        let out = if let Some(input) = input {
            let own = g.own_rows(b, input);
            let mut s = b.output(g.rows, b.dims(&z).1);
            b.copy(own.as_ref().unwrap_or(input), &mut s);
            b.binary(Binary::Add, &z, &mut s);
            tape.act = Some(z);
            s
        } else if keep_act {
            let (n, d) = b.dims(&z);
            let mut keep = b.output(n, d);
            b.copy(&z, &mut keep);
            tape.act = Some(keep);
            z
        } else {
            z
        };
        tape.hidden = true;
        out
    }

    /// Whether hidden layer `l`'s backward can run from its stored output instead of a
    /// recomputed forward ([`Model::tape_from_output`]): a GCN or SAGE layer without norm,
    /// residual or input dropout whose forward keeps no aggregation (it used the precomputed
    /// `pre`, or transformed before aggregating).
    pub fn backward_from_output(&self, l: usize, with_pre: bool) -> bool {
        let hidden = l + 1 < self.layers();
        let norm = self.norms.get(l).is_some();
        let residual = self.config.residual && self.dims[l] == self.dims[l + 1];
        let input_dropout = l == 0 && self.config.input_dropout > 0.0;
        let no_agg = (l == 0 && with_pre) || self.dims[l] > self.dims[l + 1];
        let conv = self.convs[l].cache_from_output().is_some();
        hidden && conv && !norm && !residual && !input_dropout && no_agg
    }

    /// The tape of hidden layer `l` at `epoch` without recomputing it, when
    /// [`Model::backward_from_output`] allows; pass the layer's output to
    /// [`Model::layer_backward`].
    pub fn tape_from_output(&self, l: usize, with_pre: bool, epoch: u64) -> Option<LayerTape<B>> {
        if !self.backward_from_output(l, with_pre) {
            return None;
        }
        let cache = self.convs[l].cache_from_output()?;
        Some(LayerTape {
            epoch,
            dropped_input: None,
            cache,
            norm_in: None,
            act: None,
            residual: false,
            hidden: self.finishes(l),
        })
    }

    /// Backward of [`Model::layer_forward`] given the gradient of its output (`g.rows` rows):
    /// accumulates the layer's parameter gradients and returns the gradient of its input
    /// (`g.cols` rows) when `need_dx`. `output` is the layer's output rows, needed (as the
    /// ReLU and dropout mask) only when the tape does not hold the activation: a tape from
    /// [`Model::tape_from_output`], or the whole-model forward's.
    #[allow(clippy::too_many_arguments)]
    pub fn layer_backward(
        &mut self,
        b: &B,
        g: &Graph<B>,
        l: usize,
        x: &B::Mat,
        pre: Option<&B::Mat>,
        tape: LayerTape<B>,
        dy: &B::Mat,
        need_dx: bool,
        output: Option<&B::Mat>,
    ) -> Option<B::Mat> {
        self.layer_backward_impl(b, g, l, x, pre, (None, None), tape, dy, need_dx, output)
    }

    /// [`Model::layer_backward`] of [`Model::layer_forward_initial`]: `x0` its own rows where
    /// the layer reads it; `dx0` `g.rows` rows of `x0`'s gradient, to which a layer that reads
    /// `x0` adds its part, and which the layer that makes it reads as the sum of the later
    /// layers' parts (`None` where no later layer reads it).
    #[allow(clippy::too_many_arguments)]
    pub fn layer_backward_initial(
        &mut self,
        b: &B,
        g: &Graph<B>,
        l: usize,
        x: &B::Mat,
        pre: Option<&B::Mat>,
        initial: (Option<&B::Mat>, Option<&mut B::Mat>),
        tape: LayerTape<B>,
        dy: &B::Mat,
        need_dx: bool,
    ) -> Option<B::Mat> {
        self.layer_backward_impl(b, g, l, x, pre, initial, tape, dy, need_dx, None)
    }

    /// [`Model::layer_backward`] with the initial representation and its gradient's sum.
    #[allow(clippy::too_many_arguments)]
    fn layer_backward_impl(
        &mut self,
        b: &B,
        g: &Graph<B>,
        l: usize,
        x: &B::Mat,
        pre: Option<&B::Mat>,
        (x0, dx0): (Option<&B::Mat>, Option<&mut B::Mat>),
        tape: LayerTape<B>,
        dy: &B::Mat,
        need_dx: bool,
        output: Option<&B::Mat>,
    ) -> Option<B::Mat> {
        let LayerTape { epoch, dropped_input, cache, norm_in, act, residual, hidden } = tape;
        let input = dropped_input.as_ref().unwrap_or(x);
        let pre = pre.filter(|_| dropped_input.is_none());
        let side = self.side(l, pre, x0, self.own_drop(true, epoch, l));
        if !hidden {
            // the output layer: no activation
            return self.convs[l].backward(b, g, input, side, cache, dy, need_dx, dx0);
        }
        let act = act.as_ref().or(output).expect("a hidden layer's activation or output");
        let dz = self.hidden_grad(b, g, l, epoch, act, norm_in, dy);
        let mut dx = self.convs[l].backward(b, g, input, side, cache, &dz, need_dx, dx0)?;
        if residual {
            g.add_own_rows(b, dy, &mut dx);
        }
        Some(dx)
    }

    /// Backward through a hidden layer's ReLU, dropout and norm: the gradient of its conv output.
    #[allow(clippy::too_many_arguments)]
    fn hidden_grad(
        &mut self,
        b: &B,
        g: &Graph<B>,
        l: usize,
        epoch: u64,
        act: &B::Mat,
        norm_in: Option<(B::Mat, B::Mat)>,
        dy: &B::Mat,
    ) -> B::Mat {
        let key = MaskKey { seed: self.config.seed, epoch, site: l as u64 };
        let (n, d) = b.dims(dy);
        let mut dz = b.output(n, d);
        b.copy(dy, &mut dz);
        if self.config.dropout > 0.0 {
            b.dropout(key, self.config.dropout, g.row_ids(), &mut dz);
        }
        b.binary(Binary::ReluGrad, act, &mut dz);
        if let Some((z, stats)) = norm_in {
            dz = self.norms[l].backward(b, &z, &stats, &dz);
        }
        dz
    }

    /// Whether layer `l` runs split on a partitioned graph: its conv transforms before it
    /// aggregates (GCN or SAGE with input wider than output, no precomputed aggregation, no
    /// input dropout), so the transform runs on own rows only ([`Model::split_transform`]) and
    /// only the narrower transformed rows cross partitions ([`Model::split_forward`]).
    pub fn split(&self, l: usize, with_pre: bool) -> bool {
        let conv = self.convs[l].split_maps().is_some();
        let first_fixed = l == 0 && (with_pre || self.config.input_dropout > 0.0);
        conv && self.dims[l] > self.dims[l + 1] && !first_fixed
    }

    /// Whether layer 0, given its precomputed aggregation, still reads its input rows: SAGE's
    /// root term, or a residual connection of matching width. When not, callers may pass the
    /// aggregation in the input's place.
    pub fn reads_input_beside_pre(&self) -> bool {
        self.convs[0].reads_input_beside_pre() || (self.config.residual && self.dims[0] == self.dims[1])
    }

    /// Whether [`Model::forward`] and [`Model::backward`] read nothing of the input features
    /// any more: [`Model::prepare`] stored layer 0's aggregation and layer 0 reads nothing
    /// beside it (GCN without a residual). The caller may then free the features and pass an
    /// empty matrix of their width.
    pub fn reads_only_pre(&self) -> bool {
        self.pre.is_some() && !self.reads_input_beside_pre()
    }

    /// A split layer's maps ([`Model::split`] said it runs split: its conv has them).
    fn split_maps(&self, l: usize) -> SplitMaps<&Linear<B>> {
        self.convs[l].split_maps().expect("Model::split: a split layer's conv has split maps")
    }

    /// The adjacency a split layer aggregates over: `A + I` for GCN, `A` for SAGE.
    fn split_adjacency<'g>(&self, g: &'g Graph<B>) -> &'g Adjacency<B> {
        g.adjacency(self.aggregation())
    }

    /// [`Model::split_maps`] for accumulating their gradients.
    fn split_maps_mut(&mut self, l: usize) -> SplitMaps<&mut Linear<B>> {
        self.convs[l].split_maps_mut().expect("Model::split: a split layer's conv has split maps")
    }

    /// Phase 1 of a split layer: `h = x Wᵀ` for the rows of `x` (no bias).
    pub fn split_transform(&self, b: &B, l: usize, x: &B::Mat) -> B::Mat {
        let lin = self.split_maps(l).aggregated;
        let mut h = b.output(b.dims(x).0, self.dims[l + 1]);
        b.gemm(1.0, x, false, &lin.weight.value, true, 0.0, &mut h);
        h
    }

    /// Phase 2 of a split layer: `y = A h + b` (SAGE: `+ x_own W_rᵀ`), then for a hidden layer
    /// norm, ReLU and dropout. `h` has `g.cols` rows, `x_own` the `g.rows` own input rows.
    #[allow(clippy::too_many_arguments)]
    pub fn split_forward(
        &self,
        b: &B,
        g: &Graph<B>,
        l: usize,
        h: &B::Mat,
        x_own: Option<&B::Mat>,
        train: bool,
        epoch: u64,
    ) -> (B::Mat, LayerTape<B>) {
        let (a, SplitMaps { aggregated: lin, root }) = (self.split_adjacency(g), self.split_maps(l));
        let mut z = b.output(g.rows, self.dims[l + 1]);
        a.spmm(b, false, h, 0.0, &mut z);
        if let Some(bias) = &lin.bias {
            b.add_row(&bias.value, &mut z);
        }
        if let Some(r) = root {
            r.forward_into(b, x_own.expect("SAGE's root term reads the own input rows"), 1.0, &mut z);
        }
        let cache =
            self.convs[l].cache_from_output().expect("Model::split: a split layer keeps no aggregation");
        let mut tape = LayerTape {
            epoch,
            dropped_input: None,
            cache,
            norm_in: None,
            act: None,
            residual: false,
            hidden: false,
        };
        if !self.finishes(l) {
            return (z, tape);
        }
        let out = self.finish_hidden(b, g, l, z, x_own, train, epoch, true, &mut tape);
        (out, tape)
    }

    /// Backward of [`Model::split_forward`]: accumulates the bias (and SAGE root) gradients;
    /// returns `dh` (`g.cols` rows: the own rows for this partition, the halo rows for their
    /// owners) and, for SAGE when `need_dx`, the root term's gradient of `x_own`.
    #[allow(clippy::too_many_arguments)]
    pub fn split_backward(
        &mut self,
        b: &B,
        g: &Graph<B>,
        l: usize,
        x_own: Option<&B::Mat>,
        tape: LayerTape<B>,
        dy: &B::Mat,
        need_dx: bool,
    ) -> (B::Mat, Option<B::Mat>) {
        let LayerTape { epoch, norm_in, act, hidden, .. } = tape;
        let dz_owned = hidden.then(|| {
            let act = act.as_ref().expect("split_forward keeps the activation");
            self.hidden_grad(b, g, l, epoch, act, norm_in, dy)
        });
        let dz = dz_owned.as_ref().unwrap_or(dy);
        let a = self.split_adjacency(g);
        let mut dh = b.output(g.cols, self.dims[l + 1]);
        a.spmm(b, true, dz, 0.0, &mut dh);
        let SplitMaps { aggregated: lin, root } = self.split_maps_mut(l);
        if let Some(bias) = &mut lin.bias {
            b.col_sums(dz, 1.0, &mut bias.grad);
        }
        let dx_root = root.and_then(|r| r.backward(b, x_own.expect("SAGE's root term"), dz, need_dx));
        (dh, dx_root)
    }

    /// Backward of [`Model::split_transform`] for rows whose `dh` is complete: accumulates
    /// `dW += dhᵀ x`; returns `dx = dh W` when asked.
    pub fn split_transform_backward(
        &mut self,
        b: &B,
        l: usize,
        x: &B::Mat,
        dh: &B::Mat,
        need_dx: bool,
    ) -> Option<B::Mat> {
        let lin = self.split_maps_mut(l).aggregated;
        b.gemm(1.0, dh, true, x, false, 1.0, &mut lin.weight.grad);
        need_dx.then(|| {
            let mut dx = b.output(b.dims(dh).0, lin.in_dim(b));
            b.gemm(1.0, dh, false, &lin.weight.value, false, 0.0, &mut dx);
            dx
        })
    }
}
