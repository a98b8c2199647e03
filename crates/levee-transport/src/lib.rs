//! # levee-transport
//!
//! Levee's node-to-node transport: QUIC (`quinn`) with mutual TLS (`rustls`, `ring`) against
//! the cluster CA, carrying [`levee_proto`] frames.
//!
//! A node talks to its peers through the [`PeerTransport`] trait: fire-and-forget
//! [`send`](PeerTransport::send) by node id, [`Inbound`] messages on a channel,
//! [`reconnect`](PeerTransport::reconnect), [`shutdown`](PeerTransport::shutdown). Two
//! implementations keep the same contract (one conformance suite, `tests/conformance.rs`,
//! runs against both): the QUIC [`Transport`] between processes, and the in-process
//! [`MemoryNetwork`] / [`MemoryTransport`], which round-trips every message through the same
//! frame codec and can cut, isolate and heal links. Request/response
//! ([`Transport::request`]) is the QUIC transport's own: it is not part of the trait, since
//! forwarding is to become ordinary messages correlated by request id.
//!
//! What the QUIC transport guarantees:
//! - **Only cluster members talk.** Both sides of every connection present a certificate
//!   signed by the cluster CA, and nothing else is trusted. A node with any other
//!   certificate fails the TLS handshake, in either direction, and nothing it sends is
//!   delivered.
//! - **Peers prove who they are.** Each side first sends its [`levee_proto::Hello`]; the
//!   connection is used only if the peer's node id is the one its certificate names (or the
//!   one dialled). Otherwise it is closed with an application error code, logged and counted.
//!   The peer's `replica_digest` is not checked — while the membership changes, nodes with
//!   different replica lists must talk —: it reaches the application in the peer's
//!   `Message::Hello`, the first message of every connection, and the application decides
//!   what a different list means.
//! - **The peers can change at run time.** [`Transport::set_peers`] replaces the list the
//!   transport was started with: a new peer gets a link, a removed one (or one that moved to
//!   another address) has its link stopped — queued frames dropped and counted, connection
//!   closed, never dialled again.
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
//! Application error codes a peer may see: on a connection close, `0` shutdown, `2`
//! identity not proven by the certificate, `3` no valid `Hello`, `4` closed to redial
//! ([`Transport::reconnect`]), `5` no longer a peer at this address
//! ([`Transport::set_peers`]); `1` (replica digest mismatch) is no longer sent by this
//! version and stays reserved; on a stream, `1` frame refused, `2` request not answered.
//!
//! [`certs`] makes a development CA and node certificates; [`tls`] builds the QUIC TLS
//! configurations from PEM files.
//!
//! ## Files and layering
//!
//! One concept per file. The imports between files form a DAG: each file uses only the
//! files listed in its row, and no two files import each other.
//!
//! | file | what it is | uses |
//! |---|---|---|
//! | `peer_transport.rs` | [`PeerTransport`], [`Inbound`]: what a node needs from a transport | — |
//! | `memory.rs` | [`MemoryNetwork`], [`MemoryTransport`]: the in-process network with faults | `peer_transport` |
//! | `quic.rs` | [`Transport`]: one node's QUIC endpoint, a link per peer (changed by [`Transport::set_peers`]), the accept loop; its `PeerTransport` impl | `config`, `error`, `shared`, `connection`, `link`, `metrics`, `tls`, `peer_transport` |
//! | `link.rs` | the way to one peer: dialling, backoff, the send queue and its writer task | `config`, `error`, `shared`, `connection`, `frame_io`, `metrics` |
//! | `connection.rs` | one authenticated connection: the `Hello` exchange, then the streams the peer opens | `shared`, `frame_io`, `metrics`, `tls`, `peer_transport` |
//! | `shared.rs` | what an endpoint's connections and links share; the `HeardListener` a link registers there | `peer_transport` |
//! | `config.rs` | [`TransportConfig`], [`PeerAddr`], [`DialTiming`] | `tls` |
//! | `error.rs` | [`TransportError`] | `tls` |
//! | `frame_io.rs` | whole frames on QUIC streams, bounded before they are decoded | — |
//! | `metrics.rs` | every metric the QUIC transport emits | — |
//! | [`tls`] | the QUIC TLS configurations from PEM files | `certs` |
//! | [`certs`] | the development CA and node certificates | — |
//!
//! A link must hear that its peer dialled in (see `link.rs`), yet connections sit below
//! links: the link registers in `shared.rs` as its peer's `HeardListener`, and connections
//! call that, so neither `connection.rs` nor `shared.rs` names the link.

pub mod certs;
mod config;
mod connection;
mod error;
mod frame_io;
mod link;
mod memory;
mod metrics;
mod peer_transport;
mod quic;
mod shared;
pub mod tls;

pub use config::{DialAddr, DialTiming, PeerAddr, TransportConfig};
pub use error::TransportError;
pub use memory::{DEFAULT_INBOX_CAPACITY, MemoryNetwork, MemoryTransport};
pub use peer_transport::{Inbound, PeerTransport, ShutdownFuture};
pub use quic::Transport;
pub use tls::TlsFiles;
