//! One simulated node's key states, with its rule bound as the node binds it.
//!
//! [`levee_cluster::memory::MemoryStates`] binds its rules once, to the list it is built
//! with. A node whose list changes rebinds its rules to [`levee_cluster::Cluster::spending`]
//! whenever its machine reports `Event::SharesChanged`, and a share that grows waits
//! (`levee-node`'s `RuleSet::rebound`: the rule held down in force until the time
//! [`Rule::bind_no_higher`] returns, the fully bound rule from then on,
//! `RuleEntry::rule_at`). [`SimStates`] is `MemoryStates` with that rebinding: the same
//! core calls (decide, merge, rebalance, deltas) on the rule as bound at the node's clock,
//! and the spending list as the decisions' replica set, as the node's `NodeStates` does.

use std::collections::{BTreeMap, BTreeSet};

use levee_cluster::{Fingerprints, KeyStates, Refused, key_fingerprint};
use levee_core::{
    Algorithm, ClusterView, DecideCtx, Decision, KeyCrdt, KeyState, Listing, MergeError, Millis,
    NodeIdx, ReplicaSet, Rule, RuleMode, Target,
};
use levee_proto::{decode_id, encode_id};

/// One rule of a node, as bound to its spending list.
struct Bound {
    /// The rule as configured (unbound).
    base: Rule,
    /// The rule in force: bound to the list, or held down where a share grew.
    rule: Rule,
    /// The rule bound to the list in full and when it replaces `rule`.
    later: Option<(Millis, Rule)>,
}

impl Bound {
    fn at(&self, now: Millis) -> &Rule {
        match &self.later {
            Some((at, r)) if now >= *at => r,
            _ => &self.rule,
        }
    }
}

/// Key states of one simulated node, its rules bound to its machine's spending list.
pub struct SimStates {
    me: NodeIdx,
    /// The list decisions spend by: the machine's `spending()` at the last rebinding.
    replicas: ReplicaSet,
    /// Every rule; the first is the run's main rule (rights and shares are reported on it).
    rules: Vec<Bound>,
    /// The node's clock at the machine call under way (what `update_active` binds at).
    now: Millis,
    keys: BTreeMap<Vec<u8>, KeyState>,
    dirty: BTreeSet<Vec<u8>>,
    active: BTreeSet<Vec<u8>>,
    /// Keys listed for later (`Listing::Later`).
    later: BTreeSet<Vec<u8>>,
    fingerprints: Fingerprints,
    /// States refused because they name a node this node's list does not hold yet.
    unknown_node: u64,
}

impl SimStates {
    /// Empty states of node `me`, its rules `bases` bound to `spending` (as a node that
    /// starts binds its rules to its configuration's list).
    pub fn new(me: NodeIdx, spending: ReplicaSet, bases: Vec<Rule>) -> SimStates {
        let rules = bases
            .into_iter()
            .map(|base| {
                let mut rule = base.clone();
                rule.bind(&spending);
                Bound {
                    base,
                    rule,
                    later: None,
                }
            })
            .collect();
        SimStates {
            me,
            replicas: spending,
            rules,
            now: 0,
            keys: BTreeMap::new(),
            dirty: BTreeSet::new(),
            active: BTreeSet::new(),
            later: BTreeSet::new(),
            fingerprints: Fingerprints::default(),
            unknown_node: 0,
        }
    }

    /// The states of node `me` as it starts at `now` with `spending`, as the node's
    /// `RuleSet::starting` binds them: with removed nodes in the list, bound first to the
    /// list before the removals (every weight even, as the simulator's lists have), then
    /// rebound to `spending`, so grown shares wait and removed nodes' long-window rights
    /// are their heirs' once the pull on starting settles them.
    pub fn starting(me: NodeIdx, spending: ReplicaSet, bases: Vec<Rule>, now: Millis) -> SimStates {
        if !spending.has_removed() {
            return SimStates::new(me, spending, bases);
        }
        let mut states = SimStates::new(me, spending.before_removals(|_| None), bases);
        states.rebind(spending, now);
        states
    }

    /// How many peers' states of a key were refused because they name a node this node's
    /// list does not hold yet (`MergeError::UnknownNode`: a peer that has reloaded relays
    /// entries of a node added since, to a node that has not).
    pub fn unknown_node_refusals(&self) -> u64 {
        self.unknown_node
    }

    /// These states for a machine call made at `now` (the node's clock).
    pub fn at(&mut self, now: Millis) -> &mut SimStates {
        self.now = now;
        self
    }

    /// The main rule as bound at `now`.
    pub fn rule_at(&self, now: Millis) -> &Rule {
        self.rules[0].at(now)
    }

    /// When a grown share of the main rule applies, if one still waits at `now`.
    pub fn pending_growth(&self, now: Millis) -> Option<Millis> {
        self.rules[0]
            .later
            .as_ref()
            .map(|(at, _)| *at)
            .filter(|&at| now < at)
    }

    /// This node's part of the rule's limit at `now`.
    pub fn share_at(&self, now: Millis) -> u64 {
        self.rule_at(now)
            .split
            .get(usize::from(self.me.0))
            .copied()
            .unwrap_or(0)
    }

    /// The list decisions spend by.
    pub fn spending(&self) -> &ReplicaSet {
        &self.replicas
    }

    /// Binds the rule to `spending` at `now`, as `RuleSet::rebound` does on
    /// `Event::SharesChanged`: no node's part above what the rule in force gives it, the full
    /// binding from when [`Rule::bind_no_higher`] says (a share that shrinks does at once).
    pub fn rebind(&mut self, spending: ReplicaSet, now: Millis) {
        if self.replicas == spending {
            return;
        }
        for b in &mut self.rules {
            let old = b.at(now).clone();
            let mut bound = b.base.clone();
            bound.bind(&spending);
            let mut rule = b.base.clone();
            rule.keep_shares_of(&old);
            b.later = rule
                .bind_no_higher(&spending, now)
                .map(|at| (at, bound.growing_from(at)));
            b.rule = rule;
        }
        self.replicas = spending;
    }

    /// Holds the rules' shares no higher than under the lists run before the node's own
    /// whose change may still count at `now`, as the node's `RuleSet::held_by_lists_before`
    /// does on `Event::ListsBefore` (a share that already waits keeps waiting at least as
    /// long).
    pub fn hold_by_lists_before(&mut self, before: &[(ReplicaSet, Millis)], now: Millis) {
        for b in &mut self.rules {
            let waits = b.later.as_ref().map(|(at, _)| *at).filter(|&at| now < at);
            let full = b.later.as_ref().map_or(&b.rule, |(_, r)| r).clone();
            if let Some((held, at)) =
                full.held_by_lists_before(b.at(now), waits, &self.replicas, before, now)
            {
                b.rule = held;
                b.later = Some((at, full.growing_from(at)));
            }
        }
    }

    /// What the rules take over of the nodes `removed` counts from now, as the node's
    /// `settle_bequests` does on `Event::BequestsSettled`.
    pub fn settle_bequests(&mut self, removed: &[NodeIdx]) {
        for b in &mut self.rules {
            b.rule.settle_bequests(removed);
        }
    }

    /// Forgets every key (a crash that loses what was not synchronised).
    pub fn clear(&mut self) {
        self.keys.clear();
        self.dirty.clear();
        self.active.clear();
        self.later.clear();
        self.fingerprints.clear();
    }

    /// Lists a key this node decided or refunded as changed: its delta goes out and it is
    /// rebalanced at the next interval.
    fn touched(&mut self, id: Vec<u8>) {
        self.dirty.insert(id.clone());
        self.active.insert(id);
    }

    /// Decides one check of `rule` for `key` at `now`; `None` if the rule is unknown or the
    /// cost can never be granted. With `dry_run`, says what it would decide and changes
    /// nothing (a check waiting for rights looks so, as `levee_node::wait` does). A dry run's
    /// `remaining` is the key's global estimate, as a node answers it (whether the cluster
    /// has room); a decision's is the core's, this node's own.
    pub fn decide(
        &mut self,
        rule: &str,
        key: &str,
        cost: u64,
        now: Millis,
        view: ClusterView,
        dry_run: bool,
    ) -> Option<Decision> {
        let (target, id) = resolve(&self.rules, rule, key, cost, now)?;
        let ctx = decide_ctx(self.me, &self.replicas, now, view);
        if dry_run {
            // A read creates no key, as a node's does not.
            let mut fresh = KeyState::new();
            let state = self.keys.get_mut(&id).unwrap_or(&mut fresh);
            let mut d = state.decide(&target, RuleMode::Enforce, cost, true, &ctx);
            d.remaining = state.usage(&target, &ctx).remaining;
            return Some(d);
        }
        let state = self.keys.entry(id.clone()).or_default();
        let d = state.decide(&target, RuleMode::Enforce, cost, false, &ctx);
        let listing = state.take_listing();
        self.list_as(listing, id);
        Some(d)
    }

    /// Lists a key after a decision as its state asked: a decision whose write no peer needs
    /// yet (a token bucket near full) lists the key later or not at all, as a node's store
    /// does (`KeyState::take_listing`).
    fn list_as(&mut self, listing: Listing, id: Vec<u8>) {
        match listing {
            Listing::Now => self.touched(id),
            Listing::Later => {
                self.later.insert(id);
            }
            Listing::Quiet => {}
        }
    }

    /// Decides a check here only if this node's own rights admit it, as a node with
    /// `cluster.local_first` does for a key a region-mate owns (`Limiter::check_if_held`):
    /// `None` when it must go to the owner (the key is not held here, or the rights are
    /// short; the request then counts toward this node's forecast).
    pub fn decide_if_held(
        &mut self,
        rule: &str,
        key: &str,
        cost: u64,
        now: Millis,
        view: ClusterView,
    ) -> Option<Decision> {
        let (target, id) = resolve(&self.rules, rule, key, cost, now)?;
        if cost == 0 || !target.algorithm.decided_where_held() {
            return None;
        }
        let ctx = decide_ctx(self.me, &self.replicas, now, view);
        let state = self.keys.get_mut(&id)?;
        let d = state.decide_if_held(&target, RuleMode::Enforce, cost, &ctx);
        let listing = state.take_listing();
        self.list_as(listing, id);
        d
    }

    /// Gives back `cost` tokens of `rule` for `key` at `now`, as a node does for a check
    /// with `refund: true`, and says what the core really gave back: by epoch (a sliding
    /// log's: by the millisecond of the admission), in tokens. A token bucket's is what its
    /// own level rose by, in whole tokens as `remaining` shows them (the cost, unless the
    /// sub-bucket was full). `None` if the rule is unknown.
    pub fn refund(
        &mut self,
        rule: &str,
        key: &str,
        cost: u64,
        now: Millis,
        view: ClusterView,
    ) -> Option<Vec<(u64, u64)>> {
        let (target, id) = resolve(&self.rules, rule, key, cost, now)?;
        let ctx = decide_ctx(self.me, &self.replicas, now, view);
        let state = self.keys.entry(id.clone()).or_default();
        let back = refund_measured(state, &target, cost, &ctx);
        self.touched(id);
        Some(back)
    }

    /// Decides an atomic call of `cost` against several rules of `key`: `entries` are
    /// (rule, class), distinct rules. As `levee_core::decide_all` (what a node's
    /// `Limiter::check_all` runs when it owns every key): allowed only if every enforced rule
    /// allows, shadow rules consuming only then and when they would allow. `None` if a rule
    /// is unknown or a cost can never be granted.
    pub fn decide_all(
        &mut self,
        entries: &[(&str, Option<&str>)],
        key: &str,
        cost: u64,
        now: Millis,
        view: ClusterView,
    ) -> Option<levee_core::AllDecision> {
        let mut targets = Vec::with_capacity(entries.len());
        let mut ids = Vec::with_capacity(entries.len());
        for &(rule, class) in entries {
            let bound = find(&self.rules, rule, now)?;
            let target = bound.target_with(class, cost, over(bound, key)).ok()?;
            let mut id = Vec::new();
            encode_id(&mut id, &bound.name, target.bucket, key);
            targets.push((target, bound.mode));
            ids.push(id);
        }
        // Every state out of the map at once (distinct ids), decided together, put back.
        let mut states: Vec<KeyState> = ids
            .iter()
            .map(|id| self.keys.remove(id).unwrap_or_default())
            .collect();
        let ctx = decide_ctx(self.me, &self.replicas, now, view);
        let mut checks: Vec<(&mut KeyState, Target<'_>, RuleMode)> = states
            .iter_mut()
            .zip(targets)
            .map(|(s, (t, m))| (s, t, m))
            .collect();
        let d = levee_core::decide_all(&mut checks, cost, false, &ctx);
        drop(checks);
        for (id, state) in ids.into_iter().zip(states) {
            self.keys.insert(id.clone(), state);
            self.dirty.insert(id.clone());
            self.active.insert(id);
        }
        Some(d)
    }

    /// A key's replicated state, if held.
    pub fn state(&self, rule: &str, key: &str) -> Option<&KeyCrdt> {
        let mut id = Vec::new();
        encode_id(&mut id, rule, None, key);
        self.keys.get(&id).map(KeyState::crdt)
    }

    fn rule_of(&self, id: &[u8]) -> Option<&Rule> {
        let (rule, _, _) = decode_id(id)?;
        find(&self.rules, rule, self.now)
    }

    fn refresh_fingerprint(&mut self, id: &[u8]) {
        let retained = self
            .rule_of(id)
            .map_or(1, |r| r.algorithm.retained_epochs());
        let fp = self
            .keys
            .get(id)
            .map(|s| key_fingerprint(id, s.crdt(), retained));
        self.fingerprints.set(id, fp, self.now);
    }
}

/// The rule named `name` as bound at `now`.
fn find<'a>(rules: &'a [Bound], name: &str, now: Millis) -> Option<&'a Rule> {
    rules
        .iter()
        .find(|b| b.base.name == name)
        .map(|b| b.at(now))
}

/// What node `me` decides by at `now`, seeing the cluster as `view`.
fn decide_ctx(me: NodeIdx, replicas: &ReplicaSet, now: Millis, view: ClusterView) -> DecideCtx<'_> {
    DecideCtx {
        now,
        me,
        replicas,
        view,
    }
}

/// The bucket a check of `cost` for `key` under rule `name` draws from (the key's override
/// figures, if any), and the id of its state.
fn resolve<'a>(
    rules: &'a [Bound],
    name: &str,
    key: &str,
    cost: u64,
    now: Millis,
) -> Option<(Target<'a>, Vec<u8>)> {
    let bound = find(rules, name, now)?;
    let target = bound.target_with(None, cost, over(bound, key)).ok()?;
    let mut id = Vec::new();
    encode_id(&mut id, &bound.name, target.bucket, key);
    Some((target, id))
}

/// A key's own figures under `rule` (a per-key override of its limit), if it has any.
fn over<'r>(rule: &'r Rule, key: &str) -> Option<&'r levee_core::Algorithm> {
    match rule.overrides.get(key) {
        Some(levee_core::Effect::Figures(a)) => Some(a),
        _ => None,
    }
}

/// Gives back `cost` tokens of a key at `ctx`, and says what the core really gave back: by
/// epoch (a sliding log's: by the millisecond of the admission), in tokens. A token bucket's
/// is what the node's own level rose by, in whole tokens as `remaining` shows them: the
/// cost, unless the sub-bucket was full (then at most one token more than the true rise).
pub fn refund_measured(
    state: &mut KeyState,
    target: &Target<'_>,
    cost: u64,
    ctx: &DecideCtx<'_>,
) -> Vec<(u64, u64)> {
    let me = ctx.me;
    let refunded = |s: &KeyState| -> BTreeMap<u64, u64> {
        s.crdt()
            .slots
            .iter()
            .filter_map(|slot| Some((slot.epoch, slot.tallies.get(me)?.refunded)))
            .collect()
    };
    if let levee_core::Algorithm::TokenBucket { .. } = target.algorithm {
        let level_before = state
            .decide(target, RuleMode::Enforce, 0, true, ctx)
            .remaining;
        let after = state.refund(target, cost, ctx);
        let rose = after.remaining.saturating_sub(level_before).min(cost);
        return vec![(target.algorithm.epoch(ctx.now), rose)];
    }
    let before = refunded(state);
    state.refund(target, cost, ctx);
    refunded(state)
        .into_iter()
        .filter_map(|(e, r)| {
            let gave = r.saturating_sub(before.get(&e).copied().unwrap_or(0));
            (gave > 0).then_some((e, gave))
        })
        .collect()
}

impl KeyStates for SimStates {
    fn drain_deltas(&mut self, max: usize) -> Vec<(Vec<u8>, KeyCrdt)> {
        let mut out = Vec::new();
        while out.len() < max {
            let Some(id) = self.dirty.pop_first() else {
                break;
            };
            let delta = self.keys.get_mut(&id).and_then(|s| s.take_delta(self.me));
            self.refresh_fingerprint(&id);
            if let Some(delta) = delta {
                out.push((id, delta));
            }
        }
        out
    }

    fn merge(&mut self, id: &[u8], state: &KeyCrdt, now: Millis) -> Result<(), Refused> {
        let (rule_name, bucket, key) = decode_id(id).ok_or_else(|| Refused("bad id".into()))?;
        let bound =
            find(&self.rules, rule_name, now).ok_or_else(|| Refused("unknown rule".into()))?;
        let target = bound
            .target_of_bucket_with(bucket, over(bound, key))
            .ok_or_else(|| Refused("unknown class".into()))?;
        let ctx = decide_ctx(self.me, &self.replicas, now, ClusterView::alone());
        let changed = levee_cluster::memory::merge_key(
            &mut self.keys,
            &mut self.active,
            id,
            state,
            &target,
            &ctx,
        )
        .map_err(|e| {
            if matches!(e, MergeError::UnknownNode { .. }) {
                self.unknown_node += 1;
            }
            Refused(e.to_string())
        })?;
        if changed {
            self.refresh_fingerprint(id);
        }
        Ok(())
    }

    fn changed_since(&self, id: &[u8], since: Millis) -> bool {
        self.fingerprints.changed_since(id, since)
    }

    fn for_each(&self, now: Millis, f: &mut dyn FnMut(&[u8], &KeyCrdt, u64)) {
        for (id, state) in &self.keys {
            let oldest = self.rule_of(id).map_or(0, |r| {
                let e = r.algorithm.epoch(now);
                e.saturating_sub(r.algorithm.retained_epochs() - 1)
            });
            f(id, state.crdt(), oldest);
        }
    }

    fn digest(&mut self, _now: Millis) -> Vec<u64> {
        self.fingerprints.buckets()
    }

    fn get(&self, id: &[u8]) -> Option<KeyCrdt> {
        self.keys.get(id).map(|s| s.crdt().clone())
    }

    fn algorithm_of(&self, rule: &str, class: Option<&str>, now: Millis) -> Option<Algorithm> {
        let b = self.rules.iter().find(|b| b.base.name == rule)?;
        b.at(now).algorithm_of(class)
    }

    fn listed_now(&mut self) -> usize {
        self.active.len()
    }

    fn join_later(&mut self) {
        for id in std::mem::take(&mut self.later) {
            self.touched(id);
        }
    }

    fn activate_all(&mut self) {
        self.active.extend(self.keys.keys().cloned());
    }

    fn update_active(&mut self, f: &mut dyn FnMut(&[u8], &mut KeyState, &Target<'_>)) {
        let active = std::mem::take(&mut self.active);
        let now = self.now;
        for id in active {
            let Some((rule, bucket, key)) = decode_id(&id) else {
                continue;
            };
            let Some(bound) = find(&self.rules, rule, now) else {
                continue;
            };
            let Some(target) = bound.target_of_bucket_with(bucket, over(bound, key)) else {
                continue;
            };
            let Some(state) = self.keys.get_mut(&id) else {
                continue;
            };
            f(&id, state, &target);
            self.dirty.insert(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::levee::rule;
    use crate::lists::NodeList;
    use crate::plan::Topology;

    #[test]
    fn a_share_that_shrinks_applies_at_once_and_one_that_grows_waits_for_the_window_after_next() {
        let t = Topology {
            nodes_per_region: vec![1, 1],
            weights: vec![1, 1],
            one_way_ms: vec![vec![1, 50], vec![50, 1]],
        };
        let first = NodeList::initial(&t);
        let grown = first.with_added(0);
        // Node 0 of region 0: 100 of 200; with a region-mate, 50.
        let mut s = SimStates::new(NodeIdx(0), first.replica_set(), vec![rule(200, 1_000)]);
        assert_eq!(s.share_at(10_500), 100);
        s.rebind(grown.replica_set(), 10_500);
        assert_eq!(s.share_at(10_500), 50, "a shrink applies at once");
        // The new node's part (from nothing) waits; this node's stays 50.
        assert_eq!(s.pending_growth(10_500), Some(13_000));
        assert_eq!(s.share_at(13_000), 50);
        // The region-mate removed again: 100, from the window after next on the clock of a
        // peer `max_clock_skew` (500 ms) ahead, which is in window 11 already: from 13,000.
        s.rebind(grown.with_removed(2).replica_set(), 10_500);
        assert_eq!(s.share_at(10_999), 50);
        assert_eq!(s.pending_growth(10_500), Some(13_000));
        assert_eq!(s.share_at(12_999), 50);
        assert_eq!(s.share_at(13_000), 100);
        // A change early in a window (400 ms in, a peer ahead still in it): from 12,000.
        let mut early = SimStates::new(NodeIdx(0), first.replica_set(), vec![rule(200, 1_000)]);
        early.rebind(grown.replica_set(), 10_400);
        early.rebind(grown.with_removed(2).replica_set(), 10_400);
        assert_eq!(early.pending_growth(10_400), Some(12_000));
    }
}
