//! Per-key overrides, allow and deny lists (API.md "Per-key overrides, allow and deny lists")
//! against real `levee serve` processes: every endpoint and every bad input on one node, the
//! answers' and headers' figures, `/v1/authz`'s 403 for a denied key, a `ttl`, a restart with
//! `data_dir`, `[[rule.override]]` in the configuration; then in a real local cluster: an
//! override written on one region's node decides on every other node, and in strict mode the
//! override's limit holds across the whole cluster.

use std::time::Duration;

use levee_blackbox::{Node, Reply, encode_segment, metric, wait_until};
use serde_json::{Value, json};

const TOKEN: &str = "s3cret-admin";

const CONFIG: &str = r#"
[node]
id = "eu-1"
region = "eu"
http = {http}
data_dir = {data_dir}
max_overrides = 5

[api]
admin_token = "s3cret-admin"

[[rule]]
name = "per-tenant"
algorithm = "fixed_window"
limit = 3
window = "1d"

[[rule.override]]
key = "internal-*"
action = "allow"

[[rule.override]]
key = "internal-audit"
limit = 4

[[rule]]
name = "bucket"
algorithm = "token_bucket"
rate = 1
per = "1h"
burst = 2
key_from = "header:x-api-key"
"#;

fn path(rule: &str, key: &str) -> String {
    format!(
        "/v1/overrides/{}/{}",
        encode_segment(rule),
        encode_segment(key)
    )
}

fn put(node: &Node, rule: &str, key: &str, body: &Value) -> Reply {
    put_raw(node, rule, key, body.to_string().as_bytes(), Some(TOKEN))
}

fn put_raw(node: &Node, rule: &str, key: &str, body: &[u8], token: Option<&str>) -> Reply {
    let auth = token.map(|t| format!("Bearer {t}"));
    let mut headers = vec![("content-type", "application/json")];
    if let Some(a) = auth.as_deref() {
        headers.push(("authorization", a));
    }
    node.request("PUT", &path(rule, key), &headers, Some(body))
}

fn admitted(node: &Node, rule: &str, key: &str, n: usize) -> usize {
    (0..n)
        .filter(|_| node.check(rule, key, 1).allowed())
        .count()
}

#[test]
fn an_override_changes_a_keys_figures_answers_and_headers_until_it_is_deleted() {
    let node = Node::start(CONFIG);
    assert_eq!(admitted(&node, "per-tenant", "acme", 5), 3);
    let r = put(&node, "per-tenant", "acme", &json!({"limit": 10}));
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(
        r.json,
        json!({"rule": "per-tenant", "key": "acme", "limit": 10})
    );
    let c = node.check("per-tenant", "acme", 1);
    assert!(c.allowed(), "{c:?}");
    assert_eq!((c.u64("limit"), c.u64("remaining")), (10, 6));
    assert_eq!(c.header_u64("x-ratelimit-limit"), 10);
    assert_eq!(c.header_u64("x-ratelimit-remaining"), 6);
    assert!(
        c.header("ratelimit-policy")
            .is_some_and(|p| p.contains("q=10")),
        "{c:?}"
    );
    assert_eq!(node.usage("per-tenant", "acme")["limit"], 10);
    assert_eq!(admitted(&node, "per-tenant", "acme", 10), 6);

    let got = node.get(&path("per-tenant", "acme"));
    assert_eq!((got.status, &got.json), (200, &r.json));
    let list = node.get("/v1/overrides/per-tenant");
    assert_eq!(list.status, 200);
    assert_eq!(list.json, json!({"overrides": [r.json]}));

    // A bucket rule takes a rate and a burst (the burst defaults to the rate).
    let b = put(&node, "bucket", "k", &json!({"rate": 5}));
    assert_eq!(
        b.json,
        json!({"rule": "bucket", "key": "k", "rate": 5, "burst": 5})
    );
    assert_eq!(admitted(&node, "bucket", "k", 8), 5);

    let d = node.delete_with_token(&path("per-tenant", "acme"), Some(TOKEN));
    assert_eq!(d.status, 204, "{d:?}");
    node.get(&path("per-tenant", "acme"))
        .assert_error(404, "not_found", "acme");
    let c = node.check("per-tenant", "acme", 1);
    assert!(!c.allowed());
    assert_eq!(c.u64("limit"), 3);
    assert_eq!(
        node.get("/v1/overrides/per-tenant").json,
        json!({"overrides": []})
    );
    // Deleting what is not there is still 204.
    let d = node.delete_with_token(&path("per-tenant", "acme"), Some(TOKEN));
    assert_eq!(d.status, 204);
}

#[test]
fn allow_and_deny_lists_decide_without_counting() {
    let node = Node::start(CONFIG);
    put(&node, "per-tenant", "vip", &json!({"action": "allow"}));
    for _ in 0..6 {
        let c = node.check("per-tenant", "vip", 1);
        assert!(c.allowed(), "{c:?}");
        assert_eq!(c.json["list"], "allow");
    }
    assert_eq!(node.used("per-tenant", "vip"), 0);

    let r = put(&node, "bucket", "abuser", &json!({"action": "deny"}));
    assert_eq!(
        r.json,
        json!({"rule": "bucket", "key": "abuser", "action": "deny"})
    );
    let c = node.check("bucket", "abuser", 1);
    assert!(!c.allowed());
    assert_eq!(
        (c.json["list"].as_str(), c.u64("retry_after_ms")),
        (Some("deny"), 0)
    );
    let a = node.get_with("/v1/authz/bucket", &[("x-api-key", "abuser")]);
    assert_eq!(a.status, 403, "{a:?}");
    assert_eq!(a.json, json!({"error": "denied"}));
    // Another key of the same rule is limited as before: 2, then 429.
    let ok = node.get_with("/v1/authz/bucket", &[("x-api-key", "fine")]);
    assert_eq!(ok.status, 200);
    node.get_with("/v1/authz/bucket", &[("x-api-key", "fine")]);
    let limited = node.get_with("/v1/authz/bucket", &[("x-api-key", "fine")]);
    assert_eq!(limited.status, 429);

    // In a batch, each check says its list.
    let b = node.post_json(
        "/v1/check/batch",
        &json!({"checks": [
            {"rule": "per-tenant", "key": "vip"},
            {"rule": "bucket", "key": "abuser"},
            {"rule": "per-tenant", "key": "plain"},
        ]}),
    );
    assert_eq!(b.status, 200, "{b:?}");
    let lists: Vec<Value> = b.json["results"]
        .as_array()
        .expect("results")
        .iter()
        .map(|r| r["list"].clone())
        .collect();
    assert_eq!(lists, vec![json!("allow"), json!("deny"), Value::Null]);
    // An atomic call with a denied key consumes nothing.
    let all = node.post_json(
        "/v1/check",
        &json!({"all": [
            {"rule": "per-tenant", "key": "plain"},
            {"rule": "bucket", "key": "abuser"},
        ]}),
    );
    assert_eq!(all.status, 200, "{all:?}");
    assert!(!all.allowed());
    assert_eq!(node.used("per-tenant", "plain"), 1);
}

#[test]
fn the_configuration_gives_prefixes_and_exact_keys_and_a_runtime_override_wins() {
    let node = Node::start(CONFIG);
    let c = node.check("per-tenant", "internal-batch", 1);
    assert_eq!(c.json["list"], "allow");
    assert_eq!(admitted(&node, "per-tenant", "internal-batch", 10), 10);
    // The exact key wins over the prefix.
    assert_eq!(admitted(&node, "per-tenant", "internal-audit", 10), 4);
    // A runtime override wins over the configuration.
    put(&node, "per-tenant", "internal-batch", &json!({"limit": 1}));
    assert_eq!(admitted(&node, "per-tenant", "internal-batch", 5), 1);
    // `/v1/rules` shows the configured overrides.
    let rules = node.get("/v1/rules");
    assert_eq!(
        rules.json["rules"][0]["override"][1]["key"],
        "internal-audit"
    );
}

#[test]
fn bad_bodies_unknown_rules_and_missing_tokens_are_refused_naming_the_field() {
    let node = Node::start(CONFIG);
    for (rule, body, field) in [
        ("bucket", json!({"limit": 5}), "limit"),
        ("per-tenant", json!({"rate": 5}), "rate"),
        ("per-tenant", json!({"limit": 0}), "limit"),
        ("per-tenant", json!({"limit": -1}), "limit"),
        ("per-tenant", json!({"limit": 1.5}), "limit"),
        (
            "per-tenant",
            json!({"limit": 1_000_000_000_001u64}),
            "limit",
        ),
        ("per-tenant", json!({"limit": "5"}), "limit"),
        ("bucket", json!({"rate": 0}), "rate"),
        ("bucket", json!({"rate": 1, "burst": 0}), "burst"),
        (
            "bucket",
            json!({"rate": 1, "burst": 1_000_000_001u64}),
            "burst",
        ),
        ("bucket", json!({"burst": 3}), "rate"),
        ("per-tenant", json!({"action": "maybe"}), "action"),
        (
            "per-tenant",
            json!({"action": "allow", "limit": 3}),
            "limit",
        ),
        ("per-tenant", json!({"limit": 3, "colour": "red"}), "colour"),
        ("per-tenant", json!({"limit": 3, "ttl": "soon"}), "ttl"),
        ("per-tenant", json!({"limit": 3, "ttl": "0s"}), "ttl"),
        ("per-tenant", json!({"limit": 3, "ttl": "-1h"}), "ttl"),
        ("per-tenant", json!({"limit": 3, "ttl": "400d"}), "ttl"),
        ("per-tenant", json!({"limit": 3, "ttl": 60}), "ttl"),
        ("per-tenant", json!({}), "limit"),
    ] {
        let r = put(&node, rule, "k", &body);
        r.assert_error(400, "invalid_request", field);
        assert!(
            r.json["message"]
                .as_str()
                .is_some_and(|m| m.starts_with(field)),
            "{body}: the message starts with {field}: {r:?}"
        );
    }
    put_raw(&node, "per-tenant", "k", b"[1]", Some(TOKEN)).assert_error(
        400,
        "invalid_request",
        "object",
    );
    put_raw(&node, "per-tenant", "k", b"{\"limit\":", Some(TOKEN)).assert_error(
        400,
        "invalid_request",
        "malformed",
    );
    let r = node.request(
        "PUT",
        &path("per-tenant", "k"),
        &[
            ("content-type", "text/plain"),
            ("authorization", "Bearer s3cret-admin"),
        ],
        Some(b"limit=5"),
    );
    assert_eq!(r.status, 415);
    put(&node, "nope", "k", &json!({"limit": 3})).assert_error(404, "unknown_rule", "nope");
    node.get(&path("nope", "k"))
        .assert_error(404, "unknown_rule", "nope");
    node.get("/v1/overrides/nope")
        .assert_error(404, "unknown_rule", "nope");
    node.delete_with_token(&path("nope", "k"), Some(TOKEN))
        .assert_error(404, "unknown_rule", "nope");
    let long = "k".repeat(513);
    put(&node, "per-tenant", &long, &json!({"limit": 3})).assert_error(
        400,
        "invalid_request",
        "key",
    );
    // Writing needs the admin token; reading does not.
    put_raw(&node, "per-tenant", "k", br#"{"limit":3}"#, None).assert_error(
        401,
        "unauthorized",
        "",
    );
    put_raw(&node, "per-tenant", "k", br#"{"limit":3}"#, Some("wrong")).assert_error(
        401,
        "unauthorized",
        "",
    );
    node.delete_with_token(&path("per-tenant", "k"), None)
        .assert_error(401, "unauthorized", "");
    // Nothing above was stored or counted.
    assert_eq!(
        node.get("/v1/overrides/per-tenant").json,
        json!({"overrides": []})
    );
    assert_eq!(node.used("per-tenant", "k"), 0);
    // Every answer above was counted as an overrides request.
    let refused = metric(
        &node.metrics(),
        "levee_http_requests_total",
        &[("endpoint", "overrides"), ("status", "4xx")],
    );
    assert!(refused.is_some_and(|n| n >= 30.0), "{refused:?}");
    // The table is bounded (`max_overrides = 5`): the sixth is refused, a rewrite is not.
    for i in 0..5 {
        assert_eq!(
            put(&node, "per-tenant", &format!("t{i}"), &json!({"limit": 9})).status,
            200
        );
    }
    put(&node, "per-tenant", "t5", &json!({"limit": 9})).assert_error(
        409,
        "too_many_overrides",
        "max_overrides",
    );
    assert_eq!(
        put(&node, "per-tenant", "t4", &json!({"limit": 8})).status,
        200
    );
}

#[test]
fn an_override_with_a_ttl_disappears_by_itself() {
    let node = Node::start(CONFIG);
    let r = put(
        &node,
        "per-tenant",
        "trial",
        &json!({"limit": 50, "ttl": "1s"}),
    );
    assert_eq!(r.status, 200);
    let left = r.u64("expires_in_ms");
    assert!(left > 0 && left <= 1_000, "{r:?}");
    assert_eq!(node.check("per-tenant", "trial", 1).u64("limit"), 50);
    assert!(
        wait_until(Duration::from_secs(5), || node
            .get(&path("per-tenant", "trial"))
            .status
            == 404),
        "the override is gone after its ttl"
    );
    assert_eq!(node.check("per-tenant", "trial", 1).u64("limit"), 3);
    assert_eq!(
        node.get("/v1/overrides/per-tenant").json,
        json!({"overrides": []})
    );
}

#[test]
fn overrides_survive_a_restart_with_a_data_dir() {
    let mut node = Node::start(CONFIG);
    put(&node, "per-tenant", "big", &json!({"limit": 7}));
    put(&node, "bucket", "bad", &json!({"action": "deny"}));
    put(&node, "per-tenant", "gone", &json!({"limit": 9}));
    node.delete_with_token(&path("per-tenant", "gone"), Some(TOKEN));
    assert_eq!(admitted(&node, "per-tenant", "big", 5), 5);
    node.restart();
    assert_eq!(node.get(&path("per-tenant", "big")).json["limit"], 7);
    assert_eq!(node.get(&path("bucket", "bad")).json["action"], "deny");
    assert_eq!(node.get(&path("per-tenant", "gone")).status, 404);
    // The key's count and its own limit came back together: 5 of 7 used.
    assert_eq!(admitted(&node, "per-tenant", "big", 5), 2);
}

// ---------------------------------------------------------------------------------------------
// A real local cluster: two regions of two nodes
// ---------------------------------------------------------------------------------------------

mod cluster {
    use std::sync::{Mutex, MutexGuard};
    use std::time::Duration;

    use levee_blackbox::cluster::{Cluster, ClusterSpec};
    use levee_blackbox::{Reply, encode_segment, levee_binary, wait_until};
    use serde_json::json;

    const RULES: &str = r#"
[[rule]]
name = "daily"
algorithm = "fixed_window"
limit = 600
window = "1d"

[[rule]]
name = "bucket"
algorithm = "token_bucket"
rate = 1
per = "1h"
burst = 50
"#;

    /// How long an override may take to reach every node.
    const SPREAD: Duration = Duration::from_secs(10);

    /// One cluster at a time: the machine has few cores.
    fn one_at_a_time() -> MutexGuard<'static, ()> {
        static LOCK: Mutex<()> = Mutex::new(());
        LOCK.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn start() -> Cluster {
        let mut spec = ClusterSpec::new(levee_binary(), &["eu", "us"], 2, RULES);
        spec.dir_prefix = "levee-overrides-".into();
        Cluster::start(&spec).unwrap_or_else(|e| panic!("{e}"))
    }

    fn path(rule: &str, key: &str) -> String {
        format!(
            "/v1/overrides/{}/{}",
            encode_segment(rule),
            encode_segment(key)
        )
    }

    fn put(c: &Cluster, i: usize, rule: &str, key: &str, body: serde_json::Value) -> Reply {
        let r = c
            .request(i, "PUT", &path(rule, key), &[], Some(&body.to_string()))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.status, 200, "{r:?}");
        r
    }

    fn check(c: &Cluster, i: usize, rule: &str, key: &str) -> Reply {
        let body = json!({"rule": rule, "key": key}).to_string();
        let r = c
            .post(i, "/v1/check", &body)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.status, 200, "{r:?}");
        r
    }

    /// Waits until every node answers `GET` of the override with `want` (`None`: 404).
    fn spread(c: &Cluster, rule: &str, key: &str, want: Option<&serde_json::Value>) {
        for i in 0..c.len() {
            let ok = wait_until(SPREAD, || {
                c.get(i, &path(rule, key)).is_ok_and(|r| match want {
                    Some(v) => r.status == 200 && &r.json == v,
                    None => r.status == 404,
                })
            });
            assert!(
                ok,
                "{} did not get {rule}/{key} = {want:?}: {:?}",
                c.id(i),
                c.get(i, &path(rule, key))
            );
        }
    }

    #[test]
    fn an_override_written_on_one_node_decides_on_every_node() {
        let _one = one_at_a_time();
        let c = start();
        let (eu1, us2) = (0, 3);
        assert_eq!(c.region_of(us2), "us");
        let r = put(&c, eu1, "daily", "gold", json!({"limit": 5000}));
        spread(&c, "daily", "gold", Some(&r.json));
        for i in 0..c.len() {
            let d = check(&c, i, "daily", "gold");
            assert_eq!(
                d.u64("limit"),
                5000,
                "{} decides with the override: {d:?}",
                c.id(i)
            );
            assert_eq!(d.header_u64("x-ratelimit-limit"), 5000);
        }
        // A deny list entry written in the other region is refused everywhere.
        let r = put(&c, us2, "bucket", "abuser", json!({"action": "deny"}));
        spread(&c, "bucket", "abuser", Some(&r.json));
        for i in 0..c.len() {
            let d = check(&c, i, "bucket", "abuser");
            assert!(!d.allowed(), "{d:?}");
            assert_eq!(d.json["list"], "deny");
        }
        // Deleted on a third node: gone everywhere, the rule's figures again.
        let d = c
            .request(1, "DELETE", &path("daily", "gold"), &[], None)
            .expect("an answer");
        assert_eq!(d.status, 204);
        spread(&c, "daily", "gold", None);
        for i in 0..c.len() {
            assert_eq!(check(&c, i, "daily", "gold").u64("limit"), 600);
        }
    }

    #[test]
    fn a_region_cut_off_gets_the_overrides_when_it_is_heard_again() {
        let _one = one_at_a_time();
        let c = start();
        let us = c.nodes_in("us");
        for &i in &us {
            c.signal(i, "STOP").expect("stopped");
        }
        // Written while the region hears nothing (and stays unheard past suspect_after).
        let r = put(&c, 0, "daily", "vip", json!({"action": "allow"}));
        std::thread::sleep(Duration::from_millis(1_500));
        for &i in &us {
            c.signal(i, "CONT").expect("continued");
        }
        spread(&c, "daily", "vip", Some(&r.json));
        for &i in &us {
            let d = check(&c, i, "daily", "vip");
            assert_eq!(d.json["list"], "allow", "{d:?}");
        }
    }

    /// `rounds` rounds of one check on every node in turn; how many were admitted.
    fn round_robin(c: &Cluster, rule: &str, key: &str, rounds: usize) -> u64 {
        let mut admitted = 0;
        for _ in 0..rounds {
            for i in 0..c.len() {
                if check(c, i, rule, key).allowed() {
                    admitted += 1;
                }
            }
        }
        admitted
    }

    #[test]
    fn strict_an_overrides_limit_holds_globally_raised_or_lowered() {
        let _one = one_at_a_time();
        let c = start();
        // Lower than the rule's: 40 across the whole cluster, however the load is spread.
        let r = put(&c, 0, "daily", "small", json!({"limit": 40}));
        spread(&c, "daily", "small", Some(&r.json));
        let admitted = round_robin(&c, "daily", "small", 40);
        assert!(
            admitted <= 40,
            "{admitted} admitted across the cluster under a limit of 40"
        );
        assert!(admitted > 0, "nothing admitted");
        // A key that used its rule's rights first (and had them rebalanced toward each
        // region's owner), then is lowered: what it used counts, and the rights handed out
        // under the rule's 600 do not let the cluster go past the new 60 (docs/replication.md,
        // "Overrides"). First the regions take turns, a gossip interval apart.
        let before = round_robin(&c, "daily", "lowered", 10);
        assert_eq!(before, 40);
        std::thread::sleep(Duration::from_millis(300));
        let r = put(&c, 3, "daily", "lowered", json!({"limit": 60}));
        spread(&c, "daily", "lowered", Some(&r.json));
        std::thread::sleep(Duration::from_millis(300));
        // Regions take turns (eu, us, eu, …), 20 checks a node each, 300 ms apart, until the
        // new limit is used or 10 s have passed (rights come back to a region a few gossip
        // intervals after it asks; a busy machine is slower), then one more turn of each.
        let mut after = 0;
        let turn = |region: &str| {
            let mut n = 0;
            for _ in 0..20 {
                for &i in &c.nodes_in(region) {
                    n += u64::from(check(&c, i, "daily", "lowered").allowed());
                }
            }
            std::thread::sleep(Duration::from_millis(300));
            n
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        for region in ["eu", "us"].iter().cycle() {
            if before + after >= 60 || std::time::Instant::now() >= deadline {
                break;
            }
            after += turn(region);
        }
        after += turn("eu") + turn("us");
        assert_eq!(
            before + after,
            60,
            "{before} + {after} admitted under a limit lowered to 60"
        );
        // The same with every node taking turns, request by request (regions deciding at
        // once), after even use, and after one region used two thirds of the new limit.
        for (key, eu_only) in [("even", false), ("skewed", true)] {
            let before = if eu_only {
                let mut n = 0;
                for _ in 0..20 {
                    for &i in &c.nodes_in("eu") {
                        n += u64::from(check(&c, i, "daily", key).allowed());
                    }
                }
                n
            } else {
                round_robin(&c, "daily", key, 10)
            };
            assert_eq!(before, 40, "{key}");
            std::thread::sleep(Duration::from_millis(300));
            let r = put(&c, 0, "daily", key, json!({"limit": 60}));
            spread(&c, "daily", key, Some(&r.json));
            std::thread::sleep(Duration::from_millis(300));
            // Rights move toward the new demand every gossip interval (a region that gave its
            // rights away admits once they come back): rounds for up to 5 s.
            let mut after = 0;
            let deadline = std::time::Instant::now() + Duration::from_secs(5);
            while before + after < 60 && std::time::Instant::now() < deadline {
                after += round_robin(&c, "daily", key, 5);
                std::thread::sleep(Duration::from_millis(50));
            }
            after += round_robin(&c, "daily", key, 5);
            assert_eq!(
                before + after,
                60,
                "{key}: {before} + {after} admitted under a limit lowered to 60, every node taking turns"
            );
        }
        // An atomic call with the used-up key consumes nothing, on every node.
        for i in 0..c.len() {
            let body = json!({"all": [
                {"rule": "daily", "key": "other"},
                {"rule": "daily", "key": "lowered"},
            ]});
            let r = c
                .post(i, "/v1/check", &body.to_string())
                .unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(r.status, 200, "{r:?}");
            assert!(
                !r.allowed(),
                "{} admitted past the lowered limit: {r:?}",
                c.id(i)
            );
        }
        std::thread::sleep(Duration::from_millis(300));
        let other = c
            .usage(0, "daily", "other")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(other["used"], 0, "{other}");
        // And raised above the rule's: the new figure, split across the nodes.
        let r = put(&c, 1, "bucket", "big", json!({"rate": 1, "burst": 2000}));
        spread(&c, "bucket", "big", Some(&r.json));
        let admitted = round_robin(&c, "bucket", "big", 30);
        assert!(
            admitted > 50,
            "{admitted}: more than the rule's burst of 50"
        );
        assert!(admitted <= 2000);
    }
}
