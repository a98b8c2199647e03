//! A token bucket near full, spent without a write every node merges.
//!
//! Every decision of a token bucket lowers the deciding node's level register, and every
//! register written is sent to every peer and merged there at the next gossip interval: a key
//! used once a second costs the whole cluster a merge per decision (issue #18, figure 9 of
//! docs/benchmarks.md), however far it is from its limit. But while a node's sub-bucket stays
//! within a 64th of its capacity of full, what its peers would learn from the write changes
//! nothing they decide: no node admits from another's sub-bucket, and the escrow gives from a
//! node's own register, which the node itself keeps exact.
//!
//! So a decision that leaves the sub-bucket that near full writes the register here only:
//! nothing is sent, and the key is not even listed for the next interval
//! ([`KeyState::take_quiet`]) unless its forecast was last sampled [`QUIET_SAMPLE_MS`] ago or
//! more. Then it is listed, rebalanced and its forecast sampled as any used key is, though its
//! delta carries only what the rebalancing writes (its demand register, when its forecast
//! moved enough to matter): a region-mate that takes the key over from a dead owner starts
//! from the forecast the owner last published, and must find one.
//! The next write that leaves the bucket further from full (or any other change of the key)
//! sends the register as it is then, and the periodic rebuild of the anti-entropy digest
//! finds and repairs a key whose peers hold an older register (within a minute). What peers
//! hold of the node's sub-bucket is then at most a 64th of its capacity above the truth:
//!
//! * their `/v1/usage` and `remaining` may count up to that much less used;
//! * a node that crashes and pulls its state back from them, or its heirs once it is removed,
//!   may admit up to that much again (besides what it admitted in its last gossip interval,
//!   as before) — docs/replication.md, "Crashes".
//!
//! Only [`KeyState::decide`] spends quietly, only where the key has a demand book (it was used
//! in more than one gossip interval, so its peers hold it), and never for a sub-bucket of fewer
//! than 128 units: a key near its limit, or a small one, writes and sends at every decision, as
//! before. (Found by `levee-cluster`'s `protocol` test of a region-mate taking over a dead
//! owner's key: without the once-a-second listing the owner never published a forecast, and
//! the region-mate denied a check before rights reached it.)

use crate::rights::NANO;

use super::key_state::KeyState;

/// A key spent quietly is still listed for rebalancing when its forecast was last sampled
/// this long ago (ms): about once a second while it is used.
pub(super) const QUIET_SAMPLE_MS: crate::time::Millis = 1_000;

/// A sub-bucket spends quietly while it is within this fraction of its capacity of full.
const QUIET_DIVISOR: u64 = 64;

/// Sub-buckets of fewer units than this never spend quietly (their margin would be under two
/// tokens).
const MIN_UNITS: u64 = 2 * QUIET_DIVISOR;

/// Whether a sub-bucket of `units`, at `level_nt` after a decision, is near enough full for
/// the decision's write to stay here.
#[inline]
pub(super) fn near_full(level_nt: i128, units: u64) -> bool {
    units >= MIN_UNITS
        && i128::from(units) * NANO - level_nt <= i128::from(units / QUIET_DIVISOR) * NANO
}

impl KeyState {
    /// Whether the last operation on this state was a decision that changed nothing another
    /// node reads (`state/quiet.rs`): the key need not be listed for the next gossip interval
    /// (its delta is empty; its forecast samples the requests later, by their time). Reading
    /// clears it. A store calls this after every operation on a key and lists the key unless
    /// it says so.
    #[inline]
    pub fn take_quiet(&mut self) -> bool {
        std::mem::take(&mut self.quiet)
    }
}
