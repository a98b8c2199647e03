//! Batches of checks this node forwarded to their owners and still waits for, each with the
//! time after which the driver is told to decide them alone; and, for a while after that,
//! what to give back should the owner's answer come late.
//!
//! A batch that times out is decided here, alone. If the owner had decided it too and its
//! answer arrives after the deadline, the owner's admissions were never seen by any caller:
//! their tokens would count against the limit with nobody having used them (a caller that
//! sees one answer and a counter that went up twice). So each batch keeps the consuming
//! checks it carried, and a late answer's admitted ones are sent back to the owner as
//! refunds ([`Answer::Late`]). Checks with an idempotency key are not given back: a retry of
//! one would be answered from the owner's cache, admitted, without consuming again. Nor is a
//! window's check whose window may have ended by the time the refund is applied: a refund
//! draws from the window it arrives in, and would free there a right the window never gave
//! ([`levee_core::Algorithm::late_refund_is_safe`], [`GIVE_BACK_MARGIN_MS`]).

use std::collections::{BTreeMap, BTreeSet};

use levee_core::{Millis, NodeIdx};
use levee_proto::ForwardCheck;

use crate::event::ForwardId;

/// How long after its deadline a batch's late answer is still given back.
pub(crate) const LATE_GRACE_MS: Millis = 30_000;
/// How long a give-back is allowed, past the late answer, to reach the owner and be applied:
/// a window's admission is given back only if its window runs at least this much longer. (A
/// node releasing an atomic call's reservation at another owner allows the same.)
pub const GIVE_BACK_MARGIN_MS: Millis = 30_000;
/// The most checks kept, over every timed-out batch, for late answers: beyond it the oldest
/// batches are forgotten (their late admissions then stay counted, never admitting more).
pub(crate) const LATE_MAX_CHECKS: usize = 4_096;

/// A forwarded batch waiting for its answer.
#[derive(Debug, Clone)]
struct Pending {
    owner: NodeIdx,
    checks: usize,
    /// When it was sent.
    asked: Millis,
    deadline: Millis,
    /// Its consuming checks, by position, as the refunds that would give them back.
    give_back: Vec<(usize, ForwardCheck)>,
}

/// Forwarded batches waiting for their answers, by id and by deadline; and the batches that
/// timed out within [`LATE_GRACE_MS`], by id.
#[derive(Debug, Clone, Default)]
pub(crate) struct PendingForwards {
    next_id: ForwardId,
    by_id: BTreeMap<ForwardId, Pending>,
    by_deadline: BTreeSet<(Millis, ForwardId)>,
    /// Timed-out batches that consumed something, oldest id first.
    late: BTreeMap<ForwardId, Pending>,
    /// Checks held in `late`.
    late_checks: usize,
}

/// What became of an answer to a forwarded batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Answer {
    /// From the owner, with one decision per check.
    Accepted,
    /// From the owner, but not one decision per check: decide the batch alone.
    Malformed,
    /// From the owner after the batch timed out (it was decided here): these refunds, each
    /// with its check's position in the batch, would give the owner back what it admitted
    /// (the caller keeps those whose refund is safe, [`give_back_is_safe`]).
    Late(GiveBack),
    /// Not waited for (from another node, or forgotten): ignored.
    Unexpected,
}

/// The refund that gives back `c`, if `c` consumes and may be given back.
fn give_back(c: &ForwardCheck) -> Option<ForwardCheck> {
    (!c.refund && !c.dry_run && c.idempotency_key.is_none() && c.cost > 0).then(|| ForwardCheck {
        rule: c.rule.clone(),
        key: c.key.clone(),
        cost: c.cost,
        class: c.class.clone(),
        dry_run: false,
        idempotency_key: None,
        refund: true,
    })
}

/// A late answer's admissions, as the refunds that would give them back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GiveBack {
    /// When the batch was sent.
    pub(crate) asked: Millis,
    /// Each admitted check's position in the batch and its refund.
    pub(crate) refunds: Vec<(usize, ForwardCheck)>,
}

/// Whether the refund of a check asked for at `asked`, admitted under `algorithm` with
/// `reset_after_ms`, can be sent to its owner `now` without ever admitting more than the
/// limit: applied there within [`GIVE_BACK_MARGIN_MS`], it takes back only what the
/// admission took ([`levee_core::Algorithm::late_refund_is_safe`]). An unknown algorithm
/// (`None`) is never given back. A late answer's give-back and an atomic call's release at
/// another owner are both weighed by it.
pub fn give_back_is_safe(
    algorithm: Option<&levee_core::Algorithm>,
    reset_after_ms: u64,
    asked: Millis,
    now: Millis,
) -> bool {
    let after = now.saturating_sub(asked) + GIVE_BACK_MARGIN_MS;
    algorithm.is_some_and(|a| a.late_refund_is_safe(reset_after_ms, after))
}

impl PendingForwards {
    /// Records a batch of `checks` sent to `owner` at `asked`, to be answered by `deadline`;
    /// returns its id.
    pub(crate) fn open(
        &mut self,
        owner: NodeIdx,
        checks: &[ForwardCheck],
        asked: Millis,
        deadline: Millis,
    ) -> ForwardId {
        self.next_id += 1;
        let id = self.next_id;
        let give_back = checks
            .iter()
            .enumerate()
            .filter_map(|(i, c)| give_back(c).map(|r| (i, r)))
            .collect();
        self.by_id.insert(
            id,
            Pending {
                owner,
                checks: checks.len(),
                asked,
                deadline,
                give_back,
            },
        );
        self.by_deadline.insert((deadline, id));
        id
    }

    /// An answer from `from` to batch `id` whose decisions say, in order, whether each check
    /// was admitted (`None`: not decided).
    pub(crate) fn answer(
        &mut self,
        from: NodeIdx,
        id: ForwardId,
        admitted: impl ExactSizeIterator<Item = bool>,
    ) -> Answer {
        if let Some(p) = self.by_id.get(&id).filter(|p| p.owner == from) {
            let deadline = p.deadline;
            let checks = p.checks;
            self.by_id.remove(&id);
            self.by_deadline.remove(&(deadline, id));
            return if checks == admitted.len() {
                Answer::Accepted
            } else {
                Answer::Malformed
            };
        }
        match self.late.get(&id) {
            Some(p) if p.owner == from && p.checks == admitted.len() => {
                let p = self.late.remove(&id).expect("just found");
                self.late_checks -= p.give_back.len();
                let admitted: Vec<bool> = admitted.collect();
                Answer::Late(GiveBack {
                    asked: p.asked,
                    refunds: p
                        .give_back
                        .into_iter()
                        .filter(|(i, _)| admitted[*i])
                        .collect(),
                })
            }
            _ => Answer::Unexpected,
        }
    }

    /// The earliest deadline, if any batch waits.
    pub(crate) fn next_deadline(&self) -> Option<Millis> {
        self.by_deadline.first().map(|&(t, _)| t)
    }

    /// Removes and returns the batches whose deadline has passed, keeping what they consumed
    /// for a late answer; forgets the timed-out batches older than [`LATE_GRACE_MS`].
    pub(crate) fn expire(&mut self, now: Millis) -> Vec<ForwardId> {
        let mut out = Vec::new();
        while let Some(&(t, id)) = self.by_deadline.first() {
            if t > now {
                break;
            }
            self.by_deadline.pop_first();
            if let Some(p) = self.by_id.remove(&id)
                && !p.give_back.is_empty()
            {
                self.late_checks += p.give_back.len();
                self.late.insert(id, p);
            }
            out.push(id);
        }
        while let Some((_, p)) = self.late.first_key_value() {
            if self.late_checks <= LATE_MAX_CHECKS && p.deadline + LATE_GRACE_MS > now {
                break;
            }
            let (_, p) = self.late.pop_first().expect("just seen");
            self.late_checks -= p.give_back.len();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(key: &str, cost: u64) -> ForwardCheck {
        ForwardCheck {
            rule: "r".into(),
            key: key.into(),
            cost,
            class: None,
            dry_run: false,
            idempotency_key: None,
            refund: false,
        }
    }

    const OWNER: NodeIdx = NodeIdx(1);

    #[test]
    fn an_answer_in_time_is_accepted_and_nothing_is_kept() {
        let mut p = PendingForwards::default();
        let id = p.open(OWNER, &[check("a", 1), check("b", 2)], 0, 100);
        assert_eq!(
            p.answer(OWNER, id, [true, false].into_iter()),
            Answer::Accepted
        );
        assert!(p.expire(1_000).is_empty());
        assert_eq!(
            p.answer(OWNER, id, [true, false].into_iter()),
            Answer::Unexpected
        );
    }

    #[test]
    fn a_late_answer_gives_back_only_what_the_owner_admitted_and_only_once() {
        let mut p = PendingForwards::default();
        let mut dry = check("dry", 1);
        dry.dry_run = true;
        let mut retried = check("idem", 1);
        retried.idempotency_key = Some("k".into());
        let mut refund = check("refund", 4);
        refund.refund = true;
        let batch = [
            check("a", 3),
            check("b", 2),
            dry,
            retried,
            refund,
            check("c", 1),
        ];
        let id = p.open(OWNER, &batch, 0, 100);
        assert_eq!(p.expire(99), Vec::<ForwardId>::new());
        assert_eq!(p.expire(100), vec![id]);
        // From another node, or with the wrong count: ignored, and still kept.
        let admitted = [true, false, true, true, true, true];
        assert_eq!(
            p.answer(NodeIdx(2), id, admitted.into_iter()),
            Answer::Unexpected
        );
        assert_eq!(p.answer(OWNER, id, [true].into_iter()), Answer::Unexpected);
        let Answer::Late(back) = p.answer(OWNER, id, admitted.into_iter()) else {
            panic!("a late answer from the owner");
        };
        let back: Vec<(usize, &str, u64, bool)> = back
            .refunds
            .iter()
            .map(|(i, c)| (*i, c.key.as_str(), c.cost, c.refund))
            .collect();
        assert_eq!(back, [(0, "a", 3, true), (5, "c", 1, true)]);
        assert_eq!(
            p.answer(OWNER, id, admitted.into_iter()),
            Answer::Unexpected
        );
        assert_eq!(p.late_checks, 0);
    }

    #[test]
    fn timed_out_batches_are_forgotten_after_the_grace_or_beyond_the_cap() {
        let mut p = PendingForwards::default();
        let old = p.open(OWNER, &[check("a", 1)], 0, 100);
        p.expire(100);
        let newer = p.open(OWNER, &[check("b", 1)], 0, 200);
        p.expire(100 + LATE_GRACE_MS);
        assert_eq!(p.answer(OWNER, old, [true].into_iter()), Answer::Unexpected);
        assert!(matches!(
            p.answer(OWNER, newer, [true].into_iter()),
            Answer::Late(b) if b.refunds.len() == 1
        ));
        // Beyond the cap the oldest go first.
        let ids: Vec<ForwardId> = (0..LATE_MAX_CHECKS + 2)
            .map(|_| p.open(OWNER, &[check("x", 1)], 0, 300))
            .collect();
        p.expire(300);
        assert_eq!(p.late_checks, LATE_MAX_CHECKS);
        assert_eq!(
            p.answer(OWNER, ids[1], [true].into_iter()),
            Answer::Unexpected
        );
        assert!(matches!(
            p.answer(OWNER, ids[2], [true].into_iter()),
            Answer::Late(_)
        ));
    }

    /// A window's admission is given back only while its window surely outlasts the refund
    /// (the time since the ask, plus the margin for the refund to arrive); a bucket's always;
    /// a sliding log's, or one of an unknown rule, never.
    #[test]
    fn a_give_back_is_safe_only_while_the_admissions_window_outlasts_it() {
        use levee_core::Algorithm;
        let asked = 1_000;
        let window = Algorithm::FixedWindow {
            limit: 10,
            window_ms: 3_600_000,
        };
        // Answered at 1 600: the refund lands by 1 600 + the margin, 600 + the margin after
        // the ask; the window ended no earlier than `reset_after_ms` after the ask.
        let needed = 600 + GIVE_BACK_MARGIN_MS;
        assert!(give_back_is_safe(Some(&window), needed + 1, asked, 1_600));
        assert!(!give_back_is_safe(Some(&window), needed, asked, 1_600));
        assert!(!give_back_is_safe(Some(&window), 100, asked, 1_600));
        let sliding = Algorithm::SlidingWindow {
            limit: 10,
            window_ms: 60_000,
        };
        assert!(give_back_is_safe(
            Some(&sliding),
            60_000 + needed + 1,
            asked,
            1_600
        ));
        assert!(!give_back_is_safe(
            Some(&sliding),
            60_000 + needed,
            asked,
            1_600
        ));
        let bucket = Algorithm::TokenBucket {
            rate: 1,
            per_ms: 1_000,
            burst: 5,
            shaping: None,
        };
        assert!(give_back_is_safe(Some(&bucket), 0, asked, 1_000_000));
        let log = Algorithm::SlidingLog {
            limit: 10,
            window_ms: 3_600_000,
        };
        assert!(!give_back_is_safe(Some(&log), 3_600_000, asked, 1_600));
        assert!(!give_back_is_safe(None, u64::MAX, asked, 1_600));
    }
}
