//! Gradient identity of the tiered executor (docs/design.md, "what exact means"): the loss and
//! every parameter gradient equal the in-memory full-graph trainer's, for any partition count,
//! partitioner, cache mode and with the storage tier forced; and training epochs give the same
//! parameters.
//!
//! Tolerance: reassociation. A tensor's error is `max |a − b| / max |b|` (its largest
//! deviation relative to its scale), required ≤ 1e-5 in f32 (the loss relative ≤ 1e-5) and
//! ≤ 1e-10 in f64.

use grinnder_engine::features::features;
use grinnder_engine::tiered::{BlockKind, CacheMode, Executor, Faults, TierDtype, TieredConfig};
use grinnder_engine::{FeatureNorm, Mode, TrainConfig};
use grinnder_graph::generate::{generate, preset, GenConfig};
use grinnder_graph::Dataset;
use grinnder_nn::{Graph, Kind, Model, ModelConfig, Norm, OptimConfig};
use grinnder_partition::Method;
use grinnder_tensor::ops::*;
use grinnder_tensor::{Cpu, Mat, Scalar};

use crate::common::fit;

const TOL: f64 = 1e-5;
/// Reassociation in f64, where a test checks exactness in f64.
const TOL_F64: f64 = 1e-10;

fn dataset() -> Dataset {
    generate(&GenConfig::new(preset("arxiv-like").unwrap(), 0.002, 5)).unwrap().into_dataset().unwrap()
}

fn model(kind: Kind, input_dropout: f64) -> ModelConfig {
    ModelConfig {
        kind,
        layers: 3,
        hidden: 16,
        dropout: 0.3,
        input_dropout,
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

type Grads<T = f32> = Vec<(String, Mat<T>)>;

fn grads<T: Scalar>(b: &Cpu<T>, m: &mut Model<Cpu<T>>) -> Grads<T> {
    m.params_mut().into_iter().map(|p| (p.name.clone(), b.download(&p.grad))).collect()
}

fn values(b: &Cpu<f32>, m: &mut Model<Cpu<f32>>) -> Grads {
    m.params_mut().into_iter().map(|p| (p.name.clone(), b.download(&p.value))).collect()
}

/// The in-memory reference: loss sum and gradients of one training pass at `epoch`.
fn reference<T: Scalar>(ds: &Dataset, cfg: &ModelConfig, epoch: u64) -> (f64, Grads<T>) {
    let b = Cpu::<T>::new();
    let g = Graph::new(&b, &ds.graph);
    let x = features(&b, ds, FeatureNorm::Row);
    let mut m = Model::init(&b, cfg.clone(), ds.features.dim, ds.num_classes as usize);
    m.prepare(&b, &g, &x);
    m.zero_grad(&b);
    let (logits, tape) = m.forward(&b, &g, &x, true, epoch);
    let mut dl = b.zeros(logits.rows, logits.cols);
    let n = ds.splits.train.len() as f64;
    let (loss, _) = b.cross_entropy(&logits, &ds.labels, &ds.splits.train, 1.0 / n, &mut dl);
    m.backward(&b, &g, &x, tape, dl);
    (loss, grads(&b, &mut m))
}

fn tiered<T: Scalar>(ds: &Dataset, cfg: &ModelConfig, tc: &TieredConfig, epoch: u64) -> (f64, Grads<T>) {
    let b = Cpu::<T>::new();
    let mut ex = Executor::new(&b, ds, cfg, FeatureNorm::Row, tc).unwrap();
    ex.model.zero_grad(&b);
    let (loss, _) = ex.forward_backward(epoch).unwrap();
    (loss, grads(&b, &mut ex.model))
}

fn assert_close<T: Scalar>(what: &str, got: &Grads<T>, want: &Grads<T>, tol: f64) {
    assert_eq!(got.len(), want.len());
    for ((name, a), (_, b)) in got.iter().zip(want) {
        let scale = b.data.iter().fold(0f64, |m, &x| m.max(x.f64().abs()));
        // a NaN anywhere is an infinite error (f64::max would skip it)
        let diff = |x: T, y: T| {
            let (x, y) = (x.f64(), y.f64());
            if x.is_nan() || y.is_nan() {
                f64::INFINITY
            } else {
                (x - y).abs()
            }
        };
        let err = a.data.iter().zip(&b.data).fold(0f64, |m, (&x, &y)| m.max(diff(x, y)));
        assert!(scale > 0.0, "{what}: {name} has an all-zero reference gradient");
        assert!(err / scale <= tol, "{what}: {name} off by {:.3e} (relative to {scale:.3e})", err / scale);
    }
}

fn check(ds: &Dataset, cfg: &ModelConfig, tc: &TieredConfig, what: &str) {
    check_in::<f32>(ds, cfg, tc, what, TOL);
}

fn check_in<T: Scalar>(ds: &Dataset, cfg: &ModelConfig, tc: &TieredConfig, what: &str, tol: f64) {
    let (loss_ref, g_ref) = reference::<T>(ds, cfg, 3);
    let (loss, g) = tiered::<T>(ds, cfg, tc, 3);
    assert!((loss - loss_ref).abs() <= tol * loss_ref.abs(), "{what}: loss {loss} vs {loss_ref}");
    assert_close(what, &g, &g_ref, tol);
}

#[test]
fn gradients_equal_the_in_memory_trainer_for_every_partition_count() {
    let ds = dataset();
    for kind in Kind::ALL {
        for input_dropout in [0.0, 0.2] {
            let trained = model(kind, input_dropout);
            // GIN's trained ε is one number whose gradient sums every node's x·∂z with much
            // cancellation: f32 reassociation moves it by up to 1.7e-5 of its value, so its
            // exactness is checked in f64 (to 1e-10), and f32 runs GIN with a fixed ε
            let f32_cfg = ModelConfig { train_eps: false, ..trained.clone() };
            for parts in [1, 2, 3, 4, 8, 16] {
                let tc = TieredConfig::in_ram(parts, Method::Random { seed: 1 });
                let what = format!("{kind:?} input dropout {input_dropout} P={parts}");
                check(&ds, &f32_cfg, &tc, &format!("{what}, f32"));
                check_in::<f64>(&ds, &trained, &tc, &format!("{what}, f64"), TOL_F64);
            }
        }
    }
}

#[test]
fn layers_backpropagated_from_their_stored_output_are_exact() {
    // no norm and no residual: hidden layers that kept no aggregation skip recomputation
    let ds = dataset();
    for kind in [Kind::Gcn, Kind::Sage] {
        for hidden in [16, 256] {
            let cfg = ModelConfig { norm: Norm::None, residual: false, hidden, ..model(kind, 0.0) };
            for parts in [1, 4] {
                let tc = TieredConfig::in_ram(parts, Method::Metis { seed: 0 });
                check(&ds, &cfg, &tc, &format!("{kind:?} hidden {hidden} P={parts}"));
            }
        }
    }
}

#[test]
fn gcn_layer_0_inside_layer_1s_transform_is_exact_where_its_output_would_leave_the_gpu_tier() {
    // two GCN layers, hidden wider than the classes: layer 1 runs split and reads only its own
    // input rows, so layer 0 (on its precomputed aggregation) runs inside layer 1's transform,
    // forward and backward
    let ds = dataset();
    let cfg = ModelConfig { layers: 2, hidden: 64, ..model(Kind::Gcn, 0.0) };
    assert!(cfg.hidden > ds.num_classes as usize);
    let dir = tempfile::tempdir().unwrap();
    for parts in [1, 3, 8] {
        let base = TieredConfig::in_ram(parts, Method::Random { seed: 1 });
        let b = Cpu::<f32>::new();
        let fused = |tc: &TieredConfig| Executor::new(&b, &ds, &cfg, FeatureNorm::Row, tc).unwrap().fused();
        assert!(fused(&base), "P={parts}: host blocks only");
        check(&ds, &cfg, &base, &format!("P={parts}"));
        // a GPU tier with room for every block keeps layer 1's input and its gradient there
        // instead (no recomputation): layer 0's aggregation, layer 1's input, its narrow rows,
        // their gradient and the input gradient, per partition
        let all = TieredConfig { device_cache_bytes: Some(u64::MAX), ..base.clone() };
        let ex = Executor::new(&b, &ds, &cfg, FeatureNorm::Row, &all).unwrap();
        assert!(!ex.fused(), "P={parts}: all on the device");
        assert_eq!(ex.plan.device.clone().unwrap().blocks, 5 * parts, "P={parts}");
        check(&ds, &cfg, &all, &format!("P={parts}, all on the device"));
        // part on the device, the rest in a host cache that spills to storage
        let spill = TieredConfig {
            device_cache_bytes: Some(30_000),
            cache_bytes: Some(40_000),
            storage_dir: Some(dir.path().to_path_buf()),
            ..base.clone()
        };
        assert!(fused(&spill), "P={parts}: device tier over storage");
        check(&ds, &cfg, &spill, &format!("P={parts}, device tier over storage"));
        // a budget whose plan fuses, and whose measured peak then leaves room for every block:
        // the next pass runs unfused, exact as well
        let dp = Executor::new(&b, &ds, &cfg, FeatureNorm::Row, &all).unwrap().plan.device.unwrap();
        let gpu_mem = ((dp.working_bytes + dp.placed_bytes / 2) as f64 / 0.95) as u64;
        let tc = TieredConfig { gpu_mem: Some(gpu_mem), ..base.clone() };
        let mut ex = Executor::new(&b, &ds, &cfg, FeatureNorm::Row, &tc).unwrap();
        assert!(ex.fused(), "P={parts}: half of the blocks fit");
        let (loss_ref, g_ref) = reference(&ds, &cfg, 3);
        for pass in 0..2 {
            ex.model.zero_grad(&b);
            let (loss, _) = ex.forward_backward(3).unwrap();
            assert!((loss - loss_ref).abs() <= TOL * loss_ref.abs(), "P={parts} pass {pass}: loss {loss}");
            assert_close(&format!("P={parts}, pass {pass}"), &grads(&b, &mut ex.model), &g_ref, TOL);
            if pass == 0 {
                // a peak far below the plan's working set: the working set's room too (at
                // least a block: the first placement missed less than one) takes blocks
                ex.refine_placement(0).unwrap();
                assert!(!ex.fused(), "P={parts}: every block fits after the first pass");
            }
        }
    }
}

#[test]
fn gcn_layer_0_over_an_unsplit_layer_1s_columns_is_exact() {
    // layer 1 no narrower than layer 0's output (3 layers, or 2 with fewer hidden units than
    // classes) runs unsplit and reads its columns' rows: layer 0 runs on its aggregation
    // gathered over them, forward and backward, and neither layer 1's input nor its gradient
    // is a block (layer 0's weight gradient takes each halo row's share where it is made)
    let ds = dataset();
    let dir = tempfile::tempdir().unwrap();
    for layers in [2, 3] {
        let cfg = ModelConfig { layers, hidden: 16, ..model(Kind::Gcn, 0.0) };
        assert!(cfg.hidden < ds.num_classes as usize);
        for parts in [1, 3, 8] {
            let base = TieredConfig::in_ram(parts, Method::Random { seed: 1 });
            let b = Cpu::<f32>::new();
            let ex = Executor::new(&b, &ds, &cfg, FeatureNorm::Row, &base).unwrap();
            assert!(ex.fused(), "{layers} layers, P={parts}");
            // layer 0's aggregation; with 3 layers also layer 2's input and its gradient
            let blocks: usize = ex.block_groups().iter().map(|g| g.blocks).sum();
            assert_eq!(blocks, if layers == 3 { 3 * parts } else { parts }, "{layers} layers, P={parts}");
            check(&ds, &cfg, &base, &format!("{layers} layers, P={parts}"));
            let spill = TieredConfig {
                device_cache_bytes: Some(20_000),
                cache_bytes: Some(30_000),
                storage_dir: Some(dir.path().to_path_buf()),
                ..base.clone()
            };
            check(&ds, &cfg, &spill, &format!("{layers} layers, P={parts}, device tier over storage"));
            let bf16 = TieredConfig { tier_dtype: TierDtype::Bf16, ..spill };
            let (loss_ref, _) = reference::<f32>(&ds, &cfg, 3);
            let (loss, _) = tiered::<f32>(&ds, &cfg, &bf16, 3);
            assert!((loss - loss_ref).abs() <= 1e-2 * loss_ref, "{layers} layers, P={parts}, bf16: {loss}");
        }
    }
}

#[test]
fn gcn_layer_2s_transform_inside_layer_1_is_exact() {
    // 3 layers of 64 over 40 classes: layer 1 runs unsplit over its columns (layer 0 inside
    // it) and layer 2 split; layer 2's transform runs where layer 1 makes its rows, and its
    // backward where layer 1's backward remakes them, so neither layer 2's input nor its
    // gradient is a block: layer 0's aggregation and layer 2's transformed rows and their
    // gradient are all, and all exist at once (the aggregation's backward)
    let ds = dataset();
    let dir = tempfile::tempdir().unwrap();
    for norm in [Norm::None, Norm::Layer] {
        let cfg = ModelConfig { layers: 3, hidden: 64, norm, residual: false, ..model(Kind::Gcn, 0.0) };
        assert!(cfg.hidden > ds.num_classes as usize && cfg.dropout > 0.0);
        for parts in [1, 3, 8] {
            let what = format!("{norm:?}, P={parts}");
            let base = TieredConfig::in_ram(parts, Method::Random { seed: 1 });
            let b = Cpu::<f32>::new();
            let ex = Executor::new(&b, &ds, &cfg, FeatureNorm::Row, &base).unwrap();
            assert!(ex.fused(), "{what}");
            let groups = ex.block_groups();
            let kinds: Vec<(BlockKind, usize)> = groups.iter().map(|g| (g.kind, g.layer)).collect();
            assert_eq!(
                kinds,
                [(BlockKind::Xw, 2), (BlockKind::GradXw, 2), (BlockKind::Pre, 0)],
                "{what}: {groups:?}"
            );
            let spill = TieredConfig {
                cache_bytes: Some(100_000),
                storage_dir: Some(dir.path().to_path_buf()),
                ..base.clone()
            };
            let all: u64 = groups.iter().map(|g| g.bytes).sum();
            let ex = Executor::new(&b, &ds, &cfg, FeatureNorm::Row, &spill).unwrap();
            assert_eq!(ex.plan.host_block_bytes, Some(all), "{what}");
            check(&ds, &cfg, &base, &what);
            check(&ds, &cfg, &spill, &format!("{what}, storage"));
            let tier = TieredConfig { device_cache_bytes: Some(60_000), ..spill };
            check(&ds, &cfg, &tier, &format!("{what}, device tier over storage"));
        }
    }
}

#[test]
fn blocks_go_once_spent_so_the_host_holds_fewer_than_an_epoch_makes() {
    // GCN, 4 layers of 64 over 40 classes: layer 3 runs split. Its transformed rows go once
    // their gradient is complete, its input and that gradient partition by partition as the
    // transform's backward reads them, so layer 3's input gradient never exists beside all
    // of them (nor layer 2's, made after): the host holds at most every block but those
    // two, and the plan says so
    let ds = dataset();
    let cfg =
        ModelConfig { layers: 4, hidden: 64, norm: Norm::None, residual: false, ..model(Kind::Gcn, 0.0) };
    assert!(cfg.hidden > ds.num_classes as usize);
    let dir = tempfile::tempdir().unwrap();
    let b = Cpu::<f32>::new();
    for (parts, cache) in [(1, 1 << 20), (4, 300_000), (8, 0)] {
        let tc = TieredConfig {
            cache_bytes: Some(cache),
            storage_dir: Some(dir.path().to_path_buf()),
            ..TieredConfig::in_ram(parts, Method::Random { seed: 1 })
        };
        let ex = Executor::new(&b, &ds, &cfg, FeatureNorm::Row, &tc).unwrap();
        let groups = ex.block_groups();
        let all: u64 = groups.iter().map(|g| g.bytes).sum();
        let grad = |l: usize| -> u64 {
            groups.iter().filter(|g| (g.kind, g.layer) == (BlockKind::Grad, l)).map(|g| g.bytes).sum()
        };
        assert!(grad(2) > 0 && grad(3) > 0, "P={parts}: {groups:?}");
        assert_eq!(ex.plan.host_block_bytes, Some(all - grad(2) - grad(3)), "P={parts}");
        check(&ds, &cfg, &tc, &format!("P={parts}, cache {cache}"));
    }
}

#[test]
fn a_prediction_plans_no_gradient_block() {
    // the same model planned to predict (a model file's forward): no gradient block is
    // listed, placed or counted
    let ds = dataset();
    let cfg =
        ModelConfig { layers: 4, hidden: 64, norm: Norm::None, residual: false, ..model(Kind::Gcn, 0.0) };
    let dir = tempfile::tempdir().unwrap();
    let b = Cpu::<f32>::new();
    for parts in [1, 4] {
        let train = TieredConfig {
            cache_bytes: Some(300_000),
            storage_dir: Some(dir.path().to_path_buf()),
            ..TieredConfig::in_ram(parts, Method::Random { seed: 1 })
        };
        let predict = TieredConfig { inference: true, ..train.clone() };
        let trains = Executor::new(&b, &ds, &cfg, FeatureNorm::Row, &train).unwrap();
        let predicts = Executor::new(&b, &ds, &cfg, FeatureNorm::Row, &predict).unwrap();
        let groups = predicts.block_groups();
        assert!(
            groups.iter().all(|g| !matches!(g.kind, BlockKind::Grad | BlockKind::GradXw)),
            "P={parts}: {groups:?}"
        );
        let forward: u64 = trains
            .block_groups()
            .iter()
            .filter(|g| !matches!(g.kind, BlockKind::Grad | BlockKind::GradXw))
            .map(|g| g.bytes)
            .sum();
        assert_eq!(groups.iter().map(|g| g.bytes).sum::<u64>(), forward, "P={parts}");
        assert_eq!(predicts.plan.block_bytes, forward, "P={parts}");
        // and without a backward, a layer's input goes once read: layer 3's transform removes
        // its input (64 wide) partition by partition as it makes the narrower rows (40), so
        // the most at once is layer 0's aggregation beside layer 2's input and output
        let bytes = |kind: BlockKind, layer: usize| -> u64 {
            groups.iter().filter(|g| (g.kind, g.layer) == (kind, layer)).map(|g| g.bytes).sum()
        };
        let (pre, act2, act3) =
            (bytes(BlockKind::Pre, 0), bytes(BlockKind::Act, 2), bytes(BlockKind::Act, 3));
        let xw3 = bytes(BlockKind::Xw, 3);
        assert!(pre > 0 && act2 > 0 && act3 > xw3 && xw3 > 0, "P={parts}: {groups:?}");
        assert_eq!(forward, pre + act2 + act3 + xw3, "P={parts}: {groups:?}");
        assert_eq!(predicts.plan.host_block_bytes, Some(pre + act2 + act3), "P={parts}");
        assert!(trains.plan.host_block_bytes.unwrap() > forward, "P={parts}");
    }
}

#[test]
fn gradients_do_not_depend_on_the_partitioner_or_cache_mode() {
    let ds = dataset();
    let cfg = model(Kind::Gcn, 0.0);
    for method in [
        Method::Metis { seed: 0 },
        Method::Multilevel { seed: 0 },
        Method::Lpa { seed: 0 },
        Method::Spinner { seed: 0 },
        Method::Contiguous,
    ] {
        check(&ds, &cfg, &TieredConfig::in_ram(5, method), &format!("{method:?}"));
    }
    let gat = model(Kind::Gat, 0.1);
    let gin = model(Kind::Gin, 0.0);
    for mode in [CacheMode::LruLayer, CacheMode::PartitionLru, CacheMode::Auto] {
        // a host budget too small for one layer forces every block through the storage tier
        let dir = tempfile::tempdir().unwrap();
        let tc = TieredConfig {
            cache_mode: mode,
            cache_bytes: Some(0),
            storage_dir: Some(dir.path().to_path_buf()),
            ..TieredConfig::in_ram(4, Method::Metis { seed: 0 })
        };
        check(&ds, &gat, &tc, &format!("storage tier, {mode:?}"));
        check(&ds, &gin, &tc, &format!("GIN, storage tier, {mode:?}"));
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "block files are removed");
    }
}

#[test]
fn every_family_through_storage_at_five_partitions_trains_as_in_memory() {
    // a host budget of nothing: every block of every family through the storage tier
    let ds = dataset();
    for kind in Kind::ALL {
        let dir = tempfile::tempdir().unwrap();
        let tc = TieredConfig {
            cache_bytes: Some(0),
            storage_dir: Some(dir.path().to_path_buf()),
            ..TieredConfig::in_ram(5, Method::Metis { seed: 0 })
        };
        // (GIN's ε fixed in f32: see the partition-count test)
        let cfg = ModelConfig { train_eps: false, ..model(kind, 0.1) };
        check(&ds, &cfg, &tc, &format!("{kind:?}, 5 partitions, storage tier"));
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "block files are removed");
    }
}

#[test]
fn a_cache_smaller_than_the_blocks_spills_and_prefetches_exactly() {
    let ds = dataset();
    let dir = tempfile::tempdir().unwrap();
    for (kind, mode) in [(Kind::Gcn, CacheMode::PartitionLru), (Kind::Sage, CacheMode::LruLayer)] {
        let cfg = ModelConfig { norm: Norm::None, residual: false, ..model(kind, 0.0) };
        // a third of the blocks fit: evictions, writes behind and prefetches all happen
        let tc = TieredConfig {
            cache_mode: mode,
            storage_dir: Some(dir.path().to_path_buf()),
            cache_bytes: Some(120_000),
            ..TieredConfig::in_ram(6, Method::Metis { seed: 0 })
        };
        check(&ds, &cfg, &tc, &format!("{kind:?} {mode:?} with a partial cache"));
        let b = Cpu::<f32>::new();
        let mut ex = Executor::new(&b, &ds, &cfg, FeatureNorm::Row, &tc).unwrap();
        ex.model.zero_grad(&b);
        ex.forward_backward(0).unwrap();
        let st = ex.take_stats().tier;
        assert!(st.evictions > 0 && st.misses > 0 && st.hits > 0, "{st:?}");
        assert!(st.prefetch_hits > 0, "{st:?}");
        // a block is counted from when it exists (room is made right after): one block over
        let largest_block = (ds.num_nodes() / 6 + 20) * ds.features.dim * 4 + 4096;
        assert!(st.peak_cache_bytes <= 120_000 + largest_block as u64, "{st:?}");
    }
}

#[test]
fn blocks_kept_in_the_device_tier_give_the_same_gradients() {
    // the CPU backend's "device" is host memory: the placement, the gathers from device blocks
    // mixed with host ones and the scatter-adds into device blocks are the GPU tier's code
    let ds = dataset();
    let dir = tempfile::tempdir().unwrap();
    let base = TieredConfig::in_ram(4, Method::Metis { seed: 0 });
    let placed = |cfg: &ModelConfig, tc: &TieredConfig| {
        let b = Cpu::<f32>::new();
        let ex = Executor::new(&b, &ds, cfg, FeatureNorm::Row, tc).unwrap();
        ex.plan.device.clone().expect("a device plan").blocks
    };
    for kind in [Kind::Gcn, Kind::Sage, Kind::Gat] {
        for input_dropout in [0.0, 0.2] {
            let cfg = model(kind, input_dropout);
            let all = placed(&cfg, &TieredConfig { device_cache_bytes: Some(u64::MAX), ..base.clone() });
            for budget in [0, 60_000, u64::MAX] {
                let tc = TieredConfig { device_cache_bytes: Some(budget), ..base.clone() };
                let n = placed(&cfg, &tc);
                match budget {
                    0 => assert_eq!(n, 0),
                    u64::MAX => assert!(n == all && n > 0),
                    _ => assert!(0 < n && n < all, "{kind:?}: {n} of {all} blocks placed"),
                }
                check(
                    &ds,
                    &cfg,
                    &tc,
                    &format!("{kind:?} input dropout {input_dropout}, {n} of {all} on the device"),
                );
            }
        }
        // under the device tier, a host cache that spills to storage
        let cfg = model(kind, 0.0);
        let tc = TieredConfig {
            device_cache_bytes: Some(60_000),
            cache_bytes: Some(50_000),
            cache_mode: CacheMode::PartitionLru,
            storage_dir: Some(dir.path().to_path_buf()),
            ..base.clone()
        };
        check(&ds, &cfg, &tc, &format!("{kind:?}, device tier over a spilling host cache"));
    }
    // a measured peak below the plan's estimate places more blocks (blocks that exist, the
    // features and layer-0 aggregation, move over); the next pass is exact as well
    for kind in [Kind::Gcn, Kind::Sage] {
        let cfg = model(kind, 0.0);
        let (loss_ref, g_ref) = reference(&ds, &cfg, 3);
        let b = Cpu::<f32>::new();
        let probe = TieredConfig { device_cache_bytes: Some(u64::MAX), ..base.clone() };
        let dp = Executor::new(&b, &ds, &cfg, FeatureNorm::Row, &probe).unwrap().plan.device.unwrap();
        // the CPU backend reports no memory of its own: the budget is the working set, the
        // margin and room for about half of the blocks
        let gpu_mem = ((dp.working_bytes + dp.placed_bytes / 2) as f64 / 0.95) as u64;
        let tc = TieredConfig { gpu_mem: Some(gpu_mem), ..base.clone() };
        let mut ex = Executor::new(&b, &ds, &cfg, FeatureNorm::Row, &tc).unwrap();
        let before = ex.plan.device.clone().unwrap().blocks;
        assert!(before > 0 && before < dp.blocks, "{kind:?}: {before} of {} placed", dp.blocks);
        ex.model.zero_grad(&b);
        ex.forward_backward(3).unwrap();
        // a peak far below the plan's working set leaves room for every block (the first
        // placement missed less than one, and a working set holds more than a block)
        let moved = ex.refine_placement(0).unwrap();
        assert_eq!(before + moved, dp.blocks, "{kind:?}");
        ex.model.zero_grad(&b);
        let (loss, _) = ex.forward_backward(3).unwrap();
        assert!((loss - loss_ref).abs() <= TOL * loss_ref.abs(), "{kind:?}: loss {loss} vs {loss_ref}");
        assert_close(
            &format!("{kind:?} after refining the placement"),
            &grads(&b, &mut ex.model),
            &g_ref,
            TOL,
        );
    }
    // training with evaluation: the same figures as in memory
    let cfg = TrainConfig {
        lr_schedule: Default::default(),
        patience: None,
        model: model(Kind::Sage, 0.1),
        optim: OptimConfig::Adam { lr: 0.01, weight_decay: 5e-4 },
        epochs: 4,
        eval_every: 2,
        feature_norm: FeatureNorm::Row,
        feature_shift: None,
    };
    let mut want = Vec::new();
    fit(&Cpu::<f32>::new(), &ds, &cfg, Mode::FullGraph, &mut |m| want.push(m.clone())).unwrap();
    let mut got = Vec::new();
    let tc = TieredConfig { device_cache_bytes: Some(60_000), ..base.clone() };
    fit(&Cpu::<f32>::new(), &ds, &cfg, Mode::Tiered(tc.clone()), &mut |m| got.push(m.clone())).unwrap();
    for (a, r) in got.iter().zip(&want) {
        assert!((a.loss - r.loss).abs() <= 1e-4 * r.loss, "epoch {}: {} vs {}", a.epoch, a.loss, r.loss);
        assert_eq!((a.train_acc, a.valid_acc, a.test_acc), (r.train_acc, r.valid_acc, r.test_acc));
    }
    let t = got[0].tier.as_ref().unwrap();
    assert!(t.upload_bytes > 0 && t.download_bytes > 0, "{t:?}");
}

#[test]
fn partitions_without_training_nodes_contribute_exactly() {
    let mut ds = dataset();
    // training nodes only among the first ids: contiguous partitions past the first have none
    let train: Vec<u32> = ds.splits.train.iter().copied().filter(|&v| v < 60).collect();
    assert!(!train.is_empty());
    ds.splits.train = train.into();
    for kind in [Kind::Sage, Kind::Gat] {
        check(&ds, &model(kind, 0.0), &TieredConfig::in_ram(6, Method::Contiguous), &format!("{kind:?}"));
    }
}

#[test]
fn ten_epochs_give_the_same_parameters() {
    let ds = dataset();
    for kind in [Kind::Gcn, Kind::Gat] {
        let cfg = TrainConfig {
            lr_schedule: Default::default(),
            patience: None,
            model: model(kind, 0.1),
            optim: OptimConfig::Adam { lr: 0.01, weight_decay: 5e-4 },
            epochs: 10,
            eval_every: 5,
            feature_norm: FeatureNorm::Row,
            feature_shift: None,
        };
        let mut reference = Vec::new();
        let s_ref =
            fit(&Cpu::<f32>::new(), &ds, &cfg, Mode::FullGraph, &mut |m| reference.push(m.clone())).unwrap();
        let mut seen = Vec::new();
        let tc = TieredConfig::in_ram(4, Method::Random { seed: 3 });
        let s = fit(&Cpu::<f32>::new(), &ds, &cfg, Mode::Tiered(tc.clone()), &mut |m| seen.push(m.clone()))
            .unwrap();
        assert_eq!(seen.len(), reference.len());
        for (a, r) in seen.iter().zip(&reference) {
            assert!(
                (a.loss - r.loss).abs() <= 1e-4 * r.loss,
                "{kind:?} epoch {}: {} vs {}",
                a.epoch,
                a.loss,
                r.loss
            );
            assert_eq!((a.train_acc, a.valid_acc, a.test_acc), (r.train_acc, r.valid_acc, r.test_acc));
            assert!(a.tier.is_some());
        }
        assert_eq!(s.best_epoch, s_ref.best_epoch);
        // and the parameters themselves
        let b = Cpu::<f32>::new();
        let mut ex = Executor::new(&b, &ds, &cfg.model, cfg.feature_norm, &tc).unwrap();
        let mut m = Model::init(&b, cfg.model.clone(), ds.features.dim, ds.num_classes as usize);
        let g = Graph::new(&b, &ds.graph);
        let x = features(&b, &ds, cfg.feature_norm);
        m.prepare(&b, &g, &x);
        let (mut o1, mut o2) =
            (grinnder_nn::Optimizer::new(cfg.optim), grinnder_nn::Optimizer::new(cfg.optim));
        let n = ds.splits.train.len() as f64;
        for epoch in 0..10 {
            ex.model.zero_grad(&b);
            ex.forward_backward(epoch).unwrap();
            o1.step(&b, ex.model.params_mut());
            m.zero_grad(&b);
            let (logits, tape) = m.forward(&b, &g, &x, true, epoch);
            let mut dl = b.zeros(logits.rows, logits.cols);
            b.cross_entropy(&logits, &ds.labels, &ds.splits.train, 1.0 / n, &mut dl);
            m.backward(&b, &g, &x, tape, dl);
            o2.step(&b, m.params_mut());
        }
        assert_close(
            &format!("{kind:?} parameters after 10 epochs"),
            &values(&b, &mut ex.model),
            &values(&b, &mut m),
            1e-4,
        );
    }
}

#[test]
fn bf16_blocks_train_close_to_f32() {
    let ds = dataset();
    let cfg = TrainConfig {
        lr_schedule: Default::default(),
        patience: None,
        model: model(Kind::Sage, 0.0),
        optim: OptimConfig::Adam { lr: 0.01, weight_decay: 0.0 },
        epochs: 30,
        eval_every: 30,
        feature_norm: FeatureNorm::Row,
        feature_shift: None,
    };
    let run = |dtype| {
        let tc = TieredConfig { tier_dtype: dtype, ..TieredConfig::in_ram(4, Method::Metis { seed: 0 }) };
        fit(&Cpu::<f32>::new(), &ds, &cfg, Mode::Tiered(tc.clone()), &mut |_| {}).unwrap()
    };
    let (f, h) = (run(TierDtype::F32), run(TierDtype::Bf16));
    assert!(
        (f.final_loss - h.final_loss).abs() < 0.05 * f.final_loss,
        "loss {} vs {}",
        f.final_loss,
        h.final_loss
    );
}

#[test]
fn storage_faults_mid_epoch_stop_with_the_file_named_and_keep_the_last_good_state() {
    let ds = dataset();
    let cfg = model(Kind::Sage, 0.0);
    let dir = tempfile::tempdir().unwrap();
    let b = Cpu::<f32>::new();
    let tc = TieredConfig {
        host_mem: None,
        cache_bytes: Some(0),
        storage_dir: Some(dir.path().to_path_buf()),
        ..TieredConfig::in_ram(4, Method::Metis { seed: 0 })
    };
    // count the block reads and writes of setup and of one epoch (deterministic: every block
    // leaves RAM at once), then fail in the middle of the second epoch
    let (setup, one) = {
        let mut ex = Executor::new(&b, &ds, &cfg, FeatureNorm::Row, &tc).unwrap();
        let setup = ex.storage_ops();
        ex.model.zero_grad(&b);
        ex.forward_backward(0).unwrap();
        let after = ex.storage_ops();
        (setup, (after.0 - setup.0, after.1 - setup.1))
    };
    assert!(one.0 > 4 && one.1 > 4, "the epoch goes through storage: {one:?}");
    // runs epochs until one fails; returns the error and whether the parameters are those of
    // the last completed step
    let run = |tc: &TieredConfig, between: &dyn Fn(u64)| {
        let mut ex = Executor::new(&b, &ds, &cfg, FeatureNorm::Row, tc).unwrap();
        let mut opt = grinnder_nn::Optimizer::new(OptimConfig::Adam { lr: 0.01, weight_decay: 0.0 });
        let mut good = None;
        for epoch in 0..3 {
            between(epoch);
            ex.model.zero_grad(&b);
            match ex.forward_backward(epoch) {
                Ok(_) => {
                    opt.step(&b, ex.model.params_mut());
                    good = Some(values(&b, &mut ex.model));
                }
                Err(e) => {
                    let good = good.expect("at least one epoch before the fault");
                    // a pass after the fault refuses, naming it, instead of reading blocks the
                    // failed one left incomplete
                    for again in [ex.forward_backward(epoch + 1).err(), ex.evaluate(epoch + 1).err()] {
                        let again = again.expect("a pass after a fault refuses").to_string();
                        assert!(
                            again.contains("stopped at an earlier error") && again.contains(&e.to_string()),
                            "{again}"
                        );
                    }
                    return (e.to_string(), values(&b, &mut ex.model) == good);
                }
            }
        }
        panic!("the fault did not fire");
    };
    let mid = |setup: usize, per: usize| Some(setup + per + per / 2);
    // disk full while writing
    let faults = Faults { writes_after: mid(setup.1, one.1), reads_after: None };
    let (msg, kept) = run(&TieredConfig { faults, ..tc.clone() }, &|_| {});
    assert!(msg.contains("No space left on device") && msg.contains(".blk"), "{msg}");
    assert!(kept, "parameters are those of the last completed step");
    // a read error
    let faults = Faults { writes_after: None, reads_after: mid(setup.0, one.0) };
    let (msg, kept) = run(&TieredConfig { faults, ..tc.clone() }, &|_| {});
    assert!(msg.contains("Input/output error") && msg.contains(".blk"), "{msg}");
    assert!(kept, "parameters are those of the last completed step");
    // a bit flipped in a block file between epochs (the features, read again every epoch)
    let flip = |epoch: u64| {
        if epoch != 1 {
            return;
        }
        // the run's private directory is the one entry in the storage directory
        let run = std::fs::read_dir(dir.path()).unwrap().next().unwrap().unwrap().path();
        let f = std::fs::read_dir(run)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.file_name().unwrap().to_string_lossy().starts_with("act-l0-"))
            .expect("the features' block files");
        let mut bytes = std::fs::read(&f).unwrap();
        let at = 4096 + (bytes.len() - 4096) / 2;
        bytes[at] ^= 0x10;
        std::fs::write(&f, bytes).unwrap();
    };
    let (msg, kept) = run(&tc, &flip);
    assert!(msg.contains("checksum") && msg.contains("act-l0-"), "{msg}");
    assert!(kept, "parameters are those of the last completed step");
    // a directory that does not exist is refused up front
    let missing = TieredConfig { storage_dir: Some(dir.path().join("nope")), ..tc };
    let err = Executor::new(&b, &ds, &cfg, FeatureNorm::Row, &missing).err().expect("refused");
    assert!(err.to_string().contains("nope"), "{err}");
}

/// The plan keeps what it counts within the host budget: for a table of budgets from far too
/// small to ample, either resident + working set + margin + host cache ≤ the budget, or the run
/// is refused naming the least budget that would do — and that budget is then accepted.
#[test]
fn every_host_budget_is_kept_or_refused_with_the_least_that_would_do() {
    let ds = dataset();
    let b = Cpu::<f32>::new();
    let cfg = model(Kind::Gcn, 0.0);
    let dir = tempfile::tempdir().unwrap();
    let mut refused = 0;
    let mut kept = 0;
    for mib in [1u64, 16, 64, 128, 256, 512, 1024, 4096] {
        let mut tc = TieredConfig::in_ram(4, Method::Random { seed: 1 });
        tc.host_mem = Some(mib << 20);
        tc.storage_dir = Some(dir.path().to_path_buf());
        match Executor::new(&b, &ds, &cfg, FeatureNorm::Row, &tc) {
            Ok(ex) => {
                let (p, total) = (&ex.plan, counted(&ex.plan));
                assert!(total <= mib << 20, "--host-mem {mib} MiB: the plan counts {total} bytes");
                assert!(p.margin_bytes >= (mib << 20) / 20, "--host-mem {mib} MiB: a margin of 5 % at least");
                kept += 1;
            }
            Err(e) => {
                let e = e.to_string();
                let least = figure(&e, "needs at least ")
                    .unwrap_or_else(|| panic!("--host-mem {mib} MiB refused without the least budget: {e}"));
                assert!(
                    least > mib as f64,
                    "--host-mem {mib} MiB refused, yet {least} MiB is named as enough"
                );
                // the named budget is exact for the figures measured: given it, a plan holding
                // no more than those is accepted; one refused again measured the process
                // holding more (what earlier executors left with the allocator)
                tc.host_mem = Some((least as u64) << 20);
                match Executor::new(&b, &ds, &cfg, FeatureNorm::Row, &tc) {
                    Ok(ex) => {
                        let total = counted(&ex.plan);
                        assert!(
                            total <= (least as u64) << 20,
                            "--host-mem {least} MiB: the plan counts {total} bytes"
                        );
                    }
                    Err(again) => {
                        let (held, held_again) =
                            (figure(&e, "already holds "), figure(&again.to_string(), "already holds "));
                        assert!(
                            held_again > held,
                            "the named least budget, {least} MiB, is refused with the process holding no more: {again}"
                        );
                    }
                }
                refused += 1;
            }
        }
    }
    assert!(
        refused > 0 && kept > 0,
        "the table spans refused and kept budgets ({refused} refused, {kept} kept)"
    );
}

/// What a plan under a host budget counts: resident, working set, margin and host cache.
fn counted(p: &grinnder_engine::tiered::Plan) -> u64 {
    let cache = p.cache_bytes.expect("a host budget gives the cache a budget");
    p.resident_bytes + p.working_bytes + p.margin_bytes + cache
}

/// The number after `before` in a message (`needs at least 40 MiB` → 40).
fn figure(message: &str, before: &str) -> Option<f64> {
    message.split(before).nth(1)?.split(' ').next()?.parse().ok()
}
