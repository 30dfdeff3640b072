//! What the executor measures as it runs: each phase's seconds and bytes ([`PhaseStats`]), and
//! the working set a phase grew the heap and the device by (the plan's figures are checked
//! against them: `engine/tests/device_held.rs`, `engine/tests/memory.rs`).

use serde::Serialize;

use super::dist::CommStats;
use super::store::TierStats;

/// The executor's meters.
#[derive(Default)]
pub(super) struct Meters {
    /// Phase times and the store's counters since [`Executor::take_stats`](super::Executor::take_stats).
    pub(super) stats: PhaseStats,
    /// The heap in use at the last mark, and the largest growth of a phase.
    marked: u64,
    working: Option<u64>,
    /// The same for the backend's memory: bytes in use and GPU-tier block bytes at the last
    /// mark, and the largest growth of a phase beyond the blocks it added.
    device_marked: (u64, u64),
    device_working: Option<u64>,
}

impl Meters {
    /// A pass begins: the largest growths start again.
    pub(super) fn begin_pass(&mut self) {
        (self.working, self.device_working) = (None, None);
    }

    /// A phase ended with the heap's `live` bytes and its `peak` since the last mark: keeps the
    /// growth if it is the largest, and returns it.
    pub(super) fn heap(&mut self, live: u64, peak: u64) -> u64 {
        let grew = peak.saturating_sub(self.marked);
        self.working = Some(self.working.unwrap_or(0).max(grew));
        self.marked = live;
        grew
    }

    /// A phase ended with `used` bytes of device memory in use, `peak` since the last mark,
    /// and `blocks` bytes of GPU-tier blocks: what the phase held beyond what was in use when
    /// it began, less the GPU tier's blocks then, and the blocks it holds at its end (blocks
    /// dropped after the last mark no longer count) — its kernels' inputs, outputs and
    /// temporaries. Keeps it if it is the largest, and returns it.
    pub(super) fn device(&mut self, used: u64, peak: u64, blocks: u64) -> u64 {
        let (was_used, was_blocks) = self.device_marked;
        let grew = peak.saturating_sub(was_used.saturating_sub(was_blocks)).saturating_sub(blocks);
        self.device_working = Some(self.device_working.unwrap_or(0).max(grew));
        self.device_marked = (used, blocks);
        grew
    }

    /// The largest heap growth of a phase since the last call.
    pub(super) fn take_working(&mut self) -> Option<u64> {
        self.working.take()
    }

    /// The largest device growth of a phase since the last call.
    pub(super) fn take_device_working(&mut self) -> Option<u64> {
        self.device_working.take()
    }
}

/// Seconds per phase of one epoch, with the store's counters.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct PhaseStats {
    /// Mini-batch training: sampling time and the number of batches (absent otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sample_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batches: Option<usize>,
    /// Mini-batch training: time the training thread waited for sampled batches (the
    /// loader's shortfall).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batch_wait_s: Option<f64>,
    pub gather_s: f64,
    pub compute_s: f64,
    pub write_back_s: f64,
    /// Bytes of host-tier rows handed to the backend and of results taken back to the host
    /// tier (on a GPU: the PCIe traffic).
    pub upload_bytes: u64,
    pub download_bytes: u64,
    /// Of them: rows the backend read in place from page-locked host blocks (zero-copy
    /// gathers, the rows an addition reads), and bytes it wrote into such blocks.
    pub mapped_read_bytes: u64,
    pub pinned_download_bytes: u64,
    #[serde(flatten)]
    pub tier: TierStats,
    /// Partition-parallel runs: bytes exchanged, summed over the ranks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub comm: Option<CommStats>,
}

impl PhaseStats {
    /// Counts bytes the backend read in place from page-locked host blocks and wrote into them.
    pub(super) fn pinned_traffic(&mut self, read: u64, written: u64) {
        self.upload_bytes += read;
        self.mapped_read_bytes += read;
        self.download_bytes += written;
        self.pinned_download_bytes += written;
    }
}
