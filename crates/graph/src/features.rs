//! Node features as stored: float32, or narrow (float16, bfloat16) where a file keeps them so
//! (MAG240M ships its 768-wide features as float16; ogbn-papers100M's 128-wide ones take 28 GB
//! instead of 57 GB so). Whatever the storage, every reader sees float32 values: a narrow
//! value widens exactly (every float16 and bfloat16 is a float32), so training on narrow
//! features equals training on the same values stored as float32.
//!
//! Invariant: [`FeatureData`] is one [`Buf`] of one element type; readers convert rows as they
//! read them ([`FeatureData::read_into`], [`FeatureElem::to_f32`]) and never hold a widened copy
//! of the whole table.

use std::fmt;
use std::str::FromStr;

use half::{bf16, f16};
use rayon::prelude::*;

use crate::buf::{as_bytes, Buf, Pod};

/// How feature values are stored.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum FeatureDtype {
    #[default]
    F32,
    F16,
    Bf16,
}

impl FeatureDtype {
    /// Bytes per value.
    pub fn bytes(self) -> usize {
        match self {
            FeatureDtype::F32 => 4,
            FeatureDtype::F16 | FeatureDtype::Bf16 => 2,
        }
    }

    /// The name flags and files use: `f32`, `f16`, `bf16`.
    pub fn name(self) -> &'static str {
        match self {
            FeatureDtype::F32 => "f32",
            FeatureDtype::F16 => "f16",
            FeatureDtype::Bf16 => "bf16",
        }
    }

    /// The code the native file's header stores (0 is float32, what files before the field
    /// was added hold there).
    pub fn code(self) -> u32 {
        match self {
            FeatureDtype::F32 => 0,
            FeatureDtype::F16 => 1,
            FeatureDtype::Bf16 => 2,
        }
    }

    pub fn from_code(code: u32) -> Option<FeatureDtype> {
        [FeatureDtype::F32, FeatureDtype::F16, FeatureDtype::Bf16].into_iter().find(|d| d.code() == code)
    }
}

impl fmt::Display for FeatureDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for FeatureDtype {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "f32" | "float32" => Ok(FeatureDtype::F32),
            "f16" | "float16" | "half" => Ok(FeatureDtype::F16),
            "bf16" | "bfloat16" => Ok(FeatureDtype::Bf16),
            other => Err(format!("feature dtype {other:?}: use f32, f16 or bf16")),
        }
    }
}

/// An element type features may be stored as.
pub trait FeatureElem: Pod + PartialEq + fmt::Debug {
    const DTYPE: FeatureDtype;
    /// The value, exactly (every stored value is a float32).
    fn to_f32(self) -> f32;
    /// The nearest stored value to `x` (round to nearest, ties to even).
    fn from_f32(x: f32) -> Self;
}

impl FeatureElem for f32 {
    const DTYPE: FeatureDtype = FeatureDtype::F32;
    fn to_f32(self) -> f32 {
        self
    }
    fn from_f32(x: f32) -> Self {
        x
    }
}

// SAFETY: half's f16 is a transparent u16: valid for every bit pattern, no padding.
unsafe impl Pod for f16 {}
// SAFETY: as above, bf16 is a transparent u16.
unsafe impl Pod for bf16 {}

impl FeatureElem for f16 {
    const DTYPE: FeatureDtype = FeatureDtype::F16;
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    fn from_f32(x: f32) -> Self {
        f16::from_f32(x)
    }
}

impl FeatureElem for bf16 {
    const DTYPE: FeatureDtype = FeatureDtype::Bf16;
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    fn from_f32(x: f32) -> Self {
        bf16::from_f32(x)
    }
}

/// Feature values of one stored type (row-major, `rows × dim`).
#[derive(Clone, Debug, PartialEq)]
pub enum FeatureData {
    F32(Buf<f32>),
    F16(Buf<f16>),
    Bf16(Buf<bf16>),
}

/// `$body` with `$b` bound to the [`Buf`] of whichever element type `$data` holds (generic code
/// over [`FeatureElem`] written once).
#[macro_export]
macro_rules! with_feature_buf {
    ($data:expr, $b:ident => $body:expr) => {
        match $data {
            $crate::features::FeatureData::F32($b) => $body,
            $crate::features::FeatureData::F16($b) => $body,
            $crate::features::FeatureData::Bf16($b) => $body,
        }
    };
}

impl From<Vec<f32>> for FeatureData {
    fn from(v: Vec<f32>) -> Self {
        FeatureData::F32(Buf::Owned(v))
    }
}

impl From<Buf<f32>> for FeatureData {
    fn from(b: Buf<f32>) -> Self {
        FeatureData::F32(b)
    }
}

impl From<Buf<f16>> for FeatureData {
    fn from(b: Buf<f16>) -> Self {
        FeatureData::F16(b)
    }
}

impl From<Buf<bf16>> for FeatureData {
    fn from(b: Buf<bf16>) -> Self {
        FeatureData::Bf16(b)
    }
}

impl FeatureData {
    /// Number of values.
    pub fn len(&self) -> usize {
        with_feature_buf!(self, b => b.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn dtype(&self) -> FeatureDtype {
        match self {
            FeatureData::F32(_) => FeatureDtype::F32,
            FeatureData::F16(_) => FeatureDtype::F16,
            FeatureData::Bf16(_) => FeatureDtype::Bf16,
        }
    }

    /// Bytes the values take as stored.
    pub fn bytes(&self) -> u64 {
        self.len() as u64 * self.dtype().bytes() as u64
    }

    /// The values as stored, as bytes (little-endian).
    pub fn as_bytes(&self) -> &[u8] {
        with_feature_buf!(self, b => as_bytes(b))
    }

    /// The float32 values themselves where they are stored so.
    pub fn as_f32(&self) -> Option<&[f32]> {
        match self {
            FeatureData::F32(b) => Some(b),
            _ => None,
        }
    }

    /// Value `i` as float32.
    pub fn get(&self, i: usize) -> f32 {
        with_feature_buf!(self, b => b[i].to_f32())
    }

    /// Values `start..start + out.len()` as float32 into `out`: read from the file where the view
    /// reads through one ([`Buf::read_through`], pread: the pages never enter the resident set),
    /// copied (and widened) otherwise.
    pub fn read_into(&self, start: usize, out: &mut [f32]) -> std::io::Result<()> {
        match self {
            FeatureData::F32(b) => b.read_into(start, out),
            FeatureData::F16(b) => read_widened(b, start, out),
            FeatureData::Bf16(b) => read_widened(b, start, out),
        }
    }

    /// Every value as float32 (a copy: for small tables and tests).
    pub fn to_f32_vec(&self) -> Vec<f32> {
        with_feature_buf!(self, b => b.par_iter().map(|x| x.to_f32()).collect())
    }

    /// The same values stored as `dtype` (rounded to nearest where narrower; a copy unless it is
    /// the stored type already).
    pub fn to_dtype(&self, dtype: FeatureDtype) -> FeatureData {
        if dtype == self.dtype() {
            return self.clone();
        }
        fn conv<E: FeatureElem, F: FeatureElem>(b: &[E]) -> Vec<F> {
            b.par_iter().map(|x| F::from_f32(x.to_f32())).collect()
        }
        with_feature_buf!(self, b => match dtype {
            FeatureDtype::F32 => FeatureData::F32(Buf::Owned(conv(b))),
            FeatureDtype::F16 => FeatureData::F16(Buf::Owned(conv(b))),
            FeatureDtype::Bf16 => FeatureData::Bf16(Buf::Owned(conv(b))),
        })
    }

    /// See [`Buf::is_borrowed`].
    pub fn is_borrowed(&self) -> bool {
        with_feature_buf!(self, b => b.is_borrowed())
    }

    /// See [`Buf::is_mapped`].
    pub fn is_mapped(&self) -> bool {
        with_feature_buf!(self, b => b.is_mapped())
    }

    /// See [`Buf::is_file_view`].
    pub fn is_file_view(&self) -> bool {
        with_feature_buf!(self, b => b.is_file_view())
    }

    /// See [`Buf::reads_through_file`].
    pub fn reads_through_file(&self) -> bool {
        with_feature_buf!(self, b => b.reads_through_file())
    }

    /// Hands the pages of values `range` back ([`Buf::release`]).
    pub fn release(&self, range: std::ops::Range<usize>) {
        with_feature_buf!(self, b => b.release(range))
    }

    /// Hands every page back ([`Buf::release_all`]).
    pub fn release_all(&self) {
        with_feature_buf!(self, b => b.release_all())
    }
}

/// Narrow values read (through the file where the view has one) and widened into `out`, a
/// piece at a time through a small buffer.
fn read_widened<E: FeatureElem + Default>(b: &Buf<E>, start: usize, out: &mut [f32]) -> std::io::Result<()> {
    const PIECE: usize = 16 << 10;
    if !b.reads_through_file() {
        let n = out.len();
        for (o, x) in out.iter_mut().zip(&b[start..start + n]) {
            *o = x.to_f32();
        }
        return Ok(());
    }
    let mut raw = vec![E::default(); PIECE.min(out.len())];
    for (i, o) in out.chunks_mut(PIECE).enumerate() {
        let raw = &mut raw[..o.len()];
        b.read_into(start + i * PIECE, raw)?;
        for (o, x) in o.iter_mut().zip(raw.iter()) {
            *o = x.to_f32();
        }
    }
    Ok(())
}

/// Row-major `num_nodes × dim` features, owned or memory-mapped, stored as float32 or narrower.
#[derive(Clone, Debug, PartialEq)]
pub struct Features {
    pub dim: usize,
    pub data: FeatureData,
}

impl Features {
    /// Float32 features.
    pub fn new(dim: usize, data: impl Into<FeatureData>) -> Features {
        Features { dim, data: data.into() }
    }

    pub fn num_rows(&self) -> usize {
        self.data.len().checked_div(self.dim).unwrap_or(0)
    }

    pub fn dtype(&self) -> FeatureDtype {
        self.data.dtype()
    }

    /// Row `v` as float32 into `out` (`dim` values).
    pub fn row_into(&self, v: usize, out: &mut [f32]) -> std::io::Result<()> {
        assert_eq!(out.len(), self.dim, "row_into: the output holds one row");
        self.data.read_into(v * self.dim, out)
    }

    /// Row `v` as float32 (a copy).
    pub fn row(&self, v: usize) -> Vec<f32> {
        let mut r = vec![0f32; self.dim];
        with_feature_buf!(&self.data, b => {
            for (o, x) in r.iter_mut().zip(&b[v * self.dim..(v + 1) * self.dim]) {
                *o = x.to_f32();
            }
        });
        r
    }

    /// The same features stored as `dtype` ([`FeatureData::to_dtype`]).
    pub fn to_dtype(&self, dtype: FeatureDtype) -> Features {
        Features { dim: self.dim, data: self.data.to_dtype(dtype) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn narrow_values_widen_exactly_and_round_to_nearest() {
        let v: Vec<f32> = vec![0.0, 1.0, -2.5, 0.1, 65504.0, 1e-8, 3.140625];
        let f = Features::new(7, v.clone());
        for dtype in [FeatureDtype::F16, FeatureDtype::Bf16] {
            let n = f.to_dtype(dtype);
            assert_eq!(n.dtype(), dtype);
            assert_eq!(n.data.bytes(), 14);
            let w = n.data.to_f32_vec();
            for (a, b) in v.iter().zip(&w) {
                let rel = ((a - b) / a.abs().max(1e-30)).abs();
                // f16 has 11 significant bits, bf16 8; 1e-8 is below f16's subnormals
                let tol = if dtype == FeatureDtype::F16 { 2f32.powi(-11) } else { 2f32.powi(-8) };
                assert!(rel <= tol || (*a == 1e-8 && *b == 0.0), "{dtype}: {a} -> {b}");
            }
            // widening then narrowing again changes nothing
            assert_eq!(n.to_dtype(FeatureDtype::F32).to_dtype(dtype), n);
            let mut row = vec![0f32; 7];
            n.row_into(0, &mut row).unwrap();
            assert_eq!(row, w);
            assert_eq!(n.row(0), w);
        }
    }

    #[test]
    fn dtype_names_parse_and_codes_round_trip() {
        for d in [FeatureDtype::F32, FeatureDtype::F16, FeatureDtype::Bf16] {
            assert_eq!(d.name().parse::<FeatureDtype>().unwrap(), d);
            assert_eq!(FeatureDtype::from_code(d.code()), Some(d));
        }
        assert_eq!("float16".parse::<FeatureDtype>().unwrap(), FeatureDtype::F16);
        assert!("f64".parse::<FeatureDtype>().is_err());
        assert_eq!(FeatureDtype::from_code(7), None);
    }
}
