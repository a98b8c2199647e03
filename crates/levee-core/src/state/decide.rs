//! The decision path: deciding one request (or several atomically), committing what was
//! decided, refunding, and the answer a caller gets.

use crate::crdt::EpochSlot;
use crate::decision::{AllDecision, DecideCtx, Decision};
use crate::escrow::HORIZON_MS;
use crate::replica::NodeIdx;
use crate::rights::NANO;
use crate::rule::{Algorithm, RuleMode, Target};

use super::evaluate::Evaluation;
use super::key_state::KeyState;
use super::quiet::Listing;

impl KeyState {
    /// Decides one request of `cost` tokens and consumes them if allowed (and the rule is
    /// enforced, or it is shadowed and would allow). With `dry_run` nothing changes.
    pub fn decide(
        &mut self,
        target: &Target<'_>,
        mode: RuleMode,
        cost: u64,
        dry_run: bool,
        ctx: &DecideCtx<'_>,
    ) -> Decision {
        let ev = self.evaluate(target, cost, ctx);
        if !dry_run && cost > 0 {
            self.commit(target, cost, ev.would_allow, &ev, ctx, true);
        } else if cost > 0 && asks_rights(&ev, target.algorithm, ctx.now) {
            // A look again while this node's ask is out (a check waiting for rights,
            // `max_wait_ms`, is looked at again as a dry run whenever a peer's state arrives):
            // the caller is still asking.
            self.ask_again(cost, target.algorithm.capacity(), ctx.now);
        }
        let consumed = ev.would_allow && !dry_run && cost > 0;
        decision_of(target.algorithm, mode, cost, &ev, consumed, true, ctx)
    }

    /// Decides and commits a check of `cost` only if this node's own rights admit it now
    /// (`cluster.local_first`: a node that is not the key's owner decides what it holds
    /// rights for, and forwards the rest). Otherwise it changes nothing but what this node's
    /// demand forecast samples (the request was asked here, and rights should follow it
    /// here), and returns `None`: the caller forwards the check to the owner, whose decision
    /// counts it.
    pub fn decide_if_held(
        &mut self,
        target: &Target<'_>,
        mode: RuleMode,
        cost: u64,
        ctx: &DecideCtx<'_>,
    ) -> Option<Decision> {
        let ev = self.evaluate(target, cost, ctx);
        if !ev.would_allow || cost == 0 {
            self.count_requested(cost, target.algorithm.rights_per_epoch());
            return None;
        }
        self.commit(target, cost, true, &ev, ctx, true);
        Some(decision_of(
            target.algorithm,
            mode,
            cost,
            &ev,
            true,
            true,
            ctx,
        ))
    }

    /// Whether this node counted enough of the key to give `cost` back here in full: its own
    /// net consumption in the epochs a refund draws from, or, for a token bucket, room in its
    /// own sub-bucket. A node with `cluster.local_first` takes a refund of a key a region-mate
    /// owns when this holds (it most likely admitted the check itself), and sends it to the
    /// owner otherwise. A sliding log or a leaky bucket is always decided by its owner.
    pub fn refundable_here(&self, target: &Target<'_>, cost: u64, ctx: &DecideCtx<'_>) -> bool {
        let algo = target.algorithm;
        let e = algo.epoch(ctx.now);
        let net = |epoch: u64| {
            self.crdt
                .slot(epoch)
                .and_then(|s| s.tallies.get(ctx.me))
                .map_or(0, |t| t.net())
        };
        match *algo {
            Algorithm::TokenBucket { .. } => {
                let (level, units) = self.own_level(target, ctx);
                level + i128::from(cost) * NANO <= i128::from(units) * NANO
            }
            Algorithm::SlidingWindow { .. } => {
                net(e).saturating_add(net(e.saturating_sub(1))) >= cost
            }
            Algorithm::FixedWindow { .. } | Algorithm::Quota { .. } => net(e) >= cost,
            _ => false,
        }
    }

    /// Gives `cost` tokens back. Never raises what is available above the node's capacity,
    /// and never refunds more than this node consumed in the epochs still counted.
    pub fn refund(&mut self, target: &Target<'_>, cost: u64, ctx: &DecideCtx<'_>) -> Decision {
        let algo = target.algorithm;
        let now = ctx.now;
        let e = algo.epoch(now);
        let mut left = cost;
        if let Algorithm::SlidingLog { window_ms, .. } = *algo {
            // The newest of this node's entries in the window first.
            let from = super::log::window_start(now, window_ms);
            for slot in self.crdt.slots.iter_mut().rev() {
                if left == 0 || slot.epoch < from {
                    break;
                }
                self.pending.tallies |= refund_from(slot, ctx.me, &mut left);
            }
        }
        // The current epoch first; a sliding window's previous epoch still weighs.
        let epochs: &[u64] = match algo {
            Algorithm::SlidingWindow { .. } => &[e, e.saturating_sub(1)],
            Algorithm::TokenBucket { .. } | Algorithm::SlidingLog { .. } => &[],
            _ => &[e],
        };
        for &epoch in epochs {
            if left == 0 {
                break;
            }
            if let Some(slot) = self.crdt.slots.iter_mut().find(|s| s.epoch == epoch) {
                self.pending.tallies |= refund_from(slot, ctx.me, &mut left);
            }
        }
        if let Algorithm::TokenBucket { .. } = algo {
            // The level rises by the cost, capped at the sub-bucket's capacity: a refund can
            // never hold more than a full bucket.
            let (level, units) = self.own_level(target, ctx);
            let cap = i128::from(units) * NANO;
            let new_level = (level + i128::from(cost) * NANO).min(cap.max(level));
            self.set_level(ctx.me, new_level, now);
        }
        let ev = self.evaluate(target, 0, ctx);
        decision_of(algo, RuleMode::Enforce, 0, &ev, false, true, ctx)
    }

    /// Commits an evaluated check of `cost`: counts the request, records the claims the
    /// evaluation raised and, if `admitted`, takes the cost (from the epoch's tally, the
    /// sub-bucket). With `quiet_ok`, a token bucket's write that leaves it near full does not
    /// list the key now (`quiet.rs`).
    fn commit(
        &mut self,
        target: &Target<'_>,
        cost: u64,
        admitted: bool,
        ev: &Evaluation,
        ctx: &DecideCtx<'_>,
        quiet_ok: bool,
    ) {
        let algo = target.algorithm;
        let now = ctx.now;
        self.listing = Listing::Now;
        // A token bucket's replicated state is its level register; only windows count per
        // epoch. A sliding log records admissions only, in the slot of this millisecond (a
        // denial leaves no entry: a flood of denials costs no memory).
        if let Algorithm::SlidingLog { .. } = algo {
            if admitted {
                let tally = self.crdt.slot_mut(now).tallies.entry(ctx.me);
                tally.requested = tally.requested.saturating_add(cost);
                tally.consumed = tally.consumed.saturating_add(cost);
                self.pending.tallies = true;
            }
        } else if !matches!(algo, Algorithm::TokenBucket { .. }) {
            let tally = self.crdt.slot_mut(ev.epoch).tallies.entry(ctx.me);
            // Saturating: the tally may have come back from a peer with any value.
            tally.requested = tally.requested.saturating_add(cost);
            if admitted {
                tally.consumed = tally.consumed.saturating_add(cost);
            }
            self.pending.tallies = true;
        }
        self.count_requested(cost, algo.rights_per_epoch());
        // A decision that finds this node short asks (in a long window).
        let asked = asks_rights(ev, algo, now);
        if asked {
            self.ask_rights(cost, algo.capacity(), now);
        }
        if admitted && let Algorithm::TokenBucket { .. } = algo {
            let after = ev.level_nt - i128::from(cost) * NANO;
            self.set_level(ctx.me, after, now);
            // Near full, the key is not listed for the write (`quiet.rs`): the write goes
            // with the key's next listing, at the latest once its forecast is due a sample,
            // and then at the pace of heartbeats.
            if quiet_ok
                && !asked
                && super::quiet::near_full(after, ev.bucket_units)
                && let Some(b) = self.demand_book.as_deref()
            {
                self.listing = match super::quiet::sample_can_wait(b, self.requested, now) {
                    true => Listing::Quiet,
                    false => Listing::Later,
                };
            }
        }
        if let Algorithm::SlidingLog { limit, window_ms } = *algo {
            self.prune_log(now, window_ms, limit);
        } else if self.crdt.slots.len() > algo.retained_epochs() as usize + 2 {
            self.prune(algo, now);
        }
    }
}

/// Whether a decision evaluated as `ev` asks for rights: in a long window, where demand is
/// often too sparse to make a forecast and rights lent away stay lent for the rest of it. (In
/// a short window the forecast forms within two intervals and the window resets soon; asking
/// there held rights at a region whose demand had moved on.)
fn asks_rights(ev: &Evaluation, algo: &Algorithm, now: crate::time::Millis) -> bool {
    ev.asks_rights && algo.epoch_len(now) > HORIZON_MS
}

/// Gives back up to `left` of what `me` consumed in `slot` (never more than its net
/// consumption there), lowering `left` by it. Returns whether the tally changed.
fn refund_from(slot: &mut EpochSlot, me: NodeIdx, left: &mut u64) -> bool {
    let Some(t) = slot.tallies.get(me).copied() else {
        return false;
    };
    let give = (*left).min(t.net());
    if give == 0 {
        return false;
    }
    slot.tallies.entry(me).refunded = t.refunded + give;
    *left -= give;
    true
}

/// Decides one request against several rules atomically: it is allowed only if every enforced
/// rule allows, and nothing is consumed otherwise. Shadow rules never block; they consume only
/// when the call is allowed and they would allow. The states must be distinct keys (merge
/// duplicate entries, adding their costs, before calling).
pub fn decide_all(
    checks: &mut [(&mut KeyState, Target<'_>, RuleMode)],
    cost: u64,
    dry_run: bool,
    ctx: &DecideCtx<'_>,
) -> AllDecision {
    let evals: Vec<Evaluation> = checks
        .iter()
        .map(|(state, target, _)| state.evaluate(target, cost, ctx))
        .collect();
    let allowed = checks
        .iter()
        .zip(&evals)
        .all(|((_, _, mode), ev)| ev.would_allow || *mode == RuleMode::Shadow);
    if !dry_run && cost > 0 {
        for ((state, target, _), ev) in checks.iter_mut().zip(&evals) {
            state.commit(target, cost, allowed && ev.would_allow, ev, ctx, false);
        }
    }
    let results: Vec<Decision> = checks
        .iter()
        .zip(&evals)
        .map(|((_, target, mode), ev)| {
            let consumed = allowed && ev.would_allow && !dry_run && cost > 0;
            decision_of(target.algorithm, *mode, cost, ev, consumed, allowed, ctx)
        })
        .collect();
    let binding = results
        .iter()
        .zip(checks.iter())
        .position(|(d, (_, _, mode))| !d.would_allow && *mode == RuleMode::Enforce)
        .unwrap_or_else(|| {
            (0..results.len())
                .min_by_key(|&i| results[i].remaining)
                .unwrap_or(0)
        });
    AllDecision {
        allowed,
        binding,
        results,
    }
}

/// The answer for one evaluated check: `consumed` says whether its cost was taken, and
/// `call_allowed` whether the call as a whole was (an enforced rule inside a denied atomic
/// call is denied even if it would have allowed on its own).
fn decision_of(
    algo: &Algorithm,
    mode: RuleMode,
    cost: u64,
    ev: &Evaluation,
    consumed: bool,
    call_allowed: bool,
    ctx: &DecideCtx<'_>,
) -> Decision {
    let remaining = if consumed {
        ev.available.saturating_sub(cost)
    } else {
        ev.available
    };
    let reset_after_ms = ev.reset.ms(consumed);
    let allowed = mode == RuleMode::Shadow || (ev.would_allow && call_allowed);
    Decision {
        allowed,
        would_allow: ev.would_allow,
        limit: algo.capacity(),
        remaining: remaining.min(algo.capacity()),
        reset_after_ms,
        // A shadow rule reports the retry-after it would have answered (with `would_allow`).
        retry_after_ms: ev.retry_after_ms,
        mode,
        degraded: ctx.view.degraded(),
        // Only a request that proceeds waits: a shadow rule never shapes.
        delay_ms: if mode == RuleMode::Enforce && allowed {
            ev.delay_ms
        } else {
            0
        },
    }
}
