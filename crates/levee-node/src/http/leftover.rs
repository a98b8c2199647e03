//! What a handler leaves of a request's body.
//!
//! hyper keeps a connection open after an answer only if the request's body had been read
//! to its end by then. A handler that answers without reading it drops it: an early 401, 405,
//! 413 or 415, or `POST /admin/reload`, which takes no body. If the client's last bytes had
//! not arrived yet (a chunked body's final chunk, written a moment after the head, as some
//! clients do even for an empty body), hyper then closed the connection after the answer
//! without saying so, and a keep-alive client's next request on it failed.
//!
//! So a body is [`Tracked`]: dropped before its end, it is handed back to the service, which
//! reads the rest ([`drain`]) before it answers: at most `api.max_body` bytes, within
//! `api.request_timeout`. Beyond either, the answer says `Connection: close`, and the client
//! knows not to reuse the connection.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Bytes;
use http_body_util::{BodyExt, Limited};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use parking_lot::Mutex;

/// Where a [`Tracked`] body puts what its reader left.
pub(super) type Leftover = Arc<Mutex<Option<Incoming>>>;

/// A request body that, dropped before its end, leaves the rest in `left`. A request without
/// a body has no `left` (and costs no allocation).
pub(super) struct Tracked {
    body: Option<Incoming>,
    /// Set once a read returned the end.
    ended: bool,
    left: Option<Leftover>,
}

impl Tracked {
    pub(super) fn new(body: Incoming, left: Option<Leftover>) -> Tracked {
        Tracked {
            body: Some(body),
            ended: false,
            left,
        }
    }
}

impl Body for Tracked {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        let Some(body) = this.body.as_mut() else {
            return Poll::Ready(None);
        };
        let polled = Pin::new(body).poll_frame(cx);
        if matches!(polled, Poll::Ready(None)) {
            this.ended = true;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.ended || self.body.as_ref().is_none_or(Incoming::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.body
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), Incoming::size_hint)
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        if let (Some(body), Some(left)) = (self.body.take(), self.left.as_ref())
            && !body.is_end_stream()
        {
            *left.lock() = Some(body);
        }
    }
}

/// Reads the rest of a body a handler left: whether it ended within `limit` bytes and
/// `within` (what it held is dropped).
pub(super) async fn drain(body: Incoming, limit: usize, within: Duration) -> bool {
    // Announced longer than that (a 413 judged by `Content-Length`): nothing to wait for.
    if body.size_hint().lower() > limit as u64 {
        return false;
    }
    let read = Limited::new(body, limit).collect();
    matches!(tokio::time::timeout(within, read).await, Ok(Ok(_)))
}
