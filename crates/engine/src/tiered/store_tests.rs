//! Tests of the tiered store (its budget, eviction, dtypes and files).

use super::*;
use crate::tiered::files::SUM_CHUNK;

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

#[test]
fn some_rows_of_a_stored_block_are_read_from_its_file_alone() {
    let dir = tempfile::tempdir().unwrap();
    for dtype in [TierDtype::F32, TierDtype::Bf16] {
        let cfg =
            StoreConfig { budget: Some(0), mode: CacheMode::PartitionLru, dtype, faults: Faults::default() };
        let mut s = Store::<f32>::new(cfg, Some(dir.path()), false).unwrap();
        // 4,000 rows of 64: 1 MiB as f32, 16 chunks; values exact in bf16
        let (rows, d) = (4000usize, 64usize);
        let block: Vec<f32> = (0..rows * d).map(|i| ((i % 251) as f32) - 125.0).collect();
        s.put(id(0, 0), rows, d, block.clone()).unwrap();
        s.put(id(0, 1), 1, d, vec![0.0; d]).unwrap(); // (0, 0) goes to its file
        s.sync().unwrap();
        let resident = s.resident_bytes();
        assert!(resident < (rows * d) as u64, "on disk only");
        s.take_stats();
        let want = [3999u32, 5, 3000, 3001, 5];
        let mut out = vec![0f32; want.len() * d];
        s.read_rows(id(0, 0), Some(&want), &mut out).unwrap();
        for (k, &r) in want.iter().enumerate() {
            assert_eq!(out[k * d..(k + 1) * d], block[r as usize * d..(r as usize + 1) * d], "row {r}");
        }
        let st = s.take_stats();
        // rows 5, 3000–3001 and 3999 lie in three chunks
        let elem = if dtype == TierDtype::F32 { 4 } else { 2 };
        assert_eq!(st.row_reads, 1, "{st:?}");
        assert!(st.storage_read_bytes <= 3 * SUM_CHUNK as u64, "{st:?}");
        assert_eq!(st.storage_needed_bytes, (want.len() * d * elem) as u64);
        assert_eq!(s.resident_bytes(), resident, "the block was not loaded");
        // a corrupted chunk among those read is an error naming the file and the chunk
        let path = s.storage_dir().unwrap().join(id(0, 0).file_name());
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[ALIGN + 3000 * d * elem + 7] ^= 0x40;
        std::fs::write(&path, &bytes).unwrap();
        let err = s.read_rows(id(0, 0), Some(&[3000]), &mut vec![0f32; d]).unwrap_err();
        assert!(err.to_string().contains("act-l0-p0.blk") && err.to_string().contains("checksum"), "{err}");
        // rows outside the corrupted chunk still read
        s.read_rows(id(0, 0), Some(&[5]), &mut vec![0f32; d]).unwrap();
    }
}

#[test]
fn a_small_block_spilled_through_a_large_kept_file_buffer_comes_back_exactly() {
    let dir = tempfile::tempdir().unwrap();
    for dtype in [TierDtype::F32, TierDtype::Bf16] {
        let elem = if dtype == TierDtype::Bf16 { 2 } else { 4 };
        let cfg = StoreConfig {
            // room for 10,000 values
            budget: Some(10_000 * elem as u64),
            mode: CacheMode::PartitionLru,
            dtype,
            faults: Faults::default(),
        };
        let mut s = Store::<f32>::new(cfg, Some(dir.path()), false).unwrap();
        // multiples of 1/4 below 25: exact in bf16 too
        let block =
            |k: usize, n: usize| (0..n).map(|i| ((i * 13 + k) % 97) as f32 * 0.25).collect::<Vec<f32>>();
        // a large block spilled by another and written: its file buffer is kept
        s.put(id(0, 0), 1000, 8, block(0, 8000)).unwrap();
        s.put(id(0, 1), 1000, 8, block(1, 8000)).unwrap();
        s.sync().unwrap();
        s.remove(id(0, 1)).unwrap();
        // a 3-row block, then one that leaves room for nothing else: the 3-row block is the
        // next written, from the large block's buffer
        s.put(id(0, 2), 3, 8, block(2, 24)).unwrap();
        s.put(id(0, 3), 1248, 8, block(3, 9984)).unwrap();
        s.sync().unwrap();
        // past its payload the file's page is zeros, not the large block's bytes
        let bytes = std::fs::read(s.storage_dir().unwrap().join(id(0, 2).file_name())).unwrap();
        assert_eq!(bytes.len(), 2 * ALIGN, "{dtype:?}");
        assert!(bytes[ALIGN + 24 * elem..].iter().all(|&b| b == 0), "{dtype:?}: a stale tail");
        for (p, n) in [(0, 8000), (2, 24), (3, 9984)] {
            let mut out = vec![0f32; n];
            s.read_rows(id(0, p), None, &mut out).unwrap();
            assert_eq!(out, block(p, n), "{dtype:?}, block {p}");
        }
    }
}

/// With files removed once read, the storage directory holds only the blocks that are not in
/// RAM (the spill), the data comes back exactly, and a block that leaves again is written
/// again; kept (the default), the files grow to every block that ever left.
#[test]
fn files_removed_once_read_hold_the_spill_alone() {
    let dir = tempfile::tempdir().unwrap();
    let block = |k: usize| (0..800).map(|i| (i * 3 + k) as f32 * 0.25).collect::<Vec<f32>>();
    for keep in [true, false] {
        // room for two 100 × 8 f32 blocks of the six
        let cfg = StoreConfig {
            budget: Some(2 * 3200),
            mode: CacheMode::PartitionLru,
            dtype: TierDtype::F32,
            faults: Faults::default(),
        };
        let mut s = Store::<f32>::new(cfg, Some(dir.path()), false).unwrap();
        if !keep {
            s.remove_files_once_read();
        }
        let files = |s: &mut Store<f32>| {
            s.sync().unwrap();
            let dir = std::fs::read_dir(s.storage_dir().unwrap()).unwrap();
            dir.filter(|f| f.as_ref().unwrap().file_name().to_string_lossy().ends_with(".blk")).count()
        };
        // the blocks not in RAM
        let spilled = |s: &Store<f32>| 6 - s.resident_bytes() as usize / 3200;
        for p in 0..6 {
            s.put(id(0, p), 100, 8, block(p)).unwrap();
        }
        assert!(files(&mut s) >= 4);
        let mut out = vec![0f32; 800];
        // two passes over every block, as epochs cycle them
        for _ in 0..2 {
            for p in 0..6 {
                s.read_rows(id(0, p), None, &mut out).unwrap();
                assert_eq!(out, block(p));
                let n = files(&mut s);
                if keep {
                    assert!(n >= spilled(&s), "{n}");
                } else {
                    assert_eq!(n, spilled(&s), "the spill alone");
                }
            }
        }
        if keep {
            assert_eq!(files(&mut s), 6, "every block left RAM once and kept its file");
        } else {
            assert!(files(&mut s) < 6);
        }
        // a replaced block's old file goes at once, not when the new version is written
        s.put(id(0, 0), 100, 8, block(9)).unwrap();
        s.read_rows(id(0, 0), None, &mut out).unwrap();
        assert_eq!(out, block(9));
        let st = s.take_stats();
        assert!(st.storage_write_bytes > 0 && st.storage_read_bytes > 0, "{st:?}");
    }
}

/// Rows read as bf16 for a bus that carries them are `to_bf16` of the rows read as f32, from
/// RAM, from a block loaded from its file and from the chunks of a file read in part; a block
/// put as bf16 reads back as the values the bits hold.
#[test]
fn rows_read_and_put_as_bf16_are_the_stores_values_rounded() {
    let dir = tempfile::tempdir().unwrap();
    let (rows, d) = (4000usize, 64usize);
    // values not exact in bf16 (an f32 store rounds them on the way out), a NaN, infinities
    let mut block: Vec<f32> = (0..rows * d).map(|i| ((i * 7919) % 100_003) as f32 / 977.0 - 51.0).collect();
    block[3] = f32::NAN;
    block[d + 1] = f32::INFINITY;
    block[2 * d] = -1e-40;
    let bits = |v: &[f32]| v.iter().map(|&x| to_bf16(x)).collect::<Vec<u16>>();
    let want_rows = [3999u32, 5, 3000, 3001, 0, 1];
    let gathered: Vec<f32> =
        want_rows.iter().flat_map(|&r| block[r as usize * d..(r as usize + 1) * d].to_vec()).collect();
    for dtype in [TierDtype::F32, TierDtype::Bf16] {
        // in RAM; then on disk only (a layer's worth does not fit: rows read in part)
        for budget in [None, Some(0)] {
            let cfg = StoreConfig { budget, mode: CacheMode::PartitionLru, dtype, faults: Faults::default() };
            let mut s = Store::<f32>::new(cfg, Some(dir.path()), false).unwrap();
            s.put(id(0, 0), rows, d, block.clone()).unwrap();
            s.put(id(0, 1), 1, d, vec![0.0; d]).unwrap();
            s.sync().unwrap();
            let what = format!("{dtype:?}, budget {budget:?}");
            let mut some = vec![0u16; want_rows.len() * d];
            s.read_rows_bf16(id(0, 0), Some(&want_rows), &mut some).unwrap();
            assert_eq!(some, bits(&gathered), "{what}: some rows");
            if budget.is_some() {
                assert_eq!(s.take_stats().row_reads, 1, "{what}: read from the file in part");
            }
            let mut all = vec![0u16; rows * d];
            s.read_rows_bf16(id(0, 0), None, &mut all).unwrap();
            assert_eq!(all, bits(&block), "{what}: every row");
            // bits put as they are: read back as f32 they are the values the bits hold
            let h = bits(&block[..10 * d]);
            s.put_bf16(id(1, 0), 10, d, &h).unwrap();
            s.put(id(1, 1), 1, d, vec![0.0; d]).unwrap();
            let mut back = vec![0f32; 10 * d];
            s.read_rows(id(1, 0), None, &mut back).unwrap();
            let held: Vec<f32> = h.iter().map(|&x| from_bf16(x)).collect();
            assert_eq!(
                back.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                held.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                "{what}"
            );
            let mut again = vec![0u16; 10 * d];
            s.read_rows_bf16(id(1, 0), None, &mut again).unwrap();
            assert_eq!(again, h, "{what}: the bits come back");
        }
    }
}

/// A block replaced, or removed and made again at its length, takes its predecessor's buffer
/// (no fresh pages to fault in) with exactly its own values; spares never take the store past
/// the most its blocks held at once, and go before any block is evicted.
#[test]
fn buffers_of_replaced_and_removed_blocks_are_reused_within_the_peak() {
    for dtype in [TierDtype::F32, TierDtype::Bf16] {
        let cfg = StoreConfig { budget: None, mode: CacheMode::LruLayer, dtype, faults: Faults::default() };
        let mut s = Store::<f32>::new(cfg, None, false).unwrap();
        let (rows, d) = (4096usize, 256usize); // 4 MiB as f32, 2 MiB as bf16
        let ptr = |s: &Store<f32>, i: BlockId| match s.entries[&i].data.as_ref().unwrap() {
            Data::Full(v) => v.as_ptr() as usize,
            Data::Bf16(v) => v.as_ptr() as usize,
        };
        let values = |k: f32| (0..rows * d).map(|i| (i % 7) as f32 + k).collect::<Vec<f32>>();
        let read = |s: &mut Store<f32>, i: BlockId| {
            let mut out = vec![0f32; rows * d];
            s.read_rows(i, None, &mut out).unwrap();
            out
        };
        s.put_slice(id(1, 0), rows, d, &values(0.0)).unwrap();
        let first = ptr(&s, id(1, 0));
        s.put_slice(id(1, 0), rows, d, &values(1.0)).unwrap();
        assert_eq!(ptr(&s, id(1, 0)), first, "{dtype:?}: a block replaced keeps its buffer");
        assert_eq!(read(&mut s, id(1, 0)), values(1.0));
        // removed, then a gradient block of the same length made at zero and added to
        s.remove(id(1, 0)).unwrap();
        let src = vec![2.0f32; 3 * d];
        s.add_rows(id(2, 3), rows, d, Some(&[5, 0, 4095]), &src).unwrap();
        assert_eq!(ptr(&s, id(2, 3)), first, "{dtype:?}: a block made again takes the spare");
        let got = read(&mut s, id(2, 3));
        for r in 0..rows {
            let want = if [0, 5, 4095].contains(&r) { 2.0 } else { 0.0 };
            assert!(got[r * d..(r + 1) * d].iter().all(|&x| x == want), "{dtype:?}: row {r}");
        }
        // a block of another length: the spare may not stay beside it past the peak
        s.put_bf16(id(3, 0), rows, d, &vec![0x3f80; rows * d]).unwrap();
        s.remove(id(3, 0)).unwrap();
        s.remove(id(2, 3)).unwrap();
        s.put_slice(id(4, 0), rows * 2, d, &vec![1.0; rows * 2 * d]).unwrap();
        assert!(
            s.resident + s.spare_bytes <= s.peak_live,
            "{dtype:?}: {} + {} > {}",
            s.resident,
            s.spare_bytes,
            s.peak_live
        );
    }
    // under a budget: a spare is reused there too, and goes before any block leaves RAM
    let dir = tempfile::tempdir().unwrap();
    let cfg = StoreConfig {
        budget: Some(3 << 20),
        mode: CacheMode::PartitionLru,
        dtype: TierDtype::F32,
        faults: Faults::default(),
    };
    let mut s = Store::<f32>::new(cfg, Some(dir.path()), false).unwrap();
    // blocks of 1 MiB; four once: the store has held 4 MiB (one block went to its file)
    let n = 1 << 18;
    for p in 0..4 {
        s.put_slice(id(0, p), 1, n, &vec![p as f32; n]).unwrap();
    }
    s.sync().unwrap();
    assert_eq!(s.take_stats().evictions, 1);
    s.remove(id(0, 3)).unwrap();
    assert_eq!(s.spare_bytes, 4 << 18, "within the peak, the spare is kept");
    s.put_slice(id(0, 4), 1, n, &vec![4.0; n]).unwrap();
    assert_eq!((s.spare_bytes, s.take_stats().evictions), (0, 0), "the spare was taken, no block left");
    s.remove(id(0, 4)).unwrap();
    assert_eq!(s.spare_bytes, 4 << 18);
    // a block of another length: the spare, not a block, makes room
    s.put_slice(id(0, 5), 1, n / 2, &vec![5.0; n / 2]).unwrap();
    assert_eq!(s.spare_bytes, 0, "the spare went");
    assert_eq!(s.take_stats().evictions, 0, "no block left RAM");
}

/// Rows added into a block, by each of `add_rows`' ways (a block's first rows, distinct rows,
/// rows that repeat), give a one-row-at-a-time reference's values exactly (repeats in order).
#[test]
fn rows_added_every_way_give_the_sequential_sums() {
    // 256 wide: 1,024 rows a parallel task, so rows past the first task's are checked too
    let (rows, d) = (3000usize, 256usize);
    let mut state = 7u64;
    let mut next = |m: u64| {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (state >> 33) % m
    };
    let base: Vec<f32> = (0..rows * d).map(|_| next(1000) as f32 / 64.0).collect();
    let distinct: Vec<u32> = {
        let mut v: Vec<u32> = (0..rows as u32).collect();
        for i in (1..v.len()).rev() {
            v.swap(i, next(i as u64 + 1) as usize);
        }
        v.truncate(1777);
        v
    };
    let repeated: Vec<u32> = (0..2500).map(|_| next(40) as u32 * 7).collect();
    for dtype in [TierDtype::F32, TierDtype::Bf16] {
        for idx in [None, Some(&distinct[..]), Some(&repeated[..])] {
            let k = idx.map_or(1234, |i| i.len());
            let src: Vec<f32> = (0..k * d).map(|_| next(1000) as f32 / 128.0 - 3.0).collect();
            let cfg =
                StoreConfig { budget: None, mode: CacheMode::LruLayer, dtype, faults: Faults::default() };
            let mut s = Store::<f32>::new(cfg, None, false).unwrap();
            s.put(id(0, 0), rows, d, base.clone()).unwrap();
            let mut want = vec![0f32; rows * d];
            s.read_rows(id(0, 0), None, &mut want).unwrap();
            for j in 0..k {
                let r = idx.map_or(j, |i| i[j] as usize);
                for c in 0..d {
                    let x = want[r * d + c] + src[j * d + c];
                    want[r * d + c] = if dtype == TierDtype::Bf16 { from_bf16(to_bf16(x)) } else { x };
                }
            }
            s.add_rows(id(0, 0), rows, d, idx, &src).unwrap();
            let mut got = vec![0f32; rows * d];
            s.read_rows(id(0, 0), None, &mut got).unwrap();
            let what = format!("{dtype:?}, {} rows", idx.map_or("first".into(), |i| i.len().to_string()));
            assert_eq!(
                got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                want.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                "{what}"
            );
        }
    }
}
