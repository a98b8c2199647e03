//! A request arriving at a node: routed as a node routes it, decided there or forwarded to
//! its owner, and recorded in the ledger; and the refunds of admitted requests.

use super::*;
use crate::mixed;
use levee_core::ClusterView;

/// A check as its caller asked it: where, for which key, what it costs, and whether (and
/// when) its tokens are given back.
#[derive(Debug, Clone, Copy)]
pub(super) struct Ask {
    pub(super) region: usize,
    pub(super) key: u32,
    pub(super) cost: u64,
    /// Its class (a mixed run's; 0: none).
    pub(super) class: u8,
    /// Sim ms after its admission at which the caller refunds it; 0: never.
    pub(super) refund_ms: u64,
}

/// A refund due: an admitted check's tokens given back where it was decided.
#[derive(Debug, Clone, Copy)]
pub(super) struct Refund {
    node: usize,
    incarnation: u32,
    ask: Ask,
}

impl<'p> Driver<'p> {
    pub(super) fn request(&mut self, r: &crate::plan::Request) {
        let ask = Ask {
            region: r.region as usize,
            key: r.key,
            cost: u64::from(r.cost),
            class: r.class,
            refund_ms: u64::from(r.refund_ms),
        };
        let (region, key) = (ask.region, ask.key);
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
            self.demand(ask, window);
            return;
        }
        let entry = live[self.route_rng.index(live.len())];
        let t = self.clock(entry);
        let route = self.nodes[entry].cluster.route(name.as_bytes());
        // Demand counts when and where the check is decided (`decide`), in the window its
        // admission would count in: a check forwarded to its owner is decided by the owner's
        // clock, which may be up to `max_clock_skew` off the entry's, and a moment later,
        // maybe in the next window.
        match route {
            Route::Local => self.decide(entry, ask, false),
            Route::Alone => self.decide(entry, ask, true),
            Route::Owner(_) if self.admitted_where_held(entry, ask, t) => None,
            Route::Owner(owner) => {
                let check = |rule: &str, class: Option<&str>| ForwardCheck {
                    rule: rule.to_owned(),
                    key: name.clone(),
                    cost: ask.cost,
                    class: class.map(str::to_owned),
                    dry_run: false,
                    idempotency_key: None,
                    refund: false,
                };
                // A mixed run's `all` call travels as its entries, decided together.
                let checks = if self.plan.mixed {
                    mixed::entries(ask.class)
                        .iter()
                        .map(|&(rule, class, _)| check(rule, class))
                        .collect()
                } else {
                    vec![check(RULE, None)]
                };
                let id = self.nodes[entry].cluster.forward(owner, checks, t);
                self.forwarded.insert((entry, id), ask);
                self.flush(entry);
                None
            }
        };
    }

    /// `cluster.local_first`: decides `ask` at `entry` (its clock reading `t`), which does not
    /// own the key, if the rights it holds admit it, and records the admission; `false` when
    /// it goes to the owner. A mixed run's `all` call always goes to the owner here (a node
    /// would reserve each entry where it is held: not modelled).
    fn admitted_where_held(&mut self, entry: usize, ask: Ask, t: u64) -> bool {
        if !self.plan.protocol.local_first || self.plan.mixed {
            return false;
        }
        let name = &self.plan.keys[ask.key as usize];
        let view = self.nodes[entry].cluster.view();
        let decided = self.nodes[entry]
            .states
            .decide_if_held(RULE, name, ask.cost, t, view);
        if !decided.is_some_and(|d| d.allowed) {
            return false;
        }
        self.demand(ask, self.plan.window_of(t));
        self.admitted(entry, ask, t);
        true
    }

    /// Records what `ask` asked for, in `window`: in each of its buckets for a mixed run.
    fn demand(&mut self, ask: Ask, window: u64) {
        for k in mixed::ledger_keys(self.plan, ask.key, ask.class) {
            self.ledger.demand(k, window, ask.region, ask.cost);
        }
    }

    /// Decides a mixed run's `all` call, asked as `ask`, at `node`: every decision, in the
    /// order of its entries.
    fn decide_mixed(&mut self, node: usize, ask: Ask, view: ClusterView) -> Option<Vec<Decision>> {
        let name = &self.plan.keys[ask.key as usize];
        let entries = mixed::entries(ask.class);
        let list: Vec<(&str, Option<&str>)> = entries.iter().map(|&(r, c, _)| (r, c)).collect();
        let t = self.clock(node);
        self.demand(ask, self.plan.window_of(t));
        let Some(d) = self.nodes[node]
            .states
            .decide_all(&list, name, ask.cost, t, view)
        else {
            self.errors
                .push(format!("node {node}: no decision for key {name}"));
            return None;
        };
        let window = self.plan.window_of(t);
        for (i, &(_, _, slot)) in entries.iter().enumerate() {
            if d.allowed && d.results[i].would_allow {
                let k = mixed::ledger_key(self.plan, ask.key, slot);
                self.ledger
                    .admit(k, (window, self.now), ask.region, node, ask.cost);
            }
        }
        Some(d.results)
    }

    /// Decides one check, asked as `ask`, at `node`; `acting_alone` when the key's owner
    /// could not decide it.
    pub(super) fn decide(&mut self, node: usize, ask: Ask, acting_alone: bool) -> Option<Decision> {
        let name = &self.plan.keys[ask.key as usize];
        let mut view = self.nodes[node].cluster.view();
        view.acting_alone = acting_alone;
        if self.plan.mixed {
            return self
                .decide_mixed(node, ask, view)
                .and_then(|d| d.into_iter().next());
        }
        let t = self.clock(node);
        let window = self.plan.window_of(t);
        self.demand(ask, window);
        let Some(decision) = self.nodes[node]
            .states
            .decide(RULE, name, ask.cost, t, view, false)
        else {
            self.errors
                .push(format!("node {node}: no decision for key {name}"));
            return None;
        };
        // A recovering or blind node (`ClusterView::blind_since`) answers with the time it
        // expects to have pulled its peers' state, not with rights: not what this counts.
        let pulling = view.recovering || view.blind_since.is_some();
        if !decision.allowed && !pulling && self.plan.algo.per_window() {
            let limit = self.plan.limit;
            let book = self.ledger.book(ask.key, window);
            // Refunds not yet gossiped may still count in a node's view: room is what the
            // admissions left before any refund.
            if book.admitted_total() + book.refunded() + ask.cost <= limit {
                book.retry_with_room.0 += 1;
                book.retry_with_room.1 = book.retry_with_room.1.max(decision.retry_after_ms);
            }
        }
        if decision.allowed {
            self.admitted(node, ask, t);
        } else {
            self.wait_for_rights(node, ask, view);
        }
        Some(decision)
    }

    /// Records an admission of `ask` at `node` (its clock reading `t`), and schedules its
    /// refund if the caller gives it back.
    pub(super) fn admitted(&mut self, node: usize, ask: Ask, t: u64) {
        let window = self.plan.window_of(t);
        self.ledger
            .admit(ask.key, (window, self.now), ask.region, node, ask.cost);
        if ask.refund_ms > 0 {
            self.refunds
                .entry(self.now + ask.refund_ms)
                .or_default()
                .push(Refund {
                    node,
                    incarnation: self.nodes[node].incarnation,
                    ask,
                });
        }
    }

    /// Gives back the tokens of the refunds due now, at the node that admitted them (if it
    /// still runs the same process), and records what the core really gave back. The
    /// refund reaches that node at once: a node sends it to where the check was decided
    /// (`refund: true`), which here is not delayed by the network.
    pub(super) fn serve_refunds(&mut self) {
        let Some(due) = self.refunds.remove(&self.now) else {
            return;
        };
        for r in due {
            let node = &self.nodes[r.node];
            if !node.up || node.frozen || node.incarnation != r.incarnation {
                continue;
            }
            self.give_back(r.node, r.ask);
        }
    }

    /// Gives `ask`'s tokens back at node `n` and records in the ledger what the core really
    /// gave back.
    fn give_back(&mut self, n: usize, ask: Ask) {
        let t = self.clock(n);
        let view = self.nodes[n].cluster.view();
        let name = &self.plan.keys[ask.key as usize];
        let Some(back) = self.nodes[n].states.refund(RULE, name, ask.cost, t, view) else {
            self.errors
                .push(format!("node {n}: no refund for key {name}"));
            return;
        };
        let offset = self.nodes[n].offset;
        for (epoch, tokens) in back {
            let (window, sim) = if self.plan.algo == crate::plan::Algo::SlidingLog {
                // A log gives back the admission it was: it counts at that millisecond.
                let sim = (epoch as i64 - T0 as i64 - offset).max(0) as u64;
                (self.plan.window_of(epoch), sim)
            } else {
                (epoch, self.now)
            };
            self.ledger
                .refund(ask.key, (window, sim), ask.region, n, tokens);
        }
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
        let answer = |d: Decision| ForwardDecision {
            allowed: d.allowed,
            would_allow: d.would_allow,
            limit: d.limit,
            remaining: d.remaining,
            reset_after_ms: d.reset_after_ms,
            retry_after_ms: d.retry_after_ms,
            degraded: d.degraded,
        };
        if self.plan.mixed {
            let key = checks
                .first()
                .and_then(|c| self.key_index.get(c.key.as_str()));
            let ask = self.forwarded.get(&(usize::from(from.0), id)).copied();
            if let (Some(&key), Some(ask)) = (key, ask) {
                let view = self.nodes[n].cluster.view();
                if let Some(all) = self.decide_mixed(n, Ask { key, region, ..ask }, view) {
                    decisions.extend(all.into_iter().map(|d| Some(answer(d))));
                }
            }
            decisions.resize(checks.len(), None);
            let t = self.clock(n);
            self.nodes[n].cluster.answer_forward(from, id, decisions, t);
            return;
        }
        for c in checks {
            // The caller's own ask (its region and refund), kept with the forwarder's batch.
            let ask = self
                .forwarded
                .get(&(usize::from(from.0), id))
                .copied()
                .filter(|_| checks.len() == 1);
            let Some(&key) = self.key_index.get(c.key.as_str()) else {
                decisions.push(None);
                continue;
            };
            // The check as the owner sees it, when the forwarder kept no ask of its own.
            let plain = Ask {
                region,
                key,
                cost: c.cost,
                class: 0,
                refund_ms: 0,
            };
            let decision = if c.refund {
                // Only a forwarder's late-answer give-back is forwarded as a refund here (the
                // simulator's callers refund where they were admitted); nobody waits for its
                // answer.
                self.give_back(n, plain);
                None
            } else {
                self.decide(n, ask.unwrap_or(plain), false)
            };
            decisions.push(decision.map(answer));
        }
        let t = self.clock(n);
        self.nodes[n].cluster.answer_forward(from, id, decisions, t);
    }
}
