//! The simulated network under the nodes: faults applied, frames flushed, sent and
//! delivered, and the bookkeeping of when nodes synced.

use super::*;

impl<'p> Driver<'p> {
    pub(super) fn apply(&mut self, fault: FaultKind) {
        match fault {
            FaultKind::Cut { from, to } => self.net.set_cut(from, to, true),
            FaultKind::Mend { from, to } => self.net.set_cut(from, to, false),
            FaultKind::Crash { node } => {
                if !self.nodes[node].up {
                    return;
                }
                // Remember what the node knew of its own entries, to measure what it forgets.
                let mut memory = std::mem::take(&mut self.nodes[node].crash_memory);
                let me = NodeIdx(node as u16);
                for (lk, rule, k) in crate::mixed::tallied(self.plan) {
                    let name = &self.plan.keys[k as usize];
                    let Some(crdt) = self.nodes[node].states.state(rule, name) else {
                        continue;
                    };
                    for slot in &crdt.slots {
                        let consumed = slot.tallies.get(me).map_or(0, |t| t.consumed);
                        let given = slot.transfers.given_by(me);
                        let m = memory.entry((lk, slot.epoch)).or_default();
                        m.0 = m.0.max(consumed);
                        m.1 = m.1.max(given);
                    }
                }
                // Checks it forwarded die with it: nobody answers their clients.
                self.forwarded.retain(|&(entry, _), _| entry != node);
                let n = &mut self.nodes[node];
                n.crash_memory = memory;
                n.crashed_at = self.now;
                n.states.clear();
                n.up = false;
                n.frozen = false;
                n.inbox.clear();
            }
            FaultKind::Restart { node, offset } => {
                if self.nodes[node].up {
                    return;
                }
                let list = self.nodes[node].file;
                self.start(node, list, offset);
            }
            FaultKind::Start { node, list, offset } => {
                if self.nodes[node].up {
                    return;
                }
                let list = list.max(self.nodes[node].file);
                self.start(node, list, offset);
            }
            FaultKind::Reload { node, list } => self.reload(node, list),
            FaultKind::Freeze { node } => self.nodes[node].frozen = true,
            FaultKind::Thaw { node } => self.thaw(node),
            FaultKind::Leave { node } => {
                if !self.nodes[node].up || self.nodes[node].frozen {
                    return;
                }
                let now = self.clock(node);
                self.nodes[node].cluster.leave(now);
                self.flush(node);
            }
        }
    }

    /// Node `node` starts (again), empty, with list `list`: a new process, a new connection
    /// generation, its rule bound to its configuration's list.
    pub(super) fn start(&mut self, node: usize, list: usize, offset: i64) {
        self.retire(node);
        self.nodes[node].offset = offset;
        let mut cluster = Cluster::new(self.config(node, list), self.clock(node));
        cluster.set_local_first(self.plan.protocol.local_first);
        let states = SimStates::starting(
            NodeIdx(node as u16),
            cluster.spending(),
            self.plan.rules(),
            self.clock(node),
        );
        self.ledger.set_offset(node, self.now, offset);
        let n = &mut self.nodes[node];
        n.synced = cluster.is_synced();
        n.cluster = cluster;
        n.states = states;
        n.file = list;
        n.up = true;
        n.frozen = false;
        n.inbox.clear();
        n.incarnation += 1;
        self.flush(node);
    }

    /// Counts what the process of node `n` refused before it is replaced or the run ends.
    pub(super) fn retire(&mut self, n: usize) {
        let node = &self.nodes[n];
        let unknown = node.states.unknown_node_refusals();
        self.lists.unknown_node_states += unknown;
        self.refused += node.cluster.refused().saturating_sub(unknown);
    }

    /// Hands every message node `n` queued to the network, through the real codec, and acts
    /// on what it reported.
    pub(super) fn flush(&mut self, n: usize) {
        loop {
            self.transmit(n);
            let Some(event) = self.nodes[n].cluster.poll_event() else {
                return;
            };
            match event {
                Event::Synced => self.note_sync(n),
                Event::BequestsSettled(removed) => self.nodes[n].states.settle_bequests(&removed),
                Event::ListsBefore(before) => {
                    let t = self.clock(n);
                    self.nodes[n].states.hold_by_lists_before(&before, t);
                }
                Event::SharesChanged(list) => {
                    // As the node does: bind the rule to the event's list, then to the
                    // machine's current one.
                    let t = self.clock(n);
                    let node = &mut self.nodes[n];
                    node.states.rebind(list, t);
                    node.states.rebind(node.cluster.spending(), t);
                }
                Event::ForwardReceived { from, id, checks } => {
                    self.decide_forwarded(n, from, id, &checks);
                }
                Event::ForwardAnswered { id, .. } => {
                    self.forwarded.remove(&(n, id));
                }
                Event::ForwardFailed { id } => {
                    // The owner did not answer in time: decide alone, as a node does.
                    if let Some(ask) = self.forwarded.remove(&(n, id)) {
                        self.decide(n, ask, true);
                    }
                }
                _ => {}
            }
        }
    }

    pub(super) fn transmit(&mut self, n: usize) {
        while let Some(out) = self.nodes[n].cluster.poll_transmit() {
            let to = usize::from(out.to.0);
            match encode_frame(&out.msg) {
                Ok(frame) => {
                    let inc = self.nodes[to].incarnation;
                    // Forwards have no repair of their own but the timeout: they rely on the
                    // transport's stream, which loses nothing while the connection lives.
                    let reliable = matches!(
                        out.msg,
                        Message::Forward { .. } | Message::ForwardReply { .. }
                    );
                    self.net.send_on(self.now, n, to, inc, frame, reliable);
                }
                Err(e) => self.errors.push(format!("node {n}: encode failed: {e}")),
            }
        }
    }

    /// Delivers every message due now.
    pub(super) fn deliver(&mut self) {
        while let Some(m) = self.net.pop_due(self.now) {
            let to = m.to;
            if !self.nodes[to].up || self.nodes[to].incarnation != m.incarnation {
                continue;
            }
            if self.nodes[to].frozen {
                self.nodes[to].inbox.push((m.from, m.payload));
                continue;
            }
            self.receive(to, m.from, &m.payload);
        }
    }

    /// Node `to` reads a frame from `from`: dropped if its list does not hold `from` (the
    /// node's transport does not know that id), handed to its machine otherwise.
    pub(super) fn receive(&mut self, to: usize, from: usize, payload: &[u8]) {
        if from >= self.nodes[to].cluster.lists().current().len() {
            self.lists.unknown_sender += 1;
            return;
        }
        let msg = match decode_frame(payload) {
            Ok(msg) => msg,
            Err(e) => {
                self.errors.push(format!("node {to}: decode failed: {e}"));
                return;
            }
        };
        let t = self.clock(to);
        let node = &mut self.nodes[to];
        node.cluster
            .handle_message(NodeIdx(from as u16), msg, t, node.states.at(t));
        self.heard[to] = true;
        self.flush(to);
    }

    /// When a restarted node has pulled, measures what it forgot, in two parts: what no live
    /// node knew any more (its own consumption and gifts that had not been gossiped: lost
    /// with the crash, which the design accepts) and what live peers knew but the node did
    /// not get back before it started deciding (which nothing excuses).
    pub(super) fn note_sync(&mut self, n: usize) {
        let node = &mut self.nodes[n];
        if node.synced || !node.cluster.is_synced() {
            return;
        }
        node.synced = true;
        // Only windows the node can still admit in matter: earlier ones are over (and their
        // slots have left the peers' retention, so comparing them would count as lost what
        // is merely old).
        let current = if self.plan.algo == crate::plan::Algo::SlidingLog {
            // A log's slots are milliseconds: those still in the window.
            (self.clock(n) + 1).saturating_sub(self.plan.window_ms)
        } else {
            self.plan.window_of(self.clock(n))
        };
        self.book_forgotten(n, current, true);
    }

    /// At the end of a run, what each node that crashed and never came back forgot: its own
    /// consumption and gifts of the window it crashed in and after that no live node knew.
    /// (Such a node's rights of a long window are its heir's once it is removed,
    /// `levee_core::rule::Bequest`, counted from what the live nodes know: usage it admitted
    /// and never told is admitted again.)
    pub(super) fn note_dead(&mut self) {
        for n in 0..self.nodes.len() {
            if self.nodes[n].up || self.nodes[n].crash_memory.is_empty() {
                continue;
            }
            let from = self.plan.window_of(self.nodes[n].crashed_at);
            self.book_forgotten(n, from, false);
        }
    }

    /// Books what node `n` forgot in its crash of its entries of windows from `current` on
    /// ([`Driver::note_sync`]); `restarted`: it came back and pulled, so what live peers
    /// knew and it did not get back counts as unrecovered.
    fn book_forgotten(&mut self, n: usize, current: u64, restarted: bool) {
        let memory = std::mem::take(&mut self.nodes[n].crash_memory);
        let me = NodeIdx(n as u16);
        let tallied = crate::mixed::tallied(self.plan);
        let rule_of = |lk: u32| tallied.iter().find(|t| t.0 == lk).copied();
        let entry = |m: usize, lk: u32, epoch: u64| -> (u64, u64) {
            let slot = rule_of(lk)
                .and_then(|(_, rule, k)| {
                    self.nodes[m]
                        .states
                        .state(rule, &self.plan.keys[k as usize])
                })
                .and_then(|c| c.slot(epoch));
            (
                slot.and_then(|s| s.tallies.get(me))
                    .map_or(0, |t| t.consumed),
                slot.map_or(0, |s| s.transfers.given_by(me)),
            )
        };
        let mut found = Vec::new();
        for ((k, epoch), (consumed, given)) in
            memory.into_iter().filter(|((_, e), _)| *e >= current)
        {
            let (own_c, own_g) = entry(n, k, epoch);
            let (mut peer_c, mut peer_g) = (0, 0);
            for m in (0..self.nodes.len()).filter(|&m| m != n && self.nodes[m].up) {
                let (c, g) = entry(m, k, epoch);
                peer_c = peer_c.max(c);
                peer_g = peer_g.max(g);
            }
            let lost = consumed.saturating_sub(own_c.max(peer_c))
                + given.saturating_sub(own_g.max(peer_g));
            let unrecovered = if restarted {
                peer_c.saturating_sub(own_c) + peer_g.saturating_sub(own_g)
            } else {
                0
            };
            found.push((k, epoch, lost, unrecovered));
        }
        let at = self.nodes[n].crashed_at;
        for (k, epoch, lost, unrecovered) in found {
            if self.plan.bound_of(k).0.algo.per_window() {
                let book = self.ledger.book(k, epoch);
                book.forgotten += lost;
                book.unrecovered += unrecovered;
            } else if lost > 0 {
                // Rights held continuously: what was lost counts against the timeline around
                // the crash (`crate::algos`), whatever slot it was in.
                self.ledger.forgotten.push((k, at, lost));
            }
        }
    }
}
