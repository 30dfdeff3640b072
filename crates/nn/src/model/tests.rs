//! What a model holds, against what its configuration says before it is made.

use super::*;

#[test]
fn every_family_counts_the_values_its_layers_hold() {
    let b = grinnder_tensor::Cpu::<f32>::new();
    for kind in Kind::ALL {
        for (layers, hidden, in_dim, classes, norm) in
            [(1, 16, 40, 7, Norm::None), (2, 16, 300, 172, Norm::Layer), (3, 64, 8, 5, Norm::None)]
        {
            let config = ModelConfig {
                kind,
                layers,
                hidden,
                dropout: 0.0,
                input_dropout: 0.0,
                norm,
                residual: false,
                heads: 2,
                attn_dropout: 0.0,
                gin_eps: 0.0,
                train_eps: true,
                alpha: DEFAULT_ALPHA,
                theta: DEFAULT_THETA,
                seed: 0,
            };
            let bound = config.parameter_bound(in_dim, classes).unwrap();
            let mut m = Model::init(&b, config, in_dim, classes);
            let held: u64 = m.state_mut().iter().map(|p| (p.value.rows * p.value.cols) as u64).sum();
            // (model files refuse metadata whose count passes 4× the values they hold)
            assert_eq!(held, bound, "{kind} {layers} layers of {hidden}, {in_dim} → {classes}");
        }
    }
}
