//! `grinnder.Dataset` and `grinnder.load_dataset`: datasets from files (every layout the CLI
//! reads, through its own options) and from arrays in memory — numpy arrays, torch tensors, a
//! PyG `Data` — through the loaders' builder ([`grinnder_graph::io::arrays`]), with their checks
//! and messages.
//!
//! The features are read in place when they are a C-contiguous float32 array (a CPU float32
//! tensor is one, through `.numpy()`): the dataset keeps a reference to the array instead of a
//! copy. Anything else is converted once (`numpy.ascontiguousarray(x, dtype=float32)`). Edges
//! become the CSR (symmetrised, deduplicated, no self loops) and labels one int32 per node,
//! whatever their input.

use std::path::PathBuf;
use std::sync::Arc;

use grinnder_graph::io::arrays::{Arrays, Origins};
use grinnder_graph::io::LoadOptions;
use grinnder_graph::Buf;
use numpy::{PyArray1, PyArray2, PyArrayMethods};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::{graph_error, value_error};

/// A graph with node features, labels and train/valid/test splits, as grinnder trains on it.
#[pyclass(module = "grinnder", frozen)]
pub struct Dataset {
    pub(crate) inner: Arc<grinnder_graph::Dataset>,
    /// Whether the features are read in place from the caller's array.
    #[pyo3(get)]
    features_borrowed: bool,
}

impl Dataset {
    pub(crate) fn new(ds: grinnder_graph::Dataset) -> Dataset {
        let features_borrowed = ds.features.data.is_borrowed();
        Dataset { inner: Arc::new(ds), features_borrowed }
    }
}

/// `obj` as a numpy array: a torch tensor through `detach().cpu().numpy()` (no copy for a CPU
/// tensor), anything else as numpy takes it.
fn numpy_of<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    let py = obj.py();
    if obj.hasattr("detach")? && obj.hasattr("numpy")? {
        return obj.call_method0("detach")?.call_method0("cpu")?.call_method0("numpy");
    }
    py.import("numpy")?.call_method1("asarray", (obj,))
}

/// `obj` as a C-contiguous numpy array of `dtype` (the array itself where it is one).
fn contiguous<'py>(obj: &Bound<'py, PyAny>, dtype: &str) -> PyResult<Bound<'py, PyAny>> {
    let np = obj.py().import("numpy")?;
    let kw = PyDict::new(obj.py());
    kw.set_item("dtype", dtype)?;
    np.call_method("ascontiguousarray", (numpy_of(obj)?,), Some(&kw))
}

/// The shape of a numpy array, refusing other dimension counts with the argument's name.
fn shape_of(arr: &Bound<'_, PyAny>, name: &str, dims: &[&str]) -> PyResult<Vec<usize>> {
    let shape: Vec<usize> = arr.getattr("shape")?.extract()?;
    if shape.len() != dims.len() {
        return Err(value_error(format!(
            "{name}: expected a {}-D array [{}], got shape {shape:?}",
            dims.len(),
            dims.join(", ")
        )));
    }
    Ok(shape)
}

/// `obj` as int64 values: a boolean mask becomes the indices of its true entries; float labels
/// keep NaN as "no label" (-1).
fn int64s(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Vec<i64>> {
    let np = obj.py().import("numpy")?;
    let a = numpy_of(obj)?;
    let kind: String = a.getattr("dtype")?.getattr("kind")?.extract()?;
    let a = match kind.as_str() {
        "b" => np.call_method1("flatnonzero", (a,))?,
        "f" => {
            let nan = np.call_method1("isnan", (&a,))?;
            np.call_method1("where", (nan, -1, a))?
        }
        "i" | "u" => a,
        k => {
            return Err(value_error(format!(
                "{name}: expected integers (or a boolean mask), got dtype kind {k:?}"
            )))
        }
    };
    let a = contiguous(&a, "int64")?;
    let arr = a.cast::<PyArray1<i64>>().map_err(|_| {
        let shape = a.getattr("shape").map_or_else(|_| "?".into(), |s| s.to_string());
        let hint =
            if name == "y" { " (one class per node: multi-label targets are not supported)" } else { "" };
        value_error(format!("{name}: expected a 1-D array, got shape {shape}{hint}"))
    })?;
    let ro = arr.readonly();
    Ok(ro.as_slice().map_err(value_error)?.to_vec())
}

/// Edge weights as float32 values (PyG's `edge_weight`: one per edge, `[E]` or `[E, 1]`).
fn weights_of(obj: &Bound<'_, PyAny>) -> PyResult<Vec<f32>> {
    let a = contiguous(obj, "float32")?;
    let shape: Vec<usize> = a.getattr("shape")?.extract()?;
    if !(shape.len() == 1 || shape.len() == 2 && shape[1] == 1) {
        return Err(value_error(format!(
            "edge_weight: expected one weight per edge, [E], got shape {shape:?}"
        )));
    }
    let a = a.call_method1("reshape", (-1,))?;
    let arr = a.cast::<PyArray1<f32>>().map_err(|e| value_error(format!("edge_weight: {e}")))?;
    let ro = arr.readonly();
    Ok(ro.as_slice().map_err(value_error)?.to_vec())
}

/// A split given as indices or as a boolean mask (not both).
fn split(
    idx: Option<&Bound<'_, PyAny>>,
    mask: Option<&Bound<'_, PyAny>>,
    name: &str,
) -> PyResult<Option<Vec<i64>>> {
    match (idx, mask) {
        (Some(_), Some(_)) => Err(value_error(format!("give {name}_idx or {name}_mask, not both"))),
        (Some(i), None) => int64s(i, &format!("{name}_idx")).map(Some),
        (None, Some(m)) => int64s(m, &format!("{name}_mask")).map(Some),
        (None, None) => Ok(None),
    }
}

/// One of two names for the same argument (ours and PyG's: `valid_mask` and `val_mask`).
fn alias<'a, 'py>(
    ours: Option<&'a Bound<'py, PyAny>>,
    pygs: Option<&'a Bound<'py, PyAny>>,
    our_name: &str,
    pyg_name: &str,
) -> PyResult<Option<&'a Bound<'py, PyAny>>> {
    match (ours, pygs) {
        (Some(_), Some(_)) => {
            Err(value_error(format!("give {our_name} or {pyg_name} (the same split), not both")))
        }
        (a, b) => Ok(a.or(b)),
    }
}

fn load_options(non_finite: &str, allow_split_overlap: bool, directed: bool) -> PyResult<LoadOptions> {
    Ok(LoadOptions {
        build: grinnder_graph::BuildOptions { symmetrise: !directed, ..Default::default() },
        non_finite: match non_finite {
            "refuse" => grinnder_graph::NonFinite::Refuse,
            "report" => grinnder_graph::NonFinite::Report,
            v => return Err(value_error(format!("non_finite={v:?}: use \"refuse\" or \"report\""))),
        },
        allow_split_overlap,
        ..LoadOptions::default()
    })
}

#[pymethods]
impl Dataset {
    /// A dataset from arrays (numpy arrays, torch tensors, or anything numpy takes).
    ///
    /// `edge_index`: int [2, E], source then target of every edge messages use (made
    /// symmetric, without self loops and duplicates, as OGB's loaders do; with
    /// `directed=True` taken as given: each node aggregates over its in-neighbours, PyG's
    /// flow source → target). `edge_weight`: float [E], one weight per edge (PyG's
    /// `edge_weight`, used by GCN as `gcn_norm` uses it; other models refuse it); copies of an
    /// edge (and, made symmetric, an edge and its reverse) are one edge and must have one
    /// weight. `x`: float [N, F];
    /// read in place when it is a C-contiguous float32 array (keep it unchanged), converted once
    /// otherwise. `y`: int [N] (or [N, 1]), -1 (or NaN) for no label; `None`: no labels (a graph
    /// to predict on; give `num_classes`). Splits as index arrays (`train_idx`, …) or boolean
    /// masks (`train_mask`, …); the validation split under PyG's name too (`val_mask`,
    /// `val_idx`). Without a validation split the last epoch is the one reported and saved. Bad shapes, ids out of range, NaN features (unless
    /// `non_finite="report"`) and overlapping splits (unless `allow_split_overlap`) raise
    /// `ValueError` naming the argument and the entry.
    #[staticmethod]
    #[pyo3(signature = (edge_index, x, y=None, train_idx=None, valid_idx=None, test_idx=None, *,
        train_mask=None, valid_mask=None, test_mask=None, val_idx=None, val_mask=None, num_classes=None,
        name="arrays", non_finite="refuse", allow_split_overlap=false, edge_weight=None, directed=false))]
    #[allow(clippy::too_many_arguments)]
    fn from_arrays(
        py: Python<'_>,
        edge_index: &Bound<'_, PyAny>,
        x: &Bound<'_, PyAny>,
        y: Option<&Bound<'_, PyAny>>,
        train_idx: Option<&Bound<'_, PyAny>>,
        valid_idx: Option<&Bound<'_, PyAny>>,
        test_idx: Option<&Bound<'_, PyAny>>,
        train_mask: Option<&Bound<'_, PyAny>>,
        valid_mask: Option<&Bound<'_, PyAny>>,
        test_mask: Option<&Bound<'_, PyAny>>,
        val_idx: Option<&Bound<'_, PyAny>>,
        val_mask: Option<&Bound<'_, PyAny>>,
        num_classes: Option<u32>,
        name: &str,
        non_finite: &str,
        allow_split_overlap: bool,
        edge_weight: Option<&Bound<'_, PyAny>>,
        directed: bool,
    ) -> PyResult<Dataset> {
        let opts = load_options(non_finite, allow_split_overlap, directed)?;
        let weights = edge_weight.map(weights_of).transpose()?;
        // features: read in place where they already are C-contiguous float32
        let xa = contiguous(x, "float32")?;
        let shape = shape_of(&xa, "x", &["nodes", "features"])?;
        let xa = xa.cast_into::<PyArray2<f32>>().map_err(|e| value_error(format!("x: {e}")))?;
        let (ptr, len) = {
            let ro = xa.readonly();
            let s = ro.as_slice().map_err(|e| value_error(format!("x: {e}")))?;
            (s.as_ptr(), s.len())
        };
        let owner: Py<PyArray2<f32>> = xa.unbind();
        // SAFETY: `len` float32 values of a C-contiguous numpy array, which `owner` keeps alive
        // for as long as the dataset lives; the documentation asks the caller not to change
        // them.
        let features = unsafe { Buf::borrowed(Arc::new(owner), ptr, len) }
            .ok_or_else(|| value_error("x: the array's data is not aligned for float32"))?;
        let ei = contiguous(edge_index, "int64")?;
        let es = shape_of(&ei, "edge_index", &["2", "edges"])?;
        if es[0] != 2 {
            return Err(value_error(format!(
                "edge_index: expected shape [2, E], got {es:?} (transpose an [E, 2] array)"
            )));
        }
        let ei = ei.cast_into::<PyArray2<i64>>().map_err(|e| value_error(format!("edge_index: {e}")))?;
        let labels = y.map(|y| int64s(y, "y")).transpose()?;
        let splits = [
            split(train_idx, train_mask, "train")?,
            split(
                alias(valid_idx, val_idx, "valid_idx", "val_idx")?,
                alias(valid_mask, val_mask, "valid_mask", "val_mask")?,
                "valid",
            )?,
            split(test_idx, test_mask, "test")?,
        ];
        let ro = ei.readonly();
        let edges = ro.as_slice().map_err(|e| value_error(format!("edge_index: {e}")))?;
        let a = Arrays {
            edge_index: edges,
            edge_weight: weights.as_deref(),
            features: features.into(),
            dim: shape[1],
            labels: labels.as_deref(),
            splits: [splits[0].as_deref(), splits[1].as_deref(), splits[2].as_deref()],
            num_classes,
        };
        let origins = Origins { whole: name.into(), ..Origins::arguments() };
        let ds = py
            .detach(|| grinnder_graph::io::arrays::dataset(name, a, &origins, &opts))
            .map_err(graph_error)?;
        Ok(Dataset::new(ds))
    }

    /// A dataset from a PyG `Data` (or anything with `edge_index`, `x`, `y` and split masks or
    /// indices): `train_mask`/`train_idx`, `val_mask`/`valid_mask`/`valid_idx`,
    /// `test_mask`/`test_idx`, and `edge_weight` where it has one. The same rules as
    /// `from_arrays` (`directed=True`: the edges as given).
    #[staticmethod]
    #[pyo3(signature = (data, *, num_classes=None, name="pyg", non_finite="refuse", allow_split_overlap=false,
        directed=false))]
    fn from_pyg(
        py: Python<'_>,
        data: &Bound<'_, PyAny>,
        num_classes: Option<u32>,
        name: &str,
        non_finite: &str,
        allow_split_overlap: bool,
        directed: bool,
    ) -> PyResult<Dataset> {
        let get = |names: &[&str]| -> PyResult<Option<Bound<'_, PyAny>>> {
            for n in names {
                if let Ok(v) = data.getattr(*n) {
                    if !v.is_none() {
                        return Ok(Some(v));
                    }
                }
            }
            Ok(None)
        };
        let edge_index = get(&["edge_index"])?.ok_or_else(|| value_error("data has no edge_index"))?;
        let x = get(&["x"])?.ok_or_else(|| value_error("data has no x (node features)"))?;
        let y = get(&["y"])?;
        let masks = [get(&["train_mask"])?, get(&["val_mask", "valid_mask"])?, get(&["test_mask"])?];
        let idx = [get(&["train_idx"])?, get(&["valid_idx", "val_idx"])?, get(&["test_idx"])?];
        Dataset::from_arrays(
            py,
            &edge_index,
            &x,
            y.as_ref(),
            idx[0].as_ref(),
            idx[1].as_ref(),
            idx[2].as_ref(),
            masks[0].as_ref(),
            masks[1].as_ref(),
            masks[2].as_ref(),
            None,
            None,
            num_classes,
            name,
            non_finite,
            allow_split_overlap,
            get(&["edge_weight"])?.as_ref(),
            directed,
        )
    }

    #[getter]
    fn name(&self) -> &str {
        &self.inner.name
    }

    #[getter]
    fn num_nodes(&self) -> usize {
        self.inner.num_nodes()
    }

    /// Directed edges as the dataset holds them: after symmetrisation each undirected edge
    /// counts twice; with `directed=True` each edge once.
    #[getter]
    fn num_edges(&self) -> usize {
        self.inner.graph.num_edges()
    }

    /// Whether the edges were taken as given (`directed=True`) instead of made symmetric.
    #[getter]
    fn directed(&self) -> bool {
        self.inner.directed
    }

    /// The edge weights aligned with `edge_index()` (float32 [E]), or `None` for an
    /// unweighted graph: what PyG's `GCNConv` takes as `edge_weight` to compute what grinnder
    /// computes.
    fn edge_weight<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyArray1<f32>>> {
        self.inner.edge_weight.as_ref().map(|w| PyArray1::from_vec(py, w.to_vec()))
    }

    #[getter]
    fn num_features(&self) -> usize {
        self.inner.features.dim
    }

    #[getter]
    fn num_classes(&self) -> u32 {
        self.inner.num_classes
    }

    /// (train, valid, test) sizes.
    #[getter]
    fn split_sizes(&self) -> (usize, usize, usize) {
        let s = &self.inner.splits;
        (s.train.len(), s.valid.len(), s.test.len())
    }

    /// The node ids of a split ("train", "valid" or "test") as an int64 array.
    fn split<'py>(&self, py: Python<'py>, which: &str) -> PyResult<Bound<'py, PyArray1<i64>>> {
        let s = &self.inner.splits;
        let ids = match which {
            "train" => &s.train,
            "valid" | "val" => &s.valid,
            "test" => &s.test,
            w => return Err(value_error(format!("split {w:?}: use \"train\", \"valid\" or \"test\""))),
        };
        Ok(PyArray1::from_vec(py, ids.iter().map(|&v| v as i64).collect()))
    }

    /// Every directed edge as PyG's `edge_index` (int64 [2, E]: sources, then targets), as the
    /// dataset holds them (symmetric unless `directed`, without self loops and duplicates):
    /// the edges to give PyG to compute what grinnder computes.
    fn edge_index<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, numpy::PyArray2<i64>>> {
        let g = &self.inner.graph;
        let (ptr, cols) = (g.row_ptr(), g.col_idx());
        let e = cols.len();
        let mut v = vec![0i64; 2 * e];
        for t in 0..g.num_nodes() {
            for k in ptr[t] as usize..ptr[t + 1] as usize {
                v[k] = cols[k] as i64;
                v[e + k] = t as i64;
            }
        }
        PyArray1::from_vec(py, v).reshape([2, e])
    }

    /// The node features (float32 [N, F], a copy).
    fn features<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray2<f32>>> {
        let f = &self.inner.features;
        PyArray1::from_vec(py, f.data.to_f32_vec()).reshape([self.inner.num_nodes(), f.dim])
    }

    /// The labels (int32, -1 where none) as a numpy array.
    fn labels<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<i32>> {
        PyArray1::from_vec(py, self.inner.labels.to_vec())
    }

    fn __repr__(&self) -> String {
        let (tr, va, te) = self.split_sizes();
        format!(
            "Dataset({:?}: {} nodes, {} edges, {} features, {} classes, split {tr}/{va}/{te})",
            self.inner.name,
            self.num_nodes(),
            self.num_edges(),
            self.num_features(),
            self.num_classes()
        )
    }
}

/// Loads a dataset the way `grinnder train DATASET` does: a `.grnd` file, an OGB node-property
/// folder, an IGB folder or an npy exchange folder, recognised by its content (`format` forces
/// one: "native", "ogb", "igb", "npy"). Options are the CLI's (`--split`, `--non-finite`, …;
/// `directed=True` is `--directed`: the edges as given, not made symmetric). An npy folder's
/// `edge_weight.npy` gives the edge weights.
/// A file that cannot be read raises `OSError`, bad content `ValueError`, naming the file and
/// the line or byte.
#[pyfunction]
#[pyo3(signature = (path, *, format="auto", split=None, non_finite="refuse", num_nodes=None,
    igb_classes=19, skip_feature_checksums=false, allow_split_overlap=false, num_classes=None,
    directed=false))]
#[allow(clippy::too_many_arguments)]
pub fn load_dataset(
    py: Python<'_>,
    path: PathBuf,
    format: &str,
    split: Option<String>,
    non_finite: &str,
    num_nodes: Option<u64>,
    igb_classes: u32,
    skip_feature_checksums: bool,
    allow_split_overlap: bool,
    num_classes: Option<u32>,
    directed: bool,
) -> PyResult<Dataset> {
    use grinnder_cli::args::{Input, InputFormat, NonFiniteArg};
    let input = Input {
        dataset: Some(path.clone()),
        input_format: match format {
            "auto" => InputFormat::Auto,
            "native" => InputFormat::Native,
            "ogb" => InputFormat::Ogb,
            "igb" => InputFormat::Igb,
            "npy" => InputFormat::Npy,
            f => return Err(value_error(format!("format={f:?}: use auto, native, ogb, igb or npy"))),
        },
        split,
        non_finite: match non_finite {
            "refuse" => NonFiniteArg::Refuse,
            "report" => NonFiniteArg::Report,
            v => return Err(value_error(format!("non_finite={v:?}: use \"refuse\" or \"report\""))),
        },
        num_nodes,
        igb_classes,
        skip_feature_checksums,
        allow_split_overlap,
        num_classes,
        directed,
    };
    let mut opts = input.options().map_err(|e| value_error(format!("{e:#}")))?;
    // an npz archive declaring more than this machine has is refused before it is inflated
    opts.memory_limit = grinnder_cli::load::memory_limit(None);
    let mut ds = py.detach(|| grinnder_graph::io::open(&path, input.format(), &opts)).map_err(graph_error)?;
    grinnder_cli::load::settle_classes(&mut ds, num_classes)
        .map_err(|e| value_error(format!("{e:#}").replace("--num-classes ", "num_classes=")))?;
    Ok(Dataset::new(ds))
}
