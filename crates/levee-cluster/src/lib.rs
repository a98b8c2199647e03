//! # levee-cluster
//!
//! The replication protocol as a state machine: no I/O, no clock, no runtime. Events and
//! `now` go in; messages to send come out.
//!
//! ## Call order
//!
//! * [`Cluster::new`] at start: it queues a full pull from every peer (join or restart).
//! * [`Cluster::handle_message`] for every message received (after the transport checked the
//!   peer's certificate and the frame).
//! * [`Cluster::handle_tick`] every `gossip_interval`: failure detection, rebalancing of spare
//!   rights, delta gossip (coalesced per key, batched per destination, an empty batch to a
//!   peer that would get nothing), paced full states, and now and then an anti-entropy
//!   digest.
//! * After each of those, drain [`Cluster::poll_transmit`] and hand every message to the
//!   transport; the state machine never waits for an answer.
//! * [`Cluster::view`], [`Cluster::owner`] and [`Cluster::is_reachable`] on the request path.
//!
//! The key states live outside the machine, behind [`KeyStates`], so that a node keeps them
//! in its concurrent store and the simulator in a plain map.
//!
//! ## What it guarantees
//!
//! Deltas carry absolute values of the sender's own entries, so loss, duplication and
//! reordering are harmless and any later delta repairs an earlier loss. Every peer hears from
//! every node every `gossip_interval` (an empty batch if nothing changed), and every batch
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
//! sender's. Every node gossips every key to every other node, so every node's view of a key
//! converges, not only the owners'.

pub mod membership;
pub mod memory;
pub mod ring;

use std::collections::{BTreeSet, HashMap, VecDeque};

use levee_core::{
    ClusterView, Consistency, KeyCrdt, Millis, NodeIdx, RegionIdx, RegionMask, ReplicaSet,
};
use levee_proto::{DeltaBatch, Digest, KeyState as WireKey, Message};

use membership::{Change, Membership};
use ring::Rings;

/// Digest buckets: the key space is cut into this many ranges for anti-entropy.
pub const DIGEST_BUCKETS: u32 = 256;
/// Most keys in one message.
pub const MAX_KEYS_PER_MESSAGE: usize = 256;
/// Most keys re-sent every interval to a peer that does not hear this node.
pub const MAX_KEYS_BEHIND: usize = 64;
/// Most keys remembered as recently sent (beyond, a catch-up falls back to a full push).
pub const MAX_RECENT_KEYS: usize = 1 << 16;
/// Most keys of full states (pulls, anti-entropy, catch-ups) sent to one peer per gossip
/// interval; the rest waits its turn, so a large pull cannot flood the link (deltas of
/// changed keys are not held back).
pub const PUSH_KEYS_PER_TICK: usize = 4 * MAX_KEYS_PER_MESSAGE;
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
}

/// A message for the transport to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing {
    /// The destination.
    pub to: NodeIdx,
    /// The message.
    pub msg: Message,
}

/// Why a key's state was not merged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Refused(pub String);

/// The key states the protocol replicates, kept by the caller.
pub trait KeyStates {
    /// Removes and returns, for up to `max` keys, the entries this node wrote since the last
    /// call (as absolute values).
    fn drain_deltas(&mut self, max: usize) -> Vec<(Vec<u8>, KeyCrdt)>;
    /// Joins a peer's state of a key into ours (creating the key if needed).
    fn merge(&mut self, id: &[u8], state: &KeyCrdt, now: Millis) -> Result<(), Refused>;
    /// Calls `f` with every key's state and the oldest epoch still counted for it.
    fn for_each(&self, now: Millis, f: &mut dyn FnMut(&[u8], &KeyCrdt, u64));
    /// A copy of one key's state, if held.
    fn get(&self, id: &[u8]) -> Option<KeyCrdt>;
    /// The anti-entropy digest of every key held: [`DIGEST_BUCKETS`] hashes, each the XOR
    /// of the [`key_fingerprint`]s of the keys in that bucket ([`bucket_of`]). Kept up to
    /// date as keys change (see [`Fingerprints`]), so that a round costs O(buckets), not
    /// O(keys).
    fn digest(&mut self, now: Millis) -> Vec<u64>;
    /// Strict mode: moves spare rights of recently active keys toward demand.
    fn rebalance(&mut self, now: Millis, view: ClusterView, owner: &dyn Fn(&[u8]) -> NodeIdx);
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

/// A key waiting in a peer's push queue.
#[derive(Debug, Clone)]
enum Push {
    /// A key's state, as `Deltas`.
    Key(Vec<u8>),
    /// A key's state, as part of the answer to a pull.
    Pull(Vec<u8>),
    /// The end of the answer to a pull.
    PullDone,
}

/// The replication state machine of one node.
pub struct Cluster {
    cfg: ClusterConfig,
    membership: Membership,
    rings: Rings,
    out: VecDeque<Outgoing>,
    /// Per peer, by node index: what was sent, heard and acknowledged.
    peer: Vec<PeerState>,
    /// Keys whose own entries this node sent recently, with when (this node's clock): what a
    /// peer that missed our batches since some time needs again.
    recent: HashMap<Vec<u8>, Millis>,
    /// `recent` holds every key sent at or after this time.
    recent_floor: Millis,
    next_prune: Millis,
    next_anti_entropy: Millis,
    ae_cursor: usize,
    sync_gen: u64,
    started: Millis,
    synced: bool,
    /// When the last pull was asked for (re-asked while not synced: answers can be lost).
    last_pull: Millis,
    /// Regions heard from since `sync_gen` last advanced.
    heard: RegionMask,
    refused: u64,
}

/// What this node knows of its exchange with one peer.
#[derive(Debug, Clone, Default)]
struct PeerState {
    /// When a message was last queued for it (this node's clock).
    last_sent: Millis,
    /// The highest `sent_at_ms` of its batches received (its clock): echoed as `ack_ms`.
    heard_ms: u64,
    /// The highest `sent_at_ms` of our batches it says it has received (our clock).
    acked_ms: u64,
    /// When we last pushed it what it missed.
    caught_up: Millis,
    /// It answered our pull saying it is recovering too.
    deferred: bool,
    /// Full states waiting to be sent to it, paced by `budget`.
    queue: VecDeque<Push>,
    /// An answer to its pull is in `queue`.
    pull_queued: bool,
    /// Keys that may still be pushed to it this interval.
    budget: usize,
    /// While it does not hear us: the keys it misses, re-sent every interval so that the
    /// first message through after a heal carries them; `None` when there are too many
    /// (then the catch-up waits until it is heard again).
    behind: Option<Option<BTreeSet<Vec<u8>>>>,
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
            peer: vec![
                PeerState {
                    budget: PUSH_KEYS_PER_TICK,
                    ..PeerState::default()
                };
                n
            ],
            recent: HashMap::new(),
            recent_floor: now,
            next_prune: now,
            next_anti_entropy: now + cfg.anti_entropy_interval,
            ae_cursor: 0,
            sync_gen: 0,
            started: now,
            synced: n == 1,
            last_pull: now,
            heard: RegionMask::EMPTY,
            refused: 0,
            cfg,
        };
        for peer in c.peers() {
            c.send(peer, Message::PullRequest, now);
        }
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
        let p = &mut self.peer[usize::from(to.0)];
        p.last_sent = now;
        if let Message::Deltas(b) | Message::PullChunk { batch: b, .. } = &mut msg {
            b.ack_ms = p.heard_ms;
        }
        self.out.push_back(Outgoing { to, msg });
    }

    /// A batch of keys sent now (its `ack_ms` is set per destination by [`Cluster::send`]).
    fn batch(now: Millis, keys: Vec<WireKey>) -> DeltaBatch {
        DeltaBatch {
            sent_at_ms: now,
            ack_ms: 0,
            keys,
        }
    }

    /// The next message to send.
    pub fn poll_transmit(&mut self) -> Option<Outgoing> {
        self.out.pop_front()
    }

    /// What decisions should assume about the cluster now.
    pub fn view(&self) -> ClusterView {
        ClusterView {
            consistency: self.cfg.consistency,
            unreachable: self.membership.unreachable_regions(&self.cfg.replicas),
            sync_gen: self.sync_gen,
            acting_alone: false,
            recovering: !self.synced,
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

    /// The owner of a key in `region`, among the nodes believed reachable.
    pub fn owner_in(&self, region: RegionIdx, key: &[u8]) -> Option<NodeIdx> {
        self.rings.owner(region, key)
    }

    /// Whether a peer is reachable.
    pub fn is_reachable(&self, peer: NodeIdx) -> bool {
        self.membership.is_reachable(peer)
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
                    backlog_keys: p
                        .queue
                        .iter()
                        .filter(|q| !matches!(q, Push::PullDone))
                        .count(),
                }
            })
            .collect()
    }

    fn apply(&mut self, changes: Vec<Change>) {
        if changes.is_empty() {
            return;
        }
        let m = &self.membership;
        self.rings = Rings::new(&self.cfg.replicas, |n| m.is_reachable(n));
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
            Message::PullRequest if self.synced => self.push_all(from, now, store, |_| true, true),
            Message::PullRequest => {
                self.push_all(from, now, store, |_| true, false);
                self.send(from, Message::PullDeferred, now);
            }
            Message::PullDeferred => self.peer[i].deferred = true,
            Message::PullChunk { batch, done } => {
                self.merge_batch(&batch, now, store);
                if done {
                    self.synced = true;
                }
            }
            // While the peer has a backlog from us, buckets differ because of what is still
            // on its way: repairing them would only add to it.
            Message::Digest(d) if d.buckets != DIGEST_BUCKETS => self.refused += 1,
            Message::Digest(d) if self.peer[i].queue.is_empty() => {
                let mine = digest(store, now);
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
                    self.push_all(
                        from,
                        now,
                        store,
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
                    self.push_all(
                        from,
                        now,
                        store,
                        move |id| wanted.binary_search(&bucket_of(id, buckets)).is_ok(),
                        false,
                    );
                } else {
                    self.refused += 1;
                }
            }
            // Forwarded checks and rights requests are answered by the node, which owns the
            // decision path; the state machine only needs to know the peer is alive.
            Message::Forward { .. }
            | Message::ForwardReply { .. }
            | Message::RightsRequest { .. } => {}
        }
        self.pump(from, now, store);
    }

    /// The keys sent since `since` (with a margin for batches reordered around the last one
    /// acknowledged), or `None` if `recent` no longer reaches back that far.
    fn sent_since(&self, since: Millis) -> Option<BTreeSet<Vec<u8>>> {
        let from = since.saturating_sub(2 * self.cfg.gossip_interval);
        if since == 0 || from < self.recent_floor {
            return None;
        }
        Some(
            self.recent
                .iter()
                .filter(|(_, t)| **t >= from)
                .map(|(id, _)| id.clone())
                .collect(),
        )
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
        self.peer[usize::from(to.0)].caught_up = now;
        match self.sent_since(since) {
            Some(ids) => self.peer[usize::from(to.0)]
                .queue
                .extend(ids.into_iter().map(Push::Key)),
            // A peer that never acknowledged us has just started: it pulls everything.
            None if or_all && since > 0 => {
                // Everything supersedes the keys already queued for it.
                self.peer[usize::from(to.0)]
                    .queue
                    .retain(|q| !matches!(q, Push::Key(_)));
                self.push_all(to, now, store, |_| true, false);
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
                keys.push(WireKey {
                    id: id.clone(),
                    state,
                });
            }
            if keys.len() == MAX_KEYS_PER_MESSAGE {
                self.send(
                    to,
                    Message::Deltas(Self::batch(now, std::mem::take(&mut keys))),
                    now,
                );
            }
        }
        if !keys.is_empty() {
            self.send(to, Message::Deltas(Self::batch(now, keys)), now);
        }
    }

    fn merge_batch(&mut self, batch: &DeltaBatch, now: Millis, store: &mut dyn KeyStates) {
        for k in &batch.keys {
            if store.merge(&k.id, &k.state, now).is_err() {
                self.refused += 1;
            }
        }
    }

    /// Queues every key for which `want` holds for `to` (sent by [`Cluster::pump`]); `pull`
    /// makes it the answer to a pull, whose last chunk says `done`. One answer to a pull at a
    /// time per peer: a repeated request while one is queued is already being answered.
    fn push_all(
        &mut self,
        to: NodeIdx,
        now: Millis,
        store: &mut dyn KeyStates,
        want: impl Fn(&[u8]) -> bool,
        pull: bool,
    ) {
        let p = &mut self.peer[usize::from(to.0)];
        if pull && p.pull_queued {
            return;
        }
        store.for_each(now, &mut |id, _, _| {
            if want(id) {
                p.queue.push_back(if pull {
                    Push::Pull(id.to_vec())
                } else {
                    Push::Key(id.to_vec())
                });
            }
        });
        if pull {
            p.queue.push_back(Push::PullDone);
            p.pull_queued = true;
        }
    }

    /// Sends `to` what its queue holds, up to this interval's budget, in messages of at most
    /// [`MAX_KEYS_PER_MESSAGE`] keys, each key's state as it is now.
    fn pump(&mut self, to: NodeIdx, now: Millis, store: &mut dyn KeyStates) {
        let i = usize::from(to.0);
        loop {
            let p = &mut self.peer[i];
            if p.queue.is_empty() || p.budget == 0 {
                return;
            }
            let pull = matches!(p.queue.front(), Some(Push::Pull(_) | Push::PullDone));
            let mut keys = Vec::new();
            let mut done = false;
            while keys.len() < MAX_KEYS_PER_MESSAGE && p.budget > 0 {
                let id = match p.queue.front() {
                    Some(Push::Key(id)) if !pull => id,
                    Some(Push::Pull(id)) if pull => id,
                    Some(Push::PullDone) if pull => {
                        p.queue.pop_front();
                        p.pull_queued = false;
                        done = true;
                        break;
                    }
                    _ => break,
                };
                if let Some(state) = store.get(id) {
                    keys.push(WireKey {
                        id: id.clone(),
                        state,
                    });
                    p.budget -= 1;
                }
                p.queue.pop_front();
            }
            if keys.is_empty() && !done {
                continue;
            }
            let batch = Self::batch(now, keys);
            let msg = if pull {
                Message::PullChunk { batch, done }
            } else {
                Message::Deltas(batch)
            };
            self.send(to, msg, now);
        }
    }

    /// Remembers the keys sent now, and forgets those every peer has acknowledged.
    fn remember_sent(&mut self, ids: &[Vec<u8>], now: Millis) {
        for id in ids {
            match self.recent.get_mut(id.as_slice()) {
                Some(t) => *t = now,
                None => {
                    self.recent.insert(id.clone(), now);
                }
            }
        }
        let over = self.recent.len() > MAX_RECENT_KEYS;
        if now < self.next_prune && !over {
            return;
        }
        self.next_prune = now + self.cfg.suspect_after / 4;
        // Keep what the least up-to-date peer may need again (bounded by MAX_RECENT_KEYS: a
        // peer that missed more gets everything when it is heard again).
        let mut floor = self
            .peer
            .iter()
            .enumerate()
            .filter(|&(i, p)| i != usize::from(self.cfg.me.0) && p.acked_ms > 0)
            .map(|(_, p)| p.acked_ms.saturating_sub(2 * self.cfg.gossip_interval))
            .min()
            .unwrap_or(now);
        if over {
            let mut times: Vec<Millis> = self.recent.values().copied().collect();
            let keep = MAX_RECENT_KEYS / 2;
            let cut = times.len() - keep;
            let (_, t, _) = times.select_nth_unstable(cut);
            floor = floor.max(*t + 1);
        }
        if floor > self.recent_floor {
            self.recent_floor = floor;
            self.recent.retain(|_, t| *t >= floor);
            if self.recent.capacity() > 4 * self.recent.len().max(1024) {
                // A burst (a fill) is over: give its memory back.
                self.recent.shrink_to(2 * self.recent.len());
            }
        }
    }

    /// One gossip interval.
    pub fn handle_tick(&mut self, now: Millis, store: &mut dyn KeyStates) {
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
            let view = self.view();
            let rings = &self.rings;
            let region = self.cfg.replicas.region_of(self.cfg.me);
            let me = self.cfg.me;
            store.rebalance(now, view, &|key| {
                rings.owner(region, key_of(key)).unwrap_or(me)
            });
        }
        // Deltas of every key changed since the last tick, to every peer.
        let peers = self.peers();
        let mut sent_ids: Vec<Vec<u8>> = Vec::new();
        loop {
            let deltas = store.drain_deltas(MAX_KEYS_PER_MESSAGE);
            if deltas.is_empty() {
                break;
            }
            let full = deltas.len() == MAX_KEYS_PER_MESSAGE;
            let keys: Vec<WireKey> = deltas
                .into_iter()
                .map(|(id, state)| WireKey { id, state })
                .collect();
            sent_ids.extend(keys.iter().map(|k| k.id.clone()));
            let batch = Self::batch(now, keys);
            for &p in &peers {
                self.send(p, Message::Deltas(batch.clone()), now);
            }
            if !full {
                break;
            }
        }
        self.remember_sent(&sent_ids, now);
        for &p in &peers {
            self.peer[usize::from(p.0)].budget = PUSH_KEYS_PER_TICK;
            self.pump(p, now, store);
        }
        // A peer that does not hear us (silent, or its acknowledgements stopped) gets, every
        // interval, the few keys it misses: the first message through after a heal carries
        // them.
        let deaf_after = self.deaf_after();
        for &p in &peers {
            let i = usize::from(p.0);
            let st = &self.peer[i];
            let deaf = st.acked_ms > 0
                && (!self.membership.is_reachable(p)
                    || now.saturating_sub(st.acked_ms) > deaf_after);
            if !deaf {
                self.peer[i].behind = None;
                continue;
            }
            let behind = match self.peer[i].behind.take() {
                None => self.sent_since(self.peer[i].acked_ms),
                Some(Some(mut ids)) => {
                    ids.extend(sent_ids.iter().cloned());
                    Some(ids)
                }
                Some(None) => None,
            };
            let behind = behind.filter(|ids| ids.len() <= MAX_KEYS_BEHIND);
            if let Some(ids) = &behind
                && !ids.is_empty()
            {
                self.push_ids(p, ids.iter(), now, store);
            }
            self.peer[i].behind = Some(behind);
        }
        // Every peer hears from us every interval (an empty batch if nothing else): silence
        // means trouble, a healed link is seen within an interval, and the batch carries our
        // acknowledgement of the peer's.
        for &p in &peers {
            if self.peer[usize::from(p.0)].last_sent < now {
                self.send(p, Message::Deltas(Self::batch(now, vec![])), now);
            }
        }
        // Anti-entropy with one reachable peer, round robin.
        if now >= self.next_anti_entropy {
            self.next_anti_entropy = now + self.cfg.anti_entropy_interval;
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
                let d = digest(store, now);
                self.send(to, Message::Digest(d), now);
            }
        }
        // A sync is complete when every reachable region has been heard from since the last
        // one: the optimistic allowance is taken against a view that includes them all.
        let mine = self.cfg.replicas.region_of(self.cfg.me);
        let unreachable = self.membership.unreachable_regions(&self.cfg.replicas);
        let complete = self
            .cfg
            .replicas
            .regions()
            .all(|r| r == mine || unreachable.contains(r) || self.heard.contains(r));
        if complete {
            self.sync_gen += 1;
            self.heard = RegionMask::EMPTY;
        }
    }
}

/// The key part of a stored identity (`rule \0 bucket key`): owners are chosen by the key's
/// own bytes, so every rule's state of one key lives on the same node.
pub fn key_of(id: &[u8]) -> &[u8] {
    match id.iter().position(|&b| b == 0) {
        Some(z) if id.len() >= z + 2 => &id[z + 2..],
        _ => id,
    }
}

fn fnv(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The stable 64-bit hash of a stored key identity (FNV-1a): it places the key in a digest
/// bucket and names it in [`Fingerprints`].
pub fn key_hash(id: &[u8]) -> u64 {
    fnv(id)
}

/// The digest bucket of a key, out of `buckets`.
pub fn bucket_of(id: &[u8], buckets: u32) -> u32 {
    bucket_of_hash(key_hash(id), buckets)
}

fn bucket_of_hash(h: u64, buckets: u32) -> u32 {
    (h % u64::from(buckets.max(1))) as u32
}

/// A key's part of its digest bucket: its identity and its state, ignoring epochs more than
/// `retained` epochs older than the newest one it holds (which nodes prune at slightly
/// different times). It depends on the state alone, never on a clock, so a value computed
/// when the key last changed stays right until it changes again.
pub fn key_fingerprint(id: &[u8], state: &KeyCrdt, retained: u64) -> u64 {
    let newest = state.slots.last().map_or(0, |s| s.epoch);
    let oldest = newest.saturating_sub(retained.saturating_sub(1));
    key_hash(id).rotate_left(17) ^ state.fingerprint(oldest)
}

/// The per-bucket digest of a key store: [`DIGEST_BUCKETS`] hashes, each the XOR of its keys'
/// fingerprints, so that when a key changes its old fingerprint XORs out and the new one in.
/// It holds no per-key memory: the store that uses it keeps each key's last fingerprint
/// (with the key itself, or in [`Fingerprints`]).
#[derive(Debug, Clone)]
pub struct DigestBuckets {
    buckets: Vec<u64>,
}

impl Default for DigestBuckets {
    fn default() -> DigestBuckets {
        DigestBuckets {
            buckets: vec![0; DIGEST_BUCKETS as usize],
        }
    }
}

impl DigestBuckets {
    /// Replaces a key's fingerprint `old` by `new` in its bucket (`None`: the key was not
    /// recorded, or is gone).
    pub fn replace(&mut self, id: &[u8], old: Option<u64>, new: Option<u64>) {
        let b = bucket_of(id, DIGEST_BUCKETS) as usize;
        self.buckets[b] ^= old.unwrap_or(0) ^ new.unwrap_or(0);
    }

    /// Forgets every key (before a rebuild from the whole store).
    pub fn clear(&mut self) {
        self.buckets.iter_mut().for_each(|b| *b = 0);
    }

    /// Every bucket's hash, [`DIGEST_BUCKETS`] of them.
    pub fn buckets(&self) -> Vec<u64> {
        self.buckets.clone()
    }
}

/// [`DigestBuckets`] with each key's last fingerprint kept beside them, for a store that has
/// nowhere else to keep it. Memory: one `u64 → u64` entry per key (named by [`key_hash`],
/// not by its bytes).
#[derive(Debug, Clone, Default)]
pub struct Fingerprints {
    keys: HashMap<u64, u64>,
    buckets: DigestBuckets,
}

impl Fingerprints {
    /// Records a key's fingerprint (`None`: the key is gone).
    pub fn set(&mut self, id: &[u8], fingerprint: Option<u64>) {
        let h = key_hash(id);
        let old = match fingerprint {
            Some(fp) => self.keys.insert(h, fp),
            None => self.keys.remove(&h),
        };
        self.buckets.replace(id, old, fingerprint);
    }

    /// Forgets every key (before a rebuild from the whole store).
    pub fn clear(&mut self) {
        self.keys.clear();
        self.buckets.clear();
    }

    /// Keys recorded.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether no key is recorded.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Every bucket's hash, [`DIGEST_BUCKETS`] of them.
    pub fn buckets(&self) -> Vec<u64> {
        self.buckets.buckets()
    }
}

/// This node's digest: the non-empty buckets of the store's incremental digest.
fn digest(store: &mut dyn KeyStates, now: Millis) -> Digest {
    let hashes = store.digest(now);
    Digest {
        buckets: DIGEST_BUCKETS,
        hashes: hashes
            .into_iter()
            .enumerate()
            .filter(|&(_, h)| h != 0)
            .map(|(i, h)| (i as u32, h))
            .collect(),
    }
}

/// Buckets whose hashes differ (or that only one side has).
fn differing(mine: &Digest, theirs: &Digest) -> Vec<u32> {
    let mut out = Vec::new();
    let lookup = |d: &Digest, b: u32| d.hashes.iter().find(|(x, _)| *x == b).map(|(_, h)| *h);
    for &(b, h) in &mine.hashes {
        if lookup(theirs, b) != Some(h) {
            out.push(b);
        }
    }
    for &(b, _) in &theirs.hashes {
        if lookup(mine, b).is_none() {
            out.push(b);
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}
