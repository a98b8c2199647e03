//! The node lists of a run: every version of `[[cluster.node]]` the operator publishes
//! while the run lasts (docs/membership.md).
//!
//! A list is a sequence of positions; a position's node keeps it for ever (positions never
//! move): a node added is appended, a node removed stays as a tombstone
//! ([`levee_core::REMOVED`]). The simulator's node `i` is position `i` of every list that has
//! it, so a node's index in the simulation is its `NodeIdx` in every machine that knows it.
//! The first list is the [`Topology`]'s; the others are drawn by [`crate::changes`].

use levee_core::{REMOVED, ReplicaSet, ReplicaSpec};

use crate::plan::Topology;

/// One position of a list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListEntry {
    /// The node's region (a plan region index).
    pub region: usize,
    /// Its weight inside the region: `None` even, [`REMOVED`] a tombstone.
    pub weight: Option<u32>,
}

impl ListEntry {
    /// Whether the entry is a tombstone.
    pub fn removed(self) -> bool {
        self.weight == REMOVED
    }
}

/// One version of the node list, with the region weights (which membership changes keep).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeList {
    /// Each region's weight, by plan region index.
    pub region_weights: Vec<u32>,
    /// Every position, tombstones included.
    pub entries: Vec<ListEntry>,
}

impl NodeList {
    /// The list a topology starts with: its nodes region by region, even weights.
    pub fn initial(topology: &Topology) -> NodeList {
        NodeList {
            region_weights: topology.weights.clone(),
            entries: topology
                .region_of()
                .into_iter()
                .map(|region| ListEntry {
                    region,
                    weight: None,
                })
                .collect(),
        }
    }

    /// Number of positions (the list's version, as production counts it).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the list has no position (never, for a valid list).
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether position `n` is in the list and not removed.
    pub fn is_live(&self, n: usize) -> bool {
        self.entries.get(n).is_some_and(|e| !e.removed())
    }

    /// The live positions of region `r`.
    pub fn live_in(&self, r: usize) -> Vec<usize> {
        (0..self.len())
            .filter(|&n| self.is_live(n) && self.entries[n].region == r)
            .collect()
    }

    /// Position `n`'s id: `r<region>-n<j>`, `j` its rank among the region's positions (so
    /// that the first list is exactly [`Topology::replica_set`], and an appended node has an
    /// id nobody had).
    pub fn id(&self, n: usize) -> String {
        let r = self.entries[n].region;
        let j = self.entries[..n].iter().filter(|e| e.region == r).count();
        format!("r{r}-n{j}")
    }

    /// The list as production builds it from the configuration.
    pub fn replica_set(&self) -> ReplicaSet {
        let weights: Vec<(String, u32)> = self
            .region_weights
            .iter()
            .enumerate()
            .map(|(r, &w)| (format!("r{r}"), w))
            .collect();
        let nodes: Vec<ReplicaSpec> = self
            .entries
            .iter()
            .enumerate()
            .map(|(n, e)| ReplicaSpec {
                id: self.id(n),
                region: format!("r{}", e.region),
                weight: e.weight,
            })
            .collect();
        ReplicaSet::new(&weights, &nodes).expect("plans build valid node lists")
    }

    /// `self` with a node appended in region `r`.
    pub fn with_added(&self, r: usize) -> NodeList {
        let mut next = self.clone();
        next.entries.push(ListEntry {
            region: r,
            weight: None,
        });
        next
    }

    /// `self` with position `n` removed (a tombstone).
    pub fn with_removed(&self, n: usize) -> NodeList {
        let mut next = self.clone();
        next.entries[n].weight = REMOVED;
        next
    }

    /// `self` with the weights of some live positions changed.
    pub fn with_weights(&self, weights: &[(usize, u32)]) -> NodeList {
        let mut next = self.clone();
        for &(n, w) in weights {
            next.entries[n].weight = Some(w);
        }
        next
    }

    /// Short text for reports: `r0:1 r0:x r1:3 …` (weight, `=` even, `x` removed).
    pub fn describe(&self) -> String {
        self.entries
            .iter()
            .map(|e| match e.weight {
                None => format!("r{}:=", e.region),
                REMOVED => format!("r{}:x", e.region),
                Some(w) => format!("r{}:{w}", e.region),
            })
            .collect::<Vec<_>>()
            .join(" ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use levee_core::NodeIdx;

    fn topology() -> Topology {
        Topology {
            nodes_per_region: vec![2, 1],
            weights: vec![1, 2],
            one_way_ms: vec![vec![1, 50], vec![50, 1]],
        }
    }

    #[test]
    fn the_first_list_is_the_topologys_and_changes_keep_every_position() {
        let t = topology();
        let first = NodeList::initial(&t);
        assert_eq!(first.replica_set(), t.replica_set());
        let grown = first.with_added(1);
        assert_eq!(grown.id(3), "r1-n1");
        let next = grown.with_removed(0).with_weights(&[(1, 3)]);
        first
            .replica_set()
            .check_successor(&next.replica_set())
            .unwrap();
        grown
            .replica_set()
            .check_successor(&next.replica_set())
            .unwrap();
        let set = next.replica_set();
        assert!(set.is_removed(NodeIdx(0)));
        assert_eq!(set.split(300)[0], 0);
        assert_eq!(next.live_in(0), vec![1]);
        assert_eq!(next.describe(), "r0:x r0:3 r1:= r1:=");
    }
}
