//! `cluster.local_first` on real processes: 2 regions × 2 nodes on loopback (real QUIC, mutual
//! TLS), every node with `local_first = true`. A node that is not a key's owner decides the
//! checks it holds rights for and forwards only the rest to the owner
//! (docs/replication.md, "Ownership and routing").
//!
//! The tests of this file run one at a time, like the other cluster tests (the harness's
//! process-wide lock).

#[allow(
    dead_code,
    reason = "shared by the cluster tests, each of which uses part of it"
)]
mod harness;

use std::time::Duration;

use harness::*;

/// Two regions of two nodes, every one with `cluster.local_first`.
fn start() -> LocalClusterHandle {
    LocalClusterHandle::start_spec(&["eu", "us"], 2, |spec| {
        spec.cluster_extra = vec!["local_first = true".to_owned(); 4];
    })
}

/// Strictness does not depend on where a check is decided: a key overloaded from all four
/// nodes at four times its limit never admits more than the limit in a window, although the
/// nodes that do not own it now decide part of its checks themselves.
#[test]
fn with_local_first_no_window_admits_more_than_the_limit_when_every_node_overloads_a_key() {
    let c = start();
    let (rule, key) = ("per-second", "hammered-locally");
    let (owner, _, mate) = c.owner_in_eu(rule, key);
    let forwarded_before = metric_sum(&c, mate, "levee_forwarded_checks_total");
    // Two streams per node at 100 checks per second: 800 per second, four times the limit.
    let samples = overload_every_node(&c, rule, key, 5, "local_first overload");
    let admitted = samples.iter().filter(|s| s.allowed()).count();
    // Part of what the eu mate admitted it decided itself: it sent its owner fewer checks
    // than it was asked.
    let sent_to_mate = samples.iter().filter(|s| s.node == mate).count() as f64;
    let forwarded = metric_sum(&c, mate, "levee_forwarded_checks_total") - forwarded_before;
    eprintln!(
        "admitted {admitted}; {} (not the owner, {}) forwarded {forwarded} of the {sent_to_mate} \
         checks it was asked",
        c.id(mate),
        c.id(owner)
    );
    assert!(
        forwarded < sent_to_mate,
        "the mate forwarded every check ({forwarded} of {sent_to_mate}): nothing was decided \
         where it was asked"
    );
}

/// Under the limit, a node that does not own a key soon holds the rights its own demand needs
/// and stops forwarding: after a few seconds at 40 checks a second, fewer than one check in ten
/// asked of it goes to the owner, every check is admitted, every node's view of the key's
/// usage counts every admission once, and a refund asked of the mate is given back.
#[test]
fn with_local_first_a_non_owner_decides_the_checks_it_holds_rights_for_and_usage_counts_them_once()
{
    let c = start();
    let (rule, key) = ("durable", "asked-of-a-mate");
    let (_, owner_id, mate) = c.owner_in_eu(rule, key);
    let at_mate = [Demand {
        node: mate,
        per_second: 40.0,
    }];
    // Warm-up: the mate's forecast forms and the owner gives it rights for it.
    let warm = run_load(&c, rule, key, &at_mate, now_ms() + 50, 3_000);
    let before = metric_sum(&c, mate, "levee_forwarded_checks_total");
    let measured = run_load(&c, rule, key, &at_mate, now_ms() + 50, 3_000);
    let forwarded = metric_sum(&c, mate, "levee_forwarded_checks_total") - before;
    let asked = measured.len() as f64;
    let admitted = warm.iter().chain(&measured).filter(|s| s.allowed()).count() as u64;
    eprintln!(
        "{} (owner {owner_id}) forwarded {forwarded} of {asked} checks after the warm-up; \
         {admitted} admitted in all",
        c.id(mate)
    );
    assert_eq!(
        admitted,
        (warm.len() + measured.len()) as u64,
        "a check under the limit was denied"
    );
    assert!(
        forwarded < asked / 10.0,
        "the mate forwarded {forwarded} of {asked} checks after a 3 s warm-up"
    );
    // Every node's usage of the key settles at the admissions, counted once wherever they
    // were decided.
    let every: Vec<usize> = (0..c.len()).collect();
    let settle = |used: u64| {
        c.wait_agreement(&every, rule, key, Duration::from_secs(5), |v| {
            v.used == used
        });
    };
    settle(admitted);
    // A refund asked of the mate is given back where the checks were counted: every view
    // drops by it.
    let r =
        c.c.post(
            mate,
            "/v1/refund",
            &serde_json::json!({ "rule": rule, "key": key, "cost": 10 }).to_string(),
        )
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.status, 200, "{}", r.body);
    settle(admitted - 10);
}
