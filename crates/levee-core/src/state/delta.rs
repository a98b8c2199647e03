//! Deltas in and out of a key's state: merging what a peer sent, and extracting what this
//! node wrote since its last delta.
//!
//! A delta holds absolute values, not increments, so merging one twice, out of order or after
//! a loss repaired by a full state changes nothing more (see [`crate::crdt`]).

use crate::crdt::{EpochSlot, KeyCrdt, Lattice, TransferMatrix};
use crate::decision::DecideCtx;
use crate::replica::NodeIdx;
use crate::rights::NANO;
use crate::rule::{Algorithm, Target};

use super::key_state::{KeyState, retained_range};
use super::log::max_log_entries;

/// Why a remote delta was refused. The state is unchanged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MergeError {
    /// The delta names a node outside the agreed replica set.
    #[error("delta names node {node} but the replica set has {len} nodes")]
    UnknownNode {
        /// The index named.
        node: u16,
        /// The replica set's size.
        len: usize,
    },
    /// The delta holds what no honest node writes: a tally that refunded more than it
    /// consumed or consumed more than was requested, or a transfer from a node to itself.
    #[error("inconsistent delta: {0}")]
    Inconsistent(&'static str),
    /// Joining the delta would take a node's sums (rights given or received, an epoch's
    /// consumption) past `u64::MAX`: no honest cluster comes near, so it is refused rather
    /// than saturated.
    #[error("delta's values would overflow the key's sums")]
    Overflow,
}

/// What a merge changed ([`KeyState::merge_noting`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Merged {
    /// The state changed.
    pub changed: bool,
    /// It changed something [`KeyState::rebalance`] reads to decide what this node gives: a
    /// node's demand register, a transfer (rights given or received), or, for algorithms
    /// whose need counts what was used (every one but the token and leaky buckets), a tally.
    /// A merge that only brings another node's consumption of a token bucket (its bucket
    /// register) leaves what this node would give as it was, so the key need not be
    /// rebalanced for it.
    pub moves_rights: bool,
}

impl KeyState {
    /// Merges a remote delta or full state. Slots of epochs outside retention are dropped
    /// (too old to matter, or from a peer whose clock runs far ahead). Returns whether the
    /// state changed. A token bucket whose holdings change re-anchors its level first, so
    /// that new rights refill only from the moment they arrive.
    pub fn merge(
        &mut self,
        delta: &KeyCrdt,
        target: &Target<'_>,
        ctx: &DecideCtx<'_>,
    ) -> Result<bool, MergeError> {
        self.merge_noting(delta, target, ctx).map(|m| m.changed)
    }

    /// [`KeyState::merge`], saying also whether the merge changed what rebalancing reads
    /// ([`Merged::moves_rights`]).
    pub fn merge_noting(
        &mut self,
        delta: &KeyCrdt,
        target: &Target<'_>,
        ctx: &DecideCtx<'_>,
    ) -> Result<Merged, MergeError> {
        let replicas = ctx.replicas;
        if let Some(n) = delta.max_node()
            && usize::from(n.0) >= replicas.len()
        {
            return Err(MergeError::UnknownNode {
                node: n.0,
                len: replicas.len(),
            });
        }
        let algo = target.algorithm;
        let (oldest, newest) = retained_range(algo, ctx.now);
        // A sliding log keeps at most `max_log_entries`: of a delta holding more (no honest
        // node sends that many), only the last are read, so a flood costs bounded work.
        let slots = match *algo {
            Algorithm::SlidingLog { limit, .. } => {
                let skip = delta.slots.len().saturating_sub(max_log_entries(limit));
                &delta.slots[skip..]
            }
            _ => &delta.slots[..],
        };
        self.check(delta, slots, replicas.len(), (oldest, newest))?;
        // A token bucket's need is its forecast alone: what others used does not move rights.
        let tallies_move_rights = !matches!(algo, Algorithm::TokenBucket { .. });
        let (mut changed, mut moves_rights) = (false, false);
        for slot in slots {
            if slot.epoch >= oldest && slot.epoch <= newest {
                let mine = self.crdt.slot_mut(slot.epoch);
                let tallies = mine.tallies.join(&slot.tallies);
                let transfers = mine.transfers.join(&slot.transfers);
                changed |= tallies | transfers;
                moves_rights |= transfers | (tallies & tallies_move_rights);
            }
        }
        if let Algorithm::SlidingLog { limit, window_ms } = *algo {
            self.prune_log(ctx.now, window_ms, limit);
        }
        // A token bucket that receives units: its level, its register and what it had
        // received, before the join.
        let anchor = match algo {
            Algorithm::TokenBucket { .. }
                if delta.holdings.cells().iter().any(|c| c.to == ctx.me) =>
            {
                let (level, _) = self.own_level(target, ctx);
                let reg = self.crdt.buckets.get(ctx.me).copied();
                Some((level, reg, self.crdt.holdings.received_by(ctx.me)))
            }
            _ => None,
        };
        let holdings_changed = self.crdt.holdings.join(&delta.holdings);
        changed |= holdings_changed;
        moves_rights |= holdings_changed;
        changed |= self.crdt.buckets.join(&delta.buckets);
        if let Some((level, reg, received)) = anchor.filter(|_| holdings_changed) {
            // The register may have been replaced by our own older write coming back; keep
            // the lower of the two levels, which is always safe.
            let (now_level, cap) = self.own_level(target, ctx);
            // Units arrive with their tokens: a giver gives only units its bucket holds tokens
            // for, and takes those tokens off its level as it gives (`escrow::give`). They are
            // added here, once: only increases of what this node received count, and only
            // while its register is the one it wrote itself, or none yet (a node that never
            // decided the key, such as its owner in a region without demand, whose sub-bucket
            // is full at its share). A register that came back from a peer (a restart that
            // pulls its own state) may already hold them; the units then arrive empty, which
            // never creates a token.
            let credit = if self.crdt.buckets.get(ctx.me).copied() == reg {
                self.crdt
                    .holdings
                    .received_by(ctx.me)
                    .saturating_sub(received)
            } else {
                0
            };
            let credited = level
                .min(now_level)
                .saturating_add(i128::from(credit) * NANO)
                .min(i128::from(cap) * NANO);
            self.set_level(ctx.me, credited, ctx.now);
        }
        let demand_changed = self.crdt.demand.join(&delta.demand);
        changed |= demand_changed;
        moves_rights |= demand_changed;
        // `claims` (the removed optimistic mode's) are still in the wire format; a peer's are
        // dropped.
        Ok(Merged {
            changed,
            moves_rights,
        })
    }

    /// Refuses a delta that no honest peer sends, or whose join would overflow a sum (see
    /// [`MergeError`]), before anything is joined.
    fn check(
        &self,
        delta: &KeyCrdt,
        slots: &[EpochSlot],
        nodes: usize,
        (oldest, newest): (u64, u64),
    ) -> Result<(), MergeError> {
        let self_transfer = |m: &TransferMatrix| m.cells().iter().any(|c| c.from == c.to);
        if self_transfer(&delta.holdings) || delta.slots.iter().any(|s| self_transfer(&s.transfers))
        {
            return Err(MergeError::Inconsistent("a transfer from a node to itself"));
        }
        if !self.crdt.holdings.join_sums_fit(&delta.holdings, nodes) {
            return Err(MergeError::Overflow);
        }
        for slot in slots
            .iter()
            .filter(|s| s.epoch >= oldest && s.epoch <= newest)
        {
            // What the join can reach at most: every node's consumption here plus there.
            let mine = self.crdt.slot(slot.epoch);
            let mut consumed: u128 = mine.map_or(0, |s| {
                s.tallies.iter().map(|(_, t)| u128::from(t.consumed)).sum()
            });
            for (_, t) in slot.tallies.iter() {
                if t.refunded > t.consumed || t.consumed > t.requested {
                    return Err(MergeError::Inconsistent(
                        "a tally that refunded more than it consumed, or consumed more than was requested",
                    ));
                }
                consumed += u128::from(t.consumed);
            }
            if consumed > u128::from(u64::MAX) {
                return Err(MergeError::Overflow);
            }
            let empty = TransferMatrix::default();
            let transfers = mine.map_or(&empty, |s| &s.transfers);
            if !transfers.join_sums_fit(&slot.transfers, nodes) {
                return Err(MergeError::Overflow);
            }
        }
        Ok(())
    }

    /// Whether this node wrote entries that [`KeyState::take_delta`] has not returned yet.
    pub fn has_delta(&self) -> bool {
        self.pending.any()
    }

    /// The entries this node wrote since the last call, as absolute values: its tallies in
    /// every retained epoch, its rows of the transfer matrices, its registers. `None` when
    /// nothing changed.
    pub fn take_delta(&mut self, me: NodeIdx) -> Option<KeyCrdt> {
        if !self.pending.any() {
            return None;
        }
        let d = std::mem::take(&mut self.pending);
        let mut out = KeyCrdt::default();
        for slot in &self.crdt.slots {
            let mine = slot.tallies.get(me).filter(|_| d.tallies);
            let row: Vec<_> = if d.slot_transfers {
                slot.transfers.row(me).copied().collect()
            } else {
                vec![]
            };
            if mine.is_none() && row.is_empty() {
                continue;
            }
            let s = out.slot_mut(slot.epoch);
            if let Some(t) = mine {
                *s.tallies.entry(me) = *t;
            }
            let mut m = TransferMatrix::default();
            for c in row {
                m.give(c.from, c.to, c.units);
            }
            s.transfers = m;
        }
        if d.holdings {
            for c in self.crdt.holdings.row(me) {
                out.holdings.give(c.from, c.to, c.units);
            }
        }
        if d.bucket
            && let Some(b) = self.crdt.buckets.get(me)
        {
            *out.buckets.entry(me) = *b;
        }
        if d.demand
            && let Some(r) = self.crdt.demand.get(me)
        {
            *out.demand.entry(me) = *r;
        }
        Some(out)
    }
}
