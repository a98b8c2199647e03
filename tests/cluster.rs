//! Multi-region clusters of real `levee serve` processes on loopback, talking real QUIC with
//! mutual TLS: three regions (`eu`, `us`, `ap`) of two nodes each, laid out with
//! `LocalCluster::write` the way `levee cluster` does. The tests overload a key from every
//! node, skew demand 90/5/5 over the regions, `kill -9` a key's owner, cut a region off with
//! SIGSTOP and heal it with SIGCONT, start an impostor whose certificate comes from another CA,
//! and feed a node malformed, oversized and wrong-version frames.
//!
//! The tests of this file run one at a time (a process-wide lock held by the cluster handle):
//! each one starts six nodes and drives them hard, and its figures should be about the
//! cluster, not about the machine's scheduler juggling several clusters at once.
//!
//! ## Attributing a decision to a window
//!
//! The server decides by its own clock, at some instant between the moment the client sent
//! the request and the moment it received the answer; client and server read the same machine
//! clock (`SystemTime`, ms since the Unix epoch). An allowed `fixed_window` decision answers
//! `reset_after_ms = end of its window − now`, so its window ends at `now + reset_after_ms`
//! with `now` in `[sent_ms, received_ms]`: the window's end is the one multiple of the window
//! length in `[sent_ms + reset_after_ms, received_ms + reset_after_ms]`. That names the window
//! of every admission whose round trip is shorter than a window, including requests sent in
//! one window and answered in the next. An admission whose interval holds two window ends (a
//! round trip longer than a window) is *straddling*: it is left out of the per-window counts
//! and counted separately; one whose interval holds none contradicts the clock and is counted
//! as *unattributable* (the tests require none). Where the client's own clock already puts the
//! whole round trip inside one window, the two attributions must agree (*disagreements*: none).
//! Denials only show that demand exceeded the limit; they are attributed by the client's clock
//! alone (round trip inside one window) and straddling ones are counted separately.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use levee_blackbox::cluster::{
    Attribution, Cluster, ClusterSpec, View, attribute, decide as decide_check, reachable_of,
};
use levee_blackbox::{Reply, agent, levee_binary, metric, wait_until};
use levee_node::local_cluster::{Listed, LocalNode};
use serde_json::{Value, json};

/// `cluster.gossip_interval` of every test cluster.
const GOSSIP_INTERVAL_MS: u64 = 20;
/// `cluster.suspect_after` of every test cluster.
const SUSPECT_AFTER_MS: u64 = 500;
/// The regions, in order; node ids are `<region>-1` and `<region>-2`.
const REGIONS: [&str; 3] = ["eu", "us", "ap"];
/// Nodes in every region.
const NODES_PER_REGION: usize = 2;
/// How long a whole cluster may take to be ready and to see every peer; and a restarted node
/// to be ready.
const READY_TIMEOUT: Duration = Duration::from_secs(20);

/// The rules every node runs.
const RULES: &str = r#"
[[rule]]
name = "per-second"
algorithm = "fixed_window"
limit = 200
window = "1s"

[[rule]]
name = "daily"
algorithm = "fixed_window"
limit = 600
window = "1d"

[[rule]]
name = "durable"
algorithm = "fixed_window"
limit = 1000000
window = "1d"
"#;
/// `limit` of `per-second`.
const PER_SECOND_LIMIT: u64 = 200;
/// The window of `per-second`, in ms.
const SECOND_MS: u64 = 1_000;
/// `limit` of `daily`.
const DAILY_LIMIT: u64 = 600;
/// The window of `daily` and `durable`, in ms.
const DAY_MS: u64 = 86_400_000;

// ---------------------------------------------------------------------------------------------
// The cluster harness
// ---------------------------------------------------------------------------------------------

/// One cluster test at a time (see the module docs).
fn one_cluster_at_a_time() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Milliseconds since the Unix epoch, the clock the nodes decide by.
fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("the clock is after 1970")
        .as_millis() as u64
}

fn now_ms_f64() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("the clock is after 1970")
        .as_secs_f64()
        * 1_000.0
}

/// Sleeps until the wall clock reads `due_ms`.
fn sleep_until_ms(due_ms: f64) {
    loop {
        let now = now_ms_f64();
        if now >= due_ms {
            return;
        }
        std::thread::sleep(Duration::from_secs_f64(
            ((due_ms - now) / 1_000.0).min(0.05),
        ));
    }
}

/// A few ms after the start of the next window of `window_ms`.
fn next_window_start(window_ms: u64) -> u64 {
    (now_ms() / window_ms + 1) * window_ms + 5
}

/// If the current window of `window_ms` ends within `margin_ms`, waits until the next one has
/// begun: a test that counts in a day-long window must not see it roll over.
fn avoid_window_edge(window_ms: u64, margin_ms: u64) {
    let left = window_ms - now_ms() % window_ms;
    if left < margin_ms {
        std::thread::sleep(Duration::from_millis(left + 100));
    }
}

fn new_agent() -> ureq::Agent {
    agent(Duration::from_secs(5))
}

/// A running local cluster of three regions of two `levee serve` processes each: the black-box
/// harness's [`Cluster`] (which stops every process on drop, prints the nodes' log tails and
/// keeps the cluster's files when the test is failing, and leaves a watchdog that kills the
/// nodes should the test process die), held one test at a time, with the panicking helpers
/// the tests read best with.
struct LocalClusterHandle {
    c: Cluster,
    _one_at_a_time: MutexGuard<'static, ()>,
}

impl LocalClusterHandle {
    /// A strict-mode cluster running [`RULES`], every node ready and seeing every peer.
    fn start() -> LocalClusterHandle {
        LocalClusterHandle::start_layout(&REGIONS, NODES_PER_REGION, None)
    }

    /// [`LocalClusterHandle::start`] of `regions` × `per_region` nodes, of which only
    /// `initial` (by index, in list order) are listed and started (`None`: every node).
    fn start_layout(
        regions: &[&str],
        per_region: usize,
        initial: Option<Vec<usize>>,
    ) -> LocalClusterHandle {
        LocalClusterHandle::start_spec(regions, per_region, |spec| spec.initial = initial)
    }

    /// [`LocalClusterHandle::start`] of `regions` × `per_region` nodes, with `tweak` applied
    /// to the cluster's specification.
    fn start_spec(
        regions: &[&str],
        per_region: usize,
        tweak: impl FnOnce(&mut ClusterSpec),
    ) -> LocalClusterHandle {
        let guard = one_cluster_at_a_time();
        let mut spec = ClusterSpec::new(levee_binary(), regions, per_region, RULES);
        tweak(&mut spec);
        spec.gossip_interval_ms = GOSSIP_INTERVAL_MS;
        spec.suspect_after_ms = SUSPECT_AFTER_MS;
        spec.ready_timeout = READY_TIMEOUT;
        spec.restart_ready_timeout = READY_TIMEOUT;
        let c = Cluster::start(&spec).unwrap_or_else(|e| panic!("{e}"));
        LocalClusterHandle {
            c,
            _one_at_a_time: guard,
        }
    }

    fn dir(&self) -> &Path {
        self.c.dir()
    }

    fn len(&self) -> usize {
        self.c.len()
    }

    /// The index of node `id`.
    fn idx(&self, id: &str) -> usize {
        self.c.idx(id).unwrap_or_else(|| panic!("no node {id}"))
    }

    fn id(&self, i: usize) -> &str {
        self.c.id(i)
    }

    /// The nodes of `region`.
    fn region(&self, region: &str) -> Vec<usize> {
        self.c.nodes_in(region)
    }

    fn node(&self, i: usize) -> &LocalNode {
        self.c.node(i)
    }

    // ---- processes ----

    /// Starts node `i` on `config` (its own, or an impostor's), logging to its log file.
    fn spawn(&mut self, i: usize, config: &Path) {
        self.c.spawn(i, config).unwrap_or_else(|e| panic!("{e}"));
    }

    /// Waits (until `deadline`) for node `i` to answer `/readyz` with 200; `Err` with the
    /// tail of its log if it exits first or the deadline passes.
    fn wait_ready(&mut self, i: usize, deadline: Instant) -> Result<(), String> {
        self.c.wait_ready(i, deadline)
    }

    /// Waits until every running node has dialled every other running node (and completed the
    /// `Hello` exchange) and sees every peer and every region reachable.
    fn wait_fully_connected(&self, timeout: Duration) {
        self.c
            .wait_fully_connected(timeout)
            .unwrap_or_else(|e| panic!("{e}"));
    }

    /// Freezes node `i` (SIGSTOP): its sockets stay open, it answers nothing.
    fn sigstop(&self, i: usize) {
        self.c.signal(i, "STOP").unwrap_or_else(|e| panic!("{e}"));
    }

    /// Thaws node `i` (SIGCONT).
    fn sigcont(&self, i: usize) {
        self.c.signal(i, "CONT").unwrap_or_else(|e| panic!("{e}"));
    }

    /// `kill -9` node `i`, and reaps it.
    fn kill9(&mut self, i: usize) {
        self.c.kill9(i).unwrap_or_else(|e| panic!("{e}"));
    }

    /// Stops node `i` with SIGTERM and waits for it (SIGKILL after a bound); nothing if it is
    /// not running.
    fn stop(&mut self, i: usize) {
        self.c.stop(i);
    }

    /// Stops (if running) and starts node `i` again on its own configuration, ports and data
    /// directory, and waits until it is ready.
    ///
    /// Then waits until every other running node has dialled the new process (their old
    /// connections to the previous one count for nothing) and every node is fully connected.
    fn restart(&mut self, i: usize) {
        self.c.stop(i);
        self.c.start_node(i).unwrap_or_else(|e| panic!("{e}"));
    }

    /// Starts node `i` (not running) on its configuration and waits until it is ready, every
    /// running node has dialled it and every node is fully connected.
    fn start_node(&mut self, i: usize) {
        self.c.start_node(i).unwrap_or_else(|e| panic!("{e}"));
    }

    /// Writes the node list `list` (node index, removed) into every node's configuration,
    /// sends `nodes` SIGHUP, and waits until each of them runs it and sees it agreed (every
    /// running node of the list runs it too) — or, with `agreed` false, only runs it.
    fn change_list(&mut self, list: &[(usize, bool)], nodes: &[usize], agreed: bool) {
        let list: Vec<Listed> = list
            .iter()
            .map(|&(node, removed)| Listed { node, removed })
            .collect();
        self.c.set_list(&list).unwrap_or_else(|e| panic!("{e}"));
        let before: Vec<Value> = nodes.iter().map(|&i| self.membership(i)).collect();
        for &i in nodes {
            self.c.signal(i, "HUP").unwrap_or_else(|e| panic!("{e}"));
        }
        let ok = wait_until(READY_TIMEOUT, || {
            nodes.iter().zip(&before).all(|(&i, was)| {
                let m = self.membership(i);
                m["digest"] != was["digest"] && (!agreed || m["agreed"] == true)
            })
        });
        assert!(
            ok,
            "the nodes did not take the list {list:?} (agreed: {agreed}) within {READY_TIMEOUT:?}: {:?}",
            nodes
                .iter()
                .map(|&i| (self.id(i), self.membership(i)))
                .collect::<Vec<_>>()
        );
    }

    /// Waits until every node of `nodes` sees its list agreed and decides by it alone (no
    /// other list bounds its shares), all with one digest.
    fn wait_agreed(&self, nodes: &[usize]) {
        let mut last: Vec<Value> = Vec::new();
        let ok = wait_until(READY_TIMEOUT, || {
            last = nodes.iter().map(|&i| self.membership(i)).collect();
            last.iter()
                .all(|m| m["agreed"] == true && m["bounded"] == false)
                && last.windows(2).all(|w| w[0]["digest"] == w[1]["digest"])
        });
        assert!(
            ok,
            "the nodes do not agree on one list within {READY_TIMEOUT:?}: {last:?}"
        );
    }

    /// `POST /admin/leave` on node `i`; asserts it left (`200`, `"left": true`, holding
    /// nothing).
    fn leave(&self, i: usize) {
        let r = self
            .c
            .post(i, "/admin/leave?wait_ms=4000", "")
            .unwrap_or_else(|e| panic!("leave on {}: no answer ({e})", self.id(i)));
        assert!(
            r.status == 200 && r.json["left"] == true && r.json["holding"] == 0,
            "{} did not leave: {r:?}",
            self.id(i)
        );
    }

    /// `membership` of node `i`'s `/v1/cluster`.
    fn membership(&self, i: usize) -> Value {
        self.status(i)["membership"].clone()
    }

    /// The impostor of node `i` (see [`Cluster::write_impostor`]): its configuration's path.
    fn write_impostor(&self, i: usize) -> std::path::PathBuf {
        self.c.write_impostor(i).unwrap_or_else(|e| panic!("{e}"))
    }

    // ---- HTTP ----

    fn url(&self, i: usize, path: &str) -> String {
        self.c.url(i, path)
    }

    /// `GET path` on node `i`; panics (with the node's log) if it does not answer.
    fn get(&self, i: usize, path: &str) -> Reply {
        self.c.get(i, path).unwrap_or_else(|e| {
            panic!(
                "GET {path} on {}: no answer ({e}); log:\n{}",
                self.id(i),
                self.c.log_tail(i, 30)
            )
        })
    }

    /// `POST /v1/check` of one unit of `rule`/`key` on node `i`; asserts a 200.
    fn check(&self, i: usize, rule: &str, key: &str) -> Reply {
        let body = json!({ "rule": rule, "key": key }).to_string();
        let r = self
            .c
            .post(i, "/v1/check", &body)
            .unwrap_or_else(|e| panic!("check on {}: no answer ({e})", self.id(i)));
        assert_eq!(r.status, 200, "check on {}: {r:?}", self.id(i));
        r
    }

    /// `n` checks on node `i`; asserts that every one is allowed.
    fn admit(&self, i: usize, rule: &str, key: &str, n: u64) {
        for k in 0..n {
            let r = self.check(i, rule, key);
            assert!(
                r.allowed(),
                "check {k} of {n} on {} is allowed: {}",
                self.id(i),
                r.body
            );
        }
    }

    /// `n` checks on node `i`, each retried after the `retry_after_ms` of its denials (up to
    /// 20 times, each at most a second): asserts that every one is admitted. (A node that
    /// joined during a long window holds no share of it until the next: what it admits in
    /// this one are rights its peers hand it when it asks, see docs/membership.md.)
    fn admit_retrying(&self, i: usize, rule: &str, key: &str, n: u64) {
        for k in 0..n {
            let mut last = String::new();
            let admitted = (0..=20).any(|_| {
                let r = self.check(i, rule, key);
                if r.allowed() {
                    return true;
                }
                let retry = r.json["retry_after_ms"].as_u64().unwrap_or(u64::MAX);
                assert!(
                    retry <= 1_000,
                    "check {k} of {n} on {} denied with a long retry_after_ms: {}",
                    self.id(i),
                    r.body
                );
                std::thread::sleep(Duration::from_millis(retry.max(1)));
                last = r.body;
                false
            });
            assert!(
                admitted,
                "check {k} of {n} on {} is admitted within 20 retries: {last}",
                self.id(i)
            );
        }
    }

    /// `rounds` rounds of one check on every node of `nodes` in turn, so that every region's
    /// demand shows at once; returns how many were admitted. (In strict mode a region that
    /// sees demand only after another region's burst may hold no rights for the key yet.)
    fn admit_round_robin(&self, nodes: &[usize], rule: &str, key: &str, rounds: u64) -> u64 {
        let mut admitted = 0;
        for _ in 0..rounds {
            for &n in nodes {
                if self.check(n, rule, key).allowed() {
                    admitted += 1;
                }
            }
        }
        admitted
    }

    /// `GET /v1/usage/{rule}/{key}` on node `i`; asserts a 200.
    /// The owner of `rule/key` in `eu` (index and id, as the first eu node names it) and the
    /// other eu node.
    fn owner_in_eu(&self, rule: &str, key: &str) -> (usize, String, usize) {
        let eu = self.region("eu");
        let owner_id = self.usage(eu[0], rule, key)["owner"]
            .as_str()
            .expect("usage names the owner")
            .to_owned();
        let owner = self.idx(&owner_id);
        let mate = *eu.iter().find(|&&n| n != owner).expect("two eu nodes");
        (owner, owner_id, mate)
    }

    fn usage(&self, i: usize, rule: &str, key: &str) -> Value {
        self.c
            .usage(i, rule, key)
            .unwrap_or_else(|e| panic!("{e}; log:\n{}", self.c.log_tail(i, 30)))
    }

    fn used(&self, i: usize, rule: &str, key: &str) -> u64 {
        self.view(i, rule, key).used
    }

    /// Node `i`'s view of `rule`/`key`; panics unless it has one.
    fn view(&self, i: usize, rule: &str, key: &str) -> View {
        let u = self.usage(i, rule, key);
        View::of(&u).unwrap_or_else(|| panic!("no integer used in {u}"))
    }

    /// `GET /v1/cluster` on node `i`; asserts a 200.
    fn status(&self, i: usize) -> Value {
        self.c
            .status(i)
            .unwrap_or_else(|e| panic!("{e}; log:\n{}", self.c.log_tail(i, 30)))
    }

    /// `GET /metrics` on node `i`; asserts a 200.
    fn metrics(&self, i: usize) -> String {
        self.c
            .metrics(i)
            .unwrap_or_else(|e| panic!("{e}; log:\n{}", self.c.log_tail(i, 30)))
    }

    /// Waits until every node of `nodes` reports the same `used` and per-region figures for
    /// `rule`/`key`, and `accept` holds for that view; returns it, or panics after `timeout`.
    fn wait_agreement(
        &self,
        nodes: &[usize],
        rule: &str,
        key: &str,
        timeout: Duration,
        accept: impl Fn(&View) -> bool,
    ) -> View {
        let mut last = Vec::new();
        let ok = wait_until(timeout, || {
            last = nodes.iter().map(|&i| self.view(i, rule, key)).collect();
            last.windows(2).all(|w| w[0] == w[1]) && accept(&last[0])
        });
        assert!(
            ok,
            "{rule}/{key}: the nodes {:?} do not agree on an acceptable view within {timeout:?}: {last:?}",
            nodes.iter().map(|&i| self.id(i)).collect::<Vec<_>>()
        );
        last.swap_remove(0)
    }
}

// ---------------------------------------------------------------------------------------------
// Load and accounting
// ---------------------------------------------------------------------------------------------

/// One client stream: checks sent to `node` at a steady `per_second`.
#[derive(Debug, Clone, Copy)]
struct Demand {
    node: usize,
    per_second: f64,
}

/// What one check got.
#[derive(Debug, Clone)]
enum Answer {
    Decided {
        allowed: bool,
        degraded: bool,
        reset_after_ms: u64,
    },
    /// No answer, or not a 200 decision.
    Failed(String),
}

/// One check as the client saw it.
#[derive(Debug, Clone)]
struct Sample {
    node: usize,
    sent_ms: u64,
    received_ms: u64,
    answer: Answer,
}

impl Sample {
    fn allowed(&self) -> bool {
        matches!(self.answer, Answer::Decided { allowed: true, .. })
    }
}

fn decide(agent: &ureq::Agent, url: &str, body: &str) -> Answer {
    match decide_check(agent, url, body) {
        Ok(d) => Answer::Decided {
            allowed: d.allowed,
            degraded: d.degraded,
            reset_after_ms: d.reset_after_ms,
        },
        Err(e) => Answer::Failed(e),
    }
}

/// How long a check may wait for its answer before its stream sends late: each stream spreads
/// its schedule over enough threads ("lanes") that a lane has this long per check, so the
/// demand the servers see is the schedule even while some answers are slow (a slow answer
/// delays only its own lane, and only once it takes longer than this).
const LANE_PATIENCE_MS: f64 = 400.0;

/// Runs every stream of `demand` from `start_ms` for `duration_ms`, each sending
/// `per_second × duration` checks on a fixed schedule (streams are phase-shifted so they do not
/// fire together). A stream's checks go round-robin over its lanes (see [`LANE_PATIENCE_MS`]),
/// which share one connection pool. Returns every sample.
fn run_load(
    c: &LocalClusterHandle,
    rule: &str,
    key: &str,
    demand: &[Demand],
    start_ms: u64,
    duration_ms: u64,
) -> Vec<Sample> {
    let urls: Vec<String> = demand.iter().map(|d| c.url(d.node, "/v1/check")).collect();
    run_load_at(&urls, rule, key, demand, start_ms, duration_ms)
}

/// [`run_load`] with every stream's URL given (`urls[i]` for `demand[i]`), so that it can
/// run on a thread of its own while the test changes the cluster.
fn run_load_at(
    urls: &[String],
    rule: &str,
    key: &str,
    demand: &[Demand],
    start_ms: u64,
    duration_ms: u64,
) -> Vec<Sample> {
    let body = json!({ "rule": rule, "key": key }).to_string();
    let streams = demand.len() as f64;
    std::thread::scope(|s| {
        let mut threads = Vec::new();
        for (i, d) in demand.iter().enumerate() {
            let url = urls[i].clone();
            let agent = new_agent();
            let interval = 1_000.0 / d.per_second;
            let n = (d.per_second * duration_ms as f64 / 1_000.0).round() as u64;
            let phase = i as f64 / streams;
            let lanes = ((LANE_PATIENCE_MS / interval).ceil() as u64).clamp(1, n.max(1));
            for lane in 0..lanes {
                let (url, body, agent, node) = (url.clone(), body.as_str(), agent.clone(), d.node);
                threads.push(s.spawn(move || {
                    let mut out = Vec::new();
                    for k in (lane..n).step_by(lanes as usize) {
                        sleep_until_ms(start_ms as f64 + (phase + k as f64) * interval);
                        let sent_ms = now_ms();
                        let answer = decide(&agent, &url, body);
                        out.push(Sample {
                            node,
                            sent_ms,
                            received_ms: now_ms(),
                            answer,
                        });
                    }
                    out
                }));
            }
        }
        threads
            .into_iter()
            .flat_map(|t| t.join().expect("a load thread panicked"))
            .collect()
    })
}

/// Checks sent one after another to `url` until `stop` is set.
fn load_until(node: usize, url: &str, body: &str, stop: &AtomicBool) -> Vec<Sample> {
    let agent = new_agent();
    let mut out = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let sent_ms = now_ms();
        let answer = decide(&agent, url, body);
        out.push(Sample {
            node,
            sent_ms,
            received_ms: now_ms(),
            answer,
        });
        std::thread::sleep(Duration::from_millis(1));
    }
    out
}

/// Counts in one window.
#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    /// Checks sent in the window (by the client's clock): the demand a central counter sees.
    sent: u64,
    /// Admissions decided in the window.
    admitted: u64,
    /// Denials decided in the window.
    denied: u64,
    /// The longest a check sent in the window waited for its answer, in ms.
    slowest_ms: u64,
}

/// Admissions and denials per window (see the module docs).
#[derive(Debug, Default)]
struct Accounting {
    window_ms: u64,
    windows: BTreeMap<u64, Tally>,
    admitted_straddling: u64,
    denied_straddling: u64,
    unattributable: u64,
    disagreements: u64,
    failed: Vec<String>,
}

fn account(samples: &[Sample], window_ms: u64) -> Accounting {
    let mut a = Accounting {
        window_ms,
        ..Accounting::default()
    };
    for s in samples {
        let sent_in = a.windows.entry(s.sent_ms / window_ms).or_default();
        sent_in.sent += 1;
        sent_in.slowest_ms = sent_in.slowest_ms.max(s.received_ms - s.sent_ms);
        let same_window = s.sent_ms / window_ms == s.received_ms / window_ms;
        match &s.answer {
            Answer::Failed(e) => a.failed.push(e.clone()),
            Answer::Decided {
                allowed: true,
                reset_after_ms,
                ..
            } => {
                // The window ends at `decided_at + reset_after_ms`, decided_at in [sent, received].
                match attribute(
                    s.sent_ms as i64,
                    s.received_ms as i64,
                    *reset_after_ms,
                    window_ms,
                ) {
                    Attribution::Unattributable => a.unattributable += 1,
                    Attribution::Straddling => a.admitted_straddling += 1,
                    Attribution::Window(w) => {
                        let w = w as u64;
                        if same_window && s.sent_ms / window_ms != w {
                            a.disagreements += 1;
                        }
                        a.windows.entry(w).or_default().admitted += 1;
                    }
                }
            }
            Answer::Decided { allowed: false, .. } => {
                if same_window {
                    a.windows.entry(s.sent_ms / window_ms).or_default().denied += 1;
                } else {
                    a.denied_straddling += 1;
                }
            }
        }
    }
    a
}

impl Accounting {
    fn tally(&self, w: u64) -> Tally {
        self.windows.get(&w).copied().unwrap_or_default()
    }

    /// A table of the windows `first..first + n` for the test's output.
    fn table(&self, first: u64, n: u64, limit: u64) -> String {
        let mut out = format!(
            "window (x{} ms)  sent  admitted  denied  admitted/limit  slowest answer\n",
            self.window_ms
        );
        for w in first..first + n {
            let t = self.tally(w);
            out.push_str(&format!(
                "{w:>15}  {:>4}  {:>8}  {:>6}  {:>13.1}%  {:>11} ms\n",
                t.sent,
                t.admitted,
                t.denied,
                100.0 * t.admitted as f64 / limit as f64,
                t.slowest_ms
            ));
        }
        out.push_str(&format!(
            "straddling admissions {}, straddling denials {}, unattributable {}, disagreements {}, failed {}",
            self.admitted_straddling,
            self.denied_straddling,
            self.unattributable,
            self.disagreements,
            self.failed.len()
        ));
        out
    }

    /// Asserts that every check was answered and every admission was attributed consistently.
    #[track_caller]
    fn assert_clean(&self) {
        assert!(
            self.failed.is_empty(),
            "{} checks got no decision, e.g. {:?}",
            self.failed.len(),
            self.failed.first()
        );
        assert_eq!(
            self.unattributable, 0,
            "admissions whose reset_after_ms names no window they could have been decided in"
        );
        assert_eq!(
            self.disagreements, 0,
            "admissions whose reset_after_ms contradicts the window the client saw them in"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// The tests
// ---------------------------------------------------------------------------------------------

/// A key overloaded from all six nodes at six times its limit: in strict mode, no window ever
/// admits more than the limit.
#[test]
fn strict_mode_never_admits_more_than_the_limit_per_window_when_every_node_overloads_a_key() {
    let c = LocalClusterHandle::start();
    let (rule, key) = ("per-second", "hammered");
    // Two streams per node at 100 checks per second: 1,200 per second, six times the limit.
    let demand: Vec<Demand> = (0..c.len())
        .flat_map(|node| {
            [Demand {
                node,
                per_second: 100.0,
            }; 2]
        })
        .collect();
    let windows = 6;
    let start = next_window_start(SECOND_MS);
    let samples = run_load(&c, rule, key, &demand, start, windows * SECOND_MS);
    let a = account(&samples, SECOND_MS);
    let first = start / SECOND_MS;
    eprintln!(
        "strict overload, limit {PER_SECOND_LIMIT} per window:\n{}",
        a.table(first, windows, PER_SECOND_LIMIT)
    );
    a.assert_clean();
    let mut admitted = 0;
    for w in first..first + windows {
        let t = a.tally(w);
        assert!(
            t.admitted <= PER_SECOND_LIMIT,
            "window {w} admitted {} > the limit {PER_SECOND_LIMIT}:\n{}",
            t.admitted,
            a.table(first, windows, PER_SECOND_LIMIT)
        );
        // The demand really was over the limit in every window (else the bound proves nothing).
        assert!(
            t.denied > 0 && t.sent > 2 * PER_SECOND_LIMIT,
            "window {w} was not overloaded: {t:?}"
        );
        admitted += t.admitted;
    }
    assert!(admitted > 0, "nothing was admitted at all");
    let by_node: Vec<String> = (0..c.len())
        .map(|n| {
            let mine = samples.iter().filter(|s| s.node == n);
            let admitted = mine.clone().filter(|s| s.allowed()).count();
            format!("{} {admitted}/{}", c.id(n), mine.count())
        })
        .collect();
    eprintln!("admitted/sent by node: {}", by_node.join(", "));
}

/// Demand split 90/5/5 over the regions at twice the limit: from the third window on, every
/// window admits at least 97 % of what a central counter would (the limit).
#[test]
fn skewed_demand_admits_at_least_97_percent_of_a_central_counter_from_the_third_window() {
    let c = LocalClusterHandle::start();
    let (rule, key) = ("per-second", "skewed");
    // 400 checks per second in all: eu 360 (two streams per node at 90/s), us 20 and ap 20
    // (one stream per node at 10/s).
    let mut demand = Vec::new();
    for n in c.region("eu") {
        demand.extend(
            [Demand {
                node: n,
                per_second: 90.0,
            }; 2],
        );
    }
    for n in c.region("us").into_iter().chain(c.region("ap")) {
        demand.push(Demand {
            node: n,
            per_second: 10.0,
        });
    }
    let windows = 8;
    let start = next_window_start(SECOND_MS);
    let samples = run_load(&c, rule, key, &demand, start, windows * SECOND_MS);
    let a = account(&samples, SECOND_MS);
    let first = start / SECOND_MS;
    eprintln!(
        "90/5/5 at twice the limit of {PER_SECOND_LIMIT}:\n{}",
        a.table(first, windows, PER_SECOND_LIMIT)
    );
    a.assert_clean();
    // Each region's part of the load, for the message of a failing window.
    let by_region_tables = || {
        REGIONS
            .iter()
            .map(|r| {
                let nodes = c.region(r);
                let theirs: Vec<Sample> = samples
                    .iter()
                    .filter(|s| nodes.contains(&s.node))
                    .cloned()
                    .collect();
                let t = account(&theirs, SECOND_MS).table(first, windows, PER_SECOND_LIMIT);
                format!("{r}:\n{t}")
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    let mut total = 0.0;
    for w in first + 2..first + windows {
        let t = a.tally(w);
        // A central exact counter, first come first served, admits min(demand, limit).
        let reference = t.sent.min(PER_SECOND_LIMIT);
        let utilisation = t.admitted as f64 / reference as f64;
        total += utilisation;
        assert!(
            t.sent >= PER_SECOND_LIMIT,
            "window {w}: the load generator fell behind ({} sent)",
            t.sent
        );
        assert!(
            t.admitted <= PER_SECOND_LIMIT,
            "window {w} admitted {} > the limit",
            t.admitted
        );
        assert!(
            utilisation >= 0.97,
            "window {w} admitted {} of a central counter's {reference} ({:.1} % < 97 %):\n{}\nby region:\n{}",
            t.admitted,
            100.0 * utilisation,
            a.table(first, windows, PER_SECOND_LIMIT),
            by_region_tables()
        );
    }
    let by_region: Vec<String> = REGIONS
        .iter()
        .map(|r| {
            let nodes = c.region(r);
            let of = |s: &&Sample| nodes.contains(&s.node);
            let sent = samples.iter().filter(of).count();
            let admitted = samples.iter().filter(of).filter(|s| s.allowed()).count();
            format!("{r} {admitted}/{sent}")
        })
        .collect();
    eprintln!(
        "average utilisation from the third window on: {:.1} %; admitted/sent by region: {}",
        100.0 * total / (windows - 2) as f64,
        by_region.join(", ")
    );
}

/// `kill -9` of a key's owner: the other node of its region takes the key over, and the key's
/// usage loses nothing older than the last gossip interval; a restart of the killed node
/// loses nothing either.
#[test]
fn kill_9_of_a_keys_owner_hands_the_key_over_without_resetting_its_usage() {
    avoid_window_edge(DAY_MS, 60_000);
    let mut c = LocalClusterHandle::start();
    let (rule, key) = ("durable", "tenant-kill-9");
    let (owner, owner_id, survivor) = c.owner_in_eu(rule, key);
    let survivor_id = c.id(survivor).to_owned();
    assert_eq!(
        c.usage(survivor, rule, key)["owner"],
        owner_id,
        "both eu nodes agree on the owner"
    );

    // Quiet usage first: everything gossiped long before the kill must survive it exactly.
    c.admit(owner, rule, key, 100);
    c.admit(survivor, rule, key, 100); // forwarded to the owner
    let quiet: u64 = 200;
    let all: Vec<usize> = (0..c.len()).collect();
    c.wait_agreement(&all, rule, key, Duration::from_secs(3), |v| v.used == quiet);

    // Then a client keeps checking through the survivor (forwarded to the owner) while the
    // owner is killed, and goes on after the survivor has taken the key over.
    let url = c.url(survivor, "/v1/check");
    let body = json!({ "rule": rule, "key": key }).to_string();
    let stop = AtomicBool::new(false);
    let (samples, killed_at_ms, takeover) = std::thread::scope(|s| {
        let client = s.spawn(|| load_until(survivor, &url, &body, &stop));
        std::thread::sleep(Duration::from_millis(700));
        let killed_at_ms = now_ms();
        let killed = Instant::now();
        c.kill9(owner);
        let took_over = wait_until(Duration::from_secs(5), || {
            c.usage(survivor, rule, key)["owner"] == survivor_id.as_str()
        });
        let takeover = killed.elapsed();
        // A while longer as the new owner.
        std::thread::sleep(Duration::from_millis(500));
        stop.store(true, Ordering::Relaxed);
        let samples = client.join().expect("the client thread");
        assert!(
            took_over,
            "{survivor_id} did not take {key} over from the killed {owner_id} within 5 s"
        );
        (samples, killed_at_ms, takeover)
    });
    let failed: Vec<&Sample> = samples
        .iter()
        .filter(|s| matches!(s.answer, Answer::Failed(_)))
        .collect();
    assert!(
        failed.is_empty(),
        "{survivor_id} failed to answer {} checks, e.g. {:?}",
        failed.len(),
        failed.first()
    );
    let admitted = samples.iter().filter(|s| s.allowed()).count() as u64;
    let before_kill = samples
        .iter()
        .filter(|s| s.allowed() && s.received_ms < killed_at_ms)
        .count();
    let degraded = samples
        .iter()
        .filter(|s| matches!(s.answer, Answer::Decided { degraded: true, .. }))
        .count();
    // Decisions the owner may have made after its last gossip: at most those answered within
    // the last 250 ms before the kill (12 gossip intervals: generous, for a loaded machine),
    // plus the one in flight.
    let recent = samples
        .iter()
        .filter(|s| s.allowed() && s.sent_ms <= killed_at_ms && s.received_ms + 250 >= killed_at_ms)
        .count() as u64;
    let last = samples.last().expect("some checks were sent");
    // The survivor owns the key now, but only because its owner is unreachable: the owner's
    // rights are out of its reach, so its answers say they are degraded (issue #12, item 11).
    assert!(
        matches!(last.answer, Answer::Decided { degraded: true, .. }),
        "after the takeover {survivor_id} decides alone, degraded: {last:?}"
    );

    // Every surviving node agrees on the key's usage, and it lost at most the last interval.
    let survivors: Vec<usize> = (0..c.len()).filter(|&n| n != owner).collect();
    let seen = c.wait_agreement(&survivors, rule, key, Duration::from_secs(3), |_| true);
    let counted = quiet + admitted;
    let lost = counted.saturating_sub(seen.used);
    eprintln!(
        "kill -9 of {owner_id}: usage {quiet} before the load; {admitted} admitted under load \
         ({before_kill} answered before the kill, {degraded} degraded); {survivor_id} took over \
         after {takeover:?}; usage after {} (lost {lost}; admitted in the last 250 ms before the \
         kill: {recent})",
        seen.used
    );
    assert!(
        seen.used >= quiet,
        "the usage gossiped long before the kill was reset: {} < {quiet}",
        seen.used
    );
    assert!(
        lost <= recent,
        "lost {lost} admissions, more than the {recent} answered in the last 250 ms before the kill"
    );
    assert!(
        seen.used <= counted + 1,
        "usage {} is more than the {counted} admissions (plus one in flight)",
        seen.used
    );

    // The killed node comes back: it pulls the state it had gossiped and counts on from there.
    c.restart(owner);
    let before_restart = seen.used;
    let after_restart = c.used(owner, rule, key);
    assert!(
        after_restart >= before_restart,
        "{owner_id} restarted with usage {after_restart} < {before_restart}"
    );
    c.admit(owner, rule, key, 50);
    let final_view = c.wait_agreement(&all, rule, key, Duration::from_secs(3), |v| {
        v.used >= before_restart + 50
    });
    eprintln!(
        "after restarting {owner_id}: usage {after_restart} on it, {} everywhere after 50 more",
        final_view.used
    );
    assert!(
        final_view.used <= before_restart + 50 + lost,
        "usage {} after the restart is more than the {} admitted",
        final_view.used,
        before_restart + 50 + lost
    );
}

/// A key's owner stopped gracefully (SIGTERM) while its region-mate forwards it checks under
/// load: nothing it admitted is lost, not even while it is down. Its last decisions reach the
/// peers before it exits (it stops deciding forwarded checks, flushes its deltas and waits for
/// their acknowledgement), and the ones forwarded while it closes are decided by the forwarder.
#[test]
fn sigterm_of_a_keys_owner_under_forwarded_load_loses_nothing_even_while_it_is_down() {
    avoid_window_edge(DAY_MS, 60_000);
    let mut c = LocalClusterHandle::start();
    let (rule, key) = ("durable", "tenant-sigterm");
    let (owner, owner_id, mate) = c.owner_in_eu(rule, key);
    let all: Vec<usize> = (0..c.len()).collect();
    let survivors: Vec<usize> = all.iter().copied().filter(|&n| n != owner).collect();
    let url = c.url(mate, "/v1/check");
    let body = json!({ "rule": rule, "key": key }).to_string();
    let mut admitted = 0u64;
    let mut degraded = 0u64;
    // Three stops, each under the load of four clients of the mate (forwarded to the owner).
    for round in 0..3 {
        let stop = AtomicBool::new(false);
        let samples: Vec<Sample> = std::thread::scope(|s| {
            let clients: Vec<_> = (0..4)
                .map(|_| s.spawn(|| load_until(mate, &url, &body, &stop)))
                .collect();
            std::thread::sleep(Duration::from_millis(400));
            c.stop(owner);
            std::thread::sleep(Duration::from_millis(200));
            stop.store(true, Ordering::Relaxed);
            clients
                .into_iter()
                .flat_map(|t| t.join().expect("a client thread"))
                .collect()
        });
        let failed = samples
            .iter()
            .filter(|s| matches!(s.answer, Answer::Failed(_)))
            .count();
        assert_eq!(failed, 0, "round {round}: {} failed checks", failed);
        admitted += samples.iter().filter(|s| s.allowed()).count() as u64;
        degraded += samples
            .iter()
            .filter(|s| {
                matches!(
                    s.answer,
                    Answer::Decided {
                        allowed: true,
                        degraded: true,
                        ..
                    }
                )
            })
            .count() as u64;
        // While the owner is down, the others already count everything it admitted.
        let seen = c.wait_agreement(&survivors, rule, key, Duration::from_secs(3), |v| {
            v.used >= admitted
        });
        eprintln!(
            "round {round}: {owner_id} stopped under load; {admitted} admitted so far ({degraded} \
             decided by {} alone); the others count {} while it is down",
            c.id(mate),
            seen.used
        );
        c.restart(owner);
        c.wait_agreement(&all, rule, key, Duration::from_secs(3), |v| {
            v.used >= admitted
        });
    }
    // More than admitted only by a forward answered too late, then decided again by the mate
    // (degraded): every count spends a right, never fewer than were granted.
    let end = c.wait_agreement(&all, rule, key, Duration::from_secs(3), |_| true);
    assert!(
        end.used <= admitted + degraded,
        "usage {} is more than {admitted} admitted + {degraded} decided again by the mate",
        end.used
    );
}

/// One region cut off (both its nodes frozen with SIGSTOP): the other regions keep answering,
/// degraded, within their caps; after the heal every node's view agrees again, and the global
/// limit held throughout.
#[test]
fn a_region_cut_off_leaves_the_others_answering_degraded_and_views_converge_after_the_heal() {
    avoid_window_edge(DAY_MS, 60_000);
    let c = LocalClusterHandle::start();
    let (rule, key) = ("daily", "tenant-cut");
    let all: Vec<usize> = (0..c.len()).collect();
    // Some usage in every region before the cut: 15 rounds of a check on every node.
    let before = c.admit_round_robin(&all, rule, key, 15);
    let start_view = c.wait_agreement(&all, rule, key, Duration::from_secs(3), |v| {
        v.used == before
    });
    for region in REGIONS {
        assert!(
            start_view.regions[region].as_u64().is_some_and(|u| u > 0),
            "every region has usage before the cut: {start_view:?}"
        );
    }
    let used_by = |regions: &[&str]| -> u64 {
        regions
            .iter()
            .map(|r| start_view.regions[*r].as_u64().unwrap_or(0))
            .sum()
    };

    let ap = c.region("ap");
    let reachable: Vec<usize> = all.iter().copied().filter(|n| !ap.contains(n)).collect();
    for &n in &ap {
        c.sigstop(n);
    }
    let cut = Instant::now();
    let noticed = wait_until(Duration::from_secs(5), || {
        reachable
            .iter()
            .all(|&n| reachable_of(&c.status(n)["regions"], "ap") == Some(false))
    });
    assert!(noticed, "the other regions did not notice ap was cut off");
    let noticed_after = cut.elapsed();

    // Every node of eu and us overloads the key: 4 × 150 checks per second for 1.5 s, 900
    // checks, far more than what eu and us hold.
    let demand: Vec<Demand> = reachable
        .iter()
        .map(|&node| Demand {
            node,
            per_second: 150.0,
        })
        .collect();
    let samples = run_load(&c, rule, key, &demand, now_ms() + 10, 1_500);
    let failed: Vec<&Sample> = samples
        .iter()
        .filter(|s| matches!(s.answer, Answer::Failed(_)))
        .collect();
    assert!(
        failed.is_empty(),
        "eu and us stopped answering during the cut: {} failures, e.g. {:?}",
        failed.len(),
        failed.first()
    );
    let not_degraded = samples
        .iter()
        .filter(|s| {
            matches!(
                s.answer,
                Answer::Decided {
                    degraded: false,
                    ..
                }
            )
        })
        .count();
    assert_eq!(
        not_degraded, 0,
        "every decision during the cut is made under a conservative cap (degraded: true)"
    );
    let admitted_cut = samples.iter().filter(|s| s.allowed()).count() as u64;
    let denied_cut = samples.len() as u64 - admitted_cut;
    assert!(denied_cut > 0, "the demand exceeded what eu and us hold");
    assert!(
        before + admitted_cut <= DAILY_LIMIT,
        "admitted {admitted_cut} during the cut on top of {before}: over the limit {DAILY_LIMIT}"
    );
    // eu and us hold their static shares (2/3 of the limit) less what they used before.
    let side_left = (DAILY_LIMIT * 2 / 3).saturating_sub(used_by(&["eu", "us"]));
    let expected = c.wait_agreement(&reachable, rule, key, Duration::from_secs(3), |v| {
        v.used == before + admitted_cut
    });

    // Heal, and time how long until all six nodes agree.
    for &n in &ap {
        c.sigcont(n);
    }
    let healed = Instant::now();
    let mut views = Vec::new();
    let mut converged = None;
    while healed.elapsed() < Duration::from_secs(3) {
        views = all
            .iter()
            .map(|&n| c.view(n, rule, key))
            .collect::<Vec<_>>();
        if views.iter().all(|v| *v == expected) {
            converged = Some(healed.elapsed());
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    eprintln!(
        "cut: ap unreachable noticed after {noticed_after:?}; eu+us admitted {admitted_cut} of \
         {} checks during the cut ({:.1} % of the {side_left} left of their share); views \
         converged {converged:?} after SIGCONT (gossip interval {GOSSIP_INTERVAL_MS} ms)",
        samples.len(),
        100.0 * admitted_cut as f64 / side_left as f64
    );
    assert!(
        converged.is_some(),
        "the views did not converge within 3 s of the heal: expected {expected:?}, got {views:?}"
    );

    // The cut-off region kept its rights: now everyone overloads the key, and the global
    // total still never passes the limit.
    c.wait_fully_connected(Duration::from_secs(5));
    let demand: Vec<Demand> = all
        .iter()
        .map(|&node| Demand {
            node,
            per_second: 100.0,
        })
        .collect();
    let samples = run_load(&c, rule, key, &demand, now_ms() + 10, 1_000);
    assert!(
        samples
            .iter()
            .all(|s| matches!(s.answer, Answer::Decided { .. })),
        "every node answers after the heal"
    );
    let admitted_after = samples.iter().filter(|s| s.allowed()).count() as u64;
    let total = before + admitted_cut + admitted_after;
    let ap_after = samples
        .iter()
        .filter(|s| s.allowed() && ap.contains(&s.node))
        .count();
    eprintln!(
        "after the heal: {admitted_after} more admitted ({ap_after} by ap); {total} of {DAILY_LIMIT} in all"
    );
    assert!(
        total <= DAILY_LIMIT,
        "{total} admitted in the window, over the limit {DAILY_LIMIT}"
    );
    c.wait_agreement(&all, rule, key, Duration::from_secs(3), |v| v.used == total);
}

/// A node holding a certificate from another CA, posing as `eu-2` on `eu-2`'s addresses with
/// `eu-2`'s cluster configuration: it cannot join, and nothing it counts reaches the cluster.
#[test]
fn a_node_with_a_certificate_from_another_ca_cannot_join_and_changes_nothing() {
    avoid_window_edge(DAY_MS, 60_000);
    let mut c = LocalClusterHandle::start();
    let rule = "durable";
    let eu2 = c.idx("eu-2");
    // A key that the real eu-2 owns, so that its own counter entry is in the cluster's state.
    let key = (0..1_000)
        .map(|i| format!("impostor-{i}"))
        .find(|k| c.usage(eu2, rule, k)["owner"] == "eu-2")
        .expect("some key is owned by eu-2");
    c.admit(eu2, rule, &key, 40);
    let all: Vec<usize> = (0..c.len()).collect();
    let real = c.wait_agreement(&all, rule, &key, Duration::from_secs(3), |v| v.used == 40);

    // The real eu-2 goes away; the others notice.
    c.stop(eu2);
    let others: Vec<usize> = all.iter().copied().filter(|&n| n != eu2).collect();
    assert!(
        wait_until(Duration::from_secs(5), || others.iter().all(
            |&n| reachable_of(&c.status(n)["peers"], "eu-2") == Some(false)
        )),
        "the others did not notice eu-2 stopped"
    );

    // The impostor: a CA of its own, a certificate for eu-2 from it, and otherwise eu-2's
    // configuration (same addresses, same peers), with a data directory of its own.
    let rogue_path = c.write_impostor(eu2);

    let refused = |c: &LocalClusterHandle| -> f64 {
        others
            .iter()
            .map(|&n| {
                metric(
                    &c.metrics(n),
                    "levee_transport_handshakes_refused_total",
                    &[],
                )
                .unwrap_or(0.0)
            })
            .sum()
    };
    let refused_before = refused(&c);
    c.spawn(eu2, &rogue_path);
    // Alone, it becomes ready once it has waited `suspect_after` for peers that never answer.
    if let Err(e) = c.wait_ready(eu2, Instant::now() + Duration::from_secs(10)) {
        panic!("the impostor did not start: {e}");
    }

    // The impostor counts the key on its own (as eu-2, the key's owner in eu) while the real
    // nodes are watched: they never see eu-2 reachable, and their usage of the key never moves.
    let mut rogue_admitted = 0;
    let watch_until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < watch_until {
        for _ in 0..20 {
            if c.check(eu2, rule, &key).allowed() {
                rogue_admitted += 1;
            }
        }
        for &n in &others {
            let s = c.status(n);
            assert_eq!(
                reachable_of(&s["peers"], "eu-2"),
                Some(false),
                "{} sees the impostor as a reachable eu-2: {s}",
                c.id(n)
            );
            let u = c.view(n, rule, &key);
            assert_eq!(u, real, "{} changed the key's usage", c.id(n));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let rogue_used = c.used(eu2, rule, &key);
    let rogue_status = c.status(eu2);
    let refused_after = refused(&c);
    eprintln!(
        "impostor eu-2: admitted {rogue_admitted}, its own usage {rogue_used}; the real nodes \
         refused {} TLS handshakes meanwhile and kept usage {}; impostor's peers: {}",
        refused_after - refused_before,
        real.used,
        rogue_status["peers"]
    );
    assert!(
        rogue_admitted > 0 && rogue_used >= rogue_admitted,
        "the impostor counted something that would have changed the cluster had it got in"
    );
    assert!(
        refused_after > refused_before,
        "the real nodes refused the impostor's handshakes (counted)"
    );
    assert!(
        !rogue_status["peers"]
            .as_array()
            .expect("peers")
            .iter()
            .any(|p| p["reachable"] == true),
        "the impostor reached no peer: {rogue_status}"
    );

    // The real eu-2 comes back: the cluster never saw the impostor's counts.
    c.stop(eu2);
    c.restart(eu2);
    c.wait_agreement(&all, rule, &key, Duration::from_secs(3), |v| *v == real);
}

/// Frames a node must refuse, each on its own unidirectional stream after a proper `Hello`.
fn bad_frames() -> Vec<(&'static str, Vec<u8>)> {
    use levee_proto::{HEADER_BYTES, MAX_FRAME_BYTES, Message, VERSION, encode_frame};
    let valid = encode_frame(&Message::PullRequest).expect("encode a frame");
    let mut wrong_version = valid.clone();
    wrong_version[0] = VERSION + 1;
    let mut oversized = vec![VERSION];
    oversized.extend_from_slice(&(MAX_FRAME_BYTES as u32 + 1).to_le_bytes());
    oversized.extend(std::iter::repeat_n(0u8, 64 << 10));
    let mut garbage = vec![VERSION];
    garbage.extend_from_slice(&16u32.to_le_bytes());
    garbage.extend([0xff; 16]);
    let mut left_over = valid.clone();
    left_over.push(0);
    let len = (left_over.len() - HEADER_BYTES) as u32;
    left_over[1..HEADER_BYTES].copy_from_slice(&len.to_le_bytes());
    let mut truncated = vec![VERSION];
    truncated.extend_from_slice(&64u32.to_le_bytes());
    truncated.extend([0u8; 8]);
    vec![
        ("version", wrong_version),
        ("size", oversized),
        ("corrupted", garbage),
        ("corrupted", left_over),
        ("truncated", truncated),
    ]
}

/// Writes `bytes` on a new unidirectional stream and finishes it; the peer may stop the stream
/// before it has read everything (that is what refusing a frame does), so write errors are
/// expected. Returns how the peer ended the stream: `Some(code)` if it stopped it.
async fn send_uni(conn: &quinn::Connection, bytes: &[u8]) -> Result<Option<u64>, String> {
    let mut send = conn.open_uni().await.map_err(|e| e.to_string())?;
    let _ = send.write_all(bytes).await;
    let _ = send.finish();
    match tokio::time::timeout(Duration::from_secs(5), send.stopped()).await {
        Ok(Ok(code)) => Ok(code.map(|c| c.into_inner())),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("the stream was neither acknowledged nor stopped within 5 s".into()),
    }
}

/// A malformed, an oversized, a wrong-version and a truncated frame from an authenticated
/// peer: each is refused and counted, the connection and the node stay up, and the node keeps
/// gossiping with its peers. A connection whose first frame is garbage is closed.
#[test]
fn malformed_oversized_and_wrong_version_frames_are_refused_counted_and_the_node_stays_up() {
    use levee_proto::{Hello, Message, encode_frame};
    use levee_transport::TlsFiles;

    let c = LocalClusterHandle::start();
    let target = c.idx("eu-1");
    let target_id = c.id(target).to_owned();
    let addr: SocketAddr = c.node(target).gossip;
    // A certificate of the cluster's CA for a prober that is no node of the replica list: the
    // transport authenticates it, and nothing it sends can be mistaken for a real peer's.
    let certs = c.dir().join("certs");
    let prober = c.dir().join("prober");
    std::fs::create_dir_all(&prober).expect("the prober's directory");
    levee_transport::certs::issue(&certs, "prober", &prober).expect("issue the prober's cert");
    let files = TlsFiles {
        ca: certs.join(levee_transport::certs::CA_CERT_FILE),
        cert: prober.join("prober.pem"),
        key: prober.join("prober.key"),
    };
    let digest = levee_node::Config::load(&c.node(target).config)
        .expect("the node's configuration")
        .replicas
        .digest();
    let hello = encode_frame(&Message::Hello(Hello {
        node: "prober".into(),
        replica_digest: digest,
        incarnation: now_ms(),
    }))
    .expect("encode the Hello");

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let client_config =
        levee_transport::tls::client_config(&files).expect("the prober's TLS configuration");
    let endpoint = rt
        .block_on(async { quinn::Endpoint::client(SocketAddr::from(([127, 0, 0, 1], 0))) })
        .expect("a QUIC client endpoint");

    // Connect and say Hello; the node answers with its own.
    let conn = rt.block_on(async {
        let conn = endpoint
            .connect_with(client_config.clone(), addr, &target_id)
            .expect("dial the node")
            .await
            .expect("the TLS handshake with a cluster certificate succeeds");
        send_uni(&conn, &hello).await.expect("send the Hello");
        let mut theirs = tokio::time::timeout(Duration::from_secs(5), conn.accept_uni())
            .await
            .expect("the node's Hello in time")
            .expect("the node's Hello stream");
        let bytes = theirs
            .read_to_end(1 << 16)
            .await
            .expect("read the node's Hello");
        match levee_proto::decode_frame(&bytes).expect("the node's Hello decodes") {
            Message::Hello(h) => assert_eq!(h.node, target_id),
            other => panic!("the node opened with {other:?}"),
        }
        conn
    });
    assert!(
        wait_until(Duration::from_secs(5), || metric(
            &c.metrics(target),
            "levee_transport_connections_total",
            &[("peer", "prober"), ("direction", "inbound")]
        )
        .is_some_and(|v| v >= 1.0)),
        "the node accepted the prober's Hello"
    );

    // The bad frames, one stream each; then a valid frame on the same connection.
    let stops: Vec<(&str, Result<Option<u64>, String>)> = rt.block_on(async {
        let mut out = Vec::new();
        for (kind, frame) in bad_frames() {
            out.push((kind, send_uni(&conn, &frame).await));
        }
        out
    });
    let after = rt.block_on(send_uni(&conn, &hello));
    eprintln!(
        "bad frames, how the node ended each stream: {stops:?}; a Hello after them: {after:?}"
    );
    assert!(
        conn.close_reason().is_none(),
        "the node kept the connection: {:?}",
        conn.close_reason()
    );
    let refused = |kind: &str| {
        metric(
            &c.metrics(target),
            "levee_frames_refused_total",
            &[("kind", kind), ("peer", "prober")],
        )
        .unwrap_or(0.0)
    };
    let counted = wait_until(Duration::from_secs(5), || {
        refused("version") >= 1.0
            && refused("size") >= 1.0
            && refused("corrupted") >= 2.0
            && refused("truncated") >= 1.0
    });
    let text = c.metrics(target);
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("levee_frames_refused_total") || l.contains("prober"))
        .collect();
    eprintln!("{}", lines.join("\n"));
    assert!(
        counted,
        "every refused frame is counted by kind: version {}, size {}, corrupted {}, truncated {}",
        refused("version"),
        refused("size"),
        refused("corrupted"),
        refused("truncated")
    );
    // The valid frame sent after the refused ones was read: the connection still works.
    assert!(
        wait_until(Duration::from_secs(5), || metric(
            &c.metrics(target),
            "levee_transport_frames_received_total",
            &[("peer", "prober")]
        )
        .is_some_and(|v| v >= 1.0)),
        "the node still reads the prober's connection after refusing its frames"
    );

    // A connection whose first frame is garbage instead of a Hello is closed, and counted.
    let hello_refused = |c: &LocalClusterHandle| {
        metric(
            &c.metrics(target),
            "levee_transport_hello_refused_total",
            &[("reason", "protocol")],
        )
        .unwrap_or(0.0)
    };
    let hello_refused_before = hello_refused(&c);
    let closed = rt.block_on(async {
        let conn = endpoint
            .connect_with(client_config.clone(), addr, &target_id)
            .expect("dial the node")
            .await
            .expect("the TLS handshake with a cluster certificate succeeds");
        let _ = send_uni(&conn, &bad_frames()[2].1).await;
        tokio::time::timeout(Duration::from_secs(5), conn.closed()).await
    });
    match closed {
        Ok(quinn::ConnectionError::ApplicationClosed(close)) => assert_eq!(
            close.error_code.into_inner(),
            3,
            "closed as `no valid Hello`: {close:?}"
        ),
        other => panic!("a connection opening with garbage is closed by the node: {other:?}"),
    }
    assert!(
        wait_until(Duration::from_secs(5), || hello_refused(&c)
            > hello_refused_before),
        "the refused Hello is counted"
    );

    // The node still answers, still decides, and still gossips with every peer.
    assert_eq!(c.get(target, "/healthz").status, 200);
    c.admit(target, "durable", "after-bad-frames", 7);
    let all: Vec<usize> = (0..c.len()).collect();
    c.wait_agreement(
        &all,
        "durable",
        "after-bad-frames",
        Duration::from_secs(3),
        |v| v.used == 7,
    );
    for _ in 0..5 {
        c.wait_fully_connected(Duration::from_secs(2));
        std::thread::sleep(Duration::from_millis(200));
    }

    rt.block_on(async {
        conn.close(0u32.into(), b"done");
        let _ = tokio::time::timeout(Duration::from_secs(2), endpoint.wait_idle()).await;
    });
}

// ---------------------------------------------------------------------------------------------
// Membership changes while the cluster runs (issue #15)
// ---------------------------------------------------------------------------------------------

/// One stream of `per_second` checks at each node of `nodes`: their URLs and demand.
fn streams(c: &LocalClusterHandle, nodes: &[usize], per_second: f64) -> (Vec<String>, Vec<Demand>) {
    let demand = nodes
        .iter()
        .map(|&node| Demand { node, per_second })
        .collect();
    (
        nodes.iter().map(|&n| c.url(n, "/v1/check")).collect(),
        demand,
    )
}

/// `per_second` checks of `rule`/`key` at each node of `nodes` from `from_ms` to `until_ms`
/// (nothing if that is already past), on a thread of its own.
fn load_in_background(
    c: &LocalClusterHandle,
    nodes: &[usize],
    (rule, key): (&'static str, &'static str),
    per_second: f64,
    from_ms: u64,
    until_ms: u64,
) -> std::thread::JoinHandle<Vec<Sample>> {
    let (urls, demand) = streams(c, nodes, per_second);
    std::thread::spawn(move || {
        run_load_at(
            &urls,
            rule,
            key,
            &demand,
            from_ms,
            until_ms.saturating_sub(from_ms),
        )
    })
}

/// Waits for the last load of `loads` to end; it stays in `loads`, done.
fn finish_load(loads: &mut Vec<std::thread::JoinHandle<Vec<Sample>>>) {
    if let Some(last) = loads.pop() {
        let samples = last.join().expect("a load thread panicked");
        loads.push(std::thread::spawn(move || samples));
    }
}

/// Waits for every load of `loads` and accounts its samples in `per-second` windows from the
/// one starting at `start_ms`: the samples, the accounting, the first window and its table of
/// `windows` windows.
fn finish_loads(
    loads: Vec<std::thread::JoinHandle<Vec<Sample>>>,
    start_ms: u64,
    windows: u64,
) -> (Vec<Sample>, Accounting, u64, String) {
    let samples: Vec<Sample> = loads
        .into_iter()
        .flat_map(|l| l.join().expect("a load thread panicked"))
        .collect();
    let a = account(&samples, SECOND_MS);
    let first = start_ms / SECOND_MS;
    let table = a.table(first, windows, PER_SECOND_LIMIT);
    (samples, a, first, table)
}

/// Admissions per window and node (by the client's clock), for a failing test's output.
fn admitted_by_node(c: &LocalClusterHandle, samples: &[Sample], window_ms: u64) -> String {
    let mut windows: BTreeMap<u64, BTreeMap<usize, u64>> = BTreeMap::new();
    for s in samples.iter().filter(|s| s.allowed()) {
        *windows
            .entry(s.sent_ms / window_ms)
            .or_default()
            .entry(s.node)
            .or_default() += 1;
    }
    windows
        .iter()
        .map(|(w, nodes)| {
            let row: Vec<String> = nodes
                .iter()
                .map(|(n, k)| format!("{} {k}", c.id(*n)))
                .collect();
            format!("{w}: {}\n", row.join(", "))
        })
        .collect()
}

/// [`load_in_background`] from `from_ms`, one window at a time, until `until_ms` (ms; read
/// at the start of every window) is reached.
fn load_windows_in_background(
    c: &LocalClusterHandle,
    nodes: &[usize],
    (rule, key): (&'static str, &'static str),
    per_second: f64,
    from_ms: u64,
    until_ms: std::sync::Arc<AtomicU64>,
) -> std::thread::JoinHandle<Vec<Sample>> {
    let (urls, demand) = streams(c, nodes, per_second);
    std::thread::spawn(move || {
        let mut samples = Vec::new();
        let mut at = from_ms;
        while at < until_ms.load(Ordering::Relaxed) {
            samples.extend(run_load_at(&urls, rule, key, &demand, at, SECOND_MS));
            at += SECOND_MS;
        }
        samples
    })
}

/// The peers of node `i`'s `/v1/cluster` with their `state`.
fn peer_states(c: &LocalClusterHandle, i: usize) -> Vec<(String, String)> {
    c.status(i)["peers"]
        .as_array()
        .map(|peers| {
            peers
                .iter()
                .map(|p| {
                    (
                        p["id"].as_str().unwrap_or("?").to_owned(),
                        p["state"].as_str().unwrap_or("?").to_owned(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Two regions grow from one node each to three while every running node is overloaded, then
/// shrink back (each pair leaves, is stopped, then marked removed in the list), all by reloading the
/// list on the running nodes and starting the new ones: no restart of anyone. No window ever
/// admits more than the limit; every list becomes agreed; once the last change is agreed the
/// two remaining nodes spend their whole shares again; and usage counted by a node before it
/// was removed is still counted, the same on both remaining nodes.
#[test]
fn a_cluster_grows_from_one_to_three_nodes_per_region_and_shrinks_back_under_load_holding_the_limit()
 {
    const PER_NODE: f64 = 150.0;
    let mut c = LocalClusterHandle::start_layout(&["eu", "us"], 3, Some(vec![0, 3]));
    let [eu1, eu2, eu3, us1, us2, us3] = [0, 1, 2, 3, 4, 5];
    let hot = ("per-second", "growing");
    let (daily, counted) = ("daily", "counted-before-removal");
    let start = next_window_start(SECOND_MS);
    let second = |k: u64| start + k * SECOND_MS;
    // eu-1 and us-1 are loaded until three windows after the last change applies, however
    // long the changes take on a slow machine.
    let until = std::sync::Arc::new(AtomicU64::new(u64::MAX));
    let mut loads = vec![load_windows_in_background(
        &c,
        &[eu1, us1],
        hot,
        PER_NODE,
        start,
        std::sync::Arc::clone(&until),
    )];
    let mut log = Vec::new();

    sleep_until_ms(second(2) as f64);
    let two = [(eu1, false), (us1, false), (eu2, false), (us2, false)];
    c.change_list(&two, &[eu1, us1], false);
    c.start_node(eu2);
    c.start_node(us2);
    let second_pair = load_in_background(&c, &[eu2, us2], hot, PER_NODE, now_ms(), second(11));
    c.wait_agreed(&[eu1, us1, eu2, us2]);
    log.push(format!(
        "two per region, agreed at window {}",
        now_ms() / SECOND_MS
    ));

    sleep_until_ms(second(5) as f64);
    let three = [
        (eu1, false),
        (us1, false),
        (eu2, false),
        (us2, false),
        (eu3, false),
        (us3, false),
    ];
    c.change_list(&three, &[eu1, us1, eu2, us2], false);
    c.start_node(eu3);
    c.start_node(us3);
    let third_pair = load_in_background(&c, &[eu3, us3], hot, PER_NODE, now_ms(), second(9));
    c.wait_agreed(&[eu1, us1, eu2, us2, eu3, us3]);
    log.push(format!(
        "three per region, agreed at window {}",
        now_ms() / SECOND_MS
    ));
    c.admit_retrying(eu3, daily, counted, 10);

    sleep_until_ms((second(9) + 100) as f64);
    // A load ends before its nodes stop (late checks would find them gone).
    loads.push(third_pair);
    finish_load(&mut loads);
    c.leave(eu3);
    c.leave(us3);
    c.stop(eu3);
    c.stop(us3);
    let without_third = [
        (eu1, false),
        (us1, false),
        (eu2, false),
        (us2, false),
        (eu3, true),
        (us3, true),
    ];
    c.change_list(&without_third, &[eu1, us1, eu2, us2], true);
    c.wait_agreed(&[eu1, us1, eu2, us2]);
    log.push(format!(
        "third nodes removed, agreed at window {}",
        now_ms() / SECOND_MS
    ));

    sleep_until_ms((second(11) + 100) as f64);
    loads.push(second_pair);
    finish_load(&mut loads);
    c.leave(eu2);
    c.leave(us2);
    c.stop(eu2);
    c.stop(us2);
    let one = [
        (eu1, false),
        (us1, false),
        (eu2, true),
        (us2, true),
        (eu3, true),
        (us3, true),
    ];
    c.change_list(&one, &[eu1, us1], true);
    c.wait_agreed(&[eu1, us1]);
    // Shares that grow apply from the window after next (rights for the next window may
    // have been handed over under the old shares already).
    let settled = now_ms() / SECOND_MS + 2;
    log.push(format!(
        "back to one per region, agreed at window {}",
        settled - 2
    ));
    until.store((settled + 3) * SECOND_MS, Ordering::Relaxed);
    let windows = settled + 3 - start / SECOND_MS;

    let (samples, a, first, table) = finish_loads(loads, start, windows);
    let by_node = admitted_by_node(&c, &samples, SECOND_MS);
    eprintln!(
        "growing and shrinking, limit {PER_SECOND_LIMIT} per window ({}):\n{table}\nadmitted by node:\n{by_node}",
        log.join("; ")
    );
    a.assert_clean();
    for w in first..first + windows {
        let t = a.tally(w);
        assert!(
            t.admitted <= PER_SECOND_LIMIT,
            "window {w} admitted {} > the limit {PER_SECOND_LIMIT}:\n{table}\n{by_node}",
            t.admitted
        );
        assert!(
            t.sent > PER_SECOND_LIMIT,
            "window {w} was not overloaded: {t:?}"
        );
    }
    // From the window after next once the last list is agreed, eu-1 and us-1 hold their
    // whole shares again.
    for w in settled..first + windows {
        let t = a.tally(w);
        assert!(
            10 * t.admitted >= 9 * PER_SECOND_LIMIT,
            "window {w}, after the last change was agreed, admitted {} of {PER_SECOND_LIMIT}:\n{table}",
            t.admitted
        );
    }
    for i in [eu1, us1] {
        let states = peer_states(&c, i);
        for gone in [eu2, eu3, us2, us3] {
            assert!(
                states.contains(&(c.id(gone).to_owned(), "gone".to_owned())),
                "{} shows {} gone: {states:?}",
                c.id(i),
                c.id(gone)
            );
        }
        assert_eq!(c.membership(i)["version"], 6, "{}", c.id(i));
    }
    // A list that drops an entry (the entries after it would move) is refused, naming the
    // entry, and the running list is kept.
    let running = c.membership(eu1);
    let dropped: Vec<Listed> = one
        .iter()
        .filter(|&&(n, _)| n != eu2)
        .map(|&(node, removed)| Listed { node, removed })
        .collect();
    c.c.set_list(&dropped).unwrap_or_else(|e| panic!("{e}"));
    let r = c.c.post(eu1, "/admin/reload", "").expect("an answer");
    let message = r.json["message"].as_str().unwrap_or_default();
    assert!(
        r.status == 400
            && message.contains("cluster.node[2]: was \"eu-2\", is now \"us-2\"")
            && message.ends_with("the running configuration is kept"),
        "{r:?}"
    );
    assert_eq!(c.membership(eu1), running, "the running list is kept");

    // What eu-3 counted before it left and was removed is still counted, on both remaining
    // nodes.
    c.wait_agreement(&[eu1, us1], daily, counted, READY_TIMEOUT, |v| v.used == 10);
}

/// A node frozen (SIGSTOP) while the others remove it from the list, then thawed: it still
/// runs the old list, but the list its peers tell it gives it no share, so once it has heard
/// them the cluster, overloaded at every node, still never admits more than the limit in a
/// window; and what it tells them (its old list) does not hold their shares down. (Before it hears them it can spend what it held: the bound docs/membership.md
/// states for removing a node that was not dead.)
#[test]
fn a_node_removed_while_frozen_spends_no_share_once_thawed() {
    const PER_NODE: f64 = 100.0;
    let mut c = LocalClusterHandle::start_layout(&["eu", "us"], 2, None);
    let [eu1, eu2, us1, us2] = [0, 1, 2, 3];
    let hot = ("per-second", "thawed");
    let start = next_window_start(SECOND_MS);
    let second = |k: u64| start + k * SECOND_MS;
    // The others are loaded until four windows after the thaw, however long it takes.
    let until = std::sync::Arc::new(AtomicU64::new(u64::MAX));
    let mut loads = vec![
        load_windows_in_background(
            &c,
            &[eu1, eu2, us1],
            hot,
            PER_NODE,
            start,
            std::sync::Arc::clone(&until),
        ),
        load_in_background(&c, &[us2], hot, PER_NODE, start, second(2)),
    ];
    sleep_until_ms((second(2) + 200) as f64);
    c.sigstop(us2);
    let list = [(eu1, false), (eu2, false), (us1, false), (us2, true)];
    c.change_list(&list, &[eu1, eu2, us1], true);
    c.wait_agreed(&[eu1, eu2, us1]);
    sleep_until_ms(second(5) as f64);
    c.sigcont(us2);
    // It has heard its peers once every peer shows as running another list than its own.
    let mut states = Vec::new();
    let heard = wait_until(READY_TIMEOUT, || {
        states = peer_states(&c, us2);
        states.iter().all(|(_, s)| s == "joining")
    });
    assert!(
        heard,
        "the thawed us-2 did not hear its peers' list: {states:?}"
    );
    assert_eq!(
        c.membership(us2)["agreed"],
        false,
        "us-2 runs a list no one else does"
    );
    let thawed = now_ms();
    let end = (thawed / SECOND_MS + 4) * SECOND_MS;
    until.store(end, Ordering::Relaxed);
    let windows = (end - start) / SECOND_MS;
    loads.push(load_in_background(&c, &[us2], hot, PER_NODE, thawed, end));
    let (samples, a, first, table) = finish_loads(loads, start, windows);
    eprintln!(
        "us-2 frozen at window {}, removed, thawed at window {}:\n{table}",
        (second(2) + 200) / SECOND_MS,
        thawed / SECOND_MS
    );
    a.assert_clean();
    let by_node = admitted_by_node(&c, &samples, SECOND_MS);
    for w in first..first + windows {
        let t = a.tally(w);
        assert!(
            t.admitted <= PER_SECOND_LIMIT,
            "window {w} admitted {} > the limit {PER_SECOND_LIMIT}:\n{table}\nadmitted by node:\n{by_node}",
            t.admitted
        );
    }
    // Nor does what it says hold the others down: they keep their whole shares.
    for w in thawed / SECOND_MS + 1..first + windows {
        let t = a.tally(w);
        assert!(
            10 * t.admitted >= 9 * PER_SECOND_LIMIT,
            "window {w}, after the thaw, admitted {} of {PER_SECOND_LIMIT}:\n{table}",
            t.admitted
        );
    }
    let thawed_checks = samples
        .iter()
        .filter(|s| s.node == us2 && s.sent_ms >= thawed);
    assert!(
        thawed_checks.clone().count() > 100,
        "the thawed node was loaded"
    );
    eprintln!(
        "us-2 after the thaw: {} of {} admitted",
        thawed_checks.clone().filter(|s| s.allowed()).count(),
        thawed_checks.count()
    );
}

/// A key's owner leaves (`POST /admin/leave`) with most of the day's rights of the key in
/// hand, is stopped and removed from the list: nothing it held is stranded. Its region-mate,
/// the key's owner from then on, admits until the cluster has admitted the whole day's limit,
/// and every remaining node counts the same. (Removed without leaving, the rights it held
/// would stay with it until the day after next: the growth rule, docs/membership.md.)
#[test]
fn a_keys_owner_that_leaves_hands_its_rights_over_and_is_removed_with_nothing_stranded() {
    let mut c = LocalClusterHandle::start_layout(&["eu", "us"], 2, None);
    let [eu1, eu2, us1, us2] = [0, 1, 2, 3];
    let rule = "daily";
    avoid_window_edge(DAY_MS, 120_000);
    let key = (0..1_000)
        .map(|i| format!("leaving-{i}"))
        .find(|k| c.usage(eu1, rule, k)["owner"] == "eu-2")
        .expect("a key eu-2 owns");
    let key = key.as_str();
    const BEFORE: u64 = 50;
    c.admit_retrying(eu2, rule, key, BEFORE);
    // The owner gathers its region's rights: give it a moment to hold them.
    std::thread::sleep(Duration::from_millis(300));

    let r =
        c.c.post(eu2, "/admin/leave?wait_ms=4000", "")
            .expect("an answer");
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.json["left"], true, "{r:?}");
    assert_eq!(r.json["holding"], 0, "{r:?}");
    let handed_over = r.json["handed_over"].as_u64().unwrap_or(0);
    assert!(handed_over > 0, "{r:?}");
    let states = peer_states(&c, eu1);
    assert!(
        states.contains(&("eu-2".to_owned(), "leaving".to_owned())),
        "eu-1 shows eu-2 leaving: {states:?}"
    );
    assert_eq!(c.usage(eu1, rule, key)["owner"], "eu-1");
    // Asked again, it is still done: nothing came back to it.
    let again =
        c.c.post(eu2, "/admin/leave?wait_ms=2000", "")
            .expect("an answer");
    assert_eq!(
        (again.status, &again.json["left"]),
        (200, &json!(true)),
        "{again:?}"
    );
    // A bad wait is refused, naming the field.
    let bad =
        c.c.post(eu2, "/admin/leave?wait_ms=700000", "")
            .expect("an answer");
    assert!(bad.status == 400 && bad.body.contains("wait_ms"), "{bad:?}");

    c.stop(eu2);
    let removed = [(eu1, false), (eu2, true), (us1, false), (us2, false)];
    c.change_list(&removed, &[eu1, us1, us2], true);
    c.wait_agreed(&[eu1, us1, us2]);

    // The day's rights left are all reachable from eu-1: it admits until the whole limit is
    // spent (a denial that names the end of the day says the cluster holds nothing more).
    let mut after = 0u64;
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = String::new();
    while Instant::now() < deadline && BEFORE + after <= DAILY_LIMIT {
        let r = c.check(eu1, rule, key);
        if r.allowed() {
            after += 1;
            continue;
        }
        let retry = r.json["retry_after_ms"].as_u64().unwrap_or(u64::MAX);
        last = r.body;
        if retry > 60_000 {
            break;
        }
        std::thread::sleep(Duration::from_millis(retry.max(1)));
    }
    eprintln!(
        "eu-2 handed {handed_over} over; admitted {BEFORE} at eu-2 before it left, {after} at eu-1 after its removal (limit {DAILY_LIMIT})"
    );
    assert_eq!(
        BEFORE + after,
        DAILY_LIMIT,
        "admitted {BEFORE} at eu-2 before it left and {after} at eu-1 after (eu-2 handed {handed_over} over); last denial: {last}"
    );
    c.wait_agreement(&[eu1, us1, us2], rule, key, READY_TIMEOUT, |v| {
        v.used == DAILY_LIMIT
    });
}

/// Every `name` sample of node `i`'s `/metrics`, summed (0 if there is none).
fn metric_sum(c: &LocalClusterHandle, i: usize, name: &str) -> f64 {
    levee_blackbox::samples(&c.metrics(i))
        .iter()
        .filter(|s| s.name == name)
        .map(|s| s.value)
        .sum()
}

/// A rolling upgrade from the previous protocol version (docs/operations.md, "Upgrading"):
/// half the nodes, one of each region, send version-1 frames (`cluster.wire_version = 1`, as
/// upgraded nodes do while nodes of the previous build still run), the other half this
/// build's. Every node decodes the others' frames (none is refused); checks of keys owned by
/// either kind are forwarded to them and answered; the day's limit holds and every view agrees.
/// Then the upgrade is finished node by node (the setting removed, the node restarted), and
/// the node list, which version 1 cannot acknowledge, is agreed everywhere.
#[test]
fn with_half_the_nodes_on_the_previous_wire_version_the_limit_holds_and_the_upgrade_finishes_node_by_node()
 {
    const OLD: &str = "wire_version = 1";
    let mut c = LocalClusterHandle::start_spec(&["eu", "us"], 2, |spec| {
        spec.cluster_extra = vec![String::new(), OLD.into(), String::new(), OLD.into()];
    });
    let [eu1, eu2, us1, us2] = [0, 1, 2, 3];
    let all = [eu1, eu2, us1, us2];
    let rule = "daily";
    avoid_window_edge(DAY_MS, 120_000);
    let key_owned_by = |c: &LocalClusterHandle, owner: &str, tag: &str| {
        (0..1_000)
            .map(|i| format!("upgrade-{tag}-{i}"))
            .find(|k| c.usage(eu1, rule, k)["owner"] == owner)
            .unwrap_or_else(|| panic!("a key {owner} owns"))
    };
    // Round robin over the four nodes, a third more checks than the limit: each node forwards
    // the keys it does not own in its region.
    let run = |c: &LocalClusterHandle, key: &str| {
        let admitted = c.admit_round_robin(&all, rule, key, DAILY_LIMIT / 3);
        let view = c.wait_agreement(&all, rule, key, READY_TIMEOUT, |v| v.used == admitted);
        eprintln!("{key}: admitted {admitted} of {DAILY_LIMIT}; every node's view: {view:?}");
        assert!(
            admitted <= DAILY_LIMIT,
            "{key}: admitted {admitted} over the limit {DAILY_LIMIT}"
        );
        admitted
    };
    let old_owned = key_owned_by(&c, "eu-2", "old-owner");
    let new_owned = key_owned_by(&c, "eu-1", "new-owner");
    let mixed = [run(&c, &old_owned), run(&c, &new_owned)];
    for i in all {
        assert_eq!(
            metric_sum(&c, i, "levee_frames_refused_total"),
            0.0,
            "{} refused frames:\n{}",
            c.id(i),
            c.metrics(i)
        );
    }
    // The nodes on version 1 sent nothing version 1 lacks (their list, above all), and so
    // cannot acknowledge one: the others see them joining, the list not agreed.
    for i in [eu2, us2] {
        let text = c.metrics(i);
        let withheld: f64 = levee_blackbox::samples(&text)
            .iter()
            .filter(|s| {
                s.name == "levee_transport_frames_dropped_total"
                    && s.labels.iter().any(|(k, v)| k == "reason" && v == "version")
            })
            .map(|s| s.value)
            .sum();
        assert!(withheld > 0.0, "{} withheld nothing:\n{text}", c.id(i));
    }
    let states = peer_states(&c, eu1);
    assert!(
        states.contains(&("eu-2".to_owned(), "joining".to_owned())),
        "eu-1's peers: {states:?}"
    );
    assert_eq!(c.membership(eu1)["agreed"], false);
    // Nor can a node on version 1 take a new list: its reload is refused, its list kept.
    let digest = c.membership(eu2)["digest"].clone();
    let reload_errors = |c: &LocalClusterHandle| {
        levee_blackbox::metric(
            &c.metrics(eu2),
            "levee_config_reloads_total",
            &[("result", "error")],
        )
        .unwrap_or(0.0)
    };
    let errors = reload_errors(&c);
    let without_us2 = [(eu1, false), (eu2, false), (us1, false), (us2, true)].map(
        |(node, removed)| Listed { node, removed },
    );
    c.c.set_list(&without_us2).unwrap_or_else(|e| panic!("{e}"));
    c.c.signal(eu2, "HUP").unwrap_or_else(|e| panic!("{e}"));
    assert!(
        wait_until(READY_TIMEOUT, || reload_errors(&c) > errors),
        "eu-2's reload of another list was not refused"
    );
    assert_eq!(c.membership(eu2)["digest"], digest);
    let unchanged = all.map(|node| Listed {
        node,
        removed: false,
    });
    c.c.set_list(&unchanged).unwrap_or_else(|e| panic!("{e}"));

    // The upgrade finishes: each old node in turn drops the setting and restarts.
    for i in [eu2, us2] {
        let path = c.node(i).config.clone();
        let text = std::fs::read_to_string(&path).expect("its configuration");
        assert!(text.contains(OLD), "{text}");
        std::fs::write(&path, text.replacen(&format!("{OLD}\n"), "", 1)).expect("written");
        c.restart(i);
    }
    c.wait_agreed(&all);
    let after = run(&c, &key_owned_by(&c, "eu-2", "upgraded"));
    for i in all {
        assert_eq!(metric_sum(&c, i, "levee_frames_refused_total"), 0.0, "{}", c.id(i));
    }
    eprintln!("admitted with half the nodes on version 1: {mixed:?}; after the upgrade: {after}");
}

/// A peer that is not heard (frozen with SIGSTOP) is not waited for by a node that leaves: the
/// leave completes, naming it unreachable, and the peer learns of it once thawed.
#[test]
fn a_leave_does_not_wait_for_a_peer_that_is_not_heard_and_the_peer_learns_of_it_once_thawed() {
    let c = LocalClusterHandle::start_layout(&["eu", "us"], 2, None);
    let [eu1, eu2, us1, us2] = [0, 1, 2, 3];
    c.admit_retrying(eu2, "daily", "frozen-peer", 20);
    c.sigstop(us2);
    // us-2 is suspected after `suspect_after`; the leave waits for the others only.
    let r =
        c.c.post(eu2, "/admin/leave?wait_ms=10000", "")
            .expect("an answer");
    c.sigcont(us2);
    eprintln!("leave with us-2 frozen: {}", r.body);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(
        (&r.json["left"], &r.json["holding"]),
        (&json!(true), &json!(0)),
        "{r:?}"
    );
    // (Another peer may be named too if this machine was too busy for it to be heard for a
    // moment; the frozen one must be.)
    assert!(
        r.json["unreachable"]
            .as_array()
            .is_some_and(|u| u.contains(&json!("us-2"))),
        "{r:?}"
    );
    assert!(
        r.json["message"]
            .as_str()
            .is_some_and(|m| m.contains("us-2 not heard")),
        "{r:?}"
    );
    for i in [eu1, us1] {
        let states = peer_states(&c, i);
        assert!(
            states.contains(&("eu-2".to_owned(), "leaving".to_owned())),
            "{} shows eu-2 leaving: {states:?}",
            c.id(i)
        );
    }
    let thawed = wait_until(READY_TIMEOUT, || {
        peer_states(&c, us2).contains(&("eu-2".to_owned(), "leaving".to_owned()))
    });
    assert!(
        thawed,
        "us-2, thawed, does not show eu-2 leaving: {:?}",
        peer_states(&c, us2)
    );
}
