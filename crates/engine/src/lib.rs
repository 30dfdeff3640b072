//! Executors that train a model on a dataset. Today: the in-memory full-graph trainer, the
//! reference every faster executor is checked against.

pub mod memory;
pub mod metrics;

pub use memory::{train, FeatureNorm, TrainConfig, TrainError};
pub use metrics::{EpochMetrics, Summary};
