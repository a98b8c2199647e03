//! A small seeded generator for the fault proxy's decisions (loss, duplication, jitter,
//! reordering). Every scenario has a seed, printed in its report; each direction of each link
//! draws from its own stream derived from it, so one link's traffic never shifts another's
//! draws.

/// SplitMix64: tiny, fast, and good enough to decide which datagram to drop.
#[derive(Debug, Clone)]
pub struct ChaosRng {
    state: u64,
}

impl ChaosRng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> ChaosRng {
        ChaosRng { state: seed }
    }

    /// An independent stream `stream` of `seed`.
    pub fn derive(seed: u64, stream: u64) -> ChaosRng {
        let mut r = ChaosRng::new(seed ^ stream.wrapping_mul(0xA076_1D64_78BD_642F));
        // Mix once so neighbouring streams do not start from neighbouring states.
        r.next_u64();
        r
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// True with probability `p` (never for `p <= 0`, always for `p >= 1`).
    pub fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && self.unit() < p
    }

    /// Uniform in `0..=max`.
    pub fn up_to(&mut self, max: u64) -> u64 {
        if max == 0 {
            0
        } else {
            self.next_u64() % (max + 1)
        }
    }
}

/// A stable 64-bit hash of a name (FNV-1a), to derive a scenario's seed from the run's seed.
pub fn stable_hash(name: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_draws_the_same_sequence_and_streams_differ() {
        let a: Vec<u64> = (0..8).map(|_| ChaosRng::derive(7, 1).next_u64()).collect();
        assert!(a.windows(2).all(|w| w[0] == w[1]));
        let mut x = ChaosRng::derive(7, 1);
        let mut y = ChaosRng::derive(7, 2);
        assert_ne!(x.next_u64(), y.next_u64());
    }

    #[test]
    fn chance_follows_its_probability() {
        let mut r = ChaosRng::new(42);
        let hits = (0..100_000).filter(|_| r.chance(0.2)).count();
        assert!((19_000..21_000).contains(&hits), "{hits}");
        assert!(!(0..1000).any(|_| r.chance(0.0)));
        assert!((0..1000).all(|_| r.chance(1.0)));
    }
}
