//! One partition as the executor sees it.

use grinnder_nn::Graph;
use grinnder_tensor::Backend;

use super::input;

/// One partition as the executor sees it.
pub(super) struct Part<B: Backend> {
    pub(super) graph: Graph<B>,
    pub(super) own: usize,
    /// (source partition, its rows) for the halo columns, in column order.
    pub(super) fetch: Vec<(usize, Vec<u32>)>,
    pub(super) labels: Vec<i32>,
    /// Local rows of the train, valid and test nodes.
    pub(super) split_rows: [Vec<u32>; 3],
    /// The adjacency on the host until layer 0's `Â x` is built from it a piece at a time
    /// (where the plan asks for that: [`input`]).
    pub(super) input_adjacency: Option<input::HostAdjacency>,
}
