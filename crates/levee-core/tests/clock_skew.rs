//! Rights given ahead of time survive a peer whose clock runs behind: a node gives rights
//! for its next window, which is two windows ahead of a peer whose clock is behind by less
//! than a window (`max_clock_skew` keeps it so). The peer keeps that slot; had it dropped
//! it, the giver, restarting and pulling its state back from that peer, would not know what
//! it gave and would give the same rights again (`levee-sim --scenario crashes`, seed 564:
//! 404 admitted of 400).

mod common;

use common::{ctx, two_regions};
use levee_core::rule::RuleSpec;
use levee_core::{DecideCtx, KeyCrdt, KeyState, NodeIdx};

#[test]
fn a_gift_two_windows_ahead_of_the_receivers_clock_is_kept_and_three_are_not() {
    let replicas = two_regions();
    let mut rule = RuleSpec::fixed_window("r", 400, 1_000).validate().unwrap();
    rule.bind(&replicas);
    let target = rule.target(None, 1).unwrap();
    // The receiver's clock is in window 5 (late in it); the giver's, 360 ms ahead, in 6.
    let now = 5_800;
    let ctx = ctx(&replicas, now, 1);
    let mut delta = KeyCrdt::default();
    delta.slot_mut(7).transfers.give(NodeIdx(0), NodeIdx(1), 93);
    delta.slot_mut(8).transfers.give(NodeIdx(0), NodeIdx(1), 7);
    let mut peer = KeyState::new();
    assert!(peer.merge(&delta, &target, &ctx).unwrap());
    let given = |s: &KeyState, e: u64| {
        s.crdt()
            .slot(e)
            .map_or(0, |s| s.transfers.given_by(NodeIdx(0)))
    };
    assert_eq!(given(&peer, 7), 93, "the giver's next window was dropped");
    assert_eq!(
        given(&peer, 8),
        0,
        "three windows ahead is beyond any clock skew"
    );
    // What the peer would answer a pull with holds the gift.
    let mut restarted = KeyState::new();
    let ctx0 = DecideCtx {
        me: NodeIdx(0),
        now: 6_160,
        ..ctx
    };
    restarted.merge(peer.crdt(), &target, &ctx0).unwrap();
    assert_eq!(given(&restarted, 7), 93);
}
