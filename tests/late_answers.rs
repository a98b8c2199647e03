//! An owner that answers a forwarded check after the forwarder stopped waiting, on real
//! processes: 1 region × 2 nodes on loopback (real QUIC, mutual TLS). The forwarder decides
//! the check alone after `forward_timeout`; when the stalled owner wakes and decides it too,
//! the forwarder gives the owner's admission back, so the key's usage counts what callers were
//! told (docs/replication.md, "Ownership and routing").

#[allow(
    dead_code,
    reason = "shared by the cluster tests, each of which uses part of it"
)]
mod harness;

use std::time::Duration;

use harness::*;
use levee_blackbox::{Reply, avoid_window_edge, wait_until};

/// The owner of a day quota's key is stopped (SIGSTOP) for 800 ms — past `forward_timeout`
/// (500 ms), short of the transport's redial — while its region-mate is asked a check. The mate
/// answers it alone (`degraded: true`) after the timeout; the owner, woken, decides the
/// forwarded check it had queued, and its late answer is given back: both views of the key
/// count exactly the admissions callers were told of, and the mate counts one check given
/// back (`levee_forward_late_given_back_total`).
#[test]
fn an_owners_late_admission_is_given_back_and_usage_counts_what_callers_were_told() {
    avoid_window_edge(DAY_MS, 60_000);
    let c = LocalClusterHandle::start_spec(&["eu"], 2, |_| {});
    let (rule, key) = ("daily", "late-answer");
    let (owner, _, mate) = c.owner_in_eu(rule, key);
    let both = [owner, mate];
    // The key exists at both, with the region's rights at its owner.
    c.admit(owner, rule, key, 5);
    c.wait_agreement(&both, rule, key, Duration::from_secs(3), |v| v.used == 5);
    let given_back_before = metric_sum(&c, mate, "levee_forward_late_given_back_total");

    let (reply, waited) = ask_while_the_owner_stalls(&c, owner, mate, rule, key);
    let told = 5 + u64::from(reply.allowed());

    // The woken owner decides the queued check; its admission goes back to it.
    let given_back =
        || metric_sum(&c, mate, "levee_forward_late_given_back_total") - given_back_before;
    let came_back = wait_until(Duration::from_secs(5), || given_back() >= 1.0);
    let view = c.wait_agreement(&both, rule, key, Duration::from_secs(5), |v| v.used == told);
    eprintln!(
        "the mate answered after {waited:?} (allowed: {}); given back: {}; both views: {view:?}",
        reply.allowed(),
        given_back()
    );
    assert!(came_back, "no late answer was given back");
    assert_eq!(given_back(), 1.0, "exactly the one late admission");
}

/// The same stall on a one-second window: the owner's late admission is not given back. Its
/// window ends within a second of the decision, before a refund could be sure to land in it,
/// and a refund in the next window would free a right that window never gave (the strict
/// over-admission found under overload on 2026-12-02). It stays counted, in
/// `levee_forward_late_withheld_total`, and nothing is given back.
#[test]
fn an_owners_late_admission_in_a_short_window_is_withheld_not_given_back() {
    let c = LocalClusterHandle::start_spec(&["eu"], 2, |_| {});
    let (rule, key) = ("per-second", "late-answer-short");
    let (owner, _, mate) = c.owner_in_eu(rule, key);
    let given_back = || metric_sum(&c, mate, "levee_forward_late_given_back_total");
    let withheld = || metric_sum(&c, mate, "levee_forward_late_withheld_total");
    let (given_before, withheld_before) = (given_back(), withheld());

    ask_while_the_owner_stalls(&c, owner, mate, rule, key);
    let came = wait_until(Duration::from_secs(5), || {
        withheld() - withheld_before >= 1.0
    });
    eprintln!(
        "withheld {}, given back {}",
        withheld() - withheld_before,
        given_back() - given_before
    );
    assert!(came, "the owner's late admission was not withheld");
    assert_eq!(
        withheld() - withheld_before,
        1.0,
        "exactly the one late admission"
    );
    assert_eq!(given_back() - given_before, 0.0, "nothing was given back");
}

/// Stops `owner` (SIGSTOP) for 800 ms — past `forward_timeout` (500 ms), short of the
/// transport's redial — while `mate` is asked a check of `rule`/`key`: asserts the mate
/// decided it alone; returns its reply and how long it took.
fn ask_while_the_owner_stalls(
    c: &LocalClusterHandle,
    owner: usize,
    mate: usize,
    rule: &str,
    key: &str,
) -> (Reply, Duration) {
    c.sigstop(owner);
    let asked = std::time::Instant::now();
    let reply = c.check(mate, rule, key);
    let waited = asked.elapsed();
    std::thread::sleep(Duration::from_millis(800).saturating_sub(asked.elapsed()));
    c.sigcont(owner);
    assert_eq!(
        reply.json["degraded"].as_bool(),
        Some(true),
        "the mate decided alone after the owner's silence: {}",
        reply.body
    );
    (reply, waited)
}
