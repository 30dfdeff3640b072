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
//! The executor by concern: `executor.rs` (its state: the partitions, the tiers, the plan, the
//! meters), `meters.rs` (the phases' seconds, bytes and working sets), `settings.rs` (`TieredConfig`), `part.rs` (a partition), `setup.rs` (partitioning,
//! partition graphs, the first blocks),
//! `plan.rs` (the memory plan and its margins), `placement.rs` (the GPU tier), `rows.rs`
//! (gather, row reads and adds, prefetch, write-back), `pass.rs` (a pass's steps, made once and
//! checked against invariants 3 and 4: the executor runs them in `run.rs`, the cost model counts them
//! in `cost.rs`), `schedule.rs` (the passes' entry points: training, evaluation), `dist.rs` (ranks' state: the exchange, the counters), `mirrors.rs` (the executor's side
//! of ranks: mirrors synced and flushed, the sums), `tiers.rs` (which
//! tier holds each block); `store.rs` and `files.rs` are the host cache and the block files.

mod block;
mod calibrate;
mod caller;
mod cost;
mod dist;
mod eviction;
mod executor;
pub mod files;
mod input;
mod ledger;
mod meters;
mod mirrors;
mod part;
mod pass;
mod placement;
mod plan;
mod predict;
mod rates;
mod rows;
mod run;
mod schedule;
mod settings;
mod setup;
mod setup_cost;
pub mod store;
mod tiers;

pub use caller::Criterion;
pub use cost::Prediction;
pub use dist::{shared_partitioning, CommStats, DeviceComms, DistConfig, HostMats, SubgraphOf};
pub(crate) use dist::{sum_gradients, Reducer};
pub use executor::Executor;
pub use files::Faults;
pub use ledger::Traffic;
pub use meters::PhaseStats;
pub use placement::BlockGroup;
pub use plan::{DevicePlan, Plan};
pub use predict::Emit;
pub use rates::{measure_rates, Rates, Seconds, SparseRate};
pub use settings::{HostAuto, TieredConfig};
pub use setup::factors_values;
pub use setup_cost::{FirstBlocks, FirstBlocksSeconds};
pub use store::{BlockId, BlockKind, CacheMode, Store, StoreConfig, TierDtype, TierStats};
