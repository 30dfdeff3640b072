//! Setting the executor up: partitioning, the partition graphs, the memory plan, the first
//! blocks (features and layer 0's aggregation).

use std::collections::HashMap;
use std::time::Instant;

use grinnder_dist::{from_bytes, to_bytes, Layout};
use grinnder_graph::{Csr, Dataset};
use grinnder_nn::graph::Adjacency;
use grinnder_nn::{Graph, Model, ModelConfig};
use grinnder_partition::{PartitionedGraph, Partitioning};
use grinnder_tensor::{Backend, Mat, SparseMatrix};
use rayon::prelude::*;

use crate::config::{FeatureNorm, FeaturePrep, TrainError};
use crate::features::{feature_rows, feature_rows_into, feature_shift};

use super::dist::{shared_partitioning, CommStats, DistConfig, DistState, SubgraphOf};
use super::executor::{io_err, Executor};
use super::files;
use super::input;
use super::meters::Meters;
use super::meters::PhaseStats;
use super::part::Part;
use super::plan::{act, host_margin, keeps_features, make_plan, mib, min_host_budget, Plan, GIB};
use super::settings::{HostAuto, TieredConfig};
use super::store::{BlockKind, Store, StoreConfig, TierDtype};
use super::tiers::Tiers;

/// What makes an executor's model (again where the setup starts over).
pub(super) type MakeModel<'m, B> = dyn Fn() -> Result<Model<B>, TrainError> + 'm;

impl<'a, B: Backend> Executor<'a, B> {
    /// Partitions `ds`, builds the partition graphs, plans memory and fills the store with
    /// the input features (and their first aggregation where the model allows).
    pub fn new(
        b: &'a B,
        ds: &Dataset,
        model_cfg: &ModelConfig,
        features: impl Into<FeaturePrep>,
        tc: &TieredConfig,
    ) -> Result<Self, TrainError> {
        Self::new_dist(b, ds, model_cfg, features, tc, None)
    }

    /// [`Executor::new`] as one rank of a partition-parallel run (`dist`; `None`: one process).
    pub fn new_dist(
        b: &'a B,
        ds: &Dataset,
        model_cfg: &ModelConfig,
        features: impl Into<FeaturePrep>,
        tc: &TieredConfig,
        dist: Option<DistConfig<'a, B>>,
    ) -> Result<Self, TrainError> {
        Self::new_share(b, ds, None, model_cfg, features, tc, dist)
    }

    /// [`Executor::new_dist`] where `ds` is a part of the whole (`sub`: a server's share).
    pub fn new_share(
        b: &'a B,
        ds: &Dataset,
        sub: Option<&SubgraphOf>,
        model_cfg: &ModelConfig,
        features: impl Into<FeaturePrep>,
        tc: &TieredConfig,
        dist: Option<DistConfig<'a, B>>,
    ) -> Result<Self, TrainError> {
        let ex = Self::set_up(b, ds, sub, &Self::of_config(b, ds, model_cfg), tc, dist, false)?;
        ex.with_first_blocks(ds, sub, features.into())
    }

    /// The executor [`Executor::set_up`] made, with its first blocks: the input features (and
    /// their first aggregation where the model allows).
    pub(super) fn with_first_blocks(
        mut self,
        ds: &Dataset,
        sub: Option<&SubgraphOf>,
        features: FeaturePrep,
    ) -> Result<Self, TrainError> {
        // a share's shift is the whole graph's
        let shift = shift_phase(ds, features.norm, sub.map(|s| s.feature_shift).or(features.shift));
        let phase = grinnder_graph::progress::phase(if self.pre {
            "first blocks (features, layer 0's aggregation)"
        } else {
            "first blocks (features)"
        });
        self.load_features(ds, features.norm, shift)?;
        drop(phase);
        Ok(self)
    }

    /// A built-in model of `cfg` for `ds`, checked first (a size no machine holds is refused
    /// before anything is allocated).
    fn of_config<'m>(
        b: &'m B,
        ds: &'m Dataset,
        cfg: &'m ModelConfig,
    ) -> impl Fn() -> Result<Model<B>, TrainError> + 'm {
        move || {
            let elem = std::mem::size_of::<B::T>() as u64;
            crate::budgets::check_model(cfg, ds.features.dim, ds.num_classes as usize, elem)?;
            Ok(Model::init(b, cfg.clone(), ds.features.dim, ds.num_classes as usize))
        }
    }

    /// The executor's plan for `ds` without its first blocks: partitioning, the partition
    /// graphs, the memory plan and the GPU tier's placement, as [`Executor::new`] makes them —
    /// what `grinnder info` shows and [`Executor::predict_epoch`] reads. It cannot train.
    pub fn plan_only(
        b: &'a B,
        ds: &Dataset,
        model_cfg: &ModelConfig,
        tc: &TieredConfig,
    ) -> Result<Self, TrainError> {
        let mut ex = Self::set_up(b, ds, None, &Self::of_config(b, ds, model_cfg), tc, None, true)?;
        ex.stopped = Some("a plan only: its first blocks were never made".to_string());
        Ok(ex)
    }

    /// [`Executor::set_up_once`]; where the partition count was chosen
    /// ([`TieredConfig::auto_parts`]) and a working set does not fit, again with twice the
    /// partitions (each partitioning cached), up to [`crate::budgets::PARTS_MAX`].
    pub(super) fn set_up(
        b: &'a B,
        ds: &Dataset,
        sub: Option<&SubgraphOf>,
        make: &MakeModel<'_, B>,
        tc: &TieredConfig,
        dist: Option<DistConfig<'a, B>>,
        plan_only: bool,
    ) -> Result<Self, TrainError> {
        let mut tc = std::borrow::Cow::Borrowed(tc);
        loop {
            match Self::set_up_once(b, ds, sub, make, &tc, dist, plan_only) {
                Err(TrainError::Memory(m)) if tc.auto_parts && 2 * tc.parts <= crate::budgets::PARTS_MAX => {
                    tracing::info!("{m}: {} partitions instead of {}", 2 * tc.parts, tc.parts);
                    tc.to_mut().parts *= 2;
                }
                r => return r,
            }
        }
    }

    /// Everything [`Executor::new_share`] does before the first blocks; with `plan_only` the
    /// store makes no directory.
    fn set_up_once(
        b: &'a B,
        ds: &Dataset,
        sub: Option<&SubgraphOf>,
        make: &MakeModel<'_, B>,
        tc: &TieredConfig,
        dist: Option<DistConfig<'a, B>>,
        plan_only: bool,
    ) -> Result<Self, TrainError> {
        let (rank, ranks) = dist.map_or((0, 1), |d| (d.comm.rank(), d.comm.size()));
        let (owner, local) = shares(tc.parts, rank, ranks, ds.graph.num_nodes())?;
        let elem = std::mem::size_of::<B::T>() as u64;
        let model = make()?;
        let phase = grinnder_graph::progress::phase(&format!("partitioning ({} parts)", tc.parts));
        let partitioning = match dist.filter(|_| ranks > 1) {
            None => shared_partitioning(&grinnder_dist::Solo, ds, tc)?,
            Some(d) => shared_partitioning(d.comm, ds, tc)?,
        };
        drop(phase);
        let phase = grinnder_graph::progress::phase("partition graphs");
        // the adjacency the model needs, with its whole-graph normalisation
        // (a server's share: the whole graph's degrees)
        // — kept as factors per node where they factor (see `factored_adjacency`)
        let aggregation = model.aggregation();
        let (mut pg, factors) = match factored_adjacency(ds, sub, &model) {
            Some((csr, factors)) => (PartitionedGraph::build(&csr, &partitioning, &[]), Some(factors)),
            None => {
                let (csr, vals): (Csr, Vec<f64>) = match sub {
                    None => aggregation.adjacency(&ds.graph, ds.edge_weight.as_deref()),
                    Some(s) => aggregation.share_adjacency(&ds.graph, &s.degree),
                };
                (PartitionedGraph::build(&csr, &partitioning, &[&vals]), None)
            }
        };
        // node ids of dropout keys: the whole graph's
        let key = |v: u32| sub.map_or(v, |s| s.ids[v as usize]);
        // the run reads the dataset's structure no more (SAGE's and GIN's adjacency was a view
        // of it until here): a mapped file's pages go back (12.9 GiB of papers-like at full
        // size, counted as held until now)
        ds.graph.release_pages();
        let mirrors = mirror_rows(&mut pg, &local);
        // the fixed input's aggregation, computed once, where it pays (`runs_on_pre`): then it
        // replaces the features (computed from the dataset's rows, no feature blocks) and
        // layer 0 needs no halo rows and no aggregation per epoch
        let pre = super::plan::runs_on_pre(&model, false);
        // under a host budget, `Â x` is built a piece of columns at a time where two
        // partitions' input rows would take much of the budget ([`input::in_pieces`])
        let most_cols = pg.partitions.iter().map(|g| g.columns() as u64).max().unwrap_or(0);
        let in_pieces = pre
            && !keeps_features(&model, pre)
            && tc.host_mem.is_some_and(|h| input::in_pieces(most_cols * model.dim(0) as u64 * elem, h));
        drop(phase);
        let phase = grinnder_graph::progress::phase("partition blocks");
        let adjacency = (aggregation, factors.as_ref());
        let parts = build_parts(b, ds, &partitioning, pg, &mirrors, &local, adjacency, key, in_pieces);
        drop(factors);
        drop(phase);
        let (mapped, device) = (crate::process::mapped_bytes(ds), b.device_memory().is_some());
        let plan = make_plan(&model, &parts, tc, elem as usize, pre, mapped, device);
        check_host_budget(&plan, tc)?;
        let store_cfg = StoreConfig {
            budget: plan.cache_bytes,
            mode: plan.mode,
            dtype: tc.tier_dtype,
            faults: tc.faults,
        };
        // each store (each rank's too) makes a private directory of its own inside the given one
        let dir = tc.storage_dir.as_deref().filter(|_| !plan_only);
        let store = Store::new(store_cfg, dir, tc.keep_storage).map_err(io_err)?;
        let mut ex = Executor {
            b,
            model,
            parts,
            tiers: Tiers::new(store),
            stopped: None,
            fused: false,
            gpu_mem: tc.gpu_mem.filter(|_| tc.device_cache_bytes.is_none()),
            calibrated: false,
            n_train: sub.map_or(ds.splits.train.len(), |s| s.n_train),
            pre,
            inference: tc.inference,
            partitioning,
            plan,
            meters: Meters::default(),
            local: local.clone(),
            dist: None,
            progress: false,
            given: None,
        };
        if let Some(d) = dist {
            ex.dist = Some(dist_state(d, ranks, owner, mirrors));
        }
        // (bf16 blocks page-locked where the backend converts bf16 on its side of the bus)
        ex.tiers.pin_fixed = tc.host_mem.is_none()
            && tc.cache_bytes.is_none()
            && (tc.tier_dtype == TierDtype::F32 || b.converts_bf16());
        // ranks exchange mirror blocks through the store's host rows: they keep the fixed
        // blocks alone page-locked
        ex.tiers.pin_all = ex.tiers.pin_fixed && ex.dist.is_none();
        ex.fused = ex.fusible();
        ex.assert_initial_runs_whole();
        if tc.gpu_mem.is_some() || tc.device_cache_bytes.is_some() {
            ex.place_on_device(tc)?;
        }
        ex.check_host_blocks(tc)?;
        match tc.host_auto.as_ref().filter(|_| tc.host_mem.is_none() && tc.cache_bytes.is_none()) {
            Some(auto) if !ex.blocks_fit(auto, tc.tier_dtype) => {
                drop(ex);
                Self::set_up_under(auto, b, ds, sub, make, tc, dist, plan_only)
            }
            _ => Ok(ex),
        }
    }

    /// [`Self::set_up_once`] again under the host budget `auto` chose, where the blocks outside
    /// the GPU tier do not fit beside the process: its first aggregation made a piece at a time,
    /// blocks beyond the budget in files (the partitioning is read from its cache).
    #[allow(clippy::too_many_arguments)]
    fn set_up_under(
        auto: &HostAuto,
        b: &'a B,
        ds: &Dataset,
        sub: Option<&SubgraphOf>,
        make: &MakeModel<'_, B>,
        tc: &TieredConfig,
        dist: Option<DistConfig<'a, B>>,
        plan_only: bool,
    ) -> Result<Self, TrainError> {
        let budgeted = TieredConfig {
            host_mem: Some(auto.bytes),
            storage_dir: tc.storage_dir.clone().or_else(|| auto.storage_dir.clone()),
            host_auto: None,
            ..tc.clone()
        };
        if let Some(f) = auto.on_budget {
            f();
        }
        tracing::info!(
            "host: the blocks outside the GPU tier do not fit in the {:.2} GiB this machine leaves the run: a host budget of that size, blocks beyond it in {}",
            auto.bytes as f64 / GIB,
            budgeted.storage_dir.as_deref().map_or("no storage directory".into(), |d| d.display().to_string())
        );
        Self::set_up_once(b, ds, sub, make, &budgeted, dist, plan_only).map_err(|e| match e {
            TrainError::Memory(m) => TrainError::Memory(format!(
                "{m} (the host budget is the memory this machine leaves the run, chosen from it; --host-mem and --parts override)"
            )),
            e => e,
        })
    }

    /// Counts the host blocks that exist at once, once the GPU tier is placed, and refuses a
    /// plan whose host cache and storage directory cannot hold them ([`check_blocks`]).
    fn check_host_blocks(&mut self, tc: &TieredConfig) -> Result<(), TrainError> {
        // (a rank's mirrors are not walked: its blocks' sum, every one at once)
        let host_blocks =
            if self.dist.is_some() { self.plan.block_bytes } else { self.peak_host_block_bytes() };
        self.plan.host_block_bytes = Some(host_blocks);
        if !check_blocks(&self.plan, tc, &block_levers(&self.plan, &self.model, tc))? {
            self.tiers.store.remove_files_once_read();
        }
        Ok(())
    }

    /// Whether the blocks outside the GPU tier that exist at once fit in `auto.bytes` beside
    /// what the process holds and the largest working set ([`TieredConfig::host_auto`]).
    fn blocks_fit(&self, auto: &HostAuto, dtype: TierDtype) -> bool {
        // (the store keeps blocks at the tier's type: bf16 halves them)
        let elem = std::mem::size_of::<B::T>() as u64;
        let outside: u64 = self.plan.host_block_bytes.unwrap_or_else(|| {
            self.block_list()
                .iter()
                .filter(|(id, _)| !self.tiers.on_device(*id))
                .map(|(_, b)| b / elem * dtype.bytes(elem as usize) as u64)
                .sum()
        });
        let need = self.plan.resident_bytes + self.plan.working_bytes + outside;
        let fits = need + host_margin(auto.bytes) <= auto.bytes;
        tracing::info!(
            "host: {} ({:.2} GiB of blocks outside the GPU tier beside {:.2} GiB the process holds and a {:.2} GiB working set: {:.2} GiB in all and a margin, against {:.2} GiB)",
            if fits { "every block in RAM" } else { "the blocks do not all fit in RAM" },
            outside as f64 / GIB,
            self.plan.resident_bytes as f64 / GIB,
            self.plan.working_bytes as f64 / GIB,
            need as f64 / GIB,
            auto.bytes as f64 / GIB
        );
        fits
    }

    pub(super) fn load_features(
        &mut self,
        ds: &Dataset,
        norm: FeatureNorm,
        min: f64,
    ) -> Result<(), TrainError> {
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
            let mut whole = Vec::new();
            for q in self.local.clone() {
                let ids = input_ids(&ids_of[&q], &self.parts[q].fetch, |s| &ids_of[&s]);
                match self.parts[q].input_adjacency.take() {
                    Some(adj) => {
                        let agg = self.aggregate_in_pieces(ds, norm, min, &ids, adj)?;
                        self.put(BlockKind::Pre, 0, q, agg)?;
                    }
                    None => whole.push((q, ids)),
                }
            }
            self.aggregate_whole(ds, norm, min, &whole)?;
            // (blocks kept in the store came down through the staging, grown to the largest)
            self.b.release_staging();
            if self.fused && !self.split(1) {
                // layer 0 runs over layer 1's columns: other ranks' rows of `Â x` among them
                // (each rank makes only its own: their adjacency is the other rank's)
                self.sync_mirrors(BlockKind::Pre, 0)?;
            }
        } else {
            for (q, ids) in blocks {
                let rows = feature_rows::<B::T>(ds, norm, min, &ids).map_err(io_err)?;
                self.put_host(act(0, q), Mat::from_vec(ids.len(), d, rows))?;
            }
            if self.pre {
                // layer 0 reads the features beside their aggregation (SAGE's root term, a
                // residual)
                for q in self.local.clone() {
                    let x = self.gather(0, q, true)?;
                    self.put_aggregate(q, x)?;
                }
                // (the gathers staged the columns' input rows: wider than any epoch's transfer
                // where the input is wider than the layers, and not in the plan's working set)
                self.b.release_staging();
            }
        }
        self.tiers.store.take_stats();
        self.meters.stats = PhaseStats::default();
        Ok(())
    }

    /// `Â x` of each partition `(q, ids)` whose input rows (dataset nodes `ids`: own, then
    /// halo) are read at once: a thread reads partition q+1's rows on every core while this
    /// one uploads q's, aggregates them and puts the result. Two partitions' rows are held at
    /// a time (the plan counts them). On a GPU they are read straight into two page-locked
    /// host blocks, uploaded from there by DMA on the second stream (before: into a vector,
    /// copied into the backend's staging, uploaded from there — a second pass over every byte
    /// on the host; BENCHMARKS, the time to the first epoch).
    fn aggregate_whole(
        &mut self,
        ds: &Dataset,
        norm: FeatureNorm,
        min: f64,
        order: &[(usize, Vec<u32>)],
    ) -> Result<(), TrainError> {
        let (b, d) = (self.b, ds.features.dim);
        let most = order.iter().map(|(_, ids)| ids.len()).max().unwrap_or(0);
        let pinned: Vec<B::HostBlock> = match b.device_memory() {
            Some(_) => (0..2).map_while(|_| b.new_host_block(most, d)).collect(),
            None => Vec::new(),
        };
        // without two page-locked blocks the rows travel as vectors
        let pinned = if pinned.len() == 2 { pinned } else { Vec::new() };
        let reuse_blocks = !pinned.is_empty();
        type Read<M> = std::io::Result<(usize, usize, M, f64)>;
        std::thread::scope(|s| {
            let (tx, rx) = std::sync::mpsc::sync_channel::<Read<InputRows<B>>>(0);
            let (back, reuse) = std::sync::mpsc::channel::<InputRows<B>>();
            for h in pinned {
                back.send(InputRows::Pinned(h)).expect("the receiver lives");
            }
            s.spawn(move || {
                for (q, ids) in order {
                    let t = Instant::now();
                    let mut rows = if reuse_blocks {
                        match reuse.recv() {
                            Ok(r) => r,
                            Err(_) => return, // the consumer stopped on an error
                        }
                    } else {
                        InputRows::Owned(Vec::new())
                    };
                    let n = ids.len() * d;
                    let out = match &mut rows {
                        // (waits for the upload still reading the block)
                        InputRows::Pinned(h) => &mut b.host_block_mut(h)[..n],
                        InputRows::Owned(v) => {
                            v.resize(n, B::T::default());
                            &mut v[..]
                        }
                    };
                    let r = feature_rows_into(ds, norm, min, ids, out);
                    if tx.send(r.map(|()| (*q, ids.len(), rows, t.elapsed().as_secs_f64()))).is_err() {
                        return;
                    }
                }
            });
            for _ in order {
                let t = Instant::now();
                let (q, n, rows, gathered) =
                    rx.recv().expect("the reader sends every partition").map_err(io_err)?;
                let waited = t.elapsed().as_secs_f64();
                let x = match rows {
                    InputRows::Pinned(h) => {
                        let x = b.arrived(b.upload_host_rows(&h, n));
                        let _ = back.send(InputRows::Pinned(h));
                        x
                    }
                    InputRows::Owned(v) => b.upload_owned(Mat::from_vec(n, d, v)),
                };
                let uploaded = t.elapsed().as_secs_f64();
                self.put_aggregate(q, x)?;
                // (where the first blocks' time goes)
                tracing::debug!(
                    "first blocks, partition {q}: {n} rows ({} own) read in {gathered:.3} s (waited for {waited:.3} s), upload queued in {:.3} s, aggregated and put in {:.3} s",
                    self.parts[q].own,
                    uploaded - waited,
                    t.elapsed().as_secs_f64() - uploaded
                );
            }
            Ok(())
        })
    }

    /// Layer 0's aggregation of partition `q` from its input rows `x` (own, then halo), kept as
    /// its `Pre` block.
    pub(super) fn put_aggregate(&mut self, q: usize, x: B::Mat) -> Result<(), TrainError> {
        let agg = self.model.aggregate_input(self.b, &self.parts[q].graph, &x).expect("GCN or SAGE");
        drop(x);
        self.put(BlockKind::Pre, 0, q, agg)
    }
}

/// The dataset ids of a partition's input rows: its own rows (`own`), then its halo rows, row
/// `i` of partition `s` being `rows_of(s)[i]`.
pub(super) fn input_ids<'r>(
    own: &[u32],
    fetch: &[(usize, Vec<u32>)],
    rows_of: impl Fn(usize) -> &'r [u32],
) -> Vec<u32> {
    let mut ids = own.to_vec();
    for (s, idx) in fetch {
        let theirs = rows_of(*s);
        ids.extend(idx.iter().map(|&i| theirs[i as usize]));
    }
    ids
}

/// The whole graph's adjacency for the model with its values as factors per node, where they
/// factor ([`factors_values`]); `None`: values per entry.
fn factored_adjacency<B: Backend>(
    ds: &Dataset,
    sub: Option<&SubgraphOf>,
    model: &Model<B>,
) -> Option<(Csr, grinnder_nn::Factors)> {
    if sub.is_some() || !factors_values(model.weighs_entries(), ds.edge_weight.is_some()) {
        return None;
    }
    model.aggregation().factored(&ds.graph, ds.edge_weight.as_deref())
}

/// Whether the partition graphs keep their normalisation as factors per node instead of a
/// value per entry: where it factors (not attention, `weighs_entries`; no edge weights) —
/// GCN, SAGE, GIN on the whole graph (a server's share rescales partial rows per entry). A
/// partition's graph then holds 8 bytes an entry on a device (the structure and its transpose)
/// against 16 with values per entry and their transposed order: on papers-like at full size
/// (3.3 G entries with self loops) about 25 GiB of GPU memory less (docs/gpu.md, kernels).
/// The default on every backend: on an H100 (2026-12-06, products-like, 16 parts under
/// `--gpu-mem 8GiB`, same losses) GCN took 0.093 s an epoch against 0.085 s per entry and SAGE
/// 0.163 s against 0.214 s, with half the peak host memory. `GRINNDER_FACTORED=0` keeps values
/// per entry everywhere (for comparisons).
pub fn factors_values(weighs_entries: bool, weighted: bool) -> bool {
    let chosen = match std::env::var("GRINNDER_FACTORED").as_deref() {
        Ok("0") => false,
        Ok("1") | Err(_) => true,
        Ok(other) => {
            static ONCE: std::sync::Once = std::sync::Once::new();
            ONCE.call_once(|| tracing::warn!("GRINNDER_FACTORED={other:?} is neither 0 nor 1: the default"));
            true
        }
    };
    chosen && !weighs_entries && !weighted
}

/// A partition's input rows on their way from the reader to the backend.
enum InputRows<B: Backend> {
    /// In a page-locked block the reader gets back once its upload is queued.
    Pinned(B::HostBlock),
    Owned(Vec<B::T>),
}

/// The features' shift: `fixed`, else [`feature_shift`] — for row normalisation a pass over the
/// features, a setup phase of its own.
fn shift_phase(ds: &Dataset, norm: FeatureNorm, fixed: Option<f64>) -> f64 {
    match fixed {
        Some(s) => s,
        None if norm == FeatureNorm::Row => {
            let _phase = grinnder_graph::progress::phase("normalisation (the features' minimum)");
            feature_shift(ds, norm)
        }
        None => feature_shift(ds, norm),
    }
}

/// Rows of other ranks' partitions that this rank's (`local`) read, by partition, sorted: the
/// mirrors, kept as compact blocks; the fetch lists of the local partitions are renumbered into
/// them.
fn mirror_rows(
    pg: &mut PartitionedGraph,
    local: &std::ops::Range<usize>,
) -> std::collections::BTreeMap<usize, Vec<u32>> {
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
    mirrors
}

/// The executor's partitions: the local ones with their graphs on the backend (columns keyed by
/// `key`: the whole graph's ids), labels and split rows, and with `in_pieces` their adjacency
/// on the host too; another rank's as the count of its rows mirrored here. The host side of
/// each (ids, labels, the structure's transpose) is made on every core, a partition per core
/// at a time, then moved to the backend in order (before: one partition after another, 4–6 s
/// of a 10 M-node setup on an H200 host's 16 cores).
#[allow(clippy::too_many_arguments)]
fn build_parts<B: Backend>(
    b: &B,
    ds: &Dataset,
    partitioning: &Partitioning,
    pg: PartitionedGraph,
    mirrors: &std::collections::BTreeMap<usize, Vec<u32>>,
    local: &std::ops::Range<usize>,
    (aggregation, factors): (grinnder_nn::Aggregation, Option<&grinnder_nn::Factors>),
    key: impl Fn(u32) -> u32 + Sync,
    in_pieces: bool,
) -> Vec<Part<B>> {
    let mut splits_local: Vec<[Vec<u32>; 3]> = vec![Default::default(); pg.partitions.len()];
    for (k, (_, ids)) in ds.splits.named().iter().enumerate() {
        for &v in ids.iter() {
            let q = partitioning.part[v as usize] as usize;
            let local = partitioning.perm[v as usize] as u64 - partitioning.ptr[q];
            splits_local[q][k].push(local as u32);
        }
    }
    let mut parts = Vec::with_capacity(pg.partitions.len());
    let mut todo = pg.partitions.into_iter().zip(splits_local).enumerate();
    loop {
        let some: Vec<_> = todo.by_ref().take(rayon::current_num_threads()).collect();
        if some.is_empty() {
            return parts;
        }
        let made: Vec<(Part<B>, Option<HostStructure>)> = some
            .into_par_iter()
            .map(|(q, (g, split_rows))| {
                host_part(ds, partitioning, q, g, split_rows, mirrors, local, (&key, factors), in_pieces)
            })
            .collect();
        for (mut part, structure) in made {
            if let Some((sm, vals)) = structure {
                let (cols, col_ids) = (sm.cols, sm.col_ids.clone());
                let adj = match vals {
                    PartValues::Entries(v) => Adjacency::new(b, &sm, &v),
                    PartValues::Factored(r, c) => Adjacency::factored(b, sm, r.as_deref(), c.as_deref()),
                };
                part.graph = Graph::single(part.own, cols, aggregation, adj, col_ids);
            }
            parts.push(part);
        }
    }
}

/// A partition's structure (with its transpose and ids) and values, made on the host for its
/// graph on the backend.
type HostStructure = (SparseMatrix, PartValues);

/// A partition's adjacency values: one per entry, or the factors of its rows and columns.
enum PartValues {
    Entries(Vec<f64>),
    Factored(Option<Vec<f64>>, Option<Vec<f64>>),
}

/// Partition `q` made on the host (see [`build_parts`]), its graph empty, with the structure
/// (its transpose and ids) and values its graph is made from; another rank's as the count of
/// its rows mirrored here, as a block of that many rows.
#[allow(clippy::too_many_arguments)]
fn host_part<B: Backend>(
    ds: &Dataset,
    partitioning: &Partitioning,
    q: usize,
    mut g: grinnder_partition::PartitionGraph,
    mut split_rows: [Vec<u32>; 3],
    mirrors: &std::collections::BTreeMap<usize, Vec<u32>>,
    local: &std::ops::Range<usize>,
    (key, factors): (&(impl Fn(u32) -> u32 + Sync), Option<&grinnder_nn::Factors>),
    in_pieces: bool,
) -> (Part<B>, Option<HostStructure>) {
    let graph = Graph { rows: 0, cols: 0, adjacencies: Vec::new(), ids: None };
    if !local.contains(&q) {
        let own = mirrors.get(&q).map_or(0, Vec::len);
        let (fetch, labels, split_rows) = (Vec::new(), Vec::new(), Default::default());
        return (Part { graph, own, fetch, labels, split_rows, input_adjacency: None }, None);
    }
    for s in &mut split_rows {
        s.sort_unstable();
    }
    let first = partitioning.ptr[q] as usize;
    let own_ids: Vec<u32> = partitioning.inv_perm[first..first + g.own].to_vec();
    let labels: Vec<i32> = own_ids.iter().map(|&v| ds.labels[v as usize]).collect();
    let halo_ids = g.halo.iter().map(|&h| partitioning.inv_perm[h as usize]);
    let col_ids: Vec<u32> = own_ids.iter().copied().chain(halo_ids).collect();
    // (factors are keyed by the dataset's ids: a share, whose keys differ, has none)
    let vals = match factors {
        Some(f) => {
            let (r, c) = f.of(&own_ids, &col_ids);
            PartValues::Factored(r, c)
        }
        None => PartValues::Entries(std::mem::take(&mut g.values).into_iter().next().expect("one value set")),
    };
    let col_ids: Vec<u32> = col_ids.into_iter().map(key).collect();
    let own_ids = col_ids[..g.own].to_vec();
    let cols = g.columns();
    let input_adjacency = in_pieces.then(|| input::HostAdjacency {
        row_ptr: g.row_ptr.clone(),
        col_idx: g.col_idx.clone(),
        vals: match &vals {
            PartValues::Entries(v) => v.clone(),
            PartValues::Factored(r, c) => {
                input::entry_values(&g.row_ptr, &g.col_idx, r.as_deref(), c.as_deref())
            }
        },
        cols,
    });
    let sm = SparseMatrix::csr_only(g.own, cols, g.row_ptr, g.col_idx);
    // (factored values need no entry order: never built)
    let sm = match vals {
        PartValues::Factored(..) => sm.without_entry_order(),
        PartValues::Entries(_) => sm.with_transpose(),
    };
    let sm = sm.with_ids(own_ids, col_ids);
    let part = Part { graph, own: g.own, fetch: g.fetch, labels, split_rows, input_adjacency };
    (part, Some((sm, vals)))
}

/// Refuses a plan the host budget or the storage directory cannot hold, with the minimum.
/// What the named least host budget carries beyond the figures of the run that names it, so
/// that a rerun at the named budget is never refused: when the process's base was its resident
/// set sampled in `main`, fault-around moved it by up to a MiB between identical runs (204 then
/// 205 MiB, 2026-12-03). The base no longer moves ([`crate::process::mark_process_start`]: the
/// anonymous memory moved by 4 kB between runs here); the margin stays for what the heap's
/// timing may still move.
const BASE_DRIFT_BYTES: u64 = 2 << 20;

/// Refuses a host budget too small for what the process holds, the working set and the margin.
fn check_host_budget(plan: &Plan, tc: &TieredConfig) -> Result<(), TrainError> {
    if let (Some(h), None) = (tc.host_mem, tc.cache_bytes) {
        let need = plan.resident_bytes + plan.working_bytes + plan.margin_bytes;
        if need > h {
            return Err(TrainError::Memory(format!(
                "--host-mem {:.1} MiB is too small: the process already holds {:.1} MiB (dataset, partition graphs, model), the largest partition's working set is {:.1} MiB and the margin {:.1} MiB; needs at least {} MiB (or more --parts, for a smaller working set)",
                mib(h),
                mib(plan.resident_bytes),
                mib(plan.working_bytes),
                mib(plan.margin_bytes),
                mib(min_host_budget(plan.resident_bytes + plan.working_bytes + BASE_DRIFT_BYTES)).ceil() as u64
            )));
        }
    }
    Ok(())
}

/// Refuses a plan whose blocks outside the GPU tier ([`Plan::host_block_bytes`], those that
/// exist at once) the host cache and the storage directory cannot hold; whether block files
/// outlive their blocks' reads ([`check_storage`]).
fn check_blocks(plan: &Plan, tc: &TieredConfig, levers: &str) -> Result<bool, TrainError> {
    let need = plan.host_block_bytes.unwrap_or(plan.block_bytes);
    if let (Some(cache), None) = (plan.cache_bytes, &tc.storage_dir) {
        if cache < need {
            return Err(TrainError::Storage(format!(
                "the host cache holds {:.1} MiB of blocks (--host-mem less {:.1} MiB resident, a {:.1} MiB working set and a {:.1} MiB margin, or --block-cache), but the blocks outside the GPU tier need {:.1} MiB at once: give a --storage-dir to spill to, {levers}or more --host-mem",
                mib(cache),
                mib(plan.resident_bytes),
                mib(plan.working_bytes),
                mib(plan.margin_bytes),
                mib(need)
            )));
        }
    }
    if let (Some(_), Some(dir)) = (plan.cache_bytes, &tc.storage_dir) {
        let free = files::free_bytes(dir)
            .map_err(|e| TrainError::Storage(format!("storage directory {}: {e}", dir.display())))?;
        return check_storage(plan, free, dir, levers);
    }
    Ok(true)
}

/// Refuses a storage directory with less free space than the block files may take; whether
/// a block's file may outlive the block's read back into RAM. Kept, the files grow to every
/// block outside the host cache (an epoch cycles every block through it, and a block read
/// back clean keeps its file so that leaving again writes nothing): papers-like at scale 0.5
/// planned a 37 GiB spill into 40 GB of free disk and filled it 90 s into an epoch with 98 GiB
/// of files (H100, 2026-12-05). Where the disk holds the spill (what does not fit the cache,
/// and two of the largest blocks in flight) but not every block, each file goes once its block
/// is read (written again when the block leaves again); where it holds less, refused.
fn check_storage(plan: &Plan, free: u64, dir: &std::path::Path, levers: &str) -> Result<bool, TrainError> {
    let Some(cache) = plan.cache_bytes else { return Ok(true) };
    let need = plan.host_block_bytes.unwrap_or(plan.block_bytes);
    if need <= cache || free >= need {
        return Ok(true);
    }
    let spill = need - cache + 2 * plan.largest_block_bytes;
    if free >= spill {
        tracing::info!(
            "storage: {:.1} MiB free in {} holds the {:.1} MiB of blocks beyond the host cache but not every block's file ({:.1} MiB): each file is removed once its block is read back, and written again when the block leaves again",
            mib(free),
            dir.display(),
            mib(spill),
            mib(need)
        );
        return Ok(false);
    }
    Err(TrainError::Storage(format!(
        "storage directory {} has {:.1} MiB free, but the blocks beyond the {:.1} MiB host cache take {:.1} MiB (of {:.1} MiB of blocks outside the GPU tier at once): free space there, give a --storage-dir on a larger disk, {levers}or give more --gpu-mem or --host-mem",
        dir.display(),
        mib(free),
        mib(cache),
        mib(spill),
        mib(need)
    )))
}

/// The settings that would make the blocks fewer or smaller, for a refusal: bf16 blocks
/// (unless they are already), and no input dropout where it keeps layer 0 from running on its
/// aggregation computed once (papers-like at full size, GCN with 2 layers: 407 GiB of f32
/// blocks with the default input dropout, about 195 without; H100, 2026-12-06).
fn block_levers(plan: &Plan, model: &Model<impl Backend>, tc: &TieredConfig) -> String {
    let mut levers = String::new();
    if tc.tier_dtype == TierDtype::F32 {
        levers.push_str("halve the blocks with --tier-dtype bf16, ");
    }
    if let Some(without) = plan.block_bytes_without_input_dropout {
        levers.push_str(&format!(
            "train with --input-dropout 0 (with {}, layer 0 cannot run on its aggregation computed once: {:.1} MiB of blocks, {:.1} MiB without), ",
            model.config.input_dropout,
            mib(plan.block_bytes),
            mib(without)
        ));
    }
    levers
}

/// This rank's distribution state: which rank computes each partition (`owner`), the rows it
/// mirrors, and — told by each rank which of its rows that rank mirrors — the rows it sends.
fn dist_state<'a, B: Backend>(
    d: DistConfig<'a, B>,
    ranks: usize,
    owner: Vec<usize>,
    mirrors: std::collections::BTreeMap<usize, Vec<u32>>,
) -> DistState<'a, B> {
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
    DistState {
        comm: d.comm,
        groups: d.groups,
        device: d.device,
        reduce,
        layout,
        owner,
        mirrors,
        sends,
        stats: CommStats::default(),
    }
}

/// Which rank computes each of `parts` partitions (contiguous shares: rank r computes
/// partitions ⌈r·P/R⌉ .. ⌈(r+1)·P/R⌉) and `rank`'s own; refused where a rank or a partition
/// would have nothing (checked before anything is sized by `parts`).
fn shares(
    parts: usize,
    rank: usize,
    ranks: usize,
    nodes: usize,
) -> Result<(Vec<usize>, std::ops::Range<usize>), TrainError> {
    if parts < ranks {
        return Err(TrainError::Config(format!(
            "{parts} partitions for {ranks} ranks: every rank computes at least one (--parts {ranks} or more)"
        )));
    }
    if parts > nodes.max(1) {
        return Err(TrainError::Config(format!(
            "--parts {parts} is more than the graph's {nodes} nodes: every partition holds at least one node"
        )));
    }
    let owner: Vec<usize> = (0..parts).map(|p| p * ranks / parts).collect();
    let local = owner.iter().position(|&o| o == rank).unwrap_or(0)
        ..owner.iter().rposition(|&o| o == rank).map_or(0, |i| i + 1);
    Ok((owner, local))
}

#[cfg(test)]
#[path = "setup_tests.rs"]
mod tests;
