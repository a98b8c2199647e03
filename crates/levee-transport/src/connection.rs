//! One authenticated QUIC connection: the `Hello` exchange, then every stream the peer opens.
//!
//! Both sides send their `Hello` on the first unidirectional stream they open. A connection
//! is used only after the peer's `Hello` has been checked: a node id the peer has proven —
//! the name this node dialled (verified by TLS against the peer's certificate) or, for an
//! incoming connection, a name in the client certificate the server verified. Bidirectional
//! streams are not accepted before that, and unidirectional streams are accepted in the order
//! the peer opened them, so nothing from an unchecked peer is delivered.
//!
//! The peer's `replica_digest` is not checked: while the membership changes, nodes holding
//! different replica lists must still talk. The digest reaches the application in the
//! `Message::Hello` delivered first on every connection, and the application decides what a
//! different list means.

use std::sync::Arc;
use std::time::Duration;

use levee_proto::{Hello, Message};
use quinn::{Connection, RecvStream, SendStream, VarInt};
use rustls::pki_types::CertificateDer;
use tokio::sync::{Semaphore, oneshot};
use tracing::{debug, info, warn};

use crate::frame_io::{
    FrameError, PAYLOAD_BUDGET_BYTES, STREAM_NO_REPLY, STREAM_REFUSED, read_frame, write_frame,
};
use crate::metrics::{self, PeerMeter};
use crate::peer_transport::Inbound;
use crate::shared::Shared;

/// Application error code closing a connection when the endpoint shuts down.
pub(crate) const CLOSE_SHUTDOWN: VarInt = VarInt::from_u32(0);
// Application error code 1 closed a connection whose peer ran another replica list; it is no
// longer sent (the digest is not checked) and stays reserved, never reused.
/// Application error code closing a connection whose peer claims a node id it has not proven.
pub(crate) const CLOSE_IDENTITY: VarInt = VarInt::from_u32(2);
/// Application error code closing a connection whose peer did not open with a valid `Hello`.
pub(crate) const CLOSE_PROTOCOL: VarInt = VarInt::from_u32(3);

/// How long a peer has to send its `Hello` once the TLS handshake is done.
const HELLO_TIMEOUT: Duration = Duration::from_secs(3);

/// An established connection and the payload budget of the frames read on it.
#[derive(Clone)]
pub(crate) struct PeerConn {
    pub(crate) conn: Connection,
    pub(crate) budget: Arc<Semaphore>,
    /// The incarnation the peer's `Hello` said on this connection: its process.
    pub(crate) incarnation: u64,
}

/// Who the peer must prove to be.
enum Expect<'a> {
    /// The node id this node dialled; TLS has verified the server's certificate names it.
    Dialled(&'a str),
    /// Any node id named by the client certificate the server verified.
    Certified,
}

/// Dials `peer` at `addr`, exchanges `Hello`s and starts serving the connection's streams.
pub(crate) async fn connect(
    shared: &Arc<Shared>,
    peer: &str,
    addr: std::net::SocketAddr,
) -> Result<PeerConn, String> {
    let connecting = shared
        .endpoint
        .connect(addr, peer)
        .map_err(|e| format!("cannot dial {addr}: {e}"))?;
    let conn = connecting
        .await
        .map_err(|e| format!("TLS handshake with {addr} failed: {e}"))?;
    let budget = Arc::new(Semaphore::new(PAYLOAD_BUDGET_BYTES));
    let hello = handshake(shared, &conn, Expect::Dialled(peer), &budget).await?;
    metrics::connection_established(&hello.node, "outbound");
    debug!(peer, %addr, "connected");
    let incarnation = hello.incarnation;
    tokio::spawn(serve(shared.clone(), conn.clone(), hello, budget.clone()));
    Ok(PeerConn {
        conn,
        budget,
        incarnation,
    })
}

/// Completes an incoming connection: TLS (the client certificate is verified by the server
/// configuration), then `Hello`s, then serves its streams until it closes.
pub(crate) async fn accept(shared: Arc<Shared>, incoming: quinn::Incoming) {
    let remote = incoming.remote_address();
    let conn = match incoming.await {
        Ok(conn) => conn,
        // The dialler gave up its dial (timed out, or replaced it with a fresh one when it
        // heard from this node): not a refusal.
        Err(quinn::ConnectionError::ConnectionClosed(close))
            if close.error_code == quinn::TransportErrorCode::APPLICATION_ERROR =>
        {
            debug!(%remote, "the dialler abandoned its connection during the handshake");
            return;
        }
        Err(e) => {
            metrics::handshake_refused();
            warn!(%remote, error = %e, "refused a connection: TLS handshake failed");
            return;
        }
    };
    let budget = Arc::new(Semaphore::new(PAYLOAD_BUDGET_BYTES));
    match handshake(&shared, &conn, Expect::Certified, &budget).await {
        Ok(hello) => {
            metrics::connection_established(&hello.node, "inbound");
            debug!(peer = %hello.node, %remote, "accepted a connection");
            shared.heard_hello(&hello.node, hello.incarnation, conn.rtt());
            serve(shared, conn, hello, budget).await;
        }
        Err(reason) => debug!(%remote, %reason, "incoming connection failed before its Hello"),
    }
}

/// Sends this node's `Hello`, reads and checks the peer's. On a refusal the connection is
/// closed with an application error code and the refusal counted.
async fn handshake(
    shared: &Shared,
    conn: &Connection,
    expect: Expect<'_>,
    budget: &Semaphore,
) -> Result<Hello, String> {
    let send_ours = async {
        let mut stream = conn.open_uni().await.map_err(|e| e.to_string())?;
        write_frame(&mut stream, &shared.hello_frame).await
    };
    let read_theirs = async {
        let mut stream = conn
            .accept_uni()
            .await
            .map_err(|e| Refusal::Lost(e.to_string()))?;
        match read_frame(&mut stream, budget).await {
            Ok(Some((Message::Hello(hello), _))) => Ok(hello),
            Ok(Some(_)) => Err(Refusal::protocol("the first message is not a Hello".into())),
            Ok(None) => Err(Refusal::protocol("the Hello stream is empty".into())),
            Err(FrameError::Stream(e)) => Err(Refusal::Lost(e)),
            Err(e) => {
                if let Some(kind) = e.kind() {
                    metrics::frame_refused(metrics::UNKNOWN_PEER, kind);
                }
                Err(Refusal::protocol(format!("Hello frame refused: {e}")))
            }
        }
    };
    let outcome = tokio::time::timeout(HELLO_TIMEOUT, async {
        let (sent, read) = tokio::join!(send_ours, read_theirs);
        let hello = read?;
        sent.map_err(Refusal::Lost)?;
        check_hello(shared, conn, &expect, &hello)?;
        Ok(hello)
    })
    .await
    .unwrap_or_else(|_| {
        Err(Refusal::protocol(format!(
            "no Hello within {HELLO_TIMEOUT:?}"
        )))
    });

    outcome.map_err(|refusal| match refusal {
        Refusal::Lost(e) => format!("connection lost during the Hello exchange: {e}"),
        Refusal::Refused {
            label,
            code,
            reason,
        } => {
            metrics::hello_refused(label);
            warn!(remote = %conn.remote_address(), %reason, "closing a connection: Hello refused");
            conn.close(code, reason.as_bytes());
            format!("Hello refused: {reason}")
        }
    })
}

enum Refusal {
    Lost(String),
    Refused {
        label: &'static str,
        code: VarInt,
        reason: String,
    },
}

impl Refusal {
    fn protocol(reason: String) -> Refusal {
        Refusal::Refused {
            label: "protocol",
            code: CLOSE_PROTOCOL,
            reason,
        }
    }
}

fn check_hello(
    shared: &Shared,
    conn: &Connection,
    expect: &Expect<'_>,
    hello: &Hello,
) -> Result<(), Refusal> {
    if hello.replica_digest != shared.hello.replica_digest {
        // Not a refusal: the application sees the digest in the peer's Hello.
        debug!(
            peer = %hello.node,
            theirs = format_args!("{:#018x}", hello.replica_digest),
            ours = format_args!("{:#018x}", shared.hello.replica_digest),
            "the peer runs another replica list"
        );
    }
    let identity = |reason: String| Refusal::Refused {
        label: "identity",
        code: CLOSE_IDENTITY,
        reason,
    };
    match expect {
        Expect::Dialled(peer) if hello.node != *peer => Err(identity(format!(
            "dialled {peer:?} but its Hello says {:?}",
            hello.node
        ))),
        Expect::Dialled(_) => Ok(()),
        Expect::Certified => {
            let certs = conn
                .peer_identity()
                .and_then(|id| id.downcast::<Vec<CertificateDer<'static>>>().ok())
                .ok_or_else(|| identity("no client certificate".into()))?;
            let leaf = certs
                .first()
                .ok_or_else(|| identity("empty client certificate chain".into()))?;
            crate::tls::certificate_names(leaf, &hello.node).map_err(|e| {
                identity(format!(
                    "Hello says {:?} but the client certificate does not: {e}",
                    hello.node
                ))
            })
        }
    }
}

/// Delivers the peer's `Hello`, then serves every stream the peer opens until the connection
/// closes.
async fn serve(shared: Arc<Shared>, conn: Connection, hello: Hello, budget: Arc<Semaphore>) {
    let peer: Arc<str> = hello.node.clone().into();
    let meter = Arc::new(PeerMeter::new(&peer));
    if !shared
        .deliver(Inbound {
            peer: peer.to_string(),
            msg: Message::Hello(hello),
            reply: None,
        })
        .await
    {
        return;
    }
    let reason = loop {
        tokio::select! {
            stream = conn.accept_uni() => match stream {
                Ok(recv) => {
                    tokio::spawn(serve_uni(shared.clone(), peer.clone(), meter.clone(), conn.clone(), recv, budget.clone()));
                }
                Err(e) => break e,
            },
            stream = conn.accept_bi() => match stream {
                Ok((send, recv)) => {
                    tokio::spawn(serve_bi(shared.clone(), peer.clone(), meter.clone(), conn.clone(), send, recv, budget.clone()));
                }
                Err(e) => break e,
            },
        }
    };
    info!(peer = %peer, %reason, "connection closed");
}

/// Frames on a unidirectional stream: each delivered with no reply, until the stream ends or
/// a frame is refused.
async fn serve_uni(
    shared: Arc<Shared>,
    peer: Arc<str>,
    meter: Arc<PeerMeter>,
    conn: Connection,
    mut recv: RecvStream,
    budget: Arc<Semaphore>,
) {
    loop {
        match read_frame(&mut recv, &budget).await {
            Ok(Some((msg, bytes))) => {
                meter.received(bytes);
                shared.heard(&peer, conn.rtt());
                if matches!(msg, Message::Hello(_)) {
                    debug!(peer = %peer, "ignored a Hello after the handshake");
                    continue;
                }
                if !shared
                    .deliver(Inbound {
                        peer: peer.to_string(),
                        msg,
                        reply: None,
                    })
                    .await
                {
                    return;
                }
            }
            Ok(None) => return,
            Err(e) => {
                refuse(&peer, &e, &mut recv);
                return;
            }
        }
    }
}

/// A request on a bidirectional stream: one frame in, delivered with a reply channel; what
/// the application sends on it goes back as one frame. If the application drops the channel,
/// the stream is reset so the requester fails at once instead of waiting for its timeout.
async fn serve_bi(
    shared: Arc<Shared>,
    peer: Arc<str>,
    meter: Arc<PeerMeter>,
    conn: Connection,
    mut send: SendStream,
    mut recv: RecvStream,
    budget: Arc<Semaphore>,
) {
    let msg = match read_frame(&mut recv, &budget).await {
        Ok(Some((msg, bytes))) => {
            meter.received(bytes);
            shared.heard(&peer, conn.rtt());
            msg
        }
        Ok(None) => {
            debug!(peer = %peer, "empty request stream");
            let _ = send.reset(STREAM_REFUSED);
            return;
        }
        Err(e) => {
            refuse(&peer, &e, &mut recv);
            let _ = send.reset(STREAM_REFUSED);
            return;
        }
    };
    if matches!(msg, Message::Hello(_)) {
        debug!(peer = %peer, "ignored a Hello after the handshake");
        let _ = send.reset(STREAM_NO_REPLY);
        return;
    }
    let (tx, rx) = oneshot::channel();
    if !shared
        .deliver(Inbound {
            peer: peer.to_string(),
            msg,
            reply: Some(tx),
        })
        .await
    {
        let _ = send.reset(STREAM_NO_REPLY);
        return;
    }
    let requester_gone = send.stopped();
    let reply = tokio::select! {
        reply = rx => reply,
        _ = requester_gone => return,
    };
    let Ok(reply) = reply else {
        let _ = send.reset(STREAM_NO_REPLY);
        return;
    };
    match shared.encode(&reply) {
        Ok(Some(frame)) => match write_frame(&mut send, &frame).await {
            Ok(()) => meter.sent(frame.len()),
            Err(e) => debug!(peer = %peer, error = %e, "could not write a reply"),
        },
        Ok(None) => {
            metrics::frame_dropped(&peer, "version");
            let _ = send.reset(STREAM_NO_REPLY);
        }
        Err(e) => {
            metrics::frame_dropped(&peer, "encode");
            warn!(peer = %peer, error = %e, "cannot encode a reply");
            let _ = send.reset(STREAM_NO_REPLY);
        }
    }
}

/// Counts and logs a refused frame and stops its stream; the connection stays up.
pub(crate) fn refuse(peer: &str, e: &FrameError, recv: &mut RecvStream) {
    match e.kind() {
        Some(kind) => {
            metrics::frame_refused(peer, kind);
            warn!(peer, kind, error = %e, "refused a frame");
            let _ = recv.stop(STREAM_REFUSED);
        }
        None => debug!(peer, error = %e, "stream failed"),
    }
}
