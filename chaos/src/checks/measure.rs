//! Measuring a run's figures from what the harness recorded.

use crate::cluster::REGIONS;
use crate::load::{Outcome, Target};
use crate::record::{Agreement, RunData};
use crate::scenario::{GOSSIP_INTERVAL_MS, LIMIT, SUSPECT_AFTER_MS, WINDOW_MS};
use crate::windows::Accounting;

use super::*;

pub(super) fn describe_agreement(a: &AgreementFigure) -> String {
    match a.agreed_ms {
        Some(ms) => format!(
            "{} at {} ms: views {} after {ms} ms (target {} ms = 2 x {GOSSIP_INTERVAL_MS} ms + RTT {} ms: {}; complete {}; bound {} ms)",
            a.label,
            a.at_ms,
            if a.label == "settle" {
                "equal and holding a new write"
            } else {
                "equal"
            },
            a.target_ms,
            a.rtt_ms,
            if a.within_target { "met" } else { "missed" },
            a.complete_ms
                .map(|c| format!("after {c} ms"))
                .unwrap_or_else(|| "never".into()),
            a.bound_ms
        ),
        None => format!(
            "{} at {} ms: views not equal within {} ms: {:?}",
            a.label, a.at_ms, a.bound_ms, a.views
        ),
    }
}

pub(super) fn agreement_figure(data: &RunData, a: &Agreement) -> AgreementFigure {
    AgreementFigure {
        label: a.label.clone(),
        at_ms: rel(data, a.at_ms),
        agreed_ms: a.agreed_ms(),
        equal_ms: a.equal_ms,
        complete_ms: a.complete_ms,
        target_ms: a.target_ms,
        rtt_ms: a.rtt_ms,
        within_target: a.within_target(),
        bound_ms: a.bound_ms,
        expected_used: a.expected_used,
        views: a
            .views
            .iter()
            .map(|(id, v)| (id.clone(), v.as_ref().map(|v| v.used)))
            .collect(),
    }
}

/// What `strict-limit` allows above the limit in window `win`: for every node stopped and
/// ready again inside that window, the main admissions its region answered in the
/// [`LAST_GOSSIP_ALLOWANCE_MS`] before the stop.
pub(super) fn stop_allowance(data: &RunData, win: i64) -> u64 {
    let w = WINDOW_MS as i64;
    data.stops
        .iter()
        .filter(|s| s.at_ms as i64 / w == win && s.ready_ms.is_some_and(|r| r as i64 / w == win))
        .map(|s| {
            let region = data.node_regions[s.node];
            data.decisions
                .iter()
                .filter(|d| {
                    d.target == Target::Main
                        && !d.impostor
                        && d.allowed()
                        && data.node_regions[d.node] == region
                        && d.received_ms <= s.at_ms
                        && d.received_ms + LAST_GOSSIP_ALLOWANCE_MS > s.at_ms
                })
                .count() as u64
        })
        .sum()
}

pub(super) fn partition_figures(data: &RunData, acc: &Accounting) -> Vec<PartitionFigure> {
    let w = WINDOW_MS as i64;
    let skew = data.offsets.iter().map(|o| o.abs()).max().unwrap_or(0);
    data.partitions
        .iter()
        .map(|p| {
            let mut windows = Vec::new();
            if p.symmetric
                && let Some(heal) = p.heal_ms
            {
                let noticed = (p.cut_ms + SUSPECT_AFTER_MS + 2 * GOSSIP_INTERVAL_MS)
                    .max(p.detected_ms.unwrap_or(0)) as i64
                    + skew;
                // Window e qualifies when e − 1 starts at or after `noticed` and e ends by
                // the heal.
                let first = (noticed + w - 1).div_euclid(w) + 1;
                let mut e = first;
                while (e + 1) * w <= heal as i64 - skew {
                    let c = acc.get(e);
                    let side = |regions: &[usize]| {
                        let share = LIMIT * regions.len() as u64 / REGIONS.len() as u64;
                        SideWindow {
                            regions: regions.iter().map(|&r| REGIONS[r].to_owned()).collect(),
                            share,
                            sent: regions.iter().map(|&r| c.sent[r]).sum(),
                            admitted: regions.iter().map(|&r| c.admitted[r]).sum(),
                        }
                    };
                    windows.push(PartitionWindow {
                        index: e,
                        sides: vec![side(&p.side_a), side(&p.side_b)],
                    });
                    e += 1;
                }
            }
            PartitionFigure {
                label: p.label.clone(),
                symmetric: p.symmetric,
                cut_ms: rel(data, p.cut_ms),
                heal_ms: p.heal_ms.map(|h| rel(data, h)),
                detected_after_ms: p.detected_ms.map(|d| d.saturating_sub(p.cut_ms)),
                windows,
            }
        })
        .collect()
}

pub(super) fn probe_figure(data: &RunData) -> ProbeFigure {
    let probes = data
        .decisions
        .iter()
        .filter(|d| d.target == Target::Probe && !d.impostor);
    let may_be_lost = data
        .stops
        .iter()
        .map(|s| {
            probes
                .clone()
                .filter(|d| {
                    d.allowed()
                        && d.received_ms <= s.at_ms
                        && d.received_ms + LAST_GOSSIP_ALLOWANCE_MS > s.at_ms
                })
                .count() as u64
        })
        .sum();
    let may_be_counted = probes
        .clone()
        .filter(|d| matches!(d.outcome, Outcome::Failed { excused: true, .. }))
        .count() as u64;
    let final_used = data
        .agreements
        .iter()
        .rfind(|a| a.label == "final" && a.equal_ms.is_some())
        .and_then(|a| a.views.first())
        .and_then(|(_, v)| v.as_ref().map(|v| v.used));
    ProbeFigure {
        admitted: data.probe_admitted,
        final_used,
        may_be_lost,
        may_be_counted,
    }
}

/// The most main admissions in one window of the machine's clock, each admission placed at
/// the middle of its round trip.
pub(super) fn wall_clock_max(data: &RunData) -> u64 {
    let mut per = std::collections::BTreeMap::<u64, u64>::new();
    for d in data
        .decisions
        .iter()
        .filter(|d| d.target == Target::Main && !d.impostor && d.allowed())
    {
        *per.entry((d.sent_ms + d.received_ms) / 2 / WINDOW_MS)
            .or_default() += 1;
    }
    per.values().copied().max().unwrap_or(0)
}
