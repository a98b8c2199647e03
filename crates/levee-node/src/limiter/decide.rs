//! The decision path: one check, a batch of independent checks, a refund. Each check is
//! looked up and validated before any counter is touched; a retry with a known idempotency
//! key is answered from the cache without being charged again.

use levee_core::{DecideCtx, Decision};

use super::api_error::ApiError;
use super::idempotency::Cached;
use super::outcome::Outcome;
use super::request::{CheckRef, Field};
use super::rule_set::{Resolved, outcome};
use super::state::Limiter;

impl Limiter {
    /// Checks a request as [`Limiter::check`] would, without deciding it.
    pub fn validate(&self, req: CheckRef<'_>) -> Result<(), ApiError> {
        let rules = self.rules.load();
        rules
            .resolve(Field::Top, req.rule, req.key, req.class, req.cost)
            .map(|_| ())
    }

    /// The outcome of a decision made elsewhere (by the key's owner).
    pub fn outcome_of(&self, req: CheckRef<'_>, decision: Decision) -> Result<Outcome, ApiError> {
        let rules = self.rules.load();
        let r = rules.resolve(Field::Top, req.rule, req.key, req.class, req.cost)?;
        Ok(outcome(&r, decision, self.clock.now_ms()))
    }

    /// Decides one check.
    pub fn check(&self, req: CheckRef<'_>) -> Result<Outcome, ApiError> {
        self.check_with(req, false)
    }

    /// Decides one check; `acting_alone` when this node is not the key's owner and decides
    /// because the owner is unreachable (under its own conservative cap).
    pub fn check_with(&self, req: CheckRef<'_>, acting_alone: bool) -> Result<Outcome, ApiError> {
        let rules = self.rules.load();
        let r = rules.resolve(Field::Top, req.rule, req.key, req.class, req.cost)?;
        let now = self.clock.now_ms();
        let ctx = self.ctx_alone(&rules, now, acting_alone);
        let mut id = Vec::new();
        r.id_into(&mut id, req.key);
        let decision = self.decide_resolved(&r, &id, req, Field::Top, &ctx)?;
        Ok(outcome(&r, decision, now))
    }

    /// Decides a resolved check, answering a retry with a known idempotency key from the
    /// cache (without charging it again).
    fn decide_resolved(
        &self,
        r: &Resolved<'_>,
        id: &[u8],
        req: CheckRef<'_>,
        field: Field,
        ctx: &DecideCtx<'_>,
    ) -> Result<Decision, ApiError> {
        let decide = || {
            let d = self.store.with(id, |s| {
                s.decide(&r.target, r.entry.rule.mode, req.cost, req.dry_run, ctx)
            });
            self.record(&r.entry.metrics, &d, req.dry_run);
            d
        };
        let Some(k) = req.idempotency_key.filter(|_| !req.dry_run) else {
            return Ok(decide());
        };
        let window = r.target.algorithm.policy_window_secs(ctx.now) * 1000;
        let mut fresh = false;
        let (cached, _) = self.idempotency.get_with((id.into(), k.to_owned()), || {
            fresh = true;
            (Cached::One(decide()), window)
        });
        if !fresh {
            self.metrics.replays.increment(1);
        }
        match cached {
            Cached::One(d) => Ok(d),
            Cached::All(_) => Err(ApiError::invalid(format!(
                "{field}idempotency_key: already used for an `all` call"
            ))),
        }
    }

    /// Decides several checks, each on its own, in order, at one instant. Every check is
    /// validated before any is decided.
    pub fn batch(&self, checks: &[CheckRef<'_>]) -> Result<Vec<Outcome>, ApiError> {
        let rules = self.rules.load();
        let mut resolved = Vec::with_capacity(checks.len());
        for (i, c) in checks.iter().enumerate() {
            resolved.push(rules.resolve(Field::Check(i), c.rule, c.key, c.class, c.cost)?);
        }
        let now = self.clock.now_ms();
        let ctx = self.ctx(&rules, now);
        let mut id = Vec::with_capacity(64);
        let mut out = Vec::with_capacity(checks.len());
        for (i, (c, r)) in checks.iter().zip(&resolved).enumerate() {
            r.id_into(&mut id, c.key);
            let d = self.decide_resolved(r, &id, *c, Field::Check(i), &ctx)?;
            out.push(outcome(r, d, now));
        }
        Ok(out)
    }

    /// Gives tokens back.
    pub fn refund(
        &self,
        rule: &str,
        key: &str,
        cost: u64,
        class: Option<&str>,
    ) -> Result<Outcome, ApiError> {
        self.refund_with(rule, key, cost, class, false)
    }

    /// Gives tokens back; `acting_alone` as in [`Limiter::check_with`].
    pub fn refund_with(
        &self,
        rule: &str,
        key: &str,
        cost: u64,
        class: Option<&str>,
        acting_alone: bool,
    ) -> Result<Outcome, ApiError> {
        let rules = self.rules.load();
        let r = rules.resolve(Field::Top, rule, key, class, cost)?;
        let now = self.clock.now_ms();
        let ctx = self.ctx_alone(&rules, now, acting_alone);
        let d = self
            .store
            .with(&r.id(key), |s| s.refund(&r.target, cost, &ctx));
        Ok(outcome(&r, d, now))
    }
}
