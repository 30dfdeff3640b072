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

use rayon::prelude::*;

use crate::csr::{BuildOptions, Csr};
use crate::dataset::Splits;
use crate::error::{GraphError, Result};
use crate::io::native::FeatureSource;
use crate::progress;
use crate::rng::{hash_key, unit_f64, Stream};

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
            class_separation: 1.5,
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
            return Err(GraphError::Usage(format!("scale {} leaves too few nodes ({n}) for {e} edges", self.scale)));
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
const COMMUNITY: u64 = 1;
const WEIGHT: u64 = 2;
const EDGES: u64 = 3;
const LABEL: u64 = 4;
const SPLIT: u64 = 5;
const MEAN: u64 = 6;
const FEATURE: u64 = 7;

/// Walker/Vose alias table: O(1) sampling from a discrete distribution.
struct Alias {
    prob: Vec<f32>,
    alias: Vec<u32>,
}

impl Alias {
    fn new(w: &[f64]) -> Alias {
        let n = w.len();
        let total: f64 = w.iter().sum();
        let mut prob: Vec<f64> = w.iter().map(|x| x * n as f64 / total).collect();
        let mut alias: Vec<u32> = (0..n as u32).collect();
        let (mut small, mut large): (Vec<u32>, Vec<u32>) = (0..n as u32).partition(|&i| prob[i as usize] < 1.0);
        while let (Some(s), Some(&l)) = (small.pop(), large.last()) {
            alias[s as usize] = l;
            prob[l as usize] -= 1.0 - prob[s as usize];
            if prob[l as usize] < 1.0 {
                large.pop();
                small.push(l);
            }
        }
        Alias {
            prob: prob.into_iter().map(|p| p.min(1.0) as f32).collect(),
            alias,
        }
    }

    #[inline]
    fn sample(&self, s: &mut Stream) -> usize {
        let r = s.next_u64();
        let i = ((r as u32 as u64 * self.prob.len() as u64) >> 32) as usize;
        let u = (r >> 40) as f32 * (1.0 / (1u64 << 24) as f32);
        if u < self.prob[i] {
            i
        } else {
            self.alias[i] as usize
        }
    }
}

/// Node communities and degree weights with samplers over them.
struct Model {
    community: Vec<u32>,
    global: Alias,
    /// nodes grouped by community, with one alias table per group
    members: Vec<u32>,
    member_ptr: Vec<usize>,
    local: Vec<Alias>,
}

impl Model {
    fn new(cfg: &GenConfig, n: u64) -> Model {
        let k = cfg.preset.classes as usize;
        let seed = cfg.seed;
        let size_w: Vec<f64> = (0..k).map(|c| 1.0 / ((c + 1) as f64).sqrt()).collect();
        let total: f64 = size_w.iter().sum();
        let cdf: Vec<f64> = size_w.iter().scan(0.0, |a, w| {
            *a += w / total;
            Some(*a)
        }).collect();
        let cap = (n as f64).sqrt().max(10.0);
        let exp = -1.0 / (cfg.degree_exponent - 1.0);
        let (community, theta): (Vec<u32>, Vec<f64>) = (0..n)
            .into_par_iter()
            .map(|v| {
                let u = unit_f64(hash_key(&[seed, COMMUNITY, v]));
                let c = cdf.partition_point(|&x| x <= u).min(k - 1) as u32;
                let w = unit_f64(hash_key(&[seed, WEIGHT, v]));
                (c, (1.0 - w).powf(exp).min(cap))
            })
            .unzip();
        let global = Alias::new(&theta);
        let mut member_ptr = vec![0usize; k + 1];
        for &c in &community {
            member_ptr[c as usize + 1] += 1;
        }
        for c in 0..k {
            member_ptr[c + 1] += member_ptr[c];
        }
        let mut members = vec![0u32; n as usize];
        let mut cursor = member_ptr.clone();
        for (v, &c) in community.iter().enumerate() {
            members[cursor[c as usize]] = v as u32;
            cursor[c as usize] += 1;
        }
        let local = (0..k)
            .into_par_iter()
            .map(|c| {
                let w: Vec<f64> = members[member_ptr[c]..member_ptr[c + 1]].iter().map(|&v| theta[v as usize]).collect();
                Alias::new(&w)
            })
            .collect();
        Model {
            community,
            global,
            members,
            member_ptr,
            local,
        }
    }

    /// Undirected candidate pairs `(low, high)`, chunk by chunk from keyed streams.
    fn sample_pairs(&self, cfg: &GenConfig, round: u64, count: usize, lo: &mut Vec<u32>, hi: &mut Vec<u32>) {
        const CHUNK: usize = 1 << 16;
        let start = lo.len();
        lo.resize(start + count, 0);
        hi.resize(start + count, 0);
        lo[start..]
            .par_chunks_mut(CHUNK)
            .zip(hi[start..].par_chunks_mut(CHUNK))
            .enumerate()
            .for_each(|(ci, (l, h))| {
                let mut s = Stream::new(&[cfg.seed, EDGES, round, ci as u64]);
                for (a, b) in l.iter_mut().zip(h.iter_mut()) {
                    let u = self.global.sample(&mut s);
                    let v = if s.next_f64() < cfg.intra {
                        let c = self.community[u] as usize;
                        let base = self.member_ptr[c];
                        self.members[base + self.local[c].sample(&mut s)] as usize
                    } else {
                        self.global.sample(&mut s)
                    };
                    // self loops are kept here as (u, u) and dropped by the CSR build
                    *a = u.min(v) as u32;
                    *b = u.max(v) as u32;
                }
            });
    }
}

/// Generates the graph, labels and split of `cfg` (features stay lazy).
pub fn generate(cfg: &GenConfig) -> Result<Generated> {
    let (n, e) = cfg.sizes()?;
    let _span = tracing::info_span!("generate", preset = cfg.preset.name, n, e).entered();
    let spin = progress::spinner("model");
    let model = Model::new(cfg, n);
    spin.finish_and_clear();

    // Candidate pairs, deduplicated as a one-directional CSR (rows: high end, columns: low end),
    // topped up until at least `target` distinct pairs exist.
    let target = (e / 2) as usize;
    let once = BuildOptions {
        symmetrise: false,
        dedup: true,
        self_loops: crate::csr::SelfLoops::Drop,
    };
    let (mut lo, mut hi) = (Vec::new(), Vec::new());
    let pb = progress::bar(target as u64, "edges", false);
    let mut want = target + target / 50 + 1024;
    let mut round = 0u64;
    let upper = loop {
        model.sample_pairs(cfg, round, want - lo.len(), &mut lo, &mut hi);
        let upper = Csr::from_edges(n, &lo, &hi, once)?;
        let unique = upper.num_edges();
        pb.set_position(unique.min(target) as u64);
        if unique >= target {
            break upper;
        }
        // top up using the observed rate of distinct pairs among candidates
        let rate = unique as f64 / lo.len() as f64;
        let (src, dst) = upper.to_coo();
        lo = src;
        hi = dst;
        want = lo.len() + ((target - unique) as f64 / rate.max(0.05) * 1.1) as usize + 1024;
        round += 1;
        if round > 50 {
            return Err(GraphError::Usage(format!("cannot place {target} distinct edges on {n} nodes")));
        }
    };
    drop((lo, hi));
    pb.finish_and_clear();

    // Thin evenly to exactly `target` pairs, then symmetrise.
    let spin = progress::spinner("csr");
    let unique = upper.num_edges();
    let keep = |i: usize| (i + 1) * target / unique > i * target / unique;
    let (src_all, dst_all) = upper.to_coo();
    let (src, dst): (Vec<u32>, Vec<u32>) = (0..unique)
        .into_par_iter()
        .filter(|&i| keep(i))
        .map(|i| (src_all[i], dst_all[i]))
        .unzip();
    drop((src_all, dst_all, upper));
    let graph = Csr::from_edges(n, &src, &dst, BuildOptions::default())?;
    drop((src, dst));
    debug_assert_eq!(graph.num_edges() as u64, e);
    spin.finish_and_clear();

    let classes = cfg.preset.classes;
    let labels: Vec<i32> = (0..n)
        .into_par_iter()
        .map(|v| {
            let mut s = Stream::new(&[cfg.seed, LABEL, v]);
            if s.next_f64() < cfg.label_noise {
                s.below(classes as u64) as i32
            } else {
                model.community[v as usize] as i32 % classes as i32
            }
        })
        .collect();
    let splits = make_splits(cfg, n);
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
    let mut order: Vec<(u64, u32)> = (0..n).into_par_iter().map(|v| (hash_key(&[cfg.seed, SPLIT, v]), v as u32)).collect();
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
        GenFeatures {
            seed: cfg.seed,
            dim,
            means,
            labels,
        }
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
        out.par_chunks_mut(d).enumerate().for_each(|(i, row)| {
            let v = row0 + i;
            let mean = &self.means[self.labels[v].max(0) as usize * d..][..d];
            let mut s = Stream::new(&[self.seed, FEATURE, v as u64]);
            for (pair, m) in row.chunks_mut(2).zip(mean.chunks(2)) {
                // Box–Muller: both outputs of one draw
                let u1 = 1.0 - s.next_f64();
                let u2 = s.next_f64();
                let r = (-2.0 * u1.ln()).sqrt();
                let (sin, cos) = (std::f64::consts::TAU * u2).sin_cos();
                pair[0] = m[0] + (r * cos) as f32;
                if pair.len() > 1 {
                    pair[1] = m[1] + (r * sin) as f32;
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
            features: crate::Features {
                dim: self.features.dim,
                data: data.into(),
            },
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
        let correct = ds.splits.test.iter().filter(|&&v| {
            let x = ds.features.row(v as usize);
            let best = (0..c)
                .min_by(|&a, &b| {
                    let da: f64 = x.iter().zip(&mean[a * d..]).map(|(x, m)| (*x as f64 - m).powi(2)).sum();
                    let db: f64 = x.iter().zip(&mean[b * d..]).map(|(x, m)| (*x as f64 - m).powi(2)).sum();
                    da.total_cmp(&db)
                })
                .unwrap();
            best as i32 == ds.labels[v as usize]
        }).count();
        let acc = correct as f64 / ds.splits.test.len() as f64;
        assert!(acc > 3.0 / c as f64, "feature-only accuracy {acc}");
    }
}
