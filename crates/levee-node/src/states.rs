//! The node's key store as the replication protocol sees it ([`KeyStates`]).
//!
//! The store lists every key used or merged since the last gossip interval; a tick takes that
//! list once, rebalances those keys (strict mode) and sends their deltas.

use levee_cluster::{KeyStates, Refused};
use levee_core::{ClusterView, DecideCtx, KeyCrdt, Millis, NodeIdx, RebalanceCtx, Target};
use levee_proto::decode_id;

use crate::limiter::{Limiter, RuleSet};
use crate::store::KeyId;

/// Rights in flight to one peer are capped at this fraction of a key's capacity.
const MAX_IN_FLIGHT_FRACTION: f64 = 0.5;

/// One tick's view of the store.
pub struct NodeStates<'a> {
    limiter: &'a Limiter,
    rules: arc_swap::Guard<std::sync::Arc<RuleSet>>,
    active: Vec<KeyId>,
    pending: Vec<KeyId>,
}

impl<'a> NodeStates<'a> {
    /// Takes the store's list of changed keys.
    pub fn new(limiter: &'a Limiter) -> NodeStates<'a> {
        let active = limiter.store().take_changed();
        let pending = active.clone();
        NodeStates {
            limiter,
            rules: limiter.rules(),
            active,
            pending,
        }
    }

    /// A view for merges only (no list is taken).
    pub fn for_messages(limiter: &'a Limiter) -> NodeStates<'a> {
        NodeStates {
            limiter,
            rules: limiter.rules(),
            active: Vec::new(),
            pending: Vec::new(),
        }
    }
}

/// The bucket target a stored identity belongs to.
pub fn target_of<'r>(rules: &'r RuleSet, id: &[u8]) -> Option<Target<'r>> {
    let (rule, bucket, _) = decode_id(id)?;
    let entry = rules.by_name.get(rule)?;
    let class = match bucket {
        Some(b) => Some(entry.rule.classes.get(usize::from(b))?.name.as_str()),
        None => entry
            .rule
            .classes
            .iter()
            .find(|c| c.own.is_none())
            .map(|c| c.name.as_str()),
    };
    let target = entry.rule.target(class, 0).ok()?;
    (target.bucket == bucket).then_some(target)
}

impl KeyStates for NodeStates<'_> {
    fn drain_deltas(&mut self, max: usize) -> Vec<(Vec<u8>, KeyCrdt)> {
        let me = self.rules.me;
        let mut out = Vec::new();
        while out.len() < max {
            let Some(id) = self.pending.pop() else { break };
            let delta = self.limiter.store().with_slot(&id, |slot| {
                slot.queued = false;
                slot.state.take_delta(me)
            });
            if let Some(d) = delta {
                out.push((id.to_vec(), d));
            }
        }
        out
    }

    fn merge(&mut self, id: &[u8], state: &KeyCrdt, now: Millis) -> Result<(), Refused> {
        let target =
            target_of(&self.rules, id).ok_or_else(|| Refused("unknown rule or class".into()))?;
        let ctx = DecideCtx {
            now,
            me: self.rules.me,
            replicas: &self.rules.replicas,
            view: ClusterView::alone(),
        };
        let store = self.limiter.store();
        store.with_slot(id, |slot| {
            let r = slot
                .state
                .merge(state, &target, &ctx)
                .map_err(|e| Refused(e.to_string()));
            store.note(id, slot);
            r
        })?;
        Ok(())
    }

    fn for_each(&self, now: Millis, f: &mut dyn FnMut(&[u8], &KeyCrdt, u64)) {
        let rules = &self.rules;
        self.limiter.store().for_each(|id, state| {
            let oldest = target_of(rules, id).map_or(0, |t| {
                t.algorithm
                    .epoch(now)
                    .saturating_sub(t.algorithm.retained_epochs() - 1)
            });
            f(id, state.crdt(), oldest);
        });
    }

    fn get(&self, id: &[u8]) -> Option<KeyCrdt> {
        self.limiter.store().peek(id, |s| s.crdt().clone())
    }

    fn rebalance(&mut self, now: Millis, view: ClusterView, owner: &dyn Fn(&[u8]) -> NodeIdx) {
        let rules = &self.rules;
        for id in &self.active {
            let Some(target) = target_of(rules, id) else {
                continue;
            };
            let ctx = RebalanceCtx {
                now,
                me: rules.me,
                replicas: &rules.replicas,
                view,
                owner: owner(id),
                max_in_flight: ((target.algorithm.capacity() as f64) * MAX_IN_FLIGHT_FRACTION)
                    .ceil() as u64,
            };
            self.limiter
                .store()
                .with_slot(id, |slot| slot.state.rebalance(&target, &ctx));
        }
    }
}
