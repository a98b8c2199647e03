//! `GET /openapi.json` against a real `levee serve`: the document lists every route the node
//! serves and nothing else, method by method (the router's table, `levee_node::http::
//! route_paths`, against the document, each pair probed over HTTP), and the error answers the
//! node really gives are in it.

use std::collections::{BTreeMap, BTreeSet};

use levee_blackbox::Node;
use serde_json::{Value, json};

const CONFIG: &str = r#"
[node]
id = "eu-1"
region = "eu"

[api]
admin_token = "s3cret-admin"
max_body = "4KiB"

[[rule]]
name = "api"
algorithm = "fixed_window"
limit = 100
window = "1d"
"#;

/// Every method a client may send (OpenAPI's list less `connect`).
const METHODS: [&str; 8] = [
    "GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE",
];

/// A path of the document with its `{params}` filled in.
fn concrete(path: &str) -> String {
    path.split('/')
        .map(|s| {
            if s.starts_with('{') && s.ends_with('}') {
                "api"
            } else {
                s
            }
        })
        .collect::<Vec<_>>()
        .join("/")
}

fn document(node: &Node) -> Value {
    let r = node.get("/openapi.json");
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.header("content-type"), Some("application/json"));
    serde_json::from_str(&r.body).expect("/openapi.json is JSON")
}

/// The methods the document gives `path`, upper case.
fn documented(doc: &Value, path: &str) -> BTreeSet<String> {
    doc["paths"][path]
        .as_object()
        .map(|item| {
            item.keys()
                .filter(|k| METHODS.contains(&k.to_ascii_uppercase().as_str()))
                .map(|k| k.to_ascii_uppercase())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn the_document_lists_every_route_and_nothing_else() {
    let node = Node::start(CONFIG);
    let doc = document(&node);
    assert!(
        doc["openapi"]
            .as_str()
            .is_some_and(|v| v.starts_with("3.1")),
        "{}",
        doc["openapi"]
    );
    let routed: BTreeSet<&str> = levee_node::http::route_paths().into_iter().collect();
    let in_doc: BTreeSet<&str> = doc["paths"]
        .as_object()
        .expect("paths")
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        routed, in_doc,
        "the router's paths (left) and the document's (right) differ"
    );
    // Method by method, over HTTP: a pair is routed unless the node answers 405, or 404 from
    // its fallback ("no endpoint"; a routed handler may answer `not_found` too, e.g. a key
    // without an override). axum answers HEAD with the GET handler.
    let mut wrong = Vec::new();
    for path in &routed {
        let methods = documented(&doc, path);
        assert!(!methods.is_empty(), "{path}: no operation documented");
        for m in METHODS {
            let headers = [("authorization", "Bearer s3cret-admin")];
            let r = node.request(m, &concrete(path), &headers, None);
            let fallback = r.status == 405
                || (r.status == 404
                    && r.body.contains("\"error\":\"not_found\"")
                    && r.body.contains("no endpoint"));
            let expected = methods.contains(m) || (m == "HEAD" && methods.contains("GET"));
            if fallback == expected {
                wrong.push(format!(
                    "{m} {path}: answered {} {} but {}documented",
                    r.status,
                    r.body,
                    if expected { "" } else { "not " }
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
    // And a path the router does not serve is not found, so the probe above can tell.
    let r = node.get("/v1/nothing-here");
    assert_eq!(r.status, 404);
    assert!(r.body.contains("no endpoint"), "{}", r.body);
}

/// The error answers of each operation, as the document lists them.
fn statuses(doc: &Value, path: &str, method: &str) -> BTreeSet<String> {
    doc["paths"][path][method]["responses"]
        .as_object()
        .unwrap_or_else(|| panic!("{method} {path}: no responses"))
        .keys()
        .cloned()
        .collect()
}

/// A request (method, path, headers, body) and the status the node answers it with.
type Case<'a> = (
    &'a str,
    &'a str,
    &'a [(&'a str, &'a str)],
    Option<&'a [u8]>,
    u16,
);

#[test]
fn the_errors_the_node_gives_are_documented_with_the_error_schema() {
    let node = Node::start(CONFIG);
    let doc = document(&node);
    let schemas = &doc["components"]["schemas"];
    assert_eq!(
        schemas["Error"]["required"],
        json!(["error", "message"]),
        "{}",
        schemas["Error"]
    );
    // Bodies that refuse unknown fields say so.
    for name in ["Check", "Batch", "Refund", "AllEntry"] {
        assert_eq!(
            schemas[name]["additionalProperties"],
            json!(false),
            "{name}: {}",
            schemas[name]
        );
    }
    // Every operation may time out.
    let mut ops = BTreeMap::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            let s = statuses(&doc, path, method);
            assert!(s.contains("503"), "{method} {path}: no 503 in {s:?}");
            ops.insert((path.clone(), method.clone()), s);
        }
    }
    // What the node answers to bad requests, and that the document has it.
    let big = vec![b' '; 8 * 1024];
    let cases: Vec<Case<'_>> = vec![
        (
            "POST",
            "/v1/check",
            &[("content-type", "text/plain")],
            Some(b"{}"),
            415,
        ),
        (
            "POST",
            "/v1/check",
            &[("content-type", "application/json")],
            Some(br#"{"bogus":1}"#),
            400,
        ),
        (
            "POST",
            "/v1/check",
            &[("content-type", "application/json")],
            Some(&big),
            413,
        ),
        (
            "POST",
            "/v1/check",
            &[("content-type", "application/json")],
            Some(br#"{"rule":"nope","key":"k"}"#),
            404,
        ),
        (
            "POST",
            "/v1/check/batch",
            &[("content-type", "text/plain")],
            Some(b"{}"),
            415,
        ),
        (
            "POST",
            "/v1/check/batch",
            &[("content-type", "application/json")],
            Some(br#"{"checks":[],"x":1}"#),
            400,
        ),
        (
            "POST",
            "/v1/check/batch",
            &[("content-type", "application/json")],
            Some(&big),
            413,
        ),
        ("POST", "/v1/refund", &[], Some(b"{}"), 401),
        (
            "POST",
            "/v1/refund",
            &[
                ("authorization", "Bearer s3cret-admin"),
                ("content-type", "text/plain"),
            ],
            Some(b"{}"),
            415,
        ),
        (
            "POST",
            "/v1/refund",
            &[
                ("authorization", "Bearer s3cret-admin"),
                ("content-type", "application/json"),
            ],
            Some(br#"{"rule":"api"}"#),
            400,
        ),
        ("GET", "/v1/authz/api", &[], None, 200),
        ("GET", "/v1/authz/nope", &[], None, 404),
        ("GET", "/v1/authz/api?deny_status=abc", &[], None, 400),
        ("GET", "/v1/usage/nope/k", &[], None, 404),
        ("DELETE", "/v1/usage/api/k", &[], None, 401),
        ("POST", "/admin/reload", &[], None, 401),
    ];
    for (method, path, headers, body, status) in cases {
        let r = node.request(method, path, headers, body);
        assert_eq!(r.status, status, "{method} {path}: {}", r.body);
        let template = if path.starts_with("/v1/authz/") {
            "/v1/authz/{rule}"
        } else if path.starts_with("/v1/usage/") {
            "/v1/usage/{rule}/{key}"
        } else {
            path
        };
        let listed = &ops[&(template.to_owned(), method.to_ascii_lowercase())];
        assert!(
            listed.contains(&status.to_string()),
            "{method} {path}: the node answered {status}, the document lists {listed:?}"
        );
        if status >= 400 {
            let body: Value = serde_json::from_str(&r.body).expect("a JSON error");
            assert!(
                body["error"].is_string() && body["message"].is_string(),
                "{body}"
            );
        }
    }
}
