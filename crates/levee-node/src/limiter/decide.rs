//! The decision path: one check, a batch of independent checks, a refund. Each check is
//! looked up and validated before any counter is touched; a retry with a known idempotency
//! key is answered from the cache without being charged again.

use levee_core::{DecideCtx, Decision, KeyState, Millis};

use super::api_error::ApiError;
use super::idempotency::Cached;
use super::outcome::Outcome;
use super::request::{CheckRef, Field};
use super::rule_set::{Resolved, global_remaining, outcome};
use super::state::Limiter;

impl Limiter {
    /// Checks a request as [`Limiter::check`] would, without deciding it.
    pub fn validate(&self, req: CheckRef<'_>) -> Result<(), ApiError> {
        let rules = self.rules.load();
        let overrides = self.overrides.load();
        let now = self.clock.now_ms();
        rules.resolve_check(&overrides, now, req).map(|_| ())
    }

    /// Whether the check's key is on an allow or deny list: it is then decided here, by any
    /// node, without its state (a forwarding node need not ask the key's owner).
    pub fn is_listed(&self, req: CheckRef<'_>) -> bool {
        let rules = self.rules.load();
        let overrides = self.overrides.load();
        let now = self.clock.now_ms();
        rules
            .resolve_check(&overrides, now, req)
            .is_ok_and(|r| r.list.is_some())
    }

    /// The outcome of a decision made elsewhere (by the key's owner).
    pub fn outcome_of(&self, req: CheckRef<'_>, decision: Decision) -> Result<Outcome, ApiError> {
        let rules = self.rules.load();
        let overrides = self.overrides.load();
        let now = self.clock.now_ms();
        let r = rules.resolve_check(&overrides, now, req)?;
        Ok(outcome(&r, decision, None, now))
    }

    /// Decides one check.
    pub fn check(&self, req: CheckRef<'_>) -> Result<Outcome, ApiError> {
        self.check_with(req, false)
    }

    /// Decides one check; `acting_alone` when this node is not the key's owner and decides
    /// because the owner is unreachable (under its own conservative cap).
    pub fn check_with(&self, req: CheckRef<'_>, acting_alone: bool) -> Result<Outcome, ApiError> {
        let rules = self.rules.load();
        let overrides = self.overrides.load();
        let now = self.clock.now_ms();
        let r = rules.resolve_check(&overrides, now, req)?;
        let ctx = self.ctx_alone(&rules, now, acting_alone);
        let mut id = Vec::new();
        r.id_into(&mut id, req.key);
        let (decision, local) = self.decide_resolved(&r, &id, req, Field::Top, &ctx)?;
        Ok(outcome(&r, decision, Some(local), now))
    }

    /// `cluster.local_first`: decides `req` here if this node's own rights admit it now,
    /// although another node of the region owns its key; `Ok(None)` when it must go to the
    /// owner (this node holds too little, or see [`Limiter::at_held_key`]). Nothing is
    /// consumed unless it is admitted; a check sent on counts toward this node's demand
    /// forecast, so that rights follow it here.
    pub fn check_if_held(&self, req: CheckRef<'_>) -> Result<Option<Outcome>, ApiError> {
        if req.dry_run {
            return Ok(None);
        }
        self.at_held_key(
            req,
            |r, s, ctx| s.decide_if_held(&r.target, r.entry.rule.mode, req.cost, ctx),
            |r, d, now| {
                self.record(&r.entry.metrics, d, false);
                self.notices
                    .observe(&r.entry.rule.name, r.target.algorithm, req.key, d, now);
                crate::activity::sample(req.rule, req.key);
            },
        )
    }

    /// `cluster.local_first`: gives `req`'s tokens back here, although another node of the
    /// region owns its key, when this node counted enough of it to give them back in full
    /// ([`levee_core::KeyState::refundable_here`]: it most likely admitted the check itself);
    /// `Ok(None)` when the refund must go to the owner.
    pub fn refund_if_held(&self, req: CheckRef<'_>) -> Result<Option<Outcome>, ApiError> {
        self.at_held_key(
            req,
            |r, s, ctx| {
                s.refundable_here(&r.target, req.cost, ctx)
                    .then(|| s.refund(&r.target, req.cost, ctx))
            },
            |_, _, _| {},
        )
    }

    /// What [`Limiter::check_if_held`] and [`Limiter::refund_if_held`] share: `decide` runs
    /// on the key's state held here, under its lock, and says what was decided (`None`: the
    /// owner decides); `then` runs after a decision here. The owner decides, without `decide`
    /// running, a request with an idempotency key (its answer is remembered at the owner) or
    /// of cost 0, a listed or overridden key, a sliding log or leaky bucket
    /// ([`levee_core::Algorithm::decided_where_held`]) and a key not held here (its owner
    /// creates it). The key is listed as changed whatever `decide` did: a check sent on
    /// still moved this node's demand.
    fn at_held_key(
        &self,
        req: CheckRef<'_>,
        decide: impl FnOnce(&Resolved<'_>, &mut KeyState, &DecideCtx<'_>) -> Option<Decision>,
        then: impl FnOnce(&Resolved<'_>, &Decision, Millis),
    ) -> Result<Option<Outcome>, ApiError> {
        if req.idempotency_key.is_some() || req.cost == 0 {
            return Ok(None);
        }
        let rules = self.rules.load();
        let overrides = self.overrides.load();
        let now = self.clock.now_ms();
        let r = rules.resolve_check(&overrides, now, req)?;
        if r.list.is_some() || r.overridden || !r.target.algorithm.decided_where_held() {
            return Ok(None);
        }
        let ctx = self.ctx(&rules, now);
        let mut id = Vec::new();
        r.id_into(&mut id, req.key);
        let Some(entry) = self.store.get(&id) else {
            return Ok(None);
        };
        let decided = {
            let mut slot = entry.lock();
            if slot.removed {
                return Ok(None);
            }
            let s = &mut slot.state;
            let d = decide(&r, s, &ctx).map(|d| global_remaining(s, &r.target, &ctx, d));
            // As any decision: a token bucket left near full is not listed now.
            self.store.note_as_asked(&entry, &mut slot);
            d
        };
        let Some((d, local)) = decided else {
            return Ok(None);
        };
        then(&r, &d, now);
        Ok(Some(outcome(&r, d, Some(local), now)))
    }

    /// Forgets the answer remembered under `req`'s idempotency key, if any: a check that
    /// waited for rights (`crate::wait`) decides again, and its final answer is the one a
    /// retry gets back.
    pub fn forget_answer(&self, req: CheckRef<'_>) {
        let Some(k) = req.idempotency_key else {
            return;
        };
        let rules = self.rules.load();
        let overrides = self.overrides.load();
        let Ok(r) = rules.resolve_check(&overrides, self.clock.now_ms(), req) else {
            return;
        };
        let mut id = Vec::new();
        r.id_into(&mut id, req.key);
        self.idempotency.invalidate(&(id.into(), k.to_owned()));
    }

    /// Decides a resolved check, answering a retry with a known idempotency key from the
    /// cache (without charging it again). The decision's `remaining` is the global estimate;
    /// beside it, what this node can grant at once.
    fn decide_resolved(
        &self,
        r: &Resolved<'_>,
        id: &[u8],
        req: CheckRef<'_>,
        field: Field,
        ctx: &DecideCtx<'_>,
    ) -> Result<(Decision, u64), ApiError> {
        if let Some(list) = r.list {
            // On a list: decided without the key's state, nothing counted or cached.
            let d = r.listed(list);
            self.record(&r.entry.metrics, &d, req.dry_run);
            return Ok((d, d.remaining));
        }
        let decide = || {
            let f = |s: &mut levee_core::KeyState| {
                if let Some(d) = over_global_limit(s, r, req.cost, req.dry_run, ctx) {
                    return global_remaining(s, &r.target, ctx, d);
                }
                let d = s.decide(&r.target, r.entry.rule.mode, req.cost, req.dry_run, ctx);
                global_remaining(s, &r.target, ctx, d)
            };
            // A read (a dry run, a check of cost 0) creates no key: a key not held is
            // answered as a fresh one would be.
            let (d, local) = if req.dry_run || req.cost == 0 {
                self.store.with_existing(id, f)
            } else {
                self.store.with(id, f)
            };
            self.record(&r.entry.metrics, &d, req.dry_run);
            if !req.dry_run && req.cost > 0 {
                let rule = &r.entry.rule.name;
                self.notices
                    .observe(rule, r.target.algorithm, req.key, &d, ctx.now);
            }
            if !req.dry_run {
                crate::activity::sample(req.rule, req.key);
            }
            (d, local)
        };
        let Some(k) = req.idempotency_key.filter(|_| !req.dry_run) else {
            return Ok(decide());
        };
        let window = r.target.algorithm.policy_window_secs(ctx.now) * 1000;
        let mut fresh = false;
        let (cached, _) = self.idempotency.get_with((id.into(), k.to_owned()), || {
            fresh = true;
            let (d, local) = decide();
            (Cached::One(d, local), window)
        });
        if !fresh {
            self.metrics.replays.increment(1);
        }
        match cached {
            Cached::One(d, local) => Ok((d, local)),
            Cached::All(..) => Err(ApiError::invalid(format!(
                "{field}idempotency_key: already used for an `all` call"
            ))),
            Cached::Refund(..) => Err(ApiError::invalid(format!(
                "{field}idempotency_key: already used for a refund"
            ))),
        }
    }

    /// Decides several checks, each on its own, in order, at one instant. Every check is
    /// validated before any is decided.
    pub fn batch(&self, checks: &[CheckRef<'_>]) -> Result<Vec<Outcome>, ApiError> {
        let rules = self.rules.load();
        let overrides = self.overrides.load();
        let now = self.clock.now_ms();
        let mut resolved = Vec::with_capacity(checks.len());
        for (i, c) in checks.iter().enumerate() {
            resolved.push(rules.resolve(
                &overrides,
                now,
                Field::Check(i),
                c.rule,
                c.key,
                c.class,
                c.cost,
            )?);
        }
        let ctx = self.ctx(&rules, now);
        let mut id = Vec::with_capacity(64);
        let mut out = Vec::with_capacity(checks.len());
        for (i, (c, r)) in checks.iter().zip(&resolved).enumerate() {
            r.id_into(&mut id, c.key);
            let (d, local) = self.decide_resolved(r, &id, *c, Field::Check(i), &ctx)?;
            out.push(outcome(r, d, Some(local), now));
        }
        Ok(out)
    }

    /// Gives tokens back; with an idempotency key, a retry gets the first refund's answer
    /// back and gives nothing more back.
    pub fn refund(&self, req: CheckRef<'_>) -> Result<Outcome, ApiError> {
        self.refund_with(req, false)
    }

    /// Gives tokens back; `acting_alone` as in [`Limiter::check_with`].
    pub fn refund_with(&self, req: CheckRef<'_>, acting_alone: bool) -> Result<Outcome, ApiError> {
        self.refund_guarded(req, acting_alone, None)
            .map(|out| out.expect("an unguarded refund is always made"))
    }

    /// Gives back a reservation made here that nobody used (an atomic call denied by another
    /// owner), asked for at `asked` and answered `reset_after_ms`, if a refund now cannot
    /// free a right its window never gave ([`levee_core::Algorithm::late_refund_is_safe`]:
    /// a window's refund draws from the window it arrives in). `Ok(None)`: withheld, the
    /// reservation stays counted.
    pub fn release_with(
        &self,
        req: CheckRef<'_>,
        acting_alone: bool,
        asked: Millis,
        reset_after_ms: u64,
    ) -> Result<Option<Outcome>, ApiError> {
        self.refund_guarded(req, acting_alone, Some((asked, reset_after_ms)))
    }

    /// A refund, made only if `guard` (when asked, what it answered) says it is safe now.
    fn refund_guarded(
        &self,
        req: CheckRef<'_>,
        acting_alone: bool,
        guard: Option<(Millis, u64)>,
    ) -> Result<Option<Outcome>, ApiError> {
        let rules = self.rules.load();
        let overrides = self.overrides.load();
        let now = self.clock.now_ms();
        let r = rules.resolve_check(&overrides, now, req)?;
        if let Some((asked, reset_after_ms)) = guard
            && !r
                .target
                .algorithm
                .late_refund_is_safe(reset_after_ms, now.saturating_sub(asked))
        {
            return Ok(None);
        }
        if let Some(list) = r.list {
            // A listed key was not counted: nothing to give back.
            return Ok(Some(outcome(&r, r.listed(list), None, now)));
        }
        let ctx = self.ctx_alone(&rules, now, acting_alone);
        let id = r.id(req.key);
        // A key not held has nothing to give back: it is answered as a fresh one, not created.
        let refund = || {
            self.store.with_existing(&id, |s| {
                let d = s.refund(&r.target, req.cost, &ctx);
                global_remaining(s, &r.target, &ctx, d)
            })
        };
        let Some(k) = req.idempotency_key else {
            let (d, local) = refund();
            return Ok(Some(outcome(&r, d, Some(local), now)));
        };
        // Remembered in a space of its own: the key's identity followed by 0xfd (never in a
        // key's UTF-8 bytes; an `all` call's identities use 0xfe), so that the check that took
        // the tokens and the refund that gives them back may share an idempotency key.
        let mut refund_id = id.clone();
        refund_id.push(0xfd);
        let window = r.target.algorithm.policy_window_secs(now) * 1000;
        let mut fresh = false;
        let (cached, _) = self
            .idempotency
            .get_with((refund_id.into(), k.to_owned()), || {
                fresh = true;
                let (d, local) = refund();
                (Cached::Refund(d, local), window)
            });
        if !fresh {
            self.metrics.replays.increment(1);
        }
        match cached {
            Cached::Refund(d, local) => Ok(Some(outcome(&r, d, Some(local), now))),
            Cached::One(..) | Cached::All(..) => Err(ApiError::invalid(
                "idempotency_key: already used for a check",
            )),
        }
    }
}

/// Strict mode, a key with its own figures (an override): a denial when what the cluster used
/// of the key, as this node knows it, leaves less than `cost` of the override's limit.
///
/// Rights a node gave under the rule's capacity (or a previous override's) stay given when the
/// capacity goes down: a donor's share shrinks below what it gave, and its receivers hold
/// more than the new split says, so the rights held can add up to more than the new limit.
/// Two checks bound that. No node admits past the new limit less what it knows was used
/// everywhere. And while some node has given more than its new share (`in_debt`), each
/// region admits only up to its own share of the new limit, less its part of what the other
/// regions used beyond theirs ([`over_regional_share`]): regions that decide at the same time
/// cannot add up to more than the limit, however late they hear of each other's admissions.
/// docs/replication.md, "Overrides".
pub(super) fn over_global_limit(
    s: &mut levee_core::KeyState,
    r: &Resolved<'_>,
    cost: u64,
    dry_run: bool,
    ctx: &DecideCtx<'_>,
) -> Option<Decision> {
    if !r.overridden || dry_run || cost == 0 {
        return None;
    }
    let usage = s.usage(&r.target, ctx);
    if usage.remaining >= cost && !over_regional_share(s, r, &usage, cost, ctx) {
        return None;
    }
    let mode = r.entry.rule.mode;
    let mut d = s.decide(&r.target, mode, cost, true, ctx);
    d.would_allow = false;
    d.allowed = mode == levee_core::RuleMode::Shadow;
    d.retry_after_ms = usage.reset_after_ms.max(1);
    d.delay_ms = 0;
    Some(d)
}

/// Whether some node gave away more rights than the key's split now gives it (its capacity
/// went down after it gave): the rights held can add up to more than the limit. Read from the
/// scope rights are held in (the current epoch's transfers, or the continuous holdings).
fn in_debt(s: &levee_core::KeyState, target: &levee_core::Target<'_>, ctx: &DecideCtx<'_>) -> bool {
    let algo = target.algorithm;
    let crdt = s.crdt();
    let matrix = match algo.rights_per_epoch() {
        true => crdt.slot(algo.epoch(ctx.now)).map(|slot| &slot.transfers),
        false => Some(&crdt.holdings),
    };
    let Some(matrix) = matrix.filter(|m| !m.is_empty()) else {
        return false;
    };
    let split = ctx.replicas.split(algo.capacity());
    ctx.replicas
        .nodes()
        .any(|n| i128::from(split[usize::from(n.0)]) + matrix.net(n) < 0)
}

/// A key in debt (`in_debt`): whether admitting `cost` would take this node's region past its
/// bound. Each region's share of the new limit is the sum of its nodes' split; regions that
/// used more than their share (before the limit went down) admit nothing, and what they used
/// beyond it is taken from the others' shares, in proportion. The bounds sum to the limit less
/// what was used beyond shares, so regions admitting at once stay within the limit, provided
/// each knows what the others used before the change (gossiped every interval).
fn over_regional_share(
    s: &levee_core::KeyState,
    r: &Resolved<'_>,
    usage: &levee_core::Usage,
    cost: u64,
    ctx: &DecideCtx<'_>,
) -> bool {
    if !in_debt(s, &r.target, ctx) {
        return false;
    }
    let replicas = ctx.replicas;
    let split = replicas.split(r.target.algorithm.capacity());
    let share = |region: levee_core::RegionIdx| -> u128 {
        replicas
            .region_nodes(region)
            .iter()
            .map(|n| u128::from(split[usize::from(n.0)]))
            .sum()
    };
    let used = |region: levee_core::RegionIdx| -> u128 {
        u128::from(
            usage
                .regions
                .get(usize::from(region.0))
                .copied()
                .unwrap_or(0),
        )
    };
    let (mut excess, mut under) = (0u128, 0u128);
    for region in replicas.regions() {
        let (u, f) = (used(region), share(region));
        if u > f {
            excess += u - f;
        } else {
            under += f;
        }
    }
    let mine = replicas.region_of(ctx.me);
    let (u, f) = (used(mine), share(mine));
    if u >= f || under == 0 {
        return true;
    }
    let taken = (f * excess).div_ceil(under);
    u + u128::from(cost) > f.saturating_sub(taken)
}
