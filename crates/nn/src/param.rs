//! A trainable parameter: its value, its gradient accumulator and its optimizer state.

use grinnder_graph::rng::Stream;
use grinnder_tensor::{Backend, Mat, Scalar};

/// A parameter matrix with its gradient (accumulated by backward passes, zeroed by the trainer).
pub struct Param<B: Backend> {
    /// PyG's name for it (`convs.0.lin.weight`): the key in model files.
    pub name: String,
    /// PyG's shape for it (a bias is `[out]`, GAT's attention `[1, heads, out]`): the same
    /// values as `value` in row-major order, the shape a model file stores.
    pub shape: Vec<usize>,
    pub value: B::Mat,
    pub grad: B::Mat,
    /// Optimizer state (Adam's moments, SGD's momentum buffer), allocated on first use.
    pub state: Option<(B::Mat, B::Mat)>,
}

impl<B: Backend> Param<B> {
    /// A parameter with the given initial value.
    pub fn new(b: &B, name: impl Into<String>, value: &Mat<B::T>) -> Self {
        Param {
            name: name.into(),
            shape: vec![value.rows, value.cols],
            value: b.upload(value),
            grad: b.zeros(value.rows, value.cols),
            state: None,
        }
    }

    /// Glorot (Xavier) uniform initialisation of a `rows × cols` weight, as PyG initialises
    /// its layers: U(-a, a) with a = sqrt(6 / (rows + cols)), drawn from a keyed stream.
    pub fn glorot(b: &B, name: impl Into<String>, rows: usize, cols: usize, seed: u64) -> Self {
        let name = name.into();
        let a = (6.0 / (rows + cols) as f64).sqrt();
        let mut s =
            Stream::new(&[seed, name.bytes().fold(0u64, |h, c| h.wrapping_mul(131).wrapping_add(c as u64))]);
        let data = (0..rows * cols).map(|_| B::T::of((s.next_f64() * 2.0 - 1.0) * a)).collect();
        Param::new(b, name, &Mat::from_vec(rows, cols, data))
    }

    /// A zero-initialised parameter (biases).
    pub fn zeros(b: &B, name: impl Into<String>, rows: usize, cols: usize) -> Self {
        Param::new(b, name, &Mat::zeros(rows, cols))
    }

    /// A parameter filled with ones (LayerNorm scale).
    pub fn ones(b: &B, name: impl Into<String>, rows: usize, cols: usize) -> Self {
        Param::new(b, name, &Mat::from_vec(rows, cols, vec![B::T::of(1.0); rows * cols]))
    }

    /// The parameter with PyG's `shape` for it (same element count).
    pub fn shaped(mut self, shape: &[usize]) -> Self {
        assert_eq!(
            shape.iter().product::<usize>(),
            self.shape.iter().product::<usize>(),
            "{}: shape {shape:?} for {:?}",
            self.name,
            self.shape
        );
        self.shape = shape.to_vec();
        self
    }

    pub fn zero_grad(&mut self, b: &B) {
        let (r, c) = b.dims(&self.grad);
        self.grad = b.zeros(r, c);
    }
}
