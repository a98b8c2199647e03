//! Key ownership inside a region: a consistent-hash ring (crate `hashring`) with virtual
//! nodes, one ring per region, over the region's nodes that this node believes reachable.
//!
//! Keys are placed by their own bytes ([`RingKey`] feeds exactly those bytes to the hasher),
//! and virtual nodes by the node's id and the virtual node's number, so every node and every
//! version places a key the same way. When a node is suspected, the ring of its region is
//! rebuilt without it and its keys move to their next nodes; when it is heard again they move
//! back. Two nodes may briefly disagree on an owner: per-node CRDT entries and donor-recorded
//! transfers make that safe.

use std::hash::{Hash, Hasher};

use hashring::HashRing;
use levee_core::{NodeIdx, RegionIdx, ReplicaSet};

/// Virtual nodes per node: enough for an even spread over a handful of nodes.
pub const VNODES: u32 = 64;

/// A key's bytes as a ring position.
pub struct RingKey<'a>(pub &'a [u8]);

impl Hash for RingKey<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write(self.0);
    }
}

/// A virtual node, hashed from stable bytes: the node's id and the virtual node's number.
#[derive(Debug, Clone, PartialEq, Eq)]
struct VNode {
    node: NodeIdx,
    id: String,
    n: u32,
}

impl Hash for VNode {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write(self.id.as_bytes());
        state.write(&[0]);
        state.write(&self.n.to_le_bytes());
    }
}

/// One ring per region.
pub struct Rings {
    rings: Vec<HashRing<VNode>>,
}

impl Rings {
    /// Rings over the nodes for which `member` is true.
    pub fn new(replicas: &ReplicaSet, member: impl Fn(NodeIdx) -> bool) -> Rings {
        let rings = replicas
            .regions()
            .map(|r| {
                let mut ring = HashRing::new();
                let vnodes: Vec<VNode> = replicas
                    .region_nodes(r)
                    .iter()
                    .filter(|&&n| member(n))
                    .flat_map(|&n| {
                        let id = replicas.node_id(n).to_owned();
                        (0..VNODES).map(move |v| VNode {
                            node: n,
                            id: id.clone(),
                            n: v,
                        })
                    })
                    .collect();
                ring.batch_add(vnodes);
                ring
            })
            .collect();
        Rings { rings }
    }

    /// The owner of `key` in `region`, if the region has a member.
    pub fn owner(&self, region: RegionIdx, key: &[u8]) -> Option<NodeIdx> {
        self.rings
            .get(usize::from(region.0))?
            .get(&RingKey(key))
            .map(|v| v.node)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use levee_core::ReplicaSpec;

    /// eu-1, eu-2, eu-3 and us-1, by position 0 to 3 (the routing tests use it too).
    pub(crate) fn replicas() -> ReplicaSet {
        let regions = [("eu".to_owned(), 1), ("us".to_owned(), 1)];
        let nodes: Vec<ReplicaSpec> = ["eu-1", "eu-2", "eu-3", "us-1"]
            .iter()
            .map(|id| ReplicaSpec {
                id: (*id).into(),
                region: id[..2].into(),
                weight: None,
            })
            .collect();
        ReplicaSet::new(&regions, &nodes).unwrap()
    }

    #[test]
    fn keys_spread_over_the_region_and_placement_is_stable() {
        let set = replicas();
        let eu = set.region_by_name("eu").unwrap();
        let a = Rings::new(&set, |_| true);
        let b = Rings::new(&set, |_| true);
        let mut counts = [0usize; 3];
        for i in 0..3000 {
            let key = format!("tenant-{i}");
            let o = a.owner(eu, key.as_bytes()).unwrap();
            assert_eq!(Some(o), b.owner(eu, key.as_bytes()));
            counts[usize::from(o.0)] += 1;
        }
        for c in counts {
            assert!(c > 600, "uneven spread {counts:?}");
        }
    }

    #[test]
    fn a_suspected_node_hands_only_its_own_keys_to_the_others() {
        let set = replicas();
        let eu = set.region_by_name("eu").unwrap();
        let all = Rings::new(&set, |_| true);
        let without = Rings::new(&set, |n| n != NodeIdx(1));
        for i in 0..2000 {
            let key = format!("k{i}");
            let before = all.owner(eu, key.as_bytes()).unwrap();
            let after = without.owner(eu, key.as_bytes()).unwrap();
            if before != NodeIdx(1) {
                assert_eq!(before, after, "a key not owned by the suspect moved");
            } else {
                assert_ne!(after, NodeIdx(1));
            }
        }
    }

    #[test]
    fn a_region_without_members_has_no_owner() {
        let set = replicas();
        let us = set.region_by_name("us").unwrap();
        let rings = Rings::new(&set, |n| n != NodeIdx(3));
        assert_eq!(rings.owner(us, b"x"), None);
    }
}
