//! Running a node: bind, serve, reload, snapshot, shut down gracefully.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::app::App;
use crate::config::Config;
use crate::limiter::Clock;
use crate::replication::Replication;
use crate::snapshot;

mod connections;
use connections::serve_http;

/// How a node is started.
#[derive(Debug, Clone, Default)]
pub struct ServeOptions {
    /// The configuration file; `None` runs on the embedded default.
    pub config: Option<PathBuf>,
    /// Test-only: milliseconds added to the wall clock (a skewed node).
    pub clock_offset_ms: i64,
    /// How often the configuration file is checked for changes.
    pub watch_interval: Option<Duration>,
    /// Threads serving HTTP connections, each running its own single-threaded runtime
    /// (`None`: one per core).
    pub http_threads: Option<usize>,
}

/// Why a node could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The configuration is invalid.
    #[error("{0}")]
    Config(#[from] crate::config::ConfigError),
    /// The HTTP address could not be bound.
    #[error("cannot listen on {addr} (node.http): {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The error.
        source: std::io::Error,
    },
    /// The snapshot could not be restored, or `data_dir` cannot hold snapshots.
    #[error("cannot restore counters: {0}")]
    Snapshot(#[from] snapshot::SnapshotError),
    /// `data_dir` cannot hold snapshots.
    #[error("node.data_dir: {0}")]
    DataDir(snapshot::SnapshotError),
    /// The final snapshot, at shutdown, could not be written.
    #[error(
        "the final snapshot failed: {0}; counters changed since the last good snapshot are \
         lost on the next start"
    )]
    FinalSnapshot(snapshot::SnapshotError),
    /// The server failed.
    #[error("server error: {0}")]
    Io(#[from] std::io::Error),
    /// The cluster side could not start.
    #[error("cluster: {0}")]
    Replication(#[from] crate::replication::ReplicationError),
}

/// Runs a node until SIGTERM or Ctrl-C. `on_ready` is called with the bound HTTP address.
pub async fn run(
    options: ServeOptions,
    on_ready: impl FnOnce(&Config, SocketAddr),
) -> Result<(), ServeError> {
    let config = match &options.config {
        Some(p) => Config::load(p)?,
        None => Config::embedded(),
    };
    let prometheus = crate::metrics::install();
    let addr = config.node.http;
    let data_dir = config.node.data_dir.clone();
    let node_id = config.node.id.clone();
    let snapshot_every = Duration::from_millis(config.node.snapshot_interval.as_millis());
    let grace = Duration::from_millis(config.node.shutdown_grace.as_millis());
    let clock = Clock::with_offset(options.clock_offset_ms);
    // The cluster side starts first (its transport listens, its machine asks every peer for
    // its state); its timer and inbound loop run once the app exists, below.
    let cluster = match &config.cluster {
        None => None,
        Some(_) => Some(Replication::start(&config, clock.now_ms()).await?),
    };
    let app = Arc::new(App::new(
        config,
        clock,
        prometheus,
        cluster.as_ref().map(|(repl, _)| Arc::clone(repl)),
    ));

    if let Some(dir) = &data_dir {
        snapshot::check_writable(dir).map_err(ServeError::DataDir)?;
        restore_snapshot(&app, dir)?;
    }

    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Bind { addr, source })?;
    let bound = listener.local_addr()?;
    let (stop_tx, stop_rx) = watch::channel(false);

    tokio::spawn(signals(Arc::clone(&app), stop_tx.clone()));
    tokio::spawn(metrics_upkeep(prometheus, stop_rx.clone()));
    tokio::spawn(watch_config(
        Arc::clone(&app),
        options.watch_interval.unwrap_or(Duration::from_secs(1)),
        stop_rx.clone(),
    ));
    // Threshold notices: the sender runs until shutdown even without `[[notify]]` (a reload
    // may add one).
    let notices = crate::notify::run(app.limiter.notices(), stop_rx.clone());
    if let Some(dir) = data_dir.clone() {
        tokio::spawn(snapshots(
            Arc::clone(&app),
            node_id.clone(),
            dir,
            snapshot_every,
            stop_rx.clone(),
        ));
    }

    let replication = match cluster {
        None => {
            app.set_ready(true);
            None
        }
        Some((repl, inbound)) => {
            // Ready once the cluster's state has been pulled (the machine's `Synced` event);
            // until then decisions are made under conservative caps.
            app.limiter.store().track_changes();
            // Recovering until it has pulled its peers' state.
            app.limiter.set_view(levee_core::ClusterView {
                recovering: true,
                ..app.limiter.view()
            });
            repl.run(Arc::clone(&app), inbound);
            let config = app.config.load();
            tracing::info!(gossip = ?config.node.gossip, peers = config.replicas.len() - 1, "cluster transport started");
            Some(repl)
        }
    };
    {
        let config = app.config.load();
        if config.api.admin_token.is_none() && !bound.ip().is_loopback() {
            tracing::warn!(
                http = %bound,
                "api.admin_open = true and no admin_token: anyone who reaches {bound} can reload \
                 the configuration, reset counters and refund tokens"
            );
        }
    }
    on_ready(&app.config.load(), bound);
    tracing::info!(http = %bound, node = %node_id, "levee is serving");

    let threads = options
        .http_threads
        .filter(|&n| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let server = serve_http(listener, Arc::clone(&app), threads, stop_rx.clone());
    let mut stop = stop_rx.clone();
    tokio::select! {
        res = server => res?,
        () = async {
            let _ = stop.wait_for(|s| *s).await;
            tokio::time::sleep(grace).await;
        } => {
            tracing::warn!(grace_ms = grace.as_millis() as u64, "in-flight requests did not finish within the grace period");
        }
    }

    // No more decisions after this: forwarded checks go back to their forwarders, and the
    // peers get the last deltas; the snapshot then holds everything this node admitted.
    if let Some(repl) = &replication {
        repl.close(app.as_ref()).await;
    }
    let last = match &data_dir {
        Some(dir) => write_snapshot(&app, &node_id, dir),
        None => Ok(()),
    };
    if let Some(repl) = replication {
        repl.shutdown().await;
    }
    if let Some(notices) = notices {
        let _ = notices.await;
    }
    if let Err(e) = last {
        return Err(ServeError::FinalSnapshot(e));
    }
    tracing::info!("levee stopped");
    Ok(())
}

/// Restores the snapshot in `dir`; one that cannot be read was moved aside: say so loudly and
/// what to do, count it, and start without it (a cluster node then pulls its peers' state).
fn restore_snapshot(app: &App, dir: &std::path::Path) -> Result<(), ServeError> {
    match snapshot::restore(&app.limiter, dir)? {
        snapshot::Restored::None => {
            tracing::info!(dir = %dir.display(), "no snapshot: starting with empty counters");
        }
        snapshot::Restored::Loaded { keys, format } => {
            tracing::info!(keys, format, dir = %dir.display(), "counters restored from snapshot");
        }
        snapshot::Restored::MovedAside { to, reason } => {
            crate::metrics::snapshot_corrupt();
            let from = if app.replication.is_some() {
                "its peers' state (counters come back as the peers answer)"
            } else {
                "EMPTY counters: every key starts from a full limit"
            };
            tracing::error!(
                %reason,
                moved_to = %to.display(),
                "the snapshot cannot be read and was moved aside; starting from {from}. \
                 Nothing to do if that is acceptable; to investigate, keep the moved file \
                 (it is never read again) and check the disk and who writes to data_dir"
            );
        }
    }
    Ok(())
}

/// Drains the histograms' recorded samples into their buckets every few seconds. The
/// Prometheus recorder keeps every sample until then; without this, a node nobody scrapes
/// would grow by about 13 bytes per request.
async fn metrics_upkeep(
    prometheus: &'static metrics_exporter_prometheus::PrometheusHandle,
    mut stop: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(Duration::from_secs(5));
    loop {
        tokio::select! {
            _ = tick.tick() => prometheus.run_upkeep(),
            _ = stop.changed() => return,
        }
    }
}

fn write_snapshot(
    app: &App,
    node: &str,
    dir: &std::path::Path,
) -> Result<(), snapshot::SnapshotError> {
    match snapshot::save(&app.limiter, node, dir) {
        Ok(keys) => {
            crate::metrics::snapshot(true, keys);
            tracing::debug!(keys, "snapshot written");
            Ok(())
        }
        Err(e) => {
            crate::metrics::snapshot(false, 0);
            tracing::error!(error = %e, "snapshot failed");
            Err(e)
        }
    }
}

async fn signals(app: Arc<App>, stop: watch::Sender<bool>) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut hup)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::hangup()),
    ) else {
        tracing::error!("cannot install signal handlers");
        return;
    };
    loop {
        tokio::select! {
            _ = term.recv() => break,
            _ = tokio::signal::ctrl_c() => break,
            _ = hup.recv() => {
                let _ = app.reload("SIGHUP");
            }
        }
    }
    tracing::info!("shutting down: no new connections, finishing in-flight requests");
    app.shutting_down.store(true, Ordering::Release);
    let _ = stop.send(true);
}

/// Re-reads the configuration when the file changes, including the atomic symlink swap a
/// Kubernetes ConfigMap mount performs (the path then resolves to another file).
async fn watch_config(app: Arc<App>, every: Duration, mut stop: watch::Receiver<bool>) {
    let Some(path) = app.config.load().path.clone() else {
        return;
    };
    let fingerprint = |p: &std::path::Path| -> Option<(std::time::SystemTime, u64, u64, PathBuf)> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(p).ok()?;
        Some((
            m.modified().ok()?,
            m.len(),
            m.ino(),
            std::fs::canonicalize(p).ok()?,
        ))
    };
    let mut last = fingerprint(&path);
    let mut tick = tokio::time::interval(every);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        let now = fingerprint(&path);
        if now.is_some() && now != last {
            last = now;
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            if text != app.config.load().text {
                let _ = app.reload("file change");
            } else {
                app.reverted("file change");
            }
        }
    }
}

async fn snapshots(
    app: Arc<App>,
    node: String,
    dir: PathBuf,
    every: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(every);
    tick.tick().await;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        let (app2, node2, dir2) = (Arc::clone(&app), node.clone(), dir.clone());
        // A failure is logged and counted; the next interval tries again.
        let _ = tokio::task::spawn_blocking(move || write_snapshot(&app2, &node2, &dir2)).await;
    }
}
