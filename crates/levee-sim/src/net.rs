//! The simulated network between nodes: a [`levee_testkit::Net`] whose links take their
//! regions' one-way latency plus the run's jitter, with the run's loss, duplication and
//! reordering, and with directed cuts between regions.
//!
//! A cut drops a message when it is sent and also when it arrives, so whatever was on the
//! wire when a link went down is lost with it. Delivery is in order of arrival time, then of
//! sending, so a run is deterministic; every random decision is drawn from the generator
//! the network is given, in the order `levee_testkit::net` documents.

use levee_testkit::net::{Latency, Net};
use levee_testkit::rng::SeededRng;

use crate::plan::{NetParams, Topology};

/// What the network did, for the run's report.
pub use levee_testkit::net::NetStats;

/// A message as delivered.
#[derive(Debug)]
pub struct InFlight<P> {
    /// When it arrives (sim ms).
    pub at: u64,
    /// When it was sent (sim ms).
    pub sent: u64,
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

/// What rides on the wire beside the payload.
#[derive(Debug, Clone)]
struct Carried<P> {
    incarnation: u32,
    payload: P,
}

/// QUIC's default `max_ack_delay` (quinn's too): part of a retransmission's delay.
const QUIC_MAX_ACK_DELAY_MS: u64 = 25;

/// The network of one run.
pub struct SimNet<P> {
    net: Net<Carried<P>>,
    /// The regions' base one-way latencies, and each endpoint's region.
    one_way_ms: Vec<Vec<u64>>,
    region_of: Vec<usize>,
    /// The endpoints of every region.
    members: Vec<Vec<usize>>,
    region_cut: Vec<Vec<bool>>,
    /// Counters (the inner network's, as of the last send or delivery).
    pub stats: NetStats,
}

impl<P: Clone> SimNet<P> {
    /// A network between endpoints located in regions `region_of[i]`.
    pub fn new(
        topology: &Topology,
        params: NetParams,
        region_of: Vec<usize>,
        rng: SeededRng,
    ) -> Self {
        let r = topology.regions();
        let mut net = Net::new(region_of.len(), rng);
        for (a, &ra) in region_of.iter().enumerate() {
            for (b, &rb) in region_of.iter().enumerate() {
                let base = topology.one_way_ms[ra][rb];
                net.set_link_latency(a, b, Latency::jittered(base, params.jitter_ms));
            }
        }
        net.set_loss(params.loss);
        net.set_duplicate(params.duplicate);
        net.set_reorder(params.reorder, params.reorder_ms);
        let mut members = vec![Vec::new(); r];
        for (n, &reg) in region_of.iter().enumerate() {
            members[reg].push(n);
        }
        SimNet {
            net,
            one_way_ms: topology.one_way_ms.clone(),
            region_of,
            members,
            region_cut: vec![vec![false; r]; r],
            stats: NetStats::default(),
        }
    }

    /// Cuts or mends the link from region `from` to region `to`.
    pub fn set_cut(&mut self, from: usize, to: usize, cut: bool) {
        self.region_cut[from][to] = cut;
        for &a in &self.members[from] {
            for &b in &self.members[to] {
                if cut {
                    self.net.cut(a, b);
                } else {
                    self.net.mend(a, b);
                }
            }
        }
    }

    /// Whether the link from region `from` to region `to` is cut now.
    pub fn region_cut(&self, from: usize, to: usize) -> bool {
        self.region_cut[from][to]
    }

    /// Whether messages from endpoint `from` to endpoint `to` are dropped now.
    pub fn is_cut(&self, from: usize, to: usize) -> bool {
        self.net.is_cut(from, to)
    }

    /// Puts a message on the wire at `now`, unless the link is cut or the message is lost;
    /// sometimes twice.
    pub fn send(&mut self, now: u64, from: usize, to: usize, incarnation: u32, payload: P) {
        self.send_on(now, from, to, incarnation, payload, false);
    }

    /// [`SimNet::send`]; a `reliable` message is one whose loss production's transport
    /// repairs (it travels on a QUIC stream): lost at random, it arrives one retransmission
    /// timeout late instead (QUIC's probe timeout for a first loss: about 3 round trips of
    /// the link plus the peer's 25 ms acknowledgement delay), and it is never duplicated; a
    /// cut still drops it.
    pub fn send_on(
        &mut self,
        now: u64,
        from: usize,
        to: usize,
        incarnation: u32,
        payload: P,
        reliable: bool,
    ) {
        self.net.advance_to(now);
        let carried = Carried {
            incarnation,
            payload,
        };
        if reliable {
            let rtt = 2 * self.one_way_ms[self.region_of[from]][self.region_of[to]];
            self.net
                .send_reliable(from, to, carried, 3 * rtt + QUIC_MAX_ACK_DELAY_MS);
        } else {
            self.net.send(from, to, carried);
        }
        self.stats = self.net.stats();
    }

    /// The next message due at or before `now` whose link is not cut; messages on a cut
    /// link are dropped on the way.
    pub fn pop_due(&mut self, now: u64) -> Option<InFlight<P>> {
        self.net.advance_to(now);
        let m = self.net.pop_due();
        self.stats = self.net.stats();
        let m = m?;
        Some(InFlight {
            at: m.at,
            sent: m.sent,
            from: m.from,
            to: m.to,
            incarnation: m.msg.incarnation,
            payload: m.msg.payload,
        })
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
        let mut net = SimNet::new(&topo(), NetParams::default(), vec![0, 1], SeededRng::new(1));
        net.send(0, 0, 1, 0, "a");
        net.send(1, 0, 1, 0, "b");
        assert!(net.pop_due(49).is_none());
        assert_eq!(net.pop_due(50).unwrap().payload, "a");
        assert!(net.pop_due(50).is_none());
        assert_eq!(net.pop_due(51).unwrap().payload, "b");
    }

    #[test]
    fn a_cut_drops_what_is_sent_and_what_is_on_the_wire() {
        let mut net = SimNet::new(&topo(), NetParams::default(), vec![0, 1], SeededRng::new(1));
        net.send(0, 0, 1, 0, "on the wire");
        net.set_cut(0, 1, true);
        net.send(1, 0, 1, 0, "sent into the cut");
        net.send(1, 1, 0, 0, "the other way");
        assert_eq!(net.pop_due(100).unwrap().payload, "the other way");
        assert!(net.pop_due(100).is_none());
        assert_eq!(net.stats.cut, 2);
    }
}
