//! # levee-core
//!
//! The pure heart of Levee: rules and their algorithms, region-aware CRDT counters, global
//! limits held by escrow (every node spends only the rights it holds), and decisions. No I/O, no clock, no async runtime:
//! every function that needs the time takes `now` (milliseconds since the Unix epoch) as an
//! argument, so the same code runs in a node, in the deterministic simulator and in tests.
//!
//! ## A tour
//!
//! * [`rule`]: [`RuleSpec`] as a configuration writes it, validated into a [`Rule`].
//! * [`replica`]: the agreed node list ([`ReplicaSet`]), shares, and integer splits.
//! * [`crdt`]: the replicated state of a key ([`KeyCrdt`]) and its lattice join.
//! * [`state`]: [`KeyState`], which decides, refunds, merges deltas and extracts them.
//! * [`escrow`]: strict mode's rebalancing of spare rights toward demand.
//! * [`decision`]: what a decision says and the context it is made in.
//! * [`overrides`]: per-key overrides, allow and deny lists, and their replicated register.
//! * [`hash`]: the one stable hash (FNV-1a), for whatever every node must compute alike.
//!
//! ```
//! use levee_core::{ClusterView, DecideCtx, KeyState, NodeIdx, ReplicaSet, RuleSpec};
//!
//! let spec = RuleSpec::fixed_window("api", 2, 1_000);
//! let mut rule = spec.validate().unwrap();
//! let replicas = ReplicaSet::single("n1", "eu");
//! rule.bind(&replicas);
//! let ctx = DecideCtx { now: 1_000, me: NodeIdx(0), replicas: &replicas, view: ClusterView::alone() };
//! let target = rule.target(None, 1).unwrap();
//! let mut key = KeyState::new();
//! assert!(key.decide(&target, rule.mode, 1, false, &ctx).allowed);
//! assert!(key.decide(&target, rule.mode, 1, false, &ctx).allowed);
//! let denied = key.decide(&target, rule.mode, 1, false, &ctx);
//! assert!(!denied.allowed);
//! assert_eq!(denied.retry_after_ms, 1_000);
//! ```

pub mod calendar;
pub mod crdt;
pub mod decision;
mod demand;
pub mod escrow;
pub mod forecast;
pub mod hash;
pub mod overrides;
pub mod replica;
mod rights;
pub mod rule;
pub mod state;
pub mod time;

pub use crdt::{KeyCrdt, Lattice};
pub use decision::{AllDecision, ClusterView, DecideCtx, Decision, Usage};
pub use escrow::{PeerClock, RebalanceCtx};
pub use overrides::{Effect, OverrideReg, OverrideValue};
pub use replica::{
    MAX_NODES, MAX_REGIONS, NodeIdx, REMOVED, RegionIdx, RegionMask, ReplicaSet, ReplicaSetError,
    ReplicaSpec,
};
pub use rule::{Algorithm, CheckError, Rule, RuleError, RuleMode, RuleSpec, Target};
pub use state::{KeyState, Listing, MergeError, Merged, RIGHTS_RETRY_MS, decide_all};
pub use time::{HumanDuration, Millis};
