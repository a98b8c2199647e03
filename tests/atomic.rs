//! An atomic `all` call whose keys have different owners (API.md: "nothing is consumed unless
//! every one of them allows"), on a real cluster of one region of two nodes: one key is owned
//! by the node asked, the other by its region-mate. Whichever entry denies, the other's
//! reservation is given back where it was taken, as `/v1/usage` shows on both nodes; a
//! retried call (same idempotency key) gives nothing back twice; a dry run takes nothing.

use std::time::Duration;

use levee_blackbox::cluster::{Cluster, ClusterSpec};
use levee_blackbox::{avoid_window_edge, levee_binary, wait_until};
use serde_json::{Value, json};

/// Day windows: nothing resets within the test, so every figure is exact.
const RULES: &str = r#"
[[rule]]
name = "small"
algorithm = "fixed_window"
limit = 3
window = "1d"

[[rule]]
name = "big"
algorithm = "fixed_window"
limit = 1000
window = "1d"
"#;

/// The first key of `prefix-0`, `prefix-1`, … whose owner in the region is node `owner`.
fn key_owned_by(c: &Cluster, asked: usize, owner: usize, rule: &str, prefix: &str) -> String {
    (0..200)
        .map(|i| format!("{prefix}-{i}"))
        .find(|k| c.usage(asked, rule, k).expect("usage")["owner"].as_str() == Some(c.id(owner)))
        .unwrap_or_else(|| panic!("no key {prefix}-N owned by {} in 200 tries", c.id(owner)))
}

fn used(c: &Cluster, node: usize, rule: &str, key: &str) -> u64 {
    c.usage(node, rule, key).expect("usage")["used"]
        .as_u64()
        .expect("usage has used")
}

/// Waits until both nodes count `want` for `rule/key`; the figures seen otherwise.
#[track_caller]
fn both_count(c: &Cluster, rule: &str, key: &str, want: u64) {
    let mut seen = (0, 0);
    let ok = wait_until(Duration::from_secs(3), || {
        seen = (used(c, 0, rule, key), used(c, 1, rule, key));
        seen == (want, want)
    });
    assert!(
        ok,
        "{rule}/{key}: the nodes count {seen:?}, not {want} on both"
    );
}

fn all_call(c: &Cluster, node: usize, body: &Value) -> Value {
    let r = c.post(node, "/v1/check", &body.to_string()).expect("check");
    assert_eq!(r.status, 200, "{}", r.body);
    serde_json::from_str(&r.body).expect("a JSON answer")
}

/// `all` calls through `node` until `n` were allowed (denials while rights move to the keys'
/// owners are retried after 50 ms, for up to 10 s); after each, the first entry's count must
/// be the number allowed so far: a denied call took nothing. Returns the number allowed.
#[track_caller]
fn calls_until_allowed(c: &Cluster, node: usize, body: &Value, n: u64) -> u64 {
    let entry = &body["all"][0];
    let (rule, key) = (
        entry["rule"].as_str().expect("rule"),
        entry["key"].as_str().expect("key"),
    );
    let started = std::time::Instant::now();
    let mut allowed = 0;
    let mut denied = 0;
    while allowed < n {
        let a = all_call(c, node, body);
        if a["allowed"] == true {
            allowed += 1;
        } else {
            denied += 1;
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "{allowed} of {n} allowed after {denied} denials in 10 s: {a}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(
            used(c, node, rule, key),
            allowed,
            "{rule}/{key} after {allowed} allowed and {denied} denied calls: {a}"
        );
    }
    allowed
}

#[test]
fn an_all_call_across_owners_consumes_nothing_unless_every_rule_allows() {
    // A release at another owner is made only while the day's window outlasts it by 30 s
    // (a refund in the next day would free a right that day never gave): the whole test,
    // some 25 s, runs well inside one day.
    avoid_window_edge(86_400_000, 120_000);
    let c = Cluster::start(&ClusterSpec::new(levee_binary(), &["eu"], 2, RULES))
        .unwrap_or_else(|e| panic!("the cluster: {e}"));
    let asked = 0;
    let mate = 1;
    // `small` is decided where it is asked, `big` at the region-mate; then the other way.
    let here = key_owned_by(&c, asked, asked, "small", "tenant");
    let there = key_owned_by(&c, asked, mate, "big", "route");
    let body = |small: &str, big: &str| json!({ "all": [ {"rule": "small", "key": small}, {"rule": "big", "key": big} ] });

    // 1. The local entry binds. In strict mode a node may hold too little of `small` at first
    //    (its rights move to the key's owner within a few gossip intervals) and deny while
    //    the cluster has room: every call, allowed or denied, must leave `big` counting
    //    exactly the allowed calls. Once `small` is used up everywhere, every call is denied
    //    and gives its `big` reservation back.
    let allowed = calls_until_allowed(&c, asked, &body(&here, &there), 3);
    assert_eq!(allowed, 3);
    both_count(&c, "big", &there, 3);
    for i in 0..3 {
        let a = all_call(&c, asked, &body(&here, &there));
        assert_eq!(a["allowed"], false, "call {i} after the limit: {a}");
        assert_eq!(
            a["rule"], "small",
            "the binding rule is the one that denied: {a}"
        );
        assert_eq!(a["results"][1]["allowed"], false, "{a}");
        // Each entry was decided where its key is counted: `small` here (this node's share
        // is known), `big` by its owner (it is not).
        assert!(a["results"][0]["local_remaining"].is_u64(), "{a}");
        assert!(
            a["results"][1].get("local_remaining").is_none(),
            "the region-mate's key is decided by the region-mate: {a}"
        );
        assert_eq!(
            a["results"][1]["remaining"].as_u64(),
            Some(997),
            "the released entry shows what is left after the release: {a}"
        );
    }
    both_count(&c, "small", &here, 3);
    both_count(&c, "big", &there, 3);

    // 2. The remote entry binds: the local reservation is given back.
    let there_small = key_owned_by(&c, asked, mate, "small", "ip");
    let here_big = key_owned_by(&c, asked, asked, "big", "path");
    let body2 = json!({ "all": [ {"rule": "big", "key": here_big}, {"rule": "small", "key": there_small} ] });
    assert_eq!(calls_until_allowed(&c, asked, &body2, 3), 3);
    both_count(&c, "big", &here_big, 3);
    for i in 0..3 {
        let a = all_call(&c, asked, &body2);
        assert_eq!(a["allowed"], false, "call {i} after the limit: {a}");
        assert_eq!(a["rule"], "small", "{a}");
    }
    both_count(&c, "small", &there_small, 3);
    both_count(&c, "big", &here_big, 3);

    // 3. A denied call retried with its idempotency key: the same answer, nothing given back
    //    twice, nothing taken again.
    let mut retried = body2.clone();
    retried["idempotency_key"] = json!("retry-me");
    let first = all_call(&c, asked, &retried);
    let again = all_call(&c, asked, &retried);
    assert_eq!(first["allowed"], false, "{first}");
    assert_eq!(again["allowed"], false, "{again}");
    both_count(&c, "small", &there_small, 3);
    both_count(&c, "big", &here_big, 3);

    // 4. A dry run across owners takes nothing, allowed or not.
    let fresh_here = key_owned_by(&c, asked, asked, "small", "dry");
    let mut dry = body(&fresh_here, &there);
    dry["dry_run"] = json!(true);
    let d = all_call(&c, asked, &dry);
    assert_eq!(d["allowed"], true, "{d}");
    both_count(&c, "small", &fresh_here, 0);
    both_count(&c, "big", &there, 3);

    // 5. A bad entry is refused naming it, before anything is taken.
    let bad = json!({ "all": [ {"rule": "big", "key": there}, {"rule": "nope", "key": "x"} ] });
    let r = c.post(asked, "/v1/check", &bad.to_string()).expect("check");
    assert_eq!(r.status, 404, "{}", r.body);
    assert!(
        r.body.contains("all[1]"),
        "the error names the entry: {}",
        r.body
    );
    both_count(&c, "big", &there, 3);
}

/// A batch through a node that owns some of its keys and not others: each check is decided
/// where its key is counted (the region-mate's keys by the region-mate, which answers without
/// `local_remaining`), in the order given (the checks of one key see each other's
/// consumption), and the answers come back in the order of the checks.
#[test]
fn a_batch_is_decided_check_by_check_where_each_key_belongs_in_order() {
    let c = Cluster::start(&ClusterSpec::new(levee_binary(), &["eu"], 2, RULES))
        .unwrap_or_else(|e| panic!("the cluster: {e}"));
    let (asked, mate) = (0, 1);
    let here = key_owned_by(&c, asked, asked, "big", "batch-here");
    let there = key_owned_by(&c, asked, mate, "big", "batch-there");
    let keys: Vec<&str> = (0..12)
        .map(|i| {
            if i % 3 == 0 {
                here.as_str()
            } else {
                there.as_str()
            }
        })
        .collect();
    let checks: Vec<Value> = keys
        .iter()
        .map(|k| json!({"rule": "big", "key": k}))
        .collect();
    let r = c
        .post(
            asked,
            "/v1/check/batch",
            &json!({ "checks": checks }).to_string(),
        )
        .expect("batch");
    assert_eq!(r.status, 200, "{}", r.body);
    let results = r.json["results"].as_array().expect("results");
    assert_eq!(results.len(), keys.len());
    let mut seen_here = 0;
    let mut seen_there = 0;
    for (i, (res, key)) in results.iter().zip(&keys).enumerate() {
        assert_eq!(
            res["key"].as_str(),
            Some(*key),
            "result {i} answers check {i}"
        );
        assert_eq!(res["allowed"], true, "{res}");
        let n = if *key == here {
            seen_here += 1;
            assert!(res["local_remaining"].is_u64(), "decided here: {res}");
            seen_here
        } else {
            seen_there += 1;
            assert!(
                res.get("local_remaining").is_none(),
                "decided by the region-mate: {res}"
            );
            seen_there
        };
        assert_eq!(
            res["remaining"].as_u64(),
            Some(1000 - n),
            "check {i} sees the checks of its key before it: {res}"
        );
    }
    both_count(&c, "big", &here, 4);
    both_count(&c, "big", &there, 8);
}
