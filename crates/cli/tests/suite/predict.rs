//! `grinnder predict` end to end: a model saved by `train --save-model` reproduces the test
//! accuracy `train` reported and the in-memory logits under any partitioning and the storage
//! tier; `--init-from` starts training from a file's weights; faults (a directory that cannot
//! be written, a model file cut short or changed, a graph of another width, a killed run) are
//! refused before any work or leave nothing that looks complete.

use std::path::{Path, PathBuf};
use std::process::Command;

use grinnder_graph::io::npy::Npy;

use crate::common::{fails, ok};

/// The `xx.xx` after `prefix` in `text`.
fn percent_after(text: &str, prefix: &str) -> String {
    let at = text.find(prefix).unwrap_or_else(|| panic!("no {prefix:?} in {text}")) + prefix.len();
    text[at..].split_whitespace().next().unwrap().to_string()
}

fn values(path: &Path) -> (Vec<u64>, Vec<f32>) {
    let a = Npy::open(path).unwrap();
    (a.shape.clone(), a.to_f32().unwrap().to_vec())
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A GCN trained on Cora for 40 epochs, saved (best validation epoch); the reported line.
fn trained(dir: &Path) -> (PathBuf, String) {
    let m = dir.join("m.safetensors");
    let out = ok(&["-q", "train", "--epochs", "40", "--save-model", s(&m)]);
    (m, out)
}

#[test]
fn predict_reproduces_the_reported_accuracy_and_the_logits_under_any_partitioning() {
    let dir = tempfile::tempdir().unwrap();
    let (m, reported) = trained(dir.path());
    let want_acc = percent_after(&reported, "test accuracy ");
    let d = |x: &str| dir.path().join(x);
    let out = ok(&[
        "predict",
        "--model-file",
        s(&m),
        "--out",
        s(&d("test")),
        "--nodes",
        "test",
        "--output",
        "class",
    ]);
    assert_eq!(percent_after(&out, "accuracy "), want_acc, "{out}");
    assert!(out.contains("on the 1000 labelled nodes"), "{out}");
    let ids = Npy::open(&d("test/nodes.npy")).unwrap().to_i64().unwrap();
    assert_eq!(ids.len(), 1000);
    assert_eq!(Npy::open(&d("test/class.npy")).unwrap().shape, vec![1000]);
    // the in-memory logits, then the same under partitions and the storage tier
    ok(&["-q", "predict", "--model-file", s(&m), "--out", s(&d("whole"))]);
    let (shape, want) = values(&d("whole/logits.npy"));
    assert_eq!(shape, vec![2708, 7]);
    let storage = tempfile::tempdir().unwrap();
    let runs: [(&str, Vec<&str>); 4] = [
        ("p1", vec!["--parts", "1"]),
        ("p3", vec!["--parts", "3"]),
        ("p8", vec!["--parts", "8"]),
        ("stored", vec!["--parts", "3", "--block-cache", "0", "--storage-dir", s(storage.path())]),
    ];
    for (name, flags) in runs {
        let out_dir = d(name);
        let mut args = vec!["-q", "predict", "--model-file", s(&m), "--out", s(&out_dir)];
        args.extend(flags);
        let line = ok(&args);
        if name == "stored" {
            let read = percent_after(&line, "storage read ");
            assert!(read.parse::<f64>().unwrap() > 0.0, "blocks went through storage: {line}");
        }
        let (shape, got) = values(&out_dir.join("logits.npy"));
        assert_eq!(shape, vec![2708, 7]);
        let scale = want.iter().fold(0f32, |m, x| m.max(x.abs()));
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!((g - w).abs() <= 1e-5 * scale, "{name}: value {i}: {g} against {w}");
        }
    }
    assert_eq!(std::fs::read_dir(storage.path()).unwrap().count(), 0, "the storage tier's files are gone");
}

#[test]
fn probabilities_embeddings_and_bf16_have_their_shapes_and_values() {
    let dir = tempfile::tempdir().unwrap();
    let (m, _) = trained(dir.path());
    let d = |x: &str| dir.path().join(x);
    let ids = d("ids.npy");
    grinnder_graph::io::npy::write_array(&ids, grinnder_graph::io::npy::DType::I64, &[3], &[5i64, 0, 2707])
        .unwrap();
    ok(&[
        "-q",
        "predict",
        "--model-file",
        s(&m),
        "--out",
        s(&d("p")),
        "--output",
        "probs",
        "--embed",
        "0",
        "--nodes",
        s(&ids),
    ]);
    let (shape, p) = values(&d("p/probs.npy"));
    assert_eq!(shape, vec![3, 7]);
    for row in p.chunks(7) {
        assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-5, "{row:?}");
    }
    let (shape, _) = values(&d("p/embedding-0.npy"));
    assert_eq!(shape, vec![3, 16]);
    assert_eq!(Npy::open(&d("p/nodes.npy")).unwrap().to_i64().unwrap(), vec![5, 0, 2707]);
    ok(&["-q", "predict", "--model-file", s(&m), "--out", s(&d("f")), "--nodes", s(&ids)]);
    ok(&[
        "-q",
        "predict",
        "--model-file",
        s(&m),
        "--out",
        s(&d("b")),
        "--nodes",
        s(&ids),
        "--out-dtype",
        "bf16",
    ]);
    let (_, f) = values(&d("f/logits.npy"));
    let b = Npy::open(&d("b/logits.npy")).unwrap();
    assert_eq!(b.dtype, grinnder_graph::io::npy::DType::U16);
    let bits = b.to_i64().unwrap();
    for (x, h) in f.iter().zip(bits) {
        let back = f32::from_bits((h as u32) << 16);
        assert!((back - x).abs() <= x.abs() / 128.0, "{back} against {x}");
    }
}

#[test]
fn init_from_starts_where_a_model_file_left_off() {
    let dir = tempfile::tempdir().unwrap();
    let (m, _) = trained(dir.path());
    let d = |x: &str| dir.path().join(x);
    // no training step (lr tiny): the weights are the file's, so the accuracy is its accuracy
    let line = ok(&["-q", "train", "--init-from", s(&m), "--epochs", "1", "--lr", "1e-12", "--dropout", "0"]);
    let out = ok(&[
        "-q",
        "predict",
        "--model-file",
        s(&m),
        "--out",
        s(&d("o")),
        "--nodes",
        "test",
        "--output",
        "class",
    ]);
    assert_eq!(percent_after(&line, "test accuracy "), percent_after(&out, "accuracy "), "{line}\n{out}");
    let err = fails(&["-q", "train", "--init-from", s(&m), "--hidden", "32", "--epochs", "1"]);
    assert!(
        err.contains("convs.0.lin.weight") && err.contains("[16, 1433]") && err.contains("[32, 1433]"),
        "{err}"
    );
}

#[test]
fn faults_are_refused_before_any_work_naming_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let (m, _) = trained(dir.path());
    let d = |x: &str| dir.path().join(x);
    // an output directory that cannot be made
    std::fs::write(d("file"), b"x").unwrap();
    let err = fails(&["predict", "--model-file", s(&m), "--out", s(&d("file/out"))]);
    assert!(err.contains("--out") && err.contains("cannot make the directory"), "{err}");
    // a model file cut short, and one whose values were changed
    let bytes = std::fs::read(&m).unwrap();
    std::fs::write(d("cut.safetensors"), &bytes[..bytes.len() - 100]).unwrap();
    let err = fails(&["predict", "--model-file", s(&d("cut.safetensors")), "--out", s(&d("o1"))]);
    assert!(err.contains("tensor convs.") && err.contains("cut short"), "{err}");
    let mut changed = bytes.clone();
    let n = changed.len();
    changed[n - 3] ^= 1;
    std::fs::write(d("changed.safetensors"), &changed).unwrap();
    let err = fails(&["predict", "--model-file", s(&d("changed.safetensors")), "--out", s(&d("o2"))]);
    assert!(err.contains("tensor convs.") && err.contains("checksum"), "{err}");
    // a graph of another feature width
    ok(&["-q", "generate", "--preset", "arxiv-like", "--scale", "0.002", "--out", s(&d("g.grnd"))]);
    let err = fails(&["predict", s(&d("g.grnd")), "--model-file", s(&m), "--out", s(&d("o3"))]);
    assert!(err.contains("1433 features per node") && err.contains("128"), "{err}");
    // a hidden layer the model lacks
    let err = fails(&["predict", "--model-file", s(&m), "--out", s(&d("o4")), "--embed", "1"]);
    assert!(err.contains("--embed 1") && err.contains("0 to 0"), "{err}");
    for o in ["o1", "o2", "o3", "o4"] {
        assert!(!d(o).join("logits.npy").exists(), "{o}: no output after a refusal");
    }
    // --save-model into a directory that does not exist: refused before training
    let err = fails(&["train", "--epochs", "1", "--save-model", s(&d("nowhere/m.safetensors"))]);
    assert!(err.contains("--save-model") && err.contains("does not exist"), "{err}");
}

#[test]
fn a_killed_prediction_leaves_no_file_that_looks_complete() {
    let dir = tempfile::tempdir().unwrap();
    let d = |x: &str| dir.path().join(x);
    ok(&["-q", "generate", "--preset", "arxiv-like", "--scale", "0.1", "--out", s(&d("g.grnd"))]);
    let m = d("m.safetensors");
    ok(&["-q", "train", s(&d("g.grnd")), "--epochs", "1", "--hidden", "64", "--save-model", s(&m)]);
    let out = d("out");
    let mut child = Command::new(env!("CARGO_BIN_EXE_grinnder"))
        .args(["-q", "predict", s(&d("g.grnd")), "--model-file", s(&m), "--out", s(&out), "--parts", "8"])
        .args(["--embed", "0"])
        .spawn()
        .unwrap();
    // kill it once its output exists under a temporary name
    let started = std::time::Instant::now();
    let temp_seen = loop {
        let names: Vec<String> = std::fs::read_dir(&out)
            .map(|r| r.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        if names.iter().any(|n| n.starts_with(".logits.npy.tmp-")) {
            break true;
        }
        if child.try_wait().unwrap().is_some() || started.elapsed().as_secs() > 60 {
            break false;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    };
    assert!(temp_seen, "the output was made under a temporary name first");
    child.kill().unwrap();
    let status = child.wait().unwrap();
    if status.success() {
        // it finished before the kill: the files are whole
        assert_eq!(Npy::open(&out.join("logits.npy")).unwrap().shape[0], 16934);
        return;
    }
    assert!(!out.join("logits.npy").exists() && !out.join("embedding-0.npy").exists());
}
