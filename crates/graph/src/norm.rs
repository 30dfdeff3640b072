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
    per_edge(looped, |u, v| inv_sqrt[u] * inv_sqrt[v])
}

/// Mean aggregation's in-degree normalisation: `1 / in-degree(v)` for every edge into `v`
/// (SAGE's mean; a node without in-neighbours aggregates zero).
pub fn mean_norm(csr: &Csr) -> Vec<f64> {
    mean_norm_with(csr, &csr.degrees())
}

/// [`mean_norm`] with each node's in-degree given (a subgraph normalised as its full graph).
pub fn mean_norm_with(csr: &Csr, degree: &[u32]) -> Vec<f64> {
    assert_eq!(degree.len(), csr.num_nodes(), "one degree per node");
    per_edge(csr, |_, v| 1.0 / degree[v] as f64)
}

/// `f(u, v)` for every stored edge `u → v`, in CSR order, rows in parallel.
fn per_edge(csr: &Csr, f: impl Fn(usize, usize) -> f64 + Sync) -> Vec<f64> {
    let mut out = vec![0f64; csr.num_edges()];
    let ptr = csr.row_ptr();
    let mut rest = out.as_mut_slice();
    let mut chunks = Vec::new();
    for r in csr.balanced_row_ranges(rayon::current_num_threads() * 4) {
        let (c, tail) = rest.split_at_mut((ptr[r.end] - ptr[r.start]) as usize);
        chunks.push((r, c));
        rest = tail;
    }
    chunks.into_par_iter().for_each(|(r, out)| {
        let base = ptr[r.start] as usize;
        for v in r {
            for (e, &u) in (ptr[v] as usize..).zip(csr.row(v)) {
                out[e - base] = f(u as usize, v);
            }
        }
    });
    out
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
