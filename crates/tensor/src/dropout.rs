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

/// True when element (`row`, `col`) survives dropout with probability `p`.
#[inline]
pub fn keep(key: MaskKey, row: u64, col: u64, p: f64) -> bool {
    let h = mix(mix(mix(mix(mix(key.seed) ^ key.epoch) ^ key.site) ^ row) ^ col);
    ((h >> 11) as f64 * (1.0 / (1u64 << 53) as f64)) >= p
}
