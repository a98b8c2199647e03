//! `cluster.local_first` in the simulator: the classic scenarios' first seeds with every node
//! deciding the checks it holds rights for (`levee-sim --local-first`). The full comparison is
//! `cargo run --release -p levee-sim -- --seeds 300 --local-first` (docs/accuracy.md).

use levee_sim::{Policy, Scenario, run_plan};

/// Seeds per scenario: small enough for a debug build.
const SEEDS: u64 = 3;

#[test]
fn with_local_first_every_property_holds_in_the_classic_scenarios() {
    let seeds: Vec<u64> = (0..SEEDS * Scenario::ALL.len() as u64).collect();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let outcomes = levee_sim::runner::parallel_map(&seeds, threads, |&seed| {
        let mut plan = Scenario::for_seed(seed).plan(seed);
        plan.protocol.local_first = true;
        run_plan(&plan, &[Policy::Strict, Policy::Central])
    });
    // Windows in which demand reached the limit: the check below is not vacuous.
    let overloaded = outcomes
        .iter()
        .filter_map(|o| o.run(Policy::Strict))
        .flat_map(|r| r.ledger.windows.values())
        .filter(|b| b.demand_total() > b.admitted_total())
        .count();
    assert!(overloaded > 50, "only {overloaded} overloaded windows");
    let found: Vec<String> = outcomes
        .iter()
        .flat_map(|o| {
            o.violations
                .iter()
                .map(move |v| format!("{v}\n    replay: {}", o.replay_command()))
        })
        .collect();
    assert!(
        found.is_empty(),
        "{} violations with local_first:\n{}",
        found.len(),
        found.join("\n")
    );
}
