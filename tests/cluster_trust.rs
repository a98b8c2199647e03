//! What a cluster node accepts from the network: a node holding a certificate from another CA
//! cannot join, and malformed, oversized, wrong-version and truncated frames from an
//! authenticated peer are refused, counted, and leave the node up. Real `levee serve` processes
//! on loopback (the harness is `tests/harness/`).

#[allow(
    dead_code,
    reason = "shared by the cluster tests, each of which uses part of it"
)]
mod harness;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use levee_blackbox::cluster::reachable_of;
use levee_blackbox::{metric, wait_until};

use harness::*;

/// A node holding a certificate from another CA, posing as `eu-2` on `eu-2`'s addresses with
/// `eu-2`'s cluster configuration: it cannot join, and nothing it counts reaches the cluster.
#[test]
fn a_node_with_a_certificate_from_another_ca_cannot_join_and_changes_nothing() {
    avoid_window_edge(DAY_MS, 60_000);
    let mut c = LocalClusterHandle::start();
    let rule = "durable";
    let eu2 = c.idx("eu-2");
    // A key that the real eu-2 owns, so that its own counter entry is in the cluster's state.
    let key = (0..1_000)
        .map(|i| format!("impostor-{i}"))
        .find(|k| c.usage(eu2, rule, k)["owner"] == "eu-2")
        .expect("some key is owned by eu-2");
    c.admit(eu2, rule, &key, 40);
    let all: Vec<usize> = (0..c.len()).collect();
    let real = c.wait_agreement(&all, rule, &key, Duration::from_secs(3), |v| v.used == 40);

    // The real eu-2 goes away; the others notice.
    c.stop(eu2);
    let others: Vec<usize> = all.iter().copied().filter(|&n| n != eu2).collect();
    assert!(
        wait_until(Duration::from_secs(5), || others.iter().all(
            |&n| reachable_of(&c.status(n)["peers"], "eu-2") == Some(false)
        )),
        "the others did not notice eu-2 stopped"
    );

    // The impostor: a CA of its own, a certificate for eu-2 from it, and otherwise eu-2's
    // configuration (same addresses, same peers), with a data directory of its own.
    let rogue_path = c.write_impostor(eu2);

    let refused = |c: &LocalClusterHandle| -> f64 {
        others
            .iter()
            .map(|&n| {
                metric(
                    &c.metrics(n),
                    "levee_transport_handshakes_refused_total",
                    &[],
                )
                .unwrap_or(0.0)
            })
            .sum()
    };
    let refused_before = refused(&c);
    c.spawn(eu2, &rogue_path);
    // Alone, it becomes ready once it has waited `suspect_after` for peers that never answer.
    if let Err(e) = c.wait_ready(eu2, Instant::now() + Duration::from_secs(10)) {
        panic!("the impostor did not start: {e}");
    }

    // The impostor counts the key on its own (as eu-2, the key's owner in eu) while the real
    // nodes are watched: they never see eu-2 reachable, and their usage of the key never moves.
    let mut rogue_admitted = 0;
    let watch_until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < watch_until {
        for _ in 0..20 {
            if c.check(eu2, rule, &key).allowed() {
                rogue_admitted += 1;
            }
        }
        for &n in &others {
            let s = c.status(n);
            assert_eq!(
                reachable_of(&s["peers"], "eu-2"),
                Some(false),
                "{} sees the impostor as a reachable eu-2: {s}",
                c.id(n)
            );
            let u = c.view(n, rule, &key);
            assert_eq!(u, real, "{} changed the key's usage", c.id(n));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let rogue_used = c.used(eu2, rule, &key);
    let rogue_status = c.status(eu2);
    let refused_after = refused(&c);
    eprintln!(
        "impostor eu-2: admitted {rogue_admitted}, its own usage {rogue_used}; the real nodes \
         refused {} TLS handshakes meanwhile and kept usage {}; impostor's peers: {}",
        refused_after - refused_before,
        real.used,
        rogue_status["peers"]
    );
    assert!(
        rogue_admitted > 0 && rogue_used >= rogue_admitted,
        "the impostor counted something that would have changed the cluster had it got in"
    );
    assert!(
        refused_after > refused_before,
        "the real nodes refused the impostor's handshakes (counted)"
    );
    assert!(
        !rogue_status["peers"]
            .as_array()
            .expect("peers")
            .iter()
            .any(|p| p["reachable"] == true),
        "the impostor reached no peer: {rogue_status}"
    );

    // The real eu-2 comes back: the cluster never saw the impostor's counts.
    c.stop(eu2);
    c.restart(eu2);
    c.wait_agreement(&all, rule, &key, Duration::from_secs(3), |v| *v == real);
}

/// Frames a node must refuse, each on its own unidirectional stream after a proper `Hello`.
fn bad_frames() -> Vec<(&'static str, Vec<u8>)> {
    use levee_proto::{HEADER_BYTES, MAX_FRAME_BYTES, Message, VERSION, encode_frame};
    let valid = encode_frame(&Message::PullRequest).expect("encode a frame");
    let mut wrong_version = valid.clone();
    wrong_version[0] = VERSION + 1;
    let mut oversized = vec![VERSION];
    oversized.extend_from_slice(&(MAX_FRAME_BYTES as u32 + 1).to_le_bytes());
    oversized.extend(std::iter::repeat_n(0u8, 64 << 10));
    let mut garbage = vec![VERSION];
    garbage.extend_from_slice(&16u32.to_le_bytes());
    garbage.extend([0xff; 16]);
    let mut left_over = valid.clone();
    left_over.push(0);
    let len = (left_over.len() - HEADER_BYTES) as u32;
    left_over[1..HEADER_BYTES].copy_from_slice(&len.to_le_bytes());
    let mut truncated = vec![VERSION];
    truncated.extend_from_slice(&64u32.to_le_bytes());
    truncated.extend([0u8; 8]);
    vec![
        ("version", wrong_version),
        ("size", oversized),
        ("corrupted", garbage),
        ("corrupted", left_over),
        ("truncated", truncated),
    ]
}

/// Writes `bytes` on a new unidirectional stream and finishes it; the peer may stop the stream
/// before it has read everything (that is what refusing a frame does), so write errors are
/// expected. Returns how the peer ended the stream: `Some(code)` if it stopped it.
async fn send_uni(conn: &quinn::Connection, bytes: &[u8]) -> Result<Option<u64>, String> {
    let mut send = conn.open_uni().await.map_err(|e| e.to_string())?;
    let _ = send.write_all(bytes).await;
    let _ = send.finish();
    match tokio::time::timeout(Duration::from_secs(5), send.stopped()).await {
        Ok(Ok(code)) => Ok(code.map(|c| c.into_inner())),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("the stream was neither acknowledged nor stopped within 5 s".into()),
    }
}

/// A malformed, an oversized, a wrong-version and a truncated frame from an authenticated
/// peer: each is refused and counted, the connection and the node stay up, and the node keeps
/// gossiping with its peers. A connection whose first frame is garbage is closed.
#[test]
fn malformed_oversized_and_wrong_version_frames_are_refused_counted_and_the_node_stays_up() {
    use levee_proto::{Hello, Message, encode_frame};
    use levee_transport::TlsFiles;

    let c = LocalClusterHandle::start();
    let target = c.idx("eu-1");
    let target_id = c.id(target).to_owned();
    let addr: SocketAddr = c.node(target).gossip;
    // A certificate of the cluster's CA for a prober that is no node of the replica list: the
    // transport authenticates it, and nothing it sends can be mistaken for a real peer's.
    let certs = c.dir().join("certs");
    let prober = c.dir().join("prober");
    std::fs::create_dir_all(&prober).expect("the prober's directory");
    levee_transport::certs::issue(&certs, "prober", &prober).expect("issue the prober's cert");
    let files = TlsFiles {
        ca: certs.join(levee_transport::certs::CA_CERT_FILE),
        cert: prober.join("prober.pem"),
        key: prober.join("prober.key"),
    };
    let digest = levee_node::Config::load(&c.node(target).config)
        .expect("the node's configuration")
        .replicas
        .digest();
    let hello = encode_frame(&Message::Hello(Hello {
        node: "prober".into(),
        replica_digest: digest,
        incarnation: now_ms(),
    }))
    .expect("encode the Hello");

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let client_config =
        levee_transport::tls::client_config(&files).expect("the prober's TLS configuration");
    let endpoint = rt
        .block_on(async { quinn::Endpoint::client(SocketAddr::from(([127, 0, 0, 1], 0))) })
        .expect("a QUIC client endpoint");

    // Connect and say Hello; the node answers with its own.
    let conn = rt.block_on(async {
        let conn = endpoint
            .connect_with(client_config.clone(), addr, &target_id)
            .expect("dial the node")
            .await
            .expect("the TLS handshake with a cluster certificate succeeds");
        send_uni(&conn, &hello).await.expect("send the Hello");
        let mut theirs = tokio::time::timeout(Duration::from_secs(5), conn.accept_uni())
            .await
            .expect("the node's Hello in time")
            .expect("the node's Hello stream");
        let bytes = theirs
            .read_to_end(1 << 16)
            .await
            .expect("read the node's Hello");
        match levee_proto::decode_frame(&bytes).expect("the node's Hello decodes") {
            Message::Hello(h) => assert_eq!(h.node, target_id),
            other => panic!("the node opened with {other:?}"),
        }
        conn
    });
    assert!(
        wait_until(Duration::from_secs(5), || metric(
            &c.metrics(target),
            "levee_transport_connections_total",
            &[("peer", "prober"), ("direction", "inbound")]
        )
        .is_some_and(|v| v >= 1.0)),
        "the node accepted the prober's Hello"
    );

    // The bad frames, one stream each; then a valid frame on the same connection.
    let stops: Vec<(&str, Result<Option<u64>, String>)> = rt.block_on(async {
        let mut out = Vec::new();
        for (kind, frame) in bad_frames() {
            out.push((kind, send_uni(&conn, &frame).await));
        }
        out
    });
    let after = rt.block_on(send_uni(&conn, &hello));
    eprintln!(
        "bad frames, how the node ended each stream: {stops:?}; a Hello after them: {after:?}"
    );
    assert!(
        conn.close_reason().is_none(),
        "the node kept the connection: {:?}",
        conn.close_reason()
    );
    let refused = |kind: &str| {
        metric(
            &c.metrics(target),
            "levee_frames_refused_total",
            &[("kind", kind), ("peer", "prober")],
        )
        .unwrap_or(0.0)
    };
    let counted = wait_until(Duration::from_secs(5), || {
        refused("version") >= 1.0
            && refused("size") >= 1.0
            && refused("corrupted") >= 2.0
            && refused("truncated") >= 1.0
    });
    let text = c.metrics(target);
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("levee_frames_refused_total") || l.contains("prober"))
        .collect();
    eprintln!("{}", lines.join("\n"));
    assert!(
        counted,
        "every refused frame is counted by kind: version {}, size {}, corrupted {}, truncated {}",
        refused("version"),
        refused("size"),
        refused("corrupted"),
        refused("truncated")
    );
    // The valid frame sent after the refused ones was read: the connection still works.
    assert!(
        wait_until(Duration::from_secs(5), || metric(
            &c.metrics(target),
            "levee_transport_frames_received_total",
            &[("peer", "prober")]
        )
        .is_some_and(|v| v >= 1.0)),
        "the node still reads the prober's connection after refusing its frames"
    );

    // A connection whose first frame is garbage instead of a Hello is closed, and counted.
    let hello_refused = |c: &LocalClusterHandle| {
        metric(
            &c.metrics(target),
            "levee_transport_hello_refused_total",
            &[("reason", "protocol")],
        )
        .unwrap_or(0.0)
    };
    let hello_refused_before = hello_refused(&c);
    let closed = rt.block_on(async {
        let conn = endpoint
            .connect_with(client_config.clone(), addr, &target_id)
            .expect("dial the node")
            .await
            .expect("the TLS handshake with a cluster certificate succeeds");
        let _ = send_uni(&conn, &bad_frames()[2].1).await;
        tokio::time::timeout(Duration::from_secs(5), conn.closed()).await
    });
    match closed {
        Ok(quinn::ConnectionError::ApplicationClosed(close)) => assert_eq!(
            close.error_code.into_inner(),
            3,
            "closed as `no valid Hello`: {close:?}"
        ),
        other => panic!("a connection opening with garbage is closed by the node: {other:?}"),
    }
    assert!(
        wait_until(Duration::from_secs(5), || hello_refused(&c)
            > hello_refused_before),
        "the refused Hello is counted"
    );

    // The node still answers, still decides, and still gossips with every peer.
    assert_eq!(c.get(target, "/healthz").status, 200);
    c.admit(target, "durable", "after-bad-frames", 7);
    let all: Vec<usize> = (0..c.len()).collect();
    c.wait_agreement(
        &all,
        "durable",
        "after-bad-frames",
        Duration::from_secs(3),
        |v| v.used == 7,
    );
    for _ in 0..5 {
        c.wait_fully_connected(Duration::from_secs(2));
        std::thread::sleep(Duration::from_millis(200));
    }

    rt.block_on(async {
        conn.close(0u32.into(), b"done");
        let _ = tokio::time::timeout(Duration::from_secs(2), endpoint.wait_idle()).await;
    });
}
