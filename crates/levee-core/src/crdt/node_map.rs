//! Per-node entries of a lattice, sparse and sorted by node.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use smallvec::SmallVec;

use crate::replica::NodeIdx;

use super::lattice::Lattice;

/// Sparse per-node entries, sorted by node: only nodes that ever wrote have an entry.
///
/// The first entry is held inline: most keys have one writer (the node that decides for
/// them), and a key's state then needs no allocation of its own for it. On the wire it is a
/// plain sequence, as a `Vec` is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeMap<V> {
    entries: SmallVec<[(NodeIdx, V); 1]>,
}

impl<V> Default for NodeMap<V> {
    fn default() -> Self {
        NodeMap {
            entries: SmallVec::new(),
        }
    }
}

impl<V: Serialize> Serialize for NodeMap<V> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.entries.as_slice().serialize(s)
    }
}

impl<'de, V: Deserialize<'de>> Deserialize<'de> for NodeMap<V> {
    /// Decoded through `Vec`, whose decoder does not trust a sequence's announced length for
    /// its first allocation (untrusted input may announce any length).
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let entries = Vec::<(NodeIdx, V)>::deserialize(d)?;
        Ok(NodeMap {
            entries: SmallVec::from_vec(entries),
        })
    }
}

impl<V: Lattice + Default + Clone> NodeMap<V> {
    /// The entry of `node`, if any.
    #[inline]
    pub fn get(&self, node: NodeIdx) -> Option<&V> {
        self.entries
            .iter()
            .find(|(n, _)| *n == node)
            .map(|(_, v)| v)
    }

    /// The entry of `node`, created empty if missing.
    #[inline]
    pub fn entry(&mut self, node: NodeIdx) -> &mut V {
        let pos = match self.entries.binary_search_by_key(&node, |(n, _)| *n) {
            Ok(i) => i,
            Err(i) => {
                // Grow one entry at a time: most keys have one or a few writers, and the
                // default doubling would reserve four.
                self.entries.reserve_exact(1);
                self.entries.insert(i, (node, V::default()));
                i
            }
        };
        &mut self.entries[pos].1
    }

    /// Every entry, by node.
    pub fn iter(&self) -> impl Iterator<Item = (NodeIdx, &V)> {
        self.entries.iter().map(|(n, v)| (*n, v))
    }

    /// Number of nodes with an entry.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no node has an entry.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

impl<V: Lattice + Default + Clone> Lattice for NodeMap<V> {
    fn join(&mut self, other: &NodeMap<V>) -> bool {
        let mut changed = false;
        for (n, v) in &other.entries {
            changed |= self.entry(*n).join(v);
        }
        changed
    }
}
