//! The seam between the [`crate::Trainer`] and its modes: each mode's engine trains one epoch
//! and counts correct predictions; the trainer does the rest. (A leaf module: the engines in
//! `minibatch.rs`, `coop.rs` and `trainer/` implement it without depending on each other.)

use grinnder_nn::{Model, Optimizer};
use grinnder_tensor::Backend;

use crate::config::TrainError;
use crate::tiered::PhaseStats;

/// What a mode does for the [`crate::Trainer`]: one training epoch, and correct counts.
pub(crate) trait Engine<B: Backend> {
    /// Trains epoch `epoch` (zeroing gradients, stepping `opt` as the mode does); returns the
    /// training loss summed over the training nodes (over every rank) and the phase figures.
    fn train_epoch(
        &mut self,
        opt: &mut Optimizer,
        epoch: u64,
    ) -> Result<(f64, Option<PhaseStats>), TrainError>;
    /// Correct predictions on train, valid and test (summed over every rank) without dropout.
    fn correct(&mut self, epoch: u64) -> Result<[usize; 3], TrainError>;
    /// The model being trained (on every rank the same parameters).
    fn model(&mut self) -> &mut Model<B>;
}
