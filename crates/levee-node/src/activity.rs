//! What the status page (`GET /`, `GET /v1/status`) shows of the decisions: per rule, how many
//! were allowed and denied since the node started (the page turns totals into rates), and the
//! busiest keys.
//!
//! Both are kept off the cost of a decision: a rule's counts are two relaxed atomic additions
//! next to its Prometheus counters, and keys are sampled, one decision in [`SAMPLE_EVERY`] per
//! thread, into a bounded "space-saving" table of [`TRACKED_KEYS`] entries (Metwally et al.:
//! a key not tracked replaces the least counted one and inherits its count, so a key that
//! takes a large share of decisions is tracked with a count close to its own). Counts are
//! halved every [`HALF_LIFE`], so that the table shows the keys busy now rather than since the
//! start.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// One decision in this many (per thread) is sampled into the busiest keys.
pub const SAMPLE_EVERY: u32 = 16;
/// Keys tracked at once.
pub const TRACKED_KEYS: usize = 64;
/// Every this long the keys' counts are halved.
pub const HALF_LIFE: Duration = Duration::from_secs(10);

/// The decisions of one rule since the node started.
#[derive(Debug, Default)]
pub struct RuleActivity {
    allowed: AtomicU64,
    denied: AtomicU64,
}

impl RuleActivity {
    /// Counts one decision (`allowed`: what the rule's algorithm decided).
    #[inline]
    pub fn record(&self, allowed: bool) {
        if allowed { &self.allowed } else { &self.denied }.fetch_add(1, Ordering::Relaxed);
    }

    /// Decisions allowed and denied so far.
    pub fn totals(&self) -> (u64, u64) {
        (
            self.allowed.load(Ordering::Relaxed),
            self.denied.load(Ordering::Relaxed),
        )
    }
}

/// The counts of every rule ever configured, by name: a rule keeps its counts through reloads.
static RULES: LazyLock<Mutex<BTreeMap<String, Arc<RuleActivity>>>> =
    LazyLock::new(Default::default);

/// The counts of rule `name` (the same ones for every configuration that has it).
pub fn rule(name: &str) -> Arc<RuleActivity> {
    Arc::clone(RULES.lock().entry(name.to_owned()).or_default())
}

/// Every rule's `(name, allowed, denied)`, by name.
pub fn rules() -> Vec<(String, u64, u64)> {
    RULES
        .lock()
        .iter()
        .map(|(name, a)| {
            let (allowed, denied) = a.totals();
            (name.clone(), allowed, denied)
        })
        .collect()
}

/// A tracked key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BusyKey {
    /// The rule.
    pub rule: String,
    /// The key.
    pub key: String,
    /// Sampled decisions (halved every [`HALF_LIFE`]); an over-estimate by at most `error`.
    pub count: u64,
    /// What the key inherited when it replaced another in the table.
    pub error: u64,
}

/// A bounded table of the most sampled keys ("space-saving").
#[derive(Debug)]
pub struct TopKeys {
    capacity: usize,
    entries: Vec<BusyKey>,
}

impl TopKeys {
    /// An empty table of at most `capacity` keys.
    pub fn new(capacity: usize) -> TopKeys {
        TopKeys {
            capacity: capacity.max(1),
            entries: Vec::with_capacity(capacity.max(1)),
        }
    }

    /// Counts one sample of `key` of `rule`.
    pub fn hit(&mut self, rule: &str, key: &str) {
        if let Some(e) = self
            .entries
            .iter_mut()
            .find(|e| e.key == key && e.rule == rule)
        {
            e.count += 1;
            return;
        }
        if self.entries.len() < self.capacity {
            self.entries.push(BusyKey {
                rule: rule.to_owned(),
                key: key.to_owned(),
                count: 1,
                error: 0,
            });
            return;
        }
        if let Some(min) = self.entries.iter_mut().min_by_key(|e| e.count) {
            let floor = min.count;
            *min = BusyKey {
                rule: rule.to_owned(),
                key: key.to_owned(),
                count: floor + 1,
                error: floor,
            };
        }
    }

    /// Halves every count; keys that fall to nothing leave the table.
    pub fn decay(&mut self) {
        for e in &mut self.entries {
            e.count /= 2;
            e.error /= 2;
        }
        self.entries.retain(|e| e.count > 0);
    }

    /// The `n` most counted keys, most first.
    pub fn top(&self, n: usize) -> Vec<BusyKey> {
        let mut v = self.entries.clone();
        v.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.key.cmp(&b.key)));
        v.truncate(n);
        v
    }
}

struct Sampled {
    keys: TopKeys,
    decayed: Instant,
}

static KEYS: LazyLock<Mutex<Sampled>> = LazyLock::new(|| {
    Mutex::new(Sampled {
        keys: TopKeys::new(TRACKED_KEYS),
        decayed: Instant::now(),
    })
});

thread_local! {
    /// Each thread's generator, seeded from where its stack lies.
    static RNG: RefCell<fastrand::Rng> = RefCell::new(fastrand::Rng::with_seed({
        let here = 0u8;
        std::ptr::addr_of!(here) as u64
    }));
}

/// Whether to sample this decision: at random, one in [`SAMPLE_EVERY`] (a fixed stride would
/// see only every other key of keys that alternate).
#[inline]
fn due() -> bool {
    RNG.with(|r| r.borrow_mut().u32(..SAMPLE_EVERY) == 0)
}

/// Rights (tokens) this node has given to others by strict mode's rebalancing, as the
/// replication loop last read it from the state machine.
static RIGHTS_MOVED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Notes the machine's running total of rights given (the replication loop, every 100 ms).
pub fn set_rights_moved(total: u64) {
    RIGHTS_MOVED.store(total, std::sync::atomic::Ordering::Relaxed);
}

/// Rights this node has given to others so far (0 on a single node).
pub fn rights_moved() -> u64 {
    RIGHTS_MOVED.load(std::sync::atomic::Ordering::Relaxed)
}

/// Samples a decision of `key` of `rule` into the busiest keys: one call in [`SAMPLE_EVERY`]
/// (at random) takes the table's lock, the others touch a thread-local generator only.
#[inline]
pub fn sample(rule: &str, key: &str) {
    if due() {
        sample_now(rule, key);
    }
}

#[cold]
fn sample_now(rule: &str, key: &str) {
    let mut s = KEYS.lock();
    if s.decayed.elapsed() >= HALF_LIFE {
        s.keys.decay();
        s.decayed = Instant::now();
    }
    s.keys.hit(rule, key);
}

/// The `n` busiest keys now, most first, their counts scaled back to estimated decisions
/// (sampled count × [`SAMPLE_EVERY`]).
pub fn busiest(n: usize) -> Vec<BusyKey> {
    let mut s = KEYS.lock();
    if s.decayed.elapsed() >= HALF_LIFE {
        s.keys.decay();
        s.decayed = Instant::now();
    }
    s.keys
        .top(n)
        .into_iter()
        .map(|k| BusyKey {
            count: k.count * u64::from(SAMPLE_EVERY),
            error: k.error * u64::from(SAMPLE_EVERY),
            ..k
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_heavy_key_is_found_among_many_light_ones_in_a_bounded_table() {
        let mut t = TopKeys::new(8);
        for i in 0..10_000u32 {
            // One key in four is "hot"; the others are all different.
            if i % 4 == 0 {
                t.hit("api", "hot");
            } else {
                t.hit("api", &format!("cold-{i}"));
            }
            assert!(t.entries.len() <= 8);
        }
        let top = t.top(3);
        assert_eq!(top[0].key, "hot");
        // Its count is at least its true count (2500), over by at most its error.
        assert!(top[0].count >= 2_500 && top[0].count - top[0].error <= 2_500);
    }

    #[test]
    fn keys_that_alternate_are_all_sampled() {
        // Two keys taking turns: a fixed stride (one in 16) would only ever see one of them.
        let mut seen = [0u32; 2];
        for i in 0..3_200 {
            if due() {
                seen[i % 2] += 1;
            }
        }
        assert!(seen[0] > 0 && seen[1] > 0, "{seen:?}");
    }

    #[test]
    fn the_same_key_of_two_rules_is_two_entries_and_decay_forgets() {
        let mut t = TopKeys::new(4);
        t.hit("a", "k");
        t.hit("b", "k");
        t.hit("b", "k");
        assert_eq!(
            t.top(4)
                .iter()
                .map(|e| (e.rule.as_str(), e.count))
                .collect::<Vec<_>>(),
            [("b", 2), ("a", 1)]
        );
        t.decay();
        assert_eq!(t.top(4).len(), 1);
        t.decay();
        assert!(t.top(4).is_empty());
    }

    #[test]
    fn a_rule_keeps_its_counts_across_configurations() {
        let a = rule("activity-test-rule");
        a.record(true);
        a.record(false);
        a.record(false);
        assert_eq!(rule("activity-test-rule").totals(), (1, 2));
        assert!(
            rules()
                .iter()
                .any(|(n, a, d)| n == "activity-test-rule" && (*a, *d) == (1, 2))
        );
    }
}
