//! Live membership: which replica list this node runs, which lists its peers say they run,
//! and the shares it may spend while they differ ([`Lists`]).
//!
//! The rule (docs/membership.md): a node's share under a new list applies only once every
//! live node of the new list has acknowledged that list (said, in a `Membership` message,
//! that it runs it). Until then the node spends, for every limit, the smallest of its shares
//! under every list in play: its own, every list it ran since its list was last agreed, and
//! every list its peers said they run or are bounded by. A new node is in no earlier list, so
//! it starts at zero (it can still receive transfers, which are always safe: a donor gives
//! only what it holds).
//!
//! Why it is strict: shares only grow through an agreement. When this node sees its list `L`
//! agreed, every live node of `L` ran `L` when it said so, and from then on each spends at
//! most its share under `L` until it in turn sees a later list agreed, since every list it
//! runs later keeps `L` among its bounds until then. So at every instant there is a list
//! under whose shares every node spends at most its own, and those sum to the limit.
//! (`tests/membership_model.rs` checks it against random histories.)
//!
//! A node that starts with no memory of an earlier list counts its own list as the one it
//! ran: a cluster started from one list spends its shares at once, as before. A node started
//! during a change is bounded by the lists it hears — until its own list is agreed, every
//! node passes on every list that bounds it ([`Lists::floors_to_send`]), so it learns the
//! running nodes' lists even from another new node. If it hears nobody, nothing bounds it:
//! start new nodes only while they can reach the running ones.

use levee_core::{NodeIdx, ReplicaSet, ReplicaSetError};

/// The most changes of its list a node has in flight (not yet agreed): the lists it ran
/// since travel in its `Membership` messages as floors (`levee_proto::MAX_FLOOR_LISTS`).
pub const MAX_UNAGREED: usize = levee_proto::MAX_FLOOR_LISTS;

/// A peer's part in a membership change, for `/v1/cluster`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerState {
    /// It has not (yet) said it runs this node's list.
    Joining,
    /// It runs this node's list.
    Active,
    /// It said it is leaving (`POST /admin/leave`): it owns no key and hands its rights over.
    Leaving,
    /// Removed from this node's list (a tombstone).
    Gone,
}

impl PeerState {
    /// The state's name in the API (`joining`, `active`, `leaving`, `gone`).
    pub fn as_str(self) -> &'static str {
        match self {
            PeerState::Joining => "joining",
            PeerState::Active => "active",
            PeerState::Leaving => "leaving",
            PeerState::Gone => "gone",
        }
    }
}

/// What a peer said of its lists.
#[derive(Debug, Clone)]
pub struct Report {
    /// The list it runs.
    pub list: ReplicaSet,
    /// The other lists that bounded its shares ([`Lists::floors_to_send`]).
    pub floors: Vec<ReplicaSet>,
    /// The positions of the nodes it knows are leaving ([`Lists::leaving_to_send`]).
    pub leaving: Vec<u16>,
}

/// The lists in play at one node.
#[derive(Debug, Clone)]
pub struct Lists {
    me: NodeIdx,
    current: ReplicaSet,
    /// The lists this node ran since its list was last agreed, oldest first.
    since_agreed: Vec<ReplicaSet>,
    /// By position in `current`: the list that node last said it runs, and the lists that
    /// still bounded its shares then.
    reported: Vec<Option<Report>>,
    /// This node's list was agreed since it last changed: the lists it ran before no longer
    /// bound its shares. (It stays set when a peer later reports another list: that list
    /// bounds the shares by itself, as a floor.)
    settled: bool,
    /// This node is leaving (`POST /admin/leave`): it owns no key and gives its rights away.
    leaving: bool,
}

impl Lists {
    /// A node that starts with `current` (its configuration's list) and has heard nobody.
    pub fn new(current: ReplicaSet, me: NodeIdx) -> Lists {
        let mut lists = Lists {
            me,
            reported: vec![None; current.len()],
            current,
            since_agreed: Vec::new(),
            settled: false,
            leaving: false,
        };
        lists.settle();
        lists
    }

    /// The list this node runs.
    pub fn current(&self) -> &ReplicaSet {
        &self.current
    }

    /// The lists this node ran since its list was last agreed, oldest first.
    pub fn since_agreed(&self) -> &[ReplicaSet] {
        &self.since_agreed
    }

    /// Whether every live node of this node's list says, in what it said last, that it runs
    /// it.
    pub fn agreed(&self) -> bool {
        self.current.nodes().all(|n| self.acknowledged(n))
    }

    /// The list as decisions use it: this node's list, bounded by every list it ran since
    /// its list was agreed and every list its peers said they run or are bounded by
    /// ([`ReplicaSet::with_floors`]).
    pub fn spending(&self) -> ReplicaSet {
        let floors = self.floors();
        if floors.is_empty() {
            self.current.clone()
        } else {
            self.current.with_floors(&floors)
        }
    }

    /// The lists that bound this node's shares besides its own, oldest of its own first.
    fn floors(&self) -> Vec<ReplicaSet> {
        let mine = self.current.digest();
        let mut floors: Vec<ReplicaSet> = Vec::new();
        let mut add = |list: &ReplicaSet| {
            if list.digest() != mine && !floors.iter().any(|f| f.digest() == list.digest()) {
                floors.push(list.clone());
            }
        };
        self.since_agreed.iter().for_each(&mut add);
        for n in self.current.positions() {
            if let Some(report) = &self.reported[usize::from(n.0)] {
                // A removed node spends nothing, but the lists it said are in play may still
                // be run by nodes that have not told this node themselves: they bound its
                // shares until its list is agreed.
                add(&report.list);
                report.floors.iter().for_each(&mut add);
            }
        }
        floors
    }

    /// Whether a list in play (a peer's, or one it said still bounds it) marks this node
    /// removed: it has been removed while it ran (frozen, or cut off, and thawed with its
    /// old list). It then admits nothing: what it holds beyond its share, rights its
    /// region-mates gave it of a day's quota say, is counted by its heir once the removal
    /// settles (`levee_core::rule::Bequest`), and would otherwise stay spendable here for the
    /// whole window (`levee cluster`: a removed monthly-quota owner, thawed, admitted for as
    /// long as it was asked).
    pub fn removes_me(&self) -> bool {
        let me = self.current.node_id(self.me);
        self.floors()
            .iter()
            .any(|f| f.node_by_id(me).is_some_and(|i| f.is_removed(i)))
    }

    /// The lists this node tells its peers still bound its shares (at most `limit`): none
    /// once its list was agreed (that list is then a bound every node keeps until it sees a
    /// later one agreed); until then every list that bounds its shares, its peers' included.
    /// A node that starts while a change settles may first hear a peer that started too, and
    /// knows the lists the running nodes still spend by only through that peer.
    pub fn floors_to_send(&self, limit: usize) -> Vec<ReplicaSet> {
        if self.settled {
            return Vec::new();
        }
        let mut floors = self.floors();
        floors.truncate(limit);
        floors
    }

    /// Whether this node's list was agreed since it last changed (see
    /// [`Lists::floors_to_send`]).
    pub fn settled(&self) -> bool {
        self.settled
    }

    /// This node's list changes to `next` (a reload). Refused, with nothing changed, unless
    /// `next` keeps every position of the current list ([`ReplicaSet::check_successor`]) and
    /// still holds this node, not removed.
    pub fn change(&mut self, next: ReplicaSet) -> Result<(), ReplicaSetError> {
        self.current.check_successor(&next)?;
        if next.is_removed(self.me) {
            return Err(ReplicaSetError::NotASuccessor(format!(
                "cluster.node[{}]: this node ({:?}) is removed in the new list: stop it instead (after POST /admin/leave)",
                self.me.0,
                next.node_id(self.me)
            )));
        }
        if next.digest() == self.current.digest() {
            return Ok(());
        }
        if self.since_agreed.len() >= MAX_UNAGREED {
            return Err(ReplicaSetError::NotASuccessor(format!(
                "cluster.node: {MAX_UNAGREED} changes of the node list are not agreed yet (is every node reachable and reloaded?): wait until GET /v1/cluster shows membership.agreed"
            )));
        }
        let previous = std::mem::replace(&mut self.current, next);
        self.since_agreed.push(previous);
        self.reported.resize(self.current.len(), None);
        self.settled = false;
        self.settle();
        Ok(())
    }

    /// `peer` says it runs `list`, its shares still bounded by `floors`, and knows the nodes
    /// at `leaving` are leaving. Returns whether [`Lists::spending`] may have changed.
    pub fn reported(
        &mut self,
        peer: NodeIdx,
        list: ReplicaSet,
        floors: Vec<ReplicaSet>,
        leaving: Vec<u16>,
    ) -> bool {
        if self.settled && self.current.is_removed(peer) {
            // Once this node's list is agreed, every live node keeps it as a bound: what a
            // removed node (thawed, say, and still running an older list) says bounds
            // nothing, and must not hold the others' shares down while it runs.
            return false;
        }
        let Some(slot) = self.reported.get_mut(usize::from(peer.0)) else {
            return false;
        };
        let digests = |l: &ReplicaSet, f: &[ReplicaSet]| {
            std::iter::once(l.digest())
                .chain(f.iter().map(ReplicaSet::digest))
                .collect::<Vec<u64>>()
        };
        if let Some(r) = slot
            .as_mut()
            .filter(|r| digests(&r.list, &r.floors) == digests(&list, &floors))
        {
            r.leaving = leaving;
            return false;
        }
        *slot = Some(Report {
            list,
            floors,
            leaving,
        });
        self.settle();
        true
    }

    /// A peer's part in the change.
    pub fn state(&self, peer: NodeIdx) -> PeerState {
        if self.current.is_removed(peer) {
            PeerState::Gone
        } else if self.is_leaving(peer) {
            PeerState::Leaving
        } else if self.acknowledged(peer) {
            PeerState::Active
        } else {
            PeerState::Joining
        }
    }

    /// Whether a live peer said, last, another list than this node's or lists that still
    /// bound its shares: its change has not settled, and it may wait for this node's word.
    pub fn peers_settling(&self) -> bool {
        let mine = self.current.digest();
        self.current.nodes().filter(|&n| n != self.me).any(|n| {
            self.report(n)
                .is_some_and(|r| r.list.digest() != mine || !r.floors.is_empty())
        })
    }

    /// What node `n` last said of its lists, if anything (and it still counts).
    pub fn report(&self, n: NodeIdx) -> Option<&Report> {
        self.reported.get(usize::from(n.0)).and_then(Option::as_ref)
    }

    /// This node starts leaving: it owns no key from now on, and tells its peers so.
    /// (Until it restarts: a node that starts again is not leaving.)
    pub fn leave(&mut self) {
        self.leaving = true;
    }

    /// Whether node `n` of the list is leaving: this node if it was told to leave, a peer if
    /// it said so of itself. A removed node is gone, not leaving.
    pub fn is_leaving(&self, n: NodeIdx) -> bool {
        if n == self.me {
            return self.leaving;
        }
        !self.current.is_removed(n)
            && self
                .reported
                .get(usize::from(n.0))
                .and_then(Option::as_ref)
                .is_some_and(|r| r.leaving.contains(&n.0))
    }

    /// The positions of the nodes this node knows are leaving, its own first when it is:
    /// what its `Membership` messages say.
    pub fn leaving_to_send(&self) -> Vec<u16> {
        let me = self.leaving.then_some(self.me.0);
        me.into_iter()
            .chain(
                self.current
                    .nodes()
                    .filter(|&n| n != self.me && self.is_leaving(n))
                    .map(|n| n.0),
            )
            .collect()
    }

    /// Whether this node leaves and every other node of its list that is `live` (heard
    /// within `suspect_after`) has said it knows: none of them routes a key to it or gives it
    /// rights as a key's owner any more. A node that is not heard is not waited for: it can
    /// give nothing meanwhile, and it hears of the leave, or of the removal, when it is heard
    /// again (what it gives the leaver before that is what a removal without leaving strands).
    pub fn leave_acknowledged(&self, live: impl Fn(NodeIdx) -> bool) -> bool {
        self.leaving
            && self
                .current
                .nodes()
                .filter(|&n| n != self.me && live(n))
                .all(|n| {
                    self.reported[usize::from(n.0)]
                        .as_ref()
                        .is_some_and(|r| r.leaving.contains(&self.me.0))
                })
    }

    fn acknowledged(&self, n: NodeIdx) -> bool {
        n == self.me
            || self.reported[usize::from(n.0)]
                .as_ref()
                .is_some_and(|r| r.list.digest() == self.current.digest())
    }

    /// Agreed once every live node of the list acknowledged it; the lists run before stop
    /// bounding the shares then.
    fn settle(&mut self) {
        if !self.settled && self.agreed() {
            self.settled = true;
            self.since_agreed.clear();
            // Removed nodes say nothing more: what they said bounds nothing once every live
            // node runs this list (each keeps it as a bound until it sees a later one agreed).
            for n in self.current.positions() {
                if self.current.is_removed(n) {
                    self.reported[usize::from(n.0)] = None;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use levee_core::{REMOVED, ReplicaSpec};

    fn list(nodes: &[(&str, &str, Option<u32>)]) -> ReplicaSet {
        let regions = [("eu".to_owned(), 1), ("us".to_owned(), 1)];
        let nodes: Vec<ReplicaSpec> = nodes
            .iter()
            .map(|&(id, region, weight)| ReplicaSpec {
                id: id.into(),
                region: region.into(),
                weight,
            })
            .collect();
        ReplicaSet::new(&regions, &nodes).unwrap()
    }

    /// eu-1 with every node of [`four`] running it.
    fn agreed_on_four() -> Lists {
        let mut eu1 = Lists::new(four(), NodeIdx(0));
        for n in 1..4 {
            eu1.reported(NodeIdx(n), four(), vec![], vec![]);
        }
        assert!(eu1.agreed());
        eu1
    }

    fn two() -> ReplicaSet {
        list(&[("eu-1", "eu", None), ("us-1", "us", None)])
    }

    fn four() -> ReplicaSet {
        list(&[
            ("eu-1", "eu", None),
            ("us-1", "us", None),
            ("eu-2", "eu", None),
            ("us-2", "us", None),
        ])
    }

    /// The first release's finding: new nodes started with a four-node list beside two nodes
    /// that run the two-node list spent their own shares too (1,200 admitted of 1,000). Now a
    /// new node that hears a member's list in which it has no place spends nothing.
    #[test]
    fn a_node_whose_list_the_others_do_not_run_spends_nothing_of_its_own() {
        let mut eu2 = Lists::new(four(), NodeIdx(2));
        assert_eq!(eu2.spending().split(1000), vec![250, 250, 250, 250]);
        assert!(eu2.reported(NodeIdx(0), two(), vec![], vec![]));
        assert_eq!(eu2.spending().split(1000), vec![250, 250, 0, 0]);
        assert!(!eu2.agreed());
        assert_eq!(eu2.state(NodeIdx(0)), PeerState::Joining);
    }

    #[test]
    fn a_grown_list_applies_once_every_node_of_it_runs_it() {
        let mut eu1 = Lists::new(two(), NodeIdx(0));
        eu1.reported(NodeIdx(1), two(), vec![], vec![]);
        assert!(eu1.agreed());
        assert_eq!(eu1.spending().split(1000), vec![500, 500]);
        eu1.change(four()).unwrap();
        assert!(!eu1.agreed());
        assert_eq!(
            eu1.spending().split(1000),
            vec![250, 250, 0, 0],
            "the smaller of the old and new shares"
        );
        eu1.reported(NodeIdx(1), four(), vec![], vec![]);
        eu1.reported(NodeIdx(2), four(), vec![], vec![]);
        assert!(!eu1.agreed(), "us-2 has not said it runs the list");
        assert_eq!(eu1.state(NodeIdx(3)), PeerState::Joining);
        eu1.reported(NodeIdx(3), four(), vec![], vec![]);
        assert!(eu1.agreed());
        assert_eq!(eu1.state(NodeIdx(3)), PeerState::Active);
        assert_eq!(eu1.spending().split(1000), vec![250, 250, 250, 250]);
        assert!(!eu1.spending().is_bounded());
    }

    #[test]
    fn a_removed_node_is_gone_and_does_not_hold_agreement_back() {
        let mut eu1 = agreed_on_four();
        let shrunk = list(&[
            ("eu-1", "eu", None),
            ("us-1", "us", None),
            ("eu-2", "eu", REMOVED),
            ("us-2", "us", REMOVED),
        ]);
        eu1.change(shrunk.clone()).unwrap();
        assert_eq!(eu1.state(NodeIdx(2)), PeerState::Gone);
        assert_eq!(eu1.spending().split(1000), vec![250, 250, 0, 0]);
        eu1.reported(NodeIdx(1), shrunk, vec![], vec![]);
        assert!(eu1.agreed(), "removed nodes are not waited for");
        assert_eq!(eu1.spending().split(1000), vec![500, 500, 0, 0]);
    }

    /// The same node, seen from itself: once it hears a peer's list in which it is removed,
    /// it admits nothing (what it still holds is its heir's to count), whatever its own
    /// list says.
    #[test]
    fn a_removed_node_that_hears_of_its_removal_knows_it() {
        let shrunk = list(&[
            ("eu-1", "eu", None),
            ("us-1", "us", None),
            ("eu-2", "eu", None),
            ("us-2", "us", REMOVED),
        ]);
        let mut us2 = Lists::new(four(), NodeIdx(3));
        assert!(!us2.removes_me());
        us2.reported(NodeIdx(0), four(), vec![], vec![]);
        assert!(!us2.removes_me(), "a peer on the same list");
        us2.reported(NodeIdx(1), shrunk.clone(), vec![], vec![]);
        assert!(us2.removes_me());
        let mut eu2 = Lists::new(four(), NodeIdx(2));
        eu2.reported(NodeIdx(1), shrunk, vec![], vec![]);
        assert!(!eu2.removes_me(), "another node's removal");
    }

    /// A node removed while frozen, thawed after the others agreed: it still runs the old
    /// list and says so, but that no longer bounds the others.
    #[test]
    fn once_agreed_a_removed_node_that_speaks_again_bounds_nothing() {
        let mut eu1 = agreed_on_four();
        let shrunk = list(&[
            ("eu-1", "eu", None),
            ("us-1", "us", None),
            ("eu-2", "eu", None),
            ("us-2", "us", REMOVED),
        ]);
        eu1.change(shrunk.clone()).unwrap();
        eu1.reported(NodeIdx(1), shrunk.clone(), vec![], vec![]);
        eu1.reported(NodeIdx(2), shrunk, vec![], vec![]);
        assert!(eu1.agreed());
        assert_eq!(eu1.spending().split(1000), vec![250, 500, 250, 0]);
        assert!(!eu1.reported(NodeIdx(3), four(), vec![], vec![]));
        assert_eq!(eu1.spending().split(1000), vec![250, 500, 250, 0]);
    }

    #[test]
    fn a_node_is_leaving_when_it_says_so_of_itself_and_done_once_every_live_peer_knows() {
        // eu-2 (position 2) leaves; eu-1 hears it.
        let mut eu2 = Lists::new(four(), NodeIdx(2));
        for n in [0, 1, 3] {
            eu2.reported(NodeIdx(n), four(), vec![], vec![]);
        }
        assert!(!eu2.leave_acknowledged(|_| true), "not leaving yet");
        eu2.leave();
        assert_eq!(eu2.leaving_to_send(), vec![2]);
        let mut eu1 = agreed_on_four();
        // What another node says of a third does not make the third leave.
        eu1.reported(NodeIdx(1), four(), vec![], vec![2]);
        assert!(!eu1.is_leaving(NodeIdx(2)));
        eu1.reported(NodeIdx(2), four(), vec![], eu2.leaving_to_send());
        assert!(eu1.is_leaving(NodeIdx(2)));
        assert_eq!(eu1.state(NodeIdx(2)), PeerState::Leaving);
        assert_eq!(eu1.leaving_to_send(), vec![2], "eu-1 acknowledges it");
        assert!(eu1.agreed(), "leaving changes no list");
        // eu-2 is done once every live peer said it knows.
        eu2.reported(NodeIdx(0), four(), vec![], eu1.leaving_to_send());
        eu2.reported(NodeIdx(1), four(), vec![], vec![2]);
        assert!(
            !eu2.leave_acknowledged(|_| true),
            "us-2 has not said it knows"
        );
        assert!(
            eu2.leave_acknowledged(|n| n != NodeIdx(3)),
            "us-2 is not waited for while it is not heard"
        );
        eu2.reported(NodeIdx(3), four(), vec![], vec![2]);
        assert!(eu2.leave_acknowledged(|_| true));
        // Once removed it is gone, not leaving, and no longer waited for.
        let removed = list(&[
            ("eu-1", "eu", None),
            ("us-1", "us", None),
            ("eu-2", "eu", REMOVED),
            ("us-2", "us", None),
        ]);
        eu1.change(removed).unwrap();
        assert_eq!(eu1.state(NodeIdx(2)), PeerState::Gone);
        assert!(!eu1.is_leaving(NodeIdx(2)));
        assert!(eu1.leaving_to_send().is_empty());
    }

    #[test]
    fn a_list_that_moves_positions_or_removes_this_node_is_refused_and_nothing_changes() {
        let mut eu1 = Lists::new(four(), NodeIdx(0));
        assert!(eu1.change(two()).is_err());
        let without_me = list(&[
            ("eu-1", "eu", REMOVED),
            ("us-1", "us", None),
            ("eu-2", "eu", None),
            ("us-2", "us", None),
        ]);
        let err = eu1.change(without_me).unwrap_err().to_string();
        assert!(err.contains("this node (\"eu-1\") is removed"), "{err}");
        assert_eq!(eu1.current().digest(), four().digest());
    }
}
