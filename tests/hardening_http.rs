//! The HTTP surface under attack (issues #12 "Hardening" and #20 "First contact"), against real
//! `levee serve` processes: bounded idempotency keys, no trailing garbage, refunds that are
//! authorized and idempotent, client addresses that cannot be forged, idle and surplus
//! connections closed, every error as JSON, configuration errors that name the real field, and
//! no open admin API on a public address.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use levee_blackbox::{Node, Reply, config_check, free_port, levee, metric, wait_until};
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
limit = 10
window = "1d"

[[rule]]
name = "per-ip"
algorithm = "fixed_window"
limit = 2
window = "1d"
key_from = "ip"
"#;

/// A refused request's error: status, JSON content type, `{"error": code, "message": …}` with
/// `needle` in the message.
#[track_caller]
fn assert_json_error(r: &Reply, status: u16, code: &str, needle: &str) {
    r.assert_error(status, code, needle);
    assert!(
        r.header("content-type")
            .is_some_and(|v| v.starts_with("application/json")),
        "{r:?}"
    );
}

// ---- 1. idempotency keys are bounded ----

#[test]
fn an_idempotency_key_over_256_bytes_is_400_naming_it_and_charges_nothing() {
    let node = Node::start(CONFIG);
    let long = "k".repeat(257);
    let bodies = [
        (
            "/v1/check",
            json!({ "rule": "per-tenant", "key": "v", "idempotency_key": long }),
        ),
        (
            "/v1/check",
            json!({ "all": [{ "rule": "per-tenant", "key": "v" }], "idempotency_key": long }),
        ),
        // The fast path of a batch, and (an escaped string) the slow one; the long key is on
        // the second check, so the first must not be charged either.
        (
            "/v1/check/batch",
            json!({ "checks": [{ "rule": "per-tenant", "key": "v" },
                                { "rule": "per-tenant", "key": "v", "idempotency_key": long }] }),
        ),
        (
            "/v1/check/batch",
            json!({ "checks": [{ "rule": "per-tenant", "key": "v\n" },
                                { "rule": "per-tenant", "key": "v", "idempotency_key": long }] }),
        ),
    ];
    for (path, body) in &bodies {
        let r = node.post_json(path, body);
        assert_json_error(&r, 400, "invalid_request", "idempotency_key");
        assert!(r.body.contains("256"), "{r:?}");
    }
    assert_eq!(node.used("per-tenant", "v"), 0);
    assert_eq!(node.used("per-tenant", "v\n"), 0);
    assert!(node.check("per-tenant", "v", 3).allowed());
    let r = node.post_json_with_token(
        "/v1/refund",
        &json!({ "rule": "per-tenant", "key": "v", "cost": 2, "idempotency_key": long }),
        TOKEN,
    );
    assert_json_error(&r, 400, "invalid_request", "idempotency_key");
    assert_eq!(
        node.used("per-tenant", "v"),
        3,
        "the refund was not applied"
    );
    // 256 bytes is accepted.
    let r = node.post_json(
        "/v1/check",
        &json!({ "rule": "per-tenant", "key": "v", "idempotency_key": "k".repeat(256) }),
    );
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(node.used("per-tenant", "v"), 4);
}

// ---- 5. trailing garbage after a JSON body ----

#[test]
fn trailing_data_after_a_json_body_is_400_and_charges_nothing() {
    let node = Node::start(CONFIG);
    for (path, body) in [
        (
            "/v1/check",
            r#"{"rule":"per-tenant","key":"X","cost":7} }}}}not json"#,
        ),
        ("/v1/check", r#"{"rule":"per-tenant","key":"X","cost":7}{}"#),
        (
            "/v1/check",
            r#"{"all":[{"rule":"per-tenant","key":"X"}],"cost":7} x"#,
        ),
        (
            "/v1/check/batch",
            r#"{"checks":[{"rule":"per-tenant","key":"X","cost":7}]} ]"#,
        ),
    ] {
        let r = node.post_raw(path, "application/json", body.as_bytes());
        assert_json_error(&r, 400, "invalid_request", "malformed JSON");
    }
    assert_eq!(node.used("per-tenant", "X"), 0);
    assert!(node.check("per-tenant", "X", 5).allowed());
    let r = node.request(
        "POST",
        "/v1/refund",
        &[
            ("content-type", "application/json"),
            ("authorization", &format!("Bearer {TOKEN}")),
        ],
        Some(br#"{"rule":"per-tenant","key":"X","cost":3} 1"#),
    );
    assert_json_error(&r, 400, "invalid_request", "malformed JSON");
    assert_eq!(node.used("per-tenant", "X"), 5, "nothing refunded");
    // Trailing whitespace is fine.
    let r = node.post_raw(
        "/v1/check",
        "application/json",
        b"{\"rule\":\"per-tenant\",\"key\":\"X\"} \n\t ",
    );
    assert_eq!(r.status, 200, "{r:?}");
}

// ---- 6. refunds: a token and idempotency ----

#[test]
fn a_refund_needs_the_admin_token_and_a_retry_refunds_nothing_more() {
    let node = Node::start(CONFIG);
    assert!(node.check("per-tenant", "r", 6).allowed());
    let body = json!({ "rule": "per-tenant", "key": "r", "cost": 2, "idempotency_key": "req-1" });
    let r = node.post_json("/v1/refund", &body);
    assert_json_error(&r, 401, "unauthorized", "Authorization");
    let r = node.post_json_with_token("/v1/refund", &body, "wrong");
    assert_json_error(&r, 401, "unauthorized", "wrong");
    assert_eq!(
        node.used("per-tenant", "r"),
        6,
        "an unauthorized refund gave nothing back"
    );

    let first = node.post_json_with_token("/v1/refund", &body, TOKEN);
    assert_eq!(first.status, 200, "{first:?}");
    assert_eq!(node.used("per-tenant", "r"), 4);
    for _ in 0..3 {
        let retry = node.post_json_with_token("/v1/refund", &body, TOKEN);
        assert_eq!(retry.status, 200, "{retry:?}");
        assert_eq!(retry.json, first.json, "a retry gets the first answer back");
    }
    assert_eq!(
        node.used("per-tenant", "r"),
        4,
        "a retry refunds nothing more"
    );
    // Another idempotency key is another refund; the check's own key does not collide.
    let r = node.post_json(
        "/v1/check",
        &json!({ "rule": "per-tenant", "key": "r", "idempotency_key": "req-2" }),
    );
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(node.used("per-tenant", "r"), 5);
    let r = node.post_json_with_token(
        "/v1/refund",
        &json!({ "rule": "per-tenant", "key": "r", "cost": 1, "idempotency_key": "req-2" }),
        TOKEN,
    );
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(node.used("per-tenant", "r"), 4);
}

#[test]
fn a_refund_token_replaces_the_admin_token_for_refunds() {
    let node = Node::start(&CONFIG.replace(
        "admin_token = \"s3cret-admin\"",
        "admin_token = \"s3cret-admin\"\nrefund_token = \"refunder\"",
    ));
    assert!(node.check("per-tenant", "t", 3).allowed());
    let body = json!({ "rule": "per-tenant", "key": "t", "cost": 1 });
    let r = node.post_json_with_token("/v1/refund", &body, TOKEN);
    assert_json_error(&r, 401, "unauthorized", "wrong");
    assert_eq!(node.used("per-tenant", "t"), 3);
    let r = node.post_json_with_token("/v1/refund", &body, "refunder");
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(node.used("per-tenant", "t"), 2);
}

// ---- 3. forwarded client addresses ----

#[test]
fn key_from_ip_ignores_forwarding_headers_from_a_peer_that_is_not_trusted() {
    let node = Node::start(CONFIG);
    // A client rotating X-Forwarded-For / X-Real-IP still has one bucket: its own address.
    for (i, header) in ["x-forwarded-for", "x-real-ip", "x-forwarded-for"]
        .iter()
        .enumerate()
    {
        let forged = format!("203.0.113.{i}");
        let r = node.get_with("/v1/authz/per-ip", &[(header, forged.as_str())]);
        assert_eq!(r.status, if i < 2 { 200 } else { 429 }, "{r:?}");
        assert_eq!(node.used("per-ip", &forged), 0);
    }
    assert_eq!(node.used("per-ip", "127.0.0.1"), 2);
    // Garbage in the headers of an untrusted peer is ignored, not believed.
    let r = node.get_with("/v1/authz/per-ip", &[("x-forwarded-for", "not-an-ip")]);
    assert_eq!(r.status, 429, "{r:?}");
    assert_eq!(node.used("per-ip", "not-an-ip"), 0);
}

#[test]
fn key_from_ip_walks_x_forwarded_for_of_a_trusted_proxy_and_refuses_a_malformed_one() {
    let node = Node::start(&CONFIG.replace(
        "admin_token = \"s3cret-admin\"",
        "admin_token = \"s3cret-admin\"\ntrusted_proxies = [\"127.0.0.0/8\", \"10.0.0.0/8\"]",
    ));
    // The client is the first address from the right that is not a trusted proxy.
    let r = node.get_with(
        "/v1/authz/per-ip",
        &[("x-forwarded-for", "198.51.100.1, 203.0.113.9, 10.1.2.3")],
    );
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(node.used("per-ip", "203.0.113.9"), 1);
    assert_eq!(
        node.used("per-ip", "198.51.100.1"),
        0,
        "the leftmost is not believed"
    );
    let r = node.get_with("/v1/authz/per-ip", &[("x-real-ip", "203.0.113.9")]);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(node.used("per-ip", "203.0.113.9"), 2);
    for bad in ["not-an-ip", "203.0.113.9, 10.0.0.1, bogus"] {
        let r = node.get_with("/v1/authz/per-ip", &[("x-forwarded-for", bad)]);
        assert_json_error(&r, 400, "invalid_request", "X-Forwarded-For");
    }
    let r = node.get_with("/v1/authz/per-ip", &[("x-real-ip", "300.1.1.1")]);
    assert_json_error(&r, 400, "invalid_request", "X-Real-IP");
    assert_eq!(node.used("per-ip", "203.0.113.9"), 2, "nothing counted");
    assert_eq!(node.used("per-ip", "127.0.0.1"), 0, "nothing counted");
}

#[test]
fn a_bad_trusted_proxy_cidr_is_a_config_error_naming_the_field() {
    let out = config_check(
        "[api]\nadmin_token = \"t\"\ntrusted_proxies = [\"10.0.0.0/8\", \"10.0.0.0/33\"]\n",
    );
    assert_eq!(out.0, Some(1), "{out:?}");
    assert!(out.1.contains("api.trusted_proxies[1]"), "{out:?}");
}

// ---- 4. idle connections and the connection cap ----

/// Reads until the node closes the connection (`Ok`), or `Err` after `within`.
fn closed_within(s: &mut TcpStream, within: Duration) -> Result<(), String> {
    s.set_read_timeout(Some(within)).expect("timeout");
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return Ok(()),
            Err(e) => return Err(format!("still open after {within:?}: {e}")),
        }
    }
}

/// Sends one request on `s` and reads its answer's head; `None` if the connection was closed
/// without an answer.
fn exchange(s: &mut TcpStream, request: &[u8]) -> Option<String> {
    let _ = s.write_all(request);
    read_head(s)
}

/// Reads an answer's head on `s` (10 s at most); `None` if the connection was closed first.
fn read_head(s: &mut TcpStream) -> Option<String> {
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match s.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => return None,
        }
    }
    Some(String::from_utf8_lossy(&head).into_owned())
}

const HEALTHZ: &[u8] = b"GET /healthz HTTP/1.1\r\nhost: t\r\n\r\n";

#[test]
fn idle_connections_are_closed_after_idle_timeout() {
    let node = Node::start(&CONFIG.replace(
        "admin_token = \"s3cret-admin\"",
        "admin_token = \"s3cret-admin\"\nidle_timeout = \"300ms\"",
    ));
    // Connected and never sent anything.
    let mut silent = TcpStream::connect(("127.0.0.1", node.port())).expect("connect");
    // A keep-alive connection after its answer.
    let mut kept = TcpStream::connect(("127.0.0.1", node.port())).expect("connect");
    let head = exchange(&mut kept, HEALTHZ).expect("an answer");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    closed_within(&mut silent, Duration::from_secs(10)).expect("the silent connection");
    closed_within(&mut kept, Duration::from_secs(10)).expect("the idle keep-alive connection");
    assert!(
        wait_until(Duration::from_secs(5), || {
            node.try_request("GET", "/metrics", &[], None)
                .and_then(|r| {
                    metric(
                        &r.body,
                        "levee_http_connections_closed_total",
                        &[("reason", "idle")],
                    )
                })
                .is_some_and(|n| n >= 2.0)
        }),
        "the idle closes are counted"
    );
}

#[test]
fn connections_beyond_max_connections_are_closed_at_once_and_counted() {
    let max = 4;
    let node = Node::start(&CONFIG.replace(
        "admin_token = \"s3cret-admin\"",
        &format!("admin_token = \"s3cret-admin\"\nmax_connections = {max}"),
    ));
    // The harness's own client may hold a pooled connection: open connections (each proving
    // itself with an answer) until one is refused.
    let mut open = Vec::new();
    let mut refused = None;
    for _ in 0..max + 4 {
        let mut s = TcpStream::connect(("127.0.0.1", node.port())).expect("connect");
        match exchange(&mut s, HEALTHZ) {
            Some(head) => {
                assert!(head.starts_with("HTTP/1.1 200"), "{head}");
                open.push(s);
            }
            None => {
                refused = Some(s);
                break;
            }
        }
    }
    assert!(
        refused.is_some(),
        "{} connections were all served",
        open.len()
    );
    assert!(open.len() <= max, "{} connections served", open.len());
    drop(open);
    drop(refused);
    let mut counted = None;
    assert!(
        wait_until(Duration::from_secs(10), || {
            counted = node.try_request("GET", "/metrics", &[], None).map(|r| {
                (
                    metric(&r.body, "levee_http_connections_refused_total", &[]),
                    metric(&r.body, "levee_http_connections_open", &[]),
                )
            });
            counted.is_some_and(|(refused, open)| {
                refused.is_some_and(|n| n >= 1.0) && open.is_some_and(|n| n >= 1.0)
            })
        }),
        "refused connections are counted and open ones gauged: {counted:?}"
    );
    // Once the connections are gone, new ones are served again.
    let mut s = TcpStream::connect(("127.0.0.1", node.port())).expect("connect");
    assert!(exchange(&mut s, HEALTHZ).is_some_and(|h| h.starts_with("HTTP/1.1 200")));
}

// ---- 8. every error is JSON ----

/// Sends raw bytes and reads the whole answer (the node closes after these errors).
fn raw(node: &Node, request: &[u8]) -> (String, Value) {
    let mut s = TcpStream::connect(("127.0.0.1", node.port())).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let _ = s.write_all(request);
    let mut out = Vec::new();
    let mut buf = [0u8; 65536];
    // Read until the answer's body is complete or the node closes.
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
        let text = String::from_utf8_lossy(&out);
        if let Some((head, body)) = text.split_once("\r\n\r\n")
            && let Some(len) = head.lines().find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("content-length:")
                    .and_then(|v| v.trim().parse::<usize>().ok())
            })
            && body.len() >= len
        {
            break;
        }
    }
    let text = String::from_utf8_lossy(&out).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let json = serde_json::from_str(body).unwrap_or(Value::Null);
    (head.to_owned(), json)
}

#[track_caller]
fn assert_raw_error(node: &Node, request: &[u8], status: u16, code: &str) {
    let (head, json) = raw(node, request);
    assert!(head.starts_with(&format!("HTTP/1.1 {status} ")), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: application/json"),
        "{head}"
    );
    assert_eq!(json["error"], code, "{head}\n{json}");
    assert!(
        json["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{json}"
    );
}

#[test]
fn errors_hyper_and_extractors_make_are_json_too() {
    let node = Node::start(CONFIG);
    // A path segment that is not UTF-8 once percent-decoded (an extractor's rejection).
    assert_raw_error(
        &node,
        b"GET /v1/usage/per-tenant/%FF%FE HTTP/1.1\r\nhost: t\r\n\r\n",
        400,
        "invalid_request",
    );
    assert_raw_error(
        &node,
        b"GET /v1/authz/%FF HTTP/1.1\r\nhost: t\r\n\r\n",
        400,
        "invalid_request",
    );
    // Raw bytes that are not allowed in a request target (hyper's own 400).
    assert_raw_error(
        &node,
        b"GET /v1/usage/per-tenant/\xff\xfe HTTP/1.1\r\nhost: t\r\n\r\n",
        400,
        "invalid_request",
    );
    // Two different Content-Length headers.
    assert_raw_error(
        &node,
        b"POST /v1/check HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\ncontent-length: 5\r\ncontent-length: 40\r\n\r\n{\"rule\":\"per-tenant\",\"key\":\"cl\"}",
        400,
        "invalid_request",
    );
    // A request target over 65534 bytes.
    let long = format!(
        "GET /v1/usage/per-tenant/{} HTTP/1.1\r\nhost: t\r\n\r\n",
        "a".repeat(70_000)
    );
    assert_raw_error(&node, long.as_bytes(), 414, "uri_too_long");
    // Too many headers.
    let mut many = String::from("GET /healthz HTTP/1.1\r\nhost: t\r\n");
    for i in 0..120 {
        many.push_str(&format!("x-h{i}: v\r\n"));
    }
    many.push_str("\r\n");
    assert_raw_error(&node, many.as_bytes(), 431, "headers_too_large");
    assert_eq!(node.used("per-tenant", "cl"), 0);
    // The node still serves.
    assert_eq!(node.get("/healthz").status, 200);
}

// ---- 8. configuration errors name the real field ----

#[test]
fn config_errors_name_the_rule_the_field_and_the_duplicated_key() {
    let rule = |name: &str, limit: &str| {
        format!(
            "[[rule]]\nname = \"{name}\"\nalgorithm = \"fixed_window\"\nlimit = {limit}\nwindow = \"1m\"\n\n"
        )
    };
    let (code, out) = config_check(&format!(
        "{}{}",
        rule("api", "5"),
        rule("login-per-ip", "\"ten\"")
    ));
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("rule \"login-per-ip\": limit"), "{out}");
    assert!(!out.contains("serde_spanned"), "{out}");
    let (code, out) = config_check(&format!("{}{}", rule("api", "5"), rule("login", "0")));
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("rule \"login\": limit"), "{out}");
    let (code, out) = config_check("[api]\nmax_batch = 10\nmax_batch = 20\n");
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains(":3:") && out.contains("`max_batch`"), "{out}");
}

// ---- 20.3. no open admin API on a public address ----

/// A `levee serve` process started by hand (the harness binds loopback only); killed on drop.
struct Serve(Child);

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn serve(dir: &Path, text: &str) -> Serve {
    serve_with_env(dir, text, &[])
}

fn serve_with_env(dir: &Path, text: &str, env: &[(&str, &str)]) -> Serve {
    let path = dir.join("levee.toml");
    std::fs::write(&path, text).expect("write");
    let child = levee()
        .env_remove("LEVEE_ADMIN_TOKEN")
        .env_remove("LEVEE_REFUND_TOKEN")
        .envs(env.iter().copied())
        .arg("serve")
        .arg("--config")
        .arg(&path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("stderr.log")).expect("stderr.log"))
        .spawn()
        .expect("spawn levee serve");
    Serve(child)
}

#[test]
fn a_public_listener_without_admin_token_refuses_to_start_unless_admin_open() {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let public = format!("[node]\nhttp = \"0.0.0.0:{port}\"\n");

    let (code, out) = config_check(&public);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("api.admin_token") && out.contains("admin_open"),
        "{out}"
    );

    let mut refused = serve(dir.path(), &public);
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = refused.0.try_wait().expect("try_wait") {
            break s;
        }
        assert!(Instant::now() < deadline, "levee serve kept running");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(!status.success(), "{status:?}");
    let stderr = std::fs::read_to_string(dir.path().join("stderr.log")).unwrap_or_default();
    assert!(stderr.contains("admin_token"), "{stderr}");

    // With admin_open = true it starts, and says so loudly.
    let node = serve(dir.path(), &format!("{public}\n[api]\nadmin_open = true\n"));
    let agent = levee_blackbox::agent(Duration::from_secs(2));
    let url = format!("http://127.0.0.1:{port}/readyz");
    assert!(
        wait_until(Duration::from_secs(10), || {
            levee_blackbox::http(&agent, "GET", &url, None).is_ok_and(|r| r.status == 200)
        }),
        "the open node did not become ready"
    );
    let stderr = std::fs::read_to_string(dir.path().join("stderr.log")).unwrap_or_default();
    assert!(stderr.contains("admin_open"), "{stderr}");
    drop(node);
}

#[test]
fn the_admin_token_can_come_from_the_environment() {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    // A public listener and no token in the file: the environment's token lets it start, and
    // the admin API asks for it.
    let node = serve_with_env(
        dir.path(),
        &format!("[node]\nhttp = \"0.0.0.0:{port}\"\n"),
        &[("LEVEE_ADMIN_TOKEN", "from-the-env")],
    );
    let agent = levee_blackbox::agent(Duration::from_secs(2));
    let base = format!("http://127.0.0.1:{port}");
    assert!(
        wait_until(Duration::from_secs(10), || {
            levee_blackbox::http(&agent, "GET", &format!("{base}/readyz"), None)
                .is_ok_and(|r| r.status == 200)
        }),
        "the node with a token from the environment did not become ready: {}",
        std::fs::read_to_string(dir.path().join("stderr.log")).unwrap_or_default()
    );
    let reload = |token: Option<&str>| {
        let mut req = ureq::http::Request::builder()
            .method("POST")
            .uri(format!("{base}/admin/reload"));
        if let Some(t) = token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        let resp = agent
            .run(req.body(()).expect("request"))
            .expect("reload answered");
        resp.status().as_u16()
    };
    assert_eq!(reload(None), 401);
    assert_eq!(reload(Some("wrong")), 401);
    assert_eq!(reload(Some("from-the-env")), 200);
    drop(node);
}

/// Reads one whole answer on `s` (its head, then `Content-Length` bytes of body): the head, or
/// `None` if the connection was closed before it was complete.
fn whole_answer(s: &mut TcpStream) -> Option<String> {
    let head = read_head(s)?;
    let len = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse::<usize>().ok())?
        })
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).ok()?;
    Some(head)
}

/// A handler that answers without reading the body (`POST /admin/reload` takes none, a 415 or a
/// 405 is known from the head) must not leave a keep-alive client a dead connection. Here a
/// chunked body's last chunk arrives 200 ms after the head, as a client that streams its
/// body sends it. The node reads the rest before answering, and the next request on the same
/// connection is answered. Without that, hyper closed the connection after the answer without
/// saying so, and the next request failed (what made `openapi`'s route walk flaky under load).
#[test]
fn an_answer_given_before_the_body_ended_leaves_the_connection_usable() {
    let node = Node::start(CONFIG);
    let cases = [
        ("POST", "/admin/reload", "application/json", "200"),
        ("POST", "/v1/check", "text/plain", "415"),
        ("PUT", "/admin/reload", "application/json", "405"),
        (
            "DELETE",
            "/v1/usage/per-tenant/k",
            "application/json",
            "401",
        ),
    ];
    for (method, path, content_type, status) in cases {
        let mut s = TcpStream::connect(("127.0.0.1", node.port())).expect("connect");
        let auth = if method == "DELETE" {
            String::new()
        } else {
            format!("authorization: Bearer {TOKEN}\r\n")
        };
        let head = format!(
            "{method} {path} HTTP/1.1\r\nhost: t\r\n{auth}content-type: {content_type}\r\n\
             transfer-encoding: chunked\r\n\r\n"
        );
        s.write_all(head.as_bytes()).expect("head");
        std::thread::sleep(Duration::from_millis(200));
        // The node may have answered already; the rest of the body goes after the head all
        // the same, as a client writes it.
        let _ = s.write_all(b"2\r\n{}\r\n0\r\n\r\n");
        let answer = whole_answer(&mut s).unwrap_or_else(|| panic!("{method} {path}: no answer"));
        assert!(
            answer.starts_with(&format!("HTTP/1.1 {status} ")),
            "{method} {path}: {answer}"
        );
        assert!(
            !answer.to_ascii_lowercase().contains("connection: close"),
            "{method} {path}: {answer}"
        );
        let next = exchange(&mut s, HEALTHZ)
            .unwrap_or_else(|| panic!("{method} {path}: the connection died after the answer"));
        assert!(
            next.starts_with("HTTP/1.1 200 "),
            "{method} {path}: then {next}"
        );
    }
}

/// What a handler left is read only up to `api.max_body` and `api.request_timeout`: a client
/// that announces more than it sends gets its answer when the time is up, with `Connection:
/// close`, and the connection is closed.
#[test]
fn a_body_left_unfinished_is_waited_for_only_as_long_as_the_request_timeout() {
    let node = Node::start(&format!(
        "{}\n",
        CONFIG.replace(
            "[api]\n",
            "[api]\nrequest_timeout = \"1s\"\nmax_body = \"4KiB\"\n"
        )
    ));
    // Announced within max_body, never finished: the answer comes after request_timeout.
    let mut s = TcpStream::connect(("127.0.0.1", node.port())).expect("connect");
    let started = Instant::now();
    s.write_all(
        b"POST /v1/check HTTP/1.1\r\nhost: t\r\ncontent-type: text/plain\r\n\
          content-length: 1000\r\n\r\n0123456789",
    )
    .expect("request");
    let answer = whole_answer(&mut s).expect("an answer");
    assert!(answer.starts_with("HTTP/1.1 415 "), "{answer}");
    assert!(
        answer.to_ascii_lowercase().contains("connection: close"),
        "{answer}"
    );
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "{:?}",
        started.elapsed()
    );
    closed_within(&mut s, Duration::from_secs(5)).expect("closed");
    // Over max_body: no wait for the rest at all once 4 KiB more than the limit came.
    let mut s = TcpStream::connect(("127.0.0.1", node.port())).expect("connect");
    let mut request = format!(
        "PUT /admin/reload HTTP/1.1\r\nhost: t\r\nauthorization: Bearer {TOKEN}\r\n\
         transfer-encoding: chunked\r\n\r\n"
    )
    .into_bytes();
    let chunk = vec![b'x'; 4096];
    for _ in 0..3 {
        request.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
        request.extend_from_slice(&chunk);
        request.extend_from_slice(b"\r\n");
    }
    s.write_all(&request).expect("request");
    let answer = whole_answer(&mut s).expect("an answer");
    assert!(answer.starts_with("HTTP/1.1 405 "), "{answer}");
    assert!(
        answer.to_ascii_lowercase().contains("connection: close"),
        "{answer}"
    );
    closed_within(&mut s, Duration::from_secs(5)).expect("closed");
}
