//! `levee cluster`: a local multi-region cluster of real `levee serve` processes.

use std::path::PathBuf;
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::Duration;

use clap::{Args, ValueEnum};
use levee_core::Consistency;
use levee_node::local_cluster::LocalCluster;

/// Arguments of `levee cluster`.
#[derive(Args)]
pub(crate) struct ClusterArgs {
    /// Regions, comma-separated.
    #[arg(long, default_value = "eu,us,ap", value_delimiter = ',')]
    regions: Vec<String>,
    /// Nodes in every region.
    #[arg(long, default_value_t = 2)]
    nodes_per_region: usize,
    /// A file whose `[[rule]]` tables every node runs (default: the embedded example rules).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Node k listens for HTTP on base-port + 2k and for QUIC on base-port + 2k + 1.
    #[arg(long, default_value_t = 8750)]
    base_port: u16,
    /// Strict (escrow) or optimistic (shared counter).
    #[arg(long, value_enum, default_value_t = Mode::Strict)]
    mode: Mode,
    /// Where certificates, configurations and data go (default: a temporary directory,
    /// removed on exit).
    #[arg(long)]
    dir: Option<PathBuf>,
}

#[derive(Clone, Copy, ValueEnum)]
enum Mode {
    Strict,
    Optimistic,
}

struct Children(Vec<(String, Child)>);

impl Drop for Children {
    fn drop(&mut self) {
        for (_, c) in &self.0 {
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(c.id().to_string())
                .status();
        }
        for (_, c) in &mut self.0 {
            for _ in 0..100 {
                if matches!(c.try_wait(), Ok(Some(_))) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

pub(crate) fn run(args: &ClusterArgs) -> ExitCode {
    match start(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn start(args: &ClusterArgs) -> Result<ExitCode, String> {
    if args.regions.is_empty() || args.regions.iter().any(|r| r.is_empty()) {
        return Err("--regions: give at least one region name, e.g. --regions eu,us,ap".into());
    }
    if args.nodes_per_region == 0 || args.nodes_per_region > 16 {
        return Err("--nodes-per-region: from 1 to 16".into());
    }
    let rules = match &args.config {
        None => levee_node::Config::embedded()
            .rules
            .into_iter()
            .map(|r| r.spec)
            .collect(),
        Some(path) => {
            let text =
                std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
            levee_node::Config::parse(&text, &path.display().to_string())
                .map_err(|e| e.to_string())?
                .rules
                .into_iter()
                .map(|r| r.spec)
                .collect()
        }
    };
    let temp;
    let dir = match &args.dir {
        Some(d) => d.clone(),
        None => {
            temp = tempfile::tempdir()
                .map_err(|e| format!("cannot make a temporary directory: {e}"))?;
            temp.path().to_owned()
        }
    };
    let spec = LocalCluster {
        regions: args.regions.clone(),
        nodes_per_region: args.nodes_per_region,
        base_port: args.base_port,
        mode: match args.mode {
            Mode::Strict => Consistency::Strict,
            Mode::Optimistic => Consistency::Optimistic,
        },
        rules,
        gossip_interval: "20ms".into(),
        suspect_after: "1s".into(),
    };
    let nodes = spec.write(&dir, |_, _| None).map_err(|e| e.to_string())?;
    let exe = std::env::current_exe().map_err(|e| format!("cannot find the levee binary: {e}"))?;
    let mut children = Children(Vec::new());
    for n in &nodes {
        let log =
            std::fs::File::create(dir.join(format!("{}.log", n.id))).map_err(|e| e.to_string())?;
        let child = Command::new(&exe)
            .arg("serve")
            .arg("--config")
            .arg(&n.config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", n.id))?;
        children.0.push((n.id.clone(), child));
    }
    println!(
        "levee cluster: {} regions × {} nodes, {} mode, files in {}\n",
        args.regions.len(),
        args.nodes_per_region,
        spec.mode.as_str(),
        dir.display()
    );
    println!("  {:<8} {:<10} {:<28} quic", "region", "node", "http");
    for n in &nodes {
        println!(
            "  {:<8} {:<10} {:<28} {}",
            n.region,
            n.id,
            format!("http://{}", n.http),
            n.gossip
        );
    }
    let first = &nodes[0];
    println!(
        "\ntry:\n  curl -s -XPOST http://{}/v1/check -H 'content-type: application/json' -d '{{\"rule\":\"api-per-tenant\",\"key\":\"acme\"}}'\n  curl -s http://{}/v1/cluster\n\nlogs: {}/<node>.log   stop: Ctrl-C\n",
        first.http,
        first.http,
        dir.display()
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let reason = runtime.block_on(async {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate()).map_err(|e| e.to_string())?;
        let mut check = tokio::time::interval(Duration::from_millis(500));
        loop {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => return Ok::<_, String>("interrupted".to_owned()),
                _ = term.recv() => return Ok("terminated".to_owned()),
                _ = check.tick() => {
                    for (id, c) in &mut children.0 {
                        if let Ok(Some(status)) = c.try_wait() {
                            return Ok(format!("{id} exited ({status}); see {}/{id}.log", dir.display()));
                        }
                    }
                }
            }
        }
    })?;
    println!("stopping the cluster: {reason}");
    drop(children);
    Ok(ExitCode::SUCCESS)
}
