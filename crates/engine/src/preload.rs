//! Server-level shares of the graph (GraNNDis; docs/design.md): flexible preloading and
//! expansion-aware sampling.
//!
//! The graph is split into one part per server (rank 0 partitions, the others take its owners).
//! Each server extends the nodes it owns — by their whole k-hop closure (flexible preloading)
//! or by a sample of their outside neighbourhood (expansion-aware sampling) — and its ranks
//! train partition-parallel on that share, exchanging halo rows only among themselves. The loss
//! and the accuracy count the owned nodes only; parameter gradients are summed over every rank.
//! Nothing but that sum crosses servers.
//!
//! Exactness: with the closure of as many hops as layers, every owned node's receptive field is
//! in its server's share, normalised with the whole graph's degrees, so its output is exact; a
//! node outside it feeds only nodes whose gradient is zero (gradients spread one hop per layer
//! down from the owned outputs), so parameter gradients equal one process's. Fewer hops, or
//! sampling, trade that for less memory and compute.

use grinnder_graph::subgraph::{closure, induced, sampled_closure};
use grinnder_graph::Dataset;
use grinnder_tensor::{Backend, MatComm};

use crate::config::TrainConfig;
use crate::tiered::SubgraphOf;

/// How each server extends the nodes it owns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expansion {
    /// No server shares: plain partition-parallel training over every rank (halo rows cross
    /// servers).
    Plain,
    /// Flexible preloading: the nodes within `hops` of the owned ones (`hops` = layers: exact).
    Closure { hops: usize },
    /// Flexible preloading with the most hops (up to the layer count) whose share fits in
    /// `budget` bytes (the server's memory, summed over its ranks), by an estimate of the
    /// blocks a node costs (its features, each layer's activation and gradient).
    ClosureWithin { budget: u64 },
    /// Expansion-aware sampling: from the server's boundary, at most `hops` hops out, up to
    /// `fanout` outside neighbours per node; every edge among the kept nodes.
    Sampled { hops: usize, fanout: usize },
}

impl std::fmt::Display for Expansion {
    /// As the flags set it: `none`, `preload hops=2`, `preload within 8.0 GiB`, `eas hops=1
    /// fanout=15`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Expansion::Plain => f.write_str("none"),
            Expansion::Closure { hops } => write!(f, "preload hops={hops}"),
            Expansion::ClosureWithin { budget } => {
                write!(f, "preload within {:.1} GiB", *budget as f64 / (1u64 << 30) as f64)
            }
            Expansion::Sampled { hops, fanout } => write!(f, "eas hops={hops} fanout={fanout}"),
        }
    }
}

/// Device transports over the ranks of [`Groups`]' global and server groups (NCCL between
/// GPUs), for the halo exchange and the gradient sum.
pub struct DeviceGroups<B: Backend> {
    pub global: Box<dyn MatComm<B>>,
    pub server: Box<dyn MatComm<B>>,
}

/// A server's share: its dataset and how it sits in the whole.
pub struct Share {
    pub ds: Dataset,
    pub of: SubgraphOf,
    /// Nodes the server owns (the first of `ds`'s).
    pub owned: usize,
}

/// The share of `server` given the owners of every node (`part`, one part per server).
pub fn share(ds: &Dataset, part: &[u32], server: usize, expansion: Expansion, cfg: &TrainConfig) -> Share {
    let owned: Vec<u32> =
        (0..ds.num_nodes() as u32).filter(|&v| part[v as usize] as usize == server).collect();
    let nodes = match expansion {
        Expansion::Plain => owned.clone(),
        Expansion::Closure { hops } => closure(&ds.graph, &owned, hops),
        Expansion::ClosureWithin { budget } => {
            let per_node = node_bytes(ds, cfg);
            let mut best = owned.clone();
            for hops in 1..=cfg.model.layers {
                let c = closure(&ds.graph, &owned, hops);
                if c.len() as u64 * per_node > budget || c.len() == best.len() {
                    break;
                }
                best = c;
            }
            best
        }
        Expansion::Sampled { hops, fanout } => {
            sampled_closure(&ds.graph, &owned, hops, fanout, cfg.model.seed)
        }
    };
    let sub = induced(ds, &nodes, owned.len());
    let of = SubgraphOf {
        ids: sub.ids,
        degree: sub.degree,
        n_train: ds.splits.train.len(),
        feature_shift: crate::features::shift_of(ds, cfg.features()),
    };
    Share { ds: sub.ds, of, owned: owned.len() }
}

/// Bytes a node of a share costs in the executor's blocks: its input row, and an activation and
/// a gradient row per layer (f32).
fn node_bytes(ds: &Dataset, cfg: &TrainConfig) -> u64 {
    let m = &cfg.model;
    let width = m.hidden_width();
    4 * (ds.features.dim + 2 * m.layers * width.max(ds.num_classes as usize)) as u64
}
