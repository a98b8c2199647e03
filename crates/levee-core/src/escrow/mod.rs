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
//! * In a window longer than [`HORIZON_MS`] (a minute, an hour, a day's quota) a region's
//!   static share is a *reserve*: forecast demand elsewhere gets only what donors hold beyond
//!   their region's share; a node that will run out within [`PRESS_MS`] (or that denied a
//!   check and asked, see `KeyState::rebalance`) *presses* and gets surplus first, then
//!   reserves, sized to what it needs over `PRESS_MS`; and rights a region holds beyond its
//!   share once its demand has paused go back to the regions below theirs (a lease that ends
//!   with the borrower's demand). So a burst at one region no longer sweeps every other
//!   region's rights away from demand that starts there later.
//! * In such a window, the node each region's checks land at keeps one check in hand once it
//!   has admitted in the window (`keep_one_in_hand`), so the window's last rights spread one
//!   to each region that asks instead of pooling at the last to deny; a check in hand yields
//!   to an ask that persists (a client retrying) or asks for more than one token.
//!
//! Donors keep what their own forecast says they need, plus a margin; the forecast has a long
//! memory so noise does not give rights away (see [`crate::forecast`]).
//!
//! Clocks differ by up to [`MAX_CLOCK_SKEW_MS`], and a window's rights serve only while it
//! runs on the clock of the node that holds them. So a donor judges a peer's need by the
//! peer's clock where it knows it ([`PeerClock`], estimated from batch timestamps): rights of
//! a window that will have ended on the peer's clock when they arrive are not given to it,
//! and for [`MAX_CLOCK_SKEW_MS`] after a window ends here, what this node did not use of it
//! goes to peers still in it.
//!
//! The escrow works on a key's replicated state ([`KeyCrdt`]) only: it is handed the node's
//! own forecast, writes this node's demand register and rows, and reports what it wrote
//! (`Gifts`) so that the key's state can send it. [`crate::KeyState::rebalance`] is the
//! public entry point.

mod need;
mod scope;

use std::borrow::Cow;

pub(crate) use need::need_of;
use need::with_margin;
use scope::just_ended;
pub(crate) use scope::{Scope, matrix, scopes};

use crate::crdt::{KeyCrdt, TransferMatrix};
use crate::decision::ClusterView;
use crate::replica::{NodeIdx, ReplicaSet};
use crate::rights::{NANO, holdings, own_sub_bucket, tokens_of, write_level};
use crate::rule::{Algorithm, Target};
use crate::time::Millis;
use smallvec::{SmallVec, smallvec};

/// A figure per node, inline for clusters of up to 8 nodes: rebalancing reads several for
/// every key it visits, and a heap allocation each cost more than the arithmetic.
type PerNode<T> = SmallVec<[T; 8]>;

/// How far ahead a node reserves rights for its own forecast demand. Windows shorter than
/// this are covered whole; in longer ones rights keep flowing toward demand as it comes.
pub const HORIZON_MS: Millis = 5_000;

/// In a long window (longer than [`HORIZON_MS`]), how far ahead a node's demand *presses*:
/// a node that will run out within this at its forecast rate gets rights from anyone's spare
/// (reserves included), sized to cover this much, and a donor gives to it all it holds beyond
/// its own demand over this much. About a round trip and a few gossip intervals, the time a
/// refill takes to arrive: chosen on the simulator's demand set (`levee-sim --set demand`),
/// where 500 ms let a fast client's region take the next region's reserve (back-to-back p1
/// 0.81), 200 ms gave 0.97 and 100 ms 0.94 (docs/accuracy.md).
pub const PRESS_MS: Millis = 200;

/// In a long window's current epoch, what a node that has admitted in it keeps beyond what it
/// used, and presses for when it lacks it: one check's token in hand (see `keep_one_in_hand`).
pub(crate) const IN_HAND: u64 = 1;

/// How far apart two nodes' clocks may be (DESIGN.md: `max_clock_skew`, 500 ms). A window
/// that has ended on this node's clock may still be running on a peer's for this long, so
/// rights of it this node did not use can still serve that peer's requests.
pub const MAX_CLOCK_SKEW_MS: Millis = 500;

/// What a rebalancing step needs to know beyond the key's state.
#[derive(Clone, Copy)]
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
    /// When this node owns the key because its owner (when every node is up) is
    /// unreachable: that node. The demand it last published is this node's to serve now, so
    /// this node publishes at least that forecast and rights flow to it at once, however low
    /// the load — without waiting for its own forecast to learn what the owner knew.
    pub inherit_from: Option<NodeIdx>,
    /// Whether this node hears node `n` (within `suspect_after`): rights go only to nodes it
    /// hears. (A node thawed after a long pause hears nobody at first: it must not give what
    /// it held under a list it has not yet heard replaced, to nodes whose shares have grown.)
    pub hears: &'a dyn Fn(NodeIdx) -> bool,
    /// How node `n`'s clock stands against this node's, if known ([`PeerClock`]): a peer
    /// ahead leaves a window earlier, and rights of it that reach it later serve nothing; a
    /// peer behind still admits in a window that ended here.
    pub clock_of: &'a dyn Fn(NodeIdx) -> Option<PeerClock>,
    /// When this node's process started (its clock). What it consumed of a window that
    /// began earlier may have been lost with a crash, so once such a window has ended here
    /// it gives none of it (it would give rights its lost requests used).
    pub started: Millis,
    /// Whether this node's own demand counts when it is not the key's owner
    /// (`cluster.local_first`: such a node decides the checks it holds rights for, so it
    /// keeps what its forecast needs and gives the owner only the rest). Otherwise every
    /// check of the key goes to its owner, and a region-mate's forecast is zero.
    pub own_demand: bool,
}

/// A peer's clock against this node's, as estimated from the times its messages carry
/// (`levee-cluster` estimates it from its batches).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerClock {
    /// The peer's clock minus this node's, in ms, within ±[`MAX_CLOCK_SKEW_MS`].
    pub offset_ms: i64,
    /// How long a message takes to reach it, in ms.
    pub one_way_ms: Millis,
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

/// Strict mode: gives this node's spare rights toward demand, in every scope the algorithm
/// holds rights in (the current and the next epoch, or the continuous holdings). Only this
/// node's own rows are written, and never more than it holds beyond what its own `forecast`
/// (tokens per epoch) needs.
pub(crate) fn give_spare(
    crdt: &mut KeyCrdt,
    target: &Target<'_>,
    ctx: &RebalanceCtx<'_>,
    forecast: u64,
) -> Gifts {
    let algo = *target.algorithm;
    let split = split_of(target, ctx.replicas);
    let mut gifts = Gifts::default();
    for scope in scopes(&algo, ctx.now).into_iter().chain(just_ended(
        &algo,
        ctx.now,
        target.grown_from.max(ctx.started),
    )) {
        rebalance_scope(
            crdt, target, &algo, &split, scope, ctx, forecast, &mut gifts,
        );
    }
    gifts
}

/// A token bucket's units of capacity `me` can give: those its level holds a whole token
/// for, each given with its token (the receiver adds them to its level, `KeyState::merge`).
/// An empty unit stays until it refills. Other algorithms: no bound.
fn full_units(crdt: &KeyCrdt, target: &Target<'_>, ctx: &RebalanceCtx<'_>) -> u64 {
    match own_sub_bucket(crdt, target, ctx.me, ctx.replicas, ctx.now) {
        Some((level, units)) => units.min(tokens_of(level)),
        None => u64::MAX,
    }
}

/// What `me` holds of a key beyond what it used, over every scope it holds rights in (the
/// current and the next epoch, or the continuous holdings): what a leaving node still has
/// to give away. A token bucket's holdings are its units of capacity, used or not.
pub(crate) fn unspent(
    crdt: &KeyCrdt,
    target: &Target<'_>,
    replicas: &ReplicaSet,
    me: NodeIdx,
    now: Millis,
) -> u64 {
    let algo = *target.algorithm;
    let split = split_of(target, replicas);
    let base = split.get(usize::from(me.0)).copied().unwrap_or(0);
    scopes(&algo, now)
        .into_iter()
        .map(|scope| {
            let matrix = matrix(crdt, scope).cloned().unwrap_or_default();
            let base = base.saturating_add(scope.inherited(crdt, target, &algo, me));
            let held = holdings(base, &matrix, me);
            held.saturating_sub(need_of(
                crdt,
                &algo,
                me,
                0,
                scope,
                now,
                HORIZON_MS,
                replicas.len(),
            ))
        })
        .fold(0u64, u64::saturating_add)
}

/// The static shares of a key's capacity: the target's bound split (borrowed), or the list's.
fn split_of<'t>(target: &Target<'t>, replicas: &ReplicaSet) -> Cow<'t, [u64]> {
    match target.split {
        Some(s) => Cow::Borrowed(s),
        None => Cow::Owned(replicas.split(target.algorithm.capacity())),
    }
}

/// Gives spare rights of one scope, adding what it gave and wrote to `gifts`. Other nodes'
/// needs come from their published forecasts, this node's from its own `forecast`.
#[allow(clippy::too_many_arguments)]
fn rebalance_scope(
    crdt: &mut KeyCrdt,
    target: &Target<'_>,
    algo: &Algorithm,
    split: &[u64],
    scope: Scope,
    ctx: &RebalanceCtx<'_>,
    forecast: u64,
    gifts: &mut Gifts,
) {
    let replicas = ctx.replicas;
    let me = ctx.me;
    let mi = usize::from(me.0);
    let (long, current) = match scope {
        Scope::Epoch { epoch, len_ms, .. } => (len_ms > HORIZON_MS, epoch == algo.epoch(ctx.now)),
        Scope::Continuous => (false, false),
    };
    let empty = TransferMatrix::default();
    let matrix = matrix(crdt, scope).unwrap_or(&empty);
    // What a node can give to demand that presses: beyond what it needs over the horizon, or
    // in a long window beyond what it needs soon (a request waiting now comes before a
    // forecast's later ones, as at a central counter). A node with nothing spare gives
    // nothing: known before anything is read of the others (most keys, at a node that gave
    // its share to their owner).
    // A node's static share, and what it takes over of removed nodes as their heir: the
    // base its transfers add to and take from (it may give inherited rights on).
    let base_of = |node: NodeIdx| {
        split
            .get(usize::from(node.0))
            .copied()
            .unwrap_or(0)
            .saturating_add(scope.inherited(crdt, target, algo, node))
    };
    let n = replicas.len();
    let my_held = holdings(base_of(me), matrix, me);
    let horizon = if long { PRESS_MS } else { HORIZON_MS };
    if my_held <= need_of(crdt, algo, me, forecast, scope, ctx.now, horizon, n) {
        return;
    }
    // What every node holds and needs, as far as this node knows.
    let mut held: PerNode<u64> = smallvec![0; n];
    let mut need: PerNode<u64> = smallvec![0; n];
    let mut need_soon: PerNode<u64> = smallvec![0; n];
    let mut received_seen: PerNode<u64> = smallvec![0; n];
    for node in replicas.nodes() {
        let i = usize::from(node.0);
        held[i] = holdings(base_of(node), matrix, node);
        let reg = crdt.demand.get(node).copied().unwrap_or_default();
        received_seen[i] = reg.received;
        let f = if node == ctx.me {
            forecast
        } else {
            reg.forecast
        };
        // The epoch as the peer's clock runs it, when rights given now reach it.
        let theirs = if node == ctx.me {
            scope
        } else {
            scope.for_peer(algo, ctx.now, (ctx.clock_of)(node))
        };
        need[i] = need_of(crdt, algo, node, f, theirs, ctx.now, HORIZON_MS, n);
        need_soon[i] = need_of(crdt, algo, node, f, theirs, ctx.now, PRESS_MS, n);
    }
    if long && current && !asked_persistently(&held, &need_soon) {
        keep_one_in_hand(crdt, scope, ctx, &held, &mut need_soon);
    }
    let spare_of = |i: usize| held[i].saturating_sub(if long { need_soon[i] } else { need[i] });
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
    let mut plan: PerNode<(NodeIdx, u64)> = SmallVec::new();
    if ctx.owner != me {
        // A region-mate of the owner: everything spare goes to the owner.
        if !ctx.view.acting_alone && (ctx.hears)(ctx.owner) && in_flight_ok(ctx.owner) {
            plan.push((ctx.owner, my_spare.min(room(ctx.owner))));
        }
    } else {
        // In a long window a region's static share stays at home (a reserve) until demand
        // elsewhere presses: a node about to run out (or that denied and asked) gets rights
        // from anyone's spare; a node whose forecast merely exceeds what it holds gets only
        // what donors hold beyond their region's share. So a burst in one region does not
        // sweep the others' rights away from demand that comes later.
        let reserve_of = |i: usize| {
            if !long {
                return 0;
            }
            let region = replicas.region_of(NodeIdx(i as u16));
            replicas.region_nodes(region).iter().fold(0u64, |s, m| {
                s.saturating_add(split.get(usize::from(m.0)).copied().unwrap_or(0))
            })
        };
        // Long windows: a node that will run out within PRESS_MS presses.
        let pressing = |i: usize| !long || (current && held[i] < need_soon[i]);
        let reachable = |node: NodeIdx| {
            node != me
                && !ctx.view.unreachable.contains(replicas.region_of(node))
                && (ctx.hears)(node)
        };
        let wants: PerNode<(NodeIdx, u64, bool)> = replicas
            .nodes()
            .filter(|&m| reachable(m))
            .map(|m| {
                let i = usize::from(m.0);
                let p = pressing(i);
                let target = if long && p { need_soon[i] } else { need[i] };
                (m, target.saturating_sub(held[i]), p)
            })
            .filter(|&(_, w, _)| w > 0)
            .collect();
        let total_of = |p: bool| {
            wants
                .iter()
                .filter(|w| w.2 == p)
                .fold(0u64, |s, w| s.saturating_add(w.1))
        };
        let (total_pressing, total_spec) = (total_of(true), total_of(false));
        let returns = long && current;
        if total_pressing == 0 && total_spec == 0 && !returns {
            return;
        }
        // My part of the needs (my spare over all donors' spare), but never more than I can
        // spare.
        let part_of = |total: u64, mine: u64, all: u64| -> u64 {
            let all = all.max(mine).max(1);
            ((u128::from(total) * u128::from(mine)).div_ceil(u128::from(all)) as u64).min(mine)
        };
        // What donors hold beyond their own horizon's demand and, in a long window, beyond
        // their region's share: their surplus. Forecast demand that does not press gets only
        // surplus; demand that presses gets surplus first, then reserves. Beyond its share a
        // node also keeps a cushion above what it used (a tenth of its share, at least three
        // tokens): sporadic demand above a region's share, which makes no forecast, must not
        // give back (or on) the rights it just asked for its next requests. (The simulator's
        // sporadic scenario, mean / p1: a cushion of at least 1 0.9622 / 0.8961, 2 0.9712 /
        // 0.9171, 3 0.9734 / 0.9223, 5 0.9717 / 0.9119.)
        let used = |i: usize| used_in(crdt, scope, NodeIdx(i as u16));
        let keep_of = |i: usize| {
            let reserve = reserve_of(i);
            if reserve == 0 {
                return need[i];
            }
            let cushion = (reserve / 10).max(3);
            need[i].max(reserve).max(used(i).saturating_add(cushion))
        };
        let surplus_of = |i: usize| spare_of(i).min(held[i].saturating_sub(keep_of(i)));
        let all_surplus = (0..n).fold(0u64, |s, i| s.saturating_add(surplus_of(i)));
        let all_reserve = (0..n).fold(0u64, |s, i| s.saturating_add(spare_of(i) - surplus_of(i)));
        let my_surplus = surplus_of(mi);
        let budget_pressing = if total_pressing <= all_surplus {
            part_of(total_pressing, my_surplus, all_surplus)
        } else {
            my_surplus
                + part_of(
                    total_pressing - all_surplus,
                    my_spare - my_surplus,
                    all_reserve,
                )
        };
        let budget_spec = part_of(total_spec, my_surplus, all_surplus)
            .min(my_surplus.saturating_sub(budget_pressing));
        for (m, want, p) in wants {
            if !in_flight_ok(m) {
                continue;
            }
            let (budget, total) = if p {
                (budget_pressing, total_pressing)
            } else {
                (budget_spec, total_spec)
            };
            let part =
                (u128::from(budget) * u128::from(want)).div_ceil(u128::from(total.max(1))) as u64;
            plan.push((m, part.min(want).min(room(m))));
        }
        if returns {
            let planned = plan.iter().fold(0u64, |s, p| s.saturating_add(p.1));
            let left = my_surplus.saturating_sub(planned);
            if left > 0 {
                let homes = lent_out(replicas, &held, &reserve_of, &reachable, &plan);
                let total = homes.iter().fold(0u64, |s, h| s.saturating_add(h.1));
                let budget = part_of(total, left, all_surplus);
                for (m, deficit) in homes {
                    if !in_flight_ok(m) {
                        continue;
                    }
                    let part = (u128::from(budget) * u128::from(deficit))
                        .div_ceil(u128::from(total.max(1))) as u64;
                    plan.push((m, part.min(deficit).min(room(m))));
                }
            }
        }
    }
    let mut left = my_spare;
    if matches!(scope, Scope::Continuous) {
        left = left.min(full_units(crdt, target, ctx));
    }
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

/// One check in hand, in a long window's current epoch: the node each region's checks land at
/// (this node's region: the key's owner; another region: the node of it that holds the most,
/// where its region-mates pool their rights), once it has admitted in the window, keeps (and
/// presses for) [`IN_HAND`] token beyond what it used, even when its forecast has decayed to
/// nothing between sporadic checks. So the window's last rights spread one to each region that
/// asks rather than pooling where they were last given, and the next check anywhere finds
/// one. Region-mates that decide for themselves (`cluster.local_first`) keep none: a check
/// they cannot cover goes to the owner, and one token stranded at each of them cost the last
/// region of `back-to-back` its share. Not kept while an ask persists
/// ([`asked_persistently`]).
fn keep_one_in_hand(
    crdt: &KeyCrdt,
    scope: Scope,
    ctx: &RebalanceCtx<'_>,
    held: &[u64],
    need_soon: &mut [u64],
) {
    let replicas = ctx.replicas;
    let mine = replicas.region_of(ctx.me);
    for region in replicas.regions() {
        let pool = if region == mine {
            Some(ctx.owner)
        } else {
            replicas
                .region_nodes(region)
                .iter()
                .copied()
                .max_by_key(|&m| (held[usize::from(m.0)], std::cmp::Reverse(m.0)))
        };
        let Some(pool) = pool else {
            continue;
        };
        let used = used_in(crdt, scope, pool);
        if used > 0 {
            let i = usize::from(pool.0);
            need_soon[i] = need_soon[i].max(used.saturating_add(IN_HAND));
        }
    }
}

/// Whether some node asks for more than one check's token in hand would leave it short of:
/// it runs short within [`PRESS_MS`] by more than a single deny of one token asks for (that
/// token with the margin `need_of` adds: 2 over what the node used). A deny asks for its
/// shortfall and keeps asking while denials repeat within `UNMET_TTL_MS`, so a client that
/// retries after a short `retry_after_ms` asks for 2, then 3, …; then checks in hand yield,
/// and the window's last rights go to the caller who keeps asking, as a central counter's
/// would. Without this, the window's last rights kept in hand at two regions denied a
/// retrying client at the third for good (`tests/moving_demand.rs`).
fn asked_persistently(held: &[u64], need_soon: &[u64]) -> bool {
    let one_ask = with_margin(IN_HAND);
    held.iter()
        .zip(need_soon)
        .any(|(&h, &n)| n.saturating_sub(h) > one_ask)
}

/// What `node` used (net of refunds) in an epoch scope; 0 in the continuous one.
fn used_in(crdt: &KeyCrdt, scope: Scope, node: NodeIdx) -> u64 {
    match scope {
        Scope::Epoch { epoch, .. } => crdt
            .slot(epoch)
            .and_then(|s| s.tallies.get(node))
            .map_or(0, |t| t.net()),
        Scope::Continuous => 0,
    }
}

/// Long windows: the regions holding less than their share (their reserve) — rights lent
/// out, to come home now that the borrower no longer needs them (a lease that ends when the
/// borrower's demand pauses). For each, the node its rights pool at (the one of the region
/// that holds the most: its key's owner, to which its region-mates gave theirs) and how much
/// the region lacks, less what `plan` already gives its nodes.
fn lent_out(
    replicas: &ReplicaSet,
    held: &[u64],
    reserve_of: &dyn Fn(usize) -> u64,
    reachable: &dyn Fn(NodeIdx) -> bool,
    plan: &[(NodeIdx, u64)],
) -> Vec<(NodeIdx, u64)> {
    let mut out = Vec::new();
    for region in replicas.regions() {
        let nodes = replicas.region_nodes(region);
        let Some(&first) = nodes.first() else {
            continue;
        };
        if !reachable(first) && nodes.iter().all(|&m| !reachable(m)) {
            continue;
        }
        let pool = nodes
            .iter()
            .fold(0u64, |s, m| s.saturating_add(held[usize::from(m.0)]));
        let coming = plan
            .iter()
            .filter(|(m, _)| replicas.region_of(*m) == region)
            .fold(0u64, |s, p| s.saturating_add(p.1));
        let deficit = reserve_of(usize::from(first.0)).saturating_sub(pool.saturating_add(coming));
        if deficit == 0 {
            continue;
        }
        let home = nodes
            .iter()
            .copied()
            .filter(|&m| reachable(m))
            .max_by_key(|&m| (held[usize::from(m.0)], std::cmp::Reverse(m.0)));
        if let Some(home) = home {
            out.push((home, deficit));
        }
    }
    out
}

/// Records a gift in this node's row. A token bucket's units go with their tokens: its level,
/// re-anchored at the old rate (no refill is counted at a rate the node no longer has), drops
/// by one token per unit given, and the receiver adds them when it merges the transfer
/// (`KeyState::merge`). The caller gives only units the level holds a token for.
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
            if let Some((level, units_before)) =
                own_sub_bucket(crdt, target, ctx.me, ctx.replicas, ctx.now)
            {
                // Each unit goes with its token (the caller gives only units the level holds
                // a whole token for): the level drops by as many tokens as the capacity.
                let units = units.min(units_before);
                let cap_after = i128::from(units_before - units) * NANO;
                crdt.holdings.give(ctx.me, to, units);
                let after = (level - i128::from(units) * NANO).clamp(0, cap_after);
                write_level(crdt.buckets.entry(ctx.me), after, ctx.now);
                gifts.bucket = true;
            } else {
                crdt.holdings.give(ctx.me, to, units);
            }
            gifts.holdings = true;
        }
    }
}
