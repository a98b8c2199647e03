//! The removed optimistic mode's claims: per node and epoch, the most the node may admit and
//! how far it has come in the claim rounds. No node writes them any more and a peer's are
//! dropped on merge; the type stays because [`KeyCrdt`](super::KeyCrdt) carries the field in
//! wire version 2 and in snapshots, where it is always empty now.

use serde::{Deserialize, Serialize};
use thin_vec::ThinVec;

use crate::replica::NodeIdx;

use super::lattice::Lattice;

/// One node's claim in one epoch (the removed optimistic mode's): the most it
/// may admit in the epoch, and how far it has come in the claim rounds. Written only by
/// `node`; both counters only grow within the epoch, so the join is a pointwise maximum.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Claim {
    /// The epoch claimed in.
    pub epoch: u64,
    /// The writer.
    pub node: NodeIdx,
    /// `2 × round + passive`: the writer's claim round, and whether it promised not to raise
    /// its ceiling in the next round (`1`). Read it with [`Claim::round`] and
    /// [`Claim::passive`], write it with [`Claim::step_at`].
    ///
    /// The two are packed into one integer for the join, not for size: a claim's progress is
    /// ordered by `(round, passive)` lexicographically, and the maximum of the packed integer
    /// is exactly that order. Two fields joined one by one would not be — `(3, active)`
    /// joined with `(2, passive)` would give `(3, passive)`, a promise the writer never
    /// made. It is also the wire format.
    pub step: u64,
    /// The most the node may admit in the epoch (tokens).
    pub ceiling: u64,
}

impl Claim {
    /// The `step` of claim round `round`, with the promise not to raise in the next round if
    /// `passive`. Saturating: rounds are read from peers' claims, which may hold any value.
    #[inline]
    pub const fn step_at(round: u64, passive: bool) -> u64 {
        round.saturating_mul(2).saturating_add(passive as u64)
    }

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
