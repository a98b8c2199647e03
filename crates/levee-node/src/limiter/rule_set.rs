//! The rules in force and looking a check up in them: its rule, its validated key, its
//! bucket target ([`Resolved`]), and whether a reloaded rule keeps the counts of the old one.

use std::collections::HashMap;
use std::sync::Arc;

use levee_core::{Consistency, Decision, NodeIdx, ReplicaSet, Rule, Target};

use super::api_error::ApiError;
use super::outcome::Outcome;
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

    /// The rule named `name`; `404 unknown_rule` naming `field` if there is none.
    pub(super) fn get(&self, field: &str, name: &str) -> Result<&Arc<RuleEntry>, ApiError> {
        self.by_name
            .get(name)
            .ok_or_else(|| ApiError::unknown_rule(field, name))
    }

    /// Looks a check up: its rule, its key's bounds, and the bucket its class and cost
    /// target. Every refusal names the field (`field` says where the check sits).
    pub(super) fn resolve<'a>(
        &'a self,
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
        let target = entry
            .rule
            .target(class, cost)
            .map_err(|e| ApiError::invalid(format!("{field}{}: {e}", e.field())))?;
        Ok(Resolved { entry, target })
    }
}

/// A resolved check: the rule and the bucket target.
pub(super) struct Resolved<'a> {
    pub(super) entry: &'a Arc<RuleEntry>,
    pub(super) target: Target<'a>,
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
}

/// The outcome of `decision`, made at `now` for a check resolved as `r`.
pub(super) fn outcome(r: &Resolved<'_>, decision: Decision, now: u64) -> Outcome {
    Outcome {
        decision,
        window_secs: r.target.algorithm.policy_window_secs(now),
    }
}

/// Whether the counts kept under `old` still mean the same under `new`.
pub(super) fn same_basis(old: &Rule, new: &Rule) -> bool {
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
