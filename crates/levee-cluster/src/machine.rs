//! The replication state machine of one node: [`Cluster`]. See the crate doc for the call
//! order and what it guarantees.

use std::collections::{BTreeSet, VecDeque};

use levee_core::{
    ClusterView, Consistency, Millis, NodeIdx, RebalanceCtx, RegionIdx, RegionMask, ReplicaSet,
};
use levee_proto::{DeltaBatch, ForwardCheck, ForwardDecision, KeyEntry, Message};

use crate::digest::{DIGEST_BUCKETS, bucket_of, differing, digest_message};
use crate::event::{Event, ForwardId};
use crate::forward::{Answer, PendingForwards};
use crate::membership::{Change, Membership};
use crate::peer::{
    MAX_KEYS_PER_MESSAGE, MissedKeys, Outgoing, PUSH_KEYS_PER_TICK, PeerLink, batch,
};
use crate::recent::RecentlySent;
use crate::ring::Rings;
use crate::routing::{Route, key_of};
use crate::store::KeyStates;

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
    /// The agreed replica set.
    pub replicas: ReplicaSet,
    /// Strict or optimistic.
    pub consistency: Consistency,
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
    /// one round trip plus an interval when it keeps up); `None` before its first ack.
    pub ack_lag_ms: Option<Millis>,
    /// Keys of full states (pulls, anti-entropy, catch-ups) waiting to be sent to it.
    pub backlog_keys: usize,
}

/// The replication state machine of one node.
pub struct Cluster {
    cfg: ClusterConfig,
    membership: Membership,
    rings: Rings,
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
    ae_cursor: usize,
    /// Advances every time every reachable region has been heard from since it last did.
    sync_generation: u64,
    started: Millis,
    synced: bool,
    /// When the last pull was asked for (re-asked while not synced: answers can be lost).
    last_pull: Millis,
    /// Regions heard from since `sync_generation` last advanced.
    heard: RegionMask,
    refused: u64,
}

impl Cluster {
    /// A node that just started: it asks every peer for their full state.
    pub fn new(cfg: ClusterConfig, now: Millis) -> Cluster {
        let membership = Membership::new(&cfg.replicas, cfg.me, cfg.suspect_after);
        let me = cfg.me;
        let rings = Rings::new(&cfg.replicas, |n| n == me);
        let n = cfg.replicas.len();
        let mut c = Cluster {
            membership,
            rings,
            out: VecDeque::new(),
            events: VecDeque::new(),
            reported_view: ClusterView::alone(),
            peer: vec![PeerLink::default(); n],
            recent: RecentlySent::new(now),
            forwards: PendingForwards::default(),
            next_tick: now + cfg.tick_phase,
            next_anti_entropy: now + cfg.anti_entropy_interval,
            ae_cursor: 0,
            sync_generation: 0,
            started: now,
            synced: n == 1,
            last_pull: now,
            heard: RegionMask::EMPTY,
            refused: 0,
            cfg,
        };
        if c.synced {
            c.events.push_back(Event::Synced);
        }
        for peer in c.peers() {
            c.send(peer, Message::PullRequest, now);
        }
        c.reported_view = c.view();
        c.events.push_back(Event::ViewChanged(c.reported_view));
        c
    }

    /// This node.
    pub fn me(&self) -> NodeIdx {
        self.cfg.me
    }

    /// The replica set.
    pub fn replicas(&self) -> &ReplicaSet {
        &self.cfg.replicas
    }

    fn peers(&self) -> Vec<NodeIdx> {
        self.cfg
            .replicas
            .nodes()
            .filter(|&n| n != self.cfg.me)
            .collect()
    }

    fn send(&mut self, to: NodeIdx, mut msg: Message, now: Millis) {
        self.peer[usize::from(to.0)].stamp(&mut msg, now);
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
            consistency: self.cfg.consistency,
            unreachable: self.membership.unreachable_regions(&self.cfg.replicas),
            sync_gen: self.sync_generation,
            acting_alone: false,
            recovering: !self.synced,
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

    /// The owner of a key in this node's region, among the nodes believed reachable.
    pub fn owner(&self, key: &[u8]) -> NodeIdx {
        let region = self.cfg.replicas.region_of(self.cfg.me);
        self.rings.owner(region, key).unwrap_or(self.cfg.me)
    }

    /// Where a check of `key` is decided (see [`crate::routing`]).
    pub fn route(&self, key: &[u8]) -> Route {
        let owner = self.owner(key);
        if owner == self.cfg.me {
            Route::Local
        } else if self.membership.is_reachable(owner) {
            Route::Owner(owner)
        } else {
            Route::Alone
        }
    }

    /// Frames or states refused so far.
    pub fn refused(&self) -> u64 {
        self.refused
    }

    /// Every peer's status.
    pub fn peers_status(&self, now: Millis) -> Vec<PeerStatus> {
        self.peers()
            .into_iter()
            .map(|node| {
                let p = &self.peer[usize::from(node.0)];
                PeerStatus {
                    node,
                    reachable: self.membership.is_reachable(node),
                    last_heard_ms_ago: self
                        .membership
                        .last_heard(node)
                        .map(|t| now.saturating_sub(t)),
                    ack_lag_ms: (p.acked_ms > 0).then(|| now.saturating_sub(p.acked_ms)),
                    backlog_keys: p.backlog_keys(),
                }
            })
            .collect()
    }

    /// Sends `checks` to `owner` (a region-mate, see [`Cluster::route`]) to decide; the
    /// answer comes as [`Event::ForwardAnswered`] with the returned id, or
    /// [`Event::ForwardFailed`] after `forward_timeout`.
    pub fn forward(&mut self, owner: NodeIdx, checks: Vec<ForwardCheck>, now: Millis) -> ForwardId {
        let deadline = now + self.cfg.forward_timeout;
        let id = self.forwards.open(owner, checks.len(), deadline);
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
            self.events.push_back(match change {
                Change::Up(n) => Event::PeerUp(n),
                Change::Down(n) => Event::PeerDown(n),
            });
        }
        let m = &self.membership;
        self.rings = Rings::new(&self.cfg.replicas, |n| m.is_reachable(n));
        let after = self.membership.unreachable_regions(&self.cfg.replicas);
        for r in self.cfg.replicas.regions() {
            match (before.contains(r), after.contains(r)) {
                (true, false) => self.events.push_back(Event::RegionReachable(r)),
                (false, true) => self.events.push_back(Event::RegionUnreachable(r)),
                _ => {}
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

    /// A message from `from`.
    pub fn handle_message(
        &mut self,
        from: NodeIdx,
        msg: Message,
        now: Millis,
        store: &mut dyn KeyStates,
    ) {
        if from == self.cfg.me || usize::from(from.0) >= self.cfg.replicas.len() {
            self.refused += 1;
            return;
        }
        let i = usize::from(from.0);
        let up = self.membership.heard(from, now);
        if let Some(change) = up {
            self.apply(vec![change]);
        }
        self.heard = self.heard.with(self.cfg.replicas.region_of(from));
        if let Message::Deltas(b) | Message::PullChunk { batch: b, .. } = &msg {
            let p = &mut self.peer[i];
            p.heard_ms = p.heard_ms.max(b.sent_at_ms);
            // An ack from the future (our clock stepped back at a restart) says nothing.
            let ack = b.ack_ms.min(now);
            let prev = p.acked_ms;
            if up.is_some() {
                // Heard again after a silence: it most likely missed what we sent since its
                // last acknowledgement. Push that at once, without waiting to be asked, so a
                // healed partition converges within one round trip.
                self.catch_up(from, prev, true, now, store);
            } else if ack > prev.saturating_add(self.cfg.suspect_after)
                && self.peer[i].caught_up <= prev
            {
                // It had stopped hearing us for longer than `suspect_after` (a link cut one
                // way) and hears us again. (A shorter jump is a reader catching up with a
                // backlog: frames to a peer arrive in order, nothing was lost.)
                self.catch_up(from, prev, false, now, store);
            }
            let p = &mut self.peer[i];
            p.acked_ms = p.acked_ms.max(ack);
        } else if up.is_some() {
            let prev = self.peer[i].acked_ms;
            self.catch_up(from, prev, true, now, store);
        }
        match msg {
            Message::Hello(_) => {}
            Message::Deltas(batch) => self.merge_batch(&batch, now, store),
            // A recovering node sends what it has but cannot vouch that it is complete.
            Message::PullRequest if self.synced => {
                self.peer[i].queue_all(&*store, now, |_| true, true);
            }
            Message::PullRequest => {
                self.peer[i].queue_all(&*store, now, |_| true, false);
                self.send(from, Message::PullDeferred, now);
            }
            Message::PullDeferred => self.peer[i].deferred = true,
            Message::PullChunk { batch, done } => {
                self.merge_batch(&batch, now, store);
                if done && !self.synced {
                    self.synced = true;
                    self.events.push_back(Event::Synced);
                }
            }
            // While the peer has a backlog from us, buckets differ because of what is still
            // on its way: repairing them would only add to it.
            Message::Digest(d) if d.buckets != DIGEST_BUCKETS => self.refused += 1,
            Message::Digest(d) if self.peer[i].queue.is_empty() => {
                let mine = digest_message(store.digest(now));
                let mut differ = differing(&mine, &d);
                if differ.len() > MAX_REPAIR_BUCKETS {
                    // A bounded repair per round, starting at a different bucket each time.
                    let start = self.ae_cursor % differ.len();
                    differ.rotate_left(start);
                    differ.truncate(MAX_REPAIR_BUCKETS);
                    differ.sort_unstable();
                }
                if !differ.is_empty() {
                    let buckets = d.buckets;
                    let wanted = differ.clone();
                    self.peer[i].queue_all(
                        &*store,
                        now,
                        move |id| differ.binary_search(&bucket_of(id, buckets)).is_ok(),
                        false,
                    );
                    self.send(from, Message::BucketRequest { buckets, wanted }, now);
                }
            }
            Message::Digest(_) => {}
            Message::BucketRequest {
                buckets,
                mut wanted,
            } => {
                if buckets > 0 && buckets <= 1 << 16 {
                    wanted.truncate(MAX_REPAIR_BUCKETS);
                    wanted.sort_unstable();
                    self.peer[i].queue_all(
                        &*store,
                        now,
                        move |id| wanted.binary_search(&bucket_of(id, buckets)).is_ok(),
                        false,
                    );
                } else {
                    self.refused += 1;
                }
            }
            Message::Forward { id, checks } => {
                self.events
                    .push_back(Event::ForwardReceived { from, id, checks });
            }
            Message::ForwardReply { id, decisions } => {
                match self.forwards.answer(from, id, decisions.len()) {
                    Answer::Accepted => self
                        .events
                        .push_back(Event::ForwardAnswered { id, decisions }),
                    Answer::Malformed => {
                        self.refused += 1;
                        self.events.push_back(Event::ForwardFailed { id });
                    }
                    Answer::Unexpected => {}
                }
            }
        }
        self.pump(from, now, store);
        self.report_view();
    }

    /// The keys sent since `since` (with a margin for batches reordered around the last one
    /// acknowledged), or `None` if we no longer know which those are.
    fn sent_since(&self, since: Millis) -> Option<BTreeSet<Vec<u8>>> {
        if since == 0 {
            return None;
        }
        self.recent
            .since(since.saturating_sub(2 * self.cfg.gossip_interval))
    }

    /// Pushes `to` the state of every key we sent since it last acknowledged us (`since`);
    /// if we no longer know which those are, everything when `or_all`, else nothing (left to
    /// anti-entropy).
    fn catch_up(
        &mut self,
        to: NodeIdx,
        since: Millis,
        or_all: bool,
        now: Millis,
        store: &mut dyn KeyStates,
    ) {
        let i = usize::from(to.0);
        self.peer[i].caught_up = now;
        match self.sent_since(since) {
            Some(ids) => self.peer[i]
                .queue
                .extend(ids.into_iter().map(crate::peer::Queued::State)),
            // A peer that never acknowledged us has just started: it pulls everything.
            None if or_all && since > 0 => {
                // Everything supersedes the keys already queued for it.
                self.peer[i]
                    .queue
                    .retain(|q| !matches!(q, crate::peer::Queued::State(_)));
                self.peer[i].queue_all(&*store, now, |_| true, false);
            }
            None => {}
        }
    }

    /// Sends the current state of these keys, in messages of at most
    /// [`MAX_KEYS_PER_MESSAGE`].
    fn push_ids<'a>(
        &mut self,
        to: NodeIdx,
        ids: impl Iterator<Item = &'a Vec<u8>>,
        now: Millis,
        store: &mut dyn KeyStates,
    ) {
        let mut keys = Vec::new();
        for id in ids {
            if let Some(state) = store.get(id) {
                keys.push(KeyEntry {
                    id: id.clone(),
                    state,
                });
            }
            if keys.len() == MAX_KEYS_PER_MESSAGE {
                self.send(
                    to,
                    Message::Deltas(batch(now, std::mem::take(&mut keys))),
                    now,
                );
            }
        }
        if !keys.is_empty() {
            self.send(to, Message::Deltas(batch(now, keys)), now);
        }
    }

    fn merge_batch(&mut self, batch: &DeltaBatch, now: Millis, store: &mut dyn KeyStates) {
        for k in &batch.keys {
            if store.merge(&k.id, &k.state, now).is_err() {
                self.refused += 1;
            }
        }
    }

    /// Sends `to` what its queue holds, up to this interval's budget.
    fn pump(&mut self, to: NodeIdx, now: Millis, store: &mut dyn KeyStates) {
        while let Some(msg) = self.peer[usize::from(to.0)].next_queued(&*store, now) {
            self.send(to, msg, now);
        }
    }

    /// Remembers the keys sent now, and forgets those every peer has acknowledged.
    fn remember_sent(&mut self, ids: &[Vec<u8>], now: Millis) {
        let me = usize::from(self.cfg.me.0);
        let margin = 2 * self.cfg.gossip_interval;
        let peer = &self.peer;
        // Keep what the least up-to-date peer may need again (bounded by MAX_RECENT_KEYS: a
        // peer that missed more gets everything when it is heard again).
        let keep_from = || {
            peer.iter()
                .enumerate()
                .filter(|&(i, p)| i != me && p.acked_ms > 0)
                .map(|(_, p)| p.acked_ms.saturating_sub(margin))
                .min()
                .unwrap_or(now)
        };
        self.recent
            .remember(ids, now, self.cfg.suspect_after / 4, keep_from);
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

    /// One gossip interval's work.
    fn gossip_interval_ends(&mut self, now: Millis, store: &mut dyn KeyStates) {
        let changes = self.membership.refresh(now);
        self.apply(changes);
        if !self.synced && now.saturating_sub(self.started) >= self.cfg.suspect_after {
            // Nobody can vouch for a complete state — no peer is reachable, or every reachable
            // one is recovering too (the whole cluster is starting): start from what we have.
            let m = &self.membership;
            let all_deferred = self
                .peers()
                .iter()
                .all(|&p| !m.is_reachable(p) || self.peer[usize::from(p.0)].deferred);
            if all_deferred {
                self.synced = true;
                self.events.push_back(Event::Synced);
            }
        }
        if !self.synced && now.saturating_sub(self.last_pull) >= self.pull_retry() {
            // The answers to our pull may have been lost (a peer's link to us was still
            // backing off from our restart): ask again until one arrives whole.
            self.last_pull = now;
            for peer in self.peers() {
                self.send(peer, Message::PullRequest, now);
            }
        }
        if self.synced && self.cfg.consistency == Consistency::Strict {
            self.rebalance(now, store);
        }
        let peers = self.peers();
        let sent_ids = self.send_deltas(&peers, now, store);
        self.remember_sent(&sent_ids, now);
        for &p in &peers {
            self.peer[usize::from(p.0)].budget = PUSH_KEYS_PER_TICK;
            self.pump(p, now, store);
        }
        self.resend_to_deaf_peers(&peers, &sent_ids, now, store);
        // Every peer hears from us every interval (an empty batch if nothing else): silence
        // means trouble, a healed link is seen within an interval, and the batch carries our
        // acknowledgement of the peer's.
        for &p in &peers {
            if self.peer[usize::from(p.0)].last_sent < now {
                self.send(p, Message::Deltas(batch(now, vec![])), now);
            }
        }
        self.anti_entropy(&peers, now, store);
        self.advance_sync_generation();
    }

    /// Strict mode: moves spare rights of the keys used or merged since the last interval
    /// toward demand (each key's owner in this region gets what the others spare), with at
    /// most [`MAX_IN_FLIGHT_FRACTION`] of a key's capacity in flight to one peer.
    fn rebalance(&mut self, now: Millis, store: &mut dyn KeyStates) {
        let view = self.view();
        let rings = &self.rings;
        let replicas = &self.cfg.replicas;
        let me = self.cfg.me;
        let region = replicas.region_of(me);
        store.update_active(&mut |id, state, target| {
            let capacity = target.algorithm.capacity() as f64;
            let ctx = RebalanceCtx {
                now,
                me,
                replicas,
                view,
                owner: rings.owner(region, key_of(id)).unwrap_or(me),
                max_in_flight: (capacity * MAX_IN_FLIGHT_FRACTION).ceil() as u64,
            };
            state.rebalance(target, &ctx);
        });
    }

    /// Deltas of every key changed since the last interval, to every peer; returns the ids
    /// sent.
    fn send_deltas(
        &mut self,
        peers: &[NodeIdx],
        now: Millis,
        store: &mut dyn KeyStates,
    ) -> Vec<Vec<u8>> {
        let mut sent_ids: Vec<Vec<u8>> = Vec::new();
        loop {
            let deltas = store.drain_deltas(MAX_KEYS_PER_MESSAGE);
            if deltas.is_empty() {
                break;
            }
            let full = deltas.len() == MAX_KEYS_PER_MESSAGE;
            let keys: Vec<KeyEntry> = deltas
                .into_iter()
                .map(|(id, state)| KeyEntry { id, state })
                .collect();
            sent_ids.extend(keys.iter().map(|k| k.id.clone()));
            let batch = batch(now, keys);
            for &p in peers {
                self.send(p, Message::Deltas(batch.clone()), now);
            }
            if !full {
                break;
            }
        }
        sent_ids
    }

    /// A peer that does not hear us (silent, or its acknowledgements stopped) gets, every
    /// interval, the few keys it misses: the first message through after a heal carries
    /// them.
    fn resend_to_deaf_peers(
        &mut self,
        peers: &[NodeIdx],
        sent_ids: &[Vec<u8>],
        now: Millis,
        store: &mut dyn KeyStates,
    ) {
        let deaf_after = self.deaf_after();
        for &p in peers {
            let i = usize::from(p.0);
            let st = &self.peer[i];
            let deaf = st.acked_ms > 0
                && (!self.membership.is_reachable(p)
                    || now.saturating_sub(st.acked_ms) > deaf_after);
            if !deaf {
                self.peer[i].missed = MissedKeys::NotTracked;
                continue;
            }
            let missed = match std::mem::take(&mut self.peer[i].missed) {
                MissedKeys::NotTracked => self.sent_since(self.peer[i].acked_ms),
                MissedKeys::Keys(mut ids) => {
                    ids.extend(sent_ids.iter().cloned());
                    Some(ids)
                }
                MissedKeys::TooMany => None,
            };
            self.peer[i].missed = match missed.filter(|ids| ids.len() <= MAX_KEYS_BEHIND) {
                Some(ids) => {
                    if !ids.is_empty() {
                        self.push_ids(p, ids.iter(), now, store);
                    }
                    MissedKeys::Keys(ids)
                }
                None => MissedKeys::TooMany,
            };
        }
    }

    /// Now and then a digest to one reachable peer that keeps up, round robin.
    fn anti_entropy(&mut self, peers: &[NodeIdx], now: Millis, store: &mut dyn KeyStates) {
        if now < self.next_anti_entropy {
            return;
        }
        self.next_anti_entropy = now + self.cfg.anti_entropy_interval;
        let deaf_after = self.deaf_after();
        // Only to a peer that keeps up: with a backlog, buckets differ because of what is
        // still on its way.
        let reachable: Vec<NodeIdx> = peers
            .iter()
            .copied()
            .filter(|&p| {
                let st = &self.peer[usize::from(p.0)];
                self.membership.is_reachable(p)
                    && st.queue.is_empty()
                    && now.saturating_sub(st.acked_ms) <= deaf_after
            })
            .collect();
        if !reachable.is_empty() {
            let to = reachable[self.ae_cursor % reachable.len()];
            self.ae_cursor = self.ae_cursor.wrapping_add(1);
            let d = digest_message(store.digest(now));
            self.send(to, Message::Digest(d), now);
        }
    }

    /// A sync is complete when every reachable region has been heard from since the last
    /// one: the optimistic allowance is taken against a view that includes them all.
    fn advance_sync_generation(&mut self) {
        let mine = self.cfg.replicas.region_of(self.cfg.me);
        let unreachable = self.membership.unreachable_regions(&self.cfg.replicas);
        let complete = self
            .cfg
            .replicas
            .regions()
            .all(|r: RegionIdx| r == mine || unreachable.contains(r) || self.heard.contains(r));
        if complete {
            self.sync_generation += 1;
            self.heard = RegionMask::EMPTY;
        }
    }
}
