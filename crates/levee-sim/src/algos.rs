//! The properties of rules that hold rights continuously (token and leaky buckets, sliding
//! windows and logs), checked on the timeline of every admission and refund
//! ([`crate::ledger::Movement`]). Fixed windows and quotas are checked per window
//! (`crate::checks`).
//!
//! | algorithm | what must hold, tokens net of refunds |
//! |---|---|
//! | `token_bucket`, `leaky_bucket` | over any interval `[a, b]` of simulated time, admitted ≤ capacity + rate × (b − a) |
//! | `sliding_log` | in any `window_ms` consecutive milliseconds, admitted ≤ limit |
//! | `sliding_window` | at every admission, the weighted usage summed over the deciding endpoints — each one's current window plus its previous one weighted by the part still inside the sliding window, windows as its own clock counts them — is ≤ limit |
//!
//! Clocks are offset from simulated time by a constant between restarts, so intervals have
//! the same length on every clock. A refund of a sliding log counts at the admission it
//! gives back; the others' count when they are made.
//!
//! As for windows, tokens a crashed node admitted and no live node knew when it pulled again
//! are lost with the crash, which the design allows ("no counted usage is lost beyond the
//! last gossip interval"): an interval may exceed its bound by the tokens lost in crashes
//! from one window before it to its end ([`Ledger::forgotten`]).

use std::collections::{BTreeMap, HashMap};

use crate::ledger::{Ledger, Movement};
use crate::plan::{Algo, RunPlan, T0};

/// The worst breach of a continuous algorithm's property in a run, if any: a description.
pub fn check_continuous(plan: &RunPlan, ledger: &Ledger) -> Vec<String> {
    let mut by_key: BTreeMap<u32, Vec<Movement>> = BTreeMap::new();
    for m in &ledger.movements {
        by_key.entry(m.key).or_default().push(*m);
    }
    let mut out = Vec::new();
    for (key, mut moves) in by_key {
        let (bound, name) = plan.bound_of(key);
        if bound.algo.per_window() {
            continue;
        }
        // In time order; what happened in one millisecond in the order it was recorded
        // (the central counter records an admission when its answer arrives).
        moves.sort_by_key(|m| m.sim);
        let lost = |a: u64, b: u64| -> u64 {
            ledger
                .forgotten
                .iter()
                .filter(|&&(k, c, _)| k == key && c + plan.window_ms >= a && c <= b)
                .map(|&(_, _, t)| t)
                .sum()
        };
        let b = (bound.limit, plan.window_ms);
        let breach = match bound.algo {
            Algo::TokenBucket | Algo::LeakyBucket => bucket(b, &moves, &lost),
            Algo::SlidingLog => log(b, &moves, &lost),
            Algo::SlidingWindow => sliding(b, ledger, &moves, &lost),
            Algo::FixedWindow | Algo::QuotaDay => None,
        };
        if let Some(b) = breach {
            out.push(format!("key {name}: {b}"));
        }
    }
    out
}

/// Net tokens per simulated millisecond, in time order.
fn per_ms(moves: &[Movement]) -> BTreeMap<u64, i64> {
    let mut net = BTreeMap::new();
    for m in moves {
        *net.entry(m.sim).or_insert(0i64) += m.tokens;
    }
    net
}

/// A bucket of `limit` refilled at `limit` per `window_ms`: the interval `[a, b]` with the
/// most admitted beyond `limit + limit × (b − a) / window_ms`, if any is beyond.
fn bucket(
    (limit, window_ms): (u64, u64),
    moves: &[Movement],
    lost: &dyn Fn(u64, u64) -> u64,
) -> Option<String> {
    let (cap, rate, per) = (i128::from(limit), i128::from(limit), i128::from(window_ms));
    // With P(t) the tokens admitted up to t: (P(b) − P(a−1)) × per ≤ cap × per + rate × (b − a)
    // for every a ≤ b. The best a for a given b is an event time (P is constant between).
    let mut before = 0i128; // P(t − 1)
    let mut low: Option<(i128, u64)> = None; // min of P(a − 1) × per − rate × a, and a
    let mut worst: Option<(i128, u64, u64)> = None;
    for (&t, &tokens) in &per_ms(moves) {
        let ti = i128::from(t);
        let here = before * per - rate * ti;
        if low.is_none_or(|(v, _)| here < v) {
            low = Some((here, t));
        }
        before += i128::from(tokens);
        let (v, a) = low.expect("set above");
        let excess = before * per - rate * ti - v - cap * per;
        if excess > 0
            && excess > i128::from(lost(a, t)) * per
            && worst.is_none_or(|(w, _, _)| excess > w)
        {
            worst = Some((excess, a, t));
        }
    }
    worst.map(|(excess, a, b)| {
        let allowed = cap * per + rate * i128::from(b - a);
        format!(
            "{:.2} tokens admitted in [{a}, {b}] ms > {:.2} (capacity {cap} + rate {rate} per {per} ms × {} ms)",
            (allowed + excess) as f64 / per as f64,
            allowed as f64 / per as f64,
            b - a
        )
    })
}

/// A sliding log of `limit` per `window_ms`: the most admitted in `window_ms` consecutive
/// milliseconds, if above the limit. (A refund counts at the admission it gives back, so
/// every millisecond's net is at least zero and the worst window ends at an admission.)
fn log(
    (limit, w): (u64, u64),
    moves: &[Movement],
    lost: &dyn Fn(u64, u64) -> u64,
) -> Option<String> {
    let net: Vec<(u64, i64)> = per_ms(moves).into_iter().collect();
    let limit = limit as i64;
    let (mut from, mut sum) = (0usize, 0i64);
    let mut worst: Option<(i64, u64, u64)> = None;
    for &(t, tokens) in &net {
        sum += tokens;
        while net[from].0 + w <= t {
            sum -= net[from].1;
            from += 1;
        }
        if sum > limit + lost(net[from].0, t) as i64 && worst.is_none_or(|(s, _, _)| sum > s) {
            worst = Some((sum, net[from].0, t));
        }
    }
    worst.map(|(sum, a, b)| {
        format!("{sum} tokens admitted in [{a}, {b}] ms, within {w} ms, > limit {limit}")
    })
}

/// A sliding window of `limit` per `window_ms`: the largest weighted usage summed over the
/// endpoints at an admission, if above the limit.
fn sliding(
    (limit, window_ms): (u64, u64),
    ledger: &Ledger,
    moves: &[Movement],
    lost: &dyn Fn(u64, u64) -> u64,
) -> Option<String> {
    let w = u128::from(window_ms);
    let limit = u128::from(limit);
    // By endpoint: net tokens by epoch of its clock.
    let mut tallies: HashMap<u16, BTreeMap<u64, i64>> = HashMap::new();
    let mut worst: Option<(u128, u64)> = None;
    for m in moves {
        *tallies
            .entry(m.endpoint)
            .or_default()
            .entry(m.epoch)
            .or_insert(0) += m.tokens;
        if m.tokens <= 0 {
            continue;
        }
        // Σ over endpoints of (cur × w + prev × (w − elapsed)), at this instant.
        let mut scaled = 0u128;
        for (&n, epochs) in &tallies {
            let clock = (T0 as i64 + m.sim as i64 + ledger.offset_at(usize::from(n), m.sim)) as u64;
            let e = clock / window_ms;
            let el = u128::from(clock % window_ms);
            let at = |e: u64| epochs.get(&e).copied().unwrap_or(0).max(0) as u128;
            scaled += at(e) * w + at(e.wrapping_sub(1)) * (w - el);
        }
        let excused = u128::from(lost(m.sim.saturating_sub(2 * window_ms), m.sim));
        if scaled > (limit + excused) * w && worst.is_none_or(|(s, _)| scaled > s) {
            worst = Some((scaled, m.sim));
        }
    }
    worst.map(|(scaled, at)| {
        format!(
            "weighted usage {:.2} at {at} ms > limit {limit}",
            scaled as f64 / w as f64
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::baselines::{run_central, run_static_split};
    use crate::scenario::Scenario;

    /// A plan of `scenario` whose world has no faults (seed / 6 = 0: the steady scenario).
    fn plan(scenario: Scenario) -> RunPlan {
        let plan = scenario.plan(3);
        assert_eq!(plan.algo, scenario.algo().unwrap());
        assert!(plan.faults.is_empty());
        plan
    }

    fn ledger_of(plan: &RunPlan, moves: &[(u16, u64, i64)]) -> Ledger {
        let mut l = Ledger::new(plan.topology.nodes(), true);
        for &(endpoint, sim, tokens) in moves {
            let clock = T0 + sim;
            let window = plan.window_of(clock);
            if tokens > 0 {
                l.admit(0, (window, sim), 0, endpoint.into(), tokens as u64);
            } else {
                l.refund(0, (window, sim), 0, endpoint.into(), (-tokens) as u64);
            }
        }
        l
    }

    #[test]
    fn the_exact_anchors_hold_every_continuous_property() {
        for s in [
            Scenario::TokenBucket,
            Scenario::LeakyBucket,
            Scenario::SlidingWindow,
            Scenario::SlidingLog,
        ] {
            let plan = plan(s);
            assert!(
                plan.requests.iter().any(|r| r.refund_ms > 0),
                "{s:?} refunds"
            );
            for (which, ledger) in [
                ("central", run_central(&plan)),
                ("static", run_static_split(&plan)),
            ] {
                assert!(ledger.movements.iter().any(|m| m.tokens < 0), "{s:?}");
                assert_eq!(
                    check_continuous(&plan, &ledger),
                    Vec::<String>::new(),
                    "{s:?} {which}"
                );
            }
        }
    }

    #[test]
    fn a_bucket_over_capacity_plus_refill_is_caught_and_refunds_count() {
        let plan = plan(Scenario::TokenBucket);
        let (cap, w) = (plan.limit as i64, plan.window_ms);
        // A full bucket at once, then half a window's refill half a window later: exact.
        let exact = [(0, 10_000, cap), (1, 10_000 + w / 2, cap / 2)];
        assert!(check_continuous(&plan, &ledger_of(&plan, &exact)).is_empty());
        // One token more is a breach, over [10 000, 10 000 + w/2].
        let over = [(0, 10_000, cap), (1, 10_000 + w / 2, cap / 2 + 1)];
        let found = check_continuous(&plan, &ledger_of(&plan, &over));
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].contains(&format!("[10000, {}]", 10_000 + w / 2)),
            "{found:?}"
        );
        // … unless a token was given back in between.
        let refunded = [
            (0, 10_000, cap),
            (0, 10_001, -1),
            (1, 10_000 + w / 2, cap / 2 + 1),
        ];
        assert!(check_continuous(&plan, &ledger_of(&plan, &refunded)).is_empty());
    }

    #[test]
    fn a_sliding_log_over_its_limit_in_any_window_is_caught() {
        let plan = plan(Scenario::SlidingLog);
        let (limit, w) = (plan.limit as i64, plan.window_ms);
        let exact = [
            (0, 5_000, limit / 2),
            (1, 5_000 + w - 1, limit - limit / 2),
            (2, 5_000 + w, limit / 2),
        ];
        assert!(check_continuous(&plan, &ledger_of(&plan, &exact)).is_empty());
        let over = [
            (0, 5_000, limit / 2),
            (1, 5_000 + w - 1, limit - limit / 2 + 1),
        ];
        assert_eq!(check_continuous(&plan, &ledger_of(&plan, &over)).len(), 1);
        // A token a crash lost in the window excuses one more, not two.
        let mut crashed = ledger_of(&plan, &over);
        crashed.forgotten.push((0, 5_010, 1));
        assert!(check_continuous(&plan, &crashed).is_empty());
        let two = [
            (0, 5_000, limit / 2),
            (1, 5_000 + w - 1, limit - limit / 2 + 2),
        ];
        let mut crashed = ledger_of(&plan, &two);
        crashed.forgotten.push((0, 5_010, 1));
        assert_eq!(check_continuous(&plan, &crashed).len(), 1);
    }

    #[test]
    fn a_sliding_window_is_checked_on_each_endpoints_own_clock() {
        let plan = plan(Scenario::SlidingWindow);
        let (limit, w) = (plan.limit as i64, plan.window_ms);
        // Node 0 fills the window ending at 10 s; half a window later its weight is half
        // (both endpoints' clocks read simulated time), so half the limit fits.
        let start = 9_000 + (w - (T0 + 9_000) % w); // a window's start
        let fits = [(0, start - 1, limit), (1, start + w / 2, limit / 2)];
        assert!(check_continuous(&plan, &ledger_of(&plan, &fits)).is_empty());
        let over = [(0, start - 1, limit), (1, start + w / 2, limit / 2 + 2)];
        assert_eq!(check_continuous(&plan, &ledger_of(&plan, &over)).len(), 1);
        // With node 0's clock a quarter of a window ahead, its old window weighs a quarter.
        let mut skewed = ledger_of(&plan, &[]);
        skewed.set_offset(0, 0, (w / 4) as i64);
        let e0 = plan.window_of(T0 + start - 1 - w / 4);
        skewed.admit(0, (e0, start - 1 - w / 4), 0, 0, limit as u64);
        let e1 = plan.window_of(T0 + start + w / 2);
        skewed.admit(0, (e1, start + w / 2), 0, 1, (limit * 3 / 4 - 1) as u64);
        assert!(
            check_continuous(&plan, &skewed).is_empty(),
            "{:?}",
            check_continuous(&plan, &skewed)
        );
    }
}
