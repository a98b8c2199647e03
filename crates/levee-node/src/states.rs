//! The node's key store as the replication protocol sees it ([`KeyStates`]).
//!
//! The store lists every key used or merged since the last gossip interval; a tick takes that
//! list once; the machine rebalances those keys (strict mode) and sends their deltas.

use levee_cluster::{DigestBuckets, KeyStates, Refused, key_fingerprint};
use levee_core::{ClusterView, DecideCtx, KeyCrdt, KeyState, Millis, Target};
use levee_proto::decode_id;

use crate::limiter::{Limiter, RuleSet};
use crate::store::{KeyId, Slot};

/// A full rebuild of the digest at least this often (ms): it drops keys the store evicted
/// or pruned, which the incremental updates do not see.
const DIGEST_REBUILD_MS: Millis = 60_000;

/// The store's anti-entropy digest, kept between ticks: every key's fingerprint is
/// recorded (in its slot, and XORed into its bucket) when a merge changes it or when a tick
/// drains it (every key used or changed since the last tick), so a digest costs O(buckets)
/// and no memory per key beyond the slot's 8 bytes. Keys that leave the store stay in their
/// bucket until a full rebuild, every [`DIGEST_REBUILD_MS`], or sooner when the keys
/// recorded since the last rebuild outnumber the store by a quarter; until then their
/// buckets differ from the peers' and anti-entropy exchanges those buckets' keys.
#[derive(Debug, Default)]
pub struct NodeDigest {
    buckets: DigestBuckets,
    /// Keys recorded for the first time since the last rebuild.
    recorded: usize,
    next_rebuild: Millis,
}

impl NodeDigest {
    /// Records a slot's new fingerprint.
    fn record(&mut self, id: &[u8], slot: &mut Slot, fp: u64) {
        let old = std::mem::replace(&mut slot.fingerprint, fp);
        if old == 0 {
            self.recorded += 1;
        }
        self.buckets
            .replace(id, (old != 0).then_some(old), Some(fp));
    }
}

/// The store as one call of the state machine sees it.
pub struct NodeStates<'a> {
    limiter: &'a Limiter,
    rules: arc_swap::Guard<std::sync::Arc<RuleSet>>,
    /// The store's list of keys changed since the last gossip interval, taken when the
    /// machine first asks for it (rebalancing or deltas: only at the end of an interval).
    active: Option<Vec<KeyId>>,
    pending: Vec<KeyId>,
    digest: &'a mut NodeDigest,
}

impl<'a> NodeStates<'a> {
    /// The store of `limiter`, with its anti-entropy digest.
    pub fn new(limiter: &'a Limiter, digest: &'a mut NodeDigest) -> NodeStates<'a> {
        NodeStates {
            limiter,
            rules: limiter.rules(),
            active: None,
            pending: Vec::new(),
            digest,
        }
    }

    /// The keys changed since the last interval, taken from the store on first use.
    fn active(&mut self) -> &[KeyId] {
        if self.active.is_none() {
            let changed = self.limiter.store().take_changed();
            self.pending = changed.clone();
            self.active = Some(changed);
        }
        self.active.as_deref().unwrap_or_default()
    }
}

/// Epochs a key's fingerprint covers, from its rule.
fn retained(rules: &RuleSet, id: &[u8]) -> u64 {
    target_of(rules, id).map_or(1, |t| t.algorithm.retained_epochs())
}

/// The bucket target a stored identity belongs to ([`levee_core::Rule::target_of_bucket`]).
pub fn target_of<'r>(rules: &'r RuleSet, id: &[u8]) -> Option<Target<'r>> {
    let (rule, bucket, _) = decode_id(id)?;
    rules.by_name.get(rule)?.rule.target_of_bucket(bucket)
}

impl KeyStates for NodeStates<'_> {
    fn drain_deltas(&mut self, max: usize) -> Vec<(Vec<u8>, KeyCrdt)> {
        let me = self.rules.me;
        self.active();
        let mut out = Vec::new();
        while out.len() < max {
            let Some(id) = self.pending.pop() else { break };
            let retained = retained(&self.rules, &id);
            let digest = &mut *self.digest;
            let delta = self.limiter.store().with_slot(&id, |slot| {
                slot.queued = false;
                let d = slot.state.take_delta(me);
                let fp = key_fingerprint(&id, slot.state.crdt(), retained);
                digest.record(&id, slot, fp);
                d
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
        let retained = target.algorithm.retained_epochs();
        let store = self.limiter.store();
        let digest = &mut *self.digest;
        store.with_slot(id, |slot| {
            let changed = slot
                .state
                .merge(state, &target, &ctx)
                .map_err(|e| Refused(e.to_string()));
            store.note(id, slot);
            if changed? {
                let fp = key_fingerprint(id, slot.state.crdt(), retained);
                digest.record(id, slot, fp);
            }
            Ok(())
        })
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

    fn digest(&mut self, now: Millis) -> Vec<u64> {
        let store = self.limiter.store();
        let d = &mut *self.digest;
        if now >= d.next_rebuild || d.recorded > store.len() + store.len() / 4 + 1024 {
            d.next_rebuild = now + DIGEST_REBUILD_MS;
            d.buckets.clear();
            d.recorded = 0;
            let rules = &self.rules;
            store.for_each_slot(|id, slot| {
                let fp = key_fingerprint(id, slot.state.crdt(), retained(rules, id));
                slot.fingerprint = 0;
                d.record(id, slot, fp);
            });
        }
        d.buckets.buckets()
    }

    fn get(&self, id: &[u8]) -> Option<KeyCrdt> {
        self.limiter.store().peek(id, |s| s.crdt().clone())
    }

    fn update_active(&mut self, f: &mut dyn FnMut(&[u8], &mut KeyState, &Target<'_>)) {
        self.active();
        let rules = &self.rules;
        for id in self.active.as_deref().unwrap_or_default() {
            let Some(target) = target_of(rules, id) else {
                continue;
            };
            self.limiter
                .store()
                .with_slot(id, |slot| f(id, &mut slot.state, &target));
        }
    }
}
