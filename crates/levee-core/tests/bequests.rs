//! A node removed while it holds rights of a day's window (it crashed): its region-mate
//! takes them over at once, for the windows before the grown shares apply, instead of
//! leaving them out of service until the day after next (issue #13, item 6).
//!
//! One region of two nodes and one of one, a day's fixed window of 600: eu-1 150, eu-2 150,
//! us-1 300. eu-2 gave its share to eu-1 (the key's owner), and eu-1 admitted 200 before it
//! died. Then eu-1 is removed.

mod common;

use common::ctx;
use levee_core::crdt::Lattice;
use levee_core::rule::RuleSpec;
use levee_core::{KeyState, NodeIdx, REMOVED, ReplicaSet, ReplicaSpec, Rule, RuleMode};

const DAY_MS: u64 = 86_400_000;
/// Day 20,000, eight in the morning.
const NOW: u64 = 20_000 * DAY_MS + 8 * 3_600_000;

fn list(eu1_removed: bool) -> ReplicaSet {
    let node = |id: &str, region: &str, removed: bool| ReplicaSpec {
        id: id.into(),
        region: region.into(),
        weight: if removed { REMOVED } else { None },
    };
    ReplicaSet::new(
        &[("eu".into(), 1), ("us".into(), 1)],
        &[
            node("eu-1", "eu", eu1_removed),
            node("eu-2", "eu", false),
            node("us-1", "us", false),
        ],
    )
    .unwrap()
}

/// The rule bound to the first list, then rebound to the list without eu-1 at `NOW` as a
/// node does (`RuleSet::rebound`), its bequest settled (eu-2 merged its peers' states); and
/// when the grown shares apply.
fn rules() -> (Rule, Rule, u64) {
    let (before, mut after, at) = unsettled();
    assert!(after.has_unsettled_bequests());
    after.settle_bequests(&[NodeIdx(0)]);
    (before, after, at)
}

/// [`rules`] before eu-2 merged its peers' states.
fn unsettled() -> (Rule, Rule, u64) {
    let base = RuleSpec::fixed_window("day", 600, DAY_MS)
        .validate()
        .unwrap();
    let mut before = base.clone();
    before.bind(&list(false));
    assert_eq!(before.split, vec![150, 150, 300]);
    let mut after = base.clone();
    after.keep_shares_of(&before);
    let at = after
        .bind_no_higher(&list(true), NOW)
        .expect("eu-2's share grows");
    (before, after, at)
}

/// eu-2's state of the key: it gave its 150 to eu-1, which admitted 200 (the deltas eu-2
/// received before eu-1 died).
fn heir_state(rule: &Rule) -> KeyState {
    let replicas = list(false);
    let target = rule.target(None, 1).unwrap();
    let e = rule.algorithm.epoch(NOW);
    let mut owner = KeyState::new();
    let mut crdt = levee_core::KeyCrdt::default();
    crdt.slot_mut(e).transfers.give(NodeIdx(1), NodeIdx(0), 150);
    owner
        .merge(&crdt, &target, &ctx(&replicas, NOW - 60_000, 0))
        .unwrap();
    for i in 0..200 {
        let d = owner.decide(
            &target,
            RuleMode::Enforce,
            1,
            false,
            &ctx(&replicas, NOW - 50_000 + i, 0),
        );
        assert!(d.allowed, "check {i} at the owner");
    }
    let mut heir = KeyState::new();
    let mut both = owner.crdt().clone();
    both.join(&crdt);
    heir.merge(&both, &target, &ctx(&replicas, NOW - 1_000, 1))
        .unwrap();
    heir
}

/// Checks eu-2 admits at `now` under `rule`, one at a time until the first deny.
fn admitted(heir: &mut KeyState, rule: &Rule, now: u64) -> u64 {
    admitted_on(&list(true), heir, rule, now)
}

/// Checks node 1 (eu-2) admits at `now` under `rule` bound to `replicas`, one at a time
/// until the first deny.
fn admitted_on(replicas: &ReplicaSet, heir: &mut KeyState, rule: &Rule, now: u64) -> u64 {
    let target = rule.target(None, 1).unwrap();
    let mut n = 0;
    while heir
        .decide(
            &target,
            RuleMode::Enforce,
            1,
            false,
            &ctx(replicas, now + n, 1),
        )
        .allowed
    {
        n += 1;
        assert!(n <= 600, "more than the limit admitted");
    }
    n
}

#[test]
fn the_removed_nodes_unspent_rights_serve_its_region_at_once() {
    let (before, after, at) = rules();
    assert_eq!(after.split, vec![0, 150, 300], "eu-2's growth waits");
    assert_eq!(after.bequests.len(), 1);
    let b = after.bequests[0];
    assert_eq!(
        (b.from, b.heir, b.share, b.until),
        (NodeIdx(0), NodeIdx(1), 150, at)
    );
    assert_eq!(at, NOW - 8 * 3_600_000 + 2 * DAY_MS, "the day after next");
    let mut heir = heir_state(&before);
    // eu-1 held 150 + 150 of which it used 200: 100 come back to eu-2, whose own 150 went.
    assert_eq!(admitted(&mut heir, &after, NOW + 1_000), 100);
    // Today's window: eu-1's 200 and eu-2's 100, the region's 300 in all.
}

#[test]
fn inherited_rights_the_heir_gives_on_are_no_longer_its_own() {
    let (before, after, _) = rules();
    let mut heir = heir_state(&before);
    // eu-2 gave 60 of what it took over to us-1 (a region whose demand pressed): its own
    // share went to eu-1 long ago, so the gift is paid from the inheritance.
    let e = after.algorithm.epoch(NOW);
    let mut gift = levee_core::KeyCrdt::default();
    gift.slot_mut(e).transfers.give(NodeIdx(1), NodeIdx(2), 60);
    let target = after.target(None, 1).unwrap();
    heir.merge(&gift, &target, &ctx(&list(true), NOW + 500, 1))
        .unwrap();
    assert_eq!(admitted(&mut heir, &after, NOW + 1_000), 40);
}

#[test]
fn a_bequest_counts_for_nothing_until_the_heir_has_merged_its_peers_states() {
    let (before, after, _) = unsettled();
    let mut heir = heir_state(&before);
    assert_eq!(admitted(&mut heir, &after, NOW + 1_000), 0);
    let mut settled = after.clone();
    settled.settle_bequests(&[NodeIdx(0)]);
    assert_eq!(admitted(&mut heir, &settled, NOW + 2_000), 100);
}

#[test]
fn without_a_bequest_the_removed_nodes_rights_stay_out_of_service() {
    let (before, mut after, _) = rules();
    after.bequests.clear();
    let mut heir = heir_state(&before);
    assert_eq!(admitted(&mut heir, &after, NOW + 1_000), 0);
}

#[test]
fn tomorrows_window_has_the_removed_nodes_whole_share_and_the_day_after_the_grown_one() {
    let (_, after, at) = rules();
    let mut heir = KeyState::new();
    assert_eq!(admitted(&mut heir, &after, NOW + DAY_MS), 300);
    let mut grown = after.clone();
    grown.bind(&list(true));
    assert!(grown.bequests.is_empty());
    assert_eq!(
        admitted(&mut heir, &grown.growing_from(at), at + 1_000),
        300
    );
}

#[test]
fn short_windows_leave_no_bequest() {
    let base = RuleSpec::fixed_window("second", 600, 1_000)
        .validate()
        .unwrap();
    let mut before = base.clone();
    before.bind(&list(false));
    let mut after = base;
    after.keep_shares_of(&before);
    assert!(after.bind_no_higher(&list(true), NOW).is_some());
    assert!(after.bequests.is_empty());
}

#[test]
fn a_bequest_ends_with_its_heirs_removal() {
    let (_, after, _) = rules();
    let node = |id: &str, region: &str, weight| ReplicaSpec {
        id: id.into(),
        region: region.into(),
        weight,
    };
    // eu-2 removed in turn, eu-3 added: eu-1's rights are not handed on (eu-2 may have
    // spent them), eu-2's own share is eu-3's to take over.
    let next = ReplicaSet::new(
        &[("eu".into(), 1), ("us".into(), 1)],
        &[
            node("eu-1", "eu", REMOVED),
            node("eu-2", "eu", REMOVED),
            node("us-1", "us", None),
            node("eu-3", "eu", None),
        ],
    )
    .unwrap();
    let mut later = after.clone();
    later.keep_shares_of(&after);
    later.bind_no_higher(&next, NOW + 1_000);
    let kept: Vec<_> = later
        .bequests
        .iter()
        .map(|b| (b.from, b.heir, b.share, b.settled))
        .collect();
    assert_eq!(kept, vec![(NodeIdx(1), NodeIdx(3), 150, false)]);
}

/// A node that restarts binds its rules to the agreed list in full, so its grown share may
/// be spent at once: the heir keeps back what the other nodes' shares grow by. eu has three
/// nodes of 100 (a day's 600, us-1 300); eu-1 is removed: eu-2 (the heir) and eu-3 grow to
/// 150 each, and eu-2 withholds eu-3's 50.
#[test]
fn the_heir_keeps_back_what_the_other_nodes_shares_grow_by() {
    let node = |id: &str, region: &str, weight| ReplicaSpec {
        id: id.into(),
        region: region.into(),
        weight,
    };
    let list = |eu1| {
        ReplicaSet::new(
            &[("eu".into(), 1), ("us".into(), 1)],
            &[
                node("eu-1", "eu", eu1),
                node("eu-2", "eu", None),
                node("eu-3", "eu", None),
                node("us-1", "us", None),
            ],
        )
        .unwrap()
    };
    let base = RuleSpec::fixed_window("day", 600, DAY_MS)
        .validate()
        .unwrap();
    let mut before = base.clone();
    before.bind(&list(None));
    assert_eq!(before.split, vec![100, 100, 100, 300]);
    let mut after = base;
    after.keep_shares_of(&before);
    after.bind_no_higher(&list(REMOVED), NOW);
    after.settle_bequests(&[NodeIdx(0)]);
    let b = after.bequests[0];
    assert_eq!((b.heir, b.share, b.withheld), (NodeIdx(1), 100, 50));
    // eu-1 used nothing of today: eu-2 counts its 100 less the 50 withheld.
    let mut heir = KeyState::new();
    assert_eq!(
        admitted_on(&list(REMOVED), &mut heir, &after, NOW),
        100 + 50
    );
}
