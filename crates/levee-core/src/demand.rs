//! A node's demand register in strict mode's escrow: what it publishes of its forecast and
//! of the rights it received, which donors read ([`crate::escrow`]).

use crate::crdt::{DemandReg, KeyCrdt};
use crate::escrow::{HORIZON_MS, matrix, need_of, scopes};
use crate::replica::{NodeIdx, ReplicaSet};
use crate::rights::holdings;
use crate::rule::Target;
use crate::time::Millis;

/// Writes this node's demand register: its `forecast` (tokens per epoch; 0 unless it owns
/// the key in its region) and the rights it has seen transferred to it, which donors read to
/// bound what is still in flight towards it. Returns whether the register was written.
///
/// Nothing is written while the register would say what its absence says (no demand,
/// nothing received): replicas that only merged a key do not gossip a register for it. Nor
/// for a change of forecast that no node's rebalancing would act on ([`forecast_matters`]):
/// every node merges every register written, so a key's noise would otherwise cost the
/// whole cluster a merge at each of its owner's samples.
pub(crate) fn publish_demand(
    crdt: &mut KeyCrdt,
    target: &Target<'_>,
    replicas: &ReplicaSet,
    me: NodeIdx,
    now: Millis,
    forecast: u64,
) -> bool {
    let algo = target.algorithm;
    let received = match algo.rights_per_epoch() {
        true => crdt
            .slot(algo.epoch(now))
            .map_or(0, |s| s.transfers.received_by(me)),
        false => crdt.holdings.received_by(me),
    };
    let published = crdt.demand.get(me).copied().unwrap_or_default();
    if published.received == received
        && (published.forecast == forecast
            || !forecast_matters(
                crdt,
                target,
                replicas,
                me,
                now,
                published.forecast,
                forecast,
            ))
    {
        return false;
    }
    *crdt.demand.entry(me) = DemandReg {
        seq: published.seq.saturating_add(1),
        forecast,
        received,
    };
    true
}

/// Whether `me`'s forecast moving from `old` (published) to `new` (tokens per epoch) is worth
/// a write every node merges. It is when it could change what a node gives: when, in some
/// scope, this node's need under either forecast is more than half of what it holds (below
/// that, the node wants nothing either way, and donors see it so whichever they read). And
/// when it moved by more than a factor of two (or to or from zero): a region-mate that takes
/// the key over from this node, should it die, starts from the forecast it last published.
/// The published forecast may otherwise lag the node's own, which only this node's
/// rebalancing reads (and it reads its own).
fn forecast_matters(
    crdt: &KeyCrdt,
    target: &Target<'_>,
    replicas: &ReplicaSet,
    me: NodeIdx,
    now: Millis,
    old: u64,
    new: u64,
) -> bool {
    if new > old.saturating_mul(2) || old > new.saturating_mul(2) {
        return true;
    }
    let algo = *target.algorithm;
    let share = target.static_share(me, replicas);
    scopes(&algo, now).into_iter().any(|scope| {
        let base = share.saturating_add(scope.inherited(crdt, target, &algo, me));
        let held = matrix(crdt, scope).map_or(base, |m| holdings(base, m, me));
        let need = |f| need_of(crdt, &algo, me, f, scope, now, HORIZON_MS, replicas.len());
        need(old).max(need(new)).saturating_mul(2) > held
    })
}
