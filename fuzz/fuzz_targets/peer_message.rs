//! One node's state machine fed whatever a peer can send: any payload that decodes (of either
//! version the node accepts) is handed to `Cluster::handle_message`, then the node runs two
//! gossip intervals (rebalancing what was merged, deciding nothing new). Nothing may panic.
#![no_main]

use levee_cluster::memory::MemoryStates;
use levee_cluster::{Cluster, ClusterConfig};
use levee_core::{NodeIdx, ReplicaSet, ReplicaSpec, RuleSpec};
use levee_proto::{Message, decode_payload_of, encode_id};
use libfuzzer_sys::fuzz_target;

const T0: u64 = 1_800_000_000_000;

fuzz_target!(|data: &[u8]| {
    let Some((&head, payload)) = data.split_first() else {
        return;
    };
    let Ok(mut msg) = decode_payload_of(1 + head % 2, payload) else {
        return;
    };
    // Half the time, give every key of a batch an identity of a rule the node runs, so that
    // arbitrary states reach the merge rather than stopping at an unknown rule.
    if head & 8 != 0
        && let Message::Deltas(b) | Message::PullChunk { batch: b, .. } = &mut msg
    {
        let mut keys = std::mem::take(&mut b.keys).into_vec();
        for (i, k) in keys.iter_mut().enumerate() {
            encode_id(&mut k.id, ["r", "b", "s"][i % 3], None, &format!("k{i}"));
        }
        b.keys = keys.into();
    }
    let nodes: Vec<ReplicaSpec> = ["eu-1", "eu-2", "us-1"]
        .iter()
        .map(|id| ReplicaSpec {
            id: (*id).into(),
            region: id[..2].into(),
            weight: None,
        })
        .collect();
    let replicas = ReplicaSet::new(&[("eu".into(), 1), ("us".into(), 1)], &nodes).unwrap();
    let rules = vec![
        RuleSpec::fixed_window("r", 100, 1_000).validate().unwrap(),
        RuleSpec::token_bucket("b", 10, 1_000, 100)
            .validate()
            .unwrap(),
        RuleSpec::sliding_window("s", 100, 1_000)
            .validate()
            .unwrap(),
    ];
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
    let mut cluster = Cluster::new(cfg, T0);
    let mut store = MemoryStates::new(NodeIdx(0), replicas, rules);
    let from = NodeIdx(u16::from(head >> 6));
    cluster.handle_message(from, msg, T0 + 1, &mut store);
    for t in [T0 + 400, T0 + 420] {
        cluster.handle_timeout(t, &mut store);
        while cluster.poll_transmit().is_some() {}
        while cluster.poll_event().is_some() {}
    }
});
