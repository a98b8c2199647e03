//! Forwarding: a node sends the checks whose key a region-mate owns to that owner, batched
//! ([`forward_loop`]), and decides, as the owner, the checks its region-mates forward
//! ([`decide_forwarded`]).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use levee_cluster::Outgoing;
use levee_core::{Millis, NodeIdx};
use levee_proto::{ForwardCheck, ForwardDecision};
use tokio::sync::{mpsc, oneshot};

use super::Replication;
use crate::limiter::{CheckRef, Limiter};

/// Most checks in one forwarded batch: what the receiving owner accepts.
const FORWARD_BATCH: usize = levee_proto::MAX_FORWARD_CHECKS;

pub(super) struct Job {
    pub(super) check: ForwardCheck,
    /// When it was asked (the node's clock).
    pub(super) now: Millis,
    pub(super) reply: oneshot::Sender<Option<ForwardDecision>>,
}

/// Decides a check forwarded by a region-mate, as the key's owner; `alone` when this node
/// owns the key only because its owner is unreachable (as in [`Limiter::check_with`]).
/// `None` if it cannot be decided here (the forwarder then decides alone).
pub fn decide_forwarded(
    limiter: &Limiter,
    c: &ForwardCheck,
    alone: bool,
) -> Option<ForwardDecision> {
    let req = CheckRef {
        rule: &c.rule,
        key: &c.key,
        cost: c.cost,
        class: c.class.as_deref(),
        idempotency_key: c.idempotency_key.as_deref(),
        dry_run: c.dry_run,
    };
    let out = if c.refund {
        limiter.refund_with(req, alone)
    } else {
        limiter.check_with(req, alone)
    }
    .ok()?;
    let d = out.decision;
    Some(ForwardDecision {
        allowed: d.allowed,
        would_allow: d.would_allow,
        limit: d.limit,
        remaining: d.remaining,
        reset_after_ms: d.reset_after_ms,
        // An admitted decision has no retry-after: the field carries a leaky bucket's delay
        // instead (levee_proto::ForwardDecision), so the wire format stays as it is.
        retry_after_ms: if d.would_allow {
            d.delay_ms
        } else {
            d.retry_after_ms
        },
        degraded: d.degraded,
    })
}

/// The callers of one forwarded batch, by position: answered as soon as the owner's answer
/// is merged (on the task that received it), after which `done` lets the forwarder send the
/// next batch. Dropped unanswered (the batch failed), every caller and the forwarder see
/// their channel closed: the callers decide alone.
pub(super) struct Waiter {
    pub(super) replies: Vec<oneshot::Sender<Option<ForwardDecision>>>,
    pub(super) done: oneshot::Sender<()>,
}

impl Waiter {
    /// Answers every caller, in order: the machine hands over one decision per check
    /// (an answer of any other length fails the batch instead).
    pub(super) fn answer(self, decisions: Vec<Option<ForwardDecision>>) {
        for (reply, d) in self.replies.into_iter().zip(decisions) {
            let _ = reply.send(d);
        }
        let _ = self.done.send(());
    }
}

/// Sends batches of checks to one owner through the machine, one batch in flight at a time:
/// the checks queued meanwhile go together in the next.
pub(super) async fn forward_loop(
    repl: Arc<Replication>,
    owner: NodeIdx,
    mut rx: mpsc::Receiver<Job>,
) {
    while let Some(first) = rx.recv().await {
        let mut jobs = vec![first];
        while jobs.len() < FORWARD_BATCH {
            match rx.try_recv() {
                Ok(j) => jobs.push(j),
                Err(_) => break,
            }
        }
        let now = jobs.iter().map(|j| j.now).max().unwrap_or(0);
        let (checks, replies): (Vec<ForwardCheck>, Vec<_>) =
            jobs.into_iter().map(|j| (j.check, j.reply)).unzip();
        let (done, finished) = oneshot::channel();
        let (out, deadline) = {
            let mut c = repl.cluster.lock();
            let id = c.forward(owner, checks, now);
            repl.waiting.lock().insert(id, Waiter { replies, done });
            let out: Vec<Outgoing> = std::iter::from_fn(|| c.poll_transmit()).collect();
            (out, c.poll_timeout())
        };
        repl.send_all(out);
        if deadline < repl.timer_at.load(Ordering::Acquire) {
            repl.wake_timer.notify_one();
        }
        // Answered, or failed (the waiter dropped), by the machine's events.
        let _ = finished.await;
    }
}
