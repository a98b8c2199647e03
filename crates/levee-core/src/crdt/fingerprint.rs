//! A stable hash of a key's replicated state, which anti-entropy compares between nodes.

use crate::hash::Fnv1a;

use super::key_crdt::KeyCrdt;

impl KeyCrdt {
    /// A stable hash of the state, ignoring slots of epochs below `oldest_epoch` (which nodes
    /// prune at slightly different times). Two nodes whose states joined the same entries have
    /// the same fingerprint; anti-entropy compares fingerprints to find what differs.
    pub fn fingerprint(&self, oldest_epoch: u64) -> u64 {
        // FNV-1a fed field by field, each integer as its little-endian bytes: stable across
        // platforms, processes and versions.
        let mut h = Fnv1a::new();
        for s in self.slots.iter().filter(|s| s.epoch >= oldest_epoch) {
            h.write_u64(s.epoch);
            for (n, t) in s.tallies.iter() {
                h.write_u64(u64::from(n.0));
                h.write_u64(t.consumed);
                h.write_u64(t.refunded);
                h.write_u64(t.requested);
            }
            for c in s.transfers.cells() {
                h.write_u64(u64::from(c.from.0) << 16 | u64::from(c.to.0));
                h.write_u64(c.units);
            }
        }
        h.write_u64(u64::MAX);
        for c in self.holdings.cells() {
            h.write_u64(u64::from(c.from.0) << 16 | u64::from(c.to.0));
            h.write_u64(c.units);
        }
        h.write_u64(u64::MAX);
        for (n, b) in self.buckets.iter() {
            h.write_u64(u64::from(n.0));
            h.write_u64(b.seq);
            h.write_u64(b.at);
            h.write_u64(b.level_nt as u64);
        }
        h.write_u64(u64::MAX);
        for (n, d) in self.demand.iter() {
            h.write_u64(u64::from(n.0));
            h.write_u64(d.seq);
            h.write_u64(d.forecast);
            h.write_u64(d.received);
        }
        h.write_u64(u64::MAX);
        for c in self.claims.iter().filter(|c| c.epoch >= oldest_epoch) {
            h.write_u64(c.epoch);
            h.write_u64(u64::from(c.node.0));
            h.write_u64(c.step);
            h.write_u64(c.ceiling);
        }
        h.finish()
    }
}
