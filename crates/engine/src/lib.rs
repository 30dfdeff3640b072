//! Training a model on a dataset: the [`Trainer`] (one front door, in any [`Mode`]), the
//! layer-wise, partition-wise executor over the tiered store, mini-batches, partition-parallel
//! ranks and server shares.

pub mod budgets;
pub mod checkpoint;
pub mod config;
pub mod coop;
pub mod features;
pub mod heap;
pub mod inference;
pub mod machine;
pub mod metrics;
pub mod minibatch;
mod mode;
pub mod model_file;
pub mod preload;
pub mod process;
pub mod scratch;
pub mod tiered;
pub mod trainer;

pub use checkpoint::CheckpointConfig;
pub use config::{FeatureNorm, FeaturePrep, TrainConfig, TrainError};
pub use features::{FeatureSource, HostFeatures};
pub use inference::{Output, Prediction, Request, RowSink, Rows};
pub use metrics::{EpochMetrics, Summary};
pub use minibatch::{MiniBatchConfig, Sampler};
pub use model_file::{Arch, ModelFile, ModelFileError};
pub use preload::{DeviceGroups, Expansion};
pub use tiered::{
    CacheMode, CommStats, DeviceComms, DistConfig, Executor, HostMats, SubgraphOf, TierDtype, TieredConfig,
};
pub use trainer::{EvalMetrics, Mode, Trainer, Weights};
