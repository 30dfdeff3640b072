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
}
