//! Regional gossip (`cluster.gossip_topology = "regions"`) between real `levee serve`
//! processes over QUIC: three regions of two nodes, each node sending its deltas and
//! heartbeats to its region-mate and one node of each other region. Usage still converges on
//! every node, every node still hears of every other, and each node's frames go to 3 of its 5
//! peers (a mesh sends to all 5).

#[allow(
    dead_code,
    reason = "shared by the cluster tests, each of which uses part of it"
)]
mod harness;

use std::time::Duration;

use levee_blackbox::cluster::reachable_of;
use levee_blackbox::metric;

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
    let c = LocalClusterHandle::start_spec(&REGIONS, NODES_PER_REGION, |spec| {
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
    for region in REGIONS {
        assert_eq!(view.regions[region].as_u64(), Some(20), "{view:?}");
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
    // Over one second, each node sends every interval (20 ms) to its region-mate and its
    // gateway in each other region; the others get only the occasional membership list.
    let before: Vec<_> = all.iter().map(|&i| frames_sent(&c, i)).collect();
    std::thread::sleep(Duration::from_secs(1));
    for (i, was) in before.iter().enumerate() {
        let now = frames_sent(&c, i);
        let busy: Vec<&str> = now
            .iter()
            .zip(was)
            .filter(|((_, n), (_, b))| n - b >= 25.0)
            .map(|((id, _), _)| id.as_str())
            .collect();
        assert_eq!(busy.len(), 3, "{} gossips with {busy:?}", c.id(i));
        let mate = c.id(if i % 2 == 0 { i + 1 } else { i - 1 });
        assert!(busy.contains(&mate), "{} gossips with {busy:?}", c.id(i));
    }
}
