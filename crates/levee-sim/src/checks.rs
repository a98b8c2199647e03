//! The properties every run is checked against, from the ledger of what was admitted.
//!
//! | check | policy | what must hold |
//! |---|---|---|
//! | `strict-limit` | strict | admitted ≤ limit in every window of every key; where a crashed node's usage or gifts of a window it can still admit in had reached no node still alive when it pulled again (lost with the crash, as the design allows: "no counted usage is lost beyond the last gossip interval"), admitted ≤ limit + that loss, and the window is reported apart. State that live peers held but the restarted node did not get before deciding is no excuse |
//! | `optimistic-bound` | optimistic | in a window touched by a partition (a cut is in force at its end and no link heals during it), admitted ≤ limit + what was in flight when the partition began + what regions still connected took between two syncs (see below) |
//! | `optimistic-view` | optimistic | in every window, admitted ≤ limit + the usage the node making the window's last admission had not accounted for (see below) |
//! | `partition-cap` | both | in a window wholly inside a detected symmetric partition, each side admits at most its share (optimistic: plus what was in flight between its own regions) |
//! | `partition-share` | both | in such a window, a side whose demand reaches its share admits at least 95 % of it |
//! | `heal-agreement` | both | after a detected partition heals, every view of the probe key's consumption (what `/v1/usage` shows; see `heal.rs`) is equal within two gossip intervals plus one round trip |
//! | `heal-never` | both | … and they agree before the run ends at all |
//! | `error`, `panic` | all | no frame fails to encode or decode, no decision is missing, nothing panics |
//!
//! ## The optimistic bound, concretely
//!
//! `docs/replication.md`: a node admits against the merged global usage, every unreachable
//! region counted as `max(last known, its full share)`, and "between two syncs a region takes
//! at most its share … of what was left at the last sync. The overshoot is therefore bounded
//! by what concurrent regions took between two syncs — at most what was in flight when a
//! partition began".
//!
//! `optimistic-bound` takes the last sentence literally. At every cut of a link from region
//! *a* to region *b*, for every key and every window any clock is in, the simulator measures
//! the usage *a*'s nodes had admitted that some live node of *b* had not merged yet (true
//! tallies minus the least informed receiver's view, per node of *a*): that is what was in
//! flight when (this part of) the partition began, and the sum over every cut is the
//! window's allowance. To it is added what concurrent regions took between two syncs: for
//! each region, at its last admission in the window, the usage of the regions it could still
//! hear that it had not merged yet — the overshoot a healthy network allows, which a
//! partition neither excuses nor causes. A window is checked when a cut is in force at its end (allowing for
//! the largest clock offset) and no link heals during it; windows that begin after the
//! partition began have an allowance of zero — the design's "with every other region cut
//! off a region admits at most its own share", whether or not the cut has been detected yet.
//!
//! `optimistic-view` is the weaker statement every window must satisfy, partition or not:
//! take the window's last admission, by node *m* at time *t*. For every region *R*, compare the usage *R* really had in the window at *t*
//! with what *m* assumed (its merged view of *R*'s per-node tallies, or for a region it saw
//! as unreachable, or every other region while recovering, `max(view, R's share)`). The
//! in-flight amount is the sum of the positive differences: usage that was admitted but had
//! not reached *m* (including, after a crash, *m*'s own forgotten usage) and that the
//! unreachable-region assumption did not cover. Since *m* admitted, its assumed usage plus
//! the cost was within the limit, so the window's total is at most the limit plus that
//! amount. A violation means a node admitted beyond what it knew.
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

use levee_core::Consistency;

use crate::heal::HealFigure;
use crate::ledger::{Ledger, WindowBook};
use crate::plan::{Episode, RunPlan, T0};

/// The five policies of the accuracy figure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Policy {
    /// Levee, escrow.
    Strict,
    /// Levee, shared counter with shares.
    Optimistic,
    /// Each region its share, no communication.
    StaticSplit,
    /// One exact counter in the key's home region.
    Central,
    /// Local cache, hits sent asynchronously (Gubernator `GLOBAL`).
    SharedCounter,
}

impl Policy {
    /// Every policy, in the figure's order.
    pub const ALL: [Policy; 5] = [
        Policy::Strict,
        Policy::Optimistic,
        Policy::StaticSplit,
        Policy::Central,
        Policy::SharedCounter,
    ];

    /// Its name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Policy::Strict => "levee strict",
            Policy::Optimistic => "levee optimistic",
            Policy::StaticSplit => "static split",
            Policy::Central => "central counter",
            Policy::SharedCounter => "shared counter (Gubernator GLOBAL)",
        }
    }

    /// Whether this is one of Levee's own modes (whose properties are checked).
    pub fn is_levee(self) -> bool {
        matches!(self, Policy::Strict | Policy::Optimistic)
    }

    /// The consistency of a Levee mode.
    pub fn consistency(self) -> Option<Consistency> {
        match self {
            Policy::Strict => Some(Consistency::Strict),
            Policy::Optimistic => Some(Consistency::Optimistic),
            _ => None,
        }
    }
}

/// Which property failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ViolationKind {
    /// Strict mode admitted more than the limit (beyond what crashes forgot).
    StrictLimit,
    /// Optimistic mode admitted more than the limit plus what was in flight when a partition
    /// began, in a window the partition touched.
    OptimisticBound,
    /// Optimistic mode admitted more than the limit plus what the last admitting node had
    /// not accounted for.
    OptimisticView,
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
    /// A frame failed to encode or decode, or a decision was missing.
    Error,
    /// The run panicked.
    Panic,
}

impl ViolationKind {
    /// Every kind, for reports.
    pub const ALL: [ViolationKind; 10] = [
        ViolationKind::StrictLimit,
        ViolationKind::OptimisticBound,
        ViolationKind::OptimisticView,
        ViolationKind::PartitionCap,
        ViolationKind::PartitionShare,
        ViolationKind::HealAgreement,
        ViolationKind::HealNever,
        ViolationKind::RetryAfter,
        ViolationKind::Error,
        ViolationKind::Panic,
    ];

    /// Its name in reports.
    pub fn name(self) -> &'static str {
        match self {
            ViolationKind::StrictLimit => "strict-limit",
            ViolationKind::OptimisticBound => "optimistic-bound",
            ViolationKind::OptimisticView => "optimistic-view",
            ViolationKind::PartitionCap => "partition-cap",
            ViolationKind::PartitionShare => "partition-share",
            ViolationKind::HealAgreement => "heal-agreement",
            ViolationKind::HealNever => "heal-never",
            ViolationKind::RetryAfter => "retry-after",
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

/// Checks a Levee run. `errors` are the driver's own reports.
pub fn check_levee(
    plan: &RunPlan,
    policy: Policy,
    ledger: &Ledger,
    heals: &[HealFigure],
    errors: &[String],
) -> Vec<Violation> {
    let mut out = Vec::new();
    let mut push = |kind, detail: String| {
        out.push(Violation {
            kind,
            policy,
            detail,
        })
    };
    let limit = plan.limit;
    let touched = if policy == Policy::Optimistic {
        partition_windows(plan)
    } else {
        Vec::new()
    };
    for (&(key, w), book) in &ledger.windows {
        let admitted = book.admitted_total();
        let name = &plan.keys[key as usize];
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
        match policy {
            Policy::Strict if admitted > limit + book.forgotten => push(
                ViolationKind::StrictLimit,
                format!(
                    "key {name} window {}: admitted {admitted} > limit {limit} + usage lost with crashed nodes {} (state live peers held but a restarted node did not pull before deciding: {})",
                    rel(plan, w),
                    book.forgotten,
                    book.unrecovered
                ),
            ),
            Policy::Optimistic => {
                let slack = book.last.map_or(0, |l| l.slack);
                if admitted > limit + slack {
                    push(
                        ViolationKind::OptimisticView,
                        format!(
                            "key {name} window {}: admitted {admitted} > limit {limit} + unaccounted at the last admission {slack}",
                            rel(plan, w)
                        ),
                    );
                }
                let cut = book.in_flight_at_cuts;
                let between_syncs: u64 = book
                    .last_in
                    .iter()
                    .flatten()
                    .map(|l| l.unseen_connected())
                    .sum();
                if touched.contains(&w) && admitted > limit + cut + between_syncs {
                    push(
                        ViolationKind::OptimisticBound,
                        format!(
                            "key {name} window {}: admitted {admitted} > limit {limit} + in flight when the partition began {cut} + taken between syncs by regions still connected {between_syncs} (unaccounted at the last admission: {slack})",
                            rel(plan, w)
                        ),
                    );
                }
            }
            _ => {}
        }
    }
    if !plan.has_crashes() {
        let limits = plan.region_limits();
        for ep in plan.episodes.iter().filter(|e| !e.sides.is_empty()) {
            for w in inside_windows(plan, ep) {
                for (k, name) in plan.keys.iter().enumerate() {
                    let empty = WindowBook::default();
                    let book = ledger.windows.get(&(k as u32, w)).unwrap_or(&empty);
                    for side in &ep.sides {
                        let share: u64 = side.iter().map(|&r| limits[r]).sum();
                        let admitted: u64 = side.iter().map(|&r| book.admitted[r]).sum();
                        let demand: u64 = side.iter().map(|&r| book.demand[r]).sum();
                        let cap = share + side_slack(policy, book, side);
                        if admitted > cap {
                            push(
                                ViolationKind::PartitionCap,
                                format!(
                                    "key {name} window {}: side {side:?} admitted {admitted} > cap {cap} (share {share})",
                                    rel(plan, w)
                                ),
                            );
                        }
                        if demand >= share && admitted * 100 < share * 95 {
                            push(
                                ViolationKind::PartitionShare,
                                format!(
                                    "key {name} window {}: side {side:?} admitted {admitted} < 95 % of its share {share} (demand {demand})",
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

/// What was in flight between the regions of one side at the side's last admission.
fn side_slack(policy: Policy, book: &WindowBook, side: &[usize]) -> u64 {
    if policy != Policy::Optimistic {
        return 0;
    }
    side.iter()
        .filter_map(|&r| book.last_in[r])
        .max_by_key(|l| l.at)
        .map_or(0, |l| side.iter().map(|&r| l.unseen[r]).sum())
}

/// The windows a partition touches: a cut is in force at the window's end on every clock,
/// and no link heals while any clock is in the window.
pub fn partition_windows(plan: &RunPlan) -> Vec<u64> {
    use crate::plan::FaultKind;
    let off = plan.max_offset() as u64;
    let w_ms = plan.window_ms;
    let first = T0 / w_ms;
    let last = (T0 + plan.duration_ms) / w_ms;
    (first..=last)
        .filter(|&w| {
            let lo = (w * w_ms).saturating_sub(T0 + off);
            let hi = (w + 1) * w_ms - T0 + off;
            let heals_inside = plan
                .faults
                .iter()
                .any(|f| matches!(f.kind, FaultKind::Mend { .. }) && (lo..=hi).contains(&f.at));
            if heals_inside {
                return false;
            }
            let mut cut = std::collections::BTreeSet::new();
            for f in plan.faults.iter().take_while(|f| f.at <= hi) {
                match f.kind {
                    FaultKind::Cut { from, to } => {
                        cut.insert((from, to));
                    }
                    FaultKind::Mend { from, to } => {
                        cut.remove(&(from, to));
                    }
                    _ => {}
                }
            }
            !cut.is_empty()
        })
        .collect()
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
