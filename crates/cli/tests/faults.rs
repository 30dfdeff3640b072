//! Regression tests for the fault probe's findings on the binary (RELIABILITY.md): results that
//! must not depend on the thread count, files that must never be written through a planted
//! link, reads that must stay bounded, and checkpoint failures that must leave nothing behind.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn grinnder(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_grinnder"))
        .args(args)
        .current_dir(root())
        .output()
        .expect("the binary runs")
}

/// Runs the binary under `sh` with `limits` (shell commands such as `ulimit -v 4000000`) set
/// first, killing it after `secs`: a regression must fail the test, not hang it or take the
/// machine's memory.
fn grinnder_limited(limits: &str, args: &[&str], secs: u64) -> Output {
    let quoted: Vec<String> = args.iter().map(|a| format!("'{}'", a.replace('\'', "'\\''"))).collect();
    let script = format!("{limits}; exec '{}' {}", env!("CARGO_BIN_EXE_grinnder"), quoted.join(" "));
    let mut child = Command::new("sh")
        .args(["-c", &script])
        .current_dir(root())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t.elapsed() > Duration::from_secs(secs) {
            child.kill().unwrap();
            let o = child.wait_with_output().unwrap();
            panic!("grinnder {args:?} still running after {secs} s: {}", stderr(&o));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[track_caller]
fn ok(o: Output) -> Output {
    assert!(o.status.success(), "{}", stderr(&o));
    o
}

/// The parameters stored in the checkpoint of `epoch` in `dir`, as JSON text.
fn params(dir: &Path, epoch: usize) -> String {
    let text = std::fs::read_to_string(dir.join(format!("ckpt-epoch-{epoch:08}.grnd-ckpt"))).unwrap();
    let json: serde_json::Value = serde_json::from_str(text.lines().nth(1).unwrap()).unwrap();
    json["params"].to_string()
}

/// An arxiv-like graph of 33,869 nodes: large enough that every kernel splits its work.
fn arxiv_like(dir: &Path) -> String {
    let out = dir.join("ax.grnd").to_string_lossy().into_owned();
    ok(grinnder(&[
        "-q",
        "generate",
        "--preset",
        "arxiv-like",
        "--scale",
        "0.2",
        "--seed",
        "0",
        "--out",
        &out,
    ]));
    out
}

#[test]
fn parameters_are_the_same_bits_on_one_two_and_three_threads() {
    let tmp = tempfile::tempdir().unwrap();
    let data = arxiv_like(tmp.path());
    for (name, extra, epochs) in [
        ("in memory", &[][..], 5),
        ("tiered", &["--parts", "4", "--partitioner", "random"][..], 3),
        ("sage with layer norm", &["--model", "sage", "--norm", "layer"][..], 3),
    ] {
        let mut seen: Option<String> = None;
        for threads in ["1", "2", "3"] {
            let ck = tmp.path().join(format!("{name}-{threads}"));
            let e = epochs.to_string();
            let mut args = vec!["-q", "--threads", threads, "train", &data, "--hidden", "64", "--epochs", &e];
            args.extend_from_slice(extra);
            args.extend_from_slice(&["--eval-every", "0", "--checkpoint-dir", ck.to_str().unwrap()]);
            ok(grinnder(&args));
            let p = params(&ck, epochs);
            match &seen {
                None => seen = Some(p),
                Some(one) => {
                    assert!(*one == p, "{name}: parameters at {threads} threads differ from 1 thread's")
                }
            }
        }
    }
}

#[test]
fn a_link_planted_in_the_storage_directory_is_never_written_through() {
    let tmp = tempfile::tempdir().unwrap();
    let storage = tmp.path().join("shared");
    std::fs::create_dir(&storage).unwrap();
    let victim = tmp.path().join("victim");
    std::fs::write(&victim, b"precious").unwrap();
    for name in ["act-l0-p0.blk", "act-l1-p0.blk", "grad-l1-p0.blk", ".grinnder-probe-1"] {
        std::os::unix::fs::symlink(&victim, storage.join(name)).unwrap();
    }
    // two runs at once in the same directory, every block through storage
    let s = storage.to_str().unwrap();
    let args = ["-q", "train", "--epochs", "2", "--parts", "2", "--block-cache", "0", "--storage-dir", s];
    let spawn = || {
        Command::new(env!("CARGO_BIN_EXE_grinnder"))
            .args(args)
            .current_dir(root())
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap()
    };
    let (a, b) = (spawn(), spawn());
    for run in [a, b] {
        ok(run.wait_with_output().unwrap());
    }
    assert!(std::fs::read(&victim).unwrap() == b"precious", "the link's target was written");
    let mut left: Vec<String> = std::fs::read_dir(&storage)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(
        left,
        [".grinnder-probe-1", "act-l0-p0.blk", "act-l1-p0.blk", "grad-l1-p0.blk"],
        "only the planted links"
    );
}

#[test]
fn generate_and_convert_never_write_through_a_planted_partial_file() {
    let tmp = tempfile::tempdir().unwrap();
    let victim = tmp.path().join("victim");
    std::fs::write(&victim, b"precious").unwrap();
    let out = tmp.path().join("out.grnd");
    std::os::unix::fs::symlink(&victim, tmp.path().join("out.grnd.partial")).unwrap();
    let o = out.to_str().unwrap();
    ok(grinnder(&["-q", "convert", "data/cora", "--out", o]));
    ok(grinnder(&["-q", "generate", "--preset", "arxiv-like", "--scale", "0.01", "--out", o]));
    assert!(std::fs::read(&victim).unwrap() == b"precious", "the link's target was written");
    let meta = std::fs::symlink_metadata(&out).unwrap();
    assert!(meta.file_type().is_file(), "the output is a file of its own");
    let names: Vec<String> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 3, "no temporaries left: {names:?}");
}

#[test]
fn checkpoint_temporaries_cannot_be_planted() {
    // the old temporaries were named `.<checkpoint>.tmp-<pid>`: plant links under those names
    // as soon as the pid is known, before the first checkpoint is written
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("ck");
    std::fs::create_dir(&ck).unwrap();
    let victim = tmp.path().join("victim");
    std::fs::write(&victim, b"precious").unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_grinnder"))
        .args(["-q", "--threads", "2", "train", "--epochs", "3", "--checkpoint-dir", ck.to_str().unwrap()])
        .current_dir(root())
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    for epoch in 1..=3 {
        let name = format!(".ckpt-epoch-{epoch:08}.grnd-ckpt.tmp-{}", child.id());
        std::os::unix::fs::symlink(&victim, ck.join(name)).unwrap();
    }
    ok(child.wait_with_output().unwrap());
    assert!(std::fs::read(&victim).unwrap() == b"precious", "the link's target was written");
    assert!(ck.join("ckpt-epoch-00000003.grnd-ckpt").is_file());
}

/// A checkpoint directory with checkpoints of Cora after epochs 1 and 2.
fn two_checkpoints(tmp: &Path) -> PathBuf {
    let ck = tmp.join("ck");
    ok(grinnder(&[
        "-q",
        "--threads",
        "2",
        "train",
        "--epochs",
        "2",
        "--checkpoint-dir",
        ck.to_str().unwrap(),
    ]));
    ck
}

#[test]
fn reads_are_bounded_by_what_the_format_allows() {
    let tmp = tempfile::tempdir().unwrap();
    let limit = "ulimit -v 4000000"; // 4 GB of address space: a runaway read fails fast
                                     // a config file that never ends
    let o = grinnder_limited(limit, &["-q", "train", "--config", "/dev/zero"], 60);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("/dev/zero") && stderr(&o).contains("character device"), "{}", stderr(&o));
    // a checkpoint that is a link to /dev/zero: skipped as damaged, the good one resumed from
    let ck = two_checkpoints(tmp.path());
    std::os::unix::fs::symlink("/dev/zero", ck.join("ckpt-epoch-00000007.grnd-ckpt")).unwrap();
    let args =
        ["--threads", "2", "train", "--epochs", "3", "--checkpoint-dir", ck.to_str().unwrap(), "--resume"];
    let o = grinnder_limited(limit, &args, 120);
    assert!(o.status.success(), "{}", stderr(&o));
    let log = stderr(&o);
    assert!(log.contains("damaged checkpoint") && log.contains("ckpt-epoch-00000007"), "{log}");
    assert!(log.contains("epoch 2 done"), "resumed from the good checkpoint: {log}");
    // a checkpoint far longer than this model's can be
    let big = ck.join("ckpt-epoch-00000008.grnd-ckpt");
    std::fs::remove_file(ck.join("ckpt-epoch-00000007.grnd-ckpt")).unwrap();
    let f = std::fs::File::create(&big).unwrap();
    f.set_len(8 << 30).unwrap(); // sparse: 8 GiB that take no disk
    let o = grinnder_limited(limit, &args, 120);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("more than a checkpoint of this model can be"), "{}", stderr(&o));
}

#[test]
fn resuming_from_only_damaged_checkpoints_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let ck = two_checkpoints(tmp.path());
    for e in std::fs::read_dir(&ck).unwrap() {
        let p = e.unwrap().path();
        let mut bytes = std::fs::read(&p).unwrap();
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0x04;
        std::fs::write(&p, bytes).unwrap();
    }
    let o = grinnder(&["-q", "train", "--epochs", "3", "--checkpoint-dir", ck.to_str().unwrap(), "--resume"]);
    assert!(!o.status.success(), "a resume that cannot resume must not start afresh");
    let err = stderr(&o);
    assert!(err.contains("every checkpoint") && err.contains("damaged") && err.contains("--resume"), "{err}");
}

#[test]
fn damaged_checkpoints_of_later_epochs_take_no_keep_slot() {
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("ck");
    std::fs::create_dir(&ck).unwrap();
    std::fs::write(ck.join("ckpt-epoch-00000099.grnd-ckpt"), b"not a checkpoint").unwrap();
    let c = ck.to_str().unwrap();
    ok(grinnder(&["-q", "train", "--epochs", "3", "--checkpoint-dir", c, "--checkpoint-keep", "2"]));
    for epoch in [2, 3] {
        assert!(ck.join(format!("ckpt-epoch-{epoch:08}.grnd-ckpt")).is_file(), "epoch {epoch} kept");
    }
}

#[test]
fn a_failed_checkpoint_write_removes_its_temporary_and_names_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("ck");
    std::fs::create_dir(&ck).unwrap();
    // files of at most 512 kB (Cora's checkpoint is about 1.7 MB); SIGXFSZ ignored, so the
    // write fails with EFBIG as a full disk fails it with ENOSPC
    let limits = "trap '' XFSZ; ulimit -f 500";
    let args = [
        "-q",
        "--threads",
        "2",
        "train",
        "--epochs",
        "2",
        "--checkpoint-dir",
        ck.to_str().unwrap(),
        "--resume",
    ];
    for attempt in 0..2 {
        let o = grinnder_limited(limits, &args, 120);
        assert!(!o.status.success(), "attempt {attempt}: the checkpoint cannot be written");
        let err = stderr(&o);
        assert!(err.contains("ckpt-epoch-00000001.grnd-ckpt") && err.contains("too large"), "{err}");
        let left: Vec<_> = std::fs::read_dir(&ck).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert!(left.is_empty(), "attempt {attempt} left {left:?}");
    }
}
