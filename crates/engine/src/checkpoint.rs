//! Checkpoints: parameters, optimizer state, the epoch reached, the metrics needed to go on,
//! and fingerprints of the configuration and the dataset, so a killed run resumes where its
//! last checkpoint left it and ends with the same parameters bit for bit.
//!
//! File (`ckpt-epoch-NNNNNNNN.grnd-ckpt`): a first line `GRNDCKPT <version>`, one line of JSON,
//! and a last line `xxh3 <hex>` of the JSON bytes. Written to a new temporary under an
//! unpredictable name (`O_EXCL`: never through a link), synced, renamed into place, and the
//! directory synced: a crash leaves the previous checkpoint or the new one, never half of one;
//! a failed write removes its temporary. Values are stored as f64 (exact for f32) in JSON's
//! shortest round-trip form, so a checkpoint's size is bounded by its parameter count
//! ([`max_bytes`]) and reads beyond that bound are refused. The `keep` newest checkpoints up
//! to the one just written are kept (files of later epochs — left by another run, or damaged —
//! take no slot), and temporaries left by writers killed mid-write are removed at the next
//! save. Resuming from a directory whose every checkpoint is damaged is an error, not a fresh
//! start.
//!
//! Dropout masks are keyed by (seed, epoch, site, node, column), so the epoch is all the random
//! state there is.

use std::io::Write;
use std::path::{Path, PathBuf};

use grinnder_graph::buf::as_bytes;
use grinnder_graph::Dataset;
use grinnder_nn::{Model, Optimizer};
use grinnder_tensor::{Backend, Mat, Scalar};
use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::xxh3_64;

const MAGIC: &str = "GRNDCKPT";
const VERSION: u32 = 1;
const SUFFIX: &str = ".grnd-ckpt";

/// Where and how often to checkpoint, and whether to resume.
#[derive(Clone, Debug, PartialEq)]
pub struct CheckpointConfig {
    pub dir: PathBuf,
    /// Every this many epochs (and after the last).
    pub every: usize,
    /// Newest checkpoints kept.
    pub keep: usize,
    /// Continue from the newest valid checkpoint in `dir`.
    pub resume: bool,
}

/// One parameter and its optimizer state.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ParamState {
    pub name: String,
    pub rows: usize,
    pub cols: usize,
    pub value: Vec<f64>,
    pub state: Option<(Vec<f64>, Vec<f64>)>,
}

/// Everything a checkpoint holds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// Epochs completed.
    pub epoch: usize,
    /// The training configuration, for a field-by-field comparison on resume.
    pub config: serde_json::Value,
    /// Fingerprint of the dataset (see [`dataset_fingerprint`]).
    pub dataset: String,
    pub optimizer_steps: u64,
    pub params: Vec<ParamState>,
    /// (epoch, valid accuracy, test accuracy) of the best validation so far.
    pub best: Option<(usize, f64, f64)>,
    pub epoch_times: Vec<f64>,
    pub last_loss: f64,
    /// The parameters of the best validation epoch (what `--save-model` writes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub best_params: Option<Vec<crate::model_file::Tensor>>,
}

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("{path}: {reason}")]
    Invalid { path: PathBuf, reason: String },
    #[error(
        "checkpoint {path} was made for another run: {field} is {then} there, {now} here; to train \
         with these settings, give a new --checkpoint-dir (or remove the checkpoints in this one)"
    )]
    Mismatch { path: PathBuf, field: String, then: String, now: String },
    #[error(
        "checkpoint {path} was made for another dataset (fingerprint {then}, this one {now}); give \
         a new --checkpoint-dir (or remove the checkpoints in this one)"
    )]
    OtherDataset { path: PathBuf, then: String, now: String },
    #[error("checkpoint directory {dir}: {source}")]
    Io { dir: PathBuf, source: std::io::Error },
    #[error("writing checkpoint {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
    #[error(
        "every checkpoint in {dir} is damaged ({count} tried; the newest: {newest}); remove them \
         to start afresh, or drop --resume"
    )]
    AllDamaged { dir: PathBuf, count: usize, newest: String },
}

/// The largest checkpoint file of a model of `values` parameter values over `epochs` epochs:
/// each value, its two optimizer moments and its best-validation value as f64 text (at most 24
/// characters and a comma), one time per epoch, and a MiB for the rest.
pub fn max_bytes(values: usize, epochs: usize) -> u64 {
    100 * values as u64 + 32 * epochs as u64 + (1 << 20)
}

/// xxh3 over the graph structure, labels, splits, feature shape and the first and last MiB of
/// the features (hashing tens of GB of features at every start would cost more than it
/// protects).
pub fn dataset_fingerprint(ds: &Dataset) -> String {
    // the features' bytes as stored (for float32 the same bytes as their values')
    let f = ds.features.data.as_bytes();
    let edge = 1 << 20;
    let parts: Vec<u64> = vec![
        xxh3_64(as_bytes(ds.graph.row_ptr())),
        xxh3_64(as_bytes(ds.graph.col_idx())),
        xxh3_64(as_bytes(&ds.labels[..])),
        xxh3_64(as_bytes(&ds.splits.train[..])),
        xxh3_64(as_bytes(&ds.splits.valid[..])),
        xxh3_64(as_bytes(&ds.splits.test[..])),
        xxh3_64(&f[..f.len().min(edge)]),
        xxh3_64(&f[f.len().saturating_sub(edge)..]),
        ds.features.dim as u64,
        ds.num_classes as u64,
    ];
    // the hash read the whole structure: where it is a mapped file's, its pages go back (a
    // checkpointed run fingerprints after setup, whose plan no longer counts them)
    ds.graph.release_pages();
    // (an unweighted graph's fingerprint as before)
    let parts = match &ds.edge_weight {
        Some(w) => [parts, vec![xxh3_64(as_bytes(&w[..]))]].concat(),
        None => parts,
    };
    format!("{:016x}", xxh3_64(as_bytes(&parts)))
}

/// The model's parameters and the optimizer's state, as stored.
pub fn capture<B: Backend>(b: &B, model: &mut Model<B>) -> Vec<ParamState> {
    let to64 = |m: &Mat<B::T>| m.data.iter().map(|x| x.f64()).collect::<Vec<f64>>();
    model
        .params_mut()
        .into_iter()
        .map(|p| {
            let v = b.download(&p.value);
            ParamState {
                name: p.name.clone(),
                rows: v.rows,
                cols: v.cols,
                value: to64(&v),
                state: p.state.as_ref().map(|(s1, s2)| (to64(&b.download(s1)), to64(&b.download(s2)))),
            }
        })
        .collect()
}

/// Puts stored parameters and optimizer state back into `model`.
pub fn restore<B: Backend>(b: &B, model: &mut Model<B>, params: &[ParamState]) -> Result<(), String> {
    let mut mine = model.params_mut();
    if mine.len() != params.len() {
        return Err(format!("{} parameters stored, the model has {}", params.len(), mine.len()));
    }
    let mat = |rows, cols, v: &[f64]| Mat::from_vec(rows, cols, v.iter().map(|&x| B::T::of(x)).collect());
    for (p, s) in mine.iter_mut().zip(params) {
        let (r, c) = b.dims(&p.value);
        if p.name != s.name || (r, c) != (s.rows, s.cols) || s.value.len() != r * c {
            return Err(format!(
                "parameter {} ({r} × {c}) stored as {} ({} × {})",
                p.name, s.name, s.rows, s.cols
            ));
        }
        p.value = b.upload(&mat(r, c, &s.value));
        p.state = match &s.state {
            Some((s1, s2)) if s1.len() == r * c && s2.len() == r * c => {
                Some((b.upload(&mat(r, c, s1)), b.upload(&mat(r, c, s2))))
            }
            Some(_) => return Err(format!("optimizer state of {} has the wrong size", p.name)),
            None => None,
        };
    }
    Ok(())
}

/// [`capture`] with the optimizer's step count.
pub fn capture_state<B: Backend>(b: &B, model: &mut Model<B>, opt: &Optimizer) -> (Vec<ParamState>, u64) {
    (capture(b, model), opt.steps)
}

/// [`restore`] with the optimizer's step count.
pub fn restore_state<B: Backend>(
    b: &B,
    model: &mut Model<B>,
    opt: &mut Optimizer,
    params: &[ParamState],
    steps: u64,
) -> Result<(), String> {
    restore(b, model, params)?;
    opt.steps = steps;
    Ok(())
}

fn file_name(epoch: usize) -> String {
    format!("ckpt-epoch-{epoch:08}{SUFFIX}")
}

fn io_err(dir: &Path) -> impl Fn(std::io::Error) -> CheckpointError + '_ {
    move |source| CheckpointError::Io { dir: dir.to_path_buf(), source }
}

/// Writes `ck` atomically into `cfg.dir` and prunes older checkpoints beyond `cfg.keep`.
pub fn save(cfg: &CheckpointConfig, ck: &Checkpoint) -> Result<PathBuf, CheckpointError> {
    let dir = &cfg.dir;
    std::fs::create_dir_all(dir).map_err(io_err(dir))?;
    let json = serde_json::to_string(ck).expect("a checkpoint serialises");
    let body = format!("{MAGIC} {VERSION}\n{json}\nxxh3 {:016x}\n", xxh3_64(json.as_bytes()));
    let path = dir.join(file_name(ck.epoch));
    let write_err = |source| CheckpointError::Write { path: path.clone(), source };
    // removed on any failure below (dropped), renamed into place on success
    let mut tmp = grinnder_graph::io::files::temp_in(dir, &format!(".{}.tmp-", file_name(ck.epoch)))
        .map_err(write_err)?;
    let tmp_err = |source: std::io::Error, tmp: &Path| CheckpointError::Write {
        path: tmp.to_path_buf(),
        source: std::io::Error::new(source.kind(), format!("{source} (the temporary is removed)")),
    };
    tmp.write_all(body.as_bytes()).map_err(|e| tmp_err(e, tmp.path()))?;
    tmp.as_file().sync_all().map_err(|e| tmp_err(e, tmp.path()))?;
    tmp.persist(&path).map_err(write_err)?;
    std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(io_err(dir))?;
    prune(cfg, ck.epoch)?;
    Ok(path)
}

/// Removes the checkpoints of epochs up to `newest` beyond the `cfg.keep` newest of them, and
/// the temporaries of writers killed mid-write (one writer per directory at a time). [`save`]
/// prunes after each write; a resumed run prunes too, since a kill between a write and its
/// pruning leaves one checkpoint too many.
pub fn prune(cfg: &CheckpointConfig, newest: usize) -> Result<(), CheckpointError> {
    let dir = &cfg.dir;
    let mut all = list(dir).map_err(io_err(dir))?;
    all.retain(|e| e.0 <= newest);
    all.sort_by_key(|e| std::cmp::Reverse(e.0));
    for (_, old) in all.into_iter().skip(cfg.keep.max(1)) {
        let _ = std::fs::remove_file(old);
    }
    for e in std::fs::read_dir(dir).map_err(io_err(dir))?.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        if name.starts_with(".ckpt-epoch-") && name.contains(".tmp-") {
            let _ = std::fs::remove_file(e.path());
        }
    }
    Ok(())
}

/// Checkpoint files in `dir` with their epochs.
fn list(dir: &Path) -> std::io::Result<Vec<(usize, PathBuf)>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let p = e?.path();
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if let Some(epoch) = name.strip_prefix("ckpt-epoch-").and_then(|r| r.strip_suffix(SUFFIX)) {
            if let Ok(epoch) = epoch.parse() {
                out.push((epoch, p));
            }
        }
    }
    Ok(out)
}

/// Reads and verifies one checkpoint file of at most `max_bytes` (see [`max_bytes`]).
pub fn load(path: &Path, max_bytes: u64) -> Result<Checkpoint, CheckpointError> {
    let bad = |reason: String| CheckpointError::Invalid { path: path.to_path_buf(), reason };
    let bytes = grinnder_graph::io::files::read_bounded(path, max_bytes, "checkpoint of this model")
        .map_err(|e| bad(e.to_string()))?;
    let text = std::str::from_utf8(&bytes).map_err(|_| bad("not text (corrupted)".into()))?;
    let mut lines = text.split('\n');
    let head = lines.next().unwrap_or("");
    match head.strip_prefix(MAGIC).map(str::trim) {
        Some(v) if v == VERSION.to_string() => {}
        Some(v) => return Err(bad(format!("checkpoint format version {v}, this build reads {VERSION}"))),
        None => return Err(bad("not a grinnder checkpoint (bad first line)".into())),
    }
    let json = lines.next().ok_or_else(|| bad("truncated: no body".into()))?;
    let sum = lines
        .next()
        .and_then(|l| l.strip_prefix("xxh3 "))
        .ok_or_else(|| bad("truncated: no checksum".into()))?;
    if format!("{:016x}", xxh3_64(json.as_bytes())) != sum.trim() {
        return Err(bad("checksum mismatch (corrupted)".into()));
    }
    serde_json::from_str(json).map_err(|e| bad(format!("unreadable body: {e}")))
}

/// The newest checkpoint in `dir` that verifies (older ones are tried when a newer one is
/// damaged, with a warning); `None` when there is none; an error when there are checkpoints
/// and every one is damaged. Files longer than `max_bytes` count as damaged.
pub fn latest(dir: &Path, max_bytes: u64) -> Result<Option<(PathBuf, Checkpoint)>, CheckpointError> {
    if !dir.exists() {
        return Ok(None);
    }
    let mut all = list(dir).map_err(io_err(dir))?;
    all.sort_by_key(|e| std::cmp::Reverse(e.0));
    let mut newest = None;
    for (_, p) in &all {
        match load(p, max_bytes) {
            Ok(ck) => return Ok(Some((p.clone(), ck))),
            Err(e) => {
                tracing::warn!("skipping a damaged checkpoint: {e}");
                newest.get_or_insert(e.to_string());
            }
        }
    }
    match newest {
        None => Ok(None),
        Some(newest) => Err(CheckpointError::AllDamaged { dir: dir.to_path_buf(), count: all.len(), newest }),
    }
}

/// Refuses a checkpoint made for another configuration (naming the first field that differs;
/// `epochs` and `eval_every` may change) or another dataset.
pub fn check_compatible(
    path: &Path,
    ck: &Checkpoint,
    config: &serde_json::Value,
    dataset: &str,
) -> Result<(), CheckpointError> {
    fn first_diff(
        a: &serde_json::Value,
        b: &serde_json::Value,
        at: &str,
    ) -> Option<(String, String, String)> {
        match (a, b) {
            (serde_json::Value::Object(x), serde_json::Value::Object(y)) => {
                let mut keys: Vec<&String> = x.keys().chain(y.keys()).collect();
                keys.sort();
                keys.dedup();
                keys.into_iter()
                    .filter(|k| !(at.is_empty() && matches!(k.as_str(), "epochs" | "eval_every")))
                    .find_map(|k| {
                        let path = if at.is_empty() { k.clone() } else { format!("{at}.{k}") };
                        let null = serde_json::Value::Null;
                        first_diff(x.get(k).unwrap_or(&null), y.get(k).unwrap_or(&null), &path)
                    })
            }
            _ if a != b => Some((at.to_string(), a.to_string(), b.to_string())),
            _ => None,
        }
    }
    if let Some((field, then, now)) = first_diff(&ck.config, config, "") {
        return Err(CheckpointError::Mismatch { path: path.to_path_buf(), field, then, now });
    }
    if ck.dataset != dataset {
        return Err(CheckpointError::OtherDataset {
            path: path.to_path_buf(),
            then: ck.dataset.clone(),
            now: dataset.to_string(),
        });
    }
    Ok(())
}
