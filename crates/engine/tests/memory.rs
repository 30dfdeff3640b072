//! The in-memory trainer learns, reports per-epoch figures, and refuses unusable splits.

use grinnder_engine::{train, FeatureNorm, TrainConfig, TrainError};
use grinnder_graph::generate::{generate, preset, GenConfig};
use grinnder_nn::{Kind, ModelConfig, Norm, OptimConfig};
use grinnder_tensor::Cpu;

fn config(kind: Kind, epochs: usize) -> TrainConfig {
    TrainConfig {
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
            seed: 1,
        },
        optim: OptimConfig::Adam { lr: 0.02, weight_decay: 0.0 },
        epochs,
        eval_every: 1,
        feature_norm: FeatureNorm::None,
    }
}

#[test]
fn every_model_learns_a_generated_graph() {
    let ds =
        generate(&GenConfig::new(preset("arxiv-like").unwrap(), 0.005, 2)).unwrap().into_dataset().unwrap();
    for kind in [Kind::Gcn, Kind::Sage, Kind::Gat] {
        let mut seen = Vec::new();
        let s = train(&Cpu::<f32>::new(), &ds, &config(kind, 30), &mut |m| seen.push(m.clone())).unwrap();
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
    let err = train(&Cpu::<f32>::new(), &ds, &config(Kind::Gcn, 1), &mut |_| {}).unwrap_err();
    assert!(matches!(err, TrainError::Unlabelled { split: "valid", .. }), "{err}");
}
