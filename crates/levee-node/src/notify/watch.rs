//! The decision side of notices: which thresholds a decision reached, whether each was already
//! noticed in its window, and a non-blocking push onto the sender's queue.

use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;
use levee_core::{Algorithm, Decision};
use moka::policy::EvictionPolicy;
use moka::sync::Cache;
use parking_lot::Mutex;
use tokio::sync::mpsc;

use super::notice::{Notice, window_end_ms, window_start_ms};
use crate::config::{Config, NotifySection};
use crate::metrics::NoticeMetrics;

/// How many crossings a node remembers as noticed. Beyond it the least recently seen are
/// forgotten; a forgotten crossing reached again in the same window is noticed again, with
/// the same `Idempotency-Key`.
pub const SEEN_CAPACITY: u64 = 100_000;

/// The notices of one node: the `[[notify]]` targets in force, the crossings already noticed,
/// and the sending end of the queue.
pub struct Notices {
    targets: ArcSwap<Vec<Arc<Target>>>,
    seen: Cache<u64, Duration>,
    hasher: RandomState,
    tx: mpsc::Sender<Queued>,
    rx: Mutex<Option<mpsc::Receiver<Queued>>>,
    node: String,
    region: String,
    counters: NoticeMetrics,
}

/// A notice on its way, with the target it goes to.
pub struct Queued {
    pub(super) notice: Notice,
    pub(super) target: Arc<Target>,
}

/// A `[[notify]]` table, ready for use.
pub(super) struct Target {
    pub(super) url: String,
    pub(super) uri: axum::http::Uri,
    rules: Option<Vec<String>>,
    /// Ascending, each with its value in millionths.
    thresholds: Vec<(f64, u64)>,
    pub(super) timeout: Duration,
    queue: usize,
    /// Notices to this URL queued or being delivered; never above `queue`. Shared with the
    /// target of the same URL before a reload.
    pub(super) pending: Arc<AtomicUsize>,
}

impl Target {
    fn new(n: &NotifySection) -> Target {
        let mut thresholds: Vec<(f64, u64)> = n
            .thresholds
            .iter()
            .map(|&t| (t, ((t * 1_000_000.0).round() as u64).max(1)))
            .collect();
        thresholds.sort_by_key(|&(_, m)| m);
        thresholds.dedup_by_key(|&mut (_, m)| m);
        Target {
            url: n.url.clone(),
            uri: super::check_url(&n.url).unwrap_or_default(),
            rules: n.rules.clone(),
            thresholds,
            timeout: Duration::from_millis(n.timeout.as_millis()),
            queue: n.queue,
            pending: Arc::new(AtomicUsize::new(0)),
        }
    }

    fn watches(&self, rule: &str) -> bool {
        self.rules
            .as_ref()
            .is_none_or(|rules| rules.iter().any(|r| r == rule))
    }
}

/// Crossings noticed live until their window ends (plus a minute for clock skew between
/// nodes and late decisions).
struct SeenExpiry;

impl moka::Expiry<u64, Duration> for SeenExpiry {
    fn expire_after_create(
        &self,
        _: &u64,
        ttl: &Duration,
        _: std::time::Instant,
    ) -> Option<Duration> {
        Some(*ttl)
    }
}

impl Notices {
    /// The notices of a configuration.
    pub fn new(config: &Config) -> Notices {
        // The channel is only a hand-over: every target bounds what it has pending (queued or
        // being retried) by its own `queue` before anything is pushed.
        let (tx, rx) = mpsc::channel(1_000_000);
        let notices = Notices {
            targets: ArcSwap::from_pointee(Vec::new()),
            seen: Cache::builder()
                .max_capacity(SEEN_CAPACITY)
                .eviction_policy(EvictionPolicy::lru())
                .expire_after(SeenExpiry)
                .build(),
            hasher: RandomState::new(),
            tx,
            rx: Mutex::new(Some(rx)),
            node: config.node.id.clone(),
            region: config.node.region.clone(),
            counters: NoticeMetrics::new(),
        };
        notices.reconfigure(config);
        notices
    }

    /// Takes the `[[notify]]` tables of a (reloaded) configuration. A target whose URL is
    /// unchanged keeps what it has pending.
    pub fn reconfigure(&self, config: &Config) {
        let old = self.targets.load();
        let targets = config
            .notify
            .iter()
            .map(|n| {
                let mut t = Target::new(n);
                if let Some(o) = old.iter().find(|o| o.url == t.url) {
                    t.pending = Arc::clone(&o.pending);
                }
                Arc::new(t)
            })
            .collect();
        self.targets.store(Arc::new(targets));
    }

    /// The receiving end of the queue, for the sender task (once).
    pub fn take_queue(&self) -> Option<mpsc::Receiver<Queued>> {
        self.rx.lock().take()
    }

    pub(super) fn counters(&self) -> &NoticeMetrics {
        &self.counters
    }

    /// Called after each decision this node makes that takes something (not a dry run, not
    /// a read): queues a notice for every threshold of every target the key's use reached
    /// and that was not yet noticed in this window. Never waits: a notice that does not fit
    /// its target's queue is dropped and counted.
    pub fn observe(&self, rule: &str, algorithm: &Algorithm, key: &str, d: &Decision, now: u64) {
        let targets = self.targets.load();
        if targets.is_empty() || d.limit == 0 {
            return;
        }
        let used = d.limit.saturating_sub(d.remaining);
        let reached =
            |micro: u64| u128::from(used) * 1_000_000 >= u128::from(micro) * u128::from(d.limit);
        let mut window = None;
        for t in targets.iter() {
            if !t.watches(rule) {
                continue;
            }
            for &(threshold, micro) in &t.thresholds {
                if !reached(micro) {
                    break;
                }
                let (start, end) = *window.get_or_insert_with(|| {
                    (
                        window_start_ms(algorithm, now),
                        window_end_ms(algorithm, now),
                    )
                });
                let id = self.hasher.hash_one((&t.url, rule, key, micro, start));
                let ttl = Duration::from_millis(end.saturating_sub(now) + 60_000);
                if !self.seen.entry(id).or_insert(ttl).is_fresh() {
                    continue;
                }
                if t.pending.fetch_add(1, Ordering::AcqRel) >= t.queue {
                    t.pending.fetch_sub(1, Ordering::AcqRel);
                    self.counters.dropped.increment(1);
                    continue;
                }
                let notice = Notice {
                    rule: rule.to_owned(),
                    key: key.to_owned(),
                    threshold,
                    used,
                    limit: d.limit,
                    window_start_ms: start,
                    region: self.region.clone(),
                    node: self.node.clone(),
                    at_ms: now,
                };
                let queued = Queued {
                    notice,
                    target: Arc::clone(t),
                };
                if self.tx.try_send(queued).is_err() {
                    t.pending.fetch_sub(1, Ordering::AcqRel);
                    self.counters.dropped.increment(1);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use levee_core::RuleMode;

    use super::*;

    fn config(queue: usize) -> Config {
        let text = format!(
            "[[rule]]\nname = \"api\"\nalgorithm = \"fixed_window\"\nlimit = 10\nwindow = \"1m\"\n\
             [[rule]]\nname = \"other\"\nalgorithm = \"fixed_window\"\nlimit = 10\nwindow = \"1m\"\n\
             [[notify]]\nurl = \"http://127.0.0.1:9/h\"\nrules = [\"api\"]\nqueue = {queue}\n"
        );
        Config::parse(&text, "t.toml").unwrap()
    }

    fn used(n: u64) -> Decision {
        Decision {
            allowed: true,
            would_allow: true,
            limit: 10,
            remaining: 10 - n,
            reset_after_ms: 0,
            retry_after_ms: 0,
            mode: RuleMode::Enforce,
            degraded: false,
            delay_ms: 0,
        }
    }

    fn drain(rx: &mut mpsc::Receiver<Queued>) -> Vec<(f64, u64)> {
        std::iter::from_fn(|| rx.try_recv().ok())
            .map(|q| (q.notice.threshold, q.notice.window_start_ms))
            .collect()
    }

    #[test]
    fn each_threshold_is_queued_once_per_window() {
        let c = config(100);
        let n = Notices::new(&c);
        let mut rx = n.take_queue().unwrap();
        let alg = c.rules[0].algorithm;
        for u in 0..=7 {
            n.observe("api", &alg, "k", &used(u), 61_000);
        }
        assert!(drain(&mut rx).is_empty());
        // A jump from 7 to 9 reaches 0.8 and 0.9 at once; repeats notice nothing more.
        n.observe("api", &alg, "k", &used(9), 62_000);
        n.observe("api", &alg, "k", &used(9), 63_000);
        n.observe("api", &alg, "k", &used(10), 64_000);
        n.observe("api", &alg, "k", &used(10), 65_000);
        assert_eq!(
            drain(&mut rx),
            vec![(0.8, 60_000), (0.9, 60_000), (1.0, 60_000)]
        );
        // Another window, another key, a rule not watched.
        n.observe("api", &alg, "k", &used(8), 125_000);
        n.observe("api", &alg, "j", &used(8), 125_000);
        n.observe("other", &alg, "k", &used(10), 125_000);
        assert_eq!(drain(&mut rx), vec![(0.8, 120_000), (0.8, 120_000)]);
    }

    #[test]
    fn a_full_queue_drops_without_waiting() {
        let c = config(2);
        let n = Notices::new(&c);
        let mut rx = n.take_queue().unwrap();
        let alg = c.rules[0].algorithm;
        for key in ["a", "b", "c"] {
            n.observe("api", &alg, key, &used(10), 1_000);
        }
        // Two fit (key a's 0.8 and 0.9); the rest of the seven crossings are dropped.
        assert_eq!(drain(&mut rx).len(), 2);
        let targets = n.targets.load();
        assert_eq!(targets[0].pending.load(Ordering::Acquire), 2);
    }
}
