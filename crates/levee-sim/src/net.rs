//! The simulated network between nodes: per-region-pair latency, jitter, loss, duplication,
//! reordering, and directed cuts between regions.
//!
//! A cut drops a message when it is sent and also when it arrives, so whatever was on the
//! wire when a link went down is lost with it. Delivery is in order of arrival time, then of
//! sending, so a run is deterministic.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use crate::plan::{NetParams, Topology};
use crate::rng::SimRng;

/// A message on the wire.
#[derive(Debug)]
pub struct InFlight<P> {
    /// When it arrives (sim ms).
    pub at: u64,
    /// When it was sent (sim ms).
    pub sent: u64,
    /// A value the sender attached for the simulator's own bookkeeping.
    pub tag: u64,
    seq: u64,
    /// Sending node (or region, for the region-level baselines).
    pub from: usize,
    /// Receiving node.
    pub to: usize,
    /// The receiver's incarnation when the message was sent: a node that restarted since
    /// has a new connection, and the message is lost with the old one.
    pub incarnation: u32,
    /// The payload (encoded frames for Levee).
    pub payload: P,
}

impl<P> PartialEq for InFlight<P> {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl<P> Eq for InFlight<P> {}
impl<P> PartialOrd for InFlight<P> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<P> Ord for InFlight<P> {
    fn cmp(&self, other: &Self) -> Ordering {
        // The earliest first in a max-heap.
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

/// What the network did, for the run's report.
#[derive(Debug, Clone, Copy, Default)]
pub struct NetStats {
    /// Messages handed to the network.
    pub sent: u64,
    /// Dropped by random loss.
    pub lost: u64,
    /// Dropped by a cut link (at sending or at arrival).
    pub cut: u64,
    /// Delivered twice.
    pub duplicated: u64,
    /// Delivered.
    pub delivered: u64,
}

/// The network of one run.
pub struct SimNet<P> {
    params: NetParams,
    one_way: Vec<Vec<u64>>,
    region_of: Vec<usize>,
    cut: Vec<Vec<bool>>,
    wire: BinaryHeap<InFlight<P>>,
    seq: u64,
    rng: SimRng,
    /// Counters.
    pub stats: NetStats,
}

impl<P: Clone> SimNet<P> {
    /// A network between endpoints located in regions `region_of[i]`.
    pub fn new(topology: &Topology, params: NetParams, region_of: Vec<usize>, rng: SimRng) -> Self {
        let r = topology.regions();
        SimNet {
            params,
            one_way: topology.one_way_ms.clone(),
            region_of,
            cut: vec![vec![false; r]; r],
            wire: BinaryHeap::new(),
            seq: 0,
            rng,
            stats: NetStats::default(),
        }
    }

    /// Cuts or mends the link from region `from` to region `to`.
    pub fn set_cut(&mut self, from: usize, to: usize, cut: bool) {
        self.cut[from][to] = cut;
    }

    /// Whether the link from region `from` to region `to` is cut now.
    pub fn region_cut(&self, from: usize, to: usize) -> bool {
        self.cut[from][to]
    }

    /// Whether messages from endpoint `from` to endpoint `to` are dropped now.
    pub fn is_cut(&self, from: usize, to: usize) -> bool {
        self.cut[self.region_of[from]][self.region_of[to]]
    }

    /// A one-way delay drawn for a message from `from` to `to`, or `None` if it is lost or
    /// the link is cut. (Used by the baselines for requests and answers.)
    pub fn delay(&mut self, from: usize, to: usize) -> Option<u64> {
        self.stats.sent += 1;
        if self.is_cut(from, to) {
            self.stats.cut += 1;
            return None;
        }
        if self.rng.chance(self.params.loss) {
            self.stats.lost += 1;
            return None;
        }
        Some(self.draw_delay(from, to))
    }

    fn draw_delay(&mut self, from: usize, to: usize) -> u64 {
        let base = self.one_way[self.region_of[from]][self.region_of[to]];
        let mut d = base + self.rng.range(0, self.params.jitter_ms);
        if self.rng.chance(self.params.reorder) {
            d += self.rng.range(1, self.params.reorder_ms.max(1));
        }
        d
    }

    /// Puts a message on the wire at `now`, unless the link is cut or the message is lost;
    /// sometimes twice.
    pub fn send(&mut self, now: u64, from: usize, to: usize, incarnation: u32, payload: P) {
        self.send_tagged(now, from, to, incarnation, 0, payload);
    }

    /// [`SimNet::send`], with a tag the receiver sees.
    pub fn send_tagged(
        &mut self,
        now: u64,
        from: usize,
        to: usize,
        incarnation: u32,
        tag: u64,
        payload: P,
    ) {
        self.stats.sent += 1;
        if self.is_cut(from, to) {
            self.stats.cut += 1;
            return;
        }
        if self.rng.chance(self.params.loss) {
            self.stats.lost += 1;
            return;
        }
        if self.rng.chance(self.params.duplicate) {
            self.stats.duplicated += 1;
            let at = now + self.draw_delay(from, to);
            self.push((now, at, tag), from, to, incarnation, payload.clone());
        }
        let at = now + self.draw_delay(from, to);
        self.push((now, at, tag), from, to, incarnation, payload);
    }

    fn push(
        &mut self,
        (sent, at, tag): (u64, u64, u64),
        from: usize,
        to: usize,
        incarnation: u32,
        payload: P,
    ) {
        self.seq += 1;
        self.wire.push(InFlight {
            at,
            sent,
            tag,
            seq: self.seq,
            from,
            to,
            incarnation,
            payload,
        });
    }

    /// The next message due at or before `now` whose link is not cut; messages on a cut
    /// link are dropped on the way.
    pub fn pop_due(&mut self, now: u64) -> Option<InFlight<P>> {
        while self.wire.peek().is_some_and(|m| m.at <= now) {
            let m = self.wire.pop()?;
            if self.is_cut(m.from, m.to) {
                self.stats.cut += 1;
                continue;
            }
            self.stats.delivered += 1;
            return Some(m);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topo() -> Topology {
        Topology {
            nodes_per_region: vec![1, 1],
            weights: vec![1, 1],
            one_way_ms: vec![vec![1, 50], vec![50, 1]],
        }
    }

    #[test]
    fn messages_arrive_after_the_one_way_delay_in_order() {
        let mut net = SimNet::new(&topo(), NetParams::default(), vec![0, 1], SimRng::new(1));
        net.send(0, 0, 1, 0, "a");
        net.send(1, 0, 1, 0, "b");
        assert!(net.pop_due(49).is_none());
        assert_eq!(net.pop_due(50).unwrap().payload, "a");
        assert!(net.pop_due(50).is_none());
        assert_eq!(net.pop_due(51).unwrap().payload, "b");
    }

    #[test]
    fn a_cut_drops_what_is_sent_and_what_is_on_the_wire() {
        let mut net = SimNet::new(&topo(), NetParams::default(), vec![0, 1], SimRng::new(1));
        net.send(0, 0, 1, 0, "on the wire");
        net.set_cut(0, 1, true);
        net.send(1, 0, 1, 0, "sent into the cut");
        net.send(1, 1, 0, 0, "the other way");
        assert_eq!(net.pop_due(100).unwrap().payload, "the other way");
        assert!(net.pop_due(100).is_none());
        assert_eq!(net.stats.cut, 2);
    }
}
