//! The layout of one key's state, and the small accessors every part of it shares.
//!
//! What is decided, merged and extracted lives beside this file (`decide`, `evaluate`,
//! `delta`, …); here is only what a [`KeyState`] holds and how its out-of-line part, its
//! sub-bucket register and its retained epochs are reached.

use crate::crdt::KeyCrdt;
use crate::decision::DecideCtx;
use crate::forecast::Forecast;
use crate::replica::NodeIdx;
use crate::rights::{holdings, sub_bucket_level, write_level};
use crate::rule::{Algorithm, Target};
use crate::time::Millis;

use super::allowance::Allowance;

/// One key's state: the replicated CRDT and private bookkeeping.
///
/// A store holds one per key on every node, so its size is the node's memory per key. The
/// common key lives inline, in one allocation with the store's entry (128 bytes here). Out of
/// line, and only where needed, is the demand forecast — on nodes that see requests for the
/// key in more than one gossip interval — and optimistic mode's allowance.
#[derive(Debug, Clone, Default)]
pub struct KeyState {
    pub(super) crdt: KeyCrdt,
    /// Tokens requested at this node (admitted or not) that the forecast has not sampled.
    pub(super) requested: u64,
    pub(super) cold: Option<Box<Cold>>,
    pub(super) dirty: Dirty,
    /// A sample saw requests while there was no forecast: the next one that does starts it.
    pub(super) demand_seen: bool,
}

/// The out-of-line part of a key's state.
#[derive(Debug, Clone)]
pub(super) struct Cold {
    /// This node's demand for the key, for the escrow's rebalancing and optimistic claims.
    pub(super) forecast: Forecast,
    /// Optimistic mode's bookkeeping (strict keys never allocate it).
    pub(super) optimistic: Option<Box<Optimistic>>,
}

#[derive(Debug, Clone, Default)]
pub(super) struct Optimistic {
    pub(super) allowance: Allowance,
    /// The latest epoch this node decided in, and when it first did.
    pub(super) first_decision: (u64, Millis),
}

#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Dirty {
    pub(super) tallies: bool,
    pub(super) slot_transfers: bool,
    pub(super) holdings: bool,
    pub(super) bucket: bool,
    pub(super) demand: bool,
    pub(super) claims: bool,
}

impl Dirty {
    pub(super) fn any(&self) -> bool {
        self.tallies
            || self.slot_transfers
            || self.holdings
            || self.bucket
            || self.demand
            || self.claims
    }
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

    /// Drops epochs past retention. Returns whether the key holds nothing any more.
    pub fn prune(&mut self, algo: &Algorithm, now: Millis) -> bool {
        let (oldest, newest) = retained_range(algo, now);
        self.crdt.retain_epochs(oldest, newest);
        self.crdt.is_empty()
    }

    /// The out-of-line part, created (with a forecast whose clock starts at `now`) if missing.
    pub(super) fn cold_mut(&mut self, now: Millis) -> &mut Cold {
        self.cold.get_or_insert_with(|| {
            Box::new(Cold {
                forecast: Forecast::starting_at(now),
                optimistic: None,
            })
        })
    }

    /// Optimistic mode's bookkeeping, if this node keeps any for the key.
    pub(super) fn optimistic(&self) -> Option<&Optimistic> {
        self.cold.as_ref()?.optimistic.as_deref()
    }

    pub(super) fn optimistic_mut(&mut self, now: Millis) -> &mut Optimistic {
        self.cold_mut(now)
            .optimistic
            .get_or_insert_with(Box::default)
    }

    /// This node's demand forecast for the key, if it keeps one.
    pub(super) fn forecast(&self) -> Option<&Forecast> {
        self.cold.as_ref().map(|c| &c.forecast)
    }

    /// Feeds the demand forecast what was requested here since its last sample. A key whose
    /// requests all fell in one gossip interval gets no forecast (it could not be primed
    /// before a second sample with requests anyway): the forecast starts at the second
    /// sample that sees requests, so a key used once costs no allocation.
    pub(super) fn sample_forecast(&mut self, now: Millis, epoch_len: Millis) {
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

    /// The node's own sub-bucket: level after refill (nanotokens) and capacity (units).
    pub(super) fn own_level(&self, target: &Target<'_>, ctx: &DecideCtx<'_>) -> (i128, u64) {
        let Algorithm::TokenBucket {
            rate,
            per_ms,
            burst,
        } = *target.algorithm
        else {
            return (0, 0);
        };
        let base = target.static_share(ctx.me, ctx.replicas);
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

    /// Writes this node's sub-bucket register. A clock that went backwards does not refill
    /// twice: the register keeps the later time.
    pub(super) fn set_level(&mut self, me: NodeIdx, level_nt: i128, now: Millis) {
        write_level(self.crdt.buckets.entry(me), level_nt, now);
        self.dirty.bucket = true;
    }
}

/// Epochs a key keeps: a few past ones (late deltas, the sliding window's previous one) and
/// the next one (rights given ahead of time).
pub(super) fn retained_range(algo: &Algorithm, now: Millis) -> (u64, u64) {
    let e = algo.epoch(now);
    (e.saturating_sub(algo.retained_epochs() - 1), e + 1)
}
