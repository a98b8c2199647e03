//! A distribution of ratios (utilisation, overshoot, settling times in ratios), kept to
//! 1/10,000: what the summaries' means, quantiles and extremes are read from.

use std::collections::BTreeMap;

/// A distribution of ratios, kept to 1/10,000.
#[derive(Debug, Clone, Default)]
pub struct Histogram {
    counts: BTreeMap<u32, u64>,
    n: u64,
    sum: f64,
}

impl Histogram {
    /// Adds a value.
    pub fn add(&mut self, v: f64) {
        let b = (v * 10_000.0).round().clamp(0.0, f64::from(u32::MAX)) as u32;
        *self.counts.entry(b).or_default() += 1;
        self.n += 1;
        self.sum += v;
    }

    /// Adds every value of another histogram.
    pub fn merge(&mut self, other: &Histogram) {
        for (&b, &c) in &other.counts {
            *self.counts.entry(b).or_default() += c;
        }
        self.n += other.n;
        self.sum += other.sum;
    }

    /// Number of values.
    pub fn len(&self) -> u64 {
        self.n
    }

    /// Whether it holds no value.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// The mean.
    pub fn mean(&self) -> f64 {
        if self.n == 0 {
            0.0
        } else {
            self.sum / self.n as f64
        }
    }

    /// The value at quantile `q` (0 = lowest, 1 = highest).
    pub fn quantile(&self, q: f64) -> f64 {
        if self.n == 0 {
            return 0.0;
        }
        let rank = ((self.n - 1) as f64 * q).round() as u64;
        let mut seen = 0;
        for (&b, &c) in &self.counts {
            seen += c;
            if seen > rank {
                return f64::from(b) / 10_000.0;
            }
        }
        0.0
    }

    /// The highest value.
    pub fn max(&self) -> f64 {
        self.counts
            .keys()
            .next_back()
            .map_or(0.0, |&b| f64::from(b) / 10_000.0)
    }

    /// The lowest value.
    pub fn min(&self) -> f64 {
        self.counts
            .keys()
            .next()
            .map_or(0.0, |&b| f64::from(b) / 10_000.0)
    }
}
