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
