//! Helpers shared by the graph crate's integration tests.
#![allow(dead_code)]

use std::path::PathBuf;

use grinnder_graph::rng::Stream;
use grinnder_graph::{BuildOptions, Csr, Dataset, Features, Splits};

/// The repository root (two levels above this crate).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The bundled Cora in the OGB raw layout.
pub fn cora_dir() -> PathBuf {
    repo_root().join("data/cora")
}

/// The bundled PubMed in the OGB raw layout, when it is there.
pub fn pubmed_dir() -> Option<PathBuf> {
    let p = repo_root().join("data/pubmed");
    p.is_dir().then_some(p)
}

/// A small random dataset: `n` nodes, about `3n` undirected edges, `dim` features, 3 classes.
pub fn tiny(n: u32, dim: usize, seed: u64) -> Dataset {
    let mut s = Stream::new(&[seed]);
    let m = 3 * n as usize;
    let src: Vec<u32> = (0..m).map(|_| s.below(n as u64) as u32).collect();
    let dst: Vec<u32> = (0..m).map(|_| s.below(n as u64) as u32).collect();
    let graph = Csr::from_edges(n as u64, &src, &dst, BuildOptions::default()).unwrap();
    let data: Vec<f32> = (0..n as usize * dim).map(|_| (s.normal() * 3.0) as f32).collect();
    let labels: Vec<i32> = (0..n).map(|_| s.below(3) as i32).collect();
    let ids: Vec<u32> = (0..n).collect();
    let third = n as usize / 3;
    Dataset {
        name: "tiny".into(),
        graph,
        features: Features { dim, data: data.into() },
        labels: labels.into(),
        num_classes: 3,
        splits: Splits {
            train: ids[..third].to_vec().into(),
            valid: ids[third..2 * third].to_vec().into(),
            test: ids[2 * third..].to_vec().into(),
        },
        directed: false,
        edge_weight: None,
    }
}

/// Asserts two datasets hold the same graph, features, labels and split (names may differ).
pub fn assert_same(a: &Dataset, b: &Dataset) {
    assert_eq!(a.graph.row_ptr(), b.graph.row_ptr(), "row_ptr");
    assert_eq!(a.graph.col_idx(), b.graph.col_idx(), "col_idx");
    assert_eq!(a.features.dim, b.features.dim, "feature dim");
    assert!(
        a.features.dtype() == b.features.dtype() && a.features.data.as_bytes() == b.features.data.as_bytes(),
        "features differ"
    );
    assert_eq!(a.features.data.len(), b.features.data.len());
    assert_eq!(*a.labels, *b.labels, "labels");
    assert_eq!(a.num_classes, b.num_classes, "classes");
    assert_eq!(*a.splits.train, *b.splits.train, "train");
    assert_eq!(*a.splits.valid, *b.splits.valid, "valid");
    assert_eq!(*a.splits.test, *b.splits.test, "test");
}

/// Writes an `n × dim` float32 `.npy` file in Fortran (column-major) order, as NumPy does for
/// `np.asfortranarray(x)`: `col_major[c * n + r]` is row `r`, column `c`.
pub fn write_npy_fortran(path: &std::path::Path, n: usize, dim: usize, col_major: &[f32]) {
    let mut header = format!("{{'descr': '<f4', 'fortran_order': True, 'shape': ({n}, {dim}), }}");
    let total = 10 + header.len() + 1;
    header.push_str(&" ".repeat((64 - total % 64) % 64));
    header.push('\n');
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend_from_slice(&(header.len() as u16).to_le_bytes());
    bytes.extend_from_slice(header.as_bytes());
    for v in col_major {
        bytes.extend_from_slice(&v.to_le_bytes());
    }
    std::fs::write(path, bytes).unwrap();
}
