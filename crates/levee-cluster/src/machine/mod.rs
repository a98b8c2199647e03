//! The replication state machine of one node: [`Cluster`]. See the crate doc for the call
//! order and what it guarantees.

use std::collections::VecDeque;

use levee_core::{ClusterView, Millis, NodeIdx, ReplicaSet};
use levee_proto::{ForwardCheck, ForwardDecision, Message};

use crate::event::{Event, ForwardId};
use crate::forward::PendingForwards;
use crate::lists::{Lists, PeerState};
use crate::membership::{Change, Membership};
use crate::peer::{Outgoing, PeerLink};
use crate::recent::RecentlySent;
use crate::routing::{Route, Router, Routes};
use crate::store::KeyStates;

mod gossip;
mod heirs;
mod members;
mod overrides;
mod receive;
mod topology;

pub use overrides::override_hash;
pub use topology::Topology;

/// Most keys re-sent every interval to a peer that does not hear this node.
pub const MAX_KEYS_BEHIND: usize = 64;
/// Rights in flight to one peer are capped at this fraction of a key's capacity.
pub const MAX_IN_FLIGHT_FRACTION: f64 = 0.5;
/// Most digest buckets repaired in one anti-entropy round.
pub const MAX_REPAIR_BUCKETS: usize = 16;

/// Settings of the protocol.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// This node.
    pub me: NodeIdx,
    /// The replica list this node starts with (its configuration's).
    pub replicas: ReplicaSet,
    /// How often deltas are sent.
    pub gossip_interval: Millis,
    /// A peer not heard from within this is unreachable.
    pub suspect_after: Millis,
    /// How often a digest goes to one peer.
    pub anti_entropy_interval: Millis,
    /// How long a forwarded batch of checks may wait for its owner's answer before the
    /// driver is told to decide it alone ([`Event::ForwardFailed`]).
    pub forward_timeout: Millis,
    /// When the first gossip interval ends, after [`Cluster::new`]'s `now` (0: at once).
    /// Nodes started together can be given different phases so that they do not gossip in
    /// lockstep; the simulator uses it to replay its seeded phases.
    pub tick_phase: Millis,
    /// Who this node gossips with every interval.
    pub topology: Topology,
}

/// Reachability and sync state of one peer, for `/v1/cluster` and metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerStatus {
    /// The peer.
    pub node: NodeIdx,
    /// Heard from within `suspect_after`.
    pub reachable: bool,
    /// Milliseconds since last heard from.
    pub last_heard_ms_ago: Option<Millis>,
    /// Milliseconds since we sent the latest batch the peer says it has received (about
    /// one round trip plus an interval when it keeps up); `None` before its first ack, and
    /// for a peer this node does not gossip with (regional gossip).
    pub ack_lag_ms: Option<Millis>,
    /// Keys of full states (pulls, anti-entropy, catch-ups) waiting to be sent to it.
    pub backlog_keys: usize,
    /// Times its batches were found missing and asked for again ([`Message::Missed`]).
    pub batches_missed: u64,
    /// Keys queued for it by anti-entropy repairs, so far.
    pub repaired_keys: u64,
    /// Its clock minus this node's, in ms, as estimated from its batches (bounded to
    /// ±`max_clock_skew`, 500 ms); `None` before an exchange gave one, and for a peer this
    /// node does not gossip with (regional gossip).
    pub clock_offset_ms: Option<i64>,
    /// Its part in a membership change.
    pub state: PeerState,
}

/// The replication state machine of one node.
pub struct Cluster {
    /// `cfg.replicas` is the list decisions spend by: [`Lists::spending`].
    cfg: ClusterConfig,
    lists: Lists,
    /// While the list is not agreed, when this node next tells every peer the list it runs.
    next_membership: Millis,
    membership: Membership,
    /// Who owns which key, rebuilt whenever reachability or the list changes; the request
    /// path reads it without this machine's lock ([`Cluster::routes`]).
    routes: Routes,
    out: VecDeque<Outgoing>,
    events: VecDeque<Event>,
    /// The view last reported as [`Event::ViewChanged`].
    reported_view: ClusterView,
    /// Per peer, by node index: what was sent, heard and acknowledged.
    peer: Vec<PeerLink>,
    recent: RecentlySent,
    forwards: PendingForwards,
    next_tick: Millis,
    next_anti_entropy: Millis,
    /// When the keys listed for later (`levee_core::Listing::Later`) join a batch next if no
    /// interval's keys take them sooner: once per idle heartbeat.
    next_later: Millis,
    ae_cursor: usize,
    started: Millis,
    synced: bool,
    /// The peer whose full state this node pulled, and when: it is synced once it has also
    /// heard that peer's list ([`Cluster::sync_if_listed`]).
    pulled_from: Option<(NodeIdx, Millis)>,
    /// When the last pull was asked for (re-asked while not synced: answers can be lost).
    last_pull: Millis,
    /// The lists this node ran before its own, and while it started those its peers said
    /// they ran, each with when it stopped being run (this node's clock), oldest first: at
    /// most `MAX_FLOOR_LISTS`, the latest. Told to a peer that pulls (it may have restarted
    /// during a change: `Message::ListsBefore`, `Event::ListsBefore`).
    lists_before: Vec<(ReplicaSet, Millis)>,
    /// Synced with nobody to pull from while peers it gossips with were listed and none was
    /// reachable: its own state before the start is unknown (`ClusterView::blind_since`).
    /// Cleared by the first whole answer to a pull, asked again every `pull_retry` until then.
    blind: bool,
    /// The node keeps its counters on disk ([`Cluster::set_durable`]): never blind.
    durable: bool,
    /// The pull of every peer's state after a removal, under way (`heirs.rs`).
    heir_pull: Option<heirs::HeirPull>,
    refused: u64,
    /// Checks given back to their owners after late answers.
    given_back_late: u64,
    /// Late answers' admissions kept counted: a refund of them could have landed in a later
    /// window than theirs.
    withheld_late: u64,
    /// Rights this node gave away by rebalancing (strict mode), in tokens.
    rights_given: u64,
    /// `cluster.local_first`: this node decides, as a region-mate of a key's owner, the
    /// checks it holds rights for, so its own demand counts when it rebalances
    /// ([`Cluster::set_local_first`]).
    local_first: bool,
    /// Per-key overrides: when their digest next goes out (`overrides.rs`).
    overrides: overrides::OverrideSync,
    /// Regional gossip: gateways, who chose this node, keys to relay (`topology.rs`).
    gateways: topology::Gateways,
}

impl Cluster {
    /// A node that just started: it asks every peer for their full state.
    pub fn new(cfg: ClusterConfig, now: Millis) -> Cluster {
        let membership = Membership::new(&cfg.replicas, cfg.me, cfg.suspect_after);
        let lists = Lists::new(cfg.replicas.clone(), cfg.me);
        let me = cfg.me;
        let routes = Routes::new(Router::new(&cfg.replicas, me, |n| n == me, |_| false));
        let n = cfg.replicas.len();
        let mut c = Cluster {
            lists,
            next_membership: now + cfg.anti_entropy_interval,
            membership,
            routes,
            out: VecDeque::new(),
            events: VecDeque::new(),
            reported_view: ClusterView::alone(),
            peer: vec![PeerLink::default(); n],
            recent: RecentlySent::new(now),
            forwards: PendingForwards::default(),
            next_tick: now + cfg.tick_phase,
            next_anti_entropy: now + cfg.anti_entropy_interval,
            next_later: now,
            ae_cursor: 0,
            started: now,
            synced: n == 1,
            pulled_from: None,
            last_pull: now,
            lists_before: Vec::new(),
            blind: false,
            durable: false,
            heir_pull: None,
            refused: 0,
            given_back_late: 0,
            withheld_late: 0,
            rights_given: 0,
            local_first: false,
            overrides: overrides::OverrideSync::default(),
            gateways: topology::Gateways::default(),
            cfg,
        };
        if c.synced {
            c.events.push_back(Event::Synced);
        }
        c.pull_after_start(now);
        // The full state is pulled from the peers it gossips with (every peer in a mesh);
        // every peer hears its list.
        let links = c.links(now);
        for peer in c.peers() {
            if links.contains(&peer) {
                c.send(peer, Message::PullRequest, now);
            }
            c.send_list(peer, now);
        }
        c.reported_view = c.view();
        c.events.push_back(Event::ViewChanged(c.reported_view));
        c
    }

    /// Sets whether this node decides checks of keys a region-mate owns when it holds the
    /// rights for them (`cluster.local_first`; the node's decision path does that part):
    /// then its own demand for such keys counts when it rebalances, so it keeps the rights
    /// its forecast needs and gives the owner only the rest (as nodes of different regions
    /// do). Off by default: a region-mate gives the owner everything it does not use.
    pub fn set_local_first(&mut self, on: bool) {
        self.local_first = on;
    }

    /// Sets whether the node keeps its counters on disk (`node.data_dir`: a snapshot, restored
    /// before it serves). Such a node is never *blind* when it starts with no peer reachable:
    /// what it lost is what it admitted since its last snapshot (nothing, if it is new or
    /// stopped cleanly), as for a single node. One that is not knows nothing of its last
    /// process ([`ClusterView::blind_since`]). Call it before the first [`Cluster::handle_timeout`].
    pub fn set_durable(&mut self, on: bool) {
        self.durable = on;
    }

    /// This node.
    pub fn me(&self) -> NodeIdx {
        self.cfg.me
    }

    /// The list decisions spend by: this node's list, bounded while a membership change
    /// settles ([`Lists::spending`]).
    pub fn replicas(&self) -> &ReplicaSet {
        &self.cfg.replicas
    }

    /// The list decisions spend by (the same as [`Cluster::replicas`], owned).
    pub fn spending(&self) -> ReplicaSet {
        self.cfg.replicas.clone()
    }

    /// The lists in play: this node's, whether it is agreed, each peer's part.
    pub fn lists(&self) -> &Lists {
        &self.lists
    }

    /// The key rings again, after reachability or a node's leaving changed: a key's owner is
    /// a live node of its region, neither leaving nor (for [`Cluster::owner`]) unreachable.
    fn rebuild_rings(&mut self) {
        let (m, lists) = (&self.membership, &self.lists);
        self.routes.set(Router::new(
            &self.cfg.replicas,
            self.cfg.me,
            |n| m.is_reachable(n),
            |n| lists.is_leaving(n),
        ));
    }

    /// Who owns which key, as the machine last decided: a handle that reads the current
    /// [`Router`] without this machine's lock, so that checks are routed while the machine
    /// merges a batch or ends an interval.
    pub fn routes(&self) -> Routes {
        self.routes.clone()
    }

    /// Whether this node hears `peer` (heard from within `suspect_after`).
    pub fn hears(&self, peer: NodeIdx) -> bool {
        self.membership.is_reachable(peer)
    }

    fn peers(&self) -> Vec<NodeIdx> {
        self.cfg
            .replicas
            .nodes()
            .filter(|&n| n != self.cfg.me)
            .collect()
    }

    fn send(&mut self, to: NodeIdx, msg: Message, now: Millis) {
        self.send_stamped(to, msg, now, true);
    }

    /// [`Cluster::send`]; a batch of keys is followed by empty batches only if `trailing`
    /// ([`PeerLink::stamp`]).
    fn send_stamped(&mut self, to: NodeIdx, mut msg: Message, now: Millis, trailing: bool) {
        self.peer[usize::from(to.0)].stamp(&mut msg, now, trailing);
        self.out.push_back(Outgoing { to, msg });
    }

    /// The next message to send.
    pub fn poll_transmit(&mut self) -> Option<Outgoing> {
        self.out.pop_front()
    }

    /// The next thing that changed or that the driver must act on.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// When [`Cluster::handle_timeout`] must next be called: the end of the gossip interval,
    /// or a forwarded batch's deadline, whichever comes first.
    pub fn poll_timeout(&self) -> Millis {
        match self.forwards.next_deadline() {
            Some(t) => t.min(self.next_tick),
            None => self.next_tick,
        }
    }

    /// What decisions should assume about the cluster now.
    pub fn view(&self) -> ClusterView {
        ClusterView {
            unreachable: self.membership.unreachable_regions(&self.cfg.replicas),
            acting_alone: false,
            recovering: !self.synced || self.lists.removes_me(),
            blind_since: self.blind.then_some(self.started),
        }
    }

    fn report_view(&mut self) {
        let view = self.view();
        if view != self.reported_view {
            self.reported_view = view;
            self.events.push_back(Event::ViewChanged(view));
        }
    }

    /// Whether the node has pulled the cluster's state (or found nobody to pull from).
    pub fn is_synced(&self) -> bool {
        self.synced
    }

    /// The owner of a key in this node's region, among the nodes believed reachable and not
    /// leaving. A leaving node that is the last of its region: the key's owner in the first
    /// other region that has one (or itself, if none has).
    pub fn owner(&self, key: &[u8]) -> NodeIdx {
        self.routes.owner(key)
    }

    /// Where a check of `key` is decided ([`Router::route`]).
    pub fn route(&self, key: &[u8]) -> Route {
        self.routes.route(key)
    }

    /// The key's owner when every node of this region is up, if that is another node and it
    /// is unreachable ([`Router::taken_over_from`]).
    pub fn taken_over_from(&self, key: &[u8]) -> Option<NodeIdx> {
        self.routes.load().taken_over_from(key)
    }

    /// Frames or states refused so far.
    pub fn refused(&self) -> u64 {
        self.refused
    }

    /// Checks given back to their owner so far because its answer came after the batch had
    /// timed out and been decided here ([`crate::forward`]).
    pub fn given_back_late(&self) -> u64 {
        self.given_back_late
    }

    /// Admissions of late answers not given back, though nobody was told of them: their
    /// window might have ended before a refund reached the owner (a refund draws from the
    /// window it arrives in), so they stay counted — fewer admissions, never more.
    pub fn withheld_late(&self) -> u64 {
        self.withheld_late
    }

    /// Rights (tokens) this node has given to others by rebalancing so far (strict mode).
    pub fn rights_given(&self) -> u64 {
        self.rights_given
    }

    /// Every peer's status, removed ones included (their `state` is `Gone`).
    pub fn peers_status(&self, now: Millis) -> Vec<PeerStatus> {
        self.cfg
            .replicas
            .positions()
            .filter(|&n| n != self.cfg.me)
            .map(|node| {
                let p = &self.peer[usize::from(node.0)];
                PeerStatus {
                    node,
                    reachable: self.membership.is_reachable(node),
                    last_heard_ms_ago: self
                        .membership
                        .last_heard(node)
                        .map(|t| now.saturating_sub(t)),
                    // Only a peer this node gossips with acknowledges it (regional gossip).
                    ack_lag_ms: (p.acked_ms > 0 && self.gateways.links.contains(&node))
                        .then(|| now.saturating_sub(p.acked_ms)),
                    backlog_keys: p.backlog_keys(),
                    batches_missed: p.missed_asks,
                    repaired_keys: p.repaired_keys,
                    clock_offset_ms: self
                        .gateways
                        .links
                        .contains(&node)
                        .then(|| p.clock.get().map(|c| c.offset_ms))
                        .flatten(),
                    state: self.lists.state(node),
                }
            })
            .collect()
    }

    /// Sends `checks` to `owner` (a region-mate, see [`Cluster::route`]) to decide; the
    /// answer comes as [`Event::ForwardAnswered`] with the returned id, or
    /// [`Event::ForwardFailed`] after `forward_timeout`.
    pub fn forward(&mut self, owner: NodeIdx, checks: Vec<ForwardCheck>, now: Millis) -> ForwardId {
        let deadline = now + self.cfg.forward_timeout;
        let id = self.forwards.open(owner, &checks, now, deadline);
        if owner == self.cfg.me || usize::from(owner.0) >= self.cfg.replicas.len() {
            // Nobody to send it to: it fails at its deadline.
            return id;
        }
        self.send(owner, Message::Forward { id, checks }, now);
        id
    }

    /// Answers a batch of [`Event::ForwardReceived`] with one decision per check, in order.
    pub fn answer_forward(
        &mut self,
        to: NodeIdx,
        id: ForwardId,
        decisions: Vec<Option<ForwardDecision>>,
        now: Millis,
    ) {
        if to != self.cfg.me && usize::from(to.0) < self.cfg.replicas.len() {
            self.send(to, Message::ForwardReply { id, decisions }, now);
        }
    }

    fn apply(&mut self, changes: Vec<Change>) {
        if changes.is_empty() {
            return;
        }
        let before = self.reported_view.unreachable;
        for change in changes {
            let event = match change {
                Change::Up(n) => Event::PeerUp(n),
                Change::Down(n) => {
                    self.pass_on_last_words(n);
                    Event::PeerDown(n)
                }
            };
            self.events.push_back(event);
        }
        self.rebuild_rings();
        let after = self.membership.unreachable_regions(&self.cfg.replicas);
        for r in self.cfg.replicas.regions() {
            match (before.contains(r), after.contains(r)) {
                (true, false) => self.events.push_back(Event::RegionReachable(r)),
                (false, true) => self.events.push_back(Event::RegionUnreachable(r)),
                _ => {}
            }
        }
    }

    /// `down` went silent: the keys of its last batches (`PeerLink::last_words`) go, whole,
    /// to every other peer this node gossips with and hears. A node killed while it sent
    /// may have reached some peers and not others, and while its keys stay busy (a
    /// region-mate took them over) anti-entropy leaves them alone: the survivors' views of
    /// them would differ for seconds (`tests/cluster.rs`, kill -9 of a key's owner: 313
    /// against 314 for over 3 s).
    fn pass_on_last_words(&mut self, down: NodeIdx) {
        let words = std::mem::take(&mut self.peer[usize::from(down.0)].last_words);
        if words.is_empty() {
            return;
        }
        let ids: Vec<Vec<u8>> = words.into_iter().flatten().collect();
        let links = self.gateways.links.clone();
        for p in links {
            if p != down && self.membership.is_reachable(p) {
                self.peer[usize::from(p.0)].queue_states(ids.iter().cloned());
            }
        }
    }

    fn pull_retry(&self) -> Millis {
        (self.cfg.suspect_after / 2).max(self.cfg.gossip_interval)
    }

    /// A peer whose acknowledgements lag this far behind our sends does not hear us.
    fn deaf_after(&self) -> Millis {
        (self.cfg.suspect_after / 2).max(4 * self.cfg.gossip_interval)
    }

    /// The node is stopping: sends every peer, now, the deltas of what changed since the
    /// last interval instead of at the end of it, so its peers count its last decisions
    /// while it is down. Returns the time the flush was sent at: see
    /// [`Cluster::acknowledged_since`].
    pub fn flush(&mut self, now: Millis, store: &mut dyn KeyStates) -> Millis {
        let links = self.links(now);
        // Keys listed for later go too: nothing waits for a heartbeat of a node that stops.
        store.join_later();
        let sent = self.send_deltas(&links, now, store, true);
        self.remember_sent(&sent, now);
        now
    }

    /// Whether every reachable peer this node gossips with has acknowledged what we sent up
    /// to `sent_at` (an unreachable peer gets it by catch-up or anti-entropy when heard
    /// again; with regional gossip, the other regions' nodes get it from their gateway).
    pub fn acknowledged_since(&self, sent_at: Millis) -> bool {
        self.gateways.links.iter().all(|&p| {
            !self.membership.is_reachable(p) || self.peer[usize::from(p.0)].acked_ms >= sent_at
        })
    }

    /// Time has come ([`Cluster::poll_timeout`]): forwarded batches past their deadline
    /// fail, and at the end of a gossip interval the interval's work is done (failure
    /// detection, rebalancing, deltas, paced full states, catch-ups, anti-entropy).
    pub fn handle_timeout(&mut self, now: Millis, store: &mut dyn KeyStates) {
        for id in self.forwards.expire(now) {
            self.events.push_back(Event::ForwardFailed { id });
        }
        if now >= self.next_tick {
            self.next_tick = now + self.cfg.gossip_interval;
            self.gossip_interval_ends(now, store);
        }
        self.report_view();
    }
}
