//! What several of the core's test files share.

#![allow(dead_code)]

use levee_core::{
    ClusterView, DecideCtx, Listing, NodeIdx, PeerClock, RebalanceCtx, RegionMask, ReplicaSet,
    ReplicaSpec,
};

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
            blind_since: None,
        },
    }
}

fn hears_everyone(_: NodeIdx) -> bool {
    true
}

fn clock_unknown(_: NodeIdx) -> Option<PeerClock> {
    None
}

/// Node `node` rebalancing at `now` as its region's owner, every region reachable and heard,
/// peers' clocks unknown, its process started long before.
pub(crate) fn rebalance_ctx(
    replicas: &ReplicaSet,
    now: u64,
    node: u16,
    max_in_flight: u64,
) -> RebalanceCtx<'_> {
    RebalanceCtx {
        now,
        me: NodeIdx(node),
        replicas,
        view: ctx(replicas, now, node).view,
        owner: NodeIdx(node),
        max_in_flight,
        inherit_from: None,
        hears: &hears_everyone,
        clock_of: &clock_unknown,
        started: 0,
        own_demand: false,
    }
}

/// How a node lists one key from interval to interval, as its store and its machine do
/// (`levee_core::Listing`): listed now, it is rebalanced and sent at the end of the
/// interval; listed for later, with the next interval that lists it now or that is a
/// heartbeat's (every fifth here, 100 ms of 20 ms intervals).
#[derive(Default)]
pub(crate) struct Listed {
    now: bool,
    later: bool,
}

impl Listed {
    /// Notes how an operation asked to list the key.
    pub(crate) fn note(&mut self, listing: Listing) {
        match listing {
            Listing::Now => self.now = true,
            Listing::Later => self.later = true,
            Listing::Quiet => {}
        }
    }

    /// Interval `i` ends: whether the key is rebalanced and sent in it.
    pub(crate) fn interval_ends(&mut self, i: usize) -> bool {
        let sent = self.now || (self.later && i.is_multiple_of(5));
        if sent {
            *self = Listed::default();
        }
        sent
    }
}
