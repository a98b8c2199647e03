//! The anti-entropy digest: the key space cut into [`DIGEST_BUCKETS`] buckets, each summed
//! up by the XOR of its keys' fingerprints, kept incrementally as keys change so that a round
//! costs O(buckets), not O(keys).

use std::collections::HashMap;
use std::collections::hash_map::Entry;

use levee_core::{KeyCrdt, Millis};
use levee_proto::Digest;

/// Digest buckets: the key space is cut into this many ranges for anti-entropy.
pub const DIGEST_BUCKETS: u32 = 256;

/// The stable 64-bit hash of a stored key identity (FNV-1a): it places the key in a digest
/// bucket and names it in [`Fingerprints`]. It depends on the key's bytes alone, so every
/// node and every version agrees on it.
pub fn key_hash(id: &[u8]) -> u64 {
    levee_core::hash::fnv1a(id)
}

/// The digest bucket of a key, out of `buckets`.
pub fn bucket_of(id: &[u8], buckets: u32) -> u32 {
    (key_hash(id) % u64::from(buckets.max(1))) as u32
}

/// A key's part of its digest bucket: its identity and its state, ignoring epochs more than
/// `retained` epochs older than the newest one it holds (which nodes prune at slightly
/// different times). It depends on the state alone, never on a clock, so a value computed
/// when the key last changed stays right until it changes again.
pub fn key_fingerprint(id: &[u8], state: &KeyCrdt, retained: u64) -> u64 {
    let newest = state.slots.last().map_or(0, |s| s.epoch);
    let oldest = newest.saturating_sub(retained.saturating_sub(1));
    key_hash(id).rotate_left(17) ^ state.fingerprint(oldest)
}

/// The per-bucket digest of a key store: [`DIGEST_BUCKETS`] hashes, each the XOR of its keys'
/// fingerprints, so that when a key changes its old fingerprint XORs out and the new one in.
/// It holds no per-key memory: the store that uses it keeps each key's last fingerprint
/// (with the key itself, or in [`Fingerprints`]).
#[derive(Debug, Clone)]
pub struct DigestBuckets {
    buckets: Vec<u64>,
}

impl Default for DigestBuckets {
    fn default() -> DigestBuckets {
        DigestBuckets {
            buckets: vec![0; DIGEST_BUCKETS as usize],
        }
    }
}

impl DigestBuckets {
    /// Replaces a key's fingerprint `old` by `new` in its bucket (`None`: the key was not
    /// recorded, or is gone).
    pub fn replace(&mut self, id: &[u8], old: Option<u64>, new: Option<u64>) {
        let b = bucket_of(id, DIGEST_BUCKETS) as usize;
        self.buckets[b] ^= old.unwrap_or(0) ^ new.unwrap_or(0);
    }

    /// Forgets every key (before a rebuild from the whole store).
    pub fn clear(&mut self) {
        self.buckets.iter_mut().for_each(|b| *b = 0);
    }

    /// Every bucket's hash, [`DIGEST_BUCKETS`] of them.
    pub fn buckets(&self) -> Vec<u64> {
        self.buckets.clone()
    }
}

/// [`DigestBuckets`] with each key's last fingerprint, and when it last changed, kept beside
/// them, for a store that has nowhere else to keep them. Memory: one `u64 → (u64, u64)` entry
/// per key (named by [`key_hash`], not by its bytes).
#[derive(Debug, Clone, Default)]
pub struct Fingerprints {
    keys: HashMap<u64, (u64, Millis)>,
    buckets: DigestBuckets,
}

impl Fingerprints {
    /// Records a key's fingerprint at `now` (`None`: the key is gone).
    pub fn set(&mut self, id: &[u8], fingerprint: Option<u64>, now: Millis) {
        let h = key_hash(id);
        let old = match fingerprint {
            Some(fp) => match self.keys.entry(h) {
                Entry::Occupied(mut e) => {
                    let (old, at) = *e.get();
                    // The same fingerprint again is no change: the key keeps its time.
                    e.insert((fp, if old == fp { at } else { now }));
                    Some(old)
                }
                Entry::Vacant(e) => {
                    e.insert((fp, now));
                    None
                }
            },
            None => self.keys.remove(&h).map(|(o, _)| o),
        };
        self.buckets.replace(id, old, fingerprint);
    }

    /// Whether the key's fingerprint changed at or after `since` (see
    /// [`crate::KeyStates::changed_since`]).
    pub fn changed_since(&self, id: &[u8], since: Millis) -> bool {
        self.keys
            .get(&key_hash(id))
            .is_some_and(|&(_, at)| at >= since)
    }

    /// Forgets every key (before a rebuild from the whole store).
    pub fn clear(&mut self) {
        self.keys.clear();
        self.buckets.clear();
    }

    /// Keys recorded.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether no key is recorded.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Every bucket's hash, [`DIGEST_BUCKETS`] of them.
    pub fn buckets(&self) -> Vec<u64> {
        self.buckets.buckets()
    }
}

/// The digest message for a store's bucket hashes: the non-empty buckets only.
pub fn digest_message(hashes: Vec<u64>) -> Digest {
    Digest {
        buckets: DIGEST_BUCKETS,
        hashes: hashes
            .into_iter()
            .enumerate()
            .filter(|&(_, h)| h != 0)
            .map(|(i, h)| (i as u32, h))
            .collect(),
    }
}

/// How many digests in a row from one peer may find a bucket different while either side
/// of it keeps changing before the bucket may be repaired anyway (one such bucket per digest,
/// [`PeerDigests::worth_repairing`]): under load that never pauses, what the batch chain
/// lost is still repaired, late.
pub const MAX_BUSY_ROUNDS: u8 = 8;

/// What this node remembers of one peer's digests, to tell a bucket that differs because
/// changes are in flight from one that differs because something was lost.
///
/// Under steady load nearly every bucket differs at every round: its hash moves with every
/// change on the way between the two nodes. Repairing it then sends every quiet key of the
/// bucket, which both nodes hold alike (with 1,000,000 keys and 2,000 decisions a second, 26
/// keys repaired per decision; docs/benchmarks.md). A bucket the peer did not change since
/// its previous digest has nothing of the peer's in flight, and one this node did not change
/// since it compared that digest has nothing of this node's: a difference in a bucket both
/// held still is real. A bucket either side keeps changing is repaired once it pauses, or
/// once it has been busy for [`MAX_BUSY_ROUNDS`] digests, one such bucket per digest (in
/// turn, so that each comes within `MAX_BUSY_ROUNDS` + [`DIGEST_BUCKETS`] digests however
/// busy every bucket is).
#[derive(Debug, Clone, Default)]
pub(crate) struct PeerDigests {
    /// The peer's last digest, by bucket (empty before its first).
    theirs: Vec<u64>,
    /// This node's digest when it compared that one.
    mine: Vec<u64>,
    /// For each bucket, the digests in a row that found it different while either side
    /// changed it.
    busy: Vec<u8>,
    /// Where the round robin over overdue buckets goes on from.
    turn: u32,
}

impl PeerDigests {
    /// The buckets where the peer's digest `theirs` differs from `mine`, this node's, to
    /// repair now, sorted: every one both sides held still since the peer's previous digest,
    /// and of those busy for [`MAX_BUSY_ROUNDS`] digests one, round robin. Before any digest
    /// of the peer, every one that differs. Remembers both digests. (Both are checked,
    /// `well_formed`: each is laid out by index once and compared bucket by bucket.)
    pub(crate) fn worth_repairing(&mut self, mine: &Digest, theirs: &Digest) -> Vec<u32> {
        let (mine, theirs) = (spread(mine), spread(theirs));
        let first = self.theirs.is_empty();
        if first {
            self.busy = vec![0; theirs.len()];
        }
        let mut keep = Vec::new();
        let mut overdue = Vec::new();
        for b in 0..theirs.len() {
            let busy = &mut self.busy[b];
            if mine[b] == theirs[b] {
                *busy = 0;
            } else if first || (self.theirs[b] == theirs[b] && self.mine[b] == mine[b]) {
                *busy = 0;
                keep.push(b as u32);
            } else if *busy >= MAX_BUSY_ROUNDS {
                overdue.push(b as u32);
            } else {
                *busy += 1;
            }
        }
        // The first overdue bucket from the turn on, cyclically.
        let after = overdue.iter().copied().find(|&b| b >= self.turn);
        if let Some(b) = after.or(overdue.first().copied()) {
            self.busy[b as usize] = 0;
            self.turn = b + 1;
            keep.push(b);
            keep.sort_unstable();
        }
        (self.mine, self.theirs) = (mine, theirs);
        keep
    }
}

/// A digest laid out by bucket index (0 for a bucket it leaves out: an empty one), over
/// [`DIGEST_BUCKETS`] buckets: an index beyond them (not in a checked digest) is ignored.
fn spread(d: &Digest) -> Vec<u64> {
    let mut by_bucket = vec![0u64; DIGEST_BUCKETS as usize];
    for &(b, h) in &d.hashes {
        if let Some(x) = by_bucket.get_mut(b as usize) {
            *x = h;
        }
    }
    by_bucket
}

/// Whether a peer's digest is one this node could have sent: cut into [`DIGEST_BUCKETS`]
/// buckets, at most one hash per bucket, by increasing index, none of them zero (an empty
/// bucket is left out).
pub(crate) fn well_formed(d: &Digest) -> bool {
    d.buckets == DIGEST_BUCKETS
        && d.hashes.len() <= DIGEST_BUCKETS as usize
        && d.hashes.iter().all(|&(b, h)| b < DIGEST_BUCKETS && h != 0)
        && d.hashes.windows(2).all(|w| w[0].0 < w[1].0)
}
