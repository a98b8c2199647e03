//! Strict mode's rebalancing: moving spare rights toward demand.
//!
//! Rights are only ever given by their holder (a donor increments its own row of the transfer
//! matrix), never more than it holds beyond what it has spent, so no right is spent twice and
//! the global limit holds whatever the network does. What this module decides is *where*
//! spare rights go, and when:
//!
//! * Inside a region, a node that is not the key's owner gives everything it does not use to
//!   the owner, so the region's rights pool where its demand lands.
//! * Across regions, a node with spare rights gives to nodes whose forecast demand exceeds what
//!   they hold — for the current epoch as soon as the demand is seen, and for the next epoch
//!   ahead of time, during the current one. Each donor gives its proportional part of every
//!   need (its spare over all donors' spare) so that several donors do not all fill the same
//!   need.
//! * What is in flight to one peer (given but not yet acknowledged in the peer's demand
//!   register) is capped, so a link cut mid-transfer strands a bounded amount.
//!
//! Donors keep what their own forecast says they need, plus a margin; the forecast has a long
//! memory so noise does not give rights away (see [`crate::forecast`]).
//!
//! The escrow works on a key's replicated state ([`KeyCrdt`]) only: it is handed the node's
//! own forecast, writes this node's demand register and rows, and reports what it wrote
//! (`Gifts`) so that the key's state can send it. [`crate::KeyState::rebalance`] is the
//! public entry point.

use crate::crdt::{DemandReg, KeyCrdt, TransferMatrix};
use crate::decision::ClusterView;
use crate::replica::{NodeIdx, ReplicaSet};
use crate::rights::{NANO, holdings, sub_bucket_level, write_level};
use crate::rule::{Algorithm, Target};
use crate::time::Millis;

/// How far ahead a node reserves rights for its own forecast demand. Windows shorter than
/// this are covered whole; in longer ones rights keep flowing toward demand as it comes.
pub const HORIZON_MS: Millis = 5_000;

/// Extra demand a node keeps for itself above its forecast, in percent.
const MARGIN_PERCENT: u64 = 10;

/// What a rebalancing step needs to know beyond the key's state.
#[derive(Debug, Clone, Copy)]
pub struct RebalanceCtx<'a> {
    /// The time (ms since the Unix epoch).
    pub now: Millis,
    /// The node rebalancing.
    pub me: NodeIdx,
    /// The agreed replica set.
    pub replicas: &'a ReplicaSet,
    /// The cluster as this node sees it.
    pub view: ClusterView,
    /// The key's owner in this node's region.
    pub owner: NodeIdx,
    /// The most rights that may be in flight to any one peer.
    pub max_in_flight: u64,
}

/// One scope of rights: an epoch (fixed windows, quotas) or the continuous holdings.
#[derive(Clone, Copy)]
enum Scope {
    Epoch {
        epoch: u64,
        remaining_ms: Millis,
        len_ms: Millis,
    },
    Continuous,
}

/// What one rebalancing step gave, and which of this node's entries it wrote: the key's
/// state sends those in its next delta.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Gifts {
    /// Rights given away, in tokens.
    pub(crate) given: u64,
    /// This node's row of an epoch's transfer matrix grew (fixed windows and quotas).
    pub(crate) epoch_transfers: bool,
    /// This node's row of the continuous holdings grew (sliding windows and token buckets).
    pub(crate) holdings: bool,
    /// This node's sub-bucket register was re-anchored before its capacity shrank.
    pub(crate) bucket: bool,
}

/// Writes this node's demand register: its `forecast` (tokens per epoch; 0 unless it owns
/// the key in its region) and the rights it has seen transferred to it, which donors read to
/// bound what is still in flight towards it. Returns whether the register was written.
///
/// Nothing is written while the register would say what its absence says (no demand,
/// nothing received): replicas that only merged a key do not gossip a register for it.
pub(crate) fn publish_demand(
    crdt: &mut KeyCrdt,
    algo: &Algorithm,
    me: NodeIdx,
    now: Millis,
    forecast: u64,
) -> bool {
    let received = match algo.rights_per_epoch() {
        true => crdt
            .slot(algo.epoch(now))
            .map_or(0, |s| s.transfers.received_by(me)),
        false => crdt.holdings.received_by(me),
    };
    let published = crdt.demand.get(me).copied().unwrap_or_default();
    if published.forecast == forecast && published.received == received {
        return false;
    }
    *crdt.demand.entry(me) = DemandReg {
        seq: published.seq + 1,
        forecast,
        received,
    };
    true
}

/// Strict mode: gives this node's spare rights toward demand, in every scope the algorithm
/// holds rights in (the current and the next epoch, or the continuous holdings). Only this
/// node's own rows are written, and never more than it holds beyond what it needs.
pub(crate) fn give_spare(crdt: &mut KeyCrdt, target: &Target<'_>, ctx: &RebalanceCtx<'_>) -> Gifts {
    let algo = *target.algorithm;
    let now = ctx.now;
    let e = algo.epoch(now);
    let epoch_len = algo.epoch_len(now);
    let split = match target.split {
        Some(s) => s.to_vec(),
        None => ctx.replicas.split(algo.capacity()),
    };
    let scopes: Vec<Scope> = if algo.rights_per_epoch() {
        let end = algo.epoch_end(e);
        vec![
            Scope::Epoch {
                epoch: e,
                remaining_ms: end - now,
                len_ms: epoch_len,
            },
            Scope::Epoch {
                epoch: e + 1,
                remaining_ms: algo.epoch_len(end),
                len_ms: algo.epoch_len(end),
            },
        ]
    } else {
        vec![Scope::Continuous]
    };
    let mut gifts = Gifts::default();
    for scope in scopes {
        rebalance_scope(crdt, target, &algo, &split, scope, ctx, &mut gifts);
    }
    gifts
}

/// Gives spare rights of one scope, adding what it gave and wrote to `gifts`.
fn rebalance_scope(
    crdt: &mut KeyCrdt,
    target: &Target<'_>,
    algo: &Algorithm,
    split: &[u64],
    scope: Scope,
    ctx: &RebalanceCtx<'_>,
    gifts: &mut Gifts,
) {
    let replicas = ctx.replicas;
    let me = ctx.me;
    // What every node holds and needs, as far as this node knows.
    let n = replicas.len();
    let mut held = vec![0u64; n];
    let mut need = vec![0u64; n];
    let mut received_seen = vec![0u64; n];
    let matrix = matrix(crdt, scope).cloned().unwrap_or_default();
    for node in replicas.nodes() {
        let i = usize::from(node.0);
        held[i] = holdings(split.get(i).copied().unwrap_or(0), &matrix, node);
        let reg = crdt.demand.get(node).copied().unwrap_or_default();
        received_seen[i] = reg.received;
        need[i] = need_of(crdt, algo, node, reg.forecast, scope, ctx.now);
    }
    let mi = usize::from(me.0);
    let spare_of = |i: usize| held[i].saturating_sub(need[i]);
    let my_spare = spare_of(mi);
    if my_spare == 0 {
        return;
    }
    let in_flight_ok = |to: NodeIdx| {
        let sent = matrix.received_by(to);
        sent.saturating_sub(received_seen[usize::from(to.0)]) < ctx.max_in_flight
    };
    let room = |to: NodeIdx| {
        ctx.max_in_flight.saturating_sub(
            matrix
                .received_by(to)
                .saturating_sub(received_seen[usize::from(to.0)]),
        )
    };
    let mut plan: Vec<(NodeIdx, u64)> = Vec::new();
    if ctx.owner != me {
        // A region-mate of the owner: everything spare goes to the owner.
        if !ctx.view.acting_alone && in_flight_ok(ctx.owner) {
            plan.push((ctx.owner, my_spare.min(room(ctx.owner))));
        }
    } else {
        let reachable =
            |node: NodeIdx| node != me && !ctx.view.unreachable.contains(replicas.region_of(node));
        let wants: Vec<(NodeIdx, u64)> = replicas
            .nodes()
            .filter(|&m| reachable(m))
            .map(|m| {
                (
                    m,
                    need[usize::from(m.0)].saturating_sub(held[usize::from(m.0)]),
                )
            })
            .filter(|&(_, w)| w > 0)
            .collect();
        let total_want: u64 = wants.iter().map(|w| w.1).sum();
        if total_want == 0 {
            return;
        }
        let total_spare: u64 = (0..n).map(spare_of).sum::<u64>().max(my_spare);
        // My part of the needs, but never more than I can spare.
        let mine = (u128::from(total_want) * u128::from(my_spare)).div_ceil(u128::from(total_spare))
            as u64;
        let budget = mine.min(my_spare);
        for (m, want) in wants {
            if !in_flight_ok(m) {
                continue;
            }
            let part =
                (u128::from(budget) * u128::from(want)).div_ceil(u128::from(total_want)) as u64;
            plan.push((m, part.min(want).min(room(m))));
        }
    }
    let mut left = my_spare;
    for (to, units) in plan {
        let units = units.min(left);
        if units == 0 {
            continue;
        }
        give(crdt, target, scope, to, units, ctx, gifts);
        left -= units;
        gifts.given += units;
    }
}

/// What `node` needs in `scope`, from its forecast (tokens per epoch) and what it used.
fn need_of(
    crdt: &KeyCrdt,
    algo: &Algorithm,
    node: NodeIdx,
    forecast: u64,
    scope: Scope,
    now: Millis,
) -> u64 {
    let with_margin = |x: u64| x + (x * MARGIN_PERCENT).div_ceil(100);
    match (scope, *algo) {
        (
            Scope::Epoch {
                epoch,
                remaining_ms,
                len_ms,
            },
            _,
        ) => {
            let used = crdt
                .slot(epoch)
                .and_then(|s| s.tallies.get(node))
                .map_or(0, |t| t.net());
            // Demand is forecast over at most the horizon: rights can still move later,
            // and a long window (a day's quota) must not keep a burst's rate for hours.
            let ahead = remaining_ms.min(HORIZON_MS);
            let rest = (u128::from(forecast) * u128::from(ahead))
                .div_ceil(u128::from(len_ms.max(1))) as u64;
            used + with_margin(rest)
        }
        (Scope::Continuous, Algorithm::SlidingWindow { window_ms, .. }) => {
            // Weighted usage must stay covered; beyond it, a window's worth of demand.
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
            weighted.max(with_margin(ahead))
        }
        (Scope::Continuous, Algorithm::TokenBucket { rate, burst, .. }) => {
            // Units whose refill covers the forecast demand per refill period.
            let units = (u128::from(with_margin(forecast)) * u128::from(burst))
                .div_ceil(u128::from(rate)) as u64;
            units.min(burst)
        }
        (Scope::Continuous, _) => with_margin(forecast),
    }
}

/// The transfer matrix of `scope`, if the key holds it.
fn matrix(crdt: &KeyCrdt, scope: Scope) -> Option<&TransferMatrix> {
    match scope {
        Scope::Epoch { epoch, .. } => crdt.slot(epoch).map(|s| &s.transfers),
        Scope::Continuous => Some(&crdt.holdings),
    }
}

/// Records a gift in this node's row. A token bucket first re-anchors its level at the
/// old rate and clips it to the smaller capacity, so that no refill is counted at a rate
/// the node no longer has and no clipped token comes back later.
fn give(
    crdt: &mut KeyCrdt,
    target: &Target<'_>,
    scope: Scope,
    to: NodeIdx,
    units: u64,
    ctx: &RebalanceCtx<'_>,
    gifts: &mut Gifts,
) {
    match scope {
        Scope::Epoch { epoch, .. } => {
            crdt.slot_mut(epoch).transfers.give(ctx.me, to, units);
            gifts.epoch_transfers = true;
        }
        Scope::Continuous => {
            if let Algorithm::TokenBucket {
                rate,
                per_ms,
                burst,
            } = *target.algorithm
            {
                let base = target
                    .split
                    .and_then(|s| s.get(usize::from(ctx.me.0)).copied());
                let base = base.unwrap_or_else(|| ctx.replicas.split(burst)[usize::from(ctx.me.0)]);
                let units_before = holdings(base, &crdt.holdings, ctx.me);
                let level = sub_bucket_level(
                    crdt.buckets.get(ctx.me),
                    base,
                    units_before,
                    (rate, per_ms, burst),
                    ctx.now,
                );
                let cap_after = i128::from(units_before - units.min(units_before)) * NANO;
                crdt.holdings.give(ctx.me, to, units);
                write_level(crdt.buckets.entry(ctx.me), level.min(cap_after), ctx.now);
                gifts.bucket = true;
            } else {
                crdt.holdings.give(ctx.me, to, units);
            }
            gifts.holdings = true;
        }
    }
}
