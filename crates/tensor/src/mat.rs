//! `Mat<T>`: a dense row-major matrix in host memory — the exchange type between backends,
//! files and tests.

use crate::scalar::Scalar;

/// A dense `rows × cols` matrix, row-major.
#[derive(Clone, Debug, PartialEq)]
pub struct Mat<T> {
    pub rows: usize,
    pub cols: usize,
    pub data: Vec<T>,
}

impl<T: Scalar> Mat<T> {
    pub fn zeros(rows: usize, cols: usize) -> Self {
        Mat { rows, cols, data: vec![T::zero(); rows * cols] }
    }

    /// Wraps `data` (length `rows · cols`).
    pub fn from_vec(rows: usize, cols: usize, data: Vec<T>) -> Self {
        assert_eq!(data.len(), rows * cols, "a {rows}×{cols} matrix needs {} values", rows * cols);
        Mat { rows, cols, data }
    }

    pub fn row(&self, r: usize) -> &[T] {
        &self.data[r * self.cols..(r + 1) * self.cols]
    }

    pub fn row_mut(&mut self, r: usize) -> &mut [T] {
        &mut self.data[r * self.cols..(r + 1) * self.cols]
    }

    /// Converts every element to another scalar type.
    pub fn cast<U: Scalar>(&self) -> Mat<U> {
        Mat { rows: self.rows, cols: self.cols, data: self.data.iter().map(|x| U::of(x.f64())).collect() }
    }

    /// Largest `|a - b| / max(|a|, |b|, floor)` over all elements: the relative error used by
    /// tests, with `floor` guarding elements near zero.
    pub fn max_rel_err(&self, other: &Mat<T>, floor: f64) -> f64 {
        assert_eq!((self.rows, self.cols), (other.rows, other.cols), "shapes differ");
        self.data
            .iter()
            .zip(&other.data)
            .map(|(a, b)| {
                let (a, b) = (a.f64(), b.f64());
                (a - b).abs() / a.abs().max(b.abs()).max(floor)
            })
            // a NaN on either side is an infinite error (f64::max would skip it)
            .map(|e| if e.is_nan() { f64::INFINITY } else { e })
            .fold(0.0, f64::max)
    }
}
