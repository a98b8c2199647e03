//! Evaluating one check against a key, before anything is committed: whether it would be
//! allowed, what is available, and when the key is back to its limit — per algorithm and
//! the node's holdings (the module doc of [`crate::state`] says how each decides).

use crate::crdt::{EpochSlot, Tally};
use crate::decision::DecideCtx;
use crate::replica::NodeIdx;
use crate::rights::{NANO, ceil_mul_div, holdings, inherited};
use crate::rule::{Algorithm, Shaping, Target};

use super::key_state::KeyState;
use super::log::{entry_net, log_retry};

/// The retry-after a recovering node answers: it expects to have pulled the cluster's state
/// by then.
pub const RECOVERY_RETRY_MS: u64 = 1_000;

/// The retry-after of a strict deny while the cluster, as the deciding node sees it, still
/// has room under the limit: the node holds too little, its deny asks for rights (published
/// at the next gossip interval), and donors answer within a round trip and an interval or
/// two. Never the window's end: the global limit is not what denied.
pub const RIGHTS_RETRY_MS: u64 = 250;

/// How long until a key is back to its limit; computed only for the answer actually given
/// (a token bucket's needs a division that a decision should not pay twice).
#[derive(Debug, Clone, Copy)]
pub(super) enum Reset {
    /// Known outright: if the cost is taken, and if it is not.
    Known { taken: u64, kept: u64 },
    /// A bucket refilling `deficit × mul / div` ms: the deficit if the cost is not taken, and
    /// the cost (added to the deficit if it is).
    Refill {
        deficit_nt: i128,
        cost_nt: i128,
        mul: u128,
        div: u128,
    },
}

impl Reset {
    #[inline]
    pub(super) fn ms(self, taken: bool) -> u64 {
        match self {
            Reset::Known { taken: t, kept } => {
                if taken {
                    t
                } else {
                    kept
                }
            }
            Reset::Refill {
                deficit_nt,
                cost_nt,
                mul,
                div,
            } => {
                let deficit = deficit_nt + if taken { cost_nt } else { 0 };
                if deficit <= 0 {
                    0
                } else {
                    ceil_mul_div(deficit as u128, mul, div)
                }
            }
        }
    }
}

/// The outcome of evaluating one check, before anything is committed.
#[derive(Debug, Clone, Copy)]
pub(super) struct Evaluation {
    pub(super) would_allow: bool,
    /// What this node could admit now, in tokens, before the check.
    pub(super) available: u64,
    /// Time until the key is back to its limit, if the cost is taken and if it is not.
    pub(super) reset: Reset,
    pub(super) retry_after_ms: u64,
    pub(super) epoch: u64,
    /// Token bucket: own level after refill, before the check.
    pub(super) level_nt: i128,
    /// A leaky bucket: how long the request waits if it is admitted.
    pub(super) delay_ms: u64,
    /// This node holds too little for this check (a deny) or for the next one like it (an
    /// admission that spends its last rights) while the cluster, as it sees it, has room:
    /// the decision asks for rights.
    pub(super) asks_rights: bool,
    /// A token bucket: the capacity (units) of the node's sub-bucket, which `level_nt` is
    /// measured against.
    pub(super) bucket_units: u64,
}

impl Evaluation {
    /// An evaluation with its decision and figures; everything algorithm-specific (a bucket's
    /// level, a shaping delay) at its neutral value, for the caller to set.
    pub(super) fn decided(
        would_allow: bool,
        available: u64,
        reset: Reset,
        retry_after_ms: u64,
        epoch: u64,
    ) -> Evaluation {
        Evaluation {
            would_allow,
            available,
            reset,
            retry_after_ms,
            epoch,
            level_nt: 0,
            delay_ms: 0,
            asks_rights: false,
            bucket_units: 0,
        }
    }
}

impl KeyState {
    pub(super) fn evaluate(
        &self,
        target: &Target<'_>,
        cost: u64,
        ctx: &DecideCtx<'_>,
    ) -> Evaluation {
        let algo = target.algorithm;
        let e = algo.epoch(ctx.now);
        let blind = ctx
            .view
            .blind_since
            .is_some_and(|since| ctx.now < algo.shares_may_grow_at(since));
        if ctx.view.recovering || blind {
            // What this node gave away before it restarted is unknown until it has pulled
            // the cluster's state: it spends nothing (of windows that may still count it, if
            // it gave up waiting with nobody to pull from).
            return Evaluation::decided(
                cost == 0,
                0,
                Reset::Known { taken: 0, kept: 0 },
                if cost == 0 { 0 } else { RECOVERY_RETRY_MS },
                e,
            );
        }
        match *algo {
            Algorithm::FixedWindow { limit, .. } | Algorithm::Quota { limit, .. } => {
                self.eval_window(target, limit, e, cost, ctx)
            }
            Algorithm::SlidingWindow { window_ms, .. } => {
                self.eval_sliding(target, window_ms, e, cost, ctx)
            }
            Algorithm::TokenBucket {
                rate,
                per_ms,
                burst,
                shaping,
            } => {
                let mut ev = self.eval_bucket(target, rate, per_ms, burst, e, cost, ctx);
                if let Some(shaping) = shaping
                    && ev.would_allow
                {
                    ev.delay_ms = shaping_delay(&ev, shaping, (rate, per_ms, burst), cost);
                }
                ev
            }
            Algorithm::SlidingLog { window_ms, .. } => {
                self.eval_log(target, window_ms, e, cost, ctx)
            }
        }
    }

    /// A sliding log: this node's own admissions in the window against its holdings.
    fn eval_log(
        &self,
        target: &Target<'_>,
        window_ms: u64,
        e: u64,
        cost: u64,
        ctx: &DecideCtx<'_>,
    ) -> Evaluation {
        let now = ctx.now;
        let held = self.continuous_holdings(target, ctx);
        let used = self.log_used(now, window_ms, Some(ctx.me));
        let available = held.saturating_sub(used);
        let need = cost.max(threshold(target.min_fill_ppm, held));
        let would_allow = available >= need;
        let entries = || {
            self.log_window(now, window_ms)
                .map(|s| (s.epoch, entry_net(s, Some(ctx.me))))
        };
        let retry_after_ms = if would_allow {
            0
        } else {
            log_retry(entries(), used, held, need, now, window_ms).unwrap_or(window_ms)
        };
        // Back to the limit when the newest entry has left the window.
        let newest = entries().rev().find(|&(_, n)| n > 0).map(|(t, _)| t);
        let kept = newest.map_or(0, |t| (t + window_ms).saturating_sub(now));
        Evaluation::decided(
            would_allow,
            available,
            Reset::Known {
                taken: if cost > 0 { window_ms } else { kept },
                kept,
            },
            retry_after_ms,
            e,
        )
    }

    fn eval_window(
        &self,
        target: &Target<'_>,
        limit: u64,
        e: u64,
        cost: u64,
        ctx: &DecideCtx<'_>,
    ) -> Evaluation {
        let algo = target.algorithm;
        let slot = self.crdt.slot(e);
        let own = slot
            .and_then(|s| s.tallies.get(ctx.me))
            .map_or(0, Tally::net);
        let global = slot.map_or(0, |s| s.net_total());
        let base = target
            .static_share(ctx.me, ctx.replicas)
            .saturating_add(inherited(target, slot, ctx.me, algo.epoch_start(e)));
        let capacity = match slot {
            Some(s) => holdings(base, &s.transfers, ctx.me),
            None => base,
        };
        let available = capacity.saturating_sub(own);
        let need = cost.max(threshold(target.min_fill_ppm, capacity));
        let would_allow = available >= need;
        let until_end = algo.epoch_end(e) - ctx.now;
        let reset = |used: u64| if used > 0 { until_end } else { 0 };
        // A deny while the cluster has room is this node holding too little; it asks for
        // rights, and the caller may retry once they can have arrived. An admission that
        // leaves too little for the next check like it asks too, so that sporadic demand,
        // which never makes a forecast, finds rights at its next request.
        let room = limit.saturating_sub(global);
        let asks_rights = if would_allow {
            available - cost < need && room >= need.saturating_add(cost)
        } else {
            room >= need
        };
        let retry_after_ms = match (would_allow, asks_rights) {
            (true, _) => 0,
            (false, true) => until_end.clamp(1, RIGHTS_RETRY_MS),
            (false, false) => until_end.max(1),
        };
        Evaluation {
            asks_rights,
            ..Evaluation::decided(
                would_allow,
                available,
                Reset::Known {
                    taken: reset(global.saturating_add(cost)),
                    kept: reset(global),
                },
                retry_after_ms,
                e,
            )
        }
    }

    fn eval_sliding(
        &self,
        target: &Target<'_>,
        window_ms: u64,
        e: u64,
        cost: u64,
        ctx: &DecideCtx<'_>,
    ) -> Evaluation {
        let algo = target.algorithm;
        let w = u128::from(window_ms);
        let el = u128::from(ctx.now - algo.epoch_start(e));
        let cur = self.crdt.slot(e);
        let prev = self.crdt.slot(e.wrapping_sub(1));
        let net_of = |slot: Option<&EpochSlot>, n: NodeIdx| {
            slot.and_then(|s| s.tallies.get(n))
                .map_or(0u128, |t| u128::from(t.net()))
        };
        // Weighted usage is kept scaled by the window length so that every figure is exact.
        let held = self.continuous_holdings(target, ctx);
        let (cur_me, prev_me) = (net_of(cur, ctx.me), net_of(prev, ctx.me));
        let scaled_used = cur_me * w + prev_me * (w - el);
        let room_scaled = (u128::from(held) * w).saturating_sub(scaled_used);
        let available = (room_scaled / w) as u64;
        let need = cost.max(threshold(target.min_fill_ppm, held));
        let would_allow = available >= need;
        let retry_after_ms = if would_allow {
            0
        } else {
            sliding_retry(u128::from(held), cur_me, prev_me, u128::from(need), w, el)
        };
        let reset = |cur: u128| {
            if cur > 0 {
                (2 * w - el) as u64
            } else if prev_me > 0 {
                (w - el) as u64
            } else {
                0
            }
        };
        Evaluation::decided(
            would_allow,
            available,
            Reset::Known {
                taken: reset(cur_me + u128::from(cost)),
                kept: reset(cur_me),
            },
            retry_after_ms,
            e,
        )
    }
}

/// A leaky bucket's delay for an admitted request, nginx `limit_req`'s: the bucket is a token
/// bucket of `queue + 1`, so what the request leaves empty beyond the one that proceeds now is
/// nginx's `excess` — the requests queued ahead of the next one. The first `delay` of them
/// proceed at once; beyond, the request waits until the bucket has drained down to `delay`
/// at the rate (rounded up to the millisecond). In strict mode the node's sub-bucket holds
/// `units` of the capacity and drains at `units / burst` of the rate, and `delay` is scaled
/// to it the same way (on a single node, or an owner holding the whole bucket, it is nginx's).
fn shaping_delay(
    ev: &Evaluation,
    shaping: Shaping,
    (rate, per_ms, burst): (u64, u64, u64),
    cost: u64,
) -> u64 {
    let units = ev.bucket_units;
    if units == 0 {
        return 0;
    }
    let after = ev.level_nt - i128::from(cost) * NANO;
    let excess = (i128::from(units) - 1) * NANO - after;
    let free = i128::from(shaping.delay) * NANO * i128::from(units) / i128::from(burst);
    let waiting = excess - free;
    if waiting <= 0 {
        return 0;
    }
    // The sub-bucket drains `units × rate / burst` per
    // `per_ms`.
    let mul = u128::from(per_ms) * u128::from(burst);
    let div = u128::from(rate) * u128::from(units) * NANO as u128;
    ceil_mul_div(waiting as u128, mul, div)
}

/// The threshold of a class (threshold method): `min_fill` of the capacity, rounded up.
#[inline]
pub(super) fn threshold(min_fill_ppm: u32, capacity: u64) -> u64 {
    if min_fill_ppm == 0 {
        return 0;
    }
    (u128::from(capacity) * u128::from(min_fill_ppm)).div_ceil(1_000_000) as u64
}

/// Sliding window: the earliest time at which `need` more tokens fit under `held`, if
/// nothing else happens. Usage is `cur + prev × (w − el) / w` now, and `cur × (w − el') / w`
/// in the next window.
fn sliding_retry(held: u128, cur: u128, prev: u128, need: u128, w: u128, el: u128) -> u64 {
    if need > held {
        return (2 * w - el) as u64;
    }
    // In the current window: prev × (w − t) ≤ (held − cur − need) × w.
    if held >= cur + need && prev > 0 {
        let room = (held - cur - need) * w;
        let t = w - room / prev; // first el' with prev × (w − el') ≤ room
        if t < w {
            return (t.saturating_sub(el)).max(1) as u64;
        }
    }
    // In the next window: cur × (w − t') ≤ (held − need) × w.
    let room = (held - need) * w;
    let t = room.checked_div(cur).map_or(0, |q| w.saturating_sub(q));
    ((w - el) + t).max(1) as u64
}
