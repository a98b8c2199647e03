//! A stable hash of a key's replicated state, which anti-entropy compares between nodes.

use super::key_crdt::KeyCrdt;

/// FNV-1a, fed field by field: stable across platforms, processes and versions.
struct Fnv(u64);

impl Fnv {
    fn u64(&mut self, v: u64) {
        for b in v.to_le_bytes() {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
}

impl KeyCrdt {
    /// A stable hash of the state, ignoring slots of epochs below `oldest_epoch` (which nodes
    /// prune at slightly different times). Two nodes whose states joined the same entries have
    /// the same fingerprint; anti-entropy compares fingerprints to find what differs.
    pub fn fingerprint(&self, oldest_epoch: u64) -> u64 {
        let mut h = Fnv(0xcbf2_9ce4_8422_2325);
        for s in self.slots.iter().filter(|s| s.epoch >= oldest_epoch) {
            h.u64(s.epoch);
            for (n, t) in s.tallies.iter() {
                h.u64(u64::from(n.0));
                h.u64(t.consumed);
                h.u64(t.refunded);
                h.u64(t.requested);
            }
            for c in s.transfers.cells() {
                h.u64(u64::from(c.from.0) << 16 | u64::from(c.to.0));
                h.u64(c.units);
            }
        }
        h.u64(u64::MAX);
        for c in self.holdings.cells() {
            h.u64(u64::from(c.from.0) << 16 | u64::from(c.to.0));
            h.u64(c.units);
        }
        h.u64(u64::MAX);
        for (n, b) in self.buckets.iter() {
            h.u64(u64::from(n.0));
            h.u64(b.seq);
            h.u64(b.at);
            h.u64(b.level_nt as u64);
        }
        h.u64(u64::MAX);
        for (n, d) in self.demand.iter() {
            h.u64(u64::from(n.0));
            h.u64(d.seq);
            h.u64(d.forecast);
            h.u64(d.received);
        }
        h.u64(u64::MAX);
        for c in self.claims.iter().filter(|c| c.epoch >= oldest_epoch) {
            h.u64(c.epoch);
            h.u64(u64::from(c.node.0));
            h.u64(c.step);
            h.u64(c.ceiling);
        }
        h.0
    }
}
