//! bf16 across the bus: a store of bf16 blocks sends and receives its rows at two bytes an
//! element, converted to and from f32 on the device (`to_bf16`, `from_bf16` in kernels.cu, the
//! host's bits exactly), so that an epoch's gathers and write-backs move half the bytes and the
//! host does no conversion (on papers-like at full size with bf16 blocks in RAM, an H100's
//! epoch moved 304 GB up and 265 GB down as f32, and the host's encoding bound the write-back).
//!
//! Each transfer goes through a staging buffer of [`crate::host::Staging`] (page-locked, the
//! bus's full speed) and a device temporary of at most [`BF16_CHUNK`] elements, chunk by chunk
//! on the main stream: the conversion of a chunk is microseconds beside its copy.
//!
//! Page-locked bf16 tables ([`Cuda::host_table_bf16`]) are the host blocks of a bf16 tier on a
//! GPU: the device rounds a block into one as it downloads it, adds rows into it and gathers
//! rows from it itself (`scatter_add_rows_host_bf16`, `gather_rows_host_bf16`), as it does for
//! f32 tables, and no host core touches the bytes. Kept in the store instead, bf16 blocks cost
//! the host a copy out of the staging buffer on every write and an add on every halo gradient
//! (papers-like at half size on an H200: write-back 17.9 s of a 22.0 s epoch, against 0.08 s
//! for f32 blocks page-locked; BENCHMARKS P7).

use super::*;
use cudarc::driver::{DevicePtr, DevicePtrMut};
use rayon::prelude::*;

use crate::host::{dtoh, htod, HostTable};
use crate::pinned::{PageLock, PageLocked};

/// Elements of the device temporary a bf16 transfer converts through (32 MiB of bf16).
pub(crate) const BF16_CHUNK: usize = 1 << 24;

impl Cuda {
    /// The chunk a transfer of `n` bf16 elements converts by, and a device temporary of that
    /// many (its elements unspecified: each chunk is written whole before it is read).
    pub(crate) fn bf16_temp(&self, n: usize) -> (usize, CudaSlice<u16>) {
        let chunk = n.min(BF16_CHUNK);
        self.charge(chunk * 2);
        // SAFETY: the callers write each chunk whole (a copy or `to_bf16`) before reading it.
        (chunk, unsafe { self.stream.alloc::<u16>(chunk) }.or_oom())
    }

    /// See `Transfers::upload_bf16_with`: `fill` writes bf16 into a staging buffer, copied
    /// chunk by chunk to the device and widened there.
    pub(crate) fn staged_upload_bf16(
        &self,
        rows: usize,
        cols: usize,
        fill: &mut dyn FnMut(&mut [u16]),
    ) -> DMat {
        let n = rows * cols;
        let mut out = grinnder_tensor::Memory::output(self, rows, cols);
        if n == 0 {
            fill(&mut []);
            return out;
        }
        let mut slot = self.staging.slot();
        let host = slot.get_u16(&self.ctx, n);
        fill(host);
        let src = host.as_ptr() as *const u8;
        let (chunk, mut temp) = self.bf16_temp(n);
        for at in (0..n).step_by(chunk) {
            let len = chunk.min(n - at);
            {
                let (dst, _sync) = temp.device_ptr_mut(&self.stream);
                // SAFETY: `len` bf16 from the live page-locked buffer (at `at`) into a temporary
                // of `chunk >= len`; the buffer is not touched again before the event recorded
                // below completes.
                unsafe { htod(&self.stream, dst, src.add(at * 2), len * 2) };
            }
            let (len64, mut part) = (len as i64, out.data.slice_mut(at..at + len));
            let mut l = self.stream.launch_builder(self.func("from_bf16"));
            l.arg(&temp).arg(&len64).arg(&mut part);
            // SAFETY: `temp` holds `len` bf16 written above, `part` `len` floats.
            unsafe { l.launch(grid(len)) }.expect("CUDA from_bf16");
        }
        slot.queued(&self.stream);
        out
    }

    /// See `Transfers::download_bf16_with`: `m` is rounded to bf16 on the device chunk by
    /// chunk and copied into a staging buffer, then `read` sees it.
    pub(crate) fn staged_download_bf16(&self, m: &DMat, read: &mut dyn FnMut(&[u16])) {
        let n = m.rows * m.cols;
        if n == 0 {
            read(&[]);
            return;
        }
        let mut slot = self.staging.slot();
        let host = slot.get_u16(&self.ctx, n);
        // SAFETY: the staging buffer holds `n` bf16 and is not touched before the wait below.
        unsafe { self.round_into_host(m, 0, n, host.as_mut_ptr() as *mut u8) };
        self.stream.synchronize().expect("CUDA synchronize");
        read(host);
    }

    /// Elements `first..first + n` of `m` rounded to bf16 on the device chunk by chunk and
    /// each chunk's copy queued into page-locked `dst`, on the main stream.
    ///
    /// # Safety
    /// `dst` is page-locked memory of at least `n` bf16, alive and untouched by the host until
    /// the main stream has reached the copies.
    unsafe fn round_into_host(&self, m: &DMat, first: usize, n: usize, dst: *mut u8) {
        let (chunk, mut temp) = self.bf16_temp(n);
        for at in (0..n).step_by(chunk) {
            let len = chunk.min(n - at);
            let (len64, part) = (len as i64, m.data.slice(first + at..first + at + len));
            let mut l = self.stream.launch_builder(self.func("to_bf16"));
            l.arg(&part).arg(&len64).arg(&mut temp);
            // SAFETY: `part` holds `len` floats, `temp` at least `len` bf16.
            unsafe { l.launch(grid(len)) }.expect("CUDA to_bf16");
            let (src, _sync) = temp.device_ptr(&self.stream);
            // SAFETY: `len` bf16 of the temporary into `dst` at `at` (the caller's promise).
            unsafe { dtoh(&self.stream, dst.add(at * 2), src, len * 2) };
        }
    }

    /// A zeroed, mapped, page-locked `rows × cols` table of bf16 (half an f32 table's bytes).
    pub fn host_table_bf16(&self, rows: usize, cols: usize) -> Result<HostTable, CudaError> {
        let (buf, dptr) = PageLocked::new(&self.ctx, (rows * cols).div_ceil(2), PageLock::chosen())?;
        Ok(HostTable::new(buf, dptr, rows, cols, true))
    }

    /// `m` rounded into a new bf16 table (on every core); `m` back when none can be allocated.
    pub fn table_bf16_of(&self, m: Mat<f32>) -> Result<HostTable, Mat<f32>> {
        let Ok(mut t) = self.host_table_bf16(m.rows, m.cols) else { return Err(m) };
        t.as_mut_u16().par_chunks_mut(1 << 16).zip(m.data.par_chunks(1 << 16)).for_each(|(h, x)| {
            h.iter_mut().zip(x).for_each(|(h, &x)| *h = grinnder_tensor::scalar::to_bf16(x));
        });
        Ok(t)
    }

    /// [`Cuda::download_table`] into a bf16 table: rounded on the device chunk by chunk
    /// (`to_bf16`, the host's bits) and copied into the table's page-locked memory, queued on
    /// the main stream (the host does not wait).
    pub(crate) fn download_table_bf16(&self, m: &DMat, from: usize, t: &mut HostTable) {
        let n = t.rows * t.cols;
        t.before_device_write(&self.stream);
        let dst = t.buf.as_mut_slice().as_mut_ptr() as *mut u8;
        // SAFETY: the table holds `n` bf16; it is not freed, read or written by the host before
        // `used_on`'s event completes, and other streams' copies from it were waited for above.
        unsafe { self.round_into_host(m, from * t.cols, n, dst) };
        t.used_on(&self.stream);
    }

    /// The first `n` elements of bf16 table `t` widened into `out` on `stream` (the second
    /// one): copied as bf16 into a device temporary (half the bytes on the bus), then widened
    /// there; the table's next host write waits for the copy.
    pub(crate) fn widen_table_on(
        &self,
        stream: &Arc<CudaStream>,
        t: &HostTable,
        n: usize,
        out: &mut CudaSlice<f32>,
    ) {
        assert!(t.bf16 && n <= t.rows * t.cols && n <= out.len(), "widening {n} elements");
        self.charge(n * 2);
        // SAFETY: written whole by the copy below before the kernel reads it.
        let mut temp = unsafe { stream.alloc::<u16>(n) }.or_oom();
        {
            let (dst, _record) = temp.device_ptr_mut(stream);
            let src = t.buf.as_slice().as_ptr() as *const u8;
            // SAFETY: `n` bf16 of the live page-locked table into a temporary of `n`; the table
            // is not written by the host before `copied_on`'s event completes.
            unsafe { htod(stream, dst, src, n * 2) };
        }
        t.copied_on(stream);
        let n64 = n as i64;
        let mut l = stream.launch_builder(self.func("from_bf16"));
        l.arg(&temp).arg(&n64).arg(out);
        // SAFETY: `temp` holds `n` bf16 written above, `out` at least `n` floats.
        unsafe { l.launch(grid(n)) }.expect("CUDA from_bf16");
    }
}

impl HostTable {
    /// A bf16 table's elements, once the device work writing them has finished.
    pub fn as_u16(&self) -> &[u16] {
        assert!(self.bf16, "an f32 table's elements are read with as_slice");
        self.wait_device_use();
        let f = self.buf.as_slice();
        // SAFETY: the buffer's words hold at least `rows * cols` u16s (see `host_table_bf16`),
        // u16 needs no more alignment than f32 and every bit pattern is a u16.
        unsafe { std::slice::from_raw_parts(f.as_ptr() as *const u16, self.rows * self.cols) }
    }

    /// A bf16 table's elements, for writing, once the copies reading them and the device work
    /// on them have finished.
    pub fn as_mut_u16(&mut self) -> &mut [u16] {
        assert!(self.bf16, "an f32 table's elements are written with as_mut_slice");
        self.settle();
        let n = self.rows * self.cols;
        let f = self.buf.as_mut_slice();
        // SAFETY: as in `as_u16`, borrowed mutably.
        unsafe { std::slice::from_raw_parts_mut(f.as_mut_ptr() as *mut u16, n) }
    }
}
