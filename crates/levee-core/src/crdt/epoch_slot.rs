//! What one epoch counts: every node's grow-only tallies, and the rights transferred for it.

use serde::{Deserialize, Serialize};

use super::lattice::Lattice;
use super::node_map::NodeMap;
use super::transfers::TransferMatrix;

/// One node's counts in one epoch. Each field is a grow-only counter.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Tally {
    /// Tokens admitted.
    pub consumed: u64,
    /// Tokens given back. A node never refunds more than it consumed.
    pub refunded: u64,
    /// Tokens asked for, admitted or not: the demand the escrow rebalances toward.
    pub requested: u64,
}

impl Tally {
    /// Consumption net of refunds.
    #[inline]
    pub fn net(&self) -> u64 {
        self.consumed - self.refunded.min(self.consumed)
    }
}

impl Lattice for Tally {
    #[inline]
    fn join(&mut self, other: &Tally) -> bool {
        let a = self.consumed.join(&other.consumed);
        let b = self.refunded.join(&other.refunded);
        let c = self.requested.join(&other.requested);
        a | b | c
    }
}

/// Counters and per-epoch rights of one epoch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpochSlot {
    /// The epoch number (window, period or refill period).
    pub epoch: u64,
    /// Per-node counts.
    pub tallies: NodeMap<Tally>,
    /// Rights transferred for this epoch (fixed windows and quotas).
    pub transfers: TransferMatrix,
}

impl EpochSlot {
    /// An empty slot for `epoch`.
    pub fn new(epoch: u64) -> EpochSlot {
        EpochSlot {
            epoch,
            tallies: NodeMap::default(),
            transfers: TransferMatrix::default(),
        }
    }

    /// Net consumption of every node (saturating at `u64::MAX`: tallies come from peers).
    #[inline]
    pub fn net_total(&self) -> u64 {
        self.tallies
            .iter()
            .fold(0u64, |sum, (_, t)| sum.saturating_add(t.net()))
    }
}

impl Lattice for EpochSlot {
    fn join(&mut self, other: &EpochSlot) -> bool {
        debug_assert_eq!(self.epoch, other.epoch);
        let a = self.tallies.join(&other.tallies);
        let b = self.transfers.join(&other.transfers);
        a | b
    }
}
