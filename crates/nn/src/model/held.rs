//! [`Model`]'s working-set counts ([`crate::memory`]): each conv's figures composed in the
//! order the partitioned executor runs a layer.

use grinnder_tensor::Backend;

use super::Model;
use crate::memory::{Held, Shape};

impl<B: Backend> Model<B> {
    /// Layer `l`'s conv on a partition of shape `s`: `pre` when it reads its precomputed
    /// aggregation, `need_dx` when backward makes the input gradient.
    fn conv_held(&self, l: usize, s: Shape, pre: bool, need_dx: bool, train: bool) -> Held {
        let (i, o) = (self.dims[l] as u64, self.dims[l + 1] as u64);
        self.convs[l].held(s, i, o, pre, need_dx, self.own_drop(train, 0, l).is_some())
    }

    /// The most elements layer `l`'s training pass on a partition of shape `s` holds at once
    /// beyond its input rows (which the caller holds: `s.cols` rows, or with `with_pre` the
    /// precomputed aggregation's own rows): forward, then backward from a recomputed forward
    /// or, where [`Model::backward_from_output`], from the stored output. Not for layers that
    /// run split ([`Model::split_held`]).
    pub fn layer_held(&self, l: usize, s: Shape, with_pre: bool) -> u64 {
        let (i, o) = (self.dims[l] as u64, self.dims[l + 1] as u64);
        let out = s.rows * o;
        // input dropout works on a copy of the input, kept for backward
        let dropped = if l == 0 && self.config.input_dropout > 0.0 { s.cols * i } else { 0 };
        let pre = with_pre && dropped == 0;
        let conv = self.conv_held(l, s, pre, l > 0, true);
        if !self.finishes(l) {
            // the output layer: the loss's gradient beside the logits, then backward
            let after = conv.kept + 2 * out;
            return dropped + conv.forward.max(after).max(conv.backward + out);
        }
        if self.backward_from_output(l, pre) {
            // forward copies its activation; backward reads the stored output and its
            // gradient and makes the conv output's gradient
            return conv.forward.max(conv.kept + 2 * out).max(3 * out + conv.backward);
        }
        // LayerNorm keeps its input (and statistics, 2 per row) and makes a new output, and its
        // backward a new gradient; the activation is copied (a residual sum is new instead)
        let norm = if self.norms.get(l).is_some() { out + 2 * s.rows } else { 0 };
        // a residual sum copies the input's own rows first
        let residual = if self.config.residual && i == o { s.own_copy(i) } else { 0 };
        let made = conv.kept + norm + 2 * out + residual;
        let forward = conv.forward.max(made);
        // the output's gradient arrives beside the output; then the conv output's gradient
        let dy = made + out;
        let dz = conv.kept + norm + 3 * out + norm;
        let conv_back = norm + 3 * out + conv.backward;
        dropped + forward.max(dy).max(dz).max(conv_back)
    }

    /// The largest output of a sparse product in layer `l`'s training pass that adds to what
    /// the output holds (`beta ≠ 0`): SAGE's neighbour gradient added to the root term's (on
    /// the aggregated side), GIN's neighbour sum added to the scaled own rows. A backend that
    /// times its first product of a shape (CUDA: its kernel against cuSPARSE) holds a copy of
    /// that output meanwhile.
    pub fn accumulating_product(&self, l: usize, s: Shape, with_pre: bool) -> u64 {
        let (i, o) = (self.dims[l] as u64, self.dims[l + 1] as u64);
        let input_dropout = l == 0 && self.config.input_dropout > 0.0;
        let pre = with_pre && !input_dropout;
        self.convs[l].accumulating_product(s, i, o, l, pre)
    }

    /// The most elements split layer `l` ([`Model::split`]) holds at once on a partition of
    /// shape `s` in any of its phases, its inputs included: the transform over own rows, the
    /// aggregation of the transformed rows over the columns (forward, and again in backward with
    /// the gradients), and the transform's backward.
    pub fn split_held(&self, l: usize, s: Shape) -> u64 {
        let (i, o) = (self.dims[l] as u64, self.dims[l + 1] as u64);
        let (own_in, own_out, h) = (s.rows * i, s.rows * o, s.cols * o);
        let need_dx = l > 0;
        let hidden = self.finishes(l);
        // SAGE's root term reads the own input rows
        let root = if self.split_reads_own_input(l) { own_in } else { 0 };
        let norm = if hidden && self.norms.get(l).is_some() { own_out + 2 * s.rows } else { 0 };
        let transform = own_in + own_out;
        // aggregation forward: z (then LayerNorm's output and the activation's copy)
        let act = if hidden { own_out + norm } else { 0 };
        let aggregate = h + root + own_out + act;
        // backward: h goes after the forward; the output's gradient (the loss's at the top),
        // the conv output's gradient, dh over the columns, SAGE's root input gradient
        let dz = if hidden { own_out + norm } else { 0 };
        let dx_root = if need_dx { root } else { 0 };
        let backward = root + own_out + act + own_out + dz + h + dx_root;
        let transform_back = own_in + own_out + if need_dx { own_in } else { 0 };
        transform.max(aggregate).max(backward).max(transform_back)
    }

    /// The most elements the fused layers 0 and 1 ([`Model::split`] layer 1 with layer 0 run
    /// inside its transform on the precomputed aggregation) hold at once on a partition of
    /// shape `s`, beside their inputs: layer 0's output remade with its activation, layer 1's
    /// input gradient, then layer 0's backward.
    pub fn fused_held(&self, s: Shape) -> u64 {
        let d1 = self.dims[1] as u64;
        let conv = self.conv_held(0, s, true, false, true);
        let out = s.rows * d1;
        let norm = if self.norms.is_empty() { 0 } else { out + 2 * s.rows };
        // layer 0: conv output, norm, activation copy; then dx1 beside them; then layer 0's
        // backward on dx1: the conv output's gradient and the conv's backward
        let forward = conv.forward.max(conv.kept + norm + 2 * out);
        let dx1 = conv.kept + norm + 3 * out;
        let back = norm + 3 * out + norm + conv.backward;
        forward.max(dx1).max(back)
    }
}
