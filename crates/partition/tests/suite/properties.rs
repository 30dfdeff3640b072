//! Properties of partitionings and partitioned graphs on random graphs (proptest): the
//! renumbering is a permutation; every edge lands in exactly one partition with its value;
//! each halo is exactly the outside in-neighbours; edge cases work or are refused clearly.

use std::collections::BTreeMap;

use grinnder_graph::{BuildOptions, Csr};
use grinnder_partition::{
    partition, quality, renumber_ids, renumber_rows, Method, PartitionError, PartitionedGraph,
};
use proptest::prelude::*;

fn graph(n: usize, edges: &[(u32, u32)]) -> Csr {
    let (s, d): (Vec<u32>, Vec<u32>) = edges.iter().map(|&(a, b)| (a % n as u32, b % n as u32)).unzip();
    Csr::from_edges(n as u64, &s, &d, BuildOptions::default()).unwrap()
}

fn method(k: u8, seed: u64) -> Method {
    match k % 6 {
        0 => Method::Random { seed },
        1 => Method::Contiguous,
        2 => Method::Spinner { seed },
        3 => Method::Lpa { seed },
        4 => Method::Multilevel { seed },
        _ => Method::Metis { seed: seed % 1000 },
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn partitioned_graph_is_the_full_graph_regrouped(
        n in 1usize..60,
        edges in proptest::collection::vec((0u32..60, 0u32..60), 0..240),
        parts_raw in 1usize..70,
        k: u8,
        seed: u64,
    ) {
        let g = graph(n, &edges);
        let parts = parts_raw.min(n);
        let p = partition(&g, parts, method(k, seed)).unwrap();
        // perm is a permutation and inv_perm its inverse; partitions are contiguous
        let mut seen = vec![false; n];
        for v in 0..n {
            let w = p.perm[v] as usize;
            prop_assert!(!seen[w]);
            seen[w] = true;
            prop_assert_eq!(p.inv_perm[w] as usize, v);
            let q = p.part[v] as u64;
            prop_assert!(p.ptr[q as usize] <= w as u64 && (w as u64) < p.ptr[q as usize + 1]);
        }
        // values: a distinct value per edge
        let vals: Vec<f64> = (0..g.num_edges()).map(|e| e as f64 + 0.5).collect();
        let pg = PartitionedGraph::build(&g, &p, &[&vals]);
        prop_assert_eq!(pg.partitions.len(), parts);
        // every edge appears exactly once, in its target's partition, with its value
        let mut want: BTreeMap<(u32, u32), f64> = BTreeMap::new();
        for v in 0..n {
            for (e, &u) in (g.row_ptr()[v] as usize..).zip(g.row(v)) {
                want.insert((p.perm[v], p.perm[u as usize]), vals[e]);
            }
        }
        let mut got: BTreeMap<(u32, u32), f64> = BTreeMap::new();
        for part in &pg.partitions {
            prop_assert_eq!(part.row_ptr.len(), part.own + 1);
            for r in 0..part.own {
                let row = &part.col_idx[part.row_ptr[r] as usize..part.row_ptr[r + 1] as usize];
                prop_assert!(row.windows(2).all(|w| w[0] < w[1]), "local columns ascending");
                for (i, &c) in row.iter().enumerate() {
                    let col = if (c as usize) < part.own { part.first as u32 + c } else { part.halo[c as usize - part.own] };
                    let value = part.values[0][part.row_ptr[r] as usize + i];
                    prop_assert!(got.insert((part.first as u32 + r as u32, col), value).is_none(), "an edge twice");
                }
            }
            // the halo is exactly the outside in-neighbours of the partition's rows
            let mut outside: Vec<u32> = (part.first..part.first + part.own as u64)
                .flat_map(|id| g.row(p.inv_perm[id as usize] as usize).iter().map(|&u| p.perm[u as usize]))
                .filter(|&w| !(part.first..part.first + part.own as u64).contains(&(w as u64)))
                .collect();
            outside.sort_unstable();
            outside.dedup();
            prop_assert_eq!(&part.halo, &outside);
            // fetch lists name every halo row once, by source partition and local row
            let ptr = &p.ptr;
            let fetched: Vec<u32> = part
                .fetch
                .iter()
                .flat_map(|(src, rows)| rows.iter().map(move |&r| ptr[*src] as u32 + r))
                .collect();
            prop_assert_eq!(&fetched, &part.halo);
            prop_assert!(part.fetch.iter().all(|(src, _)| *src != part.part));
        }
        prop_assert_eq!(got, want);
        prop_assert_eq!(pg.halo_volume(), quality(&g, &p).halo_volume);
        if parts == 1 {
            prop_assert_eq!(pg.halo_volume(), 0);
        }
        // a parallel build equals a build on one thread
        let serial = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap()
            .install(|| PartitionedGraph::build(&g, &p, &[&vals]));
        prop_assert_eq!(serial, pg);
    }
}

#[test]
fn edge_cases() {
    let g = graph(5, &[(0, 1), (1, 2), (3, 4)]);
    assert_eq!(
        partition(&g, 6, Method::Contiguous),
        Err(PartitionError::TooManyParts { parts: 6, nodes: 5 })
    );
    assert_eq!(partition(&g, 0, Method::Contiguous), Err(PartitionError::NoParts));
    // P = N: one node per partition, the halo is every neighbour
    let p = partition(&g, 5, Method::Contiguous).unwrap();
    assert_eq!(p.sizes(), vec![1; 5]);
    let vals = vec![1.0; g.num_edges()];
    assert_eq!(PartitionedGraph::build(&g, &p, &[&vals]).halo_volume(), g.num_edges() as u64);
    // empty partitions (random owners on a tiny graph) and isolated nodes build fine
    let g = graph(6, &[(0, 1)]);
    let p = partition(&g, 6, Method::Random { seed: 3 }).unwrap();
    assert!(p.sizes().contains(&0), "this seed leaves a partition empty");
    let pg = PartitionedGraph::build(&g, &p, &[&vec![1.0; g.num_edges()]]);
    assert!(pg.partitions.iter().any(|q| q.own == 0 && q.halo.is_empty() && q.row_ptr == vec![0]));
    let q = quality(&g, &p);
    assert_eq!(q.edge_cut + 2 * (p.part[0] == p.part[1]) as u64, 2);
}

#[test]
fn renumbering_features_and_splits() {
    let g = graph(4, &[(0, 3)]);
    let p = partition(&g, 2, Method::Random { seed: 1 }).unwrap();
    let feats: Vec<f32> = (0..8).map(|x| x as f32).collect();
    let moved = renumber_rows(&feats, 2, &p.inv_perm);
    for v in 0..4 {
        let w = p.perm[v] as usize;
        assert_eq!(&moved[w * 2..w * 2 + 2], &feats[v * 2..v * 2 + 2]);
    }
    let ids = renumber_ids(&[0, 2], &p.perm);
    assert!(ids.windows(2).all(|w| w[0] < w[1]));
    assert_eq!(ids.len(), 2);
}

#[test]
fn metis_beats_random_on_a_community_graph() {
    use grinnder_graph::generate::{generate, preset, GenConfig};
    let g = generate(&GenConfig::new(preset("arxiv-like").unwrap(), 0.02, 1)).unwrap().graph;
    let metis = quality(&g, &partition(&g, 8, Method::Metis { seed: 1 }).unwrap());
    let random = quality(&g, &partition(&g, 8, Method::Random { seed: 1 }).unwrap());
    assert!(metis.balance <= 1.10, "METIS balance {}", metis.balance);
    assert!(
        metis.edge_cut * 2 < random.edge_cut,
        "METIS cut {} vs random {}",
        metis.edge_cut,
        random.edge_cut
    );
    assert!(metis.halo_volume < random.halo_volume, "halo {} vs {}", metis.halo_volume, random.halo_volume);
}

#[test]
fn label_propagation_is_balanced_deterministic_and_beats_random() {
    use grinnder_graph::generate::{generate, preset, GenConfig};
    let g = generate(&GenConfig::new(preset("arxiv-like").unwrap(), 0.02, 4)).unwrap().graph;
    let random = quality(&g, &partition(&g, 8, Method::Random { seed: 1 }).unwrap());
    for m in [Method::Spinner { seed: 5 }, Method::Lpa { seed: 5 }] {
        let p = partition(&g, 8, m).unwrap();
        let q = quality(&g, &p);
        assert!(q.balance <= 1.10, "{m:?}: balance {}", q.balance);
        assert!(
            q.halo_volume < random.halo_volume,
            "{m:?}: halo {} vs random {}",
            q.halo_volume,
            random.halo_volume
        );
        let one = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap()
            .install(|| partition(&g, 8, m).unwrap());
        assert_eq!(one, p, "{m:?} depends on the thread count");
    }
}

#[test]
fn metis_gives_a_seed_the_same_parts_while_other_threads_partition() {
    // METIS's random generator is process-global: partitionings on several threads at once
    // (ranks as threads, a Python caller) must not draw from each other's streams
    use grinnder_graph::generate::{generate, preset, GenConfig};
    let graphs: Vec<Csr> = (0..4)
        .map(|s| generate(&GenConfig::new(preset("arxiv-like").unwrap(), 0.01, s)).unwrap().graph)
        .collect();
    let alone: Vec<_> = graphs.iter().map(|g| partition(g, 8, Method::Metis { seed: 3 }).unwrap()).collect();
    for round in 0..4 {
        let together: Vec<_> = std::thread::scope(|s| {
            let hs: Vec<_> = graphs
                .iter()
                .map(|g| s.spawn(move || partition(g, 8, Method::Metis { seed: 3 }).unwrap()))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (i, (a, b)) in alone.iter().zip(&together).enumerate() {
            assert!(a == b, "round {round}: graph {i} partitioned differently beside other threads");
        }
    }
}
