//! What `levee cluster` checks before it writes or starts anything: the region names, the
//! port range, and that every port the nodes will listen on is free.

use std::collections::HashSet;
use std::net::{SocketAddr, TcpListener, UdpSocket};

use levee_node::local_cluster::LocalNode;

use super::{ClusterArgs, Failure};

/// The regions, checked: at least one, each a plain name, none twice.
pub(super) fn check_regions(regions: &[String]) -> Result<(), Failure> {
    if regions.is_empty() {
        return Err(Failure::Usage(
            "--regions: give at least one region name, e.g. --regions eu,us,ap".into(),
        ));
    }
    let mut seen = HashSet::new();
    for r in regions {
        if r.is_empty() {
            return Err(Failure::Usage(
                "--regions: an empty region name; give names separated by commas, e.g. --regions eu,us,ap".into(),
            ));
        }
        if !r
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(Failure::Usage(format!(
                "--regions: {r:?} is not a region name (letters, digits, `-` and `_` only)"
            )));
        }
        if !seen.insert(r.as_str()) {
            return Err(Failure::Usage(format!(
                "--regions: {r:?} is given twice; every region is named once (use --nodes-per-region for more nodes in a region)"
            )));
        }
    }
    Ok(())
}

/// Every port the nodes will listen on must fit below 65536 and be free now: HTTP on TCP,
/// QUIC on UDP, both on 127.0.0.1.
pub(super) fn check_ports(args: &ClusterArgs, nodes: usize) -> Result<(), Failure> {
    let last = u32::from(args.base_port) + 2 * nodes as u32 - 1;
    if args.base_port == 0 || last > u32::from(u16::MAX) {
        return Err(Failure::Usage(format!(
            "--base-port {}: {nodes} nodes need ports {}–{last} (two each: HTTP, QUIC), which must lie within 1–65535",
            args.base_port, args.base_port
        )));
    }
    Ok(())
}

/// Fails naming the first port of `nodes` that another process holds.
pub(super) fn check_free(nodes: &[LocalNode]) -> Result<(), Failure> {
    for n in nodes {
        if let Err(e) = TcpListener::bind(n.http) {
            return Err(Failure::Run(taken(n.http, "HTTP (TCP)", &n.id, &e)));
        }
        if let Err(e) = UdpSocket::bind(n.gossip) {
            return Err(Failure::Run(taken(n.gossip, "QUIC (UDP)", &n.id, &e)));
        }
    }
    Ok(())
}

fn taken(addr: SocketAddr, what: &str, id: &str, e: &std::io::Error) -> String {
    format!(
        "port {} ({what} of node {id}) is not available: {e}; is another levee (or anything else) listening on {addr}? \
         Stop it, or choose other ports with --base-port",
        addr.port()
    )
}
