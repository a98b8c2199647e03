//! The replicated state of one key: state-based CRDTs whose join is a pointwise maximum.
//!
//! * [`Tally`]: per node and epoch, three grow-only counters (consumed, refunded, requested).
//!   Consumed and refunded together form a PN counter; requested is the demand signal,
//!   denied requests included.
//! * [`TransferMatrix`]: the escrow's grow-only matrix `T[from][to]` of rights given away.
//!   Only `from` ever increments its row.
//! * [`BucketReg`] and [`DemandReg`]: single-writer registers (a node's token-bucket level and
//!   its demand forecast), ordered by a sequence number the writer increments.
//! * [`Claims`]: optimistic mode's per-node, per-epoch claims — a round counter and a ceiling,
//!   both grow-only within the epoch and written only by their node.
//!
//! [`KeyCrdt::join`] is commutative, associative and idempotent; deltas are sub-states of
//! absolute values, so applying them in any order, duplicated, or after a loss repaired by a
//! full-state join, converges to the same state. Nothing here knows about time.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use smallvec::SmallVec;
use thin_vec::ThinVec;

use crate::replica::NodeIdx;

/// A join-semilattice: `join` moves `self` to the least upper bound of both.
pub trait Lattice {
    /// Joins `other` into `self`; returns whether `self` changed.
    fn join(&mut self, other: &Self) -> bool;
}

impl Lattice for u64 {
    #[inline]
    fn join(&mut self, other: &u64) -> bool {
        if *other > *self {
            *self = *other;
            true
        } else {
            false
        }
    }
}

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

/// A single-writer register: a node's token-bucket sub-bucket as it last wrote it.
///
/// Ordered by `(seq, at, level_nt)`, so two writes with the same sequence number (a node
/// that restarted before learning its old sequence) still join deterministically.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct BucketReg {
    /// The writer's sequence number.
    pub seq: u64,
    /// When the level was taken (the writer's clock, ms).
    pub at: u64,
    /// The level in nanotokens at `at`; negative when an optimistic node overdrew.
    pub level_nt: i64,
}

/// A single-writer register: a node's forecast of its own demand for a key.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct DemandReg {
    /// The writer's sequence number.
    pub seq: u64,
    /// Forecast demand in tokens per epoch (window, period or refill period).
    pub forecast: u64,
    /// Rights the writer has seen transferred to it (continuous rights), so donors can bound
    /// what is still in flight towards it.
    pub received: u64,
}

macro_rules! register_lattice {
    ($t:ty) => {
        impl Lattice for $t {
            #[inline]
            fn join(&mut self, other: &$t) -> bool {
                if *other > *self {
                    *self = *other;
                    true
                } else {
                    false
                }
            }
        }
    };
}
register_lattice!(BucketReg);
register_lattice!(DemandReg);

/// Sparse per-node entries, sorted by node: only nodes that ever wrote have an entry.
///
/// The first entry is held inline: most keys have one writer (the node that decides for
/// them), and a key's state then needs no allocation of its own for it. On the wire it is a
/// plain sequence, as a `Vec` is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeMap<V> {
    entries: SmallVec<[(NodeIdx, V); 1]>,
}

impl<V> Default for NodeMap<V> {
    fn default() -> Self {
        NodeMap {
            entries: SmallVec::new(),
        }
    }
}

impl<V: Serialize> Serialize for NodeMap<V> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.entries.as_slice().serialize(s)
    }
}

impl<'de, V: Deserialize<'de>> Deserialize<'de> for NodeMap<V> {
    /// Decoded through `Vec`, whose decoder does not trust a sequence's announced length for
    /// its first allocation (untrusted input may announce any length).
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let entries = Vec::<(NodeIdx, V)>::deserialize(d)?;
        Ok(NodeMap {
            entries: SmallVec::from_vec(entries),
        })
    }
}

impl<V: Lattice + Default + Clone> NodeMap<V> {
    /// The entry of `node`, if any.
    #[inline]
    pub fn get(&self, node: NodeIdx) -> Option<&V> {
        self.entries
            .iter()
            .find(|(n, _)| *n == node)
            .map(|(_, v)| v)
    }

    /// The entry of `node`, created empty if missing.
    #[inline]
    pub fn entry(&mut self, node: NodeIdx) -> &mut V {
        let pos = match self.entries.binary_search_by_key(&node, |(n, _)| *n) {
            Ok(i) => i,
            Err(i) => {
                // Grow one entry at a time: most keys have one or a few writers, and the
                // default doubling would reserve four.
                self.entries.reserve_exact(1);
                self.entries.insert(i, (node, V::default()));
                i
            }
        };
        &mut self.entries[pos].1
    }

    /// Every entry, by node.
    pub fn iter(&self) -> impl Iterator<Item = (NodeIdx, &V)> {
        self.entries.iter().map(|(n, v)| (*n, v))
    }

    /// Number of nodes with an entry.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no node has an entry.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

impl<V: Lattice + Default + Clone> Lattice for NodeMap<V> {
    fn join(&mut self, other: &NodeMap<V>) -> bool {
        let mut changed = false;
        for (n, v) in &other.entries {
            changed |= self.entry(*n).join(v);
        }
        changed
    }
}

/// One cell `T[from][to]` of a transfer matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Transfer {
    /// The donor; the only node that ever increments this cell.
    pub from: NodeIdx,
    /// The recipient.
    pub to: NodeIdx,
    /// Rights given so far (grow-only).
    pub units: u64,
}

/// The escrow's grow-only transfer matrix, sparse, sorted by `(from, to)`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransferMatrix {
    cells: ThinVec<Transfer>,
}

impl TransferMatrix {
    /// Rights `from` has given `to`.
    pub fn get(&self, from: NodeIdx, to: NodeIdx) -> u64 {
        self.cells
            .iter()
            .find(|c| c.from == from && c.to == to)
            .map_or(0, |c| c.units)
    }

    /// Everything `node` has given away.
    #[inline]
    pub fn given_by(&self, node: NodeIdx) -> u64 {
        self.cells
            .iter()
            .filter(|c| c.from == node)
            .map(|c| c.units)
            .sum()
    }

    /// Everything `node` has received.
    #[inline]
    pub fn received_by(&self, node: NodeIdx) -> u64 {
        self.cells
            .iter()
            .filter(|c| c.to == node)
            .map(|c| c.units)
            .sum()
    }

    /// Net rights moved to `node`: received minus given.
    #[inline]
    pub fn net(&self, node: NodeIdx) -> i128 {
        let mut net = 0i128;
        for c in &self.cells {
            if c.to == node {
                net += i128::from(c.units);
            }
            if c.from == node {
                net -= i128::from(c.units);
            }
        }
        net
    }

    /// Records that `from` gives `units` more to `to`. Only `from` may call this for its row.
    pub fn give(&mut self, from: NodeIdx, to: NodeIdx, units: u64) {
        if units == 0 || from == to {
            return;
        }
        self.raise(Transfer {
            from,
            to,
            units: self.get(from, to) + units,
        });
    }

    fn raise(&mut self, cell: Transfer) -> bool {
        match self
            .cells
            .binary_search_by_key(&(cell.from, cell.to), |c| (c.from, c.to))
        {
            Ok(i) => self.cells[i].units.join(&cell.units),
            Err(i) => {
                self.cells.reserve_exact(1);
                self.cells.insert(i, cell);
                true
            }
        }
    }

    /// Every cell.
    pub fn cells(&self) -> &[Transfer] {
        &self.cells
    }

    /// The cells of `from`'s row: what a donor gossips.
    pub fn row(&self, from: NodeIdx) -> impl Iterator<Item = &Transfer> {
        self.cells.iter().filter(move |c| c.from == from)
    }

    /// Whether the matrix has no cell.
    pub fn is_empty(&self) -> bool {
        self.cells.is_empty()
    }
}

impl Lattice for TransferMatrix {
    fn join(&mut self, other: &TransferMatrix) -> bool {
        let mut changed = false;
        for c in &other.cells {
            changed |= self.raise(*c);
        }
        changed
    }
}

/// One node's claim in one epoch (optimistic mode, fixed windows and quotas): the most it
/// may admit in the epoch, and how far it has come in the claim rounds. Written only by
/// `node`; both counters only grow within the epoch, so the join is a pointwise maximum.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Claim {
    /// The epoch claimed in.
    pub epoch: u64,
    /// The writer.
    pub node: NodeIdx,
    /// `2 × round + passive`: the writer's claim round, and whether it promised not to raise
    /// its ceiling in the next round (`1`).
    pub step: u64,
    /// The most the node may admit in the epoch (tokens).
    pub ceiling: u64,
}

impl Claim {
    /// The claim round.
    #[inline]
    pub fn round(&self) -> u64 {
        self.step / 2
    }

    /// Whether the writer promised not to raise in round `round() + 1`.
    #[inline]
    pub fn passive(&self) -> bool {
        self.step % 2 == 1
    }
}

/// Every node's claims, sparse, sorted by `(epoch, node)`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    entries: ThinVec<Claim>,
}

impl Claims {
    /// The claim of `node` in `epoch`, if any.
    #[inline]
    pub fn get(&self, epoch: u64, node: NodeIdx) -> Option<&Claim> {
        self.entries
            .binary_search_by_key(&(epoch, node), |c| (c.epoch, c.node))
            .ok()
            .map(|i| &self.entries[i])
    }

    /// The claims of `epoch`, by node.
    pub fn in_epoch(&self, epoch: u64) -> impl Iterator<Item = &Claim> {
        self.entries.iter().filter(move |c| c.epoch == epoch)
    }

    /// Every claim.
    pub fn iter(&self) -> impl Iterator<Item = &Claim> {
        self.entries.iter()
    }

    /// Raises the claim of `(c.epoch, c.node)` to at least `c`, field by field; returns whether
    /// it changed.
    pub fn raise(&mut self, c: Claim) -> bool {
        match self
            .entries
            .binary_search_by_key(&(c.epoch, c.node), |e| (e.epoch, e.node))
        {
            Ok(i) => {
                let e = &mut self.entries[i];
                let a = e.step.join(&c.step);
                let b = e.ceiling.join(&c.ceiling);
                a | b
            }
            Err(i) => {
                self.entries.reserve_exact(1);
                self.entries.insert(i, c);
                true
            }
        }
    }

    /// Drops claims of epochs outside `[oldest, newest]`.
    pub fn retain_epochs(&mut self, oldest: u64, newest: u64) {
        self.entries
            .retain(|c| c.epoch >= oldest && c.epoch <= newest);
    }

    /// Whether there is no claim.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

impl Lattice for Claims {
    fn join(&mut self, other: &Claims) -> bool {
        let mut changed = false;
        for c in &other.entries {
            changed |= self.raise(*c);
        }
        changed
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

    /// Net consumption of every node.
    #[inline]
    pub fn net_total(&self) -> u64 {
        self.tallies.iter().map(|(_, t)| t.net()).sum()
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
    /// Optimistic mode's claims per node and epoch (empty in strict mode).
    pub claims: Claims,
}

/// FNV-1a, fed field by field: stable across platforms, processes and versions.
struct Fnv(u64);

impl Fnv {
    fn u64(&mut self, v: u64) {
        for b in v.to_le_bytes() {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
}

impl KeyCrdt {
    /// A stable hash of the state, ignoring slots of epochs below `oldest_epoch` (which nodes
    /// prune at slightly different times). Two nodes whose states joined the same entries have
    /// the same fingerprint; anti-entropy compares fingerprints to find what differs.
    pub fn fingerprint(&self, oldest_epoch: u64) -> u64 {
        let mut h = Fnv(0xcbf2_9ce4_8422_2325);
        for s in self.slots.iter().filter(|s| s.epoch >= oldest_epoch) {
            h.u64(s.epoch);
            for (n, t) in s.tallies.iter() {
                h.u64(u64::from(n.0));
                h.u64(t.consumed);
                h.u64(t.refunded);
                h.u64(t.requested);
            }
            for c in s.transfers.cells() {
                h.u64(u64::from(c.from.0) << 16 | u64::from(c.to.0));
                h.u64(c.units);
            }
        }
        h.u64(u64::MAX);
        for c in self.holdings.cells() {
            h.u64(u64::from(c.from.0) << 16 | u64::from(c.to.0));
            h.u64(c.units);
        }
        h.u64(u64::MAX);
        for (n, b) in self.buckets.iter() {
            h.u64(u64::from(n.0));
            h.u64(b.seq);
            h.u64(b.at);
            h.u64(b.level_nt as u64);
        }
        h.u64(u64::MAX);
        for (n, d) in self.demand.iter() {
            h.u64(u64::from(n.0));
            h.u64(d.seq);
            h.u64(d.forecast);
            h.u64(d.received);
        }
        h.u64(u64::MAX);
        for c in self.claims.iter().filter(|c| c.epoch >= oldest_epoch) {
            h.u64(c.epoch);
            h.u64(u64::from(c.node.0));
            h.u64(c.step);
            h.u64(c.ceiling);
        }
        h.0
    }

    /// The slot of `epoch`, if held.
    #[inline]
    pub fn slot(&self, epoch: u64) -> Option<&EpochSlot> {
        self.slots.iter().rev().find(|s| s.epoch == epoch)
    }

    /// The slot of `epoch`, created empty if missing.
    #[inline]
    pub fn slot_mut(&mut self, epoch: u64) -> &mut EpochSlot {
        let pos = match self.slots.iter().rposition(|s| s.epoch == epoch) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn net_never_goes_below_zero() {
        let t = Tally {
            consumed: 3,
            refunded: 5,
            requested: 9,
        };
        assert_eq!(t.net(), 0);
        assert_eq!(
            Tally {
                consumed: 5,
                refunded: 3,
                requested: 5
            }
            .net(),
            2
        );
    }

    #[test]
    fn transfers_sum_rows_and_columns() {
        let mut m = TransferMatrix::default();
        m.give(NodeIdx(0), NodeIdx(1), 5);
        m.give(NodeIdx(0), NodeIdx(2), 3);
        m.give(NodeIdx(2), NodeIdx(1), 1);
        m.give(NodeIdx(0), NodeIdx(1), 2);
        assert_eq!(m.get(NodeIdx(0), NodeIdx(1)), 7);
        assert_eq!(m.given_by(NodeIdx(0)), 10);
        assert_eq!(m.received_by(NodeIdx(1)), 8);
        assert_eq!(m.net(NodeIdx(2)), 2);
        assert_eq!(m.net(NodeIdx(0)), -10);
    }

    #[test]
    fn registers_keep_the_highest_sequence() {
        let mut a = DemandReg {
            seq: 3,
            forecast: 10,
            received: 0,
        };
        assert!(!a.join(&DemandReg {
            seq: 2,
            forecast: 99,
            received: 0
        }));
        assert!(a.join(&DemandReg {
            seq: 4,
            forecast: 1,
            received: 0
        }));
        assert_eq!(a.forecast, 1);
    }

    #[test]
    fn slots_stay_sorted_and_bounded() {
        let mut k = KeyCrdt::default();
        k.slot_mut(5);
        k.slot_mut(3);
        k.slot_mut(4);
        assert_eq!(
            k.slots.iter().map(|s| s.epoch).collect::<Vec<_>>(),
            vec![3, 4, 5]
        );
        k.retain_epochs(4, 5);
        assert_eq!(
            k.slots.iter().map(|s| s.epoch).collect::<Vec<_>>(),
            vec![4, 5]
        );
    }
}
