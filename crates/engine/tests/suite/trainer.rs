//! The [`Trainer`]: an epoch at a time equals training to the end; evaluation on demand
//! changes nothing; a run stopped after a checkpoint and resumed gives the same bits as one
//! that never stopped — in memory, tiered and by mini-batches.

use grinnder_engine::{
    CheckpointConfig, FeatureNorm, MiniBatchConfig, Mode, Sampler, TrainConfig, Trainer, Weights,
};
use grinnder_graph::generate::{generate, preset, GenConfig};
use grinnder_graph::Dataset;
use grinnder_nn::{Kind, LrSchedule, ModelConfig, Norm, OptimConfig};
use grinnder_partition::Method;
use grinnder_tensor::ops::*;
use grinnder_tensor::Cpu;

fn dataset() -> Dataset {
    generate(&GenConfig::new(preset("arxiv-like").unwrap(), 0.002, 5)).unwrap().into_dataset().unwrap()
}

fn config(epochs: usize) -> TrainConfig {
    TrainConfig {
        lr_schedule: Default::default(),
        patience: None,
        model: ModelConfig {
            kind: Kind::Sage,
            layers: 2,
            hidden: 16,
            dropout: 0.3,
            input_dropout: 0.0,
            norm: Norm::Layer,
            residual: true,
            heads: 1,
            attn_dropout: 0.0,
            gin_eps: 0.0,
            train_eps: false,
            alpha: grinnder_nn::model::DEFAULT_ALPHA,
            theta: grinnder_nn::model::DEFAULT_THETA,
            seed: 3,
        },
        optim: OptimConfig::Adam { lr: 0.01, weight_decay: 5e-4 },
        epochs,
        eval_every: 2,
        feature_norm: FeatureNorm::Row,
        feature_shift: None,
    }
}

fn modes() -> Vec<(&'static str, Mode<'static, Cpu<f32>>)> {
    let mb = MiniBatchConfig {
        fanouts: vec![4, 4],
        sampler: Sampler::Neighbor,
        batch_size: 16,
        eval_parts: 2,
        max_batches: None,
        loader_threads: Some(1),
    };
    vec![
        ("full graph", Mode::FullGraph),
        ("tiered", Mode::Tiered(grinnder_engine::TieredConfig::in_ram(3, Method::Metis { seed: 0 }))),
        ("mini-batch", Mode::MiniBatch { config: mb, features: None }),
    ]
}

/// The trainer's parameters, as their bits.
fn params(b: &Cpu<f32>, t: &mut Trainer<'_, Cpu<f32>>) -> Vec<Vec<u32>> {
    t.model()
        .params_mut()
        .into_iter()
        .map(|p| b.download(&p.value).data.iter().map(|x| x.to_bits()).collect())
        .collect()
}

#[test]
fn an_epoch_at_a_time_with_evaluation_on_demand_equals_training_to_the_end() {
    let ds = dataset();
    let b = Cpu::<f32>::new();
    for ((what, a), (_, c)) in modes().into_iter().zip(modes()) {
        let mut whole = Trainer::new(&b, &ds, config(4), a).unwrap();
        let mut want = Vec::new();
        let s = whole.fit(&mut |m| want.push(m.clone())).unwrap();
        let mut step = Trainer::new(&b, &ds, config(4), c).unwrap();
        let mut got = Vec::new();
        while !step.done() {
            got.push(step.train_epoch().unwrap());
            // evaluating between epochs leaves training as it was
            let e = step.evaluate().unwrap();
            assert_eq!(e.epoch, step.epochs_done() - 1);
            assert!((0.0..=1.0).contains(&e.test_acc));
        }
        assert_eq!(got.len(), 4, "{what}");
        for (g, w) in got.iter().zip(&want) {
            assert_eq!(g.loss.to_bits(), w.loss.to_bits(), "{what}: epoch {} loss", g.epoch);
            assert_eq!((g.valid_acc, g.test_acc), (w.valid_acc, w.test_acc), "{what}: epoch {}", g.epoch);
        }
        assert!(want[1].valid_acc.is_some() && want[0].valid_acc.is_none(), "{what}: eval_every 2");
        assert_eq!(params(&b, &mut step), params(&b, &mut whole), "{what}: parameters");
        assert_eq!(step.summary().final_loss, s.final_loss, "{what}");
    }
}

#[test]
fn a_run_resumed_from_its_checkpoint_gives_the_same_bits_as_one_that_never_stopped() {
    let ds = dataset();
    let b = Cpu::<f32>::new();
    for ((what, a), ((_, c), (_, d))) in modes().into_iter().zip(modes().into_iter().zip(modes())) {
        let dir = tempfile::tempdir().unwrap();
        let ck = CheckpointConfig { dir: dir.path().to_path_buf(), every: 100, keep: 2, resume: true };
        let mut whole = Trainer::new(&b, &ds, config(5), a).unwrap();
        let mut want = Vec::new();
        whole.fit(&mut |m| want.push(m.loss)).unwrap();
        // three epochs and a checkpoint written on demand, then the process "stops"
        let mut first = Trainer::new(&b, &ds, config(5), c).unwrap().with_checkpoints(&ck).unwrap();
        assert_eq!(first.epochs_done(), 0, "{what}: an empty directory starts from the beginning");
        for _ in 0..3 {
            first.train_epoch().unwrap();
        }
        first.save_checkpoint().unwrap();
        drop(first);
        let mut resumed = Trainer::new(&b, &ds, config(5), d).unwrap().with_checkpoints(&ck).unwrap();
        assert_eq!(resumed.epochs_done(), 3, "{what}");
        let mut got = Vec::new();
        resumed.fit(&mut |m| got.push(m.loss)).unwrap();
        let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got), bits(&want[3..]), "{what}: epochs 3 and 4 after resuming");
        assert_eq!(params(&b, &mut resumed), params(&b, &mut whole), "{what}: parameters");
        assert_eq!(resumed.summary().best_epoch, whole.summary().best_epoch, "{what}");
        // the best validation epoch's weights are in the checkpoint too
        let (r, w) = (resumed.model_file(Weights::BestValid), whole.model_file(Weights::BestValid));
        assert!(r.note.as_ref().is_some_and(|n| n.contains("best validation")), "{what}: {:?}", r.note);
        assert_eq!(r.note, w.note, "{what}");
        assert_eq!(r.arch, w.arch, "{what}");
        for (a, b) in r.tensors.iter().zip(&w.tensors) {
            assert_eq!(a.name, b.name, "{what}");
            let first = a.data.iter().zip(&b.data).position(|(x, y)| x != y);
            assert!(
                first.is_none(),
                "{what}: {} differs at {first:?}: {:?}",
                a.name,
                first.map(|i| (a.data[i], b.data[i]))
            );
        }
        assert_eq!(r, w, "{what}: the model file after resuming");
    }
}

#[test]
fn a_checkpoint_asked_for_without_a_directory_is_refused() {
    let ds = dataset();
    let b = Cpu::<f32>::new();
    let mut t = Trainer::new(&b, &ds, config(1), Mode::FullGraph).unwrap();
    let e = t.save_checkpoint().unwrap_err().to_string();
    assert!(e.contains("no checkpoint directory"), "{e}");
}

#[test]
fn a_resumed_run_removes_what_a_kill_between_writing_and_pruning_left() {
    let ds = dataset();
    let b = Cpu::<f32>::new();
    let dir = tempfile::tempdir().unwrap();
    let ck = |keep| CheckpointConfig { dir: dir.path().to_path_buf(), every: 1, keep, resume: true };
    // three checkpoints kept, as a run killed after each write and before its pruning leaves them
    let mut first =
        Trainer::new(&b, &ds, config(5), Mode::FullGraph).unwrap().with_checkpoints(&ck(3)).unwrap();
    for _ in 0..3 {
        first.train_epoch().unwrap();
    }
    drop(first);
    std::fs::write(dir.path().join(".ckpt-epoch-00000004.grnd-ckpt.tmp-killed"), b"half").unwrap();
    let names = || {
        let mut v: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        v.sort();
        v
    };
    assert_eq!(names().len(), 4, "{:?}", names());
    let resumed =
        Trainer::new(&b, &ds, config(5), Mode::FullGraph).unwrap().with_checkpoints(&ck(2)).unwrap();
    assert_eq!(resumed.epochs_done(), 3);
    assert_eq!(names(), ["ckpt-epoch-00000002.grnd-ckpt", "ckpt-epoch-00000003.grnd-ckpt"]);
}

/// Without a validation split nothing selects an epoch: the summary reports the last epoch (and
/// says it was not selected by validation), and the "best" model file holds the last weights —
/// never epoch 0's untrained ones — in every mode.
#[test]
fn without_a_validation_split_the_last_epoch_is_reported_and_saved() {
    let mut ds = dataset();
    ds.splits.valid = Vec::new().into();
    let b = Cpu::<f32>::new();
    for (what, mode) in modes() {
        let mut cfg = config(5);
        cfg.eval_every = 1;
        let mut t = Trainer::new(&b, &ds, cfg, mode).unwrap();
        let s = t.fit(&mut |_| {}).unwrap();
        assert_eq!((s.best_epoch, s.selected_by_valid), (4, false), "{what}");
        let (best, last) = (t.model_file(Weights::BestValid), t.model_file(Weights::Last));
        assert_eq!(best.tensors, last.tensors, "{what}");
        assert!(
            best.note.as_deref().unwrap_or("").contains("no validation split"),
            "{what}: {:?}",
            best.note
        );
    }
    // with one, the best epoch is selected by it
    let ds = dataset();
    let mut t = Trainer::new(&b, &ds, config(4), Mode::FullGraph).unwrap();
    assert!(t.fit(&mut |_| {}).unwrap().selected_by_valid);
}

#[test]
fn patience_stops_training_that_many_epochs_after_the_best_validation_accuracy() {
    let (ds, b) = (dataset(), Cpu::<f32>::new());
    let cfg = TrainConfig { patience: Some(3), eval_every: 1, ..config(300) };
    let mut t = Trainer::new(&b, &ds, cfg, Mode::FullGraph).unwrap();
    let mut valid = Vec::new();
    let s = t.fit(&mut |m| valid.push(m.valid_acc.unwrap())).unwrap();
    assert!(s.stopped_early && s.epochs < 300, "{s:?}");
    // the best epoch is the first to reach the highest accuracy; the three after it are no better
    let top = valid.iter().copied().fold(f64::MIN, f64::max);
    let first = valid.iter().position(|&v| v == top).unwrap();
    assert_eq!((s.best_epoch, s.epochs, valid.len()), (first, first + 4, first + 4));
    // without a validation split there is nothing to stop on: refused, naming the fix
    let mut no_valid = dataset();
    no_valid.splits.valid = Vec::new().into();
    let cfg = TrainConfig { patience: Some(3), ..config(10) };
    let e = Trainer::new(&b, &no_valid, cfg, Mode::FullGraph).err().expect("refused");
    assert!(
        e.to_string().contains("no validation split") && e.to_string().contains("drop --patience"),
        "{e}"
    );
}

#[test]
fn the_learning_rate_follows_its_schedule_epoch_by_epoch() {
    let (ds, b) = (dataset(), Cpu::<f32>::new());
    let sgd =
        TrainConfig { optim: OptimConfig::Sgd { lr: 0.1, momentum: 0.0, weight_decay: 0.0 }, ..config(3) };
    let stepped = TrainConfig { lr_schedule: LrSchedule::Step { every: 1, gamma: 0.5 }, ..sgd.clone() };
    let mut a = Trainer::new(&b, &ds, stepped, Mode::FullGraph).unwrap();
    let mut c = Trainer::new(&b, &ds, sgd, Mode::FullGraph).unwrap();
    let floats = |bits: Vec<Vec<u32>>| bits.into_iter().flatten().map(f32::from_bits).collect::<Vec<f32>>();
    let start = floats(params(&b, &mut a));
    let (ma, mc) = (a.train_epoch().unwrap(), c.train_epoch().unwrap());
    assert_eq!((ma.lr, mc.lr), (0.1, 0.1));
    // the same first step; the second from the same point, half as long under the schedule
    let (pa, pc) = (floats(params(&b, &mut a)), floats(params(&b, &mut c)));
    assert_eq!(pa, pc);
    assert_ne!(pa, start);
    let (ma, mc) = (a.train_epoch().unwrap(), c.train_epoch().unwrap());
    assert_eq!((ma.lr, mc.lr), (0.05, 0.1));
    let (qa, qc) = (floats(params(&b, &mut a)), floats(params(&b, &mut c)));
    let scale = pa.iter().fold(0f32, |m, x| m.max(x.abs()));
    for ((p, qa), qc) in pa.iter().zip(&qa).zip(&qc) {
        assert!(((qa - p) - (qc - p) / 2.0).abs() <= 1e-6 * scale, "{p}: {qa} vs {qc}");
    }
    assert_eq!(a.train_epoch().unwrap().lr, 0.025);
}
