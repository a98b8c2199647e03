//! Demand: when requests arrive, at which region, for which key.
//!
//! Arrivals are Poisson processes with piecewise-constant rates, drawn from the run's
//! `demand` stream, so every policy of a run sees exactly the same requests.

use levee_testkit::rng::SeededRng;

use crate::plan::{Request, WINDOW_MS};

/// The shape of a run's demand. Factors are in limits per window: `2.0` asks for twice the
/// limit every window, summed over regions.
#[derive(Debug, Clone, PartialEq)]
pub enum Demand {
    /// Every region asks the same.
    Uniform {
        /// Total demand in limits per window.
        factor: f64,
    },
    /// One region asks 90 %, the others share the remaining 10 % evenly.
    Skewed {
        /// Total demand in limits per window.
        factor: f64,
        /// The busy region.
        hot: usize,
    },
    /// Like `Skewed`, but the busy region changes every `every_ms`.
    HotMoves {
        /// Total demand in limits per window.
        factor: f64,
        /// How long a region stays the busy one, ms.
        every_ms: u64,
    },
    /// Low, even demand with short bursts at one region at a time.
    Bursts {
        /// The base demand in limits per window.
        base: f64,
        /// How many bursts.
        bursts: usize,
    },
    /// Many keys of Zipf-like popularity, each spread over the regions in its own way.
    ManyKeys {
        /// Number of keys.
        keys: usize,
        /// The busiest key's demand in limits per window.
        top_factor: f64,
    },
}

/// Appends Poisson arrivals at `per_window` requests per window in `[from, to)`.
pub fn poisson(
    rng: &mut SeededRng,
    (from, to): (u64, u64),
    per_window: f64,
    region: usize,
    key: u32,
    out: &mut Vec<Request>,
) {
    if per_window <= 0.0 || to <= from {
        return;
    }
    let mean_gap = WINDOW_MS as f64 / per_window;
    let mut t = from as f64 + rng.exp(mean_gap);
    while t < to as f64 {
        out.push(Request::one(t as u64, region, key));
        t += rng.exp(mean_gap);
    }
}

/// The keys and requests of `demand` over `duration_ms`, for `regions` regions and a limit of
/// `limit` per window. Key 0 is the main key.
pub fn generate(
    demand: &Demand,
    rng: &mut SeededRng,
    regions: usize,
    limit: u64,
    duration_ms: u64,
) -> (Vec<String>, Vec<Request>) {
    let l = limit as f64;
    let mut out = Vec::new();
    let mut keys = vec!["tenant-0".to_owned()];
    let skewed_rates = |factor: f64, hot: usize| -> Vec<f64> {
        (0..regions)
            .map(|r| {
                if regions == 1 {
                    factor * l
                } else if r == hot {
                    0.9 * factor * l
                } else {
                    0.1 * factor * l / (regions - 1) as f64
                }
            })
            .collect()
    };
    match *demand {
        Demand::Uniform { factor } => {
            for r in 0..regions {
                poisson(
                    rng,
                    (0, duration_ms),
                    factor * l / regions as f64,
                    r,
                    0,
                    &mut out,
                );
            }
        }
        Demand::Skewed { factor, hot } => {
            for (r, rate) in skewed_rates(factor, hot).into_iter().enumerate() {
                poisson(rng, (0, duration_ms), rate, r, 0, &mut out);
            }
        }
        Demand::HotMoves { factor, every_ms } => {
            let mut from = 0;
            let mut hot = rng.index(regions);
            while from < duration_ms {
                let to = (from + every_ms).min(duration_ms);
                for (r, rate) in skewed_rates(factor, hot).into_iter().enumerate() {
                    poisson(rng, (from, to), rate, r, 0, &mut out);
                }
                hot = (hot + 1 + rng.index(regions.max(2) - 1)) % regions;
                from = to;
            }
        }
        Demand::Bursts { base, bursts } => {
            for r in 0..regions {
                poisson(
                    rng,
                    (0, duration_ms),
                    base * l / regions as f64,
                    r,
                    0,
                    &mut out,
                );
            }
            for _ in 0..bursts {
                let len = rng.range(100, 400);
                let at = rng.range(0, duration_ms.saturating_sub(len));
                let volume = l * (0.5 + 1.5 * rng.unit());
                let per_window = volume * WINDOW_MS as f64 / len as f64;
                let region = rng.index(regions);
                poisson(rng, (at, at + len), per_window, region, 0, &mut out);
            }
        }
        Demand::ManyKeys {
            keys: n,
            top_factor,
        } => {
            keys = (0..n).map(|i| format!("tenant-{i}")).collect();
            for k in 0..n {
                let per_window = top_factor * l / (k + 1) as f64;
                let weights: Vec<f64> = (0..regions).map(|_| 0.05 + rng.unit()).collect();
                let sum: f64 = weights.iter().sum();
                for (r, w) in weights.into_iter().enumerate() {
                    poisson(
                        rng,
                        (0, duration_ms),
                        per_window * w / sum,
                        r,
                        k as u32,
                        &mut out,
                    );
                }
            }
        }
    }
    out.sort_by_key(|r| r.at);
    (keys, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_demand_asks_about_the_factor_times_the_limit_per_window() {
        let mut rng = SeededRng::new(3);
        let (_, reqs) = generate(&Demand::Uniform { factor: 2.0 }, &mut rng, 3, 500, 20_000);
        let per_window = reqs.len() as f64 / 20.0;
        assert!((900.0..1100.0).contains(&per_window), "{per_window}");
        assert!(reqs.windows(2).all(|w| w[0].at <= w[1].at));
    }

    #[test]
    fn skewed_demand_sends_nine_tenths_to_the_hot_region() {
        let mut rng = SeededRng::new(4);
        let (_, reqs) = generate(
            &Demand::Skewed {
                factor: 2.0,
                hot: 1,
            },
            &mut rng,
            3,
            1_000,
            10_000,
        );
        let hot = reqs.iter().filter(|r| r.region == 1).count() as f64;
        let share = hot / reqs.len() as f64;
        assert!((0.88..0.92).contains(&share), "{share}");
    }
}
