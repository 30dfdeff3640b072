//! A multilevel starting point for the dependency-aware LPA: coarsen by size-constrained label
//! propagation (the clustering of KaHIP's coarsening, Meyerhenke, Sanders & Schulz 2014),
//! partition the coarsest graph by greedy growing, then project back level by level with
//! balanced edge-cut refinement. Label propagation from a random start stalls in local optima
//! whose halos are twice METIS's; from this start the halo objective only has to polish.
//!
//! Clustering, contraction, the initial tries and refinement use every core, and the result is
//! the same for a seed whatever the thread count ([`batches`]); memory is the coarse graphs
//! (each a fraction of the one before) and a few arrays of one entry per node.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use grinnder_graph::rng::hash_key;
use grinnder_graph::{progress, Csr};
use rayon::prelude::*;

/// A graph with node and edge weights; level 0 borrows the input CSR (weights 1).
struct Level<'a> {
    ptr: &'a [u64],
    adj: &'a [u32],
    edge_w: Option<&'a [u64]>,
    node_w: Option<&'a [u64]>,
}

impl Level<'_> {
    fn n(&self) -> usize {
        self.ptr.len() - 1
    }
    fn node_w(&self, v: usize) -> u64 {
        self.node_w.map_or(1, |w| w[v])
    }
    fn total_w(&self) -> u64 {
        self.node_w.map_or(self.n() as u64, |w| w.iter().sum())
    }
    fn edges(&self, v: usize) -> impl Iterator<Item = (usize, u64)> + '_ {
        let r = self.ptr[v] as usize..self.ptr[v + 1] as usize;
        let w = self.edge_w.map(|w| &w[r.clone()]);
        self.adj[r].iter().enumerate().map(move |(i, &u)| (u as usize, w.map_or(1, |w| w[i])))
    }
}

/// An owned coarse level.
struct Owned {
    ptr: Vec<u64>,
    adj: Vec<u32>,
    edge_w: Vec<u64>,
    node_w: Vec<u64>,
}

impl Owned {
    fn level(&self) -> Level<'_> {
        Level { ptr: &self.ptr, adj: &self.adj, edge_w: Some(&self.edge_w), node_w: Some(&self.node_w) }
    }
}

/// Sparse accumulator over `0..n` keys: dense values plus the list of touched keys.
struct Acc {
    value: Vec<u64>,
    touched: Vec<usize>,
}

impl Acc {
    fn new(n: usize) -> Acc {
        Acc { value: vec![0; n], touched: Vec::new() }
    }
    fn add(&mut self, k: usize, w: u64) {
        if self.value[k] == 0 {
            self.touched.push(k);
        }
        self.value[k] += w;
    }
    fn clear(&mut self) {
        for &k in &self.touched {
            self.value[k] = 0;
        }
        self.touched.clear();
    }
}

/// Nodes in a seeded pseudo-random order. (Blocks of consecutive ids in random order ran a
/// fifth faster on products-like, but left 2-4 % more halo volume.)
fn order(n: usize, seed: u64, salt: u64) -> Vec<u32> {
    let mut o: Vec<(u64, u32)> =
        (0..n as u32).into_par_iter().map(|v| (hash_key(&[seed, salt, v as u64]), v)).collect();
    o.par_sort_unstable();
    o.into_par_iter().map(|(_, v)| v).collect()
}

/// The batches a sweep visits `ord` in. Every node of a batch chooses against the labels as
/// they stood when the batch began (the batch's nodes in parallel); then the choices are
/// applied one by one in order, each checked against the weights as they are then. So a
/// sweep is deterministic for a seed whatever the thread count, and close to a sequential
/// sweep: a node sees every move of the batches before its own.
fn batches(ord: &[u32]) -> std::slice::Chunks<'_, u32> {
    ord.chunks((ord.len() / 8).max(2048))
}

/// The labels of one node's neighbours with the weight of the edges to each: open addressing
/// sized to the node's degree, in the order the labels were first met. (A dense array per
/// thread would be as large as the graph; sorting each neighbourhood took 12 of the 26 s of
/// products-like at 16 parts on two cores.)
#[derive(Default)]
struct Rating {
    keys: Vec<u32>,
    vals: Vec<u64>,
    used: Vec<u32>,
    mask: usize,
}

impl Rating {
    const EMPTY: u32 = u32::MAX;

    /// Empties the map and sizes it for `deg` labels.
    fn reset(&mut self, deg: usize) {
        for &i in &self.used {
            self.keys[i as usize] = Self::EMPTY;
        }
        self.used.clear();
        let size = (2 * deg).next_power_of_two().max(16);
        if self.keys.len() < size {
            self.keys = vec![Self::EMPTY; size];
            self.vals = vec![0; size];
        }
        self.mask = size - 1;
    }

    fn add(&mut self, key: u32, w: u64) {
        let mut i = ((key as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as usize & self.mask;
        loop {
            if self.keys[i] == key {
                self.vals[i] += w;
                return;
            }
            if self.keys[i] == Self::EMPTY {
                self.keys[i] = key;
                self.vals[i] = w;
                self.used.push(i as u32);
                return;
            }
            i = (i + 1) & self.mask;
        }
    }

    /// The labels of `v`'s neighbours under `label`, weighted.
    fn of(&mut self, g: &Level, label: &[u32], v: usize) -> &mut Self {
        self.reset(g.ptr[v + 1] as usize - g.ptr[v] as usize);
        for (u, w) in g.edges(v) {
            self.add(label[u], w);
        }
        self
    }

    fn entries(&self) -> impl Iterator<Item = (u32, u64)> + '_ {
        self.used.iter().map(|&i| (self.keys[i as usize], self.vals[i as usize]))
    }
}

/// Size-constrained label propagation: clusters of weight ≤ `cap`; returns compact cluster ids
/// and their count. Sweeps visit the nodes in [`batches`].
fn cluster(g: &Level, cap: u64, sweeps: usize, seed: u64, salt: u64) -> (Vec<u32>, usize) {
    let n = g.n();
    let mut label: Vec<u32> = (0..n as u32).collect();
    let mut weight: Vec<u64> = (0..n).map(|v| g.node_w(v)).collect();
    let ord = order(n, seed, salt);
    for _ in 0..sweeps {
        let mut moved = 0usize;
        for batch in batches(&ord) {
            let wants: Vec<u32> = batch
                .par_iter()
                .with_min_len(256)
                .map_init(Rating::default, |rating, &v| {
                    let v = v as usize;
                    let (own, wv) = (label[v], g.node_w(v));
                    let rating = rating.of(g, &label, v);
                    let stay = rating.entries().find(|&(l, _)| l == own).map_or(0, |(_, w)| w);
                    let mut best = (own, stay);
                    for (l, w) in rating.entries() {
                        if l != own && w > best.1 && weight[l as usize] + wv <= cap {
                            best = (l, w);
                        }
                    }
                    best.0
                })
                .collect();
            for (&v, &l) in batch.iter().zip(&wants) {
                let (v, own) = (v as usize, label[v as usize] as usize);
                let wv = g.node_w(v);
                if l as usize != own && weight[l as usize] + wv <= cap {
                    weight[own] -= wv;
                    weight[l as usize] += wv;
                    label[v] = l;
                    moved += 1;
                }
            }
        }
        if moved == 0 {
            break;
        }
    }
    // compact
    let mut id = vec![u32::MAX; n];
    let mut k = 0u32;
    for l in &mut label {
        if id[*l as usize] == u32::MAX {
            id[*l as usize] = k;
            k += 1;
        }
        *l = id[*l as usize];
    }
    (label, k as usize)
}

/// Clusters per task of [`contract`].
const CONTRACT_CHUNK: usize = 4096;

/// The graph of clusters: node weights summed, parallel edges merged, internal edges dropped.
///
/// Two passes over chunks of clusters in parallel: the first counts each cluster's distinct
/// neighbours, the second writes them straight into the coarse graph's arrays, each chunk into
/// its own range. Gathering the chunks' edges first and joining them after held the coarse
/// edges twice: on papers-like at scale 0.01 (32.3 M directed edges, 20.5 M coarse ones at the
/// first level) that copy was the partitioner's peak, 766 of its MiB (25 bytes per edge); the
/// second pass costs the merging again, a fraction of the level's clustering.
fn contract(g: &Level, cluster: &[u32], k: usize) -> Owned {
    let mut ptr_m = vec![0usize; k + 1];
    for &c in cluster {
        ptr_m[c as usize + 1] += 1;
    }
    for c in 0..k {
        ptr_m[c + 1] += ptr_m[c];
    }
    let mut members = vec![0u32; cluster.len()];
    let mut cursor = ptr_m.clone();
    for (v, &c) in cluster.iter().enumerate() {
        members[cursor[c as usize]] = v as u32;
        cursor[c as usize] += 1;
    }
    drop(cursor);
    // cluster c's neighbouring clusters and the weights of the edges to them, into `rating`
    let merge = |rating: &mut Rating, c: usize| -> u64 {
        let vs = &members[ptr_m[c]..ptr_m[c + 1]];
        // (distinct neighbours: at most one per edge, at most k)
        let edges: usize = vs.iter().map(|&v| (g.ptr[v as usize + 1] - g.ptr[v as usize]) as usize).sum();
        rating.reset(edges.min(k));
        let mut w = 0;
        for &v in vs {
            w += g.node_w(v as usize);
            for (u, ew) in g.edges(v as usize) {
                if cluster[u] as usize != c {
                    rating.add(cluster[u], ew);
                }
            }
        }
        w
    };
    let chunks = k.div_ceil(CONTRACT_CHUNK);
    let range = |i: usize| i * CONTRACT_CHUNK..((i + 1) * CONTRACT_CHUNK).min(k);
    // pass 1: degrees and node weights
    let (degree, node_w): (Vec<u64>, Vec<u64>) = (0..chunks)
        .into_par_iter()
        .map_init(Rating::default, |rating, i| {
            range(i)
                .map(|c| {
                    let w = merge(rating, c);
                    (rating.used.len() as u64, w)
                })
                .collect::<Vec<_>>()
        })
        .flatten_iter()
        .unzip();
    let mut ptr = Vec::with_capacity(k + 1);
    ptr.push(0u64);
    for d in &degree {
        ptr.push(ptr.last().copied().unwrap_or(0) + d);
    }
    drop(degree);
    let edges = ptr[k] as usize;
    let (mut adj, mut edge_w) = (vec![0u32; edges], vec![0u64; edges]);
    // pass 2: each chunk's edges into its own range of the arrays
    let mut parts = Vec::with_capacity(chunks);
    let (mut a, mut w) = (&mut adj[..], &mut edge_w[..]);
    for i in 0..chunks {
        let r = range(i);
        let len = (ptr[r.end] - ptr[r.start]) as usize;
        let (a0, a1) = std::mem::take(&mut a).split_at_mut(len);
        let (w0, w1) = std::mem::take(&mut w).split_at_mut(len);
        parts.push((r, a0, w0));
        (a, w) = (a1, w1);
    }
    parts.into_par_iter().for_each_init(Rating::default, |rating, (r, a, w)| {
        let mut at = 0;
        for c in r {
            merge(rating, c);
            for (cu, ew) in rating.entries() {
                (a[at], w[at]) = (cu, ew);
                at += 1;
            }
        }
    });
    Owned { ptr, adj, edge_w, node_w }
}

/// Greedy graph growing: partitions are filled one after the other from a seed node, always
/// taking the unassigned node most connected to the growing partition.
fn grow(g: &Level, parts: usize, seed: u64) -> Vec<u32> {
    let n = g.n();
    let total = g.total_w();
    let mut part = vec![u32::MAX; n];
    let mut conn = vec![0u64; n];
    let mut blocked = vec![false; n];
    let ord = order(n, seed, 1);
    let mut assigned_w = 0u64;
    for p in 0..parts as u32 {
        if p as usize == parts - 1 {
            for x in part.iter_mut().filter(|x| **x == u32::MAX) {
                *x = p;
            }
            break;
        }
        // the target keeps the remaining partitions equal
        let target = (total - assigned_w) / (parts as u64 - p as u64);
        let mut w = 0u64;
        let mut heap: BinaryHeap<(u64, Reverse<u32>)> = BinaryHeap::new();
        let mut touched: Vec<usize> = Vec::new();
        let mut next_seed = 0usize;
        while w < target {
            let v = match heap.pop() {
                Some((c, Reverse(v))) => {
                    let v = v as usize;
                    if part[v] != u32::MAX || blocked[v] || c != conn[v] {
                        continue; // stale entry
                    }
                    v
                }
                None => {
                    while next_seed < n
                        && (part[ord[next_seed] as usize] != u32::MAX || blocked[ord[next_seed] as usize])
                    {
                        next_seed += 1;
                    }
                    if next_seed == n {
                        break;
                    }
                    ord[next_seed] as usize
                }
            };
            if w > 0 && w + g.node_w(v) > target + target / 50 {
                // too heavy to fit: leave it to a later partition
                blocked[v] = true;
                touched.push(v);
                continue;
            }
            part[v] = p;
            w += g.node_w(v);
            for (u, ew) in g.edges(v) {
                if part[u] == u32::MAX && !blocked[u] {
                    if conn[u] == 0 {
                        touched.push(u);
                    }
                    conn[u] += ew;
                    heap.push((conn[u], Reverse(u as u32)));
                }
            }
        }
        for u in touched {
            conn[u] = 0;
            blocked[u] = false;
        }
        assigned_w += w;
    }
    part
}

/// Balanced edge-cut refinement: moves to the most connected partition with room, in
/// [`batches`]; an overweight partition sheds nodes even at a loss. The first sweep visits the
/// nodes `active` marks (all where `None`); each later sweep the nodes next to a move of the
/// one before, and those that wanted to move and found no room.
fn refine(g: &Level, part: &mut [u32], parts: usize, opts: Refine, active: Option<Vec<bool>>) {
    let n = g.n();
    let cap = (opts.capacity * g.total_w() as f64 / parts as f64).ceil() as u64;
    let mut load = vec![0u64; parts];
    for v in 0..n {
        load[part[v] as usize] += g.node_w(v);
    }
    let ord = order(n, opts.seed, opts.salt);
    let mut active = active.unwrap_or_else(|| vec![true; n]);
    for _ in 0..opts.sweeps {
        let visit: Vec<u32> = ord.par_iter().copied().filter(|&v| active[v as usize]).collect();
        active.iter_mut().for_each(|a| *a = false);
        let mut moved = 0usize;
        for batch in batches(&visit) {
            let (part_now, load_now) = (&*part, &load);
            // each node's best target with room and its gain over staying, if any
            let choices: Vec<Option<(u32, i64)>> = batch
                .par_iter()
                .with_min_len(256)
                .map_init(
                    || Acc::new(parts),
                    |acc, &v| {
                        let v = v as usize;
                        let (own, wv) = (part_now[v] as usize, g.node_w(v));
                        for (u, w) in g.edges(v) {
                            acc.add(part_now[u] as usize, w);
                        }
                        let stay = acc.value[own] as i64;
                        let mut best: Option<(usize, i64)> = None;
                        for &q in &acc.touched {
                            if q == own || load_now[q] + wv > cap {
                                continue;
                            }
                            let gain = acc.value[q] as i64 - stay;
                            let better = best
                                .is_none_or(|(b, bg)| gain > bg || (gain == bg && load_now[q] < load_now[b]));
                            if better {
                                best = Some((q, gain));
                            }
                        }
                        acc.clear();
                        best.map(|(q, gain)| (q as u32, gain))
                    },
                )
                .collect();
            // the largest gains first (METIS's greedy refinement orders its moves so too): 1-2 %
            // less halo volume on products-like than moves in visiting order
            let mut moves: Vec<(u32, Option<(u32, i64)>)> = batch.iter().copied().zip(choices).collect();
            moves.sort_by_key(|&(_, c)| std::cmp::Reverse(c.map_or(i64::MIN, |c| c.1)));
            for (v, choice) in moves {
                let Some((q, gain)) = choice else { continue };
                let (v, q) = (v as usize, q as usize);
                let (own, wv) = (part[v] as usize, g.node_w(v));
                let wanted = gain > 0 || load[own] > cap || (gain == 0 && load[q] + wv < load[own]);
                if !wanted {
                    continue;
                }
                if load[q] + wv > cap {
                    active[v] = true;
                    continue;
                }
                load[own] -= wv;
                load[q] += wv;
                part[v] = q as u32;
                moved += 1;
                active[v] = true;
                for (u, _) in g.edges(v) {
                    active[u] = true;
                }
            }
        }
        if moved == 0 {
            break;
        }
    }
}

/// Settings of one [`refine`].
#[derive(Clone, Copy)]
struct Refine {
    capacity: f64,
    sweeps: usize,
    seed: u64,
    salt: u64,
}

/// Nodes with a neighbour in another partition.
fn boundary(g: &Level, part: &[u32]) -> Vec<bool> {
    (0..g.n()).into_par_iter().map(|v| g.edges(v).any(|(u, _)| part[u] != part[v])).collect()
}

/// How much heavier than the mean node a cluster may grow per coarsening level.
const SHRINK: u64 = 16;

/// Greedy starts on the coarsest graph (32 rather than 8: 1 % less halo volume on
/// products-like at 16 parts, for half a second).
const TRIES: u64 = 32;

/// A balanced partition of `graph` with a small edge cut, the starting point of the halo LPA.
pub fn initial_partition(graph: &Csr, parts: usize, capacity: f64, seed: u64) -> Vec<u32> {
    let base = Level { ptr: graph.row_ptr(), adj: graph.col_idx(), edge_w: None, node_w: None };
    let total = base.total_w();
    let cap = (total / (parts as u64 * 16)).max(1);
    let coarsest = (parts * 64).max(256);
    // coarsen
    let mut clusterings: Vec<Vec<u32>> = Vec::new();
    let mut levels: Vec<Owned> = Vec::new();
    loop {
        let g = levels.last().map_or_else(|| base_clone(&base), |l| l.level());
        if g.n() <= coarsest || levels.len() >= 30 {
            break;
        }
        // each level a step of the setup's partitioning phase: announced in a batch job's log
        // when it runs past a second
        let _step = progress::step(&format!("coarsening level {}: {} nodes", levels.len() + 1, g.n()));
        let salt = 100 + levels.len() as u64;
        // a cluster weighs at most SHRINK mean nodes: more, gentler levels give refinement more
        // chances than one level that shrinks the graph 40-fold (edge cut 11 % smaller, halo
        // volume 3 %, on products-like at 16 parts)
        let mean = g.total_w().div_ceil(g.n() as u64);
        let (c, k) = cluster(&g, cap.min(mean * SHRINK), 4, seed, salt);
        if k as f64 > 0.9 * g.n() as f64 {
            break; // no longer shrinking
        }
        let coarse = contract(&g, &c, k);
        tracing::debug!(
            "coarsening level {}: {} -> {k} nodes, {} edges",
            levels.len() + 1,
            g.n(),
            coarse.adj.len()
        );
        clusterings.push(c);
        levels.push(coarse);
    }
    // partition the coarsest graph, then project and refine level by level
    let mut part = {
        let g = levels.last().map_or_else(|| base_clone(&base), |l| l.level());
        let _step = progress::step(&format!("initial partition of {} nodes", g.n()));
        // several greedy starts (in parallel; the coarsest graph is small); the smallest cut wins
        (0..TRIES)
            .into_par_iter()
            .map(|t| {
                let mut p = grow(&g, parts, hash_key(&[seed, t]));
                refine(&g, &mut p, parts, Refine { capacity, sweeps: 16, seed, salt: 200 + t }, None);
                (cut(&g, &p), p)
            })
            .min_by_key(|(c, _)| *c)
            .map(|(_, p)| p)
            .unwrap_or_default()
    };
    for lvl in (0..levels.len()).rev() {
        // a node can only gain by moving where its cluster lay on a boundary
        let coarse = boundary(&levels[lvl].level(), &part);
        let active = clusterings[lvl].par_iter().map(|&c| coarse[c as usize]).collect();
        part = clusterings[lvl].par_iter().map(|&c| part[c as usize]).collect();
        let g = if lvl == 0 { base_clone(&base) } else { levels[lvl - 1].level() };
        let _step = progress::step(&format!("refining level {lvl}: {} nodes", g.n()));
        refine(
            &g,
            &mut part,
            parts,
            Refine { capacity, sweeps: 8, seed, salt: 300 + lvl as u64 },
            Some(active),
        );
    }
    part
}

/// Total weight of the edges between partitions (each direction counted).
fn cut(g: &Level, part: &[u32]) -> u64 {
    (0..g.n())
        .into_par_iter()
        .map(|v| g.edges(v).filter(|&(u, _)| part[u] != part[v]).map(|(_, w)| w).sum::<u64>())
        .sum()
}

fn base_clone<'a>(l: &Level<'a>) -> Level<'a> {
    Level { ptr: l.ptr, adj: l.adj, edge_w: l.edge_w, node_w: l.node_w }
}

#[cfg(test)]
mod tests {
    use super::*;
    use grinnder_graph::csr::BuildOptions;

    #[test]
    fn contraction_keeps_weights() {
        // a path 0-1-2-3 clustered as {0,1},{2,3}: one coarse edge of weight 1 each way
        let g = Csr::from_edges(4, &[0, 1, 2], &[1, 2, 3], BuildOptions::default()).unwrap();
        let l = Level { ptr: g.row_ptr(), adj: g.col_idx(), edge_w: None, node_w: None };
        let c = contract(&l, &[0, 0, 1, 1], 2);
        assert_eq!(c.node_w, vec![2, 2]);
        assert_eq!(c.ptr, vec![0, 1, 2]);
        assert_eq!(c.adj, vec![1, 0]);
        assert_eq!(c.edge_w, vec![1, 1]);
    }

    #[test]
    fn two_cliques_are_split_along_their_bridge() {
        let (mut src, mut dst) = (vec![0u32], vec![50u32]);
        for base in [0u32, 50] {
            for i in 0..50 {
                for j in 0..i {
                    src.push(base + i);
                    dst.push(base + j);
                }
            }
        }
        let g = Csr::from_edges(100, &src, &dst, BuildOptions::default()).unwrap();
        let part = initial_partition(&g, 2, 1.03, 7);
        assert!(part[..50].iter().all(|&p| p == part[0]));
        assert!(part[50..].iter().all(|&p| p == part[50]));
        assert_ne!(part[0], part[50]);
    }
}
