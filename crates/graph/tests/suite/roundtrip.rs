//! Every format round-trips exactly, and the bundled datasets have their published sizes.

use crate::common::*;
use grinnder_graph::generate::{generate, preset, GenConfig};
use grinnder_graph::io::{self, exchange, igb, native, ogb, Format, LoadOptions};

fn open(p: &std::path::Path) -> grinnder_graph::Dataset {
    io::open(p, Format::Auto, &LoadOptions::default()).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn cora_has_its_published_sizes() {
    let ds = open(&cora_dir());
    assert_eq!(ds.num_nodes(), 2708);
    assert_eq!(ds.graph.num_edges(), 10_556);
    assert_eq!(ds.features.dim, 1433);
    assert_eq!(ds.num_classes, 7);
    assert_eq!((ds.splits.train.len(), ds.splits.valid.len(), ds.splits.test.len()), (140, 500, 1000));
    assert!(ds.graph.is_symmetric());
    assert_eq!(ds.graph.num_self_loops(), 0);
}

#[test]
fn pubmed_has_its_published_sizes() {
    let Some(dir) = pubmed_dir() else {
        eprintln!("data/pubmed is not in this checkout; nothing to check");
        return;
    };
    let ds = open(&dir);
    assert_eq!(ds.num_nodes(), 19_717);
    assert_eq!(ds.graph.num_edges(), 88_648);
    assert_eq!(ds.features.dim, 500);
    assert_eq!(ds.num_classes, 3);
}

/// OGB raw → native → npy → native, and OGB → OGB, IGB (with and without header) → same.
fn round_trip_all(ds: &grinnder_graph::Dataset) {
    let dir = tempfile::tempdir().unwrap();
    let n1 = dir.path().join("a.grnd");
    native::save(ds, &n1).unwrap();
    let a = open(&n1);
    assert!(a.features.data.is_mapped(), "native features are mapped, not read");
    assert_same(ds, &a);
    let npy = dir.path().join("npy");
    exchange::save(&a, &npy).unwrap();
    let b = open(&npy);
    assert_same(ds, &b);
    let n2 = dir.path().join("b.grnd");
    native::save(&b, &n2).unwrap();
    assert_same(ds, &open(&n2));
    let o = dir.path().join("ogbn_x");
    ogb::write(ds, &o, "public").unwrap();
    assert_same(ds, &open(&o));
    for raw in [false, true] {
        let g = dir.path().join(format!("igb{raw}"));
        igb::write(ds, &g, raw).unwrap();
        let classes = if ds.num_classes <= 19 { 19 } else { 2983 };
        let opts = LoadOptions { igb_classes: classes, ..LoadOptions::default() };
        let c = io::open(&g, Format::Auto, &opts).unwrap();
        assert_eq!(c.graph, ds.graph);
        assert_eq!(c.features.data, ds.features.data);
        assert_eq!(*c.labels, *ds.labels);
    }
}

#[test]
fn cora_round_trips_through_every_format() {
    round_trip_all(&open(&cora_dir()));
}

#[test]
fn generated_graph_round_trips_through_every_format() {
    let g = generate(&GenConfig::new(preset("arxiv-like").unwrap(), 0.01, 5)).unwrap();
    round_trip_all(&g.into_dataset().unwrap());
}

#[test]
fn generated_native_file_equals_in_memory_generation() {
    let cfg = GenConfig::new(preset("products-like").unwrap(), 0.0005, 9);
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("p.grnd");
    let g = generate(&cfg).unwrap();
    native::write(&p, &g.name, &g.graph, &g.labels, g.num_classes, &g.splits, &g.features).unwrap();
    let want = generate(&cfg).unwrap().into_dataset().unwrap();
    let got = open(&p);
    assert_same(&want, &got);
    let (n, e) = cfg.sizes().unwrap();
    assert_eq!((got.num_nodes() as u64, got.graph.num_edges() as u64), (n, e));
}

#[test]
fn ogb_folder_naming_and_split_choice() {
    let ds = tiny(40, 3, 1);
    let root = tempfile::tempdir().unwrap();
    ogb::write(&ds, &root.path().join("ogbn_tiny"), "sales_ranking").unwrap();
    // as OGB names it: ogbn-tiny → ogbn_tiny
    assert_same(&ds, &open(&root.path().join("ogbn-tiny")));
    // a second split folder makes the choice explicit
    ogb::write(&ds, &root.path().join("ogbn_tiny"), "other").unwrap();
    let err = io::open(&root.path().join("ogbn_tiny"), Format::Auto, &LoadOptions::default()).unwrap_err();
    assert!(err.to_string().contains("several splits"), "{err}");
    let opts = LoadOptions { split: Some("other".into()), ..LoadOptions::default() };
    assert_same(&ds, &io::open(&root.path().join("ogbn_tiny"), Format::Auto, &opts).unwrap());
}

#[test]
fn igb_headerless_features_need_the_node_count_only() {
    let ds = tiny(50, 6, 2);
    let dir = tempfile::tempdir().unwrap();
    igb::write(&ds, dir.path(), true).unwrap();
    let got = open(dir.path());
    assert_eq!(got.features.dim, 6);
    // IGB's own split: 60 / 20 / 20 % in node order
    assert_eq!((got.splits.train.len(), got.splits.valid.len(), got.splits.test.len()), (30, 10, 10));
    let opts = LoadOptions { num_nodes: Some(49), ..LoadOptions::default() };
    assert!(io::open(dir.path(), Format::Igb, &opts).is_err(), "a wrong node count is refused");
}
