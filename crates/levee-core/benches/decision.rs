//! Figure 4 of `BENCHMARKS.md`: the in-process cost of one decision of the core, CRDT
//! bookkeeping included, beside `governor`'s keyed limiter (the floor for a local decision),
//! over the same 10,000 keys visited in the same order, on one thread and on two.
//!
//! Run with `cargo bench -p levee-core --bench decision`. Criterion prints the time per
//! decision and, through `Throughput::Elements(1)`, decisions per second. Compare Levee with
//! the anchor measured in the same run, never with a figure from another run.
//!
//! How the workload is built:
//!
//! * Keys are `tenant-0000` … `tenant-9999`, visited as one fixed shuffle of the 10,000
//!   (Fisher–Yates driven by a seeded xorshift64, so every run and every system sees the same
//!   sequence), repeated. Every key is in the map before anything is measured: the figures are
//!   the steady state, not insertion.
//! * Time is an argument for Levee, and advances by 1 ms every 1,000 decisions, so token
//!   buckets refill and window epochs roll over (a new epoch slot per key every second).
//! * The limits are high (1,000,000 per second) so nearly every request is allowed, as on a
//!   healthy server; a setup pass checks that every decision of the first round is allowed.
//! * Every map uses `std`'s keyed SipHash (`RandomState`) unless the name says otherwise, as
//!   `governor`'s keyed store does.

// The core never reads a clock (`clippy.toml`); a benchmark has to, to time the core.
#![allow(
    clippy::disallowed_methods,
    clippy::disallowed_types,
    reason = "the benchmark measures wall time around calls that take `now` as an argument"
)]

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use dashmap::DashMap;
use governor::clock::FakeRelativeClock;
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use levee_core::rule::AlgorithmName;
use levee_core::{
    ClusterView, DecideCtx, Decision, KeyState, Millis, NodeIdx, ReplicaSet, ReplicaSpec, Rule,
    RuleMode, RuleSpec, Target,
};

/// Distinct keys in every benchmark.
const KEYS: usize = 10_000;
/// Decisions between two ticks of the simulated clock.
const DECISIONS_PER_MS: u32 = 1_000;
/// The simulated clock starts at 2026-01-01T00:00:00Z, in ms since the Unix epoch.
const START_MS: Millis = 1_767_225_600_000;
/// Tokens per second (and bucket size) of every rule: high enough that nearly all is allowed.
const LIMIT: u64 = 1_000_000;

fn key_names() -> Vec<String> {
    (0..KEYS).map(|i| format!("tenant-{i:04}")).collect()
}

/// One fixed permutation of `0..KEYS`: Fisher–Yates driven by xorshift64 with a constant
/// seed, so the order is the same in every run and for every system measured.
fn visit_order() -> Vec<u32> {
    let mut order: Vec<u32> = (0..KEYS as u32).collect();
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for i in (1..order.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let j = (x % (i as u64 + 1)) as usize;
        order.swap(i, j);
    }
    order
}

/// A cursor over a sequence of key visits with its own simulated clock. It survives from one
/// criterion sample to the next, so time only moves forward.
struct Visits<'k> {
    keys: &'k [String],
    order: Vec<u32>,
    pos: usize,
    now: Millis,
    in_ms: u32,
}

impl<'k> Visits<'k> {
    fn new(keys: &'k [String], order: Vec<u32>) -> Visits<'k> {
        Visits {
            keys,
            order,
            pos: 0,
            now: START_MS,
            in_ms: 0,
        }
    }

    /// The next key and the time of its decision.
    #[inline]
    fn next(&mut self) -> (&'k String, Millis) {
        let key = &self.keys[self.order[self.pos] as usize];
        self.pos += 1;
        if self.pos == self.order.len() {
            self.pos = 0;
        }
        let now = self.now;
        self.in_ms += 1;
        if self.in_ms == DECISIONS_PER_MS {
            self.in_ms = 0;
            self.now += 1;
        }
        (key, now)
    }
}

/// A multiplicative string hasher in the style of FxHash, written for this benchmark. It is
/// not keyed, so a client choosing keys could flood a map that uses it: it is measured only
/// to show how much of a decision the hasher costs, not as a proposal for the server.
#[derive(Default, Clone, Copy)]
struct MultiplyHasher(u64);

impl MultiplyHasher {
    const K: u64 = 0x517c_c1b7_2722_0a95;

    #[inline]
    fn mix(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(Self::K);
    }
}

impl Hasher for MultiplyHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut words = bytes.chunks_exact(8);
        for w in &mut words {
            self.mix(u64::from_le_bytes(w.try_into().expect("8 bytes")));
        }
        let rest = words.remainder();
        if !rest.is_empty() {
            let mut last = [0u8; 8];
            last[..rest.len()].copy_from_slice(rest);
            self.mix(u64::from_le_bytes(last));
        }
    }

    #[inline]
    fn write_u8(&mut self, b: u8) {
        self.mix(u64::from(b));
    }

    #[inline]
    fn finish(&self) -> u64 {
        // The multiply leaves its best bits on top; fold them into the low bits the table
        // indexes with.
        self.0 ^ (self.0 >> 29)
    }
}

type MultiplyBuild = BuildHasherDefault<MultiplyHasher>;

/// Where the key states live: looked up by `&str` on every decision, inserted on a miss.
trait KeyStore {
    fn with_state<R>(&mut self, key: &str, f: impl FnOnce(&mut KeyState) -> R) -> R;
}

impl<S: std::hash::BuildHasher> KeyStore for HashMap<String, KeyState, S> {
    #[inline]
    fn with_state<R>(&mut self, key: &str, f: impl FnOnce(&mut KeyState) -> R) -> R {
        if let Some(state) = self.get_mut(key) {
            return f(state);
        }
        f(self.entry(key.to_owned()).or_default())
    }
}

impl KeyStore for &DashMap<String, KeyState> {
    #[inline]
    fn with_state<R>(&mut self, key: &str, f: impl FnOnce(&mut KeyState) -> R) -> R {
        if let Some(mut state) = self.get_mut(key) {
            return f(&mut state);
        }
        f(&mut self.entry(key.to_owned()).or_default())
    }
}

/// The cluster Levee decides in.
#[derive(Clone, Copy)]
enum Cluster {
    /// `ReplicaSet::single`: one node, the state holds one node's entries.
    Single,
    /// Three regions of two nodes each, strict mode, deciding as node 0: the splits and
    /// per-node entries of the CRDT are those of a real multi-region deployment.
    ThreeRegions,
}

impl Cluster {
    fn replicas(self) -> ReplicaSet {
        match self {
            Cluster::Single => ReplicaSet::single("n1", "eu"),
            Cluster::ThreeRegions => {
                let regions = [
                    ("ap".to_owned(), 1),
                    ("eu".to_owned(), 1),
                    ("us".to_owned(), 1),
                ];
                let nodes: Vec<ReplicaSpec> = ["ap", "eu", "us"]
                    .iter()
                    .flat_map(|r| {
                        (1..=2).map(move |i| ReplicaSpec {
                            id: format!("{r}-{i}"),
                            region: (*r).to_owned(),
                            weight: None,
                        })
                    })
                    .collect();
                ReplicaSet::new(&regions, &nodes).expect("a valid replica set")
            }
        }
    }
}

/// A rule of `algorithm` at [`LIMIT`] per second, bound to `replicas`.
fn rule(algorithm: AlgorithmName, replicas: &ReplicaSet) -> Rule {
    let spec = match algorithm {
        AlgorithmName::TokenBucket => RuleSpec::token_bucket("bench", LIMIT, 1_000, LIMIT),
        _ => RuleSpec::fixed_window("bench", LIMIT, 1_000),
    };
    let mut rule = spec.validate().expect("a valid rule");
    rule.bind(replicas);
    rule
}

/// One Levee decision of cost 1 for `key` at `now`.
#[inline]
fn levee_decide(
    store: &mut impl KeyStore,
    key: &str,
    target: &Target<'_>,
    replicas: &ReplicaSet,
    now: Millis,
) -> Decision {
    let ctx = DecideCtx {
        now,
        me: NodeIdx(0),
        replicas,
        view: ClusterView::alone(),
    };
    store.with_state(key, |s| s.decide(target, RuleMode::Enforce, 1, false, &ctx))
}

/// Puts every key of `visits` in the store with one decision each, checking they are all
/// allowed.
fn fill(store: &mut impl KeyStore, visits: &mut Visits<'_>, target: &Target<'_>, rs: &ReplicaSet) {
    for _ in 0..visits.order.len() {
        let (key, now) = visits.next();
        let d = levee_decide(store, key, target, rs, now);
        assert!(
            d.allowed,
            "the benchmark's limits must allow the first round"
        );
    }
}

/// Runs `iters` decisions on one thread and returns the time they took.
fn levee_one_thread(
    store: &mut impl KeyStore,
    visits: &mut Visits<'_>,
    target: &Target<'_>,
    replicas: &ReplicaSet,
    iters: u64,
) -> Duration {
    let start = Instant::now();
    for _ in 0..iters {
        let (key, now) = visits.next();
        black_box(levee_decide(store, key, target, replicas, now));
    }
    start.elapsed()
}

fn quota() -> Quota {
    Quota::per_second(NonZeroU32::new(LIMIT as u32).expect("non-zero"))
}

/// Runs `iters` decisions split over two threads sharing whatever `work` closes over, and
/// returns the wall time from the first thread's start to the last one's end; criterion then
/// reports total time / total decisions.
///
/// Each thread has its own half of the keys, the halves interleaved through the shuffle
/// (thread 0 takes positions 0, 2, 4 …, thread 1 positions 1, 3, 5 …), in one map shared by
/// both. This is the like-for-like setup for both systems: both pay for sharing one map (its
/// shard locks and cache lines cross cores), neither pays for two threads writing the same
/// key at the same instant, which a server with 10,000 active keys seldom sees, and each
/// key's clock only moves forward.
fn two_threads<W>(iters: u64, visits: &mut [Visits<'_>; 2], work: W) -> Duration
where
    W: Fn(&mut Visits<'_>, u64) + Sync,
{
    let barrier = Barrier::new(2);
    let counts = [iters - iters / 2, iters / 2];
    let spans: Vec<(Instant, Instant)> = std::thread::scope(|s| {
        let handles: Vec<_> = visits
            .iter_mut()
            .zip(counts)
            .map(|(v, n)| {
                let (barrier, work) = (&barrier, &work);
                s.spawn(move || {
                    barrier.wait();
                    let start = Instant::now();
                    work(v, n);
                    (start, Instant::now())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("bench thread"))
            .collect()
    });
    let start = spans.iter().map(|s| s.0).min().expect("two spans");
    let end = spans.iter().map(|s| s.1).max().expect("two spans");
    end - start
}

fn halves<'k>(keys: &'k [String], order: &[u32]) -> [Visits<'k>; 2] {
    let half = |t: usize| order.iter().copied().skip(t).step_by(2).collect();
    [Visits::new(keys, half(0)), Visits::new(keys, half(1))]
}

fn one_thread(c: &mut Criterion) {
    let keys = key_names();
    let order = visit_order();
    let mut g = c.benchmark_group("decide_10k_keys_1_thread");
    g.throughput(Throughput::Elements(1));

    let levee_cases = [
        ("fixed_window", AlgorithmName::FixedWindow, Cluster::Single),
        ("token_bucket", AlgorithmName::TokenBucket, Cluster::Single),
        (
            "fixed_window",
            AlgorithmName::FixedWindow,
            Cluster::ThreeRegions,
        ),
        (
            "token_bucket",
            AlgorithmName::TokenBucket,
            Cluster::ThreeRegions,
        ),
    ];
    for (name, algorithm, cluster) in levee_cases {
        let suffix = match cluster {
            Cluster::Single => "",
            Cluster::ThreeRegions => "_3_regions",
        };
        let replicas = cluster.replicas();
        let rule = rule(algorithm, &replicas);
        let target = rule.target(None, 1).expect("cost 1 fits");

        let mut visits = Visits::new(&keys, order.clone());
        let mut map: HashMap<String, KeyState> = HashMap::with_capacity(KEYS);
        fill(&mut map, &mut visits, &target, &replicas);
        g.bench_function(format!("levee_{name}_hashmap{suffix}"), |b| {
            b.iter_custom(|iters| {
                levee_one_thread(&mut map, &mut visits, &target, &replicas, iters)
            })
        });
        drop(map);

        let mut visits = Visits::new(&keys, order.clone());
        let map: DashMap<String, KeyState> = DashMap::with_capacity(KEYS);
        let mut store = &map;
        fill(&mut store, &mut visits, &target, &replicas);
        g.bench_function(format!("levee_{name}_dashmap{suffix}"), |b| {
            b.iter_custom(|iters| {
                levee_one_thread(&mut store, &mut visits, &target, &replicas, iters)
            })
        });
    }

    // The same token-bucket path with a cheap unkeyed hasher: the difference is the share
    // of SipHash in a decision.
    {
        let replicas = Cluster::Single.replicas();
        let rule = rule(AlgorithmName::TokenBucket, &replicas);
        let target = rule.target(None, 1).expect("cost 1 fits");
        let mut visits = Visits::new(&keys, order.clone());
        let mut map: HashMap<String, KeyState, MultiplyBuild> =
            HashMap::with_capacity_and_hasher(KEYS, MultiplyBuild::default());
        fill(&mut map, &mut visits, &target, &replicas);
        g.bench_function("levee_token_bucket_hashmap_multiply_hasher", |b| {
            b.iter_custom(|iters| {
                levee_one_thread(&mut map, &mut visits, &target, &replicas, iters)
            })
        });
    }

    // The anchor as an operator gets it: `RateLimiter::keyed`, which reads its clock (with
    // the workspace's features, `std::time::Instant`) on every check.
    {
        let limiter: DefaultKeyedRateLimiter<String> = RateLimiter::keyed(quota());
        let mut visits = Visits::new(&keys, order.clone());
        for _ in 0..KEYS {
            assert!(limiter.check_key(visits.next().0).is_ok());
        }
        g.bench_function("governor_keyed", |b| {
            b.iter_custom(|iters| {
                let start = Instant::now();
                for _ in 0..iters {
                    black_box(limiter.check_key(visits.next().0)).ok();
                }
                start.elapsed()
            })
        });
    }

    // The anchor with time given, as Levee gets it: a fake clock advanced 1 ms every 1,000
    // decisions, like Levee's `now`. The difference from `governor_keyed` is the clock read.
    {
        let clock = FakeRelativeClock::default();
        clock.advance(Duration::from_millis(START_MS));
        let limiter = RateLimiter::dashmap_with_clock(quota(), clock.clone());
        let mut visits = Visits::new(&keys, order.clone());
        let mut last = START_MS;
        for _ in 0..KEYS {
            assert!(limiter.check_key(visits.next().0).is_ok());
        }
        g.bench_function("governor_keyed_time_given", |b| {
            b.iter_custom(|iters| {
                let start = Instant::now();
                for _ in 0..iters {
                    let (key, now) = visits.next();
                    if now != last {
                        clock.advance(Duration::from_millis(now - last));
                        last = now;
                    }
                    black_box(limiter.check_key(key)).ok();
                }
                start.elapsed()
            })
        });
    }
    g.finish();
}

fn two_threads_group(c: &mut Criterion) {
    let keys = key_names();
    let order = visit_order();
    let mut g = c.benchmark_group("decide_10k_keys_2_threads");
    g.throughput(Throughput::Elements(1));

    for (name, algorithm) in [
        ("fixed_window", AlgorithmName::FixedWindow),
        ("token_bucket", AlgorithmName::TokenBucket),
    ] {
        let replicas = Cluster::Single.replicas();
        let rule = rule(algorithm, &replicas);
        let target = rule.target(None, 1).expect("cost 1 fits");
        let map: DashMap<String, KeyState> = DashMap::with_capacity(KEYS);
        let mut visits = halves(&keys, &order);
        for v in &mut visits {
            fill(&mut &map, v, &target, &replicas);
        }
        let (map, target, replicas) = (&map, &target, &replicas);
        g.bench_function(format!("levee_{name}_dashmap"), |b| {
            b.iter_custom(|iters| {
                two_threads(iters, &mut visits, |v, n| {
                    let mut store = map;
                    for _ in 0..n {
                        let (key, now) = v.next();
                        black_box(levee_decide(&mut store, key, target, replicas, now));
                    }
                })
            })
        });
    }

    {
        let limiter: DefaultKeyedRateLimiter<String> = RateLimiter::keyed(quota());
        let mut visits = halves(&keys, &order);
        for v in &mut visits {
            for _ in 0..KEYS / 2 {
                assert!(limiter.check_key(v.next().0).is_ok());
            }
        }
        let limiter = &limiter;
        g.bench_function("governor_keyed", |b| {
            b.iter_custom(|iters| {
                two_threads(iters, &mut visits, |v, n| {
                    for _ in 0..n {
                        black_box(limiter.check_key(v.next().0)).ok();
                    }
                })
            })
        });
    }
    g.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(20)
}

criterion_group! {
    name = benches;
    config = config();
    targets = one_thread, two_threads_group
}
criterion_main!(benches);
