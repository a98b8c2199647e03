//! A key's part in strict mode's escrow: sampling this node's demand, publishing it, and
//! giving spare rights toward the demand of others ([`crate::escrow`] decides where).

use crate::crdt::Tally;
use crate::escrow::{self, HORIZON_MS, PRESS_MS, RebalanceCtx};
use crate::forecast::Forecast;
use crate::rights::{holdings, inherited};
use crate::rule::Target;
use crate::time::Millis;

use super::key_state::{DemandBook, KeyState, UNMET_TTL_MS};

/// In a long window, demand that paused this long is not kept for: what the node holds
/// beyond its use goes where requests wait, or home. Sooner at a high rate: demand has paused
/// once [`PAUSE_TOKENS`] were expected and none came ([`pause_after`]).
const PAUSE_MS: Millis = 500;

/// Tokens a node's forecast expected since its last request for its demand to count as
/// paused (a Poisson count of 10 is 0 with probability e^-10), though never before
/// [`MIN_PAUSE_MS`]. Demand that moves region by region at 150 checks a second paused 500 ms
/// before the region that had it gave way, and the next region's whole burst was over by
/// then (`levee-sim --seed 986 --scenario back-to-back`: 6 of 56 admitted, 42 rights idle
/// at that region's owner; `--set demand --seeds 1000`, back-to-back mean / p1 1.0040 /
/// 0.9412 before, 1.0063 / 0.9732 with it, `--local-first` 0.9097 and 0.9583;
/// docs/accuracy.md).
const PAUSE_TOKENS: f64 = 10.0;

/// The shortest pause ([`PAUSE_TOKENS`]): five gossip intervals, when a sample is taken.
const MIN_PAUSE_MS: Millis = 100;

/// How long without a request means `book`'s demand has paused, in a long window.
fn pause_after(book: &DemandBook) -> Millis {
    let rate = book.forecast.rate();
    if rate <= 0.0 {
        return PAUSE_MS;
    }
    ((PAUSE_TOKENS / rate) as Millis).clamp(MIN_PAUSE_MS, PAUSE_MS)
}

impl KeyState {
    /// Updates this node's demand forecast and, in strict mode, gives spare rights toward
    /// demand. Returns the rights given. Call it every gossip interval for keys with recent
    /// activity, and when a peer asks for rights; then send [`KeyState::take_delta`].
    pub fn rebalance(&mut self, target: &Target<'_>, ctx: &RebalanceCtx<'_>) -> u64 {
        let algo = target.algorithm;
        let now = ctx.now;
        let epoch_len = algo.epoch_len(now);
        self.sample_forecast(now, epoch_len);
        let own = match self.demand_book.as_deref() {
            // In a long window, demand that paused is not kept for: what the node holds
            // beyond its use goes where requests wait (its forecast comes back with its next
            // requests).
            Some(b)
                if epoch_len > HORIZON_MS && now.saturating_sub(b.last_demand) > pause_after(b) =>
            {
                0
            }
            Some(b) if ctx.owner == ctx.me || ctx.own_demand => b.forecast.expected(epoch_len),
            _ => 0,
        };
        let inherited = ctx
            .inherit_from
            .filter(|_| ctx.owner == ctx.me)
            .and_then(|n| self.crdt.demand.get(n))
            .map_or(0, |r| r.forecast);
        let asked = if ctx.owner == ctx.me {
            self.unmet_forecast(target, ctx)
        } else {
            0
        };
        let forecast = own.max(inherited).max(asked);
        if crate::demand::publish_demand(
            &mut self.crdt,
            target,
            ctx.replicas,
            ctx.me,
            now,
            forecast,
        ) {
            self.pending.demand = true;
        }
        let gifts = escrow::give_spare(&mut self.crdt, target, ctx, forecast);
        self.pending.slot_transfers |= gifts.epoch_transfers;
        self.pending.holdings |= gifts.holdings;
        self.pending.bucket |= gifts.bucket;
        gifts.given
    }

    /// What `me` holds of this key beyond what it used: rights in the current and the next
    /// epoch, or its continuous holdings (a token bucket's units of capacity). A node that
    /// leaves holds nothing once this is 0 for every key.
    pub fn unspent(
        &self,
        target: &Target<'_>,
        replicas: &crate::replica::ReplicaSet,
        me: crate::replica::NodeIdx,
        now: Millis,
    ) -> u64 {
        escrow::unspent(&self.crdt, target, replicas, me, now)
    }

    /// A check of `cost` was denied because this node held too little while the
    /// cluster had room. The shortfall is published as demand at the next interval (whether
    /// or not the key has a forecast yet: sporadic demand never makes one), so that donors
    /// give toward it and the next request finds rights.
    pub(super) fn ask_rights(&mut self, cost: u64, capacity: u64, now: Millis) {
        let book = self.demand_book.get_or_insert_with(|| {
            // A forecast not started: its first sample only starts its clock, as for a key
            // seen in one interval (a single deny is no rate).
            Box::new(DemandBook {
                forecast: Forecast::default(),
                unmet: (0, 0),
                last_demand: now,
                requested_sq_extra: 0,
            })
        });
        let (unmet, at) = book.unmet;
        let unmet = if now.saturating_sub(at) > UNMET_TTL_MS {
            0
        } else {
            unmet
        };
        book.unmet = (unmet.saturating_add(cost).min(capacity), now);
    }

    /// A check denied for want of rights is looked at again (a dry run) while this node's ask
    /// for it is out: the caller still asks, as a client retrying would. The ask stays out,
    /// and asks for the check's `cost` plus the check in hand others keep
    /// ([`escrow::IN_HAND`]), so those yield to it as they do to a retrying client's second
    /// deny; it does not grow further, however often the check is looked at. Nothing
    /// changes when no ask is out (a dry run alone asks for nothing).
    pub(super) fn ask_again(&mut self, cost: u64, capacity: u64, now: Millis) {
        let Some(book) = self.demand_book.as_deref_mut() else {
            return;
        };
        let (unmet, at) = book.unmet;
        if unmet == 0 || now.saturating_sub(at) > UNMET_TTL_MS {
            return;
        }
        let again = cost.saturating_add(escrow::IN_HAND).min(capacity);
        book.unmet = (unmet.max(again), now);
    }

    /// The forecast (tokens per epoch) that makes donors see this node's unmet demand as a
    /// need: `unmet` more than it used, over the horizon they forecast. Clears the unmet
    /// demand once what the node holds covers it, or once it is old.
    fn unmet_forecast(&mut self, target: &Target<'_>, ctx: &RebalanceCtx<'_>) -> u64 {
        let algo = target.algorithm;
        let now = ctx.now;
        let Some(book) = self.demand_book.as_deref_mut() else {
            return 0;
        };
        let (unmet, at) = book.unmet;
        if unmet == 0 {
            return 0;
        }
        let covered = algo.rights_per_epoch() && {
            let e = algo.epoch(now);
            let slot = self.crdt.slot(e);
            let base = target
                .static_share(ctx.me, ctx.replicas)
                .saturating_add(inherited(target, slot, ctx.me, algo.epoch_start(e)));
            let held = slot.map_or(base, |s| holdings(base, &s.transfers, ctx.me));
            let used = slot
                .and_then(|s| s.tallies.get(ctx.me))
                .map_or(0, Tally::net);
            held.saturating_sub(used) >= unmet
        };
        if covered || now.saturating_sub(at) > UNMET_TTL_MS {
            book.unmet = (0, 0);
            return 0;
        }
        let len = algo.epoch_len(now).max(1);
        let ahead = len.clamp(1, PRESS_MS);
        (u128::from(unmet) * u128::from(len)).div_ceil(u128::from(ahead)) as u64
    }
}
