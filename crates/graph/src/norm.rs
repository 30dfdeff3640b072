//! Normalisation coefficients computed on the whole graph and stored as edge values, so that a
//! partition or a mini-batch later computes exactly what the full graph would (DESIGN.md §3).
//!
//! Values are aligned with `Csr::col_idx` (one per stored edge `u → v` in row `v`).

use rayon::prelude::*;

use crate::csr::Csr;

/// GCN's symmetric normalisation `D̂^{-1/2} (A + I) D̂^{-1/2}` (Kipf & Welling), with
/// `d̂(v) = in-degree(v) + 1` counted on targets as PyG's `gcn_norm` does.
///
/// Returns `(edge_values, self_values)`: `edge_values[e] = 1 / sqrt(d̂(u) d̂(v))` for stored edge
/// `e = u → v`, and `self_values[v] = 1 / d̂(v)` for the implicit self loop. `csr` must not
/// contain self loops (they are added implicitly).
pub fn gcn_norm(csr: &Csr) -> (Vec<f32>, Vec<f32>) {
    assert_eq!(csr.num_self_loops(), 0, "gcn_norm adds self loops itself");
    let inv_sqrt: Vec<f64> = csr.degrees().par_iter().map(|&d| 1.0 / ((d as f64) + 1.0).sqrt()).collect();
    let self_values = inv_sqrt.par_iter().map(|&x| (x * x) as f32).collect();
    let mut edge_values = vec![0f32; csr.num_edges()];
    let ptr = csr.row_ptr();
    let mut rest = edge_values.as_mut_slice();
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
                out[e - base] = (inv_sqrt[u as usize] * inv_sqrt[v]) as f32;
            }
        }
    });
    (edge_values, self_values)
}

/// Mean aggregation's in-degree normalisation: `1 / in-degree(v)` for every edge into `v`
/// (SAGE's mean; a node without in-neighbours aggregates zero).
pub fn mean_norm(csr: &Csr) -> Vec<f32> {
    let deg = csr.degrees();
    let mut out = vec![0f32; csr.num_edges()];
    let ptr = csr.row_ptr();
    out.par_iter_mut().enumerate().for_each(|(e, x)| {
        // the row holding edge e: last v with ptr[v] <= e
        let v = ptr.partition_point(|&p| p <= e as u64) - 1;
        *x = 1.0 / deg[v] as f32;
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::csr::BuildOptions;

    #[test]
    fn gcn_norm_matches_dense_definition() {
        // path 0-1-2 plus isolated node 3
        let csr = Csr::from_edges(4, &[0, 1], &[1, 2], BuildOptions::default()).unwrap();
        let (e, s) = gcn_norm(&csr);
        let d = [2.0f64, 3.0, 2.0, 1.0];
        assert_eq!(csr.row(1), &[0, 2]);
        let want_row1 = [1.0 / (d[0] * d[1]).sqrt(), 1.0 / (d[2] * d[1]).sqrt()];
        let got_row1 = &e[csr.row_ptr()[1] as usize..csr.row_ptr()[2] as usize];
        for (g, w) in got_row1.iter().zip(want_row1) {
            assert!((*g as f64 - w).abs() < 1e-7);
        }
        for v in 0..4 {
            assert!((s[v] as f64 - 1.0 / d[v]).abs() < 1e-7);
        }
    }

    #[test]
    fn mean_norm_rows_sum_to_one() {
        let csr = Csr::from_edges(5, &[0, 0, 0, 1], &[1, 2, 3, 2], BuildOptions::default()).unwrap();
        let m = mean_norm(&csr);
        for v in 0..5 {
            let s: f32 = m[csr.row_ptr()[v] as usize..csr.row_ptr()[v + 1] as usize].iter().sum();
            let want = if csr.row(v).is_empty() { 0.0 } else { 1.0 };
            assert!((s - want).abs() < 1e-6, "row {v}: {s}");
        }
    }
}
