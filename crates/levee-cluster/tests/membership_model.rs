//! The live-membership rule ([`Lists`]) against random histories of list changes: an operator
//! appends, removes and re-weights nodes and reloads nodes in any order, nodes start while a
//! change settles, and `Membership` messages are delayed, reordered and lost. After every step
//! the shares the running nodes spend add up to at most the limit: the instant invariant of
//! docs/membership.md ("at every instant there is one list under whose shares every node spends
//! at most its own").
//!
//! Modelled as the node does it: a node takes a reported list only from a live member of its
//! own list (the machine refuses peers it does not list), a node started while a change settles
//! hears one running peer before it decides anything (its peers tell it their lists first on
//! every connection), and a removed node is stopped before it is removed (removing a live node
//! is the operator's statement that it is dead; its bound is documented, not modelled).

use levee_cluster::Lists;
use levee_core::{NodeIdx, REMOVED, ReplicaSet, ReplicaSpec};
use proptest::prelude::*;

const LIMIT: u64 = 1_000;
/// Node ids, alternating regions: n0 eu, n1 us, n2 eu …
const NODES: usize = 6;

fn region(k: usize) -> &'static str {
    if k.is_multiple_of(2) { "eu" } else { "us" }
}

/// One step of a history; indices are taken modulo what they index.
#[derive(Debug, Clone)]
enum Op {
    /// The operator appends node `k` (if it was never listed).
    Append(usize),
    /// The operator stops node `k` and marks it removed (if its region keeps a live node).
    Remove(usize),
    /// The operator gives node `k` weight `w`.
    Reweight(usize, u32),
    /// Node `k` takes the operator's latest list: a reload, or, if it is not running, a start
    /// that first hears the `p`-th running node.
    Reload(usize, usize),
    /// Node `k` tells every running node its lists (the messages wait in their inboxes).
    Send(usize),
    /// Node `k` receives the `m`-th message waiting for it.
    Deliver(usize, usize),
    /// The `m`-th message waiting for node `k` is lost.
    Lose(usize, usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        1 => (0..NODES).prop_map(Op::Append),
        1 => (0..NODES).prop_map(Op::Remove),
        1 => ((0..NODES), 1u32..4).prop_map(|(k, w)| Op::Reweight(k, w)),
        3 => ((0..NODES), (0..NODES)).prop_map(|(k, p)| Op::Reload(k, p)),
        4 => (0..NODES).prop_map(Op::Send),
        6 => ((0..NODES), (0..8usize)).prop_map(|(k, m)| Op::Deliver(k, m)),
        1 => ((0..NODES), (0..8usize)).prop_map(|(k, m)| Op::Lose(k, m)),
    ]
}

/// The operator's list: node ids in order with their weight (`REMOVED` for a tombstone).
#[derive(Debug, Clone)]
struct Spec(Vec<(usize, Option<u32>)>);

impl Spec {
    fn set(&self) -> ReplicaSet {
        let nodes: Vec<ReplicaSpec> = self
            .0
            .iter()
            .map(|&(k, weight)| ReplicaSpec {
                id: format!("n{k}"),
                region: region(k).into(),
                weight,
            })
            .collect();
        ReplicaSet::new(&[("eu".into(), 1), ("us".into(), 1)], &nodes).expect("a valid list")
    }

    fn live_in(&self, r: &str) -> usize {
        self.0
            .iter()
            .filter(|&&(k, w)| region(k) == r && w != REMOVED)
            .count()
    }
}

/// A message: the sender's list and the lists that still bound its shares.
#[derive(Debug, Clone)]
struct Note {
    from: usize,
    list: ReplicaSet,
    floors: Vec<ReplicaSet>,
}

struct Model {
    spec: Spec,
    nodes: Vec<Option<Lists>>,
    stopped: Vec<bool>,
    inbox: Vec<Vec<Note>>,
}

impl Model {
    fn new() -> Model {
        let spec = Spec(vec![(0, None), (1, None)]);
        let set = spec.set();
        let mut nodes: Vec<Option<Lists>> = (0..NODES).map(|_| None).collect();
        nodes[0] = Some(Lists::new(set.clone(), NodeIdx(0)));
        nodes[1] = Some(Lists::new(set, NodeIdx(1)));
        Model {
            spec,
            nodes,
            stopped: vec![false; NODES],
            inbox: vec![Vec::new(); NODES],
        }
    }

    fn note(&self, k: usize) -> Option<Note> {
        let l = self.nodes[k].as_ref()?;
        Some(Note {
            from: k,
            list: l.current().clone(),
            floors: l.floors_to_send(levee_proto::MAX_FLOOR_LISTS),
        })
    }

    fn deliver(&mut self, to: usize, note: Note) {
        let Some(l) = self.nodes[to].as_mut() else {
            return;
        };
        // The machine takes a message only from a node of its own list.
        let Some(from) = l.current().node_by_id(&format!("n{}", note.from)) else {
            return;
        };
        l.reported(from, note.list, note.floors, Vec::new());
    }

    fn running(&self) -> impl Iterator<Item = usize> + '_ {
        (0..NODES).filter(|&k| self.nodes[k].is_some())
    }

    fn apply(&mut self, op: &Op) {
        match *op {
            Op::Append(k) => {
                if !self.spec.0.iter().any(|&(n, _)| n == k) && !self.stopped[k] {
                    self.spec.0.push((k, None));
                }
            }
            Op::Remove(k) => {
                let Some(i) = self.spec.0.iter().position(|&(n, _)| n == k) else {
                    return;
                };
                if self.spec.0[i].1 == REMOVED || self.spec.live_in(region(k)) < 2 {
                    return;
                }
                self.spec.0[i].1 = REMOVED;
                self.nodes[k] = None;
                self.stopped[k] = true;
            }
            Op::Reweight(k, w) => {
                if let Some(e) = self.spec.0.iter_mut().find(|e| e.0 == k && e.1 != REMOVED) {
                    e.1 = Some(w);
                }
            }
            Op::Reload(k, p) => {
                let set = self.spec.set();
                let Some(me) = set.node_by_id(&format!("n{k}")) else {
                    return;
                };
                if set.is_removed(me) {
                    return;
                }
                match self.nodes[k].as_mut() {
                    Some(l) => {
                        l.change(set)
                            .expect("the operator only appends, removes, re-weights");
                    }
                    None => {
                        // A start: it hears one running peer before it decides anything.
                        let running: Vec<usize> = self.running().collect();
                        let peer = (!running.is_empty()).then(|| running[p % running.len()]);
                        self.nodes[k] = Some(Lists::new(set, me));
                        if let Some(note) = peer.and_then(|p| self.note(p)) {
                            self.deliver(k, note);
                        }
                    }
                }
            }
            Op::Send(k) => {
                if let Some(note) = self.note(k) {
                    for to in 0..NODES {
                        if to != k && self.nodes[to].is_some() {
                            self.inbox[to].push(note.clone());
                        }
                    }
                }
            }
            Op::Deliver(k, m) => {
                let waiting = self.inbox[k].len();
                if waiting > 0 {
                    let note = self.inbox[k].remove(m % waiting);
                    self.deliver(k, note);
                }
            }
            Op::Lose(k, m) => {
                let waiting = self.inbox[k].len();
                if waiting > 0 {
                    self.inbox[k].remove(m % waiting);
                }
            }
        }
    }

    /// What the running nodes spend together: each its own share under its spending list.
    fn spent(&self) -> (u64, Vec<(usize, u64)>) {
        let parts: Vec<(usize, u64)> = self
            .running()
            .map(|k| {
                let l = self.nodes[k].as_ref().expect("running");
                let me = l.current().node_by_id(&format!("n{k}")).expect("listed");
                (k, l.spending().split(LIMIT)[usize::from(me.0)])
            })
            .collect();
        (parts.iter().map(|p| p.1).sum(), parts)
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn the_running_nodes_never_spend_more_than_the_limit_through_any_history(
        ops in proptest::collection::vec(op(), 1..80)
    ) {
        let mut m = Model::new();
        for (step, op) in ops.iter().enumerate() {
            m.apply(op);
            let (total, parts) = m.spent();
            prop_assert!(
                total <= LIMIT,
                "after step {step} ({op:?}) the running nodes spend {total} > {LIMIT}: {parts:?}; \
                 operator's list {:?}",
                m.spec
            );
        }
    }
}

/// A history that settles ends with whole shares: when every running node runs the latest list
/// and has heard every other, they spend the whole limit again.
#[test]
fn a_change_that_every_node_hears_ends_with_whole_shares() {
    let mut m = Model::new();
    for op in [
        Op::Append(2),
        Op::Append(3),
        Op::Reload(0, 0),
        Op::Reload(1, 0),
        Op::Reload(2, 0),
        Op::Reload(3, 0),
    ] {
        m.apply(&op);
    }
    for _round in 0..3 {
        for k in 0..4 {
            m.apply(&Op::Send(k));
        }
        for k in 0..4 {
            while !m.inbox[k].is_empty() {
                m.apply(&Op::Deliver(k, 0));
            }
        }
    }
    let (total, parts) = m.spent();
    assert_eq!(total, LIMIT, "{parts:?}");
    assert!(m.running().all(|k| m.nodes[k].as_ref().unwrap().agreed()));
}
