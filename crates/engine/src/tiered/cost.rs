//! The cost model: what an epoch moves between the tiers and what it computes, from the plan
//! (which blocks live where, the host cache's budget and mode) and the schedule, before any
//! epoch runs; with measured rates ([`Rates`]), a predicted epoch time.
//!
//! The traffic comes from running the very steps [`Executor::forward_backward_pass`] runs
//! ([`pass`]: every gather, own-row read, read ahead, put, write-back and removal) over a
//! ledger of the store (sizes,
//! recency, dirty and on-disk flags, the cache modes' eviction), two epochs after the first
//! blocks, the second one reported (the first also writes the fixed blocks the cache evicts).
//! The arithmetic is each layer's count in `grinnder_nn::work`. The time is the sum of every
//! term at its measured rate: the model assumes no overlap of transfers and compute, which
//! the executor only partly has. Not modelled: the GPU tier's blocks added after the first
//! epoch ([`Executor::refine_placement`]), reads ahead that the cache drops before use, ranks.

use std::collections::HashMap;

use grinnder_nn::memory::Shape;
use grinnder_nn::work::{Passes, Work};

use super::ledger::{Ledger, Traffic};

use super::executor::Executor;
use super::pass::{Op, Span, Step};
use super::plan::GIB;
use super::rates::{Rates, Seconds};
use super::store::{BlockId, BlockKind, CacheMode};
use grinnder_tensor::Backend;
use serde::Serialize;

/// An epoch predicted: its traffic and arithmetic, and with rates each term's seconds.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Prediction {
    pub traffic: Traffic,
    pub gemm_flops: u64,
    /// Sparse products' entries times columns.
    pub sparse_entry_columns: u64,
    pub elementwise_bytes: u64,
    /// Seconds of each term at the rates given (`None` without rates).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seconds: Option<Seconds>,
    /// An evaluation after the epoch ([`Executor::evaluate`]: a forward pass without dropout
    /// and the output layer's rows): its bytes, and its seconds at the rates given.
    pub evaluation_traffic: Traffic,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub evaluation_s: Option<f64>,
}

/// The walk's state: the ledger, the executor's placement, and the epoch's arithmetic.
struct Walk<'e, 'a, B: Backend> {
    ex: &'e Executor<'a, B>,
    ledger: Ledger,
    /// Each partition's arithmetic.
    work: Vec<Work>,
    /// Bytes of a backend element, of a stored one, of a stored one on the bus
    /// ([`Executor::bus_elem`]) and of a page-locked one ([`Executor::pinned_elem`]).
    elem: u64,
    tier_elem: u64,
    bus_elem: u64,
    pinned_elem: u64,
    /// Page-locked blocks written so far ([`Executor::add_pinned`] makes an absent one).
    pinned_present: HashMap<BlockId, (u64, u64)>,
    /// Page-locked blocks by shape: how many exist, and the most that did at once.
    pinned_shapes: HashMap<(u64, u64), (u64, u64)>,
}

impl<B: Backend> Walk<'_, '_, B> {
    fn width(&self, kind: BlockKind, l: usize) -> u64 {
        self.ex.width(kind, l) as u64
    }

    fn pinned(&self, id: BlockId) -> bool {
        self.ex.pins(id)
    }

    /// [`Executor::gather_kind`].
    fn gather(&mut self, kind: BlockKind, l: usize, q: usize, halo: bool) {
        let d = self.width(kind, l);
        let id = |p: usize| BlockId { kind, layer: l, part: p };
        let part = &self.ex.parts[q];
        // a page-locked block read alone goes whole, by a copy beside the compute; rows of
        // several blocks are read in place by the gather
        let whole = !halo || part.fetch.is_empty();
        let own: Option<&[u32]> = None;
        let sources = std::iter::once((q, own, part.own as u64))
            .chain(part.fetch.iter().filter(|_| halo).map(|(s, idx)| (*s, Some(&idx[..]), idx.len() as u64)));
        for (s, idx, n) in sources {
            if self.ex.tiers.on_device(id(s)) {
                continue;
            }
            if self.pinned(id(s)) {
                let t = &mut self.ledger.traffic;
                t.upload_bytes += n * d * self.pinned_elem;
                if whole {
                    t.pinned_upload_bytes += n * d * self.pinned_elem;
                } else {
                    t.mapped_read_bytes += n * d * self.pinned_elem;
                }
            } else {
                self.ledger.traffic.upload_bytes += n * d * self.bus_elem;
                self.ledger.read_rows(id(s), idx, d * self.tier_elem);
            }
        }
    }

    /// [`Executor::put`].
    fn put(&mut self, kind: BlockKind, l: usize, q: usize) {
        let id = BlockId { kind, layer: l, part: q };
        if self.ex.tiers.on_device(id) {
            return;
        }
        let rows = self.ex.parts[q].own as u64;
        let d = self.width(kind, l);
        if self.pinned(id) {
            self.ledger.traffic.download_bytes += rows * d * self.pinned_elem;
            self.ledger.traffic.pinned_download_bytes += rows * d * self.pinned_elem;
            self.pin(id, (rows, d));
        } else {
            self.ledger.traffic.download_bytes += rows * d * self.bus_elem;
            self.ledger.put(id, rows, rows * d * self.tier_elem);
        }
    }

    /// [`Executor::write_back`] of a gradient of `rows` rows (own, then halo).
    fn write_back(&mut self, kind: BlockKind, l: usize, q: usize, rows: u64) {
        let d = self.width(kind, l);
        let id = |p: usize| BlockId { kind, layer: l, part: p };
        let part = &self.ex.parts[q];
        let own = part.own as u64;
        let targets: Vec<(usize, u64)> = std::iter::once((q, own))
            .chain(part.fetch.iter().take_while(|_| rows > own).map(|(s, idx)| (*s, idx.len() as u64)))
            .collect();
        let mut host = false;
        for (p, n) in targets {
            if self.ex.tiers.on_device(id(p)) {
                continue;
            }
            let block_rows = self.ex.parts[p].own as u64;
            if self.pinned(id(p)) {
                // [`Executor::add_pinned`]: the device reads and writes the host rows, a block's
                // own rows first and whole are its copy, and an absent block is zeroed first
                let (read, written) = if self.pinned_present.contains_key(&id(p)) {
                    (n, n)
                } else if p == q {
                    (0, n)
                } else {
                    (n, block_rows + n)
                };
                let (e, t) = (d * self.pinned_elem, &mut self.ledger.traffic);
                t.upload_bytes += read * e;
                t.mapped_read_bytes += read * e;
                t.download_bytes += written * e;
                t.pinned_download_bytes += written * e;
                self.pin(id(p), (block_rows, d));
                continue;
            }
            host = true;
            self.ledger.add_rows(id(p), block_rows, d * self.tier_elem, n);
        }
        if host {
            self.ledger.traffic.download_bytes += rows * d * self.elem;
        }
    }

    /// [`Executor::prefetch`]: what partition `q` will read of the `kind` blocks of layer `l`
    /// (halo blocks too with `halo`, unless the cache keeps no layer), and its `extra` blocks.
    fn prefetch(&mut self, kind: BlockKind, l: usize, q: usize, halo: bool, extra: &[BlockKind]) {
        if !self.ex.local.contains(&q) {
            return;
        }
        let part = &self.ex.parts[q];
        let id = |p: usize| BlockId { kind, layer: l, part: p };
        let mut ids = vec![id(q)];
        if kind == BlockKind::Act && l == 0 && self.ex.pre && !halo {
            ids.push(BlockId { kind: BlockKind::Pre, layer: 0, part: q });
        }
        if halo && self.ledger.mode != CacheMode::PartitionLru {
            ids.extend(part.fetch.iter().map(|(s, _)| id(*s)));
        }
        ids.extend(extra.iter().map(|&k| {
            let layer = if k == BlockKind::GradXw { l } else { l + 1 };
            BlockId { kind: k, layer, part: q }
        }));
        ids.retain(|i| !self.ex.tiers.on_device(*i) && !self.pinned(*i));
        self.ledger.prefetch(&ids);
    }

    /// A page-locked block of `dims` (rows, width) exists. A removed one keeps its memory for
    /// the next block of its shape ([`Tiers::retire`]): the memory they take is, for each
    /// shape, the most blocks of it that existed at once.
    fn pin(&mut self, id: BlockId, dims: (u64, u64)) {
        if self.pinned_present.insert(id, dims).is_some() {
            return;
        }
        let (live, most) = self.pinned_shapes.entry(dims).or_default();
        *live += 1;
        if *live > *most {
            *most = *live;
            self.ledger.live_add((dims.0 * dims.1 * self.pinned_elem) as i64);
        }
    }

    /// [`Executor::remove`].
    fn remove_one(&mut self, id: BlockId) {
        self.ledger.remove(id);
        if let Some(dims) = self.pinned_present.remove(&id) {
            self.pinned_shapes.get_mut(&dims).expect("pinned").0 -= 1;
        }
    }

    fn shape(&self, q: usize) -> Shape {
        let p = &self.ex.parts[q];
        Shape { rows: p.own as u64, cols: p.graph.cols as u64, nnz: p.graph.nnz() as u64 }
    }

    fn own_shape(&self, q: usize) -> Shape {
        Shape { cols: self.ex.parts[q].own as u64, ..self.shape(q) }
    }

    fn compute(&mut self, q: usize, w: Work) {
        self.work[q] = std::mem::take(&mut self.work[q]).and(w);
    }

    /// Layer `l`'s work on partition `q` (on `Â x` where layer 0 reads it).
    fn layer_work(&self, l: usize, q: usize) -> Passes {
        let on_pre = l == 0 && self.ex.pre;
        let s = if on_pre { self.own_shape(q) } else { self.shape(q) };
        self.ex.model.layer_work(l, s, on_pre)
    }

    /// The first blocks ([`Executor::load_features`]): what the store holds before epoch 0.
    fn first_blocks(&mut self) {
        let local = self.ex.local.clone();
        if self.ex.pre && !self.ex.keeps_features() {
            for q in local {
                self.put(BlockKind::Pre, 0, q);
            }
        } else {
            for q in local.clone() {
                self.put(BlockKind::Act, 0, q);
            }
            if self.ex.pre {
                for q in local {
                    self.gather(BlockKind::Act, 0, q, true);
                    self.put(BlockKind::Pre, 0, q);
                }
            }
        }
    }

    /// `steps` over the ledger ([`pass`]): every read, read ahead, put and removal as the
    /// executor runs it (`run.rs`), each computation's arithmetic.
    fn run(&mut self, steps: &[Step]) {
        for step in steps {
            match *step {
                Step::Read { id, span, .. } => self.gather(id.kind, id.layer, id.part, span == Span::Columns),
                Step::Prefetch { kind, layer, part, halo, extra } => {
                    self.prefetch(kind, layer, part, halo, extra)
                }
                Step::Compute { part: q, op } => {
                    let w = match op {
                        Op::Forward { l, .. } => self.layer_work(l, q).forward,
                        Op::ColumnsForward => self.columns_work(q).forward,
                        Op::Transform { l, .. } => self.ex.model.split_work(l, self.shape(q)).transform,
                        Op::Aggregate { l } | Op::AggregateForTape { l, .. } => {
                            self.ex.model.split_work(l, self.shape(q)).aggregate
                        }
                        Op::SplitBackward { l } => self.ex.model.split_work(l, self.shape(q)).aggregate_back,
                        Op::Loss => Work::default(),
                        Op::TransformBackward { l, .. } => {
                            self.ex.model.split_work(l, self.shape(q)).transform_back
                        }
                        Op::FusedBackward => {
                            let layer0 = self.layer_work(0, q);
                            let w = self.ex.model.split_work(1, self.shape(q)).transform_back;
                            layer0.forward.and(w).and(layer0.backward)
                        }
                        Op::ForwardForTape { l, .. } => self.layer_work(l, q).forward,
                        Op::BackwardFromOutput { l } | Op::Backward { l } => self.layer_work(l, q).backward,
                        Op::ColumnsForTape => self.columns_work(q).forward,
                        Op::Layer1ForTape { .. } => self.layer_work(1, q).forward,
                        Op::ColumnsBackward => {
                            self.layer_work(1, q).backward.and(self.columns_work(q).backward)
                        }
                    };
                    self.compute(q, w);
                }
                Step::Put { id, .. } => self.put(id.kind, id.layer, id.part),
                Step::WriteBack { id, span, .. } => {
                    let s = self.shape(id.part);
                    let rows = if span == Span::Columns { s.cols } else { s.rows };
                    self.write_back(id.kind, id.layer, id.part, rows);
                }
                Step::Remove(id) => self.remove_one(id),
                Step::Sync { .. }
                | Step::Flush { .. }
                | Step::Mark { .. }
                | Step::Bar { .. }
                | Step::Tick { .. } => {}
            }
        }
    }

    /// [`Executor::forward_to`] of every layer.
    fn forward(&mut self, train: bool) {
        let steps = self.ex.forward_steps(self.ex.model.layers(), train);
        self.run(&steps);
    }

    /// Layer 0's work over partition `q`'s columns ([`Op::ColumnsForward`]).
    fn columns_work(&self, q: usize) -> Passes {
        let s = self.shape(q);
        self.ex.model.layer_work(0, Shape { rows: s.cols, ..s }, true)
    }

    /// [`Executor::evaluate_pass`]: the hidden layers, then the output layer's rows partition
    /// by partition ([`Executor::output_rows`]), then the forward blocks removed.
    fn evaluate(&mut self) {
        self.forward(false);
        for q in self.ex.local.clone() {
            let steps = self.ex.output_steps(q, q + 1);
            self.run(&steps);
        }
        let steps = self.ex.remove_forward_steps(self.ex.model.layers());
        self.run(&steps);
    }

    /// [`Executor::forward_backward_pass`]'s backward.
    fn backward(&mut self) {
        let steps = self.ex.backward_steps();
        self.run(&steps);
    }
}

impl<B: Backend> Executor<'_, B> {
    /// The predicted training epoch (see the module): a steady epoch's traffic and arithmetic,
    /// and with `rates` its seconds — the compute measured on the partition whose modelled
    /// compute is largest ([`Executor::time_compute`]) and scaled to the others by the model.
    /// Before the first epoch (`grinnder info`), with `--gpu-mem`, the GPU tier is refined as
    /// the first epoch will refine it, from the peak that partition's run reached. `None` for a
    /// rank of a partition-parallel run.
    pub fn predict_epoch(&mut self, rates: Option<&Rates>) -> Option<Prediction> {
        if self.dist.is_some() {
            return None;
        }
        let elem = std::mem::size_of::<B::T>() as u64;
        // walked again below where the GPU tier's refinement moves blocks (or ends layer 0's
        // fusion)
        let (mut traffic, mut work, mut evaluation) = self.walk();
        // the partition whose compute is measured: the largest by the model's time, or by rows
        // and entries without rates
        let size = |q: usize| match rates {
            Some(r) => r.compute_seconds(&work[q], elem),
            None => (self.parts[q].own + self.parts[q].graph.nnz()) as f64,
        };
        let q = self.local.clone().max_by(|&a, &b| size(a).total_cmp(&size(b))).unwrap_or(0);
        let refine = self.gpu_mem.is_some() && !self.calibrated && self.plan.device.is_some();
        // timing a partition needs its working set free beside the GPU tier: after epochs the
        // tier holds what the epoch's peak left, and an allocation past `--gpu-mem` would end
        // the run (then only the traffic is predicted)
        let free = self.gpu_mem.zip(self.b.device_memory()).map(|(g, m)| g.saturating_sub(m.used));
        let fits = free.is_none_or(|f| f >= self.plan.device_working_bytes);
        if !fits {
            tracing::debug!(
                "the cost model times no partition: too little GPU memory is free beside the GPU tier"
            );
        }
        let mut measured = None;
        if (rates.is_some() || refine) && fits {
            // the second run: the first makes what kernels make once (a shape's first sparse
            // product is timed against the alternatives on CUDA; buffers, page faults)
            self.time_compute(q);
            self.b.reset_memory_peak();
            measured = Some(self.time_compute(q));
        }
        if refine && fits {
            // the GPU tier's refinement after the first epoch ([`Executor::refine_placement`]),
            // from the peak the measured partition reached beside the blocks already placed
            let placed = self.plan.device.as_ref().map_or(0, |d| d.placed_bytes);
            if let Some(m) = self.b.device_memory() {
                let margin = self.plan.device.as_ref().map_or(0, |d| d.margin_bytes);
                let room = self.gpu_mem.unwrap_or(0).saturating_sub(margin).saturating_sub(m.peak + placed);
                if let Ok(moved) = self.place_within(room) {
                    (traffic, work, evaluation) = self.walk();
                    tracing::debug!(
                        "predicted: after the first epoch the GPU tier takes {} more blocks ({:.2} GiB)",
                        moved.0,
                        moved.1 as f64 / GIB
                    );
                }
                self.calibrated = true;
            }
        }
        let all: Work = work.iter().cloned().sum();
        let sparse_entry_columns = all.sparse.iter().map(|s| s.entries * s.width).sum();
        let elementwise_bytes = all.elementwise * elem;
        // the measured partition's compute scales the model's to every partition's, and to an
        // evaluation's
        let scaled = rates.zip(measured).map(|(r, measured)| {
            let largest = r.compute_seconds(&work[q], elem);
            let compute_s = move |w: &[Work]| {
                let modelled: f64 = w.iter().map(|w| r.compute_seconds(w, elem)).sum();
                if largest > 0.0 {
                    measured * modelled / largest
                } else {
                    measured
                }
            };
            (
                r.seconds(&traffic, compute_s(&work)),
                r.seconds(&evaluation.0, compute_s(&evaluation.1)).epoch_s,
            )
        });
        let (seconds, evaluation_s) = scaled.unzip();
        Some(Prediction {
            traffic,
            gemm_flops: all.gemm_flops,
            sparse_entry_columns,
            elementwise_bytes,
            seconds,
            evaluation_traffic: evaluation.0,
            evaluation_s,
        })
    }

    /// Two epochs walked after the first blocks: the second one's traffic and each partition's
    /// arithmetic; then an evaluation's.
    fn walk(&self) -> (Traffic, Vec<Work>, (Traffic, Vec<Work>)) {
        let mut w = self.walker();
        let parts = self.parts.len();
        w.first_blocks();
        for _ in 0..2 {
            w.ledger.traffic = Traffic::default();
            w.work = vec![Work::default(); parts];
            w.forward(true);
            w.backward();
        }
        let epoch = (
            std::mem::take(&mut w.ledger.traffic),
            std::mem::replace(&mut w.work, vec![Work::default(); parts]),
        );
        w.evaluate();
        (epoch.0, epoch.1, (w.ledger.traffic, w.work))
    }

    /// The most bytes of host blocks (the store's, in its cache or its files, and page-locked
    /// ones) that exist at once from the first blocks through an epoch and an evaluation, as
    /// the schedule makes and removes them: what the host cache and the storage directory
    /// must hold together (every block an epoch makes, summed, can be more: GCN with 4 layers
    /// of 64 over 40 classes holds at most all but two of its gradient blocks at once, see
    /// `engine/tests/suite/tiered.rs`). Where the executor only predicts
    /// ([`TieredConfig::inference`]), the first blocks and an evaluation's forward: a
    /// prediction's pass makes no more.
    pub(super) fn peak_host_block_bytes(&self) -> u64 {
        let mut w = self.walker();
        w.first_blocks();
        if !self.inference {
            w.forward(true);
            w.backward();
        }
        w.evaluate();
        w.ledger.peak
    }

    fn walker(&self) -> Walk<'_, '_, B> {
        let elem = std::mem::size_of::<B::T>() as u64;
        let tier_elem = self.tiers.store.elem_bytes() as u64;
        let ledger = Ledger::new(self.plan.cache_bytes, self.plan.mode);
        Walk {
            ex: self,
            ledger,
            work: vec![Work::default(); self.parts.len()],
            elem,
            tier_elem,
            bus_elem: self.bus_elem(),
            pinned_elem: self.pinned_elem(),
            pinned_present: HashMap::new(),
            pinned_shapes: HashMap::new(),
        }
    }
}
