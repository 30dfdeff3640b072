//! What the tiers hold and move: blocks (a partition's rows of one layer's array) and the order
//! in which the host cache lets them go. Its own file so that the store and the eviction policy
//! both read it without importing each other.

use serde::{Deserialize, Serialize};

/// What a block holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum BlockKind {
    /// A layer's input rows (layer 0: the features).
    Act,
    /// The gradient of a layer's input rows.
    Grad,
    /// The first layer's aggregation of a fixed input.
    Pre,
    /// A split layer's transformed rows `x Wᵀ` (width of its output).
    Xw,
    /// Their gradient.
    GradXw,
    /// The initial representation `x₀` (GCNII's): own rows, the hidden width, made by layer 0
    /// (its layer is 0) and read by every later layer.
    Initial,
    /// Its gradient: the later layers' parts summed, read by layer 0's backward.
    GradInitial,
}

/// One block: `kind` of `layer` for the rows of partition `part`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockId {
    pub kind: BlockKind,
    pub layer: usize,
    pub part: usize,
}

impl BlockId {
    /// The name of its file in the storage directory.
    pub(super) fn file_name(&self) -> String {
        let k = match self.kind {
            BlockKind::Act => "act",
            BlockKind::Grad => "grad",
            BlockKind::Pre => "pre",
            BlockKind::Xw => "xw",
            BlockKind::GradXw => "gradxw",
            BlockKind::Initial => "x0",
            BlockKind::GradInitial => "gradx0",
        };
        format!("{k}-l{}-p{}.blk", self.layer, self.part)
    }
}

/// Which blocks leave RAM first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CacheMode {
    /// `lru_layer` when the largest activation layer and the largest gradient layer fit the
    /// cache together, else `partition_lru`.
    Auto,
    /// Whole layers (all partitions of a kind and layer) leave together, least recently used
    /// first.
    LruLayer,
    /// Single blocks leave, least recently used first; a computing partition's dependency set
    /// is pinned.
    PartitionLru,
}

impl std::fmt::Display for CacheMode {
    /// As `--cache-mode` takes it: `auto`, `lru_layer`, `partition_lru`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CacheMode::Auto => "auto",
            CacheMode::LruLayer => "lru_layer",
            CacheMode::PartitionLru => "partition_lru",
        })
    }
}
