//! Compressed sparse rows: the graph's adjacency.
//!
//! Row `v` lists the *sources* of the edges that point into `v` (its in-neighbours), sorted
//! ascending; message passing pulls along a row. For the symmetric graphs of node-property tasks
//! rows are simply neighbour lists. Offsets are 64-bit, node ids 32-bit: a graph holds at most
//! [`MAX_NODES`] nodes and any number of edges that fits in memory or a mapped file.
//!
//! Invariants kept by every constructor: `row_ptr.len() == n + 1`, `row_ptr[0] == 0`,
//! non-decreasing, `row_ptr[n] == col_idx.len()`, every column `< n`, each row sorted
//! strictly ascending (no duplicates).

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};

use rayon::prelude::*;

use crate::buf::Buf;
use crate::error::{GraphError, Result};
use crate::sort::{balanced_ranges, row_ptr_of_sorted, sort_keys};

/// Largest node count: node ids are `u32` and `u32::MAX` is kept free as a sentinel.
pub const MAX_NODES: u64 = u32::MAX as u64;

/// What to do with self loops when building.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum SelfLoops {
    /// Remove every `v → v` edge (what OGB's loaders and PyG's conv layers expect as input).
    #[default]
    Drop,
    /// Keep those present in the input.
    Keep,
    /// Make sure every node has exactly one `v → v` edge.
    Add,
}

/// How an edge list becomes a CSR.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BuildOptions {
    /// Add `v → u` for every `u → v`.
    pub symmetrise: bool,
    /// Treat repeated edges as one.
    pub dedup: bool,
    pub self_loops: SelfLoops,
}

impl Default for BuildOptions {
    /// Symmetrised, deduplicated, no self loops: the convention of node-property benchmarks.
    fn default() -> Self {
        BuildOptions { symmetrise: true, dedup: true, self_loops: SelfLoops::Drop }
    }
}

/// A graph's adjacency in CSR form (see the module docs for the invariants).
#[derive(Clone, Debug, PartialEq)]
pub struct Csr {
    row_ptr: Buf<u64>,
    col_idx: Buf<u32>,
}

impl Csr {
    /// Builds from edges `src[i] → dst[i]` over `num_nodes` nodes, in parallel.
    ///
    /// Errors when `num_nodes` exceeds [`MAX_NODES`] or an endpoint is out of range.
    pub fn from_edges(num_nodes: u64, src: &[u32], dst: &[u32], opts: BuildOptions) -> Result<Csr> {
        check_node_count(num_nodes)?;
        assert_eq!(src.len(), dst.len(), "src and dst must have equal length");
        let n = num_nodes as usize;
        if let Some(i) =
            (0..src.len()).into_par_iter().find_first(|&i| src[i] as usize >= n || dst[i] as usize >= n)
        {
            return Err(GraphError::Usage(format!(
                "edge {i} ({} -> {}) has an endpoint >= the node count {n}",
                src[i], dst[i]
            )));
        }
        Ok(Csr::from_pairs(num_nodes, src.len(), |i| (src[i], dst[i]), opts))
    }

    /// Builds from `len` directed edges, edge `i` being `pair(i) = (source, target)` with both
    /// endpoints already checked below `num_nodes` (a caller's arrays read in place: no copy
    /// of the edge list). The sort keys are written into one allocation of their exact size
    /// (counted first): a parallel `collect` of a flat map concatenates per-thread vectors,
    /// holding the keys twice — 3.7 GiB more at products-like's 124 M edges.
    pub(crate) fn from_pairs(
        num_nodes: u64,
        len: usize,
        pair: impl Fn(usize) -> (u32, u32) + Sync,
        opts: BuildOptions,
    ) -> Csr {
        let n = num_nodes as usize;
        let keep = |s: u32, d: u32| s != d || opts.self_loops == SelfLoops::Keep;
        let sym = opts.symmetrise;
        // keys of edge i: (target << 32) | source, and the reverse where symmetrised
        let count = |(s, d): (u32, u32)| usize::from(keep(s, d)) + usize::from(keep(s, d) && sym && s != d);
        let chunk = len.div_ceil(rayon::current_num_threads() * 4).max(1 << 16);
        let ranges: Vec<Range<usize>> = (0..len).step_by(chunk).map(|a| a..(a + chunk).min(len)).collect();
        let counts: Vec<usize> = ranges.par_iter().map(|r| r.clone().map(|i| count(pair(i))).sum()).collect();
        let loops = if opts.self_loops == SelfLoops::Add { n } else { 0 };
        let mut keys = vec![0u64; counts.iter().sum::<usize>() + loops];
        let mut rest = keys.as_mut_slice();
        let mut outs = Vec::with_capacity(ranges.len());
        for &c in &counts {
            let (out, tail) = rest.split_at_mut(c);
            outs.push(out);
            rest = tail;
        }
        outs.into_par_iter().zip(ranges).for_each(|(out, r)| {
            let mut k = 0;
            for i in r {
                let (s, d) = pair(i);
                if keep(s, d) {
                    out[k] = ((d as u64) << 32) | s as u64;
                    k += 1;
                    if sym && s != d {
                        out[k] = ((s as u64) << 32) | d as u64;
                        k += 1;
                    }
                }
            }
        });
        rest.par_iter_mut().enumerate().for_each(|(v, k)| *k = ((v as u64) << 32) | v as u64);
        let dedup = opts.dedup || opts.self_loops == SelfLoops::Add;
        let sorted = sort_keys(&keys, 0..num_nodes, dedup);
        drop(keys);
        Csr::from_sorted_keys(&sorted, n)
    }

    /// Builds from packed `(row << 32) | col` keys sorted ascending without duplicates.
    pub(crate) fn from_sorted_keys(keys: &[u64], n: usize) -> Csr {
        let row_ptr = row_ptr_of_sorted(keys, 0..n as u64);
        let col_idx: Vec<u32> = keys.par_iter().map(|&k| k as u32).collect();
        Csr { row_ptr: Buf::Owned(row_ptr), col_idx: Buf::Owned(col_idx) }
    }

    /// Wraps arrays a constructor of this crate produced; the invariants are checked in debug
    /// builds only.
    pub(crate) fn from_trusted(row_ptr: Vec<u64>, col_idx: Vec<u32>) -> Csr {
        let csr = Csr { row_ptr: Buf::Owned(row_ptr), col_idx: Buf::Owned(col_idx) };
        debug_assert!(Csr::from_parts(csr.row_ptr.clone(), csr.col_idx.clone()).is_ok());
        csr
    }

    /// The same graph with its arrays on huge pages ([`Buf::on_huge_pages`]): for samplers,
    /// whose reads land anywhere in the arrays.
    pub fn on_huge_pages(&self) -> std::io::Result<Csr> {
        Ok(Csr { row_ptr: self.row_ptr.on_huge_pages()?, col_idx: self.col_idx.on_huge_pages()? })
    }

    /// Wraps existing arrays after checking every invariant (used by loaders of prebuilt CSRs).
    pub fn from_parts(row_ptr: Buf<u64>, col_idx: Buf<u32>) -> std::result::Result<Csr, String> {
        if row_ptr.is_empty() {
            return Err("row_ptr is empty".into());
        }
        let n = row_ptr.len() - 1;
        check_node_count(n as u64).map_err(|e| e.to_string())?;
        if row_ptr[0] != 0 || row_ptr[n] != col_idx.len() as u64 {
            return Err(format!(
                "row_ptr must start at 0 and end at the edge count {} (found {} .. {})",
                col_idx.len(),
                row_ptr[0],
                row_ptr[n]
            ));
        }
        let bad_row = (0..n).into_par_iter().find_first(|&v| {
            let (a, b) = (row_ptr[v], row_ptr[v + 1]);
            if a > b || b > col_idx.len() as u64 {
                return true;
            }
            let row = &col_idx[a as usize..b as usize];
            row.windows(2).any(|w| w[0] >= w[1]) || row.last().is_some_and(|&c| c as usize >= n)
        });
        if let Some(v) = bad_row {
            return Err(format!("row {v} is not a strictly ascending list of node ids below {n}"));
        }
        Ok(Csr { row_ptr, col_idx })
    }

    pub fn num_nodes(&self) -> usize {
        self.row_ptr.len() - 1
    }

    /// Number of stored (directed) edges.
    pub fn num_edges(&self) -> usize {
        self.col_idx.len()
    }

    /// Whether the structure is a view of a memory-mapped file (else owned).
    pub fn is_mapped(&self) -> bool {
        self.row_ptr.is_mapped() || self.col_idx.is_mapped()
    }

    /// Hands the pages of a mapped structure back to the system (`MADV_DONTNEED`, see
    /// [`crate::buf::Buf::release`]): they leave the resident set and are read again from the
    /// file if touched. Owned memory stays as it is.
    pub fn release_pages(&self) {
        self.row_ptr.release_all();
        self.col_idx.release_all();
    }

    pub fn row_ptr(&self) -> &[u64] {
        &self.row_ptr
    }

    pub fn col_idx(&self) -> &[u32] {
        &self.col_idx
    }

    /// The in-neighbours of `v`, ascending.
    pub fn row(&self, v: usize) -> &[u32] {
        &self.col_idx[self.row_ptr[v] as usize..self.row_ptr[v + 1] as usize]
    }

    /// In-degree of every node (row lengths).
    pub fn degrees(&self) -> Vec<u32> {
        self.row_ptr.par_windows(2).map(|w| (w[1] - w[0]) as u32).collect()
    }

    /// Out-degree of every node (how often it appears as a column).
    pub fn out_degrees(&self) -> Vec<u32> {
        let counts: Vec<AtomicU64> = (0..self.num_nodes()).map(|_| AtomicU64::new(0)).collect();
        self.col_idx.par_iter().for_each(|&c| {
            counts[c as usize].fetch_add(1, Ordering::Relaxed);
        });
        counts.into_iter().map(|c| c.into_inner() as u32).collect()
    }

    /// True when `u → v` exists for every `v → u`.
    pub fn is_symmetric(&self) -> bool {
        (0..self.num_nodes())
            .into_par_iter()
            .all(|v| self.row(v).iter().all(|&u| self.row(u as usize).binary_search(&(v as u32)).is_ok()))
    }

    /// The same graph with `v → u` added for every `u → v` (deduplicated, no self loops): a
    /// directed graph's structure for partitioners, whose cut is the same in either direction.
    pub fn symmetrised(&self) -> Csr {
        let ptr = self.row_ptr();
        let row_of = |e: usize| (ptr.partition_point(|&p| p <= e as u64) - 1) as u32;
        Csr::from_pairs(
            self.num_nodes() as u64,
            self.num_edges(),
            |e| (self.col_idx[e], row_of(e)),
            BuildOptions::default(),
        )
    }

    /// Number of self loops.
    pub fn num_self_loops(&self) -> usize {
        (0..self.num_nodes())
            .into_par_iter()
            .filter(|&v| self.row(v).binary_search(&(v as u32)).is_ok())
            .count()
    }

    /// A copy with one self loop on every node.
    pub fn with_self_loops(&self) -> Csr {
        // rows are strictly ascending: each row of the result is the row with `v` merged in
        // where it is missing, written on every core (before: the edge list rebuilt and sorted
        // again, 2–3 s of a 10 M-node setup on 16 cores)
        let n = self.num_nodes();
        let has_loop = |v: usize| self.row(v).binary_search(&(v as u32)).is_ok();
        let mut row_ptr = vec![0u64; n + 1];
        row_ptr[1..]
            .par_iter_mut()
            .enumerate()
            .for_each(|(v, len)| *len = self.row(v).len() as u64 + u64::from(!has_loop(v)));
        for v in 0..n {
            row_ptr[v + 1] += row_ptr[v];
        }
        let mut col_idx = vec![0u32; row_ptr[n] as usize];
        let mut pieces = Vec::new();
        let mut rest = &mut col_idx[..];
        for rows in balanced_ranges(&row_ptr, rayon::current_num_threads() * 8) {
            let (piece, tail) =
                std::mem::take(&mut rest).split_at_mut((row_ptr[rows.end] - row_ptr[rows.start]) as usize);
            pieces.push((rows, piece));
            rest = tail;
        }
        pieces.into_par_iter().for_each(|(rows, out)| {
            let mut at = 0;
            for v in rows {
                let row = self.row(v);
                let below = row.partition_point(|&c| (c as usize) < v);
                let above = if row.get(below) == Some(&(v as u32)) { below + 1 } else { below };
                out[at..at + below].copy_from_slice(&row[..below]);
                out[at + below] = v as u32;
                at += below + 1;
                out[at..at + row.len() - above].copy_from_slice(&row[above..]);
                at += row.len() - above;
            }
        });
        Csr { row_ptr: row_ptr.into(), col_idx: col_idx.into() }
    }

    /// The edge list `(src, dst)` in row order.
    pub fn to_coo(&self) -> (Vec<u32>, Vec<u32>) {
        let dst: Vec<u32> = (0..self.num_nodes())
            .into_par_iter()
            .flat_map_iter(|v| std::iter::repeat_n(v as u32, self.row(v).len()))
            .collect();
        (self.col_idx.to_vec(), dst)
    }

    /// Splits the rows into about `parts` contiguous ranges of similar edge counts, for
    /// parallel loops over rows whose lengths vary widely.
    pub fn balanced_row_ranges(&self, parts: usize) -> Vec<std::ops::Range<usize>> {
        balanced_ranges(&self.row_ptr, parts)
    }
}

pub(crate) fn check_node_count(n: u64) -> Result<()> {
    if n > MAX_NODES {
        return Err(GraphError::Limit { what: "node count".into(), value: n, max: MAX_NODES });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn serial_reference(n: usize, edges: &[(u32, u32)], opts: BuildOptions) -> Vec<Vec<u32>> {
        let mut rows = vec![Vec::new(); n];
        for &(s, d) in edges {
            if s == d && opts.self_loops != SelfLoops::Keep {
                continue;
            }
            rows[d as usize].push(s);
            if opts.symmetrise && s != d {
                rows[s as usize].push(d);
            }
        }
        for (v, r) in rows.iter_mut().enumerate() {
            if opts.self_loops == SelfLoops::Add {
                r.push(v as u32);
            }
            r.sort_unstable();
            if opts.dedup || opts.self_loops == SelfLoops::Add {
                r.dedup();
            }
        }
        rows
    }

    proptest::proptest! {
        #[test]
        fn parallel_build_equals_serial_reference(
            n in 1usize..40,
            raw in proptest::collection::vec((0u32..40, 0u32..40), 0..200),
            symmetrise: bool,
            dedup: bool,
            loops in 0u8..3,
        ) {
            let edges: Vec<(u32, u32)> = raw.into_iter().map(|(a, b)| (a % n as u32, b % n as u32)).collect();
            let self_loops = [SelfLoops::Drop, SelfLoops::Keep, SelfLoops::Add][loops as usize];
            let opts = BuildOptions { symmetrise, dedup, self_loops };
            let (s, d): (Vec<u32>, Vec<u32>) = edges.iter().copied().unzip();
            let csr = Csr::from_edges(n as u64, &s, &d, opts).unwrap();
            let want = serial_reference(n, &edges, opts);
            for (v, row) in want.iter().enumerate() {
                proptest::prop_assert_eq!(csr.row(v), row.as_slice());
            }
            if !symmetrise && dedup && self_loops == SelfLoops::Drop {
                let sym = BuildOptions { symmetrise: true, ..opts };
                proptest::prop_assert_eq!(csr.symmetrised(), Csr::from_edges(n as u64, &s, &d, sym).unwrap());
            }
            if symmetrise && dedup {
                proptest::prop_assert!(csr.is_symmetric());
                proptest::prop_assert!(Csr::from_parts(csr.row_ptr.clone(), csr.col_idx.clone()).is_ok());
            }
        }
    }

    proptest::proptest! {
        #[test]
        fn self_loops_merged_in_equal_the_rebuilt_edge_list(
            n in 1usize..40,
            raw in proptest::collection::vec((0u32..40, 0u32..40), 0..200),
            loops in 0u8..2,
        ) {
            let edges: Vec<(u32, u32)> = raw.into_iter().map(|(a, b)| (a % n as u32, b % n as u32)).collect();
            let self_loops = [SelfLoops::Drop, SelfLoops::Keep][loops as usize];
            let opts = BuildOptions { symmetrise: false, dedup: true, self_loops };
            let (s, d): (Vec<u32>, Vec<u32>) = edges.iter().copied().unzip();
            let csr = Csr::from_edges(n as u64, &s, &d, opts).unwrap();
            // what with_self_loops built before: the edge list again, with self loops added
            let add = BuildOptions { self_loops: SelfLoops::Add, ..opts };
            let (src, dst) = csr.to_coo();
            let want = Csr::from_edges(n as u64, &src, &dst, add).unwrap();
            proptest::prop_assert_eq!(csr.with_self_loops(), want);
        }
    }

    #[test]
    fn rejects_out_of_range_and_oversized() {
        assert!(Csr::from_edges(3, &[0, 3], &[1, 1], BuildOptions::default()).is_err());
        let err = Csr::from_edges(MAX_NODES + 1, &[], &[], BuildOptions::default()).unwrap_err();
        assert!(matches!(err, GraphError::Limit { .. }), "{err}");
    }

    #[test]
    fn self_loops_and_degrees() {
        let csr = Csr::from_edges(4, &[0, 1, 2, 2], &[1, 2, 0, 2], BuildOptions::default()).unwrap();
        assert_eq!(csr.num_edges(), 6);
        assert_eq!(csr.num_self_loops(), 0);
        assert_eq!(csr.degrees(), vec![2, 2, 2, 0]);
        let looped = csr.with_self_loops();
        assert_eq!(looped.num_self_loops(), 4);
        assert_eq!(looped.row(3), &[3]);
        assert_eq!(looped.row(0), &[0, 1, 2]);
    }

    #[test]
    fn from_parts_rejects_broken_rows() {
        assert!(Csr::from_parts(vec![0, 2].into(), vec![1, 0].into()).is_err());
        assert!(Csr::from_parts(vec![0, 1].into(), vec![5].into()).is_err());
        assert!(Csr::from_parts(vec![0, 3].into(), vec![0].into()).is_err());
        assert!(Csr::from_parts(vec![0, 1, 1].into(), vec![1].into()).is_ok());
    }

    #[test]
    fn a_copy_on_huge_pages_is_the_same_graph() {
        let edges: Vec<(u32, u32)> = (0..5000u32).map(|i| (i % 997, (i * 31 + 7) % 997)).collect();
        let (src, dst): (Vec<u32>, Vec<u32>) = edges.into_iter().unzip();
        let g = Csr::from_edges(997, &src, &dst, BuildOptions::default()).unwrap();
        let h = g.on_huge_pages().unwrap();
        assert_eq!(h.row_ptr(), g.row_ptr());
        assert_eq!(h.col_idx(), g.col_idx());
        assert!(h.col_idx.is_mapped(), "the copy lives in its own mapping");
    }
}
