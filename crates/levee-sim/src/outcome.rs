//! One run: every policy over the same plan, each under `catch_unwind`, then the checks;
//! and the figures a run yields (overshoot, utilisation, restart overshoot).

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::panic::{self, AssertUnwindSafe};

use crate::baselines::{run_central, run_shared_counter, run_static_split};
use crate::checks::{Policy, Violation, ViolationKind, check_levee, ghost_allowance};
use crate::heal::HealFigure;
use crate::ledger::{Ledger, NodeRights};
use crate::levee::{ListsFigure, run_levee};
use crate::net::NetStats;
use crate::plan::{Algo, RunPlan};
use crate::scenario::Scenario;
use levee_core::KeyCrdt;

/// What one policy did in a run.
#[derive(Debug, Clone)]
pub struct PolicyRun {
    /// The policy.
    pub policy: Policy,
    /// Every key's windows.
    pub ledger: Ledger,
    /// Agreement after heals (Levee, and the shared counter).
    pub heals: Vec<HealFigure>,
    /// Levee's network counters.
    pub net: Option<NetStats>,
    /// Levee: every node's rights for the main key, by window.
    pub rights: BTreeMap<u64, Vec<Option<NodeRights>>>,
    /// Levee: every live node's state of the probe key at the end.
    pub probe_views: Vec<Option<KeyCrdt>>,
    /// Levee: how the node lists settled.
    pub lists: Option<ListsFigure>,
}

/// Every policy's run over one plan, and what failed.
#[derive(Debug, Clone)]
pub struct RunOutcome {
    /// The seed.
    pub seed: u64,
    /// The scenario.
    pub scenario: Scenario,
    /// The policies that ran to the end.
    pub runs: Vec<PolicyRun>,
    /// Failed properties, panics included.
    pub violations: Vec<Violation>,
    /// The protocol options the run used beyond the defaults, as the command line gives them
    /// (`--gossip regions`, `--local-first`), for its replay command.
    pub options: String,
}

impl RunOutcome {
    /// The run of one policy, if it completed.
    pub fn run(&self, policy: Policy) -> Option<&PolicyRun> {
        self.runs.iter().find(|r| r.policy == policy)
    }

    /// The command that replays this run.
    pub fn replay_command(&self) -> String {
        format!(
            "cargo run --release -p levee-sim -- --seed {} --scenario {}{}",
            self.seed,
            self.scenario.name(),
            self.options
        )
    }
}

thread_local! {
    static LAST_PANIC: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Replaces the panic hook with one that records the message and location for the run's
/// report instead of printing them (for long batches; a replay keeps the default hook).
pub fn quiet_panics() {
    panic::set_hook(Box::new(|info| {
        let at = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        let msg = panic_text(info.payload());
        LAST_PANIC.with(|p| *p.borrow_mut() = Some(format!("{msg}{at}")));
    }));
}

fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic with a non-string payload".to_owned()
    }
}

fn run_policy(plan: &RunPlan, policy: Policy) -> (PolicyRun, Vec<Violation>) {
    match policy {
        Policy::Strict => {
            let r = run_levee(plan);
            let allowance = ghost_allowance(plan, &r.lists.ghosts);
            let violations = check_levee(plan, policy, &r.ledger, &r.heals, &r.errors, &allowance);
            let mut violations = violations;
            for d in &r.lists.disagreements {
                violations.push(Violation {
                    kind: ViolationKind::ListAgreement,
                    policy,
                    detail: d.clone(),
                });
            }
            if r.refused > 0 {
                violations.push(Violation {
                    kind: ViolationKind::Error,
                    policy,
                    detail: format!("{} frames or states refused by the protocol", r.refused),
                });
            }
            let run = PolicyRun {
                policy,
                ledger: r.ledger,
                heals: r.heals,
                net: Some(r.net),
                rights: r.rights,
                probe_views: r.probe_views,
                lists: Some(r.lists),
            };
            (run, violations)
        }
        _ => {
            let (ledger, heals) = match policy {
                Policy::StaticSplit => (run_static_split(plan), vec![]),
                Policy::Central => (run_central(plan), vec![]),
                _ => run_shared_counter(plan),
            };
            let run = PolicyRun {
                policy,
                ledger,
                heals,
                net: None,
                rights: BTreeMap::new(),
                probe_views: Vec::new(),
                lists: None,
            };
            (run, vec![])
        }
    }
}

/// Runs `policies` over `plan`, each under `catch_unwind`, and checks Levee's properties.
pub fn run_plan(plan: &RunPlan, policies: &[Policy]) -> RunOutcome {
    let mut out = RunOutcome {
        seed: plan.seed,
        scenario: plan.scenario,
        runs: Vec::new(),
        violations: Vec::new(),
        options: format!(
            "{}{}",
            if plan.protocol.gossip == levee_cluster::Topology::Regions {
                " --gossip regions"
            } else {
                ""
            },
            if plan.protocol.local_first {
                " --local-first"
            } else {
                ""
            }
        ),
    };
    for &policy in policies {
        if policy == Policy::SharedCounter && !(plan.algo == Algo::FixedWindow && plan.unit_costs())
        {
            // Modelled for fixed windows of cost-1 checks only (`baselines`).
            continue;
        }
        LAST_PANIC.with(|p| p.borrow_mut().take());
        match panic::catch_unwind(AssertUnwindSafe(|| run_policy(plan, policy))) {
            Ok((run, violations)) => {
                out.runs.push(run);
                out.violations.extend(violations);
            }
            Err(payload) => {
                let detail = LAST_PANIC
                    .with(|p| p.borrow_mut().take())
                    .unwrap_or_else(|| panic_text(payload.as_ref()));
                out.violations.push(Violation {
                    kind: ViolationKind::Panic,
                    policy,
                    detail,
                });
            }
        }
    }
    out
}

/// Admitted over limit for every window of `run` whose demand reached the limit (the windows
/// where overshoot is possible).
pub fn overshoot(plan: &RunPlan, run: &PolicyRun) -> Vec<f64> {
    // A bucket or a sliding window may admit more than its limit in an aligned window; their
    // own properties are checked in `crate::algos`.
    run.ledger
        .windows
        .iter()
        .filter_map(|(&(k, _), b)| {
            let (bound, _) = plan.bound_of(k);
            (bound.algo.per_window() && b.demand_total() >= bound.limit)
                .then(|| b.admitted_total() as f64 / bound.limit as f64)
        })
        .collect()
}

/// Utilisation against the central counter from the third window on: the ratio of totals,
/// and the lowest ratio of a window where the central counter admitted at least half the
/// limit.
pub fn utilisation(plan: &RunPlan, run: &PolicyRun, central: &PolicyRun) -> Option<(f64, f64)> {
    let first = plan.first_counted_window();
    let last = plan.last_full_window();
    let mut total = 0u64;
    let mut reference = 0u64;
    let mut min_window = f64::INFINITY;
    for (&(key, w), c) in &central.ledger.windows {
        if w < first || w > last {
            continue;
        }
        let admitted = run
            .ledger
            .windows
            .get(&(key, w))
            .map_or(0, |b| b.admitted_total());
        let reference_w = c.admitted_total();
        total += admitted;
        reference += reference_w;
        if reference_w * 2 >= plan.limit {
            min_window = min_window.min(admitted as f64 / reference_w as f64);
        }
    }
    // Windows the central counter admitted nothing in still count for the others.
    for (&(key, w), b) in &run.ledger.windows {
        if w >= first && w <= last && !central.ledger.windows.contains_key(&(key, w)) {
            total += b.admitted_total();
        }
    }
    (reference > 0).then(|| {
        (
            total as f64 / reference as f64,
            if min_window.is_finite() {
                min_window
            } else {
                total as f64 / reference as f64
            },
        )
    })
}

/// Strict mode: windows above the limit only by what crashes forgot: (count, largest excess
/// in tokens).
pub fn restart_overshoot(plan: &RunPlan, run: &PolicyRun) -> (u64, u64) {
    let mut count = 0;
    let mut max = 0;
    for (&(k, _), b) in &run.ledger.windows {
        let limit = plan.bound_of(k).0.limit;
        let a = b.admitted_total();
        if a > limit && a <= limit + b.forgotten {
            count += 1;
            max = max.max(a - limit);
        }
    }
    (count, max)
}

/// Strict mode: windows above the limit (and what crashes forgot) by no more than the old
/// shares of removed nodes that went on with their old list: (count, largest excess in
/// tokens).
pub fn ghost_overshoot(plan: &RunPlan, run: &PolicyRun) -> (u64, u64) {
    let Some(lists) = &run.lists else {
        return (0, 0);
    };
    let allowance = ghost_allowance(plan, &lists.ghosts);
    let mut count = 0;
    let mut max = 0;
    for (&(k, w), b) in &run.ledger.windows {
        let a = b.admitted_total();
        let base = plan.bound_of(k).0.limit + b.forgotten;
        if a > base && a <= base + allowance.get(&w).copied().unwrap_or(0) {
            count += 1;
            max = max.max(a - base);
        }
    }
    (count, max)
}
