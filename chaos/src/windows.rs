//! Attributing every decision of the main key to its window, per region.
//!
//! The deciding node decides by its own clock (the machine's clock plus its test-only
//! offset), at some instant between the moment the client sent the request and the moment it
//! received the answer. An allowed `fixed_window` decision answers `reset_after_ms = end of its
//! window − now`, so its window ends at `now + reset_after_ms` with `now` in
//! `[sent + offset, received + offset]`: the window's end is the one multiple of the window
//! length in `[sent + offset + reset_after_ms, received + offset + reset_after_ms]`. That names
//! the window of every admission whose round trip is shorter than a window, including one sent
//! in one window and answered in the next. An admission whose interval holds two window ends
//! (a round trip longer than a window) is *straddling*: left out of the per-window counts and
//! counted apart; one whose interval holds none contradicts the clocks (*unattributable*).
//! Where the round trip lies inside one window of the decider's clock, the two attributions
//! must agree (else a *disagreement*). Denials only show demand; they are attributed by the
//! decider's clock alone when the round trip is inside one window.
//!
//! Which node decided: the receiving node when the decision is `degraded` (it decided alone),
//! else the key's owner in the receiving node's region (forwarded). Only the clock-skew
//! scenario has offsets, and there ownership does not move.
//!
//! Windows are the decider's: with a skewed clock, a node's window *e* starts `offset` ms
//! before the others' — what the escrow's per-epoch rights bound is what every node counted
//! for epoch *e*, whenever by the wall clock that was.

use std::collections::BTreeMap;

use levee_blackbox::cluster::{Attribution, attribute};
use serde::Serialize;

use crate::cluster::REGIONS;
use crate::load::{Decision, Outcome, Target};

/// Counts of one window, per region (index of [`REGIONS`]) of the receiving node.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct WindowCounts {
    /// Checks sent in the window by the client's clock: the demand a central counter sees.
    pub sent: [u64; REGIONS.len()],
    /// Admissions decided in the window.
    pub admitted: [u64; REGIONS.len()],
    /// Denials decided in the window.
    pub denied: [u64; REGIONS.len()],
    /// Decisions of the window made under a conservative cap.
    pub degraded: u64,
}

impl WindowCounts {
    /// Admissions in every region.
    pub fn admitted_total(&self) -> u64 {
        self.admitted.iter().sum()
    }

    /// Demand in every region.
    pub fn sent_total(&self) -> u64 {
        self.sent.iter().sum()
    }
}

/// Every main-key decision of the cluster's members, window by window.
#[derive(Debug, Default, Clone)]
pub struct Accounting {
    /// Window length, ms.
    pub window_ms: u64,
    /// Window index (start / window_ms) → counts.
    pub windows: BTreeMap<i64, WindowCounts>,
    /// Admissions whose round trip spanned a whole window boundary and more.
    pub admitted_straddling: u64,
    /// Denials whose round trip crossed a window boundary.
    pub denied_straddling: u64,
    /// Admissions whose `reset_after_ms` names no window they could have been decided in.
    pub unattributable: u64,
    /// Admissions attributed to another window than the one the round trip lies in.
    pub disagreements: u64,
    /// Checks to a member that got no decision although it was up.
    pub failed: Vec<String>,
    /// Checks that got no decision while their node was being stopped or started.
    pub excused: u64,
}

impl Accounting {
    /// The counts of window `w` (zero if nothing happened in it).
    pub fn get(&self, w: i64) -> WindowCounts {
        self.windows.get(&w).copied().unwrap_or_default()
    }
}

/// Accounts the main-key decisions of `decisions` (impostors' left out). `region_of` gives a
/// node's region index; `decider_offset` the clock offset of the node that made a decision.
pub fn account(
    decisions: &[Decision],
    window_ms: u64,
    region_of: impl Fn(usize) -> usize,
    decider_offset: impl Fn(&Decision) -> i64,
) -> Accounting {
    let w = window_ms as i64;
    let mut a = Accounting {
        window_ms,
        ..Accounting::default()
    };
    for d in decisions
        .iter()
        .filter(|d| d.target == Target::Main && !d.impostor)
    {
        let r = region_of(d.node);
        a.windows.entry(d.sent_ms as i64 / w).or_default().sent[r] += 1;
        let off = decider_offset(d);
        let sent = d.sent_ms as i64 + off;
        let received = d.received_ms as i64 + off;
        let same_window = sent.div_euclid(w) == received.div_euclid(w);
        match &d.outcome {
            Outcome::Failed { error, excused } => {
                if *excused {
                    a.excused += 1;
                } else {
                    a.failed.push(format!("node {}: {error}", d.node));
                }
            }
            Outcome::Decided {
                allowed: true,
                reset_after_ms,
                degraded,
            } => match attribute(sent, received, *reset_after_ms, window_ms) {
                Attribution::Unattributable => a.unattributable += 1,
                Attribution::Straddling => a.admitted_straddling += 1,
                Attribution::Window(win) => {
                    if same_window && sent.div_euclid(w) != win {
                        a.disagreements += 1;
                    }
                    let c = a.windows.entry(win).or_default();
                    c.admitted[r] += 1;
                    if *degraded {
                        c.degraded += 1;
                    }
                }
            },
            Outcome::Decided {
                allowed: false,
                degraded,
                ..
            } => {
                if same_window {
                    let c = a.windows.entry(sent.div_euclid(w)).or_default();
                    c.denied[r] += 1;
                    if *degraded {
                        c.degraded += 1;
                    }
                } else {
                    a.denied_straddling += 1;
                }
            }
        }
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admitted(node: usize, sent_ms: u64, received_ms: u64, reset_after_ms: u64) -> Decision {
        Decision {
            node,
            target: Target::Main,
            sent_ms,
            received_ms,
            impostor: false,
            outcome: Outcome::Decided {
                allowed: true,
                degraded: false,
                reset_after_ms,
            },
        }
    }

    #[test]
    fn an_admission_is_counted_in_the_window_its_reset_names() {
        // Sent at 10.990 s, decided at 11.002 s (reset 998 ms), answered at 11.010 s.
        let d = [
            admitted(0, 10_990, 11_010, 998),
            admitted(5, 10_100, 10_105, 897),
        ];
        let a = account(&d, 1_000, |n| n / 2, |_| 0);
        assert_eq!(a.get(11).admitted, [1, 0, 0]);
        assert_eq!(a.get(10).admitted, [0, 0, 1]);
        assert_eq!(a.get(10).sent, [1, 0, 1]);
        assert_eq!((a.unattributable, a.disagreements), (0, 0));
    }

    #[test]
    fn a_skewed_decider_is_attributed_by_its_own_clock() {
        // The decider's clock is 400 ms ahead: at 10.700 s real it is in its window 11.
        let d = [admitted(0, 10_700, 10_705, 898)];
        let a = account(&d, 1_000, |n| n / 2, |_| 400);
        assert_eq!(a.get(11).admitted, [1, 0, 0]);
        assert_eq!((a.unattributable, a.disagreements), (0, 0));
        // Attributed by the real clock instead, the same answer names no window.
        let b = account(&d, 1_000, |n| n / 2, |_| 0);
        assert_eq!(b.unattributable, 1);
    }

    #[test]
    fn impossible_and_straddling_admissions_are_counted_apart() {
        let d = [
            admitted(0, 10_100, 10_105, 500), // ends 10.6 s: no window end
            admitted(0, 10_100, 12_100, 950), // two window ends in the interval
        ];
        let a = account(&d, 1_000, |n| n / 2, |_| 0);
        assert_eq!(a.unattributable, 1);
        assert_eq!(a.admitted_straddling, 1);
        assert_eq!(a.get(10).admitted_total(), 0);
    }
}
