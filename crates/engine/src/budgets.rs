//! Budgets chosen from the machine when the user gives none: whether the whole graph trains in
//! the compute device's memory, else how many partitions, how much of the GPU and of the host
//! the tiered executor may use ([`choose`]). A budget the user gives is kept; the rest are
//! chosen around it. Every choice comes with its reason, for `info` and the logs.
//!
//! The sizes are estimates made before partitioning (the executor's plan, made after it, is
//! exact and refuses what does not fit): the in-memory trainer's footprint
//! ([`in_memory_bytes`]), the partition graphs ([`graph_bytes`]) and a partition's working set
//! ([`working_bytes`], with as many halo rows as own rows: what the project's partitioner left
//! on the community-structured presets at 16–64 parts).

/// What the model and the graph ask of memory.
#[derive(Clone, Debug, PartialEq)]
pub struct Workload {
    pub nodes: u64,
    /// Directed edges (every entry of the adjacency).
    pub edges: u64,
    /// Row widths from the input to the output: `[features, hidden, …, classes]`.
    pub widths: Vec<u64>,
    /// Per-edge values a layer keeps (GAT's attention: heads; 0 otherwise).
    pub edge_values: u64,
    /// The partition graphs keep their normalisation as factors per node, no value per entry
    /// (GCN without edge weights, SAGE, GIN: see the tiered executor's setup).
    pub factored: bool,
    /// Bytes of a computed element (4: f32).
    pub elem: u64,
    /// Inference only (`predict`): no gradients, a layer's output and a temporary.
    pub inference: bool,
    /// The width of an initial representation every layer reads beside its input (GCNII's
    /// `x₀`, kept with its gradient); 0 without one.
    pub initial: u64,
}

/// What the machine has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Room {
    /// Host bytes the process may hold in all ([`crate::machine::HostMemory::usable`]).
    pub host: u64,
    /// Free device bytes (`None`: training on the CPU).
    pub gpu_free: Option<u64>,
}

/// What the user gave (the flags).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Given {
    pub parts: Option<usize>,
    pub gpu_mem: Option<u64>,
    pub host_mem: Option<u64>,
    /// A flag of the tiered executor was given (`--host-mem`, `--storage-dir`, …): it trains
    /// partitioned even where the whole graph would fit.
    pub tiered: bool,
}

impl Given {
    /// No budget and no partition count given: the partitions are the executor's to double
    /// where a working set does not fit ([`crate::TieredConfig::auto_parts`]).
    pub fn auto_parts(&self) -> bool {
        self.parts.is_none() && self.host_mem.is_none() && self.gpu_mem.is_none()
    }
}

/// The chosen budgets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Budgets {
    /// Partitions for the tiered executor; `None`: the in-memory trainer.
    pub parts: Option<usize>,
    /// The GPU memory budget (given, or chosen from the free memory).
    pub gpu_mem: Option<u64>,
    /// With no `--host-mem`: the host memory the tiered executor may use before it keeps blocks
    /// under a budget with a storage tier ([`crate::TieredConfig::host_mem_auto`]).
    pub host_mem_auto: Option<u64>,
    /// Why, a line per choice.
    pub reasons: Vec<String>,
}

/// The share of the free device memory a chosen `--gpu-mem` takes (the rest: the CUDA
/// context's own allocations, cuBLAS's workspace, other processes).
const GPU_SHARE: f64 = 0.95;
/// The share of the usable host memory the tiered executor plans with (the rest: the
/// allocator's slack, the page cache the dataset's reads need).
const HOST_SHARE: f64 = 0.9;
/// The in-memory trainer is chosen where its estimate takes at most this share of the budget.
const IN_MEMORY_SHARE: f64 = 0.8;
/// Partitions are chosen so that the partition graphs and one partition's working set take at
/// most this share of the device budget: the rest holds blocks (the GPU tier) and the margin.
const STRUCTURE_SHARE: f64 = 0.6;
/// The most partitions chosen.
pub const PARTS_MAX: usize = 4096;

/// Refuses a model whose parameters (with their gradients and two optimizer moments, at
/// `elem` bytes each) cannot fit in the memory this machine leaves the process, before any
/// allocation: a size no machine holds (`--hidden 2147483648`) is an error naming the flags,
/// not an abort.
pub fn check_model(
    cfg: &grinnder_nn::ModelConfig,
    in_dim: usize,
    classes: usize,
    elem: u64,
) -> Result<(), crate::TrainError> {
    let room = crate::machine::HostMemory::read().usable();
    let need = cfg.parameter_bound(in_dim, classes).and_then(|p| p.checked_mul(4 * elem));
    // fits, or nothing to hold it against; refused where the bound overflows or exceeds room
    if need.is_some_and(|n| room.is_none_or(|r| n <= r)) {
        return Ok(());
    }
    let shape = format!(
        "{} layers of hidden width {}{} on {in_dim} features and {classes} classes",
        cfg.layers,
        cfg.hidden,
        if cfg.heads_of_hidden() > 1 {
            format!(" × {} heads", cfg.heads_of_hidden())
        } else {
            String::new()
        },
    );
    Err(crate::TrainError::Memory(format!(
        "the model's parameters, with their gradients and the optimizer's two moments, need {} ({shape}), more than the {} this machine leaves the run: a smaller --hidden, --layers, --heads or --num-classes",
        need.map_or("more bytes than a 64-bit machine addresses".into(), gib),
        room.map_or("memory".into(), gib)
    )))
}

fn gib(b: u64) -> String {
    format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64)
}

/// The in-memory trainer's bytes on its device: the graph with its transpose and values, the
/// features, and per layer its output, its gradient (not in inference) and a temporary as wide
/// as the wider side.
pub fn in_memory_bytes(w: &Workload) -> u64 {
    let layers = w.widths.len().saturating_sub(1);
    let (i, o) = (|l: usize| w.widths[l], |l: usize| w.widths[l + 1]);
    let kept = if w.inference { 1 } else { 2 };
    let per_layer: u64 = (0..layers).map(|l| w.nodes * (kept * o(l) + i(l).max(o(l)))).sum();
    graph_bytes(w)
        + w.nodes * w.widths[0] * w.elem
        + per_layer * w.elem
        + kept * w.nodes * w.initial * w.elem
        + 4 * w.edges * w.edge_values * w.elem
}

/// The whole graph on the device (the in-memory trainer): offsets, columns and values both
/// ways, and the transpose's entry permutation — 16 bytes an entry, and 4 more for the halo
/// columns' offsets and ids that partition graphs add (with [`partition_graph_bytes`]).
pub fn graph_bytes(w: &Workload) -> u64 {
    20 * w.edges + 24 * w.nodes
}

/// The partition graphs on the device: as [`graph_bytes`], but 8 bytes an entry fewer where
/// the values are factored (no value per entry, no transposed entry order).
pub fn partition_graph_bytes(w: &Workload) -> u64 {
    if w.factored {
        12 * w.edges + 24 * w.nodes
    } else {
        graph_bytes(w)
    }
}

/// The largest partition's working set over `parts` partitions (balance 1.1, as many halo rows
/// as own rows): on a device three matrices over its columns at the widest layer (a split
/// layer's gathered rows, its output and a temporary), on the host six; its entries twice, and
/// per-edge values. Where this falls short (more halo than own rows), the executor doubles
/// the partitions ([`crate::TieredConfig::auto_parts`]). (The GPU held
/// 35.6 GiB with papers-like at scale 0.5 over 32 partitions, 2026-12-04: 31.4 GiB of graphs
/// by [`graph_bytes`] and 11 GiB of working set by this, an upper bound.)
pub fn working_bytes(w: &Workload, parts: usize, host: bool) -> u64 {
    let p = parts.max(1) as f64;
    let rows = (1.1 * w.nodes as f64 / p).ceil() as u64;
    let cols = (2 * rows).min(w.nodes);
    let nnz = (1.1 * w.edges as f64 / p).ceil() as u64;
    let widest = w.widths.iter().copied().max().unwrap_or(0);
    // the host's plan counts an unsplit layer as six matrices over the columns (it keeps
    // what the device recomputes)
    let matrices = if host { 6 } else { 3 };
    // (x0's own rows and their gradient beside a layer that reads them)
    (matrices * cols * widest + 2 * rows * w.initial + 2 * nnz + 4 * nnz * w.edge_values) * w.elem
}

/// The budgets for `w` on a machine with `room`, keeping what `given` fixes. `Err` names what
/// cannot fit and the flag that would change it.
pub fn choose(w: &Workload, room: Room, given: Given) -> Result<Budgets, String> {
    let mut reasons = Vec::new();
    let cuda = room.gpu_free.is_some();
    let gpu_mem = match (given.gpu_mem, room.gpu_free) {
        (Some(g), _) => Some(g),
        (None, Some(free)) => {
            let g = (free as f64 * GPU_SHARE) as u64;
            reasons.push(format!(
                "GPU budget {}: {:.0} % of the {} free on the device",
                gib(g),
                GPU_SHARE * 100.0,
                gib(free)
            ));
            Some(g)
        }
        (None, None) => None,
    };
    let host = given.host_mem.unwrap_or((room.host as f64 * HOST_SHARE) as u64);
    // where the model computes: the GPU's budget, or the host's
    let device = if cuda { gpu_mem.unwrap_or(0) } else { host };
    let whole = in_memory_bytes(w);
    let host_mem_auto = given.host_mem.is_none().then_some(host);
    if given.parts.is_none() && !given.tiered && whole as f64 <= IN_MEMORY_SHARE * device as f64 {
        reasons.push(format!(
            "the whole graph in {} memory: about {} of the {} there",
            if cuda { "GPU" } else { "host" },
            gib(whole),
            gib(device)
        ));
        return Ok(Budgets { parts: None, gpu_mem: given.gpu_mem, host_mem_auto: None, reasons });
    }
    let parts = match given.parts {
        Some(p) => p,
        None => {
            let fits = |p: usize| {
                (partition_graph_bytes(w) + working_bytes(w, p, !cuda)) as f64
                    <= STRUCTURE_SHARE * device as f64
            };
            // at least 4, the executor's long-standing default
            let counts = || (2..).map(|k| 1usize << k).take_while(|&p| p <= PARTS_MAX);
            let Some(p) = counts().find(|&p| fits(p)) else {
                // values per entry where factors would do (GAT and edge weights cannot)
                let factored = Workload { factored: true, ..w.clone() };
                let factored_would_fit = !w.factored
                    && w.edge_values == 0
                    && counts().any(|p| {
                        (partition_graph_bytes(&factored) + working_bytes(&factored, p, !cuda)) as f64
                            <= STRUCTURE_SHARE * device as f64
                    });
                return Err(format!(
                    "the graph does not fit: its structure alone takes about {} of the {} {} budget; {}",
                    gib(partition_graph_bytes(w)),
                    gib(device),
                    if cuda { "GPU" } else { "host" },
                    match (cuda, factored_would_fit) {
                        (true, true) => "without GRINNDER_FACTORED=0 the partition graphs keep their normalisation per node (8 bytes an entry less) and fit; or train on a larger GPU, or with --device cpu",
                        (true, false) => "train on a larger GPU, or with --device cpu",
                        _ => "train on a machine with more memory",
                    }
                ));
            };
            let why = if whole as f64 <= IN_MEMORY_SHARE * device as f64 {
                "a setting of the partitioned executor was given (--host-mem, --storage-dir, …)".to_string()
            } else {
                format!(
                    "the whole graph would take about {} of the {} {} budget",
                    gib(whole),
                    gib(device),
                    if cuda { "GPU" } else { "host" }
                )
            };
            reasons.push(format!(
                "{p} partitions: {why}; over {p} the partition graphs take about {} and the largest partition's working set {}",
                gib(partition_graph_bytes(w)),
                gib(working_bytes(w, p, !cuda))
            ));
            p
        }
    };
    if let Some(h) = host_mem_auto {
        reasons.push(format!(
            "host: every block in RAM while they fit in {} ({:.0} % of the {} usable), beyond that a budget of that size with a storage tier",
            gib(h),
            HOST_SHARE * 100.0,
            gib(room.host)
        ));
    }
    Ok(Budgets { parts: Some(parts), gpu_mem, host_mem_auto, reasons })
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: u64 = 1 << 30;

    /// ogbn-papers100M's size with a 2-layer GCN of hidden 256.
    fn papers() -> Workload {
        Workload {
            nodes: 111_059_956,
            edges: 3_231_371_744,
            widths: vec![128, 256, 172],
            edge_values: 0,
            factored: true,
            elem: 4,
            inference: false,
            initial: 0,
        }
    }

    fn products() -> Workload {
        Workload {
            nodes: 2_449_029,
            edges: 123_718_280,
            widths: vec![100, 256, 47],
            edge_values: 0,
            factored: true,
            elem: 4,
            inference: false,
            initial: 0,
        }
    }

    #[test]
    fn a_graph_that_fits_trains_in_memory() {
        let b =
            choose(&products(), Room { host: 120 * G, gpu_free: Some(139 * G) }, Given::default()).unwrap();
        assert_eq!(b.parts, None);
        assert_eq!(b.gpu_mem, None, "no budget forced on the in-memory trainer");
        assert!(b.reasons.iter().any(|r| r.contains("whole graph in GPU memory")), "{:?}", b.reasons);
        // on a 24 GiB host without a GPU too (about 13.5 GiB by the estimate)
        let b = choose(&products(), Room { host: 23 * G, gpu_free: None }, Given::default()).unwrap();
        assert_eq!(b.parts, None);
    }

    #[test]
    fn papers100m_on_an_h200_is_partitioned_within_the_gpu_and_the_host() {
        for factored in [true, false] {
            papers100m_on_an_h200(Workload { factored, ..papers() });
        }
    }

    fn papers100m_on_an_h200(w: Workload) {
        let room = Room { host: 125 * G, gpu_free: Some(139 * G) };
        let b = choose(&w, room, Given::default()).unwrap();
        let p = b.parts.expect("partitioned");
        assert!((16..=128).contains(&p), "{p} partitions");
        let g = b.gpu_mem.unwrap();
        assert!((130 * G..=139 * G).contains(&g), "GPU budget {}", gib(g));
        assert_eq!(b.host_mem_auto, Some((125.0 * G as f64 * HOST_SHARE) as u64));
        // the structure and a working set leave room for blocks
        let structure = partition_graph_bytes(&w);
        assert!(structure + working_bytes(&w, p, false) <= (0.6 * g as f64) as u64);
        // fewer partitions would not leave it
        assert!(structure + working_bytes(&w, p / 2, false) > (0.6 * g as f64) as u64 || p == 2);
    }

    #[test]
    fn an_initial_representation_is_counted_with_its_gradient() {
        // GCNII's x0 and its gradient: two hidden-wide arrays over the nodes in memory, two
        // over a partition's own rows in its working set; one array to predict
        let (w, gcnii) = (papers(), Workload { initial: 256, ..papers() });
        assert_eq!(in_memory_bytes(&gcnii) - in_memory_bytes(&w), 2 * w.nodes * 256 * 4);
        let rows = (1.1 * w.nodes as f64 / 64.0).ceil() as u64;
        assert_eq!(working_bytes(&gcnii, 64, false) - working_bytes(&w, 64, false), 2 * rows * 256 * 4);
        let infer = |w: Workload| in_memory_bytes(&Workload { inference: true, ..w });
        assert_eq!(infer(gcnii) - infer(w.clone()), w.nodes * 256 * 4);
        // and on a machine where that matters, more partitions
        let room = Room { host: 124 << 30, gpu_free: Some(6 << 30) };
        let parts = |w: &Workload| choose(w, room, Given::default()).unwrap().parts.unwrap();
        assert!(parts(&Workload { initial: 4096, ..products() }) > parts(&products()));
    }

    #[test]
    fn a_smaller_gpu_takes_more_partitions_and_given_flags_are_kept() {
        let w = papers();
        let big = choose(&w, Room { host: 125 * G, gpu_free: Some(139 * G) }, Given::default()).unwrap();
        let small = choose(&w, Room { host: 125 * G, gpu_free: Some(120 * G) }, Given::default()).unwrap();
        assert!(small.parts.unwrap() >= big.parts.unwrap());
        let given = Given { parts: Some(32), gpu_mem: Some(48 * G), host_mem: Some(100 * G), tiered: true };
        let b = choose(&w, Room { host: 125 * G, gpu_free: Some(139 * G) }, given).unwrap();
        assert_eq!((b.parts, b.gpu_mem, b.host_mem_auto), (Some(32), Some(48 * G), None));
        // parts given on a graph that fits: the tiered executor all the same
        let b = choose(
            &products(),
            Room { host: 125 * G, gpu_free: Some(139 * G) },
            Given { parts: Some(4), ..given },
        )
        .unwrap();
        assert_eq!(b.parts, Some(4));
    }

    #[test]
    fn inference_needs_less_than_training() {
        let train = products();
        let infer = Workload { inference: true, ..products() };
        assert!(in_memory_bytes(&infer) < in_memory_bytes(&train));
        // a 16 GiB host without a GPU: products-like trains partitioned, predicts whole
        let room = Room { host: 16 * G, gpu_free: None };
        assert!(choose(&train, room, Given::default()).unwrap().parts.is_some());
        assert_eq!(choose(&infer, room, Given::default()).unwrap().parts, None);
    }

    /// Values per entry (GAT, edge weights) take 8 bytes an entry more: on an H100's 79 GiB
    /// papers100M's partition graphs leave room for a working set only without them.
    #[test]
    fn factored_partition_graphs_leave_a_smaller_gpu_room() {
        let room = Room { host: 125 * G, gpu_free: Some(79 * G) };
        let per_entry = Workload { factored: false, ..papers() };
        assert!(partition_graph_bytes(&per_entry) - partition_graph_bytes(&papers()) == 8 * papers().edges);
        let e = choose(&per_entry, room, Given::default()).unwrap_err();
        assert!(e.contains("structure alone") && e.contains("without GRINNDER_FACTORED=0"), "{e}");
        assert!(choose(&papers(), room, Given::default()).unwrap().parts.is_some());
        // the in-memory trainer's whole graph keeps values per entry either way
        assert_eq!(graph_bytes(&per_entry), graph_bytes(&papers()));
    }

    #[test]
    fn a_gpu_too_small_for_the_structure_is_refused_naming_the_fix() {
        let e =
            choose(&papers(), Room { host: 125 * G, gpu_free: Some(24 * G) }, Given::default()).unwrap_err();
        assert!(e.contains("structure alone") && e.contains("--device cpu"), "{e}");
    }

    #[test]
    fn on_the_cpu_a_graph_larger_than_the_host_is_partitioned_with_a_host_budget() {
        let w = Workload {
            nodes: 3_500_000,
            edges: 42_000_000,
            widths: vec![1024, 256, 19],
            edge_values: 0,
            factored: true,
            elem: 4,
            inference: false,
            initial: 0,
        };
        assert!(in_memory_bytes(&w) > 24 * G, "{}", gib(in_memory_bytes(&w)));
        let b = choose(&w, Room { host: 23 * G, gpu_free: None }, Given::default()).unwrap();
        assert!(b.parts.is_some());
        assert_eq!(b.gpu_mem, None);
        assert!(b.host_mem_auto.unwrap() < 23 * G);
    }
}
