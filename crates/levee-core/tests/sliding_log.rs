//! `sliding_log` on one node against a plain reference model: a list of `(time, tokens)`
//! admissions, where a request is admitted while the tokens logged in the last `window`
//! (times `t` with `t > now − window`) plus its cost stay within the limit. Exact: every
//! decision, `remaining`, `retry_after_ms` and `reset_after_ms` must equal the model's, the
//! last two searched millisecond by millisecond with the model's own predicate.

use levee_core::{ClusterView, DecideCtx, Decision, KeyState, NodeIdx, ReplicaSet, Rule, RuleSpec};
use proptest::prelude::*;

const T0: u64 = 1_700_000_000_000;

/// The reference: admissions, oldest first; refunds take from the newest in the window.
struct Model {
    limit: u64,
    window: u64,
    log: Vec<(u64, u64)>,
}

impl Model {
    fn used(&self, t: u64) -> u64 {
        self.log
            .iter()
            .filter(|&&(at, _)| at + self.window > t)
            .map(|&(_, n)| n)
            .sum()
    }

    fn allows(&self, t: u64, cost: u64) -> bool {
        self.used(t) + cost <= self.limit
    }

    fn retry_after(&self, t: u64, cost: u64) -> u64 {
        (t..=t + self.window)
            .find(|&u| self.allows(u, cost))
            .map_or(self.window, |u| (u - t).max(1))
    }

    fn reset_after(&self, t: u64) -> u64 {
        (t..=t + self.window)
            .find(|&u| self.used(u) == 0)
            .map_or(self.window, |u| u - t)
    }

    fn refund(&mut self, t: u64, mut cost: u64) {
        for (at, n) in self.log.iter_mut().rev() {
            if cost == 0 || *at + self.window <= t {
                break;
            }
            let give = cost.min(*n);
            *n -= give;
            cost -= give;
        }
    }
}

struct Core {
    replicas: ReplicaSet,
    rule: Rule,
    key: KeyState,
}

impl Core {
    fn ctx(&self, now: u64) -> DecideCtx<'_> {
        DecideCtx {
            now,
            me: NodeIdx(0),
            replicas: &self.replicas,
            view: ClusterView::alone(),
        }
    }

    fn decide(&mut self, now: u64, cost: u64, dry_run: bool) -> Decision {
        let target = self.rule.target(None, cost).expect("cost within the limit");
        let ctx = DecideCtx {
            now,
            me: NodeIdx(0),
            replicas: &self.replicas,
            view: ClusterView::alone(),
        };
        self.key
            .decide(&target, self.rule.mode, cost, dry_run, &ctx)
    }
}

impl Core {
    fn refund(&mut self, now: u64, cost: u64) -> Decision {
        let target = self.rule.target(None, 0).expect("no class");
        let ctx = DecideCtx {
            now,
            me: NodeIdx(0),
            replicas: &self.replicas,
            view: ClusterView::alone(),
        };
        self.key.refund(&target, cost, &ctx)
    }
}

#[derive(Debug, Clone, Copy)]
enum Op {
    Check { gap: u64, cost: u64 },
    DryRun { gap: u64, cost: u64 },
    Refund { gap: u64, cost: u64 },
}

fn op(limit: u64) -> impl Strategy<Value = Op> {
    let gap = prop_oneof![3 => 0u64..5, 2 => 0u64..200, 1 => 0u64..2_000];
    let cost = 0..=limit.min(4);
    prop_oneof![
        8 => (gap.clone(), cost.clone()).prop_map(|(gap, cost)| Op::Check { gap, cost }),
        1 => (gap.clone(), cost.clone()).prop_map(|(gap, cost)| Op::DryRun { gap, cost }),
        1 => (gap, cost).prop_map(|(gap, cost)| Op::Refund { gap, cost }),
    ]
}

fn case() -> impl Strategy<Value = (u64, u64, Vec<Op>)> {
    (1u64..12, 1u64..1_000).prop_flat_map(|(limit, window)| {
        (
            Just(limit),
            Just(window),
            prop::collection::vec(op(limit), 1..120),
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn a_sliding_log_on_one_node_decides_exactly_as_the_reference_log((limit, window, ops) in case()) {
        let replicas = ReplicaSet::single("n1", "eu");
        let mut rule = RuleSpec::sliding_log("log", limit, window).validate().expect("valid");
        rule.bind(&replicas);
        let mut core = Core { replicas, rule, key: KeyState::new() };
        let mut model = Model { limit, window, log: Vec::new() };
        let mut now = T0;
        for (i, op) in ops.into_iter().enumerate() {
            match op {
                Op::Check { gap, cost } | Op::DryRun { gap, cost } => {
                    now += gap;
                    let dry_run = matches!(op, Op::DryRun { .. });
                    let allowed = model.allows(now, cost);
                    let retry = if allowed { 0 } else { model.retry_after(now, cost) };
                    if allowed && !dry_run && cost > 0 {
                        model.log.push((now, cost));
                    }
                    let d = core.decide(now, cost, dry_run);
                    prop_assert_eq!(d.allowed, allowed, "step {}: {:?} at +{}", i, op, now - T0);
                    prop_assert_eq!(d.remaining, limit - model.used(now), "remaining, step {}", i);
                    prop_assert_eq!(d.retry_after_ms, retry, "retry_after_ms, step {}", i);
                    prop_assert_eq!(d.reset_after_ms, model.reset_after(now), "reset_after_ms, step {}", i);
                }
                Op::Refund { gap, cost } => {
                    now += gap;
                    model.refund(now, cost);
                    let d = core.refund(now, cost);
                    prop_assert_eq!(d.remaining, limit - model.used(now), "remaining after a refund, step {}", i);
                }
            }
            let target = core.rule.target(None, 0).expect("no class");
            let usage = core.key.usage(&target, &core.ctx(now));
            prop_assert_eq!(usage.used, model.used(now), "usage, step {}", i);
            prop_assert!(core.key.crdt().slots.len() as u64 <= 2 * limit, "the log is bounded");
        }
    }
}

#[test]
fn a_sliding_log_admits_exactly_limit_in_any_window_and_frees_each_admission_a_window_later() {
    let replicas = ReplicaSet::single("n1", "eu");
    let mut rule = RuleSpec::sliding_log("log", 3, 1_000)
        .validate()
        .expect("valid");
    rule.bind(&replicas);
    let mut core = Core {
        replicas,
        rule,
        key: KeyState::new(),
    };
    for t in [0, 300, 600] {
        assert!(core.decide(T0 + t, 1, false).allowed, "at +{t}");
    }
    let d = core.decide(T0 + 999, 1, false);
    assert!(!d.allowed);
    // The admission at +0 leaves the window at +1000: a fixed or two-window counter would
    // answer differently at +999.
    assert_eq!(d.retry_after_ms, 1);
    assert!(core.decide(T0 + 1_000, 1, false).allowed);
    assert!(!core.decide(T0 + 1_299, 1, false).allowed);
    assert!(core.decide(T0 + 1_300, 1, false).allowed);
}

#[test]
fn a_sliding_log_limit_above_10000_is_refused_naming_the_field() {
    let e = RuleSpec::sliding_log("log", 10_001, 1_000)
        .validate()
        .unwrap_err();
    assert_eq!(e.field, "limit");
    assert!(e.problem.contains("10000"), "{e}");
    assert!(
        RuleSpec::sliding_log("log", 10_000, 1_000)
            .validate()
            .is_ok()
    );
    let e = RuleSpec {
        burst: Some(3),
        ..RuleSpec::sliding_log("log", 5, 1_000)
    }
    .validate()
    .unwrap_err();
    assert_eq!(e.field, "burst");
}

/// A peer's delta holding far more log entries than any honest cluster writes (one per
/// millisecond of the window, from every node) leaves the key with at most `2 × limit`
/// entries, the newest; and the key still decides.
#[test]
fn a_flood_of_log_entries_from_a_peer_is_bounded_to_twice_the_limit() {
    use levee_core::crdt::Tally;
    use levee_core::{KeyCrdt, ReplicaSpec};
    let replicas = ReplicaSet::new(
        &[("eu".to_owned(), 1), ("us".to_owned(), 1)],
        &[
            ReplicaSpec {
                id: "eu-1".into(),
                region: "eu".into(),
                weight: None,
            },
            ReplicaSpec {
                id: "us-1".into(),
                region: "us".into(),
                weight: None,
            },
        ],
    )
    .unwrap();
    let (limit, window) = (50u64, 60_000u64);
    let mut rule = RuleSpec::sliding_log("log", limit, window)
        .validate()
        .expect("valid");
    rule.bind(&replicas);
    let target = rule.target(None, 1).expect("cost 1 fits");
    let now = T0;
    let mut flood = KeyCrdt::default();
    for t in (now - window + 1)..=now {
        let tally = flood.slot_mut(t).tallies.entry(NodeIdx(1));
        *tally = Tally {
            consumed: 1,
            refunded: 0,
            requested: 1,
        };
    }
    let ctx = DecideCtx {
        now,
        me: NodeIdx(0),
        replicas: &replicas,
        view: ClusterView::alone(),
    };
    let mut key = KeyState::new();
    key.merge(&flood, &target, &ctx)
        .expect("a well-formed delta");
    let slots = &key.crdt().slots;
    assert_eq!(slots.len() as u64, 2 * limit);
    assert_eq!(
        slots.last().map(|s| s.epoch),
        Some(now),
        "the newest are kept"
    );
    // Strict: this node spends only its own share, whatever the peer claims.
    assert!(key.decide(&target, rule.mode, 1, false, &ctx).allowed);
}
