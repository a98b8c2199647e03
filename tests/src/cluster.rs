//! A multi-region cluster of real `levee serve` processes on loopback, talking real QUIC with
//! mutual TLS, laid out with [`LocalCluster::write`] the way `levee cluster` does: the harness
//! of the cluster tests (`tests/cluster.rs`) and of the chaos suite (`chaos/`).
//!
//! [`Cluster::start`] connects the nodes directly; [`Cluster::start_with`] puts something of
//! the caller's between them (the chaos suite's fault proxy): it reserves ports for it after
//! the nodes', starts it before the nodes, and writes every node's configuration with the peer
//! addresses the caller chooses per directed link. What else differs between clusters (regions,
//! rules, gossip and suspicion intervals, a clock offset per node, how long a restart may take)
//! is in the [`ClusterSpec`].
//!
//! Ports are taken below Linux's default ephemeral range (32768–60999), so that no client
//! socket can be sitting on a node's port when it (re)starts: node *k* (counting region by
//! region) listens for HTTP on `base + 2k` and QUIC on `base + 2k + 1`; the caller's ports
//! follow. Should another process take a port between the probe and the bind, the cluster is
//! laid out again on other ports (five attempts).
//!
//! Nothing outlives the harness: dropping a [`Cluster`] stops every process (SIGCONT, so a
//! frozen one can die; SIGTERM; SIGKILL after a bound) and waits for each. If the thread is
//! panicking (a failing test), it first prints the tail of every node's log, and keeps the
//! cluster's directory. Should the harness's own process die without dropping it (killed by a
//! signal, a closed pipe), a watchdog shell it started SIGKILLs every pid listed in
//! `<dir>/pids/` (where the cluster keeps the pids of its running nodes) once the harness's pid
//! is gone, and removes the directory.

use std::fs::File;
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use levee_node::local_cluster::{Listed, LocalCluster, LocalNode};
use serde::Serialize;
use serde_json::Value;
use tempfile::TempDir;

use crate::{Reply, agent, encode_segment, http, metric, send_signal};

/// Ports are picked in `[PORT_FLOOR, PORT_CEILING)`, below the ephemeral range.
const PORT_FLOOR: u32 = 10_000;
const PORT_CEILING: u32 = 32_000;
/// How long a node may take to exit after SIGTERM before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// How long every HTTP request of the harness may take.
const HTTP_TIMEOUT: Duration = Duration::from_secs(5);

/// What to start.
#[derive(Debug, Clone)]
pub struct ClusterSpec {
    /// The `levee` binary.
    pub binary: PathBuf,
    /// Region names, in order; node ids are `<region>-1`, `<region>-2` …
    pub regions: Vec<String>,
    /// Nodes in every region.
    pub nodes_per_region: usize,
    /// `[[rule]]` tables every node runs.
    pub rules_toml: String,
    /// `cluster.gossip_interval`, ms.
    pub gossip_interval_ms: u64,
    /// `cluster.suspect_after`, ms.
    pub suspect_after_ms: u64,
    /// `--clock-offset-ms` of node *k* (index = node, counting region by region); a missing
    /// entry or 0 runs the node without one.
    pub clock_offsets_ms: Vec<i64>,
    /// How long the cluster may take to be ready, and to be fully connected (at the start and
    /// after a restart).
    pub ready_timeout: Duration,
    /// How long a restarted node may take to answer `/readyz` with 200.
    pub restart_ready_timeout: Duration,
    /// How often the waits for a full mesh and for the peers' redial poll every node's
    /// `/metrics` and `/v1/cluster`.
    pub poll_interval: Duration,
    /// The prefix of the cluster's temporary directory.
    pub dir_prefix: String,
    /// The node list at start, by node index (`None`: every node, in order). Only these
    /// nodes start; the others are laid out (ports, certificates, files) for
    /// [`Cluster::set_list`] to add later.
    pub initial: Option<Vec<usize>>,
    /// Lines added to the `[cluster]` table of node *k*'s configuration (index = node); a
    /// missing or empty entry adds none.
    pub cluster_extra: Vec<String>,
}

impl ClusterSpec {
    /// `regions` of `nodes_per_region` nodes running `rules_toml`, gossiping every 20 ms,
    /// suspecting a peer after 500 ms, no clock offset, 20 s to be ready (after a restart too),
    /// polling every 20 ms.
    pub fn new(
        binary: impl Into<PathBuf>,
        regions: &[&str],
        nodes_per_region: usize,
        rules_toml: &str,
    ) -> ClusterSpec {
        ClusterSpec {
            binary: binary.into(),
            regions: regions.iter().map(|r| (*r).to_owned()).collect(),
            nodes_per_region,
            rules_toml: rules_toml.to_owned(),
            gossip_interval_ms: 20,
            suspect_after_ms: 500,
            clock_offsets_ms: Vec::new(),
            ready_timeout: Duration::from_secs(20),
            restart_ready_timeout: Duration::from_secs(20),
            poll_interval: Duration::from_millis(20),
            dir_prefix: "levee-cluster-".into(),
            initial: None,
            cluster_extra: Vec::new(),
        }
    }

    /// Nodes in the cluster.
    pub fn nodes(&self) -> usize {
        self.regions.len() * self.nodes_per_region
    }
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
pub struct Cluster {
    members: Vec<Member>,
    spec: ClusterSpec,
    base_port: u16,
    port_count: u16,
    pids: Vec<u32>,
    crashes: Vec<String>,
    watchdog: Option<Child>,
    dir: Option<TempDir>,
    keep: bool,
    /// The layout, and where node `from` reaches node `to` (`[from][to]`), for
    /// [`Cluster::set_list`].
    layout: Option<LocalCluster>,
    peer_addrs: Vec<Vec<Option<SocketAddr>>>,
}

/// What a node's `GET /v1/usage/{rule}/{key}` says of a key: the global figure and the
/// per-region ones. Two nodes agree on a key when their views are equal.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct View {
    /// `used`.
    pub used: u64,
    /// `regions`, as JSON.
    pub regions: Value,
}

impl View {
    /// The view in a `/v1/usage` answer, if it is one.
    pub fn of(u: &Value) -> Option<View> {
        Some(View {
            used: u["used"].as_u64()?,
            regions: u["regions"].clone(),
        })
    }
}

/// A `POST /v1/check` answered with a decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decided {
    /// `allowed`.
    pub allowed: bool,
    /// `degraded`.
    pub degraded: bool,
    /// `reset_after_ms`.
    pub reset_after_ms: u64,
}

/// One `POST <url>` of the check `body`: the decision, or why there was none (no answer, not
/// a 200, not a decision).
pub fn decide(agent: &ureq::Agent, url: &str, body: &str) -> Result<Decided, String> {
    let r = http(agent, "POST", url, Some(body))?;
    if r.status != 200 {
        return Err(format!("{}: {}", r.status, r.body));
    }
    match (
        r.json["allowed"].as_bool(),
        r.json["degraded"].as_bool(),
        r.json["reset_after_ms"].as_u64(),
    ) {
        (Some(allowed), Some(degraded), Some(reset_after_ms)) => Ok(Decided {
            allowed,
            degraded,
            reset_after_ms,
        }),
        _ => Err(format!("not a decision: {}", r.body)),
    }
}

/// Which window an allowed `fixed_window` decision was made in, from its round trip
/// `[sent, received]` (ms, on the decider's clock) and its `reset_after_ms`: the decision
/// answers `end of its window − now` with `now` in the round trip, so the window's end is the
/// one multiple of `window_ms` in `[sent + reset, received + reset]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attribution {
    /// The window's index (`start / window_ms`).
    Window(i64),
    /// The interval holds two window ends (a round trip longer than a window).
    Straddling,
    /// The interval holds no window end: the answer contradicts the clock.
    Unattributable,
}

/// See [`Attribution`].
pub fn attribute(
    sent_ms: i64,
    received_ms: i64,
    reset_after_ms: u64,
    window_ms: u64,
) -> Attribution {
    let w = window_ms as i64;
    let lo = sent_ms + reset_after_ms as i64;
    let hi = received_ms + reset_after_ms as i64;
    // The least multiple of w at or above lo.
    let end = (lo + w - 1).div_euclid(w) * w;
    if end > hi {
        Attribution::Unattributable
    } else if end + w <= hi {
        Attribution::Straddling
    } else {
        Attribution::Window(end / w - 1)
    }
}

impl Cluster {
    /// Lays out and starts the cluster, every node reaching its peers directly; waits until
    /// every node is ready, has dialled every peer and sees every peer and region reachable.
    pub fn start(spec: &ClusterSpec) -> Result<Cluster, String> {
        Cluster::start_with(spec, 0, |_, _, _| None, |_, _| Ok(())).map(|(c, ())| c)
    }

    /// Like [`Cluster::start`], with something of the caller's between the nodes. For every
    /// layout attempt, `between(first_port, nodes)` starts it on the `ports` ports from
    /// `first_port` (right after the nodes'), knowing every node's addresses; an `Err` means a
    /// port was taken, and the cluster is laid out again elsewhere. `peer_addr(first_port,
    /// from, to)` is where node `from` reaches node `to` (`None`: `to`'s own QUIC address).
    /// Returns the cluster and what `between` started; drop the cluster first.
    pub fn start_with<N>(
        spec: &ClusterSpec,
        ports: u16,
        peer_addr: impl Fn(u16, usize, usize) -> Option<SocketAddr>,
        mut between: impl FnMut(u16, &[LocalNode]) -> Result<N, String>,
    ) -> Result<(Cluster, N), String> {
        let dir = tempfile::Builder::new()
            .prefix(&spec.dir_prefix)
            .tempdir()
            .map_err(|e| format!("a temporary directory: {e}"))?;
        let rules: Vec<_> = levee_node::Config::parse(&spec.rules_toml, "cluster rules")
            .map_err(|e| format!("the cluster's rules: {e}"))?
            .rules
            .into_iter()
            .map(|r| r.spec)
            .collect();
        std::fs::create_dir_all(dir.path().join("pids"))
            .map_err(|e| format!("the pid directory: {e}"))?;
        let watchdog = spawn_watchdog(dir.path())?;
        let nodes = spec.nodes();
        let port_count = (2 * nodes) as u16 + ports;
        let mut cluster = Cluster {
            members: Vec::new(),
            spec: spec.clone(),
            base_port: 0,
            port_count,
            pids: Vec::new(),
            crashes: Vec::new(),
            watchdog: Some(watchdog),
            dir: Some(dir),
            keep: false,
            layout: None,
            peer_addrs: Vec::new(),
        };
        let mut last_error = String::new();
        for _attempt in 0..5 {
            let base_port = pick_base_port(port_count)?;
            let first_port = base_port + (2 * nodes) as u16;
            cluster.base_port = base_port;
            let layout = LocalCluster {
                regions: spec.regions.clone(),
                nodes_per_region: spec.nodes_per_region,
                base_port,
                rules: rules.clone(),
                notify: Vec::new(),
                added: Vec::new(),
                gossip_interval: format!("{}ms", spec.gossip_interval_ms),
                suspect_after: format!("{}ms", spec.suspect_after_ms),
                // A topology is set per node through `cluster_extra`.
                gossip_topology: Default::default(),
            };
            let path = cluster.dir().to_owned();
            let planned = layout.nodes(&path).map_err(|e| e.to_string())?;
            let network = match between(first_port, &planned) {
                Ok(n) => n,
                Err(e) => {
                    last_error = e;
                    continue;
                }
            };
            cluster.peer_addrs = (0..nodes)
                .map(|f| {
                    (0..nodes)
                        .map(|t| (f != t).then(|| peer_addr(first_port, f, t)).flatten())
                        .collect()
                })
                .collect();
            let initial: Vec<usize> = spec.initial.clone().unwrap_or_else(|| (0..nodes).collect());
            let list: Vec<Listed> = initial
                .iter()
                .map(|&node| Listed {
                    node,
                    removed: false,
                })
                .collect();
            cluster.layout = Some(layout);
            let written = cluster.write_list(&list)?;
            cluster.members = written
                .into_iter()
                .map(|node| Member {
                    log: path.join(format!("{}.log", node.id)),
                    node,
                    child: None,
                    agent: agent(HTTP_TIMEOUT),
                })
                .collect();
            let started = initial.iter().try_for_each(|&i| {
                let config = cluster.members[i].node.config.clone();
                cluster.spawn(i, &config)
            });
            let deadline = Instant::now() + spec.ready_timeout;
            let outcome = started.and_then(|()| {
                initial
                    .iter()
                    .try_for_each(|&i| cluster.wait_ready(i, deadline))
            });
            match outcome {
                Ok(()) => {
                    if let Err(e) = cluster.wait_fully_connected(spec.ready_timeout) {
                        drop(cluster);
                        return Err(e);
                    }
                    return Ok((cluster, network));
                }
                // Another process took one of the ports between the probe and the bind.
                Err(e) if e.contains("in use") || e.contains("cannot listen") => {
                    last_error = e;
                    cluster.stop_all();
                    drop(network);
                    for m in &cluster.members {
                        let _ = std::fs::remove_file(&m.log);
                    }
                }
                Err(e) => {
                    drop(cluster);
                    return Err(format!("the cluster did not start: {e}"));
                }
            }
        }
        Err(format!(
            "the cluster did not start after 5 attempts: {last_error}"
        ))
    }

    /// Writes the node list `list` into every node's configuration file (members and not;
    /// see [`LocalCluster::write_list`]). Nothing is reloaded or started: send the members
    /// `SIGHUP`, start the new nodes with [`Cluster::start_node`].
    pub fn set_list(&mut self, list: &[Listed]) -> Result<(), String> {
        self.write_list(list).map(|_| ())
    }

    fn write_list(&self, list: &[Listed]) -> Result<Vec<LocalNode>, String> {
        let layout = self.layout.as_ref().ok_or("no layout")?;
        let planned = layout
            .nodes(self.dir())
            .map_err(|e| format!("lay out the cluster: {e}"))?;
        let idx = |n: &LocalNode| planned.iter().position(|m| m.id == n.id);
        let written = layout
            .write_list(
                self.dir(),
                |from, to| match (idx(from), idx(to)) {
                    (Some(f), Some(t)) => self.peer_addrs[f][t],
                    _ => None,
                },
                list,
            )
            .map_err(|e| format!("lay out the cluster: {e}"))?;
        for (node, extra) in written.iter().zip(&self.spec.cluster_extra) {
            if extra.is_empty() {
                continue;
            }
            let path = &node.config;
            let text =
                std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
            let text = text.replacen("[cluster]\n", &format!("[cluster]\n{extra}\n"), 1);
            std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))?;
        }
        Ok(written)
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

    /// The specification the cluster was started from.
    pub fn spec(&self) -> &ClusterSpec {
        &self.spec
    }

    /// Nodes in the cluster.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether the cluster has no node.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Node `i`'s id.
    pub fn id(&self, i: usize) -> &str {
        &self.members[i].node.id
    }

    /// Node `i`'s region.
    pub fn region_of(&self, i: usize) -> &str {
        &self.members[i].node.region
    }

    /// The index of node `id`.
    pub fn idx(&self, id: &str) -> Option<usize> {
        self.members.iter().position(|m| m.node.id == id)
    }

    /// The nodes of `region`.
    pub fn nodes_in(&self, region: &str) -> Vec<usize> {
        (0..self.len())
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

    /// The range of ports the cluster (and what is between its nodes) uses.
    pub fn ports(&self) -> std::ops::Range<u16> {
        self.base_port..self.base_port + self.port_count
    }

    /// Every pid the cluster ever started.
    pub fn pids(&self) -> &[u32] {
        &self.pids
    }

    /// Node `i`'s pid, if it is running.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.members[i].child.as_ref().map(Child::id)
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
        for i in 0..self.len() {
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
        tail(&self.members[i].log, n)
    }

    // ---- processes ----

    fn pid_file(&self, i: usize) -> PathBuf {
        self.dir()
            .join("pids")
            .join(format!("{}.pid", self.members[i].node.id))
    }

    /// Node `i`'s process has been reaped: the watchdog must not signal its pid any more.
    fn reaped(&mut self, i: usize) {
        self.members[i].child = None;
        let _ = std::fs::remove_file(self.pid_file(i));
    }

    /// Starts node `i` on `config` (its own, or an impostor's) with its clock offset, logging
    /// to its log file. Does not wait. `LEVEE_LOG` (default `info`) is passed on.
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
        let offset = self.spec.clock_offsets_ms.get(i).copied().unwrap_or(0);
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
        self.members[i].agent = agent(HTTP_TIMEOUT);
        std::fs::write(self.pid_file(i), pid.to_string())
            .map_err(|e| format!("write the pid file: {e}"))?;
        Ok(())
    }

    /// Waits (until `deadline`) for node `i` to answer `/readyz` with 200; `Err` with the tail
    /// of its log if it exits first or the deadline passes.
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

    /// How many connections node `i` has dialled to `peer` and completed (`Hello`s
    /// exchanged); 0 if its metrics do not answer.
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

    /// Waits until every running node has dialled every other running node (and completed the
    /// `Hello` exchange) and sees every running peer reachable, and every region too when
    /// every node runs.
    ///
    /// Reachability alone is not enough: a node hears a peer's `Hello` on the connection *it*
    /// dialled, so it may show the peer reachable while the peer's own dial to it is still
    /// pending — and its frames with it — and then mark it unreachable again after
    /// `suspect_after`.
    pub fn wait_fully_connected(&self, timeout: Duration) -> Result<(), String> {
        let running: Vec<usize> = (0..self.len()).filter(|&i| self.is_running(i)).collect();
        let all = running.len() == self.len();
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
                            && (!all || all_reachable(&s["regions"], |_| true))
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
            std::thread::sleep(self.spec.poll_interval);
        }
    }

    /// Sends `signal` (`"STOP"`, `"CONT"` …) to node `i`'s process; after `"STOP"`, once
    /// the process is stopped ([`send_signal`]).
    pub fn signal(&self, i: usize, signal: &str) -> Result<(), String> {
        let pid = self
            .pid(i)
            .ok_or_else(|| format!("{} is not running", self.id(i)))?;
        if send_signal(pid, signal) {
            Ok(())
        } else {
            Err(format!(
                "kill -{signal} {pid} ({}) failed, or the process was not stopped within 5 s",
                self.id(i)
            ))
        }
    }

    /// `kill -9` node `i`, and reaps it.
    pub fn kill9(&mut self, i: usize) -> Result<(), String> {
        let mut child = self.members[i]
            .child
            .take()
            .ok_or_else(|| format!("{} is not running", self.id(i)))?;
        let killed = child.kill();
        let reaped = child.wait();
        self.reaped(i);
        killed.map_err(|e| format!("SIGKILL {}: {e}", self.id(i)))?;
        reaped.map_err(|e| format!("reap the killed {}: {e}", self.id(i)))?;
        Ok(())
    }

    /// Stops node `i` with SIGTERM (after a SIGCONT) and waits for it (SIGKILL after a
    /// bound); its exit status, `None` if it was not running.
    pub fn stop(&mut self, i: usize) -> Option<ExitStatus> {
        let mut child = self.members[i].child.take()?;
        send_signal(child.id(), "CONT");
        send_signal(child.id(), "TERM");
        let status = reap(&mut child, Instant::now() + STOP_TIMEOUT);
        self.reaped(i);
        status
    }

    /// Starts node `i` again on its own configuration, ports and data directory (it must not
    /// be running) and waits until it is ready ([`ClusterSpec::restart_ready_timeout`]).
    ///
    /// Then waits until every other running node has dialled the new process (their old
    /// connections to the previous one count for nothing) and every node is fully connected.
    pub fn start_node(&mut self, i: usize) -> Result<(), String> {
        let id = self.id(i).to_owned();
        let others: Vec<usize> = (0..self.len())
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
            match self.wait_ready(i, Instant::now() + self.spec.restart_ready_timeout) {
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
        let deadline = Instant::now() + self.spec.ready_timeout;
        while !others
            .iter()
            .zip(&before)
            .all(|(&j, &b)| self.outbound_connections(j, &id) > b)
        {
            if Instant::now() >= deadline {
                return Err(format!(
                    "the other nodes did not reconnect to the restarted {id}"
                ));
            }
            std::thread::sleep(self.spec.poll_interval);
        }
        self.wait_fully_connected(self.spec.ready_timeout)
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
        for i in 0..self.len() {
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
            .map_err(|e| format!("run levee: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "levee {:?} failed: {}",
                args,
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }

    /// An impostor of node `i`, laid out in `<dir>/rogue/`: a CA of its own, a certificate
    /// for `i`'s id from it, and otherwise `i`'s configuration (same addresses, same peers),
    /// with a data directory of its own. Returns the configuration's path, for
    /// [`Cluster::spawn`].
    pub fn write_impostor(&self, i: usize) -> Result<PathBuf, String> {
        let id = self.id(i);
        let rogue = self.dir().join("rogue");
        std::fs::create_dir_all(&rogue).map_err(|e| format!("the impostor's directory: {e}"))?;
        let r = rogue.as_os_str();
        self.levee(&["certs".as_ref(), "init".as_ref(), "--out".as_ref(), r])?;
        self.levee(&[
            "certs".as_ref(),
            "issue".as_ref(),
            "--ca".as_ref(),
            r,
            "--node".as_ref(),
            id.as_ref(),
            "--out".as_ref(),
            r,
        ])?;
        let real = std::fs::read_to_string(&self.node(i).config)
            .map_err(|e| format!("{id}'s configuration: {e}"))?;
        let rogue_config: String = real
            .lines()
            .map(|l| {
                if l.starts_with("tls = ") {
                    format!(
                        "tls = {{ ca = \"{}\", cert = \"{}\", key = \"{}\" }}",
                        rogue.join("ca.pem").display(),
                        rogue.join(format!("{id}.pem")).display(),
                        rogue.join(format!("{id}.key")).display()
                    )
                } else if l.starts_with("data_dir = ") {
                    format!("data_dir = \"{}\"", rogue.join("data").display())
                } else {
                    l.to_owned()
                }
            })
            .map(|l| l + "\n")
            .collect();
        if !rogue_config.contains(&*rogue.to_string_lossy()) {
            return Err("the impostor's configuration names no foreign certificate".into());
        }
        let path = rogue.join(format!("{id}.toml"));
        std::fs::write(&path, rogue_config)
            .map_err(|e| format!("write the impostor's configuration: {e}"))?;
        Ok(path)
    }

    // ---- HTTP ----

    /// `GET path` on node `i`; `Err` if there was no answer.
    pub fn get(&self, i: usize, path: &str) -> Result<Reply, String> {
        http(&self.members[i].agent, "GET", &self.url(i, path), None)
    }

    /// `POST path` of a JSON `body` on node `i`; `Err` if there was no answer.
    pub fn post(&self, i: usize, path: &str, body: &str) -> Result<Reply, String> {
        http(
            &self.members[i].agent,
            "POST",
            &self.url(i, path),
            Some(body),
        )
    }

    /// `method path` with a JSON `body` (or none) and extra headers on node `i`; `Err` if
    /// there was no answer.
    pub fn request(
        &self,
        i: usize,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&str>,
    ) -> Result<Reply, String> {
        let mut req = ureq::http::Request::builder()
            .method(method)
            .uri(self.url(i, path));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let result = match body {
            Some(b) => self.members[i].agent.run(
                req.header("content-type", "application/json")
                    .body(b.as_bytes().to_vec())
                    .map_err(|e| e.to_string())?,
            ),
            None => self.members[i]
                .agent
                .run(req.body(()).map_err(|e| e.to_string())?),
        };
        let resp = result.map_err(|e| format!("{method} {path} on {}: {e}", self.id(i)))?;
        Reply::read(resp).map_err(|e| e.to_string())
    }

    /// `GET /v1/usage/{rule}/{key}` on node `i`; `Err` unless 200.
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

    /// Waits until every node of `nodes` reports the same view of `rule`/`key` (its `used`
    /// and per-region figures) and `accept` holds for it; returns that view, or, after
    /// `timeout`, what each node reported last.
    pub fn wait_agreement(
        &self,
        nodes: &[usize],
        rule: &str,
        key: &str,
        timeout: Duration,
        accept: impl Fn(&View) -> bool,
    ) -> Result<View, String> {
        let mut last: Vec<Option<View>> = Vec::new();
        let agreed = crate::wait_until(timeout, || {
            last = nodes.iter().map(|&i| self.view(i, rule, key)).collect();
            last.windows(2).all(|w| w[0] == w[1]) && last[0].as_ref().is_some_and(&accept)
        });
        // The error lists every node's view: take the first without removing it.
        match last.first().cloned().flatten() {
            Some(view) if agreed => Ok(view),
            _ => Err(format!(
                "{rule}/{key}: the nodes {:?} do not agree on an acceptable view within \
                 {timeout:?}: {last:?}",
                nodes.iter().map(|&i| self.id(i)).collect::<Vec<_>>()
            )),
        }
    }

    /// `GET /v1/cluster` on node `i`; `Err` unless 200.
    pub fn status(&self, i: usize) -> Result<Value, String> {
        let r = self.get(i, "/v1/cluster")?;
        if r.status == 200 {
            Ok(r.json)
        } else {
            Err(format!(
                "/v1/cluster on {}: {} {}",
                self.id(i),
                r.status,
                r.body
            ))
        }
    }

    /// `GET /metrics` on node `i`; `Err` unless 200.
    pub fn metrics(&self, i: usize) -> Result<String, String> {
        let r = self.get(i, "/metrics")?;
        if r.status == 200 {
            Ok(r.body)
        } else {
            Err(format!("/metrics on {}: {}", self.id(i), r.status))
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let failing = std::thread::panicking();
        if failing {
            for m in &self.members {
                eprintln!(
                    "----- {} ({}) log tail -----\n{}",
                    m.node.id,
                    m.log.display(),
                    tail(&m.log, 40)
                );
            }
        }
        self.stop_all();
        if let Some(mut watchdog) = self.watchdog.take() {
            let _ = watchdog.kill();
            let _ = watchdog.wait();
        }
        if (failing || self.keep)
            && let Some(dir) = self.dir.take()
        {
            let kept = dir.keep();
            if failing {
                eprintln!("cluster files kept in {}", kept.display());
            }
        }
    }
}

/// Whether every entry of a `/v1/cluster` `peers` or `regions` array that `counts` (given its
/// `id` or `name`) says `reachable: true`.
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

/// The first of `count` consecutive ports free on 127.0.0.1 for both TCP (HTTP) and UDP
/// (QUIC). Candidates start at a place that depends on the process id and move on with every
/// call, so concurrent processes rarely even probe the same ports.
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

/// The last `n` lines of a file.
fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
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
        .arg("levee-cluster-watchdog")
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
    fn an_admission_is_attributed_to_the_one_window_end_its_round_trip_allows() {
        // Decided between 1 990 and 2 010 with 500 ms left: the window ends between 2 490 and
        // 2 510, so at 2 500, the one multiple of 500 there: the window [2 000, 2 500).
        assert_eq!(attribute(1_990, 2_010, 500, 500), Attribution::Window(4));
        assert_eq!(attribute(1_990, 2_010, 995, 1_000), Attribution::Window(2));
        // No multiple of 1 000 in [2 600, 2 700].
        assert_eq!(
            attribute(2_100, 2_200, 500, 1_000),
            Attribution::Unattributable
        );
        // Two window ends in [1 000, 2 100]: a round trip longer than a window.
        assert_eq!(attribute(900, 2_000, 100, 1_000), Attribution::Straddling);
        // A skewed decider's clock can be before the epoch.
        assert_eq!(attribute(-300, -250, 280, 1_000), Attribution::Window(-1));
    }
}
