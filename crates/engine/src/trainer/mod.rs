//! The one front door: a [`Trainer`] built from a dataset, a [`TrainConfig`] and a [`Mode`]
//! trains an epoch at a time, evaluates on demand, and saves and resumes checkpoints. Full
//! graph in memory, the tiered executor, mini-batches, partition-parallel ranks, preloaded
//! server shares and cooperative batches are modes of it; each mode is an `Engine` that
//! knows how to train one epoch and count correct predictions, and everything around that
//! (the epoch counter, the best validation epoch, checkpoints, the figures) lives here once.
//!
//! ```no_run
//! # use grinnder_engine::{Trainer, Mode, TrainConfig};
//! # fn f(ds: &grinnder_graph::Dataset, cfg: TrainConfig) -> Result<(), grinnder_engine::TrainError> {
//! let b = grinnder_tensor::Cpu::<f32>::new();
//! let mut t = Trainer::new(&b, ds, cfg, Mode::FullGraph)?;
//! while !t.done() {
//!     let m = t.train_epoch()?;
//!     println!("epoch {} loss {:.4}", m.epoch, m.loss);
//! }
//! println!("test accuracy {:.2} %", 100.0 * t.summary().test_acc);
//! # Ok(()) }
//! ```

mod full_graph;
mod partitioned;
mod resume;

use std::time::Instant;

use grinnder_dist::{Comm, Groups};
use grinnder_graph::Dataset;
use grinnder_nn::{Model, Optimizer};
use grinnder_tensor::Backend;
use serde::Serialize;

use crate::checkpoint::CheckpointConfig;
use crate::config::{check_dataset, TrainConfig, TrainError};
use crate::features::{shift_of, FeatureSource};
use crate::inference::{Finisher, Output, Positions, Prediction, Request, RowSink};
use crate::metrics::{EpochMetrics, Summary};
use crate::minibatch::MiniBatchConfig;
pub(crate) use crate::mode::Engine;
use crate::model_file::{capture_tensors, Arch, ModelFile, Tensor};
use crate::preload::{DeviceGroups, Expansion};
use crate::process::peak_rss_bytes;
use crate::tiered::TieredConfig;

/// How a [`Trainer`] computes an epoch.
pub enum Mode<'a, B: Backend> {
    /// Every node and edge at once in the backend's memory: the reference the others are
    /// checked against.
    FullGraph,
    /// Layer by layer, partition by partition, over the tiered store (GPU, host, storage).
    Tiered(TieredConfig),
    /// Sampled mini-batches; evaluation is the exact full-graph forward. `features`: where a
    /// batch's input rows come from (`None`: gathered from the host's features).
    MiniBatch { config: MiniBatchConfig, features: Option<&'a dyn FeatureSource<B>> },
    /// Partition-parallel over `groups`' ranks (`tiered.parts` partitions over all of them);
    /// with an `expansion` other than [`Expansion::Plain`], each server trains on its share of
    /// the graph. `device`: halo rows and gradient sums between the backend's matrices (NCCL).
    Ranks {
        tiered: TieredConfig,
        groups: &'a Groups,
        device: Option<&'a DeviceGroups<B>>,
        expansion: Expansion,
    },
    /// Cooperative mini-batches: each server samples a batch, its ranks split it.
    Cooperative { config: MiniBatchConfig, groups: &'a Groups, features: Option<&'a dyn FeatureSource<B>> },
}

/// Accuracies of one evaluation.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct EvalMetrics {
    /// The epoch whose parameters were evaluated (the last one trained).
    pub epoch: usize,
    pub train_acc: f64,
    pub valid_acc: f64,
    pub test_acc: f64,
    pub eval_s: f64,
}

/// Trains a model on a dataset in one of the [`Mode`]s; see the module docs.
pub struct Trainer<'a, B: Backend> {
    b: &'a B,
    ds: &'a Dataset,
    cfg: TrainConfig,
    engine: Box<dyn Engine<B> + 'a>,
    opt: Optimizer,
    /// The ranks whose parameters are identical (rank 0 writes the checkpoints).
    group: Option<&'a dyn Comm>,
    ckpt: Option<resume::Checkpoints>,
    /// Epochs trained so far.
    epoch: usize,
    /// (epoch, valid accuracy, test accuracy) of the best validation so far.
    best: Option<(usize, f64, f64)>,
    times: Vec<f64>,
    last_loss: f64,
    /// The parameters of the best validation epoch (PyG's names), kept as it is reached.
    best_state: Option<Vec<Tensor>>,
    /// Set up from a model file to predict ([`Trainer::for_model`]): the plan keeps no room
    /// for gradients, so training is refused.
    predicts_only: bool,
}

/// Which parameters a model file gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Weights {
    /// Those of the epoch with the best validation accuracy (the epoch whose test accuracy
    /// the summary reports); the last ones where nothing was evaluated.
    BestValid,
    /// Those after the last epoch trained.
    Last,
}

impl<'a, B: Backend> Trainer<'a, B> {
    /// Validates `ds` and sets `mode` up (partitioning, plans, blocks: the setup a mode needs).
    pub fn new(b: &'a B, ds: &'a Dataset, cfg: TrainConfig, mode: Mode<'a, B>) -> Result<Self, TrainError> {
        check_dataset(ds)?;
        if ds.splits.valid.is_empty() && cfg.patience.is_some() {
            return Err(TrainError::Config(
                "--patience stops on the validation accuracy, and the dataset has no validation split: give one (valid_idx, or PyG's val_mask) or drop --patience".into(),
            ));
        }
        if ds.splits.valid.is_empty() {
            tracing::warn!(
                "no validation split: the accuracy reported and the model saved are the last epoch's \
                 (give one, valid_idx or PyG's val_mask, to keep the epoch of best validation accuracy)"
            );
        }
        Self::set_up(b, ds, cfg, mode)
    }

    /// A trainer holding `file`'s model, to predict with ([`Trainer::predict`]) on `ds`: the
    /// training graph or another with the same feature width (the next snapshot, a subgraph,
    /// a held-out graph). `ds` needs no labels or splits, but its class count must be the
    /// model's (0 for a graph without labels is refused: set it to the model's).
    pub fn for_model(
        b: &'a B,
        ds: &'a Dataset,
        file: &ModelFile,
        mode: Mode<'a, B>,
    ) -> Result<Self, TrainError> {
        let path = file.path.clone().unwrap_or_default();
        file.arch.check_dataset(ds, &path)?;
        file.arch.check_graph(ds, &path)?;
        if ds.num_classes as usize != file.arch.classes {
            return Err(TrainError::Config(format!(
                "the dataset declares {} classes and the model predicts {}: give the dataset the model's class count",
                ds.num_classes, file.arch.classes
            )));
        }
        // a prediction makes no gradient: the partitioned executor plans its forward alone
        let mode = match mode {
            Mode::Tiered(tc) => Mode::Tiered(TieredConfig { inference: true, ..tc }),
            Mode::Ranks { tiered, groups, device, expansion } => {
                Mode::Ranks { tiered: TieredConfig { inference: true, ..tiered }, groups, device, expansion }
            }
            m => m,
        };
        let mut t = Self::set_up(b, ds, file.arch.inference_config(), mode)?;
        t.predicts_only = true;
        t.load_weights(file)?;
        Ok(t)
    }

    fn set_up(b: &'a B, ds: &'a Dataset, cfg: TrainConfig, mode: Mode<'a, B>) -> Result<Self, TrainError> {
        let elem = std::mem::size_of::<B::T>() as u64;
        crate::budgets::check_model(&cfg.model, ds.features.dim, ds.num_classes as usize, elem)?;
        let whole_graph = match &mode {
            Mode::FullGraph | Mode::Tiered(_) => true,
            Mode::Ranks { expansion, .. } => *expansion == Expansion::Plain,
            Mode::MiniBatch { .. } | Mode::Cooperative { .. } => false,
        };
        crate::config::check_edge_weights(ds, cfg.model.kind, whole_graph)?;
        match &mode {
            Mode::FullGraph | Mode::Tiered(_) | Mode::Ranks { .. } | Mode::MiniBatch { .. } => {}
            Mode::Cooperative { .. } => crate::config::check_initial(cfg.model.kind, "ranks' mini-batches")?,
        }
        let (engine, group): (Box<dyn Engine<B> + 'a>, Option<&'a dyn Comm>) = match mode {
            Mode::FullGraph => (Box::new(full_graph::FullGraph::new(b, ds, &cfg)), None),
            Mode::Tiered(tc) => (Box::new(partitioned::Partitioned::one_process(b, ds, &cfg, &tc)?), None),
            Mode::MiniBatch { config, features } => {
                (Box::new(crate::minibatch::MiniBatches::new(b, ds, &cfg, config, features)?), None)
            }
            Mode::Ranks { tiered, groups, device, expansion } => (
                Box::new(partitioned::Partitioned::ranks(b, ds, &cfg, &tiered, groups, device, expansion)?),
                Some(groups.global.as_ref()),
            ),
            Mode::Cooperative { config, groups, features } => (
                Box::new(crate::coop::Cooperative::new(b, ds, &cfg, config, groups, features)?),
                Some(groups.global.as_ref()),
            ),
        };
        let opt = Optimizer::new(cfg.optim);
        Ok(Trainer {
            b,
            ds,
            cfg,
            engine,
            opt,
            group,
            ckpt: None,
            epoch: 0,
            best: None,
            times: Vec::new(),
            last_loss: f64::NAN,
            best_state: None,
            predicts_only: false,
        })
    }

    /// Writes checkpoints to `ckpt.dir` every `ckpt.every` epochs (and after the last); with
    /// `ckpt.resume`, continues from the newest valid one there, if any.
    pub fn with_checkpoints(mut self, ckpt: &CheckpointConfig) -> Result<Self, TrainError> {
        let c = resume::Checkpoints::new(ckpt, &self.cfg, self.ds);
        if ckpt.resume {
            if let Some(state) =
                c.resume(self.b, self.engine.model(), &mut self.opt, self.group, self.cfg.epochs)?
            {
                (self.epoch, self.best, self.times, self.last_loss, self.best_state) = state;
            }
        }
        self.ckpt = Some(c);
        Ok(self)
    }

    /// Epochs trained so far (with a resumed checkpoint's).
    pub fn epochs_done(&self) -> usize {
        self.epoch
    }

    /// Whether the configured number of epochs is trained, or training stopped early
    /// ([`Trainer::stopped_early`]).
    pub fn done(&self) -> bool {
        self.epoch >= self.cfg.epochs || self.stopped_early()
    }

    /// Whether `patience` epochs passed since the best validation accuracy (early stopping),
    /// counted from the evaluations so far (so a resumed run stops where the first would have).
    pub fn stopped_early(&self) -> bool {
        match (self.cfg.patience, self.best) {
            (Some(p), Some((best, _, _))) => self.epoch >= best + 1 + p,
            _ => false,
        }
    }

    pub fn config(&self) -> &TrainConfig {
        &self.cfg
    }

    /// The model with its current parameters.
    pub fn model(&mut self) -> &mut Model<B> {
        self.engine.model()
    }

    /// The tiered executor's predicted training epoch (its cost model: traffic and arithmetic,
    /// with `rates` the seconds); `None` for the other modes and for ranks.
    pub fn predicted_epoch(
        &mut self,
        rates: Option<&crate::tiered::Rates>,
    ) -> Option<crate::tiered::Prediction> {
        self.engine.predict_epoch(rates)
    }

    /// Trains the next epoch; evaluates where `eval_every` says (and after the last epoch), and
    /// writes a checkpoint where one is due. Every rank of a partition-parallel run calls it.
    pub fn train_epoch(&mut self) -> Result<EpochMetrics, TrainError> {
        if self.predicts_only {
            return Err(TrainError::Config(
                "this trainer was set up from a model file to predict (grinnder predict, \
                 Trainer.load): its plan keeps no room for gradients; train with a trainer set up \
                 for training"
                    .into(),
            ));
        }
        let epoch = self.epoch;
        let _span = tracing::debug_span!("epoch", epoch).entered();
        let t = Instant::now();
        let lr = self.cfg.lr_schedule.lr(self.cfg.optim.lr(), epoch);
        self.opt.lr = Some(lr);
        let (loss_sum, tier) = self.engine.train_epoch(&mut self.opt, epoch as u64)?;
        let epoch_s = t.elapsed().as_secs_f64();
        self.epoch += 1;
        self.times.push(epoch_s);
        self.last_loss = loss_sum / self.ds.splits.train.len() as f64;
        if !self.last_loss.is_finite() {
            // every later epoch would train on NaN weights: stop here, saying what to change
            return Err(TrainError::Diverged(format!(
                "the training loss is {} after epoch {epoch}: training diverged ({}); a smaller learning rate (--lr) usually helps",
                self.last_loss, self.cfg.optim
            )));
        }
        let mut m = EpochMetrics {
            epoch,
            loss: self.last_loss,
            train_acc: None,
            valid_acc: None,
            test_acc: None,
            lr,
            epoch_s,
            eval_s: None,
            peak_host_bytes: peak_rss_bytes(),
            peak_device_bytes: self.peak_device_bytes(),
            tier,
        };
        let every = self.cfg.eval_every;
        if every > 0 && (self.epoch % every == 0 || self.done()) {
            let e = self.evaluate()?;
            (m.train_acc, m.valid_acc, m.test_acc, m.eval_s) =
                (Some(e.train_acc), Some(e.valid_acc), Some(e.test_acc), Some(e.eval_s));
            m.peak_host_bytes = peak_rss_bytes();
            m.peak_device_bytes = self.peak_device_bytes();
        }
        if self.stopped_early() {
            let best = self.best.map_or(0, |b| b.0);
            tracing::info!(
                "stopping early: no better validation accuracy in the {} epochs since epoch {best} (--patience)",
                self.epoch - best - 1
            );
        }
        let due = |c: &resume::Checkpoints| self.epoch % c.every() == 0 || self.done();
        if self.ckpt.as_ref().is_some_and(due) {
            self.save_checkpoint()?;
        }
        Ok(m)
    }

    /// Accuracies of the current parameters (no dropout); the best validation epoch so far is
    /// kept from them. Every rank calls it.
    pub fn evaluate(&mut self) -> Result<EvalMetrics, TrainError> {
        let t = Instant::now();
        let epoch = self.epoch.saturating_sub(1);
        let correct = self.engine.correct(epoch as u64)?;
        let acc = |k: usize| {
            let n = self.ds.splits.named()[k].1.len();
            if n == 0 {
                0.0
            } else {
                correct[k] as f64 / n as f64
            }
        };
        let m = EvalMetrics { epoch, train_acc: acc(0), valid_acc: acc(1), test_acc: acc(2), eval_s: 0.0 };
        if !self.selects_by_valid() {
            // nothing to select by: the last epoch is the one reported and saved
            self.best = Some((epoch, m.valid_acc, m.test_acc));
        } else if self.best.is_none_or(|(_, v, _)| m.valid_acc > v) {
            self.best = Some((epoch, m.valid_acc, m.test_acc));
            self.best_state = Some(capture_tensors(self.b, self.engine.model()));
        }
        Ok(EvalMetrics { eval_s: t.elapsed().as_secs_f64(), ..m })
    }

    /// Writes a checkpoint of the epochs trained so far (rank 0 writes; every rank learns the
    /// outcome). Refused without [`Trainer::with_checkpoints`].
    pub fn save_checkpoint(&mut self) -> Result<(), TrainError> {
        let Some(c) = &self.ckpt else {
            return Err(TrainError::Config("no checkpoint directory was given".into()));
        };
        let state = resume::State {
            epoch: self.epoch,
            best: self.best,
            times: &self.times,
            last_loss: self.last_loss,
            best_params: self.best_state.as_deref(),
        };
        c.save(self.b, self.engine.model(), &self.opt, self.group, &state)
    }

    /// Trains the remaining epochs, `on_epoch` seeing each one's figures; the summary after.
    pub fn fit(&mut self, on_epoch: &mut dyn FnMut(&EpochMetrics)) -> Result<Summary, TrainError> {
        while !self.done() {
            let m = self.train_epoch()?;
            on_epoch(&m);
        }
        Ok(self.summary())
    }

    /// Whether the dataset has a validation split to select the best epoch by; without one the
    /// last epoch is the one reported and saved.
    pub fn selects_by_valid(&self) -> bool {
        !self.ds.splits.valid.is_empty()
    }

    /// The run so far: the test accuracy at the best validation epoch (without a validation
    /// split, at the last epoch evaluated), the median epoch time.
    pub fn summary(&self) -> Summary {
        let (best_epoch, best_valid_acc, test_acc) = self.best.unwrap_or((0, 0.0, 0.0));
        let mut times = self.times.clone();
        times.sort_by(f64::total_cmp);
        Summary {
            epochs: self.epoch,
            best_epoch,
            best_valid_acc,
            test_acc,
            selected_by_valid: self.selects_by_valid(),
            stopped_early: self.stopped_early(),
            final_loss: self.last_loss,
            epoch_s_median: median(&times),
            peak_host_bytes: peak_rss_bytes(),
            peak_device_bytes: self.peak_device_bytes(),
            setup: Vec::new(),
        }
    }

    /// The model as a model file: `which` parameters, the architecture and the feature
    /// preprocessing with its statistic on this dataset.
    pub fn model_file(&mut self, which: Weights) -> ModelFile {
        let ds = self.ds;
        let shift = shift_of(ds, self.cfg.features());
        let arch = Arch::of(&self.cfg, ds, shift);
        if let (Weights::BestValid, Some(t), Some((epoch, valid, _))) = (which, &self.best_state, self.best) {
            let mut f = ModelFile::capture(self.b, self.engine.model(), arch, None);
            f.tensors = t.clone();
            f.tensors.sort_by(|a, b| a.name.cmp(&b.name));
            f.note = Some(format!("best validation accuracy {:.2} % (epoch {epoch})", valid * 100.0));
            return f;
        }
        let valid = if self.selects_by_valid() { "" } else { " (no validation split to select by)" };
        let note = format!("after epoch {}{valid}", self.epoch.saturating_sub(1));
        ModelFile::capture(self.b, self.engine.model(), arch, Some(note))
    }

    /// Writes [`Trainer::model_file`] to `path` (rank 0 writes; every rank learns the outcome);
    /// returns which parameters it holds.
    pub fn save_model(&mut self, path: &std::path::Path, which: Weights) -> Result<String, TrainError> {
        let f = self.model_file(which);
        let lead = self.group.is_none_or(|g| g.rank() == 0);
        let saved = if lead { f.save(path).map_err(|e| e.to_string()) } else { Ok(()) };
        let saved = match self.group.filter(|g| g.size() > 1) {
            None => saved,
            Some(g) => {
                let all = g.all_gather(saved.err().unwrap_or_default().as_bytes());
                if all[0].is_empty() {
                    Ok(())
                } else {
                    Err(String::from_utf8_lossy(&all[0]).into_owned())
                }
            }
        };
        saved.map_err(TrainError::Config)?;
        Ok(f.note.unwrap_or_default())
    }

    /// Sets the model's weights to `file`'s (fine-tuning, or a model trained elsewhere); every
    /// parameter must be in the file with the model's shape.
    pub fn load_weights(&mut self, file: &ModelFile) -> Result<(), TrainError> {
        let path = file.path.clone().unwrap_or_default();
        file.apply(self.b, self.engine.model(), &path)?;
        Ok(())
    }

    /// The model's output for the requested nodes (see [`crate::inference`]), into `sink`
    /// without ever holding all of it, computed as the mode trains: in memory, layer by layer
    /// and partition by partition under its budgets, or over its ranks (each rank writes the
    /// rows of its partitions; every rank calls this). No dropout.
    pub fn predict(&mut self, req: &Request, sink: &mut dyn RowSink) -> Result<Prediction, TrainError> {
        let layers = self.engine.model().layers();
        let upto = match req.output {
            Output::Embedding(l) if l + 1 >= layers => {
                return Err(TrainError::Config(format!(
                    "layer {l} is not a hidden layer: this model's are 0 to {} (its last layer's output is the logits)",
                    layers as i64 - 2
                )));
            }
            Output::Embedding(l) => l + 1,
            _ => layers,
        };
        let positions = Positions::new(req, self.ds)?;
        let t = Instant::now();
        let mut fin = Finisher {
            output: req.output,
            positions: &positions,
            labels: &self.ds.labels,
            sink,
            done: Prediction::default(),
        };
        let wanted = |v: u32| positions.at(v).is_some();
        let tier = self.engine.predict(upto, &wanted, &mut |ids, rows, w| fin.take(ids, rows, w))?;
        fin.sink.flush()?;
        let mut done = fin.done;
        done.tier = tier;
        done.compute_s = t.elapsed().as_secs_f64() - done.write_s;
        if let Some(g) = self.group.filter(|g| g.size() > 1) {
            // the same collective on every rank, whatever the output
            let mut c = [done.correct.unwrap_or_default().0, done.correct.unwrap_or_default().1];
            grinnder_dist::all_reduce_sum(g, &mut c);
            done.correct = done.correct.map(|_| (c[0], c[1]));
            g.barrier();
        }
        Ok(done)
    }

    /// Hidden layer `layer`'s output (0-based; after its norm, ReLU and residual) for `nodes`
    /// (`None`: every node): [`Trainer::predict`] with [`Output::Embedding`].
    pub fn embed(
        &mut self,
        layer: usize,
        nodes: Option<Vec<u32>>,
        sink: &mut dyn RowSink,
    ) -> Result<Prediction, TrainError> {
        self.predict(&Request { output: Output::Embedding(layer), nodes }, sink)
    }

    fn peak_device_bytes(&self) -> Option<u64> {
        self.b.device_memory().map(|m| m.peak)
    }
}

/// The median of sorted `v` (the mean of the middle two for an even count; 0 for none).
fn median(v: &[f64]) -> f64 {
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_median_of_an_even_count_is_the_mean_of_the_middle_two() {
        assert_eq!(super::median(&[]), 0.0);
        assert_eq!(super::median(&[1.0, 3.0]), 2.0);
        assert_eq!(super::median(&[1.0, 2.0, 9.0]), 2.0);
    }
}
