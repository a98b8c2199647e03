//! The node list: a change made here (a reload), the lists peers report, and leaving. What
//! a change moves: the list decisions spend by (`Event::SharesChanged`), the key rings, the
//! view (a list that removes this node), and the pull after a removal (`heirs.rs`).

use levee_core::{Millis, NodeIdx, ReplicaSet, ReplicaSetError};
use levee_proto::{ListBefore, MAX_FLOOR_LISTS, MemberList, Message};

use super::Cluster;
use crate::event::Event;

impl Cluster {
    /// This node's list changes to `next` (a reload): refused, with nothing changed, unless
    /// every position of the current list keeps its node ([`Lists::change`]). The new list's
    /// shares apply once every live node of it says it runs it; until then each share is the
    /// smaller of the old and the new. New peers start unreachable; every peer is told.
    pub fn change_list(&mut self, next: ReplicaSet, now: Millis) -> Result<(), ReplicaSetError> {
        let before = self.lists.current().clone();
        self.lists.change(next)?;
        if self.lists.current().digest() == before.digest() {
            return Ok(());
        }
        let _ = self.ran_until(before, now);
        let n = self.lists.current().len();
        self.membership.grow(n);
        self.peer.resize(n, crate::peer::PeerLink::default());
        let spent_by = std::mem::replace(&mut self.cfg.replicas, self.lists.spending());
        self.rebuild_rings();
        // Every position, removed ones included: a node removed while it runs must hear it.
        let me = self.cfg.me;
        let everyone: Vec<NodeIdx> = self
            .lists
            .current()
            .positions()
            .filter(|&p| p != me)
            .collect();
        for peer in everyone {
            self.send_list(peer, now);
        }
        self.next_membership = now + self.cfg.anti_entropy_interval;
        self.events
            .push_back(Event::SharesChanged(self.cfg.replicas.clone()));
        self.pull_after_removals(&spent_by, now);
        self.report_view();
        Ok(())
    }

    /// Tells `peer` the list this node runs, and the lists that still bound its shares.
    pub(super) fn send_list(&mut self, peer: NodeIdx, now: Millis) {
        let list = member_list(self.lists.current());
        let floors = self
            .lists
            .floors_to_send(MAX_FLOOR_LISTS)
            .iter()
            .map(member_list)
            .collect();
        let leaving = self.lists.leaving_to_send();
        let reply = self.lists.report(peer).is_none();
        self.send(
            peer,
            Message::Membership {
                list,
                floors,
                leaving,
                reply,
            },
            now,
        );
    }

    /// `POST /admin/leave`: this node owns no key from now on (its region-mates take its keys
    /// over, or the nodes of another region if it is the last of its own), gives every right
    /// it holds to the keys' owners at every interval, and tells every peer. It stays leaving
    /// until it stops; [`Cluster::leave_acknowledged`] says when every peer knows.
    pub fn leave(&mut self, now: Millis) {
        if self.lists.is_leaving(self.cfg.me) {
            return;
        }
        self.lists.leave();
        self.rebuild_rings();
        for peer in self.peers() {
            self.send_list(peer, now);
        }
        self.next_membership = now + self.cfg.anti_entropy_interval;
    }

    /// Whether this node leaves and every other node it hears knows it: none routes a key to
    /// it or gives it rights as a key's owner any more ([`Lists::leave_acknowledged`]).
    pub fn leave_acknowledged(&self) -> bool {
        self.lists
            .leave_acknowledged(|n| self.membership.is_reachable(n))
    }

    /// Notes that `list` was run until `until` (this node's clock): by this node, or by a
    /// peer that says so. The latest [`MAX_FLOOR_LISTS`] are kept. Returns whether that is
    /// news (a list not kept, or run later than kept).
    fn ran_until(&mut self, list: ReplicaSet, until: Millis) -> bool {
        if list.digest() == self.lists.current().digest() {
            return false;
        }
        let kept = &mut self.lists_before;
        let news = match kept.iter_mut().find(|(l, _)| l.digest() == list.digest()) {
            Some((_, t)) if *t >= until => false,
            Some((_, t)) => {
                *t = until;
                true
            }
            None => {
                kept.push((list, until));
                true
            }
        };
        kept.sort_by_key(|&(_, t)| t);
        let extra = kept.len().saturating_sub(MAX_FLOOR_LISTS);
        kept.drain(..extra);
        news
    }

    /// Tells `peer`, which asked for this node's state or list (it may have restarted during
    /// a change), the lists this node ran before its own and how long ago it stopped: sent
    /// right after the whole answer to its pull, and it decides nothing before it has it
    /// (unless it gave up waiting for its peers and started from its own disk: it then binds
    /// by them once they arrive, with the answer to its list's `reply`).
    pub(super) fn send_lists_before(&mut self, peer: NodeIdx, now: Millis) {
        let lists = self
            .lists_before
            .iter()
            .map(|(l, until)| ListBefore {
                list: member_list(l),
                ago_ms: now.saturating_sub(*until),
            })
            .collect();
        self.send(peer, Message::ListsBefore { lists }, now);
    }

    /// `from`, answering this node's pull or list, says it ran `lists` before its own: those
    /// of them this node's own list succeeds bound its shares (`Event::ListsBefore`, reported
    /// as it syncs, or at once if it has and they are news). More than [`MAX_FLOOR_LISTS`],
    /// or a list out of bounds, is refused whole.
    pub(super) fn lists_before_heard(&mut self, from: NodeIdx, lists: &[ListBefore], now: Millis) {
        let Some(sets) = (lists.len() <= MAX_FLOOR_LISTS)
            .then(|| {
                lists
                    .iter()
                    .map(|l| member_set(&l.list).map(|set| (set, l.ago_ms)))
                    .collect::<Option<Vec<_>>>()
            })
            .flatten()
        else {
            self.refused += 1;
            return;
        };
        let mut news = false;
        for (set, ago) in sets {
            // Only a list this node's own succeeds can have been run before it (a peer's
            // older or unrelated history says nothing of the shares here). The time is when
            // the answer arrived, less the age: no earlier than the peer stopped.
            if set.check_successor(self.lists.current()).is_ok() {
                news |= self.ran_until(set, now.saturating_sub(ago));
            }
        }
        self.peer[usize::from(from.0)].before_heard = true;
        if !self.synced {
            self.sync_if_listed(now);
        } else if news {
            // Synced without it (from its own disk, its peers unreachable), or a pull after
            // a removal brought a later stop: bind by it from now on. (For lists a running
            // node ran itself, its own waits already last at least as long.)
            self.events
                .push_back(Event::ListsBefore(self.lists_before.clone()));
        }
    }

    /// `from` says it runs `list`, bounded by `floors`, and knows the nodes at `leaving` are
    /// leaving: the shares spent and the keys' owners may change.
    pub(super) fn list_reported(
        &mut self,
        from: NodeIdx,
        list: &MemberList,
        floors: &[MemberList],
        leaving: Vec<u16>,
        now: Millis,
    ) {
        let (Some(set), Some(floors)) = (
            member_set(list),
            (floors.len() <= MAX_FLOOR_LISTS)
                .then(|| floors.iter().map(member_set).collect::<Option<Vec<_>>>())
                .flatten(),
        ) else {
            self.refused += 1;
            return;
        };
        if leaving.len() > levee_core::MAX_NODES {
            self.refused += 1;
            return;
        }
        let unsettled = !self.lists.settled();
        if unsettled
            && self
                .lists
                .report(from)
                .is_none_or(|r| r.list.digest() != set.digest())
        {
            // A peer with a new list (reloaded, or restarted too briefly to be seen gone):
            // tell it the lists that bound this node's shares before its word may settle
            // them, so that it binds its own shares by them first, and a share of its that
            // grows once they settle waits as everyone's does.
            self.send_list(from, now);
        }
        let was_leaving = self.lists.is_leaving(from);
        let changed = self.lists.reported(from, set, floors, leaving);
        if self.lists.is_leaving(from) != was_leaving {
            // It leaves (or, restarted, no longer does): its keys move to the others; tell
            // it this node knows, so that it can hand its rights over.
            self.rebuild_rings();
            self.send_list(from, now);
        }
        self.sync_if_listed(now);
        if changed {
            if unsettled && self.lists.settled() {
                // Agreed: the lists this node ran before no longer bound its shares. Its
                // peers bound theirs by them too (they came as floors): tell them.
                for peer in self.peers() {
                    self.send_list(peer, now);
                }
            }
            let spending = self.lists.spending();
            if spending != self.cfg.replicas {
                let before = std::mem::replace(&mut self.cfg.replicas, spending);
                self.events
                    .push_back(Event::SharesChanged(self.cfg.replicas.clone()));
                self.pull_after_removals(&before, now);
            }
            // A list that removes this node may have come into play: it then admits nothing.
            self.report_view();
        }
    }
}

/// A list as it travels.
fn member_list(l: &ReplicaSet) -> MemberList {
    let (regions, nodes) = l.specs();
    MemberList { regions, nodes }
}

/// The list a peer sent, if it is within bounds and valid.
fn member_set(l: &MemberList) -> Option<ReplicaSet> {
    l.within_bounds()
        .then(|| ReplicaSet::new(&l.regions, &l.nodes).ok())
        .flatten()
}
