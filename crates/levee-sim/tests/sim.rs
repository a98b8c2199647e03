//! The simulator's properties over a fast subset of seeds; the full run is
//! `cargo run --release -p levee-sim -- --seeds 10000`. Every test names the property it
//! checks; a failure lists every violating run with the command that replays it.

use std::collections::BTreeSet;
use std::sync::OnceLock;

use levee_sim::checks::check_levee;
use levee_sim::ledger::Ledger;
use levee_sim::plan::{T0, WINDOW_MS};
use levee_sim::runner::parallel_map;
use levee_sim::{Policy, RunOutcome, Scenario, ViolationKind, run_plan};

/// Seeds per scenario: small enough for a debug build.
const SEEDS: u64 = 4;

/// Every scenario's first seeds, every policy: run once (on every core) and shared by the
/// tests, each of which reads the properties it is about.
fn all_runs() -> &'static [RunOutcome] {
    static RUNS: OnceLock<Vec<RunOutcome>> = OnceLock::new();
    RUNS.get_or_init(|| {
        // The seeds a full run gives each scenario: seed % 10 picks the scenario.
        let seeds: Vec<u64> = (0..SEEDS * Scenario::ALL.len() as u64).collect();
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        parallel_map(&seeds, threads, |&seed| {
            run_plan(&Scenario::for_seed(seed).plan(seed), &Policy::ALL)
        })
    })
}

fn runs(scenarios: &[Scenario]) -> Vec<RunOutcome> {
    all_runs()
        .iter()
        .filter(|o| scenarios.contains(&o.scenario))
        .cloned()
        .collect()
}

/// Every violation of these kinds, with its replay command.
fn violations(outcomes: &[RunOutcome], kinds: &[ViolationKind]) -> Vec<String> {
    outcomes
        .iter()
        .flat_map(|o| {
            o.violations
                .iter()
                .filter(|v| kinds.contains(&v.kind))
                .map(move |v| format!("{v}\n    replay: {}", o.replay_command()))
        })
        .collect()
}

fn assert_none(found: Vec<String>, what: &str) {
    assert!(
        found.is_empty(),
        "{what}: {} violations\n{}",
        found.len(),
        found.join("\n")
    );
}

/// Windows in which demand reached the limit: the checks below are not vacuous.
fn overloaded_windows(outcomes: &[RunOutcome], policy: Policy) -> usize {
    outcomes
        .iter()
        .filter_map(|o| o.run(policy))
        .flat_map(|r| r.ledger.windows.values())
        .filter(|b| b.demand_total() > b.admitted_total())
        .count()
}

#[test]
fn strict_mode_never_admits_more_than_the_limit_in_any_window() {
    let outcomes = runs(&Scenario::ALL);
    assert!(overloaded_windows(&outcomes, Policy::Strict) > 100);
    assert_none(
        violations(&outcomes, &[ViolationKind::StrictLimit]),
        "strict mode above the limit",
    );
}

#[test]
fn each_side_of_a_partition_stays_within_its_cap_and_admits_its_share() {
    let outcomes = runs(&[Scenario::RegionIsolated, Scenario::FullSplit]);
    assert_none(
        violations(
            &outcomes,
            &[ViolationKind::PartitionCap, ViolationKind::PartitionShare],
        ),
        "a side of a partition beyond its cap or below 95 % of its share",
    );
}

/// Strict mode: after every detected heal, every region's view of the probe key's usage (what
/// `/v1/usage` shows) agrees within two gossip intervals and a round trip.
#[test]
fn strict_views_of_usage_agree_within_two_gossip_intervals_and_a_round_trip_of_a_heal() {
    let outcomes = runs(&Scenario::ALL);
    let heals: Vec<_> = outcomes
        .iter()
        .filter_map(|o| o.run(Policy::Strict))
        .flat_map(|r| r.heals.iter().filter(|h| h.detected))
        .collect();
    assert!(heals.len() >= 5, "only {} detected heals", heals.len());
    assert!(
        heals.iter().any(|h| !h.lossless) && heals.iter().any(|h| h.lossless),
        "heals with and without message loss"
    );
    let strict_only: Vec<String> = outcomes
        .iter()
        .flat_map(|o| {
            o.violations
                .iter()
                .filter(|v| {
                    v.policy == Policy::Strict
                        && matches!(
                            v.kind,
                            ViolationKind::HealAgreement | ViolationKind::HealNever
                        )
                })
                .map(move |v| format!("{v}\n    replay: {}", o.replay_command()))
        })
        .collect();
    assert_none(
        strict_only,
        "strict views of usage not agreed in time after a heal",
    );
}

#[test]
fn nothing_panics_and_every_frame_round_trips_the_codec() {
    let outcomes = runs(&Scenario::ALL);
    assert_none(
        violations(&outcomes, &[ViolationKind::Panic, ViolationKind::Error]),
        "panics or codec errors",
    );
    for o in &outcomes {
        for p in Policy::ALL {
            assert!(o.run(p).is_some(), "{} did not complete", p.name());
        }
        let net = o.run(Policy::Strict).and_then(|r| r.net).unwrap();
        assert!(net.delivered > 100, "seed {}: {net:?}", o.seed);
    }
}

#[test]
fn a_seed_replays_exactly() {
    for s in [Scenario::Flapping, Scenario::Crashes] {
        let a = run_plan(&s.plan(11), &Policy::ALL);
        let b = run_plan(&s.plan(11), &Policy::ALL);
        for (x, y) in a.runs.iter().zip(&b.runs) {
            let admitted = |r: &levee_sim::outcome::PolicyRun| {
                r.ledger
                    .windows
                    .iter()
                    .map(|(k, b)| (*k, b.admitted, b.demand))
                    .collect::<Vec<_>>()
            };
            assert_eq!(admitted(x), admitted(y), "{} {}", s.name(), x.policy.name());
        }
        assert_eq!(a.violations.len(), b.violations.len());
    }
}

#[test]
fn the_baselines_behave_as_their_definitions_say() {
    let outcomes = runs(&[Scenario::Skewed, Scenario::FullSplit]);
    let max_ratio = |policy: Policy| {
        outcomes
            .iter()
            .filter_map(|o| o.run(policy).map(|r| (o, r)))
            .flat_map(|(o, r)| {
                let limit = o.scenario.plan(o.seed).limit;
                r.ledger
                    .windows
                    .values()
                    .map(move |b| b.admitted_total() as f64 / limit as f64)
            })
            .fold(0.0, f64::max)
    };
    assert!(max_ratio(Policy::StaticSplit) <= 1.0);
    assert!(max_ratio(Policy::Central) <= 1.0);
    // With regions cut off from the owner, a shared counter without shares lets every side
    // take the whole limit: the anchor's known weakness.
    assert!(max_ratio(Policy::SharedCounter) > 1.5);
}

#[test]
fn the_checks_catch_an_overshoot_planted_in_a_ledger() {
    let plan = Scenario::Steady.plan(1);
    let window = T0 / WINDOW_MS + 3;
    let mut ledger = Ledger::new(plan.topology.nodes(), false);
    for i in 0..=plan.limit {
        ledger.admit(0, (window, 3_000), 0, (i % 2) as usize, 1);
    }
    let found = check_levee(
        &plan,
        Policy::Strict,
        &ledger,
        &[],
        &[],
        &Default::default(),
    );
    let kinds: BTreeSet<ViolationKind> = found.iter().map(|v| v.kind).collect();
    assert_eq!(kinds, BTreeSet::from([ViolationKind::StrictLimit]));
}
