//! The key store: every key's state in a `DashMap`, bounded by `max_keys`.
//!
//! A key is identified by its rule, its class bucket (separate-buckets classes) and the key
//! bytes, encoded as one byte string. Each key's identity and state sit in one allocation
//! ([`KeyEntry`]), the state behind its own mutex so that an atomic call over several keys can
//! lock them all, always in the same (sorted) order, without ever holding two locks of one map
//! shard. The map and the eviction clock hold pointers to that allocation.
//!
//! ## The bound
//!
//! When a new key would exceed `max_keys`, the store evicts first. Victims are chosen by the
//! CLOCK (second chance) algorithm over insertion order: a key used again since it was
//! last looked at gets another round, a key seen once is evicted. A flood of unique keys
//! therefore evicts its own keys, oldest first, and never the keys that are in use. An evicted
//! key forgets its counts: its next request starts from a full limit. `levee_keys_evicted_total`
//! counts evictions.

use std::borrow::Borrow;
use std::collections::VecDeque;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use dashmap::DashMap;
use levee_core::KeyState;
use parking_lot::{Mutex, MutexGuard};
use smallvec::SmallVec;

/// The identity of a key as replication lists it: `rule \0 bucket key-bytes` (bucket 0xff: no
/// class bucket).
pub type KeyId = Arc<[u8]>;

pub use levee_proto::{NO_BUCKET, decode_id, encode_id};

/// A key's state and its use count since the clock hand last passed.
#[derive(Debug, Default)]
pub struct Slot {
    /// The key's state.
    pub state: KeyState,
    /// Uses since the eviction clock last looked at this key (saturating).
    pub hits: u8,
    /// Whether the key is in the store's list of changed keys.
    pub queued: bool,
    /// The key's part of the anti-entropy digest as last recorded (0: not recorded); kept
    /// here so that the digest needs no table of its own.
    pub fingerprint: u64,
}

/// One key: its identity (inline up to 16 bytes, the common case for short rule names and
/// keys) and its slot, in one allocation that the map and the eviction clock share.
#[derive(Debug)]
pub struct KeyEntry {
    id: SmallVec<[u8; 16]>,
    slot: Mutex<Slot>,
}

impl KeyEntry {
    /// The key's identity (`rule \0 bucket key-bytes`).
    pub fn id(&self) -> &[u8] {
        &self.id
    }

    /// Locks the key's slot.
    pub fn lock(&self) -> MutexGuard<'_, Slot> {
        self.slot.lock()
    }
}

/// A shared handle to one key's slot.
pub type SlotRef = Arc<KeyEntry>;

/// The map's key: a pointer to the entry, hashed and compared by the identity bytes (as a
/// `[u8]` is, so that the map can be searched with a plain byte slice).
#[derive(Clone)]
struct Handle(Arc<KeyEntry>);

impl Hash for Handle {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.0.id[..].hash(h);
    }
}

impl PartialEq for Handle {
    fn eq(&self, other: &Handle) -> bool {
        self.0.id == other.0.id
    }
}

impl Eq for Handle {}

impl Borrow<[u8]> for Handle {
    fn borrow(&self) -> &[u8] {
        &self.0.id
    }
}

/// The bounded key store.
pub struct Store {
    map: DashMap<Handle, ()>,
    clock: Mutex<VecDeque<Handle>>,
    max_keys: usize,
    evictions: AtomicU64,
    /// Keys used or changed since the replication last drained them (cluster mode only).
    changed: Mutex<Vec<KeyId>>,
    tracking: AtomicBool,
}

impl Store {
    /// An empty store holding at most `max_keys` keys.
    pub fn new(max_keys: usize) -> Store {
        Store {
            map: DashMap::with_capacity(max_keys.min(1 << 16)),
            clock: Mutex::new(VecDeque::new()),
            max_keys,
            evictions: AtomicU64::new(0),
            changed: Mutex::new(Vec::new()),
            tracking: AtomicBool::new(false),
        }
    }

    /// Number of keys held.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Keys evicted so far.
    pub fn evictions(&self) -> u64 {
        self.evictions.load(Ordering::Relaxed)
    }

    /// Runs `f` on the key's state, creating it (and evicting if needed) when missing.
    #[inline]
    pub fn with<R>(&self, id: &[u8], f: impl FnOnce(&mut KeyState) -> R) -> R {
        if let Some(entry) = self.map.get(id) {
            let mut s = entry.key().0.lock();
            s.hits = s.hits.saturating_add(1);
            let r = f(&mut s.state);
            self.note(id, &mut s);
            return r;
        }
        let entry = self.slot(id);
        let mut s = entry.lock();
        s.hits = s.hits.saturating_add(1);
        let r = f(&mut s.state);
        self.note(id, &mut s);
        r
    }

    /// Starts listing the keys that are used or changed, for replication to drain.
    pub fn track_changes(&self) {
        self.tracking.store(true, Ordering::Release);
    }

    /// Lists a key as changed (once until drained), when tracking.
    #[inline]
    pub fn note(&self, id: &[u8], slot: &mut Slot) {
        if !slot.queued && self.tracking.load(Ordering::Relaxed) {
            slot.queued = true;
            self.changed.lock().push(id.into());
        }
    }

    /// Takes the list of keys used or changed since the last call.
    pub fn take_changed(&self) -> Vec<KeyId> {
        std::mem::take(&mut *self.changed.lock())
    }

    /// Runs `f` on a key's slot (creating the key if needed), without counting a use.
    pub fn with_slot<R>(&self, id: &[u8], f: impl FnOnce(&mut Slot) -> R) -> R {
        if let Some(entry) = self.map.get(id) {
            return f(&mut entry.key().0.lock());
        }
        let entry = self.slot(id);
        let mut s = entry.lock();
        f(&mut s)
    }

    /// Runs `f` on the key's state if the key exists.
    pub fn peek<R>(&self, id: &[u8], f: impl FnOnce(&KeyState) -> R) -> Option<R> {
        let entry = self.map.get(id)?;
        let s = entry.key().0.lock();
        Some(f(&s.state))
    }

    /// The slot of a key, created if missing.
    pub fn slot(&self, id: &[u8]) -> SlotRef {
        self.slot_with(id, Slot::default).0
    }

    /// The entry of a key, created with `fresh` if missing; whether it was created.
    fn slot_with(&self, id: &[u8], fresh: impl FnOnce() -> Slot) -> (SlotRef, bool) {
        if let Some(entry) = self.map.get(id) {
            return (Arc::clone(&entry.key().0), false);
        }
        if self.map.len() >= self.max_keys {
            self.evict(self.map.len() + 1 - self.max_keys);
        }
        let new = Arc::new(KeyEntry {
            id: SmallVec::from_slice(id),
            slot: Mutex::new(fresh()),
        });
        // The shard's lock is released at the end of this statement, before the clock's.
        let (entry, inserted) = match self.map.entry(Handle(Arc::clone(&new))) {
            dashmap::Entry::Occupied(o) => (Arc::clone(&o.key().0), false),
            dashmap::Entry::Vacant(v) => {
                v.insert(());
                (new, true)
            }
        };
        if inserted {
            let mut clock = self.clock.lock();
            clock.push_back(Handle(Arc::clone(&entry)));
            // Entries removed from the map (reset, reload) stay in the clock until the hand
            // passes; sweep them when they pile up, so the clock stays near the map's size.
            if clock.len() > 2 * self.map.len() + 1024 {
                clock.retain(|h| self.is_live(h));
            }
        }
        (entry, inserted)
    }

    /// Whether the map holds this very entry (not another entry of the same id).
    fn is_live(&self, h: &Handle) -> bool {
        self.map
            .get(&h.0.id[..])
            .is_some_and(|e| Arc::ptr_eq(&e.key().0, &h.0))
    }

    /// Inserts or replaces a key's state (restoring a snapshot).
    pub fn insert(&self, id: KeyId, state: KeyState) {
        let mut state = Some(state);
        let (entry, inserted) = self.slot_with(&id, || Slot {
            state: state.take().unwrap_or_default(),
            hits: 1,
            ..Slot::default()
        });
        if !inserted && let Some(state) = state {
            let mut s = entry.lock();
            s.state = state;
            s.hits = 1;
        }
    }

    /// Removes a key; returns whether it existed.
    pub fn remove(&self, id: &[u8]) -> bool {
        self.map.remove(id).is_some()
    }

    /// Evicts up to `n` keys by the CLOCK algorithm.
    fn evict(&self, n: usize) {
        let mut clock = self.clock.lock();
        let mut evicted = 0;
        // Every key gets at most one second chance per call, so this always ends.
        let mut budget = clock.len() * 2 + 1;
        while evicted < n && budget > 0 {
            budget -= 1;
            let Some(h) = clock.pop_front() else { break };
            if !self.is_live(&h) {
                continue; // removed meanwhile
            }
            let used_again = {
                let mut s = h.0.lock();
                let again = s.hits > 1;
                s.hits = 1;
                again
            };
            if used_again {
                clock.push_back(h);
                continue;
            }
            // Only remove an entry nobody is holding right now: the map's handle and ours.
            if self
                .map
                .remove_if(&h.0.id[..], |k, ()| {
                    Arc::ptr_eq(&k.0, &h.0) && Arc::strong_count(&h.0) == 2
                })
                .is_some()
            {
                evicted += 1;
                self.evictions.fetch_add(1, Ordering::Relaxed);
            } else if self.is_live(&h) {
                clock.push_back(h);
            }
        }
    }

    /// Calls `f` for every key (for snapshots).
    pub fn for_each(&self, mut f: impl FnMut(&[u8], &KeyState)) {
        for entry in self.map.iter() {
            let e = &entry.key().0;
            let s = e.lock();
            f(&e.id, &s.state);
        }
    }

    /// Calls `f` for every key's slot (for a rebuild of the digest).
    pub fn for_each_slot(&self, mut f: impl FnMut(&[u8], &mut Slot)) {
        for entry in self.map.iter() {
            let e = &entry.key().0;
            f(&e.id, &mut e.lock());
        }
    }

    /// Keeps only the keys for which `keep` returns true; also forgets them in the clock.
    pub fn retain(&self, mut keep: impl FnMut(&[u8], &mut KeyState) -> bool) {
        self.map
            .retain(|h, ()| keep(&h.0.id, &mut h.0.lock().state));
        self.clock.lock().retain(|h| self.is_live(h));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> KeyId {
        let mut b = Vec::new();
        encode_id(&mut b, "r", None, s);
        b.into()
    }

    #[test]
    fn keys_removed_and_created_again_do_not_pile_up_in_the_clock() {
        let store = Store::new(1_000);
        for i in 0..20_000 {
            let k = id(&format!("k{}", i % 10));
            store.with(&k, |_| ());
            assert!(store.remove(&k));
            assert!(!store.remove(&k));
        }
        assert!(store.is_empty());
        assert!(store.clock.lock().len() <= 1024 + 1);
        // Restoring a key that exists replaces its state and keeps one entry.
        let k = id("restored");
        store.with(&k, |_| ());
        store.insert(k.clone(), KeyState::new());
        store.insert(id("other"), KeyState::new());
        assert_eq!(store.len(), 2);
        let mut seen = Vec::new();
        store.for_each(|id, _| seen.push(id.to_vec()));
        seen.sort();
        assert_eq!(seen, vec![id("other").to_vec(), k.to_vec()]);
    }

    /// The memory budget per key (docs/benchmarks.md, figure 6): a key's entry, with the
    /// `Arc`'s two counters, fits the allocator's 192-byte size class on 64-bit targets.
    #[test]
    #[cfg(target_pointer_width = "64")]
    fn a_key_entry_fits_192_bytes() {
        let with_counts = std::mem::size_of::<KeyEntry>() + 2 * std::mem::size_of::<usize>();
        assert!(with_counts <= 192, "a key entry takes {with_counts} bytes");
    }

    #[test]
    fn a_flood_of_unique_keys_stays_bounded_and_spares_keys_in_use() {
        let store = Store::new(100);
        for k in 0..10 {
            store.with(&id(&format!("hot-{k}")), |_| ());
            store.with(&id(&format!("hot-{k}")), |_| ());
        }
        for i in 0..10_000 {
            store.with(&id(&format!("flood-{i}")), |_| ());
            if i % 50 == 0 {
                for k in 0..10 {
                    store.with(&id(&format!("hot-{k}")), |_| ());
                }
            }
            assert!(store.len() <= 100);
        }
        for k in 0..10 {
            assert!(
                store.peek(&id(&format!("hot-{k}")), |_| ()).is_some(),
                "hot-{k} was evicted"
            );
        }
        assert!(store.evictions() >= 9_900);
    }
}
