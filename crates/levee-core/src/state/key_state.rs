//! The layout of one key's state, and the small accessors every part of it shares.
//!
//! What is decided, merged and extracted lives beside this file (`decide`, `evaluate`,
//! `delta`, …); here is only what a [`KeyState`] holds and how its out-of-line part, its
//! sub-bucket register and its retained epochs are reached.

use crate::crdt::KeyCrdt;
use crate::decision::DecideCtx;
use crate::forecast::Forecast;
use crate::replica::NodeIdx;
use crate::rights::{holdings, own_sub_bucket, write_level};
use crate::rule::{Algorithm, Target};
use crate::time::Millis;

/// One key's state: the replicated CRDT and private bookkeeping.
///
/// A store holds one per key on every node, so its size is the node's memory per key. The
/// common key lives inline, in one allocation with the store's entry: a `KeyState` is 128
/// bytes on 64-bit targets (a test pins it). Out of line, and only where needed, is the
/// demand book: the demand forecast — on nodes that see requests for the key in more than
/// one gossip interval — and the rights it asked for.
#[derive(Debug, Clone, Default)]
pub struct KeyState {
    pub(super) crdt: KeyCrdt,
    /// Tokens requested at this node (admitted or not) that the forecast has not sampled.
    pub(super) requested: u64,
    pub(super) demand_book: Option<Box<DemandBook>>,
    pub(super) pending: PendingDelta,
    /// A sample saw requests while there was no forecast: the next one that does starts it.
    pub(super) demand_seen: bool,
    /// How the last operation asks its store to list the key ([`KeyState::take_listing`]).
    pub(super) listing: super::quiet::Listing,
}

/// This node's own record of its demand for a key, kept out of line and never replicated:
/// the forecast and what it asked for.
#[derive(Debug, Clone)]
pub(super) struct DemandBook {
    /// This node's demand for the key, for the escrow's rebalancing.
    pub(super) forecast: Forecast,
    /// Tokens this node denied because it held too little while the cluster,
    /// as it sees it, had room (a deny that asks for rights), and when it last did. Published
    /// as demand until what it holds covers them or they are [`UNMET_TTL_MS`] old.
    pub(super) unmet: (u64, Millis),
    /// When the forecast last sampled requests (its clock when it did).
    pub(super) last_demand: Millis,
    /// What the squares of the costs of the requests counted in `KeyState::requested` add
    /// beyond the costs themselves (Σ cost² − cost: 0 when every one cost 1), for the
    /// forecast's dispersion; counted only where rights are held per epoch
    /// (`KeyState::count_requested`).
    pub(super) requested_sq_extra: u64,
}

/// How long a deny's ask for rights stays published without a new deny.
pub(super) const UNMET_TTL_MS: Millis = 2_000;

/// Which of this node's entries in the CRDT changed since the last delta: what
/// [`KeyState::take_delta`] returns next.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct PendingDelta {
    /// Its tallies, in any retained epoch.
    pub(super) tallies: bool,
    /// Its rows of the per-epoch transfer matrices.
    pub(super) slot_transfers: bool,
    /// Its row of the continuous holdings.
    pub(super) holdings: bool,
    /// Its sub-bucket register.
    pub(super) bucket: bool,
    /// Its demand register.
    pub(super) demand: bool,
}

impl PendingDelta {
    /// Whether anything is pending.
    pub(super) fn any(&self) -> bool {
        self.tallies || self.slot_transfers || self.holdings || self.bucket || self.demand
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
        if let Algorithm::SlidingLog { limit, window_ms } = *algo {
            self.prune_log(now, window_ms, limit);
            return self.crdt.is_empty();
        }
        let (oldest, newest) = retained_range(algo, now);
        self.crdt.retain_epochs(oldest, newest);
        self.crdt.is_empty()
    }

    /// Counts a request of `cost` tokens for the forecast's next sample. Where rights are
    /// held per epoch (`per_epoch`: fixed windows, quotas), also what its cost's square adds,
    /// so that the forecast judges a drop against the dispersion of the costs: there a false
    /// drop gives away rights of the running window, which come back a round trip later or
    /// not before it ends (`levee-sim --set algorithms --seed 6965 --scenario fixed-window`).
    /// Rights held continuously (buckets, sliding windows and logs) carry from one epoch to
    /// the next, and judged the same way they followed moving demand later: `--set
    /// algorithms --seeds 1400` lowered sliding windows from 1.0472 / 0.7660 to 1.0351 /
    /// 0.6745 (mean / p1) and sliding logs from 1.0271 / 0.7326 to 1.0118 / 0.7133
    /// (docs/accuracy.md).
    #[inline]
    pub(super) fn count_requested(&mut self, cost: u64, per_epoch: bool) {
        self.requested = self.requested.saturating_add(cost);
        if per_epoch
            && cost > 1
            && let Some(b) = self.demand_book.as_deref_mut()
        {
            b.requested_sq_extra = b
                .requested_sq_extra
                .saturating_add(cost.saturating_mul(cost - 1));
        }
    }

    /// The demand book, created (with a forecast whose clock starts at `now`) if missing.
    pub(super) fn demand_book_mut(&mut self, now: Millis) -> &mut DemandBook {
        self.demand_book.get_or_insert_with(|| {
            Box::new(DemandBook {
                forecast: Forecast::starting_at(now),
                unmet: (0, 0),
                last_demand: now,
                requested_sq_extra: 0,
            })
        })
    }

    /// Feeds the demand forecast what was requested here since its last sample. A key whose
    /// requests all fell in one gossip interval gets no forecast (it could not be primed
    /// before a second sample with requests anyway): the forecast starts at the second
    /// sample that sees requests, so a key used once costs no allocation.
    pub(super) fn sample_forecast(&mut self, now: Millis, epoch_len: Millis) {
        let requested = self.requested;
        match self.demand_book.as_mut() {
            Some(c) => {
                let sq = requested.saturating_add(c.requested_sq_extra);
                if c.forecast.sample_costs(now, requested, sq, epoch_len) {
                    self.requested = 0;
                    c.requested_sq_extra = 0;
                    if requested > 0 {
                        c.last_demand = now;
                    }
                }
            }
            None if requested == 0 => {}
            None => {
                self.requested = 0;
                if std::mem::replace(&mut self.demand_seen, true) {
                    self.demand_book_mut(now);
                }
            }
        }
    }

    /// This node's continuous rights in the key (sliding windows and logs, token buckets):
    /// its static share plus what it received, less what it gave.
    #[inline]
    pub(super) fn continuous_holdings(&self, target: &Target<'_>, ctx: &DecideCtx<'_>) -> u64 {
        holdings(
            target.static_share(ctx.me, ctx.replicas),
            &self.crdt.holdings,
            ctx.me,
        )
    }

    /// The node's own sub-bucket: level after refill (nanotokens) and capacity (units).
    #[inline]
    pub(super) fn own_level(&self, target: &Target<'_>, ctx: &DecideCtx<'_>) -> (i128, u64) {
        own_sub_bucket(&self.crdt, target, ctx.me, ctx.replicas, ctx.now).unwrap_or((0, 0))
    }

    /// Writes this node's sub-bucket register. A clock that went backwards does not refill
    /// twice: the register keeps the later time.
    #[inline]
    pub(super) fn set_level(&mut self, me: NodeIdx, level_nt: i128, now: Millis) {
        write_level(self.crdt.buckets.entry(me), level_nt, now);
        self.pending.bucket = true;
    }
}

/// Epochs a key keeps: a few past ones (late deltas, the sliding window's previous one) and
/// the next two. Rights are given ahead of time for the giver's next epoch, which is two
/// epochs ahead for a peer whose clock runs behind (by less than a window, within
/// `max_clock_skew`): a peer that dropped that slot would answer the giver's pull after a
/// restart without the gift, and the giver would give the same rights again. (Found by
/// `levee-sim --scenario crashes --seeds 1500`: seed 564, a node 360 ms ahead of its
/// neighbours' clocks gave 93 rights for its next window, crashed, pulled its state back
/// from a node that had dropped them, and the window admitted 404 of 400.)
/// A sliding log keeps milliseconds instead (see `log`).
pub(super) fn retained_range(algo: &Algorithm, now: Millis) -> (u64, u64) {
    if let Algorithm::SlidingLog { window_ms, .. } = *algo {
        return super::log::log_range(now, window_ms);
    }
    let e = algo.epoch(now);
    (e.saturating_sub(algo.retained_epochs() - 1), e + 2)
}

#[cfg(test)]
mod tests {
    use super::KeyState;

    /// A key's store entry must fit the allocator's 192-byte size class (levee-node's
    /// `a_key_entry_fits_192_bytes`), and the type's doc states this size: a change must be
    /// deliberate, and update both.
    #[test]
    #[cfg(target_pointer_width = "64")]
    fn a_key_state_is_128_bytes_inline() {
        assert_eq!(std::mem::size_of::<KeyState>(), 128);
    }
}
