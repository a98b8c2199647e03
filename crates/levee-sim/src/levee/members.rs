//! Membership changes at the simulated nodes: reloads, frozen nodes, and whether every live
//! node ends on the last list, agreed, spending its full share under it.

use super::*;

/// A removed node that went on (thawed) with its old list, spending under it until it
/// hears of its removal: the rights of its old share exist beside every other node's share
/// under the list that removed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ghost {
    /// The node.
    pub node: usize,
    /// Its share of the limit when it went on.
    pub share: u64,
    /// When it went on (sim ms).
    pub thawed_at: u64,
    /// When its share fell to 0: it heard of its removal (sim ms; `None`: it never did).
    pub heard_at: Option<u64>,
}

/// How a run's node lists settled.
#[derive(Debug, Clone, Default)]
pub struct ListsFigure {
    /// From the last change on, the first time every running node of the last list ran it
    /// and saw it agreed (sim ms).
    pub agreed_at: Option<u64>,
    /// From then on, the first time every such node spent its full share under the last
    /// list (grown shares applied, no list bounding them) (sim ms).
    pub applied_at: Option<u64>,
    /// What was not so when the run ended: nodes on another list, lists not agreed, shares
    /// still bounded, a removed node that runs and still has a share.
    pub disagreements: Vec<String>,
    /// Frames dropped because the receiver's list did not hold their sender (a new node
    /// heard by a node that has not reloaded yet).
    pub unknown_sender: u64,
    /// Peers' states of a key refused because they name a node the receiver's list does not
    /// hold yet (the whole state: the receiver misses its other entries until a later one).
    pub unknown_node_states: u64,
    /// Removed nodes that went on with their old list.
    pub ghosts: Vec<Ghost>,
}

impl<'p> Driver<'p> {
    /// The operator writes list `list` into node `node`'s file and reloads it.
    pub(super) fn reload(&mut self, node: usize, list: usize) {
        let n = &mut self.nodes[node];
        if list <= n.file {
            // The file already holds this list or a later one.
            return;
        }
        n.file = n.file.max(list);
        if !n.up || n.frozen {
            // Read when it starts or goes on.
            return;
        }
        self.apply_file(node);
    }

    /// Node `node` runs the list its file holds (a reload).
    fn apply_file(&mut self, node: usize) {
        let list = self.nodes[node].file;
        let next = self.sets[list].clone();
        if self.nodes[node].cluster.lists().current().digest() == next.digest() {
            return;
        }
        let t = self.clock(node);
        if let Err(e) = self.nodes[node].cluster.change_list(next, t) {
            self.errors
                .push(format!("node {node}: reload with list {list} refused: {e}"));
        }
        self.flush(node);
    }

    /// A frozen node goes on: it reads what waited in its sockets, then any reload it was
    /// sent meanwhile.
    pub(super) fn thaw(&mut self, node: usize) {
        if !self.nodes[node].frozen {
            return;
        }
        self.nodes[node].frozen = false;
        if !self.plan.final_list().is_live(node) {
            let t = self.clock(node);
            self.lists.ghosts.push(Ghost {
                node,
                share: self.nodes[node].states.share_at(t),
                thawed_at: self.now,
                heard_at: None,
            });
        }
        let inbox = std::mem::take(&mut self.nodes[node].inbox);
        for (from, payload) in inbox {
            self.receive(node, from, &payload);
        }
        if self.plan.final_list().is_live(node) {
            self.apply_file(node);
        }
    }

    /// The running nodes that the last list holds, not removed.
    fn live_nodes(&self) -> impl Iterator<Item = usize> + '_ {
        let last = self.plan.final_list();
        (0..self.nodes.len()).filter(move |&n| self.nodes[n].up && last.is_live(n))
    }

    /// Times agreement on the last list, and its full shares, after the last change; and
    /// when each thawed removed node heard of its removal.
    pub(super) fn note_lists(&mut self) {
        for g in 0..self.lists.ghosts.len() {
            let ghost = self.lists.ghosts[g];
            let t = self.clock(ghost.node);
            if ghost.heard_at.is_none() && self.nodes[ghost.node].states.share_at(t) == 0 {
                self.lists.ghosts[g].heard_at = Some(self.now);
            }
        }
        if !self.plan.has_membership()
            || self.now < self.plan.last_change_at()
            || self.lists.applied_at.is_some()
        {
            return;
        }
        let last = self.sets.last().expect("a plan has a list");
        let agreed = self.live_nodes().all(|n| {
            let lists = self.nodes[n].cluster.lists();
            lists.current().digest() == last.digest() && lists.agreed()
        });
        if !agreed {
            return;
        }
        self.lists.agreed_at.get_or_insert(self.now);
        let split = last.split(self.plan.limit);
        let applied = self.live_nodes().all(|n| {
            let node = &self.nodes[n];
            node.states.share_at(self.clock(n)) == split[n] && !node.cluster.spending().is_bounded()
        });
        if applied {
            self.lists.applied_at = Some(self.now);
        }
    }

    /// Where every node's list stands at the end of a run with membership changes.
    pub(super) fn end_lists(&mut self) {
        if !self.plan.has_membership() {
            return;
        }
        let last_list = self.plan.final_list();
        let last = self.sets.last().expect("a plan has a list");
        let split = last.split(self.plan.limit);
        let mut found = Vec::new();
        for (n, node) in self.nodes.iter().enumerate() {
            let t = self.clock(n);
            let share = node.states.share_at(t);
            let lists = node.cluster.lists();
            let live = last_list.is_live(n);
            if !node.up {
                if live && n < self.plan.positions() && self.started(n) {
                    found.push(format!("node {n} of the last list is down at the end"));
                }
                continue;
            }
            if !live {
                if share > 0 {
                    found.push(format!(
                        "node {n} was removed but runs with a share of {share} at the end (its list has {} positions)",
                        lists.current().len()
                    ));
                }
                continue;
            }
            if lists.current().digest() != last.digest() {
                found.push(format!(
                    "node {n} runs a list of {} positions, not the last ({})",
                    lists.current().len(),
                    last.len()
                ));
            } else if !lists.agreed() {
                let waiting: Vec<String> = last
                    .nodes()
                    .filter(|&p| lists.state(p) != levee_cluster::PeerState::Active)
                    .map(|p| p.0.to_string())
                    .collect();
                found.push(format!(
                    "node {n}: the last list is not agreed (not acknowledged by nodes {})",
                    waiting.join(", ")
                ));
            } else if node.cluster.spending().is_bounded()
                || (share != split[n] && !self.growth_scheduled(n, t, split[n]))
            {
                found.push(format!(
                    "node {n}: share {share}, not its full share {} under the last list{}",
                    split[n],
                    node.states
                        .pending_growth(t)
                        .map_or(String::new(), |at| format!(
                            " (growth waits until {} ms)",
                            at as i64 - T0 as i64
                        ))
                ));
            }
        }
        self.lists.disagreements = found;
    }

    /// A window that outlasts the run (a day's quota): node `n`'s grown share `full` cannot
    /// apply before the run ends (it waits for the window after next,
    /// `levee_core::Rule::bind_no_higher`). Whether it is scheduled: the rule bound in full
    /// gives `full`, from no later than a change agreed at `t` would.
    fn growth_scheduled(&self, n: usize, t: levee_core::Millis, full: u64) -> bool {
        let states = &self.nodes[n].states;
        self.plan.long_window()
            && states.pending_growth(t).is_some_and(|at| {
                states.share_at(at) == full
                    && at <= states.rule_at(t).algorithm.shares_may_grow_at(t)
            })
    }

    /// Whether node `n` runs at some point of the plan (a node of the first list, or one
    /// that a [`FaultKind::Start`] starts).
    fn started(&self, n: usize) -> bool {
        n < self.plan.lists[0].len()
            || self
                .plan
                .faults
                .iter()
                .any(|f| matches!(f.kind, FaultKind::Start { node, .. } if node == n))
    }
}
