//! [`Memory`], [`Transfers`] and [`HandOffs`] for the CUDA backend: allocation, copies to and
//! from the host, host blocks and work handed between streams.

use super::*;

impl Memory for Cuda {
    type T = f32;
    type Mat = DMat;
    type Sparse = DSparse;
    type HostBlock = host::HostTable;
    type Arriving = Arriving;
    type Loss = CudaLoss;
    type Leaving = host::Leaving;
    fn device_memory(&self) -> Option<DeviceMemory> {
        let p = self.pool.as_ref()?;
        Some(DeviceMemory { used: p.used(), peak: p.peak() })
    }
    fn reset_memory_peak(&self) {
        if let Some(p) = &self.pool {
            p.reset_peak();
        }
    }
    fn phase_memory_peak(&self) -> Option<u64> {
        self.pool.as_ref().map(MemPool::phase_peak)
    }
    fn zeros(&self, rows: usize, cols: usize) -> DMat {
        self.charge(rows * cols * 4);
        let _p = self.span("zeros");
        DMat { rows, cols, data: self.stream.alloc_zeros::<f32>((rows * cols).max(1)).or_oom() }
    }
    fn output(&self, rows: usize, cols: usize) -> DMat {
        self.charge(rows * cols * 4);
        let _p = self.span("output");
        // SAFETY: the caller overwrites every element before reading (the trait's contract).
        let data = unsafe { self.stream.alloc::<f32>((rows * cols).max(1)) }.or_oom();
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
}

impl Transfers for Cuda {
    fn sparse(&self, s: &SparseMatrix) -> DSparse {
        self.sparse_on(&self.stream, s)
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
    fn converts_bf16(&self) -> bool {
        true
    }
    fn upload_bf16_with(&self, rows: usize, cols: usize, fill: &mut dyn FnMut(&mut [u16])) -> DMat {
        let _p = self.span("upload (staged, bf16)");
        self.staged_upload_bf16(rows, cols, fill)
    }
    fn download_bf16_with(&self, m: &DMat, read: &mut dyn FnMut(&[u16])) {
        let _p = self.span("download (staged, bf16)");
        self.staged_download_bf16(m, read)
    }
    fn release_staging(&self) {
        self.staging.release();
    }
    fn host_block(&self, m: Mat<f32>) -> Result<host::HostTable, Mat<f32>> {
        self.table_of(m)
    }
    fn new_host_block(&self, rows: usize, cols: usize) -> Option<host::HostTable> {
        self.host_table(rows, cols).ok()
    }
    fn new_host_block_bf16(&self, rows: usize, cols: usize) -> Option<host::HostTable> {
        self.host_table_bf16(rows, cols).ok()
    }
    fn host_block_bf16(&self, m: Mat<f32>) -> Result<host::HostTable, Mat<f32>> {
        self.table_bf16_of(m)
    }
    fn download_into_host_block(&self, m: &DMat, from: usize, h: &mut host::HostTable) {
        let _p = self.span("download (host block)");
        self.download_table(m, from, h)
    }
    fn scatter_add_host_block(&self, m: &DMat, from: usize, rows: Rows<'_>, h: &mut host::HostTable) {
        let _p = self.span("scatter-add (host block)");
        self.scatter_add_table(m, from, rows, h)
    }
    fn zero_host_block(&self, h: &mut host::HostTable) {
        let _p = self.span("zeros (host block)");
        self.zero_table(h)
    }
    fn host_block_dims(&self, h: &host::HostTable) -> (usize, usize) {
        (h.rows, h.cols)
    }
    fn host_block_mut<'h>(&self, h: &'h mut host::HostTable) -> &'h mut [f32] {
        h.as_mut_slice()
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
}

impl HandOffs for Cuda {
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
    fn upload_host_rows(&self, h: &host::HostTable, rows: usize) -> Arriving {
        let _p = self.span("upload (host block)");
        self.upload_table_async(h, rows)
    }
    fn arrived(&self, m: Arriving) -> DMat {
        Cuda::arrived(self, m)
    }
    fn download_ahead(&self, m: DMat) -> host::Leaving {
        let _p = self.span("download (ahead)");
        Cuda::download_ahead(self, m)
    }
    fn downloaded(&self, l: host::Leaving, read: &mut dyn FnMut(&[f32])) {
        let _p = self.span("download (ahead) read");
        Cuda::downloaded(self, l, read)
    }
}
