//! A scenario's report: `<scenario>.json` with every figure and verdict, `<scenario>.svg`
//! with the plot, and on request `<scenario>.decisions.csv` with every check.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use serde::Serialize;

use crate::checks::{CheckResult, Evaluation, Figures, WindowRow};
use crate::cluster::REGIONS;
use crate::load::{Outcome, Target};
use crate::proxy::ProxyCounts;
use crate::record::{IntervalKind, RunData};
use crate::scenario::{
    GOSSIP_INTERVAL_MS, LIMIT, MAIN_PER_SECOND_PER_NODE, MAIN_RULE, PROBE_PER_SECOND, PROBE_RULE,
    SUSPECT_AFTER_MS, Scenario, WINDOW_MS,
};

/// What the run left behind after the cluster was dropped.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Cleanup {
    /// Pids of nodes (or impostors) still alive.
    pub processes_left: Vec<u32>,
    /// Ports of the cluster or the proxy that cannot be bound.
    pub ports_busy: Vec<u16>,
}

impl Cleanup {
    /// Nothing left behind.
    pub fn is_clean(&self) -> bool {
        self.processes_left.is_empty() && self.ports_busy.is_empty()
    }
}

/// How the cluster and the load were set up.
#[derive(Debug, Clone, Serialize)]
pub struct Setup {
    /// Regions.
    pub regions: Vec<String>,
    /// Node ids.
    pub nodes: Vec<String>,
    /// Always `strict`.
    pub mode: String,
    /// The main rule's limit per window.
    pub limit: u64,
    /// Its window, ms.
    pub window_ms: u64,
    /// `cluster.gossip_interval`.
    pub gossip_interval_ms: u64,
    /// `cluster.suspect_after`.
    pub suspect_after_ms: u64,
    /// The main rule.
    pub main_rule: String,
    /// The main key.
    pub main_key: String,
    /// The probe rule.
    pub probe_rule: String,
    /// The probe key.
    pub probe_key: String,
    /// Main checks per second sent to every node, by region.
    pub main_per_second_per_node: BTreeMap<String, f64>,
    /// Probe checks per second sent to every node.
    pub probe_per_second_per_node: f64,
    /// The main key's owner per region.
    pub owners: BTreeMap<String, String>,
    /// Test-only clock offsets.
    pub clock_offsets_ms: BTreeMap<String, i64>,
    /// How long the load ran, ms.
    pub load_ms: u64,
}

/// A shaded interval, ms from the origin.
#[derive(Debug, Clone, Serialize)]
pub struct IntervalRow {
    /// Label.
    pub label: String,
    /// Kind.
    pub kind: IntervalKind,
    /// Start.
    pub start_ms: i64,
    /// End.
    pub end_ms: Option<i64>,
}

/// One scenario's report.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The scenario's name.
    pub scenario: String,
    /// What happens in it.
    pub summary: String,
    /// Its seed (the proxy's random decisions replay from it).
    pub seed: u64,
    /// When it started, UTC.
    pub started_utc: String,
    /// How long it took, start-up and teardown included, s.
    pub wall_s: f64,
    /// Every check held, and the run completed.
    pub passed: bool,
    /// Why the run could not complete, if it could not.
    pub error: Option<String>,
    /// The set-up.
    pub setup: Setup,
    /// Faults, outages, impostors, skew: ms from the origin.
    pub intervals: Vec<IntervalRow>,
    /// The verdicts.
    pub checks: Vec<CheckResult>,
    /// The figures.
    pub figures: Option<Figures>,
    /// What the proxy did.
    pub proxy: ProxyCounts,
    /// The main key, window by window.
    pub windows: Vec<WindowRow>,
    /// What was left behind.
    pub cleanup: Cleanup,
    /// The last lines of every node's log, when something failed.
    pub node_logs: BTreeMap<String, String>,
    /// Where the cluster's files were kept, when something failed.
    pub kept_files: Option<String>,
    /// Why a report file could not be written.
    pub write_error: Option<String>,
}

impl Report {
    /// Assembles the report of a run.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        scenario: &Scenario,
        seed: u64,
        started_ms: u64,
        wall: Duration,
        data: &RunData,
        evaluation: Option<Evaluation>,
        error: Option<String>,
        cleanup: Cleanup,
        node_logs: BTreeMap<String, String>,
        kept_files: Option<String>,
    ) -> Report {
        let (checks, figures, windows) = match evaluation {
            Some(e) => (e.checks, Some(e.figures), e.windows),
            None => (Vec::new(), None, Vec::new()),
        };
        let passed = error.is_none() && !checks.is_empty() && checks.iter().all(|c| c.passed);
        let rel = |ms: u64| ms as i64 - data.origin_ms as i64;
        Report {
            scenario: scenario.name.to_owned(),
            summary: scenario.summary.to_owned(),
            seed,
            started_utc: utc(started_ms),
            wall_s: wall.as_secs_f64(),
            passed,
            error,
            setup: Setup {
                regions: REGIONS.iter().map(|r| (*r).to_owned()).collect(),
                nodes: data.node_ids.clone(),
                mode: "strict".into(),
                limit: LIMIT,
                window_ms: WINDOW_MS,
                gossip_interval_ms: GOSSIP_INTERVAL_MS,
                suspect_after_ms: SUSPECT_AFTER_MS,
                main_rule: MAIN_RULE.into(),
                main_key: data.main_key.clone(),
                probe_rule: PROBE_RULE.into(),
                probe_key: data.probe_key.clone(),
                main_per_second_per_node: REGIONS
                    .iter()
                    .zip(MAIN_PER_SECOND_PER_NODE)
                    .map(|(r, v)| ((*r).to_owned(), v))
                    .collect(),
                probe_per_second_per_node: PROBE_PER_SECOND,
                owners: data
                    .owners
                    .iter()
                    .enumerate()
                    .filter_map(|(r, &n)| {
                        Some((REGIONS.get(r)?.to_string(), data.node_ids.get(n)?.clone()))
                    })
                    .collect(),
                clock_offsets_ms: data
                    .offsets
                    .iter()
                    .enumerate()
                    .filter(|(_, o)| **o != 0)
                    .filter_map(|(i, o)| Some((data.node_ids.get(i)?.clone(), *o)))
                    .collect(),
                load_ms: data.duration_ms,
            },
            intervals: data
                .intervals
                .iter()
                .map(|i| IntervalRow {
                    label: i.label.clone(),
                    kind: i.kind,
                    start_ms: rel(i.start_ms),
                    end_ms: i.end_ms.map(rel),
                })
                .collect(),
            checks,
            figures,
            proxy: data.proxy,
            windows,
            cleanup,
            node_logs,
            kept_files,
            write_error: None,
        }
    }

    /// The names of the checks that failed.
    pub fn failed_checks(&self) -> Vec<&str> {
        self.checks
            .iter()
            .filter(|c| !c.passed)
            .map(|c| c.name.as_str())
            .collect()
    }

    /// Writes `<scenario>.json`, `<scenario>.svg` and, if asked, `<scenario>.decisions.csv`
    /// into `dir` (created if need be). A failure is recorded in `write_error`.
    pub fn write(&mut self, dir: &Path, data: &RunData, decisions: bool) {
        if let Err(e) = self.try_write(dir, data, decisions) {
            self.write_error = Some(e);
        }
    }

    fn try_write(&self, dir: &Path, data: &RunData, decisions: bool) -> Result<(), String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let json = serde_json::to_string_pretty(self).map_err(|e| e.to_string())?;
        let path = dir.join(format!("{}.json", self.scenario));
        std::fs::write(&path, json + "\n").map_err(|e| format!("{}: {e}", path.display()))?;
        let svg = crate::plot::render(self)?;
        let path = dir.join(format!("{}.svg", self.scenario));
        std::fs::write(&path, svg).map_err(|e| format!("{}: {e}", path.display()))?;
        if decisions {
            let path = dir.join(format!("{}.decisions.csv", self.scenario));
            std::fs::write(&path, decisions_csv(data))
                .map_err(|e| format!("{}: {e}", path.display()))?;
        }
        Ok(())
    }
}

/// Every check of a run, one line each.
fn decisions_csv(data: &RunData) -> String {
    let mut out = String::from(
        "node,key,impostor,sent_ms,received_ms,allowed,degraded,reset_after_ms,error\n",
    );
    for d in &data.decisions {
        let node = data.node_ids.get(d.node).map_or("?", String::as_str);
        let key = match d.target {
            Target::Main => "main",
            Target::Probe => "probe",
        };
        let _ = match &d.outcome {
            Outcome::Decided {
                allowed,
                degraded,
                reset_after_ms,
            } => writeln!(
                out,
                "{node},{key},{},{},{},{allowed},{degraded},{reset_after_ms},",
                d.impostor, d.sent_ms, d.received_ms
            ),
            Outcome::Failed { error, excused } => writeln!(
                out,
                "{node},{key},{},{},{},,,,\"{}{}\"",
                d.impostor,
                d.sent_ms,
                d.received_ms,
                if *excused { "(excused) " } else { "" },
                error.replace('"', "'")
            ),
        };
    }
    out
}

/// `YYYY-MM-DD HH:MM:SS UTC` of ms since the Unix epoch.
pub fn utc(ms: u64) -> String {
    let secs = ms / 1_000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        rem / 3_600,
        rem % 3_600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_utc_dates() {
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(951_782_400_000), "2000-02-29 00:00:00 UTC");
        assert_eq!(utc(1_795_222_861_000), "2026-11-21 01:01:01 UTC");
    }
}
