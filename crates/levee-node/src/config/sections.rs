//! The sections of the file: `[node]`, `[api]`, `[cluster]` with its nodes, `[[notify]]`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use levee_core::HumanDuration;
use levee_transport::DialAddr;
use serde::{Deserialize, Serialize};

use super::ByteSize;

/// `[node]`: this node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NodeSection {
    /// Unique node id in the cluster.
    pub id: String,
    /// The region the node serves.
    pub region: String,
    /// The HTTP API's address.
    pub http: SocketAddr,
    /// QUIC address for peers; absent on a single node.
    pub gossip: Option<SocketAddr>,
    /// Where snapshots of counters go; absent: no persistence.
    pub data_dir: Option<PathBuf>,
    /// The most keys held in memory; idle keys are evicted first beyond it.
    pub max_keys: usize,
    /// The most runtime per-key overrides (`/v1/overrides`) in force; a `PUT` beyond it is
    /// answered `409 too_many_overrides`.
    pub max_overrides: usize,
    /// How often counters are written to `data_dir`.
    pub snapshot_interval: HumanDuration,
    /// How long shutdown waits for in-flight requests.
    pub shutdown_grace: HumanDuration,
}

impl Default for NodeSection {
    fn default() -> NodeSection {
        NodeSection {
            id: "node-1".into(),
            region: "local".into(),
            http: SocketAddr::from(([127, 0, 0, 1], 8750)),
            gossip: None,
            data_dir: None,
            max_keys: 1_000_000,
            max_overrides: 100_000,
            snapshot_interval: HumanDuration::from_millis(10_000),
            shutdown_grace: HumanDuration::from_millis(10_000),
        }
    }
}

/// `[api]`: the HTTP API.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ApiSection {
    /// Bearer token for `/admin/*`, `DELETE /v1/usage` and (without `refund_token`)
    /// `POST /v1/refund`; absent: no token required — allowed only on a loopback listener or
    /// with `admin_open`.
    pub admin_token: Option<String>,
    /// Bearer token for `POST /v1/refund`; absent: `admin_token` is asked for instead.
    pub refund_token: Option<String>,
    /// Runs without `admin_token` on a non-loopback listener (the admin endpoints and refunds
    /// open to whoever reaches the port); refused otherwise.
    pub admin_open: bool,
    /// Proxies (CIDRs) whose `X-Forwarded-For` / `X-Real-IP` are believed for
    /// `key_from = "ip"`; from any other peer the socket address is the key.
    pub trusted_proxies: Vec<ipnet::IpNet>,
    /// A connection with no request in progress for this long is closed.
    pub idle_timeout: HumanDuration,
    /// Open connections beyond this are closed as soon as they are accepted.
    pub max_connections: usize,
    /// Largest request body.
    pub max_body: ByteSize,
    /// A request taking longer is answered `503`.
    pub request_timeout: HumanDuration,
    /// How many idempotency keys are remembered.
    pub idempotency_capacity: u64,
    /// Most checks in one batch or `all` call.
    pub max_batch: usize,
}

impl Default for ApiSection {
    fn default() -> ApiSection {
        ApiSection {
            admin_token: None,
            refund_token: None,
            admin_open: false,
            trusted_proxies: Vec::new(),
            idle_timeout: HumanDuration::from_millis(60_000),
            max_connections: 10_000,
            max_body: ByteSize(1 << 20),
            request_timeout: HumanDuration::from_millis(5_000),
            idempotency_capacity: 100_000,
            max_batch: 1_000,
        }
    }
}

/// `[cluster.tls]`: mutual TLS between peers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsSection {
    /// The cluster CA certificate (PEM).
    pub ca: PathBuf,
    /// This node's certificate (PEM).
    pub cert: PathBuf,
    /// This node's private key (PEM).
    pub key: PathBuf,
}

/// `[[cluster.node]]`: one member of the agreed replica set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterNode {
    /// The node's id.
    pub id: String,
    /// Its region.
    pub region: String,
    /// Where this node reaches it (point at a proxy to route the link through one): an
    /// `ip:port`, or a `name:port` resolved again at every dial (a peer that moves keeps its
    /// id and is found at its new address).
    #[serde(with = "dial_addr")]
    pub addr: DialAddr,
    /// Its HTTP API's address as clients reach it (optional): shown in `/v1/cluster`'s `ring`,
    /// so that a client can send each check to its key's owner.
    #[serde(default)]
    pub http: Option<String>,
    /// Its weight inside its region (default: the region's weight split evenly).
    #[serde(default)]
    pub weight: Option<u32>,
    /// The node was removed from the cluster: its entry stays (positions in the list never
    /// move) with no share, no keys, and no link (docs/membership.md).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub removed: bool,
}

/// Whether `s` is `host:port` (a name or an address, a port from 1; IPv6 in brackets), with
/// no scheme, path or spaces: what a client connects to.
pub(super) fn is_host_port(s: &str) -> bool {
    let Some((host, port)) = s.rsplit_once(':') else {
        return false;
    };
    let host_ok = if let Some(v6) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        v6.parse::<std::net::Ipv6Addr>().is_ok()
    } else {
        !host.is_empty()
            && host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-' || c == '_')
    };
    host_ok && port.parse::<u16>().is_ok_and(|p| p > 0)
}

/// `[cluster] mode`: how the cluster keeps its global limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", try_from = "String")]
pub enum ClusterMode {
    /// Escrow: every node spends only the rights it holds; the limit holds under any
    /// partition.
    #[default]
    Strict,
    /// Removed. Parsed only so that a configuration naming it is refused with the reason and
    /// the replacement (`Config::parse`), not with serde's list of variants.
    Optimistic,
}

impl TryFrom<String> for ClusterMode {
    type Error = String;

    fn try_from(s: String) -> Result<ClusterMode, String> {
        match s.as_str() {
            "strict" => Ok(ClusterMode::Strict),
            "optimistic" => Ok(ClusterMode::Optimistic),
            other => Err(format!(
                "unknown mode {other:?}: the only mode is \"strict\""
            )),
        }
    }
}

/// Why `mode = "optimistic"` is refused: the error names the replacement.
pub const OPTIMISTIC_REMOVED: &str = "\"optimistic\" was removed: in the simulator strict mode \
admitted at least as much in every scenario and never exceeded the limit, while optimistic \
mode went over it under partitions (docs/accuracy.md); use mode = \"strict\" (the default), \
or leave the key out";

/// `[cluster]`: the multi-region cluster.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterSection {
    /// `strict`, the default and the only mode (see [`ClusterMode`]).
    #[serde(default)]
    pub mode: ClusterMode,
    /// How often deltas are sent.
    #[serde(default = "default_gossip_interval")]
    pub gossip_interval: HumanDuration,
    /// A region not heard from within this is unreachable.
    #[serde(default = "default_suspect_after")]
    pub suspect_after: HumanDuration,
    /// Tolerated clock skew between nodes.
    #[serde(default = "default_max_clock_skew")]
    pub max_clock_skew: HumanDuration,
    /// Region weights.
    pub regions: BTreeMap<String, u32>,
    /// Mutual TLS.
    pub tls: Option<TlsSection>,
    /// The agreed node list.
    #[serde(default, rename = "node")]
    pub nodes: Vec<ClusterNode>,
    /// The protocol version of the frames this node sends: absent (this build's,
    /// `levee_proto::VERSION`), or the one before while nodes of the previous build still run
    /// (they decode nothing newer). For a rolling upgrade (docs/operations.md, "Upgrading").
    #[serde(default)]
    pub wire_version: Option<u8>,
    /// Who a node gossips with every interval: `mesh` (every node, the default) or `regions`
    /// (region-mates and one node per other region, which relays: messages per node grow
    /// with regions plus region-mates, not with all nodes; docs/replication.md, "Gossip
    /// topology").
    #[serde(default)]
    pub gossip_topology: GossipTopology,
    /// Whether a node that is not a key's owner decides a check itself when the rights it
    /// holds of the key admit it, and forwards only the rest to the owner (default `false`:
    /// every check goes to its owner). Saves the round trip inside the region for callers
    /// that do not route to owners; rights then follow each node's own demand as they do
    /// between regions (docs/replication.md, "Ownership and routing").
    #[serde(default)]
    pub local_first: bool,
}

/// `[cluster] gossip_topology`: who a node gossips with every interval.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GossipTopology {
    /// Every node, every interval.
    #[default]
    Mesh,
    /// Region-mates, plus one gateway per other region that relays to its region.
    Regions,
}

impl From<GossipTopology> for levee_cluster::Topology {
    fn from(t: GossipTopology) -> levee_cluster::Topology {
        match t {
            GossipTopology::Mesh => levee_cluster::Topology::Mesh,
            GossipTopology::Regions => levee_cluster::Topology::Regions,
        }
    }
}

fn default_gossip_interval() -> HumanDuration {
    HumanDuration::from_millis(20)
}
fn default_suspect_after() -> HumanDuration {
    HumanDuration::from_millis(1_000)
}
fn default_max_clock_skew() -> HumanDuration {
    HumanDuration::from_millis(500)
}

/// `[[notify]]`: where threshold notices go (docs/configuration.md, "`[[notify]]`").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NotifySection {
    /// The `http://` URL notices are POSTed to.
    pub url: String,
    /// The rules whose keys are watched; absent: every rule.
    #[serde(default)]
    pub rules: Option<Vec<String>>,
    /// Fractions of the limit used, each in (0, 1]; default `[0.8, 0.9, 1.0]`.
    #[serde(default = "default_thresholds")]
    pub thresholds: Vec<f64>,
    /// One delivery attempt's time limit (connect, send, answer).
    #[serde(default = "default_notify_timeout")]
    pub timeout: HumanDuration,
    /// Notices waiting to be sent beyond this are dropped (and counted).
    #[serde(default = "default_notify_queue")]
    pub queue: usize,
}

fn default_thresholds() -> Vec<f64> {
    vec![0.8, 0.9, 1.0]
}
fn default_notify_timeout() -> HumanDuration {
    HumanDuration::from_millis(5_000)
}
fn default_notify_queue() -> usize {
    10_000
}

/// `[[cluster.node]] addr` as text: `ip:port` or `name:port`.
mod dial_addr {
    use levee_transport::DialAddr;
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(a: &DialAddr, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(a)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<DialAddr, D::Error> {
        let text = String::deserialize(d)?;
        DialAddr::parse(&text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::super::{ConfigError, one_node_cluster};
    use super::{ClusterSection, GossipTopology};

    /// The cluster section of a one-node cluster with `extra` lines in it, or the error.
    fn cluster_with(extra: &str) -> Result<ClusterSection, ConfigError> {
        one_node_cluster(extra).map(|c| c.cluster.expect("a [cluster] section"))
    }

    #[test]
    fn gossip_topology_is_mesh_unless_set_and_a_bad_value_names_its_line_and_field() {
        let topology = |extra: &str| cluster_with(extra).unwrap().gossip_topology;
        assert_eq!(topology(""), GossipTopology::Mesh);
        assert_eq!(
            topology("gossip_topology = \"regions\"\n"),
            GossipTopology::Regions
        );
        let e = cluster_with("gossip_topology = \"ring\"\n").unwrap_err();
        assert_eq!(e.line, Some(6), "{e}");
        assert!(e.to_string().contains("cluster.gossip_topology"), "{e}");
        assert!(e.to_string().contains("`mesh` or `regions`"), "{e}");
    }

    #[test]
    fn local_first_is_off_unless_set_and_a_bad_value_names_its_line_and_field() {
        let local_first = |extra: &str| cluster_with(extra).unwrap().local_first;
        assert!(!local_first(""));
        assert!(local_first("local_first = true\n"));
        let e = cluster_with("local_first = \"yes\"\n").unwrap_err();
        assert_eq!(e.line, Some(6), "{e}");
        assert!(e.to_string().contains("cluster.local_first"), "{e}");
    }
}
