//! Synthetic graphs with community structure and predictive features (the presets of
//! docs/datasets.md).
//!
//! Model: a degree-corrected stochastic block model. Every node gets a community (sizes follow
//! a gentle power law) and a weight θ from a capped Pareto distribution (heavy-tailed degrees).
//! Communities are cut into blocks of `block` nodes (a second, finer level of locality, as the
//! categories and sub-categories of a co-purchase graph). Each undirected edge picks its first end
//! with probability ∝ θ, and its second end ∝ θ inside the first end's block with probability
//! `local`, inside its community with probability `intra`, else over all nodes. Duplicates and
//! self loops are removed and the pair set is topped up, then thinned evenly, so the graph has
//! exactly the preset's edge count. Labels are the community's class, replaced by a random
//! class with probability `label_noise`; features are class-conditional Gaussians.
//!
//! Invariant: the output is a pure function of the configuration and the seed — every random
//! value comes from a counter-based stream keyed by (seed, purpose, index), never from thread
//! scheduling.

use std::sync::Arc;

use rand_distr::{Distribution, StandardNormal};
use rayon::prelude::*;

use crate::csr::Csr;
use crate::dataset::Splits;
use crate::error::{GraphError, Result};
use crate::io::native::FeatureSource;
use crate::progress;
use crate::rng::{hash_key, unit_f64, Stream};
use crate::sort::{assemble_rows, sort_keys};

/// Sizes of a benchmark preset (docs/datasets.md, generated graphs).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Preset {
    pub name: &'static str,
    pub nodes: u64,
    /// Directed edges after symmetrisation (each undirected edge counted twice).
    pub edges: u64,
    pub feat: usize,
    pub classes: u32,
    /// Fractions of nodes in train / valid / test.
    pub split: (f64, f64, f64),
}

pub const PRESETS: [Preset; 4] = [
    Preset {
        name: "arxiv-like",
        nodes: 169_343,
        edges: 2_332_486,
        feat: 128,
        classes: 40,
        split: (0.54, 0.18, 0.28),
    },
    Preset {
        name: "products-like",
        nodes: 2_449_029,
        edges: 123_718_280,
        feat: 100,
        classes: 47,
        split: (0.08, 0.02, 0.90),
    },
    Preset {
        name: "igb-medium-like",
        nodes: 10_000_000,
        edges: 120_077_694,
        feat: 1024,
        classes: 19,
        split: (0.60, 0.20, 0.20),
    },
    Preset {
        name: "papers-like",
        nodes: 111_059_956,
        edges: 1_615_685_872 * 2,
        feat: 128,
        classes: 172,
        split: (0.011, 0.001, 0.002),
    },
];

/// Looks a preset up by name.
pub fn preset(name: &str) -> Result<Preset> {
    PRESETS.iter().copied().find(|p| p.name == name).ok_or_else(|| {
        let names: Vec<&str> = PRESETS.iter().map(|p| p.name).collect();
        GraphError::Usage(format!("unknown preset {name:?}; choose one of {}", names.join(", ")))
    })
}

/// Everything that determines a generated graph.
#[derive(Clone, Debug, PartialEq)]
pub struct GenConfig {
    pub preset: Preset,
    /// Multiplies nodes and edges (average degree is kept).
    pub scale: f64,
    pub seed: u64,
    /// Probability that an edge's second end is drawn inside its first end's block.
    pub local: f64,
    /// Probability that it is drawn inside its first end's community (anywhere in it).
    pub intra: f64,
    /// Nodes per block (communities are cut into consecutive blocks of this size).
    pub block: u64,
    /// Probability that a node's label is a random class instead of its community's.
    pub label_noise: f64,
    /// Pareto exponent of the degree weights (larger: lighter tail).
    pub degree_exponent: f64,
    /// Distance between class means, in units of the per-feature noise.
    pub class_separation: f64,
    /// Candidate pairs are held in row ranges of at most about this many bytes each; it bounds
    /// the working memory beyond the candidates themselves (the output does not depend on it).
    pub range_bytes_max: u64,
}

impl GenConfig {
    /// The defaults for `preset` at `scale` and `seed`.
    pub fn new(preset: Preset, scale: f64, seed: u64) -> Self {
        GenConfig {
            preset,
            scale,
            seed,
            local: 0.6,
            intra: 0.35,
            block: 4096,
            label_noise: 0.1,
            degree_exponent: 2.5,
            class_separation: 4.0,
            range_bytes_max: 1 << 30,
        }
    }

    /// `(nodes, directed edges)` after scaling; the edge count is even (pairs).
    pub fn sizes(&self) -> Result<(u64, u64)> {
        if !(self.scale > 0.0 && self.scale.is_finite()) {
            return Err(GraphError::Usage(format!("scale must be positive, got {}", self.scale)));
        }
        let n = ((self.preset.nodes as f64 * self.scale).round() as u64).max(self.preset.classes as u64 * 2);
        crate::csr::check_node_count(n)?;
        let e = ((self.preset.edges as f64 * self.scale / 2.0).round() as u64) * 2;
        let max_pairs = n * (n - 1) / 2;
        if e / 2 > max_pairs / 4 {
            return Err(GraphError::Usage(format!(
                "scale {} leaves too few nodes ({n}) for {e} edges",
                self.scale
            )));
        }
        Ok((n, e))
    }
}

/// A generated graph; features are produced on demand (see [`GenFeatures`]).
pub struct Generated {
    pub name: String,
    pub graph: Csr,
    pub labels: Vec<i32>,
    pub num_classes: u32,
    pub splits: Splits,
    pub features: GenFeatures,
}

/// What [`generate_streaming`] returns: everything but the columns, which went to the sink.
pub struct GeneratedParts {
    pub name: String,
    pub row_ptr: Vec<u64>,
    pub labels: Vec<i32>,
    pub num_classes: u32,
    pub splits: Splits,
    pub features: GenFeatures,
}

// stream purposes
const WEIGHT: u64 = 2;
const EDGES: u64 = 3;
const LABEL: u64 = 4;
const SPLIT: u64 = 5;
const MEAN: u64 = 6;
const FEATURE: u64 = 7;
const SHUFFLE: u64 = 8;

/// Walker/Vose alias table: O(1) sampling from a discrete distribution, one cache line
/// touched per draw (threshold and alias interleaved).
struct Alias {
    entries: Vec<(u32, u32)>,
}

impl Alias {
    fn new(w: &[f64]) -> Alias {
        let n = w.len();
        let total: f64 = w.iter().sum();
        let mut prob: Vec<f64> = w.iter().map(|x| x * n as f64 / total).collect();
        let mut alias: Vec<u32> = (0..n as u32).collect();
        let (mut small, mut large): (Vec<u32>, Vec<u32>) =
            (0..n as u32).partition(|&i| prob[i as usize] < 1.0);
        while let (Some(s), Some(&l)) = (small.pop(), large.last()) {
            alias[s as usize] = l;
            prob[l as usize] -= 1.0 - prob[s as usize];
            if prob[l as usize] < 1.0 {
                large.pop();
                small.push(l);
            }
        }
        let threshold = |p: f64| (p.clamp(0.0, 1.0) * u32::MAX as f64) as u32;
        Alias { entries: prob.into_iter().zip(alias).map(|(p, a)| (threshold(p), a)).collect() }
    }
}

/// The alias entries `threshold | alias << 32` in an anonymous mapping backed by huge pages
/// where the kernel allows: random draws over tens of MB otherwise miss the TLB on every look-up.
struct HugeTable {
    map: memmap2::MmapMut,
    len: usize,
}

impl HugeTable {
    fn new(entries: &[(u32, u32)]) -> HugeTable {
        let len = entries.len();
        let mut map =
            memmap2::MmapMut::map_anon((len * 8).max(8)).expect("anonymous mapping for the alias table");
        #[cfg(target_os = "linux")]
        let _ = map.advise(memmap2::Advice::HugePage);
        for (chunk, e) in map.chunks_exact_mut(8).zip(entries) {
            chunk.copy_from_slice(&(e.0 as u64 | (e.1 as u64) << 32).to_le_bytes());
        }
        HugeTable { map, len }
    }

    #[inline(always)]
    fn get(&self, i: usize) -> u64 {
        assert!(i < self.len);
        // SAFETY: i < len and the mapping holds len little-endian u64 values; mmap is
        // page-aligned, so the u64 read is aligned.
        unsafe { (self.map.as_ptr() as *const u64).add(i).read() }
    }
}

/// A bijection of `0..n` computed arithmetically: `i ↦ (a·i + b) mod n` with `gcd(a, n) = 1`.
/// Model indices are grouped by community; node ids are their images, so communities are
/// scattered over the id space as in real datasets, at no memory cost.
#[derive(Clone, Copy)]
struct Shuffle {
    n: u64,
    a: u64,
    b: u64,
    a_inv: u64,
    /// ceil(2^128 / n), for division-free remainders (Lemire, Kaser & Kurz 2019)
    magic: u128,
}

impl Shuffle {
    fn new(n: u64, seed: u64) -> Shuffle {
        let gcd = |mut x: u64, mut y: u64| {
            while y != 0 {
                (x, y) = (y, x % y);
            }
            x
        };
        let mut s = Stream::new(&[seed, SHUFFLE]);
        let mut a = 1;
        for _ in 0..1000 {
            let c = s.below(n.max(2)) | 1;
            if n > 2 && gcd(c, n) == 1 && c > n / 4 {
                a = c;
                break;
            }
        }
        let b = s.below(n.max(1));
        // modular inverse by the extended Euclidean algorithm
        let (mut t, mut new_t, mut r, mut new_r) = (0i128, 1i128, n as i128, a as i128);
        while new_r != 0 {
            let q = r / new_r;
            (t, new_t) = (new_t, t - q * new_t);
            (r, new_r) = (new_r, r - q * new_r);
        }
        let a_inv = t.rem_euclid(n.max(1) as i128) as u64;
        let magic = (u128::MAX / n.max(1) as u128).wrapping_add(1);
        Shuffle { n, a, b, a_inv, magic }
    }

    /// `x mod n` without a division: the high 64 bits of `frac(x / n) · n`.
    #[inline(always)]
    fn rem(&self, x: u64) -> u64 {
        let low = self.magic.wrapping_mul(x as u128);
        let bottom = ((low as u64 as u128) * self.n as u128) >> 64;
        let top = (low >> 64) * self.n as u128;
        ((top + bottom) >> 64) as u64
    }
    #[inline]
    fn id(&self, i: u64) -> u64 {
        // a, i, b < n <= 2^32, so a·i + b < 2^64
        self.rem(self.a * i + self.b)
    }
    #[inline]
    fn index(&self, id: u64) -> u64 {
        ((self.a_inv as u128 * ((id + self.n - self.b) % self.n) as u128) % self.n as u128) as u64
    }
}

/// Communities (contiguous ranges of model indices) and degree weights, with samplers.
///
/// All alias entries live in one table of three segments: `0..n` samples over every node,
/// `n + comm_ptr[c] ..` over community `c`, `2n + start ..` over the block starting at model
/// index `start`; every alias target is stored as a model index, so a draw from any segment
/// resolves the same way, without branches.
struct Model {
    n: u64,
    block: u64,
    comm_ptr: Vec<u64>,
    table: HugeTable,
    shuffle: Shuffle,
}

impl Model {
    fn new(cfg: &GenConfig, n: u64) -> Model {
        let k = cfg.preset.classes as usize;
        let seed = cfg.seed;
        // community sizes follow a gentle power law, each at least 2
        let size_w: Vec<f64> = (0..k).map(|c| 1.0 / ((c + 1) as f64).sqrt()).collect();
        let total: f64 = size_w.iter().sum();
        let mut comm_ptr = vec![0u64; k + 1];
        for c in 0..k {
            let size = ((n - 2 * k as u64) as f64 * size_w[c] / total) as u64 + 2;
            comm_ptr[c + 1] = comm_ptr[c] + size;
        }
        comm_ptr[k] = n;
        let cap = (n as f64).sqrt().max(10.0);
        let exp = -1.0 / (cfg.degree_exponent - 1.0);
        let theta: Vec<f64> = (0..n)
            .into_par_iter()
            .map(|i| {
                let w = unit_f64(hash_key(&[seed, WEIGHT, i]));
                (1.0 - w).powf(exp).min(cap)
            })
            .collect();
        let mut table = Alias::new(&theta).entries;
        let locals: Vec<Vec<(u32, u32)>> = (0..k)
            .into_par_iter()
            .map(|c| {
                let base = comm_ptr[c] as u32;
                let local = Alias::new(&theta[comm_ptr[c] as usize..comm_ptr[c + 1] as usize]);
                local.entries.into_iter().map(|(t, a)| (t, a + base)).collect()
            })
            .collect();
        table.extend(locals.into_iter().flatten());
        let block = cfg.block.max(1);
        let blocks: Vec<(u64, u64)> = (0..k)
            .flat_map(|c| {
                let (lo, hi) = (comm_ptr[c], comm_ptr[c + 1]);
                (lo..hi).step_by(block as usize).map(move |b| (b, (b + block).min(hi)))
            })
            .collect();
        let locals: Vec<Vec<(u32, u32)>> = blocks
            .into_par_iter()
            .map(|(lo, hi)| {
                let local = Alias::new(&theta[lo as usize..hi as usize]);
                local.entries.into_iter().map(|(t, a)| (t, a + lo as u32)).collect()
            })
            .collect();
        table.extend(locals.into_iter().flatten());
        Model { n, block, comm_ptr, table: HugeTable::new(&table), shuffle: Shuffle::new(n, seed) }
    }

    #[inline]
    fn community_of_index(&self, i: u64) -> usize {
        self.comm_ptr.partition_point(|&p| p <= i) - 1
    }

    /// The community of node id `v`.
    fn community(&self, v: u64) -> usize {
        self.community_of_index(self.shuffle.index(v))
    }

    /// Resolves a draw over model indices `[start, start + len)` of the table segment `seg`
    /// (0, n or 2n): the low 32 bits of `r` pick the entry, the high 32 bits are compared with
    /// its threshold. Branch-free, so that the loads of a batch overlap.
    #[inline(always)]
    fn resolve(&self, seg: u64, start: u64, len: u64, r: u64) -> u64 {
        let own = start + ((r as u32 as u64 * len) >> 32);
        let e = self.table.get((seg + own) as usize);
        let (t, a) = (e as u32, (e >> 32) as u32);
        let m = 0u64.wrapping_sub((((r >> 32) as u32) < t) as u64);
        (own & m) | (a as u64 & !m)
    }

    /// Fills `out` with the undirected candidate pairs of chunk `ci` of `round`, as keys
    /// `(high << 32) | low`. Draws are made in batches whose independent table look-ups
    /// overlap in memory.
    fn sample_chunk(&self, cfg: &GenConfig, round: u64, ci: u64, out: &mut [u64]) {
        const BATCH: usize = 64;
        let local_threshold = (cfg.local * 256.0) as u64;
        let intra_threshold = ((cfg.local + cfg.intra) * 256.0) as u64;
        let mut s = Stream::new(&[cfg.seed, EDGES, round, ci]);
        let mut ii = [0u64; BATCH];
        let mut jj = [0u64; BATCH];
        for batch in out.chunks_mut(BATCH) {
            let m = batch.len();
            for i in &mut ii[..m] {
                *i = self.resolve(0, 0, self.n, s.next_u64());
            }
            for k in 0..m {
                let d = s.next_u64();
                let c = self.community_of_index(ii[k]);
                let (lo, hi) = (self.comm_ptr[c], self.comm_ptr[c + 1]);
                let (seg, start, len) = if (d & 0xFF) < local_threshold {
                    let b = lo + (ii[k] - lo) / self.block * self.block;
                    (2 * self.n, b, (b + self.block).min(hi) - b)
                } else if (d & 0xFF) < intra_threshold {
                    (self.n, lo, hi - lo)
                } else {
                    (0, 0, self.n)
                };
                jj[k] = self.resolve(seg, start, len, d.rotate_right(8));
            }
            for (k, key) in batch.iter_mut().enumerate() {
                let (i, mut j) = (ii[k], jj[k]);
                for _ in 0..16 {
                    if j != i {
                        break;
                    }
                    j = self.resolve(0, 0, self.n, s.next_u64());
                }
                let (u, v) = (self.shuffle.id(i), self.shuffle.id(j));
                // a pair that stayed a self loop is dropped later
                *key = (u.max(v) << 32) | u.min(v);
            }
        }
    }

    /// Appends `count` candidate pairs of `round` to the row ranges they fall in (by their high
    /// end; `bounds` are the ranges' first rows).
    fn sample_into(
        &self,
        cfg: &GenConfig,
        round: u64,
        count: usize,
        bounds: &[u64],
        ranges: &mut [Vec<u64>],
    ) {
        const CHUNK: usize = 1 << 16;
        let chunks = count.div_ceil(CHUNK);
        let group = rayon::current_num_threads() * 16;
        // reserve each range's expected share (max(u, v) ≤ x with probability (x/n)²) plus
        // slack, so growth does not double a range's memory
        let n = self.n as f64;
        for (r, keys) in ranges.iter_mut().enumerate() {
            let share = ((bounds[r + 1] as f64 / n).powi(2) - (bounds[r] as f64 / n).powi(2)).max(0.0);
            keys.reserve((count as f64 * share * 1.05) as usize + 4096);
        }
        for g in (0..chunks).step_by(group) {
            let parts: Vec<Vec<Vec<u64>>> = (g..(g + group).min(chunks))
                .into_par_iter()
                .map(|ci| {
                    let mut keys = vec![0u64; CHUNK.min(count - ci * CHUNK)];
                    self.sample_chunk(cfg, round, ci as u64, &mut keys);
                    if ranges.len() == 1 {
                        return vec![keys];
                    }
                    let mut split = vec![Vec::with_capacity(keys.len() / ranges.len() * 2); ranges.len()];
                    for k in keys {
                        split[bounds.partition_point(|&b| b <= k >> 32) - 1].push(k);
                    }
                    split
                })
                .collect();
            for split in parts {
                for (r, keys) in split.into_iter().enumerate() {
                    ranges[r].extend_from_slice(&keys);
                }
            }
        }
    }
}

/// A generated graph held in memory; features are produced on demand (see [`GenFeatures`]).
pub fn generate(cfg: &GenConfig) -> Result<Generated> {
    let (_, e) = cfg.sizes()?;
    let mut cols = Vec::with_capacity(e as usize);
    let parts = generate_streaming(cfg, &mut |c| {
        cols.extend_from_slice(c);
        Ok(())
    })?;
    Ok(Generated {
        name: parts.name,
        graph: Csr::from_trusted(parts.row_ptr, cols),
        labels: parts.labels,
        num_classes: parts.num_classes,
        splits: parts.splits,
        features: parts.features,
    })
}

/// Generates `cfg`, handing the CSR's columns to `sink` range by range in row order and
/// returning everything else. Memory: the candidate pairs once (8 bytes per undirected edge)
/// plus one row range's working set; the columns themselves are never held by the generator.
pub fn generate_streaming(
    cfg: &GenConfig,
    sink: &mut dyn FnMut(&[u32]) -> Result<()>,
) -> Result<GeneratedParts> {
    let (n, e) = cfg.sizes()?;
    let _span = tracing::info_span!("generate", preset = cfg.preset.name, n, e).entered();
    let t = std::time::Instant::now();
    let model = Model::new(cfg, n);
    tracing::debug!("model in {:.2} s", t.elapsed().as_secs_f64());
    let target = (e / 2) as usize;
    let (bounds, mut ranges) = candidate_pairs(cfg, &model, n, target, t)?;
    let row_ptr = emit_rows(n, &bounds, &mut ranges, sink)?;
    assert_eq!(row_ptr[n as usize], e, "the generator emits exactly the requested edges");
    tracing::debug!("graph in {:.2} s", t.elapsed().as_secs_f64());

    let classes = cfg.preset.classes;
    let labels: Vec<i32> = (0..n)
        .into_par_iter()
        .map(|v| {
            let mut s = Stream::new(&[cfg.seed, LABEL, v]);
            if s.next_f64() < cfg.label_noise {
                s.below(classes as u64) as i32
            } else {
                (model.community(v) % classes as usize) as i32
            }
        })
        .collect();
    let splits = make_splits(cfg, n);
    tracing::debug!("labels and split in {:.2} s", t.elapsed().as_secs_f64());
    let labels_arc = Arc::new(labels.clone());
    Ok(GeneratedParts {
        name: cfg.preset.name.to_string(),
        row_ptr,
        labels,
        num_classes: classes,
        splits,
        features: GenFeatures::new(cfg, labels_arc),
    })
}

/// Exactly `target` distinct undirected pairs, as keys `high << 32 | low` sorted within row
/// ranges by the high end, with the ranges' bounds. Ranges by the high end of a pair:
/// max(u, v) of uniform ids has density ∝ x, so quantiles √(r/R) balance them.
fn candidate_pairs(
    cfg: &GenConfig,
    model: &Model,
    n: u64,
    target: usize,
    t: std::time::Instant,
) -> Result<(Vec<u64>, Vec<Vec<u64>>)> {
    let r_count = ((target as u64 * 8 * 33 / 32).div_ceil(cfg.range_bytes_max.max(1))).max(1);
    let mut bounds: Vec<u64> =
        (0..=r_count).map(|r| ((n as f64) * (r as f64 / r_count as f64).sqrt()).round() as u64).collect();
    bounds.dedup();
    *bounds.last_mut().expect("bounds") = n;
    let row_range = |r: usize| bounds[r]..bounds[r + 1];
    let mut ranges: Vec<Vec<u64>> = vec![Vec::new(); bounds.len() - 1];

    // Distinct pairs, topped up until at least `target` exist.
    let pb = progress::bar(target as u64, "edges", false);
    let mut want = target + target / 32 + 1024;
    let mut round = 0u64;
    let mut unique = 0usize;
    loop {
        model.sample_into(cfg, round, want, &bounds, &mut ranges);
        let before = unique;
        for (r, keys) in ranges.iter_mut().enumerate() {
            let mut u = sort_keys(keys, row_range(r), true);
            u.retain(|&k| (k >> 32) != (k & 0xFFFF_FFFF));
            *keys = u;
        }
        unique = ranges.iter().map(Vec::len).sum();
        tracing::debug!("round {round}: {unique} distinct pairs in {:.2} s", t.elapsed().as_secs_f64());
        pb.set_position(unique.min(target) as u64);
        if unique >= target {
            break;
        }
        let rate = (unique - before) as f64 / want as f64;
        want = ((target - unique) as f64 / rate.max(0.05) * 1.1) as usize + 1024;
        round += 1;
        if round > 50 {
            return Err(GraphError::Usage(format!("cannot place {target} distinct edges on {n} nodes")));
        }
    }
    pb.finish_and_clear();

    // Thin evenly to exactly `target` pairs: global pair i is kept when floor(i·t/u) steps.
    let kept_before = |i: usize| (i as u128 * target as u128 / unique as u128) as usize;
    let mut first = 0usize;
    for keys in ranges.iter_mut() {
        let len = keys.len();
        *keys = thin(keys, first, &kept_before);
        first += len;
    }
    Ok((bounds, ranges))
}

/// Hands the CSR's columns to `sink` in row order and returns its row offsets. Rows go in
/// ranges of equal node count. Row v = its lower neighbours (keys with high end v) followed by
/// its upper neighbours (reversed keys with low end v); low ends crowd the first rows (the
/// first of K ranges holds about 2/K of all upper entries), hence twice as many emission
/// ranges as candidate ranges. A candidate range is freed once emission has passed its last
/// row.
fn emit_rows(
    n: u64,
    bounds: &[u64],
    ranges: &mut [Vec<u64>],
    sink: &mut dyn FnMut(&[u32]) -> Result<()>,
) -> Result<Vec<u64>> {
    let k_count = if ranges.len() == 1 { 1 } else { 2 * ranges.len() as u64 };
    let emit_bounds: Vec<u64> = (0..=k_count).map(|k| n * k / k_count).collect();
    let pb = progress::bar(n, "rows", false);
    let mut row_ptr = vec![0u64; n as usize + 1];
    let mut offset = 0u64;
    for k in 0..k_count as usize {
        let rows = emit_bounds[k]..emit_bounds[k + 1];
        let live: Vec<usize> = (0..ranges.len()).filter(|&r| bounds[r + 1] > rows.start).collect();
        let lower_parts: Vec<&[u64]> = live
            .iter()
            .map(|&r| {
                let keys = &ranges[r];
                let a = keys.partition_point(|&x| x >> 32 < rows.start);
                let b = keys.partition_point(|&x| x >> 32 < rows.end);
                &keys[a..b]
            })
            .filter(|s| !s.is_empty())
            .collect();
        let lower: std::borrow::Cow<[u64]> = match lower_parts.as_slice() {
            [one] => std::borrow::Cow::Borrowed(one),
            many => std::borrow::Cow::Owned(many.concat()),
        };
        let upper = sort_keys(&upper_keys(ranges, &live, rows.clone(), n), rows.clone(), false);
        let (ptr, cols) = assemble_rows(&lower, &upper, rows.clone());
        drop((lower, upper));
        for (i, p) in ptr.iter().enumerate().skip(1) {
            row_ptr[rows.start as usize + i] = offset + p;
        }
        offset += cols.len() as u64;
        for r in live {
            if bounds[r + 1] <= rows.end {
                ranges[r] = Vec::new();
            }
        }
        sink(&cols)?;
        pb.set_position(rows.end);
    }
    pb.finish_and_clear();
    Ok(row_ptr)
}

/// The reversed keys (`low << 32 | high`) of the live candidate ranges whose low end lies in
/// `rows`: the upper neighbours of those rows, unsorted.
fn upper_keys(ranges: &[Vec<u64>], live: &[usize], rows: std::ops::Range<u64>, n: u64) -> Vec<u64> {
    if live.len() == 1 {
        let keys = &ranges[live[0]];
        if rows.start == 0 && rows.end == n {
            keys.par_iter().map(|&x| x.rotate_right(32)).collect()
        } else {
            keys.par_iter()
                .filter(|&&x| rows.contains(&(x & 0xFFFF_FFFF)))
                .map(|&x| x.rotate_right(32))
                .collect()
        }
    } else {
        live.par_iter()
            .flat_map(|&r| {
                ranges[r]
                    .par_iter()
                    .filter(|&&x| rows.contains(&(x & 0xFFFF_FFFF)))
                    .map(|&x| x.rotate_right(32))
            })
            .collect()
    }
}

/// The keys of `keys` (global positions `first..`) that `kept_before` keeps: position i is kept
/// when `kept_before(i + 1) > kept_before(i)`. Pieces are written in parallel at offsets known
/// in closed form.
fn thin(keys: &[u64], first: usize, kept_before: &(dyn Fn(usize) -> usize + Sync)) -> Vec<u64> {
    const PIECE: usize = 1 << 16;
    let base = kept_before(first);
    let mut out = vec![0u64; kept_before(first + keys.len()) - base];
    let mut pieces = Vec::new();
    let mut rest = out.as_mut_slice();
    for a in (0..keys.len()).step_by(PIECE) {
        let b = (a + PIECE).min(keys.len());
        let (piece, tail) = rest.split_at_mut(kept_before(first + b) - kept_before(first + a));
        pieces.push((a, b, piece));
        rest = tail;
    }
    pieces.into_par_iter().for_each(|(a, b, piece)| {
        let mut w = 0;
        for (i, &k) in (first + a..).zip(&keys[a..b]) {
            if kept_before(i + 1) > kept_before(i) {
                piece[w] = k;
                w += 1;
            }
        }
    });
    out
}

/// A random split of the preset's proportions, each part ascending.
fn make_splits(cfg: &GenConfig, n: u64) -> Splits {
    let mut order: Vec<(u64, u32)> =
        (0..n).into_par_iter().map(|v| (hash_key(&[cfg.seed, SPLIT, v]), v as u32)).collect();
    order.par_sort_unstable();
    let (a, b, c) = cfg.preset.split;
    let n_train = (n as f64 * a) as usize;
    let n_valid = (n as f64 * b) as usize;
    let n_test = ((n as f64 * c) as usize).min(n as usize - n_train - n_valid);
    let part = |r: std::ops::Range<usize>| {
        let mut ids: Vec<u32> = order[r].iter().map(|x| x.1).collect();
        ids.par_sort_unstable();
        ids.into()
    };
    Splits {
        train: part(0..n_train),
        valid: part(n_train..n_train + n_valid),
        test: part(n_train + n_valid..n_train + n_valid + n_test),
    }
}

/// Class-conditional Gaussian features, computed row by row on demand:
/// `x[v] = μ[label(v)] + ε`, with `ε ~ N(0, I)` and class means `μ ~ N(0, σ² I)` where
/// `σ = class_separation / sqrt(2F)` makes the expected distance between two means equal to
/// `class_separation` noise units.
pub struct GenFeatures {
    seed: u64,
    dim: usize,
    means: Vec<f32>,
    labels: Arc<Vec<i32>>,
}

impl GenFeatures {
    fn new(cfg: &GenConfig, labels: Arc<Vec<i32>>) -> Self {
        let dim = cfg.preset.feat;
        let sigma = cfg.class_separation / (2.0 * dim as f64).sqrt();
        let means = (0..cfg.preset.classes as u64)
            .flat_map(|c| {
                let mut s = Stream::new(&[cfg.seed, MEAN, c]);
                (0..dim).map(move |_| (s.normal() * sigma) as f32).collect::<Vec<_>>()
            })
            .collect();
        GenFeatures { seed: cfg.seed, dim, means, labels }
    }
}

impl FeatureSource for GenFeatures {
    fn dim(&self) -> usize {
        self.dim
    }
    fn rows(&self) -> usize {
        self.labels.len()
    }
    fn fill(&self, row0: usize, out: &mut [f32]) -> Result<()> {
        let d = self.dim;
        const ROWS: usize = 512;
        out.par_chunks_mut(d * ROWS).enumerate().for_each(|(b, rows)| {
            for (i, row) in rows.chunks_mut(d).enumerate() {
                let v = row0 + b * ROWS + i;
                let mean = &self.means[self.labels[v].max(0) as usize * d..][..d];
                let mut s = Stream::new(&[self.seed, FEATURE, v as u64]);
                for (x, m) in row.iter_mut().zip(mean) {
                    let z: f32 = StandardNormal.sample(&mut s);
                    *x = m + z;
                }
            }
        });
        Ok(())
    }
}

impl Generated {
    /// Materialises the features in memory (small graphs and tests).
    pub fn into_dataset(self) -> Result<crate::Dataset> {
        let n = self.graph.num_nodes();
        let mut data = vec![0f32; n * self.features.dim];
        self.features.fill(0, &mut data)?;
        Ok(crate::Dataset {
            name: self.name,
            graph: self.graph,
            features: crate::Features { dim: self.features.dim, data: data.into() },
            labels: self.labels.into(),
            num_classes: self.num_classes,
            splits: self.splits,
            directed: false,
            edge_weight: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small(seed: u64) -> GenConfig {
        GenConfig::new(preset("arxiv-like").unwrap(), 0.02, seed)
    }

    #[test]
    fn shuffle_is_a_bijection() {
        for n in [2u64, 3, 10, 97, 1000, 4096] {
            let s = Shuffle::new(n, n * 7);
            let mut seen = vec![false; n as usize];
            for x in [0, 1, n - 1, n, n + 1, 3 * n + 2, u64::MAX / 3, u64::MAX] {
                assert_eq!(s.rem(x), x % n, "{x} mod {n}");
            }
            for i in 0..n {
                let v = s.id(i);
                assert!(!seen[v as usize]);
                seen[v as usize] = true;
                assert_eq!(s.index(v), i);
            }
        }
    }

    #[test]
    fn exact_sizes_and_valid_graph() {
        let cfg = small(1);
        let (n, e) = cfg.sizes().unwrap();
        let g = generate(&cfg).unwrap();
        assert_eq!(g.graph.num_nodes() as u64, n);
        assert_eq!(g.graph.num_edges() as u64, e);
        assert!(g.graph.is_symmetric());
        assert_eq!(g.graph.num_self_loops(), 0);
        let ds = g.into_dataset().unwrap();
        ds.validate(std::path::Path::new("generated")).unwrap();
        assert_eq!(ds.splits.train.len(), (n as f64 * 0.54) as usize);
    }

    #[test]
    fn deterministic_for_a_seed_and_thread_count() {
        let a = generate(&small(7)).unwrap().into_dataset().unwrap();
        let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
        let b = pool.install(|| generate(&small(7)).unwrap().into_dataset().unwrap());
        let c = generate(&small(8)).unwrap().into_dataset().unwrap();
        assert!(a == b, "same seed, different thread count must give the same dataset");
        assert!(a.graph != c.graph);
    }

    #[test]
    fn row_ranges_do_not_change_the_graph() {
        let one = generate(&small(11)).unwrap();
        let mut cfg = small(11);
        cfg.range_bytes_max = 16 << 10; // dozens of ranges
        let many = generate(&cfg).unwrap();
        assert!(one.graph == many.graph, "the range count must not change the output");
        assert_eq!(one.labels, many.labels);
    }

    #[test]
    fn communities_make_graph_homophilous_and_features_predictive() {
        let ds = generate(&small(3)).unwrap().into_dataset().unwrap();
        let g = &ds.graph;
        let same = (0..g.num_nodes())
            .flat_map(|v| g.row(v).iter().map(move |&u| (u as usize, v)))
            .filter(|&(u, v)| ds.labels[u] == ds.labels[v])
            .count();
        let homophily = same as f64 / g.num_edges() as f64;
        assert!(homophily > 0.5, "edge homophily {homophily}");
        // nearest-class-mean on features alone beats chance by a wide margin
        let d = ds.features.dim;
        let c = ds.num_classes as usize;
        let mut mean = vec![0f64; c * d];
        let mut count = vec![0usize; c];
        for &v in ds.splits.train.iter() {
            let y = ds.labels[v as usize] as usize;
            count[y] += 1;
            for (m, x) in mean[y * d..(y + 1) * d].iter_mut().zip(ds.features.row(v as usize)) {
                *m += x as f64;
            }
        }
        for y in 0..c {
            mean[y * d..(y + 1) * d].iter_mut().for_each(|m| *m /= count[y].max(1) as f64);
        }
        let correct = ds
            .splits
            .test
            .iter()
            .filter(|&&v| {
                let x = ds.features.row(v as usize);
                let best = (0..c)
                    .min_by(|&a, &b| {
                        let da: f64 =
                            x.iter().zip(&mean[a * d..]).map(|(x, m)| (*x as f64 - m).powi(2)).sum();
                        let db: f64 =
                            x.iter().zip(&mean[b * d..]).map(|(x, m)| (*x as f64 - m).powi(2)).sum();
                        da.total_cmp(&db)
                    })
                    .unwrap();
                best as i32 == ds.labels[v as usize]
            })
            .count();
        let acc = correct as f64 / ds.splits.test.len() as f64;
        eprintln!("edge homophily {homophily:.3}, feature-only nearest-mean accuracy {acc:.3}");
        assert!(acc > 10.0 / c as f64, "feature-only accuracy {acc}");
        assert!(acc < 0.9, "features alone should not solve the task: {acc}");
    }
}
