//! A multilevel starting point for the dependency-aware LPA: coarsen by size-constrained label
//! propagation (the clustering of KaHIP's coarsening, Meyerhenke, Sanders & Schulz 2014),
//! partition the coarsest graph by greedy growing, then project back level by level with
//! balanced edge-cut refinement. Label propagation from a random start stalls in local optima
//! whose halos are twice METIS's; from this start the halo objective only has to polish.
//!
//! Everything here is sequential and deterministic for a seed; memory is the coarse graphs
//! (each a fraction of the one before) and a few arrays of one entry per node.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use grinnder_graph::rng::hash_key;
use grinnder_graph::Csr;

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

/// Nodes in a seeded pseudo-random order.
fn order(n: usize, seed: u64, salt: u64) -> Vec<u32> {
    let mut o: Vec<(u64, u32)> = (0..n as u32).map(|v| (hash_key(&[seed, salt, v as u64]), v)).collect();
    o.sort_unstable();
    o.into_iter().map(|(_, v)| v).collect()
}

/// Size-constrained label propagation: clusters of weight ≤ `cap`; returns compact cluster ids
/// and their count.
fn cluster(g: &Level, cap: u64, sweeps: usize, seed: u64, salt: u64) -> (Vec<u32>, usize) {
    let n = g.n();
    let mut label: Vec<u32> = (0..n as u32).collect();
    let mut weight: Vec<u64> = (0..n).map(|v| g.node_w(v)).collect();
    let mut acc = Acc::new(n);
    let ord = order(n, seed, salt);
    for _ in 0..sweeps {
        let mut moved = 0usize;
        for &v in &ord {
            let v = v as usize;
            let (own, wv) = (label[v] as usize, g.node_w(v));
            for (u, w) in g.edges(v) {
                acc.add(label[u] as usize, w);
            }
            let mut best = (own, acc.value[own]);
            for &l in &acc.touched {
                if l != own && weight[l] + wv <= cap && acc.value[l] > best.1 {
                    best = (l, acc.value[l]);
                }
            }
            acc.clear();
            if best.0 != own {
                weight[own] -= wv;
                weight[best.0] += wv;
                label[v] = best.0 as u32;
                moved += 1;
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

/// The graph of clusters: node weights summed, parallel edges merged, internal edges dropped.
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
    let mut acc = Acc::new(k);
    let mut out = Owned { ptr: vec![0], adj: Vec::new(), edge_w: Vec::new(), node_w: vec![0; k] };
    for c in 0..k {
        for &v in &members[ptr_m[c]..ptr_m[c + 1]] {
            out.node_w[c] += g.node_w(v as usize);
            for (u, w) in g.edges(v as usize) {
                let cu = cluster[u] as usize;
                if cu != c {
                    acc.add(cu, w);
                }
            }
        }
        for &cu in &acc.touched {
            out.adj.push(cu as u32);
            out.edge_w.push(acc.value[cu]);
        }
        acc.clear();
        out.ptr.push(out.adj.len() as u64);
    }
    out
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

/// Balanced edge-cut refinement by sequential moves to the most connected partition with room;
/// an overweight partition sheds nodes even at a loss.
fn refine(g: &Level, part: &mut [u32], parts: usize, capacity: f64, sweeps: usize, seed: u64, salt: u64) {
    let n = g.n();
    let cap = (capacity * g.total_w() as f64 / parts as f64).ceil() as u64;
    let mut load = vec![0u64; parts];
    for v in 0..n {
        load[part[v] as usize] += g.node_w(v);
    }
    let mut acc = Acc::new(parts);
    let ord = order(n, seed, salt);
    for _ in 0..sweeps {
        let mut moved = 0usize;
        for &v in &ord {
            let v = v as usize;
            let (own, wv) = (part[v] as usize, g.node_w(v));
            for (u, w) in g.edges(v) {
                acc.add(part[u] as usize, w);
            }
            let stay = acc.value[own] as i64;
            let over = load[own] > cap;
            let mut best: Option<(usize, i64)> = None;
            for &q in &acc.touched {
                if q == own || load[q] + wv > cap {
                    continue;
                }
                let gain = acc.value[q] as i64 - stay;
                let better = best.is_none_or(|(b, bg)| gain > bg || (gain == bg && load[q] < load[b]));
                if better {
                    best = Some((q, gain));
                }
            }
            acc.clear();
            if let Some((q, gain)) = best {
                if gain > 0 || over || (gain == 0 && load[q] + wv < load[own]) {
                    load[own] -= wv;
                    load[q] += wv;
                    part[v] = q as u32;
                    moved += 1;
                }
            }
        }
        if moved == 0 {
            break;
        }
    }
}

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
        let salt = 100 + levels.len() as u64;
        let (c, k) = cluster(&g, cap, 4, seed, salt);
        if k as f64 > 0.9 * g.n() as f64 {
            break; // no longer shrinking
        }
        tracing::debug!("coarsening level {}: {} -> {k} nodes", levels.len(), g.n());
        let coarse = contract(&g, &c, k);
        clusterings.push(c);
        levels.push(coarse);
    }
    // partition the coarsest graph, then project and refine level by level
    let mut part = {
        let g = levels.last().map_or_else(|| base_clone(&base), |l| l.level());
        // several greedy starts; the smallest cut wins
        (0..8u64)
            .map(|t| {
                let mut p = grow(&g, parts, hash_key(&[seed, t]));
                refine(&g, &mut p, parts, capacity, 16, seed, 200 + t);
                (cut(&g, &p), p)
            })
            .min_by_key(|(c, _)| *c)
            .map(|(_, p)| p)
            .unwrap_or_default()
    };
    for lvl in (0..levels.len()).rev() {
        let fine: Vec<u32> = clusterings[lvl].iter().map(|&c| part[c as usize]).collect();
        part = fine;
        let g = if lvl == 0 { base_clone(&base) } else { levels[lvl - 1].level() };
        refine(&g, &mut part, parts, capacity, 8, seed, 300 + lvl as u64);
    }
    part
}

/// Total weight of the edges between partitions (each direction counted).
fn cut(g: &Level, part: &[u32]) -> u64 {
    (0..g.n()).map(|v| g.edges(v).filter(|&(u, _)| part[u] != part[v]).map(|(_, w)| w).sum::<u64>()).sum()
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
