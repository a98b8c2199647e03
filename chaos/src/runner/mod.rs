//! Runs one scenario: starts the cluster behind the proxy, drives the load from every region
//! while the script injects its faults, measures agreement after heals and at the end,
//! evaluates the invariants, and writes the report.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use levee_core::hash::fnv1a;

use crate::cluster::{ChaosCluster, ClusterSpec, NODES, REGIONS, port_is_free, reachable_of};
use crate::load::{LoadControl, Role, Stream, Target, now_ms, run_stream, sleep_until_ms};
use crate::record::{
    Agreement, ImpostorWatch, Interval, IntervalKind, Partition, RestartFailure, RunData,
    StopEvent, StopKind,
};
use crate::report::{Cleanup, Report};
use crate::scenario::{
    Action, GOSSIP_INTERVAL_MS, Links, MAIN_PER_SECOND_PER_NODE, MAIN_RULE, PROBE_PER_SECOND,
    PROBE_QUIET_MS, PROBE_RULE, RULES, SUSPECT_AFTER_MS, Scenario, WINDOW_MS,
};
use levee_blackbox::cluster::View;
use levee_blackbox::{agent, http, metric};

mod agreement;
mod impostor;

use agreement::{agreed_view, measure_agreement, wait_detection};
use impostor::impostor;

/// How long views may take to agree before `heal-agreement` / `final-agreement` fail. Far
/// above the design's target: after a partition longer than QUIC's idle timeout (3 s) the
/// links must be redialled, and a link that failed to dial backs off up to 5 s.
pub const AGREEMENT_BOUND_MS: u64 = 15_000;
/// How long the harness waits for every node to notice a partition.
const DETECTION_BOUND: Duration = Duration::from_secs(4);

/// How to run.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// The `levee` binary.
    pub binary: PathBuf,
    /// Where `<scenario>.json` and `<scenario>.svg` go.
    pub report_dir: PathBuf,
    /// The run's seed; each scenario's is derived from it and its name.
    pub seed: u64,
    /// Also write every decision to `<scenario>.decisions.csv`.
    pub keep_decisions: bool,
    /// Keep the cluster's directory (configurations, logs, data) even when every check held.
    pub keep_files: bool,
}

/// Runs `scenario` and writes its report; returns the report (also on failure).
pub fn run(scenario: &Scenario, opts: &RunOptions) -> Report {
    let seed = opts.seed ^ fnv1a(scenario.name.as_bytes());
    let started_ms = now_ms();
    let wall = Instant::now();
    avoid_day_edge();
    let mut data = RunData {
        duration_ms: scenario.duration_ms,
        ..RunData::default()
    };
    let mut node_logs = BTreeMap::new();
    let mut kept_files = None;
    let mut pids = Vec::new();
    let mut ports = 0..0;
    let mut error = None;
    let spec = ClusterSpec {
        binary: opts.binary.clone(),
        rules_toml: RULES.to_owned(),
        gossip_interval_ms: GOSSIP_INTERVAL_MS,
        suspect_after_ms: SUSPECT_AFTER_MS,
        clock_offsets_ms: [0; NODES],
        seed,
    };
    let evaluation = match start_cluster(spec, scenario) {
        Err(e) => {
            error = Some(e);
            None
        }
        Ok(mut cluster) => {
            if let Err(e) = drive(&mut cluster, scenario, &mut data) {
                error = Some(e);
            }
            let evaluation = crate::checks::evaluate(&data);
            let failed = error.is_some() || evaluation.checks.iter().any(|c| !c.passed);
            if failed {
                for i in 0..NODES {
                    node_logs.insert(cluster.id(i).to_owned(), cluster.log_tail(i, 40));
                }
            }
            if failed || opts.keep_files {
                kept_files = Some(cluster.keep_files().display().to_string());
            }
            pids = cluster.pids().to_vec();
            ports = cluster.ports();
            drop(cluster);
            Some(evaluation)
        }
    };
    let cleanup = Cleanup {
        processes_left: pids
            .iter()
            .copied()
            .filter(|p| process_exists(*p))
            .collect(),
        ports_busy: ports.filter(|&p| !port_is_free(p)).collect(),
    };
    let mut report = Report::new(
        scenario,
        seed,
        started_ms,
        wall.elapsed(),
        &data,
        evaluation,
        error,
        cleanup,
        node_logs,
        kept_files,
    );
    report.write(&opts.report_dir, &data, opts.keep_decisions);
    report
}

/// Whether process `pid` still exists (and is not a zombie).
fn process_exists(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => false,
        // The state follows the command name in parentheses.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z')),
    }
}

/// The probe key's window is a UTC day: keep a run from crossing midnight.
fn avoid_day_edge() {
    const DAY_MS: u64 = 86_400_000;
    let left = DAY_MS - now_ms() % DAY_MS;
    if left < 120_000 {
        std::thread::sleep(Duration::from_millis(left + 500));
    }
}

fn start_cluster(mut spec: ClusterSpec, scenario: &Scenario) -> Result<ChaosCluster, String> {
    for (id, offset) in &scenario.clock_offsets {
        let i = node_index(id)?;
        spec.clock_offsets_ms[i] = *offset;
    }
    ChaosCluster::start(spec)
}

/// The index of node `id` (`<region>-<n>`, counted region by region).
fn node_index(id: &str) -> Result<usize, String> {
    let (region, n) = id.rsplit_once('-').ok_or_else(|| format!("no node {id}"))?;
    let r = REGIONS
        .iter()
        .position(|x| *x == region)
        .ok_or_else(|| format!("no region {region}"))?;
    let n: usize = n.parse().map_err(|_| format!("no node {id}"))?;
    if n == 0 || n > crate::cluster::NODES_PER_REGION {
        return Err(format!("no node {id}"));
    }
    Ok(r * crate::cluster::NODES_PER_REGION + n - 1)
}

/// A key of `rule` named `<prefix>-<n>`; if `owner` is given, one that node owns in its
/// region.
fn choose_key(
    c: &ChaosCluster,
    rule: &str,
    prefix: &str,
    owner: Option<usize>,
) -> Result<String, String> {
    let Some(owner) = owner else {
        return Ok(format!("{prefix}-0"));
    };
    let asked = c
        .nodes_in(c.region_of(owner))
        .into_iter()
        .find(|&i| i != owner)
        .unwrap_or(owner);
    for n in 0..1_000 {
        let key = format!("{prefix}-{n}");
        let u = c.usage(asked, rule, &key)?;
        if u["owner"] == c.id(owner) {
            return Ok(key);
        }
    }
    Err(format!("no key {prefix}-* is owned by {}", c.id(owner)))
}

/// Everything between a ready cluster and the evaluation.
fn drive(c: &mut ChaosCluster, s: &Scenario, data: &mut RunData) -> Result<(), String> {
    data.node_ids = (0..NODES).map(|i| c.id(i).to_owned()).collect();
    data.node_regions = (0..NODES)
        .map(|i| ChaosCluster::region_index(c.region_of(i)))
        .collect();
    for (id, offset) in &s.clock_offsets {
        data.offsets[node_index(id)?] = *offset;
    }
    let owner = s.owner.map(node_index).transpose()?;
    data.main_key = choose_key(c, MAIN_RULE, &format!("{}-main", s.name), owner)?;
    data.probe_key = choose_key(c, PROBE_RULE, &format!("{}-probe", s.name), owner)?;
    data.owners = REGIONS
        .iter()
        .map(|r| {
            let first = c.nodes_in(r)[0];
            let u = c.usage(first, MAIN_RULE, &data.main_key)?;
            let id = u["owner"].as_str().unwrap_or_default();
            c.idx(id)
                .ok_or_else(|| format!("{r}: no owner of the main key in {u}"))
        })
        .collect::<Result<_, _>>()?;

    let mut streams = Vec::new();
    for (target, rule, key, shift) in [
        (Target::Main, MAIN_RULE, &data.main_key, 0.0),
        (Target::Probe, PROBE_RULE, &data.probe_key, 0.5),
    ] {
        let mut body = serde_json::json!({ "rule": rule, "key": key });
        if let (Target::Main, Some(ms)) = (target, s.max_wait_ms) {
            body["max_wait_ms"] = ms.into();
        }
        let body = body.to_string();
        for i in 0..NODES {
            streams.push(Stream {
                node: i,
                target,
                per_second: match target {
                    Target::Main => MAIN_PER_SECOND_PER_NODE[data.node_regions[i]],
                    Target::Probe => PROBE_PER_SECOND,
                },
                url: c.url(i, "/v1/check"),
                body: body.clone(),
                phase: (i as f64 + shift) / NODES as f64,
            });
        }
    }

    let mut origin = (now_ms() / WINDOW_MS + 1) * WINDOW_MS;
    if origin.saturating_sub(now_ms()) < 300 {
        origin += WINDOW_MS;
    }
    data.origin_ms = origin;
    let end = origin + s.duration_ms;
    for (id, offset) in &s.clock_offsets {
        data.intervals.push(Interval {
            label: format!("{id} clock {offset:+} ms"),
            kind: IntervalKind::Skew,
            start_ms: origin,
            end_ms: Some(end),
        });
    }

    let control = LoadControl::new();
    let script = std::thread::scope(|scope| {
        let handles: Vec<_> = streams
            .iter()
            .map(|st| {
                let control = &control;
                scope.spawn(move || run_stream(st, control, origin, s.duration_ms))
            })
            .collect();
        let script = run_script(c, s, &control, data);
        if script.is_err() {
            control.stop();
        }
        for h in handles {
            match h.join() {
                Ok(d) => data.decisions.extend(d),
                Err(_) => data.script_errors.push("a load thread panicked".into()),
            }
        }
        script
    });
    data.decisions.sort_by_key(|d| d.sent_ms);

    // The load is over: heal everything, close what is still open, and see that every view
    // agrees.
    c.proxy().clear();
    let now = now_ms();
    for i in data.intervals.iter_mut().filter(|i| i.end_ms.is_none()) {
        i.end_ms = Some(now.max(end));
    }
    c.check_alive();
    for f in &mut data.restart_failures {
        if let Ok(i) = node_index(&f.node) {
            f.readyz_at_end = Some(match c.get(i, "/readyz") {
                Ok(r) => format!(
                    "{} {} ({} ms after it was started)",
                    r.status,
                    r.body.trim(),
                    now_ms().saturating_sub(f.started_ms)
                ),
                Err(e) => format!("no answer: {e}"),
            });
        }
    }
    data.probe_admitted = control.probe_admitted();
    if script.is_ok() {
        let a = measure_agreement(c, &control, data, "final", 0, None);
        data.agreements.push(a);
    }
    c.check_alive();
    data.crashes.extend(c.crashes().iter().cloned());
    data.proxy = c.proxy().counts();
    script
}

/// Runs the script's steps in order, each no earlier than its time.
fn run_script(
    c: &mut ChaosCluster,
    s: &Scenario,
    control: &LoadControl,
    data: &mut RunData,
) -> Result<(), String> {
    let origin = data.origin_ms;
    for st in &s.steps {
        let at = origin + st.at_ms;
        if matches!(st.action, Action::Heal | Action::Settle) {
            sleep_until_ms(at.saturating_sub(PROBE_QUIET_MS) as f64, None);
            control.set_probe(false);
        }
        sleep_until_ms(at as f64, None);
        let result = step(c, control, data, &st.action);
        c.check_alive();
        if let Err(e) = result {
            let e = format!("step at {} ms ({:?}): {e}", st.at_ms, st.action);
            data.script_errors.push(e.clone());
            return Err(e);
        }
    }
    Ok(())
}

/// The two sides of a partition, as region indices: the cut-off regions and the others.
type Sides = (Vec<usize>, Vec<usize>);

/// The directed pairs `links` names, and the sides of the partition it makes.
fn pairs(c: &ChaosCluster, links: Links) -> (Vec<(usize, usize)>, Option<Sides>) {
    let region = |i: usize| c.region_of(i);
    let mut out = Vec::new();
    for a in 0..NODES {
        for b in 0..NODES {
            if a == b {
                continue;
            }
            let take = match links {
                Links::IsolateRegion(r) => {
                    region(a) != region(b) && (region(a) == r || region(b) == r)
                }
                Links::OneWayFrom(r) => region(a) == r && region(b) != r,
                Links::InterRegion => region(a) != region(b),
                Links::All => true,
            };
            if take {
                out.push((a, b));
            }
        }
    }
    let sides = match links {
        Links::IsolateRegion(r) | Links::OneWayFrom(r) => {
            let a = vec![ChaosCluster::region_index(r)];
            let b = (0..REGIONS.len()).filter(|x| !a.contains(x)).collect();
            Some((a, b))
        }
        _ => None,
    };
    (out, sides)
}

fn step(
    c: &mut ChaosCluster,
    control: &LoadControl,
    data: &mut RunData,
    action: &Action,
) -> Result<(), String> {
    match action {
        Action::Faults {
            label,
            links,
            faults,
        } => {
            let (pairs, sides) = pairs(c, *links);
            for &(a, b) in &pairs {
                c.proxy().set(a, b, *faults);
            }
            let now = now_ms();
            data.intervals.push(Interval {
                label: (*label).to_owned(),
                kind: IntervalKind::Fault,
                start_ms: now,
                end_ms: None,
            });
            if faults.cut
                && let Some((side_a, side_b)) = sides
            {
                let detected_ms = wait_detection(c, control, &side_a, &side_b);
                data.partitions.push(Partition {
                    label: (*label).to_owned(),
                    side_a,
                    side_b,
                    symmetric: matches!(links, Links::IsolateRegion(_)),
                    cut_ms: now,
                    heal_ms: None,
                    detected_ms,
                });
            }
            Ok(())
        }
        Action::Heal => {
            c.proxy().clear();
            let now = now_ms();
            for i in data
                .intervals
                .iter_mut()
                .filter(|i| i.kind == IntervalKind::Fault && i.end_ms.is_none())
            {
                i.end_ms = Some(now);
            }
            for p in data.partitions.iter_mut().filter(|p| p.heal_ms.is_none()) {
                p.heal_ms = Some(now);
            }
            let a = measure_agreement(c, control, data, "heal", 0, None);
            data.agreements.push(a);
            control.set_probe(true);
            Ok(())
        }
        Action::Settle => {
            // One write of the probe key on the last member (in `ap`), then the time until
            // every view holds it.
            let rtt = max_rtt(c);
            let writer = (0..NODES)
                .rev()
                .find(|&i| control.role(i) == Role::Up && c.is_running(i));
            let a = measure_agreement(c, control, data, "settle", rtt, writer);
            data.agreements.push(a);
            control.set_probe(true);
            Ok(())
        }
        Action::Kill9(id) => {
            let i = node_index(id)?;
            control.set_role(i, Role::Down);
            let at = now_ms();
            c.kill9(i)?;
            went_down(data, i, StopKind::Kill9, format!("{id} killed"), at);
            Ok(())
        }
        Action::Stop(id) => stop(c, control, data, id),
        Action::Start(id) => start(c, control, data, id),
        Action::Restart(id) => {
            stop(c, control, data, id)?;
            start(c, control, data, id)
        }
        Action::Impostor { node, for_ms } => {
            let watch = impostor(c, control, data, node, *for_ms);
            let failed = watch.error.clone();
            data.impostor = Some(watch);
            match failed {
                Some(e) => Err(e),
                None => Ok(()),
            }
        }
    }
}

fn stop(
    c: &mut ChaosCluster,
    control: &LoadControl,
    data: &mut RunData,
    id: &str,
) -> Result<(), String> {
    let i = node_index(id)?;
    control.set_role(i, Role::Down);
    let at = now_ms();
    match c.stop(i) {
        Some(status) if status.success() => {}
        Some(status) => data.crashes.push(format!(
            "{id} exited with {status} on SIGTERM; log tail:\n{}",
            c.log_tail(i, 30)
        )),
        None => return Err(format!("{id} was not running")),
    }
    went_down(data, i, StopKind::Term, format!("{id} stopped"), at);
    Ok(())
}

/// Records that node `i` went down at `at_ms` (`kind`): the stop, and an open interval
/// labelled `label` on the plot.
fn went_down(data: &mut RunData, i: usize, kind: StopKind, label: String, at_ms: u64) {
    data.stops.push(StopEvent {
        node: i,
        kind,
        at_ms,
        ready_ms: None,
    });
    data.intervals.push(Interval {
        label,
        kind: IntervalKind::Down,
        start_ms: at_ms,
        end_ms: None,
    });
}

fn start(
    c: &mut ChaosCluster,
    control: &LoadControl,
    data: &mut RunData,
    id: &str,
) -> Result<(), String> {
    let i = node_index(id)?;
    let started_ms = now_ms();
    if let Err(error) = c.start_node(i) {
        if !c.is_running(i) {
            return Err(error);
        }
        // Running but not ready (or not redialled): a finding, not a reason to stop the run.
        // The load leaves it alone unless it is ready after all.
        let ready = c.get(i, "/readyz").is_ok_and(|r| r.status == 200);
        if ready {
            control.set_role(i, Role::Up);
        }
        let prefix = format!("{id} ");
        let at_s = started_ms.saturating_sub(data.origin_ms) as f64 / 1_000.0;
        if let Some(iv) = data.intervals.iter_mut().rev().find(|iv| {
            iv.kind == IntervalKind::Down && iv.end_ms.is_none() && iv.label.starts_with(&prefix)
        }) {
            iv.label = if ready {
                format!("{} (restarted at {at_s:.1} s, not redialled)", iv.label)
            } else {
                format!("{} (restarted at {at_s:.1} s, never ready)", iv.label)
            };
        }
        data.restart_failures.push(RestartFailure {
            node: id.to_owned(),
            started_ms,
            error,
            readyz_at_end: None,
        });
        return Ok(());
    }
    let ready = now_ms();
    control.set_role(i, Role::Up);
    if let Some(s) = data
        .stops
        .iter_mut()
        .rev()
        .find(|s| s.node == i && s.ready_ms.is_none())
    {
        s.ready_ms = Some(ready);
    }
    let prefix = format!("{id} ");
    if let Some(iv) = data.intervals.iter_mut().rev().find(|iv| {
        iv.kind == IntervalKind::Down && iv.end_ms.is_none() && iv.label.starts_with(&prefix)
    }) {
        iv.end_ms = Some(ready);
    }
    Ok(())
}

/// The largest nominal round trip between two nodes under the faults in force, ms.
fn max_rtt(c: &ChaosCluster) -> u64 {
    let p = c.proxy();
    (0..NODES)
        .flat_map(|a| (0..NODES).filter(move |&b| b != a).map(move |b| (a, b)))
        .map(|(a, b)| p.faults(a, b).max_one_way_ms() + p.faults(b, a).max_one_way_ms())
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_ids_map_to_their_index() {
        assert_eq!(node_index("eu-1"), Ok(0));
        assert_eq!(node_index("us-2"), Ok(3));
        assert_eq!(node_index("ap-2"), Ok(5));
        assert!(node_index("ap-3").is_err());
        assert!(node_index("xx-1").is_err());
    }
}
