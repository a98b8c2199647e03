//! The public face of the transport: [`Transport`], its configuration and what it delivers.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use levee_proto::{DecodeError, EncodeError, Hello, Message, encode_frame};
use tokio::sync::{mpsc, oneshot, watch};
use tracing::{debug, warn};

use crate::connection::{self, CLOSE_SHUTDOWN};
use crate::link::PeerLink;
use crate::metrics;
use crate::tls::{self, TlsError, TlsFiles};

/// Messages received but not yet taken from the [`Inbound`] channel; beyond this, readers
/// wait (and QUIC flow control slows the peers down).
const INBOUND_QUEUE: usize = 256;
/// How long [`Transport::shutdown`] waits for connections to finish closing.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);

/// Where this node reaches a peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerAddr {
    /// The peer's node id: the DNS name its certificate must carry.
    pub id: String,
    /// The address to dial (the peer itself, or a proxy in front of it).
    pub addr: SocketAddr,
}

/// Everything [`Transport::start`] needs.
#[derive(Debug, Clone)]
pub struct TransportConfig {
    /// The UDP address to listen on (port 0 picks a free one; see [`Transport::local_addr`]).
    pub bind: SocketAddr,
    /// This node's id; its certificate must name it, and `hello.node` must equal it.
    pub node_id: String,
    /// This node's TLS material.
    pub tls: TlsFiles,
    /// The peers this node sends to. Incoming connections are accepted from any holder of a
    /// cluster certificate, listed here or not.
    pub peers: Vec<PeerAddr>,
    /// What this node says first on every connection.
    pub hello: Hello,
}

/// How a link dials its peer: how long a dial may take, and how long it waits after failed
/// dials before the next (from `backoff_min`, doubling with every further failure, up to
/// `backoff_max`). A peer that is heard again (its inbound connection completes its `Hello`,
/// or one of its frames arrives) ends the wait, and replaces a dial that has not got through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DialTiming {
    /// A dial (QUIC and TLS handshake, then `Hello`s: about three round trips) that takes
    /// longer than this has failed.
    pub connect_timeout: Duration,
    /// The wait after the first failed dial.
    pub backoff_min: Duration,
    /// The longest wait between two dials of an unreachable peer.
    pub backoff_max: Duration,
}

impl Default for DialTiming {
    /// What [`Transport::start`] uses: dials of 2 s at most (a dial stuck in a partition
    /// holds the link until it fails or the peer is heard), backoff from 100 ms up to 500 ms
    /// (a peer cut off for long is still dialled about twice a second; a dial costs one QUIC
    /// Initial packet while the peer is unreachable).
    fn default() -> DialTiming {
        DialTiming {
            connect_timeout: Duration::from_secs(2),
            backoff_min: Duration::from_millis(100),
            backoff_max: Duration::from_millis(500),
        }
    }
}

impl DialTiming {
    /// The wait before the next dial after `failures` consecutive failed dials.
    pub(crate) fn backoff(&self, failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1).min(16);
        self.backoff_min
            .saturating_mul(1 << doublings)
            .min(self.backoff_max)
    }
}

/// A message from a peer.
#[derive(Debug)]
pub struct Inbound {
    /// The sender's node id, as proven by its certificate (or by the name this node dialled).
    pub peer: String,
    /// The message.
    pub msg: Message,
    /// For a request: send the answer here (it goes back as one frame). Dropping it resets
    /// the request stream, so the requester fails at once.
    pub reply: Option<oneshot::Sender<Message>>,
}

/// Why a transport operation failed.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// The TLS material is missing or unusable.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// The UDP socket could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The error.
        source: std::io::Error,
    },
    /// The configuration is inconsistent.
    #[error("invalid transport configuration: {0}")]
    Config(String),
    /// The peer is not in [`TransportConfig::peers`].
    #[error("unknown peer {0:?}")]
    UnknownPeer(String),
    /// No connection to the peer (dial failed, or backing off after a failed dial).
    #[error("peer {peer:?} unreachable: {reason}")]
    Unreachable {
        /// The peer.
        peer: String,
        /// The last dial error.
        reason: String,
    },
    /// The request got no answer in time.
    #[error("no reply from {peer:?} within {after:?}")]
    Timeout {
        /// The peer.
        peer: String,
        /// The timeout.
        after: Duration,
    },
    /// The message is too large to send as one frame.
    #[error(transparent)]
    Encode(#[from] EncodeError),
    /// The peer answered with a frame this node refuses.
    #[error("reply from {peer:?} refused: {source}")]
    Refused {
        /// The peer.
        peer: String,
        /// Why.
        source: DecodeError,
    },
    /// The stream failed (reset by the peer — for instance because its application gave no
    /// answer — or the connection was lost).
    #[error("stream to {peer:?} failed: {reason}")]
    Stream {
        /// The peer.
        peer: String,
        /// What happened.
        reason: String,
    },
    /// The peer finished the stream without an answer.
    #[error("{peer:?} closed the request stream without a reply")]
    NoReply {
        /// The peer.
        peer: String,
    },
    /// The transport is shutting down.
    #[error("transport shut down")]
    ShutDown,
}

/// What every connection and link task shares.
pub(crate) struct Shared {
    pub(crate) endpoint: quinn::Endpoint,
    pub(crate) hello: Hello,
    pub(crate) hello_frame: Vec<u8>,
    inbound: mpsc::Sender<Inbound>,
    pub(crate) shutdown: watch::Receiver<bool>,
    /// The links, to tell them their peer was heard (weak: the links hold `Shared`).
    links: OnceLock<HashMap<String, Weak<PeerLink>>>,
}

impl Shared {
    /// Hands a message to the application; `false` if the transport is shutting down or the
    /// receiver is gone.
    pub(crate) async fn deliver(&self, inbound: Inbound) -> bool {
        let mut shutdown = self.shutdown.clone();
        tokio::select! {
            sent = self.inbound.send(inbound) => sent.is_ok(),
            _ = shutdown.wait_for(|down| *down) => false,
        }
    }

    /// `peer` was heard from: an inbound connection of its completed its `Hello`, or a frame
    /// of its arrived, on a connection whose round trip is estimated at `rtt`. Its link, if it
    /// is down, dials at once (see [`PeerLink::heard`]).
    pub(crate) fn heard(&self, peer: &str, rtt: Duration) {
        if let Some(link) = self.links.get().and_then(|links| links.get(peer))
            && let Some(link) = link.upgrade()
        {
            link.heard(rtt);
        }
    }
}

/// A node's QUIC endpoint: dials peers, accepts them, and moves [`Message`]s both ways.
///
/// Cheap to clone; every clone is the same endpoint. Dropping the last clone shuts it down.
#[derive(Clone)]
pub struct Transport {
    inner: Arc<Inner>,
}

struct Inner {
    shared: Arc<Shared>,
    links: HashMap<String, Arc<PeerLink>>,
    local_addr: SocketAddr,
    shutdown: watch::Sender<bool>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.shutdown.send_replace(true);
        self.shared.endpoint.close(CLOSE_SHUTDOWN, b"shutdown");
    }
}

impl Transport {
    /// Binds the endpoint and starts accepting connections. Peers are dialled lazily, on the
    /// first [`send`](Transport::send) or [`request`](Transport::request) to them.
    ///
    /// Every message received from an authenticated peer whose replica digest matches goes to
    /// the returned channel — first that peer's [`Message::Hello`], once per connection, so
    /// the application sees restarts (a new `incarnation`).
    pub async fn start(
        cfg: TransportConfig,
    ) -> Result<(Transport, mpsc::Receiver<Inbound>), TransportError> {
        Transport::start_with_dial_timing(cfg, DialTiming::default()).await
    }

    /// [`start`](Transport::start) with links that dial their peers as `timing` says.
    pub async fn start_with_dial_timing(
        cfg: TransportConfig,
        timing: DialTiming,
    ) -> Result<(Transport, mpsc::Receiver<Inbound>), TransportError> {
        if cfg.hello.node != cfg.node_id {
            return Err(TransportError::Config(format!(
                "hello.node is {:?} but node_id is {:?}",
                cfg.hello.node, cfg.node_id
            )));
        }
        tls::check_identity(&cfg.tls, &cfg.node_id)?;
        let server = tls::server_config(&cfg.tls)?;
        let client = tls::client_config(&cfg.tls)?;
        let mut endpoint =
            quinn::Endpoint::server(server, cfg.bind).map_err(|source| TransportError::Bind {
                addr: cfg.bind,
                source,
            })?;
        endpoint.set_default_client_config(client);
        let local_addr = endpoint
            .local_addr()
            .map_err(|source| TransportError::Bind {
                addr: cfg.bind,
                source,
            })?;

        let hello_frame = encode_frame(&Message::Hello(cfg.hello.clone()))?;
        let (inbound_tx, inbound_rx) = mpsc::channel(INBOUND_QUEUE);
        let (shutdown_tx, shutdown_rx) = watch::channel(false);
        let shared = Arc::new(Shared {
            endpoint,
            hello: cfg.hello,
            hello_frame,
            inbound: inbound_tx,
            shutdown: shutdown_rx,
            links: OnceLock::new(),
        });

        let mut links = HashMap::new();
        for peer in cfg.peers {
            if links.contains_key(&peer.id) {
                return Err(TransportError::Config(format!(
                    "peer {:?} listed twice",
                    peer.id
                )));
            }
            let link = PeerLink::start(shared.clone(), peer.id.clone(), peer.addr, timing);
            links.insert(peer.id, link);
        }
        let weak = links
            .iter()
            .map(|(id, link)| (id.clone(), Arc::downgrade(link)))
            .collect();
        let _ = shared.links.set(weak);
        tokio::spawn(accept_loop(shared.clone()));
        debug!(node = %cfg.node_id, %local_addr, "transport started");
        let inner = Inner {
            shared,
            links,
            local_addr,
            shutdown: shutdown_tx,
        };
        Ok((
            Transport {
                inner: Arc::new(inner),
            },
            inbound_rx,
        ))
    }

    /// Sends `msg` to `peer` without waiting: the frame is queued for
    /// the peer's link. It is dropped, and counted in `levee_transport_frames_dropped_total`,
    /// if the peer is unknown, unreachable (or backing off after a failed dial), its queue is
    /// full, the message is too large for a frame, or the transport is shut down. Delivery is
    /// at most once; frames to one peer arrive in the order sent while its connection lasts
    /// (they share one stream), and a frame lost with a connection is not resent.
    pub fn send(&self, peer: &str, msg: &Message) {
        if *self.inner.shutdown.borrow() {
            metrics::frame_dropped(peer_label(&self.inner.links, peer), "shutdown");
            return;
        }
        let Some(link) = self.inner.links.get(peer) else {
            metrics::frame_dropped(metrics::UNKNOWN_PEER, "unknown_peer");
            debug!(peer, "dropped a frame for an unknown peer");
            return;
        };
        match encode_frame(msg) {
            Ok(frame) => link.enqueue(frame),
            Err(e) => {
                metrics::frame_dropped(peer, "encode");
                warn!(peer, error = %e, "cannot encode a message");
            }
        }
    }

    /// Sends `msg` to `peer` on a bidirectional stream and waits for its one-frame answer,
    /// dialling the peer first if needed; everything, dial included, within `timeout`.
    pub async fn request(
        &self,
        peer: &str,
        msg: &Message,
        timeout: Duration,
    ) -> Result<Message, TransportError> {
        if *self.inner.shutdown.borrow() {
            return Err(TransportError::ShutDown);
        }
        let link = self
            .inner
            .links
            .get(peer)
            .ok_or_else(|| TransportError::UnknownPeer(peer.to_owned()))?;
        let frame = encode_frame(msg)?;
        tokio::time::timeout(timeout, link.request(&frame))
            .await
            .unwrap_or_else(|_| {
                Err(TransportError::Timeout {
                    peer: peer.to_owned(),
                    after: timeout,
                })
            })
    }

    /// Closes this node's connection to `peer` (if any; the next frame dials anew), for a
    /// peer that says it no longer hears this node although this node hears it: its end of
    /// the connection may be gone (a link cut one way outlived its idle timeout) while ours
    /// still receives its keep-alives. Does nothing while a dial to it is under way.
    pub fn reconnect(&self, peer: &str) {
        if let Some(link) = self.inner.links.get(peer) {
            link.reconnect();
        }
    }

    /// The address the endpoint listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.inner.local_addr
    }

    /// Closes every connection and stops accepting; waits briefly for the closes to be sent.
    /// Afterwards `send` drops everything, `request` fails with
    /// [`TransportError::ShutDown`] and no more messages are delivered.
    pub async fn shutdown(&self) {
        self.inner.shutdown.send_replace(true);
        self.inner
            .shared
            .endpoint
            .close(CLOSE_SHUTDOWN, b"shutdown");
        let _ = tokio::time::timeout(SHUTDOWN_GRACE, self.inner.shared.endpoint.wait_idle()).await;
    }
}

impl std::fmt::Debug for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transport")
            .field("node", &self.inner.shared.hello.node)
            .field("local_addr", &self.inner.local_addr)
            .field("peers", &self.inner.links.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// `peer` if it is a configured peer (a bounded label value), else `unknown`.
fn peer_label<'a>(links: &HashMap<String, Arc<PeerLink>>, peer: &'a str) -> &'a str {
    if links.contains_key(peer) {
        peer
    } else {
        metrics::UNKNOWN_PEER
    }
}

async fn accept_loop(shared: Arc<Shared>) {
    let mut shutdown = shared.shutdown.clone();
    loop {
        let incoming = tokio::select! {
            incoming = shared.endpoint.accept() => incoming,
            _ = shutdown.wait_for(|down| *down) => None,
        };
        let Some(incoming) = incoming else { return };
        tokio::spawn(connection::accept(shared.clone(), incoming));
    }
}
