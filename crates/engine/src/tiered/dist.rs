//! Partition-parallel execution (docs/design.md, partition-parallel training): the ranks'
//! configuration, the halo exchange (mirrors synchronised after a layer's outputs exist, halo
//! gradients flushed back to their owners before the layer below starts), and sums over ranks
//! in a fixed order.

use std::time::Instant;

use grinnder_dist::{from_bytes, to_bytes, Comm, Groups, Layout};
use grinnder_graph::Dataset;
use grinnder_nn::Model;
use grinnder_partition::{partition_cached, Partitioning};
use grinnder_tensor::{Backend, Mat, MatComm};
use serde::Serialize;

use crate::config::TrainError;

use super::settings::TieredConfig;

/// Partition-parallel execution (docs/design.md): this process is one of `comm`'s ranks and
/// computes a contiguous share of the partitions; rows of the others' partitions that its
/// partitions read (the halo) arrive by all-to-all before each layer, and halo gradients go back
/// to their owners, so the result equals one process computing every partition.
pub struct DistConfig<'c, B: Backend> {
    /// The ranks that share the partitions and exchange halo rows.
    pub comm: &'c dyn Comm,
    /// Consecutive ranks of `reduce` that share a server (which links the byte counters charge).
    pub ranks_per_server: usize,
    /// The ranks over which parameter gradients, losses and counts are summed, where they are
    /// more than `comm`'s: with flexible preloading, `comm` is a server's ranks training on its
    /// share of the graph (see [`Executor::new_share`]) and this every rank. `None`: `comm`.
    pub reduce: Option<&'c dyn Comm>,
    /// A transport between the backend's own matrices (NCCL between GPUs) over the same
    /// ranks: halo rows, halo gradients and parameter gradients then move device to device;
    /// `None`: through the host over `comm` and `reduce`.
    pub device: Option<DeviceComms<'c, B>>,
    /// The server hierarchy of `reduce`'s ranks (its `global` is those ranks): host sums are
    /// then taken within servers, among their heads and handed back down, so each server's sum
    /// crosses between servers once; `None`: every rank sends to every other.
    pub groups: Option<&'c Groups>,
}

impl<B: Backend> Clone for DistConfig<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<B: Backend> Copy for DistConfig<'_, B> {}

/// [`MatComm`]s over the ranks of [`DistConfig::comm`] and [`DistConfig::reduce`].
pub struct DeviceComms<'c, B: Backend> {
    pub comm: &'c dyn MatComm<B>,
    pub reduce: &'c dyn MatComm<B>,
}

impl<B: Backend> Clone for DeviceComms<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<B: Backend> Copy for DeviceComms<'_, B> {}

/// A [`MatComm`] through the host over a byte communicator: matrices are downloaded, sent as
/// bytes and uploaded; sums are added in rank order. For backends without a device transport,
/// and to run the executor's device path on the CPU (tests).
pub struct HostMats<'c>(pub &'c dyn Comm);

impl<B: Backend> MatComm<B> for HostMats<'_> {
    fn rank(&self) -> usize {
        self.0.rank()
    }

    fn size(&self) -> usize {
        self.0.size()
    }

    fn all_to_all(&self, b: &B, send: Vec<B::Mat>, recv_rows: &[usize], cols: usize) -> Vec<B::Mat> {
        let bytes = send.iter().map(|m| to_bytes(&b.download(m).data)).collect();
        let got = self.0.all_to_all(bytes);
        got.iter()
            .zip(recv_rows)
            .map(|(g, &r)| b.upload_owned(Mat::from_vec(r, cols, from_bytes(g))))
            .collect()
    }

    fn all_reduce_sum(&self, b: &B, mats: &mut [&mut B::Mat]) {
        sum_on_host(b, mats, |flat| grinnder_dist::all_reduce_sum(self.0, flat));
    }

    fn describe(&self) -> String {
        format!("{} (through the host)", self.0.describe())
    }
}

/// `mats` downloaded into one flat host vector, summed over the ranks by `sum`, and uploaded
/// back in place.
pub(super) fn sum_on_host<B: Backend>(b: &B, mats: &mut [&mut B::Mat], sum: impl FnOnce(&mut [B::T])) {
    let host: Vec<Mat<B::T>> = mats.iter().map(|m| b.download(m)).collect();
    let mut flat: Vec<B::T> = host.iter().flat_map(|m| m.data.iter().copied()).collect();
    sum(&mut flat);
    let mut at = 0;
    for (m, h) in mats.iter_mut().zip(host) {
        let n = h.data.len();
        **m = b.upload_owned(Mat::from_vec(h.rows, h.cols, flat[at..at + n].to_vec()));
        at += n;
    }
}

/// Charges `bytes` sent by rank `me` of `ranks` to every other rank to `stats`' reduction
/// counters, by link class.
pub(super) fn charge_reduce(stats: &mut CommStats, layout: Layout, me: usize, ranks: usize, bytes: u64) {
    for r in (0..ranks).filter(|&r| r != me) {
        *(if layout.same_server(me, r) {
            &mut stats.reduce_intra_bytes
        } else {
            &mut stats.reduce_inter_bytes
        }) += bytes;
    }
}

/// How a dataset given to the executor sits in the whole one: node ids there (dropout masks
/// are keyed by them), degrees there (normalisations as there) and the whole's training-node
/// count (the loss is a mean over it).
#[derive(Clone, Debug)]
pub struct SubgraphOf {
    pub ids: Vec<u32>,
    pub degree: Vec<u32>,
    pub n_train: usize,
    /// The whole's feature shift ([`feature_shift`]: a global minimum).
    pub feature_shift: f64,
}

/// Bytes this rank sent to ranks of its own server and of other servers, per phase, and the
/// time spent exchanging (partition-parallel runs).
#[derive(Clone, Debug, Default, PartialEq, Serialize, serde::Deserialize)]
pub struct CommStats {
    /// Halo rows before the layers (forward).
    pub halo_intra_bytes: u64,
    pub halo_inter_bytes: u64,
    /// Halo gradients back to their owners (backward).
    pub grad_intra_bytes: u64,
    pub grad_inter_bytes: u64,
    /// Parameter-gradient and metric reductions.
    pub reduce_intra_bytes: u64,
    pub reduce_inter_bytes: u64,
    pub comm_s: f64,
}

impl CommStats {
    pub(super) fn add(&mut self, o: &CommStats) {
        self.halo_intra_bytes += o.halo_intra_bytes;
        self.halo_inter_bytes += o.halo_inter_bytes;
        self.grad_intra_bytes += o.grad_intra_bytes;
        self.grad_inter_bytes += o.grad_inter_bytes;
        self.reduce_intra_bytes += o.reduce_intra_bytes;
        self.reduce_inter_bytes += o.reduce_inter_bytes;
        self.comm_s = self.comm_s.max(o.comm_s);
    }

    /// Inter-server bytes of every phase.
    pub fn inter_bytes(&self) -> u64 {
        self.halo_inter_bytes + self.grad_inter_bytes + self.reduce_inter_bytes
    }
}

/// What a rank needs to exchange halo rows.
pub(super) struct DistState<'a, B: Backend> {
    pub(super) comm: &'a dyn Comm,
    /// The server hierarchy of `reduce`'s ranks, if given ([`DistConfig::groups`]).
    pub(super) groups: Option<&'a Groups>,
    /// The device transport, if any ([`DistConfig::device`]).
    pub(super) device: Option<DeviceComms<'a, B>>,
    /// Where reductions go (`comm` unless a server trains on its own share).
    pub(super) reduce: &'a dyn Comm,
    /// Servers among `reduce`'s ranks; `comm`'s ranks share one server when `reduce` differs.
    pub(super) layout: Layout,
    /// The rank computing each partition.
    pub(super) owner: Vec<usize>,
    /// Remote partitions whose rows this rank's partitions read, with those rows (sorted, in
    /// the partition's numbering); the store holds them as that partition's blocks ("mirrors").
    pub(super) mirrors: Vec<(usize, Vec<u32>)>,
    /// Per rank: (partition computed here, the rows of it that rank mirrors), in its order.
    pub(super) sends: Vec<Vec<(usize, Vec<u32>)>>,
    pub(super) stats: CommStats,
}

/// Which phase a halo exchange is charged to.
#[derive(Clone, Copy)]
pub(super) enum Phase {
    Halo,
    Grad,
}

impl<'a, B: Backend> DistState<'a, B> {
    /// Charges `bytes[r]` sent to rank `r` to `phase`, by link class.
    pub(super) fn count(&mut self, bytes: impl Iterator<Item = u64>, phase: Phase) {
        let me = self.comm.rank();
        // halo exchanges within one server's ranks never leave it
        let server_only = !std::ptr::addr_eq(self.reduce, self.comm);
        for (r, n) in bytes.enumerate().filter(|(r, _)| *r != me) {
            let intra = server_only || self.layout.same_server(me, r);
            let (a, e) = match phase {
                Phase::Halo => (&mut self.stats.halo_intra_bytes, &mut self.stats.halo_inter_bytes),
                Phase::Grad => (&mut self.stats.grad_intra_bytes, &mut self.stats.grad_inter_bytes),
            };
            *(if intra { a } else { e }) += n;
        }
    }

    /// All-to-all of `send` among the ranks sharing the partitions, charging the bytes to `phase`.
    pub(super) fn exchange(&mut self, send: Vec<Vec<u8>>, phase: Phase) -> Vec<Vec<u8>> {
        let t = Instant::now();
        self.count(send.iter().map(|b| b.len() as u64), phase);
        let out = self.comm.all_to_all(send);
        self.stats.comm_s += t.elapsed().as_secs_f64();
        out
    }

    /// [`DistState::exchange`] of matrices over the device transport (`cols` columns; rank
    /// `r`'s with `recv_rows[r]` rows), queued behind the work before it; timed by the
    /// transport on the device's clock where it can (read in [`DistState::take_comm_seconds`]),
    /// else between device synchronisations.
    pub(super) fn exchange_mats(
        &mut self,
        b: &B,
        send: Vec<B::Mat>,
        recv_rows: &[usize],
        cols: usize,
        phase: Phase,
    ) -> Vec<B::Mat> {
        let device = self.device.expect("a device transport");
        let elem = std::mem::size_of::<B::T>() as u64;
        self.count(send.iter().map(|m| b.dims(m)).map(|(r, c)| (r * c) as u64 * elem), phase);
        let comm = device.comm;
        timed_on_host(b, comm, &mut self.stats, || comm.all_to_all(b, send, recv_rows, cols))
    }

    /// The device transports' own time since the last call, into the counters.
    pub(super) fn take_comm_seconds(&mut self) {
        if let Some(dev) = self.device {
            self.stats.comm_s += dev.comm.take_seconds();
            if !std::ptr::addr_eq(dev.comm, dev.reduce) {
                self.stats.comm_s += dev.reduce.take_seconds();
            }
        }
    }

    /// Element-wise sum over the ranks (the same bits on every rank).
    pub(super) fn all_reduce<T: grinnder_dist::Pod + std::ops::AddAssign>(&mut self, v: &mut [T]) {
        self.reducer().sum(v, &mut self.stats);
    }

    pub(super) fn reducer(&self) -> Reducer<'a> {
        Reducer { comm: self.reduce, layout: self.layout, groups: self.groups }
    }
}

/// How sums over the ranks are taken on the host: over `comm` in rank order, or through the
/// server hierarchy of the same ranks (`groups`: within servers, among their heads, back down).
/// Either way every rank gets the same bits.
#[derive(Clone, Copy)]
pub(crate) struct Reducer<'a> {
    pub comm: &'a dyn Comm,
    pub layout: Layout,
    pub groups: Option<&'a Groups>,
}

impl<'a> Reducer<'a> {
    /// Sums over every rank of `groups`, through its server hierarchy.
    pub fn over(groups: &'a Groups) -> Reducer<'a> {
        Reducer { comm: groups.global.as_ref(), layout: groups.layout, groups: Some(groups) }
    }

    /// The element-wise sum of `v` over the ranks, its bytes charged to `stats`' reduction
    /// counters by link class.
    pub fn sum<T: grinnder_dist::Pod + std::ops::AddAssign>(&self, v: &mut [T], stats: &mut CommStats) {
        let t = Instant::now();
        if let Some(g) = self.groups {
            let (intra, inter) = g.all_reduce_sum(v);
            stats.reduce_intra_bytes += intra;
            stats.reduce_inter_bytes += inter;
        } else {
            // `v` goes to every other rank
            let bytes = std::mem::size_of_val(v) as u64;
            charge_reduce(stats, self.layout, self.comm.rank(), self.comm.size(), bytes);
            grinnder_dist::all_reduce_sum(self.comm, v);
        }
        stats.comm_s += t.elapsed().as_secs_f64();
    }
}

/// Every parameter gradient of `model` summed over the ranks in one reduction (the same bits
/// on every rank, so parameters stay identical).
pub(crate) fn sum_gradients<B: Backend>(
    b: &B,
    model: &mut Model<B>,
    reducer: Reducer<'_>,
    stats: &mut CommStats,
) {
    let mut params = model.params_mut();
    let mut grads: Vec<&mut B::Mat> = params.iter_mut().map(|p| &mut p.grad).collect();
    sum_on_host(b, &mut grads, |flat| reducer.sum(flat, stats));
}

/// [`sum_gradients`] over a device transport: one grouped all-reduce of the gradients where
/// they are (every rank gets the same bits; the order of additions is the transport's).
pub(crate) fn sum_gradients_on<B: Backend>(
    b: &B,
    model: &mut Model<B>,
    comm: &dyn MatComm<B>,
    layout: Layout,
    stats: &mut CommStats,
) {
    let mut params = model.params_mut();
    let elem = std::mem::size_of::<B::T>() as u64;
    let bytes: u64 = params.iter().map(|p| b.dims(&p.grad)).map(|(r, c)| (r * c) as u64 * elem).sum();
    charge_reduce(stats, layout, comm.rank(), comm.size(), bytes);
    let mut grads: Vec<&mut B::Mat> = params.iter_mut().map(|p| &mut p.grad).collect();
    timed_on_host(b, comm, stats, || comm.all_reduce_sum(b, &mut grads));
}

/// `work`, a call of `comm`: timed between device synchronisations into `stats` unless the
/// transport keeps its own time (then it is only queued, ordered after the work before it).
pub(super) fn timed_on_host<B: Backend, R>(
    b: &B,
    comm: &dyn MatComm<B>,
    stats: &mut CommStats,
    work: impl FnOnce() -> R,
) -> R {
    if comm.keeps_time() {
        return work();
    }
    b.synchronize();
    let t = Instant::now();
    let r = work();
    b.synchronize();
    stats.comm_s += t.elapsed().as_secs_f64();
    r
}

/// The partitioning of `ds` by `tc` that every rank of `comm` uses: rank 0 partitions (through
/// the cache), the others take its owners — partitioners need not be deterministic across
/// processes — and a failure there reaches every rank.
pub fn shared_partitioning(
    comm: &dyn Comm,
    ds: &Dataset,
    tc: &TieredConfig,
) -> Result<Partitioning, TrainError> {
    let partition = || {
        // a directed graph is cut on its symmetric structure (a cut edge costs a halo row in
        // either direction); the partitions' graphs keep the directed in-edges
        let symmetric = ds.directed.then(|| ds.graph.symmetrised());
        let graph = symmetric.as_ref().unwrap_or(&ds.graph);
        let (p, outcome) = partition_cached(graph, tc.parts, tc.method, tc.partition_cache.as_deref())
            .map_err(|e| TrainError::Partition(e.to_string()))?;
        match &outcome {
            grinnder_partition::CacheOutcome::Hit(f) => {
                tracing::info!("partitioning read from the cache: {}", f.display())
            }
            grinnder_partition::CacheOutcome::Stored(f) => {
                tracing::info!("partitioning cached in {}", f.display())
            }
            // (partition_cached warns about a rebuilt or unwritable cache itself)
            grinnder_partition::CacheOutcome::Rebuilt(..) | grinnder_partition::CacheOutcome::Uncached => {}
        }
        Ok::<_, TrainError>(p)
    };
    if comm.size() == 1 {
        return partition();
    }
    let mine = if comm.rank() == 0 {
        match partition() {
            Ok(p) => to_bytes(&p.part),
            Err(e) => [u32::MAX.to_le_bytes().to_vec(), e.to_string().into_bytes()].concat(),
        }
    } else {
        Vec::new()
    };
    let all = comm.all_gather(&mine);
    let bytes = &all[0];
    if bytes.get(..4) == Some(&u32::MAX.to_le_bytes()[..]) {
        let msg = String::from_utf8_lossy(&bytes[4..]).into_owned();
        return Err(TrainError::Partition(format!("on rank 0: {msg}")));
    }
    assert_eq!(bytes.len(), ds.num_nodes() * 4, "rank 0 partitioned another graph");
    Ok(Partitioning::from_parts(tc.parts, from_bytes(bytes)))
}
