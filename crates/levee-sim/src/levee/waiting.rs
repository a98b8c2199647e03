//! Callers that wait for rights (`max_wait_ms`, API.md "Waiting for rights"), as
//! `levee_node::wait` serves them: a check denied while the key's global estimate has room
//! waits at the node that decided it; whenever a peer's frame reaches that node, it looks
//! again as a dry run, and is decided for real once it would be admitted, until its wait
//! ends. (A node waits at the node the caller asked and looks again at the owner; here the
//! owner keeps the waiting check, one round trip inside the region sooner.)

use super::*;
use levee_core::ClusterView;

/// A check waiting for rights.
pub(super) struct Waiter {
    node: usize,
    incarnation: u32,
    ask: super::requests::Ask,
    acting_alone: bool,
    /// Sim time at which the caller stops waiting.
    until: u64,
}

impl<'p> Driver<'p> {
    /// After a deny at `node`: the check waits if its caller can and the key's global
    /// estimate has room (a dry run at the same instant says).
    pub(super) fn wait_for_rights(
        &mut self,
        node: usize,
        ask: super::requests::Ask,
        view: ClusterView,
    ) {
        if self.plan.max_wait_ms == 0 || view.degraded() {
            // A degraded deny is answered at once, as `levee_node::wait` answers it.
            return;
        }
        let t = self.clock(node);
        let name = &self.plan.keys[ask.key as usize];
        let room = self.nodes[node]
            .states
            .decide(RULE, name, ask.cost, t, view, true)
            .is_some_and(|p| p.remaining >= ask.cost);
        if !room {
            return;
        }
        self.waiting.push(Waiter {
            node,
            incarnation: self.nodes[node].incarnation,
            ask,
            acting_alone: view.acting_alone,
            until: self.now + self.plan.max_wait_ms,
        });
    }

    /// Looks again at the checks waiting at nodes that heard a peer this millisecond, and at
    /// those whose wait ends now.
    pub(super) fn serve_waiting(&mut self) {
        if self.waiting.is_empty() {
            self.heard.iter_mut().for_each(|h| *h = false);
            return;
        }
        let waiting = std::mem::take(&mut self.waiting);
        for w in waiting {
            let node = &self.nodes[w.node];
            if !node.up || node.incarnation != w.incarnation {
                // The process that held the caller's connection ended: the check fails.
                continue;
            }
            if node.frozen || !(self.heard[w.node] || self.now >= w.until) {
                self.waiting.push(w);
                continue;
            }
            let t = self.clock(w.node);
            let mut view = node.cluster.view();
            view.acting_alone = w.acting_alone;
            let name = &self.plan.keys[w.ask.key as usize];
            let cost = w.ask.cost;
            let probe = self.nodes[w.node]
                .states
                .decide(RULE, name, cost, t, view, true);
            match probe {
                Some(p) if p.allowed => {
                    let d = self.nodes[w.node]
                        .states
                        .decide(RULE, name, cost, t, view, false);
                    if d.is_some_and(|d| d.allowed) {
                        self.admitted(w.node, w.ask, t);
                    }
                }
                Some(p) if p.remaining >= cost && !p.degraded && self.now < w.until => {
                    self.waiting.push(w)
                }
                _ => {}
            }
        }
        self.heard.iter_mut().for_each(|h| *h = false);
    }
}
