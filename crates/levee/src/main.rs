//! `levee`: run a node, validate a configuration, ask a node for a decision.

// A command-line tool prints its answers.
#![allow(clippy::print_stdout)]

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

mod bench;
mod check;
mod cluster;

/// mimalloc instead of glibc malloc: the request path allocates and frees small buffers on
/// every request, and glibc's allocator was 13–28 % of the server's CPU (docs/benchmarks.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Levee, a multi-region distributed rate limiter.
#[derive(Parser)]
#[command(name = "levee", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a node (with no --config: one node on 127.0.0.1:8750 with example rules).
    Serve {
        /// The configuration file (TOML).
        #[arg(long, short)]
        config: Option<PathBuf>,
        /// Log format: `human` (coloured only on a terminal) or `json` (one object per line).
        #[arg(long, value_enum, default_value_t = LogFormat::Human)]
        log_format: LogFormat,
        /// Test only: milliseconds added to this node's clock, to simulate skew.
        #[arg(long, default_value_t = 0, hide = true, allow_negative_numbers = true)]
        clock_offset_ms: i64,
    },
    /// Work with configuration files.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
    /// Ask a node for one decision and print it.
    Check(check::CheckArgs),
    /// Open-loop HTTP load against a node, with latency percentiles (coordinated omission
    /// corrected).
    Bench(bench::BenchArgs),
    /// Run a local multi-region cluster of real `levee serve` processes; add, remove or
    /// restart its nodes while it runs.
    Cluster(cluster::ClusterArgs),
    /// Make the cluster CA and node certificates for mutual TLS.
    Certs {
        #[command(subcommand)]
        command: CertsCommand,
    },
}

#[derive(Subcommand)]
enum CertsCommand {
    /// Make a cluster CA (ca.pem, ca.key) in DIR.
    Init {
        /// Where to write the CA.
        #[arg(long)]
        out: PathBuf,
    },
    /// Issue a node certificate (<node>.pem, <node>.key) signed by the CA in --ca.
    Issue {
        /// The directory holding ca.pem and ca.key.
        #[arg(long)]
        ca: PathBuf,
        /// The node id (the certificate's name).
        #[arg(long)]
        node: String,
        /// Where to write the certificate and key.
        #[arg(long)]
        out: PathBuf,
    },
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Validate a configuration; errors name the line and the field; exit 1 on error.
    Check {
        /// The configuration file.
        file: PathBuf,
    },
}

/// How `levee serve` writes its log lines (to stderr).
#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    /// Human-readable lines; coloured only when stderr is a terminal.
    Human,
    /// One JSON object per line (for log collectors): `timestamp`, `level`, `target`,
    /// `message` and the event's fields at the top level.
    Json,
}

/// Logs to stderr at the level `LEVEE_LOG` says (default `info`). Human lines carry ANSI
/// colours only when stderr is a terminal: a file, `docker logs` or a journal gets plain text.
fn init_logging(format: LogFormat) {
    use std::io::IsTerminal as _;
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_env("LEVEE_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Human => builder.with_ansi(std::io::stderr().is_terminal()).init(),
        LogFormat::Json => builder.json().flatten_event(true).with_ansi(false).init(),
    }
}

/// Transparent huge pages off for this process, unless `MIMALLOC_ALLOW_THP` is set (mimalloc
/// then applies it itself). On hosts with THP `always`, mimalloc's arenas otherwise get 2 MiB
/// pages that hold tens of megabytes more than the node uses (about 40 MB at 100,000 keys)
/// while the request path ran no faster with them (docs/benchmarks.md, figure 6).
fn thp_off_unless_asked() {
    #[cfg(target_os = "linux")]
    if std::env::var_os("MIMALLOC_ALLOW_THP").is_none()
        && let Err(e) = rustix::thread::disable_transparent_huge_pages(true)
    {
        eprintln!("levee: could not turn transparent huge pages off for this process: {e}");
    }
}

fn main() -> ExitCode {
    thp_off_unless_asked();
    let cli = Cli::parse();
    match cli.command {
        Command::Serve {
            config,
            log_format,
            clock_offset_ms,
        } => serve(config, log_format, clock_offset_ms),
        Command::Config {
            command: ConfigCommand::Check { file },
        } => match levee_node::Config::load(&file).and_then(|c| {
            // `data_dir` must be able to hold snapshots (checked without creating anything).
            match c
                .node
                .data_dir
                .as_deref()
                .map(levee_node::snapshot::check_data_dir)
            {
                Some(Err(e)) => Err(levee_node::ConfigError {
                    source_name: file.display().to_string(),
                    line: None,
                    field: "node.data_dir".into(),
                    message: e.to_string(),
                }),
                _ => Ok(c),
            }
        }) {
            Ok(c) => {
                println!(
                    "{}: ok ({} rules, node {} in region {})",
                    file.display(),
                    c.rules.len(),
                    c.node.id,
                    c.node.region
                );
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Check(args) => check::run(&args),
        Command::Cluster(args) => cluster::run(&args),
        Command::Bench(args) => bench::run(&args),
        Command::Certs { command } => {
            let result = match &command {
                CertsCommand::Init { out } => levee_transport::certs::init_ca(out).map(|()| {
                    format!(
                        "cluster CA written to {}/ca.pem (key: ca.key)",
                        out.display()
                    )
                }),
                CertsCommand::Issue { ca, node, out } => {
                    levee_transport::certs::issue(ca, node, out).map(|()| {
                        format!(
                            "certificate for {node} written to {}/{node}.pem (key: {node}.key)",
                            out.display()
                        )
                    })
                }
            };
            match result {
                Ok(msg) => {
                    println!("{msg}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

/// Threads of the background runtime (replication, forwarding, reloads, snapshots):
/// `LEVEE_BACKGROUND_THREADS` if set, else a quarter of the cores, at least one. HTTP
/// connections have threads of their own (`LEVEE_WORKER_THREADS`); the replication state
/// machine is one lock, so more background threads than that mostly wake each other (on 2
/// cores, 1 thread instead of 2 took 8–15 % less CPU per decision in a cluster whose callers
/// send to any node: docs/configuration.md).
fn background_threads(var: Option<String>) -> Result<usize, String> {
    match var {
        None => Ok(std::thread::available_parallelism().map_or(1, |n| (n.get() / 4).max(1))),
        Some(v) => match v.trim().parse::<usize>() {
            Ok(n) if (1..=1024).contains(&n) => Ok(n),
            _ => Err(format!(
                "LEVEE_BACKGROUND_THREADS: must be an integer from 1 to 1024, got {v:?}"
            )),
        },
    }
}

fn serve(config: Option<PathBuf>, log_format: LogFormat, clock_offset_ms: i64) -> ExitCode {
    init_logging(log_format);
    let embedded = config.is_none();
    let background = match background_threads(std::env::var("LEVEE_BACKGROUND_THREADS").ok()) {
        Ok(n) => n,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(background)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let options = levee_node::ServeOptions {
        config,
        clock_offset_ms,
        watch_interval: None,
        // Threads serving HTTP connections (default: one per core).
        http_threads: std::env::var("LEVEE_WORKER_THREADS")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .filter(|&n| n > 0),
    };
    let result = runtime.block_on(levee_node::run(options, |config, addr| {
        if embedded {
            print_welcome(config, addr);
        }
    }));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The embedded configuration's rules and a few commands to try them with.
fn print_welcome(config: &levee_node::Config, addr: std::net::SocketAddr) {
    let mut out = String::new();
    out.push_str(&format!(
        "levee: one node on http://{addr} (embedded configuration)\n\nrules:\n"
    ));
    for r in &config.rules {
        let s = &r.spec;
        let figures = match r.algorithm {
            levee_core::Algorithm::TokenBucket {
                rate,
                shaping: Some(shaping),
                ..
            } => {
                format!(
                    "leaky_bucket  {rate} per {}, burst {}, delay {}",
                    s.per.map(|p| p.to_string()).unwrap_or_default(),
                    shaping.queue,
                    shaping.delay
                )
            }
            levee_core::Algorithm::TokenBucket { rate, burst, .. } => {
                format!(
                    "token_bucket  {rate} per {}, burst {burst}",
                    s.per.map(|p| p.to_string()).unwrap_or_default()
                )
            }
            levee_core::Algorithm::FixedWindow { limit, .. } => {
                format!(
                    "fixed_window  {limit} per {}",
                    s.window.map(|p| p.to_string()).unwrap_or_default()
                )
            }
            levee_core::Algorithm::SlidingWindow { limit, .. } => {
                format!(
                    "sliding_window {limit} per {}",
                    s.window.map(|p| p.to_string()).unwrap_or_default()
                )
            }
            levee_core::Algorithm::Quota { limit, period } => {
                format!("quota         {limit} per {period:?}").to_lowercase()
            }
            levee_core::Algorithm::SlidingLog { limit, .. } => {
                format!(
                    "sliding_log   {limit} per {}",
                    s.window.map(|p| p.to_string()).unwrap_or_default()
                )
            }
        };
        let classes: Vec<&str> = r.classes.iter().map(|c| c.name.as_str()).collect();
        let classes = if classes.is_empty() {
            String::new()
        } else {
            format!("  classes: {}", classes.join(", "))
        };
        out.push_str(&format!("  {:<20} {figures}{classes}\n", r.name));
    }
    out.push_str(&format!(
        "\ntry:\n  curl -s -XPOST http://{addr}/v1/check -H 'content-type: application/json' \\\n       -d '{{\"rule\":\"api-per-tenant\",\"key\":\"acme\"}}'\n  curl -si http://{addr}/v1/authz/api-per-tenant -H 'x-api-key: acme'\n  curl -s http://{addr}/v1/usage/api-per-tenant/acme\n  curl -s http://{addr}/metrics | grep levee_\n\n"
    ));
    print!("{out}");
}
