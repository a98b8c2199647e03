//! Figures of membership changes over many runs: how long the last list took to be agreed
//! and to apply in full, and what strict mode admitted against the central counter while a
//! change settled and otherwise.
//!
//! A run's *settling* windows go from the window of its first change to the one in which
//! every running node of the last list spent its full share under it
//! ([`crate::levee::ListsFigure::applied_at`]); the others (from the third window, to the
//! last whole one) are its *settled* windows. Partitions and crashes drawn beside the changes
//! lower both.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::checks::Policy;
use crate::histogram::Histogram;
use crate::outcome::RunOutcome;
use crate::plan::{RunPlan, T0};
use crate::scenario::Scenario;

/// One membership scenario's figures.
#[derive(Debug, Clone, Default)]
pub struct MembershipStats {
    /// Runs.
    pub runs: u64,
    /// Time from the last change until the last list was agreed everywhere, ms, by run.
    pub agree_ms: Vec<u64>,
    /// Time from the last change until every full share applied, ms, by run.
    pub applied_ms: Vec<u64>,
    /// Runs whose last list was never agreed everywhere.
    pub never: u64,
    /// Strict admitted / central admitted, every counted window, by run.
    pub all: Histogram,
    /// The same over the settling windows.
    pub settling: Histogram,
    /// The same over the settled windows.
    pub settled: Histogram,
    /// Frames dropped because the receiver did not list their sender yet.
    pub unknown_sender: u64,
    /// States refused because they named a node the receiver did not list yet.
    pub unknown_node_states: u64,
}

impl MembershipStats {
    /// Folds one run in.
    pub fn add(&mut self, plan: &RunPlan, outcome: &RunOutcome) {
        self.runs += 1;
        let (Some(strict), Some(central)) =
            (outcome.run(Policy::Strict), outcome.run(Policy::Central))
        else {
            return;
        };
        let Some(lists) = &strict.lists else {
            return;
        };
        self.unknown_sender += lists.unknown_sender;
        self.unknown_node_states += lists.unknown_node_states;
        let last = plan.last_change_at();
        match lists.agreed_at {
            Some(t) => self.agree_ms.push(t - last),
            None => self.never += 1,
        }
        if let Some(t) = lists.applied_at {
            self.applied_ms.push(t - last);
        }
        let w = |sim_ms: u64| plan.window_of(T0 + sim_ms);
        let from = w(plan.first_change_at().unwrap_or(0));
        let to = lists.applied_at.map_or(u64::MAX, w);
        let first = plan.first_counted_window();
        let last_full = plan.last_full_window();
        let mut sums = [(0u64, 0u64); 3];
        let keys: Vec<u32> = (0..plan.keys.len() as u32).collect();
        for &key in &keys {
            for win in first..=last_full {
                let get = |r: &crate::outcome::PolicyRun| {
                    r.ledger
                        .windows
                        .get(&(key, win))
                        .map_or(0, |b| b.admitted_total())
                };
                let (s, c) = (get(strict), get(central));
                let i = if (from..=to).contains(&win) { 1 } else { 2 };
                for j in [0, i] {
                    sums[j].0 += s;
                    sums[j].1 += c;
                }
            }
        }
        let ratio = |(s, c): (u64, u64)| (c > 0).then(|| s as f64 / c as f64);
        if let Some(r) = ratio(sums[0]) {
            self.all.add(r);
        }
        if let Some(r) = ratio(sums[1]) {
            self.settling.add(r);
        }
        if let Some(r) = ratio(sums[2]) {
            self.settled.add(r);
        }
    }

    /// Adds another's runs.
    pub fn merge(&mut self, other: &MembershipStats) {
        self.runs += other.runs;
        self.agree_ms.extend(&other.agree_ms);
        self.applied_ms.extend(&other.applied_ms);
        self.never += other.never;
        self.all.merge(&other.all);
        self.settling.merge(&other.settling);
        self.settled.merge(&other.settled);
        self.unknown_sender += other.unknown_sender;
        self.unknown_node_states += other.unknown_node_states;
    }
}

/// `p50/p99/max` of a list of times.
fn times(v: &[u64]) -> String {
    if v.is_empty() {
        return "-".to_owned();
    }
    let mut v = v.to_vec();
    v.sort_unstable();
    let q = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    format!("{}/{}/{}", q(0.5), q(0.99), q(1.0))
}

/// The membership table, one line per scenario with runs.
pub fn render(stats: &BTreeMap<Scenario, MembershipStats>) -> String {
    let mut s = String::new();
    if stats.is_empty() {
        return s;
    }
    let _ = writeln!(
        s,
        "membership changes (levee strict against the central counter; times from the last change, p50/p99/max ms):"
    );
    let _ = writeln!(
        s,
        "  {:<15} {:>5} {:>6} {:>18} {:>18} {:>9} {:>17} {:>17} {:>9} {:>9}",
        "scenario",
        "runs",
        "never",
        "list agreed",
        "full shares",
        "util all",
        "settling (p1)",
        "settled (p1)",
        "unk.from",
        "unk.node"
    );
    for (sc, st) in stats {
        let _ = writeln!(
            s,
            "  {:<15} {:>5} {:>6} {:>18} {:>18} {:>9.4} {:>8.4} ({:.4}) {:>8.4} ({:.4}) {:>9} {:>9}",
            sc.name(),
            st.runs,
            st.never,
            times(&st.agree_ms),
            times(&st.applied_ms),
            st.all.mean(),
            st.settling.mean(),
            st.settling.quantile(0.01),
            st.settled.mean(),
            st.settled.quantile(0.01),
            st.unknown_sender,
            st.unknown_node_states,
        );
    }
    let _ = writeln!(
        s,
        "  never: runs whose last list was not agreed by every running node before the end; settling: windows\n  from the first change to the one every full share applied in; unk.from: frames dropped by a node\n  that did not list their sender yet; unk.node: key states refused for naming a node not listed yet."
    );
    s
}
