//! The way from this node to one peer: a lazily dialled connection, redialled after failure
//! with exponential backoff, and a bounded queue of fire-and-forget frames written by a task
//! of its own, in order, on one long-lived unidirectional stream per connection.
//!
//! Why one stream, not one per frame: QUIC shares a connection's bandwidth fairly between
//! its open streams, so hundreds of one-frame streams all progress at once and each takes as
//! long as the whole backlog; under load (a fast fill) every frame then outlived the
//! receiver's payload timeout and was thrown away, which made the backlog worse. On one
//! stream frames arrive whole and in order, the first first, and a slow reader slows the
//! writer down through the stream's flow control instead of timing frames out.
//!
//! Guarantees: a caller never waits on the network to enqueue a frame; a frame that cannot be
//! sent (queue full — more than [`SEND_QUEUE_FRAMES`] frames or [`SEND_QUEUE_BYTES`] bytes
//! waiting —, peer unreachable or backing off, stream failed) is dropped and counted, never
//! retried — the replication protocol above tolerates loss; while a dial has failed, no new
//! dial happens before the backoff expires, however many frames are sent — unless the peer is
//! heard again (the link is the peer's [`HeardListener`]): then the link dials at once, and
//! replaces a dial under way that is at least [`REDIAL_MIN_AGE`] plus three round trips old,
//! once per signal. There is never more than one dial in flight per peer (the state lock is
//! held across it). What waits is visible: `levee_transport_queue_frames{peer}` and
//! `levee_transport_queue_bytes{peer}`.
//!
//! A link lives as long as its peer is one of the transport's peers at its address: when
//! [`Transport::set_peers`](crate::Transport::set_peers) removes the peer or moves it, the
//! link is [stopped](PeerLink::stop) — its task ends, its queued frames are dropped and
//! counted, its connection is closed, and it never dials again.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use quinn::SendStream;
use tokio::sync::{Mutex, Notify, mpsc, watch};
use tokio::time::Instant;
use tracing::{debug, warn};

use crate::config::{DialAddr, DialTiming};
use crate::connection::{PeerConn, connect, refuse};
use crate::error::TransportError;
use crate::frame_io::{FrameError, read_frame, write_frame};
use crate::metrics::{self, PeerMeter};
use crate::shared::{HeardListener, Shared};

/// Frames waiting to be written to one peer; beyond this, new frames are dropped.
pub(crate) const SEND_QUEUE_FRAMES: usize = 1024;
/// Bytes of frames waiting to be written to one peer; beyond this, new frames are dropped.
pub(crate) const SEND_QUEUE_BYTES: usize = 16 << 20;
/// Application error code closing a connection to redial it.
const RECONNECT: quinn::VarInt = quinn::VarInt::from_u32(4);
/// Application error code closing the connection of a link that was stopped: its peer is no
/// longer one of this node's peers, or is now dialled at another address.
const CLOSE_STOPPED: quinn::VarInt = quinn::VarInt::from_u32(5);
/// Youngest a dial may be, beyond three round trips to the peer (as measured on the
/// connection the peer was heard on), when a sign of life from the peer replaces it with a
/// new one: the bound on how often the peer's frames can make this link redial (at most ten
/// dials a second, and only while its connection is down), and time enough for a dial whose
/// packets do get through to finish (handshake and `Hello`s: about two round trips), so a
/// slow link is not redialled for ever.
const REDIAL_MIN_AGE: Duration = Duration::from_millis(100);

/// The way to one peer.
pub(crate) struct PeerLink {
    id: String,
    /// The peer's frame and queue series.
    meter: PeerMeter,
    addr: DialAddr,
    queue: mpsc::Sender<Vec<u8>>,
    /// Bytes of the frames in `queue`.
    queued_bytes: AtomicUsize,
    state: Mutex<LinkState>,
    /// Signalled when the peer is heard (an inbound connection's `Hello`, or a frame) while
    /// this link is not connected; one stored permit at most, however many signals.
    heard: Notify,
    /// The round trip (µs) of the connection the peer was last heard on while this link was
    /// down.
    heard_rtt_us: AtomicU64,
    timing: DialTiming,
    shared: Arc<Shared>,
    /// Set by [`PeerLink::stop`]: the link's task ends and the link dials no more.
    stopped: watch::Sender<bool>,
}

#[derive(Default)]
struct LinkState {
    conn: Option<PeerConn>,
    failures: u32,
    retry_at: Option<Instant>,
    last_error: String,
}

impl PeerLink {
    /// Creates the link and spawns its sending task, which ends when the transport shuts down
    /// or the link is [stopped](PeerLink::stop).
    pub(crate) fn start(
        shared: Arc<Shared>,
        id: String,
        addr: DialAddr,
        timing: DialTiming,
    ) -> Arc<PeerLink> {
        let (queue, frames) = mpsc::channel(SEND_QUEUE_FRAMES);
        let link = Arc::new(PeerLink {
            meter: PeerMeter::new(&id),
            id,
            addr,
            queue,
            queued_bytes: AtomicUsize::new(0),
            state: Mutex::new(LinkState::default()),
            heard: Notify::new(),
            heard_rtt_us: AtomicU64::new(0),
            timing,
            shared,
            stopped: watch::Sender::new(false),
        });
        tokio::spawn(link.clone().run(frames));
        link
    }

    /// Queues a whole frame for the sending task, or drops it if the queue is full.
    pub(crate) fn enqueue(&self, frame: Vec<u8>) {
        let len = frame.len();
        let before = self.queued_bytes.fetch_add(len, Ordering::AcqRel);
        if before + len > SEND_QUEUE_BYTES {
            self.queued_bytes.fetch_sub(len, Ordering::AcqRel);
            metrics::frame_dropped(&self.id, "queue_full");
            return;
        }
        match self.queue.try_send(frame) {
            Ok(()) => self.report_queue(),
            Err(e) => {
                self.queued_bytes.fetch_sub(len, Ordering::AcqRel);
                match e {
                    mpsc::error::TrySendError::Full(_) => {
                        metrics::frame_dropped(&self.id, "queue_full")
                    }
                    mpsc::error::TrySendError::Closed(_) if *self.stopped.borrow() => {
                        metrics::frame_dropped(&self.id, "unknown_peer")
                    }
                    mpsc::error::TrySendError::Closed(_) => {
                        metrics::frame_dropped(&self.id, "shutdown")
                    }
                }
            }
        }
    }

    /// Where this link dials its peer.
    pub(crate) fn addr(&self) -> &DialAddr {
        &self.addr
    }

    /// Stops the link, whose peer is no longer one of this node's peers (or is to be dialled
    /// at another address, by a new link): its task ends — a dial under way is abandoned, the
    /// connection, if any, is closed, and the frames still queued are dropped and counted
    /// (`unknown_peer`, as are frames enqueued later) — and it never dials again. Returns at
    /// once; idempotent.
    pub(crate) fn stop(&self) {
        self.stopped.send_replace(true);
    }

    fn report_queue(&self) {
        let frames = self.queue.max_capacity() - self.queue.capacity();
        self.meter
            .queue(frames, self.queued_bytes.load(Ordering::Acquire));
    }

    /// Closes the connection to the peer, if any, so that the next frame dials anew. For a
    /// connection the peer no longer hears: after a one-way cut its end may be gone while
    /// ours, still hearing the peer's keep-alives, would only notice at its idle timeout.
    pub(crate) fn reconnect(&self) {
        if let Ok(mut state) = self.state.try_lock()
            && let Some(pc) = state.conn.take()
        {
            pc.conn.close(RECONNECT, b"peer does not hear us");
            debug!(peer = %self.id, "closed the connection to redial");
        }
    }

    /// Sends a whole frame on a new bidirectional stream and reads one frame back.
    pub(crate) async fn request(
        &self,
        frame: &[u8],
    ) -> Result<levee_proto::Message, TransportError> {
        let pc = self.connection().await?;
        let stream_error = |reason: String| TransportError::Stream {
            peer: self.id.clone(),
            reason,
        };
        let (mut send, mut recv) = pc
            .conn
            .open_bi()
            .await
            .map_err(|e| stream_error(e.to_string()))?;
        write_frame(&mut send, frame).await.map_err(stream_error)?;
        self.meter.sent(frame.len());
        match read_frame(&mut recv, &pc.budget).await {
            Ok(Some((msg, bytes))) => {
                self.meter.received(bytes);
                Ok(msg)
            }
            Ok(None) => Err(TransportError::NoReply {
                peer: self.id.clone(),
            }),
            Err(e) => {
                refuse(&self.id, &e, &mut recv);
                match e {
                    FrameError::Refused(source) => Err(TransportError::Refused {
                        peer: self.id.clone(),
                        source,
                    }),
                    other => Err(stream_error(other.to_string())),
                }
            }
        }
    }

    /// The link's task: writes the queued frames, and dials at once when the peer is heard
    /// while the link is down, until the transport shuts down or the link is stopped.
    async fn run(self: Arc<Self>, mut frames: mpsc::Receiver<Vec<u8>>) {
        tokio::select! {
            () = self.send_queued(&mut frames) => {}
            () = self.ended() => {}
        }
        if *self.stopped.borrow() {
            self.wind_down(frames).await;
        }
    }

    async fn send_queued(&self, frames: &mut mpsc::Receiver<Vec<u8>>) {
        let mut stream: Option<(usize, SendStream)> = None;
        loop {
            let frame = tokio::select! {
                frame = frames.recv() => match frame {
                    Some(frame) => Some(frame),
                    None => return,
                },
                () = self.heard.notified() => None,
            };
            let Some(frame) = frame else {
                // The peer is back while this link is down: end the backoff and dial now
                // rather than at the first frame after the backoff.
                self.state.lock().await.retry_at = None;
                let _ = self.connection().await;
                continue;
            };
            self.queued_bytes.fetch_sub(frame.len(), Ordering::AcqRel);
            self.report_queue();
            self.write(&mut stream, frame).await;
        }
    }

    /// Resolves once the transport shuts down or the link is stopped.
    async fn ended(&self) {
        let mut shutdown = self.shared.shutdown.clone();
        let mut stopped = self.stopped.subscribe();
        tokio::select! {
            _ = shutdown.wait_for(|down| *down) => {}
            _ = stopped.wait_for(|stopped| *stopped) => {}
        }
    }

    /// After [`stop`](PeerLink::stop): drops and counts the frames still queued, and closes the
    /// connection (after a dial that a request has under way ends, so that its connection is
    /// closed too; a later dial is refused by [`connection`](PeerLink::connection)).
    async fn wind_down(&self, mut frames: mpsc::Receiver<Vec<u8>>) {
        frames.close();
        while let Ok(frame) = frames.try_recv() {
            self.queued_bytes.fetch_sub(frame.len(), Ordering::AcqRel);
            metrics::frame_dropped(&self.id, "unknown_peer");
        }
        self.report_queue();
        if let Some(pc) = self.state.lock().await.conn.take() {
            pc.conn
                .close(CLOSE_STOPPED, b"no longer a peer at this address");
        }
        debug!(peer = %self.id, addr = %self.addr, "link stopped");
    }

    /// Writes one frame on the connection's stream, opening both if needed.
    async fn write(&self, stream: &mut Option<(usize, SendStream)>, frame: Vec<u8>) {
        let pc = match self.connection().await {
            Ok(pc) => pc,
            Err(e) => {
                metrics::frame_dropped(&self.id, "unreachable");
                debug!(peer = %self.id, error = %e, "dropped a frame");
                return;
            }
        };
        let conn_id = pc.conn.stable_id();
        if stream.as_ref().is_none_or(|(id, _)| *id != conn_id) {
            match pc.conn.open_uni().await {
                Ok(s) => *stream = Some((conn_id, s)),
                Err(e) => {
                    metrics::frame_dropped(&self.id, "stream");
                    debug!(peer = %self.id, error = %e, "dropped a frame: cannot open a stream");
                    return;
                }
            }
        }
        let Some((_, send)) = stream.as_mut() else {
            return;
        };
        match send.write_all(&frame).await {
            Ok(()) => self.meter.sent(frame.len()),
            Err(e) => {
                // The stream is gone with its connection (or was stopped): the next frame
                // opens a new one.
                *stream = None;
                metrics::frame_dropped(&self.id, "stream");
                debug!(peer = %self.id, error = %e, "dropped a frame");
            }
        }
    }

    /// The live connection to the peer, dialling it if there is none and the backoff allows.
    /// Concurrent callers wait for one dial rather than each dialling.
    async fn connection(&self) -> Result<PeerConn, TransportError> {
        let mut state = self.state.lock().await;
        if let Some(pc) = &state.conn {
            if pc.conn.close_reason().is_none() {
                return Ok(pc.clone());
            }
            debug!(peer = %self.id, "connection lost; will redial");
            state.conn = None;
        }
        if state.retry_at.is_some_and(|at| Instant::now() < at) {
            return Err(self.unreachable(format!("backing off after: {}", state.last_error)));
        }
        if *self.shared.shutdown.borrow() {
            return Err(TransportError::ShutDown);
        }
        if *self.stopped.borrow() {
            return Err(TransportError::UnknownPeer(self.id.clone()));
        }
        let timeout = self.timing.connect_timeout;
        let ipv6 = self.shared.endpoint.local_addr().is_ok_and(|a| a.is_ipv6());
        // A name is resolved again at every dial: a peer that moved is found at its new address.
        let dial = || {
            tokio::time::timeout(timeout, async {
                let addr = self.addr.resolve(ipv6).await?;
                connect(&self.shared, &self.id, addr).await
            })
        };
        let pending = dial();
        tokio::pin!(pending);
        let mut started = Instant::now();
        let mut heard = false;
        let dialled = loop {
            tokio::select! {
                dialled = &mut pending => {
                    break dialled
                        .unwrap_or_else(|_| Err(format!("no connection within {timeout:?}")));
                }
                () = self.heard.notified(), if !heard => heard = true,
                () = tokio::time::sleep_until(started + self.redial_min_age()), if heard => {
                    // The peer is heard but this dial has not got through (its Initial was
                    // likely lost before the heal): replace it with a fresh one, once per
                    // signal, never two at a time.
                    debug!(peer = %self.id, "peer heard while dialling it; dialling anew");
                    pending.set(dial());
                    started = Instant::now();
                    heard = false;
                }
            }
        };
        match dialled {
            Ok(pc) => {
                *state = LinkState {
                    conn: Some(pc.clone()),
                    ..LinkState::default()
                };
                Ok(pc)
            }
            Err(reason) => {
                state.failures = state.failures.saturating_add(1);
                let delay = self.timing.backoff(state.failures);
                state.retry_at = Some(Instant::now() + delay);
                metrics::connect_failed(&self.id);
                warn!(peer = %self.id, addr = %self.addr, %reason, retry_in = ?delay, "cannot connect to peer");
                state.last_error = reason.clone();
                Err(self.unreachable(reason))
            }
        }
    }

    /// How old a dial must be before a sign of life from the peer replaces it.
    fn redial_min_age(&self) -> Duration {
        let rtt = Duration::from_micros(self.heard_rtt_us.load(Ordering::Relaxed));
        REDIAL_MIN_AGE.saturating_add(rtt.saturating_mul(3))
    }

    fn unreachable(&self, reason: String) -> TransportError {
        TransportError::Unreachable {
            peer: self.id.clone(),
            reason,
        }
    }
}

impl HeardListener for PeerLink {
    /// The peer was heard from (an inbound connection of its completed its `Hello`, or one of
    /// its frames arrived). If this link is not connected — dialling, or backing off after a
    /// failed dial — the peer is evidently reachable again: the link gives up its backoff or
    /// its pending dial (whose lost Initial packets QUIC would resend only after a backed-off
    /// probe timeout) and dials at once. Many signals in a row coalesce into one redial.
    fn heard(&self, rtt: Duration) {
        let down = match self.state.try_lock() {
            Ok(state) => state
                .conn
                .as_ref()
                .is_none_or(|pc| pc.conn.close_reason().is_some()),
            // Held by a dial, or (briefly) by a caller taking the live connection.
            Err(_) => true,
        };
        if down {
            let rtt_us = u64::try_from(rtt.as_micros()).unwrap_or(u64::MAX);
            self.heard_rtt_us.store(rtt_us, Ordering::Relaxed);
            self.heard.notify_one();
        }
    }

    /// The peer's new connection says it is process `incarnation`. A connection of this
    /// link's to another process of the peer leads nowhere — the peer restarted (killed,
    /// say), and what this link writes on it is lost until QUIC's idle timeout, while the
    /// restarted peer waits for our answer to its pull — so it is closed, and the link dials
    /// the new process at once.
    fn hello(&self, incarnation: u64, rtt: Duration) {
        if let Ok(mut state) = self.state.try_lock()
            && state
                .conn
                .as_ref()
                .is_some_and(|pc| pc.incarnation != incarnation)
            && let Some(pc) = state.conn.take()
        {
            pc.conn.close(RECONNECT, b"peer restarted");
            debug!(peer = %self.id, "the peer restarted: closed the connection to its previous process");
        }
        self.heard(rtt);
    }
}
