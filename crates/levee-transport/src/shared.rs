//! What a QUIC endpoint's connection and link tasks share: [`Shared`] — the endpoint, this
//! node's `Hello`, the channel to the application, the shutdown signal, and who to tell when
//! a peer is heard from.
//!
//! A link must learn that its peer was heard on a connection the link did not dial (see
//! [`HeardListener`]). Links are registered here as listeners behind that trait (registered
//! anew whenever the peers change), so that this module, and the connections that call
//! [`Shared::heard`], do not depend on the link module, which depends on them.

use std::collections::HashMap;
use std::sync::{PoisonError, RwLock, Weak};
use std::time::Duration;

use levee_proto::{EncodeError, Hello, Message};
use tokio::sync::{mpsc, watch};

use crate::peer_transport::Inbound;

/// Wants to know when a peer is heard from: the link to that peer (`PeerLink`), which dials
/// at once if it is down.
pub(crate) trait HeardListener: Send + Sync {
    /// The peer was heard on a connection whose round trip is estimated at `rtt`.
    fn heard(&self, rtt: Duration);

    /// An inbound connection of the peer completed its `Hello`, which says `incarnation`
    /// (its process's): a connection of this node's to another incarnation is to a process
    /// that is gone, however alive it looks until its idle timeout. Then, as
    /// [`HeardListener::heard`].
    fn hello(&self, incarnation: u64, rtt: Duration);
}

/// What every connection and link task shares.
pub(crate) struct Shared {
    pub(crate) endpoint: quinn::Endpoint,
    pub(crate) hello: Hello,
    pub(crate) hello_frame: Vec<u8>,
    /// The version of every frame sent (see `TransportConfig::wire_version`).
    wire_version: u8,
    inbound: mpsc::Sender<Inbound>,
    pub(crate) shutdown: watch::Receiver<bool>,
    /// Per peer id, who to tell that the peer was heard (weak: the links hold `Shared`).
    /// Replaced whenever the peers change (see [`Shared::set_listeners`]).
    listeners: RwLock<HashMap<String, Weak<dyn HeardListener>>>,
}

impl Shared {
    /// The state of a new endpoint, with no listeners yet (see [`Shared::set_listeners`]).
    pub(crate) fn new(
        endpoint: quinn::Endpoint,
        hello: Hello,
        wire_version: u8,
        inbound: mpsc::Sender<Inbound>,
        shutdown: watch::Receiver<bool>,
    ) -> Result<Shared, EncodeError> {
        let hello_frame =
            levee_proto::encode_frame_as(wire_version, &Message::Hello(hello.clone()))?
                .ok_or(EncodeError::Version(wire_version))?;
        Ok(Shared {
            endpoint,
            hello,
            hello_frame,
            wire_version,
            inbound,
            shutdown,
            listeners: RwLock::new(HashMap::new()),
        })
    }

    /// The version of every frame sent.
    pub(crate) fn wire_version(&self) -> u8 {
        self.wire_version
    }

    /// `msg` as a frame of this node's wire version; `Ok(None)` if that version has no such
    /// message (a peer of it would refuse it: it is not sent).
    pub(crate) fn encode(&self, msg: &Message) -> Result<Option<Vec<u8>>, EncodeError> {
        levee_proto::encode_frame_as(self.wire_version, msg)
    }

    /// Registers who to tell when each peer is heard from, replacing the previous listeners:
    /// a peer not in `listeners` is no longer told about.
    pub(crate) fn set_listeners(&self, listeners: HashMap<String, Weak<dyn HeardListener>>) {
        *self
            .listeners
            .write()
            .unwrap_or_else(PoisonError::into_inner) = listeners;
    }

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
    /// is down, dials at once (see [`HeardListener`]).
    pub(crate) fn heard(&self, peer: &str, rtt: Duration) {
        if let Some(listener) = self.listener(peer) {
            listener.heard(rtt);
        }
    }

    /// An inbound connection of `peer` completed its `Hello`, saying `incarnation`: its link
    /// drops a connection to an earlier process of the peer, and dials at once if it is down
    /// (see [`HeardListener::hello`]).
    pub(crate) fn heard_hello(&self, peer: &str, incarnation: u64, rtt: Duration) {
        if let Some(listener) = self.listener(peer) {
            listener.hello(incarnation, rtt);
        }
    }

    /// Who is told when `peer` is heard from: upgraded under the read lock, told after it is
    /// released.
    fn listener(&self, peer: &str) -> Option<std::sync::Arc<dyn HeardListener>> {
        self.listeners
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(peer)
            .and_then(Weak::upgrade)
    }
}
