//! How many elements a layer's training pass holds on the backend at once on one partition:
//! the working set a memory plan reserves beside its blocks (on a GPU every allocation is
//! checked against the budget, so the figure must not fall short). Each conv states its own
//! figures in its file ([`Held`]); `Model::layer_held`, `Model::split_held` and
//! `Model::fused_held` (in `model/held.rs`) compose them in the order the partitioned
//! executor runs a layer, with what a hidden layer adds (its activation, LayerNorm, residual,
//! dropout copies). The counts follow the code: a matrix counts from its allocation to its
//! drop.

/// A partition's sizes: output (own) rows, input rows (own, then halo) and adjacency entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    pub rows: u64,
    pub cols: u64,
    pub nnz: u64,
}

impl Shape {
    /// `rows` own input rows copied out of `cols` (none when the input is only the own rows).
    pub(crate) fn own_copy(&self, width: u64) -> u64 {
        if self.cols == self.rows {
            0
        } else {
            self.rows * width
        }
    }
}

/// Elements a conv holds, its input and its output's gradient not counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Held {
    /// Forward's peak, its output included.
    pub forward: u64,
    /// What forward keeps for backward besides its output.
    pub kept: u64,
    /// Backward's peak, what forward kept included (backward drops it as it goes) and the
    /// input gradient when asked for.
    pub backward: u64,
}
