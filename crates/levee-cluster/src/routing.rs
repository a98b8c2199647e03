//! Who decides a key: the routing rule, in one place for the node and the simulator.
//!
//! Inside a region every key has one owner, chosen by consistent hashing of the key's own
//! bytes among the nodes believed reachable ([`crate::ring`]). A check arriving at its
//! owner is decided there; at another node it is forwarded to the owner
//! ([`crate::Cluster::forward`]); when the owner is not reachable, or does not answer within
//! `forward_timeout` ([`crate::Event::ForwardFailed`]), the receiving node decides alone,
//! under its own conservative cap, and says so (`acting_alone`, `degraded: true`).

use std::sync::Arc;

use arc_swap::ArcSwap;
use levee_core::{NodeIdx, RegionIdx, ReplicaSet};

use crate::ring::Rings;

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

/// Who owns which key, as of the machine's last change of reachability or of the list: the
/// rings of the reachable nodes and of every node, and which nodes were reachable. The
/// machine rebuilds it whenever one of those changes ([`crate::Cluster`]), and publishes it
/// to [`Routes`], which the request path reads without the machine's lock.
pub struct Router {
    me: NodeIdx,
    /// This node's region, where its keys' owners are looked for first.
    region: RegionIdx,
    regions: usize,
    /// The rings of the nodes that are reachable and not leaving.
    rings: Rings,
    /// The rings of every node not leaving, reachable or not: a key's owner when every node
    /// is up.
    full_rings: Rings,
    /// By position: whether the node was reachable when the rings were built.
    reachable: Vec<bool>,
    /// Whether every node of this region that is not leaving is reachable: both rings of
    /// the region are then the same, and no key of it was taken over (the usual case, in
    /// which [`Router::taken_over_from`] answers without a second ring lookup).
    region_whole: bool,
}

impl Router {
    /// The rings of `replicas` for `me`: `reachable(n)` says whether node `n` is reachable,
    /// `leaving(n)` whether it leaves (it owns no key then).
    pub(crate) fn new(
        replicas: &ReplicaSet,
        me: NodeIdx,
        reachable: impl Fn(NodeIdx) -> bool,
        leaving: impl Fn(NodeIdx) -> bool,
    ) -> Router {
        let region = replicas.region_of(me);
        let region_whole = replicas
            .region_nodes(region)
            .iter()
            .all(|&n| n == me || leaving(n) || reachable(n));
        Router {
            me,
            region,
            regions: replicas.regions().len(),
            rings: Rings::new(replicas, |n| reachable(n) && !leaving(n)),
            full_rings: Rings::new(replicas, |n| !leaving(n)),
            reachable: replicas.positions().map(&reachable).collect(),
            region_whole,
        }
    }

    fn is_reachable(&self, n: NodeIdx) -> bool {
        n == self.me
            || self
                .reachable
                .get(usize::from(n.0))
                .copied()
                .unwrap_or(false)
    }

    /// The owner of `key` (a key's own bytes, see [`key_of`]): a reachable node of this
    /// node's region, or, if none is, of the first region that has one; this node if none.
    pub fn owner(&self, key: &[u8]) -> NodeIdx {
        self.rings
            .owner(self.region, key)
            .or_else(|| {
                (0..self.regions)
                    .map(|r| RegionIdx(r as u16))
                    .filter(|&r| r != self.region)
                    .find_map(|r| self.rings.owner(r, key))
            })
            .unwrap_or(self.me)
    }

    /// The key's owner when every node of this region is up, if that is another node and it
    /// is unreachable: the key's checks now come to another node of the region (this one,
    /// if [`Router::owner`] says so), which serves the demand the owner was serving.
    pub fn taken_over_from(&self, key: &[u8]) -> Option<NodeIdx> {
        if self.region_whole {
            return None;
        }
        let natural = self.full_rings.owner(self.region, key)?;
        (natural != self.me && !self.is_reachable(natural)).then_some(natural)
    }

    /// Where a check of `key` is decided. A key this node took over from an unreachable
    /// region-mate is decided here, alone: the owner's rights are out of reach, and the
    /// answer says so.
    pub fn route(&self, key: &[u8]) -> Route {
        let owner = self.owner(key);
        if owner == self.me {
            if self.taken_over_from(key).is_some() {
                Route::Alone
            } else {
                Route::Local
            }
        } else if self.is_reachable(owner) {
            Route::Owner(owner)
        } else {
            Route::Alone
        }
    }
}

/// The machine's current [`Router`], readable by any thread without the machine's lock:
/// what the request path routes by. A clone reads the same router.
#[derive(Clone)]
pub struct Routes(Arc<ArcSwap<Router>>);

impl Routes {
    pub(crate) fn new(router: Router) -> Routes {
        Routes(Arc::new(ArcSwap::from_pointee(router)))
    }

    pub(crate) fn set(&self, router: Router) {
        self.0.store(Arc::new(router));
    }

    /// The router in force.
    pub fn load(&self) -> arc_swap::Guard<Arc<Router>> {
        self.0.load()
    }

    /// Where a check of `key` is decided now ([`Router::route`]).
    pub fn route(&self, key: &[u8]) -> Route {
        self.0.load().route(key)
    }

    /// The owner of `key` now ([`Router::owner`]).
    pub fn owner(&self, key: &[u8]) -> NodeIdx {
        self.0.load().owner(key)
    }
}

impl std::fmt::Debug for Routes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Routes").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ring::tests::replicas;

    fn keys() -> impl Iterator<Item = Vec<u8>> {
        (0..300).map(|i| format!("tenant-{i}").into_bytes())
    }

    #[test]
    fn with_every_region_mate_reachable_no_key_is_taken_over() {
        let r = replicas();
        // us-1 (another region) unreachable does not matter to eu-1's keys.
        let router = Router::new(&r, NodeIdx(0), |n| n != NodeIdx(3), |_| false);
        for key in keys() {
            assert_eq!(router.taken_over_from(&key), None);
            let owner = router.owner(&key);
            let expected = if owner == NodeIdx(0) {
                Route::Local
            } else {
                Route::Owner(owner)
            };
            assert_eq!(router.route(&key), expected);
        }
    }

    #[test]
    fn an_unreachable_region_mate_s_keys_are_taken_over_and_no_others() {
        let r = replicas();
        let whole = Router::new(&r, NodeIdx(0), |_| true, |_| false);
        let cut = Router::new(&r, NodeIdx(0), |n| n != NodeIdx(1), |_| false);
        let (mut taken, mut kept) = (0, 0);
        for key in keys() {
            let natural = whole.owner(&key);
            if natural == NodeIdx(1) {
                taken += 1;
                assert_eq!(cut.taken_over_from(&key), Some(NodeIdx(1)));
                // eu-2's keys move to eu-1 or eu-3; eu-1 decides its part alone.
                let now = cut.owner(&key);
                assert_ne!(now, NodeIdx(1));
                let expected = if now == NodeIdx(0) {
                    Route::Alone
                } else {
                    Route::Owner(now)
                };
                assert_eq!(cut.route(&key), expected);
            } else {
                kept += 1;
                assert_eq!(cut.taken_over_from(&key), None);
                assert_eq!(cut.owner(&key), natural);
            }
        }
        assert!(taken > 50 && kept > 150, "taken {taken}, kept {kept}");
        // A region-mate that leaves owns nothing, so nothing is taken over from it.
        let leaving = Router::new(&r, NodeIdx(0), |n| n != NodeIdx(1), |n| n == NodeIdx(1));
        assert!(keys().all(|k| leaving.taken_over_from(&k).is_none()));
    }
}
