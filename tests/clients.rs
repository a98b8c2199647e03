//! The Rust client (`crates/levee-client`) against real nodes: owner routing on a real local
//! cluster (the nodes forward nothing; a client pinned to one node makes it forward), the
//! fallbacks when no node answers, retries that reuse one idempotency key, and the
//! `tower::Layer` in front of a tiny axum app.

use std::time::Duration;

use levee_blackbox::cluster::{Cluster, ClusterSpec};
use levee_blackbox::{Node, levee_binary, metric};
use levee_client::{Check, Client, Fallback, Source};

const RULES: &str = r#"
[[rule]]
name = "per-minute"
algorithm = "fixed_window"
limit = 100000
window = "1m"
"#;

/// `levee_forwarded_checks_total` of node `i`.
fn forwarded(c: &Cluster, i: usize) -> f64 {
    let m = c.get(i, "/metrics").unwrap_or_else(|e| panic!("{e}"));
    metric(&m.body, "levee_forwarded_checks_total", &[])
        .unwrap_or_else(|| panic!("node {i} has no levee_forwarded_checks_total"))
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
}

#[test]
fn a_client_routing_to_owners_makes_no_node_forward_while_one_pinned_to_a_node_does() {
    let spec = ClusterSpec::new(levee_binary(), &["eu", "us"], 2, RULES);
    let mut c = Cluster::start(&spec).unwrap_or_else(|e| panic!("{e}"));
    let eu1 = c.idx("eu-1").expect("eu-1");
    let eu2 = c.idx("eu-2").expect("eu-2");
    let urls: Vec<String> = (0..c.len())
        .map(|i| format!("http://{}", c.node(i).http))
        .collect();
    let url = |i: usize| urls[i].clone();
    let all: Vec<usize> = (0..c.len()).collect();
    let total = |c: &Cluster| all.iter().map(|&i| forwarded(c, i)).sum::<f64>();
    let keys: Vec<String> = (0..100).map(|i| format!("tenant-{i}")).collect();
    // Which eu node owns each key, as the nodes say (`owner` of /v1/usage).
    let owners: Vec<String> = keys
        .iter()
        .map(|k| {
            let u = c
                .usage(eu1, "per-minute", k)
                .unwrap_or_else(|e| panic!("{e}"));
            u["owner"].as_str().expect("owner").to_owned()
        })
        .collect();
    let not_eu1 = owners.iter().filter(|o| *o != "eu-1").count();
    assert!(
        not_eu1 > 0 && not_eu1 < keys.len(),
        "both eu nodes own keys: {owners:?}"
    );
    let rt = rt();

    let routed = Client::builder().node(url(eu1)).build().expect("client");
    let before = total(&c);
    rt.block_on(async {
        for (k, owner) in keys.iter().zip(&owners) {
            // The client's choice is the node's owner.
            let node = routed.node_for(k).await;
            let want = url(c.idx(owner).expect("owner index"));
            assert_eq!(node, want, "{k}");
            let d = routed
                .check(&Check::new("per-minute", k))
                .await
                .unwrap_or_else(|e| panic!("{k}: {e}"));
            assert!(d.allowed && d.source == Source::Node, "{k}: {d:?}");
            // Decided where it arrived: the deciding node reports its own share.
            assert!(d.local_remaining.is_some(), "{k}: {d:?}");
        }
        let batch: Vec<Check> = keys.iter().map(|k| Check::new("per-minute", k)).collect();
        let out = routed.batch(&batch).await.expect("batch");
        assert_eq!(out.len(), keys.len());
        for (d, k) in out.iter().zip(&keys) {
            assert!(d.allowed && &d.key == k, "{d:?}");
        }
    });
    assert_eq!(total(&c), before, "the routed client made a node forward");

    let pinned = Client::builder()
        .node(url(eu1))
        .owner_routing(false)
        .build()
        .expect("client");
    let before_eu1 = forwarded(&c, eu1);
    rt.block_on(async {
        for k in &keys {
            let d = pinned
                .check(&Check::new("per-minute", k))
                .await
                .unwrap_or_else(|e| panic!("{k}: {e}"));
            assert!(d.allowed, "{d:?}");
        }
    });
    assert_eq!(
        forwarded(&c, eu1) - before_eu1,
        not_eu1 as f64,
        "eu-1 forwards every check of a key it does not own"
    );

    // An owner goes away: its keys' checks are retried on its region-mate, and the
    // client reads the ring again (on the error, and every 100 ms) until eu-1, which no longer
    // hears eu-2, owns every key.
    let watching = Client::builder()
        .node(url(eu1))
        .ring_refresh(Duration::from_millis(100))
        .build()
        .expect("client");
    c.stop(eu2);
    rt.block_on(async {
        for k in &keys {
            let d = watching
                .check(&Check::new("per-minute", k))
                .await
                .unwrap_or_else(|e| panic!("{k}: {e}"));
            // A node decided (eu-1, alone and under its conservative cap for eu-2's keys,
            // which may deny: strict mode).
            assert_eq!(d.source, Source::Node, "{k}: {d:?}");
        }
    });
    let all_on_eu1 = levee_blackbox::wait_until(Duration::from_secs(20), || {
        rt.block_on(async {
            let mut every = true;
            for k in &keys {
                every &= watching.node_for(k).await == url(eu1);
            }
            every
        })
    });
    assert!(all_on_eu1, "the client still routes to the stopped eu-2");
}

const SINGLE: &str = r#"
[node]
id = "n1"
region = "local"
http = {http}

[[rule]]
name = "search-per-minute"
algorithm = "fixed_window"
limit = 1000
window = "1m"
"#;

#[test]
fn with_no_node_answering_the_fallback_decides_and_the_local_cap_uses_the_rules_figures() {
    let mut node = Node::start(SINGLE);
    let url = node.url();
    let rt = rt();
    let build = |f: Fallback| {
        Client::builder()
            .node(url.clone())
            .timeout(Duration::from_millis(300))
            .retries(1)
            .fallback(f)
            .build()
            .expect("client")
    };
    let open = build(Fallback::FailOpen);
    let closed = build(Fallback::FailClosed);
    let error = build(Fallback::Error);
    let cap = build(Fallback::LocalCap {
        fraction: 0.01,
        max_keys: 100,
    });
    let pinned_cap = Client::builder()
        .node(url.clone())
        .owner_routing(false)
        .timeout(Duration::from_millis(300))
        .retries(1)
        .fallback(Fallback::LocalCap {
            fraction: 0.01,
            max_keys: 100,
        })
        .build()
        .expect("client");
    let check = Check::new("search-per-minute", "acme");
    rt.block_on(async {
        // While the node answers, the node decides (and the cap clients read the rules).
        for client in [&open, &closed, &error, &cap, &pinned_cap] {
            let d = client.check(&check).await.expect("a decision");
            assert_eq!(d.source, Source::Node);
        }
    });
    node.stop();
    rt.block_on(async {
        let d = open.check(&check).await.expect("fail open");
        assert!(d.allowed && d.source == Source::Fallback, "{d:?}");
        let d = closed.check(&check).await.expect("fail closed");
        assert!(!d.allowed && d.source == Source::Fallback, "{d:?}");
        let e = error.check(&check).await.expect_err("no fallback");
        assert!(matches!(e, levee_client::Error::Unavailable(_)), "{e:?}");
        // 1% of 1,000 a minute: 10 allowed, then denied.
        let mut allowed = 0;
        for _ in 0..15 {
            let d = cap.check(&check).await.expect("local cap");
            assert_eq!(d.source, Source::Fallback);
            allowed += usize::from(d.allowed);
        }
        assert_eq!(allowed, 10);
        // The same without owner routing: the rules were read all the same.
        let d = pinned_cap.check(&check).await.expect("local cap");
        assert!(d.allowed && d.source == Source::Fallback, "{d:?}");
        // An `all` is atomic here too: denied by the spent key, it takes nothing from the
        // other, which still has its 10.
        let fresh = Check::new("search-per-minute", "fresh");
        let d = cap
            .check_all(&[fresh.clone(), check.clone()], None)
            .await
            .expect("local cap");
        assert!(!d.allowed && d.source == Source::Fallback, "{d:?}");
        let mut allowed = 0;
        for _ in 0..15 {
            allowed += usize::from(cap.check(&fresh).await.expect("local cap").allowed);
        }
        assert_eq!(allowed, 10, "the denied `all` consumed from the other key");
    });
}

/// A server that answers its first request only after the client gave up, and the next at
/// once; it returns every request's `idempotency_key`.
#[test]
fn a_retry_sends_the_same_idempotency_key_and_a_new_call_another() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rt = rt();
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
        let server = tokio::spawn(async move {
            let mut n = 0;
            loop {
                let (mut s, _) = listener.accept().await.unwrap();
                let tx = tx.clone();
                n += 1;
                let first = n == 1;
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 8192];
                    let mut got = Vec::new();
                    loop {
                        let r = s.read(&mut buf).await.unwrap_or(0);
                        if r == 0 {
                            return;
                        }
                        got.extend_from_slice(&buf[..r]);
                        let text = String::from_utf8_lossy(&got).into_owned();
                        if let Some(body_at) = text.find("\r\n\r\n")
                            && text.len() > body_at + 4
                            && text.ends_with('}')
                        {
                            let body = &text[body_at + 4..];
                            let v: serde_json::Value = serde_json::from_str(body).unwrap();
                            tx.send(v["idempotency_key"].as_str().unwrap().to_owned())
                                .unwrap();
                            got.clear();
                            if first {
                                tokio::time::sleep(Duration::from_secs(2)).await;
                            }
                            let answer = r#"{"allowed":true,"rule":"r","key":"k","limit":1,"remaining":0,"reset_after_ms":1,"retry_after_ms":0,"mode":"enforce","degraded":false}"#;
                            let _ = s
                                .write_all(
                                    format!(
                                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{answer}",
                                        answer.len()
                                    )
                                    .as_bytes(),
                                )
                                .await;
                        }
                    }
                });
            }
        });
        let client = Client::builder()
            .node(addr.to_string())
            .owner_routing(false)
            .timeout(Duration::from_millis(200))
            .retries(2)
            .build()
            .expect("client");
        let d = client.check(&Check::new("r", "k")).await.expect("retried");
        assert!(d.allowed);
        let first = rx.recv().await.unwrap();
        let retry = rx.recv().await.unwrap();
        assert_eq!(first, retry, "a retry reuses the call's key");
        client.check(&Check::new("r", "k")).await.expect("second call");
        let next = rx.recv().await.unwrap();
        assert_ne!(first, next, "each logical call has its own key");
        server.abort();
    });
}

const LAYERED: &str = r#"
[node]
id = "n1"
region = "local"

[[rule]]
name = "search-per-tenant"
algorithm = "fixed_window"
limit = 3
window = "1m"
"#;

/// A tiny axum app behind the client's `tower::Layer`, limited per tenant (`X-Tenant`) by a
/// real `levee serve`: three searches a minute, then `429` with the headers, the app not
/// called; another tenant unaffected; no tenant: `400 missing_key`.
#[test]
fn the_tower_layer_answers_429_with_the_headers_and_spares_the_app() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use axum::Router;
    use axum::routing::get;
    use levee_client::layer::RateLimitLayer;

    let node = Node::start(LAYERED);
    let rt = rt();
    let calls = Arc::new(AtomicUsize::new(0));
    let client = Client::builder().node(node.url()).build().expect("client");
    let layer = RateLimitLayer::new(
        client,
        "search-per-tenant",
        |req: &http::Request<axum::body::Body>| {
            req.headers()
                .get("x-tenant")?
                .to_str()
                .ok()
                .map(str::to_owned)
        },
    );
    let counted = calls.clone();
    let app = Router::new()
        .route(
            "/search",
            get(move || {
                let counted = counted.clone();
                async move {
                    counted.fetch_add(1, Ordering::SeqCst);
                    "results"
                }
            }),
        )
        .layer(layer);
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("a port");
    let addr = listener.local_addr().expect("addr");
    let server = rt.spawn(async move { axum::serve(listener, app).await });
    let agent = levee_blackbox::agent(Duration::from_secs(10));
    let search = |tenant: Option<&str>| {
        let mut req = agent.get(format!("http://{addr}/search"));
        if let Some(t) = tenant {
            req = req.header("x-tenant", t);
        }
        levee_blackbox::Reply::read(req.call().expect("an answer")).expect("a body")
    };
    for left in [2, 1, 0] {
        let r = search(Some("acme"));
        assert_eq!((r.status, r.body.as_str()), (200, "results"));
        assert_eq!(r.header_u64("x-ratelimit-remaining"), left);
        assert_eq!(r.header_u64("x-ratelimit-limit"), 3);
        assert_eq!(
            r.header("ratelimit-policy"),
            Some("\"search-per-tenant\";q=3;w=60")
        );
        assert_eq!(r.header("retry-after"), None);
    }
    let denied = search(Some("acme"));
    assert_eq!(denied.status, 429, "{}", denied.body);
    assert_eq!(denied.json["error"], "rate_limited");
    assert!(denied.json["retry_after_ms"].as_u64().unwrap() > 0);
    assert!(denied.header_u64("retry-after") >= 1);
    assert_eq!(denied.header_u64("x-ratelimit-remaining"), 0);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        3,
        "a denied search reaches the app"
    );
    let other = search(Some("globex"));
    assert_eq!(other.status, 200);
    let missing = search(None);
    assert_eq!(missing.status, 400);
    assert_eq!(missing.json["error"], "missing_key");
    assert_eq!(calls.load(Ordering::SeqCst), 4);
    server.abort();
}

/// The client's override methods against a real node with an admin token: put, get, list,
/// delete, the lists' effect on checks, the token required for writing, and a bad body's
/// error naming its field.
#[test]
fn the_client_writes_reads_lists_and_deletes_overrides() {
    use levee_client::{Error, Override};

    let node = Node::start(
        "[api]\nadmin_token = \"t0ken\"\n\n[[rule]]\nname = \"api\"\nalgorithm = \"fixed_window\"\nlimit = 2\nwindow = \"1d\"\n\n[[rule]]\nname = \"bucket\"\nalgorithm = \"token_bucket\"\nrate = 1\nper = \"1h\"\n",
    );
    let rt = rt();
    let admin = Client::builder()
        .node(node.url())
        .admin_token("t0ken")
        .build()
        .expect("client");
    let anonymous = Client::builder().node(node.url()).build().expect("client");
    rt.block_on(async {
        let put = admin
            .put_override("api", "gold", &Override::limit(5).ttl("1h"))
            .await
            .expect("put");
        assert_eq!((put.limit, put.rule.as_str()), (Some(5), "api"));
        assert!(
            put.expires_in_ms
                .is_some_and(|ms| ms > 3_500_000 && ms <= 3_600_000)
        );
        let mut admitted = 0;
        for _ in 0..8 {
            let d = anonymous
                .check(&Check::new("api", "gold"))
                .await
                .expect("check");
            assert_eq!(d.limit, 5);
            admitted += usize::from(d.allowed);
        }
        assert_eq!(admitted, 5);
        let b = admin
            .put_override("bucket", "k", &Override::rate(3, Some(6)))
            .await
            .expect("put");
        assert_eq!((b.rate, b.burst), (Some(3), Some(6)));
        admin
            .put_override("api", "banned", &Override::deny())
            .await
            .expect("put");
        let d = anonymous
            .check(&Check::new("api", "banned"))
            .await
            .expect("check");
        assert!(!d.allowed);
        assert_eq!(d.list.as_deref(), Some("deny"));
        let got = anonymous.get_override("api", "banned").await.expect("get");
        assert_eq!(got.and_then(|o| o.action).as_deref(), Some("deny"));
        let keys: Vec<String> = anonymous
            .list_overrides("api")
            .await
            .expect("list")
            .into_iter()
            .map(|o| o.key)
            .collect();
        assert_eq!(keys, vec!["banned".to_owned(), "gold".to_owned()]);
        admin
            .delete_override("api", "banned")
            .await
            .expect("deleted");
        assert_eq!(
            anonymous.get_override("api", "banned").await.expect("get"),
            None
        );
        // Writing without the token, and a body that does not fit the rule, are refused.
        match anonymous.put_override("api", "x", &Override::allow()).await {
            Err(Error::Api { status: 401, .. }) => {}
            other => panic!("{other:?}"),
        }
        match admin
            .put_override("api", "x", &Override::rate(1, None))
            .await
        {
            Err(Error::Api {
                status: 400,
                message,
                ..
            }) => assert!(message.starts_with("rate"), "{message}"),
            other => panic!("{other:?}"),
        }
        match admin.list_overrides("nope").await {
            Err(Error::Api {
                status: 404, code, ..
            }) => assert_eq!(code, "unknown_rule"),
            other => panic!("{other:?}"),
        }
    });
}
