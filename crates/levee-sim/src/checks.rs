//! The properties every run is checked against, from the ledger of what was admitted.
//!
//! | check | policy | what must hold |
//! |---|---|---|
//! | `strict-limit` | strict | admitted ≤ limit in every window of every key (beyond the two allowances below); where a crashed node's usage or gifts of a window it can still admit in had reached no node still alive when it pulled again (lost with the crash, as the design allows: "no counted usage is lost beyond the last gossip interval"), admitted ≤ limit + that loss, and the window is reported apart. State that live peers held but the restarted node did not get before deciding is no excuse. A node removed while it was alive (frozen, then thawed with its old list) keeps its old share until it hears of its removal (docs/membership.md, *Removing a node that is not dead*): from the window it went on in to the one after it heard, admitted ≤ limit + its old share, and the window is reported apart |
//! | `partition-cap` | strict | in a window wholly inside a detected symmetric partition, each side admits at most its share |
//! | `partition-share` | strict | in such a window, a side whose demand reaches its share admits at least 95 % of it (both net of refunds: a request admitted and given back was served) |
//! | `retry-after` | strict | a check denied while the window's true tallies had room carries `retry_after_ms` ≤ [`levee_core::RIGHTS_RETRY_MS`] (a node recovering or blind aside: it answers when it expects its peers' state) |
//! | `heal-agreement` | strict | after a detected partition heals, every view of the probe key's consumption (what `/v1/usage` shows; see `heal.rs`) is equal within two gossip intervals plus one round trip |
//! | `heal-never` | strict | … and they agree before the run ends at all |
//! | `list-agreement` | strict | in a run whose node list changes, every running node of the last list runs it, sees it agreed, and spends its full share under it when the run ends; a removed node that runs (thawed) has no share |
//! | `error`, `panic` | all | no frame fails to encode or decode, no decision is missing, nothing panics |
//!
//! Optimistic mode, whose overshoot under partitions the `optimistic-bound` and
//! `optimistic-view` checks measured, was removed (`docs/accuracy.md`).
//!
//! ## Windows wholly inside a partition
//!
//! Window *e* (as any node's clock counts it) is inside a partition when the window before
//! it begins after every node has had time to see the cut (`suspect_after` plus two gossip
//! intervals after the cut, allowing for the largest clock offset) and *e* ends before the
//! heal. Strict mode gives rights for a window during the window before it, so nothing for
//! *e* crosses the cut and each side holds exactly the sum of its nodes' static splits.
//! Checked only for symmetric partitions (a region isolated, a full split) in runs without
//! crashes.

use std::fmt;

use std::collections::BTreeMap;

use crate::heal::HealFigure;
use crate::ledger::{Ledger, WindowBook};
use crate::levee::Ghost;
use crate::plan::{Episode, RunPlan, T0};

/// The four policies of the accuracy figure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Policy {
    /// Levee (escrow).
    Strict,
    /// Each region its share, no communication.
    StaticSplit,
    /// One exact counter in the key's home region.
    Central,
    /// Local cache, hits sent asynchronously (Gubernator `GLOBAL`).
    SharedCounter,
}

impl Policy {
    /// Every policy, in the figure's order.
    pub const ALL: [Policy; 4] = [
        Policy::Strict,
        Policy::StaticSplit,
        Policy::Central,
        Policy::SharedCounter,
    ];

    /// Its name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Policy::Strict => "levee strict",
            Policy::StaticSplit => "static split",
            Policy::Central => "central counter",
            Policy::SharedCounter => "shared counter (Gubernator GLOBAL)",
        }
    }

    /// Whether this is Levee itself (whose properties are checked).
    pub fn is_levee(self) -> bool {
        self == Policy::Strict
    }
}

/// Which property failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ViolationKind {
    /// Strict mode admitted more than the limit (beyond what crashes forgot).
    StrictLimit,
    /// A rule that holds rights continuously (a bucket, a sliding window or log) admitted
    /// more than its algorithm allows (`crate::algos`).
    AlgorithmLimit,
    /// A side of a partition admitted more than its cap.
    PartitionCap,
    /// A side of a partition with the demand admitted less than 95 % of its share.
    PartitionShare,
    /// Views of consumption agreed after a heal, but later than two gossip intervals plus
    /// one round trip.
    HealAgreement,
    /// Views of consumption had not agreed when the run ended.
    HealNever,
    /// Strict mode denied a check while the window still had room (by the true tallies)
    /// with a retry-after longer than the time rights take to arrive
    /// ([`levee_core::RIGHTS_RETRY_MS`]).
    RetryAfter,
    /// After membership changes, a running node did not end on the last list, agreed, with
    /// its full share under it (or a removed node that runs still had a share).
    ListAgreement,
    /// A frame failed to encode or decode, or a decision was missing.
    Error,
    /// The run panicked.
    Panic,
}

impl ViolationKind {
    /// Every kind, for reports.
    pub const ALL: [ViolationKind; 10] = [
        ViolationKind::StrictLimit,
        ViolationKind::AlgorithmLimit,
        ViolationKind::PartitionCap,
        ViolationKind::PartitionShare,
        ViolationKind::HealAgreement,
        ViolationKind::HealNever,
        ViolationKind::RetryAfter,
        ViolationKind::ListAgreement,
        ViolationKind::Error,
        ViolationKind::Panic,
    ];

    /// Its name in reports.
    pub fn name(self) -> &'static str {
        match self {
            ViolationKind::StrictLimit => "strict-limit",
            ViolationKind::AlgorithmLimit => "algorithm-limit",
            ViolationKind::PartitionCap => "partition-cap",
            ViolationKind::PartitionShare => "partition-share",
            ViolationKind::HealAgreement => "heal-agreement",
            ViolationKind::HealNever => "heal-never",
            ViolationKind::RetryAfter => "retry-after",
            ViolationKind::ListAgreement => "list-agreement",
            ViolationKind::Error => "error",
            ViolationKind::Panic => "panic",
        }
    }
}

/// One failed property.
#[derive(Debug, Clone)]
pub struct Violation {
    /// Which.
    pub kind: ViolationKind,
    /// Under which policy.
    pub policy: Policy,
    /// The figures.
    pub detail: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} [{}]: {}",
            self.kind.name(),
            self.policy.name(),
            self.detail
        )
    }
}

fn rel(plan: &RunPlan, window: u64) -> u64 {
    window - T0 / plan.window_ms
}

/// By window, what removed nodes that went on with their old list may add to the limit
/// (docs/membership.md, *Removing a node that is not dead*: it spends what it held until it
/// hears of its removal, which its peers tell it at the first message they hear from it, or
/// as soon as a cut heals): its old share, in every window from the one it went on in to
/// the one after it heard, and no later than the one after [`hear_by`] (one window more
/// either way for clock skew).
pub fn ghost_allowance(plan: &RunPlan, ghosts: &[Ghost]) -> BTreeMap<u64, u64> {
    let mut out = BTreeMap::new();
    let w = |sim: u64| plan.window_of(T0 + sim);
    for g in ghosts {
        let by = hear_by(plan, g.thawed_at);
        let heard = g.heard_at.map_or(by, |h| h.min(by));
        for win in w(g.thawed_at).saturating_sub(1)..=w(heard) + 2 {
            *out.entry(win).or_default() += g.share;
        }
    }
    out
}

/// When a removed node that went on at `thawed_at` must have heard of its removal: a
/// `suspect_after` after it went on or after the last cut under way then healed (its first
/// message, the answer, and a margin for loss and jitter).
pub fn hear_by(plan: &RunPlan, thawed_at: u64) -> u64 {
    let healed = plan
        .episodes
        .iter()
        .filter(|e| e.start <= thawed_at + plan.protocol.suspect_after && e.heal >= thawed_at)
        .map(|e| e.heal)
        .max()
        .unwrap_or(thawed_at);
    healed.max(thawed_at) + plan.protocol.suspect_after
}

/// Checks a Levee run. `errors` are the driver's own reports; `allowance`, what removed nodes
/// that were alive could add to a window ([`ghost_allowance`]).
pub fn check_levee(
    plan: &RunPlan,
    policy: Policy,
    ledger: &Ledger,
    heals: &[HealFigure],
    errors: &[String],
    allowance: &BTreeMap<u64, u64>,
) -> Vec<Violation> {
    let mut out = Vec::new();
    let mut push = |kind, detail: String| {
        out.push(Violation {
            kind,
            policy,
            detail,
        })
    };
    for detail in crate::algos::check_continuous(plan, ledger) {
        push(ViolationKind::AlgorithmLimit, detail);
    }
    for (&(key, w), book) in &ledger.windows {
        let (bound, name) = plan.bound_of(key);
        if !bound.algo.per_window() {
            continue;
        }
        let limit = bound.limit;
        let admitted = book.admitted_total();
        if policy == Policy::Strict && book.retry_with_room.1 > levee_core::RIGHTS_RETRY_MS {
            push(
                ViolationKind::RetryAfter,
                format!(
                    "key {name} window {}: {} checks denied while the window had room, the longest retry_after_ms {} > {}",
                    rel(plan, w),
                    book.retry_with_room.0,
                    book.retry_with_room.1,
                    levee_core::RIGHTS_RETRY_MS
                ),
            );
        }
        let ghost = allowance.get(&w).copied().unwrap_or(0);
        match policy {
            Policy::Strict if admitted > limit + book.forgotten + ghost => push(
                ViolationKind::StrictLimit,
                format!(
                    "key {name} window {}: admitted {admitted} > limit {limit} + usage lost with crashed nodes {} + old shares of removed nodes still running {ghost} (state live peers held but a restarted node did not pull before deciding: {})",
                    rel(plan, w),
                    book.forgotten,
                    book.unrecovered
                ),
            ),
            _ => {}
        }
    }
    // Shares move with the list: a side's cap is the first list's only without changes.
    if !plan.has_crashes() && !plan.has_membership() && plan.algo.per_window() && !plan.mixed {
        let limits = plan.region_limits();
        // What costs above 1 can leave unspent at every node: rights below the next check's
        // cost.
        let stranded = plan
            .requests
            .iter()
            .map(|r| u64::from(r.cost))
            .max()
            .unwrap_or(1)
            - 1;
        let nodes = plan.topology.members();
        for ep in plan.episodes.iter().filter(|e| !e.sides.is_empty()) {
            for w in inside_windows(plan, ep) {
                for (k, name) in plan.keys.iter().enumerate() {
                    let empty = WindowBook::default();
                    let book = ledger.windows.get(&(k as u32, w)).unwrap_or(&empty);
                    for side in &ep.sides {
                        let share: u64 = side.iter().map(|&r| limits[r]).sum();
                        let admitted: u64 = side.iter().map(|&r| book.admitted[r]).sum();
                        // Net of refunds, as `admitted` is: a request admitted and then
                        // given back was served, and its tokens served later requests too.
                        let demand: u64 = side
                            .iter()
                            .map(|&r| book.demand[r].saturating_sub(book.refunded_at[r]))
                            .sum();
                        let unusable: u64 =
                            side.iter().map(|&r| nodes[r].len() as u64 * stranded).sum();
                        if admitted > share {
                            push(
                                ViolationKind::PartitionCap,
                                format!(
                                    "key {name} window {}: side {side:?} admitted {admitted} > its share {share}",
                                    rel(plan, w)
                                ),
                            );
                        }
                        if demand >= share && admitted * 100 < share.saturating_sub(unusable) * 95 {
                            push(
                                ViolationKind::PartitionShare,
                                format!(
                                    "key {name} window {}: side {side:?} admitted {admitted} < 95 % of its share {share} less {unusable} costs can leave unspent (demand {demand})",
                                    rel(plan, w)
                                ),
                            );
                        }
                    }
                }
            }
        }
    }
    for h in heals.iter().filter(|h| h.detected) {
        match h.usage_ms {
            None => push(
                ViolationKind::HealNever,
                format!(
                    "heal at {} ms: views of the probe key's usage never agreed (all held the heal's state after {:?} ms)",
                    h.heal_at, h.dominate_ms
                ),
            ),
            Some(ms) if ms > h.target_ms => push(
                ViolationKind::HealAgreement,
                format!(
                    "heal at {} ms: views of the probe key's usage agreed after {ms} ms > target {} ms (whole states equal after {:?} ms, all held the heal's state after {:?} ms)",
                    h.heal_at, h.target_ms, h.equal_ms, h.dominate_ms
                ),
            ),
            _ => {}
        }
    }
    for e in errors {
        push(ViolationKind::Error, e.clone());
    }
    out
}

/// The windows wholly inside a partition (see the module's documentation).
pub fn inside_windows(plan: &RunPlan, ep: &Episode) -> Vec<u64> {
    let p = &plan.protocol;
    let off = plan.max_offset() as u64;
    let seen = ep.start + p.suspect_after + 2 * p.gossip_interval;
    let w_ms = plan.window_ms;
    let first = T0 / w_ms + 1;
    let last = (T0 + plan.duration_ms) / w_ms;
    (first..last)
        .filter(|&w| {
            let prev_start = ((w - 1) * w_ms).saturating_sub(T0 + off);
            let end = (w + 1) * w_ms - T0 + off;
            prev_start >= seen && end <= ep.heal
        })
        .collect()
}
