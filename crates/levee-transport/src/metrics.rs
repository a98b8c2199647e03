//! Every metric the transport emits, in one place.
//!
//! Label values are bounded: `peer` is a node id that was either configured or proven by a
//! certificate of the cluster CA (or `unknown` before a peer has identified itself), `kind`
//! comes from [`levee_proto::DecodeError::kind`] (plus `stalled`), `reason` and `direction`
//! are fixed strings.

use metrics::{Counter, Gauge, counter, gauge};

/// Label value for a peer that has not identified itself yet.
pub(crate) const UNKNOWN_PEER: &str = "unknown";

/// One peer's frame and queue series, registered once per link or connection: a labelled
/// `counter!` or `gauge!` copies its label and looks its series up in the registry each time
/// it is called, and frames come by the thousand a second.
pub(crate) struct PeerMeter {
    frames_sent: Counter,
    bytes_sent: Counter,
    frames_received: Counter,
    bytes_received: Counter,
    queue_frames: Gauge,
    queue_bytes: Gauge,
}

impl PeerMeter {
    pub(crate) fn new(peer: &str) -> PeerMeter {
        let label = || peer.to_owned();
        PeerMeter {
            frames_sent: counter!("levee_transport_frames_sent_total", "peer" => label()),
            bytes_sent: counter!("levee_transport_bytes_sent_total", "peer" => label()),
            frames_received: counter!("levee_transport_frames_received_total", "peer" => label()),
            bytes_received: counter!("levee_transport_bytes_received_total", "peer" => label()),
            queue_frames: gauge!("levee_transport_queue_frames", "peer" => label()),
            queue_bytes: gauge!("levee_transport_queue_bytes", "peer" => label()),
        }
    }

    /// A frame of `bytes` was written to a stream for the peer.
    pub(crate) fn sent(&self, bytes: usize) {
        self.frames_sent.increment(1);
        self.bytes_sent.increment(bytes as u64);
    }

    /// A frame of `bytes` from the peer was read and decoded.
    pub(crate) fn received(&self, bytes: usize) {
        self.frames_received.increment(1);
        self.bytes_received.increment(bytes as u64);
    }

    /// What is queued for the peer now.
    pub(crate) fn queue(&self, frames: usize, bytes: usize) {
        self.queue_frames.set(frames as f64);
        self.queue_bytes.set(bytes as f64);
    }
}

/// A frame from `peer` was refused before anything was delivered.
pub(crate) fn frame_refused(peer: &str, kind: &'static str) {
    counter!("levee_frames_refused_total", "kind" => kind, "peer" => peer.to_owned()).increment(1);
}

/// A frame for `peer` was dropped without being sent (`reason`: `unreachable`, `queue_full`,
/// `unknown_peer`, `stream`, `encode`, `shutdown`). `unknown_peer` also counts, under the
/// peer's id, the frames still queued to a peer when it is removed from the peers.
pub(crate) fn frame_dropped(peer: &str, reason: &'static str) {
    counter!("levee_transport_frames_dropped_total", "peer" => peer.to_owned(), "reason" => reason)
        .increment(1);
}

/// A connection was closed during the `Hello` exchange (`reason`: `identity`, `protocol`).
/// The label value `replica_digest` (a peer with another replica list) is no longer used: such
/// a peer is accepted, and its digest delivered to the application in its `Hello`.
pub(crate) fn hello_refused(reason: &'static str) {
    counter!("levee_transport_hello_refused_total", "reason" => reason).increment(1);
}

/// A connection to `peer` could not be established.
pub(crate) fn connect_failed(peer: &str) {
    counter!("levee_transport_connect_failures_total", "peer" => peer.to_owned()).increment(1);
}

/// An incoming connection failed its TLS handshake (no or untrusted certificate, wrong ALPN).
pub(crate) fn handshake_refused() {
    counter!("levee_transport_handshakes_refused_total").increment(1);
}

/// A connection to or from `peer` completed its `Hello` exchange (`direction`: `inbound`,
/// `outbound`).
pub(crate) fn connection_established(peer: &str, direction: &'static str) {
    counter!("levee_transport_connections_total", "peer" => peer.to_owned(), "direction" => direction).increment(1);
}
