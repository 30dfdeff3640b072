//! Bad input gets a clear error naming the file and the line or byte offset; never a panic,
//! never silently wrong data.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::common::*;
use grinnder_graph::io::{self, exchange, native, ogb, Format, LoadOptions};
use grinnder_graph::NonFinite;

fn gz(path: &Path, text: &str) {
    let f = std::fs::File::create(path).unwrap();
    let mut e = flate2::write::GzEncoder::new(f, flate2::Compression::fast());
    e.write_all(text.as_bytes()).unwrap();
    e.finish().unwrap();
}

/// A valid 4-node OGB folder; `edit` may overwrite any file before loading.
fn ogb_case(edit: impl FnOnce(&Path)) -> (tempfile::TempDir, Result<grinnder_graph::Dataset, String>) {
    let dir = tempfile::tempdir().unwrap();
    let raw = dir.path().join("raw");
    let split = dir.path().join("split/s");
    std::fs::create_dir_all(&raw).unwrap();
    std::fs::create_dir_all(&split).unwrap();
    gz(&raw.join("edge.csv.gz"), "0,1\n1,2\n2,3\n");
    gz(&raw.join("num-node-list.csv.gz"), "4\n");
    gz(&raw.join("num-edge-list.csv.gz"), "3\n");
    gz(&raw.join("node-feat.csv.gz"), "0.5,1\n1,2\n-3,4e-2\n5,6\n");
    gz(&raw.join("node-label.csv.gz"), "0\n1\nnan\n1\n");
    gz(&split.join("train.csv.gz"), "0\n1\n");
    gz(&split.join("valid.csv.gz"), "2\n");
    gz(&split.join("test.csv.gz"), "3\n");
    edit(dir.path());
    let r = io::open(dir.path(), Format::Auto, &LoadOptions::default()).map_err(|e| e.to_string());
    (dir, r)
}

#[track_caller]
fn expect_err(r: Result<grinnder_graph::Dataset, String>, parts: &[&str]) {
    let msg = r.expect_err("the input must be refused");
    for p in parts {
        assert!(msg.contains(p), "error {msg:?} should mention {p:?}");
    }
}

#[test]
fn valid_ogb_case_loads() {
    let (_d, r) = ogb_case(|_| {});
    let ds = r.unwrap();
    assert_eq!(ds.graph.num_edges(), 6);
    assert_eq!(ds.labels[2], grinnder_graph::NO_LABEL);
    assert_eq!(ds.num_classes, 2);
}

#[test]
fn ogb_errors_name_file_and_line() {
    let cases: Vec<(&str, &str, Vec<&str>)> = vec![
        ("raw/edge.csv.gz", "0,1\n1,2,3\n", vec!["edge.csv.gz:2", "expected 2 columns"]),
        ("raw/edge.csv.gz", "0,1\n1,x\n", vec!["edge.csv.gz:2", "not an integer"]),
        ("raw/edge.csv.gz", "0,1\n1,4\n2,3\n", vec!["edge.csv.gz:2", "not below the node count 4"]),
        ("raw/edge.csv.gz", "0,1\n-1,2\n2,3\n", vec!["edge.csv.gz:2", "negative"]),
        ("raw/edge.csv.gz", "0,1\n1,2\n", vec!["num-edge-list", "truncated"]),
        ("raw/node-feat.csv.gz", "0.5,1\n1,2,3\n-3,4\n5,6\n", vec!["node-feat.csv.gz:2", "3 columns"]),
        ("raw/node-feat.csv.gz", "0.5,1\n1,abc\n-3,4\n5,6\n", vec!["node-feat.csv.gz:2", "not a number"]),
        ("raw/node-feat.csv.gz", "0.5,1\n1,2\n-3,nan\n5,6\n", vec!["node-feat.csv.gz:3", "NaN"]),
        ("raw/node-feat.csv.gz", "0.5,1\n1,inf\n-3,4\n5,6\n", vec!["node-feat.csv.gz:2", "inf"]),
        ("raw/node-feat.csv.gz", "0.5,1\n1,2\n", vec!["node-feat.csv.gz", "2 feature rows for 4 nodes"]),
        ("raw/node-label.csv.gz", "0\n-2\n1\n1\n", vec!["node-label.csv.gz:2", "out of range"]),
        ("raw/node-label.csv.gz", "0\n1\n1\n", vec!["node-label.csv.gz", "3 labels for 4 nodes"]),
        ("raw/node-label.csv.gz", "0\n1.5\n1\n1\n", vec!["node-label.csv.gz:2", "not an integer"]),
        ("raw/num-node-list.csv.gz", "four\n", vec!["num-node-list.csv.gz:1", "not an integer"]),
        ("split/s/train.csv.gz", "0\n9\n", vec!["train.csv.gz:2", "not below the node count"]),
        ("split/s/train.csv.gz", "1\n0\n1\n", vec!["train.csv.gz", "train split", "duplicated"]),
    ];
    for (file, text, parts) in cases {
        let (_d, r) = ogb_case(|d| gz(&d.join(file), text));
        expect_err(r, &parts);
    }
}

#[test]
fn non_finite_features_can_be_reported_instead() {
    let dir = ogb_case(|d| gz(&d.join("raw/node-feat.csv.gz"), "0.5,1\n1,2\n-3,nan\n5,6\n")).0;
    let opts = LoadOptions { non_finite: NonFinite::Report, ..LoadOptions::default() };
    let ds = io::open(dir.path(), Format::Auto, &opts).unwrap();
    assert!(ds.features.row(2)[1].is_nan());
}

#[test]
fn missing_and_truncated_files() {
    let (_d, r) = ogb_case(|d| std::fs::remove_file(d.join("raw/node-label.csv.gz")).unwrap());
    expect_err(r, &["node-label.csv.gz", "not found"]);
    let (_d, r) = ogb_case(|d| {
        let p = d.join("raw/node-feat.csv.gz");
        let b = std::fs::read(&p).unwrap();
        std::fs::write(&p, &b[..b.len() - 6]).unwrap();
    });
    expect_err(r, &["node-feat.csv.gz", "cannot decode"]);
    let missing = PathBuf::from("/nonexistent/dataset");
    let err = io::open(&missing, Format::Auto, &LoadOptions::default()).unwrap_err().to_string();
    assert!(err.contains("/nonexistent/dataset"), "{err}");
}

/// A valid npy exchange folder of a tiny dataset; `edit` may overwrite files.
fn npy_case(edit: impl FnOnce(&Path)) -> Result<grinnder_graph::Dataset, String> {
    let dir = tempfile::tempdir().unwrap();
    exchange::save(&tiny(12, 3, 4), dir.path()).unwrap();
    edit(dir.path());
    io::open(dir.path(), Format::Auto, &LoadOptions::default()).map_err(|e| e.to_string())
}

#[test]
fn npy_errors_name_file_and_offset() {
    use grinnder_graph::io::npy::{write_array, DType};
    assert!(npy_case(|_| {}).is_ok());
    expect_err(
        npy_case(|d| write_array(&d.join("node_label.npy"), DType::I64, &[11], &[0i64; 11]).unwrap()),
        &["node_label.npy", "11 labels here, but node_feat.npy has 12 rows"],
    );
    // a feature file a row short: both files named, not the labels alone
    expect_err(
        npy_case(|d| write_array(&d.join("node_feat.npy"), DType::F32, &[11, 3], &[0f32; 33]).unwrap()),
        &["node_label.npy", "node_feat.npy has 11 rows", "one of them is cut short"],
    );
    expect_err(
        npy_case(|d| write_array(&d.join("node_feat.npy"), DType::I32, &[12, 3], &[0i32; 36]).unwrap()),
        &["node_feat.npy", "expected float32"],
    );
    expect_err(
        npy_case(|d| write_array(&d.join("train_idx.npy"), DType::I64, &[2], &[3i64, 12]).unwrap()),
        &["train_idx.npy", "entry 1: node id 12 is outside 0..12"],
    );
    expect_err(
        npy_case(|d| write_array(&d.join("edge_index.npy"), DType::I64, &[2, 2], &[0i64, 1, 12, 2]).unwrap()),
        &["edge_index.npy", "edge 0: node id 12 is outside 0..12"],
    );
    expect_err(
        npy_case(|d| write_array(&d.join("edge_index.npy"), DType::I64, &[3, 2], &[0i64; 6]).unwrap()),
        &["edge_index.npy", "[2, E]", "save its transpose"],
    );
    expect_err(
        npy_case(|d| write_array(&d.join("node_label.npy"), DType::F32, &[12], &[0.5f32; 12]).unwrap()),
        &["node_label.npy", "at byte 128", "not an integer"],
    );
    expect_err(
        npy_case(|d| {
            let p = d.join("node_feat.npy");
            let b = std::fs::read(&p).unwrap();
            std::fs::write(&p, &b[..b.len() - 1]).unwrap();
        }),
        &["node_feat.npy", "truncated"],
    );
    expect_err(
        npy_case(|d| {
            std::fs::write(d.join("node_feat.npy"), b"\x93NUMPY\x01\x00\x10\x00{'descr': '<f4'}").unwrap()
        }),
        &["node_feat.npy", "bad header"],
    );
}

#[test]
fn native_errors_name_file_and_offset() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("t.grnd");
    native::save(&tiny(30, 4, 5), &p).unwrap();
    let good = std::fs::read(&p).unwrap();
    let open = |bytes: &[u8]| {
        std::fs::write(&p, bytes).unwrap();
        native::open(&p, native::Verify::Full).map_err(|e| e.to_string())
    };
    assert!(open(&good).is_ok());
    let mut b = good.clone();
    b[0] = b'X';
    expect_err(open(&b), &["t.grnd", "at byte 0", "bad magic"]);
    let mut b = good.clone();
    b[8] = 9;
    expect_err(open(&b), &["t.grnd", "at byte 8", "version 9"]);
    let mut b = good.clone();
    b[20] ^= 1;
    expect_err(open(&b), &["t.grnd", "header checksum"]);
    let mut b = good.clone();
    let last = b.len() - 3; // inside the feature section
    b[last] ^= 0x10;
    expect_err(open(&b), &["t.grnd", "checksum mismatch in section features"]);
    expect_err(open(&good[..good.len() - 100]), &["t.grnd", "features", "truncated"]);
    expect_err(open(&good[..100]), &["t.grnd", "shorter than"]);
}

#[test]
fn detect_refuses_unknown_things() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("x.txt");
    std::fs::write(&f, "hello").unwrap();
    let e = io::open(&f, Format::Auto, &LoadOptions::default()).unwrap_err().to_string();
    assert!(e.contains("x.txt") && e.contains("not a grinnder dataset"), "{e}");
    let e = io::open(dir.path(), Format::Auto, &LoadOptions::default()).unwrap_err().to_string();
    assert!(e.contains("unrecognised dataset"), "{e}");
    let e = ogb::load(dir.path(), &LoadOptions::default()).unwrap_err().to_string();
    assert!(e.contains("not an OGB dataset folder"), "{e}");
}
