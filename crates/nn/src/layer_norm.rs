//! LayerNorm over the feature dimension: `y = (x - μ) / sqrt(σ² + eps) · γ + β` per row, with
//! biased variance and eps = 1e-5 (PyTorch's definition). Shapes: `x`, `y` `[n, d]`, `γ`, `β`
//! `[1, d]`. Per-node, so a partition computes exactly what the whole graph would.

use grinnder_tensor::Backend;

use crate::param::Param;

pub const EPS: f64 = 1e-5;

pub struct LayerNorm<B: Backend> {
    pub gamma: Param<B>,
    pub beta: Param<B>,
}

impl<B: Backend> LayerNorm<B> {
    pub fn init(b: &B, name: &str, dim: usize) -> Self {
        LayerNorm {
            gamma: Param::ones(b, format!("{name}.weight"), 1, dim).shaped(&[dim]),
            beta: Param::zeros(b, format!("{name}.bias"), 1, dim).shaped(&[dim]),
        }
    }

    /// Returns `y` and the per-row statistics backward needs.
    pub fn forward(&self, b: &B, x: &B::Mat) -> (B::Mat, B::Mat) {
        let (n, d) = b.dims(x);
        let (mut y, mut stats) = (b.output(n, d), b.output(n, 2));
        b.layer_norm(x, &self.gamma.value, &self.beta.value, EPS, &mut y, &mut stats);
        (y, stats)
    }

    pub fn backward(&mut self, b: &B, x: &B::Mat, stats: &B::Mat, dy: &B::Mat) -> B::Mat {
        let (n, d) = b.dims(x);
        let mut dx = b.output(n, d);
        b.layer_norm_backward(
            x,
            &self.gamma.value,
            stats,
            dy,
            &mut dx,
            &mut self.gamma.grad,
            &mut self.beta.grad,
        );
        dx
    }

    pub fn params_mut(&mut self) -> Vec<&mut Param<B>> {
        vec![&mut self.gamma, &mut self.beta]
    }
}
