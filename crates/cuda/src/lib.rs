//! The CUDA backend: the [`Backend`] trait on one GPU through `cudarc`, with the CUDA
//! libraries loaded at run time — the default build needs no CUDA, and the same binary uses a
//! GPU where one is present. Kernels (`kernels.cu`) are compiled by NVRTC for the device's
//! architecture once per process; GEMM goes through cuBLAS (fp32).
//!
//! Matrices are row-major `f32` in device memory. cuBLAS is column-major: a row-major `C = A·B`
//! is the column-major `Cᵀ = Bᵀ·Aᵀ`, so operands are passed swapped.
//!
//! Errors from CUDA inside a trait method (which returns no `Result`) panic with the
//! operation's name; [`Cuda::new`] reports a missing driver, library or device as an error.

use std::sync::Arc;

use cudarc::cublas::{sys::cublasOperation_t, CudaBlas, Gemm, GemmConfig, StridedBatchedConfig};
use cudarc::driver::{
    CudaContext, CudaEvent, CudaFunction, CudaModule, CudaSlice, CudaStream, CudaViewMut, DevicePtr,
    LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};
use grinnder_tensor::{Backend, Binary, DeviceMemory, MaskKey, Mat, Rows, SparseMatrix, StepRule, Unary};

mod clock;
mod cusparse;
mod handoff;
mod host;
mod nccl;
mod timeline;

pub use handoff::Arriving;
pub use host::{CudaLoss, DeviceIndex, HostLabels, HostTable, StreamHold};
pub use nccl::{nccl_present, Nccl};

const SOURCE: &str = include_str!("kernels.cu");

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
    /// 32-bit: a partition's structure has fewer than 2³² entries (checked at upload)
    t_perm: CudaSlice<u32>,
    /// node ids of rows and columns for edge-dropout keys
    ids: Option<(CudaSlice<u32>, CudaSlice<u32>)>,
    /// 32-bit offsets for cuSPARSE (where it is present and the structure is small enough)
    csr32: Option<cusparse::Csr32>,
}

struct Kernels {
    _module: Arc<CudaModule>,
    f: std::collections::HashMap<&'static str, CudaFunction>,
}

/// Time per operation when `GRINNDER_CUDA_PROFILE` is set: every operation is bracketed by
/// synchronisations of the whole device, all streams (slower, and the second stream's work no
/// longer overlaps, but each figure is that operation's alone); the table is printed when the
/// backend is dropped. `GRINNDER_CUDA_PROFILE=shapes` keeps GEMMs and SpMMs apart by their
/// shapes (to two significant digits). The figures are host time: launch overheads included.
/// `GRINNDER_CUDA_PROFILE=host` (also `host,shapes`) synchronises nothing: each figure is the
/// time the calling thread spent in the call (queueing it, and waiting where it waits, as
/// reading a loss and `synchronize` do), which shows whether the host or the device bounds.
#[derive(Default)]
struct Profile {
    ops: std::sync::Mutex<std::collections::BTreeMap<String, (f64, u64)>>,
    shapes: bool,
    /// Host time per call, with no synchronisation: what the calling thread spends queueing
    /// each operation (and waiting where the operation itself waits).
    host: bool,
}

/// One profiled operation (see [`Profile`]).
struct Span<'a> {
    cuda: &'a Cuda,
    name: String,
    start: std::time::Instant,
}

/// `x` to two significant digits, for profile labels.
fn approx(x: usize) -> usize {
    let mut scale = 1;
    while x / scale >= 100 {
        scale *= 10;
    }
    (x + scale / 2) / scale * scale
}

impl Drop for Span<'_> {
    fn drop(&mut self) {
        let Some(p) = &self.cuda.prof else { return };
        if !p.host {
            self.cuda.ctx.synchronize().expect("CUDA synchronize");
        }
        let t = self.start.elapsed().as_secs_f64();
        let mut ops = p.ops.lock().unwrap_or_else(|e| e.into_inner());
        let e = ops.entry(std::mem::take(&mut self.name)).or_insert((0.0, 0));
        e.0 += t;
        e.1 += 1;
    }
}

/// Which SpMM runs: the faster of grinnder's kernel for the shape and cuSPARSE, timed on each
/// shape's first call (`Auto`), or one forced for comparisons (also with
/// `GRINNDER_SPMM=ours|warp|cusparse`; `Warp`: grinnder's general kernel everywhere). cuSPARSE
/// serves single-valued structures (not attention heads); the others always run grinnder's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpmmKernel {
    Auto,
    Ours,
    Warp,
    CuSparse,
}

/// An SpMM shape: rows, columns and entries of the structure, the width, transposed.
type SpmmShape = (usize, usize, usize, usize, bool);

/// The class of an SpMM shape whose timing decides for all its members: rows, columns and
/// entries each to its half-octave (sizes within a factor √2 share one), width and direction
/// exact. Mini-batches and partitions come in shapes that differ a little each time; timing
/// every one (six runs and four synchronisations) would cost more than the choice saves.
fn shape_class((rows, cols, nnz, width, transposed): SpmmShape) -> SpmmShape {
    let half_octave = |n: usize| if n == 0 { 0 } else { (2.0 * (n as f64).log2()).floor() as usize + 1 };
    (half_octave(rows), half_octave(cols), half_octave(nnz), width, transposed)
}

/// [`SpmmShape`], public.
pub type SpmmShapeInfo = SpmmShape;

/// Device copies of small host arrays that are passed again and again (labels, split rows):
/// an array is uploaded once and found again by comparing its contents with a host copy (exact;
/// the comparison runs on the host while the device computes). Besides the transfer, a hit
/// over [`PINNED_UPLOAD_MAX`] saves a stream synchronisation: a copy from pageable memory
/// waits for the stream to drain.
struct UploadCache<T> {
    entries: std::sync::Mutex<Vec<Cached<T>>>,
    /// Arrays kept (most recently used first).
    keep: usize,
}

/// A host array and its device copy.
type Cached<T> = (Vec<T>, Arc<CudaSlice<T>>);

impl<T> UploadCache<T> {
    fn new(keep: usize) -> Self {
        UploadCache { entries: std::sync::Mutex::new(Vec::new()), keep }
    }
}

impl<T: cudarc::driver::DeviceRepr + PartialEq + Clone> UploadCache<T> {
    fn get(&self, cuda: &Cuda, v: &[T]) -> Arc<CudaSlice<T>> {
        let mut e = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = e.iter().position(|(h, _)| h.as_slice() == v) {
            let hit = e.remove(i);
            let d = hit.1.clone();
            e.insert(0, hit);
            return d;
        }
        let d = Arc::new(cuda.upload_slice(v));
        e.insert(0, (v.to_vec(), d.clone()));
        e.truncate(self.keep);
        d
    }
}

/// The largest upload by the main stream through the page-locked buffers of
/// [`host::PinnedPool`] (kept for reuse: larger ones go through the driver's staging).
const PINNED_UPLOAD_MAX: usize = 4 << 20;

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
    spmm_pick: std::sync::Mutex<std::collections::HashMap<SpmmShape, (bool, f64, f64, SpmmShape)>>,
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
}

const KERNELS: [&str; 30] = [
    "iota_u32",
    "widen_offsets",
    "gather_rows2",
    "gather_rows_aligned",
    "permute",
    "sum_parts",
    "spmm16",
    "spmm_v4",
    "dropout",
    "edge_dropout",
    "spmm",
    "sddmm",
    "edge_softmax",
    "edge_softmax_backward",
    "head_dots",
    "head_dots_dz",
    "gather_rows",
    "scatter_add_rows",
    "unary",
    "binary",
    "add_row",
    "col_partial",
    "col_finish",
    "layer_norm",
    "layer_norm_dx",
    "cross_entropy",
    "cross_entropy_ids",
    "count_correct",
    "adam",
    "sgd",
];

/// 64-bit offsets as cuSPARSE's 32-bit ones (the caller has checked they fit).
fn narrow(offsets: &[u64]) -> Vec<i32> {
    offsets.iter().map(|&o| o as i32).collect()
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

/// One warp per row.
pub(crate) fn warps(rows: usize) -> LaunchConfig {
    grid(rows * 32)
}

impl Cuda {
    /// Opens device `ordinal`, checks the libraries first (cudarc's loader would panic), and
    /// compiles the kernels for the device's architecture.
    pub fn new(ordinal: usize) -> Result<Cuda, CudaError> {
        if !driver_present() {
            return Err(CudaError::NoDriver);
        }
        // SAFETY: only tries to dlopen the libraries under their usual names.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            return Err(CudaError::NoLibrary("libnvrtc"));
        }
        // SAFETY: as above.
        if !unsafe { cudarc::cublas::sys::is_culib_present() } {
            return Err(CudaError::NoLibrary("libcublas"));
        }
        let count = CudaContext::device_count().map_err(err)?;
        if ordinal >= count.max(0) as usize {
            return Err(CudaError::NoDevice { ordinal, count });
        }
        let ctx = CudaContext::new(ordinal).map_err(err)?;
        if handoff::set_tracking(&ctx) {
            tracing::info!("cudarc's event tracking on (GRINNDER_CUDA_EVENT_TRACKING)");
        }
        let (major, minor) = ctx.compute_capability().map_err(err)?;
        let arch: &'static str = Box::leak(format!("sm_{major}{minor}").into_boxed_str());
        let opts = CompileOptions { arch: Some(arch), ..Default::default() };
        let ptx = compile_ptx_with_opts(SOURCE, opts).map_err(|e| CudaError::Compile(format!("{e:?}")))?;
        let module = ctx.load_module(ptx).map_err(err)?;
        let mut f = std::collections::HashMap::new();
        for name in KERNELS {
            f.insert(name, module.load_function(name).map_err(err)?);
        }
        // a (non-blocking) stream of its own rather than the legacy default stream: on one
        // H200, products-like zero-copy epochs 1.706 / 1.684 s against 1.735 / 1.795 s
        // (BENCHMARKS, eleventh session)
        let stream = ctx.new_stream().map_err(err)?;
        let pool = keep_freed_memory(&ctx);
        let blas = CudaBlas::new(stream.clone()).map_err(err)?;
        let dummy_u32 = stream.alloc_zeros::<u32>(1).map_err(err)?;
        tracing::info!(
            "CUDA device {ordinal}: {} (sm_{major}{minor}), {:.1} GiB",
            ctx.name().unwrap_or_default(),
            ctx.total_mem().unwrap_or(0) as f64 / (1u64 << 30) as f64
        );
        let prof = std::env::var("GRINNDER_CUDA_PROFILE").ok().map(|v| {
            let has = |w: &str| v.split(',').any(|x| x.trim() == w);
            Profile { shapes: has("shapes"), host: has("host"), ..Default::default() }
        });
        let spmm_kernel = match std::env::var("GRINNDER_SPMM").as_deref() {
            Ok("warp") => SpmmKernel::Warp,
            Ok("ours") => SpmmKernel::Ours,
            Ok("cusparse") => SpmmKernel::CuSparse,
            _ => SpmmKernel::Auto,
        };
        let sparse_lib = cusparse::CuSparse::new(&stream);
        if sparse_lib.is_none() {
            tracing::info!("cuSPARSE not available: SpMM runs grinnder's kernels only");
        }
        Ok(Cuda {
            gather_rows_per_warp: 1,
            gather_aligned: std::env::var("GRINNDER_GATHER_ALIGNED").map_or(true, |v| v != "0"),
            staging: Default::default(),
            pinned: Default::default(),
            sparse_lib,
            spmm_pick: Default::default(),
            pool,
            budget: None,
            prof,
            timeline: timeline::Timeline::from_env(&stream),
            labels: UploadCache::new(8),
            rows: UploadCache::new(8),
            row_lists: UploadCache::new(64),
            spmm_kernel,
            ctx,
            stream,
            blas,
            k: Kernels { _module: module, f },
            dummy_u32,
            side: std::sync::OnceLock::new(),
            ahead: Default::default(),
            side_time: Default::default(),
            ahead_uploads: std::sync::OnceLock::new(),
            ahead_sparse: std::sync::OnceLock::new(),
        })
    }

    /// The second stream, made on first use: gathers and copies that feed the main stream's
    /// next work.
    pub(crate) fn side_stream(&self) -> &Arc<CudaStream> {
        self.side.get_or_init(|| self.ctx.new_stream().expect("a second CUDA stream"))
    }

    /// A timeline mark on the main stream (`GRINNDER_CUDA_TIMELINE`).
    pub(crate) fn mark(&self, label: &'static str) {
        if let Some(t) = &self.timeline {
            t.mark(&self.stream, "main", label);
        }
    }

    /// A timeline mark on the second stream.
    pub(crate) fn mark_side(&self, side: &CudaStream, label: &'static str) {
        if let Some(t) = &self.timeline {
            t.mark(side, "side", label);
        }
    }

    /// Starts timing an operation when profiling.
    fn span(&self, name: &'static str) -> Option<Span<'_>> {
        self.span_shaped(name, String::new)
    }

    /// [`Cuda::span`], labelled with `shape()` too when the profile keeps shapes apart.
    fn span_shaped(&self, name: &'static str, shape: impl FnOnce() -> String) -> Option<Span<'_>> {
        let p = self.prof.as_ref()?;
        if !p.host {
            // every stream: the operation alone, not waiting for the second stream's work
            self.ctx.synchronize().expect("CUDA synchronize");
        }
        let name = if p.shapes { format!("{name} {}", shape()) } else { name.to_string() };
        Some(Span { cuda: self, name, start: std::time::Instant::now() })
    }

    fn func(&self, name: &str) -> &CudaFunction {
        &self.k.f[name]
    }

    /// Free and total device memory in bytes.
    pub fn mem_info(&self) -> (usize, usize) {
        self.ctx.mem_get_info().expect("CUDA memory info")
    }

    /// Limits the device memory this backend allocates (matrices, sparse structures and
    /// temporaries; not the CUDA context or cuBLAS's workspace) to `bytes`: an allocation past
    /// it panics with the figures, so a large GPU behaves like a smaller one.
    pub fn set_memory_budget(&mut self, bytes: Option<u64>) -> Result<(), CudaError> {
        if bytes.is_some() && self.pool.is_none() {
            return Err(CudaError::Driver(
                "the device's memory pool cannot be queried: --gpu-mem needs it".into(),
            ));
        }
        self.budget = bytes;
        Ok(())
    }

    /// GEMMs on TF32 tensor cores (10-bit mantissa products, fp32 accumulation) instead of fp32.
    pub fn set_tf32(&self, on: bool) -> Result<(), CudaError> {
        use cudarc::cublas::sys;
        let mode = if on {
            sys::cublasMath_t::CUBLAS_TF32_TENSOR_OP_MATH
        } else {
            sys::cublasMath_t::CUBLAS_DEFAULT_MATH
        };
        // SAFETY: a live handle owned by this backend.
        let r = unsafe { sys::cublasSetMathMode(*self.blas.handle(), mode) };
        if r != sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
            return Err(CudaError::Driver(format!("cublasSetMathMode: {r:?}")));
        }
        Ok(())
    }

    /// Checks an allocation of `bytes` against the budget.
    fn charge(&self, bytes: usize) {
        let (Some(budget), Some(pool)) = (self.budget, &self.pool) else { return };
        let used = pool.used();
        if used + bytes as u64 > budget {
            panic!(
                "GPU memory budget exceeded: {:.2} GiB in use, {:.2} GiB more asked, --gpu-mem is {:.2} GiB; \
                 train with (more) --parts, or give a larger --gpu-mem",
                used as f64 / GIB,
                bytes as f64 / GIB,
                budget as f64 / GIB
            );
        }
    }

    /// Forces an SpMM implementation (see [`SpmmKernel`]).
    pub fn set_spmm(&mut self, k: SpmmKernel) {
        self.spmm_kernel = k;
    }

    /// Rows each warp of a row gather copies: 1, or 2 (both rows' loads in flight before the
    /// stores; see `gather_rows2`).
    pub fn set_gather_rows_per_warp(&mut self, rows: usize) {
        assert!(rows == 1 || rows == 2, "1 or 2 rows per warp");
        self.gather_rows_per_warp = rows;
    }

    /// Whether gathers from host memory read each row from the start of its 128-byte line
    /// (`gather_rows_aligned`, for widths that leave rows unaligned; the default) or from the
    /// row's start (for comparisons; also `GRINNDER_GATHER_ALIGNED=0`).
    pub fn set_gather_aligned(&mut self, on: bool) {
        self.gather_aligned = on;
    }

    /// The gather kernel and its launch for `n` rows.
    fn gather_kernel(&self, n: usize) -> (&'static str, LaunchConfig) {
        match self.gather_rows_per_warp {
            2 => ("gather_rows2", warps(n.div_ceil(2))),
            _ => ("gather_rows", warps(n)),
        }
    }

    /// [`Cuda::gather_kernel`] for rows of width `d` in host memory (a table's base is
    /// page-aligned): the aligned kernel where rows do not start on 128-byte lines.
    pub(crate) fn host_gather_kernel(&self, n: usize, d: usize) -> (&'static str, LaunchConfig) {
        match self.gather_rows_per_warp {
            1 => (self.one_row_gather(d), warps(n)),
            _ => self.gather_kernel(n),
        }
    }

    /// The one-row-per-warp gather from host memory for width `d` (both kernels stride over the
    /// rows when the grid has fewer warps).
    pub(crate) fn one_row_gather(&self, d: usize) -> &'static str {
        if self.gather_aligned && d % 4 == 0 && d % 32 != 0 {
            "gather_rows_aligned"
        } else {
            "gather_rows"
        }
    }

    /// Launches `name` (`cross_entropy` or `cross_entropy_ids`) over `n` rows, the row numbers
    /// or node ids at device address `idx`, the labels at `labels`, writing the per-row losses
    /// and hits into `out` ([`Cuda::loss_buffer`]), which the returned loss holds until read.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn cross_entropy_launch(
        &self,
        name: &'static str,
        logits: &DMat,
        labels: u64,
        idx: u64,
        n: usize,
        out: host::PinnedBuf,
        scale: f64,
        grad: &mut DMat,
    ) -> CudaLoss {
        self.mark("logits");
        let (at_loss, at_hit, _) = host::loss_offsets(n);
        let (loss, hit) = (out.dptr() + at_loss as u64, out.dptr() + at_hit as u64);
        let (m, c32, s) = (n as i64, logits.cols as i32, scale as f32);
        let mut l = self.stream.launch_builder(self.func(name));
        l.arg(&logits.data).arg(&labels).arg(&idx).arg(&m).arg(&c32).arg(&s).arg(&mut grad.data);
        l.arg(&loss).arg(&hit);
        // SAFETY: the callers checked the rows against the logits and the labels' range; `out`
        // holds n losses and n flags, mapped, and stays with the returned loss until the kernel
        // has finished.
        unsafe { l.launch(grid(n)) }.expect(name);
        CudaLoss::queued(out, n, &self.stream)
    }

    /// Whether cuSPARSE was found.
    pub fn has_cusparse(&self) -> bool {
        self.sparse_lib.is_some()
    }

    fn upload_slice<T: cudarc::driver::DeviceRepr>(&self, v: &[T]) -> CudaSlice<T> {
        self.upload_slice_on(&self.stream, v)
    }

    /// `v` on the device by `stream` (the main one, or the [`Cuda::ahead_stream`]).
    fn upload_slice_on<T: cudarc::driver::DeviceRepr>(
        &self,
        stream: &Arc<CudaStream>,
        v: &[T],
    ) -> CudaSlice<T> {
        let main = Arc::ptr_eq(stream, &self.stream);
        let s = if !main || std::mem::size_of_val(v) <= PINNED_UPLOAD_MAX {
            // made ahead by a sampling thread, or small (a batch's labels and rows): through
            // page-locked memory, so that it neither waits for its stream to drain (the host
            // queues a training step's work ahead of the device) nor holds up other threads'
            // pageable copies
            self.upload_pinned(stream, v)
        } else {
            self.charge(std::mem::size_of_val(v));
            stream.clone_htod(v).expect("CUDA upload")
        };
        // used on the main stream: freed there
        if main {
            s
        } else {
            self.adopt(s)
        }
    }

    /// The stream of [`Backend::sparse_ahead`] and [`Backend::upload_ahead`] (made on first
    /// use): copies from page-locked buffers ([`Cuda::upload_pinned`]) and the short kernels
    /// that transpose the structures ([`Cuda::transpose_ahead`]); the main stream's later work
    /// waits for them ([`Cuda::join_main`]).
    fn ahead_stream(&self) -> &Arc<CudaStream> {
        self.ahead_uploads.get_or_init(|| self.ctx.new_stream().expect("a CUDA stream for uploads ahead"))
    }

    /// [`Backend::sparse`] by `stream` (a structure without its transpose gets it here, on
    /// the CPU).
    fn sparse_on(&self, stream: &Arc<CudaStream>, s: &SparseMatrix) -> DSparse {
        let built;
        let (t_row_ptr, t_col_idx, t_perm) = if s.has_transpose() {
            (&s.t_row_ptr, &s.t_col_idx, &s.t_perm)
        } else {
            built = s.transpose_parts();
            (&built.0, &built.1, &built.2)
        };
        let up32 = |v: &[u32]| self.upload_slice_on(stream, v);
        DSparse {
            rows: s.rows,
            cols: s.cols,
            nnz: s.nnz(),
            row_ptr: self.upload_slice_on(stream, &s.row_ptr),
            col_idx: up32(&s.col_idx),
            t_row_ptr: self.upload_slice_on(stream, t_row_ptr),
            t_col_idx: up32(t_col_idx),
            t_perm: {
                assert!(
                    s.nnz() <= u32::MAX as usize,
                    "a sparse structure on the GPU holds under 2^32 entries"
                );
                up32(&t_perm.iter().map(|&e| e as u32).collect::<Vec<u32>>())
            },
            ids: self.upload_ids(stream, s),
            csr32: (self.sparse_lib.is_some() && s.nnz().max(s.rows).max(s.cols) < i32::MAX as usize).then(
                || cusparse::Csr32 {
                    ptr: self.upload_slice_on(stream, &narrow(&s.row_ptr)),
                    t_ptr: self.upload_slice_on(stream, &narrow(t_row_ptr)),
                },
            ),
        }
    }

    /// The row and column node ids of `s`, where it has them, on the device by `stream`.
    fn upload_ids(
        &self,
        stream: &Arc<CudaStream>,
        s: &SparseMatrix,
    ) -> Option<(CudaSlice<u32>, CudaSlice<u32>)> {
        match (&s.row_ids, &s.col_ids) {
            (Some(r), Some(c)) => Some((self.upload_slice_on(stream, r), self.upload_slice_on(stream, c))),
            _ => None,
        }
    }

    /// The transpose a structure holds on the device, read back (for checks): offsets,
    /// indices and the CSR position of each entry, as [`SparseMatrix`] stores them.
    pub fn transpose_to_host(&self, s: &DSparse) -> (Vec<u64>, Vec<u32>, Vec<u64>) {
        let down = |v: &CudaSlice<u32>| self.stream.clone_dtoh(v).expect("CUDA download");
        let perm = down(&s.t_perm).into_iter().take(s.nnz).map(u64::from).collect();
        let ptr = self.stream.clone_dtoh(&s.t_row_ptr).expect("CUDA download");
        (ptr, down(&s.t_col_idx).into_iter().take(s.nnz).collect(), perm)
    }

    /// cuSPARSE on the [`Cuda::ahead_stream`] (made on first use).
    fn ahead_sparse(&self) -> Option<&std::sync::Mutex<cusparse::CuSparse>> {
        self.ahead_sparse
            .get_or_init(|| {
                self.sparse_lib.as_ref()?;
                // cuSPARSE makes its handle in the calling thread's current context
                self.ctx.bind_to_thread().ok()?;
                cusparse::CuSparse::new(self.ahead_stream()).map(std::sync::Mutex::new)
            })
            .as_ref()
    }

    /// A structure that came without its transpose ([`SparseMatrix::csr_only`]: a mini-batch's
    /// blocks), uploaded on the [`Cuda::ahead_stream`] and transposed there by cuSPARSE's
    /// conversion to CSC, which always gives the same result: the columns' entries in row
    /// order, as [`SparseMatrix::with_transpose`] builds them. The entry numbers ride along as
    /// the values (their bits moved, never computed with), which makes them the permutation.
    /// A sampling thread's CPU spent 12–25 ms per products-like batch on the transpose; the
    /// device takes a fraction of a millisecond, and the transpose is not uploaded. `None`
    /// (the caller transposes on the CPU): no cuSPARSE, a structure beyond 32-bit offsets, no
    /// entries, or a conversion that failed.
    fn transpose_ahead(&self, s: &SparseMatrix) -> Option<DSparse> {
        let (rows, cols, nnz) = (s.rows, s.cols, s.nnz());
        // 32-bit offsets, and entry numbers below the bit patterns of NaNs as f32
        if nnz == 0 || rows.max(cols).max(nnz) >= 0x7F80_0000 {
            return None;
        }
        let lib = self.ahead_sparse()?;
        let stream = self.ahead_stream();
        let ptr = self.upload_slice_on(stream, &narrow(&s.row_ptr));
        let col_idx = self.upload_slice_on(stream, &s.col_idx);
        let n = nnz as i64;
        // SAFETY: written whole by `iota_u32` below before any use.
        let mut entries = unsafe { stream.alloc::<u32>(nnz) }.expect("CUDA alloc");
        let mut l = stream.launch_builder(self.func("iota_u32"));
        l.arg(&mut entries).arg(&n);
        // SAFETY: `entries` holds nnz elements.
        unsafe { l.launch(grid(nnz)) }.expect("CUDA iota_u32");
        // SAFETY: written whole by the conversion before any use (so are the next two).
        let mut t_ptr = unsafe { stream.alloc::<i32>(cols + 1) }.expect("CUDA alloc");
        // SAFETY: as above.
        let mut t_col_idx = unsafe { stream.alloc::<u32>(nnz) }.expect("CUDA alloc");
        // SAFETY: as above.
        let mut t_perm = unsafe { stream.alloc::<u32>(nnz) }.expect("CUDA alloc");
        let converted = lib.lock().unwrap_or_else(|p| p.into_inner()).csr_to_csc(
            stream,
            (rows, cols, nnz),
            (&ptr, &col_idx, &entries),
            (&mut t_ptr, &mut t_col_idx, &mut t_perm),
        );
        if let Err(e) = converted {
            // the uploads above are the main stream's to free: it waits for them first
            self.join_main(stream);
            static ONCE: std::sync::Once = std::sync::Once::new();
            ONCE.call_once(|| {
                tracing::warn!("cuSPARSE's transpose failed ({e}); the CPU transposes instead")
            });
            return None;
        }
        let widen = |p: &CudaSlice<i32>, len: usize| {
            // SAFETY: written whole by `widen_offsets` below before any use.
            let mut w = unsafe { stream.alloc::<u64>(len) }.expect("CUDA alloc");
            let n = len as i64;
            let mut l = stream.launch_builder(self.func("widen_offsets"));
            l.arg(p).arg(&n).arg(&mut w);
            // SAFETY: `p` and `w` hold `len` elements.
            unsafe { l.launch(grid(len)) }.expect("CUDA widen_offsets");
            self.adopt(w)
        };
        let (row_ptr, t_row_ptr) = (widen(&ptr, rows + 1), widen(&t_ptr, cols + 1));
        Some(DSparse {
            rows,
            cols,
            nnz,
            row_ptr,
            col_idx,
            t_row_ptr,
            t_col_idx: self.adopt(t_col_idx),
            t_perm: self.adopt(t_perm),
            ids: self.upload_ids(stream, s),
            csr32: Some(cusparse::Csr32 { ptr, t_ptr: self.adopt(t_ptr) }),
        })
    }

    /// Launches a row-copy kernel (`gather_rows`, `scatter_add_rows`): `src` (a device address:
    /// device memory, or mapped host memory), the row list (indices uploaded, or a range
    /// start), the width and `dst`.
    fn launch_rows(
        &self,
        name: &str,
        src: u64,
        rows: Rows<'_>,
        d: usize,
        dst: CudaViewMut<'_, f32>,
        cfg: LaunchConfig,
    ) {
        let (idx, start) = match rows {
            Rows::Index(i) => (Some(self.row_lists.get(self, i)), 0i64),
            Rows::Range(s, _) => (None, s as i64),
        };
        self.launch_rows_at(&self.stream, name, src, idx.as_deref(), start, rows.len(), d, dst, cfg);
    }

    /// [`Cuda::launch_rows`] with the row list given as device indices, or a range from `start`.
    #[allow(clippy::too_many_arguments)]
    fn launch_rows_at(
        &self,
        stream: &Arc<CudaStream>,
        name: &str,
        src: u64,
        idx: Option<&CudaSlice<u32>>,
        start: i64,
        n: usize,
        d: usize,
        mut dst: CudaViewMut<'_, f32>,
        cfg: LaunchConfig,
    ) {
        let (n, d, null) = (n as i64, d as i32, 0u64);
        let mut l = stream.launch_builder(self.func(name));
        l.arg(&src);
        match idx {
            Some(i) => l.arg(i),
            None => l.arg(&null),
        };
        l.arg(&start).arg(&n).arg(&d).arg(&mut dst);
        // SAFETY: the callers checked every row number against both matrices.
        unsafe { l.launch(cfg) }.expect(name);
    }

    /// grinnder's SpMM kernels (see `spmm` in kernels.cu).
    fn spmm_ours(&self, s: &DSparse, vals: &DMat, transpose: bool, x: &DMat, beta: f64, out: &mut DMat) {
        let rows = if transpose { s.cols } else { s.rows };
        let (ptr, idx) = if transpose { (&s.t_row_ptr, &s.t_col_idx) } else { (&s.row_ptr, &s.col_idx) };
        let has_perm = transpose as i32;
        let perm = if transpose { &s.t_perm } else { &self.dummy_u32 };
        let (vc, d, r64, beta) = (vals.cols as i32, x.cols as i32, rows as i64, beta as f32);
        // narrow rows: a half-warp each; rows of whole 16-byte vectors (in one head per vector):
        // vector loads; otherwise the general kernel
        let (name, cfg) = match self.spmm_kernel {
            SpmmKernel::Warp => ("spmm", warps(rows)),
            _ if x.cols <= 64 => ("spmm16", grid(rows * 16)),
            _ if x.cols % 4 == 0 && (x.cols / vals.cols) % 4 == 0 => ("spmm_v4", warps(rows)),
            _ => ("spmm", warps(rows)),
        };
        let mut l = self.stream.launch_builder(self.func(name));
        l.arg(ptr).arg(idx).arg(perm).arg(&has_perm).arg(&vals.data).arg(&vc).arg(&x.data).arg(&d);
        l.arg(&mut out.data).arg(&r64).arg(&beta);
        // SAFETY: the structure's indices are below x's rows (checked when it was built).
        unsafe { l.launch(cfg) }.expect("CUDA spmm");
    }

    /// cuSPARSE's SpMM; the transpose through the stored transposed structure, its values
    /// permuted into that order first.
    #[allow(clippy::too_many_arguments)]
    fn spmm_lib(
        &self,
        lib: &cusparse::CuSparse,
        c: &cusparse::Csr32,
        s: &DSparse,
        vals: &DMat,
        transpose: bool,
        x: &DMat,
        beta: f64,
        out: &mut DMat,
    ) -> Result<(), String> {
        if !transpose {
            let shape = (s.rows, s.cols, s.nnz);
            return lib.spmm(&self.stream, shape, &c.ptr, &s.col_idx, &vals.data, x, beta as f32, out);
        }
        let mut vt = self.output(s.nnz, 1);
        let n = s.nnz as i64;
        let mut l = self.stream.launch_builder(self.func("permute"));
        l.arg(&vals.data).arg(&s.t_perm).arg(&n).arg(&mut vt.data);
        // SAFETY: t_perm holds positions below nnz.
        unsafe { l.launch(grid(s.nnz)) }.expect("CUDA permute");
        let shape = (s.cols, s.rows, s.nnz);
        lib.spmm(&self.stream, shape, &c.t_ptr, &s.t_col_idx, &vt.data, x, beta as f32, out)
    }

    /// Whether cuSPARSE is the faster SpMM for this shape: timed at the first shape of its
    /// class (two runs of each into the output, which the SpMM then overwrites, when `beta` is 0;
    /// into a scratch output otherwise), remembered for the class after.
    fn pick_spmm(
        &self,
        s: &DSparse,
        vals: &DMat,
        transpose: bool,
        x: &DMat,
        beta: f64,
        out: &mut DMat,
    ) -> bool {
        let shape = (s.rows, s.cols, s.nnz, x.cols, transpose);
        let key = shape_class(shape);
        if let Some(&(lib, ..)) = self.spmm_pick.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
            return lib;
        }
        let (Some(lib), Some(c)) = (&self.sparse_lib, &s.csr32) else { return false };
        let rows = if transpose { s.cols } else { s.rows };
        // a large first product (a whole graph's aggregation) gets no second output beside it
        let mut scratch = (beta != 0.0).then(|| self.output(rows, x.cols));
        let scratch = scratch.as_mut().unwrap_or(out);
        let time = |f: &mut dyn FnMut(&mut DMat) -> Result<(), String>, out: &mut DMat| {
            f(out)?;
            self.stream.synchronize().map_err(|e| format!("{e:?}"))?;
            let t = std::time::Instant::now();
            f(out)?;
            f(out)?;
            self.stream.synchronize().map_err(|e| format!("{e:?}"))?;
            Ok::<f64, String>(t.elapsed().as_secs_f64() * 500.0)
        };
        let mut run_ours = |o: &mut DMat| {
            self.spmm_ours(s, vals, transpose, x, 0.0, o);
            Ok(())
        };
        let ours = time(&mut run_ours, scratch).expect("CUDA spmm");
        let theirs = time(&mut |o| self.spmm_lib(lib, c, s, vals, transpose, x, 0.0, o), scratch);
        let pick = match theirs {
            Ok(t) => (t < ours, ours, t, shape),
            Err(e) => {
                tracing::warn!("cuSPARSE SpMM failed ({e}); grinnder's kernels only for this shape");
                (false, ours, f64::NAN, shape)
            }
        };
        tracing::debug!(
            "spmm {}×{} ({} entries) width {}{}: grinnder {:.3} ms, cuSPARSE {:.3} ms",
            shape.0,
            shape.1,
            shape.2,
            shape.3,
            if transpose { " transposed" } else { "" },
            pick.1,
            pick.2
        );
        self.spmm_pick.lock().unwrap_or_else(|e| e.into_inner()).insert(key, pick);
        pick.0
    }

    /// Each SpMM shape timed so far (one per class): (rows, cols, entries, width, transposed),
    /// whether cuSPARSE won, and both times in ms.
    pub fn spmm_choices(&self) -> Vec<(SpmmShapeInfo, bool, f64, f64)> {
        let m = self.spmm_pick.lock().unwrap_or_else(|e| e.into_inner());
        let mut v: Vec<_> = m.values().map(|&(l, a, b, shape)| (shape, l, a, b)).collect();
        v.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap_or(std::cmp::Ordering::Equal));
        v
    }

    /// Column sums of a term (see `col_partial` in kernels.cu) into `out` (`1 × w`).
    #[allow(clippy::too_many_arguments)]
    fn col_reduce(
        &self,
        a: &CudaSlice<f32>,
        b: Option<&CudaSlice<f32>>,
        s: Option<&CudaSlice<f32>>,
        n: usize,
        w: usize,
        f: usize,
        mode: i32,
        beta: f32,
        out: &mut CudaSlice<f32>,
    ) {
        if w == 0 {
            return;
        }
        let rows_per: usize = 4096;
        let parts = n.div_ceil(rows_per).max(1);
        let mut partial = self.stream.alloc_zeros::<f32>(parts * w).expect("CUDA alloc");
        let cfg = LaunchConfig {
            grid_dim: (w.div_ceil(32) as u32, parts as u32, 1),
            block_dim: (32, 8, 1),
            shared_mem_bytes: 0,
        };
        let (n64, w32, f32_, rp) = (n as i64, w as i32, f.max(1) as i32, rows_per as i64);
        let mut l = self.stream.launch_builder(self.func("col_partial"));
        l.arg(a).arg(b.unwrap_or(a)).arg(s.unwrap_or(a)).arg(&n64).arg(&w32).arg(&f32_).arg(&mode).arg(&rp);
        l.arg(&mut partial);
        // SAFETY: shapes checked by the callers; every index stays inside the buffers.
        unsafe { l.launch(cfg) }.expect("CUDA col_partial");
        let parts32 = parts as i32;
        let mut l = self.stream.launch_builder(self.func("col_finish"));
        l.arg(&partial).arg(&parts32).arg(&w32).arg(&beta).arg(out);
        // SAFETY: as above.
        unsafe { l.launch(grid(w)) }.expect("CUDA col_finish");
    }
}

/// Lets the device's default memory pool keep freed memory instead of returning it at every
/// synchronisation: an epoch frees and re-allocates the same few-GB matrices, and mapping them
/// afresh each time cost milliseconds per allocation.
fn keep_freed_memory(ctx: &Arc<CudaContext>) -> Option<MemPool> {
    use cudarc::driver::sys;
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    let mut threshold = u64::MAX;
    // SAFETY: plain driver calls on this context's device with valid out-pointers.
    let ok = unsafe {
        ctx.bind_to_thread().is_ok()
            && sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device()) == sys::CUresult::CUDA_SUCCESS
            && sys::cuMemPoolSetAttribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                &mut threshold as *mut u64 as *mut std::ffi::c_void,
            ) == sys::CUresult::CUDA_SUCCESS
    };
    if !ok {
        tracing::warn!("could not raise the CUDA memory pool's release threshold; allocations stay slower");
        return None;
    }
    Some(MemPool(pool as usize))
}

/// The device's default memory pool, which every stream-ordered allocation comes from: its
/// counters give the bytes in use and their peak.
struct MemPool(usize);

impl MemPool {
    fn attr(&self, a: cudarc::driver::sys::CUmemPool_attribute) -> u64 {
        let mut v = 0u64;
        // SAFETY: a valid pool handle and an out-pointer to a u64, as the attribute expects.
        unsafe {
            cudarc::driver::sys::cuMemPoolGetAttribute(
                self.0 as cudarc::driver::sys::CUmemoryPool,
                a,
                &mut v as *mut u64 as *mut std::ffi::c_void,
            );
        }
        v
    }

    fn used(&self) -> u64 {
        self.attr(cudarc::driver::sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT)
    }

    fn peak(&self) -> u64 {
        self.attr(cudarc::driver::sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH)
    }

    fn reset_peak(&self) {
        let mut zero = 0u64;
        // SAFETY: as in `attr`; setting the high watermark to 0 resets it.
        unsafe {
            cudarc::driver::sys::cuMemPoolSetAttribute(
                self.0 as cudarc::driver::sys::CUmemoryPool,
                cudarc::driver::sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH,
                &mut zero as *mut u64 as *mut std::ffi::c_void,
            );
        }
    }
}

fn thr(p: f64) -> u32 {
    grinnder_tensor::dropout::threshold(p)
}

impl Backend for Cuda {
    type T = f32;
    type Mat = DMat;
    type Sparse = DSparse;
    type HostBlock = host::HostTable;
    type Arriving = Arriving;
    type Loss = CudaLoss;

    fn device_memory(&self) -> Option<DeviceMemory> {
        let p = self.pool.as_ref()?;
        Some(DeviceMemory { used: p.used(), peak: p.peak() })
    }

    fn reset_memory_peak(&self) {
        if let Some(p) = &self.pool {
            p.reset_peak();
        }
    }

    fn sparse(&self, s: &SparseMatrix) -> DSparse {
        self.sparse_on(&self.stream, s)
    }

    fn sparse_ahead(&self, s: &SparseMatrix) -> DSparse {
        let on_device = if s.has_transpose() { None } else { self.transpose_ahead(s) };
        let d = on_device.unwrap_or_else(|| self.sparse_on(self.ahead_stream(), s));
        self.join_main(self.ahead_stream());
        d
    }

    fn upload_ahead(&self, m: &Mat<f32>) -> DMat {
        let d = DMat { rows: m.rows, cols: m.cols, data: self.upload_slice_on(self.ahead_stream(), &m.data) };
        self.join_main(self.ahead_stream());
        d
    }

    fn upload(&self, m: &Mat<f32>) -> DMat {
        let _p = self.span("upload");
        DMat { rows: m.rows, cols: m.cols, data: self.upload_slice(&m.data) }
    }

    fn upload_with(&self, rows: usize, cols: usize, fill: &mut dyn FnMut(&mut [f32])) -> DMat {
        let _p = self.span("upload (staged)");
        self.staged_upload(rows, cols, fill)
    }

    fn download_with(&self, m: &DMat, read: &mut dyn FnMut(&[f32])) {
        let _p = self.span("download (staged)");
        self.staged_download(m, read)
    }

    fn host_block(&self, m: Mat<f32>) -> Result<host::HostTable, Mat<f32>> {
        self.table_of(m)
    }

    fn host_block_dims(&self, h: &host::HostTable) -> (usize, usize) {
        (h.rows, h.cols)
    }

    fn host_block_mut<'h>(&self, h: &'h mut host::HostTable) -> &'h mut [f32] {
        h.as_mut_slice()
    }

    fn upload_host_rows(&self, h: &host::HostTable, rows: usize) -> Arriving {
        let _p = self.span("upload (host block)");
        self.upload_table_async(h, rows)
    }

    fn arrived(&self, m: Arriving) -> DMat {
        Cuda::arrived(self, m)
    }

    fn gather_host_block(&self, h: &host::HostTable, rows: Rows<'_>, out: &mut DMat, at: usize) {
        let _p = self.span("gather (host block)");
        self.gather_host(h, rows, out, at)
    }

    fn download(&self, m: &DMat) -> Mat<f32> {
        let _p = self.span("download");
        let n = m.rows * m.cols;
        if n == 0 {
            return Mat::zeros(m.rows, m.cols);
        }
        let mut v = vec![0f32; n];
        self.stream.memcpy_dtoh(&m.data.slice(0..n), &mut v).expect("CUDA download");
        Mat::from_vec(m.rows, m.cols, v)
    }

    fn zeros(&self, rows: usize, cols: usize) -> DMat {
        self.charge(rows * cols * 4);
        let _p = self.span("zeros");
        DMat { rows, cols, data: self.stream.alloc_zeros::<f32>((rows * cols).max(1)).expect("CUDA alloc") }
    }

    fn output(&self, rows: usize, cols: usize) -> DMat {
        self.charge(rows * cols * 4);
        let _p = self.span("output");
        // SAFETY: the caller overwrites every element before reading (the trait's contract).
        let data = unsafe { self.stream.alloc::<f32>((rows * cols).max(1)) }.expect("CUDA alloc");
        DMat { rows, cols, data }
    }

    fn synchronize(&self) {
        let _p = self.prof.as_ref().is_some_and(|p| p.host).then(|| self.span("synchronize (wait)"));
        self.mark("synchronize queued");
        self.stream.synchronize().expect("CUDA synchronize");
        self.mark("synchronized");
    }

    fn dims(&self, m: &DMat) -> (usize, usize) {
        (m.rows, m.cols)
    }

    fn copy(&self, src: &DMat, dst: &mut DMat) {
        let _p = self.span("copy");
        assert_eq!((src.rows, src.cols), (dst.rows, dst.cols), "copy: shapes differ");
        let n = src.rows * src.cols;
        if n > 0 {
            self.stream.memcpy_dtod(&src.data.slice(0..n), &mut dst.data.slice_mut(0..n)).expect("CUDA copy");
        }
    }

    fn gemm(&self, alpha: f64, a: &DMat, ta: bool, b: &DMat, tb: bool, beta: f64, c: &mut DMat) {
        let (m, ka) = if ta { (a.cols, a.rows) } else { (a.rows, a.cols) };
        let (kb, n) = if tb { (b.cols, b.rows) } else { (b.rows, b.cols) };
        let _p = self.span_shaped("gemm", || {
            format!(
                "{}x{} . {}x{}{}{}",
                approx(m),
                approx(ka),
                approx(kb),
                approx(n),
                if ta { " ta" } else { "" },
                if tb { " tb" } else { "" }
            )
        });
        assert_eq!(ka, kb, "gemm: inner dimensions differ");
        assert_eq!((c.rows, c.cols), (m, n), "gemm: output shape");
        if m == 0 || n == 0 {
            return;
        }
        if ka == 0 {
            self.unary(Unary::Scale(beta), c);
            return;
        }
        let op = |t: bool| if t { cublasOperation_t::CUBLAS_OP_T } else { cublasOperation_t::CUBLAS_OP_N };
        // column-major Cᵀ (n × m) = op(B)ᵀ · op(A)ᵀ
        let cfg = GemmConfig {
            transa: op(tb),
            transb: op(ta),
            m: n as i32,
            n: m as i32,
            k: ka as i32,
            alpha: alpha as f32,
            lda: b.cols as i32,
            ldb: a.cols as i32,
            beta: beta as f32,
            ldc: n as i32,
        };
        // a small output over a long inner dimension (weight gradients) gets few thread blocks
        // from cuBLAS: split K into chunks computed as one strided batch, then sum the partial
        // products in a fixed order (deterministic). Split from 65,536 rows on, into chunks of
        // 16,384 rows or up to 64 parts where that makes more: a 256 × 100 gradient over a
        // mini-batch's 140,000 rows in 64 parts (about 2,000 blocks of cuBLAS's small tiles,
        // the whole GPU) takes half the time of 8 parts on one H200; the partial products stay
        // under 64 MiB.
        let parts = (ka / 16_384).max((ka / 2_048).min(64)).min(256).min((64 << 20) / (4 * m * n).max(1));
        if m * n <= (1 << 20) && ka >= 4 * 16_384 && parts >= 4 {
            let kc = ka / parts;
            // element offsets of K-chunk i: op(A) = A (m × K) advances by columns, Aᵀ (A is
            // K × m) by rows; op(B) = B (K × n) by rows, Bᵀ (B is n × K) by columns
            let a_step = if ta { a.cols } else { 1 };
            let b_step = if tb { 1 } else { b.cols };
            let mut partial = self.stream.alloc_zeros::<f32>(parts * m * n).expect("CUDA alloc");
            let batched = StridedBatchedConfig {
                gemm: GemmConfig { k: kc as i32, beta: 0.0, ..cfg },
                batch_size: parts as i32,
                stride_a: (kc * b_step) as i64,
                stride_b: (kc * a_step) as i64,
                stride_c: (m * n) as i64,
            };
            // SAFETY: each batch member reads a K-chunk inside its operand and writes its own
            // m × n block of `partial`.
            unsafe { self.blas.gemm_strided_batched(batched, &b.data, &a.data, &mut partial) }
                .expect("cuBLAS sgemm (split K)");
            let (p32, w, bt) = (parts as i32, (m * n) as i64, beta as f32);
            let mut l = self.stream.launch_builder(self.func("sum_parts"));
            l.arg(&partial).arg(&p32).arg(&w).arg(&bt).arg(&mut c.data);
            // SAFETY: partial holds parts × w values, c holds w.
            unsafe { l.launch(grid(m * n)) }.expect("CUDA sum_parts");
            let done = parts * kc;
            if done < ka {
                // the remainder of K, accumulated
                let rest = ka - done;
                let (ob, oa) = (done * b_step, done * a_step);
                let tail = GemmConfig { k: rest as i32, beta: 1.0, ..cfg };
                let (bv, av) = (b.data.slice(ob..), a.data.slice(oa..));
                // SAFETY: the views start at the remainder's first element; strides unchanged.
                unsafe { self.blas.gemm(tail, &bv, &av, &mut c.data) }.expect("cuBLAS sgemm (K tail)");
            }
            return;
        }
        // SAFETY: the leading dimensions and sizes above describe the three buffers exactly.
        unsafe { self.blas.gemm(cfg, &b.data, &a.data, &mut c.data) }.expect("cuBLAS sgemm");
    }

    fn spmm(&self, s: &DSparse, vals: &DMat, transpose: bool, x: &DMat, beta: f64, out: &mut DMat) {
        let _p = self.span_shaped(if transpose { "spmm (transposed)" } else { "spmm" }, || {
            format!("{}x{} nnz {} width {}", approx(s.rows), approx(s.cols), approx(s.nnz), x.cols)
        });
        assert_eq!(vals.rows, s.nnz, "one value per stored entry");
        let (rows, inner) = if transpose { (s.cols, s.rows) } else { (s.rows, s.cols) };
        assert_eq!(x.rows, inner, "spmm: x rows");
        assert_eq!((out.rows, out.cols), (rows, x.cols), "spmm: output shape");
        if rows == 0 || x.cols == 0 {
            return;
        }
        let lib = match (&self.sparse_lib, &s.csr32) {
            (Some(l), Some(c)) if vals.cols == 1 && s.nnz > 0 => Some((l, c)),
            _ => None,
        };
        let use_lib = match (lib, self.spmm_kernel) {
            (None, _) | (_, SpmmKernel::Ours | SpmmKernel::Warp) => false,
            (Some(_), SpmmKernel::CuSparse) => true,
            (Some(_), SpmmKernel::Auto) => self.pick_spmm(s, vals, transpose, x, beta, out),
        };
        if let (true, Some((l, c))) = (use_lib, lib) {
            match self.spmm_lib(l, c, s, vals, transpose, x, beta, out) {
                Ok(()) => return,
                Err(e) => tracing::warn!("cuSPARSE SpMM failed ({e}); grinnder's kernel runs instead"),
            }
        }
        self.spmm_ours(s, vals, transpose, x, beta, out);
    }

    fn sddmm(&self, s: &DSparse, a: &DMat, b: &DMat, out: &mut DMat) {
        let _p = self.span("sddmm");
        assert_eq!(out.rows, s.nnz, "sddmm: one output row per entry");
        assert_eq!((a.rows, b.rows, a.cols), (s.rows, s.cols, b.cols), "sddmm: operand shapes");
        if s.rows == 0 {
            return;
        }
        let (r64, w, k) = (s.rows as i64, a.cols as i32, out.cols as i32);
        let mut l = self.stream.launch_builder(self.func("sddmm"));
        l.arg(&s.row_ptr)
            .arg(&s.col_idx)
            .arg(&r64)
            .arg(&a.data)
            .arg(&b.data)
            .arg(&w)
            .arg(&k)
            .arg(&mut out.data);
        // SAFETY: shapes checked above.
        unsafe { l.launch(warps(s.rows)) }.expect("CUDA sddmm");
    }

    fn head_dots(&self, z: &DMat, att: &DMat, out: &mut DMat) {
        let _p = self.span("head_dots");
        let (k, f) = (att.rows, att.cols);
        assert_eq!((z.cols, out.cols, out.rows), (k * f, k, z.rows), "head_dots shapes");
        let (n, k32, f32_) = (z.rows as i64, k as i32, f as i32);
        let mut l = self.stream.launch_builder(self.func("head_dots"));
        l.arg(&z.data).arg(&att.data).arg(&n).arg(&k32).arg(&f32_).arg(&mut out.data);
        // SAFETY: shapes checked above.
        unsafe { l.launch(grid(z.rows * k)) }.expect("CUDA head_dots");
    }

    fn head_dots_backward(&self, z: &DMat, att: &DMat, ds: &DMat, dz: &mut DMat, datt: &mut DMat) {
        let _p = self.span("head_dots_backward");
        let (k, f) = (att.rows, att.cols);
        assert_eq!(
            (ds.rows, ds.cols, dz.rows, dz.cols),
            (z.rows, k, z.rows, k * f),
            "head_dots_backward shapes"
        );
        let (n, k32, f32_) = (z.rows as i64, k as i32, f as i32);
        let mut l = self.stream.launch_builder(self.func("head_dots_dz"));
        l.arg(&att.data).arg(&ds.data).arg(&n).arg(&k32).arg(&f32_).arg(&mut dz.data);
        // SAFETY: shapes checked above.
        unsafe { l.launch(grid(z.rows * k * f)) }.expect("CUDA head_dots_dz");
        self.col_reduce(&z.data, Some(&ds.data), None, z.rows, k * f, f, 1, 1.0, &mut datt.data);
    }

    fn edge_softmax(&self, s: &DSparse, src: &DMat, dst: &DMat, slope: f64, out: &mut DMat) {
        let _p = self.span("edge_softmax");
        let k = out.cols;
        assert_eq!((out.rows, src.cols, dst.cols), (s.nnz, k, k), "edge_softmax shapes");
        let (r64, k32, sl) = (s.rows as i64, k as i32, slope as f32);
        let mut l = self.stream.launch_builder(self.func("edge_softmax"));
        l.arg(&s.row_ptr).arg(&s.col_idx).arg(&r64).arg(&src.data).arg(&dst.data).arg(&k32).arg(&sl);
        l.arg(&mut out.data);
        // SAFETY: shapes checked above.
        unsafe { l.launch(grid(s.rows * k)) }.expect("CUDA edge_softmax");
    }

    fn edge_softmax_backward(
        &self,
        s: &DSparse,
        src: &DMat,
        dst: &DMat,
        slope: f64,
        alpha: &DMat,
        dalpha: &DMat,
        dpre: &mut DMat,
    ) {
        let _p = self.span("edge_softmax_backward");
        let k = alpha.cols;
        let (r64, k32, sl) = (s.rows as i64, k as i32, slope as f32);
        let mut l = self.stream.launch_builder(self.func("edge_softmax_backward"));
        l.arg(&s.row_ptr).arg(&s.col_idx).arg(&r64).arg(&src.data).arg(&dst.data).arg(&k32).arg(&sl);
        l.arg(&alpha.data).arg(&dalpha.data).arg(&mut dpre.data);
        // SAFETY: shapes as in edge_softmax.
        unsafe { l.launch(grid(s.rows * k)) }.expect("CUDA edge_softmax_backward");
    }

    fn edge_dropout(&self, s: &DSparse, key: MaskKey, p: f64, vals: &mut DMat) {
        let _p = self.span("edge_dropout");
        assert!((0.0..1.0).contains(&p), "dropout probability {p} outside [0, 1)");
        if p == 0.0 || s.rows == 0 {
            return;
        }
        let (r64, k, t, scale) = (s.rows as i64, vals.cols as i32, thr(p), (1.0 / (1.0 - p)) as f32);
        let (rids, cids, has) = match &s.ids {
            Some((r, c)) => (r, c, 1i32),
            None => (&self.dummy_u32, &self.dummy_u32, 0),
        };
        let mut l = self.stream.launch_builder(self.func("edge_dropout"));
        l.arg(&s.row_ptr).arg(&s.col_idx).arg(&r64).arg(rids).arg(cids).arg(&has).arg(&mut vals.data).arg(&k);
        l.arg(&key.seed).arg(&key.epoch).arg(&key.site).arg(&t).arg(&scale);
        // SAFETY: vals has nnz × k entries.
        unsafe { l.launch(warps(s.rows)) }.expect("CUDA edge_dropout");
    }

    fn gather_rows(&self, x: &DMat, rows: Rows<'_>, out: &mut DMat, at: usize) {
        let _p = self.span("gather_rows");
        let (d, n) = (x.cols, rows.len());
        assert!(out.cols == d && at + n <= out.rows && rows.end() <= x.rows, "gather: shapes");
        if n == 0 || d == 0 {
            return;
        }
        let dst = out.data.slice_mut(at * d..(at + n) * d);
        let (src, _sync) = x.data.device_ptr(&self.stream);
        let (name, cfg) = self.gather_kernel(n);
        self.launch_rows(name, src, rows, d, dst, cfg);
    }

    fn scatter_add_rows(&self, src: &DMat, from: usize, rows: Rows<'_>, out: &mut DMat) {
        let _p = self.span("scatter_add_rows");
        let (d, n) = (out.cols, rows.len());
        assert!(src.cols == d && from + n <= src.rows, "scatter-add: input shape");
        assert!(rows.end() <= out.rows, "scatter-add: row {} out of range", rows.end() - 1);
        if n == 0 || d == 0 {
            return;
        }
        let s = src.data.slice(from * d..(from + n) * d);
        let (s, _sync) = s.device_ptr(&self.stream);
        self.launch_rows("scatter_add_rows", s, rows, d, out.data.slice_mut(..), grid(n * d));
    }

    fn unary(&self, op: Unary, x: &mut DMat) {
        let _p = self.span("unary");
        let n = x.rows * x.cols;
        if n == 0 {
            return;
        }
        let (code, s) = match op {
            Unary::Relu => (0i32, 0.0f32),
            Unary::Scale(s) => (1, s as f32),
        };
        let n64 = n as i64;
        let mut l = self.stream.launch_builder(self.func("unary"));
        l.arg(&mut x.data).arg(&n64).arg(&code).arg(&s);
        // SAFETY: n elements.
        unsafe { l.launch(grid(n)) }.expect("CUDA unary");
    }

    fn binary(&self, op: Binary, a: &DMat, b: &mut DMat) {
        let _p = self.span("binary");
        assert_eq!((a.rows, a.cols), (b.rows, b.cols), "element-wise op on different shapes");
        let n = a.rows * a.cols;
        if n == 0 {
            return;
        }
        let code = match op {
            Binary::Add => 0i32,
            Binary::ReluGrad => 1,
            Binary::Mul => 2,
        };
        let n64 = n as i64;
        let mut l = self.stream.launch_builder(self.func("binary"));
        l.arg(&a.data).arg(&mut b.data).arg(&n64).arg(&code);
        // SAFETY: n elements in both.
        unsafe { l.launch(grid(n)) }.expect("CUDA binary");
    }

    fn add_row(&self, row: &DMat, x: &mut DMat) {
        let _p = self.span("add_row");
        assert_eq!((row.rows, row.cols), (1, x.cols), "bias shape");
        let n = x.rows * x.cols;
        if n == 0 {
            return;
        }
        let (r, d) = (x.rows as i64, x.cols as i32);
        let mut l = self.stream.launch_builder(self.func("add_row"));
        l.arg(&row.data).arg(&mut x.data).arg(&r).arg(&d);
        // SAFETY: shapes checked above.
        unsafe { l.launch(grid(n)) }.expect("CUDA add_row");
    }

    fn col_sums(&self, x: &DMat, beta: f64, out: &mut DMat) {
        let _p = self.span("col_sums");
        assert_eq!((out.rows, out.cols), (1, x.cols), "column-sum shape");
        self.col_reduce(&x.data, None, None, x.rows, x.cols, 1, 0, beta as f32, &mut out.data);
    }

    fn dropout(&self, key: MaskKey, p: f64, ids: Option<&[u32]>, x: &mut DMat) {
        let _p = self.span("dropout");
        assert!((0.0..1.0).contains(&p), "dropout probability {p} outside [0, 1)");
        let n = x.rows * x.cols;
        if p == 0.0 || n == 0 {
            return;
        }
        if let Some(ids) = ids {
            assert_eq!(ids.len(), x.rows, "one node id per row");
        }
        let d_ids = ids.map(|i| self.upload_slice(i));
        let has = d_ids.is_some() as i32;
        let (r, c, t, scale) = (x.rows as i64, x.cols as i32, thr(p), (1.0 / (1.0 - p)) as f32);
        let mut l = self.stream.launch_builder(self.func("dropout"));
        l.arg(&mut x.data).arg(&r).arg(&c).arg(d_ids.as_ref().unwrap_or(&self.dummy_u32)).arg(&has);
        l.arg(&key.seed).arg(&key.epoch).arg(&key.site).arg(&t).arg(&scale);
        // SAFETY: n elements; ids has one entry per row when given.
        unsafe { l.launch(grid(n)) }.expect("CUDA dropout");
    }

    fn layer_norm(&self, x: &DMat, gamma: &DMat, beta: &DMat, eps: f64, y: &mut DMat, stats: &mut DMat) {
        let _p = self.span("layer_norm");
        assert_eq!((stats.rows, stats.cols), (x.rows, 2), "LayerNorm stats are rows × 2");
        if x.rows == 0 {
            return;
        }
        let (n, d, e) = (x.rows as i64, x.cols as i32, eps as f32);
        let mut l = self.stream.launch_builder(self.func("layer_norm"));
        l.arg(&x.data).arg(&gamma.data).arg(&beta.data).arg(&n).arg(&d).arg(&e).arg(&mut y.data);
        l.arg(&mut stats.data);
        // SAFETY: shapes checked above.
        unsafe { l.launch(warps(x.rows)) }.expect("CUDA layer_norm");
    }

    fn layer_norm_backward(
        &self,
        x: &DMat,
        gamma: &DMat,
        stats: &DMat,
        dy: &DMat,
        dx: &mut DMat,
        dgamma: &mut DMat,
        dbeta: &mut DMat,
    ) {
        let _p = self.span("layer_norm_backward");
        if x.rows == 0 {
            return;
        }
        let (n, d) = (x.rows as i64, x.cols as i32);
        let mut l = self.stream.launch_builder(self.func("layer_norm_dx"));
        l.arg(&x.data).arg(&gamma.data).arg(&stats.data).arg(&dy.data).arg(&n).arg(&d).arg(&mut dx.data);
        // SAFETY: shapes as in layer_norm.
        unsafe { l.launch(warps(x.rows)) }.expect("CUDA layer_norm_dx");
        self.col_reduce(
            &dy.data,
            Some(&x.data),
            Some(&stats.data),
            x.rows,
            x.cols,
            1,
            2,
            1.0,
            &mut dgamma.data,
        );
        self.col_reduce(&dy.data, None, None, x.rows, x.cols, 1, 0, 1.0, &mut dbeta.data);
    }

    fn cross_entropy_later(
        &self,
        logits: &DMat,
        labels: &[i32],
        rows: &[u32],
        scale: f64,
        grad: &mut DMat,
    ) -> CudaLoss {
        let _p = self.span("cross_entropy");
        let c = logits.cols;
        assert_eq!(labels.len(), logits.rows, "one label per row");
        for &r in rows {
            let y = labels[r as usize];
            assert!(y >= 0 && (y as usize) < c, "row {r} has label {y}, outside 0..{c}");
        }
        if rows.is_empty() {
            return CudaLoss::nothing();
        }
        let (dl, dr) = (self.labels.get(self, labels), self.rows.get(self, rows));
        let dl: u64 = dl.as_ref().device_ptr(&self.stream).0;
        let dr: u64 = dr.as_ref().device_ptr(&self.stream).0;
        let out = self.loss_buffer(rows.len(), &[]);
        self.cross_entropy_launch("cross_entropy", logits, dl, dr, rows.len(), out, scale, grad)
    }

    fn loss_value(&self, l: CudaLoss) -> (f64, usize) {
        let _p = self.prof.as_ref().is_some_and(|p| p.host).then(|| self.span("loss read (wait)"));
        let sums = self.loss_sums(l);
        self.mark("loss read");
        sums
    }

    fn step(&self, rule: StepRule, p: &mut DMat, g: &DMat, s1: &mut DMat, s2: &mut DMat) {
        let _p = self.span("step");
        let n = p.rows * p.cols;
        assert_eq!(n, g.rows * g.cols, "parameter and gradient shapes differ");
        let n64 = n as i64;
        match rule {
            StepRule::Adam { lr, beta1, beta2, eps, weight_decay, decoupled, t } => {
                let bc1 = (1.0 - beta1.powi(t as i32)) as f32;
                let bc2 = (1.0 - beta2.powi(t as i32)) as f32;
                let (lr, b1, b2, eps, wd, dec) = (
                    lr as f32,
                    beta1 as f32,
                    beta2 as f32,
                    eps as f32,
                    weight_decay as f32,
                    decoupled as i32,
                );
                let mut l = self.stream.launch_builder(self.func("adam"));
                l.arg(&mut p.data).arg(&g.data).arg(&mut s1.data).arg(&mut s2.data).arg(&n64).arg(&lr);
                l.arg(&b1).arg(&b2).arg(&eps).arg(&wd).arg(&dec).arg(&bc1).arg(&bc2);
                // SAFETY: four buffers of n elements.
                unsafe { l.launch(grid(n)) }.expect("CUDA adam");
            }
            StepRule::Sgd { lr, momentum, weight_decay, first } => {
                let (lr, mo, wd, first) = (lr as f32, momentum as f32, weight_decay as f32, first as i32);
                let mut l = self.stream.launch_builder(self.func("sgd"));
                l.arg(&mut p.data)
                    .arg(&g.data)
                    .arg(&mut s1.data)
                    .arg(&n64)
                    .arg(&lr)
                    .arg(&mo)
                    .arg(&wd)
                    .arg(&first);
                // SAFETY: three buffers of n elements.
                unsafe { l.launch(grid(n)) }.expect("CUDA sgd");
            }
        }
    }

    fn count_correct(&self, logits: &DMat, labels: &[i32], rows: &[u32]) -> usize {
        let _p = self.span("count_correct");
        if rows.is_empty() {
            return 0;
        }
        let (dl, dr) = (self.labels.get(self, labels), self.rows.get(self, rows));
        let (dl, dr) = (dl.as_ref(), dr.as_ref());
        let mut ok = self.stream.alloc_zeros::<i32>(rows.len()).expect("CUDA alloc");
        let (m, c) = (rows.len() as i64, logits.cols as i32);
        let mut l = self.stream.launch_builder(self.func("count_correct"));
        l.arg(&logits.data).arg(dl).arg(dr).arg(&m).arg(&c).arg(&mut ok);
        // SAFETY: rows index logits.
        unsafe { l.launch(grid(rows.len())) }.expect("CUDA count_correct");
        self.stream.clone_dtoh(&ok).expect("CUDA download").iter().filter(|&&o| o != 0).count()
    }
}

impl Drop for Cuda {
    fn drop(&mut self) {
        if let Some(t) = &self.timeline {
            let written = self.ctx.synchronize().map_err(|e| std::io::Error::other(format!("{e:?}")));
            if let Err(e) = written.and_then(|()| t.write()) {
                eprintln!("CUDA timeline not written: {e}");
            }
        }
        let Some(p) = &self.prof else { return };
        let ops = p.ops.lock().unwrap_or_else(|e| e.into_inner());
        let total: f64 = ops.values().map(|v| v.0).sum();
        let mut rows: Vec<_> = ops.iter().collect();
        rows.sort_by(|a, b| b.1 .0.total_cmp(&a.1 .0));
        let how =
            if p.host { "host time per call, nothing synchronised" } else { "synchronised per operation" };
        eprintln!("CUDA profile ({how}): {total:.3} s in {} kinds of operation", rows.len());
        for (name, (t, n)) in rows {
            eprintln!("  {name:<40} {t:>9.4} s {:>5.1} % {n:>8} calls", 100.0 * t / total.max(1e-12));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{approx, shape_class};

    #[test]
    fn profile_labels_round_to_two_digits() {
        assert_eq!(
            [approx(0), approx(99), approx(1234), approx(1250), approx(150_123)],
            [0, 99, 1200, 1300, 150_000]
        );
    }

    #[test]
    fn spmm_shapes_within_a_half_octave_share_a_timing() {
        let c = |rows, cols, nnz| shape_class((rows, cols, nnz, 256, false));
        // a mini-batch's blocks: a few per cent apart
        assert_eq!(c(150_000, 540_000, 750_000), c(152_000, 545_000, 760_000));
        // twice the rows, or the entries: another class
        assert_ne!(c(150_000, 540_000, 750_000), c(300_000, 540_000, 750_000));
        assert_ne!(c(150_000, 540_000, 750_000), c(150_000, 540_000, 1_500_000));
        // width and direction decide alone
        assert_ne!(shape_class((10, 10, 10, 256, false)), shape_class((10, 10, 10, 128, false)));
        assert_ne!(shape_class((10, 10, 10, 256, false)), shape_class((10, 10, 10, 256, true)));
        assert_eq!(shape_class((0, 0, 0, 1, false)), (0, 0, 0, 1, false));
    }
}
