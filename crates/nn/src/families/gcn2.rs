//! GCN2Conv (Chen et al., "Simple and Deep Graph Convolutional Networks": GCNII), as PyG's
//! `GCN2Conv` with shared weights, self loops and the symmetric normalisation:
//! `s = (1 − α) Â x + α x₀` (initial residual) and `y = (1 − β) s + β s W` (identity mapping),
//! `β = ln(θ / l + 1)` for layer `l` (1-based, as PyG's `layer`). Shapes: `x` `[cols, C]` (own
//! rows first), `x₀` `[rows, C]` (the initial representation of the output rows), `W`
//! `[C, C]` applied as `s W` (PyG's `weight1`, not transposed), `y` `[rows, C]`.
//!
//! The layer reads two inputs, its predecessor's output and `x₀`, so it does not fit the conv
//! stack ([`crate::conv::Conv`] takes one): the GCNII model (PyG's example: `Linear → ReLU →
//! L × (GCN2Conv → ReLU) → Linear`, with `x₀` a block the tiered executor places) is the next
//! step; this is its layer, checked against PyG's.

use grinnder_tensor::{Backend, Binary, Unary};

use crate::aggregation::Aggregation;
use crate::graph::Graph;
use crate::param::Param;

pub struct Gcn2Conv<B: Backend> {
    /// `W`, applied as `s W` (PyG's `weight1`).
    pub weight: Param<B>,
    pub alpha: f64,
    pub beta: f64,
}

/// What backward needs: `s`, the layer's input to the identity mapping.
pub struct Gcn2Cache<B: Backend> {
    s: B::Mat,
}

impl<B: Backend> Gcn2Conv<B> {
    /// Layer `layer` (1-based, as PyG's) of `channels` with `α` and `θ`; its weight is named
    /// `{name}.weight1` (PyG's, shared weights).
    pub fn init(b: &B, name: &str, channels: usize, alpha: f64, theta: f64, layer: usize, seed: u64) -> Self {
        assert!(layer >= 1, "GCN2Conv's layer index is 1-based, as PyG's");
        Gcn2Conv {
            weight: Param::glorot(b, format!("{name}.weight1"), channels, channels, seed),
            alpha,
            beta: (theta / layer as f64 + 1.0).ln(),
        }
    }

    /// `g.rows` output rows from `x` (the columns' rows) and `x0` (the output rows').
    pub fn forward(&self, b: &B, g: &Graph<B>, x: &B::Mat, x0: &B::Mat) -> (B::Mat, Gcn2Cache<B>) {
        let c = b.dims(x).1;
        let a = g.adjacency(Aggregation::GcnNorm);
        let mut s = b.output(g.rows, c);
        a.spmm(b, false, x, 0.0, &mut s);
        b.unary(Unary::Scale(1.0 - self.alpha), &mut s);
        let mut initial = b.output(g.rows, c);
        b.copy(x0, &mut initial);
        b.unary(Unary::Scale(self.alpha), &mut initial);
        b.binary(Binary::Add, &initial, &mut s);
        drop(initial);
        let mut y = b.output(g.rows, c);
        b.copy(&s, &mut y);
        b.gemm(self.beta, &s, false, &self.weight.value, false, 1.0 - self.beta, &mut y);
        (y, Gcn2Cache { s })
    }

    /// Accumulates `W`'s gradient; returns the gradients of `x` (`g.cols` rows, when
    /// `need_dx`) and of `x0`.
    pub fn backward(
        &mut self,
        b: &B,
        g: &Graph<B>,
        cache: Gcn2Cache<B>,
        dy: &B::Mat,
        need_dx: bool,
    ) -> (Option<B::Mat>, B::Mat) {
        let Gcn2Cache { s } = cache;
        let (rows, c) = b.dims(dy);
        b.gemm(self.beta, &s, true, dy, false, 1.0, &mut self.weight.grad);
        drop(s);
        let mut ds = b.output(rows, c);
        b.copy(dy, &mut ds);
        b.gemm(self.beta, dy, false, &self.weight.value, true, 1.0 - self.beta, &mut ds);
        let mut dx0 = b.output(rows, c);
        b.copy(&ds, &mut dx0);
        b.unary(Unary::Scale(self.alpha), &mut dx0);
        let dx = need_dx.then(|| {
            let mut dx = b.output(g.cols, c);
            g.adjacency(Aggregation::GcnNorm).spmm(b, true, &ds, 0.0, &mut dx);
            b.unary(Unary::Scale(1.0 - self.alpha), &mut dx);
            dx
        });
        (dx, dx0)
    }

    pub fn params_mut(&mut self) -> Vec<&mut Param<B>> {
        vec![&mut self.weight]
    }
}
