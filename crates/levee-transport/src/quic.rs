//! The QUIC transport: [`Transport`], one node's endpoint, with a link per peer (the peers
//! it was started with, then as [`Transport::set_peers`] changes them) and a task accepting
//! the peers' connections.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::net::SocketAddr;
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard, Weak};
use std::time::Duration;

use levee_proto::Message;
use tokio::sync::{mpsc, watch};
use tracing::{debug, info, warn};

use crate::config::{DialAddr, DialTiming, PeerAddr, TransportConfig};
use crate::connection::{self, CLOSE_SHUTDOWN};
use crate::error::TransportError;
use crate::link::PeerLink;
use crate::metrics;
use crate::peer_transport::{Inbound, PeerTransport, ShutdownFuture};
use crate::shared::{HeardListener, Shared};
use crate::tls;

/// Messages received but not yet taken from the [`Inbound`] channel; beyond this, readers
/// wait (and QUIC flow control slows the peers down).
const INBOUND_QUEUE: usize = 256;
/// How long [`Transport::shutdown`] waits for connections to finish closing.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);

/// A node's QUIC endpoint: dials peers, accepts them, and moves [`Message`]s both ways.
///
/// Cheap to clone; every clone is the same endpoint. Dropping the last clone shuts it down.
#[derive(Clone)]
pub struct Transport {
    inner: Arc<Inner>,
}

struct Inner {
    shared: Arc<Shared>,
    /// The link to each peer, by node id. Read on every send; written only by
    /// [`Transport::set_peers`], which also keeps `shared`'s listeners in step with it.
    links: RwLock<HashMap<String, Arc<PeerLink>>>,
    /// How every link dials, those started by [`Transport::set_peers`] included.
    timing: DialTiming,
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
    /// Every message received from an authenticated peer goes to the returned channel —
    /// first that peer's [`Message::Hello`], once per connection, so the application sees
    /// restarts (a new `incarnation`) and the peer's `replica_digest`, whatever it is.
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

        let (inbound_tx, inbound_rx) = mpsc::channel(INBOUND_QUEUE);
        let (shutdown_tx, shutdown_rx) = watch::channel(false);
        let shared = Arc::new(Shared::new(
            endpoint,
            cfg.hello,
            cfg.wire_version,
            inbound_tx,
            shutdown_rx,
        )?);

        let mut links = HashMap::new();
        for peer in cfg.peers {
            if links.contains_key(&peer.id) {
                return Err(TransportError::Config(format!(
                    "peer {:?} listed twice",
                    peer.id
                )));
            }
            let link = PeerLink::start(shared.clone(), peer.id.clone(), peer.addr.clone(), timing);
            links.insert(peer.id, link);
        }
        shared.set_listeners(listeners(&links));
        tokio::spawn(accept_loop(shared.clone()));
        debug!(node = %cfg.node_id, %local_addr, "transport started");
        let inner = Inner {
            shared,
            links: RwLock::new(links),
            timing,
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
        let link = self.inner.link(peer);
        if *self.inner.shutdown.borrow() {
            // `peer` is a bounded label value only if it is one of the peers.
            let label = if link.is_some() {
                peer
            } else {
                metrics::UNKNOWN_PEER
            };
            metrics::frame_dropped(label, "shutdown");
            return;
        }
        let Some(link) = link else {
            metrics::frame_dropped(metrics::UNKNOWN_PEER, "unknown_peer");
            debug!(peer, "dropped a frame for an unknown peer");
            return;
        };
        match self.inner.shared.encode(msg) {
            Ok(Some(frame)) => link.enqueue(frame),
            Ok(None) => {
                metrics::frame_dropped(peer, "version");
                debug!(
                    peer,
                    "not sent: the configured wire version has no such message"
                );
            }
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
            .link(peer)
            .ok_or_else(|| TransportError::UnknownPeer(peer.to_owned()))?;
        let frame = self
            .inner
            .shared
            .encode(msg)?
            .ok_or(TransportError::Encode(levee_proto::EncodeError::Version(
                self.inner.shared.wire_version(),
            )))?;
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
        if let Some(link) = self.inner.link(peer) {
            link.reconnect();
        }
    }

    /// Makes this node's peers exactly `peers`, for a cluster whose membership changes at
    /// run time. An entry naming this node itself is ignored; of several entries with one id,
    /// the last counts.
    ///
    /// - A new peer gets a link, dialled lazily like those made at start, with the same
    ///   [`DialTiming`].
    /// - A peer no longer listed loses its link: the frames queued for it are dropped and
    ///   counted (`unknown_peer`), the connection this node dialled to it is closed
    ///   (application error code `5`), it is never dialled again, and from now on `send` to it
    ///   drops as for any unknown peer and `request` fails with
    ///   [`TransportError::UnknownPeer`]. A request already under way ends as it would have.
    /// - A peer whose `addr` changed gets a new link to the new address, replacing the old
    ///   one (which is dropped as above: its queued frames are lost, not moved).
    /// - A peer listed with the same address keeps its link, connection and queue untouched.
    ///
    /// Incoming connections do not depend on the list: any holder of a cluster certificate
    /// may connect, listed or not. Does nothing once the transport is shut down.
    pub fn set_peers(&self, peers: Vec<PeerAddr>) {
        if *self.inner.shutdown.borrow() {
            return;
        }
        let own = &self.inner.shared.hello.node;
        let wanted: HashMap<String, DialAddr> = peers
            .into_iter()
            .filter(|peer| peer.id != *own)
            .map(|peer| (peer.id, peer.addr))
            .collect();
        let mut stopped = Vec::new();
        {
            let mut links = self
                .inner
                .links
                .write()
                .unwrap_or_else(PoisonError::into_inner);
            links.retain(|id, link| {
                let keep = wanted.get(id) == Some(link.addr());
                if !keep {
                    stopped.push((id.clone(), link.clone()));
                }
                keep
            });
            for (id, addr) in wanted {
                // Links kept above are at the same address: only the new ones are started.
                if let Entry::Vacant(slot) = links.entry(id) {
                    info!(peer = %slot.key(), %addr, "peer added");
                    let id = slot.key().clone();
                    slot.insert(PeerLink::start(
                        self.inner.shared.clone(),
                        id,
                        addr,
                        self.inner.timing,
                    ));
                }
            }
            // Under the write lock, so that two concurrent calls leave links and listeners
            // alike.
            self.inner.shared.set_listeners(listeners(&links));
        }
        for (id, link) in stopped {
            info!(peer = %id, addr = %link.addr(), "peer link dropped");
            link.stop();
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

/// The QUIC transport as a node sees it; each method is the inherent one of the same name.
impl PeerTransport for Transport {
    fn send(&self, peer: &str, msg: &Message) {
        Transport::send(self, peer, msg);
    }

    fn reconnect(&self, peer: &str) {
        Transport::reconnect(self, peer);
    }

    fn shutdown(&self) -> ShutdownFuture<'_> {
        Box::pin(Transport::shutdown(self))
    }
}

impl std::fmt::Debug for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transport")
            .field("node", &self.inner.shared.hello.node)
            .field("local_addr", &self.inner.local_addr)
            .field("peers", &self.inner.links().keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Inner {
    fn links(&self) -> RwLockReadGuard<'_, HashMap<String, Arc<PeerLink>>> {
        self.links.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// The link to `peer`, if it is one of the peers; the lock is held only to clone it.
    fn link(&self, peer: &str) -> Option<Arc<PeerLink>> {
        self.links().get(peer).cloned()
    }
}

/// Who to tell when each peer is heard from: its link.
fn listeners(links: &HashMap<String, Arc<PeerLink>>) -> HashMap<String, Weak<dyn HeardListener>> {
    links
        .iter()
        .map(|(id, link)| {
            let link: Arc<dyn HeardListener> = link.clone();
            (id.clone(), Arc::downgrade(&link))
        })
        .collect()
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
