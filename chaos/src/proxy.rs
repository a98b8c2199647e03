//! The userspace UDP fault proxy: one relay per directed link between two nodes (the sandbox
//! kernel has no `netem`).
//!
//! For the link `from → to` the proxy listens on a UDP port that `from`'s configuration names
//! as `to`'s address. Every datagram that arrives there from some client address (node
//! `from`'s QUIC socket, or an impostor on the same port) goes out of an upstream socket of
//! that client's own to `to`'s real QUIC port; what `to` answers on that upstream socket goes
//! back to the client from the listening port. QUIC is connection-oriented over UDP, so the
//! per-client mapping is what keeps each connection's 4-tuple stable on both sides, across
//! restarts of either node.
//!
//! Faults are kept per ordered pair of nodes (`a`, `b`): they apply to every datagram node
//! `a` sends to node `b`, whichever connection carries it — `a`'s own connection through the
//! `a → b` relay, and `a`'s answers on `b`'s connection through the `b → a` relay. A one-way
//! cut of `a → b` therefore silences `a` towards `b` on both connections while `b` is still
//! heard by `a`. Every fault can be changed at run time; each direction draws its loss,
//! duplication, jitter and reordering from its own stream of the scenario's seed
//! ([`SeededRng::stream`], named after the direction).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use levee_testkit::rng::SeededRng;
use serde::Serialize;
use tokio::net::UdpSocket;
use tokio::runtime::Runtime;

/// What happens to the datagrams one node sends to another.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct Faults {
    /// Fixed one-way delay, ms.
    pub delay_ms: u64,
    /// Extra one-way delay drawn uniformly from `0..=jitter_ms` per datagram.
    pub jitter_ms: u64,
    /// Probability that a datagram is dropped.
    pub loss: f64,
    /// Probability that a datagram is delivered twice (each copy delayed on its own).
    pub duplicate: f64,
    /// Probability that a datagram is held back by `reorder_ms`, so later ones overtake it.
    pub reorder: f64,
    /// How long a reordered datagram is held back, ms.
    pub reorder_ms: u64,
    /// Drop everything (a partition, or one direction of a one-way cut).
    pub cut: bool,
}

impl Faults {
    /// A healthy link.
    pub const NONE: Faults = Faults {
        delay_ms: 0,
        jitter_ms: 0,
        loss: 0.0,
        duplicate: 0.0,
        reorder: 0.0,
        reorder_ms: 0,
        cut: false,
    };

    /// Nothing gets through.
    pub fn cut() -> Faults {
        Faults {
            cut: true,
            ..Faults::NONE
        }
    }

    /// A one-way delay with jitter.
    pub fn latency(one_way_ms: u64, jitter_ms: u64) -> Faults {
        Faults {
            delay_ms: one_way_ms,
            jitter_ms,
            ..Faults::NONE
        }
    }

    /// Random loss.
    pub fn loss(p: f64) -> Faults {
        Faults {
            loss: p,
            ..Faults::NONE
        }
    }

    /// The longest one-way delay a delivered datagram can see, ms.
    pub fn max_one_way_ms(&self) -> u64 {
        self.delay_ms
            + self.jitter_ms
            + if self.reorder > 0.0 {
                self.reorder_ms
            } else {
                0
            }
    }
}

/// One directed link: node `from` reaches node `to` at `listen`, which relays to `upstream`.
#[derive(Debug, Clone, Copy)]
pub struct LinkSpec {
    /// The dialling node's index.
    pub from: usize,
    /// The dialled node's index.
    pub to: usize,
    /// Where `from` sends (its configuration's address of `to`).
    pub listen: SocketAddr,
    /// `to`'s real QUIC address.
    pub upstream: SocketAddr,
}

/// What the proxy did with the datagrams it saw.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ProxyCounts {
    /// Datagrams received from either side.
    pub datagrams: u64,
    /// Copies sent on (duplicates count twice).
    pub delivered: u64,
    /// Dropped by a cut.
    pub cut: u64,
    /// Dropped at random.
    pub lost: u64,
    /// Delivered twice.
    pub duplicated: u64,
    /// Held back to be overtaken.
    pub reordered: u64,
}

const DATAGRAMS: usize = 0;
const DELIVERED: usize = 1;
const CUT: usize = 2;
const LOST: usize = 3;
const DUPLICATED: usize = 4;
const REORDERED: usize = 5;

/// One ordered pair's faults, random stream and counters.
struct Direction {
    faults: Mutex<Faults>,
    rng: Mutex<SeededRng>,
    counts: [AtomicU64; 6],
}

impl Direction {
    fn count(&self, which: usize) {
        self.counts[which].fetch_add(1, Ordering::Relaxed);
    }
}

struct Shared {
    nodes: usize,
    pairs: Vec<Direction>,
}

/// Where a relayed datagram goes.
#[derive(Clone)]
enum Out {
    /// To the dialled node, on the client's upstream socket.
    Upstream(Arc<UdpSocket>),
    /// Back to the client, from the listening socket.
    Back(Arc<UdpSocket>, SocketAddr),
}

impl Out {
    async fn send(&self, data: &[u8]) {
        // A send can fail while a node is down (ICMP port unreachable): the datagram is
        // lost, as it would be on a real network.
        let _ = match self {
            Out::Upstream(s) => s.send(data).await,
            Out::Back(s, to) => s.send_to(data, *to).await,
        };
    }
}

impl Shared {
    fn direction(&self, from: usize, to: usize) -> &Direction {
        &self.pairs[from * self.nodes + to]
    }

    /// Applies the faults of `sender → receiver` to one datagram and sends what survives.
    async fn pass(&self, sender: usize, receiver: usize, data: &[u8], out: &Out) {
        let d = self.direction(sender, receiver);
        d.count(DATAGRAMS);
        let f = *d.faults.lock().unwrap_or_else(|p| p.into_inner());
        if f.cut {
            d.count(CUT);
            return;
        }
        let mut delays = [None, None];
        {
            let mut rng = d.rng.lock().unwrap_or_else(|p| p.into_inner());
            if rng.chance(f.loss) {
                d.count(LOST);
                return;
            }
            let copies = if rng.chance(f.duplicate) {
                d.count(DUPLICATED);
                2
            } else {
                1
            };
            for slot in delays.iter_mut().take(copies) {
                let mut delay = f.delay_ms + rng.range(0, f.jitter_ms);
                if rng.chance(f.reorder) {
                    d.count(REORDERED);
                    delay += f.reorder_ms;
                }
                *slot = Some(delay);
            }
        }
        for delay in delays.into_iter().flatten() {
            d.count(DELIVERED);
            if delay == 0 {
                out.send(data).await;
            } else {
                let data = data.to_vec();
                let out = out.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(delay)).await;
                    out.send(&data).await;
                });
            }
        }
    }
}

/// The running proxy: every link's relay on a one-thread tokio runtime of its own. Dropping
/// it stops every relay and closes every socket.
pub struct FaultProxy {
    runtime: Option<Runtime>,
    shared: Arc<Shared>,
    links: Vec<LinkSpec>,
}

impl std::fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultProxy")
            .field("links", &self.links.len())
            .finish_non_exhaustive()
    }
}

impl FaultProxy {
    /// Binds every link's listening port and starts relaying; every link starts healthy.
    /// `nodes` is the number of nodes (indices in `links` are below it).
    pub fn start(nodes: usize, links: Vec<LinkSpec>, seed: u64) -> std::io::Result<FaultProxy> {
        let mut listeners = Vec::with_capacity(links.len());
        for l in &links {
            let s = std::net::UdpSocket::bind(l.listen)?;
            s.set_nonblocking(true)?;
            listeners.push(s);
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("levee-chaos-proxy")
            .enable_io()
            .enable_time()
            .build()?;
        let shared = Arc::new(Shared {
            nodes,
            pairs: (0..nodes * nodes)
                .map(|i| Direction {
                    faults: Mutex::new(Faults::NONE),
                    rng: Mutex::new(SeededRng::stream(
                        seed,
                        &format!("direction {}->{}", i / nodes, i % nodes),
                    )),
                    counts: Default::default(),
                })
                .collect(),
        });
        {
            let _guard = runtime.enter();
            for (l, s) in links.iter().zip(listeners) {
                let listener = Arc::new(UdpSocket::from_std(s)?);
                runtime.spawn(relay_link(listener, *l, shared.clone()));
            }
        }
        Ok(FaultProxy {
            runtime: Some(runtime),
            shared,
            links,
        })
    }

    /// The links, as started.
    pub fn links(&self) -> &[LinkSpec] {
        &self.links
    }

    /// Sets the faults of every datagram node `from` sends to node `to`.
    pub fn set(&self, from: usize, to: usize, faults: Faults) {
        *self
            .shared
            .direction(from, to)
            .faults
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = faults;
    }

    /// The faults node `from`'s datagrams to node `to` currently meet.
    pub fn faults(&self, from: usize, to: usize) -> Faults {
        *self
            .shared
            .direction(from, to)
            .faults
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Heals every link.
    pub fn clear(&self) {
        for from in 0..self.shared.nodes {
            for to in 0..self.shared.nodes {
                self.set(from, to, Faults::NONE);
            }
        }
    }

    /// What the proxy has done so far, over every link.
    pub fn counts(&self) -> ProxyCounts {
        let sum = |which: usize| {
            self.shared
                .pairs
                .iter()
                .map(|d| d.counts[which].load(Ordering::Relaxed))
                .sum()
        };
        ProxyCounts {
            datagrams: sum(DATAGRAMS),
            delivered: sum(DELIVERED),
            cut: sum(CUT),
            lost: sum(LOST),
            duplicated: sum(DUPLICATED),
            reordered: sum(REORDERED),
        }
    }

    /// Stops every relay and closes every socket (also on drop).
    pub fn shutdown(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_timeout(Duration::from_secs(1));
        }
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Relays one directed link: datagrams from clients to `link.upstream`, answers back.
async fn relay_link(listener: Arc<UdpSocket>, link: LinkSpec, shared: Arc<Shared>) {
    let mut sessions: HashMap<SocketAddr, Out> = HashMap::new();
    let mut buf = vec![0u8; 65_535];
    loop {
        let (len, client) = match listener.recv_from(&mut buf).await {
            Ok(x) => x,
            Err(_) => {
                // An ICMP error reported on the socket: nothing to relay.
                tokio::time::sleep(Duration::from_millis(1)).await;
                continue;
            }
        };
        let out = match sessions.get(&client) {
            Some(out) => out.clone(),
            None => {
                let Ok(upstream) = UdpSocket::bind(("127.0.0.1", 0)).await else {
                    continue;
                };
                if upstream.connect(link.upstream).await.is_err() {
                    continue;
                }
                let upstream = Arc::new(upstream);
                tokio::spawn(relay_back(
                    upstream.clone(),
                    Out::Back(listener.clone(), client),
                    link,
                    shared.clone(),
                ));
                let out = Out::Upstream(upstream);
                sessions.insert(client, out.clone());
                out
            }
        };
        shared.pass(link.from, link.to, &buf[..len], &out).await;
    }
}

/// Relays what the dialled node answers on one client's upstream socket back to the client.
async fn relay_back(upstream: Arc<UdpSocket>, back: Out, link: LinkSpec, shared: Arc<Shared>) {
    let mut buf = vec![0u8; 65_535];
    loop {
        match upstream.recv(&mut buf).await {
            Ok(len) => shared.pass(link.to, link.from, &buf[..len], &back).await,
            // The dialled node is down (ICMP port unreachable): wait for it to come back.
            Err(_) => tokio::time::sleep(Duration::from_millis(1)).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::UdpSocket as StdUdp;

    /// A proxy for the link 0 → 1 in front of an echo socket standing for node 1.
    fn echo_link(seed: u64) -> (FaultProxy, StdUdp, StdUdp, SocketAddr) {
        let server = StdUdp::bind("127.0.0.1:0").expect("bind the server");
        let listen = {
            let probe = StdUdp::bind("127.0.0.1:0").expect("bind a probe");
            probe.local_addr().expect("its address")
        };
        let proxy = FaultProxy::start(
            2,
            vec![LinkSpec {
                from: 0,
                to: 1,
                listen,
                upstream: server.local_addr().expect("server address"),
            }],
            seed,
        )
        .expect("start the proxy");
        let client = StdUdp::bind("127.0.0.1:0").expect("bind the client");
        client
            .set_read_timeout(Some(Duration::from_millis(300)))
            .expect("timeout");
        server
            .set_read_timeout(Some(Duration::from_millis(300)))
            .expect("timeout");
        (proxy, client, server, listen)
    }

    fn echo_once(client: &StdUdp, server: &StdUdp, listen: SocketAddr, msg: &[u8]) -> bool {
        client.send_to(msg, listen).expect("send");
        let mut buf = [0u8; 64];
        let Ok((n, from)) = server.recv_from(&mut buf) else {
            return false;
        };
        server.send_to(&buf[..n], from).expect("echo");
        matches!(client.recv_from(&mut buf), Ok((m, src)) if &buf[..m] == msg && src == listen)
    }

    #[test]
    fn relays_both_ways_and_a_cut_or_a_one_way_cut_drops_only_its_direction() {
        let (proxy, client, server, listen) = echo_link(1);
        assert!(echo_once(&client, &server, listen, b"hello"), "healthy");

        // 0 → 1 cut: nothing reaches the server.
        proxy.set(0, 1, Faults::cut());
        client.send_to(b"lost", listen).expect("send");
        let mut buf = [0u8; 64];
        assert!(server.recv_from(&mut buf).is_err(), "a cut drops 0 → 1");

        // Only 1 → 0 cut: the server hears the client, the answer is dropped.
        proxy.set(0, 1, Faults::NONE);
        proxy.set(1, 0, Faults::cut());
        client.send_to(b"one-way", listen).expect("send");
        let (n, from) = server.recv_from(&mut buf).expect("0 → 1 still flows");
        server.send_to(&buf[..n], from).expect("answer");
        assert!(client.recv_from(&mut buf).is_err(), "1 → 0 is cut");

        proxy.clear();
        assert!(echo_once(&client, &server, listen, b"healed"), "healed");
        let c = proxy.counts();
        assert_eq!(c.cut, 2, "{c:?}");
    }

    #[test]
    fn delay_holds_datagrams_and_loss_and_duplication_follow_their_rates() {
        let (proxy, client, server, listen) = echo_link(2);
        proxy.set(0, 1, Faults::latency(120, 0));
        let sent = std::time::Instant::now();
        client.send_to(b"late", listen).expect("send");
        let mut buf = [0u8; 64];
        server
            .recv_from(&mut buf)
            .expect("delivered after the delay");
        assert!(sent.elapsed() >= Duration::from_millis(120));

        proxy.set(
            0,
            1,
            Faults {
                loss: 0.5,
                duplicate: 0.5,
                ..Faults::NONE
            },
        );
        let before = proxy.counts();
        for i in 0..400u32 {
            client.send_to(&i.to_le_bytes(), listen).expect("send");
            if i % 20 == 19 {
                // Keep the proxy's receive buffer from overflowing: only what it reads counts.
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while proxy.counts().datagrams - before.datagrams < 400
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(10));
        }
        let c = proxy.counts();
        assert_eq!(
            c.datagrams - before.datagrams,
            400,
            "the proxy read every datagram"
        );
        let lost = c.lost - before.lost;
        let dup = c.duplicated - before.duplicated;
        assert!((150..250).contains(&lost), "lost {lost} of 400");
        assert!(
            (dup as f64 / (400 - lost) as f64 - 0.5).abs() < 0.15,
            "duplicated {dup} of {}",
            400 - lost
        );
    }
}
