//! What `remaining` tells a client in a cluster (docs/algorithms.md, "What `remaining`
//! says"): the key's global estimate, the same figure `/v1/usage` answers and the
//! `X-RateLimit-Remaining` and `RateLimit` headers carry, not the share of the limit the
//! deciding node holds; that share is `local_remaining`. Against a real 3 × 2 strict cluster.

use levee_blackbox::cluster::{Cluster, ClusterSpec};
use levee_blackbox::levee_binary;
use serde_json::Value;

/// 600 per hour: split six ways in strict mode, 100 per node. No refill within the test, so
/// every figure is exact. And a bucket of 600 refilling 1 token a second: the cluster refills
/// one token in 1 s, a node's sixth of it in 6 s.
const RULES: &str = r#"
[[rule]]
name = "hourly"
algorithm = "fixed_window"
limit = 600
window = "1h"

[[rule]]
name = "slow-bucket"
algorithm = "token_bucket"
rate = 1
per = "1s"
burst = 600
"#;

fn check_body(key: &str) -> String {
    format!(r#"{{"rule":"hourly","key":"{key}"}}"#)
}

#[test]
fn remaining_is_the_global_estimate_in_the_answer_the_headers_and_usage() {
    let cluster = Cluster::start(&ClusterSpec::new(
        levee_binary(),
        &["eu", "us", "ap"],
        2,
        RULES,
    ))
    .unwrap_or_else(|e| panic!("the cluster: {e}"));
    let key = "fresh-tenant";
    let eu = cluster.nodes_in("eu");
    let owner_id = cluster.usage(eu[0], "hourly", key).expect("usage")["owner"]
        .as_str()
        .expect("usage names the key's owner")
        .to_owned();
    let owner = cluster.idx(&owner_id).expect("the owner is a node");
    let other = *eu.iter().find(|&&i| i != owner).expect("a region-mate");

    // The first check of a fresh key, at its owner.
    let first = cluster
        .post(owner, "/v1/check", &check_body(key))
        .expect("check");
    assert_eq!(first.status, 200, "{first:?}");
    assert!(first.allowed(), "{}", first.body);
    assert_eq!(first.u64("limit"), 600);
    assert_eq!(
        first.u64("remaining"),
        599,
        "one of 600 used in the whole cluster: {}",
        first.body
    );
    let local = first.u64("local_remaining");
    assert!(
        local < 599,
        "local_remaining is this node's share, not the global figure: {}",
        first.body
    );
    assert_eq!(first.header_u64("x-ratelimit-remaining"), 599);
    let ratelimit = first.header("ratelimit").expect("a RateLimit header");
    assert!(ratelimit.contains(";r=599;"), "{ratelimit}");
    let usage = cluster.usage(owner, "hourly", key).expect("usage");
    assert_eq!(usage["remaining"].as_u64(), Some(599), "{usage}");
    assert_eq!(usage["used"].as_u64(), Some(1), "{usage}");

    // Through a region-mate: the owner decides and its global figure comes back; the share
    // of the node that decided is not known here, so `local_remaining` is absent.
    let second = cluster
        .post(other, "/v1/check", &check_body(key))
        .expect("check");
    assert_eq!(second.status, 200, "{second:?}");
    assert!(second.allowed(), "{}", second.body);
    assert_eq!(second.u64("remaining"), 598, "{}", second.body);
    assert_eq!(second.header_u64("x-ratelimit-remaining"), 598);
    assert_eq!(
        second.json.get("local_remaining"),
        None::<&Value>,
        "{}",
        second.body
    );

    // A batch and an atomic call say the same.
    let batch = cluster
        .post(
            owner,
            "/v1/check/batch",
            &format!(r#"{{"checks":[{}]}}"#, check_body(key)),
        )
        .expect("batch");
    assert_eq!(batch.status, 200, "{batch:?}");
    assert_eq!(
        batch.json["results"][0]["remaining"].as_u64(),
        Some(597),
        "{}",
        batch.body
    );
    let all = cluster
        .post(
            owner,
            "/v1/check",
            &format!(r#"{{"all":[{{"rule":"hourly","key":"{key}"}}]}}"#),
        )
        .expect("all");
    assert_eq!(all.status, 200, "{all:?}");
    assert_eq!(all.u64("remaining"), 596, "{}", all.body);
    assert_eq!(
        all.json["results"][0]["remaining"].as_u64(),
        Some(596),
        "{}",
        all.body
    );
    let usage = cluster.usage(owner, "hourly", key).expect("usage");
    assert_eq!(usage["remaining"].as_u64(), Some(596), "{usage}");
}

#[test]
fn reset_after_is_when_the_global_figure_is_back_to_the_limit() {
    let cluster = Cluster::start(&ClusterSpec::new(
        levee_binary(),
        &["eu", "us", "ap"],
        2,
        RULES,
    ))
    .unwrap_or_else(|e| panic!("the cluster: {e}"));
    let key = "fresh-bucket";
    let eu = cluster.nodes_in("eu");
    let owner_id = cluster.usage(eu[0], "slow-bucket", key).expect("usage")["owner"]
        .as_str()
        .expect("usage names the key's owner")
        .to_owned();
    let owner = cluster.idx(&owner_id).expect("the owner is a node");
    let first = cluster
        .post(
            owner,
            "/v1/check",
            r#"{"rule":"slow-bucket","key":"fresh-bucket"}"#,
        )
        .expect("check");
    assert_eq!(first.status, 200, "{first:?}");
    assert_eq!(first.u64("remaining"), 599, "{}", first.body);
    // One token short of 600 at the cluster's rate of 1 a second: back within a second (the
    // node's own sub-bucket, refilling a sixth of that, would take 6 s).
    let reset = first.u64("reset_after_ms");
    assert!(
        (1..=1_000).contains(&reset),
        "reset_after_ms {reset}: not the global figure's: {}",
        first.body
    );
    assert_eq!(first.header_u64("x-ratelimit-reset"), 1, "{}", first.body);
}
