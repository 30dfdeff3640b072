//! bf16 across the bus: a store of bf16 blocks sends and receives its rows at two bytes an
//! element, converted to and from f32 on the device (`to_bf16`, `from_bf16` in kernels.cu, the
//! host's bits exactly), so that an epoch's gathers and write-backs move half the bytes and the
//! host does no conversion (on papers-like at full size with bf16 blocks in RAM, an H100's
//! epoch moved 304 GB up and 265 GB down as f32, and the host's encoding bound the write-back).
//!
//! Each transfer goes through a staging buffer of [`crate::host::Staging`] (page-locked, the
//! bus's full speed) and a device temporary of at most [`BF16_CHUNK`] elements, chunk by chunk
//! on the main stream: the conversion of a chunk is microseconds beside its copy.

use super::*;
use cudarc::driver::{DevicePtr, DevicePtrMut};

use crate::host::{dtoh, htod};

/// Elements of the device temporary a bf16 transfer converts through (32 MiB of bf16).
pub(crate) const BF16_CHUNK: usize = 1 << 24;

impl Cuda {
    /// The chunk a transfer of `n` bf16 elements converts by, and a device temporary of that
    /// many (its elements unspecified: each chunk is written whole before it is read).
    fn bf16_temp(&self, n: usize) -> (usize, CudaSlice<u16>) {
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
        let dst = host.as_mut_ptr() as *mut u8;
        let (chunk, mut temp) = self.bf16_temp(n);
        for at in (0..n).step_by(chunk) {
            let len = chunk.min(n - at);
            let (len64, part) = (len as i64, m.data.slice(at..at + len));
            let mut l = self.stream.launch_builder(self.func("to_bf16"));
            l.arg(&part).arg(&len64).arg(&mut temp);
            // SAFETY: `part` holds `len` floats, `temp` at least `len` bf16.
            unsafe { l.launch(grid(len)) }.expect("CUDA to_bf16");
            let (src, _sync) = temp.device_ptr(&self.stream);
            // SAFETY: `len` bf16 of the temporary into the page-locked buffer (at `at`, which
            // holds `n`), waited for below.
            unsafe { dtoh(&self.stream, dst.add(at * 2), src, len * 2) };
        }
        self.stream.synchronize().expect("CUDA synchronize");
        read(host);
    }
}
