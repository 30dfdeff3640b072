//! Regression tests for the fault probe's findings on the loaders (RELIABILITY.md): each drives
//! the real path at the size and thread count where the fault appeared — a parse error in a
//! multi-block gzip file at 2 threads, a FIFO as an input, a Fortran-ordered feature file,
//! overlapping splits, a 0-d split array, a runaway CSV line.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use grinnder_graph::io::{self, npy, Format, LoadOptions};

/// The bundled Cora in the OGB layout, copied into a temporary folder.
fn cora_copy() -> (tempfile::TempDir, PathBuf) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/cora");
    let dir = tempfile::tempdir().unwrap();
    let dst = dir.path().join("cora");
    for sub in ["raw", "split/public"] {
        std::fs::create_dir_all(dst.join(sub)).unwrap();
        for e in std::fs::read_dir(src.join(sub)).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), dst.join(sub).join(e.file_name())).unwrap();
        }
    }
    (dir, dst)
}

fn gunzip(path: &Path) -> String {
    let mut s = String::new();
    flate2::read::MultiGzDecoder::new(std::fs::File::open(path).unwrap()).read_to_string(&mut s).unwrap();
    s
}

fn gzip(path: &Path, text: &str) {
    let mut e =
        flate2::write::GzEncoder::new(std::fs::File::create(path).unwrap(), flate2::Compression::best());
    e.write_all(text.as_bytes()).unwrap();
    e.finish().unwrap();
}

/// Loads `path` on a pool of `threads` threads, failing the test (instead of hanging the
/// suite) when no answer comes within a minute.
fn load_within(path: &Path, threads: usize, opts: LoadOptions) -> Result<grinnder_graph::Dataset, String> {
    let (tx, rx) = std::sync::mpsc::channel();
    let path = path.to_path_buf();
    std::thread::spawn(move || {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        let r = pool.install(|| io::open(&path, Format::Auto, &opts).map_err(|e| e.to_string()));
        let _ = tx.send(r);
    });
    rx.recv_timeout(Duration::from_secs(60)).expect("the loader hung")
}

#[test]
fn a_parse_error_in_a_many_block_gzip_file_is_reported_at_two_threads() {
    // Cora's features are about a dozen blocks: the reader runs ahead of the parsers, filling
    // the channel, when the first batch fails
    let (_d, cora) = cora_copy();
    let feat = cora.join("raw/node-feat.csv.gz");
    let text = gunzip(&feat);
    for bad in ["nan", "inf", "1e40", "0x1", "", "\u{feff}0"] {
        let mut lines: Vec<&str> = text.lines().collect();
        let first = lines[0].split_once(',').unwrap().1;
        let edited = format!("{bad},{first}");
        lines[0] = &edited;
        let edited = lines.join("\n") + "\n";
        gzip(&feat, &edited);
        // blocks are about 4× the compressed size: more than two batches of 2 × 2 blocks plus
        // the reader's own, or the reader never waits on a full channel
        let blocks = edited.len() as u64 / (4 * std::fs::metadata(&feat).unwrap().len());
        assert!(blocks > 9, "{blocks} blocks");
        let err = load_within(&cora, 2, LoadOptions::default()).expect_err("a bad feature is refused");
        assert!(err.contains("node-feat.csv.gz"), "{bad:?}: {err}");
    }
}

#[test]
fn a_line_longer_than_any_csv_row_is_refused_without_reading_it_whole() {
    let (_d, cora) = cora_copy();
    let feat = cora.join("raw/node-feat.csv.gz");
    let long = "1,".repeat((grinnder_graph::io::text::LINE_BYTES_MAX + (1 << 20)) / 2);
    gzip(&feat, &(long + "1\n"));
    let err = load_within(&cora, 2, LoadOptions::default()).expect_err("refused");
    assert!(err.contains("node-feat.csv.gz:1") && err.contains("longer than"), "{err}");
}

#[test]
fn a_fifo_as_an_input_file_is_refused_instead_of_blocking() {
    let (_d, cora) = cora_copy();
    let labels = cora.join("raw/node-label.csv.gz");
    std::fs::remove_file(&labels).unwrap();
    let c = std::ffi::CString::new(labels.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let err = load_within(&cora, 2, LoadOptions::default()).expect_err("refused");
    assert!(err.contains("node-label.csv.gz") && err.contains("FIFO"), "{err}");
}

/// An npy exchange folder of Cora (features as given), through the library's own writers.
fn exchange_cora(features_fortran: bool) -> (tempfile::TempDir, PathBuf, grinnder_graph::Dataset) {
    let (d, cora) = cora_copy();
    let ds = io::open(&cora, Format::Auto, &LoadOptions::default()).unwrap();
    let out = d.path().join("npy");
    io::exchange::save(&ds, &out).unwrap();
    if features_fortran {
        let (n, dim) = (ds.num_nodes(), ds.features.dim);
        let mut col_major = vec![0f32; n * dim];
        for r in 0..n {
            for c in 0..dim {
                col_major[c * n + r] = ds.features.data.get(r * dim + c);
            }
        }
        crate::common::write_npy_fortran(&out.join("node_feat.npy"), n, dim, &col_major);
    }
    (d, out, ds)
}

#[test]
fn fortran_ordered_features_are_read_in_row_order() {
    let (_d, out, want) = exchange_cora(true);
    let header = npy::Npy::open(&out.join("node_feat.npy")).unwrap();
    assert!(header.fortran, "the file under test is column-major");
    let got = load_within(&out, 2, LoadOptions::default()).unwrap();
    assert_eq!(got.features.dim, want.features.dim);
    assert!(got.features.data == want.features.data, "features differ from Cora's rows");
}

#[test]
fn overlapping_splits_are_refused_unless_allowed() {
    let (_d, out, ds) = exchange_cora(false);
    let test: Vec<i64> =
        ds.splits.test.iter().map(|&v| v as i64).chain([ds.splits.train[0] as i64]).collect();
    npy::write_array(&out.join("test_idx.npy"), npy::DType::I64, &[test.len() as u64], &test).unwrap();
    let err = load_within(&out, 2, LoadOptions::default()).expect_err("refused");
    let node = ds.splits.train[0].to_string();
    assert!(err.contains(&node) && err.contains("train") && err.contains("--allow-split-overlap"), "{err}");
    let opts = LoadOptions { allow_split_overlap: true, ..LoadOptions::default() };
    let got = load_within(&out, 2, opts).unwrap();
    assert_eq!(got.splits.test.len(), ds.splits.test.len() + 1);
}

#[test]
fn a_zero_dimensional_split_array_is_refused() {
    let (_d, out, _) = exchange_cora(false);
    npy::write_array(&out.join("train_idx.npy"), npy::DType::I64, &[], &[5i64]).unwrap();
    let err = load_within(&out, 2, LoadOptions::default()).expect_err("refused");
    assert!(err.contains("train_idx.npy") && err.contains("1-dimensional"), "{err}");
}
