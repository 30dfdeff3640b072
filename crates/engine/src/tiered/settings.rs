//! The executor's settings: how it partitions and where its blocks live.

use std::path::PathBuf;

use grinnder_partition::Method;

use super::files::Faults;
use super::store::{CacheMode, TierDtype};

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
