//! Threshold notices (`[[notify]]`, API.md part 2): a real local HTTP receiver, one that fails,
//! times out and recovers; exactly one delivery per crossing with the agreed `Idempotency-Key`;
//! a full queue drops and counts while decisions keep answering; configuration errors name
//! the field; two regions send the same `Idempotency-Key` for the same crossing.

use std::collections::{BTreeMap, VecDeque};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use levee_blackbox::cluster::{Cluster, ClusterSpec};
use levee_blackbox::{Node, config_check, levee_binary, metric, wait_until};
use serde_json::Value;

/// What the receiver does with one request.
#[derive(Debug, Clone, Copy)]
enum Answer {
    /// `500 Internal Server Error`.
    Fail,
    /// Answers `200` only after this long (past the node's timeout).
    Late(Duration),
    /// Never answers (holds the connection).
    Hang,
}

/// One request the receiver got.
#[derive(Debug, Clone)]
struct Received {
    idempotency_key: String,
    content_type: String,
    body: Value,
    /// Whether it was answered 200 at once (a delivery the node saw succeed).
    delivered: bool,
}

/// A tiny HTTP/1.1 receiver on 127.0.0.1: answers the first requests as scripted, every later
/// one `200`, one connection per request (`Connection: close`). Its threads end with the test
/// process; it is never joined.
struct Receiver {
    url: String,
    got: Arc<Mutex<Vec<Received>>>,
}

impl Receiver {
    fn start(script: &[Answer]) -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a receiver");
        let url = format!(
            "http://{}/hooks/levee",
            listener.local_addr().expect("address")
        );
        let got = Arc::new(Mutex::new(Vec::new()));
        let script = Arc::new(Mutex::new(script.iter().copied().collect::<VecDeque<_>>()));
        {
            let got = Arc::clone(&got);
            std::thread::spawn(move || {
                for conn in listener.incoming().flatten() {
                    let got = Arc::clone(&got);
                    let script = Arc::clone(&script);
                    std::thread::spawn(move || serve(conn, &got, &script));
                }
            });
        }
        Receiver { url, got }
    }

    fn received(&self) -> Vec<Received> {
        self.got.lock().expect("lock").clone()
    }
}

fn serve(conn: TcpStream, got: &Mutex<Vec<Received>>, script: &Mutex<VecDeque<Answer>>) {
    let mut reader = BufReader::new(conn.try_clone().expect("clone"));
    let mut headers = BTreeMap::new();
    let mut line = String::new();
    if reader.read_line(&mut line).unwrap_or(0) == 0 {
        return;
    }
    assert!(line.starts_with("POST /hooks/levee "), "{line:?}");
    loop {
        line.clear();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_owned());
        }
    }
    let len: usize = headers
        .get("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; len];
    if reader.read_exact(&mut body).is_err() {
        return;
    }
    let answer = script.lock().expect("lock").pop_front();
    got.lock().expect("lock").push(Received {
        idempotency_key: headers.get("idempotency-key").cloned().unwrap_or_default(),
        content_type: headers.get("content-type").cloned().unwrap_or_default(),
        body: serde_json::from_slice(&body).unwrap_or(Value::Null),
        delivered: answer.is_none(),
    });
    let mut conn = conn;
    let status = match answer {
        None => "200 OK",
        Some(Answer::Fail) => "500 Internal Server Error",
        Some(Answer::Late(d)) => {
            std::thread::sleep(d);
            "200 OK"
        }
        Some(Answer::Hang) => {
            std::thread::sleep(Duration::from_secs(3600));
            return;
        }
    };
    let _ = write!(
        conn,
        "HTTP/1.1 {status}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
    );
}

fn notices(node: &Node, result: &str) -> f64 {
    metric(
        &node.metrics(),
        "levee_notices_total",
        &[("result", result)],
    )
    .unwrap_or(0.0)
}

/// Where the window of a rule of `window_ms` containing `at_ms` starts.
fn window_start(at_ms: u64, window_ms: u64) -> u64 {
    at_ms - at_ms % window_ms
}

#[test]
fn a_crossing_is_delivered_once_through_a_failure_and_a_timeout() {
    // The first attempt is answered 500, the second too late, every later one 200.
    let receiver = Receiver::start(&[Answer::Fail, Answer::Late(Duration::from_secs(2))]);
    let node = Node::start(&format!(
        r#"
[node]
id = "solo"
region = "eu"

[[rule]]
name = "api"
algorithm = "fixed_window"
limit = 10
window = "1h"

[[rule]]
name = "quiet"
algorithm = "fixed_window"
limit = 1
window = "1h"

[[notify]]
url = "{}"
rules = ["api"]
thresholds = [0.8, 1.0]
timeout = "300ms"
"#,
        receiver.url
    ));
    for _ in 0..10 {
        assert!(node.check("api", "acme", 1).allowed());
    }
    // Denied decisions past the limit and a rule not watched notice nothing more.
    for _ in 0..5 {
        assert!(!node.check("api", "acme", 1).allowed());
    }
    node.check("quiet", "acme", 1);
    assert!(
        wait_until(Duration::from_secs(30), || notices(&node, "sent") >= 2.0),
        "two notices sent; received: {:?}\n{}",
        receiver.received(),
        node.metrics()
    );
    let got = receiver.received();
    // Retries were seen: the failed and the late attempts, then one delivery per crossing.
    assert!(got.len() >= 4, "{got:?}");
    let delivered: Vec<&Received> = got.iter().filter(|r| r.delivered).collect();
    assert_eq!(delivered.len(), 2, "{got:?}");
    let mut thresholds = Vec::new();
    for r in &delivered {
        let b = &r.body;
        let threshold = b["threshold"].as_f64().expect("threshold");
        let at = b["at_ms"].as_u64().expect("at_ms");
        let start = window_start(at, 3_600_000);
        assert_eq!(b["rule"], "api", "{b}");
        assert_eq!(b["key"], "acme", "{b}");
        assert_eq!(b["limit"], 10, "{b}");
        assert_eq!(b["used"].as_f64(), Some(threshold * 10.0), "{b}");
        assert_eq!(b["window_start_ms"], start, "{b}");
        assert_eq!(b["region"], "eu", "{b}");
        assert_eq!(b["node"], "solo", "{b}");
        assert_eq!(r.content_type, "application/json");
        let t = if threshold == 1.0 { "1.0" } else { "0.8" };
        assert_eq!(r.idempotency_key, format!("api/acme/{t}/{start}"));
        thresholds.push(t);
        // Every attempt of a crossing carries the same key and body.
        for other in got
            .iter()
            .filter(|o| o.idempotency_key == r.idempotency_key)
        {
            assert_eq!(other.body, r.body);
        }
    }
    thresholds.sort_unstable();
    assert_eq!(thresholds, ["0.8", "1.0"]);
    let text = node.metrics();
    assert_eq!(notices(&node, "sent"), 2.0, "{text}");
    assert_eq!(notices(&node, "failed"), 0.0, "{text}");
    assert_eq!(notices(&node, "dropped"), 0.0, "{text}");
    assert!(
        metric(&text, "levee_notice_retries_total", &[]).unwrap_or(0.0) >= 2.0,
        "{text}"
    );
}

#[test]
fn a_token_bucket_crossing_is_windowed_by_its_refill_time() {
    let receiver = Receiver::start(&[]);
    // 4 tokens, 1 per 10 s: an empty bucket refills in 40 s.
    let node = Node::start(&format!(
        r#"
[[rule]]
name = "bucket"
algorithm = "token_bucket"
rate = 1
per = "10s"
burst = 4

[[notify]]
url = "{}"
thresholds = [0.5]
"#,
        receiver.url
    ));
    for _ in 0..4 {
        node.check("bucket", "k/1", 1);
    }
    assert!(wait_until(Duration::from_secs(20), || notices(
        &node, "sent"
    ) >= 1.0));
    let got = receiver.received();
    assert_eq!(got.len(), 1, "{got:?}");
    let b = &got[0].body;
    let start = window_start(b["at_ms"].as_u64().expect("at_ms"), 40_000);
    assert_eq!(b["window_start_ms"], start, "{b}");
    assert_eq!(b["limit"], 4, "{b}");
    assert_eq!(got[0].idempotency_key, format!("bucket/k/1/0.5/{start}"));
}

#[test]
fn a_full_queue_drops_and_counts_while_decisions_keep_answering() {
    // The receiver never answers: the first notice stays in delivery, the queue holds one.
    let receiver = Receiver::start(&[Answer::Hang; 64]);
    let node = Node::start(&format!(
        r#"
[[rule]]
name = "one"
algorithm = "fixed_window"
limit = 1
window = "1h"

[[notify]]
url = "{}"
thresholds = [1.0]
timeout = "30s"
queue = 1
"#,
        receiver.url
    ));
    for i in 0..20 {
        let r = node.check("one", &format!("key-{i}"), 1);
        assert!(r.allowed(), "{r:?}");
    }
    assert!(
        wait_until(Duration::from_secs(10), || notices(&node, "dropped")
            >= 19.0),
        "{}",
        node.metrics()
    );
    assert_eq!(notices(&node, "dropped"), 19.0);
    assert_eq!(notices(&node, "sent"), 0.0);
    assert!(wait_until(Duration::from_secs(10), || !receiver
        .received()
        .is_empty()));
    // Decisions still answer at once, on every key.
    assert!(!node.check("one", "key-0", 1).allowed());
    assert!(node.check("one", "fresh", 1).allowed());
}

#[test]
fn a_notice_failing_for_a_minute_is_given_up_and_counted_failed() {
    let receiver = Receiver::start(&[Answer::Fail; 1000]);
    let node = Node::start(&format!(
        r#"
[[rule]]
name = "one"
algorithm = "fixed_window"
limit = 1
window = "1d"

[[notify]]
url = "{}"
thresholds = [1.0]
timeout = "1s"
"#,
        receiver.url
    ));
    node.check("one", "k", 1);
    assert!(
        wait_until(Duration::from_secs(120), || notices(&node, "failed") >= 1.0),
        "{}",
        node.metrics()
    );
    let text = node.metrics();
    assert_eq!(notices(&node, "failed"), 1.0, "{text}");
    assert_eq!(notices(&node, "sent"), 0.0, "{text}");
    let got = receiver.received();
    // Every attempt was the same notice, retried (200 ms doubling to 10 s fits about ten
    // attempts in a minute).
    assert!(got.len() >= 5, "{got:?}");
    assert!(
        got.iter()
            .all(|r| r.idempotency_key == got[0].idempotency_key)
    );
    let retries = metric(&text, "levee_notice_retries_total", &[]).unwrap_or(0.0);
    assert_eq!(retries, got.len() as f64 - 1.0, "{text}");
}

#[test]
fn bad_notify_tables_are_configuration_errors_naming_the_field() {
    let rule =
        "[[rule]]\nname = \"api\"\nalgorithm = \"fixed_window\"\nlimit = 5\nwindow = \"1s\"\n";
    let (code, out) = config_check(&format!(
        "{rule}[[notify]]\nurl = \"http://127.0.0.1:9000/h\"\nrules = [\"api\"]\nthresholds = [0.8, 1.0]\n"
    ));
    assert_eq!(code, Some(0), "{out}");
    for (table, needle) in [
        ("url = \"127.0.0.1:9000/h\"\n", "notify[0].url"),
        ("url = \"https://x/h\"\n", "notify[0].url"),
        (
            "url = \"http://x/h\"\nthresholds = [0.8, 1.2]\n",
            "notify[0].thresholds[1]",
        ),
        (
            "url = \"http://x/h\"\nthresholds = [0]\n",
            "notify[0].thresholds[0]",
        ),
        (
            "url = \"http://x/h\"\nrules = [\"apj\"]\n",
            "notify[0].rules[0]",
        ),
        ("url = \"http://x/h\"\nrules = []\n", "notify[0].rules"),
    ] {
        let (code, out) = config_check(&format!("{rule}[[notify]]\n{table}"));
        assert_eq!(code, Some(1), "{table}: {out}");
        assert!(out.contains(needle), "{table}: {out}");
    }
}

#[test]
fn two_regions_send_the_same_idempotency_key_for_the_same_crossing() {
    let receiver = Receiver::start(&[]);
    let rules =
        "[[rule]]\nname = \"api\"\nalgorithm = \"fixed_window\"\nlimit = 20\nwindow = \"1d\"\n";
    let spec = ClusterSpec::new(levee_binary(), &["eu", "us"], 2, rules);
    let cluster = Cluster::start(&spec).expect("a cluster");
    let agent = ureq::Agent::new_with_defaults();
    // Every node watches the rule from now on (a reload adds the table).
    for i in 0..cluster.len() {
        let path = &cluster.node(i).config;
        let mut text = std::fs::read_to_string(path).expect("config");
        text.push_str(&format!(
            "\n[[notify]]\nurl = \"{}\"\nthresholds = [0.25]\n",
            receiver.url
        ));
        std::fs::write(path, text).expect("write config");
        let r = agent
            .post(cluster.url(i, "/admin/reload"))
            .send_empty()
            .expect("reload");
        assert_eq!(r.status(), 200);
    }
    let check = |i: usize| {
        let r = agent
            .post(cluster.url(i, "/v1/check"))
            .content_type("application/json")
            .send(r#"{"rule": "api", "key": "acme", "cost": 1}"#)
            .expect("check");
        assert_eq!(r.status(), 200);
    };
    let usage = |i: usize| {
        let mut r = agent
            .get(cluster.url(i, "/v1/usage/api/acme"))
            .call()
            .expect("usage");
        let text = r.body_mut().read_to_string().expect("usage body");
        serde_json::from_str::<Value>(&text).expect("json")
    };
    let eu = cluster.nodes_in("eu");
    let us = cluster.nodes_in("us");
    // eu crosses a quarter of the limit (what its owner holds of it at first, in strict mode),
    // through both of its nodes (the owner decides for both); us, once it knows, crosses it
    // too on its next decisions, through both of its nodes.
    for n in 0..5 {
        check(eu[n % 2]);
    }
    assert!(
        wait_until(Duration::from_secs(10), || {
            usage(us[0])["used"].as_u64().unwrap_or(0) >= 5
        }),
        "{:?}",
        (0..cluster.len()).map(usage).collect::<Vec<_>>()
    );
    for n in 0..4 {
        check(us[n % 2]);
    }
    assert!(
        wait_until(Duration::from_secs(20), || receiver.received().len() >= 2),
        "{:?}",
        receiver.received()
    );
    // Nothing more comes (the same wait again, for a notice that should not exist).
    std::thread::sleep(Duration::from_secs(1));
    let got = receiver.received();
    assert_eq!(got.len(), 2, "one notice per region: {got:?}");
    for (region, nodes) in [("eu", &eu), ("us", &us)] {
        let owner = usage(nodes[0])["owner"].as_str().expect("owner").to_owned();
        let notice = got
            .iter()
            .find(|r| r.body["region"] == region)
            .unwrap_or_else(|| panic!("no notice from {region}: {got:?}"));
        assert_eq!(notice.body["node"], owner.as_str(), "{got:?}");
    }
    assert_eq!(got[0].idempotency_key, got[1].idempotency_key, "{got:?}");
    let start = got[0].body["window_start_ms"].as_u64().expect("window");
    assert_eq!(start % 86_400_000, 0);
    assert_eq!(got[0].idempotency_key, format!("api/acme/0.25/{start}"));
}
