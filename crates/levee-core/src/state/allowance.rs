//! Optimistic mode's budget between two syncs: what the node assumes the cluster has used,
//! and how much of what was left at the last sync it may still take.
//!
//! Sliding windows and token buckets take, between two syncs, at most the region's share of
//! what was left at the last sync (the [`Allowance`]); fixed windows and quotas admit within
//! their claims instead (see `claim`), but count global usage the same way.

use crate::decision::DecideCtx;
use crate::replica::NodeIdx;
use crate::rule::Target;

/// Optimistic mode's per-sync allowance.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Allowance {
    pub(super) sync_gen: u64,
    pub(super) epoch: u64,
    /// What was left globally at the last sync (tokens, or nanotokens for a token bucket).
    pub(super) left: i128,
    /// What this node has taken since (same unit).
    pub(super) taken: i128,
    pub(super) valid: bool,
}

impl Allowance {
    /// The allowance in force at sync `sync_gen` in `epoch`: the one kept (`kept`) if it was
    /// taken at the same sync and in the same epoch, else a fresh one starting from what is
    /// left now (an allowance resets at every sync and every epoch).
    #[inline]
    pub(super) fn in_force(
        kept: Option<Allowance>,
        left_now: i128,
        epoch: u64,
        sync_gen: u64,
    ) -> Allowance {
        let a = kept.unwrap_or_default();
        if a.valid && a.sync_gen == sync_gen && a.epoch == epoch {
            a
        } else {
            Allowance {
                sync_gen,
                epoch,
                left: left_now.max(0),
                taken: 0,
                valid: true,
            }
        }
    }
}

/// Optimistic mode: global usage (scaled by `scale`), where every unreachable region counts
/// as having consumed `max(last known, its full share)`.
pub(super) fn assumed_usage(
    ctx: &DecideCtx<'_>,
    target: &Target<'_>,
    used_of: impl Fn(NodeIdx) -> u128,
    scale: u128,
) -> u128 {
    let replicas = ctx.replicas;
    if ctx.view.unreachable.is_empty() {
        return replicas.nodes().map(&used_of).sum();
    }
    let split = target.static_split(replicas);
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
pub(super) fn allowance_room(a: &Allowance, full: impl Into<i128>, ctx: &DecideCtx<'_>) -> i128 {
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
