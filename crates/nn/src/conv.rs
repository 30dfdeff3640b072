//! The layer seam: what a convolution family states about itself, in its own file.
//!
//! A family ([`Family`]) answers before any parameter exists — its names on the command line
//! and in PyG's `state_dict`, what it aggregates over, whether it weighs the adjacency's
//! entries — and makes its layers ([`Conv`]), which answer for themselves: forward and
//! backward, their parameters, what they hold on a partition ([`Held`]) and the work they do
//! ([`Passes`]), and their capabilities (a precomputed aggregation of a fixed input, the split
//! form that transforms before it aggregates, a backward from the stored output). A model
//! stacks layers without asking their family; the registry ([`crate::families`]) is the one
//! place that lists the families.
//!
//! Adding a family: its file under `families/` (the conv, its `Held` and `Work` figures, its
//! `Family`), its module, one variant and two arms in [`crate::families`], and its tests,
//! fixtures and docs.

use std::any::Any;

use grinnder_tensor::{Backend, MaskKey};

use crate::aggregation::Aggregation;
use crate::graph::Graph;
use crate::linear::Linear;
use crate::memory::{Held, Shape};
use crate::param::Param;
use crate::work::Passes;

/// What a layer's backward needs from its forward, as the layer made it (each family has its
/// own; only the layer that made one reads it).
pub struct Cache(Box<dyn Any + Send + Sync>);

impl Cache {
    pub fn new<T: Any + Send + Sync>(t: T) -> Self {
        Cache(Box::new(t))
    }

    /// The layer's own cache back.
    pub fn take<T: Any>(self) -> T {
        *self.0.downcast::<T>().unwrap_or_else(|_| unreachable!("a cache always comes from its own layer"))
    }

    /// The layer's own cache, to read.
    pub fn get<T: Any>(&self) -> &T {
        self.0.downcast_ref::<T>().unwrap_or_else(|| unreachable!("a cache always comes from its own layer"))
    }
}

/// A split layer's linear maps ([`Conv::split_maps`]): the map applied before aggregating, and
/// a root map applied to the node's own input rows after (SAGE's `x_v W_rᵀ`).
pub struct SplitMaps<L> {
    pub aggregated: L,
    pub root: Option<L>,
}

/// What a family's layer `l` is made from: the model's shape and settings (a model's config
/// as its layers read it).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LayerSpec {
    /// The layer's place (its parameters are named `convs.{l}.…`) and the model's layers.
    pub l: usize,
    pub layers: usize,
    /// Widths of its input and output (a hidden layer's whole width, heads included).
    pub in_dim: usize,
    pub out_dim: usize,
    /// A hidden layer's width per head, and its heads.
    pub hidden: usize,
    pub heads: usize,
    /// GIN's ε and whether it is trained.
    pub gin_eps: f64,
    pub train_eps: bool,
    /// GCNII's α and θ.
    pub alpha: f64,
    pub theta: f64,
    /// The layer's seed (the model's, offset by `l`).
    pub seed: u64,
}

impl LayerSpec {
    /// Whether this is the output layer.
    pub fn last(&self) -> bool {
        self.l + 1 == self.layers
    }

    /// `convs.{l}`, the prefix of the layer's parameter names.
    pub fn name(&self) -> String {
        format!("convs.{}", self.l)
    }
}

/// What a layer reads beside its input rows, and the dropout it applies itself.
pub struct Side<'a, B: Backend> {
    /// The aggregation of a fixed input, where the caller precomputed it
    /// ([`Conv::aggregate_input`]).
    pub pre: Option<&'a B::Mat>,
    /// The model's initial representation `x₀` over the output rows, for a layer that reads
    /// it ([`Initial::Reads`]: GCNII).
    pub x0: Option<&'a B::Mat>,
    /// The dropout the layer applies inside itself in training, where it has one: attention
    /// dropout on the coefficients, or GCNII's dropout of its input
    /// ([`Family::drops_its_input`]).
    pub drop: Option<(MaskKey, f64)>,
}

impl<B: Backend> Clone for Side<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<B: Backend> Copy for Side<'_, B> {}

impl<B: Backend> Default for Side<'_, B> {
    fn default() -> Self {
        Side { pre: None, x0: None, drop: None }
    }
}

impl<'a, B: Backend> Side<'a, B> {
    /// Only the precomputed aggregation.
    pub fn pre(pre: Option<&'a B::Mat>) -> Self {
        Side { pre, ..Side::default() }
    }
}

/// A layer's part in the model's initial representation `x₀` (GCNII's initial residual).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Initial {
    /// It neither makes nor reads one.
    None,
    /// It makes `x₀` from its input ([`Conv::initial_of`]) and, in backward, takes the
    /// gradient the later layers summed into it.
    Makes,
    /// It reads `x₀`'s output rows ([`Side::x0`]) and adds to their gradient in backward.
    Reads,
}

/// A layer of a convolution family on backend `B`. `x` holds the layer's input rows (the
/// graph's columns, own rows first); `side` what it reads beside them.
pub trait Conv<B: Backend>: Send + Sync {
    /// `g.rows` output rows and what backward needs.
    fn forward(&self, b: &B, g: &Graph<B>, x: &B::Mat, side: Side<'_, B>) -> (B::Mat, Cache);

    /// Accumulates the parameters' gradients; returns the input's gradient (`g.cols` rows) when
    /// `need_dx`. `side` is what forward was given. `dx0` is the gradient of `x₀`'s output rows
    /// where the model has one: a layer that reads `x₀` adds its part, the layer that makes it
    /// takes the sum.
    #[allow(clippy::too_many_arguments)]
    fn backward(
        &mut self,
        b: &B,
        g: &Graph<B>,
        x: &B::Mat,
        side: Side<'_, B>,
        cache: Cache,
        dy: &B::Mat,
        need_dx: bool,
        dx0: Option<&mut B::Mat>,
    ) -> Option<B::Mat>;

    /// Its part in the model's initial representation.
    fn initial(&self) -> Initial {
        Initial::None
    }

    /// The initial representation's output rows, from the cache of a forward of the layer
    /// that makes it ([`Initial::Makes`]).
    fn initial_of(&self, b: &B, g: &Graph<B>, cache: &Cache) -> Option<B::Mat> {
        let _ = (b, g, cache);
        None
    }

    /// The trained parameters.
    fn params_mut(&mut self) -> Vec<&mut Param<B>>;

    /// Everything a model file holds of the layer, in PyG's names: the parameters, and what
    /// PyG keeps as buffers.
    fn state_mut(&mut self) -> Vec<&mut Param<B>> {
        self.params_mut()
    }

    /// The aggregation of a fixed input that forward and backward can take as `pre`; `None`
    /// where the layer aggregates nothing before its parameters act (attention).
    fn aggregate_input(&self, b: &B, g: &Graph<B>, x: &B::Mat) -> Option<B::Mat> {
        let _ = (b, g, x);
        None
    }

    /// Whether, given `pre`, the layer still reads its input rows (a root term, a sum with the
    /// own rows).
    fn reads_input_beside_pre(&self) -> bool {
        false
    }

    /// The split form, where the layer has one: `y = A (x Wᵀ) + b [+ x_own W_rᵀ]`, its maps
    /// (the aggregation is the family's, [`Family::aggregation`]).
    fn split_maps(&self) -> Option<SplitMaps<&Linear<B>>> {
        None
    }

    /// [`Conv::split_maps`], to accumulate their gradients.
    fn split_maps_mut(&mut self) -> Option<SplitMaps<&mut Linear<B>>> {
        None
    }

    /// The cache of a forward that kept nothing but its output, where backward can run from
    /// the layer's input and output alone (no aggregation kept: it used `pre`, or it
    /// transformed first); `None` where backward needs its own forward's figures.
    fn cache_from_output(&self) -> Option<Cache> {
        None
    }

    /// Elements held on a partition of shape `s` for a layer from `i` to `o` wide (`pre`: it
    /// reads the precomputed aggregation; `attn_dropout`: attention dropout is on).
    fn held(&self, s: Shape, i: u64, o: u64, pre: bool, need_dx: bool, attn_dropout: bool) -> Held;

    /// Work on a partition of shape `s` (see [`Conv::held`]).
    fn work(&self, s: Shape, i: u64, o: u64, pre: bool, need_dx: bool) -> Passes;

    /// The largest sparse product's output that adds to what it holds (`beta ≠ 0`) in layer
    /// `l`'s training pass ([`crate::Model::accumulating_product`]).
    fn accumulating_product(&self, s: Shape, i: u64, o: u64, l: usize, pre: bool) -> u64 {
        let _ = (s, i, o, l, pre);
        0
    }
}

/// A convolution family: what it is before any parameter exists.
pub trait Family: Sync {
    /// The name on the command line, in the Python package and in model files (`gcn`).
    fn name(&self) -> &'static str;

    /// Other names it answers to (any case).
    fn aliases(&self) -> &'static [&'static str] {
        &[]
    }

    /// PyG's layer (`GCNConv`), for messages.
    fn pyg_layer(&self) -> &'static str;

    /// The neighbourhood aggregation its layers run on (what graph the executor builds).
    fn aggregation(&self) -> Aggregation;

    /// Whether its layers multiply the adjacency's structure by values of their own
    /// (attention coefficients), which a transposed product reads through the structure's
    /// entry order; the others multiply by the adjacency's values alone, which may come
    /// factored ([`crate::graph::Values::Factored`]).
    fn weighs_entries(&self) -> bool {
        false
    }

    /// Whether its layer takes edge weights, as PyG's does.
    fn takes_edge_weight(&self) -> bool {
        false
    }

    /// Whether a hidden layer has attention heads (`--heads`).
    fn has_heads(&self) -> bool {
        false
    }

    /// Whether its layers apply the model's hidden dropout inside themselves (to the rows they
    /// aggregate and to what they feed a final map, as PyG's GCNII example does), so the model
    /// passes them the hidden rate as [`Side::drop`] where attention layers get the attention
    /// rate.
    fn drops_its_input(&self) -> bool {
        false
    }

    /// Whether its model has an initial representation its layers read ([`Initial`]: GCNII's
    /// `x₀`), which only the whole-model pass carries so far.
    fn has_initial(&self) -> bool {
        false
    }

    /// Whether its layers are whole layers, their activation, norm and dropout inside them
    /// (a caller's layer-wise model): the model then adds nothing between them.
    fn whole_layers(&self) -> bool {
        false
    }

    /// Whether a fixed input's first aggregation can be computed once (nothing trainable
    /// acts before the layer aggregates).
    fn precomputes_input(&self) -> bool {
        true
    }

    /// The values a model file holds of a layer `spec` describes (its parameters and buffers):
    /// what a model of a given shape must hold before any is allocated.
    fn values(&self, spec: &LayerSpec) -> u128;

    /// The tensor of layer `l` whose shape is `[output width, input width]`: its first
    /// linear map.
    fn first_map(&self, l: usize) -> String;

    /// The tensor of layer `l`, as the output layer, whose first dimension is the classes.
    fn output_map(&self, l: usize) -> String {
        self.first_map(l)
    }

    /// The tensors of layer 0 that a `state_dict` of this family holds, enough to tell it
    /// from every other family holding a subset of them ([`crate::Kind::recognise`] takes
    /// the family with the most, all present).
    fn markers(&self) -> Vec<String> {
        vec![self.first_map(0)]
    }

    /// The tensor whose second dimension is a layer's attention heads (`None`: no heads).
    fn heads_tensor(&self, l: usize) -> Option<String> {
        let _ = l;
        None
    }
}
