//! Figures over many runs, folded as runs finish (so that memory stays flat), and printed.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::checks::{Policy, ViolationKind};
use crate::heal::HealFigure;
use crate::histogram::Histogram;
use crate::outcome::{RunOutcome, ghost_overshoot, overshoot, restart_overshoot, utilisation};
use crate::plan::RunPlan;
use crate::scenario::Scenario;
use crate::settle::{self, MembershipStats};

/// Example runs kept per kind of violation.
const EXAMPLES: usize = 5;

/// Runs of lowest utilisation kept per policy, printed with the commands that replay them.
pub const LOWEST_RUNS: usize = 5;

/// A run with a violation: (seed, scenario, the violation's figures).
pub type Example = (u64, Scenario, String);

/// A value and the run it came from.
#[derive(Debug, Clone, Copy)]
pub struct Witness {
    /// The value.
    pub value: f64,
    /// The run's seed.
    pub seed: u64,
    /// The run's scenario.
    pub scenario: Scenario,
}

fn keep_max(slot: &mut Option<Witness>, w: Witness) {
    if slot.is_none_or(|s| w.value > s.value || (w.value == s.value && w.seed < s.seed)) {
        *slot = Some(w);
    }
}

/// Keeps `w` among the [`LOWEST_RUNS`] lowest values of `list` (lowest first, then lowest seed).
fn keep_lowest(list: &mut Vec<Witness>, w: Witness) {
    list.push(w);
    list.sort_by(|a, b| a.value.total_cmp(&b.value).then(a.seed.cmp(&b.seed)));
    list.truncate(LOWEST_RUNS);
}

fn keep_min(slot: &mut Option<Witness>, w: Witness) {
    if slot.is_none_or(|s| w.value < s.value || (w.value == s.value && w.seed < s.seed)) {
        *slot = Some(w);
    }
}

/// One policy's figures over many runs.
#[derive(Debug, Clone, Default)]
pub struct PolicyStats {
    /// admitted/limit of every window whose demand reached the limit.
    pub overshoot: Histogram,
    /// Windows admitted above the limit.
    pub over_limit: u64,
    /// The worst window.
    pub worst: Option<Witness>,
    /// Utilisation of each run without partitions or crashes, against the central counter.
    pub utilisation: Histogram,
    /// The same, by scenario.
    pub utilisation_by_scenario: BTreeMap<Scenario, Histogram>,
    /// The lowest utilisation of a single window (from the third on).
    pub worst_window: Option<Witness>,
    /// The runs of lowest utilisation, lowest first (at most [`LOWEST_RUNS`]).
    pub lowest_runs: Vec<Witness>,
    /// Agreement after heals.
    pub heals: Vec<HealFigure>,
}

/// A run that failed, with the command that replays it.
#[derive(Debug, Clone)]
pub struct Failure {
    /// The seed.
    pub seed: u64,
    /// The scenario.
    pub scenario: Scenario,
    /// Every violation, as text.
    pub violations: Vec<String>,
    /// The replay command.
    pub replay: String,
}

/// Figures over many runs.
#[derive(Debug, Clone, Default)]
pub struct Summary {
    /// Runs folded in.
    pub runs: u64,
    /// Per policy.
    pub policies: BTreeMap<Policy, PolicyStats>,
    /// Violations by kind and policy.
    pub violations: BTreeMap<(ViolationKind, Policy), u64>,
    /// Runs with at least one violation.
    pub failures: Vec<Failure>,
    /// For every kind of violation and policy, the first few runs (lowest seeds) with one:
    /// (seed, scenario, the violation).
    pub examples: BTreeMap<(ViolationKind, Policy), Vec<Example>>,
    /// Strict windows above the limit by no more than what crashes forgot: (count, largest
    /// excess in tokens, the run).
    pub restart_windows: u64,
    /// The largest such excess.
    pub restart_excess: Option<Witness>,
    /// Strict windows above the limit by no more than the old shares of removed nodes that
    /// went on with their old list (`checks::ghost_allowance`).
    pub ghost_windows: u64,
    /// The largest such excess, as a fraction of the limit.
    pub ghost_excess: Option<Witness>,
    /// Membership changes, by scenario.
    pub membership: BTreeMap<Scenario, MembershipStats>,
}

impl Summary {
    /// Folds one run in.
    pub fn add(&mut self, plan: &RunPlan, outcome: &RunOutcome) {
        self.runs += 1;
        let quiet = !plan.scenario.partitions() && !plan.has_crashes();
        let central = outcome.run(Policy::Central);
        for run in &outcome.runs {
            let stats = self.policies.entry(run.policy).or_default();
            let witness = |value| Witness {
                value,
                seed: outcome.seed,
                scenario: outcome.scenario,
            };
            for r in overshoot(plan, run) {
                stats.overshoot.add(r);
                if r > 1.0 {
                    stats.over_limit += 1;
                }
                keep_max(&mut stats.worst, witness(r));
            }
            if quiet
                && let Some(c) = central
                && let Some((u, min_w)) = utilisation(plan, run, c)
            {
                stats.utilisation.add(u);
                stats
                    .utilisation_by_scenario
                    .entry(plan.scenario)
                    .or_default()
                    .add(u);
                keep_min(&mut stats.worst_window, witness(min_w));
                keep_lowest(&mut stats.lowest_runs, witness(u));
            }
            stats.heals.extend(run.heals.iter().copied());
            if run.policy == Policy::Strict {
                let (count, max) = ghost_overshoot(plan, run);
                self.ghost_windows += count;
                if count > 0 {
                    keep_max(
                        &mut self.ghost_excess,
                        witness(max as f64 / plan.limit as f64),
                    );
                }
                let (count, max) = restart_overshoot(plan, run);
                self.restart_windows += count;
                if count > 0 {
                    keep_max(
                        &mut self.restart_excess,
                        witness(max as f64 / plan.limit as f64),
                    );
                }
            }
        }
        if plan.has_membership() {
            self.membership
                .entry(plan.scenario)
                .or_default()
                .add(plan, outcome);
        }
        for v in &outcome.violations {
            *self.violations.entry((v.kind, v.policy)).or_default() += 1;
            let ex = self.examples.entry((v.kind, v.policy)).or_default();
            if !ex.iter().any(|e| e.0 == outcome.seed) {
                ex.push((outcome.seed, outcome.scenario, v.detail.clone()));
                ex.sort_by_key(|e| e.0);
                ex.truncate(EXAMPLES);
            }
        }
        if !outcome.violations.is_empty() {
            self.failures.push(Failure {
                seed: outcome.seed,
                scenario: outcome.scenario,
                violations: outcome.violations.iter().map(|v| v.to_string()).collect(),
                replay: outcome.replay_command(),
            });
        }
    }

    /// Adds another summary's runs.
    pub fn merge(&mut self, other: Summary) {
        self.runs += other.runs;
        for (p, s) in other.policies {
            let mine = self.policies.entry(p).or_default();
            mine.overshoot.merge(&s.overshoot);
            mine.over_limit += s.over_limit;
            if let Some(w) = s.worst {
                keep_max(&mut mine.worst, w);
            }
            mine.utilisation.merge(&s.utilisation);
            for (sc, h) in &s.utilisation_by_scenario {
                mine.utilisation_by_scenario
                    .entry(*sc)
                    .or_default()
                    .merge(h);
            }
            if let Some(w) = s.worst_window {
                keep_min(&mut mine.worst_window, w);
            }
            for w in s.lowest_runs {
                keep_lowest(&mut mine.lowest_runs, w);
            }
            mine.heals.extend(s.heals);
        }
        for (k, n) in other.violations {
            *self.violations.entry(k).or_default() += n;
        }
        for (k, ex) in other.examples {
            let mine = self.examples.entry(k).or_default();
            mine.extend(ex);
            mine.sort_by_key(|e| e.0);
            mine.dedup_by_key(|e| e.0);
            mine.truncate(EXAMPLES);
        }
        self.failures.extend(other.failures);
        self.failures.sort_by_key(|f| f.seed);
        self.restart_windows += other.restart_windows;
        if let Some(w) = other.restart_excess {
            keep_max(&mut self.restart_excess, w);
        }
        self.ghost_windows += other.ghost_windows;
        if let Some(w) = other.ghost_excess {
            keep_max(&mut self.ghost_excess, w);
        }
        for (sc, st) in &other.membership {
            self.membership.entry(*sc).or_default().merge(st);
        }
    }

    /// Number of violations of Levee's properties.
    pub fn violation_count(&self) -> u64 {
        self.violations.values().sum()
    }

    /// The report.
    pub fn render(&self, max_failures: usize) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "runs: {}", self.runs);
        let _ = writeln!(
            s,
            "violations: {} in {} runs",
            self.violation_count(),
            self.failures.len()
        );
        for kind in ViolationKind::ALL {
            for p in Policy::ALL {
                if let Some(n) = self.violations.get(&(kind, p)) {
                    let _ = writeln!(s, "  {:<17} {:<18} {n}", kind.name(), p.name());
                }
            }
        }
        let _ = writeln!(s);
        let _ = writeln!(
            s,
            "{:<36} {:>9} {:>10} {:>9} {:>9} {:>9}   {:>11} {:>8} {:>8}",
            "policy", "windows*", "over limit", "max", "p99", "p50", "utilisation", "p1", "min win"
        );
        for p in Policy::ALL {
            let Some(st) = self.policies.get(&p) else {
                continue;
            };
            let _ = writeln!(
                s,
                "{:<36} {:>9} {:>10} {:>9.4} {:>9.4} {:>9.4}   {:>11.4} {:>8.4} {:>8.4}",
                p.name(),
                st.overshoot.len(),
                st.over_limit,
                st.overshoot.max(),
                st.overshoot.quantile(0.99),
                st.overshoot.quantile(0.5),
                st.utilisation.mean(),
                st.utilisation.quantile(0.01),
                st.worst_window.map_or(0.0, |w| w.value),
            );
        }
        let _ = writeln!(
            s,
            "  * windows whose demand reached the limit; max/p99/p50 of admitted/limit per window.\n    utilisation: admitted / central counter's admitted, from the third window, runs without\n    partitions or crashes (mean; p1 over runs; lowest single window where the central counter\n    admitted at least half the limit)."
        );
        let scenarios: Vec<Scenario> = Scenario::every()
            .filter(|sc| {
                self.policies
                    .values()
                    .any(|st| st.utilisation_by_scenario.contains_key(sc))
            })
            .collect();
        if !scenarios.is_empty() {
            let _ = write!(
                s,
                "  utilisation by scenario (mean / p1 over runs):
  {:<34}",
                ""
            );
            for sc in &scenarios {
                let _ = write!(s, " {:>17}", sc.name());
            }
            let _ = writeln!(s);
            for p in Policy::ALL {
                let Some(st) = self.policies.get(&p) else {
                    continue;
                };
                let _ = write!(s, "  {:<34}", p.name());
                for sc in &scenarios {
                    let h = st
                        .utilisation_by_scenario
                        .get(sc)
                        .cloned()
                        .unwrap_or_default();
                    let _ = write!(s, "   {:>6.4} / {:>6.4}", h.mean(), h.quantile(0.01));
                }
                let _ = writeln!(s);
            }
        }
        for p in Policy::ALL {
            if let Some(w) = self.policies.get(&p).and_then(|st| st.worst_window) {
                let _ = writeln!(
                    s,
                    "  lowest window utilisation, {}: {:.4} (seed {} --scenario {})",
                    p.name(),
                    w.value,
                    w.seed,
                    w.scenario.name()
                );
            }
        }
        if let Some(st) = self.policies.get(&Policy::Strict)
            && !st.lowest_runs.is_empty()
        {
            let runs: Vec<String> = st
                .lowest_runs
                .iter()
                .map(|w| {
                    format!(
                        "{:.4} (--seed {} --scenario {})",
                        w.value,
                        w.seed,
                        w.scenario.name()
                    )
                })
                .collect();
            let _ = writeln!(
                s,
                "  lowest runs, {}: {}",
                Policy::Strict.name(),
                runs.join(", ")
            );
        }
        for p in Policy::ALL {
            if let Some(w) = self.policies.get(&p).and_then(|st| st.worst) {
                let _ = writeln!(
                    s,
                    "  worst window, {}: {:.4} × limit (seed {} --scenario {})",
                    p.name(),
                    w.value,
                    w.seed,
                    w.scenario.name()
                );
            }
        }
        let _ = writeln!(s);
        let _ = writeln!(
            s,
            "strict: windows above the limit by no more than usage/gifts a crash forgot: {}{}",
            self.restart_windows,
            largest_excess(self.restart_excess)
        );
        if !self.membership.is_empty() {
            let _ = writeln!(
                s,
                "strict: windows above the limit by no more than the old shares of removed nodes that went on with their old list (thawed): {}{}",
                self.ghost_windows,
                largest_excess(self.ghost_excess)
            );
            let _ = writeln!(s);
            let _ = write!(s, "{}", settle::render(&self.membership));
        }
        let _ = writeln!(s);
        let _ = writeln!(
            s,
            "time to agree after a heal (probe key, partitions the protocol detected; target 2 × gossip + RTT):"
        );
        for p in [Policy::Strict, Policy::SharedCounter] {
            let Some(st) = self.policies.get(&p) else {
                continue;
            };
            let _ = writeln!(s, "  {}: {}", p.name(), heal_line(&st.heals));
        }
        if !self.examples.is_empty() {
            let _ = writeln!(s);
            let _ = writeln!(s, "examples of each violation (lowest seeds):");
            for ((kind, policy), ex) in &self.examples {
                let _ = writeln!(s, "  {} [{}]:", kind.name(), policy.name());
                for (seed, scenario, detail) in ex {
                    let _ = writeln!(
                        s,
                        "    seed {seed} {}: {detail}\n      replay: cargo run --release -p levee-sim -- --seed {seed} --scenario {}",
                        scenario.name(),
                        scenario.name()
                    );
                }
            }
        }
        if !self.failures.is_empty() {
            let _ = writeln!(s);
            let _ = writeln!(
                s,
                "failures (first {} of {}):",
                max_failures.min(self.failures.len()),
                self.failures.len()
            );
            for f in self.failures.iter().take(max_failures) {
                let _ = writeln!(
                    s,
                    "  seed {} scenario {}: {}",
                    f.seed,
                    f.scenario.name(),
                    f.violations.first().map_or("", String::as_str)
                );
                if f.violations.len() > 1 {
                    let _ = writeln!(s, "    (+{} more)", f.violations.len() - 1);
                }
                let _ = writeln!(s, "    replay: {}", f.replay);
            }
        }
        s
    }
}

/// A line about agreement times: how many heals, percentiles of the time until the views of
/// consumption agreed (the `heal-agreement` property), how many within the target, and the
/// same for the whole replicated state (rights included), which settles later.
pub fn heal_line(heals: &[HealFigure]) -> String {
    let detected: Vec<&HealFigure> = heals.iter().filter(|h| h.detected).collect();
    if detected.is_empty() {
        return "no detected partition".to_owned();
    }
    let sorted = |f: fn(&HealFigure) -> Option<u64>| {
        let mut v: Vec<u64> = detected.iter().filter_map(|h| f(h)).collect();
        v.sort_unstable();
        v
    };
    let q = |v: &[u64], q: f64| {
        if v.is_empty() {
            0
        } else {
            v[((v.len() - 1) as f64 * q).round() as usize]
        }
    };
    let usage = sorted(|h| h.usage_ms);
    let state = sorted(|h| h.equal_ms);
    let dom = sorted(|h| h.dominate_ms);
    let never = detected.len() - usage.len();
    let never_lossless = detected
        .iter()
        .filter(|h| h.lossless && h.usage_ms.is_none())
        .count();
    let within = detected.iter().filter(|h| h.within_target()).count();
    let lossless: Vec<&&HealFigure> = detected.iter().filter(|h| h.lossless).collect();
    let lossless_within = lossless.iter().filter(|h| h.within_target()).count();
    let lossy = detected.len() - lossless.len();
    let lossy_within = within - lossless_within;
    let mut ratio: Vec<f64> = detected
        .iter()
        .filter_map(|h| h.usage_ms.map(|m| m as f64 / h.target_ms.max(1) as f64))
        .collect();
    ratio.sort_by(f64::total_cmp);
    let worst_ratio = ratio.last().copied().unwrap_or(0.0);
    let state_within = detected.iter().filter(|h| h.state_within_target()).count();
    let per_rtt = |f: fn(&HealFigure) -> Option<u64>| {
        let mut v: Vec<f64> = lossless
            .iter()
            .filter_map(|h| f(h).map(|ms| ms as f64 / h.rtt_ms.max(1) as f64))
            .collect();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(0.0)
    };
    format!(
        "n={} usage views agree: p50 {} ms, p99 {} ms, max {} ms; within target {}/{} (lossless {}/{}, with loss {}/{}); worst {:.2} × target; never agreed {} ({} lossless); whole states (rights included) equal: p50 {} ms, p99 {} ms, within target {}/{}, never {}; all views held the heal's state: p50 {} ms; lossless, median in RTTs: usage {:.2}, state {:.2}, held {:.2}",
        detected.len(),
        q(&usage, 0.5),
        q(&usage, 0.99),
        q(&usage, 1.0),
        within,
        detected.len(),
        lossless_within,
        lossless.len(),
        lossy_within,
        lossy,
        worst_ratio,
        never,
        never_lossless,
        q(&state, 0.5),
        q(&state, 0.99),
        state_within,
        detected.len(),
        detected.len() - state.len(),
        q(&dom, 0.5),
        per_rtt(|h| h.usage_ms),
        per_rtt(|h| h.equal_ms),
        per_rtt(|h| h.dominate_ms),
    )
}

/// ` (largest +x × limit, seed S --scenario N)` for the worst window above the limit by an
/// allowance, or nothing if there was none.
fn largest_excess(w: Option<Witness>) -> String {
    w.map_or(String::new(), |w| {
        format!(
            " (largest +{:.4} × limit, seed {} --scenario {})",
            w.value,
            w.seed,
            w.scenario.name()
        )
    })
}
