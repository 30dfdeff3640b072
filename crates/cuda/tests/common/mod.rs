//! What the CUDA test files share: the device (or a note that there is none) and random data.

use grinnder_cuda::Cuda;
use grinnder_graph::rng::Stream;
use grinnder_tensor::{Mat, SparseMatrix};

/// Device 0, or `None` (printing why) on a machine without a GPU.
pub fn gpu() -> Option<Cuda> {
    match Cuda::new(0) {
        Ok(c) => Some(c),
        Err(e) => {
            eprintln!("skipped: {e}");
            None
        }
    }
}

pub fn random(rows: usize, cols: usize, seed: u64) -> Mat<f32> {
    let mut s = Stream::new(&[seed, 77]);
    Mat::from_vec(rows, cols, (0..rows * cols).map(|_| s.normal() as f32).collect())
}

pub fn random_sparse(rows: usize, cols: usize, per_row: usize, seed: u64) -> SparseMatrix {
    let mut s = Stream::new(&[seed, 78]);
    let mut row_ptr = vec![0u64];
    let mut col_idx = Vec::new();
    for _ in 0..rows {
        let mut c: Vec<u32> = (0..per_row).map(|_| s.below(cols as u64) as u32).collect();
        c.sort_unstable();
        c.dedup();
        col_idx.extend(c);
        row_ptr.push(col_idx.len() as u64);
    }
    SparseMatrix::new(rows, cols, row_ptr, col_idx)
}
