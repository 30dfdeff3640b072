//! Layer 0's fixed aggregation `Â x` built a piece of its columns at a time: a partition's
//! halo can reach most of the graph (a graph without community structure: igb-medium-like's
//! 16 partitions each read 87 % of the nodes), and its input rows at once — the whole feature
//! matrix, nearly — would not fit a host budget smaller than the features. Piece by piece,
//! only the output, one piece of input rows and the piece's entries are held.

use grinnder_graph::Dataset;
use grinnder_nn::graph::Adjacency;
use grinnder_nn::Graph;
use grinnder_tensor::{Backend, Mat, SparseMatrix};

use crate::config::{FeatureNorm, TrainError};
use crate::features::feature_rows;

use super::executor::{io_err, Executor};

/// How many input bytes one piece reads (and holds) at most: 32 MiB, or
/// `GRINNDER_INPUT_PIECE_BYTES` (a diagnostic: tests make pieces of a few rows).
pub(super) fn input_piece_bytes() -> u64 {
    std::env::var("GRINNDER_INPUT_PIECE_BYTES").ok().and_then(|v| v.parse().ok()).unwrap_or(32 << 20).max(1)
}

/// Whether `Â x` is built in pieces under a host budget of `host` bytes, where the largest
/// partition's input rows take `rows_bytes`: where two of them (the one aggregated and the next,
/// read meanwhile) would take more than an eighth of the budget. In pieces, every partition's
/// adjacency waits on the host (12 bytes an entry) and the rows are read a piece at a time:
/// papers-like at scale 0.5 over 32 partitions under `--host-mem 100GiB` took 268.8 s for its
/// first blocks in pieces (while the store spilled 38 GiB to disk: the two causes were not
/// separated) where, with no host budget, the whole rows (4.8 GB for two partitions) took
/// 28.5 s (H100, 2026-12-06). Never where the rows fit one piece; with
/// `GRINNDER_INPUT_PIECE_BYTES` set (a diagnostic), wherever they exceed one, as tests ask.
pub(super) fn in_pieces(rows_bytes: u64, host: u64) -> bool {
    let diagnostic = std::env::var_os("GRINNDER_INPUT_PIECE_BYTES").is_some();
    rows_bytes > input_piece_bytes() && (diagnostic || 2 * rows_bytes > host / 8)
}

/// The value of every entry of a CSR structure whose values are factored: `rows[r] · cols[c]`.
pub(super) fn entry_values(
    row_ptr: &[u64],
    col_idx: &[u32],
    rows: Option<&[f64]>,
    cols: Option<&[f64]>,
) -> Vec<f64> {
    let mut vals = Vec::with_capacity(col_idx.len());
    for (r, w) in row_ptr.windows(2).enumerate() {
        let rf = rows.map_or(1.0, |f| f[r]);
        vals.extend(
            col_idx[w[0] as usize..w[1] as usize].iter().map(|&c| rf * cols.map_or(1.0, |f| f[c as usize])),
        );
    }
    vals
}

/// A partition's adjacency on the host, kept from its graph's construction until `Â x` is
/// built: rows are the own rows, columns own then halo.
pub(super) struct HostAdjacency {
    pub row_ptr: Vec<u64>,
    pub col_idx: Vec<u32>,
    pub vals: Vec<f64>,
    pub cols: usize,
}

/// The rows per piece for input rows of `width` values of `elem` bytes.
pub(super) fn piece_rows(width: usize, elem: usize) -> usize {
    (input_piece_bytes() as usize / (width * elem).max(1)).max(1)
}

impl HostAdjacency {
    /// The adjacency split by column ranges of `rows` columns: for each range, its entries as
    /// a CSR over the own rows, columns renumbered from the range's start. One pass over the
    /// entries (a column range's entries keep their row order).
    pub(super) fn pieces(&self, rows: usize) -> Vec<(std::ops::Range<usize>, SparseMatrix, Vec<f64>)> {
        let own = self.row_ptr.len() - 1;
        let n = self.cols.div_ceil(rows).max(1);
        let piece = |c: u32| c as usize / rows;
        let mut start = vec![0usize; n + 1];
        for &c in &self.col_idx {
            start[piece(c) + 1] += 1;
        }
        for k in 0..n {
            start[k + 1] += start[k];
        }
        let nnz = self.col_idx.len();
        let (mut row, mut col, mut val) = (vec![0u32; nnz], vec![0u32; nnz], vec![0f64; nnz]);
        let mut at = start.clone();
        for r in 0..own {
            for e in self.row_ptr[r] as usize..self.row_ptr[r + 1] as usize {
                let c = self.col_idx[e];
                let k = piece(c);
                (row[at[k]], col[at[k]], val[at[k]]) = (r as u32, c - (k * rows) as u32, self.vals[e]);
                at[k] += 1;
            }
        }
        (0..n)
            .map(|k| {
                let range = k * rows..((k + 1) * rows).min(self.cols);
                let entries = start[k]..start[k + 1];
                let mut row_ptr = vec![0u64; own + 1];
                for &r in &row[entries.clone()] {
                    row_ptr[r as usize + 1] += 1;
                }
                for r in 0..own {
                    row_ptr[r + 1] += row_ptr[r];
                }
                let sm = SparseMatrix::csr_only(own, range.len(), row_ptr, col[entries.clone()].to_vec());
                (range, sm, val[entries].to_vec())
            })
            .collect()
    }
}

impl<B: Backend> Executor<'_, B> {
    /// `Â x` of partition `q`, whose input rows are those of dataset nodes `ids` (own, then
    /// halo), read and aggregated a piece of columns at a time.
    pub(super) fn aggregate_in_pieces(
        &mut self,
        ds: &Dataset,
        norm: FeatureNorm,
        shift: f64,
        ids: &[u32],
        adj: HostAdjacency,
    ) -> Result<B::Mat, TrainError> {
        let (own, d) = (adj.row_ptr.len() - 1, ds.features.dim);
        let aggregation = self.model.aggregation();
        let mut out = self.b.output(own, d);
        let rows = piece_rows(d, std::mem::size_of::<B::T>());
        let pieces = adj.pieces(rows);
        tracing::debug!("layer 0's aggregation over {} columns in {} pieces", adj.cols, pieces.len());
        for (k, (range, sm, vals)) in pieces.into_iter().enumerate() {
            let g = Graph::single(own, range.len(), aggregation, Adjacency::new(self.b, &sm, &vals), None);
            drop((sm, vals));
            let x = feature_rows::<B::T>(ds, norm, shift, &ids[range.clone()]).map_err(io_err)?;
            let x = self.b.upload_owned(Mat::from_vec(range.len(), d, x));
            self.model.aggregate_input_into(self.b, &g, &x, if k == 0 { 0.0 } else { 1.0 }, &mut out);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whole where two partitions' input rows take at most an eighth of the budget (papers-like
    /// at 0.5 over 32 partitions: 2.4 GB of rows a partition under 100 GiB), in pieces where
    /// more (a budget below the features); never where the rows fit one piece.
    #[test]
    fn the_first_aggregation_is_built_in_pieces_only_under_a_tight_budget() {
        if std::env::var_os("GRINNDER_INPUT_PIECE_BYTES").is_some() {
            return; // the diagnostic decides alone
        }
        const G: u64 = 1 << 30;
        assert!(!in_pieces(2_400_000_000, 100 * G));
        assert!(in_pieces(2_400_000_000, 16 * G));
        assert!(in_pieces(64 << 20, 512 << 20));
        assert!(!in_pieces(16 << 20, 64 << 20), "one piece of rows");
    }

    #[test]
    fn the_pieces_hold_every_entry_once_in_their_column_range() {
        // 3 rows over 7 columns; entry value = 10 · row + column
        let rows: Vec<Vec<u32>> = vec![vec![0, 3, 6], vec![], vec![1, 2, 4, 5, 6]];
        let mut adj = HostAdjacency { row_ptr: vec![0], col_idx: vec![], vals: vec![], cols: 7 };
        for (r, cols) in rows.iter().enumerate() {
            adj.col_idx.extend(cols);
            adj.vals.extend(cols.iter().map(|&c| (10 * r + c as usize) as f64));
            adj.row_ptr.push(adj.col_idx.len() as u64);
        }
        for piece in 1..=8 {
            let pieces = adj.pieces(piece);
            assert_eq!(pieces.len(), 7usize.div_ceil(piece));
            let mut seen = Vec::new();
            for (range, sm, vals) in &pieces {
                assert_eq!((sm.rows, sm.cols), (3, range.len()));
                for r in 0..3 {
                    let entries = sm.row_ptr[r] as usize..sm.row_ptr[r + 1] as usize;
                    for (&c, &v) in sm.col_idx[entries.clone()].iter().zip(&vals[entries]) {
                        let c = range.start + c as usize;
                        assert!(range.contains(&c));
                        assert_eq!(v, (10 * r + c) as f64);
                        seen.push((r, c));
                    }
                }
            }
            seen.sort();
            let want: Vec<(usize, usize)> = rows
                .iter()
                .enumerate()
                .flat_map(|(r, cs)| cs.iter().map(move |&c| (r, c as usize)))
                .collect();
            assert_eq!(seen, want, "pieces of {piece} columns");
        }
    }
}
