//! The IGB (Illinois Graph Benchmark) homogeneous layout:
//!
//! ```text
//! <dir>/processed/paper/node_feat.npy            [N, 1024] float32 (raw, headerless, for large/full)
//! <dir>/processed/paper/node_label_19.npy        [N]  (19 classes; node_label_2K.npy for 2983)
//! <dir>/processed/paper__cites__paper/edge_index.npy   [E, 2] int64, citing → cited
//! ```
//! The split is IGB's own: the first 60 % of nodes train, the next 20 % validate, the rest test.
//! A headerless feature file is mapped with the node count (from the labels, or `num_nodes`)
//! and a width inferred from its size.

use std::path::Path;

use super::npy::{DType, Npy, NpyWriter};
use super::LoadOptions;
use crate::csr::Csr;
use crate::dataset::{check_non_finite, Dataset, Features, Splits, NO_LABEL};
use crate::error::{GraphError, Result};

/// True when `dir` holds an IGB `processed/paper` folder.
pub fn is_igb_dir(dir: &Path) -> bool {
    dir.join("processed/paper/node_feat.npy").is_file()
}

fn label_file(classes: u32) -> Result<&'static str> {
    match classes {
        19 => Ok("node_label_19.npy"),
        2983 => Ok("node_label_2K.npy"),
        other => Err(GraphError::Usage(format!("IGB has 19 or 2983 classes, not {other}"))),
    }
}

/// IGB's split sizes for `n` nodes.
fn igb_split(n: usize) -> Splits {
    let n_train = (n as f64 * 0.6) as usize;
    let n_valid = (n as f64 * 0.2) as usize;
    let range = |a: usize, b: usize| (a as u32..b as u32).collect::<Vec<u32>>().into();
    Splits {
        train: range(0, n_train),
        valid: range(n_train, n_train + n_valid),
        test: range(n_train + n_valid, n),
    }
}

/// Loads an IGB dataset folder (the one holding `processed/`).
pub fn load(dir: &Path, opts: &LoadOptions) -> Result<Dataset> {
    let paper = dir.join("processed/paper");
    let label_path = paper.join(label_file(opts.igb_classes)?);
    let labels_npy = Npy::open(&label_path)?;
    let raw_labels = labels_npy.to_labels()?;
    let n = opts.num_nodes.unwrap_or(raw_labels.len() as u64);
    crate::csr::check_node_count(n)?;
    if raw_labels.len() as u64 != n {
        return Err(GraphError::invalid(&label_path, format!("{} labels for {n} nodes", raw_labels.len())));
    }
    let mut labels = Vec::with_capacity(n as usize);
    for (i, &y) in raw_labels.iter().enumerate() {
        if y < NO_LABEL as i64 || y >= opts.igb_classes as i64 {
            return Err(GraphError::invalid(
                &label_path,
                format!("label of node {i} is {y}, outside 0..{}", opts.igb_classes),
            ));
        }
        labels.push(y as i32);
    }

    let feat_path = paper.join("node_feat.npy");
    let feats = if Npy::has_header(&feat_path)? {
        Npy::open(&feat_path)?
    } else {
        let len = std::fs::metadata(&feat_path).map_err(|e| GraphError::io(&feat_path, e))?.len();
        let row = n * 4;
        if n == 0 || len % row != 0 {
            return Err(GraphError::format(
                &feat_path,
                len,
                format!("headerless feature file of {len} bytes is not {n} rows of float32"),
            ));
        }
        Npy::open_raw(&feat_path, DType::F32, vec![n, len / row])?
    };
    feats.expect_shape(&["nodes", "features"])?;
    if feats.shape[0] != n {
        return Err(GraphError::format(
            &feat_path,
            0,
            format!("{} feature rows for {n} nodes", feats.shape[0]),
        ));
    }
    let dim = feats.shape[1] as usize;
    let data = feats.to_features()?;
    crate::with_feature_buf!(&data, f => check_non_finite(&feat_path, f, dim, opts.non_finite))?;

    let edge_path = dir.join("processed/paper__cites__paper/edge_index.npy");
    let edges = Npy::open(&edge_path)?;
    edges.expect_shape(&["edges", "2"])?;
    if edges.shape[1] != 2 {
        return Err(GraphError::format(
            &edge_path,
            0,
            format!("expected shape [E, 2], found {:?}", edges.shape),
        ));
    }
    let flat = edges.to_i64()?;
    let (src, dst) =
        super::exchange::checked_pairs(&edge_path, flat.chunks_exact(2).map(|p| (p[0], p[1])), n)?;
    let spin = crate::progress::spinner("csr");
    let graph = Csr::from_edges(n, &src, &dst, opts.build)?;
    spin.finish_and_clear();
    let ds = Dataset {
        name: dir.file_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "igb".into()),
        graph,
        features: Features { dim, data },
        labels: labels.into(),
        num_classes: opts.igb_classes,
        splits: igb_split(n as usize),
        directed: !opts.build.symmetrise,
        edge_weight: None,
    };
    ds.validate(dir)?;
    Ok(ds)
}

/// Writes `ds` in the IGB layout (labels as float32 in the 19-class file, or the 2K file for
/// more classes; features headerless when `raw`), for tests
/// and for feeding IGB-layout tools. The split is not written: IGB derives it from node order.
pub fn write(ds: &Dataset, dir: &Path, raw: bool) -> Result<()> {
    let paper = dir.join("processed/paper");
    let cites = dir.join("processed/paper__cites__paper");
    for d in [&paper, &cites] {
        super::files::create_folder(d).map_err(|e| GraphError::io(d, e))?;
    }
    let n = ds.num_nodes() as u64;
    let feat_path = paper.join("node_feat.npy");
    if raw {
        // IGB's headerless layout is float32
        let data = ds.features.data.to_dtype(crate::FeatureDtype::F32);
        super::files::write_whole(&feat_path, data.as_bytes()).map_err(|e| GraphError::io(&feat_path, e))?;
    } else {
        let f = &ds.features;
        let dtype = if f.dtype() == crate::FeatureDtype::F16 { DType::F16 } else { DType::F32 };
        let mut w = NpyWriter::create(&feat_path, dtype, &[n, f.dim as u64])?;
        match &f.data {
            crate::FeatureData::F16(b) => w.write(b)?,
            other => w.write(other.to_dtype(crate::FeatureDtype::F32).as_bytes())?,
        }
        w.finish()?;
    }
    let labels: Vec<f32> =
        ds.labels.iter().map(|&y| if y == NO_LABEL { f32::NAN } else { y as f32 }).collect();
    let classes = if ds.num_classes <= 19 { 19 } else { 2983 };
    super::npy::write_array(&paper.join(label_file(classes)?), DType::F32, &[n], &labels)?;
    let (src, dst) = ds.graph.to_coo();
    let pairs: Vec<i64> =
        src.iter().zip(&dst).filter(|(s, d)| s < d).flat_map(|(&s, &d)| [s as i64, d as i64]).collect();
    super::npy::write_array(&cites.join("edge_index.npy"), DType::I64, &[pairs.len() as u64 / 2, 2], &pairs)
}
