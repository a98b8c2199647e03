//! Running a node: bind, serve, reload, snapshot, shut down gracefully.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::app::App;
use crate::config::Config;
use crate::limiter::Clock;
use crate::replication::Replication;
use crate::{http, snapshot};

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
    /// The snapshot could not be restored.
    #[error("cannot restore counters: {0}")]
    Snapshot(#[from] snapshot::SnapshotError),
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
        let restored = snapshot::restore(&app.limiter, dir)?;
        tracing::info!(keys = restored, dir = %dir.display(), "counters restored from snapshot");
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
            repl.run(Arc::clone(&app), inbound, stop_rx.clone());
            let config = app.config.load();
            tracing::info!(gossip = ?config.node.gossip, peers = config.replicas.len() - 1, "cluster transport started");
            Some(repl)
        }
    };
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

    if let Some(dir) = &data_dir {
        write_snapshot(&app, &node_id, dir);
    }
    if let Some(repl) = replication {
        repl.shutdown().await;
    }
    tracing::info!("levee stopped");
    Ok(())
}

/// Accepts HTTP/1.1 connections until `stop` turns true, then stops accepting and waits for
/// the open connections to finish their requests (idle keep-alive connections are closed).
///
/// Each connection is served on one of `threads` threads, each running its own
/// single-threaded runtime (the one with the fewest open connections gets the next): a
/// request is read, decided and answered on one thread, without the wake-ups and work
/// stealing between the workers of a shared runtime. Background work (replication, reloads,
/// snapshots) stays on the runtime `run` was called on.
async fn serve_http(
    listener: TcpListener,
    app: Arc<App>,
    threads: usize,
    mut stop: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let router = http::router(Arc::clone(&app));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut builder = hyper::server::conn::http1::Builder::new();
    // One buffer, one `write(2)`: the answers are small, so copying the body after the head
    // costs less than the kernel's vectored-write path.
    builder.writev(false);
    let builder = Arc::new(builder);
    let workers = HttpThreads::start(threads)?;
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(c) => c,
                Err(e) if is_connection_error(&e) => continue,
                Err(e) => {
                    // Out of file descriptors, most likely: wait instead of spinning.
                    tracing::error!(error = %e, "cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = stop.wait_for(|s| *s) => break,
        };
        let _ = stream.set_nodelay(true);
        // Registered again with the reactor of the thread that serves it.
        let Ok(stream) = stream.into_std() else {
            continue;
        };
        let api = http::Api::new(Arc::clone(&app), router.clone(), peer);
        let builder = Arc::clone(&builder);
        let watcher = graceful.watcher();
        let timeout = app.request_timeout();
        workers.spawn(async move {
            let Ok(stream) = tokio::net::TcpStream::from_std(stream) else {
                return;
            };
            let (stream, pending) = Watched::new(stream);
            let conn = watcher.watch(builder.serve_connection(TokioIo::new(stream), api));
            tokio::select! {
                res = conn => if let Err(e) = res {
                    tracing::trace!(error = %e, "connection ended with an error");
                },
                () = pending.expired(timeout) => {
                    tracing::debug!(%peer, "closing a connection whose request did not arrive in time");
                }
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

/// The threads serving HTTP connections. Dropping this stops them (and drops whatever
/// connection is still open on them).
struct HttpThreads {
    threads: Vec<HttpThread>,
}

struct HttpThread {
    handle: tokio::runtime::Handle,
    open: Arc<std::sync::atomic::AtomicUsize>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl HttpThreads {
    fn start(n: usize) -> std::io::Result<HttpThreads> {
        let mut threads = Vec::with_capacity(n);
        for i in 0..n {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let handle = runtime.handle().clone();
            let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
            std::thread::Builder::new()
                .name(format!("levee-http-{i}"))
                .spawn(move || {
                    runtime.block_on(async move {
                        let _ = stop_rx.await;
                    });
                })?;
            threads.push(HttpThread {
                handle,
                open: Arc::default(),
                _stop: stop_tx,
            });
        }
        Ok(HttpThreads { threads })
    }

    /// Runs a connection on the thread with the fewest open connections.
    fn spawn(&self, conn: impl Future<Output = ()> + Send + 'static) {
        let Some(t) = self
            .threads
            .iter()
            .min_by_key(|t| t.open.load(Ordering::Relaxed))
        else {
            return;
        };
        let open = Arc::clone(&t.open);
        open.fetch_add(1, Ordering::Relaxed);
        t.handle.spawn(async move {
            conn.await;
            open.fetch_sub(1, Ordering::Relaxed);
        });
    }
}

/// A connection's stream, noting whether a request is pending: bytes have been read since the
/// connection last wrote an answer. With [`Pending::expired`] this is the time limit of a
/// request from its first bytes to the first bytes of its answer — a client that sends part of
/// a request and stalls is cut off (and so is a request whose handling takes as long) —
/// without a timer per request (hyper's `header_read_timeout` arms one for every request):
/// one coarse tick per connection checks whether the same request is still pending.
struct Watched {
    stream: tokio::net::TcpStream,
    pending: Arc<AtomicU8>,
}

/// The watch side of [`Watched`]: 0 when no request is partly received, else 1 + the ticks
/// that have seen the same partial request.
struct Pending(Arc<AtomicU8>);

impl Watched {
    fn new(stream: tokio::net::TcpStream) -> (Watched, Pending) {
        let pending = Arc::new(AtomicU8::new(0));
        let watch = Pending(Arc::clone(&pending));
        (Watched { stream, pending }, watch)
    }
}

/// Ticks per request timeout: a stalled request is cut off between 1 and 1.25 timeouts after
/// its first bytes.
const TICKS_PER_TIMEOUT: u8 = 4;

impl Pending {
    /// Resolves once a request has been pending (read from, not yet answered) for longer than
    /// `timeout` (checked every `timeout / 4`). An idle keep-alive connection, or one writing
    /// its answer, never expires.
    async fn expired(self, timeout: Duration) {
        let period = (timeout / u32::from(TICKS_PER_TIMEOUT)).max(Duration::from_millis(5));
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            // The connection's reads and writes happen on this same task, between ticks.
            match self.0.load(Ordering::Relaxed) {
                0 => {}
                n if n > TICKS_PER_TIMEOUT => return,
                n => self.0.store(n + 1, Ordering::Relaxed),
            }
        }
    }
}

impl tokio::io::AsyncRead for Watched {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let res = Pin::new(&mut this.stream).poll_read(cx, buf);
        if buf.filled().len() > before && this.pending.load(Ordering::Relaxed) == 0 {
            this.pending.store(1, Ordering::Relaxed);
        }
        res
    }
}

impl tokio::io::AsyncWrite for Watched {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        this.pending.store(0, Ordering::Relaxed);
        Pin::new(&mut this.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        this.pending.store(0, Ordering::Relaxed);
        Pin::new(&mut this.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

/// Errors of one connection that `accept` reports; the listener itself is fine.
fn is_connection_error(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    matches!(
        e.kind(),
        ConnectionRefused | ConnectionAborted | ConnectionReset
    )
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

fn write_snapshot(app: &App, node: &str, dir: &std::path::Path) {
    match snapshot::save(&app.limiter, node, dir) {
        Ok(keys) => {
            crate::metrics::snapshot(true, keys);
            tracing::debug!(keys, "snapshot written");
        }
        Err(e) => {
            crate::metrics::snapshot(false, 0);
            tracing::error!(error = %e, "snapshot failed");
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
        let _ = tokio::task::spawn_blocking(move || write_snapshot(&app2, &node2, &dir2)).await;
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::TcpStream;

    use super::*;

    const CONFIG: &str = r#"
[node]
id = "t1"
region = "local"
http = "127.0.0.1:0"

[api]
request_timeout = "300ms"

[[rule]]
name = "r"
algorithm = "token_bucket"
rate = 1000
per = "1s"
burst = 1000
key_from = "header:x-key"
"#;

    const REQUEST: &[u8] = b"GET /v1/authz/r HTTP/1.1\r\nhost: t\r\nx-key: k\r\n\r\n";

    /// Reads one answer's head (up to the blank line); `None` if the connection was closed.
    fn read_head(s: &mut TcpStream) -> Option<String> {
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            match s.read(&mut byte) {
                Ok(1) => head.push(byte[0]),
                _ => return None,
            }
        }
        Some(String::from_utf8_lossy(&head).into_owned())
    }

    #[test]
    fn a_stalled_request_is_cut_off_and_an_idle_connection_is_kept() {
        let dir = std::env::temp_dir().join(format!("levee-server-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join("levee.toml");
        std::fs::write(&path, CONFIG).expect("config");
        let (tx, rx) = std::sync::mpsc::channel();
        let options = ServeOptions {
            config: Some(path),
            http_threads: Some(1),
            ..ServeOptions::default()
        };
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            let _ = rt.block_on(run(options, move |_, addr| {
                let _ = tx.send(addr);
            }));
        });
        let addr = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the node started");

        // Part of a request, then nothing: the node closes the connection without an answer.
        let mut stalled = TcpStream::connect(addr).expect("connect");
        stalled
            .set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        stalled
            .write_all(b"GET /v1/authz/r HTTP/1.1\r\nhost: t\r\n")
            .expect("write");
        let mut buf = [0u8; 64];
        match stalled.read(&mut buf) {
            Ok(0) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            other => panic!("the stalled request was not cut off: {other:?}"),
        }

        // A keep-alive connection idle for several timeouts between requests stays open.
        let mut idle = TcpStream::connect(addr).expect("connect");
        idle.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        idle.write_all(REQUEST).expect("write");
        let first = read_head(&mut idle).expect("an answer");
        assert!(first.starts_with("HTTP/1.1 200"), "{first}");
        std::thread::sleep(Duration::from_millis(1000));
        idle.write_all(REQUEST).expect("write");
        let second = read_head(&mut idle).expect("the idle connection was kept open");
        assert!(second.starts_with("HTTP/1.1 200"), "{second}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
