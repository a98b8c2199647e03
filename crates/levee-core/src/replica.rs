//! The agreed replica set: every node of the cluster with its region and weight.
//!
//! CRDT entries are written per *node* (a replica), never per region: ownership of a key moves
//! inside a region, and two nodes that both believe they own a key must not write the same
//! grow-only entry (pointwise max would drop one of the increments). Regions are only a way to
//! sum node entries and to weigh shares.
//!
//! Every node holds the same list in the same order, so a [`NodeIdx`] names the same node
//! everywhere and integer splits of a limit come out identical on every node.

use serde::{Deserialize, Serialize};

use crate::hash::Fnv1a;

/// Position of a node in the agreed replica list. The same on every node of the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct NodeIdx(pub u16);

/// Position of a region in the agreed region list (sorted by name).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct RegionIdx(pub u16);

/// The most nodes a replica set may hold. Region reachability is a 64-bit mask, and small
/// indices keep CRDT entries compact.
pub const MAX_NODES: usize = 256;
/// The most regions a replica set may hold (one bit each in a [`RegionMask`]).
pub const MAX_REGIONS: usize = 64;

/// The largest weight a region or a node may have. Bounding weights keeps every share
/// computation exact in 128-bit integers.
pub const MAX_WEIGHT: u32 = 1_000_000;

/// A set of regions as a bit mask (bit *i* is [`RegionIdx`] *i*).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash, Serialize, Deserialize)]
pub struct RegionMask(pub u64);

impl RegionMask {
    /// The empty set.
    pub const EMPTY: RegionMask = RegionMask(0);

    /// Whether `region` is in the set.
    #[inline]
    pub fn contains(self, region: RegionIdx) -> bool {
        self.0 & (1u64 << region.0) != 0
    }

    /// The set with `region` added.
    #[inline]
    #[must_use]
    pub fn with(self, region: RegionIdx) -> RegionMask {
        RegionMask(self.0 | (1u64 << region.0))
    }

    /// Whether the set is empty.
    #[inline]
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
}

/// One member of the agreed replica list, as given by the configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaSpec {
    /// Unique node id, e.g. `eu-1`.
    pub id: String,
    /// The region the node serves, e.g. `eu`.
    pub region: String,
    /// The node's weight inside its region; `None` splits the region's weight evenly.
    /// `Some(0)` marks a removed node ([`REMOVED`]): its position is kept (a tombstone, so
    /// that positions never move), it has no share, owns no key and is never dialled.
    pub weight: Option<u32>,
}

/// The weight of a removed node's entry: `[[cluster.node]]` with `removed = true`.
pub const REMOVED: Option<u32> = Some(0);

/// Why a replica set was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReplicaSetError {
    /// The list is empty.
    #[error("cluster.node: the node list is empty")]
    Empty,
    /// Two nodes share an id.
    #[error("cluster.node: node id {0:?} appears twice")]
    DuplicateNode(String),
    /// A node names a region without a weight.
    #[error("cluster.node[{node}].region: region {region:?} has no weight in cluster.regions")]
    UnknownRegion {
        /// The node id.
        node: String,
        /// The region it names.
        region: String,
    },
    /// A region has a weight but no node.
    #[error("cluster.regions.{0}: the region has a weight but no node")]
    EmptyRegion(String),
    /// A weight of zero or above [`MAX_WEIGHT`].
    #[error("{0}: weight must be an integer from 1 to 1000000")]
    InvalidWeight(String),
    /// A list that cannot follow the running one (positions must never move).
    #[error("{0}")]
    NotASuccessor(String),
    /// Too many nodes or regions.
    #[error("cluster: at most {MAX_NODES} nodes and {MAX_REGIONS} regions are supported")]
    TooLarge,
}

/// The agreed list of replicas with their regions and weights, and the shares derived from it.
///
/// A region's static share is its weight over the sum of region weights; a node's share is its
/// region's share split among the region's nodes by node weight (evenly unless configured).
#[derive(Debug, Clone, PartialEq)]
pub struct ReplicaSet {
    nodes: Vec<Replica>,
    regions: Vec<RegionInfo>,
    /// Sum over nodes of `node_weight`, the denominator of every node share.
    total_weight: u128,
    digest: u64,
    /// Shares as fractions, computed once: the decision path reads them.
    region_shares: Vec<f64>,
    node_shares: Vec<f64>,
    /// Lists whose shares bound this one's while a membership change settles
    /// ([`ReplicaSet::with_floors`]): every share is the smallest of this list's and theirs.
    floors: Vec<Floor>,
}

/// A list whose shares bound another's, with the position of each of the other's nodes in it.
#[derive(Debug, Clone, PartialEq)]
struct Floor {
    set: ReplicaSet,
    /// By position in the bounded list: the same node's position in `set`, if it has one.
    position: Vec<Option<usize>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Replica {
    id: String,
    region: RegionIdx,
    /// The node's weight in units where the cluster sums to `total_weight` (0 when removed).
    weight: u128,
    /// The weight as configured (`None`: even; [`REMOVED`]: a tombstone).
    given: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct RegionInfo {
    name: String,
    weight: u128,
    nodes: Vec<NodeIdx>,
}

impl ReplicaSet {
    /// A replica set of one node in one region: a single Levee node on its own.
    pub fn single(id: &str, region: &str) -> ReplicaSet {
        ReplicaSet::new(
            &[(region.to_owned(), 1)],
            &[ReplicaSpec {
                id: id.to_owned(),
                region: region.to_owned(),
                weight: None,
            }],
        )
        .expect("a single node with weight 1 is always valid")
    }

    /// Builds the replica set from region weights and the node list. Node order is kept (it is
    /// the agreed order); regions are ordered by name.
    pub fn new(
        region_weights: &[(String, u32)],
        nodes: &[ReplicaSpec],
    ) -> Result<ReplicaSet, ReplicaSetError> {
        if nodes.is_empty() {
            return Err(ReplicaSetError::Empty);
        }
        if nodes.len() > MAX_NODES || region_weights.len() > MAX_REGIONS {
            return Err(ReplicaSetError::TooLarge);
        }
        let mut regions: Vec<RegionInfo> = region_weights
            .iter()
            .map(|(name, w)| RegionInfo {
                name: name.clone(),
                weight: u128::from(*w),
                nodes: vec![],
            })
            .collect();
        regions.sort_by(|a, b| a.name.cmp(&b.name));
        for r in &regions {
            if r.weight == 0 || r.weight > u128::from(MAX_WEIGHT) {
                return Err(ReplicaSetError::InvalidWeight(format!(
                    "cluster.regions.{}",
                    r.name
                )));
            }
        }
        let mut replicas = Vec::with_capacity(nodes.len());
        for (i, spec) in nodes.iter().enumerate() {
            if nodes[..i].iter().any(|n| n.id == spec.id) {
                return Err(ReplicaSetError::DuplicateNode(spec.id.clone()));
            }
            let Some(r) = regions.iter().position(|r| r.name == spec.region) else {
                return Err(ReplicaSetError::UnknownRegion {
                    node: spec.id.clone(),
                    region: spec.region.clone(),
                });
            };
            if spec.weight.is_some_and(|w| w > MAX_WEIGHT) {
                return Err(ReplicaSetError::InvalidWeight(format!(
                    "cluster.node[{}].weight",
                    spec.id
                )));
            }
            if spec.weight != REMOVED {
                regions[r].nodes.push(NodeIdx(i as u16));
            }
            replicas.push(Replica {
                id: spec.id.clone(),
                region: RegionIdx(r as u16),
                weight: 0,
                given: spec.weight,
            });
        }
        if let Some(r) = regions.iter().find(|r| r.nodes.is_empty()) {
            return Err(ReplicaSetError::EmptyRegion(r.name.clone()));
        }
        // Exact rational shares in integers: a node's weight is its region's weight times its
        // weight inside the region, scaled by the least common multiple of the regions' node
        // weight sums so that every division is exact.
        let region_sums: Vec<u128> = regions
            .iter()
            .map(|r| {
                r.nodes
                    .iter()
                    .map(|n| u128::from(nodes[n.0 as usize].weight.unwrap_or(1)))
                    .sum()
            })
            .collect();
        let mut scale = 1u128;
        for &s in &region_sums {
            scale = lcm(scale, s).ok_or(ReplicaSetError::TooLarge)?;
        }
        for (ri, r) in regions.iter().enumerate() {
            for n in &r.nodes {
                let nw = u128::from(nodes[n.0 as usize].weight.unwrap_or(1));
                let w = r
                    .weight
                    .checked_mul(nw)
                    .and_then(|x| x.checked_mul(scale / region_sums[ri]));
                replicas[n.0 as usize].weight = w.ok_or(ReplicaSetError::TooLarge)?;
            }
        }
        let total_weight = replicas.iter().map(|r| r.weight).sum();
        let share = |w: u128| w as f64 / total_weight as f64;
        let node_shares: Vec<f64> = replicas.iter().map(|r| share(r.weight)).collect();
        let region_shares = regions
            .iter()
            .map(|r| share(r.nodes.iter().map(|n| replicas[n.0 as usize].weight).sum()))
            .collect();
        let mut set = ReplicaSet {
            nodes: replicas,
            regions,
            total_weight,
            digest: 0,
            region_shares,
            node_shares,
            floors: Vec::new(),
        };
        set.digest = set.compute_digest();
        Ok(set)
    }

    /// The list as the configuration gives it: region weights (sorted by name) and the nodes
    /// in order. `ReplicaSet::new` of it is this list again (without floors).
    pub fn specs(&self) -> (Vec<(String, u32)>, Vec<ReplicaSpec>) {
        let regions = self
            .regions
            .iter()
            .map(|r| (r.name.clone(), r.weight as u32))
            .collect();
        let nodes = self
            .nodes
            .iter()
            .map(|n| ReplicaSpec {
                id: n.id.clone(),
                region: self.regions[n.region.0 as usize].name.clone(),
                weight: n.given,
            })
            .collect();
        (regions, nodes)
    }

    /// This list, bounded by `floors` while a membership change settles: every node's share
    /// of every limit ([`split`](ReplicaSet::split), [`node_share`](ReplicaSet::node_share))
    /// becomes the smallest of its share under this list and under each floor (0 under a
    /// floor that does not hold it or holds it removed). Ids, regions, rings and the digest
    /// stay this list's. Nodes are matched by id, so a floor need not share positions.
    pub fn with_floors(&self, floors: &[ReplicaSet]) -> ReplicaSet {
        let mut set = self.without_floors();
        set.floors = floors
            .iter()
            .map(|f| Floor {
                set: f.without_floors(),
                position: self
                    .nodes
                    .iter()
                    .map(|n| f.node_by_id(&n.id).map(|i| usize::from(i.0)))
                    .collect(),
            })
            .collect();
        for (i, share) in set.node_shares.iter_mut().enumerate() {
            for f in &set.floors {
                *share = share.min(f.position[i].map_or(0.0, |p| f.set.node_shares[p]));
            }
        }
        for (r, region) in set.regions.iter().enumerate() {
            set.region_shares[r] = region
                .nodes
                .iter()
                .map(|n| set.node_shares[usize::from(n.0)])
                .sum();
        }
        set
    }

    /// This list without floors.
    pub fn without_floors(&self) -> ReplicaSet {
        ReplicaSet::new(&self.specs().0, &self.specs().1)
            .expect("a replica set's own specs make the same set")
    }

    /// This list (without floors) with every removed node back, at the weight `weight_of`
    /// gives it (`None`: its region's even weight): the list before its removals, as far as
    /// this list tells. A node that starts binds its shares no higher than under it, as a
    /// running node does when a removal reaches it (docs/membership.md, "What a removed
    /// node held"): every other node's share under it is no larger than
    /// under this list, and the removed node's part goes to its heir only by what it left.
    pub fn before_removals(&self, weight_of: impl Fn(NodeIdx) -> Option<u32>) -> ReplicaSet {
        let (regions, nodes) = self.specs();
        let revive = |weight: &dyn Fn(NodeIdx) -> Option<u32>| {
            let nodes: Vec<ReplicaSpec> = nodes
                .iter()
                .enumerate()
                .map(|(i, spec)| ReplicaSpec {
                    weight: if spec.weight == REMOVED {
                        weight(NodeIdx(i as u16)).filter(|w| (1..=MAX_WEIGHT).contains(w))
                    } else {
                        spec.weight
                    },
                    ..spec.clone()
                })
                .collect();
            ReplicaSet::new(&regions, &nodes)
        };
        // Weights that no list could hold (too large a common multiple) count as even.
        revive(&weight_of)
            .or_else(|_| revive(&|_| None))
            .expect("a listed node's region has a weight, and even weights always fit")
    }

    /// Whether any node of the list is removed.
    pub fn has_removed(&self) -> bool {
        self.nodes.iter().any(|n| n.given == REMOVED)
    }

    /// Whether any floor bounds this list's shares ([`with_floors`](ReplicaSet::with_floors)).
    pub fn is_bounded(&self) -> bool {
        !self.floors.is_empty()
    }

    /// Checks that `next` may replace this list while the cluster runs: positions never
    /// move, so every node of this list keeps its place, id and region in `next` (a removed
    /// one stays removed), and new nodes come after them. The error names the entry.
    pub fn check_successor(&self, next: &ReplicaSet) -> Result<(), ReplicaSetError> {
        let refuse = |m: String| Err(ReplicaSetError::NotASuccessor(m));
        for (i, old) in self.nodes.iter().enumerate() {
            let Some(new) = next.nodes.get(i) else {
                return refuse(format!(
                    "cluster.node[{i}]: {:?} is missing from the new list: a node keeps its entry once listed (mark it `removed = true`; positions never move)",
                    old.id
                ));
            };
            if new.id != old.id {
                return refuse(format!(
                    "cluster.node[{i}]: was {:?}, is now {:?}: nodes keep their places (append new nodes at the end, mark removed ones `removed = true`)",
                    old.id, new.id
                ));
            }
            let (was, is) = (
                &self.regions[old.region.0 as usize].name,
                &next.regions[new.region.0 as usize].name,
            );
            if was != is {
                return refuse(format!(
                    "cluster.node[{i}].region: {:?} was in {was:?}, is now in {is:?}: a node cannot change regions (remove it and add a node with a new id)",
                    old.id
                ));
            }
            if old.given == REMOVED && new.given != REMOVED {
                return refuse(format!(
                    "cluster.node[{i}]: {:?} was removed and cannot come back (add it under a new id)",
                    old.id
                ));
            }
        }
        Ok(())
    }

    /// Number of positions in the list, removed nodes included: every index below it names a
    /// node. It only grows ([`check_successor`](ReplicaSet::check_successor)), so it serves as
    /// the list's version.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether the node was removed (a tombstone: no share, no keys, never dialled).
    pub fn is_removed(&self, node: NodeIdx) -> bool {
        self.nodes
            .get(usize::from(node.0))
            .is_none_or(|n| n.given == REMOVED)
    }

    /// Always false: a replica set has at least one node.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Number of regions.
    pub fn region_count(&self) -> usize {
        self.regions.len()
    }

    /// The index of the node with this id.
    pub fn node_by_id(&self, id: &str) -> Option<NodeIdx> {
        self.nodes
            .iter()
            .position(|n| n.id == id)
            .map(|i| NodeIdx(i as u16))
    }

    /// The index of the region with this name.
    pub fn region_by_name(&self, name: &str) -> Option<RegionIdx> {
        self.regions
            .iter()
            .position(|r| r.name == name)
            .map(|i| RegionIdx(i as u16))
    }

    /// A node's id.
    pub fn node_id(&self, node: NodeIdx) -> &str {
        &self.nodes[node.0 as usize].id
    }

    /// A node's region.
    #[inline]
    pub fn region_of(&self, node: NodeIdx) -> RegionIdx {
        self.nodes[node.0 as usize].region
    }

    /// A region's name.
    pub fn region_name(&self, region: RegionIdx) -> &str {
        &self.regions[region.0 as usize].name
    }

    /// The nodes of a region, in agreed order.
    pub fn region_nodes(&self, region: RegionIdx) -> &[NodeIdx] {
        &self.regions[region.0 as usize].nodes
    }

    /// Every node that is not removed, in list order.
    pub fn nodes(&self) -> impl Iterator<Item = NodeIdx> + '_ {
        self.positions().filter(|&n| !self.is_removed(n))
    }

    /// Every position, removed nodes included.
    pub fn positions(&self) -> impl ExactSizeIterator<Item = NodeIdx> + '_ {
        (0..self.nodes.len()).map(|i| NodeIdx(i as u16))
    }

    /// Every region index.
    pub fn regions(&self) -> impl ExactSizeIterator<Item = RegionIdx> + '_ {
        (0..self.regions.len()).map(|i| RegionIdx(i as u16))
    }

    /// A region's static share of every limit, as a fraction.
    #[inline]
    pub fn region_share(&self, region: RegionIdx) -> f64 {
        self.region_shares[region.0 as usize]
    }

    /// A node's static share of every limit, as a fraction.
    #[inline]
    pub fn node_share(&self, node: NodeIdx) -> f64 {
        self.node_shares[node.0 as usize]
    }

    /// Splits an integer `amount` among all nodes by weight so that the parts sum exactly to
    /// `amount`, by the largest-remainder method with ties broken by node order (a removed
    /// node's part is 0). The result is identical on every node holding the same list. With
    /// floors ([`with_floors`](ReplicaSet::with_floors)) each part is the smallest of this
    /// list's and the floors' parts for the same node, so the parts sum to at most `amount`.
    pub fn split(&self, amount: u64) -> Vec<u64> {
        let mut parts = self.own_split(amount);
        for f in &self.floors {
            let theirs = f.set.own_split(amount);
            for (i, part) in parts.iter_mut().enumerate() {
                *part = (*part).min(f.position[i].map_or(0, |p| theirs[p]));
            }
        }
        parts
    }

    fn own_split(&self, amount: u64) -> Vec<u64> {
        let total = self.total_weight;
        let amount128 = u128::from(amount);
        let mut parts: Vec<u64> = Vec::with_capacity(self.nodes.len());
        let mut remainders: Vec<(u128, usize)> = Vec::with_capacity(self.nodes.len());
        let mut given: u64 = 0;
        for (i, n) in self.nodes.iter().enumerate() {
            let num = amount128 * n.weight;
            let part = (num / total) as u64;
            parts.push(part);
            given += part;
            remainders.push((num % total, i));
        }
        // Largest remainder first; among equal remainders the lower index wins.
        remainders.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        for &(_, i) in remainders.iter().take((amount - given) as usize) {
            parts[i] += 1;
        }
        parts
    }

    /// A digest of the list (ids, regions and weights in order). Peers compare it on connect:
    /// two nodes with different lists must not exchange counters.
    pub fn digest(&self) -> u64 {
        self.digest
    }

    fn compute_digest(&self) -> u64 {
        // Every field is followed by a 0xff byte, which no UTF-8 id or region name holds, so
        // that moving bytes from one field to the next changes the digest.
        let mut h = Fnv1a::new();
        let mut feed = |bytes: &[u8]| {
            h.write(bytes);
            h.write(&[0xff]);
        };
        for n in &self.nodes {
            feed(n.id.as_bytes());
            feed(self.regions[n.region.0 as usize].name.as_bytes());
            feed(&n.weight.to_le_bytes());
        }
        h.finish()
    }
}

fn gcd(mut a: u128, mut b: u128) -> u128 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

fn lcm(a: u128, b: u128) -> Option<u128> {
    (a / gcd(a, b)).checked_mul(b).filter(|&l| l < 1 << 32)
}

#[cfg(test)]
#[path = "replica_tests.rs"]
mod tests;
