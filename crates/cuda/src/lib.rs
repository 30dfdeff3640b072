//! The CUDA backend: the [`Backend`](grinnder_tensor::Backend) trait on one GPU through `cudarc`, with the CUDA
//! libraries loaded at run time — the default build needs no CUDA, and the same binary uses a
//! GPU where one is present. Kernels (`kernels.cu`) are compiled by NVRTC for the device's
//! architecture once per process; GEMM goes through cuBLAS (fp32).
//!
//! Matrices are row-major `f32` in device memory. cuBLAS is column-major: a row-major `C = A·B`
//! is the column-major `Cᵀ = Bᵀ·Aᵀ`, so operands are passed swapped.
//!
//! Errors from CUDA inside a trait method (which returns no `Result`) panic with the
//! operation's name; [`Cuda::new`] reports a missing driver, library or device as an error.
//!
//! Split by concern: `device` (opening a device, the kernel module, streams), `pool` (memory
//! pool and `--gpu-mem`), `profile`, `upload` (host arrays and structures onto the device),
//! `spmm` (which SpMM runs), `gather` (row-copy kernels), the Backend families in `transfers`
//! ([`Memory`], [`Transfers`], [`HandOffs`]), `compute` ([`DenseOps`], [`TrainOps`]) and `graph`
//! ([`GraphOps`]); `host` (page-locked memory; `pinned` makes it), `handoff` (work crossing streams), `cusparse`,
//! `nccl`, `clock` and `timeline`. This file holds the types they share.

use std::sync::Arc;

use cudarc::cublas::{sys::cublasOperation_t, CudaBlas, Gemm, GemmConfig, StridedBatchedConfig};
use cudarc::driver::{
    CudaContext, CudaEvent, CudaFunction, CudaModule, CudaSlice, CudaStream, CudaViewMut, DevicePtr,
    LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};
use grinnder_tensor::ops::*;
use grinnder_tensor::{Binary, DeviceMemory, MaskKey, Mat, PairGrads, Rows, SparseMatrix, StepRule, Unary};

mod bus16;
mod clock;
mod compute;
mod cusparse;
mod device;
mod gather;
mod graph;
mod handoff;
mod host;
mod nccl;
mod pinned;
mod pool;
mod profile;
mod reuse;
mod spmm;
mod timeline;
mod transfers;
mod upload;

pub use handoff::Arriving;
pub use host::{CudaLoss, DeviceIndex, HostLabels, HostTable, Leaving, StreamHold};
pub use nccl::{nccl_present, Nccl};
pub use pinned::PageLock;
pub use spmm::{SpmmKernel, SpmmShapeInfo};

use device::Kernels;
use pool::{MemPool, OrOutOfMemory};
use profile::approx;
use profile::Profile;
use spmm::SpmmShape;
use upload::UploadCache;

#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    #[error("no CUDA driver found (libcuda.so): this machine has no usable NVIDIA GPU; use --device cpu")]
    NoDriver,
    #[error("the CUDA library {0} was not found: install the CUDA 13 runtime libraries or add them to LD_LIBRARY_PATH")]
    NoLibrary(&'static str),
    #[error("CUDA device {ordinal} not available ({count} device(s) found)")]
    NoDevice { ordinal: usize, count: i32 },
    #[error("CUDA: {0}")]
    Driver(String),
    #[error("compiling the CUDA kernels failed: {0}")]
    Compile(String),
}

/// Whether the CUDA driver library can be loaded here (no GPU needed to ask).
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the library under its usual names.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// How many GPUs the driver sees (0 without a driver).
pub fn device_count() -> usize {
    if !driver_present() {
        return 0;
    }
    CudaContext::device_count().map_or(0, |n| n.max(0) as usize)
}

/// A matrix in device memory.
pub struct DMat {
    pub rows: usize,
    pub cols: usize,
    pub data: CudaSlice<f32>,
}

/// A sparse structure (CSR and its transpose) in device memory.
pub struct DSparse {
    rows: usize,
    cols: usize,
    nnz: usize,
    row_ptr: CudaSlice<u64>,
    col_idx: CudaSlice<u32>,
    t_row_ptr: CudaSlice<u64>,
    t_col_idx: CudaSlice<u32>,
    /// 32-bit: a structure on the device has fewer than 2³² entries (checked at upload); `None`
    /// for a structure sent without it ([`SparseMatrix::without_entry_order`]: factored values)
    t_perm: Option<CudaSlice<u32>>,
    /// node ids of rows and columns for edge-dropout keys
    ids: Option<(CudaSlice<u32>, CudaSlice<u32>)>,
    /// 32-bit offsets for cuSPARSE (where it is present and the structure is small enough)
    csr32: Option<cusparse::Csr32>,
}

/// Per SpMM shape class and kind of values (factored or not): whether cuSPARSE won, both
/// times in ms and the shape timed.
type SpmmPick = (bool, f64, f64, SpmmShape);

/// The CUDA backend on one device.
pub struct Cuda {
    gather_rows_per_warp: usize,
    /// See [`Cuda::set_gather_aligned`].
    gather_aligned: bool,
    staging: host::Staging,
    /// Page-locked buffers (mapped) for the uploads made ahead, the main stream's small
    /// uploads, a zero-copy gather's row ids and the loss kernel's ids and outputs.
    pinned: host::PinnedPool,
    sparse_lib: Option<cusparse::CuSparse>,
    /// Per shape class ([`shape_class`]): whether cuSPARSE won, both times in ms, and the
    /// shape timed.
    spmm_pick: std::sync::Mutex<std::collections::HashMap<(SpmmShape, bool), SpmmPick>>,
    pool: Option<MemPool>,
    /// `--gpu-mem`: the most bytes of device memory the backend may hold.
    budget: Option<u64>,
    prof: Option<Profile>,
    /// `GRINNDER_CUDA_TIMELINE`'s marks (see [`timeline`]).
    timeline: Option<timeline::Timeline>,
    labels: UploadCache<i32>,
    rows: UploadCache<u32>,
    /// Row lists of gathers and scatter-adds (the executor's halo and mirror lists recur every
    /// layer and epoch).
    row_lists: UploadCache<u32>,
    spmm_kernel: SpmmKernel,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    /// A second stream for work that overlaps the main one (`gather_host_async`), made on
    /// first use ([`Cuda::side_stream`]); its results reach the main stream as [`Arriving`]
    /// matrices (the `handoff` module's rules).
    side: std::sync::OnceLock<Arc<CudaStream>>,
    /// Main-stream events recorded at each host-block upload on `side`: the host waits on the
    /// oldest so that those copies run at most [`host::UPLOADS_AHEAD`] uploads ahead of the
    /// work that reads them (their device memory stays bounded).
    ahead: std::sync::Mutex<std::collections::VecDeque<CudaEvent>>,
    /// cuSPARSE bound to the third stream, for the transposes of structures made ahead (the
    /// sampling threads take turns); `None` inside: no cuSPARSE. Declared before the stream:
    /// dropped first.
    ahead_sparse: std::sync::OnceLock<Option<std::sync::Mutex<cusparse::CuSparse>>>,
    /// A third stream, for uploads made ahead of their use ([`Cuda::ahead_stream`]).
    ahead_uploads: std::sync::OnceLock<Arc<CudaStream>>,
    /// Time and bytes of the second stream's gathers and uploads.
    side_time: std::sync::Mutex<clock::EventClock>,
    blas: CudaBlas,
    k: Kernels,
    /// placeholders for absent optional pointer arguments
    dummy_u32: CudaSlice<u32>,
    dummy_f32: CudaSlice<f32>,
}

fn err<E: std::fmt::Debug>(e: E) -> CudaError {
    CudaError::Driver(format!("{e:?}"))
}

const GIB: f64 = (1u64 << 30) as f64;

/// Threads per block of the element-wise and warp-per-row kernels.
const BLOCK: u32 = 256;

fn grid(threads: usize) -> LaunchConfig {
    let blocks = threads.div_ceil(BLOCK as usize).max(1);
    assert!(blocks <= i32::MAX as usize, "launch of {threads} threads is too large");
    LaunchConfig { grid_dim: (blocks as u32, 1, 1), block_dim: (BLOCK, 1, 1), shared_mem_bytes: 0 }
}

/// The drop threshold of probability `p` (the CPU's, so the masks agree).
fn thr(p: f64) -> u32 {
    grinnder_tensor::dropout::threshold(p)
}

/// One warp per row.
pub(crate) fn warps(rows: usize) -> LaunchConfig {
    grid(rows * 32)
}
