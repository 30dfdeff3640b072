//! Host arrays and sparse structures onto the device: through page-locked buffers, cached
//! where the same small arrays recur, on the stream of uploads made ahead, and mini-batch
//! structures transposed on the device.

use super::*;

/// Device copies of small host arrays that are passed again and again (labels, split rows):
/// an array is uploaded once and found again by comparing its contents with a host copy (exact;
/// the comparison runs on the host while the device computes). Besides the transfer, a hit
/// over [`PINNED_UPLOAD_MAX`] saves a stream synchronisation: a copy from pageable memory
/// waits for the stream to drain.
pub(crate) struct UploadCache<T> {
    pub(crate) entries: std::sync::Mutex<Vec<Cached<T>>>,
    /// Arrays kept (most recently used first).
    pub(crate) keep: usize,
}

/// A host array and its device copy.
pub(crate) type Cached<T> = (Vec<T>, Arc<CudaSlice<T>>);

impl<T> UploadCache<T> {
    pub(crate) fn new(keep: usize) -> Self {
        UploadCache { entries: std::sync::Mutex::new(Vec::new()), keep }
    }
}

impl<T: cudarc::driver::DeviceRepr + PartialEq + Clone> UploadCache<T> {
    pub(crate) fn get(&self, cuda: &Cuda, v: &[T]) -> Arc<CudaSlice<T>> {
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
pub(crate) const PINNED_UPLOAD_MAX: usize = 4 << 20;

/// 64-bit offsets as cuSPARSE's 32-bit ones (the caller has checked they fit).
pub(crate) fn narrow(offsets: &[u64]) -> Vec<i32> {
    offsets.iter().map(|&o| o as i32).collect()
}

impl Cuda {
    pub(crate) fn upload_slice<T: cudarc::driver::DeviceRepr>(&self, v: &[T]) -> CudaSlice<T> {
        self.upload_slice_on(&self.stream, v)
    }

    /// `v` on the device by `stream` (the main one, or the [`Cuda::ahead_stream`]).
    pub(crate) fn upload_slice_on<T: cudarc::driver::DeviceRepr>(
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

    /// The stream of [`HandOffs::sparse_ahead`] and [`HandOffs::upload_ahead`] (made on first
    /// use): copies from page-locked buffers ([`Cuda::upload_pinned`]) and the short kernels
    /// that transpose the structures ([`Cuda::transpose_ahead`]); the main stream's later work
    /// waits for them ([`Cuda::join_main`]).
    pub(crate) fn ahead_stream(&self) -> &Arc<CudaStream> {
        self.ahead_uploads.get_or_init(|| self.ctx.new_stream().expect("a CUDA stream for uploads ahead"))
    }

    /// [`Transfers::sparse`] by `stream` (a structure without its transpose gets it here, on
    /// the CPU).
    pub(crate) fn sparse_on(&self, stream: &Arc<CudaStream>, s: &SparseMatrix) -> DSparse {
        let built;
        // a structure sent without its entry order keeps none on the device either
        let keep_perm = !s.has_transpose() || s.has_entry_order();
        let (t_row_ptr, t_col_idx, t_perm) = if s.has_transpose() {
            (&s.t_row_ptr, &s.t_col_idx, &s.t_perm)
        } else {
            built = s.transpose_parts();
            (&built.0, &built.1, &built.2)
        };
        let up32 = |v: &[u32]| self.upload_slice_on(stream, v);
        assert!(s.nnz() <= u32::MAX as usize, "a sparse structure on the GPU holds under 2^32 entries");
        DSparse {
            rows: s.rows,
            cols: s.cols,
            nnz: s.nnz(),
            row_ptr: self.upload_slice_on(stream, &s.row_ptr),
            col_idx: up32(&s.col_idx),
            t_row_ptr: self.upload_slice_on(stream, t_row_ptr),
            t_col_idx: up32(t_col_idx),
            t_perm: keep_perm.then(|| up32(&t_perm.iter().map(|&e| e as u32).collect::<Vec<u32>>())),
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
    pub(crate) fn upload_ids(
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
    /// indices and the CSR position of each entry, as [`SparseMatrix`] stores them (no
    /// positions for a structure kept without its entry order).
    pub fn transpose_to_host(&self, s: &DSparse) -> (Vec<u64>, Vec<u32>, Vec<u64>) {
        let down = |v: &CudaSlice<u32>| self.stream.clone_dtoh(v).expect("CUDA download");
        let perm = s
            .t_perm
            .as_ref()
            .map_or(Vec::new(), |p| down(p).into_iter().take(s.nnz).map(u64::from).collect());
        let ptr = self.stream.clone_dtoh(&s.t_row_ptr).expect("CUDA download");
        (ptr, down(&s.t_col_idx).into_iter().take(s.nnz).collect(), perm)
    }

    /// cuSPARSE on the [`Cuda::ahead_stream`] (made on first use).
    pub(crate) fn ahead_sparse(&self) -> Option<&std::sync::Mutex<cusparse::CuSparse>> {
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
    pub(crate) fn transpose_ahead(&self, s: &SparseMatrix) -> Option<DSparse> {
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
        let mut entries = unsafe { stream.alloc::<u32>(nnz) }.or_oom();
        let mut l = stream.launch_builder(self.func("iota_u32"));
        l.arg(&mut entries).arg(&n);
        // SAFETY: `entries` holds nnz elements.
        unsafe { l.launch(grid(nnz)) }.expect("CUDA iota_u32");
        // SAFETY: written whole by the conversion before any use (so are the next two).
        let mut t_ptr = unsafe { stream.alloc::<i32>(cols + 1) }.or_oom();
        // SAFETY: as above.
        let mut t_col_idx = unsafe { stream.alloc::<u32>(nnz) }.or_oom();
        // SAFETY: as above.
        let mut t_perm = unsafe { stream.alloc::<u32>(nnz) }.or_oom();
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
            let mut w = unsafe { stream.alloc::<u64>(len) }.or_oom();
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
            t_perm: Some(self.adopt(t_perm)),
            ids: self.upload_ids(stream, s),
            csr32: Some(cusparse::Csr32 { ptr, t_ptr: self.adopt(t_ptr) }),
        })
    }
}
