//! Parallel sorting of packed `(row << 32) | col` keys by radix partitioning: one scatter pass
//! into buckets of consecutive rows, then a cache-sized sort inside each bucket. This is what
//! turns edge lists into CSR rows without atomics, and its output order is fully determined by
//! the keys (not by thread scheduling).

use std::ops::Range;

use rayon::prelude::*;

/// Shared write pointer for the scatter pass.
#[derive(Clone, Copy)]
struct SharedMut(*mut u64);
// SAFETY: each (chunk, bucket) pair owns a disjoint range of the output computed from an exact
// histogram, so no two threads write the same element.
unsafe impl Send for SharedMut {}
// SAFETY: as above.
unsafe impl Sync for SharedMut {}

impl SharedMut {
    /// Through a method, closures capture the whole (Send + Sync) wrapper, not the raw field.
    fn at(self, i: usize) -> *mut u64 {
        self.0.wrapping_add(i)
    }
}

/// Entries per bucket aimed for: a bucket's sort then runs inside the L2 cache.
const BUCKET_TARGET: usize = 1 << 15;
const BUCKETS_MAX: usize = 1 << 16;

/// Sorts `keys` whose row part (`key >> 32`) lies in `rows`; optionally drops duplicates.
/// Returns the sorted keys.
pub fn sort_keys(keys: &[u64], rows: Range<u64>, dedup: bool) -> Vec<u64> {
    if keys.is_empty() {
        return Vec::new();
    }
    // bucket = (key - base) >> shift, with 2^(shift-32) rows per bucket
    let base = rows.start << 32;
    let span = (rows.end - rows.start).max(1);
    let want = (keys.len() / BUCKET_TARGET).clamp(1, BUCKETS_MAX) as u64;
    let rows_per = (span.div_ceil(want)).next_power_of_two().max(1);
    let shift = 32 + rows_per.trailing_zeros();
    let buckets = (span.div_ceil(rows_per)).max(1) as usize;
    let bucket = |k: u64| {
        debug_assert!(k >= base && (k >> 32) < rows.end, "key outside the row range");
        ((k - base) >> shift) as usize
    };
    let chunk = keys.len().div_ceil(rayon::current_num_threads() * 4).max(1 << 14);
    let chunks: Vec<&[u64]> = keys.chunks(chunk).collect();

    // 1. histogram of every chunk
    let hist: Vec<Vec<usize>> = chunks
        .par_iter()
        .map(|c| {
            let mut h = vec![0usize; buckets];
            for &k in *c {
                h[bucket(k)] += 1;
            }
            h
        })
        .collect();
    // 2. write offsets, bucket-major then chunk
    let mut offsets = vec![vec![0usize; buckets]; chunks.len()];
    let mut bucket_ptr = vec![0usize; buckets + 1];
    let mut acc = 0usize;
    for b in 0..buckets {
        bucket_ptr[b] = acc;
        for (c, h) in hist.iter().enumerate() {
            offsets[c][b] = acc;
            acc += h[b];
        }
    }
    bucket_ptr[buckets] = acc;
    // 3. scatter
    let mut out: Vec<u64> = Vec::with_capacity(keys.len());
    let dst = SharedMut(out.as_mut_ptr());
    chunks.par_iter().zip(offsets).for_each(|(c, mut off)| {
        for &k in *c {
            let b = bucket(k);
            // SAFETY: off[b] walks this chunk's exclusive range for bucket b (sized by the
            // histogram), which lies inside out's capacity of keys.len().
            unsafe { dst.at(off[b]).write(k) };
            off[b] += 1;
        }
    });
    // SAFETY: the histogram covers every key, so all keys.len() elements were written above.
    unsafe { out.set_len(keys.len()) };
    // 4. sort (and dedup) inside each bucket
    let mut pieces: Vec<&mut [u64]> = Vec::with_capacity(buckets);
    let mut rest = out.as_mut_slice();
    for b in 0..buckets {
        let (p, tail) = rest.split_at_mut(bucket_ptr[b + 1] - bucket_ptr[b]);
        pieces.push(p);
        rest = tail;
    }
    let kept: Vec<usize> = pieces
        .into_par_iter()
        .map(|p| {
            p.sort_unstable();
            if !dedup || p.len() < 2 {
                return p.len();
            }
            let mut k = 1;
            for j in 1..p.len() {
                if p[j] != p[k - 1] {
                    p[k] = p[j];
                    k += 1;
                }
            }
            k
        })
        .collect();
    if dedup {
        // compact buckets in order (in place: every bucket moves towards the front)
        let mut w = 0usize;
        for b in 0..buckets {
            let start = bucket_ptr[b];
            out.copy_within(start..start + kept[b], w);
            w += kept[b];
        }
        out.truncate(w);
    }
    out
}

/// Row pointer (length `rows.len() + 1`, local to `rows.start`) of sorted keys whose rows lie
/// in `rows`, from one parallel scan for row changes.
pub fn row_ptr_of_sorted(keys: &[u64], rows: Range<u64>) -> Vec<u64> {
    let first = rows.start as usize;
    let row = |i: usize| (keys[i] >> 32) as usize - first;
    let count = (rows.end - rows.start) as usize;
    let mut ptr = vec![0u64; count + 1];
    if keys.is_empty() {
        return ptr;
    }
    // every row change at position k (rows a → b) sets ptr[a+1..=b] = k
    let chunk = keys.len().div_ceil(rayon::current_num_threads() * 4).max(1 << 12);
    let changes: Vec<Vec<(usize, usize, u64)>> = (0..keys.len().div_ceil(chunk))
        .into_par_iter()
        .map(|c| {
            let (a, b) = (c * chunk, ((c + 1) * chunk).min(keys.len()));
            (a.max(1)..b)
                .filter(|&k| row(k) != row(k - 1))
                .map(|k| (row(k - 1) + 1, row(k), k as u64))
                .collect()
        })
        .collect();
    for (a, b, k) in changes.into_iter().flatten() {
        ptr[a..=b].fill(k);
    }
    ptr[row(keys.len() - 1) + 1..].fill(keys.len() as u64);
    ptr
}

/// Rows `rows` of a symmetric graph from its two halves: `lower` keys `(v << 32) | u` with
/// `u < v` and `upper` keys `(v << 32) | w` with `w > v`, each sorted, all rows in `rows`.
/// Row `v` is its lower part followed by its upper part, sorted without merging. Returns the
/// local row pointer and the columns.
pub fn assemble_rows(lower: &[u64], upper: &[u64], rows: Range<u64>) -> (Vec<u64>, Vec<u32>) {
    let (pl, pu) = (row_ptr_of_sorted(lower, rows.clone()), row_ptr_of_sorted(upper, rows));
    let ptr: Vec<u64> = pl.par_iter().zip(&pu).map(|(a, b)| a + b).collect();
    let mut cols = vec![0u32; lower.len() + upper.len()];
    let mut pieces = Vec::new();
    let mut rest = cols.as_mut_slice();
    for r in balanced_ranges(&ptr, rayon::current_num_threads() * 8) {
        let (c, tail) = rest.split_at_mut((ptr[r.end] - ptr[r.start]) as usize);
        pieces.push((r, c));
        rest = tail;
    }
    pieces.into_par_iter().for_each(|(r, c)| {
        let mut w = 0;
        for v in r {
            let l = &lower[pl[v] as usize..pl[v + 1] as usize];
            let u = &upper[pu[v] as usize..pu[v + 1] as usize];
            for k in l.iter().chain(u) {
                c[w] = *k as u32;
                w += 1;
            }
        }
    });
    (ptr, cols)
}

/// Row ranges of roughly equal `rows + edges` weight.
pub(crate) fn balanced_ranges(ptr: &[u64], parts: usize) -> Vec<std::ops::Range<usize>> {
    let n = ptr.len() - 1;
    let parts = parts.max(1);
    let total = ptr[n] + n as u64;
    let mut out = Vec::with_capacity(parts);
    let mut start = 0usize;
    for k in 1..=parts {
        let target = total * k as u64 / parts as u64;
        // smallest end with ptr[end] + end >= target
        let (mut lo, mut hi) = (start, n);
        while lo < hi {
            let mid = (lo + hi) / 2;
            if ptr[mid] + (mid as u64) < target {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        let end = if k == parts { n } else { lo };
        if end > start {
            out.push(start..end);
            start = end;
        }
    }
    if out.is_empty() {
        out.push(0..n);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Stream;

    #[test]
    fn balanced_ranges_cover_all_rows() {
        let ptr = vec![0, 100, 100, 101, 102, 300, 301];
        for parts in 1..10 {
            let r = balanced_ranges(&ptr, parts);
            assert_eq!(r.first().unwrap().start, 0);
            assert_eq!(r.last().unwrap().end, 6);
            assert!(r.windows(2).all(|w| w[0].end == w[1].start));
        }
    }

    #[test]
    fn equals_std_sort_with_and_without_dedup() {
        for (n, rows) in [(0usize, 5u64), (10, 3), (100_000, 1000), (300_000, 50_000), (200_000, 1)] {
            let mut s = Stream::new(&[n as u64]);
            let keys: Vec<u64> = (0..n).map(|_| (s.below(rows) << 32) | s.below(64)).collect();
            let mut want = keys.clone();
            want.sort_unstable();
            assert_eq!(sort_keys(&keys, 0..rows, false), want);
            want.dedup();
            let got = sort_keys(&keys, 0..rows, true);
            assert_eq!(got, want);
            let ptr = row_ptr_of_sorted(&got, 0..rows);
            for r in 0..rows as usize {
                assert!(got[ptr[r] as usize..ptr[r + 1] as usize].iter().all(|&k| (k >> 32) as usize == r));
            }
            // a sub-range of rows, offset
            let lo = rows / 2;
            let part: Vec<u64> = keys.iter().copied().filter(|k| k >> 32 >= lo).collect();
            let mut want: Vec<u64> = part.clone();
            want.sort_unstable();
            assert_eq!(sort_keys(&part, lo..rows, false), want);
            let ptr = row_ptr_of_sorted(&want, lo..rows);
            assert_eq!(ptr.len() as u64, rows - lo + 1);
            assert_eq!(*ptr.last().unwrap(), want.len() as u64);
        }
    }
}
