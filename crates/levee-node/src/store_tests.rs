//! Tests of the key store ([`super`]).

use super::*;

fn id(s: &str) -> KeyId {
    let mut b = Vec::new();
    encode_id(&mut b, "r", None, s);
    b.into()
}

#[test]
fn keys_removed_and_created_again_do_not_pile_up_in_the_pool() {
    let store = Store::new(1_000);
    for i in 0..20_000 {
        let k = id(&format!("k{}", i % 10));
        store.with(&k, |_| ());
        assert!(store.remove(&k));
        assert!(!store.remove(&k));
    }
    assert!(store.is_empty());
    assert!(store.pool.lock().keys.len() <= 1024 + 1);
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

/// A weigher reading the weight from the key's name: `w<weight>-…`, else 0.
fn by_name() -> Weigher {
    Box::new(|id, _| {
        let (_, _, key) = decode_id(id).expect("an identity");
        key.strip_prefix('w')
            .and_then(|k| k.split('-').next())
            .and_then(|w| w.parse().ok())
            .unwrap_or(0)
    })
}

#[test]
fn a_flood_of_unique_keys_stays_bounded_and_spares_keys_that_hold_something() {
    let store = Store::with_weigher(100, by_name());
    // Keys near their limits, never touched again during the flood.
    for k in 0..10 {
        store.with(&id(&format!("w900000-victim-{k}")), |_| ());
    }
    for i in 0..10_000 {
        // The flood's own keys hold little (or nothing).
        store.with(&id(&format!("w{}-flood-{i}", i % 1000)), |_| ());
        assert!(store.len() <= 100);
    }
    for k in 0..10 {
        assert!(
            store
                .peek(&id(&format!("w900000-victim-{k}")), |_| ())
                .is_some(),
            "victim-{k} was evicted"
        );
    }
    assert_eq!(store.evictions(), 10 + 10_000 - 100);
}

/// The eviction choice, over random stores: keys heavier than every key of the flood
/// survive it while they are at most a quarter of the store; keys that hold nothing go
/// before keys that hold something whenever the sample meets one; the bound always holds.
#[test]
fn eviction_takes_the_lightest_key_of_its_sample() {
    let mut rng = fastrand::Rng::with_seed(12);
    for round in 0..20 {
        let max = rng.usize(40..400);
        let store = Store::with_weigher(max, by_name());
        let heavy = rng.usize(1..=max / 4);
        let line = rng.u32(1..1_000_000);
        for k in 0..heavy {
            store.with(
                &id(&format!("w{}-heavy-{k}", rng.u32(line..=1_000_000))),
                |_| (),
            );
        }
        let mut flood = Vec::new();
        for i in 0..max * 10 {
            let w = if rng.bool() { 0 } else { rng.u32(0..line) };
            let k = id(&format!("w{w}-flood-{i}"));
            store.with(&k, |_| ());
            flood.push(k);
            assert!(store.len() <= max, "round {round}: over max_keys");
        }
        let mut held = 0;
        store.for_each(|id, _| {
            let (_, _, key) = decode_id(id).expect("an identity");
            held += usize::from(key.contains("-heavy-"));
        });
        assert_eq!(held, heavy, "round {round}: a heavy key was evicted");
        // Of the flood keys still held, the weightless ones are a minority although they
        // are half the flood: each eviction ends at the first weightless key it meets.
        let weightless = flood
            .iter()
            .filter(|k| store.peek(k, |_| ()).is_some())
            .filter(|k| (by_name())(k, &KeyState::new()) == 0)
            .count();
        assert!(
            weightless * 2 < max,
            "round {round}: {weightless} weightless keys held of {max}"
        );
    }
}

#[test]
fn a_key_held_by_a_caller_is_never_evicted() {
    let store = Store::new(10);
    let busy = id("busy");
    let held = store.slot(&busy);
    let _guard = held.lock();
    for i in 0..1_000 {
        store.with(&id(&format!("k{i}")), |_| ());
        assert!(store.len() <= 10);
    }
    assert!(
        store.map.contains_key(&busy[..]),
        "the busy key was evicted"
    );
}

#[test]
fn reads_create_no_key() {
    let store = Store::new(10);
    let k = id("read");
    assert!(store.with_existing(&k, |s| s.crdt().is_empty()));
    assert!(store.is_empty());
    assert!(store.with_existing_slot(&k, |_| ()).is_none());
    assert!(store.is_empty());
    store.with(&k, |_| ());
    assert_eq!(store.with_existing_slot(&k, |_| 7), Some(7));
    assert_eq!(store.len(), 1);
}
