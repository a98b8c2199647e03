//! What the state machine reports to its driver ([`crate::Cluster::poll_event`]).

use levee_core::{ClusterView, Millis, NodeIdx, RegionIdx};
use levee_proto::{ForwardCheck, ForwardDecision};

/// Correlates a forwarded batch of checks with its answer.
pub type ForwardId = u64;

/// Something that changed, or something the driver must act on.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A peer was heard from again (or for the first time).
    PeerUp(NodeIdx),
    /// A peer was not heard from within `suspect_after`.
    PeerDown(NodeIdx),
    /// A region had no reachable node and now has one.
    RegionReachable(RegionIdx),
    /// No node of a region is reachable any more.
    RegionUnreachable(RegionIdx),
    /// This node has pulled the cluster's state (or found nobody to pull from): it may be
    /// marked ready. Reported once per [`crate::Cluster::new`].
    Synced,
    /// The list decisions spend by changed ([`crate::Cluster::spending`]) to this one: a
    /// membership change was made here or reported by a peer, or agreed. The driver binds its
    /// rules to every such list in order, then to the machine's current one (events may be
    /// dispatched out of order): a share that shrank and grew again within one batch of
    /// events must be seen to grow, so that the growth waits
    /// (`levee_core::Rule::bind_no_higher`).
    SharesChanged(levee_core::ReplicaSet),
    /// This node started, and these lists were run before its own (what it heard answering
    /// its pull, `Message::ListsBefore`), each with when it stopped being run (this node's
    /// clock), oldest first: hold every rule's shares no higher than under those whose change
    /// may still count (`levee_core::Rule::held_by_lists_before`), so that a share that grew
    /// with a change made while this node was down waits as a running node's does. Reported
    /// once, just before [`Event::Synced`], when there are any.
    ListsBefore(Vec<(levee_core::ReplicaSet, Millis)>),
    /// This node has merged every peer's whole state since these nodes were removed
    /// (`machine/heirs.rs`): what it takes over of their rights may count now
    /// (`levee_core::Rule::settle_bequests`). Only theirs: a node removed since has a pull of
    /// its own under way.
    BequestsSettled(Vec<NodeIdx>),
    /// What decisions should assume about the cluster changed; the driver hands the new view
    /// to its decision path. Reported at most once per `handle_*` call.
    ViewChanged(ClusterView),
    /// A region-mate forwarded checks to this node as their keys' owner: decide them in
    /// order and answer with [`crate::Cluster::answer_forward`].
    ForwardReceived {
        /// The forwarder.
        from: NodeIdx,
        /// To be echoed in the answer.
        id: ForwardId,
        /// The checks.
        checks: Vec<ForwardCheck>,
    },
    /// The owner answered a batch this node forwarded: one decision per check, in order
    /// (`None` where the owner could not decide: decide that one alone).
    ForwardAnswered {
        /// The batch, as returned by [`crate::Cluster::forward`].
        id: ForwardId,
        /// The owner's decisions.
        decisions: Vec<Option<ForwardDecision>>,
    },
    /// No well-formed answer came within `forward_timeout`: decide the batch's checks alone.
    ForwardFailed {
        /// The batch, as returned by [`crate::Cluster::forward`].
        id: ForwardId,
    },
}
