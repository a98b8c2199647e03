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

use levee_cluster::{Cluster, ClusterConfig, Event, ForwardId, Outgoing, Route};
use levee_core::{Millis, NodeIdx};
use levee_proto::{ForwardCheck, ForwardDecision, Hello};
use levee_transport::{Inbound, PeerAddr, TlsFiles, Transport, TransportConfig};
use parking_lot::Mutex;
use tokio::sync::{Notify, mpsc, oneshot, watch};

use crate::config::Config;
use crate::limiter::{CheckRef, Limiter};
use crate::states::{NodeDigest, NodeStates};

/// How long a forwarded batch may take before the forwarder decides alone.
const FORWARD_TIMEOUT_MAX: Millis = 500;
/// Most checks in one forwarded batch: what the receiving owner accepts.
const FORWARD_BATCH: usize = levee_proto::MAX_FORWARD_CHECKS;
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

struct Job {
    check: ForwardCheck,
    /// When it was asked (the node's clock).
    now: Millis,
    reply: oneshot::Sender<Option<ForwardDecision>>,
}

type Answer = Option<Vec<Option<ForwardDecision>>>;

/// The running cluster side of a node.
pub struct Replication {
    cluster: Mutex<Cluster>,
    /// The store's anti-entropy digest; locked only while `cluster` is.
    digest: Mutex<NodeDigest>,
    transport: Transport,
    ids: Vec<String>,
    me: NodeIdx,
    forwarders: Vec<Option<mpsc::Sender<Job>>>,
    /// Forwarded batches waiting for the machine's answer; filled while `cluster` is locked.
    waiting: Mutex<HashMap<ForwardId, oneshot::Sender<Answer>>>,
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
            .nodes()
            .map(|n| replicas.node_id(n).to_owned())
            .collect();
        let peers = cluster_cfg
            .nodes
            .iter()
            .filter(|n| n.id != config.node.id)
            .map(|n| PeerAddr {
                id: n.id.clone(),
                addr: n.addr.clone(),
            })
            .collect();
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
        };
        let (transport, inbound) = Transport::start(transport_cfg).await?;
        let suspect_after = cluster_cfg.suspect_after.as_millis();
        let state = Cluster::new(
            ClusterConfig {
                me,
                replicas: replicas.clone(),
                gossip_interval: cluster_cfg.gossip_interval.as_millis(),
                suspect_after,
                anti_entropy_interval: ANTI_ENTROPY_INTERVAL,
                forward_timeout: suspect_after.min(FORWARD_TIMEOUT_MAX),
                tick_phase: 0,
            },
            now,
        );
        let mut forwarders = Vec::with_capacity(ids.len());
        let mut receivers = Vec::new();
        let my_region = replicas.region_of(me);
        for n in replicas.nodes() {
            if n != me && replicas.region_of(n) == my_region {
                let (tx, rx) = mpsc::channel(4096);
                forwarders.push(Some(tx));
                receivers.push((n, rx));
            } else {
                forwarders.push(None);
            }
        }
        let repl = Arc::new(Replication {
            cluster: Mutex::new(state),
            digest: Mutex::new(NodeDigest::default()),
            transport,
            ids,
            me,
            forwarders,
            waiting: Mutex::new(HashMap::new()),
            view_order: Mutex::new(()),
            timer_at: AtomicU64::new(0),
            wake_timer: Notify::new(),
            suspect_after,
            closing: AtomicBool::new(false),
            deciding: AtomicUsize::new(0),
            stopped: watch::channel(false).0,
        });
        for (owner, rx) in receivers {
            tokio::spawn(forward_loop(Arc::clone(&repl), owner, rx));
        }
        Ok((repl, inbound))
    }

    /// Starts the timer and the inbound loop for the node `host`; they run until
    /// [`Replication::shutdown`] (gossip goes on while the node drains its HTTP requests).
    pub fn run<H: ClusterHost>(self: &Arc<Self>, host: Arc<H>, inbound: mpsc::Receiver<Inbound>) {
        tokio::spawn(run_inbound(Arc::clone(&host), Arc::clone(self), inbound));
        tokio::spawn(run_timer(host, Arc::clone(self), self.stopped.subscribe()));
    }

    /// Where a check of `key` is decided.
    pub fn route(&self, key: &str) -> Route {
        self.cluster.lock().route(key.as_bytes())
    }

    /// The owner of `key` in this node's region.
    pub fn owner(&self, key: &str) -> NodeIdx {
        self.cluster.lock().owner(key.as_bytes())
    }

    /// This node.
    pub fn me(&self) -> NodeIdx {
        self.me
    }

    /// Whether the node has pulled the cluster's state.
    pub fn is_synced(&self) -> bool {
        self.cluster.lock().is_synced()
    }

    /// The peers' status for `/v1/cluster`.
    pub fn peers(&self, now: Millis) -> Vec<levee_cluster::PeerStatus> {
        self.cluster.lock().peers_status(now)
    }

    /// A node's id.
    pub fn id_of(&self, n: NodeIdx) -> &str {
        &self.ids[usize::from(n.0)]
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
        let tx = self.forwarders.get(usize::from(owner.0))?.as_ref()?;
        metrics::counter!("levee_forwarded_checks_total").increment(1);
        let (reply, rx) = oneshot::channel();
        tx.try_send(Job { check, now, reply }).ok()?;
        Some(rx)
    }

    fn send_all(&self, out: Vec<Outgoing>) {
        for o in out {
            self.transport.send(&self.ids[usize::from(o.to.0)], &o.msg);
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
                    host.limiter().set_view(view);
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
                    if let Some(tx) = self.waiting.lock().remove(&id) {
                        let _ = tx.send(Some(decisions));
                    }
                }
                Event::ForwardFailed { id } => {
                    if let Some(tx) = self.waiting.lock().remove(&id) {
                        let _ = tx.send(None);
                    }
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
        let now = host.limiter().clock.now_ms();
        let (out, sent_at) = {
            let mut c = self.cluster.lock();
            let mut digest = self.digest.lock();
            let mut states = NodeStates::new(host.limiter(), &mut digest);
            let sent_at = c.flush(now, &mut states);
            (std::iter::from_fn(|| c.poll_transmit()).collect(), sent_at)
        };
        self.send_all(out);
        let acked = tokio::time::timeout(CLOSE_ACK_WAIT, async {
            while !self.cluster.lock().acknowledged_since(sent_at) {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .is_ok();
        tracing::info!(acked, "last deltas sent to the peers");
    }

    /// Stops the timer and the transport.
    pub async fn shutdown(&self) {
        self.stopped.send_replace(true);
        self.transport.shutdown().await;
    }
}

/// Decides a check forwarded by a region-mate, as the key's owner; `alone` when this node
/// owns the key only because its owner is unreachable (as in [`Limiter::check_with`]).
/// `None` if it cannot be decided here (the forwarder then decides alone).
pub fn decide_forwarded(
    limiter: &Limiter,
    c: &ForwardCheck,
    alone: bool,
) -> Option<ForwardDecision> {
    let req = CheckRef {
        rule: &c.rule,
        key: &c.key,
        cost: c.cost,
        class: c.class.as_deref(),
        idempotency_key: c.idempotency_key.as_deref(),
        dry_run: c.dry_run,
    };
    let out = if c.refund {
        limiter.refund_with(req, alone)
    } else {
        limiter.check_with(req, alone)
    }
    .ok()?;
    let d = out.decision;
    Some(ForwardDecision {
        allowed: d.allowed,
        would_allow: d.would_allow,
        limit: d.limit,
        remaining: d.remaining,
        reset_after_ms: d.reset_after_ms,
        // An admitted decision has no retry-after: the field carries a leaky bucket's delay
        // instead (levee_proto::ForwardDecision), so the wire format stays as it is.
        retry_after_ms: if d.would_allow {
            d.delay_ms
        } else {
            d.retry_after_ms
        },
        degraded: d.degraded,
    })
}

/// What the machine queued: messages to send and events to act on.
fn drain(cluster: &mut Cluster) -> (Vec<Outgoing>, Vec<Event>) {
    (
        std::iter::from_fn(|| cluster.poll_transmit()).collect(),
        std::iter::from_fn(|| cluster.poll_event()).collect(),
    )
}

/// Sends batches of checks to one owner through the machine, one batch in flight at a time.
async fn forward_loop(repl: Arc<Replication>, owner: NodeIdx, mut rx: mpsc::Receiver<Job>) {
    while let Some(first) = rx.recv().await {
        let mut jobs = vec![first];
        while jobs.len() < FORWARD_BATCH {
            match rx.try_recv() {
                Ok(j) => jobs.push(j),
                Err(_) => break,
            }
        }
        let checks: Vec<ForwardCheck> = jobs.iter().map(|j| j.check.clone()).collect();
        let (tx, answer) = oneshot::channel();
        let (out, deadline) = {
            let mut c = repl.cluster.lock();
            let now = jobs.iter().map(|j| j.now).max().unwrap_or(0);
            let id = c.forward(owner, checks, now);
            repl.waiting.lock().insert(id, tx);
            let out: Vec<Outgoing> = std::iter::from_fn(|| c.poll_transmit()).collect();
            (out, c.poll_timeout())
        };
        repl.send_all(out);
        if deadline < repl.timer_at.load(Ordering::Acquire) {
            repl.wake_timer.notify_one();
        }
        let decisions = match answer.await {
            Ok(Some(d)) => d,
            _ => vec![None; jobs.len()],
        };
        for (job, d) in jobs.into_iter().zip(decisions) {
            let _ = job.reply.send(d);
        }
    }
}

/// Drives the machine's timers: wakes when [`Cluster::poll_timeout`] says, until `stop`.
async fn run_timer<H: ClusterHost>(
    host: Arc<H>,
    repl: Arc<Replication>,
    mut stop: watch::Receiver<bool>,
) {
    let suspect_after = repl.suspect_after;
    let mut redialled: Vec<Millis> = vec![0; repl.ids.len()];
    let mut next_status: Millis = 0;
    loop {
        let at = repl.cluster.lock().poll_timeout();
        repl.timer_at.store(at, Ordering::Release);
        let wait = at.saturating_sub(host.limiter().clock.now_ms());
        tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(wait)) => {}
            () = repl.wake_timer.notified() => continue,
            _ = stop.changed() => return,
        }
        let now = host.limiter().clock.now_ms();
        let (out, events, peers) = {
            let mut c = repl.cluster.lock();
            let mut digest = repl.digest.lock();
            let mut states = NodeStates::new(host.limiter(), &mut digest);
            c.handle_timeout(now, &mut states);
            let (out, events) = drain(&mut c);
            let peers =
                (now >= next_status).then(|| (c.peers_status(now), c.refused(), c.rights_given()));
            (out, events, peers)
        };
        repl.send_all(out);
        repl.dispatch(&host, events);
        let Some((peers, refused, given)) = peers else {
            continue;
        };
        next_status = now + 100;
        // What peers sent that was refused after decoding (states, ids, forwards, digests):
        // the machine counts, this exports its running total.
        metrics::counter!("levee_replication_refused_total").absolute(refused);
        metrics::counter!("levee_rights_moved_total").absolute(given);
        crate::activity::set_rights_moved(given);
        for p in peers {
            let peer = repl.id_of(p.node).to_owned();
            // We hear the peer but it has not acknowledged us for twice suspect_after (it has
            // long marked us unreachable): our connection to it may be dead at its end while
            // ours still hears its keep-alives. Redial, at most twice per suspect_after.
            let deaf = p.reachable && p.ack_lag_ms.is_some_and(|lag| lag > 2 * suspect_after);
            let i = usize::from(p.node.0);
            if deaf && now.saturating_sub(redialled[i]) > suspect_after / 2 {
                redialled[i] = now;
                repl.transport.reconnect(&peer);
            }
            if let Some(lag) = p.ack_lag_ms {
                metrics::gauge!("levee_gossip_ack_lag_ms", "peer" => peer.clone()).set(lag as f64);
            }
            metrics::gauge!("levee_gossip_backlog_keys", "peer" => peer).set(p.backlog_keys as f64);
        }
    }
}

/// Handles every message from peers until the transport closes.
async fn run_inbound<H: ClusterHost>(
    host: Arc<H>,
    repl: Arc<Replication>,
    mut rx: mpsc::Receiver<Inbound>,
) {
    while let Some(inb) = rx.recv().await {
        let Some(from) = repl
            .ids
            .iter()
            .position(|id| *id == inb.peer)
            .map(|i| NodeIdx(i as u16))
        else {
            continue;
        };
        let now = host.limiter().clock.now_ms();
        let (out, events) = {
            let mut c = repl.cluster.lock();
            let mut digest = repl.digest.lock();
            let mut states = NodeStates::new(host.limiter(), &mut digest);
            c.handle_message(from, inb.msg, now, &mut states);
            drain(&mut c)
        };
        repl.send_all(out);
        repl.dispatch(&host, events);
    }
}
