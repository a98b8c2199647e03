//! `levee cluster`: a local multi-region cluster of real `levee serve` processes.
//!
//! Everything that can be checked is checked before anything is written or started: the
//! region names (no duplicates), the port range, and that every port the nodes will listen on
//! (HTTP over TCP, QUIC over UDP) is free. The children are then started, and the cluster is
//! announced once every node answers `/readyz`. Should a node exit (at the start, or later:
//! killed, crashed), the cluster says which, prints the tail of its log while the log still
//! exists, stops the others and exits 1. Children are only ever signalled through their own
//! `Child` handles, and only while they have not been reaped, so a signal can never reach a
//! process that is not one of them.
//!
//! While it runs, `levee cluster add | remove | restart` change it through a Unix socket in
//! its directory ([`control`]); a node stopped by one of them is expected to exit.

mod change;
mod checks;
mod control;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use clap::Args;
use levee_node::local_cluster::{LocalCluster, LocalNode};

use checks::{check_free, check_ports, check_regions};
pub(crate) use control::ClusterCommand;

/// How long the nodes may take to answer `/readyz` with 200.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a node may take to exit after SIGTERM before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// Log lines printed of a node that failed.
const TAIL_LINES: usize = 20;

/// Arguments of `levee cluster`: with no subcommand, run a cluster in the foreground; with
/// one, change the cluster that runs in `--dir`.
#[derive(Args)]
#[command(args_conflicts_with_subcommands = true)]
pub(crate) struct ClusterArgs {
    #[command(subcommand)]
    command: Option<ClusterCommand>,
    /// Regions, comma-separated, each named once (letters, digits, `-`, `_`).
    #[arg(long, default_value = "eu,us,ap", value_delimiter = ',')]
    regions: Vec<String>,
    /// Nodes in every region.
    #[arg(long, default_value_t = 2)]
    nodes_per_region: usize,
    /// A file whose `[[rule]]` and `[[notify]]` tables every node runs (default: the embedded
    /// example rules); its `[node]`, `[api]` and `[cluster]` are not used.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Node k listens for HTTP on base-port + 2k and for QUIC (UDP) on base-port + 2k + 1.
    #[arg(long, default_value_t = 8750)]
    base_port: u16,
    /// Where certificates, configurations, data and logs go. Kept on exit, so every node can
    /// be run (and restarted) by hand with `levee serve --config DIR/<node>.toml` (default: a
    /// temporary directory, removed on exit).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Who each node gossips with every interval: `mesh`, every node; `regions`, its
    /// region-mates and one gateway per other region, which relays to its region
    /// (docs/replication.md, "Gossip topology").
    #[arg(long, value_enum, default_value_t = Topology::Mesh)]
    gossip_topology: Topology,
}

/// `--gossip-topology`: `cluster.gossip_topology` of every node.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Topology {
    Mesh,
    Regions,
}

impl From<Topology> for levee_node::config::GossipTopology {
    fn from(t: Topology) -> Self {
        match t {
            Topology::Mesh => levee_node::config::GossipTopology::Mesh,
            Topology::Regions => levee_node::config::GossipTopology::Regions,
        }
    }
}

/// Why `levee cluster` stopped early.
enum Failure {
    /// Bad arguments (exit 2, as clap's own errors).
    Usage(String),
    /// Anything else (exit 1).
    Run(String),
}

pub(crate) fn run(args: &ClusterArgs) -> ExitCode {
    if let Some(command) = &args.command {
        return control::client(command);
    }
    match start(args) {
        Ok(code) => code,
        Err(Failure::Usage(e)) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
        Err(Failure::Run(e)) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// One node of the layout, running or stopped on purpose.
struct Member {
    node: LocalNode,
    log: PathBuf,
    child: Child,
    /// Set once the child has been reaped: it is never signalled again.
    exited: Option<ExitStatus>,
    /// Removed from the list (`levee cluster remove`): stopped, and never started again.
    removed: bool,
    /// Being stopped on purpose (`remove`, `restart`): its exit does not stop the cluster.
    stopping: bool,
}

impl Member {
    /// Whether the child has exited (reaping it if so).
    fn poll_exit(&mut self) -> Option<ExitStatus> {
        if self.exited.is_none()
            && let Ok(Some(status)) = self.child.try_wait()
        {
            self.exited = Some(status);
        }
        self.exited
    }

    /// SIGTERM, unless the child has already exited. The child is not reaped until
    /// [`Member::poll_exit`] sees it gone, so its pid cannot belong to another process.
    fn terminate(&mut self) {
        self.signal(rustix::process::Signal::TERM);
    }

    /// `signal`, unless the child has already exited (see [`Member::terminate`]).
    fn signal(&mut self, signal: rustix::process::Signal) {
        if self.poll_exit().is_some() {
            return;
        }
        let _ =
            rustix::process::kill_process(rustix::process::Pid::from_child(&self.child), signal);
    }

    /// A member that should be running: in the list, and not being stopped.
    fn active(&self) -> bool {
        !self.removed && !self.stopping
    }

    /// SIGKILL, unless the child has already exited; then waits for it.
    fn kill(&mut self) {
        if self.poll_exit().is_none() {
            let _ = self.child.kill();
            if let Ok(status) = self.child.wait() {
                self.exited = Some(status);
            }
        }
    }
}

/// The running nodes; dropping them stops every one still running.
struct Members(Vec<Member>);

impl Members {
    /// SIGTERM to every node still running, SIGKILL after [`STOP_TIMEOUT`]; returns the nodes
    /// that exited with a failure, with their status (not those removed before, whose exit was
    /// reported then).
    fn stop(&mut self) -> Vec<(String, ExitStatus)> {
        for m in &mut self.0 {
            m.terminate();
        }
        let deadline = Instant::now() + STOP_TIMEOUT;
        while Instant::now() < deadline && self.0.iter_mut().any(|m| m.poll_exit().is_none()) {
            std::thread::sleep(Duration::from_millis(20));
        }
        for m in &mut self.0 {
            m.kill();
        }
        self.0
            .iter()
            .filter(|m| !m.removed)
            .filter_map(|m| {
                let s = m.exited?;
                (!s.success()).then(|| (m.node.id.clone(), s))
            })
            .collect()
    }
}

impl Drop for Members {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Starts `levee serve` on `node`'s configuration, its stderr to `log` (appended to, or
/// truncated first with `truncate`).
fn spawn(exe: &Path, node: &LocalNode, log: &Path, truncate: bool) -> Result<Child, String> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .append(!truncate)
        .truncate(truncate)
        .open(log)
        .map_err(|e| format!("{}: {e}", log.display()))?;
    Command::new(exe)
        .arg("serve")
        .arg("--config")
        .arg(&node.config)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(file)
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", node.id))
}

/// The running cluster, as `levee cluster add | remove | restart` change it.
struct Cluster {
    /// Every node of `spec`'s layout, in its order (the list's).
    members: Members,
    spec: LocalCluster,
    dir: PathBuf,
    /// The `levee` binary the nodes run.
    exe: PathBuf,
}

/// The last `n` lines of a log file (or why it cannot be read).
fn tail(path: &Path, n: usize) -> String {
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let lines: Vec<&str> = text.lines().collect();
            let from = lines.len().saturating_sub(n);
            if lines.is_empty() {
                "    (the log is empty)".to_owned()
            } else {
                lines[from..]
                    .iter()
                    .map(|l| format!("    {l}"))
                    .collect::<Vec<_>>()
                    .join("\n")
            }
        }
        Err(e) => format!("    (cannot read {}: {e})", path.display()),
    }
}

fn start(args: &ClusterArgs) -> Result<ExitCode, Failure> {
    check_regions(&args.regions)?;
    if args.nodes_per_region == 0 || args.nodes_per_region > 16 {
        return Err(Failure::Usage("--nodes-per-region: from 1 to 16".into()));
    }
    check_ports(args, args.regions.len() * args.nodes_per_region)?;
    // The rules and threshold notices every node runs: the file's, or the embedded example's.
    let config = match &args.config {
        None => levee_node::Config::embedded(),
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| Failure::Run(format!("{}: {e}", path.display())))?;
            levee_node::Config::parse(&text, &path.display().to_string())
                .map_err(|e| Failure::Run(e.to_string()))?
        }
    };
    let rules = config.rules.into_iter().map(|r| r.spec).collect();
    let notify = config.notify;
    let spec = LocalCluster {
        regions: args.regions.clone(),
        nodes_per_region: args.nodes_per_region,
        base_port: args.base_port,
        rules,
        notify,
        added: Vec::new(),
        gossip_interval: "20ms".into(),
        suspect_after: "1s".into(),
        gossip_topology: args.gossip_topology.into(),
    };
    let planned = spec
        .nodes(Path::new("."))
        .map_err(|e| Failure::Usage(e.to_string()))?;
    check_free(&planned)?;
    let exe = std::env::current_exe()
        .map_err(|e| Failure::Run(format!("cannot find the levee binary: {e}")))?;
    // Signals are handled from here on: SIGTERM or Ctrl-C while the nodes start stops them.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::Run(e.to_string()))?;
    let _guard = runtime.enter();
    let mut signals = Signals::new().map_err(Failure::Run)?;

    let temp;
    let dir = match &args.dir {
        Some(d) => d.clone(),
        None => {
            temp = tempfile::Builder::new()
                .prefix("levee-cluster-")
                .tempdir()
                .map_err(|e| Failure::Run(format!("cannot make a temporary directory: {e}")))?;
            temp.path().to_owned()
        }
    };
    // The control socket claims the directory: a cluster already running there is not
    // overwritten.
    let control = control::Control::bind(&dir).map_err(Failure::Run)?;
    let nodes = spec
        .write(&dir, |_, _| None)
        .map_err(|e| Failure::Run(e.to_string()))?;
    let mut cluster = Cluster {
        members: Members(Vec::with_capacity(nodes.len())),
        spec,
        dir: dir.clone(),
        exe,
    };
    let members = &mut cluster.members;
    for n in nodes {
        let log = dir.join(format!("{}.log", n.id));
        let child = spawn(&cluster.exe, &n, &log, true).map_err(Failure::Run)?;
        members.0.push(Member {
            node: n,
            log,
            child,
            exited: None,
            removed: false,
            stopping: false,
        });
    }
    let outcome = runtime.block_on(supervise(&mut cluster, &mut signals, &control, args));
    drop(control);
    let members = &mut cluster.members;
    // The logs are read (a failed node's tail printed) before the directory goes.
    let code = match outcome {
        Stop::Signal(reason) => {
            println!("stopping the cluster: {reason}");
            let failed = members.stop();
            for (id, status) in &failed {
                let m = members.0.iter().find(|m| &m.node.id == id);
                eprintln!(
                    "error: node {id} exited with {status} while stopping; the last lines of its log:\n{}",
                    m.map(|m| tail(&m.log, TAIL_LINES)).unwrap_or_default()
                );
            }
            if failed.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Stop::Failed(message) => {
            eprintln!("error: {message}");
            let _ = members.stop();
            eprintln!("levee cluster: stopped every node");
            ExitCode::FAILURE
        }
    };
    if args.dir.is_some() {
        println!(
            "files kept in {}: run a node by hand with `levee serve --config {}/<node>.toml`",
            dir.display(),
            dir.display()
        );
    }
    Ok(code)
}

/// SIGINT (Ctrl-C) and SIGTERM, registered before any child starts.
struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> Result<Signals, String> {
        use tokio::signal::unix::{SignalKind, signal};
        let err = |e: std::io::Error| format!("cannot handle signals: {e}");
        Ok(Signals {
            int: signal(SignalKind::interrupt()).map_err(err)?,
            term: signal(SignalKind::terminate()).map_err(err)?,
        })
    }

    /// Waits for either signal; its name.
    async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.int.recv() => "interrupted",
            _ = self.term.recv() => "terminated",
        }
    }
}

/// Why supervision ended.
pub(super) enum Stop {
    /// Ctrl-C or SIGTERM.
    Signal(&'static str),
    /// A node exited, or the cluster did not become ready: what to say.
    Failed(String),
}

/// A node that exited: which, how, and the end of its log.
fn died(m: &Member, status: ExitStatus, when: &str) -> String {
    format!(
        "node {} ({}) exited {when} ({status}); the last lines of {}:\n{}",
        m.node.id,
        m.node.http,
        m.log.display(),
        tail(&m.log, TAIL_LINES)
    )
}

/// Waits for every node to be ready, announces the cluster, then watches the nodes until a
/// signal or until one exits, and serves `levee cluster add | remove | restart` one at a time.
async fn supervise(
    cluster: &mut Cluster,
    signals: &mut Signals,
    control: &control::Control,
    args: &ClusterArgs,
) -> Stop {
    let members = &mut cluster.members;
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_millis(500)))
        .build()
        .into();
    let deadline = Instant::now() + READY_TIMEOUT;
    let mut ready = vec![false; members.0.len()];
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    while !ready.iter().all(|r| *r) {
        tokio::select! {
            reason = signals.recv() => return Stop::Signal(reason),
            _ = tick.tick() => {}
        }
        for (m, ready) in members.0.iter_mut().zip(ready.iter_mut()) {
            if let Some(status) = m.poll_exit() {
                return Stop::Failed(died(m, status, "while starting"));
            }
            if !*ready {
                let url = format!("http://{}/readyz", m.node.http);
                *ready = agent
                    .get(&url)
                    .call()
                    .is_ok_and(|r| r.status().as_u16() == 200);
            }
        }
        if Instant::now() >= deadline {
            let waiting: Vec<&str> = members
                .0
                .iter()
                .zip(&ready)
                .filter(|(_, r)| !**r)
                .map(|(m, _)| m.node.id.as_str())
                .collect();
            let logs: Vec<String> = members
                .0
                .iter()
                .zip(&ready)
                .filter(|(_, r)| !**r)
                .map(|(m, _)| format!("  {}:\n{}", m.log.display(), tail(&m.log, TAIL_LINES)))
                .collect();
            return Stop::Failed(format!(
                "not ready within {READY_TIMEOUT:?}: {}; the last lines of their logs:\n{}",
                waiting.join(", "),
                logs.join("\n")
            ));
        }
    }
    announce(members, &cluster.dir, args, &cluster.spec);
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    loop {
        tokio::select! {
            reason = signals.recv() => return Stop::Signal(reason),
            conn = control.accept() => {
                if let Some(stop) = control::serve(conn, cluster, signals, control).await {
                    return stop;
                }
            }
            _ = tick.tick() => {
                if let Err(message) = cluster.members.check_alive("while the cluster ran") {
                    return Stop::Failed(message);
                }
            }
        }
    }
}

impl Members {
    /// Fails with [`died`]'s message for the first member that exited though it should run.
    fn check_alive(&mut self, when: &str) -> Result<(), String> {
        for m in self.0.iter_mut().filter(|m| m.active()) {
            if let Some(status) = m.poll_exit() {
                return Err(died(m, status, when));
            }
        }
        Ok(())
    }
}

/// The table of nodes and a few commands to try (a check of the first rule the nodes run).
fn announce(members: &Members, dir: &Path, args: &ClusterArgs, spec: &LocalCluster) {
    let mut out = format!(
        "levee cluster: {} regions × {} nodes, files in {}\n\n",
        args.regions.len(),
        args.nodes_per_region,
        dir.display()
    );
    out.push_str(&format!(
        "  {:<8} {:<10} {:<28} {:<18} pid\n",
        "region", "node", "http", "quic"
    ));
    for m in &members.0 {
        let n = &m.node;
        out.push_str(&format!(
            "  {:<8} {:<10} {:<28} {:<18} {}\n",
            n.region,
            n.id,
            format!("http://{}", n.http),
            n.gossip.to_string(),
            m.child.id()
        ));
    }
    let first = &members.0[0].node;
    out.push_str("\ntry:\n");
    if let Some(rule) = spec.rules.first() {
        out.push_str(&format!(
            "  curl -s -XPOST http://{}/v1/check -H 'content-type: application/json' -d '{{\"rule\":\"{}\",\"key\":\"acme\"}}'\n",
            first.http, rule.name
        ));
    }
    out.push_str(&format!(
        "  curl -s http://{}/v1/cluster\n\n\
         change it while it runs (one change at a time):\n  \
         levee cluster add --region {region} --dir {dir}\n  \
         levee cluster remove <node> --dir {dir}\n  \
         levee cluster restart {id} --dir {dir}\n\n\
         logs: {dir}/<node>.log   stop: Ctrl-C (a node that exits by itself stops the whole cluster)\n\n",
        first.http,
        region = first.region,
        id = first.id,
        dir = dir.display(),
    ));
    print!("{out}");
}
