//! What a decision says, and the context a node decides in.

use serde::Serialize;

use crate::replica::{NodeIdx, RegionMask, ReplicaSet};
use crate::rule::RuleMode;
use crate::time::Millis;

/// What a node knows of the cluster when it decides: given by the cluster layer, read by the
/// core. A single node on its own uses [`ClusterView::alone`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ClusterView {
    /// Regions not heard from within `suspect_after`.
    pub unreachable: RegionMask,
    /// This node is not the key's owner and decides alone because the owner is unreachable.
    pub acting_alone: bool,
    /// This node has (re)started and not yet pulled the cluster's state (it may not know
    /// what it consumed or gave away before), or a list in play removes it: it admits
    /// nothing.
    pub recovering: bool,
    /// This node (re)started with nothing on disk (no `node.data_dir`) and gave up waiting
    /// for its peers' state while none was reachable: what it admitted and gave away before, in
    /// windows that may still count, is unknown. Set to the time it started; until a peer's
    /// whole state reaches it, it admits nothing of a rule before the time a share that
    /// changed then could grow ([`crate::Algorithm::shares_may_grow_at`]: a fixed window's
    /// or a quota's window after next, a token bucket's refill).
    pub blind_since: Option<Millis>,
}

impl ClusterView {
    /// The view of a node with no peers.
    pub const fn alone() -> ClusterView {
        ClusterView {
            unreachable: RegionMask::EMPTY,
            acting_alone: false,
            recovering: false,
            blind_since: None,
        }
    }

    /// Whether decisions are made under a conservative cap.
    #[inline]
    pub fn degraded(&self) -> bool {
        self.acting_alone
            || self.recovering
            || self.blind_since.is_some()
            || !self.unreachable.is_empty()
    }
}

/// Everything a decision depends on besides the key's state: who decides, when, and what it
/// knows of the cluster.
#[derive(Debug, Clone, Copy)]
pub struct DecideCtx<'a> {
    /// The time of the decision (ms since the Unix epoch).
    pub now: Millis,
    /// The deciding node.
    pub me: NodeIdx,
    /// The agreed replica set.
    pub replicas: &'a ReplicaSet,
    /// The cluster as this node sees it.
    pub view: ClusterView,
}

/// The answer to one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Decision {
    /// What the caller is told: for a shadow rule always true.
    pub allowed: bool,
    /// What the algorithm decided.
    pub would_allow: bool,
    /// The rule's global limit: tokens per window, or bucket capacity.
    pub limit: u64,
    /// Tokens this caller can still take now, as far as this node knows.
    pub remaining: u64,
    /// Milliseconds until `remaining` is back to `limit` if nothing more is taken.
    pub reset_after_ms: u64,
    /// When denied: milliseconds after which the same request would succeed if nothing else
    /// happened. Zero when allowed.
    pub retry_after_ms: u64,
    /// Enforce or shadow.
    pub mode: RuleMode,
    /// Decided under a conservative cap because peers or regions were unreachable.
    pub degraded: bool,
    /// A leaky bucket's shaping: milliseconds the caller waits before it proceeds (0 when it
    /// may proceed now, and for every other algorithm, denial and shadow rule).
    pub delay_ms: u64,
}

/// The answer to an atomic call over several rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllDecision {
    /// Whether every rule allowed; nothing was consumed otherwise.
    pub allowed: bool,
    /// The index of the binding rule: the first that denied, else the one with the least
    /// remaining.
    pub binding: usize,
    /// One decision per rule, in order.
    pub results: Vec<Decision>,
}

/// A key's usage as this node sees it, for `/v1/usage`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Usage {
    /// The global limit.
    pub limit: u64,
    /// Tokens used in the current window (weighted for sliding windows; the bucket's deficit
    /// for a token bucket).
    pub used: u64,
    /// `limit - used`, never negative.
    pub remaining: u64,
    /// Milliseconds until usage is back to zero if nothing more is taken.
    pub reset_after_ms: u64,
    /// Usage per region, by region index.
    pub regions: Vec<u64>,
}
