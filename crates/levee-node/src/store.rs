//! The key store: every key's state in a `DashMap`, bounded by `max_keys`.
//!
//! A key is identified by its rule, its class bucket (separate-buckets classes) and the key
//! bytes, encoded as one byte string ([`KeyId`]). Each state sits behind its own mutex so that
//! an atomic call over several keys can lock them all, always in the same (sorted) order,
//! without ever holding two locks of one map shard.
//!
//! ## The bound
//!
//! When a new key would exceed `max_keys`, the store evicts first. Victims are chosen by the
//! CLOCK (second chance) algorithm over insertion order: a key used again since it was
//! last looked at gets another round, a key seen once is evicted. A flood of unique keys
//! therefore evicts its own keys, oldest first, and never the keys that are in use. An evicted
//! key forgets its counts: its next request starts from a full limit. `levee_keys_evicted_total`
//! counts evictions.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use dashmap::DashMap;
use levee_core::KeyState;
use parking_lot::Mutex;

/// The stored identity of a key: `rule \0 bucket key-bytes` (bucket 0xff: no class bucket).
/// Shared between the map and the eviction clock, so the bytes are stored once.
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
}

/// A shared handle to one key's slot.
pub type SlotRef = Arc<Mutex<Slot>>;

/// The bounded key store.
pub struct Store {
    map: DashMap<KeyId, SlotRef>,
    clock: Mutex<VecDeque<KeyId>>,
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
        if let Some(slot) = self.map.get(id) {
            let mut s = slot.lock();
            s.hits = s.hits.saturating_add(1);
            let r = f(&mut s.state);
            self.note(id, &mut s);
            return r;
        }
        let slot = self.slot(id);
        let mut s = slot.lock();
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
        let slot = self.slot(id);
        let mut s = slot.lock();
        f(&mut s)
    }

    /// Runs `f` on the key's state if the key exists.
    pub fn peek<R>(&self, id: &[u8], f: impl FnOnce(&KeyState) -> R) -> Option<R> {
        let slot = self.map.get(id)?;
        let s = slot.lock();
        Some(f(&s.state))
    }

    /// The slot of a key, created if missing.
    pub fn slot(&self, id: &[u8]) -> SlotRef {
        if let Some(slot) = self.map.get(id) {
            return Arc::clone(&slot);
        }
        if self.map.len() >= self.max_keys {
            self.evict(self.map.len() + 1 - self.max_keys);
        }
        let key: KeyId = id.into();
        let mut inserted = false;
        let slot = self
            .map
            .entry(Arc::clone(&key))
            .or_insert_with(|| {
                inserted = true;
                Arc::new(Mutex::new(Slot::default()))
            })
            .clone();
        if inserted {
            self.clock.lock().push_back(key);
        }
        slot
    }

    /// Inserts or replaces a key's state (restoring a snapshot).
    pub fn insert(&self, id: KeyId, state: KeyState) {
        if self.map.len() >= self.max_keys && !self.map.contains_key(&id) {
            self.evict(1);
        }
        let fresh = Arc::new(Mutex::new(Slot {
            state,
            hits: 1,
            queued: false,
        }));
        if self.map.insert(id.clone(), fresh).is_none() {
            self.clock.lock().push_back(id);
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
            let Some(id) = clock.pop_front() else { break };
            let Some(slot) = self.map.get(&id).map(|s| Arc::clone(&s)) else {
                continue; // removed meanwhile
            };
            let used_again = {
                let mut s = slot.lock();
                let again = s.hits > 1;
                s.hits = 1;
                again
            };
            drop(slot);
            if used_again {
                clock.push_back(id);
                continue;
            }
            // Only remove a slot nobody is holding right now.
            if self
                .map
                .remove_if(&id, |_, s| Arc::strong_count(s) == 1)
                .is_some()
            {
                evicted += 1;
                self.evictions.fetch_add(1, Ordering::Relaxed);
            } else if self.map.contains_key(&id) {
                clock.push_back(id);
            }
        }
    }

    /// Calls `f` for every key (for snapshots).
    pub fn for_each(&self, mut f: impl FnMut(&[u8], &KeyState)) {
        for entry in self.map.iter() {
            let s = entry.value().lock();
            f(entry.key(), &s.state);
        }
    }

    /// Keeps only the keys for which `keep` returns true; also forgets them in the clock.
    pub fn retain(&self, mut keep: impl FnMut(&[u8], &mut KeyState) -> bool) {
        self.map.retain(|id, slot| keep(id, &mut slot.lock().state));
        let map = &self.map;
        self.clock.lock().retain(|id| map.contains_key(id));
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
