//! Regional gossip (`Topology::Regions`): each node talks to its region-mates and one gateway
//! per other region, gateways relay, and every node still hears of every node and converges.

mod common;

use std::collections::BTreeSet;

use common::{Net, TICK, replicas, window_rule};
use levee_cluster::Topology;
use levee_core::{NodeIdx, RuleSpec};

/// 3 regions × 3 nodes gossiping by regions, started and synced.
fn regional() -> Net {
    regional_with(window_rule(100_000))
}

/// [`regional`] with `rule`.
fn regional_with(rule: levee_core::Rule) -> Net {
    let mut net = Net::with(replicas(&["ap", "eu", "us"], 3), rule, Topology::Regions);
    net.start();
    net
}

/// The peers each node sent deltas or heartbeats to from `since` on.
fn destinations(net: &Net, since: u64) -> Vec<BTreeSet<usize>> {
    let mut out = vec![BTreeSet::new(); net.nodes.len()];
    for &(t, from, to) in &net.gossip_log {
        if t >= since {
            out[from].insert(to);
        }
    }
    out
}

/// Whether every node holds the same state of `key`.
fn agree(net: &Net, key: &str) -> bool {
    let first = net.nodes[0].1.state("r", key).cloned();
    first.is_some()
        && net.nodes[1..]
            .iter()
            .all(|(_, s)| s.state("r", key).cloned() == first)
}

/// `checks` decisions of `key`, in turn at its owner in each region (admitted), then waits
/// (up to 2 s) until every node holds the same state of it.
fn decide_in_every_region_until_agreed(net: &mut Net, key: &str, checks: usize) {
    let owners: Vec<usize> = [0, 3, 6]
        .iter()
        .map(|&n| usize::from(net.nodes[n].0.owner(key.as_bytes()).0))
        .collect();
    for i in 0..checks {
        assert!(net.decide(owners[i % 3], key));
        net.run(3);
    }
    let stopped = net.now();
    while !agree(net, key) && net.now() < stopped + 2_000 {
        net.run(1);
    }
    assert!(agree(net, key), "every node holds the same state of {key}");
}

#[test]
fn each_node_gossips_with_its_region_and_one_node_per_other_region() {
    let mut net = regional();
    let since = net.now();
    for i in 0..90 {
        net.decide(i % 9, &format!("k{i}"));
        net.run(7);
    }
    net.run(200);
    let regions = 3;
    let per_region = 3;
    for (node, to) in destinations(&net, since).iter().enumerate() {
        // Its 2 region-mates and its gateway in each of the 2 other regions (the regions
        // have the same size: the node at the same position, which chose it in turn).
        assert_eq!(
            to.len(),
            (per_region - 1) + (regions - 1),
            "node {node} gossiped with {to:?}"
        );
        let mates = to
            .iter()
            .filter(|&&p| p / per_region == node / per_region)
            .count();
        assert_eq!(mates, per_region - 1, "node {node}: {to:?}");
    }
    // The same cluster as a mesh: every node talks to all 8 others.
    let mut mesh = Net::new(replicas(&["ap", "eu", "us"], 3), 100_000);
    mesh.start();
    let since = mesh.now();
    mesh.run(200);
    for to in destinations(&mesh, since) {
        assert_eq!(to.len(), 8);
    }
}

#[test]
fn decisions_anywhere_reach_every_node_through_the_gateways() {
    let mut net = regional();
    decide_in_every_region_until_agreed(&mut net, "acme", 45);
    for n in [0, 4, 8] {
        let used = net.nodes[n].1.usage("r", "acme", net.now()).unwrap().used;
        assert_eq!(used, 45, "node {n}");
    }
    for (cluster, _) in &net.nodes {
        assert!(cluster.view().unreachable.is_empty());
        for p in 0..9u16 {
            assert!(
                cluster.hears(NodeIdx(p)),
                "{:?} hears node {p}",
                cluster.me()
            );
        }
    }
}

#[test]
fn a_dead_gateway_is_replaced_and_the_others_still_hear_of_everyone_alive() {
    // A minute's window: what is compared does not change windows meanwhile.
    let mut net = regional_with(
        RuleSpec::fixed_window("r", 100_000, 60_000)
            .validate()
            .unwrap(),
    );
    // eu-1 (node 3) is a gateway of ap-1 and us-1; it dies.
    net.isolate(3, true);
    net.run(1_000);
    for (i, (cluster, _)) in net.nodes.iter().enumerate() {
        if i == 3 {
            continue;
        }
        assert!(
            cluster.view().unreachable.is_empty(),
            "node {i}: {:?}",
            cluster.view()
        );
        for p in (0..9u16).filter(|&p| p != 3) {
            assert!(cluster.hears(NodeIdx(p)), "node {i} hears node {p}");
        }
        assert!(!cluster.hears(NodeIdx(3)), "node {i} knows eu-1 is gone");
    }
    // Decisions in ap, whose first node's gateway in eu was eu-1, reach eu-2 and eu-3.
    let owner = usize::from(net.nodes[0].0.owner(b"after").0);
    for _ in 0..10 {
        assert!(net.decide(owner, "after"));
        net.run(5);
    }
    net.run(4 * TICK + 100);
    for n in [4, 5, 7] {
        let used = net.nodes[n].1.usage("r", "after", net.now()).unwrap().used;
        assert_eq!(used, 10, "node {n}");
    }
    // It comes back: everyone hears it again, and it catches up.
    net.isolate(3, false);
    net.run(300);
    // Links settle back to region-mates, one gateway per region and the nodes that chose
    // each node: nobody keeps talking to a node it only probed.
    net.run(1_500);
    let since = net.now();
    net.run(500);
    for (node, to) in destinations(&net, since).iter().enumerate() {
        assert!(to.len() <= 2 + 2 * 2, "node {node} gossips with {to:?}");
    }
    assert!(net.nodes.iter().all(|(c, _)| c.hears(NodeIdx(3))));
    let used = net.nodes[3].1.usage("r", "after", net.now()).unwrap().used;
    assert_eq!(used, 10);
}

#[test]
fn a_cut_off_region_is_unreachable_and_every_view_agrees_after_the_heal() {
    // The same partition under both topologies: regional gossip heals as fast as the mesh.
    for topology in [Topology::Mesh, Topology::Regions] {
        let mut net = Net::with(
            replicas(&["ap", "eu", "us"], 3),
            window_rule(100_000),
            topology,
        );
        net.start();
        for n in 6..9 {
            net.isolate(n, true);
        }
        // Nodes of one region may still talk to each other: only links to other regions go.
        for a in 6..9 {
            for b in 6..9 {
                if a != b {
                    net.wire.mend(a, b);
                }
            }
        }
        net.run(1_200);
        let us = net.replicas.region_by_name("us").unwrap();
        for (i, (cluster, _)) in net.nodes.iter().enumerate().take(6) {
            assert!(
                cluster.view().unreachable.contains(us),
                "{topology:?}: node {i}"
            );
        }
        for i in 0..30 {
            net.decide(i % 9, "split");
            net.run(10);
        }
        for n in 6..9 {
            net.isolate(n, false);
        }
        let healed = net.now();
        while !agree(&net, "split") && net.now() < healed + 2_000 {
            net.run(1);
        }
        let took = net.now() - healed;
        // A heal is seen within an interval (every node keeps trying one node of each region
        // it does not hear); then each side pushes what the other missed, and gateways relay
        // it: two intervals and a round trip, plus a relay (an interval and a hop).
        assert!(agree(&net, "split"), "{topology:?}: not agreed within 2 s");
        assert!(
            took <= 3 * TICK + 3 * 5,
            "{topology:?}: agreed {took} ms after the heal"
        );
        assert!(
            net.nodes
                .iter()
                .all(|(c, _)| c.view().unreachable.is_empty())
        );
    }
}

#[test]
fn a_cluster_half_mesh_half_regional_converges_and_hears_everyone() {
    // A rolling change of `gossip_topology`: every other node still gossips as a mesh.
    let topologies: Vec<Topology> = (0..9)
        .map(|i| {
            if i % 2 == 0 {
                Topology::Mesh
            } else {
                Topology::Regions
            }
        })
        .collect();
    // Without anti-entropy (it would repair what gossip misses, a second or more later):
    // a regional node may choose a mesh node as its gateway, which must relay what it sends.
    let mut net = Net::mixed_with_anti_entropy(
        replicas(&["ap", "eu", "us"], 3),
        window_rule(100_000),
        &topologies,
        3_600_000,
    );
    net.start();
    decide_in_every_region_until_agreed(&mut net, "both", 30);
    // Liveness news needs a round of `Heard` (every `suspect_after / 4`).
    net.run(300);
    for (i, (cluster, _)) in net.nodes.iter().enumerate() {
        assert!(cluster.view().unreachable.is_empty(), "node {i}");
        for p in 0..9u16 {
            assert!(cluster.hears(NodeIdx(p)), "node {i} hears node {p}");
        }
    }
}
