//! The harness of the cluster tests (`tests/cluster.rs`, `tests/membership.rs`,
//! `tests/cluster_trust.rs`): a local cluster of real `levee serve` processes held one test at
//! a time, the load it is put under and the accounting of what it admitted.
//!
//! The tests run one at a time (a process-wide lock held by the cluster handle): each one
//! starts several nodes and drives them hard, and its figures should be about the cluster, not
//! about the machine's scheduler juggling several clusters at once.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use levee_blackbox::cluster::{
    Attribution, Cluster, ClusterSpec, View, attribute, decide as decide_check,
};
use levee_blackbox::{Reply, agent, levee_binary, wait_until};
use levee_node::local_cluster::{Listed, LocalNode};
use serde_json::{Value, json};

pub(crate) mod load;
#[allow(
    unused_imports,
    reason = "the tests of cluster_trust.rs use no load; the others do"
)]
pub(crate) use load::*;

/// `cluster.gossip_interval` of every test cluster.
pub(crate) const GOSSIP_INTERVAL_MS: u64 = 20;
/// `cluster.suspect_after` of every test cluster.
pub(crate) const SUSPECT_AFTER_MS: u64 = 500;
/// The regions, in order; node ids are `<region>-1` and `<region>-2`.
pub(crate) const REGIONS: [&str; 3] = ["eu", "us", "ap"];
/// Nodes in every region.
pub(crate) const NODES_PER_REGION: usize = 2;
/// How long a whole cluster may take to be ready and to see every peer; and a restarted node
/// to be ready.
pub(crate) const READY_TIMEOUT: Duration = Duration::from_secs(20);

/// The rules every node runs.
pub(crate) const RULES: &str = r#"
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
pub(crate) const PER_SECOND_LIMIT: u64 = 200;
/// The window of `per-second`, in ms.
pub(crate) const SECOND_MS: u64 = 1_000;
/// `limit` of `daily`.
pub(crate) const DAILY_LIMIT: u64 = 600;
/// The window of `daily` and `durable`, in ms.
pub(crate) const DAY_MS: u64 = 86_400_000;

// ---------------------------------------------------------------------------------------------
// The cluster harness
// ---------------------------------------------------------------------------------------------

/// One cluster test at a time (see the module docs).
pub(crate) fn one_cluster_at_a_time() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Milliseconds since the Unix epoch, the clock the nodes decide by.
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("the clock is after 1970")
        .as_millis() as u64
}

pub(crate) fn now_ms_f64() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("the clock is after 1970")
        .as_secs_f64()
        * 1_000.0
}

/// Sleeps until the wall clock reads `due_ms`.
pub(crate) fn sleep_until_ms(due_ms: f64) {
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
pub(crate) fn next_window_start(window_ms: u64) -> u64 {
    (now_ms() / window_ms + 1) * window_ms + 5
}

pub(crate) use levee_blackbox::avoid_window_edge;

pub(crate) fn new_agent() -> ureq::Agent {
    agent(Duration::from_secs(5))
}

/// A running local cluster of three regions of two `levee serve` processes each: the black-box
/// harness's [`Cluster`] (which stops every process on drop, prints the nodes' log tails and
/// keeps the cluster's files when the test is failing, and leaves a watchdog that kills the
/// nodes should the test process die), held one test at a time, with the panicking helpers
/// the tests read best with.
pub(crate) struct LocalClusterHandle {
    pub(crate) c: Cluster,
    pub(crate) _one_at_a_time: MutexGuard<'static, ()>,
}

impl LocalClusterHandle {
    /// A strict-mode cluster running [`RULES`], every node ready and seeing every peer.
    pub(crate) fn start() -> LocalClusterHandle {
        LocalClusterHandle::start_layout(&REGIONS, NODES_PER_REGION, None)
    }

    /// [`LocalClusterHandle::start`] of `regions` × `per_region` nodes, of which only
    /// `initial` (by index, in list order) are listed and started (`None`: every node).
    pub(crate) fn start_layout(
        regions: &[&str],
        per_region: usize,
        initial: Option<Vec<usize>>,
    ) -> LocalClusterHandle {
        LocalClusterHandle::start_spec(regions, per_region, |spec| spec.initial = initial)
    }

    /// [`LocalClusterHandle::start`] of `regions` × `per_region` nodes, with `tweak` applied
    /// to the cluster's specification.
    pub(crate) fn start_spec(
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

    pub(crate) fn dir(&self) -> &Path {
        self.c.dir()
    }

    pub(crate) fn len(&self) -> usize {
        self.c.len()
    }

    /// The index of node `id`.
    pub(crate) fn idx(&self, id: &str) -> usize {
        self.c.idx(id).unwrap_or_else(|| panic!("no node {id}"))
    }

    pub(crate) fn id(&self, i: usize) -> &str {
        self.c.id(i)
    }

    /// The nodes of `region`.
    pub(crate) fn region(&self, region: &str) -> Vec<usize> {
        self.c.nodes_in(region)
    }

    pub(crate) fn node(&self, i: usize) -> &LocalNode {
        self.c.node(i)
    }

    // ---- processes ----

    /// Starts node `i` on `config` (its own, or an impostor's), logging to its log file.
    pub(crate) fn spawn(&mut self, i: usize, config: &Path) {
        self.c.spawn(i, config).unwrap_or_else(|e| panic!("{e}"));
    }

    /// Waits (until `deadline`) for node `i` to answer `/readyz` with 200; `Err` with the
    /// tail of its log if it exits first or the deadline passes.
    pub(crate) fn wait_ready(&mut self, i: usize, deadline: Instant) -> Result<(), String> {
        self.c.wait_ready(i, deadline)
    }

    /// Waits until every running node has dialled every other running node (and completed the
    /// `Hello` exchange) and sees every peer and every region reachable.
    pub(crate) fn wait_fully_connected(&self, timeout: Duration) {
        self.c
            .wait_fully_connected(timeout)
            .unwrap_or_else(|e| panic!("{e}"));
    }

    /// Freezes node `i` (SIGSTOP): its sockets stay open, it answers nothing.
    pub(crate) fn sigstop(&self, i: usize) {
        self.c.signal(i, "STOP").unwrap_or_else(|e| panic!("{e}"));
    }

    /// Thaws node `i` (SIGCONT).
    pub(crate) fn sigcont(&self, i: usize) {
        self.c.signal(i, "CONT").unwrap_or_else(|e| panic!("{e}"));
    }

    /// `kill -9` node `i`, and reaps it.
    pub(crate) fn kill9(&mut self, i: usize) {
        self.c.kill9(i).unwrap_or_else(|e| panic!("{e}"));
    }

    /// Stops node `i` with SIGTERM and waits for it (SIGKILL after a bound); nothing if it is
    /// not running.
    pub(crate) fn stop(&mut self, i: usize) {
        self.c.stop(i);
    }

    /// Stops (if running) and starts node `i` again on its own configuration, ports and data
    /// directory, and waits until it is ready.
    ///
    /// Then waits until every other running node has dialled the new process (their old
    /// connections to the previous one count for nothing) and every node is fully connected.
    pub(crate) fn restart(&mut self, i: usize) {
        self.c.stop(i);
        self.c.start_node(i).unwrap_or_else(|e| panic!("{e}"));
    }

    /// Starts node `i` (not running) on its configuration and waits until it is ready, every
    /// running node has dialled it and every node is fully connected.
    pub(crate) fn start_node(&mut self, i: usize) {
        self.c.start_node(i).unwrap_or_else(|e| panic!("{e}"));
    }

    /// Writes the node list `list` (node index, removed) into every node's configuration,
    /// sends `nodes` SIGHUP, and waits until each of them runs it and sees it agreed (every
    /// running node of the list runs it too) — or, with `agreed` false, only runs it.
    pub(crate) fn change_list(&mut self, list: &[(usize, bool)], nodes: &[usize], agreed: bool) {
        let list: Vec<Listed> = list
            .iter()
            .map(|&(node, removed)| Listed { node, removed })
            .collect();
        // Read before the files change: a node also reloads a changed file on its own (its
        // config watcher), and one that did before this read would look unchanged.
        let before: Vec<Value> = nodes.iter().map(|&i| self.membership(i)).collect();
        self.c.set_list(&list).unwrap_or_else(|e| panic!("{e}"));
        self.reload(nodes, &before, agreed, &format!("{list:?}"));
    }

    /// Writes the region weights `weights` (as the `[cluster] regions` table holds them,
    /// e.g. `eu = 3, us = 1`) into every node's configuration, sends `nodes` SIGHUP, and
    /// waits until each of them runs the new list — and sees it agreed, with `agreed`.
    pub(crate) fn reweight_regions(&mut self, weights: &str, nodes: &[usize], agreed: bool) {
        let before: Vec<Value> = nodes.iter().map(|&i| self.membership(i)).collect();
        for i in 0..self.len() {
            let path = self.node(i).config.clone();
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let line = text
                .lines()
                .find(|l| l.starts_with("regions = {"))
                .unwrap_or_else(|| panic!("{}: no regions line", path.display()));
            let text = text.replacen(line, &format!("regions = {{ {weights} }}"), 1);
            std::fs::write(&path, text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        }
        self.reload(nodes, &before, agreed, weights);
    }

    /// Sends `nodes` SIGHUP and waits until each runs another list than `before` says
    /// (`what`), and sees it agreed if `agreed`.
    fn reload(&self, nodes: &[usize], before: &[Value], agreed: bool, what: &str) {
        for &i in nodes {
            self.c.signal(i, "HUP").unwrap_or_else(|e| panic!("{e}"));
        }
        let ok = wait_until(READY_TIMEOUT, || {
            nodes.iter().zip(before).all(|(&i, was)| {
                let m = self.membership(i);
                m["digest"] != was["digest"] && (!agreed || m["agreed"] == true)
            })
        });
        assert!(
            ok,
            "the nodes did not take the list {what} (agreed: {agreed}) within {READY_TIMEOUT:?}: {:?}",
            nodes
                .iter()
                .map(|&i| (self.id(i), self.membership(i)))
                .collect::<Vec<_>>()
        );
    }

    /// Waits until every node of `nodes` sees its list agreed and decides by it alone (no
    /// other list bounds its shares), all with one digest.
    pub(crate) fn wait_agreed(&self, nodes: &[usize]) {
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
    pub(crate) fn leave(&self, i: usize) {
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

    /// A key of `rule`, `<prefix>-<n>`, whose owner node `at` names `owner`.
    pub(crate) fn key_owned_by(&self, at: usize, rule: &str, owner: &str, prefix: &str) -> String {
        (0..1_000)
            .map(|i| format!("{prefix}-{i}"))
            .find(|k| self.usage(at, rule, k)["owner"] == owner)
            .unwrap_or_else(|| panic!("no key {prefix}-… of {rule} that {owner} owns"))
    }

    /// A key of `daily` that eu-2 (node 1) owns, of which it has admitted `before` and then
    /// gathered its region's rights; two minutes or more before the day ends, so that the
    /// test that follows runs in one window.
    pub(crate) fn day_key_held_by_eu2(&self, prefix: &str, before: u64) -> String {
        avoid_window_edge(DAY_MS, 120_000);
        let key = self.key_owned_by(0, "daily", "eu-2", prefix);
        self.admit_retrying(1, "daily", &key, before);
        // The owner gathers its region's rights: give it a moment to hold them.
        std::thread::sleep(Duration::from_millis(300));
        key
    }

    /// `membership` of node `i`'s `/v1/cluster`.
    pub(crate) fn membership(&self, i: usize) -> Value {
        self.status(i)["membership"].clone()
    }

    /// The impostor of node `i` (see [`Cluster::write_impostor`]): its configuration's path.
    pub(crate) fn write_impostor(&self, i: usize) -> std::path::PathBuf {
        self.c.write_impostor(i).unwrap_or_else(|e| panic!("{e}"))
    }

    // ---- HTTP ----

    pub(crate) fn url(&self, i: usize, path: &str) -> String {
        self.c.url(i, path)
    }

    /// `GET path` on node `i`; panics (with the node's log) if it does not answer.
    pub(crate) fn get(&self, i: usize, path: &str) -> Reply {
        self.c.get(i, path).unwrap_or_else(|e| {
            panic!(
                "GET {path} on {}: no answer ({e}); log:\n{}",
                self.id(i),
                self.c.log_tail(i, 30)
            )
        })
    }

    /// `POST /v1/check` of one unit of `rule`/`key` on node `i`; asserts a 200.
    pub(crate) fn check(&self, i: usize, rule: &str, key: &str) -> Reply {
        let body = json!({ "rule": rule, "key": key }).to_string();
        let r = self
            .c
            .post(i, "/v1/check", &body)
            .unwrap_or_else(|e| panic!("check on {}: no answer ({e})", self.id(i)));
        assert_eq!(r.status, 200, "check on {}: {r:?}", self.id(i));
        r
    }

    /// `n` checks on node `i`; asserts that every one is allowed.
    pub(crate) fn admit(&self, i: usize, rule: &str, key: &str, n: u64) {
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
    pub(crate) fn admit_retrying(&self, i: usize, rule: &str, key: &str, n: u64) {
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
    pub(crate) fn admit_round_robin(
        &self,
        nodes: &[usize],
        rule: &str,
        key: &str,
        rounds: u64,
    ) -> u64 {
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
    pub(crate) fn owner_in_eu(&self, rule: &str, key: &str) -> (usize, String, usize) {
        let eu = self.region("eu");
        let owner_id = self.usage(eu[0], rule, key)["owner"]
            .as_str()
            .expect("usage names the owner")
            .to_owned();
        let owner = self.idx(&owner_id);
        let mate = *eu.iter().find(|&&n| n != owner).expect("two eu nodes");
        (owner, owner_id, mate)
    }

    pub(crate) fn usage(&self, i: usize, rule: &str, key: &str) -> Value {
        self.c
            .usage(i, rule, key)
            .unwrap_or_else(|e| panic!("{e}; log:\n{}", self.c.log_tail(i, 30)))
    }

    pub(crate) fn used(&self, i: usize, rule: &str, key: &str) -> u64 {
        self.view(i, rule, key).used
    }

    /// Node `i`'s view of `rule`/`key`; panics unless it has one.
    pub(crate) fn view(&self, i: usize, rule: &str, key: &str) -> View {
        let u = self.usage(i, rule, key);
        View::of(&u).unwrap_or_else(|| panic!("no integer used in {u}"))
    }

    /// `GET /v1/cluster` on node `i`; asserts a 200.
    pub(crate) fn status(&self, i: usize) -> Value {
        self.c
            .status(i)
            .unwrap_or_else(|e| panic!("{e}; log:\n{}", self.c.log_tail(i, 30)))
    }

    /// `GET /metrics` on node `i`; asserts a 200.
    pub(crate) fn metrics(&self, i: usize) -> String {
        self.c
            .metrics(i)
            .unwrap_or_else(|e| panic!("{e}; log:\n{}", self.c.log_tail(i, 30)))
    }

    /// Waits until every node of `nodes` reports the same `used` and per-region figures for
    /// `rule`/`key`, and `accept` holds for that view; returns it, or panics after `timeout`.
    pub(crate) fn wait_agreement(
        &self,
        nodes: &[usize],
        rule: &str,
        key: &str,
        timeout: Duration,
        accept: impl Fn(&View) -> bool,
    ) -> View {
        self.c
            .wait_agreement(nodes, rule, key, timeout, accept)
            .unwrap_or_else(|e| panic!("{e}"))
    }
}
