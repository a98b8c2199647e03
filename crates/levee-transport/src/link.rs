//! The way from this node to one peer: a lazily dialled connection, redialled after failure
//! with exponential backoff, and a bounded queue of fire-and-forget frames written one per
//! unidirectional stream by a task of its own.
//!
//! Guarantees: a caller never waits on the network to enqueue a frame; a frame that cannot be
//! sent (queue full, peer unreachable or backing off, stream failed) is dropped and counted,
//! never retried — the replication protocol above tolerates loss; while a dial has failed, no
//! new dial happens before the backoff expires, however many frames are sent.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Mutex, mpsc};
use tokio::time::Instant;
use tracing::{debug, warn};

use crate::connection::{PeerConn, connect, refuse};
use crate::frame_io::{FrameError, read_frame, write_frame};
use crate::metrics;
use crate::transport::{Shared, TransportError};

/// Frames waiting to be written to one peer; beyond this, new frames are dropped.
const SEND_QUEUE_FRAMES: usize = 1024;
/// A dial (QUIC and TLS handshake, then `Hello`s) that takes longer than this has failed.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// First wait after a failed dial; doubles with every further failure.
const BACKOFF_MIN: Duration = Duration::from_millis(100);
/// Longest wait between two dials of an unreachable peer.
const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// The way to one peer.
pub(crate) struct PeerLink {
    id: String,
    addr: SocketAddr,
    queue: mpsc::Sender<Vec<u8>>,
    state: Mutex<LinkState>,
    shared: Arc<Shared>,
}

#[derive(Default)]
struct LinkState {
    conn: Option<PeerConn>,
    failures: u32,
    retry_at: Option<Instant>,
    last_error: String,
}

impl PeerLink {
    /// Creates the link and spawns its sending task, which ends when the transport shuts down.
    pub(crate) fn start(shared: Arc<Shared>, id: String, addr: SocketAddr) -> Arc<PeerLink> {
        let (queue, frames) = mpsc::channel(SEND_QUEUE_FRAMES);
        let link = Arc::new(PeerLink {
            id,
            addr,
            queue,
            state: Mutex::new(LinkState::default()),
            shared,
        });
        tokio::spawn(link.clone().run(frames));
        link
    }

    /// Queues a whole frame for the sending task, or drops it if the queue is full.
    pub(crate) fn enqueue(&self, frame: Vec<u8>) {
        match self.queue.try_send(frame) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => {
                metrics::frame_dropped(&self.id, "queue_full")
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                metrics::frame_dropped(&self.id, "shutdown")
            }
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
        metrics::frame_sent(&self.id, frame.len());
        match read_frame(&mut recv, &pc.budget).await {
            Ok(Some((msg, bytes))) => {
                metrics::frame_received(&self.id, bytes);
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

    async fn run(self: Arc<Self>, mut frames: mpsc::Receiver<Vec<u8>>) {
        let mut shutdown = self.shared.shutdown.clone();
        loop {
            let frame = tokio::select! {
                frame = frames.recv() => match frame {
                    Some(frame) => frame,
                    None => return,
                },
                _ = shutdown.wait_for(|down| *down) => return,
            };
            self.write(frame).await;
        }
    }

    async fn write(&self, frame: Vec<u8>) {
        let pc = match self.connection().await {
            Ok(pc) => pc,
            Err(e) => {
                metrics::frame_dropped(&self.id, "unreachable");
                debug!(peer = %self.id, error = %e, "dropped a frame");
                return;
            }
        };
        let written = async {
            let mut stream = pc.conn.open_uni().await.map_err(|e| e.to_string())?;
            write_frame(&mut stream, &frame).await
        };
        match written.await {
            Ok(()) => metrics::frame_sent(&self.id, frame.len()),
            Err(e) => {
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
        let dialled =
            tokio::time::timeout(CONNECT_TIMEOUT, connect(&self.shared, &self.id, self.addr))
                .await
                .unwrap_or_else(|_| Err(format!("no connection within {CONNECT_TIMEOUT:?}")));
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
                let delay = backoff(state.failures);
                state.retry_at = Some(Instant::now() + delay);
                metrics::connect_failed(&self.id);
                warn!(peer = %self.id, addr = %self.addr, %reason, retry_in = ?delay, "cannot connect to peer");
                state.last_error = reason.clone();
                Err(self.unreachable(reason))
            }
        }
    }

    fn unreachable(&self, reason: String) -> TransportError {
        TransportError::Unreachable {
            peer: self.id.clone(),
            reason,
        }
    }
}

/// The wait before the next dial after `failures` consecutive failed dials.
fn backoff(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    BACKOFF_MIN.saturating_mul(1 << doublings).min(BACKOFF_MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_its_cap() {
        assert_eq!(backoff(1), BACKOFF_MIN);
        assert_eq!(backoff(2), BACKOFF_MIN * 2);
        assert_eq!(backoff(4), BACKOFF_MIN * 8);
        assert_eq!(backoff(100), BACKOFF_MAX);
    }
}
