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
use levee_core::{KeyCrdt, Lattice, NodeIdx, ReplicaSet, Rule, RuleSpec};
use levee_proto::{ForwardCheck, ForwardDecision, decode_frame, encode_frame};
use levee_testkit::rng::SeededRng;

use crate::heal::{HealFigure, HealWatch};
use crate::ledger::{Ledger, NodeRights};
use crate::net::{NetStats, SimNet};
use crate::plan::{FaultKind, RULE, RunPlan, T0};

mod network;
mod requests;
mod watch;
pub use watch::dominates;

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
pub fn rule(limit: u64, window_ms: u64) -> Rule {
    RuleSpec::fixed_window(RULE, limit, window_ms)
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
}

struct Driver<'p> {
    plan: &'p RunPlan,
    replicas: ReplicaSet,
    members: Vec<Vec<usize>>,
    nodes: Vec<SimNode>,
    net: SimNet<Vec<u8>>,
    route_rng: SeededRng,
    phase: Vec<u64>,
    ledger: Ledger,
    watches: Vec<HealWatch>,
    errors: Vec<String>,
    now: u64,
    split: Vec<u64>,
    epoch_seen: Vec<u64>,
    rights: BTreeMap<u64, Vec<Option<NodeRights>>>,
    /// Checks forwarded and not yet answered, by (forwarding node, batch id): the region
    /// they were asked in and the key.
    forwarded: BTreeMap<(usize, ForwardId), (usize, u32)>,
    /// Key names to their index in the plan.
    key_index: HashMap<String, u32>,
}

/// Runs Levee over `plan`, as production runs.
pub fn run_levee(plan: &RunPlan) -> LeveeResult {
    let mut d = Driver::new(plan);
    d.run();
    d.finish()
}

impl<'p> Driver<'p> {
    fn new(plan: &'p RunPlan) -> Driver<'p> {
        let replicas = plan.topology.replica_set();
        let region_of = plan.topology.region_of();
        let n = region_of.len();
        let mut phase_rng = SeededRng::stream(plan.seed, "phase");
        let phase = (0..n)
            .map(|_| phase_rng.below(plan.protocol.gossip_interval))
            .collect();
        let net = SimNet::new(
            &plan.topology,
            plan.net.clone(),
            region_of.clone(),
            // The stream's name is the mode's from when there were two: the same seed
            // gives the same network as before.
            SeededRng::stream(plan.seed, "strict"),
        );
        let mut d = Driver {
            plan,
            members: plan.topology.members(),
            nodes: Vec::with_capacity(n),
            net,
            route_rng: SeededRng::stream(plan.seed, "route"),
            phase,
            ledger: Ledger::new(n),
            watches: Vec::new(),
            errors: Vec::new(),
            now: 0,
            split: replicas.split(plan.limit),
            epoch_seen: plan
                .offsets
                .iter()
                .map(|&o| plan.window_of((T0 as i64 + o) as u64))
                .collect(),
            rights: BTreeMap::new(),
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
                vec![rule(plan.limit, plan.window_ms)],
            );
            d.nodes.push(SimNode {
                synced: cluster.is_synced(),
                cluster,
                states,
                offset,
                up: true,
                incarnation: 0,
                crash_memory: BTreeMap::new(),
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
        for n in 0..self.nodes.len() {
            let e = self.plan.window_of(self.clock(n));
            if e <= self.epoch_seen[n] {
                continue;
            }
            let done = self.epoch_seen[n];
            self.epoch_seen[n] = e;
            self.note_rights(n, done);
        }
    }

    /// Records node `n`'s rights for the main key in window `done`.
    fn note_rights(&mut self, n: usize, done: u64) {
        let n_nodes = self.nodes.len();
        {
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

    fn finish(mut self) -> LeveeResult {
        // A long window the run ends in is reported too (its clock never left it).
        if self.plan.long_window() {
            for n in 0..self.nodes.len() {
                let e = self.plan.window_of(self.clock(n));
                self.note_rights(n, e);
            }
        }
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
}
