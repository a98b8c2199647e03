//! What a removed node's region-mate takes over of a long window's rights.
//!
//! A node removed from the list (dead, or it would have left with `POST /admin/leave`) has
//! no share from then on, and its region-mates' shares grow only for windows that start
//! after the next boundary ([`Rule::bind_no_higher`]): for a day's or a month's quota, the
//! rights it held of the current and the next period would be out of service for up to two
//! periods. So one region-mate, its *heir*, counts them as its own for those windows: the
//! removed node's share under the list before, plus what it received, less what it gave and
//! what it used, as the heir's replicated state of the key shows them. Spent once: the
//! removed node is dead (removal says so), and every other node holds only its own rights.
//!
//! But only once the heir's state is the removed node's last: a batch the dead node sent just
//! before it died may have reached a peer (which spends the rights it was given) and not the
//! heir, and nothing repairs that by itself while the key stays busy. So a bequest starts
//! *unsettled* and counts for nothing; the heir pulls the whole state of every live peer after
//! the removal (`levee_cluster`'s `Event::BequestsSettled`), merges it, and only then counts
//! what its bequests hold ([`Rule::settle_bequests`]). (`levee-sim --scenario remove-dead-day`
//! found this: 2 windows of 40 runs above a day's limit by 2–3 before the pull, with a cut
//! between the heir's region and a peer that had the dead node's last gifts.)
//!
//! Only for windows longer than the escrow's horizon: a second's or a minute's rights come
//! back with the next windows anyway.

use crate::crdt::TransferMatrix;
use crate::escrow::HORIZON_MS;
use crate::replica::{NodeIdx, ReplicaSet};
use crate::rights::holdings;
use crate::rule::{Algorithm, Rule};
use crate::time::Millis;

/// A removed node's rights of the windows before its region-mates' grown shares apply,
/// counted by its heir.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bequest {
    /// The removed node.
    pub from: NodeIdx,
    /// The region-mate that counts its rights: the first of its region in list order that
    /// is not removed.
    pub heir: NodeIdx,
    /// The removed node's share under the list before its removal.
    pub share: u64,
    /// Windows that start at or after this have the grown shares; the bequest serves only
    /// those that start before.
    pub until: Millis,
    /// What the heir keeps back: how much the other nodes' shares grow by the change. A
    /// node that restarts binds its rules to the agreed list in full, so it may spend its
    /// grown share at once, in the windows the bequest serves.
    pub withheld: u64,
    /// Whether the heir has since merged every live peer's whole state: until then the
    /// bequest counts for nothing.
    pub settled: bool,
}

impl Bequest {
    /// What the heir takes over in a window that starts at `start`, from the window's
    /// transfer matrix and the removed node's net usage of it.
    #[inline]
    pub(crate) fn left(&self, start: Millis, transfers: &TransferMatrix, used: u64) -> u64 {
        if !self.settled || start >= self.until {
            return 0;
        }
        holdings(self.share, transfers, self.from)
            .saturating_sub(used)
            .saturating_sub(self.withheld)
    }
}

/// Whether an algorithm's removed nodes leave bequests: rights per epoch, epochs longer
/// than the escrow's horizon (at `now`: a calendar month's length varies).
fn bequeaths(algorithm: &Algorithm, now: Millis) -> bool {
    algorithm.rights_per_epoch() && algorithm.epoch_len(now) > HORIZON_MS
}

impl Rule {
    /// The bequests of the nodes `removed` count from now: this node has merged every live
    /// peer's whole state since they were removed.
    pub fn settle_bequests(&mut self, removed: &[NodeIdx]) {
        for b in &mut self.bequests {
            b.settled |= removed.contains(&b.from);
        }
    }

    /// Whether a bequest waits for this node to merge its peers' states.
    pub fn has_unsettled_bequests(&self) -> bool {
        self.bequests.iter().any(|b| !b.settled)
    }

    /// The bequests of this rule after it was bound to `replicas` from the split `before`
    /// (the rule's bequests before that already in `self.bequests`): those still running at
    /// `now` whose heir is still listed, and one for each node removed by this change that had
    /// a share, if a region-mate is left to take it over. It serves until a share that grows
    /// by this change may apply ([`Algorithm::shares_may_grow_at`]): the grown shares wait
    /// for the list to be agreed (until then the lists before bound them), so they apply then
    /// or later, never to a window the bequest serves.
    pub(crate) fn bequeath(&mut self, before: &[u64], replicas: &ReplicaSet, now: Millis) {
        self.bequests
            .retain(|b| now < b.until && !replicas.is_removed(b.heir));
        if !bequeaths(&self.algorithm, now) {
            return;
        }
        let until = self.algorithm.shares_may_grow_at(now);
        // What each node's share grows to once the list is agreed (no floor bounds it then).
        let mut full: Option<Vec<u64>> = None;
        for from in replicas.positions() {
            let share = before.get(usize::from(from.0)).copied().unwrap_or(0);
            if share == 0 || !replicas.is_removed(from) {
                continue;
            }
            let region = replicas.region_of(from);
            let heir = replicas
                .region_nodes(region)
                .iter()
                .copied()
                .find(|&m| !replicas.is_removed(m));
            if let Some(heir) = heir {
                let full = full.get_or_insert_with(|| {
                    replicas.without_floors().split(self.algorithm.capacity())
                });
                let withheld = replicas
                    .nodes()
                    .filter(|&m| m != heir)
                    .map(|m| {
                        let i = usize::from(m.0);
                        full.get(i)
                            .copied()
                            .unwrap_or(0)
                            .saturating_sub(before.get(i).copied().unwrap_or(0))
                    })
                    .fold(0u64, u64::saturating_add);
                self.bequests.push(Bequest {
                    from,
                    heir,
                    share,
                    until,
                    withheld,
                    settled: false,
                });
            }
        }
    }
}
