//! The lattices' laws on small cases; `tests/properties.rs` checks them at random.

use super::*;
use crate::replica::NodeIdx;

#[test]
fn net_never_goes_below_zero() {
    let t = Tally {
        consumed: 3,
        refunded: 5,
        requested: 9,
    };
    assert_eq!(t.net(), 0);
    assert_eq!(
        Tally {
            consumed: 5,
            refunded: 3,
            requested: 5
        }
        .net(),
        2
    );
}

#[test]
fn transfers_sum_rows_and_columns() {
    let mut m = TransferMatrix::default();
    m.give(NodeIdx(0), NodeIdx(1), 5);
    m.give(NodeIdx(0), NodeIdx(2), 3);
    m.give(NodeIdx(2), NodeIdx(1), 1);
    m.give(NodeIdx(0), NodeIdx(1), 2);
    assert_eq!(m.get(NodeIdx(0), NodeIdx(1)), 7);
    assert_eq!(m.given_by(NodeIdx(0)), 10);
    assert_eq!(m.received_by(NodeIdx(1)), 8);
    assert_eq!(m.net(NodeIdx(2)), 2);
    assert_eq!(m.net(NodeIdx(0)), -10);
}

#[test]
fn registers_keep_the_highest_sequence() {
    let mut a = DemandReg {
        seq: 3,
        forecast: 10,
        received: 0,
    };
    assert!(!a.join(&DemandReg {
        seq: 2,
        forecast: 99,
        received: 0
    }));
    assert!(a.join(&DemandReg {
        seq: 4,
        forecast: 1,
        received: 0
    }));
    assert_eq!(a.forecast, 1);
}

#[test]
fn slots_stay_sorted_and_bounded() {
    let mut k = KeyCrdt::default();
    k.slot_mut(5);
    k.slot_mut(3);
    k.slot_mut(4);
    assert_eq!(
        k.slots.iter().map(|s| s.epoch).collect::<Vec<_>>(),
        vec![3, 4, 5]
    );
    k.retain_epochs(4, 5);
    assert_eq!(
        k.slots.iter().map(|s| s.epoch).collect::<Vec<_>>(),
        vec![4, 5]
    );
}

/// Nodes of different versions compare fingerprints in anti-entropy: the fingerprint of a
/// given state never changes.
#[test]
fn fingerprint_is_stable_across_versions() {
    let mut k = KeyCrdt::default();
    assert_eq!(k.fingerprint(0), 0x9ac5_e121_19fd_3f85);
    let s = k.slot_mut(7);
    *s.tallies.entry(NodeIdx(0)) = Tally {
        consumed: 5,
        refunded: 1,
        requested: 9,
    };
    *s.tallies.entry(NodeIdx(2)) = Tally {
        consumed: 3,
        refunded: 0,
        requested: 3,
    };
    s.transfers.give(NodeIdx(0), NodeIdx(2), 4);
    let s = k.slot_mut(6);
    *s.tallies.entry(NodeIdx(1)) = Tally {
        consumed: 1,
        refunded: 0,
        requested: 2,
    };
    k.holdings.give(NodeIdx(1), NodeIdx(0), 11);
    *k.buckets.entry(NodeIdx(0)) = BucketReg {
        seq: 3,
        at: 1_700_000_000_000,
        level_nt: -2_500_000_000,
    };
    *k.demand.entry(NodeIdx(2)) = DemandReg {
        seq: 2,
        forecast: 40,
        received: 4,
    };
    k.claims.raise(Claim {
        epoch: 7,
        node: NodeIdx(0),
        step: 3,
        ceiling: 12,
    });
    k.claims.raise(Claim {
        epoch: 6,
        node: NodeIdx(1),
        step: 1,
        ceiling: 2,
    });
    assert_eq!(k.fingerprint(0), 0xd5de_b714_57ad_9568);
    // Epochs below the oldest retained one are left out.
    assert_eq!(k.fingerprint(7), 0xfdd3_3ca3_3ce0_7da0);
}
