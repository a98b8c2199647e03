//! The decision API of `API.md` against a real `levee serve` process over real HTTP:
//! `/v1/check` (single and atomic `all`), `/v1/check/batch`, `/v1/refund`, shadow mode,
//! idempotent retries, dry runs, `/v1/authz/{rule}`, `/v1/usage`, `/v1/rules`, `/v1/cluster`,
//! the health endpoints and `/metrics`.
//!
//! Windows are a day long and token buckets refill one token an hour, so nothing refills while
//! a test runs.

use levee_blackbox::{Node, Reply, encode_segment, metric, samples};
use serde_json::{Value, json};

const TOKEN: &str = "s3cret-admin";

/// Rules every test here uses. `{http}` is filled in by the harness.
const CONFIG: &str = r#"
[node]
id = "eu-1"
region = "eu"
http = {http}

[api]
admin_token = "s3cret-admin"
# The tests' client (127.0.0.1) stands for a gateway; 10.0.0.0/8 for the proxies behind it.
trusted_proxies = ["127.0.0.0/8", "10.0.0.0/8"]

[[rule]]
name = "per-tenant"
algorithm = "fixed_window"
limit = 3
window = "1d"

[[rule]]
name = "per-route"
algorithm = "fixed_window"
limit = 5
window = "1d"

[[rule]]
name = "bucket"
algorithm = "token_bucket"
rate = 1
per = "1h"
burst = 4
key_from = "header:x-api-key"

[[rule]]
name = "per-ip"
algorithm = "fixed_window"
limit = 2
window = "1d"
key_from = "ip"

[[rule]]
name = "trial"
algorithm = "fixed_window"
limit = 1
window = "1d"
mode = "shadow"
"#;

fn node() -> Node {
    Node::start(CONFIG)
}

fn check_body(rule: &str, key: &str, extra: Value) -> Value {
    let mut body = json!({ "rule": rule, "key": key });
    if let Value::Object(extra) = extra {
        body.as_object_mut().expect("an object").extend(extra);
    }
    body
}

/// The headers of `API.md` ("Rate-limit response headers") agree with the JSON of a decision.
#[track_caller]
fn assert_rate_limit_headers(r: &Reply, rule: &str, window_secs: u64) {
    let limit = r.u64("limit");
    let remaining = r.u64("remaining");
    let reset_secs = r.u64("reset_after_ms").div_ceil(1000);
    assert_eq!(
        r.header("RateLimit-Policy"),
        Some(format!("\"{rule}\";q={limit};w={window_secs}").as_str()),
        "RateLimit-Policy of {r:?}"
    );
    assert_eq!(
        r.header("RateLimit"),
        Some(format!("\"{rule}\";r={remaining};t={reset_secs}").as_str()),
        "RateLimit of {r:?}"
    );
    assert_eq!(r.header_u64("X-RateLimit-Limit"), limit);
    assert_eq!(r.header_u64("X-RateLimit-Remaining"), remaining);
    assert_eq!(r.header_u64("X-RateLimit-Reset"), reset_secs);
    if r.allowed() {
        assert_eq!(r.header("Retry-After"), None, "no Retry-After when allowed");
    } else {
        let retry = r.header_u64("Retry-After");
        assert!(retry >= 1, "Retry-After is at least 1: {r:?}");
        assert_eq!(
            retry,
            r.u64("retry_after_ms").div_ceil(1000).max(1),
            "Retry-After is retry_after_ms rounded up"
        );
    }
}

/// Every field of a decision's JSON, with its type.
#[track_caller]
fn assert_decision_fields(d: &Value, rule: &str, key: &str) {
    assert_eq!(d["rule"], rule, "{d}");
    assert_eq!(d["key"], key, "{d}");
    assert!(d["allowed"].is_boolean(), "allowed: {d}");
    for f in ["limit", "remaining", "reset_after_ms", "retry_after_ms"] {
        assert!(d[f].is_u64(), "{f} is a non-negative integer: {d}");
    }
    assert!(d["mode"] == "enforce" || d["mode"] == "shadow", "mode: {d}");
    assert_eq!(d["degraded"], false, "a single node is never degraded: {d}");
    if d["allowed"] == true && d["mode"] == "enforce" {
        assert_eq!(
            d["retry_after_ms"], 0,
            "retry_after_ms is 0 when allowed: {d}"
        );
    }
}

#[test]
fn check_allows_up_to_the_limit_then_denies_with_every_header_and_field() {
    let node = node();
    for expected_remaining in [2, 1, 0] {
        let r = node.check("per-tenant", "acme", 1);
        assert_decision_fields(&r.json, "per-tenant", "acme");
        assert!(r.allowed(), "allowed below the limit: {}", r.body);
        assert_eq!(r.u64("limit"), 3);
        assert_eq!(r.u64("remaining"), expected_remaining);
        assert_eq!(r.json["mode"], "enforce");
        assert_rate_limit_headers(&r, "per-tenant", 86_400);
    }
    // Every deny carries Retry-After, not only the first.
    for _ in 0..2 {
        let r = node.check("per-tenant", "acme", 1);
        assert_decision_fields(&r.json, "per-tenant", "acme");
        assert!(!r.allowed(), "denied at the limit: {}", r.body);
        assert_eq!(r.u64("remaining"), 0);
        assert!(r.u64("retry_after_ms") > 0, "{}", r.body);
        assert!(r.u64("reset_after_ms") > 0, "{}", r.body);
        assert_rate_limit_headers(&r, "per-tenant", 86_400);
    }
    assert_eq!(
        node.used("per-tenant", "acme"),
        3,
        "denials consume nothing"
    );
    // Another key has its own count.
    assert!(node.check("per-tenant", "globex", 1).allowed());
}

#[test]
fn check_cost_takes_that_many_tokens_and_cost_zero_is_a_pure_read() {
    let node = node();
    let r = node.check("per-route", "acme", 4);
    assert!(r.allowed());
    assert_eq!(r.u64("remaining"), 1);
    let r = node.check("per-route", "acme", 0);
    assert!(r.allowed(), "cost 0 reads: {}", r.body);
    assert_eq!(r.u64("remaining"), 1);
    assert_eq!(node.used("per-route", "acme"), 4);
    let r = node.check("per-route", "acme", 2);
    assert!(!r.allowed(), "2 tokens are not there: {}", r.body);
    assert_rate_limit_headers(&r, "per-route", 86_400);
    assert_eq!(node.used("per-route", "acme"), 4);
}

#[test]
fn token_bucket_headers_announce_the_capacity_and_the_time_to_refill_it() {
    let node = node();
    // burst 4, 1 token per hour: an empty bucket refills in 4 h.
    let r = node.check("bucket", "acme", 1);
    assert!(r.allowed());
    assert_eq!(r.u64("limit"), 4);
    assert_eq!(r.u64("remaining"), 3);
    assert_rate_limit_headers(&r, "bucket", 4 * 3600);
    let r = node.check("bucket", "acme", 3);
    assert!(r.allowed());
    assert_eq!(r.u64("remaining"), 0);
    let r = node.check("bucket", "acme", 1);
    assert!(!r.allowed());
    assert_rate_limit_headers(&r, "bucket", 4 * 3600);
    // One token comes back in an hour.
    let retry = r.u64("retry_after_ms");
    assert!(
        (3_500_000..=3_600_000).contains(&retry),
        "retry_after_ms {retry} is about one hour"
    );
}

#[test]
fn a_denied_all_call_charges_no_rule() {
    let node = node();
    // per-tenant (limit 3) is exhausted for acme; per-route (limit 5) is untouched.
    assert!(node.check("per-tenant", "acme", 3).allowed());
    let before_route = node.usage("per-route", "/search");
    let before_tenant = node.usage("per-tenant", "acme");
    let r = node.post_json(
        "/v1/check",
        &json!({ "all": [
            { "rule": "per-route", "key": "/search" },
            { "rule": "per-tenant", "key": "acme" }
        ], "cost": 1 }),
    );
    assert_eq!(r.status, 200, "{r:?}");
    assert!(
        !r.allowed(),
        "one rule denies, so the call is denied: {}",
        r.body
    );
    // The top level is the binding rule: the one that denied.
    assert_decision_fields(&r.json, "per-tenant", "acme");
    assert_eq!(r.json["rule"], "per-tenant");
    assert_eq!(r.u64("remaining"), 0);
    assert!(r.u64("retry_after_ms") > 0);
    assert_rate_limit_headers(&r, "per-tenant", 86_400);
    let results = r.json["results"].as_array().expect("results");
    assert_eq!(results.len(), 2);
    assert_decision_fields(&results[0], "per-route", "/search");
    assert_decision_fields(&results[1], "per-tenant", "acme");
    assert_eq!(results[1]["allowed"], false);
    // Nothing was consumed anywhere.
    assert_eq!(
        node.usage("per-route", "/search")["used"],
        before_route["used"]
    );
    assert_eq!(node.used("per-route", "/search"), 0);
    assert_eq!(
        node.usage("per-tenant", "acme")["used"],
        before_tenant["used"]
    );
    assert_eq!(node.used("per-tenant", "acme"), 3);
}

#[test]
fn an_allowed_all_call_charges_every_rule_and_reports_the_binding_one() {
    let node = node();
    let r = node.post_json(
        "/v1/check",
        &json!({ "all": [
            { "rule": "per-route", "key": "/search" },
            { "rule": "per-tenant", "key": "acme" },
            { "rule": "bucket", "key": "acme" }
        ], "cost": 2 }),
    );
    assert_eq!(r.status, 200, "{r:?}");
    assert!(r.allowed(), "{}", r.body);
    let results = r.json["results"].as_array().expect("results");
    assert_eq!(results.len(), 3);
    // In the order given.
    for (res, (rule, key, remaining)) in results.iter().zip([
        ("per-route", "/search", 3),
        ("per-tenant", "acme", 1),
        ("bucket", "acme", 2),
    ]) {
        assert_decision_fields(res, rule, key);
        assert_eq!(res["allowed"], true);
        assert_eq!(res["remaining"], remaining, "{res}");
    }
    // The binding rule is the most restrictive: per-tenant with 1 left.
    assert_eq!(r.json["rule"], "per-tenant", "{}", r.body);
    assert_eq!(r.json["key"], "acme");
    assert_eq!(r.u64("remaining"), 1);
    assert_rate_limit_headers(&r, "per-tenant", 86_400);
    assert_eq!(node.used("per-route", "/search"), 2);
    assert_eq!(node.used("per-tenant", "acme"), 2);
    assert_eq!(node.used("bucket", "acme"), 2);
}

#[test]
fn batch_answers_in_order_and_checks_of_one_key_see_each_other() {
    let node = node();
    let checks: Vec<Value> = [
        ("per-tenant", "a", 1),
        ("per-tenant", "b", 1),
        ("per-tenant", "a", 1),
        ("per-route", "a", 5),
        ("per-tenant", "a", 1),
        ("per-tenant", "a", 1),
    ]
    .iter()
    .map(|(rule, key, cost)| json!({ "rule": rule, "key": key, "cost": cost }))
    .collect();
    let r = node.post_json("/v1/check/batch", &json!({ "checks": checks }));
    assert_eq!(r.status, 200, "{r:?}");
    let results = r.json["results"].as_array().expect("results");
    let got: Vec<(&str, &str, bool, u64)> = results
        .iter()
        .map(|d| {
            (
                d["rule"].as_str().expect("rule"),
                d["key"].as_str().expect("key"),
                d["allowed"].as_bool().expect("allowed"),
                d["remaining"].as_u64().expect("remaining"),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            ("per-tenant", "a", true, 2),
            ("per-tenant", "b", true, 2),
            ("per-tenant", "a", true, 1),
            ("per-route", "a", true, 0),
            ("per-tenant", "a", true, 0),
            ("per-tenant", "a", false, 0),
        ]
    );
    for d in results {
        assert_decision_fields(
            d,
            d["rule"].as_str().expect("rule"),
            d["key"].as_str().expect("key"),
        );
    }
    assert_eq!(node.used("per-tenant", "a"), 3);
    assert_eq!(node.used("per-tenant", "b"), 1);
    assert_eq!(node.used("per-route", "a"), 5);
}

#[test]
fn batch_reads_escaped_strings_and_repeated_fields_as_json_does() {
    // Bodies the borrowed fast path cannot take go through the reference decoder: escaped
    // strings (answered escaped again), a field given twice (the last one counts, as in
    // `/v1/check`'s decoder), `"all": null` (absent). Counts move exactly as asked.
    let node = node();
    let body = br#"{"checks": [
        {"rule": "per-tenant", "key": "q\"u\u00e9\\t"},
        {"rule": "per-route", "key": "x", "key": "dup", "cost": 2, "all": null},
        {"rule": "per-tenant", "key": "plain", "class": null, "dry_run": false}
    ]}"#;
    let r = node.post_raw("/v1/check/batch", "application/json", body);
    assert_eq!(r.status, 200, "{}", r.body);
    let results = r.json["results"].as_array().expect("results");
    let keys: Vec<&str> = results
        .iter()
        .map(|d| d["key"].as_str().expect("key"))
        .collect();
    assert_eq!(keys, ["q\"u\u{e9}\\t", "dup", "plain"]);
    assert!(r.body.contains(r#""key":"q\"ué\\t""#), "{}", r.body);
    assert_eq!(node.used("per-tenant", "q\"u\u{e9}\\t"), 1);
    assert_eq!(node.used("per-route", "dup"), 2);
    assert_eq!(node.used("per-route", "x"), 0);
    assert_eq!(node.used("per-tenant", "plain"), 1);
    // A check given as an array is refused whichever decoder reads the rest, and nothing is
    // charged.
    let r = node.post_raw(
        "/v1/check/batch",
        "application/json",
        br#"{"checks": [{"rule": "per-tenant", "key": "plain"}, ["per-tenant", "plain"]]}"#,
    );
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(r.json["message"], "checks[1]: must be a JSON object");
    assert_eq!(node.used("per-tenant", "plain"), 1);
}

#[test]
fn batch_accepts_exactly_1000_checks() {
    let node = node();
    let checks: Vec<Value> = (0..1000)
        .map(|i| json!({ "rule": "per-route", "key": format!("k{}", i % 10) }))
        .collect();
    let r = node.post_json("/v1/check/batch", &json!({ "checks": checks }));
    assert_eq!(r.status, 200, "{}", r.body);
    let results = r.json["results"].as_array().expect("results");
    assert_eq!(results.len(), 1000);
    let allowed = results.iter().filter(|d| d["allowed"] == true).count();
    assert_eq!(allowed, 10 * 5, "5 per key for 10 keys");
    assert_eq!(node.used("per-route", "k7"), 5);
}

#[test]
fn refund_gives_tokens_back_but_never_above_the_limit() {
    let node = node();
    assert!(node.check("per-tenant", "acme", 3).allowed());
    assert!(!node.check("per-tenant", "acme", 1).allowed());
    let r = node.post_json_with_token(
        "/v1/refund",
        &json!({ "rule": "per-tenant", "key": "acme", "cost": 2 }),
        TOKEN,
    );
    assert_eq!(r.status, 200, "{r:?}");
    assert_decision_fields(&r.json, "per-tenant", "acme");
    assert_eq!(r.u64("limit"), 3);
    assert_eq!(r.u64("remaining"), 2, "{}", r.body);
    assert_eq!(node.used("per-tenant", "acme"), 1);
    assert!(
        node.check("per-tenant", "acme", 2).allowed(),
        "refunded tokens can be used"
    );
    // Refunding more than was used stops at the limit.
    for _ in 0..3 {
        let r = node.post_json_with_token(
            "/v1/refund",
            &json!({ "rule": "per-tenant", "key": "acme", "cost": 3 }),
            TOKEN,
        );
        assert_eq!(r.status, 200, "{r:?}");
        assert_eq!(r.u64("remaining"), 3, "never above the limit: {}", r.body);
    }
    assert_eq!(node.used("per-tenant", "acme"), 0);
    let u = node.usage("per-tenant", "acme");
    assert_eq!(u["remaining"], 3, "{u}");
    // And the limit still holds afterwards: 3, not more.
    assert!(node.check("per-tenant", "acme", 3).allowed());
    assert!(!node.check("per-tenant", "acme", 1).allowed());
}

#[test]
fn refund_of_a_key_never_used_stays_at_the_limit() {
    let node = node();
    let r = node.post_json_with_token(
        "/v1/refund",
        &json!({ "rule": "bucket", "key": "fresh", "cost": 4 }),
        TOKEN,
    );
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.u64("remaining"), 4, "{}", r.body);
    assert_eq!(node.used("bucket", "fresh"), 0);
    assert!(node.check("bucket", "fresh", 4).allowed());
    assert!(
        !node.check("bucket", "fresh", 1).allowed(),
        "a refund did not raise the capacity"
    );
}

#[test]
fn a_shadow_rule_always_allows_and_reports_what_it_would_decide() {
    let node = node();
    let r = node.check("trial", "acme", 1);
    assert_decision_fields(&r.json, "trial", "acme");
    assert_eq!(r.json["mode"], "shadow");
    assert!(r.allowed());
    assert_eq!(r.json["would_allow"], true, "{}", r.body);
    for _ in 0..3 {
        let r = node.check("trial", "acme", 1);
        assert_eq!(r.json["mode"], "shadow");
        assert!(r.allowed(), "shadow mode never denies: {}", r.body);
        assert_eq!(r.json["would_allow"], false, "past the limit: {}", r.body);
    }
    let m = node.metrics();
    let labels = |decision| {
        [
            ("rule", "trial"),
            ("decision", decision),
            ("mode", "shadow"),
        ]
    };
    assert_eq!(
        metric(&m, "levee_checks_total", &labels("allowed")),
        Some(1.0)
    );
    assert_eq!(
        metric(&m, "levee_checks_total", &labels("denied")),
        Some(3.0)
    );
}

#[test]
fn an_idempotent_retry_gets_the_first_decision_and_is_not_charged_again() {
    let node = node();
    let body = check_body("per-tenant", "acme", json!({ "idempotency_key": "req-1" }));
    let first = node.post_json("/v1/check", &body);
    assert_eq!(first.status, 200, "{first:?}");
    assert!(first.allowed());
    assert_eq!(first.u64("remaining"), 2);
    assert_eq!(node.used("per-tenant", "acme"), 1);
    let retry = node.post_json("/v1/check", &body);
    assert_eq!(retry.status, 200);
    assert!(retry.allowed());
    assert_eq!(
        retry.u64("remaining"),
        2,
        "the first decision: {}",
        retry.body
    );
    assert_eq!(
        node.used("per-tenant", "acme"),
        1,
        "the retry was not charged"
    );
    // Exhaust the key; a retry of the first request still gets the first decision, uncharged.
    assert!(node.check("per-tenant", "acme", 2).allowed());
    assert_eq!(node.used("per-tenant", "acme"), 3);
    let late = node.post_json("/v1/check", &body);
    assert_eq!(late.status, 200);
    assert!(
        late.allowed(),
        "the first decision was allow: {}",
        late.body
    );
    assert_eq!(late.u64("remaining"), 2);
    assert_eq!(node.used("per-tenant", "acme"), 3);
    // A different idempotency key is a new request.
    let other = node.post_json(
        "/v1/check",
        &check_body("per-tenant", "acme", json!({ "idempotency_key": "req-2" })),
    );
    assert!(!other.allowed(), "{}", other.body);
    assert_eq!(node.used("per-tenant", "acme"), 3);
}

#[test]
fn an_idempotent_all_retry_is_not_charged_again() {
    let node = node();
    let body = json!({ "all": [
        { "rule": "per-route", "key": "/search" },
        { "rule": "per-tenant", "key": "acme" }
    ], "cost": 1, "idempotency_key": "req-all" });
    let first = node.post_json("/v1/check", &body);
    assert_eq!(first.status, 200, "{first:?}");
    assert!(first.allowed());
    for _ in 0..2 {
        let again = node.post_json("/v1/check", &body);
        assert_eq!(again.status, 200);
        assert_eq!(again.json, first.json, "the same answer");
    }
    assert_eq!(node.used("per-route", "/search"), 1);
    assert_eq!(node.used("per-tenant", "acme"), 1);
}

#[test]
fn a_dry_run_decides_but_charges_nothing() {
    let node = node();
    let dry = check_body("per-tenant", "acme", json!({ "dry_run": true, "cost": 2 }));
    for _ in 0..3 {
        let r = node.post_json("/v1/check", &dry);
        assert_eq!(r.status, 200, "{r:?}");
        assert!(r.allowed());
        assert_eq!(node.used("per-tenant", "acme"), 0);
    }
    assert!(node.check("per-tenant", "acme", 3).allowed());
    let r = node.post_json("/v1/check", &dry);
    assert!(!r.allowed(), "a dry run says what would happen: {}", r.body);
    assert!(r.u64("retry_after_ms") > 0);
    assert_eq!(node.used("per-tenant", "acme"), 3);
    // An `all` dry run neither.
    let r = node.post_json(
        "/v1/check",
        &json!({ "all": [{ "rule": "per-route", "key": "x" }, { "rule": "bucket", "key": "x" }],
                 "cost": 2, "dry_run": true }),
    );
    assert!(r.allowed(), "{}", r.body);
    assert_eq!(node.used("per-route", "x"), 0);
    assert_eq!(node.used("bucket", "x"), 0);
}

#[test]
fn authz_takes_the_key_from_the_configured_header_and_the_cost_from_x_ratelimit_cost() {
    let node = node();
    let path = "/v1/authz/bucket";
    let r = node.get_with(path, &[("X-Api-Key", "acme"), ("X-RateLimit-Cost", "3")]);
    assert_eq!(r.status, 200, "{r:?}");
    assert!(
        r.body.is_empty(),
        "an allowed answer has no body: {:?}",
        r.body
    );
    assert_eq!(r.header("RateLimit-Policy"), Some("\"bucket\";q=4;w=14400"));
    assert_eq!(r.header_u64("X-RateLimit-Limit"), 4);
    assert_eq!(r.header_u64("X-RateLimit-Remaining"), 1);
    assert!(
        r.header("RateLimit")
            .is_some_and(|v| v.starts_with("\"bucket\";r=1;t="))
    );
    assert!(r.header_u64("X-RateLimit-Reset") > 0);
    assert_eq!(r.header("Retry-After"), None);
    assert_eq!(node.used("bucket", "acme"), 3);
    // Any method: a gateway may forward POST.
    let r = node.request("POST", path, &[("x-api-key", "acme")], Some(b"ignored"));
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.header_u64("X-RateLimit-Remaining"), 0);
    for _ in 0..2 {
        let r = node.get_with(path, &[("x-api-key", "acme")]);
        assert_eq!(r.status, 429, "{r:?}");
        assert_eq!(r.json["error"], "rate_limited", "{}", r.body);
        let retry_ms = r.json["retry_after_ms"].as_u64().expect("retry_after_ms");
        assert!(retry_ms > 0);
        let retry = r.header_u64("Retry-After");
        assert!(retry >= 1);
        assert_eq!(retry, retry_ms.div_ceil(1000).max(1));
        assert_eq!(r.header("RateLimit-Policy"), Some("\"bucket\";q=4;w=14400"));
        assert_eq!(r.header_u64("X-RateLimit-Remaining"), 0);
        assert_eq!(r.header_u64("X-RateLimit-Limit"), 4);
        assert!(
            r.header("RateLimit")
                .is_some_and(|v| v.starts_with("\"bucket\";r=0;t="))
        );
        assert!(r.header("X-RateLimit-Reset").is_some());
    }
    assert_eq!(node.used("bucket", "acme"), 4);
    // Another API key is another subject.
    let r = node.get_with(path, &[("x-api-key", "globex")]);
    assert_eq!(r.status, 200);
}

#[test]
fn authz_takes_the_client_ip_from_x_forwarded_for_then_x_real_ip_of_a_trusted_proxy() {
    let node = node();
    let path = "/v1/authz/per-ip";
    let r = node.get_with(path, &[("X-Forwarded-For", "203.0.113.7, 10.0.0.1")]);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.header_u64("X-RateLimit-Remaining"), 1);
    assert_eq!(
        node.used("per-ip", "203.0.113.7"),
        1,
        "the first X-Forwarded-For entry from the right that is not a trusted proxy"
    );
    let r = node.get_with(path, &[("X-Real-IP", "198.51.100.2")]);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(node.used("per-ip", "198.51.100.2"), 1);
    assert_eq!(node.used("per-ip", "203.0.113.7"), 1);
    // X-Forwarded-For wins over X-Real-IP.
    let r = node.get_with(
        path,
        &[
            ("X-Forwarded-For", "203.0.113.7"),
            ("X-Real-IP", "198.51.100.2"),
        ],
    );
    assert_eq!(r.status, 200);
    assert_eq!(node.used("per-ip", "203.0.113.7"), 2);
    let r = node.get_with(path, &[("X-Forwarded-For", "203.0.113.7")]);
    assert_eq!(r.status, 429, "{r:?}");
    assert_eq!(r.json["error"], "rate_limited");
    assert!(r.header_u64("Retry-After") >= 1);
    // Without forwarding headers, the peer address.
    let r = node.get(path);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(node.used("per-ip", "127.0.0.1"), 1);
}

#[test]
fn authz_deny_status_403_replaces_429() {
    let node = node();
    let path = "/v1/authz/per-ip?deny_status=403";
    let ip = [("X-Real-IP", "192.0.2.1")];
    assert_eq!(node.get_with(path, &ip).status, 200);
    assert_eq!(node.get_with(path, &ip).status, 200);
    let r = node.get_with(path, &ip);
    assert_eq!(r.status, 403, "{r:?}");
    assert_eq!(r.json["error"], "rate_limited");
    assert!(
        r.json["retry_after_ms"].as_u64().is_some_and(|v| v > 0),
        "{}",
        r.body
    );
    assert!(r.header_u64("Retry-After") >= 1);
    assert_eq!(r.header_u64("X-RateLimit-Remaining"), 0);
}

#[test]
fn usage_reads_a_url_encoded_key_with_its_regions() {
    let node = node();
    let key = "a/b c?d%e#f";
    let r = node.post_json(
        "/v1/check",
        &json!({ "rule": "per-route", "key": key, "cost": 2 }),
    );
    assert!(r.allowed());
    let r = node.get(&format!("/v1/usage/per-route/{}", encode_segment(key)));
    assert_eq!(r.status, 200, "{r:?}");
    let u = &r.json;
    assert_eq!(u["rule"], "per-route", "{u}");
    assert_eq!(u["key"], key, "{u}");
    assert_eq!(u["limit"], 5);
    assert_eq!(u["used"], 2);
    assert_eq!(u["remaining"], 3);
    assert!(u["reset_after_ms"].as_u64().is_some_and(|v| v > 0), "{u}");
    assert_eq!(u["regions"], json!({ "eu": 2 }), "{u}");
    // A key never used reads as untouched.
    let u = node.usage("per-route", "nobody");
    assert_eq!(u["used"], 0, "{u}");
    assert_eq!(u["remaining"], 5, "{u}");
}

#[test]
fn delete_usage_requires_the_admin_token_and_resets_the_key() {
    let node = node();
    let key = "a/b c";
    assert!(node.check("per-tenant", key, 3).allowed());
    let path = format!("/v1/usage/per-tenant/{}", encode_segment(key));
    let r = node.delete_with_token(&path, None);
    r.assert_error(401, "unauthorized", "Authorization");
    let r = node.delete_with_token(&path, Some("wrong"));
    r.assert_error(401, "unauthorized", "Authorization");
    let r = node.request("DELETE", &path, &[("authorization", TOKEN)], None);
    r.assert_error(401, "unauthorized", "Authorization");
    assert_eq!(
        node.used("per-tenant", key),
        3,
        "refused resets change nothing"
    );
    let r = node.delete_with_token(&path, Some(TOKEN));
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(node.used("per-tenant", key), 0);
    assert!(
        node.check("per-tenant", key, 3).allowed(),
        "a full limit again"
    );
}

#[test]
fn rules_lists_the_loaded_rules_in_order() {
    let node = node();
    let rules = node.rules();
    let names: Vec<&str> = rules
        .iter()
        .map(|r| r["name"].as_str().expect("name"))
        .collect();
    assert_eq!(
        names,
        ["per-tenant", "per-route", "bucket", "per-ip", "trial"]
    );
    assert_eq!(rules[0]["algorithm"], "fixed_window");
    assert_eq!(rules[0]["limit"], 3);
    assert_eq!(rules[2]["algorithm"], "token_bucket");
    assert_eq!(rules[2]["burst"], 4);
    assert_eq!(rules[4]["mode"], "shadow");
}

#[test]
fn cluster_describes_this_node_its_region_and_its_peers() {
    let node = node();
    let r = node.get("/v1/cluster");
    assert_eq!(r.status, 200, "{r:?}");
    let c = &r.json;
    assert_eq!(c["node"]["id"], "eu-1", "{c}");
    assert_eq!(c["node"]["region"], "eu", "{c}");
    assert_eq!(c["peers"], json!([]), "a single node has no peers: {c}");
    let regions = c["regions"].as_array().expect("regions");
    assert!(
        regions
            .iter()
            .any(|g| g["name"] == "eu" && g["reachable"] == true),
        "its own region is listed and reachable: {c}"
    );
    assert_eq!(c["degraded"], false, "{c}");
}

#[test]
fn healthz_and_readyz_answer_200_on_a_serving_node() {
    let node = node();
    assert_eq!(node.get("/healthz").status, 200);
    assert_eq!(node.get("/readyz").status, 200);
}

#[test]
fn metrics_count_decisions_by_rule_decision_and_mode_and_never_label_a_key() {
    let node = node();
    let secret = "tenant-7f3a9c-secret";
    let ip = "198.51.100.77";
    for _ in 0..4 {
        node.check("per-tenant", secret, 1);
    }
    node.get_with("/v1/authz/per-ip", &[("x-real-ip", ip)]);
    node.post_json(
        "/v1/check/batch",
        &json!({ "checks": [{ "rule": "bucket", "key": secret }] }),
    );
    let r = node.get("/metrics");
    assert_eq!(r.status, 200);
    assert!(
        r.header("content-type")
            .is_some_and(|v| v.starts_with("text/plain")),
        "Prometheus text: {r:?}"
    );
    let m = r.body;
    assert!(
        m.contains(r#"levee_checks_total{rule="per-tenant",decision="allowed",mode="enforce"} 3"#),
        "{m}"
    );
    let labels = |rule, decision| [("rule", rule), ("decision", decision), ("mode", "enforce")];
    assert_eq!(
        metric(&m, "levee_checks_total", &labels("per-tenant", "allowed")),
        Some(3.0)
    );
    assert_eq!(
        metric(&m, "levee_checks_total", &labels("per-tenant", "denied")),
        Some(1.0)
    );
    assert_eq!(
        metric(&m, "levee_checks_total", &labels("per-ip", "allowed")),
        Some(1.0)
    );
    assert_eq!(
        metric(&m, "levee_checks_total", &labels("bucket", "allowed")),
        Some(1.0)
    );
    // No key in any label, nor anywhere else in the exposition.
    for s in samples(&m) {
        for (k, v) in &s.labels {
            assert!(
                v != secret && v != ip && !v.contains("tenant-7f3a9c"),
                "{}{{{k}={v:?}}} labels a key",
                s.name
            );
        }
    }
    assert!(!m.contains(secret), "the key appears in /metrics");
    assert!(!m.contains(ip), "the client IP appears in /metrics");
}

#[test]
fn concurrent_checks_of_one_key_never_grant_more_than_the_limit() {
    let node = Node::start(
        r#"
[[rule]]
name = "shared"
algorithm = "fixed_window"
limit = 100
window = "1d"
"#,
    );
    let allowed: usize = std::thread::scope(|s| {
        let workers: Vec<_> = (0..8)
            .map(|_| {
                s.spawn(|| {
                    (0..40)
                        .filter(|_| node.check("shared", "hot", 1).allowed())
                        .count()
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("a worker"))
            .sum()
    });
    assert_eq!(allowed, 100, "320 concurrent checks, a limit of 100");
    assert_eq!(node.used("shared", "hot"), 100);
}

#[test]
fn batch_checks_honour_idempotency_keys() {
    // A batch holds checks as `/v1/check` takes them, `idempotency_key` included: a retried
    // batch gets its first decisions back and is not charged again.
    let node = node();
    let batch = json!({ "checks": [
        { "rule": "per-tenant", "key": "acme", "idempotency_key": "b-1" },
        { "rule": "per-tenant", "key": "acme", "idempotency_key": "b-2" }
    ] });
    let first = node.post_json("/v1/check/batch", &batch);
    assert_eq!(first.status, 200, "{first:?}");
    assert_eq!(node.used("per-tenant", "acme"), 2);
    let retry = node.post_json("/v1/check/batch", &batch);
    assert_eq!(retry.status, 200, "{retry:?}");
    assert_eq!(retry.json, first.json, "the first decisions");
    assert_eq!(
        node.used("per-tenant", "acme"),
        2,
        "the retry was not charged"
    );
}

#[test]
fn delete_usage_needs_no_token_when_none_is_configured() {
    let node = Node::start(&CONFIG.replace("admin_token = \"s3cret-admin\"", ""));
    assert!(node.check("per-tenant", "acme", 2).allowed());
    let r = node.delete_with_token("/v1/usage/per-tenant/acme", None);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(node.used("per-tenant", "acme"), 0);
}
