//! What a new user meets first, end to end through the binary: errors that say what is wrong
//! and what to do, outputs checked before the work, a closed pipe, boolean split masks, class
//! counts, private storage directories that nothing outlives (two runs sharing one, SIGINT
//! mid-epoch, a killed run's leftovers), and the bundled Cora outside the source tree.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use grinnder_graph::io::npy::{write_array, DType};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn cmd(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_grinnder"));
    c.args(args).current_dir(repo());
    c
}

fn grinnder(args: &[&str]) -> Output {
    cmd(args).output().expect("the binary runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The bundled Cora in the npy layout, in a new folder.
fn cora_npy(dir: &Path) -> PathBuf {
    let out = dir.join("cora");
    let o = grinnder(&["-q", "export", "data/cora", "--format", "npy", "--out", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    out
}

fn read_i64(path: &Path) -> Vec<i64> {
    let npy = grinnder_graph::io::npy::Npy::open(path).unwrap();
    npy.to_i64().unwrap()
}

#[test]
fn a_closed_pipe_ends_the_run_quietly() {
    // `grinnder partition … | head -1`: the reader is gone before the first line
    for args in [&["info"][..], &["partition", "--parts", "2,4,8", "--no-cache"][..]] {
        let mut child = cmd(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        drop(child.stdout.take());
        let o = child.wait_with_output().unwrap();
        assert!(o.status.success(), "{args:?}: {:?} {}", o.status, stderr(&o));
        assert!(!stderr(&o).contains("panicked"), "{}", stderr(&o));
    }
}

#[test]
fn outputs_and_the_device_are_checked_before_the_dataset_loads() {
    let dir = tempfile::tempdir().unwrap();
    // a dataset path that does not exist: the error must be about the flag, not the path
    let missing = dir.path().join("no-such-dataset");
    let m = missing.to_str().unwrap();
    for (flag, value) in [
        ("--plot", "/no/such/folder/curves.png"),
        ("--metrics-out", "/no/such/folder/m.jsonl"),
        ("--save-model", "/no/such/folder/m.safetensors"),
    ] {
        let o = grinnder(&["train", m, flag, value]);
        assert!(!o.status.success());
        let err = stderr(&o);
        assert!(err.contains(flag) && err.contains("/no/such/folder") && !err.contains(m), "{err}");
        assert!(!err.contains("panicked") && !err.contains("Os {"), "{err}");
    }
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let ckpt = file.join("ckpt");
    let o = grinnder(&["train", m, "--checkpoint-dir", ckpt.to_str().unwrap()]);
    let err = stderr(&o);
    assert!(!o.status.success() && err.contains("--checkpoint-dir") && !err.contains(m), "{err}");
    // no GPU on this machine (CI's): refused at once, naming the way out; on a GPU machine
    // the run would get past the device to the missing dataset
    let o = grinnder(&["train", m, "--device", "cuda"]);
    let err = stderr(&o);
    assert!(!o.status.success());
    if err.contains("CUDA") {
        assert!(err.contains("leave --device out") && !err.contains(m), "{err}");
    }
}

#[test]
fn a_mistyped_dataset_path_is_named_once_with_the_near_name() {
    let o = grinnder(&["info", "data/cor"]);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert_eq!(err.matches("no such file or folder").count(), 1, "{err}");
    assert!(err.contains("did you mean data/cora?"), "{err}");
    let o = grinnder(&["info", "/no/such/place/at/all"]);
    let err = stderr(&o);
    assert!(!o.status.success() && err.matches("/no/such/place/at/all").count() == 1, "{err}");
}

#[test]
fn npy_splits_may_be_boolean_masks() {
    let dir = tempfile::tempdir().unwrap();
    let ds = cora_npy(dir.path());
    let n = 2708;
    let train = read_i64(&ds.join("train_idx.npy"));
    let mut mask = vec![0u8; n];
    for &v in &train {
        mask[v as usize] = 1;
    }
    // PyG's train_mask saved by numpy: dtype bool, one per node, under either name
    for name in ["train_mask.npy", "train_idx.npy"] {
        let _ = std::fs::remove_file(ds.join("train_idx.npy"));
        let _ = std::fs::remove_file(ds.join("train_mask.npy"));
        write_array(&ds.join(name), DType::Bool, &[n as u64], &mask).unwrap();
        let o = grinnder(&["info", "--json", ds.to_str().unwrap()]);
        assert!(o.status.success(), "{name}: {}", stderr(&o));
        let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
        assert_eq!(v["train"], train.len(), "{name}");
    }
    // the same mask as integers under the ids' name: named as a split, with the way out
    std::fs::remove_file(ds.join("train_idx.npy")).unwrap();
    let ints: Vec<i64> = mask.iter().map(|&m| m as i64).collect();
    write_array(&ds.join("train_idx.npy"), DType::I64, &[n as u64], &ints).unwrap();
    let err = stderr(&grinnder(&["info", ds.to_str().unwrap()]));
    assert!(
        err.contains("train split") && err.contains("dtype bool") && err.contains("train_mask.npy"),
        "{err}"
    );
    // a split entry out of range is called a split entry, not an edge
    write_array(&ds.join("train_idx.npy"), DType::I64, &[2], &[5i64, 5000]).unwrap();
    let err = stderr(&grinnder(&["info", ds.to_str().unwrap()]));
    assert!(err.contains("train_idx.npy") && err.contains("entry 1") && !err.contains("edge"), "{err}");
    // a missing file: the whole layout is listed
    std::fs::remove_file(ds.join("node_label.npy")).unwrap();
    let err = stderr(&grinnder(&["info", ds.to_str().unwrap()]));
    for want in ["missing node_label.npy", "edge_index.npy", "node_feat.npy", "_mask.npy"] {
        assert!(err.contains(want), "{want:?} in {err}");
    }
}

/// The default feature normalisation follows the values, never the folder's name: Cora under
/// another name trains with the same losses (row: no value is negative), and says why; PyG's
/// `val_mask.npy` gives the validation split; two files for one split are refused.
#[test]
fn defaults_follow_the_data_not_its_name_and_pygs_val_mask_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let ds = cora_npy(dir.path());
    let renamed = dir.path().join("my-graph");
    std::fs::rename(&ds, &renamed).unwrap();
    let losses = |data: &str, metrics: &Path| {
        let m = metrics.to_str().unwrap();
        let o = grinnder(&["train", data, "--epochs", "3", "--dropout", "0", "--metrics-out", m]);
        assert!(o.status.success(), "{}", stderr(&o));
        let text = std::fs::read_to_string(metrics).unwrap();
        let l: Vec<f64> = text
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .filter_map(|v| v["loss"].as_f64().filter(|_| v.get("final").is_none()))
            .collect();
        (l, stderr(&o))
    };
    let (want, _) = losses("data/cora", &dir.path().join("a.jsonl"));
    let (got, err) = losses(renamed.to_str().unwrap(), &dir.path().join("b.jsonl"));
    assert_eq!(got, want);
    assert!(err.contains("feature norm row: no feature value is negative"), "{err}");
    // PyG's name for the validation mask
    let valid = read_i64(&renamed.join("valid_idx.npy"));
    let mut mask = vec![0u8; 2708];
    for &v in &valid {
        mask[v as usize] = 1;
    }
    write_array(&renamed.join("val_mask.npy"), DType::Bool, &[2708], &mask).unwrap();
    let err = stderr(&grinnder(&["info", renamed.to_str().unwrap()]));
    assert!(err.contains("valid_idx.npy and val_mask.npy") && err.contains("keep one"), "{err}");
    std::fs::remove_file(renamed.join("valid_idx.npy")).unwrap();
    let o = grinnder(&["info", "--json", renamed.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    assert_eq!(v["valid"], valid.len());
}

#[test]
fn classes_without_a_node_are_warned_about_and_num_classes_sets_the_count() {
    let dir = tempfile::tempdir().unwrap();
    let ds = cora_npy(dir.path());
    let d = ds.to_str().unwrap();
    let mut labels = read_i64(&ds.join("node_label.npy"));
    labels[0] = 1000;
    write_array(&ds.join("node_label.npy"), DType::I64, &[labels.len() as u64], &labels).unwrap();
    let o = grinnder(&["info", "--json", d]);
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains("993 of its 1001 classes have no node") && err.contains("--num-classes"), "{err}");
    let o = grinnder(&["info", "--json", d, "--num-classes", "1200"]);
    assert!(o.status.success() && !stderr(&o).contains("no node"), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    assert_eq!(v["classes"], 1200);
    let o = grinnder(&["info", d, "--num-classes", "7"]);
    assert!(!o.status.success() && stderr(&o).contains("labels go up to 1000"), "{}", stderr(&o));
    // a class count above the labels' trains, with that many outputs
    let o = grinnder(&["-q", "train", "--epochs", "2", "--num-classes", "9", "--metrics-out", "/dev/null"]);
    assert!(o.status.success(), "{}", stderr(&o));
}

/// The run directories (`grinnder-run-…`) in `dir`.
fn run_dirs(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("grinnder-run-"))
        .collect()
}

/// Cora trained with every block through storage in `storage`.
fn through_storage(storage: &Path, epochs: &str) -> Command {
    let mut c = cmd(&[
        "-q",
        "train",
        "--epochs",
        epochs,
        "--parts",
        "4",
        "--block-cache",
        "0",
        "--storage-dir",
        storage.to_str().unwrap(),
    ]);
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    c
}

#[test]
fn runs_sharing_a_storage_directory_never_meet_and_leave_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let storage = dir.path();
    let a = through_storage(storage, "20").spawn().unwrap();
    let b = through_storage(storage, "20").spawn().unwrap();
    for (name, child) in [("first", a), ("second", b)] {
        let o = child.wait_with_output().unwrap();
        assert!(o.status.success(), "{name} run: {}", stderr(&o));
    }
    assert_eq!(std::fs::read_dir(storage).unwrap().count(), 0, "both runs removed their directories");
}

/// A long run through `storage`, once its block files are being written.
fn mid_epoch(storage: &Path) -> std::process::Child {
    let mut child = through_storage(storage, "100000").spawn().unwrap();
    let start = Instant::now();
    // a block file, not the identity file being made (`.grinnder-run.new`): a run killed
    // before naming itself leaves a directory nothing can prove is a run's for a minute
    let writing_blocks = |d: &PathBuf| {
        std::fs::read_dir(d)
            .unwrap()
            .any(|e| !e.unwrap().file_name().to_string_lossy().starts_with(".grinnder-"))
    };
    while !run_dirs(storage).iter().any(writing_blocks) {
        assert!(start.elapsed() < Duration::from_secs(120), "no block files after 2 minutes");
        assert!(child.try_wait().unwrap().is_none(), "the run ended early");
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

#[test]
fn an_interrupted_run_removes_its_storage() {
    for (signal, code) in [(libc::SIGINT, 130), (libc::SIGTERM, 143)] {
        let dir = tempfile::tempdir().unwrap();
        let storage = dir.path();
        // mid-epoch: once block files are being written
        let child = mid_epoch(storage);
        // SAFETY: signals our own child.
        assert_eq!(unsafe { libc::kill(child.id() as i32, signal) }, 0);
        let o = child.wait_with_output().unwrap();
        assert_eq!(o.status.code(), Some(code), "{}", stderr(&o));
        assert!(stderr(&o).contains("removed the storage directory"), "{}", stderr(&o));
        assert_eq!(run_dirs(storage), Vec::<PathBuf>::new(), "signal {signal}: storage left behind");
    }
}

#[test]
fn a_killed_runs_storage_is_reclaimed() {
    let dir = tempfile::tempdir().unwrap();
    let storage = dir.path();
    let mut child = mid_epoch(storage);
    child.kill().unwrap(); // SIGKILL: nothing can clean up
    child.wait().unwrap();
    let left = run_dirs(storage);
    assert_eq!(left.len(), 1, "SIGKILL leaves the directory");
    // listed and removed by `grinnder clean`, after a dry run that keeps it
    let o = grinnder(&["clean", storage.to_str().unwrap(), "--dry-run"]);
    assert!(o.status.success() && stdout(&o).contains("would remove"), "{}", stdout(&o));
    assert!(left[0].exists());
    // another machine's directory is never touched
    let other = storage.join("grinnder-run-elsewhere-1-abcdef");
    std::fs::create_dir(&other).unwrap();
    std::fs::copy(left[0].join(".grinnder-run"), other.join(".grinnder-run")).unwrap();
    let o = grinnder(&["clean", storage.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("removed (its run had ended)") && out.contains("made on elsewhere"), "{out}");
    assert!(!left[0].exists() && other.exists());

    // the next run in the directory reclaims a killed run's leftovers by itself
    let mut child = through_storage(storage, "100000").spawn().unwrap();
    let start = Instant::now();
    // (killed between making its directory and naming itself in it, a run leaves a directory
    // nothing can prove is a run's: wait for the name)
    while !run_dirs(storage).iter().any(|d| *d != other && d.join(".grinnder-run").exists()) {
        assert!(start.elapsed() < Duration::from_secs(120), "the second run made no directory");
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let o = through_storage(storage, "1").output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(run_dirs(storage), vec![other], "only the other machine's directory is left");
}

#[test]
fn the_installed_binary_finds_the_bundled_cora() {
    // run outside the source tree: the embedded copy is written under the cache directory
    let dir = tempfile::tempdir().unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_grinnder"))
        .args(["info", "--json"])
        .current_dir(dir.path())
        .env("XDG_CACHE_HOME", dir.path().join("cache"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    assert_eq!(
        (v["name"].as_str(), v["nodes"].as_u64(), v["classes"].as_u64()),
        (Some("cora"), Some(2708), Some(7))
    );
}

#[test]
fn a_checkpoint_of_another_run_says_what_to_do_and_one_past_the_epochs_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("ckpt");
    let c = ck.to_str().unwrap();
    let o = grinnder(&["-q", "train", "--epochs", "3", "--checkpoint-dir", c]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = grinnder(&["-q", "train", "--epochs", "5", "--hidden", "32", "--checkpoint-dir", c, "--resume"]);
    let err = stderr(&o);
    assert!(!o.status.success(), "{err}");
    assert!(err.contains("hidden") && err.contains("give a new --checkpoint-dir"), "{err}");
    let o = grinnder(&["train", "--epochs", "2", "--checkpoint-dir", c, "--resume"]);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("has 3 epochs trained") && err.contains("raise --epochs"), "{err}");
}

#[test]
fn the_setup_phases_are_timed_in_the_log_and_the_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let m = dir.path().join("m.jsonl");
    let o = cmd(&["train", "--epochs", "1", "--parts", "2", "--metrics-out", m.to_str().unwrap()])
        .env("XDG_CACHE_HOME", dir.path())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("setup done in"), "{}", stderr(&o));
    let text = std::fs::read_to_string(&m).unwrap();
    let last: serde_json::Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    let phases: Vec<String> =
        last["setup"].as_array().unwrap().iter().map(|p| p["phase"].as_str().unwrap().to_string()).collect();
    // (the bundled Cora is row-normalised: its minimum is a pass over the features)
    for want in [
        "loading data/cora",
        "partitioning (2 parts)",
        "partition graphs",
        "partition blocks",
        "normalisation (the features' minimum)",
    ] {
        assert!(phases.iter().any(|p| p == want), "{want:?} in {phases:?}");
    }
    assert!(phases.iter().any(|p| p.starts_with("first blocks")), "{phases:?}");
    assert!(last["setup"].as_array().unwrap().iter().all(|p| p["seconds"].as_f64().unwrap() >= 0.0));
}

/// A long epoch is not silent: off a terminal, a line of its progress at the interval (30 s
/// by default; a twentieth of a second here, under an epoch that takes about a second) with
/// the phase done last, the partition steps and the bytes moved.
#[test]
fn a_long_epoch_logs_its_progress_off_a_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let g = dir.path().join("g.grnd");
    let o = grinnder(&[
        "-q",
        "generate",
        "--preset",
        "igb-medium-like",
        "--scale",
        "0.003",
        "--out",
        g.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = cmd(&["train", g.to_str().unwrap(), "--epochs", "1", "--parts", "16", "--hidden", "64"])
        .env("GRINNDER_PROGRESS_SECONDS", "0.05")
        .env("XDG_CACHE_HOME", dir.path())
        .output()
        .unwrap();
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    let lines: Vec<&str> = err.lines().filter(|l| l.contains("epoch 0:") && l.contains(" s in: ")).collect();
    assert!(!lines.is_empty(), "no progress line: {err}");
    assert!(lines.iter().all(|l| l.contains("partition steps") && l.contains("GB moved")), "{lines:?}");
}

#[test]
fn patience_stops_early_and_a_schedule_sets_each_epochs_rate() {
    let dir = tempfile::tempdir().unwrap();
    let m = dir.path().join("m.jsonl");
    let args =
        ["-q", "train", "--epochs", "200", "--patience", "5", "--lr-schedule", "cosine", "--lr-min", "0.001"];
    let o = grinnder(&[&args[..], &["--metrics-out", m.to_str().unwrap()]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let rows: Vec<serde_json::Value> =
        std::fs::read_to_string(&m).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let (epochs, summary) = rows.split_at(rows.len() - 1);
    let s = &summary[0];
    assert_eq!(s["stopped_early"], true, "{s}");
    let (n, best) = (s["epochs"].as_u64().unwrap() as usize, s["best_epoch"].as_u64().unwrap() as usize);
    assert!(n < 200 && n == best + 6 && epochs.len() == n, "{s}");
    // CosineAnnealingLR(T_max=200, eta_min=0.001) on lr 0.01
    for r in epochs {
        let e = r["epoch"].as_f64().unwrap();
        let want = 0.001 + 0.009 * (1.0 + (std::f64::consts::PI * e / 200.0).cos()) / 2.0;
        assert!((r["lr"].as_f64().unwrap() - want).abs() < 1e-12, "{r}");
    }
    // nothing to stop on without evaluation: refused before loading, naming the fix
    let o = grinnder(&["train", "--patience", "5", "--eval-every", "0"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("give --eval-every 1 (or drop --patience)"), "{}", stderr(&o));
}
