//! [`Model`]'s work counts ([`crate::work`]): each conv's figures with what a hidden layer adds
//! (LayerNorm, ReLU, dropout, the activation's copy), in the pieces the partitioned executor
//! runs.

use grinnder_tensor::Backend;

use super::Model;
use crate::memory::Shape;
use crate::work::{Passes, Work};

/// A split layer's phases ([`Model::split`]): the transform over own rows, the aggregation of
/// the transformed rows (forward), its backward, and the transform's backward.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SplitWork {
    pub transform: Work,
    pub aggregate: Work,
    pub aggregate_back: Work,
    pub transform_back: Work,
}

impl<B: Backend> Model<B> {
    /// Layer `l`'s conv on a partition of shape `s` (see [`Model::layer_held`]'s arguments).
    fn conv_work(&self, l: usize, s: Shape, pre: bool, need_dx: bool) -> Passes {
        let (i, o) = (self.dims[l] as u64, self.dims[l + 1] as u64);
        self.convs[l].work(s, i, o, pre, need_dx)
    }

    /// What a hidden layer adds over its `rows × o` output: LayerNorm, ReLU, dropout and the
    /// activation's copy forward, their gradients backward.
    fn hidden_work(&self, l: usize, rows: u64) -> Passes {
        let out = rows * self.dims[l + 1] as u64;
        let norm = if self.norms.get(l).is_some() { 4 * out } else { 0 };
        let dropout = if self.config.dropout > 0.0 { 2 * out } else { 0 };
        Passes {
            forward: Work::elementwise(norm + 4 * out + dropout),
            backward: Work::elementwise(2 * norm + 3 * out + dropout),
        }
    }

    /// Layer `l`'s forward and backward on a partition of shape `s` (`with_pre`: on its
    /// precomputed aggregation), for a layer that does not run split.
    pub fn layer_work(&self, l: usize, s: Shape, with_pre: bool) -> Passes {
        let input_dropout = l == 0 && self.config.input_dropout > 0.0;
        let conv = self.conv_work(l, s, with_pre && !input_dropout, l > 0);
        let dropped = if input_dropout { 2 * s.cols * self.dims[0] as u64 } else { 0 };
        let extra = if self.finishes(l) {
            self.hidden_work(l, s.rows)
        } else {
            // the loss: softmax and its gradient over the logits
            Passes {
                forward: Work::default(),
                backward: Work::elementwise(4 * s.rows * self.dims[l + 1] as u64),
            }
        };
        Passes {
            forward: conv.forward.and(extra.forward).and(Work::elementwise(dropped)),
            backward: conv.backward.and(extra.backward),
        }
    }

    /// Split layer `l`'s phases ([`Model::split`]) on a partition of shape `s`: the products
    /// over own rows, the sparse products over the transformed rows, SAGE's root term.
    pub fn split_work(&self, l: usize, s: Shape) -> SplitWork {
        let (i, o) = (self.dims[l] as u64, self.dims[l + 1] as u64);
        let need_dx = l > 0;
        let root = self.split_reads_own_input(l);
        let root_fwd = if root { Work::gemm(s.rows, i, o) } else { Work::default() };
        let root_back = match (root, need_dx) {
            (false, _) => Work::default(),
            (true, false) => Work::gemm(o, s.rows, i),
            (true, true) => Work::gemm(o, s.rows, i).and(Work::gemm(s.rows, o, i)),
        };
        let extra = if self.finishes(l) {
            self.hidden_work(l, s.rows)
        } else {
            Passes { forward: Work::default(), backward: Work::elementwise(4 * s.rows * o) }
        };
        SplitWork {
            transform: Work::gemm(s.rows, i, o),
            aggregate: Work::spmm(s.nnz, o, false)
                .and(root_fwd)
                .and(Work::elementwise(2 * s.rows * o))
                .and(extra.forward),
            aggregate_back: Work::spmm(s.nnz, o, true).and(root_back).and(extra.backward),
            transform_back: Work::gemm(o, s.rows, i).and(if need_dx {
                Work::gemm(s.rows, o, i)
            } else {
                Work::default()
            }),
        }
    }
}
