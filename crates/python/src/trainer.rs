//! `grinnder.Trainer`: the engine's [`grinnder_engine::Trainer`] held for Python — the backend
//! and the dataset it borrows kept beside it in one self-referential cell per backend
//! (`self_cell`), the GIL released while it works, Ctrl-C taken at the next epoch boundary.

use std::path::PathBuf;
use std::sync::Arc;

use grinnder_cli::args::FeatureAccessArg;
use grinnder_cli::plan::Device;
use grinnder_cuda::Cuda;
use grinnder_engine::inference::Collect;
use grinnder_engine::{FeatureSource, ModelFile, Output, Request, TrainError, Weights};
use grinnder_graph::io::npy::DType;
use grinnder_graph::io::npy_rows::NpyRows;
use grinnder_graph::Dataset as Graph;
use grinnder_tensor::{Backend, Cpu};
use numpy::{PyArray1, PyArrayMethods};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use self_cell::self_cell;

use crate::config::Config;
use crate::data::Dataset;
use crate::{any_error, train_error, value_error};

/// What a trainer borrows: the backend, the dataset, and on a GPU the zero-copy feature table.
struct Owner<B> {
    b: B,
    ds: Arc<Graph>,
    zero_copy: Option<grinnder_cli::train::ZeroCopyFeatures>,
}

type CpuTrainer<'a> = grinnder_engine::Trainer<'a, Cpu<f32>>;
type CudaTrainer<'a> = grinnder_engine::Trainer<'a, Cuda>;

self_cell!(
    struct CpuCell {
        owner: Owner<Cpu<f32>>,
        #[not_covariant]
        dependent: CpuTrainer,
    }
);

self_cell!(
    struct CudaCell {
        owner: Owner<Cuda>,
        #[not_covariant]
        dependent: CudaTrainer,
    }
);

enum Cell {
    Cpu(CpuCell),
    Cuda(CudaCell),
}

/// `$body` with `$t` the engine's trainer, whatever the backend.
macro_rules! on {
    ($cell:expr, $t:ident => $body:expr) => {
        match $cell {
            Cell::Cpu(c) => c.with_dependent_mut(|_, $t| $body),
            Cell::Cuda(c) => c.with_dependent_mut(|_, $t| $body),
        }
    };
}

/// Runs `f` with the GIL released. `detach` runs it on this very thread, so what it captures
/// (the engine's trainer, which is not `Send`) never crosses threads.
pub(crate) fn without_gil<R>(py: Python<'_>, f: impl FnOnce() -> R) -> R {
    struct Here<T>(T);
    // SAFETY: the wrapped closure and its result stay on the calling thread: `Python::detach`
    // calls the closure it is given on the current thread and returns its result there.
    unsafe impl<T> Send for Here<T> {}
    // SAFETY: as above; nothing is shared with another thread.
    unsafe impl<T> Sync for Here<T> {}
    impl<T> Here<T> {
        fn get(self) -> T {
            self.0
        }
    }
    let f = Here(f);
    py.detach(move || Here((f.get())())).get()
}

/// A value the engine serialises (its figures) as a Python dict.
fn dict_of<'py>(py: Python<'py>, v: &impl serde::Serialize) -> PyResult<Bound<'py, PyAny>> {
    let text = serde_json::to_string(v).map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
    py.import("json")?.call_method1("loads", (text,))
}

/// The engine's trainer set up on `b` for `cfg` (a mode from the settings, checkpoints resumed,
/// initial weights loaded).
fn start<'a, B: Backend>(
    b: &'a B,
    ds: &'a Graph,
    cfg: &Config,
    features: Option<&'a dyn FeatureSource<B>>,
) -> Result<grinnder_engine::Trainer<'a, B>, TrainError> {
    let mode = grinnder_cli::train::mode_of(&cfg.plan, features, None, None);
    let mut t = grinnder_engine::Trainer::new(b, ds, cfg.plan.config.clone(), mode)?;
    if let Some(c) = &cfg.checkpoint {
        t = t.with_checkpoints(c)?;
    }
    if let (Some(p), 0) = (&cfg.init_from, t.epochs_done()) {
        t.load_weights(&ModelFile::load(p)?)?;
    }
    Ok(t)
}

/// The engine's trainer holding `file`'s model, in the mode `cfg`'s executor settings give.
fn start_for_model<'a, B: Backend>(
    b: &'a B,
    ds: &'a Graph,
    cfg: &Config,
    file: &ModelFile,
) -> Result<grinnder_engine::Trainer<'a, B>, TrainError> {
    let mode = grinnder_cli::train::mode_of(&cfg.plan, None, None, None);
    grinnder_engine::Trainer::for_model(b, ds, file, mode)
}

/// A backend for `cfg` and the trainer `make` sets up on it.
fn build(py: Python<'_>, ds: Arc<Graph>, cfg: &Config, file: Option<&ModelFile>) -> PyResult<Cell> {
    // what the keywords leave open, chosen from the machine (as the command does)
    let mut cfg = cfg.clone();
    let cfg = &mut cfg;
    if file.is_none() {
        // (a model file brings its own preprocessing: no pass over the features for it)
        cfg.plan.settle_feature_norm(&ds);
    }
    match cfg.plan.device {
        Device::Cpu => {
            if cfg.plan.precision != grinnder_cli::args::PrecisionArg::F32 {
                return Err(value_error(
                    "precision=\"f64\" is for the grinnder command; the Python package computes in f32",
                ));
            }
            settle(&mut cfg.plan, &ds, None)?;
            let cfg = &*cfg;
            let owner = Owner { b: Cpu::<f32>::new(), ds, zero_copy: None };
            let cell = without_gil(py, || {
                CpuCell::try_new(owner, |o| match file {
                    Some(f) => start_for_model(&o.b, &o.ds, cfg, f),
                    None => start(&o.b, &o.ds, cfg, None),
                })
            });
            Ok(Cell::Cpu(cell.map_err(train_error)?))
        }
        Device::Cuda(n) => {
            let mut gpu = Cuda::new(n).map_err(|e| {
                // (the engine's advice names the command's flag)
                let e = e.to_string().replace("--device cpu", "device=\"cpu\"");
                PyRuntimeError::new_err(format!("cannot use CUDA device {n}: {e}"))
            })?;
            settle(&mut cfg.plan, &ds, Some(gpu.mem_info().0 as u64))?;
            let (cfg, plan) = (&*cfg, &cfg.plan);
            gpu.set_memory_budget(plan.gpu_mem).map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
            gpu.set_tf32(plan.tf32).map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
            let zero_copy = match plan.feature_access {
                FeatureAccessArg::ZeroCopy if file.is_none() => Some(
                    grinnder_cli::train::ZeroCopyFeatures::new(&gpu, &ds, plan.config.feature_norm)
                        .map_err(any_error)?,
                ),
                _ => None,
            };
            let owner = Owner { b: gpu, ds, zero_copy };
            let cell = without_gil(py, || {
                CudaCell::try_new(owner, |o| match file {
                    Some(f) => start_for_model(&o.b, &o.ds, cfg, f),
                    None => {
                        start(&o.b, &o.ds, cfg, o.zero_copy.as_ref().map(|z| z as &dyn FeatureSource<Cuda>))
                    }
                })
            });
            Ok(Cell::Cuda(cell.map_err(train_error)?))
        }
    }
}

/// [`grinnder_cli::budgets::settle`] (its reasons are what `grinnder info` prints for the same
/// settings).
fn settle(plan: &mut grinnder_cli::plan::TrainPlan, ds: &Graph, gpu_free: Option<u64>) -> PyResult<()> {
    grinnder_cli::budgets::settle(plan, ds, gpu_free).map_err(any_error)?;
    Ok(())
}

/// Trains a GNN on a `Dataset` with a `Config` (or keywords for one), an epoch at a time.
#[pyclass(module = "grinnder", unsendable)]
pub struct Trainer {
    cell: Cell,
    dataset: Py<Dataset>,
    /// Whether a host budget was given (`host_mem`): without one an output file's pages stay
    /// mapped in as `grinnder predict`'s do ([`grinnder_cli::predict::keep_output_mapped`]).
    host_budget: bool,
}

/// Whether `cfg` gives a host budget (`host_mem`).
fn host_budget(cfg: &Config) -> bool {
    cfg.plan.tiered.as_ref().is_some_and(|t| t.host_mem.is_some())
}

fn weights_of(which: &str) -> PyResult<Weights> {
    match which {
        "best" => Ok(Weights::BestValid),
        "last" => Ok(Weights::Last),
        w => Err(value_error(format!("which={w:?}: use \"best\" or \"last\""))),
    }
}

fn output_of(output: &str) -> PyResult<Output> {
    Ok(match output {
        "logits" => Output::Logits,
        "probs" => Output::Probs,
        "class" | "classes" => Output::Class,
        o => return Err(value_error(format!("output={o:?}: use \"logits\", \"probs\" or \"class\""))),
    })
}

/// Node ids from an array-like (indices or a boolean mask), checked against `n`.
fn node_ids(nodes: Option<&Bound<'_, PyAny>>, n: usize) -> PyResult<Option<Vec<u32>>> {
    let Some(nodes) = nodes else { return Ok(None) };
    let np = nodes.py().import("numpy")?;
    let a = if nodes.hasattr("detach")? {
        nodes.call_method0("detach")?.call_method0("cpu")?.call_method0("numpy")?
    } else {
        np.call_method1("asarray", (nodes,))?
    };
    let kind: String = a.getattr("dtype")?.getattr("kind")?.extract()?;
    let a = if kind == "b" { np.call_method1("flatnonzero", (a,))? } else { a };
    let a = np.call_method1("ascontiguousarray", (a,))?.call_method1("astype", ("int64",))?;
    let arr = a
        .cast::<PyArray1<i64>>()
        .map_err(|_| value_error("nodes: expected a 1-D array of node ids or a boolean mask"))?;
    let ro = arr.readonly();
    let ids = ro.as_slice().map_err(value_error)?;
    if let Some((i, v)) = ids.iter().enumerate().find(|(_, &v)| v < 0 || v as usize >= n) {
        return Err(value_error(format!("nodes: entry {i} is {v}, not a node id (0 to {})", n as i64 - 1)));
    }
    Ok(Some(ids.iter().map(|&v| v as u32).collect()))
}

impl Trainer {
    /// The output's width per row: logits' classes, or hidden layer `l`'s width.
    fn width(&mut self, output: Output) -> usize {
        on!(&mut self.cell, t => {
            let m = t.model();
            match output {
                Output::Embedding(l) => m.dim((l + 1).min(m.layers())),
                Output::Class => 0,
                _ => m.dim(m.layers()),
            }
        })
    }

    fn predict_into(
        &mut self,
        py: Python<'_>,
        output: Output,
        nodes: Option<&Bound<'_, PyAny>>,
        out: Option<PathBuf>,
        dtype: &str,
    ) -> PyResult<Py<PyAny>> {
        let n = self.dataset.get().inner.num_nodes();
        let nodes = node_ids(nodes, n)?;
        let rows = nodes.as_ref().map_or(n, Vec::len);
        let req = Request { output, nodes };
        let width = self.width(output);
        if let Some(path) = out {
            let (t, bf16) = match (output, dtype) {
                (Output::Class, _) => (DType::I64, false),
                (_, "float32") => (DType::F32, false),
                (_, "bfloat16") => (DType::U16, true),
                (_, d) => return Err(value_error(format!("dtype={d:?}: use \"float32\" or \"bfloat16\""))),
            };
            let mut file =
                NpyRows::create(&path, t, rows as u64, width as u64).map_err(crate::graph_error)?;
            if !self.host_budget {
                grinnder_cli::predict::keep_output_mapped(&mut file);
            }
            let cell = &mut self.cell;
            let r = without_gil(py, || {
                let mut sink = grinnder_cli::predict::NpySink { out: &mut file, bf16 };
                on!(cell, t => t.predict(&req, &mut sink))
            });
            r.map_err(train_error)?;
            file.finish().map_err(crate::graph_error)?;
            return Ok(path.display().to_string().into_pyobject(py)?.into_any().unbind());
        }
        if dtype != "float32" {
            return Err(value_error("dtype applies to files (out=...); arrays come back as float32"));
        }
        let mut sink = Collect::new(rows);
        let cell = &mut self.cell;
        without_gil(py, || on!(cell, t => t.predict(&req, &mut sink))).map_err(train_error)?;
        if output == Output::Class {
            return Ok(PyArray1::from_vec(py, sink.classes).into_any().unbind());
        }
        let w = sink.width.max(width).max(1);
        let values = if sink.values.is_empty() { vec![0.0; rows * w] } else { sink.values };
        Ok(PyArray1::from_vec(py, values).reshape([rows, w])?.into_any().unbind())
    }
}

#[pymethods]
impl Trainer {
    /// Sets training up on `dataset` (partitioning, plans, blocks: what the mode needs) with
    /// `config`, or with keywords for one (`Trainer(ds, model="sage", hidden=256)`). A
    /// `device="cuda"` without a usable GPU raises `RuntimeError`.
    #[new]
    #[pyo3(signature = (dataset, config=None, **kwargs))]
    fn new(
        py: Python<'_>,
        dataset: &Bound<'_, Dataset>,
        config: Option<&Bound<'_, Config>>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Trainer> {
        let made;
        let cfg = match (config, kwargs.filter(|k| !k.is_empty())) {
            (Some(_), Some(_)) => return Err(value_error("give a Config or keywords, not both")),
            (Some(c), None) => c.get(),
            (None, k) => {
                made = Config::from_kwargs(k)?;
                &made
            }
        };
        let ds = dataset.get().inner.clone();
        let cell = build(py, ds, cfg, None)?;
        Ok(Trainer { cell, dataset: dataset.clone().unbind(), host_budget: host_budget(cfg) })
    }

    /// A trainer holding the model of a model file (`Trainer.save`, `grinnder train
    /// --save-model`, or a PyG model saved with safetensors), to predict on `dataset`: the
    /// training graph or another of the same feature width. Keywords set how it runs
    /// (`parts`, `host_mem`, `storage_dir`, `device`, `gpu_mem`, …).
    #[staticmethod]
    #[pyo3(signature = (path, dataset, **kwargs))]
    fn load(
        py: Python<'_>,
        path: PathBuf,
        dataset: &Bound<'_, Dataset>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Trainer> {
        let file = ModelFile::load(&path).map_err(|e| train_error(TrainError::from(e)))?;
        let cfg = Config::from_kwargs(kwargs)?;
        let ds = dataset.get().inner.clone();
        let cell = build(py, ds, &cfg, Some(&file))?;
        Ok(Trainer { cell, dataset: dataset.clone().unbind(), host_budget: host_budget(&cfg) })
    }

    /// Trains one epoch; returns its figures (`epoch`, `loss`, `epoch_s`, accuracies on
    /// evaluated epochs, time per phase and bytes per tier where the mode has them, peak
    /// memory) as a dict.
    fn train_epoch<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let cell = &mut self.cell;
        let m = without_gil(py, || on!(cell, t => t.train_epoch())).map_err(train_error)?;
        dict_of(py, &m)
    }

    /// Accuracies of the current parameters on train, valid and test (no dropout).
    fn evaluate<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let cell = &mut self.cell;
        let e = without_gil(py, || on!(cell, t => t.evaluate())).map_err(train_error)?;
        dict_of(py, &e)
    }

    /// Trains `epochs` more epochs (default: up to the configured number), calling
    /// `callback(figures)` after each (returning `False` stops; `patience=` stops by itself once
    /// that many epochs passed without a better validation accuracy); a progress bar
    /// on a terminal, or a line every tenth of the run elsewhere, with `progress`. Ctrl-C stops it after the epoch under way, with
    /// the trainer as it was then (`fit` again goes on). Returns the summary.
    #[pyo3(signature = (epochs=None, callback=None, progress=true))]
    fn fit<'py>(
        &mut self,
        py: Python<'py>,
        epochs: Option<usize>,
        callback: Option<Bound<'py, PyAny>>,
        progress: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let (done, total) = on!(&mut self.cell, t => (t.epochs_done(), t.config().epochs));
        let todo = epochs.unwrap_or(total.saturating_sub(done));
        let pb = progress.then(|| grinnder_graph::progress::bar(todo as u64, "train", false));
        let every = (todo / 10).max(1);
        let stderr = py.import("sys")?.getattr("stderr")?;
        for k in 0..todo {
            let cell = &mut self.cell;
            let m = without_gil(py, || on!(cell, t => t.train_epoch())).map_err(train_error)?;
            if let Some(pb) = &pb {
                pb.set_position(k as u64 + 1);
                if pb.is_hidden() && ((k + 1) % every == 0 || k + 1 == todo) {
                    let acc = m.valid_acc.map_or(String::new(), |v| format!(", valid {:.2} %", v * 100.0));
                    stderr
                        .call_method1("write", (format!("epoch {}: loss {:.4}{acc}\n", m.epoch, m.loss),))?;
                }
            }
            // Ctrl-C while the epoch ran: stop here, the epoch complete
            py.check_signals()?;
            if let Some(cb) = &callback {
                // `False` (not None, which a callback without a return gives) stops: early stopping
                let go_on = cb.call1((dict_of(py, &m)?,))?;
                if go_on.is_instance_of::<pyo3::types::PyBool>() && !go_on.extract::<bool>()? {
                    break;
                }
            }
            // (patience: the trainer stopped early)
            if on!(&mut self.cell, t => t.stopped_early()) {
                break;
            }
        }
        if let Some(pb) = pb {
            pb.finish_and_clear();
        }
        self.summary(py)
    }

    /// The run so far: test accuracy at the best validation epoch, final loss, median epoch time,
    /// peak memory.
    fn summary<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let s = on!(&mut self.cell, t => t.summary());
        dict_of(py, &s)
    }

    /// Epochs trained so far (with a resumed checkpoint's).
    #[getter]
    fn epochs_done(&mut self) -> usize {
        on!(&mut self.cell, t => t.epochs_done())
    }

    /// Predictions for every node (or `nodes`: ids or a boolean mask, rows in their order):
    /// `output` "logits", "probs" or "class", as a numpy array ([rows, classes] float32, or
    /// [rows] int64 classes); with `out="file.npy"`, written there row-block by row-block
    /// instead (for outputs larger than memory; `dtype="bfloat16"` halves it) and its path
    /// returned. Computed as the trainer trains: in memory, partition by partition under its
    /// budgets.
    #[pyo3(signature = (output="logits", nodes=None, out=None, dtype="float32"))]
    fn predict(
        &mut self,
        py: Python<'_>,
        output: &str,
        nodes: Option<&Bound<'_, PyAny>>,
        out: Option<PathBuf>,
        dtype: &str,
    ) -> PyResult<Py<PyAny>> {
        let o = output_of(output)?;
        self.predict_into(py, o, nodes, out, dtype)
    }

    /// Hidden layer `layer`'s output (0-based: after its norm, ReLU and residual) for every
    /// node or `nodes`, as `predict` gives logits.
    #[pyo3(signature = (layer, nodes=None, out=None, dtype="float32"))]
    fn embed(
        &mut self,
        py: Python<'_>,
        layer: usize,
        nodes: Option<&Bound<'_, PyAny>>,
        out: Option<PathBuf>,
        dtype: &str,
    ) -> PyResult<Py<PyAny>> {
        self.predict_into(py, Output::Embedding(layer), nodes, out, dtype)
    }

    /// Writes the model to a safetensors file PyG can load (docs/model-files.md): the best
    /// validation epoch's parameters (`which="best"`) or the last ones (`"last"`); returns
    /// which.
    #[pyo3(signature = (path, which="best"))]
    fn save(&mut self, path: PathBuf, which: &str) -> PyResult<String> {
        let w = weights_of(which)?;
        on!(&mut self.cell, t => t.save_model(&path, w)).map_err(train_error)
    }

    /// The parameters as numpy arrays under PyG's names and shapes, for
    /// `model.load_state_dict({k: torch.from_numpy(v) for k, v in ...})`: as `save` writes
    /// them, the best validation epoch's (`which="best"`, the epoch `summary()` reports) or the
    /// last ones (`"last"`).
    #[pyo3(signature = (which="best"))]
    fn state_dict<'py>(&mut self, py: Python<'py>, which: &str) -> PyResult<Bound<'py, PyDict>> {
        let w = weights_of(which)?;
        let f = on!(&mut self.cell, t => t.model_file(w));
        let d = PyDict::new(py);
        for t in f.tensors {
            let a = PyArray1::from_vec(py, t.data.iter().map(|&x| x as f32).collect::<Vec<f32>>());
            d.set_item(t.name, a.reshape(t.shape)?)?;
        }
        Ok(d)
    }

    /// Writes a checkpoint now (needs `checkpoint_dir`).
    fn save_checkpoint(&mut self, py: Python<'_>) -> PyResult<()> {
        let cell = &mut self.cell;
        without_gil(py, || on!(cell, t => t.save_checkpoint())).map_err(train_error)
    }

    /// The dataset it trains on.
    #[getter]
    fn dataset(&self, py: Python<'_>) -> Py<Dataset> {
        self.dataset.clone_ref(py)
    }

    fn __repr__(&mut self) -> String {
        let (done, cfg) = on!(&mut self.cell, t => (t.epochs_done(), t.config().clone()));
        format!(
            "Trainer({:?} {} layers, hidden {}, {} of {} epochs, on {})",
            cfg.model.kind,
            cfg.model.layers,
            cfg.model.hidden,
            done,
            cfg.epochs,
            match self.cell {
                Cell::Cpu(_) => "cpu",
                Cell::Cuda(_) => "cuda",
            }
        )
    }
}
