//! What the process holds: the resident set (peak and now), the size at start-up, the mapped
//! dataset, and the heap in use as the counting allocator ([`crate::heap`]) sees it — what the
//! memory plan counts.

/// Peak resident set size of this process (Linux `VmHWM`; 0 where unavailable).
pub fn peak_rss_bytes() -> u64 {
    status_bytes("VmHWM:")
}

static START_BYTES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Records what the process holds before it has loaded anything (code, libraries, runtime):
/// the base of [`held_bytes`]. Called first thing by the binary.
///
/// Its anonymous memory as it is, and its mapped files (the binary, the libraries) whole: the
/// resident part of those moves with the kernel's fault-around — up to 1 MiB between identical
/// runs, which moved the least `--host-mem` a refusal names — while their size does not. The
/// whole is an upper bound of what they can hold (about 17 MiB where 4 are resident).
pub fn mark_process_start() {
    let base = status_bytes("RssAnon:") + status_bytes("RssShmem:") + file_mapped_bytes().unwrap_or(0);
    let base = if base == 0 { rss_bytes() } else { base };
    START_BYTES.store(base, std::sync::atomic::Ordering::Relaxed);
}

/// The total size of the process's file-backed mappings (`/proc/self/maps` entries with an
/// inode).
fn file_mapped_bytes() -> Option<u64> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    let mut total = 0;
    for line in maps.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() >= 6 && f[4] != "0" {
            let (a, b) = f[0].split_once('-')?;
            total += u64::from_str_radix(b, 16).ok()?.checked_sub(u64::from_str_radix(a, 16).ok()?)?;
        }
    }
    Some(total)
}

/// Bytes of `ds` in memory-mapped files that stay resident through training (touched by
/// verification and training): labels and splits; of features viewed from a file, the piece a
/// read holds before handing the pages back ([`crate::features::FEATURE_PAGES_BYTES`]). Not
/// the graph's structure: the executor hands its pages back once the partitions' graphs are
/// made, before it plans.
pub fn mapped_bytes(ds: &grinnder_graph::Dataset) -> u64 {
    let size = |mapped: bool, bytes: usize| if mapped { bytes as u64 } else { 0 };
    let s = &ds.splits;
    let f = &ds.features.data;
    let features = if f.is_file_view() {
        f.bytes().min(crate::features::FEATURE_PAGES_BYTES as u64)
    } else {
        size(f.is_mapped(), f.bytes() as usize)
    };
    features
        + size(ds.labels.is_mapped(), ds.labels.len() * 4)
        + [&s.train, &s.valid, &s.test].iter().map(|b| size(b.is_mapped(), b.len() * 4)).sum::<u64>()
}

/// What the process holds, counted by construction where the counting allocator is installed
/// ([`crate::heap`]): the base at start-up, the heap in use and the mapped dataset (`mapped`).
/// Unlike a sampled RSS it leaves out what the allocator keeps of freed memory, so identical
/// runs plan alike. Without the counting allocator: the RSS now.
pub fn held_bytes(mapped: u64) -> u64 {
    match crate::heap::live_bytes() {
        Some(live) => START_BYTES.load(std::sync::atomic::Ordering::Relaxed) + live + mapped,
        None => rss_bytes(),
    }
}

/// Resident set size of this process now (Linux `VmRSS`; 0 where unavailable).
pub fn rss_bytes() -> u64 {
    status_bytes("VmRSS:")
}

/// A kB field of `/proc/self/status`, in bytes.
fn status_bytes(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}
