//! The seam between the [`crate::Trainer`] and its modes: each mode's engine trains one epoch
//! and counts correct predictions; the trainer does the rest. (A leaf module: the engines in
//! `minibatch.rs`, `coop.rs` and `trainer/` implement it without depending on each other.)

use grinnder_nn::{Model, Optimizer};
use grinnder_tensor::{Backend, Mat};

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
    /// The output of layer `upto - 1` without dropout (`upto = layers`: the logits) for this
    /// rank's nodes, in pieces: `emit(ids, rows)`, row i being node `ids[i]` of the dataset.
    /// Where the mode can, the output layer skips pieces without a node `wanted` accepts.
    fn predict(
        &mut self,
        upto: usize,
        wanted: &dyn Fn(u32) -> bool,
        emit: &mut crate::tiered::Emit<'_>,
    ) -> Result<Option<PhaseStats>, TrainError>;
    /// The mode's predicted training epoch ([`crate::tiered::Executor::predict_epoch`]), where
    /// it has a cost model.
    fn predict_epoch(&mut self, _rates: Option<&crate::tiered::Rates>) -> Option<crate::tiered::Prediction> {
        None
    }
}

/// Hands `m` (row i: node `first + i`) to `emit` in pieces of at most [`PIECE_ROWS`] rows.
pub(crate) fn emit_in_pieces<T: grinnder_tensor::Scalar>(
    m: &Mat<T>,
    first: u32,
    emit: &mut crate::tiered::Emit<'_>,
) -> Result<(), TrainError> {
    let w = m.cols;
    for start in (0..m.rows).step_by(PIECE_ROWS) {
        let n = PIECE_ROWS.min(m.rows - start);
        let ids: Vec<u32> = (first + start as u32..first + (start + n) as u32).collect();
        let piece = &m.data[start * w..(start + n) * w];
        match bytemuck::try_cast_slice::<T, f32>(piece) {
            Ok(rows) => emit(&ids, rows, w)?,
            Err(_) => emit(&ids, &piece.iter().map(|x| x.f64() as f32).collect::<Vec<f32>>(), w)?,
        }
    }
    Ok(())
}

/// Rows handed on at a time by a mode that holds its whole output.
pub(crate) const PIECE_ROWS: usize = 1 << 16;
