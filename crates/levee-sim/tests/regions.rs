//! Regional gossip (`cluster.gossip_topology = "regions"`) in the simulator: cases the
//! `--gossip regions` runs found. The full comparison with the mesh is
//! `cargo run --release -p levee-sim -- --seeds 1000 --gossip regions` (docs/accuracy.md).

use levee_cluster::Topology;
use levee_sim::{Policy, Scenario, run_plan};

/// Seed 67 of the one-way scenario: region 1's link to region 0 is cut one way for 5.4 s.
/// During the cut each node of region 1 tries gateway after gateway in region 0, and catches
/// each up when it first hears it; those pushes go into the cut. After the heal, the first
/// batch region 0 acknowledges must bring the catch-up again: it used to be skipped because a
/// catch-up had been made (into the cut) since region 0's last acknowledgement, and the views
/// agreed only through anti-entropy, 1,435 ms after the heal (target 135 ms).
/// Runs `scenario`'s `seed` with regional gossip: every heal the protocol detected must have
/// every view of the probe key's usage agreeing within its target, and no property fail.
fn heals_agree_in_time(scenario: Scenario, seed: u64) {
    let mut plan = scenario.plan(seed);
    plan.protocol.gossip = Topology::Regions;
    let outcome = run_plan(&plan, &[Policy::Strict]);
    let run = outcome.run(Policy::Strict).expect("the strict run");
    let heals: Vec<_> = run.heals.iter().filter(|h| h.detected).collect();
    assert!(
        !heals.is_empty(),
        "the cut was not detected: {:?}",
        run.heals
    );
    for h in heals {
        let usage = h
            .usage_ms
            .expect("the usage views agreed before the run ended");
        assert!(
            usage <= h.target_ms,
            "usage views agreed {usage} ms after the heal at {} ms, target {} ms",
            h.heal_at,
            h.target_ms
        );
    }
    assert!(
        outcome.violations.is_empty(),
        "violations: {:?}\n    replay: {} --gossip regions",
        outcome.violations,
        outcome.replay_command()
    );
}

/// Seed 67 of the one-way scenario: region 1's link to region 0 is cut one way for 5.4 s.
/// During the cut each node of region 1 tries gateway after gateway in region 0, and catches
/// each up when it first hears it; those pushes go into the cut. After the heal, the first
/// batch region 0 acknowledges must bring the catch-up again: it used to be skipped because a
/// catch-up had been made (into the cut) since region 0's last acknowledgement, and the views
/// agreed only through anti-entropy, 1,435 ms after the heal (target 135 ms).
#[test]
fn a_catch_up_lost_in_a_one_way_cut_is_made_again_once_the_peer_hears_us() {
    heals_agree_in_time(Scenario::OneWay, 67);
}

/// Seed 917 of the one-way scenario (2 regions of 3 nodes, 78 ms apart, cut one way for
/// 4.6 s): the gateways region 1 chose in region 0 during the cut had never acknowledged
/// anything, so they did not count as deaf and the first batches after the heal carried
/// none of the keys they missed; the views agreed after a round trip more (247 ms, target
/// 226). They now count as having what their region acknowledged.
#[test]
fn a_gateway_that_never_acknowledged_us_gets_what_its_region_missed_with_the_first_batch() {
    heals_agree_in_time(Scenario::OneWay, 917);
}
