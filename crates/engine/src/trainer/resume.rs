//! Checkpoints of a [`super::Trainer`]: written after due epochs, read to resume. Over several
//! ranks (whose parameters are identical) rank 0 writes them and reads the one to resume from,
//! and every rank learns its outcome, so a failure on rank 0 stops every rank at the same step.

use grinnder_dist::Comm;
use grinnder_graph::Dataset;
use grinnder_nn::{Model, Optimizer};
use grinnder_tensor::Backend;

use crate::checkpoint::{self, Checkpoint, CheckpointConfig, CheckpointError};
use crate::config::{TrainConfig, TrainError};
use crate::model_file::Tensor;

/// Where and how often a run checkpoints, and what every checkpoint of it carries.
pub(super) struct Checkpoints {
    cfg: CheckpointConfig,
    /// The training configuration and the dataset's fingerprint (checked on resume).
    config: serde_json::Value,
    dataset: String,
}

/// A run's progress as a checkpoint records it.
pub(super) struct State<'s> {
    pub epoch: usize,
    pub best: Option<(usize, f64, f64)>,
    pub times: &'s [f64],
    pub last_loss: f64,
    pub best_params: Option<&'s [Tensor]>,
}

/// (epochs done, best, epoch times, last loss, the best epoch's parameters) of a resumed run.
pub(super) type Resumed = (usize, Option<(usize, f64, f64)>, Vec<f64>, f64, Option<Vec<Tensor>>);

fn ck_err(e: CheckpointError) -> TrainError {
    TrainError::Checkpoint(e.to_string())
}

/// Whether this process writes and reads the checkpoints.
fn lead(group: Option<&dyn Comm>) -> bool {
    group.is_none_or(|g| g.rank() == 0)
}

impl Checkpoints {
    pub(super) fn new(cfg: &CheckpointConfig, train: &TrainConfig, ds: &Dataset) -> Checkpoints {
        Checkpoints {
            cfg: cfg.clone(),
            config: serde_json::to_value(train).expect("a training configuration serialises"),
            dataset: checkpoint::dataset_fingerprint(ds),
        }
    }

    /// Checkpoint every this many epochs.
    pub(super) fn every(&self) -> usize {
        self.cfg.every.max(1)
    }

    /// Restores the newest valid checkpoint into `model` and `opt`, if there is one.
    pub(super) fn resume<B: Backend>(
        &self,
        b: &B,
        model: &mut Model<B>,
        opt: &mut Optimizer,
        group: Option<&dyn Comm>,
        epochs: usize,
    ) -> Result<Option<Resumed>, TrainError> {
        let values: usize = checkpoint::capture_state(b, model, opt).0.iter().map(|p| p.value.len()).sum();
        let max_bytes = checkpoint::max_bytes(values, epochs);
        let found = match group.filter(|g| g.size() > 1) {
            None => checkpoint::latest(&self.cfg.dir, max_bytes).map_err(ck_err)?,
            Some(g) => {
                // rank 0 reads; every rank gets its reading (or its error)
                let mine = if lead(group) {
                    let r = checkpoint::latest(&self.cfg.dir, max_bytes).map_err(|e| e.to_string());
                    serde_json::to_vec(&r).expect("a checkpoint serialises")
                } else {
                    Vec::new()
                };
                let all = g.all_gather(&mine);
                let r: Result<Option<(std::path::PathBuf, Checkpoint)>, String> =
                    serde_json::from_slice(&all[0]).expect("rank 0's checkpoint deserialises");
                r.map_err(TrainError::Checkpoint)?
            }
        };
        let Some((path, ck)) = found else {
            tracing::info!("no checkpoint in {} yet: starting from the beginning", self.cfg.dir.display());
            return Ok(None);
        };
        checkpoint::check_compatible(&path, &ck, &self.config, &self.dataset).map_err(ck_err)?;
        checkpoint::restore_state(b, model, opt, &ck.params, ck.optimizer_steps)
            .map_err(|e| TrainError::Checkpoint(format!("{}: {e}", path.display())))?;
        tracing::info!("resuming from {} (epoch {} done)", path.display(), ck.epoch);
        if lead(group) {
            if let Err(e) = checkpoint::prune(&self.cfg, ck.epoch) {
                tracing::warn!("could not remove older checkpoints: {e}");
            }
        }
        Ok(Some((ck.epoch, ck.best, ck.epoch_times, ck.last_loss, ck.best_params)))
    }

    /// Writes the checkpoint of `state` (rank 0), every rank learning the outcome.
    pub(super) fn save<B: Backend>(
        &self,
        b: &B,
        model: &mut Model<B>,
        opt: &Optimizer,
        group: Option<&dyn Comm>,
        state: &State<'_>,
    ) -> Result<(), TrainError> {
        let saved = if lead(group) {
            let (params, optimizer_steps) = checkpoint::capture_state(b, model, opt);
            let ck = Checkpoint {
                epoch: state.epoch,
                config: self.config.clone(),
                dataset: self.dataset.clone(),
                optimizer_steps,
                params,
                best: state.best,
                epoch_times: state.times.to_vec(),
                last_loss: state.last_loss,
                best_params: state.best_params.map(<[Tensor]>::to_vec),
            };
            checkpoint::save(&self.cfg, &ck).map(|_| ()).map_err(|e| e.to_string())
        } else {
            Ok(())
        };
        // a rank 0 that failed alone would leave the others waiting in the next exchanges
        match group.filter(|g| g.size() > 1) {
            None => saved.map_err(TrainError::Checkpoint),
            Some(g) => {
                let mine = saved.err().unwrap_or_default();
                let all = g.all_gather(mine.as_bytes());
                if all[0].is_empty() {
                    Ok(())
                } else {
                    Err(TrainError::Checkpoint(String::from_utf8_lossy(&all[0]).into_owned()))
                }
            }
        }
    }
}
