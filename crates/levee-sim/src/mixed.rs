//! Mixed runs: every request is one atomic `all` call against several rules of one key, as
//! a tenant's gateway asks it, with both class methods, a shadow rule and a per-key
//! override:
//!
//! | rule | algorithm | figures (`L` = the plan's limit per 1 s) | classes |
//! |---|---|---|---|
//! | `r` | `fixed_window` | `L` per 1 s; key `tenant-0` overridden to `3L/4` | threshold: `gold` (no minimum), `free` (only while a fifth is left) |
//! | `b` | `token_bucket` | `L` per 1 s, burst `L` | separate: `gold` 3/5 of it, `free` 2/5 |
//! | `s` | `sliding_window` | `L/2` per 1 s, **shadow** | — |
//!
//! Each is checked by its own algorithm's property, bucket by bucket: the ledger counts a
//! key's tokens in four slots (`r`, `b` gold, `b` free, `s`), ledger key `slot × keys +
//! key` ([`ledger_key`]).

use levee_core::overrides::OverrideSpec;
use levee_core::rule::{ClassMethod, ClassSpec};
use levee_core::{Rule, RuleMode, RuleSpec};

use crate::plan::{Algo, RunPlan};

/// The rules' names.
pub const RULES: [&str; 3] = ["r", "b", "s"];

/// The classes a request names (1 and 2; 0: none).
pub const CLASSES: [&str; 3] = ["", "gold", "free"];

/// Ledger slots per key: `r`, `b` gold, `b` free, `s`.
pub const SLOTS: u32 = 4;

/// The key whose `r` limit is overridden.
pub const OVERRIDDEN: &str = "tenant-0";

/// The bound a ledger key is checked against: its rule's algorithm and limit per window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bound {
    /// The algorithm.
    pub algo: Algo,
    /// Its limit (a bucket's capacity, refilled at that many per window).
    pub limit: u64,
}

/// The rules of a mixed run, validated.
pub fn rules(limit: u64, window_ms: u64) -> Vec<Rule> {
    let class = |name: &str, min_fill: Option<f64>, part: Option<u64>| ClassSpec {
        name: name.to_owned(),
        min_fill,
        limit: part,
        rate: part,
    };
    let r = RuleSpec {
        class_method: Some(ClassMethod::Threshold),
        classes: vec![
            class("gold", Some(0.0), None),
            class("free", Some(0.2), None),
        ],
        overrides: vec![OverrideSpec {
            key: OVERRIDDEN.to_owned(),
            limit: Some(limit * 3 / 4),
            rate: None,
            burst: None,
            action: None,
        }],
        ..RuleSpec::fixed_window(RULES[0], limit, window_ms)
    };
    let gold = limit * 3 / 5;
    let b = RuleSpec {
        class_method: Some(ClassMethod::Separate),
        classes: vec![
            class("gold", None, Some(gold)),
            class("free", None, Some(limit - gold)),
        ],
        ..RuleSpec::token_bucket(RULES[1], limit, window_ms, limit)
    };
    let s = RuleSpec {
        mode: RuleMode::Shadow,
        ..RuleSpec::sliding_window(RULES[2], limit / 2, window_ms)
    };
    [r, b, s]
        .into_iter()
        .map(|spec| spec.validate().expect("the mixed rules are valid"))
        .collect()
}

/// The entries of a request's `all` call: (rule, class, ledger slot).
pub fn entries(class: u8) -> [(&'static str, Option<&'static str>, u32); 3] {
    let c = CLASSES[usize::from(class)];
    [
        (RULES[0], Some(c), 0),
        (RULES[1], Some(c), if class == 1 { 1 } else { 2 }),
        (RULES[2], None, 3),
    ]
}

/// The ledger key of `key`'s slot `slot`.
pub fn ledger_key(plan: &RunPlan, key: u32, slot: u32) -> u32 {
    slot * plan.keys.len() as u32 + key
}

/// The ledger keys a request of `key` and `class` counts in: the key itself, or a mixed
/// run's buckets of it.
pub fn ledger_keys(plan: &RunPlan, key: u32, class: u8) -> Vec<u32> {
    if plan.mixed {
        entries(class)
            .iter()
            .map(|&(_, _, slot)| ledger_key(plan, key, slot))
            .collect()
    } else {
        vec![key]
    }
}

/// The rules whose state counts usage per node and epoch (tallies), so that a crash can lose
/// some of it: for every key, its ledger key, the rule's name and the key's index (what the
/// ledger key is checked against, per window or on the timeline, is [`bound_of`]'s). A mixed
/// run's fixed window `r` and shadow sliding window `s`; its bucket `b` keeps a level
/// register, not tallies, as a plan of buckets does (whose crashes this does not measure
/// either).
pub fn tallied(plan: &RunPlan) -> Vec<(u32, &'static str, u32)> {
    let keys = 0..plan.keys.len() as u32;
    if plan.mixed {
        keys.flat_map(|k| {
            [
                (ledger_key(plan, k, 0), RULES[0], k),
                (ledger_key(plan, k, 3), RULES[2], k),
            ]
        })
        .collect()
    } else {
        keys.map(|k| (k, crate::plan::RULE, k)).collect()
    }
}

/// What ledger key `k` of a mixed run is checked against, and its name in reports.
pub fn bound_of(plan: &RunPlan, k: u32) -> (Bound, String) {
    let n = plan.keys.len() as u32;
    let (slot, key) = (k / n, k % n);
    let name = &plan.keys[key as usize];
    let l = plan.limit;
    let gold = l * 3 / 5;
    match slot {
        0 => (
            Bound {
                algo: Algo::FixedWindow,
                limit: if name == OVERRIDDEN { l * 3 / 4 } else { l },
            },
            format!("{name} (r)"),
        ),
        1 => (
            Bound {
                algo: Algo::TokenBucket,
                limit: gold,
            },
            format!("{name} (b, gold)"),
        ),
        2 => (
            Bound {
                algo: Algo::TokenBucket,
                limit: l - gold,
            },
            format!("{name} (b, free)"),
        ),
        _ => (
            Bound {
                algo: Algo::SlidingWindow,
                limit: l / 2,
            },
            format!("{name} (s, shadow)"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::levee::SimStates;
    use crate::scenario::Scenario;
    use levee_core::{ClusterView, NodeIdx, ReplicaSet};

    #[test]
    fn every_bucket_is_checked_against_what_the_rules_grant() {
        let plan = Scenario::Mixed.plan(6);
        assert!(plan.mixed);
        let single = ReplicaSet::single("n", "r0");
        let t0 = crate::plan::T0 + 1_000_000;
        let bound = |key, slot| bound_of(&plan, ledger_key(&plan, key, slot)).0.limit;
        // Cost-1 calls of `class` for `key` at a lone node until denied: what each slot took.
        let fill = |states: &mut SimStates, key: u32, class: u8| {
            let name = plan.keys[key as usize].clone();
            let list: Vec<(&str, Option<&str>)> =
                entries(class).iter().map(|&(r, c, _)| (r, c)).collect();
            let mut taken = [0u64; SLOTS as usize];
            for _ in 0..2 * plan.limit {
                let d = states
                    .decide_all(&list, &name, 1, t0, ClusterView::alone())
                    .expect("every entry resolves");
                for (i, &(_, _, slot)) in entries(class).iter().enumerate() {
                    if d.allowed && d.results[i].would_allow {
                        taken[slot as usize] += 1;
                    }
                }
            }
            taken
        };
        let fresh = || SimStates::new(NodeIdx(0), single.clone(), plan.rules());
        // Gold on the overridden key: its fixed window (3/4 of the limit) or its bucket's
        // gold part, whichever is smaller; the shadow window took what it allowed.
        let gold = fill(&mut fresh(), 0, 1);
        assert_eq!(gold[0], bound(0, 0).min(bound(0, 1)), "{gold:?}");
        assert_eq!(gold[1], gold[0]);
        assert_eq!(gold[3], gold[0].min(bound(0, 3)));
        assert_eq!(
            bound(0, 0),
            plan.limit * 3 / 4,
            "{OVERRIDDEN} is overridden"
        );
        // Free after gold: free takes from the fixed window only while a fifth of it is left
        // (threshold), and from its own part of the bucket (separate).
        let mut states = fresh();
        let gold = fill(&mut states, 0, 1);
        let free = fill(&mut states, 0, 2);
        let cap = bound(0, 0);
        let threshold = cap.div_ceil(5);
        let left = cap - gold[0];
        assert!(
            left >= threshold,
            "the window has room for free calls: {gold:?}"
        );
        assert_eq!(free[0], (left + 1 - threshold).min(bound(0, 2)), "{free:?}");
        assert_eq!(free[2], free[0]);
        assert!(free[0] < left, "the threshold kept {} back", left - free[0]);
    }
}
