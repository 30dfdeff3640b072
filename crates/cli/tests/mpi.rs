//! `grinnder train` under `mpirun` (feature `mpi`, Open MPI installed): the same flags as one
//! process train partition-parallel over the ranks, with the same per-epoch losses (within f32
//! reassociation, 1e-5 relative) and the same accuracies; rank 0 alone writes the metrics, which
//! count the bytes exchanged within and between (emulated) servers. Cooperative batches (a
//! server's batch split over its ranks) train as one process's batches of their union.
#![cfg(feature = "mpi")]

use std::path::Path;
use std::process::{Command, Output};

fn root() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn is_root() -> bool {
    Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout.starts_with(b"0\n"))
}

fn mpirun(ranks: usize, args: &[&str]) -> Output {
    let mut cmd = Command::new("mpirun");
    cmd.args(["-n", &ranks.to_string(), "--oversubscribe"]);
    if is_root() {
        cmd.arg("--allow-run-as-root");
    }
    cmd.arg(env!("CARGO_BIN_EXE_grinnder")).args(args).current_dir(root()).output().expect("mpirun runs")
}

fn single(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_grinnder"))
        .args(args)
        .current_dir(root())
        .output()
        .expect("the binary runs")
}

fn epochs(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v.get("final").is_none())
        .collect()
}

#[test]
fn mpirun_predicts_what_one_process_does() {
    let dir = tempfile::tempdir().unwrap();
    let d = |x: &str| dir.path().join(x).to_str().unwrap().to_string();
    let o =
        single(&["-q", "train", "--model", "sage", "--epochs", "20", "--save-model", &d("m.safetensors")]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (m, one, two) = (d("m.safetensors"), d("one"), d("two"));
    let o = single(&["-q", "predict", "--model-file", &m, "--out", &one, "--embed", "0"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = mpirun(2, &["-q", "predict", "--model-file", &m, "--out", &two, "--embed", "0", "--parts", "4"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(out.matches("logits: 2708").count(), 1, "rank 0 alone reports: {out}");
    for name in ["logits.npy", "embedding-0.npy"] {
        let read = |sub: &str| {
            let a = grinnder_graph::io::npy::Npy::open(&Path::new(&d(sub)).join(name)).unwrap();
            (a.shape.clone(), a.to_f32().unwrap().to_vec())
        };
        let ((ws, want), (gs, got)) = (read("one"), read("two"));
        assert_eq!(ws, gs, "{name}");
        let scale = want.iter().fold(0f32, |m, x| m.max(x.abs()));
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!((g - w).abs() <= 1e-5 * scale, "{name}: value {i}: {g} against {w}");
        }
    }
    let left: Vec<_> = std::fs::read_dir(d("two")).unwrap().flatten().map(|e| e.file_name()).collect();
    assert_eq!(left.len(), 2, "no temporaries left: {left:?}");
}

#[test]
fn mpirun_trains_partition_parallel_like_one_process() {
    let dir = tempfile::tempdir().unwrap();
    for model in ["gcn", "sage", "gat", "gin", "gatv2"] {
        let one = dir.path().join(format!("{model}-1.jsonl"));
        let two = dir.path().join(format!("{model}-2.jsonl"));
        let args = |out: &Path| -> Vec<String> {
            [
                "-q",
                "train",
                "--model",
                model,
                "--parts",
                "4",
                "--epochs",
                "4",
                "--eval-every",
                "2",
                "--metrics-out",
            ]
            .iter()
            .map(|s| s.to_string())
            .chain([out.to_str().unwrap().to_string()])
            .collect()
        };
        let a = args(&one);
        let o = single(&a.iter().map(String::as_str).collect::<Vec<_>>());
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let b = args(&two);
        let o = mpirun(2, &b.iter().map(String::as_str).collect::<Vec<_>>());
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let out = String::from_utf8_lossy(&o.stdout);
        assert_eq!(out.matches("test accuracy").count(), 1, "rank 0 alone reports: {out}");
        let (want, got) = (epochs(&one), epochs(&two));
        assert_eq!(got.len(), 4, "{model}: rank 0 alone writes the metrics");
        for (w, g) in want.iter().zip(&got) {
            let (lw, lg) = (w["loss"].as_f64().unwrap(), g["loss"].as_f64().unwrap());
            assert!((lw - lg).abs() <= 1e-5 * lw, "{model} epoch {}: loss {lg} vs {lw}", w["epoch"]);
            assert_eq!(w["valid_acc"], g["valid_acc"], "{model} epoch {}", w["epoch"]);
            assert_eq!(w["test_acc"], g["test_acc"], "{model} epoch {}", w["epoch"]);
            assert!(g["comm"]["halo_intra_bytes"].as_u64().unwrap() > 0, "{model}: halo rows counted");
        }
    }
}

#[test]
fn emulated_servers_count_inter_server_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let one = dir.path().join("one.jsonl");
    let o = single(&["-q", "train", "--epochs", "2", "--parts", "4", "--metrics-out", one.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let want = epochs(&one);
    // two servers of two ranks; and of one rank each (a server's halo exchange is then among
    // one rank: nothing to send)
    for (ranks, per_server, expansion) in
        [(4, "2", "none"), (4, "2", "preload"), (4, "2", "eas"), (2, "1", "preload")]
    {
        let m = dir.path().join(format!("{expansion}-{ranks}.jsonl"));
        let o = mpirun(
            ranks,
            &[
                "-q",
                "train",
                "--epochs",
                "2",
                "--ranks-per-server",
                per_server,
                "--expansion",
                expansion,
                "--metrics-out",
            ]
            .into_iter()
            .chain([m.to_str().unwrap()])
            .collect::<Vec<_>>(),
        );
        assert!(o.status.success(), "{expansion}: {}", String::from_utf8_lossy(&o.stderr));
        for (e, w) in epochs(&m).iter().zip(&want) {
            let c = &e["comm"];
            let count = |k: &str| c[k].as_u64().unwrap();
            assert!(count("reduce_inter_bytes") > 0, "{expansion}: gradients are summed over servers: {c}");
            if expansion == "none" {
                for k in ["halo_intra_bytes", "halo_inter_bytes", "grad_intra_bytes", "grad_inter_bytes"] {
                    assert!(count(k) > 0, "{expansion}: {k} in {c}");
                }
            } else {
                // a server trains on its share: halo rows never leave it
                assert_eq!(count("halo_inter_bytes") + count("grad_inter_bytes"), 0, "{expansion}: {c}");
            }
            if expansion != "eas" {
                // plain, and preloading as many hops as layers, are exact
                let (lw, lg) = (w["loss"].as_f64().unwrap(), e["loss"].as_f64().unwrap());
                assert!((lw - lg).abs() <= 1e-5 * lw, "{expansion} epoch {}: loss {lg} vs {lw}", e["epoch"]);
                assert_eq!(w["test_acc"], e["test_acc"], "{expansion}");
            }
        }
    }
    // fewer partitions than ranks is refused, naming both
    let o = mpirun(2, &["-q", "train", "--parts", "1", "--epochs", "1"]);
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("fewer than the 2 ranks"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    // server shares need several ranks
    let o = single(&["-q", "train", "--expansion", "preload", "--epochs", "1"]);
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("start several ranks"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn cooperative_batches_train_like_one_process_on_their_union() {
    let dir = tempfile::tempdir().unwrap();
    let (one, four) = (dir.path().join("one.jsonl"), dir.path().join("four.jsonl"));
    let common =
        ["-q", "train", "--mode", "minibatch", "--model", "sage", "--fanout", "-1,-1", "--epochs", "3"];
    // 4 ranks as 2 servers of 2, 35 seeds per rank: each step is 140 seeds, as one process's
    // batches of 140 (the same shuffled order)
    let o = single(
        &common
            .iter()
            .copied()
            .chain(["--batch-size", "140", "--metrics-out", one.to_str().unwrap()])
            .collect::<Vec<_>>(),
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = mpirun(
        4,
        &common
            .iter()
            .copied()
            .chain(["--batch-size", "35", "--ranks-per-server", "2", "--metrics-out", four.to_str().unwrap()])
            .collect::<Vec<_>>(),
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for (w, g) in epochs(&one).iter().zip(&epochs(&four)) {
        let (lw, lg) = (w["loss"].as_f64().unwrap(), g["loss"].as_f64().unwrap());
        assert!((lw - lg).abs() <= 1e-5 * lw, "epoch {}: loss {lg} vs {lw}", w["epoch"]);
        assert_eq!(w["valid_acc"], g["valid_acc"], "epoch {}", w["epoch"]);
        let c = &g["comm"];
        assert!(
            c["halo_intra_bytes"].as_u64().unwrap() > 0 && c["reduce_inter_bytes"].as_u64().unwrap() > 0,
            "{c}"
        );
    }
}

/// A flag cooperative batches do not use is refused under mpirun, not ignored.
#[test]
fn cooperative_batches_refuse_loader_threads() {
    let o = mpirun(2, &["-q", "train", "--mode", "minibatch", "--loader-threads", "2", "--epochs", "1"]);
    assert!(!o.status.success(), "--loader-threads accepted under mpirun");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("--loader-threads is for mini-batches in one process"), "{err}");
}

/// Checkpoints under mpirun: rank 0 alone writes them; a run stopped after 2 epochs and resumed
/// for 4 gives the losses of 4 epochs in one go, bit for bit (every rank restores rank 0's
/// parameters and optimizer state), for full-graph ranks and for cooperative batches.
#[test]
fn runs_over_ranks_checkpoint_and_resume() {
    let dir = tempfile::tempdir().unwrap();
    for (mode, extra) in
        [("full", &["--parts", "4"][..]), ("minibatch", &["--fanout", "5,5", "--batch-size", "35"][..])]
    {
        let run = |epochs: &str, ckpt: &Path, out: &Path, resume: bool| {
            let mut args = vec!["-q", "train", "--mode", mode, "--epochs", epochs, "--eval-every", "1"];
            args.extend(extra);
            args.extend(["--checkpoint-dir", ckpt.to_str().unwrap(), "--metrics-out", out.to_str().unwrap()]);
            if resume {
                args.push("--resume");
            }
            let o = mpirun(2, &args);
            assert!(o.status.success(), "{mode}: {}", String::from_utf8_lossy(&o.stderr));
        };
        let (straight, stopped) =
            (dir.path().join(format!("{mode}-a")), dir.path().join(format!("{mode}-b")));
        let whole = dir.path().join(format!("{mode}-whole.jsonl"));
        run("4", &straight, &whole, false);
        let first = dir.path().join(format!("{mode}-first.jsonl"));
        run("2", &stopped, &first, false);
        let files: Vec<_> = std::fs::read_dir(&stopped).unwrap().flatten().map(|e| e.file_name()).collect();
        assert_eq!(files.len(), 2, "{mode}: a checkpoint per epoch: {files:?}");
        let rest = dir.path().join(format!("{mode}-rest.jsonl"));
        run("4", &stopped, &rest, true);
        let (want, got) = (epochs(&whole), epochs(&rest));
        assert_eq!(got.len(), 2, "{mode}: the resumed run trains epochs 2 and 3");
        if mode == "full" {
            // rank 0 alone writes: a checkpoint directory that cannot be made is refused on
            // every rank before the dataset loads, so none waits for another in an exchange;
            // `timeout` turns a hang into a failure
            let file = dir.path().join("a-file");
            std::fs::write(&file, b"").unwrap();
            let bad = file.join("checkpoints");
            let mut cmd = Command::new("timeout");
            cmd.args(["300", "mpirun", "-n", "2", "--oversubscribe"]);
            if is_root() {
                cmd.arg("--allow-run-as-root");
            }
            let o = cmd
                .arg(env!("CARGO_BIN_EXE_grinnder"))
                .args([
                    "-q",
                    "train",
                    "--parts",
                    "2",
                    "--epochs",
                    "2",
                    "--checkpoint-dir",
                    bad.to_str().unwrap(),
                ])
                .current_dir(root())
                .output()
                .unwrap();
            assert_ne!(o.status.code(), Some(124), "the ranks waited for a rank that had stopped");
            assert!(!o.status.success());
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(err.contains("--checkpoint-dir") && err.contains("cannot make the directory"), "{err}");
        }
        for (w, g) in want[2..].iter().zip(&got) {
            assert_eq!(w["epoch"], g["epoch"]);
            assert_eq!(
                w["loss"], g["loss"],
                "{mode} epoch {}: the same bits as a run never stopped",
                w["epoch"]
            );
            assert_eq!(w["valid_acc"], g["valid_acc"], "{mode} epoch {}", w["epoch"]);
        }
    }
}

/// The test accuracy (at the best validation epoch) of one run, from its metrics file.
fn test_acc(path: &Path) -> f64 {
    let text = std::fs::read_to_string(path).unwrap();
    let last: serde_json::Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    last["test_acc"].as_f64().unwrap()
}

/// Issue 9's accuracy bar with real ranks: expansion-aware sampling and cooperative batches
/// (4 ranks as 2 servers × 2) keep Cora's and PubMed's test accuracy within 1 point of
/// full-graph training (GCN, Kipf & Welling settings, 200 epochs), on the mean over seeds 0, 1
/// and 2 (one seed alone moves by 2 points). Slow in a debug build (≈ 40 minutes): CI runs it
/// in release (`.ci/run`, ≈ 6 minutes).
#[test]
#[ignore = "slow: run in release with --ignored (.ci/run does)"]
fn sampling_and_cooperative_batches_keep_accuracy_within_a_point() {
    let dir = tempfile::tempdir().unwrap();
    let out = |name: String| dir.path().join(name);
    for ds in ["data/cora", "data/pubmed"] {
        let mut sums = [0.0f64; 3];
        for seed in ["0", "1", "2"] {
            let common = ["-q", "train", ds, "--model", "gcn", "--epochs", "200", "--seed", seed];
            let full = out(format!("full-{seed}.jsonl"));
            let args: Vec<&str> = common.iter().copied().chain(["--parts", "4", "--metrics-out"]).collect();
            let o = single(&[&args[..], &[full.to_str().unwrap()]].concat());
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            let eas = out(format!("eas-{seed}.jsonl"));
            let args: Vec<&str> = common
                .iter()
                .copied()
                .chain(["--parts", "4", "--ranks-per-server", "2", "--expansion", "eas", "--metrics-out"])
                .chain([eas.to_str().unwrap()])
                .collect();
            let o = mpirun(4, &args);
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            let coop = out(format!("coop-{seed}.jsonl"));
            let args: Vec<&str> = common
                .iter()
                .copied()
                .chain([
                    "--mode",
                    "minibatch",
                    "--fanout",
                    "25,10",
                    "--batch-size",
                    "8",
                    "--ranks-per-server",
                    "2",
                ])
                .chain(["--metrics-out", coop.to_str().unwrap()])
                .collect();
            let o = mpirun(4, &args);
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            for (s, f) in sums.iter_mut().zip([&full, &eas, &coop]) {
                *s += test_acc(f) * 100.0 / 3.0;
            }
        }
        let [full, eas, coop] = sums;
        eprintln!("{ds}: full-graph {full:.2} %, expansion-aware sampling {eas:.2} %, cooperative batches {coop:.2} %");
        assert!(eas >= full - 1.0, "{ds}: expansion-aware sampling {eas:.2} % vs full-graph {full:.2} %");
        assert!(coop >= full - 1.0, "{ds}: cooperative batches {coop:.2} % vs full-graph {full:.2} %");
    }
}
