//! Graphs and datasets for grinnder.
//!
//! A [`Dataset`] is a [`Csr`] adjacency (rows = targets, 64-bit offsets, 32-bit ids), row-major
//! features (owned or memory-mapped), labels and a split. [`io`] reads and writes every supported
//! layout; [`generate`] makes synthetic graphs with community structure; [`norm`] computes the
//! whole-graph normalisation that partitioned execution relies on.
//!
//! **Invariant:** this crate knows nothing of tensors, models or devices.

#[cfg(not(target_endian = "little"))]
compile_error!("grinnder's file formats are little-endian and are mapped without conversion");

pub mod buf;
pub mod csr;
pub mod dataset;
pub mod edge_weight;
pub mod error;
pub mod features;
pub mod generate;
pub mod io;
pub mod norm;
pub mod progress;
pub mod rng;
pub mod sample;
pub mod sort;
pub mod stats;
pub mod subgraph;

pub use buf::Buf;
pub use csr::{BuildOptions, Csr, SelfLoops, MAX_NODES};
pub use dataset::{Dataset, NonFinite, Splits, NO_LABEL};
pub use error::{GraphError, Result};
pub use features::{FeatureData, FeatureDtype, Features};
