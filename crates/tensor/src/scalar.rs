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

/// bf16 by round-to-nearest-even of the f32 bits (NaN stays NaN, made quiet): the encoding of
/// the tiered store's bf16 blocks, on the host and (the same bits) in the CUDA kernels.
pub fn to_bf16(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        return ((b >> 16) | 0x40) as u16;
    }
    ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) as u16
}

/// The f32 a bf16 holds (exact).
pub fn from_bf16(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}
