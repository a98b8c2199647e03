//! The harness of the protocol tests: nodes wired by an in-memory network that can lose,
//! duplicate and cut links, driven tick by tick with a simulated clock.

#![allow(dead_code)]

use levee_cluster::memory::MemoryStates;
use levee_cluster::{Cluster, ClusterConfig, Topology};
use levee_core::{NodeIdx, ReplicaSet, ReplicaSpec, RuleSpec};
use levee_proto::{Message, decode_frame, encode_frame};
use levee_testkit::net::{InFlightOnCut, Latency, Net as Network};
use levee_testkit::rng::SeededRng;

pub(crate) const T0: u64 = 1_800_000_000_000;
pub(crate) const TICK: u64 = 20;

/// A cluster of nodes and the network between them, whose clock is the cluster's.
pub(crate) struct Net {
    pub(crate) replicas: ReplicaSet,
    pub(crate) nodes: Vec<(Cluster, MemoryStates)>,
    /// Encoded frames between nodes: a fixed latency, no random loss, and cuts that drop what
    /// is sent while they last (what is already on the wire still arrives).
    pub(crate) wire: Network<Vec<u8>>,
    /// Every `k`-th message a node sends is lost (counting every message sent).
    pub(crate) drop_every: Option<u64>,
    pub(crate) sent: u64,
    /// Answers to pulls are lost until this time.
    pub(crate) lose_pull_answers_until: u64,
    /// The next `Deltas` with keys on this link `(from, to)` is lost.
    pub(crate) lose_next_batch: Option<(usize, usize)>,
    /// `ListsBefore` messages are never sent (as by a node of a version before them).
    pub(crate) no_lists_before: bool,
    /// Every `Deltas` and `Heard` message sent: (time, from, to).
    pub(crate) gossip_log: Vec<(u64, usize, usize)>,
}

pub(crate) fn replicas(regions: &[&str], per_region: usize) -> ReplicaSet {
    let weights: Vec<(String, u32)> = regions.iter().map(|r| ((*r).to_owned(), 1)).collect();
    let nodes: Vec<ReplicaSpec> = regions
        .iter()
        .flat_map(|r| {
            (1..=per_region).map(move |i| ReplicaSpec {
                id: format!("{r}-{i}"),
                region: (*r).into(),
                weight: None,
            })
        })
        .collect();
    ReplicaSet::new(&weights, &nodes).unwrap()
}

pub(crate) fn window_rule(limit: u64) -> levee_core::Rule {
    RuleSpec::fixed_window("r", limit, 1_000)
        .validate()
        .unwrap()
}

impl Net {
    pub(crate) fn new(replicas: ReplicaSet, limit: u64) -> Net {
        Net::with_rule(replicas, window_rule(limit))
    }

    pub(crate) fn with_rule(replicas: ReplicaSet, rule: levee_core::Rule) -> Net {
        Net::with(replicas, rule, Topology::Mesh)
    }

    /// A cluster whose nodes gossip by `topology`.
    pub(crate) fn with(replicas: ReplicaSet, rule: levee_core::Rule, topology: Topology) -> Net {
        let all = vec![topology; replicas.len()];
        Net::mixed(replicas, rule, &all)
    }

    /// A cluster whose node `i` gossips by `topologies[i]`.
    pub(crate) fn mixed(
        replicas: ReplicaSet,
        rule: levee_core::Rule,
        topologies: &[Topology],
    ) -> Net {
        Net::mixed_with_anti_entropy(replicas, rule, topologies, 200)
    }

    /// Two regions of one node each, gossiping by mesh, with anti-entropy every
    /// `anti_entropy_ms` (longer than the test runs: none).
    pub(crate) fn pair(rule: levee_core::Rule, anti_entropy_ms: u64) -> Net {
        Net::mixed_with_anti_entropy(
            replicas(&["eu", "us"], 1),
            rule,
            &[Topology::Mesh; 2],
            anti_entropy_ms,
        )
    }

    /// [`Net::mixed`] with anti-entropy every `anti_entropy_ms` (a test that must not rest
    /// on it gives a period longer than it runs).
    pub(crate) fn mixed_with_anti_entropy(
        replicas: ReplicaSet,
        rule: levee_core::Rule,
        topologies: &[Topology],
        anti_entropy_ms: u64,
    ) -> Net {
        let nodes = replicas
            .nodes()
            .map(|me| {
                let topology = topologies[usize::from(me.0)];
                let cfg = ClusterConfig {
                    me,
                    replicas: replicas.clone(),
                    gossip_interval: TICK,
                    suspect_after: 300,
                    anti_entropy_interval: anti_entropy_ms,
                    forward_timeout: 500,
                    tick_phase: 0,
                    topology,
                };
                (
                    Cluster::new(cfg, T0),
                    MemoryStates::new(me, replicas.clone(), vec![rule.clone()]),
                )
            })
            .collect();
        // No random condition is set, so the generator is never drawn from.
        let mut wire = Network::new(replicas.len(), SeededRng::new(0));
        wire.set_latency(Latency::fixed(5));
        wire.set_in_flight_on_cut(InFlightOnCut::Delivered);
        wire.advance_to(T0);
        let mut net = Net {
            replicas,
            nodes,
            wire,
            drop_every: None,
            sent: 0,
            lose_pull_answers_until: 0,
            lose_next_batch: None,
            no_lists_before: false,
            gossip_log: Vec::new(),
        };
        net.flush();
        net
    }

    /// The cluster's time.
    pub(crate) fn now(&self) -> u64 {
        self.wire.now()
    }

    /// Every link's one-way latency from now on.
    pub(crate) fn set_latency(&mut self, ms: u64) {
        self.wire.set_latency(Latency::fixed(ms));
    }

    /// Moves every queued message onto the wire, through the real codec.
    pub(crate) fn flush(&mut self) {
        for from in 0..self.nodes.len() {
            while let Some(out) = self.nodes[from].0.poll_transmit() {
                self.sent += 1;
                let to = usize::from(out.to.0);
                if matches!(out.msg, Message::Deltas(_) | Message::Heard { .. }) {
                    self.gossip_log.push((self.now(), from, to));
                }
                let lost_answer = matches!(out.msg, Message::PullChunk { .. })
                    && self.now() < self.lose_pull_answers_until;
                let lost_batch = matches!(&out.msg, Message::Deltas(b) if !b.keys.is_empty())
                    && self.lose_next_batch == Some((from, to));
                if lost_batch {
                    self.lose_next_batch = None;
                }
                let unknown =
                    matches!(out.msg, Message::ListsBefore { .. }) && self.no_lists_before;
                if lost_answer
                    || lost_batch
                    || unknown
                    || self.drop_every.is_some_and(|k| self.sent.is_multiple_of(k))
                {
                    continue;
                }
                let frame = encode_frame(&out.msg).unwrap();
                self.wire.send(from, to, frame);
            }
        }
    }

    pub(crate) fn deliver_due(&mut self) {
        while let Some(m) = self.wire.pop_due() {
            let msg: Message = decode_frame(&m.msg).unwrap();
            let now = self.now();
            let (cluster, store) = &mut self.nodes[m.to];
            cluster.handle_message(NodeIdx(m.from as u16), msg, now, store);
            self.flush();
        }
    }

    pub(crate) fn run(&mut self, ms: u64) {
        let end = self.now() + ms;
        while self.now() < end {
            self.wire.advance(1);
            self.deliver_due();
            let now = self.now();
            if (now - T0).is_multiple_of(TICK) {
                for (cluster, store) in &mut self.nodes {
                    cluster.handle_timeout(now, store);
                }
                self.flush();
            }
        }
    }

    /// Lets a freshly started cluster sync: every node is recovering, so each answers the
    /// others' pulls with `PullDeferred`, and they start from what they have once
    /// `suspect_after` (300 ms here) has passed.
    pub(crate) fn start(&mut self) {
        self.run(400);
    }

    pub(crate) fn decide(&mut self, node: usize, key: &str) -> bool {
        let view = self.nodes[node].0.view();
        let now = self.now();
        self.nodes[node]
            .1
            .decide("r", key, 1, now, view)
            .unwrap()
            .allowed
    }

    /// Node `node` restarts with nothing, as a crashed process does: a new `Cluster` (the
    /// harness's configuration, mesh) and an empty store. Its pull goes out at the next flush.
    pub(crate) fn restart(&mut self, node: usize) {
        let replicas = self.replicas.clone();
        self.restart_with(node, replicas);
    }

    /// [`Net::restart`] with `replicas` as the node's configured list.
    pub(crate) fn restart_with(&mut self, node: usize, replicas: ReplicaSet) {
        let cfg = ClusterConfig {
            me: NodeIdx(node as u16),
            replicas,
            gossip_interval: TICK,
            suspect_after: 300,
            anti_entropy_interval: 200,
            forward_timeout: 500,
            tick_phase: 0,
            topology: Topology::Mesh,
        };
        self.nodes[node].0 = Cluster::new(cfg, self.now());
        self.nodes[node].1.clear();
    }

    /// Cuts every link to and from `node`, or mends them all.
    pub(crate) fn isolate(&mut self, node: usize, cut: bool) {
        if cut {
            self.wire.isolate(node);
        } else {
            self.wire.rejoin(node);
        }
    }
}
