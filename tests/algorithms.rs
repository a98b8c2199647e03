//! The second part of `API.md`'s algorithms and keys against a real `levee serve` process:
//! composite keys (`key_from` as a list), `sliding_log` and `leaky_bucket`.

use levee_blackbox::cluster::{Cluster, ClusterSpec};
use levee_blackbox::{Node, agent, config_check, levee_binary};
use serde_json::json;

/// Rules every test here uses. `{http}` is filled in by the harness.
const CONFIG: &str = r#"
[node]
id = "eu-1"
region = "eu"
http = {http}

[api]
trusted_proxies = ["127.0.0.0/8"]
request_timeout = "1s"

[[rule]]
name = "per-key-route"
algorithm = "fixed_window"
limit = 2
window = "1d"
key_from = ["header:x-api-key", "method", "path"]

[[rule]]
name = "per-page"
algorithm = "fixed_window"
limit = 1
window = "1d"
key_from = ["ip", "query:page"]

[[rule]]
name = "shape"
algorithm = "leaky_bucket"
rate = 1
per = "10s"
burst = 2
delay = 1
key_from = "header:x-api-key"

[[rule]]
name = "exact"
algorithm = "sliding_log"
limit = 3
window = "1d"
"#;

#[test]
fn a_composite_key_joins_its_parts_with_a_bar_in_order() {
    let node = Node::start(CONFIG);
    let path = "/v1/authz/per-key-route";
    let get_a = [
        ("x-api-key", "acme"),
        ("x-forwarded-method", "GET"),
        ("x-forwarded-uri", "/v1/orders?page=2"),
    ];
    for _ in 0..2 {
        let r = node.get_with(path, &get_a);
        assert_eq!(r.status, 200, "{r:?}");
    }
    assert_eq!(node.used("per-key-route", "acme|GET|/v1/orders"), 2);
    let r = node.get_with(path, &get_a);
    assert_eq!(r.status, 429, "{r:?}");
    // Another method, another path (nginx's X-Original-URI), another API key: other subjects.
    let post_a = [
        ("x-api-key", "acme"),
        ("x-forwarded-method", "POST"),
        ("x-forwarded-uri", "/v1/orders"),
    ];
    assert_eq!(node.get_with(path, &post_a).status, 200);
    let other_path = [("x-api-key", "acme"), ("x-original-uri", "/v1/users")];
    assert_eq!(node.get_with(path, &other_path).status, 200);
    let other_key = [("x-api-key", "globex"), ("x-forwarded-uri", "/v1/orders")];
    assert_eq!(node.get_with(path, &other_key).status, 200);
    assert_eq!(node.used("per-key-route", "acme|POST|/v1/orders"), 1);
    assert_eq!(node.used("per-key-route", "acme|GET|/v1/users"), 1);
    assert_eq!(node.used("per-key-route", "globex|GET|/v1/orders"), 1);
    // Without X-Forwarded-Method the request's own method counts.
    let r = node.request("DELETE", path, &other_key, None);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(node.used("per-key-route", "globex|DELETE|/v1/orders"), 1);
}

#[test]
fn a_missing_part_of_a_composite_key_is_missing_key_naming_it_and_counts_nothing() {
    let node = Node::start(CONFIG);
    let path = "/v1/authz/per-key-route";
    let r = node.get_with(path, &[("x-forwarded-uri", "/v1/orders")]);
    r.assert_error(400, "missing_key", "header:x-api-key");
    let r = node.get_with(path, &[("x-api-key", "acme")]);
    r.assert_error(400, "missing_key", "path");
    let r = node.get_with("/v1/authz/per-page", &[("x-forwarded-uri", "/list")]);
    r.assert_error(400, "missing_key", "query:page");
    let r = node.get_with("/v1/authz/per-page", &[("x-forwarded-uri", "/list?page=")]);
    r.assert_error(400, "missing_key", "query:page");
    assert_eq!(node.used("per-key-route", "acme|GET|/v1/orders"), 0);
}

#[test]
fn a_query_part_comes_from_the_original_uri_or_the_request_itself() {
    let node = Node::start(CONFIG);
    let r = node.get_with(
        "/v1/authz/per-page",
        &[
            ("x-forwarded-uri", "/list?sort=a&page=caf%C3%A9"),
            ("x-real-ip", "203.0.113.7"),
        ],
    );
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(node.used("per-page", "203.0.113.7|café"), 1);
    let r = node.get_with("/v1/authz/per-page?page=9", &[("x-real-ip", "203.0.113.7")]);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(node.used("per-page", "203.0.113.7|9"), 1);
    let r = node.get_with("/v1/authz/per-page?page=9", &[("x-real-ip", "203.0.113.7")]);
    assert_eq!(r.status, 429, "{r:?}");
}

#[test]
fn a_wrong_part_of_a_composite_key_is_a_configuration_error_naming_the_rule_and_the_field() {
    let (code, err) = config_check(
        "[[rule]]\nname = \"per-route\"\nalgorithm = \"fixed_window\"\nlimit = 2\nwindow = \"1d\"\nkey_from = [\"method\", \"cookie:sid\"]\n",
    );
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("rule \"per-route\": key_from[1]") && err.contains("cookie:sid"),
        "{err}"
    );
}

#[test]
fn a_sliding_log_admits_its_limit_and_says_when_the_oldest_admission_leaves_the_window() {
    let node = Node::start(CONFIG);
    let r = node.check("exact", "acme", 2);
    assert!(r.allowed(), "{}", r.body);
    assert_eq!(r.u64("remaining"), 1);
    assert!(node.check("exact", "acme", 1).allowed());
    let r = node.check("exact", "acme", 1);
    assert!(!r.allowed(), "{}", r.body);
    let day = 86_400_000;
    let retry = r.u64("retry_after_ms");
    assert!(retry > day - 60_000 && retry <= day, "{}", r.body);
    assert_eq!(node.used("exact", "acme"), 3);
    let rule = node.rule("exact").expect("the rule is listed");
    assert_eq!(rule["algorithm"], "sliding_log", "{rule}");
    // A bad request changes nothing.
    let r = node.post_json(
        "/v1/check",
        &json!({"rule": "exact", "key": "acme", "cost": -1}),
    );
    assert_eq!(r.status, 400, "{r:?}");
    assert_eq!(node.used("exact", "acme"), 3);
}

#[test]
fn a_sliding_log_limit_above_10000_is_a_configuration_error_naming_the_rule_and_the_field() {
    let (code, err) = config_check(
        "[[rule]]\nname = \"exact\"\nalgorithm = \"sliding_log\"\nlimit = 10001\nwindow = \"1m\"\n",
    );
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("rule \"exact\": limit") && err.contains("10000"),
        "{err}"
    );
}

#[test]
fn a_leaky_bucket_answers_delay_ms_the_first_delay_at_once_then_waits_then_refuses() {
    let node = Node::start(CONFIG);
    let answers: Vec<(bool, Option<u64>)> = (0..5)
        .map(|_| {
            let r = node.check("shape", "acme", 1);
            (r.allowed(), r.json["delay_ms"].as_u64())
        })
        .collect();
    // 1 per 10 s, burst 2, delay 1: the first, then one excess at once, then one waiting about
    // an interval (less the time the requests took), then refused.
    assert_eq!(answers[0], (true, Some(0)), "{answers:?}");
    assert_eq!(answers[1], (true, Some(0)), "{answers:?}");
    let (allowed, waited) = answers[2];
    assert!(allowed, "{answers:?}");
    assert!(
        waited.is_some_and(|ms| ms > 5_000 && ms <= 10_000),
        "{answers:?}"
    );
    assert_eq!(answers[3], (false, Some(0)), "{answers:?}");
    assert_eq!(
        node.rule("shape").expect("listed")["algorithm"],
        "leaky_bucket"
    );
    // Other algorithms' answers carry no delay_ms.
    let r = node.check("exact", "acme", 1);
    assert!(r.json.get("delay_ms").is_none(), "{}", r.body);
    // A batch answers it too.
    let r = node.post_json(
        "/v1/check/batch",
        &json!({"checks": [{"rule": "shape", "key": "globex"}]}),
    );
    assert_eq!(r.json["results"][0]["delay_ms"], 0, "{}", r.body);
}

#[test]
fn authz_holds_a_delayed_answer_up_to_the_request_timeout_and_answers_200() {
    let node = Node::start(CONFIG);
    let path = "/v1/authz/shape";
    for _ in 0..2 {
        let r = node.get_with(path, &[("x-api-key", "acme")]);
        assert_eq!(r.status, 200, "{r:?}");
    }
    // The third waits about 10 s in the bucket: the answer is held until shortly before
    // api.request_timeout (1 s, less a 50 ms margin), and is still a 200.
    let started = std::time::Instant::now();
    let r = node.get_with(path, &[("x-api-key", "acme")]);
    let held = started.elapsed();
    assert_eq!(r.status, 200, "{r:?}");
    assert!(
        held >= std::time::Duration::from_millis(950),
        "held {held:?}"
    );
    let r = node.get_with(path, &[("x-api-key", "acme")]);
    assert_eq!(r.status, 429, "{r:?}");
}

#[test]
fn a_leaky_bucket_delay_above_its_burst_is_a_configuration_error_naming_the_rule_and_the_field() {
    let (code, err) = config_check(
        "[[rule]]\nname = \"shape\"\nalgorithm = \"leaky_bucket\"\nrate = 5\nper = \"1s\"\nburst = 2\ndelay = 3\n",
    );
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("rule \"shape\": delay"), "{err}");
}

/// A decision the key's owner made for a region-mate travels back with its `delay_ms`.
#[test]
fn a_forwarded_leaky_bucket_decision_carries_its_delay() {
    let rules = "[[rule]]\nname = \"shape\"\nalgorithm = \"leaky_bucket\"\nrate = 1\nper = \"1h\"\nburst = 6\n";
    let spec = ClusterSpec::new(levee_binary(), &["eu"], 2, rules);
    let cluster = Cluster::start(&spec).unwrap_or_else(|e| panic!("{e}"));
    let agent = agent(std::time::Duration::from_secs(5));
    let mut answers = Vec::new();
    for i in 0..6 {
        let url = cluster.url(i % 2, "/v1/check");
        let resp = agent
            .post(&url)
            .header("content-type", "application/json")
            .send(r#"{"rule":"shape","key":"acme"}"#)
            .expect("the node answers");
        let text = resp.into_body().read_to_string().expect("a body");
        let body: serde_json::Value = serde_json::from_str(&text).expect("JSON");
        answers.push(body);
    }
    // One of the two nodes owns the key and decides every check; the other forwards (its
    // answers have no local_remaining).
    let forwarded: Vec<&serde_json::Value> = answers
        .iter()
        .filter(|a| a.get("local_remaining").is_none())
        .collect();
    assert!(!forwarded.is_empty(), "{answers:#?}");
    // With delay = 0 every request after the first waits; a forwarded one says so too.
    for a in &answers[1..] {
        if a["allowed"] == true {
            assert!(
                a["delay_ms"].as_u64().is_some_and(|d| d > 0),
                "{answers:#?}"
            );
        }
    }
    assert!(
        forwarded
            .iter()
            .any(|a| a["allowed"] == true && a["delay_ms"].as_u64().is_some_and(|d| d > 0)),
        "{answers:#?}"
    );
}
