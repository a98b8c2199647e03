//! What a faulty or compromised peer can send, message by message, to one node's state
//! machine: each is refused and counted (`Cluster::refused`), or bounded, and nothing it sends
//! grows the node's memory without bound.

use levee_cluster::memory::MemoryStates;
use levee_cluster::{Cluster, ClusterConfig, DIGEST_BUCKETS, Event, KeyStates};
use levee_core::crdt::Tally;
use levee_core::{KeyCrdt, NodeIdx, ReplicaSet, ReplicaSpec, RuleSpec};
use levee_proto::{
    DeltaBatch, Digest, ForwardCheck, ForwardDecision, KeyEntry, MAX_FORWARD_CHECKS, MAX_ID_BYTES,
    MAX_IDEMPOTENCY_KEY_BYTES, MAX_KEY_BYTES, Message, encode_id,
};

const T0: u64 = 1_800_000_000_000;
const PEER: NodeIdx = NodeIdx(1);

struct Node {
    cluster: Cluster,
    store: MemoryStates,
    now: u64,
}

impl Node {
    fn new() -> Node {
        let nodes: Vec<ReplicaSpec> = ["eu-1", "eu-2", "us-1"]
            .iter()
            .map(|id| ReplicaSpec {
                id: (*id).into(),
                region: id[..2].into(),
                weight: None,
            })
            .collect();
        let replicas = ReplicaSet::new(&[("eu".into(), 1), ("us".into(), 1)], &nodes).unwrap();
        let rule = RuleSpec::fixed_window("r", 1_000, 60_000)
            .validate()
            .unwrap();
        let cfg = ClusterConfig {
            me: NodeIdx(0),
            replicas: replicas.clone(),
            gossip_interval: 20,
            suspect_after: 300,
            anti_entropy_interval: 200,
            forward_timeout: 500,
            tick_phase: 0,
            topology: Default::default(),
        };
        let mut node = Node {
            cluster: Cluster::new(cfg, T0),
            store: MemoryStates::new(NodeIdx(0), replicas, vec![rule]),
            now: T0,
        };
        // Heard from its peer once, so that what follows is not a catch-up after a silence.
        node.receive(Message::PullDeferred);
        node.drain();
        node
    }

    fn receive(&mut self, msg: Message) {
        self.now += 1;
        self.cluster
            .handle_message(PEER, msg, self.now, &mut self.store);
    }

    /// One check of each of `n` keys, `k0`..
    fn decide_keys(&mut self, n: usize) {
        let view = self.cluster.view();
        for i in 0..n {
            self.store
                .decide("r", &format!("k{i}"), 1, self.now, view)
                .unwrap();
        }
    }

    fn drain(&mut self) -> Vec<Event> {
        while self.cluster.poll_transmit().is_some() {}
        std::iter::from_fn(|| self.cluster.poll_event()).collect()
    }

    fn backlog_to_peer(&self) -> usize {
        self.cluster
            .peers_status(self.now)
            .iter()
            .find(|p| p.node == PEER)
            .unwrap()
            .backlog_keys
    }
}

fn id(key: &str) -> Vec<u8> {
    let mut id = Vec::new();
    encode_id(&mut id, "r", None, key);
    id
}

fn deltas(keys: Vec<KeyEntry>) -> Message {
    Message::Deltas(DeltaBatch {
        sent_at_ms: T0,
        ack_ms: 0,
        prev_ms: 0,
        keys: keys.into(),
    })
}

fn a_tally(consumed: u64, refunded: u64, requested: u64) -> KeyCrdt {
    let mut state = KeyCrdt::default();
    *state.slot_mut(T0 / 60_000).tallies.entry(PEER) = Tally {
        consumed,
        refunded,
        requested,
    };
    state
}

/// Item 12: a state no honest node writes, or whose sums would overflow, is refused, counted,
/// and leaves no key behind; an honest key in the same batch is merged.
#[test]
fn hostile_states_are_refused_and_counted() {
    let mut node = Node::new();
    let before = node.cluster.refused();
    let mut overflow = KeyCrdt::default();
    let e = T0 / 60_000;
    for n in [1, 2] {
        *overflow.slot_mut(e).tallies.entry(NodeIdx(n)) = Tally {
            consumed: u64::MAX,
            refunded: 0,
            requested: u64::MAX,
        };
    }
    node.receive(deltas(vec![
        KeyEntry {
            id: id("credit"),
            state: a_tally(1 << 63, u64::MAX, u64::MAX),
        },
        KeyEntry {
            id: id("overflow"),
            state: overflow,
        },
        KeyEntry {
            id: id("honest"),
            state: a_tally(3, 1, 4),
        },
    ]));
    assert_eq!(node.cluster.refused() - before, 2);
    assert!(node.store.state("r", "credit").is_none());
    assert!(node.store.state("r", "overflow").is_none());
    assert!(node.store.state("r", "honest").is_some());
}

/// Item 13: a key identity longer than any node makes is refused before it is stored.
#[test]
fn a_key_id_over_the_bound_is_refused() {
    let mut node = Node::new();
    let before = node.cluster.refused();
    let longest = "k".repeat(MAX_KEY_BYTES);
    let too_long = "k".repeat(MAX_ID_BYTES);
    node.receive(deltas(vec![
        KeyEntry {
            id: id(&longest),
            state: a_tally(1, 0, 1),
        },
        KeyEntry {
            id: id(&too_long),
            state: a_tally(1, 0, 1),
        },
    ]));
    assert_eq!(node.cluster.refused() - before, 1);
    assert!(node.store.state("r", &longest).is_some());
    assert!(node.store.state("r", &too_long).is_none());
}

fn check(key: &str) -> ForwardCheck {
    ForwardCheck {
        rule: "r".into(),
        key: key.into(),
        cost: 1,
        class: None,
        dry_run: false,
        idempotency_key: None,
        refund: false,
    }
}

/// Item 13: a Forward of more checks than a forwarder ever batches, or with a key longer
/// than any node accepts, is refused: no check of it is decided.
#[test]
fn an_oversized_forward_is_refused() {
    let mut node = Node::new();
    let before = node.cluster.refused();
    let most = vec![check("k"); MAX_FORWARD_CHECKS];
    node.receive(Message::Forward {
        id: 1,
        checks: most,
    });
    let events = node.drain();
    assert!(events.iter().any(
        |e| matches!(e, Event::ForwardReceived { checks, .. } if checks.len() == MAX_FORWARD_CHECKS)
    ));
    node.receive(Message::Forward {
        id: 2,
        checks: vec![check("k"); MAX_FORWARD_CHECKS + 1],
    });
    node.receive(Message::Forward {
        id: 3,
        checks: vec![check(&"k".repeat(MAX_KEY_BYTES + 1))],
    });
    let mut long_retry = check("k");
    long_retry.idempotency_key = Some("i".repeat(MAX_IDEMPOTENCY_KEY_BYTES + 1));
    node.receive(Message::Forward {
        id: 4,
        checks: vec![long_retry],
    });
    let events = node.drain();
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, Event::ForwardReceived { .. })),
        "{events:?}"
    );
    assert_eq!(node.cluster.refused() - before, 3);
}

fn admitted() -> ForwardDecision {
    ForwardDecision {
        allowed: true,
        would_allow: true,
        limit: 1_000,
        remaining: 10,
        reset_after_ms: 1_000,
        retry_after_ms: 0,
        degraded: false,
    }
}

/// An owner's answer that comes after the batch timed out (decided alone here) has its
/// admitted checks given back to the owner as refunds, once — those whose window surely
/// outlasts the refund: one whose window ends a second after it was decided stays counted
/// (a refund there would land in the next window and free a right it never gave). A repeat
/// of the answer, or an answer to a batch never sent, sends nothing.
#[test]
fn a_late_answer_gives_the_owners_admissions_back_once() {
    let mut node = Node::new();
    let batch = vec![check("a"), check("b"), check("c")];
    let id = node.cluster.forward(PEER, batch, node.now);
    node.drain();
    node.now += 500;
    node.cluster.handle_timeout(node.now, &mut node.store);
    let events = node.drain();
    assert!(
        events
            .iter()
            .any(|e| matches!(e, Event::ForwardFailed { id: f } if *f == id)),
        "{events:?}"
    );
    // The window of the rule (a minute) ends 59 s after `a` was decided, 1 s after `c` was.
    let ending_in = |reset_after_ms| ForwardDecision {
        reset_after_ms,
        ..admitted()
    };
    let reply = |id| Message::ForwardReply {
        id,
        decisions: vec![Some(ending_in(59_000)), None, Some(ending_in(1_000))],
    };
    node.receive(reply(id));
    let mut sent = Vec::new();
    while let Some(out) = node.cluster.poll_transmit() {
        sent.push(out);
    }
    let refunds: Vec<(&str, u64)> = sent
        .iter()
        .filter(|o| o.to == PEER)
        .filter_map(|o| match &o.msg {
            Message::Forward { checks, .. } => Some(checks),
            _ => None,
        })
        .flatten()
        .map(|c| {
            assert!(
                c.refund && !c.dry_run && c.idempotency_key.is_none(),
                "{c:?}"
            );
            (c.key.as_str(), c.cost)
        })
        .collect();
    assert_eq!(refunds, [("a", 1)]);
    assert_eq!(node.cluster.given_back_late(), 1);
    assert_eq!(node.cluster.withheld_late(), 1);
    assert!(
        node.drain()
            .iter()
            .all(|e| !matches!(e, Event::ForwardAnswered { .. })),
        "a late answer is not delivered as an answer"
    );
    // Again, and to a batch that never was: nothing more is sent.
    node.receive(reply(id));
    node.receive(reply(id + 1_000));
    let mut again = Vec::new();
    while let Some(out) = node.cluster.poll_transmit() {
        again.push(out);
    }
    assert!(
        again
            .iter()
            .all(|o| !matches!(o.msg, Message::Forward { .. })),
        "{again:?}"
    );
    assert_eq!(node.cluster.given_back_late(), 1);
    assert_eq!(node.cluster.withheld_late(), 1);
}

/// Item 13: a digest with more hashes than buckets, repeated or unsorted buckets, or
/// indices past the bucket count is refused; a well-formed one is answered.
#[test]
fn a_malformed_digest_is_refused() {
    let mut node = Node::new();
    let before = node.cluster.refused();
    let n = DIGEST_BUCKETS;
    for hashes in [
        (0..100_000).map(|i| (i % n, 1)).collect::<Vec<_>>(),
        vec![(3, 1), (3, 2)],
        vec![(5, 1), (4, 2)],
        vec![(n, 1)],
        vec![(1, 0)],
    ] {
        node.receive(Message::Digest(Digest { buckets: n, hashes }));
    }
    assert_eq!(node.cluster.refused() - before, 5);
    node.receive(Message::Digest(Digest {
        buckets: n,
        hashes: vec![(4, 1), (5, 2)],
    }));
    assert_eq!(node.cluster.refused() - before, 5);
}

/// Item 13: however often a peer asks for the same buckets, each key waits in its queue at
/// most once.
#[test]
fn repeated_bucket_requests_queue_each_key_once() {
    let mut node = Node::new();
    // Enough keys that the interval's push budget is spent and the rest waits.
    node.decide_keys(20_000);
    let all: Vec<u32> = (0..16).collect();
    let mut in_buckets = 0;
    node.store.for_each(node.now, &mut |id, _, _| {
        if (levee_cluster::bucket_of(id, DIGEST_BUCKETS)) < 16 {
            in_buckets += 1;
        }
    });
    for _ in 0..40 {
        node.receive(Message::BucketRequest {
            buckets: DIGEST_BUCKETS,
            wanted: all.clone(),
        });
        node.drain();
        assert!(
            node.backlog_to_peer() <= in_buckets,
            "backlog {} with {in_buckets} keys in the buckets",
            node.backlog_to_peer()
        );
    }
    // More buckets than a node ever asks for in one round: refused.
    let before = node.cluster.refused();
    node.receive(Message::BucketRequest {
        buckets: DIGEST_BUCKETS,
        wanted: (0..DIGEST_BUCKETS).collect(),
    });
    assert_eq!(node.cluster.refused() - before, 1);
}

/// A `Heard` naming more nodes than a cluster can have is refused whole and counted; one that
/// names nodes outside the list, the receiver itself or news older than `suspect_after`
/// changes nothing.
#[test]
fn a_hostile_heard_is_refused_or_ignored() {
    use levee_proto::HeardEntry;
    let mut node = Node::new();
    let before = node.cluster.refused();
    let entry = |node: u16, age_ms: u32| HeardEntry { node, age_ms };
    node.receive(Message::Heard {
        gateway: true,
        nodes: vec![entry(1, 0); levee_core::MAX_NODES + 1],
    });
    assert_eq!(node.cluster.refused() - before, 1);
    // Only eu-1 (0, this node) and us-1 (1, the sender) exist: nothing to learn, nothing
    // refused, and the node keeps running.
    node.receive(Message::Heard {
        gateway: false,
        nodes: vec![
            entry(0, 0),
            entry(1, 0),
            entry(7, 0),
            entry(u16::MAX, u32::MAX),
        ],
    });
    assert_eq!(node.cluster.refused() - before, 1);
    node.drain();
}

/// The keys of the batches sent to the peer since the last drain.
fn keys_sent_to_peer(node: &mut Node) -> usize {
    std::iter::from_fn(|| node.cluster.poll_transmit())
        .filter(|o| o.to == PEER)
        .map(|o| match o.msg {
            Message::Deltas(b) => b.keys.len(),
            _ => 0,
        })
        .sum()
}

/// A peer that says it missed our batches (`Missed`) gets the keys sent since then, at most
/// once per gossip interval however often it asks: each answer walks the recently sent keys.
/// Asks that come sooner are answered together at the end of the interval (from the earliest
/// time asked; a time ahead of our clock asks for no more than the latest interval's keys).
#[test]
fn asks_for_missed_batches_are_answered_at_most_once_per_interval() {
    let mut node = Node::new();
    node.decide_keys(10);
    // The peer acknowledged a batch of ours, so what was sent since is remembered for it.
    node.receive(Message::Deltas(DeltaBatch {
        sent_at_ms: T0,
        ack_ms: T0,
        prev_ms: 0,
        keys: Vec::new().into(),
    }));
    node.drain();
    // An interval a while after the start sends them and remembers them as sent.
    node.now += 100;
    node.cluster.handle_timeout(node.now, &mut node.store);
    assert_eq!(keys_sent_to_peer(&mut node), 10);
    let sent_at = node.now;
    node.receive(Message::Missed {
        since_ms: sent_at - 1,
    });
    assert_eq!(keys_sent_to_peer(&mut node), 10, "answered at once");
    for since in [sent_at - 1, u64::MAX] {
        for _ in 0..50 {
            let now = node.now;
            node.cluster.handle_message(
                PEER,
                Message::Missed { since_ms: since },
                now,
                &mut node.store,
            );
        }
    }
    assert_eq!(
        keys_sent_to_peer(&mut node),
        0,
        "not again within the interval"
    );
    node.now += 20;
    node.cluster.handle_timeout(node.now, &mut node.store);
    let sent = keys_sent_to_peer(&mut node);
    assert_eq!(sent, 10, "the asks of the interval, answered once");
    node.now += 20;
    node.cluster.handle_timeout(node.now, &mut node.store);
    assert_eq!(keys_sent_to_peer(&mut node), 0, "nothing left to answer");
    // A time before what this node remembers (or none at all) asks for nothing: anti-entropy
    // repairs what is that old.
    for since in [1, 0] {
        node.receive(Message::Missed { since_ms: since });
        node.now += 20;
        node.cluster.handle_timeout(node.now, &mut node.store);
        assert_eq!(keys_sent_to_peer(&mut node), 0, "since {since}");
    }
}

/// The `Missed` a node sends when a peer's batch chain has a gap is sent again, once, half
/// `suspect_after` later (the ask can be lost like the batches it asks for, and nothing tells
/// whether its answer, ordinary batches, came), with the earliest time asked.
#[test]
fn an_ask_for_missed_batches_is_repeated_once() {
    let mut node = Node::new();
    let from_peer = |sent_at_ms, prev_ms| {
        Message::Deltas(DeltaBatch {
            sent_at_ms,
            ack_ms: 0,
            prev_ms,
            keys: Vec::new().into(),
        })
    };
    let asks = |node: &mut Node| -> Vec<u64> {
        std::iter::from_fn(|| node.cluster.poll_transmit())
            .filter(|o| o.to == PEER)
            .filter_map(|o| match o.msg {
                Message::Missed { since_ms } => Some(since_ms),
                _ => None,
            })
            .collect()
    };
    node.receive(from_peer(T0 + 100, T0));
    node.drain();
    // The batch of T0 + 120 did not arrive: asked for at once.
    node.receive(from_peer(T0 + 140, T0 + 120));
    assert_eq!(asks(&mut node), [T0 + 100]);
    // Nothing more before half suspect_after (150 ms) has passed, however many intervals end.
    for _ in 0..7 {
        node.now += 20;
        node.cluster.handle_timeout(node.now, &mut node.store);
        assert!(asks(&mut node).is_empty());
    }
    node.now += 20;
    node.cluster.handle_timeout(node.now, &mut node.store);
    assert_eq!(asks(&mut node), [T0 + 100], "asked again");
    for _ in 0..20 {
        node.now += 20;
        node.cluster.handle_timeout(node.now, &mut node.store);
        assert!(asks(&mut node).is_empty(), "only once");
    }
}

/// A `ListsBefore` with more lists than `MAX_FLOOR_LISTS`, or a list that is no valid list,
/// is refused whole and counted; a list this node's own does not succeed, or one stopped
/// longer ago than any clock reaches, changes nothing and the node keeps running.
#[test]
fn a_hostile_lists_before_is_refused_or_ignored() {
    use levee_proto::{ListBefore, MAX_FLOOR_LISTS, MemberList};
    let mut node = Node::new();
    let before = node.cluster.refused();
    let (regions, nodes) = node.cluster.spending().specs();
    let mine = MemberList { regions, nodes };
    let at = |list: &MemberList, ago_ms: u64| ListBefore {
        list: list.clone(),
        ago_ms,
    };
    node.receive(Message::ListsBefore {
        lists: vec![at(&mine, 0); MAX_FLOOR_LISTS + 1],
    });
    let empty = MemberList {
        regions: Vec::new(),
        nodes: Vec::new(),
    };
    node.receive(Message::ListsBefore {
        lists: vec![at(&mine, 0), at(&empty, 0)],
    });
    assert_eq!(node.cluster.refused() - before, 2);
    let elsewhere = MemberList {
        regions: vec![("ap".into(), 1)],
        nodes: vec![ReplicaSpec {
            id: "ap-1".into(),
            region: "ap".into(),
            weight: None,
        }],
    };
    node.receive(Message::ListsBefore {
        lists: vec![at(&elsewhere, 0), at(&mine, u64::MAX)],
    });
    assert_eq!(node.cluster.refused() - before, 2);
    node.drain();
}
