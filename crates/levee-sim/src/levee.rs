//! Levee itself in the simulator: every node is a production [`Cluster`] state machine with
//! its [`MemoryStates`], driven tick by tick on its own skewed clock, exchanging real frames
//! (`levee_proto::encode_frame` / `decode_frame`) over the simulated network.
//!
//! ## How a request is decided
//!
//! As a node does it (`levee-node`'s `App::check`): a request arrives at a random live node
//! of its region (the load balancer), which asks its machine where it is decided
//! ([`Cluster::route`]): there if it owns the key; alone (`acting_alone`) if the owner is
//! unreachable; otherwise the check is forwarded ([`Cluster::forward`]) over the simulated
//! network like every other message, with the region's latency, loss and duplication, and
//! the owner decides it when it arrives. If no answer comes within `forward_timeout` (the
//! owner crashed, or the message or its answer was lost) the receiving node decides alone
//! too, as a node does; the owner may then have admitted the check as well.
//!
//! ## Crashes
//!
//! A crash clears the node's [`MemoryStates`] and drops everything sent to it; a restart
//! builds a new [`Cluster`] with [`Cluster::new`] (which asks every peer for a full pull; the
//! node is `recovering` until one answers) and a new connection generation, so messages
//! meant for the old process are lost.

use std::collections::{BTreeMap, HashMap};

use levee_cluster::memory::MemoryStates;
use levee_cluster::{Cluster, ClusterConfig, Event, ForwardId, Route};
use levee_core::Decision;
use levee_core::{
    ClusterView, Consistency, KeyCrdt, Lattice, NodeIdx, RegionIdx, ReplicaSet, Rule, RuleSpec,
};
use levee_proto::{ForwardCheck, ForwardDecision, Message, decode_frame, encode_frame};
use levee_testkit::rng::SeededRng as SimRng;

pub use crate::experiment::SyncGen;
use crate::heal::{HealFigure, HealWatch};
use crate::ledger::{LastAdmission, Ledger, NodeRights};
use crate::net::{NetStats, SimNet};
use crate::plan::{FaultKind, MAX_REGIONS, RULE, RunPlan, T0, WINDOW_MS};

/// What a run of Levee produced.
#[derive(Debug, Clone)]
pub struct LeveeResult {
    /// Every key's windows.
    pub ledger: Ledger,
    /// Agreement after every heal of a partition.
    pub heals: Vec<HealFigure>,
    /// What the network did.
    pub net: NetStats,
    /// Frames or states the clusters refused (should be none: every frame is well formed).
    pub refused: u64,
    /// Anything that should never happen (a frame that fails to encode or decode, an
    /// unknown rule): reported as failures.
    pub errors: Vec<String>,
    /// For the main key, by window: every node's rights as it saw them when its clock left
    /// the window (for a replay's report).
    pub rights: BTreeMap<u64, Vec<Option<NodeRights>>>,
    /// Every live node's state of the probe key when the run ended (for a replay's report).
    pub probe_views: Vec<Option<KeyCrdt>>,
}

/// How long a forwarded check may wait for its owner, as a node has it.
const FORWARD_TIMEOUT_MAX: u64 = 500;

/// The rule every run enforces.
pub fn rule(limit: u64) -> Rule {
    RuleSpec::fixed_window(RULE, limit, WINDOW_MS)
        .validate()
        .expect("the simulator's rule is valid")
}

struct SimNode {
    cluster: Cluster,
    states: MemoryStates,
    offset: i64,
    up: bool,
    incarnation: u32,
    synced: bool,
    /// Own entries at the last crash, by (key, window): (consumed, given), kept until the
    /// node has pulled again.
    crash_memory: BTreeMap<(u32, u64), (u64, u64)>,
    /// [`SyncGen::PerExchange`]: the generation, when it last advanced, and the regions
    /// heard from since.
    exchange: (u64, u64, u64),
    /// By peer: the latest send time of the peer's deltas this node has received.
    heard: Vec<u64>,
}

struct Driver<'p> {
    plan: &'p RunPlan,
    mode: Consistency,
    replicas: ReplicaSet,
    members: Vec<Vec<usize>>,
    region_limits: Vec<u64>,
    nodes: Vec<SimNode>,
    net: SimNet<Vec<u8>>,
    route_rng: SimRng,
    phase: Vec<u64>,
    ledger: Ledger,
    watches: Vec<HealWatch>,
    errors: Vec<String>,
    now: u64,
    split: Vec<u64>,
    epoch_seen: Vec<u64>,
    rights: BTreeMap<u64, Vec<Option<NodeRights>>>,
    sync: SyncGen,
    /// Checks forwarded and not yet answered, by (forwarding node, batch id): the region
    /// they were asked in and the key.
    forwarded: BTreeMap<(usize, ForwardId), (usize, u32)>,
    /// Key names to their index in the plan.
    key_index: HashMap<String, u32>,
}

/// Runs Levee in `mode` over `plan`, as production runs.
pub fn run_levee(plan: &RunPlan, mode: Consistency) -> LeveeResult {
    run_levee_with(plan, mode, SyncGen::Production)
}

/// Runs Levee in `mode` over `plan`, with `sync_gen` fed as `sync`.
pub fn run_levee_with(plan: &RunPlan, mode: Consistency, sync: SyncGen) -> LeveeResult {
    let mut d = Driver::new(plan, mode);
    d.sync = sync;
    d.run();
    d.finish()
}

impl<'p> Driver<'p> {
    fn new(plan: &'p RunPlan, mode: Consistency) -> Driver<'p> {
        let replicas = plan.topology.replica_set();
        let region_of = plan.topology.region_of();
        let n = region_of.len();
        let mut phase_rng = SimRng::stream(plan.seed, "phase");
        let phase = (0..n)
            .map(|_| phase_rng.below(plan.protocol.gossip_interval))
            .collect();
        let net = SimNet::new(
            &plan.topology,
            plan.net.clone(),
            region_of.clone(),
            SimRng::stream(plan.seed, mode.as_str()),
        );
        let mut d = Driver {
            plan,
            mode,
            members: plan.topology.members(),
            region_limits: plan.region_limits(),
            nodes: Vec::with_capacity(n),
            net,
            route_rng: SimRng::stream(plan.seed, "route"),
            phase,
            ledger: Ledger::new(n),
            watches: Vec::new(),
            errors: Vec::new(),
            now: 0,
            split: replicas.split(plan.limit),
            epoch_seen: plan
                .offsets
                .iter()
                .map(|&o| (T0 as i64 + o) as u64 / WINDOW_MS)
                .collect(),
            rights: BTreeMap::new(),
            sync: SyncGen::Production,
            forwarded: BTreeMap::new(),
            key_index: plan
                .keys
                .iter()
                .enumerate()
                .map(|(i, k)| (k.clone(), i as u32))
                .collect(),
            replicas,
        };
        for i in 0..n {
            let offset = plan.offsets[i];
            let cluster = Cluster::new(d.config(i), d.clock_at(offset));
            let states = MemoryStates::new(
                NodeIdx(i as u16),
                d.replicas.clone(),
                vec![rule(plan.limit)],
            );
            d.nodes.push(SimNode {
                synced: cluster.is_synced(),
                cluster,
                states,
                offset,
                up: true,
                incarnation: 0,
                crash_memory: BTreeMap::new(),
                exchange: (0, 0, 0),
                heard: vec![0; n],
            });
        }
        for i in 0..n {
            d.flush(i);
        }
        d
    }

    /// Node `me`'s configuration for a machine started now: its gossip intervals end on
    /// its seeded phase (sim ms ≡ `phase[me]` modulo the interval), whenever it starts.
    fn config(&self, me: usize) -> ClusterConfig {
        let p = &self.plan.protocol;
        let g = p.gossip_interval;
        ClusterConfig {
            me: NodeIdx(me as u16),
            replicas: self.replicas.clone(),
            consistency: self.mode,
            gossip_interval: g,
            suspect_after: p.suspect_after,
            anti_entropy_interval: p.anti_entropy_interval,
            forward_timeout: p.suspect_after.min(FORWARD_TIMEOUT_MAX),
            tick_phase: (self.phase[me] + g - self.now % g) % g,
        }
    }

    fn clock_at(&self, offset: i64) -> u64 {
        (T0 as i64 + self.now as i64 + offset) as u64
    }

    /// Node `n`'s clock now.
    fn clock(&self, n: usize) -> u64 {
        self.clock_at(self.nodes[n].offset)
    }

    fn run(&mut self) {
        let plan = self.plan;
        let mut next_fault = 0;
        let mut next_request = 0;
        for now in 0..plan.duration_ms {
            self.now = now;
            while next_fault < plan.faults.len() && plan.faults[next_fault].at <= now {
                self.apply(plan.faults[next_fault].kind);
                next_fault += 1;
            }
            self.start_watches();
            self.deliver();
            for n in 0..self.nodes.len() {
                let t = self.clock(n);
                if self.nodes[n].up && t >= self.nodes[n].cluster.poll_timeout() {
                    let node = &mut self.nodes[n];
                    node.cluster.handle_timeout(t, &mut node.states);
                    self.flush(n);
                }
            }
            self.deliver();
            while next_request < plan.requests.len() && plan.requests[next_request].at <= now {
                let r = plan.requests[next_request];
                self.request(r.region as usize, r.key);
                next_request += 1;
            }
            self.watch();
            self.note_windows();
        }
    }

    /// Records every node's rights for the main key as its clock leaves a window.
    fn note_windows(&mut self) {
        let n_nodes = self.nodes.len();
        for n in 0..n_nodes {
            let e = self.clock(n) / WINDOW_MS;
            if e <= self.epoch_seen[n] {
                continue;
            }
            let done = self.epoch_seen[n];
            self.epoch_seen[n] = e;
            let me = NodeIdx(n as u16);
            let node = &self.nodes[n];
            let slot = node
                .states
                .state(RULE, &self.plan.keys[0])
                .and_then(|c| c.slot(done));
            let r = NodeRights {
                up: node.up,
                split: self.split[n],
                received: slot.map_or(0, |s| s.transfers.received_by(me)),
                given: slot.map_or(0, |s| s.transfers.given_by(me)),
                consumed: slot
                    .and_then(|s| s.tallies.get(me))
                    .map_or(0, |t| t.consumed),
            };
            self.rights
                .entry(done)
                .or_insert_with(|| vec![None; n_nodes])[n] = Some(r);
        }
    }

    fn finish(self) -> LeveeResult {
        let refused = self.nodes.iter().map(|n| n.cluster.refused()).sum();
        let probe_views = match self.plan.probe {
            Some(p) => self
                .nodes
                .iter()
                .map(|n| {
                    n.up.then(|| n.states.state(RULE, &self.plan.keys[p as usize]).cloned())
                        .flatten()
                })
                .collect(),
            None => Vec::new(),
        };
        LeveeResult {
            ledger: self.ledger,
            heals: self.watches.into_iter().map(HealWatch::figure).collect(),
            net: self.net.stats,
            refused,
            errors: self.errors,
            rights: self.rights,
            probe_views,
        }
    }

    fn apply(&mut self, fault: FaultKind) {
        match fault {
            FaultKind::Cut { from, to } => {
                self.note_in_flight(from, to);
                self.net.set_cut(from, to, true);
            }
            FaultKind::Mend { from, to } => self.net.set_cut(from, to, false),
            FaultKind::Crash { node } => {
                if !self.nodes[node].up {
                    return;
                }
                // Remember what the node knew of its own entries, to measure what it forgets.
                let mut memory = std::mem::take(&mut self.nodes[node].crash_memory);
                let me = NodeIdx(node as u16);
                for (k, name) in self.plan.keys.iter().enumerate() {
                    let Some(crdt) = self.nodes[node].states.state(RULE, name) else {
                        continue;
                    };
                    for slot in &crdt.slots {
                        let consumed = slot.tallies.get(me).map_or(0, |t| t.consumed);
                        let given = slot.transfers.given_by(me);
                        let m = memory.entry((k as u32, slot.epoch)).or_default();
                        m.0 = m.0.max(consumed);
                        m.1 = m.1.max(given);
                    }
                }
                // Checks it forwarded die with it: nobody answers their clients.
                self.forwarded.retain(|&(entry, _), _| entry != node);
                let n = &mut self.nodes[node];
                n.crash_memory = memory;
                n.states.clear();
                n.up = false;
            }
            FaultKind::Restart { node, offset } => {
                if self.nodes[node].up {
                    return;
                }
                self.nodes[node].offset = offset;
                let cluster = Cluster::new(self.config(node), self.clock(node));
                let n = &mut self.nodes[node];
                n.synced = cluster.is_synced();
                n.exchange = (0, 0, 0);
                n.heard.iter_mut().for_each(|h| *h = 0);
                n.cluster = cluster;
                n.up = true;
                n.incarnation += 1;
                self.flush(node);
            }
        }
    }

    /// Optimistic mode, as the link from region `from` to region `to` is cut: the usage of
    /// `from`'s nodes that some live node of `to` has not merged yet, for every key and every
    /// window a clock is in: what is in flight when this part of the partition begins.
    fn note_in_flight(&mut self, from: usize, to: usize) {
        if self.mode != Consistency::Optimistic {
            return;
        }
        let receivers: Vec<usize> = self.members[to]
            .iter()
            .copied()
            .filter(|&m| self.nodes[m].up)
            .collect();
        if receivers.is_empty() {
            return;
        }
        let clocks: Vec<u64> = (0..self.nodes.len())
            .map(|n| self.clock(n) / WINDOW_MS)
            .collect();
        let (lo, hi) = (
            clocks.iter().copied().min().unwrap_or(0),
            clocks.iter().copied().max().unwrap_or(0),
        );
        for (k, name) in self.plan.keys.iter().enumerate() {
            for w in lo..=hi {
                let mut unseen = 0;
                for &n in &self.members[from] {
                    let truth = self.ledger.truth(k as u32, w, n);
                    if truth == 0 {
                        continue;
                    }
                    let seen = receivers
                        .iter()
                        .map(|&m| {
                            self.nodes[m]
                                .states
                                .state(RULE, name)
                                .and_then(|c| c.slot(w))
                                .and_then(|s| s.tallies.get(NodeIdx(n as u16)))
                                .map_or(0, |t| t.net())
                        })
                        .min()
                        .unwrap_or(0);
                    unseen += truth.saturating_sub(seen);
                }
                if unseen > 0 {
                    self.ledger.book(k as u32, w).in_flight_at_cuts += unseen;
                }
            }
        }
    }

    /// Hands every message node `n` queued to the network, through the real codec, and acts
    /// on what it reported.
    fn flush(&mut self, n: usize) {
        loop {
            self.transmit(n);
            let Some(event) = self.nodes[n].cluster.poll_event() else {
                return;
            };
            match event {
                Event::Synced => self.note_sync(n),
                Event::ForwardReceived { from, id, checks } => {
                    self.decide_forwarded(n, from, id, &checks);
                }
                Event::ForwardAnswered { id, .. } => {
                    self.forwarded.remove(&(n, id));
                }
                Event::ForwardFailed { id } => {
                    // The owner did not answer in time: decide alone, as a node does.
                    if let Some((region, key)) = self.forwarded.remove(&(n, id)) {
                        self.decide(n, region, key, true);
                    }
                }
                _ => {}
            }
        }
    }

    fn transmit(&mut self, n: usize) {
        while let Some(out) = self.nodes[n].cluster.poll_transmit() {
            let to = usize::from(out.to.0);
            match encode_frame(&out.msg) {
                Ok(frame) => {
                    let inc = self.nodes[to].incarnation;
                    let ack = self.nodes[n].heard[to];
                    self.net.send_tagged(self.now, n, to, inc, ack, frame);
                }
                Err(e) => self.errors.push(format!("node {n}: encode failed: {e}")),
            }
        }
    }

    /// Delivers every message due now.
    fn deliver(&mut self) {
        while let Some(m) = self.net.pop_due(self.now) {
            let to = m.to;
            if !self.nodes[to].up || self.nodes[to].incarnation != m.incarnation {
                continue;
            }
            let msg = match decode_frame(&m.payload) {
                Ok(msg) => msg,
                Err(e) => {
                    self.errors.push(format!("node {to}: decode failed: {e}"));
                    continue;
                }
            };
            if matches!(msg, Message::Deltas(_) | Message::PullChunk { .. }) {
                let heard = &mut self.nodes[to].heard[m.from];
                *heard = (*heard).max(m.sent);
                match self.sync {
                    SyncGen::Production => {}
                    SyncGen::PerExchange => self.note_exchange(to, m.from, m.sent),
                    SyncGen::PerRoundTrip => self.note_exchange(to, m.from, m.tag),
                }
            }
            let t = self.clock(to);
            let node = &mut self.nodes[to];
            node.cluster
                .handle_message(NodeIdx(m.from as u16), msg, t, &mut node.states);
            self.flush(to);
        }
    }

    /// The experiments of [`SyncGen`]: a delta from `from` reached `to`; `since` is when it
    /// was sent (per exchange) or the send time of the latest of `to`'s deltas `from` had
    /// heard when it sent it (per round trip).
    fn note_exchange(&mut self, to: usize, from: usize, since: u64) {
        let region = self.plan.topology.region_of()[from];
        let own = self.plan.topology.region_of()[to];
        let view = self.nodes[to].cluster.view();
        let node = &mut self.nodes[to];
        if region == own || since < node.exchange.1 {
            return;
        }
        node.exchange.2 |= 1 << region;
        let complete = (0..self.members.len()).all(|r| {
            r == own
                || view.unreachable.contains(RegionIdx(r as u16))
                || node.exchange.2 & (1 << r) != 0
        });
        if complete {
            node.exchange = (node.exchange.0 + 1, self.now, 0);
        }
    }

    /// When a restarted node has pulled, measures what it forgot, in two parts: what no live
    /// node knew any more (its own consumption and gifts that had not been gossiped: lost
    /// with the crash, which the design accepts) and what live peers knew but the node did
    /// not get back before it started deciding (which nothing excuses).
    fn note_sync(&mut self, n: usize) {
        let node = &mut self.nodes[n];
        if node.synced || !node.cluster.is_synced() {
            return;
        }
        node.synced = true;
        let memory = std::mem::take(&mut node.crash_memory);
        let me = NodeIdx(n as u16);
        let entry = |m: usize, k: u32, epoch: u64| -> (u64, u64) {
            let slot = self.nodes[m]
                .states
                .state(RULE, &self.plan.keys[k as usize])
                .and_then(|c| c.slot(epoch));
            (
                slot.and_then(|s| s.tallies.get(me))
                    .map_or(0, |t| t.consumed),
                slot.map_or(0, |s| s.transfers.given_by(me)),
            )
        };
        // Only windows the node can still admit in matter: earlier ones are over (and their
        // slots have left the peers' retention, so comparing them would count as lost what
        // is merely old).
        let current = self.clock(n) / WINDOW_MS;
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
            let unrecovered = peer_c.saturating_sub(own_c) + peer_g.saturating_sub(own_g);
            found.push((k, epoch, lost, unrecovered));
        }
        for (k, epoch, lost, unrecovered) in found {
            let book = self.ledger.book(k, epoch);
            book.forgotten += lost;
            book.unrecovered += unrecovered;
        }
    }

    fn request(&mut self, region: usize, key: u32) {
        let name = &self.plan.keys[key as usize];
        let live: Vec<usize> = self.members[region]
            .iter()
            .copied()
            .filter(|&n| self.nodes[n].up)
            .collect();
        if live.is_empty() {
            // Nobody to ask: the request fails.
            let window = (T0 + self.now) / WINDOW_MS;
            self.ledger.demand(key, window, region);
            return;
        }
        let entry = live[self.route_rng.index(live.len())];
        let t = self.clock(entry);
        self.ledger.demand(key, t / WINDOW_MS, region);
        match self.nodes[entry].cluster.route(name.as_bytes()) {
            Route::Local => self.decide(entry, region, key, false),
            Route::Alone => self.decide(entry, region, key, true),
            Route::Owner(owner) => {
                let check = ForwardCheck {
                    rule: RULE.to_owned(),
                    key: name.clone(),
                    cost: 1,
                    class: None,
                    dry_run: false,
                    idempotency_key: None,
                    refund: false,
                };
                let id = self.nodes[entry].cluster.forward(owner, vec![check], t);
                self.forwarded.insert((entry, id), (region, key));
                self.flush(entry);
                None
            }
        };
    }

    /// Decides one check of `key`, asked in `region`, at `node`; `acting_alone` when the
    /// key's owner could not decide it.
    fn decide(
        &mut self,
        node: usize,
        region: usize,
        key: u32,
        acting_alone: bool,
    ) -> Option<Decision> {
        let name = &self.plan.keys[key as usize];
        let mut view = self.nodes[node].cluster.view();
        view.acting_alone = acting_alone;
        if self.sync != SyncGen::Production {
            view.sync_gen = self.nodes[node].exchange.0;
        }
        let t = self.clock(node);
        let window = t / WINDOW_MS;
        let Some(decision) = self.nodes[node].states.decide(RULE, name, 1, t, view) else {
            self.errors
                .push(format!("node {node}: no decision for key {name}"));
            return None;
        };
        if decision.allowed {
            self.ledger.admit(key, window, region, node);
            if self.mode == Consistency::Optimistic {
                self.record_slack(node, key, window, region, view);
            }
        }
        Some(decision)
    }

    /// Node `n`, as a key's owner, decides the checks a region-mate forwarded, and answers.
    fn decide_forwarded(
        &mut self,
        n: usize,
        from: NodeIdx,
        id: ForwardId,
        checks: &[ForwardCheck],
    ) {
        let region = self.plan.topology.region_of()[n];
        let mut decisions = Vec::with_capacity(checks.len());
        for c in checks {
            let decision = match self.key_index.get(c.key.as_str()) {
                Some(&key) => self.decide(n, region, key, false),
                None => None,
            };
            decisions.push(decision.map(|d| ForwardDecision {
                allowed: d.allowed,
                would_allow: d.would_allow,
                limit: d.limit,
                remaining: d.remaining,
                reset_after_ms: d.reset_after_ms,
                retry_after_ms: d.retry_after_ms,
                degraded: d.degraded,
            }));
        }
        let t = self.clock(n);
        self.nodes[n].cluster.answer_forward(from, id, decisions, t);
    }

    /// Optimistic mode: what the deciding node had not accounted for at this admission.
    fn record_slack(
        &mut self,
        node: usize,
        key: u32,
        window: u64,
        region: usize,
        view: ClusterView,
    ) {
        let name = &self.plan.keys[key as usize];
        let slot = self.nodes[node]
            .states
            .state(RULE, name)
            .and_then(|c| c.slot(window));
        let mut last = LastAdmission {
            at: self.now,
            ..LastAdmission::default()
        };
        for (r, members) in self.members.iter().enumerate() {
            let seen: u64 = members
                .iter()
                .map(|&n| {
                    slot.and_then(|s| s.tallies.get(NodeIdx(n as u16)))
                        .map_or(0, |t| t.net())
                })
                .sum();
            let truth: u64 = members
                .iter()
                .map(|&n| self.ledger.truth(key, window, n))
                .sum();
            let unreachable =
                r != region && (view.recovering || view.unreachable.contains(RegionIdx(r as u16)));
            let assumed = if unreachable {
                seen.max(self.region_limits[r])
            } else {
                seen
            };
            last.slack += truth.saturating_sub(assumed);
            last.unseen[r] = truth.saturating_sub(seen);
            if r == region || !self.net.region_cut(r, region) {
                last.connected |= 1 << r;
            }
        }
        debug_assert!(self.members.len() <= MAX_REGIONS);
        self.ledger.set_last(key, window, region, last);
    }

    /// Starts timing agreement on the probe key at every heal.
    fn start_watches(&mut self) {
        let Some(probe) = self.plan.probe else {
            return;
        };
        for ep in &self.plan.episodes {
            if ep.heal != self.now {
                continue;
            }
            let mut watch = HealWatch::new(self.plan, ep);
            let states = self.probe_states(probe, &watch);
            watch.set_before(&states);
            self.watches.push(watch);
        }
    }

    fn probe_states(&self, probe: u32, watch: &HealWatch) -> Vec<KeyCrdt> {
        let name = &self.plan.keys[probe as usize];
        self.nodes
            .iter()
            .filter(|n| n.up)
            .map(|n| watch.normal(n.states.state(RULE, name)))
            .collect()
    }

    fn watch(&mut self) {
        let Some(probe) = self.plan.probe else {
            return;
        };
        for i in 0..self.watches.len() {
            if self.watches[i].done() {
                continue;
            }
            let states = self.probe_states(probe, &self.watches[i]);
            let now = self.now;
            self.watches[i].observe(now, &states);
        }
    }
}

/// Whether `a` holds every entry of `b` (joining `b` into it changes nothing).
pub fn dominates(a: &KeyCrdt, b: &KeyCrdt) -> bool {
    let mut c = a.clone();
    !c.join(b)
}
