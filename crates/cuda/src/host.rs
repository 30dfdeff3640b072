//! Host memory the GPU reads directly (PyTorch-Direct): page-locked rows mapped into the
//! device's address space, gathered by a kernel whose warps each read whole rows from their
//! start (128-byte aligned requests when a row is a multiple of 32 floats) — no CPU gather and
//! no staging copy.

use std::sync::{Arc, Mutex};

use cudarc::driver::sys;
use cudarc::driver::{
    CudaContext, CudaEvent, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, PinnedHostSlice, PushKernelArg,
};
use grinnder_tensor::{Mat, Rows};

use crate::clock::EventClock;
use crate::pinned::{mapped_uninit, mapped_zeroed, PageLock, PageLocked};
use crate::pool::OrOutOfMemory;
use crate::{err, Arriving, Cuda, CudaError, DMat};

/// A `rows × cols` row-major table in page-locked host memory, mapped into the device: of `f32`,
/// or of bf16 ([`Cuda::host_table_bf16`]; the device widens what it reads and rounds what it
/// writes, so that the bus carries two bytes an element).
pub struct HostTable {
    pub(crate) buf: PageLocked,
    /// The table's address in the device's address space.
    pub(crate) dptr: u64,
    /// Per stream (its handle), recorded after the last copy queued there from the table: the
    /// host's next write waits for them ([`HostTable::as_mut_slice`]), the main stream's next
    /// write to it too ([`HostTable::before_device_write`]). (Gathers reading the table through
    /// `dptr` on the main stream leave none: its later work is queued behind them.)
    copies: Mutex<Vec<(usize, CudaEvent)>>,
    /// Recorded on the main stream after the last work queued there that writes the table
    /// through the device (a download into it, an add, zeros) or reads it by `dptr` from
    /// another table's point of view: copies and gathers on other streams wait for it, and the
    /// host waits for it before it reads, writes or frees the table.
    device_use: Mutex<Option<CudaEvent>>,
    pub rows: usize,
    pub cols: usize,
    /// Whether the elements are bf16 (`u16`s of [`grinnder_tensor::scalar::to_bf16`]'s bits);
    /// fixed when the table is made (the kernels size their reads by it).
    pub(crate) bf16: bool,
}

impl Drop for HostTable {
    /// The page-locked memory is freed once the copies reading it, and the device work queued
    /// on it, have finished.
    fn drop(&mut self) {
        self.settle();
    }
}

impl HostTable {
    /// A table of page-locked `buf` (at `dptr` on the device), used by no copy yet.
    pub(crate) fn new(buf: PageLocked, dptr: u64, rows: usize, cols: usize, bf16: bool) -> HostTable {
        HostTable { buf, dptr, copies: Default::default(), device_use: Default::default(), rows, cols, bf16 }
    }

    /// The elements (of an `f32` table), once the device work writing them has finished.
    pub fn as_slice(&self) -> &[f32] {
        assert!(!self.bf16, "a bf16 table's elements are read with as_u16");
        self.wait_device_use();
        self.buf.as_slice()
    }

    /// Whether the elements are bf16 ([`Cuda::host_table_bf16`]).
    pub fn is_bf16(&self) -> bool {
        self.bf16
    }

    /// Waits for the device work queued on the table (before the host reads it).
    pub(crate) fn wait_device_use(&self) {
        if let Some(e) = self.device_use.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
            e.synchronize().expect("CUDA event");
        }
    }

    /// The elements (of an `f32` table), for writing, once the copies reading them and the
    /// device work on them have finished.
    pub fn as_mut_slice(&mut self) -> &mut [f32] {
        assert!(!self.bf16, "a bf16 table's elements are written with as_mut_u16");
        self.settle();
        self.buf.as_mut_slice()
    }

    /// Waits for the copies queued from the table and the device work queued on it (before the
    /// host touches it).
    pub(crate) fn settle(&mut self) {
        for (_, e) in self.copies.get_mut().unwrap_or_else(|p| p.into_inner()).drain(..) {
            e.synchronize().expect("CUDA event");
        }
        if let Some(e) = self.device_use.get_mut().unwrap_or_else(|p| p.into_inner()).take() {
            e.synchronize().expect("CUDA event");
        }
    }

    /// Makes `stream`'s next work (a write through the device) wait for the copies queued
    /// from the table on other streams; the host does not wait.
    pub(crate) fn before_device_write(&self, stream: &CudaStream) {
        let key = stream.cu_stream() as usize;
        for (s, e) in self.copies.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            if *s != key {
                stream.wait(e).expect("CUDA stream wait");
            }
        }
    }

    /// Records that work touching the table was queued on `stream` (the main one).
    pub(crate) fn used_on(&self, stream: &CudaStream) {
        let e = stream.record_event(None).expect("CUDA event");
        *self.device_use.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
    }

    /// Makes `stream` (another than the main one) wait for the device work queued on the table.
    pub(crate) fn after_device_use(&self, stream: &CudaStream) {
        if let Some(e) = self.device_use.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
            stream.wait(e).expect("CUDA stream wait");
        }
    }

    /// Queues a copy of the first `n` elements (of an `f32` table) into `dst` on `stream`; the
    /// next host write waits for it.
    fn copy_to(&self, stream: &CudaStream, n: usize, dst: &mut CudaSlice<f32>) {
        assert!(!self.bf16 && n <= self.buf.len() && n <= dst.len(), "copy of {n} elements");
        if n == 0 {
            return;
        }
        // no host write is in progress (writes take the table mutably)
        let src = self.buf.as_slice().as_ptr();
        {
            let (d, _record) = dst.device_ptr_mut(stream);
            // SAFETY: `n` floats from a live page-locked buffer into a device allocation of at
            // least `n`; the buffer is not written again before the event below completes.
            let r = unsafe {
                sys::cuMemcpyHtoDAsync_v2(d, src as *const std::ffi::c_void, n * 4, stream.cu_stream())
            };
            assert_eq!(r, sys::CUresult::CUDA_SUCCESS, "CUDA upload from page-locked memory");
        }
        self.copied_on(stream);
    }

    /// Records that a copy from the table was queued on `stream`: the next host write waits
    /// for it.
    pub(crate) fn copied_on(&self, stream: &CudaStream) {
        let done = stream.record_event(None).expect("CUDA event");
        // a stream's copies run in order: its last one stands for the others
        let key = stream.cu_stream() as usize;
        let mut copies = self.copies.lock().unwrap_or_else(|p| p.into_inner());
        copies.retain(|(s, _)| *s != key);
        copies.push((key, done));
    }
}

/// Node labels in page-locked host memory mapped into the device: the loss kernel reads a
/// batch's labels by node id (zero-copy, like the features).
pub struct HostLabels {
    buf: PinnedHostSlice<i32>,
    dptr: u64,
    classes: u32,
}

impl HostLabels {
    /// Panics unless every node of `ids` has a label in range.
    fn check(&self, ids: &[u32]) {
        let table = self.buf.as_slice().expect("pinned host memory");
        for &v in ids {
            let y = *table.get(v as usize).expect("a node of the table");
            assert!(
                y >= 0 && (y as u32) < self.classes,
                "node {v} has label {y}, outside 0..{}",
                self.classes
            );
        }
    }

    pub fn len(&self) -> usize {
        self.buf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buf.len() == 0
    }
}

impl Cuda {
    /// A zeroed, mapped, page-locked host table (not counted in `--gpu-mem`: it is host memory).
    pub fn host_table(&self, rows: usize, cols: usize) -> Result<HostTable, CudaError> {
        self.host_table_by(rows, cols, PageLock::chosen())
    }

    /// [`Cuda::host_table`] page-locked by `how`.
    pub fn host_table_by(&self, rows: usize, cols: usize, how: PageLock) -> Result<HostTable, CudaError> {
        let (buf, dptr) = PageLocked::new(&self.ctx, rows * cols, how)?;
        Ok(HostTable::new(buf, dptr, rows, cols, false))
    }

    /// `labels` (one per node; -1: none) mapped for [`Cuda::cross_entropy_mapped`].
    pub fn host_labels(&self, labels: &[i32], classes: u32) -> Result<HostLabels, CudaError> {
        let (mut buf, dptr) = mapped_zeroed::<i32>(&self.ctx, labels.len())?;
        buf.as_mut_slice().map_err(err)?[..labels.len()].copy_from_slice(labels);
        Ok(HostLabels { buf, dptr, classes })
    }

    /// `TrainOps::cross_entropy_later` over rows `0..ids.len()` of `logits` with the labels of
    /// nodes `ids`, read by the kernel from the mapped table, the ids from mapped memory too.
    pub fn cross_entropy_mapped(
        &self,
        logits: &DMat,
        labels: &HostLabels,
        ids: &[u32],
        scale: f64,
        grad: &mut DMat,
    ) -> CudaLoss {
        let _p = self.span("cross_entropy (mapped labels)");
        assert_eq!(labels.classes as usize, logits.cols, "one logit per class");
        assert!(ids.len() <= logits.rows, "a row per node");
        labels.check(ids);
        if ids.is_empty() {
            return CudaLoss::nothing();
        }
        // the node ids go with the outputs in one mapped buffer: the step queues no copy
        let b = self.loss_buffer(ids.len(), ids);
        let idx = b.dptr() + loss_offsets(ids.len()).2 as u64;
        self.cross_entropy_launch("cross_entropy_ids", logits, labels.dptr, idx, ids.len(), b, scale, grad)
    }

    /// `out[at + i] = t[rows[i]]`, read by the GPU from host memory over the bus (zero-copy).
    pub fn gather_host(&self, t: &HostTable, rows: Rows<'_>, out: &mut DMat, at: usize) {
        let (d, n) = (t.cols, rows.len());
        assert!(out.cols == d && at + n <= out.rows && rows.end() <= t.rows, "gather: shapes");
        if n == 0 || d == 0 {
            return;
        }
        let dst = out.data.slice_mut(at * d..(at + n) * d);
        let (name, cfg) =
            if t.bf16 { ("gather_rows_host_bf16", crate::warps(n)) } else { self.host_gather_kernel(n, d) };
        self.launch_rows(name, t.dptr, rows, d, dst, cfg);
        t.used_on(&self.stream);
    }

    /// `t` = rows `from..from + t.rows` of `m`, over the bus into page-locked memory, queued on
    /// the main stream behind the work that makes `m` (the host does not wait: it waits where it
    /// reads or writes the table itself).
    pub fn download_table(&self, m: &DMat, from: usize, t: &mut HostTable) {
        assert!(m.cols == t.cols && from + t.rows <= m.rows, "download: shapes");
        let n = t.rows * t.cols;
        if n == 0 {
            return;
        }
        if t.bf16 {
            return self.download_table_bf16(m, from, t);
        }
        t.before_device_write(&self.stream);
        let view = m.data.slice(from * t.cols..from * t.cols + n);
        let (src, _sync) = view.device_ptr(&self.stream);
        // SAFETY: `n` floats of a live device allocation into the table's `n` page-locked floats;
        // the table is not freed, read or written by the host before `used_on`'s event completes
        // (`settle`), and other streams' copies from it were waited for above.
        unsafe { dtoh(&self.stream, t.buf.as_mut_slice().as_mut_ptr() as *mut u8, src, n * 4) };
        t.used_on(&self.stream);
    }

    /// `t[rows[i]] += m[from + i]` (distinct rows), by device threads reading and writing the
    /// table's rows over the bus; queued as [`Cuda::download_table`] is.
    pub fn scatter_add_table(&self, m: &DMat, from: usize, rows: Rows<'_>, t: &mut HostTable) {
        let (d, n) = (t.cols, rows.len());
        assert!(m.cols == d && from + n <= m.rows && rows.end() <= t.rows, "scatter-add: shapes");
        if n == 0 || d == 0 {
            return;
        }
        t.before_device_write(&self.stream);
        let view = m.data.slice(from * d..(from + n) * d);
        let (src, _sync) = view.device_ptr(&self.stream);
        let (idx, start) = match rows {
            Rows::Index(i) => (Some(self.row_lists.get(self, i)), 0i64),
            Rows::Range(s, _) => (None, s as i64),
        };
        let (n64, d32, null) = (n as i64, d as i32, 0u64);
        let name = if t.bf16 { "scatter_add_rows_host_bf16" } else { "scatter_add_rows_host" };
        let mut l = self.stream.launch_builder(self.func(name));
        l.arg(&src);
        match idx.as_deref() {
            Some(i) => l.arg(i),
            None => l.arg(&null),
        };
        l.arg(&start).arg(&n64).arg(&d32).arg(&t.dptr);
        // SAFETY: every row number was checked against both matrices above; the table's
        // mapped memory lives until `used_on`'s event completes (`settle` at drop).
        unsafe { l.launch(crate::warps(n)) }.expect(name);
        t.used_on(&self.stream);
    }

    /// `t = 0`, written by the device over the bus; queued as [`Cuda::download_table`] is.
    pub fn zero_table(&self, t: &mut HostTable) {
        if t.rows * t.cols == 0 {
            return;
        }
        t.before_device_write(&self.stream);
        // every 32-bit word of the buffer (a bf16 table holds two elements a word; zero bits are
        // zero either way)
        let words = t.buf.len();
        // SAFETY: the table's `words` mapped words, alive until `used_on`'s event completes.
        let r = unsafe { sys::cuMemsetD32Async(t.dptr, 0, words, self.stream.cu_stream()) };
        assert_eq!(r, sys::CUresult::CUDA_SUCCESS, "CUDA memset of a host table");
        t.used_on(&self.stream);
    }

    /// Row indices in device memory, for gathers that reuse them.
    pub fn upload_index(&self, idx: &[u32]) -> DeviceIndex {
        DeviceIndex { idx: self.upload_slice(idx), rows_end: idx.iter().max().map_or(0, |&m| m as usize + 1) }
    }

    /// [`Cuda::gather_host`] with indices already on the device.
    pub fn gather_host_indexed(&self, t: &HostTable, idx: &DeviceIndex, out: &mut DMat, at: usize) {
        assert!(!t.bf16, "indexed gathers read f32 tables");
        let (d, n) = (t.cols, idx.idx.len());
        assert!(out.cols == d && at + n <= out.rows && idx.rows_end <= t.rows, "gather: shapes");
        if n == 0 || d == 0 {
            return;
        }
        let dst = out.data.slice_mut(at * d..(at + n) * d);
        let (name, cfg) = self.host_gather_kernel(n, d);
        self.launch_rows_at(&self.stream, name, t.dptr, Some(&idx.idx), 0, n, d, dst, cfg);
    }

    /// `t[ids]` gathered by GPU threads on a second stream, so that the gather overlaps the
    /// work queued on the main stream (a mini-batch's input rows while the previous batch
    /// computes); the main stream's work waits for it from [`Cuda::arrived`] on.
    pub fn gather_host_async(&self, t: &HostTable, ids: &[u32]) -> Arriving {
        let (d, n) = (t.cols, ids.len());
        assert!(!t.bf16, "mini-batch gathers read f32 tables");
        assert!(ids.iter().all(|&i| (i as usize) < t.rows), "gather: row out of range");
        let side = self.side_stream();
        t.after_device_use(side);
        self.charge(n * d * 4);
        // the ids through page-locked memory (charged there): a pageable upload waits for its
        // stream to drain (the gather before), and meanwhile the other threads' copies wait
        // in the driver, the trainer's too (on one H200, products-like: 1.73–1.76 s per epoch
        // against 1.56 s; docs/benchmarks-log.md, mini-batch zero-copy, the 2026-11-30 entry
        // measuring 71088e9, call 6)
        let idx = self.upload_pinned(side, ids);
        // SAFETY: every element is written by the gather below before any use.
        let mut data = unsafe { side.alloc::<f32>((n * d).max(1)) }.or_oom();
        if n > 0 && d > 0 {
            // a few hundred warps keep enough reads in flight to fill the bus (one row each
            // at a time) and leave most of the device to the main stream's kernels
            let cfg = crate::warps(n.min(async_gather_warps()));
            let dst = data.slice_mut(0..n * d);
            self.timed_on_side(side, (n * d * 4) as u64, || {
                self.launch_rows_at(side, self.one_row_gather(d), t.dptr, Some(&idx), 0, n, d, dst, cfg)
            });
        }
        // `idx` is freed on the second stream, after the gather
        self.arriving(side, DMat { rows: n, cols: d, data })
    }

    /// `m` in a new mapped, page-locked table; `m` back when none can be allocated.
    pub fn table_of(&self, m: Mat<f32>) -> Result<HostTable, Mat<f32>> {
        let Ok(mut t) = self.host_table(m.rows, m.cols) else { return Err(m) };
        t.as_mut_slice()[..m.data.len()].copy_from_slice(&m.data);
        Ok(t)
    }

    /// The table's first `rows` rows as a device matrix, copied on the second stream so that
    /// the copy overlaps the work already queued on the main stream (whose work waits for it
    /// from [`Cuda::arrived`] on); the table's next host write waits for the copy. The host
    /// first waits until the main stream has reached the upload made [`UPLOADS_AHEAD`] calls
    /// ago, which bounds the device memory copies hold ahead.
    pub fn upload_table_async(&self, t: &HostTable, rows: usize) -> Arriving {
        assert!(rows <= t.rows, "{rows} rows of a {}-row table", t.rows);
        let n = rows * t.cols;
        let side = self.side_stream();
        {
            let mut ahead = self.ahead.lock().unwrap_or_else(|p| p.into_inner());
            ahead.push_back(self.stream.record_event(None).expect("CUDA event"));
            while ahead.len() > UPLOADS_AHEAD {
                ahead.pop_front().expect("an event").synchronize().expect("CUDA event");
            }
        }
        self.charge(n * 4);
        t.after_device_use(side);
        // SAFETY: the copy below writes every element before any use.
        let mut data = unsafe { side.alloc::<f32>(n.max(1)) }.or_oom();
        if n > 0 && t.bf16 {
            self.timed_on_side(side, (n * 2) as u64, || self.widen_table_on(side, t, n, &mut data));
        } else if n > 0 {
            self.timed_on_side(side, (n * 4) as u64, || t.copy_to(side, n, &mut data));
        }
        self.arriving(side, DMat { rows, cols: t.cols, data })
    }

    /// `work`, queued on the second stream, bracketed by timing events (see [`Cuda::side_time`]).
    fn timed_on_side<R>(&self, side: &CudaStream, bytes: u64, work: impl FnOnce() -> R) -> R {
        self.mark_side(side, "transfer start");
        let r = EventClock::time(&self.side_time, side, bytes, work);
        self.mark_side(side, "transfer end");
        r
    }

    /// Seconds the second stream has spent on gathers and uploads so far (from its timing
    /// events: the device's clock, overlapped work included) and the bytes they moved.
    pub fn side_time(&self) -> (f64, u64) {
        let mut st = self.side_time.lock().unwrap_or_else(|p| p.into_inner());
        st.settle();
        (st.secs, st.bytes)
    }

    /// `out = t` over the bus with one asynchronous copy from page-locked memory.
    pub fn upload_table(&self, t: &HostTable, out: &mut DMat) {
        assert_eq!((out.rows, out.cols), (t.rows, t.cols), "upload: shapes");
        t.copy_to(&self.stream, t.rows * t.cols, &mut out.data);
    }
}

/// Host-block uploads that may be queued on the second stream beyond the main stream's work.
pub(crate) const UPLOADS_AHEAD: usize = 2;

/// Warps of a gather on the second stream: 512 rows in flight (≈ 200 KB of 100-float rows,
/// beyond the bus's bandwidth-latency product), 64 blocks of 8 warps. More keep the bus a little
/// busier but take SMs from the main stream's kernels: on one H200, products-like mini-batch SAGE
/// computed 1.9 s per epoch beside 512 warps against 2.4 s beside 2,048 (BENCHMARKS).
/// `GRINNDER_GATHER_WARPS` sets another count (for comparisons).
fn async_gather_warps() -> usize {
    static WARPS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *WARPS.get_or_init(|| {
        std::env::var("GRINNDER_GATHER_WARPS")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|&w| w > 0)
            .unwrap_or(512)
    })
}

/// See [`Cuda::hold_ahead_stream`]: releases the stream when dropped.
pub struct StreamHold(Option<std::sync::mpsc::Sender<()>>);

impl Drop for StreamHold {
    fn drop(&mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(());
        }
    }
}

/// Row indices uploaded once (see [`Cuda::gather_host_indexed`]).
pub struct DeviceIndex {
    idx: cudarc::driver::CudaSlice<u32>,
    /// One past the largest index.
    rows_end: usize,
}

/// Page-locked buffers that uploads and downloads pass through (`Transfers::upload_with`,
/// `download_with`): two, used in turn, so the host fills one while the other is copied; each
/// grows to the largest transfer seen and is kept.
#[derive(Default)]
pub(crate) struct Staging {
    slots: [Mutex<Slot>; 2],
    next: std::sync::atomic::AtomicUsize,
}

/// One staging buffer (none until first used).
#[derive(Default)]
pub(crate) struct Slot(Option<PinnedBuf>);

impl Slot {
    /// The buffer as `n` floats, once its last copy has finished (grown where shorter).
    pub(crate) fn get(&mut self, ctx: &Arc<CudaContext>, n: usize) -> &mut [f32] {
        if let Some(b) = &mut self.0 {
            b.wait();
        }
        let floats = |b: &PinnedBuf| b.buf.len() / 4;
        if self.0.as_ref().is_none_or(|b| floats(b) < n) {
            let len = n.max(self.0.as_ref().map_or(0, |b| floats(b) * 3 / 2)).max(1 << 16);
            // the old buffer goes first (its copies have finished): the host never holds both,
            // as the memory plan counts (`plan.rs::staged_elems`)
            self.0 = None;
            self.0 = Some(PinnedBuf::new(ctx, len * 4));
        }
        let b = self.0.as_mut().expect("allocated");
        // SAFETY: the buffer is page-aligned and holds at least `n` floats; no copy is using it
        // (waited for above) and the slice borrows it exclusively.
        unsafe { std::slice::from_raw_parts_mut(b.ptr() as *mut f32, n) }
    }

    /// [`Slot::get`] as `n` bf16 elements (half the bytes).
    pub(crate) fn get_u16(&mut self, ctx: &Arc<CudaContext>, n: usize) -> &mut [u16] {
        let f = self.get(ctx, n.div_ceil(2));
        // SAFETY: the floats hold at least `n` u16s, u16 needs no more alignment than f32, and
        // every bit pattern is a u16; the slice borrows the buffer exclusively, as `f` did.
        unsafe { std::slice::from_raw_parts_mut(f.as_mut_ptr() as *mut u16, n) }
    }

    /// Marks the buffer as used by the copies queued on `stream` so far.
    pub(crate) fn queued(&mut self, stream: &CudaStream) {
        self.0.as_mut().expect("allocated").queued(stream);
    }
}

impl Staging {
    /// Frees both buffers (each once its last copy has finished).
    pub(crate) fn release(&self) {
        for s in &self.slots {
            s.lock().unwrap_or_else(|e| e.into_inner()).0 = None;
        }
    }

    pub(crate) fn slot(&self) -> std::sync::MutexGuard<'_, Slot> {
        let i = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 2;
        self.slots[i].lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Page-locked byte buffers (mapped into the device) for the transfers of a few megabytes at
/// most that must not go through the driver's pageable staging, which serialises them with
/// every other thread's pageable copies (and a pageable upload waits for its stream to drain):
/// the structures the sampling threads upload ahead, the main stream's small uploads (a batch's
/// labels), a zero-copy gather's row ids, and the loss kernel's outputs and node ids, which the
/// kernel writes and reads in place (no copy at all). On one H200 the trainer's calls waited up
/// to milliseconds behind pageable uploads (docs/benchmarks-log.md, mini-batch zero-copy: the
/// 2026-11-30 entries measuring a961270 and 71088e9). A buffer is taken for one copy or kernel
/// and marked with an event after it; one whose work has not finished is not taken again: a
/// new one is made while its size class holds few, else the host waits for the oldest
/// ([`crate::reuse`]: the pool is bounded — 32 buffers a class up to 1 MiB, 32 MiB of larger
/// ones — page-locked memory outside the `--host-mem` plan, and a take queries one event). Large uploads go through [`Staging`]
/// instead, whose two buffers make the host wait.
#[derive(Default)]
pub(crate) struct PinnedPool {
    free: crate::reuse::Reuse<PinnedBuf>,
}

pub(crate) struct PinnedBuf {
    buf: PinnedHostSlice<u8>,
    /// `buf`'s address on the device (the memory is mapped: kernels read and write it over the
    /// bus).
    dptr: u64,
    /// Recorded after the last copy or kernel that read or wrote `buf`.
    done: Option<CudaEvent>,
}

impl Drop for PinnedBuf {
    fn drop(&mut self) {
        // the memory is freed only after the last copy that used it
        if let Some(e) = &self.done {
            let _ = e.synchronize();
        }
    }
}

/// A loss on its way to the host ([`grinnder_tensor::TrainOps::cross_entropy_later`]): its
/// per-row values and hit flags, written by the loss kernel straight into mapped page-locked
/// memory (no copy to queue), summed on the host when read
/// ([`grinnder_tensor::TrainOps::loss_value`]).
pub struct CudaLoss {
    buf: Option<PinnedBuf>,
    rows: usize,
}

impl CudaLoss {
    /// The loss over no rows.
    pub(crate) fn nothing() -> CudaLoss {
        CudaLoss { buf: None, rows: 0 }
    }

    /// The loss of the kernel over `rows` rows just queued on `stream` with buffer `b`.
    pub(crate) fn queued(mut b: PinnedBuf, rows: usize, stream: &CudaStream) -> CudaLoss {
        b.queued(stream);
        CudaLoss { buf: Some(b), rows }
    }
}

/// Byte offsets in a loss kernel's buffer over `n` rows ([`Cuda::loss_buffer`]): its per-row
/// losses (f32), hit flags (i32) and the rows' node ids (u32, written by the host).
pub(crate) const fn loss_offsets(n: usize) -> (usize, usize, usize) {
    (0, 4 * n, 8 * n)
}

/// A device matrix on its way into page-locked host memory ([`Cuda::download_ahead`]).
pub struct Leaving {
    /// The source, kept alive until the copy is over.
    m: Option<DMat>,
    buf: Option<PinnedBuf>,
    n: usize,
}

impl Drop for Leaving {
    fn drop(&mut self) {
        // never read: the copy still finishes before the source and the buffer go
        if let Some(mut b) = self.buf.take() {
            b.wait();
        }
        drop(self.m.take());
    }
}

/// Queues a copy of `bytes` bytes from page-locked `host` to device address `dst` on `stream`.
///
/// # Safety
/// `host` and `dst` hold `bytes` bytes each and stay alive and untouched until the copy is done;
/// the stream's context is current on the calling thread (it is after any allocation on it).
pub(crate) unsafe fn htod(stream: &CudaStream, dst: sys::CUdeviceptr, host: *const u8, bytes: usize) {
    // SAFETY: the caller's promise.
    let r =
        unsafe { sys::cuMemcpyHtoDAsync_v2(dst, host as *const std::ffi::c_void, bytes, stream.cu_stream()) };
    assert_eq!(r, sys::CUresult::CUDA_SUCCESS, "CUDA upload from page-locked memory");
}

/// Queues a copy of `bytes` bytes from device address `src` to page-locked `host` on `stream`.
///
/// # Safety
/// As [`htod`].
pub(crate) unsafe fn dtoh(stream: &CudaStream, host: *mut u8, src: sys::CUdeviceptr, bytes: usize) {
    // SAFETY: the caller's promise.
    let r =
        unsafe { sys::cuMemcpyDtoHAsync_v2(host as *mut std::ffi::c_void, src, bytes, stream.cu_stream()) };
    assert_eq!(r, sys::CUresult::CUDA_SUCCESS, "CUDA download into page-locked memory");
}

impl PinnedBuf {
    /// `bytes` of new page-locked memory (page-aligned, mapped into the device), used by no copy
    /// yet.
    fn new(ctx: &Arc<CudaContext>, bytes: usize) -> PinnedBuf {
        // SAFETY: the users write (or the device copies) the bytes they read.
        let (buf, dptr) = unsafe { mapped_uninit::<u8>(ctx, bytes) }.expect("page-locked host memory");
        PinnedBuf { buf, dptr, done: None }
    }

    /// Waits for the last copy that used the buffer.
    pub(crate) fn wait(&mut self) {
        if let Some(e) = self.done.take() {
            e.synchronize().expect("CUDA event");
        }
    }

    /// The buffer's start (page-locked, at least the length it was taken for).
    pub(crate) fn ptr(&mut self) -> *mut u8 {
        self.buf.as_mut_ptr().expect("pinned host memory")
    }

    /// The buffer's start as a device address.
    pub(crate) fn dptr(&self) -> u64 {
        self.dptr
    }

    /// Marks the copy (or kernel) just queued on `stream` with this buffer: it is not reused,
    /// nor freed, before that work has finished (set at once, so that an unwinding caller is
    /// safe too).
    pub(crate) fn queued(&mut self, stream: &CudaStream) {
        self.done = Some(stream.record_event(None).expect("CUDA event"));
    }
}

impl crate::reuse::InFlight for PinnedBuf {
    fn finished(&self) -> bool {
        self.done.as_ref().is_none_or(|e| e.is_complete())
    }
    fn wait(&mut self) {
        PinnedBuf::wait(self)
    }
    fn bytes(&self) -> usize {
        self.buf.len()
    }
}

impl PinnedPool {
    /// A buffer of at least `n` bytes whose last copy has finished.
    pub(crate) fn take(&self, ctx: &Arc<CudaContext>, n: usize) -> PinnedBuf {
        match self.free.take(n) {
            crate::reuse::Taken::Reused(b) => b,
            crate::reuse::Taken::Make(bytes) => PinnedBuf::new(ctx, bytes),
        }
    }

    /// `b` back (its copy marked with [`PinnedBuf::queued`]).
    pub(crate) fn give(&self, b: PinnedBuf) {
        self.free.give(b)
    }
}

impl Cuda {
    /// `v` on the device by `stream`, copied from a page-locked buffer (see [`PinnedPool`]);
    /// nothing to copy where `v` is empty (a one-element allocation, never read: lengths say
    /// it is empty).
    pub(crate) fn upload_pinned<T: cudarc::driver::DeviceRepr>(
        &self,
        stream: &Arc<CudaStream>,
        v: &[T],
    ) -> CudaSlice<T> {
        if v.is_empty() {
            // SAFETY: never read (see above).
            return unsafe { stream.alloc::<T>(1) }.or_oom();
        }
        let bytes = std::mem::size_of_val(v);
        self.charge(bytes);
        // SAFETY: written whole by the copy below before any use; freed in its stream's order
        // (or the main stream's, once adopted), after the copy.
        let mut out = unsafe { stream.alloc::<T>(v.len()) }.or_oom();
        let mut b = self.pinned.take(&self.ctx, bytes);
        let host = b.ptr();
        // SAFETY: `host` holds at least `bytes` bytes and no copy is using it (taken from the
        // pool); `v` is `bytes` bytes of plain data.
        unsafe { std::ptr::copy_nonoverlapping(v.as_ptr() as *const u8, host, bytes) };
        {
            let (dst, _sync) = out.device_ptr_mut(stream);
            // SAFETY: `bytes` bytes from a live page-locked buffer into an allocation of as
            // many; the buffer goes back to the pool with an event recorded after the copy.
            unsafe { htod(stream, dst, host, bytes) };
        }
        b.queued(stream);
        self.pinned.give(b);
        out
    }

    /// A page-locked buffer for a loss kernel over `n` rows ([`loss_offsets`]): room for its
    /// per-row losses and hit flags, then `ids` (the rows' node ids, for the kernel to read;
    /// none where it reads row numbers elsewhere).
    pub(crate) fn loss_buffer(&self, n: usize, ids: &[u32]) -> PinnedBuf {
        let at = loss_offsets(n).2;
        let mut b = self.pinned.take(&self.ctx, at + 4 * ids.len());
        let host = b.ptr();
        // SAFETY: the buffer holds at least `at` + 4·ids.len() bytes (page-aligned, so `at` is
        // 4-byte aligned) and no work is using it (taken from the pool); u32s are plain data.
        unsafe { std::ptr::copy_nonoverlapping(ids.as_ptr(), host.add(at) as *mut u32, ids.len()) };
        b
    }

    /// `(Σ loss, hits)` of a loss kernel's buffer ([`Cuda::loss_buffer`]; waits for the kernel).
    pub(crate) fn loss_sums(&self, l: CudaLoss) -> (f64, usize) {
        let Some(mut b) = l.buf else { return (0.0, 0) };
        b.wait();
        let (n, (at_loss, at_hit, _)) = (l.rows, loss_offsets(l.rows));
        let host = b.ptr();
        // SAFETY: the kernel has finished (its writes to mapped memory are visible); the buffer
        // holds `n` f32 losses and `n` i32 flags at those offsets (4-byte aligned).
        let (loss, hit) = unsafe {
            (
                std::slice::from_raw_parts(host.add(at_loss) as *const f32, n),
                std::slice::from_raw_parts(host.add(at_hit) as *const i32, n),
            )
        };
        let sums = (loss.iter().map(|&x| x as f64).sum(), hit.iter().filter(|&&o| o != 0).count());
        self.pinned.give(b);
        sums
    }

    /// Holds the stream of work made ahead ([`HandOffs::sparse_ahead`](grinnder_tensor::HandOffs::sparse_ahead), [`HandOffs::upload_ahead`](grinnder_tensor::HandOffs::upload_ahead))
    /// until the returned guard is dropped (at most a minute): work queued there meanwhile waits
    /// behind a host function, so its copies are still in flight while the caller goes on (for
    /// tests of buffers that copies read later).
    pub fn hold_ahead_stream(&self) -> StreamHold {
        self.hold(self.ahead_stream())
    }

    /// [`Cuda::hold_ahead_stream`] for the main stream (for tests of work read later: a loss
    /// queued meanwhile is computed only once the guard is dropped).
    pub fn hold_main_stream(&self) -> StreamHold {
        self.hold(&self.stream)
    }

    fn hold(&self, stream: &CudaStream) -> StreamHold {
        unsafe extern "C" fn wait_for_release(data: *mut std::ffi::c_void) {
            // SAFETY: `data` is the receiver the launch below gave up; this function owns it
            // from here and makes no CUDA calls.
            let rx = unsafe { Box::from_raw(data.cast::<std::sync::mpsc::Receiver<()>>()) };
            let _ = rx.recv_timeout(std::time::Duration::from_secs(60));
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let rx = Box::into_raw(Box::new(rx));
        self.ctx.bind_to_thread().expect("CUDA context");
        // SAFETY: the function and its argument stay valid until it runs (the receiver is
        // leaked to it); it never calls CUDA.
        let r = unsafe { sys::cuLaunchHostFunc(stream.cu_stream(), Some(wait_for_release), rx.cast()) };
        if r != sys::CUresult::CUDA_SUCCESS {
            // SAFETY: a failed launch did not hand the receiver over.
            drop(unsafe { Box::from_raw(rx) });
            panic!("cuLaunchHostFunc failed: {r:?}");
        }
        StreamHold(Some(tx))
    }

    /// See `HandOffs::download_ahead`: `m` copied into a page-locked buffer on the second
    /// stream, once the main stream's work queued so far (which fills it) is done; the main
    /// stream's next work runs beside the copy. `m` is kept until the copy is over.
    pub fn download_ahead(&self, m: DMat) -> Leaving {
        let n = m.rows * m.cols;
        let side = self.side_stream();
        side.wait(&self.stream.record_event(None).expect("CUDA event")).expect("CUDA stream wait");
        let mut buf = self.pinned.take(&self.ctx, (n * 4).max(1));
        if n > 0 {
            let host = buf.ptr();
            let (src, _sync) = m.data.device_ptr(side);
            // SAFETY: `n` floats of a live allocation (kept in the `Leaving` until the copy is
            // waited for) into a page-locked buffer of at least as many bytes, used by nothing
            // else until then.
            self.timed_on_side(side, (n * 4) as u64, || unsafe { dtoh(side, host, src, n * 4) });
        }
        buf.queued(side);
        Leaving { m: Some(m), buf: Some(buf), n }
    }

    /// See `HandOffs::downloaded`.
    pub fn downloaded(&self, mut l: Leaving, read: &mut dyn FnMut(&[f32])) {
        let mut buf = l.buf.take().expect("a download is read once");
        buf.wait();
        let n = l.n;
        {
            let bytes = buf.ptr();
            // SAFETY: the copy of `n` floats into the buffer is complete (waited for above);
            // page-locked memory is aligned to a page, so to an f32.
            let rows = unsafe { std::slice::from_raw_parts(bytes as *const f32, n) };
            read(rows);
        }
        self.pinned.give(buf);
    }

    /// See `Transfers::upload_with`: `fill` writes into a staging buffer, copied asynchronously.
    pub(crate) fn staged_upload(&self, rows: usize, cols: usize, fill: &mut dyn FnMut(&mut [f32])) -> DMat {
        let n = rows * cols;
        let mut out = grinnder_tensor::Memory::output(self, rows, cols);
        if n == 0 {
            fill(&mut []);
            return out;
        }
        let mut slot = self.staging.slot();
        let host = slot.get(&self.ctx, n);
        fill(host);
        let src = host.as_ptr() as *const u8;
        {
            let (dst, _sync) = out.data.device_ptr_mut(&self.stream);
            // SAFETY: `n` floats from a live page-locked buffer into an allocation of `n`;
            // the buffer is not touched again before the event recorded below completes.
            unsafe { htod(&self.stream, dst, src, n * 4) };
        }
        slot.queued(&self.stream);
        out
    }

    /// See `Transfers::download_with`: `m` is copied into a staging buffer, then `read` sees it.
    pub(crate) fn staged_download(&self, m: &DMat, read: &mut dyn FnMut(&[f32])) {
        let n = m.rows * m.cols;
        if n == 0 {
            read(&[]);
            return;
        }
        let mut slot = self.staging.slot();
        let host = slot.get(&self.ctx, n);
        {
            let (src, _sync) = m.data.device_ptr(&self.stream);
            // SAFETY: `n` floats of a live allocation into a page-locked buffer of `n`, waited
            // for below.
            unsafe { dtoh(&self.stream, host.as_mut_ptr() as *mut u8, src, n * 4) };
        }
        self.stream.synchronize().expect("CUDA synchronize");
        read(host);
    }
}
