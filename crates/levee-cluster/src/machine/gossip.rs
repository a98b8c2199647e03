//! The end of a gossip interval: failure detection, rebalancing, deltas to every peer gossiped
//! with (`topology.rs`), paced full states, repeats to peers that do not hear us, anti-entropy
//! digests.

use levee_core::{Millis, NodeIdx, RebalanceCtx};
use levee_proto::{KeyEntry, Message};

use super::{Cluster, MAX_IN_FLIGHT_FRACTION, MAX_KEYS_BEHIND};
use crate::digest::digest_message;
use crate::peer::{MAX_KEYS_PER_MESSAGE, MissedKeys, PUSH_KEYS_PER_TICK, batch};
use crate::routing::key_of;
use crate::store::KeyStates;

impl Cluster {
    /// Sends `to` what its queue holds, up to this interval's budget.
    pub(super) fn pump(&mut self, to: NodeIdx, now: Millis, store: &mut dyn KeyStates) {
        while let Some(msg) = self.peer[usize::from(to.0)].next_queued(&*store, now) {
            let answered = matches!(msg, Message::PullChunk { done: true, .. });
            self.send(to, msg, now);
            if answered {
                // Right after the whole answer, not before it: a node of a build before
                // `ListsBefore` refuses it, which stops the stream it came on, and with it
                // what follows until the next frame opens another (a lost batch it asks for
                // again), never its pull's answer.
                self.send_lists_before(to, now);
            }
        }
    }

    /// Remembers the keys sent now, and forgets those every peer has acknowledged.
    pub(super) fn remember_sent(&mut self, ids: &[Vec<u8>], now: Millis) {
        let margin = 2 * self.cfg.gossip_interval;
        let (peer, links) = (&self.peer, &self.gateways.links);
        let (replicas, me) = (&self.cfg.replicas, self.cfg.me);
        let regional = self.cfg.topology == super::Topology::Regions;
        // Keep what the least up-to-date peer gossiped with may need again (bounded by
        // MAX_RECENT_KEYS: a peer that missed more gets everything when it is heard again);
        // with regional gossip, what the least up-to-date other region has (the best
        // acknowledgement among its nodes: gateways change, a region does not).
        let keep_from = || {
            let acked = |n: &NodeIdx| peer[usize::from(n.0)].acked_ms;
            let mates_and_links = links.iter().map(acked);
            let regions = replicas
                .regions()
                .filter(|&r| regional && r != replicas.region_of(me))
                .map(|r| {
                    replicas
                        .region_nodes(r)
                        .iter()
                        .map(acked)
                        .max()
                        .unwrap_or(0)
                });
            mates_and_links
                .chain(regions)
                .filter(|&a| a > 0)
                .map(|a| a.saturating_sub(margin))
                .min()
                .unwrap_or(now)
        };
        self.recent
            .remember(ids, now, self.cfg.suspect_after / 4, keep_from);
    }

    /// One gossip interval's work.
    pub(super) fn gossip_interval_ends(&mut self, now: Millis, store: &mut dyn KeyStates) {
        let changes = self.membership.refresh(now);
        self.apply(changes);
        self.sync_if_listed(now);
        if !self.synced && now.saturating_sub(self.started) >= self.cfg.suspect_after {
            // Nobody can vouch for a complete state — no peer is reachable, or every reachable
            // one is recovering too (the whole cluster is starting): start from what we have.
            let links = self.links(now);
            let m = &self.membership;
            let all_deferred = links
                .iter()
                .all(|&p| !m.is_reachable(p) || self.peer[usize::from(p.0)].deferred);
            if all_deferred {
                // With nobody reachable at all (not even a recovering peer, which sends
                // what it has), what this node did before it started is unknown: blind.
                // (A node whose every peer is removed is a single node; one that keeps its
                // counters on disk lost at most what it admitted since its last snapshot.)
                self.blind = !self.durable
                    && !links.is_empty()
                    && links
                        .iter()
                        .all(|&p| !m.is_reachable(p) && !self.peer[usize::from(p.0)].deferred);
                self.become_synced();
                self.report_view();
            }
        }
        // (A blind node's pull after a removal, if one is under way, asks the same peers.)
        let blind_asks = self.blind && self.heir_pull.is_none();
        if (!self.synced || blind_asks) && now.saturating_sub(self.last_pull) >= self.pull_retry() {
            // The answers to our pull may have been lost (a peer's link to us was still
            // backing off from our restart): ask again until one arrives whole.
            self.last_pull = now;
            for peer in self.links(now) {
                self.send(peer, Message::PullRequest, now);
            }
        }
        self.heir_pull_step(now);
        // Keys listed for later (`levee_core::Listing::Later`: a quiet bucket whose forecast
        // is due a sample) go with this interval's keys if there are any, else when a link's
        // idle heartbeat is due, in the batch that is the heartbeat; at a node that only
        // answers heartbeats, once per idle heartbeat.
        let peers = self.links(now);
        let urgent = store.listed_now() > 0 || !self.gateways.relay.is_empty();
        if urgent
            || peers.is_empty()
            || now >= self.next_later
            || peers
                .iter()
                .any(|&p| self.peer[usize::from(p.0)].idle_beat_due(now, self.own_beat(p)))
        {
            store.join_later();
            self.next_later = now + self.idle_heartbeat();
        }
        // A blind node does not know what it gave before it started: it gives nothing.
        if self.synced && !self.blind {
            self.rebalance(now, store);
        }
        // A batch of keys listed for later only is not followed by empty batches (see
        // `heartbeat_due`): its loss is noticed at the next heartbeat, as such a key's
        // listing waits one anyway.
        let sent_ids = self.send_deltas(&peers, now, store, urgent);
        self.remember_sent(&sent_ids, now);
        for &p in &peers {
            self.peer[usize::from(p.0)].budget = PUSH_KEYS_PER_TICK;
            self.reask_missed(p, now);
            self.answer_missed(p, now);
            self.pump(p, now, store);
        }
        self.resend_to_deaf_peers(&peers, &sent_ids, now, store);
        // A peer that got nothing else this interval gets an empty batch when one is due
        // (`heartbeat_due`): silence means trouble, a healed link is seen within an interval,
        // and the batch carries our acknowledgement of the peer's.
        for &p in &peers {
            if self.peer[usize::from(p.0)].last_sent < now && self.heartbeat_due(p, now) {
                self.send(p, Message::Deltas(batch(now, vec![])), now);
            }
        }
        // After the batches: a `Heard` is no batch (it acknowledges nothing).
        self.send_heard(&peers, now);
        self.anti_entropy(&peers, now, store);
        self.gossip_overrides(now, store);
        let peers = self.peers();
        if now >= self.next_membership {
            // Tell every peer the list again now and then: every anti-entropy interval while
            // the change settles (a list sent to a peer that was not listening yet is not
            // resent otherwise) or while a peer's has not (it may wait for this node's word,
            // lost on the way), and every ten once all have (a lost message must not leave a
            // peer bounding its shares by lists this node no longer runs).
            let settling = !self.lists.agreed()
                || !self.lists.settled()
                || self.lists.peers_settling()
                || (self.lists.is_leaving(self.cfg.me) && !self.leave_acknowledged());
            let every = if settling { 1 } else { 10 };
            self.next_membership = now + every * self.cfg.anti_entropy_interval;
            for &p in &peers {
                self.send_list(p, now);
            }
        }
    }

    /// Whether a peer this node gossips with and has nothing to send gets an empty batch this
    /// interval (mesh and regional gossip alike: a gateway's health reads its
    /// acknowledgements within `deaf_after`, several idle heartbeats).
    /// Every interval while the link may be in trouble — the peer unreachable, or its
    /// acknowledgements late — so that a healed link is seen within an interval, and for two
    /// intervals after a batch of keys, so that the loss of the last one is noticed (and asked
    /// for, [`Message::Missed`]) as soon as before. Otherwise once per
    /// [`Cluster::idle_heartbeat`] at the link's lower position, and half a period later at
    /// the higher one, which normally answers instead ([`Cluster::answer_batch`]): an idle
    /// link costs each end a frame and its QUIC acknowledgement that often, not every
    /// interval (issue #18; in a 3 × 2 cluster, 33 ms of CPU a second per idle node with a
    /// batch every 20 ms interval, 13 with heartbeats from both ends every 100 ms, 8–12 with
    /// one heartbeat and its answer every 200 ms).
    fn heartbeat_due(&self, p: NodeIdx, now: Millis) -> bool {
        let every = self.idle_heartbeat();
        let interval = self.cfg.gossip_interval;
        let st = &self.peer[usize::from(p.0)];
        st.idle_beat_due(now, self.own_beat(p))
            || now.saturating_sub(st.last_keys_ms) <= 2 * interval
            || !self.membership.is_reachable(p)
            || now.saturating_sub(st.acked_ms) > 2 * every + 4 * interval
    }

    /// How often an idle link carries an empty batch: a fifth of `suspect_after`, at least
    /// every interval (200 ms with the defaults: 20 ms intervals, suspect after 1 s). The
    /// link's lower position sends it; the higher one answers it at once
    /// ([`Cluster::answer_batch`]), so one heartbeat and its answer cross an idle link per
    /// period: the lower end's acknowledgement of the other lags by at most a period and a
    /// round trip, the higher end's by at most two periods (its answer is acknowledged by the
    /// next heartbeat), below the `2 × period + 4 × interval` at which a link counts as in
    /// trouble ([`Cluster::heartbeat_due`]) whatever the round trip. (Each end sends on its own QUIC connection, so the answer does not
    /// carry the transport's acknowledgement of the heartbeat: each frame still costs one
    /// ACK-only datagram back, and an idle link four datagrams a period.)
    pub(super) fn idle_heartbeat(&self) -> Millis {
        (self.cfg.suspect_after / 5).max(self.cfg.gossip_interval)
    }

    /// How long a link to `p` may go without a batch from this node: an idle heartbeat, or
    /// half a heartbeat longer at the end that answers (the other end's heartbeat, answered
    /// at once, is normally what it sends; its own is for a link that stopped carrying them).
    fn own_beat(&self, p: NodeIdx) -> Millis {
        let every = self.idle_heartbeat();
        if self.answers(p) {
            every + every / 2
        } else {
            every
        }
    }

    /// Whether this node is the end of the link to `p` that answers `p`'s batches rather than
    /// sending its own idle heartbeats: the higher position in the replica list (the same
    /// on both ends; while two lists are in play both ends may send, as before).
    fn answers(&self, p: NodeIdx) -> bool {
        self.cfg.me > p
    }

    /// A batch from `from` arrived: the end that answers sends an empty batch back at once
    /// when its last batch to `from` is at least half an idle heartbeat old. An idle link
    /// thus carries one heartbeat and one answer per period; under load (a batch of keys
    /// every interval) the answers go every half period, as often as the heartbeats of
    /// either end went before, so acknowledgements lag no more than they did.
    pub(super) fn answer_batch(&mut self, from: NodeIdx, now: Millis) {
        let half = self.idle_heartbeat() / 2;
        let st = &self.peer[usize::from(from.0)];
        if self.answers(from)
            && self.gateways.links.contains(&from)
            && now.saturating_sub(st.last_batch_ms) >= half
        {
            self.send(from, Message::Deltas(batch(now, vec![])), now);
        }
    }

    /// Moves spare rights of the keys used or merged since the last interval
    /// toward demand (each key's owner in this region gets what the others spare), with at
    /// most [`MAX_IN_FLIGHT_FRACTION`] of a key's capacity in flight to one peer.
    fn rebalance(&mut self, now: Millis, store: &mut dyn KeyStates) {
        if self.lists.is_leaving(self.cfg.me) {
            // Leaving: every key it holds rights in gives them to its owner, not only the
            // keys used lately.
            store.activate_all();
        }
        let view = self.view();
        let router = self.routes.load();
        let replicas = &self.cfg.replicas;
        let me = self.cfg.me;
        let membership = &self.membership;
        // Each peer's clock estimate, once per interval rather than per key and scope.
        let clocks: Vec<_> = self.peer.iter().map(|p| p.clock.get()).collect();
        let started = self.started;
        let own_demand = self.local_first;
        let mut given = 0u64;
        store.update_active(&mut |id, state, target| {
            let capacity = target.algorithm.capacity() as f64;
            let owner = router.owner(key_of(id));
            // A key taken over from an unreachable owner: its demand is this node's now.
            let inherit_from = router.taken_over_from(key_of(id)).filter(|_| owner == me);
            let ctx = RebalanceCtx {
                now,
                me,
                replicas,
                view,
                owner,
                max_in_flight: (capacity * MAX_IN_FLIGHT_FRACTION).ceil() as u64,
                inherit_from,
                hears: &|n| membership.is_reachable(n),
                clock_of: &|n| clocks.get(usize::from(n.0)).copied().flatten(),
                started,
                own_demand,
            };
            given = given.saturating_add(state.rebalance(target, &ctx));
        });
        self.rights_given = self.rights_given.saturating_add(given);
    }

    /// Deltas of every key changed since the last interval, to every peer in `peers`, and to
    /// region-mates with what this node relays (`topology.rs`); returns the ids sent. The
    /// batches are followed by empty ones for two intervals if `trailing` (`heartbeat_due`).
    pub(super) fn send_deltas(
        &mut self,
        peers: &[NodeIdx],
        now: Millis,
        store: &mut dyn KeyStates,
        trailing: bool,
    ) -> Vec<Vec<u8>> {
        let mut own: Vec<Vec<KeyEntry>> = Vec::new();
        loop {
            let deltas = store.drain_deltas(MAX_KEYS_PER_MESSAGE);
            if deltas.is_empty() {
                break;
            }
            let full = deltas.len() == MAX_KEYS_PER_MESSAGE;
            own.push(
                deltas
                    .into_iter()
                    .map(|(id, state)| KeyEntry { id, state })
                    .collect(),
            );
            if !full {
                break;
            }
        }
        let relay = self.take_relay(now);
        let mut sent_ids: Vec<Vec<u8>> = own
            .iter()
            .chain(std::iter::once(&relay))
            .flatten()
            .map(|k| k.id.clone())
            .collect();
        if relay.is_empty() {
            for keys in own {
                let batch = batch(now, keys);
                for &p in peers {
                    self.send_stamped(p, Message::Deltas(batch.clone()), now, trailing);
                }
            }
            return sent_ids;
        }
        // Region-mates get this node's deltas and the relayed entries in the same batches.
        let mine = self.cfg.replicas.region_of(self.cfg.me);
        let (mates, others): (Vec<NodeIdx>, Vec<NodeIdx>) = peers
            .iter()
            .partition(|&&p| self.cfg.replicas.region_of(p) == mine);
        for keys in &own {
            let batch = batch(now, keys.clone());
            for &p in &others {
                self.send(p, Message::Deltas(batch.clone()), now);
            }
        }
        let all: Vec<KeyEntry> = own.into_iter().flatten().chain(relay).collect();
        for keys in all.chunks(MAX_KEYS_PER_MESSAGE) {
            let batch = batch(now, keys.to_vec());
            for &p in &mates {
                self.send(p, Message::Deltas(batch.clone()), now);
            }
        }
        sent_ids.sort_unstable();
        sent_ids.dedup();
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
            // With regional gossip, a node of another region has at least what its region
            // acknowledged (a gateway chosen during a cut, which never acknowledged us).
            let acked = self.acked_by(p);
            let deaf = acked > 0
                && (!self.membership.is_reachable(p) || now.saturating_sub(acked) > deaf_after);
            if !deaf {
                self.peer[i].missed = MissedKeys::NotTracked;
                continue;
            }
            let missed = match std::mem::take(&mut self.peer[i].missed) {
                MissedKeys::NotTracked => self.sent_since(acked),
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
                    && st.queue_is_empty()
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
}
