//! The exact layer-wise, partition-wise executor over the tiered store (docs/design.md:
//! exact execution, the tiered store).
//!
//! Forward runs layer by layer and, inside a layer, partition by partition: gather the
//! partition's own and halo rows of the layer input from the store, run the layer (conv, norm,
//! ReLU, dropout, residual) on the partition's bipartite graph, write its own output rows
//! back. The output layer is not run in forward: backward starts there, recomputing it per
//! partition to get the logits, the loss (summed over the partition's training nodes, divided
//! by the global training count) and its gradient. Backward walks the layers down; for each
//! partition it re-gathers the layer input, recomputes the layer, runs its backward with the
//! output gradient from the store, adds the input gradient's own rows into the partition's
//! gradient block and scatter-adds its halo rows into their owners' blocks. A layer's
//! gradient blocks are complete before the layer below starts (the loop is the barrier).
//!
//! The result does not depend on the partitioning: normalisations come from the whole graph,
//! dropout masks are keyed by original node ids, and every parameter gradient is a sum over
//! partitions of exact partial sums.
//!
//! Invariants, each backed by a check (a debug assertion, or the named test in
//! `crates/engine/tests`, `tiers.rs` or `plan.rs`):
//! 1. **A block is in at most one tier — exactly one once written** (the GPU tier, the backend's
//!    page-locked host memory, the store): [`tiers::Tiers`] asserts it at every change of place
//!    (debug builds; `a_block_placed_on_the_device_cannot_also_be_stored`,
//!    `a_pinned_block_cannot_also_be_stored`).
//! 2. **A lent block is given back before the same block is read again**: reading or writing a
//!    lent block panics, naming it, and every pass ends with none lent (asserted;
//!    `a_lent_block_is_not_read_before_it_comes_back`).
//! 3. **A layer's gradient blocks are complete (own rows, and mirrors flushed to their owners)
//!    before the layer below starts**: asserted over every pass's steps (`pass::check`, debug
//!    builds; `the_check_refuses_each_broken_rule`)
//!    (`tiered.rs`: `gradients_equal_the_in_memory_trainer_for_every_partition_count`,
//!    `a_cache_smaller_than_the_blocks_spills_and_prefetches_exactly`; `dist.rs`:
//!    `partition_parallel_gradients_equal_one_process`).
//! 4. **Mirrors are synced after a layer's outputs exist and before their first read**
//!    (`pass::check`; `dist.rs`: `partition_parallel_gradients_equal_one_process`,
//!    `the_matrix_transport_gives_the_byte_transport_results`).
//! 5. **After a failed pass every later pass refuses**, naming the first error
//!    ([`Executor::guarded`]; `tiered.rs`:
//!    `storage_faults_mid_epoch_stop_with_the_file_named_and_keep_the_last_good_state`).
//! 6. **Resident + working set + margin + host cache ≤ the host budget**, or the run is refused
//!    naming the least budget that would do (`tiered.rs`:
//!    `every_host_budget_is_kept_or_refused_with_the_least_that_would_do`, a table of budgets;
//!    `plan.rs`: `the_least_host_budget_is_the_least_that_leaves_its_margin`).
//! 7. **Every rank issues the same collectives in the same order**, on the whole group and on
//!    each group split off it (`dist.rs`:
//!    `every_rank_issues_the_same_collectives_in_the_same_order` logs each rank's calls).
//!
//! The executor by concern: `setup.rs` (partitioning, partition graphs, the first blocks),
//! `plan.rs` (the memory plan and its margins), `placement.rs` (the GPU tier), `rows.rs`
//! (gather, row reads and adds, prefetch, write-back), `pass.rs` (a pass's steps, made once and
//! checked against invariants 3 and 4: the executor runs them in `run.rs`, the cost model counts them
//! in `cost.rs`), `schedule.rs` (the passes' entry points: training, evaluation), `dist.rs` (ranks: the halo exchange and the sums), `tiers.rs` (which
//! tier holds each block); `store.rs` and `files.rs` are the host cache and the block files.

mod block;
mod calibrate;
mod cost;
mod dist;
mod eviction;
pub mod files;
mod input;
mod ledger;
mod pass;
mod placement;
mod plan;
mod predict;
mod rates;
mod rows;
mod run;
mod schedule;
mod setup;
mod setup_cost;
pub mod store;
mod tiers;

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Instant;

use grinnder_dist::{from_bytes, to_bytes, Comm, Groups, Layout};
use grinnder_graph::{Csr, Dataset};
use grinnder_nn::graph::Adjacency;
use grinnder_nn::{Graph, Model, ModelConfig};
use grinnder_partition::{partition_cached, Method, PartitionedGraph, Partitioning};
use grinnder_tensor::{Backend, Mat, MatComm, Rows, Scalar, SparseMatrix};
use serde::Serialize;

pub use cost::{Prediction, Seconds, Traffic};
use dist::*;
pub use dist::{shared_partitioning, CommStats, DeviceComms, DistConfig, HostMats, SubgraphOf};
pub(crate) use dist::{sum_gradients, Reducer};
pub use files::Faults;
pub use placement::BlockGroup;
use plan::*;
pub use plan::{DevicePlan, Plan};
pub use predict::Emit;
pub use rates::{measure_rates, Rates, SparseRate};
pub use setup::factors_values;
pub use setup_cost::{FirstBlocks, FirstBlocksSeconds};
pub use store::{BlockId, BlockKind, CacheMode, Store, StoreConfig, TierDtype, TierStats};
use tiers::Tiers;

use crate::config::{FeatureNorm, FeaturePrep, TrainError};
use crate::features::{feature_rows, feature_rows_into, feature_shift};

/// How the executor partitions and where its blocks live.
#[derive(Clone, Debug)]
pub struct TieredConfig {
    pub parts: usize,
    pub method: Method,
    /// Partition cache directory (`None`: no cache).
    pub partition_cache: Option<PathBuf>,
    pub cache_mode: CacheMode,
    /// Host memory for the whole process; `None`: no limit, every block stays in RAM.
    pub host_mem: Option<u64>,
    pub storage_dir: Option<PathBuf>,
    pub tier_dtype: TierDtype,
    pub keep_storage: bool,
    /// Fault injection for tests (block-file writes failing with ENOSPC, reads with EIO).
    pub faults: Faults,
    /// The block cache size, overriding what the plan derives from `host_mem`.
    pub cache_bytes: Option<u64>,
    /// The backend's memory for the whole run (`--gpu-mem`): with it, the plan keeps the blocks
    /// that fit in the backend's memory (the GPU tier) and the rest in the host store.
    pub gpu_mem: Option<u64>,
    /// Bytes of blocks kept in the backend's memory, overriding what the plan derives from
    /// `gpu_mem` (tests: the CPU backend's "device" is host memory).
    pub device_cache_bytes: Option<u64>,
    /// With no `host_mem`: the host memory chosen from the machine
    /// ([`crate::budgets::choose`]), which the plan keeps to.
    pub host_auto: Option<HostAuto>,
    /// `parts` was chosen, not given: where a working set does not fit the budgets, the
    /// executor doubles it and plans again.
    pub auto_parts: bool,
    /// The executor only runs forward passes (a model file's predictions): its plan counts,
    /// places and keeps room for no gradient block, and a training pass is refused.
    pub inference: bool,
}

/// The host memory a run may use when no budget was given: every block stays in RAM while
/// the blocks outside the GPU tier fit in `bytes` beside what the process holds; otherwise
/// `bytes` becomes the budget, with block files in `storage_dir`.
#[derive(Clone, Debug)]
pub struct HostAuto {
    pub bytes: u64,
    pub storage_dir: Option<PathBuf>,
    /// Called once where the blocks are kept under `bytes` (the CLI has its allocator return
    /// freed memory to the system at once from then on, as under `--host-mem`: without it a
    /// prediction in a 200 MiB control group was killed at 201 MiB of anonymous memory).
    pub on_budget: Option<fn()>,
}

/// Equal budgets and directories (the hook, a function pointer, has no meaningful equality).
impl PartialEq for HostAuto {
    fn eq(&self, other: &Self) -> bool {
        (self.bytes, &self.storage_dir) == (other.bytes, &other.storage_dir)
    }
}

impl TieredConfig {
    /// Everything in RAM, `parts` partitions by `method`.
    pub fn in_ram(parts: usize, method: Method) -> TieredConfig {
        TieredConfig {
            parts,
            method,
            partition_cache: None,
            cache_mode: CacheMode::Auto,
            host_mem: None,
            storage_dir: None,
            tier_dtype: TierDtype::F32,
            keep_storage: false,
            faults: Faults::default(),
            cache_bytes: None,
            gpu_mem: None,
            device_cache_bytes: None,
            host_auto: None,
            auto_parts: false,
            inference: false,
        }
    }
}

/// Seconds per phase of one epoch, with the store's counters.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct PhaseStats {
    /// Mini-batch training: sampling time and the number of batches (absent otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sample_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batches: Option<usize>,
    /// Mini-batch training: time the training thread waited for sampled batches (the
    /// loader's shortfall).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batch_wait_s: Option<f64>,
    pub gather_s: f64,
    pub compute_s: f64,
    pub write_back_s: f64,
    /// Bytes of host-tier rows handed to the backend and of results taken back to the host
    /// tier (on a GPU: the PCIe traffic).
    pub upload_bytes: u64,
    pub download_bytes: u64,
    /// Of them: rows the backend read in place from page-locked host blocks (zero-copy
    /// gathers, the rows an addition reads), and bytes it wrote into such blocks.
    pub mapped_read_bytes: u64,
    pub pinned_download_bytes: u64,
    #[serde(flatten)]
    pub tier: TierStats,
    /// Partition-parallel runs: bytes exchanged, summed over the ranks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub comm: Option<CommStats>,
}

impl PhaseStats {
    /// Counts bytes the backend read in place from page-locked host blocks and wrote into them.
    fn pinned_traffic(&mut self, read: u64, written: u64) {
        self.upload_bytes += read;
        self.mapped_read_bytes += read;
        self.download_bytes += written;
        self.pinned_download_bytes += written;
    }
}

/// A partition's own rows of a block, for reading: the device block itself, lent without a
/// copy (the executor takes it back with [`Executor::give_back`] before anything else reads
/// the block), or a gathered copy.
enum Own<B: Backend> {
    Lent(BlockId, B::Mat),
    Copy(B::Mat),
}

impl<B: Backend> std::ops::Deref for Own<B> {
    type Target = B::Mat;

    fn deref(&self) -> &B::Mat {
        match self {
            Own::Lent(_, m) | Own::Copy(m) => m,
        }
    }
}

/// One partition as the executor sees it.
struct Part<B: Backend> {
    graph: Graph<B>,
    own: usize,
    /// (source partition, its rows) for the halo columns, in column order.
    fetch: Vec<(usize, Vec<u32>)>,
    labels: Vec<i32>,
    /// Local rows of the train, valid and test nodes.
    split_rows: [Vec<u32>; 3],
    /// The adjacency on the host until layer 0's `Â x` is built from it a piece at a time
    /// (where the plan asks for that: [`input`]).
    input_adjacency: Option<input::HostAdjacency>,
}

/// The executor: a model, the partitioned graph and the store.
pub struct Executor<'a, B: Backend> {
    b: &'a B,
    pub model: Model<B>,
    parts: Vec<Part<B>>,
    /// The heap in use at the last [`Executor::mark`], and the largest growth of a phase.
    marked: u64,
    measured_working: Option<u64>,
    /// The same for the backend's memory: bytes in use and GPU-tier block bytes at the last
    /// mark, and the largest growth of a phase beyond the blocks it added.
    device_marked: (u64, u64),
    measured_device_working: Option<u64>,
    /// Where each block lives: the GPU tier, the backend's page-locked host memory (when
    /// nothing bounds host memory: fixed blocks — features, layer 0's aggregation — with
    /// `pin_fixed`, and with `pin_all` every block, written and added to by the device over the
    /// bus), or the store.
    tiers: Tiers<B>,
    pin_fixed: bool,
    pin_all: bool,
    /// The first error of a pass. The blocks may be incomplete after one (a block lent to the
    /// computation is not back in the GPU tier, a write may be half done), so every later pass
    /// refuses with it ([`Executor::guarded`]).
    stopped: Option<String>,
    /// Whole pinned blocks of the next partition, uploaded while this one computes
    /// ([`Executor::prefetch`]); taken by the gather that reads them.
    ahead: Vec<(BlockId, B::Arriving)>,
    /// Layer 0 runs inside layer 1 (see [`Executor::fused`]).
    fused: bool,
    /// `TieredConfig::gpu_mem`, and whether the first epoch's peak has refined the placement.
    gpu_mem: Option<u64>,
    calibrated: bool,
    n_train: usize,
    /// Layer 0 runs on `Â x` precomputed per partition (GCN, SAGE without input dropout; see
    /// `Executor::new_dist`).
    pre: bool,
    /// Planned for forward passes alone ([`TieredConfig::inference`]).
    inference: bool,
    pub partitioning: Partitioning,
    pub plan: Plan,
    stats: PhaseStats,
    /// The partitions this rank computes (all of them in one process).
    local: std::ops::Range<usize>,
    dist: Option<DistState<'a, B>>,
    /// Progress bars per layer (inference).
    progress: bool,
}

fn io_err(e: std::io::Error) -> TrainError {
    TrainError::Storage(e.to_string())
}

impl<'a, B: Backend> Executor<'a, B> {
    /// The run's private storage directory (inside `--storage-dir`), `None` without storage.
    pub fn storage_dir(&self) -> Option<&std::path::Path> {
        self.tiers.store.storage_dir()
    }

    /// Block-file reads and writes attempted since the start (setup included).
    pub fn storage_ops(&self) -> (usize, usize) {
        self.tiers.store.storage_ops()
    }

    /// `(O_DIRECT, io_uring)` of the storage tier, `None` without one.
    pub fn store_direct_io(&self) -> Option<(bool, bool)> {
        self.tiers.store.direct_io()
    }
}

/// A copy of `h`, in parallel for large slices (blocks of hundreds of MB leave staging memory).
fn par_to_vec<T: Copy + Send + Sync>(h: &[T]) -> Vec<T> {
    use rayon::prelude::*;
    h.par_iter().with_min_len(1 << 16).copied().collect()
}

/// `src` into `dst` (as long) on every core.
fn par_copy<T: Scalar>(src: &[T], dst: &mut [T]) {
    use rayon::prelude::*;
    dst.par_chunks_mut(1 << 16).zip(src.par_chunks(1 << 16)).for_each(|(d, s)| d.copy_from_slice(s));
}
