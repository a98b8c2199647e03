//! The state of one key and the decisions made against it.
//!
//! A [`KeyState`] holds the replicated [`KeyCrdt`] and a little private bookkeeping (what
//! changed since the last delta, the optimistic allowance, the demand forecast). Every
//! function takes the time as an argument.
//!
//! ## Call order
//!
//! 1. [`KeyState::decide`] (or [`decide_all`]) on each request; [`KeyState::refund`] when a
//!    request is given back.
//! 2. [`KeyState::merge`] for every delta or full state received from a peer.
//! 3. Every gossip interval, [`KeyState::rebalance`] (strict mode: move spare rights toward
//!    demand), then [`KeyState::take_delta`] to get what changed, to send to peers.
//! 4. [`KeyState::prune`] now and then to drop epochs past retention.
//!
//! ## How each algorithm decides
//!
//! *Fixed windows and quotas* count per epoch. In strict mode node *n* holds for epoch *e*
//! the rights `split(limit)[n] + received[e] − given[e]` and admits while its own net
//! consumption in *e* stays within them; the sum over nodes is the limit, so the global
//! limit holds without coordination.
//!
//! *Sliding windows* weigh the previous epoch by the part of it still inside the sliding
//! window. Rights are continuous (usage carries from one epoch into the next): node *n* admits
//! while `cur[n] + prev[n] × overlap ≤ holdings[n]`.
//!
//! *Token buckets* are split into per-node sub-buckets: a node holding `h` of the `burst`
//! units has capacity `h` and refills at `h × rate / burst`. Transfers move capacity and
//! refill together, so the sub-buckets always sum to at most the global bucket and the
//! cluster never admits more than `burst + rate × (t2 − t1)` over any interval.
//!
//! In optimistic mode the node admits against the merged global figures instead, treating
//! every unreachable region as having consumed `max(last known, its full share)`. Fixed
//! windows and quotas admit within the node's claim for the epoch, raised in rounds so that
//! the claims never sum above the limit on a healthy network (see `plan_claim` and
//! `docs/algorithms.md`); sliding windows and token buckets take between two syncs at most
//! the region's share of what was left at the last sync.

use crate::crdt::{BucketReg, Claim, KeyCrdt, Lattice, Tally, TransferMatrix};
use crate::decision::{AllDecision, ClusterView, Consistency, DecideCtx, Decision, Usage};
use crate::forecast::Forecast;
use crate::replica::{NodeIdx, RegionIdx, RegionMask, ReplicaSet};
use crate::rule::{Algorithm, RuleMode, Target};
use crate::time::Millis;

/// The retry-after a recovering node answers: it expects to have pulled the cluster's state
/// by then.
pub const RECOVERY_RETRY_MS: u64 = 1_000;

/// Optimistic mode: for how long after its first decision in an epoch a node reserves every
/// region it has not seen claim yet at its full share, and waits before raising its claim a
/// second time if it has seen no other claim (at most half the epoch). Another region's first
/// claim, made concurrently, arrives well within it on a healthy network — half a round trip
/// plus a gossip interval — and so does that of a region whose clock runs up to the default
/// `max_clock_skew` (500 ms) behind.
pub const CLAIM_GRACE_MS: Millis = 500;

/// Nanotokens per token: token-bucket levels are fixed-point integers.
pub const NANO: i128 = 1_000_000_000;

/// Why a remote delta was refused. The state is unchanged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MergeError {
    /// The delta names a node outside the agreed replica set.
    #[error("delta names node {node} but the replica set has {len} nodes")]
    UnknownNode {
        /// The index named.
        node: u16,
        /// The replica set's size.
        len: usize,
    },
}

/// One key's state: the replicated CRDT and private bookkeeping.
///
/// A store holds one per key on every node, so its size is the node's memory per key. The
/// common key lives inline, in one allocation with the store's entry (128 bytes here). Out of
/// line, and only where needed, is the demand forecast — on nodes that see requests for the
/// key in more than one gossip interval — and optimistic mode's allowance.
#[derive(Debug, Clone, Default)]
pub struct KeyState {
    pub(crate) crdt: KeyCrdt,
    /// Tokens requested at this node (admitted or not) that the forecast has not sampled.
    requested: u64,
    cold: Option<Box<Cold>>,
    dirty: Dirty,
    /// A sample saw requests while there was no forecast: the next one that does starts it.
    demand_seen: bool,
}

/// The out-of-line part of a key's state.
#[derive(Debug, Clone)]
pub(crate) struct Cold {
    /// This node's demand for the key, for the escrow's rebalancing and optimistic claims.
    pub(crate) forecast: Forecast,
    /// Optimistic mode's bookkeeping (strict keys never allocate it).
    optimistic: Option<Box<Optimistic>>,
}

#[derive(Debug, Clone, Default)]
struct Optimistic {
    allowance: Allowance,
    /// The latest epoch this node decided in, and when it first did.
    first_decision: (u64, Millis),
}

#[derive(Debug, Clone, Copy, Default)]
struct Dirty {
    tallies: bool,
    slot_transfers: bool,
    holdings: bool,
    bucket: bool,
    demand: bool,
    claims: bool,
}

impl Dirty {
    fn any(&self) -> bool {
        self.tallies
            || self.slot_transfers
            || self.holdings
            || self.bucket
            || self.demand
            || self.claims
    }
}

/// Optimistic mode's per-sync allowance.
#[derive(Debug, Clone, Copy, Default)]
struct Allowance {
    sync_gen: u64,
    epoch: u64,
    /// What was left globally at the last sync (tokens, or nanotokens for a token bucket).
    left: i128,
    /// What this node has taken since (same unit).
    taken: i128,
    valid: bool,
}

/// How long until a key is back to its limit; computed only for the answer actually given
/// (a token bucket's needs a division that a decision should not pay twice).
#[derive(Debug, Clone, Copy)]
enum Reset {
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
    fn ms(self, taken: bool) -> u64 {
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
struct Evaluation {
    would_allow: bool,
    /// What this node could admit now, in tokens, before the check.
    available: u64,
    /// Time until the key is back to its limit, if the cost is taken and if it is not.
    reset: Reset,
    retry_after_ms: u64,
    epoch: u64,
    /// Token bucket: own level after refill, before the check.
    level_nt: i128,
    allowance: Allowance,
    /// Optimistic fixed windows and quotas: this node's claim as the decision leaves it
    /// (raised, or its round caught up), if it changes; and whether to resend it.
    claim: Option<Claim>,
    resend_claim: bool,
    /// … and its first claim for the next epoch, made during the last part of this one.
    next_claim: Option<Claim>,
}

impl KeyState {
    /// An empty state.
    pub fn new() -> KeyState {
        KeyState::default()
    }

    /// The replicated part.
    pub fn crdt(&self) -> &KeyCrdt {
        &self.crdt
    }

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
        if !dry_run && cost > 0 {
            self.sample_demand(target, ctx);
        }
        let ev = self.evaluate(target, cost, ctx);
        if !dry_run && cost > 0 {
            self.commit(target, cost, ev.would_allow, &ev, ctx);
        }
        let consumed = ev.would_allow && !dry_run && cost > 0;
        decision_of(target.algorithm, mode, cost, &ev, consumed, true, ctx)
    }

    /// Gives `cost` tokens back. Never raises what is available above the node's capacity,
    /// and never refunds more than this node consumed in the epochs still counted.
    pub fn refund(&mut self, target: &Target<'_>, cost: u64, ctx: &DecideCtx<'_>) -> Decision {
        let algo = target.algorithm;
        let now = ctx.now;
        let e = algo.epoch(now);
        let mut left = cost;
        // The current epoch first; a sliding window's previous epoch still weighs.
        let epochs: &[u64] = match algo {
            Algorithm::SlidingWindow { .. } => &[e, e.saturating_sub(1)],
            Algorithm::TokenBucket { .. } => &[],
            _ => &[e],
        };
        for &epoch in epochs {
            if left == 0 {
                break;
            }
            let Some(slot) = self.crdt.slots.iter_mut().find(|s| s.epoch == epoch) else {
                continue;
            };
            let Some(t) = slot.tallies.get(ctx.me).copied() else {
                continue;
            };
            let give = left.min(t.net());
            if give > 0 {
                slot.tallies.entry(ctx.me).refunded = t.refunded + give;
                left -= give;
                self.dirty.tallies = true;
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

    /// This key's usage as this node sees it, summed per region.
    pub fn usage(&self, target: &Target<'_>, ctx: &DecideCtx<'_>) -> Usage {
        let algo = target.algorithm;
        let replicas = ctx.replicas;
        let now = ctx.now;
        let e = algo.epoch(now);
        let limit = algo.capacity();
        let mut regions = vec![0u64; replicas.region_count()];
        let reset_after_ms;
        match *algo {
            Algorithm::FixedWindow { .. } | Algorithm::Quota { .. } => {
                if let Some(slot) = self.crdt.slot(e) {
                    for (n, t) in slot.tallies.iter() {
                        if let Some(r) = regions.get_mut(region_index(replicas, n)) {
                            *r += t.net();
                        }
                    }
                }
                let used: u64 = regions.iter().sum();
                reset_after_ms = if used > 0 { algo.epoch_end(e) - now } else { 0 };
            }
            Algorithm::SlidingWindow { window_ms, .. } => {
                let el = now - algo.epoch_start(e);
                let (cur, prev) = (self.crdt.slot(e), self.crdt.slot(e.wrapping_sub(1)));
                let mut any_cur = false;
                let mut any_prev = false;
                let mut nums = vec![0u128; regions.len()];
                for (slot, weight) in [
                    (cur, u128::from(window_ms)),
                    (prev, u128::from(window_ms - el)),
                ] {
                    let Some(slot) = slot else { continue };
                    for (n, t) in slot.tallies.iter() {
                        if let Some(r) = nums.get_mut(region_index(replicas, n)) {
                            *r += u128::from(t.net()) * weight;
                        }
                        if t.net() > 0 {
                            if slot.epoch == e {
                                any_cur = true;
                            } else {
                                any_prev = true;
                            }
                        }
                    }
                }
                for (r, num) in regions.iter_mut().zip(nums) {
                    *r = num.div_ceil(u128::from(window_ms)) as u64;
                }
                reset_after_ms = if any_cur {
                    2 * window_ms - el
                } else if any_prev {
                    window_ms - el
                } else {
                    0
                };
            }
            Algorithm::TokenBucket {
                rate,
                per_ms,
                burst,
            } => {
                let base = replicas.split(burst);
                let mut deficit_total: i128 = 0;
                for n in replicas.nodes() {
                    let units = holdings(base[n.0 as usize], &self.crdt.holdings, n);
                    let cap = i128::from(units) * NANO;
                    let level = sub_bucket_level(
                        self.crdt.buckets.get(n),
                        base[n.0 as usize],
                        units,
                        (rate, per_ms, burst),
                        now,
                    );
                    let deficit = (cap - level).max(0);
                    deficit_total += deficit;
                    if let Some(r) = regions.get_mut(region_index(replicas, n)) {
                        *r += ceil_div(deficit, NANO) as u64;
                    }
                }
                reset_after_ms =
                    ceil_div(deficit_total * i128::from(per_ms), i128::from(rate) * NANO) as u64;
            }
        }
        let used: u64 = regions.iter().sum::<u64>().min(limit);
        Usage {
            limit,
            used,
            remaining: limit - used,
            reset_after_ms,
            regions,
        }
    }

    /// Merges a remote delta or full state. Slots of epochs outside retention are dropped
    /// (too old to matter, or from a peer whose clock runs far ahead). Returns whether the
    /// state changed. A token bucket whose holdings change re-anchors its level first, so
    /// that new rights refill only from the moment they arrive.
    pub fn merge(
        &mut self,
        delta: &KeyCrdt,
        target: &Target<'_>,
        ctx: &DecideCtx<'_>,
    ) -> Result<bool, MergeError> {
        let replicas = ctx.replicas;
        if let Some(n) = delta.max_node()
            && usize::from(n.0) >= replicas.len()
        {
            return Err(MergeError::UnknownNode {
                node: n.0,
                len: replicas.len(),
            });
        }
        let algo = target.algorithm;
        let (oldest, newest) = retained_range(algo, ctx.now);
        let mut changed = false;
        for slot in &delta.slots {
            if slot.epoch >= oldest && slot.epoch <= newest {
                changed |= self.crdt.slot_mut(slot.epoch).join(slot);
            }
        }
        let anchor = match algo {
            Algorithm::TokenBucket { .. }
                if delta.holdings.cells().iter().any(|c| c.to == ctx.me) =>
            {
                let (level, cap) = self.own_level(target, ctx);
                Some((level, cap))
            }
            _ => None,
        };
        let holdings_changed = self.crdt.holdings.join(&delta.holdings);
        changed |= holdings_changed;
        changed |= self.crdt.buckets.join(&delta.buckets);
        if let Some((level, _)) = anchor.filter(|_| holdings_changed) {
            // The register may have been replaced by our own older write coming back; keep
            // the lower of the two levels, which is always safe.
            let (now_level, _) = self.own_level(target, ctx);
            self.set_level(ctx.me, level.min(now_level), ctx.now);
        }
        changed |= self.crdt.demand.join(&delta.demand);
        for c in delta.claims.iter() {
            if c.epoch >= oldest && c.epoch <= newest {
                changed |= self.crdt.claims.raise(*c);
            }
        }
        Ok(changed)
    }

    /// Whether this node wrote entries that [`KeyState::take_delta`] has not returned yet.
    pub fn has_delta(&self) -> bool {
        self.dirty.any()
    }

    /// The entries this node wrote since the last call, as absolute values: its tallies in
    /// every retained epoch, its rows of the transfer matrices, its registers. `None` when
    /// nothing changed.
    pub fn take_delta(&mut self, me: NodeIdx) -> Option<KeyCrdt> {
        if !self.dirty.any() {
            return None;
        }
        let d = std::mem::take(&mut self.dirty);
        let mut out = KeyCrdt::default();
        for slot in &self.crdt.slots {
            let mine = slot.tallies.get(me).filter(|_| d.tallies);
            let row: Vec<_> = if d.slot_transfers {
                slot.transfers.row(me).copied().collect()
            } else {
                vec![]
            };
            if mine.is_none() && row.is_empty() {
                continue;
            }
            let s = out.slot_mut(slot.epoch);
            if let Some(t) = mine {
                *s.tallies.entry(me) = *t;
            }
            let mut m = TransferMatrix::default();
            for c in row {
                m.give(c.from, c.to, c.units);
            }
            s.transfers = m;
        }
        if d.holdings {
            for c in self.crdt.holdings.row(me) {
                out.holdings.give(c.from, c.to, c.units);
            }
        }
        if d.bucket
            && let Some(b) = self.crdt.buckets.get(me)
        {
            *out.buckets.entry(me) = *b;
        }
        if d.demand
            && let Some(r) = self.crdt.demand.get(me)
        {
            *out.demand.entry(me) = *r;
        }
        // Claims ride with every tally update too: a lost claim is repaired by the next delta
        // of a node that keeps deciding, without waiting for anti-entropy.
        if d.claims || d.tallies {
            for c in self.crdt.claims.iter().filter(|c| c.node == me) {
                out.claims.raise(*c);
            }
        }
        Some(out)
    }

    /// Drops epochs past retention. Returns whether the key holds nothing any more.
    pub fn prune(&mut self, algo: &Algorithm, now: Millis) -> bool {
        let (oldest, newest) = retained_range(algo, now);
        self.crdt.retain_epochs(oldest, newest);
        self.crdt.is_empty()
    }

    /// The out-of-line part, created (with a forecast whose clock starts at `now`) if missing.
    fn cold_mut(&mut self, now: Millis) -> &mut Cold {
        self.cold.get_or_insert_with(|| {
            Box::new(Cold {
                forecast: Forecast::starting_at(now),
                optimistic: None,
            })
        })
    }

    /// Optimistic mode's bookkeeping, if this node keeps any for the key.
    fn optimistic(&self) -> Option<&Optimistic> {
        self.cold.as_ref()?.optimistic.as_deref()
    }

    fn optimistic_mut(&mut self, now: Millis) -> &mut Optimistic {
        self.cold_mut(now)
            .optimistic
            .get_or_insert_with(Box::default)
    }

    /// This node's demand forecast for the key, if it keeps one.
    pub(crate) fn forecast(&self) -> Option<&Forecast> {
        self.cold.as_ref().map(|c| &c.forecast)
    }

    /// Feeds the demand forecast what was requested here since its last sample. A key whose
    /// requests all fell in one gossip interval gets no forecast (it could not be primed
    /// before a second sample with requests anyway): the forecast starts at the second
    /// sample that sees requests, so a key used once costs no allocation.
    pub(crate) fn sample_forecast(&mut self, now: Millis, epoch_len: Millis) {
        let requested = self.requested;
        match self.cold.as_mut() {
            Some(c) => {
                if c.forecast.sample(now, requested, epoch_len) {
                    self.requested = 0;
                }
            }
            None if requested == 0 => {}
            None => {
                self.requested = 0;
                if std::mem::replace(&mut self.demand_seen, true) {
                    self.cold_mut(now);
                }
            }
        }
    }

    pub(crate) fn mark_demand_dirty(&mut self) {
        self.dirty.demand = true;
    }

    pub(crate) fn mark_transfers_dirty(&mut self, continuous: bool) {
        if continuous {
            self.dirty.holdings = true;
        } else {
            self.dirty.slot_transfers = true;
        }
    }

    // ---- evaluation --------------------------------------------------------------------

    fn evaluate(&self, target: &Target<'_>, cost: u64, ctx: &DecideCtx<'_>) -> Evaluation {
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
                let base = base_of(target, ctx);
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
    fn plan_claim(
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
                let ahead = (algo.epoch_end(e) - ctx.now)
                    .min(len / 2)
                    .min(crate::escrow::HORIZON_MS);
                let x = f.expected(ahead);
                let margin = x.div_ceil(10).max((2.0 * (x as f64).sqrt()).ceil() as u64);
                own_used + cost + x + margin
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
        let split = split_of(target, replicas);
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
            out.step = out.step.max(2 * round.max(max_w) + 1);
            return (out, false);
        }
        // The first round this node may raise in (a promise not to raise in the next round
        // is kept), and whether every participant has reached the round before it.
        let k = round + 1 + passive;
        if min_w != u64::MAX && min_w + 1 < k {
            // Waiting for a participant: declare that it wants to raise (a new round if it
            // had promised not to), keep up, and send the claim again.
            out.step = out.step.max(2 * (round + passive).max(max_w));
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
                quiet &= c.step == 2 * (k - 1) + 1;
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
            out.step = out.step.max(2 * max_w);
            return (out, false);
        }
        out.ceiling = mine.ceiling + raise;
        out.step = 2 * k.max(max_w) + u64::from(want <= out.ceiling);
        (out, false)
    }

    /// Optimistic fixed windows and quotas: feeds the node's demand forecast, which caps what
    /// it claims.
    fn sample_demand(&mut self, target: &Target<'_>, ctx: &DecideCtx<'_>) {
        if ctx.view.consistency != Consistency::Optimistic || !windowed(target.algorithm) {
            return;
        }
        let len = target.algorithm.epoch_len(ctx.now);
        self.sample_forecast(ctx.now, len);
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
        let net_of = |slot: Option<&crate::crdt::EpochSlot>, n: NodeIdx| {
            slot.and_then(|s| s.tallies.get(n))
                .map_or(0u128, |t| u128::from(t.net()))
        };
        // Weighted usage is kept scaled by the window length so that every figure is exact.
        let (cur_me, prev_me, held, scaled_used, allowance) = match ctx.view.consistency {
            Consistency::Strict => {
                let held = holdings(base_of(target, ctx), &self.crdt.holdings, ctx.me);
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

    /// The node's own sub-bucket: level after refill (nanotokens) and capacity (units).
    fn own_level(&self, target: &Target<'_>, ctx: &DecideCtx<'_>) -> (i128, u64) {
        let Algorithm::TokenBucket {
            rate,
            per_ms,
            burst,
        } = *target.algorithm
        else {
            return (0, 0);
        };
        let base = base_of(target, ctx);
        let units = holdings(base, &self.crdt.holdings, ctx.me);
        let level = sub_bucket_level(
            self.crdt.buckets.get(ctx.me),
            base,
            units,
            (rate, per_ms, burst),
            ctx.now,
        );
        (level, units)
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
        let base = split_of(target, replicas);
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
        let a = self.optimistic().map(|o| o.allowance).unwrap_or_default();
        if a.valid && a.sync_gen == ctx.view.sync_gen && a.epoch == epoch {
            a
        } else {
            Allowance {
                sync_gen: ctx.view.sync_gen,
                epoch,
                left: left_now.max(0),
                taken: 0,
                valid: true,
            }
        }
    }

    // ---- commit ------------------------------------------------------------------------

    fn commit(
        &mut self,
        target: &Target<'_>,
        cost: u64,
        admitted: bool,
        ev: &Evaluation,
        ctx: &DecideCtx<'_>,
    ) {
        let algo = target.algorithm;
        let now = ctx.now;
        // A token bucket's replicated state is its level register; only windows count per
        // epoch.
        if !matches!(algo, Algorithm::TokenBucket { .. }) {
            let tally = self.crdt.slot_mut(ev.epoch).tallies.entry(ctx.me);
            tally.requested += cost;
            if admitted {
                tally.consumed += cost;
            }
            self.dirty.tallies = true;
        }
        self.requested = self.requested.saturating_add(cost);
        if ctx.view.consistency == Consistency::Optimistic
            && windowed(algo)
            && self
                .optimistic()
                .is_none_or(|o| o.first_decision.0 != ev.epoch)
        {
            self.optimistic_mut(now).first_decision = (ev.epoch, now);
        }
        if let Some(c) = ev.next_claim {
            self.crdt.claims.raise(c);
            self.dirty.claims = true;
        }
        if let Some(c) = ev.claim {
            self.crdt.claims.raise(c);
            self.dirty.claims = true;
        }
        if ev.resend_claim {
            self.dirty.claims = true;
        }
        if admitted {
            if ctx.view.consistency == Consistency::Optimistic && !windowed(algo) {
                let mut a = ev.allowance;
                a.taken += match algo {
                    Algorithm::TokenBucket { .. } => i128::from(cost) * NANO,
                    _ => i128::from(cost),
                };
                self.optimistic_mut(now).allowance = a;
            }
            if let Algorithm::TokenBucket { .. } = algo {
                self.set_level(ctx.me, ev.level_nt - i128::from(cost) * NANO, now);
            }
        }
        if self.crdt.slots.len() > algo.retained_epochs() as usize + 1 {
            self.prune(algo, now);
        }
    }

    /// Writes this node's sub-bucket register. A clock that went backwards does not refill
    /// twice: the register keeps the later time.
    pub(crate) fn set_level(&mut self, me: NodeIdx, level_nt: i128, now: Millis) {
        let reg = self.crdt.buckets.entry(me);
        let clamped = level_nt.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64;
        *reg = BucketReg {
            seq: reg.seq + 1,
            at: reg.at.max(now),
            level_nt: clamped,
        };
        self.dirty.bucket = true;
    }
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
    if !dry_run && cost > 0 {
        for (state, target, _) in checks.iter_mut() {
            state.sample_demand(target, ctx);
        }
    }
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
            state.commit(target, cost, allowed && ev.would_allow, ev, ctx);
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
    }
}

/// Whether the algorithm counts per epoch with claims in optimistic mode (fixed windows and
/// quotas); the others keep the per-sync allowance.
#[inline]
fn windowed(algo: &Algorithm) -> bool {
    matches!(
        algo,
        Algorithm::FixedWindow { .. } | Algorithm::Quota { .. }
    )
}

/// The target's capacity split among the nodes: bound by `Rule::bind`, else computed.
fn split_of<'a>(target: &Target<'a>, replicas: &ReplicaSet) -> std::borrow::Cow<'a, [u64]> {
    match target.split {
        Some(s) if s.len() == replicas.len() => std::borrow::Cow::Borrowed(s),
        _ => std::borrow::Cow::Owned(replicas.split(target.algorithm.capacity())),
    }
}

/// This node's static share of the target's capacity.
#[inline]
fn base_of(target: &Target<'_>, ctx: &DecideCtx<'_>) -> u64 {
    match target.split {
        Some(split) => split.get(usize::from(ctx.me.0)).copied().unwrap_or(0),
        None => ctx.replicas.split(target.algorithm.capacity())[usize::from(ctx.me.0)],
    }
}

/// Rights a node holds: its static share plus what it received minus what it gave.
#[inline]
pub(crate) fn holdings(base: u64, transfers: &TransferMatrix, node: NodeIdx) -> u64 {
    if transfers.is_empty() {
        return base;
    }
    (i128::from(base) + transfers.net(node)).clamp(0, i128::from(u64::MAX)) as u64
}

/// A sub-bucket's level at `now`: the register's level plus refill at the node's rate,
/// capped at its capacity. Refill floors, so rounding never creates tokens.
#[inline]
pub(crate) fn project(
    reg: &BucketReg,
    units: u64,
    rate: u64,
    per_ms: u64,
    burst: u64,
    now: Millis,
) -> i128 {
    let cap = i128::from(units) * NANO;
    let level = i128::from(reg.level_nt);
    if level >= cap {
        return cap;
    }
    let dt = u128::from(now.saturating_sub(reg.at));
    let refill = mul_div(
        dt * u128::from(units) * u128::from(rate) * NANO as u128,
        u128::from(burst) * u128::from(per_ms),
    );
    (level + refill.min(cap as u128) as i128).min(cap)
}

/// A node's sub-bucket level at `now`. A node that never wrote its register starts full at
/// its static share; rights it received before its first write arrive empty (they refill
/// from then on), so receiving never creates tokens.
#[inline]
pub(crate) fn sub_bucket_level(
    reg: Option<&BucketReg>,
    base: u64,
    units: u64,
    (rate, per_ms, burst): (u64, u64, u64),
    now: Millis,
) -> i128 {
    match reg {
        Some(reg) => project(reg, units, rate, per_ms, burst, now),
        None => i128::from(base.min(units)) * NANO,
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

/// Optimistic mode: global usage (scaled by `scale`), where every unreachable region counts
/// as having consumed `max(last known, its full share)`.
fn assumed_usage(
    ctx: &DecideCtx<'_>,
    target: &Target<'_>,
    used_of: impl Fn(NodeIdx) -> u128,
    scale: u128,
) -> u128 {
    let replicas = ctx.replicas;
    if ctx.view.unreachable.is_empty() {
        return replicas.nodes().map(&used_of).sum();
    }
    let split = split_of(target, replicas);
    let mut total = 0u128;
    for r in replicas.regions() {
        let nodes = replicas.region_nodes(r);
        let known: u128 = nodes.iter().map(|&n| used_of(n)).sum();
        let unreachable = ctx.view.unreachable.contains(r) && replicas.region_of(ctx.me) != r;
        total += if unreachable {
            let share: u128 = nodes
                .iter()
                .map(|n| u128::from(split[usize::from(n.0)]))
                .sum();
            known.max(share * scale)
        } else {
            known
        };
    }
    total
}

/// Optimistic mode: what may still be taken before the next sync — the region's share of
/// what was left at the last sync, less what was taken since. The share is taken among the
/// regions that can still consume: unreachable regions are already counted at their full
/// share, so a region cut off from every other may take all that is left (its own share).
/// A node acting alone for its region takes its own slice of the region's part.
fn allowance_room(a: &Allowance, full: impl Into<i128>, ctx: &DecideCtx<'_>) -> i128 {
    let full: i128 = full.into();
    let replicas = ctx.replicas;
    let mine = replicas.region_of(ctx.me);
    let region = replicas.region_share(mine);
    let competing: f64 = replicas
        .regions()
        .filter(|&r| r == mine || !ctx.view.unreachable.contains(r))
        .map(|r| replicas.region_share(r))
        .sum();
    let mut share = region / competing;
    if ctx.view.acting_alone {
        share *= replicas.node_share(ctx.me) / region;
    }
    if share >= 1.0 - 1e-12 {
        return full.min(a.left) - a.taken;
    }
    let cap = ((a.left as f64) * share).floor() as i128;
    cap.max(0) - a.taken
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

/// Whole tokens in a level of nanotokens (0 for a negative level).
#[inline]
fn tokens_of(level_nt: i128) -> u64 {
    // Levels are bounded by MAX_BURST × NANO, inside an i64: divide in 64 bits.
    (level_nt.clamp(0, i128::from(i64::MAX)) as u64) / NANO as u64
}

/// `n / d`, in 64-bit arithmetic when both fit (the common case), else in 128 bits.
#[inline]
fn mul_div(n: u128, d: u128) -> u128 {
    match (u64::try_from(n), u64::try_from(d)) {
        (Ok(n), Ok(d)) => u128::from(n / d),
        _ => n / d,
    }
}

/// `ceil(a × mul / div)`, saturating at `u64::MAX` (and `u64::MAX` when `div` is 0).
#[inline]
fn ceil_mul_div(a: u128, mul: u128, div: u128) -> u64 {
    if div == 0 {
        return u64::MAX;
    }
    let n = a.saturating_mul(mul);
    let q = mul_div(n, div);
    let q = if q * div < n { q + 1 } else { q };
    u64::try_from(q).unwrap_or(u64::MAX)
}

#[inline]
fn ceil_div(a: i128, b: i128) -> i128 {
    if a <= 0 { 0 } else { (a + b - 1) / b }
}

#[inline]
fn region_index(replicas: &ReplicaSet, n: NodeIdx) -> usize {
    if usize::from(n.0) < replicas.len() {
        usize::from(replicas.region_of(n).0)
    } else {
        usize::MAX
    }
}

/// Epochs a key keeps: a few past ones (late deltas, the sliding window's previous one) and
/// the next one (rights given ahead of time).
fn retained_range(algo: &Algorithm, now: Millis) -> (u64, u64) {
    let e = algo.epoch(now);
    (e.saturating_sub(algo.retained_epochs() - 1), e + 1)
}
