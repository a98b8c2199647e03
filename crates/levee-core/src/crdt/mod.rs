//! The replicated state of one key: state-based CRDTs whose join is a pointwise maximum.
//!
//! * [`Tally`]: per node and epoch, three grow-only counters (consumed, refunded, requested).
//!   Consumed and refunded together form a PN counter; requested is the demand signal,
//!   denied requests included.
//! * [`TransferMatrix`]: the escrow's grow-only matrix `T[from][to]` of rights given away.
//!   Only `from` ever increments its row.
//! * [`BucketReg`] and [`DemandReg`]: single-writer registers (a node's token-bucket level and
//!   its demand forecast), ordered by a sequence number the writer increments.
//! * [`Claims`]: the removed optimistic mode's per-node, per-epoch claims, kept as an always
//!   empty field of the wire format (version 2) and of snapshots.
//!
//! [`KeyCrdt::join`] is commutative, associative and idempotent; deltas are sub-states of
//! absolute values, so applying them in any order, duplicated, or after a loss repaired by a
//! full-state join, converges to the same state. Nothing here knows about time.
//!
//! Each lattice lives in its own file (`lattice`, `node_map`, `epoch_slot`, `registers`,
//! `transfers`, `claims`); `key_crdt` composes them, and `fingerprint` hashes the result
//! for anti-entropy.

mod claims;
mod epoch_slot;
mod fingerprint;
mod key_crdt;
mod lattice;
mod node_map;
mod registers;
mod transfers;

pub use claims::{Claim, Claims};
pub use epoch_slot::{EpochSlot, Tally};
pub use key_crdt::KeyCrdt;
pub use lattice::Lattice;
pub use node_map::NodeMap;
pub use registers::{BucketReg, DemandReg};
pub use transfers::{Transfer, TransferMatrix};

#[cfg(test)]
mod tests;
