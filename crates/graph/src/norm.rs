//! Normalisation coefficients computed on the whole graph and stored as edge values, so that a
//! partition or a mini-batch later computes exactly what the full graph would (docs/design.md,
//! exact execution).
//!
//! Values are aligned with `Csr::col_idx` (one per stored edge `u → v` in row `v`), in f64 so
//! that gradient checks can run in full precision; callers narrow them as needed.

use rayon::prelude::*;

use crate::csr::Csr;

/// GCN's symmetric normalisation `D̂^{-1/2} (A + I) D̂^{-1/2}` (Kipf & Welling) on a CSR that
/// already holds exactly one self loop per node (`Csr::with_self_loops`): `d̂(v)` is the row
/// length, counted on targets as PyG's `gcn_norm` does, and stored edge `u → v` gets
/// `1 / sqrt(d̂(u) d̂(v))` (the self loop `1 / d̂(v)`).
pub fn gcn_norm(looped: &Csr) -> Vec<f64> {
    assert_eq!(looped.num_self_loops(), looped.num_nodes(), "gcn_norm expects one self loop per node");
    gcn_norm_with(looped, &looped.degrees())
}

/// [`gcn_norm`] with each node's `d̂` given: a subgraph normalised as its full graph (`d̂` the
/// full graph's degree plus the self loop), so nodes whose neighbourhood it holds compute
/// exactly what they would there.
pub fn gcn_norm_with(looped: &Csr, degree: &[u32]) -> Vec<f64> {
    assert_eq!(degree.len(), looped.num_nodes(), "one degree per node");
    let inv_sqrt: Vec<f64> = degree.par_iter().map(|&d| 1.0 / (d as f64).sqrt()).collect();
    per_edge(looped, |_, u, v| inv_sqrt[u] * inv_sqrt[v])
}

/// GCN's normalisation with edge weights, as PyG's `gcn_norm` with `edge_weight` computes it:
/// `csr` (without self loops) gets a self loop of weight 1 on every node, `d̂(v)` is the sum
/// of the weights into `v` (the target, with its self loop), and entry `u → v` of weight `w`
/// gets `w / sqrt(d̂(u) d̂(v))` (a node of `d̂ = 0` contributes 0, as PyG masks its infinity).
/// `weight` is aligned with `csr`'s entries. Returns the looped structure and its values.
pub fn gcn_norm_weighted(csr: &Csr, weight: &[f32]) -> (Csr, Vec<f64>) {
    assert_eq!(weight.len(), csr.num_edges(), "one weight per entry");
    let looped = csr.with_self_loops();
    let w = looped_weights(csr, weight, &looped);
    let ptr = looped.row_ptr();
    let inv_sqrt: Vec<f64> = (0..looped.num_nodes())
        .into_par_iter()
        .map(|v| {
            // in row order, as every other sum over a row (the same bits on any thread count)
            let d: f64 = w[ptr[v] as usize..ptr[v + 1] as usize].iter().map(|&x| x as f64).sum();
            if d > 0.0 {
                1.0 / d.sqrt()
            } else {
                0.0
            }
        })
        .collect();
    let vals = per_edge(&looped, |e, u, v| w[e] as f64 * inv_sqrt[u] * inv_sqrt[v]);
    (looped, vals)
}

/// `weight` (aligned with `csr`) carried onto `looped` (`csr` with a self loop merged into
/// every row): a self loop `csr` lacks weighs 1.
fn looped_weights(csr: &Csr, weight: &[f32], looped: &Csr) -> Vec<f32> {
    let mut out = vec![1f32; looped.num_edges()];
    let (from, to) = (csr.row_ptr(), looped.row_ptr());
    row_chunks(looped, &mut out).into_par_iter().for_each(|(r, out)| {
        let base = to[r.start] as usize;
        for v in r {
            // the two rows side by side: an entry `csr` has keeps its weight (a self loop of
            // `csr` too, as PyG's `add_remaining_self_loops` keeps one), the added loop weighs 1
            let (row, mut k) = (csr.row(v), 0);
            for (j, &c) in looped.row(v).iter().enumerate() {
                if row.get(k) == Some(&c) {
                    out[to[v] as usize - base + j] = weight[from[v] as usize + k];
                    k += 1;
                }
            }
        }
    });
    out
}

/// Mean aggregation's in-degree normalisation: `1 / in-degree(v)` for every edge into `v`
/// (SAGE's mean; a node without in-neighbours aggregates zero).
pub fn mean_norm(csr: &Csr) -> Vec<f64> {
    mean_norm_with(csr, &csr.degrees())
}

/// [`mean_norm`] with each node's in-degree given (a subgraph normalised as its full graph).
pub fn mean_norm_with(csr: &Csr, degree: &[u32]) -> Vec<f64> {
    assert_eq!(degree.len(), csr.num_nodes(), "one degree per node");
    per_edge(csr, |_, _, v| 1.0 / degree[v] as f64)
}

/// `f(e, u, v)` for every stored edge `u → v` (entry `e`), in CSR order, rows in parallel.
fn per_edge(csr: &Csr, f: impl Fn(usize, usize, usize) -> f64 + Sync) -> Vec<f64> {
    let mut out = vec![0f64; csr.num_edges()];
    let ptr = csr.row_ptr();
    row_chunks(csr, &mut out).into_par_iter().for_each(|(r, out)| {
        let base = ptr[r.start] as usize;
        for v in r {
            for (e, &u) in (ptr[v] as usize..).zip(csr.row(v)) {
                out[e - base] = f(e, u as usize, v);
            }
        }
    });
    out
}

/// `out` (one value per entry of `csr`) cut into runs of whole rows of similar entry counts,
/// each with its rows, for loops over rows on every core.
fn row_chunks<'a, T>(csr: &Csr, out: &'a mut [T]) -> Vec<(std::ops::Range<usize>, &'a mut [T])> {
    let ptr = csr.row_ptr();
    let mut rest = out;
    let mut chunks = Vec::new();
    for r in csr.balanced_row_ranges(rayon::current_num_threads() * 4) {
        let (c, tail) = std::mem::take(&mut rest).split_at_mut((ptr[r.end] - ptr[r.start]) as usize);
        chunks.push((r, c));
        rest = tail;
    }
    chunks
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::csr::BuildOptions;

    #[test]
    fn gcn_norm_matches_dense_definition() {
        // path 0-1-2 plus isolated node 3, with self loops
        let csr = Csr::from_edges(4, &[0, 1], &[1, 2], BuildOptions::default()).unwrap().with_self_loops();
        let w = gcn_norm(&csr);
        let d = [2.0f64, 3.0, 2.0, 1.0];
        for v in 0..4 {
            for (e, &u) in (csr.row_ptr()[v] as usize..).zip(csr.row(v)) {
                let want = 1.0 / (d[u as usize] * d[v]).sqrt();
                assert!((w[e] - want).abs() < 1e-15, "edge {u}->{v}");
            }
        }
    }

    /// PyG's `gcn_norm` with `edge_weight` written out on a dense matrix: `Â = A_w + I`
    /// (`A_w[v][u]` the weight of `u → v`), `d̂(v) = Σ_u Â[v][u]`, `Â[v][u] / sqrt(d̂(u) d̂(v))`.
    #[test]
    fn weighted_gcn_norm_matches_pyg_on_a_directed_graph() {
        let opts = crate::csr::BuildOptions { symmetrise: false, ..Default::default() };
        let (src, dst, w) = ([0u32, 2, 1, 3, 0], [1u32, 1, 0, 1, 3], [0.5f32, 2.0, 3.0, 0.25, 1.5]);
        let csr = Csr::from_edges(5, &src, &dst, opts).unwrap();
        let aligned: Vec<f32> = (0..csr.num_nodes())
            .flat_map(|v| csr.row(v).iter().map(move |&u| (u, v)))
            .map(|(u, v)| w[(0..5).find(|&i| src[i] == u && dst[i] as usize == v).unwrap()])
            .collect();
        let (looped, vals) = gcn_norm_weighted(&csr, &aligned);
        let mut a = [[0f64; 5]; 5];
        for i in 0..5 {
            a[dst[i] as usize][src[i] as usize] = w[i] as f64;
        }
        for (v, row) in a.iter_mut().enumerate() {
            row[v] = 1.0;
        }
        let d: Vec<f64> = a.iter().map(|r| r.iter().sum()).collect();
        for v in 0..5 {
            assert_eq!(looped.row(v).len(), a[v].iter().filter(|&&x| x != 0.0).count());
            for (e, &u) in (looped.row_ptr()[v] as usize..).zip(looped.row(v)) {
                let want = a[v][u as usize] / (d[u as usize] * d[v]).sqrt();
                assert!((vals[e] - want).abs() < 1e-15, "edge {u}->{v}: {} against {want}", vals[e]);
            }
        }
        // weights of 1 are the unweighted normalisation
        let ones = vec![1f32; csr.num_edges()];
        assert_eq!(gcn_norm_weighted(&csr, &ones).1, gcn_norm(&csr.with_self_loops()));
    }

    #[test]
    fn mean_norm_rows_sum_to_one() {
        let csr = Csr::from_edges(5, &[0, 0, 0, 1], &[1, 2, 3, 2], BuildOptions::default()).unwrap();
        let m = mean_norm(&csr);
        for v in 0..5 {
            let s: f64 = m[csr.row_ptr()[v] as usize..csr.row_ptr()[v + 1] as usize].iter().sum();
            let want = if csr.row(v).is_empty() { 0.0 } else { 1.0 };
            assert!((s - want).abs() < 1e-12, "row {v}: {s}");
        }
    }
}
