//! Layer-wise models whose layers the caller makes: a layer is a whole function from its input
//! rows and the partition's adjacency to its output rows (the Python package's
//! `grinnder.torch.LayerwiseModel`, GriNNder's `forward_layer`), its activation, norm and
//! dropout inside it. The model stacks them bare ([`Family::whole_layers`]); the layers
//! themselves come from [`crate::Model::from_layers`], never from a [`LayerSpec`].
//!
//! They run on the adjacency their caller chose, the whole graph's: by default
//! `Â = D̂^{-1/2} (A + I) D̂^{-1/2}`, as GriNNder gives its layers (SAGE's mean and GIN's sum
//! where asked); nothing is precomputed for them (the caller's parameters may act before any
//! aggregation).

use crate::aggregation::Aggregation;
use crate::conv::{Family, LayerSpec};
use crate::memory::{Held, Shape};
use crate::work::{Passes, Work};

/// The layer-wise family whose layers run on one aggregation's adjacency.
pub struct Layerwise(pub Aggregation);

/// The family of layers on `aggregation`'s adjacency.
pub fn on(aggregation: Aggregation) -> &'static Layerwise {
    static FAMILIES: [Layerwise; 3] =
        [Layerwise(Aggregation::GcnNorm), Layerwise(Aggregation::Mean), Layerwise(Aggregation::Sum)];
    FAMILIES.iter().find(|f| f.0 == aggregation).expect("one family per aggregation")
}

impl Family for Layerwise {
    fn name(&self) -> &'static str {
        "layerwise"
    }

    fn pyg_layer(&self) -> &'static str {
        "a layer-wise model's forward_layer"
    }

    fn aggregation(&self) -> Aggregation {
        self.0
    }

    fn precomputes_input(&self) -> bool {
        false
    }

    fn whole_layers(&self) -> bool {
        true
    }

    fn values(&self, _: &LayerSpec) -> u128 {
        // (the parameters are the caller's, in its own framework)
        0
    }

    fn first_map(&self, l: usize) -> String {
        format!("layers.{l}")
    }
}

/// What a caller's layer from `i` to `o` wide holds on a partition of shape `s`, as the memory
/// plan counts it: a guess, since the layer is opaque — its input gathered once more and its
/// output, in forward; in backward the input's gradient beside the recomputed forward.
pub fn held(s: Shape, i: u64, o: u64, need_dx: bool) -> Held {
    let forward = s.cols * i + s.rows * o;
    let dx = if need_dx { s.cols * i } else { 0 };
    Held { forward, kept: 0, backward: forward + dx }
}

/// Its work, counted as a GCN layer's would be (a product over the columns and one sparse
/// product), for the cost model.
pub fn work(s: Shape, i: u64, o: u64, need_dx: bool) -> Passes {
    let forward = Work::gemm(s.cols, i, o).and(Work::spmm(s.nnz, o, false));
    let dx = if need_dx { Work::gemm(s.cols, o, i) } else { Work::default() };
    Passes { forward: forward.clone(), backward: forward.and(Work::spmm(s.nnz, o, true)).and(dx) }
}
