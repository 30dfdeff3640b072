//! `GRINNDER_CUDA_TIMELINE=FILE`: a timeline of the backend's streams, for finding where a
//! pipelined run waits. At marked points (a gather or upload on the second stream starting and
//! ending, a matrix arriving on the main stream, the logits of a loss, the host reading a
//! loss, a synchronisation) a timing event is recorded on the stream and the host's clock is read. At
//! the end both clocks go to `FILE` as tab-separated `stream label device_ms host_ms`, from one
//! origin: the device time is when the stream reached the point, the host time when the host
//! queued it (or, for marks after a wait, when the wait returned). `bench/timeline.py` sums
//! the file per step. Nothing is synchronised in between; each mark costs an event record.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Instant;

use cudarc::driver::{sys, CudaEvent, CudaStream};

/// Marks kept at most (later ones are dropped): a few hundred thousand events are cheap.
const MAX_MARKS: usize = 200_000;

struct Mark {
    stream: &'static str,
    label: &'static str,
    event: CudaEvent,
    host: Instant,
}

pub(crate) struct Timeline {
    path: PathBuf,
    origin: CudaEvent,
    host0: Instant,
    marks: Mutex<Vec<Mark>>,
}

impl Timeline {
    /// A timeline when `GRINNDER_CUDA_TIMELINE` names a file; its origin is recorded on
    /// `stream` and waited for, so that both clocks start together.
    pub(crate) fn from_env(stream: &CudaStream) -> Option<Timeline> {
        let path = PathBuf::from(std::env::var_os("GRINNDER_CUDA_TIMELINE")?);
        let origin = stream.record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT)).ok()?;
        origin.synchronize().ok()?;
        Some(Timeline { path, origin, host0: Instant::now(), marks: Mutex::new(Vec::new()) })
    }

    /// Marks `label` on `stream` (named `which` in the file).
    pub(crate) fn mark(&self, stream: &CudaStream, which: &'static str, label: &'static str) {
        let mut marks = self.marks.lock().unwrap_or_else(|p| p.into_inner());
        if marks.len() >= MAX_MARKS {
            return;
        }
        let Ok(event) = stream.record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT)) else { return };
        marks.push(Mark { stream: which, label, event, host: Instant::now() });
    }

    /// Writes the marks (the caller has synchronised the device: every event has completed).
    pub(crate) fn write(&self) -> std::io::Result<()> {
        let marks = self.marks.lock().unwrap_or_else(|p| p.into_inner());
        let mut w = std::io::BufWriter::new(std::fs::File::create(&self.path)?);
        writeln!(w, "stream\tlabel\tdevice_ms\thost_ms")?;
        for m in marks.iter() {
            let device =
                self.origin.elapsed_ms(&m.event).map_err(|e| std::io::Error::other(format!("{e:?}")))?;
            let host = m.host.duration_since(self.host0).as_secs_f64() * 1e3;
            writeln!(w, "{}\t{}\t{device:.4}\t{host:.4}", m.stream, m.label)?;
        }
        w.flush()?;
        eprintln!("CUDA timeline: {} marks in {}", marks.len(), self.path.display());
        Ok(())
    }
}
