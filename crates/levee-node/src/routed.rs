//! Decisions of several keys at once, each where it belongs: a batch (every check on its own,
//! the forwarded ones queued together so that each owner gets them in one message and one
//! round trip) and an atomic `all` call whose keys have different owners (reserve at every
//! owner, release everything reserved if one of them denies).

use levee_cluster::Route;
use levee_core::{Millis, NodeIdx, RuleMode};
use levee_proto::ForwardDecision;
use tokio::sync::oneshot;

use crate::app::{App, decision_of, forward_check};
use crate::limiter::{AllEntry, AllOutcome, ApiError, CheckRef, Outcome};

/// Where a check was decided, and so where tokens it took are given back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DecidedAt {
    /// Here, as the key's owner (or a node alone).
    Here,
    /// Here, alone: the owner was unreachable or did not answer in time.
    Alone,
    /// At the key's owner in this region.
    Owner(NodeIdx),
}

/// A check being decided: here already, or queued for its owner.
enum Pending {
    Here(Outcome, DecidedAt),
    Owner(NodeIdx, Option<oneshot::Receiver<Option<ForwardDecision>>>),
}

impl App {
    /// Starts deciding `req` where it belongs: here at once, or queued for its owner behind
    /// the checks queued before it.
    fn start(&self, req: CheckRef<'_>, now: Millis) -> Result<Pending, ApiError> {
        let Some(repl) = self.replication.as_ref() else {
            return Ok(Pending::Here(self.limiter.check(req)?, DecidedAt::Here));
        };
        Ok(match repl.route(req.key) {
            Route::Local => Pending::Here(self.limiter.check_with(req, false)?, DecidedAt::Here),
            Route::Alone => Pending::Here(self.limiter.check_with(req, true)?, DecidedAt::Alone),
            // An allow- or deny-listed key is decided by any node, from the list alone.
            Route::Owner(_) if self.limiter.is_listed(req) => {
                Pending::Here(self.limiter.check(req)?, DecidedAt::Here)
            }
            Route::Owner(owner) => match self.local_first {
                true => match self.limiter.check_if_held(req)? {
                    Some(out) => Pending::Here(out, DecidedAt::Here),
                    None => Pending::Owner(
                        owner,
                        repl.forward_start(owner, forward_check(req, false), now),
                    ),
                },
                false => Pending::Owner(
                    owner,
                    repl.forward_start(owner, forward_check(req, false), now),
                ),
            },
        })
    }

    /// The decision of a started check: the owner's, or this node's alone (under its
    /// conservative cap) if the owner did not decide in time.
    async fn finish(
        &self,
        req: CheckRef<'_>,
        pending: Pending,
    ) -> Result<(Outcome, DecidedAt), ApiError> {
        match pending {
            Pending::Here(out, at) => Ok((out, at)),
            Pending::Owner(owner, rx) => {
                let answer = match rx {
                    Some(rx) => rx.await.ok().flatten(),
                    None => None,
                };
                match answer {
                    Some(d) => {
                        let decision = decision_of(d, &self.limiter, req);
                        Ok((
                            self.limiter.outcome_of(req, decision)?,
                            DecidedAt::Owner(owner),
                        ))
                    }
                    None => Ok((self.limiter.check_with(req, true)?, DecidedAt::Alone)),
                }
            }
        }
    }

    /// Decides several checks, each on its own, each where it belongs, in order: the checks
    /// of one key go to one place, which decides them in the order given. The forwarded ones
    /// are all queued before any answer is awaited, so each owner gets them together. Every
    /// check is validated before any is decided.
    pub async fn batch(&self, checks: &[CheckRef<'_>]) -> Result<Vec<Outcome>, ApiError> {
        if self.replication.is_none() {
            return self.limiter.batch(checks);
        }
        for (i, c) in checks.iter().enumerate() {
            self.limiter.validate(*c).map_err(|e| ApiError {
                message: format!("checks[{i}].{}", e.message),
                ..e
            })?;
        }
        let now = self.limiter.clock.now_ms();
        let mut pending = Vec::with_capacity(checks.len());
        for c in checks {
            pending.push(self.start(*c, now)?);
        }
        let mut out = Vec::with_capacity(checks.len());
        for (c, p) in checks.iter().zip(pending) {
            out.push(self.finish(*c, p).await?.0);
        }
        Ok(out)
    }

    /// An atomic call: allowed only if every enforced rule allows, nothing consumed
    /// otherwise. When every key is decided here, one local decision locks them all
    /// ([`crate::limiter::Limiter::check_all`]). When keys have other owners in this region,
    /// every entry is reserved where it belongs (the owners' checks travel together) and, if
    /// one is denied, every reservation is released where it was made (a refund with an
    /// idempotency key of its own, so a retried call releases nothing twice). Between the two,
    /// for about one round trip inside the region, a reservation counts against its key.
    pub async fn check_all(
        &self,
        entries: &[AllEntry],
        cost: u64,
        dry_run: bool,
        idempotency_key: Option<&str>,
    ) -> Result<AllOutcome, ApiError> {
        let elsewhere = self.replication.as_ref().is_some_and(|repl| {
            entries
                .iter()
                .any(|e| matches!(repl.route(&e.key), Route::Owner(_)))
        });
        if !elsewhere {
            return self
                .limiter
                .check_all(entries, cost, dry_run, idempotency_key);
        }
        // Every entry validated as the local call would (errors name `all[i]`; a duplicate is
        // refused) before anything is decided.
        self.limiter.validate_all(entries, cost)?;
        let reqs: Vec<CheckRef<'_>> = entries
            .iter()
            .map(|e| CheckRef {
                rule: &e.rule,
                key: &e.key,
                cost,
                class: e.class.as_deref(),
                idempotency_key,
                dry_run,
            })
            .collect();
        let now = self.limiter.clock.now_ms();
        let mut pending = Vec::with_capacity(reqs.len());
        for r in &reqs {
            pending.push(self.start(*r, now)?);
        }
        let mut decided = Vec::with_capacity(reqs.len());
        for (r, p) in reqs.iter().zip(pending) {
            decided.push(self.finish(*r, p).await?);
        }
        let rules = self.limiter.rules();
        let enforced: Vec<bool> = entries
            .iter()
            .map(|e| {
                rules
                    .by_name
                    .get(e.rule.as_str())
                    .is_none_or(|r| r.rule.mode == RuleMode::Enforce)
            })
            .collect();
        let allowed = decided
            .iter()
            .zip(&enforced)
            .all(|((o, _), &enforce)| o.decision.would_allow || !enforce);
        if !allowed && !dry_run && cost > 0 {
            let release_key = idempotency_key
                .map(|k| format!("all-release/{:016x}", levee_core::hash::fnv1a(k.as_bytes())));
            for ((r, (out, at)), &enforce) in reqs.iter().zip(decided.iter_mut()).zip(&enforced) {
                if out.decision.would_allow {
                    let release = CheckRef {
                        idempotency_key: release_key.as_deref(),
                        ..*r
                    };
                    if let Some(back) = self
                        .release(release, *at, now, out.decision.reset_after_ms)
                        .await
                    {
                        out.decision.remaining = back.decision.remaining;
                        out.decision.reset_after_ms = back.decision.reset_after_ms;
                    }
                }
                if enforce {
                    out.decision.allowed = false;
                }
            }
        }
        let binding = decided
            .iter()
            .zip(&enforced)
            .position(|((o, _), &enforce)| enforce && !o.decision.would_allow)
            .unwrap_or_else(|| {
                (0..decided.len())
                    .min_by_key(|&i| decided[i].0.decision.remaining)
                    .unwrap_or(0)
            });
        Ok(AllOutcome {
            allowed,
            binding,
            results: decided.into_iter().map(|(o, _)| o).collect(),
        })
    }

    /// Gives back a reservation of a denied atomic call where it was taken, asked for at
    /// `asked` and answered `reset_after_ms`. `None` if the owner could not be reached: the
    /// reservation then stays counted (on the safe side of the limit), and is counted in
    /// `levee_all_release_failed_total`. Also `None`, counted in
    /// `levee_all_release_withheld_total`, where a refund could land after the reservation's
    /// window ended: a window's refund draws from the window it arrives in, and would free a
    /// right the next window never gave ([`levee_core::Algorithm::late_refund_is_safe`]).
    /// Here that is decided at the refund's own instant; at another owner the refund is
    /// allowed [`levee_cluster::GIVE_BACK_MARGIN_MS`] to get there, as a late answer's
    /// give-back is. So a reservation is withheld only in a window that ends within that
    /// margin: it stays counted for at most that long.
    async fn release(
        &self,
        req: CheckRef<'_>,
        at: DecidedAt,
        asked: Millis,
        reset_after_ms: u64,
    ) -> Option<Outcome> {
        let withheld = || {
            metrics::counter!("levee_all_release_withheld_total").increment(1);
            None
        };
        let back = match at {
            DecidedAt::Here | DecidedAt::Alone => {
                match self
                    .limiter
                    .release_with(req, at == DecidedAt::Alone, asked, reset_after_ms)
                {
                    Ok(Some(out)) => Some(out),
                    Ok(None) => return withheld(),
                    Err(_) => None,
                }
            }
            DecidedAt::Owner(owner) => {
                let repl = self.replication.as_ref()?;
                let now = self.limiter.clock.now_ms();
                let algorithm = self.limiter.rules().algorithm_of(req.rule, req.class, now);
                if !levee_cluster::give_back_is_safe(algorithm.as_ref(), reset_after_ms, asked, now)
                {
                    return withheld();
                }
                match repl.forward(owner, forward_check(req, true), now).await {
                    Some(d) => self
                        .limiter
                        .outcome_of(req, decision_of(d, &self.limiter, req))
                        .ok(),
                    None => None,
                }
            }
        };
        if back.is_none() {
            metrics::counter!("levee_all_release_failed_total").increment(1);
            tracing::warn!(
                rule = req.rule,
                key = req.key,
                "an atomic call was denied but a reservation could not be released; it stays \
                 counted"
            );
        }
        back
    }
}
