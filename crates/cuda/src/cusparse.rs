//! cuSPARSE's CSR SpMM beside grinnder's kernels: the backend times both on the first call of
//! each shape and keeps the faster (see `Cuda::spmm`). cuSPARSE gets 32-bit offsets and
//! indices (structures under 2³¹ entries), row-major dense operands, and for `Aᵀ·X` the stored
//! transpose with its values permuted — never its own transposed mode, which is not
//! deterministic.

use std::sync::Arc;

use cudarc::cusparse::sys;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};

use crate::DMat;

/// A cuSPARSE handle bound to one of the backend's streams.
pub(crate) struct CuSparse {
    handle: sys::cusparseHandle_t,
}

// SAFETY: the handle is used from one thread at a time (the backend's calls are sequential on
// its stream); cuSPARSE handles may move between threads.
unsafe impl Send for CuSparse {}
// SAFETY: as above.
unsafe impl Sync for CuSparse {}

fn check(what: &str, r: sys::cusparseStatus_t) -> Result<(), String> {
    if r == sys::cusparseStatus_t::CUSPARSE_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(format!("{what}: {r:?}"))
    }
}

/// A CSR structure as cuSPARSE reads it: 32-bit offsets (the column indices are the backend's
/// u32 array, the same bits as i32 below 2³¹).
pub(crate) struct Csr32 {
    pub ptr: CudaSlice<i32>,
    pub t_ptr: CudaSlice<i32>,
}

impl CuSparse {
    /// `None` where libcusparse is absent or a handle cannot be made.
    pub fn new(stream: &CudaStream) -> Option<CuSparse> {
        // SAFETY: only tries to dlopen the library.
        if !unsafe { sys::is_culib_present() } {
            return None;
        }
        let mut handle: sys::cusparseHandle_t = std::ptr::null_mut();
        // SAFETY: out-pointer to a handle; the stream outlives the backend that owns both.
        unsafe {
            check("cusparseCreate", sys::cusparseCreate(&mut handle)).ok()?;
            check("cusparseSetStream", sys::cusparseSetStream(handle, stream.cu_stream() as _)).ok()?;
        }
        Some(CuSparse { handle })
    }

    /// `out = A·x + beta·out` for the CSR `A` (`rows × cols`, `nnz` entries) given by device
    /// addresses of its offsets (i32), indices (u32) and values (f32).
    #[allow(clippy::too_many_arguments)]
    pub fn spmm(
        &self,
        stream: &Arc<CudaStream>,
        (rows, cols, nnz): (usize, usize, usize),
        ptr: &CudaSlice<i32>,
        idx: &CudaSlice<u32>,
        vals: &CudaSlice<f32>,
        x: &DMat,
        beta: f32,
        out: &mut DMat,
    ) -> Result<(), String> {
        use sys::cusparseIndexType_t::CUSPARSE_INDEX_32I;
        let f32t = sys::cudaDataType::CUDA_R_32F;
        let row = sys::cusparseOrder_t::CUSPARSE_ORDER_ROW;
        let op = sys::cusparseOperation_t::CUSPARSE_OPERATION_NON_TRANSPOSE;
        let alg = sys::cusparseSpMMAlg_t::CUSPARSE_SPMM_CSR_ALG2;
        let d = x.cols as i64;
        let (p, _s1) = ptr.device_ptr(stream);
        let (i, _s2) = idx.device_ptr(stream);
        let (v, _s3) = vals.device_ptr(stream);
        let (xp, _s4) = x.data.device_ptr(stream);
        let (op_, _s5) = out.data.device_ptr_mut(stream);
        let (mut a, mut b, mut c) = (std::ptr::null_mut(), std::ptr::null_mut(), std::ptr::null_mut());
        let alpha = 1f32;
        // SAFETY: every address is a live device allocation of the stated length; descriptors
        // are destroyed before returning; the buffer lives until the call is queued (its free
        // is stream-ordered after it).
        unsafe {
            let base = sys::cusparseIndexBase_t::CUSPARSE_INDEX_BASE_ZERO;
            let t = (CUSPARSE_INDEX_32I, CUSPARSE_INDEX_32I);
            let r = sys::cusparseCreateCsr(
                &mut a,
                rows as i64,
                cols as i64,
                nnz as i64,
                p as _,
                i as _,
                v as _,
                t.0,
                t.1,
                base,
                f32t,
            );
            check("cusparseCreateCsr", r)?;
            check(
                "cusparseCreateDnMat",
                sys::cusparseCreateDnMat(&mut b, cols as i64, d, d, xp as _, f32t, row),
            )?;
            check(
                "cusparseCreateDnMat",
                sys::cusparseCreateDnMat(&mut c, rows as i64, d, d, op_ as _, f32t, row),
            )?;
            let alpha_p = &alpha as *const f32 as *const std::ffi::c_void;
            let beta_p = &beta as *const f32 as *const std::ffi::c_void;
            let mut size = 0usize;
            let r = sys::cusparseSpMM_bufferSize(
                self.handle,
                op,
                op,
                alpha_p,
                a,
                b,
                beta_p,
                c,
                f32t,
                alg,
                &mut size,
            );
            check("cusparseSpMM_bufferSize", r)?;
            let buf = stream.alloc::<u8>(size.max(1)).map_err(|e| format!("{e:?}"))?;
            let (bp, _s6) = buf.device_ptr(stream);
            let r = sys::cusparseSpMM(self.handle, op, op, alpha_p, a, b, beta_p, c, f32t, alg, bp as _);
            check("cusparseSpMM", r)?;
            sys::cusparseDestroySpMat(a);
            sys::cusparseDestroyDnMat(b);
            sys::cusparseDestroyDnMat(c);
        }
        Ok(())
    }
}

impl CuSparse {
    /// The transpose of the CSR structure `(ptr, idx)` (`rows × cols`, `nnz` entries) as CSR
    /// `(t_ptr, t_idx)`, with `vals` (4-byte values, moved bit for bit) carried into `t_vals`
    /// in the transpose's order. cuSPARSE's conversion always gives the same result, each
    /// transposed row's entries in ascending column order.
    pub fn csr_to_csc(
        &self,
        stream: &Arc<CudaStream>,
        (rows, cols, nnz): (usize, usize, usize),
        (ptr, idx, vals): (&CudaSlice<i32>, &CudaSlice<u32>, &CudaSlice<u32>),
        (t_ptr, t_idx, t_vals): (&mut CudaSlice<i32>, &mut CudaSlice<u32>, &mut CudaSlice<u32>),
    ) -> Result<(), String> {
        // the values travel as f32 bit patterns: cuSPARSE moves them without arithmetic
        let f32t = sys::cudaDataType::CUDA_R_32F;
        let numeric = sys::cusparseAction_t::CUSPARSE_ACTION_NUMERIC;
        let base = sys::cusparseIndexBase_t::CUSPARSE_INDEX_BASE_ZERO;
        let alg = sys::cusparseCsr2CscAlg_t::CUSPARSE_CSR2CSC_ALG_DEFAULT;
        let (m, n, z) = (rows as i32, cols as i32, nnz as i32);
        let (p, _s1) = ptr.device_ptr(stream);
        let (i, _s2) = idx.device_ptr(stream);
        let (v, _s3) = vals.device_ptr(stream);
        let (tp, _s4) = t_ptr.device_ptr_mut(stream);
        let (ti, _s5) = t_idx.device_ptr_mut(stream);
        let (tv, _s6) = t_vals.device_ptr_mut(stream);
        let mut size = 0usize;
        // both calls take the same description of the conversion, then their own last argument
        macro_rules! convert {
            ($f:path, $last:expr) => {
                $f(
                    self.handle,
                    m,
                    n,
                    z,
                    v as _,
                    p as _,
                    i as _,
                    tv as _,
                    tp as _,
                    ti as _,
                    f32t,
                    numeric,
                    base,
                    alg,
                    $last,
                )
            };
        }
        // SAFETY: every address is a live device allocation of the stated length (offsets
        // rows + 1 and cols + 1, the others nnz); the buffer lives until the call is queued
        // (its free is stream-ordered after it).
        unsafe {
            check("cusparseCsr2cscEx2_bufferSize", convert!(sys::cusparseCsr2cscEx2_bufferSize, &mut size))?;
            let buf = stream.alloc::<u8>(size.max(1)).map_err(|e| format!("{e:?}"))?;
            let (bp, _s7) = buf.device_ptr(stream);
            check("cusparseCsr2cscEx2", convert!(sys::cusparseCsr2cscEx2, bp as _))?;
        }
        Ok(())
    }
}

impl Drop for CuSparse {
    fn drop(&mut self) {
        // SAFETY: the handle was created in `new` and is destroyed once.
        unsafe {
            sys::cusparseDestroy(self.handle);
        }
    }
}
