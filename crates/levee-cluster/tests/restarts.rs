//! A node that restarts pulls its own state back before it spends: from every peer it can
//! hear, not only the first to answer. Its last batch to one peer may have been lost just
//! before it stopped (found by `levee-sim --scenario crashes`: seeds 389, 712, 1672, 3626 and
//! 1991 admitted one to five checks above the limit of a window, the restarted node having
//! pulled from a peer that lacked its last checks while another held them). It asks again
//! when the answers are lost, a large pull is answered at a bounded pace, and a node that
//! restarts with nobody to pull from and nothing on disk is blind until somebody answers.

mod common;

use common::{Net, T0, TICK, replicas, window_rule};
use levee_cluster::memory::MemoryStates;
use levee_cluster::{Cluster, ClusterConfig, Event};
use levee_core::calendar::CalendarPeriod;
use levee_core::{NodeIdx, ReplicaSet, RuleSpec};
use levee_proto::Message;
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

#[test]
fn a_restarted_node_recovers_its_usage_from_its_peers_before_it_is_synced() {
    let mut net = Net::new(replicas(&["eu", "us"], 1), 1_000);
    net.start();
    for _ in 0..40 {
        net.decide(0, "acme");
    }
    net.run(2 * TICK);
    // Node 0 crashes and restarts with nothing.
    net.restart(0);
    assert!(net.nodes[0].0.view().recovering);
    assert!(
        !net.decide(0, "acme"),
        "a recovering strict node spends nothing"
    );
    net.flush();
    net.run(50);
    assert!(net.nodes[0].0.is_synced());
    assert_eq!(
        net.nodes[0].1.usage("r", "acme", net.now()).unwrap().used,
        40
    );
}

#[test]
fn a_restarted_node_asks_again_when_the_answers_to_its_pull_are_lost() {
    let rule = RuleSpec::fixed_window("r", 1_000, 60_000)
        .validate()
        .unwrap();
    let mut net = Net::with_rule(replicas(&["eu", "us"], 1), rule);
    net.start();
    for _ in 0..25 {
        net.decide(1, "acme");
    }
    net.run(2 * TICK);
    net.restart(0);
    // The peer hears the restarted node and answers its pull, but the answer is lost (its
    // link was still backing off); heartbeats get through, so nothing looks wrong.
    net.lose_pull_answers_until = net.now() + 200;
    net.flush();
    net.run(250);
    assert!(!net.nodes[0].0.is_synced());
    net.run(400);
    assert!(
        net.nodes[0].0.is_synced(),
        "the pull was asked again and answered"
    );
    assert_eq!(
        net.nodes[0].1.usage("r", "acme", net.now()).unwrap().used,
        25
    );
}

#[test]
fn a_large_pull_is_answered_at_a_bounded_pace_and_once() {
    use levee_cluster::PUSH_KEYS_PER_TICK;
    let set = replicas(&["eu", "us"], 1);
    let cfg = ClusterConfig {
        me: NodeIdx(0),
        replicas: set.clone(),
        gossip_interval: TICK,
        suspect_after: 300,
        anti_entropy_interval: 200,
        forward_timeout: 500,
        tick_phase: 0,
        topology: Default::default(),
    };
    let mut cluster = Cluster::new(cfg, T0);
    // Its counters on disk: starting from what it has, it vouches for them (not blind).
    cluster.set_durable(true);
    let mut store = MemoryStates::new(NodeIdx(0), set, vec![window_rule(100)]);
    let keys = 3 * PUSH_KEYS_PER_TICK + 100;
    for k in 0..keys {
        store.decide("r", &format!("k{k}"), 1, T0, cluster.view());
    }
    // Nobody answered its own pull within suspect_after: it starts from what it has.
    let mut now = T0 + 320;
    cluster.handle_timeout(now, &mut store);
    assert!(cluster.is_synced());
    while cluster.poll_transmit().is_some() {}
    // Every key's state, counted per key, and the keys sent per step.
    let mut seen = std::collections::BTreeMap::<Vec<u8>, usize>::new();
    let mut done = 0;
    // Keys of pull answers sent, counting `done`s.
    let drain = |cluster: &mut Cluster,
                 seen: &mut std::collections::BTreeMap<Vec<u8>, usize>,
                 done: &mut usize| {
        let mut n = 0;
        while let Some(out) = cluster.poll_transmit() {
            if let Message::PullChunk { batch, done: d } = out.msg {
                n += batch.keys.len();
                for k in batch.keys {
                    *seen.entry(k.id).or_default() += 1;
                }
                *done += usize::from(d);
            }
        }
        n
    };
    cluster.handle_message(NodeIdx(1), Message::PullRequest, now, &mut store);
    assert!(drain(&mut cluster, &mut seen, &mut done) <= PUSH_KEYS_PER_TICK);
    for _ in 0..10 {
        now += TICK;
        cluster.handle_timeout(now, &mut store);
        let mut n = drain(&mut cluster, &mut seen, &mut done);
        if done == 0 {
            // The requester asks again meanwhile (its retry timer): the answer already
            // under way is not repeated.
            cluster.handle_message(NodeIdx(1), Message::PullRequest, now, &mut store);
            n += drain(&mut cluster, &mut seen, &mut done);
        }
        assert!(n <= PUSH_KEYS_PER_TICK, "{n} keys in one interval");
        if done == 1 {
            break;
        }
    }
    assert_eq!(seen.len(), keys, "every key was sent");
    assert!(seen.values().all(|&n| n == 1), "no key was sent twice");
    assert_eq!(done, 1, "one answer, marked done once");
}

/// A running cluster of three regions (a node each, a limit of 900) whose every node has
/// reloaded, 100 ms ago, the list with region `ap`'s weight doubled: node 0's share grew,
/// the others' shrank. Returns it, the list before and after, and when they reloaded.
fn reweighted() -> (Net, ReplicaSet, ReplicaSet, u64) {
    let old = replicas(&["ap", "eu", "us"], 1);
    let (mut regions, nodes) = old.specs();
    for (name, weight) in &mut regions {
        if name == "ap" {
            *weight = 2;
        }
    }
    let new = ReplicaSet::new(&regions, &nodes).unwrap();
    let mut net = Net::new(old.clone(), 900);
    net.start();
    let changed_at = net.now();
    for n in 0..3 {
        net.nodes[n].0.change_list(new.clone(), changed_at).unwrap();
    }
    net.flush();
    net.run(100);
    (net, old, new, changed_at)
}

/// Node 0 restarts, after a reweight, with the new list: it knows nothing of the old one
/// (a reweight's old weights are in no file it reads). Its peers tell it, answering its pull,
/// which list they ran before and how long ago they stopped; it reports that to its driver
/// before it syncs, and the rule held by it keeps node 0's grown share at the old one until
/// a share that changed then may grow. Before, a node restarted during a reweight spent its
/// grown share at once (`levee-sim --seed 4674 --scenario reweight`: 211 of 208, 2 lost
/// with the crash).
#[test]
fn a_node_restarted_after_a_reweight_is_told_the_list_before_and_holds_its_grown_share() {
    let (mut net, old, new, changed_at) = reweighted();
    net.restart_with(0, new.clone());
    net.flush();
    let start = net.now();
    let mut events = Vec::new();
    while !net.nodes[0].0.is_synced() {
        net.run(1);
        assert!(
            net.now() < start + 300,
            "not synced 300 ms after the restart"
        );
        events.extend(std::iter::from_fn(|| net.nodes[0].0.poll_event()));
    }
    let synced = events.iter().position(|e| *e == Event::Synced).unwrap();
    let Some(Event::ListsBefore(before)) = synced.checked_sub(1).map(|i| &events[i]) else {
        panic!("no ListsBefore just before Synced: {events:?}");
    };
    assert_eq!(before.len(), 1, "{before:?}");
    let (list, until) = &before[0];
    assert_eq!(list.digest(), old.digest());
    // Its peers stopped running it at `changed_at`; the answer took 5 ms.
    assert!(
        (changed_at..=changed_at + 5).contains(until),
        "stopped at {until}, changed at {changed_at}"
    );
    let mut full = window_rule(900);
    full.bind(&new);
    assert_eq!(full.split, vec![450, 225, 225]);
    let now = net.now();
    let (held, at) = full
        .held_by_lists_before(&full, None, &new, before, now)
        .expect("node 0's share grew with the reweight");
    assert_eq!(held.split, vec![300, 225, 225]);
    assert_eq!(at, full.algorithm.shares_may_grow_at(*until));
    assert!(at > now);
    // A change whose shares may have grown long ago holds nothing.
    assert_eq!(
        full.held_by_lists_before(&full, None, &new, before, at),
        None
    );
}

/// A peer of a version before `ListsBefore` never says which lists it ran: a node that
/// starts waits `suspect_after` after the first whole answer for it (as for a peer that says
/// no list), then syncs with nothing to bind by.
#[test]
fn a_node_whose_peers_never_say_the_lists_before_syncs_after_suspect_after() {
    let (mut net, _, new, _) = reweighted();
    net.no_lists_before = true;
    net.restart_with(0, new);
    net.flush();
    let start = net.now();
    net.run(200);
    assert!(
        !net.nodes[0].0.is_synced(),
        "synced with no peer's lists before"
    );
    let mut events = Vec::new();
    while !net.nodes[0].0.is_synced() {
        net.run(1);
        assert!(
            net.now() <= start + 10 + 300 + TICK,
            "not synced suspect_after after the answers"
        );
        events.extend(std::iter::from_fn(|| net.nodes[0].0.poll_event()));
    }
    assert!(
        !events.iter().any(|e| matches!(e, Event::ListsBefore(_))),
        "{events:?}"
    );
}

/// A node that keeps its counters on disk and restarts cut off from every peer after a
/// reweight syncs from its disk after `suspect_after`, knowing no list before its own. Once
/// it hears a peer again, the peer, asked for its list (the restarted node has not heard it
/// yet), also tells it the lists it ran before: the node reports them then, and holds its
/// grown share from that moment (the real-process restart of
/// `tests/membership.rs::a_node_restarted_after_a_reweight_does_not_spend_its_grown_share_today`
/// lost its pull's answer to a link still backing off, and synced from its disk).
#[test]
fn a_durable_node_synced_alone_after_a_reweight_hears_the_lists_before_once_it_hears_a_peer() {
    let (mut net, old, new, _) = reweighted();
    net.isolate(0, true);
    net.restart_with(0, new);
    net.nodes[0].0.set_durable(true);
    net.flush();
    net.run(400);
    assert!(net.nodes[0].0.is_synced(), "not synced after suspect_after");
    let events: Vec<_> = std::iter::from_fn(|| net.nodes[0].0.poll_event()).collect();
    assert!(
        !events.iter().any(|e| matches!(e, Event::ListsBefore(_))),
        "{events:?}"
    );
    net.isolate(0, false);
    // Its list goes out again at the next anti-entropy round (200 ms), a peer answers.
    net.run(300);
    let events: Vec<_> = std::iter::from_fn(|| net.nodes[0].0.poll_event()).collect();
    let lists = events.iter().find_map(|e| match e {
        Event::ListsBefore(l) => Some(l),
        _ => None,
    });
    let lists = lists.unwrap_or_else(|| panic!("no ListsBefore once mended: {events:?}"));
    assert_eq!(lists.len(), 1);
    assert_eq!(lists[0].0.digest(), old.digest());
}
