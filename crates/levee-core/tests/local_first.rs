//! `cluster.local_first` in the core: a node decides a check of a key another node owns only
//! from the rights it holds (`KeyState::decide_if_held`), gives a refund back only when it
//! counted enough (`KeyState::refundable_here`), and, rebalancing with `own_demand`, keeps
//! what its own forecast needs instead of giving everything to the owner.

mod common;

use common::{ctx, rebalance_ctx, two_regions};
use levee_core::rule::RuleSpec;
use levee_core::{KeyState, NodeIdx, RebalanceCtx, RuleMode};

const WINDOW_MS: u64 = 1_000;
/// An epoch well inside the clock's range.
const E: u64 = 1_000_000;

/// One region of two nodes, `eu-1` (node 0) and `eu-2` (node 1).
fn one_region_of_two() -> levee_core::ReplicaSet {
    levee_core::ReplicaSet::new(
        &[("eu".into(), 1)],
        &["eu-1", "eu-2"]
            .iter()
            .map(|id| levee_core::ReplicaSpec {
                id: (*id).into(),
                region: "eu".into(),
                weight: None,
            })
            .collect::<Vec<_>>(),
    )
    .unwrap()
}

/// The end of a gossip interval at `at` between node 0 (the key's owner) and node 1 (its
/// region-mate): each rebalances (with `own_demand` or not), then each merges the other's
/// state.
fn interval(
    owner: &mut KeyState,
    mate: &mut KeyState,
    target: &levee_core::rule::Target<'_>,
    replicas: &levee_core::ReplicaSet,
    at: u64,
    own_demand: bool,
) {
    let m = RebalanceCtx {
        owner: NodeIdx(0),
        own_demand,
        ..rebalance_ctx(replicas, at, 1, u64::MAX)
    };
    mate.rebalance(target, &m);
    let o = RebalanceCtx {
        own_demand,
        ..rebalance_ctx(replicas, at, 0, u64::MAX)
    };
    owner.rebalance(target, &o);
    let (from_owner, from_mate) = (owner.crdt().clone(), mate.crdt().clone());
    mate.merge(&from_owner, target, &ctx(replicas, at, 1))
        .unwrap();
    owner
        .merge(&from_mate, target, &ctx(replicas, at, 0))
        .unwrap();
}

#[test]
fn a_check_is_decided_here_only_while_the_rights_held_here_admit_it() {
    let replicas = two_regions();
    let mut rule = RuleSpec::fixed_window("r", 100, WINDOW_MS)
        .validate()
        .unwrap();
    rule.bind(&replicas);
    let target = rule.target(None, 1).unwrap();
    let mut us = KeyState::new();
    let at = |i: u64| ctx(&replicas, E * WINDOW_MS + 100 + i, 1);
    // Node 1's share of the window is 50: 50 checks are decided here, the 51st is not, and
    // asking changes nothing of what was counted.
    for i in 0..50 {
        let d = us
            .decide_if_held(&target, RuleMode::Enforce, 1, &at(i))
            .unwrap_or_else(|| panic!("check {i} was not decided here"));
        assert!(d.allowed && d.would_allow);
    }
    let before = us.crdt().clone();
    assert!(
        us.decide_if_held(&target, RuleMode::Enforce, 1, &at(60))
            .is_none()
    );
    assert!(
        us.decide_if_held(&target, RuleMode::Enforce, 0, &at(61))
            .is_none(),
        "a check of cost 0 goes to the owner"
    );
    assert_eq!(
        us.crdt(),
        &before,
        "a check sent on changed the key's replicated state"
    );
    let tally = us.crdt().slot(E).unwrap().tallies.get(NodeIdx(1)).unwrap();
    assert_eq!((tally.consumed, tally.requested), (50, 50));
    // A refund of what it counted is given back here; one beyond it is not.
    let now = at(70);
    assert!(us.refundable_here(&target, 50, &now));
    assert!(!us.refundable_here(&target, 51, &now));
    us.refund(&target, 10, &now);
    assert!(us.refundable_here(&target, 40, &now));
    assert!(!us.refundable_here(&target, 41, &now));
    // A new window: nothing counted in it yet, so nothing is given back here.
    let next = ctx(&replicas, (E + 1) * WINDOW_MS + 10, 1);
    assert!(!us.refundable_here(&target, 1, &next));
}

#[test]
fn with_own_demand_a_region_mate_gets_rights_toward_its_own_demand_and_decides_it() {
    // One region, two nodes: node 0 owns the key, node 1 is asked 10 checks every gossip
    // interval; the two merge each other's state every interval.
    let replicas = one_region_of_two();
    let decided_by_the_mate = |own_demand: bool| {
        let mut rule = RuleSpec::fixed_window("r", 10_000, WINDOW_MS)
            .validate()
            .unwrap();
        rule.bind(&replicas);
        let target = rule.target(None, 1).unwrap();
        let (mut owner, mut mate) = (KeyState::new(), KeyState::new());
        let mut here = 0;
        for tick in 0..45u64 {
            let now = E * WINDOW_MS + tick * 20;
            for i in 0..10 {
                let c = ctx(&replicas, now + i, 1);
                if mate
                    .decide_if_held(&target, RuleMode::Enforce, 1, &c)
                    .is_some()
                {
                    here += 1;
                }
            }
            interval(
                &mut owner,
                &mut mate,
                &target,
                &replicas,
                now + 19,
                own_demand,
            );
        }
        // Whatever was decided where, the window never holds more than the limit.
        let used: u64 = owner
            .crdt()
            .slot(E)
            .map_or(0, |s| s.tallies.iter().map(|(_, t)| t.consumed).sum());
        assert!(used <= 10_000);
        here
    };
    let without = decided_by_the_mate(false);
    let with = decided_by_the_mate(true);
    // Without its own demand the mate gives its whole share to the owner at the first interval
    // and gets nothing back: every later check would go to the owner. With it, its forecast
    // draws rights back and it decides nearly all of its 450 checks itself.
    assert_eq!(without, 10, "without own demand");
    assert!(
        with >= 400,
        "with own demand the mate decided {with} of 450"
    );
}

/// One region, two nodes: node 0 owns a token bucket's key, node 1 (`own_demand`) is asked
/// one check a second; the two rebalance and merge each other's state every 20 ms gossip
/// interval, for 12 s. What the mate's last five decisions ask of its store: whether each was
/// decided there, the listing it asked for, and the units it held.
fn a_light_key_at_the_mate(burst: u64) -> Vec<(bool, levee_core::Listing, u64)> {
    let replicas = one_region_of_two();
    let mut rule = RuleSpec::token_bucket("b", burst, 1_000, burst)
        .validate()
        .unwrap();
    rule.bind(&replicas);
    let target = rule.target(None, 1).unwrap();
    let (mut owner, mut mate) = (KeyState::new(), KeyState::new());
    let t0 = E * WINDOW_MS;
    let mut last = Vec::new();
    for tick in 0..600u64 {
        let now = t0 + tick * 20;
        if tick % 50 == 0 {
            let c = ctx(&replicas, now, 1);
            let d = mate.decide_if_held(&target, RuleMode::Enforce, 1, &c);
            if d.is_none() {
                // Sent on: the owner decides it.
                owner.decide(
                    &target,
                    RuleMode::Enforce,
                    1,
                    false,
                    &ctx(&replicas, now, 0),
                );
            }
            // A token bucket's holdings: its units of capacity, used or not.
            let units = mate.unspent(&target, &replicas, NodeIdx(1), now);
            last.push((d.is_some(), mate.take_listing(), units));
        }
        interval(&mut owner, &mut mate, &target, &replicas, now + 19, true);
    }
    last.split_off(last.len() - 5)
}

#[test]
fn a_mate_deciding_a_light_key_of_a_large_bucket_holds_enough_to_spend_quietly() {
    // A bucket of a million: the mate keeps at least 128 units however light its demand, so
    // a decision leaves its sub-bucket within a 64th of full and is not listed (the write
    // goes with the key's next listing, `state/quiet.rs`).
    for (here, listing, units) in a_light_key_at_the_mate(1_000_000) {
        assert!(here, "a check was sent to the owner");
        assert_eq!(listing, levee_core::Listing::Quiet, "units held: {units}");
        assert!(units >= 128, "units held: {units}");
    }
    // A bucket of 1,000 (500 a node): the floor would be a real part of it, so the mate holds
    // what its refill needs, and each decision is listed and sent, as before.
    for (here, listing, units) in a_light_key_at_the_mate(1_000) {
        assert!(here, "a check was sent to the owner");
        assert_eq!(listing, levee_core::Listing::Now, "units held: {units}");
        assert!(units < 128, "units held: {units}");
    }
}
