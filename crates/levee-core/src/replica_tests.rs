//! Tests of `replica.rs`: shares, successors, floors.

use super::*;

fn spec(id: &str, region: &str) -> ReplicaSpec {
    ReplicaSpec {
        id: id.into(),
        region: region.into(),
        weight: None,
    }
}

fn three_by_two() -> ReplicaSet {
    three_by_two_with_ap_weight(1)
}

/// Three regions of two nodes, `ap` weighing `ap` and the others 1.
fn three_by_two_with_ap_weight(ap: u32) -> ReplicaSet {
    let regions = [
        ("eu".to_owned(), 1),
        ("us".to_owned(), 1),
        ("ap".to_owned(), ap),
    ];
    let nodes = [
        spec("eu-1", "eu"),
        spec("eu-2", "eu"),
        spec("us-1", "us"),
        spec("us-2", "us"),
        spec("ap-1", "ap"),
        spec("ap-2", "ap"),
    ];
    ReplicaSet::new(&regions, &nodes).unwrap()
}

#[test]
fn split_sums_exactly_to_the_amount() {
    let set = three_by_two();
    for amount in [0u64, 1, 5, 6, 7, 100, 1000, 999_999, u64::from(u32::MAX)] {
        let parts = set.split(amount);
        assert_eq!(parts.iter().sum::<u64>(), amount, "amount {amount}");
        let (lo, hi) = (parts.iter().min().unwrap(), parts.iter().max().unwrap());
        assert!(
            hi - lo <= 1,
            "even weights differ by at most one: {parts:?}"
        );
    }
}

#[test]
fn region_weight_is_split_evenly_among_its_nodes() {
    let regions = [("eu".to_owned(), 2), ("us".to_owned(), 1)];
    let nodes = [
        spec("eu-1", "eu"),
        spec("us-1", "us"),
        spec("us-2", "us"),
        spec("us-3", "us"),
    ];
    let set = ReplicaSet::new(&regions, &nodes).unwrap();
    let eu = set.region_by_name("eu").unwrap();
    assert!((set.region_share(eu) - 2.0 / 3.0).abs() < 1e-12);
    assert!((set.node_share(NodeIdx(1)) - 1.0 / 9.0).abs() < 1e-12);
    assert_eq!(set.split(900), vec![600, 100, 100, 100]);
}

#[test]
fn node_weights_inside_a_region_are_honoured() {
    let regions = [("eu".to_owned(), 1)];
    let nodes = [
        ReplicaSpec {
            id: "a".into(),
            region: "eu".into(),
            weight: Some(3),
        },
        ReplicaSpec {
            id: "b".into(),
            region: "eu".into(),
            weight: Some(1),
        },
    ];
    let set = ReplicaSet::new(&regions, &nodes).unwrap();
    assert_eq!(set.split(100), vec![75, 25]);
}

#[test]
fn invalid_sets_name_the_problem() {
    let r = [("eu".to_owned(), 1)];
    assert_eq!(ReplicaSet::new(&r, &[]), Err(ReplicaSetError::Empty));
    assert_eq!(
        ReplicaSet::new(&r, &[spec("a", "eu"), spec("a", "eu")]),
        Err(ReplicaSetError::DuplicateNode("a".into()))
    );
    assert!(matches!(
        ReplicaSet::new(&r, &[spec("a", "mars")]),
        Err(ReplicaSetError::UnknownRegion { .. })
    ));
    let r2 = [("eu".to_owned(), 1), ("us".to_owned(), 1)];
    assert_eq!(
        ReplicaSet::new(&r2, &[spec("a", "eu")]),
        Err(ReplicaSetError::EmptyRegion("us".into()))
    );
    let r0 = [("eu".to_owned(), 0)];
    assert!(matches!(
        ReplicaSet::new(&r0, &[spec("a", "eu")]),
        Err(ReplicaSetError::InvalidWeight(_))
    ));
}

#[test]
fn digest_differs_when_the_list_differs() {
    let a = three_by_two();
    let b = three_by_two_with_ap_weight(2);
    assert_ne!(a.digest(), b.digest());
    assert_eq!(a.digest(), three_by_two().digest());
}

/// Peers compare digests on connect, across versions: the digest of a given list never
/// changes.
#[test]
fn digest_is_stable_across_versions() {
    assert_eq!(three_by_two().digest(), 0x951a_96ef_97b8_ea72);
    assert_eq!(
        ReplicaSet::single("n1", "eu").digest(),
        0x1257_4e2f_8ee3_a2f2
    );
}

fn list(nodes: &[(&str, &str, Option<u32>)]) -> ReplicaSet {
    let regions = [("eu".to_owned(), 1), ("us".to_owned(), 1)];
    let nodes: Vec<ReplicaSpec> = nodes
        .iter()
        .map(|(id, region, weight)| ReplicaSpec {
            id: (*id).into(),
            region: (*region).into(),
            weight: *weight,
        })
        .collect();
    ReplicaSet::new(&regions, &nodes).unwrap()
}

#[test]
fn a_removed_node_keeps_its_position_with_no_share_and_no_place_in_its_region() {
    let set = list(&[
        ("eu-1", "eu", None),
        ("us-1", "us", None),
        ("eu-2", "eu", REMOVED),
    ]);
    assert_eq!(set.len(), 3);
    assert_eq!(set.split(100), vec![50, 50, 0]);
    assert!(set.is_removed(NodeIdx(2)));
    assert_eq!(set.nodes().collect::<Vec<_>>(), [NodeIdx(0), NodeIdx(1)]);
    let eu = set.region_by_name("eu").unwrap();
    assert_eq!(set.region_nodes(eu), [NodeIdx(0)]);
    let (regions, specs) = set.specs();
    assert_eq!(ReplicaSet::new(&regions, &specs).unwrap(), set);
}

#[test]
fn floors_bound_every_share_by_the_smallest_under_any_list() {
    let old = list(&[("eu-1", "eu", None), ("us-1", "us", None)]);
    let new = list(&[
        ("eu-1", "eu", None),
        ("us-1", "us", None),
        ("eu-2", "eu", None),
    ]);
    let settling = new.with_floors(std::slice::from_ref(&old));
    assert_eq!(old.split(100), vec![50, 50]);
    assert_eq!(new.split(100), vec![25, 50, 25]);
    assert_eq!(
        settling.split(100),
        vec![25, 50, 0],
        "the new node starts at zero, the others at the smaller share"
    );
    assert!(settling.is_bounded());
    assert_eq!(settling.digest(), new.digest());
    assert_eq!(settling.without_floors(), new);
    assert!((settling.node_share(NodeIdx(2))).abs() < 1e-12);
    let back = old.with_floors(std::slice::from_ref(&new));
    assert_eq!(back.split(100), vec![25, 50], "matched by id, not position");
}

#[test]
fn a_successor_keeps_every_position_and_a_removed_node_stays_removed() {
    let old = list(&[("eu-1", "eu", None), ("us-1", "us", None)]);
    let grown = list(&[
        ("eu-1", "eu", None),
        ("us-1", "us", Some(3)),
        ("eu-2", "eu", None),
    ]);
    assert_eq!(old.check_successor(&grown), Ok(()));
    let shrunk = list(&[
        ("eu-1", "eu", None),
        ("us-1", "us", Some(3)),
        ("eu-2", "eu", REMOVED),
    ]);
    assert_eq!(grown.check_successor(&shrunk), Ok(()));
    let refusal = |from: &ReplicaSet, to: &ReplicaSet| match from.check_successor(to) {
        Err(ReplicaSetError::NotASuccessor(m)) => m,
        other => panic!("refusal expected, got {other:?}"),
    };
    assert!(refusal(&grown, &old).contains("\"eu-2\" is missing"));
    let swapped = list(&[("us-1", "us", None), ("eu-1", "eu", None)]);
    assert!(refusal(&old, &swapped).starts_with("cluster.node[0]: was \"eu-1\""));
    let revived = list(&[
        ("eu-1", "eu", None),
        ("us-1", "us", None),
        ("eu-2", "eu", None),
    ]);
    assert!(refusal(&shrunk, &revived).contains("cannot come back"));
    let moved = list(&[("eu-1", "us", None), ("us-1", "eu", None)]);
    assert!(refusal(&old, &moved).contains("cannot change regions"));
}

#[test]
fn before_removals_brings_removed_nodes_back_at_their_weight_and_bounds_every_other_share() {
    let regions = [("eu".to_string(), 1), ("us".to_string(), 1)];
    let mut specs = vec![spec("eu-1", "eu"), spec("eu-2", "eu"), spec("eu-3", "eu")];
    specs.push(spec("us-1", "us"));
    let before = ReplicaSet::new(&regions, &specs).unwrap();
    specs[1].weight = REMOVED;
    let after = ReplicaSet::new(&regions, &specs).unwrap();
    assert!(after.has_removed() && !before.has_removed());

    let revived = after.before_removals(|_| None);
    assert_eq!(revived, before);
    assert_eq!(revived.split(600), vec![100, 100, 100, 300]);
    assert_eq!(after.split(600), vec![150, 0, 150, 300]);

    // A removed entry that keeps its weight comes back at it; an impossible weight is even.
    let weighted = after.before_removals(|n| (n == NodeIdx(1)).then_some(4));
    assert_eq!(weighted.split(600), vec![50, 200, 50, 300]);
    let impossible = after.before_removals(|_| Some(MAX_WEIGHT + 1));
    assert_eq!(impossible, before);
    // A list without removals is itself.
    assert_eq!(before.before_removals(|_| Some(7)), before);
}
