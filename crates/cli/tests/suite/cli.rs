//! The `grinnder` binary end to end: the newcomer's first command, conversions, generation,
//! and clear failures.

use std::path::Path;
use std::process::{Command, Output};

fn grinnder(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_grinnder"))
        .args(args)
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."))
        .output()
        .expect("the binary runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn info_defaults_to_the_bundled_cora() {
    let o = grinnder(&["info"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    for want in [
        "nodes          2708",
        "edges          10556",
        "features       1433",
        "classes        7",
        "train 140 / valid 500 / test 1000",
    ] {
        assert!(out.contains(want), "missing {want:?} in\n{out}");
    }
}

#[test]
fn info_json_and_budgets() {
    let o = grinnder(&["info", "--json", "--hidden", "64", "--gpu-mem", "1KiB", "--host-mem", "1GiB"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    assert_eq!(v["nodes"], 2708);
    assert_eq!(v["layer_bytes"], 2708 * 64 * 4);
    assert_eq!(v["fits_gpu"], false);
    assert_eq!(v["fits_host"], true);
    // a host budget beside another setting of the partitioned executor (--storage-dir) is that
    // run's budget, as train takes it (info planned every block in RAM)
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let o = grinnder(&["info", "--json", "--hidden", "64", "--host-mem", "100MiB", "--storage-dir", d]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    let cache = &v["tiered"]["plan"]["cache_bytes"];
    assert!(cache.as_u64().is_some_and(|c| c < 100 << 20), "a host cache under the budget: {cache}");
}

#[test]
fn convert_export_generate_agree() {
    let dir = tempfile::tempdir().unwrap();
    let d = |s: &str| dir.path().join(s).to_string_lossy().into_owned();
    let run = |args: &[&str]| {
        let o = grinnder(args);
        assert!(o.status.success(), "grinnder {args:?} failed: {}", stderr(&o));
        o
    };
    run(&["-q", "convert", "data/cora", "--out", &d("cora.grnd")]);
    run(&["-q", "export", &d("cora.grnd"), "--format", "npy", "--out", &d("cora_npy")]);
    let a = stdout(&run(&["info", "--json", &d("cora.grnd")]));
    let b = stdout(&run(&["info", "--json", &d("cora_npy")]));
    let strip = |s: &str| {
        let mut v: serde_json::Value = serde_json::from_str(s.trim()).unwrap();
        v.as_object_mut().unwrap().retain(|k, _| k != "name" && k != "load_seconds");
        // The plan's reasons name the machine's available memory, which moves between runs.
        v["run_plan"].as_object_mut().unwrap().remove("reasons");
        v
    };
    assert_eq!(strip(&a), strip(&b));

    run(&[
        "-q",
        "generate",
        "--preset",
        "arxiv-like",
        "--scale",
        "0.01",
        "--seed",
        "3",
        "--out",
        &d("g.grnd"),
    ]);
    run(&[
        "-q",
        "generate",
        "--preset",
        "arxiv-like",
        "--scale",
        "0.01",
        "--seed",
        "3",
        "--format",
        "npy",
        "--out",
        &d("g_npy"),
    ]);
    let g1 = strip(&stdout(&run(&["info", "--json", &d("g.grnd")])));
    let g2 = strip(&stdout(&run(&["info", "--json", &d("g_npy")])));
    assert_eq!(g1, g2);
    assert_eq!(g1["nodes"], 1693);
    assert_eq!(g1["directed_edges"], 23324);
}

#[test]
fn failures_are_clear_and_exit_nonzero() {
    let o = grinnder(&["info", "/no/such/dataset"]);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(err.contains("error:") && err.contains("/no/such/dataset"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    let o = grinnder(&["generate", "--preset", "bogus-like", "--out", "/tmp/x"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("unknown preset"), "{}", stderr(&o));
    let o = grinnder(&["info", "--gpu-mem", "lots"]);
    assert!(!o.status.success());
    // an error that quotes its cause says it once
    let o = grinnder(&["predict", "--model-file", "/no/such/m.safetensors", "--out", "/tmp/y.npy"]);
    assert!(!o.status.success());
    assert_eq!(stderr(&o).matches("No such file").count(), 1, "{}", stderr(&o));
    // GPU-only settings on the CPU, and a GPU benchmark without a GPU: refused, with the reason
    for (args, want) in [
        (&["train", "--gpu-mem", "8GiB"][..], "--gpu-mem needs --device cuda"),
        (&["train", "--tf32"][..], "--tf32 needs --device cuda"),
        (
            &["predict", "--model-file", "m.safetensors", "--out", "/tmp/y.npy", "--tf32"][..],
            "--tf32 need --device cuda",
        ),
        (
            &["predict", "--model-file", "m.safetensors", "--out", "/tmp/y.npy", "--tf32=true"][..],
            "--tf32 need --device cuda",
        ),
        (&["bench", "--device", "cpu", "transfer"][..], "use --device cuda"),
    ] {
        let o = grinnder(args);
        assert!(!o.status.success(), "{args:?}");
        assert!(stderr(&o).contains(want) && !stderr(&o).contains("panicked"), "{args:?}: {}", stderr(&o));
    }
    if !grinnder_cuda::driver_present() {
        let o = grinnder(&["bench", "gather"]);
        assert!(!o.status.success());
        assert!(stderr(&o).contains("no CUDA driver") && !stderr(&o).contains("panicked"), "{}", stderr(&o));
    }
}

#[test]
fn bench_sample_measures_the_loader_on_the_cpu() {
    // Cora's 140 training nodes in batches of 32: 5 batches, 2 sampling threads
    let o = grinnder(&[
        "-q",
        "bench",
        "--reps",
        "1",
        "sample",
        "--fanout",
        "5,5",
        "--batch-size",
        "32",
        "--loader-threads",
        "2",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("one JSON object");
    assert_eq!(v["batches"], 5);
    assert_eq!(v["loader_threads"], 2);
    let (s, g) = (&v["sample"], &v["sample_and_gather"]);
    let rows = s["input_rows_per_batch"].as_f64().unwrap();
    // 28 seeds per batch on average, at most 1 + 5 + 25 input rows each, at most every node
    assert!((28.0..=(28.0_f64 * 31.0).min(2708.0)).contains(&rows), "{rows} input rows per batch");
    let edges = s["edges_per_batch"].as_f64().unwrap();
    assert!(edges > 0.0 && edges <= 5.0 * (28.0 + rows), "{edges} edges per batch");
    // the same batches either way (seeded), their rows gathered: 1433 floats each
    assert_eq!(g["input_rows_per_batch"], s["input_rows_per_batch"]);
    let gb = g["gathered_gb"].as_f64().unwrap();
    let want = rows * 5.0 * 1433.0 * 4.0 / 1e9;
    assert!((gb - want).abs() <= 1e-9 * want, "{gb} GB gathered, want {want}");
    for t in [s, g] {
        assert!(t["s"].as_f64().unwrap() > 0.0 && t["seeds_per_s"].as_f64().unwrap() > 0.0, "{t}");
    }
    // refused clearly
    let o = grinnder(&["bench", "sample", "--fanout", "0"]);
    assert!(!o.status.success() && stderr(&o).contains("--fanout"), "{}", stderr(&o));
}

#[test]
fn train_writes_metrics_and_a_plot() {
    let dir = tempfile::tempdir().unwrap();
    let metrics = dir.path().join("m.jsonl");
    let plot = dir.path().join("curves.png");
    let o = grinnder(&[
        "-q",
        "train",
        "--epochs",
        "4",
        "--hidden",
        "8",
        "--metrics-out",
        metrics.to_str().unwrap(),
        "--plot",
        plot.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("test accuracy"), "{}", stdout(&o));
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&metrics)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 5, "four epochs and the final line");
    for (i, m) in lines[..4].iter().enumerate() {
        assert_eq!(m["epoch"], i);
        for k in ["loss", "train_acc", "valid_acc", "test_acc", "epoch_s", "peak_host_bytes"] {
            assert!(m[k].is_number(), "key {k} in {m}");
        }
    }
    let last = &lines[4];
    assert_eq!(last["final"], true);
    let best = last["best_epoch"].as_u64().unwrap() as usize;
    assert_eq!(
        last["test_acc"], lines[best]["test_acc"],
        "final test accuracy is the best-validation epoch's"
    );
    let png = std::fs::read(&plot).unwrap();
    assert_eq!(&png[1..4], b"PNG");
}

#[test]
fn train_config_file_and_flag_precedence() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("run.toml");
    std::fs::write(&cfg, "model = \"sage\"\nepochs = 2\nhidden = 4\nlr = 0.05\n").unwrap();
    let metrics = dir.path().join("m.jsonl");
    let o = grinnder(&[
        "-q",
        "train",
        "--config",
        cfg.to_str().unwrap(),
        "--epochs",
        "3",
        "--metrics-out",
        metrics.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let n = std::fs::read_to_string(&metrics).unwrap().lines().count();
    assert_eq!(n, 4, "the flag (3 epochs) overrides the file (2)");
    std::fs::write(&cfg, "epochz = 2\n").unwrap();
    let o = grinnder(&["-q", "train", "--config", cfg.to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("epochz"), "{}", stderr(&o));
    let o = grinnder(&["-q", "train", "--dropout", "1.5"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--dropout"), "{}", stderr(&o));
}

#[test]
fn partition_prints_quality_for_each_count() {
    let cache = tempfile::tempdir().unwrap();
    let cache_dir = cache.path().to_str().unwrap();
    let o = grinnder(&["partition", "--parts", "1,3", "--json", "--cache-dir", cache_dir]);
    assert!(o.status.success(), "{}", stderr(&o));
    let rows: Vec<serde_json::Value> = stdout(&o).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0]["halo_volume"], 0, "one partition has no halo");
    assert!(rows[1]["halo_volume"].as_u64().unwrap() > 0);
    assert!(rows[1]["balance"].as_f64().unwrap() <= 1.10);
    assert_eq!(rows[1]["cached"], false);
    let again = grinnder(&["partition", "--parts", "3", "--json", "--cache-dir", cache_dir]);
    let row: serde_json::Value = serde_json::from_str(stdout(&again).trim()).unwrap();
    assert_eq!(row["cached"], true, "the second run reads the cache");
    assert_eq!(row["halo_volume"], rows[1]["halo_volume"]);
    let o = grinnder(&["partition", "--parts", "100000", "--no-cache"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("at most one partition per node"), "{}", stderr(&o));
}

fn losses(metrics: &Path) -> Vec<f64> {
    std::fs::read_to_string(metrics)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter_map(|m| m.get("epoch").is_some().then(|| m["loss"].as_f64().unwrap()))
        .collect()
}

/// A folder with a `storage` folder and `g.grnd`, generated from `preset` at `scale` (seed 1).
fn generated(preset: &str, scale: &str) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("storage")).unwrap();
    let g = dir.path().join("g.grnd").to_string_lossy().into_owned();
    let o = grinnder(&["-q", "generate", "--preset", preset, "--scale", scale, "--seed", "1", "--out", &g]);
    assert!(o.status.success(), "{}", stderr(&o));
    (dir, g)
}

/// The least host budget a refusal names ("needs at least N MiB").
fn least_budget(err: &str) -> u64 {
    err.split("needs at least ")
        .nth(1)
        .and_then(|t| t.split(" MiB").next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no minimum in {err}"))
}

#[test]
fn train_with_partitions_and_a_storage_tier_matches_in_memory_training() {
    let dir = tempfile::tempdir().unwrap();
    let storage = dir.path().join("blocks");
    std::fs::create_dir(&storage).unwrap();
    let run = |extra: &[&str], name: &str| {
        let metrics = dir.path().join(name);
        let mut args = vec!["-q", "train", "--epochs", "4", "--model", "sage", "--metrics-out"];
        args.push(metrics.to_str().unwrap());
        args.extend_from_slice(extra);
        let o = Command::new(env!("CARGO_BIN_EXE_grinnder"))
            .args(&args)
            .env("XDG_CACHE_HOME", dir.path())
            .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."))
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
        losses(&metrics)
    };
    let whole = run(&[], "whole.jsonl");
    let parts = run(&["--parts", "3", "--partitioner", "lpa"], "parts.jsonl");
    let tiered = run(
        &[
            "--parts",
            "5",
            "--block-cache",
            "0",
            "--storage-dir",
            storage.to_str().unwrap(),
            "--cache-mode",
            "lru_layer",
        ],
        "tiered.jsonl",
    );
    assert_eq!(whole.len(), 4);
    for other in [&parts, &tiered] {
        for (a, b) in other.iter().zip(&whole) {
            assert!((a - b).abs() <= 1e-5 * b, "loss {a} vs whole-graph {b}");
        }
    }
    assert_eq!(std::fs::read_dir(&storage).unwrap().count(), 0, "block files removed at the end");
    // refused before the first epoch, with the reason
    let o = grinnder(&["-q", "train", "--parts", "2", "--storage-dir", "/no/such/dir"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("/no/such/dir"), "{}", stderr(&o));
    let o = grinnder(&["-q", "train", "--epochs", "1", "--parts", "2", "--block-cache", "1"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--storage-dir"), "{}", stderr(&o));
    let o = grinnder(&["-q", "train", "--epochs", "1", "--parts", "2", "--host-mem", "1"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("too small") && stderr(&o).contains("needs at least"), "{}", stderr(&o));
}

/// Under a host budget, layer 0's `Â x` is built a piece of columns at a time where a
/// partition's input rows exceed a piece (`GRINNDER_INPUT_PIECE_BYTES`, 32 MiB by default:
/// here 20 kB, three of Cora's rows): the losses are those of the whole graph in memory.
#[test]
fn the_first_aggregation_built_in_pieces_gives_the_in_memory_losses() {
    let dir = tempfile::tempdir().unwrap();
    let storage = dir.path().join("blocks");
    std::fs::create_dir(&storage).unwrap();
    let run = |extra: &[&str], pieces: Option<&str>, name: &str| {
        let metrics = dir.path().join(name);
        let mut args = vec!["-q", "train", "--epochs", "3", "--dropout", "0", "--metrics-out"];
        args.push(metrics.to_str().unwrap());
        args.extend_from_slice(extra);
        let mut c = Command::new(env!("CARGO_BIN_EXE_grinnder"));
        c.args(&args).env("XDG_CACHE_HOME", dir.path());
        if let Some(p) = pieces {
            c.env("GRINNDER_INPUT_PIECE_BYTES", p);
        }
        let o = c.current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")).output().unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
        losses(&metrics)
    };
    let whole = run(&[], None, "whole.jsonl");
    let budget = ["--parts", "4", "--host-mem", "512MiB", "--storage-dir", storage.to_str().unwrap()];
    let pieces = run(&budget, Some("20000"), "pieces.jsonl");
    assert_eq!(whole.len(), 3);
    for (a, b) in pieces.iter().zip(&whole) {
        assert!((a - b).abs() <= 1e-5 * b, "loss {a} in pieces vs whole-graph {b}");
    }
}

#[test]
fn every_epoch_writes_its_figures_accuracies_only_when_evaluated() {
    let dir = tempfile::tempdir().unwrap();
    let metrics = dir.path().join("m.jsonl");
    let o = grinnder(&[
        "-q",
        "train",
        "--epochs",
        "5",
        "--eval-every",
        "2",
        "--metrics-out",
        metrics.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&metrics)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 6, "five epochs and the final line");
    for (i, m) in lines[..5].iter().enumerate() {
        assert_eq!(m["epoch"], i);
        assert!(m["loss"].is_number() && m["epoch_s"].is_number());
        // epochs 1, 3 (every second) and 4 (the last) are evaluated
        assert_eq!(m.get("valid_acc").is_some(), matches!(i, 1 | 3 | 4), "epoch {i}: {m}");
    }
}

/// Budget compliance (reliability issue): a run under a small `--host-mem` spills to storage
/// and its peak resident memory (the child process's `VmHWM`) stays within the budget; a budget
/// smaller than what the process already holds is refused before training, with the minimum.
/// (The GPU's `--gpu-mem` is checked on the GPU machine: `crates/cuda/tests`.)
#[test]
fn a_small_host_budget_is_kept_and_an_impossible_one_refused() {
    let (dir, g) = generated("arxiv-like", "0.5");
    let p = |s: &str| dir.path().join(s).to_string_lossy().into_owned();
    let train = |budget: &str, metrics: &str| {
        grinnder(&[
            "-q",
            "--threads",
            "2",
            "train",
            &g,
            "--parts",
            "4",
            "--partitioner",
            "lpa",
            "--hidden",
            "128",
            "--epochs",
            "2",
            "--host-mem",
            budget,
            "--storage-dir",
            &p("storage"),
            "--metrics-out",
            &p(metrics),
        ])
    };
    // far too small: refused up front, naming the minimum
    let minimum = || {
        let o = train("1MiB", "none.jsonl");
        assert!(!o.status.success());
        let err = stderr(&o);
        assert!(
            err.contains("--host-mem") && err.contains("too small") && !err.contains("panicked"),
            "{err}"
        );
        least_budget(&err)
    };
    // the plan counts what the process holds by construction (heap in use, mapped files, and a
    // base of the anonymous memory at start-up with the mapped binary and libraries whole), not
    // a sampled RSS: identical runs give the same minimum (before 2026-12-05 its base was the
    // resident set sampled in main, which the kernel's fault-around moved: 204 then 205 MiB under
    // a loaded machine; tens of MiB apart when the plan sampled RSS)
    let min = minimum();
    let again = minimum();
    assert_eq!(min, again, "the minimum moved between identical runs");
    // the minimum and budgets over it (84,672 nodes at hidden 128: blocks of about 170 MB): the
    // run spills through storage every epoch and peak RSS stays within the budget (the bar: at
    // most 10 % over it, for every budget accepted; before 2026-12-01 this graph went 11 % over
    // at 1.2 times the minimum, the allocator's kept pages uncounted)
    // exactly the least budget named (refused at it once, "needs at least 205 MiB" after 204,
    // 2026-12-03, when the base moved)
    let least = min << 20;
    for (i, budget) in [least, least * 11 / 10, least * 12 / 10].into_iter().enumerate() {
        let metrics = format!("m{i}.jsonl");
        let o = train(&format!("{budget}B"), &metrics);
        assert!(o.status.success(), "{}", stderr(&o));
        let lines: Vec<serde_json::Value> = std::fs::read_to_string(p(&metrics))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let epochs = &lines[..lines.len() - 1];
        let io = |m: &serde_json::Value, k: &str| m[k].as_u64().unwrap();
        assert!(io(&epochs[0], "storage_write_bytes") > 0, "it spilled: {epochs:?}");
        assert!(
            epochs.iter().all(|m| io(m, "storage_write_bytes") + io(m, "storage_read_bytes") > 0),
            "storage every epoch: {epochs:?}"
        );
        let peak = lines.last().unwrap()["peak_host_bytes"].as_u64().unwrap();
        assert!(peak > 0, "peak RSS is measured");
        assert!(
            peak * 10 <= budget * 11,
            "peak RSS {} MiB over the {} MiB budget by more than 10 %",
            peak >> 20,
            budget >> 20
        );
        eprintln!("budget {} MiB, peak RSS {} MiB", budget >> 20, peak >> 20);
    }
}

/// Features larger than the host budget (issue 28): igb-medium-like at scale 0.004 carries
/// 156 MiB of 1024-wide features (at 0.003 and 16 parts the least budget came within 0-5 MiB of
/// its 117 MiB, too close to say anything); the plan counts the piece a read holds, not the file, so the
/// least budget is below the features; at it, peak RSS stays within 10 % of the budget and the
/// losses are those of the run without a budget.
#[test]
fn features_larger_than_the_host_budget_train_within_it() {
    let (dir, g) = generated("igb-medium-like", "0.004");
    let p = |s: &str| dir.path().join(s).to_string_lossy().into_owned();
    let features_mib = (40_000 * 1024 * 4) >> 20;
    let train = |budget: Option<&str>, metrics: &str| {
        let mut args = vec!["-q", "--threads", "2", "train"];
        let m = p(metrics);
        args.extend([
            g.as_str(),
            "--hidden",
            "32",
            "--feature-norm",
            "none",
            "--dropout",
            "0",
            "--epochs",
            "2",
        ]);
        args.extend(["--metrics-out", m.as_str()]);
        let storage = p("storage");
        if let Some(b) = budget {
            args.extend([
                "--parts",
                "32",
                "--partitioner",
                "lpa",
                "--host-mem",
                b,
                "--storage-dir",
                &storage,
            ]);
        }
        let o = Command::new(env!("CARGO_BIN_EXE_grinnder"))
            .args(&args)
            .env("GRINNDER_INPUT_PIECE_BYTES", "4194304")
            .env("XDG_CACHE_HOME", dir.path())
            .output()
            .unwrap();
        (o, m)
    };
    let (o, _) = train(Some("1MiB"), "none.jsonl");
    let err = stderr(&o);
    let min: u64 = least_budget(&err);
    assert!(min < features_mib, "the least budget {min} MiB is not below the {features_mib} MiB of features");
    let (o, budgeted) = train(Some(&format!("{min}MiB")), "budget.jsonl");
    assert!(o.status.success(), "{}", stderr(&o));
    let (o, whole) = train(None, "whole.jsonl");
    assert!(o.status.success(), "{}", stderr(&o));
    let (a, b) = (losses(Path::new(&budgeted)), losses(Path::new(&whole)));
    assert_eq!(a.len(), 2);
    for (x, y) in a.iter().zip(&b) {
        assert!((x - y).abs() <= 1e-5 * y, "loss {x} under the budget vs {y} without");
    }
    let last: serde_json::Value =
        serde_json::from_str(std::fs::read_to_string(&budgeted).unwrap().lines().last().unwrap()).unwrap();
    let peak = last["peak_host_bytes"].as_u64().unwrap();
    assert!(
        peak * 10 <= (min << 20) * 11,
        "peak RSS {} MiB over the {min} MiB budget by more than 10 %",
        peak >> 20
    );
    eprintln!("features {features_mib} MiB, budget {min} MiB, peak RSS {} MiB", peak >> 20);
}

/// The plan's host working set holds what a partition's phases really hold: with
/// `--block-cache 0` the store keeps only blocks in use, so the heap's growth within a phase
/// (the counting allocator's, logged at debug level) is the working set; it stays within the
/// plan's for layer 0 on `Â x` (fused into layer 1), split layers (SAGE's root term), GIN's
/// multi-layer perceptron and three layers.
#[test]
fn the_host_working_set_holds_what_the_phases_hold() {
    let (dir, g) = generated("arxiv-like", "0.15");
    let storage = dir.path().join("storage").to_string_lossy().into_owned();
    for (model, layers, extra) in [
        ("gcn", "2", &["--dropout", "0", "--input-dropout", "0"][..]),
        ("sage", "2", &[][..]),
        ("gin", "3", &[][..]),
    ] {
        let mut args = vec!["--threads", "2", "train", g.as_str(), "--model", model, "--layers", layers];
        args.extend(["--hidden", "128", "--parts", "4", "--epochs", "2", "--feature-norm", "none"]);
        args.extend(["--storage-dir", storage.as_str(), "--block-cache", "0", "--host-mem", "16GiB"]);
        args.extend(extra);
        let o = Command::new(env!("CARGO_BIN_EXE_grinnder"))
            .args(&args)
            .env("RUST_LOG", "grinnder_engine=debug")
            .env("NO_COLOR", "1")
            .env("XDG_CACHE_HOME", dir.path())
            .output()
            .unwrap();
        let err = stderr(&o);
        assert!(o.status.success(), "{err}");
        // the second epoch's: the first also makes structures kept for the run
        let line = err
            .lines()
            .find(|l| l.contains("epoch 1: the largest working set measured"))
            .unwrap_or_else(|| panic!("{model}: no measured working set in {err}"));
        let mib = |after: &str| -> f64 {
            line.split(after).nth(1).and_then(|t| t.split(" MiB").next()).unwrap().trim().parse().unwrap()
        };
        let (measured, plan) = (mib("measured "), mib("the plan's "));
        assert!(measured > 0.0 && measured <= plan, "{model}, {layers} layers: {line}");
        eprintln!("{model}, {layers} layers: measured {measured} MiB, plan {plan} MiB");
    }
}

/// Flags as a PyG user types them: model and optimizer names in any case (GraphSAGE too),
/// boolean flags as switches that also take `=true`/`=false`, a negative number where a number
/// goes (refused by the check, not by the parser).
#[test]
fn flags_are_taken_as_a_user_types_them() {
    for args in [
        &["train", "--model", "GCN", "--optimizer", "Adam", "--residual", "--epochs", "1"][..],
        &["train", "--model", "GraphSAGE", "--residual=false", "--train-eps=true", "--epochs", "1"][..],
    ] {
        let o = grinnder(args);
        assert!(o.status.success(), "{args:?}: {}", stderr(&o));
    }
    let o = grinnder(&["train", "--lr", "-0.01", "--epochs", "1"]);
    assert!(!o.status.success() && stderr(&o).contains("--lr must be positive, got -0.01"), "{}", stderr(&o));
    let o = grinnder(&["train", "--residual", "yes"]);
    assert!(!o.status.success(), "a switch takes no separate value");
}

/// Off a terminal (a batch job's log) every epoch is a plain line, without colour codes; the
/// start-up line says the settings as flags spell them, the feature normalisation included
/// (row on the citation graphs, none on others); `-q` prints none, `--log-every 2` every
/// second.
#[test]
fn a_batch_job_log_gets_a_plain_line_per_epoch() {
    let o = grinnder(&["train", "--epochs", "3"]);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(!err.contains('\x1b'), "no colour codes off a terminal: {err:?}");
    assert!(err.contains("gcn 2 layers") && err.contains("adam lr=0.01 weight_decay=0.0005"), "{err}");
    assert!(err.contains("feature norm row"), "{err}");
    let epochs: Vec<&str> = err.lines().filter(|l| l.contains("epoch ") && l.contains(": loss ")).collect();
    assert_eq!(epochs.len(), 3, "{err}");
    assert!(epochs[2].contains("epoch 2: loss ") && epochs[2].contains("accuracy train "), "{err}");
    let o = grinnder(&["train", "--epochs", "4", "--log-every", "2"]);
    let n = stderr(&o).lines().filter(|l| l.contains(": loss ")).count();
    assert_eq!(n, 2, "{}", stderr(&o));
    let o = grinnder(&["-q", "train", "--epochs", "2"]);
    assert!(!stderr(&o).contains(": loss "), "{}", stderr(&o));
    let (_dir, g) = generated("arxiv-like", "0.02");
    let o = grinnder(&["train", g.as_str(), "--epochs", "1"]);
    assert!(stderr(&o).contains("feature norm none"), "{}", stderr(&o));
}

#[test]
fn minibatch_training_reports_like_full_graph_training() {
    let dir = tempfile::tempdir().unwrap();
    let metrics = dir.path().join("m.jsonl");
    let o = grinnder(&[
        "-q",
        "train",
        "--model",
        "sage",
        "--mode",
        "minibatch",
        "--fanout",
        "10,-1",
        "--batch-size",
        "32",
        "--epochs",
        "3",
        "--parts",
        "2",
        "--metrics-out",
        metrics.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("test accuracy"), "{}", stdout(&o));
    let lines = std::fs::read_to_string(&metrics).unwrap();
    assert_eq!(lines.lines().count(), 4, "three epochs and the final line");
    // ShaDow k-hop subgraphs: any number of hops
    let o = grinnder(&[
        "-q",
        "train",
        "--mode",
        "minibatch",
        "--sampler",
        "khop",
        "--fanout",
        "5",
        "--batch-size",
        "64",
        "--epochs",
        "2",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("test accuracy"), "{}", stdout(&o));
    // benchmarks: a few batches per epoch, no evaluation
    let o = grinnder(&[
        "-q",
        "train",
        "--mode",
        "minibatch",
        "--max-batches",
        "2",
        "--epochs",
        "2",
        "--eval-every",
        "0",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("not evaluated"), "{}", stdout(&o));
    for (args, want) in [
        (&["train", "--sampler", "khop"][..], "for --mode minibatch"),
        (&["train", "--max-batches", "3"][..], "for --mode minibatch"),
        (&["train", "--mode", "minibatch", "--fanout", "5"][..], "1 numbers for 2 layers"),
        (&["train", "--mode", "minibatch", "--fanout", "5,0"][..], "positive, or -1"),
        (&["train", "--fanout", "5,5"][..], "for --mode minibatch"),
        (&["train", "--mode", "minibatch", "--host-mem", "1GiB"][..], "apply to full-graph training"),
        (&["train", "--mode", "minibatch", "--feature-access", "zero-copy"][..], "needs --device cuda"),
    ] {
        let o = grinnder(args);
        assert!(!o.status.success(), "{args:?}");
        assert!(stderr(&o).contains(want), "{args:?}: {}", stderr(&o));
    }
}

#[test]
fn server_share_flags_are_checked() {
    for (args, want) in [
        (&["train", "--preload-hops", "2"][..], "need --expansion preload or eas"),
        (&["train", "--expansion", "preload", "--preload-hops", "auto"][..], "needs --host-mem or --gpu-mem"),
        (&["train", "--expansion", "preload", "--eas-fanout", "3"][..], "are for --expansion eas"),
        (&["train", "--expansion", "eas", "--preload-hops", "1"][..], "is for --expansion preload"),
        (&["train", "--expansion", "eas", "--eas-hops", "0"][..], "at least 1"),
        (&["train", "--expansion", "eas"][..], "start several ranks with mpirun"),
        (&["train", "--transport", "nccl"][..], "--transport nccl needs --device cuda"),
    ] {
        let o = grinnder(args);
        assert!(!o.status.success(), "{args:?}");
        assert!(stderr(&o).contains(want), "{args:?}: {}", stderr(&o));
    }
}

#[test]
fn plot_scaling_draws_speed_ups_from_metrics_files() {
    let dir = tempfile::tempdir().unwrap();
    let path = |name: &str| dir.path().join(name).to_str().unwrap().to_string();
    // two real one-epoch runs give the metrics files their shape
    for name in ["one", "two"] {
        let o = grinnder(&["-q", "train", "--epochs", "1", "--metrics-out", &path(&format!("{name}.jsonl"))]);
        assert!(o.status.success(), "{}", stderr(&o));
    }
    let png = path("scaling.png");
    let runs = [format!("gcn:1={}", path("one.jsonl")), format!("gcn:2={}", path("two.jsonl"))];
    let o = grinnder(&["plot-scaling", &runs[0], &runs[1], "--out", &png]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("gcn on 2:"), "{}", stdout(&o));
    let bytes = std::fs::read(&png).unwrap();
    assert!(bytes.starts_with(b"\x89PNG"), "a PNG");
    for (args, want) in [
        (vec![runs[1].clone()], "has no one-GPU run"),
        (vec!["gcn2".to_string()], "expected SERIES:GPUS=METRICS"),
        (vec![format!("gcn:1={}", path("missing.jsonl"))], "cannot read"),
    ] {
        let mut a = vec!["plot-scaling".to_string()];
        a.extend(args);
        a.extend(["--out".to_string(), path("x.png")]);
        let o = grinnder(&a.iter().map(String::as_str).collect::<Vec<_>>());
        assert!(!o.status.success(), "{a:?}");
        assert!(stderr(&o).contains(want), "{a:?}: {}", stderr(&o));
    }
}

#[test]
fn a_partitioning_cached_on_another_machine_is_read_by_train_and_predict() {
    let tmp = tempfile::tempdir().unwrap();
    let p = |n: &str| tmp.path().join(n).to_string_lossy().into_owned();
    let o = grinnder(&[
        "-q",
        "generate",
        "--preset",
        "arxiv-like",
        "--scale",
        "0.05",
        "--seed",
        "0",
        "--out",
        &p("a.grnd"),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    // "the big machine": partitioned into its own cache directory
    let o = grinnder(&["partition", &p("a.grnd"), "--parts", "4", "--json", "--cache-dir", &p("made")]);
    assert!(o.status.success(), "{}", stderr(&o));
    let row: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    assert_eq!(row["cached"], false);
    // "the other machine": the dataset and the cache copied to other paths
    std::fs::create_dir(p("there")).unwrap();
    std::fs::copy(p("a.grnd"), p("there/b.grnd")).unwrap();
    std::fs::create_dir(p("moved")).unwrap();
    for e in std::fs::read_dir(p("made")).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), tmp.path().join("moved").join(e.file_name())).unwrap();
    }
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_grinnder"))
            .args(args)
            .env("XDG_CACHE_HOME", p("default"))
            .output()
            .expect("the binary runs")
    };
    let model = p("m.safetensors");
    let o = run(&[
        "train",
        &p("there/b.grnd"),
        "--parts",
        "4",
        "--cache-dir",
        &p("moved"),
        "--epochs",
        "1",
        "--save-model",
        &model,
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(&format!("partitioning read from the cache: {}", p("moved"))),
        "{}",
        stderr(&o)
    );
    let o = run(&[
        "predict",
        &p("there/b.grnd"),
        "--model-file",
        &model,
        "--parts",
        "4",
        "--cache-dir",
        &p("moved"),
        "--out",
        &p("y.npy"),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("partitioning read from the cache"), "{}", stderr(&o));
    assert!(!tmp.path().join("default").exists(), "the default cache directory is not used");
}

#[test]
fn sizes_parse_as_the_flags_take_them() {
    use grinnder_cli::args::parse_bytes;
    assert_eq!(parse_bytes("8GiB"), Ok(8 << 30));
    assert_eq!(parse_bytes("512MiB"), Ok(512 << 20));
    assert_eq!(parse_bytes("1.5GB"), Ok(1_500_000_000));
    assert_eq!(parse_bytes("100"), Ok(100));
    assert!(parse_bytes("lots").is_err());
    assert!(parse_bytes("3 parsecs").is_err());
}

/// `info` with train's tiered settings: the plan made as train makes it, the blocks per tier,
/// an epoch's traffic and, with rates measured by `bench rates`, its predicted time; `train`
/// logs the prediction against its second epoch.
#[test]
fn info_with_parts_plans_the_run_and_predicts_its_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let p = |s: &str| dir.path().join(s).to_string_lossy().into_owned();
    std::fs::create_dir(p("st")).unwrap();
    let o = grinnder(&[
        "bench",
        "--device",
        "cpu",
        "rates",
        "--storage-dir",
        &p("st"),
        "--out",
        &p("rates.json"),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let rates: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(p("rates.json")).unwrap()).unwrap();
    assert!(
        rates["gemm_flops_per_s"].as_f64().unwrap() > 0.0
            && rates["storage_read_bytes_per_s"].as_f64().unwrap() > 0.0
    );
    let flags = [
        "--hidden",
        "32",
        "--parts",
        "4",
        "--block-cache",
        "2MiB",
        "--storage-dir",
        &p("st"),
        "--rates",
        &p("rates.json"),
    ];
    // with input dropout, the features are blocks read whole (without, layer 0 runs on `Â·x`: below)
    let o = grinnder(&[&["info", "--json", "--input-dropout", "0.5"][..], &flags].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    let t = &v["tiered"];
    assert_eq!(t["parts"], 4);
    let blocks: u64 = t["blocks"].as_array().unwrap().iter().map(|g| g["bytes"].as_u64().unwrap()).sum();
    assert!(blocks > 2 << 20, "the blocks outgrow the 2 MiB cache: {blocks}");
    let traffic = &t["prediction"]["traffic"];
    assert!(traffic["storage_read_bytes"].as_u64().unwrap() > 0, "{traffic}");
    let s = &t["prediction"]["seconds"];
    assert!(s["epoch_s"].as_f64().unwrap() > 0.0 && s["storage_s"].as_f64().unwrap() > 0.0, "{s}");
    // an evaluation: a forward pass, less than the epoch's forward and backward
    let e = t["prediction"]["evaluation_s"].as_f64().unwrap();
    assert!(e > 0.0 && e < s["epoch_s"].as_f64().unwrap(), "evaluation {e} s, epoch {s}");
    // the setup: the phases info ran, and the first blocks (the features read and kept)
    let phases: Vec<&str> = t["setup"].as_array().unwrap().iter().map(|p| p[0].as_str().unwrap()).collect();
    assert!(phases.contains(&"partitioning (4 parts)") && phases.contains(&"partition graphs"), "{phases:?}");
    let features = (v["nodes"].as_u64().unwrap() * v["features"].as_u64().unwrap() * 4) as f64;
    let fb = &t["first_blocks"];
    assert_eq!(fb["read_bytes"].as_f64().unwrap(), features, "{fb}");
    let kept =
        ["device_bytes", "pinned_bytes", "stored_bytes"].map(|k| fb[k].as_f64().unwrap()).iter().sum::<f64>();
    assert_eq!(kept, features, "the feature blocks: {fb}");
    let fs = &fb["seconds"];
    assert!(
        fs["total_s"].as_f64().unwrap() >= fs["read_s"].as_f64().unwrap()
            && fs["read_s"].as_f64().unwrap() > 0.0
    );
    let o = grinnder(&[&["info"][..], &flags].concat());
    assert!(
        stdout(&o).contains("predicted      ")
            && stdout(&o).contains("first blocks   predicted")
            && stdout(&o).contains("evaluation     "),
        "{}",
        stdout(&o)
    );
    // layer 0 from `Â·x` (no input dropout, the default): every partition's own and halo rows are read once
    let o = grinnder(&[&["info", "--json"][..], &flags].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let w: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    // what --input-dropout 0 saves, predicted beside the run with input dropout: that run's
    // traffic, less of it
    let without = &t["without_input_dropout"]["traffic"];
    assert_eq!(without, &w["tiered"]["prediction"]["traffic"], "{without}");
    let read = |t: &serde_json::Value| t["storage_read_bytes"].as_u64().unwrap();
    assert!(read(without) < read(traffic), "{without} against {traffic}");
    assert!(w["tiered"].get("without_input_dropout").is_none(), "no input dropout, nothing to save");
    let o = grinnder(&[&["info", "--input-dropout", "0.5"][..], &flags].concat());
    assert!(
        stdout(&o).contains("with --input-dropout 0 (layer 0 on its aggregation computed once)"),
        "{}",
        stdout(&o)
    );
    let o = grinnder(&["-q", "partition", "--parts", "4", "--json", "--cache-dir", &p("cache")]);
    assert!(o.status.success(), "{}", stderr(&o));
    let halo = serde_json::from_str::<serde_json::Value>(stdout(&o).trim()).unwrap()["halo_volume"]
        .as_f64()
        .unwrap();
    let fb = &w["tiered"]["first_blocks"];
    let row = (v["features"].as_u64().unwrap() * 4) as f64;
    assert_eq!(fb["read_bytes"].as_f64().unwrap(), features + halo * row, "{fb}");
    assert!(fb["aggregate_entry_columns"].as_u64().unwrap() > 0, "{fb}");
    let pre: u64 = w["tiered"]["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|g| g["kind"] == "Pre")
        .map(|g| g["bytes"].as_u64().unwrap())
        .sum();
    let kept =
        ["device_bytes", "pinned_bytes", "stored_bytes"].map(|k| fb[k].as_u64().unwrap()).iter().sum::<u64>();
    assert_eq!(
        (kept, pre),
        (features as u64, features as u64),
        "`Â·x` is kept, as wide as the features: {fb}"
    );
    let o = grinnder(&[&["-v", "train", "--epochs", "2"][..], &flags].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains("the cost model predicted"), "{err}");
    assert!(err.lines().any(|l| l.contains("evaluation") && l.contains("the cost model predicted")), "{err}");
    // the traffic the model predicted is what the epoch moved
    let line = err.lines().find(|l| l.contains("predicted / measured MiB")).expect("the traffic line");
    for pair in line.split(", ").filter_map(|f| f.rsplit(' ').nth(2).zip(f.rsplit(' ').next())) {
        assert_eq!(pair.0, pair.1, "{line}");
    }
}
