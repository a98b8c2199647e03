//! Agreement after a heal: how long until every node's view of a key is the same.
//!
//! Measured on the probe key, which sees a little demand on every side while a partition
//! lasts and none from 300 ms before the heal, so its state stops changing and "every view
//! is equal" has a moment at which it becomes true. Three times are recorded from the heal:
//!
//! * `usage_ms`: until every live node's view of the key's *consumption* is equal — tokens
//!   consumed net of refunds, per node and window, what `/v1/usage` is computed from (its
//!   `used` and `regions`). This is agreement as a client can observe it, and the figure the
//!   `heal-agreement` property is about (issue #13, item 5); the baselines' figure is the same
//!   comparison of what each region's counter shows;
//! * `equal_ms`: until every live node's whole replicated state of the key is equal, the
//!   rights bookkeeping (transfers) and request tallies included — when rebalancing has
//!   settled too, reported beside the property;
//! * `dominate_ms`: until every live node's state holds everything any node held at the
//!   heal (the pull exchange alone; writes made after the heal, such as a forecast that
//!   decays and is republished, can make `equal_ms` later).
//!
//! States are compared on the windows that matter at the heal (the current one and the one
//! before, by simulated time); slots without entries count as absent.
//!
//! The target is the design's: two gossip intervals plus one round trip, where the round
//! trip is the largest nominal RTT between two regions whose link was cut, plus the most
//! jitter and reordering delay each way can add.

use levee_core::KeyCrdt;

use crate::levee::dominates;
use crate::plan::{Episode, EpisodeKind, RunPlan, T0};

/// Agreement after one heal.
#[derive(Debug, Clone, Copy)]
pub struct HealFigure {
    /// The heal's time (sim ms).
    pub heal_at: u64,
    /// The partition's shape.
    pub kind: EpisodeKind,
    /// Whether the last down period lasted long enough for the protocol to see it
    /// (`suspect_after` plus two gossip intervals). Shorter cuts are repaired by
    /// anti-entropy; the target applies to detected partitions only.
    pub detected: bool,
    /// The design's target: two gossip intervals plus one round trip, ms.
    pub target_ms: u64,
    /// The largest nominal round trip between two regions whose link was cut, ms.
    pub rtt_ms: u64,
    /// Whether the run had no random message loss.
    pub lossless: bool,
    /// Time from the heal until every live node's view of the probe key's consumption (net
    /// of refunds, per node and window) was equal; `None` if not before the run ended.
    pub usage_ms: Option<u64>,
    /// Time from the heal until every view of the whole replicated state (rights and request
    /// tallies included) was equal; `None` if not before the run ended.
    pub equal_ms: Option<u64>,
    /// Time from the heal until every view held all that any held at the heal.
    pub dominate_ms: Option<u64>,
}

impl HealFigure {
    /// A figure for `ep` in `plan`, with nothing measured yet.
    pub fn new(plan: &RunPlan, ep: &Episode) -> HealFigure {
        let p = &plan.protocol;
        let rtt = ep
            .cut
            .iter()
            .map(|&(a, b)| plan.topology.rtt(a, b))
            .max()
            .unwrap_or(0);
        let reorder = if plan.net.reorder > 0.0 {
            plan.net.reorder_ms
        } else {
            0
        };
        HealFigure {
            heal_at: ep.heal,
            kind: ep.kind,
            detected: ep.heal - ep.last_down >= p.suspect_after + 2 * p.gossip_interval,
            target_ms: 2 * p.gossip_interval + rtt + 2 * (plan.net.jitter_ms + reorder),
            rtt_ms: rtt,
            lossless: plan.net.loss == 0.0,
            usage_ms: None,
            equal_ms: None,
            dominate_ms: None,
        }
    }

    /// Whether the views of consumption agreed within the target.
    pub fn within_target(&self) -> bool {
        self.usage_ms.is_some_and(|ms| ms <= self.target_ms)
    }

    /// Whether the whole replicated state (rights included) was equal within the target.
    pub fn state_within_target(&self) -> bool {
        self.equal_ms.is_some_and(|ms| ms <= self.target_ms)
    }
}

/// Watches the probe key's views from a heal until they agree.
#[derive(Debug, Clone)]
pub struct HealWatch {
    fig: HealFigure,
    lo: u64,
    hi: u64,
    before: KeyCrdt,
}

impl HealWatch {
    /// Starts watching at `ep`'s heal.
    pub fn new(plan: &RunPlan, ep: &Episode) -> HealWatch {
        let window = plan.window_of(T0 + ep.heal);
        HealWatch {
            fig: HealFigure::new(plan, ep),
            lo: window - 1,
            hi: window,
            before: KeyCrdt::default(),
        }
    }

    /// A view restricted to what is compared: the windows around the heal, without empty
    /// slots.
    pub fn normal(&self, state: Option<&KeyCrdt>) -> KeyCrdt {
        let mut s = state.cloned().unwrap_or_default();
        s.retain_epochs(self.lo, self.hi);
        s.slots
            .retain(|slot| !slot.tallies.is_empty() || !slot.transfers.is_empty());
        s
    }

    /// Records what the views held at the heal.
    pub fn set_before(&mut self, states: &[KeyCrdt]) {
        use levee_core::Lattice;
        for s in states {
            self.before.join(s);
        }
    }

    /// Compares the live nodes' views at `now`.
    pub fn observe(&mut self, now: u64, states: &[KeyCrdt]) {
        let since = now - self.fig.heal_at;
        if self.fig.dominate_ms.is_none() && states.iter().all(|s| dominates(s, &self.before)) {
            self.fig.dominate_ms = Some(since);
        }
        if self.fig.equal_ms.is_none() && states.windows(2).all(|w| w[0] == w[1]) {
            self.fig.equal_ms = Some(since);
        }
        if self.fig.usage_ms.is_none() {
            let first = consumption(states.first());
            if states.iter().skip(1).all(|s| consumption(Some(s)) == first) {
                self.fig.usage_ms = Some(since);
            }
        }
    }

    /// Whether all three times are known.
    pub fn done(&self) -> bool {
        self.fig.usage_ms.is_some() && self.fig.equal_ms.is_some() && self.fig.dominate_ms.is_some()
    }

    /// The figure.
    pub fn figure(self) -> HealFigure {
        self.fig
    }
}

/// A view's consumption ([`KeyCrdt::consumption`]); no view, none.
fn consumption(state: Option<&KeyCrdt>) -> Vec<(u64, Vec<(levee_core::NodeIdx, u64)>)> {
    state.map(KeyCrdt::consumption).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::consumption;
    use levee_core::{KeyCrdt, NodeIdx};

    fn view(consumed: &[(u16, u64, u64)], given: u64) -> KeyCrdt {
        let mut k = KeyCrdt::default();
        for &(node, consumed, requested) in consumed {
            let t = k.slot_mut(7).tallies.entry(NodeIdx(node));
            t.consumed = consumed;
            t.requested = requested;
        }
        if given > 0 {
            k.slot_mut(7).transfers.give(NodeIdx(0), NodeIdx(1), given);
        }
        k
    }

    #[test]
    fn views_of_usage_agree_when_consumption_does_whatever_the_rights_bookkeeping_says() {
        let a = view(&[(0, 5, 9), (1, 3, 3)], 0);
        let b = view(&[(0, 5, 12), (1, 3, 3)], 4);
        assert_ne!(a, b, "the whole states differ (requests, transfers)");
        assert_eq!(consumption(Some(&a)), consumption(Some(&b)));
        let c = view(&[(0, 5, 9), (1, 4, 4)], 0);
        assert_ne!(
            consumption(Some(&a)),
            consumption(Some(&c)),
            "one more admission at node 1"
        );
        assert_eq!(
            consumption(Some(&view(&[(2, 0, 6)], 3))),
            consumption(None),
            "a node that consumed nothing shows no usage"
        );
    }
}
