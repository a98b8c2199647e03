//! How a seed of the membership set ([`Scenario::MEMBERSHIP`]) becomes a [`RunPlan`]: a
//! world drawn as for the classic scenarios, changes of the node list as an operator makes
//! them (docs/membership.md), and beside them, in about half the runs each, a partition and
//! a crash of another node.
//!
//! Links deliver frames in order, as the node's TCP connections do (the classic scenarios'
//! jitter, reordering and duplication are left out; loss stays), except in
//! [`Scenario::GrowReordered`], which keeps them to show what the rule owes to that order.
//!
//! A change publishes a new list: every running node of it is reloaded at its own time, up
//! to [`RELOAD_SKEW_MS`] after the change (operators editing files one by one), and a node it
//! adds starts in that span too, before or after the others reload. A node is removed only
//! dead (crashed first) or frozen (it goes on later with its old list); a region always
//! keeps a live node. The run lasts [`SETTLE_MS`] past the last fault, so that every list
//! can be agreed and every grown share applied before it ends.

use levee_testkit::rng::SeededRng;

use crate::lists::NodeList;
use crate::plan::{
    Episode, EpisodeKind, Fault, FaultKind, ProtocolParams, RunPlan, Topology, WINDOW_MS,
};
use crate::scenario::{Scenario, cut_between, random_net, random_topology, round_up};
use crate::workload::{self, Demand};

/// The most a node's reload (or a new node's start) comes after the change is published.
pub const RELOAD_SKEW_MS: u64 = 800;

/// How long a run goes on after its last fault: a node re-sends its list every ten
/// anti-entropy intervals once its list is agreed, and only that repairs a lost `Membership`
/// message (or one a peer never asked for again: a quick restart, a one-way cut), so a list
/// can take ten seconds to be agreed, twenty if that one is lost too; then a grown share
/// waits up to two windows.
pub const SETTLE_MS: u64 = 22_000;

/// The changes of one run as they are drawn.
struct Changes {
    lists: Vec<NodeList>,
    faults: Vec<Fault>,
    episodes: Vec<Episode>,
    /// Nodes given a fault of their own already (removed, frozen, crashed): not picked
    /// again.
    taken: Vec<usize>,
    /// Nodes of the first list (the ones that run from the start).
    first: usize,
    /// Clock offsets are drawn from `-half..=half`.
    half: i64,
}

impl Changes {
    fn latest(&self) -> &NodeList {
        self.lists.last().expect("a first list")
    }

    fn push(&mut self, at: u64, kind: FaultKind) {
        self.faults.push(Fault { at, kind });
    }

    /// Publishes `next` at `at`: every running node of it reloads, every new one starts,
    /// each at its own time.
    fn publish(&mut self, rng: &mut SeededRng, next: NodeList, at: u64) {
        let k = self.lists.len();
        let before = self.latest().len();
        for n in 0..next.len() {
            if !next.is_live(n) {
                continue;
            }
            let when = at + rng.range(0, RELOAD_SKEW_MS);
            let kind = if n < before {
                FaultKind::Reload { node: n, list: k }
            } else {
                FaultKind::Start {
                    node: n,
                    list: k,
                    offset: rng.range_i64(-self.half, self.half),
                }
            };
            self.push(when, kind);
        }
        self.lists.push(next);
    }

    /// A node of the first list, not taken, in a region that keeps another live node.
    fn pick(&mut self, rng: &mut SeededRng) -> Option<usize> {
        let latest = self.latest();
        let candidates: Vec<usize> = (0..self.first)
            .filter(|&n| {
                latest.is_live(n)
                    && !self.taken.contains(&n)
                    && latest.live_in(latest.entries[n].region).len() >= 2
            })
            .collect();
        if candidates.is_empty() {
            return None;
        }
        let n = candidates[rng.index(candidates.len())];
        self.taken.push(n);
        Some(n)
    }

    /// A node added in a random region at `at`.
    fn add(&mut self, rng: &mut SeededRng, at: u64) {
        let r = rng.index(self.latest().region_weights.len());
        let next = self.latest().with_added(r);
        self.publish(rng, next, at);
    }

    /// A node crashes at `at` and is removed a little later.
    fn remove_dead(&mut self, rng: &mut SeededRng, at: u64) {
        let Some(n) = self.pick(rng) else { return };
        self.push(at, FaultKind::Crash { node: n });
        let next = self.latest().with_removed(n);
        let removal = at + rng.range(200, 2_500);
        self.publish(rng, next, removal);
    }

    /// A node leaves at `at` (`POST /admin/leave`), is stopped a few seconds later (by then
    /// it has handed what it held over, unless a partition kept it from its peers), and is
    /// removed after that: the operator's way of removing a node (docs/membership.md).
    fn leave_remove(&mut self, rng: &mut SeededRng, at: u64) {
        let Some(n) = self.pick(rng) else { return };
        self.push(at, FaultKind::Leave { node: n });
        let stop = at + rng.range(2_000, 4_000);
        self.push(stop, FaultKind::Crash { node: n });
        let next = self.latest().with_removed(n);
        let removal = stop + rng.range(100, 1_000);
        self.publish(rng, next, removal);
    }

    /// A node is frozen at `at`, removed, and goes on with its old list: as the operator
    /// should (`seen`: frozen long enough for every peer to see it unreachable, and going on
    /// only once every node has reloaded), or at any time (`seen` false).
    fn freeze_remove(&mut self, rng: &mut SeededRng, at: u64, seen: bool, suspect_after: u64) {
        let Some(n) = self.pick(rng) else { return };
        self.push(at, FaultKind::Freeze { node: n });
        let (removal, thaw) = if seen {
            let removal = at + suspect_after + rng.range(500, 1_500);
            (removal, removal + RELOAD_SKEW_MS + rng.range(200, 2_500))
        } else {
            let removal = at + rng.range(300, 2_500);
            (removal, removal + rng.range(0, 3_000))
        };
        let next = self.latest().with_removed(n);
        self.publish(rng, next, removal);
        self.push(thaw, FaultKind::Thaw { node: n });
    }

    /// New weights, 1 to 4, for the live nodes of a region of two or more.
    fn reweight(&mut self, rng: &mut SeededRng, at: u64) {
        let latest = self.latest();
        let regions: Vec<usize> = (0..latest.region_weights.len())
            .filter(|&r| latest.live_in(r).len() >= 2)
            .collect();
        if regions.is_empty() {
            return;
        }
        let nodes = latest.live_in(regions[rng.index(regions.len())]);
        let mut weights: Vec<(usize, u32)> =
            nodes.iter().map(|&n| (n, rng.range(1, 4) as u32)).collect();
        let effective = |n: usize| latest.entries[n].weight.unwrap_or(1);
        // Shares must move: not every weight in the same proportion as before.
        let same = weights.iter().all(|&(n, w)| {
            u64::from(w) * u64::from(effective(nodes[0]))
                == u64::from(effective(n)) * u64::from(weights[0].1)
        });
        if same {
            weights[0].1 += 1;
        }
        let next = latest.with_weights(&weights);
        self.publish(rng, next, at);
    }

    /// One region cut off both ways, or one link cut one way, for a while.
    fn partition(&mut self, rng: &mut SeededRng) {
        let regions = self.latest().region_weights.len();
        let start = rng.range(2_000, 5_500);
        let heal = start + rng.range(800, 3_500);
        let (kind, pairs) = if rng.chance(0.5) {
            let x = rng.index(regions);
            let pairs = (0..regions)
                .filter(|&r| r != x)
                .flat_map(|r| [(x, r), (r, x)])
                .collect();
            (EpisodeKind::Isolated, pairs)
        } else {
            let a = rng.index(regions);
            let b = (a + 1 + rng.index(regions - 1)) % regions;
            (EpisodeKind::OneWay, vec![(a, b)])
        };
        cut_between(&mut self.faults, &pairs, start, heal);
        self.episodes.push(Episode {
            kind,
            start,
            heal,
            last_down: start,
            cut: pairs,
            sides: vec![],
        });
    }

    /// Another node crashes and restarts (with the latest list its file holds).
    fn crash_restart(&mut self, rng: &mut SeededRng) {
        let candidates: Vec<usize> = (0..self.first)
            .filter(|n| !self.taken.contains(n))
            .collect();
        if candidates.is_empty() {
            return;
        }
        let n = candidates[rng.index(candidates.len())];
        self.taken.push(n);
        let at = rng.range(1_500, 6_000);
        self.push(at, FaultKind::Crash { node: n });
        let offset = rng.range_i64(-self.half, self.half);
        self.push(
            at + rng.range(300, 2_500),
            FaultKind::Restart { node: n, offset },
        );
    }
}

/// Draws a membership scenario's world, changes, faults and demand from `seed`.
pub fn plan(scenario: Scenario, seed: u64) -> RunPlan {
    let mut rng = SeededRng::stream(seed, "plan");
    let regions = rng.range(2, 3) as usize;
    let mut topology: Topology = random_topology(&mut rng, regions);
    let mut net = random_net(&mut rng);
    if scenario != Scenario::GrowReordered {
        // Frames between two nodes travel in order on one TCP connection, and the rule
        // relies on it: a peer tells a node its list before it answers its pull. No jitter
        // (which reorders), reordering or duplication; random loss stays, a harsher stand-in
        // for a connection that breaks.
        net.jitter_ms = 0;
        net.reorder = 0.0;
        net.duplicate = 0.0;
    }
    let protocol = ProtocolParams::default();
    let half = (protocol.max_clock_skew / 2) as i64;
    if !matches!(scenario, Scenario::Grow | Scenario::GrowReordered) {
        // Removals and new weights need a region of two nodes or more.
        let r = rng.index(regions);
        topology.nodes_per_region[r] = topology.nodes_per_region[r].max(2);
    }
    let offsets = (0..topology.nodes())
        .map(|_| rng.range_i64(-half, half))
        .collect();
    let limit = rng.range(100, 400);
    let mut c = Changes {
        lists: vec![NodeList::initial(&topology)],
        faults: Vec::new(),
        episodes: Vec::new(),
        taken: Vec::new(),
        first: topology.nodes(),
        half,
    };
    let t = rng.range(2_500, 4_000);
    match scenario {
        Scenario::Grow | Scenario::GrowReordered => {
            c.add(&mut rng, t);
            if rng.chance(0.5) {
                let later = t + rng.range(300, 2_500);
                c.add(&mut rng, later);
            }
        }
        Scenario::RemoveDead | Scenario::RemoveDeadDay => c.remove_dead(&mut rng, t),
        Scenario::Leave => c.leave_remove(&mut rng, t),
        Scenario::Reweight => c.reweight(&mut rng, t),
        Scenario::FrozenRemoved => c.freeze_remove(&mut rng, t, true, protocol.suspect_after),
        Scenario::RemovedAlive => c.freeze_remove(&mut rng, t, false, protocol.suspect_after),
        _ => {
            // Two to four changes of any kind, each before the last is agreed, often.
            let mut at = t;
            for _ in 0..rng.range(2, 4) {
                match rng.index(3) {
                    0 => c.add(&mut rng, at),
                    1 => c.remove_dead(&mut rng, at),
                    _ => c.reweight(&mut rng, at),
                }
                at += rng.range(200, 2_000);
            }
        }
    }
    if rng.chance(0.5) {
        c.partition(&mut rng);
    }
    if rng.chance(0.4) {
        c.crash_restart(&mut rng);
    }
    c.faults.sort_by_key(|f| f.at);
    let last = c.faults.iter().map(|f| f.at).max().unwrap_or(0);
    let duration_ms = round_up(last + SETTLE_MS);
    let demand = if rng.chance(0.7) {
        Demand::Uniform {
            factor: 1.0 + 2.0 * rng.unit(),
        }
    } else {
        Demand::Skewed {
            factor: 1.5 + 1.5 * rng.unit(),
            hot: rng.index(regions),
        }
    };
    let mut demand_rng = SeededRng::stream(seed, "demand");
    let (keys, requests) =
        workload::generate(&demand, &mut demand_rng, regions, limit, duration_ms);
    let mut plan = RunPlan {
        seed,
        scenario,
        topology,
        net,
        protocol,
        limit,
        window_ms: WINDOW_MS,
        duration_ms,
        offsets,
        lists: c.lists,
        faults: c.faults,
        episodes: c.episodes,
        keys,
        probe: None,
        requests,
        max_wait_ms: 0,
        algo: crate::plan::Algo::FixedWindow,
        mixed: false,
    };
    if scenario == Scenario::RemoveDeadDay {
        plan.set_algo(crate::plan::Algo::QuotaDay);
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_list_follows_the_one_before_and_every_region_keeps_a_live_node() {
        for s in Scenario::MEMBERSHIP {
            for seed in 0..40 {
                let p = s.plan(seed);
                assert!(p.has_membership(), "{} seed {seed}: no change", s.name());
                for w in p.lists.windows(2) {
                    w[0].replica_set()
                        .check_successor(&w[1].replica_set())
                        .unwrap();
                }
                let last = p.final_list();
                for r in 0..p.topology.regions() {
                    assert!(!last.live_in(r).is_empty());
                }
                assert!(p.last_change_at() + SETTLE_MS <= p.duration_ms);
                assert!(2 * p.max_offset() as u64 <= p.protocol.max_clock_skew);
            }
        }
    }

    #[test]
    fn a_removed_node_is_dead_or_frozen_first() {
        for seed in 0..40 {
            for s in [
                Scenario::RemoveDead,
                Scenario::FrozenRemoved,
                Scenario::RemovedAlive,
                Scenario::Churn,
                Scenario::Leave,
            ] {
                let p = s.plan(seed);
                let last = p.final_list();
                for n in (0..last.len()).filter(|&n| !last.is_live(n)) {
                    let stopped = p.faults.iter().find(|f| {
                        matches!(f.kind, FaultKind::Crash { node } | FaultKind::Freeze { node } if node == n)
                    });
                    // The first list without it, and its first reload.
                    let k = p.lists.iter().position(|l| !l.is_live(n)).unwrap();
                    let removed_at = p
                        .faults
                        .iter()
                        .filter(|f| matches!(f.kind, FaultKind::Reload { list, .. } if list == k))
                        .map(|f| f.at)
                        .min()
                        .unwrap();
                    assert!(stopped.is_some_and(|f| f.at <= removed_at), "{seed} {n}");
                    if s == Scenario::Leave {
                        let left = p
                            .faults
                            .iter()
                            .find(|f| matches!(f.kind, FaultKind::Leave { node } if node == n));
                        assert!(left.is_some_and(|l| stopped.is_some_and(|f| l.at < f.at)));
                    }
                    assert!(
                        !p.faults.iter().any(
                            |f| matches!(f.kind, FaultKind::Restart { node, .. } if node == n)
                        )
                    );
                }
            }
        }
    }
}
