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

/// This machine's name as a run directory's name holds it (letters, digits, `.` and `_`).
fn host() -> String {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    name.trim()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '.' || c == '_' { c } else { '_' })
        .collect()
}

/// The entries of `dir`, sorted, subfolders' entries as `sub/name`.
fn tree(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().to_string_lossy().into_owned();
        if e.file_type().unwrap().is_dir() {
            out.extend(tree(&e.path()).into_iter().map(|n| format!("{name}/{n}")));
        }
        out.push(name);
    }
    out.sort();
    out
}

/// Cora trained for an epoch with every block through `storage`, and `extra` flags.
fn train_through(storage: &Path, extra: &[&str]) -> Output {
    let s = storage.to_str().unwrap();
    let mut args =
        vec!["-q", "train", "--epochs", "1", "--parts", "2", "--block-cache", "0", "--storage-dir", s];
    args.extend_from_slice(extra);
    grinnder(&args)
}

#[test]
fn kept_storage_and_folders_named_like_runs_are_never_removed() {
    let tmp = tempfile::tempdir().unwrap();
    let storage = tmp.path();
    ok(train_through(storage, &["--keep-storage"]));
    let kept = tree(storage);
    assert!(kept.iter().any(|n| n.ends_with(".blk")), "block files kept: {kept:?}");
    // a user's folder named as a run of this machine whose process is gone would be named
    let users = storage.join(format!("grinnder-run-{}-999999997-thesis", host()));
    std::fs::create_dir_all(users.join("figures")).unwrap();
    std::fs::write(users.join("thesis.tex"), b"mine").unwrap();
    std::fs::write(users.join("figures/plot.png"), b"mine").unwrap();
    let before = tree(storage);
    // a later run in the same directory, then clean: both leave all of it
    ok(train_through(storage, &[]));
    assert_eq!(tree(storage), before, "a later run removed what was not its own");
    let o = ok(grinnder(&["clean", storage.to_str().unwrap()]));
    assert_eq!(tree(storage), before, "clean removed what was not its own");
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        out.contains("--keep-storage left it for you") && out.contains("grinnder did not make it"),
        "{out}"
    );
}

/// What a run directory's identity file says.
const IDENTITY: &str = "grinnder run directory, made by process 999999999 on another namespace\n";

#[test]
fn clean_judges_a_run_by_its_lock_and_fails_loudly() {
    let tmp = tempfile::tempdir().unwrap();
    let storage = tmp.path();
    ok(train_through(storage, &["--keep-storage"]));
    let kept = std::fs::read_dir(storage).unwrap().next().unwrap().unwrap().path();
    // a live run whose process id means nothing here (another PID namespace): its directory
    // names a process that does not exist in ours, and the run holds its lock
    let live = storage.join(format!("grinnder-run-{}-999999999-live01", host()));
    std::fs::create_dir(&live).unwrap();
    std::fs::write(live.join(".grinnder-run"), IDENTITY).unwrap();
    std::fs::write(live.join("act-l0-p0.blk"), b"in use").unwrap();
    let lock = std::fs::File::open(live.join(".grinnder-run")).unwrap();
    // SAFETY: flock on a descriptor we own.
    assert_eq!(unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&lock), libc::LOCK_EX) }, 0);
    // an ended run's directory into which someone put a file of their own: it cannot go whole
    let mixed = storage.join(format!("grinnder-run-{}-999999998-mixed1", host()));
    std::fs::create_dir(&mixed).unwrap();
    std::fs::write(mixed.join(".grinnder-run"), IDENTITY).unwrap();
    std::fs::write(mixed.join("act-l0-p0.blk"), b"ours").unwrap();
    std::fs::write(mixed.join("notes.txt"), b"mine").unwrap();
    let o = grinnder(&["clean", storage.to_str().unwrap()]);
    assert!(!o.status.success(), "a failed removal must fail clean");
    let err = stderr(&o);
    assert!(err.contains(&*mixed.to_string_lossy()) && err.contains("notes.txt"), "{err}");
    assert!(live.join("act-l0-p0.blk").exists(), "a live run's files were removed");
    assert!(mixed.join("notes.txt").exists(), "a user's file was removed");
    // the lock released, the live run's directory is an ended one's: clean removes it
    drop(lock);
    std::fs::remove_file(mixed.join("notes.txt")).unwrap();
    ok(grinnder(&["clean", storage.to_str().unwrap()]));
    assert!(!live.exists() && !mixed.exists() && kept.exists());
}

/// Makes a FIFO (named pipe) at `path`.
fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo {}", path.display());
}

fn is_fifo(path: &Path) -> bool {
    std::os::unix::fs::FileTypeExt::is_fifo(&std::fs::symlink_metadata(path).unwrap().file_type())
}

#[test]
fn outputs_never_replace_a_fifo_or_a_socket() {
    let tmp = tempfile::tempdir().unwrap();
    let t = |name: &str| tmp.path().join(name);
    let model = t("cora.grnd-model");
    ok(grinnder(&["-q", "train", "--epochs", "1", "--save-model", model.to_str().unwrap()]));
    for d in ["predict", "export", "ck"] {
        std::fs::create_dir(t(d)).unwrap();
    }
    let fifos = [
        "m.fifo",
        "g.fifo",
        "c.fifo",
        "predict/logits.npy",
        "export/node_label.npy",
        "ck/ckpt-epoch-00000001.grnd-ckpt",
    ];
    for f in fifos {
        mkfifo(&t(f));
    }
    let socket = t("m.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let s = |name: &str| t(name).to_string_lossy().into_owned();
    let m = model.to_str().unwrap();
    let cases: [(&str, Vec<String>); 7] = [
        ("m.fifo", vec!["train".into(), "--epochs".into(), "1".into(), "--save-model".into(), s("m.fifo")]),
        ("m.sock", vec!["train".into(), "--epochs".into(), "1".into(), "--save-model".into(), s("m.sock")]),
        (
            "g.fifo",
            vec![
                "generate".into(),
                "--preset".into(),
                "arxiv-like".into(),
                "--scale".into(),
                "0.01".into(),
                "--out".into(),
                s("g.fifo"),
            ],
        ),
        ("c.fifo", vec!["convert".into(), "data/cora".into(), "--out".into(), s("c.fifo")]),
        (
            "predict/logits.npy",
            vec!["predict".into(), "--model-file".into(), m.into(), "--out".into(), s("predict")],
        ),
        (
            "export/node_label.npy",
            vec![
                "export".into(),
                "data/cora".into(),
                "--format".into(),
                "npy".into(),
                "--out".into(),
                s("export"),
            ],
        ),
        (
            "ck/ckpt-epoch-00000001.grnd-ckpt",
            vec!["train".into(), "--epochs".into(), "1".into(), "--checkpoint-dir".into(), s("ck")],
        ),
    ];
    for (target, args) in cases {
        let mut full = vec!["-q".to_string()];
        full.extend(args);
        let refs: Vec<&str> = full.iter().map(String::as_str).collect();
        // a run that opened the FIFO to write would wait for a reader: bounded
        let o = grinnder_limited("true", &refs, 300);
        let err = stderr(&o);
        assert!(!o.status.success(), "{target}: written over");
        assert!(err.contains(target) && err.contains("not a regular file"), "{target}: {err}");
        let full = t(target).to_string_lossy().into_owned();
        assert_eq!(err.matches(full.as_str()).count(), 1, "the path named once: {err}");
        let meta = std::fs::symlink_metadata(t(target)).unwrap();
        let kept = if target.ends_with(".sock") {
            std::os::unix::fs::FileTypeExt::is_socket(&meta.file_type())
        } else {
            is_fifo(&t(target))
        };
        assert!(kept, "{target} was replaced");
    }
}

#[test]
fn outputs_never_replace_a_device_node() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: making a device node needs root (the probe's case: a root user's outputs)");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dev = tmp.path().join("full");
    let c = std::ffi::CString::new(dev.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path; the numbers are /dev/full's
    assert_eq!(unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o600, libc::makedev(1, 7)) }, 0);
    let d = dev.to_str().unwrap();
    for args in [
        vec!["train", "--epochs", "1", "--save-model", d],
        vec!["generate", "--preset", "arxiv-like", "--scale", "0.01", "--out", d],
        vec!["convert", "data/cora", "--out", d],
        vec!["export", "data/cora", "--format", "npy", "--out", d],
        vec!["export", "data/cora", "--format", "ogb", "--out", d],
    ] {
        let o = grinnder_limited("true", &args, 120);
        let err = stderr(&o);
        assert!(!o.status.success() && err.contains("a character device"), "{args:?}: {err}");
        assert_eq!(err.matches(d).count(), 1, "{args:?}: the path named once: {err}");
        let t = std::fs::symlink_metadata(&dev).unwrap().file_type();
        assert!(std::os::unix::fs::FileTypeExt::is_char_device(&t), "{args:?} replaced the device");
    }
}

/// The hidden files in `dir` (temporaries: `.NAME.tmp-XXXXXX`, before 2026-12 `.NAME.XXXXXX`).
fn temporaries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.'))
        .collect()
}

#[test]
fn a_stale_temporary_is_removed_by_the_next_writer_and_a_live_ones_is_not() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out.grnd");
    // left by a killed run: nobody holds its lock
    let stale = tmp.path().join(".out.grnd.tmp-Ab12Cd");
    std::fs::write(&stale, vec![0u8; 1 << 20]).unwrap();
    // a live writer's: its lock held (here by this process)
    let live = tmp.path().join(".out.grnd.tmp-Xy34Zw");
    std::fs::write(&live, b"being written").unwrap();
    let held = std::fs::File::open(&live).unwrap();
    // SAFETY: flock on a descriptor we own.
    assert_eq!(unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&held), libc::LOCK_EX) }, 0);
    // a user's file that only resembles one
    let users = tmp.path().join(".out.grnd.tmp-notes.txt");
    std::fs::write(&users, b"mine").unwrap();
    ok(grinnder(&["-q", "convert", "data/cora", "--out", out.to_str().unwrap()]));
    assert!(!stale.exists(), "the stale temporary is removed");
    assert!(live.exists() && users.exists(), "a live temporary or a user's file was removed");
    assert!(out.is_file());
}

/// The regular files under `dir`, as paths relative to it.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p.strip_prefix(dir).unwrap().to_path_buf());
            }
        }
    }
    out.sort();
    out
}

#[test]
fn a_failed_export_leaves_no_partial_file_under_a_final_name() {
    let tmp = tempfile::tempdir().unwrap();
    for format in ["npy", "ogb", "igb"] {
        let whole = tmp.path().join(format!("{format}-whole"));
        ok(grinnder(&["-q", "export", "data/cora", "--format", format, "--out", whole.to_str().unwrap()]));
        // files of at most 100 kB, SIGXFSZ ignored: a larger file's write fails part-way, as on
        // a full disk
        let out = tmp.path().join(format);
        let args = ["-q", "export", "data/cora", "--format", format, "--out", out.to_str().unwrap()];
        let o = grinnder_limited("trap '' XFSZ; ulimit -f 100", &args, 120);
        assert!(!o.status.success(), "{format}: a file over 100 kB cannot be written");
        for f in files_under(&out) {
            let name = f.to_string_lossy();
            assert!(!name.contains(".tmp-"), "{format}: left the temporary {name}");
            let same = std::fs::read(out.join(&f)).unwrap() == std::fs::read(whole.join(&f)).unwrap();
            assert!(same, "{format}: {name} is partial");
        }
    }
}

/// Runs `args` until a temporary appears in `dir`, then sends SIGTERM; returns the output.
fn terminated_while_writing(args: &[&str], dir: &Path) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_grinnder"))
        .args(args)
        .current_dir(root())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while temporaries(dir).is_empty() {
        if child.try_wait().unwrap().is_some() {
            let o = child.wait_with_output().unwrap();
            panic!("{args:?} ended before a temporary was seen (make its output larger): {}", stderr(&o));
        }
        assert!(start.elapsed() < Duration::from_secs(300), "{args:?}: no temporary after 5 minutes");
        std::thread::sleep(Duration::from_millis(1));
    }
    // SAFETY: signals our own child.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    child.wait_with_output().unwrap()
}

#[test]
fn sigterm_removes_the_temporaries_of_generate_convert_and_predict() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = |name: &str| {
        let d = tmp.path().join(name);
        std::fs::create_dir(&d).unwrap();
        d
    };
    let (small, big) = (tmp.path().join("small.grnd"), tmp.path().join("big.grnd"));
    let (sm, bg) = (small.to_str().unwrap(), big.to_str().unwrap());
    let model = tmp.path().join("m.grnd-model");
    let m = model.to_str().unwrap();
    ok(grinnder(&["-q", "generate", "--preset", "arxiv-like", "--scale", "0.1", "--out", sm]));
    ok(grinnder(&["-q", "generate", "--preset", "arxiv-like", "--scale", BIG, "--out", bg]));
    ok(grinnder(&["-q", "train", sm, "--epochs", "1", "--save-model", m]));
    let (g, c, p) = (dir("g"), dir("c"), dir("p"));
    let g_out = g.join("out.grnd").to_string_lossy().into_owned();
    let c_out = c.join("out.grnd").to_string_lossy().into_owned();
    let cases: [(&Path, Vec<&str>); 3] = [
        (&g, vec!["generate", "--preset", "arxiv-like", "--scale", BIG, "--out", &g_out]),
        (&c, vec!["convert", bg, "--out", &c_out]),
        (&p, vec!["predict", bg, "--model-file", m, "--out", p.to_str().unwrap()]),
    ];
    for (d, args) in cases {
        let o = terminated_while_writing(&args, d);
        assert_eq!(o.status.code(), Some(143), "{args:?}: {}", stderr(&o));
        let left: Vec<_> = std::fs::read_dir(d).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert!(left.is_empty(), "{args:?} left {left:?}: {}", stderr(&o));
    }
}

/// The scale of the graphs the signal test writes: large enough to be caught mid-write.
const BIG: &str = "3";

/// A model file of `cora` saved by a short run in `dir`, and its bytes.
fn cora_model(dir: &Path) -> (PathBuf, Vec<u8>) {
    let p = dir.join("m.safetensors");
    ok(grinnder(&["-q", "train", "data/cora", "--epochs", "2", "--save-model", p.to_str().unwrap()]));
    let bytes = std::fs::read(&p).unwrap();
    (p, bytes)
}

/// `bytes` (a safetensors file) with metadata entry `key` set to `value` by editing the JSON
/// header, as a user with a text editor or `safe_open` would, the checksum left as it is.
fn with_metadata(bytes: &[u8], key: &str, value: &str) -> Vec<u8> {
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    header["__metadata__"][key] = value.into();
    let text = serde_json::to_vec(&header).unwrap();
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend(text);
    out.extend(&bytes[8 + n..]);
    out
}

#[test]
fn model_file_metadata_neither_steers_allocation_nor_changes_predictions() {
    let tmp = tempfile::tempdir().unwrap();
    let (_, bytes) = cora_model(tmp.path());
    let edited = tmp.path().join("edited.safetensors");
    let huge = (1u64 << 40).to_string();
    let cases = [
        ("layers", "0"),
        ("layers", "1000000"),
        ("layers", huge.as_str()),
        ("hidden", "4611686018427387904"),
        ("hidden", huge.as_str()),
        ("classes", huge.as_str()),
        ("heads", huge.as_str()),
        ("in_features", huge.as_str()),
        ("feature_shift", "1"),
        ("feature_norm", "none"),
    ];
    for (key, value) in cases {
        std::fs::write(&edited, with_metadata(&bytes, key, value)).unwrap();
        let out = tmp.path().join("p");
        for args in [
            vec![
                "predict",
                "data/cora",
                "--model-file",
                edited.to_str().unwrap(),
                "--out",
                out.to_str().unwrap(),
            ],
            vec!["train", "data/cora", "--epochs", "1", "--init-from", edited.to_str().unwrap()],
        ] {
            // a 2 GB address space: an allocation steered by the file would abort (134)
            let o = grinnder_limited("ulimit -v 2000000", &args, 60);
            assert_eq!(o.status.code(), Some(1), "{key}={value} {}: {}", args[0], stderr(&o));
            assert!(
                stderr(&o).contains(key) || stderr(&o).contains("checksum"),
                "{key}={value}: {}",
                stderr(&o)
            );
        }
    }
    // a sparse file of 3.5 GB whose header describes a few KB: refused from its header
    std::fs::write(&edited, &bytes).unwrap();
    std::fs::OpenOptions::new().write(true).open(&edited).unwrap().set_len(3_500 << 20).unwrap();
    let o = grinnder_limited(
        "ulimit -v 1000000",
        &[
            "predict",
            "data/cora",
            "--model-file",
            edited.to_str().unwrap(),
            "--out",
            tmp.path().join("q").to_str().unwrap(),
        ],
        30,
    );
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("follow its last tensor's data"), "{}", stderr(&o));
}

#[test]
fn sizes_no_machine_holds_are_refused_naming_the_flag() {
    let huge = (1u64 << 31).to_string();
    let cases: [(&[&str], &str); 6] = [
        (&["--hidden", &huge], "--hidden"),
        (&["--layers", "1000000"], "--layers"),
        (&["--num-classes", "100000000"], "--num-classes"),
        (&["--model", "gat", "--heads", "1000000"], "--heads"),
        (&["--parts", "4294967296"], "--parts"),
        (&["--hidden", &huge, "--parts", "2"], "--hidden"),
    ];
    for (flags, named) in cases {
        let mut args = vec!["train", "data/cora", "--epochs", "1"];
        args.extend(flags);
        let o = grinnder_limited("ulimit -v 3000000", &args, 60);
        assert_eq!(o.status.code(), Some(1), "{flags:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(named), "{flags:?}: {}", stderr(&o));
    }
}

#[test]
fn a_diverging_run_is_an_error_and_a_plot_it_cannot_draw_is_refused_first() {
    let o = grinnder(&["train", "data/cora", "--epochs", "3", "--lr", "1e30"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("diverged") && stderr(&o).contains("--lr"), "{}", stderr(&o));
    let tmp = tempfile::tempdir().unwrap();
    let plot = tmp.path().join("c.txt");
    let o = grinnder(&["train", "data/cora", "--epochs", "200", "--plot", plot.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("--plot") && stderr(&o).contains(".png"), "{}", stderr(&o));
    assert!(!stderr(&o).contains("epoch"), "refused before training: {}", stderr(&o));
}

#[test]
fn an_archive_declaring_more_than_the_budget_is_refused_before_it_is_inflated() {
    use grinnder_graph::io::npy::DType;
    use grinnder_graph::io::npz::NpzWriter;
    let tmp = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(tmp.path().join("big/raw")).unwrap();
    // 40,000 × 1433 float32 zeros (229 MB) deflate to a fraction of a MB
    let (n, f) = (40_000u64, 1433u64);
    let mut w = NpzWriter::create(&tmp.path().join("big/raw/data.npz"), true).unwrap();
    w.array("num_nodes_list", DType::I64, &[1], &[n as i64]).unwrap();
    w.array("num_edges_list", DType::I64, &[1], &[1i64]).unwrap();
    w.begin("node_feat", DType::F32, &[n, f]).unwrap();
    let zeros = vec![0f32; f as usize * 1000];
    for _ in 0..n / 1000 {
        w.write(&zeros).unwrap();
    }
    w.array("edge_index", DType::I64, &[2, 1], &[0i64, 1]).unwrap();
    w.finish().unwrap();
    let dir = tmp.path().join("big");
    let o = grinnder_limited(
        "ulimit -v 1500000",
        &["train", dir.to_str().unwrap(), "--host-mem", "64MiB", "--epochs", "1"],
        30,
    );
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("node_feat")
            && stderr(&o).contains("--host-mem")
            && stderr(&o).contains("nothing was read"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn node_lists_say_what_is_wrong_with_them() {
    let tmp = tempfile::tempdir().unwrap();
    let (model, _) = cora_model(tmp.path());
    // a 1-D .npy file of numpy's type `descr`
    let write = |name: &str, descr: &str, bytes: &[u8], len: usize| {
        let mut head = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': ({len},), }}");
        while (10 + head.len() + 1) % 64 != 0 {
            head.push(' ');
        }
        head.push('\n');
        let mut b = b"\x93NUMPY\x01\x00".to_vec();
        b.extend((head.len() as u16).to_le_bytes());
        b.extend(head.as_bytes());
        b.extend(bytes);
        let p = tmp.path().join(name);
        std::fs::write(&p, b).unwrap();
        p
    };
    // a boolean mask, as PyG keeps its splits: the nodes where it is true
    let mut mask = vec![0u8; 2708];
    mask[3] = 1;
    mask[2707] = 1;
    let out = tmp.path().join("pm");
    let predict = |nodes: &Path| {
        let m = model.to_str().unwrap();
        grinnder(&[
            "predict",
            "data/cora",
            "--model-file",
            m,
            "--nodes",
            nodes.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ])
    };
    ok(predict(&write("mask.npy", "|b1", &mask, 2708)));
    let ids = grinnder_graph::io::npy::Npy::open(&out.join("nodes.npy")).unwrap().to_i64().unwrap();
    assert_eq!(ids, vec![3, 2707]);
    let o = predict(&write("short.npy", "|b1", &mask[..10], 10));
    assert!(stderr(&o).contains("boolean mask of 10 entries"), "{}", stderr(&o));
    let o = predict(&write("big.npy", "<u8", &(1u64 << 63).to_le_bytes(), 1));
    assert!(stderr(&o).contains("9223372036854775808, past the largest id"), "{}", stderr(&o));
}
