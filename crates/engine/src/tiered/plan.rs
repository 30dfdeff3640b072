//! The memory plan: what is resident, each partition's working set, the margins, and the rest
//! of the host budget for blocks; which blocks a model has.

use grinnder_nn::memory::Shape;
use grinnder_nn::Model;
use grinnder_tensor::Backend;
use serde::Serialize;

use super::part::Part;
use super::settings::TieredConfig;
use super::store::{BlockId, BlockKind, CacheMode};

/// How the memory plan divided the host budget.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Plan {
    /// Bytes resident outside the store (graph structures, model, process) when the plan was made.
    pub resident_bytes: u64,
    /// Largest per-partition working set on the host (gathered inputs, layer temporaries; where
    /// the layers run on a device, the backend's staging buffers) and, with a
    /// storage tier, two of the largest blocks (the one in use, which the store holds beyond
    /// its budget, and a block's file buffer: read into, decoded, kept for the next read).
    pub working_bytes: u64,
    /// The same in the backend's memory, layer by layer as the kernels hold their matrices
    /// ([`device_elems`]); budgets there are checked at every allocation. Temporaries below a
    /// matrix (split-K partials, score buffers) are left to the margin.
    pub device_working_bytes: u64,
    pub margin_bytes: u64,
    /// Host cache budget for blocks (`None`: unlimited).
    pub cache_bytes: Option<u64>,
    pub mode: CacheMode,
    /// Whole-run activation and gradient bytes (what the cache would need to hold everything).
    pub block_bytes: u64,
    /// The most bytes of blocks outside the GPU tier that exist at once, as the schedule makes
    /// and removes them ([`Executor::peak_host_block_bytes`]; set once the GPU tier is placed):
    /// what the host cache and storage must hold together.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_block_bytes: Option<u64>,
    /// The largest block's bytes.
    pub largest_block_bytes: u64,
    /// What `block_bytes` would be without input dropout, where it alone keeps layer 0 from
    /// running on its aggregation computed once and that takes fewer blocks (GCN: the
    /// features, layer 1's input and its gradient need none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub block_bytes_without_input_dropout: Option<u64>,
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

/// See [`Executor::keeps_features`].
pub(super) fn keeps_features<B: Backend>(model: &Model<B>, pre: bool) -> bool {
    !pre || model.reads_input_beside_pre()
}

/// See [`Executor::fusible`].
pub(super) fn fusible<B: Backend>(model: &Model<B>, pre: bool) -> bool {
    let layer1 = !model.split(1, false) || !model.split_reads_own_input(1);
    pre && !model.reads_input_beside_pre() && model.layers() >= 2 && layer1
}

/// See [`Executor::fused_transform`]: layer 0 inside an unsplit layer 1 (over its columns),
/// and a layer 2 that runs split and reads only its transformed rows.
pub(super) fn transform_fusible<B: Backend>(model: &Model<B>, pre: bool) -> bool {
    fusible(model, pre)
        && model.layers() >= 3
        && !model.split(1, false)
        && model.split(2, false)
        && !model.split_reads_own_input(2)
}

/// The kinds of block an epoch makes, as (kind, layer, width), in [`Executor::block_list`]'s
/// order; without `grads` (forward passes alone: [`TieredConfig::inference`]) no gradient's.
pub(super) fn block_kinds<B: Backend>(
    model: &Model<B>,
    pre: bool,
    fused: bool,
    grads: bool,
) -> Vec<(BlockKind, usize, usize)> {
    let layers = model.layers();
    let split: Vec<usize> = (0..layers).filter(|&l| model.split(l, l == 0 && pre)).collect();
    let first_hidden = if fused { 2 } else { 1 };
    // layer 2's input and its gradient are no blocks where its transform runs inside layer 1
    let inside = fused && transform_fusible(model, pre);
    let hidden = (first_hidden..layers).filter(|&l| !(inside && l == 2));
    // GCNII's x0 first: read (and its gradient added to) by every layer after the first
    let mut kinds: Vec<(BlockKind, usize)> = Vec::new();
    if model.has_initial() && layers > 1 {
        kinds.push((BlockKind::Initial, 0));
        if grads {
            kinds.push((BlockKind::GradInitial, 0));
        }
    }
    kinds.extend(hidden.clone().map(|l| (BlockKind::Act, l)));
    kinds.extend(split.iter().map(|&l| (BlockKind::Xw, l)));
    if grads {
        kinds.extend(split.iter().map(|&l| (BlockKind::GradXw, l)));
    }
    if pre {
        kinds.push((BlockKind::Pre, 0));
    }
    if keeps_features(model, pre) {
        kinds.push((BlockKind::Act, 0));
    }
    if grads {
        kinds.extend(hidden.map(|l| (BlockKind::Grad, l)));
    }
    kinds.into_iter().map(|(kind, layer)| (kind, layer, block_width(model, kind, layer))).collect()
}

/// Row width of the `kind` blocks of layer `l`: a split layer's transformed rows (and their
/// gradient) are as wide as its output, the initial representation as the hidden layers, the
/// rest as the layer's input.
pub(super) fn block_width<B: Backend>(model: &Model<B>, kind: BlockKind, l: usize) -> usize {
    match kind {
        BlockKind::Xw | BlockKind::GradXw => model.dim(l + 1),
        BlockKind::Initial | BlockKind::GradInitial => model.dim(1),
        BlockKind::Act | BlockKind::Grad | BlockKind::Pre => model.dim(l),
    }
}

pub(super) fn act(layer: usize, part: usize) -> BlockId {
    BlockId { kind: BlockKind::Act, layer, part }
}

/// The most elements partition `p`'s layers hold at once in the backend's memory, layer by
/// layer as the executor runs them: the inputs it gathers (the columns' rows; on layer 0's
/// precomputed aggregation its own rows, and the next partition's page-locked own rows
/// uploaded ahead) beside what the model's layers hold ([`Model::layer_held`],
/// [`Model::split_held`], [`Model::fused_held`]). Gathering halo rows from both tiers holds
/// the staged host rows beside the gathered matrix. Layer 0 counts unfused too: the GPU
/// tier may end the fusion ([`Executor::unfuse_if_fits`]). Beside every layer, what the CUDA
/// backend's sparse products hold: a product through the transposed structure on cuSPARSE
/// permutes the values first (one per entry), and the first product of a shape that adds to
/// its output is timed on a copy of it ([`Model::accumulating_product`]; measured on an H200,
/// 2026-12-04: without these the plan fell 128 MiB short in a 256-wide GCN's hidden layer and
/// 1.1 GiB short in SAGE's first epoch).
pub(super) fn device_elems<B: Backend>(model: &Model<B>, p: &Part<B>, pre: bool, fused: bool) -> u64 {
    let s = Shape { rows: p.own as u64, cols: p.graph.cols as u64, nnz: p.graph.nnz() as u64 };
    let own = Shape { cols: s.rows, ..s };
    let d = |l: usize| model.dim(l) as u64;
    // layer 0's own-row inputs (its aggregation, and the input rows where read beside it),
    // with the next partition's uploaded ahead
    let pre_inputs = 2 * s.rows * d(0) * if model.reads_input_beside_pre() { 2 } else { 1 };
    // the initial representation's own rows and its gradient's beside a layer (GCNII's)
    let initial = if model.has_initial() && model.layers() > 1 { 2 * s.rows * d(1) } else { 0 };
    let products = |l: usize| {
        let on_pre = l == 0 && pre;
        s.nnz + model.accumulating_product(l, if on_pre { own } else { s }, on_pre)
    };
    (0..model.layers())
        .map(|l| match (l, model.split(l, l == 0 && pre)) {
            (1, true) if fused => {
                // layer 0's inputs beside layer 1's transform gradient, each with the next
                // partition's uploaded ahead
                let fused = pre_inputs + 2 * s.rows * d(2) + model.fused_held(own);
                fused.max(model.split_held(1, s))
            }
            (l, true) => model.split_held(l, s) + if l == 0 { s.rows * d(0) } else { 0 },
            (1, false) if fused => {
                // layer 0 over the columns ([`Executor::columns_steps`]): its input and output
                // rows and its tape's copy of the output beside layer 1, then its backward;
                // with layer 2's transform inside, its rows and their gradient's (and the
                // next partition's, read ahead)
                let columns = Shape { rows: s.cols, ..s };
                let inside = if transform_fusible(model, pre) { 3 * s.rows * d(3) } else { 0 };
                s.cols * (d(0) + 2 * d(1))
                    + inside
                    + model.layer_held(1, s, false).max(model.layer_held(0, columns, true))
            }
            (0, false) if pre => pre_inputs + model.layer_held(0, own, true),
            (l, false) => (s.cols * d(l) + initial + model.layer_held(l, s, false)).max(2 * s.cols * d(l)),
        } + products(l))
        .max()
        .unwrap_or(0)
}

/// The most elements a partition's largest transfer between the host and a device holds (`own`
/// rows, `cols` columns), as the executor moves blocks of the host's store (its page-locked blocks the device reads and
/// writes itself): per layer, the rows it gathers (the columns' rows; on layer 0's precomputed
/// aggregation the own rows) at the width it gathers them (a split layer's output width: it
/// aggregates the transformed rows), and what it writes back (a split layer's gradient of the
/// transformed rows over the columns, its input gradient over the own rows; else the input
/// gradient over the columns, the output over the own rows).
pub(super) fn staged_elems<B: Backend>(model: &Model<B>, own: u64, cols: u64, pre: bool) -> u64 {
    let d = |l: usize| model.dim(l) as u64;
    (0..model.layers())
        .map(|l| {
            let rows = if l == 0 && pre { own } else { cols };
            if model.split(l, l == 0 && pre) {
                (rows * d(l + 1)).max(own * d(l))
            } else {
                (rows * d(l)).max(own * d(l + 1))
            }
        })
        .max()
        .unwrap_or(0)
}

/// Splits the host budget: what is resident now, a working set for the largest partition, a
/// margin, and the rest for the block cache; picks the cache mode for `Auto`. Where the layers
/// run on a `device`, the host's working set is the backend's staging ([`staged_elems`]), not
/// the layers' matrices: counting those on the host too (six over the columns) left papers-like
/// at scale 0.5 under `--gpu-mem 48GiB` 27 GiB of 118 for nothing and spilled blocks to a disk
/// they did not fit (H100, 2026-12-05).
pub(super) fn make_plan<B: Backend>(
    model: &Model<B>,
    parts: &[Part<B>],
    tc: &TieredConfig,
    elem: usize,
    pre: bool,
    mapped_bytes: u64,
    device: bool,
) -> Plan {
    let elem_tier = tc.tier_dtype.bytes(elem) as u64;
    let layers = model.layers();
    // layer 0 on its precomputed aggregation reads own rows only: its input width counts over
    // the own rows, not over the columns
    let first = usize::from(pre);
    let (pre_width, out_width) = if pre { (model.dim(0) as u64, model.dim(1) as u64) } else { (0, 0) };
    let fused = fusible(model, pre);
    let transform_inside = transform_fusible(model, pre);
    let heads = model.edge_width() as u64;
    let nodes: u64 = parts.iter().map(|p| p.own as u64).sum();
    // per partition and layer: the gathered input, the layer's temporaries and its input
    // gradient, about six matrices over the partition's columns — of the input's width, or of
    // the output's where the layer runs split (transform first: its input is read over the own
    // rows only, three matrices of them); plus GAT's per-edge attention arrays
    let (working_bytes, device_working_bytes) = parts
        .iter()
        .map(|p| {
            let nnz = p.graph.nnz() as u64;
            // layer 0 on `Â x` works on own rows: this partition's `Â x` rows and the next's
            // (uploaded ahead), and (run inside layer 1) its output, that output's gradient and
            // their temporaries; making `Â x` reads the input rows of the columns. Layers run
            // one at a time: the largest of these counts.
            let (own, cols) = (p.own as u64, p.graph.cols as u64);
            let layer0_over = |rows: u64| rows * pre_width + 4 * rows * out_width;
            let layer0_host = layer0_over(own);
            // making `Â x`: the output and the input rows of its columns — one piece of them
            // beside the pieces' entries (row, column, value: 16 bytes each, and one piece's
            // CSR copy), or all at once: then the host holds this partition's input rows and
            // the next's (read meanwhile; on a GPU both in page-locked blocks sized for the
            // largest)
            let (setup, device_setup, pieces) = match &p.input_adjacency {
                Some(a) => {
                    let rows = super::input::piece_rows(pre_width as usize, elem) as u64;
                    let setup = (own + cols.min(rows)) * pre_width;
                    (setup, setup, 28 * a.col_idx.len() as u64)
                }
                None => ((2 * cols + own) * pre_width, (cols + own) * pre_width, 0),
            };
            let layer = |l: usize| {
                let (i, o) = (model.dim(l) as u64, model.dim(l + 1) as u64);
                // (inside layer 1 unsplit, over its columns)
                let layer0_rows = if model.split(1, false) { own } else { cols };
                let own_layer0 = if l == 1 && fused { layer0_over(layer0_rows) } else { 0 };
                // and layer 2's transform inside it: its rows, their gradient's and the next
                // partition's read ahead
                let inside = if l == 1 && transform_inside { 3 * own * model.dim(3) as u64 } else { 0 };
                let this = if model.split(l, l == 0 && pre) {
                    3 * cols * o + 2 * own * i
                } else {
                    // (and GCNII's x0 and its gradient, own rows)
                    let initial = model.has_initial() && layers > 1;
                    6 * cols * i.max(o) + if initial { 2 * own * model.dim(1) as u64 } else { 0 }
                };
                this + own_layer0 + inside
            };
            let (setup, device_setup) = (setup * elem as u64 + pieces, device_setup * elem as u64 + pieces);
            let device_held = (device_elems(model, p, pre, fused) * elem as u64).max(device_setup);
            if device {
                // the layers' matrices are the device's; the host holds the backend's two
                // staging buffers, each grown to half again the largest transfer it passed
                return ((3 * staged_elems(model, own, cols, pre) * elem as u64).max(setup), device_held);
            }
            let host = (first..layers).map(layer).max().unwrap_or(0).max(layer0_host);
            let attention = 4 * nnz * heads * elem as u64;
            ((host * elem as u64 + attention).max(setup), device_held)
        })
        .fold((0, 0), |(h, d), (ph, pd)| (h.max(ph), d.max(pd)));
    let layer_bytes = |l: usize| nodes * model.dim(l) as u64 * elem_tier;
    let (block_bytes, block_bytes_without_input_dropout, largest_block) =
        block_figures(model, parts, pre, elem_tier, !tc.inference);
    let largest = (1..layers).map(layer_bytes).max().unwrap_or(0);
    let working_bytes = working_bytes + if tc.storage_dir.is_some() { 2 * largest_block } else { 0 };
    let resident_bytes = crate::process::held_bytes(mapped_bytes);
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
        host_block_bytes: None,
        largest_block_bytes: largest_block,
        block_bytes_without_input_dropout,
        device: None,
    }
}

/// Every block an epoch makes (a forward pass, without `grads`), all at once (an upper bound: spent blocks go, see
/// [`Plan::host_block_bytes`]), with layer 0 inside layer 1 where it can be (a GPU tier that
/// undoes that holds those blocks); the same without input dropout, where it alone keeps layer
/// 0 from its aggregation computed once and that takes fewer blocks; and the largest block.
fn block_figures<B: Backend>(
    model: &Model<B>,
    parts: &[Part<B>],
    pre: bool,
    elem_tier: u64,
    grads: bool,
) -> (u64, Option<u64>, u64) {
    let nodes: u64 = parts.iter().map(|p| p.own as u64).sum();
    let blocks_of = |pre: bool| -> u64 {
        block_kinds(model, pre, fusible(model, pre), grads)
            .iter()
            .map(|&(_, _, d)| nodes * d as u64 * elem_tier)
            .sum()
    };
    let block_bytes = blocks_of(pre);
    let unfused_by_dropout =
        !pre && model.config.input_dropout > 0.0 && !model.weighs_entries() && runs_on_pre(model, true);
    // (SAGE keeps its features beside the aggregation: no fewer blocks)
    let without = unfused_by_dropout.then(|| blocks_of(true)).filter(|&without| without < block_bytes);
    // with a storage tier the store holds one block beyond its budget (the one in use), and
    // reading a block holds its file buffer (kept for the next read) beside the decoded
    // block: two of the largest
    let widest = block_kinds(model, pre, fusible(model, pre), grads).iter().map(|&(_, _, d)| d as u64).max();
    let largest_block =
        parts.iter().map(|p| p.own as u64).max().unwrap_or(0) * widest.unwrap_or(0) * elem_tier;
    (block_bytes, without, largest_block)
}

/// Whether layer 0 runs on its input's aggregation computed once (given no input dropout
/// where `dropout_aside`): the model precomputes it, and it is no wider than layer 0's output
/// (aggregating the narrower side) or layer 0 reads nothing else (then it replaces the
/// features). Wider inputs of a layer that also reads them (SAGE's root term) run layer 0
/// split instead, which spares a second set of blocks as large as the features.
pub(super) fn runs_on_pre<B: Backend>(model: &Model<B>, dropout_aside: bool) -> bool {
    let precomputes = if dropout_aside { !model.weighs_entries() } else { model.precomputes_input() };
    precomputes && (model.dim(0) <= model.dim(1) || !model.reads_input_beside_pre())
}

pub(super) const GIB: f64 = (1u64 << 30) as f64;

/// The plan keeps 1 / 20 (5 %) of a memory budget free: of `--gpu-mem` for the allocations
/// its model does not count, of `--host-mem` as well, but there at least
/// [`HOST_MARGIN_MIN_BYTES`].
pub(super) const MARGIN_DIVISOR: u64 = 20;

/// The least host margin: the allocator's slack (memory of freed blocks not yet back with the
/// kernel, fragmentation) and what lives outside the counted heap (thread stacks, the C
/// allocations of METIS and io_uring) took 13–18 MiB beyond the counted figures on the 2-core
/// machine (arxiv-like at scale 0.5, 4 and 8 partitions, 2026-12-01).
pub(super) const HOST_MARGIN_MIN_BYTES: u64 = 32 << 20;

/// The margin kept free of a host budget of `h` bytes.
pub(super) fn host_margin(h: u64) -> u64 {
    (h / MARGIN_DIVISOR).max(HOST_MARGIN_MIN_BYTES)
}

/// The smallest host budget `h` with `need + host_margin(h) <= h`.
pub(super) fn min_host_budget(need: u64) -> u64 {
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
pub(super) fn mib(bytes: u64) -> f64 {
    bytes as f64 / 1048576.0
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A plain model of `family` (no dropout, norm or residual; one head), `layers` deep.
    pub(in crate::tiered) fn model_config(
        family: &str,
        layers: usize,
        hidden: usize,
    ) -> grinnder_nn::ModelConfig {
        grinnder_nn::ModelConfig {
            // (the engine names no family: .ci/run)
            kind: serde_json::from_str(&format!("\"{family}\"")).expect("a family"),
            layers,
            hidden,
            dropout: 0.0,
            input_dropout: 0.0,
            norm: grinnder_nn::Norm::None,
            residual: false,
            heads: 1,
            attn_dropout: 0.0,
            gin_eps: 0.0,
            train_eps: false,
            alpha: grinnder_nn::model::DEFAULT_ALPHA,
            theta: grinnder_nn::model::DEFAULT_THETA,
            seed: 0,
        }
    }

    fn gcn(layers: usize) -> Model<grinnder_tensor::Cpu<f32>> {
        Model::init(&grinnder_tensor::Cpu::new(), model_config("gcn", layers, 256), 128, 172)
    }

    /// papers-like at scale 0.5 over 32 partitions, GCN-256 with 2 layers on layer 0's
    /// precomputed aggregation: layer 1 runs split (256 → 172), so the largest transfer is its
    /// transformed rows over the columns, 172 wide; layer 0 moves own rows only. A device run's
    /// host working set is two staging buffers of half again that: 9.0 GiB, where counting the
    /// layers' six matrices over the columns on the host asked for 27 GiB.
    #[test]
    fn a_device_runs_host_working_set_is_its_staging() {
        let (own, cols) = (1_790_000u64, 4_700_000u64);
        let m = gcn(2);
        assert!(m.split(1, false) && !m.split(0, true));
        assert_eq!(staged_elems(&m, own, cols, true), cols * 172);
        // without the precomputed aggregation layer 0 gathers its 128-wide input over the
        // columns, narrower than its 256-wide output over the own rows here
        assert_eq!(staged_elems(&m, own, cols, false), (cols * 172).max(cols * 128).max(own * 256));
        // three layers: the hidden layer (256 → 256, not split) gathers 256-wide columns
        let m3 = gcn(3);
        assert_eq!(staged_elems(&m3, own, cols, true), cols * 256);
        let gib = 3.0 * staged_elems(&m, own, cols, true) as f64 * 4.0 / (1u64 << 30) as f64;
        assert!((8.9..9.1).contains(&gib), "{gib}");
    }

    #[test]
    pub(super) fn the_least_host_budget_is_the_least_that_leaves_its_margin() {
        for need in [0, 1, 1 << 20, 100 << 20, 607 << 20, 640 << 20, 641 << 20, 10 << 30, (10 << 30) + 7] {
            let h = min_host_budget(need);
            assert!(need + host_margin(h) <= h, "need {need}: {h} leaves no margin");
            assert!(need + host_margin(h - 1) > h - 1 || h - 1 < need, "need {need}: {} would do", h - 1);
        }
    }
}
