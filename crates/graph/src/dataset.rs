//! A dataset for node-property prediction: graph, node features, labels and a split.
//!
//! Invariant (checked by [`Dataset::validate`], which every loader calls): features have
//! `num_nodes × dim` values, labels are `-1` (no label) or in `0..num_classes`, split ids are
//! node ids, ascending and without duplicates inside a split.

use std::path::Path;

use rayon::prelude::*;

use crate::buf::Buf;
use crate::csr::Csr;
use crate::error::{GraphError, Result};
use crate::features::FeatureElem;
pub use crate::features::Features;

/// Label value of a node without a label (OGB writes these as `nan`).
pub const NO_LABEL: i32 = -1;

/// Train, validation and test node ids, each ascending.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Splits {
    pub train: Buf<u32>,
    pub valid: Buf<u32>,
    pub test: Buf<u32>,
}

impl Default for Buf<u32> {
    fn default() -> Self {
        Buf::Owned(Vec::new())
    }
}

impl Splits {
    /// `(name, ids)` for each of the three splits.
    pub fn named(&self) -> [(&'static str, &[u32]); 3] {
        [("train", &self.train), ("valid", &self.valid), ("test", &self.test)]
    }
}

/// A graph with everything needed to train on it.
#[derive(Clone, Debug, PartialEq)]
pub struct Dataset {
    pub name: String,
    pub graph: Csr,
    pub features: Features,
    /// One label per node, [`NO_LABEL`] where unknown.
    pub labels: Buf<i32>,
    pub num_classes: u32,
    pub splits: Splits,
    /// Whether the edges were taken as given (`--directed`: a node aggregates over its
    /// in-neighbours, PyG's flow source → target) instead of made symmetric.
    pub directed: bool,
    /// One weight per stored edge, aligned with `graph.col_idx()` (PyG's `edge_weight`,
    /// crate::edge_weight); `None`: every edge weighs 1.
    pub edge_weight: Option<Buf<f32>>,
}

impl Dataset {
    pub fn num_nodes(&self) -> usize {
        self.graph.num_nodes()
    }

    /// Checks the invariants of the module docs; `origin` names the source in errors.
    pub fn validate(&self, origin: &Path) -> Result<()> {
        let n = self.num_nodes();
        if self.features.dim == 0 || self.features.data.len() != n * self.features.dim {
            return Err(GraphError::invalid(
                origin,
                format!(
                    "features hold {} values, expected {n} nodes × {} columns",
                    self.features.data.len(),
                    self.features.dim
                ),
            ));
        }
        if self.labels.len() != n {
            return Err(GraphError::invalid(origin, format!("{} labels for {n} nodes", self.labels.len())));
        }
        let c = self.num_classes as i32;
        if let Some(v) = self.labels.par_iter().position_first(|&y| y < NO_LABEL || y >= c) {
            return Err(GraphError::invalid(
                origin,
                format!("label of node {v} is {}, outside 0..{c} (or -1 for none)", self.labels[v]),
            ));
        }
        for (name, ids) in self.splits.named() {
            check_split(origin, name, ids, n)?;
        }
        self.validate_weights(origin)
    }

    /// One finite, non-negative weight per stored edge, where there are weights.
    fn validate_weights(&self, origin: &Path) -> Result<()> {
        let Some(w) = &self.edge_weight else { return Ok(()) };
        if w.len() != self.graph.num_edges() {
            return Err(GraphError::invalid(
                origin,
                format!("{} edge weights for {} stored edges", w.len(), self.graph.num_edges()),
            ));
        }
        if let Some((e, x)) = crate::edge_weight::find_bad(w) {
            return Err(GraphError::invalid(
                origin,
                format!("weight of stored edge {e} is {x}: edge weights are finite and not negative"),
            ));
        }
        Ok(())
    }
}

impl Splits {
    /// The first node in two splits: `(node, first split's name, second's)`.
    pub fn overlap(&self) -> Option<(u32, &'static str, &'static str)> {
        let named = self.named();
        for a in 0..3 {
            for b in a + 1..3 {
                let (x, y) = (named[a].1, named[b].1);
                // both ascending: a merge walk
                let (mut i, mut j) = (0, 0);
                while i < x.len() && j < y.len() {
                    match x[i].cmp(&y[j]) {
                        std::cmp::Ordering::Less => i += 1,
                        std::cmp::Ordering::Greater => j += 1,
                        std::cmp::Ordering::Equal => return Some((x[i], named[a].0, named[b].0)),
                    }
                }
            }
        }
        None
    }

    /// Refuses splits that share a node (evaluation would see training nodes) unless `allow`,
    /// which only warns.
    pub fn check_disjoint(&self, origin: &Path, allow: bool) -> Result<()> {
        let Some((v, a, b)) = self.overlap() else { return Ok(()) };
        if allow {
            tracing::warn!(
                "{}: node {v} is in both the {a} and the {b} split (kept: --allow-split-overlap)",
                origin.display()
            );
            return Ok(());
        }
        Err(GraphError::invalid(
            origin,
            format!(
                "node {v} is in both the {a} and the {b} split, so evaluation would see training \
                 nodes; fix the splits, or train anyway with --allow-split-overlap (in Python \
                 allow_split_overlap=True)"
            ),
        ))
    }
}

/// A split must hold ascending, distinct node ids below `n`.
pub(crate) fn check_split(origin: &Path, name: &str, ids: &[u32], n: usize) -> Result<()> {
    if let Some(i) = ids.iter().position(|&v| v as usize >= n) {
        return Err(GraphError::invalid(
            origin,
            format!("{name} split: entry {i} is node {}, but there are {n} nodes", ids[i]),
        ));
    }
    if let Some(i) = ids.windows(2).position(|w| w[0] >= w[1]) {
        let node = ids[i + 1];
        let msg = if ids[i] != node {
            format!("{name} split: node {node} at entry {} is not ascending", i + 1)
        } else if node <= 1 {
            // 0 and 1 listed again and again: a mask (one flag per node) read as node ids
            format!(
                "{name} split: node {node} is duplicated (listed more than once); if this is a mask (one 0/1 per node), give it with dtype bool (numpy `mask.astype(bool)`): {name}_mask= in Python, {name}_mask.npy in an npy folder"
            )
        } else {
            format!("{name} split: node {node} is duplicated (listed more than once)")
        };
        return Err(GraphError::invalid(origin, msg));
    }
    Ok(())
}

/// Sorts split ids and reports a duplicate (loaders accept unsorted split files).
pub(crate) fn normalise_split(origin: &Path, name: &str, mut ids: Vec<u32>, n: usize) -> Result<Vec<u32>> {
    ids.par_sort_unstable();
    check_split(origin, name, &ids, n)?;
    Ok(ids)
}

/// What to do with NaN or infinite feature values.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum NonFinite {
    /// Refuse the dataset, naming the first bad value.
    #[default]
    Refuse,
    /// Keep the values and report how many there are.
    Report,
}

/// The first non-finite value in row-major features: `(row, column)`.
pub fn find_non_finite<E: FeatureElem>(data: &[E], dim: usize) -> Option<(usize, usize)> {
    data.par_iter().position_first(|x| !x.to_f32().is_finite()).map(|i| (i / dim, i % dim))
}

/// Applies the policy; `Report` logs the count and returns it.
pub(crate) fn check_non_finite<E: FeatureElem>(
    origin: &Path,
    data: &[E],
    dim: usize,
    policy: NonFinite,
) -> Result<usize> {
    match policy {
        NonFinite::Refuse => match find_non_finite(data, dim) {
            Some((r, c)) => Err(GraphError::invalid(
                origin,
                format!(
                    "feature of node {r}, column {c} is {} (keep such values with --non-finite report, in Python non_finite=\"report\")",
                    data[r * dim + c].to_f32()
                ),
            )),
            None => Ok(0),
        },
        NonFinite::Report => {
            let count = data.par_iter().filter(|x| !x.to_f32().is_finite()).count();
            if count > 0 {
                tracing::warn!("{}: {count} non-finite feature values kept", origin.display());
            }
            Ok(count)
        }
    }
}
