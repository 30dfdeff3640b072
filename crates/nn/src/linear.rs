//! Linear: `y = x Wᵀ + b`, with `x` `[n, in]`, `W` `[out, in]`, `b` `[1, out]`, `y` `[n, out]`.

use grinnder_tensor::Backend;

use crate::param::Param;

pub struct Linear<B: Backend> {
    pub weight: Param<B>,
    pub bias: Option<Param<B>>,
}

impl<B: Backend> Linear<B> {
    /// Glorot-initialised weight, zero bias when `bias`.
    pub fn init(b: &B, name: &str, in_dim: usize, out_dim: usize, bias: bool, seed: u64) -> Self {
        Linear {
            weight: Param::glorot(b, format!("{name}.weight"), out_dim, in_dim, seed),
            bias: bias.then(|| Param::zeros(b, format!("{name}.bias"), 1, out_dim).shaped(&[out_dim])),
        }
    }

    pub fn out_dim(&self, b: &B) -> usize {
        b.dims(&self.weight.value).0
    }

    pub fn in_dim(&self, b: &B) -> usize {
        b.dims(&self.weight.value).1
    }

    /// `y = x Wᵀ + b`, accumulated into `y` when `beta = 1`.
    pub fn forward_into(&self, b: &B, x: &B::Mat, beta: f64, y: &mut B::Mat) {
        b.gemm(1.0, x, false, &self.weight.value, true, beta, y);
        if let Some(bias) = &self.bias {
            b.add_row(&bias.value, y);
        }
    }

    pub fn forward(&self, b: &B, x: &B::Mat) -> B::Mat {
        let mut y = b.output(b.dims(x).0, self.out_dim(b));
        self.forward_into(b, x, 0.0, &mut y);
        y
    }

    /// Accumulates `dW += dyᵀ x`, `db += Σ_rows dy`; returns `dx = dy W` when asked.
    pub fn backward(&mut self, b: &B, x: &B::Mat, dy: &B::Mat, need_dx: bool) -> Option<B::Mat> {
        b.gemm(1.0, dy, true, x, false, 1.0, &mut self.weight.grad);
        if let Some(bias) = &mut self.bias {
            b.col_sums(dy, 1.0, &mut bias.grad);
        }
        need_dx.then(|| {
            let mut dx = b.output(b.dims(dy).0, self.in_dim(b));
            b.gemm(1.0, dy, false, &self.weight.value, false, 0.0, &mut dx);
            dx
        })
    }

    pub fn params_mut(&mut self) -> Vec<&mut Param<B>> {
        let mut v = vec![&mut self.weight];
        v.extend(self.bias.as_mut());
        v
    }
}
