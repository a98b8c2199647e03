//! Optimistic mode's claims (fixed windows and quotas): how far a node may raise the most it
//! will admit in an epoch, in rounds, so that the claims never sum above the limit on a
//! healthy network. `docs/algorithms.md` gives the proof and its limits.

use crate::crdt::{Claim, Tally};
use crate::decision::{Consistency, DecideCtx};
use crate::escrow::HORIZON_MS;
use crate::replica::{RegionIdx, RegionMask};
use crate::rule::{Algorithm, Target};
use crate::time::Millis;

use super::key_state::KeyState;

/// Optimistic mode: for how long after its first decision in an epoch a node reserves every
/// region it has not seen claim yet at its full share, and waits before raising its claim a
/// second time if it has seen no other claim (at most half the epoch). Another region's first
/// claim, made concurrently, arrives well within it on a healthy network — half a round trip
/// plus a gossip interval — and so does that of a region whose clock runs up to the default
/// `max_clock_skew` (500 ms) behind.
pub const CLAIM_GRACE_MS: Millis = 500;

impl KeyState {
    /// Optimistic mode, fixed windows and quotas: this node's claim for epoch `e` as a
    /// decision needing `cost` more tokens would leave it, and whether the claim should be
    /// sent again (the node is waiting for peers to catch up).
    ///
    /// Every node that decides for a key publishes, per epoch, a *ceiling* (the most it will
    /// admit in the epoch) and a *round*. A node raises its ceiling only at a round *k* at
    /// which every other participant (a node of a reachable region holding a claim in this
    /// epoch) is at round ≥ *k* − 1, by at most its share of the free pool
    /// `limit − Σ max(usage, ceiling)` — shares taken among the regions that may still raise
    /// in round *k* (a region whose claims all promise not to is left out) — and never
    /// beyond what its forecast says it needs. Raises of one round all see every raise of
    /// earlier rounds, so together they take at most what was free: the ceilings never sum
    /// above the limit (`docs/algorithms.md` gives the proof and its limits). A region not
    /// heard claiming yet is *reserved* at its full share (and its first claim never
    /// exceeds that) while its first claim may be on its way; an unreachable region counts
    /// as `max(what it claimed or used, its full share)`.
    pub(super) fn plan_claim(
        &self,
        target: &Target<'_>,
        limit: u64,
        e: u64,
        own_used: u64,
        cost: u64,
        ctx: &DecideCtx<'_>,
    ) -> (Claim, bool) {
        let algo = target.algorithm;
        let replicas = ctx.replicas;
        let me = ctx.me;
        let view = ctx.view;
        let mine_region = replicas.region_of(me);
        let claims = &self.crdt.claims;
        let mine = claims.get(e, me).copied().unwrap_or(Claim {
            epoch: e,
            node: me,
            step: 0,
            ceiling: 0,
        });
        // What this node expects to need by the end of the epoch (the next half of it at
        // most: claims can keep growing, a round at a time), plus a margin for noise (10 %,
        // or two standard deviations of a Poisson count); everything it can get until its
        // demand has been measured.
        let want = match self.forecast() {
            Some(f) if f.is_primed() => {
                let len = algo.epoch_len(ctx.now);
                let ahead = (algo.epoch_end(e) - ctx.now).min(len / 2).min(HORIZON_MS);
                let x = f.expected(ahead);
                let margin = x.div_ceil(10).max((2.0 * (x as f64).sqrt()).ceil() as u64);
                // Saturating: `own_used` is a tally a peer may have sent back with any value.
                own_used
                    .saturating_add(cost)
                    .saturating_add(x)
                    .saturating_add(margin)
            }
            _ => u64::MAX,
        };
        let reachable = |r| r == mine_region || !view.unreachable.contains(r);
        // Regions not heard claiming in this epoch are reserved at their full share while
        // their first claim may be on its way: during the grace period after this node's
        // first decision in the epoch, and all epoch for a region that claimed in the epoch
        // before. During the grace period they also hold back rounds after the first.
        let first = self.optimistic().map_or((0, 0), |o| o.first_decision);
        let grace = CLAIM_GRACE_MS.min(algo.epoch_len(ctx.now) / 2);
        let in_grace = first.0 != e || ctx.now < first.1.saturating_add(grace);
        let slot = self.crdt.slot(e);
        let used_of = |n| slot.and_then(|s| s.tallies.get(n)).map_or(0, Tally::net);
        let split = target.static_split(replicas);
        let share_of = |r: RegionIdx| -> u128 {
            replicas
                .region_nodes(r)
                .iter()
                .map(|n| u128::from(split[usize::from(n.0)]))
                .sum()
        };
        // The other participants' rounds.
        let (mut min_w, mut max_w) = (u64::MAX, 0u64);
        for c in claims.in_epoch(e) {
            if c.node == me
                || usize::from(c.node.0) >= replicas.len()
                || !reachable(replicas.region_of(c.node))
            {
                continue;
            }
            min_w = min_w.min(c.round());
            max_w = max_w.max(c.round());
        }
        let mut reserved = RegionMask::EMPTY;
        for r in replicas.regions() {
            let nodes = replicas.region_nodes(r);
            if r != mine_region
                && reachable(r)
                && nodes.iter().all(|&n| claims.get(e, n).is_none())
                && (in_grace
                    || e.checked_sub(1)
                        .is_some_and(|p| nodes.iter().any(|&n| claims.get(p, n).is_some())))
            {
                reserved = reserved.with(r);
                if in_grace {
                    min_w = 0;
                }
            }
        }
        let (round, passive) = (mine.round(), u64::from(mine.passive()));
        let mut out = mine;
        if want <= mine.ceiling {
            // Enough for now: keep up with the others' rounds and promise not to raise.
            out.step = out.step.max(Claim::step_at(round.max(max_w), true));
            return (out, false);
        }
        // The first round this node may raise in (a promise not to raise in the next round
        // is kept), and whether every participant has reached the round before it.
        let k = round + 1 + passive;
        if min_w != u64::MAX && min_w + 1 < k {
            // Waiting for a participant: declare that it wants to raise (a new round if it
            // had promised not to), keep up, and send the claim again.
            out.step = out
                .step
                .max(Claim::step_at((round + passive).max(max_w), false));
            return (out, true);
        }
        let mut counted: u128 = 0;
        let mut competing = 0.0f64;
        for r in replicas.regions() {
            let nodes = replicas.region_nodes(r);
            let known: u128 = nodes
                .iter()
                .map(|&n| {
                    let c = claims.get(e, n).map_or(0, |c| c.ceiling);
                    u128::from(used_of(n).max(c))
                })
                .sum();
            if !reachable(r) {
                counted += known.max(share_of(r));
                continue;
            }
            if reserved.contains(r) {
                // Its first claim is within its share; later ones take part in the rounds.
                counted += known.max(share_of(r));
                competing += replicas.region_share(r);
                continue;
            }
            counted += known;
            // A region whose claims all promise not to raise in round k stays out of the
            // division; one without a claim may still make one.
            let mut any = false;
            let mut quiet = true;
            for c in nodes.iter().filter_map(|&n| claims.get(e, n)) {
                any = true;
                quiet &= c.step == Claim::step_at(k - 1, true);
            }
            if r == mine_region || !(any && quiet) {
                competing += replicas.region_share(r);
            }
        }
        let free = (u128::from(limit)).saturating_sub(counted);
        let part = if round == 0 {
            // A first claim: what the others reserve for it until they see it.
            let reserve = if view.acting_alone {
                u128::from(split[usize::from(me.0)])
            } else {
                share_of(mine_region)
            };
            free.min(reserve)
        } else {
            let weight = if view.acting_alone {
                replicas.node_share(me)
            } else {
                replicas.region_share(mine_region)
            };
            if competing <= weight + 1e-12 {
                free
            } else {
                ((free as f64) * (weight / competing)).floor() as u128
            }
        };
        let raise = part.min(u128::from(want - mine.ceiling)) as u64;
        if raise == 0 {
            out.step = out.step.max(Claim::step_at(max_w, false));
            return (out, false);
        }
        out.ceiling = mine.ceiling + raise;
        out.step = Claim::step_at(k.max(max_w), want <= out.ceiling);
        (out, false)
    }

    /// Optimistic fixed windows and quotas: feeds the node's demand forecast, which caps what
    /// it claims.
    #[inline]
    pub(super) fn sample_demand(&mut self, target: &Target<'_>, ctx: &DecideCtx<'_>) {
        if ctx.view.consistency != Consistency::Optimistic || !windowed(target.algorithm) {
            return;
        }
        let len = target.algorithm.epoch_len(ctx.now);
        self.sample_forecast(ctx.now, len);
    }
}

/// Whether the algorithm counts per epoch with claims in optimistic mode (fixed windows and
/// quotas); the others keep the per-sync allowance.
#[inline]
pub(super) fn windowed(algo: &Algorithm) -> bool {
    matches!(
        algo,
        Algorithm::FixedWindow { .. } | Algorithm::Quota { .. }
    )
}
