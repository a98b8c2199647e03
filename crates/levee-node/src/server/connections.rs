//! The HTTP connections of a node: threads that serve them, the cap on open connections, and
//! the watch on each (request and idle time limits, hyper's own error answers made JSON).

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::app::App;
use crate::http;

/// Accepts HTTP/1.1 connections until `stop` turns true, then stops accepting and waits for
/// the open connections to finish their requests (idle keep-alive connections are closed).
///
/// Each connection is served on one of `threads` threads, each running its own
/// single-threaded runtime (the one with the fewest open connections gets the next): a
/// request is read, decided and answered on one thread, without the wake-ups and work
/// stealing between the workers of a shared runtime. Background work (replication, reloads,
/// snapshots) stays on the runtime `run` was called on.
///
/// At most `api.max_connections` are open at once: a connection accepted beyond that is
/// closed at once (and counted). A connection with no request in progress for
/// `api.idle_timeout` is closed, and so is one whose request takes longer than
/// `api.request_timeout` from its first bytes to its answer ([`Pending`]).
pub(super) async fn serve_http(
    listener: TcpListener,
    app: Arc<App>,
    threads: usize,
    mut stop: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let router = http::router(Arc::clone(&app));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut builder = hyper::server::conn::http1::Builder::new();
    // One buffer, one `write(2)`: the answers are small, so copying the body after the head
    // costs less than the kernel's vectored-write path. (`Watched` relies on it too: hyper's
    // own error answers come in one `poll_write`.)
    builder.writev(false);
    let builder = Arc::new(builder);
    let workers = HttpThreads::start(threads)?;
    let open = OpenConnections::new();
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
        let (max, idle) = {
            let config = app.config.load();
            (
                config.api.max_connections,
                Duration::from_millis(config.api.idle_timeout.as_millis()),
            )
        };
        let Some(slot) = open.take(max) else {
            crate::metrics::connection_refused();
            tracing::debug!(%peer, max, "refusing a connection: api.max_connections are open");
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        // Registered again with the reactor of the thread that serves it.
        let Ok(stream) = stream.into_std() else {
            continue;
        };
        let calls = Arc::new(AtomicU32::new(0));
        let api =
            http::Api::new(Arc::clone(&app), router.clone(), peer).counting(Arc::clone(&calls));
        let builder = Arc::clone(&builder);
        let watcher = graceful.watcher();
        let timeout = app.request_timeout();
        workers.spawn(async move {
            let _slot = slot;
            let Ok(stream) = tokio::net::TcpStream::from_std(stream) else {
                return;
            };
            let (stream, pending) = Watched::new(stream, calls);
            let conn = watcher.watch(builder.serve_connection(TokioIo::new(stream), api));
            tokio::select! {
                res = conn => if let Err(e) = res {
                    tracing::trace!(error = %e, "connection ended with an error");
                },
                why = pending.expired(timeout, idle) => {
                    crate::metrics::connection_closed(why.as_str());
                    tracing::debug!(%peer, reason = why.as_str(), "closing a connection");
                }
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

/// The count of open HTTP connections, behind `levee_http_connections_open`.
#[derive(Clone)]
struct OpenConnections {
    n: Arc<std::sync::atomic::AtomicUsize>,
    gauge: metrics::Gauge,
}

/// One open connection's place among [`OpenConnections`]; given back when dropped.
struct Slot(OpenConnections);

impl OpenConnections {
    fn new() -> OpenConnections {
        OpenConnections {
            n: Arc::default(),
            gauge: crate::metrics::connections_open(),
        }
    }

    /// A place for one more connection, unless `max` are open.
    fn take(&self, max: usize) -> Option<Slot> {
        self.n
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()?;
        self.gauge.increment(1.0);
        Some(Slot(self.clone()))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.n.fetch_sub(1, Ordering::AcqRel);
        self.0.gauge.decrement(1.0);
    }
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

/// A connection's stream, noting whether a request is pending (bytes have been read since the
/// connection last wrote an answer) and whether anything was read at all. With
/// [`Pending::expired`] this gives two limits without a timer per request (hyper's
/// `header_read_timeout` arms one for every request), one coarse tick per connection:
///
/// * the time of a request from its first bytes to the first bytes of its answer — a client
///   that sends part of a request and stalls is cut off (and so is a request whose handling
///   takes as long);
/// * the time a connection may sit with no request in progress (`api.idle_timeout`),
///   including a client that connected and never sent anything.
///
/// It also turns hyper's own answers to requests it cannot parse — `400`, `414`, `431`, which
/// hyper writes by itself with an empty body and no hook to change them — into the API's JSON
/// error answers: an answer head written when the service was not called for it (`calls`,
/// counted by [`http::Api`]) is one of those, and is replaced whole by [`parse_error_answer`].
struct Watched<S = tokio::net::TcpStream> {
    stream: S,
    state: Arc<ConnState>,
    calls: Arc<AtomicU32>,
    /// Final answer heads written so far.
    heads: u32,
    /// A replacement answer being written, and how much of it is written.
    replacement: Option<(Vec<u8>, usize)>,
}

/// What [`Watched`] and [`Pending`] share.
#[derive(Default)]
struct ConnState {
    /// 0 when no request is partly received, else 1 + the ticks that have seen the same
    /// partial request.
    pending: AtomicU32,
    /// Reads that returned bytes (wrapping).
    reads: AtomicU32,
}

/// The watch side of [`Watched`].
struct Pending(Arc<ConnState>);

/// Why [`Pending::expired`] resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expired {
    /// A request was pending for longer than `api.request_timeout`.
    RequestTimeout,
    /// No request was in progress for `api.idle_timeout`.
    Idle,
}

impl Expired {
    fn as_str(self) -> &'static str {
        match self {
            Expired::RequestTimeout => "request_timeout",
            Expired::Idle => "idle",
        }
    }
}

impl<S> Watched<S> {
    fn new(stream: S, calls: Arc<AtomicU32>) -> (Watched<S>, Pending) {
        let state = Arc::new(ConnState::default());
        let watch = Pending(Arc::clone(&state));
        let watched = Watched {
            stream,
            state,
            calls,
            heads: 0,
            replacement: None,
        };
        (watched, watch)
    }

    /// Whether an answer head about to be written is one hyper made by itself: every answer
    /// the service makes comes after its call, so a head beyond the calls is hyper's own.
    /// (`heads` counts the heads already written, each once however many writes it took.)
    fn is_hyper_answer(&self) -> bool {
        self.heads
            .wrapping_add(1)
            .wrapping_sub(self.calls.load(Ordering::Relaxed)) as i32
            > 0
    }
}

/// Ticks per time limit: a stalled request is cut off between 1 and 1.25 request timeouts
/// after its first bytes (an idle connection likewise, by the shorter of the two limits).
const TICKS_PER_TIMEOUT: u32 = 4;

impl Pending {
    /// Resolves once a request has been pending (read from, not yet answered) for longer than
    /// `timeout`, or no request has been in progress for `idle`. Checked every quarter of the
    /// shorter of the two.
    async fn expired(self, timeout: Duration, idle: Duration) -> Expired {
        let period = (timeout.min(idle) / TICKS_PER_TIMEOUT).max(Duration::from_millis(5));
        let start = tokio::time::Instant::now();
        let mut tick = tokio::time::interval_at(start + period, period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let ticks_per_timeout = timeout.as_nanos().div_ceil(period.as_nanos()).max(1);
        let ticks_per_timeout = u32::try_from(ticks_per_timeout).unwrap_or(u32::MAX - 1);
        let mut idle_since = start;
        let mut reads = self.0.reads.load(Ordering::Relaxed);
        loop {
            let now = tick.tick().await;
            // The connection's reads and writes happen on this same task, between ticks.
            let r = self.0.reads.load(Ordering::Relaxed);
            match self.0.pending.load(Ordering::Relaxed) {
                0 if r == reads => {
                    if now.duration_since(idle_since) >= idle {
                        return Expired::Idle;
                    }
                }
                0 => idle_since = now,
                n if n > ticks_per_timeout => return Expired::RequestTimeout,
                n => {
                    idle_since = now;
                    self.0.pending.store(n + 1, Ordering::Relaxed);
                }
            }
            reads = r;
        }
    }
}

impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Watched<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let res = Pin::new(&mut this.stream).poll_read(cx, buf);
        if buf.filled().len() > before {
            this.state.reads.fetch_add(1, Ordering::Relaxed);
            if this.state.pending.load(Ordering::Relaxed) == 0 {
                this.state.pending.store(1, Ordering::Relaxed);
            }
        }
        res
    }
}

impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Watched<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        this.state.pending.store(0, Ordering::Relaxed);
        let head = this.replacement.is_none() && starts_answer(buf);
        if head && this.is_hyper_answer() {
            this.heads = this.heads.wrapping_add(1);
            this.replacement = Some((parse_error_answer(buf), 0));
        }
        if let Some((answer, written)) = &mut this.replacement {
            // hyper's answer is taken whole (it is the last thing written on the
            // connection); ours goes out in its place.
            while *written < answer.len() {
                match Pin::new(&mut this.stream).poll_write(cx, &answer[*written..]) {
                    Poll::Ready(Ok(0)) => return Poll::Ready(Ok(0)),
                    Poll::Ready(Ok(n)) => *written += n,
                    other => return other,
                }
            }
            this.replacement = None;
            return Poll::Ready(Ok(buf.len()));
        }
        let res = Pin::new(&mut this.stream).poll_write(cx, buf);
        // A head counts once it is (partly) written: hyper offers it again after a
        // `Pending` (the client not reading fast enough), and counting it at every offer
        // took our own answer for hyper's and replaced it with a 400.
        if head && matches!(res, Poll::Ready(Ok(n)) if n > 0) {
            this.heads = this.heads.wrapping_add(1);
        }
        res
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        // Answers are flattened into one buffer (`writev(false)`); should a vectored write
        // come anyway, its first slice goes through `poll_write` (a short write is allowed).
        match bufs.iter().find(|b| !b.is_empty()) {
            Some(first) => self.poll_write(cx, first),
            None => Poll::Ready(Ok(0)),
        }
    }

    fn is_write_vectored(&self) -> bool {
        false
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

/// Whether `buf`, about to be written, starts a final answer head (`HTTP/1.1 NNN `; an
/// interim `100 Continue` is not an answer, and the body of one of our answers is JSON or
/// Prometheus text, never that).
fn starts_answer(buf: &[u8]) -> bool {
    buf.starts_with(b"HTTP/1.1 ") && buf.get(9) != Some(&b'1')
}

/// The JSON error answer that replaces hyper's own answer `head` (status only, empty body) to
/// a request it could not parse; the connection is closed after it, as hyper closes it.
fn parse_error_answer(head: &[u8]) -> Vec<u8> {
    let status = head.get(9..12).and_then(|s| std::str::from_utf8(s).ok());
    let (line, code, message) = match status {
        Some("414") => (
            "414 URI Too Long",
            "uri_too_long",
            "the request target is over 65534 bytes",
        ),
        Some("431") => (
            "431 Request Header Fields Too Large",
            "headers_too_large",
            "the request head is too large (over 100 headers, or over the 408 KiB read buffer)",
        ),
        _ => (
            "400 Bad Request",
            "invalid_request",
            "the request is not valid HTTP/1.1: a malformed request line or header (a target \
             with bytes that are not allowed, a header name or value that is not valid, two \
             different Content-Length headers …)",
        ),
    };
    let body = serde_json::json!({ "error": code, "message": message }).to_string();
    format!(
        "HTTP/1.1 {line}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Errors of one connection that `accept` reports; the listener itself is fine.
fn is_connection_error(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    matches!(
        e.kind(),
        ConnectionRefused | ConnectionAborted | ConnectionReset
    )
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::TcpStream;

    use super::*;
    use crate::server::{ServeOptions, run};

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

    /// A writer that answers `Pending` to the first write offered, then takes everything.
    struct SlowOnce {
        written: Vec<u8>,
        refused: bool,
    }

    impl tokio::io::AsyncWrite for SlowOnce {
        fn poll_write(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<std::io::Result<usize>> {
            if !self.refused {
                self.refused = true;
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            self.written.extend_from_slice(buf);
            Poll::Ready(Ok(buf.len()))
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn an_answer_head_offered_again_after_pending_is_written_as_is() {
        // Writes all of `buf` as hyper does: offering what is left until it is taken.
        async fn write_all(w: &mut Watched<SlowOnce>, mut buf: &[u8]) {
            use tokio::io::AsyncWrite;
            while !buf.is_empty() {
                let n = std::future::poll_fn(|cx| Pin::new(&mut *w).poll_write(cx, buf))
                    .await
                    .unwrap();
                buf = &buf[n..];
            }
        }
        let calls = Arc::new(AtomicU32::new(0));
        let slow = SlowOnce {
            written: Vec::new(),
            refused: false,
        };
        let (mut w, _pending) = Watched::new(slow, Arc::clone(&calls));
        let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}";
        for _ in 0..2 {
            // The service was called for each answer.
            calls.fetch_add(1, Ordering::Relaxed);
            write_all(&mut w, answer).await;
        }
        assert_eq!(w.stream.written, [&answer[..], &answer[..]].concat());
        // An answer head with no call behind it is hyper's own, and is replaced.
        write_all(
            &mut w,
            b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n",
        )
        .await;
        let text = String::from_utf8_lossy(&w.stream.written).into_owned();
        assert!(
            text.ends_with("}") && text.contains("invalid_request"),
            "{text}"
        );
    }

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
