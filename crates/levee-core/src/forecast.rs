//! A node's forecast of its own demand for a key.
//!
//! Donors in strict mode give away what they do not expect to need. A short memory gives
//! rights away at every dip of noisy demand and starves small regions; so the forecast keeps a
//! long memory (a time constant of half an epoch, at most 10 s) and a detector for real shifts: when a short
//! average stays far from the long one for several samples in a row, by a factor and by more
//! than a Poisson count's noise, the long one jumps to it. Where requests cost more than one
//! token, a count of tokens varies more than a Poisson count of as many (by the costs' cost²
//! over cost), and a drop is judged against that ([`Forecast::sample_costs`]).

use crate::time::Millis;

/// The longest memory of the forecast, in ms.
const MAX_LONG_MEMORY_MS: f64 = 10_000.0;
/// How many samples in a row the short average must disagree before the forecast follows it.
const SHIFT_SAMPLES: u8 = 3;
/// How far (as a factor) the short average must be from the long one to count as a shift.
const SHIFT_FACTOR: f64 = 2.0;
/// How many standard deviations of a Poisson count the requests the short average saw must
/// also be from what the long one expects over the same time, to count as a shift. At 40
/// requests a second on a 1 s window (2.5 requests in the short memory) a 100 ms gap made the
/// factor alone, and the forecast dropped to a fifth: donors gave away rights the next
/// requests needed, and took them back a round trip later (`levee-sim --seed 1255 --scenario
/// region-isolated`). Chosen on the simulator's figures: 2 made the hot region's p1 worse
/// (0.963, against 0.971 before and 0.977 with 1), docs/accuracy.md.
const SHIFT_SIGNIFICANCE: f64 = 1.0;

/// The same for a drop: how many standard deviations fewer requests than the long memory
/// expects. A drop costs more when it is noise than a rise does: the node gives away the
/// rights of its current window at once, and they come back an interval at a time, too late
/// on a clock ahead of the others (`levee-sim --seed 5625 --scenario region-isolated`: no
/// request for 80 ms early in a window where 4 were expected, the forecast fell from 44 to
/// 10 and 33 rights left). The long memory still follows a real drop within about its time
/// constant.
const DROP_SIGNIFICANCE: f64 = 1.5;

/// Exponentially weighted demand rate, in tokens per millisecond.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Forecast {
    long: f64,
    short: f64,
    /// How much more a count of tokens varies than a Poisson count: a long average of the
    /// requests' cost² over their cost (1 when every request costs 1; 7 at costs drawn from
    /// 1–10). 0 until a sample saw requests, read as 1.
    dispersion: f64,
    last_at: Millis,
    disagree: u8,
    primed: bool,
    started: bool,
}

impl Forecast {
    /// A forecast whose clock starts at `now`: the next sample measures from there.
    pub fn starting_at(now: Millis) -> Forecast {
        Forecast {
            last_at: now,
            started: true,
            ..Forecast::default()
        }
    }

    /// When the last sample was taken (or the clock started).
    pub fn sampled_at(&self) -> Millis {
        self.last_at
    }

    /// Takes a sample at time `now` of the `requested` tokens (admitted or not) since the last
    /// one; `epoch_ms` is the rule's window (or period) length, which sets the memory. Returns
    /// whether the sample was taken (the caller then starts counting from zero); it is not
    /// when no time has passed. The first sample of a forecast that was not started only
    /// starts the clock: what was requested before it is not a rate.
    pub fn sample(&mut self, now: Millis, requested: u64, epoch_ms: Millis) -> bool {
        self.sample_costs(now, requested, requested, epoch_ms)
    }

    /// [`Forecast::sample`] of requests whose costs, squared and summed, come to
    /// `requested_sq` (equal to `requested` when every request cost 1). A token count of
    /// costly requests varies more than a Poisson count of as many tokens (by cost² over
    /// cost), so a gap between two costly requests is not read as a drop.
    pub fn sample_costs(
        &mut self,
        now: Millis,
        requested: u64,
        requested_sq: u64,
        epoch_ms: Millis,
    ) -> bool {
        if !self.started {
            self.started = true;
            self.last_at = now;
            return true;
        }
        if now <= self.last_at {
            return false;
        }
        let dt = (now - self.last_at) as f64;
        let rate = requested as f64 / dt;
        self.last_at = now;
        if !self.primed {
            self.long = rate;
            self.short = rate;
            self.primed = true;
            return true;
        }
        let epoch = epoch_ms.max(1) as f64;
        let alpha = |tau: f64| 1.0 - (-dt / tau).exp();
        // Half a window of memory, but never more than the rebalancing horizon needs: a day's
        // quota must not remember a morning burst until the evening.
        let long_alpha = alpha((epoch / 2.0).min(MAX_LONG_MEMORY_MS));
        if requested > 0 {
            let d = (requested_sq.max(requested) as f64) / requested as f64;
            self.dispersion = if self.dispersion == 0.0 {
                d
            } else {
                self.dispersion + long_alpha * (d - self.dispersion)
            };
        }
        let tau_short = (epoch / 16.0).min(MAX_LONG_MEMORY_MS / 8.0);
        self.long += long_alpha * (rate - self.long);
        self.short += alpha(tau_short) * (rate - self.short);
        // A shift is the short average far from the long one by a factor, and by more than
        // a Poisson count's noise: at a few requests per short memory, a gap or a clump of
        // requests alone makes the factor.
        let (expected, seen) = (self.long * tau_short, self.short * tau_short);
        let (more, fewer) = self.beyond_noise(expected, seen);
        let far = (self.short > self.long * SHIFT_FACTOR + 1e-12 && more)
            || (self.short * SHIFT_FACTOR < self.long && fewer);
        if far {
            self.disagree = self.disagree.saturating_add(1);
            if self.disagree >= SHIFT_SAMPLES {
                self.long = self.short;
                self.disagree = 0;
            }
        } else {
            self.disagree = 0;
        }
        true
    }

    /// Expected demand over `ms` milliseconds, in tokens (rounded up).
    pub fn expected(&self, ms: Millis) -> u64 {
        (self.long * ms as f64).ceil().max(0.0) as u64
    }

    /// Whether two samples have been taken, so that the rate means something.
    pub fn is_primed(&self) -> bool {
        self.primed
    }

    /// The long-memory rate in tokens per millisecond.
    pub fn rate(&self) -> f64 {
        self.long
    }

    /// Whether `requested` tokens over the `ms` milliseconds since the last sample agree with
    /// the long memory: within a factor of [`SHIFT_FACTOR`] of what it expects over that time,
    /// or within a Poisson count's noise of it (by the same significances as a shift, the
    /// costs' dispersion included). A forecast not yet primed agrees with nothing. A sample of
    /// requests that agree would move the forecast little, so it can wait (`state/quiet.rs`).
    pub fn agrees(&self, requested: u64, ms: Millis) -> bool {
        if !self.primed || ms == 0 {
            return false;
        }
        let (expected, seen) = (self.long * ms as f64, requested as f64);
        let (more, fewer) = self.beyond_noise(expected, seen);
        let shifted =
            (seen > expected * SHIFT_FACTOR && more) || (seen * SHIFT_FACTOR < expected && fewer);
        !shifted
    }

    /// Whether `seen` tokens are more than `expected` by more than a Poisson count's noise
    /// ([`SHIFT_SIGNIFICANCE`] deviations), and whether they are fewer by more than
    /// [`DROP_SIGNIFICANCE`] deviations, widened by the costs' dispersion: the noise half of
    /// the test for a shift.
    fn beyond_noise(&self, expected: f64, seen: f64) -> (bool, bool) {
        let deviation = expected.max(seen).sqrt();
        let drop_deviation = deviation * self.dispersion.max(1.0).sqrt();
        (
            seen - expected > SHIFT_SIGNIFICANCE * deviation,
            expected - seen > DROP_SIGNIFICANCE * drop_deviation,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(f: &mut Forecast, rates: &[f64], step: Millis, epoch: Millis) {
        let mut now = f.last_at;
        for r in rates {
            now += step;
            assert!(f.sample(now, (r * step as f64) as u64, epoch));
        }
    }

    #[test]
    fn requests_agree_with_a_steady_forecast_and_not_with_a_shift() {
        let mut f = Forecast::default();
        assert!(
            !f.agrees(10, 1000),
            "an unprimed forecast agrees with nothing"
        );
        f.sample(0, 0, 1000);
        feed(&mut f, &[1.0; 100], 20, 1000);
        assert!(f.agrees(5_000, 5_000));
        assert!(f.agrees(4_000, 5_000) && f.agrees(9_000, 5_000));
        assert!(!f.agrees(11_000, 5_000), "more than twice the rate");
        assert!(!f.agrees(2_000, 5_000), "less than half of it");
        assert!(!f.agrees(0, 5_000));
        assert!(!f.agrees(5, 0), "no time since the last sample");
        // At a few requests expected, a count off by a factor of two is noise.
        let mut slow = Forecast::default();
        slow.sample(0, 0, 1000);
        feed(&mut slow, &[0.001; 100], 1000, 1000);
        assert!(slow.agrees(2, 5_000) && slow.agrees(10, 5_000));
        assert!(!slow.agrees(40, 5_000));
    }

    #[test]
    fn steady_demand_is_forecast_exactly() {
        let mut f = Forecast::default();
        f.sample(0, 0, 1000);
        feed(&mut f, &[1.0; 100], 20, 1000);
        assert_eq!(f.expected(1000), 1000);
    }

    #[test]
    fn noise_does_not_move_the_long_memory_much() {
        let mut f = Forecast::default();
        f.sample(0, 0, 1000);
        feed(&mut f, &[1.0; 50], 20, 1000);
        // One dip to zero for a single sample: the forecast barely moves.
        feed(&mut f, &[0.0], 20, 1000);
        assert!(f.rate() > 0.9, "rate {}", f.rate());
    }

    #[test]
    fn a_gap_in_low_rate_demand_is_noise_not_a_shift() {
        // 40 requests a second on a 1 s window (four in every 100 ms), then 100 ms without any:
        // a factor of two below the long memory, but 2.5 requests expected in the short one.
        let mut f = Forecast::default();
        f.sample(0, 0, 1000);
        let mut now = 0;
        for i in 0..200u64 {
            now += 20;
            f.sample(now, u64::from(i % 5 != 4), 1000);
        }
        let before = f.rate();
        for _ in 0..5 {
            now += 20;
            f.sample(now, 0, 1000);
        }
        assert!(f.rate() > before * 0.7, "rate {} from {before}", f.rate());
    }

    /// Requests of 10 tokens, one every 30 ms (333 tokens a 1 s window), sampled every
    /// 20 ms; then `gap` samples with none. Returns the rate before the gap and after it.
    fn gap_between_costly_requests(gap: usize, dispersed: bool) -> (f64, f64) {
        let mut f = Forecast::default();
        f.sample(0, 0, 1000);
        let mut now = 0;
        let mut next_request = 0;
        for _ in 0..200 {
            now += 20;
            let mut tokens = 0;
            while next_request < now {
                tokens += 10;
                next_request += 30;
            }
            let sq = if dispersed { tokens * 10 } else { tokens };
            f.sample_costs(now, tokens, sq, 1000);
        }
        let before = f.rate();
        for _ in 0..gap {
            now += 20;
            f.sample_costs(now, 0, 0, 1000);
        }
        (before, f.rate())
    }

    #[test]
    fn a_gap_between_costly_requests_is_noise_not_a_drop() {
        // 120 ms without a request where 4 were expected: counted as Poisson tokens (40
        // expected) it reads as a drop, and the forecast falls to a fraction at once.
        let (before, after) = gap_between_costly_requests(6, false);
        assert!(
            after < before * 0.5,
            "as tokens: rate {after} from {before}"
        );
        // Judged with the tokens' dispersion (cost² over cost: 10), it is noise.
        let (before, after) = gap_between_costly_requests(6, true);
        assert!(
            after > before * 0.7,
            "dispersed: rate {after} from {before}"
        );
    }

    #[test]
    fn costly_demand_that_stops_is_still_followed() {
        // A second without requests: the long memory follows the drop all the same.
        let (before, after) = gap_between_costly_requests(50, true);
        assert!(after < before * 0.2, "rate {after} from {before}");
    }

    #[test]
    fn a_real_shift_is_followed_within_a_few_samples() {
        let mut f = Forecast::default();
        f.sample(0, 0, 1000);
        feed(&mut f, &[1.0; 50], 20, 1000);
        feed(&mut f, &[10.0; 12], 20, 1000);
        assert!(f.rate() > 5.0, "rate {}", f.rate());
    }
}
