//! Inference ([`Trainer::predict`]) against the in-memory forward: the same logits and
//! embeddings for any partitioning, tier and rank count, for every layer type; node subsets in
//! the order asked; model files that carry a model to another mode and to another graph.

use std::sync::Mutex;

use grinnder_dist::{Groups, ThreadComm};
use grinnder_engine::inference::Collect;
use grinnder_engine::{
    FeatureNorm, MiniBatchConfig, Mode, ModelFile, Output, Request, RowSink, Rows, Sampler, TieredConfig,
    TrainConfig, TrainError, Trainer, Weights,
};
use grinnder_graph::generate::{generate, preset, GenConfig};
use grinnder_graph::Dataset;
use grinnder_nn::{Kind, ModelConfig, Norm, OptimConfig};
use grinnder_partition::Method;
use grinnder_tensor::Cpu;

fn dataset(seed: u64) -> Dataset {
    generate(&GenConfig::new(preset("arxiv-like").unwrap(), 0.002, seed)).unwrap().into_dataset().unwrap()
}

fn config(kind: Kind, layers: usize, hidden: usize, norm: Norm, residual: bool) -> TrainConfig {
    TrainConfig {
        lr_schedule: Default::default(),
        patience: None,
        model: ModelConfig {
            kind,
            layers,
            hidden,
            dropout: 0.2,
            input_dropout: 0.0,
            norm,
            residual,
            heads: 2,
            attn_dropout: 0.1,
            gin_eps: 0.1,
            train_eps: kind == Kind::Gin,
            alpha: grinnder_nn::model::DEFAULT_ALPHA,
            theta: grinnder_nn::model::DEFAULT_THETA,
            seed: 7,
        },
        optim: OptimConfig::Adam { lr: 0.02, weight_decay: 0.0 },
        epochs: 2,
        eval_every: 1,
        feature_norm: FeatureNorm::Row,
        feature_shift: None,
    }
}

/// A model trained for two epochs in memory, as a model file.
fn trained(ds: &Dataset, cfg: &TrainConfig) -> ModelFile {
    let b = Cpu::<f32>::new();
    let mut t = Trainer::new(&b, ds, cfg.clone(), Mode::FullGraph).unwrap();
    t.fit(&mut |_| {}).unwrap();
    t.model_file(Weights::Last)
}

fn predict(t: &mut Trainer<'_, Cpu<f32>>, output: Output, n: usize) -> Collect {
    let mut c = Collect::new(n);
    t.predict(&Request { output, nodes: None }, &mut c).unwrap();
    c
}

/// `got` equals `want` within `rel` of the largest magnitude; every row written.
fn assert_close(got: &[f32], want: &[f32], rel: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let scale = want.iter().fold(0f64, |m, &x| m.max(x.abs() as f64)).max(1e-30);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g as f64 - w as f64).abs() <= rel * scale,
            "{what}: value {i}: {g} against {w} (scale {scale})"
        );
    }
}

fn tiered(parts: usize) -> TieredConfig {
    TieredConfig::in_ram(parts, Method::Metis { seed: 0 })
}

#[test]
fn predictions_equal_the_in_memory_forward_for_any_partitioning_and_tier() {
    let ds = dataset(5);
    let n = ds.num_nodes();
    let b = Cpu::<f32>::new();
    let storage = tempfile::tempdir().unwrap();
    let cases = [
        (Kind::Gcn, Norm::None, false),
        (Kind::Gcn, Norm::Layer, true),
        (Kind::Sage, Norm::None, false),
        (Kind::Sage, Norm::Layer, true),
        (Kind::Gat, Norm::None, false),
        (Kind::Gat, Norm::Layer, true),
        (Kind::Gin, Norm::None, false),
        (Kind::Gin, Norm::Layer, true),
        (Kind::Gatv2, Norm::None, false),
    ];
    for (kind, norm, residual) in cases {
        let cfg = config(kind, 3, 12, norm, residual);
        let file = trained(&ds, &cfg);
        let mut whole = Trainer::for_model(&b, &ds, &file, Mode::FullGraph).unwrap();
        let want: Vec<Collect> = [Output::Logits, Output::Embedding(0), Output::Embedding(1)]
            .into_iter()
            .map(|o| predict(&mut whole, o, n))
            .collect();
        let forced = TieredConfig {
            cache_bytes: Some(0),
            storage_dir: Some(storage.path().to_path_buf()),
            ..tiered(3)
        };
        for (what, tc) in
            [("1 part", tiered(1)), ("3 parts", tiered(3)), ("8 parts", tiered(8)), ("storage", forced)]
        {
            let mut t = Trainer::for_model(&b, &ds, &file, Mode::Tiered(tc)).unwrap();
            for (o, w) in [Output::Logits, Output::Embedding(0), Output::Embedding(1)].into_iter().zip(&want)
            {
                let got = predict(&mut t, o, n);
                assert_close(
                    &got.values,
                    &w.values,
                    1e-5,
                    &format!("{kind:?} {norm:?} {residual} {what} {o:?}"),
                );
            }
        }
    }
}

#[test]
fn a_trainer_set_up_to_predict_refuses_to_train_naming_why() {
    // its plan keeps no room for gradients (a training pass there could exceed the budgets)
    let ds = dataset(5);
    let b = Cpu::<f32>::new();
    let file = trained(&ds, &config(Kind::Gcn, 2, 16, Norm::None, false));
    for mode in [Mode::FullGraph, Mode::Tiered(tiered(3))] {
        let mut t = Trainer::for_model(&b, &ds, &file, mode).unwrap();
        let e = t.train_epoch().expect_err("refused").to_string();
        assert!(e.contains("set up from a model file to predict") && e.contains("for training"), "{e}");
        assert_eq!(t.epochs_done(), 0);
    }
}

#[test]
fn a_first_layer_run_inside_the_second_gives_its_embedding_too() {
    // GCN, hidden wider than the classes: layer 0 runs inside layer 1's transform (fused)
    let ds = dataset(5);
    let n = ds.num_nodes();
    let b = Cpu::<f32>::new();
    let file = trained(&ds, &config(Kind::Gcn, 2, 64, Norm::None, false));
    let mut whole = Trainer::for_model(&b, &ds, &file, Mode::FullGraph).unwrap();
    let want = predict(&mut whole, Output::Embedding(0), n);
    let mut t = Trainer::for_model(&b, &ds, &file, Mode::Tiered(tiered(4))).unwrap();
    let mut got = Collect::new(n);
    t.embed(0, None, &mut got).unwrap();
    assert_close(&got.values, &want.values, 1e-5, "fused layer 0");
    let logits = predict(&mut t, Output::Logits, n);
    assert_close(&logits.values, &predict(&mut whole, Output::Logits, n).values, 1e-5, "fused logits");
    // 3 layers wider than the classes: layer 0 over layer 1's columns and layer 2's transform
    // inside layer 1, so neither layer 0's nor layer 1's output is a block
    let file = trained(&ds, &config(Kind::Gcn, 3, 64, Norm::None, false));
    let mut whole = Trainer::for_model(&b, &ds, &file, Mode::FullGraph).unwrap();
    for parts in [1, 4] {
        let mut t = Trainer::for_model(&b, &ds, &file, Mode::Tiered(tiered(parts))).unwrap();
        for o in [Output::Embedding(0), Output::Embedding(1), Output::Logits] {
            let want = predict(&mut whole, o, n);
            assert_close(
                &predict(&mut t, o, n).values,
                &want.values,
                1e-5,
                &format!("3 layers, P={parts}, {o:?}"),
            );
        }
    }
}

#[test]
fn a_node_subset_gives_its_rows_in_the_order_asked_and_the_test_split_its_accuracy() {
    let ds = dataset(5);
    let n = ds.num_nodes();
    let b = Cpu::<f32>::new();
    let cfg = config(Kind::Sage, 2, 16, Norm::None, false);
    let mut t = Trainer::new(&b, &ds, cfg, Mode::Tiered(tiered(4))).unwrap();
    t.fit(&mut |_| {}).unwrap();
    let all = predict(&mut t, Output::Logits, n);
    let width = all.width;
    let nodes: Vec<u32> = (0..n as u32).rev().step_by(7).collect();
    for output in [Output::Logits, Output::Probs, Output::Class] {
        let mut c = Collect::new(nodes.len());
        t.predict(&Request { output, nodes: Some(nodes.clone()) }, &mut c).unwrap();
        for (i, &v) in nodes.iter().enumerate() {
            let row = &all.values[v as usize * width..(v as usize + 1) * width];
            match output {
                Output::Logits => assert_eq!(&c.values[i * width..(i + 1) * width], row),
                Output::Probs => {
                    let p = &c.values[i * width..(i + 1) * width];
                    assert!((p.iter().map(|&x| x as f64).sum::<f64>() - 1.0).abs() < 1e-5);
                    assert_eq!(
                        grinnder_engine::inference::argmax(p),
                        grinnder_engine::inference::argmax(row)
                    );
                }
                _ => assert_eq!(c.classes[i], grinnder_engine::inference::argmax(row) as i64),
            }
        }
    }
    // the test split's predicted classes give the accuracy evaluation gives
    let e = t.evaluate().unwrap();
    let mut c = Collect::new(ds.splits.test.len());
    let p =
        t.predict(&Request { output: Output::Class, nodes: Some(ds.splits.test.to_vec()) }, &mut c).unwrap();
    assert_eq!(p.correct.unwrap().1, ds.splits.test.len() as u64);
    assert_eq!(p.accuracy().unwrap(), e.test_acc);
}

#[test]
fn a_request_the_model_cannot_answer_is_refused_with_the_reason() {
    let ds = dataset(5);
    let b = Cpu::<f32>::new();
    let mut t = Trainer::new(&b, &ds, config(Kind::Gcn, 2, 8, Norm::None, false), Mode::FullGraph).unwrap();
    let mut c = Collect::new(4);
    let err =
        t.predict(&Request { output: Output::Embedding(1), nodes: None }, &mut c).unwrap_err().to_string();
    assert!(err.contains("layer 1 is not a hidden layer") && err.contains("0 to 0"), "{err}");
    let err = t
        .predict(&Request { output: Output::Logits, nodes: Some(vec![1, 2, 1]) }, &mut c)
        .unwrap_err()
        .to_string();
    assert!(err.contains("node 1 is asked for twice"), "{err}");
    let far = ds.num_nodes() as u32;
    let err = t
        .predict(&Request { output: Output::Logits, nodes: Some(vec![far]) }, &mut c)
        .unwrap_err()
        .to_string();
    assert!(err.contains(&format!("node {far} is not in the graph")), "{err}");
}

/// A sink shared by thread ranks.
struct Shared<'a>(&'a Mutex<Collect>);

impl RowSink for Shared<'_> {
    fn write(&mut self, at: &[u64], rows: Rows<'_>) -> Result<(), TrainError> {
        self.0.lock().unwrap().write(at, rows)
    }
}

#[test]
fn partition_parallel_ranks_predict_what_one_process_does() {
    let ds = dataset(5);
    let n = ds.num_nodes();
    let b = Cpu::<f32>::new();
    for kind in [Kind::Gcn, Kind::Gat] {
        let file = trained(&ds, &config(kind, 3, 12, Norm::Layer, false));
        let want =
            predict(&mut Trainer::for_model(&b, &ds, &file, Mode::FullGraph).unwrap(), Output::Logits, n);
        let emb = predict(
            &mut Trainer::for_model(&b, &ds, &file, Mode::FullGraph).unwrap(),
            Output::Embedding(1),
            n,
        );
        for ranks in [2, 3] {
            for (output, w) in [(Output::Logits, &want), (Output::Embedding(1), &emb)] {
                let out = Mutex::new(Collect::new(n));
                let counts = ThreadComm::run(ranks, |c| {
                    let b = Cpu::<f32>::new();
                    let groups = Groups::new(Box::new(c.clone()), 1);
                    let mode = Mode::Ranks {
                        tiered: tiered(4),
                        groups: &groups,
                        device: None,
                        expansion: grinnder_engine::Expansion::Plain,
                    };
                    let mut t = Trainer::for_model(&b, &ds, &file, mode).unwrap();
                    t.predict(&Request { output, nodes: None }, &mut Shared(&out)).unwrap()
                });
                let got = out.into_inner().unwrap();
                assert_close(&got.values, &w.values, 1e-5, &format!("{kind:?} {ranks} ranks {output:?}"));
                // every rank learns the whole graph's counts; the rows are split over them
                assert!(counts.windows(2).all(|w| w[0].correct == w[1].correct));
                assert_eq!(counts.iter().map(|c| c.rows).sum::<u64>(), n as u64);
            }
        }
    }
}

#[test]
fn a_model_trained_by_mini_batches_predicts_with_its_own_weights() {
    let ds = dataset(5);
    let n = ds.num_nodes();
    let b = Cpu::<f32>::new();
    let mb = MiniBatchConfig {
        fanouts: vec![4, 4],
        sampler: Sampler::Neighbor,
        batch_size: 32,
        eval_parts: 3,
        max_batches: None,
        loader_threads: Some(1),
    };
    let cfg = config(Kind::Sage, 2, 16, Norm::None, false);
    let mut t = Trainer::new(&b, &ds, cfg, Mode::MiniBatch { config: mb, features: None }).unwrap();
    t.fit(&mut |_| {}).unwrap();
    let got = predict(&mut t, Output::Logits, n);
    let file = t.model_file(Weights::Last);
    let want = predict(&mut Trainer::for_model(&b, &ds, &file, Mode::FullGraph).unwrap(), Output::Logits, n);
    assert_close(&got.values, &want.values, 1e-5, "mini-batch");
}

#[test]
fn a_model_file_runs_on_another_graph_of_the_same_width_and_refuses_one_of_another() {
    let ds = dataset(5);
    let b = Cpu::<f32>::new();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.safetensors");
    let cfg = config(Kind::Gcn, 2, 16, Norm::None, false);
    let mut t = Trainer::new(&b, &ds, cfg, Mode::FullGraph).unwrap();
    t.fit(&mut |_| {}).unwrap();
    let note = t.save_model(&path, Weights::BestValid).unwrap();
    assert!(note.contains("best validation"), "{note}");
    let file = ModelFile::load(&path).unwrap();
    assert!(file.arch.feature_shift.is_finite());
    // the next snapshot: another graph, the same features and classes
    let next = dataset(6);
    assert_ne!(next.graph.col_idx(), ds.graph.col_idx());
    let n = next.num_nodes();
    let want =
        predict(&mut Trainer::for_model(&b, &next, &file, Mode::FullGraph).unwrap(), Output::Logits, n);
    let got = predict(
        &mut Trainer::for_model(&b, &next, &file, Mode::Tiered(tiered(3))).unwrap(),
        Output::Logits,
        n,
    );
    assert_close(&got.values, &want.values, 1e-5, "next snapshot");
    // another feature width
    let mut narrow = dataset(6);
    narrow.features.dim = 64;
    narrow.features.data = narrow.features.data.to_f32_vec()[..n * 64].to_vec().into();
    let err = Trainer::for_model(&b, &narrow, &file, Mode::FullGraph).err().unwrap().to_string();
    assert!(err.contains("features per node") && err.contains("128") && err.contains("64"), "{err}");
}
