//! Who talks to whom every gossip interval: every peer ([`Topology::Mesh`]), or region-mates
//! plus one gateway per other region ([`Topology::Regions`]), with what a gateway hears
//! relayed to its region-mates.
//!
//! With regional gossip a node sends its deltas and heartbeats to
//!
//! * every node of its own region (so a node that takes a key over already has its state);
//! * one node of each other region, its *gateway* there: by default the node at its own
//!   position in its region modulo the other region's size, kept while it is heard, replaced
//!   by the next reachable one (or, if none is, tried in turn, one per `suspect_after`) when
//!   it is not;
//! * every node of another region that chose it as its gateway (that sent it a
//!   [`Message::Heard`] within `suspect_after`).
//!
//! A gateway relays to its region-mates, with its own deltas at the end of its interval, the
//! entries it merged from other regions' deltas (as they came), and tells them every `suspect_after / 4` which nodes it
//! hears directly ([`Message::Heard`]): every node knows every node's liveness without
//! talking to it. A node's messages per interval grow with its region's size plus the number
//! of regions, not with the number of nodes: `(n − 1) + (R − 1)` links, plus the nodes that
//! chose it (about `R − 1` when regions have equal sizes), against `N − 1` for the mesh.

use levee_core::{Millis, NodeIdx, RegionIdx};
use levee_proto::{HeardEntry, KeyEntry, Message};

use super::Cluster;
use crate::peer::batch;

/// Who a node gossips with every interval.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Topology {
    /// Every node sends every other node its deltas and a heartbeat every interval:
    /// `N − 1` messages per node and interval.
    #[default]
    Mesh,
    /// Region-mates, plus one gateway per other region that relays to its own region-mates:
    /// `(n − 1) + (R − 1)` links per node (see the module's documentation).
    Regions,
}

/// When each node last did something, by node index (grown as nodes are seen).
#[derive(Debug, Clone, Default)]
pub(super) struct LastSeen(Vec<Option<Millis>>);

impl LastSeen {
    /// Records `p` now.
    fn set(&mut self, p: NodeIdx, now: Millis) {
        let i = usize::from(p.0);
        if self.0.len() <= i {
            self.0.resize(i + 1, None);
        }
        self.0[i] = Some(now);
    }

    /// Whether `p` was recorded within `span` of `now`.
    fn within(&self, p: NodeIdx, now: Millis, span: Millis) -> bool {
        let at = self.0.get(usize::from(p.0)).copied().flatten();
        at.is_some_and(|t| now.saturating_sub(t) <= span)
    }

    /// Whether any node was recorded within `span` of `now`.
    fn any_within(&self, now: Millis, span: Millis) -> bool {
        self.0
            .iter()
            .flatten()
            .any(|&t| now.saturating_sub(t) <= span)
    }
}

/// Per other region, the node chosen as gateway there and when it was chosen.
#[derive(Debug, Clone, Default)]
pub(super) struct Gateways {
    chosen: Vec<Option<(NodeIdx, Millis)>>,
    /// When each remote node last said it chose this node (a [`Message::Heard`] from it
    /// with `gateway`).
    chose_me: LastSeen,
    /// When each node last sent this node any [`Message::Heard`]: it gossips by regions. A
    /// node of another region that sends deltas but no `Heard` gossips as a mesh, and is
    /// answered as a mesh node would.
    regional: LastSeen,
    /// When each node last sent this node a `Deltas` batch (a mesh node sends one every
    /// interval; a regional node only to the peers it gossips with).
    batches: LastSeen,
    /// When region-mates and gateways were last told what this node hears.
    next_heard: Millis,
    /// Entries merged from another region's deltas since the last interval, as received,
    /// with their sender: relayed to region-mates with this node's own deltas if the sender
    /// gossips by regions (bounded by what arrives in an interval; the frames that brought
    /// them are bounded).
    pub(super) relay: Vec<(NodeIdx, KeyEntry)>,
    /// The peers gossiped with at the last interval's end (or flush).
    pub(super) links: Vec<NodeIdx>,
}

impl Cluster {
    /// The peers this node sends its deltas and heartbeats to this interval (remembered for
    /// [`Cluster::acknowledged_since`]).
    pub(super) fn links(&mut self, now: Millis) -> Vec<NodeIdx> {
        let links = self.choose_links(now);
        self.gateways.links.clone_from(&links);
        links
    }

    fn choose_links(&mut self, now: Millis) -> Vec<NodeIdx> {
        let peers = self.peers();
        if self.cfg.topology == Topology::Mesh {
            return peers;
        }
        let replicas = &self.cfg.replicas;
        let mine = replicas.region_of(self.cfg.me);
        let span = self.cfg.suspect_after;
        let fresh = |v: &LastSeen, p: NodeIdx| v.within(p, now, span);
        let g = &self.gateways;
        let mut out: Vec<NodeIdx> = peers
            .iter()
            .copied()
            .filter(|&p| {
                replicas.region_of(p) == mine
                    || fresh(&g.chose_me, p)
                    || (fresh(&g.batches, p) && !fresh(&g.regional, p))
            })
            .collect();
        let regions: Vec<RegionIdx> = replicas.regions().filter(|&r| r != mine).collect();
        for r in regions {
            if let Some(g) = self.gateway(r, now) {
                out.push(g);
            }
        }
        out.sort_unstable();
        out.dedup();
        out
    }

    /// This node's gateway in region `r` (see the module's documentation), if it has live
    /// nodes.
    fn gateway(&mut self, r: RegionIdx, now: Millis) -> Option<NodeIdx> {
        let replicas = &self.cfg.replicas;
        let me = self.cfg.me;
        let live = |n: &&NodeIdx| !replicas.is_removed(**n);
        let candidates: Vec<NodeIdx> = replicas
            .region_nodes(r)
            .iter()
            .filter(live)
            .copied()
            .collect();
        if candidates.is_empty() {
            return None;
        }
        let mine: Vec<NodeIdx> = replicas
            .region_nodes(replicas.region_of(me))
            .iter()
            .filter(live)
            .copied()
            .collect();
        let my_pos = mine.iter().position(|&n| n == me).unwrap_or(0);
        let ri = usize::from(r.0);
        if self.gateways.chosen.len() <= ri {
            self.gateways.chosen.resize(ri + 1, None);
        }
        let m = &self.membership;
        let current = self.gateways.chosen[ri].filter(|(g, _)| candidates.contains(g));
        // Kept while it is heard and acknowledges what it is sent (a link cut one way is no
        // gateway), or for `suspect_after` after it was chosen, to give it time to answer.
        let deaf_after = self.deaf_after();
        let healthy = |g: NodeIdx| {
            let acked = self.peer[usize::from(g.0)].acked_ms;
            m.hears_directly(g) && acked > 0 && now.saturating_sub(acked) <= deaf_after
        };
        if let Some((g, at)) = current
            && (healthy(g) || now.saturating_sub(at) <= self.cfg.suspect_after)
        {
            return Some(g);
        }
        // The first live one from this node's own position on other than the current one
        // (alive by its region-mates' word, yet not answering this node: a link cut one way),
        // else (nobody known to be alive: a partition, a region starting) the one after the
        // current one: each is tried for `suspect_after`.
        let start = my_pos % candidates.len();
        let ring = (0..candidates.len()).map(|k| candidates[(start + k) % candidates.len()]);
        let failed = current.map(|(g, _)| g);
        let alive = ring
            .clone()
            .find(|&n| Some(n) != failed && m.is_reachable(n));
        let next = alive.unwrap_or_else(|| match current {
            Some((g, _)) => {
                let at = candidates.iter().position(|&n| n == g).unwrap_or(0);
                candidates[(at + 1) % candidates.len()]
            }
            None => candidates[start],
        });
        self.gateways.chosen[ri] = Some((next, now));
        Some(next)
    }

    /// Every `suspect_after / 4`: tells every peer it gossips with which nodes it hears
    /// directly (and its gateways that they are; a mesh node, only in a cluster where some
    /// node gossips by regions); and every interval, a gateway chosen just
    /// now or that does not acknowledge this node (its word may have been lost: a cut that
    /// just healed) is told at once.
    /// Whether this node or a peer heard within `suspect_after` gossips by regions.
    pub(super) fn regional_in_play(&self, now: Millis) -> bool {
        self.cfg.topology == Topology::Regions
            || self
                .gateways
                .regional
                .any_within(now, self.cfg.suspect_after)
    }

    pub(super) fn send_heard(&mut self, links: &[NodeIdx], now: Millis) {
        // A mesh node says it only while some peer gossips by regions (a rolling change of
        // the setting): those peers learn from it who is alive. A mesh cluster sends none.
        if !self.regional_in_play(now) {
            return;
        }
        let deaf_after = self.deaf_after();
        let gateways: Vec<(NodeIdx, Millis)> =
            self.gateways.chosen.iter().flatten().copied().collect();
        let everyone = now >= self.gateways.next_heard;
        let to: Vec<NodeIdx> = if everyone {
            self.gateways.next_heard =
                now + (self.cfg.suspect_after / 4).max(self.cfg.gossip_interval);
            links.to_vec()
        } else {
            gateways
                .iter()
                .filter(|&&(g, at)| {
                    let acked = self.peer[usize::from(g.0)].acked_ms;
                    at == now || now.saturating_sub(acked) > deaf_after
                })
                .map(|&(g, _)| g)
                .collect()
        };
        if to.is_empty() {
            return;
        }
        let m = &self.membership;
        let nodes: Vec<HeardEntry> = self
            .peers()
            .into_iter()
            .filter(|&p| m.hears_directly(p))
            .filter_map(|p| {
                let at = m.last_heard_directly(p)?;
                Some(HeardEntry {
                    node: p.0,
                    age_ms: u32::try_from(now.saturating_sub(at)).unwrap_or(u32::MAX),
                })
            })
            .collect();
        for p in to {
            let gateway = gateways.iter().any(|&(g, _)| g == p);
            let msg = Message::Heard {
                gateway,
                nodes: nodes.clone(),
            };
            self.send(p, msg, now);
        }
    }

    /// A [`Message::Heard`] from `from`: the nodes it names are alive as of then, `from`
    /// gossips by regions, and with `gateway` it chose this node as its gateway.
    pub(super) fn receive_heard(
        &mut self,
        from: NodeIdx,
        gateway: bool,
        heard: &[HeardEntry],
        now: Millis,
    ) {
        if heard.len() > levee_core::MAX_NODES {
            self.refused += 1;
            return;
        }
        self.gateways.regional.set(from, now);
        let replicas = &self.cfg.replicas;
        let remote = replicas.region_of(from) != replicas.region_of(self.cfg.me);
        let n = replicas.len();
        if remote && gateway {
            let linked = self
                .gateways
                .chose_me
                .within(from, now, self.cfg.suspect_after);
            self.gateways.chose_me.set(from, now);
            if !linked {
                // Newly chosen (or chosen again after a cut): answer at once, so that it
                // sees what this node has received from it and pushes what it missed.
                self.send(from, Message::Deltas(batch(now, Vec::new())), now);
            }
        }
        let mut changes = Vec::new();
        for e in heard {
            let node = NodeIdx(e.node);
            if usize::from(e.node) >= n || node == from {
                continue;
            }
            let at = now.saturating_sub(Millis::from(e.age_ms));
            changes.extend(self.membership.heard_via(node, at, now));
        }
        self.apply(changes);
    }

    /// Whether what `from` sends may need relaying to this node's region-mates: with
    /// regional gossip, when `from` is of another region; gossiping as a mesh, when `from`
    /// chose this node as its gateway (a rolling change of the setting: a regional node may
    /// choose a mesh node, and its entries reach the rest of this region only through it).
    pub(super) fn relays_from(&self, from: NodeIdx, now: Millis) -> bool {
        let replicas = &self.cfg.replicas;
        replicas.region_of(from) != replicas.region_of(self.cfg.me)
            && (self.cfg.topology == Topology::Regions
                || self
                    .gateways
                    .chose_me
                    .within(from, now, self.cfg.suspect_after))
    }

    /// `from` sent this node a `Deltas` batch now.
    pub(super) fn note_batch(&mut self, from: NodeIdx, now: Millis) {
        self.gateways.batches.set(from, now);
    }

    /// The entries merged from other regions since the last interval, to relay: those of
    /// senders that gossip by regions (a `Heard` from them within `suspect_after`, which may
    /// have come just after their batch, or they chose this node); a mesh node sends every
    /// node its deltas itself.
    pub(super) fn take_relay(&mut self, now: Millis) -> Vec<KeyEntry> {
        let g = &mut self.gateways;
        let (regional, chose_me, span) = (&g.regional, &g.chose_me, self.cfg.suspect_after);
        std::mem::take(&mut g.relay)
            .into_iter()
            .filter(|(from, _)| {
                regional.within(*from, now, span) || chose_me.within(*from, now, span)
            })
            .map(|(_, k)| k)
            .collect()
    }
}
