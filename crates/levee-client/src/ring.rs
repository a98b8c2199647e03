//! Owner routing: the ring of the client's region, read from `GET /v1/cluster` (`ring`), with
//! keys placed by the node's own code ([`levee_cluster::ring::Rings`] over the member nodes,
//! hashing the key's own bytes, as `levee_cluster::Cluster::route` does with a check's key).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use levee_cluster::ring::Rings;
use levee_core::{RegionIdx, ReplicaSet, ReplicaSpec};
use serde::Deserialize;

use crate::{Check, Client};

#[derive(Deserialize)]
struct ClusterAnswer {
    ring: RingAnswer,
}

#[derive(Deserialize)]
struct RingAnswer {
    region: String,
    vnodes: u32,
    nodes: Vec<RingNode>,
}

#[derive(Deserialize)]
struct RingNode {
    id: String,
    http: Option<String>,
    member: bool,
}

/// A ring as read from one node.
struct Ring {
    rings: Rings,
    region: RegionIdx,
    /// Node id per node index of the replica set.
    ids: Vec<String>,
    /// Base URL per node index of the replica set (`None`: no HTTP address known).
    urls: Vec<Option<String>>,
    /// Base URLs of the member nodes.
    members: Vec<String>,
}

#[derive(Default)]
struct Snapshot {
    ring: Option<Arc<Ring>>,
    read_at: Option<Instant>,
    stale: bool,
}

pub(crate) struct RingState {
    seeds: Vec<String>,
    snap: Mutex<Snapshot>,
    /// One refresh at a time; the others route with the ring they have.
    refreshing: tokio::sync::Mutex<()>,
}

impl RingState {
    pub(crate) fn new(seeds: Vec<String>) -> RingState {
        RingState {
            seeds,
            snap: Mutex::new(Snapshot::default()),
            refreshing: tokio::sync::Mutex::new(()),
        }
    }

    /// A node failed to answer: read the ring again before the next call.
    pub(crate) fn mark_stale(&self) {
        self.snap.lock().expect("ring lock").stale = true;
    }

    /// The nodes to try for a call about `key`, best first: its owner, then the other members,
    /// then the nodes given to the builder. Without routing: the nodes given, in order.
    pub(crate) async fn targets(&self, key: Option<&str>, client: &Client) -> Vec<String> {
        if !client.routing() {
            if client.wants_rules() {
                // The local cap's figures come with the ring.
                self.current(client).await;
            }
            return self.seeds.clone();
        }
        let ring = self.current(client).await;
        let mut out: Vec<String> = Vec::new();
        if let Some(ring) = ring {
            if let Some(owner) = key
                .and_then(|k| ring.rings.owner(ring.region, k.as_bytes()))
                .and_then(|n| ring.urls.get(usize::from(n.0)).cloned().flatten())
            {
                out.push(owner);
            }
            out.extend(ring.members.iter().cloned());
        }
        out.extend(self.seeds.iter().cloned());
        let mut seen = std::collections::HashSet::new();
        out.retain(|u| seen.insert(u.clone()));
        out
    }

    /// Groups checks by the node they go to: (index of the group's first check, indices).
    pub(crate) async fn group(
        &self,
        checks: &[Check],
        client: &Client,
    ) -> Vec<(usize, Vec<usize>)> {
        let mut groups: Vec<(String, usize, Vec<usize>)> = Vec::new();
        for (i, c) in checks.iter().enumerate() {
            let target = self.targets(Some(&c.key), client).await.remove(0);
            match groups.iter_mut().find(|g| g.0 == target) {
                Some(g) => g.2.push(i),
                None => groups.push((target, i, vec![i])),
            }
        }
        groups.into_iter().map(|(_, f, idx)| (f, idx)).collect()
    }

    /// The ring, read again first when it is missing, old or marked stale.
    async fn current(&self, client: &Client) -> Option<Arc<Ring>> {
        let fresh = |s: &Snapshot| {
            !s.stale
                && s.read_at
                    .is_some_and(|t| t.elapsed() < client.ring_refresh())
        };
        {
            let s = self.snap.lock().expect("ring lock");
            if fresh(&s) {
                return s.ring.clone();
            }
        }
        let Ok(_guard) = self.refreshing.try_lock() else {
            return self.snap.lock().expect("ring lock").ring.clone();
        };
        let known: Vec<String> = {
            let s = self.snap.lock().expect("ring lock");
            let mut v: Vec<String> = s
                .ring
                .as_ref()
                .map(|r| r.members.clone())
                .unwrap_or_default();
            v.extend(self.seeds.iter().cloned());
            v
        };
        let mut read = None;
        for base in &known {
            if let Some(r) = read_ring(client, base).await {
                read = Some(Arc::new(r));
                break;
            }
        }
        let mut s = self.snap.lock().expect("ring lock");
        s.read_at = Some(Instant::now());
        if let Some(r) = read {
            s.ring = Some(r);
            s.stale = false;
        }
        s.ring.clone()
    }
}

async fn read_ring(client: &Client, base: &str) -> Option<Ring> {
    let reply = client
        .transport()
        .request(
            http::Method::GET,
            base,
            "/v1/cluster",
            None,
            None,
            Duration::ZERO,
        )
        .await
        .ok()?;
    if reply.status != 200 {
        return None;
    }
    let answer: ClusterAnswer = reply.json().ok()?;
    if client.wants_rules()
        && let Ok(rules) = client
            .transport()
            .request(
                http::Method::GET,
                base,
                "/v1/rules",
                None,
                None,
                Duration::ZERO,
            )
            .await
        && rules.status == 200
        && let (Some(cap), Ok(v)) = (client.cap(), rules.json::<serde_json::Value>())
    {
        cap.set_rules(&v);
    }
    build(answer.ring)
}

fn build(ring: RingAnswer) -> Option<Ring> {
    // The node's rings use `levee_cluster::ring::VNODES` virtual nodes; a node built with
    // another figure places keys differently, so routing would only cost forwards: refuse it.
    if ring.vnodes != levee_cluster::ring::VNODES || ring.nodes.is_empty() {
        return None;
    }
    let specs: Vec<ReplicaSpec> = ring
        .nodes
        .iter()
        .map(|n| ReplicaSpec {
            id: n.id.clone(),
            region: ring.region.clone(),
            weight: None,
        })
        .collect();
    let set = ReplicaSet::new(&[(ring.region.clone(), 1)], &specs).ok()?;
    let region = set.region_by_name(&ring.region)?;
    let by_id = |id: &str| ring.nodes.iter().find(|n| n.id == id);
    let n_nodes = set.region_nodes(region).len();
    let mut urls = vec![None; n_nodes];
    let mut ids = vec![String::new(); n_nodes];
    for &n in set.region_nodes(region) {
        ids[usize::from(n.0)] = set.node_id(n).to_owned();
        urls[usize::from(n.0)] = by_id(set.node_id(n))
            .and_then(|x| x.http.as_deref())
            .and_then(|h| crate::transport::base_url(h).ok());
    }
    let rings = Rings::new(&set, |n| by_id(set.node_id(n)).is_some_and(|x| x.member));
    let members = ring
        .nodes
        .iter()
        .filter(|n| n.member)
        .filter_map(|n| n.http.as_deref())
        .filter_map(|h| crate::transport::base_url(h).ok())
        .collect();
    Some(Ring {
        rings,
        region,
        ids,
        urls,
        members,
    })
}

/// The ring of a node's region as its `GET /v1/cluster` answer shows it (`ring`): which node
/// of the region owns a key, computed as the node computes it. What a caller that routes by
/// itself, or a load generator sending a node only its own keys, needs.
pub struct RegionRing(Ring);

impl RegionRing {
    /// The ring of a `GET /v1/cluster` answer (its JSON text); an error says what is missing
    /// (a node without `[cluster]` has no ring, a node built with another number of virtual
    /// nodes places keys differently).
    pub fn from_cluster_json(text: &str) -> Result<RegionRing, String> {
        let answer: ClusterAnswer =
            serde_json::from_str(text).map_err(|e| format!("not a /v1/cluster answer: {e}"))?;
        build(answer.ring)
            .map(RegionRing)
            .ok_or_else(|| "the ring is empty or uses another number of virtual nodes".into())
    }

    /// The id of the node that owns `key` in the region (`None` when no node is a member).
    pub fn owner(&self, key: &str) -> Option<&str> {
        let r = &self.0;
        r.rings
            .owner(r.region, key.as_bytes())
            .map(|n| r.ids[usize::from(n.0)].as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(members: &[bool]) -> RingAnswer {
        RingAnswer {
            region: "eu".into(),
            vnodes: levee_cluster::ring::VNODES,
            nodes: members
                .iter()
                .enumerate()
                .map(|(i, &m)| RingNode {
                    id: format!("eu-{}", i + 1),
                    http: Some(format!("127.0.0.1:{}", 9000 + i)),
                    member: m,
                })
                .collect(),
        }
    }

    #[test]
    fn a_non_member_owns_nothing_and_every_member_owns_some_keys() {
        let ring = build(answer(&[true, false, true])).unwrap();
        let mut seen = std::collections::BTreeSet::new();
        for i in 0..500 {
            let n = ring
                .rings
                .owner(ring.region, format!("k{i}").as_bytes())
                .unwrap();
            seen.insert(ring.urls[usize::from(n.0)].clone().unwrap());
        }
        let want: std::collections::BTreeSet<String> = [
            "http://127.0.0.1:9000".to_owned(),
            "http://127.0.0.1:9002".to_owned(),
        ]
        .into();
        assert_eq!(seen, want);
    }

    #[test]
    fn another_vnode_count_is_refused() {
        let mut a = answer(&[true]);
        a.vnodes += 1;
        assert!(build(a).is_none());
    }
}
