//! # levee-transport
//!
//! Levee's node-to-node transport: QUIC (`quinn`) with mutual TLS (`rustls`, `ring`) against
//! the cluster CA, carrying [`levee_proto`] frames.
//!
//! What is guaranteed:
//! - **Only cluster members talk.** Both sides of every connection present a certificate
//!   signed by the cluster CA, and nothing else is trusted. A node with any other
//!   certificate fails the TLS handshake, in either direction, and nothing it sends is
//!   delivered.
//! - **Peers prove who they are and agree on the replica list.** Each side first sends its
//!   [`levee_proto::Hello`]; the connection is used only if the peer's node id is the one its
//!   certificate names (or the one dialled) and its `replica_digest` equals this node's.
//!   Otherwise it is closed with an application error code, logged and counted.
//! - **Untrusted bytes are bounded before they are decoded.** A frame's header is checked
//!   (version, size) before its payload is read; the payload is read up to exactly the
//!   announced length, within a per-connection budget, then decoded by the size-capped
//!   decoder. A refused frame is counted (`levee_frames_refused_total{kind}`), logged, and its
//!   stream stopped; the connection and the peer stay up.
//! - **Sending never blocks the caller.** [`Transport::send`] queues a frame and returns;
//!   frames that cannot be sent are dropped and counted, never retried: the replication
//!   protocol tolerates loss, duplication and reordering. [`Transport::request`] is one
//!   frame out and one frame back on a bidirectional stream, bounded by a timeout.
//! - **A dead peer is not hammered.** Connections are dialled lazily and redialled after a
//!   failure no sooner than an exponential backoff allows (100 ms up to 500 ms), unless the
//!   peer is heard again (its inbound connection completes its `Hello`, or a frame of its
//!   arrives): then the link dials at once, replacing a dial that has not got through.
//!
//! Application error codes a peer may see: on a connection close, `0` shutdown, `1` replica
//! digest mismatch, `2` identity not proven by the certificate, `3` no valid `Hello`, `4`
//! closed to redial ([`Transport::reconnect`]); on a
//! stream, `1` frame refused, `2` request not answered.
//!
//! [`certs`] makes a development CA and node certificates; [`tls`] builds the QUIC TLS
//! configurations from PEM files.

pub mod certs;
mod connection;
mod frame_io;
mod link;
mod metrics;
pub mod tls;
mod transport;

pub use tls::TlsFiles;
pub use transport::{DialTiming, Inbound, PeerAddr, Transport, TransportConfig, TransportError};
