//! Optimistic mode: admission against merged global usage within per-epoch claims (fixed
//! windows) or the per-sync allowance (sliding windows, token buckets), and the conservative
//! local cap when other regions are unreachable.

use levee_core::crdt::Claim;
use levee_core::rule::AlgorithmName;
use levee_core::state::CLAIM_GRACE_MS;
use levee_core::{
    ClusterView, Consistency, DecideCtx, KeyCrdt, KeyState, NodeIdx, RegionIdx, RegionMask,
    ReplicaSet, ReplicaSpec, Rule, RuleMode, RuleSpec,
};

const T0: u64 = 1_800_000_000_000; // aligned to the minute

fn three_regions() -> ReplicaSet {
    let regions = [
        ("ap".to_owned(), 1),
        ("eu".to_owned(), 1),
        ("us".to_owned(), 1),
    ];
    let nodes: Vec<ReplicaSpec> = ["ap", "eu", "us"]
        .iter()
        .map(|r| ReplicaSpec {
            id: format!("{r}-1"),
            region: (*r).to_owned(),
            weight: None,
        })
        .collect();
    ReplicaSet::new(&regions, &nodes).unwrap()
}

fn rule(algorithm: AlgorithmName, amount: u64, replicas: &ReplicaSet) -> Rule {
    let spec = match algorithm {
        // A bucket that refills very slowly, so the test measures the burst.
        AlgorithmName::TokenBucket => RuleSpec::token_bucket("r", 1, 86_400_000, amount),
        AlgorithmName::SlidingWindow => RuleSpec::sliding_window("r", amount, 60_000),
        _ => RuleSpec::fixed_window("r", amount, 60_000),
    };
    let mut rule = spec.validate().unwrap();
    rule.bind(replicas);
    rule
}

/// A delta saying `node` consumed `amount` in the window of `T0`.
fn consumed_by(node: NodeIdx, amount: u64, rule: &Rule) -> KeyCrdt {
    let mut k = KeyCrdt::default();
    let tally = k.slot_mut(rule.algorithm.epoch(T0)).tallies.entry(node);
    tally.consumed = amount;
    tally.requested = amount;
    k
}

/// A delta holding `node`'s claim in the window of `T0`: `ceiling` at `round`, `passive` if it
/// promised not to raise in the next round.
fn claim_of(node: NodeIdx, round: u64, passive: bool, ceiling: u64, rule: &Rule) -> KeyCrdt {
    let mut k = KeyCrdt::default();
    k.claims.raise(Claim {
        epoch: rule.algorithm.epoch(T0),
        node,
        step: 2 * round + u64::from(passive),
        ceiling,
    });
    k
}

fn view(unreachable: RegionMask, sync_gen: u64) -> ClusterView {
    ClusterView {
        consistency: Consistency::Optimistic,
        unreachable,
        sync_gen,
        acting_alone: false,
        recovering: false,
    }
}

fn admit_all(key: &mut KeyState, rule: &Rule, ctx: &DecideCtx<'_>) -> u64 {
    let target = rule.target(None, 1).unwrap();
    let mut n = 0;
    while key
        .decide(&target, RuleMode::Enforce, 1, false, ctx)
        .allowed
    {
        n += 1;
        assert!(n <= 10_000, "runaway admission");
    }
    n
}

fn others_unreachable(replicas: &ReplicaSet, me: NodeIdx) -> RegionMask {
    let mine = replicas.region_of(me);
    replicas
        .regions()
        .filter(|&r| r != mine)
        .fold(RegionMask::EMPTY, RegionMask::with)
}

#[test]
fn with_every_other_region_cut_off_a_region_admits_at_most_its_share() {
    let replicas = three_regions();
    for algorithm in [
        AlgorithmName::FixedWindow,
        AlgorithmName::SlidingWindow,
        AlgorithmName::TokenBucket,
    ] {
        let rule = rule(algorithm, 300, &replicas);
        let me = NodeIdx(1);
        let ctx = DecideCtx {
            now: T0,
            me,
            replicas: &replicas,
            view: view(others_unreachable(&replicas, me), 0),
        };
        let mut key = KeyState::new();
        let admitted = admit_all(&mut key, &rule, &ctx);
        assert_eq!(admitted, 100, "{algorithm:?}");
        let target = rule.target(None, 1).unwrap();
        let d = key.decide(&target, RuleMode::Enforce, 1, false, &ctx);
        assert!(d.degraded, "a decision under a conservative cap says so");
    }
}

#[test]
fn a_region_raises_its_claim_once_per_round_and_waits_for_the_others() {
    let replicas = three_regions();
    let rule = rule(AlgorithmName::FixedWindow, 300, &replicas);
    let target = rule.target(None, 1).unwrap();
    let mut key = KeyState::new();
    let ctx = |now| DecideCtx {
        now,
        me: NodeIdx(0),
        replicas: &replicas,
        view: view(RegionMask::EMPTY, 0),
    };
    // The first claim is the region's share (the others are reserved at theirs); no second
    // raise during the grace period, when the others' first claims may be on their way.
    assert_eq!(admit_all(&mut key, &rule, &ctx(T0)), 100);
    assert_eq!(admit_all(&mut key, &rule, &ctx(T0 + CLAIM_GRACE_MS - 1)), 0);
    // us claimed 50 in round 1 and promised not to raise in round 2; eu has not claimed.
    key.merge(&claim_of(NodeIdx(2), 1, true, 50, &rule), &target, &ctx(T0))
        .unwrap();
    // Still in the grace period, eu, not heard claiming, holds back round 2.
    let mut early = key.clone();
    assert_eq!(admit_all(&mut early, &rule, &ctx(T0 + 1)), 0);
    // After it: 150 free, shared with eu (which may still claim), not with us.
    let t = T0 + CLAIM_GRACE_MS;
    assert_eq!(admit_all(&mut key, &rule, &ctx(t)), 75);
    // Round 3 waits for us to reach round 2.
    assert_eq!(admit_all(&mut key, &rule, &ctx(t + 1)), 0);
    let mine = *key
        .crdt()
        .claims
        .get(rule.algorithm.epoch(T0), NodeIdx(0))
        .unwrap();
    assert_eq!((mine.round(), mine.ceiling), (2, 175));
    key.merge(&claim_of(NodeIdx(2), 2, true, 50, &rule), &target, &ctx(T0))
        .unwrap();
    assert_eq!(admit_all(&mut key, &rule, &ctx(t + 2)), 37);
    // Without the rounds, a region would take its share of what its stale view says is
    // free at every decision: the ceilings now sum to the limit at most.
    let claimed: u64 = key.crdt().claims.iter().map(|c| c.ceiling).sum();
    assert!(claimed <= 300, "{claimed}");
}

#[test]
fn a_region_not_heard_claiming_is_reserved_at_its_share_during_the_grace_period() {
    let replicas = three_regions();
    let rule = rule(AlgorithmName::FixedWindow, 300, &replicas);
    let target = rule.target(None, 1).unwrap();
    // Region us has consumed 250 and gossips it, without a claim.
    let delta = consumed_by(NodeIdx(2), 250, &rule);
    let mut key = KeyState::new();
    let ctx = |now| DecideCtx {
        now,
        me: NodeIdx(0),
        replicas: &replicas,
        view: view(RegionMask::EMPTY, 7),
    };
    key.merge(&delta, &target, &ctx(T0)).unwrap();
    // eu (no claim yet) counts as its share of 100, us as its 250: nothing is free.
    assert_eq!(admit_all(&mut key, &rule, &ctx(T0)), 0);
    // After the grace period eu and us count as what they used: 50 are free, and with no
    // other claim seen this region's claim grows into them (by its forecast demand, then by
    // a third of what is left at each raise, rounded down), never beyond.
    let later = ctx(T0 + CLAIM_GRACE_MS);
    let n = admit_all(&mut key, &rule, &later);
    assert!((45..=50).contains(&n), "{n}");
    let usage = key.usage(&target, &later);
    assert_eq!(usage.used, 250 + n);
    assert_eq!(usage.regions, vec![n, 0, 250]);
}

#[test]
fn an_unreachable_region_counts_as_its_last_known_usage_when_that_is_above_its_share() {
    let replicas = three_regions();
    let rule = rule(AlgorithmName::FixedWindow, 300, &replicas);
    let target = rule.target(None, 1).unwrap();
    let mut key = KeyState::new();
    let us = RegionMask::EMPTY.with(RegionIdx(2));
    let ctx = |now| DecideCtx {
        now,
        me: NodeIdx(0),
        replicas: &replicas,
        view: view(us, 1),
    };
    key.merge(&consumed_by(NodeIdx(2), 180, &rule), &target, &ctx(T0))
        .unwrap();
    // us is assumed at max(180, 100) = 180 and eu, not heard claiming, at its share of 100:
    // 20 left, and this region is the only one that may raise.
    assert_eq!(admit_all(&mut key, &rule, &ctx(T0)), 20);
    // After the grace period eu is no longer reserved: 120 left, shared with eu, the other
    // region that can still consume; with no other claim seen the claim grows by half of
    // what is free at each raise: 99 of the 100 left (parts are rounded down).
    let later = ctx(T0 + CLAIM_GRACE_MS);
    assert_eq!(admit_all(&mut key, &rule, &later), 99);
    assert_eq!(
        key.crdt()
            .claims
            .get(rule.algorithm.epoch(T0), NodeIdx(0))
            .map(|c| c.ceiling),
        Some(119)
    );
    // Had us used less than its share, it would count as its full share: 100.
    let mut other = KeyState::new();
    other
        .merge(&consumed_by(NodeIdx(2), 30, &rule), &target, &ctx(T0))
        .unwrap();
    assert_eq!(admit_all(&mut other, &rule, &ctx(T0)), 100);
}

#[test]
fn regions_that_sync_together_never_exceed_the_limit() {
    // Every round each region takes what it may, then all exchange full states and sync.
    let replicas = three_regions();
    for algorithm in [
        AlgorithmName::FixedWindow,
        AlgorithmName::SlidingWindow,
        AlgorithmName::TokenBucket,
    ] {
        let rule = rule(algorithm, 1_000, &replicas);
        let target = rule.target(None, 1).unwrap();
        let mut keys = [KeyState::new(), KeyState::new(), KeyState::new()];
        let mut total = 0;
        for round in 0..20u64 {
            for (i, key) in keys.iter_mut().enumerate() {
                let ctx = DecideCtx {
                    now: T0 + round,
                    me: NodeIdx(i as u16),
                    replicas: &replicas,
                    view: view(RegionMask::EMPTY, round),
                };
                total += admit_all(key, &rule, &ctx);
            }
            let states: Vec<_> = keys.iter().map(|k| k.crdt().clone()).collect();
            for (i, key) in keys.iter_mut().enumerate() {
                let ctx = DecideCtx {
                    now: T0 + round,
                    me: NodeIdx(i as u16),
                    replicas: &replicas,
                    view: view(RegionMask::EMPTY, round),
                };
                for s in &states {
                    key.merge(s, &target, &ctx).unwrap();
                }
            }
        }
        assert!(total <= 1_000, "{algorithm:?}: admitted {total}");
        assert!(
            total >= 990,
            "{algorithm:?}: the limit is nearly used up after 20 rounds: {total}"
        );
    }
}

#[test]
fn the_first_decision_on_a_fresh_key_already_assumes_unreachable_regions_consumed_their_share() {
    let replicas = three_regions();
    let rule = rule(AlgorithmName::FixedWindow, 300, &replicas);
    let target = rule.target(None, 1).unwrap();
    let me = NodeIdx(0);
    let ctx = DecideCtx {
        now: T0,
        me,
        replicas: &replicas,
        view: view(others_unreachable(&replicas, me), 0),
    };
    let d = KeyState::new().decide(&target, RuleMode::Enforce, 1, false, &ctx);
    assert!(d.allowed);
    assert_eq!(
        d.remaining, 99,
        "only this region's share of 100 is available"
    );
}

#[test]
fn a_recovering_node_spends_nothing_in_strict_mode_and_only_its_share_in_optimistic_mode() {
    let replicas = three_regions();
    let rule = rule(AlgorithmName::FixedWindow, 300, &replicas);
    let target = rule.target(None, 1).unwrap();
    let strict = ClusterView {
        recovering: true,
        ..ClusterView::alone()
    };
    let ctx = DecideCtx {
        now: T0,
        me: NodeIdx(0),
        replicas: &replicas,
        view: strict,
    };
    let mut key = KeyState::new();
    let d = key.decide(&target, RuleMode::Enforce, 1, false, &ctx);
    assert!(!d.allowed && d.degraded && d.retry_after_ms > 0, "{d:?}");
    let optimistic = ClusterView {
        recovering: true,
        ..view(RegionMask::EMPTY, 0)
    };
    let ctx = DecideCtx {
        view: optimistic,
        ..ctx
    };
    assert_eq!(
        admit_all(&mut key, &rule, &ctx),
        100,
        "every other region counts as having spent its share"
    );
}
