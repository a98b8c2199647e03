//! Evaluating one check against a key, before anything is committed: whether it would be
//! allowed, what is available, and when the key is back to its limit — per algorithm and
//! consistency mode (the module doc of [`crate::state`] says how each decides).

use crate::crdt::Claim;
use crate::crdt::{EpochSlot, Tally};
use crate::decision::{ClusterView, Consistency, DecideCtx};
use crate::replica::{NodeIdx, RegionMask};
use crate::rights::{NANO, ceil_mul_div, holdings, sub_bucket_level, tokens_of};
use crate::rule::{Algorithm, Target};

use super::allowance::{Allowance, allowance_room, assumed_usage};
use super::claim::CLAIM_GRACE_MS;
use super::key_state::KeyState;

/// The retry-after a recovering node answers: it expects to have pulled the cluster's state
/// by then.
pub const RECOVERY_RETRY_MS: u64 = 1_000;

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
    pub(super) allowance: Allowance,
    /// Optimistic fixed windows and quotas: this node's claim as the decision leaves it
    /// (raised, or its round caught up), if it changes; and whether to resend it.
    pub(super) claim: Option<Claim>,
    pub(super) resend_claim: bool,
    /// … and its first claim for the next epoch, made during the last part of this one.
    pub(super) next_claim: Option<Claim>,
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
        if ctx.view.recovering {
            match ctx.view.consistency {
                // What this node gave away before it restarted is unknown until it has pulled
                // the cluster's state: it spends nothing.
                Consistency::Strict => {
                    return Evaluation {
                        would_allow: cost == 0,
                        available: 0,
                        reset: Reset::Known { taken: 0, kept: 0 },
                        retry_after_ms: if cost == 0 { 0 } else { RECOVERY_RETRY_MS },
                        epoch: e,
                        level_nt: 0,
                        allowance: Allowance::default(),
                        claim: None,
                        resend_claim: false,
                        next_claim: None,
                    };
                }
                // Every other region counts as having spent its full share.
                Consistency::Optimistic => {
                    let replicas = ctx.replicas;
                    let mine = replicas.region_of(ctx.me);
                    let unreachable = replicas
                        .regions()
                        .filter(|&r| r != mine)
                        .fold(RegionMask::EMPTY, RegionMask::with);
                    let view = ClusterView {
                        unreachable,
                        recovering: false,
                        ..ctx.view
                    };
                    return self.evaluate(target, cost, &DecideCtx { view, ..*ctx });
                }
            }
        }
        match *algo {
            Algorithm::FixedWindow { limit, .. } | Algorithm::Quota { limit, .. } => {
                self.eval_window(target, limit, e, cost, ctx)
            }
            Algorithm::SlidingWindow { limit, window_ms } => {
                self.eval_sliding(target, limit, window_ms, e, cost, ctx)
            }
            Algorithm::TokenBucket {
                rate,
                per_ms,
                burst,
            } => self.eval_bucket(target, rate, per_ms, burst, e, cost, ctx),
        }
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
        let mut claim = None;
        let mut resend_claim = false;
        let mut next_claim = None;
        let (available, capacity, allowance) = match ctx.view.consistency {
            Consistency::Strict => {
                let base = target.static_share(ctx.me, ctx.replicas);
                let held = match slot {
                    Some(s) => holdings(base, &s.transfers, ctx.me),
                    None => base,
                };
                (held.saturating_sub(own), held, Allowance::default())
            }
            Consistency::Optimistic => {
                let net = |n| {
                    slot.and_then(|s| s.tallies.get(n))
                        .map_or(0, |t| u128::from(t.net()))
                };
                let used = assumed_usage(ctx, target, net, 1) as i128;
                let left = i128::from(limit) - used;
                // The node admits within its claim for the epoch, raised first if the claim
                // rounds allow it (see `plan_claim`).
                let (planned, resend) = self.plan_claim(target, limit, e, own, cost, ctx);
                let current = self.crdt.claims.get(e, ctx.me).copied();
                let unchanged = match current {
                    Some(c) => c == planned,
                    None => planned.step == 0 && planned.ceiling == 0,
                };
                if !unchanged {
                    claim = Some(planned);
                }
                resend_claim = resend;
                // Near the end of the epoch, the first claim for the next one goes out ahead
                // of time, so that a region whose clock runs behind does not hold back the
                // others' rounds when they enter it.
                let end = algo.epoch_end(e);
                let ahead = CLAIM_GRACE_MS.min(algo.epoch_len(ctx.now) / 2);
                if ctx.now + ahead >= end && self.crdt.claims.get(e + 1, ctx.me).is_none() {
                    let (next, _) = self.plan_claim(target, limit, e + 1, 0, 0, ctx);
                    if next.step != 0 || next.ceiling != 0 {
                        next_claim = Some(next);
                    }
                }
                let room = i128::from(planned.ceiling) - i128::from(own);
                let avail = left.min(room).max(0) as u64;
                (avail, limit, Allowance::default())
            }
        };
        let need = cost.max(threshold(target.min_fill_ppm, capacity));
        let would_allow = available >= need;
        let until_end = algo.epoch_end(e) - ctx.now;
        let reset = |used: u64| if used > 0 { until_end } else { 0 };
        Evaluation {
            would_allow,
            available,
            reset: Reset::Known {
                taken: reset(global + cost),
                kept: reset(global),
            },
            retry_after_ms: if would_allow { 0 } else { until_end.max(1) },
            epoch: e,
            level_nt: 0,
            allowance,
            claim,
            resend_claim,
            next_claim,
        }
    }

    fn eval_sliding(
        &self,
        target: &Target<'_>,
        limit: u64,
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
        let (cur_me, prev_me, held, scaled_used, allowance) = match ctx.view.consistency {
            Consistency::Strict => {
                let held = holdings(
                    target.static_share(ctx.me, ctx.replicas),
                    &self.crdt.holdings,
                    ctx.me,
                );
                let (c, p) = (net_of(cur, ctx.me), net_of(prev, ctx.me));
                (c, p, held, c * w + p * (w - el), Allowance::default())
            }
            Consistency::Optimistic => {
                let used = assumed_usage(
                    ctx,
                    target,
                    |n| net_of(cur, n) * w + net_of(prev, n) * (w - el),
                    w,
                );
                let c: u128 = cur.map_or(0, |s| u128::from(s.net_total()));
                let p: u128 = prev.map_or(0, |s| u128::from(s.net_total()));
                let left = i128::from(limit) - (used.div_ceil(w)) as i128;
                let allowance = self.allowance(left, e, ctx);
                (c, p, limit, used, allowance)
            }
        };
        let room_scaled = (u128::from(held) * w).saturating_sub(scaled_used);
        let mut available = (room_scaled / w) as u64;
        if ctx.view.consistency == Consistency::Optimistic {
            available = available.min(allowance_room(&allowance, limit, ctx).max(0) as u64);
        }
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
        Evaluation {
            would_allow,
            available,
            reset: Reset::Known {
                taken: reset(cur_me + u128::from(cost)),
                kept: reset(cur_me),
            },
            retry_after_ms,
            epoch: e,
            level_nt: 0,
            allowance,
            claim: None,
            resend_claim: false,
            next_claim: None,
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn eval_bucket(
        &self,
        target: &Target<'_>,
        rate: u64,
        per_ms: u64,
        burst: u64,
        e: u64,
        cost: u64,
        ctx: &DecideCtx<'_>,
    ) -> Evaluation {
        let (level, units) = self.own_level(target, ctx);
        let cap = i128::from(units) * NANO;
        let cost_nt = i128::from(cost) * NANO;
        match ctx.view.consistency {
            Consistency::Strict => {
                let need_nt = cost_nt.max(i128::from(threshold(target.min_fill_ppm, units)) * NANO);
                let would_allow = level >= need_nt;
                let available = tokens_of(level);
                // This node's refill covers a deficit in `deficit × burst × per / (units × rate)`.
                let mul = u128::from(burst) * u128::from(per_ms);
                let div = u128::from(units) * u128::from(rate) * NANO as u128;
                let retry_after_ms = if would_allow {
                    0
                } else if need_nt <= cap {
                    ceil_mul_div((need_nt - level) as u128, mul, div).max(1)
                } else {
                    // The node holds too little to ever grant the cost by itself: the time the
                    // whole bucket would need.
                    ceil_mul_div(
                        need_nt as u128,
                        u128::from(per_ms),
                        u128::from(rate) * NANO as u128,
                    )
                    .max(1)
                };
                let reset = if units == 0 {
                    Reset::Known { taken: 0, kept: 0 }
                } else {
                    Reset::Refill {
                        deficit_nt: (cap - level).max(0),
                        cost_nt,
                        mul,
                        div,
                    }
                };
                Evaluation {
                    would_allow,
                    available,
                    reset,
                    retry_after_ms,
                    epoch: e,
                    level_nt: level,
                    allowance: Allowance::default(),
                    claim: None,
                    resend_claim: false,
                    next_claim: None,
                }
            }
            Consistency::Optimistic => {
                let global = self.global_level(target, rate, per_ms, burst, ctx);
                let allowance = self.allowance(global, e, ctx);
                let room = global.min(allowance_room(&allowance, i128::from(burst) * NANO, ctx));
                let need_nt = cost_nt.max(i128::from(threshold(target.min_fill_ppm, burst)) * NANO);
                let would_allow = room >= need_nt;
                let available = tokens_of(room);
                let mul = u128::from(per_ms);
                let div = u128::from(rate) * NANO as u128;
                let retry_after_ms = if would_allow {
                    0
                } else {
                    ceil_mul_div((need_nt - global).max(0) as u128, mul, div).max(1)
                };
                let deficit_nt = (i128::from(burst) * NANO - global).max(0);
                Evaluation {
                    would_allow,
                    available,
                    reset: Reset::Refill {
                        deficit_nt,
                        cost_nt,
                        mul,
                        div,
                    },
                    retry_after_ms,
                    epoch: e,
                    level_nt: level,
                    allowance,
                    claim: None,
                    resend_claim: false,
                    next_claim: None,
                }
            }
        }
    }

    /// Optimistic mode: the global bucket level, summing every node's projected sub-bucket;
    /// a node of an unreachable region counts as having spent its whole share.
    fn global_level(
        &self,
        target: &Target<'_>,
        rate: u64,
        per_ms: u64,
        burst: u64,
        ctx: &DecideCtx<'_>,
    ) -> i128 {
        let replicas = ctx.replicas;
        if replicas.len() == 1 {
            return self.own_level(target, ctx).0;
        }
        let base = target.static_split(replicas);
        let mut total = 0i128;
        for n in replicas.nodes() {
            let units = base[n.0 as usize];
            let level = sub_bucket_level(
                self.crdt.buckets.get(n),
                units,
                units,
                (rate, per_ms, burst),
                ctx.now,
            );
            let reachable = n == ctx.me || !ctx.view.unreachable.contains(replicas.region_of(n));
            total += if reachable { level } else { level.min(0) };
        }
        total
    }

    /// Optimistic mode: the allowance in force (reset at every sync and every epoch).
    fn allowance(&self, left_now: i128, epoch: u64, ctx: &DecideCtx<'_>) -> Allowance {
        let kept = self.optimistic().map(|o| o.allowance);
        Allowance::in_force(kept, left_now, epoch, ctx.view.sync_gen)
    }
}

/// The threshold of a class (threshold method): `min_fill` of the capacity, rounded up.
#[inline]
fn threshold(min_fill_ppm: u32, capacity: u64) -> u64 {
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
