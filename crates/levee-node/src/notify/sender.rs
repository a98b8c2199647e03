//! The sender task: POSTs every queued notice, retrying with backoff on a failure or a
//! timeout for up to [`RETRY_FOR`](super::RETRY_FOR), at most [`MAX_IN_FLIGHT`] attempts at
//! once, and counts how each ends.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::http::{HeaderValue, Method, Request, header};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::sync::{Semaphore, mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::RETRY_FOR;
use super::watch::{Notices, Queued};
use crate::metrics::NoticeMetrics;

/// Most delivery attempts in progress at once (across targets); the others wait their turn.
pub const MAX_IN_FLIGHT: usize = 32;
/// The wait after the first failed attempt; it doubles after each, up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(200);
/// The longest wait between two attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(10);

type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// Starts the sender on `notices`' queue (once; `None` if it was already taken). It stops
/// when `stop` turns true: notices still queued or being retried then are dropped and counted.
pub fn run(notices: &Notices, stop: watch::Receiver<bool>) -> Option<tokio::task::JoinHandle<()>> {
    let queue = notices.take_queue()?;
    let counters = notices.counters().clone();
    Some(tokio::spawn(send_all(queue, counters, stop)))
}

async fn send_all(
    mut queue: mpsc::Receiver<Queued>,
    counters: NoticeMetrics,
    mut stop: watch::Receiver<bool>,
) {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client: HttpClient = Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(30))
        .build(connector);
    let slots = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    let mut deliveries = JoinSet::new();
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    loop {
        tokio::select! {
            next = queue.recv() => {
                let Some(q) = next else { break };
                seed = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
                deliveries.spawn(deliver(client.clone(), Arc::clone(&slots), counters.clone(), q, seed));
            }
            Some(_) = deliveries.join_next(), if !deliveries.is_empty() => {}
            _ = stop.wait_for(|s| *s) => break,
        }
    }
    queue.close();
    let mut dropped = deliveries.len() as u64;
    deliveries.abort_all();
    while let Ok(q) = queue.try_recv() {
        q.target.pending.fetch_sub(1, Ordering::AcqRel);
        dropped += 1;
    }
    if dropped > 0 {
        counters.dropped.increment(dropped);
        tracing::warn!(
            dropped,
            "threshold notices not yet delivered at shutdown were dropped"
        );
    }
}

/// Delivers one notice: attempts until one is answered 2xx, or until [`RETRY_FOR`] has passed
/// since the first.
async fn deliver(
    client: HttpClient,
    slots: Arc<Semaphore>,
    counters: NoticeMetrics,
    q: Queued,
    seed: u64,
) {
    let first = Instant::now();
    let body = Bytes::from(serde_json::to_vec(&q.notice).unwrap_or_default());
    let key = q.notice.idempotency_key();
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut backoff = FIRST_BACKOFF;
    let mut attempts = 0u32;
    let outcome = loop {
        attempts += 1;
        let result = match slots.acquire().await {
            Ok(_permit) => attempt(&client, &q, &key, body.clone()).await,
            Err(_) => Err("shutting down".to_owned()),
        };
        let why = match result {
            Ok(()) => break Ok(()),
            Err(why) => why,
        };
        // Waits between 50 % and 100 % of the backoff, so that nodes retrying the same
        // receiver spread out.
        let wait = backoff.mul_f64(0.5 + rng.f64() * 0.5);
        if first.elapsed() + wait >= RETRY_FOR {
            break Err(why);
        }
        tracing::debug!(url = %q.target.url, key, attempts, error = %why, "threshold notice not delivered; retrying");
        counters.retries.increment(1);
        tokio::time::sleep(wait).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    };
    q.target.pending.fetch_sub(1, Ordering::AcqRel);
    match outcome {
        Ok(()) => counters.sent.increment(1),
        Err(why) => {
            counters.failed.increment(1);
            tracing::warn!(url = %q.target.url, key, attempts, error = %why, "threshold notice failed for a minute; given up");
        }
    }
}

/// One POST within the target's timeout (connecting, sending, and reading the whole answer).
async fn attempt(client: &HttpClient, q: &Queued, key: &str, body: Bytes) -> Result<(), String> {
    let idempotency = HeaderValue::from_bytes(key.as_bytes())
        .map_err(|_| "the Idempotency-Key is not a valid header value".to_owned())?;
    let request = Request::builder()
        .method(Method::POST)
        .uri(q.target.uri.clone())
        .header(header::CONTENT_TYPE, "application/json")
        .header(
            header::USER_AGENT,
            concat!("levee/", env!("CARGO_PKG_VERSION")),
        )
        .header("idempotency-key", idempotency)
        .body(Full::new(body))
        .map_err(|e| e.to_string())?;
    let exchange = async {
        let response = client.request(request).await.map_err(|e| e.to_string())?;
        let status = response.status();
        // Read the answer whole, so that the connection can be used again.
        let _ = response.into_body().collect().await;
        if status.is_success() {
            Ok(())
        } else {
            Err(format!("answered {status}"))
        }
    };
    match tokio::time::timeout(q.target.timeout, exchange).await {
        Ok(result) => result,
        Err(_) => Err(format!("no answer within {:?}", q.target.timeout)),
    }
}
