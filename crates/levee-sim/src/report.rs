//! A single run in detail, for replaying a seed.

use std::fmt::Write as _;

use crate::checks::Policy;
use crate::outcome::RunOutcome;
use crate::plan::{FaultKind, RunPlan, T0};

/// The plan, every policy's windows for the keys that matter, heals and violations.
pub fn describe(plan: &RunPlan, outcome: &RunOutcome) -> String {
    let mut s = String::new();
    let t = &plan.topology;
    let _ = writeln!(
        s,
        "seed {} scenario {}: {} regions, nodes {:?}, weights {:?}, limit {} per {} ms window, {} ms, {} requests",
        plan.seed,
        plan.scenario.name(),
        t.regions(),
        t.nodes_per_region,
        t.weights,
        plan.limit,
        plan.window_ms,
        plan.duration_ms,
        plan.requests.len()
    );
    let _ = writeln!(
        s,
        "region limits (sum of node splits): {:?}",
        plan.region_limits()
    );
    let _ = writeln!(s, "one-way ms: {:?}", t.one_way_ms);
    let _ = writeln!(
        s,
        "net: jitter ≤{} ms, loss {:.3}, duplicate {:.3}, reorder {:.3} (≤{} ms); clock offsets {:?}",
        plan.net.jitter_ms,
        plan.net.loss,
        plan.net.duplicate,
        plan.net.reorder,
        plan.net.reorder_ms,
        plan.offsets
    );
    let _ = writeln!(
        s,
        "protocol: gossip {} ms, suspect_after {} ms, anti-entropy {} ms",
        plan.protocol.gossip_interval,
        plan.protocol.suspect_after,
        plan.protocol.anti_entropy_interval
    );
    for (i, l) in plan.lists.iter().enumerate().skip(1) {
        let _ = writeln!(s, "list {i}: {}", l.describe());
    }
    for f in &plan.faults {
        let what = match f.kind {
            FaultKind::Cut { from, to } => format!("cut r{from} -> r{to}"),
            FaultKind::Mend { from, to } => format!("mend r{from} -> r{to}"),
            FaultKind::Crash { node } => format!("crash node {node}"),
            FaultKind::Restart { node, offset } => {
                format!("restart node {node} (clock offset {offset} ms)")
            }
            FaultKind::Start { node, list, offset } => {
                format!("start new node {node} with list {list} (clock offset {offset} ms)")
            }
            FaultKind::Reload { node, list } => format!("reload node {node} with list {list}"),
            FaultKind::Freeze { node } => format!("freeze node {node}"),
            FaultKind::Thaw { node } => format!("thaw node {node}"),
            FaultKind::Leave { node } => format!("node {node} leaves (POST /admin/leave)"),
        };
        let _ = writeln!(s, "  {:>6} ms  {what}", f.at);
    }
    for e in &plan.episodes {
        let _ = writeln!(
            s,
            "episode {:?}: {}..{} ms (last down from {}), sides {:?}",
            e.kind, e.start, e.heal, e.last_down, e.sides
        );
    }
    // A mixed run counts a key in several buckets (`mixed::ledger_key`): each of the
    // first key's.
    let mut keys: Vec<u32> = if plan.mixed {
        (0..crate::mixed::SLOTS)
            .map(|slot| crate::mixed::ledger_key(plan, 0, slot))
            .collect()
    } else {
        vec![0]
    };
    if let Some(p) = plan.probe {
        keys.push(p);
    }
    for run in &outcome.runs {
        for (&(k, _), b) in &run.ledger.windows {
            if b.admitted_total() > plan.limit && !keys.contains(&k) && keys.len() < 5 {
                keys.push(k);
            }
        }
    }
    // And the keys strict admitted least of, against the central counter (up to three).
    let admitted = |policy: Policy| {
        outcome
            .runs
            .iter()
            .find(|r| r.policy == policy)
            .map(|r| r.ledger.admitted_by_key())
            .unwrap_or_default()
    };
    let (strict, central) = (admitted(Policy::Strict), admitted(Policy::Central));
    let mut short: Vec<(u64, u32)> = central
        .iter()
        .filter_map(|(&k, &c)| {
            let gap = c.saturating_sub(strict.get(&k).copied().unwrap_or(0));
            (gap > 0 && !keys.contains(&k)).then_some((gap, k))
        })
        .collect();
    short.sort_by(|a, b| b.cmp(a));
    keys.extend(short.iter().take(3).map(|&(_, k)| k));
    // Each ledger key's name and limit (a mixed run's buckets have their own).
    let bound = |k: u32| {
        if plan.mixed {
            let (b, name) = crate::mixed::bound_of(plan, k);
            (name, b.limit)
        } else {
            (plan.keys[k as usize].clone(), plan.limit)
        }
    };
    for run in &outcome.runs {
        let _ = writeln!(s, "\n== {} ==", run.policy.name());
        if let Some(n) = run.net {
            let _ = writeln!(
                s,
                "network: {} sent, {} delivered, {} lost, {} cut, {} duplicated, {} forwards \
                 retransmitted",
                n.sent, n.delivered, n.lost, n.cut, n.duplicated, n.retransmitted
            );
        }
        for &(k, at, tokens) in &run.ledger.forgotten {
            let _ = writeln!(
                s,
                "key {}: {tokens} tokens admitted by a node that crashed at {at} ms were lost with it",
                bound(k).0
            );
        }
        for &k in &keys {
            let _ = writeln!(
                s,
                "key {}: window | demand by region | admitted by region | total | /limit{}",
                bound(k).0,
                match run.policy {
                    Policy::Strict => " | lost with crashes | not pulled back",
                    _ => "",
                }
            );
            for (&(_, w), b) in run.ledger.windows.range((k, 0)..(k + 1, 0)) {
                let r = t.regions();
                let extra = match run.policy {
                    Policy::Strict => format!(" | {} | {}", b.forgotten, b.unrecovered),
                    _ => String::new(),
                };
                let _ = writeln!(
                    s,
                    "  {:>3} | {:?} | {:?} | {} | {:.3}{}",
                    w as i64 - (T0 / plan.window_ms) as i64,
                    &b.demand[..r],
                    &b.admitted[..r],
                    b.admitted_total(),
                    b.admitted_total() as f64 / bound(k).1 as f64,
                    extra
                );
            }
        }
        if run.policy == Policy::Strict {
            let _ = writeln!(
                s,
                "rights of {} per node at the end of each window (held = split + received - given / consumed; a token bucket or sliding window: units of capacity, received and given since the key began, consumed not counted):",
                plan.keys[0]
            );
            for (&w, nodes) in &run.rights {
                let cells: Vec<String> = nodes
                    .iter()
                    .map(|r| {
                        let Some(r) = r else {
                            return "?".to_owned();
                        };
                        format!(
                            "{}{}={}+{}-{}/{}",
                            if r.up { "" } else { "down:" },
                            r.held(),
                            r.split,
                            r.received,
                            r.given,
                            r.consumed
                        )
                    })
                    .collect();
                let rel = w as i64 - (T0 / plan.window_ms) as i64;
                let _ = writeln!(s, "  {rel:>3} | {}", cells.join(" "));
            }
        }
        if run
            .heals
            .iter()
            .any(|h| h.usage_ms.is_none() || h.equal_ms.is_none())
        {
            let _ = writeln!(s, "probe key's state on every live node at the end:");
            for (n, v) in run.probe_views.iter().enumerate() {
                let _ = writeln!(s, "  node {n}: {v:?}");
            }
        }
        for h in &run.heals {
            let _ = writeln!(
                s,
                "heal at {} ms ({:?}, detected {}): usage views equal after {:?} ms, whole states equal after {:?} ms, all held the heal's state after {:?} ms, target {} ms",
                h.heal_at, h.kind, h.detected, h.usage_ms, h.equal_ms, h.dominate_ms, h.target_ms
            );
        }
    }
    let _ = writeln!(s);
    if outcome.violations.is_empty() {
        let _ = writeln!(s, "no violation");
    } else {
        for v in &outcome.violations {
            let _ = writeln!(s, "VIOLATION {v}");
        }
        let _ = writeln!(s, "replay: {}", outcome.replay_command());
    }
    s
}
