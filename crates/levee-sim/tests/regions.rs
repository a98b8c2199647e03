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
#[test]
fn a_catch_up_lost_in_a_one_way_cut_is_made_again_once_the_peer_hears_us() {
    let seed = 67;
    let mut plan = Scenario::OneWay.plan(seed);
    plan.protocol.gossip = Topology::Regions;
    let outcome = run_plan(&plan, &[Policy::Strict]);
    let run = outcome.run(Policy::Strict).expect("the strict run");
    let heals: Vec<_> = run.heals.iter().filter(|h| h.detected).collect();
    assert!(!heals.is_empty(), "the cut was not detected: {:?}", run.heals);
    for h in heals {
        let usage = h.usage_ms.expect("the usage views agreed before the run ended");
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
