//! Batches of checks this node forwarded to their owners and still waits for, each with the
//! time after which the driver is told to decide them alone.

use std::collections::{BTreeMap, BTreeSet};

use levee_core::{Millis, NodeIdx};

use crate::event::ForwardId;

/// A forwarded batch waiting for its answer.
#[derive(Debug, Clone, Copy)]
struct Pending {
    owner: NodeIdx,
    checks: usize,
    deadline: Millis,
}

/// Forwarded batches waiting for their answers, by id and by deadline.
#[derive(Debug, Clone, Default)]
pub(crate) struct PendingForwards {
    next_id: ForwardId,
    by_id: BTreeMap<ForwardId, Pending>,
    by_deadline: BTreeSet<(Millis, ForwardId)>,
}

/// What became of an answer to a forwarded batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Answer {
    /// From the owner, with one decision per check.
    Accepted,
    /// From the owner, but not one decision per check: decide the batch alone.
    Malformed,
    /// Not waited for (already timed out, or from another node): ignored.
    Unexpected,
}

impl PendingForwards {
    /// Records a batch of `checks` sent to `owner` now; returns its id.
    pub(crate) fn open(&mut self, owner: NodeIdx, checks: usize, deadline: Millis) -> ForwardId {
        self.next_id += 1;
        let id = self.next_id;
        self.by_id.insert(
            id,
            Pending {
                owner,
                checks,
                deadline,
            },
        );
        self.by_deadline.insert((deadline, id));
        id
    }

    /// An answer from `from` to batch `id` with `decisions` answers.
    pub(crate) fn answer(&mut self, from: NodeIdx, id: ForwardId, decisions: usize) -> Answer {
        match self.by_id.get(&id) {
            Some(p) if p.owner == from => {
                let p = *p;
                self.by_id.remove(&id);
                self.by_deadline.remove(&(p.deadline, id));
                if p.checks == decisions {
                    Answer::Accepted
                } else {
                    Answer::Malformed
                }
            }
            _ => Answer::Unexpected,
        }
    }

    /// The earliest deadline, if any batch waits.
    pub(crate) fn next_deadline(&self) -> Option<Millis> {
        self.by_deadline.first().map(|&(t, _)| t)
    }

    /// Removes and returns the batches whose deadline has passed.
    pub(crate) fn expire(&mut self, now: Millis) -> Vec<ForwardId> {
        let mut out = Vec::new();
        while let Some(&(t, id)) = self.by_deadline.first() {
            if t > now {
                break;
            }
            self.by_deadline.pop_first();
            self.by_id.remove(&id);
            out.push(id);
        }
        out
    }
}
