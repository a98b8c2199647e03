//! Every error of `API.md`'s table against a real node: the status, the JSON body
//! `{"error": code, "message": …}` with a message naming what was wrong, and — "a bad request
//! never changes any counter" — the usage of the keys involved and the decision counters in
//! `/metrics` are identical before and after.

use levee_blackbox::{Node, Reply, samples};
use serde_json::{Value, json};

const TOKEN: &str = "s3cret-admin";

const CONFIG: &str = r#"
[node]
id = "eu-1"
region = "eu"

[api]
admin_token = "s3cret-admin"

[[rule]]
name = "per-tenant"
algorithm = "fixed_window"
limit = 3
window = "1d"

[[rule]]
name = "per-route"
algorithm = "fixed_window"
limit = 10
window = "1d"

[[rule]]
name = "bucket"
algorithm = "token_bucket"
rate = 1
per = "1h"
burst = 4
key_from = "header:x-api-key"
"#;

/// The key every bad request names; it holds some usage already so a change would show.
const VICTIM: &str = "victim";

/// What a bad request must leave alone: the victim's usage under every rule and every
/// decision counter.
#[derive(Debug, PartialEq)]
struct Counters {
    used: Vec<(String, Value, Value)>,
    checks: Vec<(String, String)>,
}

fn counters(node: &Node) -> Counters {
    let used = ["per-tenant", "per-route", "bucket"]
        .iter()
        .map(|rule| {
            let u = node.usage(rule, VICTIM);
            (rule.to_string(), u["used"].clone(), u["remaining"].clone())
        })
        .collect();
    let mut checks: Vec<(String, String)> = samples(&node.metrics())
        .into_iter()
        .filter(|s| s.name == "levee_checks_total" || s.name == "levee_keys_evicted_total")
        .map(|s| (format!("{}{:?}", s.name, s.labels), s.value.to_string()))
        .collect();
    checks.sort();
    Counters { used, checks }
}

/// A node whose victim key has used 1 of per-tenant, 2 of per-route and 1 of bucket.
fn node_with(config: &str) -> Node {
    let node = Node::start(config);
    assert!(node.check("per-tenant", VICTIM, 1).allowed());
    assert!(node.check("per-route", VICTIM, 2).allowed());
    assert!(node.check("bucket", VICTIM, 1).allowed());
    node
}

fn node() -> Node {
    node_with(CONFIG)
}

/// Runs a bad request and asserts its error, and that no counter changed.
#[track_caller]
fn refused(node: &Node, status: u16, code: &str, needle: &str, send: impl FnOnce(&Node) -> Reply) {
    let before = counters(node);
    let r = send(node);
    r.assert_error(status, code, needle);
    let after = counters(node);
    assert_eq!(
        before, after,
        "the refused request changed a counter: {r:?}"
    );
}

fn post(body: &str) -> impl FnOnce(&Node) -> Reply + '_ {
    move |n: &Node| n.post_raw("/v1/check", "application/json", body.as_bytes())
}

#[test]
fn malformed_json_is_400_invalid_request() {
    let node = node();
    refused(
        &node,
        400,
        "invalid_request",
        "JSON",
        post(r#"{"rule": "per-tenant", "key": "victim""#),
    );
    refused(
        &node,
        400,
        "invalid_request",
        "JSON",
        post(r#"{"rule": "per-tenant", "key": "victim",}"#),
    );
    refused(&node, 400, "invalid_request", "JSON", post(""));
    refused(&node, 400, "invalid_request", "JSON", |n: &Node| {
        n.post_raw("/v1/check/batch", "application/json", b"{\"checks\": [")
    });
}

#[test]
fn a_body_that_is_not_an_object_is_400_invalid_request() {
    let node = node();
    refused(&node, 400, "invalid_request", "body", post("42"));
    refused(
        &node,
        400,
        "invalid_request",
        "body",
        post(r#""per-tenant""#),
    );
    // A JSON array is not a check, even one whose items line up with the fields.
    refused(
        &node,
        400,
        "invalid_request",
        "body",
        post(r#"["per-tenant", "victim"]"#),
    );
    refused(
        &node,
        400,
        "invalid_request",
        "body",
        post(r#"["per-tenant", "victim", 1, null, null, false, null]"#),
    );
}

#[test]
fn a_missing_field_is_400_naming_it() {
    let node = node();
    refused(
        &node,
        400,
        "invalid_request",
        "rule",
        post(r#"{"key": "victim"}"#),
    );
    refused(
        &node,
        400,
        "invalid_request",
        "key",
        post(r#"{"rule": "per-tenant"}"#),
    );
    refused(
        &node,
        400,
        "invalid_request",
        "rule",
        post(r#"{"all": [{"key": "victim"}]}"#),
    );
    refused(&node, 400, "invalid_request", "key", |n: &Node| {
        n.post_json_with_token("/v1/refund", &json!({ "rule": "per-tenant" }), TOKEN)
    });
    refused(&node, 400, "invalid_request", "checks", |n: &Node| {
        n.post_json("/v1/check/batch", &json!({}))
    });
    refused(&node, 400, "invalid_request", "rule", |n: &Node| {
        n.post_json(
            "/v1/check/batch",
            &json!({ "checks": [{ "rule": "per-tenant", "key": "victim" }, { "key": "victim" }] }),
        )
    });
}

#[test]
fn a_mistyped_field_is_400_naming_it() {
    let node = node();
    refused(
        &node,
        400,
        "invalid_request",
        "cost",
        post(r#"{"rule": "per-tenant", "key": "victim", "cost": "2"}"#),
    );
    refused(
        &node,
        400,
        "invalid_request",
        "cost",
        post(r#"{"rule": "per-tenant", "key": "victim", "cost": 1.5}"#),
    );
    refused(
        &node,
        400,
        "invalid_request",
        "key",
        post(r#"{"rule": "per-tenant", "key": 7}"#),
    );
    refused(
        &node,
        400,
        "invalid_request",
        "rule",
        post(r#"{"rule": ["per-tenant"], "key": "victim"}"#),
    );
    refused(
        &node,
        400,
        "invalid_request",
        "dry_run",
        post(r#"{"rule": "per-tenant", "key": "victim", "dry_run": "no"}"#),
    );
    refused(
        &node,
        400,
        "invalid_request",
        "all",
        post(r#"{"all": {"rule": "per-tenant", "key": "victim"}}"#),
    );
    refused(&node, 400, "invalid_request", "checks", |n: &Node| {
        n.post_json(
            "/v1/check/batch",
            &json!({ "checks": { "rule": "per-tenant", "key": "victim" } }),
        )
    });
    refused(&node, 400, "invalid_request", "cost", |n: &Node| {
        n.post_json(
            "/v1/check/batch",
            &json!({ "checks": [
                { "rule": "per-tenant", "key": "victim" },
                { "rule": "per-tenant", "key": "victim", "cost": "x" }
            ] }),
        )
    });
    refused(&node, 400, "invalid_request", "cost", |n: &Node| {
        n.post_json_with_token(
            "/v1/refund",
            &json!({ "rule": "per-tenant", "key": "victim", "cost": true }),
            TOKEN,
        )
    });
}

#[test]
fn an_unknown_field_is_400_naming_it() {
    let node = node();
    refused(
        &node,
        400,
        "invalid_request",
        "bogus",
        post(r#"{"rule": "per-tenant", "key": "victim", "bogus": 1}"#),
    );
    refused(
        &node,
        400,
        "invalid_request",
        "costs",
        post(r#"{"rule": "per-tenant", "key": "victim", "costs": 1}"#),
    );
    refused(
        &node,
        400,
        "invalid_request",
        "bogus",
        post(r#"{"all": [{"rule": "per-tenant", "key": "victim", "bogus": 1}]}"#),
    );
    refused(&node, 400, "invalid_request", "bogus", |n: &Node| {
        n.post_json(
            "/v1/check/batch",
            &json!({ "checks": [
                { "rule": "per-tenant", "key": "victim" },
                { "rule": "per-tenant", "key": "victim", "bogus": 1 }
            ] }),
        )
    });
    refused(&node, 400, "invalid_request", "bogus", |n: &Node| {
        n.post_json("/v1/check/batch", &json!({ "checks": [], "bogus": 1 }))
    });
    refused(&node, 400, "invalid_request", "bogus", |n: &Node| {
        n.post_json_with_token(
            "/v1/refund",
            &json!({ "rule": "per-tenant", "key": "victim", "bogus": 1 }),
            TOKEN,
        )
    });
}

#[test]
fn an_empty_key_is_400_naming_key() {
    let node = node();
    refused(
        &node,
        400,
        "invalid_request",
        "key",
        post(r#"{"rule": "per-tenant", "key": ""}"#),
    );
    refused(
        &node,
        400,
        "invalid_request",
        "key",
        post(
            r#"{"all": [{"rule": "per-route", "key": "victim"}, {"rule": "per-tenant", "key": ""}]}"#,
        ),
    );
    refused(&node, 400, "invalid_request", "key", |n: &Node| {
        n.post_json(
            "/v1/check/batch",
            &json!({ "checks": [
                { "rule": "per-tenant", "key": "victim" },
                { "rule": "per-tenant", "key": "" }
            ] }),
        )
    });
    refused(&node, 400, "invalid_request", "key", |n: &Node| {
        n.post_json_with_token(
            "/v1/refund",
            &json!({ "rule": "per-tenant", "key": "" }),
            TOKEN,
        )
    });
}

#[test]
fn a_key_over_512_bytes_is_400_naming_key_and_512_bytes_is_accepted() {
    let node = node();
    let long = "k".repeat(513);
    // 257 two-byte characters: 257 characters but 514 bytes.
    let wide = "é".repeat(257);
    for key in [&long, &wide] {
        refused(&node, 400, "invalid_request", "key", |n: &Node| {
            n.post_json("/v1/check", &json!({ "rule": "per-tenant", "key": key }))
        });
        refused(&node, 400, "invalid_request", "key", |n: &Node| {
            n.post_json(
                "/v1/check/batch",
                &json!({ "checks": [
                    { "rule": "per-tenant", "key": "victim" },
                    { "rule": "per-tenant", "key": key }
                ] }),
            )
        });
        refused(&node, 400, "invalid_request", "key", |n: &Node| {
            n.post_json(
                "/v1/check",
                &json!({ "all": [
                    { "rule": "per-route", "key": "victim" },
                    { "rule": "per-tenant", "key": key }
                ] }),
            )
        });
    }
    let max = "k".repeat(512);
    let r = node.post_json("/v1/check", &json!({ "rule": "per-tenant", "key": max }));
    assert_eq!(r.status, 200, "a 512-byte key is fine: {r:?}");
    assert_eq!(node.used("per-tenant", &max), 1);
}

#[test]
fn a_negative_cost_is_400_naming_cost() {
    let node = node();
    refused(
        &node,
        400,
        "invalid_request",
        "cost",
        post(r#"{"rule": "per-tenant", "key": "victim", "cost": -1}"#),
    );
    refused(
        &node,
        400,
        "invalid_request",
        "cost",
        post(r#"{"all": [{"rule": "per-tenant", "key": "victim"}], "cost": -1}"#),
    );
    refused(&node, 400, "invalid_request", "cost", |n: &Node| {
        n.post_json(
            "/v1/check/batch",
            &json!({ "checks": [
                { "rule": "per-tenant", "key": "victim" },
                { "rule": "per-tenant", "key": "victim", "cost": -3 }
            ] }),
        )
    });
    refused(&node, 400, "invalid_request", "cost", |n: &Node| {
        n.post_json_with_token(
            "/v1/refund",
            &json!({ "rule": "per-tenant", "key": "victim", "cost": -1 }),
            TOKEN,
        )
    });
}

#[test]
fn a_cost_above_the_capacity_is_400_naming_cost() {
    let node = node();
    refused(
        &node,
        400,
        "invalid_request",
        "cost",
        post(r#"{"rule": "per-tenant", "key": "victim", "cost": 4}"#),
    );
    refused(
        &node,
        400,
        "invalid_request",
        "cost",
        post(r#"{"rule": "bucket", "key": "victim", "cost": 5}"#),
    );
    refused(
        &node,
        400,
        "invalid_request",
        "cost",
        post(r#"{"rule": "per-tenant", "key": "victim", "cost": 18446744073709551615}"#),
    );
    // per-route allows 10 but per-tenant can never grant 4: the whole call is refused.
    refused(
        &node,
        400,
        "invalid_request",
        "cost",
        post(
            r#"{"all": [{"rule": "per-route", "key": "victim"}, {"rule": "per-tenant", "key": "victim"}], "cost": 4}"#,
        ),
    );
    refused(&node, 400, "invalid_request", "cost", |n: &Node| {
        n.post_json(
            "/v1/check/batch",
            &json!({ "checks": [
                { "rule": "per-route", "key": "victim" },
                { "rule": "per-tenant", "key": "victim", "cost": 4 }
            ] }),
        )
    });
}

#[test]
fn more_than_1000_checks_is_400_naming_checks() {
    let node = node();
    let checks: Vec<Value> = (0..1001)
        .map(|_| json!({ "rule": "per-route", "key": VICTIM }))
        .collect();
    refused(&node, 400, "invalid_request", "checks", |n: &Node| {
        n.post_json("/v1/check/batch", &json!({ "checks": checks }))
    });
}

#[test]
fn an_unknown_rule_is_404_unknown_rule() {
    let node = node();
    refused(
        &node,
        404,
        "unknown_rule",
        "nope",
        post(r#"{"rule": "nope", "key": "victim"}"#),
    );
    refused(
        &node,
        404,
        "unknown_rule",
        "rule",
        post(r#"{"rule": "nope", "key": "victim"}"#),
    );
    refused(
        &node,
        404,
        "unknown_rule",
        "nope",
        post(
            r#"{"all": [{"rule": "per-tenant", "key": "victim"}, {"rule": "nope", "key": "victim"}]}"#,
        ),
    );
    refused(&node, 404, "unknown_rule", "nope", |n: &Node| {
        n.post_json(
            "/v1/check/batch",
            &json!({ "checks": [
                { "rule": "per-tenant", "key": "victim" },
                { "rule": "nope", "key": "victim" }
            ] }),
        )
    });
    refused(&node, 404, "unknown_rule", "nope", |n: &Node| {
        n.post_json_with_token(
            "/v1/refund",
            &json!({ "rule": "nope", "key": "victim" }),
            TOKEN,
        )
    });
    refused(&node, 404, "unknown_rule", "nope", |n: &Node| {
        n.get("/v1/usage/nope/victim")
    });
    refused(&node, 404, "unknown_rule", "nope", |n: &Node| {
        n.get_with("/v1/authz/nope", &[("x-api-key", "victim")])
    });
    refused(&node, 404, "unknown_rule", "nope", |n: &Node| {
        n.delete_with_token("/v1/usage/nope/victim", Some(TOKEN))
    });
}

#[test]
fn an_unknown_endpoint_is_404_not_found() {
    let node = node();
    refused(&node, 404, "not_found", "/v1/nothing", |n: &Node| {
        n.get("/v1/nothing")
    });
    refused(&node, 404, "not_found", "/v1/checks", |n: &Node| {
        n.post_json(
            "/v1/checks",
            &json!({ "rule": "per-tenant", "key": "victim" }),
        )
    });
    // (`/` is the status page, API.md "Machine-readable contract and a page for people".)
    refused(&node, 404, "not_found", "/index.html", |n: &Node| {
        n.get("/index.html")
    });
    refused(
        &node,
        404,
        "not_found",
        "/v1/usage/per-tenant",
        |n: &Node| n.get("/v1/usage/per-tenant"),
    );
}

#[test]
fn a_wrong_method_is_405_method_not_allowed() {
    let node = node();
    refused(&node, 405, "method_not_allowed", "/v1/check", |n: &Node| {
        n.get("/v1/check")
    });
    refused(&node, 405, "method_not_allowed", "/v1/check", |n: &Node| {
        n.request(
            "PUT",
            "/v1/check",
            &[("content-type", "application/json")],
            Some(br#"{"rule": "per-tenant", "key": "victim"}"#),
        )
    });
    refused(
        &node,
        405,
        "method_not_allowed",
        "/v1/check/batch",
        |n: &Node| n.get("/v1/check/batch"),
    );
    refused(
        &node,
        405,
        "method_not_allowed",
        "/v1/refund",
        |n: &Node| n.get("/v1/refund"),
    );
    refused(&node, 405, "method_not_allowed", "/v1/rules", |n: &Node| {
        n.post_json("/v1/rules", &json!({}))
    });
    refused(
        &node,
        405,
        "method_not_allowed",
        "/v1/usage/per-tenant/victim",
        |n: &Node| n.post_json("/v1/usage/per-tenant/victim", &json!({})),
    );
    refused(
        &node,
        405,
        "method_not_allowed",
        "/admin/reload",
        |n: &Node| n.get_with("/admin/reload", &[("authorization", "Bearer s3cret-admin")]),
    );
    refused(&node, 405, "method_not_allowed", "/metrics", |n: &Node| {
        n.request("DELETE", "/metrics", &[], None)
    });
}

#[test]
fn a_body_over_max_body_is_413_payload_too_large() {
    let config = CONFIG.replace(
        "admin_token = \"s3cret-admin\"",
        "admin_token = \"s3cret-admin\"\nmax_body = \"1KiB\"",
    );
    let node = node_with(&config);
    let pad = "x".repeat(2000);
    let body = json!({ "rule": "per-tenant", "key": "victim", "class": pad }).to_string();
    refused(&node, 413, "payload_too_large", "1024", |n: &Node| {
        n.post_raw("/v1/check", "application/json", body.as_bytes())
    });
    let checks: Vec<Value> = (0..40)
        .map(|_| json!({ "rule": "per-route", "key": VICTIM }))
        .collect();
    let batch = json!({ "checks": checks }).to_string();
    assert!(batch.len() > 1024);
    refused(&node, 413, "payload_too_large", "1024", |n: &Node| {
        n.post_raw("/v1/check/batch", "application/json", batch.as_bytes())
    });
    // Without a Content-Length: the limit holds on the bytes actually sent.
    let before = counters(&node);
    let raw = chunked_post(node.port(), "/v1/check", body.as_bytes());
    assert!(raw.starts_with("HTTP/1.1 413"), "{raw}");
    assert!(raw.contains("payload_too_large"), "{raw}");
    assert_eq!(before, counters(&node));
    // A body under the limit is fine.
    let r = node.post_json(
        "/v1/check",
        &json!({ "rule": "per-tenant", "key": "small" }),
    );
    assert_eq!(r.status, 200, "{r:?}");
}

/// A POST with `Transfer-Encoding: chunked` over a raw socket; returns the raw answer.
fn chunked_post(port: u16, path: &str, body: &[u8]) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .expect("timeout");
    let mut req = format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    )
    .into_bytes();
    for chunk in body.chunks(100) {
        req.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
        req.extend_from_slice(chunk);
        req.extend_from_slice(b"\r\n");
    }
    req.extend_from_slice(b"0\r\n\r\n");
    // The node may answer and close before reading everything; that is fine.
    let _ = s.write_all(&req);
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

#[test]
fn a_body_that_is_not_json_is_415_unsupported_media_type() {
    let node = node();
    let body = br#"{"rule": "per-tenant", "key": "victim"}"#;
    refused(
        &node,
        415,
        "unsupported_media_type",
        "Content-Type",
        |n: &Node| n.post_raw("/v1/check", "text/plain", body),
    );
    refused(
        &node,
        415,
        "unsupported_media_type",
        "Content-Type",
        |n: &Node| {
            n.post_raw(
                "/v1/check",
                "application/x-www-form-urlencoded",
                b"rule=per-tenant&key=victim",
            )
        },
    );
    refused(
        &node,
        415,
        "unsupported_media_type",
        "Content-Type",
        |n: &Node| n.request("POST", "/v1/check", &[], Some(body)),
    );
    refused(
        &node,
        415,
        "unsupported_media_type",
        "Content-Type",
        |n: &Node| {
            n.post_raw(
                "/v1/check/batch",
                "text/plain",
                br#"{"checks": [{"rule": "per-tenant", "key": "victim"}]}"#,
            )
        },
    );
    refused(
        &node,
        415,
        "unsupported_media_type",
        "Content-Type",
        |n: &Node| {
            n.request(
                "POST",
                "/v1/refund",
                &[
                    ("content-type", "text/plain"),
                    ("authorization", "Bearer s3cret-admin"),
                ],
                Some(body),
            )
        },
    );
    // A charset parameter is still JSON.
    let r = node.post_raw(
        "/v1/check",
        "application/json; charset=utf-8",
        br#"{"rule": "per-tenant", "key": "other"}"#,
    );
    assert_eq!(r.status, 200, "{r:?}");
}

#[test]
fn a_missing_or_wrong_bearer_token_is_401_unauthorized() {
    let node = node();
    let reset = "/v1/usage/per-tenant/victim";
    refused(&node, 401, "unauthorized", "Authorization", |n: &Node| {
        n.delete_with_token(reset, None)
    });
    refused(&node, 401, "unauthorized", "Authorization", |n: &Node| {
        n.delete_with_token(reset, Some("s3cret"))
    });
    refused(&node, 401, "unauthorized", "Authorization", |n: &Node| {
        n.delete_with_token(reset, Some("s3cret-admin-and-more"))
    });
    refused(&node, 401, "unauthorized", "Authorization", |n: &Node| {
        n.request(
            "DELETE",
            reset,
            &[("authorization", "Basic czNjcmV0LWFkbWlu")],
            None,
        )
    });
    refused(&node, 401, "unauthorized", "Authorization", |n: &Node| {
        n.post_with_token("/admin/reload", None)
    });
    refused(&node, 401, "unauthorized", "Authorization", |n: &Node| {
        n.post_with_token("/admin/reload", Some("wrong"))
    });
    // The right token works.
    let r = node.delete_with_token(reset, Some(TOKEN));
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(node.used("per-tenant", VICTIM), 0);
}

#[test]
fn authz_without_a_key_is_400_missing_key() {
    let node = node();
    refused(&node, 400, "missing_key", "x-api-key", |n: &Node| {
        n.get("/v1/authz/bucket")
    });
    refused(&node, 400, "missing_key", "x-api-key", |n: &Node| {
        n.get_with("/v1/authz/bucket", &[("x-api-key", "")])
    });
    refused(&node, 400, "missing_key", "x-api-key", |n: &Node| {
        n.get_with("/v1/authz/bucket", &[("x-other-key", "victim")])
    });
}

#[test]
fn authz_with_a_bad_cost_header_is_400_naming_it() {
    let node = node();
    refused(
        &node,
        400,
        "invalid_request",
        "X-RateLimit-Cost",
        |n: &Node| {
            n.get_with(
                "/v1/authz/bucket",
                &[("x-api-key", VICTIM), ("x-ratelimit-cost", "-1")],
            )
        },
    );
    refused(
        &node,
        400,
        "invalid_request",
        "X-RateLimit-Cost",
        |n: &Node| {
            n.get_with(
                "/v1/authz/bucket",
                &[("x-api-key", VICTIM), ("x-ratelimit-cost", "lots")],
            )
        },
    );
    refused(&node, 400, "invalid_request", "cost", |n: &Node| {
        n.get_with(
            "/v1/authz/bucket",
            &[("x-api-key", VICTIM), ("x-ratelimit-cost", "5")],
        )
    });
}

#[test]
fn many_bad_requests_in_a_row_change_no_counter() {
    // A burst of mixed bad requests leaves the victim exactly where it was.
    let node = node();
    let before = counters(&node);
    for _ in 0..20 {
        node.post_raw(
            "/v1/check",
            "application/json",
            br#"{"rule": "per-tenant", "key": "victim", "cost": -1}"#,
        );
        node.post_raw(
            "/v1/check",
            "text/plain",
            br#"{"rule": "per-tenant", "key": "victim"}"#,
        );
        node.post_raw(
            "/v1/check",
            "application/json",
            br#"{"rule": "per-tenant", "key": "victim", "x": 1}"#,
        );
        node.delete_with_token("/v1/usage/per-tenant/victim", None);
    }
    assert_eq!(before, counters(&node));
    assert_eq!(node.used("per-tenant", VICTIM), 1);
    assert_eq!(node.used("per-route", VICTIM), 2);
    assert_eq!(node.used("bucket", VICTIM), 1);
}

#[test]
fn a_max_wait_out_of_range_is_400_naming_it() {
    let node = node();
    for body in [
        r#"{"rule": "per-tenant", "key": "victim", "max_wait_ms": 10001}"#,
        r#"{"rule": "per-tenant", "key": "victim", "max_wait_ms": -1}"#,
        r#"{"rule": "per-tenant", "key": "victim", "max_wait_ms": "soon"}"#,
        r#"{"rule": "per-tenant", "key": "victim", "max_wait_ms": 0.5}"#,
        // An atomic call is answered at once: waiting is for single checks.
        r#"{"all": [{"rule": "per-tenant", "key": "victim"}], "max_wait_ms": 100}"#,
    ] {
        refused(&node, 400, "invalid_request", "max_wait_ms", post(body));
    }
    refused(
        &node,
        400,
        "invalid_request",
        "checks[1].max_wait_ms",
        |n: &Node| {
            n.post_json(
                "/v1/check/batch",
                &json!({ "checks": [
                { "rule": "per-tenant", "key": "victim" },
                { "rule": "per-tenant", "key": "victim", "max_wait_ms": 20_000 }
            ] }),
            )
        },
    );
    for bad in ["10001", "-1", "later"] {
        refused(
            &node,
            400,
            "invalid_request",
            "X-RateLimit-Max-Wait",
            |n: &Node| {
                n.get_with(
                    "/v1/authz/bucket",
                    &[("x-api-key", VICTIM), ("x-ratelimit-max-wait", bad)],
                )
            },
        );
    }
}
