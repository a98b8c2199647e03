//! What several of the core's test files share.

#![allow(dead_code)]

use levee_core::{ClusterView, DecideCtx, NodeIdx, RegionMask, ReplicaSet, ReplicaSpec};

/// Two regions (eu, us) of one node each, of equal weight.
pub(crate) fn two_regions() -> ReplicaSet {
    let nodes: Vec<ReplicaSpec> = ["eu", "us"]
        .iter()
        .map(|r| ReplicaSpec {
            id: format!("{r}-1"),
            region: (*r).into(),
            weight: None,
        })
        .collect();
    ReplicaSet::new(&[("eu".into(), 1), ("us".into(), 1)], &nodes).unwrap()
}

/// Node `node` deciding at `now`, every region reachable.
pub(crate) fn ctx(replicas: &ReplicaSet, now: u64, node: u16) -> DecideCtx<'_> {
    DecideCtx {
        now,
        me: NodeIdx(node),
        replicas,
        view: ClusterView {
            unreachable: RegionMask::EMPTY,
            acting_alone: false,
            recovering: false,
        },
    }
}
