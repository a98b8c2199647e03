//! The cluster of a chaos run: the black-box harness's [`Cluster`] of real `levee serve`
//! processes (three regions, `eu`, `us`, `ap`, of two nodes each) with the fault proxy on
//! every link.
//!
//! [`Cluster::start_with`] reserves the 30 ports after the nodes' for the proxy's relays,
//! starts the [`FaultProxy`] on them before the nodes, and points every link from one node to
//! another at that link's relay in the nodes' configurations, so every byte between two
//! nodes — gossip, forwarded checks, pulls, handshakes — goes through the proxy.
//!
//! Nothing outlives the harness: dropping [`ChaosCluster`] stops every process (the cluster's
//! drop, which also ends the watchdog that would kill them should this process die), then the
//! proxy.

use std::net::SocketAddr;
use std::ops::{Deref, DerefMut};
use std::time::Duration;

use levee_blackbox::cluster::{Cluster, ClusterSpec as ProcessSpec};
pub use levee_blackbox::cluster::{port_is_free, reachable_of};

use crate::proxy::{FaultProxy, LinkSpec};

/// The regions, in order; node ids are `<region>-1` and `<region>-2`.
pub const REGIONS: [&str; 3] = ["eu", "us", "ap"];
/// Nodes in every region.
pub const NODES_PER_REGION: usize = 2;
/// Nodes in the cluster.
pub const NODES: usize = REGIONS.len() * NODES_PER_REGION;
/// How long a node may take to answer `/readyz` with 200, and the cluster to be fully
/// connected.
pub const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a restarted node may take to answer `/readyz` with 200 (a healthy restart takes
/// well under a second: it pulls from its peers at once).
pub const RESTART_READY_TIMEOUT: Duration = Duration::from_secs(10);

/// What to start.
#[derive(Debug, Clone)]
pub struct ClusterSpec {
    /// The `levee` binary.
    pub binary: std::path::PathBuf,
    /// `[[rule]]` tables every node runs.
    pub rules_toml: String,
    /// `cluster.gossip_interval`, ms.
    pub gossip_interval_ms: u64,
    /// `cluster.suspect_after`, ms.
    pub suspect_after_ms: u64,
    /// `--clock-offset-ms` of every node (index = node), 0 for none.
    pub clock_offsets_ms: [i64; NODES],
    /// The proxy's seed.
    pub seed: u64,
}

/// A running cluster behind its proxy (see the module docs). It dereferences to the
/// [`Cluster`]: processes, HTTP, logs.
#[derive(Debug)]
pub struct ChaosCluster {
    // Dropped in this order: the nodes, then the proxy.
    cluster: Cluster,
    proxy: FaultProxy,
}

/// The index of the relay of link `from → to` among the `NODES × (NODES − 1)` links.
fn link_index(from: usize, to: usize) -> usize {
    from * (NODES - 1) + if to > from { to - 1 } else { to }
}

/// The relay of link `from → to`, the proxy's ports starting at `first_port`.
fn relay(first_port: u16, from: usize, to: usize) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], first_port + link_index(from, to) as u16))
}

impl ChaosCluster {
    /// Lays out and starts the proxy and the cluster, waits until every node is ready, has
    /// dialled every peer (through the proxy) and sees every peer and region reachable.
    pub fn start(spec: ClusterSpec) -> Result<ChaosCluster, String> {
        let mut processes =
            ProcessSpec::new(&spec.binary, &REGIONS, NODES_PER_REGION, &spec.rules_toml);
        processes.gossip_interval_ms = spec.gossip_interval_ms;
        processes.suspect_after_ms = spec.suspect_after_ms;
        processes.clock_offsets_ms = spec.clock_offsets_ms.to_vec();
        processes.ready_timeout = READY_TIMEOUT;
        processes.restart_ready_timeout = RESTART_READY_TIMEOUT;
        // Polling six nodes' metrics is not free on a loaded machine: not too often.
        processes.poll_interval = Duration::from_millis(50);
        processes.dir_prefix = "levee-chaos-".into();
        let links = NODES * (NODES - 1);
        let (cluster, proxy) = Cluster::start_with(
            &processes,
            links as u16,
            |first, from, to| Some(relay(first, from, to)),
            |first, nodes| {
                let mut specs = Vec::with_capacity(links);
                for from in 0..NODES {
                    for (to, target) in nodes.iter().enumerate() {
                        if from != to {
                            specs.push(LinkSpec {
                                from,
                                to,
                                listen: relay(first, from, to),
                                upstream: target.gossip,
                            });
                        }
                    }
                }
                specs.sort_by_key(|l| link_index(l.from, l.to));
                FaultProxy::start(NODES, specs, spec.seed)
                    .map_err(|e| format!("the fault proxy could not bind its ports: {e}"))
            },
        )?;
        Ok(ChaosCluster { cluster, proxy })
    }

    /// The fault proxy.
    pub fn proxy(&self) -> &FaultProxy {
        &self.proxy
    }

    /// The index of `region` in [`REGIONS`].
    pub fn region_index(region: &str) -> usize {
        REGIONS.iter().position(|r| *r == region).unwrap_or(0)
    }
}

impl Deref for ChaosCluster {
    type Target = Cluster;

    fn deref(&self) -> &Cluster {
        &self.cluster
    }
}

impl DerefMut for ChaosCluster {
    fn deref_mut(&mut self) -> &mut Cluster {
        &mut self.cluster
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_directed_link_has_its_own_relay_port() {
        let mut seen = std::collections::BTreeSet::new();
        for from in 0..NODES {
            for to in 0..NODES {
                if from != to {
                    assert!(seen.insert(link_index(from, to)));
                }
            }
        }
        assert_eq!(seen.len(), NODES * (NODES - 1));
        assert_eq!(seen.last().copied(), Some(NODES * (NODES - 1) - 1));
    }
}
