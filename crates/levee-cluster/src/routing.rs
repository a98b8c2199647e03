//! Who decides a key: the routing rule, in one place for the node and the simulator.
//!
//! Inside a region every key has one owner, chosen by consistent hashing of the key's own
//! bytes among the nodes believed reachable ([`crate::ring`]). A check arriving at its
//! owner is decided there; at another node it is forwarded to the owner
//! ([`crate::Cluster::forward`]); when the owner is not reachable, or does not answer within
//! `forward_timeout` ([`crate::Event::ForwardFailed`]), the receiving node decides alone,
//! under its own conservative cap, and says so (`acting_alone`, `degraded: true`).

use levee_core::NodeIdx;

/// Where a check of a key is decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// This node owns the key: decide here.
    Local,
    /// Another node of this region owns the key and is reachable: forward the check to it.
    Owner(NodeIdx),
    /// The owner is not reachable: decide here, alone, under the conservative cap.
    Alone,
}

/// The key part of a stored identity (`rule \0 bucket key`): owners are chosen by the key's
/// own bytes, so every rule's state of one key lives on the same node.
pub fn key_of(id: &[u8]) -> &[u8] {
    match id.iter().position(|&b| b == 0) {
        Some(z) if id.len() >= z + 2 => &id[z + 2..],
        _ => id,
    }
}
