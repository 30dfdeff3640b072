//! A criterion of the caller's (`Executor::forward_backward_with`) and a model of the caller's
//! whole layers (`Executor::for_layers`, `Model::from_layers`): the gradients are those of
//! whole-graph training under that criterion, for any partitioning and with every block
//! through storage. Tolerance as in `tiered.rs`: f32 reassociation, 1e-5 of a tensor's scale.

use grinnder_engine::features::features;
use grinnder_engine::tiered::{Executor, TieredConfig};
use grinnder_engine::FeatureNorm;
use grinnder_graph::generate::{generate, preset, GenConfig};
use grinnder_graph::Dataset;
use grinnder_nn::conv::LayerSpec;
use grinnder_nn::{Aggregation, Graph, Kind, Model, ModelConfig, Norm};
use grinnder_partition::Method;
use grinnder_tensor::ops::*;
use grinnder_tensor::{Cpu, Mat};

const TOL: f64 = 1e-5;

fn dataset() -> Dataset {
    generate(&GenConfig::new(preset("arxiv-like").unwrap(), 0.002, 5)).unwrap().into_dataset().unwrap()
}

fn config(kind: Kind) -> ModelConfig {
    ModelConfig {
        kind,
        layers: 3,
        hidden: 16,
        dropout: 0.0,
        input_dropout: 0.0,
        norm: Norm::None,
        residual: false,
        heads: 1,
        attn_dropout: 0.0,
        gin_eps: 0.0,
        train_eps: false,
        alpha: grinnder_nn::model::DEFAULT_ALPHA,
        theta: grinnder_nn::model::DEFAULT_THETA,
        seed: 7,
    }
}

/// A model of whole layers: GCN convs stacked bare (no ReLU between them), widths
/// `[in, 24, 12, classes]` — nothing a built-in family's model is.
fn whole_layers(b: &Cpu<f32>, ds: &Dataset) -> Model<Cpu<f32>> {
    let cfg = config(Kind::Gcn);
    let dims = vec![ds.features.dim, 24, 12, ds.num_classes as usize];
    let convs = (0..3)
        .map(|l| {
            let spec = LayerSpec {
                l,
                in_dim: dims[l],
                out_dim: dims[l + 1],
                seed: 40 + l as u64,
                ..cfg.layer_spec(l, 1, 1)
            };
            Kind::Gcn.conv(b, &spec).unwrap()
        })
        .collect();
    Model::from_layers(convs, dims, Aggregation::GcnNorm, 7)
}

/// A weighted mean squared error against one-hot labels, weights by class: a loss the
/// built-in cross entropy is not, normalised over the whole train split (its weights' sum).
fn weighted_mse(ds: &Dataset) -> impl Fn(&[u32], &[f32], usize) -> (f64, Vec<f32>) + '_ {
    move |ids, rows, width| {
        let w = |v: u32| 1.0 + (ds.labels[v as usize] % 3) as f64;
        let total: f64 = ids.iter().map(|&v| w(v)).sum();
        let (mut loss, mut grad) = (0.0, vec![0f32; rows.len()]);
        for (i, &v) in ids.iter().enumerate() {
            for c in 0..width {
                let target = if ds.labels[v as usize] as usize == c { 1.0 } else { 0.0 };
                let d = rows[i * width + c] as f64 - target;
                loss += w(v) * d * d / total;
                grad[i * width + c] = (2.0 * w(v) * d / total) as f32;
            }
        }
        (loss, grad)
    }
}

/// A loss over the train split's rows: `(ids, rows, width)` to the loss and the rows' gradient.
type Loss<'a> = dyn Fn(&[u32], &[f32], usize) -> (f64, Vec<f32>) + 'a;

/// A loss and the gradients it gives, by parameter.
type Outcome = (f64, Vec<(String, Mat<f32>)>);

fn grads(b: &Cpu<f32>, m: &mut Model<Cpu<f32>>) -> Vec<(String, Mat<f32>)> {
    m.params_mut().into_iter().map(|p| (p.name.clone(), b.download(&p.grad))).collect()
}

/// The whole graph's loss and gradients under `loss`, in memory.
fn reference(b: &Cpu<f32>, ds: &Dataset, mut m: Model<Cpu<f32>>, loss: &Loss<'_>) -> Outcome {
    let g = Graph::new(b, &ds.graph);
    let x = features(b, ds, FeatureNorm::Row);
    m.prepare(b, &g, &x);
    m.zero_grad(b);
    let (y, tape) = m.forward(b, &g, &x, true, 0);
    let ids = &ds.splits.train;
    let rows: Vec<f32> = ids.iter().flat_map(|&v| y.row(v as usize).to_vec()).collect();
    let (l, d) = loss(ids, &rows, y.cols);
    let mut dy = Mat::zeros(y.rows, y.cols);
    for (i, &v) in ids.iter().enumerate() {
        dy.row_mut(v as usize).copy_from_slice(&d[i * y.cols..(i + 1) * y.cols]);
    }
    m.backward(b, &g, &x, tape, dy);
    (l, grads(b, &mut m))
}

fn assert_close(
    what: &str,
    (loss, got): &(f64, Vec<(String, Mat<f32>)>),
    (want_loss, want): &(f64, Vec<(String, Mat<f32>)>),
) {
    assert!((loss - want_loss).abs() <= TOL * want_loss.abs(), "{what}: loss {loss} vs {want_loss}");
    assert_eq!(got.len(), want.len(), "{what}");
    for ((name, a), (_, b)) in got.iter().zip(want) {
        let scale = b.data.iter().fold(0f64, |m, &x| m.max((x as f64).abs()));
        assert!(scale > 0.0, "{what}: {name} has an all-zero reference gradient");
        let err = a.max_rel_err(b, scale);
        assert!(err <= TOL, "{what}: {name} off by {err:.3e} of its scale");
    }
}

fn tiered(parts: usize, storage: Option<&std::path::Path>) -> TieredConfig {
    let tc = TieredConfig::in_ram(parts, Method::Random { seed: 1 });
    match storage {
        // every block in a file: a host cache of nothing
        Some(dir) => TieredConfig { storage_dir: Some(dir.to_path_buf()), cache_bytes: Some(0), ..tc },
        None => tc,
    }
}

#[test]
fn a_criterion_of_the_callers_gives_whole_graph_gradients_for_built_in_models() {
    let (b, ds) = (Cpu::<f32>::new(), dataset());
    let loss = weighted_mse(&ds);
    let dir = tempfile::tempdir().unwrap();
    // (GAT's attention vectors' gradients vanish under this loss at initialisation, 1e-8 to
    // 1e-13 of anything else: noise-level figures no tolerance of their scale can compare)
    // GCNII drops its input inside every layer, the output layer too: the criterion sees the
    // output rows with that dropout, as the backward makes them
    for kind in [Kind::Gcn, Kind::Sage, Kind::Gin, Kind::Gcnii] {
        let dropout = if kind == Kind::Gcnii { 0.3 } else { 0.0 };
        let cfg = ModelConfig { dropout, ..config(kind) };
        let m = Model::init(&b, cfg.clone(), ds.features.dim, ds.num_classes as usize);
        let want = reference(&b, &ds, m, &loss);
        for (parts, storage) in [(1, None), (4, None), (4, Some(dir.path()))] {
            let mut ex = Executor::new(&b, &ds, &cfg, FeatureNorm::Row, &tiered(parts, storage)).unwrap();
            ex.model.zero_grad(&b);
            let l = ex.forward_backward_with(0, &mut |ids, rows, w| Ok(loss(ids, rows, w))).unwrap();
            let what = format!("{kind} P={parts} storage {}", storage.is_some());
            assert_close(&what, &(l, grads(&b, &mut ex.model)), &want);
        }
    }
}

#[test]
fn whole_layers_of_the_callers_run_partitioned_with_whole_graph_gradients() {
    let (b, ds) = (Cpu::<f32>::new(), dataset());
    let loss = weighted_mse(&ds);
    let want = reference(&b, &ds, whole_layers(&b, &ds), &loss);
    let dir = tempfile::tempdir().unwrap();
    for (parts, storage) in [(1, None), (3, None), (5, Some(dir.path()))] {
        let make = || whole_layers(&b, &ds);
        let mut ex = Executor::for_layers(&b, &ds, &make, FeatureNorm::Row, &tiered(parts, storage)).unwrap();
        ex.model.zero_grad(&b);
        let l = ex.forward_backward_with(0, &mut |ids, rows, w| Ok(loss(ids, rows, w))).unwrap();
        assert_close(
            &format!("P={parts} storage {}", storage.is_some()),
            &(l, grads(&b, &mut ex.model)),
            &want,
        );
    }
}

#[test]
fn a_criterion_whose_gradient_has_the_wrong_size_is_refused_naming_it_and_training_goes_on() {
    let (b, ds) = (Cpu::<f32>::new(), dataset());
    let cfg = config(Kind::Gcn);
    let mut ex = Executor::new(&b, &ds, &cfg, FeatureNorm::Row, &tiered(2, None)).unwrap();
    let e = ex.forward_backward_with(0, &mut |_, rows, _| Ok((0.0, vec![0.0; rows.len() - 1]))).unwrap_err();
    assert!(e.to_string().contains("the criterion gave a gradient of"), "{e}");
    // the executor is whole after it: the next pass gives the whole graph's gradients
    let loss = weighted_mse(&ds);
    let want =
        reference(&b, &ds, Model::init(&b, cfg.clone(), ds.features.dim, ds.num_classes as usize), &loss);
    ex.model.zero_grad(&b);
    let l = ex.forward_backward_with(0, &mut |ids, rows, w| Ok(loss(ids, rows, w))).unwrap();
    assert_close("after a refused criterion", &(l, grads(&b, &mut ex.model)), &want);
}
