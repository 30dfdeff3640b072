//! The exact layer-wise, partition-wise executor (DESIGN.md §3) over the tiered store (§4).
//!
//! Forward runs layer by layer and, inside a layer, partition by partition: gather the
//! partition's own and halo rows of the layer input from the store, run the layer (conv, norm,
//! ReLU, dropout, residual) on the partition's bipartite graph, write its own output rows
//! back. The output layer is not run in forward: backward starts there, recomputing it per
//! partition to get the logits, the loss (summed over the partition's training nodes, divided
//! by the global training count) and its gradient. Backward walks the layers down; for each
//! partition it re-gathers the layer input, recomputes the layer, runs its backward with the
//! output gradient from the store, adds the input gradient's own rows into the partition's
//! gradient block and scatter-adds its halo rows into their owners' blocks. A layer's
//! gradient blocks are complete before the layer below starts (the loop is the barrier).
//!
//! Invariants: the result does not depend on the partitioning: normalisations come from the
//! whole graph, dropout masks are keyed by original node ids, and every parameter gradient is
//! a sum over partitions of exact partial sums.

pub mod files;
pub mod store;

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::time::Instant;

use grinnder_dist::{from_bytes, to_bytes, Comm, Groups, Layout};
use grinnder_graph::{Csr, Dataset};
use grinnder_nn::graph::Adjacency;
use grinnder_nn::{Graph, Model, ModelConfig};
use grinnder_partition::{partition_cached, Method, PartitionedGraph, Partitioning};
use grinnder_tensor::{Backend, Mat, MatComm, Rows, Scalar, SparseMatrix};
use serde::Serialize;

pub use files::Faults;
pub use store::{BlockId, CacheMode, Kind, Store, StoreConfig, TierDtype, TierStats};

use crate::config::{FeatureNorm, TrainError};
use crate::features::{feature_rows, feature_shift};

/// How the executor partitions and where its blocks live.
#[derive(Clone, Debug)]
pub struct TieredConfig {
    pub parts: usize,
    pub method: Method,
    /// Partition cache directory (`None`: no cache).
    pub partition_cache: Option<PathBuf>,
    pub cache_mode: CacheMode,
    /// Host memory for the whole process; `None`: no limit, every block stays in RAM.
    pub host_mem: Option<u64>,
    pub storage_dir: Option<PathBuf>,
    pub tier_dtype: TierDtype,
    pub keep_storage: bool,
    /// Fault injection for tests (block-file writes failing with ENOSPC, reads with EIO).
    pub faults: Faults,
    /// The block cache size, overriding what the plan derives from `host_mem`.
    pub cache_bytes: Option<u64>,
    /// The backend's memory for the whole run (`--gpu-mem`): with it, the plan keeps the blocks
    /// that fit in the backend's memory (the GPU tier) and the rest in the host store.
    pub gpu_mem: Option<u64>,
    /// Bytes of blocks kept in the backend's memory, overriding what the plan derives from
    /// `gpu_mem` (tests: the CPU backend's "device" is host memory).
    pub device_cache_bytes: Option<u64>,
}

impl TieredConfig {
    /// Everything in RAM, `parts` partitions by `method`.
    pub fn in_ram(parts: usize, method: Method) -> TieredConfig {
        TieredConfig {
            parts,
            method,
            partition_cache: None,
            cache_mode: CacheMode::Auto,
            host_mem: None,
            storage_dir: None,
            tier_dtype: TierDtype::F32,
            keep_storage: false,
            faults: Faults::default(),
            cache_bytes: None,
            gpu_mem: None,
            device_cache_bytes: None,
        }
    }
}

/// Partition-parallel execution (DESIGN.md §6): this process is one of `comm`'s ranks and
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
fn sum_on_host<B: Backend>(b: &B, mats: &mut [&mut B::Mat], sum: impl FnOnce(&mut [B::T])) {
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
fn charge_reduce(stats: &mut CommStats, layout: Layout, me: usize, ranks: usize, bytes: u64) {
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
    fn add(&mut self, o: &CommStats) {
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
struct DistState<'a, B: Backend> {
    comm: &'a dyn Comm,
    /// The server hierarchy of `reduce`'s ranks, if given ([`DistConfig::groups`]).
    groups: Option<&'a Groups>,
    /// The device transport, if any ([`DistConfig::device`]).
    device: Option<DeviceComms<'a, B>>,
    /// Where reductions go (`comm` unless a server trains on its own share).
    reduce: &'a dyn Comm,
    /// Servers among `reduce`'s ranks; `comm`'s ranks share one server when `reduce` differs.
    layout: Layout,
    /// The rank computing each partition.
    owner: Vec<usize>,
    /// Remote partitions whose rows this rank's partitions read, with those rows (sorted, in
    /// the partition's numbering); the store holds them as that partition's blocks ("mirrors").
    mirrors: Vec<(usize, Vec<u32>)>,
    /// Per rank: (partition computed here, the rows of it that rank mirrors), in its order.
    sends: Vec<Vec<(usize, Vec<u32>)>>,
    stats: CommStats,
}

/// Which phase a halo exchange is charged to.
#[derive(Clone, Copy)]
enum Phase {
    Halo,
    Grad,
}

impl<'a, B: Backend> DistState<'a, B> {
    /// Charges `bytes[r]` sent to rank `r` to `phase`, by link class.
    fn count(&mut self, bytes: impl Iterator<Item = u64>, phase: Phase) {
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
    fn exchange(&mut self, send: Vec<Vec<u8>>, phase: Phase) -> Vec<Vec<u8>> {
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
    fn exchange_mats(
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
    fn take_comm_seconds(&mut self) {
        if let Some(dev) = self.device {
            self.stats.comm_s += dev.comm.take_seconds();
            if !std::ptr::addr_eq(dev.comm, dev.reduce) {
                self.stats.comm_s += dev.reduce.take_seconds();
            }
        }
    }

    /// Element-wise sum over the ranks (the same bits on every rank).
    fn all_reduce<T: grinnder_dist::Pod + std::ops::AddAssign>(&mut self, v: &mut [T]) {
        self.reducer().sum(v, &mut self.stats);
    }

    fn reducer(&self) -> Reducer<'a> {
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
fn timed_on_host<B: Backend, R>(
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
    #[serde(flatten)]
    pub tier: TierStats,
    /// Partition-parallel runs: bytes exchanged, summed over the ranks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub comm: Option<CommStats>,
}

/// How the memory plan divided the host budget.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Plan {
    /// Bytes resident outside the store (graph structures, model, process) when the plan was made.
    pub resident_bytes: u64,
    /// Largest per-partition working set (gathered inputs, layer temporaries) and, with a
    /// storage tier, two of the largest blocks (the one in use, which the store holds beyond
    /// its budget, and a block's file buffer while it is decoded).
    pub working_bytes: u64,
    /// The same on a device, counted as if every layer held six matrices of the widest layer
    /// over the columns: a GPU's kernels add temporaries the host count does not model (split-K
    /// partials, cuSPARSE buffers, the next partition's upload), and budgets there are checked
    /// at every allocation.
    pub device_working_bytes: u64,
    pub margin_bytes: u64,
    /// Host cache budget for blocks (`None`: unlimited).
    pub cache_bytes: Option<u64>,
    pub mode: CacheMode,
    /// Whole-run activation and gradient bytes (what the cache would need to hold everything).
    pub block_bytes: u64,
    /// The GPU tier (with `gpu_mem`): its block budget and what was placed there.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device: Option<DevicePlan>,
}

/// What the plan keeps in the backend's memory.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DevicePlan {
    /// Backend bytes in use before blocks (partition graphs, parameters, optimizer state).
    pub resident_bytes: u64,
    /// Largest per-partition working set in the backend's memory.
    pub working_bytes: u64,
    pub margin_bytes: u64,
    /// Budget for blocks.
    pub cache_bytes: u64,
    /// Blocks placed there, and their bytes; every other block lives in the host store.
    pub blocks: usize,
    pub placed_bytes: u64,
}

/// A layer's gathered inputs: its input rows (`None`: the layer reads `pre` instead) and the
/// precomputed aggregation.
struct Inputs<B: Backend> {
    x: Option<Own<B>>,
    pre: Option<Own<B>>,
}

impl<B: Backend> Inputs<B> {
    fn x(&self) -> &B::Mat {
        self.x.as_deref().or(self.pre.as_deref()).expect("an input")
    }
}

/// A partition's own rows of a block, for reading: the device block itself, lent without a
/// copy (the executor takes it back with [`Executor::give_back`] before anything else reads
/// the block), or a gathered copy.
enum Own<B: Backend> {
    Lent(BlockId, B::Mat),
    Copy(B::Mat),
}

impl<B: Backend> std::ops::Deref for Own<B> {
    type Target = B::Mat;

    fn deref(&self) -> &B::Mat {
        match self {
            Own::Lent(_, m) | Own::Copy(m) => m,
        }
    }
}

/// One partition as the executor sees it.
struct Part<B: Backend> {
    graph: Graph<B>,
    own: usize,
    /// (source partition, its rows) for the halo columns, in column order.
    fetch: Vec<(usize, Vec<u32>)>,
    labels: Vec<i32>,
    /// Local rows of the train, valid and test nodes.
    split_rows: [Vec<u32>; 3],
}

/// The executor: a model, the partitioned graph and the store.
pub struct Executor<'a, B: Backend> {
    b: &'a B,
    pub model: Model<B>,
    parts: Vec<Part<B>>,
    store: Store<B::T>,
    /// The GPU tier: blocks the plan placed in the backend's memory, and those present now.
    on_dev: HashSet<BlockId>,
    dev: HashMap<BlockId, B::Mat>,
    /// Fixed blocks (features, layer 0's aggregation) in the backend's host memory
    /// ([`Backend::HostBlock`]: page-locked on a GPU) instead of the store, when nothing bounds
    /// host memory (`pin_fixed`).
    pinned: HashMap<BlockId, B::HostBlock>,
    pin_fixed: bool,
    /// The first error of a pass. The blocks may be incomplete after one (a block lent to the
    /// computation is not back in the GPU tier, a write may be half done), so every later pass
    /// refuses with it ([`Executor::guarded`]).
    stopped: Option<String>,
    /// Whole pinned blocks of the next partition, uploaded while this one computes
    /// ([`Executor::prefetch`]); taken by the gather that reads them.
    ahead: Vec<(BlockId, B::Arriving)>,
    /// Layer 0 runs inside layer 1's transform (see [`Executor::fused`]).
    fused: bool,
    /// `TieredConfig::gpu_mem`, and whether the first epoch's peak has refined the placement.
    gpu_mem: Option<u64>,
    calibrated: bool,
    n_train: usize,
    /// Layer 0 runs on `Â x` precomputed per partition (GCN, SAGE without input dropout; see
    /// `Executor::new_dist`).
    pre: bool,
    pub partitioning: Partitioning,
    pub plan: Plan,
    stats: PhaseStats,
    /// The partitions this rank computes (all of them in one process).
    local: std::ops::Range<usize>,
    dist: Option<DistState<'a, B>>,
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
        let (p, outcome) = partition_cached(&ds.graph, tc.parts, tc.method, tc.partition_cache.as_deref())
            .map_err(|e| TrainError::Partition(e.to_string()))?;
        tracing::debug!("partitioning: {outcome:?}");
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

fn io_err(e: std::io::Error) -> TrainError {
    TrainError::Storage(e.to_string())
}

impl<'a, B: Backend> Executor<'a, B> {
    /// Partitions `ds`, builds the partition graphs, plans memory and fills the store with
    /// the input features (and their first aggregation where the model allows).
    pub fn new(
        b: &'a B,
        ds: &Dataset,
        model_cfg: &ModelConfig,
        feature_norm: FeatureNorm,
        tc: &TieredConfig,
    ) -> Result<Self, TrainError> {
        Self::new_dist(b, ds, model_cfg, feature_norm, tc, None)
    }

    /// [`Executor::new`] as one rank of a partition-parallel run (`dist`; `None`: one process).
    pub fn new_dist(
        b: &'a B,
        ds: &Dataset,
        model_cfg: &ModelConfig,
        feature_norm: FeatureNorm,
        tc: &TieredConfig,
        dist: Option<DistConfig<'a, B>>,
    ) -> Result<Self, TrainError> {
        Self::new_share(b, ds, None, model_cfg, feature_norm, tc, dist)
    }

    /// [`Executor::new_dist`] where `ds` is a part of the whole (`sub`: a server's share).
    pub fn new_share(
        b: &'a B,
        ds: &Dataset,
        sub: Option<&SubgraphOf>,
        model_cfg: &ModelConfig,
        feature_norm: FeatureNorm,
        tc: &TieredConfig,
        dist: Option<DistConfig<'a, B>>,
    ) -> Result<Self, TrainError> {
        crate::config::check_dataset(ds)?;
        let (rank, ranks) = dist.map_or((0, 1), |d| (d.comm.rank(), d.comm.size()));
        if tc.parts < ranks {
            return Err(TrainError::Config(format!(
                "{} partitions for {ranks} ranks: every rank computes at least one (--parts {ranks} or more)",
                tc.parts
            )));
        }
        // contiguous shares: rank r computes partitions ⌈r·P/R⌉ .. ⌈(r+1)·P/R⌉
        let owner: Vec<usize> = (0..tc.parts).map(|p| p * ranks / tc.parts).collect();
        let local = owner.iter().position(|&o| o == rank).unwrap_or(0)
            ..owner.iter().rposition(|&o| o == rank).map_or(0, |i| i + 1);
        let model = Model::init(b, model_cfg.clone(), ds.features.dim, ds.num_classes as usize);
        let partitioning = match dist.filter(|_| ranks > 1) {
            None => shared_partitioning(&grinnder_dist::Solo, ds, tc)?,
            Some(d) => shared_partitioning(d.comm, ds, tc)?,
        };
        // the adjacency the model needs, with its whole-graph normalisation
        // (a server's share: the whole graph's degrees)
        let aggregation = model.aggregation();
        let (csr, vals): (Csr, Vec<f64>) = match sub {
            None => aggregation.adjacency(&ds.graph),
            Some(s) => aggregation.share_adjacency(&ds.graph, &s.degree),
        };
        // node ids of dropout keys: the whole graph's
        let key = |v: u32| sub.map_or(v, |s| s.ids[v as usize]);
        let mut pg = PartitionedGraph::build(&csr, &partitioning, &[&vals]);
        drop((csr, vals));
        // rows of other ranks' partitions read here: mirrored as compact blocks, and the fetch
        // lists of this rank's partitions renumbered into them
        let mut mirrors: std::collections::BTreeMap<usize, Vec<u32>> = Default::default();
        for q in local.clone() {
            for (s, idx) in &pg.partitions[q].fetch {
                if !local.contains(s) {
                    mirrors.entry(*s).or_default().extend(idx);
                }
            }
        }
        for rows in mirrors.values_mut() {
            rows.sort_unstable();
            rows.dedup();
        }
        for q in local.clone() {
            for (s, idx) in &mut pg.partitions[q].fetch {
                if let Some(rows) = mirrors.get(s) {
                    for i in idx.iter_mut() {
                        *i = rows.binary_search(i).expect("a mirrored row") as u32;
                    }
                }
            }
        }
        let mut splits_local: Vec<[Vec<u32>; 3]> = vec![Default::default(); tc.parts];
        for (k, (_, ids)) in ds.splits.named().iter().enumerate() {
            for &v in ids.iter() {
                let q = partitioning.part[v as usize] as usize;
                let local = partitioning.perm[v as usize] as u64 - partitioning.ptr[q];
                splits_local[q][k].push(local as u32);
            }
        }
        let mut parts = Vec::with_capacity(tc.parts);
        for (q, (g, split_rows)) in pg.partitions.into_iter().zip(splits_local).enumerate() {
            if !local.contains(&q) {
                // another rank's: only the rows mirrored here, as a block of that many rows
                let own = mirrors.get(&q).map_or(0, Vec::len);
                let graph = Graph { rows: 0, cols: 0, adjacencies: Vec::new(), ids: None };
                parts.push(Part {
                    graph,
                    own,
                    fetch: Vec::new(),
                    labels: Vec::new(),
                    split_rows: Default::default(),
                });
                continue;
            }
            let mut split_rows = split_rows;
            for s in &mut split_rows {
                s.sort_unstable();
            }
            let first = partitioning.ptr[q] as usize;
            let own_ids: Vec<u32> = partitioning.inv_perm[first..first + g.own].to_vec();
            let labels: Vec<i32> = own_ids.iter().map(|&v| ds.labels[v as usize]).collect();
            let own_ids: Vec<u32> = own_ids.into_iter().map(key).collect();
            let col_ids: Vec<u32> = own_ids
                .iter()
                .copied()
                .chain(g.halo.iter().map(|&h| key(partitioning.inv_perm[h as usize])))
                .collect();
            let cols = g.columns();
            let sm = SparseMatrix::new(g.own, cols, g.row_ptr, g.col_idx).with_ids(own_ids, col_ids.clone());
            let adj = Adjacency::new(b, &sm, &g.values[0]);
            drop(sm);
            let graph = Graph::single(g.own, cols, aggregation, adj, Some(col_ids));
            parts.push(Part { graph, own: g.own, fetch: g.fetch, labels, split_rows });
        }
        // the fixed input's aggregation is kept where it is no wider than layer 0's output
        // (aggregating the narrower side), or where layer 0 reads nothing else: then it
        // replaces the features (computed from the dataset's rows, no feature blocks) and
        // layer 0 needs no halo rows and no aggregation per epoch. Wider inputs of a layer that
        // also reads them (SAGE's root term) run layer 0 split (transform own rows, aggregate
        // the narrow result), which spares a second set of blocks as large as the features.
        let pre =
            model.precomputes_input() && (model.dim(0) <= model.dim(1) || !model.reads_input_beside_pre());
        let plan =
            make_plan(&model, &parts, tc, std::mem::size_of::<B::T>(), pre, crate::metrics::mapped_bytes(ds));
        if let (Some(h), None) = (tc.host_mem, tc.cache_bytes) {
            let need = plan.resident_bytes + plan.working_bytes + plan.margin_bytes;
            if need > h {
                return Err(TrainError::Memory(format!(
                    "--host-mem {:.1} MiB is too small: the process already holds {:.1} MiB (dataset, partition graphs, model), the largest partition's working set is {:.1} MiB and the margin {:.1} MiB; needs at least {} MiB (or more --parts, for a smaller working set)",
                    mib(h),
                    mib(plan.resident_bytes),
                    mib(plan.working_bytes),
                    mib(plan.margin_bytes),
                    mib(min_host_budget(plan.resident_bytes + plan.working_bytes)).ceil() as u64
                )));
            }
        }
        if let (Some(cache), None) = (plan.cache_bytes, &tc.storage_dir) {
            if cache < plan.block_bytes {
                return Err(TrainError::Storage(format!(
                    "the host cache holds {:.1} MiB of blocks (--host-mem less {:.1} MiB resident, a {:.1} MiB working set and a {:.1} MiB margin, or --block-cache), but the blocks need {:.1} MiB: give a --storage-dir to spill to, or more --host-mem",
                    mib(cache),
                    mib(plan.resident_bytes),
                    mib(plan.working_bytes),
                    mib(plan.margin_bytes),
                    mib(plan.block_bytes)
                )));
            }
        }
        if let (Some(cache), Some(dir)) = (plan.cache_bytes, &tc.storage_dir) {
            let spill = plan.block_bytes.saturating_sub(cache);
            let free = files::free_bytes(dir)
                .map_err(|e| TrainError::Storage(format!("storage directory {}: {e}", dir.display())))?;
            if free < spill {
                return Err(TrainError::Storage(format!(
                    "storage directory {} has {:.1} MiB free, but up to {:.1} MiB of blocks may spill there",
                    dir.display(),
                    mib(free),
                    mib(spill)
                )));
            }
        }
        let store_cfg = StoreConfig {
            budget: plan.cache_bytes,
            mode: plan.mode,
            dtype: tc.tier_dtype,
            faults: tc.faults,
        };
        // each store (each rank's too) makes a private directory of its own inside the given one
        let store = Store::new(store_cfg, tc.storage_dir.as_deref(), tc.keep_storage).map_err(io_err)?;
        let mut ex = Executor {
            b,
            model,
            parts,
            store,
            on_dev: HashSet::new(),
            dev: HashMap::new(),
            pinned: HashMap::new(),
            ahead: Vec::new(),
            pin_fixed: tc.host_mem.is_none() && tc.cache_bytes.is_none() && tc.tier_dtype == TierDtype::F32,
            stopped: None,
            fused: false,
            gpu_mem: tc.gpu_mem.filter(|_| tc.device_cache_bytes.is_none()),
            calibrated: false,
            n_train: sub.map_or(ds.splits.train.len(), |s| s.n_train),
            pre,
            partitioning,
            plan,
            stats: PhaseStats::default(),
            local: local.clone(),
            dist: None,
        };
        if let Some(d) = dist {
            let layout = Layout { ranks, ranks_per_server: d.ranks_per_server.max(1) };
            let mirrors: Vec<(usize, Vec<u32>)> = mirrors.into_iter().collect();
            // tell each owner which of its rows this rank mirrors
            let mut ask = vec![Vec::<u32>::new(); ranks];
            for (s, rows) in &mirrors {
                let m = &mut ask[owner[*s]];
                m.extend([*s as u32, rows.len() as u32]);
                m.extend(rows);
            }
            let got = d.comm.all_to_all(ask.iter().map(|a| to_bytes(a)).collect());
            let sends = got
                .iter()
                .map(|b| {
                    let v: Vec<u32> = from_bytes(b);
                    let mut out = Vec::new();
                    let mut at = 0;
                    while at < v.len() {
                        let (p, n) = (v[at] as usize, v[at + 1] as usize);
                        out.push((p, v[at + 2..at + 2 + n].to_vec()));
                        at += 2 + n;
                    }
                    out
                })
                .collect();
            let reduce = d.reduce.unwrap_or(d.comm);
            let layout = Layout { ranks: reduce.size(), ..layout };
            ex.dist = Some(DistState {
                comm: d.comm,
                groups: d.groups,
                device: d.device,
                reduce,
                layout,
                owner,
                mirrors,
                sends,
                stats: CommStats::default(),
            });
        }
        ex.fused = ex.fusible();
        if tc.gpu_mem.is_some() || tc.device_cache_bytes.is_some() {
            ex.place_on_device(tc)?;
        }
        ex.load_features(ds, feature_norm, sub.map(|s| s.feature_shift))?;
        Ok(ex)
    }

    /// Every block an epoch makes, in the order of bus transfers saved per byte when kept on
    /// the device: hidden activations (written once, read up to three times), the split layers'
    /// narrow rows and their gradients (each read with halo rows), layer 0's aggregation and
    /// the features (read twice, never rewritten), then gradients (written once, read once);
    /// with each block's bytes at full precision.
    fn block_list(&self) -> Vec<(BlockId, u64)> {
        let elem = std::mem::size_of::<B::T>() as u64;
        let mut out = Vec::new();
        for (kind, layer, d) in block_kinds(&self.model, self.pre, self.fused) {
            for (part, p) in self.parts.iter().enumerate() {
                out.push((BlockId { kind, layer, part }, p.own as u64 * d as u64 * elem));
            }
        }
        out
    }

    /// Whether the input features are read after setup: not where layer 0 reads only its
    /// precomputed aggregation (no feature block is made).
    fn keeps_features(&self) -> bool {
        keeps_features(&self.model, self.pre)
    }

    /// Whether layer 0 runs inside layer 1's transform ([`Executor::fusible`], unless the GPU
    /// tier holds every block without it).
    pub fn fused(&self) -> bool {
        self.fused
    }

    /// Whether layer 0 can run inside layer 1's transform, partition by partition: layer 0 reads
    /// only its precomputed aggregation (no halo rows, no input gradient) and layer 1 runs split
    /// reading nothing of its input but its own rows (GCN). Layer 1's input is then never
    /// stored: the forward makes it where the transform reads it; the backward remakes it (layer
    /// 0 again: one GEMM on rows read for layer 0's weight gradient anyway) where layer 1's
    /// input gradient is made, and runs layer 0's backward right there. Neither that activation
    /// nor its gradient becomes a block.
    fn fusible(&self) -> bool {
        fusible(&self.model, self.pre)
    }

    /// Whether a block is written once, before the first epoch, and only read after: the input
    /// features and layer 0's aggregation.
    fn fixed(id: BlockId) -> bool {
        id.kind == Kind::Pre || (id.kind == Kind::Act && id.layer == 0)
    }

    /// Keeps a host block: a fixed one in the backend's host memory where the plan allows
    /// (`pin_fixed`), everything else in the store.
    fn keep_host(&mut self, id: BlockId, mut m: Mat<B::T>) -> Result<(), TrainError> {
        if self.pin_fixed && Self::fixed(id) {
            match self.b.host_block(m) {
                Ok(h) => {
                    self.pinned.insert(id, h);
                    return Ok(());
                }
                Err(back) => {
                    tracing::warn!(
                        "no page-locked host memory left: the remaining fixed blocks go to the store"
                    );
                    self.pin_fixed = false;
                    m = back;
                }
            }
        }
        self.store.put(id, m.rows, m.cols, m.data).map_err(io_err)
    }

    /// The GPU tier's share of the plan: what the backend holds now (graphs, parameters), the
    /// largest partition's working set and a margin come off `gpu_mem`; blocks are placed in
    /// [`Executor::block_list`]'s order while they fit.
    fn place_on_device(&mut self, tc: &TieredConfig) -> Result<(), TrainError> {
        let resident_bytes = self.b.device_memory().map_or(0, |m| m.used);
        let working_bytes = self.plan.device_working_bytes;
        let (cache_bytes, margin_bytes) = match (tc.device_cache_bytes, tc.gpu_mem) {
            (Some(c), _) => (c, 0),
            (None, Some(g)) => {
                let margin = g / MARGIN_DIVISOR;
                let need = resident_bytes + working_bytes + margin;
                if need > g {
                    return Err(TrainError::Memory(format!(
                        "--gpu-mem {:.2} GiB is too small: the partition graphs and parameters take {:.2} GiB, the largest partition's working set {:.2} GiB and the margin {:.2} GiB; use more --parts or a larger --gpu-mem",
                        g as f64 / GIB,
                        resident_bytes as f64 / GIB,
                        working_bytes as f64 / GIB,
                        margin as f64 / GIB
                    )));
                }
                (g - need, margin)
            }
            (None, None) => return Ok(()),
        };
        self.unfuse_if_fits(cache_bytes);
        let (blocks, placed_bytes) = self.place_while_fits(cache_bytes)?;
        let dp =
            DevicePlan { resident_bytes, working_bytes, margin_bytes, cache_bytes, blocks, placed_bytes };
        tracing::info!(
            "GPU tier: {} blocks ({:.2} GiB) of {:.2} GiB for blocks, beside {:.2} GiB resident and a {:.2} GiB working set",
            dp.blocks,
            placed_bytes as f64 / GIB,
            cache_bytes as f64 / GIB,
            resident_bytes as f64 / GIB,
            working_bytes as f64 / GIB
        );
        self.plan.device = Some(dp);
        Ok(())
    }

    /// After the first epoch, with its peak device memory measured (see
    /// [`Executor::refine_placement`]).
    fn place_more(&mut self) -> Result<(), TrainError> {
        if let Some(m) = self.b.device_memory() {
            self.refine_placement(m.peak)?;
        }
        Ok(())
    }

    /// Given the peak backend memory of an epoch, places the blocks that still fit under
    /// `gpu_mem` (less the margin) in the GPU tier — the plan's working-set estimate is an upper
    /// bound. Blocks that exist now (features, layer-0 aggregation) move over. Returns how many
    /// blocks joined.
    pub fn refine_placement(&mut self, peak: u64) -> Result<usize, TrainError> {
        let margin = self.plan.device.as_ref().map(|d| d.margin_bytes);
        let (Some(g), Some(margin)) = (self.gpu_mem, margin) else { return Ok(0) };
        let room = g.saturating_sub(margin).saturating_sub(peak);
        self.unfuse_if_fits(room);
        let moved = self.place_while_fits(room)?;
        if let Some(d) = self.plan.device.as_mut() {
            d.blocks += moved.0;
            d.placed_bytes += moved.1;
        }
        tracing::info!(
            "GPU tier after an epoch at peak {:.2} GiB of {:.2} GiB: {} more blocks ({:.2} GiB), {} in all",
            peak as f64 / GIB,
            g as f64 / GIB,
            moved.0,
            moved.1 as f64 / GIB,
            self.on_dev.len()
        );
        Ok(moved.0)
    }

    /// Ends the fusion of layer 0 into layer 1 when every block of the unfused epoch not yet in
    /// the GPU tier fits in `room` bytes there: recomputing layer 0 only pays where its output
    /// and gradient would not stay on the device (on products-like with every block on an
    /// H200, the fused epoch took 0.0615 s against 0.0533 s).
    fn unfuse_if_fits(&mut self, room: u64) {
        if !self.fused {
            return;
        }
        self.fused = false;
        let missing: u64 =
            self.block_list().iter().filter(|(id, _)| !self.on_dev.contains(id)).map(|(_, b)| b).sum();
        self.fused = missing > room;
    }

    /// Places the blocks not yet in the GPU tier, in [`Executor::block_list`]'s order, while
    /// `room` bytes last; blocks that exist in the host store move over. Returns the count and
    /// bytes placed.
    fn place_while_fits(&mut self, mut room: u64) -> Result<(usize, u64), TrainError> {
        let mut placed = (0usize, 0u64);
        self.ahead.clear();
        if !self.pinned.is_empty() {
            // device threads may still be reading host blocks that move below (zero-copy
            // gathers record no event on them)
            self.b.synchronize();
        }
        for (id, bytes) in self.block_list() {
            if self.on_dev.contains(&id) || bytes > room {
                continue;
            }
            if let Some(h) = self.pinned.remove(&id) {
                self.dev.insert(id, self.b.arrived(self.b.upload_host_block(&h)));
            } else if let Some((rows, cols)) = self.store.shape(id) {
                let mut data = vec![B::T::of(0.0); rows * cols];
                self.store.read_rows(id, None, &mut data).map_err(io_err)?;
                self.store.remove(id).map_err(io_err)?;
                self.dev.insert(id, self.b.upload_owned(Mat::from_vec(rows, cols, data)));
            }
            self.on_dev.insert(id);
            room -= bytes;
            placed = (placed.0 + 1, placed.1 + bytes);
        }
        Ok(placed)
    }

    /// Stores a host block where the plan put it.
    fn put_host(&mut self, id: BlockId, m: Mat<B::T>) -> Result<(), TrainError> {
        if self.on_dev.contains(&id) {
            self.stats.upload_bytes += (m.data.len() * std::mem::size_of::<B::T>()) as u64;
            self.dev.insert(id, self.b.upload_owned(m));
            return Ok(());
        }
        self.keep_host(id, m)
    }

    /// Drops a block from whichever tier holds it.
    fn remove(&mut self, id: BlockId) -> Result<(), TrainError> {
        if self.on_dev.contains(&id) {
            self.dev.remove(&id);
            return Ok(());
        }
        self.ahead.retain(|(a, _)| *a != id);
        if self.pinned.contains_key(&id) {
            // device threads may still be reading it (zero-copy gathers)
            self.b.synchronize();
            self.pinned.remove(&id);
            return Ok(());
        }
        self.store.remove(id).map_err(io_err)
    }

    fn load_features(
        &mut self,
        ds: &Dataset,
        norm: FeatureNorm,
        shift: Option<f64>,
    ) -> Result<(), TrainError> {
        let min = shift.unwrap_or_else(|| feature_shift(ds, norm));
        let d = ds.features.dim;
        // own partitions' rows, and the mirrored rows of the others' (every rank reads the
        // dataset: features never travel between ranks)
        let mut blocks: Vec<(usize, Vec<u32>)> = Vec::new();
        for q in self.local.clone() {
            let first = self.partitioning.ptr[q] as usize;
            blocks.push((q, self.partitioning.inv_perm[first..first + self.parts[q].own].to_vec()));
        }
        for (s, rows) in self.dist.as_ref().map_or(&[][..], |d| &d.mirrors[..]) {
            let first = self.partitioning.ptr[*s] as usize;
            blocks.push((*s, rows.iter().map(|&r| self.partitioning.inv_perm[first + r as usize]).collect()));
        }
        if self.pre && !self.keeps_features() {
            // layer 0 reads only `Â x`: each partition's rows (own, then halo) come straight
            // from the dataset and are aggregated; no feature block is made
            let ids_of: HashMap<usize, Vec<u32>> = blocks.into_iter().collect();
            for q in self.local.clone() {
                let part = &self.parts[q];
                let mut ids = ids_of[&q].clone();
                for (s, idx) in &part.fetch {
                    ids.extend(idx.iter().map(|&i| ids_of[s][i as usize]));
                }
                let rows = feature_rows::<B::T>(ds, norm, min, &ids);
                let x = self.b.upload_owned(Mat::from_vec(ids.len(), d, rows));
                self.put_aggregate(q, x)?;
            }
        } else {
            for (q, ids) in blocks {
                let rows = feature_rows::<B::T>(ds, norm, min, &ids);
                self.put_host(act(0, q), Mat::from_vec(ids.len(), d, rows))?;
            }
            if self.pre {
                // layer 0 reads the features beside their aggregation (SAGE's root term, a
                // residual)
                for q in self.local.clone() {
                    let x = self.gather(0, q, true)?;
                    self.put_aggregate(q, x)?;
                }
            }
        }
        self.store.take_stats();
        self.stats = PhaseStats::default();
        Ok(())
    }

    /// Layer 0's aggregation of partition `q` from its input rows `x` (own, then halo), kept as
    /// its `Pre` block.
    fn put_aggregate(&mut self, q: usize, x: B::Mat) -> Result<(), TrainError> {
        let agg = self.model.aggregate_input(self.b, &self.parts[q].graph, &x).expect("GCN or SAGE");
        drop(x);
        self.put(Kind::Pre, 0, q, agg)
    }

    /// The run's private storage directory (inside `--storage-dir`), `None` without storage.
    pub fn storage_dir(&self) -> Option<&std::path::Path> {
        self.store.storage_dir()
    }

    /// Block-file reads and writes attempted since the start (setup included).
    pub fn storage_ops(&self) -> (usize, usize) {
        self.store.storage_ops()
    }

    /// `(O_DIRECT, io_uring)` of the storage tier, `None` without one.
    pub fn store_direct_io(&self) -> Option<(bool, bool)> {
        self.store.direct_io()
    }

    /// Rows of the `kind` blocks of layer `l` for partition `q`: its own rows, then (with
    /// `halo`) its halo rows from their owners. Rows of host blocks are gathered into one host
    /// matrix and uploaded once; rows of device blocks are gathered on the device.
    fn gather_kind(&mut self, kind: Kind, l: usize, q: usize, halo: bool) -> Result<B::Mat, TrainError> {
        let t = Instant::now();
        let b = self.b;
        let d = match kind {
            Kind::Xw | Kind::GradXw => self.model.dim(l + 1),
            _ => self.model.dim(l),
        };
        let id = |p: usize| BlockId { kind, layer: l, part: p };
        let elem = std::mem::size_of::<B::T>() as u64;
        // a whole block of the backend's host memory alone: one copy (a DMA on a GPU), maybe
        // started ahead
        if !halo || self.parts[q].fetch.is_empty() {
            let (src, n) = (id(q), self.parts[q].own);
            let whole = self.pinned.get(&src).is_some_and(|h| b.host_block_dims(h).0 == n);
            let m = match self.ahead.iter().position(|(a, _)| *a == src) {
                Some(i) => Some(self.ahead.swap_remove(i).1),
                None if whole => self.upload_pinned(src),
                None => None,
            }
            .map(|m| b.arrived(m));
            if let Some(m) = m {
                self.stats.gather_s += t.elapsed().as_secs_f64();
                return Ok(m);
            }
        }
        let part = &self.parts[q];
        // (block, its rows) in output order
        let own = (id(q), Rows::Range(0, part.own));
        let sources: Vec<(BlockId, Rows<'_>)> = std::iter::once(own)
            .chain(part.fetch.iter().filter(|_| halo).map(|(s, idx)| (id(*s), Rows::Index(idx))))
            .collect();
        let rows: usize = sources.iter().map(|(_, r)| r.len()).sum();
        let host_sources: Vec<(BlockId, Rows<'_>)> = sources
            .iter()
            .filter(|(s, _)| !self.on_dev.contains(s) && !self.pinned.contains_key(s))
            .copied()
            .collect();
        let host_rows: usize = host_sources.iter().map(|(_, r)| r.len()).sum();
        // host rows straight into the backend's staging memory
        let staged = if host_sources.is_empty() {
            None
        } else {
            self.store.pin(host_sources.iter().map(|(s, _)| *s));
            let store = &mut self.store;
            let mut failed = None;
            let staged = b.upload_with(host_rows, d, &mut |buf: &mut [B::T]| {
                let mut at = 0;
                for (src, r) in &host_sources {
                    let idx = match r {
                        Rows::Index(i) => Some(*i),
                        Rows::Range(..) => None,
                    };
                    if let Err(e) = store.read_rows(*src, idx, &mut buf[at * d..(at + r.len()) * d]) {
                        failed.get_or_insert(e);
                        return;
                    }
                    at += r.len();
                }
            });
            self.store.unpin_all();
            if let Some(e) = failed {
                return Err(io_err(e));
            }
            self.stats.upload_bytes += (host_rows * d) as u64 * elem;
            Some(staged)
        };
        let m = match staged {
            Some(staged) if host_rows == rows => staged,
            staged => {
                let mut m = b.output(rows, d);
                let (mut at, mut at_host) = (0, 0);
                for (src, r) in &sources {
                    if self.on_dev.contains(src) {
                        let block = self
                            .dev
                            .get(src)
                            .unwrap_or_else(|| panic!("block {src:?} read before it was written"));
                        b.gather_rows(block, *r, &mut m, at);
                    } else if let Some(h) = self.pinned.get(src) {
                        b.gather_host_block(h, *r, &mut m, at);
                        self.stats.upload_bytes += (r.len() * d) as u64 * elem;
                    } else {
                        let staged = staged.as_ref().expect("host rows were staged");
                        b.gather_rows(staged, Rows::Range(at_host, r.len()), &mut m, at);
                        at_host += r.len();
                    }
                    at += r.len();
                }
                m
            }
        };
        self.stats.gather_s += t.elapsed().as_secs_f64();
        Ok(m)
    }

    /// Layer `l`'s input rows of partition `q`: own rows, then (with `halo`) the halo rows.
    fn gather(&mut self, l: usize, q: usize, halo: bool) -> Result<B::Mat, TrainError> {
        self.gather_kind(Kind::Act, l, q, halo)
    }

    /// The inputs of layer `l` on partition `q`: the gathered rows and, at layer 0, `Â x` (in
    /// the input's place too where the layer does not read its input beside it).
    fn inputs(&mut self, l: usize, q: usize) -> Result<Inputs<B>, TrainError> {
        if l == 0 && self.pre {
            let pre = self.own(Kind::Pre, 0, q)?;
            let x = if self.model.reads_input_beside_pre() { Some(self.own(Kind::Act, 0, q)?) } else { None };
            return Ok(Inputs { x, pre: Some(pre) });
        }
        Ok(Inputs { x: Some(Own::Copy(self.gather(l, q, true)?)), pre: None })
    }

    /// Partition `q`'s own rows of the `kind` block of layer `l` (see [`Own`]).
    fn own(&mut self, kind: Kind, l: usize, q: usize) -> Result<Own<B>, TrainError> {
        let id = BlockId { kind, layer: l, part: q };
        if self.on_dev.contains(&id) {
            if let Some(m) = self.dev.remove(&id) {
                return Ok(Own::Lent(id, m));
            }
        }
        Ok(Own::Copy(self.gather_kind(kind, l, q, false)?))
    }

    /// Returns a lent block to the device tier (a copy is dropped).
    fn give_back(&mut self, own: Option<Own<B>>) {
        if let Some(Own::Lent(id, m)) = own {
            self.dev.insert(id, m);
        }
    }

    /// [`Executor::give_back`] of both inputs.
    fn give_back_inputs(&mut self, inp: Inputs<B>) {
        self.give_back(inp.x);
        self.give_back(inp.pre);
    }

    /// Whether layer `l` runs split (transform on own rows, then aggregate the narrower rows).
    fn split(&self, l: usize) -> bool {
        self.model.split(l, l == 0 && self.pre)
    }

    /// Own input rows a split layer needs besides `h` (SAGE's root term).
    fn split_own_input(&mut self, l: usize, q: usize) -> Result<Option<Own<B>>, TrainError> {
        if self.model.split_reads_own_input(l) {
            Ok(Some(self.own(Kind::Act, l, q)?))
        } else {
            Ok(None)
        }
    }

    fn put(&mut self, kind: Kind, l: usize, q: usize, m: B::Mat) -> Result<(), TrainError> {
        let t = Instant::now();
        let id = BlockId { kind, layer: l, part: q };
        if self.on_dev.contains(&id) {
            self.dev.insert(id, m);
        } else {
            let (rows, cols) = self.b.dims(&m);
            let mut data = Vec::new();
            self.b.download_with(&m, &mut |h| data = par_to_vec(h));
            drop(m);
            self.stats.download_bytes += (data.len() * std::mem::size_of::<B::T>()) as u64;
            self.keep_host(id, Mat::from_vec(rows, cols, data))?;
        }
        self.stats.write_back_s += t.elapsed().as_secs_f64();
        Ok(())
    }

    /// Forward over all partitions: hidden layers into the store, and the output layer's
    /// transform when it runs split (its aggregation happens where the logits are used).
    fn forward_layers(&mut self, train: bool, epoch: u64) -> Result<(), TrainError> {
        let b = self.b;
        let layers = self.model.layers();
        for l in 0..layers {
            let top = l + 1 == layers;
            if l == 0 && self.fused {
                continue;
            }
            if self.split(l) {
                for q in self.local.clone() {
                    let x = if l == 1 && self.fused {
                        Own::Copy(self.layer0(q, train, epoch)?)
                    } else {
                        let x = self.own(Kind::Act, l, q)?;
                        self.prefetch(Kind::Act, l, q + 1, false, &[])?;
                        x
                    };
                    let t = Instant::now();
                    let h = self.model.split_transform(b, l, &x);
                    self.give_back(Some(x));
                    self.stats.compute_s += t.elapsed().as_secs_f64();
                    self.put(Kind::Xw, l, q, h)?;
                }
                self.sync_mirrors(Kind::Xw, l)?;
                if top {
                    break;
                }
                for q in self.local.clone() {
                    let h = self.gather_kind(Kind::Xw, l, q, true)?;
                    let x = self.split_own_input(l, q)?;
                    self.prefetch(Kind::Xw, l, q + 1, true, &[])?;
                    let t = Instant::now();
                    let (y, _) =
                        self.model.split_forward(b, &self.parts[q].graph, l, &h, x.as_deref(), train, epoch);
                    drop(h);
                    self.give_back(x);
                    self.stats.compute_s += t.elapsed().as_secs_f64();
                    self.put(Kind::Act, l + 1, q, y)?;
                }
                self.sync_act(l + 1)?;
                continue;
            }
            if top {
                break;
            }
            for q in self.local.clone() {
                let inp = self.inputs(l, q)?;
                self.prefetch(Kind::Act, l, q + 1, !(l == 0 && self.pre), &[])?;
                let t = Instant::now();
                let g = &self.parts[q].graph;
                let (y, tape) = self.model.layer_forward(b, g, l, inp.x(), inp.pre.as_deref(), train, epoch);
                drop(tape);
                self.give_back_inputs(inp);
                self.stats.compute_s += t.elapsed().as_secs_f64();
                self.put(Kind::Act, l + 1, q, y)?;
            }
            self.sync_act(l + 1)?;
        }
        Ok(())
    }

    /// Layer 0's output rows of partition `q` (layer 1's input, never stored when
    /// [`Executor::fused`]).
    fn layer0(&mut self, q: usize, train: bool, epoch: u64) -> Result<B::Mat, TrainError> {
        let inp = self.inputs(0, q)?;
        self.prefetch(Kind::Act, 0, q + 1, false, &[])?;
        let t = Instant::now();
        let g = &self.parts[q].graph;
        let (y, tape) = self.model.layer_forward(self.b, g, 0, inp.x(), inp.pre.as_deref(), train, epoch);
        drop(tape);
        self.give_back_inputs(inp);
        self.stats.compute_s += t.elapsed().as_secs_f64();
        Ok(y)
    }

    /// Mirrors of layer `l`'s activations where a layer reads their halo rows (not where it
    /// runs split: it reads own rows only).
    fn sync_act(&mut self, l: usize) -> Result<(), TrainError> {
        if self.split(l) {
            return Ok(());
        }
        self.sync_mirrors(Kind::Act, l)
    }

    /// Partition-parallel runs: the rows of the `kind` blocks of layer `l` that other ranks
    /// mirror go to them, and this rank's mirrors arrive (as blocks of the remote partitions).
    fn sync_mirrors(&mut self, kind: Kind, l: usize) -> Result<(), TrainError> {
        let Some(dist) = self.dist.as_ref() else { return Ok(()) };
        if dist.device.is_some() {
            return self.sync_mirrors_on_device(kind, l);
        }
        let d = self.width(kind, l);
        let sends: Vec<Vec<(usize, Vec<u32>)>> = dist.sends.clone();
        let mut out = Vec::with_capacity(sends.len());
        for list in &sends {
            let mut data: Vec<B::T> = Vec::with_capacity(list.iter().map(|(_, r)| r.len() * d).sum());
            for (p, rows) in list {
                data.extend(self.read_rows(BlockId { kind, layer: l, part: *p }, rows, d)?);
            }
            out.push(to_bytes(&data));
        }
        let dist = self.dist.as_mut().expect("distributed");
        let got = dist.exchange(out, Phase::Halo);
        let (mirrors, owner) = (dist.mirrors.clone(), dist.owner.clone());
        let mut at = vec![0usize; got.len()];
        let got: Vec<Vec<B::T>> = got.iter().map(|b| from_bytes(b)).collect();
        for (s, rows) in &mirrors {
            let r = owner[*s];
            let n = rows.len() * d;
            let m = Mat::from_vec(rows.len(), d, got[r][at[r]..at[r] + n].to_vec());
            at[r] += n;
            self.put_host(BlockId { kind, layer: l, part: *s }, m)?;
        }
        Ok(())
    }

    /// Partition-parallel runs: the halo gradients this rank added into its mirrors of the
    /// `kind` blocks of layer `l` go to their owners, which add them (in rank order) into
    /// their blocks; the mirrors are dropped.
    fn flush_mirrors(&mut self, kind: Kind, l: usize) -> Result<(), TrainError> {
        let Some(dist) = self.dist.as_ref() else { return Ok(()) };
        if dist.device.is_some() {
            return self.flush_mirrors_on_device(kind, l);
        }
        let d = self.width(kind, l);
        let (mirrors, owner, sends) = (dist.mirrors.clone(), dist.owner.clone(), dist.sends.clone());
        let mut out: Vec<Vec<B::T>> = vec![Vec::new(); sends.len()];
        for (s, rows) in &mirrors {
            let id = BlockId { kind, layer: l, part: *s };
            let all: Vec<u32> = (0..rows.len() as u32).collect();
            let g = if self.written(id) {
                self.read_rows(id, &all, d)?
            } else {
                vec![B::T::of(0.0); rows.len() * d]
            };
            out[owner[*s]].extend(g);
            self.remove(id)?;
        }
        let dist = self.dist.as_mut().expect("distributed");
        let got = dist.exchange(out.iter().map(|v| to_bytes(v)).collect(), Phase::Grad);
        for (r, bytes) in got.iter().enumerate() {
            let g: Vec<B::T> = from_bytes(bytes);
            let mut at = 0;
            for (p, rows) in &sends[r] {
                let n = rows.len() * d;
                self.add_rows(BlockId { kind, layer: l, part: *p }, rows, d, &g[at..at + n])?;
                at += n;
            }
        }
        Ok(())
    }

    /// [`Executor::sync_mirrors`] over the device transport: each rank's rows gathered into one
    /// matrix where the blocks are, exchanged, and cut into the mirror blocks.
    fn sync_mirrors_on_device(&mut self, kind: Kind, l: usize) -> Result<(), TrainError> {
        let (b, d) = (self.b, self.width(kind, l));
        let dist = self.dist.as_ref().expect("distributed");
        let (mirrors, owner, sends) = (dist.mirrors.clone(), dist.owner.clone(), dist.sends.clone());
        let mut send = Vec::with_capacity(sends.len());
        for list in &sends {
            let mut m = b.output(list.iter().map(|(_, r)| r.len()).sum(), d);
            let mut at = 0;
            for (p, rows) in list {
                self.rows_into(BlockId { kind, layer: l, part: *p }, Rows::Index(rows), d, &mut m, at)?;
                at += rows.len();
            }
            send.push(m);
        }
        let mut recv_rows = vec![0; sends.len()];
        for (s, rows) in &mirrors {
            recv_rows[owner[*s]] += rows.len();
        }
        let got = self.dist.as_mut().expect("distributed").exchange_mats(b, send, &recv_rows, d, Phase::Halo);
        let mut at = vec![0; got.len()];
        for (s, rows) in &mirrors {
            let r = owner[*s];
            let mut m = b.output(rows.len(), d);
            b.gather_rows(&got[r], Rows::Range(at[r], rows.len()), &mut m, 0);
            at[r] += rows.len();
            self.put(kind, l, *s, m)?;
        }
        Ok(())
    }

    /// [`Executor::flush_mirrors`] over the device transport: the mirrors' gradients packed
    /// per owner, exchanged, and added (in rank order) where the owners' blocks are.
    fn flush_mirrors_on_device(&mut self, kind: Kind, l: usize) -> Result<(), TrainError> {
        let (b, d) = (self.b, self.width(kind, l));
        let dist = self.dist.as_ref().expect("distributed");
        let (mirrors, owner, sends) = (dist.mirrors.clone(), dist.owner.clone(), dist.sends.clone());
        let mut rows_to = vec![0; sends.len()];
        for (s, rows) in &mirrors {
            rows_to[owner[*s]] += rows.len();
        }
        let mut send: Vec<B::Mat> = rows_to.iter().map(|&n| b.zeros(n, d)).collect();
        let mut at = vec![0; sends.len()];
        for (s, rows) in &mirrors {
            let (id, r) = (BlockId { kind, layer: l, part: *s }, owner[*s]);
            if self.written(id) {
                self.rows_into(id, Rows::Range(0, rows.len()), d, &mut send[r], at[r])?;
            }
            at[r] += rows.len();
            self.remove(id)?;
        }
        let recv_rows: Vec<usize> = sends.iter().map(|l| l.iter().map(|(_, r)| r.len()).sum()).collect();
        let got = self.dist.as_mut().expect("distributed").exchange_mats(b, send, &recv_rows, d, Phase::Grad);
        for (r, g) in got.iter().enumerate() {
            let mut at = 0;
            for (p, rows) in &sends[r] {
                let id = BlockId { kind, layer: l, part: *p };
                let own = self.parts[*p].own;
                if self.on_dev.contains(&id) {
                    let block = self.dev.entry(id).or_insert_with(|| b.zeros(own, d));
                    b.scatter_add_rows(g, at, Rows::Index(rows), block);
                } else {
                    let mut m = b.output(rows.len(), d);
                    b.gather_rows(g, Rows::Range(at, rows.len()), &mut m, 0);
                    let h = b.download(&m);
                    self.stats.download_bytes += (h.data.len() * std::mem::size_of::<B::T>()) as u64;
                    self.store.add_rows(id, own, d, Some(rows), &h.data).map_err(io_err)?;
                }
                at += rows.len();
            }
        }
        Ok(())
    }

    /// Whether block `id` has been written (a gradient block no partition added to is not).
    fn written(&self, id: BlockId) -> bool {
        if self.on_dev.contains(&id) {
            self.dev.contains_key(&id)
        } else {
            self.store.shape(id).is_some()
        }
    }

    /// Rows `rows` of block `id` (either tier) into `out` from row `at` on.
    fn rows_into(
        &mut self,
        id: BlockId,
        rows: Rows<'_>,
        d: usize,
        out: &mut B::Mat,
        at: usize,
    ) -> Result<(), TrainError> {
        let b = self.b;
        if self.on_dev.contains(&id) {
            let block =
                self.dev.get(&id).unwrap_or_else(|| panic!("block {id:?} read before it was written"));
            b.gather_rows(block, rows, out, at);
            return Ok(());
        }
        let idx = match rows {
            Rows::Index(i) => Some(i),
            Rows::Range(..) => None,
        };
        let mut h = vec![B::T::of(0.0); rows.len() * d];
        self.store.read_rows(id, idx, &mut h).map_err(io_err)?;
        self.stats.upload_bytes += std::mem::size_of_val(h.as_slice()) as u64;
        let m = b.upload_owned(Mat::from_vec(rows.len(), d, h));
        b.gather_rows(&m, Rows::Range(0, rows.len()), out, at);
        Ok(())
    }

    /// Row width of the `kind` blocks of layer `l`.
    fn width(&self, kind: Kind, l: usize) -> usize {
        match kind {
            Kind::Xw | Kind::GradXw => self.model.dim(l + 1),
            _ => self.model.dim(l),
        }
    }

    /// Rows `rows` of block `id` (either tier) on the host.
    fn read_rows(&mut self, id: BlockId, rows: &[u32], d: usize) -> Result<Vec<B::T>, TrainError> {
        let b = self.b;
        if self.on_dev.contains(&id) {
            let block =
                self.dev.get(&id).unwrap_or_else(|| panic!("block {id:?} read before it was written"));
            let mut m = b.output(rows.len(), d);
            b.gather_rows(block, Rows::Index(rows), &mut m, 0);
            return Ok(b.download(&m).data);
        }
        let mut out = vec![B::T::of(0.0); rows.len() * d];
        self.store.read_rows(id, Some(rows), &mut out).map_err(io_err)?;
        Ok(out)
    }

    /// Adds `src` into rows `rows` of block `id` (either tier; made at zero if absent).
    fn add_rows(&mut self, id: BlockId, rows: &[u32], d: usize, src: &[B::T]) -> Result<(), TrainError> {
        let b = self.b;
        let own = self.parts[id.part].own;
        if self.on_dev.contains(&id) {
            let m = b.upload_owned(Mat::from_vec(rows.len(), d, src.to_vec()));
            let block = self.dev.entry(id).or_insert_with(|| b.zeros(own, d));
            b.scatter_add_rows(&m, 0, Rows::Index(rows), block);
            return Ok(());
        }
        self.store.add_rows(id, own, d, Some(rows), src).map_err(io_err)
    }

    /// The output gradient of layer `l` on partition `q`: from the store, or at the top from
    /// the loss on `y` (adding to the loss and correct counts).
    fn output_grad(
        &mut self,
        l: usize,
        q: usize,
        y: &B::Mat,
        loss: &mut f64,
        correct: &mut usize,
    ) -> Result<B::Mat, TrainError> {
        let b = self.b;
        if l + 1 == self.model.layers() {
            let part = &self.parts[q];
            let (rows, cols) = b.dims(y);
            let mut dy = b.zeros(rows, cols);
            let (s, c) =
                b.cross_entropy(y, &part.labels, &part.split_rows[0], 1.0 / self.n_train as f64, &mut dy);
            *loss += s;
            *correct += c;
            return Ok(dy);
        }
        self.gather_kind(Kind::Grad, l + 1, q, false)
    }

    /// One training pass: accumulates every parameter's gradient (the caller zeroes them) and
    /// returns the summed training loss and the number of correct training predictions.
    pub fn forward_backward(&mut self, epoch: u64) -> Result<(f64, usize), TrainError> {
        self.guarded(|ex| ex.forward_backward_pass(epoch))
    }

    /// `pass`, unless an earlier one failed; its error stops the executor.
    fn guarded<R>(&mut self, pass: impl FnOnce(&mut Self) -> Result<R, TrainError>) -> Result<R, TrainError> {
        if let Some(e) = &self.stopped {
            return Err(TrainError::Stopped(e.clone()));
        }
        let r = pass(self);
        if let Err(e) = &r {
            self.stopped = Some(e.to_string());
        }
        r
    }

    fn forward_backward_pass(&mut self, epoch: u64) -> Result<(f64, usize), TrainError> {
        let b = self.b;
        let layers = self.model.layers();
        let calibrate = self.gpu_mem.is_some() && !self.calibrated;
        if calibrate {
            b.reset_memory_peak();
        }
        self.forward_layers(true, epoch)?;
        let (mut loss, mut correct) = (0.0, 0usize);
        for l in (0..layers).rev() {
            let top = l + 1 == layers;
            let next_grad: &[Kind] = if top { &[] } else { &[Kind::Grad] };
            if l == 0 && self.fused {
                // ran inside layer 1's transform backward
                continue;
            }
            if self.split(l) {
                // aggregation backward: dh of own rows here, of halo rows to their owners
                for q in self.local.clone() {
                    let h = self.gather_kind(Kind::Xw, l, q, true)?;
                    let x = self.split_own_input(l, q)?;
                    self.prefetch(Kind::Xw, l, q + 1, true, next_grad)?;
                    let t = Instant::now();
                    let g = &self.parts[q].graph;
                    let (y, tape) = self.model.split_forward(b, g, l, &h, x.as_deref(), true, epoch);
                    drop(h);
                    self.stats.compute_s += t.elapsed().as_secs_f64();
                    let dy = self.output_grad(l, q, &y, &mut loss, &mut correct)?;
                    drop(y);
                    let t = Instant::now();
                    let g = &self.parts[q].graph;
                    let (dh, dx_root) = self.model.split_backward(b, g, l, x.as_deref(), tape, &dy, l > 0);
                    drop(dy);
                    self.give_back(x);
                    self.stats.compute_s += t.elapsed().as_secs_f64();
                    let t = Instant::now();
                    self.write_back(Kind::GradXw, l, q, dh)?;
                    if let Some(d) = dx_root {
                        self.write_back(Kind::Grad, l, q, d)?;
                    }
                    self.stats.write_back_s += t.elapsed().as_secs_f64();
                }
                self.flush_mirrors(Kind::GradXw, l)?;
                // transform backward, once every dh row is complete
                for q in self.local.clone() {
                    if l == 1 && self.fused {
                        self.fused_backward(q, epoch)?;
                        continue;
                    }
                    let x = self.own(Kind::Act, l, q)?;
                    let dh = self.own(Kind::GradXw, l, q)?;
                    self.prefetch(Kind::Act, l, q + 1, false, &[Kind::GradXw])?;
                    let t = Instant::now();
                    let dx = self.model.split_transform_backward(b, l, &x, &dh, l > 0);
                    self.give_back(Some(x));
                    self.give_back(Some(dh));
                    self.stats.compute_s += t.elapsed().as_secs_f64();
                    if let Some(dx) = dx {
                        let t = Instant::now();
                        self.write_back(Kind::Grad, l, q, dx)?;
                        self.stats.write_back_s += t.elapsed().as_secs_f64();
                    }
                }
                for q in 0..self.parts.len() {
                    self.remove(BlockId { kind: Kind::Xw, layer: l, part: q })?;
                    self.remove(BlockId { kind: Kind::GradXw, layer: l, part: q })?;
                }
            } else {
                let from_output = self.model.backward_from_output(l, l == 0 && self.pre);
                for q in self.local.clone() {
                    let inp = self.inputs(l, q)?;
                    let (x, pre) = (inp.x(), inp.pre.as_deref());
                    let next: &[Kind] = if from_output { &[Kind::Act, Kind::Grad] } else { next_grad };
                    self.prefetch(Kind::Act, l, q + 1, !(l == 0 && self.pre), next)?;
                    let dx = if from_output {
                        // the stored output is the ReLU/dropout mask: no recomputation
                        let out = self.own(Kind::Act, l + 1, q)?;
                        let dy = self.own(Kind::Grad, l + 1, q)?;
                        let t = Instant::now();
                        let tape =
                            self.model.tape_from_output(l, l == 0 && self.pre, epoch).expect("allowed");
                        let g = &self.parts[q].graph;
                        let dx = self.model.layer_backward(b, g, l, x, pre, tape, &dy, l > 0, Some(&out));
                        self.stats.compute_s += t.elapsed().as_secs_f64();
                        self.give_back(Some(out));
                        self.give_back(Some(dy));
                        dx
                    } else {
                        let t = Instant::now();
                        let g = &self.parts[q].graph;
                        let (y, tape) = self.model.layer_forward(b, g, l, x, pre, true, epoch);
                        self.stats.compute_s += t.elapsed().as_secs_f64();
                        let dy = self.output_grad(l, q, &y, &mut loss, &mut correct)?;
                        drop(y);
                        let t = Instant::now();
                        let g = &self.parts[q].graph;
                        let dx = self.model.layer_backward(b, g, l, x, pre, tape, &dy, l > 0, None);
                        self.stats.compute_s += t.elapsed().as_secs_f64();
                        dx
                    };
                    self.give_back_inputs(inp);
                    if let Some(dx) = dx {
                        let t = Instant::now();
                        self.write_back(Kind::Grad, l, q, dx)?;
                        self.stats.write_back_s += t.elapsed().as_secs_f64();
                    }
                }
                if l > 0 {
                    self.flush_mirrors(Kind::Grad, l)?;
                }
            }
            // layer l + 1's blocks are spent
            for q in 0..self.parts.len() {
                self.remove(BlockId { kind: Kind::Grad, layer: l + 1, part: q })?;
                if !top {
                    self.remove(act(l + 1, q))?;
                }
            }
        }
        self.store.sync().map_err(io_err)?;
        if calibrate {
            self.calibrated = true;
            self.place_more()?;
        }
        Ok((loss, correct))
    }

    /// Layers 1 (its transform) and 0 backward on partition `q` when [`Executor::fused`]: layer
    /// 0's output is remade from its inputs, layer 1's weight gradient and input gradient made
    /// from it, and layer 0's backward run on that gradient at once.
    fn fused_backward(&mut self, q: usize, epoch: u64) -> Result<(), TrainError> {
        let b = self.b;
        let inp = self.inputs(0, q)?;
        let dh = self.own(Kind::GradXw, 1, q)?;
        self.prefetch(Kind::Act, 0, q + 1, false, &[])?;
        self.prefetch(Kind::GradXw, 1, q + 1, false, &[])?;
        let t = Instant::now();
        let g = &self.parts[q].graph;
        let (x1, tape) = self.model.layer_forward(b, g, 0, inp.x(), inp.pre.as_deref(), true, epoch);
        let dx1 = self.model.split_transform_backward(b, 1, &x1, &dh, true).expect("an input gradient");
        drop(x1);
        self.give_back(Some(dh));
        let g = &self.parts[q].graph;
        let dx0 = self.model.layer_backward(b, g, 0, inp.x(), inp.pre.as_deref(), tape, &dx1, false, None);
        assert!(dx0.is_none(), "layer 0 makes no input gradient");
        self.give_back_inputs(inp);
        self.stats.compute_s += t.elapsed().as_secs_f64();
        Ok(())
    }

    /// A whole block of the backend's host memory on its way to the backend (its bytes counted
    /// as uploaded); `None` when `id` is not such a block.
    fn upload_pinned(&mut self, id: BlockId) -> Option<B::Arriving> {
        let h = self.pinned.get(&id)?;
        let (r, c) = self.b.host_block_dims(h);
        let m = self.b.upload_host_block(h);
        self.stats.upload_bytes += (r * c * std::mem::size_of::<B::T>()) as u64;
        Some(m)
    }

    /// Starts loading what partition `q` will gather from the `kind` blocks of layer `l` (own
    /// rows, halo rows with `halo`, layer 0's aggregation where used) and its `extra` blocks of
    /// layer `l + 1` (`GradXw`: of layer `l`), while the current partition computes.
    fn prefetch(
        &mut self,
        kind: Kind,
        l: usize,
        q: usize,
        halo: bool,
        extra: &[Kind],
    ) -> Result<(), TrainError> {
        if !self.local.contains(&q) {
            return Ok(());
        }
        let part = &self.parts[q];
        let id = |p: usize| BlockId { kind, layer: l, part: p };
        let mut ids = vec![id(q)];
        if kind == Kind::Act && l == 0 && self.pre && !halo {
            ids.push(BlockId { kind: Kind::Pre, layer: 0, part: q });
        }
        if halo {
            ids.extend(part.fetch.iter().map(|(s, _)| id(*s)));
        }
        ids.extend(extra.iter().map(|&k| {
            let layer = if k == Kind::GradXw { l } else { l + 1 };
            BlockId { kind: k, layer, part: q }
        }));
        // whole pinned blocks the next partition reads alone (layer 0's aggregation, own rows
        // without halo): their copies start now, beside this partition's work
        for a in ids.iter().filter(|a| a.part == q && (a.kind == Kind::Pre || (!halo && a.kind == kind))) {
            if self.ahead.iter().any(|(x, _)| x == a) {
                continue;
            }
            if let Some(m) = self.upload_pinned(*a) {
                if self.ahead.len() == 2 {
                    self.ahead.remove(0);
                }
                self.ahead.push((*a, m));
            }
        }
        ids.retain(|i| !self.on_dev.contains(i) && !self.pinned.contains_key(i));
        self.store.prefetch(ids).map_err(io_err)
    }

    /// Own rows of `dx` into partition `q`'s `kind` block of layer `l`; rows past the own ones
    /// (the halo) into their owners' blocks. Device blocks are added to on the device; `dx` is
    /// downloaded once if any destination is a host block.
    fn write_back(&mut self, kind: Kind, l: usize, q: usize, dx: B::Mat) -> Result<(), TrainError> {
        let b = self.b;
        let (n, d) = b.dims(&dx);
        let part = &self.parts[q];
        let id = |p: usize| BlockId { kind, layer: l, part: p };
        if n == part.own && self.on_dev.contains(&id(q)) && !self.dev.contains_key(&id(q)) {
            // own rows only, into a device block nothing has added to yet: it becomes the block
            self.dev.insert(id(q), dx);
            return Ok(());
        }
        let own = (q, Rows::Range(0, part.own));
        let targets: Vec<(usize, Rows<'_>)> = std::iter::once(own)
            .chain(part.fetch.iter().take_while(|_| n > part.own).map(|(s, idx)| (*s, Rows::Index(idx))))
            .collect();
        let mut host_targets = Vec::new();
        let mut from = 0;
        for (p, r) in targets {
            let rows = self.parts[p].own;
            if self.on_dev.contains(&id(p)) {
                let block = self.dev.entry(id(p)).or_insert_with(|| b.zeros(rows, d));
                b.scatter_add_rows(&dx, from, r, block);
            } else {
                host_targets.push((p, rows, from, r));
            }
            from += r.len();
        }
        if host_targets.is_empty() {
            return Ok(());
        }
        // one download for every host destination
        let store = &mut self.store;
        let mut failed = None;
        b.download_with(&dx, &mut |h: &[B::T]| {
            for (p, rows, from, r) in &host_targets {
                let src = &h[from * d..(from + r.len()) * d];
                let idx = match r {
                    Rows::Index(i) => Some(*i),
                    Rows::Range(..) => None,
                };
                if let Err(e) = store.add_rows(id(*p), *rows, d, idx, src) {
                    failed.get_or_insert(e);
                    return;
                }
            }
        });
        self.stats.download_bytes += (n * d * std::mem::size_of::<B::T>()) as u64;
        failed.map_or(Ok(()), |e| Err(io_err(e)))
    }

    /// Evaluation pass (no dropout): correct predictions on train, valid and test.
    pub fn evaluate(&mut self, epoch: u64) -> Result<[usize; 3], TrainError> {
        self.guarded(|ex| ex.evaluate_pass(epoch))
    }

    fn evaluate_pass(&mut self, epoch: u64) -> Result<[usize; 3], TrainError> {
        let b = self.b;
        self.forward_layers(false, epoch)?;
        let l = self.model.layers() - 1;
        let split = self.split(l);
        let mut correct = [0usize; 3];
        for q in self.local.clone() {
            let y = if split {
                let h = self.gather_kind(Kind::Xw, l, q, true)?;
                let x = self.split_own_input(l, q)?;
                self.prefetch(Kind::Xw, l, q + 1, true, &[])?;
                let t = Instant::now();
                let (y, _) =
                    self.model.split_forward(b, &self.parts[q].graph, l, &h, x.as_deref(), false, epoch);
                self.stats.compute_s += t.elapsed().as_secs_f64();
                self.give_back(x);
                y
            } else {
                let inp = self.inputs(l, q)?;
                self.prefetch(Kind::Act, l, q + 1, !(l == 0 && self.pre), &[])?;
                let t = Instant::now();
                let g = &self.parts[q].graph;
                let (y, _) = self.model.layer_forward(b, g, l, inp.x(), inp.pre.as_deref(), false, epoch);
                self.stats.compute_s += t.elapsed().as_secs_f64();
                self.give_back_inputs(inp);
                y
            };
            let part = &self.parts[q];
            for (k, rows) in part.split_rows.iter().enumerate() {
                correct[k] += b.count_correct(&y, &part.labels, rows);
            }
        }
        for q in 0..self.parts.len() {
            for layer in 1..self.model.layers() {
                self.remove(act(layer, q))?;
            }
            self.remove(BlockId { kind: Kind::Xw, layer: l, part: q })?;
        }
        self.store.sync().map_err(io_err)?;
        Ok(correct)
    }

    /// Phase times and store counters since the last call.
    pub fn take_stats(&mut self) -> PhaseStats {
        let mut s = std::mem::take(&mut self.stats);
        s.tier = self.store.take_stats();
        if let Some(d) = self.dist.as_mut() {
            d.take_comm_seconds();
            // every rank's bytes, summed (the counters of this reduction count next time)
            let mine = std::mem::take(&mut d.stats);
            let all = d.reduce.all_gather(&serde_json::to_vec(&mine).expect("counters serialise"));
            let mut total = CommStats::default();
            for b in all {
                let c: CommStats = serde_json::from_slice(&b).expect("counters deserialise");
                total.add(&c);
            }
            s.comm = Some(total);
        }
        s
    }

    /// Partition-parallel runs: the sum over the ranks of `v` (the same on every rank); a
    /// no-op in one process.
    pub fn reduce<T: grinnder_dist::Pod + std::ops::AddAssign>(&mut self, v: &mut [T]) {
        if let Some(d) = self.dist.as_mut() {
            d.all_reduce(v);
        }
    }

    /// Partition-parallel runs: every parameter gradient summed over the ranks (in a fixed
    /// order on the host, by the transport on the device; the same bits on every rank, so
    /// parameters stay identical).
    pub fn reduce_gradients(&mut self) {
        let Some(d) = self.dist.as_mut() else { return };
        match d.device {
            Some(dev) => sum_gradients_on(self.b, &mut self.model, dev.reduce, d.layout, &mut d.stats),
            None => sum_gradients(self.b, &mut self.model, d.reducer(), &mut d.stats),
        }
    }

    /// The rank and the number of ranks (0 and 1 in one process).
    pub fn rank(&self) -> (usize, usize) {
        self.dist.as_ref().map_or((0, 1), |d| (d.reduce.rank(), d.reduce.size()))
    }
}

/// See [`Executor::keeps_features`].
fn keeps_features<B: Backend>(model: &Model<B>, pre: bool) -> bool {
    !pre || model.reads_input_beside_pre()
}

/// See [`Executor::fusible`].
fn fusible<B: Backend>(model: &Model<B>, pre: bool) -> bool {
    pre && !model.reads_input_beside_pre()
        && model.layers() >= 2
        && model.split(1, false)
        && !model.split_reads_own_input(1)
}

/// The kinds of block an epoch makes, as (kind, layer, width), in [`Executor::block_list`]'s
/// order.
fn block_kinds<B: Backend>(model: &Model<B>, pre: bool, fused: bool) -> Vec<(Kind, usize, usize)> {
    let layers = model.layers();
    let split: Vec<usize> = (0..layers).filter(|&l| model.split(l, l == 0 && pre)).collect();
    let first_hidden = if fused { 2 } else { 1 };
    let mut kinds: Vec<(Kind, usize)> = (first_hidden..layers).map(|l| (Kind::Act, l)).collect();
    kinds.extend(split.iter().map(|&l| (Kind::Xw, l)));
    kinds.extend(split.iter().map(|&l| (Kind::GradXw, l)));
    if pre {
        kinds.push((Kind::Pre, 0));
    }
    if keeps_features(model, pre) {
        kinds.push((Kind::Act, 0));
    }
    kinds.extend((first_hidden..layers).map(|l| (Kind::Grad, l)));
    kinds
        .into_iter()
        .map(|(kind, layer)| {
            let d = match kind {
                Kind::Xw | Kind::GradXw => model.dim(layer + 1),
                _ => model.dim(layer),
            };
            (kind, layer, d)
        })
        .collect()
}

fn act(layer: usize, part: usize) -> BlockId {
    BlockId { kind: Kind::Act, layer, part }
}

/// Splits the host budget: what is resident now, a working set for the largest partition, a
/// margin, and the rest for the block cache; picks the cache mode for `Auto`.
fn make_plan<B: Backend>(
    model: &Model<B>,
    parts: &[Part<B>],
    tc: &TieredConfig,
    elem: usize,
    pre: bool,
    mapped_bytes: u64,
) -> Plan {
    let elem_tier = match tc.tier_dtype {
        TierDtype::F32 => elem,
        TierDtype::Bf16 => 2,
    } as u64;
    let layers = model.layers();
    // layer 0 on its precomputed aggregation reads own rows only: its input width counts over
    // the own rows, not over the columns
    let first = usize::from(pre);
    let (pre_width, out_width) = if pre { (model.dim(0) as u64, model.dim(1) as u64) } else { (0, 0) };
    let fused = fusible(model, pre);
    let heads = model.edge_width() as u64;
    let nodes: u64 = parts.iter().map(|p| p.own as u64).sum();
    // per partition and layer: the gathered input, the layer's temporaries and its input
    // gradient, about six matrices over the partition's columns — of the input's width, or of
    // the output's where the layer runs split (transform first: its input is read over the own
    // rows only, three matrices of them); plus GAT's per-edge attention arrays
    let widest = (first..=layers).map(|l| model.dim(l)).max().unwrap_or(1) as u64;
    let (working_bytes, device_working_bytes) = parts
        .iter()
        .map(|p| {
            let nnz = p.graph.nnz() as u64;
            // layer 0 on `Â x` works on own rows: this partition's `Â x` rows and the next's
            // (uploaded ahead), and (run inside layer 1) its output, that output's gradient and
            // their temporaries; making `Â x` reads the input rows of the columns. Layers run
            // one at a time: the largest of these counts.
            let (own, cols) = (p.own as u64, p.graph.cols as u64);
            let layer0 = 3 * own * pre_width + 4 * own * out_width;
            let setup = (cols + own) * pre_width;
            let layer = |l: usize| {
                let (i, o) = (model.dim(l) as u64, model.dim(l + 1) as u64);
                let own_layer0 = if l == 1 && fused { layer0 } else { 0 };
                let this = if model.split(l, l == 0 && pre) {
                    6 * cols * o + 3 * own * i
                } else {
                    6 * cols * i.max(o)
                };
                this + own_layer0
            };
            let host = (first..layers).map(layer).max().unwrap_or(0).max(layer0).max(setup);
            let device = (6 * cols * widest).max(layer0).max(setup);
            let attention = 4 * nnz * heads * elem as u64;
            (host * elem as u64 + attention, device * elem as u64 + attention)
        })
        .fold((0, 0), |(h, d), (ph, pd)| (h.max(ph), d.max(pd)));
    // every block an epoch makes, all at once (an upper bound: spent layers' blocks go), with
    // layer 0 inside layer 1 where it can be (a GPU tier that undoes that holds those blocks)
    let layer_bytes = |l: usize| nodes * model.dim(l) as u64 * elem_tier;
    let block_bytes: u64 = block_kinds(model, pre, fusible(model, pre))
        .iter()
        .map(|&(_, _, d)| nodes * d as u64 * elem_tier)
        .sum();
    let largest = (1..layers).map(layer_bytes).max().unwrap_or(0);
    // with a storage tier the store holds one block beyond its budget (the one in use), and
    // reading a block holds its file buffer beside the decoded block: two of the largest
    let largest_block = parts.iter().map(|p| p.own as u64).max().unwrap_or(0)
        * block_kinds(model, pre, fusible(model, pre)).iter().map(|&(_, _, d)| d as u64).max().unwrap_or(0)
        * elem_tier;
    let working_bytes = working_bytes + if tc.storage_dir.is_some() { 2 * largest_block } else { 0 };
    let resident_bytes = crate::metrics::held_bytes(mapped_bytes);
    let (cache_bytes, margin_bytes) = match tc.host_mem {
        _ if tc.cache_bytes.is_some() => (tc.cache_bytes, 0),
        None => (None, 0),
        Some(h) => {
            let margin = host_margin(h);
            (Some(h.saturating_sub(resident_bytes + working_bytes + margin)), margin)
        }
    };
    let mode = match tc.cache_mode {
        CacheMode::Auto => match cache_bytes {
            Some(c) if 2 * largest.max(layer_bytes(0)) > c => CacheMode::PartitionLru,
            _ => CacheMode::LruLayer,
        },
        m => m,
    };
    Plan {
        resident_bytes,
        working_bytes,
        device_working_bytes,
        margin_bytes,
        cache_bytes,
        mode,
        block_bytes,
        device: None,
    }
}

const GIB: f64 = (1u64 << 30) as f64;

/// The plan keeps 1 / 20 (5 %) of a memory budget free: of `--gpu-mem` for the allocations
/// its model does not count, of `--host-mem` as well, but there at least
/// [`HOST_MARGIN_MIN_BYTES`].
const MARGIN_DIVISOR: u64 = 20;

/// The least host margin: the allocator's slack (memory of freed blocks not yet back with the
/// kernel, fragmentation) and what lives outside the counted heap (thread stacks, the C
/// allocations of METIS and io_uring) took 13–18 MiB beyond the counted figures on the 2-core
/// machine (arxiv-like at scale 0.5, 4 and 8 partitions, 2026-12-01).
const HOST_MARGIN_MIN_BYTES: u64 = 32 << 20;

/// The margin kept free of a host budget of `h` bytes.
fn host_margin(h: u64) -> u64 {
    (h / MARGIN_DIVISOR).max(HOST_MARGIN_MIN_BYTES)
}

/// The smallest host budget `h` with `need + host_margin(h) <= h`.
fn min_host_budget(need: u64) -> u64 {
    // h − ⌊h / 20⌋ grows by 0 or 1 with h: start near need · 20 / 19 and step to the least h
    let leaves = |h: u64| h - h / MARGIN_DIVISOR >= need;
    let mut h = need / (MARGIN_DIVISOR - 1) * MARGIN_DIVISOR;
    while !leaves(h) {
        h += 1;
    }
    while h > 0 && leaves(h - 1) {
        h -= 1;
    }
    h.max(need + HOST_MARGIN_MIN_BYTES)
}

/// Bytes in MiB, for messages.
fn mib(bytes: u64) -> f64 {
    bytes as f64 / 1048576.0
}

/// A copy of `h`, in parallel for large slices (blocks of hundreds of MB leave staging memory).
fn par_to_vec<T: Scalar>(h: &[T]) -> Vec<T> {
    use rayon::prelude::*;
    h.par_iter().with_min_len(1 << 16).copied().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_least_host_budget_is_the_least_that_leaves_its_margin() {
        for need in [0, 1, 1 << 20, 100 << 20, 607 << 20, 640 << 20, 641 << 20, 10 << 30, (10 << 30) + 7] {
            let h = min_host_budget(need);
            assert!(need + host_margin(h) <= h, "need {need}: {h} leaves no margin");
            assert!(need + host_margin(h - 1) > h - 1 || h - 1 < need, "need {need}: {} would do", h - 1);
        }
    }
}
