//! An in-process network between numbered endpoints, driven by a virtual clock.
//!
//! The network has *conditions*, which describe every link for the whole run (latency, loss,
//! duplication, reordering), and *faults*, which a test sets and clears as its scenario
//! goes (`cut`, `cut_both`, `isolate`, `drop`, and `mend`, `rejoin`, `recover` to undo them).
//! [`Net::recover`] clears every fault and keeps the conditions.
//!
//! How to drive it: [`Net::send`] puts a message on the wire at the current time;
//! [`Net::advance`] / [`Net::advance_to`] move the clock; [`Net::pop_due`] hands out, one by
//! one, the messages whose arrival time has come, in order of arrival time and then of
//! sending. Nothing happens between calls, so a run is a function of its calls and of the
//! seed of the [`SeededRng`] the network was given.
//!
//! What one `send` draws, in this order (a zero probability or an empty jitter draws
//! nothing, so a condition left unset does not shift the stream): loss; the link's `drop`
//! fault; duplication; then for each copy (the duplicate first) the jitter and, with the
//! reordering probability, how long it is held back.
//!
//! A cut drops a message when it is sent; by default it also drops the messages already on
//! the wire when they arrive over a link that is cut at that moment, as a broken connection
//! loses what it carried ([`InFlightOnCut`]).

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use crate::rng::SeededRng;

/// The one-way delay of a link: `base_ms`, plus a delay drawn uniformly from
/// `0..=jitter_ms` for every message.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Latency {
    /// The least delay, ms.
    pub base_ms: u64,
    /// The most extra delay drawn per message, ms (0: the delay is fixed).
    pub jitter_ms: u64,
}

impl Latency {
    /// Every message takes exactly `ms`.
    pub const fn fixed(ms: u64) -> Latency {
        Latency {
            base_ms: ms,
            jitter_ms: 0,
        }
    }

    /// Every message takes `base_ms` plus a uniform draw from `0..=jitter_ms`.
    pub const fn jittered(base_ms: u64, jitter_ms: u64) -> Latency {
        Latency { base_ms, jitter_ms }
    }
}

/// What happens to a message on the wire whose link is cut when it arrives.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum InFlightOnCut {
    /// It is lost with the link (counted as cut): the link is a connection that broke.
    #[default]
    Lost,
    /// It is delivered: only messages sent while the link is cut are dropped.
    Delivered,
}

/// A message on the wire, and as delivered.
#[derive(Debug)]
pub struct Envelope<M> {
    /// When it arrives (virtual ms).
    pub at: u64,
    /// When it was sent (virtual ms).
    pub sent: u64,
    /// The sending endpoint.
    pub from: usize,
    /// The receiving endpoint.
    pub to: usize,
    /// The message.
    pub msg: M,
    /// Sending order, to break ties between equal arrival times.
    seq: u64,
}

impl<M> PartialEq for Envelope<M> {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl<M> Eq for Envelope<M> {}
impl<M> PartialOrd for Envelope<M> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<M> Ord for Envelope<M> {
    fn cmp(&self, other: &Self) -> Ordering {
        // The earliest first in a max-heap.
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

/// What the network did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NetStats {
    /// Messages handed to the network (a duplicated message counts once).
    pub sent: u64,
    /// Dropped at random: the loss condition or a link's `drop` fault.
    pub lost: u64,
    /// Dropped by a cut link (when sent, or on arrival under [`InFlightOnCut::Lost`]).
    pub cut: u64,
    /// Put on the wire twice.
    pub duplicated: u64,
    /// Sent by [`Net::send_reliable`] and lost at random: delivered late, as a
    /// retransmission, instead of dropped (not counted in `lost`).
    pub retransmitted: u64,
    /// Handed out by [`Net::pop_due`].
    pub delivered: u64,
}

impl NetStats {
    /// Messages dropped, at random or by a cut.
    pub fn dropped(&self) -> u64 {
        self.lost + self.cut
    }
}

/// A network between endpoints `0..endpoints` carrying messages of type `M`.
#[derive(Debug)]
pub struct Net<M> {
    endpoints: usize,
    now: u64,
    /// Per directed link, `[from * endpoints + to]`.
    latency: Vec<Latency>,
    loss: f64,
    duplicate: f64,
    reorder: f64,
    reorder_ms: u64,
    in_flight_on_cut: InFlightOnCut,
    /// Faults, per directed link.
    cut: Vec<bool>,
    drop: Vec<f64>,
    wire: BinaryHeap<Envelope<M>>,
    seq: u64,
    rng: SeededRng,
    stats: NetStats,
}

impl<M> Net<M> {
    /// A healthy network between `endpoints` endpoints at time 0: no latency, no loss, no
    /// faults; every random decision drawn from `rng`.
    pub fn new(endpoints: usize, rng: SeededRng) -> Net<M> {
        let links = endpoints * endpoints;
        Net {
            endpoints,
            now: 0,
            latency: vec![Latency::default(); links],
            loss: 0.0,
            duplicate: 0.0,
            reorder: 0.0,
            reorder_ms: 1,
            in_flight_on_cut: InFlightOnCut::default(),
            cut: vec![false; links],
            drop: vec![0.0; links],
            wire: BinaryHeap::new(),
            seq: 0,
            rng,
            stats: NetStats::default(),
        }
    }

    fn link(&self, from: usize, to: usize) -> usize {
        assert!(
            from < self.endpoints && to < self.endpoints,
            "link {from} -> {to} outside {} endpoints",
            self.endpoints
        );
        from * self.endpoints + to
    }

    /// The number of endpoints.
    pub fn endpoints(&self) -> usize {
        self.endpoints
    }

    // ---- the clock ----------------------------------------------------------------------

    /// The current virtual time, ms.
    pub fn now(&self) -> u64 {
        self.now
    }

    /// Moves the clock to `t`.
    ///
    /// # Panics
    /// If `t` is earlier than [`Net::now`]: virtual time only moves forward.
    pub fn advance_to(&mut self, t: u64) {
        assert!(t >= self.now, "time goes back from {} to {t}", self.now);
        self.now = t;
    }

    /// Moves the clock `ms` forward.
    pub fn advance(&mut self, ms: u64) {
        self.now += ms;
    }

    // ---- conditions ---------------------------------------------------------------------

    /// Every link's latency.
    pub fn set_latency(&mut self, latency: Latency) {
        self.latency.fill(latency);
    }

    /// The latency of the link from `from` to `to`.
    pub fn set_link_latency(&mut self, from: usize, to: usize, latency: Latency) {
        let l = self.link(from, to);
        self.latency[l] = latency;
    }

    /// The probability that any message is lost.
    pub fn set_loss(&mut self, p: f64) {
        self.loss = p;
    }

    /// The probability that a message is delivered twice, with independent delays.
    pub fn set_duplicate(&mut self, p: f64) {
        self.duplicate = p;
    }

    /// The probability that a message is held back by a further `1..=max_ms` ms (drawn
    /// uniformly), so that messages sent after it overtake it.
    pub fn set_reorder(&mut self, p: f64, max_ms: u64) {
        self.reorder = p;
        self.reorder_ms = max_ms.max(1);
    }

    /// What happens to messages on the wire over a link that is cut when they arrive.
    pub fn set_in_flight_on_cut(&mut self, policy: InFlightOnCut) {
        self.in_flight_on_cut = policy;
    }

    // ---- faults -------------------------------------------------------------------------

    /// Cuts the link from `a` to `b` (one way): nothing sent from `a` reaches `b`.
    pub fn cut(&mut self, a: usize, b: usize) {
        let l = self.link(a, b);
        self.cut[l] = true;
    }

    /// Cuts the links between `a` and `b`, both ways.
    pub fn cut_both(&mut self, a: usize, b: usize) {
        self.cut(a, b);
        self.cut(b, a);
    }

    /// Cuts every link to and from `n` (its link to itself aside).
    pub fn isolate(&mut self, n: usize) {
        for j in (0..self.endpoints).filter(|&j| j != n) {
            self.cut_both(n, j);
        }
    }

    /// Drops each message from `from` to `to` with probability `p`, on top of the loss
    /// condition (`p = 0` removes the fault).
    pub fn drop(&mut self, from: usize, to: usize, p: f64) {
        let l = self.link(from, to);
        self.drop[l] = p;
    }

    /// Mends the link from `a` to `b` (one way).
    pub fn mend(&mut self, a: usize, b: usize) {
        let l = self.link(a, b);
        self.cut[l] = false;
    }

    /// Mends the links between `a` and `b`, both ways.
    pub fn mend_both(&mut self, a: usize, b: usize) {
        self.mend(a, b);
        self.mend(b, a);
    }

    /// Mends every link to and from `n`, also those to endpoints that are still isolated.
    pub fn rejoin(&mut self, n: usize) {
        for j in (0..self.endpoints).filter(|&j| j != n) {
            self.mend_both(n, j);
        }
    }

    /// Clears every fault: cuts and drops. The conditions stay.
    pub fn recover(&mut self) {
        self.cut.fill(false);
        self.drop.fill(0.0);
    }

    /// Whether the link from `from` to `to` is cut now.
    pub fn is_cut(&self, from: usize, to: usize) -> bool {
        self.cut[self.link(from, to)]
    }

    // ---- traffic ------------------------------------------------------------------------

    /// Puts `msg` from `from` to `to` on the wire now, unless the link is cut or the message
    /// is lost; sometimes twice. Returns whether it went on the wire.
    pub fn send(&mut self, from: usize, to: usize, msg: M) -> bool
    where
        M: Clone,
    {
        self.put(from, to, msg, None)
    }

    /// [`Net::send`] for a message that travels on a reliable stream (QUIC's): where the
    /// loss condition would drop it, it arrives `retransmit_ms` after the link's base latency
    /// instead, as a retransmission would bring it. A cut, or a link's `drop` fault, still
    /// drops it (the connection is gone, or could not be kept). Draws from the generator exactly what [`Net::send`] draws, so a run that sends
    /// some messages this way stays the same run in every other respect.
    pub fn send_reliable(&mut self, from: usize, to: usize, msg: M, retransmit_ms: u64) -> bool
    where
        M: Clone,
    {
        self.put(from, to, msg, Some(retransmit_ms))
    }

    fn put(&mut self, from: usize, to: usize, msg: M, retransmit_ms: Option<u64>) -> bool
    where
        M: Clone,
    {
        let l = self.link(from, to);
        self.stats.sent += 1;
        if self.cut[l] {
            self.stats.cut += 1;
            return false;
        }
        // The same draws either way: a link's drop fault is drawn only when the loss
        // condition did not fire.
        let lost = self.rng.chance(self.loss);
        if let (true, Some(ms)) = (lost, retransmit_ms) {
            self.stats.retransmitted += 1;
            let at = self.now + self.latency[l].base_ms + ms;
            self.push(at, from, to, msg);
            return true;
        }
        if lost || self.rng.chance(self.drop[l]) {
            self.stats.lost += 1;
            return false;
        }
        if self.rng.chance(self.duplicate) {
            // A reliable stream delivers once: the copy's delay is drawn all the same.
            let at = self.now + self.draw_delay(l);
            if retransmit_ms.is_none() {
                self.stats.duplicated += 1;
                self.push(at, from, to, msg.clone());
            }
        }
        let at = self.now + self.draw_delay(l);
        self.push(at, from, to, msg);
        true
    }

    fn draw_delay(&mut self, link: usize) -> u64 {
        let Latency { base_ms, jitter_ms } = self.latency[link];
        let mut d = base_ms + self.rng.range(0, jitter_ms);
        if self.rng.chance(self.reorder) {
            d += self.rng.range(1, self.reorder_ms);
        }
        d
    }

    fn push(&mut self, at: u64, from: usize, to: usize, msg: M) {
        self.seq += 1;
        self.wire.push(Envelope {
            at,
            sent: self.now,
            from,
            to,
            msg,
            seq: self.seq,
        });
    }

    /// The next message due at or before now, in order of arrival time and then of sending;
    /// under [`InFlightOnCut::Lost`], messages whose link is cut are dropped on the way.
    pub fn pop_due(&mut self) -> Option<Envelope<M>> {
        while self.wire.peek().is_some_and(|m| m.at <= self.now) {
            let m = self.wire.pop()?;
            if self.in_flight_on_cut == InFlightOnCut::Lost && self.is_cut(m.from, m.to) {
                self.stats.cut += 1;
                continue;
            }
            self.stats.delivered += 1;
            return Some(m);
        }
        None
    }

    /// When the earliest message on the wire arrives (it may still be dropped by a cut).
    pub fn next_arrival(&self) -> Option<u64> {
        self.wire.peek().map(|m| m.at)
    }

    /// The number of messages on the wire.
    pub fn in_flight(&self) -> usize {
        self.wire.len()
    }

    /// What the network did so far.
    pub fn stats(&self) -> NetStats {
        self.stats
    }
}

#[cfg(test)]
mod tests;
