//! Profiling (`GRINNDER_CUDA_PROFILE`): per-operation time, with or without synchronising
//! around each operation, printed when the backend is dropped.

use super::*;

/// Time per operation when `GRINNDER_CUDA_PROFILE` is set: every operation is bracketed by
/// synchronisations of the whole device, all streams (slower, and the second stream's work no
/// longer overlaps, but each figure is that operation's alone); the table is printed when the
/// backend is dropped. `GRINNDER_CUDA_PROFILE=shapes` keeps GEMMs and SpMMs apart by their
/// shapes (to two significant digits). The figures are host time: launch overheads included.
/// `GRINNDER_CUDA_PROFILE=host` (also `host,shapes`) synchronises nothing: each figure is the
/// time the calling thread spent in the call (queueing it, and waiting where it waits, as
/// reading a loss and `synchronize` do), which shows whether the host or the device bounds.
#[derive(Default)]
pub(crate) struct Profile {
    pub(crate) ops: std::sync::Mutex<std::collections::BTreeMap<String, (f64, u64)>>,
    pub(crate) shapes: bool,
    /// Host time per call, with no synchronisation: what the calling thread spends queueing
    /// each operation (and waiting where the operation itself waits).
    pub(crate) host: bool,
}

/// One profiled operation (see [`Profile`]).
pub(crate) struct Span<'a> {
    pub(crate) cuda: &'a Cuda,
    pub(crate) name: String,
    pub(crate) start: std::time::Instant,
}

/// `x` to two significant digits, for profile labels.
pub(crate) fn approx(x: usize) -> usize {
    let mut scale = 1;
    while x / scale >= 100 {
        scale *= 10;
    }
    (x + scale / 2) / scale * scale
}

impl Drop for Span<'_> {
    fn drop(&mut self) {
        let Some(p) = &self.cuda.prof else { return };
        if !p.host {
            self.cuda.ctx.synchronize().expect("CUDA synchronize");
        }
        let t = self.start.elapsed().as_secs_f64();
        let mut ops = p.ops.lock().unwrap_or_else(|e| e.into_inner());
        let e = ops.entry(std::mem::take(&mut self.name)).or_insert((0.0, 0));
        e.0 += t;
        e.1 += 1;
    }
}

impl Cuda {
    /// Starts timing an operation when profiling.
    pub(crate) fn span(&self, name: &'static str) -> Option<Span<'_>> {
        self.span_shaped(name, String::new)
    }

    /// [`Cuda::span`], labelled with `shape()` too when the profile keeps shapes apart.
    pub(crate) fn span_shaped(&self, name: &'static str, shape: impl FnOnce() -> String) -> Option<Span<'_>> {
        let p = self.prof.as_ref()?;
        if !p.host {
            // every stream: the operation alone, not waiting for the second stream's work
            self.ctx.synchronize().expect("CUDA synchronize");
        }
        let name = if p.shapes { format!("{name} {}", shape()) } else { name.to_string() };
        Some(Span { cuda: self, name, start: std::time::Instant::now() })
    }
}

#[cfg(test)]
mod tests {
    use super::approx;

    #[test]
    pub(crate) fn profile_labels_round_to_two_digits() {
        assert_eq!(
            [approx(0), approx(99), approx(1234), approx(1250), approx(150_123)],
            [0, 99, 1200, 1300, 150_000]
        );
    }
}
