//! What training reports: per-epoch figures and the final summary.

use serde::Serialize;

/// One epoch's figures (the keys of `--metrics-out`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct EpochMetrics {
    pub epoch: usize,
    /// Mean cross-entropy over the training nodes (train mode: with dropout).
    pub loss: f64,
    /// Accuracies and evaluation time, on evaluated epochs (`--eval-every`) only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub train_acc: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub valid_acc: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub test_acc: Option<f64>,
    /// Seconds of the training step (forward, loss, backward, optimizer).
    pub epoch_s: f64,
    /// Seconds of the evaluation pass.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eval_s: Option<f64>,
    /// Peak resident memory of the process so far.
    pub peak_host_bytes: u64,
    /// Peak bytes of GPU memory the backend held so far (GPU backends only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_device_bytes: Option<u64>,
    /// The tiered executor's phase times and store counters (training step only).
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub tier: Option<crate::tiered::PhaseStats>,
}

/// The run's outcome.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Summary {
    pub epochs: usize,
    pub best_epoch: usize,
    pub best_valid_acc: f64,
    /// Test accuracy at the best validation epoch.
    pub test_acc: f64,
    pub final_loss: f64,
    /// Median training-step time.
    pub epoch_s_median: f64,
    pub peak_host_bytes: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_device_bytes: Option<u64>,
}

/// Peak resident set size of this process (Linux `VmHWM`; 0 where unavailable).
pub fn peak_rss_bytes() -> u64 {
    status_bytes("VmHWM:")
}

static START_RSS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Records what the process holds before it has loaded anything (code, libraries, runtime):
/// the base of [`held_bytes`]. Called first thing by the binary.
pub fn mark_process_start() {
    START_RSS.store(rss_bytes(), std::sync::atomic::Ordering::Relaxed);
}

/// Bytes of `ds` in memory-mapped files (touched by verification and training, so resident
/// while mapped).
pub fn mapped_bytes(ds: &grinnder_graph::Dataset) -> u64 {
    let size = |mapped: bool, bytes: usize| if mapped { bytes as u64 } else { 0 };
    let g = &ds.graph;
    let s = &ds.splits;
    size(ds.features.data.is_mapped(), ds.features.data.len() * 4)
        + size(g.is_mapped(), g.row_ptr().len() * 8 + g.col_idx().len() * 4)
        + size(ds.labels.is_mapped(), ds.labels.len() * 4)
        + [&s.train, &s.valid, &s.test].iter().map(|b| size(b.is_mapped(), b.len() * 4)).sum::<u64>()
}

/// What the process holds, counted by construction where the counting allocator is installed
/// ([`crate::heap`]): the base at start-up, the heap in use and the mapped dataset (`mapped`).
/// Unlike a sampled RSS it leaves out what the allocator keeps of freed memory, so identical
/// runs plan alike. Without the counting allocator: the RSS now.
pub fn held_bytes(mapped: u64) -> u64 {
    match crate::heap::live_bytes() {
        Some(live) => START_RSS.load(std::sync::atomic::Ordering::Relaxed) + live + mapped,
        None => rss_bytes(),
    }
}

/// Resident set size of this process now (Linux `VmRSS`; 0 where unavailable).
pub fn rss_bytes() -> u64 {
    status_bytes("VmRSS:")
}

/// A kB field of `/proc/self/status`, in bytes.
fn status_bytes(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}
