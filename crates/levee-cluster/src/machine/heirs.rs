//! After a node is removed, this node pulls every live peer's whole state once more, so that
//! what it takes over of the removed node's rights (`levee_core::rule::Bequest`) is counted
//! from the removed node's last state: a batch it sent just before it died may have reached a
//! peer and not this node, and while the key stays busy nothing else repairs that. Once every
//! peer it gossips with has answered whole, [`Event::BequestsSettled`] tells the driver to
//! count its bequests. A peer that does not answer (unreachable, or recovering itself) is
//! asked again; until it answers, nothing is counted: fewer admissions, never more.

use levee_core::{Millis, NodeIdx, ReplicaSet};
use levee_proto::Message;

use super::Cluster;
use crate::event::Event;

/// A pull of every peer's state after a removal, under way.
#[derive(Debug, Clone)]
pub(super) struct HeirPull {
    /// When it was last asked for (re-asked while answers are missing).
    asked: Millis,
    /// The nodes removed when it started: their bequests settle when it ends.
    removed: Vec<NodeIdx>,
}

impl Cluster {
    /// The list decisions spend by changed from `before`: if a node that was listed there is
    /// removed now, (re)starts the pull. A pull under way when another node is removed starts
    /// over, so that the states merged are all from after the last removal.
    pub(super) fn pull_after_removals(&mut self, before: &ReplicaSet, now: Millis) {
        let newly_removed = self
            .cfg
            .replicas
            .positions()
            .any(|n| !before.is_removed(n) && self.cfg.replicas.is_removed(n));
        if !newly_removed {
            return;
        }
        self.start_heir_pull(now);
    }

    /// A node that starts with removed nodes in its list counts what they left as if their
    /// removal reached it now (a restart forgets its bequests; see `Rule::bind_no_higher`):
    /// the whole state it pulls on starting settles them, once every peer it gossips with
    /// answered.
    pub(super) fn pull_after_start(&mut self, now: Millis) {
        if self.cfg.replicas.has_removed() {
            self.start_heir_pull(now);
        }
    }

    /// (Re)starts the pull for the nodes removed in this node's list: no peer has answered
    /// it yet; a synced node asks now (one that is starting asks with its own pull).
    fn start_heir_pull(&mut self, now: Millis) {
        for p in &mut self.peer {
            p.heir_pulled = false;
        }
        let removed = self
            .cfg
            .replicas
            .positions()
            .filter(|&n| self.cfg.replicas.is_removed(n))
            .collect();
        self.heir_pull = Some(HeirPull {
            asked: now,
            removed,
        });
        if self.synced {
            self.ask_heir_pull(now);
        }
    }

    /// One gossip interval: reports the pull complete once every peer this node gossips with
    /// answered whole, or asks those that have not again after [`Cluster::pull_retry`]. A
    /// node still pulling its own state (it restarted) waits for that first.
    pub(super) fn heir_pull_step(&mut self, now: Millis) {
        let Some(asked) = self.heir_pull.as_ref().map(|p| p.asked) else {
            return;
        };
        if !self.synced {
            return;
        }
        let links = self.links(now);
        if links
            .iter()
            .all(|&p| self.peer[usize::from(p.0)].heir_pulled)
        {
            if let Some(pull) = self.heir_pull.take() {
                self.events.push_back(Event::BequestsSettled(pull.removed));
            }
        } else if now.saturating_sub(asked) >= self.pull_retry() {
            self.ask_heir_pull(now);
        }
    }

    /// A peer's answer to a pull arrived whole (to the pull after a removal, or to the one a
    /// node makes when it starts).
    pub(super) fn heir_pull_answered(&mut self, from: NodeIdx) {
        if self.heir_pull.is_some() {
            self.peer[usize::from(from.0)].heir_pulled = true;
        }
    }

    fn ask_heir_pull(&mut self, now: Millis) {
        if let Some(pull) = &mut self.heir_pull {
            pull.asked = now;
        }
        for p in self.links(now) {
            if !self.peer[usize::from(p.0)].heir_pulled {
                self.send(p, Message::PullRequest, now);
            }
        }
    }
}
