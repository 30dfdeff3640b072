//! The npy exchange layout (docs/datasets.md), read by the PyG baseline script
//! (`bench/pyg_baseline.py`):
//!
//! ```text
//! edge_index.npy  int64 [2, E]   row 0 source, row 1 target; symmetrised (unless --directed),
//!                                no self loops or duplicates
//! edge_weight.npy float32 [E]    optional: one weight per edge of edge_index (PyG's edge_weight)
//! node_feat.npy   float32 [N, F]
//! node_label.npy  int64 [N]      (-1: no label)
//! train_idx.npy, valid_idx.npy, test_idx.npy   int64 node ids
//!   or train_mask.npy, valid_mask.npy, test_mask.npy   bool [N] (PyG's masks)
//!   (PyG's name val_mask.npy / val_idx.npy for the validation split is read too)
//! ```
//! Reading maps `node_feat.npy` (zero-copy); writing streams every array.

use std::path::Path;

use rayon::prelude::*;

use super::arrays::{Arrays, Origins};
use super::native::FeatureSource;
use super::npy::{DType, Npy, NpyWriter};
use super::LoadOptions;
use crate::buf::Buf;
use crate::csr::Csr;
use crate::dataset::{Dataset, Splits};
use crate::error::{GraphError, Result};
use crate::features::FeatureDtype;
use crate::progress;

/// True when `dir` holds any file of the layout (what is missing is named when loading).
pub fn is_exchange_dir(dir: &Path) -> bool {
    ["edge_index.npy", "node_feat.npy", "node_label.npy"].iter().any(|f| dir.join(f).is_file())
}

/// Turns `(src, dst)` pairs into u32 arrays, refusing ids outside `0..n` with the pair's index.
pub(crate) fn checked_pairs(
    path: &Path,
    pairs: impl Iterator<Item = (i64, i64)>,
    n: u64,
) -> Result<(Vec<u32>, Vec<u32>)> {
    let (lo, hi) = pairs.size_hint();
    let cap = hi.unwrap_or(lo);
    let (mut src, mut dst) = (Vec::with_capacity(cap), Vec::with_capacity(cap));
    for (i, (s, d)) in pairs.enumerate() {
        for v in [s, d] {
            if v < 0 || v as u64 >= n {
                return Err(GraphError::invalid(path, format!("edge {i}: node id {v} is outside 0..{n}")));
            }
        }
        src.push(s as u32);
        dst.push(d as u32);
    }
    Ok((src, dst))
}

/// The layout, as a message listing it.
pub const LAYOUT: &str = "edge_index.npy (integers [2, E]: sources, then targets; optionally edge_weight.npy, floats [E]), node_feat.npy (floats [N, F]), node_label.npy (integers [N], -1: no label), and per split train/valid/test either {split}_idx.npy (node ids) or {split}_mask.npy (bool [N]; PyG's val_mask.npy for valid)";

const SPLITS: [&str; 3] = ["train", "valid", "test"];

/// The files of the layout in `dir`, or an error naming what is missing and the whole layout.
fn origins(dir: &Path) -> Result<Origins> {
    let mut missing = Vec::new();
    let mut file = |name: &str| {
        let p = dir.join(name);
        if !p.exists() {
            missing.push(name.to_string());
        }
        p
    };
    let (edges, features, labels) = (file("edge_index.npy"), file("node_feat.npy"), file("node_label.npy"));
    let mut splits = SPLITS.map(|s| dir.join(format!("{s}_idx.npy")));
    for (k, s) in SPLITS.iter().enumerate() {
        // ours, then PyG's name for the validation split (`val_mask`)
        let bases: &[&str] = if *s == "valid" { &["valid", "val"] } else { &[s] };
        let names: Vec<String> =
            bases.iter().flat_map(|n| [format!("{n}_idx.npy"), format!("{n}_mask.npy")]).collect();
        let here: Vec<&String> = names.iter().filter(|n| dir.join(n).exists()).collect();
        match here[..] {
            [one] => splits[k] = dir.join(one),
            [] => missing.push(format!("{s}_idx.npy (or {})", names[1..].join(", "))),
            _ => {
                let here: Vec<&str> = here.iter().map(|n| n.as_str()).collect();
                return Err(GraphError::invalid(
                    dir,
                    format!("{} are all here and each gives the {s} split: keep one", here.join(" and ")),
                ));
            }
        }
    }
    if !missing.is_empty() {
        return Err(GraphError::invalid(
            dir,
            format!("an npy dataset folder is missing {}; the layout is {LAYOUT}", missing.join(", ")),
        ));
    }
    Ok(Origins {
        whole: dir.to_path_buf(),
        edges,
        features,
        labels,
        splits,
        edge_weight: dir.join("edge_weight.npy"),
    })
}

/// A split's node ids from its file: ids as stored, or the positions of a boolean mask's true
/// entries (PyG's `train_mask`, saved by numpy with dtype bool).
fn split_ids(path: &Path, n: u64) -> Result<Vec<i64>> {
    let npy = Npy::open(path)?;
    // a 0-d array is one number, not a list of nodes
    npy.expect_shape(&["nodes"])?;
    let is_mask_name = path.file_name().is_some_and(|f| f.to_string_lossy().ends_with("_mask.npy"));
    if npy.dtype != DType::Bool && !is_mask_name {
        return npy.to_i64();
    }
    if npy.shape[0] != n {
        return Err(GraphError::invalid(
            path,
            format!("a mask has one entry per node: {} entries for {n} nodes", npy.shape[0]),
        ));
    }
    let flags = npy.to_i64()?;
    if let Some(i) = flags.iter().position(|&f| f != 0 && f != 1) {
        return Err(GraphError::invalid(
            path,
            format!("a mask holds 0 or 1 per node: entry {i} is {}", flags[i]),
        ));
    }
    Ok(flags.iter().enumerate().filter(|(_, &f)| f == 1).map(|(i, _)| i as i64).collect())
}

/// The edge weights of `edge_weight.npy` where the folder has one: floats `[E]` (or `[E, 1]`),
/// float64 narrowed to float32.
fn read_weights(path: &Path) -> Result<Option<Buf<f32>>> {
    if !path.exists() {
        return Ok(None);
    }
    let npy = Npy::open(path)?;
    let one_col = npy.shape.len() == 2 && npy.shape[1] == 1;
    if !(npy.shape.len() == 1 || one_col) {
        return Err(GraphError::format(
            path,
            0,
            format!("expected shape [E] (one weight per edge of edge_index.npy), found {:?}", npy.shape),
        ));
    }
    if !matches!(npy.dtype, DType::F32 | DType::F64) {
        return Err(GraphError::format(
            path,
            0,
            format!("expected float32 or float64 weights, found {:?}", npy.dtype),
        ));
    }
    npy.to_f32().map(Some)
}

/// Loads an exchange-layout folder (through [`super::arrays::dataset`]: the checks and messages
/// of arrays handed over in memory, naming the files).
pub fn load(dir: &Path, opts: &LoadOptions) -> Result<Dataset> {
    let o = origins(dir)?;
    let feats = Npy::open(&o.features)?;
    feats.expect_shape(&["nodes", "features"])?;
    let (n, dim) = (feats.shape[0], feats.shape[1] as usize);
    crate::csr::check_node_count(n)?;
    if dim == 0 {
        return Err(GraphError::format(&o.features, 0, "zero feature columns"));
    }
    let features = feats.to_features()?;
    let lab = Npy::open(&o.labels)?;
    let one_col = lab.shape.len() == 2 && lab.shape[1] == 1;
    if !(lab.shape.len() == 1 || one_col) {
        return Err(GraphError::format(&o.labels, 0, format!("expected shape [{n}], found {:?}", lab.shape)));
    }
    if lab.shape[0] != n {
        // either file may be the one that is wrong: name both
        return Err(GraphError::format(
            &o.labels,
            0,
            format!(
                "{} labels here, but node_feat.npy has {n} rows: both hold one row per node (N), so one of them is cut short or too long",
                lab.shape[0]
            ),
        ));
    }
    let labels = lab.to_labels()?;
    let edges = Npy::open(&o.edges)?;
    edges.expect_shape(&["2", "edges"])?;
    if edges.shape[0] != 2 {
        return Err(GraphError::format(
            &o.edges,
            0,
            format!(
                "expected shape [2, E], found {:?}{}",
                edges.shape,
                if edges.shape[1] == 2 {
                    " (an [E, 2] array: save its transpose, numpy.save(path, edge_index.T))"
                } else {
                    ""
                }
            ),
        ));
    }
    let edge_index = edges.to_i64()?;
    let edge_weight = read_weights(&o.edge_weight)?;
    let splits = o.splits.iter().map(|p| split_ids(p, n)).collect::<Result<Vec<_>>>()?;
    let a = Arrays {
        edge_index: &edge_index,
        edge_weight: edge_weight.as_deref(),
        features,
        dim,
        labels: Some(&labels),
        splits: [Some(&splits[0]), Some(&splits[1]), Some(&splits[2])],
        num_classes: None,
    };
    let name = dir.file_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    super::arrays::dataset(&name, a, &o, opts)
}

/// Writes the exchange layout in one forward pass: sources (the CSR's columns) streamed first,
/// then targets from the row pointer, then the rest.
pub struct ExchangeWriter {
    dir: std::path::PathBuf,
    edges: NpyWriter,
    written: u64,
    /// How the features are stored (`None`: as the source stores them).
    feature_dtype: Option<FeatureDtype>,
}

impl ExchangeWriter {
    /// Starts `dir` for a graph of `num_edges` directed edges.
    pub fn create(dir: &Path, num_edges: u64) -> Result<ExchangeWriter> {
        super::files::create_folder(dir).map_err(|e| GraphError::io(dir, e))?;
        let edges = NpyWriter::create(&dir.join("edge_index.npy"), DType::I64, &[2, num_edges])?;
        Ok(ExchangeWriter { dir: dir.to_path_buf(), edges, written: 0, feature_dtype: None })
    }

    /// Stores the features as `dtype` (float32 or float16: numpy has no bfloat16, whose values
    /// are written as float32) instead of as the source stores them.
    pub fn with_feature_dtype(mut self, dtype: Option<FeatureDtype>) -> ExchangeWriter {
        self.feature_dtype = dtype;
        self
    }

    /// Appends column indices (rows in order).
    pub fn push_cols(&mut self, cols: &[u32]) -> Result<()> {
        for c in cols.chunks(1 << 22) {
            let v: Vec<i64> = c.par_iter().map(|&x| x as i64).collect();
            self.edges.write(&v)?;
        }
        self.written += cols.len() as u64;
        Ok(())
    }

    /// Writes the targets and the other arrays.
    pub fn finish(
        mut self,
        row_ptr: &[u64],
        labels: &[i32],
        splits: &Splits,
        features: &dyn FeatureSource,
    ) -> Result<()> {
        let n = row_ptr.len() - 1;
        assert_eq!(row_ptr[n], self.written, "row_ptr ends at the number of columns written");
        for rows in crate::sort::balanced_ranges(row_ptr, (self.written as usize >> 22).max(1)) {
            let v: Vec<i64> = rows
                .into_par_iter()
                .flat_map_iter(|r| std::iter::repeat_n(r as i64, (row_ptr[r + 1] - row_ptr[r]) as usize))
                .collect();
            self.edges.write(&v)?;
        }
        self.edges.finish()?;
        let dir = &self.dir;
        let dim = features.dim();
        // numpy has float16 but no bfloat16: bfloat16 values are written as float32
        let narrow = self.feature_dtype.unwrap_or(features.stored_dtype()) == FeatureDtype::F16;
        let (dtype, size) = if narrow { (DType::F16, 2) } else { (DType::F32, 4) };
        let mut w = NpyWriter::create(&dir.join("node_feat.npy"), dtype, &[n as u64, dim as u64])?;
        let rows_per = ((32 << 20) / (dim * 4)).max(1);
        let pb = progress::bar((n * dim * size) as u64, "features", true);
        let mut buf = Vec::new();
        for r0 in (0..n).step_by(rows_per) {
            let k = rows_per.min(n - r0);
            buf.resize(k * dim, 0f32);
            features.fill(r0, &mut buf)?;
            if narrow {
                w.write(&buf.par_iter().map(|&x| half::f16::from_f32(x)).collect::<Vec<_>>())?;
            } else {
                w.write(&buf)?;
            }
            pb.inc((k * dim * size) as u64);
        }
        pb.finish_and_clear();
        w.finish()?;
        let lab: Vec<i64> = labels.iter().map(|&y| y as i64).collect();
        super::npy::write_array(&dir.join("node_label.npy"), DType::I64, &[n as u64], &lab)?;
        for (name, ids) in splits.named() {
            let v: Vec<i64> = ids.iter().map(|&x| x as i64).collect();
            super::npy::write_array(&dir.join(format!("{name}_idx.npy")), DType::I64, &[v.len() as u64], &v)?;
        }
        Ok(())
    }
}

/// Writes the exchange layout of an in-memory graph; features are streamed from `features`.
pub fn write(
    dir: &Path,
    graph: &Csr,
    labels: &[i32],
    splits: &Splits,
    features: &dyn FeatureSource,
) -> Result<()> {
    let mut w = ExchangeWriter::create(dir, graph.num_edges() as u64)?;
    w.push_cols(graph.col_idx())?;
    w.finish(graph.row_ptr(), labels, splits, features)
}

/// Writes an in-memory dataset (its edge weights, where it has them, as `edge_weight.npy` in
/// the order of `edge_index.npy`).
pub fn save(ds: &Dataset, dir: &Path) -> Result<()> {
    write(dir, &ds.graph, &ds.labels, &ds.splits, &ds.features)?;
    match &ds.edge_weight {
        Some(w) => super::npy::write_array(&dir.join("edge_weight.npy"), DType::F32, &[w.len() as u64], w),
        None => Ok(()),
    }
}
