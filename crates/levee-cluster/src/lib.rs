//! # levee-cluster
//!
//! The replication protocol as a state machine: no I/O, no clock, no runtime. Messages and
//! `now` go in; messages to send, events and the next wake-up time come out.
//!
//! ## Call order
//!
//! * [`Cluster::new`] at start: it queues a full pull from every peer (join or restart).
//! * [`Cluster::handle_message`] for every message received (after the transport checked the
//!   peer's certificate and the frame).
//! * [`Cluster::handle_timeout`] when [`Cluster::poll_timeout`] has come: at the end of every
//!   gossip interval failure detection, rebalancing of spare rights, delta gossip (coalesced
//!   per key, batched per destination, an empty batch to a peer that would get nothing),
//!   paced full states and now and then an anti-entropy digest; at a forwarded batch's
//!   deadline, its failure.
//! * On the request path: [`Cluster::route`] says where a check is decided; a check for a
//!   region-mate goes out with [`Cluster::forward`]; [`Cluster::answer_forward`] answers a
//!   forwarded batch.
//! * After each of those calls, drain [`Cluster::poll_transmit`] (hand every message to the
//!   transport; the machine never waits for an answer) and [`Cluster::poll_event`] (peers and
//!   regions up and down, [`Event::ViewChanged`] with what decisions should now assume,
//!   [`Event::Synced`], forwarded checks to decide and answers to forwards), then sleep until
//!   [`Cluster::poll_timeout`] or the next message.
//!
//! The key states live outside the machine, behind [`KeyStates`], so that a node keeps them
//! in its concurrent store and the simulator in a plain map.
//!
//! ## Files
//!
//! | file | what |
//! |---|---|
//! | `machine/mod.rs` | [`Cluster`]: the state machine, its configuration, call order and request path |
//! | `machine/receive.rs` | what a message from a peer does |
//! | `machine/gossip.rs` | the end of a gossip interval: deltas, repeats, rebalancing, anti-entropy |
//! | `routing.rs` | [`Route`]: who decides a key (owner, forwarded, or alone) |
//! | `event.rs` | [`Event`]: what the machine reports to its driver |
//! | `peer.rs` | one peer's link: acknowledgements, the paced queue of full states |
//! | `recent.rs` | the keys sent recently, for catch-ups after a silence |
//! | `forward.rs` | forwarded batches waiting for their owner's answer |
//! | `digest.rs` | the anti-entropy digest: buckets, fingerprints |
//! | `machine/topology.rs` | [`Topology`]: whom a node gossips with; gateways, relays, `Heard` |
//! | `membership.rs` | failure detection: who is reachable |
//! | `lists.rs` | live membership: the lists in play and the shares spent while they differ |
//! | `ring.rs` | consistent hashing of keys to owners inside a region |
//! | `store.rs` | [`KeyStates`]: what the machine asks of a key store |
//! | `memory.rs` | [`memory::MemoryStates`]: the key store of tests and the simulator |
//!
//! ## What it guarantees
//!
//! Deltas carry absolute values of the sender's own entries, so loss, duplication and
//! reordering are harmless and any later delta repairs an earlier loss. Every peer a node
//! gossips with ([`Topology`]: every peer, or region-mates and one gateway per other region)
//! hears from it every `gossip_interval` (an empty batch if nothing changed), and every batch
//! acknowledges the latest batch received from its destination (`ack_ms`). A node pushes a
//! peer the keys it sent since the peer's last acknowledgement as soon as the peer is heard
//! again, or hears us again (its acknowledgements jump), and while the peer does not hear us
//! it repeats the few keys it misses every interval: after a partition heals, every view of a
//! key agrees within two gossip intervals plus one round trip when nothing is lost after the
//! heal. Full states (pull answers, repairs, catch-ups) are paced per peer
//! ([`PUSH_KEYS_PER_TICK`]). Keys that go quiet after a loss are repaired by anti-entropy:
//! every `anti_entropy_interval` a node sends one peer that keeps up (round robin) a digest
//! of its keys in 256 buckets, which the store keeps incrementally ([`Fingerprints`]); the
//! peer pushes its keys of up to [`MAX_REPAIR_BUCKETS`] buckets that differ and asks for the
//! sender's. Every key reaches every node (directly, or relayed by a gateway of the node's
//! region), so every node's view of a key converges, not only the owners'. A forwarded batch is answered by its owner or, after
//! `forward_timeout`, reported failed: a check never waits longer than that for another node.

mod digest;
mod event;
mod forward;
mod lists;
mod machine;
pub mod membership;
pub mod memory;
mod peer;
mod recent;
pub mod ring;
mod routing;
mod store;

pub use digest::{
    DIGEST_BUCKETS, DigestBuckets, Fingerprints, MAX_BUSY_ROUNDS, bucket_of, digest_message,
    key_fingerprint, key_hash,
};
pub use event::{Event, ForwardId};
pub use forward::{GIVE_BACK_MARGIN_MS, give_back_is_safe};
pub use lists::{Lists, MAX_UNAGREED, PeerState, Report};
pub use machine::{
    Cluster, ClusterConfig, MAX_IN_FLIGHT_FRACTION, MAX_KEYS_BEHIND, MAX_REPAIR_BUCKETS,
    PeerStatus, Topology, override_hash,
};
pub use peer::{MAX_KEYS_PER_MESSAGE, Outgoing, PUSH_KEYS_PER_TICK};
pub use recent::MAX_RECENT_KEYS;
pub use routing::{Route, Router, Routes, key_of};
pub use store::{KeyStates, Refused};
