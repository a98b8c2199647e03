//! Levee itself in the simulator: every node is a production [`Cluster`] state machine with
//! its key states ([`SimStates`]: `levee_cluster::memory::MemoryStates` with the node's
//! rebinding of its rule), driven tick by tick on its own skewed clock, exchanging real frames
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
//! ## Membership
//!
//! Every node binds its rule to its own machine's [`Cluster::spending`] and rebinds it on
//! `Event::SharesChanged`, a grown share waiting as the node's does ([`SimStates`]). A node
//! added to the list starts with [`FaultKind::Start`]; a reload is [`Cluster::change_list`];
//! a message from a node the receiver's list does not hold is dropped, as the node's
//! transport drops frames from an id it does not know. See [`members`].
//!
//! ## Crashes
//!
//! A crash clears the node's [`SimStates`] and drops everything sent to it; a restart
//! builds a new [`Cluster`] with [`Cluster::new`] (which asks every peer for a full pull; the
//! node is `recovering` until one answers) and a new connection generation, so messages
//! meant for the old process are lost.

use std::collections::{BTreeMap, HashMap};

use levee_cluster::{Cluster, ClusterConfig, Event, ForwardId, Route};
use levee_core::Decision;
use levee_core::{KeyCrdt, Lattice, NodeIdx, ReplicaSet, Rule, RuleSpec};
use levee_proto::{ForwardCheck, ForwardDecision, Message, decode_frame, encode_frame};
use levee_testkit::rng::SeededRng;

use crate::heal::{HealFigure, HealWatch};
use crate::ledger::{Ledger, NodeRights};
use crate::net::{NetStats, SimNet};
use crate::plan::{FaultKind, RULE, RunPlan, T0};

pub mod members;
mod network;
mod requests;
mod states;
mod waiting;
mod watch;
pub use members::{Ghost, ListsFigure};
pub use states::{SimStates, refund_measured};
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
    /// Frames or states the clusters refused (should be none: every frame is well formed),
    /// beside states naming a node the receiver does not list yet
    /// ([`ListsFigure::unknown_node_states`]).
    pub refused: u64,
    /// Anything that should never happen (a frame that fails to encode or decode, an
    /// unknown rule): reported as failures.
    pub errors: Vec<String>,
    /// For the main key, by window: every node's rights as it saw them when its clock left
    /// the window (for a replay's report).
    pub rights: BTreeMap<u64, Vec<Option<NodeRights>>>,
    /// Every live node's state of the probe key when the run ended (for a replay's report).
    pub probe_views: Vec<Option<KeyCrdt>>,
    /// The node lists: how the runs' changes settled, and where they stood at the end.
    pub lists: ListsFigure,
}

/// How long a forwarded check may wait for its owner, as a node has it.
const FORWARD_TIMEOUT_MAX: u64 = 500;

/// A `fixed_window` rule of `limit` per `window_ms` (the classic sets' rule; a plan's own is
/// [`RunPlan::rule`]).
pub fn rule(limit: u64, window_ms: u64) -> Rule {
    RuleSpec::fixed_window(RULE, limit, window_ms)
        .validate()
        .expect("the simulator's rule is valid")
}

struct SimNode {
    cluster: Cluster,
    states: SimStates,
    offset: i64,
    /// Running (started, not crashed).
    up: bool,
    /// Stopped (`SIGSTOP`): no timer, messages wait in `inbox`.
    frozen: bool,
    /// Messages that arrived while frozen: (sender, frame).
    inbox: Vec<(usize, Vec<u8>)>,
    /// The index of the latest list written into its file (what it reads when it starts).
    file: usize,
    incarnation: u32,
    synced: bool,
    /// Own entries at the last crash, by (key, window): (consumed, given), kept until the
    /// node has pulled again.
    crash_memory: BTreeMap<(u32, u64), (u64, u64)>,
    /// When it last crashed (sim ms).
    crashed_at: u64,
}

struct Driver<'p> {
    plan: &'p RunPlan,
    /// Every list of the plan, built once.
    sets: Vec<ReplicaSet>,
    members: Vec<Vec<usize>>,
    /// Every position's region.
    region_of: Vec<usize>,
    nodes: Vec<SimNode>,
    net: SimNet<Vec<u8>>,
    route_rng: SeededRng,
    phase: Vec<u64>,
    ledger: Ledger,
    watches: Vec<HealWatch>,
    errors: Vec<String>,
    now: u64,
    epoch_seen: Vec<u64>,
    lists: ListsFigure,
    /// Frames or states refused by the machines of processes that ended (restarted), beside
    /// states naming a node not listed yet.
    refused: u64,
    rights: BTreeMap<u64, Vec<Option<NodeRights>>>,
    /// Checks forwarded and not yet answered, by (forwarding node, batch id): the region
    /// they were asked in and the key.
    forwarded: BTreeMap<(usize, ForwardId), requests::Ask>,
    /// Refunds due, by sim ms.
    refunds: BTreeMap<u64, Vec<requests::Refund>>,
    /// Key names to their index in the plan.
    key_index: HashMap<String, u32>,
    /// Checks waiting for rights (`max_wait_ms`), see `waiting.rs`.
    waiting: Vec<waiting::Waiter>,
    /// By node: a peer's frame was handed to its machine this millisecond (waiting checks
    /// there look again).
    heard: Vec<bool>,
}

/// Runs Levee over `plan`, as production runs.
pub fn run_levee(plan: &RunPlan) -> LeveeResult {
    let mut d = Driver::new(plan);
    d.run();
    d.finish()
}

impl<'p> Driver<'p> {
    fn new(plan: &'p RunPlan) -> Driver<'p> {
        let sets: Vec<ReplicaSet> = plan.lists.iter().map(|l| l.replica_set()).collect();
        let region_of = plan.node_regions();
        let n = region_of.len();
        let offset = |i: usize| plan.offsets.get(i).copied().unwrap_or(0);
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
        let mut members = vec![Vec::new(); plan.topology.regions()];
        for (i, &r) in region_of.iter().enumerate() {
            members[r].push(i);
        }
        let mut d = Driver {
            plan,
            members,
            region_of: region_of.clone(),
            nodes: Vec::with_capacity(n),
            net,
            route_rng: SeededRng::stream(plan.seed, "route"),
            phase,
            ledger: Ledger::new(n, !plan.algo.per_window() || plan.mixed),
            watches: Vec::new(),
            errors: Vec::new(),
            now: 0,
            epoch_seen: (0..n)
                .map(|i| plan.window_of((T0 as i64 + offset(i)) as u64))
                .collect(),
            lists: ListsFigure::default(),
            refused: 0,
            rights: BTreeMap::new(),
            forwarded: BTreeMap::new(),
            refunds: BTreeMap::new(),
            key_index: plan
                .keys
                .iter()
                .enumerate()
                .map(|(i, k)| (k.clone(), i as u32))
                .collect(),
            sets,
            waiting: Vec::new(),
            heard: vec![false; n],
        };
        let first = plan.lists[0].len();
        for i in 0..n {
            // A node added later is built with the last list, and down until it starts.
            let list = if i < first { 0 } else { plan.lists.len() - 1 };
            let mut cluster = Cluster::new(d.config(i, list), d.clock_at(offset(i)));
            cluster.set_local_first(plan.protocol.local_first);
            let states = SimStates::new(NodeIdx(i as u16), cluster.spending(), plan.rules());
            d.ledger.set_offset(i, 0, offset(i));
            d.nodes.push(SimNode {
                synced: cluster.is_synced(),
                cluster,
                states,
                offset: offset(i),
                up: i < first,
                frozen: false,
                inbox: Vec::new(),
                file: list,
                incarnation: 0,
                crash_memory: BTreeMap::new(),
                crashed_at: 0,
            });
        }
        for i in 0..first {
            d.flush(i);
        }
        d
    }

    /// Node `me`'s configuration for a machine started now: its gossip intervals end on
    /// its seeded phase (sim ms ≡ `phase[me]` modulo the interval), whenever it starts.
    /// Node `me`'s configuration with list `list` of the plan.
    fn config(&self, me: usize, list: usize) -> ClusterConfig {
        let p = &self.plan.protocol;
        let g = p.gossip_interval;
        ClusterConfig {
            me: NodeIdx(me as u16),
            replicas: self.sets[list].clone(),
            gossip_interval: g,
            suspect_after: p.suspect_after,
            anti_entropy_interval: p.anti_entropy_interval,
            forward_timeout: p.suspect_after.min(FORWARD_TIMEOUT_MAX),
            tick_phase: (self.phase[me] + g - self.now % g) % g,
            topology: p.gossip,
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
                let node = &mut self.nodes[n];
                if node.up && !node.frozen && t >= node.cluster.poll_timeout() {
                    node.cluster.handle_timeout(t, node.states.at(t));
                    self.flush(n);
                }
            }
            self.deliver();
            self.serve_waiting();
            self.serve_refunds();
            while next_request < plan.requests.len() && plan.requests[next_request].at <= now {
                let r = plan.requests[next_request];
                self.request(&r);
                next_request += 1;
            }
            self.watch();
            self.note_windows();
            self.note_lists();
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
            let split = node.states.share_at(self.clock(n));
            let state = node.states.state(RULE, &self.plan.keys[0]);
            let slot = state.and_then(|c| c.slot(done));
            // A token bucket or sliding window holds rights without epochs: its continuous
            // holdings, received and given since the key was created.
            let matrix = match (slot, state) {
                (Some(s), _) => Some(&s.transfers),
                (None, Some(c)) if c.slots.is_empty() => Some(&c.holdings),
                _ => None,
            };
            let r = NodeRights {
                up: node.up,
                split,
                received: matrix.map_or(0, |m| m.received_by(me)),
                given: matrix.map_or(0, |m| m.given_by(me)),
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
        self.note_dead();
        // A long window the run ends in is reported too (its clock never left it).
        if self.plan.long_window() {
            for n in 0..self.nodes.len() {
                let e = self.plan.window_of(self.clock(n));
                self.note_rights(n, e);
            }
        }
        for n in 0..self.nodes.len() {
            self.retire(n);
        }
        let refused = self.refused;
        self.end_lists();
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
            lists: self.lists,
        }
    }
}
