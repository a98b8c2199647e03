//! States from a faulty or compromised peer: huge values, `u64::MAX`, transfers that do not add
//! up. Merging them into a node's state and then deciding, rebalancing, reporting usage and
//! extracting deltas never panics (nor wraps), a refused merge leaves the state unchanged, and
//! no merge lets a node admit more than its static share plus what its donors gave it.

use levee_core::crdt::{BucketReg, Claim, DemandReg, EpochSlot, Tally};
use levee_core::rule::AlgorithmName;
use levee_core::{
    ClusterView, DecideCtx, KeyCrdt, KeyState, Lattice, NodeIdx, RebalanceCtx, RegionMask,
    ReplicaSet, ReplicaSpec, RuleMode, RuleSpec,
};
use proptest::prelude::*;

const WINDOW_MS: u64 = 1_000;
const START: u64 = 1_700_000_000_000;
/// Two regions of two nodes: 0 and 1 in `eu`, 2 and 3 in `us`.
const NODES: u16 = 4;

fn replicas() -> ReplicaSet {
    let nodes: Vec<ReplicaSpec> = ["eu", "eu", "us", "us"]
        .iter()
        .enumerate()
        .map(|(i, r)| ReplicaSpec {
            id: format!("{r}-{i}"),
            region: (*r).into(),
            weight: None,
        })
        .collect();
    ReplicaSet::new(&[("eu".into(), 1), ("us".into(), 1)], &nodes).unwrap()
}

/// Any value, weighted toward the edges where arithmetic overflows.
fn big() -> impl Strategy<Value = u64> {
    prop_oneof![
        0u64..100,
        Just(u64::MAX),
        Just(u64::MAX - 1),
        Just(u64::MAX / 2 + 1),
        Just(u64::MAX / 10),
        Just(1u64 << 63),
        any::<u64>(),
    ]
}

fn node() -> impl Strategy<Value = NodeIdx> {
    (0..NODES).prop_map(NodeIdx)
}

/// A hostile state: epochs around now (and far off), every value anywhere in `u64`, transfers
/// of any size between any nodes.
fn hostile() -> impl Strategy<Value = KeyCrdt> {
    let epoch = prop_oneof![
        (START / WINDOW_MS - 1..START / WINDOW_MS + 2),
        Just(u64::MAX),
        Just(0u64)
    ];
    let slot = (
        epoch.clone(),
        prop::collection::vec((node(), big(), big(), big()), 0..5),
        prop::collection::vec((node(), node(), big()), 0..6),
    );
    (
        prop::collection::vec(slot, 0..3),
        prop::collection::vec((node(), node(), big()), 0..6),
        prop::collection::vec((node(), big(), big(), any::<i64>()), 0..3),
        prop::collection::vec((node(), big(), big(), big()), 0..4),
        prop::collection::vec((epoch, node(), big(), big()), 0..3),
    )
        .prop_map(|(slots, holdings, buckets, demand, claims)| {
            let mut k = KeyCrdt::default();
            for (epoch, tallies, transfers) in slots {
                let mut s = EpochSlot::new(epoch);
                for (n, consumed, refunded, requested) in tallies {
                    s.tallies.entry(n).join(&Tally {
                        consumed,
                        refunded,
                        requested,
                    });
                }
                let mut m = KeyCrdt::default();
                for (from, to, units) in transfers {
                    // `give` adds to a cell; a hostile peer sets it: one gift per cell.
                    if from != to && m.holdings.get(from, to) == 0 {
                        m.holdings.give(from, to, units);
                    }
                }
                s.transfers.join(&m.holdings);
                k.slot_mut(epoch).join(&s);
            }
            for (from, to, units) in holdings {
                if k.holdings.get(from, to) == 0 {
                    k.holdings.give(from, to, units);
                }
            }
            for (n, seq, at, level_nt) in buckets {
                k.buckets.entry(n).join(&BucketReg { seq, at, level_nt });
            }
            for (n, seq, forecast, received) in demand {
                k.demand.entry(n).join(&DemandReg {
                    seq,
                    forecast,
                    received,
                });
            }
            for (epoch, n, step, ceiling) in claims {
                k.claims.raise(Claim {
                    epoch,
                    node: n,
                    step,
                    ceiling,
                });
            }
            k
        })
}

fn spec(algorithm: u8, limit: u64) -> RuleSpec {
    match algorithm % 4 {
        0 => RuleSpec::fixed_window("r", limit, WINDOW_MS),
        1 => RuleSpec::sliding_window("r", limit, WINDOW_MS),
        2 => RuleSpec::token_bucket("r", limit, WINDOW_MS, limit),
        _ => {
            let _ = AlgorithmName::Quota;
            RuleSpec::fixed_window("r", limit, 60 * WINDOW_MS)
        }
    }
}

fn view() -> ClusterView {
    ClusterView {
        unreachable: RegionMask::EMPTY,
        acting_alone: false,
        recovering: false,
        blind_since: None,
    }
}

/// What `me` may hold at most after merging `states`: its static share plus, per donor, the
/// largest cell any of the states says the donor gave it (the join's value), in u128 so that
/// nothing wraps.
fn most_held(base: u64, me: NodeIdx, states: &[&KeyCrdt], epoch: Option<u64>) -> u128 {
    let mut received = 0u128;
    for from in 0..NODES {
        let from = NodeIdx(from);
        let cell = states
            .iter()
            .map(|s| match epoch {
                Some(e) => s.slot(e).map_or(0, |s| s.transfers.get(from, me)),
                None => s.holdings.get(from, me),
            })
            .max()
            .unwrap_or(0);
        received += u128::from(cell);
    }
    u128::from(base) + received
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn hostile_states_never_panic_and_never_raise_holdings_above_the_gifts(
        algorithm in 0u8..4,
        limit in prop_oneof![1u64..100, Just(1_000_000_000u64)],
        me in node(),
        first in hostile(),
        second in hostile(),
        later in 0u64..5_000,
    ) {
        let replicas = replicas();
        let mut rule = spec(algorithm, limit).validate().unwrap();
        rule.bind(&replicas);
        let target = rule.target(None, 1).unwrap();
        let ctx = DecideCtx { now: START, me, replicas: &replicas, view: view() };
        let mut state = KeyState::new();
        // Some honest history first.
        state.decide(&target, RuleMode::Enforce, 1, false, &ctx);
        for delta in [&first, &second] {
            let before = state.crdt().clone();
            match state.merge(delta, &target, &ctx) {
                Ok(_) => {}
                Err(_) => prop_assert_eq!(state.crdt(), &before, "a refused merge changed the state"),
            }
        }
        for at in [START, START + later] {
            let ctx = DecideCtx { now: at, ..ctx };
            let region = replicas.region_nodes(replicas.region_of(me));
            for owner in [region[0], region[1]] {
                let rctx = RebalanceCtx {
                    now: at,
                    me,
                    replicas: &replicas,
                    view: ctx.view,
                    owner,
                    max_in_flight: limit / 4 + 1,
                    inherit_from: None,
                hears: &|_| true,
                clock_of: &|_| None,
                started: 0,
                    own_demand: false,
                };
                state.rebalance(&target, &rctx);
            }
            let _ = state.usage(&target, &ctx);
            state.decide(&target, RuleMode::Enforce, u64::MAX, false, &ctx);
            state.decide(&target, RuleMode::Enforce, limit, true, &ctx);
            state.refund(&target, u64::MAX, &ctx);
            let _ = state.take_delta(me);
            let _ = state.crdt().fingerprint(0);
        }
        // Strict fixed windows: what the node admits in the current epoch is bounded by its
        // share plus the largest gifts any state claimed, whatever the values.
        if algorithm == 0 {
            let now = START + later + 1;
            let ctx = DecideCtx { now, ..ctx };
            let epoch = now / WINDOW_MS;
            let base = replicas.split(limit)[usize::from(me.0)];
            let used_before = state
                .crdt()
                .slot(epoch)
                .and_then(|s| s.tallies.get(me))
                .map_or(0, Tally::net);
            let mut admitted = 0u128;
            for _ in 0..(limit.min(200) + 5) {
                if state.decide(&target, RuleMode::Enforce, 1, false, &ctx).allowed {
                    admitted += 1;
                }
            }
            let bound = most_held(base, me, &[&first, &second], Some(epoch));
            prop_assert!(
                u128::from(used_before) + admitted <= bound.max(u128::from(used_before)),
                "admitted {admitted} after {used_before} with at most {bound} held"
            );
        }
    }
}

/// A peer's demand register of `u64::MAX`: the owner's need with margin used to overflow.
#[test]
fn a_peer_forecast_of_u64_max_does_not_overflow_the_margin() {
    let replicas = replicas();
    for algorithm in 0..4 {
        let mut rule = spec(algorithm, 100).validate().unwrap();
        rule.bind(&replicas);
        let target = rule.target(None, 1).unwrap();
        let me = NodeIdx(0);
        let ctx = ctx_at(&replicas, me, START);
        let mut hostile = KeyCrdt::default();
        *hostile.demand.entry(NodeIdx(2)) = DemandReg {
            seq: 1,
            forecast: u64::MAX,
            received: 0,
        };
        let mut state = KeyState::new();
        state.merge(&hostile, &target, &ctx).unwrap();
        let rctx = RebalanceCtx {
            now: START,
            me,
            replicas: &replicas,
            view: ctx.view,
            owner: me,
            max_in_flight: 1_000,
            inherit_from: None,
            hears: &|_| true,
            clock_of: &|_| None,
            started: 0,
            own_demand: false,
        };
        // Node 2 (another region) says it needs everything: it gets at most this node's
        // share (25) in each scope. Windows have three at START, a window's first
        // millisecond (the window that just ended, which a peer whose clock is behind may
        // still be in, the current one and the next); the others one.
        let scopes = if matches!(algorithm, 0 | 3) { 3 } else { 1 };
        let given = state.rebalance(&target, &rctx);
        assert!(
            given <= 25 * scopes,
            "gave {given} of a share of 25 per scope, {scopes} scopes"
        );
    }
}

/// Transfers to one node that add up past `u64::MAX`: its received sum used to overflow.
#[test]
fn transfers_that_add_up_past_u64_max_do_not_overflow() {
    let replicas = replicas();
    let mut rule = spec(2, 100).validate().unwrap();
    rule.bind(&replicas);
    let target = rule.target(None, 1).unwrap();
    let me = NodeIdx(0);
    let ctx = ctx_at(&replicas, me, START);
    let mut hostile = KeyCrdt::default();
    hostile.holdings.give(NodeIdx(2), me, u64::MAX);
    hostile.holdings.give(NodeIdx(3), me, u64::MAX);
    let mut state = KeyState::new();
    let _ = state.merge(&hostile, &target, &ctx);
    let rctx = RebalanceCtx {
        now: START,
        me,
        replicas: &replicas,
        view: ctx.view,
        owner: me,
        max_in_flight: 1_000,
        inherit_from: None,
        hears: &|_| true,
        clock_of: &|_| None,
        started: 0,
        own_demand: false,
    };
    state.rebalance(&target, &rctx);
    state.decide(&target, RuleMode::Enforce, 1, false, &ctx);
}

/// A healthy cluster's decision context for `me` at `now`.
fn ctx_at(replicas: &ReplicaSet, me: NodeIdx, now: u64) -> DecideCtx<'_> {
    DecideCtx {
        now,
        me,
        replicas,
        view: view(),
    }
}

fn strict_fixed(limit: u64) -> (ReplicaSet, levee_core::Rule) {
    let replicas = replicas();
    let mut rule = spec(0, limit).validate().unwrap();
    rule.bind(&replicas);
    (replicas, rule)
}

/// Transfers whose join would take a node's received sum past `u64::MAX` are refused, said
/// so, and change nothing.
#[test]
fn a_delta_whose_sums_would_overflow_is_refused_unchanged() {
    let (replicas, rule) = strict_fixed(100);
    let target = rule.target(None, 1).unwrap();
    let me = NodeIdx(0);
    let ctx = ctx_at(&replicas, me, START);
    let epoch = START / WINDOW_MS;
    let mut state = KeyState::new();
    let mut first = KeyCrdt::default();
    first
        .slot_mut(epoch)
        .transfers
        .give(NodeIdx(2), me, u64::MAX);
    state.merge(&first, &target, &ctx).unwrap();
    let before = state.crdt().clone();
    let mut second = KeyCrdt::default();
    second.slot_mut(epoch).transfers.give(NodeIdx(3), me, 1);
    assert_eq!(
        state.merge(&second, &target, &ctx),
        Err(levee_core::MergeError::Overflow)
    );
    assert_eq!(state.crdt(), &before);
    // The same in the continuous holdings, and for two epochs' worth of consumption.
    let mut third = KeyCrdt::default();
    third.holdings.give(NodeIdx(1), NodeIdx(2), u64::MAX);
    third.holdings.give(NodeIdx(3), NodeIdx(2), u64::MAX);
    assert_eq!(
        state.merge(&third, &target, &ctx),
        Err(levee_core::MergeError::Overflow)
    );
    let mut fourth = KeyCrdt::default();
    for n in [1, 2] {
        *fourth.slot_mut(epoch).tallies.entry(NodeIdx(n)) = Tally {
            consumed: u64::MAX,
            refunded: 0,
            requested: u64::MAX,
        };
    }
    assert_eq!(
        state.merge(&fourth, &target, &ctx),
        Err(levee_core::MergeError::Overflow)
    );
    assert_eq!(state.crdt(), &before);
}

/// A tally that refunded more than it consumed would hand its node unlimited credit (its net
/// stays 0 however much it consumes): refused.
#[test]
fn an_inconsistent_tally_or_a_self_transfer_is_refused() {
    let (replicas, rule) = strict_fixed(100);
    let target = rule.target(None, 1).unwrap();
    let me = NodeIdx(0);
    let ctx = ctx_at(&replicas, me, START);
    let epoch = START / WINDOW_MS;
    let mut state = KeyState::new();
    let mut forged = KeyCrdt::default();
    *forged.slot_mut(epoch).tallies.entry(me) = Tally {
        consumed: 1 << 63,
        refunded: u64::MAX,
        requested: u64::MAX,
    };
    assert!(matches!(
        state.merge(&forged, &target, &ctx),
        Err(levee_core::MergeError::Inconsistent(_))
    ));
    let mut greedy = KeyCrdt::default();
    *greedy.slot_mut(epoch).tallies.entry(NodeIdx(2)) = Tally {
        consumed: 5,
        refunded: 0,
        requested: 4,
    };
    assert!(matches!(
        state.merge(&greedy, &target, &ctx),
        Err(levee_core::MergeError::Inconsistent(_))
    ));
    // A transfer from a node to itself (give() never writes one) built as a peer would
    // send it: through the wire's encoding.
    let mut honest = KeyCrdt::default();
    honest.holdings.give(NodeIdx(1), NodeIdx(2), 5);
    let json = serde_json::to_string(&honest).unwrap();
    let wire: KeyCrdt = serde_json::from_str(&json.replace(r#""to":2"#, r#""to":1"#)).unwrap();
    assert_eq!(wire.holdings.cells()[0].to, NodeIdx(1), "{json}");
    assert!(matches!(
        state.merge(&wire, &target, &ctx),
        Err(levee_core::MergeError::Inconsistent(_))
    ));
    // With the forged tally refused, the node admits its share (25) and no more.
    let admitted = (0..100)
        .filter(|_| {
            state
                .decide(&target, RuleMode::Enforce, 1, false, &ctx)
                .allowed
        })
        .count();
    assert_eq!(admitted, 25);
}
