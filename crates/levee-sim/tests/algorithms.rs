//! Every algorithm in the simulator (the algorithms set): token and leaky buckets, sliding
//! windows and logs, fixed windows and a day's quota, with costs from 1–10 and refunds, and
//! mixed runs (atomic calls against three rules per key, both class methods, a shadow rule,
//! a per-key override), over the classic worlds and faults. The full run is `cargo run
//! --release -p levee-sim -- --seeds 700 --set algorithms`.

use levee_sim::mixed;
use levee_sim::runner::parallel_map;
use levee_sim::{Policy, RunOutcome, Scenario, run_plan};

#[test]
fn every_algorithm_holds_its_property_with_costs_and_refunds() {
    // Seeds 0–13 and 35–48: each scenario over the steady and skewed worlds, a region cut
    // off and a full split (the classic scenario of seed / 7).
    let seeds: Vec<u64> = (0..14).chain(35..49).collect();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let outcomes = parallel_map(&seeds, threads, |&seed| {
        let scenario = Scenario::for_seed_in(&Scenario::ALGORITHMS, seed);
        let plan = scenario.plan(seed);
        let outcome = run_plan(&plan, &Policy::ALL);
        (plan, outcome)
    });
    let mut seen = Vec::new();
    for (plan, o) in &outcomes {
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
        assert!(!plan.unit_costs(), "costs drawn from 1–10");
        let strict = o.run(Policy::Strict).expect("the strict run completed");
        let admitted = |k: u32| -> u64 {
            strict
                .ledger
                .windows
                .range((k, 0)..(k + 1, 0))
                .map(|(_, b)| b.admitted_total())
                .sum()
        };
        let replay = o.replay_command();
        if plan.mixed {
            // Every bucket of the busiest key took tokens: the fixed window (overridden),
            // both separate classes of the bucket, the shadow window.
            for slot in 0..mixed::SLOTS {
                let k = mixed::ledger_key(plan, 0, slot);
                assert!(admitted(k) > 0, "slot {slot} admitted nothing: {replay}");
            }
        } else {
            assert!(
                admitted(0) > 0,
                "{:?} admitted nothing: {replay}",
                plan.algo
            );
            let refunded: u64 = strict.ledger.windows.values().map(|b| b.refunded()).sum();
            assert!(refunded > 0, "{:?} gave nothing back: {replay}", plan.algo);
        }
        assert!(
            o.run(Policy::SharedCounter).is_none(),
            "the shared counter models cost-1 fixed windows only"
        );
        if !plan.algo.per_window() || plan.mixed {
            assert!(
                !strict.ledger.movements.is_empty(),
                "{replay} keeps its timeline"
            );
        }
        seen.push(plan.scenario);
    }
    for s in Scenario::ALGORITHMS {
        assert_eq!(seen.iter().filter(|&&x| x == s).count(), 4, "{s:?}");
    }
}

/// Even demand on a token bucket: forecasts swing from region to region, and capacity that
/// went back and forth used to destroy the tokens the giver held (received units arrived
/// empty; a giver clipped its level). On these four steady worlds Levee admitted 0.797 of the
/// central counter on average then; 0.906 once an owner that received units lately gave only
/// the empty part of its bucket; now units move with their tokens (`levee_core`'s
/// `escrow::give` and `KeyState::merge`), nothing is destroyed by a move, and the mean here
/// is 0.897 (over the 200 token-bucket runs of `--set algorithms --seeds 1400` it rose from
/// 0.993 to 1.016).
#[test]
fn token_buckets_under_even_demand_keep_their_stored_tokens() {
    let seeds = [1u64, 141, 211, 281];
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let ratios = parallel_map(&seeds, threads, |&seed| {
        let plan = Scenario::TokenBucket.plan(seed);
        assert_eq!(plan.scenario, Scenario::TokenBucket);
        let o = run_plan(&plan, &[Policy::Strict, Policy::Central]);
        assert!(o.violations.is_empty(), "{:?}", o.violations);
        let (strict, central) = (
            o.run(Policy::Strict).unwrap(),
            o.run(Policy::Central).unwrap(),
        );
        levee_sim::outcome::utilisation(&plan, strict, central)
            .expect("the central counter admitted")
            .0
    });
    let mean = ratios.iter().sum::<f64>() / ratios.len() as f64;
    eprintln!(
        "token buckets under even demand, against the central counter: {ratios:?}, mean {mean:.3}"
    );
    assert!(
        mean >= 0.88,
        "utilisation against the central counter {ratios:?}"
    );
}

/// Every property of Levee's held in `o`.
fn assert_holds(o: &RunOutcome, what: &str) {
    assert!(
        o.violations.is_empty(),
        "{what}: {:?}\n    replay: {}",
        o.violations,
        o.replay_command()
    );
}

#[test]
fn a_side_that_served_its_demand_is_not_short_because_some_was_given_back() {
    // `--set algorithms --seeds 10000` flagged these three as `partition-share` misses: in a
    // window inside a partition, a side admitted every check it was asked (at seed 6132,
    // region 1 asked 42 tokens and admitted 42 with a share of 40), then a caller gave 21
    // back. Admissions are counted net of refunds, and demand was not: 21 admitted against a
    // demand of 42 read as half the share. Demand now counts net of refunds too.
    let seeds = [2982, 5082, 6132];
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let outcomes = parallel_map(&seeds, threads, |&seed| {
        let plan = Scenario::FixedCosts.plan(seed);
        let outcome = run_plan(&plan, &[Policy::Strict]);
        (seed, outcome)
    });
    for (seed, o) in &outcomes {
        assert_holds(o, &format!("seed {seed}"));
        let strict = o.run(Policy::Strict).expect("the strict run completed");
        let refunded: u64 = strict.ledger.windows.values().map(|b| b.refunded()).sum();
        assert!(refunded > 0, "seed {seed} gave nothing back");
    }
}

#[test]
fn a_gap_between_costly_requests_does_not_give_a_window_away() {
    // `--set algorithms --seeds 10000` flagged this one as a `partition-share` miss of 0.85
    // token: region 1's owner, whose demand was ~180 tokens a window, had gone four gossip
    // intervals without a request of costs 1–10, and its forecast read that as a drop (a
    // Poisson count of tokens) and fell from 160 to 39. It gave 69 of the next window's
    // rights away, and they came back after its demand (docs/accuracy.md).
    let plan = Scenario::FixedCosts.plan(6965);
    assert!(
        plan.faults
            .iter()
            .any(|f| matches!(f.kind, levee_sim::plan::FaultKind::Cut { .. })),
        "the run cuts region 2 off"
    );
    let o = run_plan(&plan, &[Policy::Strict]);
    assert_holds(&o, "strict");
}

#[test]
fn a_crash_in_a_mixed_run_books_what_each_rule_lost() {
    // `--seed 8259 --scenario mixed`: node 0 crashed at 1,463 ms with 14 tokens of the
    // shadow sliding window's usage it had not yet gossiped. Only the fixed window's loss
    // was booked, so the restarted node's admissions, 0.54 token over the weighted limit
    // and within what the crash lost, read as a breach of the sliding window.
    let plan = Scenario::Mixed.plan(8259);
    let o = run_plan(&plan, &[Policy::Strict]);
    assert_holds(&o, "strict");
    let strict = o.run(Policy::Strict).expect("the strict run completed");
    let key = plan
        .keys
        .iter()
        .position(|k| k == mixed::OVERRIDDEN)
        .expect("the overridden key is drawn") as u32;
    let shadow = mixed::ledger_key(&plan, key, 3);
    let lost: u64 = strict
        .ledger
        .forgotten
        .iter()
        .filter(|f| f.0 == shadow)
        .map(|f| f.2)
        .sum();
    assert!(
        lost > 0,
        "the shadow rule's loss is booked: {:?}",
        strict.ledger.forgotten
    );
}
