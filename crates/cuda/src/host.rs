//! Host memory the GPU reads directly (PyTorch-Direct): page-locked rows mapped into the
//! device's address space, gathered by a kernel whose warps each read whole rows from their
//! start (128-byte aligned requests when a row is a multiple of 32 floats) — no CPU gather and
//! no staging copy.

use cudarc::driver::sys;
use cudarc::driver::PinnedHostSlice;
use grinnder_tensor::Rows;

use crate::{err, warps, Cuda, CudaError, DMat};

/// A `rows × cols` row-major `f32` table in page-locked host memory, mapped into the device.
pub struct HostTable {
    buf: PinnedHostSlice<f32>,
    /// The table's address in the device's address space.
    dptr: u64,
    pub rows: usize,
    pub cols: usize,
}

impl HostTable {
    pub fn as_slice(&self) -> &[f32] {
        self.buf.as_slice().expect("pinned host memory")
    }

    pub fn as_mut_slice(&mut self) -> &mut [f32] {
        self.buf.as_mut_slice().expect("pinned host memory")
    }

    /// The page-locked buffer (for plain asynchronous copies).
    pub fn pinned(&self) -> &PinnedHostSlice<f32> {
        &self.buf
    }
}

impl Cuda {
    /// A zeroed, mapped, page-locked host table (not counted in `--gpu-mem`: it is host memory).
    pub fn host_table(&self, rows: usize, cols: usize) -> Result<HostTable, CudaError> {
        let n = (rows * cols).max(1);
        let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
        // SAFETY: the memory is zeroed below before anything reads it.
        let mut buf = unsafe { self.ctx.alloc_pinned_with_flags::<f32>(n, flags) }.map_err(err)?;
        let host = buf.as_mut_ptr().map_err(err)?;
        // SAFETY: `host` points to `n` floats just allocated.
        unsafe { std::ptr::write_bytes(host, 0, n) };
        let mut dptr: sys::CUdeviceptr = 0;
        // SAFETY: `host` was allocated with DEVICEMAP in this context.
        let r = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dptr, host as *mut std::ffi::c_void, 0) };
        if r != sys::CUresult::CUDA_SUCCESS {
            return Err(CudaError::Driver(format!("cuMemHostGetDevicePointer: {r:?}")));
        }
        Ok(HostTable { buf, dptr, rows, cols })
    }

    /// `out[at + i] = t[rows[i]]`, read by the GPU from host memory over the bus (zero-copy).
    pub fn gather_host(&self, t: &HostTable, rows: Rows<'_>, out: &mut DMat, at: usize) {
        let (d, n) = (t.cols, rows.len());
        assert!(out.cols == d && at + n <= out.rows && rows.end() <= t.rows, "gather: shapes");
        if n == 0 || d == 0 {
            return;
        }
        let dst = out.data.slice_mut(at * d..(at + n) * d);
        self.launch_rows("gather_rows", t.dptr, rows, d, dst, warps(n));
    }

    /// `t = m` over the bus into page-locked memory (waits for the copy).
    pub fn download_table(&self, m: &DMat, t: &mut HostTable) {
        assert_eq!((m.rows, m.cols), (t.rows, t.cols), "download: shapes");
        self.stream.memcpy_dtoh(&m.data, &mut t.buf).expect("CUDA download");
        self.stream.synchronize().expect("CUDA synchronize");
    }

    /// `out = t` over the bus with one asynchronous copy from page-locked memory.
    pub fn upload_table(&self, t: &HostTable, out: &mut DMat) {
        assert_eq!((out.rows, out.cols), (t.rows, t.cols), "upload: shapes");
        self.stream.memcpy_htod(&t.buf, &mut out.data).expect("CUDA upload");
    }
}
