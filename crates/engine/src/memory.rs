//! The in-memory full-graph trainer: every node, every edge, every epoch, on one backend.
//! Loss is the mean cross-entropy over the training nodes; accuracy comes from an evaluation
//! pass without dropout; the reported test accuracy is the one at the best validation epoch.

use std::time::Instant;

use grinnder_dist::Comm;
use grinnder_graph::{Dataset, NO_LABEL};
use grinnder_nn::{Graph, Model, ModelConfig, OptimConfig, Optimizer};
use grinnder_tensor::{Backend, Mat, Rows, Scalar};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::checkpoint::{self, CheckpointConfig, ParamState};
use crate::metrics::{peak_rss_bytes, EpochMetrics, Summary};
use crate::tiered::{DistConfig, Executor, PhaseStats, TieredConfig};

/// Everything the trainer needs, validated by the caller (the CLI).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainConfig {
    pub model: ModelConfig,
    pub optim: OptimConfig,
    pub epochs: usize,
    /// Evaluate every this many epochs and after the last; 0: never.
    pub eval_every: usize,
    pub feature_norm: FeatureNorm,
}

#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error("the {split} split contains node {node}, which has no label")]
    Unlabelled { split: &'static str, node: u32 },
    #[error("the training split is empty")]
    NoTrainingNodes,
    #[error("the dataset has no classes (no labelled node)")]
    NoClasses,
    #[error("partitioning failed: {0}")]
    Partition(String),
    #[error("storage tier: {0}")]
    Storage(String),
    #[error("checkpoint: {0}")]
    Checkpoint(String),
    #[error("memory: {0}")]
    Memory(String),
    #[error("{0}")]
    Config(String),
    #[error("the tiered executor stopped at an earlier error and cannot go on (start again): {0}")]
    Stopped(String),
}

/// The parts of a trainer a checkpoint saves and restores.
pub trait TrainerState {
    /// Parameters with optimizer state, and the optimizer's step count.
    fn capture(&mut self) -> (Vec<ParamState>, u64);
    fn restore(&mut self, params: &[ParamState], steps: u64) -> Result<(), String>;
    /// Peak bytes of the backend's own (GPU) memory so far; `None` for host-memory backends.
    fn peak_device_bytes(&self) -> Option<u64> {
        None
    }
}

/// A model and its optimizer behind `RefCell`s (shared with the epoch closures).
pub(crate) struct Cells<'a, B: Backend> {
    pub b: &'a B,
    pub model: &'a std::cell::RefCell<Model<B>>,
    pub opt: &'a std::cell::RefCell<Optimizer>,
}

impl<B: Backend> TrainerState for Cells<'_, B> {
    fn peak_device_bytes(&self) -> Option<u64> {
        self.b.device_memory().map(|m| m.peak)
    }

    fn capture(&mut self) -> (Vec<ParamState>, u64) {
        checkpoint::capture_state(self.b, &mut self.model.borrow_mut(), &self.opt.borrow())
    }
    fn restore(&mut self, params: &[ParamState], steps: u64) -> Result<(), String> {
        checkpoint::restore_state(
            self.b,
            &mut self.model.borrow_mut(),
            &mut self.opt.borrow_mut(),
            params,
            steps,
        )
    }
}

/// Preprocessing of the input features.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FeatureNorm {
    /// As stored.
    None,
    /// PyG's `NormalizeFeatures`: shift by the global minimum, divide every row by its sum
    /// (sums below 1 count as 1), as Kipf & Welling preprocess bag-of-words features.
    Row,
}

/// Host features, preprocessed, as a backend matrix: on a device in chunks of
/// [`FEATURE_CHUNK_BYTES`] (see [`features_in_chunks`]).
pub fn features<B: Backend>(b: &B, ds: &Dataset, norm: FeatureNorm) -> B::Mat {
    features_in_chunks(b, ds, norm, b.device_memory().map(|_| FEATURE_CHUNK_BYTES))
}

/// Bytes of preprocessed feature rows that go to a device at a time.
const FEATURE_CHUNK_BYTES: usize = 256 << 20;

/// [`features`], `chunk` bytes of rows at a time where given (each chunk preprocessed,
/// uploaded and copied into place: on a device the host never holds a preprocessed copy of the
/// whole table beside the dataset's — igb-medium-like: 41 GB); `None`: the whole table, made on
/// the host and moved (on the CPU it is the result itself).
pub fn features_in_chunks<B: Backend>(
    b: &B,
    ds: &Dataset,
    norm: FeatureNorm,
    chunk: Option<usize>,
) -> B::Mat {
    let (n, d) = (ds.num_nodes(), ds.features.dim);
    let host = crate::minibatch::HostFeatures::new(ds, norm);
    let Some(chunk) = chunk.filter(|_| n > 0 && d > 0) else {
        let mut m = Mat::zeros(n, d);
        host.write_rows(None, &mut m.data);
        return b.upload_owned(m);
    };
    let per = (chunk / (d * std::mem::size_of::<B::T>())).clamp(1, n);
    let mut out = b.output(n, d);
    for start in (0..n).step_by(per) {
        let k = per.min(n - start);
        let ids: Vec<u32> = (start as u32..(start + k) as u32).collect();
        let mut m = Mat::zeros(k, d);
        host.write_rows(Some(&ids), &mut m.data);
        let piece = b.upload_owned(m);
        b.gather_rows(&piece, Rows::Range(0, k), &mut out, start);
    }
    out
}

/// What [`FeatureNorm::Row`] shifts every value by: the global minimum (0 for `None`).
pub fn feature_shift(ds: &Dataset, norm: FeatureNorm) -> f64 {
    match norm {
        FeatureNorm::None => 0.0,
        FeatureNorm::Row => ds.features.data.par_iter().copied().reduce(|| f32::INFINITY, f32::min) as f64,
    }
}

/// One feature row preprocessed (`shift` from [`feature_shift`]).
pub fn normalized<T: Scalar>(r: &[f32], norm: FeatureNorm, shift: f64) -> impl Iterator<Item = T> + '_ {
    let sum = match norm {
        FeatureNorm::None => 1.0,
        FeatureNorm::Row => r.iter().map(|&v| v as f64 - shift).sum::<f64>().max(1.0),
    };
    let shift = if norm == FeatureNorm::Row { shift } else { 0.0 };
    r.iter().map(move |&v| T::of((v as f64 - shift) / sum))
}

/// Refuses datasets the trainers cannot train on, with the reason.
pub fn check_dataset(ds: &Dataset) -> Result<(), TrainError> {
    for (split, ids) in ds.splits.named() {
        if let Some(&node) = ids.iter().find(|&&v| ds.labels[v as usize] == NO_LABEL) {
            return Err(TrainError::Unlabelled { split, node });
        }
    }
    if ds.splits.train.is_empty() {
        return Err(TrainError::NoTrainingNodes);
    }
    if ds.num_classes == 0 {
        return Err(TrainError::NoClasses);
    }
    Ok(())
}

/// The epoch loop both trainers share: `step` trains one epoch and returns the summed training
/// loss (and the executor's phase figures); `eval` returns correct counts on train, valid and
/// test. `on_epoch` sees every epoch (accuracies on evaluated ones). Keeps the test accuracy at
/// the best validation epoch. Over several ranks (`group`, whose parameters are identical),
/// rank 0 writes the checkpoints and reads the one to resume from, which every rank restores.
#[allow(clippy::too_many_arguments)]
pub fn run_epochs(
    ds: &Dataset,
    cfg: &TrainConfig,
    ckpt: Option<&CheckpointConfig>,
    group: Option<&dyn Comm>,
    state: &mut dyn TrainerState,
    on_epoch: &mut dyn FnMut(&EpochMetrics),
    step: &mut dyn FnMut(u64) -> Result<(f64, Option<PhaseStats>), TrainError>,
    eval: &mut dyn FnMut(u64) -> Result<[usize; 3], TrainError>,
) -> Result<Summary, TrainError> {
    let n_train = ds.splits.train.len() as f64;
    let mut best: Option<(usize, f64, f64)> = None;
    let mut times = Vec::with_capacity(cfg.epochs);
    let mut last_loss = f64::NAN;
    let mut last: Option<EpochMetrics> = None;
    let ck_err = |e: checkpoint::CheckpointError| TrainError::Checkpoint(e.to_string());
    let base = CheckpointBase {
        config: serde_json::to_value(cfg).expect("a training configuration serialises"),
        dataset: if ckpt.is_some() { checkpoint::dataset_fingerprint(ds) } else { String::new() },
    };
    let mut first = 0;
    let lead = group.is_none_or(|g| g.rank() == 0);
    if let Some(c) = ckpt.filter(|c| c.resume) {
        let values: usize = state.capture().0.iter().map(|p| p.value.len()).sum();
        let max_bytes = checkpoint::max_bytes(values, cfg.epochs);
        let found = match group.filter(|g| g.size() > 1) {
            None => checkpoint::latest(&c.dir, max_bytes).map_err(ck_err)?,
            Some(g) => {
                // rank 0 reads; every rank gets its reading (or its error)
                let mine = if lead {
                    let r = checkpoint::latest(&c.dir, max_bytes).map_err(|e| e.to_string());
                    serde_json::to_vec(&r).expect("a checkpoint serialises")
                } else {
                    Vec::new()
                };
                let all = g.all_gather(&mine);
                let r: Result<Option<(std::path::PathBuf, checkpoint::Checkpoint)>, String> =
                    serde_json::from_slice(&all[0]).expect("rank 0's checkpoint deserialises");
                r.map_err(TrainError::Checkpoint)?
            }
        };
        if let Some((path, ck)) = found {
            checkpoint::check_compatible(&path, &ck, &base.config, &base.dataset).map_err(ck_err)?;
            state
                .restore(&ck.params, ck.optimizer_steps)
                .map_err(|e| TrainError::Checkpoint(format!("{}: {e}", path.display())))?;
            tracing::info!("resuming from {} (epoch {} done)", path.display(), ck.epoch);
            (first, best, times, last_loss) = (ck.epoch, ck.best, ck.epoch_times, ck.last_loss);
        } else {
            tracing::info!("no checkpoint in {} yet: starting from the beginning", c.dir.display());
        }
    }
    for epoch in first..cfg.epochs {
        let _span = tracing::debug_span!("epoch", epoch).entered();
        let t = Instant::now();
        let (loss_sum, tier) = step(epoch as u64)?;
        let epoch_s = t.elapsed().as_secs_f64();
        times.push(epoch_s);
        last_loss = loss_sum / n_train;
        let mut m = EpochMetrics {
            epoch,
            loss: last_loss,
            train_acc: None,
            valid_acc: None,
            test_acc: None,
            epoch_s,
            eval_s: None,
            peak_host_bytes: peak_rss_bytes(),
            peak_device_bytes: state.peak_device_bytes(),
            tier,
        };
        if cfg.eval_every > 0 && ((epoch + 1) % cfg.eval_every == 0 || epoch + 1 == cfg.epochs) {
            let t = Instant::now();
            let correct = eval(epoch as u64)?;
            let acc = |k: usize| {
                let n = ds.splits.named()[k].1.len();
                if n == 0 {
                    0.0
                } else {
                    correct[k] as f64 / n as f64
                }
            };
            (m.train_acc, m.valid_acc, m.test_acc) = (Some(acc(0)), Some(acc(1)), Some(acc(2)));
            m.eval_s = Some(t.elapsed().as_secs_f64());
            m.peak_host_bytes = peak_rss_bytes();
            m.peak_device_bytes = state.peak_device_bytes();
            if best.is_none_or(|(_, v, _)| acc(1) > v) {
                best = Some((epoch, acc(1), acc(2)));
            }
        }
        on_epoch(&m);
        last = Some(m);
        let due = |c: &&CheckpointConfig| (epoch + 1) % c.every.max(1) == 0 || epoch + 1 == cfg.epochs;
        if let Some(c) = ckpt.filter(due) {
            let saved =
                if lead { save_checkpoint(c, state, &base, epoch, best, &times, last_loss) } else { Ok(()) };
            // over several ranks every rank learns rank 0's outcome (a rank 0 that failed alone
            // would leave the others waiting in the next epoch's exchanges)
            match group.filter(|g| g.size() > 1) {
                None => saved.map_err(TrainError::Checkpoint)?,
                Some(g) => {
                    let mine = if lead { saved.err().unwrap_or_default() } else { String::new() };
                    let all = g.all_gather(mine.as_bytes());
                    if !all[0].is_empty() {
                        return Err(TrainError::Checkpoint(String::from_utf8_lossy(&all[0]).into_owned()));
                    }
                }
            }
        }
    }
    let (best_epoch, best_valid_acc, test_acc) = best.unwrap_or((0, 0.0, 0.0));
    times.sort_by(f64::total_cmp);
    Ok(Summary {
        epochs: cfg.epochs,
        best_epoch,
        best_valid_acc,
        test_acc,
        final_loss: last.map_or(last_loss, |m| m.loss),
        epoch_s_median: times.get(times.len() / 2).copied().unwrap_or(0.0),
        peak_host_bytes: peak_rss_bytes(),
        peak_device_bytes: state.peak_device_bytes(),
    })
}

/// The configuration and dataset fingerprint every checkpoint of a run carries.
struct CheckpointBase {
    config: serde_json::Value,
    dataset: String,
}

/// Writes the checkpoint after `epoch`.
fn save_checkpoint(
    c: &CheckpointConfig,
    state: &mut dyn TrainerState,
    base: &CheckpointBase,
    epoch: usize,
    best: Option<(usize, f64, f64)>,
    times: &[f64],
    last_loss: f64,
) -> Result<(), String> {
    let (params, optimizer_steps) = state.capture();
    let ck = checkpoint::Checkpoint {
        epoch: epoch + 1,
        config: base.config.clone(),
        dataset: base.dataset.clone(),
        optimizer_steps,
        params,
        best,
        epoch_times: times.to_vec(),
        last_loss,
    };
    checkpoint::save(c, &ck).map_err(|e| e.to_string())?;
    Ok(())
}

/// Trains `cfg` on `ds`; `on_epoch` sees every epoch's figures as they are made.
pub fn train<B: Backend>(
    b: &B,
    ds: &Dataset,
    cfg: &TrainConfig,
    on_epoch: &mut dyn FnMut(&EpochMetrics),
) -> Result<Summary, TrainError> {
    train_with(b, ds, cfg, None, on_epoch)
}

/// [`train`] with checkpoints (and resuming) when `ckpt` is given.
pub fn train_with<B: Backend>(
    b: &B,
    ds: &Dataset,
    cfg: &TrainConfig,
    ckpt: Option<&CheckpointConfig>,
    on_epoch: &mut dyn FnMut(&EpochMetrics),
) -> Result<Summary, TrainError> {
    check_dataset(ds)?;
    let model =
        std::cell::RefCell::new(Model::init(b, cfg.model.clone(), ds.features.dim, ds.num_classes as usize));
    // only the adjacency the model's layers aggregate over
    let g = Graph::with(b, &ds.graph, &[model.borrow().aggregation()]);
    let x = features(b, ds, cfg.feature_norm);
    model.borrow_mut().prepare(b, &g, &x);
    // GCN's layer 0 reads only `Â x` from here: the features need not stay beside it
    let x = if model.borrow().reads_only_pre() {
        drop(x);
        b.zeros(0, ds.features.dim)
    } else {
        x
    };
    let opt = std::cell::RefCell::new(Optimizer::new(cfg.optim));
    let labels: &[i32] = &ds.labels;
    let train_ids: &[u32] = &ds.splits.train;
    let n_train = train_ids.len() as f64;
    let mut step = |epoch: u64| {
        let mut model = model.borrow_mut();
        model.zero_grad(b);
        let (logits, tape) = model.forward(b, &g, &x, true, epoch);
        let (rows, cols) = b.dims(&logits);
        let mut dlogits = b.zeros(rows, cols);
        let (loss_sum, _) = b.cross_entropy(&logits, labels, train_ids, 1.0 / n_train, &mut dlogits);
        drop(logits);
        model.backward(b, &g, &x, tape, dlogits);
        opt.borrow_mut().step(b, model.params_mut());
        b.synchronize();
        Ok((loss_sum, None))
    };
    let mut eval = |epoch: u64| {
        let (eval, _) = model.borrow().forward(b, &g, &x, false, epoch);
        Ok(ds.splits.named().map(|(_, ids)| b.count_correct(&eval, labels, ids)))
    };
    let mut state = Cells { b, model: &model, opt: &opt };
    run_epochs(ds, cfg, ckpt, None, &mut state, on_epoch, &mut step, &mut eval)
}

/// Trains `cfg` on `ds` with the layer-wise, partition-wise executor over the tiered store.
pub fn train_tiered<B: Backend>(
    b: &B,
    ds: &Dataset,
    cfg: &TrainConfig,
    tc: &TieredConfig,
    on_epoch: &mut dyn FnMut(&EpochMetrics),
) -> Result<Summary, TrainError> {
    train_tiered_with(b, ds, cfg, tc, None, on_epoch)
}

/// [`train_tiered`] with checkpoints (and resuming) when `ckpt` is given.
pub fn train_tiered_with<B: Backend>(
    b: &B,
    ds: &Dataset,
    cfg: &TrainConfig,
    tc: &TieredConfig,
    ckpt: Option<&CheckpointConfig>,
    on_epoch: &mut dyn FnMut(&EpochMetrics),
) -> Result<Summary, TrainError> {
    train_tiered_on(b, ds, ds, cfg, tc, None, ckpt, on_epoch)
}

/// [`train_tiered_with`] as one rank of a partition-parallel run (`dist`): each rank computes
/// its share of the partitions, halo rows and gradients cross ranks, parameter gradients, the
/// loss and the accuracy counts are summed over the ranks — every rank sees the figures of
/// the whole graph, the same as one process. The executor runs on `share`: `ds` itself, or a
/// server's share of it (see `DistConfig::subgraph`); the figures are `ds`'s.
#[allow(clippy::too_many_arguments)]
pub fn train_tiered_on<B: Backend>(
    b: &B,
    ds: &Dataset,
    share: &Dataset,
    cfg: &TrainConfig,
    tc: &TieredConfig,
    dist: Option<DistConfig<'_, B>>,
    ckpt: Option<&CheckpointConfig>,
    on_epoch: &mut dyn FnMut(&EpochMetrics),
) -> Result<Summary, TrainError> {
    let ex = std::cell::RefCell::new(Executor::new_dist(b, share, &cfg.model, cfg.feature_norm, tc, dist)?);
    {
        let e = ex.borrow();
        tracing::info!(
            "{} partitions; host cache {}, mode {:?}; blocks need {:.1} MiB; storage {}",
            tc.parts,
            e.plan
                .cache_bytes
                .map_or("unlimited".to_string(), |c| format!("{:.1} MiB", c as f64 / 1048576.0)),
            e.plan.mode,
            e.plan.block_bytes as f64 / 1048576.0,
            match e.store_direct_io() {
                None => "none",
                Some((true, true)) => "O_DIRECT through io_uring",
                Some((true, false)) => "O_DIRECT with pread/pwrite",
                Some((false, true)) => "buffered through io_uring",
                Some((false, false)) => "buffered pread/pwrite",
            }
        );
    }
    let opt = std::cell::RefCell::new(Optimizer::new(cfg.optim));
    let mut step = |epoch: u64| {
        let mut e = ex.borrow_mut();
        e.model.zero_grad(b);
        let (loss, _) = e.forward_backward(epoch)?;
        let mut loss = [loss];
        e.reduce(&mut loss);
        e.reduce_gradients();
        let loss = loss[0];
        opt.borrow_mut().step(b, e.model.params_mut());
        b.synchronize();
        Ok((loss, Some(e.take_stats())))
    };
    let mut eval = |epoch: u64| {
        let mut e = ex.borrow_mut();
        let mut c = e.evaluate(epoch)?.map(|n| n as u64);
        e.reduce(&mut c);
        Ok(c.map(|n| n as usize))
    };
    let mut state = ExecutorCells { b, ex: &ex, opt: &opt };
    let group = dist.map(|d| d.reduce.unwrap_or(d.comm));
    run_epochs(ds, cfg, ckpt, group, &mut state, on_epoch, &mut step, &mut eval)
}

/// The tiered executor's model and the optimizer, for checkpoints.
struct ExecutorCells<'a, 'b, B: Backend> {
    b: &'a B,
    ex: &'a std::cell::RefCell<Executor<'b, B>>,
    opt: &'a std::cell::RefCell<Optimizer>,
}

impl<B: Backend> TrainerState for ExecutorCells<'_, '_, B> {
    fn peak_device_bytes(&self) -> Option<u64> {
        self.b.device_memory().map(|m| m.peak)
    }

    fn capture(&mut self) -> (Vec<ParamState>, u64) {
        checkpoint::capture_state(self.b, &mut self.ex.borrow_mut().model, &self.opt.borrow())
    }
    fn restore(&mut self, params: &[ParamState], steps: u64) -> Result<(), String> {
        let model = &mut self.ex.borrow_mut().model;
        checkpoint::restore_state(self.b, model, &mut self.opt.borrow_mut(), params, steps)
    }
}
