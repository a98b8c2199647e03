//! The invariants every run is checked against, the same as the simulator's
//! (`crates/levee-sim/src/checks.rs`), measured from the outside on real processes.
//!
//! | check | what must hold |
//! |---|---|
//! | `strict-limit` | in every window (by the deciding node's clock), admissions ≤ the limit; where a node was stopped and ready again inside one window, plus the admissions answered in the 250 ms before it stopped (what it may not have gossiped: the design allows losing the last gossip interval) |
//! | `partition-cap` | in every window wholly inside a detected symmetric partition, each side admits at most its share |
//! | `partition-share` | … and a side whose demand reaches its share admits at least 95 % of it |
//! | `heal-agreement` | after a heal (or under latency), every view of the probe key agrees within a generous bound; the time is reported beside the design's target (two gossip intervals plus one round trip) |
//! | `final-agreement` | once the load has stopped and every link is healthy, every view agrees |
//! | `usage-kept` | the agreed usage of the probe key is what the clients saw admitted, less at most what was answered in the 250 ms before a stop, plus at most the checks whose answer a stop cut off |
//! | `all-answered` | every check sent to a member that was up got a decision |
//! | `attribution` | every admission's `reset_after_ms` names a window its round trip could have been decided in |
//! | `no-crash` | no process exited by itself, none exited badly on SIGTERM |
//! | `script-ran` | every step of the script could be carried out |
//! | `restart-ready` | every node the script started became ready (`/readyz` 200) and was redialled by every peer within 20 s |
//! | `overloaded` | the demand exceeded the limit in at least 80 % of the windows (else the limit proves little) |
//! | `impostor-refused` | no member took the impostor for a member, they refused its handshakes, it reached no peer, and what it counted never reached the members' views |
//!
//! A window is *wholly inside* a partition when the window before it begins after every node
//! has had time to see the cut (`suspect_after` plus two gossip intervals after the cut, or
//! later if the harness saw the nodes notice later) and it ends before the heal. Strict mode
//! gives rights for a window during the window before it, so nothing for such a window crosses
//! the cut and each side holds exactly the sum of its nodes' static splits.

mod figures;
mod measure;

pub use figures::*;
use measure::{
    agreement_figure, describe_agreement, partition_figures, probe_figure, stop_allowance,
    wall_clock_max,
};

use serde::Serialize;

use crate::load::{Decision, Outcome, Target};
use crate::record::{RunData, StopEvent};
use crate::scenario::{LIMIT, WINDOW_MS};
use crate::windows::account;

/// Answers within this long before a node stopped may not have been gossiped.
pub const LAST_GOSSIP_ALLOWANCE_MS: u64 = 250;
/// A side of a partition with the demand must admit at least this share of its share.
pub const PARTITION_SHARE: f64 = 0.95;

/// One invariant's verdict.
#[derive(Debug, Clone, Serialize)]
pub struct CheckResult {
    /// The check's name.
    pub name: String,
    /// Whether it held.
    pub passed: bool,
    /// The figures behind the verdict.
    pub detail: String,
}

fn check(name: &str, passed: bool, detail: String) -> CheckResult {
    CheckResult {
        name: name.to_owned(),
        passed,
        detail,
    }
}

/// The node that made decision `d` (see `windows`).
fn decider(data: &RunData, d: &Decision) -> usize {
    if d.degraded() {
        d.node
    } else {
        data.owners
            .get(data.node_regions[d.node])
            .copied()
            .unwrap_or(d.node)
    }
}

fn rel(data: &RunData, ms: u64) -> i64 {
    ms as i64 - data.origin_ms as i64
}

/// Evaluates a run.
pub fn evaluate(data: &RunData) -> Evaluation {
    let w = WINDOW_MS as i64;
    let acc = account(
        &data.decisions,
        WINDOW_MS,
        |n| data.node_regions[n],
        |d| data.offsets[decider(data, d)],
    );
    let first = data.origin_ms as i64 / w;
    let last = (data.origin_ms + data.duration_ms) as i64 / w - 1;
    let allowance = |win: i64| -> u64 { stop_allowance(data, win) };
    let lo = acc
        .windows
        .keys()
        .next()
        .copied()
        .unwrap_or(first)
        .min(first);
    let hi = acc.windows.keys().last().copied().unwrap_or(last).max(last);
    let windows: Vec<WindowRow> = (lo..=hi)
        .map(|i| {
            let c = acc.get(i);
            WindowRow {
                index: i,
                start_ms: i * w - data.origin_ms as i64,
                sent: c.sent,
                admitted: c.admitted,
                denied: c.denied,
                degraded: c.degraded,
                admitted_total: c.admitted_total(),
                allowance: allowance(i),
            }
        })
        .collect();

    let mut checks = Vec::new();

    // strict-limit
    let over: Vec<&WindowRow> = windows
        .iter()
        .filter(|r| r.admitted_total > LIMIT + r.allowance)
        .collect();
    let max = windows.iter().map(|r| r.admitted_total).max().unwrap_or(0);
    checks.push(check(
        "strict-limit",
        over.is_empty(),
        if over.is_empty() {
            format!("max {max} admitted in a window of limit {LIMIT}")
        } else {
            format!(
                "{} window(s) over the limit {LIMIT}: {}",
                over.len(),
                over.iter()
                    .map(|r| format!(
                        "window at {} ms admitted {} (eu {}, us {}, ap {}; allowance {})",
                        r.start_ms,
                        r.admitted_total,
                        r.admitted[0],
                        r.admitted[1],
                        r.admitted[2],
                        r.allowance
                    ))
                    .collect::<Vec<_>>()
                    .join("; ")
            )
        },
    ));

    // partition-cap, partition-share
    let partitions = partition_figures(data, &acc);
    let symmetric: Vec<&PartitionFigure> = partitions.iter().filter(|p| p.symmetric).collect();
    if !symmetric.is_empty() {
        let mut cap_bad = Vec::new();
        let mut share_bad = Vec::new();
        let mut seen = Vec::new();
        let mut n = 0;
        for p in &symmetric {
            for pw in &p.windows {
                n += 1;
                for s in &pw.sides {
                    let side = s.regions.join("+");
                    seen.push(format!(
                        "window {} {side}: {}/{} (demand {})",
                        pw.index - first,
                        s.admitted,
                        s.share,
                        s.sent
                    ));
                    if s.admitted > s.share {
                        cap_bad.push(format!(
                            "window {} {side} admitted {} > share {}",
                            pw.index - first,
                            s.admitted,
                            s.share
                        ));
                    }
                    if s.sent >= s.share && (s.admitted as f64) < PARTITION_SHARE * s.share as f64 {
                        share_bad.push(format!(
                            "window {} {side} admitted {} < 95 % of share {} (demand {})",
                            pw.index - first,
                            s.admitted,
                            s.share,
                            s.sent
                        ));
                    }
                }
            }
        }
        let none = n == 0;
        let summary = if none {
            "no window lay wholly inside the partition: nothing to check".to_owned()
        } else {
            seen.join("; ")
        };
        checks.push(check(
            "partition-cap",
            !none && cap_bad.is_empty(),
            if cap_bad.is_empty() {
                summary.clone()
            } else {
                cap_bad.join("; ")
            },
        ));
        checks.push(check(
            "partition-share",
            !none && share_bad.is_empty(),
            if share_bad.is_empty() {
                summary
            } else {
                share_bad.join("; ")
            },
        ));
    }

    // heal-agreement, final-agreement
    let agreements: Vec<AgreementFigure> = data
        .agreements
        .iter()
        .map(|a| agreement_figure(data, a))
        .collect();
    let heals: Vec<&AgreementFigure> = agreements.iter().filter(|a| a.label != "final").collect();
    if !heals.is_empty() {
        let ok = heals
            .iter()
            .all(|a| a.agreed_ms.is_some_and(|ms| ms <= a.bound_ms));
        checks.push(check(
            "heal-agreement",
            ok,
            heals
                .iter()
                .map(|a| describe_agreement(a))
                .collect::<Vec<_>>()
                .join("; "),
        ));
    }
    let finals: Vec<&AgreementFigure> = agreements.iter().filter(|a| a.label == "final").collect();
    checks.push(check(
        "final-agreement",
        !finals.is_empty()
            && finals
                .iter()
                .all(|a| a.agreed_ms.is_some_and(|ms| ms <= a.bound_ms)),
        if finals.is_empty() {
            "not measured (the run stopped early)".to_owned()
        } else {
            finals
                .iter()
                .map(|a| describe_agreement(a))
                .collect::<Vec<_>>()
                .join("; ")
        },
    ));

    // usage-kept
    let probe = probe_figure(data);
    let usage_ok = probe.final_used.is_some_and(|u| {
        u + probe.may_be_lost >= probe.admitted && u <= probe.admitted + probe.may_be_counted
    });
    checks.push(check(
        "usage-kept",
        usage_ok,
        match probe.final_used {
            None => "no agreed view of the probe key at the end".to_owned(),
            Some(u) => format!(
                "agreed used {u}; clients saw {} admitted (may be lost: {}, may be counted though cut off: {})",
                probe.admitted, probe.may_be_lost, probe.may_be_counted
            ),
        },
    ));

    // all-answered
    let failures: Vec<String> = data
        .decisions
        .iter()
        .filter(|d| !d.impostor)
        .filter_map(|d| match &d.outcome {
            Outcome::Failed {
                error,
                excused: false,
            } => Some(format!(
                "{} at {} ms: {error}",
                data.node_ids[d.node],
                rel(data, d.sent_ms)
            )),
            _ => None,
        })
        .collect();
    let excused = data
        .decisions
        .iter()
        .filter(|d| matches!(d.outcome, Outcome::Failed { excused: true, .. }))
        .count() as u64;
    checks.push(check(
        "all-answered",
        failures.is_empty(),
        if failures.is_empty() {
            format!("every check to a member that was up was decided ({excused} cut off by stops)")
        } else {
            format!(
                "{} check(s) got no decision, e.g. {}",
                failures.len(),
                failures
                    .iter()
                    .take(3)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(" | ")
            )
        },
    ));

    // attribution
    checks.push(check(
        "attribution",
        acc.unattributable == 0 && acc.disagreements == 0,
        format!(
            "unattributable {}, disagreements {}, straddling {}",
            acc.unattributable, acc.disagreements, acc.admitted_straddling
        ),
    ));

    // no-crash, script-ran
    checks.push(check(
        "no-crash",
        data.crashes.is_empty(),
        if data.crashes.is_empty() {
            "every process ran until it was told to stop, and stopped cleanly".to_owned()
        } else {
            data.crashes.join("\n")
        },
    ));
    checks.push(check(
        "script-ran",
        data.script_errors.is_empty(),
        if data.script_errors.is_empty() {
            "every step ran".to_owned()
        } else {
            data.script_errors.join("\n")
        },
    ));

    // restart-ready
    if data.stops.iter().any(|s| s.ready_ms.is_some()) || !data.restart_failures.is_empty() {
        let ready: Vec<String> = data
            .stops
            .iter()
            .filter_map(|s| {
                Some(format!(
                    "{} ready {} ms after its stop",
                    data.node_ids[s.node],
                    s.ready_ms?.saturating_sub(s.at_ms)
                ))
            })
            .collect();
        checks.push(check(
            "restart-ready",
            data.restart_failures.is_empty(),
            if data.restart_failures.is_empty() {
                ready.join("; ")
            } else {
                data.restart_failures
                    .iter()
                    .map(|f| {
                        format!(
                            "{} started at {} ms: {}; /readyz when the load ended: {}",
                            f.node,
                            rel(data, f.started_ms),
                            f.error,
                            f.readyz_at_end.as_deref().unwrap_or("not asked")
                        )
                    })
                    .collect::<Vec<_>>()
                    .join("\n")
            },
        ));
    }

    // overloaded
    let full: Vec<&WindowRow> = windows
        .iter()
        .filter(|r| (first..=last).contains(&r.index))
        .collect();
    let loaded = full
        .iter()
        .filter(|r| r.sent.iter().sum::<u64>() > LIMIT)
        .count();
    checks.push(check(
        "overloaded",
        !full.is_empty() && loaded * 5 >= full.len() * 4,
        format!(
            "{loaded} of {} windows had demand above the limit",
            full.len()
        ),
    ));

    // impostor-refused
    if let Some(imp) = &data.impostor {
        let ok = imp.error.is_none()
            && imp.polls > 0
            && imp.seen_reachable_by.is_empty()
            && imp.handshakes_refused > 0.0
            && imp.impostor_reached.is_empty()
            && imp.members_probe_moved.is_empty()
            && imp.impostor_probe_admitted > 0;
        checks.push(check(
            "impostor-refused",
            ok,
            format!(
                "{} polls; seen reachable by {:?}; {} handshakes refused; impostor reached {:?}; \
                 impostor admitted {} probe checks (its own used {:?}); members' probe view moved on {:?}{}",
                imp.polls,
                imp.seen_reachable_by,
                imp.handshakes_refused,
                imp.impostor_reached,
                imp.impostor_probe_admitted,
                imp.impostor_probe_used,
                imp.members_probe_moved,
                imp.error
                    .as_ref()
                    .map(|e| format!("; error: {e}"))
                    .unwrap_or_default()
            ),
        ));
    }

    // Figures.
    let util: Vec<f64> = full
        .iter()
        .filter(|r| r.sent.iter().sum::<u64>() > 0)
        .map(|r| r.admitted_total as f64 / r.sent.iter().sum::<u64>().min(LIMIT) as f64)
        .collect();
    let members_main = data
        .decisions
        .iter()
        .filter(|d| d.target == Target::Main && !d.impostor);
    let figures = Figures {
        checks_sent: data.decisions.len() as u64,
        main_decisions: members_main
            .clone()
            .filter(|d| matches!(d.outcome, Outcome::Decided { .. }))
            .count() as u64,
        main_admitted: members_main.clone().filter(|d| d.allowed()).count() as u64,
        main_degraded: members_main.clone().filter(|d| d.degraded()).count() as u64,
        impostor_decisions: data.decisions.iter().filter(|d| d.impostor).count() as u64,
        failed: failures.len() as u64,
        excused,
        max_admitted_per_window: max,
        max_admitted_over_limit: max as f64 / LIMIT as f64,
        utilisation_mean: if util.is_empty() {
            0.0
        } else {
            util.iter().sum::<f64>() / util.len() as f64
        },
        utilisation_min: if util.is_empty() {
            0.0
        } else {
            util.iter().copied().fold(f64::INFINITY, f64::min)
        },
        admitted_over_demand_by_region: std::array::from_fn(|r| {
            let sent: u64 = full.iter().map(|w| w.sent[r]).sum();
            let admitted: u64 = full.iter().map(|w| w.admitted[r]).sum();
            if sent == 0 {
                0.0
            } else {
                admitted as f64 / sent as f64
            }
        }),
        max_admitted_per_wall_clock_window: data
            .offsets
            .iter()
            .any(|&o| o != 0)
            .then(|| wall_clock_max(data)),
        admitted_straddling: acc.admitted_straddling,
        unattributable: acc.unattributable,
        disagreements: acc.disagreements,
        partitions,
        agreements,
        stops: data
            .stops
            .iter()
            .map(|s| StopEvent {
                at_ms: rel(data, s.at_ms).max(0) as u64,
                ready_ms: s.ready_ms.map(|r| rel(data, r).max(0) as u64),
                ..s.clone()
            })
            .collect(),
        probe,
        impostor: data.impostor.clone(),
    };
    Evaluation {
        checks,
        figures,
        windows,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::NODES;
    use crate::record::Partition;

    fn data_with(decisions: Vec<Decision>) -> RunData {
        RunData {
            origin_ms: 10_000,
            duration_ms: 4_000,
            node_ids: (0..NODES).map(|i| format!("n{i}")).collect(),
            node_regions: (0..NODES).map(|i| i / 2).collect(),
            owners: vec![0, 2, 4],
            decisions,
            ..RunData::default()
        }
    }

    fn admit(node: usize, at: u64, window_end: u64) -> Decision {
        Decision {
            node,
            target: Target::Main,
            sent_ms: at,
            received_ms: at + 1,
            impostor: false,
            outcome: Outcome::Decided {
                allowed: true,
                degraded: false,
                reset_after_ms: window_end - at,
            },
        }
    }

    fn verdict(e: &Evaluation, name: &str) -> bool {
        e.checks
            .iter()
            .find(|c| c.name == name)
            .unwrap_or_else(|| panic!("no check {name}"))
            .passed
    }

    #[test]
    fn strict_limit_fails_on_one_admission_too_many() {
        let at_limit: Vec<Decision> = (0..LIMIT)
            .map(|k| admit((k % 6) as usize, 11_000 + k, 12_000))
            .collect();
        assert!(verdict(
            &evaluate(&data_with(at_limit.clone())),
            "strict-limit"
        ));
        let mut over = at_limit;
        over.push(admit(5, 11_900, 12_000));
        let e = evaluate(&data_with(over));
        assert!(!verdict(&e, "strict-limit"));
        assert_eq!(e.figures.max_admitted_per_window, LIMIT + 1);
    }

    #[test]
    fn a_side_over_its_share_inside_a_partition_fails_the_cap() {
        // ap (nodes 4, 5) cut at 10.1 s, healed at 13.5 s: windows 12 (11 starts after
        // 10.1 + 0.54) is wholly inside.
        let mut d: Vec<Decision> = (0..81).map(|k| admit(4, 12_000 + k, 13_000)).collect();
        d.extend((0..160).map(|k| admit((k % 4) as usize, 12_100 + k, 13_000)));
        let mut data = data_with(d);
        data.partitions.push(Partition {
            label: "ap".into(),
            side_a: vec![2],
            side_b: vec![0, 1],
            symmetric: true,
            cut_ms: 10_100,
            heal_ms: Some(13_500),
            detected_ms: Some(10_700),
        });
        let e = evaluate(&data);
        assert_eq!(e.figures.partitions[0].windows.len(), 1);
        assert_eq!(e.figures.partitions[0].windows[0].index, 12);
        assert!(!verdict(&e, "partition-cap"));
        assert!(verdict(&e, "partition-share"));
    }
}
