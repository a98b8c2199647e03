//! A multi-region cluster of real `levee serve` processes with the fault proxy on every link.
//!
//! Three regions (`eu`, `us`, `ap`) of two nodes each, laid out with
//! [`LocalCluster::write`]: its `peer_addr(from, to)` closure points every link from one node
//! to another at that link's relay of the [`FaultProxy`], so every byte between two nodes —
//! gossip, forwarded checks, pulls, handshakes — goes through the proxy.
//!
//! Ports are taken below Linux's default ephemeral range (32768–60999) so that no client
//! socket can be sitting on a node's port when it (re)starts: node *k* listens for HTTP on
//! `base + 2k` and QUIC on `base + 2k + 1`, the relays on the 30 ports after the nodes'.
//!
//! Nothing outlives the harness: dropping [`ChaosCluster`] stops every process (SIGCONT,
//! SIGTERM, SIGKILL after a bound) and the proxy; and should the harness's own process die
//! without dropping it, a watchdog shell it started SIGKILLs every pid listed in
//! `<dir>/pids/` once the harness's pid is gone.

use std::fs::File;
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use levee_core::Consistency;
use levee_node::local_cluster::{LocalCluster, LocalNode};
use serde_json::Value;
use tempfile::TempDir;

use crate::client::{self, Reply, View, encode_segment, metric};
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
/// How long a node may take to exit after SIGTERM before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// Ports are picked in `[PORT_FLOOR, PORT_CEILING)`, below the ephemeral range.
const PORT_FLOOR: u32 = 10_000;
const PORT_CEILING: u32 = 32_000;

/// What to start.
#[derive(Debug, Clone)]
pub struct ClusterSpec {
    /// The `levee` binary.
    pub binary: PathBuf,
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

/// One node: where it is, and its process when it runs.
#[derive(Debug)]
struct Member {
    node: LocalNode,
    child: Option<Child>,
    agent: ureq::Agent,
    /// stdout and stderr, appended to across restarts.
    log: PathBuf,
}

/// A running cluster (see the module docs).
#[derive(Debug)]
pub struct ChaosCluster {
    members: Vec<Member>,
    proxy: FaultProxy,
    spec: ClusterSpec,
    base_port: u16,
    port_count: u16,
    pids: Vec<u32>,
    crashes: Vec<String>,
    watchdog: Option<Child>,
    dir: Option<TempDir>,
    keep: bool,
}

/// The index of the relay of link `from → to` among the `NODES × (NODES − 1)` links.
fn link_index(from: usize, to: usize) -> usize {
    from * (NODES - 1) + if to > from { to - 1 } else { to }
}

impl ChaosCluster {
    /// Lays out and starts the cluster, waits until every node is ready, has dialled every
    /// peer (through the proxy) and sees every peer and region reachable.
    pub fn start(spec: ClusterSpec) -> Result<ChaosCluster, String> {
        let dir = tempfile::Builder::new()
            .prefix("levee-chaos-")
            .tempdir()
            .map_err(|e| format!("a temporary directory: {e}"))?;
        let rules: Vec<_> = levee_node::Config::parse(&spec.rules_toml, "chaos rules")
            .map_err(|e| format!("the scenario's rules: {e}"))?
            .rules
            .into_iter()
            .map(|r| r.spec)
            .collect();
        std::fs::create_dir_all(dir.path().join("pids")).map_err(|e| e.to_string())?;
        let watchdog = spawn_watchdog(dir.path())?;
        let links = NODES * (NODES - 1);
        let port_count = (2 * NODES + links) as u16;
        let mut last_error = String::new();
        let mut dir = Some(dir);
        let mut watchdog = Some(watchdog);
        for _attempt in 0..5 {
            let base_port = pick_base_port(port_count)?;
            let layout = LocalCluster {
                regions: REGIONS.iter().map(|r| (*r).to_owned()).collect(),
                nodes_per_region: NODES_PER_REGION,
                base_port,
                mode: Consistency::Strict,
                rules: rules.clone(),
                gossip_interval: format!("{}ms", spec.gossip_interval_ms),
                suspect_after: format!("{}ms", spec.suspect_after_ms),
            };
            let path = dir
                .as_ref()
                .map(|d| d.path().to_owned())
                .unwrap_or_default();
            let nodes = layout.nodes(&path).map_err(|e| e.to_string())?;
            let relay = |from: usize, to: usize| {
                SocketAddr::from((
                    [127, 0, 0, 1],
                    base_port + (2 * NODES + link_index(from, to)) as u16,
                ))
            };
            let mut specs = Vec::with_capacity(links);
            for from in 0..NODES {
                for (to, target) in nodes.iter().enumerate() {
                    if from != to {
                        specs.push(LinkSpec {
                            from,
                            to,
                            listen: relay(from, to),
                            upstream: target.gossip,
                        });
                    }
                }
            }
            specs.sort_by_key(|l| link_index(l.from, l.to));
            let proxy = match FaultProxy::start(NODES, specs, spec.seed) {
                Ok(p) => p,
                Err(e) => {
                    last_error = format!("the fault proxy could not bind its ports: {e}");
                    continue;
                }
            };
            let idx = |n: &LocalNode| nodes.iter().position(|m| m.id == n.id);
            let nodes = layout
                .write(&path, |from, to| match (idx(from), idx(to)) {
                    (Some(f), Some(t)) if f != t => Some(relay(f, t)),
                    _ => None,
                })
                .map_err(|e| format!("lay out the cluster: {e}"))?;
            let mut cluster = ChaosCluster {
                members: nodes
                    .into_iter()
                    .map(|node| Member {
                        log: path.join(format!("{}.log", node.id)),
                        node,
                        child: None,
                        agent: client::agent(Duration::from_secs(5)),
                    })
                    .collect(),
                proxy,
                spec: spec.clone(),
                base_port,
                port_count,
                pids: Vec::new(),
                crashes: Vec::new(),
                watchdog: watchdog.take(),
                dir: dir.take(),
                keep: false,
            };
            let started = (0..NODES).try_for_each(|i| {
                let config = cluster.members[i].node.config.clone();
                cluster.spawn(i, &config)
            });
            let deadline = Instant::now() + READY_TIMEOUT;
            let outcome =
                started.and_then(|()| (0..NODES).try_for_each(|i| cluster.wait_ready(i, deadline)));
            match outcome {
                Ok(()) => {
                    cluster.wait_fully_connected(READY_TIMEOUT)?;
                    return Ok(cluster);
                }
                // Another process took one of the ports between the probe and the bind.
                Err(e) if e.contains("in use") || e.contains("cannot listen") => {
                    last_error = e;
                    cluster.stop_all();
                    cluster.proxy.shutdown();
                    dir = cluster.dir.take();
                    watchdog = cluster.watchdog.take();
                    for m in &cluster.members {
                        let _ = std::fs::remove_file(&m.log);
                    }
                }
                Err(e) => return Err(format!("the cluster did not start: {e}")),
            }
        }
        if let Some(mut w) = watchdog {
            let _ = w.kill();
            let _ = w.wait();
        }
        Err(format!(
            "the cluster did not start after 5 attempts: {last_error}"
        ))
    }

    /// The cluster's directory (configurations, certificates, logs, data).
    pub fn dir(&self) -> &Path {
        self.dir.as_ref().map_or(Path::new("."), |d| d.path())
    }

    /// Keeps the cluster's directory after the drop (for a failed run's post-mortem); returns
    /// its path.
    pub fn keep_files(&mut self) -> PathBuf {
        self.keep = true;
        self.dir().to_owned()
    }

    /// The fault proxy.
    pub fn proxy(&self) -> &FaultProxy {
        &self.proxy
    }

    /// Node `i`'s id.
    pub fn id(&self, i: usize) -> &str {
        &self.members[i].node.id
    }

    /// Node `i`'s region.
    pub fn region_of(&self, i: usize) -> &str {
        &self.members[i].node.region
    }

    /// The index of `region` in [`REGIONS`].
    pub fn region_index(region: &str) -> usize {
        REGIONS.iter().position(|r| *r == region).unwrap_or(0)
    }

    /// The index of node `id`.
    pub fn idx(&self, id: &str) -> Option<usize> {
        self.members.iter().position(|m| m.node.id == id)
    }

    /// The nodes of `region`.
    pub fn nodes_in(&self, region: &str) -> Vec<usize> {
        (0..NODES)
            .filter(|&i| self.region_of(i) == region)
            .collect()
    }

    /// Node `i`'s layout (addresses, configuration file).
    pub fn node(&self, i: usize) -> &LocalNode {
        &self.members[i].node
    }

    /// `http://<node i's HTTP address><path>`.
    pub fn url(&self, i: usize, path: &str) -> String {
        format!("http://{}{path}", self.members[i].node.http)
    }

    /// The range of ports the cluster and its proxy use.
    pub fn ports(&self) -> std::ops::Range<u16> {
        self.base_port..self.base_port + self.port_count
    }

    /// Every pid the cluster ever started.
    pub fn pids(&self) -> &[u32] {
        &self.pids
    }

    /// Whether node `i`'s process is running (as far as the harness knows).
    pub fn is_running(&self, i: usize) -> bool {
        self.members[i].child.is_some()
    }

    /// Nodes that exited without being told to, with their exit status and log tail.
    pub fn crashes(&self) -> &[String] {
        &self.crashes
    }

    /// Looks at every running process: one that has exited is recorded as a crash.
    pub fn check_alive(&mut self) {
        for i in 0..NODES {
            let exited = self.members[i]
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            if let Some(status) = exited {
                let tail = self.log_tail(i, 30);
                self.crashes.push(format!(
                    "{} exited by itself with {status}; log tail:\n{tail}",
                    self.id(i)
                ));
                self.reaped(i);
            }
        }
    }

    /// The last `n` lines of node `i`'s log.
    pub fn log_tail(&self, i: usize, n: usize) -> String {
        let text = std::fs::read_to_string(&self.members[i].log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    // ---- processes ----

    fn pid_file(&self, i: usize) -> PathBuf {
        self.dir()
            .join("pids")
            .join(format!("{}.pid", self.members[i].node.id))
    }

    fn reaped(&mut self, i: usize) {
        self.members[i].child = None;
        let _ = std::fs::remove_file(self.pid_file(i));
    }

    /// Starts node `i` on `config` (its own, or an impostor's) with its clock offset,
    /// logging to its log file. Does not wait.
    pub fn spawn(&mut self, i: usize, config: &Path) -> Result<(), String> {
        if self.members[i].child.is_some() {
            return Err(format!("{} is already running", self.id(i)));
        }
        let log = File::options()
            .create(true)
            .append(true)
            .open(&self.members[i].log)
            .map_err(|e| format!("open {}: {e}", self.members[i].log.display()))?;
        let log2 = log.try_clone().map_err(|e| e.to_string())?;
        let mut cmd = Command::new(&self.spec.binary);
        cmd.arg("serve").arg("--config").arg(config);
        let offset = self.spec.clock_offsets_ms[i];
        if offset != 0 {
            cmd.arg(format!("--clock-offset-ms={offset}"));
        }
        let child = cmd
            .env(
                "LEVEE_LOG",
                std::env::var("LEVEE_LOG").unwrap_or_else(|_| "info".into()),
            )
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(log2)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", self.spec.binary.display()))?;
        let pid = child.id();
        self.pids.push(pid);
        self.members[i].child = Some(child);
        self.members[i].agent = client::agent(Duration::from_secs(5));
        std::fs::write(self.pid_file(i), pid.to_string())
            .map_err(|e| format!("write the pid file: {e}"))?;
        Ok(())
    }

    /// Waits (until `deadline`) for node `i` to answer `/readyz` with 200.
    pub fn wait_ready(&mut self, i: usize, deadline: Instant) -> Result<(), String> {
        loop {
            let exited = self.members[i]
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            if let Some(status) = exited {
                self.reaped(i);
                return Err(format!(
                    "{} exited with {status} before it was ready; log:\n{}",
                    self.id(i),
                    self.log_tail(i, 30)
                ));
            }
            if self.get(i, "/readyz").is_ok_and(|r| r.status == 200) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "{} did not answer /readyz with 200 in time; log:\n{}",
                    self.id(i),
                    self.log_tail(i, 30)
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// How many connections node `i` has dialled to `peer` and completed (`Hello`s exchanged).
    pub fn outbound_connections(&self, i: usize, peer: &str) -> f64 {
        self.metrics(i)
            .ok()
            .and_then(|m| {
                metric(
                    &m,
                    "levee_transport_connections_total",
                    &[("peer", peer), ("direction", "outbound")],
                )
            })
            .unwrap_or(0.0)
    }

    /// Waits until every running node has dialled every other running node and sees every
    /// peer and every region reachable. (Reachability alone is not enough: a node hears a
    /// peer's `Hello` on the connection it dialled, while the peer's own dial may still be
    /// pending.)
    pub fn wait_fully_connected(&self, timeout: Duration) -> Result<(), String> {
        let running: Vec<usize> = (0..NODES).filter(|&i| self.is_running(i)).collect();
        let deadline = Instant::now() + timeout;
        loop {
            let dialled = running.iter().all(|&i| {
                running
                    .iter()
                    .all(|&j| j == i || self.outbound_connections(i, self.id(j)) >= 1.0)
            });
            let reachable = dialled
                && running.iter().all(|&i| {
                    self.status(i).is_ok_and(|s| {
                        all_reachable(&s["peers"], |id| running.iter().any(|&j| self.id(j) == id))
                            && (running.len() < NODES || all_reachable(&s["regions"], |_| true))
                    })
                });
            if reachable {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "not every node is connected to and sees every peer within {timeout:?}:{}",
                    running
                        .iter()
                        .map(|&i| format!(
                            "\n{}: {}",
                            self.id(i),
                            self.status(i).map(|s| s.to_string()).unwrap_or_else(|e| e)
                        ))
                        .collect::<String>()
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `kill -9` node `i`, and reaps it.
    pub fn kill9(&mut self, i: usize) {
        if let Some(mut child) = self.members[i].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.reaped(i);
    }

    /// Stops node `i` with SIGTERM and waits for it (SIGKILL after a bound); its exit status.
    pub fn stop(&mut self, i: usize) -> Option<ExitStatus> {
        let mut child = self.members[i].child.take()?;
        send_signal(child.id(), "CONT");
        send_signal(child.id(), "TERM");
        let status = reap(&mut child, Instant::now() + STOP_TIMEOUT);
        self.reaped(i);
        status
    }

    /// Starts node `i` again on its own configuration, ports and data directory; waits until
    /// it is ready, every other running node has dialled the new process, and every node is
    /// fully connected.
    pub fn start_node(&mut self, i: usize) -> Result<(), String> {
        let id = self.id(i).to_owned();
        let others: Vec<usize> = (0..NODES)
            .filter(|&j| j != i && self.is_running(j))
            .collect();
        let before: Vec<f64> = others
            .iter()
            .map(|&j| self.outbound_connections(j, &id))
            .collect();
        let config = self.members[i].node.config.clone();
        // The port was ours a moment ago; give the kernel a few tries to hand it back.
        let mut last = String::new();
        for _ in 0..5 {
            self.spawn(i, &config)?;
            match self.wait_ready(i, Instant::now() + RESTART_READY_TIMEOUT) {
                Ok(()) => {
                    last.clear();
                    break;
                }
                Err(e) if e.contains("cannot listen") || e.contains("in use") => {
                    last = e;
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(e) => return Err(format!("{id} did not restart: {e}")),
            }
        }
        if !last.is_empty() {
            return Err(format!("{id} did not restart: {last}"));
        }
        let deadline = Instant::now() + READY_TIMEOUT;
        while !others
            .iter()
            .zip(&before)
            .all(|(&j, &b)| self.outbound_connections(j, &id) > b)
        {
            if Instant::now() >= deadline {
                return Err(format!("the other nodes did not reconnect to {id}"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.wait_fully_connected(READY_TIMEOUT)
    }

    /// Stops every process: SIGCONT and SIGTERM to all, then waits for each, SIGKILL after a
    /// bound.
    pub fn stop_all(&mut self) {
        for m in &self.members {
            if let Some(c) = &m.child {
                send_signal(c.id(), "CONT");
                send_signal(c.id(), "TERM");
            }
        }
        let deadline = Instant::now() + STOP_TIMEOUT;
        for i in 0..NODES {
            if let Some(mut child) = self.members[i].child.take() {
                reap(&mut child, deadline);
                self.reaped(i);
            }
        }
    }

    /// Runs `levee <args>` (e.g. `certs init`) to completion.
    pub fn levee(&self, args: &[&std::ffi::OsStr]) -> Result<(), String> {
        let out = Command::new(&self.spec.binary)
            .args(args)
            .output()
            .map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    // ---- HTTP ----

    /// `GET path` on node `i`.
    pub fn get(&self, i: usize, path: &str) -> Result<Reply, String> {
        client::http(&self.members[i].agent, "GET", &self.url(i, path), None)
    }

    /// `GET /v1/usage/{rule}/{key}` on node `i`.
    pub fn usage(&self, i: usize, rule: &str, key: &str) -> Result<Value, String> {
        let r = self.get(
            i,
            &format!("/v1/usage/{}/{}", encode_segment(rule), encode_segment(key)),
        )?;
        if r.status == 200 {
            Ok(r.json)
        } else {
            Err(format!("usage on {}: {} {}", self.id(i), r.status, r.body))
        }
    }

    /// Node `i`'s view of `rule`/`key`.
    pub fn view(&self, i: usize, rule: &str, key: &str) -> Option<View> {
        self.usage(i, rule, key).ok().as_ref().and_then(View::of)
    }

    /// `GET /v1/cluster` on node `i`.
    pub fn status(&self, i: usize) -> Result<Value, String> {
        let r = self.get(i, "/v1/cluster")?;
        if r.status == 200 {
            Ok(r.json)
        } else {
            Err(format!("/v1/cluster on {}: {}", self.id(i), r.status))
        }
    }

    /// `GET /metrics` on node `i`.
    pub fn metrics(&self, i: usize) -> Result<String, String> {
        let r = self.get(i, "/metrics")?;
        if r.status == 200 {
            Ok(r.body)
        } else {
            Err(format!("/metrics on {}: {}", self.id(i), r.status))
        }
    }
}

impl Drop for ChaosCluster {
    fn drop(&mut self) {
        self.stop_all();
        self.proxy.shutdown();
        if let Some(mut watchdog) = self.watchdog.take() {
            let _ = watchdog.kill();
            let _ = watchdog.wait();
        }
        if self.keep
            && let Some(dir) = self.dir.take()
        {
            let _ = dir.keep();
        }
    }
}

/// Whether every entry of a `/v1/cluster` `peers` or `regions` array that `counts` says
/// `reachable: true`.
fn all_reachable(list: &Value, counts: impl Fn(&str) -> bool) -> bool {
    list.as_array().is_some_and(|l| {
        l.iter()
            .filter(|p| counts(p["id"].as_str().or(p["name"].as_str()).unwrap_or("")))
            .all(|p| p["reachable"] == true)
    })
}

/// `reachable` of the entry named `name` (`id` for peers, `name` for regions) of a
/// `/v1/cluster` list.
pub fn reachable_of(list: &Value, name: &str) -> Option<bool> {
    list.as_array()?
        .iter()
        .find(|p| p["id"] == name || p["name"] == name)
        .and_then(|p| p["reachable"].as_bool())
}

/// The first of `count` consecutive ports free on 127.0.0.1 for both TCP and UDP. Candidates
/// start at a place that depends on the process id and move on with every call.
fn pick_base_port(count: u16) -> Result<u16, String> {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let span = PORT_CEILING - PORT_FLOOR - u32::from(count);
    let start = (std::process::id() % 1000) * 20 + 7;
    for _ in 0..2_000 {
        let offset = NEXT.fetch_add(u32::from(count), Ordering::Relaxed);
        let base = PORT_FLOOR + (start + offset) % span;
        if (base..base + u32::from(count)).all(|p| port_is_free(p as u16)) {
            return Ok(base as u16);
        }
    }
    Err(format!(
        "no run of {count} free loopback ports between {PORT_FLOOR} and {PORT_CEILING}"
    ))
}

/// Whether `port` is free on 127.0.0.1 for TCP and UDP.
pub fn port_is_free(port: u16) -> bool {
    TcpListener::bind(("127.0.0.1", port)).is_ok() && UdpSocket::bind(("127.0.0.1", port)).is_ok()
}

/// `kill -<signal> <pid>`; whether it was delivered.
pub fn send_signal(pid: u32, signal: &str) -> bool {
    Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Waits for `child` to exit until `deadline`, then SIGKILLs it; reaps it either way.
fn reap(child: &mut Child, deadline: Instant) -> Option<ExitStatus> {
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            return child.wait().ok();
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A shell that polls this process and, once it is gone, SIGKILLs (after a SIGCONT) every pid
/// listed in `<dir>/pids/`, then removes `dir`.
fn spawn_watchdog(dir: &Path) -> Result<Child, String> {
    const SCRIPT: &str = r#"while kill -0 "$1" 2>/dev/null; do sleep 0.2; done
for f in "$2"/*.pid; do
  [ -f "$f" ] || continue
  p=$(cat "$f")
  kill -CONT "$p" 2>/dev/null
  kill -KILL "$p" 2>/dev/null
done
rm -rf "$3""#;
    Command::new("sh")
        .arg("-c")
        .arg(SCRIPT)
        .arg("levee-chaos-watchdog")
        .arg(std::process::id().to_string())
        .arg(dir.join("pids"))
        .arg(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("start the watchdog: {e}"))
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
