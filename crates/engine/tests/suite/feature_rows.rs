//! Feature rows read by every core equal rows read by one, bit for bit, on each path: pread
//! from a native file (runs of consecutive ids and scattered halo rows), a file mapping
//! (pages handed back a piece at a time) and memory, with features stored as float32 or
//! float16 — and equal the row preprocessed by hand.

use std::sync::Arc;

use grinnder_engine::features::{feature_rows, feature_shift, normalized};
use grinnder_engine::FeatureNorm;
use grinnder_graph::generate::{generate, preset, GenConfig};
use grinnder_graph::io::native;
use grinnder_graph::{Buf, Dataset, FeatureDtype};

fn on_threads<R: Send>(n: usize, f: impl FnOnce() -> R + Send) -> R {
    rayon::ThreadPoolBuilder::new().num_threads(n).build().unwrap().install(f)
}

/// Own rows in runs (long enough to be split across cores), then scattered and repeated ids.
fn ids(n: u32) -> Vec<u32> {
    let mut ids: Vec<u32> = (10..n / 2).collect();
    ids.extend((0..n).rev().step_by(7));
    ids.extend([0, 0, n - 1, 5, 6, 7, 3]);
    ids
}

fn check(ds: &Dataset, reference: &Dataset) {
    let ids = ids(ds.graph.num_nodes() as u32);
    let d = ds.features.dim;
    for norm in [FeatureNorm::None, FeatureNorm::Row] {
        let shift = feature_shift(reference, norm);
        let one = on_threads(1, || feature_rows::<f32>(ds, norm, shift, &ids).unwrap());
        for n in [2, 3, 8] {
            let many = on_threads(n, || feature_rows::<f32>(ds, norm, shift, &ids).unwrap());
            assert!(one == many, "{norm}: rows read on {n} threads differ from one thread's");
        }
        let data = reference.features.data.to_f32_vec();
        let by_hand: Vec<f32> = ids
            .iter()
            .flat_map(|&v| normalized::<f32, f32>(&data[v as usize * d..][..d], norm, shift))
            .collect();
        assert!(one == by_hand, "{norm}: rows differ from the rows preprocessed by hand");
    }
}

#[test]
fn rows_read_on_every_core_equal_one_cores() {
    let ds =
        generate(&GenConfig::new(preset("arxiv-like").unwrap(), 0.002, 7)).unwrap().into_dataset().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("g.grnd");
    native::save(&ds, &path).unwrap();

    // pread from the native file
    let from_file = native::open(&path, native::Verify::Full).unwrap();
    assert!(from_file.features.data.reads_through_file());
    check(&from_file, &ds);

    // a plain file mapping (pages handed back every piece)
    let raw = dir.path().join("x.f32");
    std::fs::write(&raw, ds.features.data.as_bytes()).unwrap();
    let file = std::fs::File::open(&raw).unwrap();
    // SAFETY: a file this test wrote and nothing changes
    let map = Arc::new(unsafe { memmap2::Mmap::map(&file) }.unwrap());
    let mut mapped = ds.clone();
    mapped.features.data = Buf::<f32>::mapped(map, 0, ds.features.data.len()).unwrap().into();
    assert!(mapped.features.data.is_mapped() && !mapped.features.data.reads_through_file());
    check(&mapped, &ds);

    // memory
    check(&ds, &ds);

    // float16: from the native file (widened as read) and in memory
    let narrow = Dataset { features: ds.features.to_dtype(FeatureDtype::F16), ..ds.clone() };
    let path16 = dir.path().join("g16.grnd");
    native::save(&narrow, &path16).unwrap();
    let from_file = native::open(&path16, native::Verify::Full).unwrap();
    assert_eq!(from_file.features.dtype(), FeatureDtype::F16);
    assert!(from_file.features.data.reads_through_file());
    assert!(std::fs::metadata(&path16).unwrap().len() < std::fs::metadata(&path).unwrap().len());
    check(&from_file, &narrow);
    check(&narrow, &narrow);
}
