//! A request arriving at a node: routed as a node routes it, decided there or forwarded to
//! its owner, and recorded in the ledger.

use super::*;

impl<'p> Driver<'p> {
    pub(super) fn request(&mut self, region: usize, key: u32) {
        let name = &self.plan.keys[key as usize];
        let live: Vec<usize> = self.members[region]
            .iter()
            .copied()
            .filter(|&n| {
                let node = &self.nodes[n];
                // A leaving node answers `/readyz` with 503: the load balancer skips it.
                node.up && !node.frozen && !node.cluster.lists().is_leaving(NodeIdx(n as u16))
            })
            .collect();
        if live.is_empty() {
            // Nobody to ask: the request fails.
            let window = self.plan.window_of(T0 + self.now);
            self.ledger.demand(key, window, region);
            return;
        }
        let entry = live[self.route_rng.index(live.len())];
        let t = self.clock(entry);
        self.ledger.demand(key, self.plan.window_of(t), region);
        match self.nodes[entry].cluster.route(name.as_bytes()) {
            Route::Local => self.decide(entry, region, key, false),
            Route::Alone => self.decide(entry, region, key, true),
            Route::Owner(owner) => {
                let check = ForwardCheck {
                    rule: RULE.to_owned(),
                    key: name.clone(),
                    cost: 1,
                    class: None,
                    dry_run: false,
                    idempotency_key: None,
                    refund: false,
                };
                let id = self.nodes[entry].cluster.forward(owner, vec![check], t);
                self.forwarded.insert((entry, id), (region, key));
                self.flush(entry);
                None
            }
        };
    }

    /// Decides one check of `key`, asked in `region`, at `node`; `acting_alone` when the
    /// key's owner could not decide it.
    pub(super) fn decide(
        &mut self,
        node: usize,
        region: usize,
        key: u32,
        acting_alone: bool,
    ) -> Option<Decision> {
        let name = &self.plan.keys[key as usize];
        let mut view = self.nodes[node].cluster.view();
        view.acting_alone = acting_alone;
        let t = self.clock(node);
        let window = self.plan.window_of(t);
        let Some(decision) = self.nodes[node]
            .states
            .decide(RULE, name, 1, t, view, false)
        else {
            self.errors
                .push(format!("node {node}: no decision for key {name}"));
            return None;
        };
        if !decision.allowed && !view.recovering {
            let limit = self.plan.limit;
            let book = self.ledger.book(key, window);
            if book.admitted_total() < limit {
                book.retry_with_room.0 += 1;
                book.retry_with_room.1 = book.retry_with_room.1.max(decision.retry_after_ms);
            }
        }
        if decision.allowed {
            self.ledger.admit(key, window, region, node);
        } else {
            self.wait_for_rights(node, region, key, view);
        }
        Some(decision)
    }

    /// Node `n`, as a key's owner, decides the checks a region-mate forwarded, and answers.
    pub(super) fn decide_forwarded(
        &mut self,
        n: usize,
        from: NodeIdx,
        id: ForwardId,
        checks: &[ForwardCheck],
    ) {
        let region = self.region_of[n];
        let mut decisions = Vec::with_capacity(checks.len());
        for c in checks {
            let decision = match self.key_index.get(c.key.as_str()) {
                Some(&key) => self.decide(n, region, key, false),
                None => None,
            };
            decisions.push(decision.map(|d| ForwardDecision {
                allowed: d.allowed,
                would_allow: d.would_allow,
                limit: d.limit,
                remaining: d.remaining,
                reset_after_ms: d.reset_after_ms,
                retry_after_ms: d.retry_after_ms,
                degraded: d.degraded,
            }));
        }
        let t = self.clock(n);
        self.nodes[n].cluster.answer_forward(from, id, decisions, t);
    }
}
