//! The node's side of the cluster: the protocol state machine (`levee-cluster`) driven by a
//! gossip ticker and the QUIC transport (`levee-transport`), and the forwarding of checks to
//! their owners.
//!
//! The state machine sits behind one mutex; the ticker and the inbound loop hold it only to
//! feed it and drain what it wants sent, and never across an await. A check whose key another
//! node of this region owns is forwarded to that owner (checks to one owner are batched: while
//! one batch is in flight the next one gathers); if the owner is unreachable, or does not
//! answer in time, this node decides alone under its own conservative cap and says
//! `degraded: true`. No decision ever waits on another region.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use levee_cluster::{Cluster, ClusterConfig, Outgoing};
use levee_core::{Millis, NodeIdx};
use levee_proto::{ForwardCheck, ForwardDecision, Hello, Message};
use levee_transport::{Inbound, PeerAddr, TlsFiles, Transport, TransportConfig};
use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot, watch};

use crate::app::App;
use crate::config::Config;
use crate::states::{NodeDigest, NodeStates};

/// How long a forwarded batch may take before the forwarder decides alone.
const FORWARD_TIMEOUT_MAX: Duration = Duration::from_millis(500);
/// Most checks in one forwarded batch.
const FORWARD_BATCH: usize = 256;
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

struct Job {
    check: ForwardCheck,
    reply: oneshot::Sender<Option<ForwardDecision>>,
}

/// The running cluster side of a node.
pub struct Replication {
    cluster: Mutex<Cluster>,
    /// The store's anti-entropy digest; locked only while `cluster` is.
    digest: Mutex<NodeDigest>,
    transport: Transport,
    ids: Vec<String>,
    me: NodeIdx,
    forwarders: Vec<Option<mpsc::Sender<Job>>>,
    forward_timeout: Duration,
    next_request: AtomicU64,
    /// `cluster.suspect_after`, ms.
    suspect_after: Millis,
}

impl Replication {
    /// Starts the transport and the state machine for `config` (which has `[cluster]`).
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
                addr: n.addr,
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
        let state = Cluster::new(
            ClusterConfig {
                me,
                replicas: replicas.clone(),
                consistency: cluster_cfg.mode,
                gossip_interval: cluster_cfg.gossip_interval.as_millis(),
                suspect_after: cluster_cfg.suspect_after.as_millis(),
                anti_entropy_interval: ANTI_ENTROPY_INTERVAL,
            },
            now,
        );
        let forward_timeout =
            Duration::from_millis(cluster_cfg.suspect_after.as_millis()).min(FORWARD_TIMEOUT_MAX);
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
            forward_timeout,
            next_request: AtomicU64::new(1),
            suspect_after: cluster_cfg.suspect_after.as_millis(),
        });
        for (owner, rx) in receivers {
            tokio::spawn(forward_loop(Arc::clone(&repl), owner, rx));
        }
        Ok((repl, inbound))
    }

    /// The owner of `key` in this node's region.
    pub fn owner(&self, key: &str) -> NodeIdx {
        self.cluster.lock().owner(key.as_bytes())
    }

    /// This node.
    pub fn me(&self) -> NodeIdx {
        self.me
    }

    /// Whether a peer is reachable.
    pub fn is_reachable(&self, peer: NodeIdx) -> bool {
        self.cluster.lock().is_reachable(peer)
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

    /// Forwards a check to its owner; `None` when the owner could not decide in time.
    pub async fn forward(&self, owner: NodeIdx, check: ForwardCheck) -> Option<ForwardDecision> {
        let tx = self.forwarders.get(usize::from(owner.0))?.as_ref()?;
        let (reply, rx) = oneshot::channel();
        tx.try_send(Job { check, reply }).ok()?;
        rx.await.ok().flatten()
    }

    fn send_all(&self, out: Vec<Outgoing>) {
        for o in out {
            self.transport.send(&self.ids[usize::from(o.to.0)], &o.msg);
        }
    }

    /// Stops the transport.
    pub async fn shutdown(&self) {
        self.transport.shutdown().await;
    }
}

fn drain(cluster: &mut Cluster) -> Vec<Outgoing> {
    std::iter::from_fn(|| cluster.poll_transmit()).collect()
}

/// Sends batches of checks to one owner, one batch in flight at a time.
async fn forward_loop(repl: Arc<Replication>, owner: NodeIdx, mut rx: mpsc::Receiver<Job>) {
    let peer = repl.ids[usize::from(owner.0)].clone();
    while let Some(first) = rx.recv().await {
        let mut jobs = vec![first];
        while jobs.len() < FORWARD_BATCH {
            match rx.try_recv() {
                Ok(j) => jobs.push(j),
                Err(_) => break,
            }
        }
        let id = repl.next_request.fetch_add(1, Ordering::Relaxed);
        let checks: Vec<ForwardCheck> = jobs.iter().map(|j| j.check.clone()).collect();
        let answer = repl
            .transport
            .request(
                &peer,
                &Message::Forward { id, checks },
                repl.forward_timeout,
            )
            .await;
        let mut decisions = match answer {
            Ok(Message::ForwardReply { id: got, decisions })
                if got == id && decisions.len() == jobs.len() =>
            {
                decisions
            }
            Ok(_) => {
                tracing::warn!(peer = %peer, "malformed forward reply; deciding alone");
                vec![None; jobs.len()]
            }
            Err(e) => {
                tracing::debug!(peer = %peer, error = %e, "forward failed; deciding alone");
                vec![None; jobs.len()]
            }
        };
        for (job, d) in jobs.into_iter().zip(decisions.drain(..)) {
            let _ = job.reply.send(d);
        }
    }
}

/// Drives the protocol: a tick every gossip interval until `stop`.
pub async fn run_ticks(
    app: Arc<App>,
    repl: Arc<Replication>,
    every: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let suspect_after = repl.suspect_after;
    let mut redialled: Vec<Millis> = vec![0; repl.ids.len()];
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        let now = app.limiter.clock.now_ms();
        let (out, peers) = {
            let mut c = repl.cluster.lock();
            let mut digest = repl.digest.lock();
            let mut states = NodeStates::new(&app.limiter, &mut digest);
            c.handle_tick(now, &mut states);
            app.limiter.set_view(c.view());
            if c.is_synced() && !app.shutting_down.load(Ordering::Acquire) {
                app.set_ready(true);
            }
            (drain(&mut c), c.peers_status(now))
        };
        repl.send_all(out);
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
pub async fn run_inbound(app: Arc<App>, repl: Arc<Replication>, mut rx: mpsc::Receiver<Inbound>) {
    while let Some(inb) = rx.recv().await {
        let Some(from) = repl
            .ids
            .iter()
            .position(|id| *id == inb.peer)
            .map(|i| NodeIdx(i as u16))
        else {
            continue;
        };
        let now = app.limiter.clock.now_ms();
        match inb.msg {
            Message::Forward { id, checks } => {
                {
                    let mut c = repl.cluster.lock();
                    c.handle_message(
                        from,
                        Message::Forward {
                            id,
                            checks: Vec::new(),
                        },
                        now,
                        &mut NodeStates::for_messages(&app.limiter, &mut repl.digest.lock()),
                    );
                }
                let app = Arc::clone(&app);
                tokio::spawn(async move {
                    let decisions = checks.iter().map(|c| app.decide_forwarded(c)).collect();
                    if let Some(tx) = inb.reply {
                        let _ = tx.send(Message::ForwardReply { id, decisions });
                    }
                });
            }
            msg => {
                let out = {
                    let mut c = repl.cluster.lock();
                    let mut digest = repl.digest.lock();
                    let mut states = NodeStates::for_messages(&app.limiter, &mut digest);
                    c.handle_message(from, msg, now, &mut states);
                    app.limiter.set_view(c.view());
                    drain(&mut c)
                };
                repl.send_all(out);
            }
        }
    }
}
