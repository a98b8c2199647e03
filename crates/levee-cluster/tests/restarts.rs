//! A node that restarts pulls its own state back before it spends: from every peer it can
//! hear, not only the first to answer. Its last batch to one peer may have been lost just
//! before it stopped (found by `levee-sim --scenario crashes`: seeds 389, 712, 1672, 3626 and
//! 1991 admitted one to five checks above the limit of a window, the restarted node having
//! pulled from a peer that lacked its last checks while another held them).

mod common;

use common::{Net, TICK, replicas};
use levee_core::RuleSpec;
use levee_core::calendar::CalendarPeriod;
use levee_testkit::net::Latency;

#[test]
fn a_restarted_node_gets_back_checks_whose_batch_one_peer_lost() {
    let mut net = Net::new(replicas(&["ap", "eu", "us"], 1), 1_000);
    // Node 1 answers first: 5 ms away; node 2 is 60 ms away.
    for (a, b) in [(0, 2), (2, 0)] {
        net.wire.set_link_latency(a, b, Latency::fixed(60));
    }
    net.start();
    for _ in 0..40 {
        assert!(net.decide(0, "acme"));
    }
    net.run(4 * TICK);
    // Ten more; the batch that carries them to node 1 is lost, and node 0 stops before its
    // next batch would have shown node 1 the gap.
    for _ in 0..10 {
        assert!(net.decide(0, "acme"));
    }
    net.lose_next_batch = Some((0, 1));
    net.run(TICK);
    assert!(
        net.lose_next_batch.is_none(),
        "the batch to node 1 was sent and lost"
    );
    let used = |net: &Net, n: usize| net.nodes[n].1.usage("r", "acme", net.now()).unwrap().used;
    assert_eq!(used(&net, 1), 40);
    // Node 2's copy is on its way (60 ms).
    net.restart(0);
    net.flush();
    // Node 1's whole answer comes first, and is not enough: the node waits for node 2's.
    net.run(20);
    assert!(
        !net.nodes[0].0.is_synced(),
        "synced on node 1's answer alone"
    );
    let start = net.now();
    while !net.nodes[0].0.is_synced() {
        net.run(1);
        assert!(
            net.now() < start + 300,
            "not synced 300 ms after the restart"
        );
    }
    assert_eq!(
        used(&net, 0),
        50,
        "the restarted node forgot checks a peer held"
    );
}

/// A peer that is down does not hold the restart up for longer than `suspect_after` (300 ms
/// here): the node syncs from the peers it hears.
#[test]
fn a_dead_peer_delays_a_restart_by_at_most_suspect_after() {
    let mut net = Net::new(replicas(&["ap", "eu", "us"], 1), 1_000);
    net.start();
    for _ in 0..40 {
        assert!(net.decide(0, "acme"));
    }
    net.run(4 * TICK);
    net.isolate(2, true);
    net.restart(0);
    let start = net.now();
    net.flush();
    net.run(100);
    assert!(
        !net.nodes[0].0.is_synced(),
        "synced before node 2 could have answered"
    );
    while !net.nodes[0].0.is_synced() {
        net.run(1);
        assert!(
            net.now() <= start + 300 + TICK,
            "not synced after suspect_after"
        );
    }
    let used = net.nodes[0].1.usage("r", "acme", net.now()).unwrap().used;
    assert_eq!(used, 40);
}

/// A node that restarts with nothing while it hears no peer at all syncs after
/// `suspect_after` (the whole cluster may be starting), but *blind*: it cannot know what it
/// admitted before, so it admits nothing of windows that may still count it, and gives
/// nothing away, until a peer's whole state reaches it. Then it decides from its old usage.
/// Before, it spent its share of the window again (`levee-sim --seed 199 --scenario
/// remove-dead-day`: 1.12 × a day's limit).
#[test]
fn a_node_restarted_cut_off_from_every_peer_is_blind_until_a_peer_answers() {
    let day = RuleSpec::quota("r", 90, CalendarPeriod::Day)
        .validate()
        .unwrap();
    let mut net = Net::with_rule(replicas(&["ap", "eu", "us"], 1), day);
    net.start();
    for _ in 0..30 {
        assert!(net.decide(0, "acme"));
    }
    net.run(4 * TICK);
    net.isolate(0, true);
    net.restart(0);
    let start = net.now();
    net.flush();
    net.run(400);
    let view = net.nodes[0].0.view();
    assert!(net.nodes[0].0.is_synced(), "not synced after suspect_after");
    assert_eq!(view.blind_since, Some(start), "{view:?}");
    assert!(view.degraded());
    assert!(
        !net.decide(0, "acme"),
        "a blind node admitted a check of a day it may have spent"
    );

    net.isolate(0, false);
    let mut waited = 0;
    while net.nodes[0].0.view().blind_since.is_some() {
        net.run(TICK);
        waited += TICK;
        assert!(
            waited <= 1_000,
            "still blind {waited} ms after the cut healed"
        );
    }
    let used = net.nodes[0].1.usage("r", "acme", net.now()).unwrap().used;
    assert_eq!(
        used, 30,
        "the state pulled after the heal holds the 30 admitted before"
    );
}

/// The same restart of a node that keeps its counters on disk (`node.data_dir`) is not
/// blind: its snapshot holds what it admitted, up to its last write, so it decides at once.
#[test]
fn a_node_that_keeps_its_counters_on_disk_is_not_blind_when_it_restarts_cut_off() {
    let mut net = Net::new(replicas(&["ap", "eu", "us"], 1), 90);
    net.start();
    net.isolate(0, true);
    net.restart(0);
    net.nodes[0].0.set_durable(true);
    net.flush();
    net.run(400);
    let view = net.nodes[0].0.view();
    assert!(net.nodes[0].0.is_synced(), "not synced after suspect_after");
    assert_eq!(view.blind_since, None, "{view:?}");
    assert!(
        net.decide(0, "acme"),
        "a durable node restarted cut off denied"
    );
}
