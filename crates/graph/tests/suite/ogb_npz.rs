//! OGB's binary layout (`raw/data.npz`, as ogbn-papers100M ships): it loads into the same
//! dataset as the CSV layout and the npy exchange layout of the same graph, in every element
//! type and order numpy writes, and a damaged archive is refused naming the file and member.

use std::path::Path;

use crate::common::*;
use grinnder_graph::io::npy::DType;
use grinnder_graph::io::npz::NpzWriter;
use grinnder_graph::io::{self, exchange, ogb, ogb_npz, Format, LoadOptions};
use grinnder_graph::{Dataset, FeatureDtype, NO_LABEL};

fn open(p: &Path) -> Dataset {
    io::open(p, Format::Auto, &LoadOptions::default()).unwrap_or_else(|e| panic!("{e}"))
}

fn open_err(p: &Path) -> String {
    match io::open(p, Format::Auto, &LoadOptions::default()) {
        Ok(_) => panic!("{} loaded", p.display()),
        Err(e) => e.to_string(),
    }
}

/// `tiny` with some nodes unlabelled (NaN in OGB's label file).
fn sample() -> Dataset {
    let mut ds = tiny(60, 5, 3);
    let mut labels = ds.labels.to_vec();
    for v in [4, 17, 33] {
        labels[v] = NO_LABEL;
    }
    ds.labels = labels.into();
    ds
}

#[test]
fn the_binary_layout_loads_as_the_csv_and_npy_layouts_do() {
    for ds in [sample(), open(&cora_dir())] {
        let root = tempfile::tempdir().unwrap();
        let csv = root.path().join("csv");
        ogb::write(&ds, &csv, "time").unwrap();
        let bin = root.path().join("ogbn_x");
        ogb_npz::write(&ds, &bin, "time").unwrap();
        let npy = root.path().join("npy");
        exchange::save(&ds, &npy).unwrap();
        assert_eq!(io::detect(&bin).unwrap(), Format::Ogb);
        let got = open(&bin);
        assert_same(&open(&csv), &got);
        assert_same(&open(&npy), &got);
        assert_same(&ds, &got);
        assert!(!got.features.data.is_mapped(), "decompressed into owned memory");
        // OGB's naming of the folder, and the name of its download
        assert_same(&ds, &open(&root.path().join("ogbn-x")));
        std::fs::rename(&bin, root.path().join("x-bin")).unwrap();
        assert_same(&ds, &open(&root.path().join("ogbn-x")));
    }
}

#[test]
fn a_numpy_written_archive_loads() {
    // made by np.savez_compressed: tests/data/make_ogbn_npz_tiny.py
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/ogbn_npz_tiny");
    assert_eq!(io::detect(&dir).unwrap(), Format::Ogb);
    let ds = open(&dir);
    assert_eq!(ds.num_nodes(), 6);
    // 7 edges, one of them (0, 2) given in one direction only, symmetrised: 14 directed
    assert_eq!(ds.graph.num_edges(), 14);
    assert_eq!(ds.graph.row(0), &[1, 2, 5]);
    assert_eq!(ds.features.dim, 3);
    let want: Vec<f32> = (0..18).map(|i| (i as f32 - 4.5) / 4.0).collect();
    assert_eq!(ds.features.data.as_f32().unwrap(), want.as_slice());
    assert_eq!(&*ds.labels, &[2, 0, NO_LABEL, 1, NO_LABEL, 2]);
    assert_eq!(ds.num_classes, 3);
    assert_eq!(
        (&*ds.splits.train, &*ds.splits.valid, &*ds.splits.test),
        (&[0, 1][..], &[3][..], &[2, 5][..])
    );
}

/// Element conversions numpy may hand over: `(dtype, bytes of one value)`.
fn encode(values: &[f32], dtype: DType) -> Vec<u8> {
    values
        .iter()
        .flat_map(|&x| match dtype {
            DType::F16 => half::f16::from_f32(x).to_bits().to_le_bytes().to_vec(),
            DType::F64 => (x as f64).to_le_bytes().to_vec(),
            _ => x.to_le_bytes().to_vec(),
        })
        .collect()
}

/// Writes `data.npz` of `ds` by hand: features of `dtype`, optionally Fortran-ordered
/// (features and edges), members deflated or stored; `skip` leaves a member out.
fn write_data(ds: &Dataset, path: &Path, dtype: DType, fortran: bool, compressed: bool, skip: &str) {
    let (n, dim) = (ds.num_nodes(), ds.features.dim);
    let (src, dst) = ds.graph.to_coo();
    let e = src.len();
    let mut w = NpzWriter::create(path, compressed).unwrap();
    if skip != "edge_index" {
        // int32 edges; Fortran order interleaves (source, target) pairs
        let ids: Vec<i32> = if fortran {
            src.iter().zip(&dst).flat_map(|(&s, &d)| [s as i32, d as i32]).collect()
        } else {
            src.iter().chain(&dst).map(|&v| v as i32).collect()
        };
        w.begin_in("edge_index", DType::I32, &[2, e as u64], fortran).unwrap();
        w.write(&ids).unwrap();
    }
    if skip != "node_feat" {
        let f = &ds.features.data;
        let values: Vec<f32> = if fortran {
            (0..dim).flat_map(|c| (0..n).map(move |r| f.get(r * dim + c))).collect()
        } else {
            f.to_f32_vec()
        };
        w.begin_in("node_feat", dtype, &[n as u64, dim as u64], fortran).unwrap();
        w.write(&encode(&values, dtype)).unwrap();
    }
    w.array("num_nodes_list", DType::I64, &[1], &[n as i64]).unwrap();
    w.array("num_edges_list", DType::I64, &[1], &[e as i64]).unwrap();
    w.array("node_year", DType::I64, &[n as u64, 1], &vec![2020i64; n]).unwrap();
    w.finish().unwrap();
}

/// A copy of `ds` whose features survive a round trip through float16.
fn halved(ds: &Dataset) -> Dataset {
    let mut out = ds.clone();
    out.features = ds.features.to_dtype(FeatureDtype::F16).to_dtype(FeatureDtype::F32);
    out
}

#[test]
fn float16_float64_fortran_order_and_stored_members_load_alike() {
    let ds = halved(&sample());
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("d");
    ogb_npz::write(&ds, &dir, "time").unwrap();
    let data = dir.join("raw/data.npz");
    for dtype in [DType::F16, DType::F32, DType::F64] {
        for fortran in [false, true] {
            for compressed in [true, false] {
                write_data(&ds, &data, dtype, fortran, compressed, "");
                // float16 stays float16 (the same values)
                let loaded = open(&dir);
                match dtype {
                    DType::F16 => {
                        assert_eq!(loaded.features.dtype(), FeatureDtype::F16);
                        let want =
                            Dataset { features: ds.features.to_dtype(FeatureDtype::F16), ..ds.clone() };
                        assert_same(&want, &loaded);
                    }
                    _ => assert_same(&ds, &loaded),
                }
            }
        }
    }
    // labels as float32 [N] (NaN for none) or int64 with -1
    let lab = dir.join("raw/node-label.npz");
    let y32: Vec<f32> = ds.labels.iter().map(|&y| if y == NO_LABEL { f32::NAN } else { y as f32 }).collect();
    let y64: Vec<i64> = ds.labels.iter().map(|&y| y as i64).collect();
    let mut w = NpzWriter::create(&lab, true).unwrap();
    w.array("node_label", DType::F32, &[60], &y32).unwrap();
    w.finish().unwrap();
    assert_same(&ds, &open(&dir));
    let mut w = NpzWriter::create(&lab, false).unwrap();
    w.array("node_label", DType::I64, &[60, 1], &y64).unwrap();
    w.finish().unwrap();
    assert_same(&ds, &open(&dir));
}

#[test]
fn a_missing_member_names_the_archive_and_the_layout() {
    let ds = sample();
    let dir = tempfile::tempdir().unwrap();
    ogb_npz::write(&ds, dir.path(), "time").unwrap();
    let data = dir.path().join("raw/data.npz");
    for member in ["node_feat", "edge_index"] {
        write_data(&ds, &data, DType::F32, false, true, member);
        let err = open_err(dir.path());
        assert!(err.contains(&format!("raw/data.npz: no member {member}.npy (the archive holds: ")), "{err}");
        assert!(
            err.contains("expected OGB's binary layout: raw/data.npz with edge_index.npy [2, E]"),
            "{err}"
        );
    }
    let mut w = NpzWriter::create(&dir.path().join("raw/node-label.npz"), true).unwrap();
    w.array("labels", DType::F64, &[60, 1], &[0f64; 60]).unwrap();
    w.finish().unwrap();
    write_data(&ds, &data, DType::F32, false, true, "");
    let err = open_err(dir.path());
    assert!(
        err.contains("raw/node-label.npz: no member node_label.npy (the archive holds: labels.npy)"),
        "{err}"
    );
}

#[test]
fn counts_shapes_ids_and_values_are_checked_naming_the_member() {
    let ds = sample();
    let dir = tempfile::tempdir().unwrap();
    ogb_npz::write(&ds, dir.path(), "time").unwrap();
    let data = dir.path().join("raw/data.npz");
    let (src, dst) = ds.graph.to_coo();
    let e = src.len() as u64;
    let edges: Vec<i64> = src.iter().chain(&dst).map(|&v| v as i64).collect();
    let feats = ds.features.data.to_f32_vec();
    let case = |n: i64, ne: i64, edges: &[i64], feats: &[f32], shape: [u64; 2]| {
        let mut w = NpzWriter::create(&data, true).unwrap();
        w.array("edge_index", DType::I64, &[2, edges.len() as u64 / 2], edges).unwrap();
        w.array("node_feat", DType::F32, &shape, feats).unwrap();
        w.array("num_nodes_list", DType::I64, &[1], &[n]).unwrap();
        w.array("num_edges_list", DType::I64, &[1], &[ne]).unwrap();
        w.finish().unwrap();
        open_err(dir.path())
    };
    let err = case(61, e as i64, &edges, &feats, [60, 5]);
    assert!(
        err.contains("data.npz: member node_feat.npy: 60 feature rows, but num_nodes_list.npy says 61"),
        "{err}"
    );
    let err = case(60, e as i64 + 1, &edges, &feats, [60, 5]);
    assert!(err.contains("data.npz: member edge_index.npy: "), "{err}");
    assert!(err.contains(&format!("{e} edges, but num_edges_list.npy says {}", e + 1)), "{err}");
    let mut bad = edges.clone();
    bad[e as usize + 7] = 60;
    let err = case(60, e as i64, &bad, &feats, [60, 5]);
    assert!(err.contains("data.npz: member edge_index.npy: edge 7: node id 60 is outside 0..60"), "{err}");
    let mut nan = feats.clone();
    nan[5 * 9 + 2] = f32::NAN;
    let err = case(60, e as i64, &edges, &nan, [60, 5]);
    assert!(err.contains("data.npz: member node_feat.npy: feature of node 9, column 2 is NaN"), "{err}");
    let err = case(60, e as i64, &edges, &feats, [300, 1]);
    assert!(err.contains("member node_feat.npy: 300 feature rows"), "{err}");
}

#[test]
fn a_truncated_or_damaged_archive_is_refused_naming_it() {
    let ds = sample();
    let dir = tempfile::tempdir().unwrap();
    ogb_npz::write(&ds, dir.path(), "time").unwrap();
    for file in ["data.npz", "node-label.npz"] {
        let path = dir.path().join("raw").join(file);
        let whole = std::fs::read(&path).unwrap();
        for cut in (0..whole.len()).step_by(97).chain([whole.len() - 1]) {
            std::fs::write(&path, &whole[..cut]).unwrap();
            let err = open_err(dir.path());
            assert!(err.contains(&format!("raw/{file}: ")), "cut at {cut}: {err}");
        }
        // damaged deflate data or checksum inside the first member: named with its member (the
        // bytes before its data are the local header, which the archive's directory overrides)
        for at in [100, 140, 190] {
            let mut bad = whole.clone();
            bad[at] ^= 0x24;
            std::fs::write(&path, &bad).unwrap();
            let err = open_err(dir.path());
            let member = if file == "data.npz" { "edge_index" } else { "node_label" };
            assert!(err.contains(&format!("raw/{file}: member {member}.npy: ")), "byte {at}: {err}");
        }
        std::fs::write(&path, &whole).unwrap();
    }
    assert_same(&ds, &open(dir.path()));
    std::fs::write(dir.path().join("raw/data.npz"), b"not a zip at all").unwrap();
    let err = open_err(dir.path());
    assert!(err.contains("raw/data.npz: not a readable .npz (zip) archive"), "{err}");
}
