//! Work timed on a stream by pairs of timing events, read back lazily: the device's clock
//! (overlapped work and waits for other devices included) without synchronising the host.

use std::collections::VecDeque;
use std::sync::Mutex;

use cudarc::driver::{sys, CudaEvent, CudaStream};

/// Seconds and bytes of the timed work read back so far, and the event pairs not yet read.
#[derive(Default)]
pub(crate) struct EventClock {
    pending: VecDeque<(CudaEvent, CudaEvent, u64)>,
    pub secs: f64,
    pub bytes: u64,
}

impl EventClock {
    /// `work` (which queues `bytes` of transfers or computes on `stream`) bracketed by timing
    /// events on `stream`.
    pub fn time<R>(
        clock: &Mutex<EventClock>,
        stream: &CudaStream,
        bytes: u64,
        work: impl FnOnce() -> R,
    ) -> R {
        let timing = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        let start = stream.record_event(timing).expect("CUDA event");
        let r = work();
        let end = stream.record_event(timing).expect("CUDA event");
        let mut c = clock.lock().unwrap_or_else(|p| p.into_inner());
        c.pending.push_back((start, end, bytes));
        // the oldest have long finished: reading them does not wait
        while c.pending.len() > 16 {
            c.settle_one();
        }
        r
    }

    /// Reads every pending pair back (waiting for the work still running).
    pub fn settle(&mut self) {
        while !self.pending.is_empty() {
            self.settle_one();
        }
    }

    fn settle_one(&mut self) {
        let Some((start, end, bytes)) = self.pending.pop_front() else { return };
        self.secs += f64::from(start.elapsed_ms(&end).expect("CUDA event timing")) / 1e3;
        self.bytes += bytes;
    }
}
