//! The replicated state of one key, composed of the lattices beside this file.

use serde::{Deserialize, Serialize};
use thin_vec::ThinVec;

use crate::replica::NodeIdx;

use super::claims::Claims;
use super::epoch_slot::EpochSlot;
use super::lattice::Lattice;
use super::node_map::NodeMap;
use super::registers::{BucketReg, DemandReg};
use super::transfers::TransferMatrix;

/// Up to this many slots are searched one by one (see `KeyCrdt::position`).
const LINEAR_SEARCH_MAX: usize = 8;

/// The replicated state of one key (of one rule, and class bucket where classes are
/// separate). A delta is a value of the same type holding only some entries.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyCrdt {
    /// Per-epoch slots, ascending by epoch.
    pub slots: ThinVec<EpochSlot>,
    /// Continuous rights transfers (token buckets and sliding windows).
    pub holdings: TransferMatrix,
    /// Token-bucket levels per node.
    pub buckets: NodeMap<BucketReg>,
    /// Demand forecasts per node.
    pub demand: NodeMap<DemandReg>,
    /// The removed optimistic mode's claims: always empty, kept for wire version 2 and
    /// snapshots (a peer's are dropped on merge).
    pub claims: Claims,
}

impl KeyCrdt {
    /// The slot of `epoch`, if held.
    #[inline]
    pub fn slot(&self, epoch: u64) -> Option<&EpochSlot> {
        self.position(epoch).map(|i| &self.slots[i])
    }

    /// Where the slot of `epoch` is. A handful of slots (windows, quotas) are searched from
    /// the newest; a sliding log's thousands, kept ascending, by bisection.
    #[inline]
    fn position(&self, epoch: u64) -> Option<usize> {
        if self.slots.len() <= LINEAR_SEARCH_MAX {
            self.slots.iter().rposition(|s| s.epoch == epoch)
        } else {
            self.slots.binary_search_by_key(&epoch, |s| s.epoch).ok()
        }
    }

    /// The slot of `epoch`, created empty if missing.
    #[inline]
    pub fn slot_mut(&mut self, epoch: u64) -> &mut EpochSlot {
        let pos = match self.position(epoch) {
            Some(i) => i,
            None => {
                let i = self.slots.partition_point(|s| s.epoch < epoch);
                self.slots.reserve_exact(1);
                self.slots.insert(i, EpochSlot::new(epoch));
                i
            }
        };
        &mut self.slots[pos]
    }

    /// Drops slots outside `[oldest, newest]`. Past epochs are kept only for a bounded time.
    pub fn retain_epochs(&mut self, oldest: u64, newest: u64) {
        self.slots
            .retain(|s| s.epoch >= oldest && s.epoch <= newest);
        self.claims.retain_epochs(oldest, newest);
    }

    /// What this view says was consumed: per epoch (oldest first), every node's tokens
    /// consumed net of refunds (ascending by node, nodes with none left out; epochs with none
    /// left out). Two views with the same consumption answer `/v1/usage` alike, whatever
    /// their rights bookkeeping and request tallies say.
    pub fn consumption(&self) -> Vec<(u64, Vec<(NodeIdx, u64)>)> {
        let mut out: Vec<(u64, Vec<(NodeIdx, u64)>)> = self
            .slots
            .iter()
            .map(|slot| {
                let mut nodes: Vec<(NodeIdx, u64)> = slot
                    .tallies
                    .iter()
                    .map(|(n, t)| (n, t.net()))
                    .filter(|&(_, net)| net > 0)
                    .collect();
                nodes.sort_unstable();
                (slot.epoch, nodes)
            })
            .filter(|(_, nodes)| !nodes.is_empty())
            .collect();
        out.sort_unstable();
        out
    }

    /// Whether the state holds no entry at all.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
            && self.holdings.is_empty()
            && self.buckets.is_empty()
            && self.demand.is_empty()
            && self.claims.is_empty()
    }

    /// The highest node index any entry names (to check a remote delta against the replica
    /// set before it is merged).
    pub fn max_node(&self) -> Option<NodeIdx> {
        let slots = self.slots.iter().flat_map(|s| {
            s.tallies
                .iter()
                .map(|(n, _)| n)
                .chain(s.transfers.cells().iter().flat_map(|c| [c.from, c.to]))
        });
        let holdings = self.holdings.cells().iter().flat_map(|c| [c.from, c.to]);
        slots
            .chain(holdings)
            .chain(self.buckets.iter().map(|(n, _)| n))
            .chain(self.demand.iter().map(|(n, _)| n))
            .chain(self.claims.iter().map(|c| c.node))
            .max()
    }
}

impl Lattice for KeyCrdt {
    fn join(&mut self, other: &KeyCrdt) -> bool {
        let mut changed = false;
        for s in &other.slots {
            changed |= self.slot_mut(s.epoch).join(s);
        }
        changed |= self.holdings.join(&other.holdings);
        changed |= self.buckets.join(&other.buckets);
        changed |= self.demand.join(&other.demand);
        changed |= self.claims.join(&other.claims);
        changed
    }
}
