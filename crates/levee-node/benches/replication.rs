//! What replication costs per decision, in one process, with the node's own store
//! ([`NodeStates`] over a [`Limiter`]) and every frame through the real codec, but no QUIC, no
//! kernel and no threads: the part of figure 9 (docs/benchmarks.md) that is Levee's own code.
//!
//! ```text
//! cargo bench -p levee-node --bench replication -- [--local-first] [REGIONS [NODES [RATE [SECONDS [KEYS [WARM]]]]]]
//! ```
//!
//! defaults `1 2 10000 4 10000 1`: one region of two nodes, 10,000 decisions a second for 4 s
//! (after a second of warm-up) over 10,000 keys, each decided by its owner (a caller that
//! routes to owners, figure 9's `--owned-only`), a token bucket far above what a key sees.
//! With `--local-first`, every node runs `cluster.local_first` and the first node is asked
//! about every key: it decides those it holds rights for, and the owner decides the rest (as
//! if forwarded, without the frames; counted).
//! Gossip every 20 ms, as `levee cluster` and figure 9 run. It prints, per decision, the time
//! spent deciding and, node by node, the time spent in the replication machine (the
//! interval's work, encoding, decoding and merging). The time is the wall time of those
//! sections on one thread; under `valgrind --tool=callgrind` (fewer seconds, a lower rate) the
//! instruction counts of each part compare two builds exactly.

// A report on standard output is what this program is for.
#![allow(clippy::print_stdout)]

use std::time::{Duration, Instant};

use levee_cluster::{Cluster, ClusterConfig, Event, Topology};
use levee_core::{Millis, NodeIdx};
use levee_node::Config;
use levee_node::limiter::{CheckRef, Clock, Limiter};
use levee_node::states::{NodeDigest, NodeStates};
use levee_proto::{Message, decode_frame, encode_frame};

/// The node's own allocator (`crates/levee/src/main.rs`): what allocations cost differs.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const INTERVAL_MS: Millis = 20;

struct Node {
    limiter: Limiter,
    cluster: Cluster,
    digest: NodeDigest,
    /// Time spent in the replication machine while measuring.
    spent: Duration,
    bytes: u64,
    /// Keys received in `Deltas` while measuring.
    keys_in: u64,
    /// Messages received while measuring, by kind.
    kinds: std::collections::BTreeMap<String, u64>,
}

fn config(regions: usize, nodes: usize, me: (usize, usize)) -> Config {
    let region = |r: usize| format!("r{r}");
    let id = |r: usize, n: usize| format!("r{r}-{n}");
    let shares: Vec<String> = (0..regions).map(|r| format!("{} = 1", region(r))).collect();
    let mut text = format!(
        "[node]\nid = \"{}\"\nregion = \"{}\"\nmax_keys = 1000000\n\n[cluster]\n\
         mode = \"strict\"\ngossip_interval = \"20ms\"\nsuspect_after = \"1s\"\n\
         regions = {{ {} }}\ntls = {{ ca = \"ca.pem\", cert = \"n.pem\", key = \"n.key\" }}\n",
        id(me.0, me.1),
        region(me.0),
        shares.join(", ")
    );
    let mut port = 9000;
    for r in 0..regions {
        for n in 0..nodes {
            port += 1;
            text += &format!(
                "\n[[cluster.node]]\nid = \"{}\"\nregion = \"{}\"\naddr = \"127.0.0.1:{port}\"\n",
                id(r, n),
                region(r)
            );
        }
    }
    text += "\n[[rule]]\nname = \"allow\"\nalgorithm = \"token_bucket\"\nrate = 1000000\n\
             per = \"1s\"\nburst = 1000000\nkey_from = \"header:x-key\"\n";
    Config::parse(&text, "bench.toml").expect("the bench's configuration")
}

fn node(config: &Config, local_first: bool) -> Node {
    let limiter = Limiter::new(config, Clock::default());
    limiter.store().track_changes();
    let replicas = config.replicas.clone();
    let me = replicas
        .node_by_id(&config.node.id)
        .expect("this node is listed");
    let mut cluster = Cluster::new(
        ClusterConfig {
            me,
            replicas,
            gossip_interval: INTERVAL_MS,
            suspect_after: 1_000,
            anti_entropy_interval: 1_000,
            forward_timeout: 1_000,
            tick_phase: 0,
            topology: Topology::Mesh,
        },
        limiter.clock.now_ms(),
    );
    cluster.set_local_first(local_first);
    Node {
        limiter,
        cluster,
        digest: NodeDigest::default(),
        spent: Duration::ZERO,
        bytes: 0,
        keys_in: 0,
        kinds: Default::default(),
    }
}

/// Applies what the machine reported to the limiter, as the node's driver does.
fn dispatch(n: &mut Node) {
    while let Some(e) = n.cluster.poll_event() {
        match e {
            Event::ViewChanged(_) => n.limiter.set_view(n.cluster.view()),
            Event::SharesChanged(list) => {
                n.limiter.rebind([list, n.cluster.spending()]);
            }
            _ => {}
        }
    }
}

/// Encodes every message `cluster` (node `from`) has to send onto `queue`.
fn send_all(
    cluster: &mut Cluster,
    from: NodeIdx,
    queue: &mut std::collections::VecDeque<(NodeIdx, NodeIdx, Vec<u8>)>,
) {
    while let Some(out) = cluster.poll_transmit() {
        let frame = encode_frame(&out.msg).expect("an encodable message");
        queue.push_back((from, out.to, frame));
    }
}

/// Runs every node's due timer and delivers every frame (encoded and decoded), in the order
/// sent, until none is left; `measure` adds each node's time to its `spent`.
fn step(nodes: &mut [Node], measure: bool) {
    let now = nodes[0].limiter.clock.now_ms();
    let mut queue: std::collections::VecDeque<(NodeIdx, NodeIdx, Vec<u8>)> = Default::default();
    for (i, n) in nodes.iter_mut().enumerate() {
        let t = Instant::now();
        if n.cluster.poll_timeout() <= now {
            let mut states = NodeStates::new(&n.limiter, &mut n.digest);
            n.cluster.handle_timeout(now, &mut states);
        }
        send_all(&mut n.cluster, NodeIdx(i as u16), &mut queue);
        if measure {
            n.spent += t.elapsed();
        }
        dispatch(n);
    }
    while let Some((from, to, frame)) = queue.pop_front() {
        let n = &mut nodes[usize::from(to.0)];
        let t = Instant::now();
        let msg = decode_frame(&frame).expect("a frame this build encoded");
        let kind = kind_of(&msg);
        let keys_in = match &msg {
            Message::Deltas(batch) => batch.keys.len() as u64,
            _ => 0,
        };
        let mut states = NodeStates::new(&n.limiter, &mut n.digest);
        n.cluster.handle_message(from, msg, now, &mut states);
        send_all(&mut n.cluster, to, &mut queue);
        if measure {
            n.spent += t.elapsed();
            n.bytes += frame.len() as u64;
            *n.kinds.entry(kind).or_default() += 1;
            n.keys_in += keys_in;
        }
        dispatch(n);
    }
}

/// A message's kind, as its `Debug` form begins (`Deltas`, `Digest`, `Missed`, ...).
fn kind_of(msg: &Message) -> String {
    if let Message::Deltas(batch) = msg {
        return if batch.keys.is_empty() {
            "Deltas (empty)".into()
        } else {
            "Deltas (keys)".into()
        };
    }
    let text = format!("{msg:?}");
    text.split(['(', ' ', '{'])
        .next()
        .unwrap_or_default()
        .to_owned()
}

fn sleep_until(at: Instant) {
    if let Some(wait) = at.checked_duration_since(Instant::now()) {
        std::thread::sleep(wait);
    }
}

fn main() {
    let local_first = std::env::args().any(|a| a == "--local-first");
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .map(|a| {
            a.parse()
                .expect("numbers: REGIONS NODES RATE SECONDS KEYS WARM")
        })
        .collect();
    let arg = |i: usize, d: u64| args.get(i).copied().unwrap_or(d);
    let (regions, per) = (arg(0, 1) as usize, arg(1, 2) as usize);
    let (rate, secs, keys) = (arg(2, 10_000), arg(3, 4), arg(4, 10_000));
    let warm_secs = arg(5, 1).max(1);
    let mut nodes: Vec<Node> = (0..regions)
        .flat_map(|r| (0..per).map(move |n| (r, n)))
        .map(|me| node(&config(regions, per, me), local_first))
        .collect();
    // Every node synced and every peer heard: routing reads the whole region.
    let mut next = Instant::now();
    let settled = Instant::now() + Duration::from_secs(1);
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < settled || !nodes.iter().all(|n| n.cluster.is_synced()) {
        assert!(
            Instant::now() < deadline,
            "the nodes did not sync within 10 s"
        );
        step(&mut nodes, false);
        next += Duration::from_millis(INTERVAL_MS);
        sleep_until(next);
    }
    // Keys asked of the first node: those it owns in its region (every key with
    // `--local-first`).
    let names: Vec<String> = (0..keys)
        .map(|i| format!("k{i}"))
        .filter(|k| local_first || nodes[0].cluster.owner(k.as_bytes()) == NodeIdx(0))
        .collect();
    let mut at_owner = 0u64;
    let per_interval = (rate * INTERVAL_MS / 1000).max(1) as usize;
    let mut rng = fastrand::Rng::with_seed(7);
    let mut decide_time = Duration::ZERO;
    let (mut decided, mut allowed) = (0u64, 0u64);
    // A second of load before measuring (every key exists everywhere, rights have settled),
    // then `secs` of intervals. Counted in intervals, not read off the clock: under callgrind,
    // which runs it ~50 times slower, each interval still carries the same decisions.
    let warm = warm_secs * 1000 / INTERVAL_MS;
    for step_no in 0..warm + secs * 1000 / INTERVAL_MS {
        let measure = step_no >= warm;
        let t = Instant::now();
        for _ in 0..per_interval {
            let key = &names[rng.usize(..names.len())];
            let req = CheckRef::of("allow", key, 1);
            // Without `--local-first` every key asked is the first node's own: no routing
            // in the timed part, as before the flag.
            let owner = match local_first {
                true => nodes[0].cluster.owner(key.as_bytes()),
                false => NodeIdx(0),
            };
            let here = if owner == NodeIdx(0) {
                Some(nodes[0].limiter.check(req).expect("a valid check"))
            } else {
                nodes[0].limiter.check_if_held(req).expect("a valid check")
            };
            let o = here.unwrap_or_else(|| {
                at_owner += u64::from(measure);
                nodes[usize::from(owner.0)]
                    .limiter
                    .check(req)
                    .expect("a valid check")
            });
            if measure {
                decided += 1;
                allowed += u64::from(o.decision.allowed);
            }
        }
        if measure {
            decide_time += t.elapsed();
        }
        step(&mut nodes, measure);
        next += Duration::from_millis(INTERVAL_MS);
        sleep_until(next);
    }
    assert!(decided > 0, "no node synced: nothing was decided");
    let us = |d: Duration| d.as_secs_f64() * 1e6 / decided as f64;
    println!(
        "{regions} x {per}, {rate} decisions/s for {secs} s over {keys} keys ({} asked of the \
         first node{}): {decided} decided, {allowed} allowed, {at_owner} at the owner",
        names.len(),
        if local_first { ", local_first" } else { "" }
    );
    println!(
        "deciding (first node): {:.3} µs per decision",
        us(decide_time)
    );
    let mut total = 0.0;
    for (i, n) in nodes.iter().enumerate() {
        total += us(n.spent);
        println!(
            "node {i}: replication {:.3} µs per decision, {:.1} bytes received per decision",
            us(n.spent),
            n.bytes as f64 / decided as f64
        );
        println!(
            "  received {:.3} keys per decision in {:?}",
            n.keys_in as f64 / decided as f64,
            n.kinds
        );
    }
    println!("replication, every node: {total:.3} µs per decision");
}
