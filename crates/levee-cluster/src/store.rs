//! The key states the protocol replicates, kept by the caller: [`KeyStates`] is what the
//! state machine asks of a store. A node keeps its keys in its concurrent store, the
//! simulator and the tests in [`crate::memory::MemoryStates`].

use levee_core::{Algorithm, KeyCrdt, KeyState, Millis, Target};
use levee_proto::OverrideEntry;

/// Why a key's state was not merged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Refused(pub String);

/// The key states the protocol replicates, kept by the caller.
pub trait KeyStates {
    /// Removes and returns, for up to `max` keys, the entries this node wrote since the last
    /// call (as absolute values).
    fn drain_deltas(&mut self, max: usize) -> Vec<(Vec<u8>, KeyCrdt)>;
    /// Joins a peer's state of a key into ours, creating the key only if the merge is
    /// accepted: a refused merge leaves nothing behind.
    fn merge(&mut self, id: &[u8], state: &KeyCrdt, now: Millis) -> Result<(), Refused>;
    /// Calls `f` with every key's state and the oldest epoch still counted for it.
    fn for_each(&self, now: Millis, f: &mut dyn FnMut(&[u8], &KeyCrdt, u64));
    /// Calls `f` with every key's id (what a repair or a pull answer lists; the states are
    /// read when sent). A store that can list ids without reading states should.
    fn for_each_id(&self, now: Millis, f: &mut dyn FnMut(&[u8])) {
        self.for_each(now, &mut |id, _, _| f(id));
    }
    /// Whether the key's state changed here (a decision, or a merge that changed it) at or
    /// after `since`: a repair leaves such a key to the deltas that carry it now (it is
    /// repaired once it has been quiet that long). A store that does not know says `false`.
    fn changed_since(&self, id: &[u8], since: Millis) -> bool {
        let _ = (id, since);
        false
    }
    /// The algorithm deciding `rule`'s checks of `class` at `now` (a class's own bucket's, under
    /// separate classes), if the rule is known: what a late answer's give-back is weighed
    /// by. A store that does not know says `None`, and nothing is given back.
    fn algorithm_of(&self, rule: &str, class: Option<&str>, now: Millis) -> Option<Algorithm> {
        let _ = (rule, class, now);
        None
    }
    /// A copy of one key's state, if held.
    fn get(&self, id: &[u8]) -> Option<KeyCrdt>;
    /// The anti-entropy digest of every key held: [`crate::DIGEST_BUCKETS`] hashes, each
    /// the XOR of the [`crate::key_fingerprint`]s of the keys in that bucket
    /// ([`crate::bucket_of`]). Kept up to date as keys change (see [`crate::Fingerprints`]),
    /// so that a round costs O(buckets), not O(keys).
    fn digest(&mut self, now: Millis) -> Vec<u64>;
    /// Takes the keys listed for this interval — used, merged or changed since the last
    /// interval ([`levee_core::Listing::Now`]) — and says how many there are. The machine
    /// calls it at the end of each interval, before [`KeyStates::join_later`], rebalancing
    /// and draining.
    fn listed_now(&mut self) -> usize;
    /// Adds the keys listed for later ([`levee_core::Listing::Later`]) since the last call to
    /// this interval's: they are rebalanced and drained with them.
    fn join_later(&mut self);
    /// Calls `f` with every key used or merged since the last call, its state and its rule's
    /// target ([`levee_core::Rule::target_of_bucket`]), and lists the key as changed (its
    /// delta goes out with this interval's). The machine rebalances spare rights with it.
    fn update_active(&mut self, f: &mut dyn FnMut(&[u8], &mut KeyState, &Target<'_>));
    /// Counts every key held as used since the last call: the next
    /// [`KeyStates::update_active`] calls `f` with all of them (a leaving node gives away the
    /// rights of every key, not only of the keys used lately).
    fn activate_all(&mut self);

    /// The per-key override registers taken or written since the last call (what this
    /// interval's gossip sends to every peer). A store without overrides has none.
    fn take_overrides(&mut self) -> Vec<OverrideEntry> {
        Vec::new()
    }
    /// Every override register held, tombstones included.
    fn all_overrides(&self) -> Vec<OverrideEntry> {
        Vec::new()
    }
    /// The XOR of [`crate::override_hash`] over every register held (0 for none).
    fn overrides_digest(&self) -> u64 {
        0
    }
    /// Takes a peer's registers, each if it wins over the one held (last writer wins).
    /// Returns how many were taken.
    fn merge_overrides(&mut self, entries: Vec<OverrideEntry>) -> usize {
        let _ = entries;
        0
    }
}
