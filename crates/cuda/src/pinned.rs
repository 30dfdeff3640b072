//! Page-locked host memory for host tables (the host blocks of the tiered executor): anonymous
//! memory faulted in on every core — on 2 MiB pages where the system gives them — and then
//! registered with the driver, instead of `cuMemHostAlloc`, whose one thread zeroes and locks
//! every page of an allocation itself.
//!
//! Why not `cuMemHostAlloc`: on one H200 it locked 0.66 GB blocks at about 2 GB/s, 0.3 s each,
//! and the first blocks of an igb-medium-like run (24 GiB of page-locked blocks) spent most of
//! their 23 s there (BENCHMARKS, the time to the first epoch). `grinnder bench transfer`
//! measures both ways on the machine at hand (`page_lock`). `GRINNDER_PAGE_LOCK=alloc` selects
//! `cuMemHostAlloc` again (for comparisons).

use std::sync::Arc;

use cudarc::driver::sys;
use cudarc::driver::{CudaContext, PinnedHostSlice};
use rayon::prelude::*;

use crate::{err, CudaError};

/// How page-locked memory is made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PageLock {
    /// `cuMemHostAlloc` (mapped, portable), then zeroed by one thread.
    Alloc,
    /// Anonymous memory faulted in by every core (zeroed by the kernel), then registered
    /// (`cuMemHostRegister`, mapped, portable); `Alloc` where the driver refuses (said once).
    Register,
}

impl PageLock {
    /// The method host tables use: [`PageLock::Register`] unless `GRINNDER_PAGE_LOCK=alloc`.
    pub fn chosen() -> PageLock {
        static CHOSEN: std::sync::OnceLock<PageLock> = std::sync::OnceLock::new();
        *CHOSEN.get_or_init(|| match std::env::var("GRINNDER_PAGE_LOCK").as_deref() {
            Ok("alloc") => PageLock::Alloc,
            _ => PageLock::Register,
        })
    }
}

/// `len` zeroed `f32`s of page-locked host memory, mapped into the device.
pub(crate) enum PageLocked {
    Alloc(PinnedHostSlice<f32>),
    Registered(Registered),
}

impl PageLocked {
    /// `n` (at least one) zeroed elements made by `how`, and their address in the device's
    /// address space.
    pub(crate) fn new(
        ctx: &Arc<CudaContext>,
        n: usize,
        how: PageLock,
    ) -> Result<(PageLocked, u64), CudaError> {
        let n = n.max(1);
        if how == PageLock::Register {
            match Registered::new(ctx, n) {
                Ok(mut r) => {
                    let dptr = device_pointer(r.map.as_mut_ptr() as *mut std::ffi::c_void)?;
                    return Ok((PageLocked::Registered(r), dptr));
                }
                Err(e) => {
                    static SAID: std::sync::Once = std::sync::Once::new();
                    SAID.call_once(|| {
                        tracing::warn!(
                            "{e}: host blocks are page-locked by cuMemHostAlloc instead (slower to make)"
                        )
                    });
                }
            }
        }
        // cuMemHostAlloc: asked for, or where the driver would not register the memory
        let (buf, dptr) = mapped_zeroed::<f32>(ctx, n)?;
        Ok((PageLocked::Alloc(buf), dptr))
    }

    pub(crate) fn len(&self) -> usize {
        match self {
            PageLocked::Alloc(b) => b.len(),
            PageLocked::Registered(r) => r.len,
        }
    }

    pub(crate) fn as_slice(&self) -> &[f32] {
        match self {
            PageLocked::Alloc(b) => b.as_slice().expect("pinned host memory"),
            // SAFETY: `len` f32s of a live mapping, written only through `&mut self`
            PageLocked::Registered(r) => unsafe {
                std::slice::from_raw_parts(r.map.as_ptr() as *const f32, r.len)
            },
        }
    }

    pub(crate) fn as_mut_slice(&mut self) -> &mut [f32] {
        match self {
            PageLocked::Alloc(b) => b.as_mut_slice().expect("pinned host memory"),
            // SAFETY: as in `as_slice`, borrowed mutably
            PageLocked::Registered(r) => unsafe {
                std::slice::from_raw_parts_mut(r.map.as_mut_ptr() as *mut f32, r.len)
            },
        }
    }
}

/// Anonymous memory registered with the driver; unregistered before it is unmapped.
pub(crate) struct Registered {
    map: memmap2::MmapMut,
    len: usize,
    ctx: Arc<CudaContext>,
}

/// The bytes each core faults in at a time: a huge page.
const TOUCH_BYTES: usize = 2 << 20;

impl Registered {
    fn new(ctx: &Arc<CudaContext>, n: usize) -> Result<Registered, CudaError> {
        let bytes = n * std::mem::size_of::<f32>();
        let mut map =
            memmap2::MmapMut::map_anon(bytes).map_err(|e| CudaError::Driver(format!("mmap: {e}")))?;
        // before the first touch: the pages come huge where the system can (fewer faults, fewer
        // pages to lock)
        #[cfg(target_os = "linux")]
        let _ = map.advise(memmap2::Advice::HugePage);
        // every core faults in its share; a write per 4 KiB page (the kernel zeroes each)
        map.par_chunks_mut(TOUCH_BYTES).for_each(|c| {
            for i in (0..c.len()).step_by(4096) {
                // SAFETY: in bounds; volatile so that the write of a zero is not elided
                unsafe { std::ptr::write_volatile(c.as_mut_ptr().add(i), 0) };
            }
        });
        ctx.bind_to_thread().map_err(err)?;
        let flags = sys::CU_MEMHOSTREGISTER_DEVICEMAP | sys::CU_MEMHOSTREGISTER_PORTABLE;
        // SAFETY: `bytes` bytes of a live mapping, unregistered in `drop` before it is unmapped
        let r = unsafe { sys::cuMemHostRegister_v2(map.as_mut_ptr() as *mut std::ffi::c_void, bytes, flags) };
        if r != sys::CUresult::CUDA_SUCCESS {
            return Err(CudaError::Driver(format!("cuMemHostRegister of {bytes} bytes: {r:?}")));
        }
        Ok(Registered { map, len: n, ctx: ctx.clone() })
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        // (the owner waited for the copies reading the memory)
        let _ = self.ctx.bind_to_thread();
        // SAFETY: registered in `new`, not yet unregistered
        unsafe { sys::cuMemHostUnregister(self.map.as_mut_ptr() as *mut std::ffi::c_void) };
    }
}

/// `n` elements of page-locked host memory mapped into the device, and their device address.
///
/// # Safety
/// The memory is uninitialised: the caller writes what is read.
pub(crate) unsafe fn mapped_uninit<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
    ctx: &Arc<CudaContext>,
    n: usize,
) -> Result<(PinnedHostSlice<T>, u64), CudaError> {
    let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
    // SAFETY: the caller's promise.
    let mut buf = unsafe { ctx.alloc_pinned_with_flags::<T>(n, flags) }.map_err(err)?;
    let host = buf.as_mut_ptr().map_err(err)?;
    // (allocated with DEVICEMAP in this context)
    Ok((buf, device_pointer(host as *mut std::ffi::c_void)?))
}

/// `n` (at least one) zeroed elements of page-locked host memory (`cuMemHostAlloc`) mapped into
/// the device, and their device address.
pub(crate) fn mapped_zeroed<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
    ctx: &Arc<CudaContext>,
    n: usize,
) -> Result<(PinnedHostSlice<T>, u64), CudaError> {
    let n = n.max(1);
    // SAFETY: the memory is zeroed below before anything reads it.
    let (mut buf, dptr) = unsafe { mapped_uninit::<T>(ctx, n) }?;
    let host = buf.as_mut_ptr().map_err(err)?;
    // SAFETY: `host` points to `n` elements just allocated; all-zero bits are a valid `T`.
    unsafe { std::ptr::write_bytes(host, 0, n) };
    Ok((buf, dptr))
}

/// The device's address of page-locked host memory mapped into it (allocated or registered
/// with DEVICEMAP in the current context).
pub(crate) fn device_pointer(host: *mut std::ffi::c_void) -> Result<u64, CudaError> {
    let mut dptr: sys::CUdeviceptr = 0;
    // SAFETY: the driver only looks the address up; it fails for memory it does not map
    let r = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dptr, host, 0) };
    if r != sys::CUresult::CUDA_SUCCESS {
        return Err(CudaError::Driver(format!("cuMemHostGetDevicePointer: {r:?}")));
    }
    Ok(dptr)
}
