//! Failure detection: a peer is reachable while it was heard from within `suspect_after`,
//! directly or, with regional gossip, through a region-mate that hears it
//! ([`Membership::heard_via`]); a region is reachable while any of its nodes is. Every message
//! counts as hearing from its sender, and every node sends every peer it talks to at least an
//! empty batch every gossip interval.

use levee_core::{Millis, NodeIdx, RegionMask, ReplicaSet};

/// A peer's reachability changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Heard from again (or for the first time).
    Up(NodeIdx),
    /// Not heard from within `suspect_after`.
    Down(NodeIdx),
}

/// What hearing a message from a peer changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Heard {
    /// The peer was not heard directly before (or not within `suspect_after`): the link
    /// between the two is (back) up, and the peer may have missed what was sent it.
    pub link_up: bool,
    /// The peer's reachability changed (it was not heard at all, not even through others).
    pub change: Option<Change>,
}

/// What this node knows of every peer's liveness.
#[derive(Debug, Clone)]
pub struct Membership {
    me: NodeIdx,
    suspect_after: Millis,
    /// When each peer was last heard directly.
    last_heard: Vec<Option<Millis>>,
    /// When a region-mate last said it heard each peer ([`Membership::heard_via`]).
    relayed: Vec<Option<Millis>>,
    /// Heard directly within `suspect_after` (as of the last [`Membership::refresh`]).
    direct: Vec<bool>,
    /// Heard directly or through others within `suspect_after`.
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
            relayed: vec![None; n],
            direct: reachable.clone(),
            reachable,
        }
    }

    /// The list grew to `n` positions: new peers start unheard, unreachable.
    pub fn grow(&mut self, n: usize) {
        if n > self.last_heard.len() {
            self.last_heard.resize(n, None);
            self.relayed.resize(n, None);
            self.direct.resize(n, false);
            self.reachable.resize(n, false);
        }
    }

    /// Records a message from `peer`.
    pub fn heard(&mut self, peer: NodeIdx, now: Millis) -> Heard {
        let i = usize::from(peer.0);
        if i >= self.last_heard.len() || peer == self.me {
            return Heard::default();
        }
        let last = self.last_heard[i].get_or_insert(now);
        *last = (*last).max(now);
        let link_up = !std::mem::replace(&mut self.direct[i], true);
        let change = (!std::mem::replace(&mut self.reachable[i], true)).then_some(Change::Up(peer));
        Heard { link_up, change }
    }

    /// A region-mate heard `peer` at `at` (this node's clock). Returns `Some(Up)` if `peer`
    /// was unreachable and `at` is within `suspect_after` of `now`.
    pub fn heard_via(&mut self, peer: NodeIdx, at: Millis, now: Millis) -> Option<Change> {
        let i = usize::from(peer.0);
        if i >= self.relayed.len() || peer == self.me {
            return None;
        }
        let at = at.min(now);
        let last = self.relayed[i].get_or_insert(at);
        *last = (*last).max(at);
        let fresh = now.saturating_sub(at) <= self.suspect_after;
        (fresh && !std::mem::replace(&mut self.reachable[i], true)).then_some(Change::Up(peer))
    }

    /// Marks peers silent for longer than `suspect_after` as unreachable (and those not heard
    /// directly for that long as no longer heard directly).
    pub fn refresh(&mut self, now: Millis) -> Vec<Change> {
        let stale =
            |t: Option<Millis>| t.is_none_or(|t| now.saturating_sub(t) > self.suspect_after);
        let mut changes = Vec::new();
        for i in 0..self.last_heard.len() {
            if i == usize::from(self.me.0) {
                continue;
            }
            if self.direct[i] && stale(self.last_heard[i]) {
                self.direct[i] = false;
            }
            if self.reachable[i] && !self.direct[i] && stale(self.relayed[i]) {
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

    /// Whether `peer` was heard directly within `suspect_after` (as of the last refresh).
    pub fn hears_directly(&self, peer: NodeIdx) -> bool {
        self.direct
            .get(usize::from(peer.0))
            .copied()
            .unwrap_or(false)
    }

    /// When `peer` was last heard from, directly or through a region-mate.
    pub fn last_heard(&self, peer: NodeIdx) -> Option<Millis> {
        let i = usize::from(peer.0);
        let direct = self.last_heard.get(i).copied().flatten();
        let relayed = self.relayed.get(i).copied().flatten();
        direct.max(relayed)
    }

    /// When `peer` was last heard directly.
    pub fn last_heard_directly(&self, peer: NodeIdx) -> Option<Millis> {
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
        assert_eq!(m.heard(NodeIdx(1), 0).change, Some(Change::Up(NodeIdx(1))));
        assert_eq!(
            m.heard(NodeIdx(2), 500).change,
            Some(Change::Up(NodeIdx(2)))
        );
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
        assert_eq!(
            m.heard(NodeIdx(2), 1700).change,
            Some(Change::Up(NodeIdx(2)))
        );
    }

    #[test]
    fn a_peer_heard_only_through_a_region_mate_is_reachable_until_that_news_is_old() {
        let set = set();
        let mut m = Membership::new(&set, NodeIdx(0), 1000);
        assert_eq!(
            m.heard_via(NodeIdx(2), 400, 500),
            Some(Change::Up(NodeIdx(2)))
        );
        assert!(m.is_reachable(NodeIdx(2)));
        assert!(!m.hears_directly(NodeIdx(2)), "only through another node");
        assert_eq!(
            m.heard_via(NodeIdx(1), 100, 1_500),
            None,
            "news too old to count"
        );
        assert!(!m.is_reachable(NodeIdx(1)));
        assert_eq!(m.refresh(1_300), vec![]);
        assert_eq!(m.refresh(1_401), vec![Change::Down(NodeIdx(2))]);
        // Heard directly: the link is up, and so is the peer.
        let h = m.heard(NodeIdx(2), 1_500);
        assert!(h.link_up);
        assert_eq!(h.change, Some(Change::Up(NodeIdx(2))));
        // Heard directly again while news of it keeps coming: the link stays up.
        assert_eq!(m.heard_via(NodeIdx(2), 1_600, 1_600), None);
        assert!(!m.heard(NodeIdx(2), 1_700).link_up);
        // Silent directly for longer than `suspect_after`, still heard of: reachable, but
        // the next direct message brings the link up again.
        assert_eq!(m.heard_via(NodeIdx(2), 2_750, 2_800), None);
        assert_eq!(m.refresh(2_800), vec![]);
        assert!(m.is_reachable(NodeIdx(2)) && !m.hears_directly(NodeIdx(2)));
        let h = m.heard(NodeIdx(2), 2_900);
        assert!(h.link_up);
        assert_eq!(h.change, None);
    }
}
