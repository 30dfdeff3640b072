//! Work that crosses streams, ordered by hand (cudarc's per-allocation event tracking is off).
//!
//! The backend queues its compute on one stream (the main one). Two others feed it: the second
//! stream's gathers and host-block uploads ([`Cuda::side_stream`]), queued while the main stream
//! computes the batch or partition before, and the uploads of structures made ahead by sampling
//! threads ([`Cuda::ahead_stream`]). cudarc can order such uses itself — two events per
//! allocation, and a wait plus a record on every use of every argument once a second stream
//! exists: thousands of driver calls per mini-batch, host time the GPU waits for. Instead, the
//! few hand-offs are explicit:
//! - a matrix filled on another stream passes to the main stream with an event marking the
//!   work that fills it: [`Arriving`], which the main stream waits for when the matrix is taken
//!   ([`Cuda::arrived`]), not before, so the copy overlaps the work queued meanwhile;
//! - structures uploaded ahead are waited for when they are made ([`Cuda::join_main`]): the
//!   main stream's later work waits for their copies (from page-locked buffers) and their
//!   transposes (short kernels, built there on the device);
//! - an allocation made on another stream and used on the main one is freed on the main stream
//!   ([`Cuda::adopt`]), after every use queued there; an allocation used only where it was made
//!   (a gather's row list) is freed there.
//!
//! `GRINNDER_CUDA_EVENT_TRACKING=on` turns cudarc's tracking back on (for comparisons): the
//! explicit orderings are then redundant, never wrong.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaEvent, CudaSlice, CudaStream};

use crate::{Cuda, DMat};

/// Whether cudarc's event tracking was asked for (`GRINNDER_CUDA_EVENT_TRACKING=on`).
pub(crate) fn tracking_asked() -> bool {
    std::env::var("GRINNDER_CUDA_EVENT_TRACKING").is_ok_and(|v| v == "on" || v == "1")
}

/// Turns cudarc's event tracking off for `ctx` unless asked for; before any allocation, so that
/// none carries events. Returns whether tracking stays on.
pub(crate) fn set_tracking(ctx: &CudaContext) -> bool {
    let on = tracking_asked();
    if !on {
        // SAFETY: this backend orders its cross-stream uses itself (the module's rules);
        // nothing has been allocated in this context by this backend yet.
        unsafe { ctx.disable_event_tracking() };
    }
    on
}

/// A matrix being filled on another stream: [`Cuda::arrived`] hands it to the main stream's
/// work. Dropped unused, the main stream first waits for the filling work (the allocation is
/// the main stream's to free).
pub struct Arriving {
    m: Option<DMat>,
    filled: CudaEvent,
    main: Arc<CudaStream>,
}

impl Arriving {
    pub fn dims(&self) -> (usize, usize) {
        self.m.as_ref().map_or((0, 0), |m| (m.rows, m.cols))
    }
}

impl Drop for Arriving {
    fn drop(&mut self) {
        if let Some(m) = self.m.take() {
            self.main.wait(&self.filled).expect("CUDA stream wait");
            drop(m);
        }
    }
}

impl Cuda {
    /// `s`, allocated on another stream, as an allocation of the main stream: freed in the main
    /// stream's order (after the uses queued there).
    pub(crate) fn adopt<T>(&self, s: CudaSlice<T>) -> CudaSlice<T> {
        let len = s.len();
        let ptr = s.leak();
        // SAFETY: a live allocation of `len` elements from this context, given up by `leak`.
        unsafe { self.stream.upgrade_device_ptr(ptr, len) }
    }

    /// The main stream's later work waits for the work queued on `from` so far.
    pub(crate) fn join_main(&self, from: &CudaStream) {
        let e = from.record_event(None).expect("CUDA event");
        self.stream.wait(&e).expect("CUDA stream wait");
    }

    /// `m`, allocated and being filled on `from`, handed to the main stream at
    /// [`Cuda::arrived`].
    pub(crate) fn arriving(&self, from: &CudaStream, m: DMat) -> Arriving {
        let filled = from.record_event(None).expect("CUDA event");
        let m = DMat { rows: m.rows, cols: m.cols, data: self.adopt(m.data) };
        Arriving { m: Some(m), filled, main: self.stream.clone() }
    }

    /// The matrix, for work on the main stream: that work waits for the copy or gather that
    /// fills it.
    pub fn arrived(&self, mut a: Arriving) -> DMat {
        self.stream.wait(&a.filled).expect("CUDA stream wait");
        self.mark("rows arrived");
        a.m.take().expect("an arriving matrix is taken once")
    }

    /// Whether cudarc's own event tracking orders the streams (`GRINNDER_CUDA_EVENT_TRACKING`).
    pub fn event_tracking(&self) -> bool {
        self.ctx.is_event_tracking()
    }
}
