//! The limiter of one node and what it holds: the rules in force (swapped whole on reload),
//! the key store, the idempotency cache, the clock, the metric handles, and the cluster view
//! decisions use (swapped by the replication). Deciding is in `decide.rs` and `atomic.rs`,
//! reading and forgetting keys in `usage.rs`.

use std::collections::HashMap;
use std::sync::Arc;

use arc_swap::ArcSwap;
use levee_core::{ClusterView, DecideCtx, Decision, KeyState, Millis, ReplicaSet, RuleMode};

use super::clock::Clock;
use super::idempotency::{IdempotencyCache, idempotency_cache};
use super::override_table::OverrideTable;
use super::overrides::OverrideWrites;
use super::rule_set::{RuleSet, same_basis};
use crate::config::Config;
use crate::metrics::{NodeMetrics, RuleMetrics};
use crate::notify::Notices;
use crate::store::Store;

/// The limiter of one node.
pub struct Limiter {
    pub(super) rules: Arc<ArcSwap<RuleSet>>,
    /// Runtime per-key overrides, swapped whole on every write (under `override_writes`).
    pub(super) overrides: Arc<ArcSwap<OverrideTable>>,
    pub(super) override_writes: parking_lot::Mutex<OverrideWrites>,
    /// This node's id: the writer of the overrides it takes.
    pub(super) node_id: String,
    pub(super) store: Store,
    pub(super) idempotency: IdempotencyCache,
    /// The node's clock.
    pub clock: Clock,
    pub(super) metrics: NodeMetrics,
    view: ArcSwap<ClusterView>,
    /// Threshold notices (`[[notify]]`), watched after each decision that takes something.
    pub(super) notices: Notices,
}

impl Limiter {
    /// A limiter for a configuration.
    pub fn new(config: &Config, clock: Clock) -> Limiter {
        let rules = RuleSet::starting(config, clock.now_ms());
        let view = ClusterView::alone();
        let rules = Arc::new(ArcSwap::from_pointee(rules));
        let overrides = Arc::new(ArcSwap::from_pointee(OverrideTable::new(
            config.node.max_overrides,
        )));
        let weigher = {
            let rules = Arc::clone(&rules);
            let overrides = Arc::clone(&overrides);
            let clock = Clock::with_offset(clock.offset_ms());
            Box::new(move |id: &[u8], state: &KeyState| {
                forget_weight(&rules.load(), &overrides.load(), id, state, clock.now_ms())
            })
        };
        Limiter {
            rules,
            overrides,
            override_writes: parking_lot::Mutex::new(OverrideWrites::default()),
            node_id: config.node.id.clone(),
            store: Store::with_weigher(config.node.max_keys, weigher),
            idempotency: idempotency_cache(config.api.idempotency_capacity),
            clock,
            metrics: NodeMetrics::new(),
            view: ArcSwap::from_pointee(view),
            notices: Notices::new(config),
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
    pub fn replace_rules(&self, config: &Config, spending: ReplicaSet) {
        let old = self.rules.load_full();
        let new = RuleSet::from_config(config).rebound(&old, spending, self.clock.now_ms());
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
        self.rules.store(Arc::new(new));
        self.rebind_overrides(config.node.max_overrides);
        self.notices.reconfigure(config);
    }

    /// Binds the rules in force to each of `lists` in turn, the lists decisions spend by
    /// while a membership change settles (`levee_cluster::Lists::spending`; a share that
    /// shrinks under one and grows again under the next is seen to grow, and waits); counts
    /// are kept. Returns the rules a share of which (this node's or another's) grew and waits
    /// from now on (docs/membership.md: until the window after next), each with how long, in
    /// ms.
    pub fn rebind(&self, lists: impl IntoIterator<Item = ReplicaSet>) -> Vec<(String, Millis)> {
        let before = self.rules.load_full();
        let now = self.clock.now_ms();
        let mut bound = Arc::clone(&before);
        for spending in lists {
            if bound.replicas != spending {
                bound = Arc::new(bound.rebound(&bound, spending, now));
            }
        }
        if Arc::ptr_eq(&bound, &before) {
            return Vec::new();
        }
        let waits = bound.newly_waiting(&before, now);
        self.rules.store(bound);
        waits
    }

    /// Holds the rules' shares, as a node that starts does, no higher than under the lists
    /// run before its own whose change may still count ([`RuleSet::held_by_lists_before`]).
    /// Returns the rules held down.
    pub fn hold_by_lists_before(&self, before: &[(ReplicaSet, Millis)]) -> Vec<String> {
        let now = self.clock.now_ms();
        let Some(held) = self.rules.load().held_by_lists_before(before, now) else {
            return Vec::new();
        };
        let names = held
            .ordered
            .iter()
            .filter(|e| e.waits_at(now).is_some())
            .map(|e| e.rule.name.clone())
            .collect();
        self.rules.store(Arc::new(held));
        names
    }

    /// What the rules in force take over of the nodes `removed` counts from now
    /// ([`RuleSet::with_bequests_settled`]). Returns the rules in which this node is the
    /// heir of one of them.
    pub fn settle_bequests(&self, removed: &[levee_core::NodeIdx]) -> Vec<String> {
        let Some(settled) = self.rules.load().with_bequests_settled(removed) else {
            return Vec::new();
        };
        let me = settled.me;
        let heir_in = settled
            .ordered
            .iter()
            .filter(|e| {
                e.rule
                    .bequests
                    .iter()
                    .any(|b| b.heir == me && removed.contains(&b.from))
            })
            .map(|e| e.rule.name.clone())
            .collect();
        self.rules.store(Arc::new(settled));
        heir_in
    }

    /// Threshold notices: the sender task takes their queue.
    pub fn notices(&self) -> &Notices {
        &self.notices
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

/// How much forgetting a key would admit, for the store's eviction: the part of its limit the
/// key uses now, in millionths (0: it holds nothing — a full bucket, a window with no
/// consumption — or its rule is gone). A key near its limit weighs near a million.
pub fn forget_weight(
    rules: &RuleSet,
    overrides: &OverrideTable,
    id: &[u8],
    state: &KeyState,
    now: u64,
) -> u32 {
    let Some(target) = crate::states::target_of(rules, overrides, id, now) else {
        return 0;
    };
    let ctx = DecideCtx {
        now,
        me: rules.me,
        replicas: &rules.replicas,
        view: ClusterView::alone(),
    };
    let usage = state.usage(&target, &ctx);
    if usage.limit == 0 {
        return 0;
    }
    (u128::from(usage.used) * 1_000_000 / u128::from(usage.limit)).min(1_000_000) as u32
}

#[cfg(test)]
mod tests {
    use crate::config::Config;
    use crate::limiter::{Clock, Limiter};

    const DAY_MS: u64 = 86_400_000;

    /// A node of eu in a two-region cluster with the weights `weights`, and a day's quota.
    fn config(weights: &str) -> Config {
        let text = format!(
            "[node]\nid = \"eu-1\"\nregion = \"eu\"\n\
             [cluster]\nregions = {{ {weights} }}\n\
             [[cluster.node]]\nid = \"eu-1\"\nregion = \"eu\"\naddr = \"127.0.0.1:9000\"\n\
             [[cluster.node]]\nid = \"us-1\"\nregion = \"us\"\naddr = \"127.0.0.1:9001\"\n\
             [[rule]]\nname = \"daily\"\nalgorithm = \"fixed_window\"\nlimit = 600\nwindow = \"1d\"\n"
        );
        Config::parse(&text, "t.toml").expect("valid")
    }

    #[test]
    fn a_rebind_names_the_rules_whose_grown_share_waits_and_for_how_long() {
        let l = Limiter::new(&config("eu = 1, us = 1"), Clock::default());
        let grown = config("eu = 3, us = 1").replicas;
        let waits = l.rebind([grown.clone()]);
        let [(rule, ms)] = waits.as_slice() else {
            panic!("one rule waits: {waits:?}");
        };
        assert_eq!(rule, "daily");
        // Into the day after next: more than a day from now, at most two.
        assert!((DAY_MS..=2 * DAY_MS).contains(ms), "{ms} ms");
        // Bound to the same list again: nothing new waits.
        assert_eq!(l.rebind([grown]), Vec::new());
    }

    /// A reservation released here (an atomic call denied at another owner) is given back
    /// while its window runs, and withheld, nothing changed, when the window it was taken in
    /// may have ended: a refund would then free a right of the window after.
    #[test]
    fn a_release_is_withheld_when_the_reservations_window_may_have_ended() {
        use crate::limiter::CheckRef;
        let l = Limiter::new(&config("eu = 1, us = 1"), Clock::default());
        let req = CheckRef {
            rule: "daily",
            key: "k",
            cost: 3,
            class: None,
            idempotency_key: None,
            dry_run: false,
        };
        let used = || l.usage("daily", "k", None).expect("usage").usage.used;
        let taken = l.check(req).expect("check").decision;
        assert!(taken.allowed);
        assert_eq!(used(), 3);
        // Asked for two days ago, answered with the end of a window: surely over now.
        let now = l.clock.now_ms();
        let stale = l
            .release_with(req, false, now - 2 * DAY_MS, taken.reset_after_ms)
            .expect("release");
        assert!(stale.is_none(), "{stale:?}");
        assert_eq!(used(), 3, "nothing was given back");
        // Asked for just now, in a day's window: given back.
        let back = l
            .release_with(req, false, now, taken.reset_after_ms)
            .expect("release");
        assert!(back.is_some());
        assert_eq!(used(), 0);
    }
}
