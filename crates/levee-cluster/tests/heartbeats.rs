//! Empty batches (heartbeats) on idle links (issue #18): a link that carries no keys gets one
//! every `suspect_after / 5` (60 ms here, every third 20 ms interval) from its lower
//! position, which the higher position answers at once, not one every interval from each
//! end; a link that carries keys, or whose peer may not hear us, still gets one every
//! interval.

mod common;

use common::{Net, replicas};
use levee_core::RuleSpec;

/// When `from` sent `to` a batch in `[start, end)`.
fn batch_times(net: &Net, from: usize, to: usize, start: u64, end: u64) -> Vec<u64> {
    net.gossip_log
        .iter()
        .filter(|&&(t, f, d)| f == from && d == to && t >= start && t < end)
        .map(|&(t, _, _)| t)
        .collect()
}

/// How many batches `from` sent `to` in `[start, end)`.
fn batches(net: &Net, from: usize, to: usize, start: u64, end: u64) -> usize {
    batch_times(net, from, to, start, end).len()
}

#[test]
fn an_idle_link_carries_a_heartbeat_and_its_answer_every_third_interval_and_a_busy_one_every_interval()
 {
    let mut net = Net::new(replicas(&["eu", "us"], 1), 1_000_000);
    net.start();
    net.run(200);
    // Idle: node 0, the link's lower position, sends one every 60 ms; node 1 sends one only
    // as it answers each, when it arrives (5 ms later), and none of its own.
    let t = net.now();
    net.run(400);
    let beats = batch_times(&net, 0, 1, t, t + 360);
    assert_eq!(
        beats.len(),
        6,
        "0 -> 1 in 360 ms of an idle link: {beats:?}"
    );
    assert!(
        beats.windows(2).all(|w| w[1] - w[0] == 60),
        "0 -> 1 not every 60 ms: {beats:?}"
    );
    let answers = batch_times(&net, 1, 0, t + 5, t + 365);
    let expected: Vec<u64> = beats.iter().map(|b| b + 5).collect();
    assert_eq!(
        answers, expected,
        "1 -> 0: not one answer per heartbeat, at once"
    );
    // Node 0 decides a key every interval: its batches go every interval (20 in the 400 ms
    // after the first decision); node 1, which only acknowledges them, answers one once its
    // last batch to node 0 is half a heartbeat (30 ms) old: every other interval (an
    // anti-entropy round, every 200 ms here, finds the digests differing while the key
    // changes, but leaves a key changed within two of its intervals to the deltas).
    let t = net.now();
    for _ in 0..20 {
        assert!(net.decide(0, "k"));
        net.run(20);
    }
    let busy = batches(&net, 0, 1, t + 1, t + 401);
    let acks = batches(&net, 1, 0, t + 1, t + 401);
    assert_eq!(
        busy, 20,
        "batches 0 -> 1 in the 400 ms after the first decision"
    );
    assert_eq!(
        acks, 10,
        "batches 1 -> 0 in the 400 ms after the first decision"
    );
    // And the views agree: the answers carried node 1's acknowledgements, and nothing was
    // pushed again.
    net.run(100);
    let (a, b) = (
        net.nodes[0].1.state("r", "k"),
        net.nodes[1].1.state("r", "k"),
    );
    assert_eq!(a, b);
}

#[test]
fn a_link_whose_acknowledgements_stop_gets_a_batch_every_interval_and_heals_at_once() {
    let mut net = Net::new(replicas(&["eu", "us"], 1), 1_000_000);
    net.start();
    net.run(200);
    net.isolate(1, true);
    let cut = net.now();
    net.run(400);
    // Acknowledgements are late after 2 × 60 + 4 × 20 = 200 ms (the last one acknowledged a
    // batch sent before the cut): from then on, every interval.
    let n = batches(&net, 0, 1, cut + 220, cut + 400);
    assert_eq!(
        n, 9,
        "{n} batches to a peer that stopped acknowledging, in 180 ms"
    );
    // A key changed during the cut reaches the other side within an interval and a round
    // trip of the heal.
    assert!(net.decide(0, "k"));
    net.run(20);
    net.isolate(1, false);
    let heal = net.now();
    while net.nodes[0].1.state("r", "k") != net.nodes[1].1.state("r", "k") {
        net.run(1);
        assert!(net.now() < heal + 100, "no agreement 100 ms after the heal");
    }
    assert!(
        net.now() <= heal + 20 + 10,
        "agreed {} ms after the heal",
        net.now() - heal
    );
}

/// A token bucket far from its limit (a million tokens, refilling 2 a second), decided
/// steadily at node 0 (5 a second), keeps its writes there
/// (`levee_core::Listing`); when its forecast is due a sample (after 30 s of steady demand)
/// it is listed for later and goes to node 1 in the batch that is the next heartbeat. So the
/// link carries exactly an idle link's batches, every third interval, and node 1 then holds
/// the key as node 0 does.
#[test]
fn a_quiet_bucket_due_a_sample_rides_on_a_heartbeat() {
    let rule = RuleSpec::token_bucket("r", 2, 1_000, 1_000_000)
        .validate()
        .unwrap();
    // No anti-entropy while it runs: the repair of a key whose writes stay at node 0 is not
    // what is measured.
    let mut net = Net::pair(rule, 3_600_000);
    net.start();
    net.run(200);
    let t = net.now();
    // Five decisions a second for 45 s.
    for _ in 0..225 {
        assert!(net.decide(0, "k"));
        net.run(200);
    }
    // From 10 s on (the forecast formed, the key quiet): the idle pace, one batch in 60 ms.
    let n = batches(&net, 0, 1, t + 10_000, t + 44_980);
    assert_eq!(n, 34_980 / 60, "batches 0 -> 1 from 10 s to 44.98 s");
    // The key went: node 1's state is node 0's as of the sample (within 30 s of its start,
    // so node 1's view of what node 0 used may lag by up to 30 s of decisions, a 64th of
    // node 0's capacity at most).
    let (a, b) = (
        net.nodes[0].1.usage("r", "k", net.now()).unwrap(),
        net.nodes[1].1.usage("r", "k", net.now()).unwrap(),
    );
    assert!(
        b.remaining >= a.remaining && b.remaining - a.remaining <= 500_000 / 64 + 1,
        "node 0 sees {} remaining, node 1 {}",
        a.remaining,
        b.remaining
    );
    assert!(
        b.remaining < 1_000_000,
        "node 1 never heard of node 0's decisions"
    );
}

/// The end that answers sends its own heartbeats once the other end's stop arriving (the
/// link from node 0 to node 1 cut one way): within 1.5 heartbeats (90 ms) and an interval
/// of its last answer, then as a link in trouble does. Node 0 keeps hearing node 1; node 1,
/// hearing nothing, finds node 0 unreachable once `suspect_after` has passed.
#[test]
fn the_answering_end_sends_its_own_heartbeats_when_the_other_ends_stop() {
    let mut net = Net::new(replicas(&["eu", "us"], 1), 1_000_000);
    net.start();
    net.run(200);
    net.wire.cut(0, 1);
    let cut = net.now();
    net.run(600);
    let last_answer = batch_times(&net, 1, 0, cut - 100, cut + 6)
        .last()
        .copied()
        .expect("node 1 answered node 0 before the cut");
    let own = batch_times(&net, 1, 0, cut + 6, cut + 600);
    let first = own
        .first()
        .copied()
        .expect("node 1 sent nothing of its own");
    assert!(
        first <= last_answer + 90 + 20,
        "node 1's first heartbeat of its own {} ms after its last answer",
        first - last_answer
    );
    assert!(
        own.windows(2).all(|w| w[1] - w[0] <= 90),
        "node 1's heartbeats further apart than 90 ms: {own:?}"
    );
    assert!(
        net.nodes[0].0.hears(levee_core::NodeIdx(1)),
        "node 0 stopped hearing node 1"
    );
    assert!(
        !net.nodes[1].0.hears(levee_core::NodeIdx(0)),
        "node 1 still hears node 0 600 ms after the cut"
    );
}
