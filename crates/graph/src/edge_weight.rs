//! Edge weights (PyG's `edge_weight`): one value per stored CSR entry, aligned with
//! `Csr::col_idx`, made from the weights of the input edge list that built the CSR.
//!
//! The CSR merges repeated edges into one (`BuildOptions::dedup`, the loaders' rule with or
//! without weights): so that a weighted graph whose weights are all 1 is the unweighted graph,
//! the copies of an edge — and, on an undirected graph, an edge and its reverse, which
//! symmetrisation makes the same entry — must carry the same weight, which the entry takes.
//! Copies that disagree are refused, naming both: PyG would add their messages (the same as one
//! edge with the sum of their weights), grinnder would have to pick one. A self loop in the
//! input is dropped with its weight, as it is without weights (GCN then adds one of weight 1;
//! PyG's `gcn_norm` would keep the given weight in its place).

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

use rayon::prelude::*;

use crate::csr::{BuildOptions, Csr, SelfLoops};

/// Bits of an entry no input edge has written yet (a NaN: never a weight, which are finite).
const UNSET: u32 = u32::MAX;

/// Two input edges that give one CSR entry different weights.
#[derive(Clone, Debug, PartialEq)]
pub struct Disagreement {
    /// The input edges' indices, ascending.
    pub edges: (usize, usize),
    /// Their `(source, target)` as given.
    pub pairs: ((u32, u32), (u32, u32)),
    pub weights: (f32, f32),
}

impl Disagreement {
    /// The refusal's text: what disagrees and the fixes (`directed`: whether the graph was
    /// taken as given; else a reverse edge may be the other copy).
    pub fn message(&self, directed: bool) -> String {
        let ((s0, d0), (s1, d1)) = self.pairs;
        let both = if (s0, d0) == (s1, d1) {
            format!("both give the edge {s0} -> {d0}")
        } else {
            format!("give {s0} -> {d0} and {s1} -> {d1}, one edge of the undirected graph")
        };
        let reverse = if directed {
            String::new()
        } else {
            "; or, if the two directions of an edge may weigh differently, take the edges as given \
             with --directed (directed=True in Python)"
                .to_string()
        };
        format!(
            "edges {} and {} {both}, with weights {} and {}: repeated edges are merged into one, \
             so their weights must agree. Merge them first as PyG would count them, summing the \
             weights (torch_geometric.utils.coalesce(edge_index, edge_weight, reduce=\"sum\")){reverse}",
            self.edges.0, self.edges.1, self.weights.0, self.weights.1
        )
    }
}

/// The first input edge whose weight is not finite or negative: `(edge, weight)`. GCN's
/// normalisation takes `deg^-1/2` of sums of weights, which a negative weight can make
/// undefined.
pub fn find_bad(weight: &[f32]) -> Option<(usize, f32)> {
    weight.par_iter().position_first(|w| !w.is_finite() || *w < 0.0).map(|i| (i, weight[i]))
}

/// The weight of every entry of `csr`, which `Csr::from_pairs` built from the `len` edges
/// `pair(i)` under `opts` (deduplicated); `weight(i)` is edge `i`'s (finite). A self loop
/// `opts` adds weighs 1. Errors on the first disagreement found (see the module docs).
pub(crate) fn align(
    csr: &Csr,
    len: usize,
    pair: impl Fn(usize) -> (u32, u32) + Sync,
    weight: impl Fn(usize) -> f32 + Sync,
    opts: BuildOptions,
) -> Result<Vec<f32>, Disagreement> {
    assert!(opts.dedup || opts.self_loops == SelfLoops::Add, "weights are aligned with a deduplicated CSR");
    let slots: Vec<AtomicU32> = (0..csr.num_edges()).map(|_| AtomicU32::new(UNSET)).collect();
    let clash = AtomicUsize::new(usize::MAX);
    (0..len).into_par_iter().for_each(|i| {
        let bits = weight(i).to_bits();
        for e in entries(csr, pair(i), opts) {
            if let Err(had) = slots[e].compare_exchange(UNSET, bits, Ordering::Relaxed, Ordering::Relaxed) {
                if had != bits {
                    clash.fetch_min(e, Ordering::Relaxed);
                }
            }
        }
    });
    let e = clash.into_inner();
    if e != usize::MAX {
        return Err(disagreement(csr, len, &pair, &weight, opts, e));
    }
    Ok(slots
        .into_par_iter()
        .map(|s| s.into_inner())
        .map(|b| if b == UNSET { 1.0 } else { f32::from_bits(b) })
        .collect())
}

/// The CSR entries input edge `(s, d)` gives: `s` in row `d`, and `d` in row `s` where
/// symmetrised; none for a dropped self loop.
fn entries(csr: &Csr, (s, d): (u32, u32), opts: BuildOptions) -> impl Iterator<Item = usize> + '_ {
    let kept = s != d || opts.self_loops != SelfLoops::Drop;
    let reverse = kept && opts.symmetrise && s != d;
    let at = move |row: u32, col: u32| {
        let r = csr.row(row as usize);
        let k = r.binary_search(&col).expect("every kept input edge is an entry of the CSR it built");
        csr.row_ptr()[row as usize] as usize + k
    };
    let first = kept.then(|| at(d, s));
    let second = reverse.then(|| at(s, d));
    first.into_iter().chain(second)
}

/// The two lowest-numbered input edges on entry `e` with different weights (one pass, on
/// the error path only).
fn disagreement(
    csr: &Csr,
    len: usize,
    pair: &(impl Fn(usize) -> (u32, u32) + Sync),
    weight: &(impl Fn(usize) -> f32 + Sync),
    opts: BuildOptions,
    e: usize,
) -> Disagreement {
    let on_e: Vec<usize> =
        (0..len).into_par_iter().filter(|&i| entries(csr, pair(i), opts).any(|x| x == e)).collect();
    let first = on_e[0];
    let second = *on_e
        .iter()
        .find(|&&i| weight(i).to_bits() != weight(first).to_bits())
        .expect("an entry two weights were written to");
    Disagreement {
        edges: (first, second),
        pairs: (pair(first), pair(second)),
        weights: (weight(first), weight(second)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn build(
        n: u64,
        edges: &[(u32, u32)],
        w: &[f32],
        opts: BuildOptions,
    ) -> Result<(Csr, Vec<f32>), Disagreement> {
        let (s, d): (Vec<u32>, Vec<u32>) = edges.iter().copied().unzip();
        let csr = Csr::from_edges(n, &s, &d, opts).unwrap();
        let w = align(&csr, edges.len(), |i| edges[i], |i| w[i], opts)?;
        Ok((csr, w))
    }

    fn weight_of(csr: &Csr, w: &[f32], s: u32, d: u32) -> f32 {
        let k = csr.row(d as usize).binary_search(&s).unwrap();
        w[csr.row_ptr()[d as usize] as usize + k]
    }

    #[test]
    fn directed_weights_sit_on_their_entries() {
        let opts = BuildOptions { symmetrise: false, ..BuildOptions::default() };
        let edges = [(0, 1), (2, 1), (1, 0), (3, 3), (0, 1)];
        let (csr, w) = build(4, &edges, &[0.5, 2.0, 3.0, 9.0, 0.5], opts).unwrap();
        assert_eq!(csr.num_edges(), 3);
        assert_eq!(weight_of(&csr, &w, 0, 1), 0.5);
        assert_eq!(weight_of(&csr, &w, 2, 1), 2.0);
        assert_eq!(weight_of(&csr, &w, 1, 0), 3.0);
    }

    #[test]
    fn undirected_weights_cover_both_directions_and_added_loops_weigh_one() {
        let opts = BuildOptions { self_loops: SelfLoops::Add, ..BuildOptions::default() };
        let (csr, w) = build(3, &[(0, 1), (1, 0), (2, 1)], &[0.5, 0.5, 4.0], opts).unwrap();
        assert_eq!(csr.num_edges(), 4 + 3);
        assert_eq!((weight_of(&csr, &w, 0, 1), weight_of(&csr, &w, 1, 0)), (0.5, 0.5));
        assert_eq!((weight_of(&csr, &w, 1, 2), weight_of(&csr, &w, 2, 1)), (4.0, 4.0));
        assert_eq!(weight_of(&csr, &w, 2, 2), 1.0);
    }

    #[test]
    fn copies_that_disagree_are_named() {
        let directed = BuildOptions { symmetrise: false, ..BuildOptions::default() };
        let edges = [(0, 1), (1, 2), (0, 1), (0, 1)];
        let err = build(3, &edges, &[1.0, 1.0, 1.0, 2.0], directed).unwrap_err();
        assert_eq!((err.edges, err.weights), ((0, 3), (1.0, 2.0)));
        assert!(err.message(true).contains("reduce=\"sum\""), "{}", err.message(true));
        // undirected: the reverse edge is the same entry
        let err = build(3, &[(0, 1), (1, 0)], &[1.0, 2.0], BuildOptions::default()).unwrap_err();
        assert_eq!(err.pairs, ((0, 1), (1, 0)));
        assert!(err.message(false).contains("--directed"), "{}", err.message(false));
        // taken as given, the two directions are two edges
        assert!(build(3, &[(0, 1), (1, 0)], &[1.0, 2.0], directed).is_ok());
    }

    #[test]
    fn bad_weights_are_found() {
        assert_eq!(find_bad(&[1.0, 0.0, 2.0]), None);
        assert_eq!(find_bad(&[1.0, -0.5, f32::NAN]), Some((1, -0.5)));
        assert!(find_bad(&[1.0, f32::INFINITY]).is_some());
    }
}
