//! Element types of the CPU kernels: `f32` for training, `f64` for gradient checks.

use std::fmt::Debug;
use std::iter::Sum;
use std::ops::{AddAssign, DivAssign, MulAssign, SubAssign};

use num_traits::Float;

/// A floating-point element the kernels are generic over (plain bytes too: `Pod`, so rows
/// travel between ranks and files as they are).
pub trait Scalar:
    Float
    + Debug
    + Default
    + Send
    + Sync
    + Sum
    + AddAssign
    + SubAssign
    + MulAssign
    + DivAssign
    + bytemuck::Pod
    + 'static
{
    fn of(x: f64) -> Self;
    fn f64(self) -> f64;
    /// `dst[i] = src[i]` (a plain copy for `f32`).
    fn copy_from_f32(dst: &mut [Self], src: &[f32]);
}

impl Scalar for f32 {
    fn of(x: f64) -> Self {
        x as f32
    }
    fn f64(self) -> f64 {
        self as f64
    }
    fn copy_from_f32(dst: &mut [f32], src: &[f32]) {
        dst.copy_from_slice(src);
    }
}

impl Scalar for f64 {
    fn of(x: f64) -> Self {
        x
    }
    fn f64(self) -> f64 {
        self
    }
    fn copy_from_f32(dst: &mut [f64], src: &[f32]) {
        assert_eq!(dst.len(), src.len(), "copy: lengths differ");
        dst.iter_mut().zip(src).for_each(|(d, &s)| *d = s as f64);
    }
}
