//! Tests of the tiered store (its budget, eviction, dtypes and files).

use super::*;

#[test]
fn bf16_rounds_to_nearest_even() {
    assert_eq!(from_bf16(to_bf16(1.0)), 1.0);
    assert_eq!(from_bf16(to_bf16(-2.5)), -2.5);
    let x = 1.0 + 1.0 / 256.0; // halfway between two bf16 values: rounds to even (1.0)
    assert_eq!(from_bf16(to_bf16(x)), 1.0);
    assert!((from_bf16(to_bf16(0.1)) - 0.1).abs() < 0.1 / 128.0);
    assert!(from_bf16(to_bf16(f32::NAN)).is_nan());
}

fn id(layer: usize, part: usize) -> BlockId {
    BlockId { kind: BlockKind::Act, layer, part }
}

#[test]
fn blocks_spill_to_files_and_come_back_exactly() {
    let dir = tempfile::tempdir().unwrap();
    for mode in [CacheMode::LruLayer, CacheMode::PartitionLru] {
        // room for two 100 × 8 f32 blocks
        let cfg =
            StoreConfig { budget: Some(2 * 3200), mode, dtype: TierDtype::F32, faults: Faults::default() };
        let mut s = Store::<f32>::new(cfg, Some(dir.path()), false).unwrap();
        let block = |k: usize| (0..800).map(|i| (i * 7 + k) as f32 * 0.5).collect::<Vec<f32>>();
        for l in 0..3 {
            for p in 0..2 {
                s.put(id(l, p), 100, 8, block(l * 2 + p)).unwrap();
                assert!(s.resident_bytes() <= 2 * 3200);
            }
        }
        let mut out = vec![0f32; 800];
        for l in 0..3 {
            for p in 0..2 {
                s.read_rows(id(l, p), None, &mut out).unwrap();
                assert_eq!(out, block(l * 2 + p));
            }
        }
        let st = s.take_stats();
        assert!(st.misses > 0 && st.storage_write_bytes > 0 && st.storage_read_bytes > 0, "{st:?}");
        s.add_rows(id(0, 0), 100, 8, Some(&[3, 3]), &[1.0; 16]).unwrap();
        let mut row = vec![0f32; 8];
        s.read_rows(id(0, 0), Some(&[3]), &mut row).unwrap();
        assert_eq!(row, block(0)[24..32].iter().map(|x| x + 2.0).collect::<Vec<_>>());
    }
}

#[test]
fn a_corrupted_block_is_an_error_naming_its_file() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = StoreConfig {
        budget: Some(3200),
        mode: CacheMode::PartitionLru,
        dtype: TierDtype::F32,
        faults: Faults::default(),
    };
    let mut s = Store::<f32>::new(cfg, Some(dir.path()), false).unwrap();
    s.put(id(0, 0), 100, 8, vec![1.0; 800]).unwrap();
    s.put(id(0, 1), 100, 8, vec![2.0; 800]).unwrap(); // evicts (0, 0) to its file
    s.sync().unwrap();
    let path = s.storage_dir().unwrap().join(id(0, 0).file_name());
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[ALIGN + 17] ^= 0x10;
    std::fs::write(&path, &bytes).unwrap();
    let err = s.read_rows(id(0, 0), None, &mut vec![0f32; 800]).unwrap_err();
    assert!(err.to_string().contains("act-l0-p0.blk") && err.to_string().contains("checksum"), "{err}");
    // truncated
    s.put(id(0, 0), 100, 8, vec![1.0; 800]).unwrap();
    s.put(id(0, 1), 100, 8, vec![2.0; 800]).unwrap();
    s.sync().unwrap();
    std::fs::write(&path, &bytes[..ALIGN + 100]).unwrap();
    let err = s.read_rows(id(0, 0), None, &mut vec![0f32; 800]).unwrap_err();
    assert!(err.to_string().contains("truncated"), "{err}");
}

#[test]
fn files_are_removed_unless_kept() {
    let dir = tempfile::tempdir().unwrap();
    for keep in [false, true] {
        let cfg = StoreConfig {
            budget: Some(0),
            mode: CacheMode::PartitionLru,
            dtype: TierDtype::Bf16,
            faults: Faults::default(),
        };
        let mut s = Store::<f32>::new(cfg, Some(dir.path()), keep).unwrap();
        s.put(id(1, 0), 10, 4, vec![0.5; 40]).unwrap();
        s.put(id(1, 1), 10, 4, vec![0.5; 40]).unwrap();
        let mut out = vec![0f32; 40];
        s.read_rows(id(1, 0), None, &mut out).unwrap();
        assert_eq!(out, vec![0.5; 40]);
        let run = s.storage_dir().unwrap().to_path_buf();
        assert!(run.starts_with(dir.path()) && run != dir.path());
        let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&run).unwrap().permissions());
        assert_eq!(mode & 0o777, 0o700, "a private directory");
        drop(s);
        assert_eq!(run.exists(), keep);
        assert_eq!(std::fs::read_dir(&run).map_or(0, |d| d.count()) > 0, keep);
    }
}
