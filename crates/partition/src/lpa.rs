//! Label propagation with a balance constraint: Spinner (Martella et al., ICDE 2017) and this
//! project's dependency-aware variant, which scores moves by the halo volume they add or
//! remove instead of the edges they cut.
//!
//! Every iteration is synchronous: all nodes score their candidate partitions against the same
//! labels (in parallel), then candidates migrate with probability `spare / demand` of their
//! target, so no partition grows past its capacity `c · N / P` in expectation. Random draws
//! come from (seed, iteration, node): the result does not depend on the thread count.
//!
//! Halo volume is `Σ_u |{p ≠ part(u) : u has a neighbour in p}|`. Moving `v` from `a` to `b`
//! changes `v`'s own term by `[a ∈ P(N(v))] − [b ∈ P(N(v))]` and a neighbour `u`'s term by
//! `[b new to u and b ≠ part(u)] − [a gone from u and a ≠ part(u)]`, which needs each
//! neighbour's label counts: they are rebuilt every iteration as per-node (label, count)
//! lists, at most one entry per edge.

use grinnder_graph::rng::{hash_key, unit_f64};
use grinnder_graph::Csr;
use rayon::prelude::*;

/// What a move is scored by.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Objective {
    /// Neighbours in the target partition (Spinner: edge cut).
    EdgeCut,
    /// Change in halo volume (dependency-aware).
    Halo,
}

/// Settings shared by both propagations.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LpaConfig {
    pub objective: Objective,
    /// Capacity factor: a partition holds at most `capacity · N / P` nodes.
    pub capacity: f64,
    /// Weight of the load penalty `β · load / capacity`.
    pub beta: f64,
    pub iterations_max: usize,
    /// Stop when fewer than this fraction of nodes moved in an iteration.
    pub converged_fraction: f64,
    /// Candidate partitions scored per node (the most frequent among its neighbours).
    pub candidates_max: usize,
    pub seed: u64,
}

impl LpaConfig {
    pub fn new(objective: Objective, seed: u64) -> Self {
        LpaConfig {
            objective,
            capacity: 1.05,
            beta: 1.0,
            iterations_max: 100,
            converged_fraction: 1e-3,
            candidates_max: 4,
            seed,
        }
    }
}

/// Per-node neighbour label counts, ascending by label.
struct Counts {
    ptr: Vec<u64>,
    entries: Vec<(u32, u32)>,
}

impl Counts {
    fn build(graph: &Csr, label: &[u32]) -> Counts {
        let lists: Vec<Vec<(u32, u32)>> = (0..graph.num_nodes())
            .into_par_iter()
            .with_min_len(1024)
            .map(|v| {
                let mut ls: Vec<u32> = graph.row(v).iter().map(|&u| label[u as usize]).collect();
                ls.sort_unstable();
                let mut out: Vec<(u32, u32)> = Vec::new();
                for l in ls {
                    match out.last_mut() {
                        Some((x, c)) if *x == l => *c += 1,
                        _ => out.push((l, 1)),
                    }
                }
                out
            })
            .collect();
        let mut ptr = Vec::with_capacity(lists.len() + 1);
        ptr.push(0u64);
        for l in &lists {
            ptr.push(ptr.last().copied().unwrap_or(0) + l.len() as u64);
        }
        let entries = lists.into_iter().flatten().collect();
        Counts { ptr, entries }
    }

    fn of(&self, v: usize) -> &[(u32, u32)] {
        &self.entries[self.ptr[v] as usize..self.ptr[v + 1] as usize]
    }

    fn count(&self, v: usize, l: u32) -> u32 {
        let e = self.of(v);
        e.binary_search_by_key(&l, |&(x, _)| x).map_or(0, |i| e[i].1)
    }
}

/// Runs the propagation from a random assignment; returns the owner of every node.
pub fn propagate(graph: &Csr, parts: usize, cfg: &LpaConfig) -> Vec<u32> {
    let n = graph.num_nodes();
    let label: Vec<u32> =
        (0..n as u64).map(|v| (hash_key(&[cfg.seed, 0, v]) % parts as u64) as u32).collect();
    propagate_from(graph, parts, cfg, label)
}

/// Runs the propagation from the owners `label`; returns the owner of every node.
pub fn propagate_from(graph: &Csr, parts: usize, cfg: &LpaConfig, mut label: Vec<u32>) -> Vec<u32> {
    let n = graph.num_nodes();
    let cap = (cfg.capacity * n as f64 / parts as f64).max(1.0);
    for it in 1..=cfg.iterations_max as u64 {
        let mut load = vec![0u64; parts];
        for &l in &label {
            load[l as usize] += 1;
        }
        let counts = Counts::build(graph, &label);
        // 1. every node picks its best partition under the current labels
        let wants: Vec<u32> = (0..n)
            .into_par_iter()
            .with_min_len(256)
            .map(|v| best(graph, &counts, &label, &load, cap, cfg, v))
            .collect();
        // 2. candidates migrate with probability spare / demand of their target
        let mut demand = vec![0u64; parts];
        for (v, &w) in wants.iter().enumerate() {
            if w != label[v] {
                demand[w as usize] += 1;
            }
        }
        let prob: Vec<f64> = (0..parts)
            .map(|p| {
                if demand[p] == 0 {
                    0.0
                } else {
                    ((cap - load[p] as f64).max(0.0) / demand[p] as f64).min(1.0)
                }
            })
            .collect();
        let moved: usize = label
            .par_iter_mut()
            .zip(&wants)
            .enumerate()
            .filter_map(|(v, (l, &w))| {
                (w != *l && unit_f64(hash_key(&[cfg.seed, it, v as u64])) < prob[w as usize]).then(|| *l = w)
            })
            .count();
        tracing::debug!("lpa iteration {it}: {moved} moved");
        if (moved as f64) < cfg.converged_fraction * n as f64 {
            break;
        }
    }
    label
}

/// The partition node `v` would rather be in (its own when nothing scores better).
fn best(
    graph: &Csr,
    counts: &Counts,
    label: &[u32],
    load: &[u64],
    cap: f64,
    cfg: &LpaConfig,
    v: usize,
) -> u32 {
    let a = label[v];
    let mine = counts.of(v);
    let deg = graph.row(v).len().max(1) as f64;
    // candidate targets: the most frequent labels among the neighbours
    let mut cands: Vec<(u32, u32)> = mine.iter().copied().filter(|&(l, _)| l != a).collect();
    if cands.is_empty() {
        return a;
    }
    cands.sort_unstable_by(|x, y| y.1.cmp(&x.1).then(x.0.cmp(&y.0)));
    cands.truncate(cfg.candidates_max);
    let penalty = |l: u32| cfg.beta * load[l as usize] as f64 / cap;
    let gain = |l: u32, n_l: u32| -> f64 {
        match cfg.objective {
            Objective::EdgeCut => n_l as f64 / deg,
            Objective::Halo => -halo_delta(graph, counts, label, v, a, l) as f64 / deg,
        }
    };
    let n_a = counts.count(v, a);
    let stay = match cfg.objective {
        Objective::EdgeCut => n_a as f64 / deg,
        Objective::Halo => 0.0,
    } - penalty(a);
    let mut best = (a, stay);
    for (l, n_l) in cands {
        let s = gain(l, n_l) - penalty(l);
        if s > best.1 + 1e-12 {
            best = (l, s);
        }
    }
    best.0
}

/// Change in halo volume if `v` moved from `a` to `b` (negative: smaller halos).
fn halo_delta(graph: &Csr, counts: &Counts, label: &[u32], v: usize, a: u32, b: u32) -> i64 {
    let own = counts.count(v, a) > 0;
    let mut delta = own as i64 - (counts.count(v, b) > 0) as i64;
    for &u in graph.row(v) {
        let u = u as usize;
        let lu = label[u];
        if lu != b && counts.count(u, b) == 0 {
            delta += 1; // u newly has a neighbour in b: u joins halo(b)
        }
        if lu != a && counts.count(u, a) == 1 {
            delta -= 1; // v was u's only neighbour in a: u leaves halo(a)
        }
    }
    delta
}
