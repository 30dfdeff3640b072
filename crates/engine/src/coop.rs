//! Cooperative batching (GraNNDis; docs/design.md): mini-batches are formed per server, not per
//! rank. A server samples one batch of `batch_size × its ranks` seeds; every layer's output rows
//! are split over its ranks, each computing its rows from the rows the layer reads — its own,
//! and the others' through an all-to-all within the server — instead of every rank loading
//! every dependency of a batch of its own. Backward sends input-row gradients back to their
//! owners, which add them in rank order. Servers take the epoch's batches in turn; parameter
//! gradients are summed over every rank, so one step is the step of the union of the servers'
//! batches (with every neighbour: the full-graph gradients of those seeds).

use std::time::Instant;

use grinnder_dist::{from_bytes, to_bytes, Comm, Groups};
use grinnder_graph::rng::hash_key;
use grinnder_graph::sample::{Block, MiniBatch, NeighborSampler};
use grinnder_graph::Dataset;
use grinnder_nn::{Graph, Model, Optimizer};
use grinnder_tensor::{Backend, Mat};

use crate::config::{TrainConfig, TrainError};
use crate::features::{FeatureSource, HostFeatures};
use crate::minibatch::{batches, block_graph, ExactEval, MiniBatchConfig, Sampler};
use crate::tiered::{sum_gradients, CommStats, DistConfig, PhaseStats, Reducer};

/// Rows `n·r/size .. n·(r+1)/size`: rank `r`'s share of `n` rows.
fn share(n: usize, r: usize, size: usize) -> (usize, usize) {
    (n * r / size, n * (r + 1) / size)
}

/// The rank whose share of `n` rows holds row `j`.
fn owner(n: usize, j: usize, size: usize) -> usize {
    // the largest r with n·r/size ≤ j
    let mut r = (j * size / n.max(1)).min(size - 1);
    while r + 1 < size && share(n, r + 1, size).0 <= j {
        r += 1;
    }
    while share(n, r, size).0 > j {
        r -= 1;
    }
    r
}

/// Rows `a..b` of `blk` as a block of their own: columns `a..b` first (the rows themselves),
/// then the other columns they read, ascending; with each column's index in `blk`.
fn piece(blk: &Block, a: usize, b: usize) -> (Block, Vec<u32>) {
    let (lo, hi) = (blk.row_ptr[a] as usize, blk.row_ptr[b] as usize);
    let mut extra: Vec<u32> =
        blk.col_idx[lo..hi].iter().copied().filter(|&c| (c as usize) < a || (c as usize) >= b).collect();
    extra.sort_unstable();
    extra.dedup();
    let local = |c: u32| -> u32 {
        if (a..b).contains(&(c as usize)) {
            c - a as u32
        } else {
            (b - a + extra.binary_search(&c).expect("a column read")) as u32
        }
    };
    let cols: Vec<u32> = (a as u32..b as u32).chain(extra.iter().copied()).collect();
    let sub = Block {
        rows: b - a,
        cols: cols.len(),
        row_ptr: blk.row_ptr[a..=b].iter().map(|&p| p - lo as u64).collect(),
        col_idx: blk.col_idx[lo..hi].iter().map(|&c| local(c)).collect(),
        col_ids: cols.iter().map(|&c| blk.col_ids[c as usize]).collect(),
        full_degree: blk.full_degree[a..b].to_vec(),
    };
    (sub, cols)
}

/// All-to-all of `send` within the server, its bytes added to `bytes` and its time to `secs`.
fn exchange(comm: &dyn Comm, send: Vec<Vec<u8>>, bytes: &mut u64, secs: &mut f64) -> Vec<Vec<u8>> {
    let t = Instant::now();
    let me = comm.rank();
    *bytes += send.iter().enumerate().filter(|(r, _)| *r != me).map(|(_, b)| b.len() as u64).sum::<u64>();
    let out = comm.all_to_all(send);
    *secs += t.elapsed().as_secs_f64();
    out
}

/// One cooperative batch on this rank: forward and backward of its share of every layer's rows;
/// accumulates parameter gradients (not yet summed over ranks) of the loss summed over this
/// rank's seeds times `scale`. Returns the loss sum and the correct count of its seeds.
// stays whole: forward and backward walk the same per-layer row shares in opposite order; one
// function keeps the exchange of each direction beside its inverse
#[allow(clippy::too_many_arguments)]
pub fn coop_step<B: Backend>(
    b: &B,
    model: &mut Model<B>,
    ds: &Dataset,
    batch: &MiniBatch,
    server: &dyn Comm,
    features: &dyn FeatureSource<B>,
    scale: f64,
    epoch: u64,
    stats: &mut CommStats,
) -> (f64, usize) {
    let (me, size) = (server.rank(), server.size());
    let aggregation = model.aggregation();
    let layers = model.layers();
    assert_eq!(batch.blocks.len(), layers, "one block per layer");
    // every rank's piece of every layer (each rank derives all of them: no requests travel)
    let rows: Vec<usize> = batch.blocks.iter().map(|blk| blk.rows).collect();
    let pieces: Vec<Vec<(Block, Vec<u32>)>> = batch
        .blocks
        .iter()
        .map(|blk| {
            (0..size)
                .map(|r| {
                    let (a, c) = share(blk.rows, r, size);
                    piece(blk, a, c)
                })
                .collect()
        })
        .collect();
    let graphs: Vec<Graph<B>> = (0..layers)
        .map(|l| {
            let blk = &pieces[l][me].0;
            block_graph(b, ds, aggregation, blk)
        })
        .collect();
    let dims: Vec<usize> = (0..=layers).map(|l| model.dim(l)).collect();
    // forward: layer l reads block l's columns = block l-1's rows (the features at l = 0)
    let mut inputs: Vec<B::Mat> = Vec::with_capacity(layers + 1);
    let mut tapes = Vec::with_capacity(layers);
    let mut own: Option<Mat<B::T>> = None;
    for l in 0..layers {
        let x = if l == 0 {
            features.gather(b, &pieces[0][me].0.col_ids)
        } else {
            let h = own.take().expect("the layer below's rows");
            let (a, _) = share(rows[l - 1], me, size);
            let w = dims[l];
            // to each rank, the rows of mine its piece reads, in its column order
            let send: Vec<Vec<u8>> = (0..size)
                .map(|p| {
                    let mut out: Vec<B::T> = Vec::new();
                    for &c in &pieces[l][p].1 {
                        if owner(rows[l - 1], c as usize, size) == me {
                            let r = c as usize - a;
                            out.extend_from_slice(&h.data[r * w..(r + 1) * w]);
                        }
                    }
                    to_bytes(&out)
                })
                .collect();
            let got = exchange(server, send, &mut stats.halo_intra_bytes, &mut stats.comm_s);
            let got: Vec<Vec<B::T>> = got.iter().map(|g| from_bytes(g)).collect();
            let cols = &pieces[l][me].1;
            let mut at = vec![0usize; size];
            let mut x = Vec::with_capacity(cols.len() * w);
            for &c in cols {
                let o = owner(rows[l - 1], c as usize, size);
                x.extend_from_slice(&got[o][at[o]..at[o] + w]);
                at[o] += w;
            }
            b.upload_owned(Mat::from_vec(cols.len(), w, x))
        };
        let (y, tape) = model.layer_forward(b, &graphs[l], l, &x, None, true, epoch);
        tapes.push(tape);
        inputs.push(x);
        if l + 1 < layers {
            own = Some(b.download(&y));
        } else {
            inputs.push(y);
        }
    }
    // the loss over this rank's seeds
    let logits = inputs.pop().expect("the output layer's");
    let (a, c) = share(rows[layers - 1], me, size);
    let labels: Vec<i32> = batch.seeds[a..c].iter().map(|&v| ds.labels[v as usize]).collect();
    let local: Vec<u32> = (0..(c - a) as u32).collect();
    let (n, k) = b.dims(&logits);
    let mut dy = b.zeros(n, k);
    let (loss, correct) = b.cross_entropy(&logits, &labels, &local, scale, &mut dy);
    drop(logits);
    // backward: input-row gradients go back to their owners, added in rank order
    for l in (0..layers).rev() {
        let tape = tapes.pop().expect("one per layer");
        let x = inputs.pop().expect("one per layer");
        let dx = model.layer_backward(b, &graphs[l], l, &x, None, tape, &dy, l > 0, None);
        let Some(dx) = dx else { break };
        let w = dims[l];
        let dx = b.download(&dx);
        let cols = &pieces[l][me].1;
        let mut send: Vec<Vec<B::T>> = vec![Vec::new(); size];
        for (i, &c) in cols.iter().enumerate() {
            send[owner(rows[l - 1], c as usize, size)].extend_from_slice(&dx.data[i * w..(i + 1) * w]);
        }
        let got = exchange(
            server,
            send.iter().map(|v| to_bytes(v)).collect(),
            &mut stats.grad_intra_bytes,
            &mut stats.comm_s,
        );
        let (a, c) = share(rows[l - 1], me, size);
        let mut acc = vec![<B::T as grinnder_tensor::Scalar>::of(0.0); (c - a) * w];
        for (p, bytes) in got.iter().enumerate() {
            let g: Vec<B::T> = from_bytes(bytes);
            let mut at = 0;
            for &col in &pieces[l][p].1 {
                if owner(rows[l - 1], col as usize, size) == me {
                    let r = col as usize - a;
                    for (t, &v) in acc[r * w..(r + 1) * w].iter_mut().zip(&g[at..at + w]) {
                        *t += v;
                    }
                    at += w;
                }
            }
        }
        dy = b.upload_owned(Mat::from_vec(c - a, w, acc));
    }
    (loss, correct)
}

/// [`crate::Mode::Cooperative`]: cooperative batches over `groups`' ranks, `mb.batch_size`
/// seeds per rank (a server's batch has that many per rank). Evaluation is the exact
/// full-graph forward, partition by partition over every rank.
pub(crate) struct Cooperative<'a, B: Backend> {
    b: &'a B,
    ds: &'a Dataset,
    mb: MiniBatchConfig,
    seed: u64,
    groups: &'a Groups,
    model: Model<B>,
    sampler: NeighborSampler,
    host: HostFeatures<'a>,
    features: Option<&'a dyn FeatureSource<B>>,
    evaluator: ExactEval<'a, B>,
}

impl<'a, B: Backend> Cooperative<'a, B> {
    pub(crate) fn new(
        b: &'a B,
        ds: &'a Dataset,
        cfg: &TrainConfig,
        mb: MiniBatchConfig,
        groups: &'a Groups,
        features: Option<&'a dyn FeatureSource<B>>,
    ) -> Result<Self, TrainError> {
        if mb.sampler != Sampler::Neighbor || mb.fanouts.len() != cfg.model.layers {
            return Err(TrainError::Config(
                "cooperative batches sample neighbours: one --fanout per layer, --sampler neighbor".into(),
            ));
        }
        let dist = DistConfig {
            comm: groups.global.as_ref(),
            ranks_per_server: groups.layout.ranks_per_server,
            reduce: None,
            device: None,
            groups: Some(groups),
        };
        Ok(Cooperative {
            b,
            ds,
            seed: cfg.model.seed,
            groups,
            model: Model::init(b, cfg.model.clone(), ds.features.dim, ds.num_classes as usize),
            sampler: NeighborSampler::new(mb.fanouts.clone(), cfg.model.seed),
            host: HostFeatures::new(ds, cfg.features()),
            features,
            evaluator: ExactEval::new(b, ds, cfg, groups.global.size(), Some(dist)),
            mb,
        })
    }
}

impl<B: Backend> crate::mode::Engine<B> for Cooperative<'_, B> {
    fn train_epoch(
        &mut self,
        opt: &mut Optimizer,
        epoch: u64,
    ) -> Result<(f64, Option<PhaseStats>), TrainError> {
        let (b, ds, mb, groups, sampler) = (self.b, self.ds, &self.mb, self.groups, &self.sampler);
        let features: &dyn FeatureSource<B> = self.features.unwrap_or(&self.host);
        let model = &mut self.model;
        let (servers, server) = (groups.layout.servers(), groups.layout.server(groups.global.rank()));
        let server_batch = mb.batch_size * groups.server.size();
        let mut st = PhaseStats { batches: Some(0), ..Default::default() };
        let mut comm = CommStats::default();
        let mut all = batches(&ds.splits.train, server_batch, self.seed, epoch);
        all.truncate(mb.max_batches.unwrap_or(usize::MAX));
        let mut loss = 0.0;
        // step i: server s takes batch i·S + s; the step is the union of those batches
        for first in (0..all.len()).step_by(servers) {
            let seeds: usize = all[first..(first + servers).min(all.len())].iter().map(Vec::len).sum();
            model.zero_grad(b);
            let k = first + server;
            if let Some(batch_seeds) = all.get(k) {
                let key = hash_key(&[epoch, k as u64]);
                let batch = sampler.sample(&ds.graph, batch_seeds, key);
                let t = Instant::now();
                let (l, _) = coop_step(
                    b,
                    model,
                    ds,
                    &batch,
                    groups.server.as_ref(),
                    features,
                    1.0 / seeds as f64,
                    epoch,
                    &mut comm,
                );
                st.compute_s += t.elapsed().as_secs_f64();
                loss += l;
                *st.batches.as_mut().expect("set") += 1;
            }
            // a server without a batch this step adds zeros
            sum_gradients(b, model, Reducer::over(groups), &mut comm);
            opt.step(b, model.params_mut());
        }
        let mut v = [loss];
        grinnder_dist::all_reduce_sum(groups.global.as_ref(), &mut v);
        // every rank's bytes, summed
        let mut c =
            [comm.halo_intra_bytes, comm.grad_intra_bytes, comm.reduce_intra_bytes, comm.reduce_inter_bytes];
        grinnder_dist::all_reduce_sum(groups.global.as_ref(), &mut c);
        st.comm = Some(CommStats {
            halo_intra_bytes: c[0],
            grad_intra_bytes: c[1],
            reduce_intra_bytes: c[2],
            reduce_inter_bytes: c[3],
            comm_s: comm.comm_s,
            ..Default::default()
        });
        // the loss summed over the epoch's seeds (run_epochs divides by the training count)
        Ok((v[0], Some(st)))
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
