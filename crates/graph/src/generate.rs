//! Synthetic graphs with community structure and predictive features (DESIGN.md §7).
//!
//! Model: a degree-corrected stochastic block model. Every node gets a community (sizes follow
//! a gentle power law) and a weight θ from a capped Pareto distribution (heavy-tailed degrees).
//! Each undirected edge picks its first end with probability ∝ θ, and its second end ∝ θ inside
//! the first end's community with probability `intra`, else ∝ θ over all nodes. Duplicates and
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
use crate::sort::sort_keys;

/// Sizes of a benchmark preset (DESIGN.md §7).
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
    /// Probability that an edge stays inside its first end's community.
    pub intra: f64,
    /// Probability that a node's label is a random class instead of its community's.
    pub label_noise: f64,
    /// Pareto exponent of the degree weights (larger: lighter tail).
    pub degree_exponent: f64,
    /// Distance between class means, in units of the per-feature noise.
    pub class_separation: f64,
}

impl GenConfig {
    /// The defaults for `preset` at `scale` and `seed`.
    pub fn new(preset: Preset, scale: f64, seed: u64) -> Self {
        GenConfig {
            preset,
            scale,
            seed,
            intra: 0.8,
            label_noise: 0.1,
            degree_exponent: 2.5,
            class_separation: 4.0,
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
/// All alias entries live in one table: `0..n` samples over every node, `n + comm_ptr[c] ..`
/// over community `c`; every alias target is stored as a model index, so a draw from either
/// part resolves the same way, without branches.
struct Model {
    n: u64,
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
        Model { n, comm_ptr, table: HugeTable::new(&table), shuffle: Shuffle::new(n, seed) }
    }

    #[inline]
    fn community_of_index(&self, i: u64) -> usize {
        self.comm_ptr.partition_point(|&p| p <= i) - 1
    }

    /// The community of node id `v`.
    fn community(&self, v: u64) -> usize {
        self.community_of_index(self.shuffle.index(v))
    }

    /// Resolves a draw over the table part `[base, base + len)`: the low 32 bits of `r` pick
    /// the entry, the high 32 bits are compared with its threshold. Branch-free, so that the
    /// loads of a batch overlap.
    #[inline(always)]
    fn resolve(&self, base: u64, len: u64, r: u64) -> u64 {
        let slot = ((r as u32 as u64 * len) >> 32) + base;
        let e = self.table.get(slot as usize);
        let (t, a) = (e as u32, (e >> 32) as u32);
        let own = slot - (base.min(self.n) & (0u64.wrapping_sub((base >= self.n) as u64)));
        let m = 0u64.wrapping_sub((((r >> 32) as u32) < t) as u64);
        (own & m) | (a as u64 & !m)
    }

    /// Appends `count` undirected candidate pairs as keys `(high << 32) | low`, chunk by chunk
    /// from keyed streams, in batches whose independent table look-ups overlap in memory.
    fn sample_pairs(&self, cfg: &GenConfig, round: u64, count: usize, keys: &mut Vec<u64>) {
        const CHUNK: usize = 1 << 16;
        const BATCH: usize = 64;
        let intra_threshold = (cfg.intra * 256.0) as u64;
        let start = keys.len();
        keys.resize(start + count, 0);
        keys[start..].par_chunks_mut(CHUNK).enumerate().for_each(|(ci, out)| {
            let mut s = Stream::new(&[cfg.seed, EDGES, round, ci as u64]);
            let mut ii = [0u64; BATCH];
            let mut jj = [0u64; BATCH];
            for batch in out.chunks_mut(BATCH) {
                let m = batch.len();
                for i in &mut ii[..m] {
                    *i = self.resolve(0, self.n, s.next_u64());
                }
                for k in 0..m {
                    let d = s.next_u64();
                    let c = self.community_of_index(ii[k]);
                    let (base, len) = if (d & 0xFF) < intra_threshold {
                        (self.n + self.comm_ptr[c], self.comm_ptr[c + 1] - self.comm_ptr[c])
                    } else {
                        (0, self.n)
                    };
                    jj[k] = self.resolve(base, len, d.rotate_right(8));
                }
                for (k, key) in batch.iter_mut().enumerate() {
                    let (i, mut j) = (ii[k], jj[k]);
                    for _ in 0..16 {
                        if j != i {
                            break;
                        }
                        j = self.resolve(0, self.n, s.next_u64());
                    }
                    let (u, v) = (self.shuffle.id(i), self.shuffle.id(j));
                    // a pair that stayed a self loop is dropped later
                    *key = (u.max(v) << 32) | u.min(v);
                }
            }
        });
    }
}

/// Generates the graph, labels and split of `cfg` (features stay lazy).
pub fn generate(cfg: &GenConfig) -> Result<Generated> {
    let (n, e) = cfg.sizes()?;
    let _span = tracing::info_span!("generate", preset = cfg.preset.name, n, e).entered();
    let t = std::time::Instant::now();
    let model = Model::new(cfg, n);
    tracing::debug!("model in {:.2} s", t.elapsed().as_secs_f64());

    // Distinct pairs, topped up until at least `target` exist.
    let target = (e / 2) as usize;
    let pb = progress::bar(target as u64, "edges", false);
    let mut keys = Vec::new();
    let mut want = target + target / 32 + 1024;
    let mut round = 0u64;
    let unique = loop {
        model.sample_pairs(cfg, round, want - keys.len(), &mut keys);
        tracing::debug!("sampled in {:.2} s", t.elapsed().as_secs_f64());
        let mut unique = sort_keys(&keys, n, true);
        unique.retain(|&k| (k >> 32) != (k & 0xFFFF_FFFF));
        tracing::debug!(
            "round {round}: {} distinct of {} in {:.2} s",
            unique.len(),
            keys.len(),
            t.elapsed().as_secs_f64()
        );
        pb.set_position(unique.len().min(target) as u64);
        if unique.len() >= target {
            break unique;
        }
        let rate = unique.len() as f64 / keys.len() as f64;
        want = unique.len() + ((target - unique.len()) as f64 / rate.max(0.05) * 1.1) as usize + 1024;
        keys = unique;
        round += 1;
        if round > 50 {
            return Err(GraphError::Usage(format!("cannot place {target} distinct edges on {n} nodes")));
        }
    };
    drop(keys);
    pb.finish_and_clear();

    // Thin evenly to exactly `target` pairs (pair i is kept when floor(i·t/u) steps), then add
    // the reverse of every pair. Kept forward keys stay sorted; only the reverses need sorting.
    let u = unique.len();
    let kept_before = |i: usize| (i as u128 * target as u128 / u as u128) as usize;
    const PIECE: usize = 1 << 16;
    let mut fwd = vec![0u64; target];
    let mut rev = vec![0u64; target];
    let pieces: Vec<(usize, &mut [u64], &mut [u64])> = {
        let mut out = Vec::new();
        let (mut f, mut r) = (fwd.as_mut_slice(), rev.as_mut_slice());
        for a in (0..u).step_by(PIECE) {
            let k = kept_before((a + PIECE).min(u)) - kept_before(a);
            let (f1, f2) = std::mem::take(&mut f).split_at_mut(k);
            let (r1, r2) = std::mem::take(&mut r).split_at_mut(k);
            out.push((a, f1, r1));
            (f, r) = (f2, r2);
        }
        out
    };
    pieces.into_par_iter().for_each(|(a, f, r)| {
        let mut w = 0;
        for (i, &k) in (a..).zip(&unique[a..(a + PIECE).min(u)]) {
            if kept_before(i + 1) > kept_before(i) {
                f[w] = k;
                r[w] = k.rotate_right(32);
                w += 1;
            }
        }
    });
    drop(unique);
    let rev = sort_keys(&rev, n, false);
    let graph = Csr::from_lower_upper(&fwd, &rev, n as usize);
    drop((fwd, rev));
    debug_assert_eq!(graph.num_edges() as u64, e);
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
    Ok(Generated {
        name: cfg.preset.name.to_string(),
        graph,
        labels,
        num_classes: classes,
        splits,
        features: GenFeatures::new(cfg, labels_arc),
    })
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
                *m += *x as f64;
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
