//! The scenarios: a script of faults on a timeline, over steady overload from every region.
//!
//! Every scenario runs the same cluster (three regions of two nodes, strict mode) and the same
//! load: checks of the main key at [`MAIN_PER_SECOND_PER_NODE`] per node of each region —
//! 240/s in `eu`, 40/s in `us`, 120/s in `ap`, 400/s in all, 1.67 times the limit (still above
//! it with one `eu` node down) — and [`PROBE_PER_SECOND`] of the probe key per node. The skew
//! is deliberate: `us` has spare rights (its share is 80, its demand 40), so rights move
//! between regions all the time, and a partition between `ap` and the others must stop them
//! moving without either side going over its share; `eu`+`us` (demand 280) and `ap` (120)
//! both have the demand to use their whole shares (160 and 80). Times in a script are ms from
//! the origin, a window boundary at
//! which the load starts.

use crate::proxy::Faults;

/// `limit` of the per-window rule (divisible by the six nodes: every node's static split is
/// exactly 40, every region's share 80).
pub const LIMIT: u64 = 240;
/// Its window, ms.
pub const WINDOW_MS: u64 = 1_000;
/// The rule the main key is checked against.
pub const MAIN_RULE: &str = "per-second";
/// The rule of the probe key: a day-long window and a limit no probe reaches, so every probe
/// check is admitted and the key's views are comparable across nodes at any moment.
pub const PROBE_RULE: &str = "probe";
/// Main-key checks per second sent to every node of `eu`, `us` and `ap`.
pub const MAIN_PER_SECOND_PER_NODE: [f64; 3] = [120.0, 20.0, 60.0];
/// Probe-key checks per second sent to every node while probes run.
pub const PROBE_PER_SECOND: f64 = 4.0;
/// `cluster.gossip_interval`, ms.
pub const GOSSIP_INTERVAL_MS: u64 = 20;
/// `cluster.suspect_after`, ms.
pub const SUSPECT_AFTER_MS: u64 = 500;
/// Probes pause this long before a heal, so the probe key's state stops changing and "every
/// view is equal" has a moment at which it becomes true.
pub const PROBE_QUIET_MS: u64 = 300;

/// The rules every node runs.
pub const RULES: &str = r#"
[[rule]]
name = "per-second"
algorithm = "fixed_window"
limit = 240
window = "1s"

[[rule]]
name = "probe"
algorithm = "fixed_window"
limit = 1000000
window = "1d"
"#;

/// Which directed pairs of nodes a fault applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Links {
    /// Both directions between `region`'s nodes and every other region's: a symmetric
    /// partition of `region` from the rest.
    IsolateRegion(&'static str),
    /// Only what `region`'s nodes send to every other region: a one-way cut.
    OneWayFrom(&'static str),
    /// Every pair of nodes in different regions, both directions.
    InterRegion,
    /// Every pair of nodes, both directions.
    All,
}

/// One thing the script does.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Applies `faults` to `links` and opens a fault interval named `label`.
    Faults {
        /// Shown on the plot and in the report.
        label: &'static str,
        /// Where.
        links: Links,
        /// What.
        faults: Faults,
    },
    /// Heals every link, closes the fault intervals, and measures how long until every
    /// node's view of the probe key agrees (probes pause [`PROBE_QUIET_MS`] before).
    Heal,
    /// Measures agreement on the probe key while the faults stay in force.
    Settle,
    /// `kill -9` of a node.
    Kill9(&'static str),
    /// SIGTERM to a node; it must exit cleanly.
    Stop(&'static str),
    /// Starts a stopped or killed node on its own configuration and waits until it is ready
    /// and connected.
    Start(&'static str),
    /// Stop, then start (one step of a rolling restart).
    Restart(&'static str),
    /// Starts, on the addresses of the (stopped) node, a process holding a certificate of
    /// another CA and the node's configuration otherwise; watches for `for_ms` that no member
    /// takes it for the node; then stops it.
    Impostor {
        /// The node it poses as.
        node: &'static str,
        /// How long it runs, ms.
        for_ms: u64,
    },
}

/// An action at a time.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// ms from the origin (a step starts no earlier; steps run one after another).
    pub at_ms: u64,
    /// What.
    pub action: Action,
}

/// A scripted run.
#[derive(Debug, Clone, PartialEq)]
pub struct Scenario {
    /// The name on the command line and of the report files.
    pub name: &'static str,
    /// One sentence: what happens.
    pub summary: &'static str,
    /// How long the load runs, ms from the origin.
    pub duration_ms: u64,
    /// The script.
    pub steps: Vec<Step>,
    /// Test-only clock offsets (`--clock-offset-ms`) of nodes.
    pub clock_offsets: Vec<(&'static str, i64)>,
    /// The node that must own the main and the probe key in its region.
    pub owner: Option<&'static str>,
    /// Every main-key check gives this `max_wait_ms` (API.md "Waiting for rights"): the
    /// callers wait for rights instead of being denied while the cluster has room.
    pub max_wait_ms: Option<u64>,
}

fn step(at_ms: u64, action: Action) -> Step {
    Step { at_ms, action }
}

impl Scenario {
    /// `ap` cut off from `eu` and `us` (both directions) for 5 s, then healed.
    pub fn region_partition() -> Scenario {
        Scenario {
            name: "region-partition",
            summary: "ap partitioned from eu and us for 5.1 s, then healed",
            duration_ms: 12_000,
            steps: vec![
                step(
                    2_200,
                    Action::Faults {
                        label: "ap partitioned",
                        links: Links::IsolateRegion("ap"),
                        faults: Faults::cut(),
                    },
                ),
                step(7_300, Action::Heal),
            ],
            clock_offsets: Vec::new(),
            owner: None,
            max_wait_ms: None,
        }
    }

    /// The CI version of [`Scenario::region_partition`]: 8 s of load, a 4.1 s partition (two
    /// windows wholly inside it).
    pub fn region_partition_short() -> Scenario {
        Scenario {
            name: "region-partition-short",
            summary: "ap partitioned from eu and us for 4.1 s, then healed (CI)",
            duration_ms: 8_000,
            steps: vec![
                step(
                    1_200,
                    Action::Faults {
                        label: "ap partitioned",
                        links: Links::IsolateRegion("ap"),
                        faults: Faults::cut(),
                    },
                ),
                step(5_300, Action::Heal),
            ],
            clock_offsets: Vec::new(),
            owner: None,
            max_wait_ms: None,
        }
    }

    /// [`Scenario::region_partition_short`] with callers that wait up to 200 ms for rights
    /// (`max_wait_ms`): every invariant holds as when they are answered at once, and waiting
    /// checks are answered within their wait.
    pub fn waiting_callers() -> Scenario {
        Scenario {
            name: "waiting-callers",
            summary: "as region-partition-short, every main-key check willing to wait 200 ms for rights",
            max_wait_ms: Some(200),
            ..Scenario::region_partition_short()
        }
    }

    /// Everything `ap` sends to `eu` and `us` is dropped for 5 s; what they send to it arrives.
    pub fn one_way_cut() -> Scenario {
        Scenario {
            name: "one-way-cut",
            summary: "ap's datagrams to eu and us dropped for 5.1 s (theirs to ap delivered), then healed",
            duration_ms: 12_000,
            steps: vec![
                step(
                    2_200,
                    Action::Faults {
                        label: "ap -> eu,us cut",
                        links: Links::OneWayFrom("ap"),
                        faults: Faults::cut(),
                    },
                ),
                step(7_300, Action::Heal),
            ],
            clock_offsets: Vec::new(),
            owner: None,
            max_wait_ms: None,
        }
    }

    /// `kill -9` of the keys' owner in `eu`, restarted 3 s later.
    pub fn kill_owner() -> Scenario {
        Scenario {
            name: "kill-owner",
            summary: "kill -9 of eu-1, the keys' owner in eu, restarted 3 s later",
            duration_ms: 12_000,
            steps: vec![
                step(3_000, Action::Kill9("eu-1")),
                step(6_000, Action::Start("eu-1")),
            ],
            clock_offsets: Vec::new(),
            owner: Some("eu-1"),
            max_wait_ms: None,
        }
    }

    /// Both nodes of `eu` restarted one after the other (SIGTERM, start, wait until ready).
    pub fn rolling_restart() -> Scenario {
        Scenario {
            name: "rolling-restart",
            summary: "rolling restart of eu: eu-1, then eu-2 (SIGTERM, start, ready)",
            duration_ms: 13_000,
            steps: vec![
                step(2_500, Action::Restart("eu-1")),
                step(6_500, Action::Restart("eu-2")),
            ],
            clock_offsets: Vec::new(),
            owner: Some("eu-1"),
            max_wait_ms: None,
        }
    }

    /// `eu-1`, owner of the keys, runs 400 ms ahead (max_clock_skew is 500 ms).
    pub fn clock_skew() -> Scenario {
        Scenario {
            name: "clock-skew",
            summary: "eu-1 (the keys' owner in eu) runs its clock 400 ms ahead",
            duration_ms: 10_000,
            steps: Vec::new(),
            clock_offsets: vec![("eu-1", 400)],
            owner: Some("eu-1"),
            max_wait_ms: None,
        }
    }

    /// 20 % of every datagram between any two nodes lost, in both directions, for 7 s.
    pub fn loss() -> Scenario {
        Scenario {
            name: "loss-20",
            summary: "20 % of datagrams on every link lost for 7 s, then healed",
            duration_ms: 12_000,
            steps: vec![
                step(
                    2_000,
                    Action::Faults {
                        label: "20 % loss",
                        links: Links::All,
                        faults: Faults::loss(0.2),
                    },
                ),
                step(9_000, Action::Heal),
            ],
            clock_offsets: Vec::new(),
            owner: None,
            max_wait_ms: None,
        }
    }

    /// 300 ms round trip between regions (150 ms each way, ±10 ms jitter).
    pub fn latency() -> Scenario {
        Scenario {
            name: "latency-300ms",
            summary: "300 ms RTT between regions (150 ms each way + up to 10 ms jitter)",
            duration_ms: 12_000,
            steps: vec![
                step(
                    0,
                    Action::Faults {
                        label: "300 ms RTT",
                        links: Links::InterRegion,
                        faults: Faults::latency(150, 10),
                    },
                ),
                step(7_000, Action::Settle),
                step(10_000, Action::Heal),
            ],
            clock_offsets: Vec::new(),
            owner: None,
            max_wait_ms: None,
        }
    }

    /// Duplication, reordering and jitter on every link.
    pub fn duplication_reordering() -> Scenario {
        Scenario {
            name: "dup-reorder",
            summary: "every link: 10 % duplicated, 25 % held back 40 ms, 5 ms + up to 10 ms jitter",
            duration_ms: 11_000,
            steps: vec![
                step(
                    1_500,
                    Action::Faults {
                        label: "dup + reorder",
                        links: Links::All,
                        faults: Faults {
                            delay_ms: 5,
                            jitter_ms: 10,
                            duplicate: 0.1,
                            reorder: 0.25,
                            reorder_ms: 40,
                            ..Faults::NONE
                        },
                    },
                ),
                step(8_500, Action::Heal),
            ],
            clock_offsets: Vec::new(),
            owner: None,
            max_wait_ms: None,
        }
    }

    /// A process with a certificate of another CA poses as `eu-2` for 4 s.
    pub fn foreign_certificate() -> Scenario {
        Scenario {
            name: "foreign-cert",
            summary: "eu-2 stopped; an impostor with a foreign CA's certificate runs as eu-2 for 4 s; eu-2 back",
            duration_ms: 12_000,
            steps: vec![
                step(1_500, Action::Stop("eu-2")),
                step(
                    2_000,
                    Action::Impostor {
                        node: "eu-2",
                        for_ms: 4_000,
                    },
                ),
                step(7_000, Action::Start("eu-2")),
            ],
            clock_offsets: Vec::new(),
            owner: None,
            max_wait_ms: None,
        }
    }

    /// The whole suite, in order.
    pub fn all() -> Vec<Scenario> {
        vec![
            Scenario::region_partition(),
            Scenario::one_way_cut(),
            Scenario::kill_owner(),
            Scenario::rolling_restart(),
            Scenario::clock_skew(),
            Scenario::loss(),
            Scenario::latency(),
            Scenario::duplication_reordering(),
            Scenario::foreign_certificate(),
            Scenario::waiting_callers(),
        ]
    }

    /// The scenario named `name` (the suite's and the short one).
    pub fn by_name(name: &str) -> Option<Scenario> {
        Scenario::all()
            .into_iter()
            .chain([Scenario::region_partition_short()])
            .find(|s| s.name == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_script_fits_its_load_and_names_are_unique() {
        let all: Vec<Scenario> = Scenario::all()
            .into_iter()
            .chain([Scenario::region_partition_short()])
            .collect();
        let mut names: Vec<&str> = all.iter().map(|s| s.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), all.len());
        for s in &all {
            assert!(
                s.steps.windows(2).all(|w| w[0].at_ms <= w[1].at_ms),
                "{}",
                s.name
            );
            assert!(
                s.steps.iter().all(|st| st.at_ms < s.duration_ms),
                "{}",
                s.name
            );
        }
        assert_eq!(LIMIT % 6, 0, "every node's split is exact");
    }
}
