//! Replicating per-key overrides (API.md "Per-key overrides, allow and deny lists"): each
//! (rule, key) is a last-writer-wins register ([`levee_core::OverrideReg`]) that every node
//! of every region holds whole, so any node decides with it.
//!
//! * At the end of every gossip interval, the registers this node took or wrote since the
//!   last one go to every peer (all regions), in [`Message::Overrides`] of at most
//!   [`MAX_OVERRIDES_PER_MESSAGE`].
//! * A peer heard again after a silence (a start, a healed cut) gets every register at once.
//! * Anti-entropy: every `anti_entropy_interval`, a node holding registers sends a
//!   [`Message::OverrideDigest`] (the XOR of every register's [`override_hash`]) to every
//!   reachable peer; a peer whose own digest differs sends all of its registers back, or, if
//!   it holds none, its empty digest, which the sender answers with all of its registers.
//!   Both sides digest, so each side's newer writes reach the other; registers merge by last
//!   writer wins, so the order in which they arrive does not matter. A cluster without
//!   overrides sends none of these messages.
//!
//! The registers live in the caller's store ([`KeyStates::take_overrides`] …); this file only
//! decides when they travel.

use levee_core::hash::Fnv1a;
use levee_core::{Millis, NodeIdx, OverrideValue};
use levee_proto::{MAX_OVERRIDES_PER_MESSAGE, Message, OverrideEntry};

use super::Cluster;
use crate::store::KeyStates;

/// When the next override digest goes out.
#[derive(Debug, Clone, Default)]
pub(crate) struct OverrideSync {
    next_digest: Millis,
}

/// A register's hash, for the override digest: the same on every node for the same write.
pub fn override_hash(e: &OverrideEntry) -> u64 {
    let mut h = Fnv1a::new();
    h.write(e.rule.as_bytes());
    h.write(&[0]);
    h.write(e.key.as_bytes());
    h.write(&[0]);
    h.write(e.reg.writer.as_bytes());
    h.write(&[0]);
    h.write_u64(e.reg.written_at);
    h.write_u64(e.reg.expires_at.map_or(u64::MAX, |t| t));
    let (kind, a, b) = match e.reg.value {
        None => (0, 0, 0),
        Some(OverrideValue::Limit(l)) => (1, l, 0),
        Some(OverrideValue::Rate { rate, burst }) => (2, rate, burst),
        Some(OverrideValue::Allow) => (3, 0, 0),
        Some(OverrideValue::Deny) => (4, 0, 0),
    };
    h.write_u64(kind);
    h.write_u64(a);
    h.write_u64(b);
    h.finish()
}

impl Cluster {
    /// The end of a gossip interval: the registers changed since the last one to every peer,
    /// and, every `anti_entropy_interval`, the digest to every reachable peer.
    pub(super) fn gossip_overrides(&mut self, now: Millis, store: &mut dyn KeyStates) {
        let changed = store.take_overrides();
        let peers = self.peers();
        if !changed.is_empty() {
            for &p in &peers {
                self.send_overrides(p, &changed, now);
            }
        }
        if now >= self.overrides.next_digest {
            self.overrides.next_digest = now + self.cfg.anti_entropy_interval;
            let hash = store.overrides_digest();
            // A node without overrides sends no digest (a cluster that uses none exchanges
            // nothing more); it answers one that differs with its own, so the sender pushes.
            let peers = if hash == 0 { Vec::new() } else { peers };
            for p in peers {
                if self.membership.is_reachable(p) {
                    self.send(p, Message::OverrideDigest { hash }, now);
                }
            }
        }
    }

    /// Every register, to `to` (heard again after a silence, or whose digest differs).
    pub(super) fn push_all_overrides(
        &mut self,
        to: NodeIdx,
        now: Millis,
        store: &mut dyn KeyStates,
    ) {
        let all = store.all_overrides();
        self.send_overrides(to, &all, now);
    }

    fn send_overrides(&mut self, to: NodeIdx, entries: &[OverrideEntry], now: Millis) {
        for chunk in entries.chunks(MAX_OVERRIDES_PER_MESSAGE) {
            self.send(to, Message::Overrides(chunk.to_vec()), now);
        }
    }

    /// An override message from `from`: registers to merge (refused whole when over the
    /// bounds), or a digest to compare with ours.
    pub(super) fn receive_overrides(
        &mut self,
        from: NodeIdx,
        msg: Message,
        now: Millis,
        store: &mut dyn KeyStates,
    ) {
        match msg {
            Message::Overrides(entries)
                if entries.len() > MAX_OVERRIDES_PER_MESSAGE
                    || !entries.iter().all(OverrideEntry::within_bounds) =>
            {
                self.refused += 1;
            }
            Message::Overrides(entries) => {
                store.merge_overrides(entries);
            }
            Message::OverrideDigest { hash } => {
                let mine = store.overrides_digest();
                if hash != mine && mine == 0 {
                    // Nothing here: ask for everything by saying so.
                    self.send(from, Message::OverrideDigest { hash: 0 }, now);
                } else if hash != mine {
                    self.push_all_overrides(from, now, store);
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use levee_core::{KeyCrdt, KeyState, OverrideReg, ReplicaSet, ReplicaSpec, Target};

    use super::*;
    use crate::machine::ClusterConfig;
    use crate::store::Refused;

    /// A store holding only override registers, merged by last writer wins.
    #[derive(Default)]
    struct Regs {
        held: BTreeMap<(String, String), OverrideReg>,
        changed: Vec<OverrideEntry>,
    }

    impl KeyStates for Regs {
        fn drain_deltas(&mut self, _: usize) -> Vec<(Vec<u8>, KeyCrdt)> {
            Vec::new()
        }
        fn merge(&mut self, _: &[u8], _: &KeyCrdt, _: Millis) -> Result<(), Refused> {
            Ok(())
        }
        fn for_each(&self, _: Millis, _: &mut dyn FnMut(&[u8], &KeyCrdt, u64)) {}
        fn get(&self, _: &[u8]) -> Option<KeyCrdt> {
            None
        }
        fn digest(&mut self, _: Millis) -> Vec<u64> {
            vec![0; crate::DIGEST_BUCKETS as usize]
        }
        fn update_active(&mut self, _: &mut dyn FnMut(&[u8], &mut KeyState, &Target<'_>)) {}
        fn listed_now(&mut self) -> usize {
            0
        }
        fn join_later(&mut self) {}
        fn activate_all(&mut self) {}
        fn take_overrides(&mut self) -> Vec<OverrideEntry> {
            std::mem::take(&mut self.changed)
        }
        fn all_overrides(&self) -> Vec<OverrideEntry> {
            self.held
                .iter()
                .map(|((rule, key), reg)| OverrideEntry {
                    rule: rule.clone(),
                    key: key.clone(),
                    reg: reg.clone(),
                })
                .collect()
        }
        fn overrides_digest(&self) -> u64 {
            self.all_overrides()
                .iter()
                .fold(0, |a, e| a ^ override_hash(e))
        }
        fn merge_overrides(&mut self, entries: Vec<OverrideEntry>) -> usize {
            let mut n = 0;
            for e in entries {
                let k = (e.rule.clone(), e.key.clone());
                if self.held.get(&k).is_none_or(|h| e.reg.wins_over(h)) {
                    self.held.insert(k, e.reg);
                    n += 1;
                }
            }
            n
        }
    }

    fn pair() -> (Cluster, Cluster) {
        let nodes = ["eu-1", "us-1"].map(|id| ReplicaSpec {
            id: id.into(),
            region: id[..2].into(),
            weight: None,
        });
        let weights = vec![("eu".to_owned(), 1), ("us".to_owned(), 1)];
        let replicas = ReplicaSet::new(&weights, &nodes).unwrap();
        let machine = |me| {
            Cluster::new(
                ClusterConfig {
                    me,
                    replicas: replicas.clone(),
                    gossip_interval: 10,
                    suspect_after: 300,
                    anti_entropy_interval: 100,
                    forward_timeout: 500,
                    tick_phase: 0,
                    topology: Default::default(),
                },
                1_000,
            )
        };
        (machine(NodeIdx(0)), machine(NodeIdx(1)))
    }

    fn entry(key: &str, at: Millis, value: Option<OverrideValue>) -> OverrideEntry {
        OverrideEntry {
            rule: "r".into(),
            key: key.into(),
            reg: OverrideReg {
                value,
                expires_at: None,
                written_at: at,
                writer: "eu-1".into(),
            },
        }
    }

    /// Delivers everything `from` queued to `to`.
    fn deliver(from: &mut Cluster, to: &mut Cluster, store: &mut Regs, now: Millis) {
        let me = from.me();
        while let Some(o) = from.poll_transmit() {
            if o.to == to.me() {
                to.handle_message(me, o.msg, now, store);
            }
        }
    }

    #[test]
    fn a_write_reaches_the_peer_and_a_digest_repairs_what_was_lost() {
        let (mut a, mut b) = (pair().0, pair().1);
        let (mut sa, mut sb) = (Regs::default(), Regs::default());
        let e = entry("k", 1_000, Some(OverrideValue::Limit(7)));
        sa.merge_overrides(vec![e.clone()]);
        sa.changed.push(e);
        a.handle_timeout(1_010, &mut sa);
        deliver(&mut a, &mut b, &mut sb, 1_011);
        assert_eq!(sb.all_overrides(), sa.all_overrides());
        // A deletion whose gossip is lost: the next digest repairs it.
        let gone = entry("k", 1_020, None);
        sa.merge_overrides(vec![gone]);
        a.handle_timeout(1_030, &mut sa);
        while a.poll_transmit().is_some() {}
        assert_ne!(sb.overrides_digest(), sa.overrides_digest());
        b.handle_timeout(1_200, &mut sb);
        deliver(&mut b, &mut a, &mut sa, 1_201);
        deliver(&mut a, &mut b, &mut sb, 1_202);
        assert_eq!(sb.all_overrides(), sa.all_overrides());
        assert_eq!(sb.held[&("r".into(), "k".into())].value, None);
    }

    #[test]
    fn a_node_without_overrides_gets_them_through_the_digest_and_sends_no_digest_itself() {
        let (mut a, mut b) = (pair().0, pair().1);
        let (mut sa, mut sb) = (Regs::default(), Regs::default());
        b.handle_timeout(1_010, &mut sb);
        let sent: Vec<Message> = std::iter::from_fn(|| b.poll_transmit())
            .map(|o| o.msg)
            .collect();
        assert!(
            !sent
                .iter()
                .any(|m| matches!(m, Message::OverrideDigest { .. })),
            "{sent:?}"
        );
        // `a` holds one (its gossip of it lost); its digest brings it to `b`.
        sa.merge_overrides(vec![entry("k", 1_000, Some(OverrideValue::Deny))]);
        a.handle_timeout(1_010, &mut sa);
        deliver(&mut a, &mut b, &mut sb, 1_011);
        deliver(&mut b, &mut a, &mut sa, 1_012);
        deliver(&mut a, &mut b, &mut sb, 1_013);
        assert_eq!(sb.all_overrides(), sa.all_overrides());
    }

    #[test]
    fn too_many_or_too_long_entries_are_refused_whole() {
        let (mut a, _) = pair();
        let mut s = Regs::default();
        let many = vec![entry("k", 1, Some(OverrideValue::Allow)); MAX_OVERRIDES_PER_MESSAGE + 1];
        a.handle_message(NodeIdx(1), Message::Overrides(many), 1_000, &mut s);
        let long = vec![entry(&"k".repeat(513), 1, Some(OverrideValue::Allow))];
        a.handle_message(NodeIdx(1), Message::Overrides(long), 1_000, &mut s);
        assert_eq!(a.refused(), 2);
        assert!(s.held.is_empty());
    }
}
