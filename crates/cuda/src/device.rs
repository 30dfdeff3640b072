//! Opening a device: the libraries checked before cudarc loads them, the kernels compiled by
//! NVRTC for the device's architecture (the module cache: each kernel loaded once per
//! process), the streams, TF32, and what is written when the backend is dropped.

use super::*;

pub(crate) const SOURCE: &str = include_str!("kernels.cu");

pub(crate) struct Kernels {
    pub(crate) _module: Arc<CudaModule>,
    pub(crate) f: std::collections::HashMap<&'static str, CudaFunction>,
}

pub(crate) const KERNELS: [&str; 40] = [
    "iota_u32",
    "gather_rows_host_bf16",
    "scatter_add_rows_host_bf16",
    "widen_offsets",
    "to_bf16",
    "from_bf16",
    "gather_rows2",
    "gather_rows_aligned",
    "permute",
    "factored_values",
    "sum_parts",
    "spmm16",
    "spmm_v4",
    "dropout",
    "edge_dropout",
    "spmm",
    "sddmm",
    "edge_softmax",
    "edge_softmax_backward",
    "pair_softmax",
    "pair_score_grad",
    "pair_dxr",
    "pair_dxl",
    "head_dots",
    "head_dots_dz",
    "gather_rows",
    "scatter_add_rows",
    "scatter_add_rows_host",
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
        // (docs/benchmarks-log.md, mini-batch zero-copy, the 2026-11-30 entry measuring
        // a961270: 3b61b20, call 23)
        let stream = ctx.new_stream().map_err(err)?;
        let pool = pool::keep_freed_memory(&ctx);
        let blas = CudaBlas::new(stream.clone()).map_err(err)?;
        let dummy_u32 = stream.alloc_zeros::<u32>(1).map_err(err)?;
        let dummy_f32 = stream.alloc_zeros::<f32>(1).map_err(err)?;
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
            dummy_f32,
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

    pub(crate) fn func(&self, name: &str) -> &CudaFunction {
        &self.k.f[name]
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
}
