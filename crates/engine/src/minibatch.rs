//! Mini-batch training (GraphSAGE-style neighbour sampling): per batch, the sampled blocks
//! become bipartite graphs the layers run on (the same `layer_forward`/`layer_backward` the
//! other executors use), the input rows are gathered from the features, the loss is the mean
//! over the batch's seeds, and the optimizer steps once per batch. Evaluation is exact:
//! full-neighbourhood, layer-wise inference through the tiered executor's forward.
//!
//! Normalisation on a sampled block: SAGE's mean is over the sampled neighbours; GCN keeps the
//! whole graph's `D̂^{-1/2}(A + I)D̂^{-1/2}` coefficients and scales a row's neighbour terms by
//! `degree / sampled` (an unbiased estimate of the full sum); with full neighbourhoods (`-1`)
//! both are exactly the full graph's, and so are the gradients (tests/suite/minibatch.rs).

use grinnder_graph::progress;
use grinnder_graph::rng::hash_key;
use grinnder_graph::sample::{Block, KHopSampler, MiniBatch, NeighborSampler, Scratch};
use grinnder_graph::Dataset;
use grinnder_nn::graph::Adjacency;
use grinnder_nn::{Aggregation, Graph, Model, Optimizer};
use grinnder_tensor::{Backend, Rows as TensorRows};

use crate::config::{FeaturePrep, TrainConfig, TrainError};
use crate::features::{FeatureSource, HostFeatures};
use crate::tiered::{Executor, PhaseStats, TieredConfig};

use std::time::Instant;

/// Mini-batch settings.
#[derive(Clone, Debug, PartialEq)]
pub struct MiniBatchConfig {
    /// Per hop from the seeds (PyG's `num_neighbors` order); `-1`: all. One per layer for
    /// neighbour sampling; for k-hop subgraphs, as many as hops.
    pub fanouts: Vec<i64>,
    pub sampler: Sampler,
    pub batch_size: usize,
    /// Partitions of the full-neighbourhood evaluation (1: the whole graph at once).
    pub eval_parts: usize,
    /// Only the first this many batches of each epoch (benchmarks); `None`: all.
    pub max_batches: Option<usize>,
    /// Sampling threads (a loader's workers); `None`: half the cores, at most 8.
    pub loader_threads: Option<usize>,
}

/// How a mini-batch is sampled.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Sampler {
    /// GraphSAGE: per-layer neighbour sampling, one block per layer.
    #[default]
    Neighbor,
    /// ShaDow: the node-induced k-hop subgraph of the seeds, every layer on all of it.
    KHop,
}

/// The host blocks sampling threads gather batches' input rows into ([`HostFeatures::staged`]).
/// Batch k waits for its turn until batch k − `blocks` has given its block back, so the
/// threads, each running ahead on its own batches, never hold every block while the batch the
/// trainer waits for has none; `close` releases every waiting thread (the trainer stopped).
struct Staging<B: Backend> {
    /// (batches given back, free blocks, closed)
    state: std::sync::Mutex<(usize, Vec<B::HostBlock>, bool)>,
    turn: std::sync::Condvar,
    blocks: usize,
}

impl<B: Backend> Staging<B> {
    fn new(blocks: usize) -> Self {
        Staging { state: std::sync::Mutex::new((0, Vec::new(), false)), turn: Default::default(), blocks }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (usize, Vec<B::HostBlock>, bool)> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Batch `k`'s block with room for `rows × cols` (once its turn comes); `None` when closed
    /// or when the backend has no host block to give.
    fn take(&self, b: &B, k: usize, rows: usize, cols: usize) -> Option<B::HostBlock> {
        let mut st = self.lock();
        while !st.2 && k >= st.0 + self.blocks {
            st = self.turn.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        if st.2 {
            return None;
        }
        let free = st.1.pop();
        drop(st);
        match free {
            Some(h) if matches!(b.host_block_dims(&h), (r, c) if r >= rows && c == cols) => Some(h),
            _ => {
                // a quarter more than asked: later batches are about as large
                let cap = rows + rows / 4 + 1;
                b.host_block(grinnder_tensor::Mat::zeros(cap, cols)).ok()
            }
        }
    }

    /// The next batch in order is done with its block (uploads may still read it: the next
    /// write waits for them).
    fn give(&self, h: Option<B::HostBlock>) {
        let mut st = self.lock();
        st.0 += 1;
        st.1.extend(h);
        self.turn.notify_all();
    }

    /// A new epoch: batches count from 0 again; the blocks stay.
    fn reset(&self) {
        let mut st = self.lock();
        st.0 = 0;
        st.2 = false;
    }

    fn close(&self) {
        self.lock().2 = true;
        self.turn.notify_all();
    }
}

/// A batch from a sampling thread: its blocks, their graphs on the backend (uploaded by the
/// thread), its rows in a staging block (where staged and a block could be had) and the
/// thread's seconds.
struct Sampled<B: Backend> {
    batch: MiniBatch,
    graphs: Vec<Graph<B>>,
    staged: Option<B::HostBlock>,
    secs: f64,
}

/// Closes a [`Staging`] when the trainer's loop ends, however it ends.
struct CloseOnDrop<'s, B: Backend>(&'s Staging<B>);

impl<B: Backend> Drop for CloseOnDrop<'_, B> {
    fn drop(&mut self) {
        self.0.close();
    }
}

/// A block as a graph on the backend, with the values of the model's aggregation
/// ([`Aggregation::sampled`]).
pub fn block_graph<B: Backend>(b: &B, ds: &Dataset, aggregation: Aggregation, blk: &Block) -> Graph<B> {
    let m = aggregation.sampled(&ds.graph, blk);
    block_graph_of(aggregation, blk, Adjacency::new(b, &m.0, &m.1))
}

/// [`block_graph`] made ahead of its use by a sampling thread ([`Adjacency::ahead`]).
pub fn block_graph_ahead<B: Backend>(b: &B, ds: &Dataset, aggregation: Aggregation, blk: &Block) -> Graph<B> {
    let m = aggregation.sampled(&ds.graph, blk);
    block_graph_of(aggregation, blk, Adjacency::ahead(b, &m.0, &m.1))
}

fn block_graph_of<B: Backend>(aggregation: Aggregation, blk: &Block, adj: Adjacency<B>) -> Graph<B> {
    Graph::single(blk.rows, blk.cols, aggregation, adj, Some(blk.col_ids.clone()))
}

/// One batch's forward and backward: accumulates every parameter's gradient of the mean loss
/// over the seeds (the caller zeroes them); returns the summed loss and the correct count.
pub fn batch_forward_backward<B: Backend>(
    b: &B,
    model: &mut Model<B>,
    ds: &Dataset,
    batch: &MiniBatch,
    x: B::Mat,
    epoch: u64,
) -> (f64, usize) {
    let aggregation = model.aggregation();
    let graphs: Vec<Graph<B>> = batch.blocks.iter().map(|blk| block_graph(b, ds, aggregation, blk)).collect();
    let loss = batch_step(b, model, ds, batch, &graphs, x, epoch, None);
    b.loss_value(loss)
}

/// [`batch_forward_backward`] on the batch's graphs, already on the backend, with the loss's
/// sums still on their way ([`grinnder_tensor::TrainOps::loss_value`] reads them); the loss through `source`
/// where it reads labels itself.
#[allow(clippy::too_many_arguments)]
pub fn batch_step<B: Backend>(
    b: &B,
    model: &mut Model<B>,
    ds: &Dataset,
    batch: &MiniBatch,
    graphs: &[Graph<B>],
    x: B::Mat,
    epoch: u64,
    source: Option<&dyn FeatureSource<B>>,
) -> B::Loss {
    let layers = model.layers();
    assert_eq!(graphs.len(), layers, "one block per layer");
    let mut inputs = vec![x];
    let mut tapes = Vec::with_capacity(layers);
    // GCNII's initial representation: layer 0 makes it for block 0's rows; a later block's
    // rows are a prefix of those (a block's first columns are its rows, and its columns the
    // block below's rows), so layer l reads x0's first rows
    let mut x0: Option<B::Mat> = None;
    for (l, g) in graphs.iter().enumerate() {
        debug_assert!(
            batch.blocks[l].col_ids[..g.rows] == batch.blocks[0].col_ids[..g.rows],
            "block {l}'s rows lead block 0's"
        );
        let x0_rows = x0.as_ref().filter(|_| l > 0).map(|x0| first_rows(b, x0, g.rows));
        let (y, tape, made) =
            model.layer_forward_initial(b, g, l, &inputs[l], None, x0_rows.as_ref(), true, epoch);
        x0 = made.or(x0);
        tapes.push(tape);
        inputs.push(y);
    }
    // x0's gradient: the later layers' parts summed over block 0's rows, for layer 0
    let mut dx0 = x0.as_ref().filter(|_| layers > 1).map(|x0| {
        let (n, c) = b.dims(x0);
        b.zeros(n, c)
    });
    let logits = inputs.pop().expect("the output layer's");
    let (n, c) = b.dims(&logits);
    let mut dy = b.zeros(n, c);
    let scale = 1.0 / batch.seeds.len().max(1) as f64;
    let mapped = source.and_then(|s| s.loss(b, &logits, &batch.seeds, scale, &mut dy));
    let loss = mapped.unwrap_or_else(|| {
        let labels: Vec<i32> = batch.seeds.iter().map(|&v| ds.labels[v as usize]).collect();
        let rows: Vec<u32> = (0..batch.seeds.len() as u32).collect();
        b.cross_entropy_later(&logits, &labels, &rows, scale, &mut dy)
    });
    drop(logits);
    for l in (0..layers).rev() {
        let tape = tapes.pop().expect("one per layer");
        let x = inputs.pop().expect("one per layer");
        let g = &graphs[l];
        // (x0's rows again rather than kept from the forward: one copy alive at a time)
        let x0_rows = x0.as_ref().filter(|_| l > 0).map(|x0| first_rows(b, x0, g.rows));
        let dx = match (x0_rows, dx0.as_mut()) {
            (Some(x0_rows), Some(sum)) => {
                // a reader's part of x0's gradient, added into the sum's first rows
                let mut part = b.zeros(g.rows, b.dims(&x0_rows).1);
                let initial = (Some(&x0_rows), Some(&mut part));
                let dx = model.layer_backward_initial(b, g, l, &x, None, initial, tape, &dy, l > 0);
                b.scatter_add_rows(&part, 0, TensorRows::Range(0, g.rows), sum);
                dx
            }
            (None, sum) if l == 0 => {
                model.layer_backward_initial(b, g, 0, &x, None, (None, sum), tape, &dy, false)
            }
            _ => model.layer_backward(b, g, l, &x, None, tape, &dy, l > 0, None),
        };
        if let Some(dx) = dx {
            dy = dx;
        }
    }
    loss
}

/// The first `n` rows of `m`.
fn first_rows<B: Backend>(b: &B, m: &B::Mat, n: usize) -> B::Mat {
    let mut out = b.output(n, b.dims(m).1);
    b.gather_rows(m, TensorRows::Range(0, n), &mut out, 0);
    out
}

/// The exact evaluation of a model trained by batches: the tiered executor's full-neighbourhood
/// forward over `parts` partitions (over `dist`'s ranks where given, counts summed over them),
/// set up at its first use (none with `eval_every` 0), with the trained weights copied in.
pub(crate) struct ExactEval<'a, B: Backend> {
    b: &'a B,
    ds: &'a Dataset,
    model: grinnder_nn::ModelConfig,
    norm: FeaturePrep,
    tc: TieredConfig,
    dist: Option<crate::tiered::DistConfig<'a, B>>,
    ex: Option<Executor<'a, B>>,
}

impl<'a, B: Backend> ExactEval<'a, B> {
    pub(crate) fn new(
        b: &'a B,
        ds: &'a Dataset,
        cfg: &TrainConfig,
        parts: usize,
        dist: Option<crate::tiered::DistConfig<'a, B>>,
    ) -> Self {
        ExactEval {
            b,
            ds,
            model: grinnder_nn::ModelConfig { input_dropout: 0.0, ..cfg.model.clone() },
            norm: cfg.features(),
            tc: TieredConfig::in_ram(parts.max(1), grinnder_partition::Method::Contiguous),
            dist,
            ex: None,
        }
    }

    /// Correct predictions on train, valid and test with `model`'s weights.
    pub(crate) fn run(&mut self, model: &mut Model<B>, epoch: u64) -> Result<[usize; 3], TrainError> {
        self.run_with(model, |ex| {
            let mut c = ex.evaluate(epoch)?.map(|n| n as u64);
            ex.reduce(&mut c);
            Ok(c.map(|n| n as usize))
        })
    }

    /// `pass` on the executor (set up at its first use) holding `model`'s weights.
    fn run_with<R>(
        &mut self,
        model: &mut Model<B>,
        pass: impl FnOnce(&mut Executor<'a, B>) -> Result<R, TrainError>,
    ) -> Result<R, TrainError> {
        if self.ex.is_none() {
            self.ex = Some(Executor::new_dist(self.b, self.ds, &self.model, self.norm, &self.tc, self.dist)?);
        }
        let ex = self.ex.as_mut().expect("set up");
        for (dst, src) in ex.model.state_mut().into_iter().zip(model.state_mut()) {
            self.b.copy(&src.value, &mut dst.value);
        }
        pass(ex)
    }

    /// [`crate::mode::Engine::predict`] with `model`'s weights.
    pub(crate) fn predict(
        &mut self,
        model: &mut Model<B>,
        upto: usize,
        wanted: &dyn Fn(u32) -> bool,
        emit: &mut crate::tiered::Emit<'_>,
    ) -> Result<Option<PhaseStats>, TrainError> {
        self.run_with(model, |ex| {
            ex.predict(upto, wanted, emit)?;
            Ok(Some(ex.take_stats()))
        })
    }
}

/// The graph the samplers read, copied onto huge pages when it is large (its arrays over 64
/// MiB; [`grinnder_graph::Csr::on_huge_pages`]): their reads land anywhere in it, and over a
/// file mapping's 4 KB pages most miss the TLB (on a 2-core VM, one thread sampled a
/// products-like batch in 37–41 ms instead of 48–63). `None`: sample `g` itself (small, or no
/// memory for a copy: it is made only where the system reports at least twice its size
/// available).
pub fn sampling_graph(g: &grinnder_graph::Csr) -> Option<grinnder_graph::Csr> {
    let bytes = (g.num_nodes() + 1) * 8 + g.num_edges() * 4;
    if bytes < 64 << 20 {
        return None;
    }
    if available_memory().is_none_or(|free| free < 2 * bytes as u64) {
        tracing::info!("the samplers read the graph in place: too little free memory for a copy");
        return None;
    }
    g.on_huge_pages()
        .inspect_err(|e| tracing::warn!("the samplers read the graph in place: no memory for a copy ({e})"))
        .ok()
}

/// Bytes of memory the system says are available (Linux: `MemAvailable`); `None` elsewhere.
fn available_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Sampling threads when none are asked for: half the worker threads, one to eight.
pub fn default_loader_threads() -> usize {
    (rayon::current_num_threads() / 2).clamp(1, 8)
}

/// The training nodes of epoch `epoch` in batches: a seeded shuffle (the same on any machine).
pub fn batches(train: &[u32], batch_size: usize, seed: u64, epoch: u64) -> Vec<Vec<u32>> {
    let mut order: Vec<u32> = train.to_vec();
    order.sort_by_key(|&v| hash_key(&[seed, epoch, 0xBA7C, v as u64]));
    order.chunks(batch_size.max(1)).map(<[u32]>::to_vec).collect()
}

/// Where a mini-batch trainer's input rows come from.
enum Rows<'a, B: Backend> {
    Host(HostFeatures<'a>),
    Given(&'a dyn FeatureSource<B>),
}

/// [`crate::Mode::MiniBatch`]: the optimizer steps once per batch; evaluation is exact
/// full-graph inference.
pub(crate) struct MiniBatches<'a, B: Backend> {
    b: &'a B,
    ds: &'a Dataset,
    mb: MiniBatchConfig,
    seed: u64,
    model: Model<B>,
    rows: Rows<'a, B>,
    neighbor: NeighborSampler,
    khop: KHopSampler,
    /// Staging blocks (page-locked on a GPU: kept from epoch to epoch), one per sampling
    /// thread and two for the batch uploading and the next; the threads block for one beyond.
    staging: Staging<B>,
    workers: usize,
    /// The graph on huge pages where it is large ([`sampling_graph`]).
    huge: Option<grinnder_graph::Csr>,
    evaluator: ExactEval<'a, B>,
}

impl<'a, B: Backend> MiniBatches<'a, B> {
    pub(crate) fn new(
        b: &'a B,
        ds: &'a Dataset,
        cfg: &TrainConfig,
        mb: MiniBatchConfig,
        features: Option<&'a dyn FeatureSource<B>>,
    ) -> Result<Self, TrainError> {
        if mb.sampler == Sampler::Neighbor && mb.fanouts.len() != cfg.model.layers {
            return Err(TrainError::Config(format!(
                "{} fanouts for {} layers: give one per layer (-1: all neighbours)",
                mb.fanouts.len(),
                cfg.model.layers
            )));
        }
        if mb.fanouts.is_empty() {
            return Err(TrainError::Config("k-hop sampling needs at least one hop".into()));
        }
        // a device's uploads overlap the compute when the sampling threads stage the rows; on
        // the CPU staging would only add a copy
        let rows = match features {
            Some(f) => Rows::Given(f),
            None if b.device_memory().is_some() => Rows::Host(HostFeatures::new(ds, cfg.features()).staged()),
            None => Rows::Host(HostFeatures::new(ds, cfg.features())),
        };
        let model = Model::init(b, cfg.model.clone(), ds.features.dim, ds.num_classes as usize);
        let workers = mb.loader_threads.unwrap_or_else(default_loader_threads).max(1);
        let me = MiniBatches {
            b,
            ds,
            seed: cfg.model.seed,
            model,
            neighbor: NeighborSampler::new(mb.fanouts.clone(), cfg.model.seed),
            khop: KHopSampler::new(mb.fanouts.clone(), cfg.model.seed),
            staging: Staging::<B>::new(workers + 2),
            workers,
            huge: sampling_graph(&ds.graph),
            evaluator: ExactEval::new(b, ds, cfg, mb.eval_parts, None),
            rows,
            mb,
        };
        tracing::info!("mini-batch input rows: {}", me.rows.source().describe());
        Ok(me)
    }
}

impl<B: Backend> Rows<'_, B> {
    fn source(&self) -> &dyn FeatureSource<B> {
        match self {
            Rows::Host(h) => h,
            Rows::Given(f) => *f,
        }
    }
}

impl<B: Backend> crate::mode::Engine<B> for MiniBatches<'_, B> {
    // stays whole: one epoch's pipeline (sampling threads, a feeder, this thread's compute)
    // shares its channels and staging blocks within one thread scope; split, every part would
    // take them all as arguments
    fn train_epoch(
        &mut self,
        opt: &mut Optimizer,
        epoch: u64,
    ) -> Result<(f64, Option<PhaseStats>), TrainError> {
        let features = self.rows.source();
        let (b, ds, mb, model) = (self.b, self.ds, &self.mb, &mut self.model);
        let (neighbor, khop, staging, workers) = (&self.neighbor, &self.khop, &self.staging, self.workers);
        let graph = self.huge.as_ref().unwrap_or(&ds.graph);
        let layers = model.config.layers;
        let aggregation = model.aggregation();
        let elem = std::mem::size_of::<B::T>() as u64;
        let seed = self.seed;
        let mut loss = 0.0;
        let mut st = PhaseStats { sample_s: Some(0.0), ..Default::default() };
        let mut all = batches(&ds.splits.train, mb.batch_size, seed, epoch);
        all.truncate(mb.max_batches.unwrap_or(usize::MAX));
        st.batches = Some(all.len());
        // sampling threads run ahead of the backend by up to two batches each (sampling, the
        // blocks' graphs on the backend, staged rows); batch k comes from thread k mod n, taken in order, so the
        // batches and their order do not depend on n; a feeder thread starts each batch's rows
        // loading (below); compute stays on this thread
        let pb = progress::counter(all.len() as u64, &format!("epoch {epoch}"), "batches");
        let stager = features.stager();
        staging.reset();
        std::thread::scope(|s| {
            let _close = CloseOnDrop(staging);
            let mut rxs = Vec::with_capacity(workers);
            for w in 0..workers {
                let (tx, rx) = std::sync::mpsc::sync_channel(2);
                rxs.push(rx);
                let all = &all;
                s.spawn(move || {
                    let mut scratch = Scratch::default();
                    for (k, seeds) in all.iter().enumerate().skip(w).step_by(workers) {
                        let t = Instant::now();
                        let key = hash_key(&[epoch, k as u64]);
                        let batch = match mb.sampler {
                            Sampler::Neighbor => neighbor.sample_with(graph, seeds, key, &mut scratch),
                            Sampler::KHop => khop
                                .sample_with(graph, seeds, key, &mut scratch)
                                .into_batch(&ds.graph, layers),
                        };
                        // the blocks' graphs go to the backend from here, beside the compute
                        let graphs: Vec<Graph<B>> = batch
                            .blocks
                            .iter()
                            .map(|blk| block_graph_ahead(b, ds, aggregation, blk))
                            .collect();
                        let staged = stager.and_then(|f| {
                            let (ids, d) = (batch.input_nodes(), f.dim());
                            let mut h = staging.take(b, k, ids.len(), d)?;
                            f.write_rows(Some(ids), &mut b.host_block_mut(&mut h)[..ids.len() * d]);
                            f.staged_batches.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            Some(h)
                        });
                        if tx
                            .send(Sampled { batch, graphs, staged, secs: t.elapsed().as_secs_f64() })
                            .is_err()
                        {
                            break;
                        }
                    }
                });
            }
            // the batches in order, each with its rows loading where they can: a feeder thread
            // starts a batch's upload (its block staged by a sampling thread, which goes back:
            // its next write waits for the copy) or the source's own gather as soon as the batch
            // is sampled, beside the compute of the ones before; one batch waits in the channel
            // and the feeder prepares the next, so that the second stream's copies or gathers
            // follow one another without a gap (on one H200, products-like zero-copy: with the
            // feeder handing over one batch at a time, each gather was queued ≈ 2.8 ms into the
            // step before, and the steps took about the gather plus that gap); with the host
            // up to two steps ahead of the device (below), up to five batches' rows are on the
            // device (counted by `--gpu-mem`)
            let (ready_tx, ready) = std::sync::mpsc::sync_channel::<(Sampled<B>, Option<B::Arriving>)>(1);
            let n = all.len();
            s.spawn(move || {
                for k in 0..n {
                    let Ok(mut next) = rxs[k % workers].recv() else { break };
                    let ids = next.batch.input_nodes();
                    let x = if stager.is_none() {
                        features.start(b, ids)
                    } else {
                        // every batch gives its turn back, with its block or without one
                        let h = next.staged.take();
                        let x = h.as_ref().map(|h| b.upload_host_rows(h, ids.len()));
                        staging.give(h);
                        x
                    };
                    if ready_tx.send((next, x)).is_err() {
                        break;
                    }
                }
            });
            // this thread queues each step without waiting for the device to finish the one
            // before: a batch's loss is read once the next batch's step is queued, so the host
            // stays at most about two steps ahead, and the time it spends queueing (tens of
            // kernels and library calls per step) overlaps the device's work
            let mut last: Option<B::Loss> = None;
            let read = |l: B::Loss, sum: &mut f64| {
                *sum += b.loss_value(l).0;
                pb.inc(1);
            };
            loop {
                let t = Instant::now();
                let Ok((Sampled { batch, graphs, secs, .. }, x)) = ready.recv() else { break };
                *st.batch_wait_s.get_or_insert(0.0) += t.elapsed().as_secs_f64();
                *st.sample_s.as_mut().expect("set") += secs;
                // the rows of this batch (on their way where the source can); the input-row
                // and compute times are this thread's (compute: queueing the step and reading
                // the loss before it; the epoch's last waits for the backend to finish)
                let t = Instant::now();
                let x = match x {
                    Some(x) => b.arrived(x),
                    None => features.gather(b, batch.input_nodes()),
                };
                st.gather_s += t.elapsed().as_secs_f64();
                st.upload_bytes += (batch.input_nodes().len() * ds.features.dim) as u64 * elem;
                let t = Instant::now();
                model.zero_grad(b);
                let l = batch_step(b, model, ds, &batch, &graphs, x, epoch, Some(features));
                opt.step(b, model.params_mut());
                if let Some(l) = last.replace(l) {
                    read(l, &mut loss);
                }
                st.compute_s += t.elapsed().as_secs_f64();
            }
            let t = Instant::now();
            if let Some(l) = last.take() {
                read(l, &mut loss);
            }
            b.synchronize();
            st.compute_s += t.elapsed().as_secs_f64();
        });
        pb.finish_and_clear();
        Ok((loss, Some(st)))
    }

    fn correct(&mut self, epoch: u64) -> Result<[usize; 3], TrainError> {
        self.evaluator.run(&mut self.model, epoch)
    }

    fn predict(
        &mut self,
        upto: usize,
        wanted: &dyn Fn(u32) -> bool,
        emit: &mut crate::tiered::Emit<'_>,
    ) -> Result<Option<PhaseStats>, TrainError> {
        self.evaluator.predict(&mut self.model, upto, wanted, emit)
    }

    fn model(&mut self) -> &mut Model<B> {
        &mut self.model
    }
}
