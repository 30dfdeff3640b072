//! Node-induced sub-datasets: a server's share of the graph in GraNNDis's flexible preloading
//! (the nodes it owns and their k-hop closure) and expansion-aware sampling (the nodes it owns
//! and a sample of their outside neighbourhood, at most a few hops out).
//!
//! Node order: the owned nodes first (as given), then the added ones in order of discovery, so
//! "owned" is a prefix. Every random choice is keyed by (seed, hop, node).

use rayon::prelude::*;

use crate::buf::Buf;
use crate::csr::Csr;
use crate::dataset::{Dataset, Features, Splits};
use crate::rng::Stream;
use crate::sample::{choose, concat_rows};

/// `seeds` and every node within `hops` of them.
pub fn closure(g: &Csr, seeds: &[u32], hops: usize) -> Vec<u32> {
    expand(g, seeds, hops, |_, _, outside| outside.to_vec())
}

/// Expansion-aware sampling: from the boundary of `seeds` outward, at most `hops` hops, each
/// node adding up to `fanout` of its neighbours not yet in the set (uniformly, without
/// replacement).
pub fn sampled_closure(g: &Csr, seeds: &[u32], hops: usize, fanout: usize, seed: u64) -> Vec<u32> {
    expand(g, seeds, hops, |h, v, outside| {
        if outside.len() <= fanout {
            return outside.to_vec();
        }
        let mut s = Stream::new(&[seed, 0xEA5, h as u64, v as u64]);
        choose(outside.len(), fanout, &mut s).into_iter().map(|i| outside[i]).collect()
    })
}

/// Breadth-first growth: at each hop, every frontier node offers `pick(hop, node, its
/// neighbours outside the set)`; offers join in frontier order.
fn expand(
    g: &Csr,
    seeds: &[u32],
    hops: usize,
    pick: impl Fn(usize, u32, &[u32]) -> Vec<u32> + Sync,
) -> Vec<u32> {
    let mut inside = vec![false; g.num_nodes()];
    for &v in seeds {
        assert!(!inside[v as usize], "seeds are distinct");
        inside[v as usize] = true;
    }
    let mut nodes = seeds.to_vec();
    let mut frontier = seeds.to_vec();
    for h in 0..hops {
        let offers: Vec<Vec<u32>> = frontier
            .par_iter()
            .map(|&v| {
                let outside: Vec<u32> =
                    g.row(v as usize).iter().copied().filter(|&u| !inside[u as usize]).collect();
                if outside.is_empty() {
                    outside
                } else {
                    pick(h, v, &outside)
                }
            })
            .collect();
        frontier.clear();
        for u in offers.into_iter().flatten() {
            if !inside[u as usize] {
                inside[u as usize] = true;
                frontier.push(u);
            }
        }
        if frontier.is_empty() {
            break;
        }
        nodes.extend(&frontier);
    }
    nodes
}

/// A dataset induced by some of another's nodes.
pub struct SubDataset {
    /// Every edge among the nodes, their features and labels; splits hold the kept nodes only.
    pub ds: Dataset,
    /// Each node's id in the whole dataset.
    pub ids: Vec<u32>,
    /// Each node's degree in the whole graph (normalisations as there).
    pub degree: Vec<u32>,
}

/// The dataset `ds` induces on `nodes` (distinct ids): its splits keep the members among the
/// first `keep` nodes (the owned ones), renumbered; the other nodes are context.
pub fn induced(ds: &Dataset, nodes: &[u32], keep: usize) -> SubDataset {
    let g = &ds.graph;
    let mut local = vec![u32::MAX; g.num_nodes()];
    for (i, &v) in nodes.iter().enumerate() {
        assert_eq!(local[v as usize], u32::MAX, "nodes are distinct");
        local[v as usize] = i as u32;
    }
    let rows: Vec<Vec<u32>> = nodes
        .par_iter()
        .map(|&v| {
            let mut r: Vec<u32> =
                g.row(v as usize).iter().map(|&u| local[u as usize]).filter(|&c| c != u32::MAX).collect();
            r.sort_unstable();
            r
        })
        .collect();
    let (row_ptr, col_idx) = concat_rows(rows);
    let graph =
        Csr::from_parts(Buf::Owned(row_ptr), Buf::Owned(col_idx)).expect("an induced subgraph is a CSR");
    let d = ds.features.dim;
    // the rows as stored (narrow stays narrow)
    fn rows_of<E: crate::features::FeatureElem>(b: &[E], nodes: &[u32], d: usize) -> Buf<E> {
        Buf::Owned(
            nodes.iter().flat_map(|&v| b[v as usize * d..(v as usize + 1) * d].iter().copied()).collect(),
        )
    }
    let feats: crate::FeatureData =
        crate::with_feature_buf!(&ds.features.data, b => rows_of(b, nodes, d).into());
    let split = |ids: &[u32]| -> Buf<u32> {
        let mut out: Vec<u32> =
            ids.iter().map(|&v| local[v as usize]).filter(|&l| (l as usize) < keep).collect();
        out.sort_unstable();
        Buf::Owned(out)
    };
    let degree = nodes.iter().map(|&v| g.row(v as usize).len() as u32).collect();
    let sub = Dataset {
        name: format!("{} ({} of {} nodes)", ds.name, nodes.len(), g.num_nodes()),
        graph,
        features: Features { dim: d, data: feats },
        labels: Buf::Owned(nodes.iter().map(|&v| ds.labels[v as usize]).collect()),
        num_classes: ds.num_classes,
        splits: Splits {
            train: split(&ds.splits.train),
            valid: split(&ds.splits.valid),
            test: split(&ds.splits.test),
        },
        directed: ds.directed,
        // (weighted graphs train whole or by partitions, never on shares: the engine refuses)
        edge_weight: None,
    };
    SubDataset { ds: sub, ids: nodes.to_vec(), degree }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::csr::BuildOptions;

    fn path(n: u32) -> Csr {
        let src: Vec<u32> = (0..n - 1).collect();
        let dst: Vec<u32> = (1..n).collect();
        Csr::from_edges(n as u64, &src, &dst, BuildOptions::default()).unwrap()
    }

    #[test]
    fn closures_grow_by_hops() {
        let g = path(10);
        assert_eq!(closure(&g, &[4, 5], 0), vec![4, 5]);
        assert_eq!(closure(&g, &[4, 5], 2), vec![4, 5, 3, 6, 2, 7]);
        assert_eq!(closure(&g, &[0], 20).len(), 10, "stops when nothing is left");
        // a fanout of 1 from a node with two outside neighbours takes one of them
        let s = sampled_closure(&g, &[5], 1, 1, 3);
        assert_eq!(s.len(), 2);
        assert!(s[1] == 4 || s[1] == 6);
        assert_eq!(s, sampled_closure(&g, &[5], 1, 1, 3), "seeded");
    }
}
