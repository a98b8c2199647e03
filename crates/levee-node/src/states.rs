//! The node's key store as the replication protocol sees it ([`KeyStates`]).
//!
//! The store lists every key used or merged since the last gossip interval; a tick takes that
//! list once; the machine rebalances those keys (strict mode) and sends their deltas.

use levee_cluster::{DigestBuckets, KeyStates, Refused, key_fingerprint, override_hash};
use levee_core::{Algorithm, ClusterView, DecideCtx, Effect, KeyCrdt, KeyState, Millis, Target};
use levee_proto::{OverrideEntry, decode_id};

use crate::limiter::{Limiter, OverrideTable, RuleSet};
use crate::store::{KeyEntry, Slot};
use std::sync::Weak;

/// A full rebuild of the digest at least this often (ms): it drops keys the store evicted
/// or pruned, which the incremental updates do not see.
const DIGEST_REBUILD_MS: Millis = 60_000;

/// The store's anti-entropy digest, kept between ticks: every key's fingerprint is
/// recorded (in its slot, and XORed into its bucket) when a merge changes it or when a tick
/// drains it (every key used or changed since the last tick), so a digest costs O(buckets)
/// and no memory per key beyond the slot's 8 bytes. Keys that leave the store stay in their
/// bucket until a full rebuild, every [`DIGEST_REBUILD_MS`], or sooner when the keys
/// recorded since the last rebuild outnumber the store by a quarter; until then their
/// buckets differ from the peers' and anti-entropy exchanges those buckets' keys. A rebuild
/// fingerprints every key as it is, except a key with writes not sent yet (a near-full
/// bucket's quiet writes): it keeps its recorded fingerprint, which its peers hold, and is
/// listed for later, so that its writes go out with the next heartbeat's batch.
#[derive(Debug, Default)]
pub struct NodeDigest {
    buckets: DigestBuckets,
    /// Keys recorded for the first time since the last rebuild.
    recorded: usize,
    next_rebuild: Millis,
}

impl NodeDigest {
    /// Records a slot's new fingerprint, as of `now` if it changed.
    fn record(&mut self, id: &[u8], slot: &mut Slot, fp: u64, now: Millis) {
        let old = std::mem::replace(&mut slot.fingerprint, fp);
        if old == 0 {
            self.recorded += 1;
        }
        if old != fp {
            slot.changed_at_s = u32::try_from(now / 1000).unwrap_or(u32::MAX);
        }
        self.buckets
            .replace(id, (old != 0).then_some(old), Some(fp));
    }
}

/// The store as one call of the state machine sees it.
pub struct NodeStates<'a> {
    limiter: &'a Limiter,
    rules: arc_swap::Guard<std::sync::Arc<RuleSet>>,
    /// The runtime overrides (a key's own figures are its target's).
    overrides: arc_swap::Guard<std::sync::Arc<OverrideTable>>,
    /// When this call began: which overrides are in force.
    now: Millis,
    /// The store's list of keys changed since the last gossip interval, taken when the
    /// machine first asks for it (rebalancing or deltas: only at the end of an interval).
    active: Option<Vec<Weak<KeyEntry>>>,
    pending: Vec<Weak<KeyEntry>>,
    digest: &'a mut NodeDigest,
}

impl<'a> NodeStates<'a> {
    /// The store of `limiter`, with its anti-entropy digest.
    pub fn new(limiter: &'a Limiter, digest: &'a mut NodeDigest) -> NodeStates<'a> {
        NodeStates {
            limiter,
            rules: limiter.rules(),
            overrides: limiter.overrides(),
            now: limiter.clock.now_ms(),
            active: None,
            pending: Vec::new(),
            digest,
        }
    }

    /// The keys changed since the last interval, taken from the store on first use.
    fn active(&mut self) -> &[Weak<KeyEntry>] {
        if self.active.is_none() {
            let changed = self.limiter.store().take_changed();
            self.pending = changed.clone();
            self.active = Some(changed);
        }
        self.active.as_deref().unwrap_or_default()
    }
}

/// Epochs a key's fingerprint covers, from its rule.
fn retained(rules: &RuleSet, overrides: &OverrideTable, id: &[u8], now: Millis) -> u64 {
    target_of(rules, overrides, id, now).map_or(1, |t| t.algorithm.retained_epochs())
}

/// The bucket target a stored identity belongs to at `now`
/// ([`levee_core::Rule::target_of_bucket_with`]), with the key's own figures when it has an
/// override (runtime in `overrides`, else the rule's `[[rule.override]]`): what merging,
/// rebalancing, snapshots and eviction read, as deciding does.
pub fn target_of<'r>(
    rules: &'r RuleSet,
    overrides: &'r OverrideTable,
    id: &[u8],
    now: Millis,
) -> Option<Target<'r>> {
    let (rule, bucket, key) = decode_id(id)?;
    let rule = rules.by_name.get(rule)?.rule_at(now);
    let over = match overrides
        .effect(&rule.name, key, now)
        .or_else(|| rule.overrides.get(key))
    {
        Some(Effect::Figures(a)) => Some(a),
        _ => None,
    };
    rule.target_of_bucket_with(bucket, over)
}

impl KeyStates for NodeStates<'_> {
    fn drain_deltas(&mut self, max: usize) -> Vec<(Vec<u8>, KeyCrdt)> {
        let me = self.rules.me;
        self.active();
        let mut out = Vec::new();
        while out.len() < max {
            let Some(weak) = self.pending.pop() else {
                break;
            };
            // A key evicted or removed since it was listed is not created again.
            let Some(entry) = weak.upgrade() else {
                continue;
            };
            let id = entry.id();
            let retained = retained(&self.rules, &self.overrides, id, self.now);
            let mut slot = entry.lock();
            if slot.removed {
                continue;
            }
            slot.queued = false;
            slot.later = false;
            let delta = slot.state.take_delta(me);
            let fp = key_fingerprint(id, slot.state.crdt(), retained);
            self.digest.record(id, &mut slot, fp, self.now);
            if let Some(d) = delta {
                out.push((id.to_vec(), d));
            }
        }
        out
    }

    fn merge(&mut self, id: &[u8], state: &KeyCrdt, now: Millis) -> Result<(), Refused> {
        let target = target_of(&self.rules, &self.overrides, id, now)
            .ok_or_else(|| Refused("unknown rule or class".into()))?;
        let ctx = DecideCtx {
            now,
            me: self.rules.me,
            replicas: &self.rules.replicas,
            view: ClusterView::alone(),
        };
        let retained = target.algorithm.retained_epochs();
        let digest = &mut *self.digest;
        self.limiter
            .store()
            .merge_slot_noted_if(id, |slot, fresh| {
                let merged = slot.state.merge_noting(state, &target, &ctx);
                let Ok(m) = merged else {
                    return (merged.map(|_| ()), false);
                };
                // Listed as changed (the next interval rebalances it, drains what this node
                // wrote and records its fingerprint) when the merge moved what rebalancing
                // reads, wrote an entry of this node's (a token bucket's level credited with
                // units received), or brought a key new here. Otherwise (another node's use
                // of a token bucket) nothing is left for the interval to do but the
                // fingerprint, recorded now.
                let note = fresh || m.moves_rights || slot.state.has_delta();
                if m.changed && !note {
                    let fp = key_fingerprint(id, slot.state.crdt(), retained);
                    digest.record(id, slot, fp, now);
                }
                (Ok(()), note)
            })
            .map_err(|e| Refused(e.to_string()))
    }

    fn for_each(&self, now: Millis, f: &mut dyn FnMut(&[u8], &KeyCrdt, u64)) {
        let (rules, overrides) = (&self.rules, &self.overrides);
        self.limiter.store().for_each(|id, state| {
            let oldest = target_of(rules, overrides, id, now).map_or(0, |t| {
                t.algorithm
                    .epoch(now)
                    .saturating_sub(t.algorithm.retained_epochs() - 1)
            });
            f(id, state.crdt(), oldest);
        });
    }

    fn for_each_id(&self, _: Millis, f: &mut dyn FnMut(&[u8])) {
        // No slot is locked and no rule looked up: a repair walks every key to find the
        // few in its buckets.
        self.limiter.store().for_each_id(f);
    }

    fn digest(&mut self, now: Millis) -> Vec<u64> {
        let store = self.limiter.store();
        let d = &mut *self.digest;
        if now >= d.next_rebuild || d.recorded > store.len() + store.len() / 4 + 1024 {
            d.next_rebuild = now + DIGEST_REBUILD_MS;
            d.buckets.clear();
            d.recorded = 0;
            let (rules, overrides) = (&self.rules, &self.overrides);
            store.for_each_slot_listing_later(|id, slot| {
                // A key with writes not sent yet — a near-full bucket's quiet writes
                // (`levee_core::Listing`), or a key listed for this interval — keeps the
                // fingerprint recorded when it was last sent or merged, which its peers hold
                // too, and is listed for later, so that its writes go out and are recorded
                // then. Fingerprinted as it is, every key in steady quiet use differed from
                // every peer's at each rebuild, and both sides repaired all of them.
                let unsent = slot.fingerprint != 0 && slot.state.has_delta();
                let fp = match unsent {
                    true => slot.fingerprint,
                    false => {
                        key_fingerprint(id, slot.state.crdt(), retained(rules, overrides, id, now))
                    }
                };
                // Rebuilt, not changed: the key keeps the time it last changed.
                let at = u64::from(slot.changed_at_s) * 1000;
                slot.fingerprint = 0;
                d.record(id, slot, fp, at);
                unsent
            });
        }
        d.buckets.buckets()
    }

    fn changed_since(&self, id: &[u8], since: Millis) -> bool {
        self.limiter
            .store()
            // A change in second `s` may have been as late as its last millisecond.
            .with_existing_slot(id, |s| u64::from(s.changed_at_s) * 1000 + 999 >= since)
            .unwrap_or(false)
    }

    fn get(&self, id: &[u8]) -> Option<KeyCrdt> {
        self.limiter.store().peek(id, |s| s.crdt().clone())
    }

    fn algorithm_of(&self, rule: &str, class: Option<&str>, now: Millis) -> Option<Algorithm> {
        self.rules.algorithm_of(rule, class, now)
    }

    fn listed_now(&mut self) -> usize {
        self.active().len()
    }

    fn join_later(&mut self) {
        self.active();
        let later = self.limiter.store().take_later();
        self.pending.extend(later.iter().cloned());
        if let Some(active) = self.active.as_mut() {
            active.extend(later);
        }
    }

    fn activate_all(&mut self) {
        // Every key is listed as changed (those already listed are not listed twice).
        let store = self.limiter.store();
        store.note_all();
        if let Some(active) = self.active.as_mut() {
            // Taken already this interval: add them now.
            let more = store.take_changed();
            self.pending.extend(more.iter().cloned());
            active.extend(more);
        }
    }

    fn update_active(&mut self, f: &mut dyn FnMut(&[u8], &mut KeyState, &Target<'_>)) {
        self.active();
        let (rules, overrides, now) = (&self.rules, &self.overrides, self.now);
        for weak in self.active.as_deref().unwrap_or_default() {
            let Some(entry) = weak.upgrade() else {
                continue;
            };
            let id = entry.id();
            let Some(target) = target_of(rules, overrides, id, now) else {
                continue;
            };
            let mut slot = entry.lock();
            if !slot.removed {
                f(id, &mut slot.state, &target);
            }
        }
    }
    fn take_overrides(&mut self) -> Vec<OverrideEntry> {
        self.limiter
            .take_changed_overrides()
            .into_iter()
            .map(|(rule, key, reg)| OverrideEntry { rule, key, reg })
            .collect()
    }

    fn all_overrides(&self) -> Vec<OverrideEntry> {
        self.limiter
            .overrides()
            .registers()
            .map(|(rule, key, reg)| OverrideEntry {
                rule: rule.to_owned(),
                key: key.to_owned(),
                reg: reg.clone(),
            })
            .collect()
    }

    fn overrides_digest(&self) -> u64 {
        self.all_overrides()
            .iter()
            .fold(0, |acc, e| acc ^ override_hash(e))
    }

    fn merge_overrides(&mut self, entries: Vec<OverrideEntry>) -> usize {
        self.limiter.merge_overrides(
            entries
                .into_iter()
                .map(|e| (e.rule, e.key, e.reg))
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::limiter::{CheckRef, Clock};
    use crate::store::encode_id;

    fn node(id: &str, max_keys: usize) -> Limiter {
        node_with(
            id,
            max_keys,
            "[[rule]]\nname = \"q\"\nalgorithm = \"quota\"\nlimit = 1000\nperiod = \"month\"\n",
        )
    }

    /// Node `id` (`eu-1` or `us-1`) of two regions of one node, with `rules`.
    fn node_with(id: &str, max_keys: usize, rules: &str) -> Limiter {
        let text = format!(
            "[node]\nid = \"{id}\"\nregion = \"{region}\"\nmax_keys = {max_keys}\n\n\
             [cluster]\nregions = {{ eu = 1, us = 1 }}\n\
             tls = {{ ca = \"ca.pem\", cert = \"n.pem\", key = \"n.key\" }}\n\
             [[cluster.node]]\nid = \"eu-1\"\nregion = \"eu\"\naddr = \"127.0.0.1:9001\"\n\
             [[cluster.node]]\nid = \"us-1\"\nregion = \"us\"\naddr = \"127.0.0.1:9002\"\n\n\
             {rules}",
            region = &id[..2]
        );
        let config = Config::parse(&text, "t.toml").expect("a valid configuration");
        Limiter::new(&config, Clock::default())
    }

    use crate::limiter::test_support::charge;

    /// Everything `from` changed since the last call, merged into `to` as gossip would.
    fn gossip(from: &Limiter, to: &Limiter) {
        let (mut d1, mut d2) = (NodeDigest::default(), NodeDigest::default());
        let deltas = NodeStates::new(from, &mut d1).drain_deltas(usize::MAX);
        let now = to.clock.now_ms();
        let mut into = NodeStates::new(to, &mut d2);
        for (id, crdt) in deltas {
            into.merge(&id, &crdt, now).expect("merged");
        }
    }

    /// Keys merged from a peer are held, and evicted, like keys decided here: a peer's flood
    /// of fresh keys evicts its own kind, not a key that holds a large part of its limit, and
    /// a key evicted after it was listed as changed is not created again by the next tick.
    #[test]
    fn merged_keys_are_held_and_evicted_like_any_other() {
        let (eu, us) = (node("eu-1", 50), node("us-1", 1_000));
        eu.store().track_changes();
        us.store().track_changes();
        charge(&us, "victim", 400);
        gossip(&us, &eu);
        for i in 0..500 {
            charge(&us, &format!("flood-{i}"), 1);
            if i % 50 == 49 {
                gossip(&us, &eu);
                assert!(eu.store().len() <= 50);
            }
        }
        assert_eq!(
            eu.usage("q", "victim", None).expect("usage").usage.used,
            400
        );
        let evicted = eu.store().evictions();
        assert_eq!(evicted, 501 - 50);
        // The tick drains the keys merged since the last one, most of them evicted since.
        let mut digest = NodeDigest::default();
        NodeStates::new(&eu, &mut digest).drain_deltas(usize::MAX);
        assert_eq!(
            eu.store().evictions(),
            evicted,
            "evicted keys were created again"
        );
        assert_eq!(eu.store().len(), 50);
        let mut id = Vec::new();
        encode_id(&mut id, "q", None, "victim");
        assert!(eu.store().peek(&id, |_| ()).is_some());
    }

    /// A key whose writes are not sent yet (a near-full bucket's quiet writes,
    /// `levee_core::Listing`) keeps, at a digest rebuild, the fingerprint its peers hold, and
    /// is listed for later so that the writes go out. Fingerprinted as it was, it differed from
    /// every peer's at each rebuild, and both sides repaired it: every key in steady quiet
    /// use, every minute (11,000 keys repaired by each node of a 1 x 2 cluster over 25 s).
    #[test]
    fn a_digest_rebuild_leaves_a_quiet_bucket_to_its_next_listing() {
        let eu = node_with(
            "eu-1",
            100,
            "[[rule]]\nname = \"tb\"\nalgorithm = \"token_bucket\"\nrate = 1\nper = \"1s\"\n\
             burst = 100000\n",
        );
        eu.store().track_changes();
        let replicas = eu.rules().replicas.clone();
        let (hears, clock_of) = (|_| true, |_| None);
        let mut digest = NodeDigest::default();
        // A tick: the listed keys rebalanced (their forecasts sampled), then drained.
        let tick = |digest: &mut NodeDigest| {
            let now = eu.clock.now_ms();
            let ctx = levee_core::RebalanceCtx {
                now,
                me: levee_core::NodeIdx(0),
                replicas: &replicas,
                view: eu.view(),
                owner: levee_core::NodeIdx(0),
                max_in_flight: 1_000,
                inherit_from: None,
                hears: &hears,
                clock_of: &clock_of,
                started: 0,
                own_demand: false,
            };
            let mut states = NodeStates::new(&eu, digest);
            states.update_active(&mut |_, state, target| {
                state.rebalance(target, &ctx);
            });
            states.drain_deltas(usize::MAX).len()
        };
        let check = || {
            let o = eu.check(CheckRef::of("tb", "k", 1)).expect("a check");
            assert!(o.decision.allowed);
        };
        // The first digest, of an empty store, is a rebuild; from here on it is kept up to
        // date as keys are drained.
        NodeStates::new(&eu, &mut digest).digest(eu.clock.now_ms());
        // Used in several intervals, the key gets its forecast, and a decision is quiet: the
        // tick after it has nothing to send.
        let quiet = (0..20).any(|_| {
            check();
            let sent = tick(&mut digest);
            std::thread::sleep(std::time::Duration::from_millis(21));
            sent == 0
        });
        assert!(quiet, "no decision of the key was quiet");
        let now = eu.clock.now_ms();
        let before = NodeStates::new(&eu, &mut digest).digest(now);
        // A rebuild: the digest is what the peers hold.
        let rebuilt = NodeStates::new(&eu, &mut digest).digest(now + DIGEST_REBUILD_MS);
        assert!(before == rebuilt, "the rebuild counted the unsent write");
        // And the key went out with the next listing for later.
        let mut states = NodeStates::new(&eu, &mut digest);
        states.join_later();
        let sent = states.drain_deltas(usize::MAX);
        assert_eq!(sent.len(), 1, "the quiet key was not listed for later");
        drop(states);
        // Sent, it is recorded as it is now: the next rebuild agrees with the incremental one.
        let after = NodeStates::new(&eu, &mut digest).digest(now + DIGEST_REBUILD_MS);
        let rebuilt = NodeStates::new(&eu, &mut digest).digest(now + 2 * DIGEST_REBUILD_MS);
        assert!(after == rebuilt);
        assert!(after != before, "the write never reached the digest");
    }

    /// `cluster.local_first`: a region-mate deciding a light key of a large bucket from the
    /// rights it holds (`Limiter::check_if_held`) spends quietly, as the owner does: once the
    /// key has its forecast and the mate its floor of units, a decision lists nothing, and the
    /// interval after it sends nothing. (The store listed every such decision, and the mate
    /// held two units, so each took its sub-bucket half empty: every decision was sent.)
    #[test]
    fn a_mate_deciding_where_it_holds_rights_spends_quietly() {
        let text = |id: &str| {
            format!(
                "[node]\nid = \"{id}\"\nregion = \"eu\"\nmax_keys = 100\n\n\
                 [cluster]\nregions = {{ eu = 1 }}\nlocal_first = true\n\
                 tls = {{ ca = \"ca.pem\", cert = \"n.pem\", key = \"n.key\" }}\n\
                 [[cluster.node]]\nid = \"eu-1\"\nregion = \"eu\"\naddr = \"127.0.0.1:9001\"\n\
                 [[cluster.node]]\nid = \"eu-2\"\nregion = \"eu\"\naddr = \"127.0.0.1:9002\"\n\n\
                 [[rule]]\nname = \"tb\"\nalgorithm = \"token_bucket\"\nrate = 1000000\n\
                 per = \"1s\"\nburst = 1000000\n"
            )
        };
        let node = |id: &str| {
            let config = Config::parse(&text(id), "t.toml").expect("a valid configuration");
            let l = Limiter::new(&config, Clock::default());
            l.store().track_changes();
            l
        };
        let nodes = [node("eu-1"), node("eu-2")];
        let replicas = nodes[0].rules().replicas.clone();
        let (hears, clock_of) = (|_| true, |_| None);
        let mut digests = [NodeDigest::default(), NodeDigest::default()];
        // Every interval below rebalances with eu-1 as the key's owner.
        let key = "k";
        // An interval at both nodes: listed keys rebalanced (with their own demand), drained,
        // and merged at the other; what each sent.
        let mut tick = || {
            let mut sent = [0; 2];
            for (i, n) in nodes.iter().enumerate() {
                let now = n.clock.now_ms();
                let ctx = levee_core::RebalanceCtx {
                    now,
                    me: levee_core::NodeIdx(i as u16),
                    replicas: &replicas,
                    view: n.view(),
                    owner: levee_core::NodeIdx(0),
                    max_in_flight: 1_000_000,
                    inherit_from: None,
                    hears: &hears,
                    clock_of: &clock_of,
                    started: 0,
                    own_demand: true,
                };
                let mut states = NodeStates::new(n, &mut digests[i]);
                states.update_active(&mut |_, state, target| {
                    state.rebalance(target, &ctx);
                });
                let deltas = states.drain_deltas(usize::MAX);
                drop(states);
                sent[i] = deltas.len();
                let other = &nodes[1 - i];
                let mut into = NodeStates::new(other, &mut digests[1 - i]);
                for (id, crdt) in deltas {
                    into.merge(&id, &crdt, other.clock.now_ms())
                        .expect("merged");
                }
            }
            sent
        };
        let mut quiet = false;
        for _ in 0..40 {
            let here = nodes[1]
                .check_if_held(CheckRef::of("tb", key, 1))
                .expect("a valid check");
            if here.is_none() {
                // Sent on: the owner decides it.
                nodes[0]
                    .check(CheckRef::of("tb", key, 1))
                    .expect("a valid check");
            }
            let sent = tick();
            if here.is_some() && sent == [0, 0] {
                quiet = true;
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(21));
            tick();
        }
        assert!(quiet, "no decision at the mate was quiet");
    }

    /// A key reset (removed from the store) after it was listed as changed is not sent, nor
    /// created again, by the next tick, though the eviction pool still holds its entry; a
    /// key charged again after its reset is.
    #[test]
    fn a_key_reset_after_it_changed_is_not_sent() {
        let eu = node("eu-1", 100);
        eu.store().track_changes();
        charge(&eu, "gone", 3);
        charge(&eu, "kept", 2);
        assert!(eu.reset("q", "gone").expect("reset"));
        let mut digest = NodeDigest::default();
        let sent: Vec<Vec<u8>> = NodeStates::new(&eu, &mut digest)
            .drain_deltas(usize::MAX)
            .into_iter()
            .map(|(id, _)| id)
            .collect();
        let mut kept = Vec::new();
        encode_id(&mut kept, "q", None, "kept");
        assert_eq!(sent, vec![kept]);
        assert_eq!(eu.store().len(), 1);
        charge(&eu, "gone", 1);
        let sent = NodeStates::new(&eu, &mut digest).drain_deltas(usize::MAX);
        assert_eq!(sent.len(), 1);
        assert_eq!(eu.usage("q", "gone", None).expect("usage").usage.used, 1);
    }

    /// A merge the store refuses (here: a state naming a node this node's list does not
    /// have) creates no key, so it evicts none from a full store and lists nothing.
    #[test]
    fn a_refused_merge_of_a_new_key_leaves_nothing_and_evicts_nothing() {
        let eu = node("eu-1", 3);
        eu.store().track_changes();
        for k in ["a", "b", "c"] {
            charge(&eu, k, 1);
        }
        let mut digest = NodeDigest::default();
        assert_eq!(
            NodeStates::new(&eu, &mut digest)
                .drain_deltas(usize::MAX)
                .len(),
            3
        );
        // A node of a longer list (a third node, position 2) charges a key eu-1 has not seen.
        let text = "[node]\nid = \"ap-1\"\nregion = \"ap\"\n\n\
             [cluster]\nregions = { eu = 1, us = 1, ap = 1 }\n\
             tls = { ca = \"ca.pem\", cert = \"n.pem\", key = \"n.key\" }\n\
             [[cluster.node]]\nid = \"eu-1\"\nregion = \"eu\"\naddr = \"127.0.0.1:9001\"\n\
             [[cluster.node]]\nid = \"us-1\"\nregion = \"us\"\naddr = \"127.0.0.1:9002\"\n\
             [[cluster.node]]\nid = \"ap-1\"\nregion = \"ap\"\naddr = \"127.0.0.1:9003\"\n\n\
             [[rule]]\nname = \"q\"\nalgorithm = \"quota\"\nlimit = 1000\nperiod = \"month\"\n";
        let ap = Limiter::new(
            &Config::parse(text, "t.toml").expect("valid"),
            Clock::default(),
        );
        ap.store().track_changes();
        charge(&ap, "new", 1);
        let mut d = NodeDigest::default();
        let deltas = NodeStates::new(&ap, &mut d).drain_deltas(usize::MAX);
        assert_eq!(deltas.len(), 1);
        let now = eu.clock.now_ms();
        let mut into = NodeStates::new(&eu, &mut digest);
        for (id, crdt) in &deltas {
            assert!(
                into.merge(id, crdt, now).is_err(),
                "a state naming node 2 merged"
            );
        }
        drop(into);
        assert_eq!(eu.store().len(), 3);
        assert_eq!(
            eu.store().evictions(),
            0,
            "a refused key evicted a held one"
        );
        let mut id = Vec::new();
        encode_id(&mut id, "q", None, "new");
        assert!(
            eu.store().peek(&id, |_| ()).is_none(),
            "the refused key was created"
        );
        for k in ["a", "b", "c"] {
            assert_eq!(eu.usage("q", k, None).expect("usage").usage.used, 1);
        }
        assert!(
            NodeStates::new(&eu, &mut digest)
                .drain_deltas(usize::MAX)
                .is_empty()
        );
    }
}
