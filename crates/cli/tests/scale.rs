//! Training at the size of the machine: features stored narrow (float16, bfloat16) train as the
//! same values stored as float32.

use std::path::Path;
use std::process::{Command, Output};

fn grinnder(args: &[&str], cache: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_grinnder"))
        .args(args)
        .env("XDG_CACHE_HOME", cache)
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."))
        .output()
        .expect("the binary runs")
}

fn ok(o: Output, args: &[&str]) -> Output {
    assert!(o.status.success(), "grinnder {args:?} failed: {}", String::from_utf8_lossy(&o.stderr));
    o
}

/// The per-epoch training losses of a metrics file.
fn losses(metrics: &Path) -> Vec<f64> {
    std::fs::read_to_string(metrics)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter_map(|m| m.get("epoch").is_some().then(|| m["loss"].as_f64().unwrap()))
        .collect()
}

#[test]
fn features_stored_narrow_train_as_the_same_values_stored_as_f32() {
    let dir = tempfile::tempdir().unwrap();
    let d = |s: &str| dir.path().join(s).to_string_lossy().into_owned();
    let run = |args: &[&str]| ok(grinnder(args, dir.path()), args);
    let gen = |dtype: &str, format: &str, out: &str| {
        run(&[
            "-q",
            "generate",
            "--preset",
            "arxiv-like",
            "--scale",
            "0.01",
            "--seed",
            "5",
            "--feature-dtype",
            dtype,
            "--format",
            format,
            "--out",
            out,
        ])
    };
    gen("f16", "native", &d("g16.grnd"));
    gen("bf16", "native", &d("gb16.grnd"));
    gen("f16", "npy", &d("g16_npy"));
    gen("f32", "native", &d("g32.grnd"));
    // the same (rounded) values widened to float32
    run(&["-q", "convert", &d("g16.grnd"), "--feature-dtype", "f32", "--out", &d("g16_as_f32.grnd")]);
    run(&["-q", "convert", &d("gb16.grnd"), "--feature-dtype", "f32", "--out", &d("gb16_as_f32.grnd")]);
    let size = |p: &str| std::fs::metadata(p).unwrap().len();
    let feature_bytes = 1693 * 128 * 2;
    assert!(size(&d("g16.grnd")) + feature_bytes <= size(&d("g32.grnd")), "f16 features take half");
    assert_eq!(size(&d("g16.grnd")), size(&d("gb16.grnd")));
    let info = String::from_utf8_lossy(&run(&["info", &d("g16.grnd")]).stdout).into_owned();
    assert!(info.contains("f16"), "info names the stored type:\n{info}");

    let train = |data: &str, extra: &[&str], name: &str| {
        let metrics = d(name);
        let mut args =
            vec!["-q", "train", data, "--epochs", "3", "--hidden", "32", "--metrics-out", &metrics];
        args.extend_from_slice(extra);
        run(&args);
        losses(Path::new(&metrics))
    };
    let storage = d("blocks");
    std::fs::create_dir(&storage).unwrap();
    let tiered: &[&str] = &["--parts", "3", "--block-cache", "0", "--storage-dir", &storage];
    for (narrow, wide) in
        [("g16.grnd", "g16_as_f32.grnd"), ("gb16.grnd", "gb16_as_f32.grnd"), ("g16_npy", "g16_as_f32.grnd")]
    {
        for (extra, what) in
            [(&[][..], "memory"), (tiered, "tiered"), (&["--feature-norm", "row"][..], "row")]
        {
            let a = train(&d(narrow), extra, &format!("{narrow}-{what}.jsonl"));
            let b = train(&d(wide), extra, &format!("{wide}-{what}.jsonl"));
            assert_eq!(a.len(), 3);
            for (x, y) in a.iter().zip(&b) {
                assert!((x - y).abs() <= 1e-6 * y.abs(), "{narrow} {what}: loss {x} against {y} from {wide}");
            }
        }
    }
    // rounding to f16 changes the values: the f32 graph trains otherwise (the test can fail)
    let a = train(&d("g32.grnd"), &[], "g32.jsonl");
    let b = train(&d("g16_as_f32.grnd"), &[], "g16w.jsonl");
    assert!(a.iter().zip(&b).any(|(x, y)| x != y), "rounded features gave identical losses");
}

/// A memory control group of `limit` bytes this test may run a process in (cgroup v1's memory
/// hierarchy, or v2's), removed when dropped; `None` where none can be made (not root, no
/// writable hierarchy).
struct Cgroup(std::path::PathBuf);

impl Cgroup {
    fn new(name: &str, limit: u64) -> Option<Cgroup> {
        let v1 = Path::new("/sys/fs/cgroup/memory");
        let (dir, file) = if v1.join("memory.limit_in_bytes").exists() {
            (v1.join(name), "memory.limit_in_bytes")
        } else {
            (Path::new("/sys/fs/cgroup").join(name), "memory.max")
        };
        std::fs::create_dir(&dir).ok()?;
        let g = Cgroup(dir);
        std::fs::write(g.0.join(file), limit.to_string()).ok()?;
        Some(g)
    }

    /// `grinnder args` run inside the group (the shell joins it, then becomes grinnder). The
    /// binary's and the graph's pages leave the page cache first: pages cached by runs outside
    /// the group stay charged to them, so that the group's limit would not bound them while the
    /// process's resident set counts them (a run once peaked 5 MiB past the limit so; uncached,
    /// four runs peaked 3–30 MiB below it, the shared libraries the only pages charged elsewhere).
    fn run(&self, args: &[&str], cache: &Path) -> Output {
        uncache(Path::new(env!("CARGO_BIN_EXE_grinnder")));
        args.iter().map(Path::new).filter(|p| p.extension().is_some_and(|e| e == "grnd")).for_each(uncache);
        let procs = self.0.join("cgroup.procs");
        Command::new("sh")
            .arg("-c")
            .arg(format!("echo $$ > {} && exec \"$0\" \"$@\"", procs.display()))
            .arg(env!("CARGO_BIN_EXE_grinnder"))
            .args(args)
            .env("XDG_CACHE_HOME", cache)
            .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."))
            .output()
            .expect("the binary runs")
    }
}

/// Drops `path`'s pages from the page cache (written back first; `POSIX_FADV_DONTNEED`).
fn uncache(path: &Path) {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(path).expect("the file to uncache");
    f.sync_data().expect("written back");
    // SAFETY: a valid descriptor, the whole file (length 0), advice only
    let r = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    assert_eq!(r, 0, "posix_fadvise on {}", path.display());
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// The peak resident set a metrics file's summary reports.
fn peak_host_bytes(metrics: &Path) -> u64 {
    let text = std::fs::read_to_string(metrics).unwrap();
    let last: serde_json::Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    last["peak_host_bytes"].as_u64().unwrap()
}

#[test]
fn with_no_flags_a_graph_larger_than_the_machine_is_partitioned_to_fit_it() {
    let dir = tempfile::tempdir().unwrap();
    let d = |s: &str| dir.path().join(s).to_string_lossy().into_owned();
    let run = |args: &[&str]| ok(grinnder(args, dir.path()), args);
    let g = d("g.grnd");
    run(&["-q", "generate", "--preset", "igb-medium-like", "--scale", "0.005", "--seed", "1", "--out", &g]);
    // the whole graph in memory, as the planner chooses on this machine: its peak
    let whole = d("whole.jsonl");
    let model = d("m.safetensors");
    let o = run(&["train", &g, "--epochs", "2", "--metrics-out", &whole, "--save-model", &model]);
    let log = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(log.contains("the whole graph in host memory"), "{log}");
    let peak = peak_host_bytes(Path::new(&whole));
    // a machine with 60 % of that memory
    let limit = peak * 6 / 10;
    let name = format!("grinnder-test-{}", std::process::id());
    let Some(cg) = Cgroup::new(&name, limit) else {
        eprintln!(
            "SKIPPED: no memory control group can be made here (root and a writable cgroup hierarchy needed)"
        );
        return;
    };
    let info = cg.run(&["info", &g], dir.path());
    let text = String::from_utf8_lossy(&info.stdout).into_owned();
    assert!(info.status.success(), "{}", String::from_utf8_lossy(&info.stderr));
    assert!(text.contains("partitions; why:") && text.contains("control-group limit"), "{text}");
    let parts = d("parts.jsonl");
    let o = cg.run(&["train", &g, "--epochs", "2", "--metrics-out", &parts], dir.path());
    let log = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "{log}");
    assert!(log.contains("plan: ") && log.contains("partitions"), "{log}");
    let within = peak_host_bytes(Path::new(&parts));
    assert!(within < limit, "peak {within} bytes past the machine's {limit}");
    // partitioned, the same training (exact for any partitioning, dropout included)
    for (a, b) in losses(Path::new(&parts)).iter().zip(&losses(Path::new(&whole))) {
        assert!((a - b).abs() <= 1e-5 * b.abs(), "loss {a} against the whole graph's {b}");
    }
    // predict with no flags: the whole graph outside the group, partitioned within it (its
    // inference needs less than training, so the group is made tighter for it), the same logits
    let (free, tight) = (d("free"), d("tight"));
    let o = run(&["predict", &g, "--model-file", &model, "--out", &free]);
    let log = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(log.contains("the whole graph in host memory"), "{log}");
    let inner = Cgroup::new(&format!("{name}-predict"), limit / 2).expect("a second group");
    let o = inner.run(&["predict", &g, "--model-file", &model, "--out", &tight], dir.path());
    let log = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "{:?}: {log}", o.status);
    assert!(log.contains("plan: ") && log.contains("partitions"), "{log}");
    let logits = |dir: &str| {
        let a = grinnder_graph::io::npy::Npy::open(&Path::new(dir).join("logits.npy")).unwrap();
        a.to_f32().unwrap().to_vec()
    };
    let (want, got) = (logits(&free), logits(&tight));
    assert_eq!(want.len(), got.len());
    for (a, b) in got.iter().zip(&want) {
        assert!((a - b).abs() <= 1e-4 * (1.0 + b.abs()), "logit {a} against the whole graph's {b}");
    }
}
