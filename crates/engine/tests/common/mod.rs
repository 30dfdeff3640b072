//! Helpers the engine's test files share.

use grinnder_engine::{EpochMetrics, Mode, Summary, TrainConfig, TrainError, Trainer};
use grinnder_graph::Dataset;
use grinnder_tensor::Backend;

/// Trains `cfg` in `mode` to the end (the [`Trainer`]'s loop), `on_epoch` seeing each epoch.
pub fn fit<'a, B: Backend>(
    b: &'a B,
    ds: &'a Dataset,
    cfg: &TrainConfig,
    mode: Mode<'a, B>,
    on_epoch: &mut dyn FnMut(&EpochMetrics),
) -> Result<Summary, TrainError> {
    Trainer::new(b, ds, cfg.clone(), mode)?.fit(on_epoch)
}
