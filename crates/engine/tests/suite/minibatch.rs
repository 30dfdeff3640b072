//! Mini-batch training: with full neighbourhoods (fanout -1) a batch's loss and every
//! parameter gradient equal the full-graph ones of the loss restricted to the batch's seeds
//! (normalisations from the whole graph, dropout masks keyed by node id); sampled batches
//! train; the same for ShaDow k-hop subgraphs with every neighbour; evaluation is the exact
//! full-graph forward.
//!
//! Tolerance: `max |a − b| / max |b|` per tensor, ≤ 1e-5 in f32 (reassociation), ≤ 1e-10 in
//! f64 where a test checks exactness itself.

use grinnder_engine::features::{feature_rows, feature_shift, features};
use grinnder_engine::minibatch::{batch_forward_backward, batches};
use grinnder_engine::{FeatureNorm, HostFeatures, MiniBatchConfig, Mode, Sampler, TrainConfig};
use grinnder_graph::generate::{generate, preset, GenConfig};
use grinnder_graph::sample::{KHopSampler, NeighborSampler};
use grinnder_graph::Dataset;
use grinnder_nn::{Graph, Kind, Model, ModelConfig, Norm, OptimConfig};
use grinnder_tensor::ops::*;
use grinnder_tensor::{Cpu, Mat};

use crate::common::fit;

/// Reassociation in f64 (the exactness tests).
const TOL_F64: f64 = 1e-10;

fn dataset() -> Dataset {
    generate(&GenConfig::new(preset("arxiv-like").unwrap(), 0.002, 5)).unwrap().into_dataset().unwrap()
}

fn model(kind: Kind, layers: usize) -> ModelConfig {
    ModelConfig {
        kind,
        layers,
        hidden: 16,
        dropout: 0.3,
        input_dropout: 0.2,
        norm: Norm::Layer,
        residual: true,
        heads: 2,
        attn_dropout: 0.2,
        gin_eps: 0.1,
        train_eps: true,
        alpha: grinnder_nn::model::DEFAULT_ALPHA,
        theta: grinnder_nn::model::DEFAULT_THETA,
        seed: 11,
    }
}

fn grads<T: grinnder_tensor::Scalar>(b: &Cpu<T>, m: &mut Model<Cpu<T>>) -> Vec<(String, Mat<T>)> {
    m.params_mut().into_iter().map(|p| (p.name.clone(), b.download(&p.grad))).collect()
}

#[test]
fn full_neighbourhood_batches_give_the_full_graph_gradients_of_their_seeds() {
    let ds = dataset();
    // in f64: that the batch is exact is under test, not f32 reassociation (GIN's ε gradient
    // is one sum over every node with much cancellation: 3.2e-5 of its value apart in f32)
    let b = Cpu::<f64>::new();
    let seeds: Vec<u32> = ds.splits.train.iter().copied().step_by(3).take(40).collect();
    let rows: Vec<u32> = seeds.clone();
    for kind in Kind::ALL {
        for layers in [2, 3] {
            let cfg = model(kind, layers);
            // the full graph, the loss on the seeds only
            let g = Graph::new(&b, &ds.graph);
            let x = features(&b, &ds, FeatureNorm::Row);
            let mut m = Model::init(&b, cfg.clone(), ds.features.dim, ds.num_classes as usize);
            m.prepare(&b, &g, &x);
            m.zero_grad(&b);
            let (logits, tape) = m.forward(&b, &g, &x, true, 4);
            let mut dl = b.zeros(logits.rows, logits.cols);
            let (loss_ref, _) = b.cross_entropy(&logits, &ds.labels, &rows, 1.0 / rows.len() as f64, &mut dl);
            m.backward(&b, &g, &x, tape, dl);
            let want = grads(&b, &mut m);
            // one batch of the same seeds, every neighbour: sampled per layer, and as the
            // seeds' whole k-hop subgraph (ShaDow)
            let neighbour = NeighborSampler::new(vec![-1; layers], 1).sample(&ds.graph, &seeds, 0);
            let khop = KHopSampler::new(vec![-1; layers], 1)
                .sample(&ds.graph, &seeds, 0)
                .into_batch(&ds.graph, layers);
            for (sampler, batch) in [("neighbour", neighbour), ("k-hop", khop)] {
                let input = batch.input_nodes();
                let shift = feature_shift(&ds, FeatureNorm::Row);
                let xb = Mat::from_vec(
                    input.len(),
                    ds.features.dim,
                    feature_rows::<f64>(&ds, FeatureNorm::Row, shift, input).unwrap(),
                );
                let mut mb = Model::init(&b, cfg.clone(), ds.features.dim, ds.num_classes as usize);
                mb.zero_grad(&b);
                let (loss, _) = batch_forward_backward(&b, &mut mb, &ds, &batch, xb, 4);
                let what = format!("{kind:?} {layers} layers, {sampler}");
                assert!((loss - loss_ref).abs() <= TOL_F64 * loss_ref, "{what}: loss {loss} vs {loss_ref}");
                for ((name, a), (_, r)) in grads(&b, &mut mb).iter().zip(&want) {
                    // relative to the tensor's scale
                    let scale = r.data.iter().fold(0f64, |m, x| m.max(x.abs()));
                    let e = a.max_rel_err(r, scale);
                    assert!(e <= TOL_F64, "{what}: {name} off by {e:.3e}");
                }
            }
        }
    }
}

#[test]
fn batches_cover_the_training_nodes_once_per_epoch() {
    let train: Vec<u32> = (0..1000).map(|i| i * 3).collect();
    let a = batches(&train, 64, 5, 0);
    assert_eq!(a.len(), 16);
    assert!(a[..15].iter().all(|b| b.len() == 64) && a[15].len() == 1000 - 15 * 64);
    let mut all: Vec<u32> = a.concat();
    all.sort_unstable();
    assert_eq!(all, train, "every training node once");
    assert_eq!(a, batches(&train, 64, 5, 0), "reproducible");
    assert_ne!(a, batches(&train, 64, 5, 1), "reshuffled every epoch");
}

#[test]
fn sampled_batches_train_and_evaluate_exactly() {
    let cora = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/cora");
    let ds = grinnder_graph::io::open(&cora, grinnder_graph::io::Format::Auto, &Default::default()).unwrap();
    let cfg = TrainConfig {
        lr_schedule: Default::default(),
        patience: None,
        model: ModelConfig {
            norm: Norm::None,
            residual: false,
            dropout: 0.0,
            input_dropout: 0.0,
            ..model(Kind::Sage, 2)
        },
        optim: OptimConfig::Adam { lr: 0.01, weight_decay: 0.0 },
        epochs: 8,
        eval_every: 4,
        feature_norm: FeatureNorm::Row,
        feature_shift: None,
    };
    let mb = MiniBatchConfig {
        fanouts: vec![5, 5],
        sampler: Sampler::Neighbor,
        batch_size: 32,
        eval_parts: 1,
        max_batches: None,
        loader_threads: None,
    };
    let mut seen = Vec::new();
    let s = fit(
        &Cpu::<f32>::new(),
        &ds,
        &cfg,
        Mode::MiniBatch { config: mb.clone(), features: None },
        &mut |m| seen.push(m.clone()),
    )
    .unwrap();
    assert_eq!(seen.len(), 8);
    assert!(seen[7].loss < 0.8 * seen[0].loss, "the loss falls: {} → {}", seen[0].loss, seen[7].loss);
    assert!(seen[3].valid_acc.is_some() && seen[2].valid_acc.is_none());
    // the reported accuracy is the full graph's: with one epoch of whole-training-set batches
    // and every neighbour, mini-batch training is full-graph training with one step per epoch
    let full_cfg = TrainConfig { epochs: 1, eval_every: 1, ..cfg.clone() };
    let whole = MiniBatchConfig {
        fanouts: vec![-1, -1],
        sampler: Sampler::Neighbor,
        batch_size: ds.splits.train.len(),
        eval_parts: 3,
        max_batches: None,
        loader_threads: None,
    };
    let a = fit(
        &Cpu::<f32>::new(),
        &ds,
        &full_cfg,
        Mode::MiniBatch { config: whole.clone(), features: None },
        &mut |_| {},
    )
    .unwrap();
    let f = fit(&Cpu::<f32>::new(), &ds, &full_cfg, Mode::FullGraph, &mut |_| {}).unwrap();
    assert!(
        (a.final_loss - f.final_loss).abs() <= 1e-5 * f.final_loss,
        "{} vs {}",
        a.final_loss,
        f.final_loss
    );
    assert_eq!((a.best_valid_acc, a.test_acc), (f.best_valid_acc, f.test_acc));
    assert!(s.best_valid_acc > 0.0);
    // ShaDow subgraphs (2 hops of 5) train too
    let shadow = MiniBatchConfig { sampler: Sampler::KHop, ..mb.clone() };
    let mut seen = Vec::new();
    fit(
        &Cpu::<f32>::new(),
        &ds,
        &cfg,
        Mode::MiniBatch { config: shadow.clone(), features: None },
        &mut |m| seen.push(m.clone()),
    )
    .unwrap();
    assert!(seen[7].loss < 0.8 * seen[0].loss, "k-hop: the loss falls: {} → {}", seen[0].loss, seen[7].loss);
    // a cap on the batches per epoch, and no evaluation at all
    let few = MiniBatchConfig { max_batches: Some(2), ..mb };
    let quiet = TrainConfig { epochs: 2, eval_every: 0, ..cfg };
    let mut seen = Vec::new();
    fit(&Cpu::<f32>::new(), &ds, &quiet, Mode::MiniBatch { config: few.clone(), features: None }, &mut |m| {
        seen.push(m.clone())
    })
    .unwrap();
    assert!(seen.iter().all(|m| m.tier.as_ref().unwrap().batches == Some(2) && m.valid_acc.is_none()));
}

#[test]
fn rows_staged_by_the_sampling_threads_train_exactly_like_rows_gathered_by_the_trainer() {
    // the staged copy path (each batch's rows gathered by its sampling thread into one of a few
    // host blocks, handed out in batch order; uploaded while the previous batch computes) gives
    // the same bits, epoch after epoch, with several threads running ahead and blocks reused
    let ds = dataset();
    let (cfg, mb) = (adam(model(Kind::Sage, 2), 3, 3), neighbour_batches(8));
    let pool = rayon::ThreadPoolBuilder::new().num_threads(8).build().unwrap();
    let run = |staged: bool| {
        let mut seen = Vec::new();
        let f = HostFeatures::new(&ds, cfg.feature_norm);
        let f = if staged { f.staged() } else { f };
        let b = Cpu::<f32>::new();
        let s = pool
            .install(|| {
                fit(&b, &ds, &cfg, Mode::MiniBatch { config: mb.clone(), features: Some(&f) }, &mut |m| {
                    seen.push(m.loss)
                })
            })
            .unwrap();
        (seen, s.test_acc, f.staged_batches())
    };
    let (plain, acc, none) = run(false);
    let (staged, staged_acc, n) = run(true);
    let per_epoch = ds.splits.train.len().div_ceil(8);
    assert!(per_epoch > 4 + 2, "more batches than staging blocks");
    assert_eq!((none, n), (0, 3 * per_epoch), "every batch staged");
    assert_eq!(plain, staged);
    assert_eq!(acc, staged_acc);
}

#[test]
fn gcnii_trains_by_sampled_batches() {
    // x0 of a batch's deeper blocks is the first rows of layer 0's (a block's rows lead its
    // columns): sampled batches train and the exact evaluation agrees with itself
    let ds = dataset();
    let cfg = adam(model(Kind::Gcnii, 2), 3, 3);
    let mode = Mode::MiniBatch { config: neighbour_batches(32), features: None };
    let mut losses = Vec::new();
    let s = fit(&Cpu::<f32>::new(), &ds, &cfg, mode, &mut |m| losses.push(m.loss)).unwrap();
    assert!(losses.iter().all(|l| l.is_finite()), "{losses:?}");
    assert!(losses[2] < losses[0], "GCNII by batches learns: {losses:?}");
    assert!(s.test_acc > 0.0, "{s:?}");
}

/// Training `model` with Adam (lr 0.01) for `epochs`, evaluating every `eval_every`.
fn adam(model: ModelConfig, epochs: usize, eval_every: usize) -> TrainConfig {
    TrainConfig {
        lr_schedule: Default::default(),
        patience: None,
        model,
        optim: OptimConfig::Adam { lr: 0.01, weight_decay: 0.0 },
        epochs,
        eval_every,
        feature_norm: FeatureNorm::Row,
        feature_shift: None,
    }
}

/// Batches of `batch_size` seeds, 5 neighbours sampled per layer (two layers).
fn neighbour_batches(batch_size: usize) -> MiniBatchConfig {
    MiniBatchConfig {
        fanouts: vec![5, 5],
        sampler: Sampler::Neighbor,
        batch_size,
        eval_parts: 1,
        max_batches: None,
        loader_threads: None,
    }
}
