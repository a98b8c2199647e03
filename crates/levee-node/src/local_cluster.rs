//! A local multi-region cluster on 127.0.0.1: certificates and one configuration per node,
//! written to a directory. `levee cluster` starts a process per node from them; tests do the
//! same and can then stop, freeze or kill any one of them.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use levee_core::RuleSpec;
use serde::Serialize;

/// What to lay out.
#[derive(Debug, Clone)]
pub struct LocalCluster {
    /// Region names, in order.
    pub regions: Vec<String>,
    /// Nodes in every region.
    pub nodes_per_region: usize,
    /// Node *k* (counting region by region, then the appended nodes) listens for HTTP on
    /// `base_port + 2k` and for QUIC on `base_port + 2k + 1`.
    pub base_port: u16,
    /// The regions of nodes appended after the initial layout (`levee cluster add`), in
    /// order: they follow the initial nodes in [`LocalCluster::nodes`], each numbered on from
    /// the highest of its region so far (`eu-3` after `eu-1`, `eu-2`).
    pub added: Vec<String>,
    /// The rules every node runs.
    pub rules: Vec<RuleSpec>,
    /// The `[[notify]]` tables every node runs (threshold notices).
    pub notify: Vec<crate::config::NotifySection>,
    /// `cluster.gossip_interval`, e.g. `"20ms"`.
    pub gossip_interval: String,
    /// `cluster.suspect_after`, e.g. `"1s"`.
    pub suspect_after: String,
    /// `cluster.gossip_topology` (written only when it is not the default, `mesh`).
    pub gossip_topology: crate::config::GossipTopology,
}

/// One node's files and addresses.
#[derive(Debug, Clone)]
pub struct LocalNode {
    /// Node id, `<region>-<n>`.
    pub id: String,
    /// Region.
    pub region: String,
    /// HTTP address.
    pub http: SocketAddr,
    /// QUIC address.
    pub gossip: SocketAddr,
    /// Its configuration file.
    pub config: PathBuf,
}

/// Why the cluster could not be laid out.
#[derive(Debug, thiserror::Error)]
pub enum LocalClusterError {
    /// Certificates could not be made.
    #[error("certificates: {0}")]
    Certs(#[from] levee_transport::certs::CertError),
    /// A file could not be written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The ports do not fit.
    #[error("--base-port {0} leaves no room for every node's two ports")]
    Ports(u16),
    /// The rules could not be written.
    #[error("rules: {0}")]
    Rules(String),
    /// A node list names a node the layout does not have.
    #[error("the node list names node {0}, the layout has {1}")]
    List(usize, usize),
}

/// One entry of a node list ([`LocalCluster::write_list`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Listed {
    /// The node, by its index in [`LocalCluster::nodes`].
    pub node: usize,
    /// Marked `removed = true`.
    pub removed: bool,
}

#[derive(Serialize)]
struct Rules<'a> {
    rule: &'a [RuleSpec],
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    notify: &'a [crate::config::NotifySection],
}

impl LocalCluster {
    /// The nodes, in agreed order: region by region, then the appended ones.
    pub fn nodes(&self, dir: &Path) -> Result<Vec<LocalNode>, LocalClusterError> {
        let mut out = Vec::new();
        for region in &self.regions {
            for i in 1..=self.nodes_per_region {
                out.push(self.node(dir, out.len(), region, i)?);
            }
        }
        for (j, region) in self.added.iter().enumerate() {
            let before = self.added[..j].iter().filter(|r| *r == region).count();
            let n = before
                + if self.regions.contains(region) {
                    self.nodes_per_region
                } else {
                    0
                };
            out.push(self.node(dir, out.len(), region, n + 1)?);
        }
        Ok(out)
    }

    /// Node `k` of the layout: `<region>-<i>`, its files and ports.
    fn node(
        &self,
        dir: &Path,
        k: usize,
        region: &str,
        i: usize,
    ) -> Result<LocalNode, LocalClusterError> {
        let port = |off: u32| {
            u32::try_from(k)
                .ok()
                .and_then(|k| u16::try_from(u32::from(self.base_port) + 2 * k + off).ok())
                .ok_or(LocalClusterError::Ports(self.base_port))
        };
        let id = format!("{region}-{i}");
        Ok(LocalNode {
            config: dir.join(format!("{id}.toml")),
            http: SocketAddr::from(([127, 0, 0, 1], port(0)?)),
            gossip: SocketAddr::from(([127, 0, 0, 1], port(1)?)),
            id,
            region: region.to_owned(),
        })
    }

    /// How many nodes the layout has: the initial ones and the appended ones.
    pub fn len(&self) -> usize {
        self.regions.len() * self.nodes_per_region + self.added.len()
    }

    /// Whether the layout has no node.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Writes the CA, node certificates and configurations into `dir`. `peer_addr(from, to)`
    /// may override where node `from` reaches node `to` (a proxy); `None` keeps `to`'s own
    /// QUIC address.
    pub fn write(
        &self,
        dir: &Path,
        peer_addr: impl Fn(&LocalNode, &LocalNode) -> Option<SocketAddr>,
    ) -> Result<Vec<LocalNode>, LocalClusterError> {
        let all: Vec<Listed> = (0..self.len())
            .map(|node| Listed {
                node,
                removed: false,
            })
            .collect();
        self.write_list(dir, peer_addr, &all)
    }

    /// [`LocalCluster::write`] with the node list `list` in every configuration, in that
    /// order: the layout's nodes (by index in [`LocalCluster::nodes`]) that are members, a
    /// removed one marked `removed = true`. Every node's file is written, members or not, so
    /// that a node can be started, or reloaded, on it. Growing a running cluster is writing
    /// a list that appends to the previous one, then reloading the members and starting the
    /// new nodes (docs/membership.md).
    pub fn write_list(
        &self,
        dir: &Path,
        peer_addr: impl Fn(&LocalNode, &LocalNode) -> Option<SocketAddr>,
        list: &[Listed],
    ) -> Result<Vec<LocalNode>, LocalClusterError> {
        let io = |path: &Path| {
            let path = path.to_owned();
            move |source| LocalClusterError::Io { path, source }
        };
        let certs = dir.join("certs");
        std::fs::create_dir_all(&certs).map_err(io(&certs))?;
        if !certs.join(levee_transport::certs::CA_CERT_FILE).exists() {
            levee_transport::certs::init_ca(&certs)?;
        }
        let nodes = self.nodes(dir)?;
        for n in &nodes {
            if !certs.join(format!("{}.pem", n.id)).exists() {
                levee_transport::certs::issue(&certs, &n.id, &certs)?;
            }
        }
        let rules = toml::to_string(&Rules {
            rule: &self.rules,
            notify: &self.notify,
        })
        .map_err(|e| LocalClusterError::Rules(e.to_string()))?;
        let regions: Vec<String> = self.regions.iter().map(|r| format!("{r} = 1")).collect();
        for n in &nodes {
            let data = dir.join(&n.id).join("data");
            let mut text = format!(
                "# Generated by `levee cluster`.\n[node]\nid = \"{id}\"\nregion = \"{region}\"\nhttp = \"{http}\"\ngossip = \"{gossip}\"\ndata_dir = \"{data}\"\n\n\
                 [cluster]\ngossip_interval = \"{gi}\"\nsuspect_after = \"{sa}\"\nregions = {{ {regions} }}\n\
                 tls = {{ ca = \"{ca}\", cert = \"{cert}\", key = \"{key}\" }}\n",
                id = n.id,
                region = n.region,
                http = n.http,
                gossip = n.gossip,
                data = data.display(),
                gi = self.gossip_interval,
                sa = self.suspect_after,
                regions = regions.join(", "),
                ca = certs.join(levee_transport::certs::CA_CERT_FILE).display(),
                cert = certs.join(format!("{}.pem", n.id)).display(),
                key = certs.join(format!("{}.key", n.id)).display(),
            );
            if self.gossip_topology == crate::config::GossipTopology::Regions {
                text.push_str("gossip_topology = \"regions\"\n");
            }
            for listed in list {
                let Some(other) = nodes.get(listed.node) else {
                    return Err(LocalClusterError::List(listed.node, nodes.len()));
                };
                let addr = peer_addr(n, other).unwrap_or(other.gossip);
                text.push_str(&format!(
                    "\n[[cluster.node]]\nid = \"{}\"\nregion = \"{}\"\naddr = \"{addr}\"\nhttp = \"{}\"\n{}",
                    other.id,
                    other.region,
                    other.http,
                    if listed.removed { "removed = true\n" } else { "" }
                ));
            }
            text.push('\n');
            text.push_str(&rules);
            std::fs::write(&n.config, text).map_err(io(&n.config))?;
        }
        Ok(nodes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_node_runs_the_rules_notices_and_gossip_topology_it_was_given() {
        let source = crate::Config::parse(
            "[[rule]]\nname = \"s\"\nalgorithm = \"fixed_window\"\nlimit = 10\nwindow = \"1m\"\n\n\
             [[notify]]\nurl = \"http://127.0.0.1:9/hook\"\nthresholds = [0.5]\n",
            "t.toml",
        )
        .expect("valid");
        let spec = LocalCluster {
            regions: vec!["eu".into(), "us".into()],
            nodes_per_region: 1,
            base_port: 19_900,
            rules: source.rules.iter().map(|r| r.spec.clone()).collect(),
            notify: source.notify.clone(),
            added: Vec::new(),
            gossip_interval: "20ms".into(),
            suspect_after: "1s".into(),
            gossip_topology: crate::config::GossipTopology::Mesh,
        };
        for topology in [
            crate::config::GossipTopology::Mesh,
            crate::config::GossipTopology::Regions,
        ] {
            let spec = LocalCluster {
                gossip_topology: topology,
                ..spec.clone()
            };
            let dir = tempfile::tempdir().expect("tempdir");
            let nodes = spec.write(dir.path(), |_, _| None).expect("written");
            assert_eq!(nodes.len(), 2);
            for n in &nodes {
                let config = crate::Config::load(&n.config).expect("a node's configuration loads");
                assert_eq!(config.rules.len(), 1, "{}", n.id);
                assert_eq!(config.notify, source.notify, "{}", n.id);
                let cluster = config.cluster.as_ref().expect("a [cluster] section");
                assert_eq!(cluster.gossip_topology, topology, "{}", n.id);
            }
        }
    }

    #[test]
    fn appended_nodes_follow_the_initial_ones_numbered_on_in_their_region() {
        let spec = LocalCluster {
            regions: vec!["eu".into(), "us".into()],
            nodes_per_region: 2,
            base_port: 19_900,
            rules: Vec::new(),
            notify: Vec::new(),
            added: vec!["us".into(), "eu".into(), "us".into()],
            gossip_interval: "20ms".into(),
            suspect_after: "1s".into(),
            gossip_topology: crate::config::GossipTopology::Mesh,
        };
        let nodes = spec.nodes(Path::new("d")).expect("laid out");
        let ids: Vec<&str> = nodes.iter().map(|n| n.id.as_str()).collect();
        assert_eq!(
            ids,
            ["eu-1", "eu-2", "us-1", "us-2", "us-3", "eu-3", "us-4"]
        );
        assert_eq!(spec.len(), nodes.len());
        for (k, n) in nodes.iter().enumerate() {
            assert_eq!(n.http.port(), 19_900 + 2 * k as u16, "{}", n.id);
            assert_eq!(n.gossip.port(), 19_901 + 2 * k as u16, "{}", n.id);
        }
        assert_eq!(nodes[5].region, "eu");
        assert_eq!(nodes[5].config, Path::new("d").join("eu-3.toml"));
    }
}
