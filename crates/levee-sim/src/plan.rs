//! What one run is: the regions and nodes, the network, the clocks, the faults and the demand.
//!
//! A [`RunPlan`] is plain data, drawn from a seed by [`crate::Scenario::plan`] (or built by
//! the accuracy table), and every policy of a run is driven by the same plan: the same
//! requests at the same times, the same cuts and crashes.

use levee_core::hash::fnv1a;
use levee_core::{ReplicaSet, ReplicaSpec};

use crate::lists::NodeList;
use crate::scenario::Scenario;

/// Simulated time 0, in Unix milliseconds: a node's clock reads `T0 + sim time + offset`.
/// Aligned to every window, and far from zero so that negative offsets stay valid.
pub const T0: u64 = 1_800_000_000_000;

/// The window of the rule the classic scenarios enforce (`fixed_window`, 1 s, aligned to the
/// epoch), and the unit of every demand rate ("per window" in [`crate::workload`] means per
/// second, whatever the plan's own window).
pub const WINDOW_MS: u64 = 1_000;

/// A window longer than this is a *long* window: a run lies inside one or a few of them, and
/// utilisation counts every window from the first (see [`RunPlan::first_counted_window`]).
pub const SHORT_WINDOW_MS: u64 = 1_000;

/// The rule's name.
pub const RULE: &str = "r";

/// The most regions a plan may have (per-region figures are kept in fixed arrays).
pub const MAX_REGIONS: usize = 8;

/// Regions, nodes and the latency between regions.
#[derive(Debug, Clone)]
pub struct Topology {
    /// Nodes in each region; nodes are numbered region by region.
    pub nodes_per_region: Vec<usize>,
    /// Each region's weight (its static share is its weight over the sum).
    pub weights: Vec<u32>,
    /// One-way delay from region `a` to region `b`, in ms (`[a][a]`: inside a region).
    pub one_way_ms: Vec<Vec<u64>>,
}

impl Topology {
    /// Number of regions.
    pub fn regions(&self) -> usize {
        self.nodes_per_region.len()
    }

    /// Number of nodes.
    pub fn nodes(&self) -> usize {
        self.nodes_per_region.iter().sum()
    }

    /// The region of every node, by node index.
    pub fn region_of(&self) -> Vec<usize> {
        self.nodes_per_region
            .iter()
            .enumerate()
            .flat_map(|(r, &n)| std::iter::repeat_n(r, n))
            .collect()
    }

    /// The nodes of every region, by region index.
    pub fn members(&self) -> Vec<Vec<usize>> {
        let mut out = vec![Vec::new(); self.regions()];
        for (n, r) in self.region_of().into_iter().enumerate() {
            out[r].push(n);
        }
        out
    }

    /// The agreed replica set: regions `r0`, `r1` … (so that the core's region order, by
    /// name, is the plan's), nodes `r<i>-n<j>` in plan order.
    pub fn replica_set(&self) -> ReplicaSet {
        let weights: Vec<(String, u32)> = self
            .weights
            .iter()
            .enumerate()
            .map(|(r, &w)| (format!("r{r}"), w))
            .collect();
        let nodes: Vec<ReplicaSpec> = self
            .nodes_per_region
            .iter()
            .enumerate()
            .flat_map(|(r, &n)| {
                (0..n).map(move |j| ReplicaSpec {
                    id: format!("r{r}-n{j}"),
                    region: format!("r{r}"),
                    weight: None,
                })
            })
            .collect();
        ReplicaSet::new(&weights, &nodes).expect("plans build valid replica sets")
    }

    /// Round-trip time between two regions, in ms.
    pub fn rtt(&self, a: usize, b: usize) -> u64 {
        self.one_way_ms[a][b] + self.one_way_ms[b][a]
    }
}

/// How the network misbehaves, on every link.
#[derive(Debug, Clone, Default)]
pub struct NetParams {
    /// Extra delay drawn uniformly from `0..=jitter_ms` for every message.
    pub jitter_ms: u64,
    /// Probability that a message is lost.
    pub loss: f64,
    /// Probability that a message is delivered twice (with independent delays).
    pub duplicate: f64,
    /// Probability that a message is held back by up to `reorder_ms` more, so that later
    /// messages overtake it.
    pub reorder: f64,
    /// The most a reordered message is held back, in ms.
    pub reorder_ms: u64,
}

/// The protocol's timers, as a node's configuration sets them.
#[derive(Debug, Clone, Copy)]
pub struct ProtocolParams {
    /// How often deltas are sent (production default 20 ms).
    pub gossip_interval: u64,
    /// A peer not heard from within this is unreachable (production default 1 s).
    pub suspect_after: u64,
    /// How often a node sends one peer a digest (production: 1 s).
    pub anti_entropy_interval: u64,
    /// The largest difference between two nodes' clocks (production default 500 ms).
    pub max_clock_skew: u64,
    /// Who a node gossips with (production default: every node).
    pub gossip: levee_cluster::Topology,
    /// `cluster.local_first`: a node that is not a key's owner decides a check itself when
    /// the rights it holds admit it, and forwards only the rest (production default: off).
    pub local_first: bool,
}

impl Default for ProtocolParams {
    fn default() -> Self {
        ProtocolParams {
            gossip_interval: 20,
            suspect_after: 1_000,
            anti_entropy_interval: 1_000,
            max_clock_skew: 500,
            gossip: levee_cluster::Topology::Mesh,
            local_first: false,
        }
    }
}

/// One change to the world at a point of simulated time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// Messages from region `from` to region `to` are dropped (also those already on the
    /// wire when they arrive).
    Cut {
        /// Sending region.
        from: usize,
        /// Receiving region.
        to: usize,
    },
    /// The link from `from` to `to` carries messages again.
    Mend {
        /// Sending region.
        from: usize,
        /// Receiving region.
        to: usize,
    },
    /// A node stops and loses every key state it held.
    Crash {
        /// The node.
        node: usize,
    },
    /// A crashed node starts again, empty, and pulls the cluster's state (with the latest
    /// list its file holds: see [`FaultKind::Reload`]).
    Restart {
        /// The node.
        node: usize,
        /// Its clock offset after the restart, in ms.
        offset: i64,
    },
    /// A node added to the list starts for the first time, with list `list` (or a later
    /// one its file already holds), empty, and pulls the cluster's state.
    Start {
        /// The node (its position in every list from `list` on).
        node: usize,
        /// The index into [`RunPlan::lists`] it starts with.
        list: usize,
        /// Its clock offset, in ms.
        offset: i64,
    },
    /// The operator writes list `list` into the node's file and reloads it
    /// (`Cluster::change_list`). A node that is down or frozen reads it when it comes back;
    /// a node whose file already holds a later list ignores it.
    Reload {
        /// The node.
        node: usize,
        /// The index into [`RunPlan::lists`].
        list: usize,
    },
    /// The node stops processing (`SIGSTOP`): no timer fires, messages to it wait in its
    /// sockets, the load balancer sends it nothing.
    Freeze {
        /// The node.
        node: usize,
    },
    /// A frozen node goes on (`SIGCONT`) with the list it ran: it reads what waited in its
    /// sockets first.
    Thaw {
        /// The node.
        node: usize,
    },
    /// The operator asks the node to leave (`POST /admin/leave`, `Cluster::leave`): it owns
    /// no key from then on, hands what it holds to the keys' owners, and the load balancer
    /// sends it nothing more (its `/readyz` answers 503).
    Leave {
        /// The node.
        node: usize,
    },
}

impl FaultKind {
    /// Whether this is a change of membership (a node started or reloaded with a list).
    pub fn is_membership(self) -> bool {
        matches!(self, FaultKind::Start { .. } | FaultKind::Reload { .. })
    }
}

/// A fault at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault {
    /// Simulated time, ms.
    pub at: u64,
    /// What happens.
    pub kind: FaultKind,
}

/// The shape of a partition, for the checks that depend on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EpisodeKind {
    /// One region cut off from every other, both ways.
    Isolated,
    /// Every region cut off from every other, both ways.
    FullSplit,
    /// Some links cut in one direction only.
    OneWay,
    /// A link that goes down and up repeatedly.
    Flapping,
}

/// A partition from its first cut to its heal.
#[derive(Debug, Clone)]
pub struct Episode {
    /// Its shape.
    pub kind: EpisodeKind,
    /// When the first link was cut (sim ms).
    pub start: u64,
    /// When the last link was mended (sim ms).
    pub heal: u64,
    /// When the last down period began (the start, unless the link flapped).
    pub last_down: u64,
    /// The directed region pairs cut (at some point) during the episode.
    pub cut: Vec<(usize, usize)>,
    /// For symmetric partitions, the sides: regions that can reach each other.
    pub sides: Vec<Vec<usize>>,
}

/// One request: a check of a key, arriving at a region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// Simulated time, ms.
    pub at: u64,
    /// The region it arrives at.
    pub region: u16,
    /// Index into [`RunPlan::keys`].
    pub key: u32,
    /// Its cost in tokens (1 but in the algorithms set, where it is drawn from 1–10).
    pub cost: u16,
    /// The class it names (a mixed run's: 1 `gold`, 2 `free`; 0: none).
    pub class: u8,
    /// If admitted, the caller gives the tokens back this many ms later (`refund: true`,
    /// where the check was decided); 0: never.
    pub refund_ms: u16,
}

impl Request {
    /// A request of cost 1 that is never refunded.
    pub fn one(at: u64, region: usize, key: u32) -> Request {
        Request {
            at,
            region: region as u16,
            key,
            cost: 1,
            class: 0,
            refund_ms: 0,
        }
    }
}

/// The algorithm of the rule a run enforces (`limit` and `window_ms` of the plan give its
/// figures: see [`RunPlan::rule`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algo {
    /// `limit` per aligned `window_ms`.
    FixedWindow,
    /// `limit` tokens per `window_ms`, bucket of `limit`.
    TokenBucket,
    /// A token bucket of `limit` per `window_ms` shaped as nginx's `limit_req` (`burst`
    /// `limit − 1`, `delay` half of it).
    LeakyBucket,
    /// The weighted two-window counter, `limit` per `window_ms`.
    SlidingWindow,
    /// `limit` in any `window_ms`, from a log of admissions.
    SlidingLog,
    /// `limit` per UTC day (`window_ms` is a day).
    QuotaDay,
}

impl Algo {
    /// Every algorithm, in the order reports list them.
    pub const ALL: [Algo; 6] = [
        Algo::FixedWindow,
        Algo::TokenBucket,
        Algo::LeakyBucket,
        Algo::SlidingWindow,
        Algo::SlidingLog,
        Algo::QuotaDay,
    ];

    /// Its name in a configuration.
    pub fn name(self) -> &'static str {
        match self {
            Algo::FixedWindow => "fixed_window",
            Algo::TokenBucket => "token_bucket",
            Algo::LeakyBucket => "leaky_bucket",
            Algo::SlidingWindow => "sliding_window",
            Algo::SlidingLog => "sliding_log",
            Algo::QuotaDay => "quota",
        }
    }

    /// Whether rights are held per window, so that every window (as the deciding node's
    /// clock counts it) admits at most the limit: fixed windows and quotas. The others hold
    /// rights continuously and have their own property (`crate::algos`).
    pub fn per_window(self) -> bool {
        matches!(self, Algo::FixedWindow | Algo::QuotaDay)
    }
}

/// Everything one run needs.
#[derive(Debug, Clone)]
pub struct RunPlan {
    /// The seed the plan was drawn from (also seeds the network's randomness).
    pub seed: u64,
    /// The scenario it belongs to.
    pub scenario: Scenario,
    /// Regions, nodes, latencies.
    pub topology: Topology,
    /// Loss, jitter, duplication, reordering.
    pub net: NetParams,
    /// The protocol's timers.
    pub protocol: ProtocolParams,
    /// The rule's limit per window.
    pub limit: u64,
    /// The rule's window, ms (`fixed_window`; [`WINDOW_MS`] in the classic scenarios).
    pub window_ms: u64,
    /// How long the run lasts, ms.
    pub duration_ms: u64,
    /// Every node's clock offset at the start, ms (nodes of the first list; a node added
    /// later has its own in its [`FaultKind::Start`]).
    pub offsets: Vec<i64>,
    /// Every version of the node list, in the order the operator publishes them: the
    /// first is the topology's ([`NodeList::initial`]); runs without membership changes
    /// have only that one.
    pub lists: Vec<NodeList>,
    /// Cuts, mends, crashes and restarts, by time.
    pub faults: Vec<Fault>,
    /// The partitions, for the checks.
    pub episodes: Vec<Episode>,
    /// Key names; requests name keys by index.
    pub keys: Vec<String>,
    /// The key that sees demand only while a partition lasts, to time agreement after the
    /// heal.
    pub probe: Option<u32>,
    /// The requests, by time.
    pub requests: Vec<Request>,
    /// How long a caller waits for rights (`max_wait_ms`, API.md "Waiting for rights") when
    /// its check is denied while the cluster has room; 0: every check is answered at once.
    pub max_wait_ms: u64,
    /// The rule's algorithm ([`Algo::FixedWindow`] but in the algorithms set).
    pub algo: Algo,
    /// Every request is an atomic call against several rules (`crate::mixed`); `algo` is
    /// then the first rule's.
    pub mixed: bool,
}

impl RunPlan {
    /// The rule every node enforces, validated: the plan's algorithm with `limit` per
    /// `window_ms` (see [`Algo`]).
    pub fn rule(&self) -> levee_core::Rule {
        self.rule_with(self.limit)
    }

    /// Every rule the nodes enforce: the plan's rule, or a mixed run's rules
    /// ([`RunPlan::mixed`]).
    pub fn rules(&self) -> Vec<levee_core::Rule> {
        if self.mixed {
            crate::mixed::rules(self.limit, self.window_ms)
        } else {
            vec![self.rule()]
        }
    }

    /// What ledger key `k` is checked against, and its name in reports: the plan's rule and
    /// key, or a mixed run's rule, bucket and key.
    pub fn bound_of(&self, k: u32) -> (crate::mixed::Bound, String) {
        if self.mixed {
            return crate::mixed::bound_of(self, k);
        }
        (
            crate::mixed::Bound {
                algo: self.algo,
                limit: self.limit,
            },
            self.keys[k as usize].clone(),
        )
    }

    /// The plan's rules with another limit: a region's part of them for the static split.
    pub fn rules_with(&self, limit: u64) -> Vec<levee_core::Rule> {
        if self.mixed {
            crate::mixed::rules(limit, self.window_ms)
        } else {
            vec![self.rule_with(limit)]
        }
    }

    /// The plan's rule with another limit (and, for a bucket, rate): a region's part of it
    /// for the static split.
    pub fn rule_with(&self, limit: u64) -> levee_core::Rule {
        use levee_core::RuleSpec;
        let w = self.window_ms;
        let spec = match self.algo {
            Algo::FixedWindow => RuleSpec::fixed_window(RULE, limit, w),
            Algo::TokenBucket => RuleSpec::token_bucket(RULE, limit, w, limit),
            Algo::LeakyBucket => RuleSpec::leaky_bucket(RULE, limit, w, limit - 1, limit / 2),
            Algo::SlidingWindow => RuleSpec::sliding_window(RULE, limit, w),
            Algo::SlidingLog => RuleSpec::sliding_log(RULE, limit, w),
            Algo::QuotaDay => {
                RuleSpec::quota(RULE, limit, levee_core::calendar::CalendarPeriod::Day)
            }
        };
        spec.validate().expect("the simulator's rules are valid")
    }

    /// Makes the plan enforce `algo`: the same limit per window, but a day's quota, which
    /// is half the tokens the limit allows over the run, per UTC day (so that demand at the
    /// limit uses it up half way).
    pub fn set_algo(&mut self, algo: Algo) {
        if algo == Algo::QuotaDay {
            self.limit = self.limit * self.duration_ms / self.window_ms / 2;
            self.window_ms = crate::demand::DAY_MS;
        }
        self.algo = algo;
    }

    /// Whether every request costs 1 and none is refunded (every set but the algorithms
    /// one).
    pub fn unit_costs(&self) -> bool {
        !self.mixed
            && self
                .requests
                .iter()
                .all(|r| r.cost == 1 && r.refund_ms == 0 && r.class == 0)
    }

    /// Each region's part of the limit: the sum of its nodes' integer splits, exactly as the
    /// core computes them (the parts sum to the limit).
    pub fn region_limits(&self) -> Vec<u64> {
        let split = self.topology.replica_set().split(self.limit);
        let mut out = vec![0; self.topology.regions()];
        for (n, r) in self.topology.region_of().into_iter().enumerate() {
            out[r] += split[n];
        }
        out
    }

    /// The largest absolute clock offset any node has during the run.
    pub fn max_offset(&self) -> i64 {
        let restarts = self.faults.iter().filter_map(|f| match f.kind {
            FaultKind::Restart { offset, .. } | FaultKind::Start { offset, .. } => {
                Some(offset.abs())
            }
            _ => None,
        });
        self.offsets
            .iter()
            .map(|o| o.abs())
            .chain(restarts)
            .max()
            .unwrap_or(0)
    }

    /// Whether any node crashes in this run.
    pub fn has_crashes(&self) -> bool {
        self.faults
            .iter()
            .any(|f| matches!(f.kind, FaultKind::Crash { .. }))
    }

    /// Whether the node list changes during the run.
    pub fn has_membership(&self) -> bool {
        self.lists.len() > 1
    }

    /// The number of positions any list of the run has: every node that ever runs.
    pub fn positions(&self) -> usize {
        self.lists.iter().map(NodeList::len).max().unwrap_or(0)
    }

    /// The region of every position of the run (the last list has them all).
    pub fn node_regions(&self) -> Vec<usize> {
        let last = self.lists.iter().max_by_key(|l| l.len());
        last.map(|l| l.entries.iter().map(|e| e.region).collect())
            .unwrap_or_else(|| self.topology.region_of())
    }

    /// The list every node runs at the end: the last published.
    pub fn final_list(&self) -> &NodeList {
        self.lists.last().expect("a plan has a first list")
    }

    /// When the last membership change is made (sim ms; 0 without any).
    pub fn last_change_at(&self) -> u64 {
        self.faults
            .iter()
            .filter(|f| f.kind.is_membership())
            .map(|f| f.at)
            .max()
            .unwrap_or(0)
    }

    /// When the first membership change is made, if any.
    pub fn first_change_at(&self) -> Option<u64> {
        self.faults
            .iter()
            .filter(|f| f.kind.is_membership())
            .map(|f| f.at)
            .min()
    }

    /// The key's home region for the central counter and the shared counter: a stable hash
    /// of the key's bytes.
    pub fn home_region(&self, key: u32) -> usize {
        (fnv1a(self.keys[key as usize].as_bytes()) % self.topology.regions() as u64) as usize
    }

    /// The window a clock reading `t` (Unix ms) is in.
    pub fn window_of(&self, t: u64) -> u64 {
        t / self.window_ms
    }

    /// Whether the rule's window is long (the run lies in one or a few windows).
    pub fn long_window(&self) -> bool {
        self.window_ms > SHORT_WINDOW_MS
    }

    /// The first window whose utilisation counts: the third, so that start up (sync, first
    /// forecasts) is left out, as the design's figure says; with a long window, the first
    /// (a day's quota is used from its first request, and start up is part of it).
    pub fn first_counted_window(&self) -> u64 {
        let first = T0 / self.window_ms;
        if self.long_window() { first } else { first + 2 }
    }

    /// The last window that counts: the last wholly inside the run; with a long window, the
    /// one the run ends in (its demand is all the run has).
    pub fn last_full_window(&self) -> u64 {
        let end = (T0 + self.duration_ms) / self.window_ms;
        if self.long_window() { end } else { end - 1 }
    }
}
