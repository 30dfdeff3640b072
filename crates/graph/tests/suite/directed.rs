//! Directed graphs and edge weights through the loaders: the npy layout's `edge_weight.npy`,
//! the edges taken as given with `--directed` (`BuildOptions::symmetrise` off), and the native
//! file's weights section and directed flag (version 3 only for such files; older files load
//! as before).

use std::path::Path;

use crate::common::tiny;
use grinnder_graph::io::{self, exchange, native, npy, Format, LoadOptions};
use grinnder_graph::{BuildOptions, Dataset};

fn opts(directed: bool) -> LoadOptions {
    LoadOptions {
        build: BuildOptions { symmetrise: !directed, ..BuildOptions::default() },
        ..LoadOptions::default()
    }
}

/// An npy folder holding `tiny(n)` with the edges `edges` and, where given, their weights.
fn folder(dir: &Path, edges: &[(i64, i64)], weights: Option<&[f32]>) {
    exchange::save(&tiny(6, 3, 1), dir).unwrap();
    let flat: Vec<i64> = edges.iter().map(|e| e.0).chain(edges.iter().map(|e| e.1)).collect();
    npy::write_array(&dir.join("edge_index.npy"), npy::DType::I64, &[2, edges.len() as u64], &flat).unwrap();
    if let Some(w) = weights {
        npy::write_array(&dir.join("edge_weight.npy"), npy::DType::F32, &[w.len() as u64], w).unwrap();
    }
}

/// The weight of `u → v` (`None`: no such edge).
fn weight(ds: &Dataset, u: u32, v: u32) -> Option<f32> {
    let k = ds.graph.row(v as usize).binary_search(&u).ok()?;
    let w = ds.edge_weight.as_ref().expect("weighted");
    Some(w[ds.graph.row_ptr()[v as usize] as usize + k])
}

const EDGES: [(i64, i64); 4] = [(0, 1), (2, 1), (1, 3), (4, 4)];
const WEIGHTS: [f32; 4] = [0.5, 2.0, 3.0, 7.0];

#[test]
fn an_npy_folder_with_weights_loads_directed_or_made_symmetric() {
    let dir = tempfile::tempdir().unwrap();
    folder(dir.path(), &EDGES, Some(&WEIGHTS));
    let ds = io::open(dir.path(), Format::Auto, &opts(true)).unwrap();
    assert!(ds.directed);
    // the self loop is dropped with its weight; every other edge as given, one direction
    assert_eq!(ds.graph.num_edges(), 3);
    assert_eq!([weight(&ds, 0, 1), weight(&ds, 2, 1), weight(&ds, 1, 3)], [Some(0.5), Some(2.0), Some(3.0)]);
    assert_eq!(weight(&ds, 1, 0), None);
    let ds = io::open(dir.path(), Format::Auto, &opts(false)).unwrap();
    assert!(!ds.directed);
    assert_eq!(ds.graph.num_edges(), 6);
    assert_eq!([weight(&ds, 1, 0), weight(&ds, 3, 1)], [Some(0.5), Some(3.0)]);
    // without the file: unweighted
    std::fs::remove_file(dir.path().join("edge_weight.npy")).unwrap();
    assert!(io::open(dir.path(), Format::Auto, &opts(true)).unwrap().edge_weight.is_none());
}

#[test]
fn bad_weight_files_are_refused_naming_the_files() {
    let dir = tempfile::tempdir().unwrap();
    folder(dir.path(), &EDGES, Some(&WEIGHTS[..3]));
    let err = io::open(dir.path(), Format::Auto, &opts(true)).unwrap_err().to_string();
    assert!(
        err.contains("edge_weight.npy") && err.contains("edge_index.npy") && err.contains("3 weights"),
        "{err}"
    );
    folder(dir.path(), &EDGES, Some(&[0.5, -1.0, 3.0, 7.0]));
    let err = io::open(dir.path(), Format::Auto, &opts(true)).unwrap_err().to_string();
    assert!(err.contains("edge_weight.npy") && err.contains("edge 1 is -1"), "{err}");
    // an edge and its reverse with different weights: one edge of the undirected graph
    folder(dir.path(), &[(0, 1), (1, 0)], Some(&[1.0, 2.0]));
    let err = io::open(dir.path(), Format::Auto, &opts(false)).unwrap_err().to_string();
    assert!(err.contains("edges 0 and 1") && err.contains("--directed"), "{err}");
    assert!(io::open(dir.path(), Format::Auto, &opts(true)).is_ok());
}

fn version(path: &Path) -> u32 {
    let b = std::fs::read(path).unwrap();
    u32::from_le_bytes(b[8..12].try_into().unwrap())
}

#[test]
fn a_native_file_keeps_weights_and_direction_and_refuses_the_other_direction() {
    let dir = tempfile::tempdir().unwrap();
    folder(dir.path(), &EDGES, Some(&WEIGHTS));
    let ds = io::open(dir.path(), Format::Auto, &opts(true)).unwrap();
    let file = dir.path().join("d.grnd");
    native::save(&ds, &file).unwrap();
    assert_eq!(version(&file), native::VERSION_GRAPH);
    let back = io::open(&file, Format::Auto, &opts(true)).unwrap();
    assert!(back.directed);
    assert_eq!(back.graph, ds.graph);
    assert_eq!(back.edge_weight.as_deref(), ds.edge_weight.as_deref());
    let err = io::open(&file, Format::Auto, &opts(false)).unwrap_err().to_string();
    assert!(err.contains("directed graph") && err.contains("--directed"), "{err}");
    // an undirected, unweighted file keeps version 1 and is refused as a directed graph
    let plain = tiny(6, 3, 1);
    native::save(&plain, &file).unwrap();
    assert_eq!(version(&file), native::VERSION);
    let err = io::open(&file, Format::Auto, &opts(true)).unwrap_err().to_string();
    assert!(
        err.contains("undirected graph") && err.contains("convert the source again with --directed"),
        "{err}"
    );
    // an undirected weighted graph: version 3, weights on both directions
    let sym = io::open(dir.path(), Format::Auto, &opts(false)).unwrap();
    native::save(&sym, &file).unwrap();
    assert_eq!(version(&file), native::VERSION_GRAPH);
    let back = io::open(&file, Format::Auto, &opts(false)).unwrap();
    assert!(!back.directed);
    assert_eq!(back.edge_weight.as_deref(), sym.edge_weight.as_deref());
}

#[test]
fn weights_round_trip_through_the_npy_layout() {
    let dir = tempfile::tempdir().unwrap();
    folder(dir.path(), &EDGES, Some(&WEIGHTS));
    let ds = io::open(dir.path(), Format::Auto, &opts(true)).unwrap();
    let out = dir.path().join("out");
    exchange::save(&ds, &out).unwrap();
    let back = io::open(&out, Format::Auto, &opts(true)).unwrap();
    assert_eq!(back.graph, ds.graph);
    assert_eq!(back.edge_weight.as_deref(), ds.edge_weight.as_deref());
}
