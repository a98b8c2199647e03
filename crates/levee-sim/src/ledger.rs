//! What every policy admitted, per key and window: the ground truth the checks read.
//!
//! Windows are the deciding node's: a request decided by a node whose clock reads `t` counts
//! in window `t / WINDOW_MS`, exactly as the node's CRDT counts it. So the strict limit is
//! checked per epoch as the cluster defines epochs, whatever the clocks' skew.

use std::collections::{BTreeMap, HashMap};

use crate::plan::MAX_REGIONS;

/// One key's window.
#[derive(Debug, Clone, Default)]
pub struct WindowBook {
    /// Tokens admitted, by the region the request arrived at.
    pub admitted: [u64; MAX_REGIONS],
    /// Tokens asked for, by region.
    pub demand: [u64; MAX_REGIONS],
    /// Usage and gifts of this window that crashed nodes had not gossiped to any node still
    /// alive when they pulled the cluster's state after restarting: lost with the crash.
    /// Tokens.
    pub forgotten: u64,
    /// Usage and gifts of this window that live peers knew but a restarted node did not have
    /// when it declared itself synced and started deciding. Tokens.
    pub unrecovered: u64,
    /// Checks denied while the window's true tallies had room for them (by a
    /// node that was not recovering), and the longest `retry_after_ms` they carried.
    pub retry_with_room: (u64, u64),
}

impl WindowBook {
    /// Tokens admitted over all regions.
    pub fn admitted_total(&self) -> u64 {
        self.admitted.iter().sum()
    }

    /// Tokens asked for over all regions.
    pub fn demand_total(&self) -> u64 {
        self.demand.iter().sum()
    }
}

/// Every window of every key of one policy's run.
#[derive(Debug, Clone, Default)]
pub struct Ledger {
    /// By (key index, absolute window number).
    pub windows: BTreeMap<(u32, u64), WindowBook>,
    /// Tokens each deciding endpoint (node, or region for the baselines) admitted, by (key,
    /// window): the true tallies, which a crash does not erase.
    truth: HashMap<(u32, u64), Vec<u64>>,
    endpoints: usize,
}

impl Ledger {
    /// An empty ledger for `endpoints` deciding nodes (or regions).
    pub fn new(endpoints: usize) -> Ledger {
        Ledger {
            windows: BTreeMap::new(),
            truth: HashMap::new(),
            endpoints,
        }
    }

    /// The book of a key's window, created empty.
    pub fn book(&mut self, key: u32, window: u64) -> &mut WindowBook {
        self.windows.entry((key, window)).or_default()
    }

    /// A request of one token for `key` arrived at `region`, counted in `window`.
    pub fn demand(&mut self, key: u32, window: u64, region: usize) {
        self.book(key, window).demand[region] += 1;
    }

    /// `endpoint` admitted one token for `key` in `window`, for a request at `region`.
    pub fn admit(&mut self, key: u32, window: u64, region: usize, endpoint: usize) {
        self.book(key, window).admitted[region] += 1;
        let n = self.endpoints;
        self.truth
            .entry((key, window))
            .or_insert_with(|| vec![0; n])[endpoint] += 1;
    }

    /// Tokens `endpoint` really admitted for `key` in `window`.
    pub fn truth(&self, key: u32, window: u64, endpoint: usize) -> u64 {
        self.truth.get(&(key, window)).map_or(0, |v| v[endpoint])
    }
}

/// A node's rights for one window of the main key, as it saw them when the window ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeRights {
    /// Whether the node was up.
    pub up: bool,
    /// Its static split.
    pub split: u64,
    /// Rights it received (as it knows).
    pub received: u64,
    /// Rights it gave away.
    pub given: u64,
    /// Tokens it consumed.
    pub consumed: u64,
}

impl NodeRights {
    /// What it held: split + received − given.
    pub fn held(&self) -> u64 {
        (self.split + self.received).saturating_sub(self.given)
    }
}
