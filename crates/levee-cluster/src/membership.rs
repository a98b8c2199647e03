//! Failure detection: a peer is reachable while it was heard from within `suspect_after`; a
//! region is reachable while any of its nodes is. Every message counts as hearing from its
//! sender, and every node sends every peer at least an empty batch every gossip interval.

use levee_core::{Millis, NodeIdx, RegionMask, ReplicaSet};

/// A peer's reachability changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Heard from again (or for the first time).
    Up(NodeIdx),
    /// Not heard from within `suspect_after`.
    Down(NodeIdx),
}

/// What this node knows of every peer's liveness.
#[derive(Debug, Clone)]
pub struct Membership {
    me: NodeIdx,
    suspect_after: Millis,
    last_heard: Vec<Option<Millis>>,
    reachable: Vec<bool>,
}

impl Membership {
    /// Nobody heard yet: every peer starts unreachable.
    pub fn new(replicas: &ReplicaSet, me: NodeIdx, suspect_after: Millis) -> Membership {
        let n = replicas.len();
        let mut reachable = vec![false; n];
        reachable[usize::from(me.0)] = true;
        Membership {
            me,
            suspect_after,
            last_heard: vec![None; n],
            reachable,
        }
    }

    /// The list grew to `n` positions: new peers start unheard, unreachable.
    pub fn grow(&mut self, n: usize) {
        if n > self.last_heard.len() {
            self.last_heard.resize(n, None);
            self.reachable.resize(n, false);
        }
    }

    /// Records a message from `peer`. Returns `Some(Up)` if it was unreachable.
    pub fn heard(&mut self, peer: NodeIdx, now: Millis) -> Option<Change> {
        let i = usize::from(peer.0);
        if i >= self.last_heard.len() || peer == self.me {
            return None;
        }
        let last = self.last_heard[i].get_or_insert(now);
        *last = (*last).max(now);
        if self.reachable[i] {
            None
        } else {
            self.reachable[i] = true;
            Some(Change::Up(peer))
        }
    }

    /// Marks peers silent for longer than `suspect_after` as unreachable.
    pub fn refresh(&mut self, now: Millis) -> Vec<Change> {
        let mut changes = Vec::new();
        for (i, last) in self.last_heard.iter().enumerate() {
            if i == usize::from(self.me.0) || !self.reachable[i] {
                continue;
            }
            if last.is_none_or(|t| now.saturating_sub(t) > self.suspect_after) {
                self.reachable[i] = false;
                changes.push(Change::Down(NodeIdx(i as u16)));
            }
        }
        changes
    }

    /// Whether `peer` is reachable (this node always is).
    pub fn is_reachable(&self, peer: NodeIdx) -> bool {
        self.reachable
            .get(usize::from(peer.0))
            .copied()
            .unwrap_or(false)
    }

    /// When `peer` was last heard from.
    pub fn last_heard(&self, peer: NodeIdx) -> Option<Millis> {
        self.last_heard.get(usize::from(peer.0)).copied().flatten()
    }

    /// Regions none of whose nodes is reachable (never this node's region).
    pub fn unreachable_regions(&self, replicas: &ReplicaSet) -> RegionMask {
        let mine = replicas.region_of(self.me);
        replicas
            .regions()
            .filter(|&r| {
                r != mine
                    && !replicas
                        .region_nodes(r)
                        .iter()
                        .any(|&n| self.is_reachable(n))
            })
            .fold(RegionMask::EMPTY, RegionMask::with)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use levee_core::{RegionIdx, ReplicaSpec};

    fn set() -> ReplicaSet {
        let regions = [("eu".to_owned(), 1), ("us".to_owned(), 1)];
        let nodes: Vec<ReplicaSpec> = ["eu-1", "us-1", "us-2"]
            .iter()
            .map(|id| ReplicaSpec {
                id: (*id).into(),
                region: id[..2].into(),
                weight: None,
            })
            .collect();
        ReplicaSet::new(&regions, &nodes).unwrap()
    }

    #[test]
    fn a_region_is_reachable_while_any_of_its_nodes_is() {
        let set = set();
        let us = set.region_by_name("us").unwrap();
        let mut m = Membership::new(&set, NodeIdx(0), 1000);
        assert!(m.unreachable_regions(&set).contains(us), "nobody heard yet");
        assert_eq!(m.heard(NodeIdx(1), 0), Some(Change::Up(NodeIdx(1))));
        assert_eq!(m.heard(NodeIdx(2), 500), Some(Change::Up(NodeIdx(2))));
        assert!(m.unreachable_regions(&set).is_empty());
        assert_eq!(m.refresh(1200), vec![Change::Down(NodeIdx(1))]);
        assert!(
            m.unreachable_regions(&set).is_empty(),
            "us-2 is still heard"
        );
        assert_eq!(m.refresh(1600), vec![Change::Down(NodeIdx(2))]);
        assert!(m.unreachable_regions(&set).contains(us));
        assert!(
            !m.unreachable_regions(&set).contains(RegionIdx(0)),
            "never this node's region"
        );
        assert_eq!(m.heard(NodeIdx(2), 1700), Some(Change::Up(NodeIdx(2))));
    }
}
