//! Partitioning: which partition owns each node, the renumbering that makes partitions
//! contiguous id ranges, their quality, and the partitioned graph the layer-wise executor
//! gathers from (docs/design.md: exact execution, partitioning).
//!
//! **Invariant:** after renumbering, partition `p` owns exactly the ids `ptr[p]..ptr[p + 1]`.

pub mod cache;
pub mod lpa;
pub mod multilevel;
pub mod partitioned;
pub mod partitioner;
pub mod quality;

pub use cache::{partition_cached, CacheOutcome};
pub use partitioned::{renumber_ids, renumber_rows, PartitionGraph, PartitionedGraph};
pub use partitioner::{partition, Method, PartitionError, Partitioning};
pub use quality::{quality, Quality};
