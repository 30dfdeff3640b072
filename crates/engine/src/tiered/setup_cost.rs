//! The first blocks' predicted time, the one setup phase `grinnder info` does not run (it runs
//! the others — loading, partitioning, the partition graphs and blocks — and times them): each
//! partition's feature rows read from the dataset, uploaded and aggregated into `Â·x` where
//! layer 0 starts from it, and kept — on the GPU tier, in page-locked host blocks or in the
//! store. On a GPU the reading goes on beside the rest (a thread reads partition q+1's rows
//! while q's are uploaded, aggregated and kept): per partition the longer of the two counts,
//! after the first partition's read; on the CPU both share the cores and add up.

use std::time::Instant;

use grinnder_graph::Dataset;
use grinnder_tensor::Backend;
use serde::Serialize;

use crate::config::FeatureNorm;
use crate::features::feature_rows_into;

use super::executor::Executor;
use super::plan::act;
use super::rates::Rates;
use super::store::{BlockId, BlockKind};

/// What making the first blocks moves and computes, and with rates how long it takes.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FirstBlocks {
    /// Feature rows read from the dataset: each partition's own rows, and its halo rows where
    /// it aggregates them at once.
    pub read_bytes: u64,
    /// The rate a sample of those rows (one partition's, strided) was read at, here and now:
    /// from the page cache where the file's pages are cached, else from its disk.
    pub read_bytes_per_s: f64,
    /// Rows uploaded to aggregate them (none where the backend computes in host memory).
    pub upload_bytes: u64,
    /// `Â·x`'s entries times columns.
    pub aggregate_entry_columns: u64,
    /// The blocks kept on the GPU tier, in page-locked host memory, and in the store.
    pub device_bytes: u64,
    pub pinned_bytes: u64,
    pub stored_bytes: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seconds: Option<FirstBlocksSeconds>,
}

/// The first blocks' seconds by term and in all (see the module).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FirstBlocksSeconds {
    pub read_s: f64,
    pub upload_s: f64,
    pub aggregate_s: f64,
    /// Page-locking host blocks and downloading into them; copies into the store.
    pub keep_s: f64,
    pub total_s: f64,
}

/// One partition's share of [`FirstBlocks`]' bytes and entry-columns.
#[derive(Default)]
struct PartFirstBlocks {
    read: u64,
    upload: u64,
    entry_columns: u64,
    device: u64,
    pinned: u64,
    stored: u64,
}

/// The most a read sample holds.
const SAMPLE_BYTES: u64 = 64 << 20;

impl<'a, B: Backend> Executor<'a, B> {
    /// The first blocks' traffic on `ds` (read with `norm`) and, with `rates`, their time
    /// (see the module); `None` for one rank of several.
    pub fn predict_first_blocks(
        &self,
        ds: &Dataset,
        norm: FeatureNorm,
        rates: Option<&Rates>,
    ) -> Option<FirstBlocks> {
        if self.dist.is_some() {
            return None;
        }
        let d = ds.features.dim as u64;
        let elem = std::mem::size_of::<B::T>() as u64;
        let on_gpu = self.b.device_memory().is_some();
        // all input rows at once, or own rows kept as feature blocks and gathered from them
        let whole = self.pre && !self.keeps_features();
        let each: Vec<PartFirstBlocks> = self
            .local
            .clone()
            .map(|q| {
                let p = &self.parts[q];
                let (own, cols) = (p.own as u64, p.graph.cols as u64);
                let mut e =
                    PartFirstBlocks { read: if whole { cols } else { own } * d * 4, ..Default::default() };
                // (page-locked bf16 blocks: two bytes an element)
                let pinned_elem = self.pinned_elem();
                let mut keep = |id: BlockId, elems: u64| {
                    if self.tiers.on_device(id) {
                        e.device += elems * elem;
                    } else if self.tiers.pin_fixed {
                        e.pinned += elems * pinned_elem;
                    } else {
                        e.stored += elems * elem;
                    }
                };
                if !whole {
                    keep(act(0, q), own * d);
                }
                if self.pre {
                    keep(BlockId { kind: BlockKind::Pre, layer: 0, part: q }, own * d);
                    e.upload = if on_gpu { cols * d * elem } else { 0 };
                    e.entry_columns = p.graph.nnz() as u64 * d;
                }
                e
            })
            .collect();
        let sum = |f: fn(&PartFirstBlocks) -> u64| each.iter().map(f).sum::<u64>();
        let mut f = FirstBlocks {
            read_bytes: sum(|e| e.read),
            read_bytes_per_s: self.sample_read_rate(ds, norm, whole),
            upload_bytes: sum(|e| e.upload),
            aggregate_entry_columns: sum(|e| e.entry_columns),
            device_bytes: sum(|e| e.device),
            pinned_bytes: sum(|e| e.pinned),
            stored_bytes: sum(|e| e.stored),
            seconds: None,
        };
        f.seconds = rates.map(|r| {
            let lock = r.page_lock_bytes_per_s.unwrap_or(f64::INFINITY);
            // (page-locked blocks come and go by DMA: the bus's page-locked rate both ways)
            let bus = r.pinned_upload_bytes_per_s;
            let aggregate =
                |ec: u64| r.compute_seconds(&grinnder_nn::work::Work::spmm(ec / d.max(1), d, false), elem);
            let read: Vec<f64> = each.iter().map(|e| e.read as f64 / f.read_bytes_per_s).collect();
            let rest: Vec<[f64; 3]> = each
                .iter()
                .map(|e| {
                    let keep = e.pinned as f64 * (1.0 / lock + 1.0 / bus)
                        + e.stored as f64 / r.host_copy_bytes_per_s;
                    [e.upload as f64 / bus, aggregate(e.entry_columns), keep]
                })
                .collect();
            let total_s = if on_gpu {
                // partition q's upload, aggregation and keeping beside q+1's reading
                read.first().copied().unwrap_or(0.0)
                    + (0..each.len())
                        .map(|i| read.get(i + 1).copied().unwrap_or(0.0).max(rest[i].iter().sum()))
                        .sum::<f64>()
            } else {
                // the reading and the aggregation share the cores
                read.iter().sum::<f64>() + rest.iter().flatten().sum::<f64>()
            };
            let term = |k: usize| rest.iter().map(|x| x[k]).sum::<f64>();
            FirstBlocksSeconds {
                read_s: read.iter().sum(),
                upload_s: term(0),
                aggregate_s: term(1),
                keep_s: term(2),
                total_s,
            }
        });
        Some(f)
    }

    /// Bytes per second at which feature rows of the first partition are read now: up to
    /// [`SAMPLE_BYTES`] of them, the same share of its own rows and (with `whole`) of its halo
    /// rows, each share from its start (runs of consecutive rows as the reading meets them).
    fn sample_read_rate(&self, ds: &Dataset, norm: FeatureNorm, whole: bool) -> f64 {
        let Some(q) = self.local.clone().next() else { return f64::INFINITY };
        let own = self.own_ids(q);
        let fetch = if whole { &self.parts[q].fetch[..] } else { &[] };
        let ids = super::setup::input_ids(own, fetch, |s| self.own_ids(s));
        let (own, halo) = ids.split_at(own.len());
        let row = ds.features.dim as u64 * 4;
        let share = (SAMPLE_BYTES as f64 / (ids.len() as u64 * row).max(1) as f64).min(1.0);
        let take = |n: usize| ((n as f64 * share).ceil() as usize).min(n);
        let sample: Vec<u32> =
            own[..take(own.len())].iter().chain(&halo[..take(halo.len())]).copied().collect();
        // written first: the reading is timed, not the buffer's page faults
        let mut out = vec![1f32; sample.len() * ds.features.dim];
        let t = Instant::now();
        // (the shift only changes the values, not the reading)
        if feature_rows_into(ds, norm, 0.0, &sample, &mut out).is_err() {
            return f64::INFINITY;
        }
        (sample.len() as u64 * row) as f64 / t.elapsed().as_secs_f64().max(1e-9)
    }
}
