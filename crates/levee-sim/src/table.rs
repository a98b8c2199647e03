//! The accuracy figure (BENCHMARKS.md, figure 8): Levee's two modes beside the three anchor
//! policies, on the same seeds, at 0, 50, 100 and 300 ms between regions.
//!
//! Every cell runs the same plans for every policy: three regions of two nodes, equal
//! weights, a limit of 1,000 per 1 s window, the production timers (gossip 20 ms,
//! `suspect_after` 1 s), no loss, jitter up to 2 ms, clocks within ±10 ms, 10 s per run:
//!
//! * **overshoot**: even demand at ten times the limit, healthy network; admitted/limit per
//!   window from the third on (the highest, and the mean);
//! * **utilisation**: demand split 90/5/5 at twice the limit, healthy network; admitted
//!   relative to the central counter from the third window on (the mean over runs of the
//!   ratio of totals, and the lowest single window);
//! * **partition**: even demand at twice the limit; one region cut off from both others from
//!   2.5 s to about 7.7 s; the highest admitted/limit of any window, and the time from the
//!   heal until every view of the probe key is equal (median and highest).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use levee_testkit::rng::SeededRng;

use crate::checks::{Policy, ViolationKind};
use crate::lists::NodeList;
use crate::outcome::{RunOutcome, overshoot, run_plan, utilisation};
use crate::plan::{
    Algo, Episode, EpisodeKind, Fault, FaultKind, NetParams, ProtocolParams, RunPlan, Topology,
    WINDOW_MS,
};
use crate::runner::parallel_map;
use crate::scenario::{Scenario, add_probe};
use crate::workload::{self, Demand};

/// The inter-region round trips of the figure, ms.
pub const RTTS: [u64; 4] = [0, 50, 100, 300];

/// The limit per window in every cell.
pub const LIMIT: u64 = 1_000;

/// What a cell's plans are for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Case {
    /// Even demand at ten times the limit.
    Overload,
    /// 90/5/5 at twice the limit.
    Skewed,
    /// One region cut off, then healed.
    Partition,
    /// Half the limit, with five bursts of 0.5–2 × the limit in 100–400 ms at one region
    /// (the algorithm rows).
    Bursts,
}

/// A plan of the figure.
pub fn table_plan(case: Case, rtt: u64, seed: u64) -> RunPlan {
    let regions = 3;
    let one_way = rtt / 2;
    let intra = one_way.min(1);
    let mut one_way_ms = vec![vec![one_way; regions]; regions];
    for (r, row) in one_way_ms.iter_mut().enumerate() {
        row[r] = intra;
    }
    let topology = Topology {
        nodes_per_region: vec![2; regions],
        weights: vec![1; regions],
        one_way_ms,
    };
    let mut rng = SeededRng::stream(seed, "table");
    let offsets = (0..topology.nodes())
        .map(|_| rng.range_i64(-10, 10))
        .collect();
    let duration_ms = 10_000;
    let (demand, scenario) = match case {
        Case::Overload => (Demand::Uniform { factor: 10.0 }, Scenario::Steady),
        Case::Skewed => (
            Demand::Skewed {
                factor: 2.0,
                hot: 0,
            },
            Scenario::Skewed,
        ),
        Case::Partition => (Demand::Uniform { factor: 2.0 }, Scenario::RegionIsolated),
        Case::Bursts => (
            Demand::Bursts {
                base: 0.5,
                bursts: 5,
            },
            Scenario::Bursts,
        ),
    };
    let mut demand_rng = SeededRng::stream(seed, "demand");
    let (mut keys, mut requests) =
        workload::generate(&demand, &mut demand_rng, regions, LIMIT, duration_ms);
    let mut faults = Vec::new();
    let mut episodes = Vec::new();
    if case == Case::Partition {
        let (start, heal) = (2_500, 7_000 + rng.range(500, 900));
        let pairs = vec![(2, 0), (0, 2), (2, 1), (1, 2)];
        for &(from, to) in &pairs {
            faults.push(Fault {
                at: start,
                kind: FaultKind::Cut { from, to },
            });
            faults.push(Fault {
                at: heal,
                kind: FaultKind::Mend { from, to },
            });
        }
        faults.sort_by_key(|f| f.at);
        episodes.push(Episode {
            kind: EpisodeKind::Isolated,
            start,
            heal,
            last_down: start,
            cut: pairs,
            sides: vec![vec![2], vec![0, 1]],
        });
    }
    let probe = add_probe(
        &mut keys,
        &mut requests,
        &episodes,
        regions,
        &mut demand_rng,
    );
    let lists = vec![NodeList::initial(&topology)];
    RunPlan {
        seed,
        scenario,
        topology,
        net: NetParams {
            jitter_ms: 2,
            ..NetParams::default()
        },
        protocol: ProtocolParams::default(),
        limit: LIMIT,
        window_ms: WINDOW_MS,
        duration_ms,
        offsets,
        lists,
        faults,
        episodes,
        keys,
        probe,
        requests,
        max_wait_ms: 0,
        algo: crate::plan::Algo::FixedWindow,
        mixed: false,
    }
}

/// One policy at one round trip.
#[derive(Debug, Clone, Default)]
pub struct Cell {
    /// Highest admitted/limit of a window, 10× overload.
    pub overshoot_max: f64,
    /// Mean admitted/limit, 10× overload.
    pub overshoot_mean: f64,
    /// Mean utilisation against the central counter, 90/5/5.
    pub utilisation_mean: f64,
    /// Lowest single-window utilisation, 90/5/5.
    pub utilisation_min: f64,
    /// Highest admitted/limit of a window, a region cut off.
    pub partition_max: f64,
    /// Times to agree after the heal, ms.
    pub agree_ms: Vec<u64>,
    /// Violations of Levee's properties in the cell's runs.
    pub violations: usize,
}

/// The whole figure.
#[derive(Debug, Clone, Default)]
pub struct AccuracyTable {
    /// Seeds per cell.
    pub seeds: u64,
    /// By round trip, then policy (in [`Policy::ALL`] order).
    pub cells: Vec<(u64, Vec<Cell>)>,
    /// Violations found, as text with their replay commands, by kind and policy.
    pub violations: BTreeMap<(ViolationKind, Policy), Vec<String>>,
}

/// Runs every plan of the figure on `threads` threads.
pub fn run_table(seeds: u64, threads: usize) -> AccuracyTable {
    let jobs: Vec<(Case, u64, u64)> = RTTS
        .iter()
        .flat_map(|&rtt| {
            [Case::Overload, Case::Skewed, Case::Partition]
                .into_iter()
                .flat_map(move |case| (0..seeds).map(move |s| (case, rtt, s)))
        })
        .collect();
    let results: Vec<(Case, u64, RunPlan, RunOutcome)> =
        parallel_map(&jobs, threads, |&(case, rtt, seed)| {
            let plan = table_plan(case, rtt, seed);
            let outcome = run_plan(&plan, &Policy::ALL);
            (case, rtt, plan, outcome)
        });
    let mut table = AccuracyTable {
        seeds,
        ..AccuracyTable::default()
    };
    for rtt in RTTS {
        let mut cells = vec![Cell::default(); Policy::ALL.len()];
        for (i, policy) in Policy::ALL.into_iter().enumerate() {
            let cell = &mut cells[i];
            let (mut over_sum, mut over_n) = (0.0, 0usize);
            let (mut util_sum, mut util_n) = (0.0, 0usize);
            cell.utilisation_min = f64::INFINITY;
            for (case, r, plan, outcome) in &results {
                if *r != rtt {
                    continue;
                }
                let Some(run) = outcome.run(policy) else {
                    continue;
                };
                cell.violations += outcome
                    .violations
                    .iter()
                    .filter(|v| v.policy == policy)
                    .count();
                match case {
                    Case::Overload => {
                        for (&(_, w), b) in &run.ledger.windows {
                            if w >= plan.first_counted_window() && w <= plan.last_full_window() {
                                let x = b.admitted_total() as f64 / plan.limit as f64;
                                cell.overshoot_max = cell.overshoot_max.max(x);
                                over_sum += x;
                                over_n += 1;
                            }
                        }
                    }
                    Case::Skewed => {
                        if let Some(c) = outcome.run(Policy::Central)
                            && let Some((u, min_w)) = utilisation(plan, run, c)
                        {
                            util_sum += u;
                            util_n += 1;
                            cell.utilisation_min = cell.utilisation_min.min(min_w);
                        }
                    }
                    Case::Bursts => {}
                    Case::Partition => {
                        for x in overshoot(plan, run) {
                            cell.partition_max = cell.partition_max.max(x);
                        }
                        cell.agree_ms
                            .extend(run.heals.iter().filter_map(|h| h.usage_ms));
                    }
                }
            }
            cell.overshoot_mean = over_sum / over_n.max(1) as f64;
            cell.utilisation_mean = util_sum / util_n.max(1) as f64;
            cell.agree_ms.sort_unstable();
        }
        table.cells.push((rtt, cells));
    }
    for (case, rtt, _, outcome) in &results {
        for v in &outcome.violations {
            table.violations.entry((v.kind, v.policy)).or_default().push(format!(
                "{v} — replay: cargo run --release -p levee-sim -- --table-plan {} --rtt {rtt} --seed {}",
                case.name(),
                outcome.seed
            ));
        }
    }
    table
}

impl Case {
    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Case::Overload => "overload",
            Case::Skewed => "skewed",
            Case::Partition => "partition",
            Case::Bursts => "bursts",
        }
    }
}

impl AccuracyTable {
    /// The figure as a markdown table, with a note on each column.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "| RTT | policy | overshoot, 10× overload: max (mean) | utilisation vs central, 90/5/5 at 2×: mean (lowest window) | overshoot, a region cut off: max | time to agree after heal: median (max) |"
        );
        let _ = writeln!(s, "|---|---|---|---|---|---|");
        for (rtt, cells) in &self.cells {
            for (policy, c) in Policy::ALL.into_iter().zip(cells) {
                let agree = match policy {
                    Policy::StaticSplit => "never (no exchange)".to_owned(),
                    Policy::Central => "0 (one copy)".to_owned(),
                    _ if c.agree_ms.is_empty() => "—".to_owned(),
                    _ => format!(
                        "{} ms ({} ms)",
                        c.agree_ms[c.agree_ms.len() / 2],
                        c.agree_ms[c.agree_ms.len() - 1]
                    ),
                };
                let util_min = if c.utilisation_min.is_finite() {
                    c.utilisation_min
                } else {
                    0.0
                };
                let _ = writeln!(
                    s,
                    "| {rtt} ms | {} | {:.3} ({:.3}) | {:.3} ({:.3}) | {:.3} | {agree} |",
                    policy.name(),
                    c.overshoot_max,
                    c.overshoot_mean,
                    c.utilisation_mean,
                    util_min,
                    c.partition_max,
                );
            }
        }
        let _ = writeln!(
            s,
            "\n{} seeds per cell; limit {LIMIT} per {WINDOW_MS} ms window; 3 regions × 2 nodes; targets (DESIGN.md): never above 1.000; utilisation at least 0.99 on average and 0.97 in every window from the third; agreement of the usage views within 2 × 20 ms + RTT.",
            self.seeds
        );
        if self.violations.is_empty() {
            let _ = writeln!(s, "\nNo property of Levee's was violated in these runs.");
        } else {
            let _ = writeln!(s, "\nProperty violations in these runs:");
            for ((kind, policy), list) in &self.violations {
                let _ = writeln!(
                    s,
                    "- {} [{}]: {} (first: {})",
                    kind.name(),
                    policy.name(),
                    list.len(),
                    list[0]
                );
            }
        }
        s
    }
}

/// The round trip between regions of the algorithm rows, ms.
pub const ALGO_RTT: u64 = 100;

/// The plan of an algorithm row: the figure's plan at [`ALGO_RTT`] enforcing `algo`; with
/// `wait`, callers wait for rights one round trip and two gossip intervals.
pub fn algorithm_plan(case: Case, algo: Algo, wait: bool, seed: u64) -> RunPlan {
    let mut plan = table_plan(case, ALGO_RTT, seed);
    plan.set_algo(algo);
    if wait {
        plan.max_wait_ms = ALGO_RTT + 2 * plan.protocol.gossip_interval;
    }
    plan
}

/// One algorithm and policy of the algorithm rows: utilisation against the central counter
/// (the mean over runs of the ratio of totals, from the third window).
#[derive(Debug, Clone, Default)]
pub struct AlgoCell {
    /// Even demand at ten times the limit.
    pub overload: f64,
    /// 90/5/5 at twice the limit: mean, and the lowest single window.
    pub skewed: (f64, f64),
    /// Bursts, every check answered at once.
    pub bursts: f64,
    /// Bursts, callers waiting for rights (Levee only).
    pub bursts_waiting: Option<f64>,
    /// Violations of Levee's properties in the row's runs (the algorithm's own included).
    pub violations: usize,
}

/// The algorithm rows of the figure, by algorithm then policy (Levee, the static split,
/// the central counter).
#[derive(Debug, Clone, Default)]
pub struct AlgoRows {
    /// Seeds per cell.
    pub seeds: u64,
    /// By algorithm, then policy.
    pub rows: Vec<(Algo, Vec<(Policy, AlgoCell)>)>,
    /// Violations found, with their replay commands.
    pub violations: Vec<String>,
}

/// The policies of the algorithm rows (the shared counter models cost-1 fixed windows only).
const ALGO_POLICIES: [Policy; 3] = [Policy::Strict, Policy::StaticSplit, Policy::Central];

/// Runs every plan of the algorithm rows on `threads` threads.
pub fn run_algorithm_rows(seeds: u64, threads: usize) -> AlgoRows {
    let cases = [
        (Case::Overload, false),
        (Case::Skewed, false),
        (Case::Bursts, false),
        (Case::Bursts, true),
    ];
    let jobs: Vec<(Algo, Case, bool, u64)> = Algo::ALL
        .into_iter()
        .flat_map(|a| {
            cases
                .into_iter()
                .flat_map(move |(c, w)| (0..seeds).map(move |s| (a, c, w, s)))
        })
        .collect();
    let results = parallel_map(&jobs, threads, |&(algo, case, wait, seed)| {
        let plan = algorithm_plan(case, algo, wait, seed);
        let policies: &[Policy] = if wait {
            &[Policy::Strict, Policy::Central]
        } else {
            &ALGO_POLICIES
        };
        let outcome = run_plan(&plan, policies);
        let utils: Vec<(Policy, Option<(f64, f64)>)> = ALGO_POLICIES
            .into_iter()
            .map(|p| {
                let u = match (outcome.run(p), outcome.run(Policy::Central)) {
                    (Some(r), Some(c)) => utilisation(&plan, r, c),
                    _ => None,
                };
                (p, u)
            })
            .collect();
        let violations: Vec<String> = outcome
            .violations
            .iter()
            .map(|v| {
                format!(
                    "{v} — {} {} (wait: {wait}) seed {seed}",
                    algo.name(),
                    case.name()
                )
            })
            .collect();
        (algo, case, wait, utils, violations)
    });
    let mut out = AlgoRows {
        seeds,
        ..AlgoRows::default()
    };
    for algo in Algo::ALL {
        let mut row = Vec::new();
        for policy in ALGO_POLICIES {
            let mut cell = AlgoCell {
                skewed: (0.0, f64::INFINITY),
                ..AlgoCell::default()
            };
            let mut sums: BTreeMap<(u8, bool), (f64, usize)> = BTreeMap::new();
            for (a, case, wait, utils, violations) in &results {
                if *a != algo {
                    continue;
                }
                if policy == Policy::Strict {
                    cell.violations += violations.len();
                }
                let Some((_, Some((u, min_w)))) = utils.iter().find(|(p, _)| *p == policy) else {
                    continue;
                };
                let e = sums.entry((*case as u8, *wait)).or_default();
                e.0 += u;
                e.1 += 1;
                if *case == Case::Skewed {
                    cell.skewed.1 = cell.skewed.1.min(*min_w);
                }
            }
            let mean =
                |c: Case, w: bool| sums.get(&(c as u8, w)).map(|&(s, n)| s / n.max(1) as f64);
            cell.overload = mean(Case::Overload, false).unwrap_or(0.0);
            cell.skewed.0 = mean(Case::Skewed, false).unwrap_or(0.0);
            cell.bursts = mean(Case::Bursts, false).unwrap_or(0.0);
            cell.bursts_waiting =
                mean(Case::Bursts, true).filter(|_| policy != Policy::StaticSplit);
            row.push((policy, cell));
        }
        out.rows.push((algo, row));
    }
    out.violations = results.into_iter().flat_map(|(_, _, _, _, v)| v).collect();
    out
}

impl AlgoRows {
    /// The rows as a markdown table.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "| algorithm | policy | 10× overload: vs central | 90/5/5 at 2×: vs central, mean (lowest window) | bursts: vs central, answered at once | bursts: callers wait RTT + 2 intervals | violations |"
        );
        let _ = writeln!(s, "|---|---|---|---|---|---|---|");
        for (algo, cells) in &self.rows {
            for (policy, c) in cells {
                let waiting = c
                    .bursts_waiting
                    .map_or("—".to_owned(), |w| format!("{w:.3}"));
                let violations = if *policy == Policy::Strict {
                    c.violations.to_string()
                } else {
                    "—".to_owned()
                };
                let low = if c.skewed.1.is_finite() {
                    c.skewed.1
                } else {
                    0.0
                };
                let _ = writeln!(
                    s,
                    "| {} | {} | {:.3} | {:.3} ({:.3}) | {:.3} | {waiting} | {violations} |",
                    algo.name(),
                    policy.name(),
                    c.overload,
                    c.skewed.0,
                    low,
                    c.bursts,
                );
            }
        }
        let _ = writeln!(
            s,
            "\n{} seeds per cell; RTT {ALGO_RTT} ms; limit {LIMIT} per {WINDOW_MS} ms (a token bucket refills {LIMIT} per {WINDOW_MS} ms into a bucket of {LIMIT}; a day's quota is half of what {LIMIT} per second allows over the run); checks of cost 1; 3 regions × 2 nodes.",
            self.seeds
        );
        if self.violations.is_empty() {
            let _ = writeln!(s, "\nNo property of Levee's was violated in these runs.");
        } else {
            let _ = writeln!(
                s,
                "\nProperty violations in these runs ({}):",
                self.violations.len()
            );
            for v in self.violations.iter().take(10) {
                let _ = writeln!(s, "- {v}");
            }
        }
        s
    }
}
