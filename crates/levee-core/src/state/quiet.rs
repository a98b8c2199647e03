//! A token bucket near full, spent without listing the key at every decision.
//!
//! Every decision of a token bucket lowers the deciding node's level register, and a key whose
//! register was written is listed for the next gossip interval: rebalanced there, and its
//! register sent to every peer, which merges it. A key used once a second cost the whole
//! cluster a merge per decision (issue #18, figure 9 of docs/benchmarks.md), however far it
//! was from its limit. But while a node's sub-bucket stays within a 64th of its capacity of
//! full, what its peers would learn from the write changes nothing they decide: no node admits
//! from another's sub-bucket, and the escrow gives from a node's own register, which the node
//! itself keeps exact.
//!
//! So a decision that leaves the sub-bucket that near full writes the register and marks it to
//! be sent, but does not list the key ([`Listing::Quiet`]): the write goes with the key's next
//! listing — a merge from a peer, a decision that leaves the bucket further from full, or the
//! first decision once the key's forecast is due a sample, which lists it for later
//! ([`Listing::Later`]: rebalanced, so that its forecast is sampled and published as before,
//! and sent within a heartbeat's time rather than at the end of the interval, since nothing
//! about it is urgent). A forecast is due a sample
//! [`QUIET_SAMPLE_MS`] (the escrow's horizon) after the last one if the requests since
//! disagree with it by a factor and beyond a Poisson count's noise, and [`QUIET_LONGEST_MS`]
//! after it in any case: a steady key's sample would move its forecast little, and a key used
//! once a second cost each other node a merge every 5 s (issue #18, figure 9 on 2026-12-04).
//! (Found by `levee-cluster`'s `protocol` test of a region-mate taking over a dead owner's
//! key: a key never listed never published a forecast, and the region-mate denied a check
//! before rights came.) A key left alone after a quiet write is listed for later when the
//! node's anti-entropy digest is rebuilt (every minute), which sends the write.
//!
//! What peers hold of the node's sub-bucket is then never below the truth and at most a 64th
//! of its capacity above it:
//!
//! * their `/v1/usage` and `remaining` may count up to that much less used, for up to
//!   [`QUIET_LONGEST_MS`] while the key is used;
//! * a node that crashes and pulls its state back from them, or its heirs once it is removed,
//!   may admit up to that much again (besides what it admitted in its last gossip interval,
//!   as before) — docs/replication.md, "A token bucket near full".
//!
//! Only a decision spends quietly ([`KeyState::decide`], and [`KeyState::decide_if_held`] of a
//! `cluster.local_first` node deciding a key a region-mate owns: the same sub-bucket of its
//! own, the same argument), only where the key has a demand book (it was used in more than
//! one gossip interval, so its peers hold it), and never for a sub-bucket of fewer than 128
//! units: a key near its limit, or a small one, is listed at every decision, as before. A node
//! whose demand for a key is light would hold only the few units its refill needs; of a bucket
//! large enough that it costs nobody, it keeps at least 128 (`escrow::need::bucket_floor`), so
//! that its decisions there spend quietly too.

use crate::rights::NANO;
use crate::time::Millis;

use super::key_state::{DemandBook, KeyState};

/// A key spent quietly is listed again (rebalanced, its forecast sampled, its register sent)
/// by its first decision once its forecast was last sampled this long ago (the escrow's
/// forecast horizon) and the requests since disagree with the forecast
/// ([`Forecast::agrees`](crate::forecast::Forecast::agrees)).
pub(super) const QUIET_SAMPLE_MS: Millis = crate::escrow::HORIZON_MS;

/// However steady its demand, a key spent quietly is listed again by its first decision once
/// its forecast was last sampled this long ago: what peers hold of the key's register and
/// forecast is never older than this (and a heartbeat) while the key is used.
pub(super) const QUIET_LONGEST_MS: Millis = 30_000;

/// A sub-bucket spends quietly while it is within this fraction of its capacity of full.
const QUIET_DIVISOR: u64 = 64;

/// Sub-buckets of fewer units than this never spend quietly (their margin would be under two
/// tokens). A node with demand for a large enough bucket keeps at least this many
/// (`escrow::need::bucket_floor`).
pub(crate) const MIN_UNITS: u64 = 2 * QUIET_DIVISOR;

/// Whether a sub-bucket of `units`, at `level_nt` after a decision, is near enough full for
/// the decision's write to stay here.
#[inline]
pub(super) fn near_full(level_nt: i128, units: u64) -> bool {
    units >= MIN_UNITS
        && i128::from(units) * NANO - level_nt <= i128::from(units / QUIET_DIVISOR) * NANO
}

/// Whether a quiet decision at `now` may leave the key's forecast unsampled: it was sampled
/// less than [`QUIET_SAMPLE_MS`] ago, or less than [`QUIET_LONGEST_MS`] ago and the
/// `requested` tokens since agree with it (a sample would move it little, and a published
/// forecast moves only when that matters to some node's rebalancing, `demand.rs`).
#[inline]
pub(super) fn sample_can_wait(book: &DemandBook, requested: u64, now: Millis) -> bool {
    let since = now.saturating_sub(book.forecast.sampled_at());
    since < QUIET_SAMPLE_MS || (since < QUIET_LONGEST_MS && book.forecast.agrees(requested, since))
}

/// How a store lists a key after an operation on its state ([`KeyState::take_listing`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Listing {
    /// For this gossip interval: rebalanced and sent at its end (every operation but the
    /// two below).
    #[default]
    Now,
    /// For later: a quiet write whose key's forecast is due a sample. The key is rebalanced
    /// and sent with the next interval that sends keys listed now, or, if none does, once
    /// an idle link's heartbeat is due (every `suspect_after / 5`), in the batch that is
    /// the heartbeat: a steady load of keys near full costs each link a frame per heartbeat,
    /// not one per interval.
    Later,
    /// Not at all: a quiet write whose forecast can wait. It goes with the key's next
    /// listing.
    Quiet,
}

impl KeyState {
    /// How the last operation on this state asks to be listed: [`Listing::Quiet`] and
    /// [`Listing::Later`] only after a decision that left a token bucket near full
    /// (`state/quiet.rs`). Reading resets it to [`Listing::Now`]. A store calls this after
    /// every operation on a key and lists the key as it says.
    #[inline]
    pub fn take_listing(&mut self) -> Listing {
        std::mem::take(&mut self.listing)
    }
}
