//! Dropout masks from a counter-based hash: the decision for element (row, column) at a
//! dropout site depends only on (seed, epoch, site, row, column), so the same node gets the
//! same mask in every partition that computes it and in every recomputation.

use crate::backend::MaskKey;

#[inline]
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The drop threshold of probability `p` on 16-bit uniforms.
#[inline]
pub fn threshold(p: f64) -> u32 {
    (p * 65536.0).round() as u32
}

/// Keep decisions for columns `4q .. 4q + 4` of `row`: one hash yields four 16-bit uniforms,
/// an element is kept when its uniform is at least `threshold(p)` (probability `1 - p` up to
/// 2⁻¹⁶).
#[inline]
pub fn keep4(key: MaskKey, row: u64, quad: u64, threshold: u32) -> [bool; 4] {
    let h = mix(mix(mix(mix(mix(key.seed) ^ key.epoch) ^ key.site) ^ row) ^ quad);
    std::array::from_fn(|i| ((h >> (16 * i)) & 0xFFFF) as u32 >= threshold)
}

/// True when element (`row`, `col`) survives dropout with probability `p`.
#[inline]
pub fn keep(key: MaskKey, row: u64, col: u64, p: f64) -> bool {
    keep4(key, row, col / 4, threshold(p))[(col % 4) as usize]
}
