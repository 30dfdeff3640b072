//! What a training run is given: the configuration, the errors it can stop with, and the
//! checks a dataset passes before any trainer starts.

use grinnder_graph::{Dataset, NO_LABEL};
use grinnder_nn::{LrSchedule, ModelConfig, OptimConfig};
use serde::{Deserialize, Serialize};

/// Everything the trainer needs, validated by the caller (the CLI).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainConfig {
    pub model: ModelConfig,
    pub optim: OptimConfig,
    pub epochs: usize,
    /// Evaluate every this many epochs and after the last; 0: never.
    pub eval_every: usize,
    /// How the learning rate changes over the epochs.
    #[serde(default)]
    pub lr_schedule: LrSchedule,
    /// Stop once this many epochs passed without a better validation accuracy (early
    /// stopping); `None`: train every epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub patience: Option<usize>,
    pub feature_norm: FeatureNorm,
    /// The statistic `feature_norm` uses ([`FeatureNorm::Row`]'s shift), when it is given —
    /// a model file's, from its training graph — instead of computed from the dataset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub feature_shift: Option<f64>,
}

impl TrainConfig {
    /// How the input features are preprocessed.
    pub fn features(&self) -> FeaturePrep {
        FeaturePrep { norm: self.feature_norm, shift: self.feature_shift }
    }
}

/// Feature preprocessing and, when fixed in advance, its statistic (otherwise computed from the
/// dataset it is applied to).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FeaturePrep {
    pub norm: FeatureNorm,
    pub shift: Option<f64>,
}

impl From<FeatureNorm> for FeaturePrep {
    fn from(norm: FeatureNorm) -> FeaturePrep {
        FeaturePrep { norm, shift: None }
    }
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
    /// A model file could not be read, written or used (its message).
    #[error("{0}")]
    ModelFile(String),
    /// The training loss stopped being a number.
    #[error("{0}")]
    Diverged(String),
    #[error("the tiered executor stopped at an earlier error and cannot go on (start again): {0}")]
    Stopped(String),
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

impl std::fmt::Display for FeatureNorm {
    /// As the command line takes it: `none`, `row`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FeatureNorm::None => "none",
            FeatureNorm::Row => "row",
        })
    }
}

/// Refuses edge weights where they cannot be used, naming the fix: with a layer that takes
/// none (PyG's `SAGEConv`, `GATConv` and `GINConv` have no `edge_weight`), and in the modes
/// that build their adjacency from samples or shares (`whole_graph`: false), whose
/// normalisations have no weights.
pub fn check_edge_weights(
    ds: &Dataset,
    kind: grinnder_nn::Kind,
    whole_graph: bool,
) -> Result<(), TrainError> {
    if ds.edge_weight.is_none() {
        return Ok(());
    }
    if !kind.family().takes_edge_weight() {
        return Err(TrainError::Config(format!(
            "the graph has edge weights, but {kind} layers take none (PyG's {} has no edge_weight); \
             drop the weights (remove edge_weight.npy, and convert a .grnd file again; or leave \
             out edge_weight= in Python) or train with --model gcn (model=\"gcn\")",
            kind.family().pyg_layer()
        )));
    }
    if !whole_graph {
        return Err(TrainError::Config(
            "edge weights train on the whole graph, in memory or by partitions (--mode full, \
             --parts), not in mini-batches or server shares, whose normalisations are made from \
             samples without weights; train with --mode full and --expansion none, or drop the \
             weights"
                .into(),
        ));
    }
    Ok(())
}

/// Refuses a family with an initial representation (GCNII's `x₀`) on cooperative batches
/// (`what`): a rank's share of a deeper block's rows is not inside its share of layer 0's, so
/// `x₀`'s rows would cross ranks. Names the fix.
pub fn check_initial(kind: grinnder_nn::Kind, what: &str) -> Result<(), TrainError> {
    if !kind.family().has_initial() {
        return Ok(());
    }
    Err(TrainError::Config(format!(
        "--model {kind} does not run on {what} yet (its initial representation x0 is not \
         carried between ranks): train it by mini-batches in one process, or full-graph over \
         the ranks (--mode full)"
    )))
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
