//! The state of one key and the decisions made against it.
//!
//! A [`KeyState`] holds the replicated [`KeyCrdt`](crate::KeyCrdt) and a little private
//! bookkeeping (what changed since the last delta, the optimistic allowance, the demand
//! forecast). Every function takes the time as an argument.
//!
//! ## Call order
//!
//! 1. [`KeyState::decide`] (or [`decide_all`]) on each request; [`KeyState::refund`] when a
//!    request is given back.
//! 2. [`KeyState::merge`] for every delta or full state received from a peer.
//! 3. Every gossip interval, [`KeyState::rebalance`] (strict mode: move spare rights toward
//!    demand), then [`KeyState::take_delta`] to get what changed, to send to peers.
//! 4. [`KeyState::prune`] now and then to drop epochs past retention.
//!
//! ## How each algorithm decides
//!
//! *Fixed windows and quotas* count per epoch. In strict mode node *n* holds for epoch *e*
//! the rights `split(limit)[n] + received[e] − given[e]` and admits while its own net
//! consumption in *e* stays within them; the sum over nodes is the limit, so the global
//! limit holds without coordination.
//!
//! *Sliding windows* weigh the previous epoch by the part of it still inside the sliding
//! window. Rights are continuous (usage carries from one epoch into the next): node *n* admits
//! while `cur[n] + prev[n] × overlap ≤ holdings[n]`.
//!
//! *Token buckets* are split into per-node sub-buckets: a node holding `h` of the `burst`
//! units has capacity `h` and refills at `h × rate / burst`. Transfers move capacity and
//! refill together, so the sub-buckets always sum to at most the global bucket and the
//! cluster never admits more than `burst + rate × (t2 − t1)` over any interval.
//!
//! In optimistic mode the node admits against the merged global figures instead, treating
//! every unreachable region as having consumed `max(last known, its full share)`. Fixed
//! windows and quotas admit within the node's claim for the epoch, raised in rounds so that
//! the claims never sum above the limit on a healthy network (see `plan_claim` and
//! `docs/algorithms.md`); sliding windows and token buckets take between two syncs at most
//! the region's share of what was left at the last sync.
//!
//! ## Where each part lives
//!
//! * `key_state`: what a [`KeyState`] holds, and its out-of-line part.
//! * `decide`: [`KeyState::decide`], [`decide_all`], [`KeyState::refund`] and the answer.
//! * `evaluate`: one check evaluated per algorithm and mode, before anything is committed.
//! * `claim`: optimistic mode's claim rounds (fixed windows and quotas).
//! * `allowance`: optimistic mode's budget between two syncs (sliding windows, buckets).
//! * `delta`: [`KeyState::merge`] and [`KeyState::take_delta`].
//! * `rebalance`: [`KeyState::rebalance`], the key's side of [`crate::escrow`].
//! * `usage`: [`KeyState::usage`].
//!
//! Their dependencies run one way: `allowance` ← `key_state` ← `claim` ← `evaluate` ←
//! `decide`; `delta`, `rebalance` and `usage` build on `key_state` alone.

mod allowance;
mod claim;
mod decide;
mod delta;
mod evaluate;
mod key_state;
mod rebalance;
mod usage;

pub use crate::rights::NANO;
pub use claim::CLAIM_GRACE_MS;
pub use decide::decide_all;
pub use delta::MergeError;
pub use evaluate::RECOVERY_RETRY_MS;
pub use key_state::KeyState;
