//! `grinnder._LayerwiseRun`: the tiered executor running a Python model's layers
//! (`grinnder.torch.LayerwiseModel`, its `forward_layer`) with the caller's criterion.
//!
//! Each layer of the engine's model is a [`TorchLayer`]: its forward and backward call the
//! Python driver (`grinnder.torch._Driver`) with the partition's input rows and, once per
//! partition, its adjacency (the whole graph's `Â`, rows × input rows, own rows first); the
//! driver runs `forward_layer` in torch, and in backward runs it again under autograd, feeding
//! the output's gradient in: parameter gradients accumulate in the torch parameters' `.grad`,
//! the input's gradient comes back to the executor, which sums it into the layer below's
//! gradient blocks (halo rows into their owners'). The engine holds no parameter of these
//! layers: the caller's optimizer steps them.
//!
//! Rows cross between the engine and torch as copies into numpy arrays (CPU only so far). A
//! Python exception in a layer or the criterion is kept and raised when the pass returns; the
//! rest of the pass runs on zeros (the blocks it writes are remade by the next pass).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use grinnder_engine::tiered::{Executor, TieredConfig};
use grinnder_engine::{FeatureNorm, TrainError};
use grinnder_graph::Dataset as Graph;
use grinnder_nn::conv::{Cache, Conv, Side};
use grinnder_nn::families::layerwise;
use grinnder_nn::graph::Values;
use grinnder_nn::memory::{Held, Shape};
use grinnder_nn::work::Passes;
use grinnder_nn::{Aggregation, Model, Param};
use grinnder_tensor::{Cpu, Mat};
use numpy::{PyArray1, PyArray2, PyArrayMethods, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use self_cell::self_cell;

use crate::config::Config;
use crate::data::Dataset;
use crate::{train_error, value_error};

type B = Cpu<f32>;

/// What the layers share: the driver, the first exception raised, and the partitions whose
/// adjacency the driver already holds.
struct Shared {
    driver: Py<PyAny>,
    /// The adjacency the layers read.
    aggregation: Aggregation,
    failed: Mutex<Option<PyErr>>,
    sent: Mutex<HashSet<(u32, usize, usize)>>,
}

impl Shared {
    /// `f` under the GIL, unless an earlier call failed; an exception is kept (the first).
    fn call<R>(&self, f: impl FnOnce(Python<'_>, &Bound<'_, PyAny>) -> PyResult<R>) -> Option<R> {
        if self.failed.lock().expect("not poisoned").is_some() {
            return None;
        }
        Python::attach(|py| match f(py, self.driver.bind(py)) {
            Ok(r) => Some(r),
            Err(e) => {
                self.failed.lock().expect("not poisoned").get_or_insert(e);
                None
            }
        })
    }

    /// The first exception a call raised, taken.
    fn take_failure(&self) -> Option<PyErr> {
        self.failed.lock().expect("not poisoned").take()
    }

    /// The partition's key for the driver (its first node, rows and input rows), its
    /// adjacency sent first where the driver does not hold it yet.
    fn key(
        &self,
        py: Python<'_>,
        driver: &Bound<'_, PyAny>,
        g: &grinnder_nn::Graph<B>,
    ) -> PyResult<(u32, usize, usize)> {
        let first = g.row_ids().and_then(|ids| ids.first().copied()).unwrap_or(0);
        let key = (first, g.rows, g.cols);
        if self.sent.lock().expect("not poisoned").contains(&key) {
            return Ok(key);
        }
        let adj = g.adjacency(self.aggregation);
        let s = &adj.s;
        let indptr: Vec<i64> = s.row_ptr.iter().map(|&p| p as i64).collect();
        let indices: Vec<i64> = s.col_idx.iter().map(|&c| c as i64).collect();
        let values: Vec<f32> = match &adj.vals {
            Values::Entries(v) => v.data.clone(),
            Values::Factored { rows, cols } => (0..s.rows)
                .flat_map(|r| {
                    let rf = rows.as_ref().map_or(1.0, |m| m.data[r]);
                    let span = s.row_ptr[r] as usize..s.row_ptr[r + 1] as usize;
                    s.col_idx[span]
                        .iter()
                        .map(move |&c| rf * cols.as_ref().map_or(1.0, |m| m.data[c as usize]))
                })
                .collect(),
        };
        driver.call_method1(
            "set_adjacency",
            (
                key,
                PyArray1::from_vec(py, indptr),
                PyArray1::from_vec(py, indices),
                PyArray1::from_vec(py, values),
                (g.rows, g.cols),
            ),
        )?;
        self.sent.lock().expect("not poisoned").insert(key);
        Ok(key)
    }
}

/// A numpy copy of `m`.
fn numpy<'py>(py: Python<'py>, m: &Mat<f32>) -> PyResult<Bound<'py, PyAny>> {
    Ok(PyArray1::from_slice(py, &m.data).reshape([m.rows, m.cols])?.into_any())
}

/// A `rows × cols` float32 array from Python as a matrix (a copy), or an error naming `what`.
fn matrix(a: &Bound<'_, PyAny>, rows: usize, cols: usize, what: &str) -> PyResult<Mat<f32>> {
    let arr = a.cast::<PyArray2<f32>>().map_err(|_| {
        value_error(format!("{what}: expected a 2-D float32 array of shape [{rows}, {cols}]"))
    })?;
    if arr.shape() != [rows, cols] {
        return Err(value_error(format!("{what}: shape {:?}, expected [{rows}, {cols}]", arr.shape())));
    }
    let ro = arr.readonly();
    let data = match ro.as_slice() {
        Ok(s) => s.to_vec(),
        Err(_) => ro.as_array().iter().copied().collect(),
    };
    Ok(Mat::from_vec(rows, cols, data))
}

/// A forward's autograd graph, as the driver made it (its input and output tensors).
struct Tape(Py<PyAny>);

/// Layer `l` of a Python model, run by its driver.
struct TorchLayer {
    l: usize,
    in_dim: usize,
    out_dim: usize,
    shared: Arc<Shared>,
}

impl Conv<B> for TorchLayer {
    /// The output rows; the cache holds, in training, the autograd graph torch made (so that
    /// a backward from this forward runs no third forward of the layer).
    fn forward(&self, _: &B, g: &grinnder_nn::Graph<B>, x: &Mat<f32>, _: Side<'_, B>) -> (Mat<f32>, Cache) {
        let got = self.shared.call(|py, d| {
            let key = self.shared.key(py, d, g)?;
            let (y, tape): (Bound<'_, PyAny>, Bound<'_, PyAny>) =
                d.call_method1("forward", (self.l, key, numpy(py, x)?))?.extract()?;
            let y = matrix(&y, g.rows, self.out_dim, &format!("forward_layer({}, …)", self.l))?;
            Ok((y, (!tape.is_none()).then(|| Tape(tape.unbind()))))
        });
        match got {
            Some((y, tape)) => (y, Cache::new(tape)),
            None => (Mat::zeros(g.rows, self.out_dim), Cache::new(None::<Tape>)),
        }
    }

    fn backward(
        &mut self,
        _: &B,
        g: &grinnder_nn::Graph<B>,
        x: &Mat<f32>,
        _: Side<'_, B>,
        cache: Cache,
        dy: &Mat<f32>,
        need_dx: bool,
        _: Option<&mut Mat<f32>>,
    ) -> Option<Mat<f32>> {
        let tape: Option<Tape> = cache.take();
        let dx = self.shared.call(|py, d| {
            let key = self.shared.key(py, d, g)?;
            let tape = tape.map(|t| t.0.into_bound(py));
            let args = (self.l, key, numpy(py, x)?, numpy(py, dy)?, need_dx, tape);
            let dx = d.call_method1("backward", args)?;
            if !need_dx {
                return Ok(None);
            }
            let what = format!("the input gradient of forward_layer({}, …)", self.l);
            matrix(&dx, g.cols, self.in_dim, &what).map(Some)
        });
        match dx {
            Some(dx) => dx,
            None => need_dx.then(|| Mat::zeros(g.cols, self.in_dim)),
        }
    }

    fn params_mut(&mut self) -> Vec<&mut Param<B>> {
        // (the caller's, in torch)
        Vec::new()
    }

    fn held(&self, s: Shape, i: u64, o: u64, _: bool, need_dx: bool, _: bool) -> Held {
        layerwise::held(s, i, o, need_dx)
    }

    fn work(&self, s: Shape, i: u64, o: u64, _: bool, need_dx: bool) -> Passes {
        layerwise::work(s, i, o, need_dx)
    }
}

/// The model of `dims` whose layers the driver runs.
fn model_of(shared: &Arc<Shared>, dims: &[usize], seed: u64) -> Model<B> {
    // (a setup that starts over partitions anew: the driver's adjacencies are sent again)
    shared.sent.lock().expect("not poisoned").clear();
    let convs = (0..dims.len() - 1)
        .map(|l| {
            let layer = TorchLayer { l, in_dim: dims[l], out_dim: dims[l + 1], shared: shared.clone() };
            Box::new(layer) as Box<dyn Conv<B>>
        })
        .collect();
    Model::from_layers(convs, dims.to_vec(), shared.aggregation, seed)
}

struct Owner {
    b: B,
    ds: Arc<Graph>,
}

type Ex<'a> = Executor<'a, B>;

self_cell!(
    struct RunCell {
        owner: Owner,
        #[not_covariant]
        dependent: Ex,
    }
);

/// The tiered executor over a Python model's layers (see the module).
#[pyclass(module = "grinnder", name = "_LayerwiseRun", unsendable)]
pub struct LayerwiseRun {
    cell: RunCell,
    shared: Arc<Shared>,
    nodes: usize,
}

/// The tiered executor's settings from the keywords `grinnder.Trainer` takes (a graph the
/// in-memory trainer would take runs as one partition).
fn tiered_config(cfg: &mut Config, ds: &Graph) -> PyResult<TieredConfig> {
    if cfg.plan.device != grinnder_cli::plan::Device::Cpu {
        return Err(value_error(
            "a torch model runs on the CPU so far (device=\"cpu\"); its GPU path is not built yet",
        ));
    }
    grinnder_cli::budgets::settle(&mut cfg.plan, ds, None).map_err(crate::any_error)?;
    Ok(match grinnder_cli::train::mode_of::<B>(&cfg.plan, None, None, None) {
        grinnder_engine::Mode::Tiered(tc) => tc,
        grinnder_engine::Mode::FullGraph => {
            TieredConfig::in_ram(1, grinnder_partition::Method::Metis { seed: cfg.plan.config.model.seed })
        }
        _ => return Err(value_error("a torch model trains full-graph: give no mini-batch settings")),
    })
}

#[pymethods]
impl LayerwiseRun {
    /// Sets the executor up for `dataset` with a model of widths `dims` whose layers `driver`
    /// runs on `adjacency` (`"gcn"`: `Â`; `"mean"`: SAGE's; `"sum"`: GIN's); `kwargs` are
    /// `grinnder.Trainer`'s settings (`parts`, `host_mem`, `storage_dir`, …).
    #[new]
    #[pyo3(signature = (dataset, driver, dims, adjacency="gcn", **kwargs))]
    fn new(
        py: Python<'_>,
        dataset: &Bound<'_, Dataset>,
        driver: Py<PyAny>,
        dims: Vec<usize>,
        adjacency: &str,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<LayerwiseRun> {
        let ds = dataset.get().inner.clone();
        let aggregation = match adjacency {
            "gcn" => Aggregation::GcnNorm,
            "mean" => Aggregation::Mean,
            "sum" => Aggregation::Sum,
            a => return Err(value_error(format!("adjacency {a:?}: one of \"gcn\", \"mean\", \"sum\""))),
        };
        if ds.edge_weight.is_some() && aggregation != Aggregation::GcnNorm {
            return Err(value_error(format!(
                "the dataset has edge weights, which only the \"gcn\" adjacency takes (PyG's gcn_norm), not {adjacency:?}"
            )));
        }
        if dims.len() < 2 || dims[0] != ds.features.dim {
            return Err(value_error(format!(
                "layer_dims() gave {dims:?}: at least [in, out], `in` the dataset's {} features",
                ds.features.dim
            )));
        }
        let mut cfg = Config::from_kwargs(kwargs)?;
        let tc = tiered_config(&mut cfg, &ds)?;
        let seed = cfg.plan.config.model.seed;
        let shared = Arc::new(Shared {
            driver,
            aggregation,
            failed: Mutex::new(None),
            sent: Mutex::new(HashSet::new()),
        });
        let nodes = ds.num_nodes();
        let owner = Owner { b: Cpu::new(), ds };
        let sh = shared.clone();
        let cell = crate::trainer::without_gil(py, move || {
            RunCell::try_new(owner, |o| {
                let make = || model_of(&sh, &dims, seed);
                Executor::for_layers(&o.b, &o.ds, &make, FeatureNorm::None, &tc)
            })
        });
        let cell = cell.map_err(|e| shared.take_failure().unwrap_or_else(|| train_error(e)))?;
        Ok(LayerwiseRun { cell, shared, nodes })
    }

    /// One training pass at `epoch`: the criterion `criterion(ids, rows)` gets the training
    /// nodes' ids and output rows and returns `(loss, gradient of the rows)`; returns the loss.
    fn train_pass(&mut self, py: Python<'_>, epoch: u64, criterion: Py<PyAny>) -> PyResult<f64> {
        let shared = self.shared.clone();
        let mut crit = |ids: &[u32], rows: &[f32], width: usize| -> Result<(f64, Vec<f32>), TrainError> {
            let got = shared.call(|py, _| {
                let ids = PyArray1::from_iter(py, ids.iter().map(|&v| v as i64));
                let y = PyArray1::from_slice(py, rows).reshape([rows.len() / width.max(1), width])?;
                let r = criterion.bind(py).call1((ids, y))?;
                let (loss, grad): (f64, Bound<'_, PyAny>) = r.extract()?;
                let grad = matrix(&grad, rows.len() / width.max(1), width, "the criterion's gradient")?;
                Ok((loss, grad.data))
            });
            got.ok_or_else(|| TrainError::Config("the criterion raised".into()))
        };
        let r = crate::trainer::without_gil(py, || {
            self.cell.with_dependent_mut(|_, ex| {
                ex.model.zero_grad(&Cpu::new());
                ex.forward_backward_with(epoch, &mut crit)
            })
        });
        if let Some(e) = self.shared.take_failure() {
            return Err(e);
        }
        r.map_err(train_error)
    }

    /// Every node's rows out of layer `upto - 1` (no training; `None`: the output layer's): a
    /// float32 array `[nodes, width]`.
    #[pyo3(signature = (upto=None))]
    fn predict<'py>(&mut self, py: Python<'py>, upto: Option<usize>) -> PyResult<Bound<'py, PyArray2<f32>>> {
        let layers = self.cell.with_dependent_mut(|_, ex| ex.model.layers());
        let upto = upto.unwrap_or(layers);
        if !(1..=layers).contains(&upto) {
            return Err(value_error(format!(
                "layer {}: the model has layers 0 to {}",
                upto as i64 - 1,
                layers - 1
            )));
        }
        let (n, w) = (self.nodes, self.cell.with_dependent_mut(|_, ex| ex.model.dim(upto)));
        let mut out = vec![0f32; n * w];
        let r = crate::trainer::without_gil(py, || {
            self.cell.with_dependent_mut(|_, ex| {
                ex.predict(upto, &|_| true, &mut |ids, rows, width| {
                    for (i, &v) in ids.iter().enumerate() {
                        out[v as usize * w..(v as usize + 1) * w]
                            .copy_from_slice(&rows[i * width..(i + 1) * width]);
                    }
                    Ok(())
                })
            })
        });
        if let Some(e) = self.shared.take_failure() {
            return Err(e);
        }
        r.map_err(train_error)?;
        PyArray1::from_vec(py, out).reshape([n, w])
    }

    /// The number of partitions.
    #[getter]
    fn parts(&mut self) -> usize {
        self.cell.with_dependent_mut(|_, ex| ex.partitioning.parts)
    }

    /// The run's private storage directory, `None` without storage.
    #[getter]
    fn storage_dir(&mut self) -> Option<std::path::PathBuf> {
        self.cell.with_dependent_mut(|_, ex| ex.storage_dir().map(|p| p.to_path_buf()))
    }

    /// Block-file reads and writes so far.
    #[getter]
    fn storage_ops(&mut self) -> (usize, usize) {
        self.cell.with_dependent_mut(|_, ex| ex.storage_ops())
    }
}
