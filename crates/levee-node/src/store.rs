//! The key store: every key's state in a `DashMap`, bounded by `max_keys`.
//!
//! A key is identified by its rule, its class bucket (separate-buckets classes) and the key
//! bytes, encoded as one byte string. Each key's identity and state sit in one allocation
//! ([`KeyEntry`]), the state behind its own mutex so that an atomic call over several keys can
//! lock them all, always in the same (sorted) order, without ever holding two locks of one map
//! shard. The map and the eviction pool hold pointers to that allocation.
//!
//! ## The bound
//!
//! When a new key would exceed `max_keys`, the store evicts first. The victim is the key whose
//! loss would admit the least: the store samples [`EVICTION_SAMPLE`] keys at random (as Redis's
//! approximated LRU does; up to [`EVICTION_SAMPLE_MAX`] when all of them are [`HEAVY`]) and
//! forgets the one of least weight, its [`Weigher`]'s measure of
//! how much of its limit the key holds (the node's weigher: the part of the limit used, in
//! millionths). A key that holds nothing (a full bucket, a window with no consumption) weighs
//! 0 and ends the sampling at once. A key locked or held by a caller right now is never
//! chosen. A flood of fresh keys therefore evicts its own kind, never a key near its limit,
//! and the cost is paid only when a key is created in a full store: a check of a held key does
//! not touch the sample pool. An evicted key forgets its counts: its next request starts from
//! a full limit. `levee_keys_evicted_total` counts evictions.

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use dashmap::DashMap;
use levee_core::{KeyState, Listing};
use parking_lot::{Mutex, MutexGuard};
use smallvec::SmallVec;

/// The identity of a key as replication lists it: `rule \0 bucket key-bytes` (bucket 0xff: no
/// class bucket).
pub type KeyId = Arc<[u8]>;

pub use levee_proto::{NO_BUCKET, decode_id, encode_id};

/// Keys sampled per eviction; the least weighty of them is evicted.
pub const EVICTION_SAMPLE: usize = 8;

/// Keys sampled at most per eviction when the first [`EVICTION_SAMPLE`] all hold at least
/// [`HEAVY`]: a store full of keys near their limits is searched harder for a lighter one.
pub const EVICTION_SAMPLE_MAX: usize = 64;

/// The weight from which a key counts as heavy (half of the node weigher's scale, a million).
pub const HEAVY: u32 = 500_000;

/// How much forgetting a key would admit: 0 for a key that holds nothing, larger for a key
/// nearer its limit. The store evicts the least weighty key of a sample.
pub type Weigher = Box<dyn Fn(&[u8], &KeyState) -> u32 + Send + Sync>;

/// A key's state and its replication bookkeeping.
#[derive(Debug, Default)]
pub struct Slot {
    /// The key's state.
    pub state: KeyState,
    /// Whether the key is in the store's list of changed keys.
    pub queued: bool,
    /// Whether the key is in the store's list of keys listed for later
    /// ([`levee_core::Listing::Later`]).
    pub later: bool,
    /// Whether the key was removed from the store ([`Store::remove`]) while something still
    /// held its entry: replication then leaves it alone.
    pub removed: bool,
    /// The key's part of the anti-entropy digest as last recorded (0: not recorded); kept
    /// here so that the digest needs no table of its own.
    pub fingerprint: u64,
    /// When that part last changed, in whole seconds of the node's clock: a repair leaves a
    /// key changed lately to the deltas that carry it (`KeyStates::changed_since`). Seconds
    /// in 32 bits keep a key entry within its 192 bytes (until 2106).
    pub changed_at_s: u32,
}

/// One key: its identity (inline up to 16 bytes, the common case for short rule names and
/// keys) and its slot, in one allocation that the map and the eviction pool share.
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

/// Every key the store created, to sample eviction candidates from, and the sampler's random
/// numbers. Keys removed from the map (reset, reload) stay until a sample meets them or a
/// sweep drops them.
struct Pool {
    keys: Vec<Handle>,
    rng: fastrand::Rng,
}

/// The bounded key store.
pub struct Store {
    map: DashMap<Handle, ()>,
    pool: Mutex<Pool>,
    weigher: Weigher,
    max_keys: usize,
    evictions: AtomicU64,
    /// Of those, keys that held something (a count a request could have been denied on).
    evictions_live: AtomicU64,
    /// Keys used or changed since the replication last drained them (cluster mode only),
    /// held weakly: listing a key costs no allocation and keeps no key from eviction, and
    /// the replication reaches each without searching the map.
    changed: Mutex<Vec<Weak<KeyEntry>>>,
    /// Keys listed for later ([`levee_core::Listing::Later`]), held the same way: the
    /// replication joins them to the changed keys at the pace of heartbeats.
    later: Mutex<Vec<Weak<KeyEntry>>>,
    tracking: AtomicBool,
}

impl Store {
    /// An empty store holding at most `max_keys` keys, every key weighing the same (the
    /// victim of an eviction is any key not in use).
    pub fn new(max_keys: usize) -> Store {
        Store::with_weigher(max_keys, Box::new(|_, _| 0))
    }

    /// An empty store holding at most `max_keys` keys, evicting the least weighty by `weigher`.
    pub fn with_weigher(max_keys: usize, weigher: Weigher) -> Store {
        // Seeded from the process's random hasher keys, so that nobody outside can predict
        // which keys a sample meets.
        let seed = std::collections::hash_map::RandomState::new().hash_one(max_keys);
        Store {
            map: DashMap::with_capacity(max_keys.min(1 << 16)),
            pool: Mutex::new(Pool {
                keys: Vec::new(),
                rng: fastrand::Rng::with_seed(seed),
            }),
            weigher,
            max_keys,
            evictions: AtomicU64::new(0),
            evictions_live: AtomicU64::new(0),
            changed: Mutex::new(Vec::new()),
            later: Mutex::new(Vec::new()),
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

    /// Keys evicted so far that held something (every sampled key was live): a sign that
    /// `max_keys` is too small for the keys really in use.
    pub fn evictions_live(&self) -> u64 {
        self.evictions_live.load(Ordering::Relaxed)
    }

    /// Runs `f` on the key's state, creating it (and evicting if needed) when missing, and
    /// lists the key as changed, for later, or not, as the state asks
    /// ([`KeyState::take_listing`]: only a decision whose write no other node needs yet is
    /// not listed now).
    #[inline]
    pub fn with<R>(&self, id: &[u8], f: impl FnOnce(&mut KeyState) -> R) -> R {
        if let Some(entry) = self.map.get(id) {
            let e = &entry.key().0;
            let mut s = e.lock();
            let r = f(&mut s.state);
            self.note_as_asked(e, &mut s);
            return r;
        }
        let entry = self.slot(id);
        let mut s = entry.lock();
        let r = f(&mut s.state);
        self.note_as_asked(&entry, &mut s);
        r
    }

    /// Lists a key after an operation on its state as the state asks
    /// ([`KeyState::take_listing`]): as changed, unless the operation was a decision whose
    /// write no other node needs yet (a token bucket near full), which lists it for later
    /// (its forecast is due a sample) or not at all (the write goes with its next listing).
    #[inline]
    pub fn note_as_asked(&self, entry: &SlotRef, slot: &mut Slot) {
        match slot.state.take_listing() {
            Listing::Now => self.note(entry, slot),
            Listing::Later => self.note_later(entry, slot),
            Listing::Quiet => {}
        }
    }

    /// Lists a key for later (once until drained), when tracking, unless it is listed as
    /// changed already.
    fn note_later(&self, entry: &SlotRef, slot: &mut Slot) {
        if !slot.queued && !slot.later && self.tracking.load(Ordering::Relaxed) {
            slot.later = true;
            self.later.lock().push(Arc::downgrade(entry));
        }
    }

    /// Takes the list of keys listed for later since the last call, as
    /// [`Store::take_changed`] does (a key's `later` flag is cleared as it is drained).
    pub fn take_later(&self) -> Vec<Weak<KeyEntry>> {
        std::mem::take(&mut *self.later.lock())
    }

    /// Runs `f` on the key's state if the key is held, else on a fresh state that is then
    /// dropped: for reads (dry runs, checks of cost 0) and for what changes nothing on a key
    /// that holds nothing (a refund), none of which may create a key.
    #[inline]
    pub fn with_existing<R>(&self, id: &[u8], f: impl FnOnce(&mut KeyState) -> R) -> R {
        if let Some(entry) = self.map.get(id) {
            let e = &entry.key().0;
            let mut s = e.lock();
            let r = f(&mut s.state);
            self.note_as_asked(e, &mut s);
            return r;
        }
        f(&mut KeyState::new())
    }

    /// The entry of a key, if it is held.
    pub fn get(&self, id: &[u8]) -> Option<SlotRef> {
        self.map.get(id).map(|e| Arc::clone(&e.key().0))
    }

    /// Starts listing the keys that are used or changed, for replication to drain.
    pub fn track_changes(&self) {
        self.tracking.store(true, Ordering::Release);
    }

    /// Lists a key as changed (once until drained), when tracking.
    #[inline]
    /// `slot` is `entry`'s, locked.
    pub fn note(&self, entry: &SlotRef, slot: &mut Slot) {
        if !slot.queued && self.tracking.load(Ordering::Relaxed) {
            slot.queued = true;
            self.changed.lock().push(Arc::downgrade(entry));
        }
    }

    /// Lists every key as changed (those listed already are not listed twice).
    pub fn note_all(&self) {
        for entry in self.map.iter() {
            let e = &entry.key().0;
            self.note(e, &mut e.lock());
        }
    }

    /// Takes the list of keys used or changed since the last call. A key evicted since it
    /// was listed no longer upgrades; one removed while another holder kept its entry says
    /// so in its slot ([`Slot::removed`]).
    pub fn take_changed(&self) -> Vec<Weak<KeyEntry>> {
        std::mem::take(&mut *self.changed.lock())
    }

    /// Runs `f` on a key's slot (creating the key if needed), without counting a use, and
    /// lists the key as changed.
    pub fn with_slot_noted<R>(&self, id: &[u8], f: impl FnOnce(&mut Slot) -> R) -> R {
        let entry = self.slot(id);
        let mut s = entry.lock();
        let r = f(&mut s);
        self.note(&entry, &mut s);
        r
    }

    /// Runs `f` on a key's slot (told whether the key is new) without counting a use, and
    /// lists the key as changed if `f` says so: a merge from a peer. A missing key is created
    /// only if `f` accepts it: for a key not held, `f` runs first on a fresh slot
    /// outside the map, which is inserted (evicting as the store is full) only if `f`
    /// returned `Ok`. A refused key leaves nothing behind and evicts nothing. If the key
    /// appears meanwhile (a decision made it), `f` runs again, on its slot: a merge is a
    /// join, so merging twice is merging once.
    pub fn merge_slot_noted_if<T, E>(
        &self,
        id: &[u8],
        mut f: impl FnMut(&mut Slot, bool) -> (Result<T, E>, bool),
    ) -> Result<T, E> {
        let held = self.map.get(id).map(|e| Arc::clone(&e.key().0));
        if let Some(entry) = held {
            return self.run_noted_if(&entry, &mut f);
        }
        let mut fresh = Slot::default();
        let (r, note) = f(&mut fresh, true);
        if let Err(e) = r {
            return Err(e);
        }
        let mut fresh = Some(fresh);
        let (entry, inserted) = self.slot_with(id, || fresh.take().unwrap_or_default());
        if !inserted {
            return self.run_noted_if(&entry, &mut f);
        }
        if note {
            self.note(&entry, &mut entry.lock());
        }
        r
    }

    /// Runs `f` on a held key's slot, and lists the key as changed if `f` says so.
    fn run_noted_if<R>(
        &self,
        entry: &SlotRef,
        f: &mut impl FnMut(&mut Slot, bool) -> (R, bool),
    ) -> R {
        let mut s = entry.lock();
        let (r, note) = f(&mut s, false);
        if note {
            self.note(entry, &mut s);
        }
        r
    }

    /// Runs `f` on a key's slot if the key is held, without counting a use.
    pub fn with_existing_slot<R>(&self, id: &[u8], f: impl FnOnce(&mut Slot) -> R) -> Option<R> {
        let entry = self.map.get(id)?;
        let mut s = entry.key().0.lock();
        Some(f(&mut s))
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
        // The shard's lock is released at the end of this statement, before the pool's.
        let (entry, inserted) = match self.map.entry(Handle(Arc::clone(&new))) {
            dashmap::Entry::Occupied(o) => (Arc::clone(&o.key().0), false),
            dashmap::Entry::Vacant(v) => {
                v.insert(());
                (new, true)
            }
        };
        if inserted {
            let mut pool = self.pool.lock();
            pool.keys.push(Handle(Arc::clone(&entry)));
            // Entries removed from the map (reset, reload) stay in the pool until a sample
            // meets them; sweep them when they pile up, so the pool stays near the map's size.
            if pool.keys.len() > 2 * self.map.len() + 1024 {
                pool.keys.retain(|h| self.is_live(h));
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
            ..Slot::default()
        });
        if !inserted && let Some(state) = state {
            entry.lock().state = state;
        }
    }

    /// Removes a key; returns whether it existed.
    pub fn remove(&self, id: &[u8]) -> bool {
        match self.map.remove(id) {
            Some((h, ())) => {
                h.0.lock().removed = true;
                true
            }
            None => false,
        }
    }

    /// Evicts up to `n` keys, each the least weighty of a random sample.
    fn evict(&self, n: usize) {
        let mut pool = self.pool.lock();
        for _ in 0..n {
            if !self.evict_one(&mut pool) {
                break;
            }
        }
    }

    /// Samples up to [`EVICTION_SAMPLE`] keys not in use and evicts the least weighty; a key
    /// that holds nothing (weight 0) is evicted as soon as it is met. Returns whether a key
    /// was evicted.
    fn evict_one(&self, pool: &mut Pool) -> bool {
        let mut best: Option<(usize, u32)> = None;
        let mut weighed = 0;
        // Bounded: keys in use are skipped, stale handles dropped, and the sample is small.
        for _ in 0..EVICTION_SAMPLE_MAX * 2 {
            let enough = match best {
                Some((_, w)) if w < HEAVY => weighed >= EVICTION_SAMPLE,
                _ => weighed >= EVICTION_SAMPLE_MAX,
            };
            if enough || pool.keys.is_empty() {
                break;
            }
            let i = pool.rng.usize(..pool.keys.len());
            let h = &pool.keys[i];
            if !self.is_live(h) {
                pool.keys.swap_remove(i);
                // The last handle moved to `i`.
                if let Some((b, _)) = &mut best
                    && *b == pool.keys.len()
                {
                    *b = i;
                }
                continue;
            }
            // In use: held by a caller (the map's handle and the pool's are the only others).
            if Arc::strong_count(&h.0) > 2 {
                continue;
            }
            let Some(s) = h.0.slot.try_lock() else {
                continue;
            };
            let w = (self.weigher)(&h.0.id, &s.state);
            drop(s);
            weighed += 1;
            if best.is_none_or(|(_, bw)| w < bw) {
                best = Some((i, w));
            }
            if w == 0 {
                break;
            }
        }
        let Some((i, weight)) = best else {
            return false;
        };
        let h = pool.keys.swap_remove(i);
        // Only remove an entry nobody is holding right now: the map's handle and ours.
        if self
            .map
            .remove_if(&h.0.id[..], |k, ()| {
                Arc::ptr_eq(&k.0, &h.0) && Arc::strong_count(&h.0) == 2
            })
            .is_some()
        {
            self.evictions.fetch_add(1, Ordering::Relaxed);
            if weight > 0 {
                self.evictions_live.fetch_add(1, Ordering::Relaxed);
            }
            true
        } else {
            if self.is_live(&h) {
                pool.keys.push(h);
            }
            false
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

    /// Calls `f` for every key's id, locking no slot.
    pub fn for_each_id(&self, mut f: impl FnMut(&[u8])) {
        for entry in self.map.iter() {
            f(&entry.key().0.id);
        }
    }

    /// Calls `f` for every key's slot (for a rebuild of the digest).
    pub fn for_each_slot(&self, mut f: impl FnMut(&[u8], &mut Slot)) {
        for entry in self.map.iter() {
            let e = &entry.key().0;
            f(&e.id, &mut e.lock());
        }
    }

    /// Runs `f` on every key's slot, and lists for later ([`levee_core::Listing::Later`]) the
    /// keys for which it returns true.
    pub fn for_each_slot_listing_later(&self, mut f: impl FnMut(&[u8], &mut Slot) -> bool) {
        for entry in self.map.iter() {
            let e = &entry.key().0;
            let mut slot = e.lock();
            if f(&e.id, &mut slot) {
                self.note_later(e, &mut slot);
            }
        }
    }

    /// Keeps only the keys for which `keep` returns true; also forgets them in the pool.
    pub fn retain(&self, mut keep: impl FnMut(&[u8], &mut KeyState) -> bool) {
        self.map
            .retain(|h, ()| keep(&h.0.id, &mut h.0.lock().state));
        self.pool.lock().keys.retain(|h| self.is_live(h));
    }
}

#[cfg(test)]
#[path = "store_tests.rs"]
mod tests;
