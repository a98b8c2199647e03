//! The rules in force and looking a check up in them: its rule, its validated key, its
//! bucket target ([`Resolved`]), and whether a reloaded rule keeps the counts of the old one.

use std::collections::HashMap;
use std::sync::Arc;

use levee_core::{
    DecideCtx, Decision, Effect, KeyState, Millis, NodeIdx, ReplicaSet, Rule, RuleMode, Target,
};

use super::api_error::ApiError;
use super::outcome::{List, Outcome};
use super::override_table::OverrideTable;
use super::request::{Field, check_key};
use crate::config::Config;
use crate::metrics::RuleMetrics;
use crate::store::encode_id;

/// A configured rule with its metric handles.
pub struct RuleEntry {
    /// The validated rule, bound to the replica set.
    pub rule: Rule,
    /// Its counters.
    pub metrics: RuleMetrics,
    /// After a change of the node list, the rule bound to the new list and when it applies:
    /// until then `rule` holds every node's share at most where it was (a share that grows
    /// waits for the next window, docs/membership.md).
    pub later: Option<(Millis, Rule)>,
}

impl RuleEntry {
    /// The rule as bound at `now` (see [`RuleEntry::later`]): what shares decide.
    #[inline]
    pub fn rule_at(&self, now: Millis) -> &Rule {
        match &self.later {
            Some((at, rule)) if now >= *at => rule,
            _ => &self.rule,
        }
    }

    /// Until when a share of this rule waits to grow, if it still does at `now`.
    pub fn waits_at(&self, now: Millis) -> Option<Millis> {
        self.later
            .as_ref()
            .map(|&(at, _)| at)
            .filter(|&at| now < at)
    }
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
}

impl RuleSet {
    /// The algorithm `rule`'s checks of `class` are decided by at `now`, if both are known
    /// ([`levee_core::Rule::algorithm_of`]): what a give-back or a release is weighed by.
    pub fn algorithm_of(
        &self,
        rule: &str,
        class: Option<&str>,
        now: Millis,
    ) -> Option<levee_core::Algorithm> {
        self.by_name.get(rule)?.rule_at(now).algorithm_of(class)
    }

    /// Builds the rule set of a configuration.
    pub fn from_config(config: &Config) -> RuleSet {
        let ordered: Vec<Arc<RuleEntry>> = config
            .rules
            .iter()
            .map(|r| {
                Arc::new(RuleEntry {
                    rule: r.clone(),
                    metrics: RuleMetrics::new(&r.name),
                    later: None,
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
        RuleSet {
            by_name,
            ordered,
            replicas: config.replicas.clone(),
            me,
        }
    }

    /// The rules a node starts with at `now`: [`RuleSet::from_config`], except that with
    /// removed nodes in the list every share is held as when a removal reaches a running
    /// node ([`RuleSet::rebound`] from the list before the removals, at `now`): grown shares
    /// wait, and the removed nodes' rights of long windows go to their heirs once the state
    /// the node pulls on starting settles them. A node that restarted after a removal knows
    /// neither what its region-mates spent under their old shares nor what the removed node
    /// used; binding its grown share at once could spend the removed node's share of a day
    /// twice (`levee-sim --seed 164 --scenario remove-dead-day`: 1.17 × the day's limit).
    /// A removed entry's `weight` is the weight it had (even if none is given).
    pub fn starting(config: &Config, now: Millis) -> RuleSet {
        let rules = RuleSet::from_config(config);
        if !config.replicas.has_removed() {
            return rules;
        }
        let weight_of = |n: NodeIdx| {
            let nodes = &config.cluster.as_ref()?.nodes;
            nodes.get(usize::from(n.0))?.weight
        };
        let before = config.replicas.before_removals(weight_of);
        rules.rebound(&rules.bound_in_full(before), config.replicas.clone(), now)
    }

    /// These rules bound to `replicas` in full, as if no list came before.
    fn bound_in_full(&self, replicas: ReplicaSet) -> RuleSet {
        let ordered: Vec<Arc<RuleEntry>> = self
            .ordered
            .iter()
            .map(|e| {
                let mut rule = e.rule.clone();
                rule.bind(&replicas);
                Arc::new(RuleEntry {
                    rule,
                    metrics: e.metrics.clone(),
                    later: None,
                })
            })
            .collect();
        RuleSet {
            by_name: ordered
                .iter()
                .map(|e| (e.rule.name.clone(), Arc::clone(e)))
                .collect(),
            ordered,
            replicas,
            me: self.me,
        }
    }

    /// These rules bound to `replicas` (the list decisions spend by; see
    /// `levee_cluster::Lists::spending`) at `now`, the shares they held so far as the bound:
    /// a node's share of a limit that shrinks does at once, one that grows waits until
    /// nothing admitted under the old shares counts against the same window
    /// ([`levee_core::Algorithm::shares_may_grow_at`]). Without that wait, a node that spent
    /// its old, larger share early in a window and a node whose share grew later in it
    /// would together admit more than the limit in that window.
    pub fn rebound(&self, previous: &RuleSet, replicas: ReplicaSet, now: Millis) -> RuleSet {
        // Only a change of the list moves shares between nodes; a rule's own figures changed
        // on reload change every node's share alike, and apply at once as before.
        // (A reload while shares still wait keeps them waiting.)
        let list_changed = previous.replicas != replicas
            || previous.ordered.iter().any(|e| e.waits_at(now).is_some());
        let ordered: Vec<Arc<RuleEntry>> = self
            .ordered
            .iter()
            .map(|e| {
                let mut rule = e.rule.clone();
                let old = previous.by_name.get(&rule.name).map(|o| o.rule_at(now));
                let later = match old {
                    Some(old)
                        if list_changed
                            && same_basis(old, &rule)
                            && old.classes.len() == rule.classes.len() =>
                    {
                        let mut bound = rule.clone();
                        bound.bind(&replicas);
                        rule.keep_shares_of(old);
                        rule.bind_no_higher(&replicas, now)
                            .map(|at| (at, bound.growing_from(at)))
                    }
                    _ => {
                        // Bound in full at once: its shares apply from now, not to windows
                        // that began before.
                        rule.bind(&replicas);
                        rule.grown_from = now;
                        None
                    }
                };
                Arc::new(RuleEntry {
                    rule,
                    metrics: e.metrics.clone(),
                    later,
                })
            })
            .collect();
        let by_name = ordered
            .iter()
            .map(|e| (e.rule.name.clone(), Arc::clone(e)))
            .collect();
        RuleSet {
            by_name,
            ordered,
            replicas,
            me: self.me,
        }
    }

    /// The rules of this set a share of which waits to grow at `now` and did not wait as
    /// long in `previous`, each with how long it waits, in ms.
    pub fn newly_waiting(&self, previous: &RuleSet, now: Millis) -> Vec<(String, Millis)> {
        self.ordered
            .iter()
            .filter_map(|e| {
                let at = e.waits_at(now)?;
                let before = previous
                    .by_name
                    .get(&e.rule.name)
                    .and_then(|p| p.waits_at(now));
                // Not waiting before (`None`) or until earlier.
                (before < Some(at)).then(|| (e.rule.name.clone(), at - now))
            })
            .collect()
    }

    /// These rules as a node that starts holds them once it hears the lists run before its
    /// own, each with when it stopped being run (`levee_cluster::Event::ListsBefore`): every
    /// share no higher than under those whose change may still count at `now`, until it
    /// may grow ([`Rule::held_by_lists_before`]; a share that already waits keeps waiting
    /// at least as long). `None` if no rule is held down.
    pub fn held_by_lists_before(
        &self,
        before: &[(ReplicaSet, Millis)],
        now: Millis,
    ) -> Option<RuleSet> {
        let mut any = false;
        let ordered: Vec<Arc<RuleEntry>> = self
            .ordered
            .iter()
            .map(|e| {
                let waits = e.waits_at(now);
                let full = e.later.as_ref().map_or(&e.rule, |(_, r)| r);
                let Some((held, at)) =
                    full.held_by_lists_before(e.rule_at(now), waits, &self.replicas, before, now)
                else {
                    return Arc::clone(e);
                };
                any = true;
                Arc::new(RuleEntry {
                    rule: held,
                    metrics: e.metrics.clone(),
                    later: Some((at, full.clone().growing_from(at))),
                })
            })
            .collect();
        any.then(|| RuleSet {
            by_name: ordered
                .iter()
                .map(|e| (e.rule.name.clone(), Arc::clone(e)))
                .collect(),
            ordered,
            replicas: self.replicas.clone(),
            me: self.me,
        })
    }

    /// These rules with the bequests of the nodes `removed` settled
    /// (`levee_cluster::Event::BequestsSettled`), or `None` if none waited.
    pub fn with_bequests_settled(&self, removed: &[NodeIdx]) -> Option<RuleSet> {
        if !self.ordered.iter().any(|e| e.rule.has_unsettled_bequests()) {
            return None;
        }
        let ordered: Vec<Arc<RuleEntry>> = self
            .ordered
            .iter()
            .map(|e| {
                let mut rule = e.rule.clone();
                rule.settle_bequests(removed);
                Arc::new(RuleEntry {
                    rule,
                    metrics: e.metrics.clone(),
                    later: e.later.clone(),
                })
            })
            .collect();
        let by_name = ordered
            .iter()
            .map(|e| (e.rule.name.clone(), Arc::clone(e)))
            .collect();
        Some(RuleSet {
            by_name,
            ordered,
            replicas: self.replicas.clone(),
            me: self.me,
        })
    }

    /// The rule named `name`; `404 unknown_rule` naming `field` if there is none.
    pub(super) fn get(&self, field: &str, name: &str) -> Result<&Arc<RuleEntry>, ApiError> {
        self.by_name
            .get(name)
            .ok_or_else(|| ApiError::unknown_rule(field, name))
    }

    /// A single check resolved against the rules and the overrides in force at `now`, its
    /// errors naming the top-level fields ([`RuleSet::resolve`] with [`Field::Top`]).
    pub(super) fn resolve_check<'a>(
        &'a self,
        overrides: &'a OverrideTable,
        now: Millis,
        req: super::request::CheckRef<'_>,
    ) -> Result<Resolved<'a>, ApiError> {
        self.resolve(
            overrides,
            now,
            Field::Top,
            req.rule,
            req.key,
            req.class,
            req.cost,
        )
    }

    /// Looks a check up: its rule, its key's bounds, its override at `now` (a runtime one in
    /// `overrides`, else the rule's `[[rule.override]]`: its figures, or its list), and the
    /// bucket its class and cost target. Every refusal names the field (`field` says where the
    /// check sits).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn resolve<'a>(
        &'a self,
        overrides: &'a OverrideTable,
        now: Millis,
        field: Field,
        rule: &str,
        key: &str,
        class: Option<&str>,
        cost: u64,
    ) -> Result<Resolved<'a>, ApiError> {
        let entry = self
            .by_name
            .get(rule)
            .ok_or_else(|| ApiError::unknown_rule(&format!("{field}rule"), rule))?;
        check_key(field, key)?;
        let (over, list) = match overrides
            .effect(rule, key, now)
            .or_else(|| entry.rule.overrides.get(key))
        {
            Some(Effect::Figures(a)) => (Some(a), None),
            Some(Effect::Allow) => (None, Some(List::Allow)),
            Some(Effect::Deny) => (None, Some(List::Deny)),
            None => (None, None),
        };
        let target = entry
            .rule_at(now)
            .target_with(class, cost, over)
            .map_err(|e| ApiError::invalid(format!("{field}{}: {e}", e.field())))?;
        Ok(Resolved {
            entry,
            target,
            list,
            overridden: over.is_some(),
        })
    }
}

/// A resolved check: the rule, the bucket target (with the key's own figures when it has an
/// override), and the list the key is on.
pub(super) struct Resolved<'a> {
    pub(super) entry: &'a Arc<RuleEntry>,
    pub(super) target: Target<'a>,
    pub(super) list: Option<List>,
    /// The key has its own figures (an override): strict mode also checks the key's global
    /// usage before admitting (see `decide.rs`).
    pub(super) overridden: bool,
}

impl Resolved<'_> {
    /// Writes the key's stored identity into `buf`.
    pub(super) fn id_into(&self, buf: &mut Vec<u8>, key: &str) {
        encode_id(buf, &self.entry.rule.name, self.target.bucket, key);
    }

    /// The key's stored identity.
    pub(super) fn id(&self, key: &str) -> Vec<u8> {
        let mut buf = Vec::new();
        self.id_into(&mut buf, key);
        buf
    }

    /// The decision for a key on a list, made without its state: on the allow list admitted
    /// and not counted (`remaining` is the limit), on the deny list refused with no
    /// `retry_after_ms` (waiting does not help). A shadow rule still lets the caller through.
    pub(super) fn listed(&self, list: List) -> Decision {
        let limit = self.target.algorithm.capacity();
        let would_allow = list == List::Allow;
        let mode = self.entry.rule.mode;
        Decision {
            allowed: would_allow || mode == RuleMode::Shadow,
            would_allow,
            limit,
            remaining: if would_allow { limit } else { 0 },
            reset_after_ms: 0,
            retry_after_ms: 0,
            mode,
            degraded: false,
            delay_ms: 0,
        }
    }
}

/// The outcome of `decision`, made at `now` for a check resolved as `r`.
/// The outcome of `decision` (whose `remaining` is already the global estimate) with the
/// deciding node's own figure, `local_remaining`, if this node decided.
pub(super) fn outcome(
    r: &Resolved<'_>,
    decision: Decision,
    local_remaining: Option<u64>,
    now: u64,
) -> Outcome {
    Outcome {
        decision,
        window_secs: r.target.algorithm.policy_window_secs(now),
        local_remaining,
        list: r.list,
        shaped: matches!(
            r.target.algorithm,
            levee_core::Algorithm::TokenBucket {
                shaping: Some(_),
                ..
            }
        ),
    }
}

/// `d` with `remaining` the key's global estimate after it and `reset_after_ms` the time until
/// that is back to the limit (what `/v1/usage` says), and the figure the decision was made
/// against (what this node can grant at once).
pub(super) fn global_remaining(
    state: &KeyState,
    target: &Target<'_>,
    ctx: &DecideCtx<'_>,
    mut d: Decision,
) -> (Decision, u64) {
    let local = d.remaining;
    let usage = state.usage(target, ctx);
    d.remaining = usage.remaining;
    d.reset_after_ms = usage.reset_after_ms;
    (d, local)
}

/// Whether the counts kept under `old` still mean the same under `new`.
pub(super) fn same_basis(old: &Rule, new: &Rule) -> bool {
    use levee_core::Algorithm::{FixedWindow, Quota, SlidingLog, SlidingWindow, TokenBucket};
    let basis = |r: &Rule| match r.algorithm {
        TokenBucket { per_ms, .. } => (0, per_ms),
        FixedWindow { window_ms, .. } => (1, window_ms),
        SlidingWindow { window_ms, .. } => (2, window_ms),
        Quota { period, .. } => (3, period as u64),
        SlidingLog { window_ms, .. } => (4, window_ms),
    };
    let classes = |r: &Rule| {
        r.classes
            .iter()
            .map(|c| (c.name.clone(), c.own.is_some()))
            .collect::<Vec<_>>()
    };
    basis(old) == basis(new) && old.class_method == new.class_method && classes(old) == classes(new)
}
