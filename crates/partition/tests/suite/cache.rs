//! The partition cache: a second run hits; stale or corrupted files are detected and rebuilt.

use grinnder_graph::{BuildOptions, Csr};
use grinnder_partition::{partition, partition_cached, CacheOutcome, Method};

fn graph() -> Csr {
    let src: Vec<u32> = (0..200).map(|i| (i * 7) % 100).collect();
    let dst: Vec<u32> = (0..200).map(|i| (i * 13 + 5) % 100).collect();
    Csr::from_edges(100, &src, &dst, BuildOptions::default()).unwrap()
}

#[test]
fn hits_and_rebuilds() {
    let g = graph();
    let dir = tempfile::tempdir().unwrap();
    let m = Method::Metis { seed: 1 };
    let (p1, o1) = partition_cached(&g, 4, m, Some(dir.path())).unwrap();
    let CacheOutcome::Stored(file) = o1 else { panic!("first run stores: {o1:?}") };
    let (p2, o2) = partition_cached(&g, 4, m, Some(dir.path())).unwrap();
    assert_eq!(o2, CacheOutcome::Hit(file.clone()));
    assert_eq!(p1, p2);
    assert_eq!(p1, partition(&g, 4, m).unwrap());
    // other parameters: another file
    let (_, o3) = partition_cached(&g, 5, m, Some(dir.path())).unwrap();
    assert!(matches!(o3, CacheOutcome::Stored(ref f) if f != &file));
    // corrupted: a flipped bit anywhere is found and the file rebuilt
    for at in [0usize, 9, 40, 100] {
        let mut b = std::fs::read(&file).unwrap();
        b[at] ^= 0x04;
        std::fs::write(&file, &b).unwrap();
        let (p, o) = partition_cached(&g, 4, m, Some(dir.path())).unwrap();
        assert!(matches!(o, CacheOutcome::Rebuilt(..)), "byte {at}: {o:?}");
        assert_eq!(p, p1);
    }
    // truncated
    let b = std::fs::read(&file).unwrap();
    std::fs::write(&file, &b[..b.len() - 5]).unwrap();
    let (_, o) = partition_cached(&g, 4, m, Some(dir.path())).unwrap();
    let CacheOutcome::Rebuilt(_, why) = o else { panic!("{o:?}") };
    assert!(why.contains("truncated"), "{why}");
    assert_eq!(partition_cached(&g, 4, m, Some(dir.path())).unwrap().1, CacheOutcome::Hit(file));
}
