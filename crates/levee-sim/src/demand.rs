//! Demand as tenants' traffic really comes (issue #13): low-rate sporadic keys, long windows
//! (a minute, an hour, a day), demand that moves between regions, and many lightly used keys
//! beside a few hot ones.
//!
//! The classic scenarios ([`crate::Scenario::ALL`]) are all high-rate on 1 s windows; these
//! ([`crate::Scenario::DEMAND`]) run on the same worlds (topology, network, clocks) with the
//! same checks and the same baselines, on a rule whose window is long, so that a run lies
//! inside one or two windows and utilisation counts them all. Their seeds are run with
//! `--set demand` (or `--scenario <name>`), so that `--seeds N` keeps the classic figures.

use levee_testkit::rng::SeededRng;

use crate::plan::Request;
use crate::workload::poisson;

/// When demand starts, ms: after every node has pulled its peers' state (a cluster that
/// has just started denies while it recovers; a real one has long been up).
pub const START_MS: u64 = 2_000;

/// One hour, ms.
pub const HOUR_MS: u64 = 3_600_000;
/// One day, ms.
pub const DAY_MS: u64 = 86_400_000;
/// One minute, ms.
pub const MINUTE_MS: u64 = 60_000;

/// What a demand scenario draws beyond the world: the rule's window and limit, how long the
/// run lasts, its keys and requests.
#[derive(Debug, Clone)]
pub struct LongDemand {
    /// The rule's window, ms.
    pub window_ms: u64,
    /// The rule's limit per window.
    pub limit: u64,
    /// How long the run lasts, ms.
    pub duration_ms: u64,
    /// Key names.
    pub keys: Vec<String>,
    /// The requests, by time.
    pub requests: Vec<Request>,
}

/// Requests per second from a count per minute.
fn per_minute(n: f64) -> f64 {
    n / 60.0
}

/// Low-rate, sporadic keys on an hour's or a day's window: 10–30 keys, each asked a few times
/// a minute at every region (1–6), for 90 s; the limit is drawn so that a key's demand is
/// 0.5–1.5 × the limit over the run.
pub fn sporadic(rng: &mut SeededRng, regions: usize) -> LongDemand {
    let window_ms = if rng.chance(0.5) { HOUR_MS } else { DAY_MS };
    let duration_ms = START_MS + 90_000;
    let n = rng.range(10, 30) as usize;
    let keys: Vec<String> = (0..n).map(|i| format!("tenant-{i}")).collect();
    let mut requests = Vec::new();
    let mut expected = 0.0;
    for k in 0..n {
        for r in 0..regions {
            let rate = per_minute(1.0 + 5.0 * rng.unit());
            expected += rate * (duration_ms - START_MS) as f64 / 1_000.0;
            poisson(
                rng,
                (START_MS, duration_ms),
                rate,
                r,
                k as u32,
                &mut requests,
            );
        }
    }
    let per_key = expected / n as f64;
    let limit = ((per_key / (0.5 + rng.unit())).round() as u64).max(regions as u64);
    requests.sort_by_key(|r| r.at);
    LongDemand {
        window_ms,
        limit,
        duration_ms,
        keys,
        requests,
    }
}

/// Follow-the-sun: one key on an hour's or a day's window; the busy region moves region by
/// region (each busy for a third of the run, 10 s with three regions) while the others keep a
/// tenth of its rate; total demand 0.6–1.5 × the limit over the run.
pub fn follow_the_sun(rng: &mut SeededRng, regions: usize) -> LongDemand {
    let window_ms = if rng.chance(0.5) { HOUR_MS } else { DAY_MS };
    let limit = rng.range(200, 1_000);
    let phase_ms = 10_000;
    let duration_ms = START_MS + phase_ms * regions as u64 + 2_000;
    let factor = 0.6 + 0.9 * rng.unit();
    // Per phase: the busy region asks `busy`, every other a tenth of it.
    let per_phase = factor * limit as f64 / regions as f64;
    let quiet_parts = 0.1 * (regions - 1) as f64;
    let busy = per_phase / (1.0 + quiet_parts);
    let secs = phase_ms as f64 / 1_000.0;
    let mut requests = Vec::new();
    let start = rng.index(regions);
    for p in 0..regions {
        let hot = (start + p) % regions;
        let from = START_MS + p as u64 * phase_ms;
        for r in 0..regions {
            let volume = if r == hot { busy } else { 0.1 * busy };
            poisson(
                rng,
                (from, from + phase_ms),
                volume / secs,
                r,
                0,
                &mut requests,
            );
        }
    }
    requests.sort_by_key(|r| r.at);
    LongDemand {
        window_ms,
        limit,
        duration_ms,
        keys: vec!["tenant-0".to_owned()],
        requests,
    }
}

/// Back to back, region by region (the "84 checks at each node in turn"): one key on a
/// day's window; each region in turn gets its checks one after another, 5–20 ms apart (a
/// client's loop), then the next region starts after a pause of 0–2 s; total 0.5–1.3 × the
/// limit.
pub fn back_to_back(rng: &mut SeededRng, regions: usize) -> LongDemand {
    let limit = rng.range(150, 800);
    let factor = 0.5 + 0.8 * rng.unit();
    let per_region = ((factor * limit as f64) / regions as f64).round().max(1.0) as u64;
    let gap = rng.range(5, 20);
    let mut requests = Vec::new();
    let mut t = START_MS;
    let first = rng.index(regions);
    for p in 0..regions {
        let region = (first + p) % regions;
        for _ in 0..per_region {
            requests.push(Request::one(t, region, 0));
            t += gap;
        }
        t += rng.range(0, 2_000);
    }
    LongDemand {
        window_ms: DAY_MS,
        limit,
        duration_ms: (t + 3_000).div_ceil(1_000) * 1_000,
        keys: vec!["tenant-0".to_owned()],
        requests,
    }
}

/// Many lightly used keys beside a few hot ones, on a minute's window (the run is that
/// minute; demand from its third second): 300–800 keys asked 1–4 times a minute each (at a
/// region drawn per key), and 2–3 hot keys at 1.5–3 × the limit over the minute, 90/5/5 over the regions with the busy region moving every 15–30 s.
pub fn light_keys(rng: &mut SeededRng, regions: usize) -> LongDemand {
    let limit = rng.range(100, 300);
    let duration_ms = MINUTE_MS;
    let start = START_MS;
    let light = rng.range(300, 800) as usize;
    let hot = rng.range(2, 3) as usize;
    let mut keys: Vec<String> = (0..hot).map(|i| format!("hot-{i}")).collect();
    keys.extend((0..light).map(|i| format!("light-{i}")));
    let mut requests = Vec::new();
    for k in 0..hot {
        let factor = 1.5 + 1.5 * rng.unit();
        let per_sec = factor * limit as f64 / ((duration_ms - start) as f64 / 1_000.0);
        let every = rng.range(15_000, 30_000);
        let mut from = start;
        let mut busy = rng.index(regions);
        while from < duration_ms {
            let to = (from + every).min(duration_ms);
            for r in 0..regions {
                let part = if regions == 1 {
                    1.0
                } else if r == busy {
                    0.9
                } else {
                    0.1 / (regions - 1) as f64
                };
                poisson(rng, (from, to), per_sec * part, r, k as u32, &mut requests);
            }
            busy = (busy + 1) % regions;
            from = to;
        }
    }
    for k in hot..hot + light {
        let rate = per_minute(1.0 + 3.0 * rng.unit());
        let region = rng.index(regions);
        poisson(
            rng,
            (start, duration_ms),
            rate,
            region,
            k as u32,
            &mut requests,
        );
    }
    requests.sort_by_key(|r| r.at);
    LongDemand {
        window_ms: MINUTE_MS,
        limit,
        duration_ms,
        keys,
        requests,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn back_to_back_asks_each_region_in_turn_under_about_the_limit() {
        let mut rng = SeededRng::new(7);
        let d = back_to_back(&mut rng, 3);
        assert!(d.requests.windows(2).all(|w| w[0].at < w[1].at));
        // Regions come one after another: the region changes exactly twice.
        let changes = d
            .requests
            .windows(2)
            .filter(|w| w[0].region != w[1].region)
            .count();
        assert_eq!(changes, 2);
        assert!(d.requests.len() as f64 <= 1.31 * d.limit as f64);
    }

    #[test]
    fn sporadic_keys_are_asked_a_few_times_a_minute() {
        let mut rng = SeededRng::new(8);
        let d = sporadic(&mut rng, 3);
        let per_key_per_region_per_min = d.requests.len() as f64 / d.keys.len() as f64 / 3.0 / 1.5;
        assert!(
            (0.5..8.0).contains(&per_key_per_region_per_min),
            "{per_key_per_region_per_min}"
        );
        assert!(d.window_ms >= HOUR_MS);
    }
}
