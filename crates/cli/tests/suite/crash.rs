//! Crash test (reliability issue): `grinnder train` killed with SIGKILL at many points — while
//! loading, computing and writing checkpoints — and resumed each time ends with the same
//! parameters, bit for bit, as a run that was never interrupted (CPU, fixed thread count), on
//! a graph of 33,869 nodes, large enough that every kernel splits its work over the threads.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Instant;

const EPOCHS: usize = 50;

/// An arxiv-like graph of 33,869 nodes as a native file (loads in milliseconds).
fn arxiv_like(tmp: &Path) -> std::path::PathBuf {
    let out = tmp.join("ax.grnd");
    let st = Command::new(env!("CARGO_BIN_EXE_grinnder"))
        .args(["-q", "generate", "--preset", "arxiv-like", "--scale", "0.2", "--seed", "0", "--out"])
        .arg(&out)
        .status()
        .unwrap();
    assert!(st.success());
    out
}

/// Cora as a native file (loads in milliseconds, so restarts are cheap).
fn cora(tmp: &Path) -> std::path::PathBuf {
    let out = tmp.join("cora.grnd");
    let st = Command::new(env!("CARGO_BIN_EXE_grinnder"))
        .args(["-q", "convert", "data/cora", "--out"])
        .arg(&out)
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."))
        .status()
        .unwrap();
    assert!(st.success());
    out
}

fn start(data: &Path, dir: &Path, epochs: usize, extra: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_grinnder"))
        .args(["-q", "--threads", "2", "train"])
        .arg(data)
        .args(["--epochs", &epochs.to_string(), "--hidden", "16", "--input-dropout", "0", "--checkpoint-dir"])
        .arg(dir)
        .args(["--checkpoint-every", "1", "--checkpoint-keep", "2", "--resume"])
        .args(extra)
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary starts")
}

fn finish(child: Child) -> String {
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The parameters stored in the checkpoint of `epoch` in `dir`, as JSON.
fn params(dir: &Path, epoch: usize) -> serde_json::Value {
    let text = std::fs::read_to_string(dir.join(format!("ckpt-epoch-{epoch:08}.grnd-ckpt"))).unwrap();
    let json: serde_json::Value = serde_json::from_str(text.lines().nth(1).unwrap()).unwrap();
    assert_eq!(json["epoch"], epoch);
    json["params"].clone()
}

#[test]
fn killed_and_resumed_training_ends_with_the_same_parameters() {
    let tmp = tempfile::tempdir().unwrap();
    let data = arxiv_like(tmp.path());
    let (reference, crashed) = (tmp.path().join("reference"), tmp.path().join("crashed"));
    // timings of this machine: start-up (one epoch; the fastest of three, as other jobs may
    // share the machine) and the whole run
    let startup = (0..3)
        .map(|i| {
            let t = Instant::now();
            finish(start(&data, &tmp.path().join(format!("probe{i}")), 1, &[]));
            t.elapsed()
        })
        .min()
        .unwrap();
    let t = Instant::now();
    finish(start(&data, &reference, EPOCHS, &[]));
    let per_epoch = t.elapsed().saturating_sub(startup) / EPOCHS as u32;
    let want = params(&reference, EPOCHS);

    // kill at delays spread from inside start-up to a couple of epochs in, until a run completes
    let mut kills = 0;
    for i in 0..1000u64 {
        let u = ((i * 0x9E37_79B9) % 1000) as f64 / 1000.0;
        let delay = startup.mul_f64(0.2 + 0.9 * u) + per_epoch.mul_f64(1.5 * u);
        let mut child = start(&data, &crashed, EPOCHS, &[]);
        std::thread::sleep(delay);
        if child.try_wait().unwrap().is_none() {
            child.kill().unwrap(); // SIGKILL
            child.wait().unwrap();
            kills += 1;
            continue;
        }
        finish(child);
        break;
    }
    eprintln!("{kills} kill points (start-up {startup:?}, epoch {per_epoch:?})");
    assert!(kills >= 20, "only {kills} kill points (start-up {startup:?}, epoch {per_epoch:?})");
    // the last run may have found the final checkpoint already written
    finish(start(&data, &crashed, EPOCHS, &[]));
    assert_eq!(
        params(&crashed, EPOCHS),
        want,
        "parameters after {kills} kills differ from the uninterrupted run"
    );
    let left: Vec<_> = std::fs::read_dir(&crashed).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left.len(), 2, "the kept checkpoints only (temporaries of killed writes removed): {left:?}");
}

#[test]
fn resuming_refuses_other_settings_and_skips_damaged_checkpoints() {
    let tmp = tempfile::tempdir().unwrap();
    let data = cora(tmp.path());
    let dir = tmp.path().join("ck");
    finish(start(&data, &dir, 3, &[]));
    // other settings: refused, naming the field
    let out = start(&data, &dir, 5, &["--lr", "0.02"]).wait_with_output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("optim.lr") && err.contains("0.02"), "{err}");
    // the newest checkpoint damaged: the older one is used, with a warning
    let newest = dir.join("ckpt-epoch-00000003.grnd-ckpt");
    let mut bytes = std::fs::read(&newest).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x04;
    std::fs::write(&newest, bytes).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_grinnder"))
        .args(["--threads", "2", "train"])
        .arg(&data)
        .args(["--epochs", "4", "--hidden", "16", "--input-dropout", "0", "--checkpoint-dir"])
        .arg(&dir)
        .args(["--checkpoint-keep", "2", "--resume"])
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let log = finish(child);
    assert!(log.contains("damaged checkpoint") && log.contains("checksum"), "{log}");
    assert!(log.contains("epoch 2 done"), "resumed from the older checkpoint: {log}");
}
