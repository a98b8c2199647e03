//! Many seeds on a few threads. Each run is single-threaded and deterministic; threads only
//! take seeds from a shared counter, and the summary is the same whatever the interleaving.

use std::io::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::checks::Policy;
use crate::outcome::run_plan;
use crate::scenario::Scenario;
use crate::summary::Summary;

/// Which seeds to run.
#[derive(Debug, Clone)]
pub struct Batch {
    /// The first seed.
    pub first_seed: u64,
    /// How many seeds.
    pub seeds: u64,
    /// Run only this scenario (else seeds cycle through `set`).
    pub scenario: Option<Scenario>,
    /// The scenarios seeds cycle through: [`Scenario::ALL`] (the classic set) or
    /// [`Scenario::DEMAND`].
    pub set: &'static [Scenario],
    /// Worker threads.
    pub threads: usize,
    /// Print a progress line on stderr.
    pub progress: bool,
    /// Who a node gossips with, in every run.
    pub gossip: levee_cluster::Topology,
    /// `cluster.local_first` on every node, in every run.
    pub local_first: bool,
}

/// Runs every seed of `batch` with every policy and folds the outcomes.
pub fn run_batch(batch: &Batch) -> Summary {
    let next = AtomicU64::new(0);
    let done = AtomicU64::new(0);
    let failed = AtomicU64::new(0);
    let started = Instant::now();
    let total = batch.seeds;
    let mut summary = Summary::default();
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..batch.threads.max(1))
            .map(|_| {
                s.spawn(|| {
                    let mut local = Summary::default();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= total {
                            break;
                        }
                        let seed = batch.first_seed + i;
                        let scenario = batch
                            .scenario
                            .unwrap_or(Scenario::for_seed_in(batch.set, seed));
                        let mut plan = scenario.plan(seed);
                        plan.protocol.gossip = batch.gossip;
                        plan.protocol.local_first = batch.local_first;
                        let outcome = run_plan(&plan, &Policy::ALL);
                        if !outcome.violations.is_empty() {
                            failed.fetch_add(1, Ordering::Relaxed);
                        }
                        local.add(&plan, &outcome);
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                    local
                })
            })
            .collect();
        if batch.progress {
            let mut err = std::io::stderr();
            while done.load(Ordering::Relaxed) < total {
                std::thread::sleep(Duration::from_millis(500));
                let d = done.load(Ordering::Relaxed);
                let secs = started.elapsed().as_secs_f64();
                let eta = if d > 0 {
                    secs / d as f64 * (total - d) as f64
                } else {
                    0.0
                };
                let _ = write!(
                    err,
                    "\r[{d}/{total}] {secs:.0} s elapsed, ~{eta:.0} s left, {} failed runs   ",
                    failed.load(Ordering::Relaxed)
                );
                let _ = err.flush();
            }
            let _ = writeln!(err);
        }
        for w in workers {
            summary.merge(w.join().expect("workers catch their runs' panics"));
        }
    });
    summary
}

/// Applies `f` to every item on `threads` threads; results in the items' order.
pub fn parallel_map<T: Sync, R: Send>(
    items: &[T],
    threads: usize,
    f: impl Fn(&T) -> R + Sync,
) -> Vec<R> {
    let next = AtomicU64::new(0);
    let mut out: Vec<(usize, R)> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads.max(1))
            .map(|_| {
                s.spawn(|| {
                    let mut local = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                        if i >= items.len() {
                            break;
                        }
                        local.push((i, f(&items[i])));
                    }
                    local
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().expect("the work catches its own panics"))
            .collect()
    });
    out.sort_by_key(|(i, _)| *i);
    out.into_iter().map(|(_, r)| r).collect()
}
