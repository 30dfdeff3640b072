//! A dataset from arrays in memory: what the npy exchange loader reads from its files and what
//! the Python package is handed (numpy arrays, torch tensors). One builder, so both get the
//! same checks and the same messages: edge ids in range (naming the edge), labels in range
//! (naming the node), features finite unless told otherwise (naming node and column), splits
//! in range, without repeats, disjoint unless allowed.
//!
//! The features are taken as they are (a [`Buf`]: owned, a file mapping, or memory another
//! owner keeps alive) — never copied here.

use std::path::{Path, PathBuf};

use rayon::prelude::*;

use super::LoadOptions;
use crate::buf::Buf;
use crate::csr::Csr;
use crate::dataset::{check_non_finite, normalise_split, Dataset, Features, Splits};
use crate::error::{GraphError, Result};
use crate::features::FeatureData;

/// Where each array came from, for messages (a file, or an argument's name).
#[derive(Clone, Debug)]
pub struct Origins {
    /// The whole (a folder, or the dataset's name).
    pub whole: PathBuf,
    pub edges: PathBuf,
    pub features: PathBuf,
    pub labels: PathBuf,
    pub splits: [PathBuf; 3],
    pub edge_weight: PathBuf,
}

impl Origins {
    /// Arrays named as a function's arguments: `edge_index`, `x`, `y`, `train_idx`, ….
    pub fn arguments() -> Origins {
        Origins {
            whole: "arrays".into(),
            edges: "edge_index".into(),
            features: "x".into(),
            labels: "y".into(),
            splits: ["train_idx".into(), "valid_idx".into(), "test_idx".into()],
            edge_weight: "edge_weight".into(),
        }
    }
}

/// The arrays of a node-property dataset.
pub struct Arrays<'a> {
    /// Sources then targets (`[2, E]` row-major, as PyG's `edge_index`): every directed edge
    /// messages use; symmetrised, deduplicated and freed of self loops as `opts.build` says.
    pub edge_index: &'a [i64],
    /// One weight per edge of `edge_index` (PyG's `edge_weight`), in its order; `None`:
    /// unweighted. Merged as the edges are ([`crate::edge_weight`]).
    pub edge_weight: Option<&'a [f32]>,
    /// `N × dim` row-major, float32 or narrower.
    pub features: FeatureData,
    pub dim: usize,
    /// One per node, `-1` for none; `None`: no node has a label.
    pub labels: Option<&'a [i64]>,
    /// Train, valid and test node ids (`None`: an empty split).
    pub splits: [Option<&'a [i64]>; 3],
    /// Classes when no label says (a graph to predict on): at least one more than the largest
    /// label.
    pub num_classes: Option<u32>,
}

/// The dataset of `a`, checked (see the module docs); `name` is its name.
pub fn dataset(name: &str, a: Arrays<'_>, o: &Origins, opts: &LoadOptions) -> Result<Dataset> {
    let dim = a.dim;
    if dim == 0 {
        return Err(GraphError::invalid(&o.features, "zero feature columns"));
    }
    if a.features.len() % dim != 0 {
        return Err(GraphError::invalid(
            &o.features,
            format!("{} values do not make rows of {dim} features", a.features.len()),
        ));
    }
    let n = (a.features.len() / dim) as u64;
    crate::csr::check_node_count(n)?;
    crate::with_feature_buf!(&a.features, f => check_non_finite(&o.features, f, dim, opts.non_finite))?;
    let labels = labels(a.labels, n as usize, &o.labels)?;
    let seen = (labels.iter().copied().max().unwrap_or(-1) + 1).max(0) as u32;
    let num_classes = match a.num_classes {
        Some(c) if c < seen => {
            return Err(GraphError::invalid(
                &o.labels,
                format!("labels go up to {}, more than {c} classes", seen - 1),
            ))
        }
        Some(c) => c,
        None => seen,
    };
    if a.edge_index.len() % 2 != 0 {
        return Err(GraphError::invalid(&o.edges, format!("{} ids do not make [2, E]", a.edge_index.len())));
    }
    crate::csr::check_node_count(n)?;
    // read in place: ids checked here, then the CSR built from them without a copy of the list
    let (src, dst) = a.edge_index.split_at(a.edge_index.len() / 2);
    let bad = |v: i64| v < 0 || v as u64 >= n;
    if let Some(i) = (0..src.len()).into_par_iter().find_first(|&i| bad(src[i]) || bad(dst[i])) {
        let v = if bad(src[i]) { src[i] } else { dst[i] };
        return Err(GraphError::invalid(&o.edges, format!("edge {i}: node id {v} is outside 0..{n}")));
    }
    let spin = crate::progress::spinner("csr");
    let pair = |i: usize| (src[i] as u32, dst[i] as u32);
    let graph = Csr::from_pairs(n, src.len(), pair, opts.build);
    spin.finish_and_clear();
    let edge_weight = a.edge_weight.map(|w| weights(&graph, w, (src.len(), pair), o, opts)).transpose()?;
    let [train, valid, test] = a.splits;
    let split = |ids: Option<&[i64]>, k: usize, what: &str| -> Result<Buf<u32>> {
        let v = split_ids(&o.splits[k], ids.unwrap_or(&[]), n)?;
        Ok(normalise_split(&o.splits[k], what, v, n as usize)?.into())
    };
    let splits = Splits {
        train: split(train, 0, "train")?,
        valid: split(valid, 1, "valid")?,
        test: split(test, 2, "test")?,
    };
    let ds = Dataset {
        name: name.to_string(),
        graph,
        features: Features { dim, data: a.features },
        labels: labels.into(),
        num_classes,
        splits,
        directed: !opts.build.symmetrise,
        edge_weight: edge_weight.map(Buf::Owned),
    };
    ds.validate(&o.whole)?;
    ds.splits.check_disjoint(&o.whole, opts.allow_split_overlap)?;
    Ok(ds)
}

/// The weight of every entry of `graph`, built from the `len` edges `pair(i)`: one finite,
/// non-negative weight per edge, the copies of an edge agreeing (errors name the edge, and
/// both arrays where the counts differ).
fn weights(
    graph: &Csr,
    w: &[f32],
    (len, pair): (usize, impl Fn(usize) -> (u32, u32) + Sync),
    o: &Origins,
    opts: &LoadOptions,
) -> Result<Vec<f32>> {
    if w.len() != len {
        return Err(GraphError::invalid(
            &o.edge_weight,
            format!(
                "{} weights, but {} has {len} edges: one weight per edge (per column of edge_index), in its order",
                w.len(),
                o.edges.display()
            ),
        ));
    }
    if let Some((i, x)) = crate::edge_weight::find_bad(w) {
        return Err(GraphError::invalid(
            &o.edge_weight,
            format!("the weight of edge {i} is {x}: edge weights must be finite and not negative"),
        ));
    }
    crate::edge_weight::align(graph, len, pair, |i| w[i], opts.build)
        .map_err(|d| GraphError::invalid(&o.edge_weight, d.message(!opts.build.symmetrise)))
}

/// Labels as the dataset keeps them: `-1` or a class id, one per node.
fn labels(raw: Option<&[i64]>, n: usize, origin: &Path) -> Result<Vec<i32>> {
    let Some(raw) = raw else { return Ok(vec![crate::NO_LABEL; n]) };
    if raw.len() != n {
        return Err(GraphError::invalid(origin, format!("{} labels for {n} nodes", raw.len())));
    }
    if let Some(i) = raw.iter().position(|&y| y < -1 || y >= i32::MAX as i64) {
        return Err(GraphError::invalid(origin, format!("label of node {i} is {}, out of range", raw[i])));
    }
    Ok(raw.iter().map(|&y| y as i32).collect())
}

/// A split's node ids as `u32`, each checked in `0..n` (an error names the entry).
pub(crate) fn split_ids(origin: &Path, ids: &[i64], n: u64) -> Result<Vec<u32>> {
    match ids.par_iter().position_first(|&v| v < 0 || v as u64 >= n) {
        Some(i) => {
            Err(GraphError::invalid(origin, format!("entry {i}: node id {} is outside 0..{n}", ids[i])))
        }
        None => Ok(ids.par_iter().map(|&v| v as u32).collect()),
    }
}
