//! The checkpoint reader and the tier's block files under corruption: at least 1,000 variants
//! each, and as many as fit in `GRINNDER_FUZZ_SECONDS` when set (CI sets 10, .ci/slow 60). A damaged file is
//! an error naming it — never a panic, never different data.

use std::panic::{catch_unwind, AssertUnwindSafe};

use grinnder_engine::checkpoint::{self, Checkpoint, CheckpointConfig, ParamState};
use grinnder_engine::tiered::{BlockId, BlockKind, CacheMode, Store, StoreConfig, TierDtype};
use grinnder_graph::rng::Stream;

const VARIANTS: usize = 1000;

fn budget() -> f64 {
    std::env::var("GRINNDER_FUZZ_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(0.0)
}

/// One random corruption: bit flip, byte overwrite, truncation, insertion or removal.
fn mutate(s: &mut Stream, b: &mut Vec<u8>) {
    if b.is_empty() {
        b.push(s.below(256) as u8);
        return;
    }
    let len = b.len() as u64;
    let i = (s.below(len) as usize).min(b.len().saturating_sub(1));
    match s.below(5) {
        0 => b[i] ^= 1 << s.below(8),
        1 => b[i] = s.below(256) as u8,
        2 => b.truncate(s.below(len) as usize),
        3 => b.insert(i, s.below(256) as u8),
        _ => {
            b.remove(i);
        }
    }
}

/// Runs corruptions of `original` (the file at `path`) through `read`, which must refuse them
/// or return exactly `want`.
fn run<T: PartialEq + std::fmt::Debug>(
    name: &str,
    path: &std::path::Path,
    seed: u64,
    want: &T,
    read: &dyn Fn() -> Result<T, String>,
) {
    let original = std::fs::read(path).unwrap();
    let start = std::time::Instant::now();
    let (mut refused, mut same) = (0usize, 0usize);
    for v in 0.. {
        if v >= VARIANTS && start.elapsed().as_secs_f64() >= budget() {
            break;
        }
        let mut s = Stream::new(&[seed, v as u64]);
        let mut bad = original.clone();
        for _ in 0..1 + s.below(3) {
            mutate(&mut s, &mut bad);
        }
        std::fs::write(path, &bad).unwrap();
        match catch_unwind(AssertUnwindSafe(read)) {
            Err(_) => panic!("{name}: variant {v} panicked"),
            Ok(Ok(got)) => {
                assert_eq!(&got, want, "{name}: variant {v} loaded different data");
                same += 1;
            }
            Ok(Err(msg)) => {
                let file = path.file_name().unwrap().to_string_lossy();
                assert!(msg.contains(file.as_ref()), "{name}: the error names the file: {msg}");
                refused += 1;
            }
        }
    }
    std::fs::write(path, &original).unwrap();
    eprintln!(
        "{name}: {} corrupted variants, {refused} refused naming the file, {same} unchanged data, 0 panics",
        refused + same
    );
    assert!(refused > (refused + same) * 9 / 10, "{name}: corruptions must be noticed");
}

#[test]
fn checkpoints_survive_corruption() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = CheckpointConfig { dir: dir.path().to_path_buf(), every: 1, keep: 1, resume: false };
    let ck = Checkpoint {
        epoch: 7,
        config: serde_json::json!({ "model": { "hidden": 16 }, "epochs": 9 }),
        dataset: "0123456789abcdef".into(),
        optimizer_steps: 7,
        params: vec![ParamState {
            name: "convs.0.lin.weight".into(),
            rows: 2,
            cols: 3,
            value: vec![0.5, -1.25, 3.0e-7, 1.0, 2.0, -0.0],
            state: Some((vec![0.1; 6], vec![0.2; 6])),
        }],
        best: Some((5, 0.8, 0.79)),
        epoch_times: vec![0.01; 7],
        last_loss: 0.6,
        best_params: Some(vec![grinnder_engine::model_file::Tensor {
            name: "convs.0.lin.weight".into(),
            shape: vec![2, 3],
            data: vec![0.25, -1.0, 2.0e-7, 1.5, 2.5, -0.5],
        }]),
    };
    let path = checkpoint::save(&cfg, &ck).unwrap();
    let max = checkpoint::max_bytes(6, 9);
    run("checkpoint", &path, 11, &ck, &|| checkpoint::load(&path, max).map_err(|e| e.to_string()));
}

#[test]
fn tier_blocks_survive_corruption() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = StoreConfig {
        budget: Some(0),
        mode: CacheMode::PartitionLru,
        dtype: TierDtype::F32,
        faults: Default::default(),
    };
    let mut store = Store::<f32>::new(cfg, Some(dir.path()), true).unwrap();
    let id = BlockId { kind: BlockKind::Act, layer: 1, part: 0 };
    let data: Vec<f32> = (0..3000).map(|i| i as f32 * 0.25).collect();
    store.put(id, 300, 10, data.clone()).unwrap();
    store.put(BlockId { part: 1, ..id }, 1, 1, vec![0.0]).unwrap(); // evicts the first to its file
    store.sync().unwrap();
    let path = store.storage_dir().unwrap().join("act-l1-p0.blk");
    assert!(path.exists());
    let store = std::cell::RefCell::new(store);
    let read = || {
        let mut out = vec![0f32; 3000];
        let mut s = store.borrow_mut();
        let r = s.read_rows(id, None, &mut out).map_err(|e| e.to_string());
        // leave the block out of RAM again, so the next variant reads the file
        s.put(BlockId { part: 1, ..id }, 1, 1, vec![0.0]).unwrap();
        s.sync().unwrap();
        r.map(|_| out)
    };
    run("tier block", &path, 12, &data, &read);
}
