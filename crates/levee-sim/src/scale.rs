//! What the gossip protocol costs each node as the cluster grows (`levee-sim
//! --gossip-scale 2x2,5x5,10x10,10x20`): regions × nodes of [`Cluster`] machines with
//! [`MemoryStates`], every frame through the real codec, a steady load over many keys, and per
//! node the messages, bytes and protocol CPU (encode, decode, merge, the interval's work) per
//! second, under both topologies ([`Topology::Mesh`], [`Topology::Regions`]). After the load
//! stops it measures how long every node takes to hold the same state of a sample of keys.
//!
//! The load: each key has a home region (its index modulo the number of regions) and is
//! decided by its owner there, `keys` decisions a second spread evenly over the run, so every
//! key is used about once a second. A rule of 10⁹ per second admits them all: what is measured
//! is the cost of replicating the decisions, not of denying them. The network delivers every
//! frame (1 ms inside a region, 30 ms between regions), without loss.

use std::collections::VecDeque;
use std::time::Instant;

use levee_cluster::memory::MemoryStates;
use levee_cluster::{Cluster, ClusterConfig, Topology};
use levee_core::{NodeIdx, ReplicaSet, ReplicaSpec};
use levee_proto::{decode_frame, encode_frame};

use crate::levee::rule;
use crate::plan::RULE;

/// Latency inside a region, ms.
const LOCAL_MS: u64 = 1;
/// Latency between regions, ms.
const REMOTE_MS: u64 = 30;
/// The clock every node starts at.
const T0: u64 = 1_000_000_000;
/// Load-free time before measuring (every node synced, the first pulls done), ms.
const WARM_MS: u64 = 1_500;
/// Keys whose states are compared after the load stops.
const SAMPLE_KEYS: usize = 200;

/// One layout to measure.
#[derive(Debug, Clone, Copy)]
pub struct Layout {
    /// Regions.
    pub regions: usize,
    /// Nodes per region.
    pub nodes: usize,
}

impl Layout {
    /// `RxN`, e.g. `10x20`.
    pub fn parse(s: &str) -> Option<Layout> {
        let (r, n) = s.split_once(['x', '×'])?;
        let (regions, nodes) = (r.trim().parse().ok()?, n.trim().parse().ok()?);
        let total: usize = regions * nodes;
        (regions > 0 && nodes > 0 && total <= levee_core::MAX_NODES)
            .then_some(Layout { regions, nodes })
    }
}

/// What one layout cost under one topology, per node and second of load.
#[derive(Debug, Clone)]
pub struct ScaleFigure {
    /// The layout.
    pub layout: Layout,
    /// The topology.
    pub topology: Topology,
    /// Keys used.
    pub keys: usize,
    /// Messages sent per node per gossip interval (mean over nodes).
    pub messages_per_interval: f64,
    /// The most messages one node sent per interval.
    pub max_messages_per_interval: f64,
    /// Messages sent per node per second.
    pub messages_per_s: f64,
    /// Bytes sent per node per second.
    pub bytes_per_s: f64,
    /// Key entries sent in deltas per node per second.
    pub entries_per_s: f64,
    /// Protocol CPU per node per second of load, ms (this machine, one thread).
    pub cpu_ms_per_s: f64,
    /// After the load stopped, ms until every node held the same state of the sampled keys
    /// (`None`: not within the time allowed).
    pub converged_ms: Option<u64>,
}

/// Frames in flight, by the millisecond they arrive.
struct Wire {
    slots: VecDeque<Vec<(usize, usize, Vec<u8>)>>,
}

impl Wire {
    fn send(&mut self, delay: u64, from: usize, to: usize, frame: Vec<u8>) {
        let d = delay as usize;
        while self.slots.len() <= d {
            self.slots.push_back(Vec::new());
        }
        self.slots[d].push((from, to, frame));
    }

    fn arrivals(&mut self) -> Vec<(usize, usize, Vec<u8>)> {
        self.slots.pop_front().unwrap_or_default()
    }
}

struct Node {
    cluster: Cluster,
    states: MemoryStates,
    messages: u64,
    bytes: u64,
    entries: u64,
    cpu: std::time::Duration,
}

/// Measures `layout` under `topology` over `seconds` of load.
pub fn measure(layout: Layout, topology: Topology, keys: usize, seconds: u64) -> ScaleFigure {
    let region_names: Vec<String> = (0..layout.regions).map(|r| format!("r{r:02}")).collect();
    let weights: Vec<(String, u32)> = region_names.iter().map(|r| (r.clone(), 1)).collect();
    let specs: Vec<ReplicaSpec> = region_names
        .iter()
        .flat_map(|r| {
            (0..layout.nodes).map(move |j| ReplicaSpec {
                id: format!("{r}-{j}"),
                region: r.clone(),
                weight: None,
            })
        })
        .collect();
    let replicas = ReplicaSet::new(&weights, &specs).expect("a valid layout");
    let gossip_interval = 20;
    let n = specs.len();
    let region_of = |i: usize| i / layout.nodes;
    let mut nodes: Vec<Node> = (0..n)
        .map(|i| {
            let me = NodeIdx(i as u16);
            let cfg = ClusterConfig {
                me,
                replicas: replicas.clone(),
                gossip_interval,
                suspect_after: 1_000,
                anti_entropy_interval: 1_000,
                forward_timeout: 500,
                tick_phase: (i as u64 * 7) % gossip_interval,
                topology,
            };
            Node {
                cluster: Cluster::new(cfg, T0),
                states: MemoryStates::new(me, replicas.clone(), vec![rule(1_000_000_000, 1_000)]),
                messages: 0,
                bytes: 0,
                entries: 0,
                cpu: std::time::Duration::ZERO,
            }
        })
        .collect();
    let key_names: Vec<String> = (0..keys).map(|k| format!("tenant-{k}")).collect();
    let mut wire = Wire {
        slots: VecDeque::new(),
    };
    let load_ms = seconds * 1_000;
    let quiet_ms = 5_000;
    let total_ms = WARM_MS + load_ms + quiet_ms;
    let mut measuring = false;
    let mut converged_ms = None;
    let sample: Vec<usize> = (0..SAMPLE_KEYS.min(keys))
        .map(|i| i * keys / SAMPLE_KEYS.min(keys).max(1))
        .collect();
    let mut next_key = 0usize;
    for ms in 0..total_ms {
        let now = T0 + ms;
        if ms == WARM_MS {
            measuring = true;
            for node in &mut nodes {
                node.messages = 0;
                node.bytes = 0;
                node.entries = 0;
                node.cpu = std::time::Duration::ZERO;
            }
        }
        if ms == WARM_MS + load_ms {
            measuring = false;
        }
        // Frames arriving now.
        for (from, to, frame) in wire.arrivals() {
            let node = &mut nodes[to];
            let started = Instant::now();
            if let Ok(msg) = decode_frame(&frame) {
                node.cluster
                    .handle_message(NodeIdx(from as u16), msg, now, &mut node.states);
            }
            node.cpu += started.elapsed();
        }
        // Decisions at the keys' owners.
        if measuring {
            let due = ((ms - WARM_MS + 1) as usize * keys) / load_ms as usize;
            while next_key < due {
                let k = next_key % keys;
                next_key += 1;
                let home = k % layout.regions;
                let first = home * layout.nodes;
                let owner = usize::from(nodes[first].cluster.owner(key_names[k].as_bytes()).0);
                let node = &mut nodes[owner];
                let view = node.cluster.view();
                node.states.decide(RULE, &key_names[k], 1, now, view);
            }
        }
        // Timers, and every frame queued.
        for (i, node) in nodes.iter_mut().enumerate() {
            let started = Instant::now();
            if now >= node.cluster.poll_timeout() {
                node.cluster.handle_timeout(now, &mut node.states);
            }
            while let Some(out) = node.cluster.poll_transmit() {
                let Ok(frame) = encode_frame(&out.msg) else {
                    continue;
                };
                let to = usize::from(out.to.0);
                node.messages += 1;
                node.bytes += frame.len() as u64;
                if let levee_proto::Message::Deltas(b) = &out.msg {
                    node.entries += b.keys.len() as u64;
                }
                let delay = if region_of(to) == region_of(i) {
                    LOCAL_MS
                } else {
                    REMOTE_MS
                };
                wire.send(delay, i, to, frame);
            }
            while node.cluster.poll_event().is_some() {}
            node.cpu += started.elapsed();
        }
        if ms >= WARM_MS + load_ms && converged_ms.is_none() && ms % 10 == 0 {
            let agree = sample.iter().all(|&k| {
                let first = nodes[0].states.state(RULE, &key_names[k]);
                nodes[1..]
                    .iter()
                    .all(|n| n.states.state(RULE, &key_names[k]) == first)
            });
            if agree {
                converged_ms = Some(ms - WARM_MS - load_ms);
                break;
            }
        }
    }
    let secs = load_ms as f64 / 1_000.0;
    let intervals = load_ms as f64 / gossip_interval as f64;
    let mean = |f: &dyn Fn(&Node) -> f64| nodes.iter().map(f).sum::<f64>() / n as f64;
    ScaleFigure {
        layout,
        topology,
        keys,
        messages_per_interval: mean(&|x| x.messages as f64) / intervals,
        max_messages_per_interval: nodes.iter().map(|x| x.messages).max().unwrap_or(0) as f64
            / intervals,
        messages_per_s: mean(&|x| x.messages as f64) / secs,
        bytes_per_s: mean(&|x| x.bytes as f64) / secs,
        entries_per_s: mean(&|x| x.entries as f64) / secs,
        cpu_ms_per_s: mean(&|x| x.cpu.as_secs_f64() * 1_000.0) / secs,
        converged_ms,
    }
}

/// The figures as a markdown table, each regional row beside its mesh row.
pub fn render(figures: &[ScaleFigure]) -> String {
    let mut out = String::from(
        "| layout | nodes | topology | msgs / node / interval (max) | msgs / node / s | key entries / node / s | kB / node / s | protocol CPU / node, ms per s | converged after load, ms |\n|---|---|---|---|---|---|---|---|---|\n",
    );
    for f in figures {
        let topo = match f.topology {
            Topology::Mesh => "mesh",
            Topology::Regions => "regions",
        };
        out.push_str(&format!(
            "| {}×{} | {} | {} | {:.1} ({:.1}) | {:.0} | {:.0} | {:.1} | {:.1} | {} |\n",
            f.layout.regions,
            f.layout.nodes,
            f.layout.regions * f.layout.nodes,
            topo,
            f.messages_per_interval,
            f.max_messages_per_interval,
            f.messages_per_s,
            f.entries_per_s,
            f.bytes_per_s / 1_000.0,
            f.cpu_ms_per_s,
            f.converged_ms
                .map_or_else(|| "not within 5 s".to_owned(), |t| t.to_string()),
        ));
    }
    out
}
