//! What a decision costs the nodes that merge it (issue #18): every node merges every entry a
//! node writes, so a write that no node's rebalancing acts on, and a rebalance that a merge
//! cannot change, are work for the whole cluster and nothing else.
//!
//! * A merge says whether it changed what rebalancing reads ([`Merged::moves_rights`]): a
//!   token bucket's consumption elsewhere does not; a fixed window's does (a node's need
//!   counts what it used), as do demand registers and transfers.
//! * An owner whose need stays well inside what it holds does not republish its forecast at
//!   every wobble of a low, noisy demand; once its need nears its holdings, every change is
//!   published as before.

mod common;

use common::{Listed, ctx, rebalance_ctx, two_regions};
use levee_core::rule::RuleSpec;
use levee_core::{KeyState, Merged, NodeIdx, RuleMode};

const START: u64 = 1_700_000_000_000;

/// What node 1 saw over `seconds` of a low, noisy demand at node 0 (0 to 3 checks an
/// interval, about 1.5 on average; three intervals in four have checks), node 0 rebalancing
/// and sending its delta at every 20 ms interval it is listed for (an interval with a check
/// that was not quiet).
struct Seen {
    /// Deltas node 0 sent.
    deltas: usize,
    /// Of them, those carrying node 0's demand register.
    demand_writes: usize,
    /// Merges at node 1 that moved what its rebalancing reads.
    moving_merges: usize,
}

fn noisy_owner(spec: RuleSpec, seconds: u64) -> Seen {
    let replicas = two_regions();
    let mut rule = spec.validate().unwrap();
    rule.bind(&replicas);
    let target = rule.target(None, 1).unwrap();
    let (mut owner, mut other) = (KeyState::new(), KeyState::new());
    let mut seen = Seen {
        deltas: 0,
        demand_writes: 0,
        moving_merges: 0,
    };
    let pattern = [1u64, 3, 0, 2, 1, 2, 0, 3];
    let mut now = START;
    let mut listed = Listed::default();
    for i in 0..(seconds * 50) as usize {
        // Listed as a node lists a key (`KeyState::take_listing`).
        for _ in 0..pattern[i % pattern.len()] {
            owner.decide(
                &target,
                RuleMode::Enforce,
                1,
                false,
                &ctx(&replicas, now, 0),
            );
            listed.note(owner.take_listing());
        }
        if !listed.interval_ends(i) {
            now += 20;
            continue;
        }
        let rctx = rebalance_ctx(&replicas, now, 0, rule.algorithm.capacity() / 2);
        owner.rebalance(&target, &rctx);
        if let Some(delta) = owner.take_delta(NodeIdx(0)) {
            seen.deltas += 1;
            seen.demand_writes += usize::from(delta.demand.get(NodeIdx(0)).is_some());
            let m: Merged = other
                .merge_noting(&delta, &target, &ctx(&replicas, now, 1))
                .unwrap();
            seen.moving_merges += usize::from(m.moves_rights);
        }
        now += 20;
    }
    seen
}

/// A token bucket far above its demand (75 a second against 1,000,000): node 0 decides at
/// three intervals in four, but its bucket stays full, so after its first forecast its
/// decisions write nothing its peers need (`state/quiet.rs`): it sends a handful of deltas in
/// 10 s, not one an interval, and of what the other region merges nothing moves rights.
#[test]
fn a_token_bucket_used_far_below_its_holdings_moves_no_rights_at_its_peers() {
    let seen = noisy_owner(RuleSpec::token_bucket("r", 1_000_000, 1_000, 1_000_000), 10);
    assert!(
        (1..=10).contains(&seen.deltas),
        "{} deltas in 10 s (a full bucket's decisions are not sent)",
        seen.deltas
    );
    assert!(
        seen.demand_writes <= 5 && seen.moving_merges <= 5,
        "{} of {} deltas carried the owner's forecast, {} merges moved rights",
        seen.demand_writes,
        seen.deltas,
        seen.moving_merges
    );
}

/// The same demand against a bucket it nearly fills (burst 120, so the owner holds 60 units
/// and needs about 80): the owner's forecast matters to its donor, and every change of it is
/// published and merged as moving rights.
#[test]
fn a_forecast_near_the_owners_holdings_is_published_at_every_change() {
    let seen = noisy_owner(RuleSpec::token_bucket("r", 120, 1_000, 120), 10);
    assert!(
        seen.demand_writes >= 20 && seen.moving_merges >= seen.demand_writes,
        "{} of {} deltas carried the owner's forecast, {} merges moved rights",
        seen.demand_writes,
        seen.deltas,
        seen.moving_merges
    );
}

/// A fixed window's need counts what a node used: a peer's tallies move rights.
#[test]
fn a_fixed_windows_consumption_moves_rights_at_its_peers() {
    let seen = noisy_owner(RuleSpec::fixed_window("r", 1_000_000, 1_000), 2);
    assert!(seen.deltas >= 70, "{} deltas", seen.deltas);
    assert_eq!(seen.moving_merges, seen.deltas);
}
