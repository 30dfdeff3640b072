//! Executors that train a model on a dataset: the in-memory full-graph trainer (the reference
//! every other executor is checked against) and the layer-wise, partition-wise executor over
//! the tiered store.

pub mod checkpoint;
pub mod coop;
pub mod heap;
pub mod memory;
pub mod metrics;
pub mod minibatch;
pub mod preload;
pub mod tiered;

pub use checkpoint::CheckpointConfig;
pub use coop::train_coop;
pub use memory::{
    train, train_tiered, train_tiered_on, train_tiered_with, train_with, FeatureNorm, TrainConfig, TrainError,
};
pub use metrics::{EpochMetrics, Summary};
pub use minibatch::{
    train_minibatch, train_minibatch_from, FeatureSource, HostFeatures, MiniBatchConfig, Sampler,
};
pub use preload::{train_servers, DeviceGroups, Expansion};
pub use tiered::{
    CacheMode, CommStats, DeviceComms, DistConfig, Executor, HostMats, SubgraphOf, TierDtype, TieredConfig,
};
