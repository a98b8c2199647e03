//! The limiter: rules, the key store and the idempotency cache, behind the operations the
//! HTTP API offers. Every bad input is refused here with an [`ApiError`] naming the field,
//! before any counter is touched.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;
use levee_core::{
    AllDecision, ClusterView, Consistency, DecideCtx, Decision, KeyState, NodeIdx, ReplicaSet,
    Rule, RuleMode, Target, Usage, decide_all,
};
use moka::sync::Cache;
use parking_lot::MutexGuard;

use crate::config::Config;
use crate::metrics::{NodeMetrics, RuleMetrics};
use crate::store::{KeyId, Slot, Store, encode_id};

/// The longest key, in bytes.
pub const MAX_KEY_BYTES: usize = 512;

/// An error answered to the caller: HTTP status, error code and a message naming the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct ApiError {
    /// HTTP status.
    pub status: u16,
    /// Machine-readable code (`invalid_request`, `unknown_rule` …).
    pub code: &'static str,
    /// What was wrong, naming the field.
    pub message: String,
}

impl ApiError {
    /// `400 invalid_request`.
    pub fn invalid(message: impl Into<String>) -> ApiError {
        ApiError {
            status: 400,
            code: "invalid_request",
            message: message.into(),
        }
    }

    fn unknown_rule(field: &str, rule: &str) -> ApiError {
        ApiError {
            status: 404,
            code: "unknown_rule",
            message: format!("{field}: no rule named {rule:?} is configured"),
        }
    }
}

/// The node's clock: wall-clock milliseconds since the Unix epoch, plus an offset that only
/// tests set (to simulate a skewed node).
#[derive(Debug, Default)]
pub struct Clock {
    offset_ms: AtomicI64,
}

impl Clock {
    /// A clock with `offset_ms` added to the system time.
    pub fn with_offset(offset_ms: i64) -> Clock {
        Clock {
            offset_ms: AtomicI64::new(offset_ms),
        }
    }

    /// Milliseconds since the Unix epoch.
    #[inline]
    pub fn now_ms(&self) -> u64 {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO)
            .as_millis() as i64;
        (now + self.offset_ms.load(Ordering::Relaxed)).max(0) as u64
    }
}

/// A configured rule with its metric handles.
pub struct RuleEntry {
    /// The validated rule, bound to the replica set.
    pub rule: Rule,
    /// Its counters.
    pub metrics: RuleMetrics,
}

/// The rules in force, swapped whole on reload.
pub struct RuleSet {
    /// Rules by name.
    pub by_name: HashMap<String, Arc<RuleEntry>>,
    /// Rules in configuration order.
    pub ordered: Vec<Arc<RuleEntry>>,
    /// The agreed replica set.
    pub replicas: ReplicaSet,
    /// This node's index in it.
    pub me: NodeIdx,
    /// Strict or optimistic.
    pub consistency: Consistency,
}

impl RuleSet {
    /// Builds the rule set of a configuration.
    pub fn from_config(config: &Config) -> RuleSet {
        let ordered: Vec<Arc<RuleEntry>> = config
            .rules
            .iter()
            .map(|r| {
                Arc::new(RuleEntry {
                    rule: r.clone(),
                    metrics: RuleMetrics::new(&r.name),
                })
            })
            .collect();
        let by_name = ordered
            .iter()
            .map(|e| (e.rule.name.clone(), Arc::clone(e)))
            .collect();
        let me = config
            .replicas
            .node_by_id(&config.node.id)
            .unwrap_or(NodeIdx(0));
        let consistency = config.cluster.as_ref().map(|c| c.mode).unwrap_or_default();
        RuleSet {
            by_name,
            ordered,
            replicas: config.replicas.clone(),
            me,
            consistency,
        }
    }

    fn get(&self, field: &str, name: &str) -> Result<&Arc<RuleEntry>, ApiError> {
        self.by_name
            .get(name)
            .ok_or_else(|| ApiError::unknown_rule(field, name))
    }
}

/// One check as the API receives it.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckRequest {
    /// The rule's name.
    pub rule: String,
    /// The key.
    pub key: String,
    /// Tokens the request takes (default 1).
    #[serde(default = "one")]
    pub cost: u64,
    /// Consumer class.
    #[serde(default)]
    pub class: Option<String>,
    /// Retry identity.
    #[serde(default)]
    pub idempotency_key: Option<String>,
    /// Decide without consuming.
    #[serde(default)]
    pub dry_run: bool,
}

fn one() -> u64 {
    1
}

impl CheckRequest {
    /// The same check, borrowing its strings.
    pub fn borrowed(&self) -> CheckRef<'_> {
        CheckRef {
            rule: &self.rule,
            key: &self.key,
            cost: self.cost,
            class: self.class.as_deref(),
            idempotency_key: self.idempotency_key.as_deref(),
            dry_run: self.dry_run,
        }
    }
}

/// One check, borrowing its strings (from the request body or headers): what the decision
/// path takes, so that deciding allocates nothing per check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckRef<'a> {
    /// The rule's name.
    pub rule: &'a str,
    /// The key.
    pub key: &'a str,
    /// Tokens the request takes.
    pub cost: u64,
    /// Consumer class.
    pub class: Option<&'a str>,
    /// Retry identity.
    pub idempotency_key: Option<&'a str>,
    /// Decide without consuming.
    pub dry_run: bool,
}

/// Where a check sits in the request, for error messages (`checks[3].key: …`). Formatted only
/// when there is an error to explain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    /// A single check: fields are named as they are.
    Top,
    /// The check at this index of a batch's `checks`.
    Check(usize),
    /// The entry at this index of an atomic call's `all`.
    All(usize),
}

impl std::fmt::Display for Field {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Field::Top => Ok(()),
            Field::Check(i) => write!(f, "checks[{i}]."),
            Field::All(i) => write!(f, "all[{i}]."),
        }
    }
}

/// One entry of an atomic `all` call.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AllEntry {
    /// The rule's name.
    pub rule: String,
    /// The key.
    pub key: String,
    /// Consumer class.
    #[serde(default)]
    pub class: Option<String>,
}

/// A decision with what the answer needs to say about it (the rule and key are the
/// request's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    /// The decision.
    pub decision: Decision,
    /// The window the `RateLimit-Policy` header announces, in seconds.
    pub window_secs: u64,
}

/// The answer to an atomic call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllOutcome {
    /// Whether every rule allowed.
    pub allowed: bool,
    /// Index of the binding rule.
    pub binding: usize,
    /// One outcome per entry.
    pub results: Vec<Outcome>,
}

/// A key's usage with its names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageOutcome {
    /// The rule's name.
    pub rule: String,
    /// The key.
    pub key: String,
    /// The figures.
    pub usage: Usage,
    /// Region names, in the order of `usage.regions`.
    pub region_names: Vec<String>,
}

#[derive(Clone)]
enum Cached {
    One(Decision),
    All(AllDecision),
}

/// A resolved check: the rule and the bucket target.
struct Resolved<'a> {
    entry: &'a Arc<RuleEntry>,
    target: Target<'a>,
}

impl Resolved<'_> {
    /// Writes the key's stored identity into `buf`.
    fn id_into(&self, buf: &mut Vec<u8>, key: &str) {
        encode_id(buf, &self.entry.rule.name, self.target.bucket, key);
    }

    fn id(&self, key: &str) -> Vec<u8> {
        let mut buf = Vec::new();
        self.id_into(&mut buf, key);
        buf
    }
}

/// The limiter of one node.
pub struct Limiter {
    rules: ArcSwap<RuleSet>,
    store: Store,
    idempotency: Cache<(KeyId, String), (Cached, u64)>,
    /// The node's clock.
    pub clock: Clock,
    metrics: NodeMetrics,
    view: ArcSwap<ClusterView>,
}

impl Limiter {
    /// A limiter for a configuration.
    pub fn new(config: &Config, clock: Clock) -> Limiter {
        let rules = RuleSet::from_config(config);
        let view = ClusterView {
            consistency: rules.consistency,
            ..ClusterView::alone()
        };
        Limiter {
            rules: ArcSwap::from_pointee(rules),
            store: Store::new(config.node.max_keys),
            idempotency: Cache::builder()
                .max_capacity(config.api.idempotency_capacity)
                .expire_after(IdempotencyExpiry)
                .build(),
            clock,
            metrics: NodeMetrics::new(),
            view: ArcSwap::from_pointee(view),
        }
    }

    /// The rules in force.
    pub fn rules(&self) -> arc_swap::Guard<Arc<RuleSet>> {
        self.rules.load()
    }

    /// Replaces the rules (after a reload). Keys of rules that no longer exist, or whose
    /// algorithm, time base (window, period, refill period) or classes changed, are dropped:
    /// their counts mean nothing under the new rule. A changed limit, burst or rate keeps the
    /// counts, so raising a limit does not reset every tenant.
    pub fn replace_rules(&self, config: &Config) {
        let new = RuleSet::from_config(config);
        let old = self.rules.load_full();
        let keep: HashMap<&str, bool> = new
            .by_name
            .iter()
            .map(|(name, e)| {
                let same = old
                    .by_name
                    .get(name)
                    .is_some_and(|o| same_basis(&o.rule, &e.rule));
                (name.as_str(), same)
            })
            .collect();
        self.store.retain(|id, _| {
            crate::store::decode_id(id)
                .is_some_and(|(rule, _, _)| keep.get(rule).copied().unwrap_or(false))
        });
        self.view.store(Arc::new(ClusterView {
            consistency: new.consistency,
            ..**self.view.load()
        }));
        self.rules.store(Arc::new(new));
    }

    /// The key store.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Process-wide metric handles.
    pub fn metrics(&self) -> &NodeMetrics {
        &self.metrics
    }

    fn ctx<'a>(&self, rules: &'a RuleSet, now: u64) -> DecideCtx<'a> {
        self.ctx_alone(rules, now, false)
    }

    fn ctx_alone<'a>(&self, rules: &'a RuleSet, now: u64, acting_alone: bool) -> DecideCtx<'a> {
        let mut view = **self.view.load();
        view.acting_alone = acting_alone;
        DecideCtx {
            now,
            me: rules.me,
            replicas: &rules.replicas,
            view,
        }
    }

    /// The cluster as decisions should see it (set by the replication after every event).
    pub fn set_view(&self, view: ClusterView) {
        self.view.store(Arc::new(view));
    }

    /// The cluster view decisions use now.
    pub fn view(&self) -> ClusterView {
        **self.view.load()
    }

    /// Checks a request as [`Limiter::check`] would, without deciding it.
    pub fn validate(&self, req: CheckRef<'_>) -> Result<(), ApiError> {
        let rules = self.rules.load();
        self.resolve(&rules, Field::Top, req.rule, req.key, req.class, req.cost)
            .map(|_| ())
    }

    /// The outcome of a decision made elsewhere (by the key's owner).
    pub fn outcome_of(&self, req: CheckRef<'_>, decision: Decision) -> Result<Outcome, ApiError> {
        let rules = self.rules.load();
        let r = self.resolve(&rules, Field::Top, req.rule, req.key, req.class, req.cost)?;
        Ok(outcome(&r, decision, self.clock.now_ms()))
    }

    fn resolve<'a>(
        &self,
        rules: &'a RuleSet,
        field: Field,
        rule: &str,
        key: &str,
        class: Option<&str>,
        cost: u64,
    ) -> Result<Resolved<'a>, ApiError> {
        let entry = rules
            .by_name
            .get(rule)
            .ok_or_else(|| ApiError::unknown_rule(&format!("{field}rule"), rule))?;
        check_key(field, key)?;
        let target = entry
            .rule
            .target(class, cost)
            .map_err(|e| ApiError::invalid(format!("{field}{}: {e}", e.field())))?;
        Ok(Resolved { entry, target })
    }

    /// Decides one check.
    pub fn check(&self, req: CheckRef<'_>) -> Result<Outcome, ApiError> {
        self.check_with(req, false)
    }

    /// Decides one check; `acting_alone` when this node is not the key's owner and decides
    /// because the owner is unreachable (under its own conservative cap).
    pub fn check_with(&self, req: CheckRef<'_>, acting_alone: bool) -> Result<Outcome, ApiError> {
        let rules = self.rules.load();
        let r = self.resolve(&rules, Field::Top, req.rule, req.key, req.class, req.cost)?;
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
            resolved.push(self.resolve(&rules, Field::Check(i), c.rule, c.key, c.class, c.cost)?);
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

    /// Decides an atomic call over several rules: nothing is consumed unless all allow.
    pub fn check_all(
        &self,
        entries: &[AllEntry],
        cost: u64,
        dry_run: bool,
        idempotency_key: Option<&str>,
    ) -> Result<AllOutcome, ApiError> {
        if entries.is_empty() {
            return Err(ApiError::invalid("all: must hold at least one entry"));
        }
        let rules = self.rules.load();
        let mut resolved = Vec::with_capacity(entries.len());
        let mut ids: Vec<Vec<u8>> = Vec::with_capacity(entries.len());
        for (i, e) in entries.iter().enumerate() {
            let r = self.resolve(
                &rules,
                Field::All(i),
                &e.rule,
                &e.key,
                e.class.as_deref(),
                cost,
            )?;
            let id = r.id(&e.key);
            if let Some(j) = ids.iter().position(|p| *p == id) {
                return Err(ApiError::invalid(format!(
                    "all[{i}]: the same rule and key as all[{j}]"
                )));
            }
            resolved.push(r);
            ids.push(id);
        }
        let now = self.clock.now_ms();
        let decide = || {
            let ctx = self.ctx(&rules, now);
            // Lock every key's slot in one global order (sorted ids), never two shard locks.
            let slots: Vec<_> = ids.iter().map(|id| self.store.slot(id)).collect();
            let mut order: Vec<usize> = (0..resolved.len()).collect();
            order.sort_by(|&a, &b| ids[a].cmp(&ids[b]));
            let mut guards: Vec<(usize, MutexGuard<'_, Slot>)> =
                order.iter().map(|&i| (i, slots[i].lock())).collect();
            guards.sort_by_key(|(i, _)| *i);
            let all = {
                let mut checks: Vec<(&mut KeyState, Target<'_>, RuleMode)> = guards
                    .iter_mut()
                    .zip(&resolved)
                    .map(|((_, g), r)| {
                        g.hits = g.hits.saturating_add(1);
                        (&mut g.state, r.target, r.entry.rule.mode)
                    })
                    .collect();
                decide_all(&mut checks, cost, dry_run, &ctx)
            };
            for ((_, g), id) in guards.iter_mut().zip(&ids) {
                self.store.note(id, g);
            }
            for (d, r) in all.results.iter().zip(&resolved) {
                self.record(&r.entry.metrics, d, dry_run);
            }
            all
        };
        let all = match idempotency_key {
            Some(k) if !dry_run => {
                let mut id: Vec<u8> = Vec::new();
                for one in &ids {
                    id.extend_from_slice(one);
                    id.push(0xfe);
                }
                let window = resolved
                    .iter()
                    .map(|r| r.target.algorithm.policy_window_secs(now) * 1000)
                    .max()
                    .unwrap_or(1000);
                let mut fresh = false;
                let (cached, _) = self.idempotency.get_with((id.into(), k.to_owned()), || {
                    fresh = true;
                    (Cached::All(decide()), window)
                });
                if !fresh {
                    self.metrics.replays.increment(1);
                }
                match cached {
                    Cached::All(a) => a,
                    Cached::One(_) => {
                        return Err(ApiError::invalid(
                            "idempotency_key: already used for a single check",
                        ));
                    }
                }
            }
            _ => decide(),
        };
        let results = all
            .results
            .iter()
            .zip(&resolved)
            .map(|(d, r)| outcome(r, *d, now))
            .collect();
        Ok(AllOutcome {
            allowed: all.allowed,
            binding: all.binding,
            results,
        })
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
        let r = self.resolve(&rules, Field::Top, rule, key, class, cost)?;
        let now = self.clock.now_ms();
        let ctx = self.ctx_alone(&rules, now, acting_alone);
        let d = self
            .store
            .with(&r.id(key), |s| s.refund(&r.target, cost, &ctx));
        Ok(outcome(&r, d, now))
    }

    /// A key's usage as this node sees it.
    pub fn usage(
        &self,
        rule: &str,
        key: &str,
        class: Option<&str>,
    ) -> Result<UsageOutcome, ApiError> {
        let rules = self.rules.load();
        let r = self.resolve(&rules, Field::Top, rule, key, class, 0)?;
        let ctx = self.ctx(&rules, self.clock.now_ms());
        let usage = self
            .store
            .peek(&r.id(key), |s| s.usage(&r.target, &ctx))
            .unwrap_or_else(|| KeyState::new().usage(&r.target, &ctx));
        let region_names = rules
            .replicas
            .regions()
            .map(|i| rules.replicas.region_name(i).to_owned())
            .collect();
        Ok(UsageOutcome {
            rule: rule.to_owned(),
            key: key.to_owned(),
            usage,
            region_names,
        })
    }

    /// Forgets a key (every class bucket of it). Returns whether anything was held.
    pub fn reset(&self, rule: &str, key: &str) -> Result<bool, ApiError> {
        let rules = self.rules.load();
        let entry = rules.get("rule", rule)?;
        check_key(Field::Top, key)?;
        let mut buf = Vec::new();
        let mut any = false;
        let buckets: Vec<Option<u8>> = std::iter::once(None)
            .chain((0..entry.rule.classes.len()).map(|i| Some(i as u8)))
            .collect();
        for b in buckets {
            encode_id(&mut buf, rule, b, key);
            any |= self.store.remove(&buf);
        }
        Ok(any)
    }

    fn record(&self, m: &RuleMetrics, d: &Decision, dry_run: bool) {
        if dry_run {
            return;
        }
        m.record(d.would_allow, d.mode == RuleMode::Shadow);
        if d.degraded {
            self.metrics.degraded.increment(1);
        }
        if !d.would_allow {
            self.metrics
                .retry_after
                .record(d.retry_after_ms as f64 / 1000.0);
        }
    }
}

fn outcome(r: &Resolved<'_>, decision: Decision, now: u64) -> Outcome {
    Outcome {
        decision,
        window_secs: r.target.algorithm.policy_window_secs(now),
    }
}

/// Whether the counts kept under `old` still mean the same under `new`.
fn same_basis(old: &Rule, new: &Rule) -> bool {
    use levee_core::Algorithm::{FixedWindow, Quota, SlidingWindow, TokenBucket};
    let basis = |r: &Rule| match r.algorithm {
        TokenBucket { per_ms, .. } => (0, per_ms),
        FixedWindow { window_ms, .. } => (1, window_ms),
        SlidingWindow { window_ms, .. } => (2, window_ms),
        Quota { period, .. } => (3, period as u64),
    };
    let classes = |r: &Rule| {
        r.classes
            .iter()
            .map(|c| (c.name.clone(), c.own.is_some()))
            .collect::<Vec<_>>()
    };
    basis(old) == basis(new) && old.class_method == new.class_method && classes(old) == classes(new)
}

fn check_key(field: Field, key: &str) -> Result<(), ApiError> {
    if key.is_empty() {
        return Err(ApiError::invalid(format!("{field}key: must not be empty")));
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(ApiError::invalid(format!(
            "{field}key: {} bytes, at most {MAX_KEY_BYTES} allowed",
            key.len()
        )));
    }
    Ok(())
}

/// Idempotency entries live for the rule's window.
struct IdempotencyExpiry;

impl moka::Expiry<(KeyId, String), (Cached, u64)> for IdempotencyExpiry {
    fn expire_after_create(
        &self,
        _: &(KeyId, String),
        value: &(Cached, u64),
        _: std::time::Instant,
    ) -> Option<Duration> {
        Some(Duration::from_millis(value.1))
    }
}
