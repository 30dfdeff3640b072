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

use std::path::PathBuf;
use std::time::Instant;

use grinnder_graph::{norm, Csr, Dataset};
use grinnder_nn::graph::Adjacency;
use grinnder_nn::{Graph, Kind as ModelKind, Model, ModelConfig};
use grinnder_partition::{partition_cached, Method, PartitionedGraph, Partitioning};
use grinnder_tensor::{Backend, Mat, Scalar, SparseMatrix};
use serde::Serialize;

pub use store::{BlockId, CacheMode, Kind, Store, StoreConfig, TierDtype, TierStats};

use crate::memory::{feature_shift, normalized, FeatureNorm, TrainError};

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
    /// Fault injection for tests: block-file writes after this many fail with ENOSPC.
    pub fail_writes_after: Option<usize>,
    /// The block cache size, overriding what the plan derives from `host_mem`.
    pub cache_bytes: Option<u64>,
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
            fail_writes_after: None,
            cache_bytes: None,
        }
    }
}

/// Seconds per phase of one epoch, with the store's counters.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct PhaseStats {
    pub gather_s: f64,
    pub compute_s: f64,
    pub write_back_s: f64,
    #[serde(flatten)]
    pub tier: TierStats,
}

/// How the memory plan divided the host budget.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Plan {
    /// Bytes resident outside the store (graph structures, model, process) when the plan was made.
    pub resident_bytes: u64,
    /// Largest per-partition working set (gathered inputs, layer temporaries).
    pub working_bytes: u64,
    pub margin_bytes: u64,
    /// Host cache budget for blocks (`None`: unlimited).
    pub cache_bytes: Option<u64>,
    pub mode: CacheMode,
    /// Whole-run activation and gradient bytes (what the cache would need to hold everything).
    pub block_bytes: u64,
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
    n_train: usize,
    /// Layer 0 runs on `Â x` precomputed per partition (GCN, SAGE without input dropout).
    pre: bool,
    pub partitioning: Partitioning,
    pub plan: Plan,
    stats: PhaseStats,
}

/// Features of `ids`, preprocessed (`shift` from [`feature_shift`]).
pub fn feature_rows<T: Scalar>(ds: &Dataset, norm: FeatureNorm, shift: f64, ids: &[u32]) -> Vec<T> {
    let d = ds.features.dim;
    let src: &[f32] = &ds.features.data;
    ids.iter().flat_map(|&v| normalized(&src[v as usize * d..(v as usize + 1) * d], norm, shift)).collect()
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
        crate::memory::check_dataset(ds)?;
        let model = Model::init(b, model_cfg.clone(), ds.features.dim, ds.num_classes as usize);
        let (partitioning, outcome) =
            partition_cached(&ds.graph, tc.parts, tc.method, tc.partition_cache.as_deref())
                .map_err(|e| TrainError::Partition(e.to_string()))?;
        tracing::debug!("partitioning: {outcome:?}");
        // the adjacency the model needs, with its whole-graph normalisation
        let (csr, vals): (Csr, Vec<f64>) = match model_cfg.kind {
            ModelKind::Gcn | ModelKind::Gat => {
                let looped = ds.graph.with_self_loops();
                let v = norm::gcn_norm(&looped);
                (looped, v)
            }
            ModelKind::Sage => (ds.graph.clone(), norm::mean_norm(&ds.graph)),
        };
        let pg = PartitionedGraph::build(&csr, &partitioning, &[&vals]);
        drop((csr, vals));
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
            let mut split_rows = split_rows;
            for s in &mut split_rows {
                s.sort_unstable();
            }
            let first = partitioning.ptr[q] as usize;
            let own_ids: Vec<u32> = partitioning.inv_perm[first..first + g.own].to_vec();
            let col_ids: Vec<u32> = own_ids
                .iter()
                .copied()
                .chain(g.halo.iter().map(|&h| partitioning.inv_perm[h as usize]))
                .collect();
            let labels: Vec<i32> = own_ids.iter().map(|&v| ds.labels[v as usize]).collect();
            let cols = g.columns();
            let sm = SparseMatrix::new(g.own, cols, g.row_ptr, g.col_idx).with_ids(own_ids, col_ids.clone());
            let adj = Adjacency::new(b, &sm, &g.values[0]);
            drop(sm);
            let (looped, plain) = match model_cfg.kind {
                ModelKind::Sage => (None, Some(adj)),
                _ => (Some(adj), None),
            };
            let graph = Graph { rows: g.own, cols, looped, plain, ids: Some(col_ids) };
            parts.push(Part { graph, own: g.own, fetch: g.fetch, labels, split_rows });
        }
        let pre = model_cfg.kind != ModelKind::Gat && model_cfg.input_dropout == 0.0;
        let plan = make_plan(&model, &parts, tc, std::mem::size_of::<B::T>());
        if let (Some(cache), None) = (plan.cache_bytes, &tc.storage_dir) {
            if cache < plan.block_bytes {
                return Err(TrainError::Storage(format!(
                    "--host-mem leaves {:.1} MiB for blocks after {:.1} MiB resident, {:.1} MiB working set and a {:.1} MiB margin, but the blocks need {:.1} MiB: give a --storage-dir to spill to, or more --host-mem",
                    cache as f64 / 1048576.0,
                    plan.resident_bytes as f64 / 1048576.0,
                    plan.working_bytes as f64 / 1048576.0,
                    plan.margin_bytes as f64 / 1048576.0,
                    plan.block_bytes as f64 / 1048576.0
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
                    free as f64 / 1048576.0,
                    spill as f64 / 1048576.0
                )));
            }
        }
        let store_cfg = StoreConfig {
            budget: plan.cache_bytes,
            mode: plan.mode,
            dtype: tc.tier_dtype,
            fail_writes_after: tc.fail_writes_after,
        };
        let store = Store::new(store_cfg, tc.storage_dir.as_deref(), tc.keep_storage).map_err(io_err)?;
        let mut ex = Executor {
            b,
            model,
            parts,
            store,
            n_train: ds.splits.train.len(),
            pre,
            partitioning,
            plan,
            stats: PhaseStats::default(),
        };
        ex.load_features(ds, feature_norm)?;
        Ok(ex)
    }

    fn load_features(&mut self, ds: &Dataset, norm: FeatureNorm) -> Result<(), TrainError> {
        let min = feature_shift(ds, norm);
        let d = ds.features.dim;
        for q in 0..self.parts.len() {
            let first = self.partitioning.ptr[q] as usize;
            let ids = &self.partitioning.inv_perm[first..first + self.parts[q].own];
            let rows = feature_rows::<B::T>(ds, norm, min, ids);
            self.store.put(act(0, q), ids.len(), d, rows).map_err(io_err)?;
        }
        if self.pre {
            for q in 0..self.parts.len() {
                let x = self.gather(0, q, true)?;
                let agg = self.model.aggregate_input(self.b, &self.parts[q].graph, &x).expect("GCN or SAGE");
                drop(x);
                let m = self.b.download_owned(agg);
                self.store
                    .put(BlockId { kind: Kind::Pre, layer: 0, part: q }, m.rows, m.cols, m.data)
                    .map_err(io_err)?;
            }
        }
        self.store.take_stats();
        Ok(())
    }

    /// `(O_DIRECT, io_uring)` of the storage tier, `None` without one.
    pub fn store_direct_io(&self) -> Option<(bool, bool)> {
        self.store.direct_io()
    }

    /// Rows of the `kind` blocks of layer `l` for partition `q`: its own rows, then (with
    /// `halo`) its halo rows from their owners.
    fn gather_kind(&mut self, kind: Kind, l: usize, q: usize, halo: bool) -> Result<B::Mat, TrainError> {
        let t = Instant::now();
        let d = match kind {
            Kind::Xw | Kind::GradXw => self.model.dim(l + 1),
            _ => self.model.dim(l),
        };
        let part = &self.parts[q];
        let rows = if halo { part.graph.cols } else { part.own };
        let mut m = Mat::<B::T>::zeros(rows, d);
        let id = |p: usize| BlockId { kind, layer: l, part: p };
        let sources = part.fetch.iter().filter(|_| halo).map(|(s, _)| id(*s));
        self.store.pin(std::iter::once(id(q)).chain(sources));
        self.store.read_rows(id(q), None, &mut m.data[..part.own * d]).map_err(io_err)?;
        if halo {
            let mut at = part.own;
            for (src, idx) in &part.fetch {
                let out = &mut m.data[at * d..(at + idx.len()) * d];
                self.store.read_rows(id(*src), Some(idx), out).map_err(io_err)?;
                at += idx.len();
            }
        }
        self.store.unpin_all();
        let m = self.b.upload_owned(m);
        self.stats.gather_s += t.elapsed().as_secs_f64();
        Ok(m)
    }

    /// Layer `l`'s input rows of partition `q`: own rows, then (with `halo`) the halo rows.
    fn gather(&mut self, l: usize, q: usize, halo: bool) -> Result<B::Mat, TrainError> {
        self.gather_kind(Kind::Act, l, q, halo)
    }

    /// The inputs of layer `l` on partition `q`: the gathered rows and, at layer 0, `Â x`.
    fn inputs(&mut self, l: usize, q: usize) -> Result<(B::Mat, Option<B::Mat>), TrainError> {
        if l == 0 && self.pre {
            let x = self.gather(0, q, false)?;
            let p = self.gather_kind(Kind::Pre, 0, q, false)?;
            return Ok((x, Some(p)));
        }
        Ok((self.gather(l, q, true)?, None))
    }

    /// Whether layer `l` runs split (transform on own rows, then aggregate the narrower rows).
    fn split(&self, l: usize) -> bool {
        self.model.split(l, l == 0 && self.pre)
    }

    /// Own input rows a split layer needs besides `h` (SAGE's root term).
    fn split_own_input(&mut self, l: usize, q: usize) -> Result<Option<B::Mat>, TrainError> {
        if self.model.config.kind == ModelKind::Sage {
            Ok(Some(self.gather(l, q, false)?))
        } else {
            Ok(None)
        }
    }

    fn put(&mut self, kind: Kind, l: usize, q: usize, m: B::Mat) -> Result<(), TrainError> {
        let t = Instant::now();
        let m = self.b.download_owned(m);
        self.store.put(BlockId { kind, layer: l, part: q }, m.rows, m.cols, m.data).map_err(io_err)?;
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
            if self.split(l) {
                for q in 0..self.parts.len() {
                    let x = self.gather(l, q, false)?;
                    self.prefetch(Kind::Act, l, q + 1, false, &[])?;
                    let t = Instant::now();
                    let h = self.model.split_transform(b, l, &x);
                    drop(x);
                    self.stats.compute_s += t.elapsed().as_secs_f64();
                    self.put(Kind::Xw, l, q, h)?;
                }
                if top {
                    break;
                }
                for q in 0..self.parts.len() {
                    let h = self.gather_kind(Kind::Xw, l, q, true)?;
                    let x = self.split_own_input(l, q)?;
                    self.prefetch(Kind::Xw, l, q + 1, true, &[])?;
                    let t = Instant::now();
                    let (y, _) =
                        self.model.split_forward(b, &self.parts[q].graph, l, &h, x.as_ref(), train, epoch);
                    drop((h, x));
                    self.stats.compute_s += t.elapsed().as_secs_f64();
                    self.put(Kind::Act, l + 1, q, y)?;
                }
                continue;
            }
            if top {
                break;
            }
            for q in 0..self.parts.len() {
                let (x, pre) = self.inputs(l, q)?;
                self.prefetch(Kind::Act, l, q + 1, !(l == 0 && self.pre), &[])?;
                let t = Instant::now();
                let (y, tape) =
                    self.model.layer_forward(b, &self.parts[q].graph, l, &x, pre.as_ref(), train, epoch);
                drop((tape, x, pre));
                self.stats.compute_s += t.elapsed().as_secs_f64();
                self.put(Kind::Act, l + 1, q, y)?;
            }
        }
        Ok(())
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
        let b = self.b;
        let layers = self.model.layers();
        self.forward_layers(true, epoch)?;
        let (mut loss, mut correct) = (0.0, 0usize);
        for l in (0..layers).rev() {
            let top = l + 1 == layers;
            let next_grad: &[Kind] = if top { &[] } else { &[Kind::Grad] };
            if self.split(l) {
                // aggregation backward: dh of own rows here, of halo rows to their owners
                for q in 0..self.parts.len() {
                    let h = self.gather_kind(Kind::Xw, l, q, true)?;
                    let x = self.split_own_input(l, q)?;
                    self.prefetch(Kind::Xw, l, q + 1, true, next_grad)?;
                    let t = Instant::now();
                    let g = &self.parts[q].graph;
                    let (y, tape) = self.model.split_forward(b, g, l, &h, x.as_ref(), true, epoch);
                    drop(h);
                    self.stats.compute_s += t.elapsed().as_secs_f64();
                    let dy = self.output_grad(l, q, &y, &mut loss, &mut correct)?;
                    drop(y);
                    let t = Instant::now();
                    let g = &self.parts[q].graph;
                    let (dh, dx_root) = self.model.split_backward(b, g, l, x.as_ref(), tape, &dy, l > 0);
                    drop((dy, x));
                    self.stats.compute_s += t.elapsed().as_secs_f64();
                    let t = Instant::now();
                    self.write_back(Kind::GradXw, l, q, b.download_owned(dh))?;
                    if let Some(d) = dx_root {
                        self.write_back(Kind::Grad, l, q, b.download_owned(d))?;
                    }
                    self.stats.write_back_s += t.elapsed().as_secs_f64();
                }
                // transform backward, once every dh row is complete
                for q in 0..self.parts.len() {
                    let x = self.gather(l, q, false)?;
                    let dh = self.gather_kind(Kind::GradXw, l, q, false)?;
                    self.prefetch(Kind::Act, l, q + 1, false, &[Kind::GradXw])?;
                    let t = Instant::now();
                    let dx = self.model.split_transform_backward(b, l, &x, &dh, l > 0);
                    drop((x, dh));
                    self.stats.compute_s += t.elapsed().as_secs_f64();
                    if let Some(dx) = dx {
                        let t = Instant::now();
                        self.write_back(Kind::Grad, l, q, b.download_owned(dx))?;
                        self.stats.write_back_s += t.elapsed().as_secs_f64();
                    }
                }
                for q in 0..self.parts.len() {
                    self.store.remove(BlockId { kind: Kind::Xw, layer: l, part: q }).map_err(io_err)?;
                    self.store.remove(BlockId { kind: Kind::GradXw, layer: l, part: q }).map_err(io_err)?;
                }
            } else {
                let from_output = self.model.backward_from_output(l, l == 0 && self.pre);
                for q in 0..self.parts.len() {
                    let (x, pre) = self.inputs(l, q)?;
                    let next: &[Kind] = if from_output { &[Kind::Act, Kind::Grad] } else { next_grad };
                    self.prefetch(Kind::Act, l, q + 1, !(l == 0 && self.pre), next)?;
                    let dx = if from_output {
                        // the stored output is the ReLU/dropout mask: no recomputation
                        let out = self.gather(l + 1, q, false)?;
                        let dy = self.gather_kind(Kind::Grad, l + 1, q, false)?;
                        let t = Instant::now();
                        let tape =
                            self.model.tape_from_output(l, l == 0 && self.pre, epoch).expect("allowed");
                        let g = &self.parts[q].graph;
                        let dx = self.model.layer_backward(
                            b,
                            g,
                            l,
                            &x,
                            pre.as_ref(),
                            tape,
                            &dy,
                            l > 0,
                            Some(&out),
                        );
                        self.stats.compute_s += t.elapsed().as_secs_f64();
                        dx
                    } else {
                        let t = Instant::now();
                        let g = &self.parts[q].graph;
                        let (y, tape) = self.model.layer_forward(b, g, l, &x, pre.as_ref(), true, epoch);
                        self.stats.compute_s += t.elapsed().as_secs_f64();
                        let dy = self.output_grad(l, q, &y, &mut loss, &mut correct)?;
                        drop(y);
                        let t = Instant::now();
                        let g = &self.parts[q].graph;
                        let dx = self.model.layer_backward(b, g, l, &x, pre.as_ref(), tape, &dy, l > 0, None);
                        self.stats.compute_s += t.elapsed().as_secs_f64();
                        dx
                    };
                    drop((x, pre));
                    if let Some(dx) = dx {
                        let t = Instant::now();
                        self.write_back(Kind::Grad, l, q, b.download_owned(dx))?;
                        self.stats.write_back_s += t.elapsed().as_secs_f64();
                    }
                }
            }
            // layer l + 1's blocks are spent
            for q in 0..self.parts.len() {
                self.store.remove(BlockId { kind: Kind::Grad, layer: l + 1, part: q }).map_err(io_err)?;
                if !top {
                    self.store.remove(act(l + 1, q)).map_err(io_err)?;
                }
            }
        }
        self.store.sync().map_err(io_err)?;
        Ok((loss, correct))
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
        let Some(part) = self.parts.get(q) else { return Ok(()) };
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
        self.store.prefetch(ids).map_err(io_err)
    }

    /// Own rows of `dx` into partition `q`'s `kind` block of layer `l`; rows past the own ones
    /// (the halo) into their owners' blocks.
    fn write_back(&mut self, kind: Kind, l: usize, q: usize, dx: Mat<B::T>) -> Result<(), TrainError> {
        let d = dx.cols;
        let part = &self.parts[q];
        let id = |p: usize| BlockId { kind, layer: l, part: p };
        self.store.add_rows(id(q), part.own, d, None, &dx.data[..part.own * d]).map_err(io_err)?;
        let mut at = part.own;
        for (src, idx) in part.fetch.iter().take_while(|_| dx.rows > part.own) {
            let rows = self.parts[*src].own;
            let block = &dx.data[at * d..(at + idx.len()) * d];
            self.store.add_rows(id(*src), rows, d, Some(idx), block).map_err(io_err)?;
            at += idx.len();
        }
        Ok(())
    }

    /// Evaluation pass (no dropout): correct predictions on train, valid and test.
    pub fn evaluate(&mut self, epoch: u64) -> Result<[usize; 3], TrainError> {
        let b = self.b;
        self.forward_layers(false, epoch)?;
        let l = self.model.layers() - 1;
        let split = self.split(l);
        let mut correct = [0usize; 3];
        for q in 0..self.parts.len() {
            let y = if split {
                let h = self.gather_kind(Kind::Xw, l, q, true)?;
                let x = self.split_own_input(l, q)?;
                self.prefetch(Kind::Xw, l, q + 1, true, &[])?;
                let t = Instant::now();
                let (y, _) =
                    self.model.split_forward(b, &self.parts[q].graph, l, &h, x.as_ref(), false, epoch);
                self.stats.compute_s += t.elapsed().as_secs_f64();
                y
            } else {
                let (x, pre) = self.inputs(l, q)?;
                self.prefetch(Kind::Act, l, q + 1, !(l == 0 && self.pre), &[])?;
                let t = Instant::now();
                let (y, _) =
                    self.model.layer_forward(b, &self.parts[q].graph, l, &x, pre.as_ref(), false, epoch);
                self.stats.compute_s += t.elapsed().as_secs_f64();
                y
            };
            let part = &self.parts[q];
            for (k, rows) in part.split_rows.iter().enumerate() {
                correct[k] += b.count_correct(&y, &part.labels, rows);
            }
        }
        for q in 0..self.parts.len() {
            for layer in 1..self.model.layers() {
                self.store.remove(act(layer, q)).map_err(io_err)?;
            }
            self.store.remove(BlockId { kind: Kind::Xw, layer: l, part: q }).map_err(io_err)?;
        }
        self.store.sync().map_err(io_err)?;
        Ok(correct)
    }

    /// Phase times and store counters since the last call.
    pub fn take_stats(&mut self) -> PhaseStats {
        let mut s = std::mem::take(&mut self.stats);
        s.tier = self.store.take_stats();
        s
    }
}

fn act(layer: usize, part: usize) -> BlockId {
    BlockId { kind: Kind::Act, layer, part }
}

/// Splits the host budget: what is resident now, a working set for the largest partition, a
/// margin, and the rest for the block cache; picks the cache mode for `Auto`.
fn make_plan<B: Backend>(model: &Model<B>, parts: &[Part<B>], tc: &TieredConfig, elem: usize) -> Plan {
    let elem_tier = match tc.tier_dtype {
        TierDtype::F32 => elem,
        TierDtype::Bf16 => 2,
    } as u64;
    let layers = model.layers();
    let width = (0..=layers).map(|l| model.dim(l)).max().unwrap_or(1) as u64;
    let heads = if model.config.kind == ModelKind::Gat { model.config.heads.max(1) as u64 } else { 1 };
    let nodes: u64 = parts.iter().map(|p| p.own as u64).sum();
    // per partition: the gathered input, the layer's temporaries and its input gradient
    // (about six matrices of the widest layer over the partition's columns), plus GAT's
    // per-edge attention arrays
    let working_bytes = parts
        .iter()
        .map(|p| {
            let nnz = p.graph.looped.as_ref().or(p.graph.plain.as_ref()).map_or(0, |a| a.nnz) as u64;
            6 * p.graph.cols as u64 * width * elem as u64 + 4 * nnz * heads * elem as u64
        })
        .max()
        .unwrap_or(0);
    // activations of layers 0..L-1 plus one gradient layer and layer 0's aggregation
    let layer_bytes = |l: usize| nodes * model.dim(l) as u64 * elem_tier;
    let block_bytes: u64 = (0..layers).map(layer_bytes).sum::<u64>() * 2;
    let largest = (1..layers).map(layer_bytes).max().unwrap_or(0);
    let resident_bytes = crate::metrics::rss_bytes();
    let (cache_bytes, margin_bytes) = match tc.host_mem {
        _ if tc.cache_bytes.is_some() => (tc.cache_bytes, 0),
        None => (None, 0),
        Some(h) => {
            let margin = h / 20;
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
    Plan { resident_bytes, working_bytes, margin_bytes, cache_bytes, mode, block_bytes }
}
