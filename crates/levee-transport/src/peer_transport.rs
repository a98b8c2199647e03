//! What a node needs from a transport, whatever carries the bytes: the [`PeerTransport`]
//! trait and the [`Inbound`] messages it delivers.
//!
//! Two implementations: the QUIC [`Transport`](crate::Transport) between processes, and the
//! in-memory [`MemoryTransport`](crate::MemoryTransport) of a
//! [`MemoryNetwork`](crate::MemoryNetwork), which can cut links. Both carry every message
//! through the `levee_proto` frame codec, and one conformance suite
//! (`tests/conformance.rs`) holds both to the same contract.

use std::future::Future;
use std::pin::Pin;

use levee_proto::Message;
use tokio::sync::oneshot;

/// A message from a peer.
#[derive(Debug)]
pub struct Inbound {
    /// The sender's node id, as proven by its certificate (or by the name this node dialled).
    pub peer: String,
    /// The message.
    pub msg: Message,
    /// For a request: send the answer here (it goes back as one frame). Dropping it resets
    /// the request stream, so the requester fails at once. Only the QUIC transport's
    /// [`request`](crate::Transport::request) sets it: a message sent with
    /// [`PeerTransport::send`] never carries one.
    pub reply: Option<oneshot::Sender<Message>>,
}

/// The future of [`PeerTransport::shutdown`] (boxed, so that the trait can be used as
/// `dyn PeerTransport`).
pub type ShutdownFuture<'a> = Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

/// Moves [`Message`]s between this node and its peers, named by node id.
///
/// **Receiving** is not a method: the constructor of each implementation
/// ([`Transport::start`](crate::Transport::start),
/// [`MemoryNetwork::join`](crate::MemoryNetwork::join)) returns, beside the transport, the
/// `tokio::sync::mpsc::Receiver<Inbound>` every message for this node goes to, so that one
/// task owns the receiving end while any number share the sending one.
///
/// The contract both implementations keep (checked by `tests/conformance.rs`):
/// - **At most once, never blocking.** [`send`](PeerTransport::send) returns at once; a
///   message that cannot be delivered (peer unknown or down, link cut, queue full, message
///   too large for a frame, transport shut down) is dropped, never retried or delivered
///   later by another path. The replication protocol tolerates loss, duplication and
///   reordering.
/// - **Intact, from the proven sender.** A delivered message equals the one sent after
///   a round trip through `levee_proto::encode_frame` and the frame decoder, and
///   [`Inbound::peer`] is the sender's node id.
/// - **In order per link, within a session.** Messages from one node to another arrive in
///   the order sent as long as their session lasts (for QUIC, a connection; in memory, until
///   a restart, [`reconnect`](PeerTransport::reconnect), or a cut).
/// - **A `Hello` opens every session.** Before the first message of a new session, each
///   side receives the other's `Message::Hello`, so the application sees a peer restart as a
///   new `incarnation`. A peer's `Hello` may come more than once per session of this node's:
///   over QUIC each side dials its own connection (and dials back once it hears the other),
///   and each connection opens with `Hello`s.
pub trait PeerTransport: Send + Sync {
    /// Sends `msg` to `peer` without waiting, at most once (see the trait's contract).
    fn send(&self, peer: &str, msg: &Message);

    /// Ends this node's session with `peer`, if any: the next message starts a new one (new
    /// `Hello`s). For a peer that says it no longer hears this node although this node hears
    /// it.
    fn reconnect(&self, peer: &str);

    /// Stops sending and receiving. Afterwards `send` drops everything and nothing new is
    /// delivered to this node (what its receiver already holds stays there).
    fn shutdown(&self) -> ShutdownFuture<'_>;
}
