//! Callers that wait for rights (`max_wait_ms`, the waiting set): the same worlds and demand
//! as the bursts scenario, seed for seed, with callers willing to wait a round trip and two
//! gossip intervals. The full run is `cargo run --release -p levee-sim -- --seeds 1000 --set
//! waiting`.

use levee_sim::runner::parallel_map;
use levee_sim::{Policy, RunOutcome, Scenario, run_plan};

const SEEDS: u64 = 8;

fn admitted(o: &RunOutcome) -> u64 {
    o.run(Policy::Strict)
        .expect("the strict run completed")
        .ledger
        .windows
        .values()
        .map(|b| b.admitted_total())
        .sum()
}

#[test]
fn callers_that_wait_stay_within_the_limit_and_are_admitted_more() {
    let seeds: Vec<u64> = (0..SEEDS).collect();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let pairs = parallel_map(&seeds, threads, |&seed| {
        let at_once = Scenario::Bursts.plan(seed);
        let waiting = Scenario::BurstsWaiting.plan(seed);
        assert_eq!(at_once.max_wait_ms, 0);
        assert!(waiting.max_wait_ms > 2 * at_once.protocol.gossip_interval);
        assert_eq!(
            at_once.requests.len(),
            waiting.requests.len(),
            "the same demand"
        );
        (
            run_plan(&at_once, &[Policy::Strict]),
            run_plan(&waiting, &[Policy::Strict]),
        )
    });
    let mut without = 0;
    let mut with = 0;
    for (a, w) in &pairs {
        assert!(
            w.violations.is_empty(),
            "{}\n    replay: {}",
            w.violations
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("\n"),
            w.replay_command()
        );
        without += admitted(a);
        with += admitted(w);
    }
    assert!(
        with > without,
        "callers that wait were admitted {with}, callers answered at once {without}"
    );
}
