//! A Zipf sampler and a small xorshift generator (no `rand` dependency).
//!
//! [`Zipf::new(n, s)`](Zipf::new) precomputes the cumulative distribution of ranks `1..=n` with
//! weights `1 / rank^s`; [`Zipf::sample`] draws a uniform number and binary-searches it. Rank `r`
//! is returned as key `r - 1`, so key 0 is the hottest.

/// xorshift64* generator: fast, deterministic, good enough for workload generation.
#[derive(Clone, Debug)]
pub struct XorShift(u64);

impl XorShift {
    /// A generator from `seed` (any value; 0 is remapped).
    pub fn new(seed: u64) -> Self {
        XorShift(if seed == 0 {
            0x9E37_79B9_7F4A_7C15
        } else {
            seed
        })
    }

    /// Next 64 random bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `[0, 1)`.
    #[inline]
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// Zipf(`s`) over keys `0..n`.
#[derive(Clone, Debug)]
pub struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    /// The distribution over `n` keys with exponent `s`.
    pub fn new(n: usize, s: f64) -> Self {
        assert!(n > 0, "at least one key");
        let mut cdf = Vec::with_capacity(n);
        let mut acc = 0.0;
        for rank in 1..=n {
            acc += (rank as f64).powf(-s);
            cdf.push(acc);
        }
        for c in &mut cdf {
            *c /= acc;
        }
        Zipf { cdf }
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.cdf.len()
    }

    /// Always false: a distribution has at least one key.
    pub fn is_empty(&self) -> bool {
        self.cdf.is_empty()
    }

    /// Probability of key `k`.
    pub fn probability(&self, k: usize) -> f64 {
        if k == 0 {
            self.cdf[0]
        } else {
            self.cdf[k] - self.cdf[k - 1]
        }
    }

    /// Draws a key.
    #[inline]
    pub fn sample(&self, rng: &mut XorShift) -> u64 {
        let u = rng.next_f64();
        let i = self.cdf.partition_point(|&c| c <= u);
        i.min(self.cdf.len() - 1) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_generator_is_roughly_uniform() {
        let mut rng = XorShift::new(1);
        let mut buckets = [0u32; 10];
        for _ in 0..100_000 {
            let u = rng.next_f64();
            assert!((0.0..1.0).contains(&u));
            buckets[(u * 10.0) as usize] += 1;
        }
        for b in buckets {
            assert!((9_000..11_000).contains(&b), "{buckets:?}");
        }
    }

    #[test]
    fn zipf_frequencies_follow_the_law() {
        let n = 1000;
        let z = Zipf::new(n, 1.1);
        let mut rng = XorShift::new(42);
        let draws = 400_000;
        let mut counts = vec![0u32; n];
        for _ in 0..draws {
            let k = z.sample(&mut rng) as usize;
            assert!(k < n);
            counts[k] += 1;
        }
        // The hottest keys match their probabilities within a few percent.
        for (k, &count) in counts.iter().enumerate().take(5) {
            let expected = z.probability(k) * draws as f64;
            let err = (f64::from(count) - expected).abs() / expected;
            assert!(err < 0.05, "key {k}: {count} vs {expected:.0}");
        }
        // Ratio of ranks 1 and 2 is 2^1.1 ≈ 2.14.
        let ratio = f64::from(counts[0]) / f64::from(counts[1]);
        assert!((1.95..2.35).contains(&ratio), "ratio {ratio}");
        // Monotone on average: the first decile of keys gets far more than the last.
        let head: u32 = counts[..100].iter().sum();
        let tail: u32 = counts[900..].iter().sum();
        assert!(head > 10 * tail, "head {head} tail {tail}");
        // Every draw accounted for, and the tail is reachable.
        assert_eq!(counts.iter().sum::<u32>(), draws);
        assert!(counts[500..].iter().any(|&c| c > 0));
    }

    #[test]
    fn probabilities_sum_to_one() {
        let z = Zipf::new(100_000, 1.1);
        let total: f64 = (0..z.len()).map(|k| z.probability(k)).sum();
        assert!((total - 1.0).abs() < 1e-9);
        assert!(!z.is_empty());
    }
}
