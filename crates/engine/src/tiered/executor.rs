//! The executor's state: a model, the partitioned graph, the tiers, the plan and the meters;
//! the phases' figures; a block's rows lent or copied for reading.

use grinnder_nn::Model;
use grinnder_partition::Partitioning;
use grinnder_tensor::{Backend, Scalar};

use crate::config::TrainError;

use super::dist::DistState;
use super::meters::Meters;
use super::part::Part;
use super::plan::Plan;
use super::store::BlockId;
use super::tiers::Tiers;

/// A partition's own rows of a block, for reading: the device block itself, lent without a
/// copy (the executor takes it back with [`Executor::give_back`] before anything else reads
/// the block), or a gathered copy.
pub(super) enum Own<B: Backend> {
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

/// The executor: a model, the partitioned graph and the store.
pub struct Executor<'a, B: Backend> {
    pub(super) b: &'a B,
    pub model: Model<B>,
    pub(super) parts: Vec<Part<B>>,
    /// Where each block lives, and which blocks are page-locked ([`Tiers`]).
    pub(super) tiers: Tiers<B>,
    /// The first error of a pass. The blocks may be incomplete after one (a block lent to the
    /// computation is not back in the GPU tier, a write may be half done), so every later pass
    /// refuses with it ([`Executor::guarded`]).
    pub(super) stopped: Option<String>,
    /// Layer 0 runs inside layer 1 (see [`Executor::fused`]).
    pub(super) fused: bool,
    /// `TieredConfig::gpu_mem`, and whether the first epoch's peak has refined the placement.
    pub(super) gpu_mem: Option<u64>,
    pub(super) calibrated: bool,
    pub(super) n_train: usize,
    /// Layer 0 runs on `Â x` precomputed per partition (GCN, SAGE without input dropout; see
    /// `Executor::new_dist`).
    pub(super) pre: bool,
    /// Planned for forward passes alone ([`TieredConfig::inference`]).
    pub(super) inference: bool,
    pub partitioning: Partitioning,
    pub plan: Plan,
    /// What the executor measures: the phases' times and bytes, and the working sets.
    pub(super) meters: Meters,
    /// The partitions this rank computes (all of them in one process).
    pub(super) local: std::ops::Range<usize>,
    pub(super) dist: Option<DistState<'a, B>>,
    /// Progress bars per layer (inference).
    pub(super) progress: bool,
    /// The output layer's gradient per partition, where a caller's criterion gave it
    /// ([`Executor::forward_backward_with`]): taken by the pass's loss step in place of the
    /// built-in cross entropy.
    pub(super) given: Option<Vec<Option<B::Mat>>>,
}

pub(super) fn io_err(e: std::io::Error) -> TrainError {
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
pub(super) fn par_to_vec<T: Copy + Send + Sync>(h: &[T]) -> Vec<T> {
    use rayon::prelude::*;
    h.par_iter().with_min_len(1 << 16).copied().collect()
}

/// `src` into `dst` (as long) on every core.
pub(super) fn par_copy<T: Scalar>(src: &[T], dst: &mut [T]) {
    use rayon::prelude::*;
    dst.par_chunks_mut(1 << 16).zip(src.par_chunks(1 << 16)).for_each(|(d, s)| d.copy_from_slice(s));
}
