//! A sliding log's entries: the key's slots, one per millisecond that admitted something,
//! each holding every node's tally for that millisecond (see [`crate::state`]).
//!
//! Each node writes only its own tallies, grow-only, so the log of every node is a CRDT whose
//! join is the union of its entries (a pointwise maximum per millisecond, as for any slot).
//! A key keeps the entries of the last window (and those a peer whose clock runs ahead wrote
//! in its future); older ones are pruned.

use crate::crdt::EpochSlot;
use crate::replica::NodeIdx;
use crate::time::Millis;

use super::key_state::KeyState;

/// How far ahead of this node's clock a sliding log's entries are kept (a peer whose clock
/// runs ahead writes them in its future; they count at once, as if admitted now).
pub const LOG_AHEAD_MS: Millis = 60_000;

/// The first millisecond inside the sliding window that ends at `now` (inclusive): an entry
/// at `t` counts while `t > now − window`.
#[inline]
pub(super) fn window_start(now: Millis, window_ms: Millis) -> Millis {
    (now + 1).saturating_sub(window_ms)
}

/// The range of slot "epochs" (milliseconds) a sliding log keeps at `now`.
#[inline]
pub(super) fn log_range(now: Millis, window_ms: Millis) -> (u64, u64) {
    (
        window_start(now, window_ms),
        now.saturating_add(LOG_AHEAD_MS),
    )
}

/// The most entries a sliding log keeps: on a strict cluster every entry of the window
/// admitted at least one token and the window holds at most `limit` of them; what is above
/// twice that (a hostile peer) is dropped oldest first.
#[inline]
pub(super) fn max_log_entries(limit: u64) -> usize {
    (2 * limit).max(2) as usize
}

impl KeyState {
    /// The log's entries inside the window that ends at `now`, oldest first.
    pub(super) fn log_window(
        &self,
        now: Millis,
        window_ms: Millis,
    ) -> impl DoubleEndedIterator<Item = &EpochSlot> {
        let from = window_start(now, window_ms);
        let first = self.crdt.slots.partition_point(|s| s.epoch < from);
        self.crdt.slots[first..].iter()
    }

    /// Net tokens admitted in the window by `node`, or by every node (`None`).
    pub(super) fn log_used(&self, now: Millis, window_ms: Millis, node: Option<NodeIdx>) -> u64 {
        self.log_window(now, window_ms)
            .map(|s| entry_net(s, node))
            .fold(0u64, u64::saturating_add)
    }

    /// Drops the entries before the window and, beyond [`max_log_entries`], the oldest.
    pub(super) fn prune_log(&mut self, now: Millis, window_ms: Millis, limit: u64) {
        let (oldest, newest) = log_range(now, window_ms);
        let stale = self.crdt.slots.first().is_some_and(|s| s.epoch < oldest)
            || self.crdt.slots.last().is_some_and(|s| s.epoch > newest);
        if stale {
            self.crdt.retain_epochs(oldest, newest);
        }
        let max = max_log_entries(limit);
        if self.crdt.slots.len() > max {
            let extra = self.crdt.slots.len() - max;
            self.crdt.slots.drain(..extra);
        }
    }
}

/// The net tokens of one log entry, of `node` or of every node.
#[inline]
pub(super) fn entry_net(slot: &EpochSlot, node: Option<NodeIdx>) -> u64 {
    match node {
        Some(n) => slot.tallies.get(n).map_or(0, |t| t.net()),
        None => slot.net_total(),
    }
}

/// When `need` more tokens fit under `held` if nothing else is admitted: the time at which
/// enough of the oldest entries have left the window (`entries` oldest first, with their
/// net tokens). `None` if they never do within the window (the need is above `held`).
pub(super) fn log_retry(
    entries: impl Iterator<Item = (Millis, u64)>,
    used: u64,
    held: u64,
    need: u64,
    now: Millis,
    window_ms: Millis,
) -> Option<u64> {
    if need > held {
        return None;
    }
    let mut left = used;
    for (t, net) in entries {
        left = left.saturating_sub(net);
        if left.saturating_add(need) <= held {
            return Some((t + window_ms).saturating_sub(now).max(1));
        }
    }
    Some(1)
}

#[cfg(test)]
mod tests {
    use crate::crdt::EpochSlot;

    /// docs/algorithms.md states a sliding log's memory per key from this size: a change must
    /// update both.
    #[test]
    #[cfg(target_pointer_width = "64")]
    fn a_log_entry_is_56_bytes() {
        assert_eq!(std::mem::size_of::<EpochSlot>(), 56);
    }
}
