//! The scopes rights are held in (an epoch, or the continuous holdings) and how a peer's
//! clock sees an epoch: the current and next epochs, the one that just ended here, and what
//! remains of each on a peer's clock when rights given now reach it.

use crate::crdt::{KeyCrdt, TransferMatrix};
use crate::replica::NodeIdx;
use crate::rights::inherited;
use crate::rule::{Algorithm, Target};
use crate::time::Millis;
use smallvec::{SmallVec, smallvec};

use super::{MAX_CLOCK_SKEW_MS, PeerClock};

/// One scope of rights: an epoch (fixed windows, quotas) or the continuous holdings.
#[derive(Clone, Copy)]
pub(crate) enum Scope {
    Epoch {
        epoch: u64,
        remaining_ms: Millis,
        len_ms: Millis,
        /// How much longer than `remaining_ms` the epoch may still run on other nodes'
        /// clocks: non-zero only for an epoch that has just ended here.
        late_ms: Millis,
    },
    Continuous,
}

impl Scope {
    /// What `node` takes over in this scope as a removed node's heir
    /// ([`crate::rule::Bequest`]): only epochs hold bequests.
    pub(crate) fn inherited(
        self,
        crdt: &KeyCrdt,
        target: &Target<'_>,
        algo: &Algorithm,
        node: NodeIdx,
    ) -> u64 {
        match self {
            Scope::Epoch { epoch, .. } => {
                inherited(target, crdt.slot(epoch), node, algo.epoch_start(epoch))
            }
            Scope::Continuous => 0,
        }
    }

    /// The scope as a peer sees it, for rights given to it now: nothing of the epoch if it
    /// ends on the peer's clock before they reach it; otherwise what remains on its clock or
    /// on this node's, whichever is longer (a peer ahead is not judged to need less: demand
    /// that moves to it runs ahead of its forecast, `levee-sim --seed 901 --scenario
    /// hot-region`). A peer whose clock is unknown is taken to be in step, except that an
    /// epoch that ended here may run `late_ms` more there (a peer behind).
    pub(super) fn for_peer(self, algo: &Algorithm, now: Millis, clock: Option<PeerClock>) -> Scope {
        match (self, clock) {
            (
                Scope::Epoch {
                    epoch,
                    remaining_ms,
                    len_ms,
                    late_ms,
                },
                None,
            ) => Scope::Epoch {
                epoch,
                remaining_ms: remaining_ms + late_ms,
                len_ms,
                late_ms: 0,
            },
            (
                Scope::Epoch {
                    epoch,
                    remaining_ms: mine,
                    len_ms,
                    ..
                },
                Some(c),
            ) => {
                let theirs = i128::from(now) + i128::from(c.offset_ms);
                let left = i128::from(algo.epoch_end(epoch)) - theirs;
                let remaining_ms = if left <= i128::from(c.one_way_ms) {
                    0
                } else {
                    left.max(i128::from(mine)).min(i128::from(len_ms)) as Millis
                };
                Scope::Epoch {
                    epoch,
                    remaining_ms,
                    len_ms,
                    late_ms: 0,
                }
            }
            (Scope::Continuous, _) => Scope::Continuous,
        }
    }
}

/// The scopes an algorithm holds rights in at `now`: the current and the next epoch, or the
/// continuous holdings. Inline (no allocation): every rebalanced key asks for them.
pub(crate) fn scopes(algo: &Algorithm, now: Millis) -> SmallVec<[Scope; 2]> {
    if algo.rights_per_epoch() {
        let e = algo.epoch(now);
        let end = algo.epoch_end(e);
        smallvec![
            Scope::Epoch {
                epoch: e,
                remaining_ms: end - now,
                len_ms: algo.epoch_len(now),
                late_ms: 0,
            },
            Scope::Epoch {
                epoch: e + 1,
                remaining_ms: algo.epoch_len(end),
                len_ms: algo.epoch_len(end),
                late_ms: 0,
            },
        ]
    } else {
        smallvec![Scope::Continuous]
    }
}

/// The epoch that ended on this node's clock less than [`MAX_CLOCK_SKEW_MS`] ago, which
/// peers whose clocks are behind may still be admitting in: this node needs nothing more of
/// it (it decides by its own clock), and gives what it did not use to peers whose forecast
/// says they still need it. None if it began before `known_from`: before the shares grew
/// ([`crate::Rule::grown_from`]: it was spent under smaller ones, which this node's holdings
/// by the current split would overstate), or before this process started (what it consumed
/// before a crash may be lost).
pub(super) fn just_ended(algo: &Algorithm, now: Millis, known_from: Millis) -> Option<Scope> {
    if !algo.rights_per_epoch() {
        return None;
    }
    let e = algo.epoch(now);
    let since = now.saturating_sub(algo.epoch_start(e));
    if e == 0 || since >= MAX_CLOCK_SKEW_MS {
        return None;
    }
    let start = algo.epoch_start(e - 1);
    if known_from > start {
        return None;
    }
    Some(Scope::Epoch {
        epoch: e - 1,
        remaining_ms: 0,
        len_ms: algo.epoch_len(start),
        late_ms: MAX_CLOCK_SKEW_MS - since,
    })
}

/// The transfer matrix of `scope`, if the key holds it.
pub(crate) fn matrix(crdt: &KeyCrdt, scope: Scope) -> Option<&TransferMatrix> {
    match scope {
        Scope::Epoch { epoch, .. } => crdt.slot(epoch).map(|s| &s.transfers),
        Scope::Continuous => Some(&crdt.holdings),
    }
}
