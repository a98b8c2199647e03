//! How a QUIC [`Transport`](crate::Transport) operation fails: [`TransportError`].

use std::net::SocketAddr;
use std::time::Duration;

use levee_proto::{DecodeError, EncodeError};

use crate::tls::TlsError;

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
    /// The peer is not in [`TransportConfig::peers`](crate::TransportConfig::peers).
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
