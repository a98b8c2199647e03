//! The node's side of the cluster: the protocol state machine (`levee-cluster`) driven by
//! its timer, the QUIC transport (`levee-transport`) and the node's decision path.
//!
//! The state machine sits behind one mutex; the timer task, the inbound task and the
//! forwarders hold it only to feed it and drain what it wants sent and what it reports, and
//! never across an await. A check whose key another node of this region owns is forwarded
//! to that owner through the machine ([`Cluster::forward`]; checks to one owner are batched:
//! while one batch is in flight the next one gathers); if the owner is unreachable, or does
//! not answer within `forward_timeout`, this node decides alone under its own conservative
//! cap and says `degraded: true`. No decision ever waits on another region.
//!
//! The driver knows the node it runs in only as a [`ClusterHost`]: its limiter and its
//! readiness.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use levee_cluster::{Cluster, ClusterConfig, Event, ForwardId, Outgoing, Route, Routes};
use levee_core::{Millis, NodeIdx, ReplicaSet};
use levee_proto::{ForwardCheck, ForwardDecision, Hello};
use levee_transport::{Inbound, PeerAddr, TlsFiles, Transport, TransportConfig};
use parking_lot::Mutex;
use tokio::sync::{Notify, mpsc, oneshot, watch};

use crate::config::Config;
use crate::limiter::Limiter;
use crate::states::{NodeDigest, NodeStates};

mod drive;
use drive::{run_inbound, run_timer};
mod forward;
mod leave;

pub use forward::decide_forwarded;
use forward::{Job, Waiter, forward_loop};
pub use leave::LeaveProgress;

/// How long a forwarded batch may take before the forwarder decides alone.
const FORWARD_TIMEOUT_MAX: Millis = 500;
// Peers refuse key identities longer than the wire's bound: this node never makes one.
const _: () = assert!(crate::limiter::MAX_KEY_BYTES <= levee_proto::MAX_KEY_BYTES);
/// How often a node sends one peer an anti-entropy digest.
const ANTI_ENTROPY_INTERVAL: Millis = 1_000;

/// Why the cluster side could not start.
#[derive(Debug, thiserror::Error)]
pub enum ReplicationError {
    /// A required setting is missing.
    #[error("{0}")]
    Config(String),
    /// The transport did not start.
    #[error("{0}")]
    Transport(#[from] levee_transport::TransportError),
}

/// What the cluster driver needs of the node it runs in.
pub trait ClusterHost: Send + Sync + 'static {
    /// The node's rules, keys and decisions.
    fn limiter(&self) -> &Limiter;
    /// The node has pulled the cluster's state: it may answer `/readyz` with 200.
    fn synced(&self);
}

/// The running cluster side of a node.
pub struct Replication {
    cluster: Mutex<Cluster>,
    /// The machine's routing table, read by checks without the machine's lock (which gossip
    /// holds while it merges a batch or ends an interval).
    routes: Routes,
    /// The store's anti-entropy digest; locked only while `cluster` is.
    digest: Mutex<NodeDigest>,
    transport: Transport,
    /// Node ids by position (removed nodes included); grows when the list does.
    ids: parking_lot::RwLock<Vec<String>>,
    me: NodeIdx,
    /// By position: the queue of checks to forward to a region-mate.
    forwarders: parking_lot::RwLock<Vec<Option<mpsc::Sender<Job>>>>,
    /// Held while the rules are bound to the list decisions spend by (see
    /// `Event::SharesChanged` in `dispatch`, and [`Replication::apply_config`]).
    shares_order: Mutex<()>,
    /// The callers of forwarded batches waiting for the machine's answer; filled while
    /// `cluster` is locked.
    waiting: Mutex<HashMap<ForwardId, Waiter>>,
    /// Held while the limiter's view is set (see `Event::ViewChanged` in `dispatch`).
    view_order: Mutex<()>,
    /// When the timer task will next wake (ms); a forward due earlier wakes it.
    timer_at: AtomicU64,
    wake_timer: Notify,
    /// `cluster.suspect_after`, ms.
    suspect_after: Millis,
    /// Set by [`Replication::close`]: checks forwarded by region-mates are no longer decided
    /// here (the forwarder decides alone), so nothing is admitted after the final flush and
    /// snapshot.
    closing: AtomicBool,
    /// Forwarded checks being decided right now; `close` waits for none.
    deciding: AtomicUsize,
    /// Set by [`Replication::shutdown`]: the timer stops.
    stopped: watch::Sender<bool>,
    /// The machine's rights given when the node started leaving (`leave.rs`).
    leave_given_from: AtomicU64,
    /// Counts the peers' state merged here (deltas, pulled chunks): checks waiting for rights
    /// (`max_wait_ms`, see `crate::wait`) look again when it moves.
    merged: watch::Sender<u64>,
    /// `levee_forwarded_checks_total`, registered once (a forward is counted per check).
    forwarded: metrics::Counter,
}

/// How long a stopping node waits for its peers to acknowledge its last deltas.
const CLOSE_ACK_WAIT: Duration = Duration::from_secs(1);

impl Replication {
    /// Starts the transport and the state machine for `config` (which has `[cluster]`); the
    /// forwarders start too. The timer and the inbound loop are started by
    /// [`Replication::run`] once the node's host exists.
    pub async fn start(
        config: &Config,
        now: Millis,
    ) -> Result<(Arc<Replication>, mpsc::Receiver<Inbound>), ReplicationError> {
        let cluster_cfg = config
            .cluster
            .as_ref()
            .ok_or_else(|| ReplicationError::Config("no [cluster] section".into()))?;
        let gossip = config.node.gossip.ok_or_else(|| {
            ReplicationError::Config(
                "node.gossip: required with [cluster] (the QUIC address for peers)".into(),
            )
        })?;
        let tls = cluster_cfg.tls.as_ref().ok_or_else(|| {
            ReplicationError::Config(
                "cluster.tls: required ({ ca, cert, key }, see `levee certs`)".into(),
            )
        })?;
        let replicas = config.replicas.clone();
        let me = replicas.node_by_id(&config.node.id).unwrap_or(NodeIdx(0));
        let ids: Vec<String> = replicas
            .positions()
            .map(|n| replicas.node_id(n).to_owned())
            .collect();
        let peers = peer_addrs(config);
        let transport_cfg = TransportConfig {
            bind: gossip,
            node_id: config.node.id.clone(),
            tls: TlsFiles {
                ca: tls.ca.clone(),
                cert: tls.cert.clone(),
                key: tls.key.clone(),
            },
            peers,
            hello: Hello {
                node: config.node.id.clone(),
                replica_digest: replicas.digest(),
                incarnation: now,
            },
            wire_version: config.cluster_wire_version(),
        };
        let (transport, inbound) = Transport::start(transport_cfg).await?;
        let suspect_after = cluster_cfg.suspect_after.as_millis();
        let mut state = Cluster::new(
            ClusterConfig {
                me,
                replicas: replicas.clone(),
                gossip_interval: cluster_cfg.gossip_interval.as_millis(),
                suspect_after,
                anti_entropy_interval: ANTI_ENTROPY_INTERVAL,
                forward_timeout: suspect_after.min(FORWARD_TIMEOUT_MAX),
                tick_phase: 0,
                topology: cluster_cfg.gossip_topology.into(),
            },
            now,
        );
        state.set_local_first(cluster_cfg.local_first);
        // The snapshot in `data_dir` is restored before the node serves.
        state.set_durable(config.node.data_dir.is_some());
        let repl = Arc::new(Replication {
            routes: state.routes(),
            cluster: Mutex::new(state),
            digest: Mutex::new(NodeDigest::default()),
            transport,
            ids: parking_lot::RwLock::new(ids),
            me,
            forwarders: parking_lot::RwLock::new(Vec::new()),
            shares_order: Mutex::new(()),
            waiting: Mutex::new(HashMap::new()),
            view_order: Mutex::new(()),
            timer_at: AtomicU64::new(0),
            wake_timer: Notify::new(),
            suspect_after,
            closing: AtomicBool::new(false),
            deciding: AtomicUsize::new(0),
            stopped: watch::channel(false).0,
            leave_given_from: AtomicU64::new(0),
            merged: watch::channel(0).0,
            forwarded: metrics::counter!("levee_forwarded_checks_total"),
        });
        repl.start_forwarders(&replicas);
        Ok((repl, inbound))
    }

    /// Starts a forwarder for every region-mate of `replicas` that has none yet.
    fn start_forwarders(self: &Arc<Self>, replicas: &levee_core::ReplicaSet) {
        let my_region = replicas.region_of(self.me);
        self.start_forwarders_where(replicas, |n| replicas.region_of(n) == my_region);
    }

    /// Starts a forwarder for every node of `replicas`: a leaving node that was the last of
    /// its region forwards its checks to other regions' owners.
    fn start_forwarders_to_all(self: &Arc<Self>, replicas: &levee_core::ReplicaSet) {
        self.start_forwarders_where(replicas, |_| true);
    }

    fn start_forwarders_where(
        self: &Arc<Self>,
        replicas: &levee_core::ReplicaSet,
        to: impl Fn(NodeIdx) -> bool,
    ) {
        let mut forwarders = self.forwarders.write();
        forwarders.resize_with(replicas.len(), || None);
        for n in replicas.nodes() {
            let slot = &mut forwarders[usize::from(n.0)];
            if n != self.me && to(n) && slot.is_none() {
                let (tx, rx) = mpsc::channel(4096);
                *slot = Some(tx);
                tokio::spawn(forward_loop(Arc::clone(self), n, rx));
            }
        }
    }

    /// Applies a reloaded configuration: its node list ([`Cluster::change_list`]: refused,
    /// with nothing changed, if it moves a position; its shares apply once every node runs
    /// it), new peers' links and forwarders, and its rules, bound to the list decisions spend
    /// by. Rules and list change together, so no decision sees new rules under shares that
    /// are not yet agreed.
    pub fn apply_config(
        self: &Arc<Self>,
        limiter: &Limiter,
        config: &Config,
        now: Millis,
    ) -> Result<(), levee_core::ReplicaSetError> {
        let _order = self.shares_order.lock();
        let (out, events, spending, view) = {
            let mut c = self.cluster.lock();
            c.change_list(config.replicas.clone(), now)?;
            let (out, events) = drain(&mut c);
            (out, events, c.spending(), c.view())
        };
        {
            let mut ids = self.ids.write();
            for n in spending.positions().skip(ids.len()) {
                ids.push(spending.node_id(n).to_owned());
            }
        }
        self.start_forwarders(&spending);
        self.transport.set_peers(peer_addrs(config));
        limiter.replace_rules(config, spending);
        if events.iter().any(|e| matches!(e, Event::ViewChanged(_))) {
            let _view = self.view_order.lock();
            limiter.set_view(view);
        }
        self.send_all(out);
        Ok(())
    }

    /// This node's list: its version (positions), digest, whether it is agreed, whether
    /// `in_force` (the list the limiter's rules are bound to) is still another list than it,
    /// and whether this node is leaving.
    pub fn membership(&self, in_force: &ReplicaSet) -> (usize, u64, bool, bool, bool) {
        let c = self.cluster.lock();
        let lists = c.lists();
        (
            lists.current().len(),
            lists.current().digest(),
            lists.agreed(),
            in_force != lists.current(),
            lists.is_leaving(self.me),
        )
    }

    /// Starts the timer and the inbound loop for the node `host`; they run until
    /// [`Replication::shutdown`] (gossip goes on while the node drains its HTTP requests).
    pub fn run<H: ClusterHost>(self: &Arc<Self>, host: Arc<H>, inbound: mpsc::Receiver<Inbound>) {
        tokio::spawn(run_inbound(Arc::clone(&host), Arc::clone(self), inbound));
        tokio::spawn(run_timer(host, Arc::clone(self), self.stopped.subscribe()));
    }

    /// Moves whenever a peer's state was merged here (deltas, pulled chunks): rights given to
    /// this node, or to the owner it forwards to, arrive so.
    pub fn merged(&self) -> watch::Receiver<u64> {
        self.merged.subscribe()
    }

    /// Where a check of `key` is decided.
    pub fn route(&self, key: &str) -> Route {
        self.routes.route(key.as_bytes())
    }

    /// The owner of `key` in this node's region.
    pub fn owner(&self, key: &str) -> NodeIdx {
        self.routes.owner(key.as_bytes())
    }

    /// This node.
    pub fn me(&self) -> NodeIdx {
        self.me
    }

    /// Whether the node has pulled the cluster's state.
    pub fn is_synced(&self) -> bool {
        self.cluster.lock().is_synced()
    }

    /// The peers' status for `/v1/cluster`, with the list they are positions of.
    pub fn peers(&self, now: Millis) -> (Vec<levee_cluster::PeerStatus>, levee_core::ReplicaSet) {
        let c = self.cluster.lock();
        (c.peers_status(now), c.lists().current().clone())
    }

    /// A node's id.
    pub fn id_of(&self, n: NodeIdx) -> String {
        self.ids
            .read()
            .get(usize::from(n.0))
            .cloned()
            .unwrap_or_default()
    }

    /// Forwards a check, asked at `now`, to its owner; `None` when the owner could not
    /// decide in time.
    pub async fn forward(
        &self,
        owner: NodeIdx,
        check: ForwardCheck,
        now: Millis,
    ) -> Option<ForwardDecision> {
        self.forward_start(owner, check, now)?.await.ok().flatten()
    }

    /// Queues a check for its owner at once, behind the checks queued before it (the owner
    /// decides them in that order, many to a message), and returns where its decision will
    /// come: `None` inside when the owner could not decide in time. `None` if it could not be
    /// queued. Several checks started before any is awaited travel together.
    pub fn forward_start(
        &self,
        owner: NodeIdx,
        check: ForwardCheck,
        now: Millis,
    ) -> Option<oneshot::Receiver<Option<ForwardDecision>>> {
        let forwarders = self.forwarders.read();
        let tx = forwarders.get(usize::from(owner.0))?.as_ref()?;
        self.forwarded.increment(1);
        let (reply, rx) = oneshot::channel();
        tx.try_send(Job { check, now, reply }).ok()?;
        Some(rx)
    }

    fn send_all(&self, out: Vec<Outgoing>) {
        if out.is_empty() {
            return;
        }
        let ids = self.ids.read();
        for o in out {
            if let Some(id) = ids.get(usize::from(o.to.0)) {
                self.transport.send(id, &o.msg);
            }
        }
    }

    /// Acts on what the machine reported (called without the machine's lock).
    fn dispatch<H: ClusterHost>(self: &Arc<Self>, host: &Arc<H>, events: Vec<Event>) {
        for event in events {
            match event {
                Event::ViewChanged(_) => {
                    // Events are dispatched outside the machine's lock, by whichever task
                    // drained them, so two changes can be dispatched in the opposite order
                    // to the one they happened in; setting the event's own view would then
                    // leave the older one in force until the next change. The view set is
                    // the machine's current one, read and set in one ordered step: the last
                    // to run sets the newest.
                    let _order = self.view_order.lock();
                    let view = self.cluster.lock().view();
                    let rules = host.limiter().rules();
                    for r in rules.replicas.regions() {
                        crate::metrics::region_reachable(
                            rules.replicas.region_name(r),
                            !view.unreachable.contains(r),
                        );
                    }
                    let was_blind = host.limiter().view().blind_since.is_some();
                    host.limiter().set_view(view);
                    match (was_blind, host.limiter().view().blind_since.is_some()) {
                        (false, true) => tracing::warn!(
                            "started without a data_dir and no peer is reachable to pull this \
                             node's state from: what it admitted before it stopped is unknown, so \
                             it admits nothing of windows that may still count it (a day quota: \
                             until the day after next) until a peer answers"
                        ),
                        (true, false) => {
                            tracing::info!("a peer's state arrived: deciding every rule again");
                        }
                        _ => {}
                    }
                }
                Event::SharesChanged(list) => {
                    // The event's list first (a share that shrank and grows again within
                    // this batch is seen to grow, and waits), then, as for the view, the
                    // machine's current list, read and bound in one ordered step.
                    let _order = self.shares_order.lock();
                    let spending = self.cluster.lock().spending();
                    let waits = host.limiter().rebind([list, spending]);
                    if !waits.is_empty() {
                        tracing::info!(
                            ?waits,
                            "shares grew with the node list: each waits (rule, ms) for the \
                             window after next before it applies (docs/membership.md)"
                        );
                    }
                }
                Event::ListsBefore(before) => {
                    // In order with the rebinds (this comes before `Synced`: nothing was
                    // decided under the shares it holds down).
                    let _order = self.shares_order.lock();
                    let rules = host.limiter().hold_by_lists_before(&before);
                    if !rules.is_empty() {
                        tracing::info!(
                            ?rules,
                            "the node list changed while this node was down: shares it grew by \
                             wait as on a running node (docs/membership.md)"
                        );
                    }
                }
                Event::BequestsSettled(removed) => {
                    // In order with the rebinds that made the bequests.
                    let _order = self.shares_order.lock();
                    let rules = host.limiter().settle_bequests(&removed);
                    if !rules.is_empty() {
                        let removed: Vec<String> = removed.iter().map(|&n| self.id_of(n)).collect();
                        tracing::info!(
                            ?removed,
                            ?rules,
                            "taking over what removed nodes held of long windows (this node is their heir)"
                        );
                    }
                }
                Event::Synced => host.synced(),
                Event::PeerUp(n) => tracing::info!(peer = %self.id_of(n), "peer reachable"),
                Event::PeerDown(n) => {
                    tracing::warn!(peer = %self.id_of(n), "peer unreachable (not heard within suspect_after)");
                }
                Event::RegionReachable(r) => {
                    let rules = host.limiter().rules();
                    tracing::info!(region = %rules.replicas.region_name(r), "region reachable");
                }
                Event::RegionUnreachable(r) => {
                    let rules = host.limiter().rules();
                    tracing::warn!(region = %rules.replicas.region_name(r), "region unreachable: deciding under conservative caps");
                }
                Event::ForwardReceived { from, id, checks } => {
                    self.answer_forwarded(host, from, id, &checks);
                }
                Event::ForwardAnswered { id, decisions } => {
                    let waiter = self.waiting.lock().remove(&id);
                    if let Some(w) = waiter {
                        w.answer(decisions);
                    }
                }
                Event::ForwardFailed { id } => {
                    // Dropped: its callers decide alone.
                    drop(self.waiting.lock().remove(&id));
                }
            }
        }
    }

    /// Decides, as their owner, the checks a region-mate forwarded, and answers them: inline,
    /// on the task that received them (deciding is a few microseconds a check; a task of its
    /// own cost a wake-up per batch). Nothing is decided once the node is closing.
    fn answer_forwarded<H: ClusterHost>(
        self: &Arc<Self>,
        host: &Arc<H>,
        from: NodeIdx,
        id: ForwardId,
        checks: &[ForwardCheck],
    ) {
        // Counted before `closing` is read, so `close` sees either this decision in flight or
        // `closing` set here (both SeqCst).
        self.deciding.fetch_add(1, Ordering::SeqCst);
        let decisions = if self.closing.load(Ordering::SeqCst) {
            vec![None; checks.len()]
        } else {
            // A key this node took over from an unreachable owner is decided alone, and says
            // so (`degraded`).
            let alone: Vec<bool> = {
                let c = self.cluster.lock();
                checks
                    .iter()
                    .map(|k| c.route(k.key.as_bytes()) == Route::Alone)
                    .collect()
            };
            checks
                .iter()
                .zip(alone)
                .map(|(c, alone)| decide_forwarded(host.limiter(), c, alone))
                .collect()
        };
        self.deciding.fetch_sub(1, Ordering::SeqCst);
        let now = host.limiter().clock.now_ms();
        let (out, events) = {
            let mut c = self.cluster.lock();
            c.answer_forward(from, id, decisions, now);
            drain(&mut c)
        };
        self.send_all(out);
        self.dispatch(host, events);
    }

    /// The node is stopping and its HTTP requests are drained: from now on checks forwarded
    /// by region-mates are answered "not decided here" (the forwarder decides alone, as when
    /// the owner is unreachable); once the forwarded checks in flight are decided, what
    /// changed since the last gossip interval is sent to every peer at once, and their
    /// acknowledgements are awaited for up to [`CLOSE_ACK_WAIT`]. After this, nothing
    /// changes the node's counters: the final snapshot holds everything it admitted.
    pub async fn close<H: ClusterHost>(&self, host: &H) {
        self.closing.store(true, Ordering::SeqCst);
        while self.deciding.load(Ordering::SeqCst) > 0 {
            tokio::task::yield_now().await;
        }
        let acked = self.flush_and_await(host).await;
        tracing::info!(acked, "last deltas sent to the peers");
    }

    /// Sends what changed since the last gossip interval to every peer at once, and waits
    /// up to [`CLOSE_ACK_WAIT`] until the reachable peers acknowledge it; whether they did.
    /// (Events the flush raises stay queued for the timer task.)
    pub(super) async fn flush_and_await<H: ClusterHost>(&self, host: &H) -> bool {
        let now = host.limiter().clock.now_ms();
        let (out, sent_at) = {
            let mut c = self.cluster.lock();
            let mut digest = self.digest.lock();
            let mut states = NodeStates::new(host.limiter(), &mut digest);
            let sent_at = c.flush(now, &mut states);
            (std::iter::from_fn(|| c.poll_transmit()).collect(), sent_at)
        };
        self.send_all(out);
        tokio::time::timeout(CLOSE_ACK_WAIT, async {
            while !self.cluster.lock().acknowledged_since(sent_at) {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .is_ok()
    }

    /// Stops the timer and the transport.
    pub async fn shutdown(&self) {
        self.stopped.send_replace(true);
        self.transport.shutdown().await;
    }
}

/// The peers a configuration lists: every node but this one. Removed nodes keep a link,
/// which dials only when something is sent: nothing but this node's list, when a removed
/// node is heard (one frozen when it was removed and thawed since learns it has no share).
fn peer_addrs(config: &Config) -> Vec<PeerAddr> {
    config
        .cluster
        .iter()
        .flat_map(|c| &c.nodes)
        .filter(|n| n.id != config.node.id)
        .map(|n| PeerAddr {
            id: n.id.clone(),
            addr: n.addr.clone(),
        })
        .collect()
}

/// What the machine queued: messages to send and events to act on.
fn drain(cluster: &mut Cluster) -> (Vec<Outgoing>, Vec<Event>) {
    (
        std::iter::from_fn(|| cluster.poll_transmit()).collect(),
        std::iter::from_fn(|| cluster.poll_event()).collect(),
    )
}
