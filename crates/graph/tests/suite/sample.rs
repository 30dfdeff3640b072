//! Sampler invariants: every sampled edge exists, fanouts are respected without repeats, blocks
//! chain layer to layer, batches are reproducible for a seed and independent of thread count,
//! full neighbourhoods are whole, and k-hop subgraphs are node-induced with BFS hop masks.

use std::collections::{HashSet, VecDeque};

use grinnder_graph::generate::{generate, preset, GenConfig};
use grinnder_graph::sample::{KHopSampler, NeighborSampler};
use grinnder_graph::Csr;

fn graph() -> Csr {
    generate(&GenConfig::new(preset("arxiv-like").unwrap(), 0.01, 9)).unwrap().into_dataset().unwrap().graph
}

fn neighbours(g: &Csr, v: u32) -> &[u32] {
    &g.col_idx()[g.row_ptr()[v as usize] as usize..g.row_ptr()[v as usize + 1] as usize]
}

#[test]
fn neighbour_batches_hold_sampled_edges_within_fanouts() {
    let g = graph();
    let seeds: Vec<u32> = (0..g.num_nodes() as u32).step_by(7).take(200).collect();
    let s = NeighborSampler::new(vec![5, 3, -1], 1);
    let b = s.sample(&g, &seeds, 42);
    assert_eq!(b.blocks.len(), 3);
    assert_eq!(b.blocks[2].row_ids(), &seeds[..], "the last block computes the seeds");
    for (l, blk) in b.blocks.iter().enumerate() {
        let fanout = s.fanouts[b.blocks.len() - 1 - l];
        assert_eq!(blk.row_ptr.len(), blk.rows + 1);
        assert_eq!(blk.col_ids.len(), blk.cols);
        assert_eq!(blk.col_ids.iter().collect::<HashSet<_>>().len(), blk.cols, "columns are distinct nodes");
        if l + 1 < b.blocks.len() {
            assert_eq!(
                b.blocks[l + 1].col_ids,
                blk.row_ids(),
                "block {l}'s rows are the next block's columns"
            );
        }
        for r in 0..blk.rows {
            let v = blk.col_ids[r];
            let row = &blk.col_idx[blk.row_ptr[r] as usize..blk.row_ptr[r + 1] as usize];
            let got: Vec<u32> = row.iter().map(|&c| blk.col_ids[c as usize]).collect();
            let all = neighbours(&g, v);
            assert_eq!(blk.full_degree[r] as usize, all.len());
            assert!(got.iter().all(|u| all.contains(u)), "every sampled edge exists");
            assert_eq!(got.iter().collect::<HashSet<_>>().len(), got.len(), "no neighbour twice");
            let want = if fanout < 0 { all.len() } else { all.len().min(fanout as usize) };
            assert_eq!(got.len(), want, "fanout {fanout} of degree {}", all.len());
            if fanout < 0 {
                assert_eq!(got, all, "a full neighbourhood is whole, in order");
            }
        }
    }
}

#[test]
fn batches_are_reproducible_and_thread_count_free() {
    let g = graph();
    let seeds: Vec<u32> = (0..300).collect();
    let s = NeighborSampler::new(vec![4, 4], 7);
    let a = s.sample(&g, &seeds, 3);
    assert_eq!(a, s.sample(&g, &seeds, 3), "same seed and key, same batch");
    let one =
        rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap().install(|| s.sample(&g, &seeds, 3));
    assert_eq!(a, one, "one thread gives the same batch");
    assert_ne!(a, s.sample(&g, &seeds, 4), "another key, another sample");
    assert_ne!(a, NeighborSampler::new(vec![4, 4], 8).sample(&g, &seeds, 3), "another seed, another sample");
}

#[test]
fn k_hop_subgraphs_are_node_induced_with_bfs_hops() {
    let g = graph();
    let seeds: Vec<u32> = vec![3, 50, 400];
    let sg = KHopSampler::new(vec![-1, -1], 1).sample(&g, &seeds, 0);
    assert_eq!(&sg.nodes[..3], &seeds[..]);
    // BFS distances up to 2 from the seeds
    let mut dist = vec![u8::MAX; g.num_nodes()];
    let mut q: VecDeque<u32> = seeds.iter().copied().collect();
    seeds.iter().for_each(|&s| dist[s as usize] = 0);
    while let Some(v) = q.pop_front() {
        if dist[v as usize] == 2 {
            continue;
        }
        for &u in neighbours(&g, v) {
            if dist[u as usize] == u8::MAX {
                dist[u as usize] = dist[v as usize] + 1;
                q.push_back(u);
            }
        }
    }
    let want: HashSet<u32> = (0..g.num_nodes() as u32).filter(|&v| dist[v as usize] <= 2).collect();
    assert_eq!(sg.nodes.iter().copied().collect::<HashSet<_>>(), want, "exactly the 2-hop neighbourhood");
    for (i, &v) in sg.nodes.iter().enumerate() {
        assert_eq!(sg.hop[i], dist[v as usize], "hop mask of node {v}");
        assert!(sg.within(i, 2) && (sg.hop[i] > 0 || sg.within(i, 0)));
        let row: HashSet<u32> = sg.col_idx[sg.row_ptr[i] as usize..sg.row_ptr[i + 1] as usize]
            .iter()
            .map(|&c| sg.nodes[c as usize])
            .collect();
        let induced: HashSet<u32> = neighbours(&g, v).iter().copied().filter(|u| want.contains(u)).collect();
        assert_eq!(row, induced, "every edge among kept nodes, no other");
    }
    // with a fanout, a subset, still induced
    let small = KHopSampler::new(vec![2, 2], 1).sample(&g, &seeds, 0);
    assert!(small.nodes.len() < sg.nodes.len());
    assert!(small.nodes.iter().all(|v| want.contains(v)));
}

#[test]
fn k_hop_subgraphs_become_shadow_blocks() {
    let g = graph();
    let seeds: Vec<u32> = vec![9, 77, 310, 5];
    let sg = KHopSampler::new(vec![3, 3], 2).sample(&g, &seeds, 1);
    assert_eq!(sg, KHopSampler::new(vec![3, 3], 2).sample(&g, &seeds, 1), "seeded");
    let batch = sg.clone().into_batch(&g, 3);
    assert_eq!(batch.seeds, seeds);
    assert_eq!(batch.blocks.len(), 3);
    assert_eq!(batch.input_nodes(), &sg.nodes[..]);
    let n = sg.nodes.len();
    for (l, b) in batch.blocks.iter().enumerate() {
        let rows = if l == 2 { seeds.len() } else { n };
        assert_eq!((b.rows, b.cols), (rows, n), "block {l}");
        assert_eq!(b.col_ids, sg.nodes);
        assert_eq!(&b.row_ptr[..], &sg.row_ptr[..=rows]);
        assert_eq!(&b.col_idx[..], &sg.col_idx[..sg.row_ptr[rows] as usize]);
        for (r, &d) in b.full_degree.iter().enumerate() {
            assert_eq!(d as usize, neighbours(&g, sg.nodes[r]).len());
        }
    }
}
