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

use crate::gat::{GatCache, GatConv};
use crate::gcn::{GcnCache, GcnConv};
use crate::graph::Graph;
use crate::layer_norm::LayerNorm;
use crate::param::Param;
use crate::sage::{SageCache, SageConv};

/// The convolution family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Gcn,
    Sage,
    Gat,
}

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
    pub seed: u64,
}

enum Conv<B: Backend> {
    Gcn(GcnConv<B>),
    Sage(SageConv<B>),
    Gat(GatConv<B>),
}

enum Cache<B: Backend> {
    Gcn(GcnCache<B>),
    Sage(SageCache<B>),
    Gat(GatCache<B>),
}

impl<B: Backend> Conv<B> {
    fn forward(
        &self,
        b: &B,
        g: &Graph<B>,
        x: &B::Mat,
        pre: Option<&B::Mat>,
        attn: Option<(MaskKey, f64)>,
    ) -> (B::Mat, Cache<B>) {
        match self {
            Conv::Gat(c) => {
                let (y, k) = c.forward(b, g, x, attn);
                (y, Cache::Gat(k))
            }
            Conv::Gcn(c) => {
                let (y, k) = c.forward(b, g, x, pre);
                (y, Cache::Gcn(k))
            }
            Conv::Sage(c) => {
                let (y, k) = c.forward(b, g, x, pre);
                (y, Cache::Sage(k))
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn backward(
        &mut self,
        b: &B,
        g: &Graph<B>,
        x: &B::Mat,
        pre: Option<&B::Mat>,
        cache: Cache<B>,
        dy: &B::Mat,
        attn: Option<(MaskKey, f64)>,
        need_dx: bool,
    ) -> Option<B::Mat> {
        match (self, cache) {
            (Conv::Gat(c), Cache::Gat(k)) => c.backward(b, g, x, k, dy, attn, need_dx),
            (Conv::Gcn(c), Cache::Gcn(k)) => c.backward(b, g, x, pre, k, dy, need_dx),
            (Conv::Sage(c), Cache::Sage(k)) => c.backward(b, g, x, pre, k, dy, need_dx),
            _ => unreachable!("a cache always comes from its own layer"),
        }
    }

    fn params_mut(&mut self) -> Vec<&mut Param<B>> {
        match self {
            Conv::Gcn(c) => c.params_mut(),
            Conv::Sage(c) => c.params_mut(),
            Conv::Gat(c) => c.params_mut(),
        }
    }
}

/// Everything backward needs from one forward pass.
pub struct Tape<B: Backend> {
    epoch: u64,
    /// `h_l` for every layer (`h_0` only when input dropout made a copy).
    inputs: Vec<Option<B::Mat>>,
    caches: Vec<Cache<B>>,
    /// pre-norm conv outputs and LayerNorm statistics, per hidden layer with a norm
    norm_in: Vec<Option<(B::Mat, B::Mat)>>,
    /// post-dropout activations of hidden layers (the ReLU/dropout gradient mask)
    act: Vec<Option<B::Mat>>,
}

/// A GNN with its parameters on backend `B`.
pub struct Model<B: Backend> {
    pub config: ModelConfig,
    convs: Vec<Conv<B>>,
    norms: Vec<LayerNorm<B>>,
    /// `Â x` for a fixed input, once [`Model::prepare`] ran.
    pre: Option<B::Mat>,
}

/// Dropout site numbers: hidden layer l uses site l; the input uses this one.
const INPUT_SITE: u64 = 1 << 20;
/// Attention dropout of layer l uses site `ATTN_SITE + l`.
const ATTN_SITE: u64 = 1 << 21;

impl<B: Backend> Model<B> {
    /// Initialises a model for `in_dim` input features and `classes` outputs.
    pub fn init(b: &B, config: ModelConfig, in_dim: usize, classes: usize) -> Self {
        assert!(config.layers >= 1, "a model has at least one layer");
        let heads = if config.kind == Kind::Gat { config.heads.max(1) } else { 1 };
        // widths between layers (a GAT hidden layer concatenates its heads)
        let dims: Vec<usize> = std::iter::once(in_dim)
            .chain(std::iter::repeat_n(config.hidden * heads, config.layers - 1))
            .chain([classes])
            .collect();
        let convs = (0..config.layers)
            .map(|l| {
                let name = format!("convs.{l}");
                let seed = config.seed.wrapping_add(l as u64);
                match config.kind {
                    Kind::Gcn => Conv::Gcn(GcnConv::init(b, &name, dims[l], dims[l + 1], seed)),
                    Kind::Sage => Conv::Sage(SageConv::init(b, &name, dims[l], dims[l + 1], seed)),
                    Kind::Gat if l + 1 < config.layers => {
                        Conv::Gat(GatConv::init(b, &name, dims[l], config.hidden, heads, true, seed))
                    }
                    Kind::Gat => Conv::Gat(GatConv::init(b, &name, dims[l], classes, 1, false, seed)),
                }
            })
            .collect();
        let norms = match config.norm {
            Norm::Layer => (0..config.layers - 1)
                .map(|l| LayerNorm::init(b, &format!("norms.{l}"), config.hidden * heads))
                .collect(),
            Norm::None => Vec::new(),
        };
        Model { config, convs, norms, pre: None }
    }

    /// Precomputes the first layer's aggregation of a fixed input (no input dropout).
    pub fn prepare(&mut self, b: &B, g: &Graph<B>, x: &B::Mat) {
        if self.config.input_dropout == 0.0 {
            self.pre = match self.config.kind {
                Kind::Gcn => Some(GcnConv::aggregate(b, g, x)),
                Kind::Sage => Some(SageConv::aggregate(b, g, x)),
                // attention depends on the parameters: nothing to precompute
                Kind::Gat => None,
            };
        }
    }

    /// Attention dropout of layer `l` in training.
    fn attn(&self, train: bool, epoch: u64, l: usize) -> Option<(MaskKey, f64)> {
        let key = MaskKey { seed: self.config.seed, epoch, site: ATTN_SITE + l as u64 };
        (train && self.config.attn_dropout > 0.0).then_some((key, self.config.attn_dropout))
    }

    pub fn params_mut(&mut self) -> Vec<&mut Param<B>> {
        let mut v: Vec<&mut Param<B>> = self.convs.iter_mut().flat_map(|c| c.params_mut()).collect();
        v.extend(self.norms.iter_mut().flat_map(|n| n.params_mut()));
        v
    }

    pub fn zero_grad(&mut self, b: &B) {
        for p in self.params_mut() {
            p.zero_grad(b);
        }
    }

    /// Forward pass; `train` applies dropout with masks keyed by `epoch`. Returns the logits
    /// and the tape for [`Model::backward`].
    pub fn forward(&self, b: &B, g: &Graph<B>, x: &B::Mat, train: bool, epoch: u64) -> (B::Mat, Tape<B>) {
        let key = |site| MaskKey { seed: self.config.seed, epoch, site };
        let layers = self.convs.len();
        let mut tape =
            Tape { epoch, inputs: Vec::new(), caches: Vec::new(), norm_in: Vec::new(), act: Vec::new() };
        let mut h: Option<B::Mat> = None; // None: the layer input is `x` itself
        if train && self.config.input_dropout > 0.0 {
            let (n, d) = b.dims(x);
            let mut x0 = b.zeros(n, d);
            b.copy(x, &mut x0);
            b.dropout(key(INPUT_SITE), self.config.input_dropout, 0, &mut x0);
            h = Some(x0);
        }
        for (l, conv) in self.convs.iter().enumerate() {
            let input = h.as_ref().unwrap_or(x);
            let pre = if l == 0 && h.is_none() { self.pre.as_ref() } else { None };
            let (mut z, cache) = conv.forward(b, g, input, pre, self.attn(train, epoch, l));
            tape.caches.push(cache);
            if l + 1 == layers {
                tape.inputs.push(h);
                return (z, tape);
            }
            let norm_in = self.norms.get(l).map(|ln| {
                let (y, stats) = ln.forward(b, &z);
                (std::mem::replace(&mut z, y), stats)
            });
            tape.norm_in.push(norm_in);
            b.unary(Unary::Relu, &mut z);
            if train && self.config.dropout > 0.0 {
                b.dropout(key(l as u64), self.config.dropout, 0, &mut z);
            }
            let residual = self.config.residual && b.dims(&z) == b.dims(input);
            let next = if residual {
                let (n, d) = b.dims(&z);
                let mut s = b.zeros(n, d);
                b.copy(&z, &mut s);
                b.binary(Binary::Add, input, &mut s);
                tape.act.push(Some(z));
                s
            } else {
                tape.act.push(None);
                z
            };
            tape.inputs.push(h.replace(next));
        }
        unreachable!("the last layer returns")
    }

    /// Backward from the logits' gradient: accumulates every parameter's gradient.
    pub fn backward(&mut self, b: &B, g: &Graph<B>, x: &B::Mat, tape: Tape<B>, dlogits: B::Mat) {
        let Tape { epoch, mut inputs, mut caches, mut norm_in, mut act } = tape;
        let key = |site| MaskKey { seed: self.config.seed, epoch, site };
        let layers = self.convs.len();
        let mut grad = dlogits;
        // the output of hidden layer l is the input of layer l + 1
        let mut outputs: Vec<Option<B::Mat>> = inputs.drain(1..).collect();
        // the residual share of dL/dh_l, added once conv_l's input gradient exists
        let mut pending: Option<B::Mat> = None;
        for l in (0..layers).rev() {
            let cache = caches.pop().expect("one cache per layer");
            let input_owned = if l == 0 { inputs.pop().flatten() } else { outputs.pop().flatten() };
            let input = input_owned.as_ref().unwrap_or(x);
            let pre = if l == 0 && input_owned.is_none() { self.pre.as_ref() } else { None };
            let need_dx = l > 0;
            let attn = self.attn(true, epoch, l);
            let dx = self.convs[l].backward(b, g, input, pre, cache, &grad, attn, need_dx);
            let Some(mut dx) = dx else { break };
            if let Some(r) = pending.take() {
                b.binary(Binary::Add, &r, &mut dx);
            }
            // through hidden layer l - 1's residual, dropout, ReLU and norm
            let h = l - 1;
            let residual_grad = act.pop().flatten().map(|a| {
                let (n, d) = b.dims(&dx);
                let mut r = b.zeros(n, d);
                b.copy(&dx, &mut r);
                (r, a)
            });
            let activation = match &residual_grad {
                Some((_, a)) => a,
                None => input,
            };
            if self.config.dropout > 0.0 {
                b.dropout(key(h as u64), self.config.dropout, 0, &mut dx);
            }
            b.binary(Binary::ReluGrad, activation, &mut dx);
            if let Some((z, stats)) = norm_in.pop().flatten() {
                dx = self.norms[h].backward(b, &z, &stats, &dx);
            }
            pending = residual_grad.map(|(r, _)| r);
            grad = dx;
            // keep `input` (h_l) alive until here: it was hidden layer l - 1's output
            drop(input_owned);
        }
    }
}
