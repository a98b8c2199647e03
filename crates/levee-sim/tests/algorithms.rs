//! Every algorithm in the simulator (the algorithms set): token and leaky buckets, sliding
//! windows and logs, fixed windows and a day's quota, with costs from 1–10 and refunds, over
//! the classic worlds and faults. The full run is `cargo run --release -p levee-sim --
//! --seeds 600 --set algorithms`.

use levee_sim::plan::Algo;
use levee_sim::runner::parallel_map;
use levee_sim::{Policy, Scenario, run_plan};

#[test]
fn every_algorithm_holds_its_property_with_costs_and_refunds() {
    // Seeds 0–11 and 30–41: each algorithm over the steady and skewed worlds, a region cut
    // off and a full split (the classic scenario of seed / 6).
    let seeds: Vec<u64> = (0..12).chain(30..42).collect();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let outcomes = parallel_map(&seeds, threads, |&seed| {
        let scenario = Scenario::for_seed_in(&Scenario::ALGORITHMS, seed);
        let plan = scenario.plan(seed);
        (plan.algo, plan.unit_costs(), run_plan(&plan, &Policy::ALL))
    });
    let mut seen = Vec::new();
    for (algo, unit_costs, o) in &outcomes {
        assert!(
            o.violations.is_empty(),
            "{}\n    replay: {}",
            o.violations
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("\n"),
            o.replay_command()
        );
        assert!(!unit_costs, "costs drawn from 1–10, some refunded");
        let strict = o.run(Policy::Strict).expect("the strict run completed");
        let admitted: u64 = strict
            .ledger
            .windows
            .values()
            .map(|b| b.admitted_total())
            .sum();
        assert!(
            admitted > 0,
            "{algo:?} admitted nothing: {}",
            o.replay_command()
        );
        let refunded: u64 = strict.ledger.windows.values().map(|b| b.refunded).sum();
        assert!(
            refunded > 0,
            "{algo:?} gave nothing back: {}",
            o.replay_command()
        );
        assert!(
            o.run(Policy::SharedCounter).is_none(),
            "the shared counter models cost-1 fixed windows only"
        );
        if !algo.per_window() {
            assert!(
                !strict.ledger.movements.is_empty(),
                "{algo:?} keeps its timeline"
            );
        }
        seen.push(*algo);
    }
    for algo in [
        Algo::FixedWindow,
        Algo::TokenBucket,
        Algo::LeakyBucket,
        Algo::SlidingWindow,
        Algo::SlidingLog,
        Algo::QuotaDay,
    ] {
        assert_eq!(seen.iter().filter(|&&a| a == algo).count(), 4, "{algo:?}");
    }
}
