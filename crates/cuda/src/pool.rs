//! The device's memory pool and `--gpu-mem`'s budget: freed memory kept for reuse, bytes in
//! use and their peak read from the pool's counters, and each allocation checked against the
//! budget.

use super::*;

/// An allocation's result: the memory, or a panic the binaries report as an error naming the
/// fix where the device has no memory left (another process may hold it); any other driver
/// error panics as before.
pub(crate) trait OrOutOfMemory<T> {
    fn or_oom(self) -> T;
}

impl<T> OrOutOfMemory<T> for Result<T, cudarc::driver::DriverError> {
    #[track_caller]
    fn or_oom(self) -> T {
        match self {
            Ok(v) => v,
            Err(e) if e.0 == cudarc::driver::sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => panic!(
                "GPU out of memory: the device refused an allocation (another process may hold its memory); \
                 train with more --parts, or with a --gpu-mem below the memory it has free"
            ),
            Err(e) => panic!("CUDA alloc: {e:?}"),
        }
    }
}

/// Lets the device's default memory pool keep freed memory instead of returning it at every
/// synchronisation: an epoch frees and re-allocates the same few-GB matrices, and mapping them
/// afresh each time cost milliseconds per allocation.
pub(crate) fn keep_freed_memory(ctx: &Arc<CudaContext>) -> Option<MemPool> {
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
    Some(MemPool(pool as usize, Default::default()))
}

/// The device's default memory pool, which every stream-ordered allocation comes from: its
/// counters give the bytes in use and their peak. The second field keeps the peak of the
/// phases that [`MemPool::phase_peak`] has ended, so that the peak since [`MemPool::reset_peak`]
/// survives them.
pub(crate) struct MemPool(usize, std::sync::atomic::AtomicU64);

impl MemPool {
    pub(crate) fn attr(&self, a: cudarc::driver::sys::CUmemPool_attribute) -> u64 {
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

    pub(crate) fn used(&self) -> u64 {
        self.attr(cudarc::driver::sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT)
    }

    /// The most bytes in use at once since [`MemPool::reset_peak`].
    pub(crate) fn peak(&self) -> u64 {
        self.high().max(self.1.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// The driver's high watermark: the most bytes in use since it was last cleared.
    fn high(&self) -> u64 {
        self.attr(cudarc::driver::sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH)
    }

    /// The most bytes in use at once since the last call (or [`MemPool::reset_peak`]); starts
    /// the next phase's watermark.
    pub(crate) fn phase_peak(&self) -> u64 {
        let h = self.high();
        self.1.fetch_max(h, std::sync::atomic::Ordering::Relaxed);
        self.clear_high();
        h
    }

    pub(crate) fn reset_peak(&self) {
        self.1.store(0, std::sync::atomic::Ordering::Relaxed);
        self.clear_high();
    }

    fn clear_high(&self) {
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

impl Cuda {
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

    /// Checks an allocation of `bytes` against the budget.
    pub(crate) fn charge(&self, bytes: usize) {
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
}
