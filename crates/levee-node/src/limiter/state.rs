//! The limiter of one node and what it holds: the rules in force (swapped whole on reload),
//! the key store, the idempotency cache, the clock, the metric handles, and the cluster view
//! decisions use (swapped by the replication). Deciding is in `decide.rs` and `atomic.rs`,
//! reading and forgetting keys in `usage.rs`.

use std::collections::HashMap;
use std::sync::Arc;

use arc_swap::ArcSwap;
use levee_core::{ClusterView, DecideCtx, Decision, RuleMode};

use super::clock::Clock;
use super::idempotency::{IdempotencyCache, idempotency_cache};
use super::rule_set::{RuleSet, same_basis};
use crate::config::Config;
use crate::metrics::{NodeMetrics, RuleMetrics};
use crate::store::Store;

/// The limiter of one node.
pub struct Limiter {
    pub(super) rules: ArcSwap<RuleSet>,
    pub(super) store: Store,
    pub(super) idempotency: IdempotencyCache,
    /// The node's clock.
    pub clock: Clock,
    pub(super) metrics: NodeMetrics,
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
            idempotency: idempotency_cache(config.api.idempotency_capacity),
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

    /// What a decision at `now` needs to know, as this node decides for the keys it owns.
    pub(super) fn ctx<'a>(&self, rules: &'a RuleSet, now: u64) -> DecideCtx<'a> {
        self.ctx_alone(rules, now, false)
    }

    /// What a decision at `now` needs to know; `acting_alone` when this node decides for a
    /// key whose owner is unreachable.
    pub(super) fn ctx_alone<'a>(
        &self,
        rules: &'a RuleSet,
        now: u64,
        acting_alone: bool,
    ) -> DecideCtx<'a> {
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

    /// Counts a decision in the rule's and the node's metrics (a dry run counts nothing).
    pub(super) fn record(&self, m: &RuleMetrics, d: &Decision, dry_run: bool) {
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
