//! What a node needs of a key's rights in a scope: what it used, plus its forecast demand
//! over the rest of the scope (at most a horizon), with a margin.

use crate::crdt::KeyCrdt;
use crate::replica::NodeIdx;
use crate::rule::Algorithm;
use crate::time::Millis;

use super::HORIZON_MS;
use super::scope::Scope;
use crate::state::QUIET_MIN_UNITS;

/// Extra demand a node keeps for itself above its forecast, in percent.
const MARGIN_PERCENT: u64 = 10;

/// `x` tokens of demand with the margin a node keeps above it.
pub(crate) fn with_margin(x: u64) -> u64 {
    let margin = (u128::from(x) * u128::from(MARGIN_PERCENT)).div_ceil(100);
    x.saturating_add(margin as u64)
}

/// The fewest units a node with demand keeps of a token bucket whose burst, split evenly
/// over the list's `nodes`, is at least 64 times [`QUIET_MIN_UNITS`]: enough that a light
/// key's decisions there leave its sub-bucket near full and are spent quietly
/// (`state/quiet.rs`) rather than listed and sent at every decision. Without it a node
/// deciding a key used once a second held the two units its refill needs, every decision took
/// half of them, and every decision was sent (`cluster.local_first`, figure 9 of
/// docs/benchmarks.md on 2026-12-04). Every node's floor together is at most a 64th of the
/// burst; a smaller bucket has none.
pub(crate) fn bucket_floor(burst: u64, nodes: usize) -> u64 {
    let even = burst / (nodes.max(1) as u64);
    if even / QUIET_MIN_UNITS >= 64 {
        QUIET_MIN_UNITS
    } else {
        0
    }
}

/// What `node` needs in `scope`, from its forecast (tokens per epoch) over at most
/// `horizon` ms and what it used; `nodes` is the list's length (a token bucket's
/// [`bucket_floor`]).
#[allow(clippy::too_many_arguments)]
pub(crate) fn need_of(
    crdt: &KeyCrdt,
    algo: &Algorithm,
    node: NodeIdx,
    forecast: u64,
    scope: Scope,
    now: Millis,
    horizon: Millis,
    nodes: usize,
) -> u64 {
    // A forecast comes from a peer's register: `with_margin` saturates rather than overflows.
    match (scope, *algo) {
        (
            Scope::Epoch {
                epoch,
                remaining_ms,
                len_ms,
                ..
            },
            _,
        ) => {
            let used = crdt
                .slot(epoch)
                .and_then(|s| s.tallies.get(node))
                .map_or(0, |t| t.net());
            // Demand is forecast over at most the horizon: rights can still move later,
            // and a long window (a day's quota) must not keep a burst's rate for hours.
            let ahead = remaining_ms.min(horizon);
            let rest = (u128::from(forecast) * u128::from(ahead))
                .div_ceil(u128::from(len_ms.max(1))) as u64;
            used.saturating_add(with_margin(rest))
        }
        (Scope::Continuous, Algorithm::SlidingWindow { window_ms, .. }) => {
            // Weighted usage must stay covered; beyond it, the horizon's demand.
            let e = algo.epoch(now);
            let el = now - algo.epoch_start(e);
            let net = |ep: u64| {
                crdt.slot(ep)
                    .and_then(|s| s.tallies.get(node))
                    .map_or(0, |t| t.net())
            };
            let w = u128::from(window_ms);
            let weighted = (u128::from(net(e)) * w
                + u128::from(net(e.wrapping_sub(1))) * (w - u128::from(el)))
            .div_ceil(w) as u64;
            let ahead =
                (u128::from(forecast) * u128::from(window_ms.min(HORIZON_MS))).div_ceil(w) as u64;
            // What is used, plus what the horizon's demand will take: a node whose usage has
            // grown past a horizon's demand must still be able to admit (as a fixed window's
            // `used + rest`).
            weighted.saturating_add(with_margin(ahead))
        }
        (Scope::Continuous, Algorithm::SlidingLog { window_ms, .. }) => {
            // Every admission still in the window stays covered (a node never gives away the
            // rights its log is using); beyond it, the horizon's demand.
            let from = (now + 1).saturating_sub(window_ms);
            let used = crdt
                .slots
                .iter()
                .filter(|s| s.epoch >= from)
                .filter_map(|s| s.tallies.get(node))
                .fold(0u64, |sum, t| sum.saturating_add(t.net()));
            let w = u128::from(window_ms);
            let ahead =
                (u128::from(forecast) * u128::from(window_ms.min(HORIZON_MS))).div_ceil(w) as u64;
            used.saturating_add(with_margin(ahead))
        }
        (Scope::Continuous, Algorithm::TokenBucket { rate, burst, .. }) => {
            // Units whose refill covers the forecast demand per refill period, and, with
            // any demand, at least the floor that lets decisions spend quietly.
            let units = (u128::from(with_margin(forecast)) * u128::from(burst))
                .div_ceil(u128::from(rate)) as u64;
            let floor = if forecast > 0 {
                bucket_floor(burst, nodes)
            } else {
                0
            };
            units.max(floor).min(burst)
        }
        (Scope::Continuous, _) => with_margin(forecast),
    }
}
