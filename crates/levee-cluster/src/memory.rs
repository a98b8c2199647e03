//! Key states in a plain ordered map: the [`KeyStates`] of tests and of the deterministic
//! simulator. It runs the same core code a node runs (decide, merge, rebalance, deltas).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use levee_core::{
    Algorithm, ClusterView, DecideCtx, Decision, KeyCrdt, KeyState, Listing, Millis, NodeIdx,
    ReplicaSet, Rule, RuleMode, Target, Usage,
};
use levee_proto::{decode_id, encode_id};

use crate::{Fingerprints, KeyStates, Refused, key_fingerprint};

/// Key states of one node, in memory.
pub struct MemoryStates {
    me: NodeIdx,
    replicas: ReplicaSet,
    rules: HashMap<String, Rule>,
    keys: BTreeMap<Vec<u8>, KeyState>,
    dirty: BTreeSet<Vec<u8>>,
    active: BTreeSet<Vec<u8>>,
    /// Keys listed for later ([`Listing::Later`]).
    later: BTreeSet<Vec<u8>>,
    /// The anti-entropy digest, updated as keys change.
    fingerprints: Fingerprints,
    /// The clock of the last call that told it (a decision, a merge, a digest).
    now: Millis,
}

impl MemoryStates {
    /// Empty states for node `me` with these rules (bound to `replicas` here).
    pub fn new(me: NodeIdx, replicas: ReplicaSet, rules: Vec<Rule>) -> MemoryStates {
        let rules = rules
            .into_iter()
            .map(|mut r| {
                r.bind(&replicas);
                (r.name.clone(), r)
            })
            .collect();
        MemoryStates {
            me,
            replicas,
            rules,
            keys: BTreeMap::new(),
            dirty: BTreeSet::new(),
            active: BTreeSet::new(),
            later: BTreeSet::new(),
            fingerprints: Fingerprints::default(),
            now: 0,
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

    /// Decides one check of `rule` for `key`; `None` if the rule is unknown or the cost can
    /// never be granted.
    pub fn decide(
        &mut self,
        rule: &str,
        key: &str,
        cost: u64,
        now: Millis,
        view: ClusterView,
    ) -> Option<Decision> {
        self.now = self.now.max(now);
        let rule = self.rules.get(rule)?;
        let target = rule.target(None, cost).ok()?;
        let mut id = Vec::new();
        encode_id(&mut id, &rule.name, target.bucket, key);
        let ctx = DecideCtx {
            now,
            me: self.me,
            replicas: &self.replicas,
            view,
        };
        let state = self.keys.entry(id.clone()).or_default();
        let d = state.decide(&target, RuleMode::Enforce, cost, false, &ctx);
        // A decision whose write no peer needs yet (a token bucket near full) lists the key
        // later or not at all, as a node's store does (`KeyState::take_listing`).
        match state.take_listing() {
            Listing::Now => self.touched(id),
            Listing::Later => {
                self.later.insert(id);
            }
            Listing::Quiet => {}
        }
        Some(d)
    }

    /// Lists a key as changed: its delta goes out and it is rebalanced at the next interval.
    fn touched(&mut self, id: Vec<u8>) {
        self.dirty.insert(id.clone());
        self.active.insert(id);
    }

    /// A key's usage as this node sees it.
    pub fn usage(&self, rule: &str, key: &str, now: Millis) -> Option<Usage> {
        let rule = self.rules.get(rule)?;
        let target = rule.target(None, 0).ok()?;
        let mut id = Vec::new();
        encode_id(&mut id, &rule.name, target.bucket, key);
        let ctx = DecideCtx {
            now,
            me: self.me,
            replicas: &self.replicas,
            view: ClusterView::alone(),
        };
        Some(match self.keys.get(&id) {
            Some(s) => s.usage(&target, &ctx),
            None => KeyState::new().usage(&target, &ctx),
        })
    }

    /// A key's replicated state, if held.
    pub fn state(&self, rule: &str, key: &str) -> Option<&KeyCrdt> {
        let mut id = Vec::new();
        encode_id(&mut id, rule, None, key);
        self.keys.get(&id).map(KeyState::crdt)
    }

    /// Number of keys held.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    fn rule_of(&self, id: &[u8]) -> Option<&Rule> {
        let (rule, _, _) = decode_id(id)?;
        self.rules.get(rule)
    }

    /// Records a key's fingerprint as it is now.
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

/// Merges a peer's state of key `id` into a map of key states, as a node's store does: the
/// key is created only by a merge that is accepted (a refused one leaves nothing), and listed
/// in `active` (rebalanced and drained at the next interval) only when it is new here, the
/// merge moved what rebalancing reads, or it wrote an entry of this node's. Returns whether
/// the state changed. [`MemoryStates`] and the simulator's store share it.
pub fn merge_key(
    keys: &mut BTreeMap<Vec<u8>, KeyState>,
    active: &mut BTreeSet<Vec<u8>>,
    id: &[u8],
    state: &KeyCrdt,
    target: &Target<'_>,
    ctx: &DecideCtx<'_>,
) -> Result<bool, levee_core::MergeError> {
    let fresh = !keys.contains_key(id);
    let key = keys.entry(id.to_vec()).or_default();
    let merged = key.merge_noting(state, target, ctx);
    let Ok(m) = merged else {
        if fresh {
            keys.remove(id);
        }
        return merged.map(|m| m.changed);
    };
    if fresh || m.moves_rights || key.has_delta() {
        active.insert(id.to_vec());
    }
    Ok(m.changed)
}

impl KeyStates for MemoryStates {
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
        self.now = self.now.max(now);
        let (rule_name, bucket, _) = decode_id(id).ok_or_else(|| Refused("bad id".into()))?;
        let rule = self
            .rules
            .get(rule_name)
            .ok_or_else(|| Refused("unknown rule".into()))?;
        let target = rule
            .target_of_bucket(bucket)
            .ok_or_else(|| Refused("unknown class".into()))?;
        let ctx = DecideCtx {
            now,
            me: self.me,
            replicas: &self.replicas,
            view: ClusterView::alone(),
        };
        let changed = merge_key(&mut self.keys, &mut self.active, id, state, &target, &ctx)
            .map_err(|e| Refused(e.to_string()))?;
        if changed {
            self.refresh_fingerprint(id);
        }
        Ok(())
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

    fn changed_since(&self, id: &[u8], since: Millis) -> bool {
        self.fingerprints.changed_since(id, since)
    }

    fn digest(&mut self, now: Millis) -> Vec<u64> {
        self.now = self.now.max(now);
        self.fingerprints.buckets()
    }

    fn get(&self, id: &[u8]) -> Option<KeyCrdt> {
        self.keys.get(id).map(|s| s.crdt().clone())
    }

    fn algorithm_of(&self, rule: &str, class: Option<&str>, _now: Millis) -> Option<Algorithm> {
        self.rules.get(rule)?.algorithm_of(class)
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
        for id in active {
            let Some((rule, bucket, _)) = decode_id(&id) else {
                continue;
            };
            let Some(target) = self
                .rules
                .get(rule)
                .and_then(|r| r.target_of_bucket(bucket))
            else {
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
