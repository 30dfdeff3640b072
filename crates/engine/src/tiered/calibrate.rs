//! The cost model's compute, measured: one partition's computations of a training pass's
//! own steps run on the backend as the executor runs them (the same calls, on the partition's
//! own graph), with inputs of the right shapes in place of gathered blocks, each timed
//! between synchronisations so that making its inputs does not count (the schedule's
//! computations are not written here a second time). Counting operations alone fell 30–34 %
//! short on an H200 (products-like GCN-256, 2026-12-04: 0.043 s predicted against
//! 0.061–0.065 s), where kernel choices, launches and the element-wise kernels' real speed are
//! not in the rates.

use grinnder_tensor::{Backend, Mat, Scalar};

use super::executor::Executor;

/// A `rows × w` input of the backend, its values a ramp (timings need no particular values).
fn ramp<B: Backend>(b: &B, rows: usize, w: usize) -> B::Mat {
    let v = (0..rows * w).map(|i| B::T::of((i % 97) as f64 * 0.01 - 0.4)).collect();
    b.upload(&Mat::from_vec(rows, w, v))
}

impl<B: Backend> Executor<'_, B> {
    /// Seconds of partition `q`'s training compute in one epoch (see the module): its steps of
    /// a training pass ([`Executor::forward_steps`], [`Executor::backward_steps`]), each
    /// computation as the executor runs it, on inputs of the right shapes. Gradients
    /// accumulate into the model's (the next pass zeroes them first).
    pub(super) fn time_compute(&mut self, q: usize) -> f64 {
        let mut steps = self.forward_steps(self.model.layers(), true);
        steps.extend(self.backward_steps());
        let b = self.b;
        self.time_steps(&steps, q, &|rows, w| ramp(b, rows, w))
    }
}
