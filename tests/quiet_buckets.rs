//! A token bucket near full is spent without sending each write (docs/replication.md, "A token
//! bucket near full is not sent at every decision"), between real `levee serve` processes
//! over QUIC: two regions of one node, a bucket of 100,000 refilling 1 token a second. Each
//! node starts with 50,000 units; the other gives eu its spare ones as eu's demand shows, so
//! eu's margin, a 64th of what it holds, is between 781 and 1,562 tokens.
//!
//! While the deciding node's bucket stays within the margin, the other region's `/v1/usage`
//! may lag its own by up to the margin, never the other way; once a check takes the bucket
//! past it, the write is sent and both views agree again within a few gossip intervals.

use std::time::{Duration, Instant};

use levee_blackbox::cluster::{Cluster, ClusterSpec};
use levee_blackbox::levee_binary;

const RULES: &str = r#"
[[rule]]
name = "big"
algorithm = "token_bucket"
rate = 1
per = "1s"
burst = 100000
"#;

/// The largest margin eu can have, holding every unit (a 64th of 100,000), plus a token of
/// rounding.
const MARGIN: u64 = 100_000 / 64 + 1;

fn check(c: &Cluster, node: usize, key: &str, cost: u64) {
    let body = format!(r#"{{"rule":"big","key":"{key}","cost":{cost}}}"#);
    let r = c.post(node, "/v1/check", &body).expect("check");
    assert_eq!(r.status, 200, "{r:?}");
    assert!(r.allowed(), "{}", r.body);
}

fn used(c: &Cluster, node: usize, key: &str) -> u64 {
    c.usage(node, "big", key).expect("usage")["used"]
        .as_u64()
        .expect("usage says what was used")
}

#[test]
fn a_near_full_bucket_lags_by_at_most_its_margin_and_catches_up_past_it() {
    let c = Cluster::start(&ClusterSpec::new(levee_binary(), &["eu", "us"], 1, RULES))
        .unwrap_or_else(|e| panic!("the cluster: {e}"));
    let (eu, us) = (c.nodes_in("eu")[0], c.nodes_in("us")[0]);
    let key = "tenant-quiet";
    // Checks in several gossip intervals: the key gets a forecast (its first writes are
    // sent; once it has one, writes within the margin stay at eu), then 300 more, each of
    // which leaves the bucket within the margin.
    for _ in 0..10 {
        check(&c, eu, key, 1);
        std::thread::sleep(Duration::from_millis(30));
    }
    std::thread::sleep(Duration::from_millis(200));
    assert!(used(&c, us, key) >= 1, "us never heard of the key");
    for _ in 0..300 {
        check(&c, eu, key, 1);
    }
    std::thread::sleep(Duration::from_millis(200));
    let (at_eu, at_us) = (used(&c, eu, key), used(&c, us, key));
    assert!(
        (300..=310).contains(&at_eu),
        "eu used {at_eu} of its 310 checks (refilling 0.5 a second)"
    );
    assert!(
        at_us <= at_eu && at_eu - at_us <= MARGIN,
        "us sees {at_us} used, eu {at_eu}: within {MARGIN}, never more"
    );
    assert!(
        at_us < at_eu,
        "us sees {at_us} used, eu {at_eu}: the near-full writes stayed at eu"
    );
    // One check of 2,000 takes eu's bucket past any margin it can have: that write is sent.
    check(&c, eu, key, 2_000);
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let (at_eu, at_us) = (used(&c, eu, key), used(&c, us, key));
        if at_eu.abs_diff(at_us) <= 1 && at_eu >= 2_250 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "3 s after a write past the margin, eu sees {at_eu} used and us {at_us}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
