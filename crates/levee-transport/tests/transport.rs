//! Real QUIC on 127.0.0.1: what reaches a node, and what never does.
//!
//! Each test runs on a current-thread runtime with a thread-local metrics recorder, so the
//! counters it reads are its own nodes' alone.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use levee_core::NodeIdx;
use levee_core::crdt::Tally;
use levee_proto::{
    DeltaBatch, ForwardCheck, ForwardDecision, HEADER_BYTES, Hello, KeyEntry, MAX_FRAME_BYTES,
    Message, VERSION, encode_frame,
};
use levee_transport::certs::{init_ca, issue};
use levee_transport::{
    DialAddr, DialTiming, Inbound, PeerAddr, TlsFiles, Transport, TransportConfig, TransportError,
};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use tokio::sync::mpsc::Receiver;
use tokio::time::timeout;

/// Every test body must finish within this.
const TEST_BOUND: Duration = Duration::from_secs(30);
/// How long a node is watched to see that nothing reaches it.
const QUIET_WAIT: Duration = Duration::from_millis(750);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
const DIGEST: u64 = 0x1e7ee;

fn localhost() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

/// A cluster CA with certificates for `nodes`, in one directory.
fn pki(dir: &Path, nodes: &[&str]) {
    init_ca(dir).unwrap();
    for node in nodes {
        issue(dir, node, dir).unwrap();
    }
}

fn config(id: &str, tls: TlsFiles, digest: u64, peers: Vec<PeerAddr>) -> TransportConfig {
    TransportConfig {
        bind: localhost(),
        node_id: id.to_owned(),
        tls,
        peers,
        hello: Hello {
            node: id.to_owned(),
            replica_digest: digest,
            incarnation: 1,
        },
        wire_version: VERSION,
    }
}

async fn start(
    id: &str,
    tls: TlsFiles,
    digest: u64,
    peers: Vec<PeerAddr>,
) -> (Transport, Receiver<Inbound>) {
    Transport::start(config(id, tls, digest, peers))
        .await
        .unwrap()
}

fn peer(id: &str, transport: &Transport) -> PeerAddr {
    PeerAddr {
        id: id.to_owned(),
        addr: transport.local_addr().into(),
    }
}

fn deltas() -> Message {
    let mut state = levee_core::KeyCrdt::default();
    *state.slot_mut(1_700_000_000).tallies.entry(NodeIdx(1)) = Tally {
        consumed: 5,
        refunded: 1,
        requested: 9,
    };
    Message::Deltas(DeltaBatch {
        sent_at_ms: 1_700_000_000_123,
        ack_ms: 0,
        prev_ms: 0,
        keys: vec![KeyEntry {
            id: b"api\0acme".to_vec(),
            state,
        }]
        .into(),
    })
}

/// The next message that is not a connection's `Hello`.
async fn next_data(rx: &mut Receiver<Inbound>) -> Inbound {
    loop {
        let inbound = rx.recv().await.expect("inbound channel open");
        if !matches!(inbound.msg, Message::Hello(_)) {
            return inbound;
        }
    }
}

/// Asserts that nothing at all (not even a `Hello`) reaches `rx` for [`QUIET_WAIT`].
async fn assert_nothing_delivered(rx: &mut Receiver<Inbound>) {
    if let Ok(Some(inbound)) = timeout(QUIET_WAIT, rx.recv()).await {
        panic!(
            "expected nothing, got {:?} from {:?}",
            inbound.msg, inbound.peer
        );
    }
}

/// Asserts that nothing but `Hello`s (a connection opening, such as a peer dialling back
/// once it heard this node) reaches `rx` for [`QUIET_WAIT`].
async fn assert_no_data_delivered(rx: &mut Receiver<Inbound>) {
    if let Ok(inbound) = timeout(QUIET_WAIT, next_data(rx)).await {
        panic!(
            "expected no data, got {:?} from {:?}",
            inbound.msg, inbound.peer
        );
    }
}

/// The counters the transports of one test emitted, summed over every snapshot taken (a
/// snapshot of the debugging recorder drains its counters).
struct Counters {
    snapshotter: Snapshotter,
    /// `(name, labels, total)`.
    totals: Vec<(String, Labels, u64)>,
}

type Labels = Vec<(String, String)>;

impl Counters {
    fn new(recorder: &DebuggingRecorder) -> Counters {
        Counters {
            snapshotter: recorder.snapshotter(),
            totals: Vec::new(),
        }
    }

    fn get(&mut self, name: &str, labels: &[(&str, &str)]) -> u64 {
        for (key, _, _, value) in self.snapshotter.snapshot().into_vec() {
            let DebugValue::Counter(n) = value else {
                continue;
            };
            let key = key.key();
            let key_labels: Labels = key
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            match self
                .totals
                .iter_mut()
                .find(|(k, l, _)| k == key.name() && *l == key_labels)
            {
                Some((.., total)) => *total += n,
                None => self.totals.push((key.name().to_owned(), key_labels, n)),
            }
        }
        self.totals
            .iter()
            .filter(|(k, l, _)| {
                k == name
                    && labels
                        .iter()
                        .all(|(lk, lv)| l.iter().any(|(k, v)| k == lk && v == lv))
            })
            .map(|(.., n)| n)
            .sum()
    }

    /// Waits (within the test's bound) until a counter reaches `at_least`.
    async fn reach(&mut self, name: &str, labels: &[(&str, &str)], at_least: u64) {
        while self.get(name, labels) < at_least {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

#[tokio::test]
async fn deltas_are_sent_and_requests_answered_over_mutual_tls() {
    let dir = tempfile::tempdir().unwrap();
    pki(dir.path(), &["a", "b"]);
    timeout(TEST_BOUND, async {
        let (b, mut b_rx) = start("b", TlsFiles::in_dir(dir.path(), "b"), DIGEST, vec![]).await;
        let (a, mut a_rx) = start(
            "a",
            TlsFiles::in_dir(dir.path(), "a"),
            DIGEST,
            vec![peer("b", &b)],
        )
        .await;

        a.send("b", &deltas());
        let got = next_data(&mut b_rx).await;
        assert_eq!(got.peer, "a");
        assert_eq!(got.msg, deltas());
        assert!(got.reply.is_none());

        let forward = Message::Forward {
            id: 7,
            checks: vec![ForwardCheck {
                rule: "api".into(),
                key: "acme".into(),
                cost: 1,
                class: None,
                dry_run: false,
                idempotency_key: None,
                refund: false,
            }],
        };
        let answer = Message::ForwardReply {
            id: 7,
            decisions: vec![Some(ForwardDecision {
                allowed: true,
                would_allow: true,
                limit: 10,
                remaining: 9,
                reset_after_ms: 100,
                retry_after_ms: 0,
                degraded: false,
            })],
        };
        let expected = answer.clone();
        let owner = tokio::spawn(async move {
            let req = next_data(&mut b_rx).await;
            assert_eq!(req.peer, "a");
            assert!(matches!(req.msg, Message::Forward { id: 7, .. }));
            req.reply
                .expect("a request carries a reply channel")
                .send(answer)
                .unwrap();
            // The second request is dropped unanswered.
            let req = next_data(&mut b_rx).await;
            drop(req.reply);
            b_rx
        });
        assert_eq!(
            a.request("b", &forward, REQUEST_TIMEOUT).await.unwrap(),
            expected
        );
        let unanswered = a.request("b", &Message::PullRequest, REQUEST_TIMEOUT).await;
        assert!(
            matches!(unanswered, Err(TransportError::Stream { .. })),
            "{unanswered:?}"
        );
        owner.await.unwrap();

        // Nothing reached `a` but the Hello of the connection it dialled.
        let hello = a_rx.recv().await.unwrap();
        assert!(
            matches!(hello.msg, Message::Hello(Hello { ref node, .. }) if node == "b"),
            "{hello:?}"
        );
        assert!(a_rx.try_recv().is_err());
        a.shutdown().await;
        b.shutdown().await;
    })
    .await
    .expect("test finished in time");
}

/// A peer given by DNS name (`localhost:<port>`) is dialled at what the name resolves to.
#[tokio::test]
async fn a_peer_given_by_name_is_resolved_and_dialled() {
    let dir = tempfile::tempdir().unwrap();
    pki(dir.path(), &["a", "b"]);
    timeout(TEST_BOUND, async {
        let (b, mut b_rx) = start("b", TlsFiles::in_dir(dir.path(), "b"), DIGEST, vec![]).await;
        let by_name = DialAddr::parse(&format!("localhost:{}", b.local_addr().port())).unwrap();
        assert!(matches!(by_name, DialAddr::Name { .. }), "{by_name:?}");
        let (a, _a_rx) = start(
            "a",
            TlsFiles::in_dir(dir.path(), "a"),
            DIGEST,
            vec![PeerAddr {
                id: "b".into(),
                addr: by_name,
            }],
        )
        .await;
        a.send("b", &deltas());
        let got = next_data(&mut b_rx).await;
        assert_eq!(got.peer, "a");
        assert_eq!(got.msg, deltas());
    })
    .await
    .expect("within the test bound");
}

#[test]
fn dial_addresses_parse_as_ip_or_name_and_refuse_the_rest() {
    assert_eq!(
        DialAddr::parse("10.0.0.2:8751"),
        Ok(DialAddr::Ip("10.0.0.2:8751".parse().unwrap()))
    );
    assert_eq!(
        DialAddr::parse("[::1]:8751"),
        Ok(DialAddr::Ip("[::1]:8751".parse().unwrap()))
    );
    assert_eq!(
        DialAddr::parse("levee-eu-0.levee-eu.levee.svc:8751"),
        Ok(DialAddr::Name {
            host: "levee-eu-0.levee-eu.levee.svc".into(),
            port: 8751
        })
    );
    assert_eq!(
        DialAddr::parse("levee-eu-0:8751").unwrap().to_string(),
        "levee-eu-0:8751"
    );
    for bad in [
        "levee-eu-0",
        "levee-eu-0:0",
        "levee-eu-0:99999",
        ":8751",
        "http://x:1",
        "a b:1",
    ] {
        assert!(DialAddr::parse(bad).is_err(), "{bad} was accepted");
    }
}

#[tokio::test]
async fn a_node_certified_by_another_ca_can_neither_connect_nor_be_connected_to() {
    let recorder = DebuggingRecorder::new();
    let mut counters = Counters::new(&recorder);
    let _local = metrics::set_default_local_recorder(&recorder);

    let cluster = tempfile::tempdir().unwrap();
    pki(cluster.path(), &["a"]);
    let evil = tempfile::tempdir().unwrap();
    pki(evil.path(), &["r"]);
    // The rogue trusts the real cluster CA, so only the honest side's checks can stop it.
    let rogue_tls = TlsFiles {
        ca: cluster.path().join("ca.pem"),
        ..TlsFiles::in_dir(evil.path(), "r")
    };

    timeout(TEST_BOUND, async {
        let (target, mut target_rx) = start("r", rogue_tls.clone(), DIGEST, vec![]).await;
        let (a, mut a_rx) = start(
            "a",
            TlsFiles::in_dir(cluster.path(), "a"),
            DIGEST,
            vec![peer("r", &target)],
        )
        .await;
        let (rogue, mut rogue_rx) = start("r", rogue_tls, DIGEST, vec![peer("a", &a)]).await;

        // The rogue dials the honest node: the honest server refuses its certificate.
        rogue.send("a", &deltas());
        let dialled = rogue.request("a", &deltas(), REQUEST_TIMEOUT).await;
        assert!(dialled.is_err(), "{dialled:?}");
        counters
            .reach("levee_transport_handshakes_refused_total", &[], 1)
            .await;
        assert_nothing_delivered(&mut a_rx).await;

        // The honest node dials the rogue: its client refuses the rogue's certificate.
        a.send("r", &deltas());
        let dialled = a.request("r", &deltas(), REQUEST_TIMEOUT).await;
        assert!(
            matches!(dialled, Err(TransportError::Unreachable { .. })),
            "{dialled:?}"
        );
        counters
            .reach(
                "levee_transport_connect_failures_total",
                &[("peer", "r")],
                1,
            )
            .await;
        assert_nothing_delivered(&mut target_rx).await;
        assert_nothing_delivered(&mut a_rx).await;
        assert_nothing_delivered(&mut rogue_rx).await;

        for t in [a, target, rogue] {
            t.shutdown().await;
        }
    })
    .await
    .expect("test finished in time");
}

#[tokio::test]
async fn refused_frames_are_counted_and_the_peer_stays_up() {
    let recorder = DebuggingRecorder::new();
    let mut counters = Counters::new(&recorder);
    let _local = metrics::set_default_local_recorder(&recorder);

    let dir = tempfile::tempdir().unwrap();
    pki(dir.path(), &["a", "c"]);
    timeout(TEST_BOUND, async {
        let (a, mut a_rx) = start("a", TlsFiles::in_dir(dir.path(), "a"), DIGEST, vec![]).await;

        // A properly authenticated client that writes raw bytes.
        let mut endpoint = quinn::Endpoint::client(localhost()).unwrap();
        endpoint.set_default_client_config(
            levee_transport::tls::client_config(&TlsFiles::in_dir(dir.path(), "c")).unwrap(),
        );
        let conn = endpoint
            .connect(a.local_addr(), "a")
            .unwrap()
            .await
            .unwrap();
        let write_uni = |bytes: Vec<u8>| {
            let conn = conn.clone();
            async move {
                let mut stream = conn.open_uni().await.unwrap();
                stream.write_all(&bytes).await.unwrap();
                stream.finish().unwrap();
            }
        };
        let hello = Message::Hello(Hello {
            node: "c".into(),
            replica_digest: DIGEST,
            incarnation: 1,
        });
        write_uni(encode_frame(&hello).unwrap()).await;
        let got = a_rx.recv().await.unwrap();
        assert_eq!((got.peer.as_str(), got.msg), ("c", hello));

        // Valid header, payload that is no message.
        let mut corrupted = vec![VERSION];
        corrupted.extend_from_slice(&4u32.to_le_bytes());
        corrupted.extend_from_slice(&[0xff; 4]);
        write_uni(corrupted).await;
        // A header announcing more than the limit, and nothing after it.
        let mut oversized = vec![VERSION];
        oversized.extend_from_slice(&(MAX_FRAME_BYTES as u32 + 1).to_le_bytes());
        write_uni(oversized).await;
        // A valid frame of another protocol version.
        let mut other_version = encode_frame(&deltas()).unwrap();
        other_version[0] = VERSION + 1;
        write_uni(other_version).await;
        // A header promising more than the stream holds.
        let mut truncated = encode_frame(&deltas()).unwrap();
        truncated.truncate(HEADER_BYTES + 3);
        write_uni(truncated).await;

        for kind in ["corrupted", "size", "version", "truncated"] {
            counters
                .reach(
                    "levee_frames_refused_total",
                    &[("kind", kind), ("peer", "c")],
                    1,
                )
                .await;
        }

        // The connection and the peer are still up: a valid frame arrives.
        write_uni(encode_frame(&deltas()).unwrap()).await;
        let got = next_data(&mut a_rx).await;
        assert_eq!((got.peer.as_str(), got.msg), ("c", deltas()));
        assert!(conn.close_reason().is_none());
        for kind in ["corrupted", "size", "version", "truncated"] {
            assert_eq!(
                counters.get("levee_frames_refused_total", &[("kind", kind)]),
                1,
                "{kind}"
            );
        }

        conn.close(0u32.into(), b"done");
        endpoint.wait_idle().await;
        a.shutdown().await;
    })
    .await
    .expect("test finished in time");
}

/// With live membership nodes holding different replica lists must talk during a change:
/// a peer with another digest is accepted both ways, and each side's `Hello`, with its
/// digest, reaches the other's application, which decides what a different list means.
#[tokio::test]
async fn a_peer_with_another_replica_list_is_accepted_and_its_digest_delivered() {
    let recorder = DebuggingRecorder::new();
    let mut counters = Counters::new(&recorder);
    let _local = metrics::set_default_local_recorder(&recorder);

    let dir = tempfile::tempdir().unwrap();
    pki(dir.path(), &["a", "b"]);
    timeout(TEST_BOUND, async {
        let (a, mut a_rx) = start("a", TlsFiles::in_dir(dir.path(), "a"), DIGEST, vec![]).await;
        let (b, mut b_rx) = start(
            "b",
            TlsFiles::in_dir(dir.path(), "b"),
            DIGEST + 1,
            vec![peer("a", &a)],
        )
        .await;

        b.send("a", &deltas());
        // The connection `b` dialled opens with `b`'s Hello, carrying `b`'s digest.
        let hello = a_rx.recv().await.unwrap();
        assert_eq!(
            (hello.peer.as_str(), hello.msg),
            (
                "b",
                Message::Hello(Hello {
                    node: "b".into(),
                    replica_digest: DIGEST + 1,
                    incarnation: 1,
                })
            )
        );
        let got = next_data(&mut a_rx).await;
        assert_eq!((got.peer.as_str(), got.msg), ("b", deltas()));
        // ... and `b` got `a`'s, with `a`'s digest.
        let hello = b_rx.recv().await.unwrap();
        assert_eq!(
            (hello.peer.as_str(), hello.msg),
            (
                "a",
                Message::Hello(Hello {
                    node: "a".into(),
                    replica_digest: DIGEST,
                    incarnation: 1,
                })
            )
        );

        // Requests are answered across the two lists too.
        let answerer = tokio::spawn(async move {
            let req = next_data(&mut a_rx).await;
            assert_eq!((req.peer.as_str(), &req.msg), ("b", &Message::PullRequest));
            req.reply
                .expect("a request carries a reply channel")
                .send(deltas())
                .unwrap();
            a_rx
        });
        assert_eq!(
            b.request("a", &Message::PullRequest, REQUEST_TIMEOUT)
                .await
                .unwrap(),
            deltas()
        );
        answerer.await.unwrap();
        assert_eq!(
            counters.get("levee_transport_hello_refused_total", &[]),
            0,
            "no Hello refused"
        );

        a.shutdown().await;
        b.shutdown().await;
    })
    .await
    .expect("test finished in time");
}

#[tokio::test]
async fn a_hello_naming_another_node_than_the_certificate_is_refused() {
    let recorder = DebuggingRecorder::new();
    let mut counters = Counters::new(&recorder);
    let _local = metrics::set_default_local_recorder(&recorder);

    let dir = tempfile::tempdir().unwrap();
    pki(dir.path(), &["a", "b", "c"]);
    timeout(TEST_BOUND, async {
        let (a, mut a_rx) = start("a", TlsFiles::in_dir(dir.path(), "a"), DIGEST, vec![]).await;

        // `c` holds a cluster certificate but claims to be `b`.
        let mut endpoint = quinn::Endpoint::client(localhost()).unwrap();
        endpoint.set_default_client_config(
            levee_transport::tls::client_config(&TlsFiles::in_dir(dir.path(), "c")).unwrap(),
        );
        let conn = endpoint
            .connect(a.local_addr(), "a")
            .unwrap()
            .await
            .unwrap();
        for msg in [
            Message::Hello(Hello {
                node: "b".into(),
                replica_digest: DIGEST,
                incarnation: 1,
            }),
            deltas(),
        ] {
            let mut stream = conn.open_uni().await.unwrap();
            stream
                .write_all(&encode_frame(&msg).unwrap())
                .await
                .unwrap();
            stream.finish().unwrap();
        }
        counters
            .reach(
                "levee_transport_hello_refused_total",
                &[("reason", "identity")],
                1,
            )
            .await;
        let closed = conn.closed().await;
        assert!(
            matches!(closed, quinn::ConnectionError::ApplicationClosed(_)),
            "{closed:?}"
        );
        assert_nothing_delivered(&mut a_rx).await;

        endpoint.wait_idle().await;
        a.shutdown().await;
    })
    .await
    .expect("test finished in time");
}

#[tokio::test]
async fn a_dead_peer_makes_sends_drop_and_requests_fail_without_blocking() {
    let recorder = DebuggingRecorder::new();
    let mut counters = Counters::new(&recorder);
    let _local = metrics::set_default_local_recorder(&recorder);

    let dir = tempfile::tempdir().unwrap();
    pki(dir.path(), &["a", "b"]);
    timeout(TEST_BOUND, async {
        let (b, _b_rx) = start("b", TlsFiles::in_dir(dir.path(), "b"), DIGEST, vec![]).await;
        let b_addr = peer("b", &b);
        b.shutdown().await;
        drop(b);
        let (a, _a_rx) = start("a", TlsFiles::in_dir(dir.path(), "a"), DIGEST, vec![b_addr]).await;

        for _ in 0..3 {
            a.send("b", &deltas());
        }
        counters
            .reach(
                "levee_transport_frames_dropped_total",
                &[("peer", "b"), ("reason", "unreachable")],
                3,
            )
            .await;
        let dialled = a.request("b", &Message::PullRequest, REQUEST_TIMEOUT).await;
        assert!(
            matches!(
                dialled,
                Err(TransportError::Unreachable { .. } | TransportError::Timeout { .. })
            ),
            "{dialled:?}"
        );
        assert!(matches!(
            a.request("nobody", &Message::PullRequest, REQUEST_TIMEOUT)
                .await,
            Err(TransportError::UnknownPeer(_))
        ));
        a.shutdown().await;
    })
    .await
    .expect("test finished in time");
}

#[tokio::test]
async fn frames_to_one_peer_arrive_whole_and_in_the_order_sent() {
    let dir = tempfile::tempdir().unwrap();
    pki(dir.path(), &["a", "b"]);
    timeout(TEST_BOUND, async {
        let (b, mut b_rx) = start("b", TlsFiles::in_dir(dir.path(), "b"), DIGEST, vec![]).await;
        let (a, _a_rx) = start(
            "a",
            TlsFiles::in_dir(dir.path(), "a"),
            DIGEST,
            vec![peer("b", &b)],
        )
        .await;
        // Large and small frames interleaved: on one stream each arrives whole, in order.
        let n = 200u64;
        for i in 0..n {
            let keys = if i % 10 == 0 { 2_000 } else { 1 };
            let keys = (0..keys)
                .map(|k| KeyEntry {
                    id: format!("api\0\u{ff}key-{i}-{k}").into_bytes(),
                    state: levee_core::KeyCrdt::default(),
                })
                .collect();
            a.send(
                "b",
                &Message::Deltas(DeltaBatch {
                    sent_at_ms: i,
                    ack_ms: 0,
                    prev_ms: 0,
                    keys,
                }),
            );
        }
        for i in 0..n {
            let got = next_data(&mut b_rx).await;
            let Message::Deltas(batch) = got.msg else {
                panic!("not deltas: {:?}", got.msg);
            };
            assert_eq!(batch.sent_at_ms, i, "frame {i} out of order");
        }
        a.shutdown().await;
        b.shutdown().await;
    })
    .await
    .expect("test finished in time");
}

/// Starts node `a` (certificates in `dir`) with peer `b` at `b_addr`, where nothing answers,
/// dialling with a 300 ms timeout and a minute of backoff; sends `b` a frame and waits for
/// the failed dial: `a`'s next dial is then due long after any test's bound.
async fn start_backing_off(
    dir: &Path,
    b_addr: SocketAddr,
    counters: &mut Counters,
) -> (Transport, tokio::sync::mpsc::Receiver<Inbound>) {
    let (a, a_rx) = Transport::start_with_dial_timing(
        config(
            "a",
            TlsFiles::in_dir(dir, "a"),
            DIGEST,
            vec![PeerAddr {
                id: "b".into(),
                addr: b_addr.into(),
            }],
        ),
        DialTiming {
            connect_timeout: Duration::from_millis(300),
            backoff_min: Duration::from_secs(60),
            backoff_max: Duration::from_secs(60),
        },
    )
    .await
    .unwrap();
    a.send("b", &deltas());
    counters
        .reach(
            "levee_transport_connect_failures_total",
            &[("peer", "b")],
            1,
        )
        .await;
    (a, a_rx)
}

#[tokio::test]
async fn a_link_backing_off_redials_as_soon_as_its_peer_connects_to_it() {
    let recorder = DebuggingRecorder::new();
    let mut counters = Counters::new(&recorder);
    let _local = metrics::set_default_local_recorder(&recorder);

    let dir = tempfile::tempdir().unwrap();
    pki(dir.path(), &["a", "b"]);
    timeout(TEST_BOUND, async {
        // `b`'s address is first a socket that reads nothing: `a`'s dial fails, and its next
        // dial is due only a minute later, long after this test's bound.
        let hole = std::net::UdpSocket::bind(localhost()).unwrap();
        let b_bind = hole.local_addr().unwrap();
        let (a, _a_rx) = start_backing_off(dir.path(), b_bind, &mut counters).await;

        // `b` comes up at that address and dials `a`: `a` hears it and dials back at once.
        drop(hole);
        let mut b_cfg = config(
            "b",
            TlsFiles::in_dir(dir.path(), "b"),
            DIGEST,
            vec![peer("a", &a)],
        );
        b_cfg.bind = b_bind;
        let (b, mut b_rx) = Transport::start(b_cfg).await.unwrap();
        b.send("a", &deltas());
        counters
            .reach(
                "levee_transport_connections_total",
                &[("peer", "b"), ("direction", "outbound")],
                1,
            )
            .await;
        a.send("b", &deltas());
        let got = next_data(&mut b_rx).await;
        assert_eq!(got.peer, "a");
        assert_eq!(got.msg, deltas());
        assert_eq!(
            counters.get("levee_transport_connect_failures_total", &[("peer", "b")]),
            1,
            "no dial failed after the peer was heard"
        );
        a.shutdown().await;
        b.shutdown().await;
    })
    .await
    .expect("test finished in time: the link redialled its peer once heard from it");
}

/// `set_peers` changes whom a node sends to: a peer added is dialled and reached, a peer
/// removed is unknown again (its frames dropped and counted, its requests refused).
#[tokio::test]
async fn set_peers_adds_and_removes_the_peers_a_node_sends_to() {
    let recorder = DebuggingRecorder::new();
    let mut counters = Counters::new(&recorder);
    let _local = metrics::set_default_local_recorder(&recorder);
    let unknown = [("peer", "unknown"), ("reason", "unknown_peer")];

    let dir = tempfile::tempdir().unwrap();
    pki(dir.path(), &["a", "b"]);
    timeout(TEST_BOUND, async {
        let (a, _a_rx) = start("a", TlsFiles::in_dir(dir.path(), "a"), DIGEST, vec![]).await;
        let (b, mut b_rx) = start(
            "b",
            TlsFiles::in_dir(dir.path(), "b"),
            DIGEST,
            vec![peer("a", &a)],
        )
        .await;

        // `b` is not one of `a`'s peers: the frame is dropped.
        a.send("b", &deltas());
        counters
            .reach("levee_transport_frames_dropped_total", &unknown, 1)
            .await;
        assert!(matches!(
            a.request("b", &Message::PullRequest, REQUEST_TIMEOUT).await,
            Err(TransportError::UnknownPeer(_))
        ));
        assert_nothing_delivered(&mut b_rx).await;

        // Now it is (`a` itself in the list is ignored).
        a.set_peers(vec![peer("b", &b), peer("a", &a)]);
        a.send("b", &deltas());
        let got = next_data(&mut b_rx).await;
        assert_eq!((got.peer.as_str(), got.msg), ("a", deltas()));

        // And no longer is.
        a.set_peers(vec![]);
        a.send("b", &deltas());
        counters
            .reach("levee_transport_frames_dropped_total", &unknown, 2)
            .await;
        assert!(matches!(
            a.request("b", &Message::PullRequest, REQUEST_TIMEOUT).await,
            Err(TransportError::UnknownPeer(_))
        ));
        // (`b`, having heard `a`, dialled it back: that connection's Hello may still come.)
        assert_no_data_delivered(&mut b_rx).await;
        assert_eq!(
            counters.get(
                "levee_transport_connections_total",
                &[("peer", "b"), ("direction", "outbound")]
            ),
            1,
            "`a` dialled `b` once, while `b` was its peer"
        );

        a.shutdown().await;
        b.shutdown().await;
    })
    .await
    .expect("test finished in time");
}

/// A peer given a new address by `set_peers` gets a new link, dialled at once: the old one,
/// backing off after failing at the old address, is dropped with its backoff.
#[tokio::test]
async fn set_peers_dials_a_moved_peer_at_its_new_address() {
    let recorder = DebuggingRecorder::new();
    let mut counters = Counters::new(&recorder);
    let _local = metrics::set_default_local_recorder(&recorder);

    let dir = tempfile::tempdir().unwrap();
    pki(dir.path(), &["a", "b"]);
    timeout(TEST_BOUND, async {
        // `b`'s first address is a socket that reads nothing: `a`'s dial fails, and its next
        // dial would be due only a minute later, long after this test's bound.
        let hole = std::net::UdpSocket::bind(localhost()).unwrap();
        let (a, _a_rx) =
            start_backing_off(dir.path(), hole.local_addr().unwrap(), &mut counters).await;

        // `b` is elsewhere, and does not dial `a` (it has no peers): only the new link can
        // reach it, and at once.
        let (b, mut b_rx) = start("b", TlsFiles::in_dir(dir.path(), "b"), DIGEST, vec![]).await;
        a.set_peers(vec![peer("b", &b)]);
        a.send("b", &deltas());
        let got = next_data(&mut b_rx).await;
        assert_eq!((got.peer.as_str(), got.msg), ("a", deltas()));
        assert_eq!(
            counters.get("levee_transport_connect_failures_total", &[("peer", "b")]),
            1
        );

        // The same list again changes nothing: the link and its connection stay.
        a.set_peers(vec![peer("b", &b)]);
        a.send("b", &deltas());
        let got = next_data(&mut b_rx).await;
        assert_eq!((got.peer.as_str(), got.msg), ("a", deltas()));
        assert_eq!(
            counters.get(
                "levee_transport_connections_total",
                &[("peer", "b"), ("direction", "outbound")]
            ),
            1
        );

        a.shutdown().await;
        b.shutdown().await;
        drop(hole);
    })
    .await
    .expect("test finished in time");
}

/// A node configured to send the previous protocol version (`cluster.wire_version = 2`, while
/// nodes of the previous build still run): its frames, requests and replies are version-2
/// frames, which this build's nodes decode as the messages they were; a message version 2
/// does not have is not sent at all (a version-2 node would refuse it) and is counted.
#[tokio::test]
async fn a_node_sending_the_previous_version_is_understood_and_sends_nothing_that_version_lacks() {
    let recorder = DebuggingRecorder::new();
    let mut counters = Counters::new(&recorder);
    let _local = metrics::set_default_local_recorder(&recorder);

    let dir = tempfile::tempdir().unwrap();
    pki(dir.path(), &["old", "new"]);
    timeout(TEST_BOUND, async {
        let (new, mut new_rx) =
            start("new", TlsFiles::in_dir(dir.path(), "new"), DIGEST, vec![]).await;
        let mut cfg = config(
            "old",
            TlsFiles::in_dir(dir.path(), "old"),
            DIGEST,
            vec![peer("new", &new)],
        );
        cfg.wire_version = levee_proto::OLDEST_VERSION;
        let (old, mut old_rx) = Transport::start(cfg).await.unwrap();

        // `Missed` first: not sent (version 2 has no such message); the Deltas after it
        // arrive as they were.
        old.send("new", &Message::Missed { since_ms: 7 });
        old.send("new", &deltas());
        let got = next_data(&mut new_rx).await;
        assert_eq!((got.peer.as_str(), &got.msg), ("old", &deltas()));
        assert_eq!(
            counters.get(
                "levee_transport_frames_dropped_total",
                &[("peer", "new"), ("reason", "version")]
            ),
            1
        );

        // A request from the new node is answered by the old one in version 2, and a request
        // of the old one answered by the new one in version 3.
        let answer = Message::ForwardReply {
            id: 9,
            decisions: vec![None],
        };
        let reply = answer.clone();
        let owner = tokio::spawn(async move {
            let req = next_data(&mut old_rx).await;
            assert!(matches!(req.msg, Message::PullRequest), "{req:?}");
            req.reply.unwrap().send(reply).unwrap();
            old_rx
        });
        let new_peers = vec![peer("old", &old)];
        new.set_peers(new_peers);
        assert_eq!(
            new.request("old", &Message::PullRequest, REQUEST_TIMEOUT)
                .await
                .unwrap(),
            answer
        );
        let _old_rx = owner.await.unwrap();
        let answering = tokio::spawn(async move {
            let req = next_data(&mut new_rx).await;
            assert!(matches!(req.msg, Message::PullRequest), "{req:?}");
            req.reply.unwrap().send(Message::PullDeferred).unwrap();
            new_rx
        });
        assert_eq!(
            old.request("new", &Message::PullRequest, REQUEST_TIMEOUT)
                .await
                .unwrap(),
            Message::PullDeferred
        );
        answering.await.unwrap();
        // Nothing was refused on either side.
        assert_eq!(counters.get("levee_frames_refused_total", &[]), 0);
        old.shutdown().await;
        new.shutdown().await;
    })
    .await
    .expect("test finished in time");
}

/// A peer killed (no `CONNECTION_CLOSE`: its runtime is dropped, as a `kill -9` drops its
/// process) and started again on the same address, as a new process (another incarnation),
/// dials this node. This node's connection to the dead process still looks alive — nothing
/// closes it before QUIC's idle timeout (3 s; the new process cannot reset it, its reset key
/// is new) — so what the link writes on it is lost, the restarted peer's pull's answer
/// included. The new process's `Hello` says another incarnation: the link closes the old
/// connection and dials the new process at once, and the next frame arrives. Before, it
/// arrived only after the idle timeout: a node killed and restarted on loopback (tests/
/// membership.rs) heard its peers about a second late and synced from its disk alone.
#[test]
fn a_link_to_a_peer_that_restarted_dials_its_new_process_at_once() {
    let runtime = || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap()
    };
    let dir = tempfile::tempdir().unwrap();
    pki(dir.path(), &["a", "b"]);
    let b_addr = std::net::UdpSocket::bind(localhost())
        .unwrap()
        .local_addr()
        .unwrap();
    let rt_a = runtime();
    let (a, mut a_rx) = rt_a.block_on(start(
        "a",
        TlsFiles::in_dir(dir.path(), "a"),
        DIGEST,
        vec![PeerAddr {
            id: "b".into(),
            addr: b_addr.into(),
        }],
    ));
    let start_b = |rt: &tokio::runtime::Runtime, incarnation: u64| {
        let mut cfg = config(
            "b",
            TlsFiles::in_dir(dir.path(), "b"),
            DIGEST,
            vec![peer("a", &a)],
        );
        cfg.bind = b_addr;
        cfg.hello.incarnation = incarnation;
        rt.block_on(Transport::start(cfg)).unwrap()
    };
    // b's first process hears a.
    let rt_b1 = runtime();
    let (b1, mut b1_rx) = start_b(&rt_b1, 1);
    rt_a.block_on(async { a.send("b", &deltas()) });
    let got = rt_b1
        .block_on(async { timeout(TEST_BOUND, next_data(&mut b1_rx)).await })
        .expect("b's first process hears a");
    assert_eq!(got.peer, "a");
    // Killed: its tasks stop, nothing is sent (its handles are dropped after, with no task
    // left to send what dropping them would).
    rt_b1.shutdown_timeout(Duration::from_secs(1));
    {
        let rt = runtime();
        let _in = rt.enter();
        drop((b1, b1_rx));
    }
    // Its second process speaks to a first.
    let rt_b2 = runtime();
    let (b2, mut b2_rx) = start_b(&rt_b2, 2);
    rt_b2.block_on(async { b2.send("a", &deltas()) });
    rt_a.block_on(async {
        timeout(TEST_BOUND, async {
            loop {
                let inbound = a_rx.recv().await.expect("inbound channel open");
                if matches!(&inbound.msg, Message::Hello(h) if h.incarnation == 2) {
                    return;
                }
            }
        })
        .await
        .expect("a hears b's second process")
    });
    rt_a.block_on(async { a.send("b", &deltas()) });
    let got = rt_b2
        .block_on(async { timeout(Duration::from_millis(1_500), next_data(&mut b2_rx)).await });
    let got =
        got.expect("a's frame reached b's new process before the old connection's idle timeout");
    assert_eq!(got.peer, "a");
    assert_eq!(got.msg, deltas());
    rt_a.block_on(a.shutdown());
    rt_b2.block_on(b2.shutdown());
}
