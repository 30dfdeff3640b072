//! The in-memory trainer learns, reports per-epoch figures, and refuses unusable splits.

use grinnder_engine::{FeatureNorm, Mode, TrainConfig, TrainError};
use grinnder_graph::generate::{generate, preset, GenConfig};
use grinnder_nn::{Kind, ModelConfig, Norm, OptimConfig};
use grinnder_tensor::Cpu;

mod common;
use common::fit;

fn config(kind: Kind, epochs: usize) -> TrainConfig {
    TrainConfig {
        lr_schedule: Default::default(),
        patience: None,
        model: ModelConfig {
            kind,
            layers: 2,
            hidden: 16,
            dropout: 0.2,
            input_dropout: 0.0,
            norm: Norm::None,
            residual: false,
            heads: 2,
            attn_dropout: 0.1,
            gin_eps: 0.1,
            train_eps: true,
            alpha: grinnder_nn::model::DEFAULT_ALPHA,
            theta: grinnder_nn::model::DEFAULT_THETA,
            seed: 1,
        },
        optim: OptimConfig::Adam { lr: 0.02, weight_decay: 0.0 },
        epochs,
        eval_every: 1,
        feature_norm: FeatureNorm::None,
        feature_shift: None,
    }
}

#[test]
fn every_model_learns_a_generated_graph() {
    let ds =
        generate(&GenConfig::new(preset("arxiv-like").unwrap(), 0.005, 2)).unwrap().into_dataset().unwrap();
    for kind in Kind::ALL {
        let mut seen = Vec::new();
        let s =
            fit(&Cpu::<f32>::new(), &ds, &config(kind, 30), Mode::FullGraph, &mut |m| seen.push(m.clone()))
                .unwrap();
        assert_eq!(seen.len(), 30);
        assert!(
            seen.last().unwrap().loss < seen[0].loss * 0.7,
            "{kind:?}: loss {} → {}",
            seen[0].loss,
            seen.last().unwrap().loss
        );
        // 40 classes: chance is 2.5 %
        assert!(s.test_acc > 0.3, "{kind:?}: test accuracy {}", s.test_acc);
        assert_eq!(Some(s.test_acc), seen[s.best_epoch].test_acc);
    }
}

#[test]
fn unlabelled_split_nodes_are_refused() {
    let mut ds =
        generate(&GenConfig::new(preset("arxiv-like").unwrap(), 0.002, 3)).unwrap().into_dataset().unwrap();
    let v = ds.splits.valid[0] as usize;
    let mut labels = ds.labels.to_vec();
    labels[v] = grinnder_graph::NO_LABEL;
    ds.labels = labels.into();
    let err = fit(&Cpu::<f32>::new(), &ds, &config(Kind::Gcn, 1), Mode::FullGraph, &mut |_| {}).unwrap_err();
    assert!(matches!(err, TrainError::Unlabelled { split: "valid", .. }), "{err}");
}

#[test]
fn features_made_chunk_by_chunk_equal_the_whole_table() {
    use grinnder_engine::features::{features, features_in_chunks};
    let ds =
        generate(&GenConfig::new(preset("arxiv-like").unwrap(), 0.005, 4)).unwrap().into_dataset().unwrap();
    let c = Cpu::<f32>::new();
    let row = ds.features.dim * 4;
    for norm in [FeatureNorm::None, FeatureNorm::Row] {
        let whole = features(&c, &ds, norm);
        assert_eq!((whole.rows, whole.cols), (ds.num_nodes(), ds.features.dim));
        // the first row preprocessed by hand: raw, or shifted by the minimum and summed to 1
        let all = ds.features.data.to_f32_vec();
        let r0 = &all[..ds.features.dim];
        let min = all.iter().copied().fold(f32::INFINITY, f32::min) as f64;
        let sum = r0.iter().map(|&v| v as f64 - min).sum::<f64>().max(1.0);
        for (j, &v) in r0.iter().enumerate() {
            let want = match norm {
                FeatureNorm::None => v,
                FeatureNorm::Row => ((v as f64 - min) / sum) as f32,
            };
            assert_eq!(whole.data[j], want, "{norm:?}, column {j}");
        }
        // chunks of 7 rows and a few bytes (the last one short), of one row, larger than all
        for chunk in [7 * row + 3, row, row / 2, usize::MAX / 2] {
            let got = features_in_chunks(&c, &ds, norm, Some(chunk));
            assert_eq!(got.data, whole.data, "{norm:?}, chunks of {chunk} bytes");
        }
    }
}
