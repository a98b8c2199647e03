//! The scenarios a seed can run, and how a seed becomes a [`RunPlan`].
//!
//! Every scenario draws a fresh world from its seed: two to four regions of one to three
//! nodes, a round trip of 30 to 300 ms between every two regions, jitter, and often loss,
//! duplication and reordering; every node's clock is off by up to half the configured
//! `max_clock_skew` either way, so any two clocks differ by at most `max_clock_skew`. The
//! scenario then adds its demand and its faults.

use levee_testkit::rng::SeededRng;

use crate::demand;
use crate::lists::NodeList;
use crate::plan::{
    Episode, EpisodeKind, Fault, FaultKind, NetParams, ProtocolParams, Request, RunPlan, Topology,
    WINDOW_MS,
};
use crate::workload::{self, Demand};

/// A kind of run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scenario {
    /// Even demand, no partition.
    Steady,
    /// Demand split 90/5/5 (one busy region), no partition.
    Skewed,
    /// The busy region changes every few seconds.
    HotRegion,
    /// Low demand with short bursts.
    Bursts,
    /// Twenty to sixty keys of Zipf-like popularity.
    ManyKeys,
    /// One region cut off from all others for a few seconds, then healed.
    RegionIsolated,
    /// Every region cut off from every other, then healed.
    FullSplit,
    /// One or two links cut in one direction only.
    OneWay,
    /// A link going down and up at random for a few seconds.
    Flapping,
    /// Nodes (sometimes a whole region) crash, lose their state, and restart.
    Crashes,
    /// Low-rate sporadic keys (a few requests a minute per region) on an hour's or a day's
    /// window ([`crate::demand::sporadic`]).
    Sporadic,
    /// The busy region moves region by region on a long window
    /// ([`crate::demand::follow_the_sun`]).
    FollowTheSun,
    /// Checks back to back, region by region, on a day's window
    /// ([`crate::demand::back_to_back`]).
    BackToBack,
    /// Hundreds of lightly used keys beside a few hot ones, on a minute's window
    /// ([`crate::demand::light_keys`]).
    LightKeys,
    /// One or two nodes added to the list while the cluster runs ([`crate::changes`]).
    Grow,
    /// A node crashes and is then removed from the list.
    RemoveDead,
    /// As [`Scenario::RemoveDead`], on a day's quota (half the tokens the limit allows over
    /// the run, as the algorithms set's): what the dead node held of the day serves its
    /// region-mates once it is removed (`levee_core::rule::Bequest`), or is stranded.
    RemoveDeadDay,
    /// The weights of a region's nodes change.
    Reweight,
    /// A node stops processing (`SIGSTOP`) long enough to be seen unreachable, is removed
    /// everywhere, and only then goes on with its old list (docs/membership.md: the bound of
    /// *Removing a node that is not dead*).
    FrozenRemoved,
    /// As [`Scenario::FrozenRemoved`], but the node may go on before every node has
    /// reloaded, or after a freeze too short to be seen: a node removed while alive and
    /// reachable (it found a hole, closed since: see [`Scenario::MEMBERSHIP`]).
    RemovedAlive,
    /// Nodes added, removed and re-weighted, the changes overlapping.
    Churn,
    /// A node leaves (`POST /admin/leave`: it hands what it holds over), is stopped, then
    /// removed from the list.
    Leave,
    /// [`Scenario::Bursts`] (the same world and demand for the same seed) with callers that
    /// wait for rights (`max_wait_ms`) one round trip (the topology's longest) and two gossip
    /// intervals: run with `--set waiting`.
    BurstsWaiting,
    /// As [`Scenario::Grow`], with the classic scenarios' jitter, reordering and duplication
    /// on every link: frames between two nodes may overtake each other, which TCP never
    /// lets them do (it found a hole, closed since: see [`Scenario::MEMBERSHIP`]).
    GrowReordered,
    /// A classic scenario's world, faults and demand (the one seed / 6 runs) on a
    /// `fixed_window` rule, with costs drawn from 1–10 and refunds: run with `--set
    /// algorithms` ([`Scenario::plan_algorithm`]).
    FixedCosts,
    /// As [`Scenario::FixedCosts`], on a `token_bucket`.
    TokenBucket,
    /// As [`Scenario::FixedCosts`], on a `leaky_bucket`.
    LeakyBucket,
    /// As [`Scenario::FixedCosts`], on a `sliding_window`.
    SlidingWindow,
    /// As [`Scenario::FixedCosts`], on a `sliding_log`.
    SlidingLog,
    /// As [`Scenario::FixedCosts`], on a day's `quota`.
    QuotaDay,
    /// As [`Scenario::FixedCosts`] without refunds, every request one atomic `all` call
    /// against three rules of its key (`crate::mixed`: a fixed window with threshold classes
    /// and a per-key override, a token bucket with separate classes, a shadow sliding
    /// window), of class `gold` (7 in 10) or `free`.
    Mixed,
}

impl Scenario {
    /// Every scenario, in the order seeds cycle through them.
    pub const ALL: [Scenario; 10] = [
        Scenario::Steady,
        Scenario::Skewed,
        Scenario::HotRegion,
        Scenario::Bursts,
        Scenario::ManyKeys,
        Scenario::RegionIsolated,
        Scenario::FullSplit,
        Scenario::OneWay,
        Scenario::Flapping,
        Scenario::Crashes,
    ];

    /// The scenarios of demand as it really comes (long windows, low rates, moving demand):
    /// run with `--set demand`, so that the classic cycle's seeds keep their figures.
    pub const DEMAND: [Scenario; 4] = [
        Scenario::Sporadic,
        Scenario::FollowTheSun,
        Scenario::BackToBack,
        Scenario::LightKeys,
    ];

    /// The scenarios of membership changes (docs/membership.md), each with partitions and
    /// crashes drawn beside its changes: run with `--set membership`.
    /// [`Scenario::RemovedAlive`] and [`Scenario::GrowReordered`] found two holes, since
    /// closed: a node removed while it ran and was reachable was never told (peers told a
    /// removed node their list only when they heard it again after it was unreachable), and a
    /// new node whose pull was answered before it heard any list (a frame overtaken) was
    /// synced with its full share under the new list.
    pub const MEMBERSHIP: [Scenario; 9] = [
        Scenario::Grow,
        Scenario::RemoveDead,
        Scenario::RemoveDeadDay,
        Scenario::Reweight,
        Scenario::FrozenRemoved,
        Scenario::Churn,
        Scenario::RemovedAlive,
        Scenario::GrowReordered,
        Scenario::Leave,
    ];

    /// Callers that wait for rights (`max_wait_ms`): run with `--set waiting`.
    pub const WAITING: [Scenario; 1] = [Scenario::BurstsWaiting];

    /// Every algorithm, with costs and refunds, over the classic worlds: run with `--set
    /// algorithms`.
    pub const ALGORITHMS: [Scenario; 7] = [
        Scenario::FixedCosts,
        Scenario::TokenBucket,
        Scenario::LeakyBucket,
        Scenario::SlidingWindow,
        Scenario::SlidingLog,
        Scenario::QuotaDay,
        Scenario::Mixed,
    ];

    /// Every scenario of every set.
    pub fn every() -> impl Iterator<Item = Scenario> {
        Scenario::ALL
            .into_iter()
            .chain(Scenario::DEMAND)
            .chain(Scenario::MEMBERSHIP)
            .chain(Scenario::WAITING)
            .chain(Scenario::ALGORITHMS)
    }

    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Steady => "steady",
            Scenario::Skewed => "skewed",
            Scenario::HotRegion => "hot-region",
            Scenario::Bursts => "bursts",
            Scenario::ManyKeys => "many-keys",
            Scenario::RegionIsolated => "region-isolated",
            Scenario::FullSplit => "full-split",
            Scenario::OneWay => "one-way",
            Scenario::Flapping => "flapping",
            Scenario::Crashes => "crashes",
            Scenario::Sporadic => "sporadic",
            Scenario::FollowTheSun => "follow-the-sun",
            Scenario::BackToBack => "back-to-back",
            Scenario::LightKeys => "light-keys",
            Scenario::Grow => "grow",
            Scenario::RemoveDead => "remove-dead",
            Scenario::RemoveDeadDay => "remove-dead-day",
            Scenario::Reweight => "reweight",
            Scenario::FrozenRemoved => "frozen-removed",
            Scenario::RemovedAlive => "removed-alive",
            Scenario::GrowReordered => "grow-reordered",
            Scenario::Churn => "churn",
            Scenario::Leave => "leave",
            Scenario::BurstsWaiting => "bursts-wait",
            Scenario::FixedCosts => "fixed-window",
            Scenario::TokenBucket => "token-bucket",
            Scenario::LeakyBucket => "leaky-bucket",
            Scenario::SlidingWindow => "sliding-window",
            Scenario::SlidingLog => "sliding-log",
            Scenario::QuotaDay => "quota-day",
            Scenario::Mixed => "mixed",
        }
    }

    /// The scenario with this command-line name.
    pub fn from_name(name: &str) -> Option<Scenario> {
        Scenario::every().find(|s| s.name() == name)
    }

    /// The scenario seed `seed` runs when none is named: seeds cycle through all of them.
    pub fn for_seed(seed: u64) -> Scenario {
        Scenario::for_seed_in(&Scenario::ALL, seed)
    }

    /// The scenario seed `seed` runs in a set of scenarios: seeds cycle through it.
    pub fn for_seed_in(set: &[Scenario], seed: u64) -> Scenario {
        set[(seed % set.len() as u64) as usize]
    }

    /// Whether the scenario cuts links.
    pub fn partitions(self) -> bool {
        matches!(
            self,
            Scenario::RegionIsolated | Scenario::FullSplit | Scenario::OneWay | Scenario::Flapping
        )
    }

    /// Whether the scenario changes the node list.
    pub fn membership(self) -> bool {
        Scenario::MEMBERSHIP.contains(&self)
    }

    /// Draws this scenario's world, faults and demand from `seed`.
    pub fn plan(self, seed: u64) -> RunPlan {
        if let Some(algo) = self.algo() {
            return self.plan_algorithm(algo, seed);
        }
        if self.membership() {
            return crate::changes::plan(self, seed);
        }
        if self == Scenario::BurstsWaiting {
            let mut plan = Scenario::Bursts.plan(seed);
            let rtt = plan
                .topology
                .one_way_ms
                .iter()
                .flatten()
                .max()
                .map_or(0, |&one_way| 2 * one_way);
            plan.scenario = self;
            plan.max_wait_ms = rtt + 2 * plan.protocol.gossip_interval;
            return plan;
        }
        let mut rng = SeededRng::stream(seed, "plan");
        let regions = match self {
            Scenario::RegionIsolated => rng.range(3, 4) as usize,
            Scenario::Skewed
            | Scenario::HotRegion
            | Scenario::FollowTheSun
            | Scenario::BackToBack => 3,
            _ => rng.range(2, 4) as usize,
        };
        let topology = random_topology(&mut rng, regions);
        let net = random_net(&mut rng);
        let protocol = ProtocolParams::default();
        let half = (protocol.max_clock_skew / 2) as i64;
        let offsets = (0..topology.nodes())
            .map(|_| rng.range_i64(-half, half))
            .collect();
        if Scenario::DEMAND.contains(&self) {
            let mut demand_rng = SeededRng::stream(seed, "demand");
            let d = match self {
                Scenario::Sporadic => demand::sporadic(&mut demand_rng, regions),
                Scenario::FollowTheSun => demand::follow_the_sun(&mut demand_rng, regions),
                Scenario::BackToBack => demand::back_to_back(&mut demand_rng, regions),
                _ => demand::light_keys(&mut demand_rng, regions),
            };
            let lists = vec![NodeList::initial(&topology)];
            return RunPlan {
                seed,
                scenario: self,
                topology,
                net,
                protocol,
                limit: d.limit,
                window_ms: d.window_ms,
                duration_ms: d.duration_ms,
                offsets,
                lists,
                faults: Vec::new(),
                episodes: Vec::new(),
                keys: d.keys,
                probe: None,
                requests: d.requests,
                max_wait_ms: 0,
                algo: crate::plan::Algo::FixedWindow,
                mixed: false,
            };
        }
        let limit = match self {
            Scenario::ManyKeys => rng.range(50, 150),
            _ => rng.range(100, 400),
        };
        let mut faults = Vec::new();
        let mut episodes = Vec::new();
        let mut duration_ms = 10_000;
        let partition = |rng: &mut SeededRng| {
            let start = rng.range(2_000, 3_000);
            let len = protocol.suspect_after + rng.range(3_000, 4_500);
            // Heal in the second half of a window, so that the probe key has demand in the
            // window of the heal (the shared counter's views only hold the current window).
            let heal = (start + len) / 1_000 * 1_000 + rng.range(500, 900);
            (start, heal)
        };
        match self {
            Scenario::RegionIsolated => {
                let (start, heal) = partition(&mut rng);
                let x = rng.index(regions);
                let rest: Vec<usize> = (0..regions).filter(|&r| r != x).collect();
                let pairs: Vec<(usize, usize)> =
                    rest.iter().flat_map(|&r| [(x, r), (r, x)]).collect();
                cut_between(&mut faults, &pairs, start, heal);
                episodes.push(Episode {
                    kind: EpisodeKind::Isolated,
                    start,
                    heal,
                    last_down: start,
                    cut: pairs,
                    sides: vec![vec![x], rest],
                });
                duration_ms = round_up(heal + 2_500);
            }
            Scenario::FullSplit => {
                let (start, heal) = partition(&mut rng);
                let pairs: Vec<(usize, usize)> = (0..regions)
                    .flat_map(|a| (0..regions).filter(move |&b| b != a).map(move |b| (a, b)))
                    .collect();
                cut_between(&mut faults, &pairs, start, heal);
                episodes.push(Episode {
                    kind: EpisodeKind::FullSplit,
                    start,
                    heal,
                    last_down: start,
                    cut: pairs,
                    sides: (0..regions).map(|r| vec![r]).collect(),
                });
                duration_ms = round_up(heal + 2_500);
            }
            Scenario::OneWay => {
                let (start, heal) = partition(&mut rng);
                let mut pairs = Vec::new();
                for _ in 0..rng.range(1, 2) {
                    let a = rng.index(regions);
                    let b = (a + 1 + rng.index(regions - 1)) % regions;
                    if !pairs.contains(&(a, b)) {
                        pairs.push((a, b));
                    }
                }
                cut_between(&mut faults, &pairs, start, heal);
                episodes.push(Episode {
                    kind: EpisodeKind::OneWay,
                    start,
                    heal,
                    last_down: start,
                    cut: pairs,
                    sides: vec![],
                });
                duration_ms = round_up(heal + 2_500);
            }
            Scenario::Flapping => {
                let a = rng.index(regions);
                let b = (a + 1 + rng.index(regions - 1)) % regions;
                let pairs = if rng.chance(0.5) {
                    vec![(a, b), (b, a)]
                } else {
                    vec![(a, b)]
                };
                let start = rng.range(2_000, 3_000);
                let mut t = start;
                let mut last_down = start;
                while t < start + 4_000 {
                    let down = rng.range(100, 1_500);
                    last_down = t;
                    cut_between(&mut faults, &pairs, t, t + down);
                    t += down + rng.range(100, 800);
                }
                let heal = faults.iter().map(|f| f.at).max().unwrap_or(start);
                episodes.push(Episode {
                    kind: EpisodeKind::Flapping,
                    start,
                    heal,
                    last_down,
                    cut: pairs,
                    sides: vec![],
                });
                duration_ms = round_up(heal + 2_500);
            }
            Scenario::Crashes => {
                let members = topology.members();
                for _ in 0..rng.range(1, 3) {
                    let at = rng.range(1_000, duration_ms - 3_500);
                    let down = rng.range(200, 3_000);
                    let nodes: Vec<usize> = if rng.chance(0.2) {
                        members[rng.index(regions)].clone()
                    } else {
                        vec![rng.index(topology.nodes())]
                    };
                    for node in nodes {
                        faults.push(Fault {
                            at,
                            kind: FaultKind::Crash { node },
                        });
                        faults.push(Fault {
                            at: at + down,
                            kind: FaultKind::Restart {
                                node,
                                offset: rng.range_i64(-half, half),
                            },
                        });
                    }
                }
            }
            _ => {}
        }
        let demand = match self {
            Scenario::Steady => Demand::Uniform {
                factor: 0.8 + 3.2 * rng.unit(),
            },
            Scenario::Skewed => Demand::Skewed {
                factor: 1.5 + 1.5 * rng.unit(),
                hot: rng.index(regions),
            },
            Scenario::HotRegion => Demand::HotMoves {
                factor: 1.5 + 1.5 * rng.unit(),
                every_ms: rng.range(2_000, 4_000),
            },
            Scenario::Bursts => Demand::Bursts {
                base: 0.3 + 0.5 * rng.unit(),
                bursts: rng.range(3, 8) as usize,
            },
            Scenario::ManyKeys => Demand::ManyKeys {
                keys: rng.range(20, 60) as usize,
                top_factor: 1.5 + 1.5 * rng.unit(),
            },
            _ if rng.chance(0.7) => Demand::Uniform {
                factor: 1.0 + 2.0 * rng.unit(),
            },
            _ => Demand::Skewed {
                factor: 1.5 + 1.5 * rng.unit(),
                hot: rng.index(regions),
            },
        };
        faults.sort_by_key(|f| f.at);
        let mut demand_rng = SeededRng::stream(seed, "demand");
        let (mut keys, mut requests) =
            workload::generate(&demand, &mut demand_rng, regions, limit, duration_ms);
        let probe = add_probe(
            &mut keys,
            &mut requests,
            &episodes,
            regions,
            &mut demand_rng,
        );
        let lists = vec![NodeList::initial(&topology)];
        RunPlan {
            seed,
            scenario: self,
            topology,
            net,
            protocol,
            limit,
            window_ms: WINDOW_MS,
            duration_ms,
            offsets,
            lists,
            faults,
            episodes,
            keys,
            probe,
            requests,
            max_wait_ms: 0,
            algo: crate::plan::Algo::FixedWindow,
            mixed: false,
        }
    }
}

pub(crate) fn round_up(ms: u64) -> u64 {
    ms.div_ceil(1_000) * 1_000
}

/// Regions with 1 to 3 nodes, usually equal weights, and a round trip of 30 to 300 ms
/// between every two regions (1 ms one way inside a region).
pub(crate) fn random_topology(rng: &mut SeededRng, regions: usize) -> Topology {
    let nodes_per_region = (0..regions).map(|_| rng.range(1, 3) as usize).collect();
    let weights = if rng.chance(0.25) {
        (0..regions).map(|_| rng.range(1, 3) as u32).collect()
    } else {
        vec![1; regions]
    };
    let mut one_way_ms = vec![vec![1; regions]; regions];
    let pairs: Vec<(usize, usize)> = (0..regions)
        .flat_map(|a| (a + 1..regions).map(move |b| (a, b)))
        .collect();
    for (a, b) in pairs {
        let rtt = rng.range(30, 300);
        one_way_ms[a][b] = rtt / 2;
        one_way_ms[b][a] = rtt - rtt / 2;
    }
    Topology {
        nodes_per_region,
        weights,
        one_way_ms,
    }
}

/// Jitter always; loss, duplication and reordering in about half the runs each.
pub(crate) fn random_net(rng: &mut SeededRng) -> NetParams {
    let mut maybe = |p: f64, max: f64| {
        if rng.chance(p) { max * rng.unit() } else { 0.0 }
    };
    let loss = maybe(0.5, 0.03);
    let duplicate = maybe(0.5, 0.03);
    let reorder = maybe(0.5, 0.05);
    NetParams {
        jitter_ms: rng.range(0, 10),
        loss,
        duplicate,
        reorder,
        reorder_ms: rng.range(5, 30),
    }
}

/// Cuts every pair at `from` and mends it at `to`.
pub(crate) fn cut_between(faults: &mut Vec<Fault>, pairs: &[(usize, usize)], from: u64, to: u64) {
    for &(a, b) in pairs {
        faults.push(Fault {
            at: from,
            kind: FaultKind::Cut { from: a, to: b },
        });
        faults.push(Fault {
            at: to,
            kind: FaultKind::Mend { from: a, to: b },
        });
    }
}

/// Adds the probe key: a little demand at every region while each partition lasts, none
/// from 300 ms before its heal on, so that the time its views take to agree after the heal
/// can be measured on a key whose state stops changing.
pub fn add_probe(
    keys: &mut Vec<String>,
    requests: &mut Vec<Request>,
    episodes: &[Episode],
    regions: usize,
    rng: &mut SeededRng,
) -> Option<u32> {
    if episodes.is_empty() {
        return None;
    }
    let probe = keys.len() as u32;
    keys.push("probe".to_owned());
    for e in episodes {
        for r in 0..regions {
            workload::poisson(
                rng,
                (e.start + 100, e.heal.saturating_sub(300)),
                20.0,
                r,
                probe,
                requests,
            );
        }
    }
    requests.sort_by_key(|r| r.at);
    Some(probe)
}

#[cfg(test)]
mod tests;
