//! The figures a run's checks report: per window, per partition, the probe key, agreement.

use serde::Serialize;

use crate::cluster::REGIONS;
use crate::record::{ImpostorWatch, StopEvent};

use super::CheckResult;

/// One window of the main key, for the report and the plot.
#[derive(Debug, Clone, Serialize)]
pub struct WindowRow {
    /// Window index (start / window length).
    pub index: i64,
    /// Start, ms from the origin.
    pub start_ms: i64,
    /// Demand per region (`eu`, `us`, `ap`).
    pub sent: [u64; REGIONS.len()],
    /// Admissions per region.
    pub admitted: [u64; REGIONS.len()],
    /// Denials per region.
    pub denied: [u64; REGIONS.len()],
    /// Degraded decisions.
    pub degraded: u64,
    /// Admissions in all regions.
    pub admitted_total: u64,
    /// What `strict-limit` allows above the limit in this window (stops, see the checks).
    pub allowance: u64,
}

/// One side of a partition in one window.
#[derive(Debug, Clone, Serialize)]
pub struct SideWindow {
    /// Its regions.
    pub regions: Vec<String>,
    /// Its share of the limit.
    pub share: u64,
    /// Its demand.
    pub sent: u64,
    /// Its admissions.
    pub admitted: u64,
}

/// A window wholly inside a partition.
#[derive(Debug, Clone, Serialize)]
pub struct PartitionWindow {
    /// Window index.
    pub index: i64,
    /// The two sides.
    pub sides: Vec<SideWindow>,
}

/// A partition's figures.
#[derive(Debug, Clone, Serialize)]
pub struct PartitionFigure {
    /// Its label.
    pub label: String,
    /// Both directions cut.
    pub symmetric: bool,
    /// Cut, ms from the origin.
    pub cut_ms: i64,
    /// Heal, ms from the origin.
    pub heal_ms: Option<i64>,
    /// How long after the cut every node saw the other side unreachable.
    pub detected_after_ms: Option<u64>,
    /// The windows wholly inside it (symmetric partitions only).
    pub windows: Vec<PartitionWindow>,
}

/// The usage of the probe key.
#[derive(Debug, Clone, Serialize)]
pub struct ProbeFigure {
    /// Probe checks the clients saw admitted by members.
    pub admitted: u64,
    /// The agreed `used` at the end.
    pub final_used: Option<u64>,
    /// Admissions answered within 250 ms before a stop (may be lost).
    pub may_be_lost: u64,
    /// Checks whose answer a stop cut off (may have been counted).
    pub may_be_counted: u64,
}

/// The figures of a run.
#[derive(Debug, Clone, Serialize)]
pub struct Figures {
    /// Checks sent (all keys, members and impostors).
    pub checks_sent: u64,
    /// Main-key decisions by members.
    pub main_decisions: u64,
    /// Main-key admissions by members.
    pub main_admitted: u64,
    /// Main-key decisions under a conservative cap.
    pub main_degraded: u64,
    /// Checks answered by an impostor.
    pub impostor_decisions: u64,
    /// Checks to a member that got no decision while it was up.
    pub failed: u64,
    /// Checks cut off by a stop or start.
    pub excused: u64,
    /// The most admissions in one window.
    pub max_admitted_per_window: u64,
    /// That over the limit.
    pub max_admitted_over_limit: f64,
    /// Mean over the windows of admissions / what a central counter admits (min(demand,
    /// limit)).
    pub utilisation_mean: f64,
    /// The least of that.
    pub utilisation_min: f64,
    /// Per region (`eu`, `us`, `ap`): admitted / demand over the whole load. A central
    /// counter serving requests first come, first served admits about the same fraction of
    /// every region's (evenly spread) demand.
    pub admitted_over_demand_by_region: [f64; REGIONS.len()],
    /// With skewed clocks: the most admissions in one window of the machine's clock (the
    /// limit is per window of each decider's clock; this shows what skew does to a reader
    /// of the wall clock).
    pub max_admitted_per_wall_clock_window: Option<u64>,
    /// Admissions whose round trip spanned a window.
    pub admitted_straddling: u64,
    /// Admissions with no consistent window.
    pub unattributable: u64,
    /// Admissions attributed against the client's clock.
    pub disagreements: u64,
    /// Partitions.
    pub partitions: Vec<PartitionFigure>,
    /// Agreement measurements.
    pub agreements: Vec<AgreementFigure>,
    /// Stops and restarts, ms from the origin.
    pub stops: Vec<StopEvent>,
    /// The probe key.
    pub probe: ProbeFigure,
    /// The impostor watch.
    pub impostor: Option<ImpostorWatch>,
}

/// An agreement measurement, for the report.
#[derive(Debug, Clone, Serialize)]
pub struct AgreementFigure {
    /// `heal`, `settle` or `final`.
    pub label: String,
    /// When, ms from the origin.
    pub at_ms: i64,
    /// The figure: time until every view was equal (after a write: equal and holding it).
    pub agreed_ms: Option<u64>,
    /// Time until every view was equal.
    pub equal_ms: Option<u64>,
    /// Time until every view was equal and complete.
    pub complete_ms: Option<u64>,
    /// Two gossip intervals plus one round trip.
    pub target_ms: u64,
    /// The round trip in it.
    pub rtt_ms: u64,
    /// Whether `agreed_ms` met the target.
    pub within_target: bool,
    /// The asserted bound.
    pub bound_ms: u64,
    /// Probe admissions the clients had seen.
    pub expected_used: u64,
    /// The views at the end, by node.
    pub views: Vec<(String, Option<u64>)>,
}

/// Checks, figures and windows of a run.
#[derive(Debug, Clone)]
pub struct Evaluation {
    /// Every check.
    pub checks: Vec<CheckResult>,
    /// The figures.
    pub figures: Figures,
    /// Every window of the load.
    pub windows: Vec<WindowRow>,
}
