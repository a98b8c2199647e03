//! Membership changes in the simulator (docs/membership.md) over a few seeds of every
//! scenario of `--set membership`; the full run is
//! `cargo run --release -p levee-sim -- --seeds 300 --set membership`. A failure lists every
//! violating run with the command that replays it.

use std::sync::OnceLock;

use levee_sim::checks::{check_levee, ghost_allowance, hear_by};
use levee_sim::ledger::Ledger;
use levee_sim::levee::Ghost;
use levee_sim::plan::{FaultKind, T0};
use levee_sim::runner::parallel_map;
use levee_sim::{Policy, RunOutcome, RunPlan, Scenario, ViolationKind, run_plan};

/// Seeds per scenario: runs last 20 to 30 simulated seconds, so few in a debug build.
const SEEDS: u64 = 2;

/// Every membership scenario's first seeds (as `--set membership` gives them), Levee and the
/// central counter.
fn runs() -> &'static [(RunPlan, RunOutcome)] {
    static RUNS: OnceLock<Vec<(RunPlan, RunOutcome)>> = OnceLock::new();
    RUNS.get_or_init(|| {
        let n = Scenario::MEMBERSHIP.len() as u64;
        let seeds: Vec<u64> = (0..SEEDS * n).collect();
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        parallel_map(&seeds, threads, |&seed| {
            let plan = Scenario::for_seed_in(&Scenario::MEMBERSHIP, seed).plan(seed);
            let outcome = run_plan(&plan, &[Policy::Strict, Policy::Central]);
            (plan, outcome)
        })
    })
}

fn failures(runs: &[(RunPlan, RunOutcome)]) -> Vec<String> {
    runs.iter()
        .flat_map(|(_, o)| {
            o.violations
                .iter()
                .map(move |v| format!("{v}\n    replay: {}", o.replay_command()))
        })
        .collect()
}

#[test]
fn membership_changes_keep_strict_mode_within_the_limit_and_every_list_ends_agreed() {
    let runs = runs();
    let found = failures(runs);
    assert!(
        found.is_empty(),
        "{} violations\n{}",
        found.len(),
        found.join("\n")
    );
    let mut overloaded = 0;
    for (plan, o) in runs {
        assert!(plan.has_membership(), "seed {}: no change", plan.seed);
        let strict = o.run(Policy::Strict).expect("levee completed");
        let lists = strict.lists.as_ref().expect("levee reports its lists");
        // A day's quota applies grown shares the day after next, after the run (the
        // list-agreement check makes sure they are scheduled).
        assert!(
            lists.agreed_at.is_some() && (lists.applied_at.is_some() || plan.long_window()),
            "seed {} {}: the last list was not agreed and applied: {lists:?}",
            plan.seed,
            plan.scenario.name()
        );
        overloaded += strict
            .ledger
            .windows
            .values()
            .filter(|b| b.demand_total() > plan.limit)
            .count();
    }
    assert!(overloaded > 100, "only {overloaded} overloaded windows");
}

#[test]
fn added_nodes_serve_and_removed_nodes_stop_spending() {
    let runs = runs();
    // A node added to the list admits checks once it holds a share.
    let added_admitted: u64 = runs
        .iter()
        .filter(|(p, _)| p.scenario == Scenario::Grow)
        .map(|(plan, o)| {
            let strict = o.run(Policy::Strict).unwrap();
            let first = plan.lists[0].len();
            (first..plan.positions())
                .flat_map(|n| strict.ledger.windows.keys().map(move |&(k, w)| (k, w, n)))
                .map(|(k, w, n)| strict.ledger.truth(k, w, n))
                .sum::<u64>()
        })
        .sum();
    assert!(added_admitted > 0, "no added node admitted anything");
    // A frozen node removed meanwhile hears of its removal soon after it goes on.
    for (plan, o) in runs
        .iter()
        .filter(|(p, _)| p.scenario == Scenario::FrozenRemoved)
    {
        let lists = o.run(Policy::Strict).unwrap().lists.clone().unwrap();
        assert_eq!(lists.ghosts.len(), 1, "seed {}", plan.seed);
        let g = lists.ghosts[0];
        let heard = g.heard_at.expect("the thawed node heard of its removal");
        assert!(
            heard <= hear_by(plan, g.thawed_at),
            "seed {}: thawed at {} ms, heard at {heard} ms",
            plan.seed,
            g.thawed_at
        );
    }
}

#[test]
fn a_removed_node_that_keeps_spending_past_the_bound_is_a_violation() {
    let plan = Scenario::FrozenRemoved.plan(3);
    let thawed_at = plan
        .faults
        .iter()
        .find_map(|f| matches!(f.kind, FaultKind::Thaw { .. }).then_some(f.at))
        .expect("the plan thaws a node");
    let ghost = |heard_at| Ghost {
        node: 0,
        share: 10,
        thawed_at,
        heard_at,
    };
    let w = |sim: u64| plan.window_of(T0 + sim);
    let late = w(hear_by(&plan, thawed_at)) + 4;
    let mut ledger = Ledger::new(plan.positions(), false);
    for window in [w(thawed_at), late] {
        for _ in 0..plan.limit + 10 {
            ledger.admit(0, (window, 0), 0, 0, 1);
        }
    }
    let kinds = |heard_at| {
        let allowance = ghost_allowance(&plan, &[ghost(heard_at)]);
        check_levee(&plan, Policy::Strict, &ledger, &[], &[], &allowance)
            .iter()
            .filter(|v| v.kind == ViolationKind::StrictLimit)
            .count()
    };
    // The old share is allowed in the window it went on in, not long after it should have
    // heard, whether it heard late or never.
    assert_eq!(kinds(Some(thawed_at)), 1);
    assert_eq!(kinds(None), 1);
    let none = check_levee(
        &plan,
        Policy::Strict,
        &ledger,
        &[],
        &[],
        &Default::default(),
    );
    assert_eq!(none.len(), 2, "without the allowance both windows are over");
}
