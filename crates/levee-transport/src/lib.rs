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
//!
//! ## Files and layering
//!
//! Each file holds one concept and imports only from the layers below it; no two files
//! import each other.
//!
//! | layer | file | what it is |
//! |---|---|---|
//! | 3 | `quic.rs` | [`Transport`]: one node's QUIC endpoint, a link per configured peer, the accept loop |
//! | 2 | `link.rs` | the way to one peer: dialling, backoff, the send queue and its writer task |
//! | 1 | `connection.rs` | one authenticated connection: the `Hello` exchange, then the streams the peer opens |
//! | 0 | `shared.rs` | what an endpoint's connections and links share, and the `HeardListener` a link registers there |
//! | 0 | `config.rs` | [`TransportConfig`], [`PeerAddr`], [`DialTiming`] |
//! | 0 | `error.rs` | [`TransportError`] |
//! | 0 | `peer_transport.rs` | [`Inbound`]: what a transport delivers |
//! | 0 | `frame_io.rs` | whole frames on QUIC streams, bounded before they are decoded |
//! | 0 | `metrics.rs` | every metric the transport emits |
//! | 0 | [`tls`], [`certs`] | TLS configurations; the development CA |
//!
//! A link learns that its peer was heard on a connection the peer dialled through
//! `shared.rs` (it registers there as a `HeardListener`), so connections never name links.

pub mod certs;
mod config;
mod connection;
mod error;
mod frame_io;
mod link;
mod metrics;
mod peer_transport;
mod quic;
mod shared;
pub mod tls;

pub use config::{DialTiming, PeerAddr, TransportConfig};
pub use error::TransportError;
pub use peer_transport::Inbound;
pub use quic::Transport;
pub use tls::TlsFiles;
