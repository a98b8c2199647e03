//! What a run recorded: every decision, and the script's events as they really happened
//! (times are ms since the Unix epoch, by the machine's clock).

use serde::Serialize;

use crate::cluster::NODES;
use crate::load::Decision;
use crate::proxy::ProxyCounts;
use levee_blackbox::cluster::View;

/// What a shaded interval of the plot stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum IntervalKind {
    /// A network fault.
    Fault,
    /// A node down.
    Down,
    /// An impostor running.
    Impostor,
    /// A skewed clock (the whole run).
    Skew,
}

/// A fault, an outage or an impostor, from start to end.
#[derive(Debug, Clone, Serialize)]
pub struct Interval {
    /// Shown on the plot.
    pub label: String,
    /// What it is.
    pub kind: IntervalKind,
    /// Start, ms since the epoch.
    pub start_ms: u64,
    /// End (`None`: still open when the load ended).
    pub end_ms: Option<u64>,
}

/// A partition between two sides (regions by index), from the cut to the heal.
#[derive(Debug, Clone)]
pub struct Partition {
    /// Its interval's label.
    pub label: String,
    /// The cut-off regions.
    pub side_a: Vec<usize>,
    /// The others.
    pub side_b: Vec<usize>,
    /// Both directions cut (a one-way cut is not symmetric).
    pub symmetric: bool,
    /// When the links were cut.
    pub cut_ms: u64,
    /// When they healed.
    pub heal_ms: Option<u64>,
    /// When every live node on each side saw every region of the other side unreachable
    /// (`None`: not within the bound).
    pub detected_ms: Option<u64>,
}

/// One measurement of agreement on the probe key.
#[derive(Debug, Clone, Serialize)]
pub struct Agreement {
    /// `heal`, `settle` or `final`.
    pub label: String,
    /// When the measurement started (the heal), ms since the epoch.
    pub at_ms: u64,
    /// Time until every live node's view was equal.
    pub equal_ms: Option<u64>,
    /// Time until every view was equal and counted every probe admission the clients saw.
    pub complete_ms: Option<u64>,
    /// The design's target: two gossip intervals plus one round trip (the largest nominal
    /// round trip between two nodes under the faults in force during the measurement).
    pub target_ms: u64,
    /// That round trip, ms.
    pub rtt_ms: u64,
    /// The bound the check asserts, ms.
    pub bound_ms: u64,
    /// The views at the end of the measurement, by node id.
    pub views: Vec<(String, Option<View>)>,
    /// Probe admissions the clients had seen.
    pub expected_used: u64,
    /// The measurement began with one write of the probe key (views may be equal before it
    /// has spread): what counts is the time until every view is equal *and* has it.
    pub after_write: bool,
}

impl Agreement {
    /// The time the measurement is about: until every view was equal, or, after a write, until
    /// every view was equal and had it.
    pub fn agreed_ms(&self) -> Option<u64> {
        if self.after_write {
            self.complete_ms
        } else {
            self.equal_ms
        }
    }

    /// Whether the views agreed within the design's target.
    pub fn within_target(&self) -> bool {
        self.agreed_ms().is_some_and(|ms| ms <= self.target_ms)
    }
}

/// How a node was stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopKind {
    /// `kill -9`.
    Kill9,
    /// SIGTERM.
    Term,
}

/// A node stopped, and when it was ready again.
#[derive(Debug, Clone, Serialize)]
pub struct StopEvent {
    /// Its index.
    pub node: usize,
    /// How.
    pub kind: StopKind,
    /// When the signal was sent.
    pub at_ms: u64,
    /// When it answered `/readyz` again.
    pub ready_ms: Option<u64>,
}

/// A node the script started that did not become ready (or was not redialled by every
/// peer) within the harness's bound. The run goes on without it; at the end of the load its
/// `/readyz` is asked again.
#[derive(Debug, Clone, Serialize)]
pub struct RestartFailure {
    /// Its id.
    pub node: String,
    /// When it was started, ms since the epoch.
    pub started_ms: u64,
    /// What the harness waited for in vain, with the node's log tail.
    pub error: String,
    /// Its `/readyz` answer when the load ended.
    pub readyz_at_end: Option<String>,
}

/// What the impostor watch saw.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ImpostorWatch {
    /// The node it posed as.
    pub node: String,
    /// When it was started and stopped.
    pub start_ms: u64,
    /// When it was stopped.
    pub end_ms: u64,
    /// Polls of every member's `/v1/cluster` while it ran.
    pub polls: u64,
    /// Members that saw the node reachable at some poll while the impostor ran.
    pub seen_reachable_by: Vec<String>,
    /// TLS handshakes the members refused meanwhile (`levee_transport_handshakes_refused_total`).
    pub handshakes_refused: f64,
    /// Peers the impostor saw reachable at the end.
    pub impostor_reached: Vec<String>,
    /// Probe checks sent to the impostor that it admitted.
    pub impostor_probe_admitted: u64,
    /// The impostor's own `used` of the probe key when it stopped.
    pub impostor_probe_used: Option<u64>,
    /// The members' agreed view of the probe key before the impostor started.
    pub members_probe_before: Option<View>,
    /// Members whose view of the probe key moved while the impostor ran, though no member
    /// was sent any probe check then (the probes pause while it runs).
    pub members_probe_moved: Vec<String>,
    /// Why the watch could not run, if it could not.
    pub error: Option<String>,
}

/// Everything a run recorded.
#[derive(Debug, Clone, Default)]
pub struct RunData {
    /// The first window boundary of the load, ms since the epoch.
    pub origin_ms: u64,
    /// How long the load ran, ms.
    pub duration_ms: u64,
    /// Node ids, in order.
    pub node_ids: Vec<String>,
    /// Each node's region index.
    pub node_regions: Vec<usize>,
    /// Each node's clock offset.
    pub offsets: [i64; NODES],
    /// The main key's owner in each region, at the start.
    pub owners: Vec<usize>,
    /// The keys.
    pub main_key: String,
    /// The probe key.
    pub probe_key: String,
    /// Every check.
    pub decisions: Vec<Decision>,
    /// Faults, outages, impostors.
    pub intervals: Vec<Interval>,
    /// Partitions.
    pub partitions: Vec<Partition>,
    /// Agreement measurements.
    pub agreements: Vec<Agreement>,
    /// Stops and restarts.
    pub stops: Vec<StopEvent>,
    /// The impostor watch, if the scenario has one.
    pub impostor: Option<ImpostorWatch>,
    /// Processes that died by themselves, or exited badly when told to stop.
    pub crashes: Vec<String>,
    /// The script's own failures (a step that could not be carried out).
    pub script_errors: Vec<String>,
    /// Nodes the script started that did not become ready and reconnected in time.
    pub restart_failures: Vec<RestartFailure>,
    /// Probe admissions the clients saw from members.
    pub probe_admitted: u64,
    /// The proxy's counters at the end.
    pub proxy: ProxyCounts,
}
