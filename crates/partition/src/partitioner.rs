//! The partitioners behind one interface: `part[v]` for every node, and from it the
//! contiguous renumbering. Random and contiguous are the baselines (and test fixtures).

use grinnder_graph::rng::hash_key;
use grinnder_graph::Csr;

use crate::lpa::{propagate, propagate_from, LpaConfig, Objective};
use crate::multilevel::initial_partition;

/// How to partition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// Each node to a partition chosen by a hash of (seed, node): balanced in expectation,
    /// oblivious to edges (the baseline every partitioner must beat).
    Random { seed: u64 },
    /// Consecutive id ranges of (nearly) equal size: free, and good when ids carry locality.
    Contiguous,
    /// METIS k-way (multilevel, minimises edge cut; imbalance ≤ 3 %), through the `metis` crate
    /// built with 32-bit indices.
    Metis { seed: u64 },
    /// Spinner: balanced label propagation scored by edges kept inside partitions.
    Spinner { seed: u64 },
    /// Multilevel k-way on every core (coarsen by size-constrained label propagation, grow,
    /// refine level by level; imbalance ≤ 3 %): METIS's approach, parallel and deterministic
    /// for a seed whatever the thread count.
    Multilevel { seed: u64 },
    /// Dependency-aware label propagation: the same, scored by halo volume, started from a
    /// multilevel (coarsen by clustering, grow, refine) edge-cut partition.
    Lpa { seed: u64 },
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PartitionError {
    #[error("cannot split {nodes} nodes into {parts} partitions: at most one partition per node")]
    TooManyParts { parts: usize, nodes: usize },
    #[error("the number of partitions must be at least 1")]
    NoParts,
    #[error("METIS is built with 32-bit indices and takes at most {max} directed edges; this graph has {edges} (use another partitioner)")]
    MetisTooLarge { edges: u64, max: u64 },
    #[error("METIS needs a symmetric graph (load it with symmetrisation, the default)")]
    NotSymmetric,
    #[error("METIS failed: {0}")]
    Metis(String),
}

/// A partition of the nodes and its contiguous renumbering.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Partitioning {
    pub parts: usize,
    /// Owner of each node (original ids).
    pub part: Vec<u32>,
    /// New id of each original node: partition `p`'s nodes become `ptr[p]..ptr[p + 1]`, in
    /// their original order.
    pub perm: Vec<u32>,
    /// Original id of each new id (`inv_perm[perm[v]] == v`).
    pub inv_perm: Vec<u32>,
    /// Partition boundaries in new ids (`parts + 1` entries).
    pub ptr: Vec<u64>,
}

impl Partitioning {
    /// Builds the renumbering from owners (stable: nodes keep their relative order).
    pub fn from_parts(parts: usize, part: Vec<u32>) -> Partitioning {
        let n = part.len();
        let mut ptr = vec![0u64; parts + 1];
        for &p in &part {
            assert!((p as usize) < parts, "owner {p} out of range");
            ptr[p as usize + 1] += 1;
        }
        for p in 0..parts {
            ptr[p + 1] += ptr[p];
        }
        let mut cursor = ptr.clone();
        let mut perm = vec![0u32; n];
        let mut inv_perm = vec![0u32; n];
        for (v, &p) in part.iter().enumerate() {
            let id = cursor[p as usize];
            perm[v] = id as u32;
            inv_perm[id as usize] = v as u32;
            cursor[p as usize] += 1;
        }
        Partitioning { parts, part, perm, inv_perm, ptr }
    }

    /// Size of every partition.
    pub fn sizes(&self) -> Vec<u64> {
        self.ptr.windows(2).map(|w| w[1] - w[0]).collect()
    }
}

/// Partitions `graph` into `parts` partitions.
pub fn partition(graph: &Csr, parts: usize, method: Method) -> Result<Partitioning, PartitionError> {
    let n = graph.num_nodes();
    if parts == 0 {
        return Err(PartitionError::NoParts);
    }
    if parts > n.max(1) {
        return Err(PartitionError::TooManyParts { parts, nodes: n });
    }
    let part: Vec<u32> = match method {
        Method::Random { seed } => {
            (0..n as u64).map(|v| (hash_key(&[seed, v]) % parts as u64) as u32).collect()
        }
        Method::Contiguous => (0..n).map(|v| (v * parts / n.max(1)) as u32).collect(),
        Method::Metis { .. } if parts == 1 => vec![0; n],
        Method::Metis { seed } => metis_kway(graph, parts, seed)?,
        Method::Spinner { seed } => propagate(graph, parts, &LpaConfig::new(Objective::EdgeCut, seed)),
        Method::Multilevel { seed } => initial_partition(graph, parts, 1.03, seed),
        Method::Lpa { seed } => {
            let start = initial_partition(graph, parts, 1.03, seed);
            // from a good start the halo objective converges in a few rounds
            let cfg = LpaConfig { iterations_max: 20, ..LpaConfig::new(Objective::Halo, seed) };
            propagate_from(graph, parts, &cfg, start)
        }
    };
    Ok(Partitioning::from_parts(parts, part))
}

fn metis_kway(graph: &Csr, parts: usize, seed: u64) -> Result<Vec<u32>, PartitionError> {
    let max = metis::Idx::MAX as u64;
    let edges = graph.num_edges() as u64;
    if edges > max {
        return Err(PartitionError::MetisTooLarge { edges, max });
    }
    if !graph.is_symmetric() || graph.num_self_loops() > 0 {
        return Err(PartitionError::NotSymmetric);
    }
    let xadj: Vec<metis::Idx> = graph.row_ptr().iter().map(|&x| x as metis::Idx).collect();
    let adjncy: Vec<metis::Idx> = graph.col_idx().iter().map(|&x| x as metis::Idx).collect();
    let mut part = vec![0 as metis::Idx; graph.num_nodes()];
    // METIS keeps its random generator in process globals (GKlib's `gk_randinit` state), so
    // two partitionings running at once in one process — ranks as threads, tests in
    // parallel, a Python caller's threads — draw from each other's streams and the result
    // depends on timing. One at a time keeps a seed's partitioning the same on every run.
    static METIS: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one_at_a_time = METIS.lock().unwrap_or_else(|e| e.into_inner());
    metis::Graph::new(1, parts as metis::Idx, &xadj, &adjncy)
        .map_err(|e| PartitionError::Metis(e.to_string()))?
        .set_option(metis::option::Seed(seed as metis::Idx & metis::Idx::MAX))
        .part_kway(&mut part)
        .map_err(|e| PartitionError::Metis(e.to_string()))?;
    Ok(part.into_iter().map(|p| p as u32).collect())
}
