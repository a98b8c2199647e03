//! Receiving: what a message from a peer does to the machine (acknowledgements, catch-ups
//! after a silence, merges, pulls, anti-entropy repairs, forwarded checks and their answers).

use std::collections::BTreeSet;

use levee_core::{Millis, NodeIdx};
use levee_proto::{DeltaBatch, ForwardCheck, KeyEntry, MAX_FORWARD_CHECKS, MAX_ID_BYTES, Message};

use super::{Cluster, MAX_REPAIR_BUCKETS, Topology};
use crate::digest::{bucket_of, digest_message, well_formed};
use crate::event::Event;
use crate::forward::{Answer, give_back_is_safe};
use crate::peer::{MAX_KEYS_PER_MESSAGE, batch};
use crate::store::KeyStates;

impl Cluster {
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
        let heard = self.membership.heard(from, now);
        if let Some(change) = heard.change {
            self.apply(vec![change]);
        }
        // The link is (back) up: the peer may have missed what this node sent it.
        let up = heard.link_up;
        // With regional gossip, a node of another region that is no link of ours (it chose
        // another gateway here, we chose another there) is caught up by its region's
        // gateway, which relays what it gets from us; its occasional messages (lists,
        // digests) come after "silences" that are none.
        let catch_up =
            up && (self.cfg.topology == Topology::Mesh || self.links(now).contains(&from));
        if self.lists.current().is_removed(from)
            && now >= self.peer[i].told_removed + self.cfg.anti_entropy_interval
        {
            // A removed node that still speaks (thawed, or cut off when it was removed) may
            // not know: its list gives it a share. Tell it, whatever it sends, at most every
            // anti-entropy interval (one answer can be lost).
            self.peer[i].told_removed = now;
            self.send_list(from, now);
        }
        if let Message::Deltas(b) | Message::PullChunk { batch: b, .. } = &msg {
            let reask_at = now + self.pull_retry();
            let p = &mut self.peer[i];
            p.clock.sample(b.sent_at_ms, b.ack_ms, now);
            if let Some(since_ms) = p.chain(b) {
                // Batches it sent after `since_ms` did not arrive: ask for their keys again
                // rather than wait for anti-entropy.
                p.missed_asks += 1;
                let since = p.missed_reask.map_or(since_ms, |(s, _)| s.min(since_ms));
                p.missed_reask = Some((since, reask_at));
                self.send(from, Message::Missed { since_ms }, now);
            }
            // An ack from the future (our clock stepped back at a restart) says nothing.
            let ack = b.ack_ms.min(now);
            let prev = self.acked_by(from);
            if catch_up {
                // Heard again after a silence: it most likely missed what we sent since its
                // last acknowledgement. Push that at once, without waiting to be asked, so a
                // healed partition converges within one round trip.
                self.catch_up(from, prev, true, now, store);
            } else if prev > 0
                && ack > prev.saturating_add(self.cfg.suspect_after)
                && self.peer[i].caught_up <= ack
            {
                // It had stopped hearing us for longer than `suspect_after` (a link cut one
                // way) and hears us again. (A shorter jump is a reader catching up with a
                // backlog: frames to a peer arrive in order, nothing was lost.) Unless we
                // caught it up after the batch it acknowledges: that push is still on its
                // way. One made before it may have gone into the same cut (with regional
                // gossip, a gateway chosen during the cut is caught up when it is first
                // heard, and nothing of it arrives). A peer that never acknowledged
                // anything was caught up with everything when it was first heard.
                self.catch_up(from, prev, false, now, store);
            }
            let p = &mut self.peer[i];
            p.acked_ms = p.acked_ms.max(ack);
        } else if catch_up {
            let prev = self.acked_by(from);
            self.catch_up(from, prev, true, now, store);
        }
        if up {
            // Heard again (or for the first time): it may have missed any override, and the
            // list this node runs.
            self.push_all_overrides(from, now, store);
            self.send_list(from, now);
        }
        match msg {
            Message::Hello(_) => {}
            Message::Membership {
                list,
                floors,
                leaving,
                reply,
            } => {
                self.list_reported(from, &list, &floors, leaving, now);
                if reply {
                    // It just started: it may also miss the lists run before (its pull's
                    // answer may have been lost, and it synced from its own disk).
                    self.send_list(from, now);
                    if !self.lists_before.is_empty() {
                        self.send_lists_before(from, now);
                    }
                }
            }
            Message::Deltas(batch) => {
                self.note_batch(from, now);
                self.merge_batch(from, batch, true, now, store);
                self.answer_batch(from, now);
            }
            // A recovering node sends what it has but cannot vouch that it is complete, nor
            // can a blind one (what it has of itself may lack what it did before it started).
            // The list first: a node that starts must be bounded by the lists in play before
            // the state it pulls makes it synced (see `PullChunk`).
            Message::PullRequest if self.synced && !self.blind => {
                self.peer[i].queue_all(&*store, now, |_| true, true);
            }
            Message::PullRequest => {
                self.peer[i].queue_all(&*store, now, |_| true, false);
                self.send(from, Message::PullDeferred, now);
            }
            Message::PullDeferred => self.peer[i].deferred = true,
            Message::ListsBefore { lists } => self.lists_before_heard(from, &lists, now),
            Message::PullChunk { batch, done } => {
                self.merge_batch(from, batch, false, now, store);
                if done && !self.synced {
                    self.peer[i].pull_done = true;
                    self.pulled_from.get_or_insert((from, now));
                    self.sync_if_listed(now);
                }
                if done {
                    self.heir_pull_answered(from);
                    if std::mem::take(&mut self.blind) {
                        self.report_view();
                    }
                }
            }
            // While the peer has a backlog from us, buckets differ because of what is still
            // on its way: repairing them would only add to it.
            Message::Digest(d) if !well_formed(&d) => self.refused += 1,
            Message::Digest(d) if self.peer[i].queue_is_empty() => {
                let mine = digest_message(store.digest(now));
                // Buckets that differ because something was lost, not because changes are
                // in flight.
                let mut differ = self.peer[i].digests.worth_repairing(&mine, &d);
                if differ.len() > MAX_REPAIR_BUCKETS {
                    // A bounded repair per round, starting at a different bucket each time.
                    let start = self.ae_cursor % differ.len();
                    differ.rotate_left(start);
                    differ.truncate(MAX_REPAIR_BUCKETS);
                    differ.sort_unstable();
                }
                if !differ.is_empty() {
                    self.queue_repair(i, &*store, now, d.buckets, &differ);
                    let (buckets, wanted) = (d.buckets, differ);
                    self.send(from, Message::BucketRequest { buckets, wanted }, now);
                }
            }
            Message::Digest(_) => {}
            Message::BucketRequest {
                buckets,
                mut wanted,
            } => {
                // A node asks for at most `MAX_REPAIR_BUCKETS` buckets of its digest.
                let bounded = wanted.len() <= MAX_REPAIR_BUCKETS;
                if bounded && buckets > 0 && buckets <= 1 << 16 {
                    wanted.truncate(MAX_REPAIR_BUCKETS);
                    wanted.sort_unstable();
                    self.queue_repair(i, &*store, now, buckets, &wanted);
                } else {
                    self.refused += 1;
                }
            }
            // More checks than a forwarder batches, or names longer than any node accepts:
            // not from an honest node. Its forwarder times out and decides alone.
            Message::Forward { checks, .. }
                if checks.len() > MAX_FORWARD_CHECKS
                    || !checks.iter().all(ForwardCheck::within_bounds) =>
            {
                self.refused += 1;
            }
            Message::Forward { id, checks } => {
                self.events
                    .push_back(Event::ForwardReceived { from, id, checks });
            }
            Message::Heard { gateway, nodes } => self.receive_heard(from, gateway, &nodes, now),
            Message::Missed { since_ms } => {
                let p = &mut self.peer[i];
                p.missed_since = Some(p.missed_since.map_or(since_ms, |s| s.min(since_ms)));
                self.answer_missed(from, now);
            }
            m @ (Message::Overrides(_) | Message::OverrideDigest { .. }) => {
                self.receive_overrides(from, m, now, store);
            }
            Message::ForwardReply { id, decisions } => {
                let admitted = decisions.iter().map(|d| d.is_some_and(|d| d.allowed));
                match self.forwards.answer(from, id, admitted) {
                    Answer::Accepted => self
                        .events
                        .push_back(Event::ForwardAnswered { id, decisions }),
                    Answer::Malformed => {
                        self.refused += 1;
                        self.events.push_back(Event::ForwardFailed { id });
                    }
                    Answer::Late(late) => {
                        // Decided here already: what the owner admitted too goes back, where
                        // a refund cannot free a right its window never gave. The refunds'
                        // own answer is waited for by nobody.
                        let back: Vec<ForwardCheck> = late
                            .refunds
                            .iter()
                            .filter(|(i, c)| {
                                let reset = decisions
                                    .get(*i)
                                    .copied()
                                    .flatten()
                                    .map_or(0, |d| d.reset_after_ms);
                                let algorithm =
                                    store.algorithm_of(&c.rule, c.class.as_deref(), now);
                                give_back_is_safe(algorithm.as_ref(), reset, late.asked, now)
                            })
                            .map(|(_, c)| c.clone())
                            .collect();
                        self.withheld_late += (late.refunds.len() - back.len()) as u64;
                        if !back.is_empty() {
                            self.given_back_late += back.len() as u64;
                            self.forward(from, back, now);
                        }
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
    pub(super) fn sent_since(&self, since: Millis) -> Option<BTreeSet<Vec<u8>>> {
        if since == 0 {
            return None;
        }
        self.recent
            .since(since.saturating_sub(2 * self.cfg.gossip_interval))
    }

    /// Repeats, once, an ask for batches of `to`'s that did not arrive
    /// ([`Message::Missed`]), `pull_retry` after it was first sent: the ask itself can be
    /// lost, and then only anti-entropy would bring what it asked for — for a short window,
    /// after the window's slot has left every node's retention, so never.
    pub(super) fn reask_missed(&mut self, to: NodeIdx, now: Millis) {
        let p = &mut self.peer[usize::from(to.0)];
        if let Some((since_ms, due)) = p.missed_reask
            && now >= due
        {
            p.missed_reask = None;
            self.send(to, Message::Missed { since_ms }, now);
        }
    }

    /// Queues for `from` the keys sent since it said it missed our batches
    /// ([`Message::Missed`]), at most once per gossip interval (each answer walks the
    /// recently sent keys); an ask that comes sooner waits for the end of the interval.
    pub(super) fn answer_missed(&mut self, from: NodeIdx, now: Millis) {
        let i = usize::from(from.0);
        let p = &self.peer[i];
        let Some(since) = p.missed_since else {
            return;
        };
        if p.missed_answered > 0 && now < p.missed_answered + self.cfg.gossip_interval {
            return;
        }
        // A time ahead of our clock is no batch of ours.
        if let Some(ids) = self.sent_since(since.min(now)) {
            self.peer[i].queue_states(ids);
        }
        let p = &mut self.peer[i];
        p.missed_since = None;
        p.missed_answered = now;
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
            Some(ids) => self.peer[i].queue_states(ids),
            // A peer that never acknowledged us has just started: it pulls everything.
            None if or_all && since > 0 => {
                // Everything supersedes the keys already queued for it.
                self.peer[i].drop_queued_states();
                self.peer[i].queue_all(&*store, now, |_| true, false);
            }
            None => {}
        }
    }

    /// Sends the current state of these keys, in messages of at most
    /// [`MAX_KEYS_PER_MESSAGE`].
    pub(super) fn push_ids<'a>(
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

    /// Merges a batch from `from`: a pull answer, or its `Deltas` (`deltas`). Of `Deltas`,
    /// keeps what it merged to relay to region-mates if `from` is of another region and
    /// this node gossips by regions (or `from` chose it as its gateway), and remembers the
    /// keys as the peer's last words (`PeerLink::last_words`).
    fn merge_batch(
        &mut self,
        from: NodeIdx,
        batch: DeltaBatch,
        deltas: bool,
        now: Millis,
        store: &mut dyn KeyStates,
    ) {
        let relay = deltas && self.relays_from(from, now);
        let mut words = Vec::with_capacity(if deltas { batch.keys.len() } else { 0 });
        for k in batch.keys {
            // An identity longer than any node stores is refused before it is even looked up.
            if k.id.len() > MAX_ID_BYTES || store.merge(&k.id, &k.state, now).is_err() {
                self.refused += 1;
            } else if relay {
                words.push(k.id.clone());
                self.gateways.relay.push((from, k));
            } else if deltas {
                words.push(k.id);
            }
        }
        self.peer[usize::from(from.0)].heard_words(words);
    }

    /// Synced once the state pulled from a peer is complete and that peer's list was heard
    /// (frames can overtake each other: a node that starts during a change must be bounded
    /// by the lists in play before it spends), and every other peer it pulled from has
    /// answered whole too, and said which lists it ran before its own
    /// ([`Message::ListsBefore`]: a share that grew with a change made while this node was
    /// down must wait), or is recovering itself, or is down (not heard within
    /// `suspect_after` of the start): the node's last batch to one peer may have been lost
    /// just before it stopped, or still be on its way to it, and another's answer holds it.
    /// Or `suspect_after` after the first complete answer, whatever the others (a peer that
    /// says no list, or no lists before: a version before live membership, or before
    /// `ListsBefore`; one whose answer does not come).
    pub(super) fn sync_if_listed(&mut self, now: Millis) {
        let Some((peer, at)) = self.pulled_from else {
            return;
        };
        if self.synced {
            return;
        }
        let links = self.links(now);
        let (peers, m) = (&self.peer, &self.membership);
        let started_long_ago = now.saturating_sub(self.started) >= self.cfg.suspect_after;
        let all_answered = links.iter().all(|&p| {
            let st = &peers[usize::from(p.0)];
            (st.pull_done && st.before_heard)
                || st.deferred
                || (started_long_ago && !m.is_reachable(p))
        });
        if (self.lists.report(peer).is_some() && all_answered)
            || now.saturating_sub(at) >= self.cfg.suspect_after
        {
            self.become_synced();
        }
    }

    /// Synced: the lists run before this node's that it heard of go to the driver first
    /// (`Event::ListsBefore`), then `Event::Synced`.
    pub(super) fn become_synced(&mut self) {
        self.synced = true;
        if !self.lists_before.is_empty() {
            self.events
                .push_back(Event::ListsBefore(self.lists_before.clone()));
        }
        self.events.push_back(Event::Synced);
    }

    /// Queues for peer `i` the keys of the digest buckets `wanted` (sorted, out of
    /// `buckets`) that a repair sends: those quiet since [`Cluster::settled_before`].
    fn queue_repair(
        &mut self,
        i: usize,
        store: &dyn KeyStates,
        now: Millis,
        buckets: u32,
        wanted: &[u32],
    ) {
        let settled = self.settled_before(i, now);
        let p = &mut self.peer[i];
        p.repaired_keys += p.queue_all(
            store,
            now,
            |id| {
                wanted.binary_search(&bucket_of(id, buckets)).is_ok()
                    && settled.is_none_or(|t| !store.changed_since(id, t))
            },
            false,
        );
    }

    /// The time from which a key's change may still be on its way to peer `i`: a repair
    /// sends it only keys that have not changed since (see [`KeyStates::changed_since`]). A
    /// difference in a digest bucket within two anti-entropy intervals of a change is most
    /// often the gossip of that change in flight; a batch that was lost is asked for again
    /// through the batch chain ([`Message::Missed`]) within a few intervals; and a key quiet
    /// that long is repaired as before. Without this, under steady load every bucket differs
    /// at every instant and each round resent whole buckets of keys both sides were about to
    /// agree on. `None` (every key of the bucket is sent) for two anti-entropy intervals
    /// after this node caught the peer up after a silence: what the silence lost is then no
    /// gossip in flight, and the catch-up leaves to anti-entropy what it no longer knows it
    /// sent (a cut longer than the sent keys it remembers).
    fn settled_before(&self, i: usize, now: Millis) -> Option<Millis> {
        let window = 2 * self.cfg.anti_entropy_interval;
        (now >= self.peer[i].caught_up.saturating_add(window)).then(|| now.saturating_sub(window))
    }

    /// The latest of this node's batches `from` acknowledged. With regional gossip, a node
    /// of another region has at least what its region acknowledged: the nodes there that
    /// hear us relay what they receive to it. So a new gateway, or a node of that region we
    /// no longer gossip with (its own acknowledgement long stale), is caught up with what
    /// its region missed, not with every key since it last acknowledged us directly (that
    /// was every key this node held, each time such a node's occasional list or digest
    /// came after a "silence": 10,000 full states every ~2 s per such pair in a 3 × 2
    /// cluster under load).
    pub(super) fn acked_by(&self, from: NodeIdx) -> Millis {
        let own = self.peer[usize::from(from.0)].acked_ms;
        let replicas = &self.cfg.replicas;
        let region = replicas.region_of(from);
        if self.cfg.topology == Topology::Mesh || region == replicas.region_of(self.cfg.me) {
            return own;
        }
        replicas
            .region_nodes(region)
            .iter()
            .map(|n| self.peer[usize::from(n.0)].acked_ms)
            .fold(own, Millis::max)
    }
}
