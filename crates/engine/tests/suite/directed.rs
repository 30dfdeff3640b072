//! Directed graphs with edge weights (issue 47, item 3): GCN on a directed, weighted graph
//! computes PyG's `GCNConv` with `edge_weight` (against a dense reference written out here),
//! trains partition by partition as in memory (the losses within the tiered tests' 1e-5) and
//! predicts the in-memory logits under partitions; what cannot use weights refuses them before
//! any partitioning, and a model file refuses a graph of another direction or weighting,
//! each refusal naming the fix.

use grinnder_engine::inference::Collect;
use grinnder_engine::model_file::GraphKind;
use grinnder_engine::{
    FeatureNorm, MiniBatchConfig, Mode, ModelFile, Output, Request, Sampler, TieredConfig, TrainConfig,
    Trainer, Weights,
};
use grinnder_graph::generate::{generate, preset, GenConfig};
use grinnder_graph::{BuildOptions, Csr, Dataset};
use grinnder_nn::{Kind, ModelConfig, Norm, OptimConfig};
use grinnder_partition::Method;
use grinnder_tensor::Cpu;

use crate::common::fit;

/// The tiered tests' tolerance (tiered.rs): reassociation in f32, relative to the scale.
const TOL: f64 = 1e-5;

/// A mixing hash of a node pair.
fn hash(a: u32, b: u32) -> u64 {
    let x = (a as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (b as u64).wrapping_mul(0xC2B2_AE3D_27D4_EB4F);
    (x ^ (x >> 29)).wrapping_mul(0x1656_67B1_9E37_79F9) >> 11
}

/// The generated graph with a quarter of its directed entries dropped (so that most edges run
/// one way only and in- and out-degrees differ), each kept edge `u → v` weighing one of
/// 0.25, 0.5, …, 4: a directed, weighted graph. Returns it with its edges `(u, v, w)`.
fn directed_weighted(seed: u64) -> (Dataset, Vec<(u32, u32, f32)>) {
    let mut ds = generate(&GenConfig::new(preset("arxiv-like").unwrap(), 0.002, seed))
        .unwrap()
        .into_dataset()
        .unwrap();
    let n = ds.num_nodes();
    let mut edges = Vec::new();
    // (rows are targets, in order, their sources ascending: the CSR's order)
    for v in 0..n as u32 {
        for &u in ds.graph.row(v as usize) {
            if hash(u, v) % 4 != 0 {
                edges.push((u, v, 0.25 * (1 + hash(v, u) % 16) as f32));
            }
        }
    }
    let (src, dst): (Vec<u32>, Vec<u32>) = edges.iter().map(|e| (e.0, e.1)).unzip();
    let opts = BuildOptions { symmetrise: false, ..BuildOptions::default() };
    ds.graph = Csr::from_edges(n as u64, &src, &dst, opts).unwrap();
    assert_eq!(ds.graph.num_edges(), edges.len(), "no edge merged");
    assert!(!ds.graph.is_symmetric());
    ds.edge_weight = Some(edges.iter().map(|e| e.2).collect::<Vec<f32>>().into());
    ds.directed = true;
    (ds, edges)
}

fn config(
    kind: Kind,
    layers: usize,
    norm: Norm,
    input_dropout: f64,
    feature_norm: FeatureNorm,
) -> TrainConfig {
    TrainConfig {
        lr_schedule: Default::default(),
        patience: None,
        model: ModelConfig {
            kind,
            layers,
            hidden: 16,
            dropout: 0.3,
            input_dropout,
            norm,
            residual: norm == Norm::Layer,
            heads: 2,
            attn_dropout: 0.1,
            gin_eps: 0.1,
            train_eps: false,
            alpha: grinnder_nn::model::DEFAULT_ALPHA,
            theta: grinnder_nn::model::DEFAULT_THETA,
            seed: 7,
        },
        optim: OptimConfig::Adam { lr: 0.02, weight_decay: 5e-4 },
        epochs: 4,
        eval_every: 1,
        feature_norm,
        feature_shift: None,
    }
}

fn gcn() -> TrainConfig {
    config(Kind::Gcn, 2, Norm::None, 0.0, FeatureNorm::None)
}

fn losses(ds: &Dataset, cfg: &TrainConfig, mode: Mode<'_, Cpu<f32>>) -> Vec<f64> {
    let mut seen = Vec::new();
    fit(&Cpu::<f32>::new(), ds, cfg, mode, &mut |m| seen.push(m.loss)).unwrap();
    seen
}

fn logits(ds: &Dataset, file: &ModelFile, mode: Mode<'_, Cpu<f32>>) -> Vec<f32> {
    let b = Cpu::<f32>::new();
    let mut c = Collect::new(ds.num_nodes());
    let mut t = Trainer::for_model(&b, ds, file, mode).unwrap();
    t.predict(&Request { output: Output::Logits, nodes: None }, &mut c).unwrap();
    c.values
}

fn trained(ds: &Dataset, cfg: &TrainConfig) -> ModelFile {
    let b = Cpu::<f32>::new();
    let mut t = Trainer::new(&b, ds, cfg.clone(), Mode::FullGraph).unwrap();
    t.fit(&mut |_| {}).unwrap();
    t.model_file(Weights::Last)
}

/// The largest deviation of `got` from `want`, relative to `want`'s largest magnitude.
fn deviation(got: &[f32], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(0f64, |m, x| m.max(x.abs()));
    assert!(scale > 0.0);
    got.iter().zip(want).fold(0f64, |m, (&g, &w)| m.max((g as f64 - w).abs())) / scale
}

fn tensor<'a>(file: &'a ModelFile, name: &str) -> &'a [f64] {
    &file.tensors.iter().find(|t| t.name == name).unwrap_or_else(|| panic!("no tensor {name}")).data
}

/// PyG's `GCNConv(x, edge_index, edge_weight)` written out: `Â = D̂^-1/2 (A_w + I) D̂^-1/2`
/// with `A_w[v][u]` the weight of `u → v` and `d̂(v) = 1 + Σ_u A_w[v][u]`; `y = Â x Wᵀ + b`.
fn dense_gcn(n: usize, edges: &[(u32, u32, f32)], x: &[Vec<f64>], w: &[f64], bias: &[f64]) -> Vec<Vec<f64>> {
    let (out, inp) = (bias.len(), x[0].len());
    let mut deg = vec![1f64; n];
    for &(_, v, wt) in edges {
        deg[v as usize] += wt as f64;
    }
    let xw: Vec<Vec<f64>> =
        x.iter().map(|r| (0..out).map(|o| (0..inp).map(|i| r[i] * w[o * inp + i]).sum()).collect()).collect();
    let mut y: Vec<Vec<f64>> = (0..n).map(|v| xw[v].iter().map(|a| a / deg[v]).collect()).collect();
    for &(u, v, wt) in edges {
        let c = wt as f64 / (deg[u as usize] * deg[v as usize]).sqrt();
        for o in 0..out {
            y[v as usize][o] += c * xw[u as usize][o];
        }
    }
    for row in &mut y {
        for (a, b) in row.iter_mut().zip(bias) {
            *a += b;
        }
    }
    y
}

#[test]
fn weighted_directed_gcn_computes_pygs_gcnconv_in_memory_and_by_partitions() {
    let (ds, edges) = directed_weighted(5);
    let file = trained(&ds, &gcn());
    let n = ds.num_nodes();
    let x: Vec<Vec<f64>> = (0..n).map(|v| ds.features.row(v).into_iter().map(f64::from).collect()).collect();
    let h = dense_gcn(n, &edges, &x, tensor(&file, "convs.0.lin.weight"), tensor(&file, "convs.0.bias"));
    let h: Vec<Vec<f64>> = h.into_iter().map(|r| r.into_iter().map(|a| a.max(0.0)).collect()).collect();
    let y = dense_gcn(n, &edges, &h, tensor(&file, "convs.1.lin.weight"), tensor(&file, "convs.1.bias"));
    let want: Vec<f64> = y.concat();
    let whole = logits(&ds, &file, Mode::FullGraph);
    let err = deviation(&whole, &want);
    assert!(err <= TOL, "in memory: {err:.3e} from the dense reference");
    for parts in [3, 4] {
        let got = logits(&ds, &file, Mode::Tiered(TieredConfig::in_ram(parts, Method::Metis { seed: 0 })));
        let err = deviation(&got, &want);
        assert!(err <= TOL, "{parts} parts: {err:.3e} from the dense reference");
    }
    // the weights and the direction are what makes it: the reference of the unweighted graph,
    // and of the graph made symmetric, are far from these logits
    let ones: Vec<(u32, u32, f32)> = edges.iter().map(|&(u, v, _)| (u, v, 1.0)).collect();
    let mut both: Vec<(u32, u32, f32)> = edges.iter().flat_map(|&(u, v, w)| [(u, v, w), (v, u, w)]).collect();
    both.sort_by_key(|e| (e.0, e.1));
    both.dedup_by_key(|e| (e.0, e.1));
    for (what, other) in [("unweighted", ones), ("symmetric", both)] {
        let h = dense_gcn(n, &other, &x, tensor(&file, "convs.0.lin.weight"), tensor(&file, "convs.0.bias"));
        let h: Vec<Vec<f64>> = h.into_iter().map(|r| r.into_iter().map(|a| a.max(0.0)).collect()).collect();
        let y = dense_gcn(n, &other, &h, tensor(&file, "convs.1.lin.weight"), tensor(&file, "convs.1.bias"));
        assert!(deviation(&whole, &y.concat()) > 1e-2, "the {what} graph gives the same logits");
    }
}

#[test]
fn weighted_directed_gcn_trains_by_partitions_as_in_memory() {
    let (ds, _) = directed_weighted(3);
    let storage = tempfile::tempdir().unwrap();
    // a fixed input (`Â x` computed once) and a dropped-out one (aggregated every epoch)
    for input_dropout in [0.0, 0.2] {
        let cfg = config(Kind::Gcn, 3, Norm::Layer, input_dropout, FeatureNorm::Row);
        let want = losses(&ds, &cfg, Mode::FullGraph);
        let forced = TieredConfig {
            cache_bytes: Some(0),
            storage_dir: Some(storage.path().to_path_buf()),
            ..TieredConfig::in_ram(5, Method::Metis { seed: 0 })
        };
        for (what, tc) in [
            ("4 parts", TieredConfig::in_ram(4, Method::Metis { seed: 0 })),
            ("4 random parts", TieredConfig::in_ram(4, Method::Random { seed: 1 })),
            ("5 parts, storage", forced),
        ] {
            let got = losses(&ds, &cfg, Mode::Tiered(tc));
            assert_eq!(got.len(), want.len());
            for (e, (a, b)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (a - b).abs() <= TOL * b,
                    "{what}, input dropout {input_dropout}: epoch {e}: {a} vs {b}"
                );
            }
        }
        // and the weights take part: without them the first loss is another
        let unweighted = Dataset { edge_weight: None, ..ds.clone() };
        let other = losses(&unweighted, &TrainConfig { epochs: 1, ..cfg.clone() }, Mode::FullGraph)[0];
        assert!(
            (other - want[0]).abs() > 1e-4 * want[0],
            "the weights change nothing: {other} vs {}",
            want[0]
        );
    }
}

#[test]
fn layers_and_modes_without_weights_refuse_them_before_partitioning_naming_the_fix() {
    let (ds, _) = directed_weighted(5);
    let b = Cpu::<f32>::new();
    let cache = tempfile::tempdir().unwrap();
    let tiered = || TieredConfig {
        partition_cache: Some(cache.path().to_path_buf()),
        ..TieredConfig::in_ram(4, Method::Metis { seed: 0 })
    };
    for (kind, layer) in
        [(Kind::Sage, "SAGEConv"), (Kind::Gat, "GATConv"), (Kind::Gin, "GINConv"), (Kind::Gatv2, "GATv2Conv")]
    {
        let cfg = config(kind, 2, Norm::None, 0.0, FeatureNorm::Row);
        for mode in [Mode::FullGraph, Mode::Tiered(tiered())] {
            let err = Trainer::new(&b, &ds, cfg.clone(), mode).err().expect("refused").to_string();
            assert!(
                err.contains(layer) && err.contains("--model gcn") && err.contains("edge_weight.npy"),
                "{kind:?}: {err}"
            );
        }
        // the same graph without weights trains
        let unweighted = Dataset { edge_weight: None, ..ds.clone() };
        assert!(Trainer::new(&b, &unweighted, cfg, Mode::FullGraph).is_ok());
    }
    let mb = MiniBatchConfig {
        fanouts: vec![-1, -1],
        sampler: Sampler::Neighbor,
        batch_size: 64,
        eval_parts: 1,
        max_batches: None,
        loader_threads: Some(1),
    };
    let mode = Mode::MiniBatch { config: mb, features: None };
    let err = Trainer::new(&b, &ds, gcn(), mode).err().expect("refused").to_string();
    assert!(err.contains("--mode full") && err.contains("mini-batches"), "{err}");
    // refused before any partitioning: nothing was cached, which a GCN run then is
    assert_eq!(std::fs::read_dir(cache.path()).unwrap().count(), 0, "partitioned before refusing");
    assert!(Trainer::new(&b, &ds, gcn(), Mode::Tiered(tiered())).is_ok());
    assert!(std::fs::read_dir(cache.path()).unwrap().count() > 0, "the cache is written by a run");
}

#[test]
fn a_model_file_refuses_a_graph_of_another_direction_or_weighting_naming_the_fix() {
    let (ds, _) = directed_weighted(5);
    let b = Cpu::<f32>::new();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.safetensors");
    trained(&ds, &gcn()).save(&path).unwrap();
    let file = ModelFile::load(&path).unwrap();
    assert_eq!(file.arch.graph, Some(GraphKind { directed: true, edge_weight: true }));
    let refusal = |ds: &Dataset, file: &ModelFile| {
        Trainer::for_model(&b, ds, file, Mode::FullGraph).err().expect("refused").to_string()
    };
    let undirected = Dataset { directed: false, ..ds.clone() };
    let err = refusal(&undirected, &file);
    assert!(err.contains("trained on a directed graph") && err.contains("give --directed"), "{err}");
    let unweighted = Dataset { edge_weight: None, ..ds.clone() };
    let err = refusal(&unweighted, &file);
    assert!(err.contains("trained with edge weights") && err.contains("edge_weight.npy"), "{err}");
    // the other way round: a model of the unweighted graph on the weighted one
    let plain = trained(&unweighted, &gcn());
    assert_eq!(plain.arch.graph, Some(GraphKind { directed: true, edge_weight: false }));
    let err = refusal(&ds, &plain);
    assert!(err.contains("trained without edge weights") && err.contains("remove edge_weight.npy"), "{err}");
    let sym = trained(&Dataset { directed: false, edge_weight: None, ..ds.clone() }, &gcn());
    let err = refusal(&unweighted, &sym);
    assert!(err.contains("trained on an undirected graph") && err.contains("leave out --directed"), "{err}");
    // a file that does not say (PyG's own) runs on either
    let mut pyg = ModelFile::load(&path).unwrap();
    pyg.arch.graph = None;
    assert!(Trainer::for_model(&b, &ds, &pyg, Mode::FullGraph).is_ok());
    assert!(Trainer::for_model(&b, &unweighted, &pyg, Mode::FullGraph).is_ok());
}
