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
    /// Tokens given back (refunds), already taken off `admitted`, by the region their
    /// request was asked at: a refunded request's tokens were asked and then given back, so
    /// they are no longer demand the window had to serve (`partition-share` compares what a
    /// side kept admitted with what it kept asking).
    pub refunded_at: [u64; MAX_REGIONS],
    /// Tokens given back before the admissions they offset were recorded (the central
    /// counter's home gives back what it consumed in the window, some of it admitted
    /// there while its answer is still on the way): taken off the next admissions.
    owed: u64,
    /// Checks denied while the window's true tallies had room for them (by a
    /// node that was not recovering or blind), and the longest `retry_after_ms` they carried.
    pub retry_with_room: (u64, u64),
}

impl WindowBook {
    /// Tokens admitted over all regions.
    pub fn admitted_total(&self) -> u64 {
        self.admitted.iter().sum()
    }

    /// Tokens given back over all regions.
    pub fn refunded(&self) -> u64 {
        self.refunded_at.iter().sum()
    }

    /// Tokens asked for over all regions.
    pub fn demand_total(&self) -> u64 {
        self.demand.iter().sum()
    }
}

/// Tokens admitted (positive) or given back (negative) by one endpoint at one time: the
/// timeline the properties of continuous algorithms are checked on (`crate::algos`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Movement {
    /// The key.
    pub key: u32,
    /// The deciding endpoint.
    pub endpoint: u16,
    /// Simulated time the tokens count at, ms: when they were admitted or refunded (a
    /// sliding log's refund: when the admission it gives back was made).
    pub sim: u64,
    /// The epoch of the endpoint's clock they count in (a sliding window's refund may come
    /// from the epoch before).
    pub epoch: u64,
    /// Tokens: admitted (> 0) or refunded (< 0).
    pub tokens: i64,
}

/// Every window of every key of one policy's run.
#[derive(Debug, Clone, Default)]
pub struct Ledger {
    /// By (key index, absolute window number).
    pub windows: BTreeMap<(u32, u64), WindowBook>,
    /// Every admission and refund in time order, for rules that hold rights continuously;
    /// empty for the others.
    pub movements: Vec<Movement>,
    /// Every endpoint's clock offset from simulated time (Unix ms = `T0` + sim + offset), and
    /// from when (sim ms): it changes when a node restarts.
    pub offsets: Vec<Vec<(u64, i64)>>,
    /// Rules that hold rights continuously: tokens crashed nodes admitted and no live node
    /// knew when they pulled again (lost with the crash, as the design allows), by key, with
    /// the crash's simulated time.
    pub forgotten: Vec<(u32, u64, u64)>,
    /// Tokens each deciding endpoint (node, or region for the baselines) admitted, by (key,
    /// window): the true tallies, which a crash does not erase.
    truth: HashMap<(u32, u64), Vec<u64>>,
    endpoints: usize,
    timeline: bool,
}

impl Ledger {
    /// An empty ledger for `endpoints` deciding nodes (or regions); with `timeline`, every
    /// admission and refund is kept in [`Ledger::movements`].
    pub fn new(endpoints: usize, timeline: bool) -> Ledger {
        Ledger {
            windows: BTreeMap::new(),
            movements: Vec::new(),
            offsets: vec![vec![(0, 0)]; endpoints],
            forgotten: Vec::new(),
            truth: HashMap::new(),
            endpoints,
            timeline,
        }
    }

    /// Tokens admitted of each key, over every window.
    pub fn admitted_by_key(&self) -> BTreeMap<u32, u64> {
        let mut by_key = BTreeMap::new();
        for (&(k, _), b) in &self.windows {
            *by_key.entry(k).or_insert(0) += b.admitted_total();
        }
        by_key
    }

    /// The book of a key's window, created empty.
    pub fn book(&mut self, key: u32, window: u64) -> &mut WindowBook {
        self.windows.entry((key, window)).or_default()
    }

    /// A request of `tokens` for `key` arrived at `region`, counted in `window`.
    pub fn demand(&mut self, key: u32, window: u64, region: usize, tokens: u64) {
        self.book(key, window).demand[region] += tokens;
    }

    /// `endpoint`'s clock is off simulated time by `offset` from `sim` on.
    pub fn set_offset(&mut self, endpoint: usize, sim: u64, offset: i64) {
        self.offsets[endpoint].push((sim, offset));
    }

    /// `endpoint`'s clock offset at `sim`.
    pub fn offset_at(&self, endpoint: usize, sim: u64) -> i64 {
        self.offsets[endpoint]
            .iter()
            .rev()
            .find(|(from, _)| *from <= sim)
            .map_or(0, |&(_, o)| o)
    }

    /// `endpoint` admitted `tokens` for `key` in `window` at `sim`, for a request at `region`.
    pub fn admit(
        &mut self,
        key: u32,
        (window, sim): (u64, u64),
        region: usize,
        endpoint: usize,
        tokens: u64,
    ) {
        let book = self.book(key, window);
        let owed = book.owed.min(tokens);
        book.owed -= owed;
        book.admitted[region] += tokens - owed;
        let n = self.endpoints;
        self.truth
            .entry((key, window))
            .or_insert_with(|| vec![0; n])[endpoint] += tokens;
        self.moved(key, endpoint, sim, window, tokens as i64);
    }

    /// `endpoint` gave back `tokens` of `key` that counted in `window`, at `sim`, for a
    /// request at `region` (what the core really gave back: never more than it had
    /// consumed).
    pub fn refund(
        &mut self,
        key: u32,
        (window, sim): (u64, u64),
        region: usize,
        endpoint: usize,
        tokens: u64,
    ) {
        let book = self.book(key, window);
        book.refunded_at[region] += tokens;
        // Off the request's region first: a node gives back what it consumed in the window,
        // which for the central counter may have been asked elsewhere.
        let mut left = tokens;
        let mut from = region;
        while left > 0 {
            let take = left.min(book.admitted[from]);
            book.admitted[from] -= take;
            left -= take;
            match (0..MAX_REGIONS).max_by_key(|&r| book.admitted[r]) {
                Some(r) if book.admitted[r] > 0 => from = r,
                _ => break,
            }
        }
        book.owed += left;
        if let Some(t) = self.truth.get_mut(&(key, window)) {
            t[endpoint] = t[endpoint].saturating_sub(tokens);
        }
        self.moved(key, endpoint, sim, window, -(tokens as i64));
    }

    fn moved(&mut self, key: u32, endpoint: usize, sim: u64, epoch: u64, tokens: i64) {
        if self.timeline && tokens != 0 {
            self.movements.push(Movement {
                key,
                endpoint: endpoint as u16,
                sim,
                epoch,
                tokens,
            });
        }
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
