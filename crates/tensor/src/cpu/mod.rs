//! The CPU backend: matrices in host memory, gemm through the `gemm` crate, everything else
//! row-parallel with rayon. Generic over `f32` and `f64`.

mod dense;
mod sparse;

use std::marker::PhantomData;
use std::sync::Arc;

use rayon::prelude::*;

use crate::backend::{
    Binary, DenseOps, GraphOps, HandOffs, MaskKey, Memory, PairGrads, Rows, StepRule, TrainOps, Transfers,
    Unary,
};
use crate::mat::Mat;
use crate::scalar::Scalar;
use crate::sparse::SparseMatrix;

/// The CPU backend for element type `T`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Cpu<T>(PhantomData<T>);

impl<T> Cpu<T> {
    pub const fn new() -> Self {
        Cpu(PhantomData)
    }
}

impl<T: Scalar> Memory for Cpu<T> {
    type T = T;
    type Mat = Mat<T>;
    type Sparse = Arc<SparseMatrix>;
    type HostBlock = Mat<T>;
    type Arriving = Mat<T>;
    type Loss = (f64, usize);
    type Leaving = Mat<T>;
    fn output(&self, rows: usize, cols: usize) -> Mat<T> {
        if cfg!(debug_assertions) {
            Mat::from_vec(rows, cols, vec![T::nan(); rows * cols])
        } else {
            Mat::zeros(rows, cols)
        }
    }
    fn zeros(&self, rows: usize, cols: usize) -> Mat<T> {
        Mat::zeros(rows, cols)
    }
    fn dims(&self, m: &Mat<T>) -> (usize, usize) {
        (m.rows, m.cols)
    }
    fn copy(&self, src: &Mat<T>, dst: &mut Mat<T>) {
        assert_eq!((src.rows, src.cols), (dst.rows, dst.cols), "copy between different shapes");
        dst.data.copy_from_slice(&src.data);
    }
}

impl<T: Scalar> Transfers for Cpu<T> {
    fn sparse(&self, s: &SparseMatrix) -> Self::Sparse {
        Arc::new(s.clone().with_transpose())
    }
    fn upload(&self, m: &Mat<T>) -> Mat<T> {
        m.clone()
    }
    fn download(&self, m: &Mat<T>) -> Mat<T> {
        m.clone()
    }
    fn upload_owned(&self, m: Mat<T>) -> Mat<T> {
        m
    }
    fn download_owned(&self, m: Mat<T>) -> Mat<T> {
        m
    }
    fn download_with(&self, m: &Mat<T>, read: &mut dyn FnMut(&[T])) {
        read(&m.data)
    }
    fn host_block(&self, m: Mat<T>) -> Result<Mat<T>, Mat<T>> {
        Ok(m)
    }
    fn download_into_host_block(&self, m: &Mat<T>, from: usize, h: &mut Mat<T>) {
        assert!(m.cols == h.cols && from + h.rows <= m.rows, "download: shapes");
        h.data.copy_from_slice(&m.data[from * m.cols..(from + h.rows) * m.cols]);
    }
    fn scatter_add_host_block(&self, m: &Mat<T>, from: usize, rows: Rows<'_>, h: &mut Mat<T>) {
        dense::scatter_add_rows(m, from, rows, h)
    }
    fn zero_host_block(&self, h: &mut Mat<T>) {
        h.data.par_iter_mut().for_each(|x| *x = T::of(0.0));
    }
    fn host_block_dims(&self, h: &Mat<T>) -> (usize, usize) {
        (h.rows, h.cols)
    }
    fn host_block_mut<'h>(&self, h: &'h mut Mat<T>) -> &'h mut [T] {
        &mut h.data
    }
    fn gather_host_block(&self, h: &Mat<T>, rows: Rows<'_>, out: &mut Mat<T>, at: usize) {
        dense::gather_rows(h, rows, out, at)
    }
}

impl<T: Scalar> HandOffs for Cpu<T> {
    fn upload_host_rows(&self, h: &Mat<T>, rows: usize) -> Mat<T> {
        assert!(rows <= h.rows, "{rows} rows of a {}-row block", h.rows);
        Mat::from_vec(rows, h.cols, h.data[..rows * h.cols].to_vec())
    }
    fn arrived(&self, m: Mat<T>) -> Mat<T> {
        m
    }
    fn download_ahead(&self, m: Mat<T>) -> Mat<T> {
        m
    }
    fn downloaded(&self, l: Mat<T>, read: &mut dyn FnMut(&[T])) {
        read(&l.data)
    }
}

impl<T: Scalar> DenseOps for Cpu<T> {
    fn gemm(&self, alpha: f64, a: &Mat<T>, ta: bool, b: &Mat<T>, tb: bool, beta: f64, c: &mut Mat<T>) {
        dense::gemm(alpha, a, ta, b, tb, beta, c)
    }
    fn gather_rows(&self, x: &Mat<T>, rows: Rows<'_>, out: &mut Mat<T>, at: usize) {
        dense::gather_rows(x, rows, out, at)
    }
    fn scatter_add_rows(&self, src: &Mat<T>, from: usize, rows: Rows<'_>, out: &mut Mat<T>) {
        dense::scatter_add_rows(src, from, rows, out)
    }
    fn unary(&self, op: Unary, x: &mut Mat<T>) {
        dense::unary(op, x)
    }
    fn binary(&self, op: Binary, a: &Mat<T>, b: &mut Mat<T>) {
        dense::binary(op, a, b)
    }
    fn add_row(&self, row: &Mat<T>, x: &mut Mat<T>) {
        dense::add_row(row, x)
    }
    fn col_sums(&self, x: &Mat<T>, beta: f64, out: &mut Mat<T>) {
        dense::col_sums(x, beta, out)
    }
    fn dropout(&self, key: MaskKey, p: f64, ids: Option<&[u32]>, x: &mut Mat<T>) {
        dense::dropout(key, p, ids, x)
    }
    fn layer_norm(
        &self,
        x: &Mat<T>,
        gamma: &Mat<T>,
        beta: &Mat<T>,
        eps: f64,
        y: &mut Mat<T>,
        stats: &mut Mat<T>,
    ) {
        dense::layer_norm(x, gamma, beta, eps, y, stats)
    }
    fn layer_norm_backward(
        &self,
        x: &Mat<T>,
        gamma: &Mat<T>,
        stats: &Mat<T>,
        dy: &Mat<T>,
        dx: &mut Mat<T>,
        dgamma: &mut Mat<T>,
        dbeta: &mut Mat<T>,
    ) {
        dense::layer_norm_backward(x, gamma, stats, dy, dx, dgamma, dbeta)
    }
}

impl<T: Scalar> GraphOps for Cpu<T> {
    fn spmm(
        &self,
        s: &Self::Sparse,
        vals: &Mat<T>,
        transpose: bool,
        x: &Mat<T>,
        beta: f64,
        out: &mut Mat<T>,
    ) {
        sparse::spmm(s, vals, transpose, x, beta, out)
    }
    fn spmm_factored(
        &self,
        s: &Self::Sparse,
        rows: Option<&Mat<T>>,
        cols: Option<&Mat<T>>,
        transpose: bool,
        x: &Mat<T>,
        beta: f64,
        out: &mut Mat<T>,
    ) {
        sparse::spmm_factored(s, rows, cols, transpose, x, beta, out)
    }
    fn sddmm(&self, s: &Self::Sparse, a: &Mat<T>, b: &Mat<T>, out: &mut Mat<T>) {
        sparse::sddmm(s, a, b, out)
    }
    fn head_dots(&self, z: &Mat<T>, att: &Mat<T>, out: &mut Mat<T>) {
        sparse::head_dots(z, att, out)
    }
    fn head_dots_backward(&self, z: &Mat<T>, att: &Mat<T>, ds: &Mat<T>, dz: &mut Mat<T>, datt: &mut Mat<T>) {
        sparse::head_dots_backward(z, att, ds, dz, datt)
    }
    fn edge_softmax(&self, s: &Self::Sparse, src: &Mat<T>, dst: &Mat<T>, slope: f64, alpha: &mut Mat<T>) {
        sparse::edge_softmax(s, src, dst, slope, alpha)
    }
    fn edge_softmax_backward(
        &self,
        s: &Self::Sparse,
        src: &Mat<T>,
        dst: &Mat<T>,
        slope: f64,
        alpha: &Mat<T>,
        dalpha: &Mat<T>,
        dpre: &mut Mat<T>,
    ) {
        sparse::edge_softmax_backward(s, src, dst, slope, alpha, dalpha, dpre)
    }
    fn pair_softmax(
        &self,
        s: &Self::Sparse,
        xl: &Mat<T>,
        xr: &Mat<T>,
        att: &Mat<T>,
        slope: f64,
        alpha: &mut Mat<T>,
    ) {
        sparse::pair_softmax(s, xl, xr, att, slope, alpha)
    }
    fn pair_softmax_backward(
        &self,
        s: &Self::Sparse,
        xl: &Mat<T>,
        xr: &Mat<T>,
        att: &Mat<T>,
        slope: f64,
        alpha: &Mat<T>,
        dalpha: &Mat<T>,
        grads: PairGrads<'_, Mat<T>>,
    ) {
        sparse::pair_softmax_backward(s, xl, xr, att, slope, alpha, dalpha, grads.dxl, grads.dxr, grads.datt)
    }
    fn edge_dropout(&self, s: &Self::Sparse, key: MaskKey, p: f64, vals: &mut Mat<T>) {
        sparse::edge_dropout(s, key, p, vals)
    }
}

impl<T: Scalar> TrainOps for Cpu<T> {
    fn cross_entropy_later(
        &self,
        logits: &Mat<T>,
        labels: &[i32],
        rows: &[u32],
        scale: f64,
        grad: &mut Mat<T>,
    ) -> (f64, usize) {
        dense::cross_entropy(logits, labels, rows, scale, grad)
    }
    fn loss_value(&self, l: (f64, usize)) -> (f64, usize) {
        l
    }
    fn step(&self, rule: StepRule, p: &mut Mat<T>, g: &Mat<T>, s1: &mut Mat<T>, s2: &mut Mat<T>) {
        dense::step(rule, p, g, s1, s2)
    }
    fn count_correct(&self, logits: &Mat<T>, labels: &[i32], rows: &[u32]) -> usize {
        dense::count_correct(logits, labels, rows)
    }
}
