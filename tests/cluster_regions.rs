//! Regional gossip (`cluster.gossip_topology = "regions"`) between real `levee serve`
//! processes over QUIC: two regions of three nodes, each node sending its deltas and
//! heartbeats to its region-mates and one node of the other region. Usage still converges on
//! every node, every node still hears of every other, and at most 6 of the 9 pairs across
//! regions carry gossip (a mesh uses all 9).

#[allow(
    dead_code,
    reason = "shared by the cluster tests, each of which uses part of it"
)]
mod harness;

use std::time::Duration;

use levee_blackbox::cluster::reachable_of;
use levee_blackbox::{metric, wait_until};

use harness::*;

/// Frames node `i` sent to each peer so far, by peer id.
fn frames_sent(c: &LocalClusterHandle, i: usize) -> Vec<(String, f64)> {
    let text = c.metrics(i);
    (0..c.len())
        .filter(|&p| p != i)
        .map(|p| {
            let id = c.id(p).to_owned();
            let n =
                metric(&text, "levee_transport_frames_sent_total", &[("peer", &id)]).unwrap_or(0.0);
            (id, n)
        })
        .collect()
}

#[test]
fn regional_gossip_converges_hears_everyone_and_talks_to_fewer_peers() {
    avoid_window_edge(DAY_MS, 30_000);
    // Two regions of three: each node chooses one gateway in the other region, so at most 6
    // of the 9 pairs across regions carry gossip, whatever order the nodes started in (a
    // mesh uses all 9).
    let regions = ["eu", "us"];
    let c = LocalClusterHandle::start_spec(&regions, 3, |spec| {
        spec.cluster_extra = vec![r#"gossip_topology = "regions""#.to_owned(); 6];
    });
    let all: Vec<usize> = (0..c.len()).collect();
    let (rule, key) = ("daily", "tenant-regional");
    let admitted = c.admit_round_robin(&all, rule, key, 10);
    assert_eq!(
        admitted, 60,
        "60 checks of a 600-a-day key are all admitted"
    );
    let view = c.wait_agreement(&all, rule, key, Duration::from_secs(3), |v| v.used == 60);
    for region in regions {
        assert_eq!(view.regions[region].as_u64(), Some(30), "{view:?}");
    }
    for i in all.iter().copied() {
        let status = c.status(i);
        for p in all.iter().copied().filter(|&p| p != i) {
            assert_eq!(
                reachable_of(&status["peers"], c.id(p)),
                Some(true),
                "{} hears of {}: {status}",
                c.id(i),
                c.id(p)
            );
        }
        assert_eq!(status["degraded"], false, "{status}");
    }
    // Over one second: every node sends each peer it gossips with (both region-mates, its
    // gateway in the other region and the nodes that chose it) at least its idle heartbeat,
    // every `suspect_after / 10` (100 ms), plus a `Heard` every `suspect_after / 4`: 14
    // frames or more; across regions, only chosen pairs are busy (the others get the
    // occasional membership list, one a second at most while lists settle). Right after the
    // start a pair can be busy for a second more than that (a node answers for
    // `suspect_after` a peer it has not yet heard say it gossips by regions, or a gateway
    // just replaced): measured until it settles, at most 8 s.
    let region_of = |id: &str| id[..2].to_owned();
    let mut last = (Vec::new(), std::collections::BTreeSet::new());
    let settled = wait_until(Duration::from_secs(8), || {
        let before: Vec<_> = all.iter().map(|&i| frames_sent(&c, i)).collect();
        std::thread::sleep(Duration::from_secs(1));
        let mut busy_all = Vec::new();
        let mut across = std::collections::BTreeSet::new();
        for (i, was) in before.iter().enumerate() {
            let me = c.id(i).to_owned();
            let busy: Vec<String> = frames_sent(&c, i)
                .into_iter()
                .zip(was)
                .filter(|((_, n), (_, b))| n - b >= 8.0)
                .map(|((id, _), _)| id)
                .collect();
            for r in busy.iter().filter(|b| region_of(b) != region_of(&me)) {
                let pair = if me < *r {
                    (me.clone(), r.clone())
                } else {
                    (r.clone(), me.clone())
                };
                across.insert(pair);
            }
            busy_all.push((me, busy));
        }
        let ok = busy_all.iter().all(|(me, busy)| {
            let mates = busy
                .iter()
                .filter(|b| region_of(b) == region_of(me))
                .count();
            mates == 2 && busy.iter().any(|b| region_of(b) != region_of(me))
        }) && across.len() <= 6;
        last = (busy_all, across);
        ok
    });
    assert!(
        settled,
        "each node gossips with both mates and the other region, and at most 6 pairs across \
         regions carry gossip: {last:?}"
    );
}
