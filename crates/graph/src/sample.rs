//! Mini-batch samplers (GraphSAGE neighbour sampling, ShaDow k-hop subgraphs), parallel and
//! deterministic: every random choice is a function of (seed, batch key, layer, node), so a batch
//! is the same on any thread count.
//!
//! A neighbour-sampled batch is a stack of bipartite blocks, input layer first. Block `l` has
//! `rows` output nodes (the nodes layer `l` computes) and `cols` input nodes whose first `rows`
//! are the output nodes themselves, in the same order, followed by the newly reached neighbours
//! — the layout of a partition's graph in the tiered executor (own rows, then halo). Entries are
//! sampled in-neighbours (the graph is symmetric); self loops are not added here.

use rayon::prelude::*;

use crate::csr::Csr;
use crate::rng::Stream;

/// One layer's bipartite graph of a mini-batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Block {
    pub rows: usize,
    pub cols: usize,
    /// CSR over the rows, local column ids.
    pub row_ptr: Vec<u64>,
    pub col_idx: Vec<u32>,
    /// Global node ids of the columns (the first `rows` are the rows' nodes).
    pub col_ids: Vec<u32>,
    /// Each row's degree in the full graph (for estimators that rescale sampled sums).
    pub full_degree: Vec<u32>,
}

impl Block {
    /// Global ids of the rows.
    pub fn row_ids(&self) -> &[u32] {
        &self.col_ids[..self.rows]
    }

    pub fn nnz(&self) -> usize {
        self.col_idx.len()
    }
}

/// A mini-batch: the seed nodes and the blocks computing them, input layer first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MiniBatch {
    pub seeds: Vec<u32>,
    pub blocks: Vec<Block>,
}

impl MiniBatch {
    /// Global ids of the rows the first layer reads (its input features).
    pub fn input_nodes(&self) -> &[u32] {
        &self.blocks[0].col_ids
    }
}

/// GraphSAGE's uniform neighbour sampler: per layer, up to `fanout` distinct neighbours of each
/// node, without replacement (`-1`: all of them).
#[derive(Clone, Debug)]
pub struct NeighborSampler {
    /// Per hop from the seeds: `fanouts[0]` for the seeds' neighbours (the output layer),
    /// `fanouts[1]` for theirs, … (PyG's `num_neighbors` order).
    pub fanouts: Vec<i64>,
    pub seed: u64,
}

impl NeighborSampler {
    pub fn new(fanouts: Vec<i64>, seed: u64) -> NeighborSampler {
        assert!(!fanouts.is_empty(), "at least one layer");
        assert!(fanouts.iter().all(|&f| f == -1 || f > 0), "fanouts are positive or -1 (all)");
        NeighborSampler { fanouts, seed }
    }

    /// The batch computing `seeds` (distinct nodes); `key` tells batches apart (e.g. epoch and
    /// batch number).
    pub fn sample(&self, g: &Csr, seeds: &[u32], key: u64) -> MiniBatch {
        self.sample_with(g, seeds, key, &mut Scratch::default())
    }

    /// [`NeighborSampler::sample`] reusing `scratch` between batches (no per-batch allocation
    /// of a node-sized map).
    pub fn sample_with(&self, g: &Csr, seeds: &[u32], key: u64, scratch: &mut Scratch) -> MiniBatch {
        let mut frontier: Vec<u32> = seeds.to_vec();
        let mut blocks = Vec::with_capacity(self.fanouts.len());
        for (hop, &fanout) in self.fanouts.iter().enumerate() {
            let block = self.sample_block(g, &frontier, fanout, [key, hop as u64], scratch);
            frontier = block.col_ids.clone();
            blocks.push(block);
        }
        blocks.reverse();
        MiniBatch { seeds: seeds.to_vec(), blocks }
    }

    /// One block: the rows are `dst`; each samples its neighbours in parallel, straight into
    /// its span of one flat list (the spans' sizes are known first), then the new columns get
    /// local ids in order of first appearance (sequential, so deterministic).
    fn sample_block(&self, g: &Csr, dst: &[u32], fanout: i64, key: [u64; 2], scratch: &mut Scratch) -> Block {
        let (ptr, idx) = (g.row_ptr(), g.col_idx());
        let nbrs = |v: u32| &idx[ptr[v as usize] as usize..ptr[v as usize + 1] as usize];
        let take = |v: u32| if fanout < 0 { nbrs(v).len() } else { nbrs(v).len().min(fanout as usize) };
        let mut row_ptr = Vec::with_capacity(dst.len() + 1);
        row_ptr.push(0u64);
        for (i, &v) in dst.iter().enumerate() {
            if let Some(&w) = dst.get(i + AHEAD) {
                prefetch(&ptr[w as usize]);
            }
            row_ptr.push(row_ptr[row_ptr.len() - 1] + take(v) as u64);
        }
        let mut picked = vec![0u32; row_ptr[dst.len()] as usize];
        let mut spans: Vec<&mut [u32]> = Vec::with_capacity(dst.len());
        let mut rest = picked.as_mut_slice();
        for w in row_ptr.windows(2) {
            let (span, tail) = rest.split_at_mut((w[1] - w[0]) as usize);
            spans.push(span);
            rest = tail;
        }
        // in runs of rows, each row's neighbour list requested a few rows ahead (its first
        // read is a cache miss otherwise: the lists lie anywhere in the graph)
        spans.par_chunks_mut(512).zip(dst.par_chunks(512)).for_each(|(outs, vs)| {
            for (i, (out, &v)) in outs.iter_mut().zip(vs).enumerate() {
                if let Some(&w) = vs.get(i + AHEAD) {
                    prefetch(&ptr[w as usize]);
                }
                if let Some(&w) = vs.get(i + AHEAD / 2) {
                    // up to four cache lines of the list
                    nbrs(w).chunks(16).take(4).for_each(prefetch);
                }
                let all = nbrs(v);
                if out.len() == all.len() {
                    out.copy_from_slice(all);
                } else {
                    let mut s = Stream::new(&[self.seed, key[0], key[1], v as u64]);
                    choose_into(all.len(), &mut s, out);
                    out.iter_mut().for_each(|i| *i = all[*i as usize]);
                }
            }
        });
        let local = scratch.map(g.num_nodes());
        let mut col_ids = dst.to_vec();
        for (i, &v) in dst.iter().enumerate() {
            assert_eq!(local[v as usize], u32::MAX, "seeds are distinct");
            local[v as usize] = i as u32;
        }
        // the picks in row order become local column ids (the offsets stay)
        let mut col_idx = picked;
        for i in 0..col_idx.len() {
            if let Some(&w) = col_idx.get(i + AHEAD) {
                prefetch(&local[w as usize]);
            }
            let u = &mut col_idx[i];
            let slot = &mut local[*u as usize];
            if *slot == u32::MAX {
                *slot = col_ids.len() as u32;
                col_ids.push(*u);
            }
            *u = *slot;
        }
        // leave the map empty for the next block
        for &u in &col_ids {
            local[u as usize] = u32::MAX;
        }
        let full_degree = dst.iter().map(|&v| (ptr[v as usize + 1] - ptr[v as usize]) as u32).collect();
        Block { rows: dst.len(), cols: col_ids.len(), row_ptr, col_idx, col_ids, full_degree }
    }
}

/// How many random reads ahead the samplers request (see [`prefetch`]).
const AHEAD: usize = 16;

/// Asks the CPU to bring `x`'s first cache line closer: the samplers' reads (neighbour lists,
/// node-indexed maps) go to random places of arrays far larger than the caches, so each would
/// wait for memory; requested some iterations ahead, they arrive while earlier ones compute.
/// A hint only: it changes no result.
#[inline(always)]
pub fn prefetch<T: ?Sized>(x: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch reads nothing the program sees; `x` is a valid reference anyway.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>((x as *const T).cast::<i8>());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = x;
}

/// CSR offsets and columns of rows given one by one.
pub(crate) fn concat_rows(rows: Vec<Vec<u32>>) -> (Vec<u64>, Vec<u32>) {
    let mut row_ptr = Vec::with_capacity(rows.len() + 1);
    row_ptr.push(0u64);
    let mut col_idx = Vec::with_capacity(rows.iter().map(Vec::len).sum());
    for r in rows {
        col_idx.extend(r);
        row_ptr.push(col_idx.len() as u64);
    }
    (row_ptr, col_idx)
}

/// A node-indexed map reused across blocks and batches (local ids; `u32::MAX`: absent).
#[derive(Default)]
pub struct Scratch {
    local: Vec<u32>,
}

impl Scratch {
    fn map(&mut self, n: usize) -> &mut [u32] {
        if self.local.len() != n {
            self.local = vec![u32::MAX; n];
        }
        &mut self.local
    }
}

/// `k` distinct positions of `0..n` (k < n) in increasing order: Floyd's algorithm.
pub(crate) fn choose(n: usize, k: usize, s: &mut Stream) -> Vec<usize> {
    let mut out = vec![0u32; k];
    choose_into(n, s, &mut out);
    out.into_iter().map(|i| i as usize).collect()
}

/// [`choose`] of `out.len()` positions into `out` (n below 2^32).
fn choose_into(n: usize, s: &mut Stream, out: &mut [u32]) {
    let k = out.len();
    for (filled, j) in (n - k..n).enumerate() {
        let t = s.below(j as u64 + 1) as u32;
        out[filled] = if out[..filled].contains(&t) { j as u32 } else { t };
    }
    out.sort_unstable();
}

/// A ShaDow-GNN subgraph: the nodes within `hops` of the seeds (up to `fanout` neighbours per
/// node and hop, `-1`: all), with every edge of the full graph among them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Subgraph {
    /// Global ids, the seeds first.
    pub nodes: Vec<u32>,
    /// Distance from the nearest seed (0 for seeds), per node.
    pub hop: Vec<u8>,
    /// CSR over `nodes` with local ids: the node-induced subgraph.
    pub row_ptr: Vec<u64>,
    pub col_idx: Vec<u32>,
    pub seeds: usize,
}

impl Subgraph {
    /// Whether node `i` is within `h` hops of a seed (the per-hop masks).
    pub fn within(&self, i: usize, h: u8) -> bool {
        self.hop[i] <= h
    }
}

/// ShaDow's k-hop sampler: `fanouts[h]` neighbours per node at hop `h` (`-1`: all), as many
/// hops as fanouts.
#[derive(Clone, Debug)]
pub struct KHopSampler {
    pub fanouts: Vec<i64>,
    pub seed: u64,
}

impl KHopSampler {
    pub fn new(fanouts: Vec<i64>, seed: u64) -> KHopSampler {
        assert!(fanouts.iter().all(|&f| f == -1 || f > 0), "fanouts are positive or -1 (all)");
        KHopSampler { fanouts, seed }
    }

    /// The subgraph around `seeds` (distinct nodes).
    pub fn sample(&self, g: &Csr, seeds: &[u32], key: u64) -> Subgraph {
        self.sample_with(g, seeds, key, &mut Scratch::default())
    }

    /// [`KHopSampler::sample`] reusing `scratch` between batches.
    pub fn sample_with(&self, g: &Csr, seeds: &[u32], key: u64, scratch: &mut Scratch) -> Subgraph {
        let ns = NeighborSampler { fanouts: self.fanouts.clone(), seed: self.seed };
        let mut nodes: Vec<u32> = seeds.to_vec();
        let mut hop = vec![0u8; seeds.len()];
        let mut frontier = seeds.to_vec();
        for (h, &fanout) in self.fanouts.iter().enumerate() {
            let b = ns.sample_block(g, &frontier, fanout, [key, h as u64], scratch);
            // the block's new columns, less the nodes reached at earlier hops
            let local = scratch.map(g.num_nodes());
            for (i, &v) in nodes.iter().enumerate() {
                local[v as usize] = i as u32;
            }
            let mut next = Vec::new();
            for &u in &b.col_ids[b.rows..] {
                if local[u as usize] == u32::MAX {
                    local[u as usize] = (nodes.len() + next.len()) as u32;
                    next.push(u);
                }
            }
            for &v in nodes.iter().chain(&next) {
                local[v as usize] = u32::MAX;
            }
            nodes.extend(&next);
            hop.resize(nodes.len(), h as u8 + 1);
            frontier = next;
        }
        // the node-induced subgraph: every full-graph edge between kept nodes
        let local = scratch.map(g.num_nodes());
        for (i, &v) in nodes.iter().enumerate() {
            assert_eq!(local[v as usize], u32::MAX, "seeds are distinct");
            local[v as usize] = i as u32;
        }
        let (ptr, idx) = (g.row_ptr(), g.col_idx());
        let local: &[u32] = local;
        let rows: Vec<Vec<u32>> = nodes
            .par_iter()
            .map(|&v| {
                let mut r: Vec<u32> = idx[ptr[v as usize] as usize..ptr[v as usize + 1] as usize]
                    .iter()
                    .map(|&u| local[u as usize])
                    .filter(|&c| c != u32::MAX)
                    .collect();
                r.sort_unstable();
                r
            })
            .collect();
        let local = scratch.map(g.num_nodes());
        for &v in &nodes {
            local[v as usize] = u32::MAX;
        }
        let (row_ptr, col_idx) = concat_rows(rows);
        Subgraph { nodes, hop, row_ptr, col_idx, seeds: seeds.len() }
    }
}

impl Subgraph {
    /// The subgraph as the blocks of a `layers`-layer model (ShaDow): every layer but the last
    /// computes every node of the subgraph from the whole subgraph; the last computes the
    /// seeds (the first rows) only.
    pub fn into_batch(self, g: &Csr, layers: usize) -> MiniBatch {
        assert!(layers >= 1, "at least one layer");
        let ptr = g.row_ptr();
        let degree = |v: &u32| (ptr[*v as usize + 1] - ptr[*v as usize]) as u32;
        let n = self.nodes.len();
        let square = Block {
            rows: n,
            cols: n,
            full_degree: self.nodes.iter().map(degree).collect(),
            row_ptr: self.row_ptr,
            col_idx: self.col_idx,
            col_ids: self.nodes,
        };
        let s = self.seeds;
        let end = square.row_ptr[s] as usize;
        let top = Block {
            rows: s,
            cols: n,
            row_ptr: square.row_ptr[..=s].to_vec(),
            col_idx: square.col_idx[..end].to_vec(),
            col_ids: square.col_ids.clone(),
            full_degree: square.full_degree[..s].to_vec(),
        };
        let mut blocks = vec![square; layers - 1];
        blocks.push(top);
        MiniBatch { seeds: blocks[layers - 1].col_ids[..s].to_vec(), blocks }
    }
}
