//! Counter-based random numbers: every value is a pure function of a key (seed, stream, index),
//! so results do not depend on thread count or on the order in which work is done.
//!
//! The mixer is SplitMix64's finaliser applied to a combination of the key words; it passes
//! the statistical needs of graph generation and dropout masks, not cryptography.

/// Mixes one 64-bit word into a well-distributed 64-bit hash (SplitMix64 finaliser).
#[inline]
pub fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A hash of a key of several words; distinct keys give independent-looking values.
#[inline]
pub fn hash_key(words: &[u64]) -> u64 {
    let mut h = 0x243F_6A88_85A3_08D3_u64;
    for &w in words {
        h = mix64(h ^ w);
    }
    h
}

/// Maps 64 random bits to a uniform f64 in [0, 1).
#[inline]
pub fn unit_f64(bits: u64) -> f64 {
    (bits >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// A small sequential generator for one stream, started from a key.
#[derive(Clone, Debug)]
pub struct Stream {
    state: u64,
}

impl Stream {
    /// A stream determined entirely by `key`.
    pub fn new(key: &[u64]) -> Self {
        Stream { state: hash_key(key) }
    }

    /// The next 64 random bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    #[inline]
    pub fn next_f64(&mut self) -> f64 {
        unit_f64(self.next_u64())
    }

    /// Uniform integer in [0, n) by Lemire's multiply-shift (n > 0).
    #[inline]
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }

    /// `v` in a uniformly random order (Fisher–Yates from the end, [`Stream::below`] per step).
    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            v.swap(i, self.below(i as u64 + 1) as usize);
        }
    }

    /// A standard normal sample (Box–Muller, one of the pair).
    #[inline]
    pub fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.next_f64();
        let u2 = self.next_f64();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }
}

/// Lets distributions of the `rand_distr` crate (e.g. its ziggurat normal) draw from a stream.
impl rand_core::RngCore for Stream {
    fn next_u32(&mut self) -> u32 {
        (self.next_u64() >> 32) as u32
    }
    fn next_u64(&mut self) -> u64 {
        Stream::next_u64(self)
    }
    fn fill_bytes(&mut self, dst: &mut [u8]) {
        for chunk in dst.chunks_mut(8) {
            let b = Stream::next_u64(self).to_le_bytes();
            chunk.copy_from_slice(&b[..chunk.len()]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_reproducible_and_distinct() {
        let a: Vec<u64> = (0..4).map(|_| 0).scan(Stream::new(&[1, 2]), |s, _| Some(s.next_u64())).collect();
        let b: Vec<u64> = (0..4).map(|_| 0).scan(Stream::new(&[1, 2]), |s, _| Some(s.next_u64())).collect();
        let c: Vec<u64> = (0..4).map(|_| 0).scan(Stream::new(&[1, 3]), |s, _| Some(s.next_u64())).collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn uniform_and_normal_moments() {
        let mut s = Stream::new(&[7]);
        let n = 200_000;
        let (mut m, mut m2, mut u) = (0.0, 0.0, 0.0);
        for _ in 0..n {
            let x = s.normal();
            m += x;
            m2 += x * x;
            u += s.next_f64();
        }
        let (m, v, u) = (m / n as f64, m2 / n as f64, u / n as f64);
        assert!(m.abs() < 0.01, "normal mean {m}");
        assert!((v - 1.0).abs() < 0.02, "normal variance {v}");
        assert!((u - 0.5).abs() < 0.01, "uniform mean {u}");
        assert!((0..1000).all(|_| s.below(7) < 7));
    }
}
