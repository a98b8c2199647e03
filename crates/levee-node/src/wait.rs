//! Waiting for rights (`max_wait_ms`, API.md "Waiting for rights").
//!
//! In strict mode a node (or the owner it forwards to) holds only part of a key's global
//! limit. A check it denies while the cluster, as it sees it, still has room for the cost
//! (`remaining`, the global estimate, is at least the cost) was denied because this node
//! holds too little. That deny asks for rights: it counts as demand, which the next gossip
//! interval publishes, and in a long window it presses (`levee_core::escrow`). Donors give at
//! their next interval, and the transfer arrives with their next deltas: about two gossip
//! intervals and a round trip.
//!
//! A caller that says it can wait is answered when the rights arrive instead of at once:
//! every time a peer's state is merged here ([`Replication::merged`]) the check is looked at
//! again as a dry run, which changes nothing, and decided for real once it would be admitted.
//! A deny because the global limit is used up is answered at once, and so is every check
//! without `max_wait_ms`: nothing else on the request path waits.
//!
//! A check that waited and was then admitted is counted as one denial and one admission in
//! the decision metrics; `levee_waits_total{result}` counts the waits themselves. Its
//! idempotency key remembers the final answer.

use std::sync::atomic::Ordering;
use std::time::Duration;

use levee_core::RuleMode;
use tokio::sync::watch;

use crate::app::App;
use crate::limiter::{ApiError, CheckRef, Field, Outcome};

/// The longest wait a caller may ask for (API.md): 10 s.
pub const MAX_WAIT_MS: u64 = 10_000;

/// At most this many checks wait at once on a node; beyond, a check is answered at once
/// (counted in `levee_waits_total{result="busy"}`).
pub const MAX_WAITING: usize = 10_000;

/// `max_wait_ms` as a request gives it: absent is 0 (answer at once); 0 to [`MAX_WAIT_MS`].
pub fn max_wait_of(v: Option<i64>, field: Field) -> Result<u64, ApiError> {
    match v {
        None => Ok(0),
        Some(ms) if ms < 0 => Err(ApiError::invalid(format!(
            "{field}max_wait_ms: must not be negative"
        ))),
        Some(ms) if ms as u64 > MAX_WAIT_MS => Err(ApiError::invalid(format!(
            "{field}max_wait_ms: {ms} is more than {MAX_WAIT_MS} (10 s, the longest a check waits \
             for rights)"
        ))),
        Some(ms) => Ok(ms as u64),
    }
}

/// Whether `out`, the answer to `req`, is a deny that rights arriving could turn into an
/// admission: enforced, not decided by a list, the global estimate has room for the cost, and
/// not degraded. (A deny under a conservative cap, with a region or the owner out of reach,
/// is answered at once: the rights that would turn it cannot arrive, and the room it sees is
/// partly the unreachable side's unknown usage.)
fn worth_waiting(req: CheckRef<'_>, out: &Outcome) -> bool {
    let d = &out.decision;
    !d.allowed
        && !d.degraded
        && d.mode == RuleMode::Enforce
        && out.list.is_none()
        && req.cost > 0
        && d.remaining >= req.cost
}

/// Counts checks waiting while it lives.
struct Waiting<'a>(&'a App, usize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(self.1, Ordering::AcqRel);
    }
}

fn counted(result: &'static str, n: usize) {
    metrics::counter!("levee_waits_total", "result" => result).increment(n as u64);
}

impl App {
    /// Decides `req` as [`App::check`] does and, when it is denied only because this node
    /// (or the key's owner) holds too little, waits up to `max_wait_ms` for rights to arrive.
    /// Returns the answer and how long it waited, in ms.
    pub async fn check_waiting(
        &self,
        req: CheckRef<'_>,
        max_wait_ms: u64,
    ) -> Result<(Outcome, u64), ApiError> {
        // Subscribed before the first decision: a merge between the two is not missed.
        let Some(merged) = self.merges(max_wait_ms > 0 && !req.dry_run) else {
            // Nothing can wait: the check is answered as it always was.
            return Ok((self.check(req).await?, 0));
        };
        let mut out = [self.check(req).await?];
        let waited = self
            .wait_for_rights(&[req], &mut out, &[max_wait_ms], Some(merged))
            .await?;
        Ok((out[0], waited[0]))
    }

    /// What [`App::wait_for_rights`] waits on, when some check of a request may wait (take it
    /// before the checks are first decided).
    pub(crate) fn merges(&self, any_waits: bool) -> Option<watch::Receiver<u64>> {
        self.replication
            .as_ref()
            .filter(|_| any_waits)
            .map(|r| r.merged())
    }

    /// Waits for rights for every check of `reqs` whose first answer in `outs` is a deny
    /// that rights arriving could turn, up to its `max_wait_ms` in `waits`, all at once:
    /// whenever a peer's state is merged, the waiting checks are looked at again as dry runs
    /// (one batch), and those that would now be admitted are decided for real. `outs` ends
    /// with every check's final answer; returns how long each waited, in ms.
    pub(crate) async fn wait_for_rights(
        &self,
        reqs: &[CheckRef<'_>],
        outs: &mut [Outcome],
        waits: &[u64],
        merged: Option<watch::Receiver<u64>>,
    ) -> Result<Vec<u64>, ApiError> {
        let mut waited = vec![0; reqs.len()];
        let Some(mut merged) = merged else {
            return Ok(waited);
        };
        let mut waiting: Vec<usize> = (0..reqs.len())
            .filter(|&i| waits[i] > 0 && !reqs[i].dry_run && worth_waiting(reqs[i], &outs[i]))
            .collect();
        let n = waiting.len();
        if n == 0 {
            return Ok(waited);
        }
        if self.waiting.fetch_add(n, Ordering::AcqRel) + n > MAX_WAITING {
            self.waiting.fetch_sub(n, Ordering::AcqRel);
            counted("busy", n);
            return Ok(waited);
        }
        let _waiting = Waiting(self, n);
        let t0 = tokio::time::Instant::now();
        let mut closed = false;
        while !waiting.is_empty() {
            let first_due = waiting.iter().map(|&i| waits[i]).min().unwrap_or(0);
            if !closed {
                tokio::select! {
                    changed = merged.changed() => closed = changed.is_err(),
                    () = tokio::time::sleep_until(t0 + Duration::from_millis(first_due)) => {}
                }
            }
            let probes: Vec<CheckRef<'_>> = waiting
                .iter()
                .map(|&i| CheckRef {
                    dry_run: true,
                    ..reqs[i]
                })
                .collect();
            let probed = self.batch(&probes).await?;
            // On the timer's clock, which ended the sleep: a check whose wait is over is
            // never looked at again.
            let elapsed = t0.elapsed().as_millis().min(u128::from(u64::MAX)) as u64;
            let mut admit = Vec::new();
            let mut still = Vec::new();
            for (&i, p) in waiting.iter().zip(probed) {
                if p.decision.allowed {
                    admit.push(i);
                    continue;
                }
                outs[i] = p;
                waited[i] = elapsed;
                if !closed && elapsed < waits[i] && worth_waiting(reqs[i], &p) {
                    still.push(i);
                } else {
                    counted("denied", 1);
                }
            }
            if !admit.is_empty() {
                // The first (denied) answer was remembered under the idempotency key: the
                // final one replaces it.
                let real: Vec<CheckRef<'_>> = admit.iter().map(|&i| reqs[i]).collect();
                for r in &real {
                    self.limiter.forget_answer(*r);
                }
                for (&i, o) in admit.iter().zip(self.batch(&real).await?) {
                    counted(
                        if o.decision.allowed {
                            "admitted"
                        } else {
                            "denied"
                        },
                        1,
                    );
                    outs[i] = o;
                    waited[i] = elapsed;
                }
            }
            waiting = still;
        }
        Ok(waited)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_wait_is_bounded_and_named() {
        assert_eq!(max_wait_of(None, Field::Top).unwrap(), 0);
        assert_eq!(max_wait_of(Some(0), Field::Top).unwrap(), 0);
        assert_eq!(max_wait_of(Some(10_000), Field::Top).unwrap(), 10_000);
        let e = max_wait_of(Some(10_001), Field::Check(2)).unwrap_err();
        assert!(
            e.message
                .starts_with("checks[2].max_wait_ms: 10001 is more than 10000"),
            "{}",
            e.message
        );
        let e = max_wait_of(Some(-1), Field::Top).unwrap_err();
        assert_eq!(e.message, "max_wait_ms: must not be negative");
    }
}
