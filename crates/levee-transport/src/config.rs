//! What the QUIC [`Transport`](crate::Transport) is configured with: where the peers are
//! ([`PeerAddr`]), the node's identity and TLS material ([`TransportConfig`]), and how a link
//! dials ([`DialTiming`]).

use std::net::SocketAddr;
use std::time::Duration;

use levee_proto::Hello;

use crate::tls::TlsFiles;

/// Where this node reaches a peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerAddr {
    /// The peer's node id: the DNS name its certificate must carry.
    pub id: String,
    /// The address to dial (the peer itself, or a proxy in front of it).
    pub addr: SocketAddr,
}

/// Everything [`Transport::start`](crate::Transport::start) needs.
#[derive(Debug, Clone)]
pub struct TransportConfig {
    /// The UDP address to listen on (port 0 picks a free one; see
    /// [`Transport::local_addr`](crate::Transport::local_addr)).
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
    /// What [`Transport::start`](crate::Transport::start) uses: dials of 2 s at most (a dial
    /// stuck in a partition holds the link until it fails or the peer is heard), backoff from
    /// 100 ms up to 500 ms (a peer cut off for long is still dialled about twice a second; a
    /// dial costs one QUIC Initial packet while the peer is unreachable).
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_its_cap() {
        let t = DialTiming::default();
        assert_eq!(t.backoff(1), t.backoff_min);
        assert_eq!(t.backoff(2), t.backoff_min * 2);
        assert_eq!(t.backoff(3), t.backoff_min * 4);
        assert_eq!(t.backoff(4), t.backoff_max);
        assert_eq!(t.backoff(100), t.backoff_max);
    }
}
