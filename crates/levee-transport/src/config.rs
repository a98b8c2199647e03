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
    pub addr: DialAddr,
}

/// The address a peer is dialled at: an IP address and port, or a DNS name and port resolved
/// again at every dial, so that a peer that moves (a Kubernetes pod rescheduled with a new
/// IP) keeps its id and is found at its new address.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum DialAddr {
    /// An IP address and port.
    Ip(SocketAddr),
    /// A DNS name and port.
    Name {
        /// The name (letters, digits, `.`, `-`, `_`).
        host: String,
        /// The port.
        port: u16,
    },
}

impl DialAddr {
    /// `ip:port`, `[ipv6]:port` or `name:port` (a port from 1); an error says what is wrong.
    pub fn parse(s: &str) -> Result<DialAddr, String> {
        if let Ok(a) = s.parse::<SocketAddr>() {
            return Ok(DialAddr::Ip(a));
        }
        let (host, port) = s
            .rsplit_once(':')
            .ok_or_else(|| format!("{s:?} is not host:port"))?;
        let port = port
            .parse::<u16>()
            .ok()
            .filter(|&p| p > 0)
            .ok_or_else(|| format!("{s:?}: the port must be a number from 1 to 65535"))?;
        let name_ok = !host.is_empty()
            && host.len() <= 253
            && host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-' || c == '_');
        if !name_ok {
            return Err(format!(
                "{s:?}: the host must be an IP address or a DNS name (letters, digits, '.', '-', '_')"
            ));
        }
        Ok(DialAddr::Name {
            host: host.to_owned(),
            port,
        })
    }

    /// The address to dial now: the IP itself, or the name resolved now, preferring an
    /// address of the family the endpoint is bound to (`ipv6`).
    pub async fn resolve(&self, ipv6: bool) -> Result<SocketAddr, String> {
        match self {
            DialAddr::Ip(a) => Ok(*a),
            DialAddr::Name { host, port } => {
                let found: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), *port))
                    .await
                    .map_err(|e| format!("cannot resolve {host}: {e}"))?
                    .collect();
                found
                    .iter()
                    .find(|a| a.is_ipv6() == ipv6)
                    .or_else(|| found.first())
                    .copied()
                    .ok_or_else(|| format!("{host} resolves to no address"))
            }
        }
    }
}

impl From<SocketAddr> for DialAddr {
    fn from(a: SocketAddr) -> DialAddr {
        DialAddr::Ip(a)
    }
}

impl std::fmt::Display for DialAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DialAddr::Ip(a) => write!(f, "{a}"),
            DialAddr::Name { host, port } => write!(f, "{host}:{port}"),
        }
    }
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
    /// The peers this node sends to at start ([`Transport::set_peers`](crate::Transport::set_peers)
    /// changes them later). Incoming connections are accepted from any holder of a cluster
    /// certificate, listed here or not.
    pub peers: Vec<PeerAddr>,
    /// What this node says first on every connection.
    pub hello: Hello,
    /// The protocol version of every frame this node sends (`cluster.wire_version`):
    /// [`levee_proto::VERSION`], or [`levee_proto::OLDEST_VERSION`] while nodes of the
    /// previous build, which decode nothing newer, still run. Messages that version lacks are
    /// not sent (counted in `levee_transport_frames_dropped_total{reason="version"}`). Frames
    /// of either version are decoded whatever this says.
    pub wire_version: u8,
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
